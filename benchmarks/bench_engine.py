"""The chunk engine against a bare loop with the same C kernel, on one BF16 checkpoint (issue 32's baseline).

In one interleaved run, page cache warm (every file read once first), `--repeat` rounds of:
  (cat)   `cat FILES > /dev/null`: the I/O ceiling
  (bare)  two threads that pread each shard's tensor bytes in 16 MiB pieces into preallocated buffers and count
          their BF16 codes with weightdiag's own C kernel (`hist16`, the GIL released), nothing else: what the
          machine does with that kernel when no engine, no plan, no merge and no fit stand around it
  (api)   `fit_path` through the Python API, in a warm process (no start-up)
  (cmd)   `weightdiag fit DIR --device cpu --no-save -q` in a fresh process
and prints each one's GB/s (tensor bytes over the median time) and its ratio to the bare loop and to `cat`.
The bare loop is the ceiling the engine is measured against: the engine does more (every tensor's plan, the
largest |w| and its position, the per-matrix fits and the row), so 100% is out of reach by design.

    python benchmarks/bench_engine.py                 # 4 GB BF16 (issue 32's size), 5 rounds
    python benchmarks/bench_engine.py --size-gb 1 --repeat 3
    python benchmarks/bench_engine.py --dtype F32      # 4 GB of F32: cat, API and command (the bare loop is
                                                       # BF16's: it counts 16-bit codes)
    python benchmarks/bench_engine.py --before /tmp/old  # also the API and command of another checkout, in the
                                                       # same interleaved rounds
    python benchmarks/bench_engine.py --fingerprint     # also API fits with and without the lineage fingerprint
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_fit import CHILD_ENV, layers_for, make_checkpoint, shard_files  # noqa: E402

PIECE = 16 << 20


def tensor_regions(path: Path) -> tuple[int, int]:
    """(start, end) of a safetensors file's tensor bytes: after its 8-byte length and JSON header."""
    with open(path, "rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return 8 + header, path.stat().st_size


def bare_loop(files: list[Path]) -> float:
    """Seconds for two threads to read and count every tensor byte (BF16 codes), pieces handed out in order."""
    from weightdiag.kernels import _kernels

    jobs = [
        (f, lo, min(lo + PIECE, hi)) for f in files for lo, hi in [tensor_regions(f)] for lo in range(lo, hi, PIECE)
    ]
    lock = threading.Lock()
    next_job = iter(jobs)
    failures: list[BaseException] = []

    def worker() -> None:
        buf = np.empty(PIECE // 2, dtype=np.uint16)
        counts = np.zeros(1 << 16, dtype=np.int64)
        fds: dict[Path, int] = {}
        try:
            while True:
                with lock:
                    job = next(next_job, None)
                if job is None:
                    return
                path, lo, hi = job
                fd = fds.get(path) or fds.setdefault(path, os.open(path, os.O_RDONLY))
                n = (hi - lo) // 2 * 2
                view = memoryview(buf)[: n // 2].cast("B")
                got = os.preadv(fd, [view], lo)
                assert got == n
                _kernels.hist16(buf[: n // 2].reshape(1, -1), counts)
        except BaseException as exc:  # a thread's error would vanish with it: the timing would be a lie
            failures.append(exc)
        finally:
            for fd in fds.values():
                os.close(fd)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if failures:
        raise failures[0]
    return elapsed


API_CODE = """
import contextlib, sys, time
from weightdiag import tuning
from weightdiag.run.fitting import fit_path
from weightdiag.run.measure import FitOptions
off = sys.argv[3:] == ["no-fingerprint"]
with tuning.override(lineage_fingerprint=False) if off else contextlib.nullcontext():
    fit_path(sys.argv[1], FitOptions(device="cpu"))
    for _ in range(int(sys.argv[2])):
        t, c = time.perf_counter(), time.process_time()
        fit_path(sys.argv[1], FitOptions(device="cpu"))
        print(time.perf_counter() - t, time.process_time() - c)  # wall, and CPU time of all the fit's threads
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--dtype", choices=("BF16", "F32"), default="BF16")
    parser.add_argument("--before", type=Path, help="a checkout of the code before (C kernels built): measured too")
    parser.add_argument(
        "--fingerprint",
        action="store_true",
        help="also the API fit without the lineage fingerprint (issue 39), interleaved, the order alternating",
    )
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    itemsize = 2 if args.dtype == "BF16" else 4
    folder = make_checkpoint(args.data, layers_for(args.size_gb * 1e9, itemsize), args.dtype)
    files = shard_files(folder)
    tensor_bytes = sum(hi - lo for lo, hi in map(tensor_regions, files))
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    checkouts = {"": REPO} | ({" before": args.before.resolve()} if args.before else {})
    times: dict[str, list[float]] = {"cat": [], "bare": []}
    for round_ in range(args.repeat):
        t = time.perf_counter()
        subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
        times["cat"].append(time.perf_counter() - t)
        if args.dtype == "BF16":
            times["bare"].append(bare_loop(files))
        for tag, checkout in checkouts.items():  # `python -c`/`-m` put the cwd first on the path: that checkout
            env = CHILD_ENV | {"PYTHONPATH": str(checkout)}
            api = [sys.executable, "-c", API_CODE, str(folder), "1"]
            out = subprocess.run(api, capture_output=True, text=True, env=env, cwd=checkout)
            if out.returncode:
                raise SystemExit(out.stderr[-2000:])
            times.setdefault("api" + tag, []).append(float(out.stdout.split()[-2]))
            if args.fingerprint and not tag:  # with and without it, in alternating order
                for off in ("no-fingerprint", "") if round_ % 2 else ("", "no-fingerprint"):
                    out = subprocess.run([*api, off], capture_output=True, text=True, env=env, cwd=checkout)
                    if out.returncode:
                        raise SystemExit(out.stderr[-2000:])
                    name = "api without fingerprint" if off else "api with fingerprint"
                    wall, cpu = map(float, out.stdout.split()[-2:])
                    times.setdefault(name, []).append(wall)
                    times.setdefault(name + " cpu", []).append(cpu)
            t = time.perf_counter()
            cmd = [sys.executable, "-m", "weightdiag", "fit", str(folder), "--device", "cpu", "--no-save", "-q"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=checkout)
            times.setdefault("cmd" + tag, []).append(time.perf_counter() - t)
    medians = {k: statistics.median(v) for k, v in times.items() if v}
    print(
        f"{folder.name}: {tensor_bytes / 1e9:.2f} GB of tensors in {len(files)} shards; {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| what | median s | GB/s | vs bare loop | vs cat |")
    print("|---|---|---|---|---|")
    for name, label in [
        ("cat", "`cat`"),
        ("bare", "bare loop: 2 threads pread + hist16"),
        ("api", "API fit"),
        ("api with fingerprint", "API fit (fingerprint on: the default)"),
        ("api without fingerprint", "API fit, lineage fingerprint off"),
        ("cmd", "command"),
        ("api before", "API fit, --before checkout"),
        ("cmd before", "command, --before checkout"),
    ]:
        if name not in medians:
            continue
        m = medians[name]
        rate, cat = tensor_bytes / m / 1e9, medians["cat"] / m
        bare = f"{medians['bare'] / m:.0%}" if "bare" in medians else "-"
        print(f"| {label} | {m:.3f} | {rate:.2f} | {bare} | {cat:.0%} |")
    if "api with fingerprint" in medians:  # on a loaded machine the CPU seconds are steadier than the wall's
        on, off = medians["api with fingerprint"], medians["api without fingerprint"]
        on_cpu, off_cpu = medians["api with fingerprint cpu"], medians["api without fingerprint cpu"]
        print(f"the fingerprint's cost: wall {on / off:.3f}x ({on:.3f} / {off:.3f} s), CPU time of the fit")
        print(f"{on_cpu / off_cpu:.3f}x ({on_cpu:.3f} / {off_cpu:.3f} s), ratios of the medians of interleaved rounds")
    if args.json:
        args.json.write_text(json.dumps({"machine": platform.platform(), "bytes": tensor_bytes, "times": times}))


if __name__ == "__main__":
    main()

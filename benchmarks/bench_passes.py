"""The fit, spectrum and diff passes of this checkout against another checkout's, in one interleaved run.

For each case, `--repeat` rounds; in each round both checkouts, the first one alternating (each in a fresh
process, PYTHONPATH set to the checkout; page cache warm):
  (api)       the API fit of `--fit-dir` (default: bench_engine.py's 4 GB BF16 checkpoint, made if missing): one
              untimed fit, then three timed ones in the same process (bench_engine.py's API case), every fit a
              sample
  (spectrum)  `fit DIR --spectrum --device cpu --no-save -q` of one 4096 x 14336 BF16 matrix (117 MB: its Gram,
              about 0.96 TFLOP, and one 4096 x 4096 eigensolve)
  (diff)      `diff BASE TUNED --device cpu --no-save --json -q` of two ~1 GB BF16 checkpoints
              (benchmarks/bench_diff.py's pair)
and prints each one's median (and minimum) seconds and the ratio this/other (below 1: this checkout is faster).

    python benchmarks/bench_passes.py --before /tmp/before --repeat 8 --only api
    python benchmarks/bench_passes.py --before /tmp/before --repeat 3 --only spectrum
    python benchmarks/bench_passes.py --before /tmp/before --repeat 10 --only diff
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_matrix(folder: Path) -> Path:
    """A checkpoint of one 4096 x 14336 BF16 matrix (an FFN's down projection of Llama-3-8B's shape)."""
    from weightdiag.testing import synthetic

    if not (folder / "model.safetensors").exists():
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        w = (rng.standard_normal((4096, 14336), dtype=np.float32) * 0.02).astype(np.float32)
        entries = [("model.layers.0.mlp.down_proj.weight", "BF16", w.shape)]
        (folder / "model.safetensors").write_bytes(synthetic.header_bytes(entries) + synthetic.encode(w, "BF16"))
    return folder


def diff_pair(root: Path, size_gb: float) -> tuple[Path, Path]:
    """benchmarks/bench_diff.py's two checkpoints of `size_gb` each (other seeds: every tensor differs)."""
    from benchmarks.bench_diff import make
    from benchmarks.bench_fit import layers_for

    n_layers = layers_for(size_gb * 1e9)
    return make(root, n_layers, 1), make(root, n_layers, 2)


API_CODE = """
import sys, time
from weightdiag.run.fitting import fit_path
from weightdiag.run.measure import FitOptions
fit_path(sys.argv[1], FitOptions(device="cpu"))
for _ in range(3):
    t = time.perf_counter(); fit_path(sys.argv[1], FitOptions(device="cpu")); print(time.perf_counter() - t)
"""


def timed(checkout: Path, args: list[str]) -> list[float]:
    """Seconds of the samples one process gives: the API case prints its fits' times, a command is one."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    command = (
        [sys.executable, "-c", API_CODE, args[1]] if args[0] == "api" else [sys.executable, "-m", "weightdiag", *args]
    )
    started = time.perf_counter()
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=checkout)
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(args)}: exit {out.returncode}: {out.stderr[-1500:]}")
    return [float(x) for x in out.stdout.split()] if args[0] == "api" else [seconds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its C kernels built)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size-gb", type=float, default=1.0, help="each side of the diff (default 1)")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "weightdiag-bench-passes")
    parser.add_argument("--only", choices=("api", "spectrum", "diff"), action="append")
    parser.add_argument("--fit-dir", type=Path, help="the checkpoint of the API case (default: bench_engine's)")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    cases: dict[str, list[str]] = {}
    if not args.only or "api" in args.only:
        folder = args.fit_dir
        if folder is None:
            from benchmarks.bench_fit import layers_for, make_checkpoint

            folder = make_checkpoint(REPO / "benchmarks" / "data", layers_for(4e9), "BF16")
        cases["API fit"] = ["api", str(folder)]
    if not args.only or "spectrum" in args.only:
        matrix = one_matrix(args.root / "matrix")
        cases["spectrum 4096 x 14336"] = ["fit", str(matrix), "--spectrum", "--device", "cpu", "--no-save", "-q"]
    if not args.only or "diff" in args.only:
        base, tuned = diff_pair(args.root / "diff", args.size_gb)
        name = f"diff 2 x {args.size_gb:g} GB"
        cases[name] = ["diff", str(base), str(tuned), "--device", "cpu", "--no-save", "--json", "-q"]
    for command in cases.values():  # the page cache warm, the imports compiled
        timed(REPO, command)
    times: dict[str, dict[str, list[float]]] = {name: {"before": [], "this": []} for name in cases}
    for round_ in range(args.repeat):
        for name, command in cases.items():
            order = [("before", args.before), ("this", REPO)]
            for label, checkout in order if round_ % 2 == 0 else order[::-1]:
                times[name][label] += timed(checkout, command)
    results = {}
    for name, runs in times.items():
        before, this = statistics.median(runs["before"]), statistics.median(runs["this"])
        low = min(runs["this"]) / min(runs["before"])
        results[name] = {
            "before_s": before,
            "this_s": this,
            "ratio": this / before,
            "ratio_of_minima": low,
            "runs": runs,
        }
        print(
            f"{name:22s} before {before:7.3f} s   this {this:7.3f} s   this/before {this / before:.3f}"
            f"   (minima {low:.3f}, {len(runs['this'])} samples each)"
        )
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"results": results, **meta}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark `weightdiag fit` against raw reading and against the paper's reference pipeline.

Writes a synthetic Llama-shaped, sharded BF16 checkpoint (Gaussian init, per-kind sigma), then
measures in one run, from the page cache (every file is read once first):
  (a) `cat FILES > /dev/null`                                   (the I/O ceiling)
  (w) `weightdiag fit DIR --device cpu --no-save -q`            (end to end, in a subprocess)
  (p) the same fit through the Python API, timed inside the process (no start-up costs)
  (b) the reference pipeline: safetensors reads each tensor, then npm-weibull-py 0.4.0
      extract_to_histogram + weibull_fit on it (in a subprocess)
and reports ratios, throughput and peak RSS (VmHWM of each subprocess). With --scale N it also
runs (a) and (w) on an N-times larger checkpoint with the same largest tensor, to show that
peak memory does not grow with model size.

    python benchmarks/bench_fit.py                     # 1 GB, plus a 4x larger one
    python benchmarks/bench_fit.py --size-gb 0.3 --scale 1 --repeat 1   # quick look
    python benchmarks/bench_fit.py --dtype F32 --scale 1                # the F32 path
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from weightdiag.testing import synthetic  # noqa: E402
from weightdiag.vocabulary import COHORT_TRIM  # noqa: E402

D_MODEL, N_HEADS, N_KV, FFN, VOCAB = 2048, 16, 4, 5632, 32000

# Child processes print their own peak resident memory (VmHWM is per process, unlike ru_maxrss
# which a child inherits from its parent across fork + exec).
_VMHWM = (
    "print('VmHWM', next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')), file=sys.stderr)"
)

WEIGHTDIAG_CHILD = f"""
import sys
from weightdiag.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    {_VMHWM}
    raise
"""

# The same fit through the Python API, timing only the fit (no interpreter start-up, no CLI).
API_CHILD = f"""
import sys, time
from weightdiag.api import fit_path
from weightdiag.run.measure import FitOptions
fit_path(sys.argv[1], FitOptions(device="cpu", include=["*.layers.0.*"]))  # warm imports and tables
t = time.perf_counter()
fit_path(sys.argv[1], FitOptions(device="cpu"))
print(time.perf_counter() - t)
{_VMHWM}
"""

REFERENCE_CHILD = f"""
import json, sys
from safetensors import safe_open
import npm_weibull
folder = sys.argv[1]
fits = {{}}
for name in sorted(f for f in __import__('os').listdir(folder) if f.endswith('.safetensors')):
    with safe_open(folder + '/' + name, 'pt') as f:
        for key in f.keys():
            w = f.get_tensor(key)
            if w.ndim != 2:
                continue
            r = npm_weibull.weibull_fit(npm_weibull.extract_to_histogram(w))
            fits[key] = [r['k'], r['lambda']]
json.dump(fits, open(sys.argv[2], 'w'))
{_VMHWM}
"""


def layers_for(size_bytes: float, itemsize: int = 2) -> int:
    per_layer = itemsize * (2 * D_MODEL * D_MODEL + 2 * D_MODEL * (D_MODEL // N_HEADS * N_KV) + 3 * D_MODEL * FFN)
    embeddings = itemsize * 2 * VOCAB * D_MODEL
    return max(1, math.ceil((size_bytes - embeddings) / per_layer))


def make_checkpoint(root: Path, n_layers: int, dtype: str = "BF16") -> Path:
    folder = root / f"llama-d{D_MODEL}-L{n_layers}-{dtype.lower()}"
    if (folder / "config.json").exists():
        return folder
    spec = synthetic.ModelSpec(
        family="llama",
        n_layers=n_layers,
        d_model=D_MODEL,
        n_heads=N_HEADS,
        n_kv_heads=N_KV,
        ffn_size=FFN,
        vocab=VOCAB,
        dtype=dtype,
        shard_bytes=512 << 20,
        seed=1,
        # per-kind init sigma: small_init-like input side, wang_init-like output side
        sigma={
            "q": 0.0099,
            "k": 0.0099,
            "v": 0.0099,
            "gate": 0.0099,
            "up": 0.0099,
            "o": 2 / (n_layers * math.sqrt(D_MODEL)),
            "down": 2 / (n_layers * math.sqrt(D_MODEL)),
            "embed": 0.02,
            "unembed": 0.02,
        },
    )
    t = time.perf_counter()
    synthetic.write_model(folder, spec)
    print(f"  wrote {folder.name} in {time.perf_counter() - t:.1f}s", flush=True)
    return folder


def shard_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


# Children run as on a user's machine, with bytecode caches: a shell that sets PYTHONDONTWRITEBYTECODE
# (this project's VM does) would make every run compile weightdiag's modules anew (~50 ms).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_timed(cmd: list[str]) -> tuple[float, int | None, str]:
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=CHILD_ENV)
    elapsed = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {out.stderr[-2000:]}")
    peak = None
    for line in out.stderr.splitlines():
        if line.startswith("VmHWM"):
            peak = int(line.split()[1]) * 1024
    return elapsed, peak, out.stdout


def measure(folder: Path, repeat: int, reference: bool) -> dict[str, object]:
    files = [str(f) for f in shard_files(folder)]
    total = sum(os.path.getsize(f) for f in files)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    cat_times = [run_timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0] for _ in range(repeat)]
    fit_command = [sys.executable, "-c", WEIGHTDIAG_CHILD, "fit", str(folder), "--device", "cpu", "--no-save", "-q"]
    run_timed([*fit_command, "--include", "*.layers.0.*"])  # untimed: writes the bytecode caches
    fit_runs = [
        run_timed(
            [
                sys.executable,
                "-c",
                WEIGHTDIAG_CHILD,
                "fit",
                str(folder),
                "--device",
                "cpu",
                "--no-save",
                "-q",
                "--json",
            ]
        )
        for _ in range(repeat)
    ]
    fit_times = [r[0] for r in fit_runs]
    api_runs = [run_timed([sys.executable, "-c", API_CHILD, str(folder)]) for _ in range(repeat)]
    api_times = [float(r[2].split()[-1]) for r in api_runs]
    row = json.loads(fit_runs[-1][2])
    largest = max(m["numel"] for m in row["matrices"]) * 2
    result: dict[str, object] = {
        "checkpoint": folder.name,
        "bytes": total,
        "shards": len(files),
        "largest_tensor_bytes": largest,
        "cat_s": statistics.median(cat_times),
        "weightdiag_s": statistics.median(fit_times),
        "weightdiag_peak_rss": fit_runs[-1][1],
        "api_fit_s": statistics.median(api_times),
        "api_peak_rss": api_runs[-1][1],
    }
    result["api_throughput_vs_cat"] = result["cat_s"] / result["api_fit_s"]
    result["throughput_vs_cat"] = result["cat_s"] / result["weightdiag_s"]
    result["weightdiag_GBps"] = total / result["weightdiag_s"] / 1e9
    result["cat_GBps"] = total / result["cat_s"] / 1e9
    result["rss_bound"] = 3 * largest + 500 * 2**20
    if reference:
        fits_path = folder / "reference_fits.json"
        ref_time, ref_peak, _ = run_timed([sys.executable, "-c", REFERENCE_CHILD, str(folder), str(fits_path)])
        result["reference_s"] = ref_time
        result["reference_peak_rss"] = ref_peak
        result["speedup_vs_reference"] = ref_time / result["weightdiag_s"]
        result["api_speedup_vs_reference"] = ref_time / result["api_fit_s"]
        ref_fits = json.loads(fits_path.read_text())
        worst = 0.0
        for m in row["matrices"]:
            k, lam = ref_fits[m["name"]]
            ours = m["fits"][COHORT_TRIM]
            worst = max(worst, abs(ours["k"] / k - 1), abs(ours["lambda"] / lam - 1))
        result["max_rel_diff_vs_reference"] = worst
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--scale", type=int, default=4, help="also run an N-times larger checkpoint (1: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--dtype", choices=["BF16", "F32"], default="BF16", help="the checkpoint's dtype")
    args = parser.parse_args()
    itemsize = 4 if args.dtype == "F32" else 2

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"python {platform.python_version()}",
        flush=True,
    )
    base_layers = layers_for(args.size_gb * 1e9, itemsize)
    results = [measure(make_checkpoint(args.data, base_layers, args.dtype), args.repeat, reference=True)]
    if args.scale > 1:
        big_layers = layers_for(args.scale * results[0]["bytes"], itemsize)
        results.append(measure(make_checkpoint(args.data, big_layers, args.dtype), args.repeat, reference=False))
    for r in results:
        print(json.dumps(r, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""Benchmark `weightdiag diff BASE TUNED` on two ~1 GB BF16 checkpoints from the page cache, against `cat` of both.

Writes two synthetic Llama-shaped BF16 checkpoints of the same shapes (seeds 1 and 2: every element differs,
so no shortcut applies), reads both once to warm the page cache, then times
  (a) `cat BASE/* TUNED/* > /dev/null`                                (the I/O ceiling)
  (d) `weightdiag diff BASE TUNED --device cpu --no-save --json -q`  (end to end, in a subprocess)
  (n) the same with --no-spectrum (the exact figures only)
  (s) the same with --sketch 32
and prints throughput (both checkpoints' bytes / seconds), the ratio to cat, and the peak RSS (VmHWM) of each;
then the spectrum's seconds ((d) less (n)) against the machine's float32 GEMM rate (numpy's BLAS on the sketch's
shapes, measured here): its flops from the matrices' shapes and methods, the rate it reached, and the seconds
it would take at the GEMM rate.

    python benchmarks/bench_diff.py                       # 2 x 1 GB
    python benchmarks/bench_diff.py --size-gb 0.2 --repeat 1   # quick look
    python benchmarks/bench_diff.py --before /work/main --rounds 6 --no-spectrum   # this checkout against another

With --before CHECKOUT, only (n) (or (d) without --no-spectrum) is run: this checkout and CHECKOUT (another
worktree, its C kernels built) alternately, `--rounds` times each, the order alternating every round (a loaded
machine's drift falls on both); prints each run's seconds and peak RSS, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from benchmarks.bench_fit import D_MODEL, FFN, N_HEADS, N_KV, VOCAB, layers_for  # noqa: E402
from weightdiag.testing import synthetic  # noqa: E402

CHILD = """
import sys
from weightdiag.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print('VmHWM', next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')), file=sys.stderr)
    raise
"""
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def make(root: Path, n_layers: int, seed: int) -> Path:
    folder = root / f"llama-d{D_MODEL}-L{n_layers}-bf16-seed{seed}"
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
        dtype="BF16",
        shard_bytes=512 << 20,
        seed=seed,
    )
    synthetic.write_model(folder, spec)
    return folder


def timed(cmd: list[str]) -> tuple[float, int | None, str]:
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=CHILD_ENV)
    elapsed = time.perf_counter() - t
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{cmd[:4]} failed: {out.stderr[-2000:]}")
    peak = next((int(line.split()[1]) * 1024 for line in out.stderr.splitlines() if line.startswith("VmHWM")), None)
    return elapsed, peak, out.stdout


def spectrum_flops(doc: dict) -> float:
    """Floating-point operations of the diff's spectrum pass, from its matrices' shapes and methods: the sketch
    multiplies each element of ΔW by Ω (k columns) and by [Ψ; Θ] (l + s rows), 2(k + l + s) flops
    (weightdiag.delta.spectrum.Sketch); the exact path forms ΔWᵀΔW, 2n flops an element (float64)."""
    from weightdiag import tuning
    from weightdiag.delta.spectrum import ERROR_ROWS

    gram_cols = tuning.current().gram_cols
    total = 0.0
    for matrix in doc["matrices"]:
        spectrum, shape = matrix.get("spectrum"), matrix["shape"]
        if not spectrum or len(shape) < 2:
            continue
        m, n = math.prod(shape[:-1]), shape[-1]
        if spectrum["method"] == "sketch":
            k = spectrum["sketch_size"]
            total += 2.0 * m * n * (k + max(k, min(2 * k + 1, m)) + ERROR_ROWS)
        else:  # the Gram (n <= gram_cols), else one block's SVD (counted as a Gram of the smaller side)
            total += 2.0 * m * n * (n if n <= gram_cols else min(m, n))
    return total


def gemm_rate(seconds: float = 2.0) -> float:
    """float32 GEMM flops per second of this machine's numpy (OpenBLAS, all cores), on the sketch's shape: a
    block of 4096 rows of a 2048-wide ΔW times Ω (2048 x 128) and [Ψ; Θ] (273 x 4096) times the block."""
    rng = np.random.default_rng(0)
    block = rng.standard_normal((4096, 2048), dtype=np.float32)
    omega = rng.standard_normal((2048, 128), dtype=np.float32)
    test = rng.standard_normal((273, 4096), dtype=np.float32)
    _ = block @ omega, test @ block  # warm the BLAS threads
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _ = block @ omega, test @ block
        done += 1
    return done * 2.0 * block.size * (128 + 273) / (time.perf_counter() - start)


def interleaved(base: Path, tuned: Path, before: Path, rounds: int, extra: list[str]) -> dict:
    """The same diff from this checkout and from `before`, alternately (see the module docstring)."""
    runs: dict[str, list[tuple[float, int | None]]] = {"after": [], "before": []}
    checkouts = {"after": REPO, "before": before.resolve()}
    for r in range(rounds):
        for label in ("after", "before") if r % 2 == 0 else ("before", "after"):
            env = {**CHILD_ENV, "PYTHONPATH": str(checkouts[label])}
            cmd = [sys.executable, "-c", CHILD, "diff", str(base), str(tuned), "--device", "cpu", "--no-save"]
            t = time.perf_counter()
            # run from the checkout itself: `python -c` puts the working directory first on sys.path, ahead of
            # PYTHONPATH (from REPO, `before` imported this checkout's weightdiag)
            out = subprocess.run(
                [*cmd, "--json", "-q", *extra], capture_output=True, text=True, cwd=checkouts[label], env=env
            )
            seconds = time.perf_counter() - t
            if out.returncode not in (0, 1):
                raise RuntimeError(f"{label} failed: {out.stderr[-2000:]}")
            peak = next((int(x.split()[1]) * 1024 for x in out.stderr.splitlines() if x.startswith("VmHWM")), None)
            runs[label].append((seconds, peak))
            print(f"round {r} {label}: {seconds:.2f} s, peak {peak and round(peak / 1e6)} MB", file=sys.stderr)
    med = {label: float(np.median([s for s, _ in v])) for label, v in runs.items()}
    return {
        "flags": extra,
        "rounds": rounds,
        "seconds": {label: [round(s, 2) for s, _ in v] for label, v in runs.items()},
        "peak_rss_MB": {label: max((p or 0) // 10**6 for _, p in v) for label, v in runs.items()},
        "median_s": {label: round(v, 2) for label, v in med.items()},
        "ratio_after_before": round(med["after"] / med["before"], 3),
        "load": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of each checkpoint (default 1)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "weightdiag-bench-diff")
    parser.add_argument("--before", type=Path, help="another checkout to run interleaved with this one")
    parser.add_argument("--rounds", type=int, default=6, help="with --before: runs of each")
    parser.add_argument("--no-spectrum", action="store_true", help="with --before: time diff --no-spectrum")
    args = parser.parse_args()
    n_layers = layers_for(args.size_gb * 1e9)
    base, tuned = make(args.root, n_layers, 1), make(args.root, n_layers, 2)
    files = [str(f) for folder in (base, tuned) for f in sorted(folder.glob("*.safetensors"))]
    total = sum(os.path.getsize(f) for f in files)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    if args.before is not None:
        extra = ["--no-spectrum"] if args.no_spectrum else []
        report = interleaved(base, tuned, args.before, args.rounds, extra)
        report |= {"bytes": total, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        print(json.dumps(report, indent=1))
        return
    cat = min(timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0] for _ in range(args.repeat))
    runs = {
        "diff": [],
        "diff --no-spectrum": ["--no-spectrum"],
        "diff --sketch 32": ["--sketch", "32"],
    }
    results = {"cat": {"seconds": cat, "GB/s": total / cat / 1e9}}
    for label, extra in runs.items():
        cmd = [sys.executable, "-c", CHILD, "diff", str(base), str(tuned), "--device", "cpu", "--no-save", "--json"]
        best = None
        for _ in range(args.repeat):
            seconds, peak, out = timed([*cmd, *extra, "-q"])
            if best is None or seconds < best[0]:
                best = (seconds, peak, out)
        seconds, peak, out = best
        doc = json.loads(out)
        if label == "diff":
            full_doc = doc
        results[label] = {
            "seconds": round(seconds, 2),
            "GB/s": round(total / seconds / 1e9, 3),
            "of_cat": round(cat / seconds, 3),
            "peak_rss_MB": round(peak / 1e6) if peak else None,
            "matrices": len(doc["matrices"]),
        }
    flops = spectrum_flops(full_doc)
    rate = gemm_rate()
    spectrum_s = results["diff"]["seconds"] - results["diff --no-spectrum"]["seconds"]
    results["spectrum"] = {
        "seconds": round(spectrum_s, 2),  # the full diff less the exact figures' run
        "gflop": round(flops / 1e9, 1),
        "gflops_achieved": round(flops / spectrum_s / 1e9, 1) if spectrum_s > 0 else None,
        "sgemm_gflops": round(rate / 1e9, 1),
        "seconds_at_sgemm_rate": round(flops / rate, 2),
    }
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "bytes": total,
                "layers": n_layers,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

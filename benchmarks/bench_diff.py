"""Benchmark `weightdiag diff BASE TUNED` on two ~1 GB BF16 checkpoints from the page cache, against `cat` of both.

Writes two synthetic Llama-shaped BF16 checkpoints of the same shapes (seeds 1 and 2: every element differs,
so no shortcut applies), reads both once to warm the page cache, then times
  (a) `cat BASE/* TUNED/* > /dev/null`                                (the I/O ceiling)
  (d) `weightdiag diff BASE TUNED --device cpu --no-save --json -q`  (end to end, in a subprocess)
  (n) the same with --no-spectrum (the exact figures only)
  (s) the same with --sketch 32
and prints throughput (both checkpoints' bytes / seconds), the ratio to cat, and the peak RSS (VmHWM) of each.

    python benchmarks/bench_diff.py                       # 2 x 1 GB
    python benchmarks/bench_diff.py --size-gb 0.2 --repeat 1   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of each checkpoint (default 1)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "weightdiag-bench-diff")
    args = parser.parse_args()
    n_layers = layers_for(args.size_gb * 1e9)
    base, tuned = make(args.root, n_layers, 1), make(args.root, n_layers, 2)
    files = [str(f) for folder in (base, tuned) for f in sorted(folder.glob("*.safetensors"))]
    total = sum(os.path.getsize(f) for f in files)
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
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
        results[label] = {
            "seconds": round(seconds, 2),
            "GB/s": round(total / seconds / 1e9, 3),
            "of_cat": round(cat / seconds, 3),
            "peak_rss_MB": round(peak / 1e6) if peak else None,
            "matrices": len(doc["matrices"]),
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

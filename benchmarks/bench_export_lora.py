"""Peak memory and time of `weightdiag diff BASE TUNED --export-lora OUT` on two ~1 GB BF16 checkpoints.

BASE: bench_diff.py's synthetic Llama-shaped BF16 checkpoint (seed 1); TUNED: BASE plus a planted rank-8 ΔW
(B A, Gaussian factors, 1% of each matrix's norm) on every attention and MLP matrix, rounded to BF16 (so ΔW is
the LoRA plus BF16 rounding: not exactly low-rank, and the default falls back to the energy rule). Runs the
command in a child process and reads its peak RSS (VmHWM), for the default, `--rank 8` and `--energy 0.9`.

    python benchmarks/bench_export_lora.py [--size-gb 1] [--default-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.bench_diff import CHILD, CHILD_ENV, make  # noqa: E402
from benchmarks.bench_fit import layers_for  # noqa: E402

RANK = 8


def planted(base: Path, root: Path) -> Path:
    """TUNED: BASE's shards with a rank-8 ΔW added to every attention and MLP matrix (BF16)."""
    from safetensors.torch import load_file, save_file

    folder = root / f"{base.name}-lora{RANK}"
    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    for shard in sorted(base.iterdir()):
        if shard.suffix != ".safetensors":
            shutil.copy(shard, folder / shard.name)
            continue
        tensors = load_file(str(shard))
        for name, w in tensors.items():
            if w.ndim == 2 and ("self_attn" in name or "mlp" in name):
                b = torch.randn(w.shape[0], RANK, generator=g)
                a = torch.randn(RANK, w.shape[1], generator=g)
                delta = b @ a
                delta *= 0.01 * w.float().norm() / delta.norm()
                tensors[name] = (w.float() + delta).bfloat16()
        save_file(tensors, str(folder / shard.name), metadata={"format": "pt"})
    return folder


def run(base: Path, tuned: Path, extra: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="lora-")) / "adapter"
    cmd = [sys.executable, "-c", CHILD, "diff", str(base), str(tuned), "--export-lora", str(out), *extra]
    started = time.perf_counter()
    done = subprocess.run([*cmd, "--no-save", "--json", "-q"], capture_output=True, text=True, cwd=REPO, env=CHILD_ENV)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr[-2000:])
    peak = next(int(x.split()[1]) * 1024 for x in done.stderr.splitlines() if x.startswith("VmHWM"))
    report = json.loads(done.stdout)["export_lora"]
    shutil.rmtree(out.parent, ignore_errors=True)
    ranks = [m["rank"] for m in report["modules"]]
    return {
        "flags": extra,
        "seconds": round(seconds, 1),
        "peak_rss_MB": round(peak / 1e6),
        "modules": len(ranks),
        "ranks": [min(ranks), max(ranks)],
        "exact": sum(m["exact"] for m in report["modules"]),
        "max_relative_error": report["max_relative_error"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--default-only", action="store_true", help="only the default (no --rank, no --energy)")
    parser.add_argument("--root", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "weightdiag-bench-diff")
    args = parser.parse_args()
    base = make(args.root, layers_for(args.size_gb * 1e9), 1)
    tuned = planted(base, args.root)
    size = sum(f.stat().st_size for folder in (base, tuned) for f in folder.glob("*.safetensors"))
    runs = [[]] if args.default_only else [[], ["--rank", str(RANK)], ["--energy", "0.9"]]
    results = [run(base, tuned, extra) for extra in runs]
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "bytes": size,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "load": os.getloadavg(),
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""Time and peak memory of `weightdiag fit` on PyTorch `.bin` checkpoints, against the same tensors as safetensors
(issue 42, item 6: the acceptance is the .bin within 2x of safetensors, and the zip bomb refused under 300 MB).

Cases (each made once under --dir, BF16 unless said):
- `bomb`: a 2.1 MB zip .bin whose data.pkl (one 8x8 tensor's pickle) is followed by 2 GiB of deflated zeros:
  torch inflates a record whole, into a buffer of the size the zip declares. Expected: exit 2, one line;
- `transposed`: one 8192 x 8192 F32 weight (256 MB) saved transposed (stride (1, 8192)) in the .bin, and
  row-major in the safetensors twin;
- `many`: 50,000 tensors of 4x4 (Llama-style expert names), as .bin and as safetensors.
Each fit runs the CLI in a fresh process (`fit DIR --no-save --device cpu -q`, default threads, page cache
warm), which prints its wall time and its peak resident memory (VmHWM, from /proc: mapped file pages count);
`--repeat` rounds, the formats alternating; the medians are printed. `--before DIR` runs another checkout (its
C kernels built) in the same rounds.

    python benchmarks/bench_bin.py                       # all cases, this checkout
    python benchmarks/bench_bin.py --only many --repeat 3 --before /tmp/before
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
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import sys, time
from weightdiag.cli import main
start = time.perf_counter()
try:
    main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
else:
    code = 0
took = time.perf_counter() - start
hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))
print('RESULT', code, took, hwm, file=sys.stderr)
"""

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128}


def _folders(root: Path, key: str) -> tuple[Path, Path]:
    return root / f"{key}-bin", root / f"{key}-st"


def write_bomb(root: Path) -> None:
    folder = root / "bomb-bin"
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / "plain.bin"
    torch.save({"model.layers.0.mlp.down_proj.weight": torch.randn(8, 8)}, plain)
    with zipfile.ZipFile(plain) as z:
        entries = [(info.filename, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(folder / "pytorch_model.bin", "w") as z:
        for name, content in entries:
            info = zipfile.ZipInfo(name.replace("plain/", "pytorch_model/"))
            if name.endswith("/data.pkl"):
                info.compress_type = zipfile.ZIP_DEFLATED
                with z.open(info, "w", force_zip64=True) as w:
                    w.write(content)
                    zeros = bytes(16 << 20)
                    for _ in range(128):  # 2 GiB
                        w.write(zeros)
            else:
                z.writestr(info, content)
    plain.unlink()


def write_transposed(root: Path) -> None:
    binary, safetensors = _folders(root, "transposed")
    weight = torch.randn(8192, 8192, generator=torch.Generator().manual_seed(0)) * 0.02
    name = "model.layers.0.mlp.down_proj.weight"
    for folder in (binary, safetensors):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(CONFIG))
    torch.save({name: weight.t()}, binary / "pytorch_model.bin")  # stride (1, 8192): not row-major
    save_file({name: weight.t().contiguous()}, str(safetensors / "model.safetensors"))


def write_many(root: Path, count: int = 50_000) -> None:
    binary, safetensors = _folders(root, "many")
    gen = torch.Generator().manual_seed(0)
    state = {
        f"model.layers.{i // 4}.mlp.experts.{i % 4}.down_proj.weight": (torch.randn(4, 4, generator=gen) * 0.02).to(
            torch.bfloat16
        )
        for i in range(count)
    }
    for folder in (binary, safetensors):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(CONFIG))
    torch.save(state, binary / "pytorch_model.bin")
    save_file(state, str(safetensors / "model.safetensors"))


CASES: dict[str, Callable[[Path], None]] = {"bomb": write_bomb, "transposed": write_transposed, "many": write_many}


def ensure(root: Path, key: str) -> list[tuple[str, Path]]:
    binary, safetensors = _folders(root, key)
    if not (binary / "pytorch_model.bin").exists():
        CASES[key](root)
    found = [("bin", binary)] + ([("safetensors", safetensors)] if safetensors.exists() else [])
    for _, folder in found:
        for path in folder.iterdir():
            with open(path, "rb") as f:  # page cache
                while f.read(64 << 20):
                    pass
    return found


def fit(checkout: Path, folder: Path) -> tuple[int, float, int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "WEIGHTDIAG_THREADS")}
    env["PYTHONPATH"] = str(checkout)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "fit", str(folder), "--no-save", "--device", "cpu", "-q"],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
    )
    line = next((x for x in out.stderr.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"fit {folder} failed:\n{out.stderr[-2000:]}")
    _, code, took, hwm = line.split()
    said = [x for x in out.stderr.splitlines() if x.strip() and not x.startswith("RESULT")]
    return int(code), float(took), int(hwm) * 1024, said[0][:160] if said else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "bench_bin")
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--before", type=Path, help="another checkout (its C kernels built), run in the same rounds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    checkouts = [("this", REPO)] + ([("before", args.before.resolve())] if args.before else [])
    results = []
    for key in args.only or list(CASES):
        samples: dict[tuple[str, str], list[tuple[int, float, int, str]]] = {}
        found = ensure(args.dir, key)
        for round_ in range(args.repeat):
            runs = [(c, f) for c in checkouts for f in found]
            if round_ % 2:
                runs.reverse()
            for (who, checkout), (fmt, folder) in runs:
                samples.setdefault((who, fmt), []).append(fit(checkout, folder))
        for (who, fmt), runs_ in samples.items():
            row = {
                "case": key,
                "checkout": who,
                "format": fmt,
                "exit": sorted({r[0] for r in runs_}),
                "seconds": round(statistics.median(r[1] for r in runs_), 2),
                "peak_rss_mb": round(statistics.median(r[2] for r in runs_) / 1e6, 1),
                "samples": len(runs_),
                "said": runs_[0][3],
            }
            results.append(row)
            print(json.dumps(row), flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "torch": torch.__version__,
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()

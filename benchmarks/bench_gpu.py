"""Issue 19's table in one run, for whoever has a GPU: the CPU and CUDA paths against the I/O ceiling.

Writes its own checkpoints (a Llama-3-8B-shaped BF16 one, 16.1 GB in 7 shards, and a 4-layer F32 one of
the same width, 7.7 GB), reads them once into the page cache, then measures, each in a fresh process:

  cat          the files to /dev/null, one stream, and 8 threads reading with pread (the I/O ceiling)
  api          fit_path(...) through the API, --device cpu and cuda: seconds, GB/s, peak host RSS (VmHWM)
  command      `weightdiag fit --no-save -q` with --device cpu, cuda and auto, end to end
  import       `import torch`, and with CUDA initialised
  workers      the API fit on the CPU with WEIGHTDIAG_THREADS = 1, 2, 4, 8, 16
  copies       host to device, pageable and pinned; torch.bincount of BF16 codes on the GPU, plain and
               over 16 replicated bin sets
  identical    whether the CPU and CUDA rows hold the same matrices (every k, λ, max and argmax)

Rows that need CUDA say "unmeasured: no CUDA GPU" where torch sees none, so the script also runs (and is
smoke-tested) on a machine without one. Results: a JSON document on stdout, a Markdown table on stderr.

    python benchmarks/bench_gpu.py                          # the issue's checkpoints (about 24 GB of disk)
    python benchmarks/bench_gpu.py --layers 2 --f32-layers 1 --width 512 --repeat 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from weightdiag.testing import synthetic  # noqa: E402

_VMHWM = (
    "print('VmHWM', next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')), file=sys.stderr)"
)
# The API fit: imports and tables warmed by a fit of one layer, then one timed fit; the row goes to argv[3].
API_CHILD = f"""
import json, sys, time
from weightdiag.api import fit_path
from weightdiag.run.measure import FitOptions
fit_path(sys.argv[1], FitOptions(device=sys.argv[2], include=["*.layers.0.*"]))
t = time.perf_counter()
row = fit_path(sys.argv[1], FitOptions(device=sys.argv[2]))
print(time.perf_counter() - t)
json.dump(row["matrices"], open(sys.argv[3], "w"))
{_VMHWM}
"""
COMMAND_CHILD = f"""
import sys
from weightdiag.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    {_VMHWM}
    raise
"""
IMPORT_CHILD = """
import sys, time
t = time.perf_counter()
import torch
if sys.argv[1] == "cuda":
    torch.cuda.init()
print(time.perf_counter() - t)
"""
PREAD_CHILD = """
import os, sys, time
from concurrent.futures import ThreadPoolExecutor
files, streams, block = sys.argv[2:], int(sys.argv[1]), 32 << 20
ranges = [(f, at) for f in files for at in range(0, os.path.getsize(f), block)]
def read(part):
    for f, at in part:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.pread(fd, block, at)
        finally:
            os.close(fd)
t = time.perf_counter()
with ThreadPoolExecutor(streams) as pool:
    list(pool.map(read, [ranges[i::streams] for i in range(streams)]))
print(time.perf_counter() - t)
"""
# Host to device copies and the GPU histogram of BF16 codes (what the CUDA path's reduction is made of).
DEVICE_CHILD = """
import json, time, torch
n = 1 << 30
out = {}
for name, pinned in (("pageable", False), ("pinned", True)):
    host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=pinned); torch.cuda.synchronize()
    t = time.perf_counter(); dev.copy_(host, non_blocking=pinned); torch.cuda.synchronize()
    out[f"h2d_{name}_GBps"] = n / (time.perf_counter() - t) / 1e9
codes = (torch.randn(1 << 28, device="cuda") * 0.02).to(torch.bfloat16).view(torch.int16).to(torch.int32) & 0xFFFF
for name, replicas in (("plain", 1), ("16_replicas", 16)):
    keys = codes + (torch.arange(codes.numel(), device="cuda", dtype=torch.int32) % replicas) * 65536
    torch.bincount(keys, minlength=65536 * replicas); torch.cuda.synchronize()
    t = time.perf_counter()
    torch.bincount(keys, minlength=65536 * replicas).view(replicas, 65536).sum(0); torch.cuda.synchronize()
    out[f"bincount_{name}_Gelem_s"] = codes.numel() / (time.perf_counter() - t) / 1e9
print(json.dumps(out))
"""

LLAMA3_8B = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_size": 14336, "vocab": 128256}
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
NO_CUDA = "unmeasured: no CUDA GPU"


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int | None, str]:
    """Wall seconds, peak RSS (bytes, when the child prints VmHWM) and stdout of a child process."""
    started = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**CHILD_ENV, **(env or {})})
    elapsed = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed: {out.stderr[-2000:]}")
    peak = next((int(line.split()[1]) * 1024 for line in out.stderr.splitlines() if line.startswith("VmHWM")), None)
    return elapsed, peak, out.stdout


def checkpoint(root: Path, dtype: str, layers: int, width: int | None) -> Path:
    shape = dict(LLAMA3_8B) if width is None else {**LLAMA3_8B, "d_model": width, "ffn_size": width * 7 // 2}
    if width is not None:
        shape["vocab"] = 8 * width
    folder = root / f"llama-d{shape['d_model']}-L{layers}-{dtype.lower()}"
    if not (folder / "config.json").exists():
        spec = synthetic.ModelSpec(n_layers=layers, dtype=dtype, shard_bytes=2_400_000_000, seed=1, **shape)
        started = time.perf_counter()
        synthetic.write_model(folder, spec)
        print(f"wrote {folder.name} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return folder


def cuda_available() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def same_fits(cpu_rows: Path, cuda_rows: Path) -> bool:
    """Every matrix's k and λ (all trims), max |w| and argmax equal on both devices. The moments (mean, std, ...)
    may differ in their last bits: CUDA sums the F32 power sums in another order (tests/test_reduce.py)."""

    def key(matrices: list[dict[str, Any]]) -> list[Any]:
        return [
            (m["name"], m["argmax"], m["stats"]["max_abs"], {t: (f["k"], f["lambda"]) for t, f in m["fits"].items()})
            for m in matrices
        ]

    return key(json.loads(cpu_rows.read_text())) == key(json.loads(cuda_rows.read_text()))


def api_fit(folder: Path, device: str, repeat: int, rows: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    runs = [run([sys.executable, "-c", API_CHILD, str(folder), device, str(rows)], env) for _ in range(repeat)]
    seconds = statistics.median(float(r[2].split()[-1]) for r in runs)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {"s": round(seconds, 3), "GBps": round(size / seconds / 1e9, 2), "rss_MB": (runs[-1][1] or 0) >> 20}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cuda = cuda_available()
    bf16 = checkpoint(args.data, "BF16", args.layers, args.width)
    f32 = checkpoint(args.data, "F32", args.f32_layers, args.width)
    out: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "cuda": cuda}
    for folder in (bf16, f32):
        subprocess.run(["cat", *map(str, folder.glob("*.safetensors"))], stdout=subprocess.DEVNULL, check=True)
    files = [str(f) for f in sorted(bf16.glob("*.safetensors"))]
    size = sum(os.path.getsize(f) for f in files)
    out["bf16"] = {"checkpoint": bf16.name, "GB": round(size / 1e9, 2), "shards": len(files)}
    cat = statistics.median(run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0] for _ in range(args.repeat))
    pread8 = statistics.median(
        float(run([sys.executable, "-c", PREAD_CHILD, "8", *files])[2]) for _ in range(args.repeat)
    )
    out["cat_GBps"] = {"1 stream": round(size / cat / 1e9, 2), "8 pread threads": round(size / pread8 / 1e9, 2)}
    devices = ["cpu", "cuda"] if cuda else ["cpu"]
    rows = {d: args.data / f"bench_gpu_rows_{d}.json" for d in devices}
    out["api_bf16"] = {d: api_fit(bf16, d, args.repeat, rows[d]) for d in devices}
    identical = {"bf16": same_fits(rows["cpu"], rows["cuda"])} if cuda else {}
    out["api_f32"] = {d: api_fit(f32, d, args.repeat, rows[d]) for d in devices}
    if cuda:
        identical["f32"] = same_fits(rows["cpu"], rows["cuda"])
    out["cpu_and_cuda_rows_identical"] = identical or NO_CUDA
    command = [sys.executable, "-c", COMMAND_CHILD, "fit", str(bf16), "--no-save", "-q", "--device"]
    run([*command, "cpu", "--include", "*.layers.0.*"])  # untimed: bytecode caches
    out["command_s"] = {
        d: round(statistics.median(run([*command, d])[0] for _ in range(args.repeat)), 2)
        if d != "cuda" or cuda
        else NO_CUDA
        for d in ("cpu", "cuda", "auto")
    }
    out["import_torch_s"] = {
        kind: round(float(run([sys.executable, "-c", IMPORT_CHILD, kind])[2]), 2) if kind == "cpu" or cuda else NO_CUDA
        for kind in ("cpu", "cuda")
    }
    out["cpu_workers_s"] = {
        n: api_fit(bf16, "cpu", args.repeat, rows["cpu"], {"WEIGHTDIAG_THREADS": str(n)})["s"] for n in (1, 2, 4, 8, 16)
    }
    out["device"] = json.loads(run([sys.executable, "-c", DEVICE_CHILD])[2]) if cuda else NO_CUDA
    return out


def table(r: dict[str, Any]) -> str:
    def each(d: Any, unit: str = "") -> str:
        return d if isinstance(d, str) else " / ".join(f"{k} {v}{unit}" for k, v in d.items())

    api, model = r["api_bf16"], r["bf16"]
    lines = [
        "| what | figure |",
        "|---|---|",
        f"| checkpoint | {model['checkpoint']}, {model['GB']} GB, {model['shards']} shards; {r['cores']} cores |",
        f"| cat, GB/s | {each(r['cat_GBps'])} |",
        *(
            f"| API fit BF16, --device {d} | {v['s']} s = {v['GBps']} GB/s, host RSS {v['rss_MB']} MB |"
            for d, v in api.items()
        ),
        *(
            f"| API fit F32, --device {d} | {v['s']} s = {v['GBps']} GB/s, host RSS {v['rss_MB']} MB |"
            for d, v in r["api_f32"].items()
        ),
        f"| command, s | {each(r['command_s'])} |",
        f"| import torch, s | {each(r['import_torch_s'])} |",
        f"| CPU workers, s | {each(r['cpu_workers_s'])} |",
        f"| GPU copies and bincount | {each(r['device'])} |",
        f"| CPU and CUDA rows identical | {each(r['cpu_and_cuda_rows_identical'])} |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="BF16 checkpoint layers (32: Llama-3-8B, 16.1 GB)")
    parser.add_argument("--f32-layers", type=int, default=4)
    parser.add_argument("--width", type=int, help="a narrower model (d_model) for a quick look; default 4096")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    result = measure(args)
    print(json.dumps(result, indent=1))
    print(table(result), file=sys.stderr)


if __name__ == "__main__":
    main()

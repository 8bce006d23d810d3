"""Issue 41's acceptance run, for whoever has a GPU: the CPU, CUDA and auto paths of the fit and of the spectrum.

Writes its own checkpoints (Llama-3-8B-shaped BF16: 8 layers, 5.6 GB, and 32 layers, 16.1 GB in 7 shards), reads
them once into the page cache, then measures, each in a fresh process:

  fit          fit_path(...) through the API with --device cpu, cuda and auto, interleaved (repeat x checkpoint
               x device, so that a drift of the machine hits every device alike): seconds, GB/s, peak host RSS
               (VmHWM); rows equal (every matrix record of the row, byte for byte, against the CPU's)
  spectrum     `weightdiag fit --spectrum` of the 32-layer checkpoint, whole command, with --device cuda, auto
               (the fit on the CPU, the spectrum on the GPU) and cpu (stopped after --cpu-spectrum-limit
               seconds); every alpha equal within ALPHA_RTOL; the solver the row names (pytorch issue 183806)
  cat          the files to /dev/null, one stream, and 8 threads reading with pread (the I/O ceiling)
  device       host to device copies, pageable and pinned; the BF16 histogram on the GPU three ways (bincount
               on one set of bins, bincount over 16 copies, scatter_add into 16 int32 copies: the fit's)
  --extras     issue 19's: `import torch` alone, and the API fit on the CPU with WEIGHTDIAG_THREADS = 1..16

Rows that need CUDA say "unmeasured: no CUDA GPU" where torch sees none, so the script also runs (and is
smoke-tested) on a machine without one. Results: a JSON document on stdout, a Markdown table on stderr, and
one object appended to benchmarks/results/gpu.json (--results) with the acceptance's fields.

    python benchmarks/bench_gpu.py                                   # the issue's checkpoints (22 GB of disk)
    python benchmarks/bench_gpu.py --layers 2 --small-layers 1 --width 256 --repeat 1 --results /tmp/gpu.json
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
keys = codes.to(torch.int64)
sub = torch.zeros(16 * 65536, dtype=torch.int32, device="cuda")
ones = torch.ones(codes.numel(), dtype=torch.int32, device="cuda")
offsets = (torch.arange(codes.numel(), device="cuda", dtype=torch.int64) % 16) * 65536
sub.scatter_add_(0, keys + offsets, ones); torch.cuda.synchronize()
t = time.perf_counter()
sub.scatter_add_(0, keys + offsets, ones); sub.view(16, 65536).sum(0, dtype=torch.int64); torch.cuda.synchronize()
out["scatter_add_16_int32_Gelem_s"] = codes.numel() / (time.perf_counter() - t) / 1e9
print(json.dumps(out))
"""
TORCH_CHILD = """
import json, torch
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu}))
"""
ALPHA_RTOL = 1e-6  # alphas of two devices: the same matrix summed in other blocks (tests/test_spectrum_pipeline.py)

LLAMA3_8B = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "ffn_size": 14336, "vocab": 128256}
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
NO_CUDA = "unmeasured: no CUDA GPU"


def run(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float | None = None
) -> tuple[float, int | None, str]:
    """Wall seconds, peak RSS (bytes, when the child prints VmHWM) and stdout of a child process."""
    started = time.perf_counter()
    env = {**CHILD_ENV, **(env or {})}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
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


def api_fit(folder: Path, device: str, repeat: int, rows: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    runs = [run([sys.executable, "-c", API_CHILD, str(folder), device, str(rows)], env) for _ in range(repeat)]
    seconds = statistics.median(float(r[2].split()[-1]) for r in runs)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    return {"s": round(seconds, 3), "GBps": round(size / seconds / 1e9, 2), "rss_MB": (runs[-1][1] or 0) >> 20}


def same_rows(rows: Path, other: Path) -> bool:
    """Every matrix record of two rows equal, byte for byte (the fit's records: BF16 is exact on every device)."""
    return json.loads(rows.read_text()) == json.loads(other.read_text())


def fits(models: dict[str, Path], devices: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """The API fit of every checkpoint on every device, interleaved: per checkpoint and device the median seconds,
    GB/s and the largest host RSS; whether each device's row equals the CPU's."""
    runs: dict[str, dict[str, list[tuple[float, int]]]] = {name: {d: [] for d in devices} for name in models}
    rows = {name: {d: args.data / f"bench_gpu_rows_{name}_{d}.json" for d in devices} for name in models}
    for _ in range(args.repeat):
        for name, folder in models.items():
            for d in devices:
                _, peak, stdout = run([sys.executable, "-c", API_CHILD, str(folder), d, str(rows[name][d])])
                runs[name][d].append((float(stdout.split()[-1]), peak or 0))
    out: dict[str, Any] = {}
    for name, folder in models.items():
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        each = {}
        for d in devices:
            seconds = statistics.median(s for s, _ in runs[name][d])
            each[d] = {
                "s": round(seconds, 3),
                "GBps": round(size / seconds / 1e9, 2),
                "rss_MB": max(p for _, p in runs[name][d]) >> 20,
            }
        equal = {d: same_rows(rows[name]["cpu"], rows[name][d]) for d in devices if d != "cpu"}
        out[name] = {"GB": round(size / 1e9, 2), "devices": each, "rows_equal_cpu": equal}
    return out


def spectra(folder: Path, devices: list[str], limit: float) -> dict[str, Any]:
    """`fit --spectrum` of `folder`, the whole command, per device (the CPU stopped after `limit` seconds)."""
    out: dict[str, Any] = {}
    alphas = {}
    for d in devices:
        cmd = [sys.executable, "-c", COMMAND_CHILD, "fit", str(folder), "--spectrum", "--no-save", "--json", "-q"]
        try:
            took, peak, stdout = run([*cmd, "--device", d], timeout=limit if d == "cpu" else None)
        except subprocess.TimeoutExpired:
            out[d] = {"s": f"unfinished in {limit:.0f} s"}
            continue
        row = json.loads(stdout)
        alphas[d] = {m["name"]: m.get("spectrum", {}).get("alpha") for m in row["matrices"]}
        spectrum = row["run"]["spectrum"]
        out[d] = {
            "s": round(took, 2),
            "spectrum_s": spectrum["seconds"],
            "rss_MB": (peak or 0) >> 20,
            "matrices": spectrum["matrices"],
            "device": spectrum["device"],
            "solver": spectrum.get("solver"),
            "device_choice": row["run"].get("device_choice"),
        }
    if len(alphas) >= 2:
        first, *others = alphas.values()
        out["alphas_equal"] = all(
            first.keys() == other.keys()
            and all(
                (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= ALPHA_RTOL * abs(b))
                for a, b in ((first[k], other[k]) for k in first)
            )
            for other in others
        )
    else:
        out["alphas_equal"] = "unmeasured: one device finished"
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cuda = cuda_available()
    build = json.loads(run([sys.executable, "-c", TORCH_CHILD])[2])
    models = {
        "small": checkpoint(args.data, "BF16", args.small_layers, args.width),
        "large": checkpoint(args.data, "BF16", args.layers, args.width),
    }
    out: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "cuda": cuda, **build}
    out["checkpoints"] = {name: folder.name for name, folder in models.items()}
    for folder in models.values():
        subprocess.run(["cat", *map(str, folder.glob("*.safetensors"))], stdout=subprocess.DEVNULL, check=True)
    files = [str(f) for f in sorted(models["large"].glob("*.safetensors"))]
    size = sum(os.path.getsize(f) for f in files)
    cat = statistics.median(run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0] for _ in range(args.repeat))
    pread8 = statistics.median(
        float(run([sys.executable, "-c", PREAD_CHILD, "8", *files])[2]) for _ in range(args.repeat)
    )
    out["cat_GBps"] = {"1 stream": round(size / cat / 1e9, 2), "8 pread threads": round(size / pread8 / 1e9, 2)}
    devices = ["cpu", "cuda", "auto"] if cuda else ["cpu", "auto"]
    out["fit"] = fits(models, devices, args)
    out["spectrum"] = (
        spectra(models["large"], ["cuda", "auto", "cpu"] if cuda else ["cpu", "auto"], args.cpu_spectrum_limit)
        if args.spectrum
        else "not run (--no-spectrum)"
    )
    out["device"] = json.loads(run([sys.executable, "-c", DEVICE_CHILD])[2]) if cuda else NO_CUDA
    if args.extras:
        out["import_torch_s"] = {
            kind: round(float(run([sys.executable, "-c", IMPORT_CHILD, kind])[2]), 2)
            if kind == "cpu" or cuda
            else NO_CUDA
            for kind in ("cpu", "cuda")
        }
        rows = args.data / "bench_gpu_rows_workers.json"
        out["cpu_workers_s"] = {
            n: api_fit(models["large"], "cpu", args.repeat, rows, {"WEIGHTDIAG_THREADS": str(n)})["s"]
            for n in (1, 2, 4, 8, 16)
        }
    return out


def acceptance(r: dict[str, Any]) -> dict[str, Any]:
    """The object benchmarks/results/gpu.json keeps per run: the issue's fields, for the large checkpoint."""
    large = r["fit"]["large"]["devices"]
    spectrum = r["spectrum"] if isinstance(r["spectrum"], dict) else {}

    def gbs(device: str) -> float | str:
        return large[device]["GBps"] if device in large else NO_CUDA

    def seconds(device: str) -> float | str | None:
        found = spectrum.get(device)
        return found["s"] if found else None

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device_name": r["gpu"] or "none (CPU only: the CUDA figures are unmeasured)",
        "torch": r["torch"],
        "cuda_version": r["cuda"],
        "cores": r["cores"],
        "checkpoint": r["checkpoints"]["large"],
        "cpu_gbs": gbs("cpu"),
        "cuda_gbs": gbs("cuda"),
        "auto_gbs": gbs("auto"),
        "host_rss_mb": max(d["rss_MB"] for d in large.values()),
        "rows_equal": all(all(f["rows_equal_cpu"].values()) for f in r["fit"].values()),
        "spectrum_16gb_s": seconds("cuda") if r["cuda"] else NO_CUDA,
        "spectrum_16gb_auto_s": seconds("auto"),  # the fit on the CPU, the spectrum on the GPU (where one is)
        "spectrum_16gb_cpu_s": seconds("cpu"),
        "alphas_equal": spectrum.get("alphas_equal"),
        "solver": (spectrum.get("cuda") or spectrum.get("cpu") or {}).get("solver"),
        "small_checkpoint": {
            "name": r["checkpoints"]["small"],
            **{f"{d}_gbs": v["GBps"] for d, v in r["fit"]["small"]["devices"].items()},
        },
    }


def table(r: dict[str, Any]) -> str:
    def each(d: Any, unit: str = "") -> str:
        return d if isinstance(d, str) else " / ".join(f"{k} {v}{unit}" for k, v in d.items())

    lines = [
        "| what | figure |",
        "|---|---|",
        f"| machine | {r['cores']} cores, GPU {r['gpu']}, torch {r['torch']} (CUDA {r['cuda']}) |",
        f"| cat, GB/s | {each(r['cat_GBps'])} |",
    ]
    for name, f in r["fit"].items():
        for d, v in f["devices"].items():
            lines.append(
                f"| API fit {r['checkpoints'][name]} ({f['GB']} GB), --device {d} | {v['s']} s = {v['GBps']} GB/s, "
                f"host RSS {v['rss_MB']} MB |"
            )
        lines.append(f"| rows equal to the CPU's, {r['checkpoints'][name]} | {each(f['rows_equal_cpu'])} |")
    if isinstance(r["spectrum"], dict):
        for d, v in r["spectrum"].items():
            lines.append(f"| fit --spectrum, {d} | {v if not isinstance(v, dict) else each(v)} |")
    lines.append(f"| GPU copies and histograms | {each(r['device'])} |")
    for key in ("import_torch_s", "cpu_workers_s"):
        if key in r:
            lines.append(f"| {key} | {each(r[key])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32, help="the large checkpoint's layers (32: 16.1 GB)")
    parser.add_argument("--small-layers", type=int, default=8, help="the small checkpoint's layers (8: 5.6 GB)")
    parser.add_argument("--width", type=int, help="a narrower model (d_model) for a quick look; default 4096")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-spectrum", dest="spectrum", action="store_false", help="leave fit --spectrum out")
    parser.add_argument("--cpu-spectrum-limit", type=float, default=300.0, help="seconds the CPU spectrum may take")
    parser.add_argument("--extras", action="store_true", help="issue 19's import and CPU worker figures too")
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results" / "gpu.json")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    result = measure(args)
    print(json.dumps(result, indent=1))
    print(table(result), file=sys.stderr)
    kept = json.loads(args.results.read_text()) if args.results.exists() else []
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps([*kept, acceptance(result)], indent=1) + "\n")


if __name__ == "__main__":
    main()

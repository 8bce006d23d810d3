"""ΔW as a LoRA adapter: the truncated SVD of one matrix's ΔW, B (out x r) and A (r x in) with B A ≈ ΔW.

Pure numerics. The best rank-r approximation in the Frobenius norm is the truncated SVD (Eckart and Young,
"The approximation of one matrix by another of lower rank", Psychometrika 1936); its error is the energy left in
the singular values beyond r, reported per matrix. With `energy` the rank is the smallest holding that share of
||ΔW||_F^2 (as the diff's rank90); with `rank` it is that rank (at most min(m, n)). With neither (the default):
ΔW's own rank when ΔW is exactly low-rank (the singular values beyond r hold at most EXACT of ||ΔW||^2 and r is
at most half of min(m, n): a merged LoRA of rank r, stored in float32), else the rank holding DEFAULT_ENERGY.
Without that rule a rank-8 LoRA whose last direction holds under 10% of ||ΔW||^2 came out at rank 7.

The singular vectors come from the Gram of the narrower side (G = ΔW^T ΔW, n x n, when n <= m; else ΔW ΔW^T),
float64, and its eigendecomposition: memory is ΔW (float32, held by the caller) plus a few min(m, n)^2 float64
arrays, not numpy's SVD's ~5 m n float64 (over 500 MB for a 5632 x 2048 matrix). Squaring ΔW costs precision
only in the smallest singular values (those below ~1e-8 of the largest), far below any energy cut or the
exactness test. With V_r the top r right singular vectors, B = ΔW V_r / sqrt(S_r) and A = sqrt(S_r) V_r^T
(U_r sqrt(S_r) and sqrt(S_r) V_r^T: balanced factors; PEFT's scaling lora_alpha / r is set to 1 by the adapter's
config); the left-Gram case is the transpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .spectrum import rank_at

DEFAULT_ENERGY = 0.9
EXACT = 1e-6  # ΔW of rank r: the singular values beyond r hold at most this share of ||ΔW||_F^2
ROWS = 512  # rows (or columns) of ΔW multiplied at a time: the float64 copy of one slab (8 MB at 2,048 wide)


@dataclass(frozen=True)
class Factors:
    b: np.ndarray  # out x r (float32): lora_B
    a: np.ndarray  # r x in (float32): lora_A
    rank: int
    energy: float  # share of ||ΔW||_F^2 the r singular values hold
    error: float  # ||ΔW - B A||_F / ||ΔW||_F (from the singular values; 0 for ΔW = 0)
    exact: bool = False  # the default's rank is ΔW's own (exactly low-rank)


def _gram(d: np.ndarray, side: str) -> np.ndarray:
    """ΔW^T ΔW ("right") or ΔW ΔW^T ("left"), float64, its lower triangle summed in place over slabs (BLAS dsyrk:
    no product-sized temporary); the upper triangle is not filled (eigh reads the lower one)."""
    from scipy.linalg.blas import dsyrk

    dim = d.shape[1] if side == "right" else d.shape[0]
    g = np.zeros((dim, dim), order="F")
    steps = d.shape[0] if side == "right" else d.shape[1]
    for lo in range(0, steps, ROWS):
        # a: dim x slab (Fortran order), a a^T summed into g
        x = d[lo : lo + ROWS].T if side == "right" else d[:, lo : lo + ROWS]
        a = np.asfortranarray(x, dtype=np.float64)
        g = dsyrk(1.0, a, beta=1.0, c=g, trans=0, lower=1, overwrite_c=1)
    return g


def _times(d: np.ndarray, v: np.ndarray) -> np.ndarray:
    """ΔW v (m x r), float64, by slabs of rows."""
    out = np.empty((d.shape[0], v.shape[1]))
    for r0 in range(0, d.shape[0], ROWS):
        out[r0 : r0 + ROWS] = d[r0 : r0 + ROWS].astype(np.float64) @ v
    return out


def exact_rank(squares: np.ndarray, total: float) -> int | None:
    """r when ΔW is exactly of rank r (see the module docstring), else None."""
    r = rank_at(squares, total, 1.0 - EXACT)
    if r is None or total <= 0 or r > squares.size // 2:
        return None
    return r


def factor(delta: np.ndarray, *, rank: int | None = None, energy: float | None = None) -> Factors:
    """The truncated SVD of ΔW (m x n) at `rank`, at the rank holding `energy` of ||ΔW||_F^2, or (neither) at
    ΔW's own rank when exactly low-rank, else at DEFAULT_ENERGY."""
    d = np.asarray(delta, dtype=np.float32) if delta.dtype != np.float64 else delta
    m, n = d.shape
    side = "right" if n <= m else "left"
    from scipy.linalg import eigh

    lam, vecs = eigh(_gram(d, side), lower=True, overwrite_a=True, check_finite=False)
    lam, vecs = np.clip(lam[::-1], 0.0, None), vecs[:, ::-1]
    total = float(np.sum(lam))
    exact = False
    if total <= 0:
        r = 0
    elif rank is not None:
        r = min(int(rank), lam.size)
    elif energy is not None:
        r = rank_at(lam, total, energy) or lam.size
    else:
        found = exact_rank(lam, total)
        exact = found is not None
        r = found if found is not None else rank_at(lam, total, DEFAULT_ENERGY) or lam.size
    r = min(r, int(np.count_nonzero(lam > 0)))  # no direction of σ = 0 (nothing to divide by)
    s = np.sqrt(lam[:r])
    v = vecs[:, :r]
    if side == "right":  # v: right singular vectors; ΔW v = U S
        b = (_times(d, v) / np.sqrt(s)).astype(np.float32)
        a = (np.sqrt(s)[:, None] * v.T).astype(np.float32)
    else:  # v: left singular vectors; v^T ΔW = S V^T
        b = (v * np.sqrt(s)).astype(np.float32)
        a = (_times(d.T, v).T / np.sqrt(s)[:, None]).astype(np.float32)
    held = float(np.sum(lam[:r])) / total if total > 0 else 1.0
    error = math.sqrt(max(1.0 - held, 0.0)) if total > 0 else 0.0
    return Factors(b, a, r, held, error, exact)

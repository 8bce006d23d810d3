"""Subspace figures for a matrix too wide for a Gram (forensics.side_for: None), from one pass over its row blocks.

A matrix wider than the gram_cols knob and read in several blocks (every matrix of a real LLM) has no W^T W or
W W^T within reach. Its left singular subspaces are sketched instead: the randomized range finder of Halko,
Martinsson and Tropp, "Finding structure with randomness: probabilistic algorithms for constructing approximate
matrix decompositions" (SIAM Review 53(2), 2011), Algorithms 4.1 and 5.1, made single-pass because the range
sketch's rows arrive with the block that makes them. With a Gaussian Ω (n x l, float32, from a fixed seed, shared
by both sides) and each row block of the base W, the tuned T and ΔW = T - W (float32 GEMMs, sums in float64):

    Y_W = W_b Ω,  Y_T = Y_W + ΔW_b Ω,  Z = [Y_W, Y_T]      (rows x 2l, not kept)
    G += Z^T Z (2l x 2l),  S += Z^T W_b,  D += Z^T ΔW_b     (2l x n)

At the end: G = V Λ V^T, M = V Λ^{-1/2} (spectrum.range_map: directions of Λ below its RANGE_CUT of the largest
dropped, as for ΔW's sketch), so that Q = Z M is an orthonormal basis of both sides' sketched ranges, never
formed; Q^T W = M^T S and Q^T T = M^T (S + D), whose left singular vectors (forensics.descending_eig of the r x r
B B^T) and σ̂ (those of Q Q^T W, each at most W's) are the two sides' in one basis:

- principal cosines: the singular values of U_W,k^T U_T,k (k = forensics.TOP_K), both in Q's coordinates;
- spectral drift and the relative changes of the top σ, from σ̂ (one basis: a change of ΔW outside it moves
  neither side's σ̂);
- the base's own sketch, from Y_W alone (the first l columns of Z: G's, S's and D's first l rows), gives the
  principal energy ||U_k^T ΔW||_F^2 / ||ΔW||_F^2 (over the diff's exact ||ΔW||_F^2; isotropic share k / m) and
  the intruders: each of the tuned's top INTRUDER_K vectors against the base's l sketched vectors (the exact
  path: against every base singular vector). Y_T holds ΔW's directions; a base subspace drawn from it would
  lean toward ΔW (noise would read as principal) and match every new direction (no intruder);
- alpha: None (a power-law fit needs the whole ESD; the sketch holds l eigenvalues).

Both sides come from one Ω: an untouched matrix gives D = 0 and one subspace (cosines 1, drift 0, no intruder),
and the sketch's errors on a small change are largely shared by the two sides. tests/test_forensics_wide.py
states the agreement with the exact Gram path measured; docs/forensics.md what it misses.
Pure numerics: arrays in, numbers out; parts are plain numpy, folded in block order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from .forensics import INTRUDER_EPS, INTRUDER_K, REPORTED, TOP_K, Forensics, descending_eig
from .spectrum import range_map

SKETCH_SIZE = 64  # l: columns of Ω (TOP_K = 16 directions compared, oversampled fourfold)
SIDE = "sketch"  # Forensics.side of a sketched matrix


class WidePart(NamedTuple):
    """One row block's sums (plain numpy: picklable, folded in block order)."""

    gram: np.ndarray  # Z^T Z (2l x 2l), Z = [Y_W, Y_T]
    s: np.ndarray  # Z^T W_b (2l x n, float32)
    d: np.ndarray  # Z^T ΔW_b (2l x n, float32)


class WideSketch:
    """Both sides' range sketches over row blocks (see the module docstring); `block_part` may run in several
    threads, `fold` runs in block order."""

    def __init__(self, m: int, n: int, seed: int = 0, size: int = SKETCH_SIZE) -> None:
        self.m, self.n = m, n
        self.l = max(1, min(size, m, n))
        self.omega = np.random.default_rng([seed, 2, n]).standard_normal((n, self.l), dtype=np.float32)
        self.gram = np.zeros((2 * self.l, 2 * self.l))
        # ZᵀW and ZᵀΔW summed in float32 (each block's part is sgemm's float32; a few dozen blocks add ~1e-6
        # relative, far below the sketch's own error) to hold 2 x 2l x n x 4 bytes per matrix in flight
        self.s = np.zeros((2 * self.l, n), dtype=np.float32)
        self.d = np.zeros((2 * self.l, n), dtype=np.float32)

    def block_part(self, base: np.ndarray, tuned: np.ndarray, delta: np.ndarray | None = None) -> WidePart:
        """base, tuned: values of rows [r0, r1) (rows x n); delta: ΔW there as the diff computed it (0 where a
        side is not finite), or None (then T - W here)."""
        b = np.asarray(base, dtype=np.float32)
        t = np.asarray(tuned, dtype=np.float32)
        yb = b @ self.omega
        if not np.isfinite(yb).all() or not np.isfinite(t @ self.omega[:, :1]).all():
            # NaN/Inf left out, as the diff's sums do (a non-finite element spoils its whole row of Y)
            finite = np.isfinite(b) & np.isfinite(t)
            b, t = np.where(finite, b, np.float32(0)), np.where(finite, t, np.float32(0))
            yb, delta = b @ self.omega, None
        d = t - b if delta is None else np.asarray(delta, dtype=np.float32)
        z = np.concatenate([yb, yb + d @ self.omega], axis=1)  # [Y_W, Y_T]: Y_T is Y_W exactly where ΔW = 0
        z64 = z.astype(np.float64)
        # ZᵀW and ZᵀΔW stay float32 as sgemm gave them (a float64 copy added no digits and doubled the parts in
        # flight: 5.8 MB each at 5,632 wide); the Gram, whose inverse root orthonormalizes Q, is float64
        return WidePart(z64.T @ z64, z.T @ b, z.T @ d)

    def fold(self, part: WidePart) -> None:
        self.gram += part.gram
        self.s += part.s
        self.d += part.d

    def result(self, counts: Forensics, delta_sq: float) -> Forensics:
        """`counts` (forensics.Accumulator's result without subspaces) with the sketched subspace figures;
        delta_sq: the diff's exact ||ΔW||_F^2 (the principal energy's denominator)."""
        half = self.l
        to_q = range_map(self.gram)  # Q = Z to_q: an orthonormal basis of both sides' ranges
        bw = to_q.T @ self.s  # Q^T W (r x n)
        same = not np.any(self.d)
        sb, ub = descending_eig(bw @ bw.T)  # σ̂ and U of the r x n B from B B^T (level-3 BLAS, as spectrum.py's)
        st, ut = sb, ub
        if not same:
            bt = bw + to_q.T @ self.d  # Q^T T
            st, ut = descending_eig(bt @ bt.T)
        # the base's own sketch (Y_W alone): independent of ΔW, so that ΔW's directions, which Y_T holds, lend the
        # base's top-k no share of ΔW (the principal energy) and no tuned direction its own match (intruders)
        to_w = range_map(self.gram[:half, :half])
        base_own = to_w.T @ self.s[:half]
        own, uw = descending_eig(base_own @ base_own.T)
        k = min(TOP_K, sb.size, st.size, own.size)
        blank = replace(counts, side=SIDE, k=0, basis=int(own.size))
        if k == 0:
            return blank
        ki = min(INTRUDER_K, st.size)
        if same:  # one matrix: one subspace (its cosines 1 exactly, not 1 - 1e-16)
            cos, best = np.ones(k), np.ones(ki)
        else:
            cross = ub[:, :k].T @ ut[:, :k]  # U_W^T U_T, both in Q's coordinates
            cos = np.clip(np.linalg.svd(cross, compute_uv=False), 0.0, 1.0)
            in_q = to_q.T @ self.gram[:, :half] @ to_w @ uw  # the base's own vectors in Q's coordinates
            best = np.max(np.abs(in_q.T @ ut[:, :ki]), axis=0)
        ranks = tuple(int(j) + 1 for j in np.flatnonzero(best < INTRUDER_EPS))
        top = min(REPORTED, k)
        energy = None
        if delta_sq > 0:
            energy = min(float(np.sum((uw[:, :k].T @ to_w.T @ self.d[:half]) ** 2)) / delta_sq, 1.0)
        return replace(
            blank,
            k=k,
            principal_cosines=tuple(float(c) for c in cos),
            overlap=float(np.mean(cos**2)),
            spectral_drift=float(np.linalg.norm(st[:k] - sb[:k]) / np.linalg.norm(sb[:k])),
            singular_change=tuple(float(x) for x in st[:top] / sb[:top] - 1.0),
            intruders=len(ranks),
            intruder_ranks=ranks,
            intruder_strength=max((float(st[j - 1] / st[0]) for j in ranks), default=0.0),
            intruder_cosines=tuple(float(c) for c in best),
            principal_energy=energy,
            isotropic_energy=k / self.m,
        )

"""The spectrum of ΔW from one pass over its row blocks: exact when small enough, else a randomized sketch.

Every path takes ΔW as row blocks (rows [r0, r1) of an m x n matrix, in order) and never holds ΔW whole:

- `Gram` (n <= the gram_cols knob, 1024): G = ΔW^T ΔW accumulated in float64; its eigenvalues are the σ_i^2
  (up to float64 rounding: σ_i^2 below ~1e-13 σ_1^2 are noise, far below any 90% energy cut).
- `Sketch` (wider matrices): the single-pass low-rank approximation of Tropp, Yurtsever, Udell and
  Cevher, "Practical sketching algorithms for low-rank matrix approximation" (SIAM J. Matrix Anal. Appl.
  38(4), 2017), Algorithm 4 ("simplest" one-pass with a range and a co-range sketch):
      Y = ΔW Ω (m x k)    -- row block r0:r1 of Y is ΔW[r0:r1] Ω, written once
      W = Ψ ΔW (l x n)    -- sum over row blocks of Ψ[:, r0:r1] ΔW[r0:r1]
      Q = orth(Y),  X = (Ψ Q)^+ W,  Â = Q X,  σ̂ = singular values of X.
  with Gaussian Ω (n x k) and Ψ (l x m), k = min(cap, m, n), l = min(2k + 1, m). Their Theorem 4.3:
      E ||ΔW - Â||_F^2 <= (1 + f(k, l)) * min_{ρ < k-1} (1 + f(ρ, k)) * τ_{ρ+1}^2(ΔW),
      f(s, t) = s / (t - s - 1),  τ_{ρ+1}^2 = Σ_{j > ρ} σ_j^2 (the energy beyond the best rank-ρ fit).
  In particular a ΔW of rank <= k is recovered exactly (up to rounding). How far the σ̂ can be from the σ
  follows from Mirsky's inequality: ||σ̂ - σ||_2 <= ||ΔW - Â||_F =: e, so sqrt of the energy the top r
  σ̂ hold is within ±e of that of the top r σ (see `rank90_bounds`). e is estimated a posteriori from a
  third, small sketch S = Θ ΔW (Θ: s x m Gaussian): e^2 ≈ ||S - Θ Q X||_F^2 / s, an unbiased estimate
  (Tropp, Yurtsever, Udell, Cevher, "Streaming low-rank matrix approximation with an application to
  scientific simulation", SIAM J. Sci. Comput. 2019, Sec. 6).

Q is never formed: Y itself is not kept (an embedding's m can be 150,000). Its Gram matrix G = Y^T Y
(k x k) and [Ψ; Θ] Y are summed block by block instead; with G = V Λ V^T, Q = Y V Λ^{-1/2} (directions of
Y below 1e-6 of its largest singular value dropped: they hold under 1e-12 of its energy), so that
Ψ Q = (Ψ Y) V Λ^{-1/2} and Θ Q likewise, all k x k or l x k. Ψ and Θ are drawn per row block from a seed
and the block's first row (float32 Gaussians), used once and dropped.
Pure numerics: arrays in, numbers out. Deterministic for a given seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import tuning

if TYPE_CHECKING:
    import torch

SKETCH_CAP = 128  # k: largest range sketch; l = 2k + 1 (Tropp et al.'s advice for a decaying spectrum)
ERROR_ROWS = 16  # s: rows of the error sketch Θ
ERROR_SAFETY = 1.5  # the error estimate is a 16-sample mean: widen it before bounding rank90 with it
TOP_SINGULAR = 8  # singular values reported per matrix
ENERGY = 0.9  # rank90: singular values holding 90% of ||ΔW||_F^2
NEAR_ALL = 0.999  # rank999: singular values holding 99.9% of ||ΔW||_F^2 (the sketch: a lower bound, or pinned)
TOL = 1e-9  # relative slack on the energy cut (float64 rounding of the sums)
RANGE_CUT = 1e-12  # eigenvalues of a sketch's Gram below this fraction of the largest: directions dropped from Q
TAIL_MARGIN = 4.0  # tail_rank: the squared error must exceed Tropp et al.'s expected bound this many times over


@dataclass(frozen=True)
class Spectrum:
    """What the spectrum of one ΔW says."""

    method: str  # "exact" (Gram or SVD of the whole) | "sketch"
    singular: tuple[float, ...]  # largest σ (or σ̂), descending, at most TOP_SINGULAR
    rank90: int | None  # None: the sketch's k σ̂ hold less than 90% (rank90 > k)
    rank90_at_least: int  # rank90 itself when known; k + 1 when the sketch could not reach 90%
    sketch_size: int | None = None  # k (sketch only)
    error: float | None = None  # sketch only: estimated ||ΔW - Â||_F / ||ΔW||_F (0: exact)
    # Where the true rank90 lies (the stated bound, see the module docstring); None as the upper end: beyond
    # what the sketch can bound. (rank90, rank90) when exact.
    rank90_range: tuple[int, int | None] | None = None
    # how many σ hold 99.9% of ||ΔW||_F^2 (a merged LoRA of rank r: r, up to the rounding of its storage; a
    # fine-tune's is far larger); from the sketch only where its error bound pins it to one value, else None
    rank999: int | None = None
    # a lower bound on rank999 (rank999 itself when known): the sketch's, from the same error bound as
    # rank90_at_least (k + 1 when its k σ̂ cannot reach 99.9% within the bound); None: not computed
    rank999_at_least: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "singular_values": [float(s) for s in self.singular],
            "rank90": self.rank90,
            "rank90_at_least": self.rank90_at_least,
            "sketch_size": self.sketch_size,
            "sketch_error": self.error,
            "rank90_range": list(self.rank90_range) if self.rank90_range is not None else None,
            "rank999": self.rank999,
            "rank999_at_least": self.rank999_at_least,
        }


def rank_at(singular_sq: np.ndarray, total: float, energy: float = ENERGY) -> int | None:
    """Smallest r with σ_1^2 + ... + σ_r^2 >= energy * total (None when all of them do not reach it);
    0 for a zero matrix."""
    if total <= 0:
        return 0
    cum = np.cumsum(np.sort(np.asarray(singular_sq, dtype=np.float64))[::-1])
    hit = np.flatnonzero(cum >= energy * total * (1 - TOL))
    return int(hit[0]) + 1 if hit.size else None


def range_map(gram: np.ndarray) -> np.ndarray:
    """V Λ^{-1/2} of a sketch's Gram Y^T Y = V Λ V^T, directions below RANGE_CUT of the largest dropped: Y V Λ^{-1/2}
    is an orthonormal basis of Y's range (delta/wide.py's sketch too)."""
    eig, vecs = np.linalg.eigh(gram)
    keep = eig > RANGE_CUT * max(float(eig[-1]), 0.0)
    return vecs[:, keep] / np.sqrt(eig[keep])


def tail_rank(error: float, total: float, k: int, co: int, energy: float = NEAR_ALL) -> int:
    """A lower bound on the rank holding `energy` of ||ΔW||_F^2 from the sketch's error, by Tropp et al.'s Theorem
    4.3 read backwards: were that rank at most ρ, the energy beyond ρ, τ_{ρ+1}^2, would be at most (1 - energy)
    total and E e^2 at most (1 + f(k, l)) (1 + f(ρ, k)) (1 - energy) total. An error above that (taken as
    error / ERROR_SAFETY, and TAIL_MARGIN over the expectation: one draw, not the mean) puts the rank beyond ρ.
    co: the co-range sketch's l. Returns 1 + the largest such ρ (< k - 1), 0 when none (or l < k + 2: the bound
    does not hold)."""
    if total <= 0 or co < k + 2:
        return 0
    seen = (error / ERROR_SAFETY) ** 2 / TAIL_MARGIN
    grow = 1 + k / (co - k - 1)
    found = 0
    for rho in range(k - 1):
        if grow * (1 + rho / (k - rho - 1)) * (1 - energy) * total >= seen:
            break
        found = rho + 1
    return found


def rank90_bounds(singular: np.ndarray, total: float, error: float, energy: float = ENERGY) -> tuple[int, int]:
    """The range in which rank90 of any matrix whose σ vector is within `error` (2-norm, Mirsky) of
    `singular` must lie, with total energy `total`: (lowest, highest); highest = len + 1 when unbounded."""
    s = np.sort(np.abs(np.asarray(singular, dtype=np.float64)))[::-1]
    if total <= 0:
        return 0, 0
    target = math.sqrt(energy * total)
    head = np.sqrt(np.cumsum(s**2))  # sqrt of the energy of the top r
    lo = np.flatnonzero(head + error >= target * (1 - TOL))
    hi = np.flatnonzero(head - error >= target * (1 - TOL))
    return (int(lo[0]) + 1 if lo.size else s.size + 1), (int(hi[0]) + 1 if hi.size else s.size + 1)


class Accumulator:
    """Takes ΔW's row blocks (float32 or float64, shape [r1 - r0, n]); `add_block` may run in several threads
    at once (each block writes its own rows or returns its partial sums), `fold` runs in order."""

    def block_part(self, r0: int, block: np.ndarray) -> Any:
        raise NotImplementedError

    def fold(self, part: Any) -> None:
        raise NotImplementedError

    def result(self, total: float) -> Spectrum:
        raise NotImplementedError


class Gram(Accumulator):
    """ΔW^T ΔW in float64: exact singular values for matrices up to gram_cols wide."""

    def __init__(self, m: int, n: int) -> None:
        self.gram = np.zeros((n, n), dtype=np.float64)

    def block_part(self, r0: int, block: np.ndarray) -> np.ndarray:
        b = np.asarray(block, dtype=np.float64)
        return b.T @ b

    def fold(self, part: np.ndarray) -> None:
        self.gram += part

    def result(self, total: float) -> Spectrum:
        eig = np.clip(np.linalg.eigvalsh(self.gram)[::-1], 0.0, None)
        return _exact(eig, total)


def _exact(eig: np.ndarray, total: float) -> Spectrum:
    """From the exact σ^2 (descending). The energy cut uses the exact ||ΔW||_F^2 of the sums."""
    rank = rank_at(eig, total)
    if rank is None:  # the eigenvalues' total fell short of the sums' by rounding: count them all
        rank = rank_at(eig, float(np.sum(eig)))
    rank = rank or 0
    singular = tuple(float(v) for v in np.sqrt(eig[:TOP_SINGULAR]))
    tail = rank_at(eig, total, NEAR_ALL)
    if tail is None:
        tail = rank_at(eig, float(np.sum(eig)), NEAR_ALL)
    tail = tail or 0
    return Spectrum("exact", singular, rank, rank, rank90_range=(rank, rank), rank999=tail, rank999_at_least=tail)


class Sketch(Accumulator):
    """The one-pass sketch of Tropp et al. (2017), Algorithm 4, with an a-posteriori error sketch."""

    def __init__(
        self, m: int, n: int, seed: int = 0, cap: int = SKETCH_CAP, device: str = "cpu", backend: str | None = None
    ) -> None:
        self.m, self.n = m, n
        self.k = max(1, min(cap, m, n))
        self.l = max(self.k, min(2 * self.k + 1, m))
        self.s = ERROR_ROWS
        self.seed = seed
        self.device = device
        # numpy on the CPU; torch on a GPU (or, for tests, torch on the CPU)
        self.backend = backend or ("numpy" if device == "cpu" else "torch")
        self.omega = np.random.default_rng([seed, 0, n]).standard_normal((n, self.k)).astype(np.float32)
        self.gram = np.zeros((self.k, self.k), dtype=np.float64)  # Y^T Y
        self.test_y = np.zeros((self.l + self.s, self.k), dtype=np.float64)  # [Ψ; Θ] Y
        self.w = np.zeros((self.l + self.s, n), dtype=np.float64)  # [Ψ; Θ] ΔW
        self._omega_dev: torch.Tensor | None = None  # omega on the device, copied there on first use

    def _test(self, r0: int, rows: int) -> np.ndarray:
        """[Ψ; Θ][:, r0:r0 + rows]: drawn from the seed and the block's first row, never held whole."""
        return np.random.default_rng([self.seed, 1, r0, rows]).standard_normal(
            (self.l + self.s, rows), dtype=np.float32
        )

    def block_part(self, r0: int, block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = np.asarray(block, dtype=np.float32)
        test = self._test(r0, d.shape[0])
        if self.backend == "torch":
            y_rows, w_part = self._on_device(d, test)
        else:
            y_rows, w_part = d @ self.omega, test @ d
        y64 = y_rows.astype(np.float64)
        return y64.T @ y64, test.astype(np.float64) @ y64, w_part

    def _on_device(self, d: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        if self._omega_dev is None:
            self._omega_dev = torch.from_numpy(self.omega).to(self.device)
        dd = torch.from_numpy(np.ascontiguousarray(d)).to(self.device)
        tt = torch.from_numpy(test).to(self.device)
        return (dd @ self._omega_dev).cpu().numpy(), (tt @ dd).cpu().numpy()

    def fold(self, part: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        gram, test_y, w_part = part
        self.gram += gram
        self.test_y += test_y
        self.w += w_part

    def range_map(self) -> np.ndarray:
        """V Λ^{-1/2} (k x r): Q = Y @ range_map() is an orthonormal basis of Y's range."""
        return range_map(self.gram)

    def factors(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Q, X) with Â = Q X, given Y = ΔW Ω (tests compare Â with ΔW; the stream never holds Y)."""
        to_q = self.range_map()
        return np.asarray(y, dtype=np.float64) @ to_q, self._coefficients(to_q)[0]

    def _coefficients(self, to_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """X = (Ψ Q)^+ (Ψ ΔW), and Θ Q."""
        test_q = self.test_y @ to_q
        psi_q, theta_q = test_q[: self.l], test_q[self.l :]
        if psi_q.shape[1] == 0:
            return np.zeros((0, self.n)), theta_q
        # Ψ Q (l x r, l > r, Gaussian times orthonormal: well conditioned) by its QR, then one triangular
        # solve for all n columns: level-3 BLAS, where lstsq's SVD of an l x n right-hand side was level-2
        q, r = np.linalg.qr(psi_q)
        try:
            x = np.linalg.solve(r, q.T @ self.w[: self.l])
        except np.linalg.LinAlgError:  # rank-deficient Ψ Q (not seen with Gaussian Ψ): the least-squares way
            x, *_ = np.linalg.lstsq(psi_q, self.w[: self.l], rcond=None)
        return x, theta_q

    def result(self, total: float) -> Spectrum:
        x, theta_q = self._coefficients(self.range_map())
        # σ(X) from the r x r matrix X X^T (level-3 BLAS; an SVD of the r x n X was mostly level-2): squaring
        # loses σ below ~1e-8 σ_1, which hold under 1e-16 of the energy the rank90 cut counts
        sv = np.sqrt(np.clip(np.linalg.eigvalsh(x @ x.T)[::-1], 0.0, None)) if x.size else np.zeros(0)
        residual = self.w[self.l :] - theta_q @ x
        err = math.sqrt(max(float(np.sum(residual**2)) / self.s, 0.0))
        # rank90 is given only where the bound pins it: every matrix whose σ are within ERROR_SAFETY * e of
        # the σ̂ (Mirsky) has its rank90 in [lo, hi]; hi beyond the sketch: unknown, at least lo.
        lo, hi = rank90_bounds(sv, total, ERROR_SAFETY * err)
        point = rank_at(sv**2, total)
        bounded = hi <= sv.size
        rank = point if point is not None and bounded else None
        rel = err / math.sqrt(total) if total > 0 else 0.0
        # rank999 only where the same bound pins it to one value (a ΔW of rank <= k, a merged LoRA: e ~ 0)
        lo999, hi999 = rank90_bounds(sv, total, ERROR_SAFETY * err, NEAR_ALL)
        # its lower bound: Mirsky's (lo999, weak for a dense ΔW: e is most of its norm) or the error's own
        at_least = max(lo999, tail_rank(err, total, self.k, self.l))
        return Spectrum(
            "sketch",
            tuple(float(v) for v in sv[:TOP_SINGULAR]),
            rank,
            rank if rank is not None else lo,
            self.k,
            rel,
            (lo, hi if bounded else None),
            lo999 if lo999 == hi999 and hi999 <= sv.size else None,
            lo999 if lo999 == hi999 and hi999 <= sv.size else at_least,
        )


def accumulator(m: int, n: int, single_block: bool, *, seed: int = 0, cap: int = SKETCH_CAP, device: str = "cpu"):
    """Exact (Gram) for matrices up to gram_cols wide or read in one block (SVD), else the sketch."""
    gram_cols = tuning.current().gram_cols
    if n <= gram_cols:
        return Gram(m, n)
    if single_block and min(m, n) <= gram_cols:
        return _Whole(m, n)
    return Sketch(m, n, seed=seed, cap=cap, device=device)


class _Whole(Accumulator):
    """A wide matrix read in one block: ΔW ΔW^T (m x m) gives its σ exactly."""

    def __init__(self, m: int, n: int) -> None:
        self.gram = np.zeros((m, m), dtype=np.float64)

    def block_part(self, r0: int, block: np.ndarray) -> np.ndarray:
        b = np.asarray(block, dtype=np.float64)
        return b @ b.T

    def fold(self, part: np.ndarray) -> None:
        self.gram += part

    def result(self, total: float) -> Spectrum:
        eig = np.clip(np.linalg.eigvalsh(self.gram)[::-1], 0.0, None)
        return _exact(eig, total)

"""The exact spectrum of a weight matrix W (m x n) from its row blocks: the eigenvalues of the Gram matrix
of its smaller side, accumulated in float64 while W streams, then one symmetric eigensolve.

The eigenvalues λ_i = σ_i(W)^2 are those WeightWatcher calls the ESD (its default `analyze()` takes
`sv * sv` of W without any normalisation). Two cases, by shape:

- tall (m >= n): G = WᵀW (n x n). Row blocks W[r0:r1] arrive in order; each adds W[r0:r1]ᵀ W[r0:r1] to G
  (BLAS dsyrk on a float64 copy of at most `CONVERT_BYTES` of the block at a time, upper triangle only).
  Memory: n²·8 bytes for G + the float64 copy. W is never held. Partial Grams of consecutive row ranges
  merge by `TallGram.merge` (left + right, in row order): a given split of the rows into blocks and
  partials always gives the same bytes (BLAS and the eigensolve are deterministic for a given build and
  thread count; a different split may differ in the last bits, within the bound below).
- wide (m < n): the spectrum is that of WWᵀ (m x m): WᵀW would be n x n (1.6 GB for 4096 x 14336) with
  n - m zero eigenvalues. WWᵀ pairs every row with every other, so it cannot be summed from row blocks
  seen once: the rows are held as they arrive (float32, m·n·4 bytes) and WWᵀ is formed at the end in
  float64 from column panels of W (dsyrk per panel of at most `CONVERT_BYTES`). Memory: m·n·4 + m²·8
  bytes (+ one panel): 235 MB + 134 MB for 4096 x 14336.

Accuracy. Inputs are float32 (BF16, F16 and the dequantized formats are exact in float32), so every product
w_ki·w_kj is exact in float64 and only the sums round: the computed Ĝ = G + E with
|E| <= γ_m |W|ᵀ|W| elementwise (γ_m = m·u / (1 - m·u), u = 2^-53; Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., §3.5), hence ||E||_2 <= γ_m ||W||_F². The eigensolve (LAPACK dsyevd) is
backward stable: a further p(n)·u·||G||_2. By Weyl's inequality every eigenvalue moves by at most
    |λ̂_i - λ_i| <= γ_m ||W||_F² + p(n)·u·λ_max = u·λ_max·(m·stable_rank + p(n)) (to first order),
an absolute error, relative to λ_max. A float64 SVD of W (WeightWatcher's scipy.linalg.svd) has
|σ̂_i - σ_i| <= p(m, n)·u·σ_max, i.e. |σ̂_i² - λ_i| ≈ 2·p·u·σ_i·σ_max: relative to λ_i, the Gram's error is
larger by about σ_max/σ_i. Measured, the Gram's error on its small eigenvalues is ~1e-16·λ_max (at most
9e-17·λ_max on planted matrices up to 131,072 x 256; 5e-17 on real ones): those above ~1e-10·λ_max are within
1e-6 relative, smaller ones not (AntiBERTy's at 1e-12 and 1e-13 of λ_max: 1e-5 and 3e-4 off). Negative ones
(rounding) are clipped to 0.

Refinement (`GramSpectrum.solve`). Eigenvalues below FLOOR·λ_max (1e-8: 100 times the measured error, so the
kept ones are within ~1e-8 relative) are replaced by Ritz values of W: V (n x s), the Gram's invariant
subspace of its eigenvalues below SUBSPACE·λ_max (1e-4), by inverse subspace iteration on G + δI (one
Cholesky factorisation; G is kept through the first eigensolve in its own lower triangle, which LAPACK's
UPLO='U' drivers do not touch); then σ(W·V)², W·V streamed through a TSQR (`RitzRows`), whose backward
stability gives σ to ε·σ_max as an SVD does. The leakage of the subspace's error into a Ritz value is
Σ_b (λ_b − λ)|e_b|², |e_b| ~ ε·λ_max/λ_b over the eigenvalues λ_b >= SUBSPACE·λ_max outside it: ~1e-28·λ_max
each. A tall matrix's rows are fed again (a second pass: `Refinement.add`), a wide one's held rows here. The
eigenvalues at and above the floor are the Gram's, unchanged (a matrix with none below gets the same bytes).
Extra memory, refined matrices only: V and the iteration's n x s block (2·n·s·8 bytes) and R (s²·8).

Cost: the Gram is n²·m multiply-adds for the tall case (dsyrk computes one triangle: m·n² flops, half of
the 2·m·n·min(m, n) of a full product), m²·n for the wide one; the eigensolve O(min(m, n)³).
Pure numerics: arrays in, arrays out; no I/O.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh, qr, solve_triangular, svd
from scipy.linalg.blas import dsyrk
from scipy.linalg.lapack import dpotrf

CONVERT_BYTES = 32 << 20  # float64 copy of a row block (tall) or column panel (wide) converted at a time
MIN_CONVERT = 128  # rows (tall) or columns (wide) per dsyrk call at least: rank-k updates below this run slow
# Gram eigenvalues below FLOOR·λ_max are replaced by Ritz values of W (module docstring, "Accuracy"): the Gram's
# absolute error (~1e-16·λ_max measured, bounded by ε·λ_max·(m·stable_rank + p(n))) is 1e-8 relative there
FLOOR = 1e-8
SUBSPACE = 1e-4  # ... from the Gram's invariant subspace of its eigenvalues below SUBSPACE·λ_max


def is_tall(m: int, n: int) -> bool:
    """WᵀW (n x n) is the smaller Gram: m >= n."""
    return m >= n


def estimated_bytes(m: int, n: int) -> int:
    """Peak bytes the spectrum of an m x n matrix holds (Gram + held rows + one float64 conversion buffer)."""
    if is_tall(m, n):
        block = max(MIN_CONVERT, min(m, CONVERT_BYTES // (8 * n))) if n else 0
        return n * n * 8 + block * n * 8
    panel = max(MIN_CONVERT, min(n, CONVERT_BYTES // (8 * m))) if m else 0
    return m * n * 4 + m * m * 8 + m * panel * 8


def _steps(total: int, per_step: int) -> range:
    return range(0, total, max(1, per_step))


class TallGram:
    """WᵀW of rows [r0, r1) of an m x n matrix (m >= n), summed in float64 from row blocks in order."""

    def __init__(self, n: int, r0: int = 0) -> None:
        self.n = n
        self.r0 = r0
        self.r1 = r0
        # Fortran order: dsyrk updates it in place (its upper triangle; the lower one is filled at the end)
        self._g = np.zeros((n, n), dtype=np.float64, order="F")

    @property
    def rows(self) -> tuple[int, int]:
        return self.r0, self.r1

    def add(self, r0: int, block: np.ndarray) -> None:
        """Rows [r0, r0 + len(block)) of W (any float dtype, n columns); r0 must be where the last block ended."""
        if r0 != self.r1:
            raise ValueError(f"row block starts at {r0}, expected {self.r1} (blocks arrive in order)")
        if block.ndim != 2 or block.shape[1] != self.n:
            raise ValueError(f"row block of shape {block.shape}, expected (rows, {self.n})")
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.n)))
        for s in _steps(block.shape[0], step):
            part = np.ascontiguousarray(block[s : s + step], dtype=np.float64)
            # part.T is a Fortran-ordered n x k view (no copy): C <- part.T @ part + C, upper triangle
            out = dsyrk(1.0, part.T, beta=1.0, c=self._g, trans=0, lower=0, overwrite_c=1)
            if out is not self._g:  # f2py copies when c is not usable in place: keep the result all the same
                self._g = out
        self.r1 += block.shape[0]

    def merge(self, right: TallGram) -> TallGram:
        """The Gram of this row range followed by `right`'s (which must start where this one ends)."""
        if right.r0 != self.r1 or right.n != self.n:
            raise ValueError(f"cannot merge rows {right.rows} after {self.rows} (n {right.n} vs {self.n})")
        merged = TallGram(self.n, self.r0)
        np.add(self._g, right._g, out=merged._g)  # elementwise: the order of the two operands is fixed
        merged.r1 = right.r1
        return merged

    def gram(self) -> np.ndarray:
        """The full symmetric WᵀW (a copy)."""
        return _symmetric(self._g.copy(order="F"))

    def eigenvalues(self) -> np.ndarray:
        return gram_eigenvalues(self._g.copy(order="F"))


class WideRows:
    """The rows of an m x n matrix (m < n) held as float32 as they arrive; WWᵀ (m x m) formed at the end."""

    def __init__(self, m: int, n: int) -> None:
        self.m = m
        self.n = n
        self.r1 = 0
        self._w = np.empty((m, n), dtype=np.float32)

    def add(self, r0: int, block: np.ndarray) -> None:
        if r0 != self.r1:
            raise ValueError(f"row block starts at {r0}, expected {self.r1} (blocks arrive in order)")
        if block.ndim != 2 or block.shape[1] != self.n or r0 + block.shape[0] > self.m:
            raise ValueError(f"row block of shape {block.shape} at row {r0} does not fit {self.m} x {self.n}")
        self._w[r0 : r0 + block.shape[0]] = block  # float32: exact for the values the engine decodes
        self.r1 += block.shape[0]

    def gram_upper(self) -> np.ndarray:
        """WWᵀ in float64, upper triangle only (Fortran order), summed over column panels in column order."""
        if self.r1 != self.m:
            raise ValueError(f"{self.r1} of {self.m} rows received")
        g = np.zeros((self.m, self.m), dtype=np.float64, order="F")
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.m)))
        for c0 in _steps(self.n, step):
            panel = np.asfortranarray(self._w[:, c0 : c0 + step], dtype=np.float64)  # m x p, Fortran order
            out = dsyrk(1.0, panel, beta=1.0, c=g, trans=0, lower=0, overwrite_c=1)  # g += panel @ panel.T
            if out is not g:
                g = out
        return g

    def gram(self) -> np.ndarray:
        return _symmetric(self.gram_upper())

    def eigenvalues(self) -> np.ndarray:
        return gram_eigenvalues(self.gram_upper())

    def feed_columns(self, refinement: Refinement) -> None:
        """Feed the held rows to a refinement of WWᵀ as the rows of Wᵀ (column panels of W, transposed)."""
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.m)))
        for c0 in _steps(self.n, step):
            refinement.add(c0, self._w[:, c0 : c0 + step].T)


class GramSpectrum:
    """The eigenvalues of the smaller Gram of an m x n matrix, from its row blocks in order."""

    def __init__(self, m: int, n: int) -> None:
        self.m = m
        self.n = n
        self._acc: TallGram | WideRows = TallGram(n) if is_tall(m, n) else WideRows(m, n)

    @property
    def tall(self) -> bool:
        return isinstance(self._acc, TallGram)

    def add(self, r0: int, block: np.ndarray) -> None:
        self._acc.add(r0, block)

    def eigenvalues(self) -> np.ndarray:
        """min(m, n) eigenvalues of WᵀW (tall) or WWᵀ (wide), float64, clipped at 0, ascending: the Gram's alone
        (no refinement below FLOOR: see `solve`)."""
        return gram_eigenvalues(self.gram_upper())

    def gram_upper(self) -> np.ndarray:
        """The Gram's upper triangle (float64, Fortran order) once every row arrived: for a tall matrix the
        accumulator itself, no copy (`gram_eigenvalues` overwrites it: call one or the other, once), for a wide
        one formed now from the held rows."""
        received = self._acc.r1
        if received != self.m:
            raise ValueError(f"{received} of {self.m} rows received")
        return self._acc._g if isinstance(self._acc, TallGram) else self._acc.gram_upper()

    def solve(self) -> np.ndarray | Refinement | None:
        """Once every row arrived: the eigenvalues (as `eigenvalues`, the ones below FLOOR·λ_max replaced by
        Ritz values of W, module docstring), or None when a value was not finite. A wide matrix's rows are held,
        so its refinement is done here; a tall one's needs its rows again: a `Refinement` is returned, to be fed
        the same rows in the same order (`add`) before its `eigenvalues()`. Call once."""
        g = self.gram_upper()
        if not np.isfinite(g).all():
            return None
        _mirror_upper(g)  # the eigensolve overwrites the upper triangle only: keep G in the lower one
        diagonal = g.diagonal().copy()
        values = gram_eigenvalues(g)
        count = needs_refinement(values)
        if not count:
            return values
        _restore_from_lower(g, diagonal)
        refinement = Refinement(values, small_subspace(g, values), count)
        if isinstance(self._acc, WideRows):
            self._acc.feed_columns(refinement)
            return refinement.eigenvalues()
        return refinement


def needs_refinement(values: np.ndarray) -> int:
    """How many of a Gram's eigenvalues (ascending) lie below FLOOR·λ_max (0: none, or a zero matrix)."""
    if not values.size or not values[-1] > 0:
        return 0
    return int(np.count_nonzero(values < FLOOR * values[-1]))


def _mirror_upper(g: np.ndarray, step: int = 512) -> None:
    """Copy the strict upper triangle of a Fortran-ordered square matrix onto its strict lower one, in place
    (by blocks of rows: no n²-sized index arrays)."""
    n = g.shape[0]
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        g[r0:r1, :r0] = g[:r0, r0:r1].T
        block = g[r0:r1, r0:r1]
        lower = np.tril_indices(r1 - r0, -1)
        block[lower] = block.T[lower]


def _restore_from_lower(g: np.ndarray, diagonal: np.ndarray, step: int = 512) -> None:
    """Undo an eigensolve's overwriting of the upper triangle: the full symmetric G from its strict lower
    triangle (left intact by LAPACK's UPLO='U' drivers) and its saved diagonal."""
    n = g.shape[0]
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        g[:c0, c0:c1] = g[c0:c1, :c0].T
        block = g[c0:c1, c0:c1]
        upper = np.triu_indices(c1 - c0, 1)
        block[upper] = block.T[upper]
    np.fill_diagonal(g, diagonal)


def small_subspace(g: np.ndarray, values: np.ndarray, iterations: int = 8) -> np.ndarray:
    """An orthonormal basis (n x s) of the invariant subspace of the symmetric Gram `g` (full, not kept) for its
    s eigenvalues below SUBSPACE·λ_max (`values`: its eigenvalues, ascending): inverse subspace iteration with
    (G + δI)⁻¹, δ = FLOOR·λ_max, through one Cholesky factorisation (n³/3 flops, level 3) and 2 triangular
    solves with s columns per iteration. For an eigenvalue below FLOOR·λ_max the component of its iterate along
    an eigenvector outside the subspace (eigenvalue >= SUBSPACE·λ_max) shrinks by (λ + δ)/(λ_b + δ) <= 2e-4 per
    iteration: after 8, far below the Gram's own rounding, which then bounds it (module docstring)."""
    n = g.shape[0]
    lam_max = float(values[-1])
    s = max(1, int(np.count_nonzero(values < SUBSPACE * lam_max)))
    delta = FLOOR * lam_max
    diagonal = g.diagonal().copy()
    for _ in range(8):  # a shift too small for rounding (G's eigenvalues can be ~ -ε·λ_max): raise it
        np.fill_diagonal(g, diagonal + delta)
        # upper triangle only (clean=0): the lower one keeps G for a retry; the solves read the upper one
        factor, info = dpotrf(g, lower=0, clean=0, overwrite_a=1)
        if info == 0:
            break
        _restore_from_lower(g, diagonal)
        delta *= 100.0
    else:  # pragma: no cover - a symmetric matrix shifted by ~λ_max is positive definite
        raise ArithmeticError("no Cholesky factorisation of the shifted Gram")
    x = np.random.default_rng(0).standard_normal((n, s))  # fixed seed: the same bytes every run
    for _ in range(iterations):
        x = solve_triangular(factor, x, trans="T", check_finite=False)  # R R^T... R^T y = x, then R z = y
        x = solve_triangular(factor, x, check_finite=False)
        x = qr(x, mode="economic", check_finite=False)[0]
    return x


class RitzRows:
    """The singular values of Y = W V (W's rows arriving in blocks, V an n x s orthonormal basis), from a
    streamed QR of Y (TSQR): R (s x s) = the R of [R; block·V] for each block. Householder QR is backward stable
    (errors ~ε·||Y|| per block), so σ(R) are Y's to ε·σ_max(Y): no squaring."""

    def __init__(self, basis: np.ndarray) -> None:
        self.basis = np.asarray(basis, dtype=np.float64)
        self.n, self.s = self.basis.shape
        self.rows = 0
        self._r = np.zeros((0, self.s), dtype=np.float64)

    def add(self, block: np.ndarray) -> None:
        if block.ndim != 2 or block.shape[1] != self.n:
            raise ValueError(f"row block of shape {block.shape}, expected (rows, {self.n})")
        step = max(MIN_CONVERT, CONVERT_BYTES // (8 * max(1, self.n, self.s)))
        for r0 in range(0, block.shape[0], step):
            y = np.asarray(block[r0 : r0 + step], dtype=np.float64) @ self.basis
            self._r = qr(np.vstack([self._r, y]), mode="r", check_finite=False)[0][: self.s]
        self.rows += block.shape[0]

    def values(self) -> np.ndarray:
        """σ(Y)² ascending (s of them; fewer rows than s: zeros for the missing ones)."""
        sv = svd(self._r, compute_uv=False, check_finite=False) if self._r.size else np.zeros(0)
        out = np.zeros(self.s)
        out[: sv.size] = np.sort(sv**2)[::-1][: self.s]
        return np.sort(out)


class Refinement:
    """A Gram's eigenvalues whose `count` smallest (below FLOOR·λ_max) are replaced by Ritz values of W on the
    Gram's small subspace: σ(W V)², V from `small_subspace`, Y = W V streamed through `RitzRows`. For a tall
    matrix the caller feeds W's rows again (`add`, in order, as the Gram got them); a wide one's held rows
    are fed by WideRows.feed_columns."""

    def __init__(self, values: np.ndarray, basis: np.ndarray, count: int) -> None:
        self.gram_values = values
        self.count = count
        self.ritz = RitzRows(basis)
        self.r1 = 0

    def add(self, r0: int, block: np.ndarray) -> None:
        if r0 != self.r1:
            raise ValueError(f"row block starts at {r0}, expected {self.r1} (blocks arrive in order)")
        self.ritz.add(block)
        self.r1 += block.shape[0]

    def eigenvalues(self) -> np.ndarray:
        """The Gram's eigenvalues from FLOOR·λ_max up, unchanged, and the `count` smallest Ritz values below."""
        ritz = self.ritz.values()
        out = self.gram_values.copy()
        out[: self.count] = ritz[: self.count]
        return np.sort(out)


def _symmetric(upper: np.ndarray) -> np.ndarray:
    """Copy the upper triangle onto the lower one (in place) and return the matrix."""
    lower = np.tril_indices(upper.shape[0], -1)
    upper[lower] = upper.T[lower]
    return upper


def gram_eigenvalues(g: np.ndarray) -> np.ndarray:
    """Eigenvalues of a symmetric Gram matrix whose upper triangle is set (overwritten: pass a copy to keep it),
    clipped at 0 (rounding can push a zero eigenvalue below it), ascending."""
    if not g.size:
        return np.zeros(0, dtype=np.float64)
    values = eigh(g, lower=False, eigvals_only=True, overwrite_a=True, check_finite=False, driver="evd")
    return np.sort(np.clip(values, 0.0, None))


def matrix_eigenvalues(w: np.ndarray, block_rows: int = 1024) -> np.ndarray:
    """The spectrum of an in-memory matrix through the same row-block path, refinement included (tests,
    benchmarks); a non-finite matrix raises ValueError."""
    m, n = w.shape
    acc = GramSpectrum(m, n)
    for r0 in range(0, m, block_rows):
        acc.add(r0, w[r0 : r0 + block_rows])
    result = acc.solve()
    if result is None:
        raise ValueError("values that are not finite")
    if isinstance(result, Refinement):
        for r0 in range(0, m, block_rows):  # the second pass: the same rows again
            result.add(r0, w[r0 : r0 + block_rows])
        return result.eigenvalues()
    return result

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
larger by about σ_max/σ_i. The bound is a worst case (rounding errors of a sum of m terms grow like √m, not
m, in practice): against WeightWatcher's float64 SVD on the 92 matrices of MiniLM and AntiBERTy
(tests/test_spectrum_numerics.py), every eigenvalue above 1e-6·λ_max is within 5e-11 relative and every one
above 1e-10·λ_max within 1e-6; below that the absolute floor (~1e-16·λ_max: AntiBERTy's two eigenvalues at
1e-12 and 1e-13 of λ_max are 1e-5 and 3e-4 off, relative) decides. Negative ones (rounding) are clipped to 0.

Cost: the Gram is n²·m multiply-adds for the tall case (dsyrk computes one triangle: m·n² flops, half of
the 2·m·n·min(m, n) of a full product), m²·n for the wide one; the eigensolve O(min(m, n)³).
Pure numerics: arrays in, arrays out; no I/O.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import eigh
from scipy.linalg.blas import dsyrk

CONVERT_BYTES = 32 << 20  # float64 copy of a row block (tall) or column panel (wide) converted at a time
MIN_CONVERT = 128  # rows (tall) or columns (wide) per dsyrk call at least: rank-k updates below this run slow


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
        """min(m, n) eigenvalues of WᵀW (tall) or WWᵀ (wide), float64, clipped at 0, ascending."""
        return gram_eigenvalues(self.gram_upper())

    def gram_upper(self) -> np.ndarray:
        """The Gram's upper triangle (float64, Fortran order) once every row arrived: for a tall matrix the
        accumulator itself, no copy (`gram_eigenvalues` overwrites it: call one or the other, once), for a wide
        one formed now from the held rows."""
        received = self._acc.r1
        if received != self.m:
            raise ValueError(f"{received} of {self.m} rows received")
        return self._acc._g if isinstance(self._acc, TallGram) else self._acc.gram_upper()


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
    """The spectrum of an in-memory matrix through the same row-block path (tests, benchmarks)."""
    m, n = w.shape
    acc = GramSpectrum(m, n)
    for r0 in range(0, m, block_rows):
        acc.add(r0, w[r0 : r0 + block_rows])
    return acc.eigenvalues()

"""FARMS' pooled spectrum of a weight matrix from its row blocks: the eigenvalues of fixed-aspect-ratio windows.

Y. Hu, K. Goel, V. Killiakov, Y. Yang, "Eigenspectrum Analysis of Neural Networks without Aspect Ratio Bias"
(ICML 2025) measure the heavy tail of the average ESD of submatrices of one fixed aspect ratio instead of the
ESD of W itself, whose shape depends on W's aspect ratio. The windows follow `fixed_sampling` of their
released code (github.com/HUST-AI-HYZ/FARMS, LLM_Pruning/lib/sampling.py), with the settings of their LLM
pruning runs (scripts/llm_pruning_main.txt: 2000 rows, Q_ratio 1, 15 sampling operations per dimension):

    rows' = min(window, m, n),  cols' = int(rows' * q)
    row_step = max(1, (m - rows') // (per_dim - 1)),  row windows = min(per_dim, max(1, (m - rows') // row_step + 1))
    (columns alike), window (i, j) = W[min(i·row_step, m - rows') :+rows', min(j·col_step, n - cols') :+cols']

and the pooled ESD is every window's σ², concatenated and sorted (all windows have the same size, so this is
the average of their ESDs). W is taken as stored (rows = output features, as torch's nn.Linear.weight).

Streamed: a window's eigenvalues need only its own rows, so the rows of the windows not yet complete are
held (float32, at most rows' x n: 2000 x 14336 x 4 = 115 MB) and each row window is solved when its last
row arrives: for each column window, the float64 Gram of the cols' x cols' (or rows' x rows') submatrix and
its eigenvalues. Cost: every window costs a Gram (2·rows'·cols'·min(rows', cols') flops) and an eigensolve
(O(min(rows', cols')³)); up to per_dim² = 225 windows of 2000 x 2000 for a large matrix, far more than W's own
spectrum: it is opt-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg.blas import dsyrk

from .gram import gram_eigenvalues

WINDOW = 2000  # FARMS' LLM runs: num_row_samples 2000
PER_DIM = 15  # sampling_ops_per_dim
ASPECT = 1.0  # Q_ratio: square windows


@dataclass(frozen=True)
class WindowPlan:
    """Where FARMS' windows lie in an m x n matrix."""

    rows: int  # rows' (window height)
    cols: int  # cols' (window width)
    row_starts: tuple[int, ...]
    col_starts: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.row_starts) * len(self.col_starts)


def _starts(size: int, window: int, per_dim: int) -> tuple[int, ...]:
    step = max(1, (size - window) // max(1, per_dim - 1))
    count = min(per_dim, max(1, (size - window) // step + 1))
    return tuple(min(i * step, size - window) for i in range(count))


def window_plan(m: int, n: int, window: int = WINDOW, per_dim: int = PER_DIM, aspect: float = ASPECT) -> WindowPlan:
    """FARMS' `fixed_sampling` windows of an m x n matrix (see the module docstring)."""
    rows = min(window, m, n)
    cols = int(rows * aspect)
    if rows < 1 or cols < 1 or cols > n:
        raise ValueError(f"no {rows} x {cols} window fits a {m} x {n} matrix")
    return WindowPlan(rows, cols, _starts(m, rows, per_dim), _starts(n, cols, per_dim))


class _Rows:
    """Consecutive rows [r0, r1) of a matrix, float32, in a buffer that drops the first ones and grows as needed."""

    def __init__(self, n: int, capacity: int) -> None:
        self._buf = np.empty((max(1, capacity), n), dtype=np.float32)
        self.r0 = 0
        self._len = 0

    @property
    def r1(self) -> int:
        return self.r0 + self._len

    def drop_before(self, row: int) -> None:
        k = min(self._len, max(0, row - self.r0))
        self._buf[: self._len - k] = self._buf[k : self._len]
        self._len -= k
        self.r0 = max(self.r0, row) if self._len == 0 else self.r0 + k

    def append(self, r0: int, rows: np.ndarray) -> None:
        if self._len and r0 != self.r1:
            raise ValueError(f"rows start at {r0}, expected {self.r1}")
        if not self._len:
            self.r0 = r0
        need = self._len + rows.shape[0]
        if need > self._buf.shape[0]:
            grown = np.empty((max(need, 2 * self._buf.shape[0]), self._buf.shape[1]), dtype=np.float32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : need] = rows
        self._len = need

    def view(self, r0: int, r1: int) -> np.ndarray:
        return self._buf[r0 - self.r0 : r1 - self.r0]


class FarmsWindows:
    """The pooled eigenvalues of FARMS' windows of an m x n matrix, from its row blocks in order."""

    def __init__(self, m: int, n: int, plan: WindowPlan | None = None) -> None:
        self.m = m
        self.n = n
        self.plan = plan or window_plan(m, n)
        self.r1 = 0
        self._rows = _Rows(n, self.plan.rows)  # the rows of the row windows not solved yet
        self._next = 0  # the first row window not solved yet
        self._pooled: list[np.ndarray] = []

    def _needed_from(self) -> int:
        starts = self.plan.row_starts
        return starts[self._next] if self._next < len(starts) else self.m

    def add(self, r0: int, block: np.ndarray) -> None:
        if r0 != self.r1:
            raise ValueError(f"row block starts at {r0}, expected {self.r1} (blocks arrive in order)")
        if block.ndim != 2 or block.shape[1] != self.n:
            raise ValueError(f"row block of shape {block.shape}, expected (rows, {self.n})")
        self.r1 += block.shape[0]
        lo = max(r0, self._needed_from())  # rows before the next window are never needed again
        if lo < self.r1:
            self._rows.append(lo, block[lo - r0 :])
        starts = self.plan.row_starts
        while self._next < len(starts) and starts[self._next] + self.plan.rows <= self.r1:
            self._solve(starts[self._next])
            self._next += 1
            self._rows.drop_before(self._needed_from())

    def _solve(self, row_start: int) -> None:
        rows, cols = self.plan.rows, self.plan.cols
        band = self._rows.view(row_start, row_start + rows)
        for c0 in self.plan.col_starts:
            if rows >= cols:  # the smaller Gram: subᵀ sub (cols x cols) from the C-ordered copy's transpose
                sub = np.ascontiguousarray(band[:, c0 : c0 + cols], dtype=np.float64)
                g = dsyrk(1.0, sub.T, trans=0, lower=0)
            else:  # sub subᵀ (rows x rows)
                sub = np.asfortranarray(band[:, c0 : c0 + cols], dtype=np.float64)
                g = dsyrk(1.0, sub, trans=0, lower=0)
            self._pooled.append(gram_eigenvalues(np.asfortranarray(g)))

    def eigenvalues(self) -> np.ndarray:
        """Every window's eigenvalues, pooled and sorted ascending."""
        if self.r1 != self.m:
            raise ValueError(f"{self.r1} of {self.m} rows received")
        return np.sort(np.concatenate(self._pooled)) if self._pooled else np.zeros(0)


def farms_eigenvalues(w: np.ndarray, plan: WindowPlan | None = None, block_rows: int = 1024) -> np.ndarray:
    """FARMS' pooled eigenvalues of an in-memory matrix through the row-block path (tests, benchmarks)."""
    m, n = w.shape
    acc = FarmsWindows(m, n, plan)
    for r0 in range(0, m, block_rows):
        acc.add(r0, w[r0 : r0 + block_rows])
    return acc.eigenvalues()

"""1-D tensors (norm weights, biases, any other vector) summarised piece by piece.

A vector's record needs its count, mean, standard deviation, L2 norm, minimum and maximum. They are
additive once kept as (count, sum, squared deviations from the piece's mean, sum of squares, min, max):
pieces merge with Chan, Golub and LeVeque's pairwise update of the squared deviations ("Updating
formulae and a pairwise algorithm for computing sample variances", 1979), so a vector of any length is
read in chunks like a matrix. A vector read in one piece gets exactly numpy's mean, std and dot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..codes import code_values
from ..source.plan import STORAGE_NUMPY

_LOOKED_UP = ("BF16", "F8_E4M3", "F8_E5M2")  # stored as integer codes: their values come from a table


def values_of(raw: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values of a vector's stored bytes (whole elements)."""
    stored = raw.view(STORAGE_NUMPY[dtype])
    if dtype in _LOOKED_UP:
        return code_values(dtype)[stored]
    return stored.astype(np.float64)


@dataclass(frozen=True)
class VectorSummary:
    numel: int  # elements, finite or not
    n: int  # finite elements
    total: float  # sum of the finite values
    m2: float  # sum of squared deviations from their mean
    sumsq: float  # sum of squares (the L2 norm's)
    vmin: float | None
    vmax: float | None

    @classmethod
    def of(cls, values: np.ndarray, offset: float = 0.0) -> VectorSummary:
        """Summary of float64 `values` (+ `offset`, added to the finite ones: Gemma stores gamma - 1)."""
        finite = np.isfinite(values)
        v = values[finite]
        if offset:
            v = v + offset
        if not v.size:
            return cls(int(values.size), 0, 0.0, 0.0, 0.0, None, None)
        with np.errstate(over="ignore", invalid="ignore"):  # near float64's limit: Inf, stored as null later
            mean = float(v.mean())
            deviations = v - mean
            m2 = float((deviations * deviations).sum())  # as np.std sums them
            sumsq = float(np.dot(v, v))
            total = float(v.sum())
        return cls(int(values.size), int(v.size), total, m2, sumsq, float(v.min()), float(v.max()))

    def merge(self, other: VectorSummary) -> VectorSummary:
        """The summary of this piece followed by `other`."""
        if not other.n:
            return VectorSummary(self.numel + other.numel, *_fields(self))
        if not self.n:
            return VectorSummary(self.numel + other.numel, *_fields(other))
        # Both have finite values, so both have a min and a max.
        assert self.vmin is not None and self.vmax is not None and other.vmin is not None and other.vmax is not None
        n = self.n + other.n
        with np.errstate(over="ignore", invalid="ignore"):
            delta = other.total / other.n - self.total / self.n
            m2 = self.m2 + other.m2 + delta * delta * self.n * other.n / n
        return VectorSummary(
            self.numel + other.numel,
            n,
            self.total + other.total,
            float(m2),
            self.sumsq + other.sumsq,
            min(self.vmin, other.vmin),
            max(self.vmax, other.vmax),
        )

    @property
    def mean(self) -> float | None:
        return self.total / self.n if self.n else None

    @property
    def std(self) -> float | None:
        return math.sqrt(self.m2 / self.n) if self.n else None

    @property
    def l2(self) -> float:
        return math.sqrt(self.sumsq) if self.n else float("nan")


SUMMARY_ELEMENTS = 1 << 18  # values decoded at a time: 2 MB of float64 and a few temporaries, per worker


def summarize_vector(raw: np.ndarray, dtype: str, offset: float = 0.0) -> VectorSummary:
    """The summary of a piece of a vector's stored bytes, decoded SUMMARY_ELEMENTS values at a time."""
    step = SUMMARY_ELEMENTS * STORAGE_NUMPY[dtype].itemsize
    summary: VectorSummary | None = None
    for lo in range(0, max(raw.size, 1), step):
        part = VectorSummary.of(values_of(raw[lo : lo + step], dtype), offset)
        summary = part if summary is None else summary.merge(part)
    assert summary is not None
    return summary


def _fields(s: VectorSummary) -> tuple[int, float, float, float, float | None, float | None]:
    return s.n, s.total, s.m2, s.sumsq, s.vmin, s.vmax

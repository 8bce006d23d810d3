"""Statistics of one matrix, computed from its `Reduction` alone (no second look at the data).

For 16-bit and 8-bit dtypes every number here is exact (up to float64 rounding). For F32 the
moments and max |w| are exact; quantiles, mean |w| and the exact-protocol points use bucket
midpoints (relative error below 2^-8); values below 1e-40 (bucket 0) count as zeros.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .codes import HIST_BINS, code_bins, code_values
from .fit import WeibullFit, fit_exact, fit_hist1024
from .reduce import Reduction, finite_mask


@dataclass(frozen=True)
class MagnitudeDistribution:
    """Distinct finite |w| values (ascending, zero included when present) and their counts."""

    values: np.ndarray
    counts: np.ndarray

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def nonzero(self) -> MagnitudeDistribution:
        keep = self.values > 0
        return MagnitudeDistribution(self.values[keep], self.counts[keep])

    def quantile(self, q: float) -> float:
        """Inverted-CDF quantile: the smallest value v with ECDF(v) >= q."""
        if self.total == 0:
            return float("nan")
        cum = np.cumsum(self.counts)
        idx = int(np.searchsorted(cum, q * cum[-1] - 1e-9 * cum[-1], side="left"))
        return float(self.values[min(idx, self.values.size - 1)])


def magnitudes(red: Reduction) -> MagnitudeDistribution:
    """Fold the sign of finite codes into a distribution of |w|."""
    half = red.counts.size // 2
    folded = red.counts[:half] + red.counts[half:]
    values = np.abs(code_values(red.dtype)[:half])
    finite = finite_mask(red.dtype)[:half]
    if not red.exact:
        values = values.copy()
        values[0] = 0.0  # F32 bucket 0 holds zero and subnormals below 1e-40
    keep = finite & (folded > 0)
    order = np.argsort(values[keep], kind="stable")
    return MagnitudeDistribution(values[keep][order], folded[keep][order])


def cohort_histogram(red: Reduction) -> np.ndarray:
    """The 1024-bin log10|w| histogram of the cohort protocol (exact)."""
    if red.hist1024 is not None:
        return red.hist1024
    bins = code_bins(red.dtype)
    inside = (bins >= 0) & (bins < HIST_BINS)
    return np.bincount(bins[inside], weights=red.counts[inside], minlength=HIST_BINS).astype(np.int64)


def fit(red: Reduction, protocol: str, trim: str) -> WeibullFit:
    if protocol == "hist1024":
        return fit_hist1024(cohort_histogram(red), trim)
    if protocol == "exact":
        dist = magnitudes(red).nonzero()
        return fit_exact(dist.values, dist.counts, trim)
    raise ValueError(f"unknown protocol {protocol!r}")


@dataclass(frozen=True)
class MatrixStats:
    numel: int
    n_finite: int
    n_nan: int
    n_inf: int
    zero_fraction: float  # exact zeros among finite values
    mean: float
    std: float  # population standard deviation of w
    excess_kurtosis: float
    mean_abs: float
    std_abs: float  # population standard deviation of |w| (for the Gamma closure)
    max_abs: float
    q99_abs: float
    max_over_q99: float

    def to_json(self) -> dict[str, object]:
        return {k: _clean(v) for k, v in asdict(self).items()}


def _clean(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _moments(red: Reduction, n: int) -> tuple[float, float, float]:
    """Mean, population std and excess kurtosis of the finite values."""
    if n == 0:
        return (float("nan"),) * 3
    if red.power_sums is not None:
        s1, s2, s3, s4 = (float(s) / n for s in red.power_sums)
        mean_d = s1
        m2 = s2 - mean_d**2
        m4 = s4 - 4 * mean_d * s3 + 6 * mean_d**2 * s2 - 3 * mean_d**4
        mean = red.shift + mean_d
    else:
        finite = finite_mask(red.dtype)
        values, counts = code_values(red.dtype)[finite], red.counts[finite].astype(np.float64)
        mean = float(np.dot(counts, values) / n)
        dev = values - mean
        m2 = float(np.dot(counts, dev * dev) / n)
        m4 = float(np.dot(counts, dev**4) / n)
    m2 = max(m2, 0.0)
    kurt = m4 / (m2 * m2) - 3.0 if m2 > 0 else float("nan")
    return mean, math.sqrt(m2), kurt


def matrix_stats(red: Reduction) -> MatrixStats:
    finite = finite_mask(red.dtype)
    n_finite = int(red.counts[finite].sum())
    nonfinite_values = code_values(red.dtype)[~finite]
    nonfinite_counts = red.counts[~finite]
    n_inf = red.n_inf if red.n_inf is not None else int(nonfinite_counts[np.isinf(nonfinite_values)].sum())
    n_nan = red.numel - n_finite - n_inf
    dist = magnitudes(red)
    n_zero = int(dist.counts[dist.values == 0].sum())
    mean, std, kurt = _moments(red, n_finite)
    if n_finite:
        mean_abs = float(np.dot(dist.counts, dist.values) / n_finite)
        # E[w^2] exactly from the moments, E|w| from the distribution.
        std_abs = math.sqrt(max(std**2 + mean**2 - mean_abs**2, 0.0))
    else:
        mean_abs = std_abs = float("nan")
    q99 = dist.quantile(0.99)
    ratio = red.max_abs / q99 if q99 > 0 else float("nan")
    return MatrixStats(
        numel=red.numel,
        n_finite=n_finite,
        n_nan=n_nan,
        n_inf=n_inf,
        zero_fraction=n_zero / n_finite if n_finite else float("nan"),
        mean=mean,
        std=std,
        excess_kurtosis=kurt,
        mean_abs=mean_abs,
        std_abs=std_abs,
        max_abs=red.max_abs,
        q99_abs=q99,
        max_over_q99=ratio,
    )

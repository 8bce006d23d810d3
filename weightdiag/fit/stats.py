"""Statistics of one matrix, computed from its `Reduction` alone (no second look at the data).

For 16-bit and 8-bit dtypes every number here is exact (up to float64 rounding). For F32 the
moments of w and |w| (mean, std, kurtosis, mean |w|, std |w|) and max |w| are exact; quantiles and
the exact-protocol points use bucket midpoints (relative error below 2^-8); values below 1e-40
(bucket 0) count as zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cache, cached_property

import numpy as np

from ..codes import HIST_BINS, code_bins, code_values, cohort_bins
from ..reduce.reduction import Reduction, finite_mask
from .weibull import Hist1024Plot, WeibullFit, fit_exact


@dataclass(frozen=True)
class MagnitudeDistribution:
    """Distinct finite |w| values (ascending, zero included when present) and their counts."""

    values: np.ndarray
    counts: np.ndarray

    @cached_property
    def total(self) -> int:
        return int(self.counts.sum())

    @cached_property
    def _cumulative(self) -> np.ndarray:
        return np.cumsum(self.counts)

    def nonzero(self) -> MagnitudeDistribution:
        if not self.values.size or self.values[0] > 0:  # ascending: only the first value can be zero
            return self
        return MagnitudeDistribution(self.values[1:], self.counts[1:])

    def quantile(self, q: float) -> float:
        """Inverted-CDF quantile: the smallest value v with ECDF(v) >= q."""
        if self.total == 0:
            return float("nan")
        cum = self._cumulative
        idx = int(np.searchsorted(cum, q * cum[-1] - 1e-9 * cum[-1], side="left"))
        return float(self.values[min(idx, self.values.size - 1)])


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
    distinct_values: int  # occupied codes: exact for 16/8-bit dtypes, 2^-7-wide buckets for F32

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # flat: asdict's deep copy costs more


class Summary:
    """Everything derived from one reduction, each piece computed at most once.

    With `center`, the fits are of |w - mean(w)| (the text of the Weibull paper's App. A.1) instead
    of |w| (its library, npm-weibull-py 0.4.0, and so the cohort). The counts hold the whole
    distribution of w, so the centred one comes from the same reduction: exact for 16- and 8-bit
    dtypes; for F32 from bucket midpoints (relative error below 2^-8 of |w|).
    """

    def __init__(self, red: Reduction, center: bool = False) -> None:
        self.red = red
        self.center = center

    @cached_property
    def _used(self) -> np.ndarray:
        """Signed codes that are finite and occur (usually a few thousand of the 65,536)."""
        return np.flatnonzero(finite_mask(self.red.dtype) & (self.red.counts > 0))

    @cached_property
    def _folded(self) -> tuple[np.ndarray, np.ndarray]:
        """(magnitude codes that occur, ascending; their counts, both signs together).

        Every dtype here is sign-magnitude: code c and c + half hold x and -x, and |x| grows
        with the magnitude code over the finite codes, so folding the halves gives the sorted,
        distinct |w| without a sort.
        """
        counts = self.red.counts
        half = counts.size // 2
        finite = finite_mask(self.red.dtype)[:half]
        magnitude_counts = counts[:half] + counts[half:]
        used = np.flatnonzero(finite & (magnitude_counts > 0))
        return used, magnitude_counts[used]

    @cached_property
    def magnitudes(self) -> MagnitudeDistribution:
        """Fold the sign of the finite codes into a distribution of |w|."""
        used, counts = self._folded
        values = code_values(self.red.dtype)[used]
        if not self.red.exact and used.size and used[0] == 0:
            values = values.copy()
            values[0] = 0.0  # F32 bucket 0: zero and subnormals below 1e-40
        return MagnitudeDistribution(values, counts)

    @cached_property
    def histogram(self) -> np.ndarray:
        """The 1024-bin log10|w| histogram of the cohort protocol (exact)."""
        red = self.red
        if red.hist1024 is not None:
            return red.hist1024
        used, counts = self._folded
        bins = code_bins(red.dtype)[used]  # a code's bin depends on |x| only
        inside = (bins >= 0) & (bins < HIST_BINS)
        return np.bincount(bins[inside], weights=counts[inside], minlength=HIST_BINS).astype(np.int64)

    @cached_property
    def _centered(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct |w - mean| (ascending, float64) and their counts."""
        red = self.red
        values = code_values(red.dtype)[self._used]
        if not red.exact:
            values = np.where((self._used & 0x7FFF) == 0, 0.0, values)  # F32 bucket 0 holds zeros
        mean = self.stats.mean
        deviations = np.abs(values - mean)
        order = np.argsort(deviations, kind="stable")
        deviations, counts = deviations[order], red.counts[self._used][order]
        distinct, first = np.unique(deviations, return_index=True)  # w = mean +- x fold together
        return distinct, np.add.reduceat(counts, first) if counts.size else counts

    @cached_property
    def _plot(self) -> Hist1024Plot:
        if not self.center:
            return Hist1024Plot(self.histogram)
        deviations, counts = self._centered
        bins = cohort_bins(deviations.astype(np.float32))  # the cohort rule on float32 |w - mean|
        inside = (bins >= 0) & (bins < HIST_BINS)
        return Hist1024Plot(np.bincount(bins[inside], weights=counts[inside], minlength=HIST_BINS))

    def fit(self, protocol: str, trim: str) -> WeibullFit:
        if protocol == "hist1024":
            return self._plot.fit(trim)
        if protocol == "exact":
            if self.center:
                values, counts = self._centered
                keep = values > 0
                return fit_exact(values[keep], counts[keep], trim)
            dist = self.magnitudes.nonzero()
            return fit_exact(dist.values, dist.counts, trim)
        raise ValueError(f"unknown protocol {protocol!r}")

    def _moments(self, n: int) -> tuple[float, float, float]:
        """Mean, population std and excess kurtosis of the finite values."""
        red = self.red
        if n == 0:
            return (float("nan"),) * 3
        if red.power_sums is not None:
            s1, s2, s3, s4 = (float(s) / n for s in red.power_sums[:4])
            m2 = s2 - s1**2
            m4 = s4 - 4 * s1 * s3 + 6 * s1**2 * s2 - 3 * s1**4
            mean = red.shift + s1
        else:
            values, counts = code_values(red.dtype)[self._used], red.counts[self._used].astype(np.float64)
            mean = float((counts * values).sum() / n)  # no np.dot: BLAS threads spin per call
            dev2 = (values - mean) ** 2
            m2 = float((counts * dev2).sum() / n)
            m4 = float((counts * dev2 * dev2).sum() / n)
        m2 = max(m2, 0.0)
        kurt = m4 / (m2 * m2) - 3.0 if m2 > 0 else float("nan")
        return mean, math.sqrt(m2), kurt

    @cached_property
    def stats(self) -> MatrixStats:
        red = self.red
        n_finite = self.magnitudes.total
        n_inf = red.n_inf if red.n_inf is not None else int(red.counts[_inf_codes(red.dtype)].sum())
        dist = self.magnitudes
        n_zero = int(dist.counts[dist.values == 0].sum())
        mean, std, kurt = self._moments(n_finite)
        if n_finite:
            if red.power_sums is not None:  # F32: the exact float64 sum of |w| (buckets would be off by up to 2^-8)
                mean_abs = float(red.power_sums[4]) / n_finite
            else:  # exact codes
                mean_abs = float((dist.counts * dist.values).sum() / n_finite)
            # E[w^2] exactly from the moments, E|w| from the distribution.
            std_abs = math.sqrt(max(std**2 + mean**2 - mean_abs**2, 0.0))
        else:
            mean_abs = std_abs = float("nan")
        q99 = dist.quantile(0.99)
        return MatrixStats(
            numel=red.numel,
            n_finite=n_finite,
            n_nan=red.numel - n_finite - n_inf,
            n_inf=n_inf,
            zero_fraction=n_zero / n_finite if n_finite else float("nan"),
            mean=mean,
            std=std,
            excess_kurtosis=kurt,
            mean_abs=mean_abs,
            std_abs=std_abs,
            max_abs=red.max_abs,
            q99_abs=q99,
            max_over_q99=red.max_abs / q99 if q99 > 0 else float("nan"),
            distinct_values=int(self._used.size),
        )


@cache
def _inf_codes(dtype: str) -> np.ndarray:
    """The codes of +-Inf (none for E4M3, whose specials are NaN): found once, not masked out of the 65,536
    counts of every matrix."""
    codes = np.flatnonzero(np.isinf(code_values(dtype)))
    codes.setflags(write=False)
    return codes


# Conveniences for callers that need one thing from a reduction.


def magnitudes(red: Reduction) -> MagnitudeDistribution:
    return Summary(red).magnitudes


def cohort_histogram(red: Reduction) -> np.ndarray:
    return Summary(red).histogram


def fit(red: Reduction, protocol: str, trim: str) -> WeibullFit:
    return Summary(red).fit(protocol, trim)


def matrix_stats(red: Reduction) -> MatrixStats:
    return Summary(red).stats

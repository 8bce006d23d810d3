"""Weibull fits of |w| on the probability plot, the half-normal anchor, and the Gamma closure.

The model: |w| ~ Weibull(k, lam), F(x) = 1 - exp(-(x/lam)^k), so on the Weibull probability
plot Y = ln(-ln(1 - F)) is linear in X = ln x with slope k and intercept -k ln(lam). Every fit
here is a least-squares line through weighted (X, Y) points restricted to a central probability
window (the trim): mid80 keeps F in [0.10, 0.90] (the paper's protocol), mid90 [0.05, 0.95],
full everything. Two protocols choose the points:

- `hist1024` (the cohort protocol, paper's library, used for DATABASE_v9_1): 1024 bins of
  log10|w| over [-12, 2]; a point per non-empty bin at the bin's log-midpoint, with F the
  bin-midpoint ECDF (F_lo + F_hi) / 2, weight = bin count; bins kept when F is inside the window.
- `exact`: the order statistics themselves. Order statistic i of the N finite nonzero |w| gets
  the Hazen plotting position p_i = (i - 1/2) / N, Y_i = ln(-ln(1 - p_i)); ranks with p_i inside
  the window are kept. Tied values (16-bit dtypes have many) are pooled into one point per
  distinct value carrying the mean of Y over its kept ranks (in closed form), weighted by their
  number: the line is then exactly the least-squares line through all N order statistics (R^2 is
  that of the pooled points). For F32, a "value" is a 2^-7-wide bucket at its midpoint (see
  codes.py); the measured effect on k and lambda is in benchmarks/RESULTS.md.

Zeros cannot sit on a log axis: both protocols fit the nonzero finite |w| only (the fraction of
exact zeros is reported beside the fit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cache

import numpy as np

from ..codes import BIN_EDGES
from ..vocabulary import COHORT_TRIM, TRIMS

MIN_VALUES = 100  # fewer finite nonzero values than this: not fittable (as the paper's library)
MIN_POINTS = 5  # fewer plot points after the trim: not fittable


@dataclass(frozen=True)
class WeibullFit:
    k: float
    lam: float
    r2: float  # count-weighted R^2 of the line on the probability plot (trimmed points)
    ks: float  # Kolmogorov-Smirnov distance between the ECDF and the fitted CDF (all data)
    points: int  # plot points used
    ok: bool = True
    reason: str | None = None

    def to_json(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # flat: asdict's deep copy costs more
        out["lambda"] = out.pop("lam")
        return out


def _not_fitted(reason: str) -> WeibullFit:
    nan = float("nan")
    return WeibullFit(nan, nan, nan, nan, 0, False, reason)


def trim_window(trim: str) -> tuple[float, float]:
    """The probability window [lo, hi] of a trim, computed as the paper's library does."""
    if trim not in TRIMS:
        raise ValueError(f"unknown trim {trim!r}; choose one of {', '.join(TRIMS)}")
    margin = (1 - TRIMS[trim]) / 2.0
    return margin, 1 - margin


def _weighted_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Slope, intercept and weighted R^2 of the least-squares line y ~ x with weights w."""
    sw = w.sum()
    mx, my = (w * x).sum() / sw, (w * y).sum() / sw
    dx, dy = x - mx, y - my
    sxx, sxy = (w * dx * dx).sum(), (w * dx * dy).sum()
    slope = sxy / sxx if sxx > 0 else float("nan")
    intercept = my - slope * mx
    ss_res = (w * (y - (slope * x + intercept)) ** 2).sum()
    ss_tot = (w * dy * dy).sum()
    r2 = 1.0 - ss_res / max(ss_tot, 1e-12)
    return float(slope), float(intercept), float(r2)


def _line_to_fit(slope: float, intercept: float, r2: float, ks_of, points: int) -> WeibullFit:
    if not (math.isfinite(slope) and slope > 0):
        return _not_fitted("non-physical slope on the probability plot")
    lam = math.exp(-intercept / slope)
    if not (math.isfinite(lam) and lam > 0):
        return _not_fitted("non-physical scale from the fit")
    return WeibullFit(slope, lam, r2, float(ks_of(slope, lam)), points)


def weibull_cdf(x: np.ndarray, k: float, lam: float) -> np.ndarray:
    return -np.expm1(-((np.asarray(x, dtype=np.float64) / lam) ** k))


_CENTRES_LOG10 = (BIN_EDGES[:-1] + BIN_EDGES[1:]) / 2.0
_CENTRES = 10.0**_CENTRES_LOG10


class Hist1024Plot:
    """The probability plot of a 1024-bin log10|w| histogram, shared by the fits of every trim."""

    def __init__(self, hist: np.ndarray) -> None:
        self.hist = hist = np.asarray(hist, dtype=np.float64)
        self.total = total = hist.sum()
        if total < MIN_VALUES:  # not fittable; and no division by a zero total
            return
        cum = np.cumsum(hist)
        self.f_hi = cum / total
        self.f_mid = (self.f_hi + (cum - hist) / total) / 2.0

    def fit(self, trim: str = COHORT_TRIM) -> WeibullFit:
        if self.total < MIN_VALUES:
            return _not_fitted(f"fewer than {MIN_VALUES} values in the histogram range")
        hist, f_mid = self.hist, self.f_mid
        if TRIMS[trim] >= 1.0:
            keep = (hist > 0) & (f_mid > 0) & (f_mid < 1)
        else:
            lo, hi = trim_window(trim)
            keep = (f_mid >= lo) & (f_mid <= hi) & (hist > 0)
        points = int(np.count_nonzero(keep))
        if points < MIN_POINTS:
            return _not_fitted(f"fewer than {MIN_POINTS} histogram bins inside the {trim} window")
        x = _CENTRES_LOG10[keep] * np.log(10.0)
        y = np.log(-np.log(1 - f_mid[keep] + 1e-12))  # the library's guard, kept for bit-compatibility
        slope, intercept, r2 = _weighted_line(x, y, hist[keep])

        def ks(k: float, lam: float) -> float:
            return float(np.abs(self.f_hi - weibull_cdf(_CENTRES, k, lam)).max())

        return _line_to_fit(slope, intercept, r2, ks, points)


def fit_hist1024(hist: np.ndarray, trim: str = COHORT_TRIM) -> WeibullFit:
    """Cohort protocol on a 1024-bin log10|w| histogram (bit-compatible with npm-weibull-py 0.4.0)."""
    return Hist1024Plot(hist).fit(trim)


def fit_exact(values: np.ndarray, counts: np.ndarray, trim: str = COHORT_TRIM) -> WeibullFit:
    """Order-statistic protocol on the distribution of |w|: distinct positive `values`, ascending."""
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if n < MIN_VALUES:
        return _not_fitted(f"fewer than {MIN_VALUES} finite nonzero values")
    upper = np.cumsum(counts)  # rank of each value's last copy
    lower = upper - counts + 1  # rank of its first copy
    if TRIMS[trim] >= 1.0:
        first, last = lower, upper
    else:
        lo, hi = trim_window(trim)
        first_rank, last_rank = _rank_window(lo, hi, n)
        first = np.maximum(lower, first_rank)
        last = np.minimum(upper, last_rank)
    kept = last - first + 1
    sel = kept > 0
    if sel.sum() < MIN_POINTS:
        return _not_fitted(f"fewer than {MIN_POINTS} distinct values inside the {trim} window")
    x = np.log(values[sel])
    y = _mean_plot_y(first[sel], last[sel], n)
    slope, intercept, r2 = _weighted_line(x, y, kept[sel].astype(np.float64))

    def ks(k: float, lam: float) -> float:
        fitted = weibull_cdf(values, k, lam)
        return float(max(np.abs(upper / n - fitted).max(), np.abs((lower - 1) / n - fitted).max()))

    return _line_to_fit(slope, intercept, r2, ks, int(sel.sum()))


def _rank_window(lo: float, hi: float, n: int) -> tuple[int, int]:
    """First and last rank i with lo <= (i - 1/2) / n <= hi, decided in float64 as an
    element-wise implementation would (so boundary ranks never depend on rounding shortcuts)."""

    def position(i: int) -> float:
        return (i - 0.5) / n

    first = max(1, math.ceil(lo * n + 0.5) - 2)
    while position(first) < lo:
        first += 1
    last = min(n, math.floor(hi * n + 0.5) + 2)
    while position(last) > hi:
        last -= 1
    return first, last


def _mean_plot_y(first: np.ndarray, last: np.ndarray, n: int) -> np.ndarray:
    """Mean of Y_i = ln(-ln(1 - (i - 1/2)/N)) over ranks first..last (arrays, inclusive).

    The sum over a run of ranks is N times the integral of Y over ((first-1)/N, last/N) (the sum
    is that integral's midpoint rule), with G(p) = -(1 - p) ln t - E1(t), t = -ln(1 - p), as the
    antiderivative (G(0) = Euler's gamma, G(1) = 0). Where Y curves sharply, within 1024 ranks
    of either end, the per-rank midpoint errors are added back exactly, so every run's sum equals
    the explicit sum to about 1e-12.
    """
    from scipy.special import exp1  # imported here: only the exact protocol needs scipy

    def antiderivative(p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        out = np.empty_like(p)
        inner = (p > 0) & (p < 1)
        t = -np.log1p(-p[inner])
        out[inner] = -(1 - p[inner]) * np.log(t) - exp1(t)
        out[p <= 0] = np.euler_gamma
        out[p >= 1] = 0.0
        return out

    total = n * (antiderivative(last / n) - antiderivative((first - 1) / n))
    edge = min(1024, n)
    for a, b in ((1, edge), (max(edge + 1, n - 1023), n)):
        if b < a:
            continue
        ranks = np.arange(a, b + 1)
        exact = np.log(-np.log1p(-(ranks - 0.5) / n))
        midpoint = n * (antiderivative(ranks / n) - antiderivative((ranks - 1) / n))
        cum = np.concatenate([[0.0], np.cumsum(exact - midpoint)])
        lo, hi = np.maximum(first, a), np.minimum(last, b)
        overlap = hi >= lo
        total[overlap] += cum[hi[overlap] - a + 1] - cum[lo[overlap] - a]
    return total / (last - first + 1)


# ---------------------------------------------------------------------------------------------
# The half-normal anchor (paper App. A.1): the mid-80 probability-plot line through the exact
# half-normal quantile function. With g(F) = ln(sqrt(2) erfinv(F)) and Y(F) = ln(-ln(1 - F)),
# F uniform on the window: k0 = Cov(g, Y) / Var(g), lam0 / sigma = exp(mean g - mean Y / k0).


@cache
def half_normal_anchor(trim: str = COHORT_TRIM) -> tuple[float, float]:
    """(k0, lambda0 / sigma) for |w| of i.i.d. N(0, sigma^2) weights, by numerical integration."""
    from scipy import integrate, special  # imported here: scipy costs ~0.3 s at start-up

    lo, hi = trim_window(trim) if TRIMS[trim] < 1 else (0.0, 1.0)

    def g(f: float) -> float:
        return math.log(math.sqrt(2.0) * special.erfinv(f))

    def y(f: float) -> float:
        return math.log(-math.log1p(-f))

    def mean(fn) -> float:
        return integrate.quad(fn, lo, hi, limit=200)[0] / (hi - lo)

    mg, my = mean(g), mean(y)
    cov = mean(lambda f: (g(f) - mg) * (y(f) - my))
    var = mean(lambda f: (g(f) - mg) ** 2)
    k0 = cov / var
    return k0, math.exp(mg - my / k0)


def weibull_std(k: float, lam: float) -> float:
    """Standard deviation of Weibull(k, lam): lam * sqrt(Gamma(1 + 2/k) - Gamma(1 + 1/k)^2)."""
    g1, g2 = math.gamma(1 + 1 / k), math.gamma(1 + 2 / k)
    return lam * math.sqrt(max(g2 - g1 * g1, 0.0))


GAMMA_CLOSURE_PASS = 0.02


def gamma_closure(k: float, lam: float, std_abs: float) -> float:
    """F3: relative error of the Weibull-implied std of |w| against the empirical std of |w|.

    This is the paper's stated check (App. A.1). Note that it cannot pass for Gaussian weights:
    a half-normal |w| fitted by the mid-80 protocol gives +15.3% (see tests/test_fit.py), so the
    check mostly measures how far a matrix's tails are from Gaussian.
    """
    if not (math.isfinite(k) and k > 0 and std_abs > 0):
        return float("nan")
    return weibull_std(k, lam) / std_abs - 1.0

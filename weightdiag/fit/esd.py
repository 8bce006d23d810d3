"""WeightWatcher's per-layer metrics from the eigenvalues of one weight matrix (pure numerics).

Eigenvalues in, numbers out: `fit_spectrum(evals, rows, cols)` gives every column WeightWatcher 0.7.7's
`analyze()` writes for a dense layer, computed with its definitions and defaults (read from its source:
weightwatcher.py, RMT_Util.py, WW_powerlaw.py), plus its `mp_fit=True` columns and FARMS' alpha:

- ESD: λ_i = σ_i(W)², the min(m, n) eigenvalues of WᵀW (or WWᵀ), NOT divided by N: analyze() has no
  `normalize` argument since 0.6.5 and `glorot_fix=False`, so W is used as stored (its `conv2d_norm` rescales
  Conv2D layers only). The JMLR paper's X = WᵀW / N differs: there, λ/N, log_norm - log10 N,
  log_spectral_norm - log10 N, alpha_weighted - alpha·log10 N; alpha, xmin/λ_max, D and the ranks do not
  change (the fit is scale invariant).
- power law (`alpha`, `xmin`, `xmax`, `D`, `sigma`, `num_pl_spikes`, `status`, `warning`): WeightWatcher's
  own estimator `WWFit` (its default pl_package='ww', fit='power_law', xmax=None), not the `powerlaw`
  package's: on the eigenvalues above EVALS_THRESH = 1e-5, sorted, every one but the largest is a candidate
  xmin; for each, the continuous MLE alpha = 1 + n / Σ_{x>=xmin} ln(x / xmin) (n: eigenvalues >= xmin) and
  the Kolmogorov-Smirnov distance D = max_k |1 - (x_k / xmin)^(1 - alpha) - k / n| (k = 0..n-1 over the
  tail, ascending); the xmin of least D (the first on ties) wins; sigma = (alpha - 1) / √n. Fewer than 20
  eigenvalues: its small-sample variant (alpha with n - 1, tails of 8 or more, xmin minimising
  D - 0.868/√n). `num_pl_spikes` counts eigenvalues >= xmin, `xmax` is the largest eigenvalue fitted,
  `warning` is 'over-trained' below alpha 2 and 'under-trained' above 6 (WW's band).
- norms: norm = Σλ (the squared Frobenius norm), log_norm = log10 norm, spectral_norm = λ_max,
  log_spectral_norm = log10 λ_max, stable_rank = norm / λ_max, alpha_weighted = alpha·log10 λ_max,
  log_alpha_norm = log10 Σ λ^alpha; sv_max = √λ_max, sv_min = √λ_min, weak_rank_loss = #{λ < 1e-6},
  matrix_rank, rank_loss = M - matrix_rank, entropy = -Σ p ln p / ln(matrix_rank), p = λ/Σλ + 1e-10.
- Marchenko-Pastur (`num_spikes`, `sigma_mp`, `mp_softrank`, `bulk_min`, `bulk_max`, `W_scale`): WW's
  `mp_fit` (analyze(mp_fit=True); deterministic, no randomisation): λ rescaled by W_scale² = M / Σλ (mean 1),
  a linear-kernel density estimate (bandwidth 0.1, 1000 points on [0, max + 0.5], points of density < 0.01
  dropped) fitted by the MP density (quarter-circle law of √λ when Q = N/M = 1) over σ on a grid
  0.05..2 x σ_0 (σ_0 from λ_max), polished by Nelder-Mead (scipy.optimize.brute + fmin); bulk edge
  λ+ = (σ(1 + 1/√Q))², spikes = #{λ > λ+ + √(Q^-1/2 λ+^2/3 M^-2/3)} (a Tracy-Widom margin),
  mp_softrank = λ+ / λ_max; bulk_min/max are reported in the unscaled units of λ.
- FARMS (`alpha_farms`, `farms_xmin`, `farms_D`): the same power-law fit on the pooled ESD of fixed-aspect-
  ratio windows (weightdiag.reduce.farms): Y. Hu, K. Goel, V. Killiakov, Y. Yang, "Eigenspectrum Analysis
  of Neural Networks without Aspect Ratio Bias" (ICML 2025). Their LLM code fits with WW's 'xmin_peak'
  restriction of the xmin search; here the xmin search is WW's default one, so that alpha_farms differs from
  alpha by the aspect-ratio correction alone.

Not here: WW's randomize=True columns (rand_num_spikes/num_traps, max_rand_eval, rand_distance,
ww_softrank, ww_maxdist) need the spectrum of W with its entries shuffled by numpy's global RNG, which
no streamed Gram can give; `rand_distance` below computes WW's formula from such a spectrum when a caller
has one. WW 0.7.7 under a CUDA torch converts a state dict's weights to float16, runs a float32 SVD and uses
EVALS_THRESH = 1e-4 and EPSILON = 6e-5: these are the values of its CPU path (float32 weights, float64 SVD).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy import optimize, stats

EVALS_THRESH = 1e-5  # WW: eigenvalues the power law is fitted to are above this
WEAK_RANK_TOL = 1e-6  # WW: weak_rank_loss counts eigenvalues below this
ENTROPY_EPSILON = 1e-10  # WW's EPSILON in matrix_entropy
SMALL_N = 20  # WW_powerlaw.SMALL_N_CUTOFF
SMALL_N_MIN_TAIL = 8  # fit_powerlaw_smallN's k_min
OVER_TRAINED = 2.0  # WW's band: alpha below is 'over-trained', above UNDER_TRAINED 'under-trained'
UNDER_TRAINED = 6.0
MP_BANDWIDTH = 0.1
MP_GRID = 1000
MP_DENSITY_FLOOR = 0.01

_EXACT_SCAN = 2048  # up to this many eigenvalues every xmin is scanned in full, as WW does
_PROBES = 256  # lower bounds of D from this many evenly spaced points of the tail ...
_LOCAL = 32  # ... and its first few, before a candidate xmin is scanned in full
_MARGIN = 1e-9  # a lower bound from the cumulative-sum alpha prunes only above the best D by this much
_CHUNK = 4096


@dataclass(frozen=True)
class PowerLawFit:
    """WeightWatcher's power-law fit of an ESD tail (its column names)."""

    alpha: float
    xmin: float
    xmax: float
    D: float
    sigma: float
    num_pl_spikes: int  # eigenvalues >= xmin
    status: str  # 'success' | 'failed'
    warning: str  # '' | 'over-trained' | 'under-trained'


_FAILED_FIT = (-1.0, -1.0, float("nan"), -1.0, -1.0, -1)  # WW's values when the fit fails


def _warning(alpha: float) -> str:
    if alpha < OVER_TRAINED:
        return "over-trained"
    return "under-trained" if alpha > UNDER_TRAINED else ""


def fit_power_law(evals: np.ndarray, thresh: float = EVALS_THRESH) -> PowerLawFit:
    """WW 0.7.7's default power-law fit (`fit_powerlaw` with WWFit) of the eigenvalues `evals`."""
    evals = np.asarray(evals, dtype=np.float64)
    data = np.sort(evals[evals > thresh])
    if data.size < 2:  # WW: np.argmin of an empty array of candidates raises, the fit is 'failed'
        alpha, xmin, xmax, D, sigma, spikes = _FAILED_FIT
        return PowerLawFit(alpha, xmin, xmax, D, sigma, spikes, "failed", _warning(alpha))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if data.size < SMALL_N:
            i, alpha, D, sigma = _fit_small(data)
        else:
            i, alpha, D = _ks_scan(data)
            sigma = (alpha - 1.0) / math.sqrt(data.size - i)
    if math.isnan(alpha):
        nan_alpha, xmin, xmax, D, sigma, spikes = _FAILED_FIT
        return PowerLawFit(nan_alpha, xmin, xmax, D, sigma, spikes, "failed", _warning(nan_alpha))
    xmin = float(data[i])
    spikes = int(np.count_nonzero(evals >= xmin))
    return PowerLawFit(float(alpha), xmin, float(data[-1]), float(D), float(sigma), spikes, "success", _warning(alpha))


def _alpha_and_d(data: np.ndarray, log_data: np.ndarray, i: int, stop_above: float = math.inf) -> tuple[float, float]:
    """WWFit's alpha and D for xmin = data[i], computed as it does (bit for bit); D's scan stops early, with
    a partial maximum > stop_above, once the candidate cannot win."""
    N = data.size
    n = float(N - i)
    alpha = 1 + n / (np.sum(log_data[i:]) - n * log_data[i])
    if not alpha > 1:
        return float(alpha), 1.0
    xmin = data[i]
    best = 0.0
    start, size = 0, _LOCAL
    while start < N - i:
        end = min(N - i, start + size)
        dev = np.max(np.abs(1 - (data[i + start : i + end] / xmin) ** (-alpha + 1) - np.arange(start, end) / n))
        best = max(best, float(dev))
        if best > stop_above:
            break
        start, size = end, min(size * 4, _CHUNK * 16)
    return float(alpha), best


def _ks_scan(data: np.ndarray) -> tuple[int, float, float]:
    """(index of xmin, alpha, D) of WWFit.fit_power_law_standard: the first xmin of least D.

    Up to _EXACT_SCAN eigenvalues every candidate is scanned in full. Above (FARMS' pooled spectra hold
    ~10^5), a candidate is skipped when a lower bound of its D already exceeds the best D found (exact: it
    cannot be the argmin), so only the few near the best are scanned in full; the bound comes from a cheap
    alpha (cumulative sums) and a few points of the tail, with a margin covering the bound's rounding."""
    N = data.size
    log_data = np.log(data, dtype=np.float64)
    if N <= _EXACT_SCAN:
        results = [_alpha_and_d(data, log_data, i) for i in range(N - 1)]
        Ds = np.array([d for _, d in results])
        i = int(np.argmin(Ds))
        return i, results[i][0], results[i][1]
    cand = N - 1
    best_i, best_alpha, best_d = -1, math.nan, math.inf

    def consider(i: int) -> None:
        nonlocal best_i, best_alpha, best_d
        alpha, d = _alpha_and_d(data, log_data, i, stop_above=best_d)
        if d < best_d or (d == best_d and i < best_i):
            best_i, best_alpha, best_d = i, alpha, d

    for first in np.unique(np.linspace(0, cand - 1, 64).astype(np.int64)):
        consider(int(first))
    bound = _d_lower_bounds(data, log_data)
    for candidate in np.flatnonzero(bound <= best_d + _MARGIN):
        if bound[candidate] <= best_d + _MARGIN:  # best_d shrinks as the scan goes
            consider(int(candidate))
    return best_i, best_alpha, best_d


def _d_lower_bounds(data: np.ndarray, log_data: np.ndarray, batch: int = 2048) -> np.ndarray:
    """For every candidate xmin, max over a few tail points of WWFit's KS deviation: a lower bound of its D
    (up to the rounding of the cumulative-sum alpha, far below _MARGIN)."""
    N = data.size
    cand = N - 1
    # Σ_{k>=i} ln(x_k / x_i) = Σ_{j>i} (ln x_j - ln x_{j-1})·(N - j): a suffix sum of terms >= 0, no cancellation
    gaps = np.diff(log_data) * (N - np.arange(1, N))
    denom = np.cumsum(gaps[::-1])[::-1]
    n = (N - np.arange(cand)).astype(np.float64)
    alpha = 1 + n / denom
    grid = np.unique(np.linspace(0, N - 1, _PROBES).astype(np.int64))
    out = np.empty(cand)
    for b0 in range(0, cand, batch):
        idx = np.arange(b0, min(cand, b0 + batch))
        ks = np.concatenate([np.broadcast_to(grid, (idx.size, grid.size)), idx[:, None] + np.arange(_LOCAL)], axis=1)
        valid = (ks >= idx[:, None]) & (ks < N)
        ks = np.where(valid, ks, idx[:, None])
        k = (ks - idx[:, None]).astype(np.float64)
        expo = (1 - alpha[idx])[:, None]
        dev = np.abs(1 - np.exp(expo * (log_data[ks] - log_data[idx][:, None])) - k / n[idx][:, None])
        dev = np.where(valid & (alpha[idx] > 1)[:, None], dev, 0.0)
        out[idx - 0] = dev.max(axis=1)
    out[~(alpha > 1)] = 0.0  # no bound where the cheap alpha is not > 1 (WW's D is then 1): scanned in full
    return out


def _fit_small(data: np.ndarray) -> tuple[int, float, float, float]:
    """WWFit under 20 eigenvalues: (index of xmin, alpha, D, sigma). fit_powerlaw_smallN fills alphas (with
    n - 1) and Ds for tails of 8 or more (its own choice by D - 0.868/√n is then overridden: WWFit.__init__
    takes the argmin of Ds, as for larger N); with no such tail, its fallback sets alphas[0] and Ds[0] from
    the whole sample after the sigmas were computed."""
    N = data.size
    log_data = np.log(data, dtype=np.float64)
    alphas = np.zeros(N - 1)
    Ds = np.ones(N - 1)
    some = False
    for i in range(N - 1):
        n_int = N - i
        if n_int < SMALL_N_MIN_TAIL:
            continue
        n = float(n_int)
        s = np.sum(log_data[i:]) - n * log_data[i]
        if s <= 1e-12:
            continue
        alpha_bc = 1.0 + (n - 1.0) / s
        alphas[i] = alpha_bc
        if alpha_bc <= 1.0:
            continue
        f_fit = 1.0 - (data[i:] / data[i]) ** (1.0 - alpha_bc)
        f_emp = np.arange(n_int, dtype=np.float64) / n
        Ds[i] = float(np.max(np.abs(f_emp - f_fit)))
        some = True
    sigmas = (alphas - 1.0) / np.sqrt(N - np.arange(N - 1))
    if not some:
        n = float(N)
        s = np.sum(log_data) - n * log_data[0]
        if s > 1e-12:
            alpha_bc = 1.0 + (n - 1.0) / s
            alphas[0] = alpha_bc
            f_fit = 1.0 - (data / data[0]) ** (1.0 - alpha_bc)
            Ds[0] = float(np.max(np.abs(np.arange(N, dtype=np.float64) / n - f_fit)))
    i = int(np.argmin(Ds))
    return i, float(alphas[i]), float(Ds[i]), float(sigmas[i])


@dataclass(frozen=True)
class MPFit:
    """WeightWatcher's Marchenko-Pastur fit (analyze(mp_fit=True) columns)."""

    num_spikes: int
    sigma_mp: float
    mp_softrank: float
    bulk_min: float
    bulk_max: float
    W_scale: float


_FAILED_MP = MPFit(-1, -1.0, -1.0, -1.0, -1.0, -1.0)


def _linear_kde(points: np.ndarray, grid: np.ndarray, bw: float) -> np.ndarray:
    """sklearn's KernelDensity(kernel='linear', bandwidth=bw).fit(points).score_samples(grid), exponentiated:
    (1 / (N·bw)) Σ_i max(0, 1 - |x - p_i| / bw), summed exactly (sklearn sums in log space)."""
    points = np.sort(points)
    out = np.empty(grid.size)
    lo = np.searchsorted(points, grid - bw, side="right")
    hi = np.searchsorted(points, grid + bw, side="left")
    for j, x in enumerate(grid):
        near = points[lo[j] : hi[j]]
        out[j] = np.sum(1.0 - np.abs(x - near) / bw)
    return out / (points.size * bw)


def _mp_objective(xde: np.ndarray, yde: np.ndarray, Q: float):
    """WW's resid_mp(sigma, ..., allresid=False) for a fixed density estimate (it refits the same KDE on
    every call: the residual only depends on sigma through the MP / quarter-circle density)."""
    good = np.where(yde > MP_DENSITY_FLOOR)[0]
    bad = np.where(yde < MP_DENSITY_FLOOR)[0]
    x, y = xde[good], yde[good]
    peak = x[np.where(y == max(y))][0] if y.size else math.nan
    zeros = np.zeros(len(bad))

    def resid(p: np.ndarray) -> float:
        sigma = p
        with np.errstate(divide="ignore", invalid="ignore"):
            if Q == 1:
                ymp = np.nan_to_num((1 / (np.pi * sigma * sigma)) * np.sqrt(4 - x**2))
                r = ymp - y
            else:
                b = np.power(sigma * (1 + np.sqrt(1 / Q)), 2)
                a = np.power(sigma * (1 - np.sqrt(1 / Q)), 2)
                ymp = np.nan_to_num((1 / (2 * np.pi * sigma * sigma * x * (1 / Q))) * np.sqrt((b - x) * (x - a)))
                outside = (b < peak) | (b > max(x)) | (a > peak)  # WW: the bulk edge must lie past the peak
                r = np.zeros(len(y)) + 1000 if outside else ymp - y
        r = np.concatenate((r, zeros))
        return np.sum(r**2)

    return resid


def fit_mp(evals: np.ndarray, N: int, M: int) -> MPFit:
    """WW 0.7.7's `mp_fit` of the eigenvalues of an N x M layer (N >= M), rescale=True, not randomized."""
    evals = np.asarray(evals, dtype=np.float64)
    if evals.size == 0 or not np.sum(evals) > 0:
        return _FAILED_MP
    Q = N / M
    w_scale = np.sqrt(evals.shape[0]) / np.sqrt(np.sum(evals))
    scaled = (w_scale * w_scale) * evals
    lambda_max = np.max(scaled)
    to_fit = np.sqrt(scaled) if Q == 1 else scaled
    xde = np.linspace(0, np.max(to_fit) + 0.5, MP_GRID)
    yde = _linear_kde(to_fit, xde, MP_BANDWIDTH)
    if not np.any(yde > MP_DENSITY_FLOOR):
        return _FAILED_MP
    s0 = np.sqrt(lambda_max / np.square(1.0 + 1.0 / np.sqrt(Q)))  # WW's calc_sigma
    out = optimize.brute(
        _mp_objective(xde, yde, Q), (slice(0.05 * s0, 2.0 * s0, 0.01 * s0),), full_output=True
    )  # finish=fmin, as WW calls it
    s1 = float(out[0][0])
    bulk_max = (s1 * (1 + 1 / np.sqrt(Q))) ** 2
    bulk_min = (s1 * (1 - 1 / np.sqrt(Q))) ** 2
    tw = 1 / np.sqrt(Q) * np.power(bulk_max, 2 / 3) * np.power(M, -2 / 3)
    spikes = int(np.count_nonzero(scaled > bulk_max + np.sqrt(tw)))
    w2 = w_scale * w_scale
    return MPFit(spikes, s1, float(bulk_max / lambda_max), float(bulk_min / w2), float(bulk_max / w2), float(w_scale))


def rand_distance(evals: np.ndarray, rand_evals: np.ndarray) -> float:
    """WW's rand_distance: the Jensen-Shannon distance between the sorted eigenvalues and those of W with its
    entries shuffled, each vector taken as a probability distribution (as WW's jensen_shannon_distance does)."""
    p = np.asarray(evals, dtype=np.float64)
    q = np.asarray(rand_evals, dtype=np.float64)
    m = (p + q) / 2
    return float(np.sqrt((stats.entropy(p, m) + stats.entropy(q, m)) / 2))


@dataclass(frozen=True)
class SpectrumFit:
    """One weight matrix's spectrum metrics; the field names are WeightWatcher's columns where it has one."""

    rows: int  # the matrix as stored
    cols: int
    N: int  # WW's N = max(rows, cols), M = min, Q = N / M
    M: int
    Q: float
    num_evals: int
    lambda_max: float
    sv_max: float
    sv_min: float
    norm: float  # Σλ = ||W||_F²
    log_norm: float
    spectral_norm: float  # λ_max = ||W||_2²
    log_spectral_norm: float
    stable_rank: float
    matrix_rank: int
    rank_loss: int
    weak_rank_loss: int
    entropy: float
    alpha: float
    alpha_weighted: float
    log_alpha_norm: float
    xmin: float
    xmax: float
    D: float
    sigma: float
    num_pl_spikes: int
    status: str
    warning: str
    num_spikes: int
    sigma_mp: float
    mp_softrank: float
    bulk_min: float
    bulk_max: float
    W_scale: float
    alpha_farms: float | None = None
    farms_xmin: float | None = None
    farms_D: float | None = None
    farms_num_evals: int | None = None
    farms_windows: int | None = None

    def to_json(self) -> dict[str, Any]:
        """Field -> value; NaN and infinities become None (JSON has no such numbers)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            out[f.name] = value
        return out


def matrix_rank(evals: np.ndarray, N: int, gram: bool = False) -> int:
    """Eigenvalues above the rank tolerance: WW's σ > σ_max·N·ε (numpy's matrix_rank on σ = √λ), right for
    eigenvalues as accurate as an SVD's, which reduce/gram.py's are (those below its floor are refined). `gram`:
    eigenvalues of a Gram alone, known only to about ε·λ_max: then λ > λ_max·N·ε (numpy's tolerance for the
    Gram itself, σ > σ_max·√(N·ε)). The two agree unless some σ lies between σ_max·N·ε and σ_max·√(N·ε)
    (~1e-12 to ~1e-6 of σ_max), i.e. for numerically rank-deficient matrices, which the Gram alone cannot tell
    from full-rank ones."""
    evals = np.asarray(evals, dtype=np.float64)
    eps = np.finfo(np.float64).eps
    if gram:
        return int(np.count_nonzero(evals > np.max(evals) * N * eps))
    sv = np.sqrt(evals)
    return int(np.count_nonzero(sv > np.max(sv) * N * eps))


def fit_spectrum(
    evals: np.ndarray,
    rows: int,
    cols: int,
    farms_evals: np.ndarray | None = None,
    farms_windows: int | None = None,
    gram: bool = False,
) -> SpectrumFit:
    """Every metric of a rows x cols matrix from its min(rows, cols) eigenvalues (σ², any order; see the module
    docstring), and FARMS' alpha when its pooled window eigenvalues are given. `gram`: the eigenvalues come
    from a Gram matrix alone, unrefined (the rank tolerance, see `matrix_rank`); False (the default) for those
    of an SVD or of reduce/gram.py, whose eigenvalues below its floor are refined to an SVD's accuracy."""
    evals = np.sort(np.asarray(evals, dtype=np.float64))
    N, M = max(rows, cols), min(rows, cols)
    if evals.size != M or M == 0:
        raise ValueError(f"{evals.size} eigenvalues for a {rows} x {cols} matrix (expected {M})")
    pl = fit_power_law(evals)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        norm = float(np.sum(evals))
        lam_max = float(evals[-1])
        log_spectral_norm = float(np.log10(lam_max))
        rank = matrix_rank(evals, N, gram)
        sv = np.sqrt(evals)
        squares = sv * sv  # WW's matrix_entropy squares √λ again
        p = squares / np.sum(squares) + ENTROPY_EPSILON
        entropy = float(-np.sum(p * np.log(p)) / np.log(rank + ENTROPY_EPSILON))
        log_alpha_norm = float(np.log10(np.sum(evals**pl.alpha)))
        stable_rank = norm / lam_max
    mp = fit_mp(evals, N, M)
    farms: dict[str, Any] = {}
    if farms_evals is not None:
        ff = fit_power_law(farms_evals)
        farms = {
            "alpha_farms": ff.alpha if ff.status == "success" else None,
            "farms_xmin": ff.xmin if ff.status == "success" else None,
            "farms_D": ff.D if ff.status == "success" else None,
            "farms_num_evals": int(np.size(farms_evals)),
            "farms_windows": farms_windows,
        }
    return SpectrumFit(
        rows=rows,
        cols=cols,
        N=N,
        M=M,
        Q=N / M,
        num_evals=int(evals.size),
        lambda_max=lam_max,
        sv_max=math.sqrt(lam_max),
        sv_min=math.sqrt(float(evals[0])),
        norm=norm,
        log_norm=float(np.log10(norm)) if norm > 0 else -math.inf,
        spectral_norm=lam_max,
        log_spectral_norm=log_spectral_norm,
        stable_rank=stable_rank,
        matrix_rank=rank,
        rank_loss=int(evals.size - rank),
        weak_rank_loss=int(np.count_nonzero(evals < WEAK_RANK_TOL)),
        entropy=entropy,
        alpha=pl.alpha,
        alpha_weighted=pl.alpha * log_spectral_norm,
        log_alpha_norm=log_alpha_norm,
        xmin=pl.xmin,
        xmax=pl.xmax,
        D=pl.D,
        sigma=pl.sigma,
        num_pl_spikes=pl.num_pl_spikes,
        status=pl.status,
        warning=pl.warning,
        num_spikes=mp.num_spikes,
        sigma_mp=mp.sigma_mp,
        mp_softrank=mp.mp_softrank,
        bulk_min=mp.bulk_min,
        bulk_max=mp.bulk_max,
        W_scale=mp.W_scale,
        **farms,
    )

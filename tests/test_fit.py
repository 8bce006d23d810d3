"""The paper's numbers: the half-normal anchor, the protocols, the Gamma closure."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import erf

from weightdiag.codes import BIN_EDGES
from weightdiag.fit.stats import fit, matrix_stats
from weightdiag.fit.weibull import (
    fit_exact,
    fit_hist1024,
    gamma_closure,
    half_normal_anchor,
    trim_window,
    weibull_std,
)
from weightdiag.reduce.reduction import reduce_array
from weightdiag.testing import synthetic

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

K0, LAMBDA0 = 1.2054, 0.8875  # paper App. A.1


def test_closed_form_anchor_matches_paper():
    k0, lam0 = half_normal_anchor("mid80")
    assert abs(k0 - K0) < 5e-5
    assert abs(lam0 - LAMBDA0) < 5e-5


def test_anchor_trims_order_like_table1():
    # Wider windows reach further into the tails and lower k (paper Table 1's ordering).
    assert half_normal_anchor("mid80")[0] > half_normal_anchor("mid90")[0] > half_normal_anchor("full")[0]


@pytest.fixture(scope="module")
def gaussian_16m() -> np.ndarray:
    return np.random.default_rng(20260517).standard_normal(16_000_000, dtype=np.float32)


@pytest.mark.parametrize("dtype", ["BF16", "F32"])
@pytest.mark.parametrize("protocol", ["hist1024", "exact"])
def test_gaussian_samples_hit_the_anchor(gaussian_16m, dtype, protocol):
    sigma = 0.02
    x = gaussian_16m * np.float32(sigma)
    raw = synthetic.to_bf16_bits(x) if dtype == "BF16" else x
    f = fit(reduce_array(raw, dtype), protocol, "mid80")
    assert abs(f.k - K0) < 0.002, f
    assert abs(f.lam / sigma - LAMBDA0) < 0.002, f
    assert f.r2 > 0.99


def test_hist1024_binning_bias_is_bounded_for_any_sigma():
    """Infinite-sample hist1024 fits (expected bin counts) over one full bin phase of sigma.

    The 1024-bin grid moves the trimmed bins with sigma: k stays in [1.2040, 1.2071] and
    lambda/sigma in [0.8866, 0.8884] (measured), inside the +-0.002 anchor tolerance.
    """
    width = (BIN_EDGES[-1] - BIN_EDGES[0]) / 1024
    ks, lams = [], []
    for log_sigma in np.linspace(-2, -2 + width, 200):
        sigma = 10.0**log_sigma
        f = fit_hist1024(np.diff(erf(10.0**BIN_EDGES / (sigma * math.sqrt(2)))) * 1e12)
        ks.append(f.k)
        lams.append(f.lam / sigma)
    assert min(ks) > 1.2035
    assert max(ks) < 1.2075
    assert max(abs(k - K0) for k in ks) < 0.0018
    assert max(abs(x - LAMBDA0) for x in lams) < 0.0012
    assert max(ks) - min(ks) > 0.002  # the phase effect is real: the test would see a broken binning


def test_exact_protocol_on_weibull_samples_recovers_parameters():
    rng = np.random.default_rng(1)
    k, lam = 0.9, 0.013
    x = np.sort(lam * rng.weibull(k, 2_000_000))
    f = fit_exact(x, np.ones(x.size, dtype=np.int64))
    assert abs(f.k - k) < 0.005
    assert abs(f.lam / lam - 1) < 0.005
    assert f.r2 > 0.999
    assert f.ks < 0.005


def _order_statistic_fit(x: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """Direct, unpooled implementation of the documented exact protocol (test oracle)."""
    x = np.sort(x)
    n = x.size
    p = (np.arange(1, n + 1) - 0.5) / n
    keep = (p >= lo) & (p <= hi)
    slope, intercept = np.polyfit(np.log(x[keep]), np.log(-np.log1p(-p[keep])), 1)
    return slope, math.exp(-intercept / slope)


def test_exact_protocol_equals_direct_order_statistics_without_ties():
    x = np.abs(np.random.default_rng(2).standard_normal(50_001))
    f = fit_exact(np.sort(x), np.ones(x.size, dtype=np.int64))
    k, lam = _order_statistic_fit(x, *trim_window("mid80"))
    assert f.k == pytest.approx(k, rel=1e-9)
    assert f.lam == pytest.approx(lam, rel=1e-9)


def test_exact_protocol_with_ties_equals_the_unpooled_order_statistic_fit():
    # Heavy ties (a BF16-like grid): pooling a value's ranks at their mean Y gives the same line
    # as regressing every order statistic separately.
    x = np.round(np.abs(np.random.default_rng(3).standard_normal(200_000)) * 64) / 64
    x = x[x > 0]
    values, counts = np.unique(x, return_counts=True)
    for trim in ("mid80", "mid90", "full"):
        pooled = fit_exact(values, counts, trim)
        k, lam = _order_statistic_fit(x, *(trim_window(trim) if trim != "full" else (0.0, 1.0)))
        assert pooled.k == pytest.approx(k, rel=1e-9)
        assert pooled.lam == pytest.approx(lam, rel=1e-9)


def test_unfittable_inputs_say_why():
    assert not fit_exact(np.arange(1, 50, dtype=float), np.ones(49, dtype=np.int64)).ok
    assert "fewer than 100" in fit_hist1024(np.zeros(1024)).reason
    one_value = fit_exact(np.array([0.5]), np.array([1000]))
    assert not one_value.ok
    zeros = reduce_array(np.zeros(10_000, dtype=np.float32), "F32")
    assert not fit(zeros, "hist1024", "mid80").ok
    assert not fit(zeros, "exact", "mid80").ok
    assert matrix_stats(zeros).zero_fraction == 1.0


def test_gamma_closure_is_the_papers_formula():
    k, lam = 1.3, 0.02
    assert gamma_closure(k, lam, weibull_std(k, lam)) == pytest.approx(0.0, abs=1e-12)
    # Weibull samples: the empirical std of |w| agrees with the closed form.
    x = lam * np.random.default_rng(4).weibull(k, 1_000_000)
    assert abs(gamma_closure(k, lam, float(x.std()))) < 0.01


def test_gamma_closure_on_half_normal_is_fifteen_percent():
    # Documented: the paper's closure cannot pass for Gaussian weights (see fit.gamma_closure).
    k0, lam0 = half_normal_anchor()
    std_abs_half_normal = math.sqrt(1 - 2 / math.pi)
    assert gamma_closure(k0, lam0, std_abs_half_normal) == pytest.approx(0.153, abs=0.002)


def test_trims_are_the_libraries_windows():
    assert trim_window("mid80") == ((1 - 0.8) / 2, 1 - (1 - 0.8) / 2)
    with pytest.raises(ValueError):
        trim_window("mid70")

"""`--center`: fits of |w - mean| (the Weibull paper's App. A.1 text) next to the cohort's |w|."""

from __future__ import annotations

import json

import numpy as np
import pytest

from weightdiag.api import fit_path
from weightdiag.codes import HIST_BINS, cohort_bins
from weightdiag.fit.stats import Summary
from weightdiag.fit.weibull import fit_exact, fit_hist1024
from weightdiag.reduce.reduction import reduce_array
from weightdiag.run.measure import FitOptions

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

RNG = np.random.default_rng(7)


def _bf16(x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_centered_fits_equal_fits_of_the_centered_values(dtype):
    x = RNG.standard_normal(120_001) * 0.02 + 0.01  # a mean far from zero, so centring matters
    bits = _bf16(x) if dtype == "BF16" else x.astype(np.float16).view(np.uint16)
    values = (
        (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        if dtype == "BF16"
        else (bits.view(np.float16).astype(np.float64))
    )
    deviations = np.abs(values - values.mean())
    summary = Summary(reduce_array(bits, dtype), center=True)
    bins = cohort_bins(deviations.astype(np.float32))
    hist = np.bincount(bins[(bins >= 0) & (bins < HIST_BINS)], minlength=HIST_BINS)
    for trim in ("mid80", "full"):
        got, want = summary.fit("hist1024", trim), fit_hist1024(hist, trim)
        assert got.k == pytest.approx(want.k, rel=1e-9)
        assert got.lam == pytest.approx(want.lam, rel=1e-9)
        distinct, counts = np.unique(deviations[deviations > 0], return_counts=True)
        got, want = summary.fit("exact", trim), fit_exact(distinct, counts, trim)
        assert got.k == pytest.approx(want.k, rel=1e-9)
    # Centred, the half-normal anchor holds (lambda0 = 0.8875 sigma); uncentred, the mean of half a
    # sigma inflates lambda by about 11%.
    plain = Summary(reduce_array(bits, dtype)).fit("hist1024", "mid80")
    assert summary.fit("hist1024", "mid80").lam / 0.02 == pytest.approx(0.8875, rel=0.02)
    assert plain.lam / summary.fit("hist1024", "mid80").lam > 1.08


def test_center_on_real_weights_is_recorded_and_small(minilm_dir):
    """MiniLM's matrices have means near zero: centring moves k a little, and the row says it was done."""
    plain = fit_path(str(minilm_dir), FitOptions(device="cpu"))
    centered = fit_path(str(minilm_dir), FitOptions(device="cpu", center=True))
    assert plain["protocol"]["centered"] is False
    assert centered["protocol"]["centered"] is True
    shifts = [
        abs(a["fits"]["mid80"]["k"] - b["fits"]["mid80"]["k"])
        for a, b in zip(plain["matrices"], centered["matrices"], strict=True)
        if a["fits"]["mid80"]["ok"]
    ]
    assert 0 < max(shifts) < 0.05
    assert [m["stats"] for m in plain["matrices"]] == [m["stats"] for m in centered["matrices"]]  # stats are of w


def test_fit_center_flag_reaches_the_row(minilm_dir, capsys):
    from weightdiag import cli

    cli._console.cache_clear()
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.main(["fit", str(minilm_dir), "--center", "--no-save", "-q", "--json", "--include", "*layer.0.*"])
    assert done.value.code in (0, None)
    row = json.loads(capsys.readouterr().out)
    assert row["protocol"]["centered"] is True


def test_compare_says_a_centered_row_compares_only_approximately(minilm_dir):
    from weightdiag.diagnose.compare import compare

    plain = compare(fit_path(str(minilm_dir), FitOptions(device="cpu", include=["*layer.0.*"])))
    centered = compare(fit_path(str(minilm_dir), FitOptions(device="cpu", include=["*layer.0.*"], center=True)))
    assert not any("--center" in f for f in plain["findings"])
    assert any("fitted with --center" in f for f in centered["findings"])

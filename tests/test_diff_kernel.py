"""The diff's one-pass C kernel (kernels.pair16) against the numpy path it replaces (its test oracle).

Every figure a block gives (counts of both sides, of ΔW and of the ratio, the cohort histogram of ΔW, the
largest magnitudes and where they first are, unchanged elements, sign flips, ΔW itself) must be equal;
the float64 sums agree to rounding. Blocks with Inf/NaN go to the numpy path. Without the C kernels (the numpy
pass of scripts/test) every block takes the numpy path, held to figures taken from its elements directly
(tests/kernel_oracle.py) and to the figures of the whole."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from weightdiag import kernels
from weightdiag.delta import measures
from weightdiag.delta.measures import CountedPart, Side, Totals, block_part, figures

from . import kernel_oracle

pytestmark = pytest.mark.kernels


def codes16(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "F16":
        return values.astype(np.float16).view(np.uint16)
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def numpy_path(monkeypatch, base: Side, tuned: Side):
    with monkeypatch.context() as m:
        m.setattr(kernels, "HAVE_C", False)
        return block_part(Side(base.dtype, base.stored), Side(tuned.dtype, tuned.stored))


def folded(*parts) -> tuple[Totals, measures.Figures]:
    totals = Totals()
    for part in parts:
        totals.fold(part)
    return totals, figures(totals)


CASES = {
    "fine-tune": lambda rng, n: (w := rng.standard_normal(n) * 0.02, w + rng.standard_normal(n) * 4e-4),
    "sparse update": lambda rng, n: (
        w := rng.standard_normal(n) * 0.02,
        np.where(rng.random(n) < 0.05, w + rng.standard_normal(n) * 1e-3, w),
    ),
    "zeros and sign flips": lambda rng, n: (
        np.where(rng.random(n) < 0.1, 0.0, rng.standard_normal(n)),
        np.where(rng.random(n) < 0.1, -0.0, -rng.standard_normal(n) * 0.5),
    ),
    "untouched": lambda rng, n: (w := rng.standard_normal(n) * 0.05, w),
    "wide range": lambda rng, n: (
        rng.standard_normal(n) * np.exp(rng.uniform(-25, 8, n)),
        rng.standard_normal(n) * np.exp(rng.uniform(-25, 8, n)),
    ),
}


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_kernel_equals_the_numpy_path(monkeypatch, dtype, case):
    rng = np.random.default_rng(sorted(CASES).index(case))
    n = 3 * 2048 + 517  # several tiles and a ragged end
    b, t = CASES[case](rng, n)
    with np.errstate(over="ignore"):
        base, tuned = Side(dtype, codes16(b, dtype)), Side(dtype, codes16(t, dtype))
    part, delta = block_part(base, tuned)
    assert isinstance(part, CountedPart) == kernels.HAVE_C
    oracle, delta_ref = numpy_path(monkeypatch, base, tuned)
    assert np.array_equal(delta, delta_ref)
    mine, fig = folded(part)
    ref, fig_ref = folded(oracle)
    kernel_oracle.assert_pair_figures(mine, [(base, tuned)])
    for name in ("base", "tuned", "delta", "ratio"):
        a, c = getattr(mine, name).unpack(), getattr(ref, name).unpack()
        assert np.array_equal(a.counts, c.counts), name
        assert (a.argmax, a.dtype, a.numel) == (c.argmax, c.dtype, c.numel), name
        assert a.max_abs == c.max_abs or (np.isnan(a.max_abs) and np.isnan(c.max_abs)), name
    assert np.array_equal(mine.delta.hist1024, ref.delta.hist1024)
    np.testing.assert_allclose(mine.delta.power_sums, ref.delta.power_sums, rtol=1e-9, atol=1e-300)
    assert (mine.unchanged, mine.flips, mine.numel) == (ref.unchanged, ref.flips, ref.numel)
    # float64 sums added in another order: 1e-12 relative (the cosine, which can be near 0, to 1e-13 absolute)
    for field in ("relative_change", "cosine", "unchanged_fraction", "sign_flip_fraction", "scale"):
        np.testing.assert_allclose(getattr(fig, field), getattr(fig_ref, field), rtol=1e-12, atol=1e-13, err_msg=field)
    assert fig.delta_quantiles == fig_ref.delta_quantiles and fig.ratio_quantiles == fig_ref.ratio_quantiles
    for fit in ("delta_fit", "base_fit", "tuned_fit"):
        assert getattr(fig, fit) == getattr(fig_ref, fit), fit


def test_blocks_fold_into_the_figures_of_the_whole(monkeypatch):
    rng = np.random.default_rng(7)
    w = rng.standard_normal(40_000) * 0.02
    b, t = codes16(w, "BF16"), codes16(w + rng.standard_normal(40_000) * 4e-4, "BF16")
    cuts = [0, 4096, 4097, 20_000, 40_000]
    parts = [
        block_part(Side("BF16", b[a:z]), Side("BF16", t[a:z]), delta=False)[0] for a, z in itertools.pairwise(cuts)
    ]
    _, fig = folded(*parts)
    _, whole = folded(numpy_path(monkeypatch, Side("BF16", b), Side("BF16", t))[0])
    np.testing.assert_allclose(fig.relative_change, whole.relative_change, rtol=1e-12)
    assert fig.delta_quantiles == whole.delta_quantiles and fig.delta_fit == whole.delta_fit
    assert fig.unchanged_fraction == whole.unchanged_fraction


def test_a_block_with_inf_or_nan_takes_the_numpy_path():
    b = codes16(np.array([1.0, 2.0, np.inf, 4.0] * 600), "BF16")
    t = codes16(np.array([1.0, 2.5, 3.0, np.nan] * 600), "BF16")
    part, _ = block_part(Side("BF16", b), Side("BF16", t))
    assert not isinstance(part, CountedPart) and part.nonfinite == 1200


def test_mixed_dtypes_and_quantized_sides_take_the_numpy_path():
    b = codes16(np.ones(100), "BF16")
    assert not isinstance(block_part(Side("BF16", b), Side("F16", codes16(np.ones(100), "F16")))[0], CountedPart)
    decoded = np.ones(100, dtype=np.float32)
    assert not isinstance(block_part(Side("BF16", b), Side("F32", None, decoded))[0], CountedPart)

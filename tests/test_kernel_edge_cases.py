"""Edge cases of the one-pass kernels (kernels.pair16, kernels.f32_pass) and the Y-free sketch, from a red-team
review: each path is compared with the one it replaced (its oracle): the diff's numpy path (kernels.HAVE_C
forced off), the F32 reduction's four passes (reduce.ONE_PASS off), an exact SVD for the sketch.
The tests not named test_ok_* each failed on the first version of the kernels (the comment says what was
wrong and what is right); test_ok_* pin cases that were right from the start.

Without the C kernels (the numpy pass of scripts/test) the same blocks go through the numpy paths, the oracles
themselves: there each test holds them to its own assertions and to the plain numpy of tests/kernel_oracle.py
(the F32 reductions) or to figures taken from the elements directly (the diff's counts and sums)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from weightdiag import kernels, tuning
from weightdiag.codes import HIST_BINS, cohort_bins, f32_bin_tables
from weightdiag.delta.measures import CountedPart, Side, Totals, block_part
from weightdiag.delta.spectrum import Sketch, rank_at
from weightdiag.fit.stats import Summary
from weightdiag.reduce import reduction as reduce_module
from weightdiag.reduce.reduction import reduce_array
from weightdiag.segments import Segments

from . import kernel_oracle as oracle

pytestmark = pytest.mark.kernels
BF16_MAX = float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])


# --------------------------------------------------------------------------------------------- helpers


def bf16(values) -> np.ndarray:
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def side(values, dtype: str) -> Side:
    """A side as the diff builds it: STORAGE_NUMPY is float16 for F16, uint16 for BF16."""
    with np.errstate(over="ignore"):
        if dtype == "F16":
            return Side("F16", np.asarray(values, dtype=np.float16))
        return Side("BF16", bf16(values))


def oracle_parts(monkeypatch, sides):
    with monkeypatch.context() as m:
        m.setattr(kernels, "HAVE_C", False)
        return [block_part(Side(b.dtype, b.stored), Side(t.dtype, t.stored)) for b, t in sides]


def fold(parts) -> Totals:
    totals = Totals()
    for part in parts:
        totals.fold(part)
    totals.finish()
    return totals


COUNTED = "CountedPart" if kernels.HAVE_C else "BlockPart"  # a block pair16 counts (the numpy path without C)


def both_paths(monkeypatch, blocks, dtype: str):
    """(kinds of the new path's parts, new totals, oracle totals) for blocks [(base values, tuned values)]; the
    totals of finite blocks are also held to figures taken from their elements directly."""
    sides = [(side(b, dtype), side(t, dtype)) for b, t in blocks]
    with np.errstate(over="ignore", invalid="ignore"):
        mine = [block_part(b, t) for b, t in sides]
        ref = oracle_parts(monkeypatch, sides)
    kinds = [type(p).__name__ for p, _ in mine]
    totals = fold([p for p, _ in mine])
    oracle.assert_pair_figures(totals, sides)
    return kinds, totals, fold([p for p, _ in ref])


def same_max(a: float, b: float) -> bool:
    return a == b or (np.isnan(a) and np.isnan(b))


def assert_same_totals(mine: Totals, ref: Totals) -> None:
    for name in ("base", "tuned", "delta", "ratio"):
        a, c = getattr(mine, name).unpack(), getattr(ref, name).unpack()
        assert np.array_equal(a.counts, c.counts), name
        assert (a.argmax, a.numel, a.dtype) == (c.argmax, c.numel, c.dtype), name
        assert same_max(a.max_abs, c.max_abs), (name, a.max_abs, c.max_abs)
    assert np.array_equal(mine.delta.hist1024, ref.delta.hist1024)
    # ΔW's central power sums as tests/test_reduce.py compares them (to the scale of the largest sum)
    scale = np.abs(ref.delta.power_sums).max()
    np.testing.assert_allclose(mine.delta.power_sums, ref.delta.power_sums, rtol=1e-9, atol=1e-12 * scale)
    assert (mine.unchanged, mine.flips, mine.numel, mine.nonfinite) == (
        ref.unchanged,
        ref.flips,
        ref.numel,
        ref.nonfinite,
    )
    for f in ("d2", "b2", "t2"):
        np.testing.assert_allclose(getattr(mine, f), getattr(ref, f), rtol=1e-12, atol=1e-300, err_msg=f)
    # <b, t> = (b2 + t2 - d2) / 2 on both paths: rounding to the scale of b2 + t2
    np.testing.assert_allclose(mine.bt, ref.bt, rtol=1e-12, atol=1e-14 * (ref.b2 + ref.t2) + 1e-300)


@pytest.fixture
def split_threads():
    """Every kernel call split over 3 threads (a 1-row view by columns)."""
    with tuning.override(parallel_min=64), kernels.thread_budget(3):
        yield


def one_vs_four(monkeypatch, x: np.ndarray, segments: Segments | None = None):
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    one = reduce_array(bits, "F32", segments)
    with monkeypatch.context() as m:
        m.setattr(reduce_module, "ONE_PASS", False)
        four = reduce_array(bits, "F32", segments)
    assert np.array_equal(one.counts, four.counts) and np.array_equal(one.hist1024, four.hist1024)
    assert (one.argmax, one.n_inf, one.numel, one.shift) == (four.argmax, four.n_inf, four.numel, four.shift)
    assert same_max(one.max_abs, four.max_abs)
    scale = np.abs(four.power_sums).max()
    np.testing.assert_allclose(one.power_sums, four.power_sums, rtol=1e-9, atol=1e-12 * scale)
    oracle.assert_is_the_f32_reduction(one, x, segments)
    return one, four


# --------------------------------------------------------------------------------------------- found wrong, fixed


def test_f16_signed_zeros_are_changed_elements_on_both_paths(monkeypatch):
    # Same-dtype sides compare their stored bit patterns (measures' docstring), so +0 vs -0 is a change, on
    # both paths. Was: the numpy path compared F16 sides as float16 values (+0 == -0): 15 where pair16 said 5.
    b = np.array([0.0] * 10 + [1.0] * 5)
    t = np.array([-0.0] * 10 + [1.0] * 5)
    kinds, mine, ref = both_paths(monkeypatch, [(b, t)], "F16")
    assert kinds == [COUNTED]
    assert mine.unchanged == 5
    assert ref.unchanged == mine.unchanged


def test_f16_nan_block_counts_unchanged_by_stored_bits():
    # A block holding NaN takes the numpy path. Two NaNs with the same payload are unchanged, +0 vs -0 is a change
    # (bits compared). Was: 3 (values compared: the NaNs missed, the signed zeros counted) where the bits say 2.
    base = np.array([0x7E01, 0x3C00, 0x8000, 0x0000], dtype=np.uint16).view(np.float16)
    tuned = np.array([0x7E01, 0x3C00, 0x0000, 0x8000], dtype=np.uint16).view(np.float16)
    part, _ = block_part(Side("F16", base), Side("F16", tuned))
    assert part.nonfinite == 1
    assert part.unchanged == 2


@pytest.mark.parametrize(
    ("case", "dtype"),
    [
        ("mean at a bucket midpoint", "F16"),  # ΔW = 1.00390625 - b, |b| < 1e-5: within 1e-5 of the shift
        ("zero base, tuned ~ 1", "F16"),  # a zero base and a tuned LayerNorm-like weight: ΔW = 1 +- 0.001
        ("one element", "BF16"),  # any single-element block: |d - s| ~ 2^-8 |d| (s: a bucket midpoint)
        ("constant delta", "F16"),  # W_tuned = W_base + c (one bin holds every ΔW)
    ],
)
def test_counted_delta_power_sums_do_not_cancel_when_the_mean_dominates(monkeypatch, case, dtype):
    # The same power sums as the numpy path (which reduces ΔW around its shift) to ~1e-9. Was: pair16 summed
    # d^k around 0 and they were moved to the shift by the binomial expansion, which cancels when |mean| >> std:
    # Σ(d - s)^4 came out negative (ΔW's excess kurtosis -5.9e7 instead of -1.2), 0.3% off (LayerNorm-like),
    # 1e-6 off (one element), 1.1% off (constant ΔW). Now every call sums around its first tile's mean.
    rng = np.random.default_rng(3)
    if case == "mean at a bucket midpoint":
        b, t = rng.uniform(-1e-5, 1e-5, 10_000), np.full(10_000, 1.00390625)
    elif case == "zero base, tuned ~ 1":
        b, t = np.zeros(100_000), 1 + 1e-3 * rng.standard_normal(100_000)
    elif case == "one element":
        b, t = np.array([0.0234375]), np.array([0.0244140625])
    else:
        b, t = np.full(300_000, 0.01), np.full(300_000, 0.02)
    kinds, mine, ref = both_paths(monkeypatch, [(b, t)], dtype)
    assert kinds == [COUNTED]
    assert mine.delta.shift == ref.delta.shift
    np.testing.assert_allclose(mine.delta.power_sums, ref.delta.power_sums, rtol=1e-9)
    if case in ("mean at a bucket midpoint", "zero base, tuned ~ 1"):
        np.testing.assert_allclose(
            Summary(mine.delta).stats.excess_kurtosis, Summary(ref.delta).stats.excess_kurtosis, rtol=1e-6
        )


def test_a_tie_with_an_earlier_numpy_path_block_keeps_the_earlier_block(monkeypatch):
    # Block 0 holds a NaN (numpy path), block 1 is counted; both have the same largest |W_base| (2.0), |W_tuned|,
    # |ΔW| and ratio: the earlier block's argmax wins, as merge() gives it within one kind of block. Was: the
    # counted blocks were merged first whatever their order (base argmax 0 instead of 3, and so on).
    b0, t0 = np.array([0.5, np.nan, 0.25, 2.0, 1.0]), np.array([0.5, 1.0, 0.25, 1.0, 1.0])
    b1, t1 = np.array([2.0, 0.5, 0.25, 1.0]), np.array([1.0, 0.5, 0.25, 1.0])
    kinds, mine, ref = both_paths(monkeypatch, [(b0, t0), (b1, t1)], "BF16")
    assert kinds == ["BlockPart", COUNTED]
    for name in ("base", "tuned", "delta", "ratio"):
        assert getattr(mine, name).argmax == getattr(ref, name).argmax, name


def test_a_strided_stored_side_is_diffed_not_rejected(monkeypatch):
    # A strided side (a view of every other element) is copied contiguous first. Was: "ValueError: ndarray is not
    # C-contiguous" from pair16 (the diff's reader always hands contiguous blocks; the API need not).
    rng = np.random.default_rng(0)
    b, t = bf16(rng.standard_normal(400)), bf16(rng.standard_normal(400))
    base, tuned = Side("BF16", b[::2]), Side("BF16", t[::2])
    part, _ = block_part(base, tuned)
    ((ref, _),) = oracle_parts(monkeypatch, [(base, tuned)])
    assert_same_totals(fold([part]), fold([ref]))


# --------------------------------------------------------------------------------------------- pair16: verified OK


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 9, 2047, 2048, 2049, 4095, 4097])
def test_ok_pair16_lengths(monkeypatch, dtype, n):
    rng = np.random.default_rng(n)
    b = rng.standard_normal(n) * 0.02 + 0.01  # no exact zeros (F16 signed zeros: tested above)
    t = b + rng.standard_normal(n) * 1e-3
    kinds, mine, ref = both_paths(monkeypatch, [(b, t)], dtype)
    assert kinds == [COUNTED]
    assert_same_totals(mine, ref)


@pytest.mark.parametrize(
    "case",
    ["f16 subnormals", "all ties", "all zero", "both -0", "bf16 subnormals", "huge count in one bin", "wide range"],
)
@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_ok_pair16_edge_blocks(monkeypatch, case, dtype):
    rng = np.random.default_rng(5)
    n = 5000
    if case == "f16 subnormals":
        b = rng.integers(1, 1024, n) * 2.0**-24 * rng.choice([-1, 1], n)
        t = rng.integers(1, 1024, n) * 2.0**-24 * rng.choice([-1, 1], n)
    elif case == "all ties":  # every element ties for the largest |b|, |t|, |ΔW| and ratio: the first wins
        b, t = np.tile([1.5, -1.5], n // 2), np.tile([-1.5, 1.5], n // 2)
    elif case == "all zero":  # ratio 0/0: NaN codes, no finite largest ratio
        b, t = np.zeros(n), np.zeros(n)
    elif case == "both -0":
        b, t = np.full(n, -0.0), np.full(n, -0.0)
    elif case == "bf16 subnormals":
        b, t = rng.standard_normal(n) * 1e-39, rng.standard_normal(n) * 1e-39
    elif case == "huge count in one bin":
        n = 300_000
        b, t = np.full(n, 0.01), np.full(n, 0.02)
    else:
        b = rng.standard_normal(n) * np.exp(rng.uniform(-80, 80, n))
        t = rng.standard_normal(n) * np.exp(rng.uniform(-80, 80, n))
        if dtype == "F16":
            b, t = np.clip(b, -6e4, 6e4), np.clip(t, -6e4, 6e4)
    if dtype == "F16" and case != "both -0":
        # values that round to an F16 zero: +0 on both sides. Where every ΔW is ±0, the numpy path's Σ ΔW² comes
        # from its F32 reduction's bucket midpoints (-1e-93: rounding) and pair16's is exactly 0.
        with np.errstate(over="ignore"):
            b = np.where(np.float16(b) == 0, 0.0, b)
            t = np.where(np.float16(t) == 0, 0.0, t)
    kinds, mine, ref = both_paths(monkeypatch, [(b, t)], dtype)
    assert kinds == [COUNTED]
    assert_same_totals(mine, ref)


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_ok_pair16_every_finite_code_against_zero(monkeypatch, dtype):
    """ΔW = every finite code (and its negation): counts, cohort bins at every edge, largest, ratio Inf/NaN."""
    limit = {"BF16": 0x7F80, "F16": 0x7C00}[dtype]
    codes = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    codes = codes[(codes & 0x7FFF) < limit]
    stored = codes.view(np.float16) if dtype == "F16" else codes
    zero = np.zeros_like(stored)
    for base, tuned in ((Side(dtype, zero), Side(dtype, stored)), (Side(dtype, stored), Side(dtype, zero))):
        part, delta = block_part(base, tuned)
        assert isinstance(part, CountedPart) == kernels.HAVE_C
        ((ref, ref_delta),) = oracle_parts(monkeypatch, [(base, tuned)])
        assert np.array_equal(delta, ref_delta)
        mine = fold([part])
        assert_same_totals(mine, fold([ref]))
        bins = cohort_bins(delta)
        inside = (bins >= 0) & (bins < HIST_BINS)
        assert np.array_equal(mine.delta.hist1024, np.bincount(bins[inside], minlength=HIST_BINS))


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_ok_overflowing_or_nonfinite_delta_takes_the_numpy_path(monkeypatch, dtype):
    rng = np.random.default_rng(2)
    big = BF16_MAX if dtype == "BF16" else 65504.0  # F16: 2 x 65504 is finite in float32 (counted)
    b = np.r_[np.full(10, -big), rng.standard_normal(100)]
    t = np.r_[np.full(10, big), rng.standard_normal(100)]
    kinds, mine, ref = both_paths(monkeypatch, [(b, t)], dtype)
    assert kinds == (["BlockPart"] if dtype == "BF16" else [COUNTED])
    assert_same_totals(mine, ref)
    b2, t2 = np.r_[np.inf, rng.standard_normal(10)], np.r_[np.inf, rng.standard_normal(10)]
    kinds, mine, ref = both_paths(monkeypatch, [(b2, t2)], dtype)
    assert kinds == ["BlockPart"] and mine.nonfinite == 1


def test_ok_ties_across_counted_blocks_keep_the_first_block(monkeypatch):
    rng = np.random.default_rng(4)
    blocks = []
    for k in range(3):
        b = rng.standard_normal(3000) * 0.1
        t = b + rng.standard_normal(3000) * 0.01
        b[100 * (3 - k)], t[50 * (3 - k)] = 2.0, -2.0  # equal largest in every block, at different places
        blocks.append((b, t))
    kinds, mine, ref = both_paths(monkeypatch, blocks, "BF16")
    assert kinds == [COUNTED] * 3
    assert_same_totals(mine, ref)
    assert mine.base.argmax == 300 and mine.tuned.argmax == 150


def test_ok_a_block_counts_the_same_in_every_thread_and_leaves_nothing_behind():
    """Blocks counted in the main thread and in three others at once give the same figures; with C, each thread's
    pair16 scratch tables are left zero after every call (the numpy path keeps no state)."""
    rng = np.random.default_rng(6)
    calls = [
        (rng.standard_normal(5000), rng.standard_normal(5000)),
        (np.r_[np.nan, np.inf, 1.0], np.r_[1.0, np.inf, -np.inf]),  # non-finite: counted, then dropped
        (np.zeros(0), np.zeros(0)),
        (np.full(70_000, 0.5), np.full(70_000, -0.5)),
    ]

    def work() -> list:
        out = []
        for b, t in calls:
            with np.errstate(invalid="ignore"):
                part, _ = block_part(side(b, "BF16"), side(t, "BF16"), delta=False)
            totals = fold([part])
            out.append(
                (
                    totals.unchanged,
                    totals.flips,
                    totals.nonfinite,
                    [(r.argmax, r.counts.sum()) for r in (totals.base, totals.tuned, totals.delta, totals.ratio)],
                    totals.d2,
                )
            )
            if kernels.HAVE_C:
                assert not kernels._pair_scratch.tables.any()
        return out

    first = work()
    results = []
    threads = [threading.Thread(target=lambda: results.append(work())) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 3
    for r in results:
        assert repr(r) == repr(first)


# --------------------------------------------------------------------------------------------- f32_pass: verified OK


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 7, 8, 9, 2047, 2048, 2049, 4095, 4097])
def test_ok_f32_one_pass_lengths(monkeypatch, threads, n):
    with tuning.override(parallel_min=64), kernels.thread_budget(threads):
        x = (np.random.default_rng(n).standard_normal(n) * 0.02).astype(np.float32)
        one_vs_four(monkeypatch, x)


@pytest.mark.parametrize(
    "case",
    [
        "tie across pieces, later first",
        "tie across pieces, earlier first",
        "one nan",
        "one inf",
        "all zero",
        "all -0",
        "all ties",
        "inf and nan everywhere",
        "float32 extremes",
        "subnormals",
        "at the bin thresholds",
        "large mean with nan",
    ],
)
def test_ok_f32_one_pass_edge_cases(monkeypatch, split_threads, case):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(5000) * 0.02).astype(np.float32)
    if case == "tie across pieces, later first":
        x[[4000, 100]] = [-1.0, 1.0]
    elif case == "tie across pieces, earlier first":
        x[[100, 4000]] = [-1.0, 1.0]
    elif case == "one nan":
        x = np.array([np.nan], dtype=np.float32)
    elif case == "one inf":
        x = np.array([-np.inf], dtype=np.float32)
    elif case == "all zero":
        x = np.zeros(5000, dtype=np.float32)
    elif case == "all -0":
        x = np.full(5000, -0.0, dtype=np.float32)
    elif case == "all ties":
        x = np.tile(np.float32([2, -2]), 2500)
    elif case == "inf and nan everywhere":
        x[::7] = np.inf
        x[3::11] = np.nan
        x[5::13] = -np.inf
    elif case == "float32 extremes":
        x[[3, 9, 4000]] = [3.4028235e38, -3.4028235e38, 1e-45]
    elif case == "subnormals":
        x = (rng.standard_normal(5000) * 1e-41).astype(np.float32)
    elif case == "at the bin thresholds":
        thr = f32_bin_tables().thresholds
        t = thr[thr != 0xFFFFFFFF].astype(np.int64)
        pats = np.unique(np.concatenate([t - 1, t, t + 1])).astype(np.uint32)
        x = np.concatenate([pats, pats | np.uint32(0x80000000)]).view(np.float32)
    else:
        x = (np.float32(1000) + x * np.float32(1e-3)).astype(np.float32)
        x[[9, 4000]] = [np.nan, np.inf]
    one, _ = one_vs_four(monkeypatch, x)
    if case.startswith("tie across"):
        assert one.argmax == 100
    if case == "at the bin thresholds":  # the corrections equal the cohort's own binning
        bins = cohort_bins(x)
        inside = (bins >= 0) & (bins < HIST_BINS)
        assert np.array_equal(one.hist1024, np.bincount(bins[inside], minlength=HIST_BINS))


@pytest.mark.parametrize(
    "segments",
    [
        Segments(offset=3, length=7, stride=50, count=90),
        Segments(offset=3, length=1, stride=50, count=90),
        Segments(offset=3, length=0, stride=50, count=90),
        Segments(offset=5, length=4500, stride=4500, count=1),  # one row, split by columns
        Segments(offset=5, length=40, stride=90, count=55),
    ],
)
def test_ok_f32_one_pass_strided_segments(monkeypatch, split_threads, segments):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(5000) * 0.02).astype(np.float32)
    x[[4000, 100, 3000]] = [-1.0, 1.0, 1.0]
    one, _ = one_vs_four(monkeypatch, x, segments)
    if segments.numel:
        sel = segments.view(x).reshape(-1)
        assert one.max_abs == np.abs(sel).max()
        assert np.abs(x[one.argmax]) == one.max_abs
    # with a large mean (sums around the first tile's mean, never cancelling) and a NaN inside the selection
    y = (np.float32(1000) + x * np.float32(1e-3)).astype(np.float32)
    y[[5, 6, 7, 8, 9, 10]] = np.nan
    one_vs_four(monkeypatch, y, segments)


# --------------------------------------------------------------------------------------------- the sketch: verified OK


def _feed(acc: Sketch, a: np.ndarray, rows: int) -> Sketch:
    for r0 in range(0, a.shape[0], rows):
        acc.fold(acc.block_part(r0, a[r0 : r0 + rows]))
    return acc


@pytest.mark.parametrize(
    ("m", "n", "rank", "cap", "rows"),
    [
        (300, 1200, 0, 32, 37),  # zero ΔW
        (300, 1200, 1, 32, 37),  # rank 1
        (300, 1200, 1, 1, 50),  # rank 1 = k = 1
        (300, 1200, 32, 32, 37),  # rank exactly k
        (20, 1200, 20, 32, 7),  # m < cap: k = l = m, full rank
        (20, 1200, 5, 32, 7),  # m < cap, rank-deficient
        (1, 1200, 1, 32, 1),  # one row
        (2, 1200, 1, 32, 1),
    ],
)
def test_ok_sketch_of_rank_deficient_deltas(m, n, rank, cap, rows):
    rng = np.random.default_rng(m + rank)
    a = (rng.standard_normal((m, rank)) @ rng.standard_normal((rank, n)) / np.sqrt(max(rank, 1))).astype(np.float32)
    total = float(np.sum(a.astype(np.float64) ** 2))
    spec = _feed(Sketch(m, n, seed=1, cap=cap), a, rows).result(total)
    s = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    truth = rank_at(s**2, total)
    assert spec.rank90 == truth and spec.rank90_range == (truth, truth)
    assert len(spec.singular) <= min(rank, 8) or rank == 0
    np.testing.assert_allclose(spec.singular, s[: len(spec.singular)], rtol=1e-4)
    assert spec.error < 1e-4
    if rank == 0:
        assert spec.singular == () and spec.error == 0.0

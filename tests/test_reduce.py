"""The reducers: C == numpy == torch, exact statistics, strided parts, damaged values. Every test here is a kernel
test (scripts/test runs them again on the numpy kernels); those of each implementation hold it to
tests/kernel_oracle.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from weightdiag import kernels, tuning
from weightdiag.codes import code_values, f32_bin_tables
from weightdiag.fit.stats import cohort_histogram, magnitudes, matrix_stats
from weightdiag.reduce import reduction as reduce_module
from weightdiag.reduce.reduction import Reduction, merge, reduce_array, reduce_range
from weightdiag.reduce.reduction_torch import reduce_torch, upload
from weightdiag.segments import Segments
from weightdiag.testing import synthetic

from . import kernel_oracle as oracle

pytestmark = pytest.mark.kernels

RNG = np.random.default_rng(11)


def _bf16(x):
    return synthetic.to_bf16_bits(np.asarray(x, dtype=np.float32))


def _same(a: Reduction, b: Reduction, sums_atol: np.ndarray | None = None):
    """Equal reductions: counts, histogram, argmax and max exactly; F32 power sums to rtol 1e-9, or within
    `sums_atol` (summation_bound) where they are summed in another order."""
    assert a.dtype == b.dtype
    assert a.numel == b.numel
    assert a.exact == b.exact
    assert np.array_equal(a.counts, b.counts)
    assert a.argmax == b.argmax
    assert a.max_abs == b.max_abs or (np.isnan(a.max_abs) and np.isnan(b.max_abs))
    if a.hist1024 is not None:
        assert np.array_equal(a.hist1024, b.hist1024)
        if sums_atol is None:
            np.testing.assert_allclose(a.power_sums, b.power_sums, rtol=1e-9, atol=1e-12)
        else:
            assert np.all(np.abs(np.asarray(a.power_sums) - np.asarray(b.power_sums)) <= sums_atol)


def summation_bound(values: np.ndarray, shift: float) -> np.ndarray:
    """How far two float64 sums of the F32 power-sum terms (d, d^2, d^3, d^4, |x|; d = x - shift) can differ
    when only the order of summation differs: each is within (n - 1) * eps64 / 2 * sum |term| of the exact
    sum (the recursive-summation bound, Higham, Accuracy and Stability of Numerical Algorithms, 4.2; pairwise
    and blocked orders are tighter), so two of them within n * eps64 * sum |term|. The terms themselves are the
    same float64 operations on both devices. Relative to the sums themselves this is no fixed figure: the odd
    sums (d, d^3) cancel, which is why CUDA's 1.6e-8 relative difference (issue 19) failed an rtol of 1e-9."""
    x = values[np.isfinite(values)].astype(np.float64)
    d = np.abs(x - shift)
    magnitudes = np.array([d.sum(), (d * d).sum(), (d**3).sum(), (d**4).sum(), np.abs(x).sum()])
    return x.size * np.finfo(np.float64).eps * magnitudes


def test_power_sums_in_another_order_stay_within_the_summation_bound():
    """The bound holds for numpy's pairwise sums against a strictly sequential order (cumsum) of the same
    terms, on the CUDA test's sizes; and it is not so loose that it would pass anything."""
    x = (RNG.standard_normal(2048 * 1536) * 0.02).astype(np.float32)
    shift = float(np.mean(x[:1000], dtype=np.float64))
    d = x.astype(np.float64) - shift
    terms = [d, d * d, d * d * d, (d * d) * (d * d), np.abs(x.astype(np.float64))]
    pairwise = np.array([t.sum() for t in terms])
    sequential = np.array([np.cumsum(t)[-1] for t in terms])
    bound = summation_bound(x, shift)
    assert np.all(np.abs(pairwise - sequential) <= bound)
    assert np.all(bound < 1e-6 * np.abs(pairwise[[1, 3, 4]]).max())


def _kernel_inputs():
    x = (RNG.standard_t(4, (300, 257)) * 0.02).astype(np.float32)
    x[3, 4] = np.nan
    x[7, 8] = np.inf
    bits16 = _bf16(np.nan_to_num(x, nan=0.0, posinf=0.0))
    bits16[5] = 0x7FC0  # NaN
    bits16[9] = 0xFF80  # -Inf
    bits16[200, 100] = 0x4300  # a unique largest |w| (128.0) ...
    bits16[250, 10] = 0xC300  # ... and a tie later: the first one must win
    view16 = bits16.reshape(-1)[7 : 7 + 13 * 5900].reshape(-1, 13)[:, 2:9]  # strided rows
    view32 = x.view(np.uint32).reshape(-1)[3 : 3 + 11 * 7000].reshape(-1, 11)[:, 1:10]
    return x, view16, view32


@pytest.fixture(params=["whole", "pieces"])
def pieces(request) -> str:
    """The kernels as they run on one core, or with every view split over 3 threads and the numpy kernels' steps
    of 1,000 elements (so threads and steps end inside rows, and a one-row view is split by columns)."""
    split = request.param == "pieces"
    changes = {"parallel_min": 64, "numpy_chunk": 1000} if split else {}
    with tuning.override(**changes), kernels.thread_budget(3 if split else 1):
        yield request.param


def test_each_kernel_equals_the_plain_count(kernel_backend, pieces):
    """Was test_c_and_numpy_kernels_agree (C against the numpy kernels, skipped without C): now both against the
    plain numpy of tests/kernel_oracle.py, so the numpy pass holds the fallback to something else than itself."""
    x, view16, view32 = _kernel_inputs()
    one_row16 = np.ascontiguousarray(view16).reshape(1, -1)
    for view in (view16, one_row16):
        counts, at = kernels.count_codes16(view, 0x7F80)
        assert np.array_equal(counts, oracle.hist16(view))
        assert at == oracle.first_largest_finite(view & 0x7FFF, (view & 0x7FFF) < 0x7F80)
    t = f32_bin_tables()
    irregular = t.irregular.copy()
    irregular[np.flatnonzero(t.thresholds != 0xFFFFFFFF)[:3]] = [0, 1, 2]  # exercise the irregular path
    for view in (view32, np.ascontiguousarray(view32).reshape(1, -1)):
        for n_irr in (0, 3):
            counts, above, irregular_hist, at = kernels.count_f32(view, t.thresholds, irregular, n_irr)
            want = oracle.hist32(view, t.thresholds, irregular, n_irr)
            for got, expected in zip((counts, above, irregular_hist), want, strict=True):
                assert np.array_equal(got, expected)
            mags = view & 0x7FFFFFFF
            assert at == oracle.first_largest_finite(mags, mags < oracle.F32_INF)
    _, _, _, at = kernels.count_f32(np.full((2, 3), np.nan, dtype=np.float32).view(np.uint32), t.thresholds, None, 0)
    assert at == -1
    for view, mask, target in (
        (view16, 0x7FFF, 0x4300),
        (view16, 0xFFFF, 0xC300),
        (view16, 0xFFFF, 0x1234),
        (one_row16, 0xFFFF, int(one_row16[0, -3])),
        (view32, 0x7FFFFFFF, int(view32[5, 3]) & 0x7FFFFFFF),
    ):
        assert kernels.find_first(view, mask, target) == oracle.find_first(view, mask, target)
    finite = np.nan_to_num(x, nan=0.0, posinf=0.0)
    for view in (finite, finite.reshape(1, -1), finite[::3, 5:200]):
        np.testing.assert_allclose(kernels.power_sums(view, 0.001), oracle.power_sums(view, 0.001), rtol=1e-10)


def test_argmax_is_the_first_largest_finite_value():
    _, view16, _ = _kernel_inputs()
    _, at = kernels.count_codes16(view16, 0x7F80)
    row, col = divmod(at, view16.shape[1])
    assert int(view16[row, col]) & 0x7FFF == 0x4300  # 128.0: the first of the two, NaN/Inf ignored
    flat = np.asarray(view16).reshape(-1)
    assert at == int(np.flatnonzero((flat & 0x7FFF) == 0x4300)[0])


def test_threaded_split_gives_the_same_answer():
    x, view16, view32 = _kernel_inputs()
    whole16 = kernels.count_codes16(view16, 0x7F80)
    t = f32_bin_tables()
    whole32 = kernels.count_f32(view32, t.thresholds, t.irregular, len(t.irregular_bins))
    sums = kernels.power_sums(np.nan_to_num(x, nan=0.0, posinf=0.0), 0.0)
    with tuning.override(parallel_min=64), kernels.thread_budget(3):
        one_row = np.ascontiguousarray(view16).reshape(1, -1)
        for view, pieces in ((view16, 3), (one_row, 3), (view16[:2], 1)):  # by rows, by columns, too few rows
            assert len(kernels._pieces(view)) == pieces
            split = kernels.count_codes16(view, 0x7F80)
            assert np.array_equal(split[0], kernels._hist16_numpy(view))
            assert split[1] == kernels._find_numpy(view, 0x7FFF, 0x4300) or view.shape[0] == 2
        assert kernels.count_codes16(view16, 0x7F80)[1] == whole16[1]
        split32 = kernels.count_f32(view32, t.thresholds, t.irregular, len(t.irregular_bins))
        for u, v in zip(split32, whole32, strict=True):
            assert np.array_equal(u, v)
        np.testing.assert_allclose(kernels.power_sums(np.nan_to_num(x, nan=0.0, posinf=0.0), 0.0), sums, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32", "F64"])
def test_torch_reducer_on_cpu_equals_numpy_reducer(dtype):
    x = RNG.standard_normal((96, 130)) * 0.05
    x[2, 3] = 4.0
    raw_values = {"BF16": _bf16(x), "F16": x.astype(np.float16), "F32": x.astype(np.float32), "F64": x}[dtype]
    raw = raw_values.reshape(-1).view(np.uint8)
    seg_whole = Segments.whole(x.size)
    _same(reduce_torch(raw, dtype, "cpu"), reduce_array(raw_values.reshape(-1), dtype))
    part = Segments(offset=130 * 10, length=130 * 4, stride=130 * 12, count=7)  # strided row groups
    _same(reduce_torch(raw, dtype, "cpu", part), reduce_array(raw_values.reshape(-1), dtype, part))
    uploaded = upload(raw, dtype, "cpu")  # the fused-tensor path: one copy, several parts
    _same(reduce_torch(uploaded, dtype, "cpu", part), reduce_array(raw_values.reshape(-1), dtype, part))
    assert reduce_array(raw_values.reshape(-1), dtype, seg_whole).argmax == 2 * 130 + 3


@pytest.mark.parametrize("path", ["whole", "merged", "torch"])
def test_f32_moments_of_abs_w_are_exact(path):
    """mean |w| and std |w| of F32 come from float64 sums, not bucket midpoints (up to 2^-8 off)."""
    x = (RNG.standard_normal(300_007) * 0.02 + 0.003).astype(np.float32)
    x[::997] *= 40  # a tail, so that bucket midpoints would be visibly off
    values = x.astype(np.float64)
    bits = x.view(np.uint32)
    if path == "whole":
        red = reduce_array(bits, "F32")
    elif path == "merged":
        step = 65_536
        red = merge([p for lo in range(0, x.size, step) for p in reduce_range(bits[lo : lo + step], "F32", None, lo)])
    else:
        red = reduce_torch(x.view(np.uint8), "F32", "cpu")
    stats = matrix_stats(red)
    assert stats.mean_abs == pytest.approx(np.abs(values).mean(), rel=1e-12)
    assert stats.std_abs == pytest.approx(np.abs(values).std(), rel=1e-9)
    folded = (red.counts[:32768] + red.counts[32768:])[:0x7F80]  # finite buckets
    midpoint_mean_abs = float(np.dot(folded, code_values("F32")[:0x7F80])) / x.size
    assert abs(midpoint_mean_abs / np.abs(values).mean() - 1) > 1e-7  # the old estimate would fail the check above


def test_bf16_statistics_are_exact():
    x = (RNG.standard_normal(200_003) * 0.03 + 0.001).astype(np.float32)
    bits = _bf16(x)
    values = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # the stored values
    stats = matrix_stats(reduce_array(bits, "BF16"))
    assert stats.mean == pytest.approx(values.mean(), rel=1e-12)
    assert stats.std == pytest.approx(values.std(), rel=1e-12)
    kurt = ((values - values.mean()) ** 4).mean() / values.var() ** 2 - 3
    assert stats.excess_kurtosis == pytest.approx(kurt, rel=1e-9)
    assert stats.mean_abs == pytest.approx(np.abs(values).mean(), rel=1e-12)
    assert stats.std_abs == pytest.approx(np.abs(values).std(), rel=1e-9)
    assert stats.max_abs == np.abs(values).max()
    srt = np.sort(np.abs(values))
    assert stats.q99_abs == srt[int(np.ceil(0.99 * srt.size)) - 1]  # inverted-CDF quantile


def test_f32_moments_are_exact_and_quantiles_close():
    x = (RNG.standard_normal(100_000) * 0.02 + 3.0).astype(np.float32)  # |mean| >> std: no cancellation
    stats = matrix_stats(reduce_array(x, "F32"))
    xd = x.astype(np.float64)
    assert stats.mean == pytest.approx(xd.mean(), rel=1e-12)
    assert stats.std == pytest.approx(xd.std(), rel=1e-9)
    assert stats.max_abs == float(np.abs(x).max())
    assert stats.q99_abs == pytest.approx(np.quantile(np.abs(xd), 0.99), rel=2**-8)


def test_nan_inf_are_counted_and_excluded():
    x = RNG.standard_normal(10_000).astype(np.float32) * 0.02
    x[:3] = np.nan
    x[3:5] = np.inf
    x[5] = -np.inf
    for dtype, raw in (("F32", x), ("BF16", _bf16(np.nan_to_num(x, nan=0, posinf=0, neginf=0)))):
        if dtype == "BF16":
            raw[:3] = 0x7FC1
            raw[3:5] = 0x7F80
            raw[5] = 0xFF80
        red = reduce_array(raw, dtype)
        stats = matrix_stats(red)
        assert (stats.n_nan, stats.n_inf, stats.n_finite) == (3, 3, 9_994)
        assert np.isfinite(stats.mean)
        assert np.isfinite(stats.std)
        assert red.argmax >= 6
        assert np.isfinite(red.max_abs)
        assert cohort_histogram(red).sum() <= 9_994


def test_all_nonfinite_tensor_has_no_argmax():
    red = reduce_array(np.full(200, np.nan, dtype=np.float32), "F32")
    assert red.argmax == -1
    assert np.isnan(red.max_abs)
    assert matrix_stats(red).n_nan == 200


def test_fp8_codes_decode_like_torch():
    for name, tdtype in (("F8_E4M3", torch.float8_e4m3fn), ("F8_E5M2", torch.float8_e5m2)):
        ours = code_values(name)
        theirs = torch.arange(256, dtype=torch.uint8).view(tdtype).to(torch.float64).numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(theirs))
        ok = ~np.isnan(ours)
        assert np.array_equal(ours[ok], theirs[ok])


def test_fp8_tensor_reduces_exactly():
    x = torch.from_numpy(RNG.standard_normal(5000).astype(np.float32) * 0.1).to(torch.float8_e4m3fn)
    raw = x.view(torch.uint8).numpy()
    red = reduce_array(raw, "F8_E4M3")
    values = x.to(torch.float64).numpy()
    assert matrix_stats(red).std == pytest.approx(values.std(), rel=1e-12)
    assert red.max_abs == np.abs(values).max()


def test_magnitude_distribution_folds_signs():
    x = np.array([-0.5, 0.5, 0.25, -0.0, 0.0, 1.0], dtype=np.float32)
    dist = magnitudes(reduce_array(_bf16(x), "BF16"))
    assert dist.values.tolist() == [0.0, 0.25, 0.5, 1.0]
    assert dist.counts.tolist() == [2, 1, 2, 1]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_cuda_reducer_equals_cpu_reducer(dtype):
    x = RNG.standard_normal((2048, 1536)) * 0.02
    x[100, 7] = -3.5
    raw_values = {"BF16": _bf16(x), "F16": x.astype(np.float16), "F32": x.astype(np.float32)}[dtype]
    raw = raw_values.reshape(-1).view(np.uint8)
    # Everything equal but the F32 power sums, which CUDA adds up in another order (summation_bound).
    cpu = reduce_array(raw_values.reshape(-1), dtype)
    bound = summation_bound(raw_values.reshape(-1), cpu.shift) if dtype == "F32" else None
    _same(reduce_torch(raw, dtype, "cuda"), cpu, bound)
    part = Segments(offset=1536 * 8, length=1536 * 8, stride=1536 * 24, count=80)
    cpu_part = reduce_array(raw_values.reshape(-1), dtype, part)
    part_values = part.view(raw_values.reshape(-1)).reshape(-1)
    bound = summation_bound(part_values, cpu_part.shift) if dtype == "F32" else None
    _same(reduce_torch(raw, dtype, "cuda", part), cpu_part, bound)


def test_f32_bin_tables_from_windows_equal_the_whole_bucket_scan():
    """The tables look at 2 x 1,024 patterns around each bin edge: the same thresholds and irregular buckets
    as evaluating float32 log10 on all 65,536 patterns of every split bucket (the construction they replace)."""
    from weightdiag.codes import F32BinTables

    fast, whole = f32_bin_tables(), F32BinTables(window=None)
    assert np.array_equal(fast.thresholds, whole.thresholds)
    assert np.array_equal(fast.irregular, whole.irregular)
    assert np.array_equal(fast.irregular_bins, whole.irregular_bins)
    assert (fast.thresholds != 0xFFFFFFFF).sum() > 1000  # the edges are really crossed inside buckets


def test_f32_bin_tables_fall_back_to_the_whole_bucket_when_the_window_misses_the_crossing():
    from weightdiag.codes import F32BinTables

    tiny = F32BinTables(window=0)  # a window of one pattern: almost every bucket takes the whole scan
    assert np.array_equal(tiny.thresholds, f32_bin_tables().thresholds)


def _four_passes(monkeypatch, bits: np.ndarray, segments=None):
    """The F32 reduction as it was before the one-pass kernel (hist32, max, find, power sums)."""
    with monkeypatch.context() as m:
        m.setattr(reduce_module, "ONE_PASS", False)
        return reduce_array(bits, "F32", segments)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(
    "case",
    ["gaussian", "inf and nan", "ties of the largest", "large mean", "all nan", "strided rows"],
)
def test_the_one_pass_f32_reduction_equals_the_four_passes(kernel_backend, monkeypatch, threads, case):
    """With C, the one pass (kernels.f32_pass) against the four it replaced; on either kernels, the reduction
    against the plain numpy of its elements (the numpy kernels take the four passes)."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(50 * 2048 + 13) * 0.02).astype(np.float32)
    if case == "inf and nan":
        x[[5, 70_000]] = [np.inf, -np.inf]
        x[[9, 30_001]] = np.nan
    if case == "ties of the largest":
        x[[40_000, 17, 90_000]] = [-0.75, 0.75, 0.75]  # the first is 17
    if case == "large mean":
        x = (1000.0 + x * 1e-3).astype(np.float32)  # mean^2 / variance ~ 1e18: sums around 0 would cancel
    if case == "all nan":
        x[:] = np.nan
    # one row (split by columns across threads), or every other run of 1,000 (rows of a strided view)
    segments = Segments(offset=7, length=1000, stride=2000, count=50) if case == "strided rows" else None
    bits = x.view(np.uint32)
    with tuning.override(parallel_min=64), kernels.thread_budget(threads):
        one = reduce_array(bits, "F32", segments)
        four = _four_passes(monkeypatch, bits, segments)
    assert np.array_equal(one.counts, four.counts) and np.array_equal(one.hist1024, four.hist1024)
    assert (one.argmax, one.n_inf, one.numel, one.shift) == (four.argmax, four.n_inf, four.numel, four.shift)
    assert one.max_abs == four.max_abs or (np.isnan(one.max_abs) and np.isnan(four.max_abs))
    # the central sums: as precise as the four passes' (the first one, near 0 by the shift, to its scale)
    scale = np.abs(four.power_sums).max()
    np.testing.assert_allclose(one.power_sums, four.power_sums, rtol=1e-9, atol=1e-12 * scale)
    if case == "ties of the largest":
        assert one.argmax == 17
    oracle.assert_is_the_f32_reduction(one, x, segments)


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_torch_reducer_across_chunks_without_host_syncs(monkeypatch, knobs, dtype):
    """The torch path in many chunks (replicated bins, the largest |w| read back once per tensor): the same
    reduction as the CPU path, ties across chunks going to the first, Inf/NaN left out, a partial last chunk."""

    knobs(torch_chunk=1000)
    x = RNG.standard_normal(10_357) * 0.02
    x[[7_500, 2_345, 9_999]] = [-1.5, 1.5, 1.5]  # ties in three chunks: the first (2,345) is the argmax
    x[[10, 5_000]] = [np.inf, np.nan]
    raw_values = {"BF16": _bf16(x), "F16": x.astype(np.float16), "F32": x.astype(np.float32)}[dtype]
    raw = raw_values.reshape(-1).view(np.uint8)
    torch_red, cpu_red = reduce_torch(raw, dtype, "cpu"), reduce_array(raw_values.reshape(-1), dtype)
    _same(torch_red, cpu_red)
    assert torch_red.argmax == 2_345
    part = Segments(offset=3, length=700, stride=1_300, count=7)  # rows that straddle the chunks
    _same(reduce_torch(raw, dtype, "cpu", part), reduce_array(raw_values.reshape(-1), dtype, part))


def test_hist16_counts_views_at_every_alignment():
    """The C kernel loads eight codes as two 64-bit words: rows that start at any even address, strided rows and
    row lengths around multiples of eight count exactly as the plain count does."""
    rng = np.random.default_rng(7)
    flat = rng.integers(0, 65536, 4096, dtype=np.uint16)
    for start in range(5):
        for cols in (1, 7, 8, 9, 15, 16, 17, 63):
            for stride in (cols, cols + 3):
                rows = min(5, (flat.size - start) // stride)
                view = np.lib.stride_tricks.as_strided(
                    flat[start:], shape=(rows, cols), strides=(2 * stride, 2), writeable=False
                )
                counts, _ = kernels.count_codes16(view, 0x7F80)
                assert np.array_equal(counts, oracle.hist16(np.ascontiguousarray(view))), (start, cols, stride)


def _grid_probe_by_every_group(codes: np.ndarray, row_length: int) -> tuple[int, int] | None:
    """grid_probe as first written (every group size tried on the whole sample), the oracle of its early exit."""
    rows = max(1, min(reduce_module.GRID_SAMPLE // row_length, codes.size // row_length))
    sample = codes[: rows * row_length].reshape(rows, row_length)
    if np.unique(sample).size <= 4 * reduce_module.GRID_LEVELS:
        return None
    for group in reduce_module.GRID_GROUPS:
        if row_length % group or rows * row_length < 8 * group:
            continue
        with np.errstate(invalid="ignore"):
            distinct = 1 + np.count_nonzero(np.diff(np.sort(sample.reshape(-1, group), axis=1), axis=1), axis=1)
        if int(distinct.max()) <= reduce_module.GRID_LEVELS:
            return 4, group
    return None


def test_grid_probe_settles_trained_weights_early_with_the_same_answer():
    """grid_probe decides most matrices from their first groups of 32: on grids of each group size, grids broken
    in a later group, trained-like weights, few distinct values and non-finite floats, it answers as trying every
    group size on the whole sample does."""
    rng = np.random.default_rng(11)
    grids = 0
    for trial in range(600):
        row_length = int(rng.choice([32, 48, 64, 96, 128, 256, 100, 2048]))
        n = int(rng.integers(1, 40)) * row_length
        kind = trial % 5
        if kind == 0:  # trained-like: every value distinct
            codes = rng.integers(0, 65536, n).astype(np.uint16)
        elif kind == 1:  # a 4-bit grid per group of 32, 64 or 128
            group = int(rng.choice([32, 64, 128]))
            codes = (rng.integers(0, 16, n) + (np.arange(n) // group) * 7).astype(np.uint16)
        elif kind == 2:  # a grid broken by one value past the first groups
            codes = (rng.integers(0, 16, n) + (np.arange(n) // 32) * 3).astype(np.uint16)
            codes[int(rng.integers(min(n, 300), n)) if n > 300 else n - 1] = 60000
        elif kind == 3:  # few distinct values overall
            codes = rng.integers(0, int(rng.integers(1, 80)), n).astype(np.uint16)
        else:  # floats with Inf and NaN
            codes = rng.standard_normal(n).astype(np.float32)
            codes[rng.integers(0, n, max(1, n // 10))] = rng.choice([np.inf, -np.inf, np.nan])
        want = _grid_probe_by_every_group(codes, row_length)
        grids += want is not None
        with np.errstate(all="raise"):
            assert reduce_module.grid_probe(codes, row_length) == want, (trial, row_length, n)
    assert grids > 50  # the grids were found, not only the early answers

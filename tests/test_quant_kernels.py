"""The kernels of the counting path (quantized weights counted per scale group and code): each implementation
(the C code, the numpy fallback) equals the plain count of tests/kernel_oracle.py, and a counted reduction equals
the reduction of the elements themselves."""

from __future__ import annotations

import numpy as np
import pytest

from weightdiag import kernels
from weightdiag.codes import HIST_BINS, cohort_bins, f32_bin_tables
from weightdiag.reduce.reduction import reduce_array, reduce_counted

from . import kernel_oracle as oracle

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("col0", [0, 6, 130])
@pytest.mark.parametrize("group", [64, 256])
@pytest.mark.parametrize("skewed", [False, True])
def test_count_slots_equals_the_plain_count(kernel_backend, bits, col0, group, skewed):
    """Groups of 4-bit codes of 64+ bytes take the AVX2 path in C (64 bytes at a time, then a scalar tail); skewed
    codes (most of a group one code) reach its per-lane limits. Was test_count_slots_c_equals_numpy."""
    rng = np.random.default_rng(bits + col0 + group)
    rows, width = 37, 1100
    codes = rng.integers(0, 256, (rows, width * bits // 8), dtype=np.uint8)
    if skewed:
        codes[:, : codes.shape[1] * 3 // 4] = 0x77
    groups = (col0 + width - 1) // group - col0 // group + 1
    # runs of identical slot rows (a block's rows) and single rows, both kernels' loops
    slots = rng.integers(0, 9, (rows, groups), dtype=np.int32)
    slots[:20] = slots[0]
    ncodes = 256 if bits == 8 else 16
    got = np.zeros(9 * ncodes, dtype=np.int64)
    kernels.count_slots(codes, slots, col0, group, bits, ncodes, got)
    assert np.array_equal(got, oracle.count_slots(codes, slots, col0, group, bits, ncodes, 9))
    assert got.sum() == codes.size * 8 // bits


@pytest.mark.parametrize("ncodes", [16, 20])
def test_count_slots_of_4_bit_codes_kept_one_a_byte(kernel_backend, ncodes):
    """GPTQ's 8-bit path: bytes that hold codes below 16, counted into 16 (or more) codes a slot."""
    rng = np.random.default_rng(ncodes)
    codes = rng.integers(0, 16, (5, 300), dtype=np.uint8)
    slots = rng.integers(0, 3, (5, 5), dtype=np.int32)
    got = np.zeros(3 * ncodes, dtype=np.int64)
    kernels.count_slots(codes, slots, 0, 64, 8, ncodes, got)
    assert np.array_equal(got, oracle.count_slots(codes, slots, 0, 64, 8, ncodes, 3))


def test_count_slots_by_hand(kernel_backend):
    codes = np.array([[0x21, 0x43, 0x21, 0x21]], dtype=np.uint8)  # nibbles 1 2 3 4 | 1 2 1 2
    out = np.zeros(2 * 16, dtype=np.int64)
    kernels.count_slots(codes, np.array([[0, 1]], dtype=np.int32), 0, 4, 4, 16, out)
    assert out[:16].tolist() == [0, 1, 1, 1, 1] + [0] * 11
    assert out[16:].tolist() == [0, 2, 2] + [0] * 13


def test_a_slot_outside_the_counts_is_an_error(kernel_backend):
    with pytest.raises(ValueError):
        kernels.count_slots(
            np.zeros((1, 8), np.uint8), np.array([[5]], np.int32), 0, 8, 8, 256, np.zeros(256, np.int64)
        )


def test_a_counted_reduction_is_the_reduction_of_its_elements(kernel_backend):
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(500) * 0.03).astype(np.float32)
    values[:3] = [0.0, np.inf, np.nan]
    weights = rng.integers(0, 40, 500).astype(np.int64)
    elements = np.repeat(values, weights)
    top = np.where(np.isfinite(values) & (weights > 0), np.abs(values), -1).max()
    first = int(np.flatnonzero(np.abs(elements) == top)[0])
    entry_of = np.repeat(np.arange(values.size), weights)  # the entry each element holds

    def locate(wanted: np.ndarray) -> int:
        return int(np.flatnonzero(wanted[entry_of])[0])

    counted = reduce_counted(values, weights, elements.size, locate)
    direct = reduce_array(elements.view(np.uint32), "F32")
    assert np.array_equal(counted.counts, direct.counts)
    assert np.array_equal(counted.hist1024, direct.hist1024)
    assert counted.n_inf == direct.n_inf == int(weights[1])
    assert counted.max_abs == direct.max_abs and counted.argmax == direct.argmax == first
    assert counted.shift == direct.shift
    assert np.allclose(counted.power_sums, direct.power_sums, rtol=1e-12, atol=1e-12)


def test_cohort_bins_by_arithmetic_equal_a_binary_search():
    from weightdiag.codes import BIN_EDGES, HIST_BINS

    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    edges = (10.0**BIN_EDGES).astype(np.float32)
    values = np.concatenate(
        [bits.view(np.float32), edges, np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(np.inf))]
    ).astype(np.float32)
    with np.errstate(invalid="ignore"):
        logs = np.log10(np.maximum(np.abs(values), np.float32(1e-13))).astype(np.float64)
    want = np.searchsorted(BIN_EDGES, logs, side="right") - 1
    want[logs == BIN_EDGES[-1]] = HIST_BINS - 1
    want[(logs > BIN_EDGES[-1]) | np.isnan(logs)] = HIST_BINS
    assert np.array_equal(cohort_bins(values), want)


@pytest.mark.slow  # millions of patterns: seconds on each implementation
def test_bucket_bins_are_cohort_bins(kernel_backend):
    """The counted path bins its values with a log10 only where a bin edge splits their 16-bit bucket: the
    same histogram as cohort_bins of every pattern of split buckets (sampled), of whole unsplit ones, and
    of values over the whole range, signs, zeros, subnormals, Inf and NaN."""
    tables = f32_bin_tables()
    low = np.arange(65536, dtype=np.uint32)
    split = np.flatnonzero(tables.thresholds != 0xFFFFFFFF).astype(np.uint32)
    unsplit = np.flatnonzero((tables.thresholds == 0xFFFFFFFF) & (tables.irregular < 0)).astype(np.uint32)
    assert split.size > 1000 and unsplit.size > 1000
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(200_000) * 10.0 ** rng.uniform(-15, 4, 200_000)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3e38], dtype=np.float32)
    for bits in (
        ((split[::7, None] << 16) | low).reshape(-1),
        ((split[:, None] << 16) | low[::257]).reshape(-1) | np.uint32(0x80000000),  # negative values
        ((unsplit[::97, None] << 16) | low).reshape(-1),
        np.concatenate([values, special]).view(np.uint32),
    ):
        weights = rng.integers(0, 3, bits.size).astype(np.int64)
        want_bins = cohort_bins(bits.view(np.float32))
        inside = (want_bins >= 0) & (want_bins < HIST_BINS)
        want = np.bincount(want_bins[inside], weights=weights[inside], minlength=HIST_BINS).astype(np.int64)
        got = reduce_counted(bits.view(np.float32), weights, int(weights.sum()), lambda wanted: 0)
        assert np.array_equal(got.hist1024, want)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("high_first", [False, True])
@pytest.mark.parametrize("col0", [0, 6, 130])
def test_locate_slots_finds_the_first_wanted_element(kernel_backend, bits, high_first, col0):
    """The first element whose (slot, code) is wanted: the plain search's, in C (groups of unwanted slots skipped)
    and numpy. Was test_locate_slots_c_equals_numpy."""
    rng = np.random.default_rng(bits + col0 + high_first)
    rows, width, group, nslots = 23, 700, 64, 9
    codes = rng.integers(0, 256, (rows, width * bits // 8), dtype=np.uint8)
    groups = (col0 + width - 1) // group - col0 // group + 1
    slots = rng.integers(0, nslots, (rows, groups), dtype=np.int32)
    ncodes = 256 if bits == 8 else 16
    for trial in range(20):
        wanted = np.zeros((nslots, ncodes), dtype=bool)
        wanted[rng.integers(0, nslots, 1 + trial % 3), rng.integers(0, ncodes, 1 + trial % 3)] = True
        got = kernels.locate_slots(codes, slots, col0, group, bits, wanted, high_first)
        assert got == oracle.locate_slots(codes, slots, col0, group, bits, wanted, high_first)
    assert kernels.locate_slots(codes, slots, col0, group, bits, np.zeros((nslots, ncodes), bool), high_first) == -1

"""Both kernel implementations refuse the same inputs with the same error: every entry point of weightdiag.kernels,
run on the C kernels and on the numpy fallback (the kernel_backend fixture), raises the same ValueError for each
input neither can use. Was: count_slots' fallback raised IndexError for a slot past `out` where C said ValueError,
counted a negative slot into another slot's codes, and read a float16 view as its values where C reads its codes;
count_f32 with an irregular bucket numbered past its histograms wrote past them in C (a segmentation fault).
The C code called alone: tests/test_kernel_build.py."""

from __future__ import annotations

import numpy as np
import pytest

from weightdiag import kernels
from weightdiag.codes import bucket_bins32, f32_bin_tables

pytestmark = pytest.mark.kernels

GRID16 = "expected a 2-D buffer of 2-byte items with contiguous rows"
GRID32 = "expected a 2-D buffer of 4-byte items with contiguous rows"
GRID8 = "expected a 2-D buffer of 1-byte items with contiguous rows"


def _u16(shape=(4, 8)) -> np.ndarray:
    return np.arange(np.prod(shape), dtype=np.uint16).reshape(shape)


def _u32(shape=(4, 8)) -> np.ndarray:
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * 0.25).view(np.uint32)


def _thresholds() -> np.ndarray:
    return f32_bin_tables().thresholds


def _count(codes, slots, col0=0, group=8, bits=8, ncodes=256, out=None):
    out = np.zeros(2 * ncodes, dtype=np.int64) if out is None else out
    kernels.count_slots(codes, slots, col0, group, bits, ncodes, out)
    return out


def _locate(codes, slots, col0=0, group=8, bits=8, wanted=None, high_first=False):
    wanted = np.ones((2, 256), dtype=bool) if wanted is None else wanted
    return kernels.locate_slots(codes, slots, col0, group, bits, wanted, high_first)


def _reduce_slots(weights, values, first=None, last=None):
    bins = bucket_bins32()
    return kernels.reduce_slots(weights, values, bins[0] if first is None else first, bins[1] if last is None else last)


CODES = np.arange(32, dtype=np.uint8).reshape(2, 16)  # two rows of 16 one-byte codes: two groups of 8 a row
SLOTS = np.array([[0, 1], [1, 0]], dtype=np.int32)
W, V = np.array([1, 2, 3], dtype=np.int64), np.array([0.5, -1.0, 2.0], dtype=np.float32)

CASES = {
    # find_first
    "find_first, 1-D": (lambda: kernels.find_first(np.zeros(8, np.uint16), 0x7FFF, 1), GRID16),
    "find_first, rows not contiguous": (lambda: kernels.find_first(_u16()[:, ::2], 0x7FFF, 1), GRID16),
    "find_first, 8-byte items": (lambda: kernels.find_first(np.zeros((2, 2)), 1, 1), GRID32),
    "find_first, mask too wide": (
        lambda: kernels.find_first(_u16(), 0x1FFFF, 1),
        "find_first: mask and target must be 16-bit codes",
    ),
    "find_first, negative target": (
        lambda: kernels.find_first(_u32(), 0x7FFFFFFF, -1),
        "find_first: mask and target must be 32-bit codes",
    ),
    # count_codes16
    "count_codes16, 4-byte items": (lambda: kernels.count_codes16(_u32(), 0x7F80), GRID16),
    "count_codes16, 3-D": (lambda: kernels.count_codes16(np.zeros((2, 2, 2), np.uint16), 0x7F80), GRID16),
    "count_codes16, rows not contiguous": (lambda: kernels.count_codes16(_u16()[:, ::2], 0x7F80), GRID16),
    # count_f32
    "count_f32, 2-byte items": (lambda: kernels.count_f32(_u16(), _thresholds(), None, 0), GRID32),
    "count_f32, short thresholds": (
        lambda: kernels.count_f32(_u32(), _thresholds()[:100], None, 0),
        "count_f32: thresholds must be 32768 uint32 values",
    ),
    "count_f32, an irregular bucket past the histograms": (
        lambda: kernels.count_f32(_u32(), _thresholds(), np.full(32768, 3, np.int64), 2),
        "count_f32: an irregular bucket is numbered n_irregular or more",
    ),
    # power_sums
    "power_sums, 8-byte items": (lambda: kernels.power_sums(np.zeros((2, 2)), 0.0), GRID32),
    "power_sums, 1-D": (lambda: kernels.power_sums(np.zeros(4, np.float32), 0.0), GRID32),
    # count_slots
    "count_slots, 2-byte codes": (lambda: _count(CODES.astype(np.uint16), SLOTS), GRID8),
    "count_slots, slots of another row count": (lambda: _count(CODES, SLOTS[:1]), "count_slots: inconsistent shapes"),
    "count_slots, too few slot columns": (lambda: _count(CODES, SLOTS[:, :1]), "count_slots: inconsistent shapes"),
    "count_slots, group 0": (lambda: _count(CODES, SLOTS, group=0), "count_slots: inconsistent shapes"),
    "count_slots, 5-bit codes": (lambda: _count(CODES, SLOTS, bits=5), "count_slots: inconsistent shapes"),
    "count_slots, 4-bit codes from an odd column": (
        lambda: _count(CODES, SLOTS, col0=3, bits=4, ncodes=16),
        "count_slots: inconsistent shapes",
    ),
    "count_slots, negative col0": (lambda: _count(CODES, SLOTS, col0=-8), "count_slots: inconsistent shapes"),
    "count_slots, no codes a slot": (
        lambda: _count(CODES, SLOTS, ncodes=0, out=np.zeros(4, np.int64)),
        "count_slots: inconsistent shapes",
    ),
    "count_slots, a slot past out": (  # the case: IndexError from the fallback
        lambda: _count(np.zeros((1, 8), np.uint8), np.array([[5]], np.int32), out=np.zeros(256, np.int64)),
        "count_slots: slot out of range",
    ),
    "count_slots, a negative slot": (
        lambda: _count(CODES, np.array([[0, -1], [1, 0]], np.int32)),
        "count_slots: slot out of range",
    ),
    "count_slots, an 8-bit code of ncodes or more": (
        lambda: _count(CODES, SLOTS, ncodes=16),  # GPTQ's bytes hold codes below 16; these reach 31
        "count_slots: code out of range",
    ),
    "count_slots, a 4-bit code of ncodes or more": (
        lambda: _count(CODES, SLOTS, group=16, bits=4, ncodes=8),
        "count_slots: code out of range",
    ),
    "count_slots, float64 out": (
        lambda: _count(CODES, SLOTS, out=np.zeros(512)),
        "count_slots: out must be a writable contiguous int64 array",
    ),
    "count_slots, strided out": (
        lambda: _count(CODES, SLOTS, out=np.zeros(1024, np.int64)[::2]),
        "count_slots: out must be a writable contiguous int64 array",
    ),
    # locate_slots
    "locate_slots, 1-D wanted": (
        lambda: _locate(CODES, SLOTS, wanted=np.ones(512, bool)),
        "locate_slots: inconsistent shapes",
    ),
    "locate_slots, slots of another row count": (
        lambda: _locate(CODES, SLOTS[:1]),
        "locate_slots: inconsistent shapes",
    ),
    "locate_slots, a slot past wanted": (
        lambda: _locate(CODES, np.array([[0, 2], [1, 0]], np.int32)),
        "locate_slots: slot out of range",
    ),
    "locate_slots, a negative slot after the first wanted element": (
        lambda: _locate(CODES, np.array([[0, 1], [-1, 0]], np.int32)),  # C stops at element 0; checked first
        "locate_slots: slot out of range",
    ),
    "locate_slots, a code of ncodes or more after the first wanted element": (
        lambda: _locate(CODES, SLOTS, wanted=np.ones((2, 16), bool)),
        "locate_slots: code out of range",
    ),
    # reduce_slots
    "reduce_slots, values and weights of other lengths": (
        lambda: _reduce_slots(W, V[:2]),
        "reduce_slots: values and weights differ in length",
    ),
    "reduce_slots, float64 values": (
        lambda: _reduce_slots(W, V.astype(np.float64)),
        "reduce_slots: values must be float32 values",
    ),
    "reduce_slots, int32 weights": (
        lambda: _reduce_slots(W.astype(np.int32), V),
        "reduce_slots: weights must be int64 values",
    ),
    "reduce_slots, a negative weight": (lambda: _reduce_slots(-W, V), "reduce_slots: a weight is negative"),
    "reduce_slots, short bin table": (
        lambda: _reduce_slots(W, V, first=bucket_bins32()[0][:10]),
        "reduce_slots: first_bins must be 32768 int32 values",
    ),
    # weighted_power_sums
    "weighted_power_sums, values and weights of other lengths": (
        lambda: kernels.weighted_power_sums(V, W[:1], 0.0),  # numpy would broadcast the one weight
        "weighted_power_sums: values and weights differ in length",
    ),
    "weighted_power_sums, a negative weight": (
        lambda: kernels.weighted_power_sums(V, -W, 0.0),  # numpy left it out, C counted it
        "weighted_power_sums: a weight is negative",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_implementations_refuse_the_same_input_alike(kernel_backend, case):
    call, message = CASES[case]
    with pytest.raises(ValueError) as raised:
        call()
    assert str(raised.value) == message


@pytest.mark.parametrize(
    "case", ["a slot past out", "a negative slot", "slots of another row count", "float64 out", "group 0"]
)
def test_a_refused_count_adds_nothing(kernel_backend, case):
    out = np.zeros(512, dtype=np.int64)
    with pytest.raises(ValueError):
        if case == "a slot past out":
            _count(CODES, np.array([[0, 1], [1, 2]], np.int32), out=out)
        elif case == "a negative slot":
            _count(CODES, np.array([[0, 1], [1, -1]], np.int32), out=out)
        elif case == "slots of another row count":
            _count(CODES, SLOTS[:1], out=out)
        elif case == "group 0":
            _count(CODES, SLOTS, group=0, out=out)
        else:
            _count(CODES, SLOTS, out=out.astype(np.float64))
    assert not out.any()


def test_a_view_is_read_as_the_bytes_it_holds(kernel_backend):
    """A float16 view of BF16/F16 codes is counted as its codes, a uint32 view of float32 values summed as its
    values, a bool wanted table used as flags, in both (C reads bytes; the fallback read the dtype: float16
    values were an error in np.bincount, uint32 patterns were summed as integers)."""
    codes = _u16()
    counts, at = kernels.count_codes16(codes.view(np.float16), 0x7C00)
    assert np.array_equal(counts, np.bincount(codes.reshape(-1), minlength=65536))
    assert at == codes.size - 1
    values = np.float32([[0.5, -1.5], [2.0, 0.25]])
    d = values.astype(np.float64).reshape(-1)
    want = [d.sum(), (d**2).sum(), (d**3).sum(), (d**4).sum(), np.abs(d).sum()]
    assert kernels.power_sums(values.view(np.uint32), 0.0).tolist() == want
    assert kernels.find_first(values.view(np.int32), 0x7FFFFFFF, int(np.float32(2.0).view(np.uint32))) == 2
    wanted = np.zeros((2, 256), dtype=np.uint8)
    wanted[1, 21] = 1  # code 21 is row 1's sixth element, in its first group: slot 1
    assert _locate(CODES, SLOTS.astype(np.int64), wanted=wanted) == 16 + 5  # slots of any integer type

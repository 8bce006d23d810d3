"""What the kernels compute, written the plain way (whole arrays, one numpy call each, no chunks, no threads, no
shortcuts): the oracle a kernel test holds whichever implementation runs. The numpy kernels were the C kernels'
oracle; with the C kernels off (the numpy pass of scripts/test) they would be held to themselves, so the tests
hold both to these."""

from __future__ import annotations

import numpy as np

from weightdiag.codes import HIST_BINS, cohort_bins
from weightdiag.reduce.reduction import Reduction
from weightdiag.segments import Segments

F32_INF = 0x7F800000


def first_largest_finite(magnitude_bits: np.ndarray, finite: np.ndarray) -> int:
    """Flat index of the first largest finite magnitude (bit patterns order as magnitudes), -1 when none."""
    flat, ok = magnitude_bits.reshape(-1), finite.reshape(-1)
    if not ok.any():
        return -1
    top = flat[ok].max()
    return int(np.flatnonzero(ok & (flat == top))[0])


def hist16(codes: np.ndarray) -> np.ndarray:
    return np.bincount(codes.reshape(-1).astype(np.int64), minlength=65536)


def find_first(codes: np.ndarray, mask: int, target: int) -> int:
    hits = np.flatnonzero((codes.reshape(-1) & mask) == target)
    return int(hits[0]) if hits.size else -1


def hist32(bits: np.ndarray, thresholds: np.ndarray, irregular: np.ndarray, n_irregular: int):
    """(top-16-bit counts, elements at or above their bucket's threshold, per irregular bucket its low-16-bit
    histogram) of F32 bit patterns."""
    flat = bits.reshape(-1).astype(np.int64)
    mags = flat & 0x7FFFFFFF
    keys = mags >> 16
    above = np.bincount(keys[mags >= thresholds[keys]], minlength=32768)
    irregular_hist = np.zeros((max(n_irregular, 1), 65536), dtype=np.int64)
    if n_irregular:
        j = irregular[keys]
        np.add.at(irregular_hist, (j[j >= 0], (mags & 0xFFFF)[j >= 0]), 1)
    return np.bincount(flat >> 16, minlength=65536), above, irregular_hist


def power_sums(values: np.ndarray, shift: float, weights: np.ndarray | None = None) -> np.ndarray:
    """[Σ d, Σ d², Σ d³, Σ d⁴, Σ |x|] over the finite float32 values (each held `weights` times), d = x - shift."""
    x = values.reshape(-1).astype(np.float64)
    w = np.ones_like(x) if weights is None else weights.reshape(-1).astype(np.float64)
    keep = np.isfinite(x)
    x, w = x[keep], w[keep]
    d = x - shift
    return np.array([(w * d).sum(), (w * d**2).sum(), (w * d**3).sum(), (w * d**4).sum(), (w * np.abs(x)).sum()])


def assert_is_the_f32_reduction(red: Reduction, x: np.ndarray, segments: Segments | None = None) -> None:
    """`red` (reduce_array of float32 `x`, or of the elements `segments` selects) holds what those elements give:
    their top-16-bit counts, their cohort histogram (the cohort's own binning), where the first largest finite
    |x| is and what it is, the Inf count, and the power sums around red.shift (to rounding: another order)."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if segments is None:
        segments = Segments(offset=0, length=flat.size, stride=flat.size, count=1)
    picked = segments.view(flat).reshape(-1)
    bits = picked.view(np.uint32)
    mags = bits & np.uint32(0x7FFFFFFF)
    assert red.numel == picked.size
    assert np.array_equal(red.counts, np.bincount(bits >> 16, minlength=65536))
    bins = cohort_bins(picked)
    inside = (bins >= 0) & (bins < HIST_BINS)
    assert np.array_equal(red.hist1024, np.bincount(bins[inside], minlength=HIST_BINS))
    at = first_largest_finite(mags, mags < F32_INF)
    assert red.argmax == (segments.original_index(at) if at >= 0 else -1)
    if at >= 0:
        assert red.max_abs == abs(float(picked[at]))
    else:
        assert np.isnan(red.max_abs)
    assert red.n_inf == int((mags == F32_INF).sum())
    want = power_sums(picked, red.shift)
    scale = np.abs(want).max() if want.size else 0.0
    np.testing.assert_allclose(red.power_sums, want, rtol=1e-9, atol=1e-12 * scale)


def slot_elements(codes: np.ndarray, slots: np.ndarray, col0: int, group: int, bits: int, high_first: bool = False):
    """(code, slot) of each element of a rectangle of packed codes, row by row, as count_slots documents them."""
    rows = codes.shape[0]
    if bits == 8:
        values = codes.astype(np.int64)
    else:
        first, second = (codes >> 4, codes & 15) if high_first else (codes & 15, codes >> 4)
        values = np.empty((rows, codes.shape[1] * 2), dtype=np.int64)
        values[:, 0::2], values[:, 1::2] = first, second
    groups = (col0 + np.arange(values.shape[1])) // group - col0 // group
    return values, slots[:, groups].astype(np.int64)


def count_slots(codes, slots, col0: int, group: int, bits: int, ncodes: int, nslots: int) -> np.ndarray:
    values, slot = slot_elements(codes, slots, col0, group, bits)
    return np.bincount((slot * ncodes + values).reshape(-1), minlength=nslots * ncodes)


def locate_slots(codes, slots, col0: int, group: int, bits: int, wanted: np.ndarray, high_first: bool) -> int:
    values, slot = slot_elements(codes, slots, col0, group, bits, high_first)
    hits = np.flatnonzero(wanted[slot, values].reshape(-1))
    return int(hits[0]) if hits.size else -1


def assert_pair_figures(totals, sides) -> None:
    """`totals` (diff.measures.Totals, folded) holds what the blocks' elements (diff.measures.Side pairs) give:
    both sides' code counts, unchanged elements (stored bits), sign flips, ΔW (float32) counted by its top 16 bits
    and binned by the cohort's rule, where its first largest finite |ΔW| is, and Σ ΔW², Σ b², Σ t² (float64;
    summed in another order: to rounding). Only where every ΔW is finite (else the float64 path counts ΔW
    otherwise)."""
    base = np.concatenate([b.stored.reshape(-1).view(np.uint16) for b, _ in sides])
    tuned = np.concatenate([t.stored.reshape(-1).view(np.uint16) for _, t in sides])
    b = np.concatenate([s.values for s, _ in sides]) if sides else np.zeros(0, np.float32)
    t = np.concatenate([s.values for _, s in sides]) if sides else np.zeros(0, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        d = t - b
    if not np.isfinite(d).all():
        return
    assert np.array_equal(totals.base.unpack().counts, hist16(base))
    assert np.array_equal(totals.tuned.unpack().counts, hist16(tuned))
    assert totals.unchanged == int((base == tuned).sum())
    assert totals.flips == int((((b > 0) & (t < 0)) | ((b < 0) & (t > 0))).sum())
    delta = totals.delta.unpack()
    bits = d.view(np.uint32)
    assert np.array_equal(delta.counts, np.bincount(bits >> 16, minlength=65536))
    bins = cohort_bins(d)
    inside = (bins >= 0) & (bins < HIST_BINS)
    assert np.array_equal(totals.delta.hist1024, np.bincount(bins[inside], minlength=HIST_BINS))
    assert delta.argmax == first_largest_finite(bits & 0x7FFFFFFF, np.isfinite(d))
    for got, x in ((totals.d2, d), (totals.b2, b), (totals.t2, t)):
        want = float(np.sum(x.astype(np.float64) ** 2))
        assert abs(got - want) <= 1e-12 * want + 1e-300, (got, want)

"""Reduce one tensor (or one part of a fused tensor) to a small exact summary.

The summary (`Reduction`) is what every statistic and fit is computed from:
- `counts`: elements per code (see codes.py). For BF16/F16/F8 the codes are the values, so the
  counts are the exact empirical distribution; for F32 they group values into 2^-7-wide buckets.
- For F32 only, what the buckets cannot give exactly: the cohort 1024-bin histogram, float64
  power sums for the moments of w and the sum of |w|, and the exact largest |w|.
- The flat index of the (first) largest finite |w|, for super-weight coordinates.

This module is the CPU path; reduce_torch.py computes the same summary with torch on any device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from .. import kernels
from ..codes import FINITE_LIMIT16, HIST_BINS, bucket_bins32, code_values, cohort_bins, f32_bin_tables
from ..segments import Segments, clip


@dataclass
class Reduction:
    dtype: str  # dtype the codes are in ("F32" also for F64 input, rounded)
    numel: int
    counts: np.ndarray  # int64 per signed code
    exact: bool  # codes are exact values
    argmax: int  # tensor flat index of the first largest finite |w|; -1 when there is none
    max_abs: float  # exact largest finite |w| (nan when none)
    hist1024: np.ndarray | None = None  # F32: exact cohort histogram
    power_sums: np.ndarray | None = None  # F32: [sum d, d^2, d^3, d^4, sum |x|], d = x - shift, finite x
    shift: float = 0.0
    n_inf: int | None = None  # F32 only (its buckets mix Inf with NaN); exact dtypes read it from codes
    grid: tuple[int, int] | None = None  # (bits, group): float values on a quantization grid (see grid_probe)
    sample: np.ndarray | None = None  # float32 values at the lineage positions (reduce/sample.py), in flat order
    lines: np.ndarray | None = None  # float32 elements of the paired lines (reduce/pairs.py), in flat order
    # While a partial reduction waits between a worker and the merge, `counts` may be held as its nonzero
    # entries (pack/unpack): a chunk of thousands of small tensors then holds kilobytes each, not 512 KiB.
    packed: tuple[np.ndarray, np.ndarray, int] | None = None  # (codes, their counts, len(counts))

    def pack(self) -> Reduction:
        """Keep only the nonzero counts (in place; returns self)."""
        if self.packed is None:
            codes = np.flatnonzero(self.counts)
            held = self.counts[codes]
            # 6 bytes an entry where they fit (a piece's counts do, unless it holds 2^31 equal codes)
            narrow = held.size and int(held.max()) < 1 << 31
            self.packed = (codes.astype(np.uint16), held.astype(np.int32) if narrow else held, self.counts.size)
            self.counts = _NO_COUNTS
        return self

    def unpack(self) -> Reduction:
        """The dense counts back (in place; returns self)."""
        if self.packed is not None:
            codes, held, size = self.packed
            self.counts = np.zeros(size, dtype=np.int64)
            self.counts[codes] = held
            self.packed = None
        return self


_NO_COUNTS = np.zeros(0, dtype=np.int64)
_NO_COUNTS.setflags(write=False)


def reduce_array(flat: np.ndarray, dtype: str, segments: Segments | None = None) -> Reduction:
    """Summarise `flat` (a tensor's elements in storage form, see plan.STORAGE_NUMPY)."""
    if segments is None:
        segments = Segments.whole(flat.size)
    if dtype == "F64":
        # The cohort protocol works on float32 |w| (as the paper's library casts); round once.
        # Magnitudes beyond float32's range become Inf and are counted as non-finite, as there.
        with np.errstate(over="ignore"):
            flat = segments.view(flat).astype(np.float32).reshape(-1)
        inner = reduce_array(flat.view(np.uint32), "F32")
        inner.argmax = segments.original_index(inner.argmax) if inner.argmax >= 0 else -1
        return inner
    if dtype in FINITE_LIMIT16:
        return _reduce16(flat.view(np.uint16), dtype, segments)
    if dtype == "F32":
        return _reduce_f32(flat.view(np.uint32), segments)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        return _reduce8(flat.view(np.uint8), dtype, segments)
    raise ValueError(f"cannot reduce dtype {dtype}")


def _reduce16(bits: np.ndarray, dtype: str, segments: Segments) -> Reduction:
    counts, at = kernels.count_codes16(segments.view(bits), FINITE_LIMIT16[dtype])
    argmax = segments.original_index(at) if at >= 0 else -1
    max_abs = abs(float(code_values(dtype)[bits[argmax]])) if argmax >= 0 else float("nan")
    return Reduction(dtype, segments.numel, counts, True, argmax, max_abs)


def _reduce8(bits: np.ndarray, dtype: str, segments: Segments) -> Reduction:
    # FP8 checkpoints are rare and small per tensor; plain numpy is enough.
    view = segments.view(bits)
    counts = np.zeros(256, dtype=np.int64)
    mags = np.abs(code_values(dtype))
    best, best_at = -1.0, -1
    for r, row in enumerate(view):
        counts += np.bincount(row, minlength=256)
        row_mags = np.nan_to_num(mags[row], nan=-1.0, posinf=-1.0)
        i = int(np.argmax(row_mags)) if row.size else -1
        if i >= 0 and row_mags[i] > best:
            best, best_at = float(row_mags[i]), r * segments.length + i
    argmax = segments.original_index(best_at) if best_at >= 0 else -1
    return Reduction(dtype, segments.numel, counts, True, argmax, best if best_at >= 0 else float("nan"))


ONE_PASS = True  # tests compare the one pass with the four it replaces


def _reduce_f32(bits: np.ndarray, segments: Segments) -> Reduction:
    tables = f32_bin_tables()
    view = segments.view(bits)
    if ONE_PASS and kernels.HAVE_C and not len(tables.irregular_bins):
        return _reduce_f32_one_pass(view, segments, tables)
    counts, above, irregular_hist, at = kernels.count_f32(
        view, tables.thresholds, tables.irregular, len(tables.irregular_bins)
    )
    hist = tables.histogram(counts, above, irregular_hist)
    values = view.view(np.float32)
    argmax = segments.original_index(at) if at >= 0 else -1
    max_abs = abs(float(bits[argmax : argmax + 1].view(np.float32)[0])) if argmax >= 0 else float("nan")
    # Shift by a code-level mean estimate so the float64 power sums do not cancel when |mean| >> std.
    n_finite = int(counts[finite_mask("F32")].sum())
    shift = f32_shift(counts)
    nonfinite = segments.numel - n_finite
    n_inf = 0
    if nonfinite:  # rare: mask Inf/NaN out first (copies, but only for damaged tensors)
        flat_vals = values.reshape(-1)
        n_inf = int(np.isinf(flat_vals).sum())
        sums = kernels.power_sums(flat_vals[np.isfinite(flat_vals)].reshape(1, -1), shift)
    else:
        sums = kernels.power_sums(values, shift)
    return Reduction("F32", segments.numel, counts, False, argmax, max_abs, hist, sums, shift, n_inf)


def _reduce_f32_one_pass(view: np.ndarray, segments: Segments, tables) -> Reduction:
    """_reduce_f32 through kernels.f32_pass: one pass instead of four, the same counts, histogram, largest |w|
    and power sums around the same shift (summed in another order)."""
    counts, above, parts, top, at, n_inf = kernels.f32_pass(view, tables.thresholds)
    shift = f32_shift(counts)
    sums = np.sum([shift_sums(s, float(n), around - shift) for s, n, around in parts], axis=0)
    hist = tables.histogram(counts, above, np.zeros((1, 1), dtype=np.int64))
    argmax = segments.original_index(at) if at >= 0 else -1
    max_abs = float(np.array([top], dtype=np.uint32).view(np.float32)[0]) if top >= 0 else float("nan")
    return Reduction("F32", segments.numel, counts, False, argmax, max_abs, hist, sums, shift, n_inf)


@cache
def finite_mask(dtype: str) -> np.ndarray:
    """Codes that hold finite values (for F32, buckets below the exponent-255 patterns)."""
    mask = np.isfinite(code_values(dtype))
    mask.setflags(write=False)
    return mask


def f32_shift(counts: np.ndarray) -> float:
    """A code-level estimate of the mean: the power sums are taken around it so they do not cancel.
    (Over the codes present only, a few thousand of the 65,536: 0.13 ms where the whole table took 0.5 ms
    on every reduction and merge; no np.dot, whose BLAS threads spin for milliseconds after each call.)"""
    present = np.flatnonzero(counts)
    present = present[finite_mask("F32")[present]]
    held = counts[present]
    n_finite = int(held.sum())
    return float((held * code_values("F32")[present]).sum() / n_finite) if n_finite else 0.0


Locate = Callable[[np.ndarray], int]  # entries wanted (bool, one per value) -> flat index of the first element


def reduce_counted(values: np.ndarray, weights: np.ndarray, numel: int, locate: Locate) -> Reduction:
    """The F32 reduction of `numel` elements given as float32 `values` held `weights` times each (a
    quantized weight counted per scale group and code: weightdiag.decode; zero weights allowed). `locate`
    maps the entries holding the largest finite |value| to the flat index of the first element holding
    one of them. Counts and histograms are exactly those of the elements themselves; the power sums are
    the same sums taken value by value. One C pass does the counts, the histogram and the largest |value|;
    only values in a 16-bit bucket that a bin edge splits take a log10 (the cohort's own rule)."""
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    weights = np.ascontiguousarray(weights, dtype=np.int64).reshape(-1)
    first_bins, last_bins = bucket_bins32()
    counts, hist, split, n_inf, top, tops = kernels.reduce_slots(weights, values, first_bins, last_bins)
    if split.size:
        bins = cohort_bins(values[split])
        inside = (bins >= 0) & (bins < HIST_BINS)
        np.add.at(hist, bins[inside], weights[split][inside])
    shift = f32_shift(counts)
    sums = kernels.weighted_power_sums(values, weights, shift)
    argmax, max_abs = -1, float("nan")
    if top >= 0:
        if tops is None:  # many entries share the largest |value|: find them all
            wanted = (weights > 0) & (np.abs(values) == np.float32(top))
        else:
            wanted = np.zeros(values.size, dtype=bool)
            wanted[tops] = True
        argmax, max_abs = locate(wanted), top
    return Reduction("F32", numel, counts, False, argmax, max_abs, hist, sums, shift, n_inf)


# ---------------------------------------------------------------------------------------------
# Partial reductions: a tensor read in chunks is reduced chunk by chunk and merged. Everything in a
# Reduction is additive (counts, histograms, numel), a maximum with its first position, or power
# sums, which are moved to the merged shift exactly by the binomial expansion.


def reduce_range(flat: np.ndarray, dtype: str, segments: Segments | None, lo: int) -> list[Reduction]:
    """Partial reductions of the elements [lo, lo + flat.size) of a tensor, restricted to `segments`
    (None: all of them). Their argmax positions are tensor flat indices."""
    hi = lo + flat.size
    selections = [Segments.whole(flat.size)] if segments is None else clip(segments, lo, hi)
    out = []
    for selection in selections:
        red = reduce_array(flat, dtype, selection)
        if red.argmax >= 0:
            red.argmax += lo
        out.append(red)
    return out


def shift_sums(power_sums: np.ndarray, n: float, d: float) -> np.ndarray:
    """Power sums of (x - a) over n values moved to (x - a + d), exactly by the binomial expansion."""
    s1, s2, s3, s4, abs_sum = (float(x) for x in power_sums)
    return np.array(
        (
            s1 + d * n,
            s2 + 2 * d * s1 + d * d * n,
            s3 + 3 * d * s2 + 3 * d * d * s1 + d**3 * n,
            s4 + 4 * d * s3 + 6 * d * d * s2 + 4 * d**3 * s1 + d**4 * n,
            abs_sum,  # sums of |x| need no shift
        ),
        dtype=np.float64,
    )


def takes_the_lead(later: Reduction, held: Reduction | None) -> bool:
    """Whether a later part's largest |w| replaces the one held (strictly larger: a tie keeps the first)."""
    return later.argmax >= 0 and (held is None or held.argmax < 0 or later.max_abs > held.max_abs)


def merge(parts: list[Reduction]) -> Reduction:
    """One Reduction from partial ones given in flat order (ties of the largest |w| keep the first)."""
    for p in parts:
        p.unpack()
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    counts = first.counts + parts[1].counts  # pairwise adds: np.sum over a list stacks a copy first
    for p in parts[2:]:
        counts += p.counts
    best = first
    for p in parts[1:]:
        if takes_the_lead(p, best):
            best = p
    merged = Reduction(first.dtype, sum(p.numel for p in parts), counts, first.exact, best.argmax, best.max_abs)
    if first.hist1024 is not None:
        hist = first.hist1024.copy()
        for p in parts[1:]:
            hist += p.hist1024
        merged.hist1024 = hist
    if first.power_sums is not None:
        merged.shift = f32_shift(counts)
        finite = finite_mask("F32")
        total = np.zeros(kernels.POWER_SUMS, dtype=np.float64)
        for p in parts:
            assert p.power_sums is not None  # the parts of one tensor were reduced with the same options
            total += shift_sums(p.power_sums, float(p.counts[finite].sum()), p.shift - merged.shift)
        merged.power_sums = total
    if first.n_inf is not None:
        merged.n_inf = sum(p.n_inf or 0 for p in parts)
    merged.grid = next((p.grid for p in parts if p.grid is not None), None)
    samples = [p.sample for p in parts if p.sample is not None]
    merged.sample = np.concatenate(samples) if samples else None  # parts in flat order: positions in order
    lines = [p.lines for p in parts if p.lines is not None]
    merged.lines = np.concatenate(lines) if lines else None
    return merged


# ---------------------------------------------------------------------------------------------
# Dequantized weights saved as floats (a merged QLoRA save, a GPTQ model dequantized to BF16): their
# values sit on a 4-bit grid, at most 16 distinct values in every group of 32 to 128 consecutive
# elements of a row, where trained weights have almost as many distinct values as elements.
GRID_GROUPS = (128, 64, 32)
GRID_SAMPLE = 1 << 14  # elements looked at: the first rows of the matrix
GRID_LEVELS = 16  # a 4-bit code


def grid_probe(codes: np.ndarray, row_length: int) -> tuple[int, int] | None:
    """(4, group) when the first rows of a matrix (its storage codes, flat) hold at most 16 distinct values
    in each group of `group` consecutive elements of a row, for the largest such group; else None. A matrix
    with few distinct values overall (zeros, a constant) is no grid."""
    rows = max(1, min(GRID_SAMPLE // max(row_length, 1), codes.size // max(row_length, 1)))
    sample = codes[: rows * row_length].reshape(rows, row_length)
    if _a_small_group_is_off_grid(sample, row_length):
        return None  # trained weights: decided from a few hundred elements, before any sort of the sample
    if np.unique(sample).size <= 4 * GRID_LEVELS:
        return None
    for group in GRID_GROUPS:
        if row_length % group or rows * row_length < 8 * group:
            continue
        if _most_distinct(sample, group) <= GRID_LEVELS:
            return 4, group
    return None


def _a_small_group_is_off_grid(sample: np.ndarray, row_length: int) -> bool:
    """Whether one of the sample's first few groups of the smallest size holds more than 16 distinct values,
    which settles grid_probe's answer (None) at once: every larger group is made of whole smallest groups
    of the same row (the sizes divide each other and the row length), so none of them can be a grid either.
    For trained weights this is the common case, and it costs a sort of 256 elements instead of the sample's
    three (a tenth of the engine's CPU time on a 4 GB checkpoint went to grid_probe before)."""
    smallest = GRID_GROUPS[-1]
    if row_length % smallest or sample.size < 8 * smallest:
        return False  # the smallest group does not apply: let the full probe decide
    return _most_distinct(sample, smallest, first=8) > GRID_LEVELS


def _most_distinct(sample: np.ndarray, group: int, first: int | None = None) -> int:
    """The most distinct values held by one group of `group` consecutive elements of `sample` (of its first
    `first` groups; None: all)."""
    groups = np.sort(sample.reshape(-1, group)[:first], axis=1)
    with np.errstate(invalid="ignore"):  # Inf - Inf in a float matrix: NaN, counted as a difference
        return 1 + int(np.count_nonzero(np.diff(groups, axis=1), axis=1).max())

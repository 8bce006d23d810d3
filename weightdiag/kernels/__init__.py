"""The CPU hot loops: one pass over a tensor's raw elements into exact counts.

Each kernel has a C implementation (weightdiag/kernels/_kernels.c, built at install time; it releases
the GIL, so one large tensor is split across cores with plain threads) and a numpy
implementation with identical results, used when the extension is not built, forced with
WEIGHTDIAG_KERNELS=numpy, and kept as the test oracle for the C code.

Inputs are 2-D views (rows, row_length) of the raw storage, so that a fused tensor's parts (rows
or columns of a strided layout) are reduced without copies. Argmax indices are flat positions in
that 2-D view (row * row_length + column) of the first largest finite |w|, -1 when there is none.
The argmax costs no extra work in the histogram loop: the largest finite code is read off the
histogram, then one vectorised search finds where it first occurs.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from .. import settings, tuning

FORCED = "WEIGHTDIAG_KERNELS=numpy"


def _load_c() -> tuple[Any, str | None]:
    """The C module, or None and why the numpy kernels are used instead."""
    if settings.numpy_kernels_forced():
        return None, FORCED
    try:
        from . import _kernels
    except ModuleNotFoundError:
        return None, "the C extension is not built"
    except ImportError as exc:  # built, but it does not load (another Python's build, a missing symbol)
        if "cannot import name" in str(exc):  # `from . import _kernels` with no _kernels module
            return None, "the C extension is not built"
        return None, f"the C extension does not load: {exc}"
    return _kernels, None


_c, WHY_NUMPY = _load_c()
HAVE_C = _c is not None
BACKEND = "c" if HAVE_C else "numpy"
C_MISSING = WHY_NUMPY not in (None, FORCED)  # no usable C module, and none was asked to be skipped


def describe() -> str:
    """Which kernels this process uses, and why not C (`weightdiag env`)."""
    return "C extension" if HAVE_C else f"numpy ({WHY_NUMPY})"


_ran = False  # the numpy kernels counted something in this process
_noted = False


def _ran_numpy() -> None:
    global _ran
    _ran = True


def fallback_note() -> str | None:
    """The one line the CLI says once the numpy kernels have run: only the first time it is asked in a process
    (None with the C kernels, before they ran, and after that). Not a warning: the results are the same, slower."""
    global _noted
    if HAVE_C or _noted or not _ran:
        return None
    _noted = True
    return f"note: {WHY_NUMPY}: the pure-numpy kernels are used (the same results, several times slower)"


F32_INF = 0x7F800000


_budget = threading.local()


@contextmanager
def thread_budget(threads: int) -> Iterator[None]:
    """How many threads one kernel call in this thread may split into: a job's Execution.threads where it
    starts, 1 in workers of a pool that already runs several calls side by side."""
    previous = getattr(_budget, "threads", None)
    _budget.threads = max(1, threads)
    try:
        yield
    finally:
        _budget.threads = previous


def threads() -> int:
    """How many threads a kernel call in this thread may use: its budget (see thread_budget), else, for a
    call outside any job (a test, a notebook), the setting; a bad WEIGHTDIAG_THREADS is a BadInputError
    (exit 2), not an import-time ValueError (exit 1)."""
    return getattr(_budget, "threads", None) or settings.threads()


@cache
def _pool(size: int) -> ThreadPoolExecutor:
    """Kernel threads, one pool per size asked for (a job on 3 threads after one on 2 gets 3)."""
    return ThreadPoolExecutor(size, thread_name_prefix="weightdiag-kernel")


def _split(view: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Split a 2-D view into per-thread pieces (by rows, or by columns of a single row), each with the flat
    index in `view` of its first element."""
    rows, cols = view.shape
    parts = min(threads(), max(1, view.size // (tuning.current().parallel_min // 2)))
    if parts > 1 and rows >= parts:
        bounds = np.linspace(0, rows, parts + 1).astype(int)
        return [(int(a) * cols, view[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
    if parts > 1 and rows == 1:
        bounds = np.linspace(0, cols, parts + 1).astype(int)
        return [(int(a), view[:, a:b]) for a, b in itertools.pairwise(bounds) if b > a]
    return [(0, view)]


def _pieces(view: np.ndarray) -> list[np.ndarray]:
    return [piece for _, piece in _split(view)]


def _map(fn: Callable[[np.ndarray], Any], view: np.ndarray) -> list[Any]:
    pieces = _pieces(view)
    return [fn(pieces[0])] if len(pieces) == 1 else list(_pool(threads()).map(fn, pieces))


def _chunks(view: np.ndarray):
    """(flat offset, 1-D chunk) over a 2-D view, for the numpy kernels."""
    _ran_numpy()
    step = tuning.current().numpy_chunk
    for r, row in enumerate(view):
        for lo in range(0, row.size, step):
            yield r * view.shape[1] + lo, row[lo : lo + step]


# ---------------------------------------------------------------------------------------------
# The inputs of every entry point are checked here, once, before either implementation runs: the C and the numpy
# kernels raise the same ValueError for the same input (the C code's message), and read the same bytes (a view
# of 2-byte items is counted as uint16 codes whatever its dtype, as the C code reads it). The C code keeps its
# own checks, for callers of weightdiag.kernels._kernels itself.

_UNSIGNED: dict[int, Any] = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _grid(view: Any, itemsize: int, as_type: Any = None) -> np.ndarray:
    """`view` as the kernels read it: 2-D, items of `itemsize` bytes, each row contiguous (as numpy exports a
    C-contiguous array: its strides recomputed, whatever the stride of a dimension of size 1)."""
    view = np.asarray(view)
    if view.ndim != 2 or view.itemsize != itemsize or not (view.strides[1] == itemsize or view.flags.c_contiguous):
        raise ValueError(f"expected a 2-D buffer of {itemsize}-byte items with contiguous rows")
    return view.view(as_type or _UNSIGNED[itemsize])


def _vector(name: str, what: str, array: Any, dtype: Any, size: int | None = None) -> np.ndarray:
    """`array` as one contiguous run of `dtype` values (`size` of them when given)."""
    array = np.asarray(array)
    if array.dtype != dtype or (size is not None and array.size != size):
        count = "" if size is None else f"{size} "
        raise ValueError(f"{name}: {what} must be {count}{np.dtype(dtype).name} values")
    return np.ascontiguousarray(array).reshape(-1)


def _weights(name: str, values: Any, weights: Any) -> tuple[np.ndarray, np.ndarray]:
    """(float32 values, int64 weights), as many of each; a weight counts elements, so none is negative."""
    values = _vector(name, "values", values, np.float32)
    weights = _vector(name, "weights", weights, np.int64)
    if weights.size != values.size:
        raise ValueError(f"{name}: values and weights differ in length")
    if weights.size and weights.min() < 0:
        raise ValueError(f"{name}: a weight is negative")
    return values, weights


def _slot_grid(
    name: str, codes: Any, slots: Any, col0: int, group: int, bits: int, ncodes: int, nslots: int
) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes, int32 slots) of a rectangle of packed codes (count_slots, locate_slots), after the C code's
    checks: the shapes agree, and every slot the rectangle's groups use is below `nslots`."""
    codes = _grid(codes, 1)
    slots = _grid(np.ascontiguousarray(slots, dtype=np.int32), 4, np.int32)
    elements = codes.shape[1] * (2 if bits == 4 else 1)
    used = (col0 + elements - 1) // group - col0 // group + 1 if group > 0 and elements > 0 else 0
    if (
        slots.shape[0] != codes.shape[0]
        or group <= 0
        or col0 < 0
        or ncodes <= 0
        or bits not in (4, 8)
        or (bits == 4 and (group % 2 or col0 % 2))
        or used > slots.shape[1]
    ):
        raise ValueError(f"{name}: inconsistent shapes")
    held = slots[:, :used]
    if held.size and (held.min() < 0 or held.max() >= nslots):
        raise ValueError(f"{name}: slot out of range")
    return codes, slots


def _check_codes(name: str, codes: np.ndarray, bits: int, ncodes: int) -> None:
    """Every code of a rectangle is below `ncodes` (a format that keeps 4-bit codes one a byte says 16 of 256)."""
    if ncodes >= 1 << bits or not codes.size:
        return
    top = int(codes.max()) if bits == 8 else max(int((codes & 15).max()), int((codes >> 4).max()))
    if top >= ncodes:
        raise ValueError(f"{name}: code out of range")


def _codes(codes: np.ndarray, bits: int, high_first: bool = False) -> np.ndarray:
    """The codes of a rectangle, one per element (4-bit: a byte's low nibble first unless `high_first`)."""
    if bits == 8:
        return codes
    lo, hi = codes & 15, codes >> 4
    return np.stack((hi, lo) if high_first else (lo, hi), axis=-1).reshape(codes.shape[0], -1)


def _find_numpy(view: np.ndarray, mask: int, target: int) -> int:
    for offset, chunk in _chunks(view):
        hits = np.flatnonzero((chunk & chunk.dtype.type(mask)) == target)
        if hits.size:
            return offset + int(hits[0])
    return -1


def find_first(view: np.ndarray, mask: int, target: int) -> int:
    """First flat index with (x & mask) == target, -1 if none (a view of 2- or 4-byte codes)."""
    view = _grid(view, 2 if np.asarray(view).itemsize == 2 else 4)
    width = 8 * view.itemsize
    if not (0 <= mask < 1 << width and 0 <= target < 1 << width):
        raise ValueError(f"find_first: mask and target must be {width}-bit codes")
    if HAVE_C:
        return int((_c.find16 if view.itemsize == 2 else _c.find32)(view, mask, target))
    return _find_numpy(view, mask, target)


# ---------------------------------------------------------------------------------------------
# 16-bit codes (BF16, F16 bit patterns): 65,536-bin histogram + first argmax of |w| among finite
# values. `finite_limit` is the smallest magnitude code that is Inf/NaN (0x7F80 BF16, 0x7C00 F16).


def _hist16_numpy(view: np.ndarray) -> np.ndarray:
    counts = np.zeros(65536, dtype=np.int64)
    for _, chunk in _chunks(view):
        counts += np.bincount(chunk, minlength=65536)
    return counts


def _hist16_c(view: np.ndarray) -> np.ndarray:
    counts = np.zeros(65536, dtype=np.int64)
    _c.hist16(view, counts)
    return counts


def count_codes16(view: np.ndarray, finite_limit: int) -> tuple[np.ndarray, int]:
    """Histogram of uint16 codes in a 2-D view and the flat index of the first largest finite |w|."""
    view = _grid(view, 2)
    parts = _map(_hist16_c if HAVE_C else _hist16_numpy, view)
    counts = parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
    magnitude_counts = counts[:32768] + counts[32768:]
    present = np.flatnonzero(magnitude_counts[:finite_limit])
    if present.size == 0:
        return counts, -1
    return counts, find_first(view, 0x7FFF, int(present[-1]))


# ---------------------------------------------------------------------------------------------
# F32: histogram of the top 16 bits (sign, exponent, 7 mantissa bits), the exact 1024-bin
# correction counts (elements at or above their bucket's bin threshold), a full low-16-bit
# histogram for the rare buckets where float32 log10 is not monotone, and the argmax of |w|.


def _hist32_numpy(view, thresholds, irregular, n_irregular):
    counts = np.zeros(65536, dtype=np.int64)
    above = np.zeros(32768, dtype=np.int64)
    irregular_hist = np.zeros((max(n_irregular, 1), 65536), dtype=np.int64)
    for _, chunk in _chunks(view):
        counts += np.bincount(chunk >> 16, minlength=65536)
        mags = chunk & np.uint32(0x7FFFFFFF)
        keys = (mags >> 16).astype(np.int64)
        above += np.bincount(keys[mags >= thresholds[keys]], minlength=32768)
        if n_irregular:
            irr = irregular[keys]
            sel = irr >= 0
            np.add.at(irregular_hist, (irr[sel], (mags[sel] & 0xFFFF).astype(np.int64)), 1)
    return counts, above, irregular_hist


def _hist32_c(view, thresholds, irregular, n_irregular):
    counts = np.zeros(65536, dtype=np.int64)
    above = np.zeros(32768, dtype=np.int64)
    irregular_hist = np.zeros((max(n_irregular, 1), 65536), dtype=np.int64)
    _c.hist32(view, thresholds, irregular if n_irregular else None, counts, above, irregular_hist)
    return counts, above, irregular_hist


def _max_finite32_numpy(view: np.ndarray) -> int:
    best = -1
    for _, chunk in _chunks(view):
        mags = chunk & np.uint32(0x7FFFFFFF)
        finite = mags[mags < np.uint32(F32_INF)]
        if finite.size:
            best = max(best, int(finite.max()))
    return best


def count_f32(view: np.ndarray, thresholds: np.ndarray, irregular: np.ndarray, n_irregular: int):
    """One pass over uint32 bit patterns; see the section comment for the outputs."""
    view = _grid(view, 4)
    thresholds = _vector("count_f32", "thresholds", thresholds, np.uint32, 32768)
    if n_irregular < 0:
        raise ValueError("count_f32: n_irregular is negative")
    if n_irregular:
        irregular = _vector("count_f32", "irregular", irregular, np.int64, 32768)
        if int(irregular.max()) >= n_irregular:
            raise ValueError("count_f32: an irregular bucket is numbered n_irregular or more")
    kernel = _hist32_c if HAVE_C else _hist32_numpy
    results = _map(lambda piece: kernel(piece, thresholds, irregular, n_irregular), view)
    counts, above, irregular_hist = (np.sum([r[i] for r in results], axis=0) for i in range(3))
    largest = max(_map(_c.max_finite32 if HAVE_C else _max_finite32_numpy, view))
    at = find_first(view, 0x7FFFFFFF, largest) if largest >= 0 else -1
    return counts, above, irregular_hist, at


PowerSumsPart = tuple[np.ndarray, int, float]  # (power sums around `shift`, finite elements, shift)


def f32_pass(
    view: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[PowerSumsPart], int, int, int]:
    """The F32 reduction in one C pass (count_f32 + power_sums do it in four): counts, bin corrections, each
    thread piece's power sums of its finite x (around the mean of its first tile: they never cancel; the caller
    moves them to one shift), largest finite magnitude bits (-1: none), its first flat index, the Inf count.
    C only; callers check HAVE_C."""
    assert _c is not None, "f32_pass needs the C kernels"
    view = _grid(view, 4)
    thresholds = _vector("f32_pass", "thresholds", thresholds, np.uint32, 32768)
    split = _split(view)
    pieces = [piece for _, piece in split]

    def one(piece: np.ndarray):
        counts = np.zeros(65536, dtype=np.int64)
        above = np.zeros(32768, dtype=np.int64)
        sums = np.zeros(POWER_SUMS, dtype=np.float64)
        top, at, n_inf, nonfinite, around = _c.f32_pass(piece, thresholds, counts, above, sums)
        return counts, above, (sums, piece.size - nonfinite, around), top, at, n_inf

    results = [one(pieces[0])] if len(pieces) == 1 else list(_pool(threads()).map(one, pieces))
    counts = results[0][0] if len(results) == 1 else np.sum([r[0] for r in results], axis=0)
    above = results[0][1] if len(results) == 1 else np.sum([r[1] for r in results], axis=0)
    top, at = 0, -1
    for (offset, _), r in zip(split, results, strict=True):
        if r[3] > top:  # strictly larger: a tie keeps the earlier piece's first index
            top, at = r[3], offset + r[4]
    return counts, above, [r[2] for r in results], top - 1, at, sum(r[5] for r in results)


# ---------------------------------------------------------------------------------------------
# Exact float64 power sums of (x - shift) for float32 values known to be all finite, and the sum of
# |x| (the first moment of |w|, exact, for the Gamma closure).

POWER_SUMS = 5  # sum d, d^2, d^3, d^4 with d = x - shift; sum |x|


def _power_sums_numpy(view: np.ndarray, shift: float) -> np.ndarray:
    sums = np.zeros(POWER_SUMS, dtype=np.float64)
    for _, chunk in _chunks(view):
        x = chunk.astype(np.float64)
        d = x - shift
        d2 = d * d
        sums += (d.sum(), d2.sum(), (d2 * d).sum(), (d2 * d2).sum(), np.abs(x).sum())
    return sums


def _power_sums_c(view: np.ndarray, shift: float) -> np.ndarray:
    sums = np.zeros(POWER_SUMS, dtype=np.float64)
    _c.power_sums(view, shift, sums)
    return sums


def power_sums(view: np.ndarray, shift: float) -> np.ndarray:
    """[sum d, sum d^2, sum d^3, sum d^4, sum |x|] with d = x - shift, accumulated in float64 (a 2-D view of
    float32 values)."""
    view = _grid(view, 4, np.float32)
    kernel = _power_sums_c if HAVE_C else _power_sums_numpy
    return np.sum(_map(lambda piece: kernel(piece, float(shift)), view), axis=0)


def count_slots(codes: np.ndarray, slots: np.ndarray, col0: int, group: int, bits: int, ncodes: int, out: np.ndarray):
    """out[slot * ncodes + code] += elements of the rectangle `codes` (uint8 2-D: bytes of packed codes, rows
    of the matrix from column col0) holding `code` in a group whose slot is slots[row, group index - first].
    `out`: a writable contiguous int64 array, ncodes counts per slot."""
    if not (isinstance(out, np.ndarray) and out.dtype == np.int64 and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("count_slots: out must be a writable contiguous int64 array")
    codes, slots = _slot_grid("count_slots", codes, slots, col0, group, bits, ncodes, out.size // max(ncodes, 1))
    if HAVE_C:
        _c.count_slots(codes, slots, col0, group, bits, ncodes, out)
        return
    _ran_numpy()
    _check_codes("count_slots", codes, bits, ncodes)  # the C code checks them as it counts
    values = _codes(codes, bits)
    cols = col0 + np.arange(values.shape[1])
    slot = slots[:, cols // group - col0 // group].astype(np.int64)
    np.add.at(out.reshape(-1), (slot * ncodes + values).reshape(-1), 1)


def locate_slots(
    codes: np.ndarray, slots: np.ndarray, col0: int, group: int, bits: int, wanted: np.ndarray, high_first: bool
) -> int:
    """Offset (row * elements + column) in the rectangle `codes` (as count_slots reads it) of its first
    element whose (slot, code) is wanted (bool [slots, codes]); -1 when none. `high_first`: 4-bit codes
    whose first element is a byte's high nibble."""
    wanted = np.asarray(wanted)
    if wanted.ndim != 2:
        raise ValueError("locate_slots: inconsistent shapes")
    ncodes = wanted.shape[1]
    codes, slots = _slot_grid("locate_slots", codes, slots, col0, group, bits, ncodes, wanted.shape[0])
    _check_codes("locate_slots", codes, bits, ncodes)  # all of them: the C code stops at the first wanted one
    if HAVE_C:
        flags = np.ascontiguousarray(wanted, dtype=np.uint8)
        return int(_c.locate_slots(codes, slots, col0, group, bits, ncodes, flags, high_first))
    _ran_numpy()
    values = _codes(codes, bits, high_first)
    wanted = wanted.astype(bool)
    cols = col0 + np.arange(values.shape[1])
    hit = wanted[slots[:, cols // group - col0 // group], values]
    return int(np.argmax(hit)) if hit.any() else -1


SLOT_TOPS = 64  # entries holding the largest |value| that reduce_slots lists (more: the caller finds them)


def reduce_slots(
    weights: np.ndarray, values: np.ndarray, first_bins: np.ndarray, last_bins: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, float, np.ndarray | None]:
    """One pass over float32 `values` held `weights` times each (a quantized piece counted per slot and
    code): (top-16-bit counts, cohort histogram of the entries whose 16-bit bucket lies in one bin, the
    entries in a bucket a bin edge splits, elements that are +-Inf, the largest finite |value| (-1: none),
    the entries holding it or None when more than SLOT_TOPS do). `first_bins`/`last_bins`: each 16-bit
    magnitude bucket's bin at its first and last pattern (int32 [32768])."""
    values, weights = _weights("reduce_slots", values, weights)
    first_bins = _vector("reduce_slots", "first_bins", first_bins, np.int32, 32768)
    last_bins = _vector("reduce_slots", "last_bins", last_bins, np.int32, 32768)
    counts = np.zeros(65536, dtype=np.int64)
    hist = np.zeros(1024, dtype=np.int64)
    if HAVE_C:
        split = np.empty(values.size, dtype=np.int64)
        tops = np.empty(SLOT_TOPS, dtype=np.int64)
        n_split, n_inf, top, n_tops = _c.reduce_slots(weights, values, first_bins, last_bins, counts, hist, split, tops)
        return counts, hist, split[:n_split], n_inf, top, tops[:n_tops] if n_tops <= SLOT_TOPS else None
    _ran_numpy()
    held = np.flatnonzero(weights)
    w, bits = weights[held], values[held].view(np.uint32)
    np.add.at(counts, bits >> 16, w)
    mags = bits & np.uint32(0x7FFFFFFF)
    finite = mags < F32_INF
    n_inf = int(w[mags == F32_INF].sum())
    keys = (mags >> 16).astype(np.intp)
    first, last = first_bins[keys], last_bins[keys]
    whole = finite & (first == last) & (first >= 0) & (first < 1024)
    np.add.at(hist, first[whole], w[whole])
    split = held[finite & (first != last)]
    if not finite.any():
        return counts, hist, split, n_inf, -1.0, np.empty(0, dtype=np.int64)
    top_mag = mags[finite].max()
    tops = held[finite & (mags == top_mag)]
    top = float(np.array([top_mag], dtype=np.uint32).view(np.float32)[0])
    return counts, hist, split, n_inf, top, tops if tops.size <= SLOT_TOPS else None


def weighted_power_sums(values: np.ndarray, weights: np.ndarray, shift: float) -> np.ndarray:
    """power_sums of float32 `values` held `weights` times each (finite values only)."""
    values, weights = _weights("weighted_power_sums", values, weights)
    sums = np.zeros(POWER_SUMS, dtype=np.float64)
    if HAVE_C:
        _c.weighted32(values, weights, float(shift), None, sums)
        return sums
    _ran_numpy()
    keep = np.isfinite(values) & (weights > 0)
    x, w = values[keep].astype(np.float64), weights[keep].astype(np.float64)
    d = x - shift
    d2 = d * d
    return np.array([w @ d, w @ d2, w @ (d2 * d), w @ (d2 * d2), w @ np.abs(x)], dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# A diff's block pair in one pass (weightdiag.delta.measures): C only; without the extension the diff takes
# its numpy path (whose figures are this kernel's test oracle).


PAIR_TABLES = ("base", "tuned", "delta", "delta_above", "ratio")
PAIR_SIZES = {"base": 65536, "tuned": 65536, "delta": 65536, "delta_above": 32768, "ratio": 65536}


@dataclass
class PairCounts:
    """What `pair16` counted over one block of two 16-bit sides (see _kernels.c for each field). The counts
    come packed: per table (PAIR_TABLES: both sides' codes, ΔW's top 16 bits, ΔW at or above its bucket's
    cohort-bin threshold, the top 16 bits of |ΔW| / |W_base|), its nonzero codes and their counts."""

    unchanged: int
    flips: int
    nonfinite: int  # elements whose ΔW is not finite: the caller takes its float64 path instead
    packed: dict[str, tuple[np.ndarray, np.ndarray]]  # table -> (codes, counts)
    tops: tuple[tuple[int, int], ...]  # (largest finite magnitude + 1 or 0, its first index): base, tuned, ΔW, ratio
    sums: np.ndarray  # float64 Σy, Σy², Σy³, Σy⁴ (y = ΔW - shift), Σ|ΔW|
    shift: float  # the mean of the block's first tile of ΔW (sums around it do not cancel)


_pair_scratch = threading.local()  # per thread, freed with it


def pair16(
    base: np.ndarray,
    tuned: np.ndarray,
    tables: tuple[np.ndarray | None, np.ndarray | None],
    limits: tuple[int, int],
    thresholds: np.ndarray,
    delta: np.ndarray | None,
) -> PairCounts:
    """One C pass over a block pair of 16-bit codes (`tables`: a side's float32 value per code, None for BF16)."""
    assert _c is not None, "pair16 needs the C kernels"
    # np.empty: only the entries written are ever touched (a few thousand), never the whole 3 MB
    codes = np.empty(5 * 65536, dtype=np.uint16)
    counts = np.empty(5 * 65536, dtype=np.int64)
    scratch = getattr(_pair_scratch, "tables", None)
    if scratch is None:  # this thread's counting tables: zero, and left zero by every call
        scratch = _pair_scratch.tables = np.zeros(5 * 65536, dtype=np.uint32)
    out = _c.pair16(base, tuned, *tables, *limits, thresholds, codes, counts, delta, scratch)
    unchanged, flips, nonfinite = out[:3]
    tops = tuple((int(out[k]), int(out[k + 1])) for k in range(3, 11, 2))
    packed = {
        name: (codes[j * 65536 : j * 65536 + n].copy(), counts[j * 65536 : j * 65536 + n].copy())
        for j, (name, n) in enumerate(zip(PAIR_TABLES, out[16:21], strict=True))
    }
    return PairCounts(unchanged, flips, nonfinite, packed, tops, np.array(out[11:16], dtype=np.float64), out[21])

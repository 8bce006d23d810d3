"""The CPU hot loops: one pass over a tensor's raw elements into exact counts.

Each kernel has a numba implementation (compiled on first use, cached on disk, releases the GIL
so reading the next tensor overlaps with it) and a numpy implementation with identical results
(used when numba is unavailable, forced with WEIGHTDIAG_KERNELS=numpy, and as the test oracle).

Inputs are 2-D views (rows, row_length) of the raw storage so that a fused tensor's parts (rows
or columns of a strided layout) are reduced without copies. Argmax indices are flat positions in
that 2-D view (row * row_length + column).
"""

from __future__ import annotations

import os

import numpy as np

try:  # numba is a dependency, but weightdiag must still work where it cannot be imported
    if os.environ.get("WEIGHTDIAG_KERNELS", "").lower() == "numpy":
        raise ImportError("numpy kernels forced by WEIGHTDIAG_KERNELS")
    from numba import njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised by the WEIGHTDIAG_KERNELS=numpy test run
    HAVE_NUMBA = False

NUMPY_CHUNK = 1 << 20  # elements per numpy step: keeps temporaries in cache


# ---------------------------------------------------------------------------------------------
# 16-bit codes (BF16, F16 bit patterns): 65,536-bin histogram + first argmax of |w| among finite
# values. `finite_limit` is the smallest magnitude code that is Inf/NaN (0x7F80 BF16, 0x7C00 F16).


def _codes16_numpy(view: np.ndarray, finite_limit: int) -> tuple[np.ndarray, int]:
    counts = np.zeros(65536, dtype=np.int64)
    best, best_at = -1, -1
    flat_pos = 0
    for row in view:
        for lo in range(0, row.size, NUMPY_CHUNK):
            chunk = row[lo : lo + NUMPY_CHUNK]
            counts += np.bincount(chunk, minlength=65536)
            mags = (chunk & np.uint16(0x7FFF)).astype(np.int32)
            mags[mags >= finite_limit] = -1
            i = int(np.argmax(mags))
            if chunk.size and int(mags[i]) > best:
                best, best_at = int(mags[i]), flat_pos + lo + i
        flat_pos += row.size
    return counts, best_at


if HAVE_NUMBA:

    @njit(nogil=True, cache=True)
    def _codes16_numba(view, finite_limit):  # pragma: no cover - compiled
        # Four sub-histograms break the store-to-load dependency between equal neighbours.
        sub = np.zeros((4, 65536), dtype=np.int64)
        best = -1
        best_at = -1
        row_len = view.shape[1]
        for r in range(view.shape[0]):
            row = view[r]
            base = r * row_len
            n4 = row_len - row_len % 4
            for i in range(0, n4, 4):
                v0 = row[i]
                v1 = row[i + 1]
                v2 = row[i + 2]
                v3 = row[i + 3]
                sub[0, v0] += 1
                sub[1, v1] += 1
                sub[2, v2] += 1
                sub[3, v3] += 1
                m = v0 & 0x7FFF
                if m > best and m < finite_limit:
                    best = m
                    best_at = base + i
                m = v1 & 0x7FFF
                if m > best and m < finite_limit:
                    best = m
                    best_at = base + i + 1
                m = v2 & 0x7FFF
                if m > best and m < finite_limit:
                    best = m
                    best_at = base + i + 2
                m = v3 & 0x7FFF
                if m > best and m < finite_limit:
                    best = m
                    best_at = base + i + 3
            for i in range(n4, row_len):
                v = row[i]
                sub[0, v] += 1
                m = v & 0x7FFF
                if m > best and m < finite_limit:
                    best = m
                    best_at = base + i
        return sub.sum(axis=0), best_at


def count_codes16(view: np.ndarray, finite_limit: int) -> tuple[np.ndarray, int]:
    """Histogram of uint16 codes in a 2-D view and the flat index of the first largest finite |w|."""
    if HAVE_NUMBA:
        counts, at = _codes16_numba(view, np.uint16(finite_limit))
        return counts, int(at)
    return _codes16_numpy(view, finite_limit)


# ---------------------------------------------------------------------------------------------
# F32: histogram of the top 16 bits (sign, exponent, 7 mantissa bits), the exact 1024-bin
# correction counts (elements at or above their bucket's bin threshold), a full low-16-bit
# histogram for the rare buckets where float32 log10 is not monotone, and the argmax of |w|.


def _f32_numpy(view, thresholds, irregular, n_irregular):
    counts = np.zeros(65536, dtype=np.int64)
    above = np.zeros(32768, dtype=np.int64)
    irregular_hist = np.zeros((max(n_irregular, 1), 65536), dtype=np.int64)
    best, best_at, flat_pos = -1, -1, 0
    for row in view:
        for lo in range(0, row.size, NUMPY_CHUNK):
            chunk = row[lo : lo + NUMPY_CHUNK]
            counts += np.bincount(chunk >> 16, minlength=65536)
            mags = chunk & np.uint32(0x7FFFFFFF)
            keys = (mags >> 16).astype(np.int64)
            above += np.bincount(keys[mags >= thresholds[keys]], minlength=32768)
            irr = irregular[keys]
            sel = irr >= 0
            if sel.any():
                np.add.at(irregular_hist, (irr[sel], (mags[sel] & 0xFFFF).astype(np.int64)), 1)
            finite = mags.astype(np.int64)
            finite[mags >= np.uint32(0x7F800000)] = -1
            i = int(np.argmax(finite))
            if chunk.size and int(finite[i]) > best:
                best, best_at = int(finite[i]), flat_pos + lo + i
        flat_pos += row.size
    return counts, above, irregular_hist, best_at


if HAVE_NUMBA:

    @njit(nogil=True, cache=True)
    def _f32_numba(view, thresholds, irregular, n_irregular):  # pragma: no cover - compiled
        counts = np.zeros(65536, dtype=np.int64)
        above = np.zeros(32768, dtype=np.int64)
        irregular_hist = np.zeros((max(n_irregular, 1), 65536), dtype=np.int64)
        best = np.int64(-1)
        best_at = -1
        row_len = view.shape[1]
        for r in range(view.shape[0]):
            row = view[r]
            base = r * row_len
            for i in range(row_len):
                w = row[i]
                counts[w >> 16] += 1
                mag = w & np.uint32(0x7FFFFFFF)
                key = mag >> 16
                if mag >= thresholds[key]:
                    above[key] += 1
                j = irregular[key]
                if j >= 0:
                    irregular_hist[j, mag & np.uint32(0xFFFF)] += 1
                if np.int64(mag) > best and mag < np.uint32(0x7F800000):
                    best = np.int64(mag)
                    best_at = base + i
        return counts, above, irregular_hist, best_at


def count_f32(view: np.ndarray, thresholds: np.ndarray, irregular: np.ndarray, n_irregular: int):
    """One pass over uint32 bit patterns; see the section comment for the outputs."""
    if HAVE_NUMBA:
        counts, above, irregular_hist, at = _f32_numba(view, thresholds, irregular, n_irregular)
        return counts, above, irregular_hist, int(at)
    return _f32_numpy(view, thresholds, irregular, n_irregular)


# ---------------------------------------------------------------------------------------------
# Exact float64 power sums of (x - shift) for float32 values known to be all finite.


def _power_sums_numpy(view: np.ndarray, shift: float) -> np.ndarray:
    sums = np.zeros(4, dtype=np.float64)
    for row in view:
        for lo in range(0, row.size, NUMPY_CHUNK):
            d = row[lo : lo + NUMPY_CHUNK].astype(np.float64) - shift
            d2 = d * d
            sums += (d.sum(), d2.sum(), (d2 * d).sum(), (d2 * d2).sum())
    return sums


if HAVE_NUMBA:
    # fastmath only lets LLVM reorder the sums (vectorise); inputs are known to be finite.
    @njit(nogil=True, cache=True, fastmath=True)
    def _power_sums_numba(view, shift):  # pragma: no cover - compiled
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        s4 = 0.0
        for r in range(view.shape[0]):
            row = view[r]
            for i in range(row.shape[0]):
                d = np.float64(row[i]) - shift
                d2 = d * d
                s1 += d
                s2 += d2
                s3 += d2 * d
                s4 += d2 * d2
        out = np.empty(4, dtype=np.float64)
        out[0] = s1
        out[1] = s2
        out[2] = s3
        out[3] = s4
        return out


def power_sums(view: np.ndarray, shift: float) -> np.ndarray:
    """[sum d, sum d^2, sum d^3, sum d^4] with d = x - shift, accumulated in float64."""
    if HAVE_NUMBA:
        return _power_sums_numba(view, float(shift))
    return _power_sums_numpy(view, float(shift))

"""Tables that turn raw element codes into values and into cohort-protocol histogram bins.

A "code" is what the reducer counts: the full bit pattern for BF16/F16/F8 (so counts are the
exact distribution) and the top 16 bits (sign, exponent, 7 mantissa bits) for F32, whose counts
are therefore grouped into buckets 2^-7 wide in relative terms.

The cohort protocol (`hist1024`) bins log10|w| into 1024 bins over [-12, 2]. To be bit-identical
with the paper's library, a value's bin is computed exactly as it does: float32 |w| clipped at
1e-13, float32 log10, then numpy's histogram rule (edges[i] <= x < edges[i+1], the last bin
closed). Values below 1e-12 (zeros included), above 100, and non-finite values fall outside.
"""

from __future__ import annotations

from functools import cache, lru_cache

import numpy as np

HIST_BINS = 1024
HIST_LOG10_RANGE = (-12.0, 2.0)
BIN_EDGES = np.linspace(HIST_LOG10_RANGE[0], HIST_LOG10_RANGE[1], HIST_BINS + 1)
BELOW, ABOVE = -1, HIST_BINS  # bin indices of values outside the histogram
# F32 bucket tables: patterns evaluated on each side of a bin edge's float32. 1,024 patterns are ~1.2e-4
# relative (5e-5 in log10); float32 log10 is within a few ulp (~1e-6 at |log10| = 12) of the true value.
EDGE_WINDOW = 1024

# Magnitude codes at and above these are Inf/NaN.
FINITE_LIMIT16 = {"BF16": 0x7F80, "F16": 0x7C00}
F32_FINITE_MAG = 0x7F800000


def cohort_bins(values_f32: np.ndarray) -> np.ndarray:
    """Cohort-protocol bin of each |value| (float32 input), BELOW/ABOVE when outside."""
    mags = np.abs(np.ascontiguousarray(values_f32, dtype=np.float32))
    # NaN codes fall outside below; log10 of them must not print a RuntimeWarning on stderr.
    with np.errstate(invalid="ignore"):
        logs = np.log10(np.maximum(mags, np.float32(1e-13))).astype(np.float64)
    bins = _edge_index(logs)
    bins[logs == BIN_EDGES[-1]] = HIST_BINS - 1  # the last bin includes its right edge
    bins[logs > BIN_EDGES[-1]] = ABOVE
    bins[np.isnan(logs)] = ABOVE
    return bins


_EXTENDED_EDGES = np.concatenate([[-np.inf], BIN_EDGES, [np.inf]])  # [i + 1] is edge i; -1 and 1025 unbounded


def _edge_index(logs: np.ndarray) -> np.ndarray:
    """searchsorted(BIN_EDGES, logs, "right") - 1, the largest i with BIN_EDGES[i] <= x (-1 below the first),
    by arithmetic instead of a binary search: the edges are evenly spaced, so the estimate is exact except
    within a rounding error of an edge, where one exact comparison each way settles it."""
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (np.where(np.isnan(logs), -np.inf, logs) - BIN_EDGES[0]) * (HIST_BINS / (BIN_EDGES[-1] - BIN_EDGES[0]))
        estimate = np.floor(np.clip(scaled, -1.0, float(HIST_BINS)))
        offset = scaled - estimate
    index = estimate.astype(np.int64)
    near = ~((offset > 1e-6) & (offset < 1 - 1e-6))  # also the clipped ends, whatever they are
    if near.any():
        at, x = index[near], logs[near]
        at -= x < _EXTENDED_EDGES[at + 1]
        at += x >= _EXTENDED_EDGES[np.minimum(at + 2, HIST_BINS + 2)]
        index[near] = at
    return index


@cache
def code_values(dtype: str) -> np.ndarray:
    """Signed float64 value of every code (read-only); for F32, the midpoint of the code's bucket."""
    with np.errstate(invalid="ignore"):
        values = _decode(dtype)
    values.setflags(write=False)
    return values


def _decode(dtype: str) -> np.ndarray:
    if dtype == "BF16":
        values = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
    elif dtype == "F16":
        values = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    elif dtype == "F32":
        first = (np.arange(65536, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
        last = ((np.arange(65536, dtype=np.uint32) << 16) | 0xFFFF).view(np.float32).astype(np.float64)
        values = (first + last) / 2.0
    elif dtype in ("F8_E4M3", "F8_E5M2"):
        values = _float8_values(dtype)
    else:
        raise KeyError(f"no code table for {dtype}")
    return values


def _float8_values(dtype: str) -> np.ndarray:
    """Decode all 256 FP8 codes (OCP E4M3FN: no Inf, NaN = S.1111.111; E5M2: IEEE-like)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    if dtype == "F8_E4M3":
        exp, man, bias = (codes >> 3) & 0xF, codes & 0x7, 7
        normal = sign * (1 + man / 8.0) * np.exp2(exp - bias)
        sub = sign * (man / 8.0) * np.exp2(1 - bias)
        values = np.where(exp == 0, sub, normal)
        values[(codes & 0x7F) == 0x7F] = np.nan
    else:
        exp, man, bias = (codes >> 2) & 0x1F, codes & 0x3, 15
        normal = sign * (1 + man / 4.0) * np.exp2(exp - bias)
        sub = sign * (man / 4.0) * np.exp2(1 - bias)
        values = np.where(exp == 0, sub, normal)
        values[exp == 0x1F] = np.where(man[exp == 0x1F] == 0, sign[exp == 0x1F] * np.inf, np.nan)
    return values.astype(np.float64)


@cache
def code_bins(dtype: str) -> np.ndarray:
    """Cohort bin of every code of an exactly-coded dtype (BF16, F16, F8)."""
    with np.errstate(invalid="ignore"):  # NaN codes; they land outside the histogram
        bins = cohort_bins(code_values(dtype).astype(np.float32))
    bins.setflags(write=False)
    return bins


class F32BinTables:
    """Per 16-bit magnitude bucket: its bin, the first low pattern that moves to the next bin.

    Within one F32 bucket (2^16 consecutive patterns, <= 0.78% wide) the cohort bin can change at
    most once (a bin is 3.2% wide), provided float32 log10 is monotone there. It is not, at a
    handful of points; buckets containing such a point are marked irregular and their elements
    are binned from an exact per-pattern table instead.
    """

    def __init__(self, window: int | None = EDGE_WINDOW) -> None:
        mags = np.arange(32768, dtype=np.uint32) << 16
        first_bins = cohort_bins(mags.view(np.float32))
        last_bins = cohort_bins((mags | 0xFFFF).view(np.float32))
        self.base_bin = first_bins
        self.thresholds = np.full(32768, 0xFFFFFFFF, dtype=np.uint32)  # never reached
        self.irregular = np.full(32768, -1, dtype=np.int64)
        irregular_bins: list[np.ndarray] = []
        split = np.flatnonzero(first_bins != last_bins)
        for start in range(0, split.size, 64):
            keys = split[start : start + 64]
            for key, row, moved in _crossings(keys, first_bins[keys] + 1, window):
                if last_bins[key] == first_bins[key] + 1 and moved is not None:
                    self.thresholds[key] = row[int(np.argmax(moved))]
                else:
                    self.irregular[key] = len(irregular_bins)
                    patterns = (np.uint32(key) << 16) | np.arange(65536, dtype=np.uint32)
                    irregular_bins.append(cohort_bins(patterns.view(np.float32)))
        self.irregular_bins = np.array(irregular_bins, dtype=np.int64).reshape(-1, 65536)

    def histogram(self, counts16: np.ndarray, above: np.ndarray, irregular_hist: np.ndarray) -> np.ndarray:
        """Assemble the exact 1024-bin histogram from one F32 pass's outputs."""
        mag_counts = counts16[:32768] + counts16[32768:]  # fold the sign bit
        hist = np.zeros(HIST_BINS + 3, dtype=np.int64)  # slot = bin + 1; outside bins at both ends
        regular = self.irregular < 0
        np.add.at(hist, self.base_bin[regular] + 1, mag_counts[regular] - above[regular])
        np.add.at(hist, self.base_bin[regular] + 2, above[regular])
        for key in np.flatnonzero(~regular):
            j = self.irregular[key]
            np.add.at(hist, self.irregular_bins[j] + 1, irregular_hist[j])
        return hist[1 : HIST_BINS + 1]


def _moved(logs: np.ndarray, nxt: np.ndarray) -> np.ndarray:
    """Whether each log10 (rows: one bucket each) is in bin nxt or above (the same rule as cohort_bins:
    edges closed below, the top edge closed above)."""
    top = nxt == HIST_BINS
    edge = BIN_EDGES[np.minimum(nxt, HIST_BINS)][:, None]
    return np.where(top[:, None], logs > BIN_EDGES[-1], logs >= edge)


def _crossings(keys: np.ndarray, nxt: np.ndarray, window: int | None):
    """(key, patterns, moved) per split bucket: moved[i] says whether patterns[i] is in bin nxt or above;
    None when it is not False then True (float32 log10 not monotone there). With `window`, only the
    patterns within `window` of the edge's float32 are evaluated (the rest of the bucket lies further from
    the edge than any float32 log10 error reaches); a bucket whose crossing is not inside its window is
    evaluated whole."""
    low = np.arange(65536, dtype=np.uint32)
    if window is None:
        patterns = (keys.astype(np.uint32)[:, None] << 16) | low
        logs = np.log10(np.maximum(patterns.view(np.float32), np.float32(1e-13))).astype(np.float64)
        for key, row, moved in zip(keys, patterns, _moved(logs, nxt), strict=True):
            yield key, row, moved if not (np.diff(moved.view(np.int8)) < 0).any() else None
        return
    edge = np.float32(10.0 ** BIN_EDGES[np.minimum(nxt, HIST_BINS)]).view(np.uint32).astype(np.int64)
    start = keys.astype(np.int64) << 16
    lo = np.clip(edge - window, start, start + 0xFFFF - 2 * window)  # the window inside the bucket
    patterns = (lo[:, None] + np.arange(2 * window + 1)).astype(np.uint32)
    logs = np.log10(np.maximum(patterns.view(np.float32), np.float32(1e-13))).astype(np.float64)
    for i, (key, row, moved) in enumerate(zip(keys, patterns, _moved(logs, nxt), strict=True)):
        at_start = int(row[0]) == int(key) << 16
        at_end = int(row[-1]) == (int(key) << 16) | 0xFFFF
        inside = (at_start or not moved[0]) and (at_end or moved[-1]) and moved.any()
        if inside and not (np.diff(moved.view(np.int8)) < 0).any():
            yield key, row, moved
        else:  # the crossing is not where the edge's float32 says, or not monotone: look at the whole bucket
            yield from _crossings(keys[i : i + 1], nxt[i : i + 1], None)


@lru_cache(maxsize=1)
def f32_bin_tables() -> F32BinTables:
    return F32BinTables()


@cache
def _bucket_bins() -> tuple[np.ndarray, np.ndarray]:
    """Per 16-bit magnitude bucket of float32: the bin of its first and of its last pattern."""
    mags = np.arange(32768, dtype=np.uint32) << 16
    return cohort_bins(mags.view(np.float32)), cohort_bins((mags | 0xFFFF).view(np.float32))


@cache
def bucket_bins32() -> tuple[np.ndarray, np.ndarray]:
    """_bucket_bins as contiguous int32 arrays, for the counted reduction's C pass."""
    first, last = _bucket_bins()
    return np.ascontiguousarray(first, dtype=np.int32), np.ascontiguousarray(last, dtype=np.int32)

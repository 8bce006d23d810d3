"""Fixed-position samples of a matrix: the lineage fingerprint's values (docs/lineage.md).

The positions depend on the matrix's shape only (a seeded generator), so that two models of one shape sample
the same entries and the correlation of their samples says whether their weights are related. They are drawn
as (row, column) pairs with rows uniform below the next power of two of the row count and columns over the
row's length; those past the last row are dropped. A matrix with rows added at its end (an extended vocabulary)
keeps every sampled entry of the rows it shares, in the same order.

The chunk engine gathers them as the chunks stream (reduce_chunk): a piece of elements [lo, hi) of a tensor
contributes the samples whose positions fall in it; the fold concatenates them in flat order (merge).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

SEED = 0x5EED_39  # never change: rows fingerprinted by another seed could not be compared
MAX_SAMPLES = 256  # per matrix
MIN_SAMPLES = 16
TOTAL_SAMPLES = 8192  # per model: k = TOTAL_SAMPLES // matrices, within [MIN_SAMPLES, MAX_SAMPLES]
MAX_MATRICES = 384  # beyond, only the layers whose index is a multiple of a stride (the row stays under 64 KB)
BLOCK = 512  # candidates drawn at a time (never change: the positions would)
MAX_EXPERTS = 2  # experts of one layer sampled: the first 2 (the rest add size, not evidence)


def samples_per_matrix(matrices: int) -> int:
    """How many entries each of `matrices` sampled matrices gives."""
    return max(MIN_SAMPLES, min(MAX_SAMPLES, TOTAL_SAMPLES // max(1, matrices)))


def layer_stride(blocks: list[int | None], most: int = MAX_MATRICES) -> int:
    """Sample the matrices of every layer whose index is a multiple of this (1: all), for matrices in `blocks`
    (their layer indices, None outside the layers), so that at most about `most` are sampled."""
    in_layers = sum(b is not None for b in blocks)
    outside = len(blocks) - in_layers
    if len(blocks) <= most or not in_layers:
        return 1
    return math.ceil(in_layers / max(1, most - outside))


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    return int(shape[0]), int(math.prod(shape[1:]))


def sample_positions(shape: tuple[int, ...], k: int) -> np.ndarray:
    """The flat positions (int64) of the first `k` sampled entries of a matrix of `shape`, in sampling order
    (a prefix of the positions for any larger k); fewer when the matrix has fewer than k entries."""
    return np.asarray(_positions(tuple(int(n) for n in shape), k), dtype=np.int64)


@lru_cache(maxsize=256)
def _positions(shape: tuple[int, ...], k: int) -> tuple[int, ...]:
    rows, cols = _rows_cols(shape)
    if rows <= 0 or cols <= 0:
        return ()
    k = min(k, rows * cols)
    cap = 1 << max(0, (rows - 1).bit_length())  # rows below the next power of two: an added row keeps the rest
    rng = np.random.default_rng([SEED, cap, cols])
    found = np.zeros(0, dtype=np.int64)
    while found.size < k:  # blocks of BLOCK candidates whatever k is: the same stream for every k
        drawn = rng.random((BLOCK, 2))
        r = (drawn[:, 0] * cap).astype(np.int64)
        c = (drawn[:, 1] * cols).astype(np.int64)
        found = np.concatenate([found, (r * cols + c)[r < rows]])
        _, first = np.unique(found, return_index=True)  # repeats dropped, first occurrences kept in order
        found = found[np.sort(first)]
    return tuple(found[:k].tolist())


def gather_order(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted positions, the permutation that puts values gathered in sorted order back in sampling order)."""
    order = np.argsort(positions, kind="stable")
    back = np.empty_like(order)
    back[order] = np.arange(order.size)
    return positions[order], back


def gather(values: np.ndarray, sorted_positions: np.ndarray, lo: int) -> np.ndarray:
    """float32 values of the sampled entries in [lo, lo + len(values)) of a tensor (values: its elements
    from `lo`, any float dtype numpy reads; BF16 and FP8 as their raw codes are converted by the caller)."""
    a, b = np.searchsorted(sorted_positions, [lo, lo + values.size])
    return values[sorted_positions[a:b] - lo].astype(np.float32)

"""Cosines of fixed pairs of hidden-unit lines of a matrix: the lineage fingerprint's rotation-invariant part
(docs/lineage.md, "Why the pair cosines").

A function-preserving rotation R of the residual stream (a permutation is one) turns a matrix reading it, W
[units, d], into W R^T and one writing it, W [d, units], into R W. The cosine of two rows of the first (two
columns of the second) is unchanged: rows are indexed by the matrix's own hidden units (heads' dimensions, FFN
units), which the rotation does not touch, and inner products along d are what R keeps. Norm gains folded into
the readers (W diag(g) R^T, as SliceGPT and QuaRot do) change the cosines only a little. So two models whose
matrices have the same pairs' cosines in the same order are related even when their values sit at other
positions; under the null of independent initialisations the hidden units of one are at unrelated indices to
the other's, and the cosines of fixed index pairs are independent between the two models (the null of Zhu et
al., "Independence Tests for Language Models", ICML 2025).

The pairs are disjoint (each line in one pair), drawn by a fixed-seed generator from the matrix's shape and the
side, so that the cosines of one matrix are nearly independent of each other (pairs sharing a line would make
their ranks correlate and Spearman's null variance wrong). Token- or position-indexed matrices (embeddings, the
output head) are left out: their rows are not hidden units, and models trained on the same data share them.

The chunk pass gathers the lines' elements apart from the lineage samples (reduce/sample.py), as blocks rather
than as positions (LineGather): a row line is one contiguous slice, and column lines are one 2-D take per piece,
with no position array of tens of thousands of entries to build, search and index (issue 39's cost on a fit).
run/measure.py turns them into cosines, stored as their ranks (record/lineage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..vocabulary import RECURRENT_KINDS, RESIDUAL_WRITERS, WEIGHT_KINDS

SEED = 0x5EED_3A  # never change: rows of another seed could not be compared
PAIRS = 32  # per matrix (fewer where it has fewer than 64 lines); stored as ranks, one byte each
MIN_PAIRS = 8
# Matrices paired per model: beyond, only the layers whose index is a multiple of a stride (reduce/sample.py's
# layer_stride). Gathering 2 x PAIRS whole lines costs about 1 ms a matrix, the fit's ~5% on a 300-matrix model
# if every matrix were paired; 64 matrices of 32 pairs are 2,048 cosines, evidence enough for any model (the
# samples carry the rest), and a model with layers dropped or added keeps the same stride or one near it.
MAX_PAIRED = 64


def pair_axis(kind: str | None) -> int | None:
    """0: pairs of rows (a matrix reading the residual stream, rows its hidden units); 1: pairs of columns (one
    writing it); None: not paired (embeddings, output heads, routers, anything not indexed by hidden units)."""
    if kind in RESIDUAL_WRITERS:
        return 1
    if kind in WEIGHT_KINDS or kind in RECURRENT_KINDS:
        return 0
    return None


def pair_lines(shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The 2P line indices (rows for axis 0, columns for axis 1) of a matrix of `shape`: pair i is lines 2i and
    2i + 1. Empty when the matrix has fewer than 2 MIN_PAIRS lines on that side."""
    return np.asarray(_lines(tuple(int(n) for n in shape), axis), dtype=np.int64)


@lru_cache(maxsize=256)
def _lines(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    rows, cols = int(shape[0]), int(np.prod(shape[1:]))
    n = rows if axis == 0 else cols
    pairs = min(PAIRS, n // 2)
    if pairs < MIN_PAIRS or min(rows, cols) < 2:
        return ()
    rng = np.random.default_rng([SEED, rows, cols, axis])
    return tuple(rng.permutation(n)[: 2 * pairs].tolist())


@dataclass(frozen=True)
class LineGather:
    """Which lines of a matrix the chunk pass gathers for the pair cosines: `lines` sorted ascending (rows for
    axis 0, columns for axis 1) of a matrix whose rows hold `cols` elements. Pieces of the matrix hand back the
    lines' elements in flat order (gather_lines); concatenated in piece order they are as_lines' input."""

    axis: int
    lines: np.ndarray  # int64, sorted
    cols: int


def line_gather(shape: tuple[int, ...], axis: int | None) -> LineGather | None:
    """The gather of a matrix's paired lines (None: the matrix has no pairs)."""
    if axis is None:
        return None
    lines = pair_lines(shape, axis)
    if not lines.size:
        return None
    return LineGather(axis, np.sort(lines), int(np.prod(shape[1:])))


def gather_lines(flat: np.ndarray, lo: int, spec: LineGather) -> np.ndarray:
    """The elements of the paired lines that fall in a piece holding a matrix's elements [lo, lo + flat.size),
    in flat order (raw storage values: the caller converts them)."""
    hi, cols, lines = lo + flat.size, spec.cols, spec.lines
    if spec.axis == 0:  # whole rows: one slice each
        a, b = np.searchsorted(lines, [lo // cols, (hi - 1) // cols + 1])
        parts = [flat[max(r * cols, lo) - lo : min((r + 1) * cols, hi) - lo] for r in lines[a:b].tolist()]
        return np.concatenate(parts) if parts else flat[:0].copy()
    first, last = -(-lo // cols), hi // cols  # the rows wholly inside the piece
    if first >= last:  # within one row, or across one row boundary: by positions (at most 2 x the lines)
        rows = np.arange(lo // cols, (hi - 1) // cols + 1)
        at = (rows[:, None] * cols + lines[None, :]).reshape(-1)
        return flat[at[(at >= lo) & (at < hi)] - lo]
    head = (first - 1) * cols + lines
    tail = last * cols + lines
    block = flat[first * cols - lo : last * cols - lo].reshape(-1, cols)[:, lines]
    return np.concatenate([flat[head[head >= lo] - lo], block.reshape(-1), flat[tail[tail < hi] - lo]])


def as_lines(values: np.ndarray, spec: LineGather, shape: tuple[int, ...]) -> np.ndarray:
    """The paired lines' values [2P, line length] in pair order (pair i: lines 2i and 2i + 1, as pair_lines)
    from the pieces' gathered values concatenated in flat order."""
    if spec.axis == 0:
        sorted_lines = values.reshape(spec.lines.size, spec.cols)
    else:
        sorted_lines = values.reshape(int(shape[0]), spec.lines.size).T
    return sorted_lines[np.searchsorted(spec.lines, pair_lines(shape, spec.axis))]


def pair_positions(shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The flat positions of the paired lines' elements, line by line (each line in order along it)."""
    rows, cols = int(shape[0]), int(np.prod(shape[1:]))
    lines = pair_lines(shape, axis)
    if axis == 0:
        return (lines[:, None] * cols + np.arange(cols)[None, :]).reshape(-1)
    return (np.arange(rows)[None, :] * cols + lines[:, None]).reshape(-1)


def pair_cosines(values: np.ndarray, lines: int) -> np.ndarray:
    """The cosine of each pair (float64) from the paired lines' values (as pair_positions orders them); 0 where a
    line is zero or a value is not finite (a constant or broken matrix carries no evidence: ties)."""
    v = np.asarray(values, dtype=np.float64).reshape(lines, -1)  # a float64 copy: einsum casting is 2x slower
    a, b = v[0::2], v[1::2]
    norms = np.sqrt(np.einsum("ij,ij->i", a, a) * np.einsum("ij,ij->i", b, b))
    dots = np.einsum("ij,ij->i", a, b)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)
    return np.where(np.isfinite(cos), cos, 0.0)

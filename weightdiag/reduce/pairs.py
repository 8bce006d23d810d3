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

The chunk pass gathers the lines' elements with the lineage samples (reduce/sample.py's positions and these in
one sorted set); run/measure.py turns them into cosines, stored as their ranks (record/lineage.py).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..vocabulary import RECURRENT_KINDS, RESIDUAL_WRITERS, WEIGHT_KINDS

SEED = 0x5EED_3A  # never change: rows of another seed could not be compared
PAIRS = 32  # per matrix (fewer where it has fewer than 64 lines); stored as ranks, one byte each
MIN_PAIRS = 8


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
    v = np.asarray(values).reshape(lines, -1)
    a, b = v[0::2], v[1::2]
    # sums in float64 over float32 values: no float64 copy of the lines
    norms = np.sqrt(np.einsum("ij,ij->i", a, a, dtype=np.float64) * np.einsum("ij,ij->i", b, b, dtype=np.float64))
    dots = np.einsum("ij,ij->i", a, b, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)
    return np.where(np.isfinite(cos), cos, 0.0)

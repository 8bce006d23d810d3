"""Outliers and super weights of one matrix, base against tuned: the largest-magnitude entries of each side, kept
in top-k sets folded over the diff's row blocks (bounded memory: TOP entries per side per block and per matrix).

Per block and side, the entries of largest |w|: the block's keys are the magnitude bits of each element (the
stored 16- or 32-bit pattern without its sign: monotone in |w| for finite values); the block's slices of
SLICE elements give their largest keys in two reductions over the codes, and only the slices whose largest is
among the TOP largest are read again (`top_indices`): the exact top TOP, never a sort or a copy of the block.
Ties go to the earlier position. For each entry both sides' values are kept, the other side's read at the same
position (so a quantizer's change of the base's largest entries is seen, and the
tuned side's largest entries are placed against the base's).

What a user reads (docs/forensics.md, "Outliers and super weights"):
- an outlier: an entry with |w_base| > OUTLIER_RMS x the RMS of W_base (the matrix's own scale); only the TOP
  largest are tracked, so a count of TOP means "at least TOP";
- survived: the tuned value has the base's sign and is within SURVIVAL of it (|w_t - w_b| <= SURVIVAL |w_b|):
  an absmax-scaled integer or NormalFloat code stores a group's largest entry exactly, FP8 e4m3 within 6.25%;
  a quantizer that clips the tails moves it by far more;
- super weights (Yu, Mei, Zhang, Wu, Zou, Goldstein, Reddi, "The Super Weight in Large Language Models", 2024):
  a handful of scalars in the MLP down projections of early layers whose removal destroys the model; from the
  weights alone they are looked for as the largest-magnitude outliers of the down projections (kinds down and
  ffn_out),
  the SUPER largest over the model.
Pure numerics: arrays in, entries out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codes import F32_FINITE_MAG, FINITE_LIMIT16
from .measures import Side, as_float

TOP = 8  # entries of largest |w| tracked per side and matrix
OUTLIER_RMS = 6.0  # an outlier: |w_base| above this many RMS of W_base (a Gaussian matrix has none: p ~ 2e-9)
SURVIVAL = 0.1  # survived: same sign and within 10% of the base value
SUPER = 6  # super-weight candidates reported per model (Yu et al. found at most six per model)
SUPER_KINDS = ("down", "ffn_out")  # the MLP's down projection (gated: down; two-layer: ffn_out)


@dataclass(frozen=True)
class Entry:
    index: int  # flat position in the matrix (row-major)
    base: float
    tuned: float


@dataclass(frozen=True)
class Part:
    base_top: tuple[Entry, ...]  # the base's largest |w| (descending)
    tuned_top: tuple[Entry, ...]  # the tuned's


SLICE = 1024  # elements per slice whose largest |w| is taken first (two reductions, no copy of the block)
_VIEWS = {2: (np.int16, 0x8000), 4: (np.int32, 0x80000000)}  # signed view, sign bit


def _codes(side: Side) -> tuple[np.ndarray, int] | None:
    """The block's bit patterns (16 or 32 bits) and the largest finite magnitude key; None: float64 values."""
    if side.stored is not None and side.dtype in FINITE_LIMIT16:
        return side.stored.view(np.uint16), FINITE_LIMIT16[side.dtype] - 1
    if side.stored is not None and side.dtype != "F32":
        return None  # F64 and 8-bit floats: their values
    values = side.decoded if side.decoded is not None else side.stored
    assert values is not None
    if values.dtype != np.float32:
        return None
    return np.ascontiguousarray(values).view(np.uint32), F32_FINITE_MAG - 1


def _select(keys: np.ndarray, idx: np.ndarray, k: int) -> np.ndarray:
    """The k positions of largest key among idx (descending, ties to the earlier position)."""
    order = np.lexsort((idx, -keys.astype(np.float64)))
    return idx[order[:k]]


def _fallback(side: Side, k: int) -> np.ndarray:
    """A block's top k by float64 magnitudes (F64, FP8, small blocks or blocks holding NaN or Inf)."""
    mag = np.abs(np.asarray(side.values, dtype=np.float64))
    idx = np.flatnonzero(np.isfinite(mag))
    if idx.size > 4 * k:
        floor = np.partition(mag[idx], idx.size - k)[idx.size - k]
        idx = idx[mag[idx] >= floor]
    return _select(mag[idx], idx, k)


def top_indices(side: Side, k: int = TOP) -> np.ndarray:
    """Positions of the k largest finite |w| of a block (descending, ties to the earlier position).

    On the bit patterns: each SLICE's largest magnitude key is the larger of its largest pattern read as a
    signed integer (the positive values') and its largest read as unsigned less the sign bit (the negative
    values'); every entry at or above the k-th largest of those is in a slice whose largest is, and there are
    at least k of them: only those slices are read again."""
    got = _codes(side)
    n = side.stored.size if side.stored is not None else side.values.size
    if got is None or n < 4 * k * SLICE:
        return _fallback(side, k)
    codes, limit = got
    signed, sign = _VIEWS[codes.itemsize]
    slices = n // SLICE
    body = codes[: slices * SLICE].reshape(slices, SLICE)
    top = np.maximum(
        body.view(signed).max(axis=1).astype(np.int64), body.max(axis=1).astype(np.int64) - sign
    )  # each slice's largest magnitude key
    if top.max() > limit:  # NaN or Inf in the block
        return _fallback(side, k)
    floor = np.partition(top, slices - k)[slices - k]
    hot = np.flatnonzero(top >= floor)
    idx = (hot[:, None] * SLICE + np.arange(SLICE)).reshape(-1)
    idx = np.concatenate([idx, np.arange(slices * SLICE, n)])
    mask = codes.dtype.type(~sign & (2 ** (8 * codes.itemsize) - 1))
    keys = codes[idx] & mask
    keep = (keys >= floor) & (keys <= limit)
    return _select(keys[keep], idx[keep], k)


def _at(side: Side, idx: np.ndarray) -> np.ndarray:
    """float64 values of a side at positions idx (only those converted)."""
    if side.decoded is not None or side.stored is None:
        return np.asarray(side.values[idx], dtype=np.float64)
    return np.asarray(as_float(np.ascontiguousarray(side.stored[idx]), side.dtype), dtype=np.float64)


def block_part(base: Side, tuned: Side, offset: int, k: int = TOP) -> Part:
    """Both sides' largest entries of one block (flat values; `offset`: the block's first flat position)."""
    out = []
    for side in (base, tuned):
        idx = top_indices(side, k)
        b, t = _at(base, idx), _at(tuned, idx)
        out.append(tuple(Entry(int(i) + offset, float(x), float(y)) for i, x, y in zip(idx, b, t, strict=True)))
    return Part(out[0], out[1])


def _merge(held: tuple[Entry, ...], new: tuple[Entry, ...], key: str, k: int) -> tuple[Entry, ...]:
    both = [*held, *new]
    both.sort(key=lambda e: (-abs(getattr(e, key)), e.index))
    return tuple(both[:k])


class Accumulator:
    """Folds the blocks' parts of one matrix (any order gives the same sets: ties go to the earlier position)."""

    def __init__(self, n: int, k: int = TOP) -> None:
        self.n, self.k = n, k
        self.base_top: tuple[Entry, ...] = ()
        self.tuned_top: tuple[Entry, ...] = ()

    def fold(self, part: Part) -> None:
        self.base_top = _merge(self.base_top, part.base_top, "base", self.k)
        self.tuned_top = _merge(self.tuned_top, part.tuned_top, "tuned", self.k)

    def result(self, base_rms: float) -> Extremes:
        return Extremes(self.n, base_rms, self.base_top, self.tuned_top)


def survived(e: Entry) -> bool:
    """Same sign, and within SURVIVAL of the base value."""
    return e.base * e.tuned > 0 and abs(e.tuned - e.base) <= SURVIVAL * abs(e.base)


@dataclass(frozen=True)
class Extremes:
    """One matrix's largest entries on each side (see the module docstring)."""

    n: int  # columns (positions are reported as row, column)
    base_rms: float  # ||W_base||_F / sqrt(numel)
    base_top: tuple[Entry, ...]
    tuned_top: tuple[Entry, ...]

    @property
    def threshold(self) -> float:
        return OUTLIER_RMS * self.base_rms

    @property
    def outliers(self) -> tuple[Entry, ...]:
        """The tracked base entries beyond the threshold (all TOP tracked: there may be more)."""
        return tuple(e for e in self.base_top if abs(e.base) > self.threshold and self.base_rms > 0)

    @property
    def top_kept(self) -> bool | None:
        """The tuned side's largest entry is where the base's is (None: an empty matrix)."""
        if not self.base_top or not self.tuned_top:
            return None
        return self.base_top[0].index == self.tuned_top[0].index

    def _entry(self, e: Entry) -> dict[str, Any]:
        row, col = divmod(e.index, self.n)
        rel = abs(e.tuned - e.base) / abs(e.base) if e.base else None
        return {
            "row": row,
            "col": col,
            "base": e.base,
            "tuned": e.tuned,
            "relative_error": rel if rel is None or math.isfinite(rel) else None,
            "survived": survived(e),
        }

    def to_json(self) -> dict[str, Any]:
        out = self.outliers
        return {
            "base_rms": self.base_rms,
            "threshold": self.threshold,
            "outliers": len(out),
            "outliers_at_least": len(out) == len(self.base_top) and len(out) > 0,
            "survived": sum(survived(e) for e in out),
            "top_kept": self.top_kept,
            "base_top": [self._entry(e) for e in self.base_top],
            "tuned_top": [self._entry(e) for e in self.tuned_top],
        }


def summary(matrices: Sequence[Any]) -> dict[str, Any]:
    """The model's outliers and super weights, base against tuned, and the change of the Weibull k and of alpha:
    `matrices` are TensorDiffs (their `extremes`, `kind`, `figures`, `forensics`)."""
    tracked = lost = 0
    lost_entries: list[dict[str, Any]] = []
    supers: list[tuple[float, str, dict[str, Any]]] = []
    for t in matrices:
        x: Extremes | None = getattr(t, "extremes", None)
        if x is None:
            continue
        for e in x.outliers:
            tracked += 1
            if not survived(e):
                lost += 1
                lost_entries.append({"name": t.name, **x._entry(e)})
            if t.kind in SUPER_KINDS:
                supers.append((abs(e.base), t.name, x._entry(e)))
    supers.sort(key=lambda s: (-s[0], s[1]))
    top_supers = [{"name": name, **entry} for _, name, entry in supers[:SUPER]]
    dk = [t.figures.delta_k for t in matrices if t.figures.delta_k is not None]
    da = [t.forensics.delta_alpha for t in matrices if t.forensics is not None and t.forensics.delta_alpha is not None]
    lost_entries.sort(key=lambda e: -abs(e["base"]))
    return {
        "outlier_rms": OUTLIER_RMS,
        "survival": SURVIVAL,
        "outliers": tracked,
        "outliers_survived": tracked - lost,
        "lost": lost_entries[:10],
        "super_weights": top_supers,
        "super_weights_survived": sum(s["survived"] for s in top_supers),
        "delta_k_median": float(np.median(dk)) if dk else None,
        "delta_k_max_abs": float(np.max(np.abs(dk))) if dk else None,
        "delta_alpha_median": float(np.median(da)) if da else None,
        "delta_alpha_max_abs": float(np.max(np.abs(da))) if da else None,
    }

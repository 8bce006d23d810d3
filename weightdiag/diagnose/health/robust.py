"""The robust depth analysis (pure numerics): per-block points of one statistic, a Theil-Sen depth
trend and leave-one-out local medians, robust z with a floored MAD scale, spots and bands."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .cuts import MAD_SIGMA, MIN_BLOCKS, NEIGHBOURS, Z_CUT, Stat


@dataclass
class Point:
    block: int
    value: float
    tensor: str
    t: float
    local: float = math.nan  # expected, compared units
    local_z: float = 0.0
    neighbours: tuple[int, ...] = ()
    trend: float = math.nan
    trend_z: float = 0.0
    noise: float = 0.0  # one fit's sampling sigma for this matrix's size (compared units), when known
    approximate: bool = False  # the value is known to about 0.5% only (max/q99 of F32 values: cells.q99_exact)


@dataclass
class Series:
    key: str  # matrix kind key, or "norm:<site>"
    stat: Stat
    points: list[Point]
    local_scale: float = math.nan
    trend_scale: float = math.nan
    bands: list[list[Point]] = field(default_factory=list)

    def by_block(self) -> dict[int, Point]:
        return {p.block: p for p in self.points}


def robust_scale(residuals: np.ndarray, floor: float) -> float:
    mad = float(np.median(np.abs(residuals - np.median(residuals)))) if residuals.size else 0.0
    return max(MAD_SIGMA * mad, floor)


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Median of pairwise slopes, intercept = median(y - slope x): robust to ~29% outliers."""
    i, j = np.triu_indices(x.size, 1)
    dx = x[j] - x[i]
    slopes = (y[j] - y[i])[dx != 0] / dx[dx != 0]
    slope = float(np.median(slopes)) if slopes.size else 0.0
    return slope, float(np.median(y - slope * x))


def analyse(series: Series) -> Series:
    """Fill each point's trend and local expectations and robust z, and the series' bands (in place).

    The trend comes first: blocks in a band are left out of their neighbours' local medians, so
    the blocks next to a band are compared with blocks like themselves.
    """
    pts = series.points
    if len(pts) < MIN_BLOCKS:
        return series
    x = np.array([p.block for p in pts], dtype=float)
    y = np.array([p.t for p in pts])
    slope, intercept = theil_sen(x, y)
    trend_res = y - (intercept + slope * x)
    series.trend_scale = robust_scale(trend_res, series.stat.floor)
    for p, tr in zip(pts, trend_res, strict=True):
        p.trend = float(p.t - tr)
        p.trend_z = float(tr / series.trend_scale)
    series.bands = _bands(series)
    banded = {p.block for band in series.bands for p in band}
    for i, p in enumerate(pts):
        pool = [j for j, q in enumerate(pts) if j != i and (q.block not in banded or p.block in banded)]
        near = sorted(pool, key=lambda j: (abs(pts[j].block - p.block), pts[j].block))[:NEIGHBOURS]
        p.local = float(np.median(y[near]))
        p.neighbours = tuple(sorted(pts[j].block for j in near))
    local_res = y - np.array([p.local for p in pts])
    series.local_scale = robust_scale(local_res, series.stat.floor)
    for p, lr in zip(pts, local_res, strict=True):
        p.local_z = float(lr / series.local_scale)
    return series


def effect(p: Point, stat: Stat) -> float:
    """The smallest difference worth a finding here: the statistic's effect size, or Z_CUT sigmas of the
    difference to a median of NEIGHBOURS fits (sigma x sqrt(1 + pi / (2 NEIGHBOURS))) when a small
    matrix's own sampling noise is larger (a 64x176 matrix: k sigma 0.011, so 0.067 instead of 0.05)."""
    return max(stat.min_effect, Z_CUT * p.noise * math.sqrt(1 + math.pi / (2 * NEIGHBOURS)))


def one_sided(p: Point) -> bool:
    """An edge block (first or last blocks): its nearest blocks all lie on one side of it."""
    return bool(p.neighbours) and (min(p.neighbours) > p.block or max(p.neighbours) < p.block)


def spot(p: Point, stat: Stat) -> bool:
    """Off its nearest blocks' median; at an edge block, whose neighbours all lie on one side (so a
    smooth depth trend alone moves their median away from it), off the depth trend too, the same way."""
    local = abs(p.local_z) >= Z_CUT and abs(p.t - p.local) >= effect(p, stat)
    if not local or not one_sided(p):
        return local
    trend = abs(p.trend_z) >= Z_CUT and abs(p.t - p.trend) >= effect(p, stat)
    return trend and (p.trend_z > 0) == (p.local_z > 0)


def _bands(series: Series) -> list[list[Point]]:
    """Runs of >= 2 consecutive blocks off the trend in the same direction, covering at most half the blocks."""
    stat, pts = series.stat, series.points
    off = [abs(p.trend_z) >= Z_CUT and abs(p.t - p.trend) >= effect(p, stat) for p in pts]
    if sum(off) * 2 > len(pts):
        return []  # most blocks are "off": the line is not the model's trend
    runs: list[list[Point]] = []
    for p, flagged in zip(pts, off, strict=True):
        if not flagged:
            continue
        last = runs[-1][-1] if runs else None
        if last is not None and p.block == last.block + 1 and (p.trend_z > 0) == (last.trend_z > 0):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [r for r in runs if len(r) >= 2]

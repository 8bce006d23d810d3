"""The fit stage's result: what one matrix's record holds that is computed from its reductions.

`fit_matrix` turns a matrix's `Reduction` (and those of its fused parts) into a `MatrixFit`: the
statistics, the Weibull fit of every trim under one protocol, the distribution-free tail metrics, the
Gamma closure and the quantization grid. Numbers stay as computed (NaN where there is none); the record
stage (weightdiag.record.row) rounds them and writes NaN as null when it serializes the fit into a row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..reduce.reduction import Reduction
from ..vocabulary import COHORT_TRIM, TRIMS
from .stats import MagnitudeDistribution, MatrixStats, Summary
from .weibull import WeibullFit, gamma_closure

NAN = float("nan")


@dataclass(frozen=True)
class Heaviness:
    """Distribution-free tail metrics of nonzero |w| (for matrices that are not Weibull); NaN without any."""

    q90_q10: float
    q99_q50: float
    p999_p50: float
    gini: float


@dataclass(frozen=True)
class ReductionFit:
    """The statistics and fits of one reduction: a whole matrix, or one part of a fused one."""

    numel: int
    stats: MatrixStats
    argmax: tuple[int, ...] | None  # the first largest finite |w|, in the shape's coordinates; None: no finite value
    fits: Mapping[str, WeibullFit]  # per trim, in TRIMS order
    heaviness: Heaviness
    gamma_closure: float  # F3 of the COHORT_TRIM fit; NaN when that fit failed


@dataclass(frozen=True)
class MatrixFit:
    """One matrix: its whole fit, its fused parts' (q/k/v of a qkv, gate/up of a gate_up), and its grid."""

    whole: ReductionFit
    parts: tuple[tuple[str, ReductionFit], ...] = ()
    grid: tuple[int, int] | None = None  # (bits, group): float values on a quantization grid (reduce.grid_probe)


def heaviness(dist: MagnitudeDistribution) -> Heaviness:
    """q90/q10, q99/q50, p99.9/p50 and the Gini coefficient of the mass of nonzero |w|."""
    nz = dist.nonzero()
    if nz.total == 0:
        return Heaviness(NAN, NAN, NAN, NAN)
    q = {p: nz.quantile(p) for p in (0.10, 0.50, 0.90, 0.99, 0.999)}
    mass = nz.values * nz.counts
    cum_w = np.concatenate([[0.0], np.cumsum(mass) / mass.sum()])
    cum_n = np.concatenate([[0.0], np.cumsum(nz.counts) / nz.total])
    gini = 1.0 - float(np.sum(np.diff(cum_n) * (cum_w[1:] + cum_w[:-1])))
    return Heaviness(q[0.90] / q[0.10], q[0.99] / q[0.50], q[0.999] / q[0.50], gini)


def fit_reduction(red: Reduction, shape: tuple[int, ...], protocol: str, center: bool = False) -> ReductionFit:
    """Statistics and fits of one reduction of a tensor of `shape`; with `center` the fits are of
    |w - mean| (see stats.Summary)."""
    summary = Summary(red, center)
    stats = summary.stats
    fits = {trim: summary.fit(protocol, trim) for trim in TRIMS}
    main = fits[COHORT_TRIM]
    return ReductionFit(
        numel=red.numel,
        stats=stats,
        argmax=tuple(int(i) for i in np.unravel_index(red.argmax, shape)) if red.argmax >= 0 else None,
        fits=fits,
        heaviness=heaviness(summary.magnitudes),
        gamma_closure=gamma_closure(main.k, main.lam, stats.std_abs) if main.ok else math.nan,
    )


def fit_matrix(
    red: Reduction,
    shape: tuple[int, ...],
    protocol: str,
    center: bool = False,
    parts: Sequence[tuple[str, Reduction]] | None = None,
) -> MatrixFit:
    """The fit of a matrix of `shape` from its reduction and its named fused parts' (argmax of a part in the
    whole tensor's coordinates, as the parts' reductions hold it)."""
    return MatrixFit(
        whole=fit_reduction(red, shape, protocol, center),
        parts=tuple((kind, fit_reduction(part, shape, protocol, center)) for kind, part in parts or ()),
        grid=red.grid,
    )

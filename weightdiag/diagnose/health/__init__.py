"""The health report: what is unusual about each block of a fitted model, and why (issue 6).

`health_report(row)` reads one row (docs/row-schema.md) and returns a JSON-able dict: a per-block
table, findings (each unusual block with the statistic, its value, what was expected, how far off
and a reason in plain words), norm-weight regimes, super weights, the depth profile, the shallow-FFN
regime and quantization notes. It never reads weights; docs/report.md explains every rule.

Robust rule. Per matrix kind (and per norm site) each statistic is a series over blocks. It is
compared with two expectations, on log values for scale and tail statistics:
- local: the median of the 4 nearest other blocks (leave-one-out), against which isolated blocks
  stand out ("spots");
- trend: a Theil-Sen line over all blocks, against which a stretch of 2+ consecutive blocks that
  covers at most half the model stands out ("bands", e.g. the Q/K Selection band).
Residuals are scaled by 1.4826 x MAD with a floor per statistic (so near-identical synthetic blocks
do not divide by ~0), and a block is flagged only when |robust z| >= 5 AND the difference is of a
practical size (cuts.STATS). Hard cuts apply only to norm regimes (“Why √d_model Is Your North Star”) and to the
comparison with the paper's Table 2.

The package, each module one job (imports only go down this list):
- cuts: every threshold and constant with its evidence (Stat, STATS, norm regimes, Table 2);
- cells: a row's records gathered into per-(block, kind) cells, quantization_of, text helpers;
- robust: points and series over depth, robust_scale, theil_sen, analyse, spots and bands (numerics);
- findings: hits, their evidence, category and reason, matrix findings, numbering and text;
- norms: norm-weight regimes (“Why √d_model Is Your North Star”) and robust norm outliers;
- superweights: Table 2 comparison, pooled q99 and kurtosis, outlier channels, FFN outlier neurons;
- depth: depth profile, indistinguishable stretches, init-like blocks, Selection placement;
- blocks: shallow-FFN regime, quantization summary, block table, architecture summary;
- report: health_report, assembling the above, and its observation lines.
"""

from __future__ import annotations

from .cells import fmt, quantization_of, short_name, span
from .cuts import (
    FEW_DISTINCT,
    HALF_NORMAL_Q90_Q10,
    INIT_K_TOL,
    INIT_KURTOSIS,
    INIT_MAX_Q99,
    MAD_SIGMA,
    MIN_BLOCKS,
    MODEL_WIDE,
    NEIGHBOURS,
    NORM_AT_INIT_ABS,
    NORM_COLLAPSE,
    NORM_EXPLOSION,
    NORM_STAT,
    QUANT_K_SHIFT,
    STATS,
    TABLE2,
    Z_CUT,
    Stat,
)
from .findings import finding
from .norms import norm_regime
from .report import health_report
from .robust import analyse, robust_scale, theil_sen
from .superweights import hidden_index, pooled_kurtosis, pooled_q99

__all__ = [
    "FEW_DISTINCT",
    "HALF_NORMAL_Q90_Q10",
    "INIT_KURTOSIS",
    "INIT_K_TOL",
    "INIT_MAX_Q99",
    "MAD_SIGMA",
    "MIN_BLOCKS",
    "MODEL_WIDE",
    "NEIGHBOURS",
    "NORM_AT_INIT_ABS",
    "NORM_COLLAPSE",
    "NORM_EXPLOSION",
    "NORM_STAT",
    "QUANT_K_SHIFT",
    "STATS",
    "TABLE2",
    "Z_CUT",
    "Stat",
    "analyse",
    "finding",
    "fmt",
    "health_report",
    "hidden_index",
    "norm_regime",
    "pooled_kurtosis",
    "pooled_q99",
    "quantization_of",
    "robust_scale",
    "short_name",
    "span",
    "theil_sen",
]

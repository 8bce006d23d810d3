"""Per-kind summaries of a row and the model's place on the lambda axis: the row's interpretation.

`pipeline` measures (a record per matrix); `interpret` adds what the measurements mean: each kind's
medians over blocks with its k class (the Weibull paper, arXiv 2605.18898, Sec. 2.2 and Table 2) and
the training hyperparameters that place the model on the lambda axis (T/tau, Sec. 5).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from statistics import median  # np.median would import numpy.ma: 20-30 ms of a fit's start-up
from typing import Any, cast

from ..record.row import json_float
from ..record.schema import Row
from ..vocabulary import COHORT_TRIM, kind_class, kind_order
from . import lambda_axis
from .classes import NON_WEIBULL_R2, kind_k_fields
from .spectrum import spectrum_kinds

_K_AXIS = ("selection", "transmission")


def interpret(
    row: Mapping[str, Any],
    *,
    lr: float | None = None,
    weight_decay: float | None = None,
    steps: float | None = None,
    preset: str | None = None,
) -> Row:
    """The measured row with `hyperparameters`, `kinds` and `part_kinds` (at the row's trim) added."""
    trim = row["protocol"]["trim"]
    added = {
        "hyperparameters": lambda_axis.resolve(
            row["model"]["id"],
            row["model"].get("revision"),
            lr=lr,
            weight_decay=weight_decay,
            steps=steps,
            preset=preset,
        ).to_json(),
        "kinds": kind_summaries(row["matrices"], trim),
        "part_kinds": kind_summaries(row["matrices"], trim, parts=True),
    }
    if any("spectrum" in m for m in row["matrices"]):  # fit --spectrum: alpha per kind (diagnose.spectrum)
        added["spectrum_kinds"] = spectrum_kinds(row["matrices"])
    out: dict[str, Any] = {}
    for key, value in row.items():  # keep the documented key order: these come before the matrices
        if key == "matrices":
            out.update(added)
        out[key] = value
    return cast(Row, out)  # the measured keys and the summaries: all that a Row requires


def kind_summaries(matrices: list[dict[str, Any]], trim: str = COHORT_TRIM, parts: bool = False) -> dict[str, Any]:
    """Per-kind medians over blocks (and experts), as in the cohort database's columns."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for m in matrices:
        if parts:
            for p in m.get("parts", []):
                groups[p["kind"]].append(p)
        else:
            groups[m["kind"]].append(m)
    out: dict[str, Any] = {}
    for kind, records in groups.items():
        fits = [r["fits"][trim] for r in records if r["fits"][trim]["ok"]]
        ks = [f["k"] for f in fits]
        lams = [f["lambda"] for f in fits]
        r2s = [f["r2"] for f in fits if f["r2"] is not None]
        k_med = float(median(ks)) if ks else None
        r2_med = float(median(r2s)) if r2s else None
        low = sum(1 for r in r2s if r < NON_WEIBULL_R2)
        out[kind] = {
            "class": kind_class(kind),
            "count": len(records),
            "fitted": len(fits),
            "k_median": json_float(k_med),
            "lambda_median": json_float(float(median(lams))) if lams else None,
            "r2_median": json_float(r2_med),
            "r2_below_95": low,  # of `fitted` fits (the text "a/b" before issue 33)
            "k_min": json_float(min(ks)) if ks else None,
            "k_max": json_float(max(ks)) if ks else None,
            # The k axis is defined for the attention and FFN matrices only (paper Sec. 2.2); quantized
            # matrices get no class (k_class_withheld says why), flags need a departure beyond noise.
            **kind_k_fields(records, k_med, r2_med, kind_class(kind) in _K_AXIS, trim),
        }
    return dict(sorted(out.items(), key=lambda item: kind_order(item[0])))


def at_trim(row: Mapping[str, Any], trim: str = COHORT_TRIM) -> Mapping[str, Any]:
    """The row with its per-kind summaries taken at `trim` (the cohort's is mid80).

    Every matrix record keeps its fits at all trims, so a row fitted with --trim mid90 still compares
    like for like with the cohort: its summaries are rebuilt here rather than mixed across trims.
    """
    if row["protocol"].get("trim", COHORT_TRIM) == trim or not row.get("matrices"):
        return row
    return {
        **row,
        "protocol": {**row["protocol"], "trim": trim},
        "kinds": kind_summaries(row["matrices"], trim),
        "part_kinds": kind_summaries(row["matrices"], trim, parts=True),
    }

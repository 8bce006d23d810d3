"""The row: one JSON document per model (and revision) that every later command reads.

Schema `weightdiag.row/1` is documented field by field in docs/row-schema.md (typed in record/schema.py).
Records are serialized here from the fit stage's results (weightdiag.fit.matrix.MatrixFit) and the vectors'
summaries; nothing in this module fits or reads files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from ..fit.matrix import Heaviness, MatrixFit, ReductionFit, fit_reduction
from ..fit.stats import MatrixStats
from ..fit.weibull import WeibullFit
from ..layout import TensorRole
from ..reduce.reduction import Reduction
from ..reduce.vectors import VectorSummary

SCHEMA = "weightdiag.row/1"


def json_float(value: float | None, digits: int = 10) -> float | None:
    """JSON-safe float: NaN/Inf become null; rounding keeps rows readable and diff-stable."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _number(value: object) -> object:
    return json_float(value) if isinstance(value, float) else value


def reduction_fields(fit: ReductionFit) -> dict[str, Any]:
    """The fields of one reduction's fit in a record: `numel`, `stats`, `argmax`, `fits`, `heaviness` and
    `gamma_closure` (numbers rounded by json_float, NaN as null)."""
    return {
        "numel": fit.numel,
        "stats": {k: _number(v) for k, v in fit.stats.to_json().items()},
        "argmax": list(fit.argmax) if fit.argmax is not None else None,
        "fits": {trim: {k: _number(v) for k, v in f.to_json().items()} for trim, f in fit.fits.items()},
        "heaviness": {f.name: json_float(getattr(fit.heaviness, f.name)) for f in fields(fit.heaviness)},
        "gamma_closure": json_float(fit.gamma_closure),
    }


def reduction_record(red: Reduction, shape: tuple[int, ...], protocol: str, center: bool = False) -> dict[str, Any]:
    """Statistics and fits of one reduction (a whole matrix or one part of a fused one), as a record's fields."""
    return reduction_fields(fit_reduction(red, shape, protocol, center))


def matrix_record(
    name: str,
    role: TensorRole,
    dtype: str,
    shape: tuple[int, ...],
    fit: MatrixFit,
    parts_note: str | None = None,
    note: str | None = None,
    stored_type: str | None = None,
    quantization: str | None = None,
    dequantized: dict[str, Any] | None = None,
    slice_of: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One matrix's record: a stored tensor, or (`slice_of`) one record cut from it (an expert of fused
    experts), with its `fit` (weightdiag.fit.matrix.fit_matrix) serialized."""
    record: dict[str, Any] = {
        "name": name,
        "block": role.block,
        "expert": role.expert,
        "kind": role.kind,
        "class": role.cls,
        **dtype_fields(dtype, stored_type, quantization),
        "shape": list(shape),
        **role_fields(role, slice_of),
    }
    notes = [n for n in (role.note, note) if n]
    if notes:
        record["note"] = "; ".join(notes)
    record.update(reduction_fields(fit.whole))
    if fit.parts:
        record["parts"] = [{"kind": kind, **reduction_fields(part)} for kind, part in fit.parts]
    if parts_note:
        record["parts_note"] = parts_note
    if dequantized:  # a quantized checkpoint's weight: its format and how its values were computed
        record["dequantized"] = dequantized
    elif fit.grid is not None:  # floats that hold dequantized values: a 4-bit grid per group of a row
        record["grid"] = {"bits": fit.grid[0], "group": fit.grid[1]}
    return record


def _float(value: float | None) -> float:
    return math.nan if value is None else float(value)


def read_reduction_fit(record: Mapping[str, Any]) -> ReductionFit:
    """The fit of one reduction back from its record's fields (null numbers as NaN, rounded as written)."""
    stats = record["stats"]
    values: dict[str, Any] = {f.name: math.nan if stats[f.name] is None else stats[f.name] for f in fields(MatrixStats)}
    return ReductionFit(
        numel=record["numel"],
        stats=MatrixStats(**values),
        argmax=tuple(record["argmax"]) if record["argmax"] is not None else None,
        fits={
            trim: WeibullFit(
                _float(f["k"]), _float(f["lambda"]), _float(f["r2"]), _float(f["ks"]), f["points"], f["ok"], f["reason"]
            )
            for trim, f in record["fits"].items()
        },
        heaviness=Heaviness(**{f.name: _float(record["heaviness"][f.name]) for f in fields(Heaviness)}),
        gamma_closure=_float(record["gamma_closure"]),
    )


def read_matrix_fit(record: Mapping[str, Any]) -> MatrixFit:
    """The MatrixFit a matrix record written by this version holds (matrix_record's inverse up to the rounding
    of the row: serialized again, it gives the same record). A quantized weight's record has no grid."""
    grid = record.get("grid")
    return MatrixFit(
        whole=read_reduction_fit(record),
        parts=tuple((part["kind"], read_reduction_fit(part)) for part in record.get("parts", ())),
        grid=(grid["bits"], grid["group"]) if grid else None,
    )


def role_fields(role: TensorRole, slice_of: dict[str, Any] | None = None) -> dict[str, Any]:
    """Optional fields of a matrix or vector record: `tower` and `tower_kind` for a vision/audio tower's
    tensor (kind `other`, block = the tower's layer), `slice_of` for a record cut from a stored tensor."""
    out: dict[str, Any] = {}
    if role.tower:
        out["tower"] = role.tower
        out["tower_kind"] = role.tower_kind
    if slice_of:
        out["slice_of"] = slice_of
    return out


def dtype_fields(dtype: str, stored_type: str | None, quantization: str | None) -> dict[str, str]:
    """`dtype` as stored in the file; `fitted_dtype` when the values were decoded to another type
    (GGUF Q4_1 -> F32) and `quantization` when they were dequantized, so a Q4_1 matrix never reads as F32."""
    if not stored_type or stored_type == dtype:
        return {"dtype": dtype}
    out = {"dtype": stored_type, "fitted_dtype": dtype}
    if quantization:
        out["quantization"] = quantization
    return out


def vector_record(
    name: str,
    role: TensorRole,
    dtype: str,
    summary: VectorSummary,
    norm_offset: float,
    stored_type: str | None = None,
    quantization: str | None = None,
    slice_of: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """1-D tensors: norms (gamma/beta) and biases get their own statistics, from the vector's summary
    (computed with `vector_offset(role, norm_offset)` added to its values)."""
    record: dict[str, Any] = {
        "name": name,
        "block": role.block,
        "expert": role.expert,
        "kind": role.kind,
        "param": role.param,
        **dtype_fields(dtype, stored_type, quantization),
        "numel": summary.numel,
        "n_nonfinite": summary.numel - summary.n,
        **role_fields(role, slice_of),
    }
    if role.site:
        record["site"] = role.site
    if role.of_kind:
        record["of_kind"] = role.of_kind
    if role.note:
        record["note"] = role.note
    offset = vector_offset(role, norm_offset)
    if offset:
        record["offset_applied"] = offset
    l2 = summary.l2
    record.update(
        {
            "l2": json_float(l2),
            "mean": json_float(summary.mean),
            "std": json_float(summary.std),
            "min": json_float(summary.vmin),
            "max": json_float(summary.vmax),
        }
    )
    if role.kind == "norm" and role.param == "weight":
        record["l2_over_sqrt_d"] = json_float(l2 / math.sqrt(summary.numel)) if summary.numel else None
    return record


def vector_offset(role: TensorRole, norm_offset: float) -> float:
    """What to add to a vector's stored values: the norm offset for norm weights (Gemma stores gamma - 1)."""
    return norm_offset if role.kind == "norm" and role.param == "weight" else 0.0

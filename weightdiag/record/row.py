"""The row: one JSON document per model (and revision) that every later command reads.

Schema `weightdiag.row/1` is documented field by field in docs/row-schema.md. Records are built
here from reductions; nothing in this module reads files.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..fit.stats import MagnitudeDistribution, Summary
from ..fit.weibull import TRIMS, gamma_closure
from ..layout import TensorRole
from ..reduce.reduction import Reduction
from ..reduce.vectors import VectorSummary
from ..vocabulary import COHORT_TRIM

SCHEMA = "weightdiag.row/1"


def json_float(value: float | None, digits: int = 10) -> float | None:
    """JSON-safe float: NaN/Inf become null; rounding keeps rows readable and diff-stable."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def heaviness(dist: MagnitudeDistribution) -> dict[str, float | None]:
    """Distribution-free tail metrics of nonzero |w| (for fits that are not Weibull)."""
    nz = dist.nonzero()
    if nz.total == 0:
        return {"q90_q10": None, "q99_q50": None, "p999_p50": None, "gini": None}
    q = {p: nz.quantile(p) for p in (0.10, 0.50, 0.90, 0.99, 0.999)}
    mass = nz.values * nz.counts
    cum_w = np.concatenate([[0.0], np.cumsum(mass) / mass.sum()])
    cum_n = np.concatenate([[0.0], np.cumsum(nz.counts) / nz.total])
    gini = 1.0 - float(np.sum(np.diff(cum_n) * (cum_w[1:] + cum_w[:-1])))
    return {
        "q90_q10": json_float(q[0.90] / q[0.10]),
        "q99_q50": json_float(q[0.99] / q[0.50]),
        "p999_p50": json_float(q[0.999] / q[0.50]),
        "gini": json_float(gini),
    }


def reduction_record(red: Reduction, shape: tuple[int, ...], protocol: str, center: bool = False) -> dict[str, Any]:
    """Statistics and fits of one reduction (a whole matrix or one part of a fused one); with
    `center` the fits are of |w - mean| (see stats.Summary)."""
    summary = Summary(red, center)
    stats = summary.stats
    fits = {trim: summary.fit(protocol, trim) for trim in TRIMS}
    record: dict[str, Any] = {
        "numel": red.numel,
        "stats": {k: (json_float(v) if isinstance(v, float) else v) for k, v in stats.to_json().items()},
        "argmax": [int(i) for i in np.unravel_index(red.argmax, shape)] if red.argmax >= 0 else None,
        "fits": {
            trim: {k: (json_float(v) if isinstance(v, float) else v) for k, v in f.to_json().items()}
            for trim, f in fits.items()
        },
        "heaviness": heaviness(summary.magnitudes),
    }
    main = fits[COHORT_TRIM]
    record["gamma_closure"] = json_float(gamma_closure(main.k, main.lam, stats.std_abs)) if main.ok else None
    return record


def matrix_record(
    name: str,
    role: TensorRole,
    dtype: str,
    shape: tuple[int, ...],
    red: Reduction,
    protocol: str,
    parts: list[tuple[str, Reduction]] | None = None,
    parts_note: str | None = None,
    note: str | None = None,
    stored_type: str | None = None,
    quantization: str | None = None,
    center: bool = False,
    dequantized: dict[str, Any] | None = None,
    slice_of: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One matrix: a stored tensor, or (`slice_of`) one record cut from it (an expert of fused experts)."""
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
    record.update(reduction_record(red, shape, protocol, center))
    if parts:
        record["parts"] = [{"kind": kind, **reduction_record(part, shape, protocol, center)} for kind, part in parts]
    if parts_note:
        record["parts_note"] = parts_note
    if dequantized:  # a quantized checkpoint's weight: its format and how its values were computed
        record["dequantized"] = dequantized
    elif red.grid is not None:  # floats that hold dequantized values: a 4-bit grid per group of a row
        record["grid"] = {"bits": red.grid[0], "group": red.grid[1]}
    return record


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

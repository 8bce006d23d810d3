"""NaN and Inf values: a matrix or vector that holds any is itself a finding (a diverged or corrupt
checkpoint), placed in its own block; its statistics, where any are left, describe the finite values only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cells import elide, short_name
from .findings import finding


def nonfinite_counts(rec: dict[str, Any]) -> tuple[int, int, int, int]:
    """(NaN, Inf, non-finite, total) of a matrix or vector record; vectors store only the non-finite count."""
    stats = rec.get("stats")
    if stats is not None:
        n_nan, n_inf = int(stats.get("n_nan") or 0), int(stats.get("n_inf") or 0)
        total = int(stats.get("numel") or rec.get("numel") or 0)
        return n_nan, n_inf, n_nan + n_inf, total
    bad = int(rec.get("n_nonfinite") or 0)
    return 0, 0, bad, int(rec.get("numel") or 0)


def _what_is_bad(n_nan: int, n_inf: int, bad: int, total: int) -> str:
    if n_nan or n_inf:
        counted = " and ".join(f"{n:,} {label}" for n, label in ((n_nan, "NaN"), (n_inf, "Inf")) if n)
    else:
        counted = f"{bad:,} NaN or Inf"  # vectors: the row keeps the sum only
    if bad < total:
        return f"has {counted} among its {total:,} values"
    if n_nan == total or n_inf == total:
        return f"is all {'NaN' if n_nan else 'Inf'} ({total:,} values)"
    return f"has {counted}: none of its {total:,} values is finite"


def nonfinite_findings(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One warning per matrix or vector with NaN or Inf values."""
    out = []
    for rec in [*row.get("matrices", []), *row.get("vectors", [])]:
        n_nan, n_inf, bad, total = nonfinite_counts(rec)
        if not bad:
            continue
        is_matrix = "stats" in rec
        noun = "matrix" if is_matrix else f"{rec.get('kind') or 'vector'} vector"
        left = (
            "no statistic or fit can be computed from it"
            if bad >= total
            else f"its statistics and fit use the {total - bad:,} finite values only"
        )
        out.append(
            finding(
                "non-finite",
                [] if rec.get("block") is None else [rec["block"]],
                f"{noun} {elide(rec['name'])} {_what_is_bad(n_nan, n_inf, bad, total)}",
                f"the checkpoint diverged or is corrupt; {left}",
                kinds=[rec["kind"]] if rec.get("kind") else [],
                tensors=[rec["name"]],
                what=short_name(rec["name"]),
                statistic="non_finite",
                value=bad,
                n_nan=n_nan if is_matrix else None,
                n_inf=n_inf if is_matrix else None,
                numel=total,
                expected=0,
                expected_from="a trained checkpoint holds finite values only",
                deviation=bad / total if total else None,
                deviation_type="fraction of values that are NaN or Inf",
            )
        )
    return out

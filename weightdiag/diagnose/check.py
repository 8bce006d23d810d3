"""Regression check of a fitted row against a baseline row, matrix by matrix (for CI).

A matrix passes when |k - k_base| <= tol_k (absolute) and |lambda / lambda_base - 1| <= tol_lambda
(relative) under the same protocol and trim. Parts of fused matrices are checked as
`name#q` etc. A matrix present on one side only fails (the checkpoint's layout changed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast
from xml.sax.saxutils import escape, quoteattr

from ..errors import RowUseError
from ..vocabulary import COHORT_TRIM
from .results import CheckResult

DEFAULT_TOL_K = 0.002
DEFAULT_TOL_LAMBDA = 0.01


def _fits(row: Mapping[str, Any], trim: str) -> dict[str, dict[str, Any]]:
    out = {}
    for m in row.get("matrices", []):
        out[m["name"]] = m["fits"][trim]
        for part in m.get("parts", []):
            out[f"{m['name']}#{part['kind']}"] = part["fits"][trim]
    return out


def _named(row: Mapping[str, Any]) -> str:
    """A row's model as `check --revision` names it: id@revision where it has one (issue 42: the errors and the
    verdict named the model without the revision checked, the baseline with its own)."""
    model = row.get("model") or {}
    return str(model.get("id")) + (f"@{model['revision']}" if model.get("revision") else "")


def check(
    row: Mapping[str, Any],
    baseline: Mapping[str, Any],
    tol_k: float = DEFAULT_TOL_K,
    tol_lambda: float = DEFAULT_TOL_LAMBDA,
    trim: str = COHORT_TRIM,
) -> CheckResult:
    if row["protocol"]["name"] != baseline["protocol"]["name"]:
        raise RowUseError(
            f"the baseline was fitted with --protocol {baseline['protocol']['name']} and {_named(row)} with "
            f"{row['protocol']['name']}; refit with the baseline's protocol",
            model_id=row.get("model", {}).get("id"),
        )
    if not baseline.get("matrices"):
        raise RowUseError(
            "the baseline row has no per-matrix fits (a cohort summary?); give a fitted row",
            model_id=baseline.get("model", {}).get("id"),
        )
    if not row.get("matrices"):
        raise RowUseError(
            f"the row of {_named(row)} has no per-matrix fits (a cohort summary?); give a model or a fitted row",
            model_id=row.get("model", {}).get("id"),
        )
    ours, base = _fits(row, trim), _fits(baseline, trim)
    if not set(ours) & set(base):  # nothing to compare is a wrong baseline, not a regression (exit 1)
        theirs, mine = sorted(base)[:1], sorted(ours)[:1]
        raise RowUseError(
            f"{_named(row)} and the baseline {_named(baseline)} share no matrix name (e.g. "
            f"{mine[0] if mine else '-'} against {theirs[0] if theirs else '-'}); give the baseline of this model",
            model_id=row.get("model", {}).get("id"),
        )
    results = []
    for name in sorted(set(ours) | set(base), key=lambda n: (n not in base, n)):
        a, b = ours.get(name), base.get(name)
        entry: dict[str, Any] = {"name": name}
        if b is None:
            entry.update(status="new", detail="not in the baseline")
        elif a is None:
            entry.update(status="missing", detail="in the baseline, not in this model")
        elif not (a["ok"] and b["ok"]):
            same = a["ok"] == b["ok"]
            entry.update(
                status="ok" if same else "changed",
                detail="not fittable on either side" if same else "fittable on one side only",
            )
        else:
            dk = a["k"] - b["k"]
            dl = a["lambda"] / b["lambda"] - 1 if b["lambda"] else math.inf
            moved = abs(dk) > tol_k or abs(dl) > tol_lambda
            entry.update(
                status="moved" if moved else "ok",
                k=a["k"],
                k_base=b["k"],
                delta_k=dk,
                **{"lambda": a["lambda"]},
                lambda_base=b["lambda"],
                delta_lambda_rel=dl,
            )
        results.append(entry)
    failed = [r for r in results if r["status"] != "ok"]
    result = {
        "model": _named(row),
        "baseline": _named(baseline),
        "trim": trim,
        "tol_k": tol_k,
        "tol_lambda": tol_lambda,
        "checked": len(results),
        "failed": len(failed),
        "passed": not failed,
        "results": results,
    }
    return cast(CheckResult, result)


def junit_xml(result: CheckResult) -> str:
    """JUnit XML: one test case per matrix, failures for moved/missing/new ones."""
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuite name={quoteattr("weightdiag check " + result["model"])} tests="{result["checked"]}" '
        f'failures="{result["failed"]}">',
    ]
    for r in result["results"]:
        lines.append(f'  <testcase classname="weightdiag.check" name={quoteattr(r["name"])}>')
        if r["status"] != "ok":
            if r["status"] == "moved":
                message = (
                    f"k {r['k']:.6f} vs {r['k_base']:.6f} (delta {r['delta_k']:+.6f}, tol {result['tol_k']}); "
                    f"lambda {r['lambda']:.6g} vs {r['lambda_base']:.6g} "
                    f"({r['delta_lambda_rel'] * 100:+.3f}%, tol {result['tol_lambda'] * 100:g}%)"
                )
            else:
                message = r.get("detail", r["status"])
            lines.append(
                f"    <failure type={quoteattr(r['status'])} message={quoteattr(message)}>{escape(message)}</failure>"
            )
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"

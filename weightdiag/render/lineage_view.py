"""`weightdiag lineage` as text: one block per reference, strongest evidence first."""

from __future__ import annotations

from typing import Any


def _p(log10_p: float | None) -> str:
    if log10_p is None:
        return "p n/a"
    if log10_p > -4:
        return f"p = {10**log10_p:.3g}"
    return f"p = 1e{log10_p:.0f}"  # log10 of p: far below what a float holds for most derived models


def lineage_view(report: Any) -> str:
    """The report (api.LineageReport) as plain text."""
    lines = [f"lineage of {report.candidate} ({report.how}) against {report.references} reference(s)"]
    if report.declared is not None:
        nearest = f"; it derives from {report.nearest} instead" if report.nearest else ""
        lines.append(f"declared base_model {report.declared}: {report.declaration}{nearest}")
        for base, _, verdict in report.declarations if len(report.declarations) > 1 else []:
            lines.append(f"    {base}: {verdict}")
        for reference, nbytes in report.bytes_read.items():
            lines.append(f"    {reference}: no row; sampled reads of its matrices, {nbytes:,} bytes read")
    if not report.judgements:
        lines.append("  no references: fit models into the database, or name them with --against")
    for j in report.judgements:
        lines.append(f"{j.verdict:<12} {j.reference}  {_p(j.log10_p)}  ({j.matrices_compared} matrices compared)")
        if j.relation:
            lines.append(f"    relation: {'; '.join(j.relation)}")
        if j.reason:
            lines.append(f"    {j.reason}")
        for e in j.evidence[:3] if j.verdict != "independent" else []:
            target = e.reference if e.reference == e.candidate else f"{e.candidate} ~ {e.reference}"
            lines.append(f"    {target}: rho {e.rho:.3f} over {e.samples} samples")
        if j.not_compared and j.verdict != "not judged":
            shown = ", ".join(j.not_compared[:3]) + (", ..." if len(j.not_compared) > 3 else "")
            lines.append(f"    not compared ({len(j.not_compared)}: no reference matrix of their shape): {shown}")
    return "\n".join(lines)

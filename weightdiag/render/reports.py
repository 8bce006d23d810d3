"""Rich renderings of compare, check and db results."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .tables import fmt


def compare_view(report: dict[str, Any]) -> Group:
    title = report["model"] + (f"@{report['revision']}" if report.get("revision") else "")
    table = Table(
        title=f"{escape(title)} vs the 12-entry cohort",
        caption=f"attention {report['attention']}; group {report['group']}",
    )
    for col in ("kind", "k", "λ", "class", "cohort k range", "same-group k range", "nearest by k"):
        table.add_column(col, justify="right" if col in ("k", "λ") else "left")
    for kind, s in report["kinds"].items():
        rng = s["cohort_k_range"]
        grp = s["group_k_range"]
        table.add_row(
            kind,
            fmt(s["k"]),
            fmt(s["lambda"], ".5g"),
            s["class"] or "-",
            f"{rng[0]:.4f}-{rng[1]:.4f}" if rng else "-",
            f"{grp[0]:.4f}-{grp[1]:.4f}" if grp else "-",
            s["nearest_by_k"] or "-",
        )
    parts: list[Any] = [table]
    if report["nearest"]:
        near = Table(title="nearest cohort entries (distance over shared kinds)")
        for col in ("entry", "distance", "group", "kinds"):
            near.add_column(col)
        for n in report["nearest"]:
            near.add_row(n["entry"], f"{n['distance']:.2f}", n["group"], ", ".join(n["kinds"]))
        parts.append(near)
    findings = Text("Findings\n", style="bold")
    for line in report["findings"]:
        findings.append(f"  - {line}\n", style="")
    parts.append(findings)
    parts.append(Text(report["attribution"], style="dim"))
    return Group(*parts)


def check_view(result: dict[str, Any], show_all: bool = False) -> Table:
    status = "PASS" if result["passed"] else "FAIL"
    table = Table(
        title=f"check {escape(result['model'])} against {escape(str(result['baseline']))}: {status} "
        f"({result['failed']} of {result['checked']} matrices moved or changed)",
        caption=f"tolerances: |Δk| <= {result['tol_k']}, |Δλ/λ| <= {result['tol_lambda'] * 100:g}% ({result['trim']})",
    )
    for col in ("matrix", "status", "k", "baseline k", "Δk", "λ", "baseline λ", "Δλ/λ"):
        table.add_column(col, justify="left" if col in ("matrix", "status") else "right")
    for r in result["results"]:
        if r["status"] == "ok" and not show_all:
            continue
        if "k" in r:
            table.add_row(
                escape(r["name"]),
                r["status"],
                fmt(r["k"], ".5f"),
                fmt(r["k_base"], ".5f"),
                f"{r['delta_k']:+.5f}",
                fmt(r["lambda"], ".5g"),
                fmt(r["lambda_base"], ".5g"),
                f"{r['delta_lambda_rel'] * 100:+.3f}%",
            )
        else:
            table.add_row(escape(r["name"]), r["status"], "-", "-", "-", "-", "-", escape(r.get("detail", "")))
    return table


def db_list_view(rows: list[dict[str, Any]]) -> Table:
    table = Table(title=f"{len(rows)} rows")
    for col in ("id", "revision", "source", "protocol", "matrices", "FFN median k", "attention", "created"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            escape(r["id"]),
            escape(r["revision"] or "-"),
            r["source"],
            r["protocol"],
            str(r["matrices"]),
            fmt(r["ffn_median_k"]),
            r["attention"] or "-",
            r["created"] or "-",
        )
    return table


def trajectory_view(t: dict[str, Any]) -> Group:
    parts: list[Any] = []
    if not t.get("steps"):
        return Group(Text("\n".join(t["findings"])))
    kinds = list(t["kinds"])
    protocol = f", {t['protocol']}" if t.get("protocol") else ""
    table = Table(title=f"{escape(t['model'])}: per-kind median k (λ) over {len(t['steps'])} checkpoints{protocol}")
    table.add_column("step", justify="right")
    table.add_column("T/τ state")
    for kind in kinds:
        table.add_column(kind, justify="right")
    states = {s["step"]: s for s in t["states"]}
    for step, revision in zip(t["steps"], t["revisions"], strict=True):
        cells = []
        for kind in kinds:
            s = t["kinds"][kind]
            if step in s["steps"]:
                i = s["steps"].index(step)
                cells.append(f"{s['k'][i]:.4f} ({s['lambda'][i]:.3g})")
            else:
                cells.append("-")
        state = states.get(step, {})
        label = f"{state['t_over_tau']:.3g} {state['state']}" if state.get("t_over_tau") is not None else "unknown"
        original = t["duplicates"].get(revision)
        table.add_row(str(step) + (f" (= {escape(original)})" if original else ""), label, *cells)
    parts.append(table)
    findings = Text("Findings\n", style="bold")
    for line in t["findings"]:
        findings.append(f"  - {line}\n", style="")
    parts.append(findings)
    if t.get("plots"):
        parts.append(Text("plots: " + ", ".join(t["plots"]), style="dim"))
    return Group(*parts)

"""Rich renderings of compare, check and db results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .. import tuning
from ..diagnose.results import CheckResult, CompareReport, FlatRecord, TrajectoryResult
from .tables import FirstFit, FitWidth, counted, fmt

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from ..diagnose.results import CheckResult, CompareReport, FlatRecord, TrajectoryResult


def compare_view(report: CompareReport) -> Group:
    title = report["model"] + (f"@{report['revision']}" if report.get("revision") else "")
    table = Table(
        title=f"{escape(title)} vs the 12-entry cohort",
        caption=f"attention {report['attention']}; group {report['group']}",
    )
    # "k class": the class the kind's median k falls in (fit's "k class"), not the kind's role
    for col in ("kind", "k", "λ", "k class", "cohort k range", "same-group k range", "nearest by k"):
        # Numbers, ranges and entry ids stay whole; a narrow terminal loses the group range, then λ.
        table.add_column(col, justify="right" if col in ("k", "λ") else "left", no_wrap=col != "k class")
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
    parts: list[Any] = [FitWidth(table, optional=("same-group k range", "λ"))]
    if report["nearest"]:
        near = Table(title="nearest cohort entries (distance over shared kinds)")
        for col in ("entry", "distance", "group", "kinds"):
            near.add_column(col, no_wrap=col in ("entry", "distance"))  # the group and kinds fold at spaces
        for n in report["nearest"]:
            near.add_row(n["entry"], f"{n['distance']:.2f}", n["group"], ", ".join(n["kinds"]))
        parts.append(FitWidth(near))
    related = (report.get("lineage") or {}).get("relatives") or []
    if related:  # beside the nearest by statistics: the database's rows its weights derive from
        kin = Table(title="nearest relatives by lineage (the database's rows its weights derive from)")
        for col in ("row", "relation", "p"):
            kin.add_column(col, no_wrap=col != "relation")
        for r in related:
            p = "-" if r["log10_p"] is None else f"1e{r['log10_p']:.0f}"
            kin.add_row(r["reference"], ("copy: " if r["copy"] else "") + "; ".join(r["relation"]), p)
        parts.append(FitWidth(kin))
    if report.get("spectrum"):  # a row with spectra (fit --spectrum)
        from .spectrum_view import compare_spectrum_table

        parts.append(compare_spectrum_table(report["spectrum"]))
    findings = Text("Findings\n", style="bold")
    for line in report["findings"]:
        findings.append(f"  - {line}\n", style="")
    parts.append(findings)
    parts.append(Text(report["attribution"], style="dim"))
    return Group(*parts)


def check_view(result: CheckResult, show_passing: bool = False) -> FitWidth:
    status = "PASS" if result["passed"] else "FAIL"
    table = Table(
        title=f"check {escape(result['model'])} against {escape(str(result['baseline']))}: {status} "
        f"({result['failed']} of {result['checked']} matrices moved or changed)",
        caption=f"tolerances: |Δk| <= {result['tol_k']}, |Δλ/λ| <= {result['tol_lambda'] * 100:g}% ({result['trim']})",
    )
    for col in ("matrix", "status", "k", "baseline k", "Δk", "λ", "baseline λ", "Δλ/λ"):
        # Matrix names and numbers stay whole (a failure's detail, in the last column, folds); a narrow
        # terminal loses the baselines first (k and Δk give them back), then λ and k: the changes stay.
        table.add_column(col, justify="left" if col in ("matrix", "status") else "right", no_wrap=col != "Δλ/λ")
    for r in result["results"]:
        if r["status"] == "ok" and not show_passing:
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
    return FitWidth(table, optional=("baseline k", "baseline λ", "λ", "k"))


def db_list_view(rows: list[FlatRecord], width: int | None = None) -> FitWidth | Text:
    """The listing: a table, or plain aligned text when there are many rows or when even the narrowest table
    could not show every id and revision whole on `width` columns (the table would fold them across lines)."""
    many = len(rows) > tuning.current().plain_list_rows
    if many or (width is not None and rows and _narrowest_list_table(rows) > width):
        return _plain_list(rows)
    table = Table(title=counted(len(rows), "row"))
    for col in _LIST_COLUMNS:
        # Ids and revisions whole, never cut: `db show ID@REVISION` takes them as printed. The attention
        # layout folds at spaces; a narrow terminal loses the source, creation time and protocol first (and
        # with ids as long as "an-organisation/a-rather-long-model-name-v2", the attention and matrix count).
        justify: JustifyMethod = "right" if col in ("matrices", "FFN median k") else "left"
        table.add_column(col, justify=justify, no_wrap=col != "attention")
    for r in rows:
        row_id, revision, *rest = _list_cells(r)
        table.add_row(escape(row_id), escape(revision), *rest)
    return FitWidth(table, optional=("source", "created", "protocol", "attention", "matrices"))


# db list's columns, in the table and in the plain listing alike.
_LIST_COLUMNS = ("id", "revision", "source", "protocol", "matrices", "FFN median k", "attention", "created")


def _list_cells(r: FlatRecord) -> tuple[str, ...]:
    """One record's cells under _LIST_COLUMNS, as plain text."""
    return (
        r["id"],
        r["revision"] or "-",
        r["source"],
        r["protocol"],
        _matrices(r),
        fmt(r["ffn_median_k"]),
        r["attention"] or "-",
        r["created"] or "-",
    )


def _matrices(record: FlatRecord) -> str:
    """A cohort entry holds per-kind medians, no matrix records: "-", not a count of 0 (issue 21)."""
    return "-" if str(record["source"]).startswith("cohort") else str(record["matrices"])


def _narrowest_list_table(rows: list[FlatRecord]) -> int:
    """Columns the narrowest db list table takes with ids and revisions whole: those two and FFN median k (its
    header folded to "median"), plus borders and padding (4 bars, 2 spaces per column)."""
    ids = max(len(r["id"]) for r in rows)
    revisions = max(len("revision"), *(len(r["revision"] or "-") for r in rows))
    numbers = max(len("median"), *(len(fmt(r["ffn_median_k"])) for r in rows))
    return ids + revisions + numbers + 4 + 3 * 2


def _plain_list(rows: list[FlatRecord]) -> Text:
    """The same columns as db_list_view's table, aligned with spaces, every cell whole."""
    header = _LIST_COLUMNS
    cells = [_list_cells(r) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    right = {4, 5}  # the numbers

    def line(values: tuple[str, ...]) -> str:
        parts = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return "  ".join(parts).rstrip()

    lines = [counted(len(rows), "row"), line(header), "  ".join("-" * w for w in widths), *map(line, cells)]
    return Text("\n".join(lines), no_wrap=True, overflow="ignore")


def trajectory_view(t: TrajectoryResult) -> Group:
    parts: list[Any] = []
    if not t.get("steps"):
        return Group(Text("\n".join(t["findings"])))
    kinds = list(t["kinds"])
    protocol = f", {t['protocol']}" if t.get("protocol") else ""
    over = f"over {len(t['steps'])} checkpoints{protocol}"
    model = escape(t["model"])
    # Where there is room, one table of "k (λ)" per kind; on a narrow terminal (80 columns, 7 kinds) one of
    # k, one of λ and one of T/τ, rather than numbers folded across lines. The embeddings and matrices of
    # unknown role go first.
    extra = [k for k in ("other", "unembed", "embed") if k in kinds]
    both = Table(title=f"{model}: per-kind median k (λ) {over}")
    k_only = Table(title=f"{model}: per-kind median k {over}")
    lambda_only = Table(title="per-kind median λ")
    tau = Table(title="T/τ (T x η x λ_wd) and its state")
    both.add_column("step", justify="right", no_wrap=True)
    both.add_column("T/τ state")
    for table in (k_only, lambda_only, tau):
        table.add_column("step", justify="right", no_wrap=True)
    tau.add_column("T/τ", justify="right", no_wrap=True)
    tau.add_column("state", no_wrap=True)
    for kind in kinds:
        both.add_column(kind, justify="right")  # "1.1906 (0.0712)" may fold at its space: k above, (λ) below
        k_only.add_column(kind, justify="right", no_wrap=True)
        lambda_only.add_column(kind, justify="right", no_wrap=True)
    states = {s["step"]: s for s in t["states"]}
    for step, revision in zip(t["steps"], t["revisions"], strict=True):
        ks, lambdas = [], []
        for kind in kinds:
            s = t["kinds"][kind]
            i = s["steps"].index(step) if step in s["steps"] else None
            ks.append("-" if i is None else f"{s['k'][i]:.4f}")
            lambdas.append("-" if i is None else f"{s['lambda'][i]:.3g}")
        state = states.get(step)
        tau_at = state.get("t_over_tau") if state is not None else None
        reading = (tau_at, state["state"]) if state is not None and tau_at is not None else None  # T/τ known
        original = t["duplicates"].get(revision) if revision is not None else None
        label = str(step) + (f" (= {escape(original)})" if original else "")
        both.add_row(
            label,
            f"{reading[0]:.3g} {reading[1]}" if reading else "unknown",
            *(k if k == "-" else f"{k} ({lam})" for k, lam in zip(ks, lambdas, strict=True)),
        )
        k_only.add_row(label, *ks)
        lambda_only.add_row(label, *lambdas)
        tau.add_row(label, f"{reading[0]:.3g}" if reading else "-", reading[1] if reading else "unknown")
    parts.append(
        FirstFit(
            [FitWidth(both, optional=extra)],
            [FitWidth(k_only, optional=extra), FitWidth(lambda_only, optional=extra), FitWidth(tau)],
        )
    )
    findings = Text("Findings\n", style="bold")
    for line in t["findings"]:
        findings.append(f"  - {line}\n", style="")
    parts.append(findings)
    if t.get("plots"):
        parts.append(Text("plots: " + ", ".join(t["plots"]), style="dim"))
    return Group(*parts)

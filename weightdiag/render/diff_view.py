"""The terminal view of a diff: findings first, then the matrices that changed most, the blocks, and what
only one side has. Tables drop optional columns rather than cut cells (render.tables.FitWidth)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..delta.gate import GateResult
from ..delta.result import DiffResult, TensorDiff, cosine_cell
from .tables import FitWidth

TOP = 15  # matrices listed (by relative change); --all lists every one


def _rank(t: TensorDiff) -> str:
    if t.spectrum is None:
        return "-"
    if t.rank90 is not None:
        return str(t.rank90)
    return f">{t.spectrum.rank90_at_least - 1}" if t.spectrum.rank90_at_least > 1 else "?"


def _verdict(t: TensorDiff) -> str:
    if t.untouched:
        return "untouched"
    return ", ".join(v for v, on in (("LoRA-like", t.low_rank), (f"scaled x{t.figures.scale:.4g}", t.scaled)) if on)


def matrices_table(result: DiffResult, every: bool = False) -> Table:
    ranked = sorted(result.matrices, key=lambda t: -t.relative_change)
    shown = ranked if every else ranked[:TOP]
    title = "matrices by relative change" + ("" if every or len(ranked) <= TOP else f" (top {TOP} of {len(ranked)})")
    table = Table(title=title, title_justify="left")
    table.add_column("matrix", no_wrap=False)
    for header in ("block", "kind", "rel. change", "cosine", "unchanged", "rank90", "verdict"):
        table.add_column(header, justify="right" if header not in ("kind", "verdict") else "left")
    for t in shown:
        table.add_row(
            escape(t.name),
            "-" if t.block is None else str(t.block),
            t.kind,
            f"{t.relative_change:.3g}",
            cosine_cell(t.figures.cosine),
            f"{t.figures.unchanged_fraction:.1%}",
            _rank(t),
            _verdict(t),
        )
    return table


def blocks_table(result: DiffResult) -> Table:
    table = Table(title="blocks", title_justify="left")
    for header in ("block", "matrices", "rel. change", "max", "unchanged", "untouched", "LoRA-like"):
        table.add_column(header, justify="right")
    for b in result.blocks:
        table.add_row(
            b.key.removeprefix("block "),
            str(b.matrices),
            f"{b.relative_change:.3g}",
            f"{b.max_relative_change:.3g}",
            f"{b.unchanged_fraction:.1%}",
            str(b.untouched),
            str(b.low_rank),
        )
    return table


def diff_view(result: DiffResult, every: bool = False, gate: GateResult | None = None) -> Any:
    totals = result.totals
    head = Text(
        f"{result.base['id']} -> {result.tuned['id']}: {totals['tensors']} tensors compared, relative change "
        f"{totals['relative_change'] or 0:.3g} overall, {totals['unchanged_fraction']:.1%} of elements unchanged"
    )
    parts: list[Any] = [head]
    if result.mechanism is not None:
        parts.append(Text("  " + result.mechanism.line()))
        if (blocks := result.mechanism.blocks_line()) is not None:
            parts.append(Text("  " + blocks))
    quantized = result.mechanism is not None and result.mechanism.verdict == "quantized"
    if quantized and result.damage is not None and result.damage.get("sqnr_db") is not None:
        parts.append(
            Text(
                f"  quantization damage: SQNR {result.damage['sqnr_db']:.1f} dB over {result.damage['matrices']} "
                f"matrices (RMS relative error {result.damage['score']:.3g})"
            )
        )
    kept = result.survival
    line = survival_line(kept) if kept is not None else None
    if line is not None and kept is not None and (quantized or kept["outliers_survived"] < kept["outliers"]):
        parts.append(Text("  " + line))
    for f in result.findings:
        parts.append(Text("  • " + f.message))
    for label, names in (("only in base", result.only_base), ("only in tuned", result.only_tuned)):
        if names:
            more = f" and {len(names) - 6} more" if len(names) > 6 else ""
            parts.append(Text(f"  {label}: {', '.join(names[:6])}{more}"))
    for m in result.shape_mismatches:
        parts.append(Text(f"  shape differs: {m['name']} {m['base']} -> {m['tuned']}"))
    parts.append(FitWidth(matrices_table(result, every), optional=("cosine", "kind", "block")))
    if result.blocks:
        parts.append(FitWidth(blocks_table(result), optional=("max", "LoRA-like")))
    if gate is not None:
        parts.append(Text(gate_line(gate)))
    return Group(*parts)


def survival_line(s: dict[str, Any]) -> str | None:
    """Outliers and super weights kept, and the change of k and alpha, in one line (None: no outlier tracked)."""
    if not s["outliers"]:
        return None
    words = (
        f"outliers (|w| > {s['outlier_rms']:g} RMS): {s['outliers_survived']} of {s['outliers']} kept within "
        f"{s['survival']:.0%}"
    )
    if s["super_weights"]:
        words += f"; super-weight candidates: {s['super_weights_survived']} of {len(s['super_weights'])} kept"
    if s["delta_k_median"] is not None:
        words += f"; Weibull k {s['delta_k_median']:+.3g} (median)"
    if s["delta_alpha_median"] is not None:
        words += f", alpha {s['delta_alpha_median']:+.3g}"
    return words


def gate_line(gate: GateResult) -> str:
    """The CI gate's verdict in one line: PASS, or FAIL with the worst tensors (all that `diff --fail-above -q`
    prints)."""
    if gate.passed:
        return f"PASS: {gate.checked} tensors within relative change {gate.threshold:g}"
    worst = ", ".join(f"{t.name} ({t.relative_change:.3g})" for t in gate.failed[:5])
    more = f" and {len(gate.failed) - 5} more" if len(gate.failed) > 5 else ""
    return f"FAIL: {len(gate.failed)} of {gate.checked} tensors changed more than {gate.threshold:g}: {worst}{more}"

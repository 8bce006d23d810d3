"""The health report in the terminal (rich): the observation lines, the two per-block tables, the
findings, the super-weight candidates and the shallow-FFN table of a `health_report` result."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..diagnose.health import fmt
from ..diagnose.health.cells import elide
from ..sources import NORM_ARTICLE
from ..vocabulary import KIND_ORDER, SELECTION_KEYS
from .tables import FitWidth

_CLASS_STYLE = {"selection-deep": "bold red", "selection-mild": "yellow", "non-weibull": "magenta"}


def _kinds(result: dict[str, Any]) -> list[str]:
    present = {k for b in result["blocks"] for k in b["kinds"]}
    return [k for k in KIND_ORDER if k in present]


def _sites(result: dict[str, Any]) -> list[str]:
    return sorted({s for b in result["blocks"] for s in b["norms"]})


def _biases(block: dict[str, Any], kinds: list[str]) -> str:
    have = block["biases"]
    if have and set(kinds) <= set(have):
        return "all"
    return ",".join(have) or "-"


def _plain(*cells: str | Text) -> list[Text]:
    """Table cells as plain text: a tensor name such as 'x[/]' or '[bold]' is not rich markup."""
    return [c if isinstance(c, Text) else Text(c) for c in cells]


def block_tables(result: dict[str, Any]) -> list[FitWidth]:
    kinds, sites = _kinds(result), _sites(result)
    scale = Table(title="blocks: structure and scale (std per projection, norm weight ‖γ‖/√d)", title_justify="left")
    for col in ("block", "params", "QK-norm", "biases", *(f"std {k}" for k in kinds), *(f"γ {s}" for s in sites)):
        scale.add_column(col, justify="left" if col in ("QK-norm", "biases") else "right", no_wrap=True)
    scale.add_column("findings")  # finding ids: they fold at their commas
    shape = Table(
        title="blocks: shape and tails (k per projection; block max/q99 and kurtosis)",
        title_justify="left",
        caption="k colours: red selection-deep, yellow selection-mild; k in italics: quantized (class withheld)",
    )
    for col in ("block", *(f"k {k}" for k in kinds), "max/q99", "kurtosis"):
        shape.add_column(col, justify="right", no_wrap=col != "block")  # "3 (mtp)" may fold
    shape.add_column("findings")
    for b in result["blocks"]:
        marks = ", ".join(b["findings"])
        label = f"{b['block']}" + (" (mtp)" if b["mtp"] else "")
        stds = [fmt(b["kinds"][k]["std"], 3) if k in b["kinds"] else "" for k in kinds]
        norms = [fmt(b["norms"].get(s), 3) if s in b["norms"] else "" for s in sites]
        scale.add_row(
            *_plain(
                label,
                f"{b['params']:,}",
                "yes" if b["qk_norm"] else "no",
                _biases(b, kinds),
                *stds,
                *norms,
                marks,
            )
        )
        ks = []
        for k in kinds:
            cell = b["kinds"].get(k)
            if cell is None or cell["k"] is None:
                ks.append(Text(""))
                continue
            style = "italic dim" if cell["quant"] else _CLASS_STYLE.get(cell["class"] or "", "")
            ks.append(Text(f"{cell['k']:.3f}", style=style))
        shape.add_row(*_plain(label, *ks, fmt(b.get("max_over_q99"), 3), fmt(b.get("kurtosis"), 3), marks))
    # 80 columns: the numbers per projection stay whole; the parameter counts, biases, QK-norm and norm
    # weights (scale), the kurtosis and max/q99 (shape) give way first.
    return [
        FitWidth(scale, optional=("params", "biases", "QK-norm", *(f"γ {s}" for s in reversed(sites)))),
        FitWidth(shape, optional=("kurtosis", "max/q99")),
    ]


def findings_view(result: dict[str, Any]) -> Text:
    text = Text(f"Findings ({len(result['findings'])})\n", style="bold")
    if not result["findings"]:
        text.append(
            f"  none: no block stands out from the depth trend, no norm outside the healthy band of {NORM_ARTICLE}\n"
        )
    for f in result["findings"]:
        style = "red" if f["severity"] == "warning" else "cyan"
        text.append(f"  {f['id']} ", style="bold")
        text.append(f"[{f['severity']}] ", style=style)
        text.append(f"{f['text']}\n")
    return text


def super_weight_table(result: dict[str, Any]) -> FitWidth:
    sw = result["super_weights"]
    table = Table(
        title=f"super-weight candidates: the {len(sw['top'])} largest |w| (one per matrix)", title_justify="left"
    )
    for col in ("tensor", "block", "(row, col)", "|w|", "max/q99", "|w|/std", "kurtosis"):
        table.add_column(col, justify="left" if col == "tensor" else "right", no_wrap=True)
    for t in sw["top"]:
        table.add_row(
            *_plain(
                elide(t["tensor"]),
                "-" if t["block"] is None else str(t["block"]),
                "(" + ", ".join(map(str, t["index"])) + ")" if t["index"] else "-",
                fmt(t["abs_value"]),
                fmt(t["max_over_q99"], 3),
                fmt(t["over_std"], 3),
                fmt(t["kurtosis"], 3),
            )
        )
    # Tensor names whole; a narrow terminal loses the kurtosis, |w|/std and the position before |w| or max/q99.
    return FitWidth(table, optional=("kurtosis", "|w|/std", "(row, col)"))


def shallow_table(result: dict[str, Any]) -> FitWidth | None:
    sh = result.get("shallow_ffn")
    if not sh or not sh["matrices"]:
        return None
    table = Table(
        title=f"shallow FFN blocks {sh.get('shallow_blocks', '0-5')}: regime {sh['regime']} "
        f"(min k {sh['shallow_min_k']:.3f}; A >= 1.0, B <= 0.7)",
        title_justify="left",
    )
    for col in ("block", "kind", "k", "R²", "q90/q10", "second population"):
        table.add_column(col, justify="right" if col in ("k", "R²", "q90/q10") else "left")
    for m in sh["matrices"]:
        table.add_row(
            *_plain(
                str(m["block"]),
                m["kind"],
                fmt(m["k"]),
                fmt(m["r2"]),
                fmt(m["q90_q10"], 3),
                "yes" if m["second_population"] else "no",
            )
        )
    return FitWidth(table)


def report_view(result: dict[str, Any]) -> Group:
    model = result["model"]
    title = Text(
        f"{model['id']}" + (f"@{model['revision']}" if model.get("revision") else "") + f" ({model.get('how', 'row')}; "
        f"protocol {result['protocol']['name']}, trim {result['protocol']['trim']})",
        style="bold",
    )
    summary = Text()
    for line in result["observations"]:
        summary.append(f"  • {line}\n")
    parts: list[Any] = [title, summary, *block_tables(result), findings_view(result), super_weight_table(result)]
    shallow = shallow_table(result)
    if shallow is not None:
        parts.append(shallow)
    selection = [k for k in _kinds(result) if k in SELECTION_KEYS]
    if selection:
        parts.append(Text(f"Q/K kinds: {', '.join(selection)}; cuts: {_cuts_line(result)}", style="dim"))
    return Group(*parts)


def _cuts_line(result: dict[str, Any]) -> str:
    c = result["cuts"]
    return (
        f"|robust z| >= {c['robust_z']} against the median of {c['neighbours']} nearest blocks or a Theil-Sen trend, "
        "and a practical effect (docs/report.md)"
    )

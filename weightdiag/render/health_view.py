"""The health report in the terminal (rich): the observation lines, the two per-block tables, the MoE
table, the findings, the super-weight candidates, the shallow-FFN table and one table per vision or
audio tower of a `health_report` result."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..citations import NORM_ARTICLE
from ..diagnose.health import fmt
from ..diagnose.health.cells import elide, short_name
from ..diagnose.health.towers import tower_size
from ..diagnose.results import HealthReport
from ..vocabulary import KIND_ORDER, SELECTION_KEYS
from .tables import FitWidth

if TYPE_CHECKING:
    from ..diagnose.results import HealthReport

_CLASS_STYLE = {"selection-deep": "bold red", "selection-mild": "yellow", "non-weibull": "magenta"}


def _kinds(result: HealthReport) -> list[str]:
    present = {k for b in result["blocks"] for k in b["kinds"]}
    return [k for k in KIND_ORDER if k in present]


def _sites(result: HealthReport) -> list[str]:
    return sorted({s for b in result["blocks"] for s in b["norms"]})


def _biases(block: dict[str, Any], kinds: list[str]) -> str:
    have = block["biases"]
    if have and set(kinds) <= set(have):
        return "all"
    return ",".join(have) or "-"


def _plain(*cells: str | Text) -> list[Text]:
    """Table cells as plain text: a tensor name such as 'x[/]' or '[bold]' is not rich markup."""
    return [c if isinstance(c, Text) else Text(c) for c in cells]


def block_tables(result: HealthReport) -> list[FitWidth]:
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
    # Titles name only the columns drawn (issue 21: at 80 columns they named the norm weights and kurtosis left out).
    def scale_title(kept: list[str]) -> str:
        norms = ", norm weight ‖γ‖/√d" if any(h.startswith("γ ") for h in kept) else ""
        return f"blocks: structure and scale (std per projection{norms})"

    def shape_title(kept: list[str]) -> str:
        extra = " and ".join(h for h in ("max/q99", "kurtosis") if h in kept)
        return "blocks: shape and tails (k per projection" + (f"; block {extra}" if extra else "") + ")"

    return [
        FitWidth(
            scale, optional=("params", "biases", "QK-norm", *(f"γ {s}" for s in reversed(sites))), retitle=scale_title
        ),
        FitWidth(shape, optional=("kurtosis", "max/q99"), retitle=shape_title),
    ]


def findings_view(result: HealthReport) -> Text:
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


def super_weight_table(result: HealthReport) -> FitWidth:
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


def spread_text(median: float | None, spread: float | None, digits: int, relative: bool) -> str:
    if median is None:
        return ""
    if spread is None:
        return fmt(median, digits)
    return f"{fmt(median, digits)} ±{spread:.0%}" if relative else f"{fmt(median, digits)} ±{spread:.3f}"


def moe_kinds(moe: dict[str, Any]) -> list[str]:
    present = {k for layer in moe["layers"] for k in layer["kinds"]}
    return [k for k in KIND_ORDER if k in present] + sorted(present - set(KIND_ORDER))


def moe_outlier_cell(layer: dict[str, Any], outliers: list[dict[str, Any]]) -> str:
    mine = [o for o in outliers if o["block"] == layer["block"]]
    seen = dict.fromkeys(f"e{o['expert']} {o['kind']} {'k' if o['statistic'] == 'k' else 'λ'}" for o in mine)
    return ", ".join(seen)


def moe_layout(moe: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """The MoE table's routed kinds, the kinds with a shared expert, and its columns (terminal and HTML)."""
    kinds = moe_kinds(moe)
    shared = [k for k in KIND_ORDER if any(k in layer["shared"] for layer in moe["layers"])]
    columns = ["block", "experts", *(f"k {k}" for k in kinds), *(f"λ {k}" for k in kinds)]
    columns += [*(f"shared k {k}" for k in shared), "router k", "outliers"]
    return kinds, shared, columns


def moe_cells(layer: dict[str, Any], moe: dict[str, Any], kinds: list[str], shared: list[str]) -> list[str]:
    """One MoE layer's row under moe_layout's columns, as plain text (the HTML report escapes it)."""
    ks = [layer["kinds"].get(k, {}) for k in kinds]
    router = next((r["k"] for r in layer["routers"] if r["k"] is not None), None)
    return [
        str(layer["block"]),
        str(layer["experts"] or "-"),
        *(spread_text(e.get("k_median"), e.get("k_spread"), 4, False) for e in ks),
        *(spread_text(e.get("lambda_median"), e.get("lambda_spread"), 3, True) for e in ks),
        *(fmt(layer["shared"][k]["k"]) if k in layer["shared"] else "" for k in shared),
        fmt(router),
        moe_outlier_cell(layer, moe["outliers"]),
    ]


def moe_table(result: HealthReport) -> FitWidth | None:
    """Per MoE layer: the routed experts' median k and λ per kind with their spread (MAD as sigma; λ as a
    relative spread), the shared expert's k, the router's k and the outlier experts."""
    moe = result.get("moe")
    if not moe:
        return None
    kinds, shared, columns = moe_layout(moe)
    table = Table(
        title="MoE layers: routed experts per kind, median ± spread across the layer's experts "
        "(shared experts and routers apart)",
        title_justify="left",
        caption=f"outliers: |robust z| >= {moe['rule']['robust_z']} across a layer's experts and a practical effect "
        f"(docs/report.md); none singled out below {moe['rule']['min_experts']} experts",
    )
    for col in columns:
        table.add_column(col, justify="left" if col == "outliers" else "right", no_wrap=col != "outliers")
    for layer in moe["layers"]:
        table.add_row(*_plain(*moe_cells(layer, moe, kinds, shared)))
    optional = ("router k", *(f"shared k {k}" for k in reversed(shared)), *(f"λ {k}" for k in reversed(kinds)))
    return FitWidth(table, optional=optional)


def tower_name(layer: dict[str, Any]) -> str:
    """The lowest-k matrix of a tower layer, named within its layer ('self_attn.k_proj')."""
    name = layer["k_min_tensor"]
    return "-" if not name else (short_name(name) if layer["layer"] is not None else name)


TOWER_COLUMNS = ("layer", "matrices", "params", "median k", "lowest k", "median λ", "max max/q99", "lowest-k matrix")


def tower_rows(t: dict[str, Any]) -> list[dict[str, Any]]:
    """A tower's rows: its layers, then its matrices outside any layer (if it has some)."""
    return [*t["layers"], *([t["outside_layers"]] if t["outside_layers"] else [])]


def tower_cells(x: dict[str, Any], number: Callable[[Any, int], str]) -> list[str]:
    """A tower row's cells under TOWER_COLUMNS but the last (its lowest-k matrix, which each view writes its
    own way); `number(value, digits)` writes the numbers."""
    return [
        "-" if x["layer"] is None else str(x["layer"]),
        str(x["matrices"]),
        f"{x['params']:,}",
        number(x["k_median"], 4),
        number(x["k_min"], 4),
        number(x["lambda_median"], 3),
        number(x["max_over_q99"], 3),
    ]


def tower_tables(result: HealthReport) -> list[FitWidth]:
    """One table per vision/audio tower, per layer: never mixed into the language model's blocks."""
    out = []
    for t in result.get("towers", []):
        table = Table(
            title=f"{t['tower']} (not the language model): {tower_size(t)}",
            title_justify="left",
        )
        for col in TOWER_COLUMNS:
            table.add_column(col, justify="left" if col == "lowest-k matrix" else "right", no_wrap=True)
        for x in tower_rows(t):
            table.add_row(*_plain(*tower_cells(x, fmt), elide(tower_name(x))))
        out.append(FitWidth(table, optional=("lowest-k matrix", "params", "median λ")))
    return out


def shallow_table(result: HealthReport) -> FitWidth | None:
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


def report_view(result: HealthReport) -> Group:
    model = result["model"]
    title = Text(
        f"{model['id']}" + (f"@{model['revision']}" if model.get("revision") else "") + f" ({model.get('how', 'row')}; "
        f"protocol {result['protocol']['name']}, trim {result['protocol']['trim']})",
        style="bold",
    )
    summary = Text()
    for line in result["observations"]:
        summary.append(f"  • {line}\n")
    parts: list[Any] = [title, summary, *block_tables(result)]
    moe = moe_table(result)
    if moe is not None:
        parts.append(moe)
    parts += [findings_view(result), super_weight_table(result)]
    shallow = shallow_table(result)
    if shallow is not None:
        parts.append(shallow)
    parts += tower_tables(result)
    if result.get("spectrum"):  # fit --spectrum
        from .spectrum_view import report_spectrum_table

        parts.append(report_spectrum_table(result["spectrum"]))
    selection = [k for k in _kinds(result) if k in SELECTION_KEYS]
    if selection:
        parts.append(Text(f"Q/K kinds: {', '.join(selection)}; cuts: {_cuts_line(result)}", style="dim"))
    return Group(*parts)


def _cuts_line(result: HealthReport) -> str:
    c = result["cuts"]
    return (
        f"|robust z| >= {c['robust_z']} against the median of {c['neighbours']} nearest blocks or a Theil-Sen trend, "
        "and a practical effect (docs/report.md)"
    )

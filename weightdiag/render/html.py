"""The health report as one self-contained HTML file: plots embedded as base64 PNG data URIs
(each <img> names its file in data-file), tables and findings as plain HTML, no scripts."""

from __future__ import annotations

import base64
import os
import re
from html import escape, unescape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..citations import NORM_ARTICLE, NORM_ARTICLE_SHORT
from ..database.store import write_text_atomic
from ..diagnose.classes import SELECTION_DEEP_BELOW_K, TRANSMISSION_MIN_K
from ..diagnose.health import NORM_COLLAPSE, NORM_EXPLOSION
from ..diagnose.health.towers import tower_size
from ..diagnose.results import HealthReport
from ..vocabulary import KIND_ORDER
from .health_view import TOWER_COLUMNS, moe_cells, moe_layout, tower_cells, tower_name, tower_rows
from .plots import PlotFile
from .spectrum_view import spectrum_html

if TYPE_CHECKING:
    from ..diagnose.results import HealthReport

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1400px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.82em; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
.warning { color: #b00020; } .notice { color: #005f87; }
.deep { background: #f8c9c4; } .mild { background: #fbeec1; } .quant { font-style: italic; color: #777; }
.legend { font-size: 0.85em; color: #555; }
figure { margin: 1em 0; } figcaption { font-size: 0.85em; color: #555; max-width: 1000px; }
img { max-width: 100%; border: 1px solid #eee; }
.wide { overflow-x: auto; max-width: 100%; }
"""


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return escape(str(value))


_FIGURE = r"[-+−]?(\d[\d,]*)?\.?\d+(e[-+]?\d+)?%?"
_NUMBER = re.compile(rf"{_FIGURE}( ± ?{_FIGURE})?|[-+]?inf|nan")  # 1.18 ±0.004: an MoE layer's median and spread


def _is_number(cell: str) -> bool:
    """A cell that holds a number (tags and entities aside): right-aligned; any other text is left-aligned."""
    return bool(_NUMBER.fullmatch(unescape(re.sub(r"<[^>]+>", "", cell)).strip()))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    # Numbers right-aligned, text left-aligned, decided by what each column holds (issue 42: text columns such as
    # biases, regime or a tower's matrix names were right-aligned, only the first column was not).
    numeric = [  # the first column names the row: always text
        i > 0 and any(_is_number(r[i]) for r in rows) and all(_is_number(r[i]) or _blank(r[i]) for r in rows)
        for i in range(len(headers))
    ]
    head = "".join(
        f"<th>{escape(h)}</th>" if numeric[i] else f'<th class="l">{escape(h)}</th>' for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td>{c}</td>" if numeric[i] else f'<td class="l">{c}</td>' for i, c in enumerate(r))
        + "</tr>"
        for r in rows
    )
    # In a box of its own that scrolls sideways: a wide table (the blocks of a model with many kinds) never
    # pushes the page past the window (issue 21: cut off at the right of a 1280-px window).
    return f'<div class="wide"><table><tr>{head}</tr>{body}</table></div>'


def _blank(cell: str) -> bool:
    return unescape(re.sub(r"<[^>]+>", "", cell)).strip() in ("", "-")


def _k_cell(cell: dict[str, Any] | None) -> str:
    if not cell or cell["k"] is None:
        return ""
    css = (
        "quant" if cell["quant"] else {"selection-deep": "deep", "selection-mild": "mild"}.get(cell["class"] or "", "")
    )
    return f'<span class="{css}">{cell["k"]:.3f}</span>' if css else f"{cell['k']:.3f}"


def _blocks(result: HealthReport) -> str:
    """Two tables, each within a 1280-px page (issue 42: one of 21 columns was about 1,550 px wide for MiniLM):
    what each block's kinds read as (k, the outliers, the findings), then how they are built (size, norms, std)."""
    blocks = result["blocks"]
    kinds = [k for k in KIND_ORDER if any(k in b["kinds"] for b in blocks)]
    sites = sorted({s for b in blocks for s in b["norms"]})

    def name(b: Any) -> str:
        return str(b["block"]) + (" (mtp)" if b["mtp"] else "")

    read = [
        [
            name(b),
            *[_k_cell(b["kinds"].get(k)) for k in kinds],
            _fmt(b.get("max_over_q99"), 3),
            _fmt(b.get("kurtosis"), 3),
            escape(", ".join(b["findings"])),
        ]
        for b in blocks
    ]
    built = [
        [
            name(b),
            f"{b['params']:,}",
            "yes" if b["qk_norm"] else "no",
            escape(" ".join(b["biases"]) or "-"),
            *[_fmt(b["kinds"][k]["std"], 3) if k in b["kinds"] else "" for k in kinds],
            *[_fmt(b["norms"].get(s), 3) if s in b["norms"] else "" for s in sites],
        ]
        for b in blocks
    ]
    return (
        "<h3>Shape and tails</h3>"
        + _table(["block", *[f"k {k}" for k in kinds], "max/q99", "kurtosis", "findings"], read)
        + _k_legend()
        + "<h3>Structure and scale</h3>"
        + _table(
            ["block", "params", "QK-norm", "biases", *[f"std {k}" for k in kinds], *[f"‖γ‖/√d {s}" for s in sites]],
            built,
        )
    )


def _k_legend() -> str:
    """What the k cells' colours mean (issue 33: the yellow of selection-mild had no legend)."""
    deep, mild = SELECTION_DEEP_BELOW_K, TRANSMISSION_MIN_K
    return (
        '<p class="legend">k cells: <span class="deep">deep</span> selection-deep (k &lt; '
        f'{deep}); <span class="mild">mild</span> selection-mild ({deep} &le; k &lt; {mild}); '
        '<span class="quant">italic grey</span> quantized (k class withheld); unmarked: transmission (k &ge; '
        f"{mild}) or a kind with no k class.</p>"
    )


def _moe(result: HealthReport) -> str:
    moe = result.get("moe")
    if not moe:
        return ""
    kinds, shared, headers = moe_layout(moe)
    rows = [[escape(cell) for cell in moe_cells(layer, moe, kinds, shared)] for layer in moe["layers"]]
    head = (
        "<p>Routed experts per kind: median ± spread across the layer's experts (k: MAD as a sigma; λ: relative). "
        "Shared experts and routers are read apart from the routed ones.</p>"
    )
    return "<h2>MoE layers</h2>" + head + _table(headers, rows)


def _towers(result: HealthReport) -> str:
    parts = []
    for t in result.get("towers", []):
        rows = [[*tower_cells(x, _fmt), escape(tower_name(x))] for x in tower_rows(t)]
        parts.append(
            f"<h2>{escape(t['tower'])} (not the language model)</h2><p>{escape(tower_size(t))}; kept out of the "
            "blocks, depth profile and super weights.</p>" + _table(list(TOWER_COLUMNS), rows)
        )
    return "".join(parts)


def _findings(result: HealthReport) -> str:
    if not result["findings"]:
        band = f"the healthy band of {escape(NORM_ARTICLE)}"
        return f"<p>No block stands out from the depth trend, and no norm lies outside {band}.</p>"
    items = "".join(
        f'<li><b>{f["id"]}</b> <span class="{f["severity"]}">[{f["severity"]}]</span> {escape(f["text"])}</li>'
        for f in result["findings"]
    )
    return f"<ol style='list-style:none;padding-left:0'>{items}</ol>"


def _super_weights(result: HealthReport) -> str:
    rows = [
        [
            escape(t["tensor"]),
            "-" if t["block"] is None else str(t["block"]),
            escape("(" + ", ".join(map(str, t["index"])) + ")") if t["index"] else "-",
            _fmt(t["abs_value"]),
            _fmt(t["max_over_q99"], 3),
            _fmt(t["over_std"], 3),
            _fmt(t["kurtosis"], 3),
        ]
        for t in result["super_weights"]["top"]
    ]
    return _table(["tensor", "block", "(row, col)", "|w|", "max/q99", "|w|/std", "kurtosis"], rows)


def _norms(result: HealthReport) -> str:
    rows = [
        [escape(r["name"]), escape(r["site"]), str(r["d"]), _fmt(r["l2"]), _fmt(r["ratio"], 4), escape(r["regime"])]
        for r in result["norms"]["vectors"]
    ]
    return _table(["norm weight", "site", "d", "‖γ‖₂", "‖γ‖/√d", f"regime ({NORM_ARTICLE_SHORT})"], rows)


def _shallow(result: HealthReport) -> str:
    sh = result.get("shallow_ffn")
    if not sh:
        return "<p>No FFN matrices in blocks 0-5.</p>"
    rows = [
        [
            str(m["block"]),
            escape(m["kind"]),
            _fmt(m["k"]),
            _fmt(m["r2"]),
            _fmt(m["q90_q10"], 3),
            "yes" if m["second_population"] else "no",
        ]
        for m in sh["matrices"]
    ]
    head = f"<p>Regime {escape(sh['regime'])}: min k {sh['shallow_min_k']:.3f} (A >= 1.0, B <= 0.7).</p>"
    return head + _table(["block", "kind", "k", "R²", "q90/q10", "second population"], rows)


def _figure(plot: PlotFile) -> str:
    data = base64.b64encode(plot.path.read_bytes()).decode("ascii")
    name = escape(plot.path.name)
    return (
        f'<figure><img src="data:image/png;base64,{data}" data-file="{name}" alt="{escape(plot.title)}">'
        f"<figcaption><b>{escape(plot.title)}</b> ({name}). {escape(plot.caption)}</figcaption></figure>"
    )


def _how_to_read() -> str:
    """The page's reading guide, in the page: it is shared on its own, where a path into weightdiag's source
    (docs/report.md, all it said before: issue 42) leads nowhere."""
    items = (
        "<b>Findings</b>, warnings first: a block's statistic against the median of its 4 nearest blocks (robust z: "
        "the residual in units of 1.4826 × the median absolute deviation over all blocks) or against the depth "
        "trend of the others, with the reason it stands out.",
        "<b>k</b> (the Weibull shape of |w|) per block and kind, coloured by class as the legend under its table "
        "says; max/q99 and kurtosis measure the tails.",
        f"<b>Norm weights</b>: ‖γ‖/√d is 1 at the all-ones init; below {NORM_COLLAPSE} a collapse, above "
        f"{NORM_EXPLOSION} an explosion ({escape(NORM_ARTICLE_SHORT)}).",
        "<b>Super-weight candidates</b>: the largest |w| of the model, one per matrix, with max/q99 and |w|/std.",
    )
    return (
        "<h2>How to read this page</h2><ul>"
        + "".join(f"<li>{item}</li>" for item in items)
        + "</ul><p class='legend'>Every cut and its evidence: docs/report.md in weightdiag's source.</p>"
    )


def render_html(result: HealthReport, plots: list[PlotFile]) -> str:
    model = result["model"]
    title = f"weightdiag report: {model['id']}" + (f"@{model['revision']}" if model.get("revision") else "")
    observations = "".join(f"<li>{escape(line)}</li>" for line in result["observations"])
    figures = "".join(_figure(p) for p in plots)
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>protocol {escape(result['protocol']['name'])}, trim {escape(result['protocol']['trim'])}; "
        f"{len(result['findings'])} findings; written by weightdiag {escape(__version__)}.</p>"
        f"{_how_to_read()}"
        f"<h2>Summary</h2><ul>{observations}</ul>"
        f"<h2>Findings</h2>{_findings(result)}"
        f"<h2>Plots</h2>{figures}"
        f"<h2>Blocks</h2>{_blocks(result)}{_moe(result)}"
        f"<h2>Super-weight candidates</h2>{_super_weights(result)}"
        f"<h2>Norm weights</h2>{_norms(result)}"
        f"<h2>Shallow FFN (Qwen companion)</h2>{_shallow(result)}{_towers(result)}"
        f"{spectrum_html(result.get('spectrum'))}"
        "</body></html>\n"
    )


def write_html(result: HealthReport, plots: list[PlotFile], path: Path) -> Path:
    write_text_atomic(path, render_html(result, plots))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # a report to share, not a private temporary file
    return path

"""The `weightdiag report` command (registered on the main Typer app by cli.py).

The analysis is weightdiag.diagnose.health (rows only, no weights); plots and the HTML page are
weightdiag.render.plots / .html (matplotlib, imported only for --plot / --html). The only weights
read here are the few matrices whose |w| histogram is plotted.
"""

from __future__ import annotations

import fnmatch
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .errors import BadInputError, WeightdiagError

DEFAULT_HISTOGRAMS = 3


def register(app: typer.Typer) -> None:
    """Add the report command to `app`."""

    @app.command()
    def report(
        model: Annotated[
            str, typer.Argument(metavar="MODEL_OR_ROW", help="Model folder/file, Hub id, or a row file (.json).")
        ],
        db: Annotated[
            Path | None, typer.Option("--db", help="Database folder (default: $WEIGHTDIAG_DB, else ./DATABASE).")
        ] = None,
        device: Annotated[str, typer.Option(help="Where to reduce when the model must be fitted.")] = "auto",
        protocol: Annotated[str, typer.Option(help="Protocol to fit with when the model has no row yet.")] = "hist1024",
        top: Annotated[int, typer.Option("--top", min=1, help="How many super-weight candidates to list.")] = 10,
        plot: Annotated[Path | None, typer.Option("--plot", help="Write PNG plots into this folder.")] = None,
        html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
        hist: Annotated[
            list[str] | None,
            typer.Option("--hist", help="Tensor name or glob to draw a |w| histogram of (repeatable)."),
        ] = None,
        token: Annotated[str | None, typer.Option(help="Hub token (default: HF_TOKEN or `hf auth login`).")] = None,
        save: Annotated[bool, typer.Option(help="Save a freshly fitted row in the database.")] = True,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    ) -> None:
        """Health report: per-block table and findings (why a block is unusual), norms, super weights, depth."""
        run_report(model, db, device, protocol, top, plot, html, hist or [], token, save, as_json, quiet)


def run_report(
    spec: str,
    db: Path | None,
    device: str,
    protocol: str,
    top: int,
    plot: Path | None,
    html: Path | None,
    hist: list[str],
    token: str | None,
    save: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    from .api import resolve_row
    from .cli import _print_json, stderr, stdout
    from .diagnose.health import health_report
    from .pipeline import FitOptions
    from .render.tables import FitProgress

    if plot or html:
        from .render.plots import require_matplotlib

        require_matplotlib()  # fail before a long fit, not after it
    if hist and not (plot or html):
        raise BadInputError("--hist draws into --plot DIR or --html FILE; add one of them")
    options = FitOptions(protocol=protocol, device=device)
    options.validate()
    progress = FitProgress(stderr, enabled=not quiet and stderr.is_terminal)
    try:
        row, how = resolve_row(spec, db, options, progress, token=token, save=save)
    finally:
        progress.close()
    result = health_report(row, top=top)
    result["model"]["how"] = how
    notes: list[str] = []
    if plot or html:
        from .render.plots import write_plots

        names = histogram_choice(result, row, hist)
        data, why = read_histograms(row, names, spec if how == "fitted" else None, token)
        if why:
            notes.append(why)
        with tempfile.TemporaryDirectory(prefix="weightdiag-plots-") as scratch:
            folder = plot or Path(scratch)
            files = write_plots(result, data, folder)
            result["plots"] = [{"file": str(f.path), "title": f.title, "caption": f.caption} for f in files]
            if html:
                from .render.html import write_html

                write_html(result, files, html)
                result["html"] = str(html)
    if as_json:
        _print_json(result)
    else:
        stdout.print(report_view(result))
    for line in notes:
        stderr.print(line, markup=False, highlight=False)
    if plot:
        stderr.print(f"{len(result['plots'])} plots written to {plot}", markup=False, highlight=False)
    if html:
        stderr.print(f"HTML report written to {html}", markup=False, highlight=False)
    if how == "fitted" and not as_json:
        stderr.print(f"{spec}: fitted" + (" and saved" if save else ""), markup=False, highlight=False)


# --- which matrices get a |w| histogram, and reading them ------------------------------------------


def histogram_choice(result: dict[str, Any], row: dict[str, Any], asked: list[str]) -> list[str]:
    """--hist names/globs, else the most extreme max/q99, the lowest k and a typical FFN matrix."""
    from .diagnose.health import FFN_KEYS

    names = [m["name"] for m in row["matrices"]]
    if asked:
        chosen: list[str] = []
        for pattern in asked:
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise BadInputError(
                    f"--hist {pattern!r} matches no fitted matrix; names look like {names[len(names) // 2]!r}"
                )
            chosen += [h for h in hits if h not in chosen]
        return chosen
    in_blocks = [m for m in row["matrices"] if m["block"] is not None and m["fits"]["mid80"]["ok"]]
    if not in_blocks:
        return names[:1]
    # A super weight the report found, else the most extreme max/q99; the heaviest body; a typical FFN matrix.
    found = [f["tensor"] for f in result["findings"] if f["category"] == "super-weight"]
    extreme = found[0] if found else max(in_blocks, key=lambda m: m["stats"].get("max_over_q99") or 0)["name"]
    lowest = min(in_blocks, key=lambda m: m["fits"]["mid80"]["k"])["name"]
    ffn = [m for m in in_blocks if m["kind"] in FFN_KEYS] or in_blocks
    median_k = sorted(m["fits"]["mid80"]["k"] for m in ffn)[len(ffn) // 2]
    typical = min(ffn, key=lambda m: (abs(m["fits"]["mid80"]["k"] - median_k), m["stats"]["max_over_q99"]))["name"]
    return list(dict.fromkeys([extreme, lowest, typical]))[:DEFAULT_HISTOGRAMS]


def read_histograms(
    row: dict[str, Any], names: list[str], spec: str | None, token: str | None
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Re-read the named matrices and reduce them to their |w| distributions.

    Rows do not store distributions, so the model is opened again: the spec just fitted, else the
    row's local location (checked against its fingerprint), else the Hub repo at the row's commit.
    Returns ({name: data}, a note when histograms are skipped or may differ).
    """
    import numpy as np

    from .api import open_model
    from .reduce import reduce_array
    from .source.plan import storage_view
    from .stats import Summary

    model = row["model"]
    note = None
    target = spec
    if target is None:
        if model.get("source") == "local" and model.get("location") and Path(model["location"]).exists():
            target = model["location"]
        elif model.get("source") == "hub" and model.get("commit"):
            target = f"{model['id']}@{model['commit']}"
    if target is None:
        return (
            {},
            f"histograms skipped: the model of this row ({model.get('location') or model['id']}) is not reachable",
        )
    try:
        plan, reader = open_model(target, token=token)
    except WeightdiagError as exc:
        return {}, f"histograms skipped: cannot open {target} ({exc.message})"
    if spec is None and model.get("source") == "local":
        from .source.local import content_fingerprint

        if model.get("fingerprint") and f"local-{content_fingerprint(plan)}" != model["fingerprint"]:
            note = f"note: {target} changed since the row was fitted; histograms show the files as they are now"
    refs = {t.name: t for t in plan.tensors}
    by_name = {m["name"]: m for m in row["matrices"]}
    out: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            ref = refs.get(name)
            if ref is None:
                continue
            raw = np.empty(ref.nbytes, dtype=np.uint8)
            reader.read_into(ref, raw)
            summary = Summary(reduce_array(storage_view(ref, raw), ref.dtype.name))
            mags = summary.magnitudes.nonzero()
            m = by_name[name]
            out[name] = {
                "name": name,
                "kind": m["kind"],
                "block": m["block"],
                "hist1024": summary.histogram,
                "values": mags.values,
                "counts": mags.counts,
                "n": int(mags.total),
                "q99": m["stats"]["q99_abs"],
                "max_abs": m["stats"]["max_abs"],
                "argmax": m.get("argmax"),
                "fit": m["fits"]["mid80"],
                "note": m.get("note"),
            }
    finally:
        reader.close()
    return out, note


# --- the terminal view ------------------------------------------------------------------------------


_CLASS_STYLE = {"selection-deep": "bold red", "selection-mild": "yellow", "non-weibull": "magenta"}


def _kinds(result: dict[str, Any]) -> list[str]:
    from .diagnose.health import KIND_ORDER

    present = {k for b in result["blocks"] for k in b["kinds"]}
    return [k for k in KIND_ORDER if k in present]


def _sites(result: dict[str, Any]) -> list[str]:
    return sorted({s for b in result["blocks"] for s in b["norms"]})


def fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _biases(block: dict[str, Any], kinds: list[str]) -> str:
    have = block["biases"]
    if have and set(kinds) <= set(have):
        return "all"
    return ",".join(have) or "-"


def block_tables(result: dict[str, Any]) -> list[Table]:
    kinds, sites = _kinds(result), _sites(result)
    scale = Table(title="blocks: structure and scale (std per projection, norm weight ‖γ‖/√d)", title_justify="left")
    for col in ("block", "params", "QK-norm", "biases", *(f"std {k}" for k in kinds), *(f"γ {s}" for s in sites)):
        scale.add_column(col, justify="left" if col in ("QK-norm", "biases") else "right")
    scale.add_column("findings")
    shape = Table(
        title="blocks: shape and tails (k per projection; block max/q99 and kurtosis)",
        title_justify="left",
        caption="k colours: red selection-deep, yellow selection-mild; k in italics: quantized (class withheld)",
    )
    for col in ("block", *(f"k {k}" for k in kinds), "max/q99", "kurtosis"):
        shape.add_column(col, justify="right")
    shape.add_column("findings")
    for b in result["blocks"]:
        marks = ", ".join(b["findings"])
        label = f"{b['block']}" + (" (mtp)" if b["mtp"] else "")
        stds = [fmt(b["kinds"][k]["std"], 3) if k in b["kinds"] else "" for k in kinds]
        norms = [fmt(b["norms"].get(s), 3) if s in b["norms"] else "" for s in sites]
        scale.add_row(
            label,
            f"{b['params']:,}",
            "yes" if b["qk_norm"] else "no",
            _biases(b, kinds),
            *stds,
            *norms,
            marks,
        )
        ks = []
        for k in kinds:
            cell = b["kinds"].get(k)
            if cell is None or cell["k"] is None:
                ks.append(Text(""))
                continue
            style = "italic dim" if cell["quant"] else _CLASS_STYLE.get(cell["class"] or "", "")
            ks.append(Text(f"{cell['k']:.3f}", style=style))
        shape.add_row(label, *ks, fmt(b.get("max_over_q99"), 3), fmt(b.get("kurtosis"), 3), marks)
    return [scale, shape]


def findings_view(result: dict[str, Any]) -> Text:
    text = Text(f"Findings ({len(result['findings'])})\n", style="bold")
    if not result["findings"]:
        text.append("  none: no block stands out from the depth trend, no norm outside seed 001's band\n")
    for f in result["findings"]:
        style = "red" if f["severity"] == "warning" else "cyan"
        text.append(f"  {f['id']} ", style="bold")
        text.append(f"[{f['severity']}] ", style=style)
        text.append(f"{f['text']}\n")
    return text


def super_weight_table(result: dict[str, Any]) -> Table:
    sw = result["super_weights"]
    table = Table(
        title=f"super-weight candidates: the {len(sw['top'])} largest |w| (one per matrix)", title_justify="left"
    )
    for col in ("tensor", "block", "(row, col)", "|w|", "max/q99", "|w|/std", "kurtosis"):
        table.add_column(col, justify="left" if col == "tensor" else "right")
    for t in sw["top"]:
        table.add_row(
            t["tensor"],
            "-" if t["block"] is None else str(t["block"]),
            "(" + ", ".join(map(str, t["index"])) + ")" if t["index"] else "-",
            fmt(t["abs_value"]),
            fmt(t["max_over_q99"], 3),
            fmt(t["over_std"], 3),
            fmt(t["kurtosis"], 3),
        )
    return table


def shallow_table(result: dict[str, Any]) -> Table | None:
    sh = result.get("shallow_ffn")
    if not sh or not sh["matrices"]:
        return None
    table = Table(
        title=f"shallow FFN blocks 0-5: regime {sh['regime']} (min k {sh['shallow_min_k']:.3f}; A >= 1.0, B <= 0.7)",
        title_justify="left",
    )
    for col in ("block", "kind", "k", "R²", "q90/q10", "second population"):
        table.add_column(col, justify="right" if col in ("k", "R²", "q90/q10") else "left")
    for m in sh["matrices"]:
        table.add_row(
            str(m["block"]),
            m["kind"],
            fmt(m["k"]),
            fmt(m["r2"]),
            fmt(m["q90_q10"], 3),
            "yes" if m["second_population"] else "no",
        )
    return table


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
    from .diagnose.health import SELECTION_KEYS

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

"""The `weightdiag report` command (registered on the main Typer app by cli.py).

The analysis is weightdiag.diagnose.health (rows only, no weights); the terminal view is
weightdiag.render.health_view; plots and the HTML page are weightdiag.render.plots / .html
(matplotlib, imported only for --plot / --html). The only weights read here are the few matrices
whose |w| histogram is plotted.
"""

# No `from __future__ import annotations`: see weightdiag/cli.py.

from pathlib import Path
from typing import Annotated

import typer

from .errors import BadInputError


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
        connections: Annotated[
            int,
            typer.Option(
                "--connections",
                help="Ranged requests kept in flight when streaming from the Hub (default 8).",
                show_default=False,
            ),
        ] = 8,
        save: Annotated[bool, typer.Option(help="Save a freshly fitted row in the database.")] = True,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    ) -> None:
        """Health report: per-block table and findings (why a block is unusual), norms, super weights, depth."""
        run_report(model, db, device, protocol, top, plot, html, hist or [], token, save, as_json, quiet, connections)


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
    connections: int = 8,
) -> None:
    from .api import resolve_row
    from .cli import _print_json, _stderr, _stdout
    from .diagnose.health import health_report
    from .pipeline import FitOptions
    from .render.health_view import report_view
    from .render.tables import FitProgress

    if plot or html:
        from .render.plots import require_matplotlib

        require_matplotlib()  # fail before a long fit, not after it
    if hist and not (plot or html):
        raise BadInputError("--hist draws into --plot DIR or --html FILE; add one of them")
    options = FitOptions(protocol=protocol, device=device, connections=connections)
    options.validate()
    progress = FitProgress(_stderr(), enabled=not quiet and _stderr().is_terminal)
    try:
        row, how = resolve_row(spec, db, options, progress, token=token, save=save)
    finally:
        progress.close()
    result = health_report(row, top=top)
    result["model"]["how"] = how
    notes: list[str] = []
    if plot or html:
        import tempfile  # here, not at start-up: only plots need a scratch folder

        from .histograms import histogram_choice, read_histograms
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
        _stdout().print(report_view(result))
    for line in notes:
        _stderr().print(line, markup=False, highlight=False)
    if plot:
        _stderr().print(f"{len(result['plots'])} plots written to {plot}", markup=False, highlight=False)
    if html:
        _stderr().print(f"HTML report written to {html}", markup=False, highlight=False)
    if how == "fitted" and not as_json:
        _stderr().print(f"{spec}: fitted" + (" and saved" if save else ""), markup=False, highlight=False)

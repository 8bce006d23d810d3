"""The `weightdiag` command line: thin Typer commands over weightdiag.api.

Exit codes: 0 ok; 1 internal error (or `check` found a regression); 2 bad input; 3 Hub/network.
Errors print one line on stderr, never a traceback (set WEIGHTDIAG_DEBUG=1 to see one).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from . import __version__
from .errors import ExitCode, WeightdiagError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Diagnose trained transformer checkpoints from their weights alone.",
)

# Rich falls back to 80 columns when output is not a terminal; tables need more.
stderr = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
stdout = Console(width=None if sys.stdout.isatty() else 140)

DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="Database folder (default: $WEIGHTDIAG_DB, else ./DATABASE)."),
]


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=1, allow_nan=False) + "\n")


@app.command()
def fit(
    model: Annotated[
        str, typer.Argument(help="A .safetensors file, a model folder, or a Hub id ORG/NAME[@REV].")
    ],
    db: DbOption = None,
    device: Annotated[str, typer.Option(help="Where to reduce: auto, cpu, cuda, cuda:N.")] = "auto",
    protocol: Annotated[
        str, typer.Option(help="hist1024 (the cohort's protocol) or exact (order statistics).")
    ] = "hist1024",
    trim: Annotated[
        str, typer.Option(help="Trim for per-kind medians: mid80 (paper), mid90 or full.")
    ] = "mid80",
    include: Annotated[
        list[str] | None, typer.Option("--include", help="Only tensors matching this glob (repeatable).")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Skip tensors matching this glob (repeatable).")
    ] = None,
    revision: Annotated[
        str | None, typer.Option(help="Hub branch, tag or commit (same as ORG/NAME@REV).")
    ] = None,
    token: Annotated[
        str | None, typer.Option(help="Hub token (default: HF_TOKEN or `hf auth login`).")
    ] = None,
    download: Annotated[
        bool, typer.Option("--download", help="Fetch whole shards into the HF cache instead of streaming.")
    ] = False,
    name: Annotated[
        str | None, typer.Option(help="Model id to record (default: from the path or repo).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the row as JSON on stdout.")] = False,
    save: Annotated[bool, typer.Option(help="Write the row into the database folder.")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Fit a Weibull to |w| of every weight matrix and write one row to the database."""
    from .api import fit_model, save_row
    from .pipeline import FitOptions
    from .render.tables import FitProgress, kinds_table

    options = FitOptions(
        protocol=protocol,
        trim=trim,
        device=device,
        include=include or (),
        exclude=exclude or (),
        model_id=name,
    )
    progress = FitProgress(stderr, enabled=not quiet and stderr.is_terminal)
    try:
        row = fit_model(model, options, progress, revision=revision, token=token, download=download)
    finally:
        progress.close()
    path = save_row(row, db) if save else None
    if as_json:
        _print_json(row)
        stderr.print(kinds_table(row))
    else:
        stdout.print(kinds_table(row))
    if row["unclassified"]:
        shown = ", ".join(row["unclassified"][:5]) + (" ..." if len(row["unclassified"]) > 5 else "")
        stderr.print(f"{len(row['unclassified'])} matrices of unknown role fitted as 'other': {shown}")
    if path:
        stderr.print(f"row written to {path}")


@app.command()
def version() -> None:
    """Print the weightdiag version."""
    stdout.print(f"weightdiag {__version__}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with weightdiag's exit codes and one-line errors.

    Typer handles usage errors itself (exit 2, with the usage line); everything weightdiag raises
    on purpose becomes one line on stderr with its documented exit code.
    """
    try:
        app(args=argv, prog_name="weightdiag")
    except WeightdiagError as exc:
        if os.environ.get("WEIGHTDIAG_DEBUG"):
            raise
        stderr.print(f"error: {exc.message}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        stderr.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug: say so in one line, keep the traceback for WEIGHTDIAG_DEBUG
        if os.environ.get("WEIGHTDIAG_DEBUG"):
            raise
        stderr.print(
            f"internal error: {type(exc).__name__}: {exc} (set WEIGHTDIAG_DEBUG=1 for a traceback and "
            "please report it)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(ExitCode.INTERNAL)


if __name__ == "__main__":
    main()

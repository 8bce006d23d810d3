"""The Typer app: its commands (in the order `weightdiag -h` lists them), their one-line summaries, and the
command class every one of them runs with (_Command)."""

from collections.abc import Callable
from typing import Any

import typer
import typer.core

from ..errors import ExitCode, Stopped, kept_after
from . import db, diff, env, fit, lineage, models, sweep
from .errors import _interrupt_code
from .options import VersionOption
from .output import _flush_stdout, _skipped_row_once, _stderr, _stdout_gone

# -h beside --help on every command (click passes help_option_names down to subcommands), and typer's
# --install-completion / --show-completion on the root command.
CONTEXT = {"help_option_names": ["-h", "--help"]}

app = typer.Typer(
    context_settings=CONTEXT,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Diagnose trained transformer checkpoints from their weights alone.",
)


class _Command(typer.core.TyperCommand):
    """Every weightdiag command: a plain usage line, and a quiet end when the reader of stdout goes away."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        # typer writes a required argument as `{MODEL}` in the usage line; MODEL is what a user reads
        # (click's and argparse's convention; optional ones stay `[MODEL]...`).
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]

    def invoke(self, ctx: Any) -> Any:
        # `weightdiag db list | head -1`: the reader closed the pipe. Stop quietly with exit 0, as other
        # command-line tools do, not click's exit 1 (which means "check found a regression").
        from ..database.store import default_on_skip

        default_on_skip.set(_skipped_row_once())  # every command names the damaged rows it skips
        try:
            outcome = super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            raise typer.Exit(ExitCode.OK) from None
        except KeyboardInterrupt as stop:  # here, before click turns it into a bare newline
            what = f"stopped by {stop.name}" if isinstance(stop, Stopped) else "interrupted"
            # A rerun resumes only what the job says it kept (a one-shard Hub fit cut off keeps nothing: issue 42).
            kept = kept_after(stop)
            line = f"{what}: nothing is half-written" + (f"; {kept}" if kept else "")
            _stderr().print(line, markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(_interrupt_code(stop)) from None
        except typer.Exit:
            _flush_stdout()  # a pipe closed at the end keeps the command's own exit code
            raise
        _flush_stdout()
        return outcome


@app.callback()
def _root(version: VersionOption = False) -> None:
    # `weightdiag --version` itself never gets here: weightdiag.__main__ answers it before importing typer.
    pass


db_app = typer.Typer(
    help="The database: the shipped cohorts and your fitted rows.", no_args_is_help=True, context_settings=CONTEXT
)


# The command list of `weightdiag -h`: one line each, short enough for 80 columns (click would cut the
# docstrings with "...").
SHORT_HELP = {
    "fit": "Fit Weibulls to a model's weights; write a row.",
    "compare": "Compare models with the paper's cohort.",
    "check": "Regression check against a baseline row.",
    "diff": "What changed from a base to a tuned model.",
    "sweep": "Fit every checkpoint of a training run.",
    "trajectory": "k and λ over a swept run's steps.",
    "report": "Health report: what is unusual, and why.",
    "lineage": "Whether a model's weights derive from others'.",
    "version": "Print the weightdiag version.",
    "env": "Print the environment, for bug reports.",
    "list": "List cohort entries and fitted rows.",
    "show": "Show one row's per-kind table.",
    "export": "Export the rows as CSV or JSONL.",
    "journals": "List the journals of interrupted fits.",
    "gc": "Remove stale journals.",
}


def _register() -> None:
    """The commands, in the order of `weightdiag -h`, each a _Command with its line of SHORT_HELP."""
    commands: list[tuple[typer.Typer, str, Callable[..., None]]] = [
        (app, "fit", fit.fit),
        (app, "compare", models.compare),
        (app, "check", models.check),
        (app, "diff", diff.diff),
        (db_app, "list", db.db_list),
        (db_app, "show", db.db_show),
        (db_app, "journals", db.db_journals),
        (db_app, "gc", db.db_gc),
        (db_app, "export", db.db_export),
        (app, "sweep", sweep.sweep),
        (app, "trajectory", models.trajectory),
        (app, "report", models.report),
        (app, "lineage", lineage.lineage),
        (app, "version", env.version),
        (app, "env", env.env),
    ]
    for typer_app, name, callback in commands:
        typer_app.command(name, cls=_Command, short_help=SHORT_HELP[name])(callback)
    app.add_typer(db_app, name="db")


_register()

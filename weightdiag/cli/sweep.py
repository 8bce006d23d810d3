"""`weightdiag sweep`: fit every selected checkpoint of a training run into the database."""

from typing import Annotated, Any

import typer

from ..errors import ExitCode
from .output import _emit, _progress, _say
from .takes import Given, takes

# Positional arguments (the options are the names in @takes: options.OPTIONS).
SweepTarget = Annotated[
    str,
    typer.Argument(metavar="MODEL", help="A Hub repo id (ORG/NAME) or a folder of checkpoint folders."),
]


@takes(
    "revisions", "steps", "every@sweep", "glob", "db", "jobs", "executor@sweep", "ray_address", "protocol",
    "device", "center", "include", "exclude", "lr", "weight_decay", "preset", "name@sweep", "token", "cache_dir",
    "download", "connections", "spectrum", "farms", "as_json", "quiet",
)  # fmt: skip
def sweep(target: SweepTarget, given: Given) -> None:
    """Fit every selected checkpoint of a training run into the database (resumable, parallel)."""
    from dataclasses import asdict

    from rich.markup import escape
    from rich.table import Table

    from ..api import sweep as sweep_api
    from ..render.tables import FitWidth, counted

    # No --train-steps: each revision's own step number gives it. --name, --executor and --ray-address are the
    # sweep's, not its fits' options (options.OPTIONS).
    # --center and --include/--exclude make every revision's row that variant (its own file, never counted as the
    # revision's full fit: run/sweep.py row_path), as on `fit`.
    options = given.fit_options()

    def planned(model_id: str, names: list[str]) -> None:
        _say(f"{model_id}: {counted(len(names), 'revision')}: {', '.join(names)}", given.quiet)

    progress = _progress(given.quiet)  # a bar per revision while it is fitted (serial sweeps: --jobs 1, local)

    def show(outcome: Any) -> None:
        progress.close()  # the revision's bar gives way to its outcome line
        if not given.as_json:
            _say(f"  {outcome.revision}: {outcome.status} {outcome.detail}".rstrip(), given.quiet)

    try:
        run = sweep_api(
            target,
            db_dir=given.db,
            options=options,
            revisions=given.revisions.split(",") if given.revisions else None,
            everything=given.every,
            model_id=given.name,
            on_plan=planned,
            on_outcome=show,
            progress=progress,
            **given.named("steps", "glob", "jobs", "executor", "ray_address", "token", "download"),
        )
    finally:
        progress.close()
    outcomes = run.outcomes

    def view() -> Any:
        statuses = ("fitted", "reused", "existing", "claimed", "failed")
        counts = {
            s: sum(o.status == s for o in outcomes)
            for s in statuses
            if s != "claimed" or any(o.status == s for o in outcomes)
        }
        table = Table(title=f"sweep {escape(run.model_id)}: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        for col in ("revision", "status", "seconds", "FFN median k", "detail"):
            # revisions whole, to copy; the detail folds; numbers right-aligned, as in every other table
            numeric = col in ("seconds", "FFN median k")
            table.add_column(col, no_wrap=col != "detail", justify="right" if numeric else "left")
        for o in outcomes:
            table.add_row(
                escape(o.revision),
                o.status,
                f"{o.seconds:.1f}" if o.seconds else "-",
                f"{o.ffn_median_k:.4f}" if o.ffn_median_k else "-",
                escape(o.detail),
            )
        return FitWidth(table, optional=("seconds", "FFN median k"))

    _emit([asdict(o) for o in outcomes], view, as_json=given.as_json, quiet=given.quiet)
    if run.failed:  # the other checkpoints' rows are written: exit 4, not 5
        raise typer.Exit(ExitCode.PARTIAL)

"""The commands that read models or their rows and judge them: `compare` (with the cohort), `check` (against
a baseline), `report` (a model's health) and `trajectory` (a swept run's steps)."""

import sys
from typing import Annotated, Any

import typer

from ..errors import ExitCode
from .notes import _row_note, _say_fallbacks
from .output import _emit, _emit_each, _progress, _say, _stderr, _stdout_gone
from .takes import Given, takes

# Positional arguments (the options are the names in @takes: options.OPTIONS).
CompareModels = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="[MODEL]...",
        help="Models, row files or cohort entries (default: every fitted row in the database).",
        show_default=False,
    ),
]
CheckModel = Annotated[
    str, typer.Argument(metavar="MODEL", help="Model to check: a path, a Hub id, or a row file (.json).")
]
TrajectoryModel = Annotated[
    str, typer.Argument(metavar="MODEL", help="Model id of the swept rows (repo id or run folder name).")
]
ReportModel = Annotated[
    str,
    typer.Argument(metavar="MODEL", help="A model folder or file, a Hub id ORG/NAME[@REV], or a row file (.json)."),
]


@takes(
    "db", "protocol", "device", "lr", "weight_decay", "train_steps", "preset", "revision", "token", "cache_dir",
    "connections", "spectrum", "farms", "save@compare", "as_json", "quiet",
)  # fmt: skip
def compare(models: CompareModels = None, *, given: Given) -> None:
    """Compare models with the paper's 12-entry cohort: kinds, band, Selection severity, neighbours."""
    from ..api import compare as compare_api
    from ..api import compare_database
    from ..render.reports import compare_view

    options = given.fit_options()
    if not models and given.revision is None:  # every fitted row: each printed as it is compared, none held
        _emit_each(compare_database(given.db), compare_view, as_json=given.as_json)
        return
    progress = _progress(given.quiet)
    try:
        reports = compare_api(
            models or (),
            db_dir=given.db,
            options=options,
            progress=progress,
            on_row=_row_note(given.quiet, given.save),
            **given.named("token", "save", "revision"),
        )
    finally:
        progress.close()
    # Always a list, one report per model: a lone object for one model and a list for several made every script
    # test the shape (issue 33; "JSON that changed" in docs/CHANGELOG.md).
    _emit(reports, lambda: [compare_view(r) for r in reports], as_json=given.as_json, quiet=given.quiet)


@takes(
    "baseline", "tol_k", "tol_lambda", "junit", "db", "device", "revision", "token", "cache_dir", "connections",
    "save@check", "show_passing", "as_json", "quiet",
)  # fmt: skip
def check(model: CheckModel, given: Given) -> None:
    """Regression check: exit 0 if every matrix stays within tolerance of the baseline, 1 if any moved."""
    from ..api import check as check_api
    from ..render.reports import check_view
    from ..render.tables import counted

    progress = _progress(given.quiet)
    try:
        result = check_api(
            model,
            given.baseline,
            db_dir=given.db,
            progress=progress,
            on_row=lambda spec, row, how: _say_fallbacks(row, given.quiet),
            **given.named("tol_k", "tol_lambda", "junit", "device", "connections", "token", "save", "revision"),
        )
    finally:
        progress.close()
    verdict = ExitCode.OK if result["passed"] else ExitCode.REGRESSION

    def view() -> Any:
        if result["passed"] and not given.show_passing:
            return (
                f"PASS: {counted(result['checked'], 'matrix', 'matrices', every=True)} of {result['model']} within "
                f"|Δk| <= {given.tol_k} and |Δλ/λ| <= {given.tol_lambda * 100:g}% of {result['baseline']}"
            )
        return check_view(result, given.show_passing)

    try:
        _emit(result, view, as_json=given.as_json, quiet=given.quiet)
        sys.stdout.flush()
    except BrokenPipeError:  # `check ... | head`: the reader left, the verdict stands (a regression is still 1)
        _stdout_gone()
    raise typer.Exit(verdict)


# -q: silences the note on rows left out (a sweep's main)
@takes("db", "schedule", "total", "warmup", "min_lr_ratio", "plot", "protocol@trajectory", "as_json", "quiet")
def trajectory(model: TrajectoryModel, given: Given) -> None:
    """Read a swept run from its rows: k and λ over steps, drift, λ peak, step-0 checks, std patterns."""
    from ..api import trajectory as trajectory_api
    from ..render.reports import trajectory_view

    result = trajectory_api(
        model, db_dir=given.db, **given.named("schedule", "total", "warmup", "min_lr_ratio", "protocol", "plot")
    )
    _emit(result, lambda: trajectory_view(result), as_json=given.as_json, quiet=given.quiet)
    left_out = result.get("left_out") or []
    if left_out:  # rows of no training step (a sweep's main): not on the step axis, said rather than dropped
        shown = ", ".join(f"{model}@{revision}" for revision in left_out[:5]) + (", ..." if len(left_out) > 5 else "")
        _say(
            f"note: {shown} left out: no training step in the revision's name (stepN, step_N, checkpoint-N)",
            given.quiet,
        )


@takes(
    "db", "device", "protocol", "top", "plot", "html@report", "hist", "revision", "token", "cache_dir", "connections",
    "spectrum", "farms", "save@report", "as_json", "quiet",
)  # fmt: skip
def report(model: ReportModel, given: Given) -> None:
    """Health report: per-block table and findings (why a block is unusual), norms, super weights, depth."""
    from ..api import report as report_api
    from ..render.health_view import report_view

    options = given.fit_options()
    progress = _progress(given.quiet)
    try:
        done = report_api(
            model,
            db_dir=given.db,
            options=options,
            progress=progress,
            hist=given.hist or (),
            **given.named("top", "plot", "html", "token", "save", "revision"),
        )
    finally:
        progress.close()
    result = done.result
    _emit(result, lambda: report_view(result), as_json=given.as_json, quiet=given.quiet)
    for line in done.notes:  # what could not be drawn: said even with -q, the output is incomplete
        _stderr().print(line, markup=False, highlight=False, soft_wrap=True)
    if given.plot:
        _say(f"{len(result['plots'])} plots written to {given.plot}", given.quiet)
    if given.html:
        _say(f"HTML report written to {given.html}", given.quiet)
    if done.how == "fitted" and not given.as_json:
        _say(f"{model}: fitted" + (" and saved" if given.save else ""), given.quiet)
    if not given.as_json:
        _say_fallbacks(done.row, given.quiet)

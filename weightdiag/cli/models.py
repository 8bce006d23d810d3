"""The commands that read models or their rows and judge them: `compare` (with the cohort), `check` (against
a baseline), `report` (a model's health) and `trajectory` (a swept run's steps)."""

import sys
from typing import Annotated, Any

import typer

from ..errors import ExitCode
from .fit import _fit_options
from .notes import _row_note, _say_fallbacks
from .options import (
    BaselineOption,
    CheckSaveOption,
    CompareSaveOption,
    ConnectionsOption,
    DbOption,
    DeviceOption,
    FarmsOption,
    HistOption,
    JsonOption,
    JunitOption,
    LrOption,
    MinLrRatioOption,
    PlotOption,
    PresetOption,
    ProtocolOption,
    QuietOption,
    ReportHtmlOption,
    ReportSaveOption,
    RevisionOption,
    ScheduleOption,
    ShowPassingOption,
    SpectrumOption,
    TokenOption,
    TolKOption,
    TolLambdaOption,
    TopOption,
    TotalOption,
    TrainStepsOption,
    TrajectoryProtocolOption,
    WarmupOption,
    WeightDecayOption,
)
from .output import _emit, _emit_each, _progress, _say, _stderr, _stdout_gone


def compare(
    models: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[MODEL]...",
            help="Models, row files or cohort entries (default: every fitted row in the database).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    protocol: ProtocolOption = "hist1024",
    device: DeviceOption = "auto",
    lr: LrOption = None,
    weight_decay: WeightDecayOption = None,
    train_steps: TrainStepsOption = None,
    preset: PresetOption = None,
    revision: RevisionOption = None,
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    spectrum: SpectrumOption = False,
    farms: FarmsOption = False,
    save: CompareSaveOption = True,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Compare models with the paper's 12-entry cohort: kinds, band, Selection severity, neighbours."""
    from ..api import compare as compare_api
    from ..api import compare_database
    from ..render.reports import compare_view

    options = _fit_options(
        protocol=protocol,
        device=device,
        connections=connections,
        lr=lr,
        weight_decay=weight_decay,
        train_steps=train_steps,
        preset=preset,
        spectrum=spectrum,
        farms=farms,
    )
    if not models and revision is None:  # every fitted row: each printed as it is compared, none held
        _emit_each(compare_database(db), compare_view, as_json=as_json)
        return
    progress = _progress(quiet)
    try:
        reports = compare_api(
            models or (),
            db_dir=db,
            options=options,
            progress=progress,
            token=token,
            save=save,
            on_row=_row_note(quiet, save),
            revision=revision,
        )
    finally:
        progress.close()
    # Always a list, one report per model: a lone object for one model and a list for several made every script
    # test the shape (issue 33; the README's "JSON that changed").
    _emit(reports, lambda: [compare_view(r) for r in reports], as_json=as_json, quiet=quiet)


def check(
    model: Annotated[
        str, typer.Argument(metavar="MODEL", help="Model to check: a path, a Hub id, or a row file (.json).")
    ],
    baseline: BaselineOption,
    tol_k: TolKOption = 0.002,
    tol_lambda: TolLambdaOption = 0.01,
    junit: JunitOption = None,
    db: DbOption = None,
    device: DeviceOption = "auto",
    revision: RevisionOption = None,
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    save: CheckSaveOption = False,
    show_passing: ShowPassingOption = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Regression check: exit 0 if every matrix stays within tolerance of the baseline, 1 if any moved."""
    from ..api import check as check_api
    from ..render.reports import check_view
    from ..render.tables import counted

    progress = _progress(quiet)
    try:
        result = check_api(
            model,
            baseline,
            tol_k=tol_k,
            tol_lambda=tol_lambda,
            junit=junit,
            db_dir=db,
            device=device,
            connections=connections,
            progress=progress,
            token=token,
            save=save,
            on_row=lambda spec, row, how: _say_fallbacks(row, quiet),
            revision=revision,
        )
    finally:
        progress.close()
    verdict = ExitCode.OK if result["passed"] else ExitCode.REGRESSION

    def view() -> Any:
        if result["passed"] and not show_passing:
            return (
                f"PASS: {counted(result['checked'], 'matrix', 'matrices', every=True)} of {result['model']} within "
                f"|Δk| <= {tol_k} and |Δλ/λ| <= {tol_lambda * 100:g}% of {result['baseline']}"
            )
        return check_view(result, show_passing)

    try:
        _emit(result, view, as_json=as_json, quiet=quiet)
        sys.stdout.flush()
    except BrokenPipeError:  # `check ... | head`: the reader left, the verdict stands (a regression is still 1)
        _stdout_gone()
    raise typer.Exit(verdict)


def trajectory(
    model: Annotated[
        str, typer.Argument(metavar="MODEL", help="Model id of the swept rows (repo id or run folder name).")
    ],
    db: DbOption = None,
    schedule: ScheduleOption = "constant",
    total: TotalOption = None,
    warmup: WarmupOption = 0.0,
    min_lr_ratio: MinLrRatioOption = 0.1,
    plot: PlotOption = None,
    protocol: TrajectoryProtocolOption = None,
    as_json: JsonOption = False,
    quiet: QuietOption = False,  # accepted for uniformity: trajectory prints no notes
) -> None:
    """Read a swept run from its rows: k and λ over steps, drift, λ peak, step-0 checks, std patterns."""
    from ..api import trajectory as trajectory_api
    from ..render.reports import trajectory_view

    result = trajectory_api(
        model,
        db_dir=db,
        schedule=schedule,
        total=total,
        warmup=warmup,
        min_lr_ratio=min_lr_ratio,
        protocol=protocol,
        plot=plot,
    )
    _emit(result, lambda: trajectory_view(result), as_json=as_json, quiet=quiet)


def report(
    model: Annotated[
        str,
        typer.Argument(metavar="MODEL", help="A model folder or file, a Hub id ORG/NAME[@REV], or a row file (.json)."),
    ],
    db: DbOption = None,
    device: DeviceOption = "auto",
    protocol: ProtocolOption = "hist1024",
    top: TopOption = 10,
    plot: PlotOption = None,
    html: ReportHtmlOption = None,
    hist: HistOption = None,
    revision: RevisionOption = None,
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    spectrum: SpectrumOption = False,
    farms: FarmsOption = False,
    save: ReportSaveOption = True,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Health report: per-block table and findings (why a block is unusual), norms, super weights, depth."""
    from ..api import report as report_api
    from ..render.health_view import report_view

    options = _fit_options(protocol=protocol, device=device, connections=connections, spectrum=spectrum, farms=farms)
    progress = _progress(quiet)
    try:
        done = report_api(
            model,
            db_dir=db,
            options=options,
            progress=progress,
            top=top,
            plot=plot,
            html=html,
            hist=hist or (),
            token=token,
            save=save,
            revision=revision,
        )
    finally:
        progress.close()
    result = done.result
    _emit(result, lambda: report_view(result), as_json=as_json, quiet=quiet)
    for line in done.notes:  # what could not be drawn: said even with -q, the output is incomplete
        _stderr().print(line, markup=False, highlight=False, soft_wrap=True)
    if plot:
        _say(f"{len(result['plots'])} plots written to {plot}", quiet)
    if html:
        _say(f"HTML report written to {html}", quiet)
    if done.how == "fitted" and not as_json:
        _say(f"{model}: fitted" + (" and saved" if save else ""), quiet)
    if not as_json:
        _say_fallbacks(done.row, quiet)

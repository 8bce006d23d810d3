"""`weightdiag fit`, and the one place where the fitting commands' option values become FitOptions."""

from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import DatabaseError
from ..vocabulary import COHORT_TRIM
from .notes import _say_fallbacks
from .options import (
    CenterOption,
    ConnectionsOption,
    DbOption,
    DownloadOption,
    ExcludeOption,
    FarmsOption,
    FitDeviceOption,
    FitExecutorOption,
    FitNameOption,
    FitProtocolOption,
    FitSaveOption,
    IncludeOption,
    JsonOption,
    LrOption,
    NodeProgressOption,
    PresetOption,
    QuietOption,
    RayAddressOption,
    RevisionOption,
    SpectrumOption,
    TokenOption,
    TrainStepsOption,
    TrimOption,
    WeightDecayOption,
)
from .output import _emit, _node_progress, _print_json, _progress, _say

if TYPE_CHECKING:
    from ..record.schema import RunInfo
    from ..run.measure import FitOptions


def _fit_options(
    *,
    protocol: str,
    device: str,
    connections: int,
    trim: str | None = None,
    center: bool | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    name: str | None = None,
    lr: float | None = None,
    weight_decay: float | None = None,
    train_steps: float | None = None,
    preset: str | None = None,
    spectrum: bool = False,
    farms: bool = False,
) -> "FitOptions":
    """The one place where the commands' option values become FitOptions (--name is its model_id,
    --train-steps its steps). A command without an option passes nothing for it: FitOptions' default."""

    from ..run.measure import FitOptions

    options = FitOptions(
        protocol=protocol,
        device=device,
        connections=connections,
        include=tuple(include or ()),
        exclude=tuple(exclude or ()),
        model_id=name,
        lr=lr,
        weight_decay=weight_decay,
        steps=train_steps,
        preset=preset,
        spectrum=spectrum,
        farms=farms,
    )
    if trim is not None:
        options = options.changed(trim=trim)
    if center is not None:
        options = options.changed(center=center)
    return options


def fit(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="A .safetensors/.gguf/.bin file, a model folder, or a Hub id ORG/NAME[@REV]."
        ),
    ],
    db: DbOption = None,
    device: FitDeviceOption = "auto",
    protocol: FitProtocolOption = "hist1024",
    trim: TrimOption = COHORT_TRIM,
    center: CenterOption = False,
    include: IncludeOption = None,
    exclude: ExcludeOption = None,
    revision: RevisionOption = None,
    token: TokenOption = None,
    download: DownloadOption = False,
    connections: ConnectionsOption = 8,
    executor: FitExecutorOption = "local",
    ray_address: RayAddressOption = None,
    node_progress: NodeProgressOption = False,
    name: FitNameOption = None,
    lr: LrOption = None,
    weight_decay: WeightDecayOption = None,
    train_steps: TrainStepsOption = None,
    preset: PresetOption = None,
    spectrum: SpectrumOption = False,
    farms: FarmsOption = False,
    as_json: JsonOption = False,
    save: FitSaveOption = True,
    quiet: QuietOption = False,
) -> None:
    """Fit a Weibull to |w| of every weight matrix and write one row to the database."""

    from ..api import fit as fit_api
    from ..render.tables import counted, kinds_table

    options = _fit_options(
        protocol=protocol,
        device=device,
        connections=connections,
        trim=trim,
        center=center,
        include=include,
        exclude=exclude,
        name=name,
        lr=lr,
        weight_decay=weight_decay,
        train_steps=train_steps,
        preset=preset,
        spectrum=spectrum,
        farms=farms,
    )
    options = options.changed(executor=executor, ray_address=ray_address)
    progress = _node_progress(_progress(quiet), node_progress, executor, quiet)
    try:
        fitted = fit_api(
            model, options, progress, db_dir=db, save=save, revision=revision, token=token, download=download
        )
    except DatabaseError as exc:  # the row could not be written (a full disk): it is not lost for --json
        unsaved = exc.unsaved_row
        if as_json and unsaved is not None:
            _print_json(unsaved)
        raise
    finally:
        progress.close()
    row = fitted.row
    _emit(row, lambda: kinds_table(row), as_json=as_json, quiet=quiet, view_beside_json=True)
    _say_fallbacks(row, quiet)
    others = row["unclassified"]
    if others:
        shown = ", ".join(others[:5]) + (f" and {counted(len(others) - 5, 'more')}" if len(others) > 5 else "")
        _say(f"{counted(len(others), 'matrix', 'matrices')} of unknown role fitted as 'other': {shown}", quiet)
    run: RunInfo = row.get("run") or {}  # a fit always writes it
    why = " (--device auto: the CPU is faster end to end; --device cuda uses a GPU)" if device == "auto" else ""
    took = f" in {run['seconds']:.2f} s" if run.get("seconds") is not None else ""
    _say(f"reduced on {run['device']}{took}{why}", quiet)
    spectra = run.get("spectrum")
    if spectra:
        _say(f"spectra of {spectra['matrices']} matrices taken in {spectra['seconds']:.2f} s", quiet)
    resumed = run.get("resumed")
    if resumed:
        size = resumed["bytes"]
        amount = f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
        since = f" started {resumed['since']}" if resumed.get("since") else ""
        reused = f"{counted(resumed['tensors'], 'tensor')} ({amount})"
        _say(f"resumed an interrupted fit: {reused} measured by the fit{since} were not read again", quiet)
    if fitted.path:
        _say(f"row written to {fitted.path}", quiet)

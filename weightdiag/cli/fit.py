"""`weightdiag fit`: a model's row."""

from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import DatabaseError
from .notes import _say_fallbacks
from .output import _emit, _node_progress, _print_json, _progress, _say
from .takes import Given, takes

if TYPE_CHECKING:
    from ..record.schema import RunInfo


# Positional arguments (the options are the names in @takes: options.OPTIONS).
FitModel = Annotated[
    str,
    typer.Argument(metavar="MODEL", help="A .safetensors/.gguf/.bin file, a model folder, or a Hub id ORG/NAME[@REV]."),
]


@takes(
    "db", "device@fit", "protocol@fit", "trim", "center", "include", "exclude", "revision", "token", "cache_dir",
    "download", "connections", "executor@fit", "ray_address@fit", "node_progress", "name@fit", "lr", "weight_decay",
    "train_steps", "preset", "spectrum", "farms", "plan", "as_json", "save@fit", "quiet",
)  # fmt: skip
def fit(model: FitModel, given: Given) -> None:
    """Fit a Weibull to |w| of every weight matrix and write one row to the database."""

    from ..api import fit as fit_api
    from ..render.tables import counted, kinds_table

    options = given.fit_options()
    if given.plan:  # a dry run: the headers only, nothing fitted or written
        from ..api import plan
        from ..render.tables import plan_table

        document = plan(model, options, **given.named("revision", "token")).to_json()
        _emit(document, lambda: plan_table(document), as_json=given.as_json, quiet=given.quiet)
        return
    progress = _node_progress(_progress(given.quiet), given.node_progress, given.executor, given.quiet)
    try:
        fitted = fit_api(
            model, options, progress, db_dir=given.db, **given.named("save", "revision", "token", "download")
        )
    except DatabaseError as exc:  # the row could not be written (a full disk): it is not lost for --json
        unsaved = exc.unsaved_row
        if given.as_json and unsaved is not None:
            _print_json(unsaved)
        raise
    finally:
        progress.close()
    row = fitted.row
    _emit(row, lambda: kinds_table(row), as_json=given.as_json, quiet=given.quiet, view_beside_json=True)
    _say_fallbacks(row, given.quiet)
    others = row["unclassified"]
    if others:
        shown = ", ".join(others[:5]) + (f" and {counted(len(others) - 5, 'more')}" if len(others) > 5 else "")
        _say(f"{counted(len(others), 'matrix', 'matrices')} of unknown role fitted as 'other': {shown}", given.quiet)
    run: RunInfo = row.get("run") or {}  # a fit always writes it
    why = " (--device auto: the CPU is faster end to end; --device cuda uses a GPU)" if given.device == "auto" else ""
    took = f" in {run['seconds']:.2f} s" if run.get("seconds") is not None else ""
    _say(f"reduced on {run['device']}{took}{why}", given.quiet)
    spectra = run.get("spectrum")
    if spectra:
        where = f" on {spectra['device']}" if spectra.get("device") else ""
        seconds = f" in {spectra['seconds']:.2f} s" if spectra.get("seconds") is not None else ""
        _say(f"spectra of {counted(spectra['matrices'], 'matrix', 'matrices')} taken{where}{seconds}", given.quiet)
    resumed = run.get("resumed")
    if resumed:
        size = resumed["bytes"]
        amount = f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"
        since = f" started {resumed['since']}" if resumed.get("since") else ""
        reused = f"{counted(resumed['tensors'], 'tensor')} ({amount})"
        _say(f"resumed an interrupted fit: {reused} measured by the fit{since} were not read again", given.quiet)
    if fitted.path:
        _say(f"row written to {fitted.path}", given.quiet)

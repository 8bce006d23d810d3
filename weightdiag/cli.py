"""The `weightdiag` command line: thin Typer commands over weightdiag.api.

Exit codes (weightdiag.errors.ExitCode, the README's table): 0 ok; 1 `check` found a regression; 2 bad input or
usage; 3 Hub/network; 4 `sweep` finished with failed checkpoints; 5 internal error (a bug); 130 interrupted.
Errors print one line on stderr, never a traceback (set WEIGHTDIAG_DEBUG=1 to see one).
"""

# No `from __future__ import annotations` in this module: Typer would then eval every command's
# annotations from strings at each start-up (~15 ms for all commands); real objects cost nothing.

import contextlib
import io
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.core

from . import __version__, settings
from .errors import DatabaseError, ExitCode, Stopped, WeightdiagError
from .vocabulary import COHORT_TRIM

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

if TYPE_CHECKING:
    from rich.console import Console

    from .api import RowNote
    from .record.schema import Row, RunInfo
    from .render.tables import FitProgress
    from .run.measure import FitOptions


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
        from .database.store import default_on_skip

        default_on_skip.set(_skipped_row_once())  # every command names the damaged rows it skips
        try:
            outcome = super().invoke(ctx)
        except BrokenPipeError:
            _stdout_gone()
            raise typer.Exit(ExitCode.OK) from None
        except KeyboardInterrupt as stop:  # here, before click turns it into a bare newline
            what = f"stopped by {stop.name}" if isinstance(stop, Stopped) else "interrupted"
            _stderr().print(f"{what}: nothing is half-written; run the command again to resume", markup=False)
            raise typer.Exit(_interrupt_code(stop)) from None
        except typer.Exit:
            _flush_stdout()  # a pipe closed at the end keeps the command's own exit code
            raise
        _flush_stdout()
        return outcome


def _flush_stdout() -> None:
    """Flush stdout now (not at interpreter exit, where a closed pipe prints 'Exception ignored')."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_gone()


def _stdout_gone() -> None:
    """Send what is still buffered for stdout nowhere: its reader is gone."""
    with contextlib.suppress(OSError, ValueError):  # no file descriptor (a test's captured stdout): nothing to do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@cache
def _console(err: bool) -> "Console":
    # Built on first use: rich.console costs ~20 ms at start-up and --json or --version never print with it.
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    # A terminal: its width (or COLUMNS). A file or pipe: COLUMNS if set, else no width at all (rich would
    # wrap at 80), so tables keep their natural width and long lines stay whole; but a pipe read in a
    # terminal (`| head`, `| less`) gets that terminal's width, as its reader sees it (issue 21).
    width = None if stream.isatty() else settings.columns() or _reader_terminal_width(stream) or UNLIMITED_WIDTH
    # emoji=False: paths and model ids are printed as given (`/tmp/p:fire:q` is no emoji code).
    console = Console(stderr=err, width=width, emoji=False)
    if not err:
        console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
    return console


def _broken_pipe() -> None:
    """rich's own Console.on_broken_pipe exits 1, which means "check found a regression": raise instead, and
    _Command ends the command with 0."""
    raise BrokenPipeError


UNLIMITED_WIDTH = 100_000  # wider than any line weightdiag prints: output to a file is never hard-wrapped


def _reader_terminal_width(stream: Any) -> int | None:
    """The width of the terminal a pipe's output is most likely read in: `stream` is a pipe (not a file) and
    stderr is a terminal (`weightdiag db list | head`). None for files, and where no terminal is
    attached (CI, scripts, a job runner): their output keeps its full width."""
    import stat

    try:
        if not stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode):
            return None
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # a captured stream: no descriptor
        return None
    try:
        if sys.stderr is not None and sys.stderr is not stream and sys.stderr.isatty():
            return os.get_terminal_size(sys.stderr.fileno()).columns or None
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass
    return None


def _stderr() -> "Console":
    return _console(True)


def _stdout() -> "Console":
    return _console(False)


def _progress(quiet: bool) -> "FitProgress":
    """The fit progress bar on stderr: not with -q, not when stderr is no terminal (a log file), not when
    HF_HUB_DISABLE_PROGRESS_BARS is set (FitProgress reads it)."""
    from .render.tables import FitProgress

    return FitProgress(_stderr(), enabled=not quiet and _stderr().is_terminal)


def _node_progress(progress: "FitProgress", wanted: bool, executor: str, quiet: bool) -> Any:
    """The progress callback, with --node-progress a line per task handed back by a cluster node (not with -q)."""
    if not wanted:
        return progress
    if executor != "ray":
        from .errors import OptionError

        progress.close()
        raise OptionError(
            "--node-progress shows the nodes of a cluster: give --executor ray too", option="--node-progress"
        )
    if quiet:
        return progress
    from .render.tables import NodeProgress

    return NodeProgress(progress, _stderr())


def _say(text: str, quiet: bool) -> None:
    """One line of chatter on stderr (what was written, what was fitted, fallbacks), unless -q."""
    if not quiet:
        from .kernels import fallback_note  # once the numpy kernels ran (no C), before the first line: never an error's

        for line in (fallback_note(), text):
            if line is not None:
                _stderr().print(line, markup=False, highlight=False, soft_wrap=True)


# Notes a source adds to the row when it had to fall back (weightdiag.source.hub._from_cache_only).
FALLBACK_NOTES = ("read from the local HF cache",)


def _say_fallbacks(row: "Row", quiet: bool) -> None:
    """Say on the terminal when the row was read some other way than asked (the Hub was unreachable ...)."""
    for note in row.get("notes") or ():
        if isinstance(note, str) and note.startswith(FALLBACK_NOTES):
            _say(f"note: {row['model']['id']}: {note}", quiet)
    from .diagnose.quantized import dequantized_line, grid_line

    for line in (dequantized_line(row), grid_line(row)):
        if line:  # a quantized checkpoint, or floats that hold dequantized values: say what the numbers are of
            _say(f"note: {row['model']['id']}: {line}", quiet)
    hp = row.get("hyperparameters") or {}
    missing = [flag for key, flag in _TAU_INPUTS if hp.get(key) is None]
    if missing and len(missing) < len(_TAU_INPUTS) and hp.get("t_over_tau") is None:  # some given, not all
        _say(
            f"note: T/τ (the lambda axis) needs the learning rate, weight decay and steps: give {', '.join(missing)} "
            "too (or --preset NAME)",
            quiet,
        )


_TAU_INPUTS = (("lr", "--lr"), ("weight_decay", "--weight-decay"), ("steps", "--train-steps"))


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"weightdiag {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    # `weightdiag --version` itself never gets here: weightdiag.__main__ answers it before importing typer.
    pass


def _db_path(value: str) -> Path:
    # Path("") is Path("."): without this, `--db ""` would quietly write to ./rows.
    if not value.strip():
        from .errors import OptionError

        raise OptionError(
            "--db '': give a database folder (or leave --db out for the default that `weightdiag env` shows)",
            option="--db",
        )
    return Path(value)


DbOption = Annotated[
    Path | None,
    typer.Option(
        "--db",
        parser=_db_path,
        metavar="DIR",
        help="Database folder (default: $WEIGHTDIAG_DB, else the nearest DATABASE folder here or above, else "
        "~/.local/share/weightdiag; `weightdiag env` shows which).",
    ),
]
# Range-checked by FitOptions.validate (1..64), so a bad value is one error line with exit code 2.
ConnectionsOption = Annotated[
    int,
    typer.Option(
        "--connections",
        metavar="N",
        help="Ranged requests kept in flight when streaming from the Hub (default 8).",
        show_default=False,
    ),
]
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bar and no notes on stderr (errors still print).")
]
# What --json and -q do to a command's output is decided in one place: _emit.
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
CenterOption = Annotated[
    bool,
    typer.Option(
        "--center",
        help="Fit |w - mean| of each matrix (the Weibull paper's App. A.1 text) instead of |w| (its "
        "library and the cohort).",
    ),
]
IncludeOption = Annotated[
    list[str] | None, typer.Option("--include", metavar="GLOB", help="Only tensors matching this glob (repeatable).")
]
ExcludeOption = Annotated[
    list[str] | None, typer.Option("--exclude", metavar="GLOB", help="Skip tensors matching this glob (repeatable).")
]
LrOption = Annotated[float | None, typer.Option("--lr", metavar="LR", help="Peak learning rate (for T/tau).")]
WeightDecayOption = Annotated[
    float | None, typer.Option("--weight-decay", metavar="WD", help="AdamW weight decay (for T/tau).")
]
# Not --steps: on `sweep`, --steps picks checkpoints to fit.
TrainStepsOption = Annotated[
    float | None, typer.Option("--train-steps", metavar="STEPS", help="Training steps done (for T/tau).")
]
PresetOption = Annotated[
    str | None, typer.Option("--preset", metavar="NAME", help="Recipe preset, e.g. pythia-410m (README, T/tau).")
]
ProtocolOption = Annotated[
    str,
    typer.Option(
        "--protocol", metavar="PROTOCOL", help="hist1024 or exact: the protocol for models that must be fitted."
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device", metavar="DEVICE", help="Where to reduce when a model must be fitted: auto, cpu, cuda, cuda:N."
    ),
]
# fit, compare, check, report: MODEL --revision REV is MODEL@REV (a Hub id's, or a fitted model id's in the database).
RevisionOption = Annotated[
    str | None, typer.Option("--revision", metavar="REV", help="Hub branch, tag or commit (same as ORG/NAME@REV).")
]
TokenOption = Annotated[
    str | None, typer.Option("--token", metavar="TOKEN", help="Hub token (default: HF_TOKEN or `hf auth login`).")
]
SpectrumOption = Annotated[
    bool,
    typer.Option(
        "--spectrum",
        help="Also take each matrix's spectrum (WeightWatcher's alpha and metrics; a second pass over the "
        "matrices, 2·m·n·min(m,n) flops each: README, 'The spectrum').",
    ),
]
RayAddressOption = Annotated[
    str | None, typer.Option("--ray-address", metavar="ADDRESS", help="Ray cluster address (default: RAY_ADDRESS).")
]
NodeProgressOption = Annotated[
    bool,
    typer.Option(
        "--node-progress",
        help="With --executor ray: a line on stderr each time a task ends: its node's tasks and bytes so far.",
    ),
]
FarmsOption = Annotated[
    bool,
    typer.Option("--farms", help="With the spectrum, FARMS' aspect-ratio-corrected alpha (~100 s per large matrix)."),
]


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document, indent=1, allow_nan=False) + "\n")


class _Verbatim(str):
    """Text a view has laid out itself: written to stdout as it is (rich would measure and wrap it again)."""


def _emit(
    document: Any, view: Callable[[], Any], *, as_json: bool, quiet: bool, view_beside_json: bool = False
) -> None:
    """A command's result, the one place that chooses how it is shown.

    --json: `document` as JSON on stdout, nothing else there (with `view_beside_json`, as `fit` does, the view
    also goes to stderr for the person watching, unless -q). Otherwise the view on stdout. -q never hides the
    result itself: it silences the chatter on stderr (_say, the progress bar). `view` is called only when it is
    shown; it returns a rich renderable, plain text (printed with markup off), _Verbatim text, or a list of them.
    """
    if as_json:
        _print_json(document)
        if view_beside_json and not quiet:
            _show(view(), _stderr())
        return
    _show(view(), _stdout())


def _emit_each(documents: Iterable[Any], view: Callable[[Any], Any], *, as_json: bool) -> None:
    """_emit of a list whose items are shown as they come (`compare` of a whole database: one row at a time):
    the same output as _emit(list, ...), never the whole list in memory."""
    first = True
    for document in documents:
        if as_json:
            text = json.dumps(document, indent=1, allow_nan=False).replace("\n", "\n ")
            sys.stdout.write(("[\n " if first else ",\n ") + text)
        else:
            _show(view(document), _stdout())
        first = False
    if as_json:
        sys.stdout.write("[]\n" if first else "\n]\n")


def _show(shown: Any, console: "Console") -> None:
    for item in shown if isinstance(shown, list) else [shown]:
        if isinstance(item, _Verbatim):  # past rich, after what it has written so far
            console.file.flush()
            console.file.write(item)
        elif isinstance(item, str):
            console.print(item, markup=False)  # paths and ids are printed as given: `[x]` is no markup
        else:
            console.print(item)


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

    from .run.measure import FitOptions

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


@app.command()
def fit(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="A .safetensors/.gguf/.bin file, a model folder, or a Hub id ORG/NAME[@REV]."
        ),
    ],
    db: DbOption = None,
    device: Annotated[
        str, typer.Option("--device", metavar="DEVICE", help="Where to reduce: auto, cpu, cuda, cuda:N.")
    ] = "auto",
    protocol: Annotated[
        str,
        typer.Option(
            "--protocol", metavar="PROTOCOL", help="hist1024 (the cohort's protocol) or exact (order statistics)."
        ),
    ] = "hist1024",
    trim: Annotated[
        str, typer.Option("--trim", metavar="TRIM", help="Trim for per-kind medians: mid80 (paper), mid90 or full.")
    ] = COHORT_TRIM,
    center: CenterOption = False,
    include: IncludeOption = None,
    exclude: ExcludeOption = None,
    revision: RevisionOption = None,
    token: TokenOption = None,
    download: Annotated[
        bool, typer.Option("--download", help="Fetch whole shards into the HF cache instead of streaming.")
    ] = False,
    connections: ConnectionsOption = 8,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            metavar="EXECUTOR",
            help="local (this machine) or ray (the chunks read and reduced by tasks on an existing Ray cluster).",
        ),
    ] = "local",
    ray_address: RayAddressOption = None,
    node_progress: NodeProgressOption = False,
    name: Annotated[
        str | None, typer.Option("--name", metavar="ID", help="Model id to record (default: from the path or repo).")
    ] = None,
    lr: LrOption = None,
    weight_decay: WeightDecayOption = None,
    train_steps: TrainStepsOption = None,
    preset: PresetOption = None,
    spectrum: SpectrumOption = False,
    farms: FarmsOption = False,
    as_json: JsonOption = False,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Write the row into the database folder.")] = True,
    quiet: QuietOption = False,
) -> None:
    """Fit a Weibull to |w| of every weight matrix and write one row to the database."""

    from .api import fit as fit_api
    from .render.tables import counted, kinds_table

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


def _row_note(quiet: bool, save: bool = True) -> "RowNote":
    """What to say on stderr once a model's row is at hand: its fallbacks, and that it was fitted."""

    def note(spec: str, row: "Row", how: str) -> None:
        _say_fallbacks(row, quiet)
        if how == "fitted":
            _say(f"{spec}: fitted" + (" and saved" if save else ""), quiet)
        elif how.startswith("database (the Hub is unreachable)"):
            revision = row["model"].get("revision")
            _say(f"{spec}: the Hub is unreachable; its row of {revision} in the database is used", quiet)

    return note


@app.command()
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
    save: Annotated[
        bool, typer.Option("--save/--no-save", help="Save the rows of models fitted on the way in the database.")
    ] = True,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Compare models with the paper's 12-entry cohort: kinds, band, Selection severity, neighbours."""
    from .api import compare as compare_api
    from .api import compare_database
    from .render.reports import compare_view

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


@app.command()
def check(
    model: Annotated[
        str, typer.Argument(metavar="MODEL", help="Model to check: a path, a Hub id, or a row file (.json).")
    ],
    baseline: Annotated[
        Path,
        typer.Option(
            "--baseline", metavar="ROW", help="The baseline row file (weightdiag.row/1 JSON).", show_default=False
        ),
    ],
    tol_k: Annotated[
        float, typer.Option("--tol-k", metavar="TOL", help="Allowed |k - k_baseline| (absolute).")
    ] = 0.002,
    tol_lambda: Annotated[
        float, typer.Option("--tol-lambda", metavar="TOL", help="Allowed |λ/λ_baseline - 1|.")
    ] = 0.01,
    junit: Annotated[
        Path | None, typer.Option("--junit", metavar="FILE", help="Also write a JUnit XML report here.")
    ] = None,
    db: DbOption = None,
    device: DeviceOption = "auto",
    revision: RevisionOption = None,
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Save the fitted row in the database.")] = False,
    # Not --all: on `sweep`, --all means every revision.
    show_passing: Annotated[bool, typer.Option("--show-passing", help="List passing matrices too.")] = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Regression check: exit 0 if every matrix stays within tolerance of the baseline, 1 if any moved."""
    from .api import check as check_api
    from .render.reports import check_view
    from .render.tables import counted

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


@app.command()
def diff(
    first: Annotated[
        str,
        typer.Argument(
            metavar="BASE",
            help="The base model (file, folder or Hub id ORG/NAME[@REV]); given alone: the tuned model, diffed "
            "against the base_model its model card names.",
        ),
    ],
    second: Annotated[
        str | None,
        typer.Argument(metavar="TUNED", help="The tuned model (file, folder or Hub id).", show_default=False),
    ] = None,
    include: IncludeOption = None,
    exclude: ExcludeOption = None,
    fail_above: Annotated[
        float | None,
        typer.Option(
            "--fail-above",
            metavar="CHANGE",
            help="CI gate: exit 1 if a compared tensor's relative change exceeds this (0: any change).",
        ),
    ] = None,
    blocks: Annotated[
        str | None,
        typer.Option("--blocks", metavar="LIST", help="Gate only these blocks, e.g. 0-3,7 (with --fail-above)."),
    ] = None,
    sketch: Annotated[
        int,
        typer.Option("--sketch", metavar="K", help="Range sketch size for matrices over 1024 columns (default 128)."),
    ] = 128,
    spectrum: Annotated[
        bool, typer.Option("--spectrum/--no-spectrum", help="Singular values and rank90 of each ΔW.")
    ] = True,
    db: DbOption = None,
    device: Annotated[
        str,
        typer.Option(
            "--device", metavar="DEVICE", help="Where the spectrum's sketch runs: auto (the CPU), cpu, cuda, cuda:N."
        ),
    ] = "auto",
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            metavar="EXECUTOR",
            help="local (this machine) or ray (tensor pairs compared by tasks on an existing Ray cluster).",
        ),
    ] = "local",
    ray_address: RayAddressOption = None,
    node_progress: NodeProgressOption = False,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Write the diff row into the database folder.")] = True,
    # Not --all: on `sweep`, --all means every revision. `diff --all`, its name before, still works (hidden).
    all_matrices: Annotated[
        bool, typer.Option("--all-matrices", help="List every matrix, not the 15 that changed most.")
    ] = False,
    all_matrices_alias: Annotated[bool, typer.Option("--all", hidden=True)] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="DIR", help="Write PNG plots into this folder.")
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", metavar="FILE", help="Write a self-contained HTML page here.")
    ] = None,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """What changed from BASE to TUNED, matrix by matrix: exact figures, rank90, findings; a CI gate."""
    from .api import diff as diff_api
    from .delta.gate import gate, parse_blocks
    from .delta.result import DiffOptions
    from .render.diff_view import diff_view, gate_line

    base, tuned = (first, second) if second is not None else (None, first)
    chosen_blocks = parse_blocks(blocks)
    if blocks is not None and fail_above is None:
        from .errors import OptionError

        raise OptionError("--blocks selects what --fail-above gates; give --fail-above too", option="--blocks")
    options = DiffOptions(
        device=device,
        include=include or (),
        exclude=exclude or (),
        sketch=sketch,
        spectrum=spectrum,
        connections=connections,
        token=token,
        executor=executor,
        ray_address=ray_address,
    )
    progress = _node_progress(_progress(quiet), node_progress, executor, quiet)
    try:
        result = diff_api(base, tuned, options, db_dir=db, save=save, plot_dir=plot, html_file=html, progress=progress)
    finally:
        progress.close()
    verdict = gate(result, fail_above, blocks=chosen_blocks) if fail_above is not None else None
    document = result.to_json()
    if verdict is not None:
        document["gate"] = verdict.to_json()
    every = all_matrices or all_matrices_alias
    if verdict is not None and quiet:  # a CI gate's result is its verdict: -q prints that line alone (issue 33)
        _emit(document, lambda: _Verbatim(gate_line(verdict) + "\n"), as_json=as_json, quiet=quiet)  # never folded
    else:
        _emit(document, lambda: diff_view(result, every, verdict), as_json=as_json, quiet=quiet)
    if save and not as_json and result.run.get("saved"):
        _say(f"diff row written to {result.run['saved']}", quiet)
    if plot is not None:
        _say(f"{len(result.run.get('plots') or [])} plots written to {plot}", quiet)
    if html is not None:
        _say(f"HTML page written to {html}", quiet)
    raise typer.Exit(ExitCode.OK if verdict is None or verdict.passed else ExitCode.REGRESSION)


db_app = typer.Typer(
    help="The database: the shipped cohorts and your fitted rows.", no_args_is_help=True, context_settings=CONTEXT
)
app.add_typer(db_app, name="db")


@db_app.command("list")
def db_list(
    db: DbOption = None,
    fitted_only: Annotated[bool, typer.Option("--fitted", help="Only fitted rows (no cohort entries).")] = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,  # accepted everywhere; warnings about skipped files still print
) -> None:
    """List cohort entries and fitted rows (a file in rows/ that is not a readable row is skipped, with a warning)."""
    from rich.text import Text

    from .api import list_rows
    from .render.reports import db_list_view

    records = list_rows(db, fitted_only=fitted_only, on_skip=_skipped_row)
    # No fitted row in the folder the default rules chose (rows fitted elsewhere "vanish"): say which folder, why.
    folder, why = settings.db_location()
    if (
        db is None
        and why != settings.DB_FROM_ENV
        and all(str(r.get("source", "")).startswith("cohort") for r in records)
    ):
        _say(
            f"note: no fitted rows in the database {Path(folder).absolute()} ({why}); fit a model, or pass the "
            "database that holds yours with --db (or WEIGHTDIAG_DB)",
            quiet,
        )

    def view() -> Any:
        shown = db_list_view(records, _stdout().width)  # ids whole, never cut or folded: `db show` takes them
        return _Verbatim(shown.plain + "\n") if isinstance(shown, Text) else shown  # Text: a long listing

    _emit(records, view, as_json=as_json, quiet=quiet)


def _skipped_row(exc: Any) -> None:
    """A file in rows/ that is not a readable row (records.RowError): one warning line, then go on."""
    _stderr().print(f"warning: {exc.summary}; skipped ({exc.advice})", markup=False, highlight=False, soft_wrap=True)


def _skipped_row_once() -> Callable[[Any], None]:
    """_skipped_row, once per file in a command (a command may scan the database twice)."""
    seen: set[str] = set()

    def note(exc: Any) -> None:
        if exc.summary not in seen:
            seen.add(exc.summary)
            _skipped_row(exc)

    return note


@db_app.command("show")
def db_show(
    row_id: Annotated[
        str,
        typer.Argument(
            metavar="ID",
            help="A cohort entry or fitted model id as `db list` prints it (ID[@REVISION]), or a row file.",
        ),
    ],
    db: DbOption = None,
    as_json: JsonOption = False,
    quiet: QuietOption = False,  # accepted for uniformity: db show prints no notes
) -> None:
    """Show one row: the per-kind table (or the whole row with --json).

    An exact id wins; otherwise an id that differs only in case, when it names one entry (`db show QWEN3-8B`
    names two, qwen3-8b and Qwen3-8B, and is refused with both listed).
    """
    from .api import show_row
    from .render.tables import kinds_table

    row = show_row(row_id, db, summary=not as_json)  # the table needs the per-kind summaries only

    def view() -> list[Any]:
        p = row.get("provenance") or {}
        terms = " ".join(str(p[k]) for k in ("license", "copyright") if p.get(k))
        credit = "; ".join(part for part in (str(p.get("paper") or ""), terms) if part)  # paper; license (c)
        if not credit:
            return [kinds_table(row)]
        from rich.styled import Styled

        # What print(credit, markup=False, style="dim") draws: the highlighted text, all of it dim.
        return [kinds_table(row), Styled(_stdout().render_str(credit, markup=False), "dim")]

    _emit(row, view, as_json=as_json, quiet=quiet)


@db_app.command("journals")
def db_journals(db: DbOption = None, as_json: JsonOption = False, quiet: QuietOption = False) -> None:
    """List the journals of interrupted fits (rows/.partial): model, revision, size, age, host and state."""
    from .api import list_journals
    from .render.tables import counted

    found = list_journals(db)

    def view() -> Any:
        lines = [
            f"{j.model or '?'}{'@' + j.revision if j.revision else ''}  {_bytes(j.size)}  {_age(j.age)} ago  "
            f"{j.host or '?'}  "
            f"{j.state}{': ' + j.why if j.why else ''}  {j.folder}"
            for j in found
        ]
        return _Verbatim("".join(line + "\n" for line in lines) or "no journals\n")

    _emit([j.to_json() for j in found], view, as_json=as_json, quiet=quiet)
    stale = [j for j in found if j.state == "stale"]
    if stale:
        _say(f"{counted(len(stale), 'stale journal')}: `weightdiag db gc` removes them", quiet)


@db_app.command("gc")
def db_gc(
    db: DbOption = None,
    every: Annotated[
        bool, typer.Option("--all", help="Also the journals of interrupted fits (their next fit starts over).")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would be removed.")] = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Remove stale journals (rows/.partial), and with --all every one not being fitted; never one whose fit is
    running (a live sweep claim, a live process of this host, or another host's journal written within a day)."""
    from .api import collect_journals
    from .render.tables import counted

    removed = collect_journals(db, everything=every, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"

    def view() -> Any:
        lines = [f"{verb} {j.folder} ({_bytes(j.size)}: {j.why or j.state})" for j in removed]
        return _Verbatim("".join(line + "\n" for line in lines))

    _emit([j.to_json() for j in removed], view, as_json=as_json, quiet=quiet)
    freed = _bytes(sum(j.size for j in removed))
    done = f"would be removed, {freed} freed" if dry_run else f"removed, {freed} freed"
    _say(f"{counted(len(removed), 'journal')} {done}", quiet)


def _bytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


@db_app.command("export")
def db_export(
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="csv or jsonl.")] = "csv",
    output: Annotated[
        Path | None, typer.Option("--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
    ] = None,
    db: DbOption = None,
    fitted_only: Annotated[bool, typer.Option("--fitted", help="Only fitted rows (no cohort entries).")] = False,
    quiet: QuietOption = False,
) -> None:
    """Export one flat record per row (identity, T/tau, per-kind median k and λ) as CSV or JSONL."""
    from .api import export_rows

    text, count = export_rows(fmt, output=output, db_dir=db, fitted_only=fitted_only, on_skip=_skipped_row)
    if output:
        if not quiet:
            _stderr().print(f"{count} rows written to {output}", markup=False)
    else:
        sys.stdout.write(text)


@app.command()
def sweep(
    target: Annotated[
        str,
        typer.Argument(metavar="MODEL", help="A Hub repo id (ORG/NAME) or a folder of checkpoint folders."),
    ],
    revisions: Annotated[
        str | None,
        typer.Option("--revisions", metavar="REV,...", help="Comma-separated revisions (branch / folder names)."),
    ] = None,
    steps: Annotated[
        str | None,
        typer.Option(
            "--steps",
            metavar="log:N|STEP,...",
            help="Which checkpoints: N log-spaced steps (default log:14) or a list of steps.",
        ),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Every revision.")] = False,
    glob: Annotated[
        str | None,
        typer.Option("--glob", metavar="GLOB", help="Local runs: glob of checkpoint folders (default step*, ...)."),
    ] = None,
    db: DbOption = None,
    jobs: Annotated[int, typer.Option("--jobs", metavar="N", help="Local worker processes.")] = 1,
    executor: Annotated[
        str, typer.Option("--executor", metavar="EXECUTOR", help="local (processes) or ray (an existing Ray cluster).")
    ] = "local",
    ray_address: RayAddressOption = None,
    protocol: ProtocolOption = "hist1024",
    device: DeviceOption = "auto",
    center: CenterOption = False,
    include: IncludeOption = None,
    exclude: ExcludeOption = None,
    lr: LrOption = None,
    weight_decay: WeightDecayOption = None,
    preset: PresetOption = None,
    name: Annotated[
        str | None,
        typer.Option("--name", metavar="ID", help="Model id for the rows (default: repo id or folder name)."),
    ] = None,
    token: TokenOption = None,
    download: Annotated[bool, typer.Option("--download", help="Fetch whole shards into the HF cache.")] = False,
    connections: ConnectionsOption = 8,
    spectrum: SpectrumOption = False,
    farms: FarmsOption = False,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Fit every selected checkpoint of a training run into the database (resumable, parallel)."""
    from dataclasses import asdict

    from rich.markup import escape
    from rich.table import Table

    from .api import sweep as sweep_api
    from .render.tables import FitWidth, counted

    # No --train-steps: each revision's own step number gives it. --name is the sweep's, not a fit option.
    # --center and --include/--exclude make every revision's row that variant (its own file, never counted as the
    # revision's full fit: run/sweep.py row_path), as on `fit`.
    options = _fit_options(
        protocol=protocol,
        device=device,
        connections=connections,
        center=center,
        include=include,
        exclude=exclude,
        lr=lr,
        weight_decay=weight_decay,
        preset=preset,
        spectrum=spectrum,
        farms=farms,
    )

    def planned(model_id: str, names: list[str]) -> None:
        _say(f"{model_id}: {counted(len(names), 'revision')}: {', '.join(names)}", quiet)

    progress = _progress(quiet)  # a bar per revision while it is fitted (serial sweeps: --jobs 1, local)

    def show(outcome: Any) -> None:
        progress.close()  # the revision's bar gives way to its outcome line
        if not as_json:
            _say(f"  {outcome.revision}: {outcome.status} {outcome.detail}".rstrip(), quiet)

    try:
        run = sweep_api(
            target,
            db_dir=db,
            options=options,
            revisions=revisions.split(",") if revisions else None,
            steps=steps,
            everything=every,
            glob=glob,
            jobs=jobs,
            executor=executor,
            ray_address=ray_address,
            model_id=name,
            token=token,
            download=download,
            on_plan=planned,
            on_outcome=show,
            progress=progress,
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
            table.add_column(col, no_wrap=col != "detail")  # revisions whole, to copy; the detail folds
        for o in outcomes:
            table.add_row(
                escape(o.revision),
                o.status,
                f"{o.seconds:.1f}" if o.seconds else "-",
                f"{o.ffn_median_k:.4f}" if o.ffn_median_k else "-",
                escape(o.detail),
            )
        return FitWidth(table, optional=("seconds", "FFN median k"))

    _emit([asdict(o) for o in outcomes], view, as_json=as_json, quiet=quiet)
    if run.failed:  # the other checkpoints' rows are written: exit 4, not 5
        raise typer.Exit(ExitCode.PARTIAL)


@app.command()
def trajectory(
    model: Annotated[
        str, typer.Argument(metavar="MODEL", help="Model id of the swept rows (repo id or run folder name).")
    ],
    db: DbOption = None,
    schedule: Annotated[
        str,
        typer.Option(
            "--schedule", metavar="SCHEDULE", help="constant (T x eta x wd) or cosine (warmup + cosine decay)."
        ),
    ] = "constant",
    total: Annotated[
        float | None, typer.Option("--total", metavar="STEPS", help="Cosine: total training steps.")
    ] = None,
    warmup: Annotated[float, typer.Option("--warmup", metavar="STEPS", help="Cosine: warm-up steps.")] = 0.0,
    min_lr_ratio: Annotated[
        float, typer.Option("--min-lr-ratio", metavar="RATIO", help="Cosine: final learning rate / peak.")
    ] = 0.1,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", metavar="DIR", help="Write PNG plots into this folder (needs the [plot] extra)."),
    ] = None,
    protocol: Annotated[
        str | None,
        typer.Option(
            "--protocol", metavar="PROTOCOL", help="Use rows fitted with this protocol (default: hist1024 if any)."
        ),
    ] = None,
    as_json: JsonOption = False,
    quiet: QuietOption = False,  # accepted for uniformity: trajectory prints no notes
) -> None:
    """Read a swept run from its rows: k and λ over steps, drift, λ peak, step-0 checks, std patterns."""
    from .api import trajectory as trajectory_api
    from .render.reports import trajectory_view

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


@app.command()
def report(
    model: Annotated[
        str,
        typer.Argument(metavar="MODEL", help="A model folder or file, a Hub id ORG/NAME[@REV], or a row file (.json)."),
    ],
    db: DbOption = None,
    device: DeviceOption = "auto",
    protocol: ProtocolOption = "hist1024",
    top: Annotated[
        int, typer.Option("--top", min=1, metavar="N", help="How many super-weight candidates to list.")
    ] = 10,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="DIR", help="Write PNG plots into this folder.")
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", metavar="FILE", help="Write a self-contained HTML report here.")
    ] = None,
    hist: Annotated[
        list[str] | None,
        typer.Option("--hist", metavar="GLOB", help="Tensor name or glob to draw a |w| histogram of (repeatable)."),
    ] = None,
    revision: RevisionOption = None,
    token: TokenOption = None,
    connections: ConnectionsOption = 8,
    spectrum: SpectrumOption = False,
    farms: FarmsOption = False,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Save a freshly fitted row in the database.")] = True,
    as_json: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Health report: per-block table and findings (why a block is unusual), norms, super weights, depth."""
    from .api import report as report_api
    from .render.health_view import report_view

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


@app.command()
def version() -> None:
    """Print the weightdiag version."""
    _stdout().print(f"weightdiag {__version__}")


@app.command()
def env(
    as_json: JsonOption = False,
    quiet: QuietOption = False,  # accepted for uniformity: env prints no notes
) -> None:
    """Print the environment weightdiag runs in, to paste into a bug report (never the Hub token)."""
    document = _environment()

    def view() -> _Verbatim:
        lines = ["Copy and paste the text below into your bug report.", ""]
        for key, value in document.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items()) or "none set"
            lines.append(f"- {ENV_LABELS[key]}: {value}")
        return _Verbatim("\n".join(lines) + "\n")

    _emit(document, view, as_json=as_json, quiet=quiet)


def _environment() -> dict[str, Any]:
    """What `weightdiag env` reports: versions, kernels, torch and CUDA, the database, the Hub settings."""
    import platform
    from importlib import metadata

    from .kernels import describe

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    try:
        hub_version = metadata.version("huggingface_hub")
    except metadata.PackageNotFoundError:
        hub_version = "not installed"
    return {
        "weightdiag_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "kernels": describe(),
        "cores": _cores_summary(),
        "torch_version": torch_version or "not installed (only needed for .bin files and CUDA)",
        "cuda": _cuda_summary() if torch_version else "no (torch is not installed)",
        "huggingface_hub_version": hub_version,
        "database_folder": str(Path(settings.db_dir()).absolute()),
        "database_folder_chosen": settings.db_location()[1] + "; a command's --db DIR overrides it",
        "hf_endpoint": settings.hf_endpoint(),
        "hf_cache": settings.hf_cache_dir(),
        "hf_offline": settings.hf_offline(),
        "hf_token": "present" if settings.hf_token_present() else "not found",
        "progress_bars": "shown on a terminal" if settings.progress_bars() else "hidden (HF_HUB_DISABLE_PROGRESS_BARS)",
        "weightdiag_variables": settings.weightdiag_variables(),
    }


# `env --json`'s keys are snake_case, as in every other JSON weightdiag prints (they had spaces before issue 33);
# the text for a person keeps the words.
ENV_LABELS = {
    "weightdiag_version": "weightdiag version",
    "python_version": "Python version",
    "platform": "Platform",
    "kernels": "Kernels",
    "cores": "Cores",
    "torch_version": "Torch version",
    "cuda": "CUDA",
    "huggingface_hub_version": "huggingface_hub version",
    "database_folder": "Database folder",
    "database_folder_chosen": "Database folder chosen",
    "hf_endpoint": "HF endpoint",
    "hf_cache": "HF cache",
    "hf_offline": "HF offline",
    "hf_token": "HF token",
    "progress_bars": "Progress bars",
    "weightdiag_variables": "WEIGHTDIAG variables",
}


def _cores_summary() -> str:
    """The cores this process may use and how many local chunks a fit reads at once (settings.chunk_workers)."""
    from .errors import OptionError

    try:
        workers = settings.chunk_workers()
    except OptionError as exc:  # env still answers: it is where a bad setting is looked into
        return f"{settings.available_cores()} available; {exc}"
    return f"{settings.available_cores()} available; a fit reads {workers} local chunks at once"


def _cuda_summary() -> str:
    # torch is imported (about a second) only where an NVIDIA driver is present; elsewhere CUDA cannot be.
    from .execution import nvidia_present

    if not nvidia_present():
        return "no (no NVIDIA driver)"
    try:
        import torch
    except ImportError:
        return "no (torch is not installed: pip install 'weightdiag[torch]')"

    if not torch.cuda.is_available():
        return "no (torch sees no GPU)"
    return f"yes, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}"


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
    "version": "Print the weightdiag version.",
    "env": "Print the environment, for bug reports.",
    "list": "List cohort entries and fitted rows.",
    "show": "Show one row's per-kind table.",
    "export": "Export the rows as CSV or JSONL.",
    "journals": "List the journals of interrupted fits.",
    "gc": "Remove stale journals.",
}


def _set_short_help() -> None:
    for typer_app in (app, db_app):
        for info in typer_app.registered_commands:
            command = info.name or (info.callback.__name__ if info.callback else None)
            if command in SHORT_HELP and info.short_help is None:
                info.short_help = SHORT_HELP[command]


_set_short_help()


def _set_command_class() -> None:
    for typer_app in (app, db_app):
        for info in typer_app.registered_commands:
            if info.cls in (None, typer.core.TyperCommand):  # typer fills in its default class
                info.cls = _Command


_set_command_class()


def _error_line(exc: Exception) -> tuple[str, int]:
    """The one line on stderr for an exception that ends the command, and its exit code.

    The only place where errors are formatted for the terminal. A WeightdiagError's class names the cause
    and fixes the exit code (weightdiag.errors: BadInputError and its subclasses 2, HubError and its
    subclasses 3); its message says what is wrong and what to do; its fields (repo, revision, file, status,
    ...) are for programs (`exc.fields`), the line shows the message alone.
    """
    if isinstance(exc, WeightdiagError):
        message = " ".join(exc.message.split()) or type(exc).__name__  # one line, whatever a subclass did
        return f"error: {message}", ExitCode(exc.exit_code)
    if isinstance(exc, PermissionError):  # a file or folder the user may not read or write: their input
        where = exc.filename or "a file"
        return (
            f"error: {where}: permission denied; make it readable (or the folder writable) or choose another path",
            ExitCode.BAD_INPUT,
        )
    return (  # a bug: say so in one line, keep the traceback for WEIGHTDIAG_DEBUG
        f"internal error: {type(exc).__name__}: {exc} (set WEIGHTDIAG_DEBUG=1 for a traceback and please report it)",
        ExitCode.INTERNAL,
    )


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point with weightdiag's exit codes and one-line errors.

    Typer handles usage errors itself (exit 2, with the usage line); everything weightdiag raises
    on purpose becomes one line on stderr with its documented exit code.
    """
    previous = _stop_on_signals()
    try:
        app(args=argv, prog_name="weightdiag")
    except KeyboardInterrupt as stop:
        _stderr().print(f"stopped by {stop.name}" if isinstance(stop, Stopped) else "interrupted")
        sys.exit(_interrupt_code(stop))
    except Exception as exc:
        if settings.debug():
            raise
        line, code = _error_line(exc)
        _stderr().print(line, markup=False, highlight=False, soft_wrap=True)
        sys.exit(code)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_STOP_SIGNALS = {"SIGTERM": ExitCode.TERMINATED, "SIGHUP": ExitCode.HANGUP}


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM and SIGHUP raise Stopped in the main thread, which unwinds like Ctrl-C (sweep workers are
    ended, nothing is written after it). Only from the main thread, where Python can install handlers."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for name in _STOP_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is None:  # SIGHUP does not exist on Windows
            continue

        def stop(received: int, _frame: Any, name: str = name) -> None:
            raise Stopped(received, name)

        previous[signum] = signal.signal(signum, stop)
    return previous


def _interrupt_code(stop: KeyboardInterrupt) -> ExitCode:
    return _STOP_SIGNALS[stop.name] if isinstance(stop, Stopped) else ExitCode.INTERRUPTED


if __name__ == "__main__":
    main()

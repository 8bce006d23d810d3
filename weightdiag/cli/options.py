"""Every option of the command line, declared once: an `Annotated` alias with its flags, metavar and one help
text; and OPTIONS, the table of the options by parameter name, each with its alias and its default (a FitOptions
field's taken from FitOptions' own specs), that a command's `@takes("db", "device", ...)` names (takes.py).

Where two commands' flags of one name differ in their help, the difference says something about the command
(what it saves, where its work runs, whether it always fits): those are two aliases, each with a comment.
"""

# No `from __future__ import annotations` in this package: Typer would then eval every command's
# annotations from strings at each start-up (~15 ms for all commands); real objects cost nothing.

import sys
from inspect import Parameter
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer

from .. import __version__
from ..run.options import FitOptions


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(f"weightdiag {__version__}\n")
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option("--version", "-V", callback=_show_version, is_eager=True, help="Print the version and exit."),
]


def _db_path(value: str) -> Path:
    # Path("") is Path("."): without this, `--db ""` would quietly write to ./rows.
    if not value.strip():
        from ..errors import OptionError, param

        raise OptionError(
            f"{param('db_dir')} '': give a database folder (or leave {param('db_dir')} out for the default that "
            "`weightdiag env` shows)",
            param="db_dir",
        )
    return Path(value)


def _option(kind: Any, *flags: str, **declared: Any) -> Any:
    """An option's alias: its type, flags, metavar and help (what typer.Option takes), as Annotated; the shell
    completes the values of the flags in VALUES."""
    if flags[0] in VALUES:
        declared.setdefault("autocompletion", _values(*VALUES[flags[0]]))
    return Annotated[kind, typer.Option(*flags, **declared)]


# The words the shell completes after a flag (`--device <TAB>`; issue 42): (module, name) where they are declared,
# imported only when the shell asks.
VALUES = {
    "--device": (".options", "DEVICES"),
    "--protocol": ("..vocabulary", "PROTOCOLS"),
    "--trim": ("..vocabulary", "TRIMS"),
    "--executor": ("..execution", "EXECUTORS"),
    "--preset": ("..diagnose.lambda_axis", "PRESETS"),
    "--schedule": ("..api", "SCHEDULES"),
    "--format": ("..api", "EXPORT_FORMATS"),
}
DEVICES = ("auto", "cpu", "cuda")  # and cuda:N


def _values(where: str, name: str) -> Any:
    def complete(incomplete: str) -> list[str]:
        from importlib import import_module

        return [word for word in getattr(import_module(where, __package__), name) if word.startswith(incomplete)]

    return complete


# --- every command -----------------------------------------------------------------------------------------

DbOption = _option(
    Path | None,
    "--db",
    parser=_db_path,
    metavar="DIR",
    help="Database folder (default: $WEIGHTDIAG_DB, else the nearest DATABASE folder here or above, else "
    "~/.local/share/weightdiag; `weightdiag env` shows which).",
)
QuietOption = _option(bool, "--quiet", "-q", help="No progress bar and no notes on stderr (errors still print).")
# What --json and -q do to a command's output is decided in one place: output._emit.
JsonOption = _option(bool, "--json", help="Print the result as JSON on stdout.")

# --- how a model is read and fitted (fit, compare, check, report, sweep; diff reads) ---------------------------

# Range-checked by FitOptions.validate (1..64), so a bad value is one error line with exit code 2.
ConnectionsOption = _option(
    int,
    "--connections",
    metavar="N",
    help="Ranged requests kept in flight when streaming from the Hub (default 8).",
    show_default=False,
)
# fit, compare, check, report: MODEL --revision REV is MODEL@REV (a Hub id's, or a fitted model id's in the database).
RevisionOption = _option(
    str | None, "--revision", metavar="REV", help="Hub branch, tag or commit (same as ORG/NAME@REV)."
)
# diff: TUNED --revision REV is TUNED@REV (the model diffed; the base's is BASE@REV).
DiffRevisionOption = _option(
    str | None, "--revision", metavar="REV", help="The tuned model's Hub branch, tag or commit (same as TUNED@REV)."
)
TokenOption = _option(str | None, "--token", metavar="TOKEN", help="Hub token (default: HF_TOKEN or `hf auth login`).")
# As `hf download --cache-dir`: where Hub files are cached (read offline, written by --download).
CacheDirOption = _option(
    Path | None, "--cache-dir", metavar="DIR", help="HF cache folder (default: HF_HUB_CACHE, else $HF_HOME/hub)."
)
DownloadOption = _option(bool, "--download", help="Fetch whole shards into the HF cache instead of streaming.")
# compare, check, report, sweep fit a model only when its row is not in the database already.
DeviceOption = _option(
    str, "--device", metavar="DEVICE", help="Where to reduce when a model must be fitted: auto, cpu, cuda, cuda:N."
)
# fit always reduces.
FitDeviceOption = _option(str, "--device", metavar="DEVICE", help="Where to reduce: auto, cpu, cuda, cuda:N.")
# diff reduces nothing: the device takes its spectrum's sketch, and auto is the CPU there.
DiffDeviceOption = _option(
    str, "--device", metavar="DEVICE", help="Where the spectrum's sketch runs: auto (the CPU), cpu, cuda, cuda:N."
)
# compare, sweep, report: the protocol of the models that must be fitted (rows in the database are read as they are).
ProtocolOption = _option(
    str, "--protocol", metavar="PROTOCOL", help="hist1024 or exact: the protocol for models that must be fitted."
)
# fit always fits: what each protocol is.
FitProtocolOption = _option(
    str, "--protocol", metavar="PROTOCOL", help="hist1024 (the cohort's protocol) or exact (order statistics)."
)
TrimOption = _option(str, "--trim", metavar="TRIM", help="Trim for per-kind medians: mid80 (paper), mid90 or full.")
CenterOption = _option(
    bool,
    "--center",
    help="Fit |w - mean| of each matrix (the Weibull paper's App. A.1 text) instead of |w| (its "
    "library and the cohort).",
)
IncludeOption = _option(
    list[str] | None, "--include", metavar="GLOB", help="Only tensors matching this glob (repeatable)."
)
ExcludeOption = _option(
    list[str] | None, "--exclude", metavar="GLOB", help="Skip tensors matching this glob (repeatable)."
)
# fit names one row; sweep names a run's rows, by default after the repo or the run's folder.
FitNameOption = _option(str | None, "--name", metavar="ID", help="Model id to record (default: from the path or repo).")
SweepNameOption = _option(
    str | None, "--name", metavar="ID", help="Model id for the rows (default: repo id or folder name)."
)
LrOption = _option(float | None, "--lr", metavar="LR", help="Peak learning rate (for T/tau).")
WeightDecayOption = _option(float | None, "--weight-decay", metavar="WD", help="AdamW weight decay (for T/tau).")
# Not --steps: on `sweep`, --steps picks checkpoints to fit.
TrainStepsOption = _option(float | None, "--train-steps", metavar="STEPS", help="Training steps done (for T/tau).")
PresetOption = _option(str | None, "--preset", metavar="NAME", help="Recipe preset, e.g. pythia-410m (for T/tau).")
SpectrumOption = _option(
    bool,
    "--spectrum",
    help="Also take each matrix's spectrum (WeightWatcher's alpha and metrics; a second pass over the "
    "matrices, 2·m·n·min(m,n) flops each: docs/spectrum.md).",
)
FarmsOption = _option(
    bool, "--farms", help="With the spectrum, FARMS' aspect-ratio-corrected alpha (~100 s per large matrix)."
)

# --- where the work runs: the executor says what its tasks are, which differs by command ---------------------

FitExecutorOption = _option(
    str,
    "--executor",
    metavar="EXECUTOR",
    help="local (this machine) or ray (the chunks read and reduced by tasks on an existing Ray cluster).",
)
DiffExecutorOption = _option(
    str,
    "--executor",
    metavar="EXECUTOR",
    help="local (this machine) or ray (tensor pairs compared by tasks on an existing Ray cluster).",
)
SweepExecutorOption = _option(
    str, "--executor", metavar="EXECUTOR", help="local (processes) or ray (an existing Ray cluster)."
)
RayAddressOption = _option(
    str | None, "--ray-address", metavar="ADDRESS", help="Ray cluster address (default: RAY_ADDRESS)."
)
NodeProgressOption = _option(
    bool,
    "--node-progress",
    help="With --executor ray: a line on stderr each time a task ends: its node's tasks and bytes so far.",
)

# --- what is saved, by command: fit's row; the rows compare fitted on the way; the row check fitted (it fits its
# model every time, never reading one from the database); the row report fitted when it had none to read;
# diff's row (a diff, in diffs/). Whether by default is the command's (check: not) -------------------------------

FitSaveOption = _option(bool, "--save/--no-save", help="Write the row into the database folder.")
CompareSaveOption = _option(bool, "--save/--no-save", help="Save the rows of models fitted on the way in the database.")
CheckSaveOption = _option(bool, "--save/--no-save", help="Save the fitted row in the database.")
ReportSaveOption = _option(bool, "--save/--no-save", help="Save a freshly fitted row in the database.")
DiffSaveOption = _option(bool, "--save/--no-save", help="Write the diff row into the database folder.")

# --- what is drawn: plots and pages ------------------------------------------------------------------------

# diff, report and trajectory draw with matplotlib, the [plot] extra.
PlotOption = _option(
    Path | None, "--plot", metavar="DIR", help="Write PNG plots into this folder (needs the [plot] extra)."
)
# The HTML file is a diff's page or a model's health report.
DiffHtmlOption = _option(Path | None, "--html", metavar="FILE", help="Write a self-contained HTML page here.")
ReportHtmlOption = _option(Path | None, "--html", metavar="FILE", help="Write a self-contained HTML report here.")

# --- check ---------------------------------------------------------------------------------------------------

BaselineOption = _option(
    Path, "--baseline", metavar="ROW", help="The baseline row file (weightdiag.row/1 JSON).", show_default=False
)
TolKOption = _option(float, "--tol-k", metavar="TOL", help="Allowed |k - k_baseline| (absolute).")
TolLambdaOption = _option(float, "--tol-lambda", metavar="TOL", help="Allowed |λ/λ_baseline - 1|.")
JunitOption = _option(Path | None, "--junit", metavar="FILE", help="Also write a JUnit XML report here.")
# Not --all: on `sweep`, --all means every revision.
ShowPassingOption = _option(bool, "--show-passing", help="List passing matrices too.")

# --- diff ----------------------------------------------------------------------------------------------------

FailAboveOption = _option(
    float | None,
    "--fail-above",
    metavar="CHANGE",
    help="CI gate: exit 1 if a compared tensor's relative change exceeds this (0: any change).",
)
BlocksOption = _option(
    str | None, "--blocks", metavar="LIST", help="Gate only these blocks, e.g. 0-3,7 (with --fail-above)."
)
SketchOption = _option(int, "--sketch", metavar="K", help="Range sketch size for matrices over 1024 columns.")
# Not fit's --spectrum (a second pass, off by default): diff's spectrum of each ΔW, on by default.
DiffSpectrumOption = _option(bool, "--spectrum/--no-spectrum", help="Singular values and rank90 of each ΔW.")
# Not --all: on `sweep`, --all means every revision. `diff --all`, its name before, still works (hidden).
AllMatricesOption = _option(bool, "--all-matrices", help="List every matrix, not the 15 that changed most.")
AllMatricesAliasOption = _option(bool, "--all", hidden=True)

# --- sweep ---------------------------------------------------------------------------------------------------

RevisionsOption = _option(
    str | None, "--revisions", metavar="REV,...", help="Comma-separated revisions (branch / folder names)."
)
StepsOption = _option(
    str | None,
    "--steps",
    metavar="log:N|STEP,...",
    help="Which checkpoints: N log-spaced steps (default log:14) or a list of steps.",
)
EveryRevisionOption = _option(bool, "--all", help="Every revision.")
GlobOption = _option(
    str | None, "--glob", metavar="GLOB", help="Local runs: glob of checkpoint folders (default step*, ...)."
)
JobsOption = _option(int, "--jobs", metavar="N", help="Local worker processes.")

# --- trajectory ----------------------------------------------------------------------------------------------

ScheduleOption = _option(
    str, "--schedule", metavar="SCHEDULE", help="constant (T x eta x wd) or cosine (warmup + cosine decay)."
)
TotalOption = _option(float | None, "--total", metavar="STEPS", help="Cosine: total training steps.")
WarmupOption = _option(float, "--warmup", metavar="STEPS", help="Cosine: warm-up steps.")
MinLrRatioOption = _option(float, "--min-lr-ratio", metavar="RATIO", help="Cosine: final learning rate / peak.")
# Not the protocol to fit with: which of a run's rows to read.
TrajectoryProtocolOption = _option(
    str | None, "--protocol", metavar="PROTOCOL", help="Use rows fitted with this protocol (default: hist1024 if any)."
)

# --- report; lineage ------------------------------------------------------------------------------------------

TopOption = _option(int, "--top", min=1, metavar="N", help="How many super-weight candidates to list.")
HistOption = _option(
    list[str] | None, "--hist", metavar="GLOB", help="Tensor name or glob to draw a |w| histogram of (repeatable)."
)

AgainstOption = _option(list[str] | None, "--against", metavar="REF", help="Row id, row file, folder or Hub id.")
DeclaredOption = _option(bool, "--declared", help="Check the base_model the model card names (not --against).")

# --- db ------------------------------------------------------------------------------------------------------

FittedOption = _option(bool, "--fitted", help="Only fitted rows (no cohort entries).")
GcAllOption = _option(bool, "--all", help="Also the journals of interrupted fits (their next fit starts over).")
DryRunOption = _option(bool, "--dry-run", help="Only list what would be removed.")
FormatOption = _option(
    str, "--format", metavar="FORMAT", help="csv, jsonl or parquet (with --output; the [pandas] extra)."
)
PerMatrixOption = _option(bool, "--per-matrix", help="One record per matrix of every fitted row (docs/tables.md).")
PlanOption = _option(bool, "--plan", help="Only list what the fit would read and skip, from the headers; fit nothing.")
OutputOption = _option(str | None, "--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
ENERGY_HELP = "--export-lora: ||ΔW||² kept (default: ΔW's own rank where it is exactly low-rank, else 0.9)."


# --- the table: the options by name, with their defaults; what @takes("db", "device", ...) names (takes.py) ---


class Entry(NamedTuple):
    """An option as commands take it: its alias (type, flags, help), its default and, for a FitOptions field,
    the field it sets (Given.fit_options)."""

    alias: Any
    default: Any
    field: str | None = None


REQUIRED = Parameter.empty  # the default of an option that must be given


def _fit(alias: Any, field: str) -> Entry:
    """A FitOptions field's option, its default the field's own (FitOptions().protocol is Measurement's)."""
    return Entry(alias, getattr(FitOptions(), field), field)


# Each option by its parameter name (what a command reads, given.device), followed by "@" and a command where
# commands take variants of it (the aliases above say how they differ). An option is a FitOptions field only where it
# sets one: sweep's --name, --executor and --ray-address say how the sweep runs, not how its fits do.
OPTIONS: dict[str, Entry] = {
    "db": Entry(DbOption, None),
    "quiet": Entry(QuietOption, False),
    "as_json": Entry(JsonOption, False),
    # how a model is read and fitted
    "connections": _fit(ConnectionsOption, "connections"),
    "revision": Entry(RevisionOption, None),
    "revision@diff": Entry(DiffRevisionOption, None),
    "token": Entry(TokenOption, None),
    "download": Entry(DownloadOption, False),
    "cache_dir": Entry(CacheDirOption, None),  # takes.py: settings.hf_cache_given for the command's run
    "device": _fit(DeviceOption, "device"),
    "device@fit": _fit(FitDeviceOption, "device"),
    "device@diff": Entry(DiffDeviceOption, "auto"),
    "protocol": _fit(ProtocolOption, "protocol"),
    "protocol@fit": _fit(FitProtocolOption, "protocol"),
    "protocol@trajectory": Entry(TrajectoryProtocolOption, None),
    "trim": _fit(TrimOption, "trim"),
    "center": _fit(CenterOption, "center"),
    "include": Entry(IncludeOption, None, "include"),  # None: no glob given (FitOptions reads it as ())
    "exclude": Entry(ExcludeOption, None, "exclude"),
    "name@fit": _fit(FitNameOption, "model_id"),
    "name@sweep": Entry(SweepNameOption, None),
    "lr": _fit(LrOption, "lr"),
    "weight_decay": _fit(WeightDecayOption, "weight_decay"),
    "train_steps": _fit(TrainStepsOption, "steps"),
    "preset": _fit(PresetOption, "preset"),
    "spectrum": _fit(SpectrumOption, "spectrum"),
    "spectrum@diff": Entry(DiffSpectrumOption, True),
    "farms": _fit(FarmsOption, "farms"),
    # where the work runs
    "executor@fit": _fit(FitExecutorOption, "executor"),
    "executor@diff": Entry(DiffExecutorOption, "local"),
    "executor@sweep": Entry(SweepExecutorOption, "local"),
    "ray_address": Entry(RayAddressOption, None),
    "ray_address@fit": _fit(RayAddressOption, "ray_address"),
    "node_progress": Entry(NodeProgressOption, False),
    # what is saved (check: not by default)
    "save@fit": Entry(FitSaveOption, True),
    "save@compare": Entry(CompareSaveOption, True),
    "save@check": Entry(CheckSaveOption, False),
    "save@report": Entry(ReportSaveOption, True),
    "save@diff": Entry(DiffSaveOption, True),
    # what is drawn
    "plot": Entry(PlotOption, None),
    "html@diff": Entry(DiffHtmlOption, None),
    "export_lora": Entry(_option(Path | None, "--export-lora", metavar="OUT", help="Write ΔW as a PEFT LoRA."), None),
    "rank": Entry(_option(int | None, "--rank", metavar="R", help="--export-lora: this rank per module."), None),
    "energy": Entry(_option(float | None, "--energy", metavar="E", help=ENERGY_HELP), None),
    "html@report": Entry(ReportHtmlOption, None),
    # check
    "baseline": Entry(BaselineOption, REQUIRED),
    "tol_k": Entry(TolKOption, 0.002),
    "tol_lambda": Entry(TolLambdaOption, 0.01),
    "junit": Entry(JunitOption, None),
    "show_passing": Entry(ShowPassingOption, False),
    # diff
    "fail_above": Entry(FailAboveOption, None),
    "blocks": Entry(BlocksOption, None),
    "sketch": Entry(SketchOption, 128),
    "all_matrices": Entry(AllMatricesOption, False),
    "all_matrices_alias": Entry(AllMatricesAliasOption, False),
    "parent": Entry(
        _option(list[str] | None, "--parent", metavar="MODEL", help="A model TUNED may merge (repeatable)."), None
    ),
    # sweep
    "revisions": Entry(RevisionsOption, None),
    "steps": Entry(StepsOption, None),
    "every@sweep": Entry(EveryRevisionOption, False),
    "glob": Entry(GlobOption, None),
    "jobs": Entry(JobsOption, 1),
    # trajectory
    "schedule": Entry(ScheduleOption, "constant"),
    "total": Entry(TotalOption, None),
    "warmup": Entry(WarmupOption, 0),  # a step count: `[default: 0]`, not typer's `0.0` for the float (issue 42)
    "min_lr_ratio": Entry(MinLrRatioOption, 0.1),
    # report
    "top": Entry(TopOption, 10),
    "hist": Entry(HistOption, None),
    "against": Entry(AgainstOption, None),  # lineage
    "declared": Entry(DeclaredOption, False),
    "save@lineage": Entry(CompareSaveOption, False),  # lineage saves as compare does, but not by default
    # db
    "fitted_only": Entry(FittedOption, False),
    "every@gc": Entry(GcAllOption, False),
    "dry_run": Entry(DryRunOption, False),
    "fmt": Entry(FormatOption, "csv"),
    "per_matrix": Entry(PerMatrixOption, False),
    "plan": Entry(PlanOption, False),
    "output": Entry(OutputOption, None),
}

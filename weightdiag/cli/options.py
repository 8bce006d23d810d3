"""Every option of the command line, declared once: an `Annotated` alias with its flags, metavar and one help
text, used by every command that takes it (the default stays in the command's signature).

Where two commands' flags of one name differ in their help, the difference says something about the command
(what it saves, where its work runs, whether it always fits): those are two aliases, each with a comment.
"""

# No `from __future__ import annotations` in this package: Typer would then eval every command's
# annotations from strings at each start-up (~15 ms for all commands); real objects cost nothing.

import sys
from pathlib import Path
from typing import Annotated

import typer

from .. import __version__


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


# --- every command -----------------------------------------------------------------------------------------

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
QuietOption = Annotated[
    bool, typer.Option("--quiet", "-q", help="No progress bar and no notes on stderr (errors still print).")
]
# What --json and -q do to a command's output is decided in one place: output._emit.
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]

# --- how a model is read and fitted (fit, compare, check, report, sweep; diff reads) ---------------------------

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
# fit, compare, check, report: MODEL --revision REV is MODEL@REV (a Hub id's, or a fitted model id's in the database).
RevisionOption = Annotated[
    str | None, typer.Option("--revision", metavar="REV", help="Hub branch, tag or commit (same as ORG/NAME@REV).")
]
TokenOption = Annotated[
    str | None, typer.Option("--token", metavar="TOKEN", help="Hub token (default: HF_TOKEN or `hf auth login`).")
]
DownloadOption = Annotated[
    bool, typer.Option("--download", help="Fetch whole shards into the HF cache instead of streaming.")
]
# compare, check, report, sweep fit a model only when its row is not in the database already.
DeviceOption = Annotated[
    str,
    typer.Option(
        "--device", metavar="DEVICE", help="Where to reduce when a model must be fitted: auto, cpu, cuda, cuda:N."
    ),
]
# fit always reduces.
FitDeviceOption = Annotated[
    str, typer.Option("--device", metavar="DEVICE", help="Where to reduce: auto, cpu, cuda, cuda:N.")
]
# diff reduces nothing: the device takes its spectrum's sketch, and auto is the CPU there.
DiffDeviceOption = Annotated[
    str,
    typer.Option(
        "--device", metavar="DEVICE", help="Where the spectrum's sketch runs: auto (the CPU), cpu, cuda, cuda:N."
    ),
]
# compare, sweep, report: the protocol of the models that must be fitted (rows in the database are read as they are).
ProtocolOption = Annotated[
    str,
    typer.Option(
        "--protocol", metavar="PROTOCOL", help="hist1024 or exact: the protocol for models that must be fitted."
    ),
]
# fit always fits: what each protocol is.
FitProtocolOption = Annotated[
    str,
    typer.Option(
        "--protocol", metavar="PROTOCOL", help="hist1024 (the cohort's protocol) or exact (order statistics)."
    ),
]
TrimOption = Annotated[
    str, typer.Option("--trim", metavar="TRIM", help="Trim for per-kind medians: mid80 (paper), mid90 or full.")
]
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
# fit names one row; sweep names a run's rows, by default after the repo or the run's folder.
FitNameOption = Annotated[
    str | None, typer.Option("--name", metavar="ID", help="Model id to record (default: from the path or repo).")
]
SweepNameOption = Annotated[
    str | None,
    typer.Option("--name", metavar="ID", help="Model id for the rows (default: repo id or folder name)."),
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
SpectrumOption = Annotated[
    bool,
    typer.Option(
        "--spectrum",
        help="Also take each matrix's spectrum (WeightWatcher's alpha and metrics; a second pass over the "
        "matrices, 2·m·n·min(m,n) flops each: README, 'The spectrum').",
    ),
]
FarmsOption = Annotated[
    bool,
    typer.Option("--farms", help="With the spectrum, FARMS' aspect-ratio-corrected alpha (~100 s per large matrix)."),
]

# --- where the work runs: the executor says what its tasks are, which differs by command ---------------------

FitExecutorOption = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="EXECUTOR",
        help="local (this machine) or ray (the chunks read and reduced by tasks on an existing Ray cluster).",
    ),
]
DiffExecutorOption = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="EXECUTOR",
        help="local (this machine) or ray (tensor pairs compared by tasks on an existing Ray cluster).",
    ),
]
SweepExecutorOption = Annotated[
    str, typer.Option("--executor", metavar="EXECUTOR", help="local (processes) or ray (an existing Ray cluster).")
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

# --- what is saved, by command: fit's row; the rows compare fitted on the way; the row check fitted (it fits its
# model every time, never reading one from the database); the row report fitted when it had none to read;
# diff's row (a diff, in diffs/). Whether by default is the command's (check: not) -------------------------------

FitSaveOption = Annotated[bool, typer.Option("--save/--no-save", help="Write the row into the database folder.")]
CompareSaveOption = Annotated[
    bool, typer.Option("--save/--no-save", help="Save the rows of models fitted on the way in the database.")
]
CheckSaveOption = Annotated[bool, typer.Option("--save/--no-save", help="Save the fitted row in the database.")]
ReportSaveOption = Annotated[bool, typer.Option("--save/--no-save", help="Save a freshly fitted row in the database.")]
DiffSaveOption = Annotated[bool, typer.Option("--save/--no-save", help="Write the diff row into the database folder.")]

# --- what is drawn: plots and pages ------------------------------------------------------------------------

# diff, report and trajectory draw with matplotlib, the [plot] extra.
PlotOption = Annotated[
    Path | None,
    typer.Option("--plot", metavar="DIR", help="Write PNG plots into this folder (needs the [plot] extra)."),
]
# The HTML file is a diff's page or a model's health report.
DiffHtmlOption = Annotated[
    Path | None, typer.Option("--html", metavar="FILE", help="Write a self-contained HTML page here.")
]
ReportHtmlOption = Annotated[
    Path | None, typer.Option("--html", metavar="FILE", help="Write a self-contained HTML report here.")
]

# --- check ---------------------------------------------------------------------------------------------------

BaselineOption = Annotated[
    Path,
    typer.Option(
        "--baseline", metavar="ROW", help="The baseline row file (weightdiag.row/1 JSON).", show_default=False
    ),
]
TolKOption = Annotated[float, typer.Option("--tol-k", metavar="TOL", help="Allowed |k - k_baseline| (absolute).")]
TolLambdaOption = Annotated[float, typer.Option("--tol-lambda", metavar="TOL", help="Allowed |λ/λ_baseline - 1|.")]
JunitOption = Annotated[
    Path | None, typer.Option("--junit", metavar="FILE", help="Also write a JUnit XML report here.")
]
# Not --all: on `sweep`, --all means every revision.
ShowPassingOption = Annotated[bool, typer.Option("--show-passing", help="List passing matrices too.")]

# --- diff ----------------------------------------------------------------------------------------------------

FailAboveOption = Annotated[
    float | None,
    typer.Option(
        "--fail-above",
        metavar="CHANGE",
        help="CI gate: exit 1 if a compared tensor's relative change exceeds this (0: any change).",
    ),
]
BlocksOption = Annotated[
    str | None,
    typer.Option("--blocks", metavar="LIST", help="Gate only these blocks, e.g. 0-3,7 (with --fail-above)."),
]
SketchOption = Annotated[
    int, typer.Option("--sketch", metavar="K", help="Range sketch size for matrices over 1024 columns (default 128).")
]
# Not fit's --spectrum (a second pass, off by default): diff's spectrum of each ΔW, on by default.
DiffSpectrumOption = Annotated[
    bool, typer.Option("--spectrum/--no-spectrum", help="Singular values and rank90 of each ΔW.")
]
# Not --all: on `sweep`, --all means every revision. `diff --all`, its name before, still works (hidden).
AllMatricesOption = Annotated[
    bool, typer.Option("--all-matrices", help="List every matrix, not the 15 that changed most.")
]
AllMatricesAliasOption = Annotated[bool, typer.Option("--all", hidden=True)]

# --- sweep ---------------------------------------------------------------------------------------------------

RevisionsOption = Annotated[
    str | None,
    typer.Option("--revisions", metavar="REV,...", help="Comma-separated revisions (branch / folder names)."),
]
StepsOption = Annotated[
    str | None,
    typer.Option(
        "--steps",
        metavar="log:N|STEP,...",
        help="Which checkpoints: N log-spaced steps (default log:14) or a list of steps.",
    ),
]
EveryRevisionOption = Annotated[bool, typer.Option("--all", help="Every revision.")]
GlobOption = Annotated[
    str | None,
    typer.Option("--glob", metavar="GLOB", help="Local runs: glob of checkpoint folders (default step*, ...)."),
]
JobsOption = Annotated[int, typer.Option("--jobs", metavar="N", help="Local worker processes.")]

# --- trajectory ----------------------------------------------------------------------------------------------

ScheduleOption = Annotated[
    str,
    typer.Option("--schedule", metavar="SCHEDULE", help="constant (T x eta x wd) or cosine (warmup + cosine decay)."),
]
TotalOption = Annotated[float | None, typer.Option("--total", metavar="STEPS", help="Cosine: total training steps.")]
WarmupOption = Annotated[float, typer.Option("--warmup", metavar="STEPS", help="Cosine: warm-up steps.")]
MinLrRatioOption = Annotated[
    float, typer.Option("--min-lr-ratio", metavar="RATIO", help="Cosine: final learning rate / peak.")
]
# Not the protocol to fit with: which of a run's rows to read.
TrajectoryProtocolOption = Annotated[
    str | None,
    typer.Option(
        "--protocol", metavar="PROTOCOL", help="Use rows fitted with this protocol (default: hist1024 if any)."
    ),
]

# --- report --------------------------------------------------------------------------------------------------

TopOption = Annotated[int, typer.Option("--top", min=1, metavar="N", help="How many super-weight candidates to list.")]
HistOption = Annotated[
    list[str] | None,
    typer.Option("--hist", metavar="GLOB", help="Tensor name or glob to draw a |w| histogram of (repeatable)."),
]

# --- db ------------------------------------------------------------------------------------------------------

FittedOption = Annotated[bool, typer.Option("--fitted", help="Only fitted rows (no cohort entries).")]
GcAllOption = Annotated[
    bool, typer.Option("--all", help="Also the journals of interrupted fits (their next fit starts over).")
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Only list what would be removed.")]
FormatOption = Annotated[str, typer.Option("--format", metavar="FORMAT", help="csv or jsonl.")]
OutputOption = Annotated[
    Path | None, typer.Option("--output", metavar="FILE", help="Write here (atomically) instead of stdout.")
]

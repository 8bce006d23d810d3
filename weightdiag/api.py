"""The Python API: one function per CLI command, each returning what the command renders.

    from weightdiag import api
    row = api.fit_model("path/to/model")                 # or "EleutherAI/pythia-70m@step3000"
    path = api.save_row(row)                             # DATABASE/rows/<model>@<rev>.json
    fitted = api.fit("path/to/model")                    # fit and save: fitted.row, fitted.path
    reports = api.compare(["path/to/model", "pythia-410m"])
    result = api.check("path/to/model", "baseline.json")
    changes = api.diff("base/model", "tuned/model")        # DiffResult: .matrices, .findings, .to_json()
    report = api.report("path/to/model")                 # report.result, .how, .notes
    run = api.sweep("EleutherAI/pythia-70m", steps="log:6")
    summary = api.trajectory("EleutherAI/pythia-70m")
    records = api.list_rows(); row = api.show_row("qwen3-8b"); text = api.export_rows("csv")

Rows are plain dicts typed by weightdiag.record.schema (schema in docs/row-schema.md); what compare, check,
report, trajectory and list_rows return, by weightdiag.diagnose.results (TypedDicts). Errors are
weightdiag.errors types (each with its exit code); the CLI only parses, calls these and renders.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .database.store import ROWS_DIR, RowNotFoundError, default_db_dir, natural_key
from .delta.result import DiffOptions, DiffResult
from .diagnose.results import CheckResult, CompareReport, FlatRecord, HealthReport, TrajectoryResult
from .errors import DatabaseError, OptionError, OutputError, RowUseError, note_kept, param
from .execution import choose_executor
from .progress import Progress
from .record.result import FitResult
from .record.schema import Row, RowError
from .record.table import DataFrame
from .run.fitting import check_options, fit_and_save_model, fit_model, fit_path, fit_plan, resolve_row, save_row
from .run.options import FitOptions
from .source.open import is_hub_id, open_model, split_revision, with_revision

if TYPE_CHECKING:  # the types only: the plan and sweep modules are imported when used
    from .run.plan import Plan
    from .run.sweep import Outcome

# The building blocks, for scripts: fitting.* and source.open.* under one name, and the result types.
__all__ = [
    "EXPORT_FORMATS",
    "SCHEDULES",
    "CheckResult",
    "CompareReport",
    "DiffOptions",
    "DiffResult",
    "FitOptions",
    "Fitted",
    "FlatRecord",
    "HealthReport",
    "Report",
    "SweepRun",
    "TrajectoryResult",
    "check",
    "check_options",
    "compare",
    "database_frame",
    "diff",
    "export_rows",
    "fit",
    "fit_model",
    "fit_path",
    "fit_plan",
    "is_hub_id",
    "list_rows",
    "matrices_frame",
    "open_model",
    "plan",
    "report",
    "resolve_row",
    "save_row",
    "show_row",
    "split_revision",
    "sweep",
    "trajectory",
]

# ---------------------------------------------------------------------------------------------
# One function per command.

RowNote = Callable[[str, Row, str], None]  # (spec, row, how) after each row is resolved


def _plain(document: Mapping[str, Any]) -> dict[str, Any]:
    """A row (or report) as diagnose/ and run.histograms take it: their functions read rows as plain dicts,
    not yet as record.schema's Row. The one place where the typed documents cross into them (no copy)."""
    return cast("dict[str, Any]", document)


@dataclass
class Fitted:
    """What `fit` returns: the row (a dict typed by weightdiag.record.schema.Row, docs/row-schema.md) and where it
    was written."""

    row: Row
    path: Path | None  # where the row was written; None with save=False

    def matrices_frame(self) -> DataFrame:
        """The row's matrix records as a pandas DataFrame, one line per matrix and per part of a fused one
        (weightdiag.record.table: the spectral columns under WeightWatcher's names, the Weibull ones the row's).

        Raises:
            MissingDependencyError: pandas is not installed (exit code 2): errors.PANDAS_INSTALL says how.
        """
        from .record.table import matrices_frame

        return matrices_frame(self.row)

    @cached_property
    def fit_result(self) -> FitResult:
        """The row as a typed, frozen FitResult (the model's identity, per-kind summaries, `.matrices`)."""
        return FitResult.from_json(self.row)

    def to_json(self) -> Row:
        """The row, as written to DATABASE/rows/ (read one back with weightdiag.read_row)."""
        return self.row


def fit(
    spec: str,
    options: FitOptions | None = None,
    progress: Progress | None = None,
    *,
    db_dir: str | Path | None = None,
    save: bool = True,
    revision: str | None = None,
    token: str | None = None,
    download: bool = False,
) -> Fitted:
    """`weightdiag fit`: fit a model and (with save) write its row; the database is checked before the fit.

    Args:
        spec: a .safetensors/.gguf/.bin file, a model folder, or a Hub id ORG/NAME[@REV].
        options: what is measured and how (FitOptions(protocol=..., spectrum=True, include=[...], ...)).
        progress: told what the fit does (weightdiag.progress.Progress); None: silent.
        db_dir: the database folder (default: WEIGHTDIAG_DB, ./DATABASE, the per-user folder).
        save: write the row into db_dir/rows/.
        revision: the Hub revision (or give spec as ORG/NAME@REV).
        token: a Hugging Face token (default: the one huggingface_hub finds).
        download: fetch whole shards into the HF cache instead of streaming byte ranges.

    Returns:
        Fitted: `.row` (the row dict, docs/row-schema.md), `.path` (where it was written, None without save),
        `.matrices_frame()` (a pandas DataFrame, one line per matrix).

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
    """
    options = options or FitOptions()
    check_options(options)
    db = Path(db_dir) if db_dir else default_db_dir()
    # fitting.fit_model without save: the database is checked first of all, even before the model is looked for
    row, path = fit_and_save_model(
        spec, options, progress, db if save else None, revision=revision, token=token, download=download, names_db=db
    )
    return Fitted(row, path)


def compare(
    specs: Sequence[str] = (),
    *,
    db_dir: str | Path | None = None,
    options: FitOptions | None = None,
    progress: Progress | None = None,
    token: str | None = None,
    save: bool = True,
    on_row: RowNote | None = None,
    revision: str | None = None,
) -> list[CompareReport]:
    """`weightdiag compare`: a comparison with the cohort per model (default: every fitted row); models
    fitted on the way are saved unless save=False. `revision`: of the one model given (as MODEL@REV).

    Args:
        specs: models (paths, Hub ids, row files, database or cohort ids); none: every fitted row of db_dir.
        db_dir: the database folder; options, progress, token: as for `fit`, for models fitted on the way.
        save: write the rows of models fitted on the way.
        on_row: called (spec, row, how) as each model's row is resolved (how: fitted, database, row file, cohort).
        revision: the revision of the one model given.

    Returns:
        list[CompareReport]: one comparison with the cohort per model (weightdiag.diagnose.results).

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
        RowNotFoundError: (exit code 2, a BadInputError) a name that is no row, model or cohort entry.
    """
    from .diagnose.compare import compare as compare_row

    options = options or FitOptions()
    check_options(options)
    if revision is not None:
        if len(specs) != 1:
            raise OptionError(
                f"{param('revision')} names the revision of one model; for several, give each as ORG/NAME@REV",
                param="revision",
            )
        specs = [with_revision(specs[0], revision)]
    if not specs:
        return list(compare_database(db_dir))
    rows = []
    for spec in specs:
        row, how = resolve_row(spec, db_dir, options, progress, token=token, save=save)
        if on_row:
            on_row(spec, row, how)
        rows.append(row)
    # alpha is compared with the database's other rows that have spectra (the cohort's have none)
    wanted = any(row.get("spectrum_kinds") for row in rows)
    peers = spectrum_peers(Path(db_dir) if db_dir else default_db_dir()) if wanted else []
    db = Path(db_dir) if db_dir else None
    out = []
    for row in rows:
        report = compare_row(_plain(row), [(i, p) for i, p in peers if not _same_row(p, row)])
        out.append(_with_relatives(report, _lineage_relatives(row, db)))
    return out


RELATIVES_MAX_ROWS = 100  # compare over the whole database judges every pair: beyond, the relatives are not named


def _relative_line(found: dict[str, Any]) -> str:
    from .diagnose.relatives import describe

    said = describe(found)
    return f"appears to be {said} in the database (lineage)" if found["copy"] else f"{said} in the database (lineage)"


def _lineage_relatives(row: Mapping[str, Any], db: Path | None) -> dict[str, Any]:
    """The database's rows `row` derives from (diagnose.relatives): `compare` names them beside its nearest by
    statistics, `report` says when it is a copy. One pass of lineage's over the index (no row parsed)."""
    from .diagnose.lineage import Fingerprint
    from .diagnose.lineage_batch import judge_packed
    from .diagnose.relatives import relatives

    cand = Fingerprint.of(_plain(row))
    if cand is None:
        return {"relatives": [], "judged": 0, "note": "its row has no lineage fingerprint: a refit adds it"}
    judgements = judge_packed(cand, _database_refs(db, row))
    judged = sum(j.verdict != "not judged" for j in judgements)
    return {"relatives": relatives(judgements), "judged": judged, "note": None}


def _with_relatives(report: CompareReport, lineage: dict[str, Any]) -> CompareReport:
    from .diagnose.relatives import describe

    report["lineage"] = lineage
    if lineage["relatives"]:
        report["findings"].append(f"nearest relative by lineage: {describe(lineage['relatives'][0])}")
    return report


def compare_database(db_dir: str | Path | None = None) -> Iterator[CompareReport]:
    """`weightdiag compare` without a model: each fitted row's comparison in turn, one row read at a time
    (a database of 20,000 rows held whole took gigabytes)."""
    from .database.store import iter_rows, iter_summaries, require_database
    from .diagnose.compare import compare as compare_row

    db = Path(db_dir) if db_dir else None
    require_database(db)
    peers: list[tuple[str, Any]] | None = None
    compared = 0
    many = sum(1 for _ in iter_summaries(db)) > RELATIVES_MAX_ROWS
    for _, row in iter_rows(db):
        if row.get("spectrum_kinds") and peers is None:  # alpha is compared with the other rows that have spectra
            peers = spectrum_peers(db or default_db_dir())
        report = compare_row(_plain(row), [(i, p) for i, p in peers or [] if not _same_row(p, row)])
        if many:  # every row against every other: N^2 judgements
            note = f"not judged over more than {RELATIVES_MAX_ROWS} rows: `weightdiag compare MODEL` names them"
            yield _with_relatives(report, {"relatives": [], "judged": 0, "note": note})
        else:
            yield _with_relatives(report, _lineage_relatives(row, db))
        compared += 1
    if not compared:
        raise DatabaseError(
            f"no fitted rows in the database {db or default_db_dir()}; give a model to compare (weightdiag compare "
            "PATH) or the database folder that holds your rows (--db DIR)",
            folder=(db or default_db_dir()) / ROWS_DIR,
        )


def spectrum_peers(db: Path) -> list[tuple[str, Any]]:
    """(id, what of its summary alpha is compared with) of the database's rows that have spectra: what `compare`
    reads alpha against. Only the fields used are kept: thousands of whole summaries would not be."""
    from .database.store import iter_summaries

    return [
        (_row_id(s), {"model": s["model"], "created": s.get("created"), "spectrum_kinds": s["spectrum_kinds"]})
        for _, s in iter_summaries(db, on_skip=lambda _: None)
        if s.get("spectrum_kinds")
    ]


def _row_id(row: Mapping[str, Any]) -> str:
    model = row["model"]
    return str(model["id"]) + (f"@{model['revision']}" if model.get("revision") else "")


def _same_row(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same fit of the same model (a row and its own summary)."""
    keys = ("id", "revision", "fingerprint", "commit")
    return all(a["model"].get(k) == b["model"].get(k) for k in keys) and a.get("created") == b.get("created")


def check(
    spec: str,
    baseline: str | Path,
    *,
    tol_k: float = 0.002,
    tol_lambda: float = 0.01,
    junit: str | Path | None = None,
    db_dir: str | Path | None = None,
    device: str = "auto",
    connections: int = 8,
    progress: Progress | None = None,
    token: str | None = None,
    save: bool = False,
    on_row: RowNote | None = None,
    revision: str | None = None,
) -> CheckResult:
    """`weightdiag check`: compare a model's fits with a baseline row; result["passed"] says whether every
    matrix stayed within |dk| <= tol_k and |dlambda/lambda| <= tol_lambda (the fit uses the baseline's protocol).

    Args:
        spec: the model to check (as for `fit`); baseline: a row file (JSON) to compare it with.
        tol_k, tol_lambda: the tolerances on k (absolute) and lambda (relative).
        junit: also write a JUnit XML report there. db_dir, device, connections, progress, token, revision: as for
            `fit`; save: write the new row (default False). on_row: as for `compare`.

    Returns:
        CheckResult: `result["passed"]`, and per matrix what moved (weightdiag.diagnose.results). A regression is a
        result (the command line exits 1 for it), not an exception.

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
        OutputError: (exit code 2) junit cannot be written.
    """
    from .database.store import load_row, write_text_atomic
    from .diagnose.check import check as check_rows
    from .diagnose.check import junit_xml

    for name, tol in (("tol_k", tol_k), ("tol_lambda", tol_lambda)):
        if not (math.isfinite(tol) and tol >= 0):
            raise OptionError(f"{param(name)} {tol}: give a finite tolerance >= 0", param=name)
    check_options(FitOptions(connections=connections))  # before reading anything, even a row file
    spec = with_revision(spec, revision)  # --revision REV: spec@REV, as fit takes it
    junit_path = Path(junit) if junit is not None else None
    if junit_path is not None and junit_path.is_dir():  # before the fit: a folder cannot take the report
        raise OutputError(
            f"--junit {junit_path}: is a folder; give a file path such as {junit_path / 'weightdiag.xml'}",
            path=junit_path,
        )
    base = load_row(baseline)
    options = FitOptions(protocol=base["protocol"]["name"], device=device, connections=connections)
    row, how = resolve_row(spec, db_dir, options, progress, token=token, save=save, reuse=False)
    if on_row:
        on_row(spec, row, how)
    result = check_rows(_plain(row), _plain(base), tol_k, tol_lambda)
    if junit_path is not None:
        try:
            junit_path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(junit_path, junit_xml(result))
        except OSError as exc:  # exit 2, not 1: 1 means the check found a regression
            raise OutputError(
                f"--junit {junit_path}: cannot write it ({exc.strerror or type(exc).__name__}); "
                "give a writable file path",
                path=junit_path,
            ) from None
    return result


@dataclass
class Report:
    result: HealthReport  # diagnose.health.health_report's document (model.how added; plots and html when written)
    how: str  # where the row came from: fitted, database, row file, cohort
    row: Row  # the row the report was made from
    notes: list[str] = field(default_factory=list)  # what could not be drawn, and why

    @cached_property
    def fit_result(self) -> FitResult:
        """The row the report was made from, as a typed, frozen FitResult."""
        return FitResult.from_json(self.row)


def report(
    spec: str,
    *,
    db_dir: str | Path | None = None,
    options: FitOptions | None = None,
    progress: Progress | None = None,
    top: int = 10,
    plot: str | Path | None = None,
    html: str | Path | None = None,
    hist: Sequence[str] = (),
    token: str | None = None,
    save: bool = True,
    revision: str | None = None,
) -> Report:
    """`weightdiag report`: the health report of a model; with plot (a folder) and/or html (a file) also
    its figures, re-reading the few matrices whose |w| histogram is drawn.

    Args:
        spec: a model, row file or database id (as for `compare`); db_dir, options, progress, token, save,
            revision: as for `fit`.
        top: how many matrices each list of the report names.
        plot: a folder for the PNG figures; html: a file for the page (both need the [plot] extra).
        hist: names of matrices whose |w| histogram is drawn besides those chosen.

    Returns:
        Report: `.result` (the HealthReport document), `.how` (where the row came from), `.row`, `.notes`.

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
        OutputError: (exit code 2) plot or html cannot be written.
    """
    from .diagnose.health import health_report

    plot_dir = Path(plot) if plot is not None else None
    html_file = Path(html) if html is not None else None
    if plot_dir or html_file:
        from .render.plots import require_matplotlib

        require_matplotlib()  # fail before a long fit, not after it
    if hist and not (plot_dir or html_file):
        raise OptionError(
            f"{param('hist')} draws into {param('plot')} DIR or {param('html')} FILE; add one of them", param="hist"
        )
    _check_outputs(plot_dir, html_file)  # before a long fit, not after it
    spec = with_revision(spec, revision)  # --revision REV: spec@REV, as fit takes it
    options = options or FitOptions()
    row, how = resolve_row(spec, db_dir, options, progress, token=token, save=save)
    result = health_report(_plain(row), top=top)
    result["model"]["how"] = how
    result["lineage"] = _lineage_relatives(row, Path(db_dir) if db_dir else None)
    result["observations"] += [_relative_line(found) for found in result["lineage"]["relatives"]]
    out = Report(result, how, row=row)
    if plot_dir or html_file:
        import tempfile  # here, not at start-up: only plots need a scratch folder

        from .render.plots import pyplot, write_plots
        from .render.spectrum_plots import spectrum_plots
        from .run.histograms import histogram_choice, read_histograms

        names = histogram_choice(_plain(result), _plain(row), list(hist))
        execution = options.running.execution()  # the matrices re-read as the fit read them: here or on a cluster
        try:
            data, why = read_histograms(_plain(row), list(names), spec if how == "fitted" else None, token, execution)
        finally:
            execution.close()
        for name, drawn in data.items():
            drawn["why"] = names[name]  # said under the plot: why this matrix is drawn
        if why:
            out.notes.append(why)
        with tempfile.TemporaryDirectory(prefix="weightdiag-plots-") as scratch:
            try:
                files = write_plots(result, data, plot_dir or Path(scratch))
                files += spectrum_plots(pyplot(), result, plot_dir or Path(scratch))  # a row with spectra
            except OSError as exc:  # a read-only place, a full disk: the user's --plot (exit 2), not a bug
                raise _unwritable("--plot", plot_dir or Path(scratch), exc) from None
            result["plots"] = [{"file": str(f.path), "title": f.title, "caption": f.caption} for f in files]
            if html_file:
                from .render.html import write_html

                try:
                    write_html(result, files, html_file)
                except OSError as exc:
                    raise _unwritable("--html", html_file, exc) from None
                result["html"] = str(html_file)
    return out


def _check_parent(option: str, path: Path) -> None:
    """Refuse a file path under something that is not a folder (/dev/null/x.csv), before anything is read:
    the write's own error there ("File exists", "Not a directory") names neither the option nor the cause."""
    parent = path.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{option} {path}: {parent} is not a folder; give a file path in a folder", path=path)


def _unwritable(option: str, path: Path, exc: OSError) -> OutputError:
    return OutputError(
        f"{option} {path}: cannot write it ({exc.strerror or type(exc).__name__}); give a writable "
        + ("folder" if option == "--plot" else "file path"),
        path=path,
    )


def _check_outputs(plot_dir: Path | None, html_file: Path | None) -> None:
    """--plot must be a folder (or not exist yet) and --html a file path whose folder exists or can be made."""
    if plot_dir is not None and plot_dir.exists() and not plot_dir.is_dir():
        raise OutputError(f"--plot {plot_dir}: is a file; give a folder for the PNG files", path=plot_dir)
    if html_file is not None and html_file.is_dir():
        raise OutputError(
            f"--html {html_file}: is a folder; give a file path such as {html_file / 'report.html'}", path=html_file
        )
    for option, target in (("--plot", plot_dir), ("--html", html_file and html_file.parent)):
        if target is None:
            continue
        existing = next((p for p in (target, *target.parents) if p.exists()), None)
        if existing is not None and not os.access(existing, os.W_OK):
            raise OutputError(f"{option} {target}: {existing} is not writable; give a writable place", path=target)


@dataclass
class SweepRun:
    model_id: str
    revisions: list[str]  # the selected revisions, in order
    outcomes: list[Outcome]  # one per revision

    @property
    def failed(self) -> bool:
        return any(o.status == "failed" for o in self.outcomes)


def sweep(
    target: str,
    *,
    db_dir: str | Path | None = None,
    options: FitOptions | None = None,
    revisions: Sequence[str] | None = None,
    steps: str | None = None,
    everything: bool = False,
    glob: str | None = None,
    jobs: int = 1,
    executor: str = "local",
    ray_address: str | None = None,
    model_id: str | None = None,
    token: str | None = None,
    download: bool = False,
    on_plan: Callable[[str, list[str]], None] | None = None,
    on_outcome: Callable[[Outcome], None] | None = None,
    progress: Progress | None = None,
) -> SweepRun:
    """`weightdiag sweep`: fit the selected checkpoints of a training run (Hub revisions or a folder of
    checkpoint folders) into the database; resumable (rows already there are kept), in parallel.

    Args:
        target: a Hub id (its revisions) or a folder of checkpoint folders.
        revisions, steps ("log:6", "every:1000", ...), everything, glob: which checkpoints (default: a few).
        jobs: fits at once on this machine; executor ("local" or "ray") and ray_address: where they run (a
            sweep's tasks are whole fits, so `options` must leave its executor and ray_address unset).
        model_id: the rows' model id (a folder's default: its name). db_dir, options, token, download, progress:
            as for `fit`. on_plan, on_outcome: called with the chosen revisions, and as each fit ends.

    Returns:
        SweepRun: `.model_id`, `.revisions`, `.outcomes` (one per revision), `.failed`.

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
    """
    from .run import sweep as sw

    options = options or FitOptions()
    check_options(options)
    if options.executor != "local" or options.ray_address is not None:  # one place says where the work runs
        raise OptionError(
            f"sweep runs each revision's fit whole in one task: give sweep(executor=..., ray_address=...) for where "
            f"they run, not FitOptions(executor=..., ray_address=...) ({param('executor')} of sweep)",
            param="executor",
        )
    if jobs < 1:
        raise OptionError(f"{param('jobs')} must be at least 1", param="jobs")
    chosen = choose_executor(executor, ray_address)  # the revisions' fits: here, or as tasks on a Ray cluster
    plan = sw.plan_sweep(
        target,
        model_id=model_id,
        names=list(revisions) if revisions else None,
        steps=steps,
        everything=everything,
        glob=glob,
        token=token,
    )
    if not chosen.local:
        runner = sw.cluster_runner(chosen)
    else:
        runner = sw.process_runner(jobs) if jobs > 1 else sw.serial_runner
    names = [r.name for r in plan.revisions]
    if on_plan:
        on_plan(plan.model_id, names)
    # Every fit option goes to the workers (a --center or --include sweep writes rows of that variant), but
    # the training steps: each revision's own step number gives them.
    fields = ("protocol", "trim", "center", "device", "include", "exclude", "lr", "weight_decay", "preset")
    taken = (*fields, "connections", "split_fused", "spectrum", "farms")
    option_dict: dict[str, Any] = {f: getattr(options, f) for f in taken}
    option_dict["include"], option_dict["exclude"] = list(options.include), list(options.exclude)
    db = Path(db_dir) if db_dir else default_db_dir()
    try:
        outcomes = sw.run_sweep(
            plan, db, option_dict, runner, token=token, download=download, on_outcome=on_outcome, progress=progress
        )
    except KeyboardInterrupt as stop:  # what a rerun picks up: the rows written, and each revision's journal
        note_kept(stop, "run the command again to resume: the rows written so far are kept")
        raise
    return SweepRun(plan.model_id, names, outcomes)


SCHEDULES = ("constant", "cosine")


def trajectory(
    model: str,
    *,
    db_dir: str | Path | None = None,
    schedule: str = "constant",
    total: float | None = None,
    warmup: float = 0.0,
    min_lr_ratio: float = 0.1,
    protocol: str | None = None,
    plot: str | Path | None = None,
) -> TrajectoryResult:
    """`weightdiag trajectory`: a swept run read from its rows (k and lambda over steps, drift, the lambda
    peak, step-0 checks, std patterns); with plot (a folder), its PNG figures too."""
    from .database.store import find_rows, require_database
    from .diagnose import trajectory as tr

    require_database(Path(db_dir) if db_dir else None)
    rows = [r for r in find_rows(model, Path(db_dir) if db_dir else None) if r["model"]["id"] == model]
    if not rows:
        folder = (Path(db_dir) if db_dir else default_db_dir()).resolve()
        raise RowNotFoundError(
            model,
            f"{model}: no rows in the database {folder}; run `weightdiag sweep {model}` first, or pass the "
            "database that holds them with --db (or WEIGHTDIAG_DB)",
        )
    # One protocol per trajectory: hist1024 and exact differ by more than a step's change late in a run.
    fitted = Counter(r["protocol"]["name"] for r in rows)
    chosen = protocol or ("hist1024" if "hist1024" in fitted else fitted.most_common(1)[0][0])
    rows = [r for r in rows if r["protocol"]["name"] == chosen]
    if not rows:
        found = ", ".join(sorted(fitted))
        raise OptionError(
            f"{model}: no rows fitted with {param('protocol')} {chosen} (found: {found})", param="protocol"
        )
    if not tr.ordered([_plain(r) for r in rows]):  # an empty trajectory with exit 0, before issue 33
        revisions = sorted(
            {str(r["model"].get("revision") or r["model"].get("fingerprint")) for r in rows}, key=natural_key
        )
        raise RowUseError(
            f"{model}: its rows are of no training step (revisions: {', '.join(revisions[:5])}"
            f"{', ...' if len(revisions) > 5 else ''}); a trajectory reads checkpoints named stepN, step_N or "
            "checkpoint-N, as `weightdiag sweep` fits them",
            model_id=model,
        )
    if schedule not in SCHEDULES:
        raise OptionError(f"{param('schedule')} {schedule!r}: choose constant or cosine", param="schedule")
    spec = None
    if schedule == "cosine":
        if not total:
            raise OptionError(
                f"{param('schedule')} cosine needs {param('total')} (the run's total steps)", param="total"
            )
        if not (0 <= warmup < total):
            raise OptionError(
                f"{param('warmup')} {warmup:g}: give a warm-up from 0 to below {param('total')} {total:g} (the "
                "run's total steps)",
                param="warmup",
            )
        if not 0 <= min_lr_ratio <= 1:
            raise OptionError(
                f"{param('min_lr_ratio')} {min_lr_ratio:g}: give a ratio from 0 to 1", param="min_lr_ratio"
            )
        spec = {"kind": "cosine", "total": total, "warmup": warmup, "min_ratio": min_lr_ratio}
    result = tr.trajectory([_plain(r) for r in rows], spec)
    result["protocol"] = chosen
    # Rows of no training step (a sweep's `main`): not on a step axis, but never left out silently (issue 42).
    result["left_out"] = sorted(tr.stepless([_plain(r) for r in rows]), key=natural_key)
    if plot is not None:
        from .render.trajectory_plots import k_lambda_plot, std_heatmap

        folder = Path(plot)
        _check_outputs(folder, None)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            points = [(s, r) for s, r in tr.ordered([_plain(r) for r in rows]) if r["matrices"]]
            files = [str(k_lambda_plot(result, folder / "k_lambda_vs_step.png"))]
            if points:
                steps_, blocks, table = tr.block_std(points)
                files.append(str(std_heatmap(steps_, blocks, table, model, folder / "std_heatmap.png")))
        except OSError as exc:  # /proc, a read-only place, a full disk: the user's --plot (exit 2), not a bug
            raise _unwritable("--plot", folder, exc) from None
        result["plots"] = files
    return result


SkipNote = Callable[[RowError], None]  # a file in rows/ that is not a readable row


def list_rows(
    db_dir: str | Path | None = None, *, fitted_only: bool = False, on_skip: SkipNote | None = None
) -> list[FlatRecord]:
    """`weightdiag db list`: one flat record per cohort entry and fitted row (db.flat_record)."""
    from .database.store import cohort_rows, flat_record, iter_summaries, natural_key, require_database

    db = Path(db_dir) if db_dir else None
    require_database(db)  # a typo'd --db is no empty database
    # One summary at a time, flattened as it is read: 20,000 summaries held at once took 500 MB.
    records = [] if fitted_only else [flat_record(r) for r in cohort_rows()]
    fitted = [(natural_key(path.name), flat_record(row)) for path, row in iter_summaries(db, on_skip)]
    # By file name (a model's rows together), its numbers by value: step20 before step100 (issue 33).
    records.extend(record for _, record in sorted(fitted, key=lambda pair: pair[0]))
    return records


def list_journals(db_dir: str | Path | None = None) -> list[Any]:
    """`weightdiag db journals`: the journals of interrupted fits in the database (database.journals.JournalInfo)."""
    from .database.journals import journals
    from .database.store import require_database

    db = Path(db_dir) if db_dir else None
    require_database(db)
    return journals(db or default_db_dir())


def collect_journals(db_dir: str | Path | None = None, *, everything: bool = False, dry_run: bool = False) -> list[Any]:
    """`weightdiag db gc`: remove the stale journals (`everything`: every one not being fitted); those removed."""
    from .database.journals import collect
    from .database.store import require_database

    db = Path(db_dir) if db_dir else None
    require_database(db)
    return collect(db or default_db_dir(), everything=everything, dry_run=dry_run)


def show_row(row_id: str, db_dir: str | Path | None = None, *, summary: bool = False) -> Row:
    """`weightdiag db show`: one row by the id `db list` prints, a row file's name, or its path; with
    summary=True a database row may come without its per-matrix records (`counts` says how many)."""
    from .database.names import did_you_mean
    from .database.store import row_by_id

    db = Path(db_dir) if db_dir else None
    try:
        return row_by_id(row_id, db, summary=summary)
    except RowNotFoundError:
        hint = did_you_mean(row_id, db)
        if not hint:
            raise
        folder = (db or default_db_dir()).resolve()
        raise RowNotFoundError(
            row_id,
            f"{row_id}: no such row in {folder}{hint}; see `weightdiag db list`, or pass the database that holds it "
            "with --db (or WEIGHTDIAG_DB)",
        ) from None


EXPORT_FORMATS = ("csv", "jsonl", "parquet")


def export_rows(
    fmt: str = "csv",
    *,
    output: str | Path | None = None,
    db_dir: str | Path | None = None,
    fitted_only: bool = False,
    on_skip: SkipNote | None = None,
    per_matrix: bool = False,
) -> tuple[str, int]:
    """`weightdiag db export`: the database as a table (docs/tables.md): one record per row (identity, T/tau,
    per-kind median k and lambda), or with per_matrix one per matrix of every fitted row (the row's key columns,
    then weightdiag.record.table's: WeightWatcher's names for the spectral metrics, the row's for the Weibull ones).

    Args:
        fmt: csv, jsonl or parquet (Arrow types; needs pyarrow, the [pandas] extra, and an output file).
        output: write the table there, atomically; None: return it as text (csv and jsonl).
        db_dir: the database folder. fitted_only: leave out the cohort's entries (model-level table).
        on_skip: told of each file in rows/ that is not a readable row (it is passed over).
        per_matrix: the per-matrix table (of fitted rows: cohort entries have no per-matrix records).

    Returns:
        (the text written, or "" when written to output; how many records).

    Raises:
        OptionError: (exit code 2) an unknown fmt, or parquet without an output file.
        OutputError: (exit code 2) output cannot be written. DatabaseError: (exit code 2) no database at db_dir.
        MissingDependencyError: (exit code 2) parquet without pyarrow.
    """
    from .database.export import (
        PER_MATRIX_COLUMNS,
        by_column,
        by_record,
        check_format,
        matrix_table,
        model_columns,
        require_pyarrow,
        text_of,
        write_parquet,
        write_text_file,
    )
    from .database.store import iter_rows, require_database, write_text_atomic

    if output is not None and not str(output).strip():
        raise OptionError(f"{param('output')} names no file; give a file path such as rows.{fmt}", param="output")
    out_path = Path(output) if output is not None else None
    check_format(fmt, out_path)
    if fmt == "parquet":
        if out_path is None:
            raise OptionError(
                f"{param('fmt')} parquet writes a binary file: give {param('output')} FILE (such as rows.parquet)",
                param="output",
            )
        require_pyarrow()  # before reading thousands of rows
    if out_path is not None and out_path.is_dir():
        raise OutputError(
            f"--output {out_path}: is a folder; give a file path such as {out_path / ('rows.' + fmt)}", path=out_path
        )
    if out_path is not None:
        _check_parent("--output", out_path)
    db = Path(db_dir) if db_dir else None
    if per_matrix:
        require_database(db)
        columns = list(PER_MATRIX_COLUMNS)
        tables: Iterable[dict[str, list[Any]]] = matrix_table(row for _, row in iter_rows(db, on_skip))
        records: Iterable[list[dict[str, Any]]] = (by_record(table) for table in tables)
    else:
        listed = list_rows(db_dir, fitted_only=fitted_only, on_skip=on_skip)
        columns = model_columns(listed)
        tables, records = [by_column(listed, columns)], [cast("list[dict[str, Any]]", listed)]
    try:
        if fmt == "parquet":
            assert out_path is not None
            return "", write_parquet(out_path, columns, tables)
        if out_path is not None and per_matrix:  # streamed: thousands of rows' matrices are never held at once
            return "", write_text_file(out_path, fmt, columns, records)
        text, count = text_of(fmt, columns, records)
        if out_path is not None:
            write_text_atomic(out_path, text)
        return text, count
    except OSError as exc:  # a folder, /proc, a read-only place: the user's path (exit 2), not a bug
        raise OutputError(
            f"--output {out_path}: cannot write it ({exc.strerror or type(exc).__name__}); give a writable file path",
            path=out_path or Path("-"),
        ) from None


def diff(
    base: str | None,
    tuned: str,
    options: DiffOptions | None = None,
    *,
    db_dir: str | Path | None = None,
    save: bool = True,
    plot: str | Path | None = None,
    html: str | Path | None = None,
    progress: Progress | None = None,
    revision: str | None = None,
    plot_dir: Path | None = None,
    html_file: Path | None = None,
    export_lora: Path | None = None,
    lora_rank: int | None = None,
    lora_energy: float | None = None,
) -> DiffResult:
    """What changed from `base` to `tuned`, tensor by tensor (weightdiag.run.diff); base None: the base_model its
    model card names. The diff row is written to DATABASE/diffs/ (result.run["saved"]; save=False: not);
    plot_dir and html_file: relative change and rank90 per block and kind as PNGs, and a page. `revision`: the
    tuned model's, as TUNED@REV (the base's is given as BASE@REV).

    Args:
        base, tuned: two checkpoints of one architecture (as `fit` takes models); base None: the tuned model
            card's base_model.
        options: DiffOptions (device, include/exclude, spectrum, sketch, executor, token, ...).
        db_dir, save: write the diff row to db_dir/diffs/ (by default, as `weightdiag diff` does).
        plot: a folder for its PNG figures; html: a file for its page (as `report` takes them; plot_dir and
            html_file, their names before, are still taken).
        progress: as for `fit`; revision: the tuned model's.
        export_lora: a folder the changed linear weights' ΔW is written to as a PEFT LoRA adapter
            (run/export_lora.py), at lora_rank or the rank holding lora_energy of each ||ΔW||² (0.9 by
            default); what was written is result.export_lora.

    Returns:
        DiffResult: `.matrices` and `.vectors` (TensorDiff per pair), `.findings`, `.blocks`, `.kinds`,
        `.to_json()` (docs/diff-schema.md), `.matrices_frame()` (a pandas DataFrame, one line per pair).

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
        OutputError: (exit code 2) plot_dir or html_file cannot be written.
    """
    from .run.diff import diff as run_diff
    from .run.export_lora import check as check_export
    from .run.export_lora import export_lora as run_export

    tuned = with_revision(tuned, revision)  # --revision REV: TUNED@REV, as fit takes MODEL@REV
    for name, given, before in (("plot", plot, plot_dir), ("html", html, html_file)):
        if given is not None and before is not None and Path(given) != Path(before):
            raise OptionError(f"{param(name)} and its older name name two places; give one of them", param=name)
    plot_dir = Path(plot) if plot is not None else plot_dir
    html_file = Path(html) if html is not None else html_file
    _check_outputs(plot_dir, html_file)
    if export_lora is not None:
        check_export(Path(export_lora), lora_rank, lora_energy)
        if options is None or options.workers is None:
            # the export's bound (one matrix's ΔW and Gram) holds for the whole command: the diff before it takes
            # one block at a time (two workers' float64 block arithmetic and spectra passed 500 MB on 2 x 1 GB),
            # a few seconds on an export that takes minutes
            options = replace(options or DiffOptions(), workers=1)
    elif lora_rank is not None or lora_energy is not None:
        raise OptionError(f"{param('rank')} and {param('energy')} go with {param('export_lora')}", param="rank")
    if plot_dir is not None or html_file is not None:
        from .render.plots import require_matplotlib

        require_matplotlib()
    if save:
        from .database.store import check_writable

        check_writable(Path(db_dir) if db_dir else None)
    result = run_diff(base, tuned, options, progress)
    if export_lora is not None:
        side = result.base  # the base the diff read (the model card's when none was given)
        base_spec = base or (side["location"] if side["source"] == "local" else f"{side['id']}@{side['commit']}")
        result.export_lora = run_export(
            base_spec, tuned, Path(export_lora), rank=lora_rank, energy=lora_energy, options=options
        )
    if save:
        from .database.diffs import save_diff

        result.run["saved"] = str(save_diff(result, db_dir))
    if plot_dir is not None or html_file is not None:
        import tempfile

        from .render.diff_plots import write_html, write_plots

        with tempfile.TemporaryDirectory() as scratch:
            plots = write_plots(result, plot_dir or Path(scratch))
            if plot_dir is not None:  # what was written, for the command to say (it wrote silently before)
                result.run["plots"] = [str(p.path) for p in plots]
            if html_file is not None:
                write_html(result, plots, html_file)
                result.run["html"] = str(html_file)
    return result


@dataclass
class LineageReport:
    """`weightdiag lineage`: the candidate and each reference's judgement (diagnose.lineage), strongest first."""

    candidate: str
    how: str  # where the candidate's row came from: fitted, database, row file
    judgements: list[Any]  # diagnose.lineage.Judgement
    references: int  # references looked at (judged or not)
    # --declared: the base_model(s) the candidate's card names (joined by ", "), and whether its weights confirm
    # them: confirmed (each one), contradicted (one at least) or inconclusive
    declared: str | None = None
    declaration: str | None = None
    nearest: str | None = None  # contradicted: the database's row the candidate derives from, if any
    # each base_model named: (the name, the reference judged, its verdict confirmed/contradicted/inconclusive)
    declarations: list[tuple[str, str, str]] = field(default_factory=list)
    bytes_read: dict[str, int] = field(default_factory=dict)  # sampled reads of a base without a row: its bytes read

    def to_json(self) -> list[dict[str, Any]]:
        out = [{"candidate": self.candidate, **j.to_json()} for j in self.judgements]
        for base, reference, verdict in self.declarations:
            for item in out:
                if item["reference"] == reference and "declared" not in item:
                    item["declared"] = {"base_model": base, "verdict": verdict, "nearest_in_database": self.nearest}
                    if reference in self.bytes_read:
                        item["declared"]["bytes_read"] = self.bytes_read[reference]
                    break
        return out


DECLARED = {"derived": "confirmed", "independent": "contradicted"}  # else inconclusive


def _declared_bases(candidate: str, row: Mapping[str, Any], token: str | None) -> list[str]:
    """Every base_model the candidate's model card names (its folder's README.md front matter, or the Hub repo's),
    each a model id or a path (`./path` against the candidate's folder, not the working directory). A value that
    cannot name a model (a YAML mapping, a broken list) is a one-line error, never looked up on the Hub."""
    from .run.diff import hub_card_bases
    from .source.files import CARD_HEAD, MODEL_CARD, base_models_of, is_model_name
    from .source.open import open_model

    model = row["model"]
    where = Path(model.get("location") or candidate).expanduser()
    folder = where if where.is_dir() else where.parent
    bases: list[str] = []
    if model.get("source") == "local" and (folder / MODEL_CARD).is_file():
        with contextlib.suppress(OSError), (folder / MODEL_CARD).open("rb") as card:
            bases = base_models_of(card.read(CARD_HEAD).decode("utf-8", errors="replace"))
    if not bases and model.get("source") == "hub":
        with contextlib.suppress(OptionError):
            plan, reader = open_model(_label(row), token=token)
            reader.close()
            bases = hub_card_bases(_label(row), plan, DiffOptions(token=token))
    if not bases:
        raise OptionError(
            f"{candidate}: its model card names no base_model to check; name the references with "
            f"{param('against')} instead of {param('declared')}",
            param="declared",
        )
    out = []
    for base in bases:
        if not is_model_name(base):
            raise OptionError(
                f"{candidate}: its model card's base_model {base[:80]!r} is not a model id or a path; fix the card's "
                f"front matter, or name the base with {param('against')}",
                param="declared",
            )
        if base.startswith(("./", "../")) and model.get("source") == "local":
            base = str((folder / base).resolve())
        out.append(base)
    return out


def _label(row: Mapping[str, Any]) -> str:
    model = row.get("model") or {}
    revision = model.get("revision")
    return f"{model.get('id')}@{revision}" if revision and model.get("source") == "hub" else str(model.get("id"))


def _lineage_row(
    spec: str, db: Path | None, options: FitOptions, progress: Progress | None, token: str | None, save: bool
) -> tuple[Row, str]:
    """The row of a candidate or a named reference: a row (file, id `db list` prints), else what `fit` reads,
    fitted (and saved with `save`); a row without a fingerprint is fitted again where its model can be read."""
    from .database.store import row_by_id
    from .record.lineage import read_fingerprint

    path = Path(spec).expanduser()
    if not (path.exists() and (path.is_dir() or path.suffix != ".json")):
        try:
            row = row_by_id(spec, db)
            if read_fingerprint(row) is not None or row["model"].get("source") == "cohort":
                return row, "row"
            location = row["model"].get("location")
            if not location or not (Path(location).exists() or row["model"].get("source") == "hub"):
                return row, "row"
            spec = location if row["model"].get("source") == "local" else _label(row)
        except RowNotFoundError:
            if not (path.exists() or is_hub_id(spec)):
                raise
    row, how = resolve_row(spec, db, options, progress, token=token, save=save)
    if read_fingerprint(row) is None and how != "row file" and row["model"].get("source") != "cohort":
        row, how = resolve_row(spec, db, options, progress, token=token, save=save, reuse=False)
    return row, how


def _declared_row(
    base: str, db: Path | None, options: FitOptions, progress: Progress | None, token: str | None, save: bool
) -> tuple[Mapping[str, Any], int | None]:
    """A declared base's row: its database row when it has one (by id) with a fingerprint; else its samples read by
    ranged reads (run/lineage_read.py: a few percent of its bytes; with the bytes read); else the model fitted."""
    from .database.store import missing_database, row_by_id
    from .record.lineage import read_fingerprint
    from .run.lineage_read import sampled_base

    with contextlib.suppress(RowNotFoundError):
        row = row_by_id(base, db) if missing_database(db) is None else None  # no database: no row to have
        if row is not None and read_fingerprint(row) is not None:
            return row, None
    if not save:
        sampled = sampled_base(base, token)
        if sampled is not None:
            return sampled.row, sampled.bytes_read
    return _lineage_row(base, db, options, progress, token, save)[0], None


def _database_refs(db: Path | None, row: Mapping[str, Any]) -> Iterator[tuple[str, bytes | str]]:
    """Every fitted row of the database but the candidate's own (of the same files), with its packed fingerprint
    (from the database's index: no row parsed) or why it has none."""
    from .database.store import iter_lineage
    from .diagnose.lineage import Fingerprint

    def same(r: Mapping[str, Any]) -> tuple[Any, ...]:
        model = r["model"]
        return (model.get("id"), model.get("location"), model.get("fingerprint"), model.get("commit"))

    if db is not None and not db.exists():
        return
    for _, summary, packed in iter_lineage(db):  # one row at a time, judged in chunks, never all held
        if same(summary) != same(row):
            yield _label(summary), packed or str(Fingerprint.of_or_why(_plain(summary)))


def lineage(
    candidate: str,
    against: Sequence[str] = (),
    *,
    db_dir: str | Path | None = None,
    options: FitOptions | None = None,
    progress: Progress | None = None,
    token: str | None = None,
    save: bool = False,
    declared: bool = False,
) -> LineageReport:
    """`weightdiag lineage`: whether `candidate` (a row id, or anything `fit` reads: fitted without saving unless
    `save`) derives from each reference: those `against` names (rows, folders, Hub ids), else every fitted row of
    the database (docs/lineage.md). Judgements strongest first; references without a fingerprint 'not judged'.
    `declared`: the reference is the base_model the candidate's model card names (a row of that id, else the model
    fitted), and the report says whether the weights confirm it (with the database's nearest derived row when not)."""
    from .diagnose.lineage import Fingerprint, judge_all
    from .diagnose.lineage_batch import judge_packed

    options = options or FitOptions()
    check_options(options)
    db = Path(db_dir) if db_dir else None
    if isinstance(against, str | Path):  # one reference, not its letters
        against = [str(against)]
    if declared and against:
        raise OptionError(
            f"{param('declared')} checks the card's base_model: give no {param('against')}", param="declared"
        )
    if not against and not declared:
        from .database.store import require_database

        require_database(db)  # the references are the database's rows: a folder that is not there is a typo
    row, how = _lineage_row(candidate, db, options, progress, token, save)
    cand = Fingerprint.of(_plain(row))
    if cand is None:
        raise RowUseError(
            f"{candidate}: its row has no lineage fingerprint (a cohort summary, or a row written before issue 39); "
            "refit the model to add it",
            model_id=row["model"].get("id"),
        )
    if declared:
        bases = _declared_bases(candidate, row, token)
        judgements, declarations = [], []
        bytes_read: dict[str, int] = {}
        for base in bases:  # each named base judged, not the first only (a merge names several)
            ref, nbytes = _declared_row(base, db, options, progress, token, save)
            (judged,) = judge_all(cand, [(_label(ref), Fingerprint.of_or_why(_plain(ref)))])
            if nbytes is not None:
                bytes_read[judged.reference] = nbytes
            judgements.append(judged)
            declarations.append((base, judged.reference, DECLARED.get(judged.verdict, "inconclusive")))
        verdicts = {verdict for _, _, verdict in declarations}
        overall = "contradicted" if "contradicted" in verdicts else "confirmed" if verdicts == {"confirmed"} else None
        report = LineageReport(
            _label(row), how, judgements, len(judgements), ", ".join(bases), overall or "inconclusive"
        )
        report.declarations, report.bytes_read = declarations, bytes_read
        if report.declaration == "contradicted":  # what it derives from instead, if the database holds it
            found = [j for j in judge_packed(cand, _database_refs(db, row)) if j.verdict == "derived"]
            report.nearest = found[0].reference if found else None
        return report
    refs: list[tuple[str, Any]] = []
    for spec in against:
        ref, _ = _lineage_row(spec, db, options, progress, token, save)
        refs.append((_label(ref), Fingerprint.of_or_why(_plain(ref))))
    judgements = judge_all(cand, refs) if against else judge_packed(cand, _database_refs(db, row))
    return LineageReport(_label(row), how, judgements, len(judgements))


def plan(
    spec: str,
    options: FitOptions | None = None,
    *,
    revision: str | None = None,
    token: str | None = None,
) -> Plan:
    """`weightdiag fit MODEL --plan`: what `fit` would read and record, and what it would skip and why, from the
    files' headers and config.json alone (from the Hub: the safetensors headers, two ranged reads per shard).

    Args:
        spec, revision, token: the model, as for `fit`.
        options: the fit's options (include/exclude and split_fused change the plan).

    Returns:
        Plan: `.tensors` (PlannedTensor: name, fate matrix/vector/skipped/not selected, tensor, file, dtype, shape,
        kind, class, block, expert, view, parts, nbytes, reason), `.bytes_to_read`, `.bytes_read` (of the weight
        files, to plan: None for local files), `.to_json()`, `.frame()`.

    Raises:
        BadInputError: (exit code 2) a bad option (OptionError), model path (ModelPathError), checkpoint
            (CheckpointFormatError), database (DatabaseError), missing package (MissingDependencyError).
        HubError: (exit code 3) the Hub cannot be reached, a repo or revision does not exist or is gated, or bytes
            fail their sha256 (RepoNotFoundError, RevisionNotFoundError, GatedRepoError, HubUnreachableError,
            VerificationError, ...).
    """
    from .run.plan import plan_fit

    options = options or FitOptions()
    check_options(options)
    return plan_fit(spec, options, revision=revision, token=token)


def matrices_frame(row: Mapping[str, Any], vectors: bool = False) -> DataFrame:
    """The per-matrix frame of a document: of a row, one line per matrix record and per part of a fused one
    (record.table.matrices_frame: WeightWatcher's column names); of a diff row (DiffResult.to_json(), a file of
    DATABASE/diffs/ read as JSON), one line per tensor pair, as DiffResult.matrices_frame gives it.

    Args:
        row: a row (`wd.fit(...).row`, `wd.read_row(path)`) or a diff row.
        vectors: of a diff row, the vector pairs too (a row's frame has matrices only).

    Returns:
        pandas.DataFrame.

    Raises:
        TypeError: `row` is not a document (None, a path, a model id, ...).
        MissingDependencyError: pandas is not installed (exit code 2).
    """
    from .delta.result import SCHEMA as DIFF_SCHEMA
    from .delta.result import tensor_records
    from .record import table

    table.refuse_non_row(row)
    if row.get("schema") == DIFF_SCHEMA:
        records = tensor_records(dict(row), vectors)
        return table.frame(records, list({name: None for record in records for name in record}))
    return table.matrices_frame(row)


def database_frame(
    db_dir: str | Path | None = None,
    *,
    per_matrix: bool = False,
    fitted_only: bool = False,
    on_skip: SkipNote | None = None,
) -> DataFrame:
    """The database as a pandas DataFrame: `db export`'s table (docs/tables.md), one line per row (cohort entries
    too, unless fitted_only), or with per_matrix one per matrix of every fitted row. The whole table is held in
    memory: for thousands of rows, `db export --format parquet --per-matrix` and a query engine (DuckDB) scale
    further.

    Args:
        db_dir: the database folder (default: WEIGHTDIAG_DB, ./DATABASE, the per-user folder).
        per_matrix: one line per matrix record (fitted rows only) instead of one per row.
        fitted_only: leave out the cohort's entries (model-level table).
        on_skip: told of each file in rows/ that is not a readable row (it is passed over).

    Returns:
        pandas.DataFrame with the declared columns (ROW_KEY_COLUMNS + MATRIX_COLUMNS, or the model columns).

    Raises:
        DatabaseError: (exit code 2) no database at db_dir.
        MissingDependencyError: (exit code 2) pandas is not installed: errors.PANDAS_INSTALL says how.
    """
    from .database.export import PER_MATRIX_COLUMNS, by_column, matrix_table, model_columns
    from .database.store import iter_rows, require_database
    from .record.table import require_pandas

    pd = require_pandas()  # before reading the rows
    if not per_matrix:
        listed = list_rows(db_dir, fitted_only=fitted_only, on_skip=on_skip)
        columns = model_columns(listed)
        return pd.DataFrame(by_column(listed, columns), columns=[c.name for c in columns])
    db = Path(db_dir) if db_dir else None
    require_database(db)
    names = [c.name for c in PER_MATRIX_COLUMNS]
    table: dict[str, list[Any]] = {name: [] for name in names}
    for part in matrix_table(row for _, row in iter_rows(db, on_skip)):
        for name in names:
            table[name].extend(part[name])
    return pd.DataFrame(table, columns=names)

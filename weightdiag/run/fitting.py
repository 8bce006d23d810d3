"""Fit a model into a row: check the options, open the model, measure it, interpret the measurements,
and find or write rows in the database (reusing a Hub fit of the same commit).

The building blocks of `api` (fit, compare, check, report) and of `sweep` (one revision per task).
"""

from __future__ import annotations

from pathlib import Path

from ..database.store import default_db_dir, iter_summaries, write_row
from ..diagnose.kinds import interpret
from ..diagnose.spectrum import holds_spectra_asked
from ..errors import DatabaseError, HubUnreachableError, NotCachedError, RepoNotFoundError, note_kept
from ..execution import Execution
from ..progress import Progress
from ..record.journal import Journal, resume_options
from ..record.schema import Row
from ..source.open import open_model
from ..source.plan import ModelPlan
from ..source.reader import Reader
from .measure import FitOptions, execution_for, measure


def check_options(options: FitOptions) -> None:
    """Refuse unusable options (BadInputError, exit 2) before anything is read."""
    options.validate()
    options.running.execution()  # the device, the executor and the connections, checked where they are chosen


def fit_plan(
    plan: ModelPlan,
    reader: Reader,
    options: FitOptions,
    progress: Progress | None = None,
    journal: Journal | None = None,
    *,
    execution: Execution | None = None,
) -> Row:
    """Measure every selected tensor of an opened model and interpret the measurements: the row. With a
    journal, an interrupted fit of the same checkpoint is resumed (weightdiag.record.journal). `execution`:
    threads, workers and device (default: from the settings and options.device)."""
    row = measure(plan, reader, options, progress, journal, execution=execution)
    return interpret(row, lr=options.lr, weight_decay=options.weight_decay, steps=options.steps, preset=options.preset)


def fit_path(spec: str, options: FitOptions, progress: Progress | None = None) -> Row:
    """Fit a model given as a local path (fit_model also takes Hub ids)."""
    from ..source.local import open_local

    check_options(options)
    plan, reader = open_local(spec, options.model_id)
    return fit_plan(plan, reader, options, progress)


def fit_model(
    spec: str,
    options: FitOptions | None = None,
    progress: Progress | None = None,
    *,
    revision: str | None = None,
    token: str | None = None,
    download: bool = False,
) -> Row:
    """Fit every weight matrix of a model (local path or Hub id) and return its row."""
    row, _ = fit_and_save_model(
        spec, options or FitOptions(), progress, None, revision=revision, token=token, download=download
    )
    return row


def fit_and_save_model(
    spec: str,
    options: FitOptions,
    progress: Progress | None,
    db: Path | None,
    *,
    revision: str | None = None,
    token: str | None = None,
    download: bool = False,
    names_db: Path | None = None,
) -> tuple[Row, Path | None]:
    """Open the model `spec` names (local path or Hub id), fit it and write its row into `db` (None: do not
    save; see fit_and_save): `weightdiag fit`. The options and then the database are checked first of all,
    before the model is looked for; `names_db`: the database a mistyped name is looked up in (open_named)."""
    from ..database.store import check_writable

    check_options(options)
    if download and not execution_for(options).executor.local:
        from ..errors import OptionError, param

        raise OptionError(
            f"{param('download')} fetches the shards onto this machine, {param('executor')} ray reads them on the "
            "cluster's nodes (each from the Hub): give one of them",
            param="download",
        )
    if db is not None:
        check_writable(db)
    plan, reader = open_named(
        spec, names_db, model_id=options.model_id, revision=revision, token=token, download=download
    )
    return fit_and_save(plan, reader, options, progress, db)


def open_named(
    spec: str,
    db_dir: Path | None,
    *,
    model_id: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    download: bool = False,
) -> tuple[ModelPlan, Reader]:
    """open_model, with the name checked against the cohort and the database `db_dir` (None: the default one)
    before the Hub is asked: a bare NAME that is no local path, close to an id here but none of them, is a typo
    (ModelPathError, exit 2, "did you mean"); a Hub id the Hub does not know gets the same hint (issue 42)."""
    from ..database.names import hint, known_names, nearest
    from ..source.hub import repo_not_found
    from ..source.open import is_hub_id, split_revision

    name = split_revision(spec)[0]
    bare = "/" not in name and is_hub_id(spec)
    names = known_names(db_dir) if bare else []
    if bare and spec.casefold() not in {n.casefold() for n in names}:
        here = known_names(db_dir, hub_rows=False)  # a name close to a row from the Hub may be another repository
        close = [n for n in nearest(spec, here) if "/" not in n.partition("@")[0]]  # ids here, not Hub repos
        if close:
            from ..errors import ModelPathError

            raise ModelPathError(
                f"{spec}: no local file or folder, cohort entry or fitted row of that name{hint(close)}; give "
                "one of them, or a Hub id as ORG/NAME",
                path=spec,
            )
    try:
        return open_model(spec, model_id=model_id, revision=revision, token=token, download=download)
    except RepoNotFoundError as exc:
        names = names or known_names(db_dir)
        found = hint(nearest(exc.repo or name, names))
        if not found and spec.casefold() in {n.casefold() for n in names}:  # `fit all-MiniLM-L6-v2` after the demo
            found = f" ({spec} is the id of a row in the database, not of a Hub repository)"
        if not found:
            raise
        raise repo_not_found(exc.repo or name, found) from None


def save_row(row: Row, db_dir: str | Path | None = None) -> Path:
    """Write a row atomically into the database folder; returns its path."""
    return write_row(row, Path(db_dir) if db_dir else default_db_dir())


def fit_and_save(
    plan: ModelPlan,
    reader: Reader,
    options: FitOptions,
    progress: Progress | None,
    db: Path | None,
    fresh: bool = False,
    *,
    execution: Execution | None = None,
) -> tuple[Row, Path | None]:
    """Fit an opened model and write its row into `db` (None: do not save). The folder is checked
    before the fit, so a long fit never ends in a database that cannot take its row. An interrupted fit's
    journal is resumed, unless `fresh` (every tensor read again; the journal is made anew)."""
    from ..database.store import check_writable

    if db is not None:
        try:
            check_writable(db)
        except BaseException:
            reader.close()
            raise
    journal = open_journal(plan, reader, options, db) if db is not None else None
    if journal is not None and fresh:
        journal.discard()
    row = fit_plan(plan, reader, options, progress, journal, execution=execution)
    if db is None:
        return row, None
    try:
        if journal is not None:
            _room_for_row(row, db, journal)
        path = save_row(row, db)
    except DatabaseError as exc:  # the fit is done: hand its row to the caller all the same (fit --json prints it)
        exc = _naming_journals(exc, db)
        exc.unsaved_row = row
        raise exc from None
    except KeyboardInterrupt as stop:  # measured, not yet written: the journal holds every tensor
        if journal is not None and journal.folder.exists():
            note_kept(stop, "run the command again to resume: every tensor measured is kept")
        raise
    if journal is not None:
        journal.discard()  # the row holds it all now
        if journal.folder.exists():  # something in it could not be removed: said, never left unseen
            from ..record.journal import warn

            warn(f"{journal.folder}: this fit's journal could not be removed; `weightdiag db gc` removes it")
    return row, path


ROOM_MARGIN = 1 << 20  # beside the row: its summary, and what other writers may take meanwhile
PLENTY = 4 << 30  # free bytes beyond any row's size


def _room_for_row(row: Row, db: Path, journal: Journal) -> None:
    """Journals never cost the row: when the disk cannot take the row but could without this fit's own journal
    (its records are all in the row), the journal goes first; when even that is not enough, DatabaseError says
    what takes the space, before anything is written."""
    import json
    import shutil

    from ..database.store import ROWS_DIR
    from ..record.journal import warn

    rows = db / ROWS_DIR
    try:
        free = shutil.disk_usage(rows if rows.is_dir() else db).free
    except OSError:
        return  # not there yet, or no statvfs: the write itself says what fails
    if free >= PLENTY:
        return  # no row is that large (MAX_ROW_BYTES is half of it): not worth serializing the row to measure it
    need = len(json.dumps(row, indent=1, allow_nan=True)) + ROOM_MARGIN
    if free >= need:
        return
    own = journal.size()
    if own and free + own >= need:
        journal.discard()
        warn(f"{journal.folder}: this fit's journal ({_size(own)}) is removed to make room for its row")
        return
    raise DatabaseError(
        f"cannot write a row into {rows}: {_size(free)} free, the row needs {_size(need)}; free some space, "
        "pass another --db, or --no-save",
        folder=rows,
    )


def _naming_journals(exc: DatabaseError, db: Path) -> DatabaseError:
    """`exc`, its message naming rows/.partial and how to clear it when journals take space there."""
    from ..database.store import ROWS_DIR
    from ..record.journal import PARTIAL_DIR, folder_bytes

    partial = db / ROWS_DIR / PARTIAL_DIR
    held = folder_bytes(partial)
    if not held:
        return exc
    message = (
        f"{exc}; {partial} holds {_size(held)} of journals of interrupted fits: `weightdiag db journals --db {db}` "
        f"lists them, `weightdiag db gc --db {db}` removes the stale ones (--all: every one not being fitted)"
    )
    named = DatabaseError(message, folder=exc.folder)
    named.unsaved_row = exc.unsaved_row
    return named


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def open_journal(plan: ModelPlan, reader: Reader, options: FitOptions, db: Path) -> Journal:
    """The journal of this fit, beside the row it will write (rows/.partial/<row file name>/)."""
    from ..database.store import ROWS_DIR, identity_stub, row_file
    from ..source.local import content_fingerprint

    # Named as the row will be (a local checkpoint by its fingerprint): fits of two folders of one name never
    # share a journal.
    fingerprint = f"local-{content_fingerprint(plan)}" if plan.source == "local" else None
    stub = identity_stub(
        plan.model_id,
        plan.revision,
        options.protocol,
        fingerprint=fingerprint,
        center=options.center,
        include=options.include,
        exclude=options.exclude,
    )
    # The reader checks shards by sha256 while streaming (whole shards read): only verified ones are reused.
    verifies = reader.regions() is not None and not (options.include or options.exclude)
    return Journal.for_row(db / ROWS_DIR, row_file(db, stub).name, plan, resume_options(options), verifies)


def resolve_row(
    spec: str,
    db_dir: str | Path | None = None,
    options: FitOptions | None = None,
    progress: Progress | None = None,
    *,
    token: str | None = None,
    download: bool = False,
    save: bool = True,
    reuse: bool = True,
) -> tuple[Row, str]:
    """A row for `spec`, and where it came from.

    A `.json` file is read as a row; a cohort entry id gives the shipped row. A local model is
    always fitted (its files may have changed since any earlier row). A Hub id reuses a row of the
    database fitted on the same commit with the same --include/--exclude when `reuse` is set, else
    it is fitted. Fresh fits are saved unless save=False. Without `reuse` (check: always afresh) an
    interrupted fit's journal is not resumed either.
    """
    from ..database.store import (
        DEFAULT_REVISION,
        cohort_entry,
        find_rows,
        fit_variant,
        load_row,
        local_row,
        missing_database,
        revision_needed,
    )

    options = options or FitOptions()
    check_options(options)
    db = Path(db_dir) if db_dir else default_db_dir()
    # A database folder named (--db, WEIGHTDIAG_DB) but not there holds no row: where a row was to be read from it,
    # say so rather than "not found" (a fresh fit saved into it still creates it).
    no_database = missing_database(Path(db_dir) if db_dir else None)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".json":
        return load_row(path), "row file"
    if not path.exists():
        entry = cohort_entry(spec)  # the same naming rule as `db show`: exact id first
        if entry is not None:
            return entry, "cohort"
        # A name `db list` shows for a local fit: never a Hub id to fetch. Looked for among the summaries of
        # the rows filed under that id; the one found is read whole.
        named = list(iter_summaries(db, model_id=spec.split("@", 1)[0])) if no_database is None else []
        fitted = local_row(spec, rows=[row for _, row in named])
        if fitted is not None:
            return load_row(next(p for p, row in named if row is fitted)), "database"
    try:
        plan, reader = open_named(spec, db, model_id=options.model_id, token=token, download=download)
    except (HubUnreachableError, NotCachedError, RepoNotFoundError) as exc:
        if no_database is not None and not path.exists():  # a name only the database could have answered
            raise no_database from None
        # Offline: a Hub model's newest full row in the database answers for it (its commit unchecked).
        if isinstance(exc, RepoNotFoundError) or not reuse or path.exists():
            raise
        named = list(iter_summaries(db, model_id=spec.split("@", 1)[0]))
        rows = [
            r
            for r in find_rows(spec, protocol=options.protocol, rows=[r for _, r in named])
            if not fit_variant(r) and holds_spectra_asked(r, options.spectrum, options.farms)
        ]
        if not rows:
            raise
        if "@" not in spec:  # ORG/NAME means main: never the newest row of another revision (issue 33)
            main = [r for r in rows if r["model"].get("revision") == DEFAULT_REVISION]
            if not main:
                others = {f"{spec}@{r['model'].get('revision')}" for r in rows}
                raise revision_needed(
                    spec,
                    others,
                    f"the Hub is unreachable and the database holds no row of main, only of {len(others)} "
                    f"other revision{'s' if len(others) > 1 else ''}",
                ) from None
            rows = main
        return load_row(next(p for p, r in named if r is rows[-1])), "database (the Hub is unreachable)"
    if reuse and plan.source == "hub" and plan.commit:
        named = list(iter_summaries(db, model_id=plan.model_id))
        rows = [row for _, row in named]
        for row in reversed(find_rows(plan.model_id, protocol=options.protocol, rows=rows, db_dir=db)):
            run = row.get("run") or {}
            same_selection = run.get("include", []) == list(options.include) and run.get("exclude", []) == list(
                options.exclude
            )
            spectra = holds_spectra_asked(row, options.spectrum, options.farms)  # else fitted again with them
            if row["model"].get("commit") == plan.commit and same_selection and spectra:
                reader.close()
                return load_row(next(p for p, r in named if r is row)), "database"
    row, _ = fit_and_save(plan, reader, options, progress, db if save else None, fresh=not reuse)
    return row, "fitted"

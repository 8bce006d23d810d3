"""Sweep a training run: fit every selected checkpoint revision into the database, resumably.

A run is a Hub repo whose branches are checkpoints (Pythia's `step*`) or a local folder of
checkpoint folders (`step_*`, `checkpoint-*`, ... or a glob). Before any weight byte is read,
revisions whose files are identical (same LFS object ids on the Hub; the very same files on disk)
are grouped: one is fitted and the others get a copy of its row, flagged `duplicate_of`. A revision
that already has a row in the database is skipped, so an interrupted sweep (Ctrl-C, kill -9) is
resumed by running it again; rows are written atomically, so no partial row is ever seen and
several workers (processes, Ray tasks) can share one database folder.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from .. import settings
from ..database.store import (
    ROWS_DIR,
    check_writable,
    claim,
    clean_stale_temps,
    identity_stub,
    iter_summaries,
    load_row,
    row_file,
    write_row,
)
from ..diagnose.lambda_axis import step_from_revision
from ..diagnose.spectrum import holds_spectra_asked
from ..errors import (
    BadInputError,
    DatabaseError,
    HubUnreachableError,
    ModelPathError,
    NotCachedError,
    OptionError,
    RevisionNotFoundError,
    WeightdiagError,
    param,
)
from ..executor import Executor
from ..progress import Progress, Relay

LOCAL_PATTERNS = ("step*", "checkpoint-*", "checkpoint_*", "global_step*", "iter_*", "epoch*")


@dataclass
class Revision:
    name: str  # branch / tag name, or the checkpoint folder's name
    step: int | None
    spec: str  # what api.open_model takes: "org/name@rev" or a folder path
    commit: str | None = None
    identity: tuple[str, ...] | None = None  # content identity known without reading weights

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    revision: str
    status: str  # fitted | reused | existing | claimed (another sweep is fitting it) | failed
    seconds: float = 0.0
    detail: str = ""
    row_path: str | None = None
    ffn_median_k: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --- listing revisions ---------------------------------------------------------------------------


def _order(revisions: list[Revision]) -> list[Revision]:
    return sorted(revisions, key=lambda r: (r.step is None, r.step if r.step is not None else 0, r.name))


def hub_revisions(repo: str, token: str | None = None) -> list[Revision]:
    """Every branch of a Hub repo (tags too), ordered by training step."""
    from ..source.hub import list_refs  # timeouts, an overall deadline and malformed answers handled there

    if settings.hf_offline():  # the list of revisions lives on the Hub only; the cache keeps no list of them
        raise NotCachedError(
            f"{repo}: sweep lists the repo's revisions on the Hub, which HF_HUB_OFFLINE forbids; unset it, or name "
            "cached revisions with --revisions a,b (read from the local HF cache)",
            repo=repo,
            revision=None,
        )
    try:
        refs = list_refs(repo, token)
    except HubUnreachableError as exc:  # its advice (HF_HUB_OFFLINE=1) would not list them either (issue 21)
        raise HubUnreachableError(
            f"{exc.message.split(';')[0]}; sweep lists {repo}'s revisions there: check the network, or with "
            "HF_HUB_OFFLINE=1 name cached revisions with --revisions a,b (or sweep a local folder of checkpoints)",
            endpoint=exc.endpoint,
            repo=repo,
        ) from None
    revisions = [Revision(name, step_from_revision(name), f"{repo}@{name}", commit=commit) for name, commit in refs]
    return _order(revisions)


def local_revisions(folder: Path, glob: str | None = None) -> list[Revision]:
    """Checkpoint sub-folders of a run folder (by pattern, or an explicit glob)."""
    if not folder.is_dir():
        raise ModelPathError(
            f"{folder}: not a folder; give a folder of checkpoint folders or a Hub repo id", path=folder
        )
    patterns = (glob,) if glob else LOCAL_PATTERNS
    found: dict[str, Path] = {}
    for pattern in patterns:
        for path in folder.glob(pattern):
            if path.is_dir():
                found[path.name] = path
    if not found:
        raise ModelPathError(
            f"{folder}: no checkpoint folders ({', '.join(patterns)}); "
            "name them step_N or checkpoint-N, or pass --glob",
            path=folder,
        )
    return _order([Revision(name, step_from_revision(name), str(path)) for name, path in found.items()])


# --- choosing ----------------------------------------------------------------------------------------


# sweep's `steps` picks checkpoints; FitOptions' `steps` are the training steps done: two flags (errors.param).
_STEPS = param("sweep.steps")


def select(
    revisions: list[Revision],
    *,
    names: Iterable[str] | None = None,
    steps: str | None = None,
    everything: bool = False,
    repo: str | None = None,
) -> list[Revision]:
    """--revisions a,b,c | --steps log:N | --steps a,b,c | --all. `repo`: the Hub repo the revisions are of, where a
    revision it lacks is RevisionNotFoundError (exit 3), as for `fit ORG/NAME@REV`; a local run's, OptionError."""
    if everything:
        return revisions
    by_name = {r.name: r for r in revisions}
    if names:
        wanted = [n.strip() for n in names if n.strip()]
        missing = [n for n in wanted if n not in by_name]
        if missing:
            _missing(missing[0], revisions, repo, "revisions")
        return _order([by_name[n] for n in wanted])
    stepped = [r for r in revisions if r.step is not None]
    if not stepped:
        raise OptionError(
            f"no step-numbered revisions to choose from; use {param('revisions')} or {param('everything')}",
            param="steps",
        )
    spec = steps or "log:14"
    if spec.startswith("log:"):
        try:
            count = int(spec[4:])
        except ValueError:
            raise OptionError(f"{_STEPS} {spec!r}: expected log:N (N log-spaced steps)", param="steps") from None
        return _order(_log_spaced(stepped, count))
    try:
        targets = [int(s) for s in spec.split(",")]
    except ValueError:
        raise OptionError(
            f"{_STEPS} {spec!r}: expected log:N or a comma-separated list of steps", param="steps"
        ) from None
    chosen = []
    for t in targets:
        match = [r for r in stepped if r.step == t]
        if not match:
            if repo is not None:  # the Hub's revision stepN (fit's name for it), as --revisions stepN says
                _missing(f"step{t}", revisions, repo, "steps")
            raise OptionError(f"{_STEPS}: step {t} does not exist; available: {_preview(stepped)}", param="steps")
        chosen.append(match[0])
    return _order(chosen)


def _missing(name: str, revisions: list[Revision], repo: str | None, option: str) -> NoReturn:
    """A revision asked for that the run lacks: on the Hub the error `fit ORG/NAME@REV` gives (exit 3, the nearest
    ones named); in a local run folder, an option naming no checkpoint folder (exit 2)."""
    from ..source.hub import nearest_revisions

    names = [r.name for r in revisions]
    if repo is not None:
        raise RevisionNotFoundError(
            f"{repo}: revision {name!r} not found{nearest_revisions(name, names)}", repo=repo, revision=name
        )
    raise OptionError(
        f"revision {name!r} does not exist (no such checkpoint folder){nearest_revisions(name, names)}",
        param="revisions" if option == "revisions" else "sweep.steps",
    )


def _log_spaced(stepped: list[Revision], count: int) -> list[Revision]:
    """`count` revisions spread evenly in log(step): step 0 (if any), the last, and log-spaced between."""
    if count < 2:
        raise OptionError(f"{_STEPS} log:N needs N >= 2", param="steps")
    positive = [(r.step, r) for r in stepped if r.step and r.step > 0]
    chosen: dict[str, Revision] = {}
    zero = [r for r in stepped if r.step == 0]
    if zero:
        chosen[zero[0].name] = zero[0]
    if positive:
        lo, hi = math.log(positive[0][0]), math.log(positive[-1][0])
        slots = count - len(chosen)
        for i in range(slots):
            target = lo + (hi - lo) * i / max(slots - 1, 1)
            _, best = min(positive, key=lambda sr: abs(math.log(sr[0]) - target))
            chosen[best.name] = best
    return list(chosen.values())


def _preview(revisions: list[Revision]) -> str:
    names = [r.name for r in revisions]
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")


# --- content identity (before any weight byte is read) -----------------------------------------


def hub_identity(repo: str, revision: Revision, token: str | None = None) -> tuple[str, ...]:
    from ..source.hub import model_info

    info = model_info(repo, revision.commit or revision.name, token)
    revision.commit = info.sha
    weights = sorted(
        (s.rfilename, s.lfs.sha256 if s.lfs else (s.blob_id or ""))
        for s in info.siblings or []
        if re.search(r"\.(safetensors|bin|gguf)$", s.rfilename)
    )
    return tuple(f"{name}:{oid}" for name, oid in weights) or (f"commit:{info.sha}",)


def local_identity(folder: Path) -> tuple[str, ...]:
    """The weight files themselves (device, inode, size): symlinked or hard-linked copies are identical."""
    out = []
    for path in sorted(folder.iterdir()):
        if re.search(r"\.(safetensors|bin|gguf)$", path.name):
            st = path.stat()  # follows symlinks: HF-cache style links to one blob are the same content
            out.append(f"{path.name}:{st.st_dev}:{st.st_ino}:{st.st_size}")
    return tuple(out)


# --- running -----------------------------------------------------------------------------------------


def row_path(db: Path, model_id: str, revision: str, protocol: str, options: dict[str, Any] | None = None) -> Path:
    """Where the row of this revision, fitted with these options (--center, --include/--exclude), is."""
    options = options or {}
    stub = identity_stub(
        model_id,
        revision,
        protocol,
        center=bool(options.get("center")),
        include=options.get("include") or (),
        exclude=options.get("exclude") or (),
    )
    return row_file(db, stub)  # rows written under the old lossy names count too


def fit_revision(task: dict[str, Any]) -> dict[str, Any]:
    """Fit one revision and write its row (runs in worker processes and Ray tasks: plain dicts in and out),
    unless another sweep holds its claim or has written it meanwhile."""
    started = time.perf_counter()
    target = row_path(
        Path(task["db"]),
        task["model_id"],
        task["revision"],
        task["options"].get("protocol", "hist1024"),
        task["options"],
    )
    with claim(target) as holder:
        if holder is not None:  # another sweep of this run is fitting it now: the work is shared, not doubled
            return asdict(Outcome(task["revision"], "claimed", detail=f"being fitted by another sweep ({holder})"))
        with contextlib.suppress(BadInputError):
            row = load_row(target)  # written by another sweep since this one looked
            asked = task["options"].get("spectrum", False), task["options"].get("farms", False)
            if holds_spectra_asked(row, *asked):  # else fitted again: the row lacks the spectra asked for
                return asdict(
                    Outcome(task["revision"], "existing", row_path=str(target), detail="row already in the database")
                )
        return _fit_claimed(task, started)


def _fit_claimed(task: dict[str, Any], started: float) -> dict[str, Any]:
    from ..diagnose.functions import ffn_median_k
    from .fitting import fit_and_save, open_model
    from .measure import FitOptions, execution_for

    try:
        options = FitOptions(**task["options"])
        with settings.hf_cache_given(task.get("hf_cache")):  # the sweep's --cache-dir (a worker process too)
            plan, reader = open_model(
                task["spec"], model_id=task["model_id"], token=task.get("token"), download=task.get("download", False)
            )
        plan.model_id = task["model_id"]
        plan.revision = task["revision"]
        # with its journal: a revision cut off resumes next time; with its share of the cores (the task's)
        execution = execution_for(options, threads=task.get("threads"))
        row, path = fit_and_save(plan, reader, options, _named_progress(task), Path(task["db"]), execution=execution)
        return asdict(
            Outcome(
                task["revision"],
                "fitted",
                time.perf_counter() - started,
                row_path=str(path),
                ffn_median_k=ffn_median_k(row),
            )
        )
    except DatabaseError as exc:  # the database cannot take rows (a full disk): the sweep stops at this one
        return asdict(
            Outcome(
                task["revision"],
                "failed",
                time.perf_counter() - started,
                detail=exc.message,
                extra={"write_failed": True},
            )
        )
    except WeightdiagError as exc:
        return asdict(Outcome(task["revision"], "failed", time.perf_counter() - started, detail=exc.message))
    except Exception as exc:  # one bad checkpoint must not stop the sweep; its reason is reported
        return asdict(
            Outcome(
                task["revision"],
                "failed",
                time.perf_counter() - started,
                detail=f"internal error: {type(exc).__name__}: {exc}",
            )
        )


def _rows_by_files(
    db: Path, plan: SweepPlan, protocol: str, options: dict[str, Any]
) -> dict[tuple[str, ...], tuple[Path, str]]:
    """The database's rows of this run, fitted as this sweep fits (protocol, variant, spectra), by the identity of
    their weight files (name:sha256, as hub_identity names a revision's): a revision whose files a row already
    holds is that row again (issue 42: the sweep deduplicated only within itself, and fitted it again)."""
    found: dict[tuple[str, ...], tuple[Path, str]] = {}
    for path, summary in iter_summaries(db, on_skip=lambda _: None, model_id=plan.model_id):
        model, files = summary["model"], summary.get("files") or []
        revision = model.get("revision")
        if model["id"] != plan.model_id or not revision:
            continue
        shas = [f.get("sha256") for f in files]
        if not files or not all(isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) for sha in shas):
            continue
        if path.name != row_path(db, plan.model_id, revision, protocol, options).name:  # another protocol or variant
            continue
        if not holds_spectra_asked(summary, options.get("spectrum", False), options.get("farms", False)):
            continue
        identity = tuple(f"{f['name']}:{f['sha256']}" for f in sorted(files, key=lambda f: f["name"]))
        found.setdefault(identity, (path, summary.get("duplicate_of") or revision))
    return found


def reuse_row(source: Path, revision: Revision, original: str, db: Path, options: dict[str, Any]) -> Path:
    """Write the row of `original` again for a revision with identical files, flagged as a duplicate."""
    from ..diagnose.lambda_axis import resolve

    row = load_row(source)
    row["model"]["revision"] = revision.name
    row["model"]["commit"] = revision.commit or row["model"].get("commit")
    row["duplicate_of"] = original
    row["hyperparameters"] = resolve(
        row["model"]["id"],
        revision.name,
        lr=options.get("lr"),
        weight_decay=options.get("weight_decay"),
        steps=options.get("steps"),
        preset=options.get("preset"),
    ).to_json()
    return write_row(row, db)


Runner = Callable[[list[dict[str, Any]]], Iterable[dict[str, Any]]]


PARENT_POLL_SECONDS = 0.5


def start_worker(parent: int) -> None:
    """A sweep worker's start: a watch on the sweep that started it."""
    watch_parent(parent)


def watch_parent(parent: int) -> None:
    """In a sweep worker: exit at once when the sweep that started it is gone (killed with -9, or ended
    before it could stop its workers), instead of fitting on, re-parented, and writing rows nobody asked
    for. A thread polls the parent pid: portable, and unlike PR_SET_PDEATHSIG not tied to the thread that
    happened to spawn the worker."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="weightdiag-parent-watch", daemon=True).start()


class _Named(Relay):
    """The sweep's Progress (serial sweeps only), each fit's bar named by the revision being fitted."""

    def __init__(self, inner: Progress, name: str) -> None:
        super().__init__(inner)
        self.name = name

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        self.inner.started(self.name, tensors, nbytes)


def _named_progress(task: dict[str, Any]) -> Progress | None:
    """The task's progress (serial sweeps only), its bar named by the revision being fitted."""
    inner = task.get("progress")
    return _Named(inner, f"{task['model_id']}@{task['revision']}") if inner is not None else None


def serial_runner(tasks: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for task in tasks:
        yield fit_revision(task)


def start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (before the pool would) with SIGHUP blocked, as it already
    blocks SIGINT and SIGTERM: a closed terminal hangs up the whole process group, and a tracker killed by it
    is relaunched by the sweep, which prints its warnings and tracebacks below the one line that says the sweep
    stopped. The blocked mask is inherited across exec; the tracker still ends when the sweep does."""
    import signal
    from multiprocessing import resource_tracker

    hangup = getattr(signal, "SIGHUP", None)
    if hangup is None or not hasattr(signal, "pthread_sigmask"):  # Windows: no SIGHUP, no tracker process
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {hangup})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {hangup})


def process_runner(jobs: int) -> Runner:
    def run(tasks: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        # Each worker reduces with its share of the cores (its tasks say how many).
        ctx = mp.get_context("spawn")
        threads = settings.worker_threads(jobs)
        start_resource_tracker()
        pool = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=start_worker, initargs=(os.getpid(),))
        finished = broken = False
        try:
            futures = {pool.submit(fit_revision, {**t, "threads": threads}): t for t in tasks}
            for future in as_completed(futures):
                try:
                    result = future.result()
                except BrokenProcessPool:
                    # A worker was killed (the OOM killer, kill -9): the pool ends its other workers and runs
                    # nothing more. Each revision not done fails with the reason (exit 4); its journal is kept.
                    broken = True
                    result = asdict(
                        Outcome(
                            futures[future]["revision"],
                            "failed",
                            detail="a worker process of the sweep was killed (out of memory? kill -9) before this "
                            "revision's row was written; run the sweep again to resume",
                        )
                    )
                yield result
            finished = True
        finally:
            # Ctrl-C (or an error) stops the sweep: queued revisions are cancelled and the workers end now,
            # so no row is written after the interrupt (a killed worker's temporary file is removed once it is
            # gone; the rerun resumes from the rows already there and the journals of the revisions cut off).
            if not finished:
                for worker in list(getattr(pool, "_processes", {}).values()):
                    worker.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            if broken or not finished:  # the workers are gone: remove the temporary row files they were writing
                for folder in {Path(t["db"]) / ROWS_DIR for t in tasks}:
                    clean_stale_temps(folder)

    return run


def cluster_runner(executor: Executor) -> Runner:
    """Each revision's fit a task on the cluster (in whatever order they end: each writes its own row)."""

    def run(tasks: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
        try:
            # Task arguments live in the cluster's object store and dashboard: never ship a token there;
            # workers authenticate with their own HF_TOKEN or `hf auth login`.
            yield from executor.map_unordered(
                fit_revision, [{k: v for k, v in t.items() if k not in ("token", "hf_cache")} for t in tasks]
            )
        finally:
            executor.close()

    return run


@dataclass
class SweepPlan:
    model_id: str
    hub: bool
    revisions: list[Revision]


def plan_sweep(
    target: str,
    *,
    model_id: str | None = None,
    names: Iterable[str] | None = None,
    steps: str | None = None,
    everything: bool = False,
    glob: str | None = None,
    token: str | None = None,
) -> SweepPlan:
    from ..source.open import is_hub_id, split_revision

    path = Path(target).expanduser()
    if path.exists():
        revisions = local_revisions(path, glob)
        chosen = select(revisions, names=names, steps=steps, everything=everything)
        for r in chosen:
            r.identity = local_identity(Path(r.spec))
        return SweepPlan(model_id or path.resolve().name, False, chosen)
    if not is_hub_id(target) or "@" in target:
        raise ModelPathError(
            f"{target}: not a folder of checkpoints or a Hub repo id (ORG/NAME, without @REV)", path=target
        )
    repo, _ = split_revision(target)
    wanted = [n.strip() for n in names or () if n.strip()]
    if settings.hf_offline() and wanted and not everything:
        # Offline with the revisions named: nothing to list; each is read from the HF cache (NotCachedError, per
        # revision, when it is not there). Not deduplicated: that needs the Hub's file hashes.
        named = [Revision(n, step_from_revision(n), f"{repo}@{n}") for n in wanted]
        return SweepPlan(model_id or repo, True, _order(named))
    chosen = select(hub_revisions(repo, token), names=names, steps=steps, everything=everything, repo=repo)
    for r in chosen:
        r.identity = hub_identity(repo, r, token)
    return SweepPlan(model_id or repo, True, chosen)


CLAIM_POLL_SECONDS = 1.0  # how often a sweep looks again at the revisions another sweep claimed


def _await_claimed(
    tasks: list[dict[str, Any]],
    outcomes: dict[str, Outcome],
    report: Callable[[Outcome], None],
    existing: Callable[[str], Path | None],
) -> None:
    """The revisions another sweep claimed, once this sweep's own work is done: waited for until their row is
    written, or fitted here once the claim is given up (its sweep ended without the row, or was killed: a dead
    process's claim is taken over, store.claim). Never left out: a sweep that exits 0 has every row."""
    waiting = [t for t in tasks if outcomes[t["revision"]].status == "claimed"]
    while waiting:
        time.sleep(CLAIM_POLL_SECONDS)
        still = []
        for task in waiting:
            path = existing(task["revision"])
            if path is not None:
                report(Outcome(task["revision"], "existing", row_path=str(path), detail="fitted by another sweep"))
                continue
            outcome = Outcome(**fit_revision({k: v for k, v in task.items() if k != "progress"}))
            if outcome.status == "claimed":
                still.append(task)
            else:
                report(outcome)
        waiting = still


def run_sweep(
    plan: SweepPlan,
    db: Path,
    options: dict[str, Any],
    runner: Runner = serial_runner,
    *,
    token: str | None = None,
    download: bool = False,
    on_outcome: Callable[[Outcome], None] | None = None,
    progress: Progress | None = None,
) -> list[Outcome]:
    """Fit what is missing; reuse rows across identical revisions; return one outcome per revision. `progress`
    hears each fit's events (fit_plan's, the model named <id>@<revision>) when the revisions run one by one
    in this process (serial_runner): worker processes cannot call back."""
    db = db.resolve()
    check_writable(db)
    protocol = options.get("protocol", "hist1024")
    outcomes: dict[str, Outcome] = {}

    def report(outcome: Outcome) -> None:
        outcomes[outcome.revision] = outcome
        if on_outcome:
            on_outcome(outcome)

    def existing(rev: Revision) -> Path | None:
        path = row_path(db, plan.model_id, rev.name, protocol, options)
        try:
            row = load_row(path)
        except BadInputError:
            return None
        return path if holds_spectra_asked(row, options.get("spectrum", False), options.get("farms", False)) else None

    # One revision per content identity does the work; the others copy its row.
    leaders: dict[tuple[str, ...], Revision] = {}
    followers: list[tuple[Revision, Revision]] = []
    for rev in plan.revisions:
        key = rev.identity or (f"revision:{rev.name}",)
        if key in leaders:
            followers.append((rev, leaders[key]))
        else:
            leaders[key] = rev
    tasks = []
    twins = _rows_by_files(db, plan, protocol, options) if plan.hub else {}
    for rev in leaders.values():
        path = existing(rev)
        twin = twins.get(rev.identity or ())
        if path is not None:
            report(Outcome(rev.name, "existing", row_path=str(path), detail="row already in the database"))
        elif twin is not None:  # the same files as a revision fitted before, by an earlier sweep or fit
            written = reuse_row(twin[0], rev, twin[1], db, options)
            report(
                Outcome(
                    rev.name, "reused", row_path=str(written), detail=f"identical files to {twin[1]} (in the database)"
                )
            )
        else:
            tasks.append(
                {
                    "spec": rev.spec,
                    "model_id": plan.model_id,
                    "revision": rev.name,
                    "db": str(db),
                    "options": options,
                    "token": token,
                    "download": download,
                    "hf_cache": settings.hf_cache_dir(),  # --cache-dir, for worker processes (not cluster nodes)
                    **({"progress": progress} if progress is not None and runner is serial_runner else {}),
                }
            )
    for result in runner(tasks):
        outcome = Outcome(**result)
        report(outcome)
        if outcome.extra.get("write_failed"):  # stop at the first row that could not be written
            kept = [o.revision for o in outcomes.values() if o.status in ("fitted", "existing", "reused")]
            raise DatabaseError(
                f"{outcome.detail}; the sweep stopped at {outcome.revision}: {len(kept)} rows are in the database"
                + (f" ({', '.join(kept[:5])}{', ...' if len(kept) > 5 else ''})" if kept else "")
                + "; free space or pass another --db, then run it again to go on",
                folder=db,
            )
    _await_claimed(tasks, outcomes, report, lambda name: existing(Revision(name, None, name)))
    for rev, leader in followers:
        path = existing(rev)
        if path is not None:
            report(Outcome(rev.name, "existing", row_path=str(path), detail="row already in the database"))
            continue
        source = outcomes.get(leader.name)
        if source is not None and source.status == "claimed":
            report(Outcome(rev.name, "claimed", detail=f"identical to {leader.name}, which another sweep is fitting"))
            continue
        if source is None or source.row_path is None:
            report(Outcome(rev.name, "failed", detail=f"identical to {leader.name}, which failed"))
            continue
        written = reuse_row(Path(source.row_path), rev, leader.name, db, options)
        report(
            Outcome(
                rev.name,
                "reused",
                row_path=str(written),
                detail=f"identical files to {leader.name}",
                ffn_median_k=source.ffn_median_k,
            )
        )
    order = {r.name: i for i, r in enumerate(plan.revisions)}
    return sorted(outcomes.values(), key=lambda o: order.get(o.revision, 0))

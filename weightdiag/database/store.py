"""The database folder: rows as JSON files, written atomically, found by model and revision.

Layout under the database folder (default: settings.db_location, $WEIGHTDIAG_DB, else the nearest DATABASE folder
here or above, else the per-user data folder):
    rows/<model>@<revision>[.<protocol>][.centered][.sel-<hash>].json
        fitted rows: one per model, revision, protocol and fit variant (a --center fit, a fit restricted
        by --include/--exclude: never in place of the full fit, and named by id only when there is none)
    rows/.index.sqlite   each row file's content hash, identity and summary: the row less its
        per-matrix records (see index.py and iter_summaries)
Each name part is the readable slug of the id ('EleutherAI/pythia-70m' -> 'EleutherAI--pythia-70m'),
followed by '~' and 12 hex digits of the sha256 of the exact text whenever the slug alone would not
give the text back (other characters, '--' in the id, non-ASCII, too long): distinct ids never share
a file, and names stay bounded (MAX_ROW_NAME bytes). Rows written under the earlier, lossy names
stay readable (readers take the id from inside the row) and are replaced by the next fit of the
same model.
A reader never sees a half-written row: rows are written to a temporary file in the same folder
(.<name>.<host>-<pid>.<random>.tmp), flushed to disk, then renamed over the final name (atomic on
POSIX). Temporary files left by a killed writer are removed by the next write.

Rows are read by weightdiag.record.schema.read_row (regular files only, every field checked): a foreign or
damaged file in rows/ is skipped by listings (iter_rows, all_rows; `on_skip` hears about each one) and
refused with RowError (exit 2) when it is named.

Naming a row (row_by_id, `weightdiag db show ID`), first rule that applies:
  1. a path to a file: that file;
  2. a row file's name (`NAME.json`, as in rows/): that file of the database;
  3. a cohort or companion entry id, exactly (`qwen3-8b` is DATABASE_v9_1's, `Qwen3-8B` the companion's);
  4. a fitted model id, id@revision or id@fingerprint, exactly: the newest such row (a bare id of local
     checkpoints with different contents, folders that share a name, is refused listing their names; a bare
     id of rows of several revisions names main's, else is refused listing a few: meant_revision);
  5. (a damaged row whose model.id is exactly ID: refused with its RowError, exit 2);
  6. the same names ignoring case, when they name one entry or one fitted model; when they name
     several, AmbiguousRowError (exit 2) lists them;
  7. else RowNotFoundError (exit 2).
Every id `db list` prints is found by rule 3 or 4; a fitted row whose id is also a cohort entry's is named
by id@revision (or @fingerprint) or by its file name.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import re
import secrets
import sys
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import settings, tuning
from ..errors import BadInputError, DatabaseError
from ..record.schema import Row, RowError, _read_regular, read_row
from ..record.schema import load_row as _check_row
from .index import INDEX_NAME, Entry, RowIndex

if TYPE_CHECKING:  # the type only: diagnose is not imported when the database is opened
    from ..diagnose.results import FlatRecord

ROWS_DIR = "rows"
ENV_DB = "WEIGHTDIAG_DB"


def default_db_dir() -> Path:
    return Path(settings.db_dir())


def slug(text: str) -> str:
    """File-name-safe form of a model id or revision ('EleutherAI/pythia-70m' -> 'EleutherAI--pythia-70m').

    Lossy ('team/llama' and 'team--llama' give the same slug): row names add a hash where it is (name_part).
    """
    text = text.replace("/", "--")
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text).strip("._") or "_"


HASH_CHARS = 12  # 48 bits of sha256: only ids with the same readable stem compete
ID_BYTES = 80  # readable stem of the model id, in UTF-8 bytes
REVISION_BYTES = 64  # a 40-hex commit fits whole
# <id stem>~<hash>@<revision stem>~<hash>.<protocol>.json, with room for the temporary-file decorations
# (1 + 8 + 1 + 10 + 1 + 8 + 4 bytes) below the 255-byte NAME_MAX of common file systems.
MAX_ROW_NAME = 200
INDEX_BATCH = 128  # index entries read per query where every row's is wanted (iter_lineage)
STALE_TEMP_SECONDS = 600.0  # an untagged temporary row file (no host named: older versions) this old is abandoned
# The protocol suffix follows the revision: a plain revision may not end like one (fit.PROTOCOLS,
# not imported: it pulls in numpy, and `db list` needs none).
_PROTOCOL_SUFFIXES = (".hist1024", ".exact")
_RESERVED_ENDINGS = (*_PROTOCOL_SUFFIXES, ".centered")  # a revision's name part never ends like these
_VARIANT_ENDING = re.compile(r"\.sel-[0-9a-f]{8}$")
TEST_WRITE_DELAY_ENV = "WEIGHTDIAG_TEST_ROW_WRITE_DELAY"  # test-only: seconds between temp write and rename


@functools.cache
def _unicode_names() -> bool:
    # Letters of any script stay readable where file names are UTF-8; elsewhere they would not encode.
    return sys.getfilesystemencoding().lower().replace("-", "") == "utf8"


def _stem(text: str, limit: int) -> str:
    """The readable part of a name: slug(), keeping letters and digits of any script, at most `limit` bytes."""
    unicode_ok = _unicode_names()
    text = unicodedata.normalize("NFC", text.replace("/", "--"))
    kept = "".join(
        ch
        if (ch.isascii() and (ch.isalnum() or ch in "._+-")) or (unicode_ok and not ch.isascii() and ch.isalnum())
        else "_"
        for ch in text
    ).strip("._")
    raw = kept.encode("utf-8")
    if len(raw) > limit:
        kept = raw[:limit].decode("utf-8", "ignore").rstrip("._")
    return kept or "_"


def name_part(text: str, limit: int, reserved_endings: tuple[str, ...] = ()) -> str:
    """`text` as one part of a row file name, injective: the slug when it gives `text` back, else slug~hash."""
    stem = _stem(text, limit)
    if stem.replace("--", "/") == text and not stem.endswith(reserved_endings):
        return stem
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{stem}~{digest}"


# What names a row's file: a Row, or a stub with just the keys that name it (model, protocol, run).
RowIdentity = Mapping[str, Any]


def _identity(row: RowIdentity) -> tuple[str, str, str]:
    model = row["model"]
    revision = model.get("revision") or model.get("fingerprint") or "unknown"
    return str(model["id"]), str(revision), str(row["protocol"]["name"])


def identity_stub(
    model_id: str,
    revision: str | None,
    protocol: str,
    *,
    fingerprint: str | None = None,
    center: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> dict[str, Any]:
    """The fields of a row that name it (row_filename, fit_variant), before the row exists: where a fit
    will write its row, and where its journal goes."""
    return {
        "model": {"id": model_id, "revision": revision, "fingerprint": fingerprint},
        "protocol": {"name": protocol, "centered": bool(center)},
        "run": {"include": list(include), "exclude": list(exclude)},
    }


def fit_variant(row: RowIdentity) -> str:
    """'' for a full fit of |w|; else what sets the row apart: '.centered' (--center), '.sel-<8 hex>' (a fit
    restricted by --include/--exclude: the hash of the sorted patterns). Such rows never replace, nor stand
    for, the model's full fit."""
    run = row.get("run") or {}
    include, exclude = sorted(run.get("include") or []), sorted(run.get("exclude") or [])
    variant = ".centered" if (row.get("protocol") or {}).get("centered") else ""
    if include or exclude:
        patterns = json.dumps({"include": include, "exclude": exclude}, sort_keys=True)
        variant += f".sel-{hashlib.sha256(patterns.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    return variant


def row_filename(row: RowIdentity) -> str:
    """rows/ file name of a row: one per (model id, revision or fingerprint, protocol, fit variant), never
    shared."""
    model_id, revision, protocol = _identity(row)
    suffix = "" if protocol == "hist1024" else f".{name_part(protocol, 16)}"
    rev = name_part(revision, REVISION_BYTES, _RESERVED_ENDINGS)
    if _VARIANT_ENDING.search(rev):  # a revision that ends like a variant: hashed, so that names stay unique
        rev = name_part(revision + "\0", REVISION_BYTES, _RESERVED_ENDINGS)
    return f"{name_part(model_id, ID_BYTES)}@{rev}{suffix}{fit_variant(row)}.json"


def legacy_row_filename(row: RowIdentity) -> str:
    """The name earlier versions gave a row (lossy: slugs only, unbounded): such rows are still found and replaced."""
    model_id, revision, protocol = _identity(row)
    suffix = "" if protocol == "hist1024" else f".{protocol}"
    return f"{slug(model_id)}@{slug(revision)}{suffix}.json"


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


@functools.cache
def _host_tag() -> str:
    # Temporary names carry host and pid: a pid means something only on the host (and in the pid namespace:
    # containers may share a hostname) that wrote it, as in a database folder shared between machines.
    ident = os.uname().nodename
    with contextlib.suppress(OSError):
        ident += f":{os.stat('/proc/self/ns/pid').st_ino}"
    return hashlib.sha256(ident.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{_host_tag()}-{os.getpid()}."


def write_text_atomic(path: Path, text: str, before_rename: Callable[[], None] | None = None) -> os.stat_result:
    """Write text so that `path` holds either the old content or the complete new one; the stat of the file
    written (taken before the rename, which keeps it: whatever `path` holds later is that file only while it
    has the same stat)."""
    import tempfile  # here: tempfile (and random) cost ~3 ms at start-up and --no-save runs never write

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; rows are shared files like any other
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
            written = os.fstat(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
        return written
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, document: Any) -> None:
    write_text_atomic(path, json.dumps(document, indent=1, allow_nan=False) + "\n")


_TEMP_NAME = re.compile(r"^\..+\.json\.(?:(?P<host>[0-9a-f]{8})-(?P<pid>[0-9]{1,10})\.)?[A-Za-z0-9_]+\.tmp$")


def _pid_alive(pid: int) -> bool:
    if pid < 1:  # 0 and -1 would signal a process group, or every process: never one process
        return False
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except (ProcessLookupError, OverflowError):  # gone, or a number no process has (beyond pid_t)
        return False
    except PermissionError:  # another user's process
        return True
    return True


# A claim's holder touches it every heartbeat_seconds while it fits; a claim of another host that nobody has seen
# change for claim_silent_seconds (both in weightdiag.tuning) is given up as its holder's. One of this host is
# judged by its pid.
CLAIMS_DIR = ".claims"  # rows/.claims/<row file name>: a sweep fitting that row now (two sweeps share the work)
# What this process has seen of other hosts' claims: claim path -> (what it looked like, monotonic time first seen so)
_claims_seen: dict[str, tuple[tuple[object, ...], float]] = {}


@contextlib.contextmanager
def claim(path: Path) -> Iterator[str | None]:
    """Claim the row at `path` for this process while it is fitted: yields None when claimed, else who holds
    it (another live process on this host, or a claim of another host still beating). A claim whose process
    is gone (this host), or one of another host seen unchanged for claim_silent_seconds (weightdiag.tuning), is
    taken over. Best effort: a database where no claim can be made is fitted unclaimed. While held, a thread
    touches the claim every heartbeat_seconds, so that sweeps on other hosts can tell a live claim from a dead
    one without comparing clocks."""
    target = path.parent / CLAIMS_DIR / path.name
    holder, held = _take_claim(target)
    if holder is not None:
        yield holder
        return
    import threading

    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(target, stop), name="weightdiag-claim", daemon=True)
    if held:
        beat.start()
    try:
        yield None
    finally:
        if held:
            stop.set()
            beat.join()
            if _claim_is_mine(target):  # a claim taken over meanwhile is the other's to release
                with contextlib.suppress(OSError):
                    target.unlink()


def _claim_is_mine(target: Path) -> bool:
    try:
        holder = json.loads(target.read_text())
        return bool(holder["host"] == _host_tag() and int(holder["pid"]) == os.getpid())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _heartbeat(target: Path, stop: Any) -> None:
    """Touch the claim while it is ours: its mtime changes at every beat (set, not compared: any clock will do)."""
    last = 0
    while not stop.wait(tuning.current().heartbeat_seconds):
        if not _claim_is_mine(target):
            return
        last = max(time.time_ns(), last + 1)  # strictly new at each beat, even if this host's clock steps back
        with contextlib.suppress(OSError):
            os.utime(target, ns=(last, last))


def _take_claim(target: Path) -> tuple[str | None, bool]:
    """(who else holds `target`, whether this process now holds it); (None, False) when no claim can be made."""
    mine = json.dumps({"host": _host_tag(), "pid": os.getpid(), "time": time.time()})
    # The claim appears whole or not at all: written under a private name, then hard-linked into place (link
    # fails when the name exists). A claim created empty and written after could be read empty by the other
    # sweep in between, taken for stale and replaced: both would fit the row.
    staged = target.parent / f".{target.name}.{_host_tag()}-{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staged.write_text(mine)
        for _ in range(2):
            try:
                os.link(staged, target)
            except FileExistsError:
                holder = _live_claim(target)
                if holder is not None:
                    return holder, False
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()  # stale: its process is gone, or it stopped beating
                continue
            return None, True
    except OSError:
        pass  # no links or no writes here: fitted unclaimed
    finally:
        with contextlib.suppress(OSError):
            staged.unlink()
    return None, False


def _live_claim(target: Path) -> str | None:
    """Who holds the claim in `target`, when that process may still be at work; None when it is stale."""
    try:
        text = target.read_text()
        st = os.stat(target)
        holder = json.loads(text)
        host, pid = holder["host"], int(holder["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # unreadable: being written this instant, or damaged; treated as stale
    if host == _host_tag():
        return f"pid {pid}" if _pid_alive(pid) else None
    # Another host: alive while it beats. Its times are compared only with themselves (changed or not since this
    # process first saw them), never with this host's clock: clocks of hosts sharing a database may disagree.
    looks = (text, st.st_ino, st.st_size, st.st_mtime_ns)
    now = time.monotonic()
    seen = _claims_seen.get(str(target))
    if seen is None or seen[0] != looks:
        _claims_seen[str(target)] = (looks, now)
        return f"another host (pid {pid})"
    if now - seen[1] < tuning.current().claim_silent_seconds:
        return f"another host (pid {pid})"
    del _claims_seen[str(target)]
    return None


def is_temp_name(name: str) -> bool:
    """A temporary row file (.<row>.json.[<host>-<pid>.]<random>.tmp): never a row."""
    return _TEMP_NAME.match(name) is not None


def clean_stale_temps(folder: Path, *, max_age: float = STALE_TEMP_SECONDS) -> list[Path]:
    """Remove temporary row files whose writer is dead (this host), and untagged ones (written by versions that
    named no host) older than max_age; return them. Another host's are never removed here: its pids mean
    nothing on this host, and its file times come from a clock that may disagree with ours (a live fit's
    temporary file was removed as stale); the host that wrote one removes it once its writer is gone."""
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_NAME.match(entry.name)
        if match is None:
            continue
        try:
            age = now - entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue  # renamed or removed meanwhile by its writer
        if match["host"] is not None:
            stale = match["host"] == _host_tag() and not _pid_alive(int(match["pid"]))
        else:
            stale = age > max_age
        if stale:
            with contextlib.suppress(OSError):  # gone already, or not ours to remove: the next write retries
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _missing_part_error(folder: Path, existing: Path) -> str | None:
    """Why folders from `existing` down to `folder` (not there yet) could not be created, or None."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    for part in folder.relative_to(existing).parts:
        if len(os.fsencode(part)) > name_max:
            return f"the name {part[:40]}... is longer than {name_max} bytes"
    # Row files go inside: their longest temporary name must fit in a path too.
    if len(os.fsencode(str(folder))) + 1 + MAX_ROW_NAME + 40 > path_max:
        return f"the path is too long for row files (over {path_max} bytes)"
    return None


def check_writable(db_dir: Path | None = None) -> None:
    """Fail before a long fit, not after it, when rows could not be written to the database folder."""
    folder = (db_dir or default_db_dir()) / ROWS_DIR
    existing = folder
    try:
        while not existing.exists() and existing != existing.parent:
            if existing.is_symlink():  # mkdir would fail on it at the end of the fit
                raise DatabaseError(
                    f"database folder {folder}: {existing} is a symbolic link to nothing (dangling or a loop); "
                    "fix the link or pass another --db, or --no-save",
                    folder=folder,
                )
            existing = existing.parent
        problem = None
        if not existing.is_dir():
            problem = "is not a folder"
        elif not os.access(existing, os.W_OK | os.X_OK):
            problem = "is not writable"
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES while looking
        raise DatabaseError(
            f"database folder {folder}: {exc.strerror or exc.__class__.__name__}; pass another --db, or --no-save",
            folder=folder,
        ) from None
    if problem is None and existing != folder:
        reason = _missing_part_error(folder, existing)
        if reason:
            raise DatabaseError(f"database folder {folder}: {reason}; pass another --db, or --no-save", folder=folder)
    if problem:
        raise DatabaseError(
            f"database folder {folder}: {existing} {problem}; pass a writable --db (or WEIGHTDIAG_DB), or --no-save",
            folder=folder,
        )


def _test_write_delay() -> None:
    # Test-only hook (tests/test_db_safety.py): widen the window between temp write and rename to kill in it.
    time.sleep(settings.test_write_delay())


def _same_row(path: Path, name: str) -> bool | None:
    """Whether the row in `path` is the one named `name` (None when there is no readable row)."""
    try:
        return row_filename(load_row(path)) == name
    except (BadInputError, KeyError, TypeError):
        return None


def _adopt_legacy(folder: Path, path: Path) -> None:
    """Keep rows written under the old lossy names from being overwritten or duplicated by this write."""
    # A different model's row at our name (old names collided: 'team--llama' held 'team/llama'): move it
    # to its own name first, unless a row written since already lives there.
    # Names with a hash ('~') never existed before: only a plain name can hold a stranger.
    if "~" not in path.name and path.exists() and _same_row(path, path.name) is False:
        other = load_row(path)
        home = folder / row_filename(other)
        if not home.exists():
            write_json_atomic(home, other)


def _drop_legacy_copy(folder: Path, path: Path, row: Row) -> None:
    # Our own earlier row under its old name is superseded now, as an overwrite was before.
    legacy = folder / legacy_row_filename(row)
    if legacy != path and len(os.fsencode(legacy.name)) <= 255 and legacy.exists() and _same_row(legacy, path.name):
        with contextlib.suppress(FileNotFoundError):
            legacy.unlink()


def row_file(db_dir: Path, row: RowIdentity) -> Path:
    """Where the row of this identity is (its name, else its old lossy name holding it), or would be written."""
    folder = db_dir / ROWS_DIR
    path = folder / row_filename(row)
    legacy = folder / legacy_row_filename(row)
    legacy_there = legacy != path and len(os.fsencode(legacy.name)) <= 255 and legacy.exists()
    if not path.exists() and legacy_there and _same_row(legacy, path.name):
        return legacy
    return path


def write_row(row: Row, db_dir: Path | None = None) -> Path:
    folder = (db_dir or default_db_dir()) / ROWS_DIR
    path = folder / row_filename(row)
    try:
        _adopt_legacy(folder, path)
        text = json.dumps(row, indent=1, allow_nan=False) + "\n"
        written = write_text_atomic(path, text, _test_write_delay)
        _index_written(folder, path, text.encode("utf-8"), written, row)
        _drop_legacy_copy(folder, path, row)
    except OSError as exc:
        raise DatabaseError(
            f"cannot write {path} ({exc.strerror or exc.__class__.__name__}); pass a writable --db, or --no-save",
            folder=folder,
        ) from None
    clean_stale_temps(folder)
    return path


def load_row(path: str | Path) -> Row:
    """The row in a file, every field checked (records.read_row); RowError (a BadInputError) when it is none."""
    return read_row(path)


SkipHandler = Callable[[RowError], None]
# Who hears about a damaged row when the caller named no one: the command line sets it for the whole
# command, so that every command that skips a row (compare, trajectory, report ...) names it on stderr.
default_on_skip: contextvars.ContextVar[SkipHandler | None] = contextvars.ContextVar("default_on_skip", default=None)


def _skip(exc: RowError, on_skip: SkipHandler | None) -> None:
    handler = on_skip or default_on_skip.get()
    if handler is not None:
        handler(exc)


def _row_paths(folder: Path) -> list[Path]:
    """The candidate row files of rows/: `*.json`, never hidden (temporary files), sorted by name."""
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return []
    return [folder / name for name in sorted(names) if name.endswith(".json") and not name.startswith(".")]


# --- summaries: listing and naming rows without reading their per-matrix records ----------------------------
# A row's summary is the row less its `matrices` and `vectors` (their counts in `counts`). Summaries live in
# rows/.index.sqlite (index.py), keyed on the sha256 of the row file's bytes: written by write_row with the row,
# trusted for a file whose size and mtime are those it was hashed at (copies that keep times stay valid), and
# only while the entry's seal holds and its summary is of the identity its columns state (never believed over
# the row file: a damaged entry is passed over and written again),
# found by hash for a file that was touched or renamed, and made from the row itself (every field checked) for
# bytes never indexed, then recorded where the index is writable. A crash between the row and its entry leaves an
# entry of the old bytes: the new file's stat no longer matches, its hash neither, so it is read whole.
SUMMARY_SCHEMA = "weightdiag.row-summary/2"
SUMMARY_DIR = ".summary"  # where earlier versions kept one summary file per row: no longer read nor written


def summary_of(row: Row) -> Row:
    """The row without its per-matrix and per-vector records and its lineage fingerprint (tens of kilobytes,
    read by `lineage` from the row itself); `counts` says how many records there were."""
    summary = {k: v for k, v in row.items() if k not in ("matrices", "vectors", "lineage")}
    summary["counts"] = {"matrices": len(row.get("matrices", [])), "vectors": len(row.get("vectors", []))}
    return cast(Row, summary)


def _summary_text(summary: Row) -> str:
    # ASCII (lone surrogates escaped) and any float: the index takes the summary of any row the checks let through
    return json.dumps({"schema": SUMMARY_SCHEMA, "row": summary}, allow_nan=True)


def _parse_summary(text: str | None, identity: Sequence[str | None]) -> Row | None:
    """A summary from the index, when it is one and of the identity its entry states (anything else: the row
    is read instead)."""
    if text is None:
        return None
    try:
        document = json.loads(text)
        row = document["row"] if document.get("schema") == SUMMARY_SCHEMA else None
        if not (isinstance(row, dict) and isinstance(row.get("model"), dict) and isinstance(row.get("counts"), dict)):
            return None
        if _index_identity(cast(Row, row)) != tuple(identity):
            return None
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None
    return cast(Row, row)


def _index_identity(row: Row) -> tuple[str | None, ...]:
    model = row.get("model") or {}
    protocol = row.get("protocol") or {}
    return (
        model.get("id"),
        model.get("revision"),
        model.get("fingerprint"),
        protocol.get("name"),
        fit_variant(row),
        row.get("created"),
    )


def _index_written(folder: Path, path: Path, data: bytes, written: os.stat_result, row: Row) -> None:
    """Record a row just written (its bytes `data`, the stat of the file written) in the index: best effort."""
    index = RowIndex.open(folder, _checker())
    if index is None:
        return
    try:
        stat_now = os.stat(path)
        # Only while the name still holds our file (the stat taken before the rename): another writer's row
        # renamed over it since is left for readers to index.
        if (stat_now.st_size, stat_now.st_mtime_ns, stat_now.st_ino) == (
            written.st_size,
            written.st_mtime_ns,
            written.st_ino,
        ):
            sha = hashlib.sha256(data).hexdigest()
            index.put(
                path.name,
                (written.st_size, written.st_mtime_ns),
                sha,
                _index_identity(row),
                _summary_text(summary_of(row)),
                _needs_no_change(path, data),
                _pack(row),
            )
    except (OSError, ValueError):
        pass
    finally:
        index.close()


def _pack(row: Row) -> bytes:
    """The row's packed lineage fingerprint for its index entry (imported here: listing rows needs no scipy)."""
    from ..diagnose.lineage_packed import pack

    return pack(row)


def _stat_key(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _summary_from_file(path: Path, index: RowIndex | None, on_skip: SkipHandler | None) -> Row | None:
    """The summary of the row file `path` whose index entry (if any) does not match its stat: by the hash of
    its bytes when the index knows them, else from the row read whole (then recorded). None: not a row."""
    found = _summary_and_lineage_from_file(path, index, on_skip, lineage=False)
    return None if found is None else found[0]


def _summary_and_lineage_from_file(
    path: Path, index: RowIndex | None, on_skip: SkipHandler | None, lineage: bool = True
) -> tuple[Row, bytes] | None:
    """_summary_from_file's summary, and the row's packed lineage fingerprint (b"": it has none; not made when
    neither `lineage` asks for it nor the index takes it: listing rows past a locked index imports no scipy)."""
    before: os.stat_result | None
    after: os.stat_result | None
    try:
        before = os.stat(path)
        data = _read_regular(path)
        after = os.stat(path)
        row_or_summary = None
    except RowError as exc:
        _skip(exc, on_skip)
        return None
    except OSError:  # gone since it was listed: read_row says so
        before = after = None
        data = b""
    # The entry recorded is of these bytes only when the file did not change while they were read.
    steady = (
        before is not None
        and after is not None
        and (_stat_key(before), before.st_ino)
        == (
            _stat_key(after),
            after.st_ino,
        )
    )
    sha = hashlib.sha256(data).hexdigest()
    content = index.summary_of_content(sha) if index is not None and steady else None
    known = _parse_summary(content[0], content[1]) if content is not None else None
    if known is not None and content is not None and index is not None and before is not None:
        # touched, copied without its times, renamed: the same bytes, an entry of this name and stat
        index.put(path.name, _stat_key(before), sha, content[1], content[0], content[2], content[3])
        return known, content[3]
    try:
        row_or_summary = _load_bytes(path, data) if before is not None else read_row(path)
    except RowError as exc:
        _skip(exc, on_skip)
        return None
    summary = summary_of(row_or_summary)
    indexed = index is not None and index.writable and steady and before is not None
    packed = _pack(row_or_summary) if lineage or indexed else b""
    if index is not None and steady and before is not None:
        checked = row_or_summary == json.loads(data)  # parsed, the bytes are the row: no conversion needed
        identity = _index_identity(summary)
        index.put(path.name, _stat_key(before), sha, identity, _summary_text(summary), checked, packed)
    return summary, packed


@functools.cache
def _checker() -> str:
    """What checks rows: a hash of the validator's source (record/schema.py), so that a row found fine by one
    version is checked again by a version whose checks or conversions differ."""
    from ..record import schema

    try:
        source = Path(schema.__file__).read_bytes()
    except (OSError, TypeError):
        return ""  # nothing to compare: every row is checked when read
    return hashlib.sha256(source).hexdigest()[:16]


def _needs_no_change(path: Path, data: bytes) -> bool:
    """Whether the row in `data` is what checking it gives (no field converted): then, once indexed as checked,
    reading it again needs only json.loads."""
    try:
        return _load_bytes(path, data) == json.loads(data)
    except (RowError, ValueError, RecursionError):
        return False


def _read_whole(path: Path, index: RowIndex | None) -> Row:
    """read_row(path), but bytes the index has seen checked (by this version's validator) are only parsed:
    100 rows of a 200-matrix model took 1.5 s to check and 0.2 s to parse."""
    data = _read_regular(path)
    if index is not None and index.checked(hashlib.sha256(data).hexdigest()):
        try:
            return cast(Row, json.loads(data))
        except (ValueError, RecursionError):
            pass
    return _load_bytes(path, data)


def _load_bytes(path: Path, data: bytes) -> Row:
    """read_row of bytes already read from `path` (the same checks, the same errors)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise RowError(
            str(path), f"cannot read a row ({type(exc).__name__})", advice="give a weightdiag row file"
        ) from None
    return _check_row(doc, path)


def count_of(row: Mapping[str, Any], key: str) -> int:
    """How many matrices or vectors a row (or its summary) holds."""
    counts = row.get("counts")
    if isinstance(counts, dict) and key not in row:
        return int(counts.get(key, 0))
    return len(row.get(key, []))


class _Look:
    """What one command has seen of the rows folder: the index's entries and the files' stats, loaded once and
    shared by its passes (`db show` of an id that is not there looks among its files, then among all)."""

    def __init__(self, folder: Path) -> None:
        index = RowIndex.open(folder, _checker())
        self.known: dict[str, Entry] = {}
        if index is not None:
            try:
                self.known = index.stats()
            finally:
                index.close()
        self._stats: dict[str, tuple[int, int] | None] = {}

    def stat_key(self, path: Path) -> tuple[int, int] | None:
        name = path.name
        if name not in self._stats:
            try:
                self._stats[name] = _stat_key(os.stat(path))
            except OSError:
                self._stats[name] = None
        return self._stats[name]


def model_paths(folder: Path, model_id: str, paths: list[Path] | None = None, look: _Look | None = None) -> list[Path]:
    """The row files that may hold rows of `model_id`: those whose name says so (its name part, or the old lossy
    slug, then '@'), those the index has seen holding them (a row copied in under another name), and those whose
    content the index does not know (new, or changed since); no other file need be opened to find them."""
    prefixes = (name_part(model_id, ID_BYTES) + "@", slug(model_id) + "@")
    paths = paths if paths is not None else _row_paths(folder)
    look = look or _Look(folder)
    known = look.known
    if not known and not (folder / INDEX_NAME).exists():  # no index: the names alone
        return [p for p in paths if p.name.startswith(prefixes)]

    def may_hold(path: Path) -> bool:
        if path.name.startswith(prefixes):
            return True
        entry = known.get(path.name)
        if entry is None:
            return True
        if entry.model_id == model_id:
            return True
        return look.stat_key(path) not in (None, entry.stat)

    return [p for p in paths if may_hold(p)]


def iter_summaries(
    db_dir: Path | None = None, on_skip: SkipHandler | None = None, model_id: str | None = None
) -> Iterator[tuple[Path, Row]]:
    """Like iter_rows, but each row as its summary (no `matrices`, no `vectors`), from the index (index.py)
    where it holds the file's content, else from the row itself (then indexed where the index is writable).
    With `model_id`, only the files whose name says they may hold that model's rows (model_paths).
    One summary at a time: the caller keeps what it needs."""
    folder = _rows_folder(db_dir)
    paths = _row_paths(folder)
    if model_id is not None:
        paths = model_paths(folder, model_id, paths)
    return _summaries(folder, paths, on_skip, whole=model_id is None)


def _summaries(
    folder: Path,
    paths: list[Path],
    on_skip: SkipHandler | None,
    *,
    whole: bool = False,
    names_only: bool = False,
    look: _Look | None = None,
) -> Iterator[tuple[Path, Row]]:
    """(path, summary) of each of `paths` that holds a row; `whole`: `paths` are all the folder's rows (entries
    of other files are dropped); `names_only`: a fresh entry gives only the model's id, revision and
    fingerprint, from the index's columns (nothing parsed: naming rows among thousands)."""
    if not paths:
        return
    index = RowIndex.open(folder, _checker())
    try:
        if index is None:
            known = {}
        elif look is not None:
            known = look.known
        else:
            known = index.stats(None if whole or len(paths) > 1000 else [p.name for p in paths])
        for path in paths:
            summary = None
            entry = known.get(path.name)
            if index is not None and entry is not None:
                if look is not None:
                    fresh = look.stat_key(path) == entry.stat
                else:
                    try:
                        fresh = _stat_key(os.stat(path)) == entry.stat
                    except OSError:
                        fresh = False
                if fresh and names_only and entry.model_id is not None:
                    model = {"id": entry.model_id, "revision": entry.revision, "fingerprint": entry.fingerprint}
                    summary = cast(Row, {"model": model})
                elif fresh:
                    summary = _parse_summary(index.summary(path.name, entry), entry.identity)
            if summary is None:
                summary = _summary_from_file(path, index, on_skip)
                if summary is None:
                    continue
            yield path, summary
        if index is not None and whole:  # a whole listing: entries of files gone are dropped
            index.forget(set(known) - {p.name for p in paths})
    finally:
        if index is not None:
            index.close()


def iter_lineage(db_dir: Path | None = None) -> Iterator[tuple[Path, Row, bytes]]:
    """(path, summary, packed lineage fingerprint: b"" when the row has none) of each fitted row of the database,
    from the index where its entry holds the file's content (no row parsed), else from the row read whole (then
    indexed where the index is writable: the next command reads the index). One row at a time."""
    folder = _rows_folder(db_dir)
    paths = _row_paths(folder)
    if not paths:
        return
    index = RowIndex.open(folder, _checker())
    batch: dict[str, tuple[Entry, str, bytes]] = {}
    try:
        for at, path in enumerate(paths):
            if index is not None and at % INDEX_BATCH == 0:  # one query per batch: a query per row was a third
                batch = index.entries_of([p.name for p in paths[at : at + INDEX_BATCH]])
            cached = batch.get(path.name)
            found = None
            if cached is not None:
                try:
                    fresh = _stat_key(os.stat(path)) == cached[0].stat
                except OSError:
                    fresh = False
                summary = _parse_summary(cached[1], cached[0].identity) if fresh else None
                if summary is not None:
                    found = summary, cached[2]
            if found is None:
                found = _summary_and_lineage_from_file(path, index, None)
                if found is None:
                    continue
            yield path, found[0], found[1]
    finally:
        if index is not None:
            index.close()


def missing_database(db_dir: Path | None) -> DatabaseError | None:
    """The error for a database folder that was named (--db DIR, $WEIGHTDIAG_DB) and does not exist, else None.

    Reading rows from such a folder found none, so a typo read as an empty database: `db list --db typo` printed
    an empty table with exit 0 and `db show X --db typo` said only "no such row" (issue 33). The folders chosen
    by default may be absent (a new user has no rows yet: the per-user folder is created on the first write), and
    commands that write rows (fit, sweep, diff) create a named one."""
    if db_dir is not None:
        folder, named, instead = db_dir, f"--db {db_dir}", "leave --db out for the default"
    else:
        where, why = settings.db_location()
        if why != settings.DB_FROM_ENV:
            return None
        folder, named, instead = Path(where), f"WEIGHTDIAG_DB={where}", "unset it for the default"
    if folder.exists():
        return None
    return DatabaseError(
        f"{named}: no such database folder ({folder.absolute()}); check the path, or {instead} (`weightdiag env` "
        "shows it)",
        folder=folder / ROWS_DIR,
    )


def require_database(db_dir: Path | None) -> None:
    """Raise missing_database's error, for a command that reads rows from the database folder."""
    error = missing_database(db_dir)
    if error is not None:
        raise error


def _rows_folder(db_dir: Path | None) -> Path:
    base = db_dir or default_db_dir()
    if base.exists() and not base.is_dir():  # a typo'd --db naming a file must not read as an empty database
        raise DatabaseError(
            f"database folder {base}: is a file, not a folder; pass the database folder as --db",
            folder=base / ROWS_DIR,
        )
    return base / ROWS_DIR


def iter_rows(
    db_dir: Path | None = None, on_skip: SkipHandler | None = None, model_id: str | None = None
) -> Iterator[tuple[Path, Row]]:
    """The fitted rows of the database, by file name, one at a time. A file that is not a readable row (foreign,
    damaged, a FIFO or folder named *.json) is skipped, and handed to `on_skip` when given (to warn about it).
    With `model_id`: only the files that may hold that model's rows (model_paths)."""
    folder = _rows_folder(db_dir)
    paths = _row_paths(folder)
    if model_id is not None:
        paths = model_paths(folder, model_id, paths)
    if not paths:
        return
    index = RowIndex.open(folder, _checker())
    try:
        for path in paths:
            try:
                row = _read_whole(path, index)
            except RowError as exc:
                _skip(exc, on_skip)
                continue
            yield path, row
    finally:
        if index is not None:
            index.close()


def find_rows(
    spec: str, db_dir: Path | None = None, protocol: str | None = None, rows: list[Row] | None = None
) -> list[Row]:
    """Fitted rows whose model id (or id@revision) is `spec`, oldest first (among `rows` when the caller
    has read them already)."""
    found = []
    for row in rows if rows is not None else (row for _, row in iter_rows(db_dir, model_id=spec.split("@", 1)[0])):
        model = row["model"]
        names = {model["id"], f"{model['id']}@{model.get('revision')}"}
        if spec in names and (protocol is None or row["protocol"]["name"] == protocol):
            found.append(row)
    return sorted(found, key=lambda r: r.get("created") or "")


def cohort_rows() -> list[Row]:
    """The shipped cohort rows: DATABASE_v9_1's entries, then the Qwen companion's, each sorted by id."""
    from ..diagnose.cohort import COHORTS, load_cohort

    return [cast(Row, row) for name in COHORTS for row in load_cohort(name)]


def all_rows(
    db_dir: Path | None = None, cohorts: bool = True, on_skip: SkipHandler | None = None, summaries: bool = False
) -> list[Row]:
    """The shipped cohort rows (unless cohorts=False) followed by the fitted rows of the database (as their
    summaries with summaries=True: enough to list them, see iter_summaries)."""
    rows: list[Row] = cohort_rows() if cohorts else []
    rows.extend(row for _, row in (iter_summaries if summaries else iter_rows)(db_dir, on_skip))
    return rows


def flat_record(row: Row) -> FlatRecord:
    """One flat record per row (for listing and CSV/JSONL export): identity plus per-kind medians
    (`k_median_<kind>`, `lambda_median_<kind>`: columns the FlatRecord type cannot declare)."""
    from ..diagnose.functions import ffn_median_k

    model = row["model"]
    hp = row.get("hyperparameters") or {}
    record: dict[str, Any] = {
        "id": model["id"],
        # Local rows have no revision: their content fingerprint (local-...) names them instead, so that
        # `id@revision` as listed is what `db show` takes.
        "revision": model.get("revision") or model.get("fingerprint"),
        "source": model["source"] + (f":{model['cohort']}" if model.get("cohort") else ""),
        "protocol": row["protocol"]["name"],
        "matrices": count_of(row, "matrices"),
        "attention": (row.get("architecture") or {}).get("attention"),
        "ffn_median_k": ffn_median_k(row),
        "t_over_tau": hp.get("t_over_tau"),
        "state": hp.get("state"),
        "created": row.get("created"),
    }
    for kind, s in row.get("kinds", {}).items():
        record[f"k_median_{kind}"] = s.get("k_median")
        record[f"lambda_median_{kind}"] = s.get("lambda_median")
    return cast("FlatRecord", record)


class RowNotFoundError(BadInputError):
    """No row answers to the name given (exit code 2); `spec` is the name. `message` replaces the default
    one where the caller knows more (`trajectory`: a model id without swept rows)."""

    field_names = ("spec",)

    def __init__(self, spec: str, message: str | None = None, folder: Path | None = None) -> None:
        self.spec = spec
        where = f" in {folder}" if folder is not None else ""
        super().__init__(
            message
            or f"{spec}: no such row{where} (not a row file, cohort entry or fitted model id); see `weightdiag db "
            "list`, or pass the database that holds it with --db (or WEIGHTDIAG_DB)"
        )


class AmbiguousRowError(BadInputError):
    """A name that matches several rows only when case is ignored (exit code 2); `candidates` are their ids."""

    field_names = ("spec", "candidates")

    def __init__(
        self, spec: str, candidates: Iterable[str], how: str = "when case is ignored", message: str | None = None
    ) -> None:
        self.spec = spec
        self.candidates = sorted(set(candidates))
        super().__init__(
            message
            or f"{spec}: matches {len(self.candidates)} rows {how}: {', '.join(self.candidates)}; give one of them "
            "exactly"
        )


DEFAULT_REVISION = "main"  # the Hub's default branch: what ORG/NAME without @REV means


def natural_key(text: str) -> tuple[tuple[int, int, str], ...]:
    """Sort key that orders the numbers in a text by value: step20 before step100 (as text, step100 came first)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part)


def _checkpoint(row: Row) -> str:
    """What tells a model's rows of different checkpoints apart: the revision, else (local files) the fingerprint."""
    model = row["model"]
    return str(model.get("revision") or model.get("fingerprint") or "")


def revision_needed(spec: str, names: Iterable[str], why: str) -> AmbiguousRowError:
    """One line that asks for a revision, offering a few (in natural order) to choose from."""
    choices = sorted(set(names), key=natural_key)
    few = choices if len(choices) <= 5 else [*choices[:3], "...", choices[-1]]
    return AmbiguousRowError(
        spec,
        choices,
        message=f"{spec}: {why}: name one, e.g. {', '.join(few)} (`weightdiag db list` shows them all)",
    )


def meant_revision(spec: str, rows: list[Row]) -> list[Row]:
    """Of the rows a model id without @REV names, those of the checkpoint meant: all of them when they are of one
    revision, else those of main (the Hub's default branch, what the id alone means there). Rows of several
    revisions and none of main: AmbiguousRowError listing a few to choose from. Never one picked silently
    (issue 33: `db show RUN` answered with the newest of 15 revisions)."""
    checkpoints = {_checkpoint(row) for row in rows}
    if len(checkpoints) <= 1:
        return rows
    main = [row for row in rows if row["model"].get("revision") == DEFAULT_REVISION]
    if main:
        return main
    model_id = rows[0]["model"]["id"]
    raise revision_needed(
        spec, (f"{model_id}@{c}" for c in checkpoints), f"{len(checkpoints)} revisions in the database and none named"
    )


def _names(row: Row) -> list[str]:
    """The names a fitted row answers to: id, id@revision, id@fingerprint."""
    model = row["model"]
    return [model["id"]] + [f"{model['id']}@{model[k]}" for k in ("revision", "fingerprint") if model.get(k)]


def _newest(rows: list[Row]) -> Row:
    """The newest full fit (a --center or --include row answers only when there is no full one)."""
    # ties: the last file by name, as before
    return max(reversed(rows), key=lambda r: (not fit_variant(r), r.get("created") or ""))


def _one_checkpoint(spec: str, rows: list[Row]) -> Row:
    """The newest of `rows` named `spec`, unless a bare id names local checkpoints with different contents
    (folders of the same name: `ckpt`): then AmbiguousRowError lists their id@local-fingerprint names.
    A bare id of a model with rows of several revisions (a sweep) names main's, else asks for one (meant_revision)."""
    unnamed = {r["model"].get("fingerprint") for r in rows if not r["model"].get("revision")}
    if "@" not in spec and len(unnamed) > 1 and all(not r["model"].get("revision") for r in rows):
        raise AmbiguousRowError(spec, (f"{spec}@{fp}" for fp in unnamed if fp), "of different checkpoints")
    if all(r["model"]["id"].casefold() == spec.casefold() for r in rows):  # no revision named
        rows = meant_revision(spec, rows)
    return _newest(rows)


def local_row(spec: str, db_dir: Path | None = None, rows: list[Row] | None = None) -> Row | None:
    """The row of a checkpoint fitted from local files, by the name `db list` shows (id, id@revision,
    id@local-fingerprint; exact), else None. A local model cannot be refitted from its id, so commands
    that take a model (compare, report, check) read its row instead of asking the Hub for that name.
    `rows`: the database's rows when the caller has read them already."""
    fitted = rows if rows is not None else [row for _, row in iter_rows(db_dir)]
    named = [row for row in fitted if row["model"].get("source") == "local" and spec in _names(row)]
    return _one_checkpoint(spec, named) if named else None


def cohort_entry(spec: str) -> Row | None:
    """The shipped cohort row named `spec`: its exact id, else the one id equal ignoring case (several:
    AmbiguousRowError), else None. For commands that take a cohort entry among other things (compare)."""
    cohort = cohort_rows()
    for row in cohort:
        if row["model"]["id"] == spec:
            return row
    folded = [row for row in cohort if row["model"]["id"].casefold() == spec.casefold()]
    if len(folded) > 1:
        raise AmbiguousRowError(spec, (row["model"]["id"] for row in folded))
    return folded[0] if folded else None


def row_by_id(spec: str, db_dir: Path | None = None, summary: bool = False) -> Row:
    """A row by file path, row file name, cohort entry id, or fitted model id[@revision] (the newest).

    The rules, in order, are in this module's docstring: exact names before names ignoring case,
    and a name that fits several rows only when ignoring case is refused (AmbiguousRowError).
    """
    path = Path(spec)
    if spec and os.path.lexists(path) and not path.is_dir():
        return read_row(path)
    folder = (db_dir or default_db_dir()) / ROWS_DIR
    if spec.endswith(".json") and "/" not in spec and os.sep not in spec:
        require_database(db_dir)  # a row file of the database, which must be there
        if os.path.lexists(folder / spec):
            return read_row(folder / spec)
    cohort = cohort_rows()
    for row in cohort:
        if row["model"]["id"] == spec:
            return row
    require_database(db_dir)  # the rest are names of fitted rows: a typo'd --db is no empty database
    damaged: list[RowError] = []
    # Matched on summaries (no per-matrix records read), then the chosen row is read whole. An exact id
    # (rule 4) is looked for first among the files named after it; the whole database only after that.
    path_of: dict[int, Path] = {}

    def whole(row: Row) -> Row:
        if summary or id(row) not in path_of:
            return row
        index = RowIndex.open(path_of[id(row)].parent, _checker())
        try:
            return _read_whole(path_of[id(row)], index)
        finally:
            if index is not None:
                index.close()

    rows_folder = _rows_folder(db_dir)
    everything = _row_paths(rows_folder)
    look = _Look(rows_folder)
    mine = model_paths(rows_folder, spec.split("@", 1)[0], everything, look)
    named = list(_summaries(rows_folder, mine, damaged.append, look=look))
    path_of.update((id(row), path) for path, row in named)
    exact = [row for _, row in named if spec in _names(row)]
    if exact:
        return whole(_one_checkpoint(spec, exact))
    # The whole database, by names only (the index's columns: no summary parsed, none held), then the
    # summaries of the rows that match.
    damaged.clear()
    folded = spec.casefold()
    exact_paths: list[Path] = []
    folded_paths: dict[str, list[Path]] = {}  # the exact name matched ignoring case -> its files
    for path, stub in _summaries(rows_folder, everything, damaged.append, whole=True, names_only=True, look=look):
        names = _names(stub)
        if spec in names:
            exact_paths.append(path)
        for name in names:
            if name.casefold() == folded:
                folded_paths.setdefault(name, []).append(path)

    def summaries(paths: list[Path]) -> list[Row]:
        found = list(_summaries(rows_folder, paths, None))
        path_of.update((id(row), path) for path, row in found)
        return [row for _, row in found]

    if exact_paths:
        return whole(_one_checkpoint(spec, summaries(exact_paths)))
    for exc in damaged:
        if exc.model_id == spec:
            raise exc
    matches: dict[str, list[Row]] = {}  # the exact name matched -> its rows
    for row in cohort:
        if row["model"]["id"].casefold() == folded:
            matches.setdefault(row["model"]["id"], []).append(row)
    for name, paths in folded_paths.items():
        matches.setdefault(name, []).extend(summaries(paths))
    if len(matches) > 1:
        raise AmbiguousRowError(spec, matches)
    if matches:
        return whole(_one_checkpoint(spec, next(iter(matches.values()))))
    for exc in damaged:  # the row asked for may be one of these: the command line names them on stderr
        _skip(exc, None)
    raise RowNotFoundError(spec, folder=(db_dir or default_db_dir()).resolve())

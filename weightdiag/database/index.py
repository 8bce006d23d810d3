"""rows/.index.sqlite: one file that lists the database's rows, so that listing and naming rows reads neither
every row file nor one summary file per row.

One table, one entry per row file: its name, the sha256 of its bytes, the (size, mtime_ns) the file had when it
was hashed, the row's identity (model id, revision, fingerprint, protocol, fit variant, created), its summary
(the row less its per-matrix and per-vector records, as JSON), its lineage fingerprint packed in binary
(diagnose.lineage_packed: `lineage` against thousands of rows parses none of them), which checker found its
bytes to need no change, and a seal. An entry is used for a file whose size and mtime are those it was hashed at
(`cp -a`, `rsync -a`, a restore that keeps times: still valid, inodes are not part of it), else the file is
hashed again and a sealed entry of the same bytes (under any name) answers; only a row whose bytes the index has
never seen is read and checked whole. A row file rewritten in place keeping both its size and its mtime to the
nanosecond would not be noticed: rows are only ever replaced by a rename of a new file, which gets the time of
its own write.

The index is a cache, never believed over the row files (issue 42: two summaries exchanged, `db show X@step_100`
answered step_500's row, and an edited value was listed for ever):
- each entry carries a seal, the sha256 of everything else in it (its name included, its summary and packed
  fingerprint by hash): an
  entry edited, cut, or moved to another name fails it and is passed over, as if missing: the row file is read
  and the entry written again (where the folder is writable). The seal is no signature: whoever can write the
  index can write the rows beside it; it tells damage and stray edits from an entry weightdiag wrote;
- the file is opened only as a regular file of its own: not a symbolic link (the linked file was rewritten), not
  a FIFO (commands hung), not hard-linked (a snapshot made with `cp -al` would be written through), nor a
  SQLite file in WAL mode, or beside a rollback journal that is any of these; such a name is removed and the
  index made again where the folder is writable, else the row files answer;
- a file that is not our index (another schema, other tables or triggers, damaged pages) is made again;
- what goes in cannot fail to: names and ids as bytes (a model id that is not UTF-8, or holds a lone surrogate,
  made every `db list` exit 5), file times as text (a time past 2262 overflows SQLite's integers);
- every wait has a deadline and is said: another process's lock is waited for LOCK_WAIT_SECONDS at most, with a
  line on stderr, then the row files answer (an exclusive lock made commands take 20-41 s, silently).

SQLite (standard library) rather than a JSON file: one entry is updated in a transaction at each row write
(a JSON index would be rewritten whole, 70 MB at 20,000 rows, by every fit), a reader takes the entries it
needs without loading the others, and several writers wait for each other instead of losing each other's
updates.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

INDEX_NAME = ".index.sqlite"  # hidden, not *.json: never taken for a row
INDEX_SCHEMA = "weightdiag.row-index/4"  # /3: the packed lineage fingerprint (issue 39); /4: with its pair cosines
SIDECARS = ("-journal", "-wal", "-shm")  # files SQLite opens beside the index
QUIET_WAIT_SECONDS = 0.25  # writers of the index hold it for milliseconds: a wait this short goes unsaid
LOCK_WAIT_SECONDS = 3.0  # then at most this long, said on stderr; past it the row files answer
LOCKED_MEMO_SECONDS = 30.0  # an index given up as locked is not waited for again by this process meanwhile
COMMIT_ENTRIES, COMMIT_SECONDS = 500, 0.5  # a rebuild commits as it goes: other writers wait for no long transaction
_COLUMNS = ("model_id", "revision", "fingerprint", "protocol", "variant", "created")
_ENTRY = "name, stat, sha256, " + ", ".join(_COLUMNS) + ", checked_by, summary_sha, lineage_sha, seal"
_DDL = (  # the whole schema: a file holding anything else is not our index
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    "CREATE TABLE rows (name BLOB PRIMARY KEY, stat TEXT NOT NULL, sha256 TEXT NOT NULL, "
    + ", ".join(f"{c} BLOB" for c in _COLUMNS)
    + ", checked_by TEXT NOT NULL, summary_sha TEXT NOT NULL, lineage_sha TEXT NOT NULL, seal TEXT NOT NULL, "
    "summary TEXT NOT NULL, lineage BLOB NOT NULL)",
    "CREATE INDEX rows_sha256 ON rows (sha256)",
    "CREATE INDEX rows_model ON rows (model_id)",
)
_HEADER = b"SQLite format 3\x00"

Stat = tuple[int, int]  # (size, mtime_ns) of a row file when it was hashed
Identity = tuple[str | None, ...]  # the row's _COLUMNS
T = TypeVar("T")

_locked_at: dict[str, float] = {}  # index path -> when this process gave it up as locked (monotonic)


class Entry(NamedTuple):
    """What a sealed entry says of a row file, its summary aside."""

    stat: Stat
    sha256: str
    identity: Identity

    @property
    def model_id(self) -> str | None:
        return self.identity[0]

    @property
    def revision(self) -> str | None:
        return self.identity[1]

    @property
    def fingerprint(self) -> str | None:
        return self.identity[2]


def _key(name: str) -> bytes:
    # File names as bytes: a foreign file's name need not be UTF-8 (surrogate escapes would not encode as TEXT)
    return os.fsencode(name)


def _blob(text: object) -> bytes | None:
    # surrogatepass: any str, a lone surrogate or an undecodable file name's escape included, round-trips
    return None if text is None else str(text).encode("utf-8", "surrogatepass")


def _text(blob: object) -> str | None:
    if blob is None:
        return None
    if not isinstance(blob, bytes):
        raise TypeError("not an identity column")
    return blob.decode("utf-8", "surrogatepass")


def _seal(
    name: bytes,
    stat_text: str,
    sha256: str,
    identity: Sequence[object],
    checked_by: str,
    summary_sha: str,
    lineage_sha: str,
) -> str:
    """The sha256 of an entry's other columns, each length-prefixed (no two entries' columns hash alike)."""
    digest = hashlib.sha256(INDEX_SCHEMA.encode())
    ends = (checked_by.encode(), summary_sha.encode(), lineage_sha.encode())
    for part in (name, stat_text.encode(), sha256.encode(), *identity, *ends):
        if part is None:
            digest.update(b"\x00")
        else:
            data = bytes(part) if isinstance(part, bytes) else str(part).encode("utf-8", "surrogatepass")
            digest.update(b"\x01" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def _stat_text(st: Stat) -> str:
    return f"{int(st[0])}:{int(st[1])}"


def _parse_stat(text: object) -> Stat:
    size, mtime = str(text).split(":")
    return int(size), int(mtime)


class Sealed(NamedTuple):
    """An entry whose seal holds: its row file's name, what it says of the file, and what its seal covers."""

    name: str
    entry: Entry
    checked_by: str
    summary_sha: str
    lineage_sha: str


def _entry(columns: Sequence[object]) -> Sealed | None:
    """The entry in a row of _ENTRY's columns, None unless its seal holds."""
    name, stat_text, sha, *rest = columns
    identity, (checked_by, summary_sha, lineage_sha, seal) = rest[: len(_COLUMNS)], rest[len(_COLUMNS) :]
    if not (isinstance(name, bytes) and isinstance(stat_text, str) and isinstance(sha, str)):
        return None
    if not (isinstance(checked_by, str) and isinstance(summary_sha, str) and isinstance(seal, str)):
        return None
    if not isinstance(lineage_sha, str):
        return None
    try:
        if _seal(name, stat_text, sha, identity, checked_by, summary_sha, lineage_sha) != seal:
            return None
        entry = Entry(_parse_stat(stat_text), sha, tuple(_text(v) for v in identity))
    except (TypeError, ValueError):
        return None
    return Sealed(os.fsdecode(name), entry, checked_by, summary_sha, lineage_sha)


def warn(text: str) -> None:
    """One line on stderr (the database is below the command line: what makes a command wait is said here)."""
    stream = sys.stderr
    if stream is not None:
        with contextlib.suppress(OSError, ValueError):
            stream.write(f"warning: {text}\n".encode("utf-8", "backslashreplace").decode("utf-8"))
            stream.flush()


def _busy(exc: sqlite3.Error) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def _damaged(exc: sqlite3.Error) -> bool:
    """Not a database, or damaged pages (OperationalError is a lock, a full disk, a read-only file...)."""
    return isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)


def _plain_file(path: Path, for_writing: bool) -> str | None:
    """Why `path` may not be opened by SQLite as the index (None: it may, or it is absent): anything but a
    regular file of its own, whose header, when it has one, is a rollback-journal SQLite file's."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or "unreadable"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if for_writing and st.st_nlink > 1:  # written in place, the other names' file would change with it
        return "a file with other hard links"
    if st.st_size == 0 or path.name != INDEX_NAME:
        return None
    try:  # O_NOFOLLOW, O_NONBLOCK: should the name have changed since the lstat, nothing follows or waits
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        return exc.strerror or "unreadable"
    try:
        opened = os.fstat(fd)
        header = os.pread(fd, 100, 0) if stat.S_ISREG(opened.st_mode) else b""
    except OSError:
        header = b""
    finally:
        os.close(fd)
    if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
        return "replaced while it was looked at"
    if len(header) < 100 or not header.startswith(_HEADER):
        return "not a SQLite file"
    if header[18:20] != b"\x01\x01":  # WAL mode would open -wal and -shm, and map the latter
        return "a SQLite file in WAL mode"
    return None


class RowIndex:
    """An open index; `writable` is False where entries can only be read (a read-only database, or a write
    that failed: the rest of the session reads only)."""

    def __init__(self, connection: sqlite3.Connection, path: Path, writable: bool, checker: str) -> None:
        self._db = connection
        self._path = path
        self.writable = writable
        self._checker = checker
        self._usable = True
        self._waited = False
        self._pending = 0
        self._since = 0.0

    @classmethod
    def open(cls, folder: Path, checker: str = "") -> RowIndex | None:
        """The index of the rows folder `folder`, created where it is missing and the folder writable; None when
        there is none to read (no folder, a read-only folder without a usable index, an index locked past the
        deadline). `checker`: what checks rows (a hash of the row validator): entries checked by another are
        parsed and checked again."""
        path = folder / INDEX_NAME
        try:
            if not stat.S_ISDIR(os.stat(folder).st_mode):
                return None
        except OSError:
            return None
        writable = os.access(folder, os.W_OK | os.X_OK) and (not os.path.lexists(path) or os.access(path, os.W_OK))
        if not cls._fit_to_open(path, writable):
            return None
        locked = time.monotonic() - _locked_at.get(str(path), -LOCKED_MEMO_SECONDS) < LOCKED_MEMO_SECONDS
        index, foreign = cls._connect(path, writable, checker, wait=not locked)
        if foreign and writable and cls._remove(path):  # not our index (another version's, or damaged): made again
            index, _ = cls._connect(path, writable, checker, wait=not locked)
        return index

    @classmethod
    def _fit_to_open(cls, path: Path, writable: bool) -> bool:
        """Whether SQLite may open `path` (and its journal); where the folder is writable, a name that may not
        be opened is removed first (the name only: never what it links to)."""
        for name in [path, *(path.with_name(path.name + end) for end in SIDECARS)]:
            why = _plain_file(name, writable)
            if why is None:
                continue
            if not writable:  # a read-only user cannot repair it: the row files answer, as they would without it
                return False
            gone = cls._remove(path) if name == path else cls._unlink(name)
            done = "removed (a cache: made again from the row files)" if gone else "left as it is: the row files answer"
            warn(f"{name}: {why}; {done}")
            if not gone:
                return False
        return True

    @staticmethod
    def _unlink(name: Path) -> bool:
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True

    @staticmethod
    def _remove(path: Path) -> bool:
        """Remove the index and its journal (a journal left beside a new index would be played back into it)."""
        return all(RowIndex._unlink(name) for name in (path, *(path.with_name(path.name + end) for end in SIDECARS)))

    @classmethod
    def _connect(cls, path: Path, writable: bool, checker: str, wait: bool) -> tuple[RowIndex | None, bool]:
        """(the index at `path` when it is ours, else None; whether the file is something else: another schema,
        damaged). A new, empty file is made ours when writable."""
        try:
            if writable:
                connection = sqlite3.connect(path, timeout=QUIET_WAIT_SECONDS)
            else:  # mode=ro: never creates, never writes (nor a journal: a reader of a read-only copy)
                uri = f"{path.absolute().as_uri()}?mode=ro"
                connection = sqlite3.connect(uri, uri=True, timeout=QUIET_WAIT_SECONDS)
        except (sqlite3.Error, ValueError, OSError):
            return None, False
        index = cls(connection, path, writable, checker)
        index._waited = not wait
        try:
            connection.execute("PRAGMA trusted_schema = OFF")  # nothing of ours runs from its triggers or views
            ddl = index._call(index._ddl)
            if not ddl and writable:
                ddl = index._call(index._create)
            ours = ddl == sorted(_DDL) and index._schema() == INDEX_SCHEMA
            if ours and _plain_file(path, writable) is None and os.path.isfile(path) and not os.path.islink(path):
                return index, False  # the name still holds a plain file now that SQLite has it open
            foreign = not ours and bool(ddl)
        except sqlite3.Error as exc:
            if _busy(exc):
                _locked_at[str(path)] = time.monotonic()
            foreign = _damaged(exc)
        connection.close()
        return None, foreign

    def _ddl(self) -> list[str]:
        return sorted(str(sql) for (sql,) in self._db.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"))

    def _create(self) -> list[str]:
        """Make a new file the index, in one transaction (another process sees no half-made schema)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            if not self._ddl():  # still empty now that this process may write: no other made it meanwhile
                for statement in _DDL:
                    self._db.execute(statement)
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (INDEX_SCHEMA,))
            self._db.commit()
        except BaseException:
            self._db.rollback()
            raise
        return self._ddl()

    def _schema(self) -> str | None:
        row = self._call(lambda: self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone())
        return str(row[0]) if row else None

    def _call(self, work: Callable[[], T]) -> T:
        """work(), waiting for another process's lock: QUIET_WAIT_SECONDS unsaid, then once LOCK_WAIT_SECONDS
        said on stderr (a lock held past it raises, and the caller reads the row files)."""
        try:
            return work()
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or self._waited:
                raise
        self._waited = True  # once per opening: a command never waits twice
        warn(
            f"{self._path} is locked by another process: waiting up to {LOCK_WAIT_SECONDS:g} s, then reading the "
            "row files instead"
        )
        self._db.execute(f"PRAGMA busy_timeout = {int(LOCK_WAIT_SECONDS * 1000)}")
        try:
            return work()
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                _locked_at[str(self._path)] = time.monotonic()
                warn(f"{self._path} is still locked: the row files answer")
            raise
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute(f"PRAGMA busy_timeout = {int(QUIET_WAIT_SECONDS * 1000)}")

    def _query(self, query: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        """The rows of a query; none when the index cannot answer (then it is not asked again)."""
        if not self._usable:
            return []
        try:
            return self._call(lambda: self._db.execute(query, args).fetchall())
        except sqlite3.Error as exc:
            self._fail(exc, reading=True)
            return []

    def _fail(self, exc: sqlite3.Error, reading: bool) -> None:
        """The index cannot answer or take an entry. Damaged: made again now where the folder is writable (the
        entries of this command go into the new one). Locked past the deadline, read-only after all, a full
        disk: no longer written, and when it cannot answer, no longer asked."""
        self._give_up_writing()
        if (_damaged(exc) and not self._remade()) or (reading and not _damaged(exc)):
            self._usable = False

    def _remade(self) -> bool:
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        if not os.access(self._path.parent, os.W_OK | os.X_OK) or not self._remove(self._path):
            return False
        fresh, _ = self._connect(self._path, True, self._checker, wait=not self._waited)
        if fresh is None:
            return False
        warn(f"{self._path}: damaged; made again from the row files")
        self._db, self.writable, self._usable = fresh._db, True, True
        return True

    def stats(self, names: Sequence[str] | None = None) -> dict[str, Entry]:
        """name -> its Entry, for the sealed entries of `names` (default: all)."""
        columns = f"SELECT {_ENTRY} FROM rows"
        if names is None:
            found = self._query(columns)
        else:
            found = [r for name in names for r in self._query(f"{columns} WHERE name = ?", (_key(name),))]
        sealed = (_entry(columns_of) for columns_of in found)
        return {s.name: s.entry for s in sealed if s is not None}

    def _sealed(self, where: str, args: tuple[object, ...]) -> Iterable[tuple[str, Entry, str, str, bytes]]:
        """(name, Entry, checked_by, summary, packed lineage fingerprint) of the entries that match, whose seal,
        summary and fingerprint hold."""
        for columns in self._query(f"SELECT {_ENTRY}, summary, lineage FROM rows WHERE {where}", args):
            sealed, summary, lineage = _entry(columns[:-2]), columns[-2], columns[-1]
            if sealed is None or not isinstance(summary, str) or not isinstance(lineage, bytes):
                continue
            if hashlib.sha256(summary.encode("utf-8", "surrogatepass")).hexdigest() != sealed.summary_sha:
                continue
            if hashlib.sha256(lineage).hexdigest() == sealed.lineage_sha:
                yield sealed.name, sealed.entry, sealed.checked_by, summary, lineage

    def summary(self, name: str, entry: Entry | None = None) -> str | None:
        """The summary of `name`'s sealed entry, while that is still `entry` when given (the one whose stat was
        found to match the file)."""
        found = self.summary_and_lineage(name, entry)
        return None if found is None else found[0]

    def summary_and_lineage(self, name: str, entry: Entry | None = None) -> tuple[str, bytes] | None:
        """(summary, packed lineage fingerprint: b"" for a row without one) of `name`'s sealed entry, while that
        is still `entry` when given."""
        found = self.entry_of(name)
        return None if found is None or (entry is not None and found[0] != entry) else found[1:]

    def entry_of(self, name: str) -> tuple[Entry, str, bytes] | None:
        """(Entry, summary, packed lineage fingerprint) of `name`'s sealed entry, if it has one."""
        return self.entries_of([name]).get(name)

    def entries_of(self, names: Sequence[str]) -> dict[str, tuple[Entry, str, bytes]]:
        """entry_of for several names in one query (lineage reads the index's entries 128 at a time): name ->
        (Entry, summary, packed lineage fingerprint) of those with a sealed entry."""
        if not names:
            return {}
        keys = tuple(_key(n) for n in names)
        where = f"name IN ({', '.join('?' * len(keys))})"
        return {name: (entry, summary, lineage) for name, entry, _, summary, lineage in self._sealed(where, keys)}

    def checked(self, sha256: str) -> bool:
        """Whether bytes of this hash were checked as a row, by this session's checker, and found to need no
        change (their JSON is the row): read again, they need only be parsed."""
        if not self._checker:
            return False
        query = f"SELECT {_ENTRY} FROM rows WHERE sha256 = ? AND checked_by = ? LIMIT 8"
        return any(_entry(columns) is not None for columns in self._query(query, (sha256, self._checker)))

    def summary_of_content(self, sha256: str) -> tuple[str, Identity, bool, bytes] | None:
        """(summary, identity, checked by this checker, packed lineage fingerprint) of a row of these exact bytes,
        under whatever name."""
        for _, entry, checked_by, summary, lineage in self._sealed("sha256 = ? LIMIT 8", (sha256,)):
            if entry.sha256 == sha256:
                return summary, entry.identity, bool(self._checker) and checked_by == self._checker, lineage
        return None

    def put(
        self,
        name: str,
        stat_key: Stat,
        sha256: str,
        identity: Identity,
        summary: str,
        checked: bool,
        lineage: bytes,
    ) -> None:
        """Record (or replace) a row file's entry; kept in the open transaction until commit(). `checked`: its
        bytes were checked as a row by this session's checker and need no change. `lineage`: the row's packed
        lineage fingerprint (diagnose.lineage_packed; b"" when it has none)."""
        checked_by = self._checker if checked else ""
        stat_text = _stat_text(stat_key)
        blobs = tuple(_blob(v) for v in identity)
        summary_sha = hashlib.sha256(summary.encode("utf-8", "surrogatepass")).hexdigest()
        lineage_sha = hashlib.sha256(lineage).hexdigest()
        seal = _seal(_key(name), stat_text, sha256, blobs, checked_by, summary_sha, lineage_sha)
        self._write(
            f"INSERT OR REPLACE INTO rows ({_ENTRY}, summary, lineage) VALUES ({', '.join('?' * (len(_COLUMNS) + 9))})",
            (_key(name), stat_text, sha256, *blobs, checked_by, summary_sha, lineage_sha, seal, summary, lineage),
        )

    def forget(self, names: Iterable[str]) -> None:
        """Drop the entries of row files that are gone."""
        for name in names:
            self._write("DELETE FROM rows WHERE name = ?", (_key(name),))

    def _write(self, query: str, args: tuple[object, ...]) -> None:
        if not (self.writable and self._usable):
            return
        try:
            self._call(lambda: self._db.execute(query, args))
        except sqlite3.Error as exc:  # locked past the deadline, read-only after all, a full disk, damaged
            self._fail(exc, reading=False)
            return
        if not self._pending:
            self._since = time.monotonic()
        self._pending += 1
        if self._pending >= COMMIT_ENTRIES or time.monotonic() - self._since > COMMIT_SECONDS:
            self.commit()  # a rebuild of thousands of entries commits as it goes: no writer waits on it long

    def commit(self) -> None:
        if self.writable and self._usable and self._pending:
            try:
                self._call(self._db.commit)
            except sqlite3.Error as exc:
                self._fail(exc, reading=False)
        self._pending = 0

    def _give_up_writing(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.rollback()
        self.writable = False
        self._pending = 0

    def close(self) -> None:
        self.commit()
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

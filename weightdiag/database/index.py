"""rows/.index.sqlite: one file that lists the database's rows, so that listing and naming rows reads neither
every row file nor one summary file per row.

One table, one entry per row file: its name, the sha256 of its bytes, the (size, mtime_ns) the file had when it
was hashed, the row's identity (model id, revision, fingerprint, protocol, fit variant, created) and its summary
(the row less its per-matrix and per-vector records, as JSON). The summary is keyed on the content: an entry is
used for a file whose size and mtime are those it was hashed at (`cp -a`, `rsync -a`, a restore that keeps
times: still valid, inodes are not part of it), else the file is hashed again and an entry of the same bytes
(under any name) answers; only a row whose bytes the index has never seen is read and checked whole. A row file
rewritten in place keeping both its size and its mtime to the nanosecond would not be noticed: rows are only
ever replaced by a rename of a new file, which gets the time of its own write.

SQLite (standard library) rather than a JSON file: one entry is updated in a transaction at each row write
(a JSON index would be rewritten whole, 70 MB at 20,000 rows, by every fit), a reader takes the entries it
needs without loading the others, and several writers wait for each other (busy timeout) instead of losing
each other's updates. The index is only a cache: anything wrong with it (missing, damaged, another schema,
locked, read-only, a file system whose locks SQLite cannot trust) makes the reader fall back to the row
files, and it is rebuilt lazily by the next reader that can write it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

INDEX_NAME = ".index.sqlite"  # hidden, not *.json: never taken for a row
INDEX_SCHEMA = "weightdiag.row-index/1"
BUSY_SECONDS = 10.0  # how long a writer waits for another's transaction before leaving its entry to later
_COLUMNS = ("model_id", "revision", "fingerprint", "protocol", "variant", "created")

Stat = tuple[int, int]  # (size, mtime_ns) of a row file when it was hashed


class Entry(NamedTuple):
    """What the index says of a row file without its summary: enough to name it."""

    stat: Stat
    sha256: str
    model_id: str | None
    revision: str | None
    fingerprint: str | None


def _key(name: str) -> bytes:
    # File names as bytes: a foreign file's name need not be UTF-8 (surrogate escapes would not encode as TEXT)
    return os.fsencode(name)


class RowIndex:
    """An open index; `writable` is False where entries can only be read (a read-only database, or a write
    that failed: the rest of the session reads only)."""

    def __init__(self, connection: sqlite3.Connection, writable: bool) -> None:
        self._db = connection
        self.writable = writable
        self._pending = 0
        self._trust_checked = False

    @classmethod
    def open(cls, folder: Path, checker: str = "") -> RowIndex | None:
        """The index of the rows folder `folder`, created where it is missing and the folder writable; None when
        there is none to read (no folder, a read-only folder without an index, an index that cannot be read).
        `checker`: what checks rows (a hash of the row validator): `checked` flags set by another are not trusted."""
        path = folder / INDEX_NAME
        if not folder.is_dir():
            return None
        index = None
        if os.access(folder, os.W_OK | os.X_OK) and (not path.exists() or os.access(path, os.W_OK)):
            index = cls._connect(path, writable=True)
        if index is None and path.exists():
            index = cls._connect(path, writable=False)
        if index is not None:
            index._agree_on_checker(checker)
        return index

    def _agree_on_checker(self, checker: str) -> None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'checker'").fetchone()
            self._trust_checked = bool(checker) and row is not None and row[0] == checker
            if checker and not self._trust_checked and self.writable:  # rows checked by another validator
                with self._db:
                    self._db.execute("UPDATE rows SET checked = 0")
                    self._db.execute("INSERT OR REPLACE INTO meta VALUES ('checker', ?)", (checker,))
                self._trust_checked = True
        except sqlite3.Error:
            self._trust_checked = False

    @classmethod
    def _connect(cls, path: Path, writable: bool) -> RowIndex | None:
        try:
            if writable:
                connection = sqlite3.connect(path, timeout=BUSY_SECONDS)
            else:  # mode=ro: never creates, never writes (nor a journal: a reader of a read-only copy)
                connection = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=BUSY_SECONDS)
        except (sqlite3.Error, ValueError, OSError):
            return None
        index = cls(connection, writable)
        try:
            if index._schema() == INDEX_SCHEMA:
                return index
            if writable:
                index._create()
                return index
        except sqlite3.OperationalError:  # locked past the timeout, or not writable after all
            pass
        except sqlite3.DatabaseError:  # not a database (damaged): a cache, made again where it can be
            connection.close()
            if writable:
                with contextlib.suppress(OSError):
                    path.unlink()
                    return cls._connect(path, writable=True)
            return None
        connection.close()
        return None

    def _schema(self) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):  # a new (empty) file
                return None
            raise
        return str(row[0]) if row else None

    def _create(self) -> None:
        with self._db:
            self._db.execute("DROP TABLE IF EXISTS rows")
            self._db.execute("DROP TABLE IF EXISTS meta")
            self._db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
            self._db.execute(
                "CREATE TABLE rows (name BLOB PRIMARY KEY, size INTEGER, mtime_ns INTEGER, sha256 TEXT NOT NULL, "
                + ", ".join(f"{c} TEXT" for c in _COLUMNS)
                + ", checked INTEGER NOT NULL, summary TEXT NOT NULL)"
            )
            self._db.execute("CREATE INDEX rows_sha256 ON rows (sha256)")
            self._db.execute("CREATE INDEX rows_model ON rows (model_id)")
            self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (INDEX_SCHEMA,))

    def stats(self, names: Sequence[str] | None = None) -> dict[str, Entry]:
        """name -> its Entry, for the entries of `names` (default: all)."""
        columns = "SELECT name, size, mtime_ns, sha256, model_id, revision, fingerprint FROM rows"
        try:
            if names is None:
                found = self._db.execute(columns).fetchall()
            else:
                query = f"{columns} WHERE name = ?"
                found = [r for name in names for r in self._db.execute(query, (_key(name),)).fetchall()]
        except sqlite3.Error:
            return {}
        return {
            os.fsdecode(name): Entry((int(size), int(mtime)), str(sha), model_id, revision, fingerprint)
            for name, size, mtime, sha, model_id, revision, fingerprint in found
        }

    def summary(self, name: str) -> str | None:
        return self._one("SELECT summary FROM rows WHERE name = ?", (_key(name),))

    def checked(self, sha256: str) -> bool:
        """Whether bytes of this hash were checked as a row, by the checker of this session, and found to need
        no change (their JSON is the row): read again, they need only be parsed."""
        if not self._trust_checked:
            return False
        return self._one("SELECT 'yes' FROM rows WHERE sha256 = ? AND checked = 1 LIMIT 1", (sha256,)) == "yes"

    def summary_of_content(self, sha256: str) -> str | None:
        """The summary of a row of these exact bytes, under whatever name it was indexed."""
        return self._one("SELECT summary FROM rows WHERE sha256 = ? LIMIT 1", (sha256,))

    def _one(self, query: str, args: tuple[object, ...]) -> str | None:
        try:
            row = self._db.execute(query, args).fetchone()
        except sqlite3.Error:
            return None
        return row[0] if row and isinstance(row[0], str) else None

    def put(
        self, name: str, stat: Stat, sha256: str, identity: Sequence[str | None], summary: str, checked: bool
    ) -> None:
        """Record (or replace) a row file's entry; kept in the open transaction until commit(). `checked`: its
        bytes were checked as a row by this session's checker and need no change."""
        self._write(
            "INSERT OR REPLACE INTO rows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (_key(name), stat[0], stat[1], sha256, *identity, int(checked and self._trust_checked), summary),
        )

    def restat(self, name: str, stat: Stat) -> None:
        """The file is still the content of its entry (hashed again): only its size and mtime changed."""
        self._write("UPDATE rows SET size = ?, mtime_ns = ? WHERE name = ?", (stat[0], stat[1], _key(name)))

    def forget(self, names: Iterable[str]) -> None:
        """Drop the entries of row files that are gone."""
        for name in names:
            self._write("DELETE FROM rows WHERE name = ?", (_key(name),))

    def _write(self, query: str, args: tuple[object, ...]) -> None:
        if not self.writable:
            return
        try:
            self._db.execute(query, args)
        except sqlite3.Error:  # locked past the timeout, read-only after all, a full disk: readers repair it later
            self._give_up_writing()
            return
        self._pending += 1
        if self._pending >= 500:  # a rebuild of thousands of entries: commit as it goes, not in one huge transaction
            self.commit()

    def commit(self) -> None:
        if self.writable and self._pending:
            try:
                self._db.commit()
            except sqlite3.Error:
                self._give_up_writing()
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

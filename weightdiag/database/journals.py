"""The journals of a database (rows/.partial/<row file name>/, weightdiag.record.journal): listed with their
state, and the stale ones removed (`weightdiag db journals`, `weightdiag db gc`).

A journal is in one of three states:
- running: its fit is at work now: a sweep holds the claim of its row (store.claim), or the process that
  wrote it lives on this host and holds its records open (a fit keeps them open until its row is written;
  where /proc cannot show that, a live process is taken for the writer), or it was written from another
  host less than a day ago (that host's processes cannot be seen from here, and its clock may differ from
  ours). Never removed. A pid that names no process, or a process that does not hold the journal (init's
  pid 1, a pid reused since, a fit interrupted in a process that lives on), is no writer (issue 42: a
  journal of pid 1 or >= 2^64 was never removed).
- stale: no fit can reuse it: written by another build of weightdiag (the build identity differs), its
  manifest unreadable, its manifest.json or records.jsonl not a regular file (a FIFO, a device, a folder, a
  link: read by name only, never opened for a read that could block or not end), its local checkpoint gone
  or changed, or its row written after it. `db gc` removes it.
- interrupted: the next fit of its checkpoint with the same options resumes from it. `db gc --all` removes it
  too (that fit then reads every tensor again).
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..record.journal import MANIFEST, PARTIAL_DIR, RECORDS, SCHEMA, WRITER, build_identity, folder_bytes, read_manifest
from ..source.regular import kind_of
from .store import CLAIMS_DIR, ROWS_DIR, _live_claim, _pid_alive

OTHER_HOST_QUIET_SECONDS = 24 * 3600.0  # another host's journal without a write for this long is not running


@dataclass(frozen=True)
class JournalInfo:
    """One journal of the database, as `db journals` lists it."""

    folder: Path
    model: str | None
    revision: str | None
    size: int  # bytes
    age: float  # seconds since its last write
    host: str | None
    state: str  # running | interrupted | stale
    why: str  # what makes it running or stale ("" for interrupted)

    def to_json(self) -> dict[str, Any]:
        return {
            "journal": str(self.folder),
            "model": self.model,
            "revision": self.revision,
            "bytes": self.size,
            "age_seconds": round(self.age, 1),
            "host": self.host,
            "state": self.state,
            "why": self.why,
        }


def journals(db_dir: Path) -> list[JournalInfo]:
    """Every journal in `db_dir`'s rows/.partial, by name."""
    partial = db_dir / ROWS_DIR / PARTIAL_DIR
    try:
        folders = sorted(entry.path for entry in os.scandir(partial) if entry.is_dir(follow_symlinks=False))
    except OSError:
        return []
    return [_info(Path(folder)) for folder in folders]


def collect(db_dir: Path, *, everything: bool = False, dry_run: bool = False) -> list[JournalInfo]:
    """Remove the stale journals (`everything`: the interrupted ones too; never a running one); the ones removed
    (with `dry_run`, the ones that would be)."""
    chosen = [j for j in journals(db_dir) if j.state == "stale" or (everything and j.state == "interrupted")]
    if not dry_run:
        for j in chosen:
            shutil.rmtree(j.folder, ignore_errors=True)
    return chosen


def _irregular(folder: Path) -> str | None:
    """Why the journal's files cannot be read (a FIFO, a device, a folder, a link in place of one: the fit that
    finds it discards it), None when they can. By lstat alone: nothing here is opened."""
    for name in (MANIFEST, RECORDS):
        try:
            mode = os.lstat(folder / name).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            return f"its {name} is {kind_of(mode)}, not a regular file"
    return None


def _last_write(folder: Path) -> float:
    times = []
    for name in (MANIFEST, RECORDS):
        with contextlib.suppress(OSError):
            times.append((folder / name).lstat().st_mtime)  # the file's own time, not a linked device's
    if not times:
        with contextlib.suppress(OSError):
            times.append(folder.stat().st_mtime)
    return max(times, default=0.0)


def _this_host(written: dict[str, Any]) -> bool:
    pidns = None
    with contextlib.suppress(OSError):
        pidns = os.stat("/proc/self/ns/pid").st_ino
    return written.get("host") == platform.node() and written.get("pidns") == pidns


def _running(folder: Path, written: dict[str, Any], quiet_for: float) -> str | None:
    """Why the journal's fit may be at work now, None when it is not."""
    holder = _live_claim(folder.parent.parent / CLAIMS_DIR / folder.name)
    if holder is not None:
        return f"a sweep is fitting it ({holder})"
    pid = written.get("pid")
    if _this_host(written):
        if isinstance(pid, int) and not isinstance(pid, bool) and _pid_alive(pid) and _holds(pid, folder / RECORDS):
            return f"pid {pid} is fitting it"
        return None
    if written.get("host") is not None and abs(quiet_for) < OTHER_HOST_QUIET_SECONDS:
        return f"host {written['host']} may be fitting it (written within a day)"
    return None


def _holds(pid: int, records: Path) -> bool:
    """Whether live process `pid` may be writing `records`: it holds them open, where /proc shows its files;
    where it does not (no /proc, another user's process), unless the process runs as another user than the
    one who wrote them."""
    try:
        written = os.stat(records)
    except OSError:
        return False  # no records: no process holds them (a fit creates them as it writes its manifest)
    proc = Path("/proc") / str(pid)
    try:
        for fd in os.scandir(proc / "fd"):
            with contextlib.suppress(OSError):  # closed meanwhile
                opened = os.stat(fd.path)
                if (opened.st_dev, opened.st_ino) == (written.st_dev, written.st_ino):
                    return True
        return False
    except FileNotFoundError:  # no /proc here, or the process ended since: then nothing holds them
        return not Path("/proc/self/fd").is_dir()
    except OSError:  # another user's process: its files are hidden, its user is not
        return _uid(proc) in (None, written.st_uid)


def _uid(proc: Path) -> int | None:
    """The effective user id of the process whose /proc folder is `proc`, None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                return int(line.split()[2])
    return None


def _stale(folder: Path, document: dict[str, Any] | None, last_write: float, irregular: str | None) -> str | None:
    """Why no fit can reuse the journal, None when one may."""
    if irregular is not None:
        return irregular
    if document is None or document.get("schema") != SCHEMA:
        return "unreadable, or written by another version of weightdiag"
    if document.get("build") != build_identity():
        return "written by another build of weightdiag"
    row = folder.parent.parent / folder.name
    with contextlib.suppress(OSError):
        if row.stat().st_mtime > last_write:
            return "its row is written"
    model, written = _object(document, "model"), _object(document, WRITER)
    location = written.get("location")
    if model.get("source") == "local" and isinstance(location, str) and location:
        return _local_change(Path(location), document.get("shards"))
    return None


def _local_change(location: Path, shards: Any) -> str | None:
    """Why the local checkpoint a journal was written for is not the one it measured, None when it is."""
    if not location.exists():
        return f"its checkpoint {location} is gone"
    for shard in shards if isinstance(shards, list) else []:
        if not isinstance(shard, dict) or not isinstance(shard.get("name"), str):
            return "unreadable"
        path = location / shard["name"] if location.is_dir() else location
        try:
            st = path.stat()
        except OSError:
            return f"its shard {shard['name']} is gone"
        if st.st_size != shard.get("size") or ("mtime_ns" in shard and st.st_mtime_ns != shard["mtime_ns"]):
            return f"its shard {shard['name']} changed"
    return None


def _object(document: dict[str, Any] | None, key: str) -> dict[str, Any]:
    value = document.get(key) if document is not None else None
    return value if isinstance(value, dict) else {}


def _info(folder: Path) -> JournalInfo:
    document, _ = read_manifest(folder)  # a manifest that is no regular file: None, and _irregular says why
    written = _object(document, WRITER)
    model = _object(document, "model")
    last = _last_write(folder)
    age = time.time() - last
    running = _running(folder, written, age)
    stale = None if running else _stale(folder, document, last, _irregular(folder))
    state = "running" if running else "stale" if stale else "interrupted"
    return JournalInfo(
        folder,
        model.get("id") if isinstance(model.get("id"), str) else None,
        model.get("revision") if isinstance(model.get("revision"), str) else None,
        folder_bytes(folder),
        max(age, 0.0),
        written.get("host") if isinstance(written.get("host"), str) else None,
        state,
        running or stale or "",
    )

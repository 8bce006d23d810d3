"""Resumable fits: the records of tensors already measured, kept beside the database until the row is written.

A fit appends each tensor's records (what the row will hold for it) to a journal as soon as they are
computed, in `<db>/rows/.partial/<row file name>/`: `manifest.json` (what was being fitted, see below, and
who wrote it: host, pid, when) and `records.jsonl` (one line per tensor, appended and flushed, each with the
sha256 of its canonical JSON). When the row is written the journal is removed. A later fit of the same model
with the same options reads it back and skips those tensors. `weightdiag db journals` lists the journals of a
database and `weightdiag db gc` removes the stale ones (weightdiag.database.journals).

What may be reused, and why it is exact:
- Records are deterministic functions of a tensor's bytes, of what the plan read beside them (config.json
  with its quantization_config, hf_quant_config.json, the shards' headers and index), of the options, of
  the kernels (C or numpy: they differ in the last digits of F32 sums) and of the code. The manifest names
  each: a hash of the plan's config, quantization config, metadata and tensor table; the fit options that
  change a record; the kernels; and the build (a hash of the package's own .py and .c sources, so any
  change of the code counts, where `__version__` would not). JSON keeps every float's exact value
  (shortest repr round-trips), so a resumed row's records equal an uninterrupted fit's.
- A shard's identity must be unchanged: its name, size and header hash always; its sha256 (Hub, HF
  cache, --hash) when known; for local files without one, also its modification time and inode. Any
  change: the journal is discarded, with one line on stderr saying why, and the fit starts over.
- Each record is checked as the row's reader checks it (record.schema: one schema), against its checksum,
  and against the records its tensor gives in this fit (names, matrix or vector); a record that fails
  (damaged, cut off, emptied) is dropped with one line on stderr and its tensor read again. So is one that
  holds a number no row can (NaN, an infinity, an integer past 64 bits): the row is written as strict JSON,
  and a checksum proves only that a line is whole, not who wrote it.
- The journal's files are read only as regular files, never through a link (weightdiag writes none) and within
  a bound (a manifest of MAX_MANIFEST_BYTES, records of a row's MAX_ROW_BYTES): a FIFO there would block the
  fit, a link to /dev/zero read for ever. One that is not discards the journal with one line (`db journals`
  calls it stale, `db gc` removes it); a link is removed, never what it points to. They are created with
  O_EXCL, so never written through what a failed removal left in their place.
- Where the reader verifies shards by sha256 (the Hub), the records of a shard are reused only once the
  whole shard was read and its hash matched (the reader reports that shard by shard); a shard cut off
  mid-way is read again whole, since its hash needs every byte anyway. Files read locally are not
  hashed, so their tensors are reused one by one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import stat
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..build import build_identity, kernels_in_use
from ..source.plan import ModelPlan
from ..source.regular import IrregularFile, kind_of, open_regular, read_bounded, too_large
from .schema import MAX_ROW_BYTES, MatrixRecord, VectorRecord, problem_of

# /2: the manifest names the plan, the kernels and the build; every record carries its sha256. A journal of /1
# is not reused (its manifest differs).
SCHEMA = "weightdiag.resume/2"
PARTIAL_DIR = ".partial"  # rows/.partial/<row file name>/: the journal of a fit that has not written its row
MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
WRITER = "writer"  # the manifest's key for who wrote it and when: not part of what is compared
MAX_MANIFEST_BYTES = 64 << 20  # a manifest names the options and the shards: kilobytes, megabytes for 10^4 shards
MAX_RECORDS_BYTES = MAX_ROW_BYTES  # the records are what the row will hold, and no row is larger


@dataclass(frozen=True)
class Entry:
    """One tensor's records as the row holds them."""

    shard: int
    matrices: list[dict[str, Any]]
    vectors: list[dict[str, Any]]


@dataclass(frozen=True)
class Expected:
    """What this fit makes of a tensor: its shard and the names of its matrix and vector records, in order."""

    shard: int
    matrices: tuple[str, ...]
    vectors: tuple[str, ...]


@dataclass
class Resumed:
    """Records read back from an interrupted fit: per tensor name, (matrix records, vector records)."""

    records: dict[str, Entry] = field(default_factory=dict)
    skip_shards: set[int] = field(default_factory=set)  # whole shards done and verified: not read at all
    started: str | None = None  # when the interrupted fit began (UTC, ISO 8601)


def _canonical(document: Any) -> bytes:
    # ensure_ascii: names holding lone surrogates (undecodable bytes) hash too
    return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str).encode("ascii")


def _plan_identity(plan: ModelPlan) -> str:
    """A hash of everything the plan read besides the shards' bytes that shapes a record: config.json (with
    its quantization_config), hf_quant_config.json, the headers' metadata and tensor table (the index's map)."""
    tensors = [
        {
            "name": t.name,
            "dtype": t.dtype.name,
            "shape": t.shape,
            "at": [t.shard, t.start, t.end, t.stored_nbytes],
            "as": [t.note, t.stored_type, t.quantization, t.quant.spec.to_json() if t.quant is not None else None],
        }
        for t in plan.tensors
    ]
    document = {
        "config": plan.config,
        "quant_config": plan.quant_config,
        "metadata": plan.metadata,
        "format": plan.file_format,
        "tensors": tensors,
    }
    return hashlib.sha256(_canonical(document)).hexdigest()


def _shard_identity(plan: ModelPlan, index: int) -> dict[str, Any]:
    shard = plan.shards[index]
    identity: dict[str, Any] = {
        "name": shard.name,
        "size": shard.size,
        "sha256": shard.sha256,
        "header_sha256": shard.header_sha256,
    }
    if plan.source == "local" and shard.sha256 is None:  # no content hash: the file's own identity
        root = Path(plan.location)
        path = root / shard.name if root.is_dir() else root
        try:
            st = path.stat()
            identity.update(mtime_ns=st.st_mtime_ns, inode=st.st_ino, device=st.st_dev)
        except OSError:
            identity.update(mtime_ns=None)
    return identity


def manifest(plan: ModelPlan, options: dict[str, Any]) -> dict[str, Any]:
    """What a journal belongs to; a journal is reused only under an equal manifest (but its writer)."""
    return {
        "schema": SCHEMA,
        "build": build_identity(),
        "kernels": kernels_in_use(),
        "model": {"id": plan.model_id, "source": plan.source, "revision": plan.revision, "commit": plan.commit},
        "options": options,
        "plan": _plan_identity(plan),
        "shards": [_shard_identity(plan, i) for i in range(len(plan.shards))],
    }


def writer(started: str, location: str) -> dict[str, Any]:
    """Who writes a journal: `db journals` shows the host, `db gc` never removes one whose process lives."""
    pidns = None
    with contextlib.suppress(OSError):
        pidns = os.stat("/proc/self/ns/pid").st_ino  # containers may share a hostname, never a pid namespace
    return {"started": started, "host": platform.node(), "pidns": pidns, "pid": os.getpid(), "location": location}


# Why a journal is not reused, by the first manifest field that differs (in this order).
_WHY = {
    "schema": "it was written by another version of weightdiag",
    "build": "it was written by another build of weightdiag (the code changed since)",
    "kernels": "it was measured with other kernels (C or numpy)",
    "model": "it belongs to another checkpoint",
    "options": "it was fitted with other options",
    "plan": "config.json or another file of the checkpoint changed since",
    "shards": "a shard file changed since",
}


def mismatch(old: Any, new: dict[str, Any]) -> str | None:
    """Why the manifest `old` (read back) is not `new`'s, None when they match (their writers aside)."""
    if not isinstance(old, dict):
        return "its manifest is unreadable"
    for key in _WHY:
        if old.get(key) != new.get(key):
            return _WHY[key] if key != "schema" or old.get(key) else "its manifest is unreadable"
    extra = set(old) - set(new) - {WRITER}
    return f"its manifest holds {sorted(extra)[0]!r}, unknown to this weightdiag" if extra else None


def read_manifest(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A journal's manifest read back, or why it cannot be (None, None: there is none). Only a regular file of
    at most MAX_MANIFEST_BYTES is read: a FIFO there would block, a link to /dev/zero read for ever."""
    try:
        data = read_bounded(folder / MANIFEST, MAX_MANIFEST_BYTES, links=False)
    except FileNotFoundError:
        return None, None
    except IrregularFile as exc:
        return None, f"its {MANIFEST} {exc}"
    except OSError:
        return None, "its manifest is unreadable"
    try:
        document = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        document = None
    return (document, None) if isinstance(document, dict) else (None, "its manifest is unreadable")


def digest(entry: dict[str, Any]) -> str:
    """The sha256 of a journal line's canonical JSON, its own `sha256` left out."""
    return hashlib.sha256(_canonical({k: v for k, v in entry.items() if k != "sha256"})).hexdigest()


def warn(text: str) -> None:
    """One line on stderr: the journal is below the command line, and what it drops must be said wherever it
    runs (fit, compare, sweep's workers)."""
    line = f"warning: {text}\n"
    stream = sys.stderr
    if stream is not None:
        with contextlib.suppress(OSError, ValueError):
            stream.write(line.encode("utf-8", "backslashreplace").decode("utf-8"))
            stream.flush()


class Journal:
    """One fit's journal: open it before the fit, `add` each tensor's records, `close` on success."""

    def __init__(self, folder: Path, document: dict[str, Any], verifies: bool, location: str = "") -> None:
        self.folder = folder
        self.document = document
        self.verifies = verifies  # the reader checks shards by sha256: reuse only verified shards
        self.location = location
        self._file: Any = None
        self._written = False

    @classmethod
    def for_row(
        cls, rows_dir: Path, row_file: str, plan: ModelPlan, options: dict[str, Any], verifies: bool
    ) -> Journal:
        return cls(rows_dir / PARTIAL_DIR / row_file, manifest(plan, options), verifies, plan.location)

    # -- reading back ----------------------------------------------------------------------------------

    def load(self, expected: dict[str, Expected]) -> Resumed:
        """What an interrupted fit left that this fit may reuse: `expected` holds, for each tensor this fit
        reads, its shard and the records it gives. A journal that does not match is removed (one line says
        why); a record that is damaged is dropped (one line says how many) and its tensor read again."""
        if _not_a_folder(self.folder.parent):
            return Resumed()  # rows/.partial is a link out of the database: start() says no journal is kept
        what = _not_a_folder(self.folder)
        if what:  # weightdiag makes a folder here: a link to one is someone else's
            return self._not_reused(f"it is {what}, not a folder")
        old, why = read_manifest(self.folder)
        if old is None and why is None:
            self.discard()  # none, or one cut off before its manifest: nothing to say
            return Resumed()
        why = why or mismatch(old, self.document)
        if why is not None:
            return self._not_reused(why)
        assert old is not None  # mismatch() said it is this fit's manifest
        value = old.get(WRITER)
        written: dict[str, Any] = value if isinstance(value, dict) else {}
        started = written.get("started") if isinstance(written.get("started"), str) else None
        try:
            return self._records(expected, started)
        except IrregularFile as exc:
            return self._not_reused(f"its {RECORDS} {exc}")
        except Exception as exc:  # never a fit lost to its journal: anything unforeseen, and it starts over
            warn(f"{self.folder}: the journal is unreadable ({type(exc).__name__}); the fit starts over")
            self.discard()
            return Resumed()

    def _not_reused(self, why: str) -> Resumed:
        warn(f"{self.folder}: the journal of an interrupted fit is not reused: {why}; the fit starts over")
        self.discard()
        return Resumed()

    def _records(self, expected: dict[str, Expected], started: str | None) -> Resumed:
        entries: dict[str, Entry] = {}
        verified: set[int] = set()
        damaged: list[str] = []
        path = self.folder / RECORDS
        for number, line in _lines(path, MAX_RECORDS_BYTES):
            if isinstance(line, str):  # not JSON: cut off by the interruption, or damaged
                damaged.append(f"line {number}: {line}")
                continue
            problem = _problem(line, expected)
            if problem is not None:
                damaged.append(f"line {number}: {problem}")
            elif "verified_shard" in line:
                verified.add(line["verified_shard"])
            elif line["name"] in expected:
                entries[line["name"]] = Entry(line["shard"], line["matrices"], line["vectors"])
        if damaged:
            n = len(damaged)
            more = f", and {n - 1} more" if n > 1 else ""
            warn(
                f"{path}: {n} damaged journal record{'s' if n > 1 else ''} dropped ({damaged[0]}{more}); "
                f"{'their tensors are' if n > 1 else 'its tensor is'} read again"
            )
        tensors_in: dict[int, int] = {}
        for e in expected.values():
            tensors_in[e.shard] = tensors_in.get(e.shard, 0) + 1
        done_per_shard: dict[int, int] = {}
        for entry in entries.values():
            done_per_shard[entry.shard] = done_per_shard.get(entry.shard, 0) + 1
        complete = {s for s, n in done_per_shard.items() if n == tensors_in.get(s)}
        if self.verifies:  # only whole shards whose hash matched
            usable = complete & verified
            entries = {name: e for name, e in entries.items() if e.shard in usable}
            return Resumed(entries, usable, started)
        return Resumed(entries, complete, started)

    # -- writing ---------------------------------------------------------------------------------------

    def start(self, started: str, kept: Resumed) -> None:
        """Begin (or continue) the journal: the manifest, then the records reused, then this fit's."""
        self.discard()
        try:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            for folder in (self.folder.parent, self.folder):  # rows/.partial, then this journal's own folder
                folder.mkdir(exist_ok=True)
                what = _not_a_folder(folder)
                if what:  # a link: the journal would be written outside the database (checked before writing in)
                    warn(f"{folder} is {what}, not a folder; this fit keeps no journal to resume from")
                    raise IrregularFile(f"is {what}")
            # Whole or absent (a manifest cut off by a crash is unreadable: the journal is discarded). Not
            # db.write_text_atomic: the measurement stage imports nothing of the database.
            temporary = self.folder / f".manifest.json.{os.getpid()}.tmp"
            document = {**self.document, WRITER: writer(kept.started or started, self.location)}
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            with os.fdopen(_create(temporary), "w", encoding="utf-8") as f:
                f.write(json.dumps(document))
            os.replace(temporary, self.folder / MANIFEST)
            self._file = os.fdopen(_create(self.folder / RECORDS), "w", encoding="utf-8")  # open until close
        except OSError:  # a full disk: the fit goes on (its row may still reach --json), it only cannot be resumed
            self.discard()
            return
        for name, e in kept.records.items():
            self._append({"name": name, "shard": e.shard, "matrices": e.matrices, "vectors": e.vectors}, flush=False)
        for shard in sorted(kept.skip_shards):
            self._append({"verified_shard": shard}, flush=False)
        if self._file is not None:
            try:
                self._file.flush()
            except OSError:
                self._close_file()

    def add(self, name: str, shard: int, matrices: list[dict[str, Any]], vectors: list[dict[str, Any]]) -> None:
        self._append({"name": name, "shard": shard, "matrices": matrices, "vectors": vectors})

    def verified(self, shards: Iterable[int]) -> None:
        for shard in shards:
            self._append({"verified_shard": shard})

    def _append(self, entry: dict[str, Any], flush: bool = True) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps({**entry, "sha256": digest(entry)}, allow_nan=True) + "\n")
            if flush:
                self._file.flush()  # in the OS's hands: survives a kill, if not a power cut
            self._written = True
        except OSError:  # a full disk: the fit goes on, it only cannot be resumed
            self._close_file()

    def _close_file(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def size(self) -> int:
        """Bytes the journal takes on disk now."""
        return folder_bytes(self.folder)

    def suspend(self) -> None:
        """The fit stopped before its row was written: keep what is journaled for the next run (if anything)."""
        self._close_file()
        if not self._written:
            self.discard()

    def discard(self) -> None:
        """The row is written (or the journal is stale): remove it."""
        self._close_file()
        # rows/.partial itself stays: removing it when it looks empty races with another fit (a sweep's
        # worker) creating its journal there.
        if _not_a_folder(self.folder.parent):
            return  # rows/.partial is a link: nothing is removed through it
        try:
            linked = not stat.S_ISDIR(os.lstat(self.folder).st_mode)
        except OSError:
            return  # none
        if linked:  # a link or a file in its place: removed itself, never what a link points to
            with contextlib.suppress(OSError):
                os.unlink(self.folder)
            return
        shutil.rmtree(self.folder, ignore_errors=True)


def _not_a_folder(path: Path) -> str | None:
    """What `path` is when it is no folder of its own (a link to one, a file...), None when it is one or is none."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISDIR(mode) else kind_of(mode)


def _create(path: Path) -> int:
    """A new file of the journal's, opened for writing: O_EXCL, so never through a link, nor onto a FIFO (whose
    open would wait for a reader) or any file left in its place by a removal that failed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o644)


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` (0 when it is not there)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


_RECORD_TYPES = (("matrices", MatrixRecord), ("vectors", VectorRecord))


def _problem(line: dict[str, Any], expected: dict[str, Expected]) -> str | None:
    """What is wrong with a journal line, None when it may be reused (or belongs to no tensor of this fit)."""
    if not isinstance(line.get("sha256"), str):
        return "no checksum"
    if line["sha256"] != digest(line):
        return "bad checksum"
    if "verified_shard" in line:
        shard = line["verified_shard"]
        return None if isinstance(shard, int) and not isinstance(shard, bool) else "not a shard number"
    name = line.get("name")
    if not isinstance(name, str):
        return "no tensor name"
    want = expected.get(name)
    if want is None:
        return None  # a tensor this fit does not read: left alone
    if line.get("shard") != want.shard:
        return f"{name}: another shard"
    for key, typed in _RECORD_TYPES:
        records = line.get(key)
        if not isinstance(records, list):
            return f"{name}: no list of {key}"
        names = tuple(r.get("name") if isinstance(r, dict) else None for r in records)
        if names != getattr(want, key):
            return f"{name}: {len(records)} {key} records, where the tensor gives {len(getattr(want, key))}"
        for i, record in enumerate(records):
            problem = problem_of(typed, record, f"{key}[{i}]")
            if problem is not None:
                return f"{name}: {problem}"
    return None


class _NotInARow(ValueError):
    """A number no row can hold: the row is written as strict JSON (NaN and infinities as null), so a record
    holding one, checksum or not, would pass every check here and fail the row's write at the end of the fit."""


def _no_constant(name: str) -> float:
    raise _NotInARow(f"holds {name}, which no row holds")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: a finite literal that parses to infinity
        raise _NotInARow(f"holds {text[:40]}, out of a float's range")
    return value


def _bounded(text: str) -> int:
    value = int(text)
    if not -(1 << 63) <= value < 1 << 64:  # a count or a size: 64 bits; past that, float() of it overflows
        raise _NotInARow(f"holds an integer of {len(text)} digits")
    return value


def _lines(path: Path, limit: int) -> Iterable[tuple[int, dict[str, Any] | str]]:
    """Each line's number and its JSON object; for a line that is none, why (a text). IrregularFile when the
    file is not a regular one (a FIFO would block, a link to /dev/zero read for ever) or holds over `limit`
    bytes."""
    try:
        f = open_regular(path, links=False)  # weightdiag never writes a link here
    except FileNotFoundError:
        return  # cut off between the manifest and the first record
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise too_large(size, limit)
        left, number = limit, 0
        while True:
            try:  # each line read with what is left of the bound: the file may grow while it is read
                raw = f.readline(left) if left else f.read(1)
            except OSError:  # EIO: the records read so far are used, the rest read again
                return
            if not raw:
                return
            if not left:
                raise too_large(limit + 1, limit)
            left -= len(raw)
            number += 1
            text = raw.decode("utf-8", errors="surrogateescape")
            if not text.strip():
                yield number, "empty"
                continue
            try:
                entry = json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_bounded)
            except _NotInARow as exc:
                yield number, str(exc)
                continue
            except (ValueError, RecursionError):
                yield number, "cut off or not JSON"
                continue
            yield number, entry if isinstance(entry, dict) else "not a JSON object"


def resume_options(options: Any) -> dict[str, Any]:
    """The fit options that change a tensor's records (not the device, threads or connections)."""
    return {
        "protocol": options.protocol,  # not the trim: it picks the per-kind summaries, made from the records
        "center": bool(options.center),
        "include": sorted(options.include or []),
        "exclude": sorted(options.exclude or []),
        "split_fused": bool(options.split_fused),
    }

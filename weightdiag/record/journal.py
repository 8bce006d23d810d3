"""Resumable fits: the records of tensors already measured, kept beside the database until the row is written.

A fit appends each tensor's records (what the row will hold for it) to a journal as soon as they are
computed, in `<db>/rows/.partial/<row file name>/`: `manifest.json` (what was being fitted: the model, its
revision, the fit options that change a record, and each shard's identity) and `records.jsonl` (one line
per tensor, appended and flushed; a line torn by a crash is ignored). When the row is written the journal
is removed. A later fit of the same model with the same options reads it back and skips those tensors.

What may be reused, and why it is exact:
- Records are deterministic functions of a tensor's bytes and the options; JSON keeps every float's
  exact value (shortest repr round-trips), so a resumed row's records equal an uninterrupted fit's.
- A shard's identity must be unchanged: its name, size and header hash always; its sha256 (Hub, HF
  cache, --hash) when known; for local files without one, also its modification time and inode. Any
  change, another tool version or other options: the journal is discarded and the fit starts over.
- Where the reader verifies shards by sha256 (the Hub), the records of a shard are reused only once the
  whole shard was read and its hash matched (the reader reports that shard by shard); a shard cut off
  mid-way is read again whole, since its hash needs every byte anyway. Files read locally are not
  hashed, so their tensors are reused one by one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..source.plan import ModelPlan

SCHEMA = "weightdiag.resume/1"
PARTIAL_DIR = ".partial"  # rows/.partial/<row file name>/: the journal of a fit that has not written its row


@dataclass(frozen=True)
class Entry:
    """One tensor's records as the row holds them."""

    shard: int
    matrices: list[dict[str, Any]]
    vectors: list[dict[str, Any]]


@dataclass
class Resumed:
    """Records read back from an interrupted fit: per tensor name, (matrix records, vector records)."""

    records: dict[str, Entry] = field(default_factory=dict)
    skip_shards: set[int] = field(default_factory=set)  # whole shards done and verified: not read at all
    started: str | None = None  # when the interrupted fit began (UTC, ISO 8601)


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
    """What a journal belongs to; a journal is reused only under an equal manifest (but its start time)."""
    return {
        "schema": SCHEMA,
        "tool": __version__,
        "model": {"id": plan.model_id, "source": plan.source, "revision": plan.revision, "commit": plan.commit},
        "options": options,
        "shards": [_shard_identity(plan, i) for i in range(len(plan.shards))],
    }


class Journal:
    """One fit's journal: open it before the fit, `add` each tensor's records, `close` on success."""

    def __init__(self, folder: Path, document: dict[str, Any], verifies: bool) -> None:
        self.folder = folder
        self.document = document
        self.verifies = verifies  # the reader checks shards by sha256: reuse only verified shards
        self._file: Any = None
        self._written = False

    @classmethod
    def for_row(
        cls, rows_dir: Path, row_file: str, plan: ModelPlan, options: dict[str, Any], verifies: bool
    ) -> Journal:
        return cls(rows_dir / PARTIAL_DIR / row_file, manifest(plan, options), verifies)

    # -- reading back ----------------------------------------------------------------------------------

    def load(self, shard_of: dict[str, int], tensors_in: dict[int, int]) -> Resumed:
        """What an interrupted fit left that this fit may reuse: `shard_of` maps each tensor this fit reads
        to its shard, `tensors_in` counts them per shard. A journal that does not match is removed."""
        try:
            old = json.loads((self.folder / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.discard()
            return Resumed()
        started = old.pop("started", None) if isinstance(old, dict) else None
        if old != self.document:
            self.discard()  # another checkpoint, version or options: nothing in it is ours
            return Resumed()
        entries: dict[str, Entry] = {}
        verified: set[int] = set()
        for line in _lines(self.folder / "records.jsonl"):
            if "verified_shard" in line:
                verified.add(int(line["verified_shard"]))
            elif line.get("name") in shard_of and line.get("shard") == shard_of[line["name"]]:
                entries[line["name"]] = Entry(
                    line["shard"], list(line.get("matrices") or []), list(line.get("vectors") or [])
                )
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
            self.folder.mkdir(parents=True, exist_ok=True)
            # Whole or absent (a manifest cut off by a crash is unreadable: the journal is discarded). Not
            # db.write_text_atomic: the measurement stage imports nothing of the database.
            temporary = self.folder / f".manifest.json.{os.getpid()}.tmp"
            temporary.write_text(json.dumps({**self.document, "started": kept.started or started}), encoding="utf-8")
            os.replace(temporary, self.folder / "manifest.json")
            self._file = open(self.folder / "records.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (open until close)
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
            self._file.write(json.dumps(entry, allow_nan=True) + "\n")
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
        shutil.rmtree(self.folder, ignore_errors=True)


def _lines(path: Path) -> Iterable[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            for text in f:
                try:
                    entry = json.loads(text)
                except ValueError:
                    continue  # a line cut off by the interruption
                if isinstance(entry, dict):
                    yield entry
    except OSError:
        return


def resume_options(options: Any) -> dict[str, Any]:
    """The fit options that change a tensor's records (not the device, threads or connections)."""
    return {
        "protocol": options.protocol,  # not the trim: it picks the per-kind summaries, made from the records
        "center": bool(options.center),
        "include": sorted(options.include or []),
        "exclude": sorted(options.exclude or []),
        "split_fused": bool(options.split_fused),
    }

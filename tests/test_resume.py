"""Resumable fits (weightdiag.record.journal): an interrupted fit leaves the records it measured beside the database;
the next fit of the same checkpoint reuses them, reads only the rest and writes the row an uninterrupted fit
writes. Stale journals (a file changed, other options, another tool version) are never reused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from weightdiag import api
from weightdiag.errors import HubError, VerificationError
from weightdiag.progress import Silent
from weightdiag.record.journal import PARTIAL_DIR
from weightdiag.run.measure import FitOptions

from .conftest import run_cli
from .hub_server import small_model_in_small_chunks, write_small_model

_CONTEXT = ("created", "run")


def _science(row: dict) -> dict:
    """Everything the fit measured and interpreted (not when or how long it ran)."""
    return {k: v for k, v in row.items() if k not in _CONTEXT}


class _StopAfter(Silent):
    """A Progress that interrupts the fit (as Ctrl-C does) after `n` tensors."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.begun: dict | None = None
        self.done = 0

    def started(self, model: str, tensors: int, nbytes: int) -> None:
        self.begun = {"model": model, "tensors": tensors, "bytes": nbytes}

    def measured(self, tensor: str) -> None:
        self.done += 1
        if self.done == self.n:
            raise KeyboardInterrupt


def _journal(db: Path) -> list[Path]:
    folder = db / "rows" / PARTIAL_DIR
    return sorted(folder.iterdir()) if folder.exists() else []


@pytest.fixture
def model(tmp_path_factory) -> Path:
    return write_small_model(tmp_path_factory.mktemp("model"), shard_bytes=120_000)


def _fit(spec: str, db: Path, progress=None, **options) -> dict:
    return api.fit(spec, FitOptions(device="cpu", **options), progress, db_dir=db).row


def test_a_fit_interrupted_half_way_resumes_and_equals_the_uninterrupted_row(model, tmp_path):
    whole = _fit(str(model), tmp_path / "ref")
    n = len(whole["matrices"]) + len(whole["vectors"])
    db = tmp_path / "db"
    stop = _StopAfter(n // 2)
    with pytest.raises(KeyboardInterrupt):
        _fit(str(model), db, stop)
    assert not list((db / "rows").glob("*.json"))  # no row, only the journal
    assert len(_journal(db)) == 1
    again = _StopAfter(10**9)
    row = _fit(str(model), db, again)
    assert again.begun["tensors"] < stop.begun["tensors"]  # only the rest was read
    assert _science(row) == _science(whole)
    resumed = row["run"]["resumed"]
    assert resumed["tensors"] == stop.begun["tensors"] - again.begun["tensors"] >= n // 4
    assert resumed["bytes"] > 0 and resumed["since"]
    assert not _journal(db)  # the row holds it all: the journal is gone
    # and the row on disk is the row returned, read back through the strict reader
    (path,) = (db / "rows").glob("*.json")
    assert _science(json.loads(path.read_text())) == _science(whole)


def test_twice_interrupted_then_resumed(model, tmp_path):
    whole = _fit(str(model), tmp_path / "ref")
    db = tmp_path / "db"
    for n in (3, 4):
        with pytest.raises(KeyboardInterrupt):
            _fit(str(model), db, _StopAfter(n))
    row = _fit(str(model), db)
    assert row["run"]["resumed"]["tensors"] >= 6
    assert _science(row) == _science(whole)


def test_a_changed_file_is_never_resumed(model, tmp_path):
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        _fit(str(model), db, _StopAfter(5))
    shard = sorted(model.glob("*.safetensors"))[0]
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten in place, same size
    row = _fit(str(model), db)
    assert "resumed" not in row["run"]
    assert not _journal(db)


def test_other_options_and_a_torn_journal(model, tmp_path):
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        _fit(str(model), db, _StopAfter(5))
    (journal,) = _journal(db)
    with open(journal / "records.jsonl", "a") as f:
        f.write('{"name": "cut off by the interrup')  # a line torn by a crash: ignored
    centered = _fit(str(model), db, center=True)  # another row (a variant): its own journal, nothing reused
    assert "resumed" not in centered["run"]
    row = _fit(str(model), db)
    assert row["run"]["resumed"]["tensors"] == 5


def test_another_tool_build_starts_over(model, tmp_path, monkeypatch):
    """The build identity hashes the package's sources: a journal written by another build is not reused,
    even when __version__ is the same (it has been 0.1.0 in every commit)."""
    db = tmp_path / "db"
    monkeypatch.setattr("weightdiag.record.journal.build_identity", lambda: "0.1.0+an-older-build")
    with pytest.raises(KeyboardInterrupt):
        _fit(str(model), db, _StopAfter(5))
    monkeypatch.undo()
    assert "resumed" not in _fit(str(model), db)["run"]


def test_the_command_says_what_it_reused(model, tmp_path):
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        _fit(str(model), db, _StopAfter(5))
    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert "resumed an interrupted fit: 5 tensors (" in out.stderr


@pytest.mark.e2e
def test_a_hub_fit_resumes_from_its_verified_shards_only(fake_hub, tmp_path, monkeypatch, knobs):
    """From the Hub, shards are hashed as they stream: only whole shards whose sha256 matched are reused
    and they are not requested again; the shard cut off is read again whole (its hash needs every byte)."""
    model = small_model_in_small_chunks(fake_hub, tmp_path / "model", monkeypatch, knobs)
    whole = api.fit_model("acme/tiny", FitOptions(device="cpu"))
    db = tmp_path / "db"
    n = len(whole["matrices"]) + len(whole["vectors"])
    with pytest.raises(KeyboardInterrupt):
        api.fit("acme/tiny", FitOptions(device="cpu", connections=1), _StopAfter(n * 2 // 3), db_dir=db)
    fake_hub.reset_counters()
    row = api.fit("acme/tiny", FitOptions(device="cpu"), db_dir=db).row
    assert {k: v for k, v in row.items() if k not in ("created", "run")} == {
        k: v for k, v in whole.items() if k not in ("created", "run")
    }
    assert row["run"]["resumed"]["tensors"] > 0
    assert "by the interrupted fit this one resumed" in row["run"]["verification"]
    assert all(f["verified"] for f in row["files"])
    # Every shard's header is read to plan the fit; the bodies of the shards reused are not read again.
    sizes = [p.stat().st_size for p in model.glob("*.safetensors")]
    assert fake_hub.file_bytes_sent < sum(sizes) - min(sizes) // 2


def test_a_hub_fit_whose_journal_holds_every_shard_reads_nothing_and_stays_verified(
    fake_hub, tmp_path, monkeypatch, knobs
):
    """Stopped at its last tensor, every shard already hashed and journaled: the resumed fit reads no tensor byte,
    and its row is the uninterrupted one's, every file verified (the interrupted fit hashed them)."""
    small_model_in_small_chunks(fake_hub, tmp_path / "model", monkeypatch, knobs)
    whole = api.fit_model("acme/tiny", FitOptions(device="cpu"))
    db = tmp_path / "db"
    n = len(whole["matrices"]) + len(whole["vectors"])
    with pytest.raises(KeyboardInterrupt):
        api.fit("acme/tiny", FitOptions(device="cpu"), _StopAfter(n), db_dir=db)
    row = api.fit("acme/tiny", FitOptions(device="cpu"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] == n
    assert _science(row) == _science(whole)
    assert all(f["verified"] for f in row["files"])


@pytest.mark.e2e
def test_a_network_failure_keeps_the_journal_and_a_corrupt_shard_discards_it(fake_hub, tmp_path, monkeypatch, knobs):
    """A connection that keeps dropping (exit 3 once the retries are spent) is an interruption: the verified
    shards are kept and the next run resumes. Bytes that fail their sha256 are not: nothing is kept."""
    model = small_model_in_small_chunks(fake_hub, tmp_path / "model", monkeypatch, knobs, attempts=2)
    last = sorted(p.name for p in model.glob("*.safetensors"))[-1]
    db = tmp_path / "db"
    fake_hub.fail("drop", last, times=None, method="GET", after_bytes=6000)  # headers (4 KiB) pass
    with pytest.raises(HubError):
        api.fit("acme/tiny", FitOptions(device="cpu", connections=1), db_dir=db)
    assert len(_journal(db)) == 1
    fake_hub.clear_faults()
    row = api.fit("acme/tiny", FitOptions(device="cpu"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] > 0 and not _journal(db)

    db2 = tmp_path / "db2"
    fake_hub.fail("corrupt", last, times=1, method="GET")
    with pytest.raises(VerificationError):
        api.fit("acme/tiny", FitOptions(device="cpu", connections=1), db_dir=db2)
    assert not _journal(db2)

"""The README's promises about interruptions, resuming and writing nothing, each checked as written (issue 20,
acceptance 3). Each test quotes the sentence it checks. Signals go to real processes; the moment a signal
lands is made certain, not timed: WEIGHTDIAG_TEST_ROW_WRITE_DELAY holds the writer between its temporary
row file and the rename, and the test signals once that temporary file exists (the fit is measured, its
row not yet written).

The README's other robustness promises are checked where their code is tested:
- sweep --jobs 2 and SIGINT/SIGTERM/SIGHUP to the sweep alone, workers ended, no row after the signal; workers
  of a sweep killed with kill -9 exit; kill -9 mid-sweep then rerun; two sweeps share the work (claims); api.sweep
  leaves the environment alone: tests/test_sweep.py
- a claim whose process is gone is taken over: tests/test_db_claims.py
- disk full (ENOSPC at the row): fit --json prints the row, sweep stops at the first row: tests/test_disk_full.py
- an interrupted fit resumed half-way and twice equals the uninterrupted row; stale journals (a file changed,
  other options, another version); the Hub reuses verified shards only; a network failure keeps the journal,
  a corrupt shard discards it; `fit` says what it reused: tests/test_resume.py
- a shard changed while read: exit 2, one line, no row (nor journal); 300 shards under ulimit -n 256:
  tests/test_changing_files.py
- atomic rows (eight concurrent fits killed at random lose nothing), one file per model id, stale temporary
  files removed, unwritable databases refused before the fit: tests/test_db_safety.py, tests/test_cli.py
- variants never replace nor stand for the full row, in fit and sweep: tests/test_db_variants.py
- exit codes 2, 3, 4, 5 with one line: tests/test_cli_surface.py, tests/test_errors.py; a closed pipe is exit 0:
  tests/test_cli.py
- Hub deadlines (metadata, refs, stalled and trickling bodies, --download): tests/test_hub_metadata.py,
  tests/test_hub_stream.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from weightdiag import api, tuning
from weightdiag.database.store import load_row
from weightdiag.progress import Silent
from weightdiag.record.journal import PARTIAL_DIR
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .conftest import CLI_ENV, default_signals, run_cli

pytestmark = pytest.mark.e2e

_CONTEXT = ("created", "run")
WAIT = 60.0  # seconds a state may take to appear before the test gives up (never reached when all is well)


def _science(row: dict) -> dict:
    """Everything the fit measured and interpreted (not when, where or how long it ran)."""
    return {k: v for k, v in row.items() if k not in _CONTEXT}


def _rows(db: Path) -> list[Path]:
    return sorted((db / "rows").glob("*.json"))


def _temps(db: Path) -> list[Path]:
    return sorted((db / "rows").glob(".*.tmp"))


def _journals(db: Path) -> list[Path]:
    try:
        return sorted((db / "rows" / PARTIAL_DIR).iterdir())
    except OSError:  # none (yet, or no more)
        return []


def _journal_lines(journal: Path) -> list[dict]:
    """The whole lines of a journal's records (none while it is being created)."""
    lines = []
    try:
        text = (journal / "records.jsonl").read_text()
    except OSError:
        return lines
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # a line torn by the interruption
            lines.append(json.loads(line))
    return lines


def _journaled(journal: Path) -> int:
    """Tensors whose records a journal holds."""
    return sum("name" in line for line in _journal_lines(journal))


def _start(*args: str, db: Path, delay: float = WAIT, group: bool = False) -> subprocess.Popen:
    """`weightdiag ARGS` in a process of its own (with group, the leader of a process group of its own, as a
    terminal's foreground job is: a hangup or Ctrl-C reaches every process of it)."""
    env = {**os.environ, **CLI_ENV, "WEIGHTDIAG_TEST_ROW_WRITE_DELAY": str(delay), "WEIGHTDIAG_DB": str(db)}
    return subprocess.Popen(
        [sys.executable, "-m", "weightdiag", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=group,
        preexec_fn=default_signals,  # the signals the tests send are not ignored, even from a background job
    )


def _wait_for(condition, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended first ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the expected state never appeared")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    spec = synthetic.ModelSpec(
        n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=120_000, seed=7
    )
    return synthetic.write_model(tmp_path_factory.mktemp("model"), spec)


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory) -> dict:
    """The row of an uninterrupted fit."""
    return api.fit(str(model), FitOptions(device="cpu"), db_dir=tmp_path_factory.mktemp("ref")).row


# --- fit: Ctrl-C, kill, a closed terminal, a crash --------------------------------------------------------------


@pytest.mark.parametrize(
    ("signum", "code", "said"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")],
)
def test_a_fit_stopped_by_a_signal_writes_no_row_and_the_next_run_resumes(
    model, reference, tmp_path, signum, code, said
):
    """README, exit codes: "130 | interrupted (Ctrl-C); no partial row is left behind, and the tensors already
    measured are kept for the next run"; "129 | stopped by SIGHUP (a closed terminal, an ssh drop), handled like
    Ctrl-C: one line, `sweep` workers ended, nothing written after it"; "143 | stopped by SIGTERM (`kill PID`, a
    job runner, `Popen.terminate()`), handled like Ctrl-C".
    "An interrupted fit resumes": "A fit that stops before its row is written (Ctrl-C, `kill`, a closed terminal,
    ...) keeps what it measured ... Run the same command again and only the rest is read" and "The row equals
    an uninterrupted fit's in every measured field"; "the journal is removed when the row is written"."""
    db = tmp_path / "db"
    proc = _start("fit", str(model), "--device", "cpu", "-q", db=db)
    _wait_for(lambda: bool(_temps(db)), proc)  # measured; the row is in its temporary file, not yet renamed
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == code, err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert _rows(db) == [] and _temps(db) == []  # no row, no partial row
    (journal,) = _journals(db)
    kept = _journaled(journal)
    n = len(reference["matrices"]) + len(reference["vectors"])
    assert kept == n  # every tensor was measured before the signal: all kept

    out = run_cli("fit", str(model), "--device", "cpu", "--db", str(db))
    assert out.returncode == 0, out.stderr
    assert re.search(
        rf"resumed an interrupted fit: {kept} tensors \([0-9.]+ [kMG]?B\) measured by the fit started "
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ were not read again",
        out.stderr,
    ), out.stderr
    (path,) = _rows(db)
    row = load_row(path)
    assert _science(row) == _science(reference)
    assert row["run"]["resumed"]["tensors"] == kept
    assert _journals(db) == []


def test_a_fit_killed_with_9_resumes(model, reference, tmp_path):
    """README, "An interrupted fit resumes": "A fit that stops before its row is written (... a crash) keeps what
    it measured: each tensor's records are appended, as it is done, to a journal beside the database
    (`rows/.partial/<row file>/`)"; "The row equals an uninterrupted fit's in every measured field"."""
    db = tmp_path / "db"
    proc = _start("fit", str(model), "--device", "cpu", "-q", db=db)
    _wait_for(lambda: any(_journaled(j) for j in _journals(db)), proc)  # at least one tensor journaled
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=WAIT)
    assert _rows(db) == []
    (journal,) = _journals(db)
    kept = _journaled(journal)
    assert kept >= 1
    row = api.fit(str(model), FitOptions(device="cpu"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] == kept
    assert _science(row) == _science(reference)
    (path,) = _rows(db)
    assert _science(load_row(path)) == _science(reference)
    assert _journals(db) == []


class _StopAfter(Silent):
    """A Progress that interrupts the fit (as Ctrl-C does) after `n` tensors."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, 0

    def measured(self, tensor: str) -> None:
        self.done += 1
        if self.done == self.n:
            raise KeyboardInterrupt


def test_a_no_save_fit_keeps_no_journal(model, tmp_path):
    """README: "`--no-save` fits keep no journal"."""
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(model), FitOptions(device="cpu"), _StopAfter(4), db_dir=db, save=False)
    assert not (db / "rows").exists() or not any((db / "rows").iterdir())


def test_a_journal_serves_only_the_same_options(model, reference, tmp_path):
    """README: "the journal is used only for the same model, revision, tool version and options (`--center`,
    `--include`/`--exclude`, `--protocol`)"."""
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(model), FitOptions(device="cpu"), _StopAfter(5), db_dir=db)
    for other in (
        FitOptions(device="cpu", protocol="exact"),
        FitOptions(device="cpu", include=["*.layers.1.*"]),
        FitOptions(device="cpu", exclude=["*.layers.1.*"]),
        FitOptions(device="cpu", center=True),
    ):
        assert "resumed" not in api.fit(str(model), other, db_dir=db).row["run"]
    # a fit of another model id (--name) of the same files is another row: nothing of this journal reused
    assert "resumed" not in api.fit(str(model), FitOptions(device="cpu", model_id="other"), db_dir=db).row["run"]
    row = api.fit(str(model), FitOptions(device="cpu"), db_dir=db).row  # the journal of the full fit was kept
    assert row["run"]["resumed"]["tensors"] == 5
    assert _science(row) == _science(reference)


def test_a_local_shard_replaced_by_a_copy_is_not_resumed(model, tmp_path):
    """README: "and only while every shard is unchanged (name, size and header hash; ...; for local files without
    one, also modification time and inode), else it is discarded and the fit starts over"."""
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(copy), FitOptions(device="cpu"), _StopAfter(5), db_dir=db)
    shard = sorted(copy.glob("*.safetensors"))[0]
    shutil.copy2(shard, tmp_path / "again")  # same bytes, same modification time, another inode
    os.replace(tmp_path / "again", shard)
    row = api.fit(str(copy), FitOptions(device="cpu"), db_dir=db).row
    assert "resumed" not in row["run"]
    assert _journals(db) == []


# --- sweep ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs") / "run"
    for step in (0, 100, 200, 300):
        synthetic.write_model(
            root / f"step{step}", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128, seed=step + 1)
        )
    return root


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_sweep_stopped_by_a_signal_then_run_again_completes_and_resumes_the_revision_cut_off(
    run_folder, tmp_path, signum, code
):
    """README, `sweep`: "Rows are written atomically, so after Ctrl-C or `kill -9` no partial or duplicate row
    exists and rerunning the same command completes the rest"; "`kill PID` (SIGTERM) and a closed terminal
    (SIGHUP) stop it like Ctrl-C: its workers end, nothing is written after the signal (exit 143 / 129)";
    "An interrupted fit resumes": "`sweep` resumes a revision it was fitting the same way"."""
    db = tmp_path / "db"
    first = run_cli("sweep", str(run_folder), "--revisions", "step0", "--device", "cpu", "--db", str(db), "-q")
    assert first.returncode == 0, first.stderr
    proc = _start("sweep", str(run_folder), "--all", "--device", "cpu", "-q", db=db)
    _wait_for(lambda: bool(_temps(db)), proc)  # step100 is measured, its row waits in its temporary file
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == code, err
    assert len(err.strip().splitlines()) == 1, err
    assert [p.name for p in _rows(db)] == ["run@step0.json"] and _temps(db) == []
    (journal,) = _journals(db)
    assert journal.name == "run@step100.json"
    kept = _journaled(journal)
    assert kept > 0

    out = run_cli("sweep", str(run_folder), "--all", "--device", "cpu", "--db", str(db), "--json", "-q")
    assert out.returncode == 0, out.stderr
    status = {o["revision"]: o["status"] for o in json.loads(out.stdout)}
    assert status == {"step0": "existing", "step100": "fitted", "step200": "fitted", "step300": "fitted"}
    rows = {p.name: load_row(p) for p in _rows(db)}
    assert len(rows) == 4
    assert rows["run@step100.json"]["run"]["resumed"]["tensors"] == kept
    assert not any("resumed" in rows[f"run@step{s}.json"]["run"] for s in (0, 200, 300))
    assert _journals(db) == []
    fresh = api.fit(str(run_folder / "step100"), FitOptions(device="cpu", model_id="run"), save=False).row
    resumed = rows["run@step100.json"]
    assert _science({**resumed, "model": None, "files": None, "hyperparameters": None}) == _science(
        {**fresh, "model": None, "files": None, "hyperparameters": None}
    )


def test_a_sweep_with_a_failed_checkpoint_resumes_when_run_again(run_folder, tmp_path):
    """README, exit codes: "4 | `sweep` finished but some checkpoints failed (listed as `failed` with the reason);
    the others' rows are written, and rerunning resumes"."""
    run = tmp_path / "run"
    shutil.copytree(run_folder, run)
    shard = next((run / "step200").glob("*.safetensors"))
    good = shard.read_bytes()
    shard.write_bytes(good[:100])  # truncated: this checkpoint fails, the others are written
    db = tmp_path / "db"
    out = run_cli("sweep", str(run), "--all", "--device", "cpu", "--db", str(db), "--json", "-q")
    assert out.returncode == 4, out.stderr
    status = {o["revision"]: o["status"] for o in json.loads(out.stdout)}
    assert status == {"step0": "fitted", "step100": "fitted", "step200": "failed", "step300": "fitted"}
    assert len(_rows(db)) == 3
    shard.write_bytes(good)
    out = run_cli("sweep", str(run), "--all", "--device", "cpu", "--db", str(db), "--json", "-q")
    assert out.returncode == 0, out.stderr
    status = {o["revision"]: o["status"] for o in json.loads(out.stdout)}
    assert status == {"step0": "existing", "step100": "existing", "step200": "fitted", "step300": "existing"}


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_parallel_sweep_stopped_while_its_workers_write_leaves_no_partial_row_and_resumes(
    run_folder, tmp_path, signum, code
):
    """README, exit codes: "130 | interrupted (Ctrl-C); no partial row is left behind, and the tensors already
    measured are kept for the next run"; `sweep`: "after Ctrl-C or `kill -9` no partial or duplicate row exists
    and rerunning the same command completes the rest"; "`sweep` resumes a revision it was fitting the same
    way". Both workers are stopped between their temporary row file and its rename."""
    db = tmp_path / "db"
    proc = _start("sweep", str(run_folder), "--all", "--jobs", "2", "--device", "cpu", "-q", db=db)
    _wait_for(lambda: len(_temps(db)) == 2, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == code, err
    assert len(err.strip().splitlines()) == 1, err
    assert _rows(db) == []
    assert _temps(db) == [], "the workers' temporary row files are left behind"
    cut_off = {j.name: _journaled(j) for j in _journals(db)}
    assert len(cut_off) == 2 and all(cut_off.values())

    out = run_cli("sweep", str(run_folder), "--all", "--device", "cpu", "--db", str(db), "--json", "-q")
    assert out.returncode == 0, out.stderr
    assert {o["status"] for o in json.loads(out.stdout)} == {"fitted"}
    rows = {p.name: load_row(p) for p in _rows(db)}
    assert len(rows) == 4
    for name, kept in cut_off.items():
        assert rows[name]["run"]["resumed"]["tensors"] == kept
    assert _journals(db) == [] and _temps(db) == []


def test_the_journal_is_named_after_the_row_file_so_two_folders_of_one_name_keep_theirs(tmp_path):
    """README: "each tensor's records are appended, as it is done, to a journal beside the database
    (`rows/.partial/<row file>/`)"; `fit`: the row file is "one file per model id, never shared by two". Two local
    checkpoints that share a folder name are two rows, so two journals: fitting one never discards the other's."""
    spec = dict(n_layers=2, d_model=64, ffn_size=128)
    first = synthetic.write_model(tmp_path / "a" / "llama", synthetic.ModelSpec(**spec, seed=1))
    second = synthetic.write_model(tmp_path / "b" / "llama", synthetic.ModelSpec(**spec, seed=2))
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(first), FitOptions(device="cpu"), _StopAfter(5), db_dir=db)
    assert "resumed" not in api.fit(str(second), FitOptions(device="cpu"), db_dir=db).row["run"]
    row = api.fit(str(first), FitOptions(device="cpu"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] == 5
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(second), FitOptions(device="cpu", protocol="exact"), _StopAfter(3), db_dir=db)
    (journal,) = _journals(db)
    fitted = api.fit(str(second), FitOptions(device="cpu", protocol="exact"), db_dir=db)
    assert fitted.path is not None and journal.name == fitted.path.name
    assert fitted.row["run"]["resumed"]["tensors"] == 3


def test_a_fit_whose_row_the_disk_cannot_take_prints_it_and_keeps_what_it_measured(
    model, reference, tmp_path, monkeypatch
):
    """README, `sweep`: "`fit --json` still prints the row it could not write (exit 2)"; exit codes: "2 | ... one
    line on stderr says what and what to do, nothing is written (a fit whose row the disk could not take keeps
    the tensors it measured for the next run)"."""
    import errno

    from weightdiag.database import store as database

    real = database.write_text_atomic

    def full(path, text, before_rename=None):
        if path.parent.name == "rows":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text, before_rename)

    db = tmp_path / "db"
    monkeypatch.setattr(database, "write_text_atomic", full)
    out = run_cli("fit", str(model), "--db", str(db), "--json", "-q", "--device", "cpu")
    assert out.returncode == 2
    assert _science(json.loads(out.stdout)) == _science(reference)
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert _rows(db) == [] and _temps(db) == []
    (journal,) = _journals(db)
    n = len(reference["matrices"]) + len(reference["vectors"])
    assert _journaled(journal) == n
    monkeypatch.setattr(database, "write_text_atomic", real)  # space freed
    row = api.fit(str(model), FitOptions(device="cpu"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] == n and _science(row) == _science(reference)
    assert _journals(db) == []


@pytest.fixture
def tiny_on_hub(fake_hub, tmp_path, monkeypatch, knobs):
    """A 3-shard model on the loopback Hub, read in 16 KiB chunks so that a fault lands inside a shard."""
    from .hub_server import small_model_in_small_chunks

    folder = small_model_in_small_chunks(fake_hub, tmp_path / "tiny", monkeypatch, knobs, attempts=2)
    return sorted(p.name for p in folder.glob("*.safetensors"))


def test_a_hub_fit_cut_off_by_the_network_is_exit_3_with_no_row_and_resumes(fake_hub, tiny_on_hub, tmp_path):
    """README, exit codes: "3 | Hugging Face Hub or network failure: ...; one line on stderr, no row is written
    (a fit cut off by the network keeps the tensors it measured for the next run; ...)"; "An interrupted fit
    resumes": "A fit that stops before its row is written (..., a network failure past the retries, ...) keeps
    what it measured"."""
    db = tmp_path / "db"
    fake_hub.fail("drop", tiny_on_hub[-1], times=None, method="GET", after_bytes=6000)  # the last shard's body
    out = run_cli("fit", "acme/tiny", "--db", str(db), "-q", "--device", "cpu", "--connections", "1")
    assert out.returncode == 3, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert _rows(db) == [] and _temps(db) == []
    (journal,) = _journals(db)
    assert _journaled(journal) > 0
    fake_hub.clear_faults()
    out = run_cli("fit", "acme/tiny", "--db", str(db), "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "resumed an interrupted fit" in out.stderr
    assert len(_rows(db)) == 1 and _journals(db) == []


def test_a_hub_shard_that_fails_its_sha256_leaves_nothing(fake_hub, tiny_on_hub, tmp_path):
    """README, the Hub: "a mismatch stops the run (exit 3, naming the file): no row is written and nothing the
    fit measured is kept"; exit codes: "3 | ... bytes that fail their sha256 leave nothing"."""
    db = tmp_path / "db"
    fake_hub.fail("corrupt", tiny_on_hub[-1], times=1, method="GET")
    out = run_cli("fit", "acme/tiny", "--db", str(db), "-q", "--device", "cpu", "--connections", "1")
    assert out.returncode == 3, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and tiny_on_hub[-1] in out.stderr, out.stderr
    assert not (db / "rows").exists() or not [p for p in (db / "rows").rglob("*") if p.is_file()]


def test_a_hub_fit_stopped_by_sigterm_while_streaming_resumes_from_its_verified_shards(fake_hub, tmp_path):
    """README: "143 | stopped by SIGTERM (`kill PID`, a job runner, `Popen.terminate()`), handled like Ctrl-C";
    "An interrupted fit resumes": "From the Hub, ... a shard's records are reused only once the whole shard was
    read and its hash matched; the shard that was cut off is read again"; "The row equals an uninterrupted
    fit's in every measured field". A real process streaming from the loopback Hub at a trickle."""
    from .hub_server import write_small_model

    folder = write_small_model(tmp_path / "tiny", shard_bytes=50_000)
    fake_hub.add_folder("acme/tiny", folder)
    whole = api.fit("acme/tiny", FitOptions(device="cpu"), db_dir=tmp_path / "ref").row
    db = tmp_path / "db"
    fake_hub.bandwidth = 100_000  # bytes per second: the fit takes seconds, the signal lands mid-stream
    proc = _start("fit", "acme/tiny", "--device", "cpu", "-q", "--connections", "1", db=db)

    def tensors_in(shard: Path) -> int:
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        return len([name for name in header if name != "__metadata__"])

    count = {p.name: tensors_in(p) for p in folder.glob("*.safetensors")}

    def a_shard_is_reusable() -> bool:
        """A shard whose sha256 matched and whose every tensor is journaled (what a resumed Hub fit reuses)."""
        for journal in _journals(db):
            try:
                shards = json.loads((journal / "manifest.json").read_text())["shards"]
            except (OSError, ValueError, KeyError):
                continue
            lines = _journal_lines(journal)
            done = [line["shard"] for line in lines if "name" in line]
            for line in lines:
                if "verified_shard" in line and done.count(s := line["verified_shard"]) == count[shards[s]["name"]]:
                    return True
        return False

    _wait_for(a_shard_is_reusable, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 143, err
    assert len(err.strip().splitlines()) == 1 and "SIGTERM" in err, err
    assert _rows(db) == [] and _temps(db) == []
    fake_hub.bandwidth = None
    fake_hub.reset_counters()
    with tuning.override(head_guess=4096):  # else planning reads these small shards whole
        row = api.fit("acme/tiny", FitOptions(device="cpu"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] > 0
    assert _science(row) == _science(whole)
    sizes = [p.stat().st_size for p in folder.glob("*.safetensors")]
    assert fake_hub.file_bytes_sent < sum(sizes) - min(sizes) // 2  # verified shards' bodies were not read again


def test_a_probe_is_named_by_id_only_while_there_is_no_full_row(tmp_path):
    """README, `fit --include`: "Such a fit, like a `--center` one, is saved as a row of its own
    (`rows/<model>@<rev>.sel-<hash>.json`, `.centered.json`): it never replaces the model's full row, `db show ID`
    and `compare ID` name it only when there is no full one"."""
    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))
    db = str(tmp_path / "db")

    def fit(*extra: str) -> None:
        assert run_cli("fit", str(model), "--db", db, "-q", "--device", "cpu", *extra).returncode == 0

    def shown() -> dict:
        return json.loads(run_cli("db", "show", "m", "--db", db, "--json").stdout)

    def compared_q_k() -> float:
        return json.loads(run_cli("compare", "m", "--db", db, "--json", "-q").stdout)[0]["kinds"]["q"]["k"]

    fit("--include", "*layers.0.*")
    (probe,) = _rows(tmp_path / "db")
    assert ".sel-" in probe.name
    assert len(shown()["matrices"]) == len(load_row(probe)["matrices"])  # the only row: named by id
    probe_k = compared_q_k()
    fit()
    full = [p for p in _rows(tmp_path / "db") if ".sel-" not in p.name]
    assert len(full) == 1 and probe.exists()  # beside it, not in its place
    assert len(shown()["matrices"]) == len(load_row(full[0])["matrices"]) > len(load_row(probe)["matrices"])
    assert compared_q_k() == load_row(full[0])["kinds"]["q"]["k_median"] != probe_k
    fit("--center")
    assert len(_rows(tmp_path / "db")) == 3
    assert not shown()["protocol"]["centered"] and compared_q_k() == load_row(full[0])["kinds"]["q"]["k_median"]


def test_a_sweep_worker_killed_from_outside_fails_its_revisions_and_the_rerun_resumes(run_folder, tmp_path):
    """README, `sweep`: "A worker killed from outside (the OOM killer, `kill -9`) fails the revisions not yet done
    (exit 4) and rerunning resumes them"; exit codes: "4 | `sweep` finished but some checkpoints failed (listed as
    `failed` with the reason); the others' rows are written, and rerunning resumes" (not 5, a bug)."""
    db = tmp_path / "db"
    proc = _start("sweep", str(run_folder), "--all", "--jobs", "2", "--device", "cpu", "--json", "-q", db=db)
    _wait_for(lambda: len(_temps(db)) == 2, proc)
    # the temporary file's name holds its writer's pid: .<row file>.<host>-<pid>.<random>.tmp
    worker = int(re.search(r"-(\d+)\.[^.]+\.tmp$", _temps(db)[0].name).group(1))
    os.kill(worker, signal.SIGKILL)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 4, err
    outcomes = json.loads(out)
    assert {o["status"] for o in outcomes} == {"failed"}
    assert all("worker process of the sweep was killed" in o["detail"] for o in outcomes)
    assert _rows(db) == [] and _temps(db) == []
    cut_off = {j.name: _journaled(j) for j in _journals(db)}
    assert len(cut_off) == 2

    again = run_cli("sweep", str(run_folder), "--all", "--device", "cpu", "--db", str(db), "--json", "-q")
    assert again.returncode == 0, again.stderr
    assert {o["status"] for o in json.loads(again.stdout)} == {"fitted"}
    rows = {p.name: load_row(p) for p in _rows(db)}
    assert len(rows) == 4
    for name, kept in cut_off.items():
        assert rows[name]["run"]["resumed"]["tensors"] == kept


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGHUP, 129), (signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_closed_terminal_or_ctrl_c_reaching_every_process_of_a_parallel_sweep_prints_one_line(
    run_folder, tmp_path, signum, code
):
    """README, exit codes: "129 | stopped by SIGHUP (a closed terminal, an ssh drop), handled like Ctrl-C: one line,
    `sweep` workers ended, nothing written after it"; "130 | interrupted (Ctrl-C); no partial row is left behind".
    A terminal signals its whole foreground process group: the sweep, its workers and multiprocessing's resource
    tracker (which ignores SIGINT and SIGTERM, not SIGHUP)."""
    db = tmp_path / "db"
    proc = _start("sweep", str(run_folder), "--all", "--jobs", "2", "--device", "cpu", "-q", db=db, group=True)
    _wait_for(lambda: len(_temps(db)) == 2, proc)
    os.killpg(proc.pid, signum)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == code, err
    assert len(err.strip().splitlines()) == 1, err  # no resource-tracker warning or traceback below it
    assert _rows(db) == [] and _temps(db) == []


def test_a_fit_with_another_trim_resumes_because_the_records_do_not_depend_on_it(model, tmp_path):
    """README: "the journal is used only for the same model, revision, tool version and options (`--center`,
    `--include`/`--exclude`, `--protocol`)": `--trim` is not one of them (every trim's fit is in each record; the
    trim picks the per-kind summaries), so a fit resumed with another trim reuses the records and equals an
    uninterrupted fit with that trim."""
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(model), FitOptions(device="cpu"), _StopAfter(5), db_dir=db)
    row = api.fit(str(model), FitOptions(device="cpu", trim="mid90"), db_dir=db).row
    assert row["run"]["resumed"]["tensors"] == 5
    whole = api.fit(str(model), FitOptions(device="cpu", trim="mid90"), db_dir=tmp_path / "ref").row
    assert _science(row) == _science(whole)


def test_a_disk_full_from_the_start_still_prints_the_row_and_stops_the_sweep_at_the_first_row(
    model, reference, run_folder, tmp_path, monkeypatch
):
    """README, `sweep`: "**Disk full**: the sweep stops at the first row it cannot write and says which rows are
    kept; `fit --json` still prints the row it could not write (exit 2)". Here the disk is full before the fit
    starts, so not even the journal can be written (it was exit 5, an internal error, with nothing printed)."""
    import errno

    from weightdiag.database import store as database
    from weightdiag.record import journal

    def full(path, text, before_rename=None):
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_text(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(database, "write_text_atomic", full)  # the rows
    monkeypatch.setattr(Path, "write_text", full_text)
    monkeypatch.setattr(journal, "_create", lambda path: full_text(path))  # the journal's manifest and records
    db = tmp_path / "db"
    out = run_cli("fit", str(model), "--db", str(db), "--json", "-q", "--device", "cpu")
    assert out.returncode == 2, out.stderr
    assert _science(json.loads(out.stdout)) == _science(reference)
    assert len(out.stderr.strip().splitlines()) == 1 and "No space left on device" in out.stderr, out.stderr
    assert _rows(db) == [] and _journals(db) == []
    out = run_cli("sweep", str(run_folder), "--all", "--db", str(db), "-q", "--device", "cpu")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "the sweep stopped at step0: 0 rows are in the database" in lines[0], out.stderr


def test_check_fits_afresh_even_over_an_interrupted_fits_journal(model, tmp_path):
    """README, `check`: "Fits the model (always afresh) and compares it with the baseline row matrix by matrix":
    with `--save` too, an interrupted fit's journal is not resumed."""
    baseline = api.fit(str(model), FitOptions(device="cpu"), db_dir=tmp_path / "ref").path
    db = tmp_path / "db"
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(model), FitOptions(device="cpu"), _StopAfter(5), db_dir=db)
    out = run_cli("check", str(model), "--baseline", str(baseline), "--db", str(db), "--save", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "resumed" not in out.stderr
    (path,) = _rows(db)
    assert "resumed" not in load_row(path)["run"]
    assert _journals(db) == []

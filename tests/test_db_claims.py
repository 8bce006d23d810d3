"""Claims on rows being fitted (rows/.claims/): two sweeps of one run share the work, never double it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from weightdiag.database import store as db


def _claim_file(row: Path) -> Path:
    return row.parent / db.CLAIMS_DIR / row.name


def test_a_claim_is_held_while_fitted_and_released_after(tmp_path: Path) -> None:
    row = tmp_path / "rows" / "m.json"
    with db.claim(row) as holder:
        assert holder is None
        assert json.loads(_claim_file(row).read_text())["pid"] == os.getpid()
    assert not _claim_file(row).exists()
    assert not [p for p in _claim_file(row).parent.iterdir()]  # no staged file left behind


def test_a_live_claim_is_respected(tmp_path: Path) -> None:
    row = tmp_path / "rows" / "m.json"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _claim_file(row).parent.mkdir(parents=True)
        _claim_file(row).write_text(json.dumps({"host": db._host_tag(), "pid": other.pid, "time": time.time()}))
        with db.claim(row) as holder:
            assert holder == f"pid {other.pid}"
        assert _claim_file(row).exists()  # not ours to release
    finally:
        other.kill()
        other.wait()


def test_a_dead_processs_claim_is_taken_over(tmp_path: Path) -> None:
    row = tmp_path / "rows" / "m.json"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _claim_file(row).parent.mkdir(parents=True)
    _claim_file(row).write_text(json.dumps({"host": db._host_tag(), "pid": gone.pid, "time": time.time()}))
    with db.claim(row) as holder:
        assert holder is None
        assert json.loads(_claim_file(row).read_text())["pid"] == os.getpid()


def test_a_claim_is_never_visible_empty(tmp_path: Path, monkeypatch) -> None:
    """The race CI caught: a claim created empty, then written, was read empty by the other sweep in between,
    taken for stale and replaced, and both fitted the row. Each claim must appear with its content."""
    row = tmp_path / "rows" / "m.json"
    seen: list[str] = []
    real_link = os.link

    def link(src, dst, *args, **kwargs):
        seen.append(Path(src).read_text())
        return real_link(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    with db.claim(row) as holder:
        assert holder is None
        assert json.loads(seen[0])["pid"] == os.getpid()


# --- issue 31: a claim of a killed sweep, and hosts whose clocks disagree -------------------------------------

FOREIGN_HOST = "0badf00d"  # a host tag that is not this host's


def _foreign_claim(row: Path, when: float) -> Path:
    claim = _claim_file(row)
    claim.parent.mkdir(parents=True, exist_ok=True)
    claim.write_text(json.dumps({"host": FOREIGN_HOST, "pid": 1, "time": when}))
    os.utime(claim, (when, when))  # its host's clock, as its file system recorded it
    return claim


def test_another_hosts_claim_is_never_judged_by_its_times(tmp_path: Path, knobs) -> None:
    """Clocks between hosts may disagree: a claim written a day 'ago' (the other host's clock behind ours) is live
    at first sight; one stamped a day ahead is not held forever. Only change, seen by this process's monotonic
    clock, tells a live claim from a dead one."""
    knobs(claim_silent_seconds=0.5)
    for skew in (-86400.0, 86400.0):
        row = tmp_path / f"rows{skew:+.0f}" / "m.json"
        claim = _foreign_claim(row, time.time() + skew)
        with db.claim(row) as holder:
            assert holder is not None and "another host" in holder  # first sight: live, whatever its time says
        for _ in range(3):  # it beats: its mtime changes (by its own clock, again skewed)
            time.sleep(0.3)
            os.utime(claim, (time.time() + skew + 1, time.time() + skew + 1))
            with db.claim(row) as holder:
                assert holder is not None, "a beating claim was taken over"
        time.sleep(0.7)  # no beat for longer than claim_silent_seconds: its holder is gone
        with db.claim(row) as holder:
            assert holder is None
            assert json.loads(claim.read_text())["pid"] == os.getpid()


def test_a_held_claim_beats(tmp_path: Path, knobs) -> None:
    knobs(heartbeat_seconds=0.05)
    row = tmp_path / "rows" / "m.json"
    with db.claim(row) as holder:
        assert holder is None
        first = _claim_file(row).stat().st_mtime_ns
        time.sleep(0.3)
        assert _claim_file(row).stat().st_mtime_ns != first
    assert not _claim_file(row).exists()


def test_another_hosts_temporary_row_file_is_never_removed_for_its_age(tmp_path: Path) -> None:
    """A temporary row file of another host, with a time far in the past by our clock (its clock behind, or
    ours ahead): its fit may be writing it now, and its pid means nothing here. Left alone; our own dead
    writers' are removed, and untagged ones (older versions) by age as before."""
    rows = tmp_path / "rows"
    rows.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    foreign = rows / f".m.json.{FOREIGN_HOST}-{os.getpid()}.abcd1234.tmp"
    ours_dead = rows / f".m.json.{db._host_tag()}-{gone.pid}.abcd1234.tmp"
    untagged = rows / ".m.json.abcd1234.tmp"
    for path in (foreign, ours_dead, untagged):
        path.write_text("{")
        os.utime(path, (time.time() - 86400, time.time() - 86400))
    removed = db.clean_stale_temps(rows)
    assert set(removed) == {ours_dead, untagged}
    assert foreign.exists()


def test_a_sweep_takes_over_the_revision_of_a_sweep_killed_with_9(tmp_path: Path) -> None:
    """Two sweeps share a database; the one fitting a revision is killed with -9 while it holds its claim. The
    other, done with its own revisions, takes the dead sweep's claim over and fits it: exit 0 means every row
    is there (it used to exit 0 reporting the revision 'claimed', its row missing)."""
    from weightdiag.testing import synthetic

    run = tmp_path / "run"
    synthetic.write_training_run(run, synthetic.RunSpec(steps=(0, 1000, 2000), duplicate=None, n_layers=2))
    db_dir = tmp_path / "db"
    claims = db_dir / "rows" / db.CLAIMS_DIR
    command = [sys.executable, "-m", "weightdiag", "sweep", str(run), "--all", "--db", str(db_dir)]
    command += ["--device", "cpu", "--json", "-q"]
    # The first sweep sits between its first row's write and rename (holding that revision's claim) until killed.
    slow = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "WEIGHTDIAG_TEST_ROW_WRITE_DELAY": "120"},
    )
    try:
        deadline = time.monotonic() + 120
        while not (claims.is_dir() and [p for p in claims.iterdir() if p.suffix == ".json"]):
            assert time.monotonic() < deadline and slow.poll() is None, "the first sweep never claimed a revision"
            time.sleep(0.1)
        other = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # once the second sweep has written the revisions it could, the first is killed
        while len(list((db_dir / "rows").glob("*.json"))) < 2:
            assert time.monotonic() < deadline and other.poll() is None, other.communicate()
            time.sleep(0.1)
    finally:
        slow.kill()
        slow.wait()
    out, err = other.communicate(timeout=300)
    assert other.returncode == 0, err
    statuses = {o["revision"]: o["status"] for o in json.loads(out)}
    assert sorted(statuses.values()) == ["fitted", "fitted", "fitted"], statuses
    assert len(list((db_dir / "rows").glob("*.json"))) == 3
    assert not [p for p in claims.iterdir() if p.suffix == ".json"]

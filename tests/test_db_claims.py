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

"""What an interrupted command promises (issue 42, item 15): "run the command again to resume" only where a rerun
resumes something. A one-shard Hub fit cut off before its shard was read whole and verified keeps nothing; a
`--no-save` fit keeps no journal; a local fit keeps each tensor it measured."""

from __future__ import annotations

import pytest

from weightdiag.render.tables import FitProgress

from .conftest import run_cli
from .hub_server import write_small_model


@pytest.fixture
def stop_after_two(monkeypatch):
    """Ctrl-C (a KeyboardInterrupt) once the fit has measured two tensors."""
    seen = []

    def measured(self, tensor):
        seen.append(tensor)
        if len(seen) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(FitProgress, "measured", measured)
    return seen


def test_a_one_shard_hub_fit_cut_off_promises_no_resume(fake_hub, tmp_path, stop_after_two):
    fake_hub.add_folder("acme/one", write_small_model(tmp_path / "m", shard_bytes=10**8))  # one shard
    out = run_cli("fit", "acme/one", "--db", str(tmp_path / "db"), "--device", "cpu")
    assert out.returncode == 130, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("interrupted: nothing is half-written; nothing measured is kept: a shard streamed")
    assert "to resume" not in line


def test_a_local_fit_cut_off_says_what_it_kept_and_resumes_it(tmp_path, stop_after_two):
    model = write_small_model(tmp_path / "m")
    db = str(tmp_path / "db")
    out = run_cli("fit", str(model), "--db", db, "--device", "cpu")
    assert out.returncode == 130
    assert out.stderr.strip() == (
        "interrupted: nothing is half-written; run the command again to resume: 2 tensors measured are kept"
    )
    stop_after_two.append("done")  # no second interruption
    again = run_cli("fit", str(model), "--db", db, "--device", "cpu")
    assert again.returncode == 0 and "resumed an interrupted fit: 2 tensors" in again.stderr


def test_a_no_save_fit_cut_off_says_it_keeps_nothing(tmp_path, stop_after_two):
    out = run_cli("fit", str(write_small_model(tmp_path / "m")), "--no-save", "--device", "cpu")
    assert out.returncode == 130
    assert "nothing measured is kept (a fit that saves no row keeps no journal)" in out.stderr
    assert "to resume" not in out.stderr

"""A database that cannot take a row (a full disk, ENOSPC injected at the write): `fit --json` still prints
the fitted row, `sweep` stops at the first row it cannot write and says what was kept; nothing half-written."""

from __future__ import annotations

import errno
import json

from weightdiag.database import store as db
from weightdiag.testing import synthetic

from .conftest import run_cli


def _full_after(monkeypatch, rows_allowed: int) -> None:
    """Row writes fail with ENOSPC once `rows_allowed` rows are written (summaries go with their rows)."""
    real = db.write_text_atomic
    written = []

    def write(path, text, before_rename=None):
        if path.parent.name == "rows":
            if len(written) >= rows_allowed:
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(path)
        return real(path, text, before_rename)

    monkeypatch.setattr(db, "write_text_atomic", write)


def test_fit_json_prints_the_row_the_full_disk_could_not_take(tmp_path, monkeypatch):
    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))
    _full_after(monkeypatch, 0)
    out = run_cli("fit", str(model), "--db", str(tmp_path / "db"), "--json", "-q", "--device", "cpu")
    assert out.returncode == 2
    assert len(json.loads(out.stdout)["matrices"]) == 16  # 2 blocks x 7, the embedding and the head
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "No space left on device" in lines[0], out.stderr
    assert not list((tmp_path / "db" / "rows").glob("*.json"))


def test_a_sweep_stops_at_the_first_row_it_cannot_write(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for step in (0, 100, 200, 300):
        synthetic.write_model(run / f"step{step}", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128, seed=step))
    _full_after(monkeypatch, 1)
    out = run_cli("sweep", str(run), "--all", "--db", str(tmp_path / "db"), "-q", "--device", "cpu")
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert "the sweep stopped at step100: 1 rows are in the database (step0)" in lines[0]
    assert "No space left on device" in lines[0] and "run it again" in lines[0]
    assert [p.name for p in (tmp_path / "db" / "rows").glob("*.json")] == ["run@step0.json"]

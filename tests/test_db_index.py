"""The row index (rows/.index.sqlite, issue 31): summaries keyed on the bytes of each row, written with the row,
kept valid by copies (`cp -a`), read by users who cannot write; commands that name an id read only its rows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from weightdiag import api
from weightdiag.database import store as db
from weightdiag.database.index import INDEX_NAME
from weightdiag.testing import synthetic

from .conftest import run_cli

TINY = synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128)


@pytest.fixture(scope="module")
def tiny_row(tmp_path_factory) -> dict[str, Any]:
    from weightdiag.run.measure import FitOptions

    model = synthetic.write_model(tmp_path_factory.mktemp("tiny") / "tiny", TINY)
    return api.fit_model(str(model), FitOptions(device="cpu"))


def _row(template: dict[str, Any], model_id: str, revision: str) -> dict[str, Any]:
    row = json.loads(json.dumps(template))
    row["model"].update(id=model_id, source="hub", revision=revision, commit="0" * 40, fingerprint=None)
    return row


@pytest.fixture
def database(tmp_path, tiny_row) -> Path:
    """Two runs of 4 steps each, written by write_row."""
    folder = tmp_path / "db"
    for model_id in ("acme/run", "other/run"):
        for step in (0, 10, 20, 30):
            db.write_row(_row(tiny_row, model_id, f"step{step}"), folder)
    return folder


class Reads:
    """The row files read whole (parsed and checked), and those whose bytes were read at all."""

    def __init__(self, monkeypatch) -> None:
        self.whole: list[str] = []
        self.opened: list[str] = []
        real_read_row, real_regular = db.read_row, db._read_regular

        def read_row(path):
            self.whole.append(Path(path).name)
            return real_read_row(path)

        def read_regular(path):
            self.opened.append(Path(path).name)
            return real_regular(path)

        def load_bytes(path, data):
            self.whole.append(Path(path).name)
            return real_load(path, data)

        real_load = getattr(db, "_load_bytes", None)
        monkeypatch.setattr(db, "read_row", read_row)
        monkeypatch.setattr(db, "_read_regular", read_regular, raising=False)
        if real_load is not None:
            monkeypatch.setattr(db, "_load_bytes", load_bytes)


def _read_only(monkeypatch) -> None:
    """As a user who may not write the database (root ignores chmod): every write access is refused."""
    real = os.access

    def access(path, mode, *args, **kwargs):
        return False if mode & os.W_OK else real(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)


def _listed(folder: Path) -> list[tuple[str, str]]:
    return [(r["id"], r["revision"]) for r in api.list_rows(folder, fitted_only=True)]


def test_a_copy_keeps_its_summaries_and_a_read_only_user_reads_them(database, tmp_path, monkeypatch):
    """`cp -a` gives every file a new inode: summaries keyed on (size, mtime, inode) were all made again, by a
    user who could write, and never by one who could not (every listing read every row)."""
    expected = _listed(database)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(database), str(copy)], check=True)
    index_before = (copy / "rows" / INDEX_NAME).read_bytes()
    _read_only(monkeypatch)
    reads = Reads(monkeypatch)
    assert _listed(copy) == expected
    assert api.show_row("acme/run@step10", copy, summary=True)["model"]["revision"] == "step10"
    assert reads.whole == [] and reads.opened == []  # neither read nor hashed: the index answers
    assert (copy / "rows" / INDEX_NAME).read_bytes() == index_before  # and nothing was written


def test_a_touched_or_renamed_row_is_found_by_its_bytes(database, monkeypatch):
    rows = database / "rows"
    first, second = sorted(rows.glob("acme--run@*.json"))[:2]
    os.utime(first, (1, 1))  # a restore that did not keep times
    second.rename(rows / "copied-by-hand.json")
    reads = Reads(monkeypatch)
    assert len(_listed(database)) == 8
    assert reads.whole == []  # hashed, not read whole
    assert sorted(reads.opened) == sorted([first.name, "copied-by-hand.json"])
    reads.opened.clear()
    assert len(_listed(database)) == 8
    assert reads.opened == []  # recorded: the next listing reads nothing


def test_a_read_only_user_still_sees_rows_the_index_does_not_know(database, tiny_row, monkeypatch):
    rows = database / "rows"
    added = _row(tiny_row, "late/run", "step0")
    (rows / db.row_filename(added)).write_text(json.dumps(added))  # copied in by hand: never indexed
    index_before = (rows / INDEX_NAME).read_bytes()
    _read_only(monkeypatch)
    assert ("late/run", "step0") in _listed(database)
    assert api.show_row("late/run", database)["model"]["id"] == "late/run"
    assert (rows / INDEX_NAME).read_bytes() == index_before


def test_a_row_changed_in_place_is_read_again_even_where_its_summary_cannot_be_made_again(database, monkeypatch):
    rows = database / "rows"
    (path,) = rows.glob("acme--run@step10.json")
    edited = json.loads(path.read_text())
    edited["matrices"] = edited["matrices"][:3]
    path.write_text(json.dumps(edited))
    _read_only(monkeypatch)
    assert api.show_row("acme/run@step10", database, summary=True)["counts"]["matrices"] == 3


@pytest.mark.parametrize("command", ["trajectory", "show"])
def test_a_command_that_names_an_id_reads_only_that_ids_rows(database, monkeypatch, command):
    """`trajectory MODEL` read (parsed and checked) every row of the database; now only the model's own files."""
    reads = Reads(monkeypatch)
    if command == "trajectory":
        result = api.trajectory("acme/run", db_dir=database)
        assert len(result["revisions"]) == 4
    else:
        assert api.show_row("acme/run@step20", database)["model"]["revision"] == "step20"
    assert reads.opened and all(name.startswith("acme--run@") for name in reads.opened), reads.opened


def test_rows_read_whole_again_are_only_parsed(database, monkeypatch):
    """Bytes the index has seen checked (by this version's checks) need no second check."""
    reads = Reads(monkeypatch)
    api.trajectory("acme/run", db_dir=database)
    assert reads.whole == []
    (path,) = (database / "rows").glob("acme--run@step0.json")
    path.write_text(path.read_text().replace('"created"', ' "created"', 1))  # other bytes, the same row
    api.trajectory("acme/run", db_dir=database)
    assert reads.whole == [path.name]


def test_compare_of_the_whole_database_reads_one_row_at_a_time(database, monkeypatch):
    reads = Reads(monkeypatch)
    reports = api.compare_database(database)
    first = next(reports)
    assert first["model"] == "acme/run" and len(reads.opened) == 1
    assert 1 + sum(1 for _ in reports) == 8
    out = run_cli("compare", "--db", str(database), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == json.loads(json.dumps(api.compare(db_dir=database)))


def test_an_index_of_rows_gone_forgets_them(database):
    rows = database / "rows"
    for path in rows.glob("other--run@*.json"):
        path.unlink()
    assert len(_listed(database)) == 4
    import sqlite3

    with sqlite3.connect(rows / INDEX_NAME) as index:
        assert index.execute("SELECT COUNT(*) FROM rows").fetchone()[0] == 4
    shutil.rmtree(rows)
    assert _listed(database) == []

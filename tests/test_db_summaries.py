"""Rows are listed and named from their summaries (rows/.index.sqlite): the row less its per-matrix records,
trusted only for the bytes it was made from."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from weightdiag import api
from weightdiag.database import store as db
from weightdiag.database.index import INDEX_NAME, RowIndex
from weightdiag.record.schema import RowError

from .conftest import run_cli


@pytest.fixture
def database(tmp_path, minilm_row) -> tuple[Path, Path]:
    folder = tmp_path / "db"
    return folder, db.write_row(minilm_row, folder)


@pytest.fixture(scope="module")
def minilm_row(minilm_dir):
    from weightdiag.run.measure import FitOptions

    return api.fit_model(str(minilm_dir), FitOptions(device="cpu"))


def _no_full_reads(monkeypatch):
    def refuse(path):
        raise AssertionError(f"read the whole row {path}")

    monkeypatch.setattr(db, "read_row", refuse)
    monkeypatch.setattr(db, "_load_bytes", lambda path, data: refuse(path))


def _indexed(rows: Path) -> set[str]:
    index = RowIndex.open(rows)
    assert index is not None
    try:
        return set(index.stats())
    finally:
        index.close()


def test_a_written_row_is_listed_and_shown_without_reading_its_records(database, monkeypatch):
    folder, path = database
    assert _indexed(path.parent) == {path.name}  # written with the row
    _no_full_reads(monkeypatch)
    (record,) = api.list_rows(folder, fitted_only=True)
    assert record["id"] == "all-MiniLM-L6-v2" and record["matrices"] == 40
    shown = api.show_row("all-MiniLM-L6-v2", folder, summary=True)
    assert "matrices" not in shown and shown["counts"] == {"matrices": 40, "vectors": 63}


def test_the_whole_row_is_still_read_where_records_are_needed(database):
    folder, _ = database
    assert len(api.show_row("all-MiniLM-L6-v2", folder)["matrices"]) == 40
    out = run_cli("db", "show", "all-MiniLM-L6-v2", "--db", str(folder), "--json")
    assert len(json.loads(out.stdout)["matrices"]) == 40


def test_a_row_replaced_by_hand_is_read_again(database, minilm_row):
    folder, path = database
    edited = json.loads(path.read_text())
    edited["matrices"] = edited["matrices"][:5]
    path.write_text(json.dumps(edited))  # same name, new contents: the summary no longer matches
    (record,) = api.list_rows(folder, fitted_only=True)
    assert record["matrices"] == 5
    assert "5 matrices" in run_cli("db", "show", "all-MiniLM-L6-v2", "--db", str(folder)).stdout


@pytest.mark.parametrize("damage", ["", "{not json", '{"schema": "weightdiag.row-summary/1", "row": {}}', "[]"])
def test_a_damaged_or_foreign_summary_is_never_trusted(database, damage):
    folder, path = database
    with sqlite3.connect(path.parent / INDEX_NAME) as index:
        index.execute("UPDATE rows SET summary = ?", (damage,))
    (record,) = api.list_rows(folder, fitted_only=True)
    assert record["matrices"] == 40


@pytest.mark.parametrize("damage", [b"", b"not a database at all" * 100, b"SQLite format 3\x00" + b"\xff" * 5000])
def test_a_damaged_index_is_made_again(database, damage):
    folder, path = database
    (path.parent / INDEX_NAME).write_bytes(damage)
    (record,) = api.list_rows(folder, fitted_only=True)
    assert record["matrices"] == 40
    assert _indexed(path.parent) == {path.name}


def test_a_row_copied_in_by_hand_is_listed_and_gets_its_summary(database, tmp_path):
    _folder, path = database
    other = tmp_path / "other"
    (other / "rows").mkdir(parents=True)
    shutil.copy(path, other / "rows" / path.name)
    assert not (other / "rows" / INDEX_NAME).exists()
    assert [r["matrices"] for r in api.list_rows(other, fitted_only=True)] == [40]
    assert _indexed(other / "rows") == {path.name}


def test_a_damaged_row_is_skipped_by_the_listing_and_refused_by_name(database):
    folder, path = database
    path.write_text(path.read_text()[:1000])  # truncated: its summary no longer matches
    skipped = []
    assert api.list_rows(folder, fitted_only=True, on_skip=skipped.append) == []
    assert len(skipped) == 1
    with pytest.raises(RowError):
        api.show_row(path.name, folder)


def test_a_summary_never_shadows_a_row_file_in_listings(database):
    _folder, path = database
    names = [p.name for p in db._row_paths(path.parent)]
    assert names == [path.name]


@pytest.mark.parametrize("command", [["compare"], ["trajectory", "all-MiniLM-L6-v2"], ["db", "show", "nothing-here"]])
def test_every_command_names_the_damaged_rows_it_skips(database, command):
    folder, path = database
    # truncated; named as the model's rows are: `trajectory MODEL` reads only the files of that model
    (path.parent / "all-MiniLM-L6-v2@broken.json").write_text('{"schema": "weightdiag.row/1", "model": ')
    out = run_cli(*command, "--db", str(folder))
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "broken.json" in warnings[0] and "skipped" in warnings[0], out.stderr


def test_a_hub_row_is_compared_offline_from_the_database(tmp_path, minilm_row, monkeypatch):
    """The Hub unreachable: `compare ORG/NAME` answers from the model's newest full row, and says so."""
    folder = tmp_path / "db"
    row = json.loads(json.dumps(minilm_row))
    row["model"].update(id="acme/minilm", source="hub", revision="main", commit="0" * 40)
    db.write_row(row, folder)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    out = run_cli("compare", "acme/minilm", "--db", str(folder), "--no-save")
    assert out.returncode == 0, out.stderr
    assert "acme/minilm" in out.stdout and "the Hub is unreachable" in out.stderr


def test_a_long_listing_is_plain_aligned_text_with_whole_ids(database, knobs):
    folder, _ = database
    knobs(plain_list_rows=1)  # as for a database of thousands of rows
    out = run_cli("db", "list", "--db", str(folder))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith(" rows") and lines[1].split()[:3] == ["id", "revision", "source"]
    body = lines[3:]
    assert any(line.startswith("all-MiniLM-L6-v2 ") for line in body) and any("qwen3-8b" in line for line in body)
    start = lines[1].index("matrices")
    assert all(line[start - 2 : start] == "  " for line in body)  # one column for every row

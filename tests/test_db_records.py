"""Big rows in two files: the JSON (everything but the per-matrix and per-vector records) and the records by
column in rows/.records/ (weightdiag.rowstore). Exact round trips, checks as strict as a JSON row's, and
a reader that never pairs a JSON with records it was not written with."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from weightdiag import api, db, records, rowstore
from weightdiag.records import MATRIX, SCHEMA, SPLIT_SCHEMA, VECTOR, RowError, load_row, read_row

from .conftest import run_cli

CHECKS = {"matrices": MATRIX, "vectors": VECTOR}


@pytest.fixture(scope="module")
def minilm_row(minilm_dir):
    from weightdiag.pipeline import FitOptions

    return api.fit_model(str(minilm_dir), FitOptions(device="cpu"))


def _moe(row: dict[str, Any], experts: int, model_id: str = "acme/moe") -> dict[str, Any]:
    """The row with its block matrices repeated as `experts` experts each, numbers varied per expert."""
    out = copy.deepcopy(row)
    block = [m for m in row["matrices"] if m["block"] is not None]
    out["matrices"] = []
    for e in range(experts):
        for m in block:
            m = copy.deepcopy(m)
            m["name"] = f"{m['name']}.experts.{e}"
            m["expert"] = e
            m["fits"]["mid80"]["k"] = None if m["fits"]["mid80"]["k"] is None else m["fits"]["mid80"]["k"] + e / 1e4
            out["matrices"].append(m)
    out["model"]["id"] = model_id
    return out


@pytest.fixture
def split(monkeypatch):
    monkeypatch.setattr(db, "SPLIT_RECORDS", 100)


def _tables(row: dict[str, Any]) -> dict[str, Any]:
    return {"matrices": row["matrices"], "vectors": row["vectors"]}


# --- the encoding --------------------------------------------------------------------------------------


def test_odd_records_come_back_exactly():
    """Nulls in every column type, absent fields, mixed types, empty objects, big ints, lists, key order."""
    base = {"name": "a", "block": 0, "expert": None, "n": 1, "x": 0.5, "ok": True, "shape": [2, 3]}
    odd: list[dict[str, Any]] = [
        base,
        {**base, "block": None, "x": None, "ok": None, "shape": None, "name": "модель ✓"},
        {"expert": 3, "name": "b", "block": 1, "n": -(1 << 63), "x": -0.0, "ok": False, "shape": []},
        {**base, "n": 1 << 70, "x": 1, "extra": {"deep": {"er": [1, "two", None]}}},  # big int, mixed: JSON
        {**base, "fits": {}, "parts": [{"kind": "q", "fits": {"mid80": {"k": 1.0}}}]},
        {},
    ]
    back = rowstore.decode(rowstore.encode({"matrices": odd, "vectors": []}), {"matrices": _any, "vectors": _any})
    assert back == {"matrices": odd, "vectors": []}
    assert json.dumps(back["matrices"]) == json.dumps(odd)  # same keys in the same order, same JSON types


def _any(value: object, where: str) -> None:
    pass


def test_a_fitted_rows_records_come_back_exactly(minilm_row):
    row = _moe(minilm_row, 3)
    back = rowstore.decode(rowstore.encode(_tables(row)), CHECKS)
    assert back == _tables(row) and json.dumps(back) == json.dumps(_tables(row))


@pytest.mark.parametrize(
    ("where", "field", "value", "problem"),
    [
        (77, ("fits", "mid80", "points"), 1.5, "expected an integer"),  # one float among ints
        (5, ("stats", "max_abs"), "big", "expected a number"),
        (118, ("kind",), None, "expected a string"),  # a null where no record has one
        (60, ("name",), ..., "is missing"),  # a layout of its own
        (31, ("argmax",), ["0"], "expected an integer"),
        (90, ("parts",), [{"kind": "q"}], "is missing"),
    ],
)
def test_one_damaged_record_among_many_is_refused(minilm_row, where, field, value, problem):
    row = _moe(minilm_row, 4)
    target = row["matrices"][where]
    for key in field[:-1]:
        target = target[key]
    if value is ...:
        del target[field[-1]]
    else:
        target[field[-1]] = value
    with pytest.raises(records._Bad) as bad:
        rowstore.decode(rowstore.encode(_tables(row)), CHECKS)
    assert bad.value.field.startswith(f"matrices[{where}].") and problem in bad.value.problem


def test_the_undamaged_row_passes(minilm_row):  # the null case of the test above
    rowstore.decode(rowstore.encode(_tables(_moe(minilm_row, 4))), CHECKS)


# A flipped bit in an array is caught by the sha256 the JSON records (see the damaged-records test below).
@pytest.mark.parametrize("damage", ["truncate", "foreign"])
def test_a_damaged_records_file_is_a_store_error(minilm_row, damage):
    data = bytearray(rowstore.encode(_tables(_moe(minilm_row, 2))))
    data = data[: len(data) // 2] if damage == "truncate" else bytearray(b"PK\x03\x04 not numpy")
    with pytest.raises(rowstore.StoreError):
        rowstore.decode(bytes(data), CHECKS)


# --- rows in the database ------------------------------------------------------------------------------


def test_a_big_row_is_written_in_two_files_and_read_back_whole(tmp_path, minilm_row, split):
    row = _moe(minilm_row, 4)
    path = db.write_row(row, tmp_path)
    (records_file,) = (path.parent / records.RECORDS_DIR).iterdir()
    document = json.loads(path.read_text())  # still JSON a user can read: the model-level summary
    assert document["schema"] == SPLIT_SCHEMA and "matrices" not in document and "vectors" not in document
    assert document["kinds"] == row["kinds"] and document["records"]["file"] == records_file.name
    assert document["records"]["matrices"] == 144 and path.stat().st_size < records_file.stat().st_size
    back = read_row(path)
    assert back == row and back["schema"] == SCHEMA and list(back) == list(row)  # keys in their order too
    assert api.show_row("acme/moe", tmp_path) == row


def test_a_small_row_stays_one_json_file(tmp_path, minilm_row):
    path = db.write_row(minilm_row, tmp_path)
    assert json.loads(path.read_text()) == minilm_row and not (path.parent / records.RECORDS_DIR).exists()


def test_an_earlier_version_refuses_a_split_row_by_its_schema(tmp_path, minilm_row, split):
    path = db.write_row(_moe(minilm_row, 4), tmp_path)
    with pytest.raises(RowError, match=r"schema weightdiag.row/1\+records is not weightdiag.row/1"):
        load_row(json.loads(path.read_text()), path)  # what every earlier version does with the file


def test_listing_and_naming_never_read_the_records(tmp_path, minilm_row, split, monkeypatch):
    path = db.write_row(_moe(minilm_row, 4), tmp_path)
    for summary in (path.parent / db.SUMMARY_DIR).iterdir():
        summary.unlink()  # no summaries: the JSON alone answers

    def refuse(*args: object) -> None:
        raise AssertionError("read the records")

    monkeypatch.setattr(rowstore, "decode", refuse)
    (record,) = api.list_rows(tmp_path, fitted_only=True)
    assert record["matrices"] == 144
    assert api.show_row("acme/moe", tmp_path, summary=True)["counts"] == {"matrices": 144, "vectors": 63}


@pytest.mark.parametrize("damage", ["missing", "truncated", "replaced"])
def test_a_row_whose_records_file_is_damaged_is_refused_by_name_and_skipped_by_listings(
    tmp_path, minilm_row, split, damage
):
    path = db.write_row(_moe(minilm_row, 4), tmp_path)
    (records_file,) = (path.parent / records.RECORDS_DIR).iterdir()
    data = records_file.read_bytes()
    if damage == "missing":
        records_file.unlink()
    elif damage == "truncated":
        records_file.write_bytes(data[:-10])
    else:
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 1
        records_file.write_bytes(bytes(flipped))
    with pytest.raises(RowError) as refused:
        read_row(path)
    assert refused.value.field.startswith("records.") and refused.value.model_id == "acme/moe"
    out = run_cli("db", "show", "acme/moe", "--db", str(tmp_path), "--json")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "records" in out.stderr, out.stderr
    if damage != "replaced":  # same size: found out only when read (a listing looks at the size only)
        for summary in (path.parent / db.SUMMARY_DIR).iterdir():
            summary.unlink()
        skipped: list[RowError] = []
        assert api.list_rows(tmp_path, fitted_only=True, on_skip=skipped.append) == [] and len(skipped) == 1


def test_a_damaged_record_in_the_database_names_the_record(tmp_path, minilm_row, split):
    row = _moe(minilm_row, 4)
    row["matrices"][123]["stats"]["numel"] = "many"
    path = db.write_row(row, tmp_path)
    with pytest.raises(RowError, match=r"field 'matrices\[123\].stats.numel'"):
        read_row(path)


# --- crash consistency: a reader never sees one file without the other ---------------------------------


def _age(folder: Path, seconds: float) -> None:
    for f in folder.iterdir():
        os.utime(f, (time.time() - seconds, time.time() - seconds))


def test_while_a_row_is_being_replaced_the_old_one_reads_whole(tmp_path, minilm_row, split, monkeypatch):
    old, new = _moe(minilm_row, 4), _moe(minilm_row, 5)
    path = db.write_row(old, tmp_path)
    seen = {}

    def between() -> None:  # the new records file is written; the JSON naming it is not renamed yet
        seen["files"] = len(list((path.parent / records.RECORDS_DIR).iterdir()))
        seen["row"] = read_row(path)

    monkeypatch.setattr(db, "_test_write_delay", between)
    db.write_row(new, tmp_path)
    assert seen == {"files": 2, "row": old}
    assert read_row(path) == new


def test_a_writer_killed_before_the_json_leaves_the_old_row_and_an_orphan_the_next_write_removes(
    tmp_path, minilm_row, split, monkeypatch
):
    old = _moe(minilm_row, 4)
    path = db.write_row(old, tmp_path)
    folder = path.parent / records.RECORDS_DIR

    def killed() -> None:
        raise KeyboardInterrupt  # as a kill between the two renames

    monkeypatch.setattr(db, "_test_write_delay", killed)
    with pytest.raises(KeyboardInterrupt):
        db.write_row(_moe(minilm_row, 5), tmp_path)
    assert len(list(folder.iterdir())) == 2 and read_row(path) == old  # the orphan does not matter
    monkeypatch.setattr(db, "_test_write_delay", lambda: None)
    _age(folder, 2 * db.RECORDS_GRACE_SECONDS)
    newest = _moe(minilm_row, 6)
    db.write_row(newest, tmp_path)
    assert len(list(folder.iterdir())) == 1 and read_row(path) == newest


def test_a_young_records_file_of_another_writer_is_kept(tmp_path, minilm_row, split):
    path = db.write_row(_moe(minilm_row, 4), tmp_path)
    folder = path.parent / records.RECORDS_DIR
    (other,) = folder.iterdir()  # as another writer's, whose JSON is about to be renamed
    db.write_row(_moe(minilm_row, 5), tmp_path)
    assert other.exists() and len(list(folder.iterdir())) == 2


def test_a_reader_of_a_json_whose_records_were_just_replaced_reads_the_new_row(
    tmp_path, minilm_row, split, monkeypatch
):
    old, new = _moe(minilm_row, 4), _moe(minilm_row, 5)
    path = db.write_row(old, tmp_path)
    _age(path.parent / records.RECORDS_DIR, 2 * db.RECORDS_GRACE_SECONDS)
    parse = records._parse
    calls = []

    def slow_reader(p: Path) -> object:
        doc = parse(p)
        calls.append(p)
        if len(calls) == 1:  # the row is replaced (old records removed) after this reader read the JSON
            monkeypatch.setattr(records, "_parse", parse)
            db.write_row(new, tmp_path)
            monkeypatch.setattr(records, "_parse", slow_reader)
        return doc

    monkeypatch.setattr(records, "_parse", slow_reader)
    assert read_row(path) == new and len(calls) == 2

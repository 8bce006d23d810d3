"""`weightdiag db export` as data (issue 38): --format csv|jsonl|parquet, --per-matrix; Arrow types from the declared
columns; the README's DuckDB query over the exported Parquet; atomic writes; CSV as before by default."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from weightdiag import api
from weightdiag.database.export import MODEL_COLUMNS, PER_MATRIX_COLUMNS
from weightdiag.record.table import MATRIX_COLUMN_NAMES

from .conftest import run_cli
from .docs_text import user_docs

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def db(cpu_fit, small_neox, small_llama, tmp_path_factory) -> Path:
    """A database of two fitted rows."""
    folder = tmp_path_factory.mktemp("export-db")
    for model in (small_neox, small_llama):
        api.save_row(cpu_fit(model), folder)
    return folder


def _rows(db: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((db / "rows").glob("*.json"))]


def test_the_default_csv_is_the_model_table_as_before(db):
    """No --format: the model-level CSV, its columns those of db list's records (the flat record's keys in order)."""
    out = run_cli("db", "export", "--db", str(db), "--fitted")
    assert out.returncode == 0, out.stderr
    table = list(csv.DictReader(io.StringIO(out.stdout)))
    assert len(table) == 2
    header = out.stdout.splitlines()[0].split(",")
    assert header[: len(MODEL_COLUMNS)] == [c.name for c in MODEL_COLUMNS]
    assert all(re.fullmatch(r"(k|lambda)_median_\w+", name) for name in header[len(MODEL_COLUMNS) :])
    records = api.list_rows(db, fitted_only=True)
    assert [r["id"] for r in table] == [r["id"] for r in records]


def _lines(rows) -> int:
    """The per-matrix table's lines of these rows: each matrix record, and each part of a fused one (qkv)."""
    return sum(1 + len(m.get("parts", [])) for r in rows for m in r["matrices"])


def test_per_matrix_csv_and_jsonl(db, tmp_path):
    rows = _rows(db)
    total = _lines(rows)
    assert total > sum(len(r["matrices"]) for r in rows)  # the neox row's fused qkv: its parts' lines too
    out = run_cli("db", "export", "--db", str(db), "--per-matrix", "--format", "jsonl")
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == total
    assert list(records[0]) == [c.name for c in PER_MATRIX_COLUMNS]
    target = tmp_path / "m.csv"
    out = run_cli("db", "export", "--db", str(db), "--per-matrix", "--output", str(target))
    assert out.returncode == 0 and f"{total} matrix records written" in out.stderr
    table = list(csv.DictReader(target.open()))
    assert len(table) == total and json.loads(table[0]["shape"]) == rows[0]["matrices"][0]["shape"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_parquet_per_matrix_has_arrow_types_and_the_rows_values(db, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    target = tmp_path / "matrices.parquet"
    out = run_cli("db", "export", "--db", str(db), "--format", "parquet", "--per-matrix", "--output", str(target))
    assert out.returncode == 0, out.stderr
    table = pq.read_table(target)
    assert table.column_names == [c.name for c in PER_MATRIX_COLUMNS]
    types = {c.name: c.type for c in PER_MATRIX_COLUMNS}
    expected = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}
    for field in table.schema:
        assert field.type == (pa.list_(pa.int64()) if types[field.name] == "list<int>" else expected[types[field.name]])
    rows = _rows(db)
    by_name = {(r["model"]["id"], m["name"]): (r, m) for r in rows for m in r["matrices"]}
    assert table.num_rows == _lines(rows)
    for line in table.to_pylist():
        if line["part_of"] is not None:  # a part's line (tests/test_library.py checks those)
            continue
        row, m = by_name[(line["model_id"], line["name"])]
        assert line["k"] == m["fits"][row["protocol"]["trim"]]["k"] and line["shape"] == m["shape"]
        assert line["protocol"] == row["protocol"]["name"] and line["alpha"] is None
    assert list(table.column_names[len(PER_MATRIX_COLUMNS) - len(MATRIX_COLUMN_NAMES) :]) == list(MATRIX_COLUMN_NAMES)
    # the model-level table too
    models = tmp_path / "rows.parquet"
    assert run_cli("db", "export", "--db", str(db), "--format", "parquet", "--output", str(models)).returncode == 0
    frame = pq.read_table(models).to_pandas()
    assert len(frame) >= 2 and frame.matrices.dtype == "int64"


def _readme_sql() -> str:
    text = user_docs()
    blocks = re.findall(r"```sql\n(.*?)```", text, re.S)
    queries = [b for b in blocks if "matrices.parquet" in b]
    assert queries, "the README shows a DuckDB query over matrices.parquet"
    return queries[0]


def test_the_readmes_duckdb_query_runs_on_the_export(db, tmp_path, monkeypatch):
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    monkeypatch.chdir(tmp_path)
    api.export_rows("parquet", output="matrices.parquet", db_dir=db, per_matrix=True)
    result = duckdb.sql(_readme_sql()).fetchall()
    assert result
    ids = {r["model"]["id"] for r in _rows(db)}
    assert {line[0] for line in result} <= ids


def test_parquet_needs_a_file_and_pyarrow(db, monkeypatch):
    out = run_cli("db", "export", "--db", str(db), "--format", "parquet")
    assert out.returncode == 2 and "--output" in out.stderr
    out = run_cli("db", "export", "--db", str(db), "--format", "xlsx")
    assert out.returncode == 2 and "csv, jsonl or parquet" in out.stderr
    import sys

    from weightdiag.errors import PANDAS_INSTALL, MissingDependencyError

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingDependencyError, match=re.escape(PANDAS_INSTALL)):
        api.export_rows("parquet", output="x.parquet", db_dir=db)


def test_an_export_that_fails_leaves_the_old_file(db, tmp_path, monkeypatch):
    """Atomic: a write that fails midway leaves the file as it was, and no temporary file."""
    pytest.importorskip("pyarrow")
    from weightdiag.database import export

    target = tmp_path / "m.parquet"
    target.write_bytes(b"old")

    original = export.matrix_table

    def broken(rows):
        yield from original(rows)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "matrix_table", broken)
    with pytest.raises(Exception, match="cannot write it"):
        api.export_rows("parquet", output=target, db_dir=db, per_matrix=True)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.parquet"]


def test_the_database_as_a_frame(db):
    """wd.database_frame: the export's tables as pandas DataFrames (the same columns and values)."""
    pytest.importorskip("pandas")
    import weightdiag as wd

    frame = wd.database_frame(db, per_matrix=True)
    assert list(frame.columns) == [c.name for c in PER_MATRIX_COLUMNS]
    rows = _rows(db)
    assert len(frame) == _lines(rows)
    assert set(frame.model_id) == {r["model"]["id"] for r in rows}
    models = wd.database_frame(db, fitted_only=True)
    assert len(models) == 2 and list(models.columns[: len(MODEL_COLUMNS)]) == [c.name for c in MODEL_COLUMNS]


def test_an_output_named_for_another_format_is_refused(tmp_path):
    """`db export --output rows.parquet` without --format parquet wrote CSV text into the .parquet file."""
    (tmp_path / "db").mkdir()
    out = run_cli("db", "export", "--output", str(tmp_path / "rows.parquet"), "--db", str(tmp_path / "db"))
    assert out.returncode == 2 and "--format parquet" in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
    assert not (tmp_path / "rows.parquet").exists()
    mixed = run_cli(
        "db", "export", "--format", "jsonl", "--output", str(tmp_path / "r.csv"), "--db", str(tmp_path / "db")
    )
    assert mixed.returncode == 2 and "--format csv" in mixed.stderr

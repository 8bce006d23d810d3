"""`weightdiag db export`: the database as tables (docs/tables.md), for pandas, Polars, DuckDB and Arrow.

Two tables: the model-level one (one record per row: store.flat_record, as `db list` shows it) and, with
`per_matrix`, one record per matrix of every fitted row (record/table.py MATRIX_COLUMNS after the row's key
columns ROW_KEY_COLUMNS). Formats: csv and jsonl (text), parquet (Arrow types from the declared columns, through
pyarrow: the `[pandas]` extra). The per-matrix table is streamed: one row file is read at a time and written in
batches, so a database of thousands of rows is exported in bounded memory. Files are written atomically (a
temporary file beside the target, renamed over it once complete).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..errors import PANDAS_INSTALL, MissingDependencyError, OptionError, param
from ..record.table import MATRIX_COLUMNS, ROW_KEY_COLUMNS, Column, matrix_columns

FORMATS = ("csv", "jsonl", "parquet")
BATCH_RECORDS = 10_000  # records per Parquet row group: what is held at once besides the one row being read

# The model-level table's fixed columns (diagnose.results.FlatRecord); then k_median_<kind>, lambda_median_<kind>.
MODEL_COLUMNS: tuple[Column, ...] = (
    Column("id", "str", "`model.id`"),
    Column("revision", "str", "`model.revision`, or a local row's `model.fingerprint`"),
    Column("source", "str", "local, hub, or cohort:<name>"),
    Column("protocol", "str", "`protocol.name`: hist1024 or exact"),
    Column("matrices", "int", "how many matrix records the row holds"),
    Column("attention", "str", "`architecture.attention`: the attention's architecture"),
    Column("ffn_median_k", "float", "the median k of the FFN's matrices"),
    Column("t_over_tau", "float", "`hyperparameters.t_over_tau`: training time over the weight-decay time scale"),
    Column("state", "str", "`hyperparameters.state`"),
    Column("created", "str", "`created`: when the row was fitted (UTC, ISO 8601)"),
)
KIND_COLUMN_DOC = "`kinds.<kind>.k_median` / `.lambda_median`: per-kind medians (one pair of columns per kind)"


SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


def check_format(fmt: str, output: Path | None = None) -> None:
    """The format is one of FORMATS, and an output file whose suffix names a format names this one (`--output
    rows.parquet` without `--format parquet` wrote CSV text into it)."""
    if fmt not in FORMATS:
        raise OptionError(f"{param('fmt')} {fmt!r}: choose csv, jsonl or parquet", param="fmt")
    named = SUFFIXES.get(output.suffix.lower()) if output is not None else None
    if named is not None and named != fmt:
        raise OptionError(
            f"{param('output')} {output} names {named} but the format is {fmt}: give {param('fmt')} {named}, or "
            "another file name",
            param="fmt",
        )


def model_columns(records: Sequence[Mapping[str, Any]]) -> list[Column]:
    """MODEL_COLUMNS, then the per-kind columns the records have (in the order first seen)."""
    fixed = {c.name for c in MODEL_COLUMNS}
    seen: dict[str, None] = {}
    for record in records:
        seen.update((name, None) for name in record if name not in fixed)
    return [*MODEL_COLUMNS, *(Column(name, "float", KIND_COLUMN_DOC) for name in seen)]


def matrix_table(rows: Iterable[Mapping[str, Any]]) -> Iterator[dict[str, list[Any]]]:
    """Per database row, its per-matrix table by column (PER_MATRIX_COLUMNS: the row's key columns first)."""
    for row in rows:
        model = row["model"]
        columns = matrix_columns(row)
        n = len(columns["layer_id"])
        key = {
            "model_id": model["id"],
            "revision": model.get("revision") or model.get("fingerprint"),
            "protocol": row["protocol"]["name"],
            "created": row.get("created"),
        }
        yield {**{name: [value] * n for name, value in key.items()}, **columns}


def by_column(records: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> dict[str, list[Any]]:
    return {c.name: [r.get(c.name) for r in records] for c in columns}


def by_record(table: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(table, values, strict=True)) for values in zip(*table.values(), strict=True)]


PER_MATRIX_COLUMNS: tuple[Column, ...] = (*ROW_KEY_COLUMNS, *MATRIX_COLUMNS)


def write_text(out: IO[str], fmt: str, columns: Sequence[Column], batches: Iterable[list[dict[str, Any]]]) -> int:
    """CSV (a header, then one line per record) or JSONL; the number of records written."""
    names = [c.name for c in columns]
    count = 0
    writer = None
    if fmt == "csv":
        writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
    for batch in batches:
        for record in batch:
            if writer is not None:
                writer.writerow({k: _cell(v) for k, v in record.items()})
            else:  # as the record has it (a model-level record holds the kinds of its own row only)
                out.write(json.dumps(record) + "\n")
        count += len(batch)
    return count


def _cell(value: Any) -> Any:
    """A CSV cell: a list (a shape) as its JSON ([768, 3072]); the rest as csv writes it."""
    return json.dumps(value) if isinstance(value, list) else value


def arrow_schema(columns: Sequence[Column]) -> Any:
    pa = require_pyarrow()
    types = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}
    types["list<int>"] = pa.list_(pa.int64())
    return pa.schema([pa.field(c.name, types[c.type]) for c in columns])


def write_parquet(path: Path, columns: Sequence[Column], tables: Iterable[Mapping[str, list[Any]]]) -> int:
    """A Parquet file of the declared columns (Arrow types), from tables by column (each: column name -> values),
    in row groups of about BATCH_RECORDS records, written atomically; how many records."""
    import importlib

    pa = require_pyarrow()
    pq = importlib.import_module("pyarrow.parquet")
    schema = arrow_schema(columns)
    names = [c.name for c in columns]
    count = 0

    def fill(tmp: Path) -> None:
        nonlocal count
        with pq.ParquetWriter(str(tmp), schema, compression="zstd") as writer:
            pending: dict[str, list[Any]] = {name: [] for name in names}
            for table in tables:
                for name in names:
                    pending[name].extend(table[name])
                if len(pending[names[0]]) >= BATCH_RECORDS:
                    writer.write_table(pa.Table.from_pydict(pending, schema=schema))
                    count += len(pending[names[0]])
                    pending = {name: [] for name in names}
            if pending[names[0]] or not count:
                writer.write_table(pa.Table.from_pydict(pending, schema=schema))
                count += len(pending[names[0]])

    write_atomic(path, fill)
    return count


def write_atomic(path: Path, fill: Callable[[Path], None]) -> None:
    """`fill(tmp)` writes the file at a temporary path beside `path`, which is then renamed over `path`: `path`
    holds the old content or the complete new one, never a part."""
    import tempfile

    from .store import _temp_prefix, _umask

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        fill(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_text_file(path: Path, fmt: str, columns: Sequence[Column], batches: Iterable[list[dict[str, Any]]]) -> int:
    count = 0

    def fill(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8", newline="") as out:
            count = write_text(out, fmt, columns, batches)

    write_atomic(path, fill)
    return count


def text_of(fmt: str, columns: Sequence[Column], batches: Iterable[list[dict[str, Any]]]) -> tuple[str, int]:
    buffer = io.StringIO()
    count = write_text(buffer, fmt, columns, batches)
    return buffer.getvalue(), count


def require_pyarrow() -> Any:
    """The pyarrow module, or MissingDependencyError (exit 2) saying how to install the extra."""
    import importlib

    try:
        return importlib.import_module("pyarrow")
    except ImportError:
        raise MissingDependencyError(
            f"--format parquet needs pyarrow, which is not installed: {PANDAS_INSTALL}",
            package="pyarrow",
        ) from None

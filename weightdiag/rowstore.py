"""Per-matrix and per-vector records of a big row, stored by column beside its JSON (docs/row-schema.md).

A row of an MoE model holds tens of thousands of records (DeepSeek-V3: ~45,000 expert matrices): as
JSON they are ~1.4 KB each, and parsing and checking them record by record takes seconds. Here each
list of records (`matrices`, `vectors`) is one table: every leaf path of the records (`stats.max_abs`,
`fits.mid80.k`) is a column of one type (float64, int64, bool, a string from a table, a list of ints,
or JSON for anything else), stored as numpy arrays in one `.npz` file (numpy's documented zip of
`.npy` arrays; read with allow_pickle=False). Records are rebuilt exactly (same keys in the same order,
same values and JSON types): `decode(encode(records)) == records`.

The checks stay those of weightdiag.records, which are type checks only: a record's validity depends
on its keys and the type of each value, never on the values. Within a column every value has the
column's type, so records of one key layout and one pattern of nulls pass or fail together, and one
of each is checked (plus every record holding a JSON value, whose insides no column type vouches for).
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ENCODING = "weightdiag.records/1"
TABLES = ("matrices", "vectors")
_F8, _I8, _BOOL, _STR, _INTS, _JSON = "f8", "i8", "bool", "str", "ints", "json"


class StoreError(ValueError):
    """A records file that cannot be decoded: `what` says why (records.read_row turns it into RowError)."""


def _leaves(record: dict[str, Any], prefix: tuple[str, ...], out: list[tuple[tuple[str, ...], Any]]) -> None:
    for key, value in record.items():
        if isinstance(value, dict) and value:
            _leaves(value, (*prefix, key), out)
        else:  # an empty object is a leaf: it has no paths of its own to keep it
            out.append(((*prefix, key), value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < (1 << 63)


def _column_type(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    if all(isinstance(v, float) for v in present):
        return _F8  # JSON has no NaN (rows are written with allow_nan=False): NaN stands for null
    if all(_is_int(v) for v in present):
        return _I8
    if all(isinstance(v, bool) for v in present):
        return _BOOL
    if all(isinstance(v, str) for v in present):
        return _STR
    if all(isinstance(v, list) and all(_is_int(x) for x in v) for v in present):
        return _INTS
    return _JSON


def _encode_table(name: str, records: Sequence[dict[str, Any]], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    n = len(records)
    paths: dict[tuple[str, ...], int] = {}
    layouts: dict[tuple[int, ...], int] = {}
    layout_of = np.empty(n, dtype=np.int32)
    cells: list[dict[int, Any]] = []  # column -> {record index: value}
    for i, record in enumerate(records):
        leaves: list[tuple[tuple[str, ...], Any]] = []
        _leaves(record, (), leaves)
        columns = []
        for path, value in leaves:
            j = paths.setdefault(path, len(paths))
            if j == len(cells):
                cells.append({})
            cells[j][i] = value
            columns.append(j)
        layout_of[i] = layouts.setdefault(tuple(columns), len(layouts))
    header_columns = []
    for path, j in paths.items():
        where = cells[j]
        values = list(where.values())
        kind = _column_type(values)
        column: dict[str, Any] = {"path": list(path), "type": kind}
        key = f"{name}.{j}"
        rows = np.fromiter(where.keys(), dtype=np.int64, count=len(where))
        if len(where) < n:
            present = np.zeros(n, dtype=bool)
            present[rows] = True
            arrays[f"{key}.present"] = present
        full: list[Any] = [None] * n
        for i, v in where.items():
            full[i] = v
        nulls = np.fromiter((v is None for v in full), dtype=bool, count=n)
        if kind == _F8:
            arrays[f"{key}.values"] = np.array([np.nan if v is None else v for v in full], dtype=np.float64)
        elif kind in (_I8, _BOOL):
            dtype = np.int64 if kind == _I8 else np.bool_
            arrays[f"{key}.values"] = np.array([0 if v is None else v for v in full], dtype=dtype)
            if nulls.any():
                arrays[f"{key}.null"] = nulls
        elif kind == _STR:
            table: dict[str, int] = {}
            codes = np.array([-1 if v is None else table.setdefault(v, len(table)) for v in full], dtype=np.int32)
            arrays[f"{key}.values"] = codes
            column["strings"] = list(table)
        elif kind == _INTS:
            lengths = np.array([-1 if v is None else len(v) for v in full], dtype=np.int64)
            arrays[f"{key}.lengths"] = lengths
            arrays[f"{key}.values"] = np.array([x for v in full if v is not None for x in v], dtype=np.int64)
        else:
            column["values"] = full  # present ones only matter; absent cells are null here
        header_columns.append(column)
    arrays[f"{name}.layout"] = layout_of
    return {"count": n, "columns": header_columns, "layouts": [list(layout) for layout in layouts]}


def encode(tables: dict[str, Sequence[dict[str, Any]]]) -> bytes:
    """The records of each table (`matrices`, `vectors`) as the bytes of one .npz file."""
    arrays: dict[str, np.ndarray] = {}
    header = {"encoding": ENCODING, "tables": {name: _encode_table(name, tables[name], arrays) for name in tables}}
    arrays["header"] = np.frombuffer(json.dumps(header, allow_nan=False).encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # stored, not deflated: decoding speed is the point
    return buffer.getvalue()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _array(npz: Any, key: str, n: int | None = None, dtype: str | None = None) -> np.ndarray:
    try:
        array = npz[key]
    except KeyError:
        raise StoreError(f"array {key} is missing") from None
    if array.ndim != 1 or (n is not None and len(array) != n) or (dtype is not None and array.dtype.kind != dtype):
        raise StoreError(f"array {key} has shape {array.shape} and type {array.dtype}, not what the header says")
    return array


def _column_values(npz: Any, key: str, column: dict[str, Any], n: int) -> tuple[list[Any], np.ndarray | None]:
    """The column's values for all n records (None where null), and its null mask where it has nulls."""
    kind = column.get("type")
    if kind == _F8:
        values = _array(npz, f"{key}.values", n, "f")
        nulls = np.isnan(values)
        out = values.tolist()
    elif kind in (_I8, _BOOL):
        out = _array(npz, f"{key}.values", n, "i" if kind == _I8 else "b").tolist()
        nulls = _array(npz, f"{key}.null", n, "b") if f"{key}.null" in npz.files else np.zeros(n, dtype=bool)
    elif kind == _STR:
        strings = column.get("strings")
        if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
            raise StoreError(f"column {key} has no string table")
        codes = _array(npz, f"{key}.values", n, "i")
        if len(codes) and (codes.min() < -1 or codes.max() >= len(strings)):
            raise StoreError(f"column {key} names strings beyond its table")
        nulls = codes < 0
        table = np.empty(len(strings) + 1, dtype=object)
        table[:-1] = strings  # one str object per distinct string, shared by the records
        table[-1] = None
        out = table[codes].tolist()
    elif kind == _INTS:
        lengths = _array(npz, f"{key}.lengths", n, "i")
        flat = _array(npz, f"{key}.values", None, "i").tolist()
        nulls = lengths < 0
        if lengths.min(initial=0) < -1 or int(lengths[~nulls].sum()) != len(flat):
            raise StoreError(f"column {key}: its lengths do not add up to its values")
        ends = np.cumsum(np.where(nulls, 0, lengths)).tolist()
        spans = zip(nulls.tolist(), lengths.tolist(), ends, strict=True)
        out = [None if null else flat[end - length : end] for null, length, end in spans]
    elif kind == _JSON:
        out = column.get("values")
        if not isinstance(out, list) or len(out) != n:
            raise StoreError(f"column {key} holds {type(out).__name__}, not {n} values")
        nulls = np.fromiter((v is None for v in out), dtype=bool, count=n)
    else:
        raise StoreError(f"column {key} has the unknown type {kind!r}")
    if kind in (_F8, _I8, _BOOL) and nulls.any():
        for i in np.flatnonzero(nulls).tolist():
            out[i] = None
    return out, (nulls if nulls.any() else None)


def _builder(paths: list[tuple[str, ...]]) -> Callable[..., dict[str, Any]]:
    """A function of one value per path that builds the nested record, keys in the order given.

    Generated as one nested dict display: building 50,000 records this way costs ~0.1 s where a loop
    over paths costs several times that. Keys reach the code as constants of its namespace, never as
    text, so nothing read from the file is compiled."""
    namespace: dict[str, Any] = {}

    def display(group: list[tuple[tuple[str, ...], int]], depth: int) -> str:
        items: list[str] = []
        i = 0
        while i < len(group):
            path, j = group[i]
            name = f"k{len(namespace)}"
            namespace[name] = path[depth]
            if len(path) == depth + 1:
                items.append(f"{name}: v{j}")
                i += 1
                continue
            end = i
            while end < len(group) and len(group[end][0]) > depth + 1 and group[end][0][depth] == path[depth]:
                end += 1
            items.append(f"{name}: {display(group[i:end], depth + 1)}")
            i = end
        return "{" + ", ".join(items) + "}"

    body = display([(p, j) for j, p in enumerate(paths)], 0)
    args = ", ".join(f"v{j}" for j in range(len(paths)))
    exec(f"def build({args}):\n    return {body}\n", namespace)  # generated from indices only
    return namespace["build"]


def _check_layout(paths: list[tuple[str, ...]]) -> None:
    """Paths that make one record: no path a prefix of another, keys of one object together (as written)."""
    seen: set[tuple[str, ...]] = set()
    closed: set[tuple[str, ...]] = set()
    previous: tuple[str, ...] = ()
    for path in paths:
        if not path or path in seen:
            raise StoreError(f"a record layout repeats or empties a path {'.'.join(path)}")
        for depth in range(1, len(path)):
            if path[:depth] in seen:
                raise StoreError(f"a record layout has {'.'.join(path[:depth])} both as a value and an object")
        common = 0
        while common < min(len(path), len(previous)) - 1 and path[common] == previous[common]:
            common += 1
        for depth in range(common + 1, len(previous)):
            closed.add(previous[:depth])
        if any(path[:depth] in closed for depth in range(1, len(path))):
            raise StoreError(f"a record layout splits the object {'.'.join(path[:-1])}")
        seen.add(path)
        previous = path


Checker = Callable[[object, str], None]


def _decode_table(npz: Any, name: str, table: Any, check: Checker) -> list[dict[str, Any]]:
    if not isinstance(table, dict):
        raise StoreError(f"table {name} is missing from the header")
    n, columns, layouts = table.get("count"), table.get("columns"), table.get("layouts")
    if not (isinstance(n, int) and n >= 0 and isinstance(columns, list) and isinstance(layouts, list)):
        raise StoreError(f"table {name}: count, columns or layouts missing")
    layout_of = _array(npz, f"{name}.layout", n, "i")
    if n and (layout_of.min() < 0 or layout_of.max() >= len(layouts)):
        raise StoreError(f"table {name}: a record names a layout that does not exist")
    values: list[list[Any]] = []
    nulls: list[np.ndarray | None] = []
    presents: list[np.ndarray | None] = []
    paths: list[tuple[str, ...]] = []
    for j, column in enumerate(columns):
        key = f"{name}.{j}"
        path = column.get("path") if isinstance(column, dict) else None
        if not (isinstance(path, list) and path and all(isinstance(k, str) for k in path)):
            raise StoreError(f"column {key} has no path")
        paths.append(tuple(path))
        column_values, column_nulls = _column_values(npz, key, column, n)
        values.append(column_values)
        nulls.append(column_nulls)
        presents.append(_array(npz, f"{key}.present", n, "b") if f"{key}.present" in npz.files else None)
    records: list[Any] = [None] * n
    for index, layout in enumerate(layouts):
        if not (isinstance(layout, list) and all(isinstance(j, int) and 0 <= j < len(columns) for j in layout)):
            raise StoreError(f"table {name}: layout {index} names columns that do not exist")
        _check_layout([paths[j] for j in layout])
        rows = np.flatnonzero(layout_of == index)
        if not len(rows):
            continue
        absent = [j for j in range(len(columns)) if j not in set(layout)]
        for j in layout:  # a record of this layout has each of its columns, and no other
            if presents[j] is not None and not presents[j][rows].all():
                raise StoreError(f"table {name}: column {j} is absent from records whose layout has it")
        for j in absent:
            if presents[j] is None or presents[j][rows].any():
                raise StoreError(f"table {name}: column {j} is present in records whose layout lacks it")
        build = _builder([paths[j] for j in layout])
        row_list = rows.tolist()
        picked = [values[j] if len(rows) == n else [values[j][i] for i in row_list] for j in layout]
        built = map(build, *picked) if layout else ({} for _ in row_list)  # an empty record has no columns
        for i, record in zip(row_list, built, strict=True):
            records[i] = record
        # One record per pattern of nulls is checked (see the module docstring), and every record with a
        # JSON value.
        nullable = [nulls[j][rows] for j in layout if nulls[j] is not None]
        if nullable:
            _, first = np.unique(np.stack(nullable, axis=1), axis=0, return_index=True)
            to_check = set(rows[first].tolist())
        else:
            to_check = {row_list[0]}
        for j in layout:
            if columns[j]["type"] == _JSON:
                to_check.update(row_list)
                break
        for i in sorted(to_check):
            check(records[i], f"{name}[{i}]")
    return records


def decode(data: bytes, checks: dict[str, Checker]) -> dict[str, list[dict[str, Any]]]:
    """The tables of a records file, each record rebuilt and checked (`checks[table]`, raising as it does);
    StoreError when the file is not a records file this version reads."""
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise StoreError(f"not a records file ({exc})") from None
    collecting = gc.isenabled()
    gc.disable()  # ~350,000 dicts built, none of them garbage: the collector's passes over them cost half
    try:
        with npz:
            return _decode(npz, checks)
    except (ValueError, OSError, EOFError, KeyError, TypeError, zipfile.BadZipFile) as exc:  # a damaged member
        if isinstance(exc, StoreError):
            raise
        raise StoreError(f"a damaged array ({type(exc).__name__}: {exc})") from None
    finally:
        if collecting:
            gc.enable()


def _decode(npz: Any, checks: dict[str, Checker]) -> dict[str, list[dict[str, Any]]]:
    try:
        header = json.loads(_array(npz, "header", None, "u").tobytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise StoreError(f"its header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict) or header.get("encoding") != ENCODING:
        found = header.get("encoding") if isinstance(header, dict) else None
        raise StoreError(f"encoding {found!r} is not {ENCODING}, the one this weightdiag reads")
    tables = header.get("tables")
    if not isinstance(tables, dict):
        raise StoreError("the header has no tables")
    return {name: _decode_table(npz, name, tables.get(name), checks[name]) for name in checks}

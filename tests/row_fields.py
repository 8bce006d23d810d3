"""docs/row-schema.md's field reference, generated from the row's one declaration (the TypedDicts of
weightdiag.record.schema): every object of a row, where it sits, and its required and optional fields with
their JSON types. tests/test_row_schema.py fails when the document's block differs from this;
`python -m tests.row_fields` writes it into the document.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, get_args, get_origin, is_typeddict

from weightdiag.record import schema

DOC = Path(__file__).resolve().parent.parent / "docs" / "row-schema.md"
BEGIN = "<!-- fields: generated from weightdiag/record/schema.py by `python -m tests.row_fields`; do not edit -->"
END = "<!-- end of the generated fields -->"
_BLOCK = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)

# What the keys of an object of objects name, in the paths of the table.
KEYS = {"kinds": "<kind>", "part_kinds": "<kind>", "fits": "<trim>"}
_SCALARS = {str: "string", int: "integer", float: "number", bool: "true/false", Any: "any"}


def type_name(tp: Any) -> str:
    """A declared type in words: `string or null`, `list of integers`, `object of FitRecord`, `ModelInfo`."""
    inner, nullable = schema._nullable(tp)
    if is_typeddict(inner):
        name = inner.__name__
    elif get_origin(inner) is list:
        item = type_name(get_args(inner)[0])
        name = f"list of {item}s" if get_args(inner)[0] in _SCALARS else f"list of {item}"
    elif get_origin(inner) is dict:
        value = get_args(inner)[1]
        name = "object" if value is Any else f"object of {type_name(value)}{'s' if value in _SCALARS else ''}"
    else:
        name = _SCALARS[inner]
    return f"{name} or null" if nullable else name


def places() -> dict[type, list[str]]:
    """Every TypedDict of a row and the paths where it sits (`matrices[].fits.<trim>`), in the order met."""
    found: dict[type, list[str]] = {}

    def walk(tp: Any, path: str) -> None:
        tp, _ = schema._nullable(tp)
        if is_typeddict(tp):
            found.setdefault(tp, []).append(path)
            required, optional = schema.fields_of(tp)
            for key, field_type in {**required, **optional}.items():
                walk(field_type, f"{path}.{key}" if path else key)
        elif get_origin(tp) is list:
            walk(get_args(tp)[0], f"{path}[]")
        elif get_origin(tp) is dict:
            walk(get_args(tp)[1], f"{path}.{KEYS.get(path.rsplit('.', 1)[-1].rstrip('[]'), '<key>')}")

    walk(schema.Row, "")
    return found


def _fields(declared: dict[str, Any]) -> str:
    return ", ".join(f"`{key}` {type_name(tp)}" for key, tp in declared.items()) or "none"


def block() -> str:
    """The generated section: one table row per object type of a row."""
    lines = [
        BEGIN,
        "| type | at | required fields | optional fields |",
        "|---|---|---|---|",
    ]
    for typed, paths in places().items():
        where = ", ".join(f"`{p}`" for p in paths if p) or "the row"
        required, optional = schema.fields_of(typed)
        lines.append(f"| `{typed.__name__}` | {where} | {_fields(required)} | {_fields(optional)} |")
    lines.append(END)
    return "\n".join(lines)


def documented_block(text: str) -> str | None:
    found = _BLOCK.search(text)
    return found.group(0) if found else None


def write() -> None:
    text = DOC.read_text()
    if documented_block(text) is None:
        raise SystemExit(f"{DOC}: no generated block ({BEGIN}) to replace")
    DOC.write_text(_BLOCK.sub(lambda _: block(), text))


if __name__ == "__main__":
    write()
    sys.exit(0)

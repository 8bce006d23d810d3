"""The database folder: rows as JSON files, written atomically, found by model and revision.

Layout under the database folder (default $WEIGHTDIAG_DB, else ./DATABASE):
    rows/<model-slug>@<revision-slug>[.<protocol>].json   fitted rows (one per model@revision)
A reader never sees a half-written row: rows are written to a temporary file in the same folder,
flushed to disk, then renamed over the final name (atomic on POSIX and Windows).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import BadInputError

ROWS_DIR = "rows"
ENV_DB = "WEIGHTDIAG_DB"


def default_db_dir() -> Path:
    return Path(os.environ.get(ENV_DB) or "DATABASE")


def slug(text: str) -> str:
    """File-name-safe form of a model id or revision ('EleutherAI/pythia-70m' -> 'EleutherAI--pythia-70m')."""
    text = text.replace("/", "--")
    return re.sub(r"[^A-Za-z0-9._+-]", "_", text).strip("._") or "_"


def row_filename(row: dict[str, Any]) -> str:
    model = row["model"]
    revision = model.get("revision") or model.get("fingerprint") or "unknown"
    protocol = row["protocol"]["name"]
    suffix = "" if protocol == "hist1024" else f".{protocol}"
    return f"{slug(model['id'])}@{slug(revision)}{suffix}.json"


def write_json_atomic(path: Path, document: Any) -> None:
    """Write JSON so that `path` holds either the old content or the complete new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_row(row: dict[str, Any], db_dir: Path | None = None) -> Path:
    path = (db_dir or default_db_dir()) / ROWS_DIR / row_filename(row)
    write_json_atomic(path, row)
    return path


def load_row(path: Path) -> dict[str, Any]:
    try:
        row = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInputError(
            f"{path}: cannot read a row ({exc.__class__.__name__}); give a weightdiag row file"
        ) from None
    if not isinstance(row, dict) or not str(row.get("schema", "")).startswith("weightdiag.row/"):
        raise BadInputError(
            f"{path}: not a weightdiag row (no 'schema' field); give a row written by weightdiag"
        )
    return row


def iter_rows(db_dir: Path | None = None) -> Iterator[tuple[Path, dict[str, Any]]]:
    folder = (db_dir or default_db_dir()) / ROWS_DIR
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.json")):
        try:
            yield path, load_row(path)
        except BadInputError:
            continue

"""Diff rows in the database: DATABASE/diffs/<base>..<tuned>.json (schema weightdiag.diff/1), written atomically.

A folder of their own: fit rows live in rows/ and every reader of rows/ checks their schema, so a diff row
never collides with a fit row nor shows up in `db list` as a damaged one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..delta.result import DiffResult
from ..errors import DatabaseError
from .store import default_db_dir, name_part, write_json_atomic

DIFFS_DIR = "diffs"


def _side_name(side: dict) -> str:
    rev = side.get("commit") or side.get("revision")
    return name_part(str(side["id"]) + (f"@{rev}" if rev else ""), 90)


def diff_filename(result: DiffResult) -> str:
    """Readable names of both sides, and a hash of where they are and what was selected (two local folders
    of the same name, or two --include selections, do not overwrite each other)."""
    key = "\0".join(
        [result.base["location"], result.tuned["location"], *result.run["include"], "\0", *result.run["exclude"]]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{_side_name(result.base)}..{_side_name(result.tuned)}.{digest}.json"


def save_diff(result: DiffResult, db_dir: str | Path | None = None) -> Path:
    path = (Path(db_dir) if db_dir else default_db_dir()) / DIFFS_DIR / diff_filename(result)
    try:
        write_json_atomic(path, result.to_json())
    except OSError as exc:
        raise DatabaseError(
            f"cannot write {path} ({exc.strerror or exc.__class__.__name__}); pass a writable --db, or --no-save",
            folder=path.parent,
        ) from None
    return path

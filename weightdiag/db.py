"""The database folder: rows as JSON files, written atomically, found by model and revision.

Layout under the database folder (default $WEIGHTDIAG_DB, else ./DATABASE):
    rows/<model-slug>@<revision-slug>[.<protocol>].json   fitted rows (one per model@revision)
A reader never sees a half-written row: rows are written to a temporary file in the same folder,
flushed to disk, then renamed over the final name (atomic on POSIX and Windows).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
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


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """Write text so that `path` holds either the old content or the complete new one."""
    import tempfile  # here: tempfile (and random) cost ~3 ms at start-up and --no-save runs never write

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; rows are shared files like any other
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: Path, document: Any) -> None:
    write_text_atomic(path, json.dumps(document, indent=1, allow_nan=False) + "\n")


def check_writable(db_dir: Path | None = None) -> None:
    """Fail before a long fit, not after it, when rows could not be written to the database folder."""
    folder = (db_dir or default_db_dir()) / ROWS_DIR
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not a folder" if not existing.is_dir() else "is not writable"
        raise BadInputError(
            f"database folder {folder}: {existing} {what}; pass a writable --db (or WEIGHTDIAG_DB), or --no-save"
        )


def write_row(row: dict[str, Any], db_dir: Path | None = None) -> Path:
    path = (db_dir or default_db_dir()) / ROWS_DIR / row_filename(row)
    try:
        write_json_atomic(path, row)
    except OSError as exc:
        raise BadInputError(
            f"cannot write {path} ({exc.strerror or exc.__class__.__name__}); pass a writable --db, or --no-save"
        ) from None
    return path


def load_row(path: Path) -> dict[str, Any]:
    try:
        row = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInputError(
            f"{path}: cannot read a row ({exc.__class__.__name__}); give a weightdiag row file"
        ) from None
    if not isinstance(row, dict) or not str(row.get("schema", "")).startswith("weightdiag.row/"):
        raise BadInputError(f"{path}: not a weightdiag row (no 'schema' field); give a row written by weightdiag")
    model, protocol, kinds = row.get("model"), row.get("protocol"), row.get("kinds")
    if not (
        isinstance(model, dict)
        and isinstance(model.get("id"), str)
        and isinstance(protocol, dict)
        and isinstance(protocol.get("name"), str)
        and isinstance(kinds, dict)
        and isinstance(row.get("matrices", []), list)
    ):
        raise BadInputError(f"{path}: a damaged weightdiag row (model id, protocol or kinds missing); refit the model")
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


def find_rows(spec: str, db_dir: Path | None = None, protocol: str | None = None) -> list[dict[str, Any]]:
    """Fitted rows whose model id (or id@revision) is `spec`, oldest first."""
    found = []
    for _, row in iter_rows(db_dir):
        model = row["model"]
        names = {model["id"], f"{model['id']}@{model.get('revision')}"}
        if spec in names and (protocol is None or row["protocol"]["name"] == protocol):
            found.append(row)
    return sorted(found, key=lambda r: r.get("created") or "")


def all_rows(db_dir: Path | None = None, cohorts: bool = True) -> list[dict[str, Any]]:
    """The shipped cohort rows (unless cohorts=False) followed by the fitted rows of the database."""
    rows: list[dict[str, Any]] = []
    if cohorts:
        from .diagnose.cohort import COHORTS, load_cohort

        for name in COHORTS:
            rows.extend(load_cohort(name))
    rows.extend(row for _, row in iter_rows(db_dir))
    return rows


def flat_record(row: dict[str, Any]) -> dict[str, Any]:
    """One flat record per row (for listing and CSV/JSONL export): identity plus per-kind medians."""
    from .diagnose.functions import ffn_median_k

    model = row["model"]
    hp = row.get("hyperparameters") or {}
    record: dict[str, Any] = {
        "id": model["id"],
        "revision": model.get("revision"),
        "source": model["source"] + (f":{model['cohort']}" if model.get("cohort") else ""),
        "protocol": row["protocol"]["name"],
        "matrices": len(row.get("matrices", [])),
        "attention": (row.get("architecture") or {}).get("attention"),
        "ffn_median_k": ffn_median_k(row),
        "t_over_tau": hp.get("t_over_tau"),
        "state": hp.get("state"),
        "created": row.get("created"),
    }
    for kind, s in row.get("kinds", {}).items():
        record[f"k_median_{kind}"] = s.get("k_median")
        record[f"lambda_median_{kind}"] = s.get("lambda_median")
    return record


def row_by_id(spec: str, db_dir: Path | None = None) -> dict[str, Any]:
    """A row by file path, cohort entry id, or fitted model id[@revision] (the newest)."""
    path = Path(spec)
    if path.is_file():
        return load_row(path)
    from .diagnose.cohort import cohort_row

    entry = cohort_row(spec)
    if entry is not None:
        return entry
    found = find_rows(spec, db_dir)
    if not found:
        raise BadInputError(
            f"{spec}: no such row (not a row file, cohort entry or fitted model id); see `weightdiag db list`"
        )
    return found[-1]

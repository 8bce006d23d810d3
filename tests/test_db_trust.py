"""Issue 42, the database half of "trust nothing on disk, hang on nothing": rows/.index.sqlite is a cache that is
never believed over the row files. Each hostile index is built here, the commands run on it, and their output
compared with the output on a copy holding only the row files; then the index must be whole again, and no file
outside the database folder written."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from weightdiag import api
from weightdiag.database import store as db
from weightdiag.database.index import INDEX_NAME
from weightdiag.testing import synthetic

from .conftest import run_cli

TINY = synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128)
A, B = "acme--run@step_100.json", "acme--run@step_500.json"  # the two entries a swap exchanges


@pytest.fixture(scope="module")
def tiny_row(tmp_path_factory) -> dict[str, Any]:
    from weightdiag.run.measure import FitOptions

    model = synthetic.write_model(tmp_path_factory.mktemp("tiny") / "tiny", TINY)
    return api.fit_model(str(model), FitOptions(device="cpu"))


def _row(template: dict[str, Any], model_id: str, revision: str, minute: int = 0) -> dict[str, Any]:
    row = json.loads(json.dumps(template))
    row["model"].update(id=model_id, source="hub", revision=revision, commit="0" * 40, fingerprint=None)
    row["created"] = f"2026-01-01T00:{minute:02d}:00Z"
    return row


@pytest.fixture
def database(tmp_path, tiny_row) -> Path:
    """Two runs of two steps, written by write_row (the index written as fits write it)."""
    folder = tmp_path / "db"
    for n, model_id in enumerate(("acme/run", "other/run")):
        for step in (100, 500):
            db.write_row(_row(tiny_row, model_id, f"step_{step}", n * 10 + step // 100), folder)
    return folder


# --- what every damage is held to ---------------------------------------------------------------------------

COMMANDS = [
    ("db", "list", "--fitted", "--json"),
    ("db", "show", "acme/run@step_100", "--json"),
    ("db", "show", "ACME/RUN@STEP_500", "--json"),  # through the whole folder's names (the index's columns)
    ("db", "show", "acme/run", "--json"),  # two revisions, none main: refused, listing them
    ("db", "show", "no/such", "--json"),
    ("compare", "--json"),
    ("trajectory", "acme/run", "--json"),
]


def _clean_copy(database: Path, where: Path) -> Path:
    """A copy holding only the row files: what every command must answer on any index."""
    (where / "rows").mkdir(parents=True)
    for path in (database / "rows").glob("*.json"):
        shutil.copyfile(path, where / "rows" / path.name)
    return where


def _answers(folder: Path, real: bool = False) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr's last line) of each command, with the folder's name taken out."""
    out = []
    for command in COMMANDS:
        result = run_cli(*command, "--db", str(folder), real=real, timeout=60)
        assert "Traceback" not in result.stderr, result.stderr
        last = (result.stderr.strip().splitlines() or [""])[-1] if result.returncode else ""
        out.append((result.returncode, result.stdout.replace(str(folder), "DB"), last.replace(str(folder), "DB")))
    return out


def _outside(root: Path, database: Path) -> dict[str, tuple[int, str]]:
    """Every file under `root` but the database folder: (mtime_ns, sha256 of its bytes)."""
    seen = {}
    for path in root.rglob("*"):
        if database in path.parents or path == database or path.is_symlink() or not path.is_file():
            continue
        seen[str(path)] = (path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


def _entries(rows: Path) -> dict[bytes, tuple[str, str]]:
    """name -> (sha256 of the row file, summary) of each entry of the index, read as it is on disk."""
    path = rows / INDEX_NAME
    assert path.is_file() and not path.is_symlink(), "the index is not a regular file again"
    with sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True) as index:
        found = index.execute("SELECT name, sha256, summary FROM rows").fetchall()
    return {bytes(name): (sha, summary) for name, sha, summary in found}


def _held_to_the_row_files(database: Path, tmp_path: Path, damage: Callable[[Path], None], real: bool = False) -> None:
    clean = _clean_copy(database, tmp_path / "clean")
    expected = _answers(clean)
    damage(database / "rows")
    before = _outside(tmp_path, database)
    assert _answers(database, real=real) == expected
    assert _outside(tmp_path, database) == before  # nothing outside the database folder written
    # repaired: the next command's entries are those made from the row files alone
    assert _entries(database / "rows") == _entries(clean / "rows")
    assert _answers(database) == expected


def _sql(rows: Path, *statements: str, args: tuple[Any, ...] = ()) -> None:
    with sqlite3.connect(rows / INDEX_NAME) as index:
        for statement in statements:
            index.execute(statement, args if "?" in statement else ())


def _key(name: str) -> bytes:
    return os.fsencode(name)


def _swap_summaries(rows: Path) -> None:
    with sqlite3.connect(rows / INDEX_NAME) as index:
        a, b = (index.execute("SELECT summary FROM rows WHERE name = ?", (_key(n),)).fetchone()[0] for n in (A, B))
        index.execute("UPDATE rows SET summary = ? WHERE name = ?", (b, _key(A)))
        index.execute("UPDATE rows SET summary = ? WHERE name = ?", (a, _key(B)))


def _swap_entries(rows: Path) -> None:
    """Everything but the names exchanged: each entry is whole, and stands for the other file."""
    with sqlite3.connect(rows / INDEX_NAME) as index:
        columns = [c[1] for c in index.execute("PRAGMA table_info(rows)") if c[1] != "name"]
        a, b = (
            index.execute(f"SELECT {', '.join(columns)} FROM rows WHERE name = ?", (_key(n),)).fetchone()
            for n in (A, B)
        )
        sets = ", ".join(f"{c} = ?" for c in columns)
        index.execute(f"UPDATE rows SET {sets} WHERE name = ?", (*b, _key(A)))
        index.execute(f"UPDATE rows SET {sets} WHERE name = ?", (*a, _key(B)))


def _edit_value(rows: Path) -> None:
    """One k in one summary: the JSON still parses (`db list` showed k 0.5000 where the row says 1.2)."""
    with sqlite3.connect(rows / INDEX_NAME) as index:
        (summary,) = index.execute("SELECT summary FROM rows WHERE name = ?", (_key(A),)).fetchone()
        document = json.loads(summary)
        kind = next(iter(document["row"]["kinds"]))
        document["row"]["kinds"][kind]["k_median"] = 0.5
        index.execute("UPDATE rows SET summary = ? WHERE name = ?", (json.dumps(document), _key(A)))


def _edit_identity(rows: Path) -> None:
    """The key columns of one entry name another revision (what `db show` matches names on)."""
    _sql(rows, "UPDATE rows SET revision = 'step_900' WHERE name = ?", args=(_key(B),))


def _drop(rows: Path) -> None:
    _sql(rows, "DELETE FROM rows WHERE name = ?", args=(_key(A),))


def _cut_entry(rows: Path) -> None:
    _sql(rows, "UPDATE rows SET summary = substr(summary, 1, length(summary) / 2) WHERE name = ?", args=(_key(A),))


def _truncate(rows: Path) -> None:
    path = rows / INDEX_NAME
    os.truncate(path, path.stat().st_size // 2)


def _garbage(rows: Path) -> None:
    (rows / INDEX_NAME).write_bytes(b"not a database" * 300)


DAMAGES = {
    "swap-summaries": _swap_summaries,
    "swap-entries": _swap_entries,
    "edit-value": _edit_value,
    "edit-identity": _edit_identity,
    "drop": _drop,
    "cut-entry": _cut_entry,
    "truncate": _truncate,
    "garbage": _garbage,
}


# --- 1. an entry is used only while it is whole and stands for its file ---------------------------------------


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_index_entry_is_never_believed(database, tmp_path, damage):
    """Issue 42 item 1: after two summaries were exchanged, `db show runB@step_100` returned step_500's row; one
    value edited, `db list` showed it for ever."""
    _held_to_the_row_files(database, tmp_path, DAMAGES[damage])


def test_an_entry_is_checked_against_its_file_when_the_folder_is_read_only(database, tmp_path, monkeypatch):
    """A read-only user cannot repair the index: the damaged entry is passed over, and the row file answers."""
    clean = _clean_copy(database, tmp_path / "clean")
    expected = api.show_row("acme/run@step_100", clean, summary=True)
    _swap_summaries(database / "rows")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if m & os.W_OK else real(p, m, *a, **k))
    assert api.show_row("acme/run@step_100", database, summary=True) == expected
    assert [r["revision"] for r in api.list_rows(database, fitted_only=True)] == ["step_100", "step_500"] * 2


# --- 2. ids the row files allow are ids the index takes ----------------------------------------------------------


def _odd_row(template: dict[str, Any], case: str) -> dict[str, Any]:
    if case == "id-not-utf8":  # a folder named model-\xff (surrogate escape), or --name $'\xff'
        return _row(template, os.fsdecode(b"model-\xff"), "main")
    if case == "revision-not-utf8":
        return _row(template, "acme/odd", os.fsdecode(b"step\xff"))
    if case == "lone-surrogate":  # "\ud800" in a row's JSON parses to a str no codec encodes
        return _row(template, "acme/\ud800", "main")
    return _row(template, "acme/far", "main")


@pytest.mark.parametrize("case", ["id-not-utf8", "revision-not-utf8", "lone-surrogate", "mtime-after-2262"])
def test_any_id_a_row_file_allows_is_listed_and_indexed(database, tiny_row, case):
    """Issue 42 item 2: one row whose model id is not UTF-8 made every later `db list` and `db show` exit 5
    (UnicodeEncodeError from the index's write). A file time past 2262 (beyond 64-bit nanoseconds) the same."""
    row = _odd_row(tiny_row, case)
    path = db.write_row(row, database)
    if case == "mtime-after-2262":
        os.utime(path, (33_000_000_000, 33_000_000_000))  # year 3015
    name = f"{row['model']['id']}@{row['model']['revision']}"
    for _ in range(2):  # and every later one
        listed = run_cli("db", "list", "--fitted", "--json", "--db", str(database))
        assert listed.returncode == 0, listed.stderr
        assert name in {f"{r['id']}@{r['revision']}" for r in json.loads(listed.stdout)}
        shown = run_cli("db", "show", name, "--json", "--db", str(database))
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["model"]["id"] == json.loads(json.dumps(row["model"]["id"]))
    assert _key(path.name) in _entries(database / "rows")  # indexed, not left to be read whole each time


# --- 4. a linked index is never written through ----------------------------------------------------------------


def _foreign_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as other:
        other.execute("CREATE TABLE rows (what TEXT)")
        other.execute("INSERT INTO rows VALUES ('someone else''s data')")
    other.close()


def _link_to_sqlite(rows: Path) -> None:
    target = rows.parent.parent / "elsewhere.sqlite"
    _foreign_sqlite(target)
    (rows / INDEX_NAME).unlink()
    (rows / INDEX_NAME).symlink_to(target)


def _link_to_empty(rows: Path) -> None:
    target = rows.parent.parent / "empty-file"
    target.write_bytes(b"")
    (rows / INDEX_NAME).unlink()
    (rows / INDEX_NAME).symlink_to(target)


def _hard_linked(rows: Path) -> None:
    """A snapshot by hard links (`cp -al`, rsync --link-dest) shares the index's inode; then a row arrives."""
    snapshot = rows.parent.parent / "snapshot.sqlite"
    os.link(rows / INDEX_NAME, snapshot)
    _sql(rows, "DELETE FROM rows WHERE name = ?", args=(_key(A),))  # an entry the next command writes


def _journal_linked(rows: Path) -> None:
    """SQLite's rollback journal beside the index, as a link to a file elsewhere: written through at the next write."""
    target = rows.parent.parent / "journal-target"
    target.write_bytes(b"precious" * 100)
    _sql(rows, "DELETE FROM rows WHERE name = ?", args=(_key(A),))
    (rows / f"{INDEX_NAME}-journal").symlink_to(target)


LINKS = {
    "symlink-to-sqlite": _link_to_sqlite,
    "symlink-to-empty": _link_to_empty,
    "hard-link": _hard_linked,
    "journal-symlink": _journal_linked,
}


@pytest.mark.parametrize("link", list(LINKS))
def test_a_linked_index_is_never_written_through(database, tmp_path, link):
    """Issue 42 item 4: `rows/.index.sqlite` linked to another SQLite file had that file's `rows` table dropped and
    replaced; an empty linked file became a SQLite file."""
    _held_to_the_row_files(database, tmp_path, LINKS[link])
    assert not any((database / "rows" / f"{INDEX_NAME}{end}").is_symlink() for end in ("", "-journal"))


# --- 5. an index that is a FIFO, or locked, hangs nothing ------------------------------------------------------


def _index_fifo(rows: Path) -> None:
    (rows / INDEX_NAME).unlink()
    os.mkfifo(rows / INDEX_NAME)


def _journal_fifo(rows: Path) -> None:
    _sql(rows, "DELETE FROM rows WHERE name = ?", args=(_key(A),))  # an entry the next command writes
    os.mkfifo(rows / f"{INDEX_NAME}-journal")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs: POSIX")
@pytest.mark.parametrize("fifo", ["index-fifo", "journal-fifo"])
def test_an_index_that_is_a_fifo_hangs_nothing(database, tmp_path, fifo):
    """Issue 42 item 5: an index that is a FIFO hung `db list`, `compare` and `trajectory` (real processes, so that
    a hang ends in the test's timeout)."""
    damage = {"index-fifo": _index_fifo, "journal-fifo": _journal_fifo}[fifo]
    _held_to_the_row_files(database, tmp_path, damage, real=True)


def test_an_index_that_cannot_be_removed_is_passed_over(database, tmp_path):
    """A folder in the index's place (not ours to remove): every command answers from the row files, and says
    why in one line."""
    expected = _answers(_clean_copy(database, tmp_path / "clean"))
    (database / "rows" / INDEX_NAME).unlink()
    (database / "rows" / INDEX_NAME / "inside").mkdir(parents=True)
    assert _answers(database) == expected
    out = run_cli(*COMMANDS[0], "--db", str(database))
    assert f"{INDEX_NAME}: not a regular file; left as it is: the row files answer" in out.stderr


def test_a_locked_index_makes_a_command_wait_briefly_and_say_so(database, tmp_path):
    """Issue 42 item 5: an exclusive lock held on the index made commands take 20-41 s, silently. Now one short
    wait, said on stderr, then the row files answer."""
    expected = _answers(_clean_copy(database, tmp_path / "clean"))[:1]
    holder = sqlite3.connect(database / "rows" / INDEX_NAME, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        out = run_cli(*COMMANDS[0], "--db", str(database), real=True, timeout=60)
        took = time.monotonic() - start
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert out.returncode == 0 and (out.returncode, out.stdout, "") == expected[0]
    assert took < 10, took
    assert "locked" in out.stderr and INDEX_NAME in out.stderr, out.stderr


# --- 8. compare of a copied, read-only database: each row's work done once --------------------------------------


def test_compare_of_a_read_only_copy_does_each_rows_work_once(database, tmp_path, monkeypatch):
    """Issue 42 item 8: `compare` of a copied, read-only database of 2,000 rows took 107 s: each row was compared
    with the cohort by making every cohort entry's comparison keys again (twice per entry and row), half of its
    time. Now they are made once per process, and each row is only parsed (checked when it was indexed).
    benchmarks/bench_db.py measures the 2,000 rows (<= 10 s, <= 500 MB)."""
    from weightdiag.diagnose import compare as compare_module
    from weightdiag.diagnose.cohort import load_cohort

    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(database), str(copy)], check=True)
    expected = api.compare(db_dir=database)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, m, *a, **k: False if m & os.W_OK else real(p, m, *a, **k))
    made, checked = [], []
    real_keys, real_load = compare_module._keys, db._load_bytes
    monkeypatch.setattr(compare_module, "_keys", lambda row: made.append(row["model"]["id"]) or real_keys(row))
    monkeypatch.setattr(db, "_load_bytes", lambda path, data: checked.append(path) or real_load(path, data))
    compare_module._cohort_keys.cache_clear()
    assert api.compare(db_dir=copy) == expected
    assert len(made) == len(expected) + len(load_cohort("v9_1"))  # each row's keys once, each entry's once
    assert checked == []  # parsed, not checked again


# --- 10. a journal's writer is a process that holds it ----------------------------------------------------------


def _journal(database: Path, name: str, pid: int) -> Path:
    from weightdiag.record.journal import MANIFEST, PARTIAL_DIR, RECORDS, SCHEMA, WRITER, build_identity

    folder = database / "rows" / PARTIAL_DIR / name
    folder.mkdir(parents=True)
    pidns = os.stat("/proc/self/ns/pid").st_ino if os.path.exists("/proc/self/ns/pid") else None
    document = {
        "schema": SCHEMA,
        "build": build_identity(),
        "model": {"id": "acme/gone", "source": "hub", "revision": "main"},
        WRITER: {"started": "2026-01-01T00:00:00Z", "host": platform.node(), "pidns": pidns, "pid": pid},
    }
    (folder / MANIFEST).write_text(json.dumps(document))
    (folder / RECORDS).write_text('{"name": "w", "sha256": "0"}\n')
    return folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="processes seen through /proc")
@pytest.mark.parametrize("pid", [1, 0, -1, 2**31, 2**63, 2**64, 2**70], ids=lambda p: f"pid-{p}")
def test_db_gc_all_removes_a_journal_no_process_writes(tmp_path, pid):
    """Issue 42 item 10: `db gc --all` never removed a journal whose writer pid was 1 (init lives for ever) or
    >= 2^64 (taken for another user's process). A journal is being written only by a process that holds it open."""
    database = tmp_path / "db"
    (database / "rows").mkdir(parents=True)
    folder = _journal(database, "acme--gone@main.json", pid)
    (listed,) = json.loads(run_cli("db", "journals", "--db", str(database), "--json").stdout)
    assert listed["state"] == "interrupted", listed
    assert run_cli("db", "gc", "--all", "--db", str(database)).returncode == 0
    assert not folder.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="processes seen through /proc")
def test_db_gc_all_keeps_the_journal_its_live_writer_holds(tmp_path):
    from weightdiag.record.journal import RECORDS

    database = tmp_path / "db"
    (database / "rows").mkdir(parents=True)
    folder = _journal(database, "acme--live@main.json", 0)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys, time\nf = open({str(folder / RECORDS)!r}, 'a')\nprint(1, flush=True)\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline()
        document = json.loads((folder / "manifest.json").read_text())
        document["writer"]["pid"] = writer.pid
        (folder / "manifest.json").write_text(json.dumps(document))
        (listed,) = json.loads(run_cli("db", "journals", "--db", str(database), "--json").stdout)
        assert listed["state"] == "running" and str(writer.pid) in listed["why"]
        assert run_cli("db", "gc", "--all", "--db", str(database)).returncode == 0
        assert folder.exists()
    finally:
        writer.communicate(b"")


# --- 16. what a checkout writes into DATABASE/ is ignored by git --------------------------------------------------


def test_the_diffs_a_checkout_writes_are_ignored_by_git():
    """Issue 42 item 16: DATABASE/diffs/ was untracked after a diff in a checkout (.gitignore had rows/ only)."""
    from weightdiag.database.diffs import DIFFS_DIR

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    for written in (f"DATABASE/{db.ROWS_DIR}/a@main.json", f"DATABASE/{DIFFS_DIR}/a..b-0123abcd.json"):
        check = subprocess.run(["git", "check-ignore", "-q", written], cwd=root, check=False)
        assert check.returncode == 0, f"{written} is not ignored"

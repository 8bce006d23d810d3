"""Issue 12, the row contract: typed rows with one validating loader (weightdiag.record.schema), and a database
that skips a foreign or damaged row in listings, refuses it by name (exit 2), never hangs on a FIFO, and
finds every id that `db list` prints."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from typer.testing import CliRunner

from weightdiag import cli as weightdiag_cli
from weightdiag.cli import main
from weightdiag.database import store as db
from weightdiag.database.index import RowIndex
from weightdiag.errors import BadInputError, ExitCode
from weightdiag.record import schema as records
from weightdiag.record.schema import RowError
from weightdiag.testing import synthetic

REPO = Path(__file__).resolve().parents[1]
TINY = synthetic.ModelSpec(n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=256)


class Outcome(NamedTuple):
    code: int
    stdout: str
    stderr: str


def cli(*args: str) -> Outcome:
    """The console entry point in process (typer's CliRunner isolation): exit code, stdout, stderr."""
    with CliRunner().isolation() as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            weightdiag_cli._console.cache_clear()  # consoles bound to the isolation's streams: not for later tests
        sys.stdout.flush()  # the isolation's text streams buffer what sys.stdout.write() was given
        sys.stderr.flush()
        return Outcome(code, out.getvalue().decode(), err.getvalue().decode())


def cli_subprocess(*args: str, timeout: float = 120, columns: str = "160") -> subprocess.CompletedProcess[str]:
    """The real command in a subprocess, killed after `timeout` (a hang fails the test instead of the suite)."""
    return subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "weightdiag", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": columns},
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def fitted_row(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A row written by today's `fit` (a tiny synthetic Llama)."""
    model = synthetic.write_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", TINY)
    dbdir = tmp_path_factory.mktemp("db")
    out = cli("fit", str(model), "--db", str(dbdir), "-q", "--device", "cpu")
    assert out.code == 0, out.stderr
    (path,) = (dbdir / "rows").glob("*.json")
    return json.loads(path.read_text())


def put(dbdir: Path, name: str, doc: Any) -> Path:
    rows = dbdir / "rows"
    rows.mkdir(parents=True, exist_ok=True)
    path = rows / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def variant(row: dict[str, Any], model_id: str, created: str | None = None, **model: Any) -> dict[str, Any]:
    """A copy of `row` for another model id (and revision, fingerprint...), created at `created` if given."""
    out = copy.deepcopy(row)
    out["model"].update(id=model_id, **model)
    if created is not None:
        out["created"] = created
    return out


# --- the loader ---------------------------------------------------------------------------------------


def test_every_shipped_and_example_row_loads():
    from weightdiag.diagnose.cohort import COHORTS, load_cohort

    cohort = [row for name in COHORTS for row in load_cohort(name)]
    assert len(cohort) == 23
    for row in cohort:
        assert records.load_row(row, "cohort") is row  # returned as given: nothing filled in
    # What the repository ships (baselines, the cohort); not what the demo or a user wrote into DATABASE/rows
    # and DATABASE/diffs (git-ignored), whose rows/.summary/ holds listing summaries, not rows.
    examples = [
        path
        for path in sorted((REPO / "DATABASE").glob("**/*.json"))
        if path.relative_to(REPO / "DATABASE").parts[0] not in ("rows", "diffs")
    ]
    assert examples
    for path in examples:
        assert records.read_row(path)["schema"] == records.SCHEMA


def test_a_row_written_today_loads_unchanged(fitted_row):
    before = copy.deepcopy(fitted_row)
    row = records.load_row(fitted_row, "today.json")
    assert row == before
    assert row["matrices"]
    assert row["vectors"]
    assert row["matrices"][0]["fits"]["mid80"]["ok"] is True


def test_a_row_in_the_shape_of_the_first_version_still_loads(fitted_row):
    # What the first weightdiag wrote: no files[].verified, run.verification, stats.distinct_values,
    # hyperparameters null, no duplicate_of; fields of a later version are simply absent.
    old = copy.deepcopy(fitted_row)
    for f in old["files"]:
        f.pop("verified", None)
    old["run"].pop("verification", None)
    old["hyperparameters"] = None
    for m in old["matrices"]:
        m["stats"].pop("distinct_values", None)
    assert records.load_row(old, "old.json") is old


def test_unknown_fields_are_kept(fitted_row):
    row = {**copy.deepcopy(fitted_row), "added_in_a_later_version": {"x": 1}}
    row["matrices"][0]["also_new"] = [1, 2]
    assert records.load_row(row)["added_in_a_later_version"] == {"x": 1}


Damage = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Damage:
    def damage(row: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = row
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value

    return damage


DAMAGES: list[tuple[str, Damage, str, str]] = [
    ("no model.source", _set("model.source", KeyError), "model.source", "is missing"),
    ("model.id a number", _set("model.id", 3), "model.id", "is an integer, expected a string"),
    ("model a string", _set("model", "m"), "model", "is a string, expected an object"),
    ("no protocol", _set("protocol", KeyError), "protocol", "is missing"),
    ("no protocol.trim", _set("protocol.trim", KeyError), "protocol.trim", "is missing"),
    ("kinds a list", _set("kinds", []), "kinds", "is a list, expected an object"),
    ("k_median a string", _set("kinds.q.k_median", "1.2"), "kinds.q.k_median", "expected a number or null"),
    ("flags not strings", _set("kinds.q.flags", [1]), "kinds.q.flags[0]", "expected a string"),
    ("matrices an object", _set("matrices", {}), "matrices", "expected a list"),
    ("matrix without fits", _set("matrices.0.fits", KeyError), "matrices[0].fits", "is missing"),
    ("fit ok a string", _set("matrices.0.fits.mid80.ok", "yes"), "matrices[0].fits.mid80.ok", "expected true or false"),
    ("lambda a bool", _set("matrices.1.fits.full.lambda", True), "matrices[1].fits.full.lambda", "true or false"),
    ("stats missing std", _set("matrices.0.stats.std", KeyError), "matrices[0].stats.std", "is missing"),
    ("vector without name", _set("vectors.0.name", KeyError), "vectors[0].name", "is missing"),
    ("no vectors", _set("vectors", KeyError), "vectors", "is missing"),
    ("run a list", _set("run", []), "run", "expected an object or null"),
    ("created a number", _set("created", 2026), "created", "expected a string or null"),
]


@pytest.mark.parametrize(("damage", "field", "problem"), [d[1:] for d in DAMAGES], ids=[d[0] for d in DAMAGES])
def test_each_kind_of_damage_is_a_row_error_naming_the_file_and_field(fitted_row, damage, field, problem):
    row = copy.deepcopy(fitted_row)
    damage(row)
    with pytest.raises(RowError) as info:
        records.load_row(row, "rows/broken.json")
    err = info.value
    assert isinstance(err, BadInputError)
    assert err.exit_code == ExitCode.BAD_INPUT
    assert err.file == "rows/broken.json"
    assert err.field == field
    assert problem in err.problem
    assert str(err).startswith(f"rows/broken.json: damaged weightdiag row: field '{field}' ")
    assert "\n" not in str(err)


def test_a_row_error_keeps_the_model_id_when_it_could_be_read(fitted_row):
    row = copy.deepcopy(fitted_row)
    del row["model"]["source"]
    with pytest.raises(RowError) as info:
        records.load_row(row)
    assert info.value.model_id == fitted_row["model"]["id"]
    assert info.value.file is None


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([1, 2], "not a weightdiag row"),
        ({"model": {"id": "m"}}, "not a weightdiag row"),
        ({"schema": "other/1"}, "not a weightdiag row"),
        ({"schema": "weightdiag.row/3"}, "schema weightdiag.row/3 is not weightdiag.row/1 or weightdiag.row/2"),
    ],
)
def test_foreign_documents_are_row_errors(doc, words):
    with pytest.raises(RowError) as info:
        records.load_row(doc, "x.json")
    assert words in str(info.value)
    assert info.value.field is None


def test_a_cohort_row_must_name_its_cohort():
    from weightdiag.diagnose.cohort import load_cohort

    row = copy.deepcopy(load_cohort("v9_1")[0])
    del row["model"]["cohort"]
    with pytest.raises(RowError) as info:
        records.load_row(row)
    assert info.value.field == "model.cohort"


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: p.write_text("{not json"), "cannot read a row (JSONDecodeError)"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "cannot read a row (UnicodeDecodeError)"),
        (lambda p: p.write_text(""), "cannot read a row (JSONDecodeError)"),
        (lambda p: p.mkdir(), "is a folder, not a row file"),
        (lambda p: p.symlink_to(p.parent / "nowhere"), "cannot read a row (No such file or directory)"),
    ],
    ids=["bad-json", "not-utf8", "empty", "folder", "dangling-link"],
)
def test_unreadable_files_are_row_errors_naming_the_file(tmp_path, make, words):
    path = tmp_path / "x.json"
    make(path)
    with pytest.raises(RowError) as info:
        records.read_row(path)
    assert str(info.value).startswith(f"{path}: ")
    assert words in str(info.value)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """rows/x.json as a FIFO; released at the end so that a reader stuck on it (a regression) ends."""
    (tmp_path / "rows").mkdir()
    path = tmp_path / "rows" / "x.json"
    os.mkfifo(path)
    yield path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # succeeds only when a reader is blocked in open()
    except OSError:
        return
    os.close(fd)


def test_read_row_refuses_a_fifo_without_opening_it_for_a_blocking_read(fifo):
    failure: list[BaseException] = []

    def read() -> None:
        try:
            records.read_row(fifo)
        except BaseException as exc:
            failure.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "read_row blocked on a FIFO"
    assert len(failure) == 1
    assert isinstance(failure[0], RowError)
    assert "is a FIFO (named pipe), not a row file" in str(failure[0])


# --- the database -------------------------------------------------------------------------------------


@pytest.fixture
def damaged_db(tmp_path: Path, fitted_row: dict[str, Any]) -> Path:
    dbdir = tmp_path / "db"
    put(dbdir, "good.json", variant(fitted_row, "team/good", revision="main"))
    no_source = variant(fitted_row, "team/no-source")
    del no_source["model"]["source"]
    put(dbdir, "no-source.json", no_source)
    put(dbdir, "foreign.json", {"name": "not a row"})
    put(dbdir, "broken.json", '{"schema": "weightdiag.row/1", "model": ')
    return dbdir


def test_iter_rows_skips_damaged_rows_and_reports_each(damaged_db):
    skipped: list[RowError] = []
    found = [row["model"]["id"] for _, row in db.iter_rows(damaged_db, on_skip=skipped.append)]
    assert found == ["team/good"]
    assert sorted(Path(str(e.file)).name for e in skipped) == ["broken.json", "foreign.json", "no-source.json"]
    assert [row["model"]["id"] for _, row in db.iter_rows(damaged_db)] == ["team/good"]  # silent by default


def test_db_list_skips_damaged_rows_with_one_warning_line_each(damaged_db):
    out = cli("db", "list", "--db", str(damaged_db))
    assert out.code == 0, out.stderr
    assert "team/good" in out.stdout
    assert "no-source" not in out.stdout
    warnings = out.stderr.splitlines()
    assert len(warnings) == 3, out.stderr
    assert all(line.startswith("warning: ") for line in warnings)
    assert all("skipped" in line for line in warnings)
    (no_source,) = [line for line in warnings if "no-source.json" in line]
    assert "'model.source' is missing" in no_source
    assert "Traceback" not in out.stderr


def test_db_list_json_and_export_skip_them_too(damaged_db):
    listed = cli("db", "list", "--fitted", "--json", "--db", str(damaged_db))
    assert listed.code == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == ["team/good"]
    exported = cli("db", "export", "--fitted", "--format", "jsonl", "--db", str(damaged_db))
    assert exported.code == 0, exported.stderr
    assert [json.loads(line)["id"] for line in exported.stdout.splitlines()] == ["team/good"]
    assert len(exported.stderr.splitlines()) == 3
    csv_out = cli("db", "export", "--db", str(damaged_db))
    assert csv_out.code == 0, csv_out.stderr
    assert csv_out.stdout.count("\n") == 1 + 23 + 1  # header, the cohorts, the good row


@pytest.mark.parametrize("how", ["id", "file name", "path"])
def test_db_show_refuses_a_damaged_row_it_is_named_by_with_exit_2(damaged_db, how):
    spec = {
        "id": "team/no-source",
        "file name": "no-source.json",
        "path": str(damaged_db / "rows" / "no-source.json"),
    }[how]
    out = cli("db", "show", spec, "--db", str(damaged_db))
    assert out.code == ExitCode.BAD_INPUT
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: ")
    assert "no-source.json: damaged weightdiag row: field 'model.source' is missing" in line


@pytest.mark.parametrize("name", ["foreign.json", "broken.json"])
def test_db_show_refuses_foreign_and_unparsable_files_by_name(damaged_db, name):
    out = cli("db", "show", name, "--db", str(damaged_db))
    assert out.code == ExitCode.BAD_INPUT
    assert len(out.stderr.splitlines()) == 1
    assert name in out.stderr


@pytest.mark.e2e
def test_a_fifo_named_json_does_not_hang_db_list_or_db_show(fifo, fitted_row):
    dbdir = fifo.parent.parent
    put(dbdir, "good.json", variant(fitted_row, "team/good"))
    listing = cli_subprocess("db", "list", "--fitted", "--db", str(dbdir))
    assert listing.returncode == 0, listing.stderr
    assert "team/good" in listing.stdout
    (warning,) = listing.stderr.splitlines()
    assert "x.json" in warning
    assert "FIFO" in warning
    shown = cli_subprocess("db", "show", "x.json", "--db", str(dbdir))
    assert shown.returncode == ExitCode.BAD_INPUT
    assert "FIFO" in shown.stderr
    assert len(shown.stderr.splitlines()) == 1


# --- naming rows ----------------------------------------------------------------------------------------


def shown_id(*args: str) -> str:
    out = cli("db", "show", *args, "--json")
    assert out.code == 0, out.stderr
    return json.loads(out.stdout)["model"]["id"]


def test_every_id_db_list_prints_is_found_by_db_show(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    put(dbdir, "a.json", variant(fitted_row, "EleutherAI/pythia-70m", revision="step1000"))
    put(dbdir, "b.json", variant(fitted_row, "run-a/checkpoint-1000", revision=None, fingerprint="local-123"))
    listed = cli("db", "list", "--json", "--db", str(dbdir))
    assert listed.code == 0, listed.stderr
    entries = json.loads(listed.stdout)
    assert len(entries) == 25
    for entry in entries:
        assert shown_id(entry["id"], "--db", str(dbdir)) == entry["id"]


def test_cohort_and_companion_ids_that_differ_in_case_are_each_found_exactly():
    assert shown_id("Qwen3-8B") == "Qwen3-8B"  # the companion's (source: DATABASE_v9_1_qwen_cohort)
    assert shown_id("qwen3-8b") == "qwen3-8b"  # DATABASE_v9_1's
    companion = json.loads(cli("db", "show", "Qwen3-8B", "--json").stdout)
    assert companion["model"]["cohort"] == "DATABASE_v9_1_qwen_cohort"


def test_an_id_in_another_case_is_found_when_it_names_one_entry():
    assert shown_id("PYTHIA-70M") == "pythia-70m"
    assert shown_id("qwen2-7b") == "Qwen2-7B"


def test_an_id_in_another_case_that_names_several_entries_is_refused_listing_them():
    out = cli("db", "show", "QWEN3-8B")
    assert out.code == ExitCode.BAD_INPUT
    (line,) = out.stderr.splitlines()
    assert line == "error: QWEN3-8B: matches 2 rows when case is ignored: Qwen3-8B, qwen3-8b; give one of them exactly"
    with pytest.raises(db.AmbiguousRowError) as info:
        db.row_by_id("QWEN2.5-7B")
    assert info.value.candidates == ["Qwen2.5-7B", "qwen2.5-7b"]


def test_cohort_entry_applies_the_same_rule_to_the_cohorts_alone():
    for spec, model_id in [("Qwen3-8B", "Qwen3-8B"), ("qwen3-8b", "qwen3-8b"), ("Pythia-70M", "pythia-70m")]:
        row = db.cohort_entry(spec)
        assert row is not None, spec
        assert row["model"]["id"] == model_id
    assert db.cohort_entry("EleutherAI/pythia-70m") is None
    with pytest.raises(db.AmbiguousRowError):
        db.cohort_entry("QWEN3-8B")


def test_an_id_of_several_revisions_names_mains_row_else_asks_for_one(tmp_path, fitted_row):
    """Issue 33: `db show RUN` picked one of 15 revisions silently (the newest). A bare id names main's row (the
    Hub's default branch, what the id alone means); with no main row, one line lists a few revisions, exit 2."""
    dbdir = tmp_path / "db"
    for n, step in enumerate((0, 20, 100, 1000, 3000, 143000)):
        rev = f"step{step}"
        put(dbdir, f"{rev}.json", variant(fitted_row, "Org/run", revision=rev, created=f"2026-01-0{n + 1}T00:00:00Z"))
    with pytest.raises(db.AmbiguousRowError) as info:
        db.row_by_id("Org/run", dbdir)
    assert info.value.candidates == sorted(f"Org/run@step{s}" for s in (0, 20, 100, 1000, 3000, 143000))
    out = cli("db", "show", "Org/run", "--db", str(dbdir))
    assert out.code == ExitCode.BAD_INPUT and out.stdout == ""
    assert out.stderr.splitlines() == [
        "error: Org/run: 6 revisions in the database and none named: name one, e.g. Org/run@step0, Org/run@step20, "
        "Org/run@step100, ..., Org/run@step143000 (`weightdiag db list` shows them all)"
    ]
    assert db.row_by_id("Org/run@step100", dbdir)["model"]["revision"] == "step100"
    assert db.row_by_id("org/RUN@step20", dbdir)["model"]["revision"] == "step20"  # one name ignoring case
    with pytest.raises(db.AmbiguousRowError):
        db.row_by_id("org/RUN", dbdir)  # ignoring case, no revision: asks as well
    put(dbdir, "main.json", variant(fitted_row, "Org/run", revision="main", created="2025-01-01T00:00:00Z"))
    assert db.row_by_id("Org/run", dbdir)["model"]["revision"] == "main"  # the oldest row, but main's
    assert db.row_by_id("org/run", dbdir)["model"]["revision"] == "main"
    put(dbdir, "one.json", variant(fitted_row, "Org/one", revision="step5"))
    assert db.row_by_id("Org/one", dbdir)["model"]["revision"] == "step5"  # one revision: no question


def test_a_local_sweep_named_by_id_asks_for_a_revision_in_compare_and_report(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    for step in (0, 100):
        row = variant(fitted_row, "my-run", revision=f"step_{step}", source="local")
        put(dbdir, db.row_filename(row), row)  # named as a fit names it: compare looks for it by that name
    for command in ("compare", "report"):
        out = cli(command, "my-run", "--db", str(dbdir), "-q")
        assert out.code == ExitCode.BAD_INPUT, (command, out.stderr)
        assert "my-run: 2 revisions in the database and none named: name one, e.g. my-run@step_0, my-run@step_100" in (
            out.stderr
        )
        assert cli(command, "my-run@step_100", "--db", str(dbdir), "-q").code == 0


def test_offline_a_hub_id_without_revision_is_answered_by_mains_row_only(tmp_path, fitted_row, monkeypatch):
    """Issue 33: with the Hub unreachable `compare ORG/NAME -q` used the newest row (@step2000), not main's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # nothing cached: the database answers, or nothing
    dbdir = tmp_path / "db"
    for n, rev in enumerate(("step1000", "step2000")):
        row = variant(fitted_row, "Org/net", revision=rev, source="hub", created=f"2026-01-0{n + 1}T00:00:00Z")
        put(dbdir, db.row_filename(row), row)
    out = cli("compare", "Org/net", "--db", str(dbdir), "-q", "--json")
    assert out.code == ExitCode.BAD_INPUT and out.stdout == ""
    assert out.stderr.splitlines() == [
        "error: Org/net: the Hub is unreachable and the database holds no row of main, only of 2 other revisions: "
        "name one, e.g. Org/net@step1000, Org/net@step2000 (`weightdiag db list` shows them all)"
    ]
    out = cli("compare", "Org/net@step1000", "--db", str(dbdir), "-q", "--json")
    assert out.code == 0, out.stderr  # a revision named: its row
    main = variant(fitted_row, "Org/net", revision="main", source="hub", created="2025-06-01T00:00:00Z")
    put(dbdir, db.row_filename(main), main)
    out = cli("compare", "Org/net", "--db", str(dbdir), "--json")
    assert out.code == 0, out.stderr
    assert "Org/net: the Hub is unreachable; its row of main in the database is used" in out.stderr


def test_fitted_ids_exact_then_ignoring_case(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    put(dbdir, "a.json", variant(fitted_row, "Org/Model", revision="main", created="2026-01-01T00:00:00Z"))
    put(dbdir, "b.json", variant(fitted_row, "Org/Model", revision="v2", created="2026-02-01T00:00:00Z"))
    put(dbdir, "c.json", variant(fitted_row, "org/model", revision="main", created="2026-03-01T00:00:00Z"))
    assert db.row_by_id("Org/Model", dbdir)["model"]["revision"] == "main"  # exact id: main's, not the newest
    assert db.row_by_id("Org/Model@main", dbdir)["created"] == "2026-01-01T00:00:00Z"
    assert db.row_by_id("org/model", dbdir)["created"] == "2026-03-01T00:00:00Z"
    assert db.row_by_id("ORG/MODEL@V2", dbdir)["model"]["revision"] == "v2"  # one name ignoring case
    with pytest.raises(db.AmbiguousRowError) as info:
        db.row_by_id("ORG/MODEL", dbdir)
    assert info.value.candidates == ["Org/Model", "org/model"]
    with pytest.raises(db.RowNotFoundError):
        db.row_by_id("org/other", dbdir)


def test_a_local_row_is_found_by_id_at_fingerprint(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    put(dbdir, "a.json", variant(fitted_row, "run/ckpt", revision=None, fingerprint="local-aaa"))
    put(dbdir, "b.json", variant(fitted_row, "run/ckpt", revision=None, fingerprint="local-bbb", created="0"))
    assert db.row_by_id("run/ckpt@local-bbb", dbdir)["model"]["fingerprint"] == "local-bbb"


def test_a_fitted_row_sharing_a_cohort_id_is_found_by_revision_or_file_name(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    path = db.write_row(variant(fitted_row, "pythia-70m", revision="step1"), dbdir)
    assert db.row_by_id("pythia-70m", dbdir)["model"]["source"] == "cohort"  # the shipped entry first
    assert db.row_by_id("pythia-70m@step1", dbdir)["model"]["revision"] == "step1"
    assert db.row_by_id(path.name, dbdir)["model"]["revision"] == "step1"


def test_db_show_takes_a_row_file_name_or_path(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    path = db.write_row(variant(fitted_row, "team/llama", revision="main"), dbdir)
    assert path.name == "team--llama@main.json"
    assert shown_id(path.name, "--db", str(dbdir)) == "team/llama"
    assert shown_id(str(path), "--db", str(dbdir)) == "team/llama"
    table = cli("db", "show", path.name, "--db", str(dbdir))
    assert table.code == 0, table.stderr
    assert "team/llama@main" in table.stdout


def test_an_unknown_name_is_exit_2_with_one_line():
    out = cli("db", "show", "no-such-model")
    assert out.code == ExitCode.BAD_INPUT
    (line,) = out.stderr.splitlines()
    # the folder searched and how to point elsewhere: rows "vanish" when run from another directory
    assert line.startswith("error: no-such-model: no such row in /") and "DATABASE (not a row file" in line
    assert line.endswith("see `weightdiag db list`, or pass the database that holds it with --db (or WEIGHTDIAG_DB)")


# --- the listing ----------------------------------------------------------------------------------------


def test_db_list_has_no_none_cells_and_whole_ids(tmp_path, fitted_row):
    dbdir = tmp_path / "db"
    bare = variant(fitted_row, "an-organisation-with-a-long-name/a-model-with-a-long-name-too", revision=None)
    bare.update(created=None, architecture=None, hyperparameters=None, kinds={}, part_kinds={})
    put(dbdir, "bare.json", bare)
    out = cli("db", "list", "--db", str(dbdir))
    assert out.code == 0, out.stderr
    assert "None" not in out.stdout
    assert out.stderr == ""
    ids = [entry["id"] for entry in json.loads(cli("db", "list", "--json", "--db", str(dbdir)).stdout)]
    assert "an-organisation-with-a-long-name/a-model-with-a-long-name-too" in ids
    for columns in ("80", "60", "160"):  # the width of a terminal or COLUMNS: ids fold nowhere
        shown = cli_subprocess("db", "list", "--db", str(dbdir), columns=columns)
        assert shown.returncode == 0, shown.stderr
        cells = {cell for line in shown.stdout.splitlines() for cell in line.replace("│", " ").split()}
        for model_id in ids:  # whole, never cut with '…' nor folded, so that it can be copied into `db show`
            assert model_id in cells, (columns, model_id, shown.stdout)


def test_db_show_of_a_cohort_entry_credits_the_paper():
    out = cli("db", "show", "pythia-70m")
    assert out.code == 0, out.stderr
    assert "CC BY 4.0" in out.stdout


def test_local_rows_are_named_as_listed_and_taken_by_compare_and_report(tmp_path):
    """`db list` shows a local row's fingerprint as its revision; `compare ID` reads that row (no Hub);
    two different checkpoints in folders of the same name make the bare id ambiguous (exit 2)."""
    import shutil

    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    db_dir = tmp_path / "db"
    spec = synthetic.ModelSpec(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=128, seed=1)
    first = synthetic.write_model(tmp_path / "a" / "ckpt", spec)
    fitted = api.fit(str(first), FitOptions(device="cpu"), db_dir=db_dir).row
    [listed] = api.list_rows(db_dir, fitted_only=True)
    assert listed["id"] == "ckpt"
    assert listed["revision"] == fitted["model"]["fingerprint"]
    assert api.compare(["ckpt"], db_dir=db_dir)[0]["model"] == "ckpt"  # the row, not a Hub id
    assert api.report("ckpt", db_dir=db_dir).how == "database"
    other = tmp_path / "b" / "ckpt"
    shutil.copytree(first, other)
    spec2 = synthetic.ModelSpec(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=128, seed=2)
    synthetic.write_model(other, spec2)
    api.fit(str(other), FitOptions(device="cpu"), db_dir=db_dir)
    with pytest.raises(db.AmbiguousRowError, match="different checkpoints"):
        api.show_row("ckpt", db_dir)
    with pytest.raises(db.AmbiguousRowError):
        api.compare(["ckpt"], db_dir=db_dir)
    named = f"ckpt@{fitted['model']['fingerprint']}"
    assert api.show_row(named, db_dir)["model"]["fingerprint"] == fitted["model"]["fingerprint"]


def test_a_db_that_is_a_file_is_refused_not_read_as_empty(tmp_path):
    afile = tmp_path / "dbfile"
    afile.write_text("not a database")
    from weightdiag import api
    from weightdiag.errors import DatabaseError

    with pytest.raises(DatabaseError, match="is a file, not a folder"):
        api.list_rows(afile)
    with pytest.raises(DatabaseError, match=str(tmp_path / "empty")):
        api.compare([], db_dir=tmp_path / "empty")  # the message names the folder it looked in


def test_r2_below_95_is_a_number_and_old_rows_holding_text_still_read(tmp_path, fitted_row):
    """Issue 33: `r2_below_95` was the text "a/b" (DATABASE_v9_1.csv's form, copied into every row): a number now,
    how many of the kind's `fitted` fits have R² < 0.95; rows and summaries written before read as that number."""
    kinds = fitted_row["kinds"]
    assert all(type(s["r2_below_95"]) is int and 0 <= s["r2_below_95"] <= s["fitted"] for s in kinds.values())
    for row in db.cohort_rows():
        assert all(s["r2_below_95"] is None or type(s["r2_below_95"]) is int for s in row["kinds"].values())
    pythia = db.cohort_entry("pythia-160m")
    assert pythia is not None and pythia["kinds"]["qkv"]["r2_below_95"] == 0 and pythia["kinds"]["qkv"]["fitted"] == 12
    old = copy.deepcopy(fitted_row)
    for s in old["kinds"].values():
        s["r2_below_95"] = f"{s['r2_below_95']}/{s['fitted']}"  # as rows were written before
    old["kinds"]["q"]["r2_below_95"] = "1/" + str(old["kinds"]["q"]["fitted"])
    dbdir = tmp_path / "db"
    path = put(dbdir, db.row_filename(old), old)
    row = db.read_row(path)
    assert row["kinds"]["q"]["r2_below_95"] == 1
    assert all(type(s["r2_below_95"]) is int for s in row["kinds"].values())
    listed = cli("db", "show", str(path))
    assert listed.code == 0, listed.stderr
    assert re.search(rf"│ q +│ .* │ +1/{old['kinds']['q']['fitted']} │", listed.stdout), listed.stdout
    shown = json.loads(cli("db", "show", "tiny-llama", "--db", str(dbdir), "--json").stdout)
    assert shown["kinds"]["q"]["r2_below_95"] == 1
    out = cli("db", "list", "--db", str(dbdir), "--fitted", "--json")  # through the summary, made from the row
    assert out.code == 0
    index = RowIndex.open(dbdir / "rows")
    assert index is not None
    summary = json.loads(index.summary(path.name) or "null")
    index.close()
    assert summary["row"]["kinds"]["q"]["r2_below_95"] == 1


def test_db_list_orders_revisions_by_their_numbers(tmp_path, fitted_row):
    """Issue 33: revisions were sorted as text, step100 before step20."""
    dbdir = tmp_path / "db"
    for step in (1000, 20, 0, 100, 3):
        row = variant(fitted_row, "Org/run", revision=f"step{step}")
        put(dbdir, db.row_filename(row), row)
    other = variant(fitted_row, "Org/another", revision="main")
    put(dbdir, db.row_filename(other), other)
    out = cli("db", "list", "--db", str(dbdir), "--fitted", "--json")
    listed = [(r["id"], r["revision"]) for r in json.loads(out.stdout)]
    assert listed == [("Org/another", "main")] + [("Org/run", f"step{s}") for s in (0, 3, 20, 100, 1000)]
    table = cli("db", "list", "--db", str(dbdir), "--fitted").stdout
    assert [table.index(f"step{s} ") for s in (0, 3, 20, 100, 1000)] == sorted(
        table.index(f"step{s} ") for s in (0, 3, 20, 100, 1000)
    )
    assert db.natural_key("step20") < db.natural_key("step100") < db.natural_key("step_5")


def test_report_check_and_compare_take_revision_as_fit_does(tmp_path, fitted_row, monkeypatch):
    """Issue 33: `report/check --revision` were "No such option" (fit had it): MODEL --revision REV is MODEL@REV."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    dbdir = tmp_path / "db"
    for step in (0, 100):
        row = variant(fitted_row, "my-run", revision=f"step_{step}", source="local")
        put(dbdir, db.row_filename(row), row)
    baseline = put(tmp_path / "base", "base.json", variant(fitted_row, "my-run", revision="step_100", source="local"))
    for command in (("report",), ("compare",), ("check", "--baseline", str(baseline))):
        named = cli(*command, "my-run", "--revision", "step_100", "--db", str(dbdir), "-q", "--json")
        assert named.code == 0, (command, named.stderr)
        assert named.stdout == cli(*command, "my-run@step_100", "--db", str(dbdir), "-q", "--json").stdout
        same = cli(*command, "my-run@step_100", "--revision", "step_100", "--db", str(dbdir), "-q", "--json")
        assert same.code == 0, (command, same.stderr)
        two = cli(*command, "my-run@step_0", "--revision", "step_100", "--db", str(dbdir), "-q")
        assert two.code == ExitCode.BAD_INPUT
        assert two.stderr == "error: --revision step_100 and my-run@step_0 name two revisions; give one of them\n"
        local = cli(*command, str(baseline), "--revision", "step_100", "--db", str(dbdir), "-q")
        assert local.code == ExitCode.BAD_INPUT and "--revision applies to a Hub id or a fitted model's id" in (
            local.stderr
        )
    report = json.loads(cli("report", "my-run", "--revision", "step_0", "--db", str(dbdir), "-q", "--json").stdout)
    assert report["model"]["revision"] == "step_0"
    several = cli("compare", "my-run", "pythia-70m", "--revision", "step_0", "--db", str(dbdir), "-q")
    assert several.code == ExitCode.BAD_INPUT and "for several, give each as ORG/NAME@REV" in several.stderr

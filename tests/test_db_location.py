"""Where the database is when --db is not given (issue 21: rows that vanished from another folder).

$WEIGHTDIAG_DB, else the nearest DATABASE folder in the current folder or above it, else the per-user data folder
($XDG_DATA_HOME/weightdiag, ~/.local/share/weightdiag): never a folder made from the current one alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from weightdiag import settings

from .conftest import run_cli, write_safetensors


@pytest.fixture
def away(tmp_path, monkeypatch):
    """A home folder and a working folder with no DATABASE anywhere above them."""
    home = tmp_path / "home"
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    home.mkdir()
    monkeypatch.delenv("WEIGHTDIAG_DB", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert not any((p / "DATABASE").exists() for p in [work, *work.parents])
    return home, work


def test_the_rules_in_order(away, monkeypatch):
    home, work = away
    assert settings.db_location() == (str(home / ".local" / "share" / "weightdiag"), settings.db_location()[1])
    assert "per-user" in settings.db_location()[1]
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")  # invalid by the XDG spec: ignored
    assert settings.db_dir() == str(home / ".local" / "share" / "weightdiag")
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "xdg"))
    assert settings.db_dir() == str(home / "xdg" / "weightdiag")
    (work.parent / "DATABASE").mkdir()  # a project's database, found from its subfolders
    assert settings.db_location() == (str(work.parent / "DATABASE"), settings.db_location()[1])
    assert "above" in settings.db_location()[1]
    (work / "DATABASE").mkdir()  # the nearest wins
    assert settings.db_location()[0] == "DATABASE"
    monkeypatch.setenv("WEIGHTDIAG_DB", str(home / "mine"))
    assert settings.db_location() == (str(home / "mine"), "from $WEIGHTDIAG_DB")


def _model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    write_safetensors(folder / "model.safetensors", {"layers.0.mlp.up.weight": ("F32", rng.normal(size=(64, 64)))})
    return folder


def test_rows_written_from_one_folder_are_found_from_another(away, tmp_path):
    home, work = away
    model = _model(tmp_path / "tiny-model")
    fitted = run_cli("fit", str(model), "-q", cwd=work)
    assert fitted.returncode == 0, fitted.stderr
    user_db = home / ".local" / "share" / "weightdiag"
    assert list((user_db / "rows").glob("tiny-model@*.json"))
    assert not (work / "DATABASE").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = run_cli("db", "show", "tiny-model", cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    listed = run_cli("db", "list", "--fitted", "--json", cwd=elsewhere)
    assert [r["id"] for r in json.loads(listed.stdout)] == ["tiny-model"]
    # --db still wins, and a project folder's DATABASE is found from below it
    (tmp_path / "project" / "DATABASE").mkdir(parents=True)
    (tmp_path / "project" / "src").mkdir()
    run_cli("fit", str(model), "-q", cwd=tmp_path / "project" / "src")
    assert list((tmp_path / "project" / "DATABASE" / "rows").glob("tiny-model@*.json"))
    run_cli("fit", str(model), "-q", "--db", str(tmp_path / "chosen"), cwd=tmp_path / "project" / "src")
    assert list((tmp_path / "chosen" / "rows").glob("tiny-model@*.json"))


def test_env_says_which_folder_and_why(away, tmp_path):
    home, work = away
    out = run_cli("env", "--json", cwd=work)
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["database_folder"] == str(home / ".local" / "share" / "weightdiag")
    assert document["database_folder_chosen"].startswith("the per-user data folder")
    (work.parent / "DATABASE").mkdir()
    document = json.loads(run_cli("env", "--json", cwd=work).stdout)
    assert document["database_folder"] == str(work.parent / "DATABASE")
    assert "nearest DATABASE folder above" in document["database_folder_chosen"]
    text = run_cli("env", cwd=work, env={"WEIGHTDIAG_DB": str(tmp_path / "x")}).stdout
    assert f"- Database folder: {tmp_path / 'x'}\n- Database folder chosen: from $WEIGHTDIAG_DB" in text


def test_db_list_says_where_it_looked_when_no_fitted_row_is_there(away, tmp_path):
    home, work = away
    out = run_cli("db", "list", cwd=work)
    assert out.returncode == 0, out.stderr
    folder = home / ".local" / "share" / "weightdiag"
    assert f"note: no fitted rows in the database {folder} (the per-user data folder" in out.stderr
    assert "--db" in out.stderr
    assert run_cli("db", "list", "-q", cwd=work).stderr == ""
    (tmp_path / "chosen").mkdir()  # an empty folder named with --db: chosen, no surprise (a missing one: exit 2)
    assert run_cli("db", "list", "--db", str(tmp_path / "chosen"), cwd=work).stderr == ""
    _model_fitted = run_cli("fit", str(_model(tmp_path / "m")), "-q", cwd=work)
    assert _model_fitted.returncode == 0, _model_fitted.stderr
    assert run_cli("db", "list", cwd=work).stderr == ""  # rows are there: nothing to explain


def test_no_text_users_read_claims_the_old_default():
    """The default is no longer ./DATABASE of the current folder: the README, the docs and --help say the rules."""
    root = Path(__file__).resolve().parent.parent
    texts = [root / "README.md", *(root / "docs").glob("*.md"), *(root / "weightdiag" / "cli").glob("*.py")]
    stale = [str(p.relative_to(root)) for p in texts if re.search(r"else `?\./DATABASE`?", p.read_text())]
    assert not stale, stale
    from .docs_text import user_docs

    assert "### Where rows are kept: the database folder" in user_docs()
    assert "~/.local/share/weightdiag" in (root / "README.md").read_text()


def test_db_list_shows_no_matrix_count_for_cohort_entries(tmp_path):
    """Cohort entries hold per-kind medians, no matrices: '-' rather than 0 (issue 21)."""
    out = run_cli("db", "list", "--db", str(tmp_path), env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "cohort:DATABASE_v9_1 " in line]
    assert lines and all(re.search(r"│\s+-\s+│\s+1\.\d{4}\s+│", line) for line in lines), lines


@pytest.mark.parametrize(
    "command",
    [
        ["db", "list"],
        ["db", "list", "--fitted", "--json"],
        ["db", "show", "all-MiniLM-L6-v2"],
        ["db", "show", "x@main.json"],
        ["db", "export"],
        ["compare"],
        ["compare", "all-MiniLM-L6-v2"],
        ["report", "all-MiniLM-L6-v2"],
        ["trajectory", "pythia-like-run"],
    ],
)
def test_a_named_database_folder_that_does_not_exist_is_an_error_for_every_read(command, tmp_path):
    """Issue 33: `db list --db typo` printed an empty table (exit 0), `db show X --db typo` "no such row": a --db (or
    WEIGHTDIAG_DB) that is not there is one line naming the folder, exit 2, wherever rows are read from it."""
    typo = tmp_path / "typo"
    env = {"HF_HUB_OFFLINE": "1"}
    out = run_cli(*command, "--db", str(typo), env=env)
    assert out.returncode == 2 and out.stdout == "", (command, out.stdout, out.stderr)
    assert out.stderr.splitlines() == [
        f"error: --db {typo}: no such database folder ({typo}); check the path, or leave --db out for the default "
        "(`weightdiag env` shows it)"
    ]
    out = run_cli(*command, env={**env, "WEIGHTDIAG_DB": str(typo)})
    assert out.returncode == 2 and f"error: WEIGHTDIAG_DB={typo}: no such database folder" in out.stderr, command
    assert not typo.exists()


def test_check_reading_a_row_by_name_needs_its_database(tmp_path):
    row = tmp_path / "base.json"
    model = _model(tmp_path / "m")
    assert run_cli("fit", str(model), "--db", str(tmp_path / "db"), "-q").returncode == 0
    (saved,) = (tmp_path / "db" / "rows").glob("*.json")
    row.write_bytes(saved.read_bytes())
    out = run_cli("check", "m", "--baseline", str(row), "--db", str(tmp_path / "typo"), env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2 and "no such database folder" in out.stderr, out.stderr
    assert run_cli("check", "m", "--baseline", str(row), "--db", str(tmp_path / "db")).returncode == 0


def test_writing_commands_and_reads_of_files_still_work_with_a_new_database_folder(tmp_path):
    """fit and sweep create a named folder; a model or row given by path is read without the database."""
    model = _model(tmp_path / "m")
    fitted = run_cli("fit", str(model), "--db", str(tmp_path / "new"), "-q")
    assert fitted.returncode == 0 and (tmp_path / "new" / "rows").is_dir(), fitted.stderr
    (row,) = (tmp_path / "new" / "rows").glob("*.json")
    assert run_cli("db", "show", str(row), "--db", str(tmp_path / "absent")).returncode == 0
    assert run_cli("report", str(model), "--db", str(tmp_path / "other"), "-q").returncode == 0
    assert (tmp_path / "other" / "rows").is_dir()  # a fresh fit is saved into it, as before
    assert run_cli("db", "show", "pythia-160m", "--db", str(tmp_path / "absent")).returncode == 0  # a cohort entry
    assert run_cli("compare", "pythia-160m", "--db", str(tmp_path / "absent"), "-q").returncode == 0
    assert not (tmp_path / "absent").exists()

"""A mistyped local name, offline, says that no such folder is here (and the nearest one) as well as that the
Hub cannot be reached: it used to read as a network problem only."""

from __future__ import annotations

from .conftest import run_cli

UNREACHABLE = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}  # nothing listens on port 9


def test_a_mistyped_folder_names_the_nearest_one(tmp_path):
    (tmp_path / "model").mkdir()
    out = run_cli("fit", "modle", "--no-save", cwd=tmp_path, env=UNREACHABLE)
    assert out.returncode == 3
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: no file or folder modle here (did you mean model?), and cannot reach the Hub")


def test_a_bare_name_with_nothing_close_says_both(tmp_path):
    out = run_cli("fit", "zzz", "--no-save", cwd=tmp_path, env=UNREACHABLE)
    assert out.returncode == 3 and out.stderr.startswith("error: no file or folder zzz here, and cannot reach")


def test_an_org_name_id_offline_keeps_the_hub_message(tmp_path):
    out = run_cli("fit", "acme/zzz", "--no-save", cwd=tmp_path, env=UNREACHABLE)
    assert out.returncode == 3 and out.stderr.startswith("error: cannot reach the Hub")

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


def test_a_learning_rate_alone_says_what_else_t_over_tau_needs(tmp_path):
    from weightdiag.testing import synthetic

    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))
    out = run_cli("fit", str(model), "--no-save", "--device", "cpu", "--lr", "1e-3")
    assert out.returncode == 0
    assert (
        "T/τ (the lambda axis) needs the learning rate, weight decay and steps: give --weight-decay, --train-steps"
        in (out.stderr)
    )
    full = run_cli("fit", str(model), "--no-save", "--device", "cpu", "--lr", "1e-3", "--weight-decay", "0.1")
    assert "give --train-steps too" in full.stderr
    nothing = run_cli("fit", str(model), "--no-save", "--device", "cpu")
    assert "T/τ" not in nothing.stderr


def test_one_row_is_one_row(tmp_path):
    from weightdiag.testing import synthetic

    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))
    assert run_cli("fit", str(model), "--db", str(tmp_path / "db"), "-q", "--device", "cpu").returncode == 0
    out = run_cli("db", "list", "--fitted", "--db", str(tmp_path / "db"))
    assert "1 row" in out.stdout and "1 rows" not in out.stdout

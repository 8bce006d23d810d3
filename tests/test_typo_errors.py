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


# --- issue 42, item 12: ids checked against the cohort and the database before the Hub is asked ---------------


def test_a_mistyped_cohort_id_is_answered_before_the_hub(fake_hub, tmp_path):
    (tmp_path / "db").mkdir()
    for command in (["compare", "pythia-70n"], ["report", "pythia-70n"], ["fit", "pythia-70n", "--no-save"]):
        out = run_cli(*command, "--db", str(tmp_path / "db"))
        assert out.returncode == 2, (command, out.stderr)
        (line,) = out.stderr.splitlines()
        assert line.startswith("error: pythia-70n: no local file or folder, cohort entry or fitted row of that name")
        assert "(did you mean pythia-70m?)" in line and "a Hub id as ORG/NAME" in line
    assert not fake_hub.requests_to("/api/models")  # the Hub was never asked
    offline = run_cli("compare", "pythia-70n", "--db", str(tmp_path / "db"), env=UNREACHABLE)
    assert offline.returncode == 2 and "(did you mean pythia-70m?)" in offline.stderr


def test_db_show_of_a_mistyped_id_suggests_the_nearest(tmp_path):
    (tmp_path / "db").mkdir()
    out = run_cli("db", "show", "pythia-160", "--db", str(tmp_path / "db"))
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: pythia-160: no such row in ") and "(did you mean pythia-160m?)" in line


def test_an_id_without_its_org_names_the_hub_repo_and_a_404_is_no_outage(fake_hub, tmp_path):
    from .hub_server import write_small_model

    fake_hub.add_folder("acme/tiny", write_small_model(tmp_path / "m"))
    db = str(tmp_path / "db")
    assert run_cli("fit", "acme/tiny", "--db", db, "-q").returncode == 0
    out = run_cli("fit", "tiny", "--no-save", "--db", db)
    assert out.returncode == 3
    (line,) = out.stderr.splitlines()
    assert "tiny: no such model repository on " in line and "(did you mean acme/tiny?)" in line
    # A 404 without the Hub's error code (the Hub answers so for some bare names): not "try again later".
    fake_hub.fail("404", "/api/models/acme/tinny", times=None)
    out = run_cli("compare", "acme/tinny", "--db", db)
    assert out.returncode == 3 and "try again later" not in out.stderr
    assert "acme/tinny: no such model repository on " in out.stderr and "(did you mean acme/tiny?)" in out.stderr


def test_check_names_the_revision_it_checked(fake_hub, tmp_path):
    """Issue 42, item 18: `check MODEL --revision REV` named the model without @REV in its errors and verdict,
    while the baseline had its own."""
    import json

    from .hub_server import write_small_model

    fake_hub.add_folder("acme/tiny", write_small_model(tmp_path / "m"))
    fake_hub.add_folder("acme/tiny", write_small_model(tmp_path / "m1", seed=5), branch="v1")
    db = str(tmp_path / "db")
    assert run_cli("fit", "acme/tiny", "--db", db, "-q").returncode == 0
    (baseline,) = (tmp_path / "db" / "rows").glob("*.json")
    out = run_cli("check", "acme/tiny", "--revision", "v1", "--baseline", str(baseline), "--db", db, "--json")
    assert json.loads(out.stdout)["model"] == "acme/tiny@v1", out.stderr
    other = json.loads(baseline.read_text())
    for m in other["matrices"]:
        m["name"] = "renamed." + m["name"]
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(other))
    out = run_cli("check", "acme/tiny", "--revision", "v1", "--baseline", str(renamed), "--db", db)
    assert out.returncode == 2
    assert out.stderr.startswith("error: acme/tiny@v1 and the baseline acme/tiny@main share no matrix name"), out.stderr


def test_diff_takes_the_tuned_models_revision(fake_hub, tmp_path):
    """Issue 42, item 18: `diff` had no --revision (fit, compare, check and report have one: MODEL@REV)."""
    import json

    from .hub_server import write_small_model

    fake_hub.add_folder("acme/tiny", write_small_model(tmp_path / "m"))
    fake_hub.add_folder("acme/tiny", write_small_model(tmp_path / "m1", seed=5), branch="v1")
    out = run_cli("diff", "acme/tiny", "acme/tiny", "--revision", "v1", "--no-save", "--no-spectrum", "--json")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["tuned"]["revision"] == "v1" and document["totals"]["relative_change"] > 0, document["tuned"]
    same = run_cli("diff", "acme/tiny", "acme/tiny@v1", "--revision", "v2", "--no-save")
    assert same.returncode == 2 and "--revision v2 and acme/tiny@v1 name two revisions" in same.stderr


def test_cache_dir_as_hf_takes_it(fake_hub, tmp_path):
    """Issue 42, item 18: `--cache-dir` (the `hf download` habit) was missing."""
    from .hub_server import write_small_model

    fake_hub.add_folder("acme/tiny", write_small_model(tmp_path / "m"))
    cache = tmp_path / "my-cache"
    fetched = run_cli("fit", "acme/tiny", "--download", "--cache-dir", str(cache), "--no-save", "-q")
    assert fetched.returncode == 0, fetched.stderr
    assert list((cache / "models--acme--tiny" / "snapshots").iterdir())  # the shards went there
    offline = {"HF_HUB_OFFLINE": "1"}
    again = run_cli("fit", "acme/tiny", "--cache-dir", str(cache), "--no-save", "-q", env=offline)
    assert again.returncode == 0, again.stderr
    elsewhere = run_cli("fit", "acme/tiny", "--no-save", "-q", env=offline)  # the default cache has none of it
    assert elsewhere.returncode == 3, elsewhere.stderr
    for command in (["compare"], ["check", "--baseline", "x.json"], ["report"], ["sweep"], ["diff"]):
        assert "--cache-dir" in run_cli(*command, "-h", env={"COLUMNS": "200"}).stdout, command


def test_a_local_rows_id_given_to_fit_says_it_is_no_hub_repository(fake_hub, tmp_path):
    """Issue 42, item 12: `fit all-MiniLM-L6-v2` after scripts/demo (its row's id, fitted from a folder) went to the
    Hub and came back "no such repository" with nothing else."""
    from .hub_server import write_small_model

    db = str(tmp_path / "db")
    assert run_cli("fit", str(write_small_model(tmp_path / "all-MiniLM-L6-v2")), "--db", db, "-q").returncode == 0
    out = run_cli("fit", "all-MiniLM-L6-v2", "--no-save", "--db", db, cwd=tmp_path / "db")
    assert out.returncode == 3
    assert "(all-MiniLM-L6-v2 is the id of a row in the database, not of a Hub repository)" in out.stderr


def test_a_bare_hub_id_close_to_a_row_from_the_hub_is_asked_of_the_hub(fake_hub, tmp_path):
    """Legacy Hub ids have no organisation (bert-base-cased, gpt2): one close to a row fitted from the Hub
    (bert-base-uncased) is another repository as likely as a typo, so the Hub is asked, and it fits."""
    from .hub_server import write_small_model

    db = str(tmp_path / "db")
    fake_hub.add_folder("bert-base-uncased", write_small_model(tmp_path / "uncased"))
    fake_hub.add_folder("bert-base-cased", write_small_model(tmp_path / "cased"))
    assert run_cli("fit", "bert-base-uncased", "--db", db, "-q").returncode == 0
    out = run_cli("fit", "bert-base-cased", "--db", db, "-q", "--no-save")
    assert out.returncode == 0, out.stderr
    out = run_cli("fit", "bert-base-casd", "--db", db, "--no-save")  # no such repository: then the hint
    assert out.returncode == 3 and "did you mean" in out.stderr, out.stderr

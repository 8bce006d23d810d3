"""A fit restricted by --include/--exclude or made with --center is its own row: it never replaces the
model's full fit, never answers for it by id, and a sweep never counts it as the revision done."""

from __future__ import annotations

import json

from weightdiag import api
from weightdiag.database import store as db
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .conftest import run_cli


def _model(tmp_path):
    return synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))


def test_a_probe_and_a_centered_fit_sit_beside_the_full_row(tmp_path):
    model, folder = _model(tmp_path), tmp_path / "db"
    assert run_cli("fit", str(model), "--db", str(folder), "-q", "--device", "cpu").returncode == 0
    full = json.loads(run_cli("db", "show", "m", "--db", str(folder), "--json").stdout)
    probe = run_cli("fit", str(model), "--db", str(folder), "-q", "--device", "cpu", "--include", "*layers.0.*")
    centered = run_cli("fit", str(model), "--db", str(folder), "-q", "--device", "cpu", "--center")
    assert probe.returncode == centered.returncode == 0
    names = sorted(p.name for p in db._row_paths(folder / "rows"))
    assert len(names) == 3
    assert [n for n in names if ".sel-" in n] and [n for n in names if n.endswith(".centered.json")]
    shown = json.loads(run_cli("db", "show", "m", "--db", str(folder), "--json").stdout)
    assert len(shown["matrices"]) == len(full["matrices"]) and not shown["protocol"].get("centered")
    listed = {r["matrices"] for r in api.list_rows(folder, fitted_only=True)}
    assert len(listed) == 2  # the full row and the probe (the centered row has the full row's count)


def test_the_same_patterns_in_another_order_are_the_same_probe(tmp_path):
    row = {"model": {"id": "a/b", "revision": "main"}, "protocol": {"name": "hist1024"}}
    one = db.row_filename({**row, "run": {"include": ["x*", "y*"], "exclude": []}})
    two = db.row_filename({**row, "run": {"include": ["y*", "x*"]}})
    other = db.row_filename({**row, "run": {"include": ["x*"]}})
    full = db.row_filename(row)
    assert one == two != other != full and full == "a--b@main.json"
    # a revision that ends like a variant cannot take a probe's name
    lookalike = db.row_filename({"model": {"id": "a/b", "revision": one.split("@")[1][: -len(".json")]}, **row})
    assert lookalike != one


def test_a_sweep_does_not_count_a_probe_as_the_revision_done(tmp_path):
    run = tmp_path / "run"
    spec = synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128)
    for step in (0, 100):
        synthetic.write_model(run / f"step{step}", spec)
    folder = tmp_path / "db"
    probe = api.fit_model(str(run / "step100"), FitOptions(device="cpu", include=("*layers.0.*",)))
    probe["model"]["id"], probe["model"]["revision"] = "run", "step100"
    db.write_row(probe, folder)
    done = api.sweep(str(run), db_dir=folder, options=FitOptions(device="cpu"), everything=True)
    assert {o.revision: o.status for o in done.outcomes} == {"step0": "fitted", "step100": "fitted"}


def test_an_old_probe_at_the_full_name_moves_aside_when_the_full_fit_is_written(tmp_path):
    """Earlier versions wrote a probe under the full row's name; the next full fit moves it to its own."""
    model, folder = _model(tmp_path), tmp_path / "db"
    probe = api.fit_model(str(model), FitOptions(device="cpu", include=("*layers.0.*",)))
    full_name = db.row_filename({**probe, "run": {**probe["run"], "include": []}})
    (folder / "rows").mkdir(parents=True)
    (folder / "rows" / full_name).write_text(json.dumps(probe))
    path = db.write_row(api.fit_model(str(model), FitOptions(device="cpu")), folder)
    assert path.name == full_name
    assert (folder / "rows" / db.row_filename(probe)).is_file()


def test_a_sweep_passes_every_fit_option_and_its_rows_are_that_variant(tmp_path):
    run = tmp_path / "run"
    spec = synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128)
    for step in (0, 100):
        synthetic.write_model(run / f"step{step}", spec)
    folder = tmp_path / "db"
    options = FitOptions(device="cpu", include=("*layers.0.*",), center=True, trim="mid90")
    first = api.sweep(str(run), db_dir=folder, options=options, everything=True)
    assert {o.status for o in first.outcomes} == {"fitted"}
    for path in db._row_paths(folder / "rows"):
        row = db.load_row(path)
        assert ".centered.sel-" in path.name and row["protocol"]["centered"] and row["protocol"]["trim"] == "mid90"
        assert {m["block"] for m in row["matrices"]} == {0}
    again = api.sweep(str(run), db_dir=folder, options=options, everything=True)
    assert {o.status for o in again.outcomes} == {"existing"}
    full = api.sweep(str(run), db_dir=folder, options=FitOptions(device="cpu"), everything=True)
    assert {o.status for o in full.outcomes} == {"fitted"}  # the variant rows do not stand for the full fit


def test_sweep_center_include_exclude_on_the_command_line_write_that_variant(tmp_path):
    """README, `sweep`: "`--center` and `--include`/`--exclude` sweeps ... write and resume rows of that variant,
    never counted as the full fit" (issue 33: the command had none of these options)."""
    run = tmp_path / "run"
    spec = synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128)
    for step in (0, 100):
        synthetic.write_model(run / f"step{step}", spec)
    folder = tmp_path / "db"
    args = ("sweep", str(run), "--all", "--db", str(folder), "--device", "cpu", "-q", "--center")
    args += ("--include", "*layers.*", "--exclude", "*layers.1.*")
    first = run_cli(*args, "--json")
    assert first.returncode == 0, first.stderr
    assert {o["status"] for o in json.loads(first.stdout)} == {"fitted"}
    paths = sorted(db._row_paths(folder / "rows"))
    assert len(paths) == 2
    for path in paths:
        row = db.load_row(path)
        assert ".centered.sel-" in path.name and row["protocol"]["centered"]
        assert row["run"]["include"] == ["*layers.*"] and row["run"]["exclude"] == ["*layers.1.*"]
        assert {m["block"] for m in row["matrices"]} == {0}
    again = run_cli(*args, "--json")
    assert {o["status"] for o in json.loads(again.stdout)} == {"existing"}
    full = run_cli("sweep", str(run), "--all", "--db", str(folder), "--device", "cpu", "-q", "--json")
    assert {o["status"] for o in json.loads(full.stdout)} == {"fitted"}  # the variant is not the full fit

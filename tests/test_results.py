"""The API's documents match their types (weightdiag.diagnose.results): every key present is declared and
every required key is present, all the way down through the nested TypedDicts."""

from __future__ import annotations

import copy
import json
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from weightdiag import api
from weightdiag.diagnose import results
from weightdiag.errors import RowUseError
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic
from weightdiag.vocabulary import MATRIX_KINDS

CPU = FitOptions(device="cpu")


def violations(value: Any, hint: Any, where: str = "$") -> list[str]:
    """What in `value` its type `hint` does not declare, or requires and misses (keys only, not value types)."""
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, expected an object ({hint.__name__})"]
        declared = get_type_hints(hint)
        found = [f"{where}.{key}: not declared in {hint.__name__}" for key in value if key not in declared]
        found += [f"{where}.{key}: required by {hint.__name__}, missing" for key in hint.__required_keys__ - set(value)]
        for key, item in value.items():
            if key in declared:
                found += violations(item, declared[key], f"{where}.{key}")
        return found
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None and len(options) < len(get_args(hint)):
            return []
        # A dict is checked against the union's object types, a list against its list types.
        shaped = [o for o in options if _shape(o) is type(value)]
        tried = [violations(value, option, where) for option in shaped or options]
        return [] if any(not t for t in tried) else tried[0]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, expected a list"]
        (item_hint,) = get_args(hint)
        return [v for i, item in enumerate(value) for v in violations(item, item_hint, f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, expected an object"]
        _, item_hint = get_args(hint)
        return [v for key, item in value.items() for v in violations(item, item_hint, f"{where}.{key}")]
    return []


def _shape(hint: Any) -> type | None:
    if is_typeddict(hint) or hint is dict or get_origin(hint) is dict:
        return dict
    if hint is list or get_origin(hint) is list:
        return list
    return None


def assert_typed(document: Any, hint: Any) -> None:
    found = violations(document, hint)
    assert not found, "\n".join(found)
    json.dumps(document, allow_nan=True)  # still plain JSON-able data


# --- inputs: one fit of the demo model, a small swept run ------------------------------------------------


@pytest.fixture(scope="module")
def row_file(minilm_dir, tmp_path_factory) -> Path:
    """The demo model fitted once (api.fit, save=False), as a row file the commands take."""
    fitted = api.fit(str(minilm_dir), CPU, save=False)
    assert fitted.path is None
    path = tmp_path_factory.mktemp("row") / "minilm.json"
    path.write_text(json.dumps(fitted.row))
    return path


RUN = synthetic.RunSpec(steps=(0, 500, 1000, 2000, 4000), duplicate=(2000, 4000))


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> tuple[str, Path]:
    """A small synthetic run swept into a database: (its model id, the database)."""
    root = tmp_path_factory.mktemp("run")
    synthetic.write_training_run(root, RUN)
    db = tmp_path_factory.mktemp("db")
    run = api.sweep(str(root), db_dir=db, options=FitOptions(device="cpu", preset="pythia-70m"), everything=True)
    assert not run.failed
    return run.model_id, db


# --- the checker itself ------------------------------------------------------------------------------------


def test_an_undeclared_or_missing_key_is_caught():
    check = {
        "model": "m",
        "baseline": "b",
        "trim": "mid80",
        "tol_k": 0.002,
        "tol_lambda": 0.01,
        "checked": 1,
        "failed": 0,
        "passed": True,
        "results": [{"name": "w", "status": "ok", "k": 1.0, "lambda": 0.1}],
    }
    assert violations(check, results.CheckResult) == []
    extra = copy.deepcopy(check)
    extra["surprise"] = 1
    assert violations(extra, results.CheckResult) == ["$.surprise: not declared in CheckResult"]
    nested = copy.deepcopy(check)
    nested["results"][0]["surprise"] = 1
    assert violations(nested, results.CheckResult) == ["$.results[0].surprise: not declared in MatrixCheck"]
    missing = copy.deepcopy(check)
    del missing["results"][0]["status"]
    assert violations(missing, results.CheckResult) == ["$.results[0].status: required by MatrixCheck, missing"]
    assert violations({"pattern": "x", "evidence": "a sentence"}, results.StdPattern) == []
    assert violations({"pattern": "x", "evidence": {"blocks": []}}, results.StdPattern)


# --- each command's document -------------------------------------------------------------------------------


def test_compare(row_file, tmp_path):
    reports = api.compare([str(row_file), "pythia-410m", "qwen3-8b"], db_dir=tmp_path)
    assert len(reports) == 3
    for report in reports:
        assert_typed(report, results.CompareReport)
    fitted, pythia, _ = reports
    assert "shallow_ffn" in fitted  # BERT's FFN blocks 0-5: the companion's regime test
    assert fitted["kinds"]
    assert fitted["nearest"]
    assert "ratio" in pythia["lambda"]  # the cohort entry's hyperparameters are known
    assert "note" in fitted["lambda"]


def test_check(row_file, tmp_path):
    baseline = json.loads(row_file.read_text())
    moved = baseline["matrices"][0]
    for fit in moved["fits"].values():
        if fit["ok"]:
            fit["k"] += 0.01
    baseline["matrices"][1]["name"] += ".renamed"  # missing here, new in the model
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(baseline))
    result = api.check(str(row_file), path)
    assert_typed(result, results.CheckResult)
    statuses = {r["status"] for r in result["results"]}
    assert {"ok", "moved", "new", "missing"} <= statuses
    assert not result["passed"]


def test_report(row_file, tmp_path):
    report = api.report(str(row_file), db_dir=tmp_path)
    assert_typed(report.result, results.HealthReport)
    assert report.result["model"]["how"] == "row file"


def test_report_with_plots_and_html(row_file, tmp_path):
    pytest.importorskip("matplotlib")
    report = api.report(str(row_file), db_dir=tmp_path, plot=tmp_path / "plots", html=tmp_path / "report.html")
    assert_typed(report.result, results.HealthReport)
    assert report.result["plots"]
    assert report.result["html"] == str(tmp_path / "report.html")


def test_trajectory(swept):
    model, db = swept
    result = api.trajectory(model, db_dir=db)
    assert_typed(result, results.TrajectoryResult)
    for key in ("step0", "paired_lambda", "lambda_o_peak", "std_pattern", "protocol"):
        assert key in result, key
    assert result["duplicates"] == {"step_4000": "step_2000"}
    cosine = api.trajectory(model, db_dir=db, schedule="cosine", total=4000, warmup=100)
    assert_typed(cosine, results.TrajectoryResult)
    assert set(cosine["schedule"]) == {"kind", "total", "warmup", "min_ratio"}


def test_trajectory_without_steps(row_file, tmp_path):
    """Rows of no training step are no trajectory: one line, exit 2 (an empty result with exit 0 before issue 33)."""
    row = json.loads(row_file.read_text())
    api.save_row(row, tmp_path)
    with pytest.raises(RowUseError) as refused:
        api.trajectory(row["model"]["id"], db_dir=tmp_path)
    assert refused.value.model_id == row["model"]["id"] and refused.value.exit_code == 2


def test_list_rows(swept):
    _, db = swept
    records = api.list_rows(db)
    assert any(r["source"] == "local" for r in records)
    assert any(r["source"].startswith("cohort:") for r in records)
    for record in records:
        fixed = {k: v for k, v in record.items() if not k.startswith(results.KIND_COLUMN_PREFIXES)}
        assert_typed(fixed, results.FlatRecord)
        # The per-kind columns, the only keys FlatRecord cannot declare: both of them for each kind.
        kinds = {k.removeprefix(p) for k in record for p in results.KIND_COLUMN_PREFIXES if k.startswith(p)}
        assert kinds <= set(MATRIX_KINDS), kinds
        columns = {f"{p}{kind}" for p in results.KIND_COLUMN_PREFIXES for kind in kinds}
        assert set(record) - set(fixed) == columns

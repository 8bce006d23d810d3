"""The typed, frozen result of a fit (weightdiag.record.result, issue 38): made from a row by from_json (rows of
every schema read, older forms upgraded), giving the very row back with to_json; reached as `Fitted.fit_result`
and `Report.fit_result`."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

import weightdiag as wd
from weightdiag.database import store


@pytest.fixture(scope="module")
def neox_spectrum(small_neox):
    return wd.fit(str(small_neox), wd.FitOptions(spectrum=True, device="cpu"), save=False)


def test_the_result_is_the_row_typed(neox_spectrum):
    row = neox_spectrum.row
    result = neox_spectrum.fit_result
    assert isinstance(result, wd.FitResult) and result.to_json() == row
    model = row["model"]
    assert result.model == model["id"] and result.source == "local" and result.revision == model["fingerprint"]
    assert result.id == f"{model['id']}@{model['fingerprint']}" and result.schema == "weightdiag.row/2"
    assert (result.protocol, result.trim) == (row["protocol"]["name"], row["protocol"]["trim"])
    assert (result.n_matrices, result.n_vectors, result.n_skipped) == tuple(
        len(row[s]) for s in ("matrices", "vectors", "skipped")
    )
    assert result.training_state == row["hyperparameters"]["state"]
    assert list(result.kinds) == list(row["kinds"])
    for kind, summary in row["kinds"].items():
        typed = result.kinds[kind]
        assert (typed.kind, typed.role, typed.k_median, typed.lambda_median, typed.count) == (
            kind,
            summary["class"],
            summary["k_median"],
            summary["lambda_median"],
            summary["count"],
        )
    trim = row["protocol"]["trim"]
    assert [m.name for m in result.matrices] == [r["name"] for r in row["matrices"]]
    for matrix, record in zip(result.matrices, row["matrices"], strict=True):
        assert isinstance(matrix, wd.MatrixFit) and matrix.record == record
        assert (matrix.kind, matrix.role, matrix.block, list(matrix.shape)) == (
            record["kind"],
            record["class"],
            record["block"],
            record["shape"],
        )
        assert (matrix.k, matrix.lam, matrix.r2) == tuple(record["fits"][trim][f] for f in ("k", "lambda", "r2"))
        assert matrix.alpha == record["spectrum"]["alpha"] and matrix.alpha is not None
    fused = [m for m in result.matrices if m.parts]
    assert fused and all(m.kind == "qkv" and m.parts == ("q", "k", "v") for m in fused)  # NeoX's fused qkv
    assert result.matrix(fused[0].name) is fused[0]
    with pytest.raises(KeyError):
        result.matrix("no.such.weight")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.model = "other"  # type: ignore[misc]


def test_json_round_trips(neox_spectrum, tmp_path):
    result = neox_spectrum.fit_result
    again = wd.FitResult.from_json(json.loads(json.dumps(result.to_json())))
    assert again == result and again.to_json() == result.to_json()
    path = tmp_path / "row.json"
    path.write_text(json.dumps(result.to_json()))
    assert wd.FitResult.read(path) == result
    hash(result)  # frozen and hashable by its scalar fields (the row and kinds are left out of the hash)


def test_old_rows_read_back(cpu_fit, small_llama):
    """A row written before issue 33 (each kind's r2_below_95 as the text "a/b") reads as today's, the document
    given left as it was; the shipped cohort rows (no per-matrix records, no revision) read too."""
    row = cpu_fit(small_llama)
    old = copy.deepcopy(row)
    for summary in old["kinds"].values():
        summary["r2_below_95"] = f"{summary['r2_below_95']}/{summary['fitted']}"
    given = copy.deepcopy(old)
    result = wd.FitResult.from_json(old)
    assert old == given  # not upgraded in place
    assert result.to_json() == row and result == wd.FitResult.from_json(row)
    assert all(type(s["r2_below_95"]) is int for s in result.to_json()["kinds"].values())
    cohort = store.cohort_rows()
    assert len(cohort) >= 12
    for entry in cohort:
        typed = wd.FitResult.from_json(entry)
        assert typed.source == "cohort" and typed.matrices == () and typed.n_matrices == 0
        assert typed.kinds and all(k.k_median == entry["kinds"][k.kind]["k_median"] for k in typed.kinds.values())


def test_what_is_not_a_row_is_refused():
    with pytest.raises(wd.RowError) as caught:
        wd.FitResult.from_json({"schema": "weightdiag.row/3"})
    assert caught.value.exit_code == 2 and "weightdiag.row/3" in str(caught.value)
    with pytest.raises(wd.RowError, match="model"):
        wd.FitResult.from_json({"schema": "weightdiag.row/1", "model": {"id": 3}})


# --- a diff row, typed (weightdiag.record.diff_row) ---------------------------------------------------------------


def test_a_diff_row_typed_and_read_back(small_llama, tmp_path):
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(
        n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=8
    )
    tuned = synthetic.write_model(tmp_path / "tuned", spec)
    result = wd.diff(str(small_llama), str(tuned), wd.DiffOptions(device="cpu"), db_dir=tmp_path / "db")
    document = result.to_json()
    saved = Path(result.run["saved"])  # the file of DATABASE/diffs/
    assert wd.DiffRow.read(saved) == wd.DiffRow.from_json(json.loads(saved.read_text()))
    typed = wd.DiffRow.from_json(document)
    assert typed.to_json() == document and typed == wd.DiffRow.from_json(json.loads(json.dumps(document)))
    assert typed.schema == "weightdiag.diff/1" and wd.DiffRow.read(saved).matrices == typed.matrices
    assert (typed.base, typed.tuned) == (document["base"]["id"], document["tuned"]["id"])
    assert typed.verdict == document["mechanism"]["verdict"] and typed.findings == tuple(
        f.code for f in result.findings
    )
    assert typed.relative_change == document["totals"]["relative_change"]
    assert len(typed.matrices) == len(result.matrices) and len(typed.vectors) == len(result.vectors)
    for change, pair in zip(typed.matrices, result.matrices, strict=True):
        assert isinstance(change, wd.TensorChange)
        assert (change.name, change.kind, change.block, change.shape) == (pair.name, pair.kind, pair.block, pair.shape)
        assert change.relative_change == pytest.approx(pair.relative_change, rel=1e-12)
        assert change.rank90 == pair.rank90 and change.untouched == pair.untouched
        assert change.base_k == pair.to_json()["base_weibull"]["k"] and change.delta_k == pair.to_json()["delta_k"]
    assert any(c.relative_change for c in typed.matrices) and any(c.rank90 for c in typed.matrices)
    hash(typed)


def test_what_is_not_a_diff_row_is_refused(neox_spectrum, tmp_path):
    with pytest.raises(wd.RowError, match="not a diff row") as caught:
        wd.DiffRow.from_json(neox_spectrum.row)  # a fit's row
    assert caught.value.exit_code == 2
    with pytest.raises(wd.RowError, match="damaged diff row"):
        wd.DiffRow.from_json({"schema": "weightdiag.diff/1", "base": {"id": "a"}})
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "weightdiag.diff/1", ')
    with pytest.raises(wd.RowError, match=r"broken\.json: cannot read a diff row"):
        wd.DiffRow.read(broken)

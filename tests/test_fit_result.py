"""The typed, frozen result of a fit (weightdiag.record.result, issue 38): made from a row by from_json (rows of
every schema read, older forms upgraded), giving the very row back with to_json; reached as `Fitted.fit_result`
and `Report.fit_result`."""

from __future__ import annotations

import copy
import dataclasses
import json

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

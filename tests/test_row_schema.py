"""Issue 28: the row's schema declared once. The TypedDicts of weightdiag.record.schema are the declaration:
the loader's checks are derived from them (a field of the wrong type at any depth, a missing required field),
docs/row-schema.md's field reference is generated from them and its prose describes every declared field;
and the fit stage hands the record stage a typed MatrixFit, which the row holds whole (it reads back)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from typing import Any, TypedDict

import numpy as np
import pytest

from weightdiag.errors import BadInputError, ExitCode
from weightdiag.fit.matrix import MatrixFit, fit_matrix
from weightdiag.layout import classify_tensor
from weightdiag.record import schema
from weightdiag.record.row import json_float, matrix_record, read_matrix_fit
from weightdiag.record.schema import FitRecord, RowError
from weightdiag.reduce.reduction import reduce_array
from weightdiag.run.fitting import fit_path
from weightdiag.run.measure import FitOptions
from weightdiag.segments import Segments
from weightdiag.testing import synthetic

from . import row_fields

NEOX = synthetic.ModelSpec(family="gpt_neox", n_layers=1, d_model=64, n_heads=4, n_kv_heads=4, ffn_size=128, vocab=256)


@pytest.fixture(scope="module")
def row(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A row of today's fit (a NeoX model: a fused qkv with parts), with every optional field the fit of a
    float model does not write added as other rows carry it (quantized, tower, sliced, resumed, cohort, sweep)."""
    model = synthetic.write_model(tmp_path_factory.mktemp("neox") / "neox", NEOX)
    out = copy.deepcopy(dict(fit_path(str(model), FitOptions(device="cpu"))))
    out["run"]["resumed"] = {"tensors": 1, "bytes": 2, "since": None}
    out.update(duplicate_of="main", provenance={"paper": "x"}, shallow_ffn=None, hyperparameters={"lr": 1e-3})
    out["model"].update(hub_repo="h/m", family_name=None, size="7b")
    qkv = next(m for m in out["matrices"] if "parts" in m)
    out["matrices"].insert(0, qkv)
    qkv.update(
        fitted_dtype="F32",
        quantization="Q4_1",
        grid={"bits": 4, "group": 64},
        tower="vision_tower",
        tower_kind=None,
        slice_of={"tensor": "t", "segments": [0, 1, 1, 1]},
        dequantized={"format": "gptq", "method": "gptq", "bits": 4, "label": "l", "arithmetic": "a", "group": 128},
    )
    qkv["dequantized"]["stored"] = {"codes": "qweight", "scale": "scales"}
    out["vectors"][0].update(tower="t", tower_kind="q", offset_applied=1, slice_of={"tensor": "t", "segments": [0]})
    assert schema.load_row(out) is out
    return out


def damaged(row: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `row` with the field at the dotted `path` (list indexes as numbers) set to `value`, or
    deleted (value KeyError)."""
    out = copy.deepcopy(row)
    *parents, last = path.split(".")
    node: Any = out
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    index: Any = int(last) if isinstance(node, list) else last
    if value is KeyError:
        del node[index]
    else:
        node[index] = value
    return out


# --- the loader's checks, derived from the types ----------------------------------------------------------

WRONG = [
    # (where, value, the field reported, its problem): from the top to five levels down
    ("created", 5, "created", "is an integer, expected a string or null"),
    ("metadata", [], "metadata", "is a list, expected an object or null"),
    ("tool.version", 1.5, "tool.version", "is a number, expected a string or null"),
    ("run.resumed.bytes", "2", "run.resumed.bytes", "is a string, expected an integer"),
    ("kinds.qkv.k_class_withheld", [], "kinds.qkv.k_class_withheld", "is a list, expected a string or null"),
    ("matrices.0.grid.group", True, "matrices[0].grid.group", "is true or false, expected an integer"),
    ("matrices.0.tower_kind", 3, "matrices[0].tower_kind", "is an integer, expected a string or null"),
    (
        "matrices.0.dequantized.stored.codes",
        3,
        "matrices[0].dequantized.stored.codes",
        "is an integer, expected a string",
    ),
    ("matrices.0.slice_of.segments.2", "x", "matrices[0].slice_of.segments[2]", "is a string, expected an integer"),
    (
        "matrices.0.parts.1.fits.mid90.points",
        1.5,
        "matrices[0].parts[1].fits.mid90.points",
        "is a number, expected an integer",
    ),
    ("matrices.0.parts.0.stats", None, "matrices[0].parts[0].stats", "is null, expected an object"),
    ("matrices.0.parts.0.argmax.1", None, "matrices[0].parts[0].argmax[1]", "is null, expected an integer"),
    ("vectors.0.offset_applied", None, "vectors[0].offset_applied", "is null, expected a number"),
    ("vectors.0.slice_of", [], "vectors[0].slice_of", "is a list, expected an object"),
]


@pytest.mark.parametrize(("path", "value", "field", "problem"), WRONG, ids=[w[0] for w in WRONG])
def test_a_field_of_the_wrong_type_at_any_depth_is_a_row_error_naming_it(row, path, value, field, problem):
    with pytest.raises(RowError) as info:
        schema.load_row(damaged(row, path, value), "rows/x.json")
    err = info.value
    assert (err.field, err.problem) == (field, problem)
    assert isinstance(err, BadInputError) and err.exit_code == ExitCode.BAD_INPUT
    assert (
        str(err)
        == f"rows/x.json: damaged weightdiag row: field '{field}' {problem}; refit the model or remove the file"
    )


MISSING = ["schema", "model.id", "run.resumed.tensors", "kinds.qkv.flags", "matrices.0.dequantized.arithmetic"]
MISSING += ["matrices.0.grid.bits", "matrices.0.parts.1.heaviness.gini", "matrices.0.fits.full.reason"]
MISSING += ["vectors.0.slice_of.tensor", "vectors.1.n_nonfinite"]


@pytest.mark.parametrize("path", MISSING)
def test_a_missing_required_field_is_a_row_error_naming_it(row, path):
    if path == "schema":  # the schema is looked at first: without it a document is no row at all
        with pytest.raises(RowError, match="not a weightdiag row"):
            schema.load_row(damaged(row, path, KeyError))
        return
    with pytest.raises(RowError) as info:
        schema.load_row(damaged(row, path, KeyError))
    field = re.sub(r"\.(\d+)", r"[\1]", path)
    assert (info.value.field, info.value.problem) == (field, "is missing")


@pytest.mark.parametrize("path", ["files", "run.resumed.since", "matrices.0.grid", "matrices.0.stats.distinct_values"])
def test_optional_fields_may_be_absent(row, path):
    doc = damaged(row, path, KeyError)
    assert schema.load_row(doc) is doc


def test_fields_no_type_declares_are_kept_at_any_depth(row):
    doc = copy.deepcopy(row)
    doc["run"]["resumed"]["later"] = 1
    doc["matrices"][0]["parts"][0]["fits"]["mid80"]["later"] = [None]
    doc["vectors"][0]["slice_of"]["later"] = {"x": "y"}
    before = copy.deepcopy(doc)
    assert schema.load_row(doc) == before


def test_the_first_bad_field_in_declaration_order_is_reported(row):
    doc = damaged(damaged(row, "protocol", KeyError), "model.source", 1)  # model is declared before protocol
    with pytest.raises(RowError) as info:
        schema.load_row(doc)
    assert info.value.field == "model.source"
    doc = damaged(damaged(row, "matrices.0.heaviness", KeyError), "matrices.0.stats.mean", "x")  # stats first
    with pytest.raises(RowError) as info:
        schema.load_row(doc)
    assert info.value.field == "matrices[0].stats.mean"


def test_a_declared_field_is_checked_with_no_check_written_for_it():
    class Later(TypedDict, total=False):  # a type added later, nested as rows nest theirs
        fits: dict[str, FitRecord]
        counts: list[int] | None

    check = schema.check_of(Later)
    check(
        {"fits": {"mid80": {"k": 1, "lambda": 2.0, "r2": None, "ks": 0.1, "points": 5, "ok": True, "reason": None}}}, ""
    )
    check({"counts": None}, "")
    with pytest.raises(schema._Bad) as info:
        check({"fits": {"mid80": {"k": 1}}}, "later")
    assert (info.value.field, info.value.problem) == ("later.fits.mid80.lambda", "is missing")
    with pytest.raises(schema._Bad) as info:
        check({"counts": [1, False]}, "later")
    assert (info.value.field, info.value.problem) == ("later.counts[1]", "is true or false, expected an integer")


@pytest.mark.parametrize("tp", [int | str, set[int], dict[int, str], tuple[int, int], bytes])
def test_a_type_that_is_not_json_cannot_be_declared(tp):
    with pytest.raises(TypeError, match="row field type"):
        schema.check_of(tp)


def test_every_type_of_a_row_has_its_check():
    for typed in row_fields.places():
        assert callable(schema.check_of(typed))


# --- the documentation ------------------------------------------------------------------------------------


def test_the_documented_field_reference_is_the_declaration():
    documented = row_fields.documented_block(row_fields.DOC.read_text())
    assert documented is not None, f"{row_fields.DOC}: no generated field reference"
    assert documented == row_fields.block(), "docs/row-schema.md: run `python -m tests.row_fields` to update it"


def _sections(text: str) -> dict[str, str]:
    return {part.split("\n", 1)[0].strip(): part for part in re.split(r"^## ", text, flags=re.M)[1:]}


def _ticked(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def _table(section: str) -> dict[str, str]:
    """A section's table: each field named in a row's first column -> the whole row."""
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            for name in _ticked(line.split("|")[1]):
                rows[name] = line
    return rows


def test_the_prose_describes_every_declared_field_and_no_other():
    """Each table of docs/row-schema.md names exactly the fields its type declares, and each object's fields
    are described in the line of the field that holds it (`run` names `resumed` and its `tensors`, ...)."""
    text = row_fields.DOC.read_text()
    prose = _sections(text.split(row_fields.BEGIN)[0])
    top, matrices, vectors = _table(prose["Top level"]), _table(prose["`matrices[]`"]), prose["`vectors[]`"]
    assert set(top) == set(schema.Row.__annotations__)
    assert set(matrices) == set(schema.MatrixRecord.__annotations__)
    undescribed = []
    for typed, paths in row_fields.places().items():
        steps = [s.rstrip("[]") for s in paths[0].split(".")] if paths[0] else []
        if len(steps) < 2 and steps in ([], ["matrices"]):
            continue  # the tables' first columns, above
        if steps[0] == "vectors" and len(steps) == 1:
            where = vectors
        elif steps[0] == "matrices":
            where = matrices[steps[1]]
        elif steps[0] == "vectors":
            where = vectors
        else:
            where = top[steps[0]]
        undescribed += [f"{paths[0]}.{name}" for name in typed.__annotations__ if name not in _ticked(where)]
    assert undescribed == []


# --- MatrixFit: the fit stage's result, serialized by the record stage -------------------------------------


def _bf16(values: np.ndarray) -> np.ndarray:
    return synthetic.to_bf16_bits(values.astype(np.float32)).reshape(-1)


def _qkv_fit(grid: tuple[int, int] | None = None, center: bool = False) -> tuple[MatrixFit, tuple[int, int]]:
    shape = (96, 32)
    rng = np.random.default_rng(1)
    flat = _bf16(rng.standard_t(5, size=shape) * 0.02)
    parts = [
        (kind, reduce_array(flat, "BF16", Segments(i * 32 * 32, 32 * 32, 96 * 32, 1))) for i, kind in enumerate("qkv")
    ]
    whole = reduce_array(flat, "BF16")
    whole.grid = grid
    return fit_matrix(whole, shape, "hist1024", center, parts), shape


def _record(fit: MatrixFit, shape: tuple[int, int]) -> dict[str, Any]:
    role = classify_tensor("gpt_neox.layers.0.attention.query_key_value.weight", shape, 1, "gpt_neox", 0)
    return matrix_record("gpt_neox.layers.0.attention.query_key_value.weight", role, "BF16", shape, fit)


@pytest.mark.parametrize("grid", [None, (4, 32)])
def test_a_matrix_fit_survives_its_row(row, grid):
    fit, shape = _qkv_fit(grid)
    record = _record(fit, shape)
    doc = copy.deepcopy(row)
    doc["matrices"] = [record]
    text = json.dumps(doc)
    back = read_matrix_fit(schema.load_row(json.loads(text))["matrices"][0])
    assert json.dumps(_record(back, shape)) == json.dumps(record)  # serialized again: the same record
    assert back.grid == grid and [kind for kind, _ in back.parts] == ["q", "k", "v"]
    for (_, read), (_, made) in zip([("", back.whole), *back.parts], [("", fit.whole), *fit.parts], strict=True):
        assert read.numel == made.numel and read.argmax == made.argmax
        assert read.stats.distinct_values == made.stats.distinct_values
        assert read.stats.std_abs == json_float(made.stats.std_abs)
        assert list(read.fits) == ["mid80", "mid90", "full"]
        for trim, f in made.fits.items():
            assert (read.fits[trim].k, read.fits[trim].lam) == (json_float(f.k), json_float(f.lam))
            assert (read.fits[trim].points, read.fits[trim].ok) == (f.points, f.ok)
        assert read.heaviness.gini == json_float(made.heaviness.gini)
        assert read.gamma_closure == json_float(made.gamma_closure)


def test_what_could_not_be_fitted_is_nan_in_the_fit_and_null_in_the_row():
    red = reduce_array(_bf16(np.zeros(40)), "BF16")  # only zeros: no |w| to fit, no tail
    fit = fit_matrix(red, (5, 8), "exact")
    assert not fit.whole.fits["mid80"].ok and math.isnan(fit.whole.gamma_closure)
    assert math.isnan(fit.whole.heaviness.gini) and fit.parts == ()
    record = _record(fit, (5, 8))
    assert record["gamma_closure"] is None and record["heaviness"]["gini"] is None
    assert record["fits"]["mid80"]["k"] is None and record["fits"]["mid80"]["reason"]
    back = read_matrix_fit(json.loads(json.dumps(record)))
    assert math.isnan(back.whole.fits["mid80"].k) and back.whole.fits["mid80"].reason == fit.whole.fits["mid80"].reason
    assert _record(back, (5, 8)) == record


def test_a_matrix_fit_is_frozen():
    fit, _ = _qkv_fit()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.grid = (4, 64)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.whole.gamma_closure = 0.0  # type: ignore[misc]


def test_the_centred_fit_is_another_fit_of_the_same_reduction():
    plain, _ = _qkv_fit()
    centred, _ = _qkv_fit(center=True)
    assert plain.whole.stats == centred.whole.stats  # the statistics do not depend on --center
    assert plain.whole.fits["mid80"].k != centred.whole.fits["mid80"].k

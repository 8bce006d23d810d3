"""The library's front (issue 38): `import weightdiag as wd` and its names, typed for a user's type checker; the
per-matrix frame with WeightWatcher's column names; a diff's per-tensor frame; the fit's dry run (`wd.plan`)."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tomllib

import weightdiag as wd
from weightdiag.errors import PANDAS_INSTALL
from weightdiag.record.table import MATRIX_COLUMN_NAMES, WEIGHTWATCHER_COLUMNS, matrix_records

from .docs_text import section as docs_section

ROOT = Path(__file__).resolve().parents[1]
VERBS = ("fit", "diff", "compare", "check", "report", "sweep", "plan")


def test_the_root_exports_the_library():
    """Every name of __all__ is there (imported on first use), the verbs and the error base among them."""
    for name in wd.__all__:
        assert getattr(wd, name) is not None, name
    assert set(VERBS) <= set(wd.__all__)
    assert {"FitOptions", "DiffOptions", "Fitted", "DiffResult", "Plan", "WeightdiagError"} <= set(wd.__all__)
    assert wd.WeightdiagError.__module__ == "weightdiag.errors"
    assert set(wd.__all__) == {*wd._FRONT, "fit", "__version__"}  # the literal list and the lazy table agree


def test_import_is_cheap_and_fit_is_both_the_verb_and_the_stage():
    """`import weightdiag` loads neither numpy nor pandas; wd.fit is callable (api.fit) whether the numerics'
    package `weightdiag.fit` was imported before or after."""
    code = (
        "import sys, weightdiag as wd\n"
        "assert 'numpy' not in sys.modules and 'pandas' not in sys.modules, 'heavy import'\n"
        "import weightdiag.fit.weibull as w\n"
        "assert callable(wd.fit) and w.__name__ == 'weightdiag.fit.weibull'\n"
        "from weightdiag.fit.esd import SpectrumFit\n"
        "from weightdiag import fit\n"
        "assert fit is wd.fit and callable(fit) and wd.plan.__module__ == 'weightdiag.api'\n"
        "import inspect\n"
        "assert list(inspect.signature(wd.fit).parameters)[:2] == ['spec', 'options']\n"
        "assert 'Returns:' in wd.fit.__doc__ and 'Weibull fits and statistics' in wd.fit.__doc__\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    with pytest.raises(wd.BadInputError) as caught:
        wd.fit(str(ROOT / "no-such-model"), save=False)
    assert caught.value.exit_code == 2


def test_the_verbs_document_args_returns_and_raises():
    for name in VERBS:
        doc = _api_doc(name)  # wd.fit is api.fit called through the package (see weightdiag/__init__.py)
        assert doc, name
        for section in ("Args:", "Returns:", "Raises:", "exit code 2"):
            assert section in doc, (name, section)


def _api_doc(name: str) -> str:
    from weightdiag import api

    return getattr(api, name).__doc__ or ""


def test_py_typed_is_shipped():
    assert (ROOT / "weightdiag" / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["weightdiag"]
    extras = data["project"]["optional-dependencies"]
    assert any(r.startswith("pandas") for r in extras["pandas"]) and any(
        r.startswith("pyarrow") for r in extras["pandas"]
    )
    assert {"pandas", "pyarrow", "duckdb"} <= {r.split(">")[0].split("=")[0] for r in extras["test"]}


USER_SCRIPT = """
from pathlib import Path

import weightdiag as wd


def main(model: str) -> float:
    fitted: wd.Fitted = wd.fit(model, wd.FitOptions(spectrum=True), save=False)
    row: wd.Row = fitted.row
    frame = fitted.matrices_frame()
    heavy = frame[frame.alpha > 6]
    plan: wd.Plan = wd.plan(model)
    names = [t.name for t in plan.tensors if t.fate == "matrix"]
    try:
        changes: wd.DiffResult = wd.diff(model, model, wd.DiffOptions(spectrum=False))
        print(changes.matrices_frame().relative_change.max())
    except wd.WeightdiagError as exc:
        print(exc.exit_code, exc)
    reports: list[wd.CompareReport] = wd.compare([model], save=False)
    print(len(heavy), names, reports, Path("."), row["model"]["id"])
    return float(len(row["matrices"]))
"""


@pytest.mark.slow
def test_a_user_script_passes_mypy_strict(tmp_path):
    """A script importing the root's names type-checks under `mypy --strict`: weightdiag found on PYTHONPATH is an
    installed package to mypy, read only because of py.typed (without it: "missing library stubs or py.typed")."""
    pytest.importorskip("mypy")
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_exported_modules_pass_mypy_strict():
    """`mypy --strict` on the modules the root exports from (their own code; what they import is checked by the
    project's mypy settings)."""
    pytest.importorskip("mypy")
    modules = ["__init__", "api", "record/table", "run/plan", "delta/result", "errors", "run/options"]
    modules += ["record/schema", "record/result", "record/diff_row", "diagnose/results"]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-incremental"]
        + [f"weightdiag/{m}.py" for m in modules],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- the per-matrix frame -------------------------------------------------------------------------------------


def _weightwatcher_columns() -> list[str]:
    """WeightWatcher 0.7.7's `details` columns, from its analyze() of two small matrices (the oracle)."""
    torch = pytest.importorskip("torch")
    quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
    with quiet[0], quiet[1], warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ww = pytest.importorskip("weightwatcher")
        gen = torch.Generator().manual_seed(0)
        state = {"a.weight": torch.randn(64, 32, generator=gen), "b.weight": torch.randn(48, 80, generator=gen)}
        details = ww.WeightWatcher(model=state).analyze(mp_fit=True)
    return list(details.columns)


@pytest.fixture(scope="module")
def minilm_spectrum(minilm_dir):
    return wd.fit(str(minilm_dir), wd.FitOptions(spectrum=True, device="cpu"), save=False)


@pytest.mark.slow
def test_minilm_frame_is_the_row_under_weightwatchers_names(minilm_spectrum):
    """On MiniLM with --spectrum: one line per matrix record; alpha, D, xmin, log_norm, stable_rank, mp_softrank,
    num_spikes (and every other spectral column) equal the row's values; the Weibull columns the row's fits; the
    spectral columns are named and ordered as WeightWatcher's `details` (its layer_type, longname, has_esd and rf
    aside), so a WeightWatcher filter works as written."""
    pd = pytest.importorskip("pandas")
    row = minilm_spectrum.row
    frame = minilm_spectrum.matrices_frame()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == list(MATRIX_COLUMN_NAMES)
    assert len(frame) == len(row["matrices"]) == 40
    theirs = _weightwatcher_columns()
    assert set(theirs) - set(frame.columns) == {"has_esd", "layer_type", "longname", "rf"}
    assert [c for c in theirs if c in WEIGHTWATCHER_COLUMNS] == list(WEIGHTWATCHER_COLUMNS)
    trim = row["protocol"]["trim"]
    for i, record in enumerate(row["matrices"]):
        line = frame.iloc[i]
        assert line["name"] == record["name"] and line["layer_id"] == i
        for column in WEIGHTWATCHER_COLUMNS:
            assert line[column] == record["spectrum"][column], (record["name"], column)
        for column in ("k", "lambda", "r2"):
            assert line[column] == record["fits"][trim][column]
            assert line[f"{column}_mid90"] == record["fits"]["mid90"][column]
        assert line["max_abs"] == record["stats"]["max_abs"] and line["gini"] == record["heaviness"]["gini"]
    for column in ("alpha", "D", "xmin", "log_norm", "stable_rank", "mp_softrank", "num_spikes"):
        assert frame[column].notna().all(), column
    # the README's lines for a row of fit --spectrum run as written
    readme = docs_section("Python API")
    block = readme.split("```python\n")[2].split("```")[0]
    shown = [line for line in block.splitlines() if line.startswith(("frame = ", "details = "))]
    assert len(shown) == 2
    space: dict = {"wd": wd, "row": row}
    exec("\n".join(shown), space)
    assert list(space["details"].name) == [m["name"] for m in row["matrices"] if m["spectrum"]["alpha"] > 6]
    heavy = frame[frame.alpha > 4]  # WeightWatcher's `details[details.alpha > 6]`, at MiniLM's scale
    assert 0 < len(heavy) < len(frame)
    assert set(heavy.name) == {m["name"] for m in row["matrices"] if m["spectrum"]["alpha"] > 4}


def test_records_of_a_row_without_spectra_and_of_a_cohort_summary(cpu_fit, small_neox):
    row = cpu_fit(small_neox)
    records = matrix_records(row)
    whole = [r for r in records if r["part_of"] is None]
    assert [r["name"] for r in whole] == [m["name"] for m in row["matrices"]]
    assert all(list(r) == list(MATRIX_COLUMN_NAMES) for r in records)
    assert all(
        r["alpha"] is None and r["k"] == m["fits"][row["protocol"]["trim"]]["k"]
        for r, m in zip(whole, row["matrices"], strict=True)
    )
    assert matrix_records({"model": {"id": "x", "source": "cohort"}, "protocol": {"name": "hist1024"}}) == []


def test_a_fused_matrixs_parts_are_lines_of_their_own(neox_spectrum_row):
    """NeoX's fused query_key_value: its line (kind qkv), then one per part (q, k, v: part_of qkv) with the part's
    own fits, stats and spectrum, its class the row's part_kinds'; the other matrices one line each."""
    pd = pytest.importorskip("pandas")
    row = neox_spectrum_row
    trim = row["protocol"]["trim"]
    frame = wd.matrices_frame(row)
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == list(MATRIX_COLUMN_NAMES)
    fused = [m for m in row["matrices"] if m.get("parts")]
    assert fused and len(frame) == len(row["matrices"]) + sum(len(m["parts"]) for m in fused)
    assert list(frame[frame.part_of.isna()].name) == [m["name"] for m in row["matrices"]]
    lines = iter(frame.to_dict("records"))
    for i, matrix in enumerate(row["matrices"]):
        line = next(lines)
        assert (line["layer_id"], line["kind"], line["shape"]) == (i, matrix["kind"], matrix["shape"])
        for part in matrix.get("parts", []):
            line = next(lines)
            assert (line["layer_id"], line["name"], line["kind"], line["part_of"]) == (
                i,
                matrix["name"],
                part["kind"],
                matrix["kind"],
            )
            assert line["class"] == row["part_kinds"][part["kind"]]["class"] and line["shape"] is None
            assert line["k"] == part["fits"][trim]["k"] and line["numel"] == part["numel"]
            assert line["alpha"] == part["spectrum"]["alpha"] and line["max_abs"] == part["stats"]["max_abs"]
            assert line["block"] == matrix["block"] and line["dtype"] == matrix["dtype"]
    assert next(lines, None) is None
    assert set(frame[frame.part_of == "qkv"].kind) == {"q", "k", "v"}


@pytest.fixture(scope="module")
def neox_spectrum_row(small_neox):
    return wd.fit(str(small_neox), wd.FitOptions(spectrum=True, device="cpu"), save=False).row


def test_the_frame_of_a_diff_row_is_the_diffs_and_of_anything_else_a_type_error(small_llama, tmp_path):
    pd = pytest.importorskip("pandas")
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(
        n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=8
    )
    tuned = synthetic.write_model(tmp_path / "tuned", spec)
    result = wd.diff(str(small_llama), str(tuned), wd.DiffOptions(device="cpu", spectrum=False), save=False)
    document = json.loads(json.dumps(result.to_json()))  # as a file of DATABASE/diffs/ reads
    frame = wd.matrices_frame(document)
    pd.testing.assert_frame_equal(frame, result.matrices_frame())
    assert "k" not in frame.columns and frame.relative_change.notna().all()
    pd.testing.assert_frame_equal(wd.matrices_frame(document, vectors=True), result.matrices_frame(vectors=True))
    for wrong, said in ((None, "not NoneType"), ("org/model", "a str (a path?"), (tmp_path, "Path (a path?")):
        with pytest.raises(TypeError, match="takes a row") as caught:
            wd.matrices_frame(wrong)  # type: ignore[arg-type]
        assert said in str(caught.value) and "\n" not in str(caught.value)


def test_without_pandas_the_frame_says_how_to_install_it(cpu_fit, small_neox, monkeypatch):
    row = cpu_fit(small_neox)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(wd.MissingDependencyError) as caught:
        wd.matrices_frame(row)
    assert (
        caught.value.exit_code == 2 and PANDAS_INSTALL in str(caught.value) and "weightdiag[" not in str(caught.value)
    )
    assert "\n" not in str(caught.value)


def test_a_diffs_per_tensor_frame(small_llama, tmp_path):
    """DiffResult.matrices_frame(): one line per matrix pair, the diff's JSON fields with nested ones joined by _."""
    pytest.importorskip("pandas")
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(
        n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=8
    )
    tuned = synthetic.write_model(tmp_path / "tuned", spec)
    result = wd.diff(str(small_llama), str(tuned), wd.DiffOptions(device="cpu"), db_dir=tmp_path / "db")
    assert Path(result.run["saved"]).parent == tmp_path / "db" / "diffs"  # saved by default, as the command does
    frame = result.matrices_frame()
    assert len(frame) == len(result.matrices)
    assert list(frame.name) == [m.name for m in result.matrices]
    for column in ("relative_change", "cosine", "rank90", "base_weibull_k", "delta_k", "spectrum_rank90"):
        assert column in frame.columns, column
    for line, pair in zip(frame.itertuples(), result.matrices, strict=True):
        assert line.relative_change == pair.to_json()["relative_change"]
        assert line.base_weibull_k == pair.to_json()["base_weibull"]["k"]
    with_vectors = result.matrices_frame(vectors=True)
    assert len(with_vectors) == len(result.matrices) + len(result.vectors)
    assert set(with_vectors.record) == {"matrix", "vector"}


# --- the dry run ----------------------------------------------------------------------------------------------


def _assert_plan_is_the_row(plan: wd.Plan, row: dict) -> None:
    """The plan's matrix, vector and skipped entries are the row's records: names in order, kinds, shapes, dtypes,
    reasons; the bytes it would read are the row's bytes_read."""
    matrices = plan.of("matrix")
    assert [t.name for t in matrices] == [m["name"] for m in row["matrices"]]
    assert [(t.kind, t.cls, t.block, list(t.shape), t.dtype) for t in matrices] == [
        (m["kind"], m["class"], m["block"], m["shape"], m["dtype"]) for m in row["matrices"]
    ]
    assert [t.parts for t in matrices] == [tuple(p["kind"] for p in m.get("parts", [])) for m in row["matrices"]]
    assert [t.name for t in plan.of("vector")] == [v["name"] for v in row["vectors"]]
    assert [t.kind for t in plan.of("vector")] == [v["kind"] for v in row["vectors"]]
    assert [(t.name, t.reason, t.dtype) for t in plan.of("skipped")] == [
        (s["name"], s["reason"], s["dtype"]) for s in row["skipped"]
    ]
    assert plan.bytes_to_read == row["run"]["bytes_read"]
    if (row.get("run") or {}).get("spectrum"):  # a fit with --spectrum: the plan said which it would take
        assert [t.spectrum for t in matrices] == ["spectrum" in m for m in row["matrices"]]
        assert [t.spectrum_skipped for t in matrices] == [m.get("spectrum_skipped") for m in row["matrices"]]
        parts = [[p.get("spectrum_skipped") for p in m.get("parts", [])] for m in row["matrices"]]
        assert all(reason is None for reasons in parts for reason in reasons)  # none of these models' parts


@pytest.mark.slow
def test_minilm_plan_is_what_the_fit_records_and_skips(minilm_dir, minilm_spectrum):
    plan = wd.plan(str(minilm_dir))
    _assert_plan_is_the_row(plan, minilm_spectrum.row)
    assert plan.bytes_read is None  # local files: nothing fetched
    assert [t.name for t in plan.of("skipped")] == ["embeddings.position_ids"]


@pytest.mark.slow
def test_a_gguf_plan_is_what_the_fit_records(cpu_fit, smollm_gguf):
    """Quantized (Q4_1) matrices: the plan's dtype is the stored type, as the row's."""
    plan = wd.plan(str(smollm_gguf))
    _assert_plan_is_the_row(plan, cpu_fit(smollm_gguf))
    assert any(t.dtype.startswith("Q") for t in plan.of("matrix"))


def test_plan_is_what_the_fit_records_fused_parts_and_filters(cpu_fit, small_neox, small_llama):
    """A fused qkv's parts, a sharded checkpoint, and --exclude (what is left out is listed as not selected)."""
    _assert_plan_is_the_row(wd.plan(str(small_neox)), cpu_fit(small_neox))
    _assert_plan_is_the_row(wd.plan(str(small_llama)), cpu_fit(small_llama))
    options = wd.FitOptions(exclude=["*.mlp.*"], device="cpu")
    plan = wd.plan(str(small_llama), options)
    row = wd.fit(str(small_llama), options, save=False).row
    _assert_plan_is_the_row(plan, row)
    left_out = plan.of("not selected")
    assert left_out and all(".mlp." in t.name and t.reason for t in left_out)
    pytest.importorskip("pandas")
    frame = plan.frame()
    assert list(frame.columns[:4]) == ["name", "fate", "tensor", "file"] and len(frame) == len(plan.tensors)
    assert plan.to_json()["counts"]["not selected"] == len(left_out)


def test_plan_says_which_matrices_spectrum_takes(tmp_path, neox_spectrum_row, small_neox):
    """`fit --plan` marks each matrix with whether --spectrum would take its spectrum, and why not (a tensor of 3
    dimensions); a fit with --spectrum then takes those and says the same reasons (values that are not finite are
    found only when read, so the plan cannot say those). A fused qkv and its parts: the plan is the row."""
    import numpy as np

    from .conftest import run_cli, write_safetensors

    _assert_plan_is_the_row(wd.plan(str(small_neox)), neox_spectrum_row)
    rng = np.random.default_rng(0)
    folder = tmp_path / "m"
    folder.mkdir()
    tensors = {
        "model.layers.0.mlp.up_proj.weight": ("F32", rng.standard_normal((64, 32)).astype(np.float32)),
        "model.layers.0.conv.weight": ("F32", rng.standard_normal((8, 4, 3)).astype(np.float32)),
        "model.layers.0.mlp.down_proj.weight": ("F32", rng.standard_normal((32, 64)).astype(np.float32)),
    }
    write_safetensors(folder / "model.safetensors", tensors)
    plan = wd.plan(str(folder))
    marks = {t.name: (t.spectrum, t.spectrum_skipped) for t in plan.of("matrix")}
    assert marks["model.layers.0.mlp.up_proj.weight"] == (True, None)
    assert marks["model.layers.0.conv.weight"][0] is False and "3 dimensions" in marks["model.layers.0.conv.weight"][1]
    assert all(t.spectrum is None for t in plan.tensors if t.fate != "matrix")
    row = wd.fit(str(folder), wd.FitOptions(device="cpu", spectrum=True), save=False).row
    _assert_plan_is_the_row(plan, row)
    out = run_cli("fit", str(folder), "--plan", env={"COLUMNS": "300"})
    assert out.returncode == 0 and "--spectrum takes 2 of 3" in out.stdout and "3 dimensions" in out.stdout


def test_plan_from_the_hub_reads_headers_only(fake_hub, small_llama, knobs):
    """A sharded model on the (loopback) Hub: every tensor listed with its fate, and only the headers fetched."""
    fake_hub.add_folder("org/sharded", small_llama)
    shards = sorted(p.name for p in small_llama.glob("*.safetensors"))
    assert len(shards) > 1
    knobs(head_guess=4096)
    fake_hub.reset_counters()
    plan = wd.plan("org/sharded")
    config_bytes = sum((small_llama / name).stat().st_size for name in ("config.json", "model.safetensors.index.json"))
    assert plan.source == "hub" and sorted(plan.files) == shards
    local = wd.plan(str(small_llama))
    assert [(t.name, t.fate) for t in plan.tensors] == [(t.name, t.fate) for t in local.tensors]
    # the bytes reported are the bytes the Hub sent of the weight files: each shard's header read (a first range
    # of head_guess bytes, here 4 KiB so that it is smaller than the shards: 256 KiB by default)
    assert plan.bytes_read == fake_hub.file_bytes_sent - config_bytes
    weights = sum(p.stat().st_size for p in small_llama.glob("*.safetensors"))
    assert plan.bytes_read <= len(shards) * 4096 < weights / 50


def _column_table(columns) -> str:
    lines = ["| column | type | what it holds |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in columns]
    return "\n".join(lines)


def test_docs_tables_are_the_declared_columns():
    """docs/tables.md's column tables are generated from the code's declarations (they cannot drift)."""
    from weightdiag.database.export import MODEL_COLUMNS
    from weightdiag.record.table import MATRIX_COLUMNS, ROW_KEY_COLUMNS
    from weightdiag.run.plan import PLAN_COLUMNS

    doc = (ROOT / "docs" / "tables.md").read_text()
    for columns in (ROW_KEY_COLUMNS, MATRIX_COLUMNS, MODEL_COLUMNS, PLAN_COLUMNS):
        assert _column_table(columns) in doc, "regenerate docs/tables.md's table:\n" + _column_table(columns)


def test_fit_plan_on_the_command_line(small_neox, tmp_path):
    """`fit MODEL --plan`: the plan's table (or --json: Plan.to_json()); nothing is fitted or written."""
    import json

    from .conftest import run_cli

    db = tmp_path / "db"
    out = run_cli("fit", str(small_neox), "--plan", "--json", "--db", str(db))
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document == wd.plan(str(small_neox)).to_json()
    assert document["counts"]["matrix"] > 0 and not db.exists()
    out = run_cli("fit", str(small_neox), "--plan", "--db", str(db), env={"COLUMNS": "300"})
    assert out.returncode == 0 and "qkv" in out.stdout and "q+k+v" in out.stdout and "to read" in out.stdout


def test_diff_takes_plot_and_html_as_report_does(tmp_path):
    """One vocabulary: `plot` and `html` on diff as on report; the older plot_dir/html_file still taken, and the
    two names for two places refused (exit code 2) before any model is read."""
    import inspect

    from weightdiag import api

    for verb in (api.diff, api.report):
        assert {"plot", "html"} <= set(inspect.signature(verb).parameters)
    with pytest.raises(wd.BadInputError, match="plot") as caught:
        wd.diff("no/such-base", "no/such-tuned", plot=tmp_path / "a", plot_dir=tmp_path / "b")
    assert caught.value.exit_code == 2


# --- one vocabulary of parameters (docs/usage.md, "From Python: one vocabulary of parameters") --------------------

ROOT_VERBS = ("fit", "diff", "compare", "check", "report", "sweep", "lineage", "plan", "trajectory")
# parameter -> (annotation, default), wherever a root verb takes it
VOCABULARY = {
    "db_dir": ("str | Path | None", None),
    "revision": ("str | None", None),
    "token": ("str | None", None),
    "plot": ("str | Path | None", None),
    "html": ("str | Path | None", None),
    "progress": ("Progress | None", None),
    "executor": ("str", "local"),
    "ray_address": ("str | None", None),
    "save": ("bool", "the command's"),
}
# other names for the same things, which no verb may take; diff's plot_dir and html_file, its names before plot and
# html, are still taken there (test_diff_takes_plot_and_html_as_report_does)
SYNONYMS = {"db", "database", "db_path", "out_dir", "output", "write", "no_save", "plot_dir", "html_file", "cluster"}
OLDER_NAMES = {("diff", "plot_dir"), ("diff", "html_file")}


def test_every_verb_follows_the_one_vocabulary():
    import inspect

    from weightdiag import api
    from weightdiag.cli.options import OPTIONS

    seen: set[str] = set()
    for verb in ROOT_VERBS:
        parameters = inspect.signature(getattr(api, verb)).parameters
        for name, parameter in parameters.items():
            assert name not in SYNONYMS or (verb, name) in OLDER_NAMES, (verb, name)
            if name not in VOCABULARY:
                continue
            seen.add(name)
            annotation, default = VOCABULARY[name]
            assert parameter.annotation == annotation, (verb, name, parameter.annotation)
            if name == "save":  # the library's default is the command's --save/--no-save default
                default = OPTIONS[f"save@{verb}"].default
            assert parameter.default == default, (verb, name, parameter.default)
        if verb not in ("trajectory", "plan"):  # every verb that fits or reads models takes both
            assert {"db_dir", "progress"} <= set(parameters), verb
    assert seen == set(VOCABULARY)
    signatures = {verb: inspect.signature(getattr(api, verb)).parameters for verb in ROOT_VERBS}
    saves = {verb: parameters["save"].default for verb, parameters in signatures.items() if "save" in parameters}
    assert saves == {"fit": True, "compare": True, "report": True, "diff": True, "check": False, "lineage": False}
    # the options' executor means what sweep's does: where the verb's tasks run, local or ray
    assert wd.FitOptions().executor == wd.DiffOptions().executor == "local"
    doc = (ROOT / "docs" / "usage.md").read_text()
    for name in VOCABULARY:
        assert f"`{name}`" in doc, name


def test_sweep_refuses_an_executor_in_its_fit_options(tmp_path):
    """A sweep's tasks are whole fits: where they run is sweep's executor; FitOptions' one, which would say where
    each fit's passes run, is refused (exit 2) before anything is read, never ignored."""
    with pytest.raises(wd.BadInputError, match="sweep") as caught:
        wd.sweep(str(tmp_path / "run"), options=wd.FitOptions(executor="ray"), db_dir=tmp_path / "db")
    assert caught.value.exit_code == 2 and "executor" in str(caught.value)
    with pytest.raises(wd.BadInputError, match="ray_address"):
        wd.sweep(str(tmp_path / "run"), options=wd.FitOptions(ray_address="10.0.0.1:6379"), db_dir=tmp_path / "db")
    with pytest.raises(wd.BadInputError) as other:  # the same call without: on to the next check (no such folder)
        wd.sweep(str(tmp_path / "run"), options=wd.FitOptions(), db_dir=tmp_path / "db")
    assert "FitOptions(" not in str(other.value) and "not a folder of checkpoints" in str(other.value)

"""`weightdiag report` on odd but valid inputs: a diverged checkpoint (all-NaN / all-Inf / partly
non-finite matrices and vectors), tensor names that look like rich markup or mathtext, and very long
tensor names. Each gives a correct report, in the terminal, as JSON, and with --html / --plot."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from weightdiag import api
from weightdiag.diagnose.health import health_report
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .conftest import run_cli

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

SPEC = synthetic.ModelSpec(
    n_layers=6, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=176, vocab=128, seed=3, dtype="F32", norm_spread=0.01
)
ALL_NAN = "model.layers.2.mlp.up_proj.weight"
ALL_INF = "model.layers.4.self_attn.k_proj.weight"
SOME = "model.layers.1.self_attn.o_proj.weight"  # 3 NaN and 1 -Inf
NAN_NORM = "model.layers.3.input_layernorm.weight"
EMBED_INF = "model.embed_tokens.weight"  # one +Inf, outside any block


def diverge(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
    if t.name == ALL_NAN or t.name == NAN_NORM:
        return np.full(x.shape, np.nan, np.float32)
    if t.name == ALL_INF:
        return np.full(x.shape, np.inf, np.float32)
    x = x.copy()
    if t.name == SOME:
        x[0, :3] = np.nan
        x[5, 7] = -np.inf
    if t.name == EMBED_INF:
        x[3, 3] = np.inf
    return x


@pytest.fixture(scope="module")
def diverged_dir(tmp_path_factory) -> Path:
    return synthetic.write_model(tmp_path_factory.mktemp("diverged"), SPEC, modify=diverge)


@pytest.fixture(scope="module")
def diverged(diverged_dir) -> dict:
    return health_report(api.fit_model(str(diverged_dir), FitOptions(device="cpu")))


def _by_tensor(report: dict) -> dict[str, dict]:
    return {f["tensor"]: f for f in report["findings"] if f["category"] == "non-finite"}


def test_each_non_finite_tensor_is_a_finding_in_its_block(diverged):
    found = _by_tensor(diverged)
    assert set(found) == {ALL_NAN, ALL_INF, SOME, NAN_NORM, EMBED_INF}
    assert {t: f["blocks"] for t, f in found.items()} == {
        ALL_NAN: [2],
        ALL_INF: [4],
        SOME: [1],
        NAN_NORM: [3],
        EMBED_INF: [],
    }
    assert all(f["severity"] == "warning" for f in found.values())
    assert (found[ALL_NAN]["n_nan"], found[ALL_NAN]["n_inf"], found[ALL_NAN]["numel"]) == (176 * 64, 0, 176 * 64)
    assert (found[ALL_INF]["n_nan"], found[ALL_INF]["n_inf"]) == (0, 32 * 64)
    assert (found[SOME]["n_nan"], found[SOME]["n_inf"], found[SOME]["value"]) == (3, 1, 4)
    assert found[NAN_NORM]["value"] == 64
    assert (found[EMBED_INF]["n_inf"], found[EMBED_INF]["numel"]) == (1, 128 * 64)
    text = {t: f["text"] for t, f in found.items()}
    assert f"matrix {ALL_NAN} is all NaN (11,264 values)" in text[ALL_NAN]
    assert f"matrix {ALL_INF} is all Inf (2,048 values)" in text[ALL_INF]
    assert f"matrix {SOME} has 3 NaN and 1 Inf among its 4,096 values" in text[SOME]
    assert "its statistics and fit use the 4,092 finite values only" in text[SOME]
    assert text[ALL_NAN].startswith("block 2 mlp.up_proj:")
    assert text[EMBED_INF].startswith("model ")
    assert all("the checkpoint diverged or is corrupt" in t for t in text.values())


def test_the_rest_of_a_diverged_report_still_works(diverged):
    # No other finding: the null model around the broken tensors is clean.
    assert {f["category"] for f in diverged["findings"]} == {"non-finite"}
    # Blocks next to a matrix with no statistic are not "indistinguishable" from it.
    change = diverged["depth"]["adjacent_change"]
    assert change["2"] is None
    assert change["3"] is None
    assert change["4"] is None
    assert change["5"] is None
    assert change["1"] is not None
    assert diverged["blocks"][2]["kinds"]["up"]["k"] is None
    assert diverged["blocks"][2]["kinds"]["gate"]["k"] > 1
    assert len(diverged["super_weights"]["top"]) == 10
    json.dumps(diverged, allow_nan=False)  # the CLI's --json must not meet a NaN


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_cli_report_on_a_diverged_checkpoint(diverged_dir, tmp_path, extra):
    # The table run in a fresh interpreter: no warning on its stderr from start-up on (numpy, matplotlib).
    out = run_cli("report", str(diverged_dir), "--db", str(tmp_path / "db"), "--no-save", *extra, real=not extra)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr
    assert "Traceback" not in out.stderr
    if extra:
        found = {f["tensor"] for f in json.loads(out.stdout)["findings"] if f["category"] == "non-finite"}
        assert len(found) == 5
    else:
        assert "is all NaN (11,264 values)" in out.stdout.replace("\n", " ")


@pytest.mark.e2e
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="plots need the weightdiag[plot] extra (matplotlib)")
def test_html_and_plots_of_a_diverged_checkpoint(diverged_dir, tmp_path):
    page, plots = tmp_path / "r.html", tmp_path / "plots"
    out = run_cli(
        *("report", str(diverged_dir), "--db", str(tmp_path / "db"), "--no-save", "--quiet"),
        *("--html", str(page), "--plot", str(plots), "--hist", ALL_NAN, "--hist", SOME, "--hist", ALL_INF),
    )
    assert out.returncode == 0, out.stderr
    html = page.read_text()
    assert "is all NaN (11,264 values)" in html
    assert "has 3 NaN and 1 Inf among its 4,096 values" in html
    assert (plots / f"hist_{ALL_NAN}.png").stat().st_size > 0
    assert (plots / f"hist_{SOME}.png").exists()
    assert "no nonzero finite |w|" in html  # the placeholder of the all-NaN / all-Inf histograms


def _odd_model(folder: Path, extra: list[str]) -> Path:
    """Four 6-block Llama-like sub-layers plus `extra` matrices, each with one outlier (so they top the
    super-weight table)."""
    rng = np.random.default_rng(0)
    tensors = {}
    for b in range(6):
        for name, shape in (
            ("self_attn.q_proj", (64, 64)),
            ("self_attn.k_proj", (64, 64)),
            ("mlp.up_proj", (128, 64)),
            ("mlp.down_proj", (64, 128)),
        ):
            tensors[f"model.layers.{b}.{name}.weight"] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        tensors[f"model.layers.{b}.input_layernorm.weight"] = (1 + 0.01 * rng.standard_normal(64)).astype(np.float32)
    for name in extra:
        x = (rng.standard_normal((64, 64)) * 0.02).astype(np.float32)
        x[1, 2] = 5.0
        tensors[name] = x
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


MARKUP = [
    "[/]",
    "[bold]x[/bold]\\[",
    "model.layers.2.self_attn.[bold]o_proj[/].weight",
    "model.layers.3.mlp.gate_proj.weight[/]",
    "model.layers.1.mlp.up_proj.$\\frac{a$.weight",
]


@pytest.mark.e2e
def test_markup_in_tensor_names_is_printed_as_is(tmp_path):
    folder = _odd_model(tmp_path / "m", MARKUP)
    out = run_cli("report", str(folder), "--db", str(tmp_path / "db"), "--no-save")
    assert out.returncode == 0, out.stderr
    for name in MARKUP:
        assert name in out.stdout, name
    row = json.loads(run_cli("report", str(folder), "--db", str(tmp_path / "db"), "--no-save", "--json").stdout)
    assert {t["tensor"] for t in row["super_weights"]["top"]} >= set(MARKUP[:4])


@pytest.mark.e2e
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="plots need the weightdiag[plot] extra (matplotlib)")
def test_markup_and_mathtext_names_in_html_and_plots(tmp_path):
    import html as html_lib

    folder = _odd_model(tmp_path / "m", MARKUP)
    page, plots = tmp_path / "r.html", tmp_path / "plots"
    out = run_cli(
        *("report", str(folder), "--db", str(tmp_path / "db"), "--no-save", "--quiet"),
        *("--html", str(page), "--plot", str(plots), *[a for n in MARKUP for a in ("--hist", glob_of(n))]),
    )
    assert out.returncode == 0, out.stderr
    text = page.read_text()
    assert "<bold>" not in text
    assert html_lib.escape("[bold]o_proj[/]") in text
    hists = sorted(p.name for p in plots.glob("hist_*.png"))
    assert len(hists) == len(MARKUP)  # odd names never share (and overwrite) one file


def glob_of(name: str) -> str:
    """An fnmatch pattern matching `name` literally ('[' is a glob class)."""
    return "".join("[[]" if c == "[" else c for c in name)


@pytest.mark.e2e
def test_very_long_tensor_names(tmp_path):
    long_names = ["model.layers.1." + "a" * 200_000 + ".weight", "x" * 200_000]
    folder = _odd_model(tmp_path / "long", long_names)
    out = run_cli("report", str(folder), "--db", str(tmp_path / "db"), "--no-save", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {t["tensor"] for t in report["super_weights"]["top"]} >= set(long_names)  # JSON keeps names whole
    assert all(len(line) < 2000 for line in report["observations"])  # text shortens them
    assert all(len(f["text"]) < 2000 for f in report["findings"])
    out = run_cli("report", str(folder), "--db", str(tmp_path / "db"), "--no-save")
    assert out.returncode == 0, out.stderr
    assert max(len(line) for line in out.stdout.splitlines()) < 2000

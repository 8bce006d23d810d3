"""`weightdiag report`: planted anomalies found (and nothing else), real MiniLM and SmolLM2 GGUF
reports, the robust helpers, plots and the HTML page, and the CLI's errors."""

from __future__ import annotations

import base64
import html
import io
import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from weightdiag import api
from weightdiag.diagnose import health
from weightdiag.diagnose.health import health_report
from weightdiag.errors import BadInputError
from weightdiag.render.health_view import report_view
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .conftest import run_cli

SPEC = synthetic.ModelSpec(n_layers=12, d_model=256, n_heads=4, n_kv_heads=2, ffn_size=688, vocab=1024, seed=11)
COLLAPSED = "model.layers.3.post_attention_layernorm.weight"
EXPLODED = "model.layers.9.input_layernorm.weight"
SUPER = "model.layers.2.mlp.down_proj.weight"
SUPER_AT = (17, 301)
BAND = (5, 6, 7)
SECOND_POPULATION = "model.layers.1.mlp.up_proj.weight"


def plant(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
    """One collapsed norm, one exploded norm, one super weight, a heavy-tailed Q/K band, a second population."""
    rng = np.random.default_rng(zlib.crc32(t.name.encode()))
    if t.name == COLLAPSED:
        return x * 0.2
    if t.name == EXPLODED:
        return x * 2.5
    if t.name == SUPER:
        x = x.copy()
        x[SUPER_AT] = 50 * t.sigma
        return x
    if t.kind in ("q", "k") and t.block in BAND:  # Student-t(2.5) scaled to the same std
        return (rng.standard_t(2.5, size=t.shape) * t.sigma / np.sqrt(5)).astype(np.float32)
    if t.name == SECOND_POPULATION:  # 30% of the values at 1/30 of the scale
        x = x.copy()
        x[rng.random(t.shape) < 0.3] /= 30
        return x
    return x


def _fit(folder: Path) -> dict:
    return api.fit_model(str(folder), FitOptions(device="cpu"))


@pytest.fixture(scope="module")
def planted_dir(tmp_path_factory) -> Path:
    return synthetic.write_model(tmp_path_factory.mktemp("planted"), SPEC, modify=plant)


@pytest.fixture(scope="module")
def planted(planted_dir, cpu_fit) -> dict:
    return health_report(cpu_fit(planted_dir))


@pytest.fixture(scope="module")
def minilm_report(minilm_dir, cpu_fit) -> dict:
    return health_report(cpu_fit(minilm_dir))


@pytest.fixture(scope="module")
def smollm_report(smollm_gguf, cpu_fit) -> dict:
    return health_report(cpu_fit(smollm_gguf))


def _render(report: dict) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=160, color_system=None).print(report_view(report))
    return buffer.getvalue()


# --- acceptance 2: the planted model ---------------------------------------------------------------


def test_planted_anomalies_are_found_and_nothing_else(planted):
    found = {(f["category"], tuple(f["blocks"])): f for f in planted["findings"]}
    assert set(found) == {
        ("second-population", (1,)),
        ("super-weight", (2,)),
        ("norm-collapse", (3,)),
        ("selection", BAND),
        ("norm-explosion", (9,)),
    }
    collapse = found[("norm-collapse", (3,))]
    assert collapse["tensor"] == COLLAPSED
    assert collapse["value"] == pytest.approx(0.2, abs=1e-3)
    assert "collapse below 0.4 √d" in collapse["text"]
    assert collapse["deviation"] < -5
    explosion = found[("norm-explosion", (9,))]
    assert explosion["tensor"] == EXPLODED
    assert explosion["value"] == pytest.approx(2.5, abs=1e-3)
    sw = found[("super-weight", (2,))]
    assert sw["tensor"] == SUPER
    assert sw["statistic"] == "max_over_q99"
    assert sw["deviation"] > 5
    assert "at (17, 301)" in sw["text"]
    assert "super-weight signature" in sw["text"]
    band = found[("selection", BAND)]
    assert sorted(band["kinds"]) == ["k", "q"]
    assert band["statistic"] == "k"
    assert set(band["tensors"]) == {f"model.layers.{b}.self_attn.{p}_proj.weight" for b in BAND for p in "qk"}
    assert band["value"] < 1.12 < 1.19 < band["expected"]
    assert "Selection" in band["reason"]
    second = found[("second-population", (1,))]
    assert second["tensor"] == SECOND_POPULATION
    assert second["value"] < 0.7
    assert "regime B" in second["text"]
    # Each finding is a sentence with the value, the expectation and the robust deviation.
    for f in planted["findings"]:
        assert f["text"].startswith("block")
        assert "vs" in f["text"]
        assert f["expected"] is not None


def test_planted_super_weight_and_shallow_sections(planted):
    top = {t["tensor"]: t for t in planted["super_weights"]["top"]}
    assert top[SUPER]["index"] == list(SUPER_AT)
    assert top[SUPER]["abs_value"] == pytest.approx(1.0)
    assert planted["shallow_ffn"]["regime"] == "B"
    assert [m["tensor"] for m in planted["shallow_ffn"]["matrices"] if m["second_population"]] == [SECOND_POPULATION]
    block3 = planted["blocks"][3]
    assert block3["norms"]["ffn"] == pytest.approx(0.2, abs=1e-3)
    assert block3["findings"]
    assert planted["depth"]["placement"] == "pre"
    assert any("untrained or synthetic" in line for line in planted["observations"])


def test_plain_gaussian_model_has_no_findings(tmp_path):
    report = health_report(_fit(synthetic.write_model(tmp_path, SPEC)))
    assert report["findings"] == []
    assert report["norms"]["model_wide"] == ["at init"]
    assert "no block stands out" in _render(report)


# --- acceptance 1: real weights ---------------------------------------------------------------------


def test_minilm_report_post_ln(minilm_report):
    arch = minilm_report["architecture"]
    assert arch["family"] == "bert"
    assert arch["norm_placement"] == "post"
    assert arch["attention"] == "MHA"
    assert arch["biases"] == ("q", "k", "v", "o", "ffn_in", "ffn_out")
    assert minilm_report["depth"]["reading"].startswith("Post-LN: the Curse of Depth is a Pre-LN effect")
    assert any(line.startswith("Post-LN") for line in minilm_report["observations"])
    # Every norm weight of MiniLM shrank healthily; the embedding norm is singled out.
    assert minilm_report["norms"]["block_regimes"] == {"healthy shrink": 12}
    assert [r["site"] for r in minilm_report["norms"]["singled_out"]] == ["embed"]
    # Its outliers: hidden dimension 99, fed by one FFN neuron in block 0 (856).
    assert minilm_report["super_weights"]["channels"][0]["hidden_index"] == 99
    assert {"block": 0, "neuron": 856, "hidden_index": 99} in [
        {k: n[k] for k in ("block", "neuron", "hidden_index")} for n in minilm_report["super_weights"]["ffn_neurons"]
    ]
    assert minilm_report["super_weights"]["table2"]["median_max_over_q99"]["position"] == "inside"
    assert any(f["category"] == "super-weight" and f["blocks"] == [0] for f in minilm_report["findings"])
    text = _render(minilm_report)
    assert "blocks: shape and tails" in text
    assert "Findings (" in text
    assert "super-weight candidates" in text


def test_smollm2_gguf_report(smollm_report):
    arch = smollm_report["architecture"]
    assert arch["attention"] == "GQA 3:1"
    assert arch["heads"] == "9:3"
    assert arch["norm_type"] == "rmsnorm"
    assert arch["norm_placement"] == "pre"
    assert not arch["qk_norm"]
    quant = smollm_report["quantization"]
    assert quant["types"] == {"Q4_1": 210, "Q8_0": 1}
    assert any("Q4_1" in line for line in smollm_report["observations"])
    # Low-bit quantized Q/K are never labelled Selection: classes withheld, no selection finding.
    for b in smollm_report["blocks"]:
        for kind in ("q", "k"):
            assert b["kinds"][kind]["class"] == "withheld (quantized)"
            assert b["kinds"][kind]["quant"] == "Q4_1"
    assert smollm_report["depth"]["selection"]["q"]["withheld"] == 30
    assert not any("Selection" in f["text"] or f["category"] == "selection" for f in smollm_report["findings"])
    # Norms: model-wide below 0.4 sqrt(d) (one notice, not 57 warnings); the final norm singled out.
    final = [r for r in smollm_report["norms"]["singled_out"] if r["site"] == "final"]
    assert final
    assert final[0]["regime"] == "explosion"
    assert smollm_report["norms"]["model_wide"] == ["collapse"]
    assert sum(f["category"].startswith("norm-collapse") for f in smollm_report["findings"]) == 1
    # What makes block 0 special is said, with evidence.
    block0 = [f for f in smollm_report["findings"] if f["blocks"] == [0]]
    assert {f["kind"] for f in block0} >= {"k", "o", "v", "norm"}
    text = _render(smollm_report)
    assert "blocks: structure and scale" in text
    assert "withheld" in text


# --- the robust building blocks ---------------------------------------------------------------------


def test_theil_sen_and_robust_scale():
    x = np.arange(12.0)
    y = 0.5 * x + 1
    y[[3, 7]] += 40  # outliers do not move the line
    assert health.theil_sen(x, y) == pytest.approx((0.5, 1.0))
    assert health.robust_scale(np.zeros(10), 0.01) == 0.01  # the floor: identical blocks never divide by 0
    assert health.robust_scale(np.array([0, 1, -1, 2, -2.0]), 0.01) == pytest.approx(1.4826)


def test_norm_regimes_follow_seed_001():
    d = 1024
    assert health.norm_regime(32.0, d, 1.0, 1.0) == "at init"
    # Trained: entries vary ~1% around 1, so ||gamma|| is within 0.01 of sqrt(d) but the vector moved.
    assert health.norm_regime(32.0016, d, 0.97, 1.03) == "grown (within band)"
    assert health.norm_regime(31.99, d, 0.99, 1.0) == "healthy shrink"
    assert health.norm_regime(32.0, d) != "at init"
    assert health.norm_regime(0.39 * 32, d) == "collapse"
    assert health.norm_regime(0.41 * 32, d) == "healthy shrink"
    assert health.norm_regime(1.81 * 32, d) == "explosion"
    assert health.norm_regime(1.5 * 32, d) == "grown (within band)"


def test_pooled_block_statistics():
    assert health.pooled_q99([(1000, 2.0, 1.2), (3000, 2.0, 0.9)]) == pytest.approx(2.0)
    q = health.pooled_q99([(1000, 1.0, 1.2), (1000, 3.0, 1.2)])
    assert 1.0 < q < 3.0
    assert health.pooled_kurtosis([(100, 0.0, 1.0, 0.0), (300, 0.0, 1.0, 0.0)]) == pytest.approx(0.0)
    # Two zero-mean Gaussians of different scale: a scale mixture is heavy-tailed.
    mix = health.pooled_kurtosis([(1, 0.0, 1.0, 0.0), (1, 0.0, 3.0, 0.0)])
    assert mix == pytest.approx(3 * (1 + 81) / 2 / ((1 + 9) / 2) ** 2 - 3)


def test_quantization_notes():
    rec = {
        "note": "GGUF Q4_1, dequantized",
        "stats": {"distinct_values": 3000, "numel": 10**6},
        "fits": {"mid80": {"r2": 0.999}},
    }
    q = health.quantization_of(rec)
    assert q["type"] == "Q4_1"
    assert q["bits"] == 4
    assert "moves k by +0.00 to +0.06" in q["why"]
    grid = {"stats": {"distinct_values": 15, "numel": 10**6}, "fits": {"mid80": {"r2": 0.9}}}
    assert "only 15 distinct values" in health.quantization_of(grid)["why"]
    assert health.quantization_of({"stats": {"distinct_values": 3000, "numel": 10**6}, "fits": {"mid80": {}}}) is None


def test_few_blocks_and_fused_qkv(small_llama, tmp_path):
    report = health_report(_fit(small_llama))
    assert report["findings"] == []
    assert any("too few for a depth trend" in line for line in report["observations"])
    neox = synthetic.ModelSpec(family="gpt_neox", n_layers=6, d_model=128, n_heads=4, ffn_size=512, vocab=256)
    report = health_report(_fit(synthetic.write_model(tmp_path, neox)))
    assert {"qkv", "qkv[q]", "qkv[k]", "qkv[v]"} <= set(report["blocks"][0]["kinds"])
    assert report["findings"] == []
    assert report["architecture"]["attention"] == "MHA (fused qkv)"
    _render(report)


def test_cohort_summary_row_is_refused():
    with pytest.raises(BadInputError, match="cohort summary"):
        health_report(api.resolve_row("pythia-70m")[0])


def test_missing_matplotlib_is_one_clear_error(monkeypatch):
    from weightdiag.render import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(BadInputError, match=r"pip install matplotlib"):
        plots.require_matplotlib()


# --- acceptance 3: the CLI, plots and the HTML page ------------------------------------------------------


@pytest.mark.e2e
def test_cli_plots_and_html(planted_dir, tmp_path):
    plots, page = tmp_path / "plots", tmp_path / "report.html"
    out = run_cli(
        "report",
        str(planted_dir),
        "--db",
        str(tmp_path / "db"),
        "--plot",
        str(plots),
        "--html",
        str(page),
        "--hist",
        SUPER,
    )  # fmt: skip (no -q: it would silence the "plots written" line)
    assert out.returncode == 0, out.stderr
    assert "Findings (5)" in out.stdout
    assert f"plots written to {plots}" in out.stderr
    pngs = sorted(plots.glob("*.png"))
    names = {p.name for p in pngs}
    assert {"heatmap_k.png", "depth_profile.png", "norms.png", f"hist_{SUPER}.png"} <= names
    text = page.read_text()
    for png in pngs:
        data = png.read_bytes()
        assert len(data) > 5000
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        assert f'data-file="{png.name}"' in text
        assert base64.b64encode(data).decode() in text
    report = json.loads(run_cli("report", str(planted_dir), "--db", str(tmp_path / "db"), "--json", "-q").stdout)
    for finding in report["findings"]:
        assert html.escape(finding["text"]) in text


@pytest.mark.e2e
def test_cli_default_histograms_and_row_file(planted_dir, tmp_path):
    db = tmp_path / "db"
    assert run_cli("fit", str(planted_dir), "--db", str(db), "-q").returncode == 0
    row_file = next((db / "rows").glob("*.json"))
    out = run_cli("report", str(row_file), "--plot", str(tmp_path / "p1"), "--json", "-q")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    hists = sorted(p.name for p in (tmp_path / "p1").glob("hist_*.png"))
    assert f"hist_{SUPER}.png" in hists
    assert f"hist_{SECOND_POPULATION}.png" in hists
    assert len(hists) == 3
    assert report["model"]["how"] == "row file"
    assert len(report["plots"]) == 6
    # A row whose model is gone: the other plots, and a note instead of the histograms.
    row = json.loads(row_file.read_text())
    row["model"]["location"] = str(tmp_path / "gone")
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(row))
    out = run_cli("report", str(moved), "--plot", str(tmp_path / "p2"), "-q")
    assert out.returncode == 0, out.stderr
    assert "histograms skipped" in out.stderr
    assert (tmp_path / "p2" / "heatmap_k.png").exists()
    assert not list((tmp_path / "p2").glob("hist_*.png"))


@pytest.mark.e2e
def test_cli_errors_are_one_line(tmp_path, minilm_dir):
    out = run_cli("report", "olmo-1-7b", "--db", str(tmp_path))
    assert out.returncode == 2
    assert "cohort summary" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = run_cli("report", str(minilm_dir), "--db", str(tmp_path), "--hist", "nope.*", "--plot", str(tmp_path / "p"))
    assert out.returncode == 2
    assert "--hist 'nope.*' matches no fitted matrix" in out.stderr
    out = run_cli("report", str(minilm_dir), "--db", str(tmp_path), "--hist", "x")
    assert out.returncode == 2
    assert "--hist draws into --plot DIR or --html FILE" in out.stderr


@pytest.mark.e2e
def test_cli_minilm_json(minilm_dir, tmp_path):
    out = run_cli("report", str(minilm_dir), "--db", str(tmp_path), "--json", "-q", real=True)  # its own process
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["schema"] == "weightdiag.report/1"
    assert report["architecture"]["norm_placement"] == "post"
    assert report["model"]["how"] == "fitted"
    assert len(report["blocks"]) == 6


@pytest.mark.parametrize("target", ["html-is-a-folder", "plot-is-a-file"])
def test_unwritable_plot_or_html_is_bad_input_before_the_fit(planted_dir, tmp_path, target):
    """--html onto a folder or --plot onto a file: exit 2 with one line, before anything is fitted or saved."""
    pytest.importorskip("matplotlib")
    db = tmp_path / "db"
    if target == "html-is-a-folder":
        (tmp_path / "page").mkdir()
        args = ["--html", str(tmp_path / "page")]
    else:
        (tmp_path / "plots").write_text("not a folder")
        args = ["--plot", str(tmp_path / "plots")]
    out = run_cli("report", str(planted_dir), "--db", str(db), *args)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("error: --")
    assert len(out.stderr.strip().splitlines()) == 1
    assert not db.exists()

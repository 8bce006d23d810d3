"""MoE layers in the report: per-layer medians and spreads of k and λ across the routed experts, outlier
experts named by a robust rule (null checkpoints with realistic expert-to-expert variation flag nothing;
planted outlier experts are flagged, and only they), shared experts and routers kept apart."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from weightdiag.diagnose.health import health_report
from weightdiag.diagnose.health.experts import MIN_EXPERTS, expert_outliers
from weightdiag.render.health_view import report_view
from weightdiag.render.html import render_html

from .report_checkpoints import MoESpec, scaled, write_qwen2_moe


def laplace(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    """A Laplace body (k about 1.0 against the experts' 1.16-1.23): heavier tails at the same std."""
    return (rng.laplace(size=shape) * sigma / np.sqrt(2)).astype(np.float32)


PLANTS = {(2, 5, "up"): laplace, (4, 11, "down"): scaled(2.5), (1, 3, "gate"): scaled(0.4)}
EXPECTED = {(2, 5, "up", "k", False), (4, 11, "down", "lambda", True), (1, 3, "gate", "lambda", False)}


def _render(report: dict) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(report_view({**report, "model": {**report["model"]}}))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def planted(tmp_path_factory, cpu_fit) -> dict:
    return health_report(cpu_fit(write_qwen2_moe(tmp_path_factory.mktemp("moe"), MoESpec(seed=1), PLANTS)))


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_null_moe_checkpoints_flag_no_expert(seed, tmp_path, cpu_fit):
    report = health_report(cpu_fit(write_qwen2_moe(tmp_path / "m", MoESpec(seed=seed))))
    moe = report["moe"]
    assert moe["outliers"] == []
    assert report["findings"] == []  # nor anything else: expert medians, shared experts and routers are all alike
    assert len(moe["layers"]) == 6
    for layer in moe["layers"]:
        assert layer["experts"] == 16
        assert set(layer["kinds"]) == {"gate", "up", "down"}
        for e in layer["kinds"].values():
            assert e["n"] == 16
            # Realistic variation is there, and reported: experts differ by a few hundredths in k, ~5-20% in λ.
            assert 0.003 < e["k_spread"] < 0.06
            assert 0.02 < e["lambda_spread"] < 0.3
            assert e["k_min"] <= e["k_median"] <= e["k_max"]
    assert any("no expert stands out from its layer" in o for o in report["observations"])


def test_planted_outlier_experts_are_flagged_and_nothing_else(planted):
    moe = planted["moe"]
    got = {(o["block"], o["expert"], o["kind"], o["statistic"], o["z"] > 0) for o in moe["outliers"]}
    assert got == EXPECTED
    findings = planted["findings"]
    assert {f["category"] for f in findings} == {"expert-outlier"}
    assert {(f["blocks"][0], f["expert"], f["kinds"][0]) for f in findings} == {(b, e, k) for b, e, k, *_ in EXPECTED}
    lam = next(f for f in findings if f["expert"] == 11)
    assert lam["tensor"] == "model.layers.4.mlp.experts.11.down_proj.weight"
    assert lam["statistic"] == "lambda" and lam["value"] / lam["expected"] == pytest.approx(2.5, rel=0.1)
    assert "median of the layer's 16 experts" in lam["text"] and "larger weights" in lam["text"]
    heavy = next(f for f in findings if f["expert"] == 5)
    assert heavy["statistic"] == "k" and heavy["value"] < heavy["expected"] - 0.1
    assert heavy["text"].startswith("block 2 mlp.experts.5.up_proj: k ")
    layer4 = next(x for x in moe["layers"] if x["block"] == 4)
    assert layer4["kinds"]["down"]["outliers"] == [11]
    line = next(o for o in planted["observations"] if o.startswith("MoE:"))
    assert "block 4 expert 11 down" in line and "seed" not in line


def test_shared_experts_and_routers_are_kept_apart(planted):
    layer = planted["moe"]["layers"][0]
    assert set(layer["shared"]) == {"gate", "up", "down"}
    assert layer["shared"]["gate"]["tensor"] == "model.layers.0.mlp.shared_expert.gate_proj.weight"
    assert {r["tensor"] for r in layer["routers"]} == {
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
    }
    # The block table's gate cell is the median of the 16 routed experts, never the shared expert.
    block0 = planted["blocks"][0]
    assert block0["experts"] == 16
    assert block0["kinds"]["gate"]["tensor"] == "16 experts of gate"
    assert block0["kinds"]["gate"]["k"] == pytest.approx(layer["kinds"]["gate"]["k_median"])
    # The shared expert's matrices have their own depth series ('shared:gate'), not pooled with the experts.
    assert "shared:gate" not in planted["depth"]["series"]  # the depth table lists the model's kinds only


def test_moe_table_and_html(planted):
    text = _render(planted)
    assert "MoE layers: routed experts per kind" in text
    assert "e11 down λ" in text and "e5 up k" in text and "e3 gate λ" in text
    assert "shared k gate" in text and "router k" in text
    html = render_html(planted, [])
    assert "<h2>MoE layers</h2>" in html and "e11 down λ" in html


def test_the_rule_on_plain_numbers():
    """Median and MAD over a layer's experts; fewer than MIN_EXPERTS: listed, never singled out."""

    def rec(e: int, k: float, lam: float = 0.02) -> dict:
        return {"name": f"e{e}", "expert": e, "numel": 1 << 20, "fits": {"mid80": {"ok": True, "k": k, "lambda": lam}}}

    ks = [1.18, 1.19, 1.2, 1.21, 1.2, 1.19, 1.185, 1.195]
    summary, flagged = expert_outliers([rec(e, k) for e, k in enumerate(ks)], "k", "mid80")
    assert summary["median"] == pytest.approx(1.1925) and flagged == []
    summary, flagged = expert_outliers([rec(e, k) for e, k in enumerate([*ks, 0.9])], "k", "mid80")
    assert [f["expert"] for f in flagged] == [8]
    # A difference below the practical effect (0.05 in k) is never flagged, however tight the others are.
    tight = [1.2] * 10 + [1.17]
    assert expert_outliers([rec(e, k) for e, k in enumerate(tight)], "k", "mid80")[1] == []
    few = [rec(e, k) for e, k in enumerate([1.2, 1.2, 1.2, 0.5][: MIN_EXPERTS - 1])]
    assert expert_outliers(few, "k", "mid80")[1] == []
    lam = [rec(e, 1.2, v) for e, v in enumerate([0.02, 0.021, 0.019, 0.02, 0.0205, 0.0195, 0.06])]
    assert [f["expert"] for f in expert_outliers(lam, "lambda", "mid80")[1]] == [6]


def test_dense_model_has_no_moe_section(tmp_path, cpu_fit):
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(n_layers=5, d_model=64, n_heads=2, n_kv_heads=1, ffn_size=128, vocab=128)
    report = health_report(cpu_fit(synthetic.write_model(tmp_path / "d", spec)))
    assert report["moe"] is None
    assert all(b["experts"] == 0 for b in report["blocks"])
    assert "MoE layers" not in _render(report)

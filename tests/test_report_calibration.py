"""`weightdiag report` calibration: null checkpoints with realistic variation give no findings,
planted anomalies give exactly themselves; norm "at init" and deep-layer stagnation mean what they say."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from benchmarks import calibrate_report as cal
from weightdiag import api
from weightdiag.diagnose.health import health_report
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

SEEDS = range(8)
DEEP_ENOUGH = (12, 16, 24, 48)  # planted exactness; 6-8 blocks have less power (rates in docs/report.md)


def _report(folder: Path, spec: synthetic.ModelSpec, modify: synthetic.Modifier | None = None) -> dict:
    synthetic.write_model(folder, spec, modify=modify)
    return health_report(api.fit_model(str(folder), FitOptions(device="cpu")))


@pytest.mark.parametrize("seed", SEEDS)
def test_null_checkpoints_give_no_findings(seed, tmp_path):
    r = cal.run(cal.null(seed), tmp_path)
    assert r["false_positives"] == []


@pytest.mark.parametrize("seed", SEEDS)
def test_planted_anomalies_give_exactly_themselves(seed, tmp_path):
    r = cal.run(cal.planted(seed, DEEP_ENOUGH), tmp_path)
    assert r == {"false_positives": [], "misses": []}


@pytest.mark.parametrize("seed", [13, 21, 29])
def test_post_ln_null_models_give_no_findings(seed, tmp_path):
    """BERT-like encoders (LayerNorm after each residual add, biases everywhere) are null models too."""
    sc = cal.null(seed)
    assert sc.spec.family == "bert"
    synthetic.write_model(tmp_path, sc.spec)
    report = health_report(api.fit_model(str(tmp_path), FitOptions(device="cpu")))
    assert report["architecture"]["norm_placement"] == "post"
    assert report["findings"] == []


def test_score_counts_misses_and_false_positives():
    found = {"category": "scale", "blocks": [3], "kinds": ["v"], "tensors": ["x"], "reason": "larger", "text": "t"}
    e = cal.Expected("scale", [3], "v@3", "larger")
    assert cal.score({"findings": [found]}, [e]) == {"false_positives": [], "misses": []}
    assert cal.score({"findings": [found]}, [cal.Expected("scale", [4], "v@4")]) == {
        "false_positives": ["t"],
        "misses": ["scale [4] v@4"],
    }


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("WEIGHTDIAG_SLOW"), reason="the 40-seed sweep: set WEIGHTDIAG_SLOW=1")
def test_calibration_sweep_rates():
    """The sweep quoted in docs/report.md: no false finding on any null model."""
    out = cal.sweep(range(40))
    assert out["fp"] == 0
    assert out["missed"] <= 0.05 * out["planted"]
    assert out["extra"] <= 0.05 * out["planted"]


def test_trained_norms_with_spread_are_not_at_init(tmp_path):
    """The issue's case: norms varying ~1% around 1 have ||gamma|| within 0.01 of sqrt(d) but are trained."""
    spec = synthetic.ModelSpec(n_layers=12, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=352, vocab=256, seed=3)
    spec.norm_spread = 0.01
    report = _report(tmp_path, spec)
    assert report["norms"]["block_regimes"].get("at init", 0) == 0
    assert report["findings"] == []
    assert report["depth"]["init_like_blocks"] == []
    assert not any("untrained" in line for line in report["observations"])


def test_untrained_checkpoint_is_said_once(tmp_path):
    spec = synthetic.ModelSpec(n_layers=8, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=176, vocab=256, seed=4)
    report = _report(tmp_path, spec)
    said = [line for line in report["observations"] if "untrained" in line]
    assert len(said) == 1
    assert "all-ones init" in said[0]
    assert "8 of 8 blocks" in said[0]
    assert report["findings"] == []


def _moved(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
    """A trained look: heavier-tailed matrices (a Gaussian scale mixture) and norms with spread."""
    rng = np.random.default_rng(t.block or 0)
    if t.fill is not None:
        return (x * (1 + 0.02 * rng.standard_normal(x.shape))).astype(np.float32) if t.fill else x
    return (x * np.exp(0.4 * rng.standard_normal(x.shape) - 0.16)).astype(np.float32)


def test_deep_layer_stagnation_is_deep_blocks_only(tmp_path):
    spec = synthetic.ModelSpec(n_layers=12, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=176, vocab=256, seed=5)

    def deep_stuck(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
        # Blocks 9-11 keep their init (Gaussian, all-ones norms); block 2 too, but it is shallow.
        return x if t.block is None or t.block in (2, 9, 10, 11) else _moved(t, x)

    report = _report(tmp_path / "deep", spec, deep_stuck)
    stagnant = [f for f in report["findings"] if f["category"] == "init-like"]
    assert sorted(b for f in stagnant for b in f["blocks"]) == [9, 10, 11]
    assert report["depth"]["init_like_blocks"] == [2, 9, 10, 11]


def test_no_stagnation_when_all_blocks_look_alike(tmp_path):
    """Every block Gaussian; one deep block's norms exactly at init: that norm is worth saying, stagnation is not."""
    spec = synthetic.ModelSpec(n_layers=12, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=176, vocab=256, seed=6)
    spec.norm_spread = 0.01

    def one_at_init(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
        return np.ones_like(x) if t.fill and t.block == 10 else x

    report = _report(tmp_path, spec, one_at_init)
    assert report["depth"]["init_like_blocks"] == [10]
    assert not any(f["category"] == "init-like" for f in report["findings"])
    assert {f["category"] for f in report["findings"]} <= {"norm-at-init"}


def test_synthetic_variation_knobs():
    plain = synthetic.ModelSpec(n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=176, vocab=64)
    assert all(t.sigma == 0.02 and t.spread == 0 for t in plain.tensors())  # defaults: the model at its init
    varied = synthetic.ModelSpec(**{**plain.__dict__, "depth_trend": 0.5, "block_jitter": 0.1, "norm_spread": 0.01})
    q = [t.sigma for t in varied.tensors() if t.kind == "q"]
    assert q[-1] / q[0] == pytest.approx(1.5, rel=0.25)
    assert len(set(q)) == 4
    assert all(0.02 * 0.9 <= s / (1 + 0.5 * b / 3) <= 0.02 * 1.1 for b, s in enumerate(q))
    norm = next(t for t in varied.tensors() if t.kind == "norm" and t.block == 0)
    x = synthetic.generate(varied, norm, np.random.default_rng(0))
    assert 0.005 < x.std() < 0.02
    assert abs(x.mean() - 1) < 0.01


def test_k_departure_must_exceed_the_fit_noise_of_small_matrices():
    """A k difference of 0.055 at z 6 is a finding on a large matrix, within noise on a 64x176 one."""
    from weightdiag.diagnose.health.cuts import STATS
    from weightdiag.diagnose.health.robust import Point, effect, spot

    large = Point(3, 1.15, "t", 1.15, local=1.205, local_z=-6.0, noise=1.2 / np.sqrt(4096 * 11008))
    small = Point(3, 1.15, "t", 1.15, local=1.205, local_z=-6.0, noise=1.2 / np.sqrt(64 * 176))
    assert spot(large, STATS["k"])
    assert not spot(small, STATS["k"])
    assert effect(large, STATS["k"]) == STATS["k"].min_effect
    assert effect(small, STATS["k"]) > 0.06

"""Outlier hidden channels at any strength: the Poisson tail in log space (10,000 hits against mpmath's
exact arithmetic and scipy), and issue 18's acceptance 3, `report` on a 64-block model whose every input
projection shares one hidden column, against a null model with realistic variation and no such column."""

from __future__ import annotations

import json
import math
import zlib

import mpmath
import numpy as np
import pytest
from scipy import stats

from weightdiag.diagnose.health import health_report
from weightdiag.diagnose.health.poisson import log_poisson_sf
from weightdiag.testing import synthetic

from .conftest import run_cli


def _exact_log_sf(count: int, rate: float) -> float:
    """ln P(Poisson(rate) >= count) in 60-digit arithmetic: the regularised lower incomplete gamma P(count, rate)."""
    with mpmath.workdps(60):
        return float(mpmath.log(mpmath.gammainc(count, 0, rate, regularized=True)))


@pytest.mark.parametrize(
    ("count", "rate"),
    [(10_000, 1.0), (10_000, 0.0156), (10_000, 64.0), (10_000, 2_000.0), (10_000, 9_990.0), (10_000, 12_000.0)],
)
def test_ten_thousand_hits_against_exact_arithmetic(count, rate):
    got = log_poisson_sf(count, rate)
    assert math.isfinite(got)
    assert got == pytest.approx(_exact_log_sf(count, rate), rel=1e-10, abs=1e-12)


def test_the_float_formula_overflowed_from_172_hits():
    # The old `rate**i / math.factorial(i)` fails at i = 171 (171! > 1.8e308); the log form does not care.
    with pytest.raises(OverflowError):
        sum(math.exp(-2.0) * 2.0**i / math.factorial(i) for i in range(172))
    assert log_poisson_sf(172, 2.0) == pytest.approx(_exact_log_sf(172, 2.0), rel=1e-12)


def test_log_tail_agrees_with_scipy_over_a_grid():
    rng = np.random.default_rng(18)
    for _ in range(300):
        rate = float(10 ** rng.uniform(-3, 3.5))
        count = int(rng.integers(0, 3 * rate + 50))
        want = float(stats.poisson.logsf(count - 1, rate)) if count > 0 else 0.0
        if math.isfinite(want) and want > -700:  # where scipy's own value has not underflowed
            assert log_poisson_sf(count, rate) == pytest.approx(want, rel=1e-9, abs=1e-13), (count, rate)


def test_edge_counts_and_rates():
    assert log_poisson_sf(0, 5.0) == 0.0
    assert log_poisson_sf(-3, 5.0) == 0.0
    assert log_poisson_sf(1, 0.0) == -math.inf
    assert log_poisson_sf(1, 1e-300) == pytest.approx(math.log(1e-300))


# --- acceptance 3: 64 blocks, one shared hidden column -------------------------------------------------------

SPEC = synthetic.ModelSpec(n_layers=64, d_model=64, n_heads=2, n_kv_heads=1, ffn_size=128, vocab=128, seed=18)
COLUMN = 37
INPUTS = ("q", "k", "v", "gate", "up")


def plant_column(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
    """Column COLUMN of every q/k/v/gate/up at 10x the matrix's scale: each one's largest |w| reads dimension 37."""
    if t.block is None or t.kind not in INPUTS:
        return x
    rng = np.random.default_rng(zlib.crc32(t.name.encode()))
    x = x.copy()
    x[:, COLUMN] = rng.standard_normal(x.shape[0]) * 10 * t.sigma
    return x


def test_report_names_a_column_shared_by_every_input_projection(tmp_path):
    model = synthetic.write_model(tmp_path / "m", SPEC, modify=plant_column)
    out = run_cli("report", str(model), "--no-save", "--json", "-q")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    channels = report["super_weights"]["channels"]
    assert [c["hidden_index"] for c in channels] == [COLUMN]
    (c,) = channels
    # 320 planted hits (the old formula overflowed at 172), plus the o/down/embeddings that land on 37 by chance
    planted = {
        f"model.layers.{b}.{'self_attn' if k in 'qkv' else 'mlp'}.{k}_proj.weight" for b in range(64) for k in INPUTS
    }
    assert planted <= set(c["tensors"]) and c["count"] - 320 <= 8 and c["scope"] == "all"
    assert c["log10_chance"] < -300 and math.isfinite(c["log10_chance"])
    line = next(o for o in report["observations"] if o.startswith("outlier channels"))
    assert f"hidden dimension {COLUMN} holds the largest |w| of {c['count']} of all {c['of']} matrices" in line
    assert "Massive Activations in Large Language Models" in line and "seed" not in line
    text = run_cli("report", str(model), "--no-save", "-q")
    assert text.returncode == 0, text.stderr
    assert f"hidden dimension {COLUMN}" in text.stdout


def test_null_model_with_realistic_variation_names_no_channel(tmp_path):
    spec = synthetic.ModelSpec(**{**SPEC.__dict__, "norm_spread": 0.05, "depth_trend": 0.3, "block_jitter": 0.1})
    model = synthetic.write_model(tmp_path / "null", spec)
    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    report = health_report(api.fit_model(str(model), FitOptions(device="cpu")))
    assert report["super_weights"]["channels"] == []
    assert not any(o.startswith("outlier channels") for o in report["observations"])


def test_channel_of_a_planted_model_is_reported_on_the_stronger_scope(tmp_path):
    """Both the top-10 and the all-matrix count flag the column; the stronger evidence (all 320) is kept."""
    model = synthetic.write_model(tmp_path / "m", SPEC, modify=plant_column)
    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    row = api.fit_model(str(model), FitOptions(device="cpu"))
    top_only = health_report({**row, "matrices": [m for m in row["matrices"] if m["block"] in (None, 0, 1)]})
    (c,) = top_only["super_weights"]["channels"]
    assert c["hidden_index"] == COLUMN and c["count"] == 10  # 2 blocks x 5 inputs
    assert c["scope"] == "top"  # 10 of the top 10 (P ~ 1e-15) says more than 10 of all 16 (P ~ 1e-13)

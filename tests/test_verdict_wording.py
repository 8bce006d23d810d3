"""Verdicts of `compare` (and the k classes of `fit`, `compare`, `report`): a departure is called
out only beyond the sampling noise of k, "the band" is the paper's [1.186, 1.204], quantized
matrices get no class (one decision, three commands), encoders and other families outside the
cohort get a caveat. Every verdict is tested both ways: within noise and a real departure."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from weightdiag.codes import BIN_EDGES
from weightdiag.diagnose.classes import (
    BAND,
    INIT_ANCHOR_K,
    K_NOISE_C,
    K_NOISE_FLOOR,
    NOISE_Z,
    WITHHELD,
    WITHHELD_WHY,
    k_class_label,
    k_class_withheld,
    k_sigma,
    kind_withheld,
    median_k_sigma,
)
from weightdiag.diagnose.cohort import cohort_caveat, load_cohort
from weightdiag.diagnose.compare import compare, selection_verdict, transmission_verdict
from weightdiag.diagnose.health import health_report, quantization_of
from weightdiag.diagnose.kinds import kind_summaries
from weightdiag.fit.weibull import fit_hist1024, trim_window

from .conftest import run_cli

COHORT_RANGE = (1.1872, 1.2039)  # the 12 entries' FFN medians (test_cohort.py checks it)


# --- the noise model of k ---------------------------------------------------------------------------


def _analytic_c(lo: float, hi: float, m: int = 1500) -> float:
    """sd(k_hat) * sqrt(n) / k for a Weibull sample: the quantile-process integral of classes.py."""
    p = lo + (hi - lo) * (np.arange(m) + 0.5) / m
    y = np.log(-np.log1p(-p))
    yc = y - y.mean()
    h = yc / ((1 - p) * -np.log1p(-p))
    dp = (hi - lo) / m
    cov = np.minimum.outer(p, p) - np.outer(p, p)
    return math.sqrt(h @ cov @ h * dp * dp) / ((yc**2).sum() * dp)


def test_analytic_constant_of_the_mid80_protocol():
    c = _analytic_c(*trim_window("mid80"))
    assert c == pytest.approx(1.0207, abs=5e-4)
    assert c < K_NOISE_C < 1.25 * c  # the stored constant covers the Weibull pivot, with room for bent plots


def _half_normal_cdf(x: np.ndarray) -> np.ndarray:
    return 2 * stats.norm.cdf(x) - 1


@pytest.mark.parametrize(
    ("name", "cdf", "n", "lam"),
    [
        ("weibull 1.2", stats.weibull_min(1.2).cdf, 10**5, 0.02),
        ("weibull 0.8", stats.weibull_min(0.8).cdf, 10**6, 0.02),
        ("half-normal", _half_normal_cdf, 10**5, 0.011),
        ("half-normal", _half_normal_cdf, 10**6, 0.011),
        ("|t4|", lambda x: 2 * stats.t(4).cdf(x) - 1, 10**6, 0.037),
    ],
)
def test_k_sigma_matches_simulated_spread(name, cdf, n, lam):
    """Multinomial draws from the exact 1024-bin probabilities, fitted with the cohort protocol."""
    rng = np.random.default_rng(20261122)
    p = np.clip(np.diff(cdf(10.0**BIN_EDGES / lam)), 0, None)
    p /= p.sum()
    ks = np.array([fit_hist1024(rng.multinomial(n, p).astype(np.float64), "mid80").k for _ in range(300)])
    measured, model = ks.std(ddof=1), k_sigma(float(ks.mean()), n)
    # 300 draws estimate an sd to about 4%: the model must cover the spread and not overstate it 2x.
    assert measured < 1.08 * model, (name, n, measured, model)
    assert measured > 0.5 * model, (name, n, measured, model)


def test_bin_phase_floor_covers_the_half_normal():
    """With no sampling at all, the scale alone moves k of a half-normal (where bins meet the window)."""
    rng = np.random.default_rng(5)
    ks = []
    for _ in range(200):
        lam = math.exp(rng.uniform(math.log(0.003), math.log(0.3)))
        p = np.clip(np.diff(_half_normal_cdf(10.0**BIN_EDGES / lam)), 0, None)
        ks.append(fit_hist1024(p / p.sum() * 1e12, "mid80").k)
    assert 0.0004 < np.std(ks) < K_NOISE_FLOOR
    assert np.ptp(ks) < 2 * NOISE_Z * K_NOISE_FLOOR


def test_median_sigma_shrinks_with_blocks_but_keeps_the_floor():
    one = [_matrix("up", 0, 1.19, 4096)]
    many = [_matrix("up", b, 1.19, 4096) for b in range(32)]
    assert median_k_sigma(one) == pytest.approx(k_sigma(1.19, 4096))
    assert median_k_sigma(many) < median_k_sigma(one) / 3
    assert median_k_sigma([_matrix("up", b, 1.19, 10**9) for b in range(32)]) == pytest.approx(K_NOISE_FLOOR, rel=1e-3)
    assert median_k_sigma([]) == K_NOISE_FLOOR  # a cohort summary: no matrices, the floor only


# --- toy rows: matrices with chosen k and size -------------------------------------------------------


def _matrix(kind: str, block: int, k: float, n: int, **extra: Any) -> dict[str, Any]:
    fit = {"k": k, "lambda": 0.02, "r2": 0.999, "ks": 0.01, "points": 80, "ok": True, "reason": None}
    return {
        "name": f"model.layers.{block}.{kind}.weight",
        "block": block,
        "expert": None,
        "kind": kind,
        "class": "selection" if kind in ("q", "k") else "transmission",
        "dtype": "BF16",
        "shape": [n // 64, 64],
        "numel": n,
        "stats": {"numel": n, "n_finite": n, "zero_fraction": 0.0, "distinct_values": 30000},
        "fits": {"mid80": fit, "mid90": fit, "full": fit},
        **extra,
    }


def _toy_row(ks: dict[str, float], n: int, blocks: int = 4, **extra: Any) -> dict[str, Any]:
    """A Llama-shaped (GQA) row whose every matrix of a kind has the given k and n values."""
    row = copy.deepcopy(next(r for r in load_cohort("v9_1") if r["model"]["id"] == "llama-3-8b"))
    row["model"].update(id="toy", source="local", cohort=None)
    row["hyperparameters"] = {}
    row["matrices"] = [_matrix(kind, b, k, n, **extra) for b in range(blocks) for kind, k in ks.items()]
    row["kinds"] = kind_summaries(row["matrices"])
    row["part_kinds"] = {}
    return row


FFN = ("gate", "up", "down")


def _ffn(k: float) -> dict[str, float]:
    return {"q": 1.12, "k": 1.12, "o": 1.19, **dict.fromkeys(FFN, k)}


# --- Transmission: the FFN median against the paper's band ------------------------------------------


def test_the_issue_example_is_inside_the_papers_band():
    """1.1871 is below the cohort's data minimum 1.1872 by 0.0001 but inside the band [1.186, 1.204]."""
    t = compare(_toy_row(_ffn(1.1871), 10**6))["transmission"]
    assert t["position"] == "inside"
    assert not t["departs"]
    assert t["text"].startswith("FFN median k 1.1871 ±")
    assert "inside the paper's Transmission band [1.186, 1.204]" in t["text"]
    assert "heavier" not in t["text"]
    assert "any cohort model" not in t["text"]


def test_below_the_band_within_noise_is_not_a_departure():
    k = BAND[0] - 0.008  # 0.008 below: beyond noise for big matrices (next test), not for 64x64 ones
    small = compare(_toy_row(_ffn(k), 4096, blocks=2))
    t = small["transmission"]
    assert t["position"] == "below"
    assert not t["departs"]
    assert t["distance_to_band"] <= NOISE_Z * t["k_se"]
    assert "within noise" in t["text"]
    assert "heavier" not in t["text"]
    assert "any cohort model" not in t["text"]
    assert not any("heavier" in f for f in small["findings"])


def test_below_the_band_beyond_noise_is_a_departure():
    k = BAND[0] - 0.008
    t = compare(_toy_row(_ffn(k), 10**7, blocks=8))["transmission"]
    assert t["departs"]
    assert t["distance_to_band"] > NOISE_Z * t["k_se"]
    assert "below the paper's Transmission band [1.186, 1.204] by 0.0080" in t["text"]
    # 0.004 below is within noise even for big matrices: the band's ends carry the bin-phase floor too
    assert "within noise" in compare(_toy_row(_ffn(BAND[0] - 0.004), 10**7, blocks=8))["transmission"]["text"]
    assert "heavier-tailed FFN weights than the band" in t["text"]
    # "than any cohort model" only with the data range named as such
    assert f"outside the cohort's data range [{COHORT_RANGE[0]}, {COHORT_RANGE[1]}]" in t["text"]
    assert "heavier-tailed than any cohort model" in t["text"]


def test_above_the_band_both_ways():
    near = transmission_verdict(_toy_row(_ffn(BAND[1] + 0.002), 10**6), list(COHORT_RANGE))
    assert near["position"] == "above"
    assert not near["departs"]
    assert "within noise" in near["text"]
    far = transmission_verdict(_toy_row(_ffn(1.25), 10**6), list(COHORT_RANGE))
    assert far["departs"]
    assert "lighter-tailed FFN weights than the band" in far["text"]
    assert "closer to the half-normal init (k0 = 1.2054) than any cohort model" in far["text"]


def test_no_cohort_entry_departs_from_the_band():
    for row in load_cohort("v9_1"):
        report = compare(row)
        assert report["transmission"]["position"] == "inside", row["model"]["id"]
        assert not any("heavier" in f or "lighter" in f or "seed 00" in f for f in report["findings"])


# --- Selection: the Q/K class against the architecture group -----------------------------------------


def test_selection_class_as_predicted():
    report = compare(_toy_row(_ffn(1.19), 10**6))
    assert report["selection"]["kinds"]["q"]["class"] == "selection-mild"
    assert not report["selection"]["departs"]
    assert any(f.startswith("q: k 1.1200 is selection-mild, as GQA models are") for f in report["findings"])


def test_selection_departure_within_noise():
    """GQA predicts selection-mild (k < 1.18); 1.19 reads Transmission, 0.01 past the cut."""
    row = _toy_row({**_ffn(1.19), "q": 1.19, "k": 1.19}, 4096, blocks=2)  # the next test's k, small matrices
    v = selection_verdict(row, "q", "GQA", "selection-mild", "evidence")
    assert v["class"] == "transmission"
    assert not v["departs"]
    assert "within noise of what its architecture group (GQA) predicts" in v["text"]
    assert not compare(row)["selection"]["departs"]


def test_selection_departure_beyond_noise():
    row = _toy_row({**_ffn(1.19), "q": 1.19, "k": 1.19}, 10**7, blocks=8)
    v = selection_verdict(row, "q", "GQA", "selection-mild", "evidence")
    assert v["departs"]
    assert "is transmission, milder than its architecture group (GQA) predicts" in v["text"]
    deep = selection_verdict(_toy_row({**_ffn(1.19), "q": 0.9}, 10**6), "q", "GQA", "selection-mild", "evidence")
    assert deep["departs"]
    assert "selection-deep, more severe than" in deep["text"]


# --- quantized matrices: one decision for fit, compare and report ------------------------------------


def test_withholding_decision():
    assert k_class_withheld(_matrix("q", 0, 1.1, 10**5)) is None
    held = k_class_withheld(_matrix("q", 0, 1.1, 10**5, quantization="Q4_1"))
    assert held
    assert held.quantization == "Q4_1"
    assert held.reason == f"quantized (Q4_1): {WITHHELD_WHY}"
    old_row = k_class_withheld(_matrix("q", 0, 1.1, 10**5, note="GGUF Q8_0, dequantized"))
    assert old_row
    assert old_row.quantization == "Q8_0"  # rows written before the `quantization` field
    grid = _matrix("q", 0, 1.1, 10**5)
    grid["stats"]["distinct_values"] = 200
    assert k_class_withheld(grid).distinct_values == 200  # an int8 grid stored as F32
    nan = _matrix("q", 0, 1.1, 10**5)
    nan["stats"].update(n_finite=0, distinct_values=0)
    assert k_class_withheld(nan) is None  # an all-NaN matrix is not a grid


def test_kind_summary_withholds_class_and_flags():
    row = _toy_row({**_ffn(1.19), "q": 1.10, "k": 1.10}, 10**6, quantization="Q4_1")
    for kind in ("q", "k", "o", *FFN):
        s = row["kinds"][kind]
        assert s["k_class"] is None
        assert s["flags"] == []
        assert WITHHELD_WHY in s["k_class_withheld"]
        assert k_class_label(s) == WITHHELD
    report = compare(row)
    assert report["kinds"]["q"]["class"] == WITHHELD
    assert report["transmission"]["withheld"]
    assert not report["selection"]["departs"]
    assert "selection-mild" not in json.dumps(report["selection"]["kinds"])
    # A row saved before withholding existed (k_class selection-mild stored) is still withheld.
    stale = copy.deepcopy(row)
    for s in stale["kinds"].values():
        s.pop("k_class_withheld")
        s["k_class"] = "selection-mild"
    assert compare(stale)["kinds"]["q"]["class"] == WITHHELD
    partly = row["matrices"][:1] + _toy_row(_ffn(1.19), 10**6)["matrices"][1:]
    assert kind_withheld([m for m in partly if m["kind"] == "q"]).startswith("1 of 4 matrices quantized (Q4_1)")


def test_above_band_flag_needs_a_departure_beyond_noise():
    assert kind_summaries([_matrix("up", b, 1.23, 10**7) for b in range(8)])["up"]["flags"] == ["above band"]
    assert kind_summaries([_matrix("up", 0, 1.23, 1024)])["up"]["flags"] == []  # 0.025 over the anchor, se 0.04
    assert abs(1.23 - INIT_ANCHOR_K) < NOISE_Z * k_sigma(1.23, 1024)


@pytest.fixture(scope="module")
def smollm_row(smollm_gguf, cpu_fit) -> dict:
    return cpu_fit(smollm_gguf)


@pytest.mark.e2e
def test_smollm2_fit_compare_and_report_withhold_alike(smollm_row, smollm_gguf, tmp_path):
    # compare
    report = compare(smollm_row)
    for kind in ("q", "k", "v", "o", *FFN):
        assert report["kinds"][kind]["class"] == WITHHELD
        assert WITHHELD_WHY in report["kinds"][kind]["class_withheld"]
    assert report["kinds"]["embed"]["class"] is None  # no k axis for embeddings: nothing to withhold
    assert report["transmission"]["withheld"]
    assert not report["selection"]["departs"]
    assert not any("selection-mild" in f or "transmission," in f for f in report["findings"])
    # report: the same decision per matrix, the same label per block
    for m in smollm_row["matrices"]:
        assert (quantization_of(m) is None) == (k_class_withheld(m) is None), m["name"]
    health = health_report(smollm_row)
    for b in health["blocks"]:
        for kind, cell in b["kinds"].items():
            if cell["k"] is not None:
                assert cell["class"] == WITHHELD, (b["block"], kind)
    # fit: the table's k class column
    out = run_cli("fit", str(smollm_gguf), "--db", str(tmp_path), "-q", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    lines = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") > 5}
    for kind in ("q", "k", "v", "o", *FFN):
        assert WITHHELD in lines[kind], lines[kind]
        assert "selection" not in lines[kind].split("│")[8], lines[kind]
    assert not any("selection-mild" in line for line in lines.values())  # (the class legend below names it)
    assert out.stderr == ""
    # compare on the CLI, from the saved row
    out = run_cli("compare", str(smollm_gguf), "--db", str(tmp_path), "--json", "-q")
    (cli,) = json.loads(out.stdout)
    assert cli["kinds"]["q"]["class"] == WITHHELD
    assert cli["caveat"] is None  # Llama family: in the cohort


# --- families outside the cohort ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_row(minilm_dir, cpu_fit) -> dict:
    return cpu_fit(minilm_dir)


def test_encoder_gets_the_decoder_caveat_and_a_real_departure(minilm_row):
    report = compare(minilm_row)
    caveat = report["caveat"]
    assert caveat
    assert caveat.startswith("bert is an encoder (BERT-like); the cohort holds decoder LMs only")
    assert report["findings"][0] == caveat
    # MiniLM's FFN median 1.159 is a departure far beyond its noise (6 blocks of 384x1536).
    t = report["transmission"]
    assert t["departs"]
    assert t["ffn_median_k"] == pytest.approx(1.1591, abs=1e-4)
    assert t["distance_to_band"] > 10 * t["k_se"]
    assert "heavier-tailed than any cohort model" in t["text"]


def test_caveat_for_other_families_and_none_for_cohort_ones():
    assert cohort_caveat({"family": "llama"}) is None
    assert cohort_caveat({"family": "gpt_neox"}) is None
    gpt2 = cohort_caveat({"family": "gpt2"})
    assert gpt2.startswith("family gpt2 is not in the cohort; the cohort holds decoder LMs only")
    assert "encoder" in cohort_caveat({"family": "xlm-roberta"})
    assert "encoder" in cohort_caveat({"family": "custom", "architectures": ["MyForMaskedLM"]})
    for row in load_cohort("v9_1"):
        assert compare(row)["caveat"] is None


@pytest.mark.e2e
def test_minilm_compare_cli_prints_the_caveat(minilm_dir, tmp_path: Path):
    out = run_cli("compare", str(minilm_dir), "--db", str(tmp_path), "-q", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert out.stderr == "", out.stderr
    text = " ".join(out.stdout.split())
    assert "the cohort holds decoder LMs only" in text
    assert "paper's Transmission band [1.186, 1.204]" in text
    assert "seed 00" not in text


def test_the_shallow_ffn_test_names_the_blocks_it_read(tmp_path):
    """A 4-block model's shallow-FFN reading covers blocks 0-3, and says so (not 'blocks 0-5')."""
    from weightdiag import api
    from weightdiag.run.measure import FitOptions
    from weightdiag.testing import synthetic

    spec = synthetic.ModelSpec(n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=128, seed=4)
    folder = synthetic.write_model(tmp_path / "m", spec)
    result = compare(api.fit(str(folder), FitOptions(device="cpu"), save=False).row)
    assert result["shallow_ffn"]["shallow_blocks"] == "0-3"
    assert not any("blocks 0-5" in f for f in result["findings"])

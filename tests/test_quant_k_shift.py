"""weightdiag/data/quant_k_shift.json (benchmarks/quant_k_shift.py): well-formed, complete, self-consistent;
and the benchmark's quantizers compute what the formats describe."""

from __future__ import annotations

import json
from importlib import resources

import pytest
import torch

from benchmarks import quant_k_shift as qks
from weightdiag.diagnose.classes import NOISE_Z
from weightdiag.diagnose.quantized import k_shift_within_noise, measured_k_shift

FORMAT_IDS = (
    "fp8-block",
    "fp8-channel",
    "fp8-tensor",
    "int8",
    "int-pack",
    "gptq",
    "awq",
    "nvfp4",
    "mxfp4",
    "bnb-4bit",
    "bnb-int8",
)
MODEL_KEYS = ("n_matrices", "dk_min", "dk_max", "dk_median", "dk_abs_max", "max_abs_z")


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(resources.files("weightdiag").joinpath("data/quant_k_shift.json").read_text(encoding="utf-8"))


def _check_entry(entry: dict, where: str) -> None:
    assert isinstance(entry["label"], str) and entry["label"], where
    assert entry["models"], f"{where}: no model measured"
    for model, m in entry["models"].items():
        for key in MODEL_KEYS:
            assert isinstance(m[key], (int, float)), f"{where}/{model}: {key}"
        assert m["n_matrices"] > 0
        assert m["dk_min"] <= m["dk_median"] <= m["dk_max"], f"{where}/{model}"
        assert m["dk_abs_max"] == pytest.approx(max(abs(m["dk_min"]), abs(m["dk_max"])), abs=1e-6)
        assert m["max_abs_z"] >= 0
    # The rule: beyond noise when any matrix of any model moved by more than NOISE_Z sigma.
    worst = max(m["max_abs_z"] for m in entry["models"].values())
    assert entry["max_abs_z"] == pytest.approx(worst)
    assert entry["beyond_noise"] is (worst > NOISE_Z), where
    if "n_beyond_noise" in next(iter(entry["models"].values())):
        assert entry["beyond_noise"] is any(m["n_beyond_noise"] > 0 for m in entry["models"].values()), where


def test_json_is_complete_and_follows_its_rule(doc: dict) -> None:
    for key in ("measured", "command", "trim", "rule", "weightdiag_version", "libraries"):
        assert doc[key], key
    assert doc["trim"] == "mid80"
    assert set(FORMAT_IDS) <= set(doc["formats"])
    for fid in FORMAT_IDS:
        entry = doc["formats"][fid]
        _check_entry(entry, fid)
        for variant, v in entry.get("variants", {}).items():
            _check_entry(v, f"{fid}/{variant}")
    assert set(doc["formats"]["int-pack"]["variants"]) >= {"int4-asym-g128", "int8-channel"}
    assert "fp4" in doc["formats"]["bnb-4bit"]["variants"]
    assert "all-MiniLM-L6-v2" in doc["formats"]["fp8-block"]["models"]
    assert "SmolLM2-135M-Instruct" in doc["formats"]["fp8-block"]["models"]


def test_consumer_reads_the_shipped_figures(doc: dict) -> None:
    assert set(measured_k_shift()) == set(doc["formats"])
    for fid in FORMAT_IDS:
        assert k_shift_within_noise(fid) is (doc["formats"][fid]["beyond_noise"] is False)
    assert not k_shift_within_noise("no-such-format")


def test_fp8_block_matches_a_hand_computation() -> None:
    w = torch.tensor([[2.0, 1.0, 0.1], [0.5, -0.3, 0.0], [-0.02, 0.0155, 0.01]])
    # block 2: tiles {[2, 1], [.5, -.3]}, {[.1], [0]}, {[-.02, .0155]}, {[.01]}; scale = amax / 448
    s = [[2.0 / 448, 0.1 / 448], [0.02 / 448, 0.01 / 448]]
    # w / s on the E4M3 grid: 448, 224, 112 exact; -67.2 -> -64 (spacing 8 in [64, 128));
    # 0.0155 / (0.02 / 448) = 347.2 -> 352 (spacing 32 in [256, 512)); everything that is the tile's amax -> 448.
    codes = [[448.0, 224.0, 448.0], [112.0, -64.0, 0.0], [-448.0, 352.0, 448.0]]
    scale = [[s[0][0], s[0][0], s[0][1]], [s[0][0], s[0][0], s[0][1]], [s[1][0], s[1][0], s[1][1]]]
    expected = torch.tensor(codes) * torch.tensor(scale)
    torch.testing.assert_close(qks.fp8_block(w, block=2), expected, rtol=1e-6, atol=0)
    # default 128x128 block: a small matrix is one block with scale amax / 448
    one = qks.fp8_block(w)
    torch.testing.assert_close(one[1, 1], torch.tensor(-0.3 * 448 / 2.0).to(torch.float8_e4m3fn).float() * 2.0 / 448)


def test_e2m1_rounding_ties_to_even_and_saturates() -> None:
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.3, -5.1, 0.0])
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.5, -6.0, 0.0])
    torch.testing.assert_close(qks.e2m1_round(x), expected)
    # MXFP4: a block with amax 1.0 has scale 2^(0 - 2); values are E2M1 multiples of it
    w = torch.linspace(-1.0, 1.0, 32).reshape(1, 32)
    d = qks.mxfp4(w) / 0.25
    assert set(d.abs().unique().tolist()) <= set(qks.E2M1.tolist())


@pytest.mark.parametrize(
    "quantizer",
    [qks.gptq_rtn, qks.awq_rtn, qks.ct_int, lambda w: qks.ct_int(w, 4, symmetric=False)],
    ids=["gptq", "awq", "ct-int4-sym", "ct-int4-asym"],
)
def test_int4_group_quantizers_use_at_most_16_values_per_group(quantizer) -> None:
    if quantizer not in (qks.gptq_rtn, qks.awq_rtn):
        pytest.importorskip("compressed_tensors")
    w = torch.randn(8, 320, generator=torch.Generator().manual_seed(0)) * 0.02  # 320: a partial last group
    d = quantizer(w)
    assert d.shape == w.shape and d.dtype == torch.float32
    for c0 in range(0, 320, 128):
        for row in d[:, c0 : c0 + 128]:
            assert row.unique().numel() <= 16
    assert (d - w).abs().max() <= 0.6 * w.abs().max() / 7  # within about half a step of the coarsest grid

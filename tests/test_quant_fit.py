"""Quantized checkpoints end to end: the fit of a quantized checkpoint is the fit of its dequantized twin.

Real trained weights (all-MiniLM-L6-v2) are quantized, written with their scales in another shard than their
codes, and fitted locally, in small chunks that cut rows and scale blocks, and from the loopback Hub; each
row must equal the row of the float32 twin holding what the format's dequantizer gives back. Checkpoints
that cannot be dequantized exactly are refused with one line (exit 2), never fitted on codes.
The per-format decoders are checked value for value against their own libraries in test_quant_ct.py,
test_quant_bnb.py and test_quant_gptq.py; here each format goes through the whole pipeline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from weightdiag import tuning

from .conftest import run_cli
from .quant_checkpoints import FP8_BLOCK_CONFIG, fit_row, fp8_block, same_fits, write_pair

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

CHUNK = 16 << 10


@pytest.fixture
def small_chunks(monkeypatch):
    """16 KiB pieces: every matrix is cut inside rows and inside scale blocks."""
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0")
    with tuning.override(split_bytes=CHUNK, local_chunk_bytes=CHUNK, hub_chunk_bytes=CHUNK, head_guess=4096):
        yield


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory, minilm_dir) -> tuple[Path, Path]:
    # An extra 300x200 matrix: its 128x128 grid ends in partial blocks on both axes.
    torch.manual_seed(0)
    odd = {"encoder.layer.0.attention.self.odd.weight": torch.randn(300, 200) * 0.02}
    return write_pair(tmp_path_factory.mktemp("fp8"), minilm_dir, fp8_block(), FP8_BLOCK_CONFIG, extra=odd)


@pytest.fixture(scope="module")
def fp8_small(tmp_path_factory, minilm_dir) -> tuple[Path, Path]:
    """Two encoder layers and the pooler, no embeddings: read in many small pieces."""
    return write_pair(tmp_path_factory.mktemp("fp8s"), minilm_dir, fp8_block(), FP8_BLOCK_CONFIG, layers=2)


def _companion_names(folder: Path) -> set[str]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return {name for name, shard in index["weight_map"].items() if shard.startswith("model-00002")}


def test_fp8_block_fit_equals_the_dequantized_twin(fp8_pair):
    qdir, tdir = fp8_pair
    quantized, twin = fit_row(qdir), fit_row(tdir)
    same_fits(quantized, twin)  # exact: the same histograms, so the same fits to the last digit
    companions = _companion_names(qdir)
    assert companions  # the test would prove nothing without scales
    listed = {m["name"] for m in quantized["matrices"]} | {v["name"] for v in quantized["vectors"]}
    listed |= {s["name"] for s in quantized["skipped"]}
    assert not listed & companions
    deq = [m for m in quantized["matrices"] if m.get("dequantized")]
    assert len(deq) == 38  # 36 encoder matrices, the pooler and the extra one
    assert {m["dequantized"]["label"] for m in deq} == {"FP8 E4M3, block 128x128"}
    assert all(m["dtype"] == "F8_E4M3" and m["fitted_dtype"] == "F32" for m in deq)
    assert deq[0]["dequantized"]["stored"]["scale"].endswith(".weight_scale_inv")
    assert any("dequantized exactly" in n for n in quantized["notes"])


def test_pieces_cut_inside_rows_and_blocks_give_the_same_fit(fp8_small, small_chunks):
    qdir, tdir = fp8_small
    same_fits(fit_row(qdir), fit_row(tdir), k_tol=1e-12, lam_rel=1e-12)


def test_a_quantized_checkpoint_streams_from_the_hub_with_scales_in_another_shard(fake_hub, fp8_small, small_chunks):
    qdir, tdir = fp8_small
    fake_hub.add_folder("acme/fp8", qdir)
    row = fit_row("acme/fp8")
    same_fits(row, fit_row(tdir), k_tol=1e-12, lam_rel=1e-12)
    assert all(f["verified"] for f in row["files"])


def test_the_fit_names_what_was_dequantized(fp8_pair, tmp_path):
    qdir, _ = fp8_pair
    out = run_cli("fit", str(qdir), "--device", "cpu", "--db", str(tmp_path / "db"))
    assert out.returncode == 0, out.stderr
    assert "dequantized from FP8 E4M3, block 128x128 (38 matrices)" in out.stderr
    out = run_cli("report", str(qdir), "--device", "cpu", "--db", str(tmp_path / "db"))
    assert out.returncode == 0, out.stderr
    assert "38 FP8 E4M3, block 128x128" in out.stdout


# --- refused: exit 2, one line, nothing fitted on codes ----------------------------------------------------


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _refused(folder: Path, *needles: str) -> str:
    out = run_cli("fit", str(folder), "--device", "cpu", "--no-save")
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _fp8_layer() -> dict[str, torch.Tensor]:
    w = torch.randn(256, 256) * 0.02
    return {
        "model.layers.0.mlp.down_proj.weight": (w / 0.001).to(torch.float8_e4m3fn),
        "model.layers.0.mlp.down_proj.weight_scale_inv": torch.full((2, 2), 0.001),
        "model.layers.0.input_layernorm.weight": torch.ones(256),
    }


def test_fp8_scales_without_a_quantization_config_are_refused(tmp_path):
    _refused(_write(tmp_path / "m", _fp8_layer(), {}), "down_proj.weight", "quantization_config")


def test_a_block_size_that_does_not_match_the_scales_is_refused(tmp_path):
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}
    _refused(_write(tmp_path / "m", _fp8_layer(), config), "64x64", "block size")


def test_an_unknown_quantization_method_is_refused(tmp_path):
    tensors = {
        "model.layers.0.mlp.down_proj.W_q": torch.zeros(128, 64, dtype=torch.uint8),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(128, 64, dtype=torch.int8),
    }
    _refused(_write(tmp_path / "m", tensors, {"quantization_config": {"quant_method": "hqq"}}), "'hqq'", "base model")


HQQ_CONFIG = {"quantization_config": {"quant_method": "hqq"}}


def _hqq_layer() -> dict[str, torch.Tensor]:
    return {
        "model.layers.0.mlp.down_proj.W_q": torch.zeros(128, 64, dtype=torch.uint8),
        "model.layers.0.mlp.down_proj.weight": torch.zeros(128, 64, dtype=torch.int8),
    }


@pytest.mark.parametrize(
    "front_matter",
    [
        "base_model: acme/base-7b",
        "base_model: 'acme/base-7b'  # the original",
        "base_model: [acme/base-7b, acme/other]",
        "base_model:\n- acme/base-7b\n- acme/other",
        'base_model:\n  - "acme/base-7b"',
    ],
)
def test_the_refusal_names_the_base_model_of_the_model_card(tmp_path, front_matter):
    folder = _write(tmp_path / "m", _hqq_layer(), HQQ_CONFIG)
    (folder / "README.md").write_text(f"---\nlicense: mit\n{front_matter}\ntags: [x]\n---\n# A quantized model\n")
    line = _refused(folder, "'hqq'")
    assert line.endswith("fit its unquantized base model instead: weightdiag fit acme/base-7b"), line


@pytest.mark.parametrize("card", ["# no front matter\nbase_model: acme/x\n", "---\nlicense: mit\n---\nbase_model: x\n"])
def test_a_card_without_base_model_in_its_front_matter_gives_the_general_advice(tmp_path, card):
    folder = _write(tmp_path / "m", _hqq_layer(), HQQ_CONFIG)
    (folder / "README.md").write_text(card)
    assert _refused(folder).endswith("(the model card's base_model names it)")


def test_a_refusal_from_the_hub_names_the_base_model(fake_hub, tmp_path):
    folder = _write(tmp_path / "m", _hqq_layer(), HQQ_CONFIG)
    (folder / "README.md").write_text("---\nbase_model: acme/base-7b\n---\n")
    fake_hub.add_folder("acme/quantized-hqq", folder)
    out = run_cli("fit", "acme/quantized-hqq", "--device", "cpu", "--no-save")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().endswith("weightdiag fit acme/base-7b"), out.stderr


def test_a_stray_scale_beside_a_float_weight_is_refused(tmp_path):
    tensors = {
        "model.layers.0.mlp.down_proj.weight": torch.randn(64, 64),
        "model.layers.0.mlp.down_proj.weight_scale": torch.ones(64, 1),
    }
    config = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {}}}
    _refused(_write(tmp_path / "m", tensors, config), "weight_scale")


def test_packed_gptq_weights_without_their_zeros_are_refused(tmp_path):
    tensors = {
        "model.layers.0.mlp.down_proj.qweight": torch.zeros(8, 64, dtype=torch.int32),
        "model.layers.0.mlp.down_proj.scales": torch.ones(1, 64, dtype=torch.float16),
    }
    config = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 64}}
    _refused(_write(tmp_path / "m", tensors, config), "qweight", "GPTQ", "qzeros")


def test_a_config_naming_a_method_over_plain_float_weights_is_fitted(tmp_path):
    tensors = {"model.layers.0.mlp.down_proj.weight": torch.randn(64, 64)}
    row = fit_row(_write(tmp_path / "m", tensors, {"quantization_config": {"quant_method": "hqq"}}))
    assert len(row["matrices"]) == 1
    assert any("plain floats" in n for n in row["notes"])


def test_the_decoding_path_gives_what_the_counting_path_gives(fp8_small, monkeypatch):
    """Fused parts are reduced from decoded values, whole matrices from counts per block and code: the two
    paths must agree, value for value."""
    qdir, tdir = fp8_small
    counted = fit_row(qdir)
    from weightdiag.decode.decoder import RowMajorDecoder

    monkeypatch.setattr(RowMajorDecoder, "counts", lambda self, raw, byte_lo: None)
    decoded = fit_row(qdir)
    same_fits(decoded, counted, k_tol=1e-12, lam_rel=1e-12)
    same_fits(decoded, fit_row(tdir), k_tol=1e-12, lam_rel=1e-12)


def test_report_plots_read_quantized_matrices_through_their_decoder(fp8_small, tmp_path):
    """`report --plot` re-reads a few matrices for their histograms: dequantized, like the fit."""
    from weightdiag import api
    from weightdiag.execution import Execution
    from weightdiag.run.histograms import read_histograms

    qdir, tdir = fp8_small
    row = fit_row(qdir)
    names = [m["name"] for m in row["matrices"] if m.get("dequantized")][:2]
    here = Execution.build("cpu")
    got, note = read_histograms(row, names, str(qdir), None, here)
    want, _ = read_histograms(fit_row(tdir), names, str(tdir), None, here)
    assert note is None and set(got) == set(names)
    for name in names:
        assert (got[name]["hist1024"] == want[name]["hist1024"]).all()
    done = api.report(str(qdir), db_dir=tmp_path / "db", plot=tmp_path / "plots")
    assert done.result["plots"]

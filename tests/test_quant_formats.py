"""Every quantized format through the whole pipeline: the fit of the quantized checkpoint is the fit of its
dequantized float32 twin, locally and from the loopback Hub, with every companion in another shard than its
weight, no companion listed anywhere in the row, and the row and the report naming the quantization.

Each checkpoint is made by the format's own library where it runs on a CPU (bitsandbytes,
compressed-tensors), else by a faithful port of its published packing (see quant_checkpoints.py), and the
twin holds what that library's dequantizer gives back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from . import quant_checkpoints as qc
from . import quant_gptq_checkpoints as gq
from .conftest import run_cli

# name -> (quantizer factory, quantization_config, hf_quant_config, library it needs, label the row must show)
FORMATS = {
    "fp8-block": (qc.fp8_block, qc.FP8_BLOCK_CONFIG, None, None, "FP8 E4M3, block 128x128"),
    "bnb-nf4": (qc.bnb_4bit, qc.BNB_4BIT_CONFIG, None, "bitsandbytes", "bitsandbytes NF4, block 64, double quant"),
    "bnb-fp4": (
        lambda: qc.bnb_4bit("fp4", nested=False),
        {**qc.BNB_4BIT_CONFIG, "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False},
        None,
        "bitsandbytes",
        "bitsandbytes FP4, block 64",
    ),
    "bnb-int8": (qc.bnb_int8, qc.BNB_8BIT_CONFIG, None, "bitsandbytes", "bitsandbytes LLM.int8"),
    "ct-int4-group": (
        qc.ct_pack,
        qc.ct_pack_config(),
        None,
        "compressed_tensors",
        "INT4 (compressed-tensors), group 128",
    ),
    "ct-int4-asym": (
        lambda: qc.ct_pack(symmetric=False),
        qc.ct_pack_config(symmetric=False),
        None,
        "compressed_tensors",
        "INT4 (compressed-tensors), group 128",
    ),
    "ct-int8-channel": (
        lambda: qc.ct_pack(bits=8, group=None),
        qc.ct_pack_config(bits=8, group=None),
        None,
        "compressed_tensors",
        "INT8 (compressed-tensors), per channel",
    ),
    "nvfp4-ct": (qc.nvfp4_ct, qc.NVFP4_CT_CONFIG, None, "compressed_tensors", "NVFP4, group 16"),
    "nvfp4-modelopt": (qc.nvfp4_modelopt, None, qc.NVFP4_MODELOPT_HF_CONFIG, "compressed_tensors", "NVFP4, group 16"),
    "mxfp4-ct": (qc.mxfp4_ct, qc.MXFP4_CT_CONFIG, None, "compressed_tensors", "MXFP4, group 32"),
    "mxfp4-gpt-oss": (qc.mxfp4_gpt_oss, qc.MXFP4_CONFIG, None, "transformers", "MXFP4, group 32"),
    "fp8-transformers": (
        qc.fp8_transformers,
        qc.fp8_transformers_config(),
        None,
        "transformers",
        "FP8 E4M3, block 128x128",
    ),
    "fp8-transformers-ue8m0": (
        lambda: qc.fp8_transformers(scale_fmt="ue8m0"),
        qc.fp8_transformers_config("ue8m0"),
        None,
        "transformers",
        "FP8 E4M3, block 128x128",
    ),
    "ct-fp8-channel": (
        qc.ct_float,
        qc.ct_float_config(),
        None,
        "compressed_tensors",
        "FP8 E4M3, per channel",
    ),
    "ct-fp8-tensor": (
        lambda: qc.ct_float("tensor", torch.float32, input_scale=True),
        qc.ct_float_config("tensor"),
        None,
        "compressed_tensors",
        "FP8 E4M3, per tensor",
    ),
    "ct-fp8-block": (
        lambda: qc.ct_float("block"),
        qc.ct_float_config("block"),
        None,
        "compressed_tensors",
        "FP8 E4M3, block 128x128",
    ),
    "ct-int8-naive": (qc.ct_naive_int8, qc.CT_NAIVE_INT8_CONFIG, None, "compressed_tensors", "INT8, per channel"),
    "fbgemm-fp8": (qc.fbgemm_fp8, qc.FBGEMM_FP8_CONFIG, None, None, "FP8 E4M3, per channel"),
    "modelopt-fp8": (qc.modelopt_fp8, None, qc.MODELOPT_FP8_HF_CONFIG, None, "FP8 E4M3, per tensor"),
    "gptq": (gq.gptq, gq.GPTQ_CONFIG, None, None, "GPTQ int4, group 128"),
    "gptq-v2-int8": (
        lambda: gq.gptq(8, 64, False, "gptq_v2"),
        {**gq.GPTQ_CONFIG, "bits": 8, "group_size": 64, "checkpoint_format": "gptq_v2"},
        None,
        None,
        "GPTQ int8, group 64",
    ),
    "gptq-desc-act": (
        lambda: gq.gptq(4, 128, True),
        {**gq.GPTQ_CONFIG, "desc_act": True},
        None,
        None,
        "GPTQ int4, group 128",
    ),
    "awq": (gq.awq, gq.AWQ_CONFIG, None, None, "AWQ int4, group 128"),
}


def _pair(tmp_path_factory, minilm_dir, name: str, layers: int) -> tuple[Path, Path]:
    factory, config, hf_config, library, _ = FORMATS[name]
    if library:
        pytest.importorskip(library)
    root = tmp_path_factory.mktemp(name)
    return qc.write_pair(root, minilm_dir, factory(), config, hf_quant_config=hf_config, layers=layers)


@pytest.fixture(scope="module", params=sorted(FORMATS))
def pair(request, tmp_path_factory, minilm_dir):
    return request.param, _pair(tmp_path_factory, minilm_dir, request.param, layers=6)


def _companions(folder: Path) -> set[str]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return {name for name, shard in index["weight_map"].items() if shard.startswith("model-00002")}


def test_the_fit_equals_the_dequantized_twin(pair):
    name, (qdir, tdir) = pair
    row = qc.fit_row(qdir)
    qc.same_fits(row, qc.fit_row(tdir), k_tol=1e-9, lam_rel=1e-9)
    listed = {m["name"] for m in row["matrices"]} | {v["name"] for v in row["vectors"]}
    listed |= {s["name"] for s in row["skipped"]}
    assert _companions(qdir) and not listed & _companions(qdir)
    labels = {m["dequantized"]["label"] for m in row["matrices"] if m.get("dequantized")}
    assert labels == {FORMATS[name][4]}
    assert sum(1 for m in row["matrices"] if m.get("dequantized")) == 37  # every linear weight of MiniLM


def test_the_report_names_the_quantization(pair, tmp_path):
    name, (qdir, _) = pair
    out = run_cli("report", str(qdir), "--device", "cpu", "--db", str(tmp_path / "db"))
    assert out.returncode == 0, out.stderr
    assert f"37 {FORMATS[name][4]}" in out.stdout
    assert f"dequantized from {FORMATS[name][4]} (37 matrices)" in out.stderr


@pytest.mark.kernels  # every format's decoder in small pieces: scripts/test runs it again on the numpy kernels
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_from_the_hub_with_companions_in_another_shard(
    name, fake_hub, tmp_path_factory, minilm_dir, monkeypatch, knobs
):
    knobs(split_bytes=64 << 10, hub_chunk_bytes=64 << 10, head_guess=4096)
    qdir, tdir = _pair(tmp_path_factory, minilm_dir, name, layers=1)
    fake_hub.add_folder(f"acme/{name}", qdir)
    row = qc.fit_row(f"acme/{name}")
    qc.same_fits(row, qc.fit_row(tdir), k_tol=1e-9, lam_rel=1e-9)
    assert all(f["verified"] for f in row["files"])


@pytest.mark.parametrize("name", ["bnb-nf4", "fp8-block"])
def test_floats_that_hold_dequantized_4bit_weights_are_caught(name, tmp_path_factory, minilm_dir):
    """The twin of a 4-bit checkpoint is what a merged QLoRA save holds: floats on a 4-bit grid. Its matrices
    are flagged and their k classes withheld; the 8-bit twin and the original weights are not flagged."""
    import torch
    from safetensors.torch import load_file, save_file

    _, tdir = _pair(tmp_path_factory, minilm_dir, name, layers=6)
    bf16 = tdir.parent / "bf16"
    bf16.mkdir()
    save_file(
        {
            k: v.to(torch.bfloat16)
            for k, v in load_file(str(tdir / "model.safetensors")).items()
            if v.is_floating_point()
        },
        str(bf16 / "model.safetensors"),
    )
    (bf16 / "config.json").write_text((tdir / "config.json").read_text())
    row = qc.fit_row(bf16)
    flagged = {m["name"] for m in row["matrices"] if m.get("grid")}
    if name == "fp8-block":
        assert not flagged
        return
    assert len(flagged) == 37 and {m["grid"]["group"] for m in row["matrices"] if m.get("grid")} == {64}
    assert all(s.get("k_class") is None for k, s in row["kinds"].items() if k in ("q", "k", "v", "o"))
    out = run_cli("fit", str(bf16), "--device", "cpu", "--no-save")
    assert "sit on a 4-bit grid" in out.stderr


def test_trained_weights_are_not_a_grid(minilm_dir, smollm_gguf):
    assert not [m["name"] for m in qc.fit_row(minilm_dir)["matrices"] if m.get("grid")]

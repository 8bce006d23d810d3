""".bin checkpoints: read through the restricted unpickler only, real and synthetic."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from weightdiag.errors import CheckpointFormatError
from weightdiag.pipeline import FitOptions, fit_path
from weightdiag.reduce import reduce_array
from weightdiag.source.local import open_local
from weightdiag.stats import Summary

from .conftest import run_cli


def test_antiberty_real_bin_checkpoint(antiberty_bin):
    row = fit_path(str(antiberty_bin), FitOptions(device="cpu"))
    assert row["model"]["format"] == "torch"
    assert "weights_only=True" in row["notes"][0]
    kinds = row["kinds"]
    for kind in ("q", "k", "v", "o", "ffn_in", "ffn_out"):
        assert kinds[kind]["count"] == 8  # AntiBERTy: BERT, 8 layers
    assert row["architecture"]["norm_placement"] == "post"
    assert row["skipped"][0]["reason"] == "non-float dtype I64"


def test_bin_values_are_read_exactly(tmp_path):
    rng = np.random.default_rng(0)
    state = {
        "model.layers.0.mlp.down_proj.weight": torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32)),
        "model.layers.0.mlp.up_proj.weight": torch.from_numpy(rng.standard_normal((96, 64))).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.ones(64, dtype=torch.float16),
    }
    torch.save(state, tmp_path / "pytorch_model.bin")
    plan, reader = open_local(tmp_path)
    for ref in plan.tensors:
        raw = np.empty(ref.nbytes, dtype=np.uint8)
        reader.read_into(ref, raw)
        t = state[ref.name]
        expected = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().view(np.uint8).reshape(-1)
        assert np.array_equal(raw, expected), ref.name
    reader.close()
    row = fit_path(str(tmp_path), FitOptions(device="cpu"))
    up = next(m for m in row["matrices"] if m["kind"] == "up")
    bits = state["model.layers.0.mlp.up_proj.weight"].view(torch.int16).numpy().view(np.uint16).reshape(-1)
    assert up["fits"]["mid80"]["k"] == pytest.approx(Summary(reduce_array(bits, "BF16")).fit("hist1024", "mid80").k)


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_pickle_that_builds_objects_is_refused(tmp_path, capsys):
    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        torch.save({"w": torch.zeros(4, 4), "evil": _Evil()}, f)
    with pytest.raises(CheckpointFormatError, match="restricted unpickler"):
        open_local(tmp_path)
    assert "must never run" not in capsys.readouterr().out
    out = run_cli("fit", str(tmp_path), "--no-save")
    assert out.returncode == 2 and "restricted unpickler" in out.stderr and "Traceback" not in out.stderr


def test_a_corrupt_bin_is_a_format_error(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps([1, 2, 3])[:5])
    with pytest.raises(CheckpointFormatError, match="not a readable torch checkpoint"):
        open_local(tmp_path)


def test_a_legacy_non_zip_bin_is_read_without_mapping(tmp_path):
    w = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    torch.save({"layers.0.mlp.up_proj.weight": w}, tmp_path / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    plan, reader = open_local(tmp_path)
    out = np.empty(plan.tensors[0].nbytes, dtype=np.uint8)
    reader.read_into(plan.tensors[0], out)
    assert np.array_equal(out.view(np.float32).reshape(16, 8), w.numpy())


def test_a_bin_index_with_a_bad_weight_map_is_a_format_error(tmp_path):
    torch.save({"a.weight": torch.zeros(2, 2)}, tmp_path / "pytorch_model-1.bin")
    (tmp_path / "pytorch_model.bin.index.json").write_text('{"weight_map": {"a.weight": 3}}')
    with pytest.raises(CheckpointFormatError, match="no valid weight_map"):
        open_local(tmp_path)

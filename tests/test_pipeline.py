"""Whole-model fits through the streaming pipeline: rows, parts, vectors, filters, memory."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from weightdiag.api import fit_path
from weightdiag.fit.stats import fit, matrix_stats
from weightdiag.reduce.reduction import reduce_array
from weightdiag.run.measure import FitOptions
from weightdiag.source.local import open_local
from weightdiag.testing import synthetic

from .conftest import write_safetensors

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels


@pytest.fixture(scope="module")
def llama_row(small_llama):
    return fit_path(str(small_llama), FitOptions(device="cpu"))


def test_row_has_every_matrix_with_kinds_and_blocks(llama_row):
    kinds = llama_row["kinds"]
    for kind in ("q", "k", "v", "o", "gate", "up", "down"):
        assert kinds[kind]["count"] == 3
        assert kinds[kind]["fitted"] == 3
    assert kinds["embed"]["count"] == 1
    assert kinds["unembed"]["count"] == 1
    assert {m["block"] for m in llama_row["matrices"] if m["kind"] == "q"} == {0, 1, 2}
    assert llama_row["architecture"]["attention"] == "GQA 2:1"
    assert llama_row["unclassified"] == []
    assert llama_row["skipped"] == []
    json.dumps(llama_row, allow_nan=False)  # strict JSON


def test_gaussian_init_rows_sit_on_the_anchor(llama_row):
    for kind in ("gate", "up", "down", "embed"):
        s = llama_row["kinds"][kind]
        assert abs(s["k_median"] - 1.2054) < 0.02
        assert abs(s["lambda_median"] / 0.02 - 0.8875) < 0.02
        assert s["k_class"] in (None, "transmission")


def test_norm_vectors_at_init_are_sqrt_d(llama_row):
    norms = [v for v in llama_row["vectors"] if v["kind"] == "norm"]
    assert len(norms) == 2 * 3 + 1
    assert all(v["l2_over_sqrt_d"] == 1.0 for v in norms)
    assert {v["site"] for v in norms} == {"attn", "ffn", "final"}


def test_every_matrix_matches_a_direct_reduction(small_llama, llama_row):
    """Buffers are reused by the prefetcher: each record must still describe its own tensor."""
    plan, reader = open_local(small_llama)
    by_name = {m["name"]: m for m in llama_row["matrices"]}
    for ref in plan.tensors:
        if len(ref.shape) != 2:
            continue
        raw = np.empty(ref.nbytes, dtype=np.uint8)
        reader.read_into(ref, raw)
        red = reduce_array(raw.view(np.uint16), "BF16")
        record = by_name[ref.name]
        assert record["stats"]["max_abs"] == pytest.approx(matrix_stats(red).max_abs, rel=1e-9)
        assert record["fits"]["mid80"]["k"] == pytest.approx(fit(red, "hist1024", "mid80").k, rel=1e-9)
        assert record["argmax"] == list(np.unravel_index(red.argmax, ref.shape))
    reader.close()


def test_fused_qkv_parts_equal_reductions_of_the_slices(small_neox):
    row = fit_path(str(small_neox), FitOptions(device="cpu"))
    qkv = next(m for m in row["matrices"] if m["kind"] == "qkv")
    assert [p["kind"] for p in qkv["parts"]] == ["q", "k", "v"]
    assert set(row["part_kinds"]) == {"q", "k", "v"}
    plan, reader = open_local(small_neox)
    ref = next(t for t in plan.tensors if t.name == qkv["name"])
    raw = np.empty(ref.nbytes, dtype=np.uint8)
    reader.read_into(ref, raw)
    reader.close()
    w = raw.view(np.float16).reshape(4, 3, 32, 128)  # heads x (q, k, v) x head_dim x d
    for i, part in enumerate(qkv["parts"]):
        direct = reduce_array(np.ascontiguousarray(w[:, i]).reshape(-1), "F16")
        assert part["fits"]["mid80"]["k"] == pytest.approx(fit(direct, "hist1024", "mid80").k, rel=1e-9)
        assert part["stats"]["std"] == pytest.approx(matrix_stats(direct).std, rel=1e-9)
    ffn = next(m for m in row["matrices"] if m["kind"] == "ffn_in")
    assert "parts" not in ffn  # GeLU FFN-in is not fused


def test_include_and_exclude_globs(small_llama):
    row = fit_path(str(small_llama), FitOptions(device="cpu", include=["*.layers.1.*"], exclude=["*mlp*"]))
    names = [m["name"] for m in row["matrices"]] + [v["name"] for v in row["vectors"]]
    assert names
    assert all(".layers.1." in n and "mlp" not in n for n in names)


def test_non_float_empty_and_scalar_tensors_are_listed_as_skipped(tmp_path):
    path = write_safetensors(
        tmp_path / "model.safetensors",
        {
            "w.weight": ("F32", np.random.default_rng(0).standard_normal((40, 40)).astype(np.float32)),
            "empty.weight": ("F32", np.zeros((0, 4), dtype=np.float32)),
            "ids": ("I64", np.arange(6, dtype=np.int64).reshape(1, 6)),
            "scale": ("F32", np.array(2.0, dtype=np.float32)),
        },
    )
    row = fit_path(str(path), FitOptions(device="cpu"))
    assert {s["name"]: s["reason"] for s in row["skipped"]} == {
        "empty.weight": "empty tensor",
        "ids": "non-float dtype I64",
        "scale": "scalar",
    }
    assert row["unclassified"] == ["w.weight"]


def test_minilm_row_is_complete(minilm_dir):
    row = fit_path(str(minilm_dir), FitOptions(device="cpu"))
    assert len(row["matrices"]) == 40
    assert len(row["vectors"]) == 63
    assert row["skipped"][0]["name"] == "embeddings.position_ids"
    assert "I64" in row["skipped"][0]["reason"]
    assert row["architecture"]["norm_placement"] == "post"
    ln = next(v for v in row["vectors"] if v["name"] == "encoder.layer.0.output.LayerNorm.weight")
    assert ln["l2"] == pytest.approx(ln["l2_over_sqrt_d"] * math.sqrt(384))
    for kind in ("q", "k", "v", "o", "ffn_in", "ffn_out"):
        assert row["kinds"][kind]["count"] == 6


# VmHWM, not ru_maxrss: the latter inherits the (large) pytest parent's peak across fork + exec.
_PEAK_SCRIPT = """
import sys
from weightdiag.api import fit_path
from weightdiag.run.measure import FitOptions
fit_path(sys.argv[1], FitOptions(device="cpu"))
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_checkpoint(tmp_path):
    """Two checkpoints with the same largest tensor, one 4x more layers: peak RSS stays put."""
    peaks = {}
    for layers in (2, 8):
        spec = synthetic.ModelSpec(
            n_layers=layers,
            d_model=1024,
            n_heads=8,
            n_kv_heads=8,
            ffn_size=4096,
            vocab=4096,
            shard_bytes=64 << 20,
        )
        folder = synthetic.write_model(tmp_path / f"m{layers}", spec)
        out = subprocess.run(
            [sys.executable, "-c", _PEAK_SCRIPT, str(folder)], capture_output=True, text=True, check=True
        )
        peaks[layers] = int(out.stdout.split()[-1]) * 1024
    largest = 4096 * 1024 * 2  # one BF16 FFN matrix (= the embedding)
    assert peaks[8] < peaks[2] + 64 * 2**20, peaks  # no growth with model size beyond noise
    assert peaks[8] < 3 * largest + 500 * 2**20, peaks


def test_f64_values_beyond_float32_count_as_infinite_without_warnings(tmp_path):
    import warnings

    w = np.random.default_rng(0).standard_normal((64, 64))
    w[0, 0], w[1, 1] = 1e300, -1e250
    path = write_safetensors(
        tmp_path / "model.safetensors",
        {"model.layers.0.mlp.up_proj.weight": ("F64", w), "model.norm.weight": ("F64", np.full(64, 1e200))},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = fit_path(str(path), FitOptions(device="cpu"))
    (m,) = row["matrices"]
    assert m["stats"]["n_finite"] == 64 * 64 - 2
    assert m["fits"]["mid80"]["ok"]
    (norm,) = [v for v in row["vectors"] if v["kind"] == "norm"]
    assert norm["l2"] is None
    assert norm["mean"] == pytest.approx(1e200)  # sums past float64: null, not a warning

"""Memory flat in the number and shape of tensors: partial reductions wait packed (nonzero counts only),
and long vectors are summarised chunk by chunk instead of gathered whole as float64."""

from __future__ import annotations

import itertools
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from weightdiag.reduce.reduction import merge, reduce_array
from weightdiag.reduce.vectors import VectorSummary, values_of

from .quant_checkpoints import fit_row


def test_pack_then_unpack_gives_the_same_counts_and_merge():
    rng = np.random.default_rng(0)
    bits = (rng.standard_normal(5000).astype(np.float32) * 0.02).view(np.uint32) >> 16
    halves = [reduce_array(bits[:2500].astype(np.uint16), "BF16"), reduce_array(bits[2500:].astype(np.uint16), "BF16")]
    dense = merge([halves[0], halves[1]]).counts.copy()
    again = [
        reduce_array(bits[:2500].astype(np.uint16), "BF16").pack(),
        reduce_array(bits[2500:].astype(np.uint16), "BF16").pack(),
    ]
    assert again[0].counts.size == 0 and again[0].packed is not None
    assert np.array_equal(merge(again).counts, dense)
    assert np.array_equal(reduce_array(bits.astype(np.uint16), "BF16").pack().unpack().counts, dense)


@pytest.mark.parametrize("cuts", [[0, 10_000], [0, 1, 7, 4096, 9999, 10_000], list(range(0, 10_001, 1000))])
def test_a_vector_summarised_in_pieces_is_the_vector_summarised_whole(cuts):
    rng = np.random.default_rng(1)
    v = 1 + 0.05 * rng.standard_normal(10_000)
    v[[5, 777]] = [np.nan, np.inf]
    whole = VectorSummary.of(v, offset=1.0)
    pieces = [VectorSummary.of(v[a:b], offset=1.0) for a, b in itertools.pairwise(cuts)]
    merged = pieces[0]
    for p in pieces[1:]:
        merged = merged.merge(p)
    finite = v[np.isfinite(v)] + 1.0
    assert merged.numel == whole.numel == 10_000 and merged.n == whole.n == 9998
    assert merged.vmin == finite.min() and merged.vmax == finite.max()
    assert merged.mean == pytest.approx(finite.mean(), rel=1e-13)
    assert merged.std == pytest.approx(finite.std(), rel=1e-11)
    assert merged.l2 == pytest.approx(np.sqrt(np.dot(finite, finite)), rel=1e-13)
    # in one piece: exactly numpy's numbers (what rows held before vectors were summarised)
    assert (whole.mean, whole.std, whole.l2) == (
        float(finite.mean()),
        float(finite.std()),
        float(np.sqrt(np.dot(finite, finite))),
    )


def test_an_all_nonfinite_piece_merges_as_nothing():
    a = VectorSummary.of(np.array([np.nan, np.inf]))
    b = VectorSummary.of(np.array([1.0, 3.0]))
    for merged in (a.merge(b), b.merge(a)):
        assert (merged.numel, merged.n, merged.mean, merged.vmin, merged.vmax) == (4, 2, 2.0, 1.0, 3.0)
    assert VectorSummary.of(np.array([np.nan])).std is None


def _write(folder: Path, tensors: dict[str, torch.Tensor], config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    return folder


def test_a_long_vector_is_read_in_chunks_with_the_numbers_of_the_whole(tmp_path, monkeypatch, knobs):
    """A 6 MB BF16 norm weight (over the 4 MiB that are gathered whole), read in 64 KiB pieces, Gemma's
    offset applied: the record matches numpy on the whole vector."""
    knobs(split_bytes=64 << 10, local_chunk_bytes=64 << 10)
    gen = torch.Generator().manual_seed(0)
    big = (0.1 * torch.randn(3 << 20, generator=gen)).to(torch.bfloat16)
    big[12345] = float("nan")
    folder = _write(
        tmp_path / "m",
        {"model.norm.weight": big, "model.layers.0.mlp.down_proj.weight": torch.randn(64, 64)},
        {"model_type": "gemma", "architectures": ["GemmaForCausalLM"]},
    )
    row = fit_row(folder)
    (rec,) = [v for v in row["vectors"] if v["name"] == "model.norm.weight"]
    values = values_of(big.view(torch.int16).numpy().view(np.uint8), "BF16")
    finite = values[np.isfinite(values)] + 1.0
    assert rec["offset_applied"] == 1.0 and rec["numel"] == 3 << 20 and rec["n_nonfinite"] == 1
    assert rec["mean"] == pytest.approx(finite.mean(), rel=1e-9)
    assert rec["std"] == pytest.approx(finite.std(), rel=1e-9)
    assert rec["l2"] == pytest.approx(np.sqrt(np.dot(finite, finite)), rel=1e-9)
    assert (rec["min"], rec["max"]) == (pytest.approx(finite.min(), rel=1e-9), pytest.approx(finite.max(), rel=1e-9))


def test_thousands_of_small_matrices_in_one_chunk_do_not_hold_512_kib_each(tmp_path):
    """1,500 16x16 matrices share one chunk: before packing, each held its 65,536 counts (512 KiB) until the
    chunk was merged, 770 MB for these; now the peak traced by Python's allocator stays small."""
    gen = torch.Generator().manual_seed(0)
    tensors = {
        f"model.layers.{i // 8}.mlp.experts.{i % 8}.down_proj.weight": (torch.randn(16, 16, generator=gen) * 0.02).to(
            torch.bfloat16
        )
        for i in range(1500)
    }
    folder = _write(tmp_path / "tiny", tensors)
    tracemalloc.start()
    try:
        row = fit_row(folder)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(row["matrices"]) == 1500
    assert peak < 64e6, f"peak {peak / 1e6:.0f} MB"

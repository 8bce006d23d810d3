"""The chunk engine: planning, exact merging of partial reductions, bounded memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from weightdiag import tuning
from weightdiag.api import fit_path
from weightdiag.reduce import stream
from weightdiag.reduce.reduction import merge, reduce_array, reduce_range
from weightdiag.run.measure import FitOptions
from weightdiag.segments import Segments, clip
from weightdiag.source import chunks
from weightdiag.source.chunks import Span, plan_chunks
from weightdiag.testing import synthetic

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

_CONTEXT = ("model", "files", "created", "run", "notes")


def _science(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in _CONTEXT}


@st.composite
def _layouts(draw):
    """Sorted, non-overlapping spans over up to three shards, with data regions around them."""
    spans, regions = [], {}
    for shard in range(draw(st.integers(1, 3))):
        at = start = draw(st.integers(0, 50))
        for _ in range(draw(st.integers(0, 12))):
            at += draw(st.integers(0, 40)) * 8
            size = draw(st.integers(1, 90)) * 8
            spans.append(Span(shard, at, at + size))
            at += size
        regions[shard] = (start, at + draw(st.integers(0, 60)))
    return spans, regions


@settings(max_examples=300, deadline=None)
@given(_layouts(), st.integers(1, 12), st.integers(1, 4), st.integers(0, 64), st.booleans())
def test_chunks_cover_every_selected_byte_once(layout, split_units, factor, gap, cover):
    spans, regions = layout
    split = 8 * split_units
    plan = plan_chunks(spans, split * factor, split_bytes=split, gap_bytes=gap, cover=regions if cover else None)
    seen: dict[int, list[tuple[int, int]]] = {}
    for i, chunk in enumerate(plan):
        assert chunk.index == i
        assert 0 < chunk.nbytes <= split * factor
        for piece in chunk.pieces:
            span = spans[piece.item]
            assert span.shard == chunk.shard
            assert piece.lo % split == 0
            assert piece.hi - piece.lo <= split
            assert chunk.start + piece.offset == span.start + piece.lo  # the bytes are where the piece says
            assert piece.offset >= 0
            assert piece.offset + piece.hi - piece.lo <= chunk.nbytes
            seen.setdefault(piece.item, []).append((piece.lo, piece.hi))
    for item, span in enumerate(spans):  # each tensor exactly once, in order, cut at multiples of split
        got = seen.get(item, [])
        assert got == [(lo, min(lo + split, span.end - span.start)) for lo in range(0, span.end - span.start, split)]
    if cover:  # every byte of every data region, in file order, no overlap
        for shard, (start, size) in regions.items():
            tiles = [(c.start, c.end) for c in plan if c.shard == shard]
            assert [a for a, _ in tiles] == [start, *(b for _, b in tiles[:-1])] if tiles else start == size
            assert not tiles or tiles[-1][1] == size
    order = [(c.shard, c.start) for c in plan]
    assert order == sorted(order)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 300), st.integers(1, 64), st.integers(1, 400), st.integers(0, 50))
def test_a_tensor_of_code_units_is_cut_between_whole_units(unit, split_units, units, start):
    """GGUF weights are decoded in whole blocks (or heads of rows): cut at multiples of cut_step, the largest
    multiple of the unit (and of 8) up to the split size, or one unit when a unit is larger."""
    split = 8 * split_units
    step = chunks.cut_step(split, unit)
    assert step % unit == 0 and step % chunks.CHUNK_ALIGN == 0
    assert step <= split or step == math.lcm(unit, chunks.CHUNK_ALIGN)
    assert step > split - math.lcm(unit, chunks.CHUNK_ALIGN)  # no smaller than it needs to be
    if chunks.CHUNK_ALIGN % unit == 0:
        assert step == split  # elements and packed codes: the cuts of every other tensor
    size = unit * units
    span = Span(0, 8 + 8 * start, 8 + 8 * start + size, unit)
    plan = plan_chunks([Span(0, 0, 8), span], 2 * split, split_bytes=split)
    pieces = [(c, p) for c in plan for p in c.pieces if p.item == 1]
    assert [(p.lo, p.hi) for _, p in pieces] == [(lo, min(lo + step, size)) for lo in range(0, size, step)]
    for c, p in pieces:
        assert c.start + p.offset == span.start + p.lo and p.offset + p.hi - p.lo <= c.nbytes


def test_small_tensors_share_a_request_and_large_ones_are_cut():
    small = [Span(0, 100 + 64 * i, 100 + 64 * (i + 1)) for i in range(500)]
    assert len(plan_chunks(small, 1 << 20)) == 1  # 500 norm vectors: one ranged GET
    large = plan_chunks([Span(0, 0, 40 << 20)], 16 << 20)
    assert [c.nbytes for c in large] == [16 << 20, 16 << 20, 8 << 20]
    gaps = plan_chunks([Span(0, 0, 8), Span(0, 8 + (2 << 20), 16 + (2 << 20))], 16 << 20)
    assert len(gaps) == 2  # a hole larger than gap_bytes is not read


@settings(max_examples=400, deadline=None)
@given(
    st.integers(0, 5), st.integers(1, 7), st.integers(0, 5), st.integers(1, 6), st.integers(0, 60), st.integers(0, 60)
)
def test_clip_selects_exactly_the_elements_in_range(offset, length, extra, count, a, b):
    seg = Segments(offset, length, length + extra, count)
    lo, hi = min(a, b), max(a, b)
    want = [i for r in range(count) for i in range(offset + r * seg.stride, offset + r * seg.stride + length)]
    got = [lo + s.offset + r * s.stride + j for s in clip(seg, lo, hi) for r in range(s.count) for j in range(s.length)]
    assert got == [i for i in want if lo <= i < hi]


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32", "F64"])
def test_partial_reductions_merge_to_the_whole(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(60_013) * 0.02 + 0.3
    x[17_777] = 9.0  # the largest |w|, twice: the first one must win
    x[40_001] = -9.0
    flat = synthetic.encode(x.astype(np.float32), dtype) if dtype != "F64" else x.astype("<f8").tobytes()
    storage = np.frombuffer(flat, dtype={"BF16": "<u2", "F16": "<f2", "F32": "<f4", "F64": "<f8"}[dtype])
    for seg in (None, Segments(3, 11, 29, 2000)):
        whole = reduce_array(storage, dtype, seg)
        parts = []
        for lo in range(0, storage.size, 4099):
            parts += reduce_range(storage[lo : lo + 4099], dtype, seg, lo)
        merged = merge(parts)
        assert merged.numel == whole.numel
        assert np.array_equal(merged.counts, whole.counts)
        assert (merged.argmax, merged.max_abs) == (whole.argmax, whole.max_abs)
        if whole.power_sums is not None:
            assert np.array_equal(merged.hist1024, whole.hist1024)
            assert merged.shift == whole.shift
            scale = np.abs(whole.power_sums).max()
            assert np.all(np.abs(merged.power_sums - whole.power_sums) <= 1e-12 * scale)


def _fit_with(folder, monkeypatch, split: int, local_chunk: int) -> dict:
    with tuning.override(split_bytes=split, local_chunk_bytes=local_chunk):
        return fit_path(str(folder), FitOptions(device="cpu"))


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_a_fit_does_not_depend_on_the_chunk_size(tmp_path, monkeypatch, family):
    """Large tensors cut in many pieces (fused NeoX qkv parts cut mid-run) give the same row as whole reads:
    exactly for 16-bit dtypes; for F32 the moments agree to rounding."""
    for dtype in ("BF16", "F32"):
        spec = synthetic.ModelSpec(
            family=family, n_layers=2, d_model=96, n_heads=4, n_kv_heads=2, ffn_size=200, vocab=300, dtype=dtype, seed=2
        )
        folder = synthetic.write_model(tmp_path / f"{family}-{dtype}", spec)
        whole = _fit_with(folder, monkeypatch, 1 << 24, 1 << 24)
        cut = _fit_with(folder, monkeypatch, 1 << 12, 3 << 12)
        if dtype == "BF16":
            assert _science(cut) == _science(whole)
        else:
            for a, b in zip(cut["matrices"], whole["matrices"], strict=True):
                assert a["fits"] == b["fits"]
                assert a["stats"]["max_abs"] == b["stats"]["max_abs"]
                assert a["stats"]["std"] == pytest.approx(b["stats"]["std"], rel=1e-12)
        assert len(cut["matrices"]) == len(whole["matrices"]) > 0


def test_chunk_size_constants_are_consistent():
    knobs = tuning.Tuning()
    for size in (knobs.hub_chunk_bytes, knobs.local_chunk_bytes):
        assert size % knobs.split_bytes == 0  # whole pieces per chunk: the same cuts everywhere


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_the_torch_path_gives_the_same_partial_reductions(dtype):
    """The CUDA path's piece reducer, run on torch's CPU device, against the numpy one (read-only input)."""
    rng = np.random.default_rng(9)
    raw = np.frombuffer(synthetic.encode((rng.standard_normal(30_000) * 0.02).astype(np.float32), dtype), np.uint8)
    assert not raw.flags.writeable
    selections = (None, Segments(5, 40, 120, 250))
    item = 4 if dtype == "F32" else 2
    cpu, on_torch = stream.piece_reducer("cpu"), stream.torch_piece_reducer("cpu")
    for lo in (0, 7_000):
        piece = raw[lo * item : (lo + 9_000) * item]
        for ours, theirs in zip(on_torch(piece, dtype, selections, lo), cpu(piece, dtype, selections, lo), strict=True):
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs, strict=True):
                assert np.array_equal(a.counts, b.counts)
                assert (a.argmax, a.max_abs) == (b.argmax, b.max_abs)

"""Weights in blocks of rows, in order: the one row-block planner (the spectrum's Gram and a diff's lockstep
reads cut their tensors with `plan_blocks`), and one side's blocks decoded to float32 for the Gram.

The chunk engine (stream.py) reduces each chunk where it lands and never hands values out; a Gram matrix
needs the values themselves, in row order. This stream reads the given matrices through the same `Reader`
(local mappings, the Hub's ranged reads into pooled buffers, GGUF, .bin), decodes each block to float32 in a
worker thread (quantized weights with the decoders `fit` uses, built from their companions as the engine
builds them) and yields the blocks in order to the caller's thread, a few blocks ahead:

- a weight decoded in logical row-major order (every unquantized dtype, and every quantized format but
  GPTQ and AWQ): `Block.values` is flat, elements [first, first + size) of the logical matrix in row-major
  order. Unquantized blocks are whole rows; quantized ones whole code units (a GGUF block may end mid-row).
- GPTQ and AWQ decode in their storage order [A, out, B] (decode/formats/gptq.py, "Decoded order": A stored
  rows, B inputs per packed word; logical element (j, a·B + b) is decoded (a, j, b)): each block is whole
  stored rows and `Block.values` is turned into rows of Wᵀ ([rows, out], `transposed`), starting at row
  `first` of Wᵀ. Wᵀ has the singular values of W.

A block holds at most BLOCK_VALUES values (float32) and BLOCK_BYTES stored bytes; at most `2 x workers`
blocks are read ahead (local: Execution.chunk_workers threads; fetching readers: the reader's
connections; executor.py's ordered window). Memory: those blocks plus the reader's own buffers, whatever
the matrix. A diff (delta/paired.py) asks for blocks of a given number of whole rows per tensor instead, so
that both sides are cut at the same rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..codes import code_values
from ..decode.formats import selects_any_elements
from ..decode.loader import CompanionLoader, LazyDecoder
from ..execution import Execution
from ..executor import LOCAL
from ..source.chunks import CHUNK_ALIGN, Chunk, cut_step
from ..source.plan import STORAGE_NUMPY, TensorRef
from ..source.reader import Reader

BLOCK_VALUES = 1 << 21  # decoded float32 values per block (8 MB)
BLOCK_BYTES = 8 << 20  # stored bytes per block, at most (and at most the reader's chunk size)
MAX_AHEAD = 8  # blocks read ahead of the one the caller works on, at most


@dataclass(frozen=True)
class Layout:
    """How one matrix's stored bytes are cut into blocks and what a block's values are."""

    packed: bool  # GPTQ/AWQ: blocks of whole stored rows, values as rows of Wᵀ
    step: int  # stored bytes per block (the last one may be shorter)
    stored_rows: int  # packed: A; otherwise 0
    out: int  # packed: the logical matrix's rows (W's out); otherwise 0


@dataclass(frozen=True)
class Block:
    job: int  # index into the refs
    chunk: Chunk  # its stored bytes
    lo: int  # offset of those bytes in the tensor
    first: bool  # the tensor's first block
    last: bool


@dataclass
class Values:
    """One block's values: flat logical elements from `first`, or (`transposed`) rows of Wᵀ from row `first`."""

    block: Block
    first: int
    values: np.ndarray
    transposed: bool


def layout_of(ref: TensorRef, limit: int, rows: int | None = None) -> Layout:
    """The blocks of one matrix (see the module docstring), of at most `limit` stored bytes; `rows`: blocks of
    that many whole rows (of the tensor read as [-1, last dim]) instead."""
    shape = ref.shape
    if rows is not None:
        m = math.prod(shape[:-1]) if len(shape) > 1 else max(1, math.prod(shape))
        return Layout(False, rows * (ref.nbytes // max(1, m)), 0, 0)
    numel = math.prod(shape)
    q = ref.quant
    if q is not None and not selects_any_elements(q.spec.format):
        a = int(q.codes.shape[0])
        out = int(shape[0])
        if ref.nbytes % a or numel % (a * out):
            raise ValueError(f"{ref.name}: {ref.nbytes} bytes are not {a} stored rows of {out} outputs")
        row_bytes, row_values = ref.nbytes // a, numel // a
        rows = max(1, min(limit // row_bytes, BLOCK_VALUES // row_values))
        return Layout(True, rows * row_bytes, a, out)
    if q is not None:  # row-major codes: whole code units, about BLOCK_VALUES values
        per_value = ref.nbytes / max(1, numel)
        return Layout(False, cut_step(max(CHUNK_ALIGN, min(limit, int(BLOCK_VALUES * per_value))), q.unit_bytes), 0, 0)
    item = STORAGE_NUMPY[ref.dtype.name].itemsize
    n = int(shape[-1]) if shape else 1
    row_bytes = n * item
    if row_bytes <= limit:  # whole rows
        rows = max(1, min(limit // row_bytes, BLOCK_VALUES // max(1, n)))
        return Layout(False, rows * row_bytes, 0, 0)
    return Layout(False, cut_step(limit, item), 0, 0)  # rows longer than a block: cut on whole elements


def plan_blocks(
    refs: Sequence[TensorRef], limit: int, rows: Sequence[int] | None = None
) -> tuple[list[Block], list[Layout]]:
    """Every tensor's blocks, in the given order (layout_of: at most `limit` bytes, or `rows[j]` whole rows of
    tensor j); chunk indices count from 0 (what reader.start() gets)."""
    blocks: list[Block] = []
    layouts = [layout_of(ref, limit, rows[j] if rows is not None else None) for j, ref in enumerate(refs)]
    for job, (ref, lay) in enumerate(zip(refs, layouts, strict=True)):
        for lo in range(0, ref.nbytes, lay.step):
            hi = min(ref.nbytes, lo + lay.step)
            chunk = Chunk(len(blocks), ref.shard, ref.start + lo, ref.start + hi, ())
            blocks.append(Block(job, chunk, lo, lo == 0, hi == ref.nbytes))
    return blocks, layouts


def float32_of(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements (bytes) as float32 values: exact for BF16, F16 and FP8; F64 rounded, as `fit` does."""
    stored = raw.view(STORAGE_NUMPY[dtype])
    if dtype == "F32":
        return np.array(stored, dtype=np.float32)  # a copy: the reader's buffer is reused
    if dtype == "BF16":
        return (stored.astype(np.uint32) << np.uint32(16)).view(np.float32)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        return code_values(dtype).astype(np.float32)[stored]
    return stored.astype(np.float32)  # F16, F64


def decode_block(ref: TensorRef, lay: Layout, block: Block, raw: np.ndarray, decoder: LazyDecoder | None) -> Values:
    """One block's float32 values (see `Values`)."""
    if ref.quant is None:
        item = STORAGE_NUMPY[ref.dtype.name].itemsize
        return Values(block, block.lo // item, float32_of(raw, ref.dtype.name), False)
    assert decoder is not None
    values, first = decoder.get().decode(raw, block.lo)
    if values.dtype != np.float32:  # rows only reordered (GGUF's F16 Q/K): the stored type's elements
        values = float32_of(values.view(np.uint8), ref.dtype.name)
    if not lay.packed:
        return Values(block, first, values, False)
    row_values = math.prod(ref.shape) // lay.stored_rows
    b = row_values // lay.out
    a0 = first // row_values
    rows = values.reshape(-1, lay.out, b).transpose(0, 2, 1).reshape(-1, lay.out)  # [a, out, b] -> Wᵀ rows
    return Values(block, a0 * b, np.ascontiguousarray(rows), True)


def stream_values(refs: Sequence[TensorRef], reader: Reader, execution: Execution) -> Iterator[Values]:
    """Every block of every matrix in `refs`, decoded, in order (reader.start() is called here)."""
    blocks, layouts = plan_blocks(refs, min(BLOCK_BYTES, reader.chunk_bytes))
    quantized = [ref.quant for ref in refs if ref.quant is not None]
    loader = CompanionLoader(reader.tensor_bytes, quantized) if quantized else None
    handles = iter(range(len(quantized)))
    decoders = [
        LazyDecoder(loader, next(handles)) if loader is not None and ref.quant is not None else None for ref in refs
    ]
    reader.start([b.chunk for b in blocks], verify=False)
    workers = max(1, reader.workers if reader.fetches else execution.chunk_workers)

    def task(block: Block) -> Values:
        with reader.chunk(block.chunk) as raw:  # a fetching reader reads into a pooled buffer here
            return decode_block(refs[block.job], layouts[block.job], block, raw, decoders[block.job])

    try:
        window = max(2, min(2 * workers, MAX_AHEAD))
        for block, done in LOCAL.map(
            task, blocks, workers=workers, window=window, on_abandon=reader.cancel, label="weightdiag-rows"
        ):
            decoder = decoders[block.job]
            if block.last and decoder is not None:
                decoder.release()  # its companions go once the tensor's last block is decoded
            yield done
    finally:
        if loader is not None:
            loader.close()

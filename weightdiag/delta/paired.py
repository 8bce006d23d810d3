"""Paired reads: two checkpoints streamed in lockstep, row block against row block of the same tensor.

A tensor of logical shape [..., n] is read as an m x n matrix (m = the product of the leading dims; a vector
is an n x 1 column) in blocks of whole rows, the same rows on both sides whatever each side's dtype (F32
against BF16, FP8 block codes against F32): the element ranges match, the byte ranges follow each side's
own row size: each side is cut by the one row-block planner (reduce/row_stream.py `plan_blocks`) into the
same numbers of whole rows. A block is at most BLOCK_BYTES of either side's stored bytes and `block_elems`
(weightdiag/tuning.py) elements, so memory is a few blocks per side (about twice a fit's chunks, plus the
arithmetic on them), whatever the tensor. Each side's bytes come from its own reader (`start`, then `chunk` as a context
manager): local mappings or ranged GETs into pooled buffers, several blocks at once through executor.py's
ordered window. A Hub side is verified as a
fit is (every shard byte through the reader's ordered sha256, see `side_reads`) when its blocks come in its
own file order.

A quantized side is decoded by the same decoders `fit` uses (weightdiag.decode.decoder), built from its
companions when its first block is read; formats decoded in row-major order only (GPTQ and AWQ pack
columns across rows: refused, exit 2).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import kernels, tuning
from ..codes import FINITE_LIMIT16
from ..errors import CheckpointFormatError, QuantizationError
from ..executor import LOCAL
from ..reduce.blas import blas_threads
from ..reduce.row_stream import Block, plan_blocks
from ..source.chunks import Chunk
from ..source.plan import STORAGE_NUMPY, TensorRef
from ..source.reader import Reader
from .measures import Side
from .pairing import Pair

BLOCK_BYTES = 8 << 20  # stored bytes of one side in one block (a Hub reader's buffers hold 16 MiB)
COUNTED_BLOCK_ELEMS = 1 << 22  # two sides in one 16-bit dtype: one C pass, no float64 arrays (measures.py)


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """(m, n): leading dims flattened into rows; a vector is a column (so it is cut into blocks too)."""
    if len(shape) <= 1:
        return (math.prod(shape) if shape else 1), 1
    return math.prod(shape[:-1]), int(shape[-1])


def row_bytes(ref: TensorRef, m: int) -> int:
    """Stored bytes of one logical row (codes for a quantized side), refusing layouts not cut by rows."""
    if ref.nbytes % m:
        raise CheckpointFormatError(
            f"{ref.name}: {ref.nbytes} stored bytes are not {m} equal rows; weightdiag cannot read it by rows",
            file=ref.name,
        )
    return ref.nbytes // m


def rows_per_block(n: int, base_row: int, tuned_row: int, elems: int | None = None) -> int:
    """Rows per block: at most BLOCK_BYTES of either side and `elems` elements (default: the block_elems knob,
    what the float64 arithmetic holds a few arrays of)."""
    elems = elems if elems is not None else tuning.current().block_elems
    widest = max(base_row, tuned_row, 1)
    return max(1, min(BLOCK_BYTES // widest, elems // max(n, 1)))


def block_rows(pair: Pair) -> int:
    """Rows per block of a pair: larger blocks where the one-pass kernel takes them (fewer merges), a multiple
    of the rows a side's code unit spans (a GGUF Q/K tensor is decoded in whole heads of rows)."""
    m, n = matrix_shape(pair.base.shape)
    base, tuned = pair.base, pair.tuned
    counted = (
        kernels.HAVE_C
        and base.quant is None
        and tuned.quant is None
        and base.dtype.name == tuned.dtype.name
        and base.dtype.name in FINITE_LIMIT16
    )
    rows = rows_per_block(n, row_bytes(base, m), row_bytes(tuned, m), COUNTED_BLOCK_ELEMS if counted else None)
    unit = math.lcm(*(_unit_rows(ref, m) for ref in (base, tuned)))
    return max(unit, rows - rows % unit)


def _unit_rows(ref: TensorRef, m: int) -> int:
    """Rows spanned by one code unit of a quantized side (1 when its units are within a row)."""
    unit = ref.quant.unit_bytes if ref.quant is not None else 1
    per_row = row_bytes(ref, m)
    return unit // per_row if unit > per_row and unit % per_row == 0 else 1


@dataclass(frozen=True)
class Rows:
    """Rows [r0, r1) of pair `pair`, read from both sides: each side's block of them."""

    pair: int
    r0: int
    r1: int
    base: Block
    tuned: Block

    @property
    def first(self) -> bool:  # the tensor's first block
        return self.base.first

    @property
    def last(self) -> bool:
        return self.base.last


def plan_rows(pairs: Sequence[Pair]) -> list[Rows]:
    """Every pair cut into blocks of the same rows on both sides (plan_blocks), in the pairs' order; chunk
    indices count per side."""
    steps = []
    for pair in pairs:
        m, n = matrix_shape(pair.base.shape)
        rb, rt = row_bytes(pair.base, m), row_bytes(pair.tuned, m)
        if max(rb, rt) > BLOCK_BYTES and max(rb, rt) > 16 << 20:
            raise CheckpointFormatError(
                f"{pair.name}: one row of {n} elements is more than 16 MiB; diff reads whole rows", file=pair.name
            )
        steps.append(block_rows(pair))
    limit = 0  # unused: every tensor is cut in whole rows
    base, _ = plan_blocks([p.base for p in pairs], limit, steps)
    tuned, _ = plan_blocks([p.tuned for p in pairs], limit, steps)
    out = []
    for b, t in zip(base, tuned, strict=True):
        pair = pairs[b.job]
        rb = row_bytes(pair.base, matrix_shape(pair.base.shape)[0])
        r0 = b.lo // rb
        out.append(Rows(b.job, r0, r0 + b.chunk.nbytes // rb, b, t))
    return out


ReadTensor = Callable[[TensorRef], np.ndarray]


def decoder_for(ref: TensorRef, read: ReadTensor):
    """The row-major decoder of a quantized weight, its companions read now (they are small)."""
    from ..decode.decoder import Companion
    from ..decode.formats import build_decoder, selects_any_elements

    q = ref.quant
    assert q is not None
    if not selects_any_elements(q.spec.format):  # decoded in storage order (GPTQ, AWQ), not row by row
        raise QuantizationError(
            f"{ref.name}: {q.spec.label} packs columns across rows; diff reads whole rows and cannot decode it; "
            "diff the unquantized model instead",
            method=q.spec.method,
        )
    companions = {
        role: Companion(read(c), c.dtype.name, c.shape)
        for role, c in q.companions.items()
        if not role.startswith("activation")
    }
    return build_decoder(q, companions)


def side_values(ref: TensorRef, raw: np.ndarray, byte_lo: int, decoder: Any, first: int) -> Side:
    """One side of a block: decoded float32 values for a quantized weight, else its stored elements."""
    if ref.quant is not None:
        if byte_lo % decoder.unit_bytes:  # a row that does not start on a whole code unit
            raise QuantizationError(
                f"{ref.name}: its rows do not start on whole {ref.quant.spec.label} code units; diff reads whole "
                "rows and cannot decode it; diff the unquantized model instead",
                method=ref.quant.spec.method,
            )
        values, at = decoder.decode(raw, byte_lo)
        if at != first:
            raise CheckpointFormatError(f"{ref.name}: decoded block starts at {at}, not {first}", file=ref.name)
        if ref.dtype.name != "F32":  # stored elements only reordered (GGUF F16 Q/K rows): as stored
            return Side(ref.dtype.name, values)
        return Side("F32", None, values)
    dtype = ref.dtype.name
    stored = raw.view(STORAGE_NUMPY[dtype])
    return Side(dtype, stored)


BlockWork = Callable[[Rows, Side, Side], Any]


@dataclass
class SideReads:
    """One side's reads in the order they are made: each block's chunk, and (when its shards are verified) the
    filler chunks that make every shard's bytes pass through the reader's hash, in file order."""

    chunks: list[Chunk]  # what reader.start() gets: every read, indexed in order
    block: list[Chunk]  # the chunk of block i
    before: list[list[Chunk]]  # fillers to read just before block i's chunk
    after: list[Chunk]  # fillers after the last block
    verify: bool


def side_reads(block_chunks: list[Chunk], regions: dict[int, tuple[int, int]] | None, chunk_bytes: int) -> SideReads:
    """With `regions` ({shard: (data start, size)}: the reader can verify), tile every shard around the blocks'
    chunks, if these come in file order (they do when both checkpoints store their tensors in the same order);
    otherwise read the blocks only, unverified."""
    plain = SideReads(
        [replace(c, index=i) for i, c in enumerate(block_chunks)], [], [[] for _ in block_chunks], [], False
    )
    plain.block = plain.chunks
    if regions is None or any((a.shard, a.end) > (b.shard, b.start) for a, b in itertools.pairwise(block_chunks)):
        return plain
    if any(c.shard not in regions for c in block_chunks):
        return plain
    order: list[tuple[str, Chunk]] = []
    at = {shard: start for shard, (start, _) in regions.items()}

    def fill(shard: int, lo: int, hi: int) -> None:
        for a in range(lo, hi, chunk_bytes):
            order.append(("fill", Chunk(0, shard, a, min(a + chunk_bytes, hi), ())))

    shards = sorted(regions)
    done: set[int] = set()
    for c in block_chunks:
        for shard in shards:  # shards before this chunk's: tiled to their end
            if shard >= c.shard or shard in done:
                continue
            fill(shard, at[shard], regions[shard][1])
            done.add(shard)
        if c.start < at[c.shard]:
            return plain
        fill(c.shard, at[c.shard], c.start)
        order.append(("block", c))
        at[c.shard] = c.end
    for shard in shards:
        if shard not in done:
            fill(shard, at[shard], regions[shard][1])
    chunks = [replace(c, index=i) for i, (_, c) in enumerate(order)]
    out = SideReads(chunks, [], [], [], True)
    pending: list[Chunk] = []
    for (kind, _), c in zip(order, chunks, strict=True):
        if kind == "block":
            out.block.append(c)
            out.before.append(pending)
            pending = []
        else:
            pending.append(c)
    out.after = pending
    return out


def stream_pairs(
    pairs: Sequence[Pair],
    base_reader: Reader,
    tuned_reader: Reader,
    work: BlockWork,
    *,
    workers: int,
    before_tensor: Callable[[int], None] | None = None,
    verify: bool = False,
    verifying: dict[str, bool] | None = None,
) -> Iterator[tuple[Rows, Any]]:
    """(rows, work(rows, base side, tuned side)) for every block, in order. `work` runs in worker threads
    (several blocks at once); `before_tensor(pair index)` runs in this thread before a tensor's first block
    is queued (to set up its accumulators). With `verify`, a side whose reader can check its shards' hashes
    (the Hub's) and whose blocks come in file order reads every byte of its shards (the bytes between and
    around the blocks too), so that reader.finish() can compare each shard's sha256."""
    blocks = plan_rows(pairs)
    reads = []
    for reader, chunks in (
        (base_reader, [b.base.chunk for b in blocks]),
        (tuned_reader, [b.tuned.chunk for b in blocks]),
    ):
        plan = side_reads(chunks, reader.regions() if verify else None, reader.chunk_bytes)
        reader.start(plan.chunks, verify=plan.verify)
        reads.append(plan)
    base_reads, tuned_reads = reads
    if verifying is not None:  # which sides read every byte of their shards (the caller calls finish())
        verifying.update(base=base_reads.verify, tuned=tuned_reads.verify)
    decoders: dict[tuple[int, int], Any] = {}

    def skip(reader: Reader, fillers: list[Chunk]) -> None:
        for filler in fillers:  # read for the hash only
            with reader.chunk(filler):
                pass

    def task(item: tuple[int, Rows]) -> Any:
        i, block = item
        pair = pairs[block.pair]
        _m, n = matrix_shape(pair.base.shape)
        first = block.r0 * n
        skip(base_reader, base_reads.before[i])
        with base_reader.chunk(base_reads.block[i]) as raw_b:
            skip(tuned_reader, tuned_reads.before[i])
            # blocks run side by side: no threads inside the kernels
            with tuned_reader.chunk(tuned_reads.block[i]) as raw_t, kernels.thread_budget(1):
                b = side_values(pair.base, raw_b, block.base.lo, decoders.get((block.pair, 0)), first)
                t = side_values(pair.tuned, raw_t, block.tuned.lo, decoders.get((block.pair, 1)), first)
                return work(block, b, t)

    def queued() -> Iterator[tuple[int, Rows]]:
        """The blocks as they are queued, a tensor's decoders and accumulators set up before its first."""
        for i, block in enumerate(blocks):
            if block.first:
                pair = pairs[block.pair]
                if before_tensor is not None:
                    before_tensor(block.pair)
                for side, (ref, reader) in enumerate(((pair.base, base_reader), (pair.tuned, tuned_reader))):
                    if ref.quant is not None:
                        decoders[(block.pair, side)] = decoder_for(ref, reader.tensor_bytes)
            yield i, block

    def cancel() -> None:
        for reader in (base_reader, tuned_reader):
            reader.cancel()

    # Each worker multiplies its own block (the sketch's products, the Gram): one BLAS thread each, or two
    # workers x two OpenBLAS threads on two cores ran the sketch 2x slower (benchmarks/bench_diff.py).
    with blas_threads(1) if workers > 1 else nullcontext():
        for (_, block), result in LOCAL.map(
            task, queued(), workers=workers, on_abandon=cancel, label="weightdiag-diff"
        ):
            if block.last:
                decoders.pop((block.pair, 0), None)
                decoders.pop((block.pair, 1), None)
            yield block, result
        skip(base_reader, base_reads.after)
        skip(tuned_reader, tuned_reads.after)

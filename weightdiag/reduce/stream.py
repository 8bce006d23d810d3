"""The chunk engine: read a model's bytes in fixed-size chunks, several at once, and reduce each as it lands.

Every `Reduction` is additive (see reduce.merge), so a tensor never needs to be in memory whole: each
chunk's pieces are reduced on their own in the worker thread that read the chunk, and the main thread
merges the partial reductions of a tensor once its last piece is in. Memory is about `workers` chunk
buffers plus the small reductions, whatever the largest tensor is. Results come out in file order.

Readers provide the bytes (source/reader.py `Reader`): local files through short-lived mappings, the Hub
through ranged GETs into pooled buffers, hashing every byte on the way when asked to verify.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import kernels, tuning
from ..decode.loader import LazyDecoder
from ..execution import Execution
from ..segments import Segments
from ..source.chunks import Chunk, Span, plan_chunks
from ..source.plan import STORAGE_NUMPY, TensorRef
from ..source.reader import Reader
from .reduction import Reduction, grid_probe, merge, reduce_counted, reduce_range
from .vectors import VectorSummary, summarize_vector


@dataclass(frozen=True)
class Target:
    """A tensor to reduce over `selections` (None: all its elements; else a fused part), or, with no
    selections, a vector whose bytes are gathered whole (norm weights and biases are small). With a
    `decoder`, the bytes are a quantized weight's codes: each piece is decoded to float32 values first (to
    the ref's dtype where only rows are reordered: GGUF's F16 Q/K; a vector's pieces are decoded too;
    selections are of the logical matrix; argmax positions come out logical too)."""

    ref: TensorRef
    selections: tuple[Segments | None, ...]
    decoder: LazyDecoder | None = None  # built on first use from its companions, dropped once reduced
    # A vector with no selections: summarised piece by piece (values + offset, see vectors.py) instead of
    # gathered whole; for vectors too long to hold as float64.
    summarize: bool = False
    offset: float = 0.0


PieceReducer = Callable[[np.ndarray, str, Sequence[Segments | None], int], list[list[Reduction]]]


def piece_reducer(device: str) -> PieceReducer:
    """Reduce the elements [lo, lo + n) of a tensor (its raw bytes) over each selection: partial reductions."""
    if device == "cpu":

        def on_cpu(raw: np.ndarray, dtype: str, selections: Sequence[Segments | None], lo: int):
            flat = raw.view(STORAGE_NUMPY[dtype])
            return [reduce_range(flat, dtype, selection, lo) for selection in selections]

        return on_cpu
    return torch_piece_reducer(device)


def torch_piece_reducer(device: str) -> PieceReducer:
    """The same partial reductions with torch on `device` (CUDA; tested on the CPU device)."""
    import warnings

    from ..segments import clip
    from .reduction_torch import reduce_torch, upload

    def on_device(raw: np.ndarray, dtype: str, selections: Sequence[Segments | None], lo: int):
        with warnings.catch_warnings():  # mapped chunks are read-only; torch only reads them
            warnings.filterwarnings("ignore", message=".*not writ.*", category=UserWarning)
            data = upload(raw, dtype, device)  # once per piece, however many parts it has
        n = raw.size // STORAGE_NUMPY[dtype].itemsize
        out = []
        for selection in selections:
            parts = []
            for sub in [Segments.whole(n)] if selection is None else clip(selection, lo, lo + n):
                red = reduce_torch(data, dtype, device, sub)
                red.argmax = red.argmax + lo if red.argmax >= 0 else -1
                parts.append(red)
            out.append(parts)
        return out

    return on_device


# Results of queued chunks wait for the main thread, whose per-tensor work (statistics, fits, the record)
# is the slow part for models of many small tensors: beyond this many tensors (pieces) queued, reading ahead
# stops at two chunks. A waiting piece holds its nonzero counts, up to tens of kilobytes.
MAX_PENDING_PIECES = 4096


ChunkResult = list[tuple[int, Any]]  # (target index, its piece's partial result) for each piece of a chunk


class _PackingList(list):
    """The results of one chunk: each partial reduction is packed as it is appended (a chunk may hold
    thousands of small tensors; 512 KiB of counts each would add up to gigabytes)."""

    def append(self, item: tuple[int, Any]) -> None:
        result = item[1]
        if isinstance(result, list):
            for parts in result:
                for red in parts:
                    red.pack()
        super().append(item)


@dataclass(frozen=True)
class ReadPlan:
    """What the engine reads for a list of targets: the chunks, in file order, and whether every byte of
    the shards is read (so that a reader can verify their hashes). Plain data: the same plan whoever runs it."""

    chunks: list[Chunk]
    verify: bool


def plan_reads(targets: Sequence[Target], reader: Reader, verify: bool) -> ReadPlan:
    """Chunks of about reader.chunk_bytes covering every target (large tensors cut at split_bytes
    multiples of their own start, whatever the reader: the same pieces, the same merged sums); with
    `verify` and a reader that hashes, every byte of the shards' data regions."""
    spans = [Span(t.ref.shard, t.ref.start, t.ref.end, t.ref.quant.unit_bytes if t.ref.quant else 1) for t in targets]
    regions = reader.regions() if verify else None
    split = tuning.current().split_bytes
    return ReadPlan(plan_chunks(spans, reader.chunk_bytes, cover=regions, split_bytes=split), regions is not None)


def reduce_chunk(
    targets: Sequence[Target] | Mapping[int, Target], chunk: Chunk, buf: np.ndarray, device: str
) -> ChunkResult:
    """The partial result of each piece of one chunk (its bytes `buf`): reductions per selection, a
    vector's bytes or its summary. Runs in a worker, one chunk per worker: no further kernel threads."""
    reduce_piece = piece_reducer(device)
    out = _PackingList()  # partial reductions wait for the merge with their nonzero counts only
    with kernels.thread_budget(1):
        for piece in chunk.pieces:
            target = targets[piece.item]
            raw = buf[piece.offset : piece.offset + piece.hi - piece.lo]
            if not target.selections:
                if target.decoder is not None:  # a vector computed from its bytes (a GGUF norm stored as 1 + w)
                    raw = target.decoder.get().decode(raw, piece.lo)[0].view(np.uint8)
                if target.summarize:
                    out.append((piece.item, summarize_vector(raw, target.ref.dtype.name, target.offset)))
                else:
                    out.append((piece.item, raw.copy()))  # the buffer is reused once this returns
                continue
            if target.decoder is not None:
                decoder = target.decoder.get()
                counted = decoder.counts(raw, piece.lo) if target.selections == (None,) else None
                if counted is not None:  # counted per scale group and code: no value materialised
                    red = reduce_counted(counted.values, counted.weights, counted.numel, counted.locate)
                    out.append((piece.item, [[red]]))
                    continue
                values, first = decoder.decode(raw, piece.lo)  # float32, or rows only reordered: ref.dtype
                selections = [s if s is None else decoder.selection(s) for s in target.selections]
                dtype = target.ref.dtype.name
                out.append((piece.item, reduce_piece(values.view(np.uint8), dtype, selections, first)))
                del values  # before the chunk's next piece is decoded: one piece's values at a time
                continue
            dtype = target.ref.dtype.name
            lo = piece.lo // STORAGE_NUMPY[dtype].itemsize
            result = reduce_piece(raw, dtype, target.selections, lo)
            shape = target.ref.shape
            if lo == 0 and len(shape) >= 2 and result and result[0]:  # look for a quantization grid once
                result[0][0].grid = grid_probe(raw.view(STORAGE_NUMPY[dtype]), shape[-1])
            out.append((piece.item, result))
    return out


@dataclass
class _Partial:
    pieces_left: int
    reductions: list[list[Reduction]]
    raw: list[np.ndarray]
    summary: VectorSummary | None = None


class Fold:
    """Chunk results in, finished targets out: each target's partial results merged one at a time in chunk
    order (the same sums in the same order for any chunking, any executor, any finishing order of the
    chunks themselves), and the target handed out once its last piece is in."""

    def __init__(self, targets: Sequence[Target], chunks: Sequence[Chunk]) -> None:
        self._targets = targets
        self._partials: dict[int, _Partial] = {}
        for chunk in chunks:
            for piece in chunk.pieces:
                entry = self._partials.setdefault(
                    piece.item, _Partial(0, [[] for _ in targets[piece.item].selections], [])
                )
                entry.pieces_left += 1

    def add(self, results: ChunkResult) -> Iterator[tuple[int, list[Reduction] | np.ndarray | VectorSummary]]:
        """Fold the next chunk's results (chunks must come in plan order); yield the targets it completes."""
        for i, (item, result) in enumerate(results):
            results[i] = None  # type: ignore[call-overload]  # its counts are unpacked below: let them go
            entry = self._partials[item]
            if isinstance(result, np.ndarray):
                entry.raw.append(result)
            elif isinstance(result, VectorSummary):  # pieces come in flat order
                entry.summary = result if entry.summary is None else entry.summary.merge(result)
            else:  # fold as they come: a few partials in memory, however large the tensor
                repack = entry.pieces_left > 1 and len(entry.reductions) > 1
                for collected, parts in zip(entry.reductions, result, strict=True):
                    for part in parts:  # one at a time: the same sums in the same order for any chunking
                        collected[:] = [merge([*collected, part])]
                    if repack and collected:  # a tensor cut into many records (256 experts' parts) waits packed
                        collected[0].pack()
            entry.pieces_left -= 1
            if entry.pieces_left == 0:
                del self._partials[item]
                yield item, self._finished(item, entry)

    def _finished(self, item: int, entry: _Partial) -> list[Reduction] | np.ndarray | VectorSummary:
        handle = self._targets[item].decoder
        if handle is not None and not self._targets[item].selections:  # a decoded vector: its decoder is done
            handle.release()
        if entry.summary is not None:
            return entry.summary
        if entry.raw:
            return entry.raw[0] if len(entry.raw) == 1 else np.concatenate(entry.raw)
        merged = [parts[0].unpack() for parts in entry.reductions]
        if handle is not None:  # decoded order -> the logical matrix's flat index
            decoder = handle.get()
            for red in merged:
                red.argmax = decoder.logical_index(red.argmax) if red.argmax >= 0 else -1
            handle.release()
        return merged


def reduce_chunked(
    targets: Sequence[Target],
    reader: Reader,
    execution: Execution,
    *,
    verify: bool = False,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, list[Reduction] | np.ndarray | VectorSummary]]:
    """(target index, merged reduction per selection, a vector's raw bytes or its summary), in file order:
    the plan (plan_reads), run here on threads (reduce_chunks), folded in order (Fold)."""
    plan = plan_reads(targets, reader, verify)
    reader.start(plan.chunks, verify=plan.verify)
    fold = Fold(targets, plan.chunks)
    with closing(reduce_chunks(targets, reader, plan.chunks, execution)) as reduced:  # closed now if we stop
        for chunk, results in reduced:
            if on_bytes:  # tensor bytes only, so that the total matches the plan's
                on_bytes(sum(piece.hi - piece.lo for piece in chunk.pieces))
            yield from fold.add(results)


def reduce_chunks(
    targets: Sequence[Target] | Mapping[int, Target],
    reader: Reader,
    chunks: Sequence[Chunk],
    execution: Execution,
) -> Generator[tuple[Chunk, ChunkResult], None, None]:
    """Each chunk's partial results (reduce_chunk), in the order of `chunks` (reader.start() was told them):
    read and reduced on threads, several chunks at once. Nothing is merged here: a local fit folds them as
    they come, a task on a cluster node hands them back to the machine that folds them."""

    def reduce_buffer(chunk: Chunk, buf: np.ndarray) -> ChunkResult:
        return reduce_chunk(targets, chunk, buf, execution.device)

    pools: list[ThreadPoolExecutor] = []
    if not reader.fetches:  # cheap to get (local mappings): read and reduce in the same worker
        pool = ThreadPoolExecutor(execution.chunk_workers, thread_name_prefix="weightdiag-chunk")
        pools.append(pool)
        window = 2 * execution.chunk_workers  # chunks queued ahead of the one the main thread waits for

        def task(chunk: Chunk) -> ChunkResult:
            with reader.chunk(chunk) as buf:
                return reduce_buffer(chunk, buf)

        def submit(chunk: Chunk) -> Future[ChunkResult]:
            return pool.submit(task, chunk)

    else:  # slow to get (network): connections keep reading while the cores reduce what has landed
        fetch_pool = ThreadPoolExecutor(reader.workers, thread_name_prefix="weightdiag-fetch")
        reduce_pool = ThreadPoolExecutor(execution.threads, thread_name_prefix="weightdiag-reduce")
        pools += [fetch_pool, reduce_pool]
        # Buffers go to chunks in file order (the reader sees to it), so queueing more chunks than
        # buffers is safe: the next one starts reading as soon as any buffer is free.
        window = 2 * reader.buffers

        def reduce_fetched(chunk: Chunk, fetched: Future[np.ndarray]) -> ChunkResult:
            buf = fetched.result()
            ok = False
            try:
                out = reduce_buffer(chunk, buf[: chunk.nbytes])
                ok = True
                return out
            finally:
                reader.done(chunk, buf, ok)

        def submit(chunk: Chunk) -> Future[ChunkResult]:
            return reduce_pool.submit(reduce_fetched, chunk, fetch_pool.submit(reader.fetch, chunk))

    pending: deque[tuple[Chunk, Future[ChunkResult]]] = deque()
    finished = False
    try:
        next_chunk = iter(chunks)
        waiting = None  # the next chunk, when the queue is full

        def top_up() -> None:
            """Queue chunks ahead, up to `window` of them and, when they hold many small tensors (whose
            results wait for the main thread's per-tensor work), up to MAX_PENDING_PIECES pieces."""
            nonlocal waiting
            while len(pending) < window:
                chunk = waiting if waiting is not None else next(next_chunk, None)
                waiting = None
                if chunk is None:
                    return
                if len(pending) >= 2 and sum(len(c.pieces) for c, _ in pending) >= MAX_PENDING_PIECES:
                    waiting = chunk
                    return
                pending.append((chunk, submit(chunk)))

        top_up()
        while pending:
            chunk, future = pending.popleft()
            results = future.result()
            top_up()
            yield chunk, results
        finished = True
    finally:
        if not finished:
            reader.cancel()
        for each in pools:
            each.shutdown(wait=True, cancel_futures=True)

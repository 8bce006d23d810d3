"""The chunk engine: read a model's bytes in fixed-size chunks, several at once, and reduce each as it lands.

Every `Reduction` is additive (see reduce.merge), so a tensor never needs to be in memory whole: each
chunk's pieces are reduced on their own in the worker thread that read the chunk, and the caller's thread
merges the partial reductions of a tensor once its last piece is in (`Fold`). Memory is about `workers`
chunk buffers plus the small reductions, whatever the largest tensor is. Results come out in file order.

The engine is a pass (executor.py), `ChunkPass`: its parts are the plan's chunks, a run reads and reduces
consecutive chunks through a reader (this machine's, or one a cluster node opened again) and hands back each
chunk's partial results, and the fold merges them in chunk order: the same sums in the same order whichever
executor ran the chunks. The fit and `report --plot`'s histograms both run it.

Readers provide the bytes (source/reader.py `Reader`): local files through short-lived mappings, the Hub
through ranged GETs into pooled buffers, hashing every byte on the way when asked to verify.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from .. import kernels, settings, tuning
from ..decode.decoder import Counted, Decoder
from ..decode.loader import LOOKAHEAD, CompanionLoader, LazyDecoder
from ..execution import Execution
from ..executor import LOCAL, TASK_BASE_MEMORY, PassRun, Verified, check_verified
from ..segments import Segments
from ..source.chunks import Chunk, Span, plan_chunks
from ..source.plan import STORAGE_NUMPY, ModelPlan, Quantized, TensorRef
from ..source.reader import Reader, Verification
from ..source.reopen import reopen
from ..source.spec import SourceSpec
from .pairs import LineGather, gather_lines
from .reduction import Reduction, grid_probe, merge, reduce_counted, reduce_range
from .vectors import VectorSummary, summarize_vector, values_of


@dataclass(frozen=True)
class Target:
    """A tensor to reduce over `selections` (None: all its elements; else a fused part), or, with no
    selections, a vector whose bytes are gathered whole (norm weights and biases are small). With a
    `decoder`, the bytes are a quantized weight's codes: each piece is decoded to float32 values first (to
    the ref's dtype where only rows are reordered: GGUF's F16 Q/K; a vector's pieces are decoded too;
    selections are of the logical matrix; argmax positions come out logical too)."""

    ref: TensorRef
    selections: tuple[Segments | None, ...]
    decoder: LazyDecoder | None = None  # set by a run (ChunkPass.run), from companions it reads itself
    # A vector with no selections: summarised piece by piece (values + offset, see vectors.py) instead of
    # gathered whole; for vectors too long to hold as float64.
    summarize: bool = False
    offset: float = 0.0
    # A matrix's lineage samples (reduce/sample.py): the sorted flat positions (int64) whose values the whole
    # reduction (selection None) carries in `Reduction.sample`, gathered as its pieces stream; and its paired
    # lines (reduce/pairs.py), whose elements it carries in `Reduction.lines`.
    sample: tuple[int, ...] | np.ndarray = ()
    lines: LineGather | None = None


PieceReducer = Callable[[np.ndarray, str, Sequence[Segments | None], int], list[list[Reduction]]]


def uses_torch(device: str) -> bool:
    """Whether the chunks of a job on `device` are reduced with torch (every device but the CPU; tests run the
    torch path on torch's CPU device by answering True)."""
    return device != "cpu"


def piece_reducer(device: str) -> PieceReducer:
    """Reduce the elements [lo, lo + n) of a tensor (its raw bytes) over each selection: partial reductions."""
    if not uses_torch(device):

        def on_cpu(raw: np.ndarray, dtype: str, selections: Sequence[Segments | None], lo: int):
            flat = raw.view(STORAGE_NUMPY[dtype])
            return [reduce_range(flat, dtype, selection, lo) for selection in selections]

        return on_cpu
    return torch_piece_reducer(device)


def torch_piece_reducer(device: str) -> PieceReducer:
    """The same partial reductions with torch on `device`, each piece on its own (read back at once)."""
    from .reduction_torch import resolve

    pieces = DevicePieces(device)

    def on_device(raw: np.ndarray, dtype: str, selections: Sequence[Segments | None], lo: int):
        return [[_shifted(red, lo) for red in resolve(parts)] for parts in pieces(raw, dtype, selections, lo)]

    return on_device


class DevicePieces:
    """The torch path's piece reducer for one chunk (issue 41): the chunk's bytes staged on the device once
    (reduce/device_stage.py, on first use), each part of each piece launched there (reduction_torch.launch),
    and all of them read back together by `finish`: one synchronisation per chunk (two with F32 parts)."""

    def __init__(self, device: str, buf: np.ndarray | None = None, staged: Any = None) -> None:
        self.device = device
        self._buf, self._stage = buf, staged  # device_stage.Staged: the chunk's buffers, taken on first use
        self._staged: Any = None
        self._base = buf.__array_interface__["data"][0] if buf is not None else 0

    def _device_bytes(self, raw: np.ndarray, dtype: str) -> Any:
        """`raw` on the device: a slice of the staged chunk when it lies in it at an aligned offset, else a copy."""
        import warnings

        from .reduction_torch import ITEM_BYTES, upload

        at = raw.__array_interface__["data"][0] - self._base
        inside = self._buf is not None and at >= 0 and at + raw.size <= self._buf.size
        if inside and at % ITEM_BYTES.get(dtype, 1) == 0:
            if self._staged is None:
                self._staged = self._stage.put(self._buf)
            return self._staged[at : at + raw.size]
        with warnings.catch_warnings():  # mapped chunks are read-only; torch only reads them
            warnings.filterwarnings("ignore", message=".*not writ.*", category=UserWarning)
            return upload(raw, dtype, self.device)  # once per piece, however many parts it has

    def __call__(self, raw: np.ndarray, dtype: str, selections: Sequence[Segments | None], lo: int) -> list[list[Any]]:
        from ..segments import clip
        from .reduction_torch import DEVICE_DTYPES, launch

        data = self._device_bytes(raw, dtype) if dtype in DEVICE_DTYPES else raw
        n = raw.size // STORAGE_NUMPY[dtype].itemsize
        out = []
        for selection in selections:
            parts = []
            for sub in [Segments.whole(n)] if selection is None else clip(selection, lo, lo + n):
                pending = launch(data, dtype, self.device, sub)
                pending.lo = lo
                parts.append(pending)
            out.append(parts)
        return out

    def finish(self, out: ChunkResult) -> ChunkResult:
        """The chunk's results with every pending part resolved (one read back), packed as the CPU path's."""
        from .reduction_torch import Pending, resolve

        def queued(result: Any) -> list[Pending]:
            parts = result if isinstance(result, list) else []
            return [red for part in parts for red in part if isinstance(red, Pending)]

        reductions = iter(resolve([red for _, result in out for red in queued(result)]))
        done = _PackingList()
        for item, result in out:
            if queued(result):
                result = [[_shifted(next(reductions), red.lo) for red in parts] for parts in result]
            done.append((item, result))
        return done


def _shifted(red: Reduction, lo: int) -> Reduction:
    """A piece's reduction with its argmax in the tensor's flat indices (the piece starts at element `lo`)."""
    red.argmax = red.argmax + lo if red.argmax >= 0 else -1
    return red


# Results of queued chunks wait for the caller's thread, whose per-tensor work (statistics, fits, the record)
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
    if not uses_torch(device):
        return _reduce_chunk(targets, chunk, buf, piece_reducer(device), _PackingList())
    from .device_stage import Staged, staging

    staged = Staged(staging(device))
    try:
        pieces = DevicePieces(device, buf, staged)
        return pieces.finish(_reduce_chunk(targets, chunk, buf, pieces, []))
    finally:
        staged.release()  # after the chunk's results were read back


def _reduce_chunk(
    targets: Sequence[Target] | Mapping[int, Target],
    chunk: Chunk,
    buf: np.ndarray,
    reduce_piece: Callable[[np.ndarray, str, Sequence[Segments | None], int], list[list[Any]]],
    out: list[tuple[int, Any]],
) -> ChunkResult:
    """reduce_chunk's pieces through `reduce_piece`, appended to `out` (a _PackingList, or a plain list of
    pending device parts that DevicePieces.finish resolves)."""
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
                    if len(target.sample):  # only the units holding sampled positions decoded
                        red.sample = _decoded_sampled(decoder, raw, piece.lo, target.sample, counted)
                    out.append((piece.item, [[red]]))
                    continue
                values, first = decoder.decode(raw, piece.lo)  # float32, or rows only reordered: ref.dtype
                selections = [s if s is None else decoder.selection(s) for s in target.selections]
                dtype = target.ref.dtype.name
                result = reduce_piece(values.view(np.uint8), dtype, selections, first)
                if len(target.sample) and result and target.selections[0] is None:  # positions in decoded order
                    result[0][0].sample = _sampled(values.view(np.uint8), dtype, target.sample, first)
                out.append((piece.item, result))
                del values  # before the chunk's next piece is decoded: one piece's values at a time
                continue
            dtype = target.ref.dtype.name
            lo = piece.lo // STORAGE_NUMPY[dtype].itemsize
            result = reduce_piece(raw, dtype, target.selections, lo)
            shape = target.ref.shape
            if lo == 0 and len(shape) >= 2 and result and result[0]:  # look for a quantization grid once
                result[0][0].grid = grid_probe(raw.view(STORAGE_NUMPY[dtype]), shape[-1])
            if result and target.selections[0] is None:
                if len(target.sample):
                    result[0][0].sample = _sampled(raw, dtype, target.sample, lo)
                if target.lines is not None:
                    flat = raw.view(STORAGE_NUMPY[dtype])
                    result[0][0].lines = _float32(gather_lines(flat, lo, target.lines), dtype)
            out.append((piece.item, result))
    return out


def _sampled(raw: np.ndarray, dtype: str, positions: tuple[int, ...] | np.ndarray, lo: int) -> np.ndarray:
    """float32 values of the sampled positions (sorted) that fall in this piece's elements [lo, ...)."""
    flat = raw.view(STORAGE_NUMPY[dtype])
    at = np.asarray(positions, dtype=np.int64)
    a, b = np.searchsorted(at, [lo, lo + flat.size])
    return _float32(flat[at[a:b] - lo], dtype)


def _float32(picked: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of elements gathered in their storage dtype."""
    picked = np.ascontiguousarray(picked)
    if dtype == "BF16":  # the upper half of a float32: no table lookup through float64 (the pairs' lines are long)
        return (picked.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore"):  # F64 beyond float32 is inf here, as the fit counts it (silently)
        return values_of(picked.view(np.uint8), dtype).astype(np.float32)


# Sampled units of a counted piece closer than this many stored bytes are decoded in one call: decoding a few
# kilobytes costs less than a call per unit (the lines of a paired column meet every row).
SAMPLE_RUN_GAP = 4096


def _decoded_sampled(
    decoder: Decoder, raw: np.ndarray, byte_lo: int, positions: tuple[int, ...] | np.ndarray, counted: Counted
) -> np.ndarray:
    """float32 values of the sampled positions (decoded order, sorted) in a counted piece: the decoder's own
    `decode` over runs of the whole units (`unit_bytes`) that hold them, never the piece's other values."""
    at = np.asarray(positions, dtype=np.int64)
    a, b = np.searchsorted(at, [counted.first, counted.first + counted.numel])
    wanted = at[a:b]
    if not wanted.size:
        return np.zeros(0, dtype=np.float32)
    unit = max(1, decoder.unit_bytes)
    per_unit, left = divmod(unit * counted.numel, raw.size)
    if left or per_unit == 0:  # units that do not hold whole elements: decode the piece
        values, first = decoder.decode(raw, byte_lo)
        return values[wanted - first].astype(np.float32)
    units = (wanted - counted.first) // per_unit
    breaks = np.flatnonzero(np.diff(units) * unit > SAMPLE_RUN_GAP) + 1
    out = np.empty(wanted.size, dtype=np.float32)
    for lo, hi in zip(np.r_[0, breaks], np.r_[breaks, wanted.size], strict=True):
        u0, u1 = int(units[lo]), int(units[hi - 1]) + 1
        values, first = decoder.decode(raw[u0 * unit : u1 * unit], byte_lo + u0 * unit)
        out[lo:hi] = values[wanted[lo:hi] - first]
    return out


@dataclass
class _Partial:
    pieces_left: int
    reductions: list[list[Reduction]]
    raw: list[np.ndarray]
    summary: VectorSummary | None = None


Finished = list[Reduction] | np.ndarray | VectorSummary  # a target's merged reductions, raw bytes or summary


class Fold:
    """Chunk results in, finished targets out: each target's partial results merged one at a time in chunk
    order (the same sums in the same order for any chunking, any executor, any finishing order of the
    chunks themselves), and the target handed out once its last piece is in."""

    def __init__(self, targets: Sequence[Target], chunks: Sequence[Chunk]) -> None:
        self._partials: dict[int, _Partial] = {}
        for chunk in chunks:
            for piece in chunk.pieces:
                entry = self._partials.setdefault(
                    piece.item, _Partial(0, [[] for _ in targets[piece.item].selections], [])
                )
                entry.pieces_left += 1

    def add(self, results: ChunkResult) -> Iterator[tuple[int, Finished]]:
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
                yield item, _finished(entry)


def _finished(entry: _Partial) -> Finished:
    if entry.summary is not None:
        return entry.summary
    if entry.raw:
        return entry.raw[0] if len(entry.raw) == 1 else np.concatenate(entry.raw)
    return [parts[0].unpack() for parts in entry.reductions]


ChunkOut = tuple[ChunkResult, dict[int, str]]  # a chunk's results, and the decoder notes of targets it finished


@dataclass(frozen=True)
class ChunkPass:
    """The chunk reduction as a pass (executor.py): parts are the plan's chunks, in file order; a run reads
    and reduces consecutive chunks (`reduce_chunks`) with decoders it builds from the companions it reads,
    and hands back per chunk its partial results (positions of the largest |w| already logical) and the
    notes of the decoders it finished; the caller folds them (Fold). Plain data but for `opened`."""

    targets: tuple[Target, ...]  # without decoders
    chunks: tuple[Chunk, ...]
    verify: bool  # the chunks tile every shard: hash them
    lookahead: int = LOOKAHEAD  # weights whose companions are read ahead
    connections: int = 8  # a Hub reader's requests in flight (per task on a cluster)
    opened: tuple[tuple[ModelPlan, Reader], ...] = field(default=(), compare=False)  # this machine's; never shipped
    source: SourceSpec | None = None  # where a node opens the model again (a shipped copy)
    chunk_bytes: int = 0  # the chunk size planned: a node's reader takes chunks this large
    by_bytes: ClassVar[bool] = True

    @property
    def readers(self) -> list[Reader]:
        return [reader for _, reader in self.opened]

    def weights(self) -> list[float]:
        return [float(chunk.nbytes) for chunk in self.chunks]

    def cuts(self) -> list[bool]:
        """A run may start at any chunk; when shards are hashed, only at a shard's first: one run reads it whole."""
        return [
            not self.verify or i == 0 or chunk.shard != self.chunks[i - 1].shard for i, chunk in enumerate(self.chunks)
        ]

    def shipped(self) -> ChunkPass:
        plan, reader = self.opened[0]
        return replace(self, opened=(), source=reader.describe(plan), chunk_bytes=reader.chunk_bytes)

    @contextmanager
    def reopen(self, parts: range, node: str) -> Iterator[list[Reader]]:
        assert self.source is not None
        chunks = [self.chunks[i] for i in parts]
        touched = {chunk.shard for chunk in chunks} | {
            companion.shard for target in self._quantized(parts) for companion in target.companions.values()
        }
        with reopen(self.source, touched, node) as reader:
            # Chunks planned for another reader kind (a Hub model the driver read from its cache) may be larger
            # than this reader's buffers: make them fit.
            reader.chunk_bytes = max(reader.chunk_bytes, max(chunk.nbytes for chunk in chunks))
            yield [reader]

    def _items(self, parts: range) -> list[int]:
        """The targets the chunks `parts` hold pieces of, in stream order."""
        return list(dict.fromkeys(piece.item for i in parts for piece in self.chunks[i].pieces))

    def _quantized(self, parts: range) -> list[Quantized]:
        return [q for item in self._items(parts) if (q := self.targets[item].ref.quant) is not None]

    def run(self, parts: range, readers: Sequence[Reader], execution: Execution) -> Generator[ChunkOut, None, Verified]:
        """Each chunk's results in order (see the class docstring); returns the shards verified."""
        (reader,) = readers
        # Renumbered from 0: a reader hands out buffers and hashes in the order of the chunks it was told.
        chunks = [replace(self.chunks[i], index=k) for k, i in enumerate(parts)]
        hashed = frozenset(chunk.shard for chunk in chunks) if self.verify else frozenset()
        reader.set_connections(self.connections)
        if hashed:  # the other shards are hashed by other runs (or were, by the fit a journal resumes)
            reader.skip_shards(set(reader.regions() or {}) - hashed)
        reader.start(chunks, verify=bool(hashed))
        items = self._items(parts)
        quantized = [item for item in items if self.targets[item].ref.quant is not None]
        targets: dict[int, Target] = {item: self.targets[item] for item in items}
        loader = None
        if quantized:
            weights = [q for item in quantized if (q := self.targets[item].ref.quant) is not None]
            loader = CompanionLoader(reader.tensor_bytes, weights, lookahead=self.lookahead)
            for k, item in enumerate(quantized):
                targets[item] = replace(targets[item], decoder=LazyDecoder(loader, k))
        last = {piece.item: chunk.index for chunk in chunks for piece in chunk.pieces}
        try:
            with kernels.thread_budget(execution.threads):
                for chunk, results in reduce_chunks(targets, reader, chunks, execution):
                    _logical_positions(targets, results)
                    notes: dict[int, str] = {}
                    for piece in chunk.pieces:
                        handle = targets[piece.item].decoder
                        if handle is not None and last[piece.item] == chunk.index:
                            handle.release()  # its last piece in this run: drop its companions
                            note = handle.note()
                            if note:
                                notes[piece.item] = note
                    yield results, notes
        finally:
            if loader is not None:
                loader.close()
        if not self.verify:
            return (None,)
        if hashed:
            reader.finish()  # raises VerificationError where the bytes were read: the file names it
        # (no chunks: every shard was verified by the fit a journal resumes; nothing left to hash, nothing failed)
        return (frozenset(reader.verified_shards() & hashed),)

    def task_memory(self, parts: range) -> int:
        """Bytes a task may hold at once: chunk buffers, a few weights' companions and decoders, its results."""
        from ..source.hub_stream import EXTRA_BUFFERS

        assert self.source is not None
        largest = max(self.chunks[i].nbytes for i in parts)
        workers = min(settings.ray_task_cpus(), settings.MAX_CHUNK_WORKERS)
        hub = self.source.kind == "hub"
        buffers = (self.connections + EXTRA_BUFFERS if hub else 2 * workers) * largest
        companions = sorted(
            (sum(ref.nbytes for ref in q.companions.values()) for q in self._quantized(parts)), reverse=True
        )
        decoders = 4 * sum(companions[: LOOKAHEAD + 1])  # the companions and the tables built from them
        return TASK_BASE_MEMORY + buffers + decoders + RESULT_BYTES_PER_CHUNK * len(parts)


RESULT_BYTES_PER_CHUNK = 256 << 10  # a chunk's packed partial results, generously (BF16: ~50 KB)


def _logical_positions(targets: Mapping[int, Target], results: ChunkResult) -> None:
    """Positions of the largest |w| of decoded pieces, from decoded order to the logical matrix's flat index
    (per piece, before the fold: the merge picks the same part either way, by value and order)."""
    for item, result in results:
        handle = targets[item].decoder
        if handle is None or not isinstance(result, list):
            continue
        decoder = handle.get()
        for parts in result:
            for red in parts:
                if red.argmax >= 0:
                    red.argmax = decoder.logical_index(red.argmax)


@dataclass
class ChunkReport:
    """What a chunk reduction says besides its targets: the decoders' notes (by target index), the shards
    verified so far (a journal keeps those) and, once it ended, the row's verification."""

    notes: dict[int, str] = field(default_factory=dict)
    verification: Verification | None = None
    run: PassRun[ChunkOut] | None = None

    def verified_shards(self) -> set[int]:
        return self.run.verified_now(0) if self.run is not None else set()


def reduce_chunked(
    targets: Sequence[Target],
    opened: tuple[ModelPlan, Reader],
    execution: Execution,
    *,
    verify: bool = False,
    lookahead: int = LOOKAHEAD,
    on_bytes: Callable[[int], None] | None = None,
    on_node: Callable[[str, int], None] | None = None,
    report: ChunkReport | None = None,
) -> Iterator[tuple[int, Finished]]:
    """(target index, merged reduction per selection, a vector's raw bytes or its summary), in file order:
    the plan (plan_reads), run by the execution's executor (ChunkPass), folded in order (Fold); at the end,
    every shard planned to be hashed checked to have been (`report.verification`: what the row says)."""
    plan, reader = opened
    report = report if report is not None else ChunkReport()
    read = plan_reads(targets, reader, verify)
    job = ChunkPass(
        tuple(replace(t, decoder=None) for t in targets),
        tuple(read.chunks),
        read.verify,
        lookahead,
        execution.connections,
        (opened,),
    )
    fold = Fold(targets, read.chunks)
    run: PassRun[ChunkOut] = execution.executor.run_pass(job, execution, on_node)
    report.run = run
    with closing(run.results) as chunks:  # ended now if the caller stops, before its executor closes
        for index, (results, found) in enumerate(chunks):
            if on_bytes:  # tensor bytes only, so that the total matches the plan's
                on_bytes(sum(piece.hi - piece.lo for piece in read.chunks[index].pieces))
            report.notes.update(found)
            yield from fold.add(results)
    expected = set(reader.regions() or {}) if read.verify else None
    shards = [(plan.model_id, [s.name for s in plan.shards], [s.sha256 for s in plan.shards])]
    check_verified([expected], run.verified, shards)
    # A verified plan with nothing left to read (a resumed fit whose journal holds every shard) hashed nothing here
    # and failed nothing: its shards stand verified, by the fit it resumes.
    report.verification = reader.confirmed((run.verified[0] or set()) if read.verify else None)


def reduce_chunks(
    targets: Sequence[Target] | Mapping[int, Target],
    reader: Reader,
    chunks: Sequence[Chunk],
    execution: Execution,
) -> Iterator[tuple[Chunk, ChunkResult]]:
    """Each chunk's partial results (reduce_chunk), in the order of `chunks` (reader.start() was told them):
    read and reduced on this machine's threads, several chunks at once (executor.py's ordered window)."""

    def reduce_buffer(chunk: Chunk, buf: np.ndarray) -> ChunkResult:
        return reduce_chunk(targets, chunk, buf, execution.device)

    def pieces(chunk: Chunk) -> int:
        return len(chunk.pieces)

    if not reader.fetches:  # cheap to get (local mappings): read and reduce in the same worker

        def task(chunk: Chunk) -> ChunkResult:
            with reader.chunk(chunk) as buf:
                return reduce_buffer(chunk, buf)

        workers = execution.chunk_workers
        return LOCAL.map(
            task,
            chunks,
            workers=workers,
            window=2 * workers,
            cost=pieces,
            max_cost=MAX_PENDING_PIECES,
            on_abandon=reader.cancel,
            label="weightdiag-chunk",
        )

    def reduce_fetched(chunk: Chunk, buf: np.ndarray) -> ChunkResult:
        ok = False
        try:
            out = reduce_buffer(chunk, buf[: chunk.nbytes])
            ok = True
            return out
        finally:
            reader.done(chunk, buf, ok)

    # Slow to get (network): connections keep reading while the cores reduce what has landed. Buffers go to
    # chunks in file order (the reader sees to it), so queueing more chunks than buffers is safe: the next one
    # starts reading as soon as any buffer is free.
    return LOCAL.map(
        reduce_fetched,
        chunks,
        workers=execution.threads,
        window=2 * reader.buffers,
        fetch=reader.fetch,
        fetch_workers=reader.workers,
        cost=pieces,
        max_cost=MAX_PENDING_PIECES,
        on_abandon=reader.cancel,
        label="weightdiag-reduce",
    )

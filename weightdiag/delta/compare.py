"""The comparison of tensor pairs read in lockstep from two readers, as a pass (executor.py): each pair's exact
figures and ΔW's spectrum folded over its row blocks in order, its verdicts.

`PairsPass`: parts are the tensor pairs (weighed by the bytes of both sides); a run opens nothing itself,
reads its pairs in lockstep (paired.py) and hands back each pair's TensorDiff (a few hundred bytes) in pair
order. A pair's result depends on its blocks alone, so runs of pairs may go to any node of a Ray cluster:
the result is the local diff's whatever the number of nodes and the order tasks end in (a node runs the
same folds with this machine's thread count: the same BLAS sums).

Verification. A Hub side is verified when its blocks come in file order: every byte of its shards passes
through the reader's hash (paired.py `side_reads`). Runs are cut only between pairs where every verified side
moves on to a later shard, and each run hashes, per verified side, the shards from the one after its
predecessor's last to its own last (the last run: to the end), shards without any paired tensor included; the
caller checks that every shard was hashed by some run (executor.check_verified).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from .. import kernels, tuning
from ..execution import Execution
from ..executor import TASK_BASE_MEMORY, Verified
from ..layout import ArchInfo, classify_tensor
from ..source.plan import ModelPlan, TensorRef
from ..source.reader import Reader
from . import extremes as tails
from . import forensics as geometry
from .findings import is_low_rank, is_scaled
from .measures import Totals, block_part, figures
from .paired import BLOCK_BYTES, Rows, block_rows, matrix_shape, plan_rows, side_reads, stream_pairs
from .pairing import Pair
from .result import DiffOptions, TensorDiff
from .spectrum import Accumulator, accumulator
from .wide import SKETCH_SIZE, WideSketch

SIDES = ("base", "tuned")


def _dtype_label(ref: TensorRef) -> str:
    return ref.quantization or ref.dtype.name


def hashing(pairs: Sequence[Pair], readers: Sequence[Reader], verify: bool) -> list[set[int] | None]:
    """Per side, the shards it hashes when the diff verifies it (its blocks in file order, every shard
    hashable), else None."""
    blocks = plan_rows(pairs)
    out: list[set[int] | None] = []
    for side, reader in enumerate(readers):
        regions = reader.regions() if verify else None
        chunks = [b.base.chunk if side == 0 else b.tuned.chunk for b in blocks]
        whole = regions is not None and side_reads(chunks, regions, reader.chunk_bytes).verify
        out.append(set(regions or ()) if whole else None)
    return out


@dataclass(frozen=True)
class PairsPass:
    """The paired comparison as a pass (see the module docstring). Plain data but for `opened`."""

    pairs: tuple[Pair, ...]
    arch: ArchInfo
    options: DiffOptions  # without the token: a node reads the Hub with its own
    hashed: tuple[set[int] | None, set[int] | None]  # per side: the shards hashed (hashing()), or None
    shards: tuple[int, int]  # per side: how many shards it has
    opened: tuple[tuple[ModelPlan, Reader], ...] = field(default=(), compare=False)  # this machine's; never shipped
    sources: tuple[Any, ...] = ()  # a shipped copy: where a node opens each side again (SourceSpec)
    by_bytes: ClassVar[bool] = True

    @property
    def readers(self) -> list[Reader]:
        return [reader for _, reader in self.opened]

    def weights(self) -> list[float]:
        return [float(p.base.nbytes + p.tuned.nbytes) for p in self.pairs]

    def cuts(self) -> list[bool]:
        """Where a run may start: before pair i when every verified side's shards of pairs < i all come before
        those of pairs >= i (a verified shard is hashed by the one run that reads it whole)."""
        cuts = [True] * len(self.pairs)
        for side, hashed in enumerate(self.hashed):
            if hashed is None:
                continue
            refs = [p.base if side == 0 else p.tuned for p in self.pairs]
            for i in range(1, len(refs)):
                if refs[i].shard <= refs[i - 1].shard:
                    cuts[i] = False
        return cuts

    def owned(self, parts: range, side: int) -> frozenset[int] | None:
        """The shards a run of `parts` hashes on one side: after its predecessor's last, up to its own last
        (the last run's: to the end); None where the side is not verified."""
        if self.hashed[side] is None:
            return None
        shard = [(p.base if side == 0 else p.tuned).shard for p in self.pairs]
        start = max(shard[: parts.start], default=-1) + 1
        end = self.shards[side] if parts.stop == len(self.pairs) else max(shard[i] for i in parts) + 1
        return frozenset(range(start, end))

    def shipped(self) -> PairsPass:
        sources = tuple(reader.describe(plan) for plan, reader in self.opened)
        return replace(self, opened=(), sources=sources)

    @contextmanager
    def reopen(self, parts: range, node: str) -> Iterator[list[Reader]]:
        from ..source.reopen import reopen

        with ExitStack() as stack:
            readers = []
            for side, source in enumerate(self.sources):
                touched: set[int] = set()
                for i in parts:
                    touched |= _shards_of(self.pairs[i].base if side == 0 else self.pairs[i].tuned)
                readers.append(stack.enter_context(reopen(source, touched | (self.owned(parts, side) or set()), node)))
            yield readers

    def run(
        self, parts: range, readers: Sequence[Reader], execution: Execution
    ) -> Generator[TensorDiff, None, Verified]:
        """Each pair's TensorDiff in order; returns the shards each side verified."""
        owned = [self.owned(parts, side) for side in (0, 1)]
        for reader, shards in zip(readers, owned, strict=True):
            reader.set_connections(self.options.connections)
            # This run's shards only (the others are hashed by other runs); none on a side the diff does not
            # verify (its regions then empty: side_reads reads the blocks alone).
            reader.skip_shards(set(reader.regions() or {}) - (shards or set()))
        verify = any(shards is not None for shards in owned)
        verifying: dict[str, bool] = {}
        with kernels.thread_budget(execution.threads):
            yield from compare(
                [self.pairs[i] for i in parts], self.arch, readers[0], readers[1], self.options, execution, verify,
                verifying,
            )  # fmt: skip
        verified: list[frozenset[int] | None] = []
        for name, reader in zip(SIDES, readers, strict=True):
            if verifying.get(name):
                reader.finish()  # raises VerificationError where the bytes were read: the file names it
                verified.append(frozenset(reader.verified_shards()))
            else:
                verified.append(None)
        return tuple(verified)

    def task_memory(self, parts: range) -> int:
        """A task's peak: the blocks in flight on both sides and their float64 arithmetic, the spectra's
        accumulators (8 MB at most each: the gram_cols knob; three with the forensics' Grams of both sides), the
        wide matrices' subspace sketches, a Hub side's buffers."""
        workers = self.options.workers or 1
        hub = any(source.kind == "hub" for source in self.sources)
        elems = tuning.current().block_elems
        blocks = 2 * workers * (2 * BLOCK_BYTES + 4 * 8 * elems)  # the one-pass kernel's need no float64
        buffers = 2 * (self.options.connections + 2) * (16 << 20) if hub else 0
        grams = 3 if self.options.spectrum else 1  # ΔW's Gram, and both sides' (delta/forensics.py)
        # a wide matrix's subspace sketch (delta/wide.py): two 2l x n float32 sums, held and in each part, counted
        # at 8 bytes an element (the parts' float32 products and their temporaries)
        widest = max((matrix_shape(self.pairs[i].base.shape)[1] for i in parts), default=0)
        wide = 2 * (2 * SKETCH_SIZE) * widest * 8 if self.options.spectrum else 0
        return TASK_BASE_MEMORY + blocks + 2 * workers * (grams * (8 << 20) + wide) + buffers


def _shards_of(ref: TensorRef) -> set[int]:
    companions = ref.quant.companions.values() if ref.quant is not None else ()
    return {ref.shard} | {c.shard for c in companions}


def compare(
    pairs: list[Pair],
    arch: ArchInfo,
    base_reader: Reader,
    tuned_reader: Reader,
    options: DiffOptions,
    execution: Execution,
    verify: bool = False,
    verifying: dict[str, bool] | None = None,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[TensorDiff]:
    """Each pair's TensorDiff, in order, its blocks read in lockstep (paired.py) and folded in row order."""
    totals: dict[int, Totals] = {}
    spectra: dict[int, Accumulator | None] = {}
    shapes: dict[int, geometry.Accumulator | None] = {}
    tops: dict[int, tails.Accumulator | None] = {}
    wides: dict[int, WideSketch | None] = {}  # the subspace sketch of a matrix too wide for a Gram (wide.py)

    def start(i: int) -> None:
        pair = pairs[i]
        totals[i] = Totals()
        m, n = matrix_shape(pair.base.shape)
        # outliers and super weights: every matrix, with or without the spectrum (a few passes over the codes)
        tops[i] = tails.Accumulator(n) if len(pair.base.shape) >= 2 else None
        spectral = options.spectrum and len(pair.base.shape) >= 2 and min(m, n) > 1
        if spectral:
            step = block_rows(pair)
            spectra[i] = accumulator(m, n, step >= m, seed=options.seed, cap=options.sketch, device=execution.device)
            cast = geometry.cast_of(_dtype_label(pair.base), _dtype_label(pair.tuned))
            # embeddings and heads: counts only (their Grams were most of MiniLM's cost, and no verdict reads them)
            role = classify_tensor(pair.name, tuple(pair.base.shape), arch.n_layers, arch.family, arch.n_experts)
            side = None if role.kind in geometry.COUNTS_ONLY else geometry.side_for(m, n, step >= m)
            shapes[i] = geometry.Accumulator(m, n, side, cast, rows=role.kind == "embed")
            wide = side is None and role.kind not in geometry.COUNTS_ONLY
            wides[i] = WideSketch(m, n, seed=options.seed) if wide else None
        else:
            wides[i] = None
            spectra[i] = None
            # a vector or a 1-wide matrix: the counts only (no Gram)
            cast = geometry.cast_of(_dtype_label(pair.base), _dtype_label(pair.tuned))
            shapes[i] = geometry.Accumulator(m, n, None, cast) if options.spectrum else None

    def work(block: Rows, b: Any, t: Any) -> tuple[Any, Any, Any, Any, Any]:
        acc = spectra[block.pair]
        part, delta = block_part(b, t, delta=acc is not None)
        n = matrix_shape(pairs[block.pair].base.shape)[1]
        rows = block.r1 - block.r0
        shape = shapes[block.pair]
        geo = None
        if shape is not None:
            geo = shape.block_part(b.values.reshape(rows, n), t.values.reshape(rows, n), first=block.r0 == 0)
        top = tails.block_part(b, t, block.r0 * n) if tops[block.pair] is not None else None
        sketch = wides[block.pair]
        wide = None
        if sketch is not None:
            d = delta.reshape(rows, n) if delta is not None else None
            wide = sketch.block_part(b.values.reshape(rows, n), t.values.reshape(rows, n), d)
        if acc is None or delta is None:
            return part, None, geo, top, wide
        return part, acc.block_part(block.r0, delta.reshape(rows, n)), geo, top, wide

    for block, (part, spec, geo, top, wide) in stream_pairs(
        pairs,
        base_reader,
        tuned_reader,
        work,
        workers=options.workers or execution.threads,
        before_tensor=start,
        verify=verify,
        verifying=verifying,
    ):
        i = block.pair
        if on_bytes is not None:
            on_bytes(block.base.chunk.nbytes + block.tuned.chunk.nbytes)
        totals[i].fold(part)
        acc = spectra[i]
        if acc is not None:
            acc.fold(spec)
        shape = shapes[i]
        if shape is not None and geo is not None:
            shape.fold(geo)
        held = tops[i]
        if held is not None and top is not None:
            held.fold(top)
        sketched = wides[i]
        if sketched is not None and wide is not None:
            sketched.fold(wide)
        if not block.last:
            continue
        pair = pairs[i]
        is_matrix = len(pair.base.shape) >= 2
        fig = figures(totals.pop(i), fits=is_matrix)
        spectrum = acc.result(fig.delta_norm**2) if acc is not None else None
        shapes.pop(i)
        tops.pop(i)
        found = None
        if shape is not None:
            gram = getattr(acc, "gram", None)  # ΔW's Gram on the same side (Gram: right, _Whole: left)
            found = shape.result(gram if _same_side(acc, shape.side) else None)
            if sketched is not None:
                found = sketched.result(found, fig.delta_norm**2)
        wides.pop(i)
        spectra.pop(i)
        role = classify_tensor(pair.name, tuple(pair.base.shape), arch.n_layers, arch.family, arch.n_experts)
        m, n = matrix_shape(pair.base.shape)
        untouched = fig.delta_norm == 0 and fig.nonfinite == 0
        yield TensorDiff(
            name=pair.name,
            tuned_name=pair.tuned.name,
            kind=role.kind,
            block=role.block,
            shape=tuple(pair.base.shape),
            base_dtype=_dtype_label(pair.base),
            tuned_dtype=_dtype_label(pair.tuned),
            figures=fig,
            spectrum=spectrum,
            untouched=untouched,
            low_rank=is_matrix and is_low_rank((m, n), spectrum.rank90 if spectrum else None, fig.relative_change),
            scaled=is_matrix and is_scaled(fig.alignment, fig.relative_change),
            forensics=found,
            extremes=held.result(fig.base_norm / max(fig.numel, 1) ** 0.5) if held is not None else None,
        )


def _same_side(acc: Accumulator | None, side: str | None) -> bool:
    """Whether the spectrum's Gram of ΔW is on the subspaces' side (W^T W: right, W W^T: left)."""
    from .spectrum import Gram, _Whole

    return (side == "right" and isinstance(acc, Gram)) or (side == "left" and isinstance(acc, _Whole))

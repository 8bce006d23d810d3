"""The spectrum of every matrix of a model (`fit --spectrum`): a second pass over the matrices, after the fits.

Design. The Weibull fits need one pass of additive reductions, which the chunk engine runs on every core
with chunks reduced where they land, in any order of arrival. A spectrum needs the Gram matrix WᵀW (or WWᵀ)
summed over row blocks in row order, then an eigensolve: O(m·n·min(m, n)) flops where a fit's reduction is
O(m·n). Folding the Gram into the engine would put dense BLAS work into its worker threads (which run one
chunk each, single-threaded) and hold every chunk's values until its rows are in order: the plain fit
would pay for it even with --spectrum off. So the spectrum is its own pass, run only when asked for, after
the fits and the shards' verification, before the reader closes:

- each selected matrix is read again through the same Reader, in file order, in row blocks
  (reduce/row_stream.py: worker threads read and decode to float32, quantized weights with the decoders
  `fit` uses, a few blocks ahead);
- the caller's thread adds each block to the Gram of every record the tensor holds (the tensor itself, its
  fused parts, or the records cut from it: one per expert of fused experts, MLA's k and v rows), with
  multi-threaded BLAS on the job's cores (Execution.threads; one thread where the matrix's smaller side is
  below 1,024: reduce/blas.py threads_for), or with torch on the device
  for --device cuda (reduce/gram_torch.py);
- a record's eigenvalues are solved as soon as its last row is in, its metrics computed (fit/esd.py:
  WeightWatcher 0.7.7's definitions) and its Gram dropped: records cut from one tensor whose rows follow each
  other (experts) are never held at once.

Memory: the Gram of the smaller side, n²·8 bytes for a tall matrix (134 MB for n = 4,096), plus for a wide
one its rows (m·n·4: 235 MB for 4,096 x 14,336, whose WWᵀ is formed at the end), plus the blocks in flight
(a few 8 MB blocks, and a fetching reader's buffers): under 1 GB for both of the issue's shapes, from local
files and from the Hub (tests/test_spectrum_pipeline.py, benchmarks/bench_spectrum_cli.py). The bytes are
read twice (once per pass): from the page cache for local files, over the network again for the Hub; the
Gram's flops, not the reads, set the pass's time on CPUs (docs/spectrum.md, "Cost").

A matrix with no spectrum gets `spectrum_skipped` instead (a tensor of 3 or more dimensions that is not
cut into matrices, values that are not finite, a quantized layout whose records are not whole rows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

import numpy as np

from ..execution import Execution
from ..executor import PassRun, Verified
from ..fit.esd import fit_spectrum
from ..layout.views import View
from ..progress import SILENT, Progress
from ..record.spectrum import spectrum_record
from ..reduce.blas import PerMatrix, blas_threads, threads_for
from ..reduce.farms import FarmsWindows
from ..reduce.gram import GramSpectrum, Refinement
from ..reduce.row_stream import Values, stream_values
from ..segments import Segments, clip
from ..source.plan import TensorRef
from ..source.reader import Reader

Key = tuple[str, int | None]  # (matrix record name, index of the fused part or None for the record itself)


@dataclass(frozen=True)
class SpectrumInput:
    """One stored matrix whose records want spectra, as the fit planned it (run/measure.py's work item)."""

    ref: TensorRef
    views: Sequence[View] = ()  # records cut from the tensor (each its own matrix), or none
    parts: Sequence[tuple[str, Segments]] = ()  # the fused parts of the record (kind, selection)


@dataclass(frozen=True)
class Target:
    """One matrix to take the spectrum of: the whole tensor, a fused part or a record cut from the tensor.

    Its elements are `selection` of the tensor's logical flat elements (None: all), which in flat order form
    a `rows` x `cols` matrix, row-major (the record's matrix or its transpose: the same singular values). For
    a GPTQ/AWQ weight, streamed as rows of Wᵀ, `columns` are the rows of W selected (None: all)."""

    key: Key
    selection: Segments | None
    rows: int
    cols: int
    shape: tuple[int, int]  # the record's (out, in), what SpectrumFit reports as rows x cols
    columns: np.ndarray | None = None

    def fed(self, packed: bool, ref: TensorRef) -> tuple[int, int]:
        """The shape of the matrix whose row blocks the accumulator gets."""
        if not packed:
            return self.rows, self.cols
        width = int(ref.shape[0]) if self.columns is None else int(self.columns.size)
        return int(ref.shape[1]), width


@dataclass
class Plan:
    """What the pass reads: the tensors (file order) and each one's targets; records it skips, and why."""

    refs: list[TensorRef] = field(default_factory=list)
    targets: list[list[Target]] = field(default_factory=list)
    skipped: dict[Key, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(t) for t in self.targets)


def _whole_rows(seg: Segments, n: int) -> bool:
    return seg.offset % n == 0 and seg.length % n == 0 and (seg.count == 1 or seg.stride % n == 0)


def _selected_rows(seg: Segments, n: int) -> np.ndarray:
    """The rows of an (m x n) matrix a whole-rows selection holds, in order."""
    first, length, stride = seg.offset // n, seg.length // n, seg.stride // n
    return np.concatenate([np.arange(first + k * stride, first + k * stride + length) for k in range(seg.count)])


def _part_matrix(seg: Segments, n: int) -> tuple[int, int] | None:
    """The matrix a fused part's elements form: whole rows (q/k/v rows of a fused qkv, gate/up halves), or one
    run per row (GPT-2's c_attn columns); None for any other selection."""
    if _whole_rows(seg, n):
        return seg.numel // n, n
    if seg.count > 1 and seg.stride == n and seg.offset % n + seg.length <= n:
        return seg.count, seg.length
    return None


def plan_spectra(inputs: Sequence[SpectrumInput], names: Callable[[SpectrumInput], list[str]]) -> Plan:
    """The targets of each input: its views (each one a record, named by `names`), or the record itself and its
    fused parts. `names(input)` gives the record names the fit wrote for it, in view order."""
    from ..decode.formats import selects_any_elements

    plan = Plan()
    for item in inputs:
        ref = item.ref
        record_names = names(item)
        packed = ref.quant is not None and not selects_any_elements(ref.quant.spec.format)
        n = int(ref.shape[-1])
        targets: list[Target] = []
        if item.views:
            for view, name in zip([v for v in item.views if not v.vector], record_names, strict=True):
                shape = (int(view.shape[0]), int(view.shape[1]))
                if not packed:
                    targets.append(Target((name, None), view.segments, view.rows, view.cols, shape))
                elif view.cols == n and _whole_rows(view.segments, n) and not view.transposed:
                    selected = _selected_rows(view.segments, n)
                    targets.append(Target((name, None), view.segments, view.rows, view.cols, shape, selected))
                else:
                    plan.skipped[(name, None)] = "its rows are not whole rows of the stored GPTQ/AWQ codes"
        else:
            name = record_names[0]
            if len(ref.shape) != 2:
                plan.skipped[(name, None)] = (
                    f"a tensor of {len(ref.shape)} dimensions, not cut into matrices: no matrix spectrum"
                )
                continue
            m = int(ref.shape[0])
            targets.append(Target((name, None), None, m, n, (m, n)))
            for i, (_, seg) in enumerate(item.parts):
                part = _part_matrix(seg, n)
                if part is None or (packed and not _whole_rows(seg, n)):
                    plan.skipped[(name, i)] = "the part's elements are not a matrix of whole rows or columns"
                    continue
                chosen = _selected_rows(seg, n) if packed else None
                targets.append(Target((name, i), seg, part[0], part[1], part, chosen))
        if targets:
            plan.refs.append(ref)
            plan.targets.append(targets)
    return plan


class Gram(Protocol):
    """A Gram accumulator: reduce.gram.GramSpectrum (numpy) or reduce.gram_torch.TorchGramSpectrum."""

    def add(self, r0: int, block: np.ndarray) -> None: ...


GramFactory = Callable[[int, int], Gram]


def gram_factory(device: str) -> GramFactory:
    """BLAS (numpy/scipy) on the CPU, torch on any other device."""
    if device == "cpu":
        return GramSpectrum
    from ..reduce.gram_torch import TorchGramSpectrum

    return lambda m, n: TorchGramSpectrum(m, n, device)


def solve(gram: Gram) -> np.ndarray | Refinement | None:
    """The accumulator's eigenvalues, a Refinement that wants the matrix's rows again (eigenvalues below the
    Gram's floor: reduce/gram.py, "Accuracy"), or None when a value was not finite (no spectrum then)."""
    if isinstance(gram, GramSpectrum):
        return gram.solve()
    from ..reduce.gram_torch import TorchGramSpectrum

    assert isinstance(gram, TorchGramSpectrum)
    return gram.solve()


def flops(target: Target, packed: bool, ref: TensorRef) -> float:
    """The work of one target: the Gram (2·m·n·min(m, n)) and the eigensolve (~(4/3)·min(m, n)³)."""
    m, n = target.fed(packed, ref)
    k = min(m, n)
    return 2.0 * m * n * k + 4.0 / 3.0 * k**3


class _Accumulating:
    """One target's Gram (and FARMS' windows), fed its elements in order."""

    def __init__(self, target: Target, fed: tuple[int, int], factory: GramFactory, farms: bool) -> None:
        self.target = target
        self.m, self.n = fed
        self.gram: Gram | None = factory(self.m, self.n)
        self.farms = FarmsWindows(self.m, self.n) if farms else None
        self.row = 0
        self._carry = np.zeros(0, dtype=np.float32)

    @property
    def done(self) -> bool:
        return self.row >= self.m

    def rows(self, block: np.ndarray) -> None:
        assert self.gram is not None
        self.gram.add(self.row, block)
        if self.farms is not None:
            self.farms.add(self.row, block)
        self.row += block.shape[0]

    def elements(self, values: np.ndarray) -> None:
        """The target's next elements, in flat order: whole rows go to the Gram, a partial one waits."""
        if self._carry.size:
            values = np.concatenate([self._carry, values])
        full = values.size - values.size % self.n
        if full:
            self.rows(values[:full].reshape(-1, self.n))
        self._carry = values[full:].copy()  # a few elements: never a view that keeps the block alive


def _selected(values: np.ndarray, first: int, selection: Segments) -> np.ndarray:
    """The selection's elements among the block's flat elements [first, first + size), in order."""
    parts = [seg.view(values).reshape(-1) for seg in clip(selection, first, first + values.size)]
    if not parts:
        return values[:0]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


@dataclass
class SpectrumResult:
    """What the pass found: each record's `spectrum` object, or why it has none."""

    spectra: dict[Key, dict[str, Any]]
    skipped: dict[Key, str]
    seconds: float
    device: str
    solver: dict[str, Any] | None = None  # how the eigenvalues were solved (on a device: gram_torch.Solver)


TensorSpectra = tuple[dict[Key, dict[str, Any]], dict[Key, str]]  # one tensor's records: spectra, skipped (why)


def _packed(ref: TensorRef) -> bool:
    from ..decode.formats import selects_any_elements

    return ref.quant is not None and not selects_any_elements(ref.quant.spec.format)


@dataclass(frozen=True)
class SpectrumPass:
    """The spectrum pass (executor.py): parts are the planned tensors in file order, weighed by their flops; a
    run reads its tensors again in row blocks and takes their targets' spectra (`tensor_spectra`), handing
    back each tensor's records in order. Whole tensors per run, never partial Grams merged: a Gram's float
    sums depend on their order and grouping (the local pass adds each row block into one accumulator), a
    wide matrix's WWᵀ needs all its rows at once, and a partial Gram (n²·8 bytes) would cost more to ship
    than the rows to read again. A node cuts the row blocks where this machine's reader does
    (`chunk_bytes`) and runs BLAS on this machine's thread count (Execution.for_node): the same sums, so
    the same eigenvalues, provided the nodes run the same OpenBLAS build on the same kind of CPU."""

    refs: tuple[TensorRef, ...]
    targets: tuple[tuple[Target, ...], ...]
    farms: bool = False
    connections: int = 8
    opened: tuple[tuple[Any, Reader], ...] = field(default=(), compare=False)  # (ModelPlan, reader); never shipped
    factory: GramFactory | None = field(default=None, compare=False)  # a test's accumulator (local runs only)
    source: Any = None  # a shipped copy: where a node opens the model again (source/reopen.py SourceSpec)
    chunk_bytes: int = 0  # the row blocks' size limit of this machine's reader
    by_bytes: ClassVar[bool] = False  # weighed by flops

    @property
    def readers(self) -> list[Reader]:
        return [reader for _, reader in self.opened]

    def weights(self) -> list[float]:
        return [sum(flops(t, _packed(ref), ref) for t in ts) for ref, ts in zip(self.refs, self.targets, strict=True)]

    def cuts(self) -> list[bool]:
        return [True] * len(self.refs)

    def shipped(self) -> SpectrumPass:
        model, reader = self.opened[0]
        return replace(self, opened=(), factory=None, source=reader.describe(model), chunk_bytes=reader.chunk_bytes)

    @contextmanager
    def reopen(self, parts: range, node: str) -> Iterator[list[Reader]]:
        from ..source.reopen import reopen

        refs = [self.refs[i] for i in parts]
        touched = {ref.shard for ref in refs} | {
            companion.shard for ref in refs if ref.quant is not None for companion in ref.quant.companions.values()
        }
        with reopen(self.source, touched, node) as reader:
            reader.chunk_bytes = min(reader.chunk_bytes, self.chunk_bytes)
            yield [reader]

    def run(
        self, parts: range, readers: Sequence[Reader], execution: Execution
    ) -> Generator[TensorSpectra, None, Verified]:
        (reader,) = readers
        reader.set_connections(self.connections)
        refs = [self.refs[i] for i in parts]
        targets = [list(self.targets[i]) for i in parts]
        yield from tensor_spectra(refs, targets, reader, execution, self.farms, self.factory)
        return (None,)

    def task_memory(self, parts: range) -> int:
        """What a task holds at most: its largest tensor's Grams (and held rows), the blocks read ahead, buffers."""
        from ..executor import TASK_BASE_MEMORY
        from ..reduce.gram import estimated_bytes
        from ..reduce.row_stream import BLOCK_BYTES, MAX_AHEAD

        grams = max(
            sum(estimated_bytes(*t.fed(_packed(self.refs[i]), self.refs[i])) for t in self.targets[i]) for i in parts
        )
        blocks = 2 * MAX_AHEAD * BLOCK_BYTES  # stored bytes and their float32 values
        buffers = self.connections * self.chunk_bytes if self.source.kind == "hub" else 0
        return TASK_BASE_MEMORY + grams + blocks + buffers


def take_spectra(
    plan: Plan,
    reader: Reader,
    execution: Execution,
    *,
    farms: bool = False,
    progress: Progress | None = None,
    factory: GramFactory | None = None,
    model: Any = None,
) -> SpectrumResult:
    """Read every planned tensor again in row blocks and take its targets' spectra (see the module docstring),
    on the execution's executor (SpectrumPass). `factory`: the Gram accumulator (default: BLAS on the CPU,
    torch on execution.device otherwise); `model`: the ModelPlan `reader` reads (what a cluster node opens)."""
    started = time.perf_counter()
    packed = [_packed(ref) for ref in plan.refs]
    progress = progress or SILENT
    work = sum(flops(t, p, r) for r, p, ts in zip(plan.refs, packed, plan.targets, strict=True) for t in ts)
    progress.spectra_started(plan.count, work)
    job = SpectrumPass(
        tuple(plan.refs),
        tuple(tuple(ts) for ts in plan.targets),
        farms,
        execution.connections,
        ((model, reader),),
        factory,
    )
    spectra: dict[Key, dict[str, Any]] = {}
    skipped = dict(plan.skipped)

    def on_node(node: str, nbytes: int) -> None:
        progress.node_done(node, nbytes, True)

    run: PassRun[TensorSpectra] = execution.executor.run_pass(job, execution, on_node)
    with closing(run.results) as results:  # ended now if a callback raises, before the executor closes
        for i, (found, why) in enumerate(results):
            spectra.update(found)
            skipped.update(why)
            for target in plan.targets[i]:
                progress.spectrum_taken(flops(target, packed[i], plan.refs[i]))
    return SpectrumResult(spectra, skipped, time.perf_counter() - started, execution.device, solver_record(execution))


def solver_record(execution: Execution) -> dict[str, Any]:
    """The row's `run.spectrum.solver`: LAPACK on the CPU (numpy/scipy), else what gram_torch.choose_solver chose
    for the torch build."""
    if execution.device == "cpu" or not execution.executor.local:
        return {"solver": "lapack", "why": "numpy/scipy eigvalsh on the CPU"}
    from ..reduce.gram_torch import current_solver

    return current_solver(execution.device).record()


def tensor_spectra(
    refs: list[TensorRef],
    targets: list[list[Target]],
    reader: Reader,
    execution: Execution,
    farms: bool = False,
    factory: GramFactory | None = None,
) -> Iterator[TensorSpectra]:
    """Each tensor's records, in order, once all its targets are solved: its tensors read in row blocks
    (reduce/row_stream.py), each block added to the Gram of every target it holds, a target solved as soon as
    its last row is in (tall matrices whose eigenvalues fall below the Gram's floor read again at the end)."""
    factory = factory or gram_factory(execution.device)
    packed = [_packed(ref) for ref in refs]
    found: list[TensorSpectra] = [({}, {}) for _ in refs]
    left = [len(ts) for ts in targets]  # targets of each tensor not yet solved
    open_: dict[Key, _Accumulating] = {}  # targets whose rows are arriving
    # tall matrices with eigenvalues below the Gram's floor: their rows are read again (a second pass over
    # these matrices only), key -> (the refinement fed them, FARMS' windows taken in the first pass)
    again: dict[Key, tuple[_Accumulating, tuple[np.ndarray, int] | None]] = {}

    def record(acc: _Accumulating, job: int, evals: np.ndarray, windows: tuple[np.ndarray, int] | None) -> None:
        target = acc.target
        pooled, count = windows if windows is not None else (None, None)
        fit = fit_spectrum(evals, *target.shape, farms_evals=pooled, farms_windows=count)
        found[job][0][target.key] = spectrum_record(fit, evals)
        left[job] -= 1

    solves: Any = None  # reduce/gram_torch.py BatchedSolves, made for the first torch Gram

    def finish(acc: _Accumulating, job: int) -> None:
        nonlocal solves
        target = acc.target
        if isinstance(acc.gram, Refinement):  # the second pass's end
            refined = acc.gram.eigenvalues()
            acc.gram = None
            record(acc, job, refined, again[target.key][1])
            return
        assert acc.gram is not None
        windows = (acc.farms.eigenvalues(), acc.farms.plan.count) if acc.farms is not None else None
        if not isinstance(acc.gram, GramSpectrum):  # torch: solved in batches on a thread (BatchedSolves)
            from ..reduce.gram_torch import BatchedSolves, TorchGramSpectrum, current_solver

            assert isinstance(acc.gram, TorchGramSpectrum)
            if solves is None:
                solves = BatchedSolves(current_solver(str(acc.gram.device)))
            solves.submit((acc, job, windows), acc.gram)
            acc.gram = None
            return
        evals = solve(acc.gram)
        acc.gram = None  # the Gram (or the held rows) go now, before the next target's
        settle(acc, job, evals, windows)

    def drain(wait: bool) -> None:
        """Settle the Grams the solving thread has finished (all of them, with `wait`)."""
        if solves is not None:
            for (acc, job, windows), evals in solves.done(wait):
                settle(acc, job, evals, windows)

    def settle(
        acc: _Accumulating, job: int, evals: np.ndarray | Refinement | None, windows: tuple[np.ndarray, int] | None
    ) -> None:
        target = acc.target
        if evals is None:
            found[job][1][target.key] = "values that are not finite (NaN or infinity): no spectrum"
            left[job] -= 1
        elif isinstance(evals, Refinement):
            acc.gram, acc.farms, acc.row = evals, None, 0
            again[target.key] = (acc, windows)
        else:
            record(acc, job, evals, windows)

    def stream(jobs: list[int], first: bool) -> Iterator[None]:
        """Feed the blocks of the tensors `jobs`; yields after each block."""
        for block in stream_values([refs[j] for j in jobs], reader, execution):
            job = jobs[block.block.job]
            for target in targets[job]:
                if not first and target.key not in again:
                    continue
                data = _data(block, target)
                if data is None:
                    continue
                acc = open_.get(target.key)
                if acc is None:
                    if first:
                        acc = _Accumulating(target, target.fed(packed[job], refs[job]), factory, farms)
                    else:
                        acc = again[target.key][0]
                    open_[target.key] = acc
                per_matrix.use(threads_for(min(acc.m, acc.n), execution.threads))  # its Gram's and solve's
                if block.transposed:
                    acc.rows(data)
                else:
                    acc.elements(data)
                if acc.done:
                    finish(acc, job)
                    del open_[target.key]
            if block.block.last:
                unfinished = [t.key for t in targets[job] if t.key in open_]
                if unfinished:
                    raise AssertionError(f"{refs[job].name}: rows of {unfinished} never arrived")
            drain(False)
            yield

    handed = 0
    try:
        with blas_threads(execution.threads):
            per_matrix = PerMatrix()
            for _ in stream(list(range(len(refs))), first=True):
                while handed < len(refs) and left[handed] == 0:
                    yield found[handed]
                    handed += 1
            drain(True)  # every first-pass Gram solved before any rows are read again
            if again:
                jobs = [j for j, ts in enumerate(targets) if any(t.key in again for t in ts)]
                for _ in stream(jobs, first=False):
                    while handed < len(refs) and left[handed] == 0:
                        yield found[handed]
                        handed += 1
    finally:
        if solves is not None:
            solves.close()
    while handed < len(refs):  # tensors of no block (none here), whose last targets were skipped or solved last
        yield found[handed]
        handed += 1


def _data(block: Values, target: Target) -> np.ndarray | None:
    """The target's part of this block: rows of Wᵀ (its columns of them) for a GPTQ/AWQ weight, else its
    elements in flat order; None when the block holds none of them."""
    if block.transposed:
        return block.values if target.columns is None else block.values[:, target.columns]
    if target.selection is None:
        return block.values
    elements = _selected(block.values, block.first, target.selection)
    return elements if elements.size else None


def record_names(views: Sequence[View], tensor: str) -> list[str]:
    """The names the fit gives the records of a tensor: `<tensor>[<label>]` per matrix view, else the tensor's."""
    matrices = [v for v in views if not v.vector]
    return [f"{tensor}[{v.label}]" for v in matrices] if matrices else [tensor]


def attach(result: SpectrumResult, records: Iterator[dict[str, Any]]) -> int:
    """Put each record's `spectrum` (or `spectrum_skipped`) into the matrix records (and their parts) the pass
    planned; returns how many spectra were attached."""

    def put(into: dict[str, Any], key: Key) -> int:
        """Its spectrum (1) or why it has none (0) into a record or part."""
        found = result.spectra.get(key)
        if found is not None:
            into["spectrum"] = found
            return 1
        if key in result.skipped:
            into["spectrum_skipped"] = result.skipped[key]
        return 0

    attached = 0
    for record in records:
        name = record["name"]
        attached += put(record, (name, None))
        for i, part in enumerate(record.get("parts", ())):
            attached += put(part, (name, i))
    return attached


def run_info(result: SpectrumResult, matrices: int, farms: bool) -> dict[str, Any]:
    """The row's `run.spectrum`."""
    return {
        "seconds": round(result.seconds, 3) if math.isfinite(result.seconds) else None,
        "matrices": matrices,
        "device": result.device,
        "solver": result.solver,
        "farms": farms,
    }

"""Measure a whole model: plan -> read every tensor once -> reduce -> fit -> the measured row.

This is F1 + F2 + F3 of the Weibull paper as one streaming pass through the chunk engine (reduce/stream.py):
memory is a few chunk buffers, whatever the largest tensor, for every source. What the
measurements mean (per-kind summaries, k classes, the lambda axis) is added by diagnose.kinds.interpret;
api.fit_plan does both.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from .. import __version__, kernels, tuning
from ..codes import BIN_EDGES, HIST_BINS
from ..decode.group import describe, group_quantized
from ..dtypes import skip_reason
from ..errors import (
    BadInputError,
    ModelPathError,
    OptionError,
    QuantizationError,
    VerificationError,
    note_kept,
    param,
)
from ..execution import Execution
from ..fit.matrix import fit_matrix
from ..layout import (
    ArchInfo,
    TensorRole,
    arch_from_config,
    attention_architecture,
    classify_tensor,
    complete_arch,
    split_parts,
    tied_head,
)
from ..layout.views import View, views_of, whole_rows
from ..progress import SILENT, Progress
from ..record.journal import Expected, Journal, Resumed
from ..record.lineage import fingerprint_json
from ..record.row import SCHEMA, matrix_record, vector_offset, vector_record
from ..reduce.pairs import (
    MAX_PAIRED,
    LineGather,
    as_lines,
    line_gather,
    pair_axis,
    pair_cosines,
    pair_lines,
    pair_positions,
)
from ..reduce.reduction import Reduction
from ..reduce.sample import MAX_EXPERTS, gather_order, layer_stride, sample_positions, samples_per_matrix
from ..reduce.stream import ChunkReport, Target, reduce_chunked
from ..reduce.vectors import VectorSummary, values_of
from ..segments import Segments
from ..source.plan import ModelPlan, Quantized, TensorRef
from ..source.reader import Reader, closing_on_error
from ..vocabulary import TRIMS
from .options import FitOptions, Measurement

ProgressFn = Callable[[TensorRef, int], None]


def execution_for(options: FitOptions, threads: int | None = None) -> Execution:
    """How a fit with these options runs (execution.py: the one place it is chosen and checked)."""
    return options.running.execution(threads)


def selected(name: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(name, pat) for pat in include):
        return False
    return not any(fnmatch.fnmatchcase(name, pat) for pat in exclude)


@dataclass
class _Work:
    ref: TensorRef
    role: TensorRole
    # The records the tensor is cut into (fused experts, MLA's kv_b_proj, a gated q_proj: layout/views.py);
    # empty: the tensor is one record.
    views: list[View] = field(default_factory=list)
    views_note: str | None = None  # why a tensor that holds several matrices is fitted whole

    @property
    def vector(self) -> bool:
        """Read as a vector: 1-D tensors, a mixer's parameters whatever their rank (Jamba's 2-D A_log, the
        3-D convolutions) and experts' stacked biases; never a quantized weight of two dimensions or more."""
        if self.ref.quant is not None:  # a 1-D one is decoded values still (a GGUF norm stored as 1 + w)
            return len(self.ref.shape) == 1
        return len(self.ref.shape) == 1 or self.role.kind == "ssm_param" or any(v.vector for v in self.views)


def plan_work(plan: ModelPlan, arch: ArchInfo, options: Measurement) -> tuple[list[_Work], list[dict[str, Any]]]:
    """Decide per tensor: read it (matrix or vector, whole or cut into records) or skip it with a reason."""
    work: list[_Work] = []
    skipped: list[dict[str, Any]] = []
    roles = {t.name: classify_tensor(t.name, t.shape, arch.n_layers, arch.family, arch.n_experts) for t in plan.tensors}
    # A head stored beside the embedding it is tied to (tie_word_embeddings true) is the same matrix to the
    # model: it is fitted once, as the embedding.
    tied = tied_head((ref.name, ref.shape, roles[ref.name]) for ref in plan.tensors) if arch.tied_embeddings else {}
    for ref in plan.tensors:
        if not selected(ref.name, options.include, options.exclude):
            continue
        role = roles[ref.name]
        reason = None
        if not ref.dtype.fittable:
            reason = skip_reason(ref.dtype)
        elif ref.numel == 0:
            reason = "empty tensor"
        elif len(ref.shape) == 0:
            reason = "scalar"
        elif ref.name in tied:
            reason = f"tied to {tied[ref.name]} (tie_word_embeddings: true): fitted once, as {tied[ref.name]}"
        if reason:
            skipped.append({"name": ref.name, "dtype": ref.dtype.name, "shape": list(ref.shape), "reason": reason})
            continue
        views, why = views_of(role, ref.name, ref.shape, arch, quantized=ref.quant is not None)
        if views and ref.quant is not None:
            _check_quantized_views(ref, views)
        work.append(_Work(ref, role, views, why))
    # Read in file order: sequential I/O on disks and in the page cache.
    work.sort(key=lambda w: (w.ref.shard, w.ref.start))
    return work, skipped


def _check_quantized_views(ref: TensorRef, views: list[View]) -> None:
    """A quantized weight is decoded piece by piece; formats decoded in row-major order (FP8, NVFP4, MXFP4,
    INT packs, bitsandbytes) can select any elements, GPTQ and AWQ (decoded in their storage order) whole
    logical rows only: a cut that is not whole rows of theirs is refused, never reduced on the wrong values."""
    from ..decode.formats import selects_any_elements

    if ref.quant is None or selects_any_elements(ref.quant.spec.format):
        return
    if not whole_rows(views, ref.shape[-1]):
        raise QuantizationError(
            f"{ref.name}: its {ref.quant.spec.label} codes hold {len(views)} matrices whose rows are not whole "
            f"rows of the stored {list(ref.shape)}; weightdiag cannot cut them exactly, so it does not fit them; "
            "fit the unquantized base model instead",
            method=ref.quant.spec.method,
        )


def measure(
    plan: ModelPlan,
    reader: Reader,
    options: FitOptions,
    progress: Progress | None = None,
    journal: Journal | None = None,
    *,
    execution: Execution | None = None,
) -> dict[str, Any]:
    """Stream every selected tensor of `plan` through the reducer and build the measured row: a record
    per matrix and vector (diagnose.kinds.interpret adds the per-kind summaries). `options` must have
    been checked (api.check_options). With a `journal` (weightdiag.record.journal), tensors an interrupted fit
    already measured are not read again, and each one measured now is journaled as it is done. `execution`:
    threads, workers and device (default: from the settings and options.device)."""
    owned = execution is None  # built here: its executor's connection (a Ray cluster) is let go here too
    with closing_on_error(reader):  # a bad WEIGHTDIAG_THREADS or --device fails here, before any tensor is read
        execution = execution or execution_for(options)
    try:
        with kernels.thread_budget(execution.threads):
            return _measure(plan, reader, options, execution, progress, journal)
    finally:
        if owned:
            execution.close()


def _measure(
    plan: ModelPlan,
    reader: Reader,
    options: FitOptions,
    execution: Execution,
    progress: Progress | None,
    journal: Journal | None,
) -> dict[str, Any]:
    device = execution.device
    # Quantized weights become one logical tensor each (codes + companions), or the fit stops here (exit 2).
    with closing_on_error(reader):
        group_quantized(plan, reader.tensor_bytes)
    config_notes: list[str] = []  # config fields ignored as unusable (1e308, Infinity, negative)
    arch = complete_arch(arch_from_config(plan.config, config_notes), [(t.name, t.shape) for t in plan.tensors])
    plan.notes.extend(n for n in config_notes if n not in plan.notes)  # the row's notes say what was ignored
    work, skipped = plan_work(plan, arch, options.measurement)
    if not work:
        message = f"{plan.location}: no fittable tensors selected"
        if options.include or options.exclude:  # the filters left nothing: name the ones given
            given = [name for name, value in (("include", options.include), ("exclude", options.exclude)) if value]
            raise OptionError(
                f"{message} (check {param('include')}/{param('exclude')})",
                param=given[0] if len(given) == 1 else "include",
            )
        raise ModelPathError(message, path=plan.location)
    total_bytes = sum(w.ref.file_nbytes for w in work)  # read from the files (GGUF: quantized, not dequantized)
    kept = _resume(journal, work, reader, options)
    todo = [w for w in work if w.ref.name not in kept.records]
    progress = progress or SILENT
    progress.started(plan.model_id, len(todo), sum(w.ref.file_nbytes for w in todo))
    entries: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {
        name: (e.matrices, e.vectors) for name, e in kept.records.items()
    }
    started = time.perf_counter()
    verification = None
    spectrum_run = None
    journaled_shards: set[int] = set(kept.skip_shards)
    report = ChunkReport()
    reducing = _reduce_all(todo, plan, reader, execution, arch, options, progress, report)
    try:
        for item, reduced in reducing:
            ref, role = item.ref, item.role
            matrices: list[dict[str, Any]] = []
            vectors: list[dict[str, Any]] = []
            note = "F64 rounded to F32 for fitting" if ref.dtype.name == "F64" else ref.note
            if reduced.decoder_note:
                note = "; ".join(n for n in (note, reduced.decoder_note) if n)
            if item.views:
                _view_records(item, reduced, arch, options, note, matrices, vectors)
            elif reduced.vector is not None:
                vectors.append(
                    vector_record(
                        ref.name,
                        role,
                        ref.dtype.name,
                        reduced.vector,
                        arch.norm_offset,
                        ref.stored_type,
                        ref.quantization,
                    )
                )
            else:
                assert reduced.whole is not None  # a matrix: reduced whole
                matrices.append(
                    matrix_record(
                        ref.name,
                        role,
                        ref.dtype.name,
                        ref.shape,
                        fit_matrix(reduced.whole, ref.shape, options.protocol, options.center, reduced.parts),
                        reduced.parts_note or item.views_note,
                        note,
                        ref.stored_type,
                        ref.quantization,
                        describe(ref.quant) if ref.quant is not None else None,
                    )
                )
            if reduced.sample is not None and matrices:  # journaled with its record; moved to `lineage` below
                matrices[0][SAMPLE_KEY] = reduced.sample.tolist()
                if reduced.pairs is not None:
                    matrices[0][PAIRS_KEY] = reduced.pairs.tolist()
            entries[ref.name] = (matrices, vectors)
            if journal is not None:
                journal.add(ref.name, ref.shard, matrices, vectors)
                if journal.verifies:
                    now = report.verified_shards()
                    journal.verified(now - journaled_shards)
                    journaled_shards.update(now)
            progress.measured(ref.name)
        # The reduction raised when a streamed shard's bytes did not match its hash; a download was checked at open.
        verification = report.verification or plan.verification
        if options.spectra:  # a second pass, after the shards were verified (run/spectrum.py)
            spectrum_run = _spectra(work, entries, plan, reader, arch, options, execution, progress)
    except BaseException as exc:
        reducing.close()  # the pass's reads and tasks end now, before the reader and the executor close
        if journal is not None:
            if isinstance(exc, (BadInputError, VerificationError)):
                journal.discard()  # a file that changed or bytes that do not match: nothing here to resume from
            else:
                journal.suspend()  # interrupted (a signal, the network, a crash): kept for the next run
        if isinstance(exc, KeyboardInterrupt):
            shard_of = {w.ref.name: w.ref.shard for w in work}
            note_kept(exc, _kept_words(journal, list(entries), shard_of, journaled_shards))
        raise
    finally:
        reader.close()
    elapsed = time.perf_counter() - started
    matrices = [m for w in work for m in entries[w.ref.name][0]]  # file order, whichever run measured them
    samples = {m["name"]: np.asarray(m.pop(SAMPLE_KEY), dtype=np.float32) for m in matrices if SAMPLE_KEY in m}
    pairs = {m["name"]: np.asarray(m.pop(PAIRS_KEY), dtype=np.float64) for m in matrices if PAIRS_KEY in m}
    vectors = [v for w in work for v in entries[w.ref.name][1]]
    row = build_row(
        plan, arch, matrices, vectors, skipped, options, device, elapsed, total_bytes, verification, spectrum_run
    )
    if samples:  # in file order, those of a resumed fit's journaled tensors too
        row["lineage"] = fingerprint_json(samples, max(v.size for v in samples.values()), pairs)
    row["run"]["device_choice"] = execution.device_choice(execution.for_spectrum() if options.spectra else None)
    cluster = execution.executor.summary()
    if cluster is not None:  # run metadata: which nodes read what
        row["run"]["cluster"] = cluster
    if kept.records:
        reused = [w for w in work if w.ref.name in kept.records]
        row["run"]["resumed"] = {
            "tensors": len(reused),
            "bytes": sum(w.ref.file_nbytes for w in reused),
            "since": kept.started,
        }
    return row


def _kept_words(journal: Journal | None, measured: list[str], shard_of: dict[str, int], verified: set[int]) -> str:
    """What an interrupted fit leaves for a rerun, in words (errors.note_kept): the tensors its journal holds that
    the next fit reuses (from the Hub, only those of shards read whole whose sha256 matched), or why none."""
    if journal is None:
        return "nothing measured is kept (a fit that saves no row keeps no journal); a rerun reads every tensor"
    if measured and not journal.folder.exists():  # its journal could not be written (a full disk)
        return "nothing measured is kept (its journal could not be written); a rerun reads every tensor"
    done = set(measured)
    whole = {s for s in verified if all(name in done for name, t in shard_of.items() if t == s)}  # as Journal.load
    reusable = [name for name in measured if not journal.verifies or shard_of.get(name) in whole]
    if reusable:
        n = len(reusable)
        amount = "1 tensor measured is" if n == 1 else f"{n} tensors measured are"
        return f"run the command again to resume: {amount} kept"
    if measured and journal.verifies:
        return (
            "nothing measured is kept: a shard streamed from the Hub is reused only once it was read whole and its "
            "sha256 matched, and none was; a rerun reads it again"
        )
    return "nothing was measured yet; a rerun starts over"


def _spectra(
    work: list[_Work],
    entries: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    plan: ModelPlan,
    reader: Reader,
    arch: ArchInfo,
    options: FitOptions,
    execution: Execution,
    progress: Progress | None,
) -> dict[str, Any]:
    """Every matrix record's spectrum (and its fused parts'), put into the records; the row's `run.spectrum`."""
    from . import spectrum
    from .spectrum import SpectrumInput, attach, plan_spectra, record_names, run_info

    inputs = [
        SpectrumInput(item.ref, item.views, [] if item.views else _parts(item, arch, options)[0])
        for item in work
        if not item.vector
    ]
    planned = plan_spectra(inputs, lambda i: record_names(i.views, i.ref.name))
    spectral = execution.for_spectrum()  # --device auto: the GPU where torch sees one
    result = spectrum.take_spectra(planned, reader, spectral, farms=options.farms, progress=progress, model=plan)
    attached = attach(result, (m for w in work for m in entries[w.ref.name][0]))
    return run_info(result, attached, options.farms)


def _resume(journal: Journal | None, work: list[_Work], reader: Reader, options: FitOptions) -> Resumed:
    """Open the journal: the records an interrupted fit of the same checkpoint left, the shards to skip."""
    if journal is None:
        return Resumed()
    kept = journal.load({w.ref.name: _expected(w) for w in work})
    if kept.skip_shards:
        reader.skip_shards(kept.skip_shards)
    journal.start(datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), kept)
    return kept


def _expected(item: _Work) -> Expected:
    """The records this fit makes of a tensor (as _measure and _view_records name them): what a journal's
    record of it must hold to be reused."""
    names = tuple(f"{item.ref.name}[{v.label}]" for v in item.views) if item.views else (item.ref.name,)
    if item.vector:
        return Expected(item.ref.shard, (), names)
    return Expected(item.ref.shard, names, ())


def _view_records(
    item: _Work,
    reduced: _Reduced,
    arch: ArchInfo,
    options: FitOptions,
    note: str | None,
    matrices: list[dict[str, Any]],
    vectors: list[dict[str, Any]],
) -> None:
    """The records of a tensor cut into several (layout/views.py), named `<tensor>[<label>]`."""
    ref = item.ref
    for view, summary in reduced.view_vectors:
        vectors.append(
            vector_record(
                f"{ref.name}[{view.label}]",
                view.role,
                ref.dtype.name,
                summary,
                arch.norm_offset,
                ref.stored_type,
                ref.quantization,
                slice_of=view.slice_of(ref.name),
            )
        )
    for view, red in reduced.view_matrices:
        if red.argmax >= 0:  # the stored tensor's flat index -> the piece's, as an (out, in) matrix
            red.argmax = view.local_index(red.argmax)
        matrices.append(
            matrix_record(
                f"{ref.name}[{view.label}]",
                view.role,
                ref.dtype.name,
                view.shape,
                fit_matrix(red, view.shape, options.protocol, options.center),
                note=note,
                stored_type=ref.stored_type,
                quantization=ref.quantization,
                dequantized=describe(ref.quant) if ref.quant is not None else None,
                slice_of=view.slice_of(ref.name),
            )
        )


@dataclass
class _Reduced:
    """What the workers hand back for one tensor: a reduction (and parts), or a vector's summary."""

    whole: Reduction | None = None
    parts: list[tuple[str, Reduction]] = field(default_factory=list)
    parts_note: str | None = None
    vector: VectorSummary | None = None
    view_matrices: list[tuple[View, Reduction]] = field(default_factory=list)  # a tensor cut into records
    view_vectors: list[tuple[View, VectorSummary]] = field(default_factory=list)
    decoder_note: str | None = None  # what a quantized weight's decoder said about how it read it
    sample: np.ndarray | None = None  # the lineage samples, in sampling order (reduce/sample.py)
    pairs: np.ndarray | None = None  # the cosines of the paired lines (reduce/pairs.py), where the matrix has them


def _parts(item: _Work, arch: ArchInfo, options: FitOptions) -> tuple[list[tuple[str, Segments]], str | None]:
    if options.split_fused and not item.views and item.role.kind in ("qkv", "ffn_in"):
        return split_parts(item.role, item.ref.name, item.ref.shape, arch)
    return [], None


def _reduce_all(
    work: list[_Work],
    plan: ModelPlan,
    reader: Reader,
    execution: Execution,
    arch: ArchInfo,
    options: FitOptions,
    progress: Progress | None,
    report: ChunkReport,
) -> Generator[tuple[_Work, _Reduced], None, None]:
    """Reduce every selected tensor, yielding results in file order.

    Every reader hands out byte ranges (safetensors local or Hub, GGUF, .bin), so everything goes through
    the chunk engine (reduce/stream.py), on the execution's executor: memory bounded by a few chunks, all
    cores and connections busy, even on one large tensor.
    """
    parts = [_parts(item, arch, options) for item in work]
    reader.set_connections(execution.connections)
    sampled = _sampled_positions(work)
    gather = tuning.current().vector_gather_bytes  # longer vectors are summarised piece by piece
    targets = [
        Target(
            item.ref,
            () if item.vector else _selections(item, segs),
            # a vector cut into records (experts' biases) is gathered whole: small, [experts, width]
            summarize=item.vector and not item.views and item.ref.nbytes > gather,
            offset=vector_offset(item.role, arch.norm_offset),
            sample=sampled[i].stream_positions if i in sampled else (),
            lines=sampled[i].lines if i in sampled else None,
        )
        for i, (item, (segs, _)) in enumerate(zip(work, parts, strict=True))
    ]
    verify = not (options.include or options.exclude)  # a partial read cannot be checked against a hash
    progress = progress or SILENT

    def on_node(node: str, nbytes: int) -> None:
        progress.node_done(node, nbytes, False)

    results = reduce_chunked(
        targets, (plan, reader), execution, verify=verify, on_bytes=progress.read, on_node=on_node, report=report
    )
    for index, result in results:
        reduced = _as_reduced(work[index], result, *parts[index], arch.norm_offset)
        reduced.decoder_note = report.notes.get(index)
        whole = reduced.whole
        if index in sampled and whole is not None and whole.sample is not None:
            at, got = sampled[index], whole.sample
            if got.size == at.positions.size:  # the samples in sampling order (a prefix for any k)
                if at.decoded is not None:  # a quantized weight's, gathered in decoded order: put back
                    got = got[at.decoded[1]]
                reduced.sample = got[at.order]
                if at.lines is not None and whole.lines is not None:
                    shape = tuple(work[index].ref.shape)
                    reduced.pairs = pair_cosines(as_lines(whole.lines, at.lines, shape), at.lines.lines.size)
                elif at.paired is not None:  # a quantized weight's lines, gathered as positions
                    reduced.pairs = pair_cosines(got[at.paired], pair_lines(tuple(work[index].ref.shape), at.axis).size)
            whole.sample = whole.lines = None
        yield work[index], reduced


SAMPLE_KEY = "lineage_sample"  # a matrix record's samples while it is measured and journaled (never in a row)
PAIRS_KEY = "lineage_pairs"  # and its pair cosines (reduce/pairs.py)


@dataclass(frozen=True)
class _Gathered:
    """A sampled matrix's sample positions gathered in the chunk pass (sorted, int64), where in them its lineage
    samples are in sampling order, and the gather of its paired lines (None: no pairs).

    A quantized weight's stream delivers values in its decoder's order (GPTQ's and AWQ's storage order), never
    as raw elements to take lines from: its paired lines' elements are positions too, with the samples' in
    `positions` (`paired`: where, in pair order; `axis`: their side), and `decoded` holds all of them in decoded
    order, sorted, with the permutation that puts values gathered so back in `positions`' order."""

    positions: np.ndarray
    order: np.ndarray
    lines: LineGather | None
    paired: np.ndarray | None = None
    axis: int = 0
    decoded: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def stream_positions(self) -> np.ndarray:
        """The positions as the chunk pass meets them (Target.sample)."""
        return self.positions if self.decoded is None else self.decoded[0]

    def stored_as(self, q: Quantized, shape: tuple[int, ...], k: int) -> _Gathered:
        """The same samples and lines for a weight of `shape` stored as `q`: positions, in its decoded order."""
        from ..decode.formats import decoded_positions

        sampled = sample_positions(shape, k)
        axis = self.lines.axis if self.lines is not None else 0
        paired = pair_positions(shape, axis) if self.lines is not None else np.zeros(0, dtype=np.int64)
        both = np.sort(np.concatenate([sampled, paired]))  # sorted, repeats dropped (np.unique hashes: 5x slower)
        positions = both[np.concatenate([[True], np.diff(both) > 0])] if both.size else both
        order = np.searchsorted(positions, sampled)
        at_pairs = np.searchsorted(positions, paired) if self.lines is not None else None
        at = decoded_positions(q, positions)
        decoded = gather_order(at) if not np.array_equal(at, positions) else None  # GPTQ, AWQ: another order
        return _Gathered(positions, order, None, at_pairs, axis, decoded)


def _gathered(shape: tuple[int, ...], k: int, axis: int | None) -> _Gathered:
    positions, back = gather_order(sample_positions(shape, k))
    return _Gathered(positions, back, line_gather(shape, axis))


def fingerprinted(work: list[_Work]) -> list[int]:
    """The indices of the matrices the lineage fingerprint samples: stored whole (unquantized, or quantized:
    sampled from their dequantized values at the logical matrix's positions), the first MAX_EXPERTS experts of
    a layer, and of a model of more than MAX_MATRICES such matrices only the layers whose index is a multiple of
    a stride (layer_stride)."""
    chosen = [
        i
        for i, item in enumerate(work)
        if not item.vector
        and not item.views
        and len(item.ref.shape) >= 2
        and (item.role.expert is None or item.role.expert < MAX_EXPERTS)
    ]
    stride = layer_stride([work[i].role.block for i in chosen])
    return [i for i in chosen if (work[i].role.block or 0) % stride == 0]


def _sampled_positions(work: list[_Work]) -> dict[int, _Gathered]:
    """The lineage samples of each matrix stored whole (reduce/sample.py; of a quantized one, its dequantized
    values at the logical [out, in] matrix's positions, gathered in its decoded order) and, for those indexed by
    hidden units, its paired lines (reduce/pairs.py), by work index. Experts past the first MAX_EXPERTS of a
    layer and tensors cut into records are not sampled; of a model of more than MAX_MATRICES such matrices, only
    the layers whose index is a multiple of a stride (layer_stride); of more than MAX_PAIRED matrices with pairs,
    only those of the layers whose index is a multiple of a second stride have them."""
    if not tuning.current().lineage_fingerprint:
        return {}
    chosen = fingerprinted(work)
    k = samples_per_matrix(len(chosen))
    paired = [i for i in chosen if pair_axis(work[i].role.kind) is not None]
    stride = layer_stride([work[i].role.block for i in paired], MAX_PAIRED)
    paired_set = {i for i in paired if (work[i].role.block or 0) % stride == 0}
    out = {}
    by_shape: dict[tuple[tuple[int, ...], int | None], _Gathered] = {}  # most matrices share a few shapes
    by_storage: dict[tuple[Any, ...], _Gathered] = {}  # and a quantized model a few formats
    for i in chosen:
        key = (tuple(work[i].ref.shape), pair_axis(work[i].role.kind) if i in paired_set else None)
        if key not in by_shape:
            by_shape[key] = _gathered(key[0], k, key[1])
        out[i] = by_shape[key]
        q = work[i].ref.quant
        if q is not None:
            stored = (*key, q.spec.format, q.spec.bits, q.logical_shape)
            if stored not in by_storage:
                by_storage[stored] = out[i].stored_as(q, key[0], k)
            out[i] = by_storage[stored]
    return out


def _as_reduced(
    item: _Work,
    result: np.ndarray | VectorSummary | list[Reduction],
    segs: list[tuple[str, Segments]],
    note: str | None,
    norm_offset: float,
) -> _Reduced:
    """A vector's summary (from its raw bytes when they were gathered); or the whole matrix's reduction and
    its named fused parts; or, for a tensor cut into records, one reduction or summary per record."""
    if isinstance(result, VectorSummary):
        return _Reduced(vector=result)
    if isinstance(result, np.ndarray):
        values = values_of(result, item.ref.dtype.name)
        if item.views:
            return _Reduced(
                view_vectors=[(v, VectorSummary.of(v.segments.view(values).reshape(-1))) for v in item.views]
            )
        return _Reduced(vector=VectorSummary.of(values, vector_offset(item.role, norm_offset)))
    if item.views:
        return _Reduced(view_matrices=list(zip(item.views, result, strict=True)))
    whole, *rest = result
    return _Reduced(whole=whole, parts=[(kind, r) for (kind, _), r in zip(segs, rest, strict=True)], parts_note=note)


def _selections(item: _Work, segs: list[tuple[str, Segments]]) -> tuple[Segments | None, ...]:
    """What to reduce a matrix over: each record cut from it, else the whole (None) and its fused parts."""
    if item.views:
        return tuple(v.segments for v in item.views)
    return (None, *(seg for _, seg in segs))


def build_row(
    plan: ModelPlan,
    arch: ArchInfo,
    matrices: list[dict[str, Any]],
    vectors: list[dict[str, Any]],
    skipped: list[dict[str, Any]],
    options: FitOptions,
    device: str,
    elapsed: float,
    total_bytes: int,
    verification: dict[str, Any] | None = None,
    spectrum: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The measured row; `spectrum`: the spectrum pass's `run.spectrum` (the row is then weightdiag.row/2)."""
    from ..record.schema import SCHEMA_SPECTRUM
    from ..source.local import content_fingerprint

    verified = (verification or {}).get("shards") or [False] * len(plan.shards)

    others = [m["name"] for m in matrices if m["kind"] == "other" and not m.get("tower")]  # towers are listed apart
    arch_json = arch.to_json()
    arch_json["attention"] = attention_architecture(arch)
    row: dict[str, Any] = {
        "schema": SCHEMA_SPECTRUM if spectrum else SCHEMA,
        "model": {
            "id": plan.model_id,
            "source": plan.source,
            "location": plan.location,
            "revision": plan.revision,
            "commit": plan.commit,
            "fingerprint": f"local-{content_fingerprint(plan)}" if plan.source == "local" else None,
            "format": plan.file_format,
        },
        "files": [
            {
                "name": s.name,
                "size": s.size,
                "sha256": s.sha256,
                "header_sha256": s.header_sha256,
                "verified": bool(ok),
            }
            for s, ok in zip(plan.shards, verified, strict=True)
        ],
        "metadata": plan.metadata,
        "architecture": arch_json,
        "protocol": {
            "name": options.protocol,
            "trim": options.trim,
            "trims": list(TRIMS),
            # |w - mean| (App. A.1's text) when true; |w| (the cohort's library) otherwise.
            "centered": options.center,
            **(
                {"bins": HIST_BINS, "log10_range": [float(BIN_EDGES[0]), float(BIN_EDGES[-1])]}
                if options.protocol == "hist1024"
                else {"plotting_positions": "hazen (i - 0.5) / N, ties pooled"}
            ),
        },
        "tool": {"name": "weightdiag", "version": __version__},
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run": {
            "device": device,
            "seconds": round(elapsed, 3),
            "bytes_read": total_bytes,
            "include": list(options.include),
            "exclude": list(options.exclude),
            "verification": (verification or {}).get("summary") or "not verified: read from local files",
            **({"spectrum": spectrum} if spectrum else {}),
        },
        "matrices": matrices,
        "vectors": vectors,
        "skipped": skipped,
        "unclassified": others,
        "notes": list(plan.notes),
    }
    return row

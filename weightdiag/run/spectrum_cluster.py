"""`fit --spectrum --executor ray`: the spectrum pass (run/spectrum.py) on the nodes of the Ray cluster.

The fit's chunks already run on the cluster (reduce/cluster.py); the spectrum's second pass would otherwise
read every matrix again through the driver's own reader and take its Gram on the driver's cores: the
slowest part of `fit --spectrum` (its flops, O(m·n·min(m, n)) per matrix), on one machine. Here it runs as
tasks on the nodes, each taking whole matrices: it opens the source again on its node (source/reopen.py),
runs `take_spectra` on its tensors exactly as the local pass does, and hands back each record's `spectrum`
object (a few hundred bytes: the metrics and a summary of the eigenvalues), never a Gram.

Why whole matrices per task rather than partial Grams of row ranges merged on the driver:
- a Gram's float sums depend on their order and grouping: the local pass adds each row block into one
  accumulator (dsyrk with beta = 1, block after block); partial Grams of row ranges added together round
  differently, in the last bits, so the row would differ from the local fit's however the merge is ordered;
- a wide matrix (m < n) has no partial Gram at all: WWᵀ pairs every row with every other, it is formed from
  all the rows at the end (reduce/gram.py);
- a partial Gram is n²·8 bytes (134 MB for n = 4,096): shipping one per row range through Ray's object store
  would cost more than reading the matrix again on the node that sums it.
A matrix's spectrum is independent of every other's, so tasks take consecutive tensors (all the records
cut from a tensor, and its fused parts, share its reads), grouped to about the same flops, and their results
are put back by record: the same eigenvalues as the local pass, whatever node computes them and whatever
order tasks finish in.

What must be the same on the nodes for the same bytes: the row blocks (each node's reader cuts them at the
driver reader's size) and the BLAS thread count, because OpenBLAS splits its sums by threads (the eigensolve's
dsymv, for one): every task runs BLAS with the driver's Execution.threads (WEIGHTDIAG_THREADS), whatever
CPUs it declares to Ray, and the nodes must run the same OpenBLAS build on the same kind of CPU (its kernels
are chosen by the CPU) for the row to be byte-identical to a local fit on the driver.
"""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from .. import settings
from ..execution import Execution
from ..reduce.cluster import TASK_BASE_MEMORY, TASKS_PER_SLOT, RayReader, balanced_runs
from ..reduce.gram import estimated_bytes
from ..reduce.row_stream import BLOCK_BYTES, MAX_AHEAD
from ..source.plan import TensorRef
from ..source.reopen import SourceSpec, reopen
from .spectrum import Key, Plan, ProgressFn, SpectrumResult, Target, flops, take_spectra


@dataclass(frozen=True)
class SpectrumJob:
    """What one task takes the spectra of: consecutive tensors of the plan and their targets (plain data)."""

    refs: tuple[TensorRef, ...]
    targets: tuple[tuple[Target, ...], ...]
    source: SourceSpec
    threads: int  # BLAS threads: the driver's, so that the sums are the local pass's
    chunk_bytes: int  # the driver's reader's: the row blocks are cut at the same places
    connections: int
    farms: bool


def _packed(ref: TensorRef) -> bool:
    from ..decode.formats import selects_any_elements

    return ref.quant is not None and not selects_any_elements(ref.quant.spec.format)


def spectra_on_node(job: SpectrumJob, node: str) -> tuple[dict[Key, dict[str, Any]], dict[Key, str]]:
    """Runs on a node: the job's tensors read again there, their targets' spectra (or why none)."""
    touched = {ref.shard for ref in job.refs} | {
        companion.shard for ref in job.refs if ref.quant is not None for companion in ref.quant.companions.values()
    }
    execution = Execution.from_settings("cpu", threads=job.threads)
    with reopen(job.source, touched, node) as reader:
        reader.chunk_bytes = min(reader.chunk_bytes, job.chunk_bytes)
        reader.set_connections(job.connections)
        result = take_spectra(Plan(list(job.refs), [list(t) for t in job.targets]), reader, execution, farms=job.farms)
    return result.spectra, result.skipped


def _memory(job: SpectrumJob, hub: bool) -> int:
    """What a task holds at most: its largest tensor's Grams (and held rows), the blocks read ahead, buffers."""
    grams = max(
        sum(estimated_bytes(*t.fed(_packed(ref), ref)) for t in targets)
        for ref, targets in zip(job.refs, job.targets, strict=True)
    )
    blocks = 2 * MAX_AHEAD * BLOCK_BYTES  # stored bytes and their float32 values
    buffers = job.connections * job.chunk_bytes if hub else 0
    return TASK_BASE_MEMORY + grams + blocks + buffers


def spread_spectra(
    plan: Plan, reader: RayReader, execution: Execution, *, farms: bool = False, progress: ProgressFn | None = None
) -> SpectrumResult:
    """take_spectra's result (see the module docstring), the tensors' spectra taken by tasks on the cluster."""
    started = time.perf_counter()
    work = [
        [flops(t, _packed(ref), ref) for t in targets] for ref, targets in zip(plan.refs, plan.targets, strict=True)
    ]
    if progress:
        progress("spectrum-start", {"matrices": plan.count, "flops": sum(map(sum, work))})
    spectra: dict[Key, dict[str, Any]] = {}
    skipped = dict(plan.skipped)
    if plan.refs:
        cpus = settings.ray_task_cpus()
        share = sum(map(sum, work)) / max(1, TASKS_PER_SLOT * reader.cluster.slots(cpus))
        runs = balanced_runs([sum(w) for w in work], share)
        jobs = [
            SpectrumJob(
                tuple(plan.refs[i] for i in run),
                tuple(tuple(plan.targets[i]) for i in run),
                reader.source,
                execution.threads,
                reader.inner.chunk_bytes,
                reader.connections,
                farms,
            )
            for run in runs
        ]
        hub = reader.source.kind == "hub"
        memory = [_memory(job, hub) for job in jobs]
        nbytes = [sum(ref.nbytes for ref in job.refs) for job in jobs]
        on_node = None
        if progress:
            on_node = lambda node, n: progress("node", {"node": node, "bytes": n, "pass": "spectrum"})  # noqa: E731
        outcomes = reader.cluster.run(spectra_on_node, jobs, cpus=cpus, memory=memory, nbytes=nbytes, on_node=on_node)
        with closing(outcomes):  # an error here lets the running tasks end now, before the reader disconnects
            for run, outcome in zip(runs, outcomes, strict=True):
                found, why = outcome.results
                spectra.update(found)
                skipped.update(why)
                if progress:
                    for i in run:
                        for amount in work[i]:
                            progress("spectrum-advance", amount)
    return SpectrumResult(spectra, skipped, time.perf_counter() - started, execution.device)

"""`diff BASE TUNED --executor ray`: the paired reduction spread over the nodes of a Ray cluster.

A diff reads both checkpoints in lockstep, pair by pair (paired.py), and everything it computes for a pair
(the exact figures folded over its row blocks in row order, the spectrum of ΔW) depends on that pair's blocks
alone. So the tasks take whole pairs: consecutive runs of them, balanced by the bytes of both sides. Each
task opens both sources again on its node (source/reopen.py: the same files at the same path, or the same
commits on the Hub with the node's own token), runs the local comparison (`compare.compare`: the same blocks,
the same folds, the driver's thread count, so the same BLAS sums) on its pairs and hands back their
TensorDiffs (a few hundred bytes each); the driver puts them together in task order, i.e. pair order. The
result is the local diff's, whatever the number of nodes and the order tasks finish in (all but run
metadata: times, run.cluster).

Verification. A Hub side is verified locally when its blocks come in file order: every byte of its shards
passes through the reader's hash. On the cluster each task hashes whole shards: tasks are cut only between
pairs where every verified side moves on to a later shard, and each task owns, per verified side, the shards
from the one after its predecessor's last to its own last (the last task: to the end), shards without any
paired tensor included. The driver checks that every shard was hashed and matched on some node.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

from .. import kernels, settings
from ..errors import VerificationError
from ..execution import Execution
from ..layout import ArchInfo
from ..reduce.cluster import TASK_BASE_MEMORY, Cluster, balanced_runs, task_bytes
from ..source.plan import ModelPlan, TensorRef
from ..source.reader import Reader
from ..source.reopen import SourceSpec, describe, reopen
from .compare import compare
from .paired import BLOCK_BYTES, BLOCK_ELEMS, plan_blocks, side_reads
from .pairing import Pair
from .result import DiffOptions, TensorDiff

SIDES = ("base", "tuned")


@dataclass(frozen=True)
class PairsJob:
    """What one task compares: consecutive pairs, and per side the sources and the shards it hashes."""

    pairs: tuple[Pair, ...]
    arch: ArchInfo
    sources: tuple[SourceSpec, SourceSpec]
    hashed: tuple[frozenset[int] | None, frozenset[int] | None]  # per side: shards to hash whole, or None
    options: DiffOptions  # without the token: a node reads the Hub with its own
    threads: int  # the driver's: the same BLAS and kernel threads, so the same sums
    delay: float = 0.0  # tests only: seconds the task holds its worker after comparing (spreads short tasks)


Outcome = tuple[list[TensorDiff], list[TensorDiff], tuple[frozenset[int], frozenset[int]]]


def _shards_of(ref: TensorRef) -> set[int]:
    companions = ref.quant.companions.values() if ref.quant is not None else ()
    return {ref.shard} | {c.shard for c in companions}


def pairs_on_node(job: PairsJob, node: str) -> Outcome:
    """Runs on a node: both sides opened again there, the job's pairs compared as the local diff does."""
    readers: list[Reader] = []
    try:
        for side, (source, hashed) in enumerate(zip(job.sources, job.hashed, strict=True)):
            touched = set().union(*(_shards_of(p.base if side == 0 else p.tuned) for p in job.pairs))
            reader = reopen(source, touched | (hashed or set()), node)
            readers.append(reader)
            reader.set_connections(job.options.connections)
            # This task's shards only (the others are hashed by other tasks); none on a side the local diff
            # would not verify (its regions then empty: side_reads reads the blocks alone).
            reader.skip_shards(set(range(len(source.shards))) - (hashed or set()))
        execution = Execution.from_settings("cpu", threads=job.threads)
        verifying: dict[str, bool] = {}
        verify = any(h is not None for h in job.hashed)
        with kernels.thread_budget(execution.threads):
            matrices, vectors = compare(
                list(job.pairs), job.arch, readers[0], readers[1], job.options, execution, verify, verifying
            )
        if job.delay:
            time.sleep(job.delay)
        verified = []
        for name, reader in zip(SIDES, readers, strict=True):
            if verifying.get(name):
                reader.finish()  # raises VerificationError where the bytes were read: the file names it
                verified.append(frozenset(reader.verified_shards()))
            else:
                verified.append(frozenset())
        return matrices, vectors, (verified[0], verified[1])
    finally:
        for reader in readers:
            reader.close()


def _memory(job: PairsJob, hub: bool, workers: int) -> int:
    """A task's peak: the blocks in flight on both sides and their float64 arithmetic, the spectra's
    accumulators (8 MB at most each: GRAM_COLS), a Hub side's buffers."""
    blocks = 2 * workers * (2 * BLOCK_BYTES + 4 * 8 * BLOCK_ELEMS)  # the one-pass kernel's need no float64
    buffers = 2 * (job.options.connections + 2) * (16 << 20) if hub else 0
    return TASK_BASE_MEMORY + blocks + 2 * workers * (8 << 20) + buffers


def _hashing(pairs: Sequence[Pair], readers: Sequence[Reader], verify: bool) -> list[dict[int, Any] | None]:
    """Per side, its regions when the local diff would verify it (blocks in file order, every shard hashable)."""
    blocks = plan_blocks(pairs)
    out: list[dict[int, Any] | None] = []
    for side, reader in enumerate(readers):
        regions = reader.regions() if verify else None
        chunks = [b.base if side == 0 else b.tuned for b in blocks]
        out.append(regions if regions is not None and side_reads(chunks, regions, reader.chunk_bytes).verify else None)
    return out


def _cuts(pairs: Sequence[Pair], hashing: Sequence[dict[int, Any] | None]) -> list[bool]:
    """Where a task may start: before pair i when every verified side's shards of pairs < i all come before
    those of pairs >= i (a verified shard is hashed by the one task that reads it whole)."""
    cuts = [True] * len(pairs)
    for side, regions in enumerate(hashing):
        if regions is None:
            continue
        refs = [p.base if side == 0 else p.tuned for p in pairs]
        for i in range(1, len(refs)):
            if refs[i].shard <= refs[i - 1].shard:
                cuts[i] = False
    return cuts


def _owned(runs: Sequence[range], pairs: Sequence[Pair], side: int, shards: int) -> list[frozenset[int]]:
    """The shards each task hashes on one verified side: after its predecessor's last, up to its own last
    (the last task's: to the end)."""
    owned = []
    start = 0
    for k, run in enumerate(runs):
        last = max((pairs[i].base if side == 0 else pairs[i].tuned).shard for i in run)
        end = shards if k == len(runs) - 1 else last + 1
        owned.append(frozenset(range(start, end)))
        start = end
    return owned


def compare_on_cluster(
    cluster: Cluster,
    pairs: list[Pair],
    arch: ArchInfo,
    plans: tuple[ModelPlan, ModelPlan],
    readers: tuple[Reader, Reader],
    options: DiffOptions,
    execution: Execution,
    verify: bool,
    verifying: dict[str, bool],
    progress: Any = None,
) -> tuple[list[TensorDiff], list[TensorDiff]]:
    """compare.compare's result, the pairs compared by tasks on the cluster (see the module docstring).
    `verifying[side]`: whether that side's shards were all hashed (on the nodes); a mismatch raises."""
    sources = (describe(plans[0], readers[0]), describe(plans[1], readers[1]))
    hashing = _hashing(pairs, readers, verify)
    cpus = settings.ray_task_cpus()
    weights = [p.base.nbytes + p.tuned.nbytes for p in pairs]
    share = task_bytes(sum(weights), cluster.slots(cpus), settings.ray_task_bytes())
    runs = balanced_runs(weights, share, _cuts(pairs, hashing))
    owned = [
        _owned(runs, pairs, side, len(plans[side].shards)) if regions is not None else [None] * len(runs)
        for side, regions in enumerate(hashing)
    ]
    shipped = replace(options, token=None)
    jobs = [
        PairsJob(
            tuple(pairs[i] for i in run),
            arch,
            sources,
            (owned[0][k], owned[1][k]),
            shipped,
            execution.threads,
            settings.test_ray_task_delay(),
        )
        for k, run in enumerate(runs)
    ]
    hub = any(s.kind == "hub" for s in sources)
    workers = options.workers or execution.threads
    memory = [_memory(job, hub, workers) for job in jobs]
    nbytes = [sum(weights[i] for i in run) for run in runs]
    on_node = None
    if progress is not None:
        on_node = lambda node, n: progress("node", {"node": node, "bytes": n})  # noqa: E731
    matrices: list[TensorDiff] = []
    vectors: list[TensorDiff] = []
    hashed: list[set[int]] = [set(), set()]
    outcomes = cluster.run(pairs_on_node, jobs, cpus=cpus, memory=memory, nbytes=nbytes, on_node=on_node)
    with closing(outcomes):  # an error here lets the running tasks end now, before the driver disconnects
        for run, outcome in zip(runs, outcomes, strict=True):
            found_matrices, found_vectors, verified = outcome.results
            matrices.extend(found_matrices)
            vectors.extend(found_vectors)
            for side in (0, 1):
                hashed[side] |= verified[side]
            if progress is not None:
                for i in run:
                    progress("bytes", weights[i])
                    progress("advance", pairs[i].base)
    for side, regions in enumerate(hashing):
        verifying[SIDES[side]] = regions is not None
        missing = sorted(set(regions or ()) - hashed[side])
        if missing:
            shard = plans[side].shards[missing[0]]
            raise VerificationError(
                f"{shard.name}: no task reported its sha256 verified; nothing was written, run the command again",
                repo=plans[side].model_id,
                file=shard.name,
                expected=shard.sha256,
                got="",
            )
    return matrices, vectors

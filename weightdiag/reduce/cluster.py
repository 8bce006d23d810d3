"""The chunk engine's second executor: one plan, its chunks reduced by tasks on the nodes of a Ray cluster.

The driver (the machine that runs `weightdiag fit --executor ray`) plans exactly as a local fit does
(plan_reads: the same chunks, the same pieces) and never reads a weight byte. It cuts the chunks, in file
order, into tasks of about a budget of bytes: whole shards where they fit, runs of consecutive chunks of one
shard otherwise (unless the shard is verified: its sha256 can only be computed by one reader of every byte,
so a verified shard is always one task's). Each task runs on some node: it opens the source again there
(source/reopen.py: the same files at the same path, or the same commit on the Hub with the node's own token,
each shard checked to be the one planned), reads its chunks through the same Reader, reduces each with
reduce_chunk and hands back each chunk's partial results (packed: nonzero counts only). The driver folds
them with Fold in plan order, so every sum is merged in the order the local engine merges it: the row is
byte-identical to the local fit's (all but run metadata) on any number of nodes, in whatever order tasks
finish, and after Ray retries a task whose worker or node was lost (its results are the same bytes
reduced the same way). Nothing is merged on a node across chunks: float sums are not associative.

No tensor bytes travel through Ray: task arguments are chunk lists and target descriptions, results are
the partial reductions (and the bytes of small vectors, gathered whole as the local engine gathers them).
A quantized weight's decoder is built on the node from companions it reads itself; positions of the largest
|w| are turned into the logical matrix's there, as Fold does locally. Tasks declare `num_cpus` and `memory`
(chunk buffers, companions, results) so that Ray, not the kernel's OOM killer, limits how many run at once.

`Cluster.run` is the one way work runs on the cluster: the fit's chunks here, the spectrum's matrices
(run/spectrum_cluster.py) and a diff's tensor pairs (diff/cluster.py) each hand it a module-level function and
plain payloads; it submits a window of tasks, hands their outcomes back in payload order, counts each node's
tasks and bytes (run.cluster, per-node progress), and after an error lets the running tasks end.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import settings
from ..errors import HubError, MissingDependencyError, OptionError, VerificationError, WeightdiagError
from ..execution import Execution
from ..source.chunks import Chunk
from ..source.plan import ModelPlan, TensorRef
from ..source.reader import Reader, Verification
from ..source.reopen import SourceSpec, describe, reopen
from .reduction import Reduction
from .stream import ChunkResult, Fold, Target, plan_reads, reduce_chunks
from .vectors import VectorSummary

# Tasks are made smaller than the budget to give every CPU of the cluster about two of them, never smaller than
# this: a task costs a few tens of milliseconds besides its reading (scheduling, reopening its shards' headers;
# Ray reuses its workers, so the imports are paid once per worker), a few per cent of 64 MiB at 50 MB/s.
MIN_TASK_BYTES = 64 << 20
TASKS_PER_SLOT = 2
MAX_RETRIES = 3  # a task whose worker or node is lost is run again (Ray's retries), then the fit fails
DRAIN_SECONDS = 10.0  # after an error, how long the tasks already running may take to end before disconnecting
# What a task holds besides its chunk buffers: the interpreter, numpy, weightdiag, Ray's worker.
TASK_BASE_MEMORY = 384 << 20
RESULT_BYTES_PER_CHUNK = 256 << 10  # a chunk's packed partial results, generously (BF16: ~50 KB)


def plan_tasks(chunks: Sequence[Chunk], budget: int, whole_shards: bool) -> list[range]:
    """Consecutive runs of `chunks` (indexes), each of at most `budget` bytes where possible: whole shards
    grouped while they fit; a larger shard alone, cut into runs of chunks of about `budget` unless
    `whole_shards` (a verified plan: each shard hashed by the one task that reads it all)."""
    runs: list[range] = []
    start = 0
    held = 0  # bytes of the task being filled, chunks [start, i)
    i = 0
    while i < len(chunks):
        shard = chunks[i].shard
        end = i
        size = 0
        while end < len(chunks) and chunks[end].shard == shard:
            size += chunks[end].nbytes
            end += 1
        if held and held + size > budget:  # the shard does not fit beside what the task holds: close it
            runs.append(range(start, i))
            start, held = i, 0
        if size <= budget or whole_shards:
            held += size
        else:  # a shard larger than a task: runs of chunks, each at least one chunk
            if held:
                runs.append(range(start, i))
            at, run_bytes = i, 0
            for j in range(i, end):
                if run_bytes and run_bytes + chunks[j].nbytes > budget:
                    runs.append(range(at, j))
                    at, run_bytes = j, 0
                run_bytes += chunks[j].nbytes
            start, held = at, run_bytes
        i = end
    if start < len(chunks):
        runs.append(range(start, len(chunks)))
    return runs


def task_bytes(total: int, slots: int, budget: int) -> int:
    """The bytes per task: the budget, or less so that each of `slots` CPUs gets about two tasks (never below
    MIN_TASK_BYTES, unless the budget is)."""
    share = math.ceil(total / max(1, TASKS_PER_SLOT * slots))
    return min(budget, max(MIN_TASK_BYTES, share))


def balanced_runs(weights: Sequence[float], share: float, cuts: Sequence[bool] | None = None) -> list[range]:
    """Consecutive runs of items (indexes), each of about `share` of weight: an item is never cut, a run holds
    at least one, and a run closes before an item that would take it over `share`, where a run may start
    (`cuts[i]`: before item i; default everywhere)."""
    runs: list[range] = []
    start, held = 0, 0.0
    for i, weight in enumerate(weights):
        if i > start and held + weight > share and (cuts is None or cuts[i]):
            runs.append(range(start, i))
            start, held = i, 0.0
        held += weight
    if start < len(weights):
        runs.append(range(start, len(weights)))
    return runs


@dataclass(frozen=True)
class Task:
    """What one task reads and reduces: plain data, pickled to the node that runs it."""

    index: int
    chunks: tuple[Chunk, ...]  # consecutive chunks of the plan, in file order
    targets: Mapping[int, Target]  # the targets their pieces belong to, by plan index (no decoders)
    source: SourceSpec
    hashed: frozenset[int]  # shards this task reads whole and checks against their published sha256
    cpus: int
    connections: int
    delay: float = 0.0  # tests only: seconds to wait after each chunk


@dataclass
class TaskOutcome:
    """What a task hands back: what its function returned, or the error (one line naming the node)."""

    index: int
    node: str
    results: Any = None
    error: WeightdiagError | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Job:
    """One task of any pass run on the cluster: `fn(payload, node)` on some node; plain data (pickled, `fn` by
    reference: a module-level function of weightdiag, imported by the worker)."""

    index: int
    fn: Callable[[Any, str], Any]
    payload: Any


def node_name() -> str:
    """This Ray node, as error lines and progress name it: its address and the start of its id."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    try:  # the address the node was started with (several nodes may share a machine)
        address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)
    except Exception:  # a name for messages: the host name will do
        address = socket.gethostname()
    return f"node {address} ({node_id[:8]})"


def run_task(job: Job) -> TaskOutcome:
    """Runs on a node: the job's function, its result handed back (or its error, naming this node)."""
    node = node_name()
    started = time.perf_counter()
    try:
        results = job.fn(job.payload, node)
    except WeightdiagError as exc:  # one line naming this node, raised on the driver as it is
        if not str(exc).startswith(node):
            exc.args = (f"{node}: {exc}",)
        return TaskOutcome(job.index, node, error=exc)
    return TaskOutcome(job.index, node, results, seconds=time.perf_counter() - started)


def _reduce_task(task: Task, node: str) -> tuple[list[list[tuple[int, Any]]], frozenset[int]]:
    from .. import kernels
    from ..decode.loader import CompanionLoader, LazyDecoder

    # Renumbered from 0: a reader hands out buffers and hashes in the order of the chunks it was told.
    chunks = [replace(chunk, index=i) for i, chunk in enumerate(task.chunks)]
    items = list(dict.fromkeys(piece.item for chunk in chunks for piece in chunk.pieces))  # in stream order
    quantized = [item for item in items if task.targets[item].ref.quant is not None]
    touched = {chunk.shard for chunk in chunks} | {
        ref.shard for item in quantized for ref in _companions(task.targets[item].ref)
    }
    execution = Execution.from_settings("cpu", threads=task.cpus)
    with reopen(task.source, touched, node) as reader:
        # Chunks planned for another reader kind (a Hub model the driver read from its cache) may be larger
        # than this reader's buffers: make them fit.
        reader.chunk_bytes = max(reader.chunk_bytes, max(chunk.nbytes for chunk in chunks))
        reader.set_connections(task.connections)
        reader.skip_shards(set(range(len(task.source.shards))) - task.hashed)  # hash only what it reads whole
        reader.start(chunks, verify=bool(task.hashed))
        loader = None
        targets: dict[int, Target] = dict(task.targets)
        if quantized:
            loader = CompanionLoader(reader.tensor_bytes, [_quant(targets[item].ref) for item in quantized])
            for k, item in enumerate(quantized):
                targets[item] = replace(targets[item], decoder=LazyDecoder(loader, k))
        last = {piece.item: chunk.index for chunk in chunks for piece in chunk.pieces}
        out: list[list[tuple[int, Any]]] = []
        try:
            with kernels.thread_budget(execution.threads):
                for chunk, results in reduce_chunks(targets, reader, chunks, execution):
                    _logical_positions(targets, results)
                    out.append(list(results))
                    for piece in chunk.pieces:
                        decoder = targets[piece.item].decoder
                        if decoder is not None and last[piece.item] == chunk.index:
                            decoder.release()  # its last piece in this task: drop its companions
                    if task.delay:
                        time.sleep(task.delay)
        finally:
            if loader is not None:
                loader.close()
        if task.hashed:
            reader.finish()  # raises VerificationError where the bytes were read: the file names it
        return out, frozenset(reader.verified_shards() & task.hashed)


def _quant(ref: TensorRef):
    assert ref.quant is not None
    return ref.quant


def _companions(ref: TensorRef) -> list[TensorRef]:
    return [] if ref.quant is None else list(ref.quant.companions.values())


def _logical_positions(targets: Mapping[int, Target], results: ChunkResult) -> None:
    """Positions of the largest |w| of decoded pieces, from decoded order to the logical matrix's flat index
    (what Fold does once per tensor locally: the merge picks the same part either way, by value and order)."""
    for item, result in results:
        handle = targets[item].decoder
        if handle is None or not isinstance(result, list):
            continue
        decoder = handle.get()
        for parts in result:
            for red in parts:
                if red.argmax >= 0:
                    red.argmax = decoder.logical_index(red.argmax)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "--executor ray needs Ray: pip install ray (or, in the weightdiag repository, pip install '.[ray]')",
            package="ray",
        ) from None
    return ray


PROBE_SECONDS = 10.0


def _check_reachable(address: str) -> None:
    """A HOST:PORT that nothing answers on fails now, in one line: ray.init would retry it for minutes,
    printing a warning every few seconds."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": Ray's own resolution
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS):
            return
    except OSError as exc:
        raise HubError(
            f"--executor ray: no Ray cluster answers at {address} ({exc.strerror or exc}); start one (ray start "
            "--head) or give its head's address with --ray-address or RAY_ADDRESS"
        ) from None


def _notices_to_stderr() -> None:
    """Ray prints the cluster's notices (a worker that died and whose task is run again, ...) on the driver's
    stdout, where `fit --json` writes the row: send them to stderr, with the fit's other chatter."""
    module = sys.modules.get("ray._private.worker")
    original = getattr(module, "print_to_stdstream", None)
    if original is None or getattr(original, "weightdiag", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr.weightdiag = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_stderr  # type: ignore[union-attr]  # looked up at each call by Ray's listener


def _task_memory(task: Task, hub: bool, chunk_workers: int) -> int:
    """Bytes a task may hold at once: chunk buffers, a few weights' companions and decoders, its results."""
    from ..decode.loader import LOOKAHEAD
    from ..source.hub_stream import EXTRA_BUFFERS

    largest = max(chunk.nbytes for chunk in task.chunks)
    buffers = (task.connections + EXTRA_BUFFERS if hub else 2 * chunk_workers) * largest
    companions = sorted(
        (sum(ref.nbytes for ref in _companions(t.ref)) for t in task.targets.values()),
        reverse=True,
    )
    decoders = 4 * sum(companions[: LOOKAHEAD + 1])  # the companions and the tables built from them
    return TASK_BASE_MEMORY + buffers + decoders + RESULT_BYTES_PER_CHUNK * len(task.chunks)


NodeProgress = Callable[[str, int], None]  # on_node(node, bytes): a task's bytes folded, and the node that read them


class Cluster:
    """A connection to a Ray cluster and the one way passes run on it: `run` submits jobs (a window of them
    at a time), hands their results back in job order whatever order they finish in, and counts per node
    the tasks and bytes (run metadata). Every pass spread over the cluster (the fit's chunks, the spectrum's
    matrices, a diff's pairs) goes through it: the same retries, errors, drain and accounting."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self.owns = False  # whether close() disconnects (join() connected)
        self.nodes: dict[str, dict[str, float]] = {}  # per node: tasks, bytes, seconds

    @classmethod
    def join(cls, address: str | None, ray: Any = None) -> Cluster:
        """Join the Ray cluster at `address` (default RAY_ADDRESS)."""
        ray = ray or _import_ray()
        target = address or settings.ray_address()
        if not target:
            raise OptionError(
                "--executor ray: give --ray-address HOST:PORT or set RAY_ADDRESS (an existing cluster)",
                option="--ray-address",
            )
        _check_reachable(target)
        cluster = cls(ray)
        cluster.owns = not ray.is_initialized()  # a caller's own connection is left as it was found
        try:
            # Quiet: the command's own lines are what the terminal shows (Ray's INFO lines say it connected).
            ray.init(address=target, ignore_reinit_error=True, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise HubError(f"--executor ray: no Ray cluster answers at {target} ({exc})") from None
        _notices_to_stderr()
        return cluster

    def slots(self, cpus: int) -> int:
        """How many tasks of `cpus` CPUs the cluster runs at once."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 0)) // cpus)

    def largest_node(self, resource: str = "memory") -> float:
        """The most of `resource` one live node has (0 when unknown)."""
        alive = (node["Resources"].get(resource, 0) for node in self.ray.nodes() if node.get("Alive"))
        return max(alive, default=0)

    def run(
        self,
        fn: Callable[[Any, str], Any],
        payloads: Sequence[Any],
        *,
        cpus: int,
        memory: Sequence[int],
        nbytes: Sequence[int],
        on_node: NodeProgress | None = None,
    ) -> Generator[TaskOutcome, None, None]:
        """Each payload's task (`fn(payload, node)` on some node, declaring `cpus` and `memory[i]`), their
        outcomes in payload order; `nbytes[i]`: the bytes task i reads, counted for its node once it is
        handed back. An error is raised here (one line naming the node); the tasks still running are then
        given DRAIN_SECONDS to end."""
        ray = self.ray
        remote = ray.remote(run_task)
        largest = int(self.largest_node())

        def submit(index: int) -> Any:
            need = min(memory[index], largest) if largest else memory[index]  # more than a node has: never runs
            return remote.options(
                num_cpus=cpus,
                memory=need,
                max_retries=MAX_RETRIES,
                retry_exceptions=False,  # weightdiag's own errors say what is wrong: running again cannot help
                scheduling_strategy="SPREAD",  # across nodes: their links and disks add up
            ).remote(Job(index, fn, payloads[index]))

        window = max(2, TASKS_PER_SLOT * self.slots(cpus))  # tasks submitted and not yet handed back
        in_flight: dict[Any, int] = {}
        done: dict[int, TaskOutcome] = {}
        submitted = handed = 0
        finished = False
        try:
            while handed < len(payloads):
                while submitted < len(payloads) and submitted - handed < window:
                    in_flight[submit(submitted)] = submitted
                    submitted += 1
                while handed not in done:
                    ready, _ = ray.wait(list(in_flight), num_returns=1)
                    outcome = self._outcome(ready[0])
                    del in_flight[ready[0]]
                    done[outcome.index] = outcome
                outcome = done.pop(handed)
                yield outcome
                entry = self.nodes.setdefault(outcome.node, {"tasks": 0, "bytes": 0, "seconds": 0.0})
                entry["tasks"] += 1
                entry["bytes"] += nbytes[handed]
                entry["seconds"] += outcome.seconds
                if on_node:
                    on_node(outcome.node, nbytes[handed])
                handed += 1
            finished = True
        finally:
            # Nothing is cancelled one by one: cancelling with force=True races the tasks' completion in Ray 2.60
            # and can abort the driver; close() disconnects, which ends this job's tasks. But the tasks already
            # running may end first: a task failing while the driver shuts down makes Ray's core print "Failed
            # to push error to driver" on the user's terminal.
            if not finished and in_flight:
                ray.wait(list(in_flight), num_returns=len(in_flight), timeout=DRAIN_SECONDS)

    def _outcome(self, ref: Any) -> TaskOutcome:
        """A finished task's outcome; its error raised here, one line naming the node."""
        ray = self.ray
        try:
            outcome: TaskOutcome = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # a bug in a task: its own exception, as a local run raises it
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, BaseException) else exc) from None
        except ray.exceptions.RayError as exc:  # lost more times than retried (node gone, worker killed)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise HubError(
                f"--executor ray: a task was lost {MAX_RETRIES + 1} times ({type(exc).__name__}: {first}); "
                "check the cluster's nodes (ray status) and run the command again: it resumes"
            ) from None
        if outcome.error is not None:
            raise outcome.error
        return outcome

    def summary(self) -> dict[str, Any]:
        """How the work was spread over the nodes: a row's run.cluster (record/schema.py ClusterInfo)."""
        nodes = [
            {"node": name, "tasks": int(n["tasks"]), "bytes": int(n["bytes"]), "seconds": round(n["seconds"], 3)}
            for name, n in sorted(self.nodes.items())
        ]
        return {"executor": "ray", "tasks": sum(n["tasks"] for n in nodes), "nodes": nodes}

    def close(self) -> None:
        if self.owns:  # disconnecting ends this job's tasks still running (after an error)
            self.owns = False
            self.ray.shutdown()


Finished = tuple[int, list[Reduction] | np.ndarray | VectorSummary]


class RayReader(Reader):
    """The driver's side of a fit on a Ray cluster: the Reader the plan is made with (the driver's own reader
    for regions and companions, never chunks), and the executor that runs the plan's chunks as tasks on the
    nodes. Its verification is what the tasks report: shards hashed where they were read. A later pass over
    the same model (the spectrum's, run/spectrum_cluster.py) runs on the same `cluster`."""

    fetches = False

    def __init__(self, plan: ModelPlan, inner: Reader, ray: Any) -> None:
        self._plan = plan
        self._inner = inner
        self.cluster = Cluster(ray)
        self.source = describe(plan, inner)  # what a node opens again
        self._connections = 8
        self._verified: set[int] = set()
        self._hashing = False
        from ..source.hub_stream import HubReader

        # The chunks are planned for the readers the nodes open (a Hub model read from this machine's cache is
        # streamed there).
        self.chunk_bytes = HubReader.chunk_bytes if self.source.kind == "hub" else inner.chunk_bytes

    @property
    def inner(self) -> Reader:
        """The driver's own reader (what a local fit of the same model reads through)."""
        return self._inner

    @property
    def nodes(self) -> dict[str, dict[str, float]]:
        return self.cluster.nodes

    @classmethod
    def connect(cls, plan: ModelPlan, inner: Reader, address: str | None) -> RayReader:
        """Join the Ray cluster at `address` (default RAY_ADDRESS) for this fit."""
        ray = _import_ray()
        reader = cls(plan, inner, ray)  # refuses what the nodes cannot read (GGUF, .bin) before connecting
        reader.cluster = Cluster.join(address, ray)
        return reader

    def summary(self) -> dict[str, Any]:
        """How the fit was spread over the nodes: the row's run.cluster (record/schema.py ClusterInfo)."""
        return self.cluster.summary()

    # -- the Reader protocol: the plan's questions go to the driver's reader ------------------------------

    def chunk(self, chunk: Chunk):
        return self._inner.chunk(chunk)

    def read_into(self, ref: TensorRef, out: np.ndarray) -> None:
        self._inner.read_into(ref, out)

    def regions(self) -> dict[int, tuple[int, int]] | None:
        return self._inner.regions()

    def set_connections(self, connections: int) -> None:
        self._connections = connections  # each task's, on its node
        self._inner.set_connections(connections)

    @property
    def connections(self) -> int:
        return self._connections

    def skip_shards(self, shards: set[int]) -> None:
        self._inner.skip_shards(shards)

    def verified_shards(self) -> set[int]:
        return set(self._verified)

    def finish(self) -> Verification | None:
        """The row's verification: every shard planned whole was hashed and matched on the node that read it."""
        if not self._hashing:
            return self._inner.finish()  # what the local fit says when nothing is hashed
        from ..source.hub_stream import HubReader

        wanted = set(self.regions() or {})
        missing = sorted(wanted - self._verified)
        if missing or not isinstance(self._inner, HubReader):
            name = self._plan.shards[missing[0]].name if missing else "?"
            raise VerificationError(
                f"{name}: no task reported its sha256 verified; nothing was written, run the command again",
                repo=self._plan.model_id,
                file=name,
                expected=self._plan.shards[missing[0]].sha256 if missing else None,
                got="",
            )
        return self._inner.all_verified()

    def cancel(self) -> None:
        # Nothing to do here: close() disconnects from the cluster, which ends the tasks of this job (see
        # Cluster.run: cancelling them one by one with force=True can abort the driver in Ray 2.60).
        return None

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self.cluster.close()

    # -- the executor -------------------------------------------------------------------------------------

    def reduce_chunked(
        self,
        targets: Sequence[Target],
        execution: Execution,
        *,
        verify: bool = False,
        on_bytes: Callable[[int], None] | None = None,
        on_node: NodeProgress | None = None,
    ) -> Iterator[Finished]:
        """What stream.reduce_chunked yields (the same plan, the same fold), the chunks reduced on the nodes.
        `on_node(node, bytes)`: a task's bytes folded, and the node that read them."""
        plan = plan_reads(targets, self, verify)
        self._hashing = plan.verify
        chunks = plan.chunks
        # Positions of the largest |w| come back logical from the nodes (_logical_positions): no decoder here.
        fold = Fold([replace(target, decoder=None) for target in targets], chunks)
        if not chunks:
            return
        cpus = settings.ray_task_cpus()
        budget = task_bytes(sum(c.nbytes for c in chunks), self.cluster.slots(cpus), settings.ray_task_bytes())
        runs = plan_tasks(chunks, budget, whole_shards=plan.verify)
        delay = settings.test_ray_task_delay()
        hub = self.source.kind == "hub"
        tasks = []
        for index, run in enumerate(runs):
            task_chunks = tuple(chunks[i] for i in run)
            items = dict.fromkeys(piece.item for chunk in task_chunks for piece in chunk.pieces)
            tasks.append(
                Task(
                    index,
                    task_chunks,
                    {item: replace(targets[item], decoder=None) for item in items},
                    self.source,
                    frozenset(chunk.shard for chunk in task_chunks) if plan.verify else frozenset(),
                    cpus,
                    self._connections,
                    delay,
                )
            )
        memory = [_task_memory(task, hub, min(cpus, settings.MAX_CHUNK_WORKERS)) for task in tasks]
        # tensor bytes only, so that the total matches the plan's
        read = [sum(piece.hi - piece.lo for i in run for piece in chunks[i].pieces) for run in runs]
        outcomes = self.cluster.run(_reduce_task, tasks, cpus=cpus, memory=memory, nbytes=read, on_node=on_node)
        with closing(outcomes):  # an error here lets the running tasks end now, before close() disconnects
            yield from self._fold(outcomes, runs, chunks, fold, plan.verify, on_bytes)

    def _fold(
        self,
        outcomes: Iterator[TaskOutcome],
        runs: Sequence[range],
        chunks: Sequence[Chunk],
        fold: Fold,
        verify: bool,
        on_bytes: Callable[[int], None] | None,
    ) -> Iterator[Finished]:
        for index, outcome in enumerate(outcomes):
            results, verified = outcome.results
            self._verified |= verified
            if verify and verified != frozenset(chunks[i].shard for i in runs[index]):
                raise VerificationError(
                    f"{outcome.node}: a task did not verify the shards it read; nothing was written, run the "
                    "command again",
                    repo=self._plan.model_id,
                    file=self._plan.shards[chunks[runs[index][0]].shard].name,
                    expected=None,
                    got="",
                )
            for i, chunk_results in zip(runs[index], results, strict=True):
                if on_bytes:
                    on_bytes(sum(piece.hi - piece.lo for piece in chunks[i].pieces))
                yield from fold.add(chunk_results)

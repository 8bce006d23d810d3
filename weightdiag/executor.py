"""How work runs: one ordered window, two executors, and the one way a pass is run on either.

Every pass weightdiag makes over a model (the fit's chunk reduction, the spectrum, a diff's paired reads, the
histograms of `report --plot`) is declared once (`Pass`): its parts, `run` over a run of consecutive parts
(module-level code: the same on a cluster node as on this machine) and a merge by its caller of the results
in part order. An `Executor` runs it:

- `LocalExecutor`: one run of every part, on this process with the readers the command opened; inside a run,
  the pass's parts go through this machine's threads with `LocalExecutor.map`;
- `RayExecutor`: the parts cut into runs of about equal weight (bytes, flops), each run a task on some node
  of a Ray cluster, which opens the model again there (`Pass.reopen`) and runs the same `run` with its own
  threads; results come back in part order whatever order the tasks end in.

Both hand results back in part order through the one ordered, bounded window (`ordered`), so a merge folds
the same values in the same order on any executor: rows are byte-identical whichever runs them. The
executor is chosen once, where the command builds its `Execution` (execution.py), and carried on it;
nothing below asks which one runs. Verification of hashed shards is part of every run (the shards each run
read whole and matched) and checked once, here (`check_verified`).

Why a window of our own rather than `Executor.map` of concurrent.futures: that one submits every item at
once (memory: every chunk's buffer), and Ray has no ordered map with a bound at all.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from . import settings
from .build import build_identity, kernels_in_use
from .errors import HubError, MissingDependencyError, OptionError, VerificationError, WeightdiagError, param

T = TypeVar("T")
R = TypeVar("R")
H = TypeVar("H")


def ordered(
    items: Iterable[T],
    submit: Callable[[T], H],
    result: Callable[[H], R],
    *,
    window: int,
    cost: Callable[[T], int] | None = None,
    max_cost: int = 0,
    on_abandon: Callable[[list[H]], None] | None = None,
) -> Iterator[tuple[T, R]]:
    """(item, its result) for every item, in item order: up to `window` items submitted ahead of the one
    handed back. `items` is read lazily in the caller's thread as items are submitted (a generator may set
    up each item there). With `cost`, read-ahead stops at two items once the queued items' cost reaches
    `max_cost` (results waiting for a slow consumer hold memory). If the caller stops early or a result
    raises, `on_abandon(handles still pending)` runs before this returns."""
    pending: deque[tuple[T, H]] = deque()
    source = iter(items)
    waiting: list[T] = []  # the next item, held back while the queue is full
    queued_cost = 0
    finished = False

    def top_up() -> None:
        nonlocal queued_cost
        while len(pending) < window:
            if waiting:
                item = waiting.pop()
            else:
                try:
                    item = next(source)
                except StopIteration:
                    return
            if cost is not None and len(pending) >= 2 and queued_cost >= max_cost:
                waiting.append(item)
                return
            pending.append((item, submit(item)))
            if cost is not None:
                queued_cost += cost(item)

    try:
        top_up()
        while pending:
            item, handle = pending.popleft()
            if cost is not None:
                queued_cost -= cost(item)
            value = result(handle)
            top_up()
            yield item, value
        finished = True
    finally:
        if not finished and on_abandon is not None:
            on_abandon([handle for _, handle in pending])


def _future_result(future: Future[R]) -> R:
    return future.result()


@dataclass(frozen=True)
class LocalExecutor:
    """This process: a pass runs here as one run of all its parts, with the readers the command opened."""

    name: str = "local"
    local: bool = True  # the passes read on this machine

    def map(
        self,
        fn: Callable[..., R],
        items: Iterable[T],
        *,
        workers: int,
        window: int | None = None,
        fetch: Callable[[T], Any] | None = None,
        fetch_workers: int = 0,
        cost: Callable[[T], int] | None = None,
        max_cost: int = 0,
        on_abandon: Callable[[], None] | None = None,
        label: str = "weightdiag",
    ) -> Iterator[tuple[T, R]]:
        """(item, fn(item)) in item order, fn run on `workers` threads, `window` items ahead (default twice
        the workers). With `fetch`: fetch(item) runs first on `fetch_workers` threads of its own (network
        reads), then fn(item, fetched) on the workers, so that reads go on while the cores compute.
        `on_abandon()` runs when the caller stops early or fn raises (a reader's cancel)."""
        pools = [ThreadPoolExecutor(max(1, workers), thread_name_prefix=f"{label}-work")]
        work = pools[0]
        if fetch is None:

            def submit(item: T) -> Future[R]:
                return work.submit(fn, item)

        else:
            io = ThreadPoolExecutor(max(1, fetch_workers), thread_name_prefix=f"{label}-fetch")
            pools.append(io)

            def after_fetch(item: T, fetched: Future[Any]) -> R:
                return fn(item, fetched.result())

            def submit(item: T) -> Future[R]:
                return work.submit(after_fetch, item, io.submit(fetch, item))

        def abandon(_pending: list[Future[R]]) -> None:
            if on_abandon is not None:
                on_abandon()

        try:
            yield from ordered(
                items,
                submit,
                _future_result,
                window=window or 2 * max(1, workers),
                cost=cost,
                max_cost=max_cost,
                on_abandon=abandon,
            )
        finally:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)

    def run_pass(self, job: Pass[R], execution: Any, on_node: NodeProgress | None = None) -> PassRun[R]:
        """The pass as one run of all its parts, here, with the readers the command opened."""
        run = PassRun[R](sides=len(job.readers), live=list(job.readers))
        run.results = run.collect(job.run(range(len(job.weights())), job.readers, execution))
        return run

    def map_unordered(self, fn: Callable[[Any], Any], payloads: Sequence[Any]) -> Iterator[Any]:
        """fn(payload) for each, one after the other, here."""
        for payload in payloads:
            yield fn(payload)

    def summary(self) -> dict[str, Any] | None:
        return None  # nothing to say in the row's run metadata

    def close(self) -> None:
        return None


LOCAL = LocalExecutor()


# -- passes ------------------------------------------------------------------------------------------------

Verified = tuple[frozenset[int] | None, ...]  # per side: the shards a run read whole and matched (None: none hashed)


class Pass(Protocol[R]):
    """A pass over one or two opened models (sides), declared once. Plain data but for `readers` (the
    command's own, never shipped): a task on a cluster node gets a copy (`shipped()`) and opens the models
    again (`reopen`)."""

    @property
    def readers(self) -> Sequence[Any]:
        """The readers the command opened, one per side (this machine's; empty in a shipped copy)."""
        ...

    def weights(self) -> Sequence[float]:
        """One per part, in part order: its bytes or flops, what runs of parts are balanced by."""
        ...

    def cuts(self) -> Sequence[bool]:
        """One per part: whether a run may start at it (a shard hashed whole is one run's)."""
        ...

    def run(self, parts: range, readers: Sequence[Any], execution: Any) -> Generator[R, None, Verified]:
        """The results of consecutive parts, in order, then (as the generator's return value) the
        `Verified` shards per side; the same code locally and on a node."""
        ...

    def shipped(self) -> Pass[R]:
        """A copy a task on another machine can run: the sources described, no readers (refuses what other
        machines cannot read)."""
        ...

    def reopen(self, parts: range, node: str) -> AbstractContextManager[Sequence[Any]]:
        """In a shipped copy, on a node: readers over the sources, one per side, closed after the run."""
        ...

    def task_memory(self, parts: range) -> int:
        """Bytes a task of these parts may hold at once (what it declares to Ray)."""
        ...

    @property
    def by_bytes(self) -> bool:
        """Whether the weights are bytes (a task reads at most WEIGHTDIAG_RAY_TASK_BYTES); else work (flops:
        each task a fair share)."""
        ...


@dataclass
class PassRun(Generic[R]):
    """A pass being run: its results in part order (consume them), then per side the shards verified."""

    sides: int
    results: Generator[R, None, None] = field(default_factory=lambda: _nothing())
    verified: list[set[int] | None] = field(default_factory=list)
    live: list[Any] = field(default_factory=list)  # a run here: the readers hashing as it goes

    def __post_init__(self) -> None:
        self.verified = [None] * self.sides

    def verified_now(self, side: int) -> set[int]:
        """The shards of `side` hashed and matched so far (a journal keeps those): by the runs that ended, and
        by a run here while it goes on."""
        found = set(self.verified[side] or ())
        if self.live:
            found |= self.live[side].verified_shards()
        return found

    def collect(self, run: Generator[R, None, Verified]) -> Generator[R, None, None]:
        """A run's results, its verified shards added to the pass's once it ends."""
        verified: Verified = yield from run
        self.add(verified)

    def add(self, verified: Verified) -> None:
        for side, shards in enumerate(verified):
            if shards is not None:
                self.verified[side] = (self.verified[side] or set()) | shards


def _nothing() -> Generator[Any, None, None]:
    yield from ()


def check_verified(
    expected: Sequence[set[int] | None], verified: Sequence[set[int] | None], names: Sequence[Any]
) -> None:
    """Every shard a side planned to hash was reported hashed and matched by some run: the one check of a
    pass's verification, whatever ran it. `names[side]`: (repo, [shard names], [published sha256])."""
    for side, wanted in enumerate(expected):
        missing = sorted((wanted or set()) - (verified[side] or set()))
        if missing:
            repo, shard_names, digests = names[side]
            raise VerificationError(
                f"{shard_names[missing[0]]}: no task reported its sha256 verified; nothing was written, run the "
                "command again",
                repo=repo,
                file=shard_names[missing[0]],
                expected=digests[missing[0]],
                got="",
            )


# -- Ray ---------------------------------------------------------------------------------------------------

# Runs are made smaller than the budget to give every CPU of the cluster about two of them, never smaller than
# this: a task costs a few tens of milliseconds besides its reading (scheduling, reopening its shards' headers;
# Ray reuses its workers, so the imports are paid once per worker), a few per cent of 64 MiB at 50 MB/s.
MIN_TASK_BYTES = 64 << 20
TASKS_PER_SLOT = 2
MAX_RETRIES = 3  # a task whose worker or node is lost is run again (Ray's retries), then the command fails
DRAIN_SECONDS = 10.0  # after an error, how long the tasks already running may take to end before disconnecting
# What a task holds besides its buffers: the interpreter, numpy, weightdiag, Ray's worker.
TASK_BASE_MEMORY = 384 << 20
PROBE_SECONDS = 10.0
NODE_CHECK_SECONDS = 120.0  # each node starts a worker for the check: seconds on a loaded node

NodeProgress = Callable[[str, int], None]  # on_node(node, bytes): a task's bytes handed back, and the node


def task_bytes(total: float, slots: int, budget: int) -> float:
    """The bytes per task: the budget, or less so that each of `slots` CPUs gets about two tasks (never below
    MIN_TASK_BYTES, unless the budget is)."""
    share = math.ceil(total / max(1, TASKS_PER_SLOT * slots))
    return min(budget, max(MIN_TASK_BYTES, share))


def balanced_runs(weights: Sequence[float], share: float, cuts: Sequence[bool] | None = None) -> list[range]:
    """Consecutive runs of items (indexes), each of about `share` of weight: an item is never cut, a run holds
    at least one, and runs start only where allowed (`cuts[i]`: before item i; default everywhere). Items
    between two allowed starts go together: a run closes before such a group when the group would take it
    over `share` (a shard hashed whole is not begun in a run it would overfill)."""
    starts = [i for i in range(len(weights)) if cuts is None or cuts[i] or i == 0]
    runs: list[range] = []
    start, held = 0, 0.0
    for k, i in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(weights)
        group = sum(weights[i:end])
        if i > start and held + group > share:
            runs.append(range(start, i))
            start, held = i, 0.0
        held += group
    if start < len(weights):
        runs.append(range(start, len(weights)))
    return runs


@dataclass(frozen=True)
class Job:
    """One task: `fn(payload, node)` on some node; plain data (pickled, `fn` by reference: a module-level
    function of weightdiag, imported by the worker)."""

    index: int
    fn: Callable[[Any, str], Any]
    payload: Any


@dataclass
class TaskOutcome:
    """What a task hands back: what its function returned, or the error (one line naming the node)."""

    index: int
    node: str
    results: Any = None
    error: WeightdiagError | None = None
    seconds: float = 0.0


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
        if not str(exc).startswith(node):  # args[0]: the message with its parameters still marked (errors.param)
            exc.args = (f"{node}: {exc.args[0]}",)
        return TaskOutcome(job.index, node, error=exc)
    return TaskOutcome(job.index, node, results, seconds=time.perf_counter() - started)


@dataclass(frozen=True)
class PassTask:
    """A run of a pass's parts, shipped to a node: the pass (no readers), the parts and the node's
    execution (threads: the driver's, so that BLAS and kernels split their sums as they do locally)."""

    job: Any  # a shipped Pass
    parts: range
    execution: Any
    delay: float = 0.0  # tests only: seconds the task holds its worker after its run


def run_on_node(task: PassTask, node: str) -> tuple[list[Any], Verified]:
    """Runs on a node: the sources opened again there, the run's results and the shards it verified."""
    with task.job.reopen(task.parts, node) as readers:
        run = task.job.run(task.parts, readers, task.execution)
        results: list[Any] = []
        while True:
            try:
                results.append(next(run))
            except StopIteration as stop:
                verified: Verified = stop.value
                break
    if task.delay:
        time.sleep(task.delay)
    return results, verified


def node_build() -> tuple[str, str, str]:
    """Runs on a node: (the node, its weightdiag build, its kernels)."""
    return node_name(), build_identity(), kernels_in_use()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            f"{param('executor')} ray needs Ray: pip install ray (or, in the weightdiag repository, pip install "
            "'.[ray]')",
            package="ray",
        ) from None
    return ray


class RayExecutor:
    """The nodes of a Ray cluster: a pass's parts cut into runs, each run a task (see the module docstring).
    Joins the cluster on first use (so that what the nodes cannot read is refused before connecting), and
    counts per node the tasks, bytes and seconds (the row's run.cluster)."""

    name = "ray"
    local = False  # the passes read on the cluster's nodes

    def __init__(self, address: str | None = None, ray: Any = None) -> None:
        self.address = address
        self._ray = ray
        self.owns = False  # whether close() disconnects (join() connected)
        self.nodes: dict[str, dict[str, float]] = {}  # per node: tasks, bytes, seconds
        self._checked = False  # whether every node was found to run this machine's build and kernels

    @property
    def ray(self) -> Any:
        if self._ray is None:
            self.join()
        return self._ray

    def join(self) -> None:
        """Join the Ray cluster at `address` (default RAY_ADDRESS)."""
        ray = import_ray()
        target = self.address or settings.ray_address()
        if not target:
            raise OptionError(
                f"{param('executor')} ray: give {param('ray_address')} HOST:PORT or set RAY_ADDRESS (an existing "
                "cluster)",
                param="ray_address",
            )
        _check_reachable(target)
        self.owns = not ray.is_initialized()  # a caller's own connection is left as it was found
        try:
            # Quiet: the command's own lines are what the terminal shows (Ray's INFO lines say it connected).
            ray.init(address=target, ignore_reinit_error=True, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise HubError(f"{param('executor')} ray: no Ray cluster answers at {target} ({exc})") from None
        _notices_to_stderr()
        self._ray = ray

    def check_nodes(self) -> None:
        """Every live node runs this machine's weightdiag build and kernels, checked once before any task: a node
        with another build (other code may make other rows) or the numpy kernels (F32 sums differ in their last
        digits) would otherwise go unnoticed in a row that mixes both."""
        if self._checked:
            return
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = ray.remote(node_build)
        alive = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]
        refs = [
            probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in alive
        ]
        try:
            found = ray.get(refs, timeout=NODE_CHECK_SECONDS)
        except ray.exceptions.GetTimeoutError:
            raise HubError(
                f"{param('executor')} ray: not every node of the cluster answered within {NODE_CHECK_SECONDS:.0f} s "
                "(ray status shows them); run the command again once they do"
            ) from None
        mine = (build_identity(), kernels_in_use())
        for node, build, kernels in found:
            if (build, kernels) != mine:
                raise OptionError(
                    f"{param('executor')} ray: {node} runs weightdiag {build} with the {kernels} kernels, this machine "
                    f"{mine[0]} with the {mine[1]} kernels; install this checkout on every node (pip install -e . "
                    "there, with a C compiler): the same build and kernels make the same rows",
                    param="executor",
                )
        self._checked = True

    def slots(self, cpus: int) -> int:
        """How many tasks of `cpus` CPUs the cluster runs at once."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 0)) // cpus)

    def largest_node(self, resource: str = "memory") -> float:
        """The most of `resource` one live node has (0 when unknown)."""
        alive = (node["Resources"].get(resource, 0) for node in self.ray.nodes() if node.get("Alive"))
        return max(alive, default=0)

    def map(
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

        def drain(running: list[Any]) -> None:
            # Nothing is cancelled one by one: cancelling with force=True races the tasks' completion in Ray 2.60
            # and can abort the driver; close() disconnects, which ends this job's tasks. But the tasks already
            # running may end first: a task failing while the driver shuts down makes Ray's core print "Failed
            # to push error to driver" on the user's terminal.
            if running and ray.is_initialized():  # (not after close(): ray.wait would start a local Ray)
                ray.wait(running, num_returns=len(running), timeout=DRAIN_SECONDS)

        window = max(2, TASKS_PER_SLOT * self.slots(cpus))
        for index, outcome in ordered(range(len(payloads)), submit, self._outcome, window=window, on_abandon=drain):
            entry = self.nodes.setdefault(outcome.node, {"tasks": 0, "bytes": 0, "seconds": 0.0})
            entry["tasks"] += 1
            entry["bytes"] += nbytes[index]
            entry["seconds"] += outcome.seconds
            if on_node:
                on_node(outcome.node, nbytes[index])
            yield outcome

    def map_unordered(self, fn: Callable[[Any], Any], payloads: Sequence[Any]) -> Iterator[Any]:
        """fn(payload) as a task each (Ray's default resources), results as the tasks end: whole jobs whose
        order does not matter (a sweep's revisions; each writes its own row)."""
        self.check_nodes()
        ray = self.ray
        remote = ray.remote(fn)
        pending = [remote.remote(payload) for payload in payloads]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])

    def run_pass(self, job: Pass[R], execution: Any, on_node: NodeProgress | None = None) -> PassRun[R]:
        """The pass's parts in runs of about equal weight, each a task on some node (see the module docstring)."""
        shipped = job.shipped()  # refuses what the nodes cannot read, before connecting
        self.check_nodes()
        run = PassRun[R](sides=len(job.readers))
        run.results = self._results(shipped, execution, run, on_node)
        return run

    def _results(
        self, job: Pass[R], execution: Any, run: PassRun[R], on_node: NodeProgress | None
    ) -> Generator[R, None, None]:
        weights = job.weights()
        if not weights:
            return
        cpus = settings.ray_task_cpus()
        slots = self.slots(cpus)
        total = sum(weights)
        if job.by_bytes:
            share = task_bytes(total, slots, settings.ray_task_bytes())
        else:  # work (flops): a fair share each
            share = total / (TASKS_PER_SLOT * slots)
        runs = balanced_runs(weights, share, job.cuts())
        delay = settings.test_ray_task_delay()
        on_nodes = execution.for_node(cpus)  # the driver's threads (the same sums), the task's CPUs for its reads
        tasks = [PassTask(job, parts, on_nodes, delay) for parts in runs]
        memory = [job.task_memory(parts) for parts in runs]
        nbytes = [int(sum(weights[i] for i in parts)) for parts in runs]
        outcomes = self.map(run_on_node, tasks, cpus=cpus, memory=memory, nbytes=nbytes, on_node=on_node)
        try:
            for outcome in outcomes:
                results, verified = outcome.results
                run.add(verified)
                yield from results
        finally:
            outcomes.close()  # an error here lets the running tasks end now, before close() disconnects

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
                f"{param('executor')} ray: a task was lost {MAX_RETRIES + 1} times ({type(exc).__name__}: {first}); "
                "check the cluster's nodes (ray status) and run the command again: it resumes"
            ) from None
        if outcome.error is not None:
            raise outcome.error
        return outcome

    def summary(self) -> dict[str, Any] | None:
        """How the work was spread over the nodes: a row's run.cluster (record/schema.py ClusterInfo)."""
        nodes = [
            {"node": name, "tasks": int(n["tasks"]), "bytes": int(n["bytes"]), "seconds": round(n["seconds"], 3)}
            for name, n in sorted(self.nodes.items())
        ]
        return {"executor": "ray", "tasks": sum(n["tasks"] for n in nodes), "nodes": nodes}

    def close(self) -> None:
        if self.owns:  # disconnecting ends this job's tasks still running (after an error)
            self.owns = False
            self._ray.shutdown()


class Executor(Protocol):
    """What runs passes (see the module docstring): this process, or a Ray cluster."""

    @property
    def name(self) -> str: ...

    @property
    def local(self) -> bool:
        """Whether the passes read on this machine."""
        ...

    def run_pass(self, job: Pass[R], execution: Any, on_node: NodeProgress | None = None) -> PassRun[R]: ...

    def map_unordered(self, fn: Callable[[Any], Any], payloads: Sequence[Any]) -> Iterator[Any]:
        """fn(payload) for each, results as they end: whole jobs whose order does not matter."""
        ...

    def summary(self) -> dict[str, Any] | None:
        """The row's run.cluster (None: ran here)."""
        ...

    def close(self) -> None: ...


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
            f"{param('executor')} ray: no Ray cluster answers at {address} ({exc.strerror or exc}); start one (ray "
            f"start --head) or give its head's address with {param('ray_address')} or RAY_ADDRESS"
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

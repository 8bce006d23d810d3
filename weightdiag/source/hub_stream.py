"""Streaming a Hub model's shards: N ranged GETs in flight, every byte hashed and checked against the Hub.

The chunk engine (stream.py) asks for chunks from several threads at once; each is one ranged GET into
a buffer from a fixed pool, so memory is the pool, not the tensors. When the whole of every shard is
read (no --include/--exclude), the chunks tile the files and each shard's sha256 is computed over the
bytes as they pass (its header from planning, then its chunks in file order: a chunk that lands early
waits for the ones before it, holding its buffer) and compared with the LFS sha256 the Hub publishes.
The hashing has a thread of its own, fed each chunk as soon as it has landed: it runs beside the transfer
and the reductions (hashlib releases the GIL), so a chunk's reduction never waits for hashes, and the
hashes never wait for reductions. A buffer goes back to the pool once it is both reduced and hashed.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .. import tuning
from ..errors import VerificationError
from .chunks import Chunk
from .plan import ModelPlan, TensorRef
from .ranged import Cancelled, Concurrency, RangedFile, RetryPolicy
from .reader import Reader, Verification

EXTRA_BUFFERS = 4  # chunks that may wait for their turn to be hashed while the connections go on


@dataclass(frozen=True)
class StreamedShard:
    remote: RangedFile
    name: str
    head: bytes  # the 8-byte length prefix and JSON header, read while planning
    first: bytes  # the file's first bytes as read while planning (the head and often some data)
    sha256: str | None  # what the Hub publishes (LFS oid), None when nothing is published


class HubReader(Reader):
    """Chunks of Hub shards through ranged reads (see the module docstring)."""

    fetches = True

    def __init__(self, shards: list[StreamedShard], policy: RetryPolicy, connections: int = 8) -> None:
        self._shards = shards
        self._policy = policy
        self.chunk_bytes = tuning.current().hub_chunk_bytes
        self.set_connections(connections)
        self._free: list[np.ndarray] = []
        self._allocated = 0
        self._pool_cond = threading.Condition()
        self._hash: _OrderedHasher | None = None
        self._tail_from = 0
        self._turn = 0  # the chunk whose turn it is to get a buffer
        self._tail_pool: ThreadPoolExecutor | None = None
        self._skipped: set[int] = set()  # shards a resumed fit does not read (verified by the interrupted one)
        self._holds: dict[int, int] = {}  # chunk -> uses of its buffer still to end (its reduction, its hash)

    def planning_bytes(self) -> int | None:
        """Each shard's first read (source.hub._read_head: the header, in a guessed first range of head_guess
        bytes, a second when the header is longer)."""
        return sum(len(s.first) for s in self._shards)

    def skip_shards(self, shards: set[int]) -> None:
        """Leave these shards out of the stream and of the verification too (before start()): a resumed fit
        reuses their records, measured and verified by the fit it resumes (weightdiag.record.journal); on a
        cluster node, other tasks hash them."""
        self._skipped |= set(shards)

    def verified_shards(self) -> set[int]:
        """Shards read whole whose sha256 matched so far (a resumed fit's journal keeps those)."""
        return self._hash.verified() if self._hash is not None else set()

    def read_into(self, ref: TensorRef, out: np.ndarray) -> None:
        """Fill `out` (uint8, ref.nbytes) with one tensor's stored bytes: a ranged read outside the chunk
        stream (a quantized weight's companions; the histograms of `report --plot`)."""
        shard = self._shards[ref.shard]
        known = max(0, min(len(shard.first), ref.end) - ref.start)
        if known:
            out[:known] = np.frombuffer(shard.first, dtype=np.uint8, count=known, offset=ref.start)
        if known < out.size:
            shard.remote.read(ref.start + known, out[known:], self._policy, self._concurrency)

    def set_connections(self, connections: int) -> None:
        """Requests in flight, and the buffer pool that goes with them (before start())."""
        self._connections = connections
        self._concurrency = Concurrency(connections)
        self._pool_size = connections + EXTRA_BUFFERS

    # -- the Reader protocol -----------------------------------------------------------------------

    @property
    def workers(self) -> int:
        return self._connections

    def regions(self) -> dict[int, tuple[int, int]] | None:
        if not all(s.sha256 for s in self._shards):
            return None  # nothing to verify against: read only what is needed
        return {i: (len(s.head), s.remote.size) for i, s in enumerate(self._shards) if i not in self._skipped}

    def start(self, chunks: list[Chunk], verify: bool) -> None:
        if self._hash is not None:
            self._hash.stop()
        self._hash = _OrderedHasher(self._shards, chunks, self._settle) if verify else None
        self._holds = {}
        self._tail_from = len(chunks) - self.workers
        self._turn = 0

    def _fetch(self, remote: RangedFile, start: int, out: np.ndarray, tail: bool) -> None:
        """One ranged GET; in the last round of chunks, several, so that no connection idles at the end."""
        parts = min(self.workers, out.size // tuning.current().tail_part_bytes) if tail else 1
        if parts <= 1:
            remote.read(start, out, self._policy, self._concurrency)
            return
        if self._tail_pool is None:
            with self._pool_cond:
                if self._tail_pool is None:
                    self._tail_pool = ThreadPoolExecutor(self.workers, thread_name_prefix="weightdiag-tail")
        bounds = np.linspace(0, out.size, parts + 1).astype(int)
        futures = [
            self._tail_pool.submit(remote.read, start + a, out[a:b], self._policy, self._concurrency)
            for a, b in itertools.pairwise(bounds)
        ]
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:
                future.cancel()

    @property
    def buffers(self) -> int:
        """Chunk buffers: at most this many chunks are read, reduced or waiting to be hashed at once."""
        return self._pool_size

    def fetch(self, chunk: Chunk) -> np.ndarray:
        """Read a chunk into a pooled buffer; hand it back with done() once reduced."""
        buf = self._acquire(chunk.index)
        try:
            out = buf[: chunk.nbytes]
            shard = self._shards[chunk.shard]
            # Bytes already read with the header are not asked for twice (small shards: all of them).
            known = max(0, min(len(shard.first), chunk.end) - chunk.start)
            if known:
                out[:known] = np.frombuffer(shard.first, dtype=np.uint8, count=known, offset=chunk.start)
            if known < chunk.nbytes:
                self._fetch(shard.remote, chunk.start + known, out[known:], tail=chunk.index >= self._tail_from)
        except BaseException:
            self._release(buf)
            raise
        if self._hash is not None:  # hashed now, beside the reduction: the buffer is freed after both
            with self._pool_cond:
                self._holds[chunk.index] = 2
            self._hash.put(chunk, buf)
        return buf

    def done(self, chunk: Chunk, buf: np.ndarray, ok: bool) -> None:
        if chunk.index in self._holds:
            if ok and self._hash is not None:
                # A shard's last chunk: its results reach the caller once the shard's hash is final, so that
                # verified_shards() then says so (a resumed fit's journal), as when chunks were hashed here.
                self._hash.wait_if_last(chunk.index)
            self._settle(chunk.index, buf)
        else:
            self._release(buf)

    @contextmanager
    def chunk(self, chunk: Chunk) -> Iterator[np.ndarray]:
        buf = self.fetch(chunk)
        ok = False
        try:
            yield buf[: chunk.nbytes]
            ok = True
        finally:
            self.done(chunk, buf, ok)

    def cancel(self) -> None:
        self._concurrency.cancelled.set()
        if self._hash is not None:
            self._hash.stop()
        with self._pool_cond:
            self._pool_cond.notify_all()
        for shard in self._shards:
            shard.remote.cancel()

    def finish(self) -> Verification:
        """Compare each shard's hash; the verification summary for the row."""
        if self._hash is None:
            reason = "--include/--exclude read part of the shards" if self.regions() else "no sha256 published"
            return {"summary": f"not verified: {reason}", "shards": [False] * len(self._shards)}
        digests = self._hash.digests()
        for index, (shard, digest) in enumerate(zip(self._shards, digests, strict=True)):
            if index in self._skipped:
                continue
            if digest != shard.sha256:
                raise VerificationError(
                    f"{shard.remote.where}: the bytes read do not match the Hub's sha256 (got {digest[:12]}..., "
                    f"expected {(shard.sha256 or '')[:12]}...): the transfer was corrupted or the file changed "
                    "meanwhile; nothing was written, run the command again",
                    repo=shard.remote.repo,
                    file=shard.name,
                    expected=shard.sha256,
                    got=digest,
                )
        return self.all_verified()

    def confirmed(self, verified: set[int] | None) -> Verification:
        """What the row says of the shards: hashed whole and matched by the pass's runs (here, or on the cluster
        nodes that read them), or why they were not hashed."""
        if verified is None:
            reason = "--include/--exclude read part of the shards" if self.regions() else "no sha256 published"
            return {"summary": f"not verified: {reason}", "shards": [False] * len(self._shards)}
        return self.all_verified()

    def describe(self, plan: ModelPlan) -> object:
        """The nodes read the same commit from the Hub, each with its own token."""
        from .spec import hub_spec

        if not plan.commit:
            return super().describe(plan)
        return hub_spec(plan)

    def all_verified(self) -> Verification:
        """What the row says once every shard streamed was hashed and matched: here, or on the cluster nodes
        that read them (each hashing the shards it read whole against the same published sha256)."""
        summary = "sha256 of every shard verified against the Hub"
        if self._skipped:
            summary += f" ({len(self._skipped)} of them by the interrupted fit this one resumed)"
        return {"summary": summary, "shards": [True] * len(self._shards)}

    def close(self) -> None:
        if self._hash is not None:
            self._hash.stop()
        self._free.clear()
        if self._tail_pool is not None:
            self._tail_pool.shutdown(wait=False, cancel_futures=True)

    # -- the buffer pool ----------------------------------------------------------------------------

    def _acquire(self, index: int) -> np.ndarray:
        """A buffer for chunk `index`, handed out strictly in chunk order: the chunk that the hashing and
        the main thread wait for can never find every buffer taken by chunks after it."""
        with self._pool_cond:
            while self._turn != index or (not self._free and self._allocated >= self._pool_size):
                if self._concurrency.cancelled.is_set():
                    raise Cancelled
                self._pool_cond.wait(0.25)
            self._turn += 1
            self._pool_cond.notify_all()
            if self._free:
                return self._free.pop()
            self._allocated += 1
        return np.empty(self.chunk_bytes, dtype=np.uint8)

    def _release(self, buf: np.ndarray) -> None:
        with self._pool_cond:
            self._free.append(buf)
            self._pool_cond.notify_all()

    def _settle(self, index: int, buf: np.ndarray) -> None:
        """One use of chunk `index`'s buffer ended (reduced, or hashed): the last one frees it."""
        with self._pool_cond:
            left = self._holds.pop(index, 1) - 1
            if left > 0:
                self._holds[index] = left
                return
            self._free.append(buf)
            self._pool_cond.notify_all()


class _OrderedHasher:
    """sha256 of each shard over its header and then its chunks strictly in file order, on a thread of its own.

    put() hands it a chunk that has landed and returns at once; the thread hashes the next chunk in order as
    soon as it is there (hashlib releases the GIL on large updates) and calls release(index, buffer) after.
    """

    def __init__(self, shards: list[StreamedShard], chunks: list[Chunk], release) -> None:
        self._hashers = [hashlib.sha256(s.head) for s in shards]
        self._chunks = chunks
        self._release = release
        self._next = 0
        self._waiting: dict[int, np.ndarray] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._busy = False  # a chunk is being hashed (taken from _waiting, _next not yet moved on)
        last: dict[int, int] = {}
        for chunk in chunks:
            last[chunk.shard] = chunk.index
        self._last_chunk = {index: shard for shard, index in last.items()}  # a shard's last chunk -> the shard
        self._expected = [s.sha256 for s in shards]
        self._verified: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="weightdiag-sha256", daemon=True)
        self._thread.start()

    def put(self, chunk: Chunk, buf: np.ndarray) -> None:
        with self._cond:
            self._waiting[chunk.index] = buf
            if chunk.index == self._next:
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and self._next < len(self._chunks) and self._next not in self._waiting:
                    self._cond.wait()
                if self._stopped or self._next >= len(self._chunks):
                    return
                index = self._next
                ready = self._waiting.pop(index)
                self._busy = True
            chunk = self._chunks[index]
            self._hashers[chunk.shard].update(memoryview(ready)[: chunk.nbytes])  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
            self._release(index, ready)
            shard = self._last_chunk.get(index)
            matched = shard is not None and self._hashers[shard].copy().hexdigest() == self._expected[shard]
            with self._cond:
                if matched and shard is not None:
                    self._verified.add(shard)
                self._next = index + 1
                self._busy = False
                self._cond.notify_all()

    def wait_if_last(self, index: int) -> None:
        """When chunk `index` is a shard's last, wait until it is hashed (or the hashing stopped)."""
        if index not in self._last_chunk:
            return
        with self._cond:
            while not self._stopped and self._next <= index and self._thread.is_alive():
                self._cond.wait(0.25)

    def stop(self) -> None:
        """End the thread (the run was abandoned or is over); buffers it still holds are dropped."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def verified(self) -> set[int]:
        """Shards whose every byte is hashed and matched the published sha256."""
        with self._cond:
            return set(self._verified)

    def digests(self) -> list[str]:
        """Each shard's hex digest, once every chunk handed over is hashed."""
        with self._cond:
            while not self._stopped and (self._busy or self._next in self._waiting) and self._thread.is_alive():
                self._cond.wait(0.25)
            if self._next != len(self._chunks):
                raise RuntimeError("not every chunk was hashed")
        return [h.hexdigest() for h in self._hashers]

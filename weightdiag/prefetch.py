"""Read tensor i+1 while tensor i is reduced, with a fixed number of reusable buffers.

Memory stays at `slots` buffers, each as large as the largest tensor read so far: the worker
blocks when all buffers are in use. Buffers are reused rather than reallocated because first-touch
page faults on fresh memory cost about as much as reading the bytes from the page cache.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")
_DONE = object()


class BufferPool:
    def __init__(self, slots: int, allocate: Callable[[int], np.ndarray] | None = None) -> None:
        self._free: queue.Queue[np.ndarray] = queue.Queue()
        self._allocate = allocate or (lambda n: np.empty(n, dtype=np.uint8))
        for _ in range(slots):
            self._free.put(np.empty(0, dtype=np.uint8))

    def acquire(self, nbytes: int, stop: threading.Event) -> np.ndarray | None:
        while not stop.is_set():
            try:
                buf = self._free.get(timeout=0.1)
            except queue.Empty:
                continue
            if buf.size < nbytes:
                del buf  # free the small one before allocating the large one
                buf = self._allocate(nbytes)
            return buf
        return None

    def release(self, buf: np.ndarray) -> None:
        self._free.put(buf)


class Prefetcher(Generic[T]):
    """Iterate (item, bytes) over `items`, reading ahead in one worker thread.

    `read(item, out)` fills `out` (uint8, exactly `size(item)` bytes). The bytes handed to the
    consumer are valid until it asks for the next item.
    """

    def __init__(
        self,
        items: Sequence[T],
        size: Callable[[T], int],
        read: Callable[[T, np.ndarray], None],
        slots: int = 2,
        allocate: Callable[[int], np.ndarray] | None = None,
    ) -> None:
        self._items, self._size, self._read = items, size, read
        self._pool = BufferPool(slots, allocate)
        self._ready: queue.Queue[object] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="weightdiag-reader", daemon=True)

    def _work(self) -> None:
        try:
            for item in self._items:
                n = self._size(item)
                buf = self._pool.acquire(n, self._stop)
                if buf is None:
                    return
                self._read(item, buf[:n])
                self._ready.put((item, buf))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._ready.put(exc)
            return
        self._ready.put(_DONE)

    def __iter__(self) -> Iterator[tuple[T, np.ndarray]]:
        self._thread.start()
        try:
            while True:
                got = self._ready.get()
                if got is _DONE:
                    return
                if isinstance(got, BaseException):
                    raise got
                item, buf = got  # type: ignore[misc]
                try:
                    yield item, buf[: self._size(item)]
                finally:
                    self._pool.release(buf)
        finally:
            self._stop.set()
            self._thread.join(timeout=5)

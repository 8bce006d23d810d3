"""Read ahead: fill tensor buffers in worker threads while the consumer reduces earlier ones.

`slots` reusable buffers bound the memory: at most slots - 1 tensors are being read while the
consumer holds one. Each buffer grows to the largest tensor it has held. Buffers are reused rather
than reallocated because first-touch page faults on fresh memory cost about as much as copying
the bytes from the page cache (and pinned CUDA staging memory is expensive to allocate).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Iterate (item, bytes) over `items` in order; `read(item, out)` fills exactly `size(item)` bytes.

    The bytes handed to the consumer stay valid until it asks for the next item.
    """

    def __init__(
        self,
        items: Sequence[T],
        size: Callable[[T], int],
        read: Callable[[T, np.ndarray], None],
        slots: int = 2,
        workers: int = 1,
        allocate: Callable[[int], np.ndarray] | None = None,
    ) -> None:
        if slots < 2 or workers < 1:
            raise ValueError("need at least 2 slots and 1 worker")
        self._items, self._size, self._read = items, size, read
        self._slots, self._workers = slots, min(workers, slots - 1)
        self._allocate = allocate or (lambda n: np.empty(n, dtype=np.uint8))

    def __iter__(self) -> Iterator[tuple[T, np.ndarray]]:
        free: list[np.ndarray] = [np.empty(0, dtype=np.uint8) for _ in range(self._slots)]
        pending: deque[tuple[T, np.ndarray, Future[None]]] = deque()
        items = iter(self._items)

        with ThreadPoolExecutor(self._workers, thread_name_prefix="weightdiag-read") as pool:

            def refill() -> None:
                # Keep one buffer for the consumer; every other free buffer reads the next item.
                while len(pending) < self._slots - 1 and free:
                    try:
                        item = next(items)
                    except StopIteration:
                        return
                    n = self._size(item)
                    buf = free.pop()
                    if buf.size < n:
                        del buf  # free the small buffer before allocating the large one
                        buf = self._allocate(n)
                    pending.append((item, buf, pool.submit(self._read, item, buf[:n])))

            try:
                refill()
                while pending:
                    item, buf, future = pending.popleft()
                    refill()  # start reading the next one before waiting for and handing out this one
                    future.result()
                    try:
                        yield item, buf[: self._size(item)]
                    finally:
                        free.append(buf)
            finally:
                for _, _, future in pending:  # stop early: do not start what is still queued
                    future.cancel()

"""Host staging of the chunks for the torch path (issue 41): double-buffered, pinned on CUDA, copies on their own
stream.

The reader's worker threads land each chunk in a host buffer (a short-lived mapping or a pooled buffer); the
torch path used to copy every piece from there to the GPU on its own, from pageable memory (18-20 GB/s on an
H200 where pinned memory copies at 55) and on the stream that counts, so reading, copying and counting took
turns. Here a chunk takes one of SLOTS slots: the worker that read it copies it into the slot's host buffer
(pinned where the device is CUDA: the copy runs in the reader's thread, GIL released), queues the host-to-device
copy on the slot's own stream and makes the counting stream wait for that copy only (an event), so that one
slot's copy overlaps the other slot's counting. The slot is given back once its chunk's results are read back
(reduction_torch.resolve: the chunk's one synchronisation), so the device holds at most SLOTS chunks and a
slot's buffers are never overwritten while in use. On torch's CPU device there are no streams or pinned memory:
the slot's host buffer is the "device" buffer, and the same code is what the tests run.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

SLOTS = 2  # double buffering: one chunk copied while the other is counted


class _Slot:
    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        self.cuda = device.type == "cuda"
        self.host: Any = None  # uint8 host tensor, pinned on CUDA
        self.dev: Any = None  # uint8 device tensor (the host one on the CPU device)
        self.stream: Any = torch.cuda.Stream(device) if self.cuda else None
        self.event: Any = torch.cuda.Event() if self.cuda else None

    def _fit(self, nbytes: int) -> None:
        import torch

        if self.host is not None and self.host.numel() >= nbytes:
            return
        size = max(nbytes, 2 * (self.host.numel() if self.host is not None else 0))
        self.host = torch.empty(size, dtype=torch.uint8, pin_memory=self.cuda)
        self.dev = torch.empty(size, dtype=torch.uint8, device=self.device) if self.cuda else self.host

    def stage(self, buf: np.ndarray) -> Any:
        """`buf`'s bytes on the device, the counting stream ordered after their copy."""
        import torch

        n = buf.size
        self._fit(n)
        host = self.host[:n]
        host.numpy()[:] = buf  # in the reader's thread; numpy releases the GIL for the copy
        if not self.cuda:
            return host
        dev = self.dev[:n]
        with torch.cuda.stream(self.stream):
            dev.copy_(host, non_blocking=True)
            self.event.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(self.event)
        return dev


class Staging:
    """SLOTS slots for one device, shared by the chunk engine's worker threads."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self._free: queue.Queue[_Slot] = queue.Queue()
        for _ in range(SLOTS):
            self._free.put(_Slot(self.device))

    @contextmanager
    def slot(self) -> Iterator[_Slot]:
        """A free slot, held until the block ends (a worker waits here while both are in use)."""
        taken = self._free.get()
        try:
            yield taken
        finally:
            self._free.put(taken)


_STAGINGS: dict[str, Staging] = {}
_LOCK = threading.Lock()


def staging(device: str) -> Staging:
    """The process's staging for `device` (made on first use; its pinned buffers are reused by every fit)."""
    with _LOCK:
        if device not in _STAGINGS:
            _STAGINGS[device] = Staging(device)
        return _STAGINGS[device]

"""Host staging of the chunks for the torch path (issue 41): pinned on CUDA, copies on their own streams, two device
buffers in turn.

The reader's worker threads land each chunk in a host buffer (a short-lived mapping whose pages the first reader
faults in, or a pooled buffer); the torch path used to copy every piece from there to the GPU on its own, from
pageable memory (18-20 GB/s on an H200 where pinned memory copies at 55) and on the stream that counts, so
reading, copying and counting took turns. Here a worker that has a chunk for the device:

1. copies it into one of HOST_SLOTS host buffers (pinned on CUDA), in its own thread: up to HOST_SLOTS workers
   fault in and copy their mappings at once, as the CPU path's workers do;
2. takes one of SLOTS device buffers (double buffering), queues the host-to-device copy on that buffer's own
   stream and makes the counting stream wait for that copy only (an event): one buffer's copy overlaps the other
   buffer's counting;
3. gives both back once its chunk's results are read back (reduction_torch.resolve: the chunk's one
   synchronisation, after which the copy and the counting are done), so the device holds at most SLOTS chunks,
   the host HOST_SLOTS (pinned memory counts in the process's RSS), and no buffer is overwritten while in use.

On torch's CPU device there are no streams or pinned memory and the host buffer is the "device" buffer: the same
code, which is what the tests run.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

SLOTS = 2  # device buffers: one chunk copied while the other is counted
HOST_SLOTS = 6  # host buffers: workers copying (and faulting in) their chunks at once


class HostBuffer:
    """A host buffer that grows to the largest chunk it is given (pinned where the device is CUDA)."""

    def __init__(self, pinned: bool) -> None:
        self.pinned = pinned
        self.data: Any = None  # uint8 torch tensor

    def fill(self, buf: np.ndarray) -> Any:
        """`buf`'s bytes in this buffer (in the caller's thread; numpy releases the GIL for the copy)."""
        import torch

        n = buf.size
        if self.data is None or self.data.numel() < n:
            size = max(n, 2 * (self.data.numel() if self.data is not None else 0))
            self.data = torch.empty(size, dtype=torch.uint8, pin_memory=self.pinned)
        host = self.data[:n]
        host.numpy()[:] = buf
        return host


class DeviceBuffer:
    """A device buffer with its own copy stream (CUDA), or nothing to copy into (the CPU device)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        self.cuda = device.type == "cuda"
        self.data: Any = None
        self.stream: Any = torch.cuda.Stream(device) if self.cuda else None
        self.event: Any = torch.cuda.Event() if self.cuda else None

    def copy(self, host: Any) -> Any:
        """`host` on the device, the counting stream ordered after the copy (which runs on this buffer's stream)."""
        import torch

        if not self.cuda:
            return host
        n = host.numel()
        if self.data is None or self.data.numel() < n:
            size = max(n, 2 * (self.data.numel() if self.data is not None else 0))
            self.data = torch.empty(size, dtype=torch.uint8, device=self.device)
        dev = self.data[:n]
        with torch.cuda.stream(self.stream):
            dev.copy_(host, non_blocking=True)
            self.event.record(self.stream)
        torch.cuda.current_stream(self.device).wait_event(self.event)
        return dev


class Staging:
    """HOST_SLOTS host buffers and SLOTS device buffers for one device, shared by the chunk engine's workers."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = torch.device(device)
        self.hosts: queue.Queue[HostBuffer] = queue.Queue()
        self.devices: queue.Queue[DeviceBuffer] = queue.Queue()
        for _ in range(HOST_SLOTS):
            self.hosts.put(HostBuffer(self.device.type == "cuda"))
        for _ in range(SLOTS):
            self.devices.put(DeviceBuffer(self.device))


class Staged:
    """One chunk's staging: `put` its bytes on the device (once), `release` the buffers it took."""

    def __init__(self, staging: Staging) -> None:
        self._staging = staging
        self._host: HostBuffer | None = None
        self._device: DeviceBuffer | None = None

    def put(self, buf: np.ndarray) -> Any:
        """`buf` on the device: a host buffer taken and filled first, then a device buffer (workers wait here)."""
        self._host = self._staging.hosts.get()
        host = self._host.fill(buf)
        self._device = self._staging.devices.get()
        return self._device.copy(host)

    def release(self) -> None:
        """Give the buffers back: only once the chunk's results were read back (nothing on them still runs)."""
        if self._device is not None:
            self._staging.devices.put(self._device)
            self._device = None
        if self._host is not None:
            self._staging.hosts.put(self._host)
            self._host = None


_STAGINGS: dict[str, Staging] = {}
_LOCK = threading.Lock()


def staging(device: str) -> Staging:
    """The process's staging for `device` (made on first use; its pinned buffers are reused by every fit)."""
    with _LOCK:
        if device not in _STAGINGS:
            _STAGINGS[device] = Staging(device)
        return _STAGINGS[device]

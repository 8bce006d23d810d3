"""Companions on demand: each quantized weight's decoder is built when its first piece is reduced.

Companions are small next to their weight (a scale per block or group), but a whole model's can be
large (NVFP4: an FP8 scale per 16 weights), so none is held longer than its weight is being read:
a weight's companions are read (a few weights ahead, in parallel, wherever their shard is) just
before its codes stream past, and dropped when its last piece is reduced.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..source.plan import Quantized, TensorRef
from .decoder import Companion, Decoder
from .formats import build_decoder

ReadTensor = Callable[[TensorRef], np.ndarray]  # a tensor's stored bytes (uint8, flat)
LOOKAHEAD = 4  # weights whose companions are read ahead of the one being reduced


class CompanionLoader:
    """Decoders of `weights` (in the order the stream meets them), built from companions read with `read`."""

    def __init__(self, read: ReadTensor, weights: Sequence[Quantized], lookahead: int = LOOKAHEAD) -> None:
        self._read = read
        self._weights = list(weights)
        self._lookahead = lookahead
        self._futures: dict[int, Future[Decoder]] = {}
        self._released: set[int] = set()
        self._notes: dict[int, str] = {}  # what a weight's decoder found worth saying in its record (kept past release)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, lookahead), thread_name_prefix="weightdiag-companions")

    def _load(self, index: int) -> Decoder:
        q = self._weights[index]
        companions = {
            role: Companion(self._read(ref), ref.dtype.name, ref.shape)
            for role, ref in q.companions.items()
            if not role.startswith("activation")  # activation scales are listed, never needed
        }
        decoder = build_decoder(q, companions)
        if decoder.note:  # what it found worth saying in its weight's record (the Decoder contract's note)
            self._notes[index] = decoder.note
        return decoder

    def note(self, index: int) -> str | None:
        """The note weight `index`'s decoder left for its record, once its decoder was built."""
        return self._notes.get(index)

    def decoder(self, index: int) -> Decoder:
        """The decoder of weight `index` (blocks until its companions are in); starts the next ones' reads."""
        with self._lock:
            for j in range(index, min(index + self._lookahead + 1, len(self._weights))):
                if j not in self._futures and j not in self._released:
                    self._futures[j] = self._pool.submit(self._load, j)
            future = self._futures[index]
        return future.result()

    def release(self, index: int) -> None:
        with self._lock:
            self._futures.pop(index, None)
            self._released.add(index)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()


class LazyDecoder:
    """One weight's handle on the shared loader: what the engine's Target carries."""

    def __init__(self, loader: CompanionLoader, index: int) -> None:
        self._loader = loader
        self._index = index

    def get(self) -> Decoder:
        return self._loader.decoder(self._index)

    def release(self) -> None:
        self._loader.release(self._index)

    def note(self) -> str | None:
        return self._loader.note(self._index)

"""The one contract between a source and the stages after it: byte ranges of a planned model's shards.

Every source (local safetensors, the Hub, GGUF, .bin) hands back a `Reader` with its plan. The engine
(reduce/stream.py), `diff` (diff/paired.py) and the journal ask only what is declared here, never
probe a reader for attributes: what only some readers do (verify shards while streaming, skip
shards a resumed fit already has, open more connections) has a no-op default below.

Two ways to get a chunk's bytes, chosen by `fetches`:
- cheap to get (local files): `chunk()` maps or copies them in the worker thread that reduces them;
- slow to get (the network): `fetch()` reads into a pooled buffer on a thread of its own, so that
  connections keep reading while the cores reduce what has landed, and `done()` hands the buffer back
  (after hashing it when shards are verified).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

import numpy as np

from ..errors import OptionError, param
from .chunks import Chunk
from .plan import ModelPlan, TensorRef

Verification = dict[str, Any]  # {"summary": str, "shards": [bool per shard]}: what the row's files and run say


class Reader(ABC):
    """Bytes of the shards of one planned model. Used from several worker threads at once."""

    # The chunk size it reads best with (the engine plans chunks of about this many bytes).
    chunk_bytes: int = 32 << 20
    # True: chunks are read with fetch()/done() on threads of their own (network); False: with chunk().
    fetches: ClassVar[bool] = False

    @property
    def workers(self) -> int:
        """A fetching reader: chunks read at once (its connections). Chunks read with chunk() are read by
        the engine's workers (Execution.chunk_workers)."""
        raise NotImplementedError(f"{type(self).__name__} does not fetch ahead")

    @property
    def buffers(self) -> int:
        """A fetching reader: chunk buffers it holds (at most this many chunks read, reduced or waiting)."""
        raise NotImplementedError(f"{type(self).__name__} does not fetch ahead")

    @abstractmethod
    def chunk(self, chunk: Chunk) -> AbstractContextManager[np.ndarray]:
        """The chunk's bytes (uint8, chunk.nbytes of them), valid inside the `with`."""

    def fetch(self, chunk: Chunk) -> np.ndarray:
        """A fetching reader: read the chunk into a buffer (at least chunk.nbytes) to hand back with done()."""
        raise NotImplementedError(f"{type(self).__name__} does not fetch ahead; read chunks with chunk()")

    def done(self, chunk: Chunk, buf: np.ndarray, ok: bool) -> None:
        """A fetching reader: the buffer of a fetched chunk is no longer needed (`ok`: it was reduced)."""
        return None  # nothing to do unless a reader says otherwise

    def read_into(self, ref: TensorRef, out: np.ndarray) -> None:
        """Fill `out` (uint8, at least ref.nbytes) with one tensor's stored bytes, outside the chunk stream
        (companions of quantized weights, the matrices `report --plot` draws)."""
        with self.chunk(Chunk(-1, ref.shard, ref.start, ref.end, ())) as raw:
            out[: ref.nbytes] = raw

    def tensor_bytes(self, ref: TensorRef) -> np.ndarray:
        """One (small) tensor's stored bytes, read now."""
        out = np.empty(ref.nbytes, dtype=np.uint8)
        self.read_into(ref, out)
        return out

    def regions(self) -> dict[int, tuple[int, int]] | None:
        """{shard: (data start, file size)} to read whole so that every byte is verified; None: no hashes."""
        return None

    def start(self, chunks: list[Chunk], verify: bool) -> None:
        """The reads to come, in order (before the first one); `verify`: hash them as regions() asked."""
        return None  # nothing to do unless a reader says otherwise

    def set_connections(self, connections: int) -> None:
        """Requests to keep in flight (network readers; before start())."""
        return None  # nothing to do unless a reader says otherwise

    def skip_shards(self, shards: set[int]) -> None:
        """Shards a resumed fit already measured and verified, or that other runs of a pass hash: leave them out
        of the stream and of the verification too (before start())."""
        return None  # nothing to do unless a reader says otherwise

    def verified_shards(self) -> set[int]:
        """Shards read whole whose hash matched so far."""
        return set()

    def finish(self) -> Verification | None:
        """After the last chunk: check what was hashed (raises VerificationError on a mismatch); None: this
        reader verifies nothing while streaming (the plan says what was checked)."""
        return None

    def confirmed(self, verified: set[int] | None) -> Verification | None:
        """The row's verification once a pass's runs (here, or on cluster nodes reading the same shards) read
        whole and matched the shards `verified` (None: nothing was hashed); None: this reader verifies nothing
        while streaming (the plan says what was checked)."""
        return None

    def planning_bytes(self) -> int | None:
        """Bytes of the weight files fetched over the network to plan the model (the Hub's safetensors headers and
        the bytes read with them); None: a reader of local files, which reads its headers from disk."""
        return None

    def describe(self, plan: ModelPlan) -> Any:
        """A `source.reopen.SourceSpec` of this model (a few plain fields) from which another machine opens a
        reader over the same shards; refused for formats a cluster node cannot read."""
        raise OptionError(
            f"{plan.location}: {param('executor')} ray reads safetensors checkpoints (local or from the Hub); this "
            f"one is {plan.file_format}: fit it without {param('executor')} ray",
            param="executor",
        )

    def cancel(self) -> None:
        """Abandon reads in progress (an error ended the run); may be called from any thread."""
        return None  # nothing to do unless a reader says otherwise

    def close(self) -> None:
        """Release files, connections and buffers; the reader is not used again."""
        return None  # nothing held between reads unless a reader says otherwise

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def closing_on_error(reader: Reader) -> Iterator[Reader]:
    """Close `reader` if the block raises (a plan refused after opening): nothing left open."""
    try:
        yield reader
    except BaseException:
        reader.close()
        raise

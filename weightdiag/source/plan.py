"""What a model is made of, before any weight byte is read: files, tensors, config.

A `ModelPlan` is produced by a source (local folder, Hub repo, ...) and consumed by the
pipeline. A `TensorReader` turns a `TensorRef` into a flat numpy array in its storage form
(BF16 as uint16 bit patterns, since numpy has no bfloat16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..dtypes import DTYPES, REDUCIBLE, DType

if TYPE_CHECKING:
    from ..quant.scheme import Quantized

# numpy storage type of each dtype weightdiag can reduce (from the one dtype table); BF16 travels as raw bits.
STORAGE_NUMPY = {name: DTYPES[name].numpy for name in REDUCIBLE}


@dataclass(frozen=True)
class ShardInfo:
    name: str  # path relative to the model root
    size: int
    sha256: str | None = None  # content hash when known (Hub lfs oid, HF cache blob name, --hash)
    header_sha256: str | None = None  # hash of the 8-byte prefix + JSON header (always cheap)


@dataclass(frozen=True)
class TensorRef:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    shard: int  # index into ModelPlan.shards
    start: int  # absolute byte offsets in the shard
    end: int
    note: str | None = None  # e.g. "dequantized from Q4_1"
    stored_type: str | None = None  # the file's type when `dtype` is what it is delivered as (GGUF Q4_1 -> F32)
    quantization: str | None = None  # the quantized type it was dequantized from (GGUF Q4_1), else None
    stored_nbytes: int | None = None  # bytes in the file when they differ from the delivered ones (GGUF)
    # A quantized safetensors weight: start..end are its packed codes, decoded in the stream with its
    # companions (scales, zero points, ...) into float32 values of `shape` (see weightdiag.quant).
    quant: Quantized | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes as delivered to the reducer (start..end)."""
        return self.end - self.start

    @property
    def file_nbytes(self) -> int:
        """Bytes read from the file: what progress and `run.bytes_read` count."""
        return self.stored_nbytes if self.stored_nbytes is not None else self.nbytes


@dataclass
class ModelPlan:
    model_id: str
    source: str  # "local" | "hub"
    location: str  # folder, file or URL
    shards: list[ShardInfo]
    tensors: list[TensorRef]
    config: dict[str, Any] | None = None
    revision: str | None = None
    commit: str | None = None
    file_format: str = "safetensors"
    metadata: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # hf_quant_config.json (NVIDIA modelopt checkpoints), when the checkpoint has one.
    quant_config: dict[str, Any] | None = None
    # Set when the source checked the files' sha256 before reading (a fresh --download); a streaming
    # reader reports its own through finish(): {"summary": ..., "shards": [bool per shard]}.
    verification: dict[str, Any] | None = None


class TensorReader(Protocol):
    """Reads the bytes of one tensor; used from one worker thread at a time."""

    def read_into(self, ref: TensorRef, out: np.ndarray) -> None:
        """Fill `out` (a uint8 array of exactly ref.nbytes) with the tensor's stored bytes."""
        ...

    def close(self) -> None: ...


def storage_view(ref: TensorRef, raw: np.ndarray) -> np.ndarray:
    """The tensor's elements as a flat array in storage form, viewing `raw` bytes without a copy."""
    return raw.view(STORAGE_NUMPY[ref.dtype.name])

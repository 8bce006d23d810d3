"""What a model is made of, before any weight byte is read: files, tensors, config.

A `ModelPlan` is produced by a source (local folder, Hub repo, ...) with the `Reader` (reader.py) that
hands out its bytes, and consumed by the stages after it. Elements travel in their storage form (BF16
as uint16 bit patterns, since numpy has no bfloat16).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import DTYPES, REDUCIBLE, DType

# numpy storage type of each dtype weightdiag can reduce (from the one dtype table); BF16 travels as raw bits.
STORAGE_NUMPY = {name: DTYPES[name].numpy for name in REDUCIBLE}


@dataclass(frozen=True)
class ShardInfo:
    name: str  # path relative to the model root
    size: int
    sha256: str | None = None  # content hash when known (Hub lfs oid, HF cache blob name, --hash)
    header_sha256: str | None = None  # hash of the 8-byte prefix + JSON header (always cheap)


# --- quantized weights -------------------------------------------------------------------------------
# A quantized linear weight is stored as several tensors: the packed codes (`weight`, `qweight`,
# `weight_packed`, `*_blocks`) and its companions (scales, zero points, group indices, the packed shape,
# bitsandbytes' quant state). weightdiag.decode.group turns them into one TensorRef of the logical
# (dequantized) shape whose `quant` holds a `Quantized`; the engine decodes the codes chunk by chunk
# with the companions (weightdiag.decode.decoder) and reduces float32 values.


@dataclass(frozen=True)
class QuantSpec:
    """One quantization format, as a decoder needs it and as the row reports it."""

    # decoder id: fp8-block, fp8-channel, fp8-tensor, int-pack, nvfp4, mxfp4, bnb-4bit, bnb-int8, gptq, awq, gguf-<type>
    format: str
    method: (
        str  # the checkpoint's quant_method (fp8, compressed-tensors, gptq, awq, bitsandbytes, mxfp4, modelopt, ...)
    )
    bits: int
    label: str  # what users read: "GPTQ int4, group 128"
    arithmetic: str  # how a value is computed, in float32: "(q - zero) * scale"
    source: str  # the dequantizer it follows (project and file)
    block: tuple[int, int] | None = None  # scale block (rows, columns) of the logical matrix
    group: int | None = None  # elements along the input dimension that share a scale
    params: Mapping[str, Any] = field(default_factory=dict)  # format details (symmetric, packing order, ...)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": self.format,
            "method": self.method,
            "bits": self.bits,
            "label": self.label,
            "arithmetic": self.arithmetic,
            "source": self.source,
        }
        if self.block:
            out["block"] = list(self.block)
        if self.group:
            out["group"] = self.group
        return out


@dataclass(frozen=True)
class Quantized:
    """A quantized weight: its packed codes and companions, by role ("scale", "zero", "g_idx", ...)."""

    spec: QuantSpec
    codes: TensorRef  # the stored tensor the engine streams (its bytes are the chunks)
    companions: Mapping[str, TensorRef]
    logical_shape: tuple[int, ...]  # the dequantized weight's shape (HF layout: [out, in], experts first)
    # The codes are decoded in whole units of this many bytes (a GGUF block, or whole heads of rows whose order
    # llama.cpp changed), so the engine cuts them only between units (weightdiag.source.chunks.cut_step).
    unit_bytes: int = 1

    @property
    def stored_names(self) -> list[str]:
        return [self.codes.name, *(ref.name for ref in self.companions.values())]


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
    stored_nbytes: int | None = None  # bytes in the file when they differ from start..end
    # A quantized weight: start..end are its packed codes (a GGUF tensor's blocks), decoded in the stream with
    # its companions (scales, zero points, ...; none for GGUF) into values of `shape` (see weightdiag.decode).
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
    # The model card's base_model (read for quantized checkpoints): what to fit instead of a refused one.
    base_model: str | None = None
    # Set when the source checked the files' sha256 before reading (a fresh --download); a streaming
    # reader reports its own through finish(): {"summary": ..., "shards": [bool per shard]}.
    verification: dict[str, Any] | None = None


def storage_view(ref: TensorRef, raw: np.ndarray) -> np.ndarray:
    """The tensor's elements as a flat array in storage form, viewing `raw` bytes without a copy."""
    return raw.view(STORAGE_NUMPY[ref.dtype.name])

"""What a quantized weight is: its format (`QuantSpec`) and its stored tensors (`Quantized`).

A quantized linear weight is stored as several tensors: the packed codes (`weight`, `qweight`,
`weight_packed`, `*_blocks`) and its companions (scales, zero points, group indices, the packed
shape, bitsandbytes' quant state). weightdiag.quant.group turns them into one `TensorRef` of the
logical (dequantized) shape whose `quant` field holds this record; the engine decodes the codes
chunk by chunk with the companions (weightdiag.quant.decoders) and reduces float32 values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..source.plan import TensorRef


@dataclass(frozen=True)
class QuantSpec:
    """One quantization format, as a decoder needs it and as the row reports it."""

    format: str  # decoder id: fp8-block, fp8-channel, fp8-tensor, int-pack, nvfp4, mxfp4, bnb-4bit, bnb-int8, gptq, awq
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

    @property
    def stored_names(self) -> list[str]:
        return [self.codes.name, *(ref.name for ref in self.companions.values())]

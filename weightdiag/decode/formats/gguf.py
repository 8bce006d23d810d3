"""GGUF tensors (llama.cpp) decoded in the stream: ggml blocks dequantized, llama Q/K rows un-permuted,
Gemma norms' 1 subtracted.

A GGUF weight has no companions: each block holds its own scales (weightdiag.decode.ggml_blocks does the
block math, bit-identical to ggml's reference dequantization). The engine cuts a weight's bytes only
between whole units (`Quantized.unit_bytes`, weightdiag.source.chunks.cut_step): a block, or, for rows
llama.cpp's convert script permuted (convert_hf_to_gguf.py, LlamaModel.permute: HF row (h, i, j) of a
(heads, 2, half) split is stored at (h, j, i) of (heads, half, 2)), whole heads of rows. So every piece
decodes in the logical (HF) row-major order: the decoded order is the logical one, any selection of
elements can be taken, and the first largest |value| is the first in HF order, as when the whole
tensor was dequantized and un-permuted at once.

Values are float32 (dequantized blocks, and norms stored as 1 + w: stored value - 1 in float32), except
rows of a float tensor that are only un-permuted: those stay in their stored dtype (F16 stays F16), the
TensorRef's dtype, so they are reduced exactly like any other F16 tensor.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import CheckpointFormatError
from ...source.gguf import DEQUANTIZED_TYPES, GGML_BY_NAME, RAW_FLOATS
from ...source.plan import STORAGE_NUMPY, Quantized
from ..decoder import Companions, RowMajorDecoder, register
from ..ggml_blocks import dequantize


class GGUFDecoder(RowMajorDecoder):
    """Stored bytes of whole units -> values in HF row-major order (group_cols None: no counting path)."""

    def __init__(self, q: Quantized, companions: Companions) -> None:  # companions: none, scales are in blocks
        params = q.spec.params
        self.name = q.codes.name
        self.type = GGML_BY_NAME[str(params["ggml_type"])]
        self.dtype = str(params["dtype"])  # what the values are: the TensorRef's dtype
        self.subtract = float(params.get("subtract", 0.0))
        self.unit_bytes = q.unit_bytes
        shape = q.logical_shape
        rows = shape[0] if shape else 1
        self.row_elems = math.prod(shape[1:])  # elements of a row as the permutation moves them (1 for a bias)
        heads = int(params.get("heads") or 0)
        self.rows_per_head = rows // heads if heads else 0
        if heads and (rows % (2 * heads) or self.unit_bytes % self._bytes(self.rows_per_head * self.row_elems)):
            raise self._fail(f"{rows} rows cannot be un-permuted in {heads} heads by units of {self.unit_bytes} bytes")
        if self.unit_bytes % self.type.size:
            raise self._fail(f"units of {self.unit_bytes} bytes are not whole {self.type.name} blocks")

    def _fail(self, message: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{self.name}: {message}", file=self.name)

    def _bytes(self, elements: int) -> int:
        return elements // self.type.block * self.type.size

    def decode(self, raw: np.ndarray, byte_lo: int) -> tuple[np.ndarray, int]:
        if byte_lo % self.unit_bytes or raw.size % self.unit_bytes:
            raise self._fail(
                f"a piece at byte {byte_lo} of {raw.size} bytes does not hold whole units of {self.unit_bytes} bytes"
            )
        values = self._values(raw)
        if self.rows_per_head:  # whole heads: (heads, half, 2, row) as stored -> (heads, 2, half, row)
            half = self.rows_per_head // 2
            values = values.reshape(-1, half, 2, self.row_elems).swapaxes(1, 2).reshape(-1)
        return values, byte_lo // self.type.size * self.type.block

    def _values(self, raw: np.ndarray) -> np.ndarray:
        name = self.type.name
        with np.errstate(all="ignore"):  # random or damaged scales may overflow: inf/nan, not errors
            if name in DEQUANTIZED_TYPES:
                values = dequantize(raw, name)
            elif self.dtype == "F32" and name != "F32":  # F16, BF16, F64 as float32 (a norm to shift)
                values = _float32(raw, name)
            else:  # rows to un-permute: as stored
                values = raw.view(STORAGE_NUMPY[self.dtype]).copy()
            if self.subtract:
                values -= np.float32(self.subtract)
        return values


def _float32(raw: np.ndarray, type_name: str) -> np.ndarray:
    if type_name == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    return raw.view({"F16": "<f2", "F64": "<f8"}[type_name]).astype(np.float32)


for _type in (*DEQUANTIZED_TYPES, *RAW_FLOATS):
    register(f"gguf-{_type.lower()}")(GGUFDecoder)

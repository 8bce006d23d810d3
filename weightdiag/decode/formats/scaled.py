"""Byte codes times a block, channel or tensor scale: FP8 (E4M3, E5M2) and INT8 weights.

value = (table[code] - zero) * scale in float32, with one scale (and zero point) per block of
`spec.block` = (rows, columns) of the logical matrix; a channel scale is the block (1, columns), a
tensor scale the whole matrix. Stacked experts [E, out, in] have blocks per expert. This is what
each format's dequantizer computes:
- block FP8: DeepSeek-V3 `inference/kernel.py` (weight_dequant: x.float() * s per 128x128 block,
  `weight_scale_inv`), transformers `integrations/finegrained_fp8.py`;
- compressed-tensors `float-quantized` and `naive-quantized` (compressed_tensors/quantization/
  lifecycle/forward.py, dequantize: (x_q - zero_point) * scale per tensor, channel, group or block);
- fbgemm FP8 (per-channel `weight_scale` [out, 1]) and NVIDIA modelopt FP8 (per-tensor `weight_scale`).
A product of an 8-bit code and a 16-bit scale is exact in float32, so the values do not depend on
whether a library multiplies in the scale's dtype or in float32; with float32 scales they are the
float32 products, as torch computes them.
"""

from __future__ import annotations

import math

import numpy as np

from ...codes import code_values
from ...source.plan import Quantized
from ..decoder import Companions, RowMajorDecoder, check_shape, register, scale_columns, subtract_columns
from ..values import as_float32, as_integers


def _code_table(dtype: str) -> np.ndarray:
    if dtype in ("F8_E4M3", "F8_E5M2"):
        with np.errstate(invalid="ignore", over="ignore"):
            return code_values(dtype).astype(np.float32)
    if dtype == "I8":
        return np.arange(256, dtype=np.uint8).view(np.int8).astype(np.float32)
    if dtype == "U8":
        return np.arange(256, dtype=np.float32)
    raise ValueError(f"no 8-bit code table for {dtype}")


class ScaledCodes(RowMajorDecoder):
    bits = 8
    unit_bytes = 1

    def __init__(self, q: Quantized, companions: Companions) -> None:
        super().__init__(q, companions)
        shape = q.logical_shape
        self.table = _code_table(q.codes.dtype.name)
        bh, bw = q.spec.block or (shape[-2] if len(shape) > 1 else 1, shape[-1])
        self.block_rows, self.block_cols = bh, bw
        self.group_cols = bw  # the counting path: one slot per scale block
        self.rows_per_matrix = shape[-2] if len(shape) > 1 else 1  # experts: blocks restart per expert
        self.grid_rows = math.ceil(self.rows_per_matrix / bh)
        grid_cols = math.ceil(self.cols / bw)
        matrices = self.rows // self.rows_per_matrix
        expected = (matrices * self.grid_rows, grid_cols)
        scale = companions["scale"]
        check_shape(self.name, "scale", scale, expected)
        self.scales: np.ndarray = as_float32(scale.raw, scale.dtype).reshape(expected)  # numpy's stubs would infer 0-d
        self.zeros = None
        if "zero" in companions:
            zero = companions["zero"]
            check_shape(self.name, "zero point", zero, expected)
            zeros = zero.raw.view(np.uint8) if zero.dtype in ("U8",) else as_integers(zero.raw, zero.dtype)
            self.zeros = zeros.astype(np.float32).reshape(expected)

    def slot_table(self, row0: int, row1: int) -> tuple[np.ndarray, np.ndarray]:
        """One slot per scale block of the rows: the blocks' values for all 256 codes, as rect computes them."""
        grid = self._grid_rows(row0, row1)
        lo, hi = int(grid.min()), int(grid.max()) + 1
        n_cols = self.scales.shape[1]
        slots = ((grid - lo)[:, None] * n_cols + np.arange(n_cols)[None, :]).astype(np.int32)
        table = np.broadcast_to(self.table, (hi - lo, n_cols, 256)).copy()
        if self.zeros is not None:
            table -= self.zeros[lo:hi, :, None]
        table *= self.scales[lo:hi, :, None]
        return slots, table.reshape(-1, 256)

    def _grid_rows(self, row0: int, row1: int) -> np.ndarray:
        rows = np.arange(row0, row1)
        return (rows // self.rows_per_matrix) * self.grid_rows + (rows % self.rows_per_matrix) // self.block_rows

    def rect(self, raw: np.ndarray, row0: int, row1: int, col0: int, col1: int, out: np.ndarray) -> None:
        np.take(self.table, raw.reshape(out.shape), out=out)
        grid = self._grid_rows(row0, row1)
        if self.zeros is not None:
            subtract_columns(out, self.zeros[grid], self.block_cols, col0)
        scale_columns(out, self.scales[grid], self.block_cols, col0)


for _fmt in ("fp8-block", "fp8-channel", "fp8-tensor", "int8"):
    register(_fmt)(ScaledCodes)

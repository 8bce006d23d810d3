"""4-bit floats (E2M1) with a scale per small group: NVFP4 and MXFP4.

Two E2M1 codes per byte, the low nibble first (element 2i in bits 0-3 of byte i), rows of the
logical matrix in order; code values from the OCP Microscaling Formats (MX) v1.0 specification
(0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign; code 8 is -0).
- NVFP4, compressed-tensors (compressors/nvfp4/base.py and helpers.py unpack_fp4_from_uint8;
  quantization/lifecycle/forward_helpers.py _dequantize): an FP8 E4M3 `weight_scale` per 16
  elements of a row and a float32 `weight_global_scale`: value = e2m1 * (scale / global_scale), the
  group's scale divided first, in float32 (the library then casts to BF16; the decoder contract
  keeps float32).
- NVFP4, NVIDIA TensorRT Model Optimizer (modelopt NVFP4QTensor.dequantize; its `weight_scale_2` is
  compressed-tensors' 1 / global_scale): value = e2m1 * (scale * weight_scale_2).
- MXFP4, gpt-oss as transformers reads it (integrations/mxfp4.py, convert_moe_packed_tensors:
  `*_blocks` U8 [..., groups, 16] and `*_scales` U8 [..., groups]) and compressed-tensors'
  mxfp4-pack-quantized: an E8M0 exponent per 32 elements: value = e2m1 * 2^(scale - 127), exact in
  float32 (transformers uses ldexp). Scale code 255 is NaN in the MX spec. The logical matrix is the
  stored [..., rows, groups * 32]; transformers hands gpt-oss experts to the model transposed
  ([E, in, out]), which changes coordinates, not values.

Both have at most 256 distinct group scales per weight (the scale is an 8-bit code), so the counting
path keys its slots by the scale code: 256 slots x 16 codes, whatever the tensor's size.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import CheckpointFormatError
from ...source.plan import Quantized
from ..decoder import Companions, RowMajorDecoder, check_shape, register
from ..values import as_float32, code_table_f32, fp4_e2m1_table


class ScaledFP4(RowMajorDecoder):
    bits = 4
    unit_bytes = 1
    high_nibble_first = False
    group_cols: int  # always set here: E2M1 codes come in scale groups

    def __init__(self, q: Quantized, companions: Companions) -> None:
        super().__init__(q, companions)
        group = q.spec.group or 16
        if self.cols % group:
            raise CheckpointFormatError(
                f"{self.name}: rows of {self.cols} elements are not whole groups of {group}", file=self.name
            )
        self.group_cols = group
        scale = companions["scale"]
        check_shape(self.name, "scale", scale, (self.rows, self.cols // group))
        self.scales_by_code = self.slot_scales(q, companions)  # float32 [256]; checks the scale's dtype
        self.scale_codes = scale.raw.view(np.uint8).reshape(self.rows, self.cols // group)
        # the value of every (scale code, element code), as rect computes it element by element
        with np.errstate(over="ignore", invalid="ignore"):  # 6 x 2^127 is inf, as in the libraries
            self.table = fp4_e2m1_table()[None, :] * self.scales_by_code[:, None]

    def slot_scales(self, q: Quantized, companions: Companions) -> np.ndarray:
        """float32 [256]: the group scale each stored scale code stands for."""
        raise NotImplementedError

    def slot_table(self, row0: int, row1: int) -> tuple[np.ndarray, np.ndarray]:
        return self.scale_codes[row0:row1].astype(np.int32), self.table

    def rect(self, raw: np.ndarray, row0: int, row1: int, col0: int, col1: int, out: np.ndarray) -> None:
        codes = raw.reshape(row1 - row0, -1)
        pairs = out.reshape(row1 - row0, -1, 2)
        e2m1 = fp4_e2m1_table()
        np.take(e2m1, codes & 15, out=pairs[:, :, 0])
        np.take(e2m1, codes >> 4, out=pairs[:, :, 1])
        groups = (np.arange(col0, col1) // self.group_cols).astype(np.intp)
        with np.errstate(over="ignore", invalid="ignore"):
            out *= self.scales_by_code[self.scale_codes[row0:row1][:, groups]]


@register("nvfp4")
class NVFP4(ScaledFP4):
    def slot_scales(self, q: Quantized, companions: Companions) -> np.ndarray:
        scale = companions["scale"]
        if scale.dtype != "F8_E4M3":
            raise CheckpointFormatError(
                f"{self.name}: NVFP4 scales are F8_E4M3, this one is {scale.dtype}", file=self.name
            )
        glob = companions["global_scale"]
        if math.prod(glob.shape) != 1:
            raise CheckpointFormatError(
                f"{self.name}: its global scale has shape {list(glob.shape)}, expected one value", file=self.name
            )
        g = as_float32(glob.raw, glob.dtype)[0]
        fp8 = code_table_f32("F8_E4M3")
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            scales = fp8 / g if q.spec.params.get("global") == "divide" else fp8 * g
        return scales.astype(np.float32)


@register("mxfp4")
class MXFP4(ScaledFP4):
    def slot_scales(self, q: Quantized, companions: Companions) -> np.ndarray:
        scale = companions["scale"]
        if scale.dtype not in ("U8", "F8_E8M0"):
            raise CheckpointFormatError(
                f"{self.name}: MXFP4 scales are E8M0 bytes (U8), this one is {scale.dtype}", file=self.name
            )
        return code_table_f32("F8_E8M0")

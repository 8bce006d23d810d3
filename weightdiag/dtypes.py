"""Element types of checkpoint tensors, named as in the safetensors format.

`bits` is the storage size of one element. `fittable` says whether weightdiag reduces the
tensor as it is stored: the float formats it can read exactly. `storage` is the numpy type a
tensor's bytes are viewed as (BF16 and FP8 travel as raw unsigned bit patterns; numpy has no such
floats); None for sub-byte types. Sub-byte and complex formats are known (so a header using them is
valid): stored alone they are skipped with a reason; as the codes or scales of a quantized weight
(`F4` NVFP4/MXFP4 values, `F8_E8M0` MX scales) weightdiag.decode decodes them.

This is the one dtype table: every module asks it (never spells dtype names out itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    kind: str  # "float", "int", "bool", "complex"
    fittable: bool
    storage: str | None = None  # numpy dtype of the stored elements, None below one byte

    @property
    def numpy(self) -> np.dtype:
        if self.storage is None:
            raise ValueError(f"{self.name} elements are smaller than a byte; no numpy view")
        return np.dtype(self.storage)

    def nbytes(self, numel: int) -> int | None:
        """Storage size of `numel` elements, or None when it is not a whole number of bytes."""
        total_bits = numel * self.bits
        return total_bits // 8 if total_bits % 8 == 0 else None


_TABLE = [
    DType("BOOL", 8, "bool", False, "u1"),
    DType("U8", 8, "int", False, "u1"),
    DType("I8", 8, "int", False, "i1"),
    DType("U16", 16, "int", False, "<u2"),
    DType("I16", 16, "int", False, "<i2"),
    DType("U32", 32, "int", False, "<u4"),
    DType("I32", 32, "int", False, "<i4"),
    DType("U64", 64, "int", False, "<u8"),
    DType("I64", 64, "int", False, "<i8"),
    DType("F16", 16, "float", True, "<f2"),
    DType("BF16", 16, "float", True, "<u2"),
    DType("F32", 32, "float", True, "<f4"),
    DType("F64", 64, "float", True, "<f8"),
    DType("F8_E4M3", 8, "float", True, "u1"),
    DType("F8_E5M2", 8, "float", True, "u1"),
    DType("F8_E4M3FNUZ", 8, "float", False, "u1"),
    DType("F8_E5M2FNUZ", 8, "float", False, "u1"),
    DType("F8_E8M0", 8, "float", False, "u1"),
    DType("F6_E2M3", 6, "float", False),
    DType("F6_E3M2", 6, "float", False),
    DType("F4", 4, "float", False),
    DType("C64", 64, "complex", False, "<c8"),
]

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}
# The types the reducer reads directly, in storage form (see engine.reduce).
REDUCIBLE = tuple(d.name for d in _TABLE if d.fittable)


def skip_reason(dtype: DType) -> str:
    """Why a tensor of this dtype is not fitted (for the row's `skipped` list)."""
    if dtype.kind in ("int", "bool"):
        return f"non-float dtype {dtype.name}"
    if dtype.kind == "other":  # torch-only types (complex128, quantized, sparse) from .bin checkpoints
        return f"unsupported tensor type {dtype.name}"
    return f"float format {dtype.name} is not supported for fitting yet"

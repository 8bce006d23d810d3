"""Element types of checkpoint tensors, named as in the safetensors format.

`bits` is the storage size of one element. `fittable` says whether weightdiag reduces the
tensor: the float formats it can read exactly. Sub-byte and complex formats are known (so a
header using them is valid) but skipped with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    kind: str  # "float", "int", "bool", "complex"
    fittable: bool

    def nbytes(self, numel: int) -> int | None:
        """Storage size of `numel` elements, or None when it is not a whole number of bytes."""
        total_bits = numel * self.bits
        return total_bits // 8 if total_bits % 8 == 0 else None


_TABLE = [
    DType("BOOL", 8, "bool", False),
    DType("U8", 8, "int", False),
    DType("I8", 8, "int", False),
    DType("U16", 16, "int", False),
    DType("I16", 16, "int", False),
    DType("U32", 32, "int", False),
    DType("I32", 32, "int", False),
    DType("U64", 64, "int", False),
    DType("I64", 64, "int", False),
    DType("F16", 16, "float", True),
    DType("BF16", 16, "float", True),
    DType("F32", 32, "float", True),
    DType("F64", 64, "float", True),
    DType("F8_E4M3", 8, "float", True),
    DType("F8_E5M2", 8, "float", True),
    DType("F8_E4M3FNUZ", 8, "float", False),
    DType("F8_E5M2FNUZ", 8, "float", False),
    DType("F8_E8M0", 8, "float", False),
    DType("F6_E2M3", 6, "float", False),
    DType("F6_E3M2", 6, "float", False),
    DType("F4", 4, "float", False),
    DType("C64", 64, "complex", False),
]

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}


def skip_reason(dtype: DType) -> str:
    """Why a tensor of this dtype is not fitted (for the row's `skipped` list)."""
    if dtype.kind in ("int", "bool"):
        return f"non-float dtype {dtype.name}"
    if dtype.kind == "other":  # torch-only types (complex128, quantized, sparse) from .bin checkpoints
        return f"unsupported tensor type {dtype.name}"
    return f"float format {dtype.name} is not supported for fitting yet"

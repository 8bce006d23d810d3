"""Value tables of the element types quantized weights use, and companions decoded to float32.

Every table is float32 (what the formats' own dequantizers compute in) and indexed by the stored
code. FP8 comes from the one code table (engine.codes); the rest are small and defined here from
their specifications:
- FP4 E2M1 (OCP Microscaling Formats (MX) v1.0 spec, Table 5; NVFP4 and MXFP4 element type):
  codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and bit 3 is the sign.
- E8M0 (the same spec, Sec. 5.4.1): 2^(code - 127), code 255 is NaN; a scale, never a value.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..codes import code_values
from ..dtypes import DTYPES

FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


@cache
def fp4_e2m1_table() -> np.ndarray:
    """float32 value of each 4-bit E2M1 code (read-only)."""
    table = np.concatenate([FP4_E2M1, -FP4_E2M1]).astype(np.float32)
    table.setflags(write=False)
    return table


@cache
def e8m0_table() -> np.ndarray:
    """float32 value of each E8M0 scale code: 2^(c - 127); 0 gives 2^-127 (subnormal in float32), 255 NaN."""
    exps = np.arange(256, dtype=np.float64) - 127.0
    exps[255] = 0.0  # NaN below; 2^128 would overflow the cast
    table = np.exp2(exps).astype(np.float32)
    table[255] = np.nan
    table.setflags(write=False)
    return table


@cache
def code_table_f32(dtype: str) -> np.ndarray:
    """float32 value of every code of an 8-bit float type (FP8 E4M3/E5M2, E8M0)."""
    if dtype == "F8_E8M0":
        return e8m0_table()
    with np.errstate(invalid="ignore", over="ignore"):
        table = code_values(dtype).astype(np.float32)
    table.setflags(write=False)
    return table


def as_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A companion tensor's stored bytes (uint8, flat) as float32 values (flat, new array)."""
    if dtype in ("F32",):
        return raw.view("<f4").astype(np.float32)
    if dtype == "F16":
        return raw.view("<f2").astype(np.float32)
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F64":
        return raw.view("<f8").astype(np.float32)
    if dtype in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):
        return code_table_f32(dtype)[raw]
    raise ValueError(f"a {dtype} companion has no float values")


def as_integers(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A companion's stored bytes as its integer elements (a view when possible)."""
    kind = DTYPES[dtype]
    if kind.kind not in ("int", "bool"):
        raise ValueError(f"a {dtype} companion is not an integer tensor")
    return raw.view(kind.numpy)

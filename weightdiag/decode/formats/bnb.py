"""bitsandbytes weights as transformers saves them: 4-bit NF4/FP4 (QLoRA) and LLM.int8.

bnb-4bit (`Linear4bit`, `Params4bit`; saved by `Linear4bit._save_to_state_dict` with
`QuantState.as_dict(packed=True)`): `X.weight` holds two 4-bit codes per byte, the FIRST element
in the HIGH nibble, over the row-major logical matrix `quant_state["shape"]`; every `blocksize`
consecutive flat elements share one absmax. We follow bitsandbytes 0.50 `functional.py`
(`dequantize_4bit`, `dequantize_blockwise`) and its CPU kernels (`csrc/cpu_ops.cpp`
`dequantizeBlockwise4bitCpu`, `dequantizeBlockwise8bitCpu`; `backends/default/ops.py`
`_dequantize_4bit_compute`), all in float32:
    absmax[b] = absmax_f32[b]                                                  (plain)
    absmax[b] = fl(fl(nested_quant_map[absmax_u8[b]] * nested_absmax[b // nested_blocksize]) + nested_offset)
                                                                              (double quantization)
    value[i]  = fl(table[code[i]] * absmax[i // blocksize])
`table` is bitsandbytes' built-in code table of the quant type (`get_4bit_type`: NF4's 16 normal
quantiles, FP4's [0, 0.0625, 8, 12, 4, 6, 2, 3] / 12 with bit 3 the sign), which its dequantizers
use whatever the stored `quant_map` says; we check that the stored one is that table. FP4 code 8
(negative zero) gives +0.0 as `get_4bit_type`, the AVX-512 kernel and the torch kernel have it (the
scalar C kernel writes -0.0; |w| is the same). Blocks are flat: bitsandbytes 0.50's AVX-512 CPU
kernel indexes absmax per row instead (wrong when in_features is not a multiple of blocksize); we
follow the quantizer, the CUDA kernels and the torch kernel. The stream is flat: an odd in_features puts a row
boundary inside a byte, and an odd element count leaves the last byte's low nibble as padding. The values are
the float32 products, before bitsandbytes casts them to `quant_state["dtype"]` (bf16/fp16 in most
checkpoints): as if that dtype were float32.

bnb-int8 (`Linear8bitLt`, `Int8Params`): `X.weight` I8 [out, in] and `X.SCB` F32 [out] (the row's
absmax); `X.weight_format` is ignored. bitsandbytes `_ops.py` `int8_vectorwise_dequant` (the only
kernel; transformers' `dequantize_bnb_weight` calls it or writes the same expression):
    value = fl(fl(float(A) * SCB[row]) * float32(7.874015718698502e-3))   (torch's float32 * Python scalar)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import CheckpointFormatError
from ...source.plan import Quantized
from ..decoder import Companion, Companions, RowMajorDecoder, check_shape, register
from ..values import as_float32

# bitsandbytes functional.get_4bit_type("nf4"): float32 literals.
NF4_TABLE = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    dtype=np.float32,
)
# bitsandbytes functional.get_4bit_type("fp4"): sign bit 3, 2 exponent bits (bias 2), 1 mantissa bit,
# divided by its largest magnitude (12) in float32.
FP4_TABLE = np.array(
    [0, 0.0625, 8, 12, 4, 6, 2, 3, 0, -0.0625, -8, -12, -4, -6, -2, -3], dtype=np.float32
) / np.float32(12.0)
TABLES = {"nf4": NF4_TABLE, "fp4": FP4_TABLE}
INT8_RECIPROCAL = np.float32(7.874015718698502e-3)  # bitsandbytes' 1/127, as torch rounds it for a float32 tensor

_QS_KEYS = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize", "nested_dtype", "nested_offset"}


def _bad(message: str, name: str | None = None) -> CheckpointFormatError:
    return CheckpointFormatError(message, file=name)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def parse_quant_state(raw: bytes, name: str | None = None) -> dict[str, Any]:
    """bitsandbytes' packed quant state (`X.weight.quant_state.bitsandbytes__nf4`: UTF-8 JSON) as
    {"quant_type": "nf4"|"fp4", "blocksize": int, "dtype": str, "shape": tuple, "nested": bool,
    "nested_blocksize": int|None, "nested_offset": float|None}; CheckpointFormatError on anything else."""
    where = f"{name}: " if name else ""
    try:
        state = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _bad(f"{where}bitsandbytes quant_state is not UTF-8 JSON; the checkpoint is damaged", name) from None
    if not isinstance(state, dict):
        raise _bad(f"{where}bitsandbytes quant_state is not a JSON object; the checkpoint is damaged", name)
    unknown = sorted(set(state) - _QS_KEYS)
    if unknown:
        raise _bad(f"{where}bitsandbytes quant_state has unknown fields {unknown}; weightdiag cannot decode it", name)
    quant_type = state.get("quant_type")
    if quant_type not in TABLES:
        raise _bad(
            f"{where}bitsandbytes quant_type {quant_type!r} is not nf4 or fp4; weightdiag cannot decode it", name
        )
    blocksize = state.get("blocksize")
    if not _positive_int(blocksize):
        raise _bad(
            f"{where}bitsandbytes blocksize {blocksize!r} is not a positive integer; the checkpoint is damaged", name
        )
    shape = state.get("shape")
    if not isinstance(shape, list) or not shape or not all(_positive_int(d) for d in shape):
        raise _bad(
            f"{where}bitsandbytes quant_state shape {shape!r} is not a list of sizes; the checkpoint is damaged", name
        )
    dtype = state.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise _bad(f"{where}bitsandbytes quant_state dtype {dtype!r} is not a name; the checkpoint is damaged", name)
    nested = any(k in state for k in ("nested_blocksize", "nested_dtype", "nested_offset"))
    nested_blocksize = nested_offset = None
    if nested:
        nested_blocksize = state.get("nested_blocksize")
        nested_offset = state.get("nested_offset")
        if not _positive_int(nested_blocksize):
            raise _bad(f"{where}bitsandbytes nested_blocksize {nested_blocksize!r} is not a positive integer", name)
        if (
            not isinstance(nested_offset, (int, float))
            or isinstance(nested_offset, bool)
            or not math.isfinite(nested_offset)
        ):
            raise _bad(f"{where}bitsandbytes nested_offset {nested_offset!r} is not a finite number", name)
        if state.get("nested_dtype", "float32") != "float32":
            raise _bad(
                f"{where}bitsandbytes nested_dtype {state.get('nested_dtype')!r} is not float32; "
                "weightdiag cannot decode it exactly",
                name,
            )
        nested_offset = float(nested_offset)
    return {
        "quant_type": quant_type,
        "blocksize": blocksize,
        "dtype": dtype,
        "shape": tuple(shape),
        "nested": nested,
        "nested_blocksize": nested_blocksize,
        "nested_offset": nested_offset,
    }


def _params(q: Quantized, companions: Companions) -> Mapping[str, Any]:
    name = q.codes.name
    if "quant_state" in companions:
        state = parse_quant_state(companions["quant_state"].raw.tobytes(), name)
        if tuple(state["shape"]) != tuple(q.logical_shape):
            raise _bad(
                f"{name}: bitsandbytes quant_state shape {list(state['shape'])} differs from the weight's "
                f"{list(q.logical_shape)}; the checkpoint is damaged",
                name,
            )
        return state
    params = q.spec.params
    if params.get("quant_type") not in TABLES or not _positive_int(params.get("blocksize")):
        raise _bad(f"{name}: a bitsandbytes 4-bit weight without its quant_state; the checkpoint is damaged", name)
    return params


def _companion(companions: Companions, role: str, name: str) -> Companion:
    if role not in companions:
        raise _bad(f"{name}: bitsandbytes weight without its {role}; the checkpoint is damaged", name)
    return companions[role]


class Bnb4bit(RowMajorDecoder):
    """NF4/FP4 codes, two per byte (high nibble first), times a flat-block absmax."""

    bits = 4
    unit_bytes = 1

    def __init__(self, q: Quantized, companions: Companions) -> None:
        # Not RowMajorDecoder.__init__, which refuses rows that end inside a byte: bitsandbytes packs the flattened
        # matrix two codes a byte whatever in_features is (an odd one too: its dequantize_4bit decodes that stream,
        # which weightdiag refused before issue 33), and decode() below walks the same flat stream.
        shape = q.logical_shape
        self.rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        self.cols = shape[-1]
        self.name = name = q.codes.name
        params = _params(q, companions)
        self.blocksize = bs = int(params["blocksize"])
        self.quant_type = params["quant_type"]
        self.numel = n = math.prod(q.logical_shape)
        if q.codes.nbytes != (n + 1) // 2:
            raise _bad(
                f"{name}: {q.codes.nbytes} bytes of 4-bit codes for {n} elements, expected {(n + 1) // 2}; "
                "the checkpoint is damaged",
                name,
            )
        blocks = -(-n // bs)
        table = TABLES[self.quant_type]
        if "quant_map" in companions:
            qmap = companions["quant_map"]
            check_shape(name, "quant_map", qmap, (16,))
            stored = as_float32(qmap.raw, qmap.dtype)
            if not np.array_equal(stored, table):
                raise _bad(
                    f"{name}: its quant_map is not bitsandbytes' {self.quant_type} code table; "
                    "weightdiag cannot decode it exactly",
                    name,
                )
        absmax = _companion(companions, "absmax", name)
        check_shape(name, "absmax", absmax, (blocks,))
        if params.get("nested"):
            nbs = int(params["nested_blocksize"])
            if absmax.dtype != "U8":
                raise _bad(f"{name}: a double-quantized absmax stored as {absmax.dtype}, expected U8", name)
            nested = _companion(companions, "nested_absmax", name)
            check_shape(name, "nested_absmax", nested, (-(-blocks // nbs),))
            nmap = _companion(companions, "nested_quant_map", name)
            check_shape(name, "nested_quant_map", nmap, (256,))
            nested_scale = as_float32(nested.raw, nested.dtype)
            codes = as_float32(nmap.raw, nmap.dtype)[absmax.raw.view(np.uint8)]
            scale = np.repeat(nested_scale, nbs)[:blocks]
            with np.errstate(over="ignore", invalid="ignore"):
                self.absmax = (codes * scale) + np.float32(params["nested_offset"])
        else:
            if absmax.dtype == "U8":
                raise _bad(f"{name}: a U8 absmax without bitsandbytes' nested quant state", name)
            self.absmax = as_float32(absmax.raw, absmax.dtype)
        # Each byte's two values (high nibble, low nibble) as one 8-byte entry: one gather per byte.
        byte = np.arange(256)
        pairs = np.stack([table[byte >> 4], table[byte & 15]], axis=1).astype(np.float32)
        self.pairs = np.ascontiguousarray(pairs).view(np.uint64).reshape(256)

    def decode(self, raw: np.ndarray, byte_lo: int) -> tuple[np.ndarray, int]:
        first = byte_lo * 2
        # An odd element count ends on half a byte: its low nibble is padding, not an element.
        out = self.pairs[raw].view(np.float32)[: max(0, self.numel - first)]
        bs, count = self.blocksize, out.size
        b = first // bs
        head = min((-first) % bs, count)
        with np.errstate(over="ignore", invalid="ignore"):
            if head:
                out[:head] *= self.absmax[b]
                b += 1
            full = (count - head) // bs
            if full:
                out[head : head + full * bs].reshape(full, bs)[...] *= self.absmax[b : b + full, None]
                b += full
            tail = head + full * bs
            if tail < count:
                out[tail:] *= self.absmax[b]
        return out, first


class BnbInt8(RowMajorDecoder):
    """LLM.int8 row-wise codes: A * SCB[row] / 127 as bitsandbytes computes it."""

    bits = 8
    unit_bytes = 1

    def __init__(self, q: Quantized, companions: Companions) -> None:
        super().__init__(q, companions)
        scb = _companion(companions, "scb", self.name)
        check_shape(self.name, "SCB", scb, (self.rows,))
        self.scb = as_float32(scb.raw, scb.dtype)

    def rect(self, raw: np.ndarray, row0: int, row1: int, col0: int, col1: int, out: np.ndarray) -> None:
        np.copyto(out, raw.view(np.int8).reshape(out.shape), casting="unsafe")
        with np.errstate(over="ignore", invalid="ignore"):
            out *= self.scb[row0:row1, None]
            out *= INT8_RECIPROCAL


register("bnb-4bit")(Bnb4bit)
register("bnb-int8")(BnbInt8)

"""ggml's quantized block formats -> float32 values: the block math of GGUF tensors (llama.cpp).

Each function follows ggml's block layout (ggml-common.h, and dequantize_row_* in ggml-quants.c):
`blocks` is (n, block bytes) uint8, `out` (n, block elements) float32. Results are bit-identical to
ggml's reference dequantization (tests compare with the `gguf` package's gguf/quants.py, 0.19.0).
The decoder that streams GGUF tensors through these is weightdiag.decode.formats.gguf.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import tuning
from ..source.gguf import GGML_BY_NAME

_NIBBLE_SHIFT = np.array([0, 4], dtype=np.uint8)
_CRUMB_SHIFT = np.array([0, 2, 4, 6], dtype=np.uint8)
_BIT_SHIFT = np.arange(8, dtype=np.uint8)
_IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
_MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)  # e2m1 x 2


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte `at` of every block, as an (n, 1) float32 column."""
    return blocks[:, at : at + 2].view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) codes: low nibbles are elements 0..15, high nibbles 16..31."""
    return ((qs[:, None, :] >> _NIBBLE_SHIFT[None, :, None]) & 15).reshape(len(qs), -1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of a little-endian u32 -> (n, 32) bits, bit j for element j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q4_0(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = _nibbles(blocks[:, 2:])
    out -= 8
    out *= _f16(blocks, 0)


def _q4_1(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = _nibbles(blocks[:, 4:])
    out *= _f16(blocks, 0)
    out += _f16(blocks, 2)


def _q5_0(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = _nibbles(blocks[:, 6:]) | (_high_bits(blocks[:, 2:6]) << 4)
    out -= 16
    out *= _f16(blocks, 0)


def _q5_1(blocks: np.ndarray, out: np.ndarray) -> None:
    out[:] = _nibbles(blocks[:, 8:]) | (_high_bits(blocks[:, 4:8]) << 4)
    out *= _f16(blocks, 0)
    out += _f16(blocks, 2)


def _q8_0(blocks: np.ndarray, out: np.ndarray) -> None:
    np.multiply(blocks[:, 2:].view(np.int8), _f16(blocks, 0), out=out)


def _iq4_nl(blocks: np.ndarray, out: np.ndarray) -> None:
    np.take(_IQ4_VALUES, _nibbles(blocks[:, 2:]), out=out)
    out *= _f16(blocks, 0)


def _mxfp4(blocks: np.ndarray, out: np.ndarray) -> None:
    # e8m0 scale: 2^(e - 127), halved because the value table is doubled.
    scale = np.ldexp(np.float32(1), blocks[:, :1].astype(np.int32) - 128)
    np.take(_MXFP4_VALUES, _nibbles(blocks[:, 1:]), out=out)
    out *= scale


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, each (n, 8) uint8."""
    lo, hi, top = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (top & 15) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=1)
    return sc, mn


def _q2_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n, s = len(blocks), blocks[:, 0:16]
    # Element 128h + 32j + l takes bits 2j..2j+1 of qs[32h + l]; scale (and min) index is element // 16.
    q = (blocks[:, 16:80].reshape(n, 2, 1, 32) >> _CRUMB_SHIFT[None, None, :, None]) & 3
    dl = (_f16(blocks, 80) * (s & 15)).reshape(n, 16, 1)
    ml = (_f16(blocks, 82) * (s >> 4)).reshape(n, 16, 1)
    o = out.reshape(n, 16, 16)
    o[:] = q.reshape(n, 16, 16)
    o *= dl
    o -= ml


def _q3_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    hmask, qs, s = blocks[:, 0:32], blocks[:, 32:96], blocks[:, 96:108]
    # Sixteen 6-bit signed scales: low 4 bits from bytes 0..7 (low then high nibbles), top 2 bits
    # from bytes 8..11 (bit pairs 0..3 in turn).
    low = ((s[:, None, 0:8] >> _NIBBLE_SHIFT[None, :, None]) & 15).reshape(n, 16)
    high = ((s[:, None, 8:12] >> _CRUMB_SHIFT[None, :, None]) & 3).reshape(n, 16)
    scale = (low | (high << 4)).astype(np.int8) - np.int8(32)
    q = ((qs.reshape(n, 2, 1, 32) >> _CRUMB_SHIFT[None, None, :, None]) & 3).astype(np.int8)
    # A clear hmask bit (bit 4h + j of hmask[l]) subtracts 4.
    h = (hmask[:, None, :] >> _BIT_SHIFT[None, :, None]) & 1
    q -= ((h ^ 1) << 2).astype(np.int8).reshape(n, 2, 4, 32)
    o = out.reshape(n, 16, 16)
    o[:] = q.reshape(n, 16, 16)
    o *= (_f16(blocks, 108) * scale).reshape(n, 16, 1)


def _q45_k(blocks: np.ndarray, out: np.ndarray, qs_at: int, qh: np.ndarray | None) -> None:
    n = len(blocks)
    sc, mn = _k_scales(blocks[:, 4:16])
    # Four 32-byte chunks: low nibbles are sub-block 2c, high nibbles sub-block 2c + 1.
    q = (blocks[:, qs_at:].reshape(n, 4, 1, 32) >> _NIBBLE_SHIFT[None, None, :, None]) & 15
    q = q.reshape(n, 8, 32)
    if qh is not None:  # Q5_K: bit j of qh[l] is the fifth bit of element l of sub-block j
        q |= ((qh[:, None, :] >> _BIT_SHIFT[None, :, None]) & 1) << 4
    o = out.reshape(n, 8, 32)
    o[:] = q
    o *= (_f16(blocks, 0) * sc).reshape(n, 8, 1)
    o -= (_f16(blocks, 2) * mn).reshape(n, 8, 1)


def _q4_k(blocks: np.ndarray, out: np.ndarray) -> None:
    _q45_k(blocks, out, 16, None)


def _q5_k(blocks: np.ndarray, out: np.ndarray) -> None:
    _q45_k(blocks, out, 48, blocks[:, 16:48])


def _q6_k(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    # Per 128-element half h: low 4 bits from ql[64h : 64h + 64] (low nibbles first), top 2 bits
    # from bit pair j of qh[32h + l] for element 32j + l; scale index is element // 16.
    low = (blocks[:, 0:128].reshape(n, 2, 1, 64) >> _NIBBLE_SHIFT[None, None, :, None]) & 15
    high = (blocks[:, 128:192].reshape(n, 2, 1, 32) >> _CRUMB_SHIFT[None, None, :, None]) & 3
    q = (low.reshape(n, 2, 128) | (high.reshape(n, 2, 128) << 4)).astype(np.int8) - np.int8(32)
    o = out.reshape(n, 16, 16)
    o[:] = q.reshape(n, 16, 16)
    o *= (_f16(blocks, 208) * blocks[:, 192:208].view(np.int8)).reshape(n, 16, 1)


def _iq4_xs(blocks: np.ndarray, out: np.ndarray) -> None:
    n = len(blocks)
    # Eight sub-blocks of 32: 6-bit scale = nibble of scales_l | bit pair of the u16 scales_h, minus 32.
    low = ((blocks[:, None, 4:8] >> _NIBBLE_SHIFT[None, :, None]) & 15).transpose(0, 2, 1).reshape(n, 8)
    sh = blocks[:, 2:4].view("<u2").astype(np.uint16)
    high = (sh >> (2 * np.arange(8, dtype=np.uint16))) & 3
    scale = (low | (high << 4)).astype(np.int16) - np.int16(32)
    o = out.reshape(n, 8, 32)
    np.take(_IQ4_VALUES, _nibbles(blocks[:, 8:].reshape(n * 8, 16)).reshape(n, 8, 32), out=o)
    o *= (_f16(blocks, 0) * scale).reshape(n, 8, 1)


DECODERS: dict[str, Callable[[np.ndarray, np.ndarray], None]] = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
    "MXFP4": _mxfp4,
}


def dequantize(raw: np.ndarray, type_name: str, out: np.ndarray | None = None) -> np.ndarray:
    """Stored bytes of a quantized tensor -> float32 values (flat), into `out` when given."""
    t = GGML_BY_NAME[type_name]
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, t.size)
    if out is None:
        out = np.empty(len(blocks) * t.block, dtype=np.float32)
    per_chunk = max(1, tuning.current().decode_chunk // t.size)
    dst = out.reshape(-1, t.block)
    with np.errstate(all="ignore"):  # random or damaged scales may overflow: inf/nan, not errors
        for i in range(0, len(blocks), per_chunk):
            DECODERS[type_name](blocks[i : i + per_chunk], dst[i : i + per_chunk])
    return out

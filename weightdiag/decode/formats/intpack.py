"""compressed-tensors `pack-quantized` integers: 2-, 4- or 8-bit codes packed into I32 words.

Follows compressed-tensors 0.20 (compressors/pack_quantized/helpers.py, pack_to_int32 and
unpack_from_int32; quantization/lifecycle/forward_helpers.py, _dequantize):
- a row's elements are packed along the row, element i at bit i * bits of the row's little-endian
  bit stream (4-bit: byte i // 2, low nibble first), each stored as q + 2^(bits-1) (q signed);
- asymmetric zero points are packed the same way along the OUTPUT dimension (weight_zero_point
  [ceil(out * bits / 32), groups]), also offset by 2^(bits-1);
- value = (q - zero) * scale, one scale (and zero) per group of `group` columns of a row (strategy
  group), per row (channel) or per tensor; with activation ordering a column's group is g_idx[col].
compressed-tensors computes in the scale's dtype (BF16/F16); here the same operands are taken to
float32 first (the decoder contract): q - zero is a small integer, so each value is one rounding of
the exact product.

Codes are counted per (scale, zero) slot and code (the counting path): scale and zero pairs are
deduplicated per piece, so a group-128 INT4 weight needs a few hundred slots, not one per group.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import CheckpointFormatError
from ...source.plan import Quantized
from ..decoder import Companion, Companions, RowMajorDecoder, check_shape, register
from ..values import as_float32, as_integers

CODE_BITS = (2, 4, 8)  # elements never straddle a byte: the row-major byte decoder applies


def unpack_rows(raw: np.ndarray, rows: int, bits: int, count: int) -> np.ndarray:
    """Densely packed unsigned `bits`-bit elements (any width 1-8) of `rows` equal rows of stored bytes:
    the first `count` elements of each row, as int32 [rows, count]."""
    stream = np.unpackbits(raw.reshape(rows, -1), axis=1, bitorder="little")[:, : count * bits]
    weights = (1 << np.arange(bits, dtype=np.int32)).astype(np.int32)
    return stream.reshape(rows, count, bits).astype(np.int32) @ weights


def unpack_codes(raw: np.ndarray, bits: int) -> np.ndarray:
    """Stored bytes -> one uint8 code per element, in order (bits 2, 4 or 8; lowest bits first)."""
    if bits == 8:
        return raw
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    return ((raw[..., None] >> shifts) & ((1 << bits) - 1)).reshape(*raw.shape[:-1], -1)


def _shape_values(companion: Companion) -> tuple[int, ...]:
    return tuple(int(x) for x in as_integers(companion.raw, companion.dtype))


DIRECT_KEYS = 1 << 21  # keys below this are deduplicated through a presence table, not a sort


def _dedup(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slot of each key as int32, index of an occurrence of each slot's key): distinct keys numbered."""
    if keys.size and keys.min() >= 0 and keys.max() < DIRECT_KEYS:  # 16-bit scales (and a 4-bit zero point)
        present = np.zeros(int(keys.max()) + 1, dtype=bool)
        present[keys] = True
        distinct = np.flatnonzero(present)
        number = np.zeros(present.size, dtype=np.int32)
        number[distinct] = np.arange(distinct.size, dtype=np.int32)
        where = np.zeros(present.size, dtype=np.intp)
        where[keys] = np.arange(keys.size)  # any occurrence: a key's occurrences share one (scale, zero)
        return number[keys], where[distinct]
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return inverse.astype(np.int32), first


@register("int-pack")
class PackedInt(RowMajorDecoder):
    unit_bytes = 1

    def __init__(self, q: Quantized, companions: Companions) -> None:
        self.bits = q.spec.bits
        if self.bits not in CODE_BITS:
            raise CheckpointFormatError(
                f"{q.codes.name}: {self.bits}-bit packed integers straddle bytes; weightdiag reads 2-, 4- and 8-bit",
                file=q.codes.name,
            )
        super().__init__(q, companions)
        name, rows, cols = self.name, self.rows, self.cols
        if "shape" in companions:  # weight_shape: the logical shape; rows padded to whole words are not read
            stored = _shape_values(companions["shape"])
            if math.prod(stored) != rows * cols:
                raise CheckpointFormatError(
                    f"{name}: weight_shape {list(stored)} is not the {rows} x {cols} its packed words hold "
                    "(rows padded to whole words, or a damaged checkpoint); weightdiag cannot decode it",
                    file=name,
                )
        self.offset = 1 << (self.bits - 1)
        scale = companions["scale"]
        n_scale = math.prod(scale.shape)
        g_idx = companions.get("g_idx")
        self.g_idx: np.ndarray | None = None
        if g_idx is not None:
            check_shape(name, "g_idx", g_idx, (cols,))
            self.g_idx = as_integers(g_idx.raw, g_idx.dtype).astype(np.intp)
            groups = n_scale // rows if rows else 0
            if self.g_idx.size and (self.g_idx.min() < 0 or self.g_idx.max() >= max(groups, 1)):
                raise CheckpointFormatError(f"{name}: its g_idx names groups it has no scale for", file=name)
            self.group = 0
            grid = (rows, groups)
        elif n_scale == 1:  # per tensor
            self.group, grid = cols, (1, 1)
        else:
            group = q.spec.group or cols
            self.group, grid = group, (rows, math.ceil(cols / group))
        check_shape(name, "scale", scale, grid)
        self.tensor_wide = grid == (1, 1) and rows > 1
        self.scales = as_float32(scale.raw, scale.dtype).reshape(grid)
        self.scale_bits = scale.raw.view(np.uint8).reshape(*grid, -1)  # the scale's stored bytes: slot keys
        self.zeros: np.ndarray | None = None
        if "zero" in companions:
            self.zeros = self._zero_points(companions["zero"], grid)
            lowest = int(self.zeros.min()) if self.zeros.size else 0
            self.zero_keys = (self.zeros - lowest).astype(np.int64)  # slot keys: scale bytes, then this
            self.zero_bits = int(self.zero_keys.max()).bit_length() if self.zeros.size else 0
        if self.g_idx is None and self.bits in (4, 8):
            self.group_cols = self.group  # the counting path

    def _zero_points(self, zero: Companion, grid: tuple[int, int]) -> np.ndarray:
        """Zero points as signed integers [grid]: packed along the output dimension (I32), or stored plain."""
        rows, groups = grid
        if zero.dtype == "I32" and math.prod(zero.shape) != rows * groups:
            words = math.ceil(rows * self.bits / 32)
            check_shape(self.name, "zero point", zero, (words, groups))
            by_group = zero.raw.view("<i4").reshape(words, groups).T.copy()  # [groups, words]: rows packed
            values = unpack_rows(by_group.view(np.uint8), groups, self.bits, rows).T
            return (values - self.offset).astype(np.float32)
        check_shape(self.name, "zero point", zero, grid)
        return as_integers(zero.raw, zero.dtype).astype(np.float32).reshape(grid)

    def _rows(self, row0: int, row1: int) -> slice | np.ndarray:
        return np.zeros(row1 - row0, dtype=np.intp) if self.tensor_wide else slice(row0, row1)

    def rect(self, raw: np.ndarray, row0: int, row1: int, col0: int, col1: int, out: np.ndarray) -> None:
        codes = unpack_codes(raw.reshape(row1 - row0, -1), self.bits)
        np.subtract(codes, np.float32(self.offset), out=out, dtype=np.float32)
        rows = self._rows(row0, row1)
        if self.g_idx is not None:
            groups = self.g_idx[col0:col1]
        else:
            groups = (np.arange(col0, col1) // self.group).astype(np.intp)
        if self.zeros is not None:
            out -= self.zeros[rows][:, groups]
        out *= self.scales[rows][:, groups]

    def slot_table(self, row0: int, row1: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots: the distinct (scale, zero) pairs of the rows; values: (code - offset - zero) * scale."""
        rows = self._rows(row0, row1)
        scale_bits = self.scale_bits[rows]
        keys = np.zeros(scale_bits.shape[:2], dtype=np.int64)
        for byte in range(scale_bits.shape[2]):
            keys = (keys << 8) | scale_bits[:, :, byte]
        if self.zeros is not None:
            keys = (keys << self.zero_bits) | self.zero_keys[rows]
        slots, first = _dedup(keys.reshape(-1))
        scales = self.scales[rows].reshape(-1)[first]
        codes = np.arange(1 << self.bits, dtype=np.float32) - np.float32(self.offset)
        table = np.broadcast_to(codes, (first.size, codes.size)).copy()
        if self.zeros is not None:
            table -= self.zeros[rows].reshape(-1)[first][:, None]
        table *= scales[:, None]
        return slots.reshape(keys.shape), table

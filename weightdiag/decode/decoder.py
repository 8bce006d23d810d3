"""Decoders: a quantized weight's stored bytes plus its companions -> float32 values, chunk by chunk.

The engine streams a quantized weight's packed codes in pieces (byte ranges cut at fixed offsets,
see weightdiag.source.chunks) and hands each piece to the weight's decoder, built once per weight from its
companions (small: scales, zero points, group indices). A decoder returns the piece's values as
float32 in *decoded order* (for row-major formats the logical row-major order; GPTQ's and AWQ's
transposed packing decode in their storage order) and says how that order maps to the logical
[rows, columns] matrix, so super-weight coordinates and fused-part selections stay right.

Every value is computed as the format's own dequantizer computes it, in float32 (each format
module names the source it follows); the reduction then treats them as an F32 tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from ..errors import CheckpointFormatError
from ..segments import Segments
from ..source.plan import Quantized


@dataclass(frozen=True)
class Companion:
    """One companion tensor as loaded: its stored bytes, dtype name and shape."""

    raw: np.ndarray  # uint8, flat
    dtype: str
    shape: tuple[int, ...]


Companions = Mapping[str, Companion]


@dataclass(frozen=True)
class Counted:
    """A piece counted instead of decoded: per (slot, code) entry, its float32 value and how many elements
    hold it (zeros allowed), and how to find the first element holding one of a set of entries."""

    values: np.ndarray  # float32, one per entry (any shape; read flat)
    weights: np.ndarray  # int64, the same shape
    numel: int
    first: int  # decoded index of the piece's first element
    locate: Callable[[np.ndarray], int]  # entries wanted (bool, flat) -> decoded index of the first element


class Decoder(Protocol):
    """What every format's decoder answers (one class per format, registered in FACTORIES)."""

    # Pieces start at multiples of this many stored bytes: the engine cuts at 8-byte multiples, and at multiples of
    # Quantized.unit_bytes where a weight sets it (GGUF blocks), which a decoder's unit_bytes then equals.
    unit_bytes: int
    # True: decoded order is the logical row-major order, so any selection of elements (a fused part, a
    # view cut from the matrix) can be reduced; False: only selections of whole logical rows.
    any_selection: ClassVar[bool]
    # What the decoder found worth saying in its weight's record (GPTQ v1 zero points its libraries read two
    # ways), else None.
    note: str | None

    def __init__(self, q: Quantized, companions: Companions) -> None: ...

    def counts(self, raw: np.ndarray, byte_lo: int) -> Counted | None:
        """The piece counted per scale group and code (the fast path), or None where the format has none."""
        ...

    def decode(self, raw: np.ndarray, byte_lo: int) -> tuple[np.ndarray, int]:
        """float32 values of the stored bytes [byte_lo, byte_lo + raw.size), in decoded order, and the
        decoded index of the first one (values in the TensorRef's own dtype where it is not F32: rows of a
        GGUF F16 tensor that are only reordered)."""
        ...

    def logical_index(self, index: int) -> int:
        """The logical (row-major) flat index of a decoded index."""
        ...

    @classmethod
    def decoded_positions(cls, q: Quantized, logical: np.ndarray) -> np.ndarray:
        """The decoded indices (int64) of logical flat positions: where the stream meets them (the lineage
        samples are gathered in decoded order; built from `q` alone, before any companion is read)."""
        ...

    def selection(self, rows: Segments) -> Segments:
        """A selection of whole logical rows (a fused part), as a selection in decoded order."""
        ...


def row_rects(first: int, count: int, cols: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Cover the row-major elements [first, first + count) of a matrix with `cols` columns by at most
    three rectangles (row0, row1, col0, col1, offset of the rectangle's first element in the range)."""
    end = first + count
    r, c = divmod(first, cols)
    offset = 0
    if c and first < end:  # a partial first row
        stop = min(cols, c + end - first)
        yield r, r + 1, c, stop, 0
        offset = stop - c
        r += 1
    full = (end - (first + offset)) // cols
    if full > 0:
        yield r, r + full, 0, cols, offset
        offset += full * cols
        r += full
    if first + offset < end:  # a partial last row
        yield r, r + 1, 0, end - first - offset, offset


def scale_columns(values: np.ndarray, scales: np.ndarray, group: int, col0: int) -> None:
    """values[i, j] *= scales[i, (col0 + j) // group], in place (values: float32 [rows, n] C-contiguous)."""
    rows, n = values.shape
    if col0 % group == 0 and n % group == 0:  # the usual case: whole groups, a broadcast multiply
        first = col0 // group
        values.reshape(rows, n // group, group)[...] *= scales[:, first : first + n // group, None]
        return
    groups = (np.arange(col0, col0 + n) // group).astype(np.intp)
    values *= scales[:, groups]


def subtract_columns(values: np.ndarray, zeros: np.ndarray, group: int, col0: int) -> None:
    """values[i, j] -= zeros[i, (col0 + j) // group], in place."""
    groups = (np.arange(col0, col0 + values.shape[1]) // group).astype(np.intp)
    values -= zeros[:, groups]


class RowMajorDecoder:
    """Base of decoders whose stored elements are in logical row-major order (all but GPTQ and AWQ).

    Subclasses set `bits` (stored bits per element) and implement `rect`, which decodes whole
    rectangles of the logical matrix [rows, cols].
    """

    bits: int = 8
    unit_bytes: int = 1
    any_selection: ClassVar[bool] = True
    note: str | None = None
    # The counting path: formats whose codes are bytes or nibbles, with one scale (and zero point) per
    # group of `group_cols` columns of a row, set these and implement `slot_table`; each piece is then
    # counted per (slot, code) by a C kernel and reduced from the counts, never decoded element by element.
    group_cols: int | None = None
    high_nibble_first = False  # 4-bit codes: which nibble holds a byte's first element

    def __init__(self, q: Quantized, companions: Companions) -> None:
        shape = q.logical_shape
        self.rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        self.cols = shape[-1]
        self.name = q.codes.name
        if (self.cols * self.bits) % 8:
            raise CheckpointFormatError(
                f"{self.name}: rows of {self.cols} {self.bits}-bit elements do not end on a byte; "
                "weightdiag cannot decode this layout",
                file=self.name,
            )

    def rect(self, raw: np.ndarray, row0: int, row1: int, col0: int, col1: int, out: np.ndarray) -> None:
        """Decode the stored bytes `raw` of rows [row0, row1) x columns [col0, col1) into `out` (float32 2-D)."""
        raise NotImplementedError

    def decode(self, raw: np.ndarray, byte_lo: int) -> tuple[np.ndarray, int]:
        first = byte_lo * 8 // self.bits
        count = raw.size * 8 // self.bits
        out = np.empty(count, dtype=np.float32)
        for row0, row1, col0, col1, offset in row_rects(first, count, self.cols):
            n = (row1 - row0) * (col1 - col0)
            part = raw[offset * self.bits // 8 : (offset + n) * self.bits // 8]
            self.rect(part, row0, row1, col0, col1, out[offset : offset + n].reshape(row1 - row0, col1 - col0))
        return out, first

    def logical_index(self, index: int) -> int:
        return index

    @classmethod
    def decoded_positions(cls, q: Quantized, logical: np.ndarray) -> np.ndarray:
        return np.asarray(logical, dtype=np.int64)

    def selection(self, rows: Segments) -> Segments:
        return rows

    def slot_table(self, row0: int, row1: int) -> tuple[np.ndarray, np.ndarray]:
        """For rows [row0, row1): (slots int32 [rows, column groups]: each group's slot; values float32
        [slots, codes]: the value each code has in each slot, computed exactly as `rect` computes it)."""
        raise NotImplementedError

    def counts(self, raw: np.ndarray, byte_lo: int) -> Counted | None:
        if self.group_cols is None:
            return None
        from .. import kernels

        bits, group = self.bits, self.group_cols
        first = byte_lo * 8 // bits
        count = raw.size * 8 // bits
        if count == 0:
            return None
        row_lo, row_hi = first // self.cols, (first + count - 1) // self.cols + 1
        slots, table = self.slot_table(row_lo, row_hi)
        ncodes = table.shape[1]
        out = np.zeros(table.size, dtype=np.int64)
        rects = list(row_rects(first, count, self.cols))
        for row0, row1, col0, col1, offset in rects:
            part = raw[offset * bits // 8 : (offset + (row1 - row0) * (col1 - col0)) * bits // 8]
            sub = slots[row0 - row_lo : row1 - row_lo, col0 // group :]
            kernels.count_slots(part.reshape(row1 - row0, -1), sub, col0, group, bits, ncodes, out)

        def locate(wanted: np.ndarray) -> int:
            return first + self._locate(raw, rects, slots, row_lo, wanted.reshape(table.shape))

        return Counted(table, out.reshape(table.shape), count, first, locate)

    def _locate(self, raw: np.ndarray, rects, slots: np.ndarray, row_lo: int, wanted: np.ndarray) -> int:
        """Offset in the piece of its first element whose (slot, code) is `wanted` (one is, by construction)."""
        from .. import kernels

        bits, group = self.bits, self.group_cols or 1
        for row0, row1, col0, col1, offset in rects:
            part = raw[offset * bits // 8 : (offset + (row1 - row0) * (col1 - col0)) * bits // 8]
            sub = slots[row0 - row_lo : row1 - row_lo, col0 // group :]
            at = kernels.locate_slots(
                part.reshape(row1 - row0, -1), sub, col0, group, bits, wanted, self.high_nibble_first
            )
            if at >= 0:
                return offset + at
        raise AssertionError("a counted value was not found in its piece")


DecoderFactory = type[Decoder]
FACTORIES: dict[str, DecoderFactory] = {}  # format id -> decoder class; filled by the modules of decode.formats


def register(fmt: str) -> Callable[[DecoderFactory], DecoderFactory]:
    def add(factory: DecoderFactory) -> DecoderFactory:
        FACTORIES[fmt] = factory
        return factory

    return add


def check_shape(name: str, role: str, companion: Companion, expected: tuple[int, ...]) -> None:
    """A companion must have the shape its weight implies; anything else is a damaged or foreign checkpoint."""
    if math.prod(companion.shape) != math.prod(expected):
        raise CheckpointFormatError(
            f"{name}: its {role} has shape {list(companion.shape)}, expected {list(expected)} for this weight; "
            "the checkpoint is damaged or uses a layout weightdiag does not know",
            file=name,
        )

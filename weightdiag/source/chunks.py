"""Split the bytes to read into chunks of about one size: the unit of every read and reduction.

Pure planning, no I/O. A tensor larger than a chunk is cut at fixed offsets from its own start
(multiples of the split size, weightdiag.tuning's split_bytes, rounded down to whole code units for a
GGUF weight: `cut_step`), whatever else is read around it, so its partial reductions, and therefore the
merged result, are the same bit for bit whether the file is read locally, from the Hub, whole or in part. Small
neighbouring tensors are coalesced into one chunk (one ranged GET for hundreds of norm vectors).
In `cover` mode the chunks tile each shard's data region without a hole (the bytes between and
after selected tensors are read too), so that every byte of the file passes through the reader
and can be hashed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK_ALIGN = 8  # tensor cut points stay on whole elements of every dtype (at most 8 bytes)


@dataclass(frozen=True)
class Span:
    """What one work item needs: bytes [start, end) of shard `shard`, cut only at multiples of `unit` bytes
    from its start (a GGUF weight's blocks, or heads of rows, are decoded whole: weightdiag.decode)."""

    shard: int
    start: int
    end: int
    unit: int = 1


@dataclass(frozen=True)
class Piece:
    """Bytes [lo, hi) of work item `item` (offsets inside the tensor), at `offset` in its chunk's buffer."""

    item: int
    offset: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Chunk:
    """One read: bytes [start, end) of shard `shard`, holding `pieces` (none for filler between tensors)."""

    index: int
    shard: int
    start: int
    end: int
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def plan_chunks(
    spans: Sequence[Span],
    chunk_bytes: int,
    *,
    gap_bytes: int = 1 << 20,
    cover: dict[int, tuple[int, int]] | None = None,
    split_bytes: int | None = None,
) -> list[Chunk]:
    """Chunks in file order for `spans` (sorted by shard and start, not overlapping).

    gap_bytes: a hole up to this size between two selected tensors is read rather than costing a
    second request. cover: {shard: (data_start, file_size)}: tile those regions completely.
    split_bytes: where large tensors are cut (default chunk_bytes; at most chunk_bytes).
    """
    split_bytes = split_bytes or chunk_bytes
    if split_bytes < CHUNK_ALIGN or split_bytes % CHUNK_ALIGN or chunk_bytes < split_bytes:
        raise ValueError(f"split_bytes must be a positive multiple of {CHUNK_ALIGN}, at most chunk_bytes")
    units = _units(spans, split_bytes, cover)
    chunks: list[Chunk] = []
    shard = start = end = -1
    pieces: list[Piece] = []

    def close() -> None:
        if end > start >= 0:
            chunks.append(Chunk(len(chunks), shard, start, end, tuple(pieces)))

    for unit_shard, unit_start, unit_end, piece in units:
        joins = (
            unit_shard == shard
            and unit_end - start <= chunk_bytes
            and (unit_start == end or (cover is None and 0 <= unit_start - end <= gap_bytes))
        )
        if not joins:
            close()
            shard, start, pieces = unit_shard, unit_start, []
        end = unit_end
        if piece is not None:
            item, lo = piece
            pieces.append(Piece(item, unit_start - start, lo, lo + unit_end - unit_start))
    close()
    return chunks


def cut_step(split_bytes: int, unit: int) -> int:
    """Where a tensor of `unit`-byte code units is cut: the largest multiple of the unit (and of CHUNK_ALIGN) up
    to split_bytes, so that no unit straddles two pieces; split_bytes itself for units that divide CHUNK_ALIGN
    (every element type and most packed codes), or one whole unit when a unit is larger than split_bytes."""
    align = math.lcm(max(unit, 1), CHUNK_ALIGN)
    return max(align, split_bytes - split_bytes % align)


def _units(
    spans: Sequence[Span], chunk_bytes: int, cover: dict[int, tuple[int, int]] | None
) -> list[tuple[int, int, int, tuple[int, int] | None]]:
    """(shard, start, end, (item, offset in tensor) or None for filler), each at most chunk_bytes, in file order."""
    units: list[tuple[int, int, int, tuple[int, int] | None]] = []
    position: dict[int, int] = {}  # cover mode: how far each shard is tiled

    def filler(shard: int, a: int, b: int) -> None:
        for lo in range(a, b, chunk_bytes):
            units.append((shard, lo, min(lo + chunk_bytes, b), None))

    previous = (-1, -1)
    for item, span in enumerate(spans):
        if (span.shard, span.start) < previous:
            raise ValueError("spans must be sorted by shard and start and must not overlap")
        previous = (span.shard, span.end)
        if cover is not None:
            at = position.get(span.shard, cover[span.shard][0])
            filler(span.shard, at, span.start)
            position[span.shard] = span.end
        step = cut_step(chunk_bytes, span.unit)
        for lo in range(0, span.end - span.start, step):
            hi = min(lo + step, span.end - span.start)
            units.append((span.shard, span.start + lo, span.start + hi, (item, lo)))
    if cover is not None:
        for shard, (data_start, size) in cover.items():
            filler(shard, position.get(shard, data_start), size)
        units.sort(key=lambda u: (u[0], u[1]))
    return units

"""Regular selections of a tensor's elements: the whole tensor, or a fused tensor's part.

A GPT-NeoX fused qkv holds its query, key and value rows interleaved per head; each part is a
`Segments` (count runs of length elements, stride apart), so a part is reduced in place, without
copies, and a chunk of bytes can be clipped to the runs it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Segments:
    """A regular selection of elements: `count` runs of `length` elements, `stride` apart.

    The whole tensor is Segments(0, numel, numel, 1); the q rows of a GPT-NeoX fused qkv are
    Segments(0, head_dim * d, 3 * head_dim * d, n_heads).
    """

    offset: int
    length: int
    stride: int
    count: int

    @classmethod
    def whole(cls, numel: int) -> Segments:
        return cls(0, numel, max(numel, 1), 1)

    @property
    def numel(self) -> int:
        return self.length * self.count

    def view(self, flat: np.ndarray) -> np.ndarray:
        """A 2-D (count, length) view of `flat`, no copy."""
        if self.offset < 0 or self.offset + (self.count - 1) * self.stride + self.length > flat.size:
            raise ValueError(f"{self} does not fit in {flat.size} elements")
        if self.count == 1:
            return flat[self.offset : self.offset + self.length].reshape(1, self.length)
        item = flat.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[self.offset :],
            shape=(self.count, self.length),
            strides=(self.stride * item, item),
            writeable=False,
        )

    def original_index(self, view_index: int) -> int:
        """Map a flat index in the (count, length) view back to the tensor's flat index."""
        row, col = divmod(view_index, self.length)
        return self.offset + row * self.stride + col


def clip(segments: Segments, lo: int, hi: int) -> list[Segments]:
    """The elements of `segments` inside the element range [lo, hi), as selections relative to lo.

    At most three, in flat order: a cut run at the start, the whole runs, a cut run at the end.
    """
    o, n, s, c = segments.offset, segments.length, segments.stride, segments.count
    if n == 0 or c == 0 or hi <= lo:
        return []
    first = max(0, (lo - o - n) // s + 1)  # first run ending after lo
    last = min(c - 1, -(-(hi - o) // s) - 1)  # last run starting before hi
    if first > last:
        return []
    whole_first = max(first, -(-(lo - o) // s))  # runs lying wholly inside [lo, hi)
    whole_last = min(last, (hi - o - n) // s)
    out: list[Segments] = []

    def cut(run: int) -> None:
        a, b = max(o + run * s, lo), min(o + run * s + n, hi)
        out.append(Segments(a - lo, b - a, b - a, 1))

    if whole_first > whole_last:
        for run in range(first, last + 1):
            cut(run)
        return out
    if first < whole_first:
        cut(first)
    out.append(Segments(o + whole_first * s - lo, n, s, whole_last - whole_first + 1))
    if last > whole_last:
        cut(last)
    return out

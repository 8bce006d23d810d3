"""GPTQ and AWQ (GEMM) weights: 2-, 4- or 8-bit codes packed into I32 words across the INPUT dimension
(GPTQ) or the OUTPUT dimension (AWQ), one F16 scale and one packed integer zero point per group of
inputs and output channel.

GPTQ follows AutoGPTQ (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py: pack and the torch
dequantization; qlinear_cuda.py: the same with g_idx) and GPTQModel
(gptqmodel/nn_modules/qlinear/__init__.py, dequantize_weight, for checkpoint_format gptq_v2):
- qweight I32 [in * bits / 32, out]: word (r, j) holds the codes of inputs r * per .. r * per + per - 1
  (per = 32 / bits) of output j, input r * per + k at bits k * bits (low bits first);
- qzeros I32 [groups, out * bits / 32]: packed the same way along the OUTPUT dimension; checkpoint_format
  "gptq" (v1) stores zero - 1, so zero = masked + 1 (which can be 2^bits: a stored 15 is the zero 16, kept
  as an integer, never wrapped); "gptq_v2" stores the zero itself;
- g_idx I32 [in]: the group of each input (i // group_size when absent; any map with desc_act);
- value(j, i) = scales[g_idx[i], j] * (code(i, j) - zero(g_idx[i], j)).
AWQ follows AutoAWQ (awq/utils/packing_utils.py: unpack_awq, reverse_awq_order, dequantize_gemm;
awq/modules/linear/gemm.py: WQLinear_GEMM.from_linear, the packing):
- qweight I32 [in, out / 8]: word (i, w) holds outputs w * 8 .. w * 8 + 7 of input i, the nibble at bits
  4 * k holding output w * 8 + AWQ_ORDER[k], AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (so output w * 8 + t is
  the nibble k = AWQ_REVERSE_ORDER[t], AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]);
- qzeros I32 [in / group, out / 8] packed the same way, no offset; scales F16 [in / group, out];
- value(j, i) = (code(i, j) - zero(i // group, j)) * scales[i // group, j].
Both libraries compute in F16 (the scales' dtype); here the same operands are taken to float32 first (the
decoder contract): code - zero is a small integer, exact in float32, so each value is one rounding of the
exact product, as torch gives with float32 scales.

Decoded order (the engine streams qweight's bytes in pieces cut at 8-byte multiples, mid-row):
- GPTQ: storage order, each word's `per` codes in bit order: decoded index d = (r * out + j) * per + k is
  the element (output j, input i = r * per + k), logical index j * in + i;
- AWQ: storage order with each word's outputs put back in order, i.e. the transposed matrix [in, out]
  row-major: d = i * out + j, logical index j * in + i.
A selection of whole logical rows (outputs) is then, per stored row, a run: one Segments when it is one
range of rows, or when its runs repeat with a period that tiles the outputs (a GPT-NeoX qkv part); any
other selection is refused (CheckpointFormatError). The first largest |value| of a piece is the first in
decoded order, so among equal largest |values| it may not be the first in logical order.

The counting path (`counts`): each piece is counted per (scale, zero) slot and code by the C kernel, never
decoded element by element: GPTQ 4-bit when a word's 8 inputs share a group (no desc_act interleaving; a
slot is a word), AWQ with the codes unpacked transposed ([outputs, inputs]: a slot is a run of `group`
inputs of one output). Other GPTQ layouts (interleaved groups, 2- and 8-bit codes) are decoded.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from ...errors import CheckpointFormatError
from ...segments import Segments
from ...source.plan import Quantized
from ..decoder import Companion, Companions, Counted, check_shape, register, row_rects
from ..values import as_float32, as_integers

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble k of a word holds output AWQ_ORDER[k] of its eight
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output t of a word is nibble AWQ_REVERSE_ORDER[t]


def _words(companion: Companion) -> np.ndarray:
    """An I32 companion's words as uint32 (bit patterns; the sign bit is just the top code's bit)."""
    return as_integers(companion.raw, companion.dtype).view(np.uint32)


def _unpack_columns(words: np.ndarray, bits: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Words [g, n] packing `32 / bits` values each along the last axis (value k at bits k * bits, or
    output t at nibble order[t]) -> int64 [g, n * per]."""
    per = 32 // bits
    ks = np.arange(per) if order is None else np.asarray(order)
    shifts = (ks * bits).astype(np.uint32)
    return ((words[..., None] >> shifts) & np.uint32((1 << bits) - 1)).astype(np.int64).reshape(words.shape[0], -1)


class _PackedLinear:
    """Common part: the decoded order is [A, out, B] (A stored rows, B codes per word along inputs);
    logical row j (an output channel) is the middle axis."""

    unit_bytes = 4
    any_selection: ClassVar[bool] = False  # decoded in storage order (columns of words): whole logical rows only
    note: str | None = None
    _a: int
    _b: int

    def __init__(self, q: Quantized, companions: Companions) -> None:
        self.name = q.codes.name
        self.bits = q.spec.bits
        if len(q.logical_shape) != 2:
            raise CheckpointFormatError(f"{self.name}: a packed linear weight is 2-D", file=self.name)
        self.out, self.inputs = q.logical_shape
        self.per = 32 // self.bits
        self.mask = (1 << self.bits) - 1

    def _fail(self, message: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{self.name}: {message}", file=self.name)

    def _load(self, companions: Companions, groups: int, zero_offset: int, order) -> None:
        scales, qzeros = companions.get("scales"), companions.get("qzeros")
        if scales is None or qzeros is None:
            raise self._fail("scales and qzeros are both needed")
        check_shape(self.name, "scales", scales, (groups, self.out))
        check_shape(self.name, "qzeros", qzeros, (groups, self.out // self.per))
        if qzeros.dtype not in ("I32", "U32"):
            raise self._fail(f"qzeros is {qzeros.dtype}, expected I32")
        if scales.dtype not in ("F16", "BF16", "F32"):
            raise self._fail(f"scales are {scales.dtype}, expected F16")
        self.scales = as_float32(scales.raw, scales.dtype).reshape(groups, self.out)
        words = _words(qzeros).reshape(groups, self.out // self.per)
        self.zeros = (_unpack_columns(words, self.bits, order) + zero_offset).astype(np.float32)
        # the counting path's slot keys: a (scale, zero) pair, by the scale's float32 bits and the zero
        self.scale_bits = self.scales.view(np.uint32).astype(np.int64)
        self.zero_codes = self.zeros.astype(np.int64)

    def _slots(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the scale groups `groups` (sorted, distinct): each (group, output)'s slot, int32 [groups, out],
        and each slot's value of every code, float32 [slots, codes], computed exactly as `decode` computes it."""
        keys = (self.scale_bits[groups] << np.int64(16)) | self.zero_codes[groups]
        _, first, inverse = np.unique(keys.reshape(-1), return_index=True, return_inverse=True)
        codes = np.arange(1 << self.bits, dtype=np.uint8)[None, :]
        table = np.subtract(codes, self.zeros[groups].reshape(-1)[first][:, None], dtype=np.float32)
        table *= self.scales[groups].reshape(-1)[first][:, None]
        return inverse.reshape(groups.size, self.out).astype(np.int32), table

    @staticmethod
    def _counted(counts: np.ndarray, table: np.ndarray, first: int, numel: int, locate) -> Counted:
        """The Counted of a piece from its (slot, code) counts; `locate(wanted)` finds the offset in the
        piece of its first element whose (slot, code) is wanted [slots, codes]."""
        shape = table.shape
        return Counted(table, counts.reshape(shape), numel, first, lambda wanted: first + locate(wanted.reshape(shape)))

    def selection(self, rows: Segments) -> Segments:
        cols, out, a, b = self.inputs, self.out, self._a, self._b
        o, n, s, c = rows.offset, rows.length, rows.stride, rows.count
        if o % cols or n % cols or (c > 1 and s % cols):
            raise self._fail(f"selection {rows} is not made of whole rows of {cols} elements")
        o, n, s = o // cols, n // cols, s // cols
        if n == 0 or c == 0:
            return Segments(0, 0, 1, 0)
        if c == 1:
            return Segments(o * b, n * b, out * b, a)
        if s * c == out:  # runs that tile the outputs: the pattern carries on across stored rows
            return Segments(o * b, n * b, s * b, c * a)
        raise self._fail(
            f"a selection of {c} runs of {n} rows every {s} rows of {out} is not one regular selection "
            "in this format's stored order"
        )


def _wrapped_zeros_note(zeros: np.ndarray, bits: int) -> str | None:
    """The record's note for a GPTQ v1 weight with zero points stored as 2^bits - 1 (issue 33), else None.

    v1 stores zero - 1, so a zero of 0 (an asymmetric group whose weights are all >= 0) is stored as -1, whose
    low bits read 2^bits - 1. Its readers disagree: vLLM's GPTQ kernels (exllama, Marlin) add the 1 to the
    masked code and compute with 2^bits; AutoGPTQ's torch dequantizer (qlinear_cuda_old.py) masks after adding,
    `(stored + 1) & (2^bits - 1)`, and computes with 0. weightdiag reads 2^bits, the values the checkpoint is
    served with; AutoGPTQ's are 2^bits scale steps higher in those groups."""
    top = 1 << bits
    count = int(np.count_nonzero(zeros == top))
    if not count:
        return None
    return (
        f"GPTQ v1 zero points stored as {top - 1} read as {top} in {count} of {zeros.size} groups (the format's "
        f"+1 unwrapped, as vLLM's GPTQ kernels read them); AutoGPTQ's torch dequantizer wraps them to 0 "
        f"((stored + 1) & {top - 1}), which puts those groups' values {top} scale steps higher"
    )


@register("gptq")
class GPTQDecoder(_PackedLinear):
    note: str | None = None  # said in the weight's record (decode/loader.py hands it on)

    def __init__(self, q: Quantized, companions: Companions) -> None:
        super().__init__(q, companions)
        if self.bits not in (2, 4, 8):
            raise self._fail(f"{self.bits}-bit GPTQ codes are not decoded (2, 4 and 8 bits are)")
        if q.codes.dtype.name != "I32" or tuple(q.codes.shape) != (self.inputs // self.per, self.out):
            raise self._fail(f"qweight {list(q.codes.shape)} is not I32 [in * bits / 32, out] of {q.logical_shape}")
        self.stored_rows = self.inputs // self.per
        self._a, self._b = self.stored_rows, self.per
        group = q.spec.group or self.inputs
        groups = math.ceil(self.inputs / group)
        fmt = str(q.spec.params.get("checkpoint_format", "gptq"))
        self._load(companions, groups, 1 if fmt == "gptq" else 0, None)
        if fmt == "gptq":
            self.note = _wrapped_zeros_note(self.zero_codes, self.bits)
        if "g_idx" in companions:
            g = companions["g_idx"]
            check_shape(self.name, "g_idx", g, (self.inputs,))
            g_idx = as_integers(g.raw, g.dtype).astype(np.int64).reshape(-1)
            if g_idx.size and (g_idx.min() < 0 or g_idx.max() >= groups):
                raise self._fail(f"g_idx holds groups outside 0..{groups - 1}")
        else:
            g_idx = np.arange(self.inputs) // group
        self.g_idx = g_idx.reshape(self.stored_rows, self.per).astype(np.intp)
        # The usual layout: the `per` inputs of a word share their group, so one scale row per stored row.
        same = bool((self.g_idx == self.g_idx[:, :1]).all())
        self.row_group = self.g_idx[:, 0].copy() if same else None
        self.shifts = (np.arange(self.per) * self.bits).astype(np.uint32)[None, :, None]

    def decode(self, raw: np.ndarray, byte_lo: int) -> tuple[np.ndarray, int]:
        if byte_lo % 4 or raw.size % 4:
            raise self._fail(f"a piece at byte {byte_lo} of {raw.size} bytes does not hold whole words")
        per = self.per
        words = raw.view(np.uint32)
        first_word = byte_lo // 4
        out = np.empty(words.size * per, dtype=np.float32)
        for r0, r1, c0, c1, offset in row_rects(first_word, words.size, self.out):
            nr, nc = r1 - r0, c1 - c0
            # Computed as [rows, per, columns] (long inner loops), then written in decoded order [rows, columns, per].
            block = words[offset : offset + nr * nc].reshape(nr, 1, nc)
            codes = ((block >> self.shifts) & np.uint32(self.mask)).astype(np.uint8)
            if self.row_group is not None:
                g = self.row_group[r0:r1]
                values = np.subtract(codes, self.zeros[g, c0:c1][:, None, :], dtype=np.float32)
                values *= self.scales[g, c0:c1][:, None, :]
            else:  # inputs of one word in different groups (desc_act): a zero and scale per element
                gi = self.g_idx[r0:r1]  # [nr, per]
                values = np.subtract(codes, self.zeros[:, c0:c1][gi], dtype=np.float32)
                values *= self.scales[:, c0:c1][gi]
            out[offset * per : (offset + nr * nc) * per].reshape(nr, nc, per)[...] = values.transpose(0, 2, 1)
        return out, first_word * per

    def counts(self, raw: np.ndarray, byte_lo: int) -> Counted | None:
        """The piece counted per (scale, zero) slot and code, the values those `decode` computes: 4-bit codes
        whose words each lie in one group (a slot is a word's 8 codes). Groups interleaved inside words
        (desc_act), 2- and 8-bit codes are decoded: counting them per element was no faster."""
        if self.bits != 4 or self.row_group is None or byte_lo % 4 or raw.size % 4 or raw.size == 0:
            return None
        per, out_cols = self.per, self.out
        words = raw.view(np.uint32)
        first_word, nwords = byte_lo // 4, words.size
        row_lo, row_hi = first_word // out_cols, (first_word + nwords - 1) // out_cols + 1
        rects = list(row_rects(first_word, nwords, out_cols))
        # 4-bit words whose 8 inputs share a group: the C kernel counts the nibbles of each word in its slot
        from ... import kernels

        groups, where = np.unique(self.row_group[row_lo:row_hi], return_inverse=True)
        slot_of, table = self._slots(groups)
        slots = slot_of[where]  # [rows here, out]
        counts = np.zeros(table.size, dtype=np.int64)
        for r0, r1, c0, c1, offset in rects:
            part = raw[offset * 4 : (offset + (r1 - r0) * (c1 - c0)) * 4].reshape(r1 - r0, -1)
            kernels.count_slots(part, slots[r0 - row_lo : r1 - row_lo, c0:c1], c0 * per, per, 4, 16, counts)

        def locate(wanted: np.ndarray) -> int:
            wanted_slot = wanted.any(axis=1)
            assert isinstance(wanted_slot, np.ndarray)  # [slots]: `wanted` is [slots, codes]
            for r0, r1, c0, c1, offset in rects:
                sub = slots[r0 - row_lo : r1 - row_lo, c0:c1].reshape(-1)
                candidates = np.flatnonzero(wanted_slot[sub])  # words (in decoded order) in a wanted slot
                if not candidates.size:
                    continue
                codes = (words[offset + candidates][:, None] >> self.shifts.reshape(1, per)) & np.uint32(self.mask)
                hit = wanted[sub[candidates][:, None], codes]
                if hit.any():
                    at = int(np.argmax(hit.reshape(-1)))
                    return (offset + int(candidates[at // per])) * per + at % per
            raise AssertionError("a counted value was not found in its piece")

        return self._counted(counts, table, first_word * per, nwords * per, locate)

    def logical_index(self, index: int) -> int:
        word, k = divmod(index, self.per)
        r, j = divmod(word, self.out)
        return j * self.inputs + r * self.per + k

    @classmethod
    def decoded_positions(cls, q: Quantized, logical: np.ndarray) -> np.ndarray:
        """logical_index inverted: (output j, input i = r * per + k) is decoded index (r * out + j) * per + k."""
        out, inputs = q.logical_shape
        per = 32 // q.spec.bits
        j, i = np.divmod(np.asarray(logical, dtype=np.int64), inputs)
        r, k = np.divmod(i, per)
        return (r * out + j) * per + k


@register("awq")
class AWQDecoder(_PackedLinear):
    def __init__(self, q: Quantized, companions: Companions) -> None:
        super().__init__(q, companions)
        if self.bits != 4:
            raise self._fail(f"{self.bits}-bit AWQ codes are not decoded (AWQ GEMM packs 4 bits)")
        if q.codes.dtype.name != "I32" or tuple(q.codes.shape) != (self.inputs, self.out // self.per):
            raise self._fail(f"qweight {list(q.codes.shape)} is not I32 [in, out / 8] of {q.logical_shape}")
        self._a, self._b = self.inputs, 1
        self.group = q.spec.group or self.inputs
        groups = math.ceil(self.inputs / self.group)
        self._load(companions, groups, 0, AWQ_REVERSE_ORDER)
        self.shifts = (np.asarray(AWQ_REVERSE_ORDER) * 4).astype(np.uint32)

    def decode(self, raw: np.ndarray, byte_lo: int) -> tuple[np.ndarray, int]:
        if byte_lo % 4 or raw.size % 4:
            raise self._fail(f"a piece at byte {byte_lo} of {raw.size} bytes does not hold whole words")
        words = raw.view(np.uint32)
        first_word = byte_lo // 4
        wpr = self.out // 8  # words per stored row
        out = np.empty(words.size * 8, dtype=np.float32)
        for r0, r1, c0, c1, offset in row_rects(first_word, words.size, wpr):
            nr, nc = r1 - r0, c1 - c0
            block = words[offset : offset + nr * nc].reshape(nr, nc, 1)
            codes = ((block >> self.shifts) & np.uint32(15)).astype(np.uint8).reshape(nr, nc * 8)
            g = np.arange(r0, r1) // self.group
            dst = out[offset * 8 : (offset + nr * nc) * 8].reshape(nr, nc * 8)
            np.subtract(codes, self.zeros[g, c0 * 8 : c1 * 8], out=dst)
            dst *= self.scales[g, c0 * 8 : c1 * 8]
        return out, first_word * 8

    def counts(self, raw: np.ndarray, byte_lo: int) -> Counted | None:
        """The piece counted per (scale, zero) slot and code, the values those `decode` computes. A word's
        nibbles are different outputs, so the codes are unpacked transposed, [outputs, inputs]: a slot is
        then a run of `group` inputs of one output, which the C kernel counts as a row-major group."""
        if byte_lo % 4 or raw.size % 4 or raw.size == 0:
            return None
        from ... import kernels

        words = raw.view(np.uint32)
        first_word, wpr, group = byte_lo // 4, self.out // 8, self.group
        row_lo, row_hi = first_word // wpr, (first_word + words.size - 1) // wpr + 1
        groups = np.arange(row_lo // group, (row_hi - 1) // group + 1)
        slot_of, table = self._slots(groups)  # [groups here, out]
        counts = np.zeros(table.size, dtype=np.int64)
        rects = []
        for r0, r1, c0, c1, offset in row_rects(first_word, words.size, wpr):
            nr, nc = r1 - r0, c1 - c0
            block = np.ascontiguousarray(words[offset : offset + nr * nc].reshape(nr, nc).T)  # [words, inputs]
            codes = ((block[:, None, :] >> self.shifts[None, :, None]) & np.uint32(15)).astype(np.uint8)
            codes = codes.reshape(nc * 8, nr)  # [outputs c0 * 8 .., inputs r0 ..]
            g0, g1 = r0 // group - groups[0], (r1 - 1) // group + 1 - groups[0]
            slots = np.ascontiguousarray(slot_of[g0:g1, c0 * 8 : c1 * 8].T)  # [outputs, groups of the rows]
            kernels.count_slots(codes, slots, r0, group, 8, 16, counts)
            rects.append((r0, r1, c0, c1, offset, codes, slots))

        def locate(wanted: np.ndarray) -> int:
            wanted_slot = wanted.any(axis=1)
            assert isinstance(wanted_slot, np.ndarray)  # [slots]: `wanted` is [slots, codes]
            for r0, r1, c0, c1, offset, codes, slots in rects:
                jj, gg = np.nonzero(wanted_slot[slots])  # (output, group) pairs in a wanted slot: a few
                if not jj.size:
                    continue
                g_first = r0 // group
                lo = np.maximum((gg + g_first) * group, r0) - r0  # the pairs' input runs in the rect
                hi = np.minimum((gg + g_first + 1) * group, r1) - r0
                lengths = hi - lo
                starts = np.repeat(lo - np.cumsum(lengths) + lengths, lengths)
                ii = starts + np.arange(int(lengths.sum()))
                jj, gg = np.repeat(jj, lengths), np.repeat(gg, lengths)
                hit = wanted[slots[jj, gg], codes[jj, ii]]
                if hit.any():
                    decoded = ii[hit] * ((c1 - c0) * 8) + jj[hit]  # [inputs, outputs] row-major in the rect
                    return offset * 8 + int(decoded.min())
            raise AssertionError("a counted value was not found in its piece")

        return self._counted(counts, table, first_word * 8, words.size * 8, locate)

    def logical_index(self, index: int) -> int:
        i, j = divmod(index, self.out)
        return j * self.inputs + i

    @classmethod
    def decoded_positions(cls, q: Quantized, logical: np.ndarray) -> np.ndarray:
        """logical_index inverted: the transposed matrix [in, out] row-major."""
        out, inputs = q.logical_shape
        j, i = np.divmod(np.asarray(logical, dtype=np.int64), inputs)
        return i * out + j

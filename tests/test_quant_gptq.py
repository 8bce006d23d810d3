"""GPTQ and AWQ (GEMM) decoders, bit for bit.

Oracles: hand-computed tiny cases written from the formats' descriptions (so a shared bug with the decoder
cannot pass), and the reference dequantizers of tests/quant_gptq_checkpoints.py, written in torch bit ops
from AutoGPTQ (qlinear_cuda.py / qlinear_cuda_old.py) and AutoAWQ (utils/packing_utils.py dequantize_gemm),
over a real trained matrix (all-MiniLM-L6-v2) quantized by that module's packers. Pieces are cut at
multiples of 8 bytes that fall neither on stored rows nor on groups.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from weightdiag.decode.decoder import Companion
from weightdiag.decode.formats import build_decoder
from weightdiag.decode.scheme import Quantized, QuantSpec
from weightdiag.dtypes import DTYPES
from weightdiag.errors import CheckpointFormatError
from weightdiag.reduce.reduction import reduce_counted
from weightdiag.segments import Segments
from weightdiag.source.plan import TensorRef

from . import quant_gptq_checkpoints as gq

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

DT = {torch.int32: "I32", torch.float16: "F16", torch.float32: "F32"}


def _ref(name: str, t: torch.Tensor) -> TensorRef:
    return TensorRef(name, DTYPES[DT[t.dtype]], tuple(t.shape), 0, 0, t.numel() * t.element_size())


def _companion(t: torch.Tensor) -> Companion:
    return Companion(t.contiguous().view(torch.uint8).numpy().reshape(-1).copy(), DT[t.dtype], tuple(t.shape))


def _decoder(method: str, bits: int, group: int | None, qweight, companions: dict, shape, fmt="gptq", desc=False):
    spec = QuantSpec(
        method,
        method,
        bits,
        "test",
        "(code - zero) * scale",
        "test",
        group=group,
        params={"checkpoint_format": fmt, "desc_act": desc, "sym": False} if method == "gptq" else {"version": "gemm"},
    )
    q = Quantized(spec, _ref("m.qweight", qweight), {k: _ref("m." + k, v) for k, v in companions.items()}, shape)
    return build_decoder(q, {k: _companion(v) for k, v in companions.items()})


def _raw(qweight: torch.Tensor) -> np.ndarray:
    return qweight.contiguous().numpy().view(np.uint8).reshape(-1)


def _decode(dec, raw: np.ndarray, cuts: list[int]) -> np.ndarray:
    parts = []
    expected_first = 0
    for a, b in itertools.pairwise(cuts):
        values, first = dec.decode(raw[a:b], a)
        assert values.dtype == np.float32 and first == expected_first
        expected_first += values.size
        parts.append(values)
    return np.concatenate(parts)


def _logical(dec, decoded: np.ndarray, shape) -> np.ndarray:
    index = dec.logical_index(np.arange(decoded.size))  # works elementwise on arrays
    assert np.array_equal(np.sort(index), np.arange(decoded.size))
    out = np.empty_like(decoded)
    out[index] = decoded
    return out.reshape(shape)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _i32(words) -> torch.Tensor:
    return torch.from_numpy(np.array(words, dtype=np.uint32).view(np.int32))


# --- hand-computed cases ------------------------------------------------------------------------------------

# GPTQ, 8 inputs x 8 outputs, 4 bits, group 4: one stored row of 8 words, word j = output j's 8 inputs,
# input k at bits 4k.
HAND_QWEIGHT = [[0x76543210, 0xFEDCBA98, 0x00000000, 0xFFFFFFFF, 0x0F0F0F0F, 0x12345678, 0x88888888, 0x11111111]]
# zeros packed along outputs: group 0 stores 0 for outputs 0-6 and 15 for output 7; group 1 stores j for output j
HAND_QZEROS = [[0xF0000000], [0x76543210]]
HAND_SCALES = [[0.5] * 8, [1.0, 2.0, 0.25, 0.125, 1.0, 1.0, 1.0, 1.0]]
# v1: zero = stored + 1 (group 0: 1, output 7: 16; group 1: j + 1); value = scale * (code - zero), [out, in]
HAND_V1 = [
    [-0.5, 0.0, 0.5, 1.0, 3.0, 4.0, 5.0, 6.0],  # codes 0..7; g0 zero 1 x 0.5; g1 zero 1 x 1
    [3.5, 4.0, 4.5, 5.0, 20.0, 22.0, 24.0, 26.0],  # codes 8..15; g1 zero 2 x 2
    [-0.5] * 4 + [-0.75] * 4,  # code 0; g1 zero 3 x 0.25
    [7.0] * 4 + [1.375] * 4,  # code 15; g1 zero 4 x 0.125
    [7.0, -0.5, 7.0, -0.5, 10.0, -5.0, 10.0, -5.0],  # codes 15, 0, ...; g1 zero 5
    [3.5, 3.0, 2.5, 2.0, -2.0, -3.0, -4.0, -5.0],  # codes 8, 7, ..., 1; g1 zero 6
    [3.5] * 4 + [1.0] * 4,  # code 8; g1 zero 7
    [-7.5] * 4 + [-7.0] * 4,  # code 1; g0 zero 16 (stored 15, not wrapped); g1 zero 8
]
# desc_act: inputs' groups interleaved inside the word
HAND_G_IDX = [1, 0, 1, 0, 0, 1, 1, 0]
HAND_DESC_ROW0 = [-1.0, 0.0, 1.0, 1.0, 1.5, 4.0, 5.0, 3.0]
HAND_DESC_ROW7 = [-7.0, -7.5, -7.0, -7.5, -7.5, -7.0, -7.0, -7.5]


def _hand_gptq(g_idx=None):
    comps = {
        "scales": torch.tensor(HAND_SCALES, dtype=torch.float16),
        "qzeros": _i32(HAND_QZEROS),
    }
    if g_idx is not None:
        comps["g_idx"] = torch.tensor(g_idx, dtype=torch.int32)
    return _i32(HAND_QWEIGHT), comps


@pytest.mark.parametrize("with_g_idx", [False, True])
def test_gptq_hand_v1(with_g_idx):
    qweight, comps = _hand_gptq([0, 0, 0, 0, 1, 1, 1, 1] if with_g_idx else None)
    dec = _decoder("gptq", 4, 4, qweight, comps, (8, 8))
    decoded = _decode(dec, _raw(qweight), [0, 8, 24, 32])
    # one stored row: the decoded order (output j, then its inputs) is the logical order here
    assert _bits_equal(decoded, np.array(HAND_V1, dtype=np.float32).reshape(-1))
    assert _bits_equal(_logical(dec, decoded, (8, 8)), np.array(HAND_V1, dtype=np.float32))
    # the oracle agrees with the hand values
    g_idx = torch.arange(8, dtype=torch.int32) // 4
    oracle = gq.gptq_reference(qweight, comps["qzeros"], comps["scales"], g_idx, 4, "gptq")
    assert _bits_equal(oracle.numpy(), np.array(HAND_V1, dtype=np.float32))
    assert dec.counts(_raw(qweight), 0) is None  # groups of 4 split the 8 inputs of a word: decoded, not counted


def test_gptq_hand_v2_no_offset():
    qweight, comps = _hand_gptq()
    dec = _decoder("gptq", 4, 4, qweight, comps, (8, 8), fmt="gptq_v2")
    got = _logical(dec, _decode(dec, _raw(qweight), [0, 32]), (8, 8))
    assert got[0].tolist() == [0.0, 0.5, 1.0, 1.5, 4.0, 5.0, 6.0, 7.0]  # zero 0 (g0), 0 (g1)
    assert got[7].tolist() == [-7.0] * 4 + [-6.0] * 4  # zero 15 (g0 stored 15), 7 (g1)


def test_gptq_hand_desc_act():
    qweight, comps = _hand_gptq(HAND_G_IDX)
    dec = _decoder("gptq", 4, 4, qweight, comps, (8, 8), desc=True)
    got = _logical(dec, _decode(dec, _raw(qweight), [0, 16, 32]), (8, 8))
    assert got[0].tolist() == HAND_DESC_ROW0
    assert got[7].tolist() == HAND_DESC_ROW7
    oracle = gq.gptq_reference(qweight, comps["qzeros"], comps["scales"], comps["g_idx"], 4, "gptq")
    assert _bits_equal(got, oracle.numpy())


def test_gptq_hand_order_across_stored_rows():
    """8-bit, 16 inputs x 4 outputs: 4 stored rows of 4 words; code(i, j) = i + 16 j, zero 0, scale 1."""
    words = [[sum((4 * r + k + 16 * j) << (8 * k) for k in range(4)) for j in range(4)] for r in range(4)]
    assert words[0][0] == 0x03020100 and words[1][2] == 0x27262524  # as written by hand
    qweight = _i32(words)
    comps = {"scales": torch.ones(1, 4, dtype=torch.float16), "qzeros": _i32([[0]])}
    dec = _decoder("gptq", 8, None, qweight, comps, (4, 16), fmt="gptq_v2")
    decoded = _decode(dec, _raw(qweight), [0, 8, 40, 56, 64])
    # decoded order: stored row r, output j, then input 4 r + k
    expected = [4 * r + k + 16 * j for r in range(4) for j in range(4) for k in range(4)]
    assert decoded.tolist() == expected
    logical = _logical(dec, decoded, (4, 16))
    assert logical.tolist() == [[i + 16 * j for i in range(16)] for j in range(4)]
    assert dec.logical_index(6) == 1 * 16 + 2  # word (0, 1), k = 2: output 1, input 2
    assert dec.logical_index(18) == 0 * 16 + 6  # word (1, 0), k = 2: output 0, input 6


# AWQ, 4 inputs x 8 outputs, group 2: one word per input; nibble k holds output AWQ_ORDER[k] = [0,2,4,6,1,3,5,7][k]
AWQ_HAND_QWEIGHT = [[0x76543210], [0xFEDCBA98], [0x76543210], [0x00000000]]
AWQ_HAND_QZEROS = [[0x00000000], [0x00000010]]  # group 1: nibble 1 = 1, i.e. output 2 has zero 1
AWQ_HAND_SCALES = [[1.0] * 8, [0.5] * 8]
AWQ_HAND_IN_OUT = [  # [in, out]: output t of word 0x76543210 is the nibble [0,4,1,5,2,6,3,7][t]
    [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0],
    [8.0, 12.0, 9.0, 13.0, 10.0, 14.0, 11.0, 15.0],
    [0.0, 2.0, 0.0, 2.5, 1.0, 3.0, 1.5, 3.5],  # (code - zero) * 0.5, output 2: (1 - 1) * 0.5
    [0.0, 0.0, -0.5, 0.0, 0.0, 0.0, 0.0, 0.0],
]


def test_awq_hand():
    qweight = _i32(AWQ_HAND_QWEIGHT)
    comps = {"scales": torch.tensor(AWQ_HAND_SCALES, dtype=torch.float16), "qzeros": _i32(AWQ_HAND_QZEROS)}
    dec = _decoder("awq", 4, 2, qweight, comps, (8, 4))
    decoded = _decode(dec, _raw(qweight), [0, 8, 16])
    expected = np.array(AWQ_HAND_IN_OUT, dtype=np.float32)
    assert _bits_equal(decoded, expected.reshape(-1))  # decoded order: [in, out] row-major
    assert _bits_equal(_logical(dec, decoded, (8, 4)), expected.T.copy())
    oracle = gq.awq_reference(qweight, comps["qzeros"], comps["scales"], 2)
    assert _bits_equal(oracle.numpy(), expected.T.copy())
    _check_counts(dec, _raw(qweight), [0, 8, 16])


# --- a real matrix, against the reference dequantizers --------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_weight(minilm_dir) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(minilm_dir / "model.safetensors"))["encoder.layer.0.intermediate.dense.weight"]  # [1536, 384]


GPTQ_CASES = {
    "int4-g128": (4, 128, False, "gptq"),
    "int4-g32-desc": (4, 32, True, "gptq"),
    "int8-g64-desc-v2": (8, 64, True, "gptq_v2"),
    "int2-nogroup": (2, -1, False, "gptq"),
}


def _cuts(nbytes: int, row_bytes: int) -> list[int]:
    """Cut points at multiples of 8 bytes that are not on stored rows."""
    cuts = [0, 8, 8 * 37, 8 * 1001, 8 * 4099, nbytes // 2 // 8 * 8 + 8 * 3, nbytes - 8, nbytes]
    assert all(c % 8 == 0 for c in cuts) and any(c % row_bytes for c in cuts[1:-1])
    return sorted(set(cuts))


def _gptq_case(w: torch.Tensor, case: str):
    bits, group, desc, fmt = GPTQ_CASES[case]
    stored, (_, values) = gq.gptq(bits, group, desc, fmt)("m.weight", w)
    comps = {k.split(".")[-1]: v for k, v in stored.items() if not k.endswith(".qweight")}
    dec = _decoder("gptq", bits, group if group > 0 else None, stored["m.qweight"], comps, tuple(w.shape), fmt, desc)
    return dec, stored, values.numpy()


@pytest.mark.parametrize("case", sorted(GPTQ_CASES))
def test_gptq_real_matrix(minilm_weight, case):
    dec, stored, oracle = _gptq_case(minilm_weight, case)
    qweight = stored["m.qweight"]
    raw = _raw(qweight)
    row_bytes = qweight.shape[1] * 4
    for cuts in ([0, raw.size], _cuts(raw.size, row_bytes)):
        decoded = _decode(dec, raw, cuts)
        assert _bits_equal(np.sort(decoded), np.sort(oracle.reshape(-1)))  # the multiset
        assert _bits_equal(_logical(dec, decoded, oracle.shape), oracle)
    # the quantization is not degenerate: a real spread of values
    assert np.unique(oracle).size > 100 and np.abs(oracle - minilm_weight.numpy()).max() < 0.5


def _check_counts(dec, raw: np.ndarray, cuts: list[int]) -> None:
    """Each piece counted equals the piece decoded: the same values held as often, the same first
    largest |value| and where it is."""
    for a, b in itertools.pairwise(cuts):
        counted = dec.counts(raw[a:b], a)
        decoded, first = dec.decode(raw[a:b], a)
        assert counted is not None and counted.first == first and counted.numel == decoded.size
        nonzero = counted.weights.reshape(-1) > 0
        entries = counted.values.reshape(-1)[nonzero].view(np.uint32)
        held, where = np.unique(entries, return_inverse=True)  # a value may be in many slots
        values, weights = np.unique(decoded.view(np.uint32), return_counts=True)
        assert np.array_equal(held, values)
        assert np.array_equal(
            np.bincount(where, weights=counted.weights.reshape(-1)[nonzero]).astype(np.int64), weights
        )
        at = int(np.argmax(np.abs(decoded)))
        red = reduce_counted(counted.values, counted.weights, counted.numel, counted.locate)
        assert red.argmax == first + at and red.max_abs == float(np.abs(decoded[at]))


def test_gptq_counts_equal_decode(minilm_weight):
    """4-bit words in one group: the C kernel counts each word's nibbles in its (scale, zero) slot."""
    dec, stored, _ = _gptq_case(minilm_weight, "int4-g128")
    raw = _raw(stored["m.qweight"])
    _check_counts(dec, raw, [0, raw.size])
    _check_counts(dec, raw, _cuts(raw.size, stored["m.qweight"].shape[1] * 4))
    _check_counts(dec, raw, [0, 8, 16])  # tiny pieces: ties for the largest |value| go to the first


def test_counts_ties_go_to_the_first_in_decoded_order():
    """Codes drawn from a few values, one scale: the largest |value| is held by many elements of each piece."""
    rng = np.random.default_rng(1)
    out, inputs, group = 64, 256, 64
    codes = rng.choice([0, 3, 15], size=(out, inputs), p=[0.3, 0.6, 0.1])
    zeros = np.full((inputs // group, out), 7)
    scales = torch.ones(inputs // group, out, dtype=torch.float16)
    gptq_w = gq.pack_rows(codes.T, 4)
    dec = _decoder("gptq", 4, group, gptq_w, {"scales": scales, "qzeros": gq.pack_columns(zeros - 1, 4)}, (out, inputs))
    raw = _raw(gptq_w)
    _check_counts(dec, raw, [0, 8, 264, 1000, raw.size])
    awq_w = gq.pack_columns(codes.T, 4, gq.AWQ_ORDER)
    awq_z = gq.pack_columns(zeros, 4, gq.AWQ_ORDER)
    dec = _decoder("awq", 4, group, awq_w, {"scales": scales, "qzeros": awq_z}, (out, inputs))
    raw = _raw(awq_w)
    _check_counts(dec, raw, [0, 8, 264, 1000, raw.size])


@pytest.mark.parametrize("case", ["int4-g32-desc", "int2-nogroup", "int8-g64-desc-v2"])
def test_gptq_decoded_not_counted(minilm_weight, case):
    """Groups interleaved in words, 2- and 8-bit codes: no counting path (decode is used)."""
    dec, stored, _ = _gptq_case(minilm_weight, case)
    assert dec.counts(_raw(stored["m.qweight"])[:64], 0) is None


def test_awq_counts_equal_decode(minilm_weight):
    stored, _ = gq.awq(64)("m.weight", minilm_weight)
    comps = {k.split(".")[-1]: v for k, v in stored.items() if not k.endswith(".qweight")}
    dec = _decoder("awq", 4, 64, stored["m.qweight"], comps, tuple(minilm_weight.shape))
    raw = _raw(stored["m.qweight"])
    _check_counts(dec, raw, [0, raw.size])
    _check_counts(dec, raw, _cuts(raw.size, stored["m.qweight"].shape[1] * 4))
    _check_counts(dec, raw, [0, 8, 16])


@pytest.mark.parametrize("group", [128, 64])
def test_awq_real_matrix(minilm_weight, group):
    stored, (_, values) = gq.awq(group)("m.weight", minilm_weight)
    oracle = values.numpy()
    comps = {k.split(".")[-1]: v for k, v in stored.items() if not k.endswith(".qweight")}
    dec = _decoder("awq", 4, group, stored["m.qweight"], comps, tuple(minilm_weight.shape))
    raw = _raw(stored["m.qweight"])
    for cuts in ([0, raw.size], _cuts(raw.size, stored["m.qweight"].shape[1] * 4)):
        decoded = _decode(dec, raw, cuts)
        assert _bits_equal(np.sort(decoded), np.sort(oracle.reshape(-1)))
        assert _bits_equal(_logical(dec, decoded, oracle.shape), oracle)
    assert np.unique(oracle).size > 100 and np.abs(oracle - minilm_weight.numpy()).max() < 0.5


def _check_selection(dec, decoded: np.ndarray, logical: np.ndarray, rows: Segments) -> None:
    sel = dec.selection(rows)
    assert sel.numel == rows.numel
    picked = sel.view(decoded).reshape(-1)
    index = dec.logical_index(sel.view(np.arange(decoded.size)).reshape(-1))
    expected_index = np.sort(rows.view(np.arange(logical.size)).reshape(-1))
    assert np.array_equal(np.sort(index), expected_index)
    assert _bits_equal(picked, logical.reshape(-1)[index])


def test_selection_of_rows(minilm_weight):
    out, inputs = minilm_weight.shape
    dec, stored, oracle = _gptq_case(minilm_weight, "int4-g32-desc")
    decoded = _decode(dec, _raw(stored["m.qweight"]), [0, _raw(stored["m.qweight"]).size])
    stored_a, (_, values_a) = gq.awq(128)("m.weight", minilm_weight)
    comps_a = {k.split(".")[-1]: v for k, v in stored_a.items() if not k.endswith(".qweight")}
    dec_a = _decoder("awq", 4, 128, stored_a["m.qweight"], comps_a, (out, inputs))
    decoded_a = _decode(dec_a, _raw(stored_a["m.qweight"]), [0, _raw(stored_a["m.qweight"]).size])
    selections = [
        Segments(0, out * inputs, out * inputs, 1),  # whole
        Segments(512 * inputs, 512 * inputs, 512 * inputs, 1),  # the middle third (a fused part)
        Segments(37 * inputs, 5 * inputs, 5 * inputs, 1),
        Segments(64 * inputs, 64 * inputs, 192 * inputs, 8),  # GPT-NeoX style: runs that tile the rows
    ]
    for rows in selections:
        _check_selection(dec, decoded, oracle, rows)
        _check_selection(dec_a, decoded_a, values_a.numpy(), rows)
    # sliced logical rows equal the selected decoded values, in logical order
    sel = dec.selection(Segments(100 * inputs, 3 * inputs, 3 * inputs, 1))
    index = dec.logical_index(sel.view(np.arange(decoded.size)).reshape(-1))
    got = np.empty(3 * inputs, dtype=np.float32)
    got[index - 100 * inputs] = sel.view(decoded).reshape(-1)
    assert _bits_equal(got.reshape(3, inputs), oracle[100:103])
    with pytest.raises(CheckpointFormatError):  # runs that do not tile the outputs: not one regular selection
        dec.selection(Segments(0, 64 * inputs, 100 * inputs, 3))
    with pytest.raises(CheckpointFormatError):  # not whole rows
        dec.selection(Segments(5, inputs, inputs, 1))


# --- damaged companions ------------------------------------------------------------------------------------


def _gptq_small():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.05
    stored, _ = gq.gptq(4, 64, True)("m.weight", w)
    return stored["m.qweight"], {k.split(".")[-1]: v for k, v in stored.items() if not k.endswith(".qweight")}


@pytest.mark.parametrize(
    "role, bad",
    [
        ("scales", lambda t: t[:-1]),
        ("qzeros", lambda t: t[:, :-1]),
        ("g_idx", lambda t: t[:-8]),
        ("g_idx", lambda t: t + 3),  # groups past the last
    ],
)
def test_gptq_damaged_companions(role, bad):
    qweight, comps = _gptq_small()
    comps[role] = bad(comps[role]).contiguous()
    with pytest.raises(CheckpointFormatError):
        _decoder("gptq", 4, 64, qweight, comps, (64, 256), desc=True)


def test_gptq_integer_scales_are_refused():
    qweight, comps = _gptq_small()
    comps["scales"] = torch.zeros(4, 64, dtype=torch.int32)  # the right shape, the wrong type
    with pytest.raises(CheckpointFormatError):
        _decoder("gptq", 4, 64, qweight, comps, (64, 256), desc=True)


@pytest.mark.parametrize("role", ["scales", "qzeros"])
def test_awq_damaged_companions(role):
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.05
    stored, _ = gq.awq(64)("m.weight", w)
    comps = {k.split(".")[-1]: v for k, v in stored.items() if not k.endswith(".qweight")}
    comps[role] = comps[role][:, : comps[role].shape[1] // 2].contiguous()
    with pytest.raises(CheckpointFormatError):
        _decoder("awq", 4, 64, stored["m.qweight"], comps, (64, 256))
    comps = {k.split(".")[-1]: v for k, v in stored.items() if not k.endswith(".qweight")}
    with pytest.raises(CheckpointFormatError):  # qweight that is not [in, out / 8] of the logical shape
        _decoder("awq", 4, 64, stored["m.qweight"], comps, (32, 512))


def test_gptq_no_g_idx_is_default_groups():
    qweight, comps = _gptq_small()
    comps.pop("g_idx")
    dec = _decoder("gptq", 4, 64, qweight, comps, (64, 256))
    oracle = gq.gptq_reference(
        qweight, comps["qzeros"], comps["scales"], (torch.arange(256) // 64).to(torch.int32), 4, "gptq"
    )
    raw = _raw(qweight)
    assert _bits_equal(_logical(dec, _decode(dec, raw, [0, 24, raw.size]), (64, 256)), oracle.numpy())
    assert math.prod(oracle.shape) == 64 * 256


# --- end to end: the fit of a GPTQ / AWQ checkpoint is the fit of its dequantized twin ------------------------

E2E = {
    "gptq": (lambda: gq.gptq(), gq.GPTQ_CONFIG, "GPTQ int4, group 128"),
    "gptq-desc-g32": (
        lambda: gq.gptq(4, 32, True),
        {**gq.GPTQ_CONFIG, "group_size": 32, "desc_act": True},
        "GPTQ int4, group 32",
    ),
    "gptq-int8-v2": (
        lambda: gq.gptq(8, 64, False, "gptq_v2"),
        {**gq.GPTQ_CONFIG, "bits": 8, "group_size": 64, "checkpoint_format": "gptq_v2"},
        "GPTQ int8, group 64",
    ),
    "awq": (lambda: gq.awq(), gq.AWQ_CONFIG, "AWQ int4, group 128"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(E2E))
def test_end_to_end_in_small_pieces(name, tmp_path, minilm_dir, monkeypatch, knobs):
    """Two encoder layers read in pieces of 8008 bytes (cut inside stored rows): same fits, statistics and
    argmax as the float32 twin, every linear weight dequantized."""
    from . import quant_checkpoints as qc

    knobs(split_bytes=8008, local_chunk_bytes=8008)
    factory, config, label = E2E[name]
    qdir, tdir = qc.write_pair(tmp_path, minilm_dir, factory(), config, layers=2)
    row = qc.fit_row(qdir)
    qc.same_fits(row, qc.fit_row(tdir), k_tol=1e-9, lam_rel=1e-9)
    labels = [m["dequantized"]["label"] for m in row["matrices"] if m.get("dequantized")]
    assert len(labels) == 13 and set(labels) == {label}  # 2 layers x 6 linear weights + the pooler


@pytest.mark.parametrize("bits", [2, 4])
def test_v1_zero_points_of_zero_are_read_as_vllm_does_and_the_record_says_so(bits, tmp_path, minilm_dir):
    """Issue 33: a GPTQ v1 asymmetric group whose weights are all >= 0 has the zero point 0, stored as -1: its
    masked code 2^bits - 1 reads 2^bits in vLLM's kernels (and here) but 0 in AutoGPTQ's torch dequantizer. The
    values stay those of 2^bits (rows do not change); the weight's record says which reading and why."""
    from . import quant_checkpoints as qc

    g = torch.Generator().manual_seed(bits)
    positive = (torch.rand(64, 128, generator=g) * 0.05).to(torch.float32)  # every group >= 0: zero point 0
    positive[:, :32] -= 0.025  # the first group holds negatives: an ordinary zero point
    positive[5, 40] = 0.2  # one largest |w| (grid values tie, and ties may be found in another order)
    extra = {"encoder.layer.0.positive.dense.weight": positive}
    config = {**gq.GPTQ_CONFIG, "bits": bits, "group_size": 32}
    qdir, tdir = qc.write_pair(tmp_path, minilm_dir, gq.gptq(bits, 32), config, extra=extra, layers=1)
    row = qc.fit_row(qdir)
    qc.same_fits(row, qc.fit_row(tdir), k_tol=1e-9, lam_rel=1e-9)  # the twin holds the values of 2^bits
    records = {m["name"]: m for m in row["matrices"]}
    top = 1 << bits
    note = records["encoder.layer.0.positive.dense.weight"]["note"]
    assert note == (
        f"dequantized from GPTQ int{bits}, group 32; GPTQ v1 zero points stored as {top - 1} read as {top} in 192 of "
        f"256 groups (the format's +1 unwrapped, as vLLM's GPTQ kernels read them); AutoGPTQ's torch dequantizer "
        f"wraps them to 0 ((stored + 1) & {top - 1}), which puts those groups' values {top} scale steps higher"
    )
    assert "zero points" not in records["encoder.layer.0.attention.self.query.weight"]["note"]  # they straddle 0

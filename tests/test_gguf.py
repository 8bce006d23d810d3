"""GGUF: header validation, dequantization, Q/K un-permutation, config, and the real SmolLM2 file.

Synthetic files are written by a minimal writer below (no dependency); the `gguf` package, where
installed, is only an oracle for dequantized values and tensor placement.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from weightdiag.api import fit_plan
from weightdiag.decode import ggml_blocks
from weightdiag.decode.formats import build_decoder
from weightdiag.errors import CheckpointFormatError
from weightdiag.layout import arch_from_config
from weightdiag.run.measure import FitOptions
from weightdiag.source import gguf as G
from weightdiag.source.gguf import GGUFReader, open_gguf, parse_gguf_bytes
from weightdiag.source.local import LocalReader
from weightdiag.source.plan import STORAGE_NUMPY, ModelPlan, TensorRef

# --- a minimal GGUF writer --------------------------------------------------------------------

U32, I32, F32V, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10
_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
TYPE_ID = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "IQ2_XS": 17, "BF16": 30}


def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value: Any) -> bytes:
    if vtype == STR:
        return _str(value)
    if vtype == ARR:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, x) for x in items)
    return struct.pack(_FMT[vtype], value)


Tensor = tuple[str, tuple[int, ...], str, bytes]  # name, HF shape, ggml type, stored bytes


def gguf_file(
    kv: list[tuple[str, int, Any] | bytes],
    tensors: list[Tensor],
    *,
    alignment: int = 32,
    version: int = 3,
    offsets: list[int] | None = None,
    counts: tuple[int, int] | None = None,
    type_ids: list[int] | None = None,
) -> bytes:
    """A GGUF v2/v3 file. A bytes entry in `kv` is written as is; `offsets`, `counts` and
    `type_ids` override what the writer would put (to break the file)."""
    n_tensors, n_kv = counts or (len(tensors), len(kv))
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)
    for entry in kv:
        if isinstance(entry, bytes):
            head += entry
        else:
            key, vtype, value = entry
            head += _str(key) + struct.pack("<I", vtype) + _value(vtype, value)
    data = b""
    for i, (name, shape, type_name, payload) in enumerate(tensors):
        dims = tuple(reversed(shape))
        offset = len(data) if offsets is None else offsets[i]
        type_id = TYPE_ID[type_name] if type_ids is None else type_ids[i]
        head += _str(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, type_id, offset)
        data += payload + bytes(-len(payload) % alignment)
    return head + bytes(-len(head) % alignment) + data


def llama_kv(arch: str = "llama", heads: int = 4, kv_heads: int = 2) -> list[tuple[str, int, Any]]:
    return [
        ("general.architecture", STR, arch),
        ("general.name", STR, "tiny test model"),
        (f"{arch}.block_count", U32, 1),
        (f"{arch}.embedding_length", U32, 64),
        (f"{arch}.attention.head_count", U32, heads),
        (f"{arch}.attention.head_count_kv", U32, kv_heads),
        (f"{arch}.feed_forward_length", U32, 96),
        (f"{arch}.attention.layer_norm_rms_epsilon", F32V, 1e-6),
        ("tokenizer.ggml.tokens", ARR, (STR, [f"t{i}" for i in range(100)])),
    ]


def write(tmp_path: Path, blob: bytes, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(blob)
    return path


def values_of(ref: TensorRef, raw: np.ndarray) -> np.ndarray:
    """A tensor's stored bytes as the pipeline reduces them: decoded when it has a `quant` (weightdiag.decode)."""
    if ref.quant is None:
        return raw.view(STORAGE_NUMPY[ref.dtype.name]).reshape(ref.shape)
    values, first = build_decoder(ref.quant, {}).decode(raw, 0)
    assert first == 0 and values.dtype == STORAGE_NUMPY[ref.dtype.name]
    return values.reshape(ref.shape)


def read(plan: ModelPlan, reader: GGUFReader, name: str) -> np.ndarray:
    ref = next(t for t in plan.tensors if t.name == name)
    out = np.empty(ref.nbytes, dtype=np.uint8)
    reader.read_into(ref, out)
    return values_of(ref, out)


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rows -> llama.cpp rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# --- test-side quantizers: codes and scales -> stored bytes and exact expected values --------


def _scales(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.standard_normal(n) * 0.01).astype(np.float16)


def q8_0(rng: np.random.Generator, n_blocks: int) -> tuple[bytes, np.ndarray]:
    d, q = _scales(rng, n_blocks), rng.integers(-128, 128, (n_blocks, 32), dtype=np.int8)
    raw = b"".join(d[i].tobytes() + q[i].tobytes() for i in range(n_blocks))
    return raw, (q.astype(np.float32) * d.astype(np.float32)[:, None]).ravel()


def _packed(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)  # element j low nibble, j + 16 high


def q4_0(rng: np.random.Generator, n_blocks: int) -> tuple[bytes, np.ndarray]:
    d, q = _scales(rng, n_blocks), rng.integers(0, 16, (n_blocks, 32), dtype=np.uint8)
    qs = _packed(q)
    raw = b"".join(d[i].tobytes() + qs[i].tobytes() for i in range(n_blocks))
    return raw, ((q.astype(np.float32) - 8) * d.astype(np.float32)[:, None]).ravel()


def q4_1(rng: np.random.Generator, n_blocks: int) -> tuple[bytes, np.ndarray]:
    d, m = _scales(rng, n_blocks), _scales(rng, n_blocks)
    q = rng.integers(0, 16, (n_blocks, 32), dtype=np.uint8)
    qs = _packed(q)
    raw = b"".join(d[i].tobytes() + m[i].tobytes() + qs[i].tobytes() for i in range(n_blocks))
    values = q.astype(np.float32) * d.astype(np.float32)[:, None] + m.astype(np.float32)[:, None]
    return raw, values.ravel()


QUANTIZERS = {"Q8_0": q8_0, "Q4_0": q4_0, "Q4_1": q4_1}


# --- synthetic round trips --------------------------------------------------------------------


def test_float_and_quantized_round_trip(tmp_path, knobs):
    rng = np.random.default_rng(1)
    f32 = rng.standard_normal((8, 64)).astype(np.float32)
    f16 = rng.standard_normal((64,)).astype(np.float16)
    tensors: list[Tensor] = [("a.f32", (8, 64), "F32", f32.tobytes()), ("b.f16", (64,), "F16", f16.tobytes())]
    expected: dict[str, np.ndarray] = {}
    for name, quantize in QUANTIZERS.items():
        raw, values = quantize(rng, 3 * 4)  # (3, 128): 4 blocks per row
        tensors.append((f"m.{name}", (3, 128), name, raw))
        expected[f"m.{name}"] = values.reshape(3, 128)
    path = write(tmp_path, gguf_file(llama_kv(), tensors))
    knobs(decode_chunk=40)  # several block batches per tensor: seams exercised
    plan, reader = open_gguf(path)
    try:
        np.testing.assert_array_equal(read(plan, reader, "a.f32"), f32)
        np.testing.assert_array_equal(read(plan, reader, "b.f16"), f16)
        for name, values in expected.items():
            np.testing.assert_array_equal(read(plan, reader, name), values)
    finally:
        reader.close()
    refs = {t.name: t for t in plan.tensors}
    assert refs["b.f16"].dtype.name == "F16"
    assert refs["b.f16"].note is None  # F16 delivered as stored
    for name in QUANTIZERS:
        ref = refs[f"m.{name}"]
        assert ref.dtype.name == "F32"
        assert ref.shape == (3, 128)
        assert ref.nbytes == 3 * 4 * G.GGML_BY_NAME[name].size  # the stored blocks, decoded in the stream
        assert ref.note == f"GGUF {name}, dequantized"
        assert ref.quant is not None and ref.quant.spec.format == f"gguf-{name.lower()}"
        assert not ref.quant.companions and ref.quant.logical_shape == (3, 128)
        assert ref.quant.unit_bytes == G.GGML_BY_NAME[name].size
    assert refs["a.f32"].quant is None and refs["b.f16"].quant is None  # plain byte ranges
    assert plan.file_format == "gguf"
    assert plan.model_id == "model"  # the file name, not general.name ("tiny test model", with spaces)
    assert [s.name for s in plan.shards] == ["model.gguf"]
    assert plan.shards[0].size == path.stat().st_size
    assert isinstance(reader, LocalReader)


@pytest.mark.parametrize("k_type", ["F32", "Q8_0"])
def test_llama_qk_rows_are_unpermuted(tmp_path, k_type):
    rng = np.random.default_rng(2)
    heads, kv_heads, head_dim, cols = 4, 2, 8, 64
    q = rng.standard_normal((heads * head_dim, cols)).astype(np.float32)
    if k_type == "F32":
        k = rng.standard_normal((kv_heads * head_dim, cols)).astype(np.float32)
        k_raw = llama_permute(k, kv_heads).tobytes()
    else:  # quantize per row so the stored blocks can be permuted as whole rows
        k_raw_rows, k_vals = q8_0(rng, kv_heads * head_dim * cols // 32)
        per_row = len(k_raw_rows) // (kv_heads * head_dim)
        rows = np.frombuffer(k_raw_rows, np.uint8).reshape(kv_heads * head_dim, per_row)
        k = k_vals.reshape(kv_heads * head_dim, cols)
        k_raw = llama_permute(rows, kv_heads).tobytes()
    bias = np.arange(heads * head_dim, dtype=np.float32)
    tensors: list[Tensor] = [
        ("blk.0.attn_q.weight", q.shape, "F32", llama_permute(q, heads).tobytes()),
        ("blk.0.attn_k.weight", k.shape, k_type, k_raw),
        ("blk.0.attn_q.bias", bias.shape, "F32", llama_permute(bias, heads).tobytes()),
        ("blk.0.attn_v.weight", k.shape, "F32", llama_permute(k, kv_heads).astype(np.float32).tobytes()),
    ]
    plan, reader = open_gguf(write(tmp_path, gguf_file(llama_kv(heads=heads, kv_heads=kv_heads), tensors)))
    try:
        np.testing.assert_array_equal(read(plan, reader, "blk.0.attn_q.weight"), q)
        np.testing.assert_array_equal(read(plan, reader, "blk.0.attn_k.weight"), k)
        np.testing.assert_array_equal(read(plan, reader, "blk.0.attn_q.bias"), bias)
        # V is never permuted by the convert script: delivered exactly as stored.
        np.testing.assert_array_equal(read(plan, reader, "blk.0.attn_v.weight"), llama_permute(k, kv_heads))
    finally:
        reader.close()
    notes = {t.name: t.note for t in plan.tensors}
    assert "un-permuted" in notes["blk.0.attn_q.weight"]
    assert "un-permuted" in notes["blk.0.attn_k.weight"]


def test_qwen2_rows_are_left_alone_and_gemma_norms_shifted(tmp_path):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((32, 64)).astype(np.float32)
    tensors: list[Tensor] = [("blk.0.attn_q.weight", q.shape, "F32", q.tobytes())]
    plan, reader = open_gguf(write(tmp_path, gguf_file(llama_kv("qwen2"), tensors)))
    np.testing.assert_array_equal(read(plan, reader, "blk.0.attn_q.weight"), q)
    reader.close()

    w = rng.standard_normal(64).astype(np.float32) * 0.1
    norm = (w + np.float32(1)).astype(np.float32)
    tensors = [("blk.0.attn_norm.weight", (64,), "F32", norm.tobytes()), *tensors]
    plan, reader = open_gguf(write(tmp_path, gguf_file(llama_kv("gemma"), tensors), "g.gguf"))
    np.testing.assert_allclose(read(plan, reader, "blk.0.attn_norm.weight"), w, atol=1e-7)
    reader.close()
    assert arch_from_config(plan.config).norm_offset == 1.0  # the pipeline adds the 1 back


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma", "phi3", "gpt2", "falcon"])
def test_config_from_metadata_for_each_family(tmp_path, arch):
    kv = llama_kv(arch)
    tensors: list[Tensor] = [("output.weight", (100, 64), "F32", bytes(100 * 64 * 4))]
    plan, reader = open_gguf(write(tmp_path, gguf_file(kv, tensors)))
    reader.close()
    info = arch_from_config(plan.config)
    assert info.family == arch
    assert info.n_layers == 1
    assert info.d_model == 64
    assert (info.n_heads, info.n_kv_heads, info.ffn_size, info.vocab_size) == (4, 2, 96, 100)
    assert info.norm_type == "rmsnorm"
    assert plan.config["rms_norm_eps"] == 1e-6
    assert info.tied_embeddings is False  # output.weight is present
    assert plan.metadata[f"{arch}.attention.head_count"] == "4"
    assert plan.metadata["tokenizer.ggml.tokens"] == "[100 x STRING]"


def test_unsupported_type_is_skipped_with_a_reason(tmp_path):
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    tensors: list[Tensor] = [
        ("blk.0.ffn_down.weight", w.shape, "F32", w.tobytes()),
        ("blk.0.ffn_up.weight", (1, 256), "IQ2_XS", bytes(74)),
    ]
    plan, reader = open_gguf(write(tmp_path, gguf_file(llama_kv(), tensors)))
    ref = next(t for t in plan.tensors if t.name == "blk.0.ffn_up.weight")
    assert ref.dtype.name == "GGUF_IQ2_XS"
    assert not ref.dtype.fittable
    row = fit_plan(plan, reader, FitOptions(device="cpu"))
    (skipped,) = row["skipped"]
    assert skipped["name"] == "blk.0.ffn_up.weight"
    assert "GGUF_IQ2_XS" in skipped["reason"]
    assert [m["name"] for m in row["matrices"]] == ["blk.0.ffn_down.weight"]
    assert row["model"]["format"] == "gguf"


def test_truncated_after_opening_is_a_format_error(tmp_path):
    w = np.ones((4, 64), np.float32)
    path = write(tmp_path, gguf_file(llama_kv(), [("blk.0.attn_v.weight", w.shape, "F32", w.tobytes())]))
    plan, reader = open_gguf(path)
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(CheckpointFormatError, match=r"changed while being read \(its size went from"):
        read(plan, reader, "blk.0.attn_v.weight")
    reader.close()


# --- malformed headers ------------------------------------------------------------------------

ONE = [("a", (2, 32), "F32", bytes(256))]
TWO = [*ONE, ("b", (32,), "F32", bytes(128))]
VALID = gguf_file(llama_kv(), ONE)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"GGU", "too short"),
        (b"GGML" + gguf_file(llama_kv(), ONE)[4:], "bad magic"),
        (gguf_file(llama_kv(), ONE, version=1), "unsupported GGUF version 1"),
        (gguf_file(llama_kv(), ONE, version=4), "unsupported GGUF version 4"),
        (b"GGUF" + struct.pack(">I", 3) + gguf_file(llama_kv(), ONE)[8:], "big-endian"),
        (gguf_file(llama_kv(), ONE)[:150], "file ends inside the header"),
        (gguf_file(llama_kv(), ONE)[:-1], "runs past the end"),
        (gguf_file(llama_kv(), ONE, offsets=[4096]), "runs past the end"),
        (gguf_file(llama_kv(), TWO, offsets=[0, 128]), "overlaps"),
        (gguf_file(llama_kv(), ONE, offsets=[16]), "not a multiple of the alignment"),
        (gguf_file(llama_kv(), ONE, counts=(1 << 40, 9)), "tensor count"),
        (gguf_file(llama_kv(), ONE, counts=(1, 1 << 40)), "metadata count"),
        (gguf_file([_str("k") + struct.pack("<IQ", STR, 1 << 62)], ONE), "above the"),
        (gguf_file([_str("k") + struct.pack("<IIQ", ARR, U64, 1 << 50)], ONE), "more than the file can hold"),
        (gguf_file([_str("k") + struct.pack("<II", 77, 1)], ONE), "unknown value type 77"),
        (gguf_file([_str("k") + struct.pack("<I", STR) + _str(b"\xff\xfe")], ONE), "not valid UTF-8"),
        (gguf_file([("k", U32, 1), ("k", U32, 2)], ONE), "appears twice"),
        (gguf_file(llama_kv(), [*ONE, ("a", (32,), "F32", bytes(128))]), "appears twice"),
        (gguf_file([("general.alignment", U32, 24)], ONE, alignment=24), "general.alignment"),
        (gguf_file(llama_kv(), [("a", (2, 48), "Q8_0", bytes(136))]), "not a multiple of the Q8_0 block"),
        (gguf_file(llama_kv(), [("a", (1, 1, 1, 1, 32), "F32", bytes(128))]), "dimensions"),
        (gguf_file(llama_kv(), ONE, type_ids=[99]), "unknown ggml type 99"),
        (VALID[: VALID.index(_str("a")) + 12], "file ends inside the header while reading tensor 'a'"),
    ],
)
def test_malformed_files_raise_one_line_format_errors(tmp_path, blob, message):
    with pytest.raises(CheckpointFormatError, match=message) as err:
        parse_gguf_bytes(blob, "bad.gguf")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("bad.gguf: ")
    assert "; " in text
    with pytest.raises(CheckpointFormatError):  # the same through open_gguf on a real file
        open_gguf(write(tmp_path, blob))


@pytest.mark.parametrize("version", [2, 3])
def test_valid_minimal_file_parses(version):
    header = parse_gguf_bytes(gguf_file(llama_kv(), TWO, version=version))
    assert [t.name for t in header.tensors] == ["a", "b"]
    assert header.alignment == 32
    assert header.version == version
    assert header.metadata["llama.attention.head_count"] == 4
    a, b = header.tensors
    assert a.shape == (2, 32)
    assert (a.offset, b.offset) == (header.data_start, header.data_start + 256)


# --- fuzzing: nothing but CheckpointFormatError escapes ---------------------------------------

FUZZ_BASE = gguf_file(
    [*llama_kv(), ("general.alignment", U32, 64), ("x.list", ARR, (ARR, [(I32, [1, 2]), (STR, ["a"])]))],
    [
        ("blk.0.attn_q.weight", (8, 32), "Q4_1", bytes(8 * 20)),
        ("blk.0.attn_k.weight", (4, 32), "Q8_0", bytes(4 * 34)),
        ("blk.0.ffn_norm.weight", (64,), "F32", bytes(256)),
        ("blk.0.ffn_up.weight", (1, 256), "IQ2_XS", bytes(74)),
    ],
    alignment=64,
)


def _open_and_read_all(blob: bytes) -> None:
    try:
        parse_gguf_bytes(blob)
    except CheckpointFormatError:
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "f.gguf")
        path.write_bytes(blob)
        plan, reader = open_gguf(path)
        try:
            for ref in plan.tensors:
                if ref.dtype.fittable:
                    out = np.empty(ref.nbytes, np.uint8)
                    reader.read_into(ref, out)
                    values_of(ref, out)  # damaged blocks decode to inf/nan, never an exception
        finally:
            reader.close()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.booleans())
def test_fuzz_random_bytes(blob, with_magic):
    _open_and_read_all((b"GGUF\x03\x00\x00\x00" + blob) if with_magic else blob)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(FUZZ_BASE) - 1), st.integers(0, 255)), max_size=6), st.data())
def test_fuzz_mutated_valid_file(mutations, data):
    blob = bytearray(FUZZ_BASE)
    for at, value in mutations:
        blob[at] = value
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(blob))))
    _open_and_read_all(bytes(blob[:cut]))


# --- dequantization against the gguf package ----------------------------------------------------


def test_the_source_plans_what_the_decoders_decode():
    assert sorted(ggml_blocks.DECODERS) == sorted(G.DEQUANTIZED_TYPES)


@pytest.mark.parametrize("type_name", sorted(ggml_blocks.DECODERS))
def test_dequantize_matches_the_gguf_package(type_name):
    gguf = pytest.importorskip("gguf")
    t = G.GGML_BY_NAME[type_name]
    raw = np.random.default_rng(t.id).integers(0, 256, 64 * t.size, dtype=np.uint8)
    with np.errstate(all="ignore"):
        expected = gguf.quants.dequantize(raw.reshape(1, -1), gguf.GGMLQuantizationType[type_name]).ravel()
    np.testing.assert_array_equal(ggml_blocks.dequantize(raw, type_name), expected.astype(np.float32))


# --- the real SmolLM2-135M-Instruct Q4_1 file ---------------------------------------------------


@pytest.fixture(scope="module")
def smollm(smollm_gguf):
    plan, reader = open_gguf(smollm_gguf)
    yield plan, reader
    reader.close()


def test_smollm_plan_and_config(smollm):
    plan, _ = smollm
    assert len(plan.tensors) == 272
    assert plan.file_format == "gguf"
    info = arch_from_config(plan.config)
    assert (info.family, info.n_layers, info.d_model) == ("llama", 30, 576)
    assert (info.n_heads, info.n_kv_heads, info.ffn_size, info.vocab_size) == (9, 3, 1536, 49152)
    assert info.tied_embeddings is True
    assert info.norm_type == "rmsnorm"
    assert plan.model_id == "SmolLM2-135M-Instruct.Q4_1"  # the file name, not general.name (free text)
    assert plan.metadata["llama.attention.layer_norm_rms_epsilon"] == "1e-05"
    assert plan.metadata["gguf.tensor_types"] == "210 Q4_1, 61 F32, 1 Q8_0"
    assert len(plan.shards[0].header_sha256) == 64
    embed = plan.tensors[0]
    assert embed.name == "token_embd.weight"
    assert embed.shape == (49152, 576)
    assert "Q8_0" in embed.note


@pytest.mark.slow  # the gguf package dequantizes in Python: 5 to 8 s
def test_smollm_values_match_the_gguf_package(smollm, smollm_gguf):
    gguf = pytest.importorskip("gguf")
    plan, reader = smollm
    oracle = {t.name: t for t in gguf.GGUFReader(smollm_gguf).tensors}
    assert {t.name for t in plan.tensors} == set(oracle)
    for ref in plan.tensors:  # placement and shapes of every tensor
        o = oracle[ref.name]
        assert ref.start == o.data_offset
        assert ref.shape == tuple(int(d) for d in reversed(o.shape))
        assert ref.nbytes == o.n_bytes  # the stored bytes, decoded in the stream
    sample = {
        "token_embd.weight": None,  # Q8_0
        "blk.0.attn_q.weight": 9,  # Q4_1, permuted with 9 heads
        "blk.17.attn_k.weight": 3,  # Q4_1, permuted with 3 KV heads
        "blk.29.ffn_down.weight": None,  # Q4_1
        "blk.3.attn_norm.weight": None,  # F32
        "output_norm.weight": None,  # F32
    }
    types = set()
    for name, heads in sample.items():
        o = oracle[name]
        types.add(o.tensor_type.name)
        expected = gguf.quants.dequantize(o.data, o.tensor_type).astype(np.float32)
        ours = read(plan, reader, name)
        # Permuting our HF-order rows the way the convert script does gives back the stored order.
        np.testing.assert_array_equal(llama_permute(ours, heads) if heads else ours, expected)
    assert types == {"Q8_0", "Q4_1", "F32"}


def test_smollm_fits_end_to_end(smollm_gguf, cpu_fit):
    row = cpu_fit(smollm_gguf)  # api.fit_model: open_gguf then fit_plan, fitted once for the report tests too
    assert row["architecture"]["attention"] == "GQA 3:1"
    assert {"q", "k", "v", "o", "gate", "up", "down", "embed"} <= set(row["kinds"])
    assert not row["skipped"]
    assert not row["unclassified"]
    matrices = row["matrices"]
    assert len(matrices) == 211
    assert len(row["vectors"]) == 61
    assert all("Q4_1" in m["note"] for m in matrices if m["kind"] != "embed")
    assert row["model"]["format"] == "gguf"
    assert row["files"][0]["name"] == smollm_gguf.name


def test_smollm_rows_name_the_stored_type_and_the_metadata_source(smollm_gguf):
    # Issue 11: a Q4_1 matrix is not "F32", and the architecture facts came from GGUF metadata.
    plan, reader = open_gguf(smollm_gguf)
    row = fit_plan(plan, reader, FitOptions(device="cpu", include=("blk.0.*", "*norm*")))
    assert row["architecture"]["sources"][0] == "GGUF metadata"
    assert "config.json" not in row["architecture"]["sources"]
    quantized = [m for m in row["matrices"] if "Q4_1" in m.get("note", "")]
    assert quantized
    assert all(m["dtype"] == "Q4_1" and m["quantization"] == "Q4_1" and m["fitted_dtype"] == "F32" for m in quantized)
    assert row["vectors"]
    assert all(v["dtype"] in G.RAW_TYPES and "quantization" not in v for v in row["vectors"])


def test_bytes_read_counts_the_file_not_the_dequantized_values(smollm_gguf):
    """run.bytes_read (and the progress bar's total) is what was read from the file: a 98 MB Q4_1 file,
    not the 538 MB of F32 it dequantizes to."""
    from weightdiag.api import fit_path

    row = fit_path(str(smollm_gguf), FitOptions(device="cpu"))
    size = row["files"][0]["size"]
    assert row["run"]["bytes_read"] <= size
    assert row["run"]["bytes_read"] > 0.9 * size  # nearly the whole file: the tensors' stored bytes


@pytest.mark.parametrize(
    ("name", "blob", "what", "suffix"),
    [
        ("model.safetensors", VALID, "a GGUF file", ".gguf"),
        ("model.safetensors", b"PK\x03\x04" + bytes(60), "a zip archive", ".bin"),
        (
            "model.gguf",
            struct.pack("<Q", 32) + b'{"__metadata__":{"a":"b"}}'.ljust(32),
            "a safetensors file",
            ".safetensors",
        ),
    ],
)
def test_a_file_named_for_another_format_is_named_by_its_first_bytes(tmp_path, name, blob, what, suffix):
    """Issue 42: a GGUF file named .safetensors was called damaged ("re-download it"); its first bytes say GGUF."""
    from .conftest import run_cli

    path = write(tmp_path, blob, name)
    out = run_cli("fit", str(path), "--no-save")
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert f"by its first bytes it is {what}" in line and f"give it the suffix {suffix}, which weightdiag reads" in line
    assert "re-download" not in line and "damaged" not in line

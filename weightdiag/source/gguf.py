"""GGUF files (llama.cpp): header validation, an HF-style config, the tensor table, the reader.

Format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), little-endian: magic "GGUF",
u32 version (2 or 3; v1 used 32-bit counts and is refused), u64 tensor count, u64 metadata count,
the metadata (key string, u32 value type, value; strings are u64 length + UTF-8, arrays u32 element
type + u64 count + elements), then one info per tensor (name, u32 n_dims, u64 dims innermost
first, u32 ggml type, u64 offset relative to the data section), padding to `general.alignment`
(default 32), the data section. Like the safetensors parser we trust nothing: counts and lengths are
capped and bounded by the file size, every tensor's byte size follows from its type and dims,
offsets are aligned, inside the file and do not overlap. Every violation raises
CheckpointFormatError with one line; no other exception escapes `parse_gguf`, and `open_gguf` adds
only ModelPathError for paths it cannot open.

What the pipeline sees (TensorRef): HF shapes (GGUF dims reversed); `start..end` are the stored bytes,
read in chunks through the engine like a safetensors file's (GGUFReader is a LocalReader):

* F32, F16, BF16, F64 (and integer types) are plain tensors of their own DType;
* quantized types weightdiag can decode (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL,
  IQ4_XS, MXFP4) are F32 tensors whose `quant` (format "gguf-q4_1", no companions: the scales
  live in the blocks) has their blocks dequantized piece by piece (weightdiag.decode.formats.gguf),
  with `note` "GGUF Q4_1, dequantized";
* any other ggml type gets a non-fittable DType named "GGUF_<type>", so the pipeline lists the
  tensor as skipped ("float format GGUF_IQ2_XS is not supported for fitting yet").

llama.cpp's convert script permutes the rows of llama-family attention Q and K weights (for its rotary
layout) and stores Gemma norms as 1 + w: such tensors get a `quant` too (format "gguf-f16" for F16 rows,
params `heads` and `subtract`) and are decoded in HF row order, 1 subtracted, so values and row order
match the Hugging Face checkpoint the file was made from.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..dtypes import DTYPES, DType
from ..errors import CheckpointFormatError, ModelPathError
from .filecheck import FileIdentity
from .files import blob_sha256
from .local_reader import LocalReader
from .plan import ModelPlan, Quantized, QuantSpec, ShardInfo, TensorRef
from .reader import Reader

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_TENSORS = 1 << 20  # far above any real model (DeepSeek-V3 has ~1,900 tensors)
MAX_KV = 1 << 20
MAX_STRING = 64 << 20  # one metadata string (chat templates are a few KiB)
MAX_NAME = 4096  # tensor names and keys; llama.cpp itself allows 63 bytes
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 4
KEEP_STRINGS = 64  # longer string arrays (token lists, merges) are counted, not kept
KEEP_NUMBERS = 4096  # per-layer numbers are kept; token types and scores are not
METADATA_CHARS = 4096  # longer metadata strings are cut in plan.metadata
_HEADER_CHUNK = 1 << 20

_TODO = "the file is damaged or not a GGUF file; re-download it"


def _fail(where: str, what: str, todo: str = _TODO) -> NoReturn:
    raise CheckpointFormatError(f"{where}: {what}; {todo}", file=where)


# --- ggml types ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGMLType:
    id: int
    name: str
    block: int  # elements per block
    size: int  # bytes per block


# ggml's type table (ids are fixed by the format; removed ids are absent). Q8_1 follows ggml's
# current block_q8_1 (two f16 + 32 int8 = 36 bytes).
GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in (
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(2, "Q4_0", 32, 18),
        GGMLType(3, "Q4_1", 32, 20),
        GGMLType(6, "Q5_0", 32, 22),
        GGMLType(7, "Q5_1", 32, 24),
        GGMLType(8, "Q8_0", 32, 34),
        GGMLType(9, "Q8_1", 32, 36),
        GGMLType(10, "Q2_K", 256, 84),
        GGMLType(11, "Q3_K", 256, 110),
        GGMLType(12, "Q4_K", 256, 144),
        GGMLType(13, "Q5_K", 256, 176),
        GGMLType(14, "Q6_K", 256, 210),
        GGMLType(15, "Q8_K", 256, 292),
        GGMLType(16, "IQ2_XXS", 256, 66),
        GGMLType(17, "IQ2_XS", 256, 74),
        GGMLType(18, "IQ3_XXS", 256, 98),
        GGMLType(19, "IQ1_S", 256, 50),
        GGMLType(20, "IQ4_NL", 32, 18),
        GGMLType(21, "IQ3_S", 256, 110),
        GGMLType(22, "IQ2_S", 256, 82),
        GGMLType(23, "IQ4_XS", 256, 136),
        GGMLType(24, "I8", 1, 1),
        GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4),
        GGMLType(27, "I64", 1, 8),
        GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", 256, 56),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(34, "TQ1_0", 256, 54),
        GGMLType(35, "TQ2_0", 256, 66),
        GGMLType(39, "MXFP4", 32, 17),
        GGMLType(40, "NVFP4", 64, 36),
        GGMLType(41, "Q1_0", 128, 18),
    )
}
GGML_BY_NAME = {t.name: t for t in GGML_TYPES.values()}
RAW_TYPES = ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")  # delivered as stored
RAW_FLOATS = RAW_TYPES[:4]
# The quantized types weightdiag.decode.ggml_blocks dequantizes (tests hold the two lists equal); any other
# type is planned as a non-fittable dtype, so the fit lists it as skipped.
DEQUANTIZED_TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
)


# --- the header ---------------------------------------------------------------------------------

_VALUE_TYPES: dict[int, tuple[str, str | None, int]] = {
    # id: (name, struct format, size); STRING and ARRAY have variable size
    0: ("UINT8", "<B", 1),
    1: ("INT8", "<b", 1),
    2: ("UINT16", "<H", 2),
    3: ("INT16", "<h", 2),
    4: ("UINT32", "<I", 4),
    5: ("INT32", "<i", 4),
    6: ("FLOAT32", "<f", 4),
    7: ("BOOL", "<B", 1),
    8: ("STRING", None, 8),
    9: ("ARRAY", None, 12),
    10: ("UINT64", "<Q", 8),
    11: ("INT64", "<q", 8),
    12: ("FLOAT64", "<d", 8),
}
_NUMPY_VALUE = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 10: "<u8", 11: "<i8"}
_NUMPY_VALUE[12] = "<f8"


@dataclass(frozen=True)
class LongArray:
    """A metadata array too long to keep (token lists): its element type and length."""

    type_name: str
    count: int


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type: GGMLType
    dims: tuple[int, ...]  # GGUF order, innermost first
    offset: int  # absolute byte offset in the file
    nbytes: int  # stored bytes

    @property
    def shape(self) -> tuple[int, ...]:
        """Row-major (Hugging Face) shape."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFHeader:
    where: str
    file_size: int
    version: int
    alignment: int
    data_start: int  # absolute offset of the (aligned) data section
    metadata: dict[str, Any]  # scalars, short lists, LongArray for long arrays
    value_types: dict[str, str]  # key -> GGUF value type name
    tensors: tuple[GGUFTensor, ...] = field(default_factory=tuple)  # in header order


class _Cursor:
    """Sequential reads through `read_at`, buffered, never past the file's end."""

    def __init__(self, read_at: Callable[[int, int], bytes], file_size: int, where: str) -> None:
        self.read_at, self.file_size, self.where = read_at, file_size, where
        self.buf, self.base, self.pos = b"", 0, 0

    def _fill(self, n: int, what: str) -> None:
        if self.pos + n > self.file_size:
            _fail(self.where, f"file ends inside the header while reading {what} (truncated?)")
        if self.pos + n > self.base + len(self.buf):
            keep = self.buf[self.pos - self.base :]
            start = self.pos + len(keep)
            want = min(max(n - len(keep), _HEADER_CHUNK), self.file_size - start)
            got = self.read_at(start, want)
            self.buf, self.base = keep + got, self.pos
            if len(self.buf) < n:
                _fail(self.where, f"could not read {what} (file truncated or changed while reading?)")

    def take(self, n: int, what: str) -> bytes:
        self._fill(n, what)
        at = self.pos - self.base
        self.pos += n
        return self.buf[at : at + n]

    def unpack(self, fmt: str, size: int, what: str) -> Any:
        self._fill(size, what)
        value = struct.unpack_from(fmt, self.buf, self.pos - self.base)[0]
        self.pos += size
        return value

    def string(self, what: str, cap: int = MAX_STRING) -> str:
        n = self.unpack("<Q", 8, what)
        if n > cap:
            _fail(self.where, f"{what} is {n} bytes long, above the {cap}-byte cap")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            _fail(self.where, f"{what} is not valid UTF-8")

    def skip(self, n: int, what: str) -> None:
        self._fill(n, what)
        self.pos += n

    def skip_strings(self, count: int, what: str) -> None:
        for _ in range(count):
            n = self.unpack("<Q", 8, what)
            if n > MAX_STRING:
                _fail(self.where, f"{what}: an element is {n} bytes long, above the {MAX_STRING}-byte cap")
            self.skip(n, what)


def _read_value(cur: _Cursor, vtype: int, key: str, depth: int = 0) -> Any:
    if vtype not in _VALUE_TYPES:
        _fail(cur.where, f"metadata {key!r} has unknown value type {vtype}")
    name, fmt, size = _VALUE_TYPES[vtype]
    if name == "STRING":
        return cur.string(f"metadata {key!r}")
    if name != "ARRAY":
        value = cur.unpack(fmt, size, f"metadata {key!r}")  # type: ignore[arg-type]
        return bool(value) if name == "BOOL" else value
    if depth >= MAX_ARRAY_DEPTH:
        _fail(cur.where, f"metadata {key!r} nests arrays deeper than {MAX_ARRAY_DEPTH}")
    etype = cur.unpack("<I", 4, f"metadata {key!r}")
    count = cur.unpack("<Q", 8, f"metadata {key!r}")
    if etype not in _VALUE_TYPES:
        _fail(cur.where, f"metadata {key!r} is an array of unknown value type {etype}")
    ename, _, esize = _VALUE_TYPES[etype]
    if count * esize > cur.file_size - cur.pos:
        _fail(cur.where, f"metadata {key!r} claims {count} {ename} elements, more than the file can hold")
    if count > (KEEP_STRINGS if etype in (8, 9) else KEEP_NUMBERS):
        if ename == "STRING":
            cur.skip_strings(count, f"metadata {key!r}")
        elif ename == "ARRAY":
            for _ in range(count):
                _read_value(cur, etype, key, depth + 1)
        else:
            cur.skip(count * esize, f"metadata {key!r}")
        return LongArray(ename, count)
    if etype in _NUMPY_VALUE:
        raw = cur.take(count * esize, f"metadata {key!r}")
        return np.frombuffer(raw, dtype=_NUMPY_VALUE[etype]).tolist()
    return [_read_value(cur, etype, key, depth + 1) for _ in range(count)]


def parse_gguf(read_at: Callable[[int, int], bytes], file_size: int, where: str) -> GGUFHeader:
    """Read and validate a GGUF header through `read_at(offset, length) -> bytes`."""
    cur = _Cursor(read_at, file_size, where)
    if file_size < 24:
        _fail(where, f"file is {file_size} bytes, too short to hold a GGUF header")
    magic = cur.take(4, "the magic")
    if magic != MAGIC:
        # Never quote the bytes read: the file may be anything the user pointed at. Only say what format they are.
        from .sniff import HEAD_BYTES, misnamed

        other = misnamed(read_at(0, min(HEAD_BYTES, file_size)), ".gguf")
        if other is not None:
            raise CheckpointFormatError(f"{where}: not a GGUF file: {other}", file=where)
        _fail(where, "bad magic: the file does not start with b'GGUF'", "this is not a GGUF file")
    raw_version = cur.take(4, "the version")
    version = struct.unpack("<I", raw_version)[0]
    if version not in VERSIONS:
        if struct.unpack(">I", raw_version)[0] in VERSIONS:
            _fail(where, "big-endian GGUF file", "convert it to a little-endian GGUF file")
        todo = "re-convert it with a current llama.cpp" if version == 1 else "weightdiag reads GGUF v2 and v3"
        _fail(where, f"unsupported GGUF version {version}", todo)
    n_tensors = cur.unpack("<Q", 8, "the tensor count")
    n_kv = cur.unpack("<Q", 8, "the metadata count")
    # Each tensor info takes at least 32 bytes and each metadata entry 13: a bound for any file.
    if n_tensors > MAX_TENSORS or n_tensors * 32 > file_size:
        _fail(where, f"tensor count {n_tensors} is absurd for a {file_size}-byte file (cap {MAX_TENSORS})")
    if n_kv > MAX_KV or n_kv * 13 > file_size:
        _fail(where, f"metadata count {n_kv} is absurd for a {file_size}-byte file (cap {MAX_KV})")

    metadata: dict[str, Any] = {}
    value_types: dict[str, str] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}", MAX_NAME)
        if key in metadata:
            _fail(where, f"metadata key {key!r} appears twice")
        vtype = cur.unpack("<I", 4, f"the type of metadata {key!r}")
        metadata[key] = _read_value(cur, vtype, key)
        value_types[key] = _VALUE_TYPES[vtype][0]

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
        or alignment > 1 << 20
    ):
        _fail(where, f"general.alignment {alignment!r} is not a power of two up to 1 MiB")

    infos: list[tuple[str, GGMLType, tuple[int, ...], int]] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}", MAX_NAME)
        if name in seen:
            _fail(where, f"tensor {name!r} appears twice")
        seen.add(name)
        n_dims = cur.unpack("<I", 4, f"tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            _fail(where, f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        dims = struct.unpack(f"<{n_dims}Q", cur.take(8 * n_dims, f"tensor {name!r}"))
        type_id = cur.unpack("<I", 4, f"tensor {name!r}")
        offset = cur.unpack("<Q", 8, f"tensor {name!r}")
        if type_id not in GGML_TYPES:
            _fail(
                where,
                f"tensor {name!r} has unknown ggml type {type_id}",
                "the file is damaged or newer than weightdiag; re-convert it with a common type",
            )
        infos.append((name, GGML_TYPES[type_id], dims, offset))

    data_start = -(-cur.pos // alignment) * alignment
    tensors = _place_tensors(where, file_size, data_start, alignment, infos)
    return GGUFHeader(where, file_size, version, alignment, data_start, metadata, value_types, tensors)


def _place_tensors(
    where: str,
    file_size: int,
    data_start: int,
    alignment: int,
    infos: list[tuple[str, GGMLType, tuple[int, ...], int]],
) -> tuple[GGUFTensor, ...]:
    tensors: list[GGUFTensor] = []
    for name, t, dims, offset in infos:
        numel = math.prod(dims)
        if dims[0] % t.block:
            _fail(where, f"tensor {name!r}: row length {dims[0]} is not a multiple of the {t.name} block {t.block}")
        nbytes = numel // t.block * t.size
        if offset % alignment:
            _fail(where, f"tensor {name!r}: data offset {offset} is not a multiple of the alignment {alignment}")
        if data_start + offset + nbytes > file_size:
            _fail(
                where,
                f"tensor {name!r} ({t.name} x {list(dims)}, {nbytes} bytes at data offset {offset}) runs past "
                f"the end of the {file_size}-byte file (truncated or offsets out of range)",
            )
        tensors.append(GGUFTensor(name, t, dims, data_start + offset, nbytes))
    previous: GGUFTensor | None = None
    for tensor in sorted((t for t in tensors if t.nbytes), key=lambda t: t.offset):
        if previous is not None and tensor.offset < previous.offset + previous.nbytes:
            _fail(where, f"tensor {tensor.name!r} overlaps the bytes of tensor {previous.name!r}")
        previous = tensor
    return tuple(tensors)


def parse_gguf_bytes(blob: bytes, where: str = "<bytes>") -> GGUFHeader:
    """Parse the header of a whole file given as bytes (tests, fuzzing)."""
    return parse_gguf(lambda off, size: blob[off : off + size], len(blob), where)


# --- config and metadata ------------------------------------------------------------------------

# GGUF architecture names whose HF model_type differs.
_MODEL_TYPES = {
    "gptneox": "gpt_neox",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "command-r": "cohere",
    "deepseek2": "deepseek_v2",
    "phi2": "phi",
    "starcoder": "gpt_bigcode",
}
# convert_hf_to_gguf.py permutes Q/K rows (LlamaModel.permute) for these architectures.
_PERMUTED_QK = frozenset({"llama", "deci", "granite", "granitemoe", "minicpm", "arcee"})
# ... and stores RMSNorm weights as 1 + w for these (HF Gemma keeps w, applies 1 + w).
_NORM_PLUS_ONE = frozenset({"gemma", "gemma2", "gemma3"})
_QK_NAME = re.compile(r"^blk\.(\d+)\.attn_([qk])\.(weight|bias)$")


def _count(value: Any) -> int | None:
    """A non-negative integer; per-layer arrays give their largest entry."""
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        value = max(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _per_layer(value: Any, block: int) -> int | None:
    if isinstance(value, list):
        return _count(value[block]) if block < len(value) else None
    return _count(value)


def _real(value: Any, f32: bool) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        # F32 metadata: the shortest decimal that rounds to it (9.9999997e-06 -> 1e-05).
        return float(str(np.float32(value))) if f32 else float(value)
    return None


def hf_config(header: GGUFHeader, tensor_names: set[str]) -> dict[str, Any]:
    """An HF-style config.json built from the metadata, for layout.arch_from_config."""
    meta = header.metadata
    arch = meta.get("general.architecture")
    config: dict[str, Any] = {"gguf_architecture": arch}
    if not isinstance(arch, str) or not arch:
        return config
    config["model_type"] = _MODEL_TYPES.get(arch, arch)

    def get(suffix: str) -> Any:
        return meta.get(f"{arch}.{suffix}")

    for key, suffix in (
        ("hidden_size", "embedding_length"),
        ("num_hidden_layers", "block_count"),
        ("num_attention_heads", "attention.head_count"),
        ("num_key_value_heads", "attention.head_count_kv"),
        ("intermediate_size", "feed_forward_length"),
        ("max_position_embeddings", "context_length"),
        ("head_dim", "attention.key_length"),
        ("num_local_experts", "expert_count"),
        ("num_experts_per_tok", "expert_used_count"),
    ):
        value: float | None = _count(get(suffix))  # a count here, a real in the loop below
        if value is not None:
            config[key] = value
    for key, suffix in (
        ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
        ("layer_norm_eps", "attention.layer_norm_epsilon"),
        ("rope_theta", "rope.freq_base"),
    ):
        value = _real(get(suffix), header.value_types.get(f"{arch}.{suffix}") == "FLOAT32")
        if value is not None:
            config[key] = value
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = tokens.count if isinstance(tokens, LongArray) else len(tokens) if isinstance(tokens, list) else None
    vocab = vocab or _count(get("vocab_size"))
    if vocab:
        config["vocab_size"] = vocab
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    return config


def _metadata_text(value: Any, vtype: str) -> str:
    if isinstance(value, LongArray):
        return f"[{value.count} x {value.type_name}]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(np.float32(value)) if vtype == "FLOAT32" else repr(value)
    if isinstance(value, list):
        text = json.dumps(value, ensure_ascii=False, default=str) if len(value) <= KEEP_STRINGS else ""
        text = text or f"[{len(value)} x {type(value[0]).__name__}]"
    else:
        text = str(value)
    return text if len(text) <= METADATA_CHARS else f"{text[:METADATA_CHARS]}... ({len(text)} chars)"


# --- the reader and the tensor table -------------------------------------------------------------


class GGUFReader(LocalReader):
    """A GGUF file read like a one-file safetensors checkpoint (local_reader.py): byte ranges mapped or copied
    with pread, in chunks through the engine, each read checked to come from the file planned, unchanged
    (filecheck.py). A quantized tensor's bytes are its blocks, decoded in the stream
    (weightdiag.decode.formats.gguf)."""

    def __init__(self, path: Path, shard: ShardInfo, identity: FileIdentity | None = None) -> None:
        super().__init__(path.parent, [shard], [identity] if identity is not None else None)
        self.path = path

    def describe(self, plan: ModelPlan) -> object:
        return Reader.describe(self, plan)  # a node reopens safetensors shards only: refused


_DECODE_SOURCE = "ggml ggml-quants.c (dequantize_row_*); llama.cpp convert_hf_to_gguf.py (LlamaModel.permute)"


def _tensor_ref(t: GGUFTensor, heads: int | None, norm_shift: bool) -> TensorRef:
    """What the pipeline sees of `t`: its HF shape, its stored bytes, the dtype its values are reduced in (F32
    for what is dequantized or shifted) and, where values are computed from the bytes, a `quant` that has
    them decoded in the stream: quantized blocks, rows in llama.cpp's rotary order, Gemma's 1 + w."""
    name = t.type.name
    if name in DEQUANTIZED_TYPES:
        dtype, note = DTYPES["F32"], f"GGUF {name}, dequantized"
    elif norm_shift:
        dtype, note = DTYPES["F32"], f"GGUF {name}, stored as 1 + w; 1 subtracted"
    elif name in RAW_TYPES:
        dtype, note = DTYPES[name], None
    else:  # not decodable: a non-fittable float DType puts it on the row's skipped list with a reason
        bits = max(1, round(8 * t.type.size / t.type.block))
        dtype, note = DType(f"GGUF_{name}", bits, "float", False), f"GGUF {name}: no dequantizer"
    if heads:
        note = f"{note}; Q/K rows un-permuted to HF order" if note else "Q/K rows un-permuted to HF order"
    decoded = name in DEQUANTIZED_TYPES or norm_shift or (heads is not None and name in RAW_FLOATS)
    return TensorRef(
        t.name,
        dtype,
        t.shape,
        0,
        t.offset,
        t.offset + t.nbytes,
        note,
        # The row records the file's type (Q4_1), not only the F32 the fit saw.
        name if name != dtype.name else None,
        name if name in DEQUANTIZED_TYPES else None,
        quant=_quantized(t, dtype.name, heads, norm_shift) if decoded and t.nbytes else None,
    )


def _quantized(t: GGUFTensor, delivered: str, heads: int | None, norm_shift: bool) -> Quantized:
    """The decoding of `t` (no companions: a block's scales are in the block). Pieces hold whole blocks, and
    whole heads of rows when the rows are to be un-permuted, so that every piece decodes in HF order."""
    name, block = t.type.name, t.type.block
    params: dict[str, Any] = {"ggml_type": name, "dtype": delivered}
    unit = block
    steps = [f"ggml's dequantize_row_{name.lower()}" if name in DEQUANTIZED_TYPES else "the stored values"]
    if heads:
        params["heads"] = heads
        unit = math.lcm(t.shape[0] // heads * math.prod(t.shape[1:]), block)
        steps.append("rows un-permuted per head")
    if norm_shift:
        params["subtract"] = 1.0
        steps.append("minus 1")
    spec = QuantSpec(
        format=f"gguf-{name.lower()}",
        method="gguf",
        bits=max(1, round(8 * t.type.size / block)),
        label=f"GGUF {name}",
        arithmetic=", ".join(steps) + ", in float32" if delivered == "F32" else ", ".join(steps),
        source=_DECODE_SOURCE,
        group=block if block > 1 else None,
        params=params,
    )
    codes = TensorRef(t.name, DTYPES["U8"], (t.nbytes,), 0, t.offset, t.offset + t.nbytes)
    return Quantized(spec, codes, {}, t.shape, unit // block * t.type.size)


def _qk_heads(t: GGUFTensor, arch: Any, meta: dict[str, Any]) -> tuple[int | None, str | None]:
    """Heads to un-permute a llama-family Q/K tensor by, or (None, why not) when it cannot be done."""
    match = _QK_NAME.match(t.name)
    if not match or arch not in _PERMUTED_QK:
        return None, None
    block, which = int(match.group(1)), match.group(2)
    heads = _per_layer(meta.get(f"{arch}.attention.head_count"), block)
    if which == "k":
        heads = _per_layer(meta.get(f"{arch}.attention.head_count_kv"), block) or heads
    rows = t.shape[0]
    if not heads or not rows or rows % (2 * heads):
        return None, f"{t.name}: rows left in llama.cpp's rotary order ({rows} rows, {heads} heads)"
    return heads, None


def open_gguf(path: str | os.PathLike[str], model_id: str | None = None) -> tuple[ModelPlan, GGUFReader]:
    """Plan a .gguf file: validate its header, build a config, describe the delivered tensors."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ModelPathError(f"{p}: no such file; give a .gguf file", path=p)
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as exc:
        raise ModelPathError(f"{p}: cannot open it ({exc.strerror}); check the path and permissions", path=p) from None
    try:
        identity = FileIdentity.of(os.fstat(fd))
        file_size = identity.size
        header = parse_gguf(lambda off, size: os.pread(fd, size, off), file_size, str(p))
        digest = hashlib.sha256()
        for at in range(0, header.data_start, _HEADER_CHUNK):
            digest.update(os.pread(fd, min(_HEADER_CHUNK, header.data_start - at), at))
    finally:
        os.close(fd)

    meta = header.metadata
    arch = meta.get("general.architecture")
    names = {t.name for t in header.tensors}
    refs: list[TensorRef] = []
    notes: list[str] = []
    for t in sorted(header.tensors, key=lambda t: t.offset):
        heads, why_not = _qk_heads(t, arch, meta)
        if why_not:
            notes.append(why_not)
        norm_shift = arch in _NORM_PLUS_ONE and t.name.endswith("norm.weight") and t.type.name in RAW_FLOATS
        refs.append(_tensor_ref(t, heads, norm_shift))

    counts = Counter(t.type.name for t in header.tensors)
    types_text = ", ".join(f"{n} {name}" for name, n in counts.most_common())
    quantized = sorted(name for name in counts if name in DEQUANTIZED_TYPES)
    if quantized:
        notes.append(f"GGUF tensor types: {types_text}; {', '.join(quantized)} dequantized to F32 for fitting")
    split = _count(meta.get("split.count"))
    if split and split > 1:
        notes.append(f"this is one of {split} GGUF split files; only its own tensors are read")

    metadata = {k: _metadata_text(v, header.value_types[k]) for k, v in meta.items()}
    metadata["gguf.version"] = str(header.version)
    metadata["gguf.tensor_types"] = types_text
    shard = ShardInfo(p.name, file_size, blob_sha256(p), digest.hexdigest())
    plan = ModelPlan(
        # The file name, as for every other file (general.name is free text: "SmolLM2 135M Instruct").
        model_id=model_id or p.stem,
        source="local",
        location=str(p.resolve()),
        shards=[shard],
        tensors=refs,
        config=hf_config(header, names),
        file_format="gguf",
        metadata=metadata,
        notes=notes,
    )
    return plan, GGUFReader(p, shard, identity)

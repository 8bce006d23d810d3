"""Parse and validate a safetensors header without trusting it.

Format (https://huggingface.co/docs/safetensors): 8 bytes little-endian header length N, then
N bytes of UTF-8 JSON mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
(offsets relative to the byte after the header) plus an optional "__metadata__" str->str map,
then the data. Like the reference implementation we cap N, require every tensor's byte size to
equal numel x itemsize, and require the tensors to tile the data region exactly (no gaps, no
overlaps, nothing past the end). Every violation raises CheckpointFormatError with one line
saying what is wrong; no other exception escapes `parse_header`.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

from ..dtypes import DTYPES, DType
from ..errors import CheckpointFormatError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's cap
PREFIX_BYTES = 8


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file; `start`/`end` are absolute byte offsets in the file."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    where: str  # the file's name or URL, for messages
    file_size: int
    header_length: int  # N, the JSON length
    tensors: tuple[TensorEntry, ...]  # in file order
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return PREFIX_BYTES + self.header_length


def _fail(
    where: str, what: str, todo: str = "the file is damaged or not a safetensors file; re-download it"
) -> NoReturn:
    raise CheckpointFormatError(f"{where}: {what}; {todo}", file=where)


def _misnamed(prefix: bytes, where: str, what: str) -> NoReturn:
    from .sniff import misnamed

    other = misnamed(prefix, ".safetensors")
    if other is not None:
        raise CheckpointFormatError(f"{where}: not a safetensors file: {other}", file=where)
    _fail(where, what)


def header_length(prefix: bytes, file_size: int, where: str) -> int:
    """Validate the 8-byte prefix and return the JSON length N (a prefix of another format: that format named)."""
    if file_size < PREFIX_BYTES or len(prefix) < PREFIX_BYTES:
        _misnamed(prefix, where, f"file is {file_size} bytes, too short to hold a safetensors header")
    (n,) = struct.unpack("<Q", prefix[:PREFIX_BYTES])
    # N is the file's first 8 bytes: never print it, since any file (a secret linked in as a shard)
    # reaches this check, and the number spells out its first bytes.
    if n > MAX_HEADER_BYTES:
        _misnamed(
            prefix,
            where,
            f"not a safetensors file: the header length (first 8 bytes) exceeds the {MAX_HEADER_BYTES}-byte cap",
        )
    if PREFIX_BYTES + n > file_size:
        _misnamed(
            prefix,
            where,
            f"not a safetensors file, or truncated: the header length (first 8 bytes) runs past the end "
            f"of the {file_size}-byte file",
        )
    if n < 2:
        _misnamed(prefix, where, "not a safetensors file: the header length (first 8 bytes) cannot hold a JSON object")
    return n


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _as_int(value: object) -> int | None:
    # JSON booleans are ints in Python; they are not valid sizes.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse_header(raw: bytes, file_size: int, where: str) -> SafetensorsHeader:
    """Validate the JSON header `raw` (exactly N bytes) of a file of `file_size` bytes."""
    n = len(raw)
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text, object_pairs_hook=_reject_duplicates)
    except UnicodeDecodeError as exc:
        # The codec's message quotes the offending byte: say where it is, not what it is.
        _fail(where, f"header is not valid UTF-8 JSON (not UTF-8 at header byte {exc.start})")
    except RecursionError:
        _fail(where, "header is not valid UTF-8 JSON (nested too deeply)")
    except ValueError as exc:
        _fail(where, f"header is not valid UTF-8 JSON ({type(exc).__name__}: {str(exc)[:80]})")
    if not isinstance(doc, dict):
        _fail(where, "header JSON is not an object")

    metadata: dict[str, str] = {}
    raw_meta = doc.pop("__metadata__", None)
    if raw_meta is not None:
        if not isinstance(raw_meta, dict) or not all(isinstance(v, str) for v in raw_meta.values()):
            _fail(where, "__metadata__ must map strings to strings")
        metadata = dict(raw_meta)

    data_size = file_size - PREFIX_BYTES - n
    data_start = PREFIX_BYTES + n
    entries: list[tuple[int, int, str, DType, tuple[int, ...]]] = []
    for name, info in doc.items():
        entries.append(_parse_entry(name, info, where))

    # The tensors must tile [0, data_size) exactly, in offset order.
    entries.sort(key=lambda e: (e[0], e[1]))
    cursor = 0
    tensors: list[TensorEntry] = []
    for _, end, name, _, _ in entries:
        if end > data_size:
            _fail(
                where,
                f"tensor {name!r} ends at data byte {end} but the file holds only {data_size} data bytes"
                " (truncated or offsets out of range)",
            )
    for begin, end, name, dtype, shape in entries:
        if begin < cursor:
            _fail(where, f"tensor {name!r} bytes [{begin}, {end}) overlap the previous tensor")
        if begin > cursor:
            _fail(where, f"unused gap of {begin - cursor} bytes before tensor {name!r}")
        tensors.append(TensorEntry(name, dtype, shape, data_start + begin, data_start + end))
        cursor = end
    if cursor != data_size:
        _fail(where, f"{data_size - cursor} bytes after the last tensor are not described by the header")
    return SafetensorsHeader(where, file_size, n, tuple(tensors), metadata)


def _parse_entry(name: str, info: object, where: str) -> tuple[int, int, str, DType, tuple[int, ...]]:
    if not isinstance(info, dict):
        _fail(where, f"entry {name!r} is not an object")
    dtype_name = info.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        _fail(
            where,
            f"tensor {name!r} has unknown dtype {dtype_name!r}",
            "the file uses a dtype weightdiag does not know; convert it to BF16/F16/F32",
        )
    dtype = DTYPES[dtype_name]
    shape_raw = info.get("shape")
    if not isinstance(shape_raw, list):
        _fail(where, f"tensor {name!r} has no valid shape")
    dims = [_as_int(d) for d in shape_raw]
    shape = tuple(d for d in dims if d is not None and d >= 0)
    if len(shape) != len(dims):
        _fail(where, f"tensor {name!r} has an invalid shape {shape_raw!r}")
    offsets = info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2:
        _fail(where, f"tensor {name!r} has no valid data_offsets")
    begin, end = _as_int(offsets[0]), _as_int(offsets[1])
    if begin is None or end is None or begin < 0 or end < begin:
        _fail(where, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    numel = math.prod(shape)
    expected = dtype.nbytes(numel)
    if expected is None or expected != end - begin:
        _fail(
            where,
            f"tensor {name!r}: {dtype_name} x {list(shape)} needs {expected} bytes but data_offsets span {end - begin}",
        )
    return begin, end, name, dtype, shape


def read_header(read_at: Callable[[int, int], bytes], file_size: int, where: str) -> SafetensorsHeader:
    """Read and validate a header through `read_at(offset, length) -> bytes`."""
    prefix = read_at(0, PREFIX_BYTES) if file_size >= PREFIX_BYTES else b""
    n = header_length(prefix, file_size, where)
    raw = read_at(PREFIX_BYTES, n)
    if len(raw) != n:
        _fail(where, f"could read only {len(raw)} of the {n} header bytes (truncated?)")
    return parse_header(raw, file_size, where)


def parse_file_bytes(blob: bytes, where: str = "<bytes>") -> SafetensorsHeader:
    """Parse a header from the first bytes of a file whose full size is len(blob) (tests, fuzzing)."""
    return read_header(lambda off, size: blob[off : off + size], len(blob), where)

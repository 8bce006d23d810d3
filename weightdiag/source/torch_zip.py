"""Zip `.bin` checkpoints (torch.save's format) of plain tensors, read without torch: the pickle unpickled against
a narrow allowlist, each tensor then read from the file by offset.

Why: torch's own loader costs its import (about 220 MB resident and a second or two), and it maps the whole
file, whose pages then count in the process's memory as the tensors are read. A state dict of plain tensors
needs none of it: its pickle names each tensor's storage by its zip record, and a tensor is (storage, offset,
shape, strides, dtype). Read so, a `.bin` costs what its safetensors twin costs (benchmarks/bench_bin.py).

The unpickler is pickle's own with `find_class` and `persistent_load` replaced. It resolves only these names,
each to a stand-in of weightdiag's (never to torch's functions, nothing that runs code): collections.OrderedDict;
torch._utils' _rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter and _rebuild_parameter_with_state
(which describe a tensor, `Laid`); the typed storage classes (torch.FloatStorage ...) and UntypedStorage; and
torch's dtype names. That is a subset of what torch.load(weights_only=True) accepts. Anything else (another
name, a dtype not listed, a big-endian file, a TorchScript archive, a tensor that is not plain: negative or
overlapping strides, past its storage) raises `NotPlain`, and the caller reads the file with torch's loader,
which reads it or refuses it exactly as before: so nothing torch's loader refuses is read here. Every tensor
is checked after the whole pickle is read (a pickle may change objects after building them), from plain
integers, and only then described.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import CheckpointFormatError

# torch dtype name -> bytes per element: the dtypes a plain tensor may have here
ITEMSIZE = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "complex64": 8,
    "complex128": 16,
}
# torch's typed storage classes (pickled by name) -> their dtype
_TYPED_STORAGES = {
    "FloatStorage": "float32",
    "DoubleStorage": "float64",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (past 22 bytes) the name's and the extra field's lengths
_INT_OF_SIZE = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


class NotPlain(Exception):
    """Something this reader does not read (see the module's docstring): torch's loader reads it, or refuses it."""


@dataclass(frozen=True, slots=True)
class _StorageType:
    dtype: str  # "uint8" for UntypedStorage, whose numel counts bytes


@dataclass(frozen=True, slots=True)
class _Dtype:
    name: str


@dataclass(frozen=True, slots=True)
class _Storage:
    key: str
    dtype: str
    numel: int


@dataclass(frozen=True, slots=True)
class _Rebuilt:
    """What a pickle said of a tensor (unchecked: checked once the whole pickle is read)."""

    storage: object
    offset: object
    shape: object
    stride: object
    dtype: object


@dataclass(frozen=True, slots=True)
class Laid:
    """A plain tensor of a zip checkpoint, checked: its elements lie at `start` + (offset + Σ i·stride)·itemsize
    bytes of the file."""

    dtype: str  # torch's name: float32, bfloat16, ...
    itemsize: int
    start: int  # the file offset of its storage's first byte
    offset: int  # in elements, from the storage's start
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def contiguous(self) -> bool:
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if n > 1 and s != expected:
                return False
            expected *= n
        return True


def _rebuild_v2(storage: object, offset: object, shape: object, stride: object, *_: object) -> _Rebuilt:
    dtype = storage.dtype if isinstance(storage, _Storage) else None
    return _Rebuilt(storage, offset, shape, stride, dtype)


def _rebuild_v3(
    storage: object,
    offset: object,
    shape: object,
    stride: object,
    _grad: object,
    _hooks: object,
    dtype: object,
    *_: object,
) -> _Rebuilt:
    return _Rebuilt(storage, offset, shape, stride, dtype.name if isinstance(dtype, _Dtype) else None)


def _parameter(data: object, *_: object) -> object:
    return data  # an nn.Parameter is its tensor here


_UNTYPED = _StorageType("uint8")
_GLOBALS: dict[tuple[str, str], object] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_v3,
    ("torch._utils", "_rebuild_parameter"): _parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
    ("torch", "UntypedStorage"): _UNTYPED,
    ("torch.storage", "UntypedStorage"): _UNTYPED,
    **{("torch", name): _StorageType(dtype) for name, dtype in _TYPED_STORAGES.items()},
    **{("torch", name): _Dtype(name) for name in ITEMSIZE},
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _GLOBALS.get((module, name))
        if found is None:
            raise NotPlain(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise NotPlain("a persistent id that is no storage")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise NotPlain("a storage reference")
        return _Storage(key, kind.dtype, numel)


def _ints(value: object, length: int | None = None) -> tuple[int, ...] | None:
    if not isinstance(value, tuple) or (length is not None and len(value) != length):
        return None
    if not all(type(v) is int and v >= 0 for v in value):
        return None
    return value


def _data_start(f: io.BufferedReader, record: zipfile.ZipInfo, size: int) -> int:
    """Where a stored record's bytes begin in the file: after its local header (whose name and extra field may
    differ in length from the central directory's)."""
    header = os.pread(f.fileno(), _LOCAL_HEADER.size, record.header_offset)
    if len(header) < _LOCAL_HEADER.size:
        raise NotPlain("a local header past the end")
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    start = record.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if signature != b"PK\x03\x04" or start + record.file_size > size:
        raise NotPlain("a damaged local header")
    return start


def load_plain(path: Path, f: io.BufferedReader, records: list[zipfile.ZipInfo]) -> dict[str, Laid]:
    """The tensors of the zip checkpoint open as `f` (its `records` checked by torch_bin._check_zip), by name;
    NotPlain when it holds anything else (see the module's docstring)."""
    if not records:
        raise NotPlain("an empty archive")
    prefix = records[0].filename.split("/", 1)[0]  # torch's archive name: the first record's folder
    by_name = {r.filename: r for r in records}
    if f"{prefix}/constants.pkl" in by_name:
        raise NotPlain("a TorchScript archive")
    archive = zipfile.ZipFile(f)
    try:
        if f"{prefix}/byteorder" in by_name and archive.read(f"{prefix}/byteorder") != b"little":
            raise NotPlain("a big-endian checkpoint")
        result = _Unpickler(io.BytesIO(archive.read(f"{prefix}/data.pkl")), encoding="utf-8").load()
    except NotPlain:
        raise
    except Exception as exc:  # a damaged archive or pickle: torch's loader says what is wrong with it
        raise NotPlain(type(exc).__name__) from None
    if isinstance(result, dict) and isinstance(result.get("state_dict"), dict):
        result = result["state_dict"]
    if not isinstance(result, dict):
        raise NotPlain("no state dict")
    size = os.fstat(f.fileno()).st_size
    starts: dict[str, int] = {}
    tensors: dict[str, Laid] = {}
    for name, value in result.items():
        if not isinstance(value, _Rebuilt):
            continue  # not a tensor: left out, as torch_bin leaves it
        if not isinstance(name, str):
            raise NotPlain("a tensor named by no string")
        tensors[name] = _checked(path, f, value, by_name, prefix, starts, size)
    return tensors


def _checked(
    path: Path,
    f: io.BufferedReader,
    rebuilt: _Rebuilt,
    by_name: dict[str, zipfile.ZipInfo],
    prefix: str,
    starts: dict[str, int],
    size: int,
) -> Laid:
    storage, dtype = rebuilt.storage, rebuilt.dtype
    if not isinstance(storage, _Storage) or not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise NotPlain("a tensor of another kind")
    shape = _ints(rebuilt.shape)
    stride = _ints(rebuilt.stride, len(shape) if shape is not None else None)
    offset = rebuilt.offset
    if shape is None or stride is None or type(offset) is not int or offset < 0:
        raise NotPlain("a tensor's offset, shape or stride")
    if storage.dtype != "uint8" and storage.dtype != dtype:
        raise NotPlain("a tensor of another dtype than its storage")
    itemsize = ITEMSIZE[dtype]
    storage_bytes = storage.numel * ITEMSIZE[storage.dtype]
    if math.prod(shape):
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        if (last + 1) * itemsize > storage_bytes:
            raise NotPlain("a tensor past its storage")
        extent = 0  # elements spanned by the dimensions taken so far, smallest stride first
        for n, s in sorted((d for d in zip(shape, stride, strict=True) if d[0] > 1), key=lambda d: d[1]):
            if s <= extent:
                raise NotPlain("a broadcast or overlapping view")
            extent += (n - 1) * s
    name = f"{prefix}/data/{storage.key}"
    if name not in starts:
        record = by_name.get(name)
        if record is None:
            raise NotPlain("a storage without its record")
        if storage_bytes > record.file_size:
            raise CheckpointFormatError(
                f"{path}: storage {storage.key!r} claims {storage_bytes} bytes, its record holds {record.file_size}; "
                "the file is corrupt",
                file=path,
            )
        starts[name] = _data_start(f, record, size)
    return Laid(dtype, itemsize, starts[name], offset, shape, stride)


# --- reading ------------------------------------------------------------------------------------------------


def pread_into(fd: int, out: np.ndarray, offset: int) -> None:
    """Fill `out` (any dtype, contiguous) with the file's bytes from `offset`; EOFError where the file ends first."""
    assert out.flags.c_contiguous  # reshape would copy otherwise, and the bytes land in the copy
    view = out.reshape(-1).view(np.uint8).data
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise EOFError(offset + done)
        done += n


def _read_strided(fd: int, start: int, shape: tuple[int, ...], stride: tuple[int, ...], out: np.ndarray) -> None:
    """The elements of a strided block (its first at byte `start` of the file; strides in elements) into `out`
    (of `shape`, an integer dtype of the elements' size). Its dimensions taken in the file's order (largest
    stride first), as many of the innermost as keep the bytes read under about twice those wanted are read
    whole, one pread per index of the others, into one buffer in the file's order; one copy then puts every
    element in its place. A transposed weight: one pread of each stored row's part in the chunk, and one
    transposing copy."""
    if not out.size:
        return
    itemsize = out.itemsize
    order = sorted(range(len(shape)), key=lambda d: stride[d], reverse=True)
    inner = len(order)  # order[inner:] are read whole
    while inner > 0:  # the buffer (the outer indices times the span read whole) stays under twice `out`
        span = 1 + sum((shape[d] - 1) * stride[d] for d in order[inner - 1 :])
        if math.prod(shape[d] for d in order[: inner - 1]) * span * itemsize > 2 * out.nbytes + (64 << 10):
            break
        inner -= 1
    outer, whole = order[:inner], order[inner:]
    span = 1 + sum((shape[d] - 1) * stride[d] for d in whole)
    outer_shape = tuple(shape[d] for d in outer)
    staging = np.empty((*outer_shape, span), dtype=out.dtype)
    # The file offset of each outer index, in the staging buffer's order (C order of outer_shape).
    offsets = np.full(outer_shape, start, dtype=np.int64)
    for axis, d in enumerate(outer):
        offsets += (np.arange(shape[d], dtype=np.int64) * (stride[d] * itemsize)).reshape(
            (-1,) + (1,) * (len(outer) - axis - 1)
        )
    row = span * itemsize
    raw = staging.reshape(-1).view(np.uint8).data
    for k, at in enumerate(offsets.reshape(-1).tolist()):  # one pread each: thousands a chunk, kept lean
        if os.preadv(fd, [raw[k * row : (k + 1) * row]], at) != row:
            pread_into(fd, np.frombuffer(raw[k * row : (k + 1) * row], dtype=np.uint8), at)  # a short read
    view = as_strided(
        staging,
        (*outer_shape, *(shape[d] for d in whole)),
        (*staging.strides[:-1], *(stride[d] * itemsize for d in whole)),
        writeable=False,
    )
    _copy_tiled(out.transpose(order), view)


def _copy_tiled(dst: np.ndarray, src: np.ndarray, tile: int = 256) -> None:
    """dst[...] = src, a 2-D transposing copy tile by tile (3x faster than numpy's one pass, which strides
    across one of them for every element)."""
    if dst.ndim != 2:
        dst[...] = src
        return
    for i in range(0, dst.shape[0], tile):
        for j in range(0, dst.shape[1], tile):
            dst[i : i + tile, j : j + tile] = src[i : i + tile, j : j + tile]


def int_of(itemsize: int) -> Any:
    """The numpy integer type of `itemsize` bytes: elements moved as the bits they are."""
    return _INT_OF_SIZE[itemsize]


def read_elements(fd: int, laid: Laid, lo: int, hi: int, out: np.ndarray) -> None:
    """Elements [lo, hi) of the tensor in row-major order into `out` (uint8, (hi - lo) * itemsize bytes), never
    reading more than about twice what they hold (gather, _read_strided)."""

    def read(base: int, shape: tuple[int, ...], stride: tuple[int, ...], part: np.ndarray) -> None:
        _read_strided(fd, laid.start + base * laid.itemsize, shape, stride, part.reshape(shape))

    gather(read, laid.offset, laid.shape, laid.stride, lo, hi, out.view(int_of(laid.itemsize)))


Read = Callable[[int, tuple[int, ...], tuple[int, ...], np.ndarray], None]


def gather(
    read: Read,
    base: int,
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    lo: int,
    hi: int,
    out: np.ndarray,
) -> None:
    """Elements [lo, hi), in row-major order, of the strided tensor (`base` offset, `shape`, `stride`, in elements)
    into the 1-D `out`, by `read(base, shape, stride, out)` of strided blocks: the rows of the first dimension
    wholly inside the range as one block, the partial rows at either end by the same rule one dimension down.
    So no more than the range is ever asked for (a whole tensor copied per chunk of it: 1 GB at the peak for a
    transposed 256 MB weight)."""
    if hi <= lo:
        return
    if len(shape) <= 1:
        step = stride[0] if shape else 1
        read(base + lo * step, (hi - lo,), (step,), out)
        return
    inner = math.prod(shape[1:])
    first, end = -(-lo // inner), hi // inner  # the whole rows: [first, end)
    if end < first:  # inside one row
        row = lo // inner
        gather(read, base + row * stride[0], shape[1:], stride[1:], lo - row * inner, hi - row * inner, out)
        return
    at = 0
    if lo < first * inner:  # the end of the row before
        at = first * inner - lo
        gather(read, base + (first - 1) * stride[0], shape[1:], stride[1:], inner - at, inner, out[:at])
    if end > first:
        n = (end - first) * inner
        read(base + first * stride[0], (end - first, *shape[1:]), stride, out[at : at + n])
        at += n
    if hi > end * inner:  # the start of the row after
        gather(read, base + end * stride[0], shape[1:], stride[1:], 0, hi - end * inner, out[at:])

"""PyTorch `.bin` checkpoints (pytorch_model*.bin), read only through a restricted unpickler.

A zip checkpoint (torch.save's format) of plain tensors is read without torch (weightdiag.source.torch_zip: an
unpickler that resolves a few names, a subset of what torch.load(weights_only=True) allows, to stand-ins of
weightdiag's; each tensor then read from the file by offset with pread): neither torch's import (~220 MB) nor
a mapping of the whole file counts in the fit's memory. Anything else (sparse or quantized tensors, other
objects, a legacy non-zip file) goes through torch's own restricted loader, as before:
`torch.load(weights_only=True)` refuses any pickle that would build arbitrary objects or call functions, so a
malicious checkpoint cannot run code; with `mmap=True` the tensors stay in the file until read.

Nothing in the file is trusted for a size. A shard must be a regular file (a FIFO would block the load, a link
to /dev/zero read without end). A zip checkpoint's records are checked against its central directory before
anything inflates one: a record other than a storage is inflated whole, into a buffer of the size the zip
declares (and no further), so that declared size is bounded (`_check_zip`: no larger than the file, or 16 MiB
for a small one, and 1 GiB at most), and the storages, read from the file as they lie, must be stored
uncompressed within it. A legacy (non-zip) checkpoint's storages are bounded by the file size. A chunk of a
tensor saved with other strides than row-major (a transposed weight) reads and copies its own elements only,
never the whole tensor.
"""

from __future__ import annotations

import bisect
import contextlib
import importlib.util
import io
import math
import os
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import DTYPES, DType
from ..errors import TORCH_INSTALL, CheckpointFormatError, MissingDependencyError, ModelPathError
from .chunks import CHUNK_ALIGN, Chunk
from .filecheck import FileIdentity, changed, check, check_path, open_checked
from .files import default_model_id, file_header_digest, load_config, load_weight_map
from .plan import ModelPlan, ShardInfo, TensorRef
from .reader import Reader
from .regular import IrregularFile, check_regular, open_regular
from .torch_zip import Laid, NotPlain, gather, int_of, load_plain, pread_into, read_elements

# torch dtype name -> safetensors dtype name
_TORCH_DTYPES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "complex64": "C64",
}

NOTE = (
    "pytorch .bin read with a restricted unpickler (zip of plain tensors: weightdiag's, narrower than "
    "torch.load(weights_only=True), tensors read from the file by offset; other zip: "
    "torch.load(weights_only=True, mmap=True); legacy non-zip: torch's, storages bounded by the file size)"
)

_ZIP_MAGIC = b"PK\x03\x04"
# What torch inflates whole (data.pkl, version, byteorder, ...) may declare no more than the file's size (a
# record torch.save writes is stored, so it lies in the file; another zip tool may have compressed a small
# file's pickle past it, hence the floor) and no more than a state dict's pickle of millions of tensors needs.
_RECORD_FLOOR = 16 << 20
MAX_PICKLE_BYTES = 1 << 30
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
_LEGACY_PROTOCOL = 1001


def bin_shards(folder: Path) -> tuple[list[str], Path | None]:
    """The pytorch_model*.bin files of a folder (via pytorch_model.bin.index.json when present)."""
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        return sorted(set(load_weight_map(index).values())), index
    # Whatever is not a folder: a FIFO or a device named so is refused by name when opened, not passed over.
    return sorted(p.name for p in folder.glob("pytorch_model*.bin") if not p.is_dir()), None


def _legacy_load(torch: Any, path: Path, f: io.BufferedReader) -> Any:
    """Read a legacy (non-zip) checkpoint with torch's restricted unpickler, from `f` (the file, at its start).

    torch.load's own legacy path fails (AttributeError) on storages saved untyped (float8, uint16..)
    and allocates whatever size a storage claims; here every claimed storage must fit in the file
    before it is allocated, so memory stays bounded by the file size.
    """
    from torch import _weights_only_unpickler as restricted

    file_size = os.fstat(f.fileno()).st_size
    storages: dict[str, Any] = {}
    claimed = 0

    def persistent_load(pid: Any) -> Any:
        nonlocal claimed
        if not (isinstance(pid, tuple) and len(pid) == 6):
            raise CheckpointFormatError(f"{path}: not a readable torch checkpoint (bad storage reference)", file=path)
        _, storage_type, key, _location, numel, view = pid
        # Untyped storages (dtypes without a typed storage class) are saved in bytes.
        dtype = getattr(storage_type, "dtype", torch.uint8)
        if not isinstance(dtype, torch.dtype) or not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise CheckpointFormatError(f"{path}: not a readable torch checkpoint (bad storage reference)", file=path)
        if key not in storages:
            nbytes = numel * dtype.itemsize
            claimed += nbytes
            if claimed > file_size:
                raise CheckpointFormatError(
                    f"{path}: its storages claim more bytes than the file holds ({file_size}); the file is corrupt",
                    file=path,
                )
            # Backed by numpy, the storage is not resizable: a tensor claiming more than its storage makes
            # set_() fail instead of silently growing the allocation.
            untyped = torch.from_numpy(np.empty(nbytes, dtype=np.uint8)).untyped_storage()
            storages[key] = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
        storage = storages[key]
        if view is None:
            return storage
        if not (isinstance(view, tuple) and len(view) == 3 and all(type(v) is int and v >= 0 for v in view[1:])):
            raise CheckpointFormatError(f"{path}: not a readable torch checkpoint (bad storage view)", file=path)
        start, size = view[1] * storage.element_size(), view[2] * storage.element_size()
        if start + size > storage.nbytes():
            raise CheckpointFormatError(
                f"{path}: a storage view reaches past its storage; the file is corrupt", file=path
            )
        return torch.storage.TypedStorage(
            wrap_storage=storage._untyped_storage[start : start + size], dtype=storage.dtype, _internal=True
        )

    if restricted.load(f, encoding="utf-8") != _LEGACY_MAGIC:
        raise CheckpointFormatError(
            f"{path}: not a torch checkpoint (no zip archive, no legacy magic number)", file=path
        )
    if restricted.load(f, encoding="utf-8") != _LEGACY_PROTOCOL:
        raise CheckpointFormatError(f"{path}: unknown legacy torch serialization protocol", file=path)
    restricted.load(f, encoding="utf-8")  # sys info (endianness, type sizes): written by every torch the same
    unpickler = restricted.Unpickler(f, encoding="utf-8")
    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    result = unpickler.load()
    keys = restricted.load(f, encoding="utf-8")
    if not isinstance(keys, list) or set(keys) != set(storages) or len(keys) != len(storages):
        raise CheckpointFormatError(
            f"{path}: its storage list does not match its tensors; the file is corrupt", file=path
        )
    for key in keys:
        storage = storages[key]
        count = int.from_bytes(f.read(8), "little", signed=True)
        if count * storage.element_size() != storage.nbytes():
            raise CheckpointFormatError(f"{path}: a storage has the wrong size; the file is corrupt", file=path)
        data = torch.empty(0, dtype=torch.uint8).set_(storage._untyped_storage).numpy()
        if f.readinto(memoryview(data)) != data.nbytes:
            raise CheckpointFormatError(f"{path}: truncated (a storage ends past the end of the file)", file=path)
    return result


def _check_zip(path: Path, f: io.BufferedReader) -> list[zipfile.ZipInfo]:
    """Refuse a zip checkpoint before torch reads it where torch would trust it for a size (see the module's
    docstring): what its central directory declares is all that is read here, nothing is inflated."""
    size = os.fstat(f.fileno()).st_size
    try:
        records = zipfile.ZipFile(f).infolist()
    except Exception:  # zipfile's parser on untrusted bytes: BadZipFile, struct.error, ValueError, ...
        raise CheckpointFormatError(
            f"{path}: not a readable torch checkpoint (a damaged zip archive)", file=path
        ) from None
    bound = min(max(size, _RECORD_FLOOR), MAX_PICKLE_BYTES)
    names: set[str] = set()

    def refuse(why: str) -> CheckpointFormatError:
        return CheckpointFormatError(f"{path}: {why}; the file is damaged or malicious", file=path)

    for record in records:
        name = record.filename
        if name in names:  # which one torch would read is not which one is checked here
            raise refuse(f"two records are named {name!r}")
        names.add(name)
        if record.header_offset + record.compress_size > size:
            raise refuse(f"its record {name!r} reaches past the end of the file")
        parts = name.split("/")
        if len(parts) == 3 and parts[1] == "data":  # a storage: mapped from the file as it lies
            if record.compress_type != zipfile.ZIP_STORED or record.file_size != record.compress_size:
                raise refuse(
                    f"its tensor data {name!r} is compressed (torch.save stores it as is, and it is read from the "
                    "file as it lies)"
                )
        elif record.file_size > bound:
            raise refuse(
                f"its record {name!r} would inflate to {record.file_size} bytes from {record.compress_size} "
                f"(the file holds {size}; at most {bound} are read)"
            )
    return records


def _restricted_load(torch: Any, path: Path) -> Any:
    with open_regular(path) as f:  # a FIFO or a device in a shard's place: refused, never waited on
        is_zip = f.read(4) == _ZIP_MAGIC
        f.seek(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's notes on pickle protocols: not the user's concern
            if not is_zip:
                return _legacy_load(torch, path, f)
            _check_zip(path, f)
            # By its path (mmap needs one): open_torch_bin checks afterwards that it named this very file.
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def _unreadable(exc: Exception) -> str:
    """Why torch could not load a file, as the error says it after the path: a refusal of the restricted
    unpickler, a tensor past its storage, else the kind of failure."""
    import pickle

    if isinstance(exc, pickle.UnpicklingError):
        if "unsupported global" in str(exc).lower() or "not an allowed global" in str(exc).lower():
            return (
                "refused by the restricted unpickler (it would build objects other than tensors); "
                "only plain tensor checkpoints are read: convert it to safetensors"
            )
        return "not a readable torch checkpoint (corrupt pickle)"
    if isinstance(exc, RuntimeError):
        if "not resizable" in str(exc) or "out of bounds for storage" in str(exc):
            return (
                "a tensor reaches past the end of its storage (shape x stride larger than the data); "
                "the file is corrupt"
            )
        return "not a readable torch checkpoint (RuntimeError)"
    return f"not a readable torch checkpoint ({exc.__class__.__name__})"


def _plain(path: Path) -> dict[str, Laid] | None:
    """A zip checkpoint's plain tensors read without torch (weightdiag.source.torch_zip), None for anything that
    needs torch's loader: a legacy file, or a zip holding more than plain tensors."""
    with open_regular(path) as f:  # a FIFO or a device in a shard's place: refused, never waited on
        if f.read(4) != _ZIP_MAGIC:
            return None
        f.seek(0)
        records = _check_zip(path, f)
        try:
            return load_plain(path, f, records)
        except NotPlain:
            return None


def _load(path: Path) -> dict[str, Any]:
    """The tensors of a shard by name: `Laid` descriptions where torch_zip reads it, else torch's tensors."""
    try:
        plain = _plain(path)
    except IrregularFile as exc:
        raise CheckpointFormatError(f"{path}: {exc}", file=path) from None
    if plain is not None:
        return plain
    import torch

    try:
        state = _restricted_load(torch, path)
    except (CheckpointFormatError, ImportError):
        raise  # ours already, or a broken torch install (a bug to see, not the file's fault)
    except IrregularFile as exc:
        raise CheckpointFormatError(f"{path}: {exc}", file=path) from None
    except Exception as exc:
        # The unpickler and torch's rebuild functions run on untrusted bytes: a malformed file surfaces as
        # any exception (IndexError, KeyError, struct.error, AssertionError, MemoryError...), never as code run.
        raise CheckpointFormatError(f"{path}: {_unreadable(exc)}", file=path) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointFormatError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors", file=path)
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    for key, tensor in tensors.items():
        if not isinstance(key, str):
            raise CheckpointFormatError(f"{path}: a tensor is named by a {type(key).__name__}, not a string", file=path)
        _check_strides(path, key, tensor)
    return tensors


def _check_strides(path: Path, key: str, t: Any) -> None:
    """Refuse tensors that claim more elements than their storage holds.

    A broadcast view (stride 0) or self-overlapping strides would make a tiny file expand into
    gigabytes when read; bounds are checked again here rather than trusting the rebuild.
    """
    import torch

    if t.layout != torch.strided or t.is_quantized or t.is_nested or t.numel() == 0:
        return  # not read: skipped by dtype, or empty
    size, stride, offset = t.shape, t.stride(), t.storage_offset()
    if offset < 0 or any(s < 0 for s in stride):
        raise CheckpointFormatError(
            f"{path}: tensor {key!r} has a negative offset or stride; the file is corrupt", file=path
        )
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if (last + 1) * t.element_size() > t.untyped_storage().nbytes():
        raise CheckpointFormatError(
            f"{path}: tensor {key!r} reaches past the end of its storage; the file is corrupt", file=path
        )
    extent = 0  # elements spanned by the dimensions taken so far, smallest stride first
    for n, s in sorted((d for d in zip(size, stride, strict=True) if d[0] > 1), key=lambda d: d[1]):
        if s <= extent:
            raise CheckpointFormatError(
                f"{path}: tensor {key!r} (shape {list(size)}, stride {list(stride)}) is a broadcast or overlapping "
                "view that shares storage between its own elements; weightdiag does not expand it: save the "
                "tensor with .contiguous() (or .clone()) or convert the checkpoint to safetensors",
                file=path,
            )
        extent += (n - 1) * s
    return


def _dtype_of(tensor: Any) -> DType:
    if isinstance(tensor, Laid):
        return DTYPES.get(_TORCH_DTYPES.get(tensor.dtype, "")) or DType(
            f"TORCH_{tensor.dtype.upper()}", tensor.itemsize * 8, "other", False
        )
    import torch

    name = str(tensor.dtype).removeprefix("torch.")
    if tensor.is_nested:
        return DType("TORCH_NESTED", 8, "other", False)
    if tensor.layout != torch.strided:
        return DType(f"TORCH_{str(tensor.layout).removeprefix('torch.').upper()}", 8, "other", False)
    known = DTYPES.get(_TORCH_DTYPES.get(name, ""))
    # Others (complex128, quantized, sub-byte) are listed in the plan and skipped under their torch name.
    return known or DType(f"TORCH_{name.upper()}", max(tensor.element_size(), 1) * 8, "other", False)


class TorchBinReader(Reader):
    """Chunks of the checkpoints' tensors. A .bin shard has no byte layout of its own to read ranges of (its
    storages sit in a zip or a pickle stream), so the plan lays each shard's tensors end to end in the order
    of the state dict (offsets in `TensorRef.start`, 8-byte aligned): a chunk is the bytes of the tensors it
    overlaps, in row-major order. A shard read without torch (`Laid` tensors, torch_zip) is read with pread
    at each tensor's offset in the file, neighbours in one read, a tensor stored with other strides than
    row-major by the slices of it the chunk needs; one loaded by torch is taken from its mapping (a view where
    a tensor is contiguous, the chunk's own elements gathered where not). Each read checks the shard is
    still the file loaded, unchanged: a shard rewritten, replaced or renamed during a fit is exit 2, not a
    mixed row. (Truncating a shard torch mapped while it is read still ends the process with SIGBUS.)"""

    def __init__(
        self,
        states: list[dict[str, Any]],
        refs: list[TensorRef],
        paths: list[Path] | None = None,
        identities: list[FileIdentity] | None = None,
    ) -> None:
        self._states = states
        self._paths = paths or []
        self._identities = identities or []
        # Per shard: the tensors in offset order, and their starts to bisect.
        self._laid: list[list[TensorRef]] = [[] for _ in states]
        for ref in sorted(refs, key=lambda r: (r.shard, r.start)):
            if ref.nbytes and ref.dtype.kind != "other":  # torch-only layouts (nested, sparse) are never read
                self._laid[ref.shard].append(ref)
        self._starts = [[ref.start for ref in laid] for laid in self._laid]

    @contextmanager
    def chunk(self, chunk: Chunk) -> Iterator[np.ndarray]:
        laid, starts = self._laid[chunk.shard], self._starts[chunk.shard]
        overlapping = []
        for at in range(max(0, bisect.bisect_right(starts, chunk.start) - 1), len(laid)):
            ref = laid[at]
            if ref.start >= chunk.end:
                break
            if ref.end > chunk.start:
                overlapping.append(ref)
        state = self._states[chunk.shard]
        if overlapping and isinstance(state[overlapping[0].name], Laid):
            yield self._read(chunk, overlapping)
            return
        single = len(overlapping) == 1 and overlapping[0].start <= chunk.start and overlapping[0].end >= chunk.end
        mapped = self._mapped(overlapping[0]) if single else None
        if mapped is not None:  # one contiguous tensor's bytes: a view of the mapping
            ref = overlapping[0]
            yield mapped[chunk.start - ref.start : chunk.end - ref.start]
        else:
            # np.zeros: alignment padding between tensors reads as zeros (and its pages are never touched when
            # a tensor fills them)
            buf = np.zeros(chunk.nbytes, dtype=np.uint8)
            for ref in overlapping:
                lo, hi = max(ref.start, chunk.start), min(ref.end, chunk.end)
                self._copy(ref, lo - ref.start, hi - ref.start, buf[lo - chunk.start : hi - chunk.start])
            yield buf
        if chunk.shard < len(self._identities):  # not rewritten or replaced while it was read
            check_path(self._paths[chunk.shard], self._identities[chunk.shard])

    def _read(self, chunk: Chunk, overlapping: list[TensorRef]) -> np.ndarray:
        """The chunk of a shard read without torch, from the file (pread: nothing of it stays mapped)."""
        path, identity = self._paths[chunk.shard], self._identities[chunk.shard]
        state = self._states[chunk.shard]
        buf = np.zeros(chunk.nbytes, dtype=np.uint8)  # alignment padding between tensors reads as zeros
        fd = open_checked(path, identity)
        try:
            runs: list[tuple[int, np.ndarray]] = []  # contiguous bytes: (file offset, where they go)
            for ref in overlapping:
                tensor: Laid = state[ref.name]
                lo, hi = max(ref.start, chunk.start) - ref.start, min(ref.end, chunk.end) - ref.start
                out = buf[ref.start + lo - chunk.start : ref.start + hi - chunk.start]
                if tensor.contiguous:
                    runs.append((tensor.start + tensor.offset * tensor.itemsize + lo, out))
                else:  # chunks cut tensors at multiples of CHUNK_ALIGN, so on whole elements
                    read_elements(fd, tensor, lo // tensor.itemsize, hi // tensor.itemsize, out)
            _read_runs(fd, runs)
        except EOFError:
            check(fd, path, identity)  # shortened since: says so
            raise changed(path, "it ends before the bytes of its tensors") from None
        finally:
            with contextlib.suppress(OSError):
                check(fd, path, identity)  # not rewritten or replaced while it was read (raised below if so)
            os.close(fd)
        check_path(path, identity)
        return buf

    def _mapped(self, ref: TensorRef) -> np.ndarray | None:
        """The tensor's bytes as they lie in torch's mapping, when they are in row-major order (None otherwise)."""
        import torch

        t = self._states[ref.shard][ref.name]
        return t.reshape(-1).view(torch.uint8).numpy() if t.is_contiguous() else None

    def _copy(self, ref: TensorRef, lo: int, hi: int, out: np.ndarray) -> None:
        """Bytes [lo, hi) of a tensor torch loaded, in row-major order, into `out`: from the mapping's view where
        it is contiguous, else those elements alone gathered from its strides (never the whole tensor, which
        `contiguous()` would copy for every chunk of it: 1 GB at the peak for a transposed 256 MB weight)."""
        mapped = self._mapped(ref)
        if mapped is not None:
            out[:] = mapped[lo:hi]
            return
        import torch

        t = self._states[ref.shard][ref.name]
        size = t.element_size()  # chunks cut tensors at multiples of CHUNK_ALIGN, so on whole elements
        flat = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])  # bits as they are

        def read(base: int, shape: tuple[int, ...], stride: tuple[int, ...], part: np.ndarray) -> None:
            part.reshape(shape)[...] = torch.as_strided(flat, shape, stride, base).numpy()

        gather(
            read, t.storage_offset(), tuple(t.shape), tuple(t.stride()), lo // size, hi // size, out.view(int_of(size))
        )

    def close(self) -> None:
        self._states.clear()


_RUN_GAP = 64 << 10  # contiguous tensors at most this far apart in the file are read in one pread


def _read_runs(fd: int, runs: list[tuple[int, np.ndarray]]) -> None:
    """Read each run (file offset, destination) with as few preads as bound memory allows: neighbours in the file
    (a zip's records sit a header apart) in one read of their span, kept under twice their bytes and 1 MiB."""
    runs.sort(key=lambda run: run[0])
    group: list[tuple[int, np.ndarray]] = []

    def flush() -> None:
        if len(group) == 1:
            pread_into(fd, group[0][1], group[0][0])
        elif group:
            first = group[0][0]
            span = np.empty(group[-1][0] + group[-1][1].nbytes - first, dtype=np.uint8)
            pread_into(fd, span, first)
            for at, out in group:
                out[:] = span[at - first : at - first + out.nbytes]
        group.clear()

    held = 0
    for at, out in runs:
        if group:
            end = group[-1][0] + group[-1][1].nbytes
            span = at + out.nbytes - group[0][0]
            if at - end > _RUN_GAP or at < end or span > 2 * (held + out.nbytes) + (1 << 20):
                flush()
                held = 0
        group.append((at, out))
        held += out.nbytes
    flush()


def open_torch_bin(
    folder: Path, files: list[str], *, model_id: str | None = None, sha256: dict[str, str] | None = None
) -> tuple[ModelPlan, TorchBinReader]:
    # Checked, not imported: plain zip checkpoints are read without torch (its import alone costs ~220 MB),
    # but anything else in a .bin needs its loader, and a user's file may hold anything.
    if importlib.util.find_spec("torch") is None:
        raise MissingDependencyError(
            f"{folder}: pytorch_model*.bin checkpoints are read with torch's restricted loader, and torch is not "
            f"installed: {TORCH_INSTALL} (or convert the checkpoint to safetensors)",
            package="torch",
        ) from None
    if not files:
        raise ModelPathError(f"{folder}: no pytorch_model*.bin weights found", path=folder)
    states, shards, refs, identities = [], [], [], []
    seen: set[str] = set()
    for i, name in enumerate(files):
        path = folder / name
        try:
            identity = FileIdentity.of(check_regular(path))
        except IrregularFile as exc:
            raise CheckpointFormatError(f"{path}: {exc}", file=path) from None
        except OSError:
            raise ModelPathError(f"{folder}: shard {name!r} is missing; download the missing file", path=path) from None
        state = _load(path)
        check_path(path, identity)  # not rewritten while it was unpickled
        states.append(state)
        identities.append(identity)
        offset = 0  # each shard's tensors laid end to end (TorchBinReader)
        shards.append(ShardInfo(name, path.stat().st_size, (sha256 or {}).get(name), file_header_digest(path)))
        for key, tensor in state.items():
            if key in seen:
                raise CheckpointFormatError(
                    f"tensor {key!r} appears in two shards; the folder mixes checkpoints", file=path
                )
            seen.add(key)
            dtype = _dtype_of(tensor)
            nested = not isinstance(tensor, Laid) and tensor.is_nested
            shape = () if nested else tuple(tensor.shape)  # nested: no single shape (skipped)
            nbytes = math.prod(shape) * max(dtype.bits // 8, 1)
            refs.append(TensorRef(key, dtype, shape, i, offset, offset + nbytes))
            offset += -(-nbytes // CHUNK_ALIGN) * CHUNK_ALIGN
    config = load_config(folder)
    plan = ModelPlan(
        model_id=model_id or default_model_id(folder.resolve()),
        source="local",
        location=str(folder.resolve()),
        shards=shards,
        tensors=refs,
        config=config,
        file_format="torch",
        notes=[NOTE],
    )
    return plan, TorchBinReader(states, refs, [folder / name for name in files], identities)

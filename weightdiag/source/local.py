"""Local checkpoints: a .safetensors file, a model folder (single or sharded), an HF cache folder.

Only headers are read here; tensor bytes are read later, chunk by chunk (local_reader.LocalReader, the
reader of GGUF files too), each shard checked to be the file planned, unchanged (filecheck.py). Paths
named by a shard index must stay inside the model folder.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import CheckpointFormatError, ModelPathError
from .filecheck import FileIdentity
from .files import (
    blob_sha256,
    default_model_id,
    load_base_model,
    load_config,
    load_quant_config,
    load_weight_map,
    resolve_hf_cache,
)
from .local_reader import LocalReader
from .plan import ModelPlan, ShardInfo, TensorRef
from .reader import Reader
from .safetensors_header import PREFIX_BYTES, SafetensorsHeader, read_header

__all__ = ["LocalReader", "content_fingerprint", "open_local", "read_file_header"]


def _pread(path: Path):
    fd = os.open(path, os.O_RDONLY)

    def read_at(offset: int, size: int) -> bytes:
        return os.pread(fd, size, offset)

    return fd, read_at


def read_file_header(path: Path, where: str) -> tuple[SafetensorsHeader, str, FileIdentity]:
    """Header of one local file, the sha256 of its prefix + header bytes, and the file's identity then."""
    fd, read_at = _pread(path)
    try:
        identity = FileIdentity.of(os.fstat(fd))
        header = read_header(read_at, identity.size, where)
        digest = hashlib.sha256(read_at(0, PREFIX_BYTES + header.header_length)).hexdigest()
    finally:
        os.close(fd)
    return header, digest, identity


def open_local(path: str | os.PathLike[str], model_id: str | None = None) -> tuple[ModelPlan, Reader]:
    """Plan a local checkpoint: a file (.safetensors, .gguf, pytorch .bin) or a model folder.

    Folders are read as safetensors when they hold any (sharded via an index or not), else as
    pytorch_model*.bin shards (restricted unpickler), else as a single GGUF file.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelPathError(
            f"{p}: no such file or folder; give a .safetensors file, a model folder or ORG/NAME", path=p
        )
    revision = commit = None
    if p.is_file():
        if p.suffix == ".gguf":
            from .gguf import open_gguf

            return open_gguf(p, model_id)
        if p.suffix in (".bin", ".pt", ".pth"):
            from .torch_bin import open_torch_bin

            return open_torch_bin(p.parent, [p.name], model_id=model_id or default_model_id(p.parent.resolve()))
        if p.suffix != ".safetensors":
            raise ModelPathError(
                f"{p}: not a weights file; give a .safetensors, .gguf or pytorch .bin file, or a model folder", path=p
            )
        root, files, index, weight_map = p.parent, [p.name], None, None
        guessed_id = p.stem if p.stem != "model" else default_model_id(p.resolve().parent)
    else:
        p, hub_id, revision, commit = resolve_hf_cache(p)
        root = p
        guessed_id = hub_id or default_model_id(p.resolve())
        index = _find_index(p)
        weight_map = load_weight_map(index) if index else None
        if weight_map:
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(f.name for f in p.glob("*.safetensors") if f.is_file())
        if not files:
            return _open_other_formats(p, model_id or guessed_id, revision, commit)
    headers: list[SafetensorsHeader] = []
    shards: list[ShardInfo] = []
    identities: list[FileIdentity] = []
    for name in files:
        file_path = root / name
        if not file_path.is_file():
            where = index if index else root
            raise ModelPathError(
                f"{where}: shard {name!r} is missing from {root}; download the missing file", path=file_path
            )
        header, header_digest, identity = read_file_header(file_path, str(file_path))
        headers.append(header)
        identities.append(identity)
        shards.append(ShardInfo(name, header.file_size, blob_sha256(file_path), header_digest))
    tensors = _tensor_refs(headers, shards)
    if index is not None and weight_map is not None:
        _check_index_map(index, weight_map, tensors, shards)
    config = load_config(root)
    metadata: dict[str, str] = {}
    for header in headers:
        metadata.update(header.metadata)
    plan = ModelPlan(
        model_id=model_id or guessed_id,
        source="local",
        location=str(p.resolve()),
        shards=shards,
        tensors=tensors,
        config=config,
        revision=revision,
        commit=commit,
        metadata=metadata,
        quant_config=load_quant_config(root),
        base_model=load_base_model(root),
    )
    return plan, LocalReader(root, shards, identities)


def _find_index(folder: Path) -> Path | None:
    """The folder's safetensors index, if it has one (model.safetensors.index.json among several)."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        preferred = folder / "model.safetensors.index.json"
        if preferred not in indexes:
            raise ModelPathError(
                f"{folder}: several safetensors index files; pass the model folder of one model", path=folder
            )
        return preferred
    return indexes[0] if indexes else None


def _open_other_formats(
    folder: Path, model_id: str, revision: str | None, commit: str | None
) -> tuple[ModelPlan, Reader]:
    from .torch_bin import bin_shards, open_torch_bin

    bins, _ = bin_shards(folder)
    reader: Reader  # a TorchBinReader or a GGUFReader
    if bins:
        plan, reader = open_torch_bin(folder, bins, model_id=model_id)
    else:
        ggufs = sorted(folder.glob("*.gguf"))
        if len(ggufs) != 1:
            found = f" (found {len(ggufs)} .gguf files: pass one of them)" if ggufs else ""
            raise ModelPathError(
                f"{folder}: no .safetensors, pytorch_model*.bin or single .gguf weights found{found}; "
                "point at a model folder or file",
                path=folder,
            )
        from .gguf import open_gguf

        plan, reader = open_gguf(ggufs[0], model_id)
    plan.revision, plan.commit = revision, commit
    return plan, reader


def _tensor_refs(headers: list[SafetensorsHeader], shards: list[ShardInfo]) -> list[TensorRef]:
    refs: list[TensorRef] = []
    seen: dict[str, str] = {}
    for i, header in enumerate(headers):
        for entry in header.tensors:
            if entry.name in seen:
                raise CheckpointFormatError(
                    f"tensor {entry.name!r} appears in both {seen[entry.name]} and {shards[i].name}; "
                    "the folder mixes two checkpoints",
                    file=header.where,
                )
            seen[entry.name] = shards[i].name
            refs.append(TensorRef(entry.name, entry.dtype, entry.shape, i, entry.start, entry.end))
    return refs


def _check_index_map(
    index: Path, weight_map: dict[str, str], tensors: list[TensorRef], shards: list[ShardInfo]
) -> None:
    where = {t.name: shards[t.shard].name for t in tensors}
    for tensor, shard in weight_map.items():
        if where.get(tensor) != shard:
            found = f"it is in {where[tensor]}" if tensor in where else "no shard holds it"
            raise CheckpointFormatError(
                f"{index}: maps tensor {tensor!r} to {shard} but {found}; the index and shards do not match",
                file=index,
            )


def content_fingerprint(plan: ModelPlan) -> str:
    """A short hash identifying the checkpoint: its content when every shard's hash is known, else its
    layout (names, sizes, headers) and where it lies, so that two runs' same-shaped checkpoints differ."""
    h = hashlib.sha256()
    for shard in plan.shards:
        # surrogateescape: a file name that is not UTF-8 (byte 0xff) is hashed as its bytes, as os.fsencode does
        h.update(
            f"{shard.name}\0{shard.size}\0{shard.sha256 or shard.header_sha256}\n".encode("utf-8", "surrogateescape")
        )
    if any(shard.sha256 is None for shard in plan.shards):
        h.update(b"\0at\0" + os.fsencode(os.path.realpath(plan.location)))
    return h.hexdigest()[:12]

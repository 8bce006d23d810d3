"""PyTorch `.bin` checkpoints (pytorch_model*.bin), read only through torch's restricted loader.

`torch.load(weights_only=True)` refuses any pickle that would build arbitrary objects or call
functions, so a malicious checkpoint cannot run code. With `mmap=True` the tensors stay in the
file until a tensor is read, so memory stays at a few tensors here too.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import DTYPES, DType
from ..errors import BadInputError, CheckpointFormatError
from .local import default_model_id, file_header_digest, load_config, load_weight_map
from .plan import ModelPlan, ShardInfo, TensorRef

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
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "complex64": "C64",
}
_UNKNOWN = DType("TORCH_OTHER", 8, "other", False)

NOTE = "pytorch .bin read with torch.load(weights_only=True, mmap=True) (restricted unpickler)"


def bin_shards(folder: Path) -> tuple[list[str], Path | None]:
    """The pytorch_model*.bin files of a folder (via pytorch_model.bin.index.json when present)."""
    index = folder / "pytorch_model.bin.index.json"
    if index.is_file():
        return sorted(set(load_weight_map(index).values())), index
    return sorted(p.name for p in folder.glob("pytorch_model*.bin") if p.is_file()), None


def _restricted_load(torch: Any, path: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's notes on pickle protocols: not the user's concern
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "zipfile" not in str(exc) and "mmap" not in str(exc):
                raise
        # Legacy (pre-1.6, non-zip) serialization cannot be mapped: that shard is read whole.
        return torch.load(path, map_location="cpu", weights_only=True)


def _load(path: Path) -> dict[str, Any]:
    import pickle

    import torch

    try:
        state = _restricted_load(torch, path)
    except pickle.UnpicklingError as exc:
        if "unsupported global" in str(exc).lower() or "not an allowed global" in str(exc).lower():
            raise CheckpointFormatError(
                f"{path}: refused by the restricted unpickler (it would build objects other than tensors); "
                "only plain tensor checkpoints are read: convert it to safetensors"
            ) from None
        raise CheckpointFormatError(f"{path}: not a readable torch checkpoint (corrupt pickle)") from None
    except (RuntimeError, OSError, ValueError, EOFError) as exc:
        raise CheckpointFormatError(f"{path}: not a readable torch checkpoint ({exc.__class__.__name__})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise CheckpointFormatError(f"{path}: holds a {type(state).__name__}, not a state dict of tensors")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


class TorchBinReader:
    """Copies one tensor at a time out of the memory-mapped checkpoints."""

    def __init__(self, states: list[dict[str, Any]]) -> None:
        self._states = states

    def read_into(self, ref: TensorRef, out: np.ndarray) -> None:
        import torch

        t = self._states[ref.shard][ref.name].contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        elif t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bool):
            t = t.view(torch.uint8)
        out[:] = t.reshape(-1).numpy().view(np.uint8)

    def close(self) -> None:
        self._states.clear()


def open_torch_bin(
    folder: Path, files: list[str], *, model_id: str | None = None, sha256: dict[str, str] | None = None
) -> tuple[ModelPlan, TorchBinReader]:
    if not files:
        raise BadInputError(f"{folder}: no pytorch_model*.bin weights found")
    states, shards, refs = [], [], []
    seen: set[str] = set()
    for i, name in enumerate(files):
        path = folder / name
        if not path.is_file():
            raise BadInputError(f"{folder}: shard {name!r} is missing; download the missing file")
        state = _load(path)
        states.append(state)
        shards.append(ShardInfo(name, path.stat().st_size, (sha256 or {}).get(name), file_header_digest(path)))
        for key, tensor in state.items():
            if key in seen:
                raise CheckpointFormatError(f"tensor {key!r} appears in two shards; the folder mixes checkpoints")
            seen.add(key)
            dtype = DTYPES.get(_TORCH_DTYPES.get(str(tensor.dtype).removeprefix("torch."), ""), _UNKNOWN)
            nbytes = math.prod(tensor.shape) * max(dtype.bits // 8, 1)
            refs.append(TensorRef(key, dtype, tuple(tensor.shape), i, 0, nbytes))
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
    return plan, TorchBinReader(states)

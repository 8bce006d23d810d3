"""`weightdiag diff BASE TUNED --export-lora OUT`: ΔW of every changed linear weight as a PEFT LoRA adapter.

A second read of both sides after the diff, in lockstep row blocks as the diff reads them (delta/paired.py):
each matrix's ΔW = W_tuned - W_base (float32, each element within 2^-24 relative of the exact difference) is
assembled from its blocks, factored by its truncated SVD (delta/lora.py: from the Gram of its narrower side) and
dropped before the next matrix's is complete, so memory holds one matrix's ΔW (float32) and one Gram with its
eigendecomposition (min(m, n)^2 float64 a few times), never a whole model; one block is read at a time.

What is exported: the 2-D weights named `<module>.weight` that changed, but embeddings and output heads (PEFT
adapts them with other layers). The folder holds `adapter_config.json` (peft_type LORA, target_modules the
changed modules' names, r and lora_alpha the largest rank, rank_pattern and alpha_pattern per module so that
every module's scaling lora_alpha / r is 1) and `adapter_model.safetensors` (`base_model.model.<module>.lora_A
.weight`, r x in, and `lora_B.weight`, out x r, float32): merged into the base, B A is added to each weight.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..delta.lora import DEFAULT_ENERGY, factor
from ..delta.paired import matrix_shape, stream_pairs
from ..delta.pairing import pair_tensors
from ..delta.result import DiffOptions
from ..errors import OptionError, OutputError, param
from ..layout import arch_from_config, classify_tensor, complete_arch
from .diff import open_side
from .measure import selected

SUFFIX = ".weight"


def check(out: Path, rank: int | None, energy: float | None) -> None:
    """Refuse unusable options (exit 2) before anything is read."""
    if rank is not None and energy is not None:
        raise OptionError(f"give {param('rank')} or {param('energy')}, not both", param="rank")
    if rank is not None and rank < 1:
        raise OptionError(f"{param('rank')} {rank}: choose a whole number of at least 1", param="rank")
    if energy is not None and not 0 < energy <= 1:
        raise OptionError(f"{param('energy')} {energy}: choose a share above 0 and at most 1", param="energy")
    if not str(out) or str(out) == ".":
        raise OptionError(f"{param('export_lora')} names no folder; give a new folder's path", param="export_lora")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OptionError(f"{out}: exists and is not an empty folder; choose a new one", param="export_lora")
    parent = out.absolute().parent
    while not parent.exists() and parent != parent.parent:  # the folder that will hold the new ones
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"{out}: cannot be made ({parent} is not a folder you can write in); choose another", path=out
        )


def export_lora(
    base_spec: str,
    tuned_spec: str,
    out: Path,
    *,
    rank: int | None = None,
    energy: float | None = None,
    options: DiffOptions | None = None,
) -> dict[str, Any]:
    """Write the adapter folder; returns what was written: per module its rank, energy held and relative error."""
    from safetensors.numpy import save_file

    options = options or DiffOptions()
    check(out, rank, energy)
    base_plan, base_reader = open_side(base_spec, options)
    try:
        tuned_plan, tuned_reader = open_side(tuned_spec, options)
    except BaseException:
        base_reader.close()
        raise
    tensors: dict[str, np.ndarray] = {}
    modules: list[dict[str, Any]] = []
    try:
        arch = complete_arch(arch_from_config(base_plan.config, []), [(t.name, t.shape) for t in base_plan.tensors])
        refs = [t for t in base_plan.tensors if selected(t.name, options.include, options.exclude)]
        pairs = []
        for pair in pair_tensors(refs, tuned_plan.tensors).pairs:
            shape = tuple(pair.base.shape)
            role = classify_tensor(pair.name, shape, arch.n_layers, arch.family, arch.n_experts)
            if len(shape) == 2 and pair.name.endswith(SUFFIX) and role.kind not in ("embed", "unembed"):
                pairs.append(pair)
        held: dict[int, np.ndarray] = {}

        def start(i: int) -> None:
            held[i] = np.empty(matrix_shape(pairs[i].base.shape), dtype=np.float32)

        def work(block: Any, b: Any, t: Any) -> None:
            n = matrix_shape(pairs[block.pair].base.shape)[1]
            delta = np.subtract(t.values, b.values, dtype=np.float32)  # within 2^-24 relative, as the diff's
            held[block.pair][block.r0 : block.r1] = delta.reshape(block.r1 - block.r0, n)

        workers = options.workers or 1  # one block in flight: the memory is ΔW and its Gram, not blocks
        for block, _ in stream_pairs(pairs, base_reader, tuned_reader, work, workers=workers, before_tensor=start):
            if not block.last:
                continue
            delta = held.pop(block.pair)
            if not np.any(delta):
                continue
            name = pairs[block.pair].name
            module = name[: -len(SUFFIX)]
            f = factor(delta, rank=rank, energy=energy)
            del delta
            if f.rank == 0:
                continue
            tensors[f"base_model.model.{module}.lora_A.weight"] = np.ascontiguousarray(f.a)
            tensors[f"base_model.model.{module}.lora_B.weight"] = np.ascontiguousarray(f.b)
            modules.append(
                {
                    "module": module,
                    "shape": list(pairs[block.pair].base.shape),
                    "rank": f.rank,
                    "energy": f.energy,
                    "relative_error": f.error,
                    "exact": f.exact,
                }
            )
    finally:
        base_reader.close()
        tuned_reader.close()
    if not modules:
        raise OptionError(
            f"{base_spec} -> {tuned_spec}: no linear weight changed, so there is no adapter to write (nothing was "
            "written)",
            param="export_lora",
        )
    top = max((m["rank"] for m in modules), default=0)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base_plan.model_id,
        "task_type": None,
        "inference_mode": True,
        "r": top,
        "lora_alpha": top,
        "rank_pattern": {m["module"]: m["rank"] for m in modules},
        "alpha_pattern": {m["module"]: m["rank"] for m in modules},
        "target_modules": [m["module"] for m in modules],
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    # Whole or absent: written into a hidden sibling folder, then renamed into place (onto an empty one too).
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{os.getpid()}.tmp"
    try:
        staging.mkdir()
        save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        (staging / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        os.replace(staging, out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise OutputError(
            f"{out}: the adapter could not be written ({exc.strerror or exc}); nothing was", path=out
        ) from None
    return {
        "folder": str(out),
        "rank": (
            {"requested": rank}
            if rank is not None
            else {"energy": energy}
            if energy is not None
            else {"default": f"ΔW's own rank where exactly low-rank, else energy {DEFAULT_ENERGY}"}
        ),
        "modules": modules,
        "max_rank": top,
        "max_relative_error": max((m["relative_error"] for m in modules), default=0.0),
    }

"""Choose where reductions run: `cpu`, `cuda[:N]`, or `auto` (CUDA when torch sees a GPU)."""

from __future__ import annotations

import os
import shutil

from ..errors import OptionError


def nvidia_present() -> bool:
    # Cheap check first, so `auto` on a machine without a GPU never imports torch.
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def resolve_device(spec: str) -> str:
    spec = (spec or "auto").lower()
    if spec == "cpu":
        return "cpu"
    if spec == "auto":
        if not nvidia_present():
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda" or spec.startswith("cuda:"):
        import torch

        if not torch.cuda.is_available():
            raise OptionError(
                f"--device {spec}: torch sees no CUDA GPU here; use --device cpu or auto", option="--device"
            )
        return spec
    raise OptionError(f"--device {spec!r}: choose auto, cpu, cuda or cuda:N", option="--device")

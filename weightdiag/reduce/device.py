"""Choose where reductions run: `cpu`, `cuda[:N]`, or `auto`.

`auto` is the CPU, decided without importing torch, because the CPU is the faster device end to end today.
Measured on one H100 with 16 cores (issue 19: a Llama-3-8B-shaped BF16 checkpoint of 16.1 GB from the page
cache), the command took 3.1 s with --device cpu and 9.4-11.1 s with --device cuda: `import torch` alone
costs 5.2 s there, and the CUDA path (pageable copies, one synchronisation per chunk) reached 4.6 GB/s
against the CPU path's 7.8 GB/s through the API. Only F32 was faster on CUDA through the API (2.4 against
1.1 GB/s), which would repay the import only above about 10 GB of F32, never measured end to end. Results are
identical on both devices, so `auto` may pick CUDA once a measurement shows it faster end to end (model
size, dtype, cores, the import); until then a GPU is used only when asked for: --device cuda.
"""

from __future__ import annotations

import os
import shutil

from ..errors import MissingDependencyError, OptionError


def nvidia_present() -> bool:
    """Whether an NVIDIA driver is loaded here: without one CUDA cannot be, and torch need not be imported."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def resolve_device(spec: str) -> str:
    spec = (spec or "auto").lower()
    if spec in ("cpu", "auto"):  # auto: see the module's docstring
        return "cpu"
    if spec == "cuda" or spec.startswith("cuda:"):
        try:  # asked for: torch decides (a driver can hide from nvidia_present, as under WSL)
            import torch
        except ImportError:
            raise MissingDependencyError(
                f"--device {spec} needs torch, which is not installed; pip install torch (a CUDA build)",
                package="torch",
            ) from None
        if not torch.cuda.is_available():
            raise OptionError(
                f"--device {spec}: torch sees no CUDA GPU here; use --device cpu or auto", option="--device"
            )
        return spec
    raise OptionError(f"--device {spec!r}: choose auto, cpu, cuda or cuda:N", option="--device")

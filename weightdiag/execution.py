"""How a job runs, decided once: threads, chunk workers, the device and the kernels, as one value.

A command (or an API call, a sweep worker, a diff) builds one `Execution` from the settings and its
options when it starts (`Execution.build`), and hands it down: the chunk engine takes its workers and device
from it, the kernels their thread count (`kernels.thread_budget`), every pass its executor (executor.py:
this process, or the nodes of a Ray cluster) and the Hub readers their connections. Nothing below reads
WEIGHTDIAG_THREADS, decides the device or asks which executor runs, and a test runs a job on 3 threads by
passing `Execution(threads=3, ...)`, not by patching a module.

The device: `auto` chooses per pass (issue 41), from what is known, without importing torch where no NVIDIA
driver is loaded. The fit runs on the CPU: measured on one H100 with 16 cores (issue 19: a Llama-3-8B-shaped BF16
checkpoint of 16.1 GB from the page cache), the command took 3.1 s with --device cpu and 9.4-11.1 s with --device
cuda (`import torch` alone 5.2 s; the CUDA path 4.6 GB/s against the CPU path's 7.8 GB/s through the API); the
staged, privatised CUDA pipeline of issue 41 has not been measured yet, and `auto` will move the fit to CUDA
only once benchmarks/bench_gpu.py shows it faster end to end. The spectrum runs on CUDA where torch sees a GPU
(`for_spectrum`): its Gram products are float64 GEMMs, 14-17 TFLOP/s on an H200 against a few hundred GFLOP/s
on 16 cores, so the GPU wins whatever the import costs. Results are identical on both devices for the fit and
within the documented tolerance for the spectrum; the row says what was chosen and why (`run.device_choice`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace

from . import settings
from .errors import TORCH_INSTALL, MissingDependencyError, OptionError, param
from .executor import LOCAL, Executor, RayExecutor

EXECUTORS = ("local", "ray")
MAX_CONNECTIONS = 64


@dataclass(frozen=True)
class Execution:
    """Where, how and on how many threads a job runs. Plain data but for a Ray executor's connection: a
    local one travels to sweep workers as is, and a node gets `for_node()`'s copy."""

    threads: int  # threads one kernel call may split into (and the reductions of fetched chunks run on)
    chunk_workers: int  # local chunks read and reduced at once
    device: str = "cpu"  # where reductions run, resolved: "cpu" or "cuda[:N]", never "auto"
    kernels: str = "c"  # "c" (the compiled kernels) or "numpy" (the fallback); what the process loaded
    executor: Executor = LOCAL  # what runs the passes: this process, or the nodes of a Ray cluster
    connections: int = 8  # ranged requests a Hub reader keeps in flight (on a cluster: per task)
    requested: str = "cpu"  # the --device given ("auto" lets the spectrum pass choose its own: for_spectrum)

    @classmethod
    def from_settings(cls, device: str = "auto", *, threads: int | None = None) -> Execution:
        """The settings (WEIGHTDIAG_THREADS, the cores this process may use) and the command's --device.
        `threads`: a share of the cores given to this process (a sweep worker), instead of the setting."""
        from . import kernels

        chosen = threads if threads is not None else settings.threads()
        workers = min(chosen, settings.MAX_CHUNK_WORKERS) if threads is not None else settings.chunk_workers()
        requested = (device or "auto").lower()
        return cls(chosen, workers, resolve_device(device), kernels.BACKEND, requested=requested)

    @classmethod
    def build(
        cls,
        device: str = "auto",
        *,
        executor: str = "local",
        ray_address: str | None = None,
        connections: int = 8,
        threads: int | None = None,
    ) -> Execution:
        """The one place a job's way of running is chosen and checked: the settings, the device, the executor
        (`local` or `ray`, joined on first use) and the connections."""
        chosen = choose_executor(executor, ray_address)
        if not (isinstance(connections, int) and 1 <= connections <= MAX_CONNECTIONS):
            raise OptionError(
                f"{param('connections')} {connections}: choose a whole number from 1 to {MAX_CONNECTIONS}",
                param="connections",
            )
        if not chosen.local and (device or "auto").lower() not in ("auto", "cpu"):
            raise OptionError(
                f"{param('device')} {device} with {param('executor')} {executor}: the nodes run on their CPUs; "
                f"leave {param('device')} out",
                param="device",
            )
        return replace(cls.from_settings(device, threads=threads), executor=chosen, connections=connections)

    def on(self, device: str) -> Execution:
        """The same execution on another device (resolved)."""
        return replace(self, device=resolve_device(device), requested=(device or "auto").lower())

    def for_spectrum(self) -> Execution:
        """The execution of the spectrum pass: with --device auto on this machine, CUDA where torch sees a GPU
        (see the module docstring); otherwise the fit's."""
        if self.requested != "auto" or not self.executor.local:
            return self
        return replace(self, device=auto_spectrum_device())

    def device_choice(self, spectrum: Execution | None = None) -> str:
        """The row's `run.device_choice`: what --device asked for and where each pass ran, and why."""
        if self.requested != "auto":
            return f"{self.requested}: as asked"
        fit = "the fit on the CPU (measured faster than CUDA end to end: issue 19)"
        if spectrum is None:
            return f"auto: {fit}"
        if spectrum.device == "cpu":
            return f"auto: {fit}; the spectrum on the CPU (no CUDA GPU seen)"
        return f"auto: {fit}; the spectrum on {spectrum.device} (float64 Gram products)"

    def for_node(self, cpus: int) -> Execution:
        """What a task of a pass runs with on a cluster node: this machine's threads (kernels and BLAS split
        their sums by threads: the same sums as here), `cpus` chunk workers, the node's CPU, no executor."""
        workers = max(1, min(cpus, settings.MAX_CHUNK_WORKERS))
        return replace(self, chunk_workers=workers, device="cpu", executor=LOCAL, requested="cpu")

    def close(self) -> None:
        """Let go of the executor's connection (a Ray cluster joined for this job)."""
        self.executor.close()


def choose_executor(name: str, ray_address: str | None = None) -> Executor:
    """The executor an --executor names: `local` (this process) or `ray` (the Ray cluster at `ray_address`, else
    RAY_ADDRESS, joined on first use)."""
    if name == "local":
        return LOCAL
    if name == "ray":
        return RayExecutor(ray_address)
    raise OptionError(f"{param('executor')} {name!r}: choose {' or '.join(EXECUTORS)}", param="executor")


def nvidia_present() -> bool:
    """Whether an NVIDIA driver is loaded here: without one CUDA cannot be, and torch need not be imported."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def auto_spectrum_device() -> str:
    """`cuda` where an NVIDIA driver is loaded and torch (installed) sees a GPU, else `cpu`; torch is imported
    only where a driver is."""
    if not nvidia_present():
        return "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(spec: str) -> str:
    """--device for the fit: auto (the CPU, see the module docstring), cpu, cuda or cuda:N (checked with torch)."""
    spec = (spec or "auto").lower()
    if spec in ("cpu", "auto"):
        return "cpu"
    if spec == "cuda" or spec.startswith("cuda:"):
        try:  # asked for: torch decides (a driver can hide from nvidia_present, as under WSL)
            import torch
        except ImportError:
            raise MissingDependencyError(
                f"--device {spec} needs torch, which is not installed: {TORCH_INSTALL}, a CUDA build",
                package="torch",
            ) from None
        if not torch.cuda.is_available():
            raise OptionError(
                f"{param('device')} {spec}: torch sees no CUDA GPU here; use {param('device')} cpu or auto",
                param="device",
            )
        return spec
    raise OptionError(f"{param('device')} {spec!r}: choose auto, cpu, cuda or cuda:N", param="device")

"""`weightdiag version` and `weightdiag env`: what runs, and in which environment (for bug reports)."""

from pathlib import Path
from typing import Any

from .. import __version__, settings
from .output import _emit, _stdout, _Verbatim
from .takes import Given, takes


def version() -> None:
    """Print the weightdiag version."""
    _stdout().print(f"weightdiag {__version__}")


@takes("as_json")  # no -q: env prints its result and nothing else, so -q would promise what it cannot do (issue 42)
def env(given: Given) -> None:
    """Print the environment weightdiag runs in, to paste into a bug report (never the Hub token)."""
    document = _environment()

    def view() -> _Verbatim:
        lines = ["Copy and paste the text below into your bug report.", ""]
        for key, value in document.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items()) or "none set"
            lines.append(f"- {ENV_LABELS[key]}: {value}")
        return _Verbatim("\n".join(lines) + "\n")

    _emit(document, view, as_json=given.as_json, quiet=False)


def _environment() -> dict[str, Any]:
    """What `weightdiag env` reports: versions, kernels, torch and CUDA, the database, the Hub settings."""
    import platform
    from importlib import metadata

    from ..kernels import describe

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    try:
        hub_version = metadata.version("huggingface_hub")
    except metadata.PackageNotFoundError:
        hub_version = "not installed"
    return {
        "weightdiag_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "kernels": describe(),
        "cores": _cores_summary(),
        "torch_version": torch_version or "not installed (only needed for .bin files and CUDA)",
        "cuda": _cuda_summary() if torch_version else "no (torch is not installed)",
        "huggingface_hub_version": hub_version,
        "database_folder": str(Path(settings.db_dir()).absolute()),
        "database_folder_chosen": settings.db_location()[1] + "; a command's --db DIR overrides it",
        "hf_endpoint": settings.hf_endpoint(),
        "hf_cache": settings.hf_cache_dir(),
        "hf_offline": settings.hf_offline(),
        "hf_token": "present" if settings.hf_token_present() else "not found",
        "progress_bars": "shown on a terminal" if settings.progress_bars() else "hidden (HF_HUB_DISABLE_PROGRESS_BARS)",
        "weightdiag_variables": settings.weightdiag_variables(),
    }


# `env --json`'s keys are snake_case, as in every other JSON weightdiag prints (they had spaces before issue 33);
# the text for a person keeps the words.
ENV_LABELS = {
    "weightdiag_version": "weightdiag version",
    "python_version": "Python version",
    "platform": "Platform",
    "kernels": "Kernels",
    "cores": "Cores",
    "torch_version": "Torch version",
    "cuda": "CUDA",
    "huggingface_hub_version": "huggingface_hub version",
    "database_folder": "Database folder",
    "database_folder_chosen": "Database folder chosen",
    "hf_endpoint": "HF endpoint",
    "hf_cache": "HF cache",
    "hf_offline": "HF offline",
    "hf_token": "HF token",
    "progress_bars": "Progress bars",
    "weightdiag_variables": "WEIGHTDIAG variables",
}


def _cores_summary() -> str:
    """The cores this process may use and how many local chunks a fit reads at once (settings.chunk_workers)."""
    from ..errors import OptionError

    try:
        workers = settings.chunk_workers()
    except OptionError as exc:  # env still answers: it is where a bad setting is looked into
        return f"{settings.available_cores()} available; {exc}"
    return f"{settings.available_cores()} available; a fit reads {workers} local chunks at once"


def _cuda_summary() -> str:
    # torch is imported (about a second) only where an NVIDIA driver is present; elsewhere CUDA cannot be.
    from ..execution import nvidia_present

    if not nvidia_present():
        return "no (no NVIDIA driver)"
    try:
        import torch
    except ImportError:
        from ..errors import TORCH_INSTALL

        return f"no (torch is not installed: {TORCH_INSTALL})"

    if not torch.cuda.is_available():
        return "no (torch sees no GPU)"
    return f"yes, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}"

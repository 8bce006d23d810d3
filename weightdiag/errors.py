"""The errors weightdiag raises on purpose, each tied to a documented exit code.

The exit codes let CI tell a finding from a crash (the convention of pytest: 1 is a finding, higher codes
are trouble). Anything that escapes without being a WeightdiagError is a bug: exit 5 (internal error).
Every message is one line: what is wrong, then what to do about it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """weightdiag's exit codes (the README's table lists them; tests/test_cli_surface.py runs each)."""

    OK = 0
    REGRESSION = 1  # `check` ran and found matrices that moved beyond the tolerance (a finding, not an error)
    BAD_INPUT = 2  # the user's input (path, file, option, environment variable) is wrong; also typer's usage errors
    HUB = 3  # Hugging Face Hub / network trouble, or bytes that fail their sha256
    PARTIAL = 4  # `sweep` finished, but some checkpoints failed (the others' rows are written)
    INTERNAL = 5  # a bug: please report it (WEIGHTDIAG_DEBUG=1 shows the traceback)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)


class WeightdiagError(Exception):
    """Base of every error weightdiag raises deliberately."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str) -> None:
        # Keep messages to one line so the CLI can print them without a traceback.
        super().__init__(" ".join(message.split()))

    @property
    def message(self) -> str:
        return str(self)


class BadInputError(WeightdiagError):
    """The model path, file contents or an option cannot be used."""

    exit_code = ExitCode.BAD_INPUT


class CheckpointFormatError(BadInputError):
    """A checkpoint file violates its format (safetensors header, index, GGUF, pickle)."""


class HubError(WeightdiagError):
    """The Hub or the network refused or failed (auth, missing repo or revision, offline)."""

    exit_code = ExitCode.HUB


class VerificationError(HubError):
    """Bytes read from the Hub do not match the file's published sha256 (nothing is written)."""

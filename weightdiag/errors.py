"""The errors weightdiag raises on purpose, each tied to a documented exit code.

Anything else that escapes is a bug and exits with code 1 (internal error).
Every message is one line: what is wrong, then what to do about it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug, or `check` found a regression
    BAD_INPUT = 2  # the user's input (path, file, option) is wrong
    HUB = 3  # Hugging Face Hub / network trouble


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

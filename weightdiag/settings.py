"""Every environment setting weightdiag reads, read at call time (so tests and long-lived processes see changes).

A value that cannot be used is the user's input: BadInputError (exit 2) with one line naming the variable.
"""

from __future__ import annotations

import math
import os

from .errors import BadInputError


def _positive_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise BadInputError(f"{name}={raw!r}: expected a positive number of seconds")
    return value


def http_timeout() -> float:
    """WEIGHTDIAG_HTTP_TIMEOUT (seconds, default 45): the longest any Hub call may wait for an answer.

    Connect and read timeouts use it; a body read that makes too little progress for half of it is
    abandoned and retried once, so a stalled or trickling server ends the command within about twice it.
    """
    return _positive_float("WEIGHTDIAG_HTTP_TIMEOUT", 45.0)


MAX_THREADS = 1024


def threads() -> int:
    """WEIGHTDIAG_THREADS (default: the CPU count): threads for the reduction kernels, 1 to 1024."""
    raw = os.environ.get("WEIGHTDIAG_THREADS", "").strip()
    if not raw:
        return max(1, os.cpu_count() or 1)
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_THREADS:
        raise BadInputError(
            f"WEIGHTDIAG_THREADS={raw[:40]!r}: expected a whole number of threads from 1 to {MAX_THREADS}"
        )
    return value


def _flag(name: str) -> bool:
    """A boolean variable, read as huggingface_hub reads its own (1, true, yes, on; any case)."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def debug() -> bool:
    """WEIGHTDIAG_DEBUG: any non-empty value lets an error end in its traceback instead of one line."""
    return bool(os.environ.get("WEIGHTDIAG_DEBUG"))


def progress_bars() -> bool:
    """Whether to draw progress bars: not when HF_HUB_DISABLE_PROGRESS_BARS is set, as for huggingface_hub's."""
    return not _flag("HF_HUB_DISABLE_PROGRESS_BARS")


def hf_offline() -> bool:
    """HF_HUB_OFFLINE: read Hub models from the local cache only."""
    return _flag("HF_HUB_OFFLINE")


def hf_endpoint() -> str:
    """HF_ENDPOINT, else huggingface_hub's default (https://huggingface.co)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hf_cache_dir() -> str:
    """The HF hub cache folder: HF_HUB_CACHE, else $HF_HOME/hub, else huggingface_hub's default."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return str(constants.HF_HUB_CACHE)


def hf_token_present() -> bool:
    """Whether a Hub token is available (HF_TOKEN or `hf auth login`); the token itself is never returned."""
    from huggingface_hub import get_token

    return bool(get_token())


def weightdiag_variables() -> dict[str, str]:
    """Every WEIGHTDIAG_* variable that is set, by name (what `weightdiag env` prints)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("WEIGHTDIAG_")}


def columns() -> int | None:
    """COLUMNS, when it is a positive whole number: the width to render for (rich reads it the same way)."""
    raw = os.environ.get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) > 0 else None

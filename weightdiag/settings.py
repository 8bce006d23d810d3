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

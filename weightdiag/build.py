"""What this process runs: the build of weightdiag (its version and a hash of its sources) and the kernels it
loaded. A journal is resumed only by the same build and kernels (record/journal.py), and a Ray cluster's nodes
must run the driver's (executor.py): F32 sums differ in the last digits between the C and numpy kernels, and any
change of the code may change a row."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from pathlib import Path

from . import __version__, kernels


@functools.cache
def build_identity() -> str:
    """The version and a hash of the package's own sources (.py and .c): it changes whenever the code does,
    where `__version__` stays 0.1.0 across commits. Read once per process (~1 MB, a few ms)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".c") and "__pycache__" not in p.parts):
        with contextlib.suppress(OSError):
            digest.update(path.relative_to(root).as_posix().encode("utf-8", "surrogateescape") + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return f"{__version__}+{digest.hexdigest()[:16]}"


def kernels_in_use() -> str:
    """The kernels this process reduces with now: "c" or "numpy" (their F32 sums differ in the last digits)."""
    return "c" if kernels.HAVE_C else "numpy"

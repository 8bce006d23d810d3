"""Local shards that must not change while they are read: who a file is, whether it changed, safe mappings.

A shard's identity (device, inode, size, mtime, ctime) is recorded from the descriptor its header is read
through. Every later read opens the shard by its path again (nothing stays open between reads, so a model of
300 shards fits under `ulimit -n 256`) and checks that the path still names that very file, unchanged, before
and after it reads: a file truncated, rewritten in place, overwritten (safetensors' `save_file` onto it
truncates and rewrites it; a new file renamed over it replaces it) or renamed away during a fit ends it with
one line (exit 2), never a row that mixes two checkpoints. ctime is checked besides mtime because a copy
that preserves times (`cp -p`, rsync) sets mtime back but cannot set ctime. File times tick every few
milliseconds (the kernel's coarse clock): a same-size rewrite within that tick of the header read is the one
change this cannot see.

Mapped reads need more: a file truncated while a mapping of it is read kills the process with SIGBUS. So a
chunk is mapped only under a read lease (fcntl F_SETLEASE, Linux): while we hold it, anyone's truncate or
open for writing waits until we release it (at most /proc/sys/fs/lease-break-time, 45 s by default, against
milliseconds for a chunk), and a pending break tells us afterwards that the file was about to change. Where no
lease can be had (the file is open for writing elsewhere: the case at risk; it is not ours; the file system
or the platform has no leases), the chunk is copied with pread instead: slower, never a crash.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointFormatError

# Linux only (None elsewhere, where no lease is taken).
_SETLEASE: int | None = getattr(fcntl, "F_SETLEASE", None)
_GETLEASE: int | None = getattr(fcntl, "F_GETLEASE", None)
_SETSIG: int | None = getattr(fcntl, "F_SETSIG", None)
# A lease break is announced by a signal, SIGIO unless told otherwise, whose default action ends the process;
# SIGURG is ignored by default and nothing in weightdiag handles it.
_BREAK_SIGNAL = getattr(signal, "SIGURG", 0)


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path named when it was planned, and its state then."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def change(self, st: os.stat_result) -> str | None:
        """What differs in `st` (None: nothing), in words for the error line."""
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            return "another file now has its name"
        if st.st_size != self.size:
            return f"its size went from {self.size} to {st.st_size} bytes"
        if (st.st_mtime_ns, st.st_ctime_ns) != (self.mtime_ns, self.ctime_ns):
            return "it was modified"
        return None


def changed(path: Path, why: str) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{path}: the file changed while being read ({why}); re-run once it is complete and nothing writes to it",
        file=path,
    )


def open_checked(path: Path, identity: FileIdentity) -> int:
    """A read-only descriptor of `path`, which must still be the file `identity` describes, unchanged."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise changed(path, "it was renamed or deleted") from None
    try:
        check(fd, path, identity, by_path=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check(fd: int, path: Path, identity: FileIdentity, *, by_path: bool = True) -> None:
    """Raise if the open file changed, or (by_path) if its path now names another file or none."""
    why = identity.change(os.fstat(fd))
    if why is not None:
        raise changed(path, why)
    if by_path:
        check_path(path, identity)


def check_path(path: Path, identity: FileIdentity) -> None:
    """Raise if `path` now names another file than `identity`, a changed one, or none."""
    try:
        why = identity.change(os.stat(path))
    except FileNotFoundError:
        why = "it was renamed or deleted"
    if why is not None:
        raise changed(path, why)


def take_read_lease(fd: int) -> bool:
    """Hold a read lease on `fd` (see the module's docstring); False where none can be had."""
    if _SETLEASE is None or _GETLEASE is None or _SETSIG is None:
        return False
    try:
        fcntl.fcntl(fd, _SETSIG, _BREAK_SIGNAL)
        fcntl.fcntl(fd, _SETLEASE, fcntl.F_RDLCK)
    except OSError:  # EAGAIN: open for writing somewhere; EACCES: not our file; EINVAL: no leases here
        return False
    return True


def break_pending(fd: int) -> bool:
    """Whether someone waits to truncate or write the leased file (the lease is being broken)."""
    assert _GETLEASE is not None  # a lease is held: take_read_lease found the constants
    return fcntl.fcntl(fd, _GETLEASE) != fcntl.F_RDLCK


def release_lease(fd: int) -> None:
    """Let a waiting writer go now: a live mapping keeps the file, and so its lease, open past close()."""
    assert _SETLEASE is not None  # a lease is held: take_read_lease found the constants
    with contextlib.suppress(OSError):  # already broken by the kernel after lease-break-time
        fcntl.fcntl(fd, _SETLEASE, fcntl.F_UNLCK)

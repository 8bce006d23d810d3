"""Files read from a database or a checkpoint: regular files only, opened without blocking, read with a bound.

A name on disk may stand for anything: a FIFO blocks open() and read() until some writer comes (for ever); a
link to /dev/zero or /dev/urandom reads without end; a folder or a socket is no file at all. So a file is read
only once it is known to be a regular one, checked twice: by its name before it is opened (opening a device
may act on it) and on the descriptor after (the name may have been swapped in between; O_NONBLOCK makes the
open of a FIFO return at once instead of waiting for a writer). And it is read no further than the bound
its caller states (what its format allows), whatever its size says or becomes while it is read.

`links=False` refuses a symbolic link too, for files weightdiag writes itself (a journal's): a link there was
put by someone else.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from pathlib import Path


class IrregularFile(OSError):
    """A file that cannot be read as one: not a regular file (a FIFO, a device, a folder, a link where none may
    be), or larger than its reader's bound. `str()` says what it is ("is a FIFO (named pipe), not a regular
    file"), to follow the file's name in a message. An OSError, so that readers that already treat an
    unreadable file as such treat this one so too."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why

    def __str__(self) -> str:
        return self.why


def kind_of(mode: int) -> str:
    """What a file of this st_mode is, in words: 'a FIFO (named pipe)', 'a character device', ..."""
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _refuse(mode: int) -> IrregularFile:
    return IrregularFile(f"is {kind_of(mode)}, not a regular file")


def check_regular(path: str | Path, *, links: bool = True) -> os.stat_result:
    """The stat of `path` (through a link with `links`, else the link's own); IrregularFile unless it is a
    regular file; FileNotFoundError (and other OSErrors) as os.stat raises them."""
    st = os.stat(path) if links else os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(st.st_mode)
    return st


def open_regular(path: str | Path, *, links: bool = True) -> io.BufferedReader:
    """`path` open for reading (binary, buffered), refused (IrregularFile) unless it is a regular file."""
    check_regular(path, links=links)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not links:  # swapped for a link since the check
            raise IrregularFile("is a symbolic link, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # what was opened, should the name have changed since the check
            raise _refuse(st.st_mode)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def too_large(size: int, limit: int) -> IrregularFile:
    return IrregularFile(f"is {size} bytes, more than the {limit} its format allows")


def read_bounded(path: str | Path, limit: int, *, links: bool = True) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them: IrregularFile when it is not a regular
    file or holds more (by its size, or by what could be read: a file growing while it is read)."""
    with open_regular(path, links=links) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise too_large(size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(len(data), limit)
    return data

"""How many threads BLAS may use inside a block of code: the spectrum's Gram products run on the job's cores.

numpy and scipy each load their own OpenBLAS (numpy.libs/libscipy_openblas64_*, scipy.libs/libscipy_openblas*):
the Gram's dsyrk and the eigensolve are scipy's, a matrix product through numpy is numpy's. Each library
starts as many threads as the machine has cores unless told otherwise, which is right for one job on a whole
machine and wrong for a sweep worker given a share of the cores (Execution.threads). `blas_threads(n)` sets
every OpenBLAS loaded in the process to n threads inside the block and restores each one after; where no
OpenBLAS is found (another BLAS) it changes nothing. The libraries are found among the loaded ones, as
threadpoolctl does; diff's one-thread-per-worker blocks use the same (weightdiag/delta/paired.py).

Small matrices run on one BLAS thread (`threads_for`, `PerMatrix`): OpenBLAS threads wait for each other by
spinning, and on a loaded machine (a CI runner, a shared box) a thread that is descheduled leaves the others
spinning: the spectrum of all-MiniLM-L6-v2 (40 eigensolves of order 384) took 42-75 s on 2 busy cores with two
BLAS threads against 15.5 s with one (issue 42, item 7). On the same 2 cores at load 2 (03:52 UTC 2026-11-28),
dsyrk + eigh of order 384 / 768 / 1024 / 2048 took 0.12 / 0.37 / 0.80 / 1.5 s on one thread and 0.19 / 0.51 /
1.2 / 1.8 s on two: below order 1024 a second thread gains nothing even unloaded. The rule depends on the
matrix's size and the job's threads only, never on the load measured: an eigensolve's last bits depend on the
thread count (2.5e-15 relative for order 384), and a row must be the same whenever it is fitted again.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

_PREFIXES = ("scipy_openblas_", "openblas_")
_SUFFIXES = ("64_", "")
_LOCK = threading.Lock()  # the setting is process-wide: one block changes it at a time
SMALL_ORDER = 1024  # a Gram (an eigensolve) of order below this runs on one BLAS thread (see above)

Controls = tuple[Callable[[], int], Callable[[int], object]]


def openblas_controls() -> tuple[Controls, ...]:
    """(get_num_threads, set_num_threads) of every OpenBLAS loaded in the process now: numpy's, and scipy's
    once scipy.linalg is imported (the spectrum's modules import it; diff's do not, and need not pay for it)."""
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:
        return ()
    return tuple(controls for path in paths if (controls := _library_controls(path)) is not None)


@cache
def _library_controls(path: str) -> Controls | None:
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for prefix in _PREFIXES:
        for suffix in _SUFFIXES:
            get = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
            if get is not None and put is not None:
                get.restype = ctypes.c_int
                put.argtypes = [ctypes.c_int]
                return get, put
    return None


@contextmanager
def blas_threads(threads: int) -> Iterator[None]:
    """Every loaded OpenBLAS on `threads` threads inside the block (each restored after)."""
    with _LOCK:
        controls = openblas_controls()
        before = [int(get()) for get, _ in controls]
        for _, put in controls:
            put(max(1, threads))
    try:
        yield
    finally:
        with _LOCK:
            for (_, put), n in zip(controls, before, strict=True):
                put(n)


def threads_for(order: int, threads: int) -> int:
    """The BLAS threads for a matrix whose Gram is of order `order` (its smaller side) in a job of `threads`."""
    return 1 if order < SMALL_ORDER else max(1, threads)


class PerMatrix:
    """Inside `blas_threads`, each matrix's BLAS calls on `threads_for` its order: `use(n)` sets every loaded
    OpenBLAS (found once, when made: /proc/self/maps costs 1.5 ms a read) where the count changes."""

    def __init__(self) -> None:
        self._controls = openblas_controls()
        self._current = int(self._controls[0][0]()) if self._controls else 0

    def use(self, threads: int) -> None:
        if threads != self._current and self._controls:
            with _LOCK:
                for _, put in self._controls:
                    put(threads)
            self._current = threads

"""One BLAS thread per worker while diff's blocks run side by side.

Each worker multiplies its own block (the sketch's products, the Gram matrix); OpenBLAS would start its own
threads inside each call as well, and two workers x two BLAS threads on two cores ran the sketch 2x slower
than one BLAS thread each (measured: 23.4 s against 11.6 s on benchmarks/bench_diff.py --size-gb 0.2).
numpy's OpenBLAS is found among the loaded libraries (as threadpoolctl does); anything else is left alone.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

_PREFIXES = ("scipy_openblas_", "openblas_")
_SUFFIXES = ("64_", "")


@cache
def _openblas() -> tuple[Callable[[], int], Callable[[int], object]] | None:
    """(get_num_threads, set_num_threads) of the OpenBLAS numpy loaded, or None."""
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
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
def single_threaded(active: bool = True) -> Iterator[None]:
    """BLAS limited to one thread inside the block (restored after); a no-op where OpenBLAS is not found."""
    funcs = _openblas() if active else None
    if funcs is None:
        yield
        return
    get, put = funcs
    before = int(get())
    put(1)
    try:
        yield
    finally:
        put(before)

"""One BLAS thread per worker while diff's blocks run side by side.

Each worker multiplies its own block (the sketch's products, the Gram matrix); OpenBLAS would start its own
threads inside each call as well, and two workers x two BLAS threads on two cores ran the sketch 2x slower
than one BLAS thread each (measured: 23.4 s against 11.6 s on benchmarks/bench_diff.py --size-gb 0.2).
Every OpenBLAS loaded is set (reduce/blas.py finds them as threadpoolctl does); anything else is left alone.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from ..reduce.blas import blas_threads


def single_threaded(active: bool = True) -> AbstractContextManager[None]:
    """BLAS limited to one thread inside the block (restored after); a no-op where OpenBLAS is not found."""
    return blas_threads(1) if active else nullcontext()

"""The tuning knobs: sizes, thresholds and timeouts that trade speed against memory (or waiting), in one registry.

Each knob is a field of `Tuning`, with its default and why it is that value. The code that uses one reads
`current().<field>` where it uses it, once per call (never per element), so that an override takes effect
everywhere at once:

    with tuning.override(split_bytes=16 << 10, head_guess=4096):
        ...  # a small model read in many small pieces, as a large one is read in large ones

Why one registry rather than constants in the modules that use them: a test that needs a fit cut into small
pieces (or a claim given up after half a second) overrides the knob here, by name, instead of patching the
module that happens to hold it, or the module that imported a copy of it; a knob whose name changes fails
loudly in the tests that turn it (an unknown name is a TypeError), where a patch of a module attribute that no
longer exists may pass unnoticed; and this one place lists the knobs with their reasons.

Not user configuration: nothing here is read from the environment or from an option. What a user sets
(WEIGHTDIAG_THREADS, the Hub's timeouts and retries, ...) stays in weightdiag/settings.py, and what a job
decides once (threads, chunk workers, device, kernels) is its weightdiag.execution.Execution. The values here
are the same for every job of a process: an override lasts until its `with` ends, is seen by every thread of
the process (the chunk engine's workers included), and is not carried to other processes (Ray tasks and sweep
workers run with the defaults). Overrides are for tests and experiments, made from one thread at a time;
nested ones unwind in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class Tuning:
    """Every knob and its default. Plain data: read it with `current()`, change it with `override()`."""

    # --- source: planning and reading bytes
    # Where large tensors are cut (multiples of this from each tensor's start), for every source and chunk size:
    # the same pieces, the same merged sums (weightdiag.source.chunks). A multiple of 8 bytes, at most a reader's
    # chunk_bytes (whose defaults are multiples of it).
    split_bytes: int = 16 << 20
    # Chunks of local files: 32 MiB mappings measured fastest on two cores from the page cache (76% of `cat` against
    # 47% for pread into reused buffers).
    local_chunk_bytes: int = 32 << 20
    # Chunks of Hub shards, one ranged GET each: a 20 MB/s CDN connection moves one in ~0.8 s, so request latency
    # is a few per cent.
    hub_chunk_bytes: int = 16 << 20
    head_guess: int = 256 << 10  # bytes read first from a Hub shard: most safetensors headers fit, one request not two
    # The last round of Hub chunks is read in parts of at least this size, so that no connection idles at the end.
    tail_part_bytes: int = 2 << 20

    # --- kernels (the C / numpy hot loops)
    parallel_min: int = 1 << 22  # elements; smaller tensors are not worth a thread hand-off
    numpy_chunk: int = 1 << 20  # elements per numpy step: keeps temporaries in cache

    # --- decode
    decode_chunk: int = 1 << 21  # stored bytes of GGML blocks dequantized at a time: bounds the temporaries

    # --- reduce
    torch_chunk: int = 1 << 24  # elements per step of the torch reductions: bounds the int64 temporaries on the device

    # --- run
    # Vectors up to this size are gathered whole and summarised at once (exactly numpy's mean, std and dot);
    # longer ones are summarised chunk by chunk, so that no vector is ever held as float64 whole.
    vector_gather_bytes: int = 4 << 20
    # The lineage fingerprint (reduce/sample.py) gathered by every fit; off only to time a fit without it
    # (benchmarks/bench_lineage.py --cost): its rows then have no `lineage`.
    lineage_fingerprint: bool = True

    # --- database: claims of rows being fitted (two sweeps sharing the work)
    # A claim's holder touches it every heartbeat_seconds while it fits; a claim of another host that nobody has
    # seen change for claim_silent_seconds (by the observer's own monotonic clock: the hosts' clocks need not
    # agree) is given up as its holder's.
    heartbeat_seconds: float = 5.0
    claim_silent_seconds: float = 60.0

    # --- render
    plain_list_rows: int = 500  # beyond this many rows, a plain text table: rich measures every cell (12 s for 5,000)

    # --- diff
    block_elems: int = 1 << 20  # elements per block: the float64 arithmetic holds a few arrays of this many
    gram_cols: int = 1024  # up to this many columns the spectrum is exact (Gram matrix, 8 MB at most)


_current = Tuning()


def current() -> Tuning:
    """The knobs in effect now (the defaults, unless an `override` is in progress). Cheap: one variable read."""
    return _current


@contextmanager
def override(**changes: Any) -> Iterator[Tuning]:
    """The knobs in `changes` set to their values, for every thread of this process, until the `with` ends;
    yields the knobs in effect. An unknown name is a TypeError (before anything changes).

    In a test: `with tuning.override(parallel_min=64): ...`, or the `knobs` fixture (tests/conftest.py), which
    keeps an override until the test ends."""
    global _current
    unknown = sorted(set(changes) - {f.name for f in fields(Tuning)})
    if unknown:
        raise TypeError(f"no such tuning knob: {', '.join(unknown)} (see weightdiag.tuning.Tuning)")
    previous = _current
    _current = replace(previous, **changes)
    try:
        yield _current
    finally:
        _current = previous

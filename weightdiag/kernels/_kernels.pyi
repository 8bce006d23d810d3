# Types of the C extension built from _kernels.c (mypy cannot read a compiled module). Arrays are numpy arrays
# read or written in place through the buffer protocol (C-contiguous; sizes as _kernels.c's comments say);
# the functions that return None add into their output arrays.

import numpy as np

def hist16(codes: np.ndarray, counts: np.ndarray, /) -> None: ...
def find16(codes: np.ndarray, mask: int, target: int, /) -> int: ...
def find32(bits: np.ndarray, mask: int, target: int, /) -> int: ...
def max_finite32(bits: np.ndarray, /) -> int: ...
def hist32(
    bits: np.ndarray,
    thresholds: np.ndarray,
    irregular: np.ndarray | None,
    counts: np.ndarray,
    above: np.ndarray,
    irregular_hist: np.ndarray,
    /,
) -> None: ...
def power_sums(values: np.ndarray, shift: float, sums: np.ndarray, /) -> None: ...
def count_slots(
    codes: np.ndarray, slots: np.ndarray, col0: int, group: int, bits: int, ncodes: int, out: np.ndarray, /
) -> None: ...
def locate_slots(
    codes: np.ndarray,
    slots: np.ndarray,
    col0: int,
    group: int,
    bits: int,
    ncodes: int,
    wanted: np.ndarray,
    high_first: bool,
    /,
) -> int: ...
def weighted32(
    values: np.ndarray, weights: np.ndarray, shift: float, counts: np.ndarray | None, sums: np.ndarray | None, /
) -> None: ...

# (n_split, n_inf, top: the largest finite |value| held, -1.0 when none, n_tops)
def reduce_slots(
    counts: np.ndarray,
    table: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    counts16: np.ndarray,
    hist: np.ndarray,
    split: np.ndarray,
    tops: np.ndarray,
    /,
) -> tuple[int, int, float, int]: ...

# (top, at, n_inf, nonfinite, shift)
def f32_pass(
    bits: np.ndarray, thresholds: np.ndarray, counts: np.ndarray, above: np.ndarray, sums: np.ndarray, /
) -> tuple[int, int, int, int, float]: ...

# one flat tuple, in the groups below (kernels.pair16 unpacks it into PairCounts)
def pair16(
    base: np.ndarray,
    tuned: np.ndarray,
    base_table: np.ndarray | None,
    tuned_table: np.ndarray | None,
    limit_base: int,
    limit_tuned: int,
    thresholds: np.ndarray,
    codes: np.ndarray,
    counts: np.ndarray,
    delta: np.ndarray | None,
    tables: np.ndarray,
    /,
) -> tuple[
    int, int, int,  # unchanged, flips, nonfinite
    int, int, int, int, int, int, int, int,  # (top, at) for base, tuned, delta and ratio
    float, float, float, float, float,  # the five sums
    int, int, int, int, int,  # the five packed lengths
    float,  # shift
]: ...  # fmt: skip

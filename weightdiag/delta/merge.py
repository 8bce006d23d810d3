"""Is the tuned model a combination of given parents? Per tensor, the least-squares coefficients of the tuned's
change against the parents' changes (all from the same base), and what they leave unexplained. Pure numerics.

The inputs are squared Frobenius norms of differences, which every `diff` measures exactly (float64 sums of
exact differences): with d_t = W_tuned - W_base and d_i = W_parent_i - W_base, the inner products come by
polarization, <d_a, d_b> = (|d_a|^2 + |d_b|^2 - |W_a - W_b|^2) / 2, so no pass holds more than two models'
blocks. Then a = argmin |d_t - sum_i a_i d_i| solves G a = c (G_ij = <d_i, d_j>, c_i = <d_t, d_i>), and the
relative residual is sqrt(max(0, |d_t|^2 - a.c)) / |d_t|. A linear average of two fine-tunes gives a = (0.5, 0.5)
and a residual at the storage's rounding (1e-7 in F32); task arithmetic gives its scales; an unrelated change
gives a residual near 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MergeFit:
    """One tensor's fit of d_t against the parents' changes."""

    name: str
    coefficients: tuple[float, ...]  # a_i, one per parent, in the order given; NaN: that parent left it alone
    residual: float  # |d_t - sum a_i d_i| / |d_t|


def fit(
    name: str, tuned: float, parents: Sequence[float], cross: Sequence[float], between: Mapping[tuple[int, int], float]
) -> MergeFit | None:
    """tuned: |d_t|^2; parents[i]: |d_i|^2; cross[i]: |W_tuned - W_parent_i|^2; between[(i, j)], i < j:
    |W_parent_i - W_parent_j|^2. None when the tuned did not change (nothing to explain)."""
    if tuned <= 0 or not math.isfinite(tuned):
        return None
    p = len(parents)
    g = np.zeros((p, p))
    c = np.zeros(p)
    for i in range(p):
        g[i, i] = parents[i]
        c[i] = (tuned + parents[i] - cross[i]) / 2
        for j in range(i + 1, p):
            g[i, j] = g[j, i] = (parents[i] + parents[j] - between[(i, j)]) / 2
    live = np.array([x > 0 for x in parents])  # a parent that left this tensor alone has no coefficient here
    a = np.full(p, math.nan)
    left = tuned
    if live.any():
        a[live] = np.linalg.lstsq(g[np.ix_(live, live)], c[live], rcond=1e-12)[0]
        left = tuned - float(a[live] @ c[live])
    return MergeFit(name, tuple(float(x) for x in a), math.sqrt(max(0.0, left) / tuned))

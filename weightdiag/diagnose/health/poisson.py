"""The Poisson upper tail in log space, for counts far beyond what a float's factorials can hold.

`rate**i / math.factorial(i)` overflows a float from i = 171 on (171! > 1.8e308), so a hidden
dimension that holds the largest |w| of 172 or more matrices used to crash the report exactly when
the signal was strongest. Here every term is exp(i ln(rate) - rate - lgamma(i + 1)), summed relative
to its largest term, so any count and rate give a finite log-probability (the probability itself may
underflow to 0, its logarithm does not).

scipy.special.pdtrc computes the same tail, but importing scipy costs ~0.4 s and the fit and report
paths keep it out (tests/test_cli.py checks that a fit imports neither torch nor scipy); the tests
check this against scipy.stats.poisson.logsf instead.
"""

from __future__ import annotations

import math

_TINY = 1e-17  # a term this small relative to the running sum no longer changes it (double precision)


def _log_term(i: int, rate: float) -> float:
    return i * math.log(rate) - rate - math.lgamma(i + 1)


def log_poisson_sf(count: int, rate: float) -> float:
    """ln P(X >= count) for X ~ Poisson(rate); 0.0 for count <= 0, -inf when rate is 0 and count > 0."""
    if count <= 0:
        return 0.0
    if rate <= 0:
        return -math.inf
    if count > rate:
        # Terms i >= count shrink by rate / (i + 1) < 1 each step: sum them from the first, relative to it.
        total, ratio, i = 1.0, 1.0, count
        while True:
            ratio *= rate / (i + 1)
            total += ratio
            i += 1
            if ratio < _TINY * total:
                return _log_term(count, rate) + math.log(total)
    # count <= rate: the tail is at least about a half; 1 - P(X <= count - 1), the lower terms summed
    # downwards from i = count - 1 (they shrink by i / rate <= 1 each step).
    total, ratio = 1.0, 1.0
    for i in range(count - 1, 0, -1):
        ratio *= i / rate
        total += ratio
        if ratio < _TINY * total:
            break
    log_cdf = _log_term(count - 1, rate) + math.log(total)
    return math.log1p(-math.exp(log_cdf)) if log_cdf < 0 else -math.inf

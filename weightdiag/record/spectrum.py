"""A matrix's spectrum as the row holds it (`matrices[].spectrum`, docs/row-schema.md): WeightWatcher's
columns from weightdiag.fit.esd.SpectrumFit, numbers rounded as the row rounds them (10 significant digits,
NaN and infinities as null), and the ESD itself as counts on log-spaced bins, so that `report --plot`
draws each layer's ESD without reading the weights again (64 counts instead of min(m, n) eigenvalues:
4,096 eigenvalues of each of an 8B model's 225 matrices would add 18 MB of JSON to its row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..fit.esd import EVALS_THRESH, SpectrumFit
from .row import json_float

ESD_BINS = 64


def esd_histogram(evals: np.ndarray, bins: int = ESD_BINS) -> dict[str, Any]:
    """Counts of the eigenvalues above EVALS_THRESH (those the power law is fitted to) on `bins` equal bins of
    log10 λ between the smallest and the largest of them; `below` counts the others."""
    evals = np.asarray(evals, dtype=np.float64)
    kept = evals[evals > EVALS_THRESH]
    below = int(evals.size - kept.size)
    if not kept.size:
        return {"log10_range": [], "counts": [], "below": below}
    logs = np.log10(kept)
    lo, hi = float(logs.min()), float(logs.max())
    if hi <= lo:  # every eigenvalue equal: one bin
        return {"log10_range": [json_float(lo), json_float(hi)], "counts": [int(kept.size)], "below": below}
    counts, _ = np.histogram(logs, bins=bins, range=(lo, hi))
    return {"log10_range": [json_float(lo), json_float(hi)], "counts": [int(c) for c in counts], "below": below}


def spectrum_record(fit: SpectrumFit, evals: np.ndarray) -> dict[str, Any]:
    """The `spectrum` object of one matrix (or fused part): every SpectrumFit field and the ESD's counts.
    FARMS' fields are written only when its windows were taken (--farms)."""
    out: dict[str, Any] = {}
    for key, value in fit.to_json().items():
        if (key.startswith("farms_") or key == "alpha_farms") and fit.farms_num_evals is None:
            continue
        out[key] = json_float(value) if isinstance(value, float) else value
    out["esd"] = esd_histogram(evals)
    return out

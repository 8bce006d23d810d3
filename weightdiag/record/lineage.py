"""The row's lineage fingerprint (docs/lineage.md, docs/row-schema.md `lineage`): each sampled matrix's values
at the fixed positions of reduce/sample.py, written compactly (float16 of value / rms, base64) and read back;
and, for matrices indexed by hidden units, the ranks of its pair cosines (reduce/pairs.py: one byte each)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..reduce.sample import SEED

METHOD = "weightdiag.lineage/1"  # fixed-position samples, reduce/sample.py


def fingerprint_json(
    samples: Mapping[str, np.ndarray], k: int, pairs: Mapping[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """The row's `lineage` object for the sampled values of each matrix record (in sampling order) and the pair
    cosines of those that have them (stored as twice their average ranks, uint8: ties keep equal ranks, so a
    constant matrix's zero cosines correlate with nothing)."""
    matrices: dict[str, dict[str, Any]] = {}
    for name, values in samples.items():
        v = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(v)
        rms = float(np.sqrt(np.mean(v[finite] ** 2))) if finite.any() else 0.0
        scaled = np.where(finite, v / rms, 0.0) if rms > 0 else np.zeros_like(v)
        stored = np.clip(scaled, -65504.0, 65504.0).astype("<f2")
        matrices[name] = {"scale": float(f"{rms:.6g}"), "values": base64.b64encode(stored.tobytes()).decode("ascii")}
        cos = (pairs or {}).get(name)
        if cos is not None and 0 < cos.size <= 127:
            ranks = np.rint(2 * _average_ranks(cos)).astype(np.uint8)
            matrices[name]["pairs"] = base64.b64encode(ranks.tobytes()).decode("ascii")
    return {"method": METHOD, "seed": SEED, "k": k, "matrices": matrices}


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average (scipy's rankdata: not imported by a fit, which would cost its
    memory to every fit)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2)[inverse]


def read_fingerprint(row: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """Each sampled matrix's values (float64, in sampling order) from a row, or None when it has no fingerprint
    (a row written before issue 39, a cohort row) or one of another method."""
    found = row.get("lineage")
    if not isinstance(found, dict) or found.get("method") != METHOD or found.get("seed") != SEED:
        return None
    out: dict[str, np.ndarray] = {}
    for name, entry in (found.get("matrices") or {}).items():
        raw = base64.b64decode(entry["values"])
        out[name] = np.frombuffer(raw, dtype="<f2").astype(np.float64) * float(entry["scale"])
    return out


def pair_ranks(stored: np.ndarray) -> np.ndarray:
    """The average ranks (float64) of the pair cosines from their stored uint8 codes (twice the rank)."""
    return stored.astype(np.float64) / 2


def read_pairs(row: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each matrix's pair-cosine ranks (float64, in pair order) from a row's fingerprint; empty for rows written
    before they existed."""
    found = row.get("lineage")
    if not isinstance(found, dict) or found.get("method") != METHOD or found.get("seed") != SEED:
        return {}
    matrices = found.get("matrices") or {}
    return {
        name: pair_ranks(np.frombuffer(base64.b64decode(entry["pairs"]), dtype=np.uint8))
        for name, entry in matrices.items()
        if isinstance(entry, dict) and isinstance(entry.get("pairs"), str)
    }

"""What a row says about quantization: which formats its matrices were dequantized from, and whether
that moves k beyond the fit's noise (measured per format on real weights, docs/quantization-k-shift.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any


@cache
def measured_k_shift() -> dict[str, Any]:
    """weightdiag/data/quant_k_shift.json: per format, how far quantizing real weights moved k."""
    try:
        text = resources.files("weightdiag").joinpath("data/quant_k_shift.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    return json.loads(text).get("formats", {})


def k_shift_within_noise(fmt: str | None) -> bool:
    """True when quantizing real weights in this format moved k less than the fit's noise (the class is kept)."""
    entry = measured_k_shift().get(fmt or "")
    if not entry:
        return False
    return entry.get("beyond_noise") is False


def k_shift_text(fmt: str | None) -> str | None:
    """'k moved +0.01 to +0.05 on real weights' for a measured format, else None."""
    entry = measured_k_shift().get(fmt or "")
    if not entry:
        return None
    lows, highs = [], []
    for model in (entry.get("models") or {}).values():
        if model.get("dk_min") is not None and model.get("dk_max") is not None:
            lows.append(model["dk_min"])
            highs.append(model["dk_max"])
    if not lows:
        return None
    return f"k moved {min(lows):+.3f} to {max(highs):+.3f} when real weights were quantized so"


def dequantized_formats(row: Mapping[str, Any]) -> Counter[str]:
    """Matrices per quantization label ("GPTQ int4, group 128") of a row's dequantized matrices."""
    return Counter(m["dequantized"]["label"] for m in row.get("matrices", []) if m.get("dequantized"))


def dequantized_line(row: Mapping[str, Any]) -> str | None:
    """One line for fit, compare, check and report: what was dequantized (None for an unquantized row)."""
    formats = dequantized_formats(row)
    if not formats:
        return None
    parts = [f"{label} ({n} {'matrix' if n == 1 else 'matrices'})" for label, n in formats.most_common()]
    return "dequantized from " + "; ".join(parts) + ": fits are of the exactly dequantized values"


def grid_line(row: Mapping[str, Any]) -> str | None:
    """One line when float matrices hold dequantized values (a 4-bit grid per group), None otherwise."""
    held = [m for m in row.get("matrices", []) if m.get("grid") and not m.get("dequantized")]
    if not held:
        return None
    groups = sorted({m["grid"]["group"] for m in held})
    return (
        f"{len(held)} of {len(row['matrices'])} matrices are stored as floats but sit on a 4-bit grid (at most 16 "
        f"distinct values per group of {'/'.join(map(str, groups))}): dequantized weights saved again, e.g. a "
        "merged QLoRA save; their k classes are withheld (quantization reshapes |w|)"
    )

"""Gathering a row's records into per-(block, kind) cells, how a matrix was quantized, and the small
formatting helpers (short tensor names, numbers, block spans) shared by the report's text."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...vocabulary import BLOCK_KEYS, COHORT_TRIM
from ..classes import NON_WEIBULL_R2, k_class_withheld
from .cuts import QUANT_K_SHIFT

_BITS = re.compile(r"^(?:I?Q)(\d)|^MXFP(\d)")


@dataclass
class Cell:
    """One (block, kind) of the model: a matrix, a part of a fused one, or experts pooled by median."""

    block: int
    key: str
    tensor: str
    records: list[dict[str, Any]]
    quant: dict[str, Any] | None = None
    experts: int = 0  # routed experts pooled in this cell (0: a dense matrix or a shared expert)

    def value(self, stat: str, trim: str) -> float | None:
        values = [v for v in (_record_stat(r, stat, trim) for r in self.records) if v is not None]
        return float(np.median(values)) if values else None


def _record_stat(rec: dict[str, Any], stat: str, trim: str) -> float | None:
    if stat in ("k", "lambda", "r2"):
        fit = rec["fits"][trim]
        value = fit.get(stat) if fit.get("ok") else None
    else:
        value = rec["stats"].get("excess_kurtosis" if stat == "kurtosis" else stat)
    return float(value) if value is not None and math.isfinite(value) else None


def q99_exact(rec: dict[str, Any]) -> bool:
    """Whether a matrix's q99 of |w| (so max/q99) is exact: it is for 16- and 8-bit codes; F32 and F64
    values (and GGUF blocks dequantized to them) are counted in 2^-7-wide buckets, which can put q99 up
    to about 0.5% low, so max/q99 is quoted to 2 significant digits, as approximate."""
    return rec.get("dtype") in ("BF16", "F16", "F8_E4M3", "F8_E5M2", "I8", "U8") and "dequantized" not in (
        rec.get("note") or ""
    )


def ratio_text(value: float | None, exact: bool) -> str:
    """max/q99 as text: 3 significant digits when q99 is exact, else '≈' and 2 digits."""
    return fmt(value, 3) if exact or value is None else f"≈{fmt(value, 2)}"


def quantization_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    """How a matrix was quantized, and whether its fit is distorted by it (None: not quantized)."""
    held = k_class_withheld(rec)  # the one withholding test, shared with fit and compare
    if held is None:
        return None
    stats = rec["stats"]
    distinct = held.distinct_values
    few = distinct is not None
    qtype = held.quantization
    bits_match = _BITS.match(qtype or "")
    bits = int(next(g for g in bits_match.groups() if g)) if bits_match else None
    r2 = rec["fits"][COHORT_TRIM].get("r2")
    reasons = []
    if qtype:
        shift = QUANT_K_SHIFT.get(qtype)
        reasons.append(
            f"{qtype} ({bits}-bit codes per block)"
            + (f": moves k by +{shift[0]:.2f} to +{shift[1]:.2f} on synthetic matrices" if shift else "")
        )
    if few:
        reasons.append(f"only {distinct} distinct values")
    if r2 is not None and r2 < NON_WEIBULL_R2:
        reasons.append(f"R² {r2:.3f} < {NON_WEIBULL_R2}")
    if (stats.get("zero_fraction") or 0) >= 0.01:
        reasons.append(f"{stats['zero_fraction']:.1%} of values rounded to exactly 0")
    return {"type": qtype or "grid", "bits": bits, "distorted": True, "why": "; ".join(reasons)}


SHARED = "shared:"  # key prefix of a shared expert's matrices ('shared:gate'): kept apart from the routed experts


def shared_key(key: str) -> bool:
    return key.startswith(SHARED)


def gather_cells(row: Mapping[str, Any]) -> dict[tuple[int, str], Cell]:
    """Every (block, kind) cell; fused matrices add their parts as 'qkv[q]' etc. A layer's routed experts
    of one kind share a cell (read as their median); its shared expert's matrices have their own keys
    ('shared:gate'), so they are never pooled with the routed experts (experts.py reads those one by one)."""
    grouped: dict[tuple[int, str], list[tuple[str, dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for m in row["matrices"]:
        if m["block"] is None or m["kind"] not in BLOCK_KEYS:
            continue
        prefix = SHARED if m.get("expert") is None and "shared expert" in (m.get("note") or "") else ""
        grouped[(m["block"], prefix + m["kind"])].append((m["name"], m, m))
        for part in m.get("parts", []):
            key = f"{prefix}{m['kind']}[{part['kind']}]"
            grouped[(m["block"], key)].append((f"{m['name']}[{part['kind']}]", part, m))
    cells = {}
    for (block, key), members in grouped.items():
        experts = sum(1 for _, _, m in members if m.get("expert") is not None)
        tensor = members[0][0] if len(members) == 1 else f"{len(members)} experts of {key}"
        quant = quantization_of(members[0][2])
        cells[(block, key)] = Cell(block, key, tensor, [rec for _, rec, _ in members], quant, experts)
    return cells


LONG_NAME = 120  # names longer than this are shortened in text (JSON fields keep them whole)


def elide(name: str, width: int = LONG_NAME) -> str:
    """A name cut to `width` characters around an ellipsis, so one odd tensor name cannot flood a line."""
    if len(name) <= width:
        return name
    head = (width - 1) * 2 // 3
    return f"{name[:head]}…{name[len(name) - (width - 1 - head) :]}"


def short_name(name: str) -> str:
    """'model.layers.3.self_attn.k_proj.weight' -> 'self_attn.k_proj' (what a reader scans for)."""
    text = re.sub(r"^.*?(?:layers|layer|h|blocks|block|blk)\.\d+\.", "", name)
    return elide(re.sub(r"\.weight$", "", text))


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def span(blocks: list[int] | tuple[int, ...]) -> str:
    return f"{blocks[0]}" if len(blocks) == 1 else f"{blocks[0]}-{blocks[-1]}"

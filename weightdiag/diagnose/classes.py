"""The k axis: Transmission / Selection-mild / Selection-deep, and the non-Weibull fallback.

All thresholds live here, with the paper's evidence (arXiv 2605.18898, CC BY 4.0, T. Ding):
- Transmission band: the median terminal FFN k of all 12 cohort entries lies in [1.186, 1.204]
  (Sec. 3.1); the half-normal init anchor is k0 = 1.2054 (App. A.1). A matrix is Transmission-like
  from k >= 1.18 and flagged "above band" beyond 1.22 (above the anchor by more than noise).
- Selection: separately stored MHA Q/K (OLMo-1, OLMo-2) 0.76-0.99 -> deep; GQA Q/K (Llama-3,
  Mistral, Qwen2.5/3) 1.10-1.16 -> mild; Pythia's fused W_qkv "1.05-1.18" is transitional, i.e.
  mild (Sec. 4.3). The paper quotes these ranges at two decimals: Pythia-70m's W_qkv is 1.0488 in
  the released CSV and inside its transitional zone, so the deep/mild cut is 1.045 (= 1.05 at the
  paper's precision); any cut in (0.99, 1.0488] separates the paper's groups.
- A fit with R^2 < 0.95 is not Weibull: no class, distribution-free metrics instead (the
  database's R2_below_95 columns use the same cut).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median
from typing import Any

from ..vocabulary import COHORT_TRIM
from .quantized import k_shift_text, k_shift_within_noise

TRANSMISSION_MIN_K = 1.18
ABOVE_BAND_K = 1.22
SELECTION_DEEP_BELOW_K = 1.045
NON_WEIBULL_R2 = 0.95
BAND = (1.186, 1.204)  # cohort FFN median band (Sec. 3.1)
INIT_ANCHOR_K = 1.2054

TRANSMISSION = "transmission"
SELECTION_MILD = "selection-mild"
SELECTION_DEEP = "selection-deep"
NON_WEIBULL = "non-weibull"


def k_class(k: float | None, r2: float | None = None) -> str | None:
    """Class of one fit (or of a kind's median k with its median R^2)."""
    if k is None or not math.isfinite(k):
        return None
    if r2 is not None and math.isfinite(r2) and r2 < NON_WEIBULL_R2:
        return NON_WEIBULL
    if k >= TRANSMISSION_MIN_K:
        return TRANSMISSION
    if k >= SELECTION_DEEP_BELOW_K:
        return SELECTION_MILD
    return SELECTION_DEEP


def k_flags(k: float) -> list[str]:
    return ["above band"] if k is not None and math.isfinite(k) and k > ABOVE_BAND_K else []


# --- sampling noise of k ---------------------------------------------------------------------------
# Standard error of one matrix's k under the mid80 protocol, for n finite nonzero |w|:
#     se(k) = sqrt((K_NOISE_C * k)^2 / n + K_NOISE_FLOOR^2)
# Derivation (docs in tests/test_verdict_wording.py, which re-checks it by simulation):
# - If |w| ~ Weibull(k, lambda), ln|w| = ln(lambda) + G / k with G = ln(Exp(1)), so k_hat / k is a
#   pivot: its spread depends on n and the trim only. The least-squares slope on the probability
#   plot is a linear functional of the quantile process; with h(p) = (y(p) - mean y) / g(y(p)),
#   y(p) = ln(-ln(1 - p)), g(y(p)) = (1 - p)(-ln(1 - p)), over p in [0.1, 0.9]:
#       sd(k_hat) / k = c / sqrt(n),  c^2 = iint h(p) h(q) (min(p, q) - p q) dp dq / (int (y - mean y)^2 dp)^2
#   which gives c = 1.0207 for mid80 (simulated with fit_hist1024: 0.94-1.05 for k 0.8 and 1.2,
#   n 4096 to 1e8).
# - Real matrices are nearer a half-normal than a Weibull: their probability plot bends, so which
#   1024-bin histogram bins sit at the window edges moves k. Simulated on half-normal, |t4|, |t2.5|,
#   Laplace and a 90/10 Gaussian mixture at random scales (multinomial draws from the exact bin
#   probabilities, 300-600 draws per point): the sampling part reaches c = 1.19 (half-normal), and
#   the bin phase adds a floor independent of n with sd 0.00082 (half-normal; range 0.0030),
#   plus edge-bin jitter. K_NOISE_C = 1.2 and K_NOISE_FLOOR = 0.0012 cover every simulated case
#   (e.g. half-normal n = 1e6: measured 0.00166, formula 0.00187).
# A kind's median over B blocks: the sampling part shrinks by sqrt(pi / (2B)) (capped at 1), the
# floor does not (every block of a kind shares the scale and so the bin phase).
# This is sampling noise only: two models of one family differ by more (the cohort's FFN medians
# span 0.017), so "beyond noise" says a difference is real, not that it matters.
K_NOISE_C = 1.2
K_NOISE_FLOOR = 0.0012
NOISE_Z = 3.0  # a departure is called out beyond 3 standard errors


def k_sigma(k: float, n: int | None) -> float:
    """Standard error of one matrix's mid80 k from n finite nonzero values (n unknown: the floor only)."""
    sampling = (K_NOISE_C * k) ** 2 / n if n else 0.0
    return math.sqrt(sampling + K_NOISE_FLOOR**2)


def fitted_values(record: dict[str, Any]) -> int | None:
    """How many finite nonzero values a matrix record's fit saw (None when the record does not say)."""
    stats = record.get("stats") or {}
    numel = record.get("numel") or stats.get("numel")
    if not numel:
        return None
    finite = stats.get("n_finite", numel) or 0
    return round(finite * (1.0 - float(stats.get("zero_fraction") or 0.0))) or None


def median_k_sigma(records: list[dict[str, Any]], trim: str = COHORT_TRIM) -> float:
    """Standard error of the median k over `records` (one kind's blocks); the floor alone without records."""
    fitted = [
        (r["fits"][trim]["k"], fitted_values(r))
        for r in records
        if r.get("fits", {}).get(trim, {}).get("ok") and r["fits"][trim].get("k") is not None
    ]
    parts = [(k, n) for k, n in fitted if n]
    if not parts:
        return K_NOISE_FLOOR
    sampling = float(median([K_NOISE_C * k / math.sqrt(n) for k, n in parts]))
    sampling *= min(1.0, math.sqrt(math.pi / (2 * len(parts))))
    return math.sqrt(sampling**2 + K_NOISE_FLOOR**2)


def beyond_noise(difference: float, sigma: float) -> bool:
    return abs(difference) > NOISE_Z * sigma


# --- quantized matrices: the k class is withheld ----------------------------------------------------
WITHHELD = "withheld (quantized)"
K_AXIS_CLASSES = ("selection", "transmission")  # kind classes the k axis is defined for (paper Sec. 2.2)
WITHHELD_WHY = "quantization reshapes |w|, so k is not read as Transmission/Selection"
FEW_DISTINCT_VALUES = 256  # at most this many distinct values over >= 16x as many entries: a quantization grid
_GGUF_NOTE = re.compile(r"GGUF (\w+), dequantized")


@dataclass(frozen=True)
class Withheld:
    """Why a matrix's k class is withheld: its values went through a quantizer."""

    quantization: str | None  # the stored type (GGUF Q4_1), None for a grid found by counting values
    distinct_values: int | None  # set when the values sit on a grid of at most FEW_DISTINCT_VALUES
    reason: str


def k_class_withheld(record: dict[str, Any]) -> Withheld | None:
    """Whether (and why) a matrix record's k class is withheld: `fit`, `compare` and `report` all ask here.

    Quantization reshapes |w| (codes on a per-block grid; k reads high: Q4_0 by +0.34 to +0.64 on
    synthetic matrices), so k describes the quantizer as much as training and is given no class.
    A record is quantized when the row says so (`quantization`, GGUF rows), when its note says it
    was dequantized (rows written before that field), or when its values take at most 256 distinct
    values over at least 4096 finite entries (an 8-bit code or less, whatever the file's dtype).
    """
    dequantized = record.get("dequantized") or {}
    if dequantized and k_shift_within_noise(dequantized.get("format")):
        return None  # measured on real weights: this format moves k less than the fit's noise
    grid = record.get("grid")
    if grid and not dequantized:
        what = (
            f"stored as floats but on a {grid['bits']}-bit grid (at most {2 ** grid['bits']} distinct values in "
            f"each group of {grid['group']}): dequantized weights saved again, e.g. a merged QLoRA save"
        )
        return Withheld(f"{grid['bits']}-bit grid", None, f"{what}; {WITHHELD_WHY}")
    qtype = record.get("quantization")
    if not qtype:
        match = _GGUF_NOTE.search(record.get("note") or "")
        qtype = match.group(1) if match else None
    stats = record.get("stats") or {}
    distinct = stats.get("distinct_values")
    finite = stats.get("n_finite", stats.get("numel", record.get("numel", 0))) or 0  # no finite value: no grid
    few = distinct is not None and 0 < distinct <= FEW_DISTINCT_VALUES and finite >= 16 * FEW_DISTINCT_VALUES
    if not qtype and not few:
        return None
    what = f"quantized ({qtype})" if qtype else f"on a quantization grid ({distinct} distinct values)"
    reason = f"{what}: {WITHHELD_WHY}"
    measured = k_shift_text(dequantized.get("format")) if dequantized else None
    if measured:
        reason += f" ({measured})"
    return Withheld(qtype, distinct if few else None, reason)


def kind_withheld(records: list[dict[str, Any]]) -> str | None:
    """Why a kind's class (the median over its matrices) is withheld, or None: any quantized member."""
    held = [w for w in (k_class_withheld(r) for r in records) if w]
    if not held:
        return None
    types = sorted({w.quantization or "grid" for w in held})
    count = f"{len(held)} of {len(records)} matrices" if len(held) < len(records) else f"all {len(records)} matrices"
    return f"{count} quantized ({', '.join(types)}): {WITHHELD_WHY}"


def kind_k_fields(
    records: list[dict[str, Any]], k_med: float | None, r2_med: float | None, on_k_axis: bool, trim: str = COHORT_TRIM
) -> dict[str, Any]:
    """`k_class`, `k_class_withheld` and `flags` of one kind's summary in a row."""
    if k_med is None or not on_k_axis:
        return {"k_class": None, "k_class_withheld": None, "flags": []}
    withheld = kind_withheld(records)
    if withheld:
        return {"k_class": None, "k_class_withheld": withheld, "flags": []}
    flags = k_flags(k_med) if beyond_noise(k_med - INIT_ANCHOR_K, median_k_sigma(records, trim)) else []
    return {"k_class": k_class(k_med, r2_med), "k_class_withheld": None, "flags": flags}


def k_class_label(summary: Mapping[str, Any], records: list[dict[str, Any]] | None = None) -> str:
    """The k class cell of a kind's summary: withheld for quantized members (also in rows written
    before `k_class_withheld` existed, when the matrices are given), else the class or '-'."""
    return WITHHELD if summary_withheld(summary, records) else summary.get("k_class") or "-"


def summary_withheld(summary: Mapping[str, Any], records: list[dict[str, Any]] | None = None) -> str | None:
    """Why a kind summary's class is withheld (None: it is not), for kinds on the k axis only."""
    if summary.get("class") not in K_AXIS_CLASSES or summary.get("k_median") is None:
        return None
    return summary.get("k_class_withheld") or (kind_withheld(records) if records else None)


def kind_records(row: Mapping[str, Any], kind: str, parts: bool = False) -> list[dict[str, Any]]:
    """The matrix records behind row["kinds"][kind] (parts=True: the fused matrices holding that part)."""
    if parts:
        return [m for m in row.get("matrices", []) if any(p["kind"] == kind for p in m.get("parts", []))]
    return [m for m in row.get("matrices", []) if m["kind"] == kind]

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


def k_class(k: float, r2: float | None = None) -> str | None:
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

"""The paper's eight diagnostic functions (Table 6 of arXiv:2605.18898), on weightdiag rows.

F1 extract weights      -> weightdiag.run.fitting.fit_model (the streaming reader; one pass per tensor)
F2 Weibull fit          -> weightdiag.fit.weibull.fit_hist1024 / fit_exact (per matrix, in every row)
F3 Gamma closure        -> weightdiag.fit.weibull.gamma_closure (per matrix: `gamma_closure` in rows)
F4 cross_family_band    per-entry median FFN k -> band and CV over entries, user models placed in it
F5 lambda_scaling       lambda = c sqrt(eta / lambda_wd) through the origin, Pearson r
F6 k_drift              delta k per kind from the init anchor 1.2054 or from a measured step-0 row
F7 attention_arch       MHA / GQA r:1 / MQA / fused qkv, from config or tensor shapes
F8 lambda_paired_correlation  log-log Pearson of lambda_O vs lambda_FFN_out

Functions take rows (dicts, as written by `weightdiag fit` or shipped in the cohort) and return
plain dicts, so the CLI can print them and `--json` can emit them unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import median
from typing import Any

import numpy as np

from ..vocabulary import COHORT_TRIM, FFN_KINDS, FFN_OUTPUT_KINDS, PYTHIA_LAMBDA_KINDS, SWIGLU_LAMBDA_KINDS
from .classes import BAND, INIT_ANCHOR_K


def _entry(row: Mapping[str, Any]) -> str:
    model = row["model"]
    return model["id"] + (f"@{model['revision']}" if model.get("revision") and model["source"] != "cohort" else "")


def ffn_median_k(row: Mapping[str, Any], trim: str | None = None) -> float | None:
    """An entry's FFN k: the median of its FFN kinds' median k (gate/up/down or ffn_in/ffn_out)."""
    values = [row["kinds"][k]["k_median"] for k in FFN_KINDS if k in row["kinds"] and row["kinds"][k]["k_median"]]
    # statistics.median: the same arithmetic as np.median ((a + b) / 2), 30x faster on a few values (compare)
    return float(median(values)) if values else None


def cross_family_band(entries: Sequence[dict[str, Any]], models: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """F4. Estimand: per entry, the median over its FFN kinds of the per-kind median k (mid80,
    hist1024); across entries: [min, max], mean and CV = population std / mean."""
    values = {_entry(r): ffn_median_k(r) for r in entries}
    values = {k: v for k, v in values.items() if v is not None}
    arr = np.array(list(values.values()))
    out: dict[str, Any] = {
        "estimand": "per-entry median over FFN kinds of the per-kind median k; CV = population std / mean",
        "entries": values,
        "band": [float(arr.min()), float(arr.max())] if arr.size else None,
        "mean": float(arr.mean()) if arr.size else None,
        "cv_percent": float(arr.std() / arr.mean() * 100) if arr.size else None,
        "cv_percent_sample": float(arr.std(ddof=1) / arr.mean() * 100) if arr.size > 1 else None,
        "paper_band": list(BAND),
        "models": {},
    }
    for model in models:
        k = ffn_median_k(model)
        if k is None:
            continue
        lo, hi = out["band"] or (math.nan, math.nan)
        position = "inside" if lo <= k <= hi else ("below" if k < lo else "above")
        out["models"][_entry(model)] = {
            "ffn_median_k": k,
            "position": position,
            "distance_to_band": 0.0 if position == "inside" else float(min(abs(k - lo), abs(k - hi))),
            "in_paper_band": BAND[0] <= k <= BAND[1],
        }
    return out


def transmission_lambda(row: Mapping[str, Any], kinds: Sequence[str] | None = None) -> float | None:
    """Mean over Transmission kinds of the per-kind median lambda (o + FFN; q/k/qkv excluded)."""
    kinds = kinds or (PYTHIA_LAMBDA_KINDS if "ffn_in" in row["kinds"] else SWIGLU_LAMBDA_KINDS)
    values = [row["kinds"][k]["lambda_median"] for k in kinds if k in row["kinds"]]
    values = [v for v in values if v]
    return float(np.mean(values)) if values else None


def lambda_scaling(entries: Sequence[dict[str, Any]], lambdas: dict[str, float] | None = None) -> dict[str, Any]:
    """F5. Fit lambda = c sqrt(eta / lambda_wd) through the origin over entries with known eta and
    lambda_wd; Pearson r of (sqrt(eta/lambda_wd), lambda). `lambdas` overrides the per-entry lambda
    (e.g. the paper's Table 4 means)."""
    xs, ys, names = [], [], []
    for row in entries:
        hp = row.get("hyperparameters") or {}
        if not hp.get("lr") or not hp.get("weight_decay"):
            continue
        lam = (lambdas or {}).get(row["model"]["id"]) or transmission_lambda(row)
        if lam is None:
            continue
        xs.append(math.sqrt(hp["lr"] / hp["weight_decay"]))
        ys.append(lam)
        names.append(_entry(row))
    x, y = np.array(xs), np.array(ys)
    if x.size < 2:
        return {"n": int(x.size), "slope": None, "pearson_r": None, "entries": {}}
    slope = float((x * y).sum() / (x * x).sum())
    return {
        "n": int(x.size),
        "slope": slope,
        "pearson_r": float(np.corrcoef(x, y)[0, 1]),
        "entries": {
            n: {
                "sqrt_eta_over_wd": float(a),
                "lambda": float(b),
                "ratio": float(b / a),
                "deviation_from_fit": float(b / (slope * a) - 1),
            }
            for n, a, b in zip(names, x, y, strict=True)
        },
    }


def k_drift(row: Mapping[str, Any], init: dict[str, Any] | None = None) -> dict[str, Any]:
    """F6. Per kind: delta k = k_median - k_init, k_init from a measured step-0 row or the anchor."""
    out = {}
    for kind, summary in row["kinds"].items():
        k = summary.get("k_median")
        if k is None:
            continue
        base = (init or {}).get("kinds", {}).get(kind, {}).get("k_median") if init else None
        reference = base if base is not None else INIT_ANCHOR_K
        out[kind] = {
            "k": k,
            "k_init": reference,
            "reference": "measured step-0 row" if base is not None else "half-normal anchor 1.2054",
            "delta_k": k - reference,
            "delta_percent": (k - reference) / reference * 100,
        }
    return out


def attention_arch(arch: dict[str, Any]) -> dict[str, Any]:
    """F7. Attention architecture from head counts (config.json, or shapes when config is missing)."""
    n_q, n_kv = arch.get("n_heads"), arch.get("n_kv_heads") or arch.get("n_heads")
    fused = bool(arch.get("fused_qkv"))
    if not n_q:
        kind = "unknown"
    elif n_kv == n_q:
        kind = "MHA"
    elif n_kv == 1:
        kind = "MQA"
    else:
        kind = "GQA"
    ratio = n_q // n_kv if n_q and n_kv and n_q % n_kv == 0 else None
    label = {"GQA": f"GQA {ratio}:1" if ratio else f"GQA {n_q}:{n_kv}"}.get(kind, kind)
    return {
        "type": kind,
        "label": label + (" (fused qkv)" if fused else ""),
        "n_q": n_q,
        "n_kv": n_kv,
        "ratio": ratio,
        "heads": f"{n_q}:{n_kv}" if n_q else None,
        "fused_qkv": fused,
        "qk_norm": arch.get("qk_norm"),
    }


def lambda_paired_correlation(lambda_o: Sequence[float], lambda_ffn_out: Sequence[float]) -> dict[str, Any]:
    """F8. Pearson r of log(lambda_O) vs log(lambda_FFN_out), paired across blocks or checkpoints."""
    a, b = np.asarray(lambda_o, dtype=float), np.asarray(lambda_ffn_out, dtype=float)
    ok = (a > 0) & (b > 0) & np.isfinite(a) & np.isfinite(b)
    a, b = np.log(a[ok]), np.log(b[ok])
    r = float(np.corrcoef(a, b)[0, 1]) if a.size >= 3 and a.std() > 0 and b.std() > 0 else None
    return {"n": int(a.size), "pearson_r_loglog": r}


def paired_lambdas_by_block(row: Mapping[str, Any], trim: str = COHORT_TRIM) -> tuple[list[float], list[float]]:
    """(lambda_O, lambda_FFN_out) per block of one fitted row (down_proj serves as FFN_out)."""
    o: dict[int, float] = {}
    out: dict[int, float] = {}
    for m in row.get("matrices", []):
        fit = m["fits"][trim]
        if not fit["ok"] or m["block"] is None or m.get("expert") is not None:
            continue
        if m["kind"] == "o":
            o[m["block"]] = fit["lambda"]
        elif m["kind"] in FFN_OUTPUT_KINDS:
            out[m["block"]] = fit["lambda"]
    blocks = sorted(set(o) & set(out))
    return [o[b] for b in blocks], [out[b] for b in blocks]

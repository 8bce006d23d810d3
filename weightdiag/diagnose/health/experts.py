"""Mixture-of-experts layers in the report: per layer and kind, the median and spread of k and λ over
the routed experts, the experts that stand out from their own layer, and shared experts and routers
kept apart from the routed ones.

A routed expert is a matrix with an `expert` index; a shared expert (Qwen2-MoE `shared_expert`,
DeepSeek-V2/V3 `shared_experts`, Llama-4 `shared_expert`) has none and the layout's note "shared
expert"; a router (`mlp.gate`, `router`, `shared_expert_gate`) has the kind `router` or, in rows
written before that kind, the note "MoE router". The
depth analysis reads a routed kind as the median over the layer's experts (cells.py); this module
reads the experts against each other.

Outlier rule, per (layer, kind) with at least MIN_EXPERTS routed experts, for k (raw) and λ (log):
robust z = (value - median) / max(1.4826 x MAD, floor, one fit's noise), flagged when |z| >= Z_CUT
and the difference is of a practical size (cuts.STATS min_effect, or Z_CUT sigmas of the difference
between one fit and a median of E fits when small matrices are noisier). The median and MAD are
taken over all the layer's experts: with E >= 6 one outlier moves neither by much. Calibrated on
null MoE checkpoints with realistic expert-to-expert variation (scale ±15%, tails from Student-t
with 8-30 degrees of freedom) and planted outlier experts (tests/test_report_moe.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from .cells import fmt, short_name
from .cuts import MAD_SIGMA, STATS, Z_CUT
from .findings import finding

MIN_EXPERTS = 6  # fewer routed experts in a layer: medians and spreads are listed, no expert is singled out
EXPERT_STATS = ("k", "lambda")
_K_NOISE = 1.2  # sigma of one fit's k is 1.2 / sqrt(n) on Gaussian matrices (depth.py's tolerances)
_LOG_LAMBDA_NOISE = 0.6  # sigma of one fit's log λ is 0.6 / sqrt(n)


def is_shared(rec: dict[str, Any]) -> bool:
    return rec.get("expert") is None and "shared expert" in (rec.get("note") or "")


def is_router(rec: dict[str, Any]) -> bool:
    """A router: the `router` kind where the layout has it, else the layout's note (rows written before)."""
    return rec.get("kind") == "router" or "MoE router" in (rec.get("note") or "")


def _value(rec: dict[str, Any], stat: str, trim: str) -> float | None:
    fit = rec["fits"].get(trim) or {}
    value = fit.get(stat) if fit.get("ok") else None
    if value is None or not math.isfinite(value) or (stat == "lambda" and value <= 0):
        return None
    return float(value)


def _t(stat: str, value: float) -> float:
    return math.log(value) if stat == "lambda" else value


def _noise(stat: str, numel: int) -> float:
    return (_K_NOISE if stat == "k" else _LOG_LAMBDA_NOISE) / math.sqrt(max(numel, 1))


def expert_outliers(
    recs: list[dict[str, Any]], stat: str, trim: str
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """(median and spread of `stat` over one layer's experts of one kind, the experts flagged)."""
    pairs = [(r, v) for r in recs if (v := _value(r, stat, trim)) is not None]
    if not pairs:
        return {"median": None, "spread": None, "min": None, "max": None}, []
    t = np.array([_t(stat, v) for _, v in pairs])
    median = float(np.median(t))
    mad_sigma = MAD_SIGMA * float(np.median(np.abs(t - median)))
    # spread: the MAD as a sigma, in k units for k and as a relative factor - 1 for λ (0.05: ±5%)
    summary: dict[str, float | None] = {
        "median": median if stat == "k" else math.exp(median),
        "spread": mad_sigma if stat == "k" else math.expm1(mad_sigma),
        "min": min(v for _, v in pairs),
        "max": max(v for _, v in pairs),
    }
    if len(pairs) < MIN_EXPERTS:
        return summary, []
    spec = STATS[stat]
    flagged = []
    for (rec, value), x in zip(pairs, t, strict=True):
        noise = _noise(stat, rec["numel"])
        scale = max(mad_sigma, spec.floor, noise)
        z = (x - median) / scale
        effect = max(spec.min_effect, Z_CUT * noise * math.sqrt(1 + math.pi / (2 * len(pairs))))
        if abs(z) >= Z_CUT and abs(x - median) >= effect:
            flagged.append(
                {
                    "tensor": rec["name"],
                    "expert": rec.get("expert"),
                    "statistic": stat,
                    "value": value,
                    "median": summary["median"],
                    "z": float(z),
                    "of": len(pairs),
                }
            )
    return summary, flagged


def _single(rec: dict[str, Any], trim: str) -> dict[str, Any]:
    return {
        "tensor": rec["name"],
        "k": _value(rec, "k", trim),
        "lambda": _value(rec, "lambda", trim),
        "max_over_q99": rec["stats"].get("max_over_q99"),
    }


def moe_section(row: Mapping[str, Any], trim: str) -> dict[str, Any] | None:
    """Per MoE layer: routed experts per kind (median, spread, range of k and λ; outliers), the shared
    expert's matrices and the router; None for a dense model."""
    routed: dict[int, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    shared: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    routers: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for m in row["matrices"]:
        b = m["block"]
        if b is None:
            continue
        if is_router(m):
            routers[b].append(m)
        elif m.get("expert") is not None and m["kind"] != "other":
            routed[b][m["kind"]].append(m)
        elif is_shared(m) and m["kind"] != "other":
            shared[b][m["kind"]] = _single(m, trim)
    if not routed:
        return None
    layers, outliers = [], []
    for b in sorted(set(routed) | set(shared) | set(routers)):
        kinds = {}
        for kind, recs in sorted(routed.get(b, {}).items()):
            entry: dict[str, Any] = {"n": len(recs), "outliers": []}
            for stat in EXPERT_STATS:
                summary, flagged = expert_outliers(recs, stat, trim)
                for key, value in summary.items():
                    entry[f"{stat}_{key}"] = value
                for f in flagged:
                    f.update(block=b, kind=kind)
                    entry["outliers"].append(f["expert"])
                outliers += flagged
            entry["outliers"] = sorted(set(entry["outliers"]), key=lambda e: (e is None, e or 0))
            kinds[kind] = entry
        experts = {m.get("expert") for recs in routed.get(b, {}).values() for m in recs}
        layers.append(
            {
                "block": b,
                "experts": len(experts),
                "kinds": kinds,
                "shared": shared.get(b, {}),
                "routers": [_single(r, trim) for r in routers.get(b, [])],
            }
        )
    return {
        "layers": layers,
        "outliers": outliers,
        "rule": {
            "robust_z": Z_CUT,
            "min_experts": MIN_EXPERTS,
            "statistics": {s: {"scale_floor": STATS[s].floor, "min_effect": STATS[s].min_effect} for s in EXPERT_STATS},
        },
    }


_WHAT = {
    ("k", False): "a heavier-tailed body (lower k) than the other experts of its layer",
    ("k", True): "a lighter-tailed body (higher k, closer to the Gaussian init) than the other experts of its layer: "
    "an expert the router rarely trains?",
    ("lambda", True): "larger weights (λ) than the other experts of its layer",
    ("lambda", False): "smaller weights (λ) than the other experts of its layer: an expert the router rarely trains?",
}


def expert_findings(moe: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One finding per outlier expert matrix (both statistics of one matrix in one finding)."""
    if not moe:
        return []
    by_tensor: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for o in moe["outliers"]:
        by_tensor[o["tensor"]].append(o)
    out = []
    for tensor, hits in by_tensor.items():
        hits.sort(key=lambda o: -abs(o["z"]))
        lead = hits[0]
        texts = []
        for o in hits:
            label = "k" if o["statistic"] == "k" else "λ"
            texts.append(
                f"{label} {fmt(o['value'])} vs {fmt(o['median'])}, the median of the layer's {o['of']} experts "
                f"(robust z = {o['z']:+.1f})"
            )
        f = finding(
            "expert-outlier",
            [lead["block"]],
            texts[0],
            _WHAT[(lead["statistic"], lead["z"] > 0)],
            kinds=[lead["kind"]],
            tensors=[tensor],
            what=short_name(tensor),
            statistic=lead["statistic"],
            value=lead["value"],
            expected=lead["median"],
            expected_from=f"median over the {lead['of']} routed experts of this layer and kind",
            deviation=round(lead["z"], 2),
            deviation_type="robust z across experts",
            expert=lead["expert"],
        )
        f["_also"] = texts[1:]
        out.append(f)
    return out


def moe_text(moe: dict[str, Any] | None) -> list[str]:
    """The model-level MoE line: experts per layer, the spread of k across them, outliers, shared experts."""
    if not moe:
        return []
    layers = moe["layers"]
    moe_layers = [x for x in layers if x["experts"]]
    counts = sorted({x["experts"] for x in moe_layers})
    spreads = [e["k_spread"] for x in moe_layers for e in x["kinds"].values() if e["k_spread"] is not None]
    shared = sum(1 for x in layers if x["shared"])
    routers = sum(1 for x in layers if x["routers"])
    n = len(moe["outliers"])
    experts = "/".join(map(str, counts))
    line = (
        f"MoE: {len(moe_layers)} layers of {experts} routed experts"
        + (f", a shared expert in {shared}" if shared else "")
        + (f", routers in {routers}" if routers else "")
        + " (shared experts and routers are read apart from the routed ones)"
    )
    if spreads:
        line += f"; k across a layer's experts spreads by a median ±{np.median(spreads):.3f} (MAD as sigma)"
    if n:
        named = ", ".join(
            f"block {o['block']} expert {o['expert']} {o['kind']} ({'k' if o['statistic'] == 'k' else 'λ'} "
            f"{fmt(o['value'], 3)} vs {fmt(o['median'], 3)})"
            for o in sorted(moe["outliers"], key=lambda o: -abs(o["z"]))[:5]
        )
        line += f"; {n} outlier expert statistic{'s' if n > 1 else ''}: {named}" + (" ..." if n > 5 else "")
    elif any(e["n"] >= MIN_EXPERTS for x in moe_layers for e in x["kinds"].values()):
        line += "; no expert stands out from its layer"
    return [line]

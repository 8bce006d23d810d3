"""Norm weights: the regimes of ‖γ‖ against √d in “Why √d_model Is Your North Star” (hard cuts),
robust outliers against each
site's depth trend, and model-wide regimes."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from .cells import short_name
from .cuts import MODEL_WIDE, NORM_AT_INIT_ABS, NORM_COLLAPSE, NORM_EXPLOSION, NORM_STAT
from .findings import Hit, evidence_of, evidence_text, finding
from .robust import Point, Series, analyse, spot


def norm_regime(l2: float, numel: int, lo: float | None = None, hi: float | None = None) -> str:
    """The regimes of ||gamma||_2 against sqrt(d) in “Why √d_model Is Your North Star”;
    "at init" only when every entry (min and max)
    equals the all-ones init to storage precision: a trained vector with 1% spread has ||gamma|| within
    0.01 of sqrt(d) too, but it moved."""
    root = math.sqrt(numel)
    if lo is not None and hi is not None and abs(lo - 1) <= NORM_AT_INIT_ABS and abs(hi - 1) <= NORM_AT_INIT_ABS:
        return "at init"
    ratio = l2 / root
    if ratio < NORM_COLLAPSE:
        return "collapse"
    if ratio > NORM_EXPLOSION:
        return "explosion"
    return "healthy shrink" if ratio < 1 else "grown (within band)"


def _norm_records(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    n_layers = row["architecture"].get("n_layers")
    out = []
    for v in row["vectors"]:
        if v["kind"] != "norm" or v["param"] != "weight" or v.get("l2") is None or not v["numel"]:
            continue
        site = v.get("site") or "other"
        if v["block"] is not None and n_layers is not None and v["block"] >= n_layers:
            site = "mtp"  # DeepSeek-V3 style: MTP layers are numbered after the main blocks
        out.append(
            {
                "name": v["name"],
                "block": v["block"],
                "site": site,
                "d": v["numel"],
                "l2": v["l2"],
                "sqrt_d": math.sqrt(v["numel"]),
                "ratio": v["l2"] / math.sqrt(v["numel"]),
                "regime": norm_regime(v["l2"], v["numel"], v.get("min"), v.get("max")),
            }
        )
    return out


def _norm_series(in_blocks: list[dict[str, Any]]) -> list[Series]:
    by_site: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(in_blocks, key=lambda r: r["block"]):
        by_site[r["site"]].append(r)
    return [
        analyse(
            Series(
                f"norm:{site}",
                NORM_STAT,
                [Point(r["block"], r["ratio"], r["name"], NORM_STAT.t(max(r["ratio"], 1e-12))) for r in recs],
            )
        )
        for site, recs in by_site.items()
    ]


SINGLED = {"final": "the final norm", "mtp": "an MTP-head norm", "embed": "the embedding norm"}


def _norm_finding(r: dict[str, Any], hit: Hit | None, model_wide: list[str]) -> dict[str, Any]:
    regime, site = r["regime"], r["site"]
    if hit is not None and regime in model_wide:
        category, reason = "norm-outlier", f"far from the other {site} norms at this depth (all in the {regime} regime)"
    elif regime == "collapse":
        after = "the LM head and any MTP head" if site in ("final", "mtp") else "the next sub-layer"
        category, reason = (
            "norm-collapse",
            f"collapse below {NORM_COLLAPSE} √d (“Why √d_model Is Your North Star”): it suppresses {after}",
        )
    elif regime == "explosion":
        category, reason = (
            "norm-explosion",
            f"explosion above {NORM_EXPLOSION} √d (“Why √d_model Is Your North Star”): a few channels dominate",
        )
    elif regime == "at init":
        category, reason = (
            "norm-at-init",
            "still exactly at its all-ones init while the other norms moved: never trained?",
        )
    else:
        category, reason = "norm-outlier", f"{regime}, but far from the other {site} norms at this depth"
    if hit is not None:
        evidence = evidence_of(hit)
        summary = evidence_text(evidence, NORM_STAT.label)
    else:
        evidence = {
            "statistic": "norm",
            "value": r["ratio"],
            "expected": 1.0,
            "expected_from": "“Why √d_model Is Your North Star”: ‖γ‖ = √d at init, healthy within [0.4, 1.8] √d",
            "deviation": round(r["ratio"], 4),
            "deviation_type": "ratio to sqrt(d)",
        }
        summary = f"‖γ‖/√d {r['ratio']:.3f} (‖γ‖ = {r['l2']:.4g}, √d = {r['sqrt_d']:.4g})"
    what = short_name(r["name"]) + (f" ({SINGLED[site]})" if site in SINGLED else "")
    blocks = [] if r["block"] is None else [r["block"]]
    return finding(
        category,
        blocks,
        summary,
        reason,
        kinds=["norm"],
        tensors=[r["name"]],
        what=what,
        site=site,
        regime=regime,
        l2=r["l2"],
        sqrt_d=r["sqrt_d"],
        **evidence,
    )


def analyse_norms(row: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Norm regimes (hard cuts of “Why √d_model Is Your North Star”) and robust outliers against the
    depth trend of each site."""
    records = _norm_records(row)
    in_blocks = [r for r in records if r["block"] is not None and r["site"] != "mtp"]
    counts: dict[str, int] = defaultdict(int)
    for r in in_blocks:
        counts[r["regime"]] += 1
    model_wide = sorted(
        regime
        for regime, n in counts.items()
        if regime in ("collapse", "explosion", "at init") and n >= MODEL_WIDE * len(in_blocks)
    )
    series = _norm_series(in_blocks)
    hits: dict[str, Hit] = {}
    for s in series:
        for band in s.bands:
            for p in band:
                hits[p.tensor] = Hit(s, band, True)
        for p in s.points:
            if p.tensor not in hits and spot(p, NORM_STAT):
                hits[p.tensor] = Hit(s, [p], False)
    findings = []
    for r in records:
        single = r["block"] is None or r["site"] == "mtp"
        hard = r["regime"] in ("collapse", "explosion") and (single or r["regime"] not in model_wide)
        untouched = r["regime"] == "at init" and not single and "at init" not in model_wide
        if r["name"] in hits or hard or untouched:
            findings.append(_norm_finding(r, hits.get(r["name"]), model_wide))
    for regime in model_wide:
        if regime == "at init":
            continue  # reported as an observation: an untrained or synthetic model
        affected = [r for r in in_blocks if r["regime"] == regime]
        ratios = [r["ratio"] for r in affected]
        cut = (
            f"below the collapse cut of “Why √d_model Is Your North Star”, {NORM_COLLAPSE}"
            if regime == "collapse"
            else (f"above the explosion cut of “Why √d_model Is Your North Star”, {NORM_EXPLOSION}")
        )
        findings.append(
            finding(
                f"norm-{regime}-model-wide",
                sorted({r["block"] for r in affected}),
                f"‖γ‖/√d {min(ratios):.3f}-{max(ratios):.3f} (median {np.median(ratios):.3f}), {cut}",
                "model-wide, so a property of the training recipe (e.g. weight decay on norm weights, with the scale "
                "carried by the projections that read them), not one broken layer; outliers against the depth trend "
                "are listed separately",
                severity="notice",
                kinds=["norm"],
                tensors=[r["name"] for r in affected],
                what=f"{len(affected)} of {len(in_blocks)} norm weights",
                statistic="norm",
                value=float(np.median(ratios)),
                expected=1.0,
                expected_from="“Why √d_model Is Your North Star”: healthy within [0.4, 1.8] √d",
                deviation=round(float(np.median(ratios)), 4),
                deviation_type="ratio to sqrt(d)",
            )
        )
    singled = [r for r in records if r["block"] is None or r["site"] == "mtp"]
    summary = {
        "vectors": records,
        "block_regimes": dict(counts),
        "model_wide": model_wide,
        "singled_out": singled,
        "cuts": {"at_init_abs": NORM_AT_INIT_ABS, "collapse": NORM_COLLAPSE, "explosion": NORM_EXPLOSION},
    }
    return summary, findings

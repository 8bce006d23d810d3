"""Place one fitted model against the paper's cohort, and say in plain words what stands out.

Distance between two models (for "nearest neighbour"): over the comparison keys both have, the
root mean square of (delta k / 0.02)^2 + (delta ln lambda / ln 2)^2. One unit is a k difference of
0.02 (the cohort's FFN medians span 0.017) or a factor of 2 in lambda (lambda spans 7x across the
cohort and depends on the init recipe, so it weighs less). Comparison keys merge the two FFN
naming schemes like the paper's Fig. 4: up and ffn_in -> ffn_in, down and ffn_out -> ffn_out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import cache
from statistics import median
from typing import Any, cast

import numpy as np

from ..vocabulary import COHORT_TRIM, FFN_KINDS, SELECTION_KINDS, kind_order
from .classes import (
    BAND,
    INIT_ANCHOR_K,
    K_NOISE_FLOOR,
    NOISE_Z,
    SELECTION_DEEP,
    SELECTION_DEEP_BELOW_K,
    SELECTION_MILD,
    TRANSMISSION,
    TRANSMISSION_MIN_K,
    WITHHELD,
    k_class,
    kind_records,
    kind_withheld,
    median_k_sigma,
    summary_withheld,
)
from .cohort import ATTRIBUTION, GROUP_EXPECTATION, architecture_group, cohort_caveat, load_cohort
from .functions import attention_arch, cross_family_band, ffn_median_k, lambda_scaling, transmission_lambda
from .kinds import at_trim
from .results import CompareReport
from .spectrum import compare_lines, compare_spectra

K_UNIT = 0.02
LOG_LAMBDA_UNIT = math.log(2.0)
COMPARISON_KEY = {
    "q": "q",
    "k": "k",
    "v": "v",
    "o": "o",
    "qkv": "qkv",
    "gate": "gate",
    "up": "ffn_in",
    "ffn_in": "ffn_in",
    "down": "ffn_out",
    "ffn_out": "ffn_out",
}
SELECTION_ORDER = {SELECTION_DEEP: 0, SELECTION_MILD: 1, TRANSMISSION: 2}
# Each class's k interval (the paper's cuts, classes.py): a departure from the predicted class is
# called out only when k lies beyond that interval by more than NOISE_Z standard errors.
CLASS_K_RANGE = {
    SELECTION_DEEP: (-math.inf, SELECTION_DEEP_BELOW_K),
    SELECTION_MILD: (SELECTION_DEEP_BELOW_K, TRANSMISSION_MIN_K),
    TRANSMISSION: (TRANSMISSION_MIN_K, math.inf),
}
SHALLOW_BLOCKS = range(0, 6)  # the Qwen companion's shallow-FFN window (blocks 0-5)
REGIME_A_MIN_K, REGIME_B_MAX_K = 1.0, 0.7


def _keys(row: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    out: dict[str, list[tuple[float, float]]] = {}
    for kind, s in row["kinds"].items():
        key = COMPARISON_KEY.get(kind)
        if key and s.get("k_median") and s.get("lambda_median"):
            out.setdefault(key, []).append((s["k_median"], s["lambda_median"]))
    return {k: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v]))) for k, v in out.items()}


def distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[float | None, list[str]]:
    return _distance(_keys(a), _keys(b))


@cache
def _cohort_keys() -> dict[str, dict[str, tuple[float, float]]]:
    """Each cohort entry's comparison keys, made once per process: `compare` of a database compares every row
    with every entry (2,000 rows: 48,000 makings of the same twelve, half of its time; issue 42)."""
    return {c["model"]["id"]: _keys(c) for c in load_cohort("v9_1")}


def _distance(ka: dict[str, tuple[float, float]], kb: dict[str, tuple[float, float]]) -> tuple[float | None, list[str]]:
    shared = sorted(set(ka) & set(kb))
    if not shared:
        return None, []
    terms = [
        ((ka[k][0] - kb[k][0]) / K_UNIT) ** 2 + (math.log(ka[k][1] / kb[k][1]) / LOG_LAMBDA_UNIT) ** 2 for k in shared
    ]
    return math.sqrt(sum(terms) / len(terms)), shared


def shallow_ffn_regime(row: Mapping[str, Any], trim: str = COHORT_TRIM) -> dict[str, Any] | None:
    """The Qwen companion's test: min block k over gate/up/down in blocks 0-5 (A >= 1.0, B <= 0.7)."""
    ks = [
        m["fits"][trim]["k"]
        for m in row.get("matrices", [])
        if m["kind"] in FFN_KINDS and m["block"] in SHALLOW_BLOCKS and m["fits"][trim]["ok"]
    ]
    gates = [
        m["fits"][trim]["k"]
        for m in row.get("matrices", [])
        if m["kind"] in ("gate", "ffn_in") and m["fits"][trim]["ok"] and m["block"] is not None
    ]
    if not ks:
        return None
    shallow_min = min(ks)
    regime = "A" if shallow_min >= REGIME_A_MIN_K else ("B" if shallow_min <= REGIME_B_MAX_K else "between A and B")
    deep = [
        m["fits"][trim]["k"]
        for m in row.get("matrices", [])
        if m["kind"] in ("gate", "ffn_in") and m["fits"][trim]["ok"] and (m["block"] or 0) >= 10
    ]
    shallow_gate = [
        m["fits"][trim]["k"]
        for m in row.get("matrices", [])
        if m["kind"] in ("gate", "ffn_in") and m["fits"][trim]["ok"] and m["block"] in SHALLOW_BLOCKS
    ]
    present = sorted(
        {m["block"] for m in row.get("matrices", []) if m["kind"] in FFN_KINDS and m["block"] in SHALLOW_BLOCKS}
    )
    return {
        "regime": regime,
        # The blocks the test read: 0-5, or fewer in a smaller model (a 4-block model has 0-3).
        "shallow_blocks": f"{present[0]}-{present[-1]}" if len(present) > 1 else str(present[0]),
        "shallow_min_k": shallow_min,
        "shallow_median_k_gate": float(median(shallow_gate)) if shallow_gate else None,
        "deep_median_k_gate": float(median(deep)) if deep else None,
        "blocks_checked": len(gates),
    }


def _same_entry(entry: str, model_id: str) -> bool:
    """Whether a cohort entry is the model itself (the Qwen companion spells ids in another case)."""
    return entry.lower() == (model_id or "").lower()


def compare(row: Mapping[str, Any], spectrum_peers: Iterable[tuple[str, Mapping[str, Any]]] = ()) -> CompareReport:
    """Everything `weightdiag compare` prints for one row (its summaries at the cohort's mid80 trim);
    `spectrum_peers`: (id, row or row summary) of other rows with spectra, to compare alpha with."""
    row = at_trim(row, COHORT_TRIM)
    cohort = load_cohort("v9_1")
    qwen = load_cohort("qwen")
    me = row["model"]["id"]
    arch = row.get("architecture") or {}
    group = architecture_group(arch)
    out: dict[str, Any] = {
        "model": me,
        "revision": row["model"].get("revision"),
        "protocol": row["protocol"]["name"],
        "attention": attention_arch(arch)["label"] if arch else None,
        "group": group,
        "findings": [],
        "attribution": ATTRIBUTION,
    }
    if row["protocol"]["name"] != "hist1024":
        out["findings"].append(
            f"fitted with the {row['protocol']['name']} protocol; the cohort used hist1024, so k and lambda "
            "compare only approximately (refit with --protocol hist1024)"
        )
    if row["protocol"].get("centered"):
        out["findings"].append(
            "fitted with --center (|w - mean| per matrix); the cohort's fits are of |w|, so k and lambda compare "
            "only approximately (refit without --center)"
        )

    caveat = cohort_caveat(arch) if row["model"].get("source") != "cohort" else None
    out["caveat"] = caveat
    if caveat:
        out["findings"].append(caveat)

    # A cohort entry compared with the cohort is its own nearest at distance 0; name the others instead.
    others = [c for c in cohort if not _same_entry(c["model"]["id"], me)]

    # Per-kind values side by side with the cohort entries that have the same kind.
    kinds: dict[str, Any] = {}
    for kind, s in row["kinds"].items():
        if s.get("k_median") is None:
            continue
        peers = [(c["model"]["id"], c["kinds"][kind]) for c in cohort if kind in c["kinds"]]
        other_peers = [p for p in peers if not _same_entry(p[0], me)]
        nearest = min(other_peers, key=lambda p: abs(p[1]["k_median"] - s["k_median"]))[0] if other_peers else None
        group_ks = [
            c["kinds"][kind]["k_median"]
            for c in cohort
            if kind in c["kinds"] and architecture_group(c["architecture"]) == group
        ]
        records = kind_records(row, kind)
        withheld = summary_withheld(s, records)
        kinds[kind] = {
            "k": s["k_median"],
            "k_se": median_k_sigma(records),
            "lambda": s["lambda_median"],
            "class": WITHHELD if withheld else s.get("k_class"),
            "k_class": WITHHELD if withheld else s.get("k_class"),
            "role": s["class"],
            "class_withheld": withheld,
            "cohort_k_range": [min(p[1]["k_median"] for p in peers), max(p[1]["k_median"] for p in peers)]
            if peers
            else None,
            "group_k_range": [min(group_ks), max(group_ks)] if group_ks else None,
            "nearest_by_k": nearest,
        }
    out["kinds"] = kinds

    # Transmission: the FFN median against the paper's band, beyond sampling noise only.
    band = cross_family_band(cohort)
    out["transmission"] = transmission_verdict(row, band["band"])
    if out["transmission"]["text"]:
        out["findings"].append(out["transmission"]["text"])

    # Selection: Q/K (or fused qkv) severity against what the architecture predicts.
    sel_kinds = [
        k for k in sorted(SELECTION_KINDS, key=kind_order) if k in row["kinds"] and row["kinds"][k].get("k_median")
    ]
    expected, evidence = GROUP_EXPECTATION.get(group, (None, "no cohort group"))
    selection: dict[str, Any] = {"kinds": {}, "expected": expected, "evidence": evidence, "departs": False}
    for kind in sel_kinds:
        verdict = selection_verdict(row, kind, group, expected, evidence)
        selection["kinds"][kind] = verdict
        selection["departs"] = selection["departs"] or verdict["departs"]
        if verdict["text"]:
            out["findings"].append(verdict["text"])
    out["selection"] = selection

    # Nearest neighbours over every kind both have.
    dists = []
    mine, theirs = _keys(row), _cohort_keys()
    for c in others:
        d, shared = _distance(mine, theirs[c["model"]["id"]])
        if d is not None:
            dists.append(
                {
                    "entry": c["model"]["id"],
                    "distance": d,
                    "kinds": shared,
                    "group": architecture_group(c["architecture"]),
                }
            )
    dists.sort(key=lambda x: x["distance"])
    out["nearest"] = dists[:3]
    if dists:
        top = dists[0]
        out["findings"].append(
            f"nearest cohort entry: {top['entry']} (distance {top['distance']:.2f} over {', '.join(top['kinds'])})"
        )

    # Lambda against sqrt(eta / lambda_wd), when the training hyperparameters are known.
    hp = row.get("hyperparameters") or {}
    lam = transmission_lambda(row)
    if hp.get("lr") and hp.get("weight_decay") and lam:
        ratio = lam / math.sqrt(hp["lr"] / hp["weight_decay"])
        scaling = lambda_scaling(cohort)
        ratios = sorted(v["ratio"] for v in scaling["entries"].values())
        out["lambda"] = {
            "transmission_lambda": lam,
            "ratio": ratio,
            "cohort_ratio_range": [ratios[0], ratios[-1]],
            "pythia_slope": lambda_scaling([c for c in cohort if c["model"]["id"].startswith("pythia")])["slope"],
            "state": hp.get("state"),
            "t_over_tau": hp.get("t_over_tau"),
        }
        text = f"lambda / sqrt(eta / lambda_wd) = {ratio:.3f} (cohort {ratios[0]:.3f}-{ratios[-1]:.3f})"
        if hp.get("t_over_tau") is not None:
            text += f"; T/tau = {hp['t_over_tau']:.3g}: {hp.get('state')}"
        out["findings"].append(text)
    else:
        out["lambda"] = {
            "transmission_lambda": lam,
            "state": "unknown",
            "note": "training hyperparameters unknown: pass --lr --weight-decay --train-steps or --preset",
        }

    # The Qwen companion's shallow-FFN regime A/B test.
    regime = shallow_ffn_regime(row)
    if regime:
        peers = [(q["model"]["id"], q["shallow_ffn"]["shallow_min_k"]) for q in qwen]
        peers = [p for p in peers if not _same_entry(p[0], me)] or peers
        nearest = min(peers, key=lambda p: abs(p[1] - regime["shallow_min_k"]))
        regime["nearest_companion"] = {"entry": nearest[0], "shallow_min_k": nearest[1]}
        out["shallow_ffn"] = regime
        if regime["regime"] == "B":
            out["findings"].append(
                f"shallow FFN blocks {regime.get('shallow_blocks', '0-5')} hold a secondary population "
                f"(min k {regime['shallow_min_k']:.3f} <= 0.7): "
                "the Qwen companion's regime B, like " + nearest[0]
            )
        elif regime["regime"] == "A":
            out["findings"].append(
                f"shallow FFN blocks {regime.get('shallow_blocks', '0-5')} are clean "
                f"(min k {regime['shallow_min_k']:.3f} >= 1.0): regime A"
            )
        else:
            out["findings"].append(
                f"shallow FFN min k {regime['shallow_min_k']:.3f} lies between the companion's regimes A and B"
            )
    spectrum = compare_spectra(row, spectrum_peers)  # fit --spectrum rows only
    if spectrum is not None:
        out["spectrum"] = spectrum
        out["findings"] += compare_lines(spectrum)
    return cast(CompareReport, out)


def _ffn_kinds(row: Mapping[str, Any]) -> list[str]:
    return [k for k in FFN_KINDS if k in row["kinds"] and row["kinds"][k].get("k_median")]


def transmission_verdict(row: Mapping[str, Any], data_range: list[float] | None) -> dict[str, Any]:
    """The FFN median k against the paper's band [1.186, 1.204] with its standard error.

    The standard error is the largest of the FFN kinds' (classes.median_k_sigma) combined with the
    floor once more for the band's own ends (they are hist1024 fits too). Outside the band by at most
    NOISE_Z standard errors is "within noise"; beyond it, the text also says whether the value lies
    outside the cohort's data range (the 12 entries' min and max), naming that range as such.
    """
    k = ffn_median_k(row)
    out: dict[str, Any] = {
        "ffn_median_k": k,
        "paper_band": list(BAND),
        "cohort_data_range": data_range,
        "position": None,
        "k_se": None,
        "departs": False,
        "withheld": None,
        "text": None,
    }
    if k is None:
        return out
    kinds = _ffn_kinds(row)
    records = [r for kind in kinds for r in kind_records(row, kind)]
    withheld = kind_withheld(records) or next(
        (row["kinds"][kind]["k_class_withheld"] for kind in kinds if row["kinds"][kind].get("k_class_withheld")), None
    )
    if withheld:
        out["withheld"] = withheld
        out["text"] = f"FFN median k {k:.4f}: not placed against the Transmission band; {withheld}"
        return out
    se = max(median_k_sigma(kind_records(row, kind)) for kind in kinds)
    se = math.sqrt(se**2 + K_NOISE_FLOOR**2)
    lo, hi = BAND
    position = "inside" if lo <= k <= hi else ("below" if k < lo else "above")
    gap = 0.0 if position == "inside" else (lo - k if position == "below" else k - hi)
    out.update(position=position, k_se=se, distance_to_band=gap, departs=gap > NOISE_Z * se)
    head = f"FFN median k {k:.4f} ± {se:.4f}"
    band_text = f"the paper's Transmission band [{lo}, {hi}]"
    if position == "inside":
        out["text"] = f"{head} is inside {band_text}"
    elif not out["departs"]:
        out["text"] = (
            f"{head} is {gap:.4f} {position} {band_text}: within noise ({gap / se:.1f} standard errors, "
            f"below the {NOISE_Z:g} needed to call a departure)"
        )
    else:
        text = f"{head} is {position} {band_text} by {gap:.4f} ({gap / se:.0f} standard errors): " + (
            "heavier-tailed FFN weights than the band"
            if position == "below"
            else "lighter-tailed FFN weights than the band"
        )
        if data_range:
            dlo, dhi = data_range
            outside = k < dlo if position == "below" else k > dhi
            if outside:
                text += f"; outside the cohort's data range [{dlo:.4f}, {dhi:.4f}], so " + (
                    "heavier-tailed than any cohort model"
                    if position == "below"
                    else f"closer to the half-normal init (k0 = {INIT_ANCHOR_K}) than any cohort model"
                )
        out["text"] = text
    return out


def selection_verdict(
    row: Mapping[str, Any], kind: str, group: str, expected: str | None, evidence: str
) -> dict[str, Any]:
    """One Q/K (or qkv) kind's class against its architecture group's prediction, beyond noise only."""
    s = row["kinds"][kind]
    k = s["k_median"]
    records = kind_records(row, kind)
    se = median_k_sigma(records)
    withheld = kind_withheld(records) or s.get("k_class_withheld")
    out: dict[str, Any] = {"k": k, "k_se": se, "class": None, "departs": False, "withheld": withheld, "text": None}
    if withheld:
        out["class"] = WITHHELD
        out["text"] = f"{kind}: k {k:.4f}, class withheld: {withheld}"
        return out
    cls = k_class(k, s.get("r2_median"))
    out["class"] = cls
    if cls == "non-weibull":
        out["text"] = f"{kind}: median R^2 below 0.95, not Weibull; read its heaviness metrics"
        return out
    if not expected or cls not in SELECTION_ORDER:
        return out
    if cls == expected:
        out["text"] = f"{kind}: k {k:.4f} is {cls}, as {group} models are ({evidence})"
        return out
    lo, hi = CLASS_K_RANGE[expected]
    gap = lo - k if k < lo else k - hi
    direction = "more severe" if SELECTION_ORDER[cls] < SELECTION_ORDER[expected] else "milder"
    if gap <= NOISE_Z * se:
        out["text"] = (
            f"{kind}: k {k:.4f} ± {se:.4f} reads {cls}, {gap:.4f} from the {expected} range: within noise "
            f"of what its architecture group ({group}) predicts ({expected}; {evidence})"
        )
        return out
    out["departs"] = True
    out["text"] = (
        f"{kind}: k {k:.4f} ± {se:.4f} is {cls}, {direction} than its architecture group ({group}) "
        f"predicts ({expected}; {evidence}), by {gap:.4f} ({gap / se:.0f} standard errors)"
    )
    return out

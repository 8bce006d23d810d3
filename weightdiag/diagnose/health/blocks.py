"""Per-block summaries: the shallow-FFN regime, the quantization summary, the block table and the
architecture summary."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from ...vocabulary import BLOCK_KEYS, FFN_KEYS
from ..classes import k_class
from ..cohort import architecture_group, load_cohort
from ..compare import REGIME_B_MAX_K, SHALLOW_BLOCKS, shallow_ffn_regime
from ..functions import attention_arch
from .cells import Cell, quantization_of
from .cuts import HALF_NORMAL_Q90_Q10, QUANT_K_SHIFT
from .depth import placement_of


def shallow_ffn(row: Mapping[str, Any], cells: dict[tuple[int, str], Cell], trim: str) -> dict[str, Any] | None:
    regime = shallow_ffn_regime(row, trim)
    if regime is None:
        return None
    qwen = load_cohort("qwen")
    nearest = min(qwen, key=lambda q: abs(q["shallow_ffn"]["shallow_min_k"] - regime["shallow_min_k"]))
    regime["nearest_companion"] = {
        "entry": nearest["model"]["id"],
        "shallow_min_k": nearest["shallow_ffn"]["shallow_min_k"],
    }
    rows = []
    for (b, key), c in sorted(cells.items()):
        if key in FFN_KEYS and b in SHALLOW_BLOCKS:
            k = c.value("k", trim)
            rows.append(
                {
                    "block": b,
                    "kind": key,
                    "tensor": c.tensor,
                    "k": k,
                    "r2": c.value("r2", trim),
                    "q90_q10": (c.records[0].get("heaviness") or {}).get("q90_q10"),
                    "second_population": k is not None and k <= REGIME_B_MAX_K,
                    "quantized": bool(c.quant),
                }
            )
    regime["matrices"] = rows
    regime["cuts"] = {
        "regime_a_min_k": 1.0,
        "regime_b_max_k": REGIME_B_MAX_K,
        "half_normal_q90_q10": HALF_NORMAL_Q90_Q10,
    }
    return regime


def quantization_summary(row: Mapping[str, Any]) -> dict[str, Any]:
    types: dict[str, int] = defaultdict(int)
    kinds: dict[str, set[str]] = defaultdict(set)
    withheld: dict[str, bool] = {}
    for m in row["matrices"]:
        q = quantization_of(m)
        label = (m.get("dequantized") or {}).get("label") or (q["type"] if q else None)
        if label:
            types[label] += 1
            kinds[label].add(m["kind"])
            withheld[label] = withheld.get(label, False) or q is not None
    out: dict[str, Any] = {
        "quantized": bool(types),
        "types": dict(types),
        "kinds": {t: sorted(k) for t, k in kinds.items()},
        "k_shift_measured": {t: QUANT_K_SHIFT[t] for t in types if t in QUANT_K_SHIFT},
        "notes": [n for n in row.get("notes", []) if "GGUF" in n or "quant" in n.lower()],
    }
    if types:
        parts = []
        for t, n in sorted(types.items(), key=lambda x: -x[1]):
            shift = QUANT_K_SHIFT.get(t)
            parts.append(
                f"{n} {t} ({', '.join(sorted(kinds[t]))})"
                + (f": k reads +{shift[0]:.2f} to +{shift[1]:.2f} high on synthetic matrices" if shift else "")
            )
        kept = [t for t in types if not withheld[t]]
        classes = (
            "k classes (Selection/Transmission) are withheld for quantized matrices"
            if not kept
            else f"k classes are kept for {', '.join(sorted(kept))} (it moves k less than the fit's noise on real "
            "weights) and withheld for the rest"
            if len(kept) < len(types)
            else f"k classes are kept: {', '.join(sorted(kept))} moves k less than the fit's noise on real weights"
        )
        out["text"] = (
            "quantized weights: " + "; ".join(parts) + ". Fits are of the dequantized values, so k and λ describe "
            "the quantized model; " + classes
        )
    return out


def block_table(
    row: Mapping[str, Any], cells: dict[tuple[int, str], Cell], norm_recs: list[dict[str, Any]], trim: str
) -> list[dict[str, Any]]:
    params: dict[int, int] = defaultdict(int)
    for m in row["matrices"]:
        if m["block"] is not None:
            params[m["block"]] += m["numel"]
    biases: dict[int, set[str]] = defaultdict(set)
    qk_norm: dict[int, bool] = defaultdict(bool)
    for v in row["vectors"]:
        if v["block"] is None:
            continue
        params[v["block"]] += v["numel"]
        if v["kind"] == "bias" and v.get("of_kind"):
            biases[v["block"]].add(v["of_kind"])
        if v["kind"] == "norm" and v.get("site") in ("q_norm", "k_norm"):
            qk_norm[v["block"]] = True
    n_layers = row["architecture"].get("n_layers")
    out = []
    for b in sorted(params):
        kinds = {}
        for key in BLOCK_KEYS:
            c = cells.get((b, key))
            if c is None:
                continue
            k, r2 = c.value("k", trim), c.value("r2", trim)
            kinds[key] = {
                "tensor": c.tensor,
                "std": c.value("std", trim),
                "k": k,
                "lambda": c.value("lambda", trim),
                "r2": r2,
                "max_over_q99": c.value("max_over_q99", trim),
                "kurtosis": c.value("kurtosis", trim),
                "class": ("withheld (quantized)" if c.quant else k_class(k, r2)) if k is not None else None,
                "quant": c.quant["type"] if c.quant else None,
            }
        experts = max((c.experts for (cb, _), c in cells.items() if cb == b), default=0)
        out.append(
            {
                "block": b,
                "mtp": n_layers is not None and b >= n_layers,
                "experts": experts,  # routed experts per kind in this block (0: dense); their k and λ are medians
                "params": params[b],
                "qk_norm": qk_norm[b],
                "biases": [k for k in (*BLOCK_KEYS, "other") if k in biases[b]],
                "kinds": kinds,
                "norms": {r["site"]: r["ratio"] for r in norm_recs if r["block"] == b},
            }
        )
    return out


def architecture_summary(row: Mapping[str, Any], blocks: list[dict[str, Any]]) -> dict[str, Any]:
    arch = row["architecture"]
    att = attention_arch(arch)
    placement, evidence = placement_of(row)
    bias_sets = {tuple(b["biases"]) for b in blocks if not b["mtp"]}
    return {
        "family": arch.get("family"),
        "n_layers": arch.get("n_layers"),
        "d_model": arch.get("d_model"),
        "attention": att["label"],
        "heads": att["heads"],
        "n_heads": att["n_q"],
        "n_kv_heads": att["n_kv"],
        "group": architecture_group(arch),
        "norm_type": arch.get("norm_type"),
        "norm_placement": placement,
        "placement_evidence": evidence,
        "qk_norm": bool(arch.get("qk_norm")),
        "biases": sorted(bias_sets)[0] if len(bias_sets) == 1 else "varies by block",
        "tied_embeddings": arch.get("tied_embeddings"),
        "ffn_type": arch.get("ffn_type"),
        "mtp_blocks": [b["block"] for b in blocks if b["mtp"]],
    }

"""Super weights against the paper's Table 2: the largest |w|, per-block max/q99 and kurtosis pooled
over a block's matrices, outlier hidden channels, FFN outlier neurons, and their summary lines."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...vocabulary import FFN_INPUT_KINDS, FFN_OUTPUT_KINDS, MATRIX_KINDS, RESIDUAL_WRITERS
from ..classes import INIT_ANCHOR_K
from .cells import fmt, short_name
from .cuts import TABLE2
from .poisson import log_poisson_sf


def pooled_q99(members: list[tuple[int, float, float]]) -> float:
    """q99 of |w| pooled over a block's matrices, from each one's exact q99 and fitted shape k.

    Each matrix's tail is modelled as P(|w| > t) = exp(-ln(100) (t / q99)^k), a Weibull tail matched
    at its own q99: exact when the matrices share one distribution, an approximation otherwise.
    """
    n = np.array([m[0] for m in members], dtype=float)
    q = np.array([m[1] for m in members])
    k = np.array([m[2] for m in members])
    lo, hi = math.log(q.min()), math.log(q.max())
    for _ in range(60):  # bisection on log t; the pooled q99 lies between the smallest and largest q99
        mid = (lo + hi) / 2
        tail = float(np.sum(n * np.exp(-math.log(100) * (math.exp(mid) / q) ** k)))
        lo, hi = (mid, hi) if tail > 0.01 * n.sum() else (lo, mid)
    return math.exp((lo + hi) / 2)


def pooled_kurtosis(members: list[tuple[int, float, float, float]]) -> float:
    """Excess kurtosis of a block's values pooled from each matrix's (n, mean, std, excess kurtosis);
    third moments are taken as 0 (weights are near-symmetric), which only matters when means are large."""
    n = np.array([m[0] for m in members], dtype=float)
    mu = np.array([m[1] for m in members])
    var = np.array([m[2] for m in members]) ** 2
    m4 = (np.array([m[3] for m in members]) + 3) * var**2
    ex2 = var + mu**2
    ex3 = 3 * mu * var + mu**3
    ex4 = m4 + 6 * mu**2 * var + mu**4
    w = n / n.sum()
    mean = float(w @ mu)
    v = float(w @ ex2) - mean**2
    c4 = float(w @ ex4) - 4 * mean * float(w @ ex3) + 6 * mean**2 * float(w @ ex2) - 3 * mean**4
    return c4 / v**2 - 3 if v > 0 else math.nan


def _table2_place(value: float, column: int) -> dict[str, Any]:
    values = {family: row[column] for family, row in TABLE2.items()}
    lo, hi = min(values.values()), max(values.values())
    nearest = min(values, key=lambda f: abs(math.log(max(value, 1e-9) / values[f])))
    position = "inside" if lo <= value <= hi else ("below" if value < lo else "above")
    return {
        "value": value,
        "range": [lo, hi],
        "position": position,
        "nearest": nearest,
        "nearest_value": values[nearest],
    }


def super_weights(row: Mapping[str, Any], trim: str, top: int) -> dict[str, Any]:
    # The N largest |w| of the model, one per matrix (a row keeps each matrix's largest only).
    ranked = sorted(
        (m for m in row["matrices"] if m["stats"].get("max_abs") is not None and m["stats"].get("max_over_q99")),
        key=lambda m: m["stats"]["max_abs"],
        reverse=True,
    )
    top_list = [
        {
            "tensor": m["name"],
            "block": m["block"],
            "kind": m["kind"],
            "index": m.get("argmax"),
            "abs_value": m["stats"]["max_abs"],
            "max_over_q99": m["stats"]["max_over_q99"],
            "over_std": m["stats"]["max_abs"] / m["stats"]["std"] if m["stats"].get("std") else None,
            "q99": m["stats"]["q99_abs"],
            "kurtosis": m["stats"].get("excess_kurtosis"),
        }
        for m in ranked[:top]
    ]
    blocks: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for m in row["matrices"]:
        if m["block"] is not None and (m["stats"].get("q99_abs") or 0) > 0 and m["stats"].get("std"):
            blocks[m["block"]].append(m)
    per_block = []
    for b, ms in sorted(blocks.items()):
        holder = max(ms, key=lambda m: m["stats"]["max_abs"])
        q99 = pooled_q99(
            [(m["stats"]["n_finite"], m["stats"]["q99_abs"], (m["fits"][trim].get("k") or INIT_ANCHOR_K)) for m in ms]
        )
        kurt = pooled_kurtosis(
            [(m["stats"]["n_finite"], m["stats"]["mean"], m["stats"]["std"], m["stats"]["excess_kurtosis"]) for m in ms]
        )
        per_block.append(
            {
                "block": b,
                "max_abs": holder["stats"]["max_abs"],
                "q99": q99,
                "max_over_q99": holder["stats"]["max_abs"] / q99,
                "kurtosis": kurt,
                "tensor": holder["name"],
                "index": holder.get("argmax"),
            }
        )
    out: dict[str, Any] = {
        "top": top_list,
        "blocks": per_block,
        "table2": None,
        "channels": _channels(top_list, row),
        "ffn_neurons": _ffn_neurons(row),
    }
    if per_block:
        ratios = [b["max_over_q99"] for b in per_block]
        kurts = [b["kurtosis"] for b in per_block if math.isfinite(b["kurtosis"])]
        extreme = max(per_block, key=lambda b: b["max_over_q99"])
        out["median_max_over_q99"] = float(np.median(ratios))
        out["extreme"] = extreme
        out["table2"] = {
            "median_max_over_q99": _table2_place(float(np.median(ratios)), 1),
            "extreme_max_over_q99": _table2_place(extreme["max_over_q99"], 2),
            "extreme_kurtosis": _table2_place(max(kurts), 3) if kurts else None,
            "families": {
                f: {"blocks": r[0], "median": r[1], "extreme": r[2], "kurtosis": r[3]} for f, r in TABLE2.items()
            },
        }
    return out


_LOG_CHANCE = math.log(0.01)  # d_model x P(hits) below 1%: over all dimensions, chance explains it 1 time in 100
_READS_HIDDEN = frozenset(MATRIX_KINDS) - RESIDUAL_WRITERS  # q/k/v, FFN inputs, embeddings, other


def hidden_index(m: dict[str, Any], d_model: int | None) -> int | None:
    """The residual-stream dimension a matrix's largest |w| reads from or writes to: the column of
    input-side matrices (q/k/v, gate/up, embeddings), the row of output-side ones (o, down)."""
    arg, shape = m.get("argmax"), m["shape"]
    if not arg or len(arg) != 2 or not d_model:
        return None
    rows_first = m["kind"] not in _READS_HIDDEN
    if "Conv1D" in (m.get("note") or ""):
        rows_first = not rows_first  # GPT-2 stores (in, out)
    axis = 0 if rows_first else 1
    return arg[axis] if shape[axis] == d_model else None


def _channels(top: list[dict[str, Any]], row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Hidden dimensions that hold the largest |w| of more matrices than chance allows.

    Checked over the top-N matrices and over all matrices; an index is reported when it is hit at
    least 3 times and d_model x P(Poisson(n / d_model) >= hits) < 0.01 (argmax positions uniform).
    The tail is taken in log space (poisson.py): hundreds of hits, the strongest signal, underflow it.
    """
    d_model = row["architecture"].get("d_model")
    if not d_model:
        return []
    found: dict[int, dict[str, Any]] = {}
    for names, scope in (([t["tensor"] for t in top], "top"), ([m["name"] for m in row["matrices"]], "all")):
        by_name = {m["name"]: m for m in row["matrices"]}
        hits: dict[int, list[str]] = defaultdict(list)
        for name in names:
            h = hidden_index(by_name[name], d_model)
            if h is not None:
                hits[h].append(name)
        rate = len(names) / d_model
        for h, members in hits.items():
            c = len(members)
            log_tail = log_poisson_sf(c, rate)
            # Both scopes may flag one dimension: the stronger evidence is kept (10 of the top 10 at 1e-15,
            # or 320 of all 450 at 1e-500), which is the top-N one unless the whole model says more.
            stronger = h not in found or log_tail / math.log(10) < found[h]["log10_chance"]
            if c >= 3 and math.log(d_model) + log_tail < _LOG_CHANCE and stronger:
                found[h] = {
                    "hidden_index": h,
                    "count": c,
                    "of": len(names),
                    "scope": scope,
                    "tensors": members,
                    # log10 P(one given dimension is hit this often by chance): finite where the probability
                    # itself underflows (-82,110 in ln for 10,000 hits at rate 1).
                    "log10_chance": log_tail / math.log(10),
                }
    return sorted(found.values(), key=lambda x: -x["count"] / x["of"])


def _ffn_neurons(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Blocks whose FFN input and output matrices have their largest |w| on the same intermediate
    neuron: one neuron that reads the hidden state and writes an outlier back (chance: 1 in ffn_size)."""
    found: dict[int, dict[str, Any]] = defaultdict(dict)
    for m in row["matrices"]:
        arg = m.get("argmax")
        if m["block"] is None or m.get("expert") is not None or not arg or len(arg) != 2:
            continue
        swap = "Conv1D" in (m.get("note") or "")  # GPT-2 stores (in, out)
        if m["kind"] in FFN_INPUT_KINDS:
            found[m["block"]][m["kind"]] = (arg[1] if swap else arg[0], m["name"])
        elif m["kind"] in FFN_OUTPUT_KINDS:
            found[m["block"]]["out"] = (arg[0] if swap else arg[1], arg[1] if swap else arg[0], m["name"])
    out = []
    for block, d in sorted(found.items()):
        if "out" not in d:
            continue
        neuron, hidden, name = d["out"]
        inputs = [d[k][1] for k in FFN_INPUT_KINDS if k in d and d[k][0] == neuron]
        if inputs:
            out.append({"block": block, "neuron": neuron, "hidden_index": hidden, "tensors": [*inputs, name]})
    return out


def super_weight_text(sw: dict[str, Any], n_layers: int | None) -> list[str]:
    t2 = sw.get("table2")
    if not t2:
        return []
    med, ext, kurt = t2["median_max_over_q99"], t2["extreme_max_over_q99"], t2["extreme_kurtosis"]
    e = sw["extreme"]
    where = f"{short_name(e['tensor'])}" + (f" at ({', '.join(map(str, e['index']))})" if e["index"] else "")
    words = {"below": "below every family", "above": "above every family", "inside": "inside the families' range"}
    # Table 2's figures are per block: max |w| over the q99 and the kurtosis of all the block's weights
    # pooled, so they are smaller than the same ratio of the one matrix that holds the maximum (the
    # super-weight table's per-matrix columns). The text says "pooled" to keep the two apart.
    text = (
        f"super weights vs the paper's Table 2 (per block, the block's matrices pooled): max/q99 median "
        f"≈{fmt(med['value'], 2)}, {words[med['position']]} "
        f"({med['range'][0]}-{med['range'][1]}; nearest {med['nearest']} {med['nearest_value']}); largest "
        f"≈{fmt(ext['value'], 2)} in block {e['block']} (its max |w| is in {where}), {words[ext['position']]} "
        f"({ext['range'][0]}-{ext['range'][1]})"
    )
    if kurt:
        text += (
            f"; pooled kurtosis at most {kurt['value']:.1f}, {words[kurt['position']]} "
            f"({kurt['range'][0]}-{kurt['range'][1]})"
        )
    if med["position"] == "below":
        text += ". Most blocks have no detached outlier (like an early checkpoint: Fig. 3, step 1)"
    lines = [text]
    channels = sw.get("channels", [])
    if channels:
        first = channels[0]
        names = ", ".join(short_name(t) + _block_of(t) for t in first["tensors"][:6])
        names += f", +{len(first['tensors']) - 6} more" if len(first["tensors"]) > 6 else ""
        others = "; ".join(f"{c['hidden_index']} ({c['count']} of {c['of']})" for c in channels[1:6])
        lines.append(
            f"outlier channels: hidden dimension {first['hidden_index']} holds the largest |w| of {first['count']} of "
            f"{'the top ' if first['scope'] == 'top' else 'all '}{first['of']} matrices ({names})"
            + (f"; also dimensions {others}" if others else "")
            + f": far more than chance (P ≈ 10^{first['log10_chance']:.0f} for one dimension), the weight-side trace "
            "of massive-activation dimensions (“Massive Activations in Large Language Models”, Sun et al. 2024)"
        )
    neurons = sw.get("ffn_neurons", [])
    if neurons:
        shown = "; ".join(f"block {n['block']}: neuron {n['neuron']} -> hidden {n['hidden_index']}" for n in neurons)
        lines.append(
            f"FFN outlier neurons ({shown}): the FFN input and output matrices have their largest |w| on the same "
            "intermediate neuron (chance: 1 in the FFN width per block), so one neuron builds the outlier"
        )
    top = sw["top"][0] if sw["top"] else None
    ffn_output = top and top["kind"] in FFN_OUTPUT_KINDS and top["block"] is not None
    if top and ffn_output and n_layers and top["block"] < max(1, n_layers // 4):
        lines.append(
            f"the most extreme weight sits in the down-projection of early block {top['block']}: where Yu et al. "
            "(2024) find super weights in LLaMA, Mistral, OLMo and Phi-3"
        )
    return lines


def _block_of(name: str) -> str:
    match = re.search(r"(?:layers|layer|h|blocks|block|blk)\.(\d+)\.", name)
    return f" (block {match.group(1)})" if match else ""

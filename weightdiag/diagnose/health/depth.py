"""The depth profile (Curse of Depth): per-kind series over blocks, indistinguishable stretches of
adjacent blocks, init-like blocks, Selection placement (Fig. 6) and the norm-placement reading."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from ...vocabulary import BLOCK_KEYS, SELECTION_KEYS
from ..classes import INIT_ANCHOR_K, SELECTION_DEEP, k_class
from ..cohort import GROUP_EXPECTATION, architecture_group
from .cells import Cell
from .cuts import INIT_K_TOL, INIT_KURTOSIS, INIT_MAX_Q99


def _tolerances(a: Cell, b: Cell, trim: str) -> dict[str, float]:
    """How far two blocks' statistics may differ and still be one distribution (about 4 sigma of the
    difference; per-fit noise measured on Gaussian matrices: k 1.2/sqrt(n) plus the hist1024 grid,
    lambda 0.6/sqrt(n), std 0.71 sqrt(1 + kurtosis/2)/sqrt(n) relative)."""
    n = min(a.records[0]["numel"], b.records[0]["numel"])
    kurt = max(a.value("kurtosis", trim) or 0.0, b.value("kurtosis", trim) or 0.0, 0.0)
    root = math.sqrt(2 * n)
    return {
        "k": 4 * 1.2 * math.sqrt(2) / math.sqrt(n) + 0.004,
        "lambda": 4 * 0.6 * 2 / root + 0.002,
        "std": 4 * 0.71 * 2 * math.sqrt(1 + kurt / 2) / root + 0.002,
    }


def _adjacent_change(
    cells: dict[tuple[int, str], Cell], norms: dict[tuple[int, str], float], blocks: list[int], trim: str
) -> dict[int, float]:
    """Per block b: the largest difference to block b-1 over kinds and statistics, in units of the
    tolerance (<= 1: statistically indistinguishable from the previous block)."""
    out = {}
    for prev, b in pairwise(blocks):
        if b != prev + 1:
            continue
        worst = 0.0
        for key in BLOCK_KEYS:
            ca, cb = cells.get((prev, key)), cells.get((b, key))
            if not ca or not cb:
                continue
            tol = _tolerances(ca, cb, trim)
            for stat in ("k", "lambda", "std"):
                va, vb = ca.value(stat, trim), cb.value(stat, trim)
                if (va is None) != (vb is None):
                    worst = math.inf  # one of the two has no statistic (e.g. all NaN): not alike
                    continue
                if va is None or vb is None or (stat != "k" and (va <= 0 or vb <= 0)):
                    continue
                diff = abs(vb - va) if stat == "k" else abs(math.log(vb / va))
                worst = max(worst, diff / tol[stat])
        for (nb, site), ratio in norms.items():
            if nb == b and (prev, site) in norms and ratio > 0 and norms[(prev, site)] > 0:
                worst = max(worst, abs(math.log(ratio / norms[(prev, site)])) / 0.01)
        out[b] = worst
    return out


def _runs(blocks: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for b in sorted(blocks):
        if runs and b == runs[-1][-1] + 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def init_k_tolerance(numel: int) -> float:
    """How far k of an untouched Gaussian matrix may sit from the anchor: INIT_K_TOL, or 4 sigma of one
    fit (1.2/sqrt(n)) on small matrices (a 64x64 Q has sigma 0.019)."""
    return max(INIT_K_TOL, 4 * 1.2 / math.sqrt(max(numel, 1)))


def matrices_init_like(block: int, cells: dict[tuple[int, str], Cell], trim: str) -> bool:
    """Every (unquantized) matrix of the block near the half-normal anchor, without outliers."""
    mine = [c for (b, _), c in cells.items() if b == block and not c.quant]
    if not mine:
        return False
    for c in mine:
        k, mq, kurt = c.value("k", trim), c.value("max_over_q99", trim), c.value("kurtosis", trim)
        if (
            k is None
            or abs(k - INIT_ANCHOR_K) > init_k_tolerance(c.records[0]["numel"])
            or (mq or 0) > INIT_MAX_Q99
            or abs(kurt or 0) > INIT_KURTOSIS
        ):
            return False
    return True


def _init_like(block: int, cells: dict[tuple[int, str], Cell], norm_recs: list[dict[str, Any]], trim: str) -> bool:
    return matrices_init_like(block, cells, trim) and all(
        r["regime"] == "at init" for r in norm_recs if r["block"] == block
    )


def stagnant_blocks(init_like: list[int], cells: dict[tuple[int, str], Cell], n_layers: int, trim: str) -> list[int]:
    """Deep-layer stagnation: init-like blocks in the deep half, and only where most shallow blocks'
    matrices moved away from init; a shallow block, or a model whose blocks all look alike, is never it."""
    blocks = sorted({b for b, _ in cells})
    shallow = [b for b in blocks if b < n_layers / 2]
    moved = [b for b in shallow if not matrices_init_like(b, cells, trim)]
    if not shallow or len(moved) < len(shallow) / 2:
        return []
    return [b for b in init_like if b >= n_layers / 2]


def placement_of(row: Mapping[str, Any]) -> tuple[str | None, str]:
    arch = row["architecture"]
    placement = arch.get("norm_placement")
    sites = sorted({v.get("site") for v in row["vectors"] if v["kind"] == "norm" and v.get("site")})
    evidence = f"family {arch.get('family') or 'unknown'}" + (f"; norm sites {', '.join(sites)}" if sites else "")
    return placement, evidence


PLACEMENT_NAME = {"pre": "Pre-LN", "post": "Post-LN", "peri": "Peri-LN"}
_READING = {
    "pre": (
        "Pre-LN: the Curse of Depth applies (“The Curse of Depth in Large Language Models”, Sun et al. 2025: "
        "Pre-LN output variance grows with depth, so deep blocks drift "
        "toward identity maps and can often be pruned with little loss); weights alone cannot measure that, but deep "
        "blocks that are indistinguishable from each other or still look like their init are consistent with it"
    ),
    "post": (
        "Post-LN: the Curse of Depth is a Pre-LN effect; in Post-LN models (e.g. BERT) deep layers stay distinct and "
        "matter more, while early layers are the most similar (“The Curse of Depth in LLMs”, Fig. 2a, 3a), "
        "so similar deep stretches here "
        "are not read as the Pre-LN mechanism"
    ),
    "peri": (
        "Peri-LN / sandwich norms: sub-layer outputs are normalised as well, which bounds the variance growth the "
        "Curse of Depth attributes to Pre-LN; read similar deep stretches with that in mind"
    ),
}


def depth_profile(
    row: Mapping[str, Any],
    cells: dict[tuple[int, str], Cell],
    norm_recs: list[dict[str, Any]],
    trim: str,
) -> dict[str, Any]:
    blocks = sorted({b for b, _ in cells})
    n_layers = row["architecture"].get("n_layers") or (blocks[-1] + 1 if blocks else 0)
    keys = [k for k in BLOCK_KEYS if any((b, k) in cells for b in blocks)]
    series: dict[str, dict[str, list[Any]]] = {
        key: {
            "blocks": [b for b in blocks if (b, key) in cells],
            **{
                stat: [cells[(b, key)].value(stat, trim) for b in blocks if (b, key) in cells]
                for stat in ("k", "lambda", "std", "max_over_q99", "kurtosis", "r2")
            },
        }
        for key in keys
    }
    norm_series: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"blocks": [], "ratio": []})
    norms_at = {}
    for r in sorted((r for r in norm_recs if r["block"] is not None and r["site"] != "mtp"), key=lambda r: r["block"]):
        norm_series[r["site"]]["blocks"].append(r["block"])
        norm_series[r["site"]]["ratio"].append(r["ratio"])
        norms_at[(r["block"], r["site"])] = r["ratio"]
    # Selection placement (Fig. 6): where the Q/K blocks of each class sit; withheld for quantized fits.
    selection: dict[str, Any] = {}
    for key in (k for k in keys if k in SELECTION_KEYS):
        classes = {}
        for b in series[key]["blocks"]:
            c = cells[(b, key)]
            classes[b] = "withheld (quantized)" if c.quant else k_class(c.value("k", trim), c.value("r2", trim))
        deep = [b for b, c in classes.items() if c == SELECTION_DEEP]
        ks = dict(zip(series[key]["blocks"], series[key]["k"], strict=True))
        lowest = sorted((b for b in ks if ks[b] is not None), key=lambda b: ks[b])[:3]
        selection[key] = {
            "classes": {str(b): c for b, c in classes.items()},
            "deep_blocks": deep,
            "deep_runs": [[r[0], r[-1]] for r in _runs(deep)],
            "lowest_k_blocks": lowest,
            "withheld": sum(1 for c in classes.values() if c and c.startswith("withheld")),
        }
    change = _adjacent_change(cells, norms_at, blocks, trim)
    similar = [b for b, v in change.items() if v <= 1.0]
    stretches: list[dict[str, Any]] = []
    for run in _runs(similar):
        members = [run[0] - 1, *run]  # a pair (b-1, b) makes both blocks part of the stretch
        if len(members) >= 3:
            stretches.append({"blocks": [members[0], members[-1]], "deep": members[0] >= n_layers / 2})
    init_like = [b for b in blocks if _init_like(b, cells, norm_recs, trim)]
    stagnant = stagnant_blocks(init_like, cells, n_layers, trim)
    placement, evidence = placement_of(row)
    reading = _READING.get(placement or "", "normalisation placement unknown: the depth reading is not qualified")
    if stretches:
        shown = ", ".join(f"{s['blocks'][0]}-{s['blocks'][1]}" + (" (deep)" if s["deep"] else "") for s in stretches)
        stretch_text = f"blocks whose weight statistics are indistinguishable from their neighbours': {shown}"
    else:
        stretch_text = "no 3 consecutive blocks have indistinguishable weight statistics"
    return {
        "placement": placement,
        "placement_evidence": evidence,
        "reading": reading,
        "n_layers": n_layers,
        "series": series,
        "norm_series": dict(norm_series),
        "selection": selection,
        # None: not comparable (one of the two blocks lacks a statistic the other has, e.g. an all-NaN matrix).
        "adjacent_change": {str(b): (v if math.isfinite(v) else None) for b, v in change.items()},
        "similar_stretches": stretches,
        "stretch_text": stretch_text,
        "init_like_blocks": init_like,
        "stagnant_blocks": stagnant,
    }


def selection_text(depth: dict[str, Any], arch: dict[str, Any]) -> list[str]:
    lines = []
    n = depth["n_layers"] or 1
    group = architecture_group(arch)
    expected = GROUP_EXPECTATION.get(group)
    for key, s in depth["selection"].items():
        if s["withheld"]:
            lines.append(
                f"{key}: Selection class withheld for {s['withheld']} quantized blocks (quantization reshapes |w|); "
                f"lowest k in blocks {', '.join(map(str, s['lowest_k_blocks']))}"
            )
        elif s["deep_runs"]:
            runs = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in s["deep_runs"])
            where = ", ".join(f"{a / n:.0%}-{(b + 1) / n:.0%}" for a, b in s["deep_runs"])
            lines.append(
                f"{key}: deep Selection (k < 1.045) in blocks {runs} ({where} of depth; OLMo-1-7B: blocks 8-17 and "
                f"23-27 of 32, the paper's Fig. 6)"
                + (f"; {group} models are expected {expected[0]} ({expected[1]})" if expected else "")
            )
        else:
            lines.append(
                f"{key}: no deep-Selection block; lowest k in blocks {', '.join(map(str, s['lowest_k_blocks']))}"
            )
    return lines

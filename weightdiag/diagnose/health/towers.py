"""Vision and audio towers (Gemma-3, Qwen2.5-VL, Llama-4, Mistral-Small): their own section of the report.

A tower's layers are numbered from 0 like the language model's, so a report that reads `block` alone
merges tower layer N into text block N, lists the tower's extra layers as MTP blocks, and ranks the
tower's weights among the super-weight candidates. The report therefore splits a row in two first:
the language model (every other section) and the towers (this one), each tower summarised per layer.

Which records are a tower's: `tower_of` reads the record's `tower` field when the row has one, else
the layout's note "<tower> (not the language model)", else the layout's tower pattern on the name
(weightdiag.layout._TOWER, read only), so rows written before and after the field existed agree.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...layout import _TOWER
from .cells import short_name
from .nonfinite import nonfinite_findings

_NOTE = re.compile(r"(?:^|; )(\S+) \(not the language model\)")


def tower_of(record: dict[str, Any]) -> str | None:
    """The tower (vision_tower, visual, audio_tower, multi_modal_projector, ...) a matrix or vector
    belongs to, or None for the language model's own tensors."""
    if "tower" in record:  # rows with the field: it is the layout's verdict, None included
        value = record["tower"]
        return str(value) if value else None
    note = _NOTE.search(record.get("note") or "")
    if note:
        return note.group(1)
    match = _TOWER.search(record.get("name") or "")
    return match.group(1) if match else None


def split_towers(row: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, dict[str, list[dict[str, Any]]]]]:
    """(the row with the language model's matrices and vectors only, {tower: {"matrices", "vectors"}})."""
    towers: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: {"matrices": [], "vectors": []})
    kept: dict[str, list[dict[str, Any]]] = {"matrices": [], "vectors": []}
    for field in ("matrices", "vectors"):
        for rec in row.get(field, []):
            tower = tower_of(rec)
            (towers[tower][field] if tower else kept[field]).append(rec)
    if not towers:
        return row, {}
    return {**row, **kept}, dict(towers)


def _fit(rec: dict[str, Any], trim: str, stat: str) -> float | None:
    fit = rec["fits"].get(trim) or {}
    value = fit.get(stat) if fit.get("ok") else None
    return float(value) if value is not None and np.isfinite(value) else None


def _role(rec: dict[str, Any]) -> str:
    """What a tower matrix does: its `tower_kind` or kind when the layout gave one, else its short name."""
    if rec.get("tower_kind"):
        return str(rec["tower_kind"])
    if rec["kind"] not in ("other", None):
        return rec["kind"]
    return re.sub(r"(?:^|.*\.)(?:layers|layer|blocks|block|h)\.\d+\.", "", short_name(rec["name"]))


def _layer(block: int | None, recs: list[dict[str, Any]], vectors: list[dict[str, Any]], trim: str) -> dict[str, Any]:
    ks = [(k, r) for r in recs if (k := _fit(r, trim, "k")) is not None]
    lams = [v for r in recs if (v := _fit(r, trim, "lambda")) is not None]
    ratios = [(r["stats"].get("max_over_q99"), r) for r in recs if r["stats"].get("max_over_q99") is not None]
    lowest = min(ks, key=lambda x: x[0]) if ks else None
    extreme = max(ratios, key=lambda x: x[0]) if ratios else None
    return {
        "layer": block,
        "matrices": len(recs),
        "params": sum(r["numel"] for r in recs) + sum(v["numel"] for v in vectors),
        "k_median": float(np.median([k for k, _ in ks])) if ks else None,
        "k_min": lowest[0] if lowest else None,
        "k_min_tensor": lowest[1]["name"] if lowest else None,
        "k_max": max(k for k, _ in ks) if ks else None,
        "lambda_median": float(np.median(lams)) if lams else None,
        "max_over_q99": extreme[0] if extreme else None,
        "max_over_q99_tensor": extreme[1]["name"] if extreme else None,
        "roles": sorted({_role(r) for r in recs}),
    }


def tower_section(towers: dict[str, dict[str, list[dict[str, Any]]]], trim: str) -> list[dict[str, Any]]:
    """One summary per tower: its layers (median k and λ, lowest k, largest max/q99), its largest |w|
    and its non-finite tensors. No depth rule runs on a tower: it is listed, not diagnosed."""
    out = []
    for name, recs in sorted(towers.items()):
        matrices, vectors = recs["matrices"], recs["vectors"]
        by_layer: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
        vec_layer: dict[int | None, list[dict[str, Any]]] = defaultdict(list)
        for m in matrices:
            by_layer[m["block"]].append(m)
        for v in vectors:
            vec_layer[v["block"]].append(v)
        layers = [
            _layer(b, by_layer.get(b, []), vec_layer.get(b, []), trim)
            for b in sorted(set(by_layer) | set(vec_layer), key=lambda b: (b is None, b or 0))
        ]
        ks = [k for m in matrices if (k := _fit(m, trim, "k")) is not None]
        top = max(
            (m for m in matrices if m["stats"].get("max_abs") is not None),
            key=lambda m: m["stats"]["max_abs"],
            default=None,
        )
        # Non-finite values are a warning wherever they are; in a tower the block number is a tower layer,
        # so the finding names the tower and no language-model block.
        bad = nonfinite_findings({"matrices": [{**m, "block": None} for m in matrices], "vectors": vectors})
        for f in bad:
            f["blocks"] = []
            f["tower"] = name
            f["what"] = f"{name} {f['what']}"
        out.append(
            {
                "tower": name,
                "layers": [x for x in layers if x["layer"] is not None],
                "outside_layers": next((x for x in layers if x["layer"] is None), None),
                "n_layers": sum(1 for b in by_layer if b is not None),
                "matrices": len(matrices),
                "vectors": len(vectors),
                "params": sum(m["numel"] for m in matrices) + sum(v["numel"] for v in vectors),
                "k_median": float(np.median(ks)) if ks else None,
                "k_range": [min(ks), max(ks)] if ks else None,
                "largest": (
                    {
                        "tensor": top["name"],
                        "layer": top["block"],
                        "index": top.get("argmax"),
                        "abs_value": top["stats"]["max_abs"],
                        "max_over_q99": top["stats"].get("max_over_q99"),
                    }
                    if top
                    else None
                ),
                "_nonfinite": bad,
            }
        )
    return out


def tower_size(t: dict[str, Any]) -> str:
    """'9 layers, 56 matrices, 170,304 parameters' ('1 matrix', no layers when it has none)."""
    layers = f"{t['n_layers']} layer{'s' if t['n_layers'] != 1 else ''}, " if t["n_layers"] else ""
    return f"{layers}{t['matrices']} {'matrix' if t['matrices'] == 1 else 'matrices'}, {t['params']:,} parameters"


def tower_text(section: list[dict[str, Any]]) -> list[str]:
    """One observation line per tower."""
    lines = []
    for t in section:
        k = (
            f"k median {t['k_median']:.3f} ({t['k_range'][0]:.3f}-{t['k_range'][1]:.3f})"
            if t["k_median"] is not None
            else "no fitted k"
        )
        largest = t["largest"]
        where = (
            f"; largest |w| {largest['abs_value']:.4g} in {short_name(largest['tensor'])}"
            + (f" (layer {largest['layer']})" if largest["layer"] is not None else "")
            if largest
            else ""
        )
        lines.append(
            f"{t['tower']} (not the language model; its own table, kept out of the blocks, depth profile and "
            f"super weights): {tower_size(t)}, {k}{where}"
        )
    return lines

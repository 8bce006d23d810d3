"""From flagged statistics to findings: hits grouped per matrix or band, the numbers behind each
(evidence), its category and reason in plain words, and the final ordering, numbering and text."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ...vocabulary import FFN_KEYS, SELECTION_KEYS
from ..classes import INIT_ANCHOR_K, k_class
from ..cohort import load_cohort
from ..compare import COMPARISON_KEY, REGIME_B_MAX_K, SHALLOW_BLOCKS
from .cells import Cell, fmt, q99_exact, ratio_text, short_name, span
from .cuts import HALF_NORMAL_Q90_Q10, NORM_STAT, STATS, Stat
from .robust import Point, Series, spot


@dataclass
class Hit:
    """One flagged statistic of one series: at one block (spot) or over consecutive blocks (band)."""

    series: Series
    points: list[Point]
    band: bool

    @property
    def stat(self) -> Stat:
        return self.series.stat

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(p.block for p in self.points)

    @property
    def z(self) -> float:
        return max((p.trend_z if self.band else p.local_z for p in self.points), key=abs)

    @property
    def up(self) -> bool:
        return self.z > 0

    def expected(self, p: Point) -> float:
        return self.stat.back(p.trend if self.band else p.local)


def evidence_of(hit: Hit) -> dict[str, Any]:
    """The numbers behind a hit: value, expectation, robust z, neighbours or per-block values."""
    stat = hit.stat
    value = float(np.median([p.value for p in hit.points]))
    expected = float(np.median([hit.expected(p) for p in hit.points]))
    ev: dict[str, Any] = {
        "statistic": stat.key,
        "value": value,
        "expected": expected,
        "deviation": round(hit.z, 2),
        "deviation_type": "robust z",
        "expected_from": "Theil-Sen depth trend over all blocks" if hit.band else "median of the 4 nearest blocks",
    }
    if stat.log:
        ev["ratio"] = (value + stat.offset) / (expected + stat.offset)
    else:
        ev["difference"] = value - expected
    if hit.band:
        ev["values"] = {str(p.block): p.value for p in hit.points}
        involved = hit.points
    else:
        by_block = hit.series.by_block()
        ev["neighbours"] = {str(b): by_block[b].value for b in hit.points[0].neighbours}
        involved = [hit.points[0], *(by_block[b] for b in hit.points[0].neighbours)]
    if any(p.approximate for p in involved):
        ev["approximate"] = True  # quoted to 2 significant digits with '≈' (cells.q99_exact)
    return ev


def evidence_text(ev: dict[str, Any], label: str) -> str:
    dev = f"robust z = {ev['deviation']:+.1f}"

    def num(v: float) -> str:
        return f"≈{fmt(v, 2)}" if ev.get("approximate") else fmt(v)

    if "values" in ev:
        values = list(ev["values"].values())
        lo, hi = num(min(values)), num(max(values))
        shown = lo if lo == hi else f"{lo}-{hi}"
        return f"{label} {shown} vs {num(ev['expected'])} from the depth trend of the other blocks ({dev})"
    nb = ev["neighbours"]
    near = "/".join(nb) + ": " + ", ".join(num(v) for v in nb.values())
    expected = f"{num(ev['expected'])}, the median of the nearest blocks"
    return f"{label} {num(ev['value'])} vs {expected} ({dev}; blocks {near})"


def _label(stat: str) -> str:
    return STATS[stat].label if stat in STATS else NORM_STAT.label


def _base(key: str) -> str:
    """'qkv[q]' -> 'q'."""
    return key[key.index("[") + 1 : -1] if "[" in key else key


@cache
def _cohort_k_ranges() -> dict[str, tuple[float, float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for c in load_cohort("v9_1"):
        for kind, s in c["kinds"].items():
            key = COMPARISON_KEY.get(kind)
            if key and s.get("k_median"):
                out[key].append(s["k_median"])
    return {k: (min(v), max(v)) for k, v in out.items()}


# Which statistic leads a finding of each category (the others are listed as "also").
_LEAD = {"super-weight": "max_over_q99", "scale": "std", "kurtosis": "kurtosis", "fewer-outliers": "max_over_q99"}


def _body_text(key: str, hit: Hit, holder: Cell, cells: dict[tuple[int, str], Cell] | None, trim: str) -> str:
    """Whether the outlier's matrix kept the body of the others: its k against the nearest blocks' median."""
    k = holder.value("k", trim)
    point = next((p for p in hit.points if p.block == holder.block), hit.points[0])
    values = [cells[(b, key)].value("k", trim) for b in point.neighbours if (b, key) in cells] if cells else []
    near = [v for v in values if v is not None]
    if k is None or not near:
        return f"(k {fmt(k)})"
    median = float(np.median(near))
    if abs(k - median) < STATS["k"].min_effect:
        return f"while the body is unchanged (k {fmt(k)}, nearest blocks' median {fmt(median)})"
    return f"while the body's k is {fmt(k)} against {fmt(median)} in the nearest blocks"


def category_of(
    key: str, hits: list[Hit], group: list[Cell], trim: str, cells: dict[tuple[int, str], Cell] | None = None
) -> tuple[str, str, str]:
    """(category, severity, reason in plain words) for the flagged statistics of one matrix or band.

    Priority: a shallow-FFN second population, a detached outlier (max/q99 up), the body's shape
    (k), the scale (std, λ), kurtosis alone, and last a block with fewer outliers than its neighbours.
    """
    flagged = {h.stat.key: h for h in hits}
    cell = group[0]
    ks = [v for v in (c.value("k", trim) for c in group) if v is not None]
    k = min(ks) if ks else None
    quant = cell.quant
    qnote = (
        f"; measured on {quant['type']}-dequantized values ({quant['why']}), so not read as a class" if quant else ""
    )
    k_hit = flagged.get("k")
    if key in FFN_KEYS and cell.block in SHALLOW_BLOCKS and k is not None and k <= REGIME_B_MAX_K:
        q9010 = (cell.records[0].get("heaviness") or {}).get("q90_q10")
        return (
            "second-population",
            "warning",
            f"a second population of small weights in a shallow FFN block: k {k:.3f} <= {REGIME_B_MAX_K} is the "
            f"Qwen companion's regime B, and q90/q10 of |w| is {fmt(q9010, 3)} against {HALF_NORMAL_Q90_Q10} for "
            f"one Gaussian population{qnote}",
        )
    if "max_over_q99" in flagged and flagged["max_over_q99"].up and not (k_hit and not k_hit.up):
        holder = max(group, key=lambda c: c.value("max_over_q99", trim) or 0)
        stats = holder.records[0]["stats"]
        arg = holder.records[0].get("argmax")
        at = f" at ({', '.join(map(str, arg))})" if arg else ""
        return (
            "super-weight",
            "warning",
            f"{'an isolated outlier' if len(group) == 1 else 'isolated outliers'}: "
            f"{'' if len(group) == 1 else f'in block {holder.block} '}the largest |w| = {fmt(stats['max_abs'])}{at} is "
            f"{ratio_text(stats['max_over_q99'], q99_exact(holder.records[0]))}x the q99 and "
            f"{fmt(stats['max_abs'] / stats['std'], 3)}x the std "
            f"{_body_text(key, flagged['max_over_q99'], holder, cells, trim)}: the super-weight signature of the "
            "paper's Fig. 3 and Table 2",
        )
    if k_hit and not k_hit.up:
        if key in SELECTION_KEYS and not quant:
            cls = k_class(k, cell.value("r2", trim)) if k is not None else None
            return (
                "selection",
                "notice",
                f"heavy-tailed Q/K ({cls}): Selection, the specialisation the paper finds concentrated in "
                "mid-to-deep blocks (Sec. 4.1, Fig. 6)",
            )
        return "heavy-tail", "warning", f"a heavier-tailed body (lower k) than the other blocks' {_base(key)}{qnote}"
    if "std" in flagged or "lambda" in flagged:
        lead = flagged.get("std") or flagged["lambda"]
        extra = " and heavier-tailed (kurtosis)" if "kurtosis" in flagged and flagged["kurtosis"].up else ""
        than = "the depth trend predicts" if lead.band else "in the nearest blocks"
        return "scale", "warning", f"weights {'larger' if lead.up else 'smaller'} than {than}{extra}"
    if k_hit:
        return (
            "light-tail",
            "notice",
            f"a lighter-tailed body, closer to the Gaussian init (k0 = {INIT_ANCHOR_K}), than the other blocks{qnote}",
        )
    if "kurtosis" in flagged and flagged["kurtosis"].up:
        return (
            "kurtosis",
            "notice",
            f"heavier tails (kurtosis) than {'the other blocks' if flagged['kurtosis'].band else 'the nearest blocks'} "
            "without one dominant outlier "
            f"(max/q99 {ratio_text(cell.value('max_over_q99', trim), q99_exact(cell.records[0]))})",
        )
    return "fewer-outliers", "notice", "fewer outliers than the neighbouring blocks (their tails are heavier)"


def _groups(series: list[Series]) -> dict[tuple[str, tuple[int, ...]], list[Hit]]:
    """Hits grouped by (kind, blocks): bands of one kind merge when they overlap, and absorb the
    spots inside them (a band's edges stand out against their neighbours too)."""
    by_key: dict[str, list[Hit]] = defaultdict(list)
    for s in series:
        bands = s.bands
        in_band = {p.block for band in bands for p in band}
        by_key[s.key] += [Hit(s, band, True) for band in bands]
        by_key[s.key] += [Hit(s, [p], False) for p in s.points if spot(p, s.stat) and p.block not in in_band]
    groups: dict[tuple[str, tuple[int, ...]], list[Hit]] = {}
    for key, hits in by_key.items():
        spans: list[set[int]] = []
        for h in (h for h in hits if h.band):
            touching = [sp for sp in spans if sp & set(h.blocks)]
            merged = set(h.blocks).union(*touching)
            spans = [sp for sp in spans if sp not in touching] + [merged]
        for sp in spans:
            groups[(key, tuple(range(min(sp), max(sp) + 1)))] = []
        for h in hits:
            home = next((g for g in groups if g[0] == key and set(h.blocks) <= set(g[1])), None)
            if home is None:
                home = (key, h.blocks)
                groups.setdefault(home, [])
            groups[home].append(h)
    return groups


def matrix_findings(series: list[Series], cells: dict[tuple[int, str], Cell], trim: str) -> list[dict[str, Any]]:
    """One finding per flagged matrix, or per band of blocks (Q and K of one band read together)."""
    classified: dict[tuple[tuple[int, ...], str, str], list[tuple[str, list[Hit]]]] = defaultdict(list)
    for (key, blocks), hits in _groups(series).items():
        category, severity, reason = category_of(key, hits, [cells[(b, key)] for b in blocks], trim, cells)
        # Bands of different kinds with the same blocks and reading merge; single blocks stay per tensor.
        identity = reason if len(blocks) > 1 else f"{reason}|{key}"
        classified[(blocks, category, identity)].append((key, hits))
    findings = []
    for (blocks, category, _), members in classified.items():
        keys = [key for key, _ in members]
        _, severity, reason = category_of(keys[0], members[0][1], [cells[(b, keys[0])] for b in blocks], trim, cells)
        lead_stat = _LEAD.get(category, "k")
        every = [(key, h) for key, hits in members for h in hits]
        main_key, main = max(
            every, key=lambda kh: (kh[0] == keys[0], kh[1].stat.key == lead_stat, kh[1].band, abs(kh[1].z))
        )
        ev = evidence_of(main)
        summary = evidence_text(ev, _label(main.stat.key))
        if main.stat.key == "k":
            known = [_cohort_k_ranges().get(COMPARISON_KEY.get(_base(k), "")) for k in keys]
            ranges = [r for r in known if r]
            if ranges:
                ev["cohort"] = {"k_range": [min(r[0] for r in ranges), max(r[1] for r in ranges)]}
                summary += (
                    f"; the cohort's median k of {'/'.join(_base(k) for k in keys)} spans "
                    f"{ev['cohort']['k_range'][0]:.3f}-{ev['cohort']['k_range'][1]:.3f}"
                )
        also, also_text = [], []
        # Other kinds' leading statistic first (the K of a Q/K band), then by strength.
        rest = sorted(
            (kh for kh in every if kh[1] is not main),
            key=lambda kh: (kh[0] == main_key or kh[1].stat.key != main.stat.key, -abs(kh[1].z)),
        )
        for key, h in rest:
            e = evidence_of(h)
            also.append({"kind": key, **e})
            prefix = "" if key == main_key else f"{short_name(cells[(h.blocks[0], key)].tensor)} "
            also_text.append(prefix + evidence_text(e, _label(h.stat.key)))
        tensors = [cells[(b, k)].tensor for k in keys for b in blocks if (b, k) in cells]
        what = " and ".join(dict.fromkeys(short_name(cells[(blocks[0], k)].tensor) for k in keys))
        f = finding(
            category, list(blocks), summary, reason, severity=severity, kinds=keys, tensors=tensors, what=what, **ev
        )
        f["also"], f["_also"] = also, also_text
        findings.append(f)
    return findings


def finding(
    category: str,
    blocks: list[int],
    summary: str,
    reason: str,
    *,
    severity: str = "warning",
    kinds: list[str] | None = None,
    tensors: list[str] | None = None,
    what: str = "",
    **evidence: Any,
) -> dict[str, Any]:
    """One finding: where, which statistic, its value, what was expected (and from what), how far off
    (`deviation`, `deviation_type`), and why in plain words. `summary` and `also_text` become its text."""
    kinds = kinds or []
    tensors = tensors or []
    out = {
        "category": category,
        "severity": severity,
        "blocks": blocks,
        "kind": ",".join(kinds),
        "kinds": kinds,
        "tensor": tensors[0] if tensors else None,
        "tensors": tensors,
        "what": what,
        "also": [],
        **evidence,
        "reason": reason,
        "_summary": summary,
    }
    return out


def finish(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Order (warnings first, then by depth), number and write each finding's one-line text."""
    rank = {"warning": 0, "notice": 1}
    findings.sort(key=lambda f: (rank[f["severity"]], f["blocks"][0] if f["blocks"] else 10**9, f["kind"]))
    for i, f in enumerate(findings, 1):
        f["id"] = f"F{i}"
        blocks = f["blocks"]
        where = "model" if not blocks else (f"block {blocks[0]}" if len(blocks) == 1 else f"blocks {span(blocks)}")
        if len(blocks) > 1 and blocks != list(range(blocks[0], blocks[-1] + 1)):
            where = f"{len(blocks)} blocks"
        text = f"{where}{' ' + f['what'] if f['what'] else ''}: {f.pop('_summary')}"
        if f.get("reason"):
            text += f" — {f['reason']}"
        also = f.pop("_also", [])
        if also:  # the JSON keeps every flagged statistic; the line shows the strongest three
            text += "; also " + "; ".join(also[:3]) + (f" (+{len(also) - 3} more)" if len(also) > 3 else "")
        f["text"] = text
    return findings

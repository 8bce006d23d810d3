"""The health report: what is unusual about each block of a fitted model, and why (issue 6).

`health_report(row)` reads one row (docs/row-schema.md) and returns a JSON-able dict: a per-block
table, findings (each unusual block with the statistic, its value, what was expected, how far off
and a reason in plain words), norm-weight regimes, super weights, the depth profile, the shallow-FFN
regime and quantization notes. It never reads weights; docs/report.md explains every rule.

Robust rule. Per matrix kind (and per norm site) each statistic is a series over blocks. It is
compared with two expectations, on log values for scale and tail statistics:
- local: the median of the 4 nearest other blocks (leave-one-out), against which isolated blocks
  stand out ("spots");
- trend: a Theil-Sen line over all blocks, against which a stretch of 2+ consecutive blocks that
  covers at most half the model stands out ("bands", e.g. the Q/K Selection band).
Residuals are scaled by 1.4826 x MAD with a floor per statistic (so near-identical synthetic blocks
do not divide by ~0), and a block is flagged only when |robust z| >= 5 AND the difference is of a
practical size (STATS below). Hard cuts apply only to norm regimes (seed 001) and to the
comparison with the paper's Table 2.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from itertools import pairwise
from typing import Any

import numpy as np

from ..errors import BadInputError
from .classes import INIT_ANCHOR_K, NON_WEIBULL_R2, SELECTION_DEEP, k_class
from .cohort import GROUP_EXPECTATION, architecture_group, load_cohort
from .compare import COMPARISON_KEY, REGIME_B_MAX_K, SHALLOW_BLOCKS, shallow_ffn_regime
from .functions import attention_arch

Z_CUT = 5.0
MAD_SIGMA = 1.4826  # MAD -> sigma for Gaussian residuals
NEIGHBOURS = 4  # the local expectation: median of this many nearest other blocks
MIN_BLOCKS = 5  # fewer blocks than this: no depth trend, no robust findings


@dataclass(frozen=True)
class Stat:
    """A per-matrix statistic compared across depth: floor of the robust scale and the smallest
    difference worth a finding, both in compared units (log(value + offset) when `log`)."""

    key: str
    label: str
    log: bool
    floor: float
    min_effect: float
    offset: float = 0.0

    def t(self, value: float) -> float:
        return math.log(value + self.offset) if self.log else value

    def back(self, t: float) -> float:
        return math.exp(t) - self.offset if self.log else t


STATS = {
    # k: the noise of one fit is ~0.003-0.007 (hist1024 grid included); 0.05 is twice the
    # Transmission/Selection-mild gap (1.18 vs the anchor 1.2054).
    "k": Stat("k", "k", False, 0.01, 0.05),
    "std": Stat("std", "std", True, 0.02, math.log(1.15)),
    "lambda": Stat("lambda", "λ", True, 0.02, math.log(1.15)),
    # A Gaussian matrix of up to 1e8 values has max/q99 < 2.4; outliers show as factors.
    "max_over_q99": Stat("max_over_q99", "max/q99", True, 0.10, math.log(2.0)),
    # Compared as log raw kurtosis (3 + excess), so Gaussian blocks sit at log 3.
    "kurtosis": Stat("kurtosis", "excess kurtosis", True, 0.05, math.log(2.0), offset=3.0),
}
NORM_STAT = Stat("norm", "‖γ‖/√d", True, 0.02, math.log(1.25))

# Norm-weight regimes (seed 001): at init ||gamma|| = sqrt(d) to 0.01; collapse < 0.4 sqrt(d); explosion > 1.8 sqrt(d).
NORM_AT_INIT_ABS = 0.01
NORM_COLLAPSE = 0.4
NORM_EXPLOSION = 1.8
MODEL_WIDE = 0.5  # a regime shared by at least this fraction of block norms is a model-wide property

# Paper Table 2: per-block super-weight signatures of 8 terminal checkpoints
# (family: blocks, median max/q99, extreme max/q99, extreme excess kurtosis).
TABLE2 = {
    "Pythia-70m": (6, 7.2, 15.7, 196.9),
    "Pythia-160m": (12, 6.6, 13.4, 104.2),
    "Pythia-410m": (24, 8.0, 19.6, 257.1),
    "Pythia-1B": (16, 11.3, 21.5, 21.8),
    "Pythia-6.9B": (32, 8.6, 31.4, 27.7),
    "OLMo-1-7B": (32, 27.7, 107.2, 445.9),
    "Qwen2.5-14B": (27, 18.4, 22.9, 46.9),
    "Qwen3-8B": (36, 17.3, 40.4, 14.5),
}

# Init-like block: every matrix near the half-normal anchor, no outliers, norms at init.
INIT_K_TOL = 0.02
INIT_MAX_Q99 = 3.0
INIT_KURTOSIS = 0.5
HALF_NORMAL_Q90_Q10 = 13.09  # q90/q10 of |w| for one Gaussian population (1.6449 / 0.12566)

# GGUF quantization: k shift measured on 576x1536 Gaussian, Student-t(2.5) and Weibull(0.85)
# matrices quantized with llama.cpp's reference quantizers (gguf 0.19): always upward (lighter tails).
QUANT_K_SHIFT = {
    "Q8_0": (0.023, 0.067),
    "Q5_1": (0.0, 0.022),
    "Q5_0": (0.18, 0.36),
    "Q4_1": (0.0, 0.063),
    "Q4_0": (0.34, 0.64),
}
FEW_DISTINCT = 256  # at most this many distinct values: a quantization grid (an 8-bit code or less)
_GGUF_NOTE = re.compile(r"GGUF (\w+), dequantized")
_BITS = re.compile(r"^(?:I?Q)(\d)|^MXFP(\d)")

KIND_ORDER = (
    "qkv",
    "qkv[q]",
    "qkv[k]",
    "qkv[v]",
    "q",
    "k",
    "v",
    "o",
    "ffn_in",
    "ffn_in[gate]",
    "ffn_in[up]",
    "gate",
    "up",
    "down",
    "ffn_out",
)
SELECTION_KEYS = frozenset({"q", "k", "qkv", "qkv[q]", "qkv[k]"})
FFN_KEYS = frozenset({"gate", "up", "down", "ffn_in", "ffn_out", "ffn_in[gate]", "ffn_in[up]"})


# --- gathering the row's records ----------------------------------------------------------------


@dataclass
class _Cell:
    """One (block, kind) of the model: a matrix, a part of a fused one, or experts pooled by median."""

    block: int
    key: str
    tensor: str
    records: list[dict[str, Any]]
    quant: dict[str, Any] | None = None

    def value(self, stat: str, trim: str) -> float | None:
        values = [v for v in (_record_stat(r, stat, trim) for r in self.records) if v is not None]
        return float(np.median(values)) if values else None


def _record_stat(rec: dict[str, Any], stat: str, trim: str) -> float | None:
    if stat in ("k", "lambda", "r2"):
        fit = rec["fits"][trim]
        value = fit.get(stat) if fit.get("ok") else None
    else:
        value = rec["stats"].get("excess_kurtosis" if stat == "kurtosis" else stat)
    return float(value) if value is not None and math.isfinite(value) else None


def quantization_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    """How a matrix was quantized, and whether its fit is distorted by it (None: not quantized)."""
    note = rec.get("note") or ""
    match = _GGUF_NOTE.search(note)
    stats = rec["stats"]
    distinct = stats.get("distinct_values")
    few = distinct is not None and distinct <= FEW_DISTINCT and stats.get("numel", 0) >= 16 * FEW_DISTINCT
    if not match and not few:
        return None
    qtype = match.group(1) if match else None
    bits_match = _BITS.match(qtype or "")
    bits = int(next(g for g in bits_match.groups() if g)) if bits_match else None
    r2 = rec["fits"]["mid80"].get("r2")
    reasons = []
    if qtype:
        shift = QUANT_K_SHIFT.get(qtype)
        reasons.append(
            f"{qtype} ({bits}-bit codes per block)"
            + (f": moves k by +{shift[0]:.2f} to +{shift[1]:.2f} on synthetic matrices" if shift else "")
        )
    if few:
        reasons.append(f"only {distinct} distinct values")
    if r2 is not None and r2 < NON_WEIBULL_R2:
        reasons.append(f"R² {r2:.3f} < {NON_WEIBULL_R2}")
    if stats.get("zero_fraction", 0) >= 0.01:
        reasons.append(f"{stats['zero_fraction']:.1%} of values rounded to exactly 0")
    return {"type": qtype or "grid", "bits": bits, "distorted": True, "why": "; ".join(reasons)}


def _cells(row: dict[str, Any]) -> dict[tuple[int, str], _Cell]:
    """Every (block, kind) cell; fused matrices add their parts as 'qkv[q]' etc."""
    grouped: dict[tuple[int, str], list[tuple[str, dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for m in row["matrices"]:
        if m["block"] is None or m["kind"] not in KIND_ORDER:
            continue
        grouped[(m["block"], m["kind"])].append((m["name"], m, m))
        for part in m.get("parts", []):
            grouped[(m["block"], f"{m['kind']}[{part['kind']}]")].append((f"{m['name']}[{part['kind']}]", part, m))
    cells = {}
    for (block, key), members in grouped.items():
        tensor = members[0][0] if len(members) == 1 else f"{len(members)} experts of {key}"
        quant = quantization_of(members[0][2])
        cells[(block, key)] = _Cell(block, key, tensor, [rec for _, rec, _ in members], quant)
    return cells


def short_name(name: str) -> str:
    """'model.layers.3.self_attn.k_proj.weight' -> 'self_attn.k_proj' (what a reader scans for)."""
    text = re.sub(r"^.*?(?:layers|layer|h|blocks|block|blk)\.\d+\.", "", name)
    return re.sub(r"\.weight$", "", text)


# --- the robust depth analysis ----------------------------------------------------------------


@dataclass
class _Point:
    block: int
    value: float
    tensor: str
    t: float
    local: float = math.nan  # expected, compared units
    local_z: float = 0.0
    neighbours: tuple[int, ...] = ()
    trend: float = math.nan
    trend_z: float = 0.0


@dataclass
class _Series:
    key: str  # matrix kind key, or "norm:<site>"
    stat: Stat
    points: list[_Point]
    local_scale: float = math.nan
    trend_scale: float = math.nan
    bands: list[list[_Point]] = field(default_factory=list)

    def by_block(self) -> dict[int, _Point]:
        return {p.block: p for p in self.points}


def robust_scale(residuals: np.ndarray, floor: float) -> float:
    mad = float(np.median(np.abs(residuals - np.median(residuals)))) if residuals.size else 0.0
    return max(MAD_SIGMA * mad, floor)


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Median of pairwise slopes, intercept = median(y - slope x): robust to ~29% outliers."""
    i, j = np.triu_indices(x.size, 1)
    dx = x[j] - x[i]
    slopes = (y[j] - y[i])[dx != 0] / dx[dx != 0]
    slope = float(np.median(slopes)) if slopes.size else 0.0
    return slope, float(np.median(y - slope * x))


def analyse(series: _Series) -> _Series:
    """Fill each point's trend and local expectations and robust z, and the series' bands (in place).

    The trend comes first: blocks in a band are left out of their neighbours' local medians, so
    the blocks next to a band are compared with blocks like themselves.
    """
    pts = series.points
    if len(pts) < MIN_BLOCKS:
        return series
    x = np.array([p.block for p in pts], dtype=float)
    y = np.array([p.t for p in pts])
    slope, intercept = theil_sen(x, y)
    trend_res = y - (intercept + slope * x)
    series.trend_scale = robust_scale(trend_res, series.stat.floor)
    for p, tr in zip(pts, trend_res, strict=True):
        p.trend = float(p.t - tr)
        p.trend_z = float(tr / series.trend_scale)
    series.bands = _bands(series)
    banded = {p.block for band in series.bands for p in band}
    for i, p in enumerate(pts):
        pool = [j for j, q in enumerate(pts) if j != i and (q.block not in banded or p.block in banded)]
        near = sorted(pool, key=lambda j: (abs(pts[j].block - p.block), pts[j].block))[:NEIGHBOURS]
        p.local = float(np.median(y[near]))
        p.neighbours = tuple(sorted(pts[j].block for j in near))
    local_res = y - np.array([p.local for p in pts])
    series.local_scale = robust_scale(local_res, series.stat.floor)
    for p, lr in zip(pts, local_res, strict=True):
        p.local_z = float(lr / series.local_scale)
    return series


def _spot(p: _Point, stat: Stat) -> bool:
    return abs(p.local_z) >= Z_CUT and abs(p.t - p.local) >= stat.min_effect


def _bands(series: _Series) -> list[list[_Point]]:
    """Runs of >= 2 consecutive blocks off the trend in the same direction, covering at most half the blocks."""
    stat, pts = series.stat, series.points
    off = [abs(p.trend_z) >= Z_CUT and abs(p.t - p.trend) >= stat.min_effect for p in pts]
    if sum(off) * 2 > len(pts):
        return []  # most blocks are "off": the line is not the model's trend
    runs: list[list[_Point]] = []
    for p, flagged in zip(pts, off, strict=True):
        if not flagged:
            continue
        last = runs[-1][-1] if runs else None
        if last is not None and p.block == last.block + 1 and (p.trend_z > 0) == (last.trend_z > 0):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [r for r in runs if len(r) >= 2]


# --- findings ---------------------------------------------------------------------------------


@dataclass
class _Hit:
    """One flagged statistic of one series: at one block (spot) or over consecutive blocks (band)."""

    series: _Series
    points: list[_Point]
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

    def expected(self, p: _Point) -> float:
        return self.stat.back(p.trend if self.band else p.local)


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}"


def span(blocks: list[int] | tuple[int, ...]) -> str:
    return f"{blocks[0]}" if len(blocks) == 1 else f"{blocks[0]}-{blocks[-1]}"


def _evidence(hit: _Hit) -> dict[str, Any]:
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
    else:
        by_block = hit.series.by_block()
        ev["neighbours"] = {str(b): by_block[b].value for b in hit.points[0].neighbours}
    return ev


def _evidence_text(ev: dict[str, Any], label: str) -> str:
    dev = f"robust z = {ev['deviation']:+.1f}"
    if "values" in ev:
        values = list(ev["values"].values())
        lo, hi = fmt(min(values)), fmt(max(values))
        shown = lo if lo == hi else f"{lo}-{hi}"
        return f"{label} {shown} vs {fmt(ev['expected'])} from the depth trend of the other blocks ({dev})"
    nb = ev["neighbours"]
    near = "/".join(nb) + ": " + ", ".join(fmt(v) for v in nb.values())
    return f"{label} {fmt(ev['value'])} vs {fmt(ev['expected'])} expected from the depth trend ({dev}; blocks {near})"


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


def _category(key: str, hits: list[_Hit], group: list[_Cell], trim: str) -> tuple[str, str, str]:
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
            f"{fmt(stats['max_over_q99'], 3)}x the q99 and {fmt(stats['max_abs'] / stats['std'], 3)}x the std while "
            f"the body is unchanged (k {fmt(holder.value('k', trim))}): the super-weight signature of the paper's "
            "Fig. 3 and Table 2",
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
        up = (flagged.get("std") or flagged["lambda"]).up
        extra = " and heavier-tailed (kurtosis)" if "kurtosis" in flagged and flagged["kurtosis"].up else ""
        return "scale", "warning", f"weights {'larger' if up else 'smaller'} than the depth trend predicts{extra}"
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
            "heavier tails (kurtosis) than the neighbouring blocks without one dominant outlier "
            f"(max/q99 {fmt(cell.value('max_over_q99', trim), 3)})",
        )
    return "fewer-outliers", "notice", "fewer outliers than the neighbouring blocks (their tails are heavier)"


def _groups(series: list[_Series]) -> dict[tuple[str, tuple[int, ...]], list[_Hit]]:
    """Hits grouped by (kind, blocks): bands of one kind merge when they overlap, and absorb the
    spots inside them (a band's edges stand out against their neighbours too)."""
    by_key: dict[str, list[_Hit]] = defaultdict(list)
    for s in series:
        bands = s.bands
        in_band = {p.block for band in bands for p in band}
        by_key[s.key] += [_Hit(s, band, True) for band in bands]
        by_key[s.key] += [_Hit(s, [p], False) for p in s.points if _spot(p, s.stat) and p.block not in in_band]
    groups: dict[tuple[str, tuple[int, ...]], list[_Hit]] = {}
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


def _matrix_findings(series: list[_Series], cells: dict[tuple[int, str], _Cell], trim: str) -> list[dict[str, Any]]:
    """One finding per flagged matrix, or per band of blocks (Q and K of one band read together)."""
    classified: dict[tuple[tuple[int, ...], str, str], list[tuple[str, list[_Hit]]]] = defaultdict(list)
    for (key, blocks), hits in _groups(series).items():
        category, severity, reason = _category(key, hits, [cells[(b, key)] for b in blocks], trim)
        # Bands of different kinds with the same blocks and reading merge; single blocks stay per tensor.
        identity = reason if len(blocks) > 1 else f"{reason}|{key}"
        classified[(blocks, category, identity)].append((key, hits))
    findings = []
    for (blocks, category, _), members in classified.items():
        keys = [key for key, _ in members]
        _, severity, reason = _category(keys[0], members[0][1], [cells[(b, keys[0])] for b in blocks], trim)
        lead_stat = _LEAD.get(category, "k")
        every = [(key, h) for key, hits in members for h in hits]
        main_key, main = max(
            every, key=lambda kh: (kh[0] == keys[0], kh[1].stat.key == lead_stat, kh[1].band, abs(kh[1].z))
        )
        ev = _evidence(main)
        summary = _evidence_text(ev, _label(main.stat.key))
        if main.stat.key == "k":
            ranges = [_cohort_k_ranges().get(COMPARISON_KEY.get(_base(k), "")) for k in keys]
            ranges = [r for r in ranges if r]
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
            e = _evidence(h)
            also.append({"kind": key, **e})
            prefix = "" if key == main_key else f"{short_name(cells[(h.blocks[0], key)].tensor)} "
            also_text.append(prefix + _evidence_text(e, _label(h.stat.key)))
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


def _finish(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


# --- norms --------------------------------------------------------------------------------------


def norm_regime(l2: float, numel: int) -> str:
    """Seed 001's regimes of ||gamma||_2 against sqrt(d)."""
    root = math.sqrt(numel)
    if abs(l2 - root) < NORM_AT_INIT_ABS:
        return "at init"
    ratio = l2 / root
    if ratio < NORM_COLLAPSE:
        return "collapse"
    if ratio > NORM_EXPLOSION:
        return "explosion"
    return "healthy shrink" if ratio < 1 else "grown (within band)"


def _norm_records(row: dict[str, Any]) -> list[dict[str, Any]]:
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
                "regime": norm_regime(v["l2"], v["numel"]),
            }
        )
    return out


def _norm_series(in_blocks: list[dict[str, Any]]) -> list[_Series]:
    by_site: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in sorted(in_blocks, key=lambda r: r["block"]):
        by_site[r["site"]].append(r)
    return [
        analyse(
            _Series(
                f"norm:{site}",
                NORM_STAT,
                [_Point(r["block"], r["ratio"], r["name"], NORM_STAT.t(max(r["ratio"], 1e-12))) for r in recs],
            )
        )
        for site, recs in by_site.items()
    ]


_SINGLED = {"final": "the final norm", "mtp": "an MTP-head norm", "embed": "the embedding norm"}


def _norm_finding(r: dict[str, Any], hit: _Hit | None, model_wide: list[str]) -> dict[str, Any]:
    regime, site = r["regime"], r["site"]
    if hit is not None and regime in model_wide:
        category, reason = "norm-outlier", f"far from the other {site} norms at this depth (all in the {regime} regime)"
    elif regime == "collapse":
        after = "the LM head and any MTP head" if site in ("final", "mtp") else "the next sub-layer"
        category, reason = "norm-collapse", f"collapse below {NORM_COLLAPSE} √d (seed 001): it suppresses {after}"
    elif regime == "explosion":
        category, reason = "norm-explosion", f"explosion above {NORM_EXPLOSION} √d (seed 001): a few channels dominate"
    elif regime == "at init":
        category, reason = (
            "norm-at-init",
            "still exactly at its all-ones init while the other norms moved: never trained?",
        )
    else:
        category, reason = "norm-outlier", f"{regime}, but far from the other {site} norms at this depth"
    if hit is not None:
        evidence = _evidence(hit)
        summary = _evidence_text(evidence, NORM_STAT.label)
    else:
        evidence = {
            "statistic": "norm",
            "value": r["ratio"],
            "expected": 1.0,
            "expected_from": "seed 001: ‖γ‖ = √d at init, healthy within [0.4, 1.8] √d",
            "deviation": round(r["ratio"], 4),
            "deviation_type": "ratio to sqrt(d)",
        }
        summary = f"‖γ‖/√d {r['ratio']:.3f} (‖γ‖ = {r['l2']:.4g}, √d = {r['sqrt_d']:.4g})"
    what = short_name(r["name"]) + (f" ({_SINGLED[site]})" if site in _SINGLED else "")
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


def _norms(row: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Norm regimes (hard cuts, seed 001) and robust outliers against the depth trend of each site."""
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
    hits: dict[str, _Hit] = {}
    for s in series:
        for band in s.bands:
            for p in band:
                hits[p.tensor] = _Hit(s, band, True)
        for p in s.points:
            if p.tensor not in hits and _spot(p, NORM_STAT):
                hits[p.tensor] = _Hit(s, [p], False)
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
            f"below seed 001's collapse cut {NORM_COLLAPSE}"
            if regime == "collapse"
            else (f"above seed 001's explosion cut {NORM_EXPLOSION}")
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
                expected_from="seed 001: healthy within [0.4, 1.8] √d",
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


# --- super weights (paper Table 2) ----------------------------------------------------------------


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


def _super_weights(row: dict[str, Any], trim: str, top: int) -> dict[str, Any]:
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


_READS_HIDDEN = {"q", "k", "v", "qkv", "gate", "up", "ffn_in", "embed", "unembed", "other"}


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


def _channels(top: list[dict[str, Any]], row: dict[str, Any]) -> list[dict[str, Any]]:
    """Hidden dimensions that hold the largest |w| of more matrices than chance allows.

    Checked over the top-N matrices and over all matrices; an index is reported when it is hit at
    least 3 times and d_model x P(Poisson(n / d_model) >= hits) < 0.01 (argmax positions uniform).
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
            tail = 1 - sum(math.exp(-rate) * rate**i / math.factorial(i) for i in range(c))
            if c >= 3 and d_model * tail < 0.01 and (h not in found or scope == "top"):
                found[h] = {"hidden_index": h, "count": c, "of": len(names), "scope": scope, "tensors": members}
    return sorted(found.values(), key=lambda x: -x["count"] / x["of"])


def _ffn_neurons(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Blocks whose FFN input and output matrices have their largest |w| on the same intermediate
    neuron: one neuron that reads the hidden state and writes an outlier back (chance: 1 in ffn_size)."""
    found: dict[int, dict[str, Any]] = defaultdict(dict)
    for m in row["matrices"]:
        arg = m.get("argmax")
        if m["block"] is None or m.get("expert") is not None or not arg or len(arg) != 2:
            continue
        swap = "Conv1D" in (m.get("note") or "")  # GPT-2 stores (in, out)
        if m["kind"] in ("gate", "up", "ffn_in"):
            found[m["block"]][m["kind"]] = (arg[1] if swap else arg[0], m["name"])
        elif m["kind"] in ("down", "ffn_out"):
            found[m["block"]]["out"] = (arg[0] if swap else arg[1], arg[1] if swap else arg[0], m["name"])
    out = []
    for block, d in sorted(found.items()):
        if "out" not in d:
            continue
        neuron, hidden, name = d["out"]
        inputs = [d[k][1] for k in ("gate", "up", "ffn_in") if k in d and d[k][0] == neuron]
        if inputs:
            out.append({"block": block, "neuron": neuron, "hidden_index": hidden, "tensors": [*inputs, name]})
    return out


def _super_weight_text(sw: dict[str, Any], n_layers: int | None) -> list[str]:
    t2 = sw.get("table2")
    if not t2:
        return []
    med, ext, kurt = t2["median_max_over_q99"], t2["extreme_max_over_q99"], t2["extreme_kurtosis"]
    e = sw["extreme"]
    where = f"{short_name(e['tensor'])}" + (f" at ({', '.join(map(str, e['index']))})" if e["index"] else "")
    words = {"below": "below every family", "above": "above every family", "inside": "inside the families' range"}
    text = (
        f"super weights vs the paper's Table 2: per-block max/q99 median {med['value']:.1f}, {words[med['position']]} "
        f"({med['range'][0]}-{med['range'][1]}; nearest {med['nearest']} {med['nearest_value']}); extreme "
        f"{ext['value']:.1f} in block {e['block']} ({where}), {words[ext['position']]} ({ext['range'][0]}-"
        f"{ext['range'][1]})"
    )
    if kurt:
        text += (
            f"; kurtosis extreme {kurt['value']:.1f}, {words[kurt['position']]} ({kurt['range'][0]}-{kurt['range'][1]})"
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
            + ": far more than chance, the weight-side trace of massive-activation dimensions (Sun et al., 2024)"
        )
    neurons = sw.get("ffn_neurons", [])
    if neurons:
        shown = "; ".join(f"block {n['block']}: neuron {n['neuron']} -> hidden {n['hidden_index']}" for n in neurons)
        lines.append(
            f"FFN outlier neurons ({shown}): the FFN input and output matrices have their largest |w| on the same "
            "intermediate neuron (chance: 1 in the FFN width per block), so one neuron builds the outlier"
        )
    top = sw["top"][0] if sw["top"] else None
    early = top and top["kind"] in ("down", "ffn_out") and top["block"] is not None and n_layers
    if early and top["block"] < max(1, n_layers // 4):
        lines.append(
            f"the most extreme weight sits in the down-projection of early block {top['block']}: where Yu et al. "
            "(2024) find super weights in LLaMA, Mistral, OLMo and Phi-3"
        )
    return lines


def _block_of(name: str) -> str:
    match = re.search(r"(?:layers|layer|h|blocks|block|blk)\.(\d+)\.", name)
    return f" (block {match.group(1)})" if match else ""


# --- depth profile (Curse of Depth) -----------------------------------------------------------------


def _tolerances(a: _Cell, b: _Cell, trim: str) -> dict[str, float]:
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
    cells: dict[tuple[int, str], _Cell], norms: dict[tuple[int, str], float], blocks: list[int], trim: str
) -> dict[int, float]:
    """Per block b: the largest difference to block b-1 over kinds and statistics, in units of the
    tolerance (<= 1: statistically indistinguishable from the previous block)."""
    out = {}
    for prev, b in pairwise(blocks):
        if b != prev + 1:
            continue
        worst = 0.0
        for key in KIND_ORDER:
            ca, cb = cells.get((prev, key)), cells.get((b, key))
            if not ca or not cb:
                continue
            tol = _tolerances(ca, cb, trim)
            for stat in ("k", "lambda", "std"):
                va, vb = ca.value(stat, trim), cb.value(stat, trim)
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


def _init_like(block: int, cells: dict[tuple[int, str], _Cell], norm_recs: list[dict[str, Any]], trim: str) -> bool:
    mine = [c for (b, _), c in cells.items() if b == block and not c.quant]
    if not mine:
        return False
    for c in mine:
        k, mq, kurt = c.value("k", trim), c.value("max_over_q99", trim), c.value("kurtosis", trim)
        if (
            k is None
            or abs(k - INIT_ANCHOR_K) > INIT_K_TOL
            or (mq or 0) > INIT_MAX_Q99
            or abs(kurt or 0) > INIT_KURTOSIS
        ):
            return False
    return all(r["regime"] == "at init" for r in norm_recs if r["block"] == block)


def _placement(row: dict[str, Any]) -> tuple[str | None, str]:
    arch = row["architecture"]
    placement = arch.get("norm_placement")
    sites = sorted({v.get("site") for v in row["vectors"] if v["kind"] == "norm" and v.get("site")})
    evidence = f"family {arch.get('family') or 'unknown'}" + (f"; norm sites {', '.join(sites)}" if sites else "")
    return placement, evidence


_PLACEMENT_NAME = {"pre": "Pre-LN", "post": "Post-LN", "peri": "Peri-LN"}
_READING = {
    "pre": (
        "Pre-LN: the Curse of Depth applies (seed 002: Pre-LN output variance grows with depth, so deep blocks drift "
        "toward identity maps and can often be pruned with little loss); weights alone cannot measure that, but deep "
        "blocks that are indistinguishable from each other or still look like their init are consistent with it"
    ),
    "post": (
        "Post-LN: the Curse of Depth is a Pre-LN effect; in Post-LN models (e.g. BERT) deep layers stay distinct and "
        "matter more, while early layers are the most similar (seed 002, Fig. 2a, 3a), so similar deep stretches here "
        "are not read as the Pre-LN mechanism"
    ),
    "peri": (
        "Peri-LN / sandwich norms: sub-layer outputs are normalised as well, which bounds the variance growth the "
        "Curse of Depth attributes to Pre-LN; read similar deep stretches with that in mind"
    ),
}


def _depth(
    row: dict[str, Any],
    cells: dict[tuple[int, str], _Cell],
    norm_recs: list[dict[str, Any]],
    trim: str,
) -> dict[str, Any]:
    blocks = sorted({b for b, _ in cells})
    n_layers = row["architecture"].get("n_layers") or (blocks[-1] + 1 if blocks else 0)
    keys = [k for k in KIND_ORDER if any((b, k) in cells for b in blocks)]
    series = {
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
    stretches = []
    for run in _runs(similar):
        members = [run[0] - 1, *run]  # a pair (b-1, b) makes both blocks part of the stretch
        if len(members) >= 3:
            stretches.append({"blocks": [members[0], members[-1]], "deep": members[0] >= n_layers / 2})
    init_like = [b for b in blocks if _init_like(b, cells, norm_recs, trim)]
    placement, evidence = _placement(row)
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
        "adjacent_change": {str(b): v for b, v in change.items()},
        "similar_stretches": stretches,
        "stretch_text": stretch_text,
        "init_like_blocks": init_like,
    }


def _selection_text(depth: dict[str, Any], arch: dict[str, Any]) -> list[str]:
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


# --- shallow FFN, quantization, block table --------------------------------------------------------


def _shallow(row: dict[str, Any], cells: dict[tuple[int, str], _Cell], trim: str) -> dict[str, Any] | None:
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


def _quantization(row: dict[str, Any]) -> dict[str, Any]:
    types: dict[str, int] = defaultdict(int)
    kinds: dict[str, set[str]] = defaultdict(set)
    for m in row["matrices"]:
        q = quantization_of(m)
        if q:
            types[q["type"]] += 1
            kinds[q["type"]].add(m["kind"])
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
        out["text"] = (
            "quantized weights: " + "; ".join(parts) + ". Fits are of the dequantized values, so k and λ describe "
            "the quantized model; k classes (Selection/Transmission) are withheld for quantized matrices"
        )
    return out


def _block_table(
    row: dict[str, Any], cells: dict[tuple[int, str], _Cell], norm_recs: list[dict[str, Any]], trim: str
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
        for key in KIND_ORDER:
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
        out.append(
            {
                "block": b,
                "mtp": n_layers is not None and b >= n_layers,
                "params": params[b],
                "qk_norm": qk_norm[b],
                "biases": [k for k in (*KIND_ORDER, "other") if k in biases[b]],
                "kinds": kinds,
                "norms": {r["site"]: r["ratio"] for r in norm_recs if r["block"] == b},
            }
        )
    return out


def _architecture(row: dict[str, Any], blocks: list[dict[str, Any]]) -> dict[str, Any]:
    arch = row["architecture"]
    att = attention_arch(arch)
    placement, evidence = _placement(row)
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


# --- the report -----------------------------------------------------------------------------------


def health_report(row: dict[str, Any], top: int = 10, trim: str | None = None) -> dict[str, Any]:
    """Everything `weightdiag report` shows for one row (JSON-able)."""
    model = row.get("model", {})
    if not row.get("matrices"):
        what = (
            "a cohort summary (per-kind medians only)" if model.get("source") == "cohort" else "a row without matrices"
        )
        raise BadInputError(
            f"{model.get('id', 'this row')} is {what}; the report needs per-matrix data: give the model itself "
            "(a folder, file or Hub id) so it can be fitted"
        )
    trim = trim or row["protocol"]["trim"]
    all_cells = _cells(row)
    n_layers = row["architecture"].get("n_layers")
    # MTP layers (numbered after the main stack) are not part of the depth profile; the table lists them.
    cells = {bk: c for bk, c in all_cells.items() if n_layers is None or bk[0] < n_layers}
    blocks_present = sorted({b for b, _ in cells})
    matrix_series = []
    for key in KIND_ORDER:
        for stat in STATS.values():
            pts = []
            for b in blocks_present:
                c = cells.get((b, key))
                v = c.value(stat.key, trim) if c else None
                if v is not None and (not stat.log or v + stat.offset > 0):
                    pts.append(_Point(b, v, c.tensor, stat.t(v)))
            if pts:
                matrix_series.append(analyse(_Series(key, stat, pts)))
    findings = _matrix_findings(matrix_series, cells, trim)
    norms, norm_findings = _norms(row)
    findings += norm_findings
    shallow = _shallow(row, cells, trim)
    for m in shallow["matrices"] if shallow else []:
        if m["second_population"] and not any(m["tensor"] in f["tensors"] for f in findings):
            category, severity, reason = _category(m["kind"], [], [cells[(m["block"], m["kind"])]], trim)
            findings.append(
                finding(
                    category,
                    [m["block"]],
                    f"k {m['k']:.4f} <= {REGIME_B_MAX_K}",
                    reason,
                    severity=severity,
                    kinds=[m["kind"]],
                    tensors=[m["tensor"]],
                    what=short_name(m["tensor"]),
                    statistic="k",
                    value=m["k"],
                    expected=1.0,
                    expected_from="the Qwen companion: regime A (clean) has shallow FFN k >= 1.0",
                    deviation=round(m["k"], 4),
                    deviation_type="k against the regime B cut 0.7",
                )
            )
    depth = _depth(row, cells, norms["vectors"], trim)
    blocks = _block_table(row, all_cells, norms["vectors"], trim)
    init_like = depth["init_like_blocks"]
    untrained = "at init" in norms["model_wide"] or len(init_like) >= len(blocks_present) / 2
    if init_like and not untrained:
        findings += [
            finding(
                "init-like",
                [b],
                f"all matrices within {INIT_K_TOL} of k0 = {INIT_ANCHOR_K}, max/q99 < {INIT_MAX_Q99}, norms at init",
                "every matrix still looks like its Gaussian init (seed 000: deep-layer stagnation)",
                statistic="k",
                value=None,
                expected=INIT_ANCHOR_K,
                expected_from="the half-normal init anchor",
                deviation=None,
                deviation_type=None,
            )
            for b in init_like
        ]
    findings = _finish(findings)
    for b in blocks:
        # Model-wide findings would tag every block; the table lists what singles a block out.
        b["findings"] = [
            f["id"] for f in findings if b["block"] in f["blocks"] and not f["category"].endswith("model-wide")
        ]
        b["init_like"] = b["block"] in init_like
    sw = _super_weights(row, trim, top)
    for b in blocks:
        pb = next((x for x in sw["blocks"] if x["block"] == b["block"]), None)
        b["max_over_q99"] = pb["max_over_q99"] if pb else None
        b["kurtosis"] = pb["kurtosis"] if pb else None
    quant = _quantization(row)
    arch = _architecture(row, blocks)
    report = {
        "schema": "weightdiag.report/1",
        "model": {k: model.get(k) for k in ("id", "revision", "source", "location", "format", "fingerprint")},
        "protocol": {"name": row["protocol"]["name"], "trim": trim},
        "architecture": arch,
        "blocks": blocks,
        "findings": findings,
        "norms": norms,
        "super_weights": sw,
        "depth": depth,
        "shallow_ffn": shallow,
        "quantization": quant,
        "cuts": {
            "robust_z": Z_CUT,
            "neighbours": NEIGHBOURS,
            "min_blocks": MIN_BLOCKS,
            "statistics": {
                s.key: {"log": s.log, "scale_floor": s.floor, "min_effect": s.min_effect}
                for s in (*STATS.values(), NORM_STAT)
            },
        },
    }
    report["observations"] = _observations(report, row)
    return report


def _observations(report: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """Model-level statements, each one line."""
    a = report["architecture"]
    lines = [
        f"{a['family'] or 'unknown family'}: {a['n_layers']} blocks, d_model {a['d_model']}, attention {a['attention']}"
        + (f" (heads {a['heads']})" if a["heads"] else "")
        + f", {a['norm_type'] or 'unknown norm'} {_PLACEMENT_NAME.get(a['norm_placement'] or '', 'unknown placement')}"
        + f" ({a['placement_evidence']}), QK-norm {'yes' if a['qk_norm'] else 'no'}, biases "
        + (
            ", ".join(a["biases"])
            if isinstance(a["biases"], tuple | list) and a["biases"]
            else "none"
            if a["biases"] == ()
            else str(a["biases"])
        )
    ]
    if report["quantization"]["quantized"]:
        lines.append(report["quantization"]["text"])
    norms = report["norms"]
    if norms["block_regimes"]:
        regimes = ", ".join(f"{n} {r}" for r, n in sorted(norms["block_regimes"].items(), key=lambda x: -x[1]))
        lines.append(f"block norm weights: {regimes} (seed 001 cuts: collapse < 0.4 √d, explosion > 1.8 √d)")
    if "at init" in norms["model_wide"]:
        lines.append("most norm weights are exactly at their all-ones init: an untrained or synthetic checkpoint")
    for r in norms["singled_out"]:
        lines.append(
            f"{_SINGLED.get(r['site'], r['site'] + ' norm')} {r['name']}: ‖γ‖ = {r['l2']:.4g} = "
            f"{r['ratio']:.3f} √d, {r['regime']}"
        )
    lines += _super_weight_text(report["super_weights"], a["n_layers"])
    depth = report["depth"]
    lines.append(depth["reading"])
    lines.append(depth["stretch_text"])
    lines += _selection_text(depth, row["architecture"])
    n_blocks = len(report["blocks"])
    if depth["init_like_blocks"] and (
        len(depth["init_like_blocks"]) >= n_blocks / 2 or "at init" in norms["model_wide"]
    ):
        lines.append(
            f"{len(depth['init_like_blocks'])} of {n_blocks} blocks still look like their Gaussian init (k within "
            f"{INIT_K_TOL} of {INIT_ANCHOR_K}, no outliers): untrained, or a synthetic checkpoint"
        )
    sh = report["shallow_ffn"]
    if sh:
        lines.append(
            f"shallow FFN (blocks 0-5): min k {sh['shallow_min_k']:.3f}, regime {sh['regime']} (A: >= 1.0, B: <= 0.7; "
            f"nearest companion entry {sh['nearest_companion']['entry']} at {sh['nearest_companion']['shallow_min_k']})"
        )
    if len(report["blocks"]) < MIN_BLOCKS:
        lines.append(f"only {len(report['blocks'])} blocks: too few for a depth trend, so no robust findings")
    return lines

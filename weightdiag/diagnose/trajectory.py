"""Read a training run from its rows: k and lambda over steps, drift, lambda peaks, init checks, std patterns.

Everything here works on rows (one per revision, as written by `weightdiag sweep`), never on
weights. Cuts for the layer-wise std patterns (the anomaly table of the "Layer-wise Weight Standard
Deviation Reference Manual", made quantitative here):
- exploding inflation: a block's std reaches > 5x its first value and > 3x the median block's
  peak growth, or any checkpoint holds NaN/Inf weights;
- deep-layer stagnation: the deepest third of blocks moves by < 5% (median) while the shallowest
  third grows by > 20% and at least 4x as much;
- global oscillation: >= 75% of blocks reverse direction at least twice, each swing > 5% of std;
- undifferentiated evolution: every block grows by > 10% and the spread of growth across blocks is
  < 15% of the median growth;
- no movement: every block's std within 1% of its first value at every step (identical checkpoints);
- otherwise differentiated evolution (healthy: depths move at their own pace).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from ..citations import LAYERWISE_STD_SHORT
from ..vocabulary import COHORT_TRIM, FFN_OUTPUT_KINDS, SELECTION_KINDS, WEIGHT_KINDS
from .classes import BAND, INIT_ANCHOR_K, fitted_values, k_sigma
from .functions import lambda_paired_correlation
from .kinds import at_trim
from .lambda_axis import state_of
from .results import TrajectoryResult

INPUT_SIDE = {"qkv": "o", "ffn_in": "ffn_out", "up": "down", "gate": "down"}  # in/out pairs of App. A.3
STEP0_Z = 4.0  # standard errors of k allowed between a step-0 matrix and the anchor


def _step(row: Mapping[str, Any]) -> int | None:
    hp = row.get("hyperparameters") or {}
    if "step" in (hp.get("source") or "") and hp.get("steps") is not None:
        return int(hp["steps"])
    from .lambda_axis import step_from_revision

    return step_from_revision(row["model"].get("revision"))


def ordered(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """(step, row) for rows with a step number, ascending; one row per step (the newest)."""
    by_step: dict[int, Mapping[str, Any]] = {}
    for row in rows:
        step = _step(row)
        if step is None:
            continue
        if step not in by_step or (row.get("created") or "") > (by_step[step].get("created") or ""):
            by_step[step] = row
    return sorted(by_step.items())


def stepless(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The revisions (else fingerprints) of the rows that have no step number (a sweep's `main`): what a
    trajectory leaves off its step axis, said rather than dropped (issue 42)."""
    return sorted({str(r["model"].get("revision") or r["model"].get("fingerprint")) for r in rows if _step(r) is None})


# --- learning-rate schedules (for T/tau with decay) -----------------------------------------------


def lr_integral(step: float, total: float, warmup: float, schedule: str, min_ratio: float) -> float:
    """Sum of eta(t) / eta_peak over the first `step` steps (continuous approximation)."""
    if schedule == "constant":
        return step
    if schedule != "cosine":
        raise ValueError(f"unknown schedule {schedule!r}")
    w = min(step, warmup)
    area = w * w / (2 * warmup) if warmup > 0 else 0.0
    if step > warmup:
        span = max(total - warmup, 1.0)
        x = min(step, total) - warmup
        # integral of min + (1 - min) (1 + cos(pi u / span)) / 2 over [0, x]
        area += min_ratio * x + (1 - min_ratio) * (x / 2 + span / (2 * math.pi) * math.sin(math.pi * x / span))
        if step > total:
            area += min_ratio * (step - total)
    return area


def t_over_tau_at(step: int, hp: dict[str, Any], schedule: dict[str, Any] | None) -> float | None:
    lr, wd = hp.get("lr"), hp.get("weight_decay")
    if not lr or not wd:
        return None
    if not schedule or schedule.get("kind", "constant") == "constant":
        return step * lr * wd
    effective = lr_integral(
        step, schedule["total"], schedule.get("warmup", 0), schedule["kind"], schedule.get("min_ratio", 0.1)
    )
    return effective * lr * wd


# --- the pieces ------------------------------------------------------------------------------------


def _kind_series(points: list[tuple[int, Mapping[str, Any]]]) -> dict[str, dict[str, list]]:
    series: dict[str, dict[str, list]] = {}
    for step, row in points:
        for kind, s in row["kinds"].items():
            if kind not in WEIGHT_KINDS or s.get("k_median") is None:
                continue
            entry = series.setdefault(kind, {"steps": [], "k": [], "lambda": []})
            entry["steps"].append(step)
            entry["k"].append(s["k_median"])
            entry["lambda"].append(s["lambda_median"])
    return series


def _lambda_peak(series: dict[str, list]) -> dict[str, Any] | None:
    lam = series["lambda"]
    if len(lam) < 3:
        return None
    i = int(np.argmax(lam))
    peak, final = lam[i], lam[-1]
    return {
        "peak_step": series["steps"][i],
        "peak_lambda": peak,
        "final_lambda": final,
        "retreat_percent": (peak - final) / peak * 100,
        "still_rising": i == len(lam) - 1,
        # Within 1% from first to last: no peak to speak of (identical or barely trained checkpoints).
        "flat": (max(lam) - min(lam)) <= 0.01 * max(abs(v) for v in lam),
    }


def _drift(series: dict[str, dict[str, list]], has_step0: bool) -> dict[str, Any]:
    out = {}
    for kind, s in series.items():
        final = s["k"][-1]
        entry = {"k_final": final, "delta_from_anchor": final - INIT_ANCHOR_K}
        if has_step0 and s["steps"][0] == 0:
            entry.update(k_step0=s["k"][0], delta_from_step0=final - s["k"][0])
        out[kind] = entry
    return out


# A recipe "matches" the measured in/out lambda ratio only this close (the fit's own scatter is well
# under 1%), so a clear miss such as -19% is reported as no match rather than as the closest recipe.
RECIPE_TOLERANCE_PERCENT = 5.0


def step0_checks(row: Mapping[str, Any]) -> dict[str, Any]:
    """At initialisation: k of every block at the anchor, in/out lambda ratios of App. A.3, norms at sqrt(d)."""
    k_off = []
    for m in row["matrices"]:
        fit = m["fits"][COHORT_TRIM]
        if m["kind"] not in WEIGHT_KINDS or not fit["ok"]:
            continue
        # k's standard error (classes.k_sigma: sampling plus hist1024's bin phase), at 4 rather than 3
        # standard errors because "every matrix at the anchor" is one claim over many matrices.
        tolerance = STEP0_Z * k_sigma(INIT_ANCHOR_K, fitted_values(m) or m["numel"])
        if abs(fit["k"] - INIT_ANCHOR_K) > tolerance:
            k_off.append({"name": m["name"], "block": m["block"], "k": fit["k"], "tolerance": tolerance})
    ratios = []
    by_block: dict[int, dict[str, float]] = {}
    for m in row["matrices"]:
        if m["block"] is not None and m["fits"][COHORT_TRIM]["ok"]:
            by_block.setdefault(m["block"], {})[m["kind"]] = m["fits"][COHORT_TRIM]["lambda"]
    for kinds in by_block.values():
        for inner, outer in INPUT_SIDE.items():
            if inner in kinds and outer in kinds:
                ratios.append(kinds[inner] / kinds[outer])
    arch = row.get("architecture") or {}
    n_layers = arch.get("n_layers")
    recipe = None
    measured = float(np.mean(ratios)) if ratios else None
    if measured and n_layers:
        predictions = {
            "small_init + wang_init (L / sqrt(10))": n_layers / math.sqrt(10),
            "normal + scaled_normal (sqrt(2L))": math.sqrt(2 * n_layers),
            "same sigma for all (1)": 1.0,
        }
        name, value = min(predictions.items(), key=lambda kv: abs(math.log(measured / kv[1])))
        recipe = {
            "measured_in_out_ratio": measured,
            "predictions": predictions,
            "closest": name,
            "error_percent": (measured / value - 1) * 100,
            "tolerance_percent": RECIPE_TOLERANCE_PERCENT,
            "matches": abs(measured / value - 1) * 100 <= RECIPE_TOLERANCE_PERCENT,
        }
    norms_off = [
        {"name": v["name"], "l2_over_sqrt_d": v["l2_over_sqrt_d"]}
        for v in row["vectors"]
        if v["kind"] == "norm"
        and v.get("param") == "weight"
        and v.get("l2_over_sqrt_d") is not None
        and abs(v["l2_over_sqrt_d"] - 1.0) > 1e-3
    ]
    n_norms = sum(1 for v in row["vectors"] if v["kind"] == "norm" and v.get("param") == "weight")
    return {
        "k_at_anchor": not k_off,
        "k_off_anchor": k_off,
        "lambda_ratio": recipe,
        "norms_at_sqrt_d": not norms_off,
        "norms_checked": n_norms,
        "norms_off": norms_off,
    }


def block_std(points: list[tuple[int, Mapping[str, Any]]]) -> tuple[list[int], list[int], np.ndarray]:
    """(steps, blocks, std[step, block]): per block the median std over its attention/FFN matrices."""
    steps = [s for s, _ in points]
    blocks = sorted(
        {m["block"] for _, r in points for m in r["matrices"] if m["block"] is not None and m["kind"] in WEIGHT_KINDS}
    )
    table = np.full((len(steps), len(blocks)), np.nan)
    col = {b: i for i, b in enumerate(blocks)}
    for i, (_, row) in enumerate(points):
        values: dict[int, list[float]] = {}
        for m in row["matrices"]:
            if m["block"] is not None and m["kind"] in WEIGHT_KINDS and m["stats"].get("std"):
                values.setdefault(m["block"], []).append(m["stats"]["std"])
        for b, v in values.items():
            table[i, col[b]] = float(np.median(v))
    return steps, blocks, table


def std_pattern(points: list[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """Name the layer-wise std evolution (the layer-wise std manual's patterns) with its evidence."""
    steps, blocks, table = block_std(points)
    nonfinite = [
        (step, m["name"])
        for step, r in points
        for m in r["matrices"]
        if (m["stats"].get("n_nan") or 0) + (m["stats"].get("n_inf") or 0) > 0
    ]
    if len(steps) < 2 or not blocks:
        return {"pattern": "unknown", "evidence": "fewer than two checkpoints with per-block statistics"}
    rel = table / table[0]
    growth = rel[-1] - 1
    peak_growth = np.nanmax(rel, axis=0)
    third = max(1, len(blocks) // 3)
    shallow, deep = growth[:third], growth[-third:]
    evidence: dict[str, Any] = {
        "blocks": blocks,
        "growth_percent": [float(g * 100) for g in growth],
        "shallow_median_growth_percent": float(np.nanmedian(shallow) * 100),
        "deep_median_growth_percent": float(np.nanmedian(deep) * 100),
    }
    exploding = [b for b, p in zip(blocks, peak_growth, strict=True) if p > 5 and p > 3 * np.nanmedian(peak_growth)]
    if nonfinite or exploding:
        where = f"blocks {exploding}" if exploding else ""
        bad = f"non-finite weights in {nonfinite[0][1]} at step {nonfinite[0][0]}" if nonfinite else ""
        return {
            "pattern": "exploding inflation",
            "blocks": exploding,
            "evidence": evidence,
            "summary": "; ".join(x for x in (f"runaway std growth in {where}" if where else "", bad) if x),
        }
    deep_move, shallow_move = float(np.nanmedian(np.abs(deep))), float(np.nanmedian(shallow))
    if deep_move < 0.05 and shallow_move > 0.2 and shallow_move > 4 * deep_move:
        stagnant = [b for b, g in zip(blocks, growth, strict=True) if abs(g) < 0.05]
        return {
            "pattern": "deep-layer stagnation",
            "blocks": stagnant,
            "evidence": evidence,
            "summary": f"deep blocks moved {deep_move * 100:.1f}% (median) while shallow blocks grew "
            f"{shallow_move * 100:.0f}%: blocks {stagnant} barely left their init",
        }
    if len(steps) >= 4:
        diffs = np.diff(table, axis=0) / table[:-1]
        signs = np.where(np.abs(diffs) > 0.05, np.sign(diffs), 0)
        reversals = [int(np.sum(np.abs(np.diff(col[col != 0])) == 2)) for col in signs.T]
        if np.mean([r >= 2 for r in reversals]) >= 0.75:
            return {
                "pattern": "global oscillation",
                "evidence": {**evidence, "reversals": reversals},
                "summary": f"{sum(r >= 2 for r in reversals)} of {len(blocks)} blocks swing back and forth "
                "(>= 2 reversals of > 5%)",
            }
    if np.all(np.abs(rel - 1) < 0.01):  # every block within 1% of its first value at every step
        return {
            "pattern": "no movement",
            "evidence": evidence,
            "summary": "every block's std stays within 1% of its first value: the checkpoints barely differ "
            "(identical copies, or too few steps apart to tell)",
        }
    median_growth = float(np.nanmedian(growth))
    if np.all(growth > 0.1) and (np.nanmax(growth) - np.nanmin(growth)) < 0.15 * median_growth:
        return {
            "pattern": "undifferentiated evolution",
            "evidence": evidence,
            "summary": f"all depths grew together ({np.nanmin(growth) * 100:.0f}-{np.nanmax(growth) * 100:.0f}%)",
        }
    return {
        "pattern": "differentiated evolution",
        "evidence": evidence,
        "summary": f"shallow blocks grew {shallow_move * 100:.0f}% and deep blocks "
        f"{float(np.nanmedian(deep)) * 100:.0f}% (median): depths move at their own pace",
    }


def trajectory(rows: Sequence[Mapping[str, Any]], schedule: dict[str, Any] | None = None) -> TrajectoryResult:
    """The whole reading of a run; `schedule` = {"kind": "cosine", "total": T, "warmup": W, "min_ratio": r}."""
    points = [(step, at_trim(row, COHORT_TRIM)) for step, row in ordered(rows)]
    if not points:
        return {"steps": [], "findings": ["no rows with a step number (revisions named step*, checkpoint-*)"]}
    series = _kind_series(points)
    has_step0 = points[0][0] == 0
    out: dict[str, Any] = {
        "model": points[-1][1]["model"]["id"],
        "steps": [s for s, _ in points],
        "revisions": [r["model"].get("revision") for _, r in points],
        "kinds": series,
        "drift": _drift(series, has_step0),
        "duplicates": {r["model"]["revision"]: r["duplicate_of"] for _, r in points if r.get("duplicate_of")},
        "band": list(BAND),
        "findings": [],
    }
    o_kind = "o" if "o" in series else None
    out_kind = next((k for k in FFN_OUTPUT_KINDS if k in series), None)
    if o_kind and out_kind:
        out["paired_lambda"] = lambda_paired_correlation(series[o_kind]["lambda"], series[out_kind]["lambda"])
    if o_kind:
        out["lambda_o_peak"] = _lambda_peak(series[o_kind])
    hp = points[-1][1].get("hyperparameters") or {}
    states = []
    for step, _ in points:
        ratio = t_over_tau_at(step, hp, schedule)
        states.append({"step": step, "t_over_tau": ratio, "state": state_of(ratio)})
    out["states"] = states
    out["schedule"] = schedule or {"kind": "constant"}
    if has_step0 and points[0][1]["matrices"]:
        out["step0"] = step0_checks(points[0][1])
    out["std_pattern"] = std_pattern([(s, r) for s, r in points if r["matrices"]])
    out["findings"] = _findings(out)
    if schedule and schedule.get("kind") == "cosine" and not (hp.get("lr") and hp.get("weight_decay")):
        out["findings"].append(
            "the cosine schedule was not used: the rows carry no learning rate and weight decay, so T/τ stays "
            "unknown (sweep again with --lr and --weight-decay, or a --preset)"
        )
    return cast(TrajectoryResult, out)


def _findings(t: dict[str, Any]) -> list[str]:
    lines = []
    for kind, d in t["drift"].items():
        if kind in SELECTION_KINDS and "delta_from_step0" in d:
            lines.append(
                f"{kind}: k went from {d['k_step0']:.4f} at step 0 to {d['k_final']:.4f} "
                f"(Δk {d['delta_from_step0']:+.4f}; {d['delta_from_anchor']:+.4f} from the anchor 1.2054)"
            )
    peak = t.get("lambda_o_peak")
    if peak:
        if peak.get("flat"):
            lines.append(f"λ_O stays within 1% over the run ({peak['final_lambda']:.5g}): no peak, no retreat")
        elif peak["still_rising"]:
            lines.append(f"λ_O is still rising at the last step ({peak['final_lambda']:.5g}): unsaturated training")
        else:
            lines.append(
                f"λ_O peaked at step {peak['peak_step']} ({peak['peak_lambda']:.5g}) and retreated "
                f"{peak['retreat_percent']:.0f}% by step {t['steps'][-1]}"
            )
    paired = t.get("paired_lambda")
    if paired and paired["pearson_r_loglog"] is not None:
        lines.append(
            f"λ_O and λ_FFN_out move together over steps: log-log r = {paired['pearson_r_loglog']:.4f} "
            f"(n = {paired['n']}; Ding 2026: 0.9967 for Pythia)"
        )
    if t["duplicates"]:
        lines.append("identical checkpoints: " + ", ".join(f"{a} = {b}" for a, b in t["duplicates"].items()))
    step0 = t.get("step0")
    if step0:
        if step0["k_at_anchor"]:
            lines.append("step 0: every matrix's k is at the half-normal anchor 1.2054 (within sampling noise)")
        else:
            off = step0["k_off_anchor"]
            first = off[0]
            lines.append(f"step 0: {len(off)} matrices off the anchor 1.2054, e.g. {first['name']} k {first['k']:.4f}")
        if step0["lambda_ratio"]:
            r = step0["lambda_ratio"]
            lines.append(
                f"step 0: input/output λ ratio {r['measured_in_out_ratio']:.3f} matches {r['closest']} "
                f"({r['error_percent']:+.2f}%, within ±{r['tolerance_percent']:g}%)"
                if r["matches"]
                else f"step 0: input/output λ ratio {r['measured_in_out_ratio']:.3f} matches no known init recipe "
                f"within ±{r['tolerance_percent']:g}% (closest: {r['closest']}, {r['error_percent']:+.2f}%)"
            )
        lines.append(
            f"step 0: all {step0['norms_checked']} norm vectors at sqrt(d)"
            if step0["norms_at_sqrt_d"]
            else f"step 0: {len(step0['norms_off'])} norm vectors not at sqrt(d), e.g. "
            f"{step0['norms_off'][0]['name']} {step0['norms_off'][0]['l2_over_sqrt_d']:.4f}"
        )
    pattern = t.get("std_pattern")
    if pattern and pattern["pattern"] != "unknown":
        lines.append(f"layer-wise std ({LAYERWISE_STD_SHORT}): {pattern['pattern']}: {pattern.get('summary', '')}")
    known = [s for s in t["states"] if s["t_over_tau"] is not None]
    if known:
        lines.append(f"T/τ at the last step: {known[-1]['t_over_tau']:.3g} ({known[-1]['state']})")
    return lines

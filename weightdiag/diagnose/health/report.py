"""`health_report(row)`: the whole report of one row, assembled from the other modules, and its
model-level observation lines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

from ...errors import RowUseError
from ...vocabulary import BLOCK_KEYS, kind_order
from ..classes import INIT_ANCHOR_K
from ..compare import REGIME_B_MAX_K
from ..results import HealthReport
from .blocks import architecture_summary, block_table, quantization_summary, shallow_ffn
from .cells import SHARED, gather_cells, q99_exact, shared_key, short_name
from .cuts import INIT_K_TOL, INIT_MAX_Q99, MIN_BLOCKS, NEIGHBOURS, NORM_STAT, STATS, Z_CUT
from .depth import PLACEMENT_NAME, depth_profile, selection_text
from .experts import expert_findings, moe_section, moe_text
from .findings import category_of, finding, finish, matrix_findings
from .nonfinite import nonfinite_findings
from .norms import SINGLED, analyse_norms
from .robust import Point, Series, analyse
from .spectrum import spectrum_findings, spectrum_section
from .superweights import super_weight_text, super_weights
from .towers import split_towers, tower_section, tower_text


def health_report(row: Mapping[str, Any], top: int = 10, trim: str | None = None) -> HealthReport:
    """Everything `weightdiag report` shows for one row (JSON-able)."""
    model = row.get("model", {})
    if not row.get("matrices"):
        what = (
            "a cohort summary (per-kind medians only)" if model.get("source") == "cohort" else "a row without matrices"
        )
        raise RowUseError(
            f"{model.get('id', 'this row')} is {what}; the report needs per-matrix data: give the model itself "
            "(a folder, file or Hub id) so it can be fitted",
            model_id=model.get("id"),
        )
    trim = trim or row["protocol"]["trim"]
    full_row = row
    # Vision/audio towers number their layers like the language model: every section below reads the
    # language model alone, and the towers get their own (towers.py).
    row, tower_records = split_towers(row)
    towers = tower_section(tower_records, trim)
    all_cells = gather_cells(row)
    n_layers = row["architecture"].get("n_layers")
    # MTP layers (numbered after the main stack) are not part of the depth profile; the table lists them.
    cells = {bk: c for bk, c in all_cells.items() if n_layers is None or bk[0] < n_layers}
    blocks_present = sorted({b for b, _ in cells})
    shared_keys = sorted({k for _, k in cells if shared_key(k)}, key=lambda k: kind_order(k[len(SHARED) :]))
    matrix_series = []
    for key in (*BLOCK_KEYS, *shared_keys):
        for stat in STATS.values():
            pts = []
            for block in blocks_present:
                c = cells.get((block, key))
                if c is None:
                    continue
                v = c.value(stat.key, trim)
                if v is not None and (not stat.log or v + stat.offset > 0):
                    # k of one fit scatters by 1.2/sqrt(n) (Gaussian matrices; depth.py's tolerances).
                    noise = 1.2 / math.sqrt(c.records[0]["numel"]) if stat.key == "k" else 0.0
                    approximate = stat.key == "max_over_q99" and not q99_exact(c.records[0])
                    pts.append(Point(block, v, c.tensor, stat.t(v), noise=noise, approximate=approximate))
            # Dense blocks and MoE blocks (DeepSeek's first dense layers, then experts of another width) are
            # two populations: each is its own series over depth, never one trend across both.
            routed = {b for b in blocks_present if (b, key) in cells and cells[(b, key)].experts}
            for part in ([p for p in pts if p.block not in routed], [p for p in pts if p.block in routed]):
                if part:
                    matrix_series.append(analyse(Series(key, stat, part)))
    moe = moe_section(row, trim)
    findings = nonfinite_findings(row) + matrix_findings(matrix_series, cells, trim) + expert_findings(moe)
    for t in towers:
        findings += t.pop("_nonfinite")
    norms, norm_findings = analyse_norms(row)
    findings += norm_findings
    spectral, spectrum_note = spectrum_findings(row["matrices"])  # fit --spectrum: alpha out of band
    findings += spectral
    shallow = shallow_ffn(row, cells, trim)
    for m in shallow["matrices"] if shallow else []:
        if m["second_population"] and not any(m["tensor"] in f["tensors"] for f in findings):
            category, severity, reason = category_of(m["kind"], [], [cells[(m["block"], m["kind"])]], trim)
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
    depth = depth_profile(row, cells, norms["vectors"], trim)
    blocks = block_table(row, all_cells, norms["vectors"], trim)
    init_like = depth["init_like_blocks"]
    untrained = "at init" in norms["model_wide"] or len(init_like) >= len(blocks_present) / 2
    if depth["stagnant_blocks"] and not untrained:
        findings += [
            finding(
                "init-like",
                [b],
                f"all matrices within {INIT_K_TOL} (or their fit noise) of k0 = {INIT_ANCHOR_K}, "
                f"max/q99 < {INIT_MAX_Q99}, norms at init",
                "every matrix still looks like its Gaussian init (deep-layer stagnation in the Layer-wise Weight "
                "Standard Deviation Reference Manual)",
                statistic="k",
                value=None,
                expected=INIT_ANCHOR_K,
                expected_from="the half-normal init anchor",
                deviation=None,
                deviation_type=None,
            )
            for b in depth["stagnant_blocks"]
        ]
    findings = finish(findings)
    for b in blocks:
        # Model-wide findings would tag every block; the table lists what singles a block out.
        b["findings"] = [
            f["id"] for f in findings if b["block"] in f["blocks"] and not f["category"].endswith("model-wide")
        ]
        b["init_like"] = b["block"] in init_like
    sw = super_weights(row, trim, top)
    for b in blocks:
        pb = next((x for x in sw["blocks"] if x["block"] == b["block"]), None)
        b["max_over_q99"] = pb["max_over_q99"] if pb else None
        b["kurtosis"] = pb["kurtosis"] if pb else None
    quant = quantization_summary(full_row)  # quantized towers are named too: the quantization is the file's
    arch = architecture_summary(row, blocks)
    report: dict[str, Any] = {
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
        "moe": moe,
        "towers": towers,
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
    spectrum = spectrum_section(row["matrices"], findings)
    if spectrum is not None:
        report["spectrum"] = spectrum
    report["observations"] = _observations(report, row) + ([spectrum_note] if spectrum_note else [])
    return cast(HealthReport, _finite(report))


def _finite(value: Any) -> Any:
    """The report with every NaN or infinite number replaced by None (not measurable): it is JSON
    (allow_nan=False), and a diverged checkpoint must not turn into an unreadable report."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_finite(v) for v in value)
    return value


def _observations(report: dict[str, Any], row: Mapping[str, Any]) -> list[str]:
    """Model-level statements, each one line."""
    a = report["architecture"]
    lines = [
        f"{a['family'] or 'unknown family'}: {a['n_layers']} blocks, d_model {a['d_model']}, attention {a['attention']}"
        + (f" (heads {a['heads']})" if a["heads"] else "")
        + f", {a['norm_type'] or 'unknown norm'} {PLACEMENT_NAME.get(a['norm_placement'] or '', 'unknown placement')}"
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
        lines.append(
            f"block norm weights: {regimes} (cuts of “Why √d_model Is Your North Star”: "
            "collapse < 0.4 √d, explosion > 1.8 √d)"
        )
    for r in norms["singled_out"]:
        lines.append(
            f"{SINGLED.get(r['site'], r['site'] + ' norm')} {r['name']}: ‖γ‖ = {r['l2']:.4g} = "
            f"{r['ratio']:.3f} √d, {r['regime']}"
        )
    lines += moe_text(report["moe"])
    lines += super_weight_text(report["super_weights"], a["n_layers"])
    depth = report["depth"]
    lines.append(depth["reading"])
    lines.append(depth["stretch_text"])
    lines += selection_text(depth, row["architecture"])
    n_blocks = len(report["blocks"])
    # Untrained or synthetic is a model-wide verdict, said once, with both kinds of evidence.
    norms_at_init = "at init" in norms["model_wide"]
    init_like = depth["init_like_blocks"]
    if norms_at_init or (init_like and len(init_like) >= n_blocks / 2):
        evidence = ["most norm weights are exactly at their all-ones init"] if norms_at_init else []
        if init_like:
            evidence.append(
                f"{len(init_like)} of {n_blocks} blocks still look like their Gaussian init (k within "
                f"{INIT_K_TOL} of {INIT_ANCHOR_K} or the fit noise of small matrices, no outliers)"
            )
        lines.append(" and ".join(evidence) + ": an untrained or synthetic checkpoint")
    sh = report["shallow_ffn"]
    if sh:
        lines.append(
            f"shallow FFN (blocks {sh.get('shallow_blocks', '0-5')}): min k {sh['shallow_min_k']:.3f}, "
            f"regime {sh['regime']} (A: >= 1.0, B: <= 0.7; "
            f"nearest companion entry {sh['nearest_companion']['entry']} at {sh['nearest_companion']['shallow_min_k']})"
        )
    lines += tower_text(report["towers"])
    if len(report["blocks"]) < MIN_BLOCKS:
        lines.append(f"only {len(report['blocks'])} blocks: too few for a depth trend, so no robust findings")
    return lines

"""The report's spectrum section and its findings: layers whose alpha leaves WeightWatcher's 2-6 band.

Rules, each checked against null models (tests/test_spectrum_report.py: Gaussian matrices of several aspect
ratios at realistic sizes, many seeds) and planted layers:

- Only matrices with at least SMALL_N = 20 eigenvalues (below that WeightWatcher switches to its
  small-sample fit; a [2, 384] token-type embedding's "alpha" comes from 2 eigenvalues) and a successful
  power-law fit are read.
- alpha < 2 (WeightWatcher's 'over-trained': a tail heavier than the band) from at least MIN_TAIL tail
  eigenvalues: a finding (warning) per matrix. A Gaussian matrix's ESD is a Marchenko-Pastur bulk whose hard
  edge gives a light fitted tail: over 270 Gaussian matrices of aspect ratios 1 to 8 and sides 384 to 4096
  (benchmarks/calibrate_spectrum.py) the smallest alpha was 4.37 and none had a spike; a layer of
  heavy-tailed entries (Cauchy: alpha in (1.2, 2)) is found. A planted low-rank spike has a tail of r
  eigenvalues: a power law fitted to fewer than MIN_TAIL points is not read as one (num_spikes counts it).
- alpha > 6 ('under-trained': a tail as light as a random matrix's): a finding (notice) per matrix, unless
  the model's ESDs look random model-wide: at least MODEL_WIDE of its matrices have no eigenvalue beyond the
  Marchenko-Pastur bulk edge (num_spikes 0; every Gaussian matrix above, none of MiniLM's trained ones but its
  pooler). Then it is one observation, not a finding per layer (as the report treats init-like blocks): an
  untrained or synthetic checkpoint, whose Gaussian layers mostly fit alpha 7-35.

The evidence of every finding: alpha, D (the fit's Kolmogorov-Smirnov distance), xmin, the number of tail
eigenvalues fitted (num_pl_spikes) out of the matrix's, sigma (alpha's standard error), num_spikes
(eigenvalues beyond the Marchenko-Pastur bulk edge) and FARMS' alpha when taken.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from statistics import median
from typing import Any

from ..spectrum import BAND, fitted_alpha, spectra_of, spectrum_kinds
from .cells import short_name
from .findings import finding

MODEL_WIDE = 0.5  # this share of the matrices with no Marchenko-Pastur spike or more: random-like model-wide
SMALL_N = 20  # eigenvalues a matrix needs for its alpha to be read (WeightWatcher's small-sample cut-off)
MIN_TAIL = 10  # tail eigenvalues an alpha below the band needs to be read as a heavy tail
ESD_PLOTS = 8  # layers whose ESD the report draws: the findings' first, then the extremes of alpha


def _evidence(m: Mapping[str, Any], s: Mapping[str, Any], edge: float, side: str) -> dict[str, Any]:
    return {
        "statistic": "alpha",
        "value": s["alpha"],
        "expected": edge,
        "expected_from": f"WeightWatcher's alpha band {BAND[0]:g}-{BAND[1]:g} ({side} outside it)",
        "deviation": round(s["alpha"] - edge, 3),
        "deviation_type": "alpha minus the band's edge",
        "D": s["D"],
        "xmin": s["xmin"],
        "num_pl_spikes": s["num_pl_spikes"],
        "num_evals": s["num_evals"],
        "sigma": s["sigma"],
        "num_spikes": s["num_spikes"],
        **({"alpha_farms": s["alpha_farms"]} if "alpha_farms" in s else {}),
    }


def _summary(s: Mapping[str, Any], relation: str) -> str:
    return (
        f"alpha {s['alpha']:.2f} {relation} (D {s['D']:.3f}, xmin {s['xmin']:.4g}, "
        f"{s['num_pl_spikes']} tail eigenvalues of {s['num_evals']})"
    )


def spectrum_findings(matrices: list[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """(findings, model-wide observation or None) for the language model's matrices with spectra."""
    fitted = [(m, s) for m, s in spectra_of(matrices) if fitted_alpha(s) is not None and s["num_evals"] >= SMALL_N]
    if not fitted:
        return [], None
    above = [(m, s) for m, s in fitted if s["alpha"] > BAND[1]]
    bulk_only = [(m, s) for m, s in fitted if s["num_spikes"] == 0]
    model_wide = len(bulk_only) >= MODEL_WIDE * len(fitted)
    out = []
    for m, s in fitted:
        block = m.get("block")
        kinds, tensors, what = [m["kind"]], [m["name"]], short_name(m["name"])
        blocks = [block] if block is not None else []
        if s["alpha"] < BAND[0] and s["num_pl_spikes"] >= MIN_TAIL:
            out.append(
                finding(
                    "spectrum-heavy",
                    blocks,
                    _summary(s, f"< {BAND[0]:g}"),
                    "a heavier tail of the ESD than WeightWatcher's band ('over-trained'): a few directions carry "
                    "much of the matrix's energy",
                    severity="warning",
                    kinds=kinds,
                    tensors=tensors,
                    what=what,
                    **_evidence(m, s, BAND[0], "below"),
                )
            )
        elif s["alpha"] > BAND[1] and not model_wide:
            out.append(
                finding(
                    "spectrum-light",
                    blocks,
                    _summary(s, f"> {BAND[1]:g}"),
                    "an ESD tail as light as a random matrix's, above WeightWatcher's band ('under-trained'), "
                    "while most of the model's matrices are within it",
                    severity="notice",
                    kinds=kinds,
                    tensors=tensors,
                    what=what,
                    **_evidence(m, s, BAND[1], "above"),
                )
            )
    note = None
    if model_wide:
        note = (
            f"spectrum: {len(bulk_only)} of {len(fitted)} matrices have no eigenvalue beyond the Marchenko-Pastur "
            f"bulk edge and {len(above)} have alpha above {BAND[1]:g} (WeightWatcher's 'under-trained'): ESDs of "
            "random matrices model-wide, an untrained or synthetic checkpoint, so no layer is singled out for it"
        )
    return out, note


def spectrum_section(matrices: list[Mapping[str, Any]], findings: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The report's `spectrum`: alpha per kind, alpha by depth per kind (median over experts), and the ESDs
    of a few layers for plots (the findings' matrices first, then the lowest and highest alpha)."""
    with_spectra = list(spectra_of(matrices))
    if not with_spectra:
        return None
    depth: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m, s in with_spectra:
        alpha = fitted_alpha(s)
        if alpha is not None and m.get("block") is not None:
            depth[m["kind"]][m["block"]].append(alpha)
    fitted = [(m, s) for m, s in with_spectra if fitted_alpha(s) is not None and s["num_evals"] >= SMALL_N]
    chosen = [f["tensor"] for f in findings if str(f["category"]).startswith("spectrum-") and f.get("tensor")]
    by_alpha = sorted(fitted, key=lambda ms: ms[1]["alpha"])
    for m, _ in (by_alpha[:1] + by_alpha[-1:]) if by_alpha else []:
        chosen.append(m["name"])
    names = list(dict.fromkeys(chosen))[:ESD_PLOTS]
    records = {m["name"]: (m, s) for m, s in with_spectra}
    return {
        "band": list(BAND),
        "kinds": spectrum_kinds(matrices),
        "depth": {
            kind: {str(b): float(median(v)) for b, v in sorted(blocks.items())} for kind, blocks in depth.items()
        },
        "esd": [_esd_entry(*records[name]) for name in names if name in records],
    }


def _esd_entry(m: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("alpha", "xmin", "xmax", "D", "num_pl_spikes", "num_evals", "bulk_max", "num_spikes", "status")
    where = {"name": m["name"], "kind": m["kind"], "block": m.get("block")}
    return {**where, **{k: s.get(k) for k in keys}, "esd": s["esd"]}

"""What a row's spectra say per matrix kind (`spectrum_kinds`), and a row's kinds against other rows'.

alpha is the power-law exponent of the tail of a matrix's ESD as WeightWatcher 0.7.7 fits it (docs/spectrum.md).
WeightWatcher reads alpha against a band: below 2 'over-trained' (a very heavy tail), above 6
'under-trained' (a tail as light as a random matrix's: a Gaussian matrix's ESD is a Marchenko-Pastur bulk
with a hard edge, and its fitted alpha is mostly above 6). The per-kind summary gives the median over the
kind's matrices (blocks and experts) and how many leave the band on each side.

Rows to compare alpha with are rows that have spectra (fitted with --spectrum). The paper's cohort rows
are per-kind Weibull summaries of |w| with no per-matrix data: they have no spectra, and no alpha is made up
for them; `compare` says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from statistics import median
from typing import Any

from ..record.row import json_float
from ..vocabulary import kind_order

# WeightWatcher's band, fit.esd's OVER_TRAINED and UNDER_TRAINED (tests/test_spectrum_report.py checks that
# they agree): not imported from there, since fit.esd loads scipy and every fit interprets its row here.
BAND = (2.0, 6.0)
NO_COHORT_SPECTRA = (
    "the cohort rows have no spectra (per-kind Weibull summaries of |w|, no per-matrix data): alpha is "
    "compared only with fitted rows that have spectra (weightdiag fit --spectrum)"
)


def spectra_of(matrices: Iterable[Mapping[str, Any]]) -> Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(matrix record, spectrum) for every matrix record that has a spectrum (fused parts not included)."""
    for m in matrices:
        spectrum = m.get("spectrum")
        if spectrum is not None:
            yield m, spectrum


def has_spectra(row: Mapping[str, Any]) -> bool:
    """Whether the row (or its summary) holds spectra."""
    if row.get("spectrum_kinds"):
        return True
    return any(True for _ in spectra_of(row.get("matrices") or ()))


def fitted_alpha(spectrum: Mapping[str, Any]) -> float | None:
    """alpha when the power-law fit succeeded, else None."""
    alpha = spectrum.get("alpha")
    return alpha if spectrum.get("status") == "success" and alpha is not None else None


def _median(values: list[float]) -> float | None:
    return json_float(float(median(values))) if values else None


def spectrum_kinds(matrices: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The row's `spectrum_kinds`: per matrix kind, alpha over its matrices with a spectrum."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for m, spectrum in spectra_of(matrices):
        groups[m["kind"]].append(spectrum)
    out: dict[str, Any] = {}
    for kind, spectra in groups.items():
        alphas = [a for a in (fitted_alpha(s) for s in spectra) if a is not None]
        farms = [s["alpha_farms"] for s in spectra if s.get("alpha_farms") is not None]
        out[kind] = {
            "count": len(spectra),
            "fitted": len(alphas),
            "alpha_median": _median(alphas),
            "alpha_min": json_float(min(alphas)) if alphas else None,
            "alpha_max": json_float(max(alphas)) if alphas else None,
            "below_band": sum(1 for a in alphas if a < BAND[0]),
            "above_band": sum(1 for a in alphas if a > BAND[1]),
            "num_spikes_median": _median([float(s["num_spikes"]) for s in spectra if s["num_spikes"] >= 0]),
            "alpha_farms_median": _median(farms),
        }
    return dict(sorted(out.items(), key=lambda item: kind_order(item[0])))


def compare_spectra(row: Mapping[str, Any], peers: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """`compare`'s spectrum section: per kind, this row's median alpha against the rows `peers` ((id, row or
    row summary) with `spectrum_kinds`, this row excluded by the caller); None when this row has no spectra."""
    mine = row.get("spectrum_kinds") or spectrum_kinds(row.get("matrices") or ())
    if not mine:
        return None
    others = [(pid, p["spectrum_kinds"]) for pid, p in peers if p.get("spectrum_kinds")]
    kinds: dict[str, Any] = {}
    for kind, s in mine.items():
        theirs = [(pid, k[kind]["alpha_median"]) for pid, k in others if (k.get(kind) or {}).get("alpha_median")]
        alpha = s["alpha_median"]
        nearest = min(theirs, key=lambda p: abs(p[1] - alpha))[0] if theirs and alpha is not None else None
        kinds[kind] = {
            "alpha": alpha,
            "count": s["count"],
            "below_band": s["below_band"],
            "above_band": s["above_band"],
            "alpha_farms": s.get("alpha_farms_median"),
            "peers_alpha_range": [min(a for _, a in theirs), max(a for _, a in theirs)] if theirs else None,
            "nearest_by_alpha": nearest,
        }
    return {"band": list(BAND), "kinds": kinds, "peers": [pid for pid, _ in others], "cohort": NO_COHORT_SPECTRA}


def compare_lines(section: Mapping[str, Any]) -> list[str]:
    """The comparison's findings, one line each."""
    lines = []
    kinds = section["kinds"]
    outside = {k: (s["below_band"], s["above_band"]) for k, s in kinds.items() if s["below_band"] or s["above_band"]}
    shown = ", ".join(f"{k} {s['alpha']:.2f}" for k, s in section["kinds"].items() if s["alpha"] is not None)
    lines.append(f"spectrum: median alpha per kind {shown} (WeightWatcher's band {BAND[0]:g}-{BAND[1]:g})")
    if outside:
        lines.append(
            "alpha outside the band: "
            + ", ".join(f"{k} {lo} below {BAND[0]:g} and {hi} above {BAND[1]:g}" for k, (lo, hi) in outside.items())
        )
    if not section["peers"]:
        lines.append("no other row in the database has spectra to compare alpha with")
    lines.append(section["cohort"])
    return lines


def holds_spectra_asked(row: Mapping[str, Any], spectrum: bool, farms: bool) -> bool:
    """Whether a row already in the database answers a fit that asks for spectra (--spectrum) and FARMS' alpha
    (--farms): a row without them is fitted again rather than reused."""
    if not (spectrum or farms):
        return True
    run = row.get("run") or {}
    taken = run.get("spectrum") or {}
    return bool(taken) and (taken.get("farms", False) or not farms)

"""Plots of a report's spectra (fit --spectrum): alpha by depth and kind, and the ESD of a few layers on
log-log axes with the fitted power-law tail (the layers with findings first, then the lowest and highest
alpha: health/spectrum.py chooses them; the row holds every matrix's ESD as 64 log-spaced counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..diagnose.health import short_name
from ..diagnose.results import HealthReport
from ..vocabulary import KIND_ORDER
from .plots import PlotFile, block_ticks, literal, safe_name, save_figure


def spectrum_plots(plt: Any, result: HealthReport, folder: Path) -> list[PlotFile]:
    """The spectrum's figures of a report, or none when the row has no spectra."""
    section = result.get("spectrum")
    if not section:
        return []
    files = []
    if section["depth"]:
        files.append(alpha_by_depth(plt, section, folder, experts=bool(result.get("moe"))))
    files += [esd_plot(plt, entry, folder) for entry in section["esd"] if entry["esd"]["counts"]]
    return files


def alpha_by_depth(plt: Any, section: Mapping[str, Any], folder: Path, experts: bool = False) -> PlotFile:
    """alpha against depth per kind; `experts`: a model with routed experts, whose per-block alpha is their median."""
    lo, hi = section["band"]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    ax.axhspan(lo, hi, color="#2e7d32", alpha=0.08, label=f"WeightWatcher's band {lo:g}-{hi:g}")
    order = {k: i for i, k in enumerate(KIND_ORDER)}
    for kind in sorted(section["depth"], key=lambda k: order.get(k, len(order))):
        by_block = section["depth"][kind]
        blocks = sorted(int(b) for b in by_block)
        ax.plot(blocks, [by_block[str(b)] for b in blocks], marker="o", markersize=3, linewidth=1.2, label=kind)
    ax.set_yscale("log")
    from matplotlib.ticker import FormatStrFormatter

    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))  # 6, not 6 x 10^0
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("block")
    ax.set_xticks(block_ticks(max((int(b) for d in section["depth"].values() for b in d), default=0)))
    ax.set_ylabel("alpha (log scale)")
    # "median over experts" only where there are experts (issue 42: said of dense models too)
    ax.set_title("alpha of each matrix's ESD tail by depth and kind" + (" (median over experts)" if experts else ""))
    ax.legend(fontsize=7, ncol=2, loc="best")
    ax.grid(alpha=0.3, which="both")
    path = save_figure(plt, fig, folder / "spectrum_alpha_depth.png")
    caption = (
        "alpha by block for each matrix kind (WeightWatcher 0.7.7's power-law fit of the eigenvalues of WᵀW); "
        f"below {lo:g}: heavier-tailed than its band ('over-trained'), above {hi:g}: as light as a random matrix's"
    )
    return PlotFile(path, "alpha by depth and kind", caption)


def esd_points(esd: Mapping[str, Any], total: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin centres λ, density per unit λ of the whole ESD) of the row's log-spaced counts; empty bins dropped."""
    counts = np.asarray(esd["counts"], dtype=np.float64)
    lo, hi = esd["log10_range"]
    edges = np.logspace(lo, hi, counts.size + 1) if hi > lo else np.array([10**lo * 0.99, 10**hi * 1.01])
    centres = np.sqrt(edges[:-1] * edges[1:])
    density = counts / (max(total, 1) * np.diff(edges))
    keep = counts > 0
    return centres[keep], density[keep]


def esd_plot(plt: Any, entry: Mapping[str, Any], folder: Path) -> PlotFile:
    """One layer's ESD (density of its eigenvalues, log-log) and the power law fitted above xmin, scaled to
    the share of eigenvalues in the tail: p(λ) = (n_tail / M)·(alpha - 1)/xmin·(λ/xmin)^-alpha."""
    total = int(entry["num_evals"] or 0)
    x, y = esd_points(entry["esd"], total)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ax.loglog(x, y, "o", markersize=4, color="#1f4e79", label="ESD (eigenvalues of WᵀW, log bins)")
    alpha, xmin, xmax = entry.get("alpha"), entry.get("xmin"), entry.get("xmax")
    fitted = entry.get("status") == "success"
    if alpha is not None and xmin is not None and xmax is not None and fitted and xmax > xmin > 0:
        tail = np.logspace(np.log10(xmin), np.log10(xmax), 50)
        share = (entry["num_pl_spikes"] or 0) / max(total, 1)
        ax.loglog(
            tail,
            share * (alpha - 1) / xmin * (tail / xmin) ** (-alpha),
            "-",
            color="#c62828",
            linewidth=2,
            label=f"power law, alpha = {alpha:.2f} (D = {entry['D']:.3f})",
        )
        ax.axvline(xmin, color="#c62828", linestyle=":", linewidth=1, label=f"xmin = {xmin:.4g}")
    if entry.get("bulk_max") and entry["bulk_max"] > 0:
        ax.axvline(entry["bulk_max"], color="#555", linestyle="--", linewidth=1, label="Marchenko-Pastur bulk edge")
    ax.set_xlabel("eigenvalue λ = σ² (log)")
    ax.set_ylabel("density (log)")
    ax.set_title(literal(f"ESD of {short_name(entry['name'])}"), fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3, which="both")
    path = save_figure(plt, fig, folder / f"spectrum_esd_{safe_name(entry['name'])}.png")
    fit_text = f"{entry['num_pl_spikes']} tail eigenvalues of {total}" if fitted else "no power-law fit"
    caption = (
        f"{entry['name']}: the density of its {total} eigenvalues; {fit_text}; "
        f"{entry.get('num_spikes')} beyond the Marchenko-Pastur bulk edge"
    )
    return PlotFile(path, f"ESD of {short_name(entry['name'])}", caption)

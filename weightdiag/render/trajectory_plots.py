"""Trajectory plots (matplotlib, the `plot` extra): k and lambda vs step per kind, per-block std heatmap.

Styled after the paper's Figures 10 and 14: a log step axis, the Transmission band [1.186, 1.204] shaded on the
k panel. The axis is symmetric-log (linear from 0 to 1, log above), so that step 0 has a place of its own: drawn at
1 on a plain log axis, it hid under step 1 (issue 33).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..diagnose.classes import INIT_ANCHOR_K
from ..diagnose.results import TrajectoryResult
from .plots import pyplot, save_figure

if TYPE_CHECKING:
    from ..diagnose.results import TrajectoryResult


def _step_axis(ax: Any, last: float) -> None:
    """Steps on a symmetric-log axis: 0 and 1 a linear unit apart, then decades up to `last` (the last step); ticks
    as plain step numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.set_xscale("symlog", linthresh=1.0, linscale=0.6)
    hi = max(last * 1.5, 2.0)
    top = int(np.floor(np.log10(hi)))
    ax.set_xlim(-0.25, hi)
    ax.xaxis.set_major_locator(FixedLocator([0.0] + [10.0**e for e in range(top + 1)]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v < 1e5 else f"1e{np.log10(v):.0f}"))
    ax.set_xlabel("step (0 to 1 linear, log above)")


# Each kind its own marker and dash as well as its colour: kinds whose λ (or k) coincide, as the λ of q, k and v of a
# fused qkv or of tied matrices do, stay visible one over the other (issue 42: a line hidden under another).
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
_DASHES = ("-", "--", "-.", ":")


def k_lambda_plot(t: TrajectoryResult, path: Path) -> Path:
    plt = pyplot()
    fig, (ax_k, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (kind, s) in enumerate(t["kinds"].items()):
        x = np.asarray(s["steps"], dtype=float)
        style = {"marker": _MARKERS[i % len(_MARKERS)], "ls": _DASHES[i % len(_DASHES)], "ms": 4, "alpha": 0.85}
        ax_k.plot(x, s["k"], label=kind, mfc="none", **style)
        ax_l.plot(x, s["lambda"], label=kind, mfc="none", **style)
    ax_k.axhspan(*t["band"], color="gold", alpha=0.35, label="Transmission band")
    ax_k.axhline(INIT_ANCHOR_K, color="grey", ls="--", lw=1, label=f"init anchor {INIT_ANCHOR_K}")
    last = max((max(s["steps"]) for s in t["kinds"].values() if s["steps"]), default=1)
    for ax, label in ((ax_k, "median k"), (ax_l, "median λ")):
        _step_axis(ax, last)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_k.legend(fontsize=7, ncol=2)
    ax_l.legend(fontsize=7, ncol=2)  # the λ panel names its lines too (issue 42)
    fig.suptitle(f"{t['model']}: per-kind median k and λ over training")
    return save_figure(plt, fig, path)


def std_heatmap(steps: list[int], blocks: list[int], table: np.ndarray, model: str, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(steps) + 3), max(4, 0.25 * len(blocks) + 2)))
    relative = table / table[0]
    image = ax.imshow(relative.T, aspect="auto", origin="lower", cmap="viridis")
    ax.set_xticks(range(len(steps)), [str(s) for s in steps], rotation=60, fontsize=7)
    ax.set_yticks(range(len(blocks)), [str(b) for b in blocks], fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("block")
    fig.colorbar(image, ax=ax, label="std / std at the first step")
    ax.set_title(f"{model}: layer-wise std over training")
    return save_figure(plt, fig, path)

"""Trajectory plots (matplotlib, the `plot` extra): k and lambda vs step per kind, per-block std heatmap.

Styled after the paper's Figures 10 and 14: log step axis (step 0 drawn at step 1 and marked), the
Transmission band [1.186, 1.204] shaded on the k panel.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..diagnose.classes import INIT_ANCHOR_K
from ..diagnose.results import TrajectoryResult
from .plots import pyplot, save_figure

if TYPE_CHECKING:
    from ..diagnose.results import TrajectoryResult


def _x(steps: list[int]) -> np.ndarray:
    return np.maximum(np.asarray(steps, dtype=float), 1.0)  # step 0 sits at 1 on the log axis


def k_lambda_plot(t: TrajectoryResult, path: Path) -> Path:
    plt = pyplot()
    fig, (ax_k, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    for kind, s in t["kinds"].items():
        x = _x(s["steps"])
        ax_k.plot(x, s["k"], marker="o", ms=3, label=kind)
        ax_l.plot(x, s["lambda"], marker="o", ms=3, label=kind)
    ax_k.axhspan(*t["band"], color="gold", alpha=0.35, label="Transmission band")
    ax_k.axhline(INIT_ANCHOR_K, color="grey", ls="--", lw=1, label=f"init anchor {INIT_ANCHOR_K}")
    for ax, label in ((ax_k, "median k"), (ax_l, "median λ")):
        ax.set_xscale("log")
        ax.set_xlabel("step (step 0 at 1)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_k.legend(fontsize=7, ncol=2)
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

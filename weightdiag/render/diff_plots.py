"""`diff --plot DIR` and `--html FILE`: relative change and rank90 per block and kind, as heatmaps, and a
self-contained page with the findings, the plots and the matrices (matplotlib: the optional [plot] extra)."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

import numpy as np

from ..database.store import write_text_atomic
from ..delta.result import DiffResult, TensorDiff, cosine_cell
from ..vocabulary import KIND_ORDER
from .plots import PlotFile, pyplot, save_figure


def _grid(result: DiffResult, value) -> tuple[np.ndarray, list[int], list[str]]:
    """[kinds x blocks] of value(matrix) (NaN where none); several matrices of one cell: the largest."""
    blocked = [(m, m.block) for m in result.matrices if m.block is not None]
    blocks = sorted({block for _, block in blocked})
    kinds = sorted({m.kind for m, _ in blocked}, key=lambda k: (KIND_ORDER.index(k) if k in KIND_ORDER else 99, k))
    grid = np.full((len(kinds), len(blocks)), np.nan)
    for m, block in blocked:
        v = value(m)
        if v is None or not math.isfinite(v):
            continue
        i, j = kinds.index(m.kind), blocks.index(block)
        grid[i, j] = v if np.isnan(grid[i, j]) else max(grid[i, j], v)
    return grid, blocks, kinds


def _heatmap(plt, grid, blocks, kinds, title: str, label: str, path: Path, log: bool) -> Path:
    from matplotlib.colors import LogNorm

    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(blocks) + 2.5), max(2.5, 0.4 * len(kinds) + 1.2)))
    shown = np.where(grid > 0, grid, np.nan) if log else grid
    finite = shown[np.isfinite(shown)]
    norm = LogNorm(vmin=finite.min(), vmax=finite.max()) if log and finite.size and finite.min() > 0 else None
    image = ax.imshow(shown, aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
    zero = np.where(grid == 0, 1.0, np.nan)  # untouched cells: grey, not the colour scale's bottom
    ax.imshow(zero, aspect="auto", cmap="Greys", vmin=0, vmax=2, interpolation="nearest")
    ax.set_xticks(range(len(blocks)), [str(b) for b in blocks], fontsize=7)
    ax.set_yticks(range(len(kinds)), kinds, fontsize=8)
    ax.set_xlabel("block")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label=label)
    return save_figure(plt, fig, path)


def write_plots(result: DiffResult, folder: Path) -> list[PlotFile]:
    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    grid, blocks, kinds = _grid(result, lambda m: m.relative_change)
    if grid.size:
        path = _heatmap(
            plt, grid, blocks, kinds, "relative change ||ΔW|| / ||W|| (grey: untouched)", "relative change",
            folder / "diff_relative_change.png", log=True,
        )  # fmt: skip
        out.append(PlotFile(path, "Relative change per block and kind", "Log colour scale; grey cells are exactly 0."))
        grid, blocks, kinds = _grid(result, lambda m: None if m.spectrum is None else float(m.spectrum.rank90_at_least))
        path = _heatmap(
            plt, grid, blocks, kinds, "rank90 of ΔW (at least, where the sketch cannot pin it)", "rank90",
            folder / "diff_rank90.png", log=False,
        )  # fmt: skip
        out.append(PlotFile(path, "rank90 per block and kind", "Singular values of ΔW holding 90% of its energy."))
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar([b.key.removeprefix("block ") for b in result.blocks], [b.relative_change for b in result.blocks])
    ax.set_xlabel("block")
    ax.set_ylabel("relative change")
    ax.set_title("relative change per block (energy-weighted)", fontsize=9)
    path = save_figure(plt, fig, folder / "diff_blocks.png")
    out.append(PlotFile(path, "Relative change per block", "sqrt(Σ||ΔW||² / Σ||W||²) over each block's matrices."))
    return out


def _row(m: TensorDiff) -> str:
    rank = (
        "-"
        if m.spectrum is None
        else (str(m.rank90) if m.rank90 is not None else f"&gt;{m.spectrum.rank90_at_least - 1}")
    )
    verdict = (
        "untouched"
        if m.untouched
        else ", ".join(v for v, on in (("LoRA-like", m.low_rank), ("scaled", m.scaled)) if on)
    )
    cells = [
        escape(m.name), "-" if m.block is None else str(m.block), escape(m.kind), f"{m.relative_change:.4g}",
        cosine_cell(m.figures.cosine), f"{m.figures.unchanged_fraction:.2%}", rank, verdict,
    ]  # fmt: skip
    return "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def write_html(result: DiffResult, plots: list[PlotFile], path: Path) -> Path:
    from .html import _STYLE, _figure

    title = f"weightdiag diff: {result.base['id']} -> {result.tuned['id']}"
    findings = "".join(f"<li>{escape(f.message)}</li>" for f in result.findings)
    head = "".join(
        f"<th>{h}</th>" for h in ("matrix", "block", "kind", "rel. change", "cosine", "unchanged", "rank90", "verdict")
    )
    rows = "".join(_row(m) for m in sorted(result.matrices, key=lambda m: -m.relative_change))
    page = (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f"<p>relative change {result.totals['relative_change'] or 0:.4g} overall; "
        f"{result.totals['unchanged_fraction']:.2%} of elements unchanged. Fields: docs/diff-schema.md.</p>"
        f"<h2>Findings</h2><ul>{findings}</ul>"
        f"<h2>Plots</h2>{''.join(_figure(p) for p in plots)}"
        f"<h2>Matrices</h2><table><tr>{head}</tr>{rows}</table></body></html>\n"
    )
    write_text_atomic(path, page)
    return path

"""Plots of a health report: the k heatmap (the paper's Fig. 6), depth profiles, norm weights
against sqrt(d), and per-matrix |w| histograms with the fitted Weibull body and the tail beyond q99
(Fig. 3).

matplotlib is the optional `weightdiag[plot]` extra: it is imported only here, only when plots are
asked for, and always with the non-interactive Agg backend.
"""

from __future__ import annotations

import importlib.util
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..citations import NORM_ARTICLE_SHORT
from ..codes import BIN_EDGES
from ..diagnose.classes import ABOVE_BAND_K, BAND, INIT_ANCHOR_K, SELECTION_DEEP_BELOW_K, TRANSMISSION_MIN_K
from ..diagnose.health import NORM_COLLAPSE, NORM_EXPLOSION, TABLE2, short_name
from ..diagnose.results import HealthReport
from ..errors import MissingDependencyError
from ..vocabulary import KIND_ORDER

if TYPE_CHECKING:
    from ..diagnose.results import HealthReport

DPI = 110
REBIN = 4  # 1024 cohort bins of 0.0137 decades -> 256 bins for the body panel


@dataclass(frozen=True)
class PlotFile:
    path: Path
    title: str
    caption: str


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise MissingDependencyError(
            "plots need matplotlib, which is not installed: pip install matplotlib "
            "(or, in the weightdiag repository, pip install '.[plot]')",
            package="matplotlib",
        )


def pyplot() -> Any:
    """matplotlib.pyplot with the file-only Agg backend, or a one-line error saying how to get it."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, path: Path) -> Path:
    """Lay out, write and release a figure (pyplot keeps every open figure alive until closed)."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def literal(text: str) -> str:
    """Text for a matplotlib title or label, shown as is: a tensor name with '$' is not mathtext."""
    return text.replace("$", r"\$")


def safe_name(name: str) -> str:
    """A file-name stem for a tensor name: the name itself when it is safe and short, else its safe
    characters (at most 100) plus a hash of the full name, so two odd names never share a file."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.")
    if clean == name and len(name) <= 100:
        return name
    return f"{clean[:100]}_{zlib.crc32(name.encode()):08x}".lstrip("_")


def write_plots(result: HealthReport, histograms: dict[str, dict[str, Any]], folder: Path) -> list[PlotFile]:
    """Write every plot of `result` into `folder`; returns them in reading order."""
    plt = pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    files = [heatmap_k(plt, result, folder), depth_profile(plt, result, folder)]
    if result["norms"]["vectors"]:
        files.append(norms_plot(plt, result, folder))
    files += [histogram(plt, data, folder) for data in histograms.values()]
    return files


def _warning_blocks(result: HealthReport) -> set[int]:
    return {b for f in result["findings"] if f["severity"] == "warning" for b in f["blocks"]}


def heatmap_k(plt, result: HealthReport, folder: Path) -> PlotFile:
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.patches import Rectangle

    blocks = [b for b in result["blocks"] if b["kinds"]]
    kinds = [k for k in KIND_ORDER if any(k in b["kinds"] for b in blocks)]
    grid = np.full((len(kinds), len(blocks)), np.nan)
    for j, b in enumerate(blocks):
        for i, k in enumerate(kinds):
            cell = b["kinds"].get(k)
            if cell and cell["k"] is not None:
                grid[i, j] = cell["k"]
    lo, hi = k_color_range(grid)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * len(blocks) + 2.5), 0.45 * len(kinds) + 1.8))
    image = ax.imshow(grid, aspect="auto", cmap="RdBu", norm=TwoSlopeNorm(vmin=lo, vcenter=INIT_ANCHOR_K, vmax=hi))
    ax.set_xticks(range(len(blocks)), [str(b["block"]) for b in blocks], fontsize=7)
    ax.set_yticks(range(len(kinds)), kinds)
    ax.set_xlabel("block")
    flagged = {(b, k) for f in result["findings"] for b in f["blocks"] for k in f.get("kinds", [])}
    for j, b in enumerate(blocks):
        for i, k in enumerate(kinds):
            cell = b["kinds"].get(k)
            if cell is None or cell["k"] is None:
                continue
            if len(blocks) <= 32:
                dark = abs(image.norm(cell["k"]) - 0.5) > 0.3  # white digits on the deep reds and blues
                ax.text(
                    j,
                    i,
                    f"{cell['k']:.2f}" + ("*" if cell["quant"] else ""),
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="white" if dark else "black",
                )
            if (b["block"], k) in flagged:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.6))
    bar = fig.colorbar(image, ax=ax, label=f"k (mid80); white = init anchor {INIT_ANCHOR_K}")
    # The paper's cuts on the scale: the Transmission band shaded, the class thresholds as lines.
    bar.ax.axhspan(*BAND, facecolor="none", edgecolor="black", hatch="////", linewidth=0.6)
    cuts = [
        (TRANSMISSION_MIN_K, "1.18 transmission ≥"),
        (SELECTION_DEEP_BELOW_K, "1.045 deep <"),
        (ABOVE_BAND_K, "1.22"),
    ]
    for v, _ in cuts:
        if lo <= v <= hi:
            bar.ax.axhline(v, color="black", linewidth=0.8)
    bar.ax.set_yticks(*zip(*colorbar_ticks(lo, hi, cuts), strict=True))
    bar.ax.tick_params(labelsize=7)
    ax.set_title("Weibull shape k per block and kind (cf. the paper's Fig. 6)", fontsize=10)
    path = save_figure(plt, fig, folder / "heatmap_k.png")
    return PlotFile(
        path,
        "k per block and kind",
        f"The colour scale is fitted to this model: {lo:.3f} to {hi:.3f}, white at the half-normal init anchor "
        f"{INIT_ANCHOR_K} (the paper's App. A.1), as far from it on either side. Red: heavier tails than the init "
        "(the paper's Selection reading below 1.18, deep below 1.045); blue: lighter. Hatched on the scale: the "
        f"Transmission band {BAND[0]}-{BAND[1]} of the cohort's FFN medians. Boxed cells carry a finding; * marks "
        "quantized matrices (class withheld).",
    )


def colorbar_ticks(lo: float, hi: float, cuts: list[tuple[float, str]]) -> list[tuple[float, str]]:
    """The scale's labelled ticks: the anchor, the paper's cuts within the range, the two ends; a tick closer
    than 6% of the range to one already kept loses its label (its line stays), so labels never overlap."""
    wanted = [(INIT_ANCHOR_K, f"{INIT_ANCHOR_K} anchor"), *cuts, (lo, f"{lo:.3f}"), (hi, f"{hi:.3f}")]
    kept: list[tuple[float, str]] = []
    for v, label in wanted:
        if lo <= v <= hi and all(abs(v - u) >= 0.06 * (hi - lo) for u, _ in kept):
            kept.append((v, label))
    return sorted(kept)


K_COLOR_MIN_SPAN = 0.03  # about 10x the sampling noise of one matrix's k: a model at its init stays pale


def k_color_range(grid: np.ndarray) -> tuple[float, float]:
    """The heatmap's k scale: centred on the init anchor, reaching the model's farthest k (5% margin), at least
    K_COLOR_MIN_SPAN either side, so a model's spread of k uses the whole scale (issue 21: a fixed 0.7-1.3
    painted every MiniLM cell alike) while a colour keeps one meaning: its distance from the anchor."""
    finite = grid[np.isfinite(grid)]
    span = float(np.max(np.abs(finite - INIT_ANCHOR_K))) * 1.05 if finite.size else 0.0
    span = max(span, K_COLOR_MIN_SPAN)
    return INIT_ANCHOR_K - span, INIT_ANCHOR_K + span


def depth_profile(plt, result: HealthReport, folder: Path) -> PlotFile:
    depth = result["depth"]
    series = depth["series"]
    fig, axes = plt.subplots(5, 1, figsize=(9, 13), sharex=True)
    warn = _warning_blocks(result)
    for ax in axes:
        for b in warn:
            ax.axvspan(b - 0.5, b + 0.5, color="tab:red", alpha=0.08, linewidth=0)
    for key, s in series.items():
        for ax, stat in zip(axes[:3], ("k", "lambda", "std"), strict=True):
            xs = [b for b, v in zip(s["blocks"], s[stat], strict=True) if v is not None]
            ys = [v for v in s[stat] if v is not None]
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=key)
    # The reference lines are in the legend (issue 33: only the caption of the HTML named them).
    axes[0].axhline(INIT_ANCHOR_K, color="grey", linestyle="--", linewidth=0.8, label=f"init anchor {INIT_ANCHOR_K}")
    axes[0].axhline(
        TRANSMISSION_MIN_K, color="tab:orange", linestyle=":", linewidth=0.8, label=f"Transmission {TRANSMISSION_MIN_K}"
    )
    axes[0].axhline(
        SELECTION_DEEP_BELOW_K,
        color="tab:red",
        linestyle=":",
        linewidth=0.8,
        label=f"deep Selection below {SELECTION_DEEP_BELOW_K}",
    )
    axes[0].set_ylabel("k")
    axes[0].legend(fontsize=7, ncol=4, loc="best")
    axes[1].set_ylabel("λ")
    axes[2].set_ylabel("std")
    for ax in axes[1:4]:
        ax.set_yscale("log")
    per_block = result["super_weights"]["blocks"]
    axes[3].plot([b["block"] for b in per_block], [b["max_over_q99"] for b in per_block], marker="o", color="black")
    medians = [row[1] for row in TABLE2.values()]
    axes[3].axhspan(min(medians), max(medians), color="tab:green", alpha=0.15, label="Table 2 family medians")
    axes[3].set_ylabel("block max/q99")
    axes[3].legend(fontsize=7)
    change = depth["adjacent_change"]
    if change:
        # None: not comparable (a statistic missing on one side, e.g. an all-NaN matrix): marked at the top.
        xs = sorted(int(b) for b in change if change[b] is not None)
        axes[4].plot(xs, [max(change[str(b)], 1e-3) for b in xs], marker="o", color="tab:purple")
        apart = sorted(int(b) for b in change if change[b] is None)
        if apart:
            top = max([10.0, *(change[str(b)] * 2 for b in xs)])
            axes[4].scatter(apart, [top] * len(apart), marker="x", color="tab:red", label="not comparable (NaN/Inf)")
        axes[4].set_yscale("log")
    axes[4].axhline(1.0, color="grey", linestyle="--", linewidth=0.8, label="1: within sampling noise")
    axes[4].legend(fontsize=7)
    axes[4].set_ylabel("change vs block b-1\n(tolerance units)")
    axes[4].set_xlabel("block")
    blocks = [b for s in series.values() for b in s["blocks"]] + [b["block"] for b in per_block]
    axes[4].set_xticks(block_ticks(max(blocks, default=0)))  # shared by the five panels
    placement = {"pre": "Pre-LN", "post": "Post-LN", "peri": "Peri-LN"}.get(
        depth["placement"] or "", "norm placement ?"
    )
    fig.suptitle(f"Depth profile ({placement}); red bands: blocks with a warning", fontsize=10)
    for ax in axes[1:]:
        if ax.get_yscale() == "log":
            _plain_log_labels(ax)
    path = save_figure(plt, fig, folder / "depth_profile.png")
    return PlotFile(
        path,
        "depth profile",
        "k, λ and std per kind against depth (dashed: init anchor; dotted: Transmission 1.18 and deep Selection "
        "1.045), the block max/q99 against Table 2's family medians, and how much each block differs from the "
        "previous one (below 1: indistinguishable within sampling noise, the weight-side reading of the Curse of "
        "Depth). " + depth["reading"],
    )


def norms_plot(plt, result: HealthReport, folder: Path) -> PlotFile:
    depth = result["depth"]
    fig, ax = plt.subplots(figsize=(9, 4))
    for site, s in depth["norm_series"].items():
        ax.plot(s["blocks"], s["ratio"], marker="o", markersize=3, linewidth=1, label=site)
    n = depth["n_layers"] or 0
    apart: dict[int, set[str]] = {}  # the places beside the blocks (-1: before block 0; n: after the last) -> sites
    for r in result["norms"]["singled_out"]:
        x = -1 if r["site"] == "embed" else (r["block"] if r["site"] == "mtp" and r["block"] is not None else n)
        if x in (-1, n) and r["site"] != "mtp":
            apart.setdefault(x, set()).add("emb" if r["site"] == "embed" else r["site"])
        ax.scatter(
            [x], [r["ratio"]], marker="*", s=90, zorder=3, label=literal(f"{r['site']}: {short_name(r['name'])}")
        )
    _block_ticks(ax, n, apart)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.axhspan(1e-3, NORM_COLLAPSE, color="tab:red", alpha=0.08)
    ax.axhspan(NORM_EXPLOSION, 1e3, color="tab:red", alpha=0.08)
    ratios = [r["ratio"] for r in result["norms"]["vectors"]]
    ax.set_ylim(min(0.3, min(ratios) / 1.3), max(2.2, max(ratios) * 1.3))
    ax.set_yscale("log")
    _plain_log_labels(ax)
    ax.set_xlabel("block")
    ax.set_ylabel("‖γ‖₂ / √d")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(
        f"Norm weights against √d: collapse < {NORM_COLLAPSE}, explosion > {NORM_EXPLOSION} ({NORM_ARTICLE_SHORT})",
        fontsize=10,
    )
    path = save_figure(plt, fig, folder / "norms.png")
    return PlotFile(
        path,
        "norm weights",
        "Every norm weight's ‖γ‖₂/√d by block and site (1 = all-ones init); stars: final, embedding and MTP norms; "
        "shaded: the collapse and explosion regimes.",
    )


def block_ticks(last: int) -> list[int]:
    """The block numbers a depth axis names: whole numbers only, always block 0 and the last block (issue 42: a
    model of 2 or 3 blocks got ticks at 0.2, 0.25, ...; one of 30 named neither its last block nor always 0), about
    a dozen at most; a tick too close to the last one to be read beside it is left out."""
    from matplotlib.ticker import MaxNLocator

    last = max(last, 0)
    ticks = sorted({int(t) for t in MaxNLocator(nbins=12, integer=True).tick_values(0, last) if 0 <= t <= last})
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1
    return sorted({t for t in ticks if t == 0 or last - t >= step / 2 or t == last} | {0, last})


def _block_ticks(ax: Any, n: int, apart: dict[int, set[str]]) -> None:
    """Block numbers on the x axis, and the norms outside the blocks named where they are drawn ("emb" before block
    0, "final" after the last), set off by a dotted line: the embedding norm read as a block "-1" (issue 33)."""
    ticks = set(block_ticks(n - 1))
    names = {x: "/".join(sorted(sites)) for x, sites in apart.items()}
    for x in names:
        ax.axvline(x + 0.5 if x < 0 else x - 0.5, color="grey", linestyle=":", linewidth=0.8)
    ticks |= set(names)
    ax.set_xticks(sorted(ticks), [names.get(t, str(t)) for t in sorted(ticks)])


def weibull_tail(w: np.ndarray, k: float, lam: float) -> np.ndarray:
    return np.exp(-((np.asarray(w) / lam) ** k))


def histogram(plt, data: dict[str, Any], folder: Path) -> PlotFile:
    """Fig. 3 style: left, the log10|w| histogram with the fitted Weibull body; right, the tail beyond
    q99 (observed counts) against what the body fit predicts."""
    fit, n = data["fit"], data["n"]
    k, lam = fit.get("k"), fit.get("lambda")
    if not n or not data.get("q99") or not data.get("max_abs"):
        return _no_histogram(plt, data, folder)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    counts = data["hist1024"].reshape(-1, REBIN).sum(axis=1)
    edges = BIN_EDGES[::REBIN]
    width = edges[1] - edges[0]
    used = np.flatnonzero(counts)
    lo_i, hi_i = (used[0], used[-1] + 1) if used.size else (0, counts.size)
    left.stairs(counts[lo_i:hi_i], edges[lo_i : hi_i + 1], fill=True, alpha=0.5, label="observed")
    if fit.get("ok"):
        x = np.linspace(edges[lo_i], edges[hi_i], 400)
        w = 10.0**x
        density = math.log(10) * w * (k / lam) * (w / lam) ** (k - 1) * weibull_tail(w, k, lam)
        left.plot(x, n * width * density, color="tab:red", label=f"Weibull body k={k:.3f}, λ={lam:.3g}")
        lo_w, hi_w = lam * (-math.log(0.9)) ** (1 / k), lam * (-math.log(0.1)) ** (1 / k)
        left.axvspan(math.log10(lo_w), math.log10(hi_w), color="tab:red", alpha=0.06, label="fitted window (mid80)")
    left.axvline(math.log10(data["q99"]), color="black", linestyle=":", label="q99")
    left.set_yscale("log")
    left.set_ylim(0.5, max(float(counts.max()), 1.0) * 3)
    left.set_xlabel("log10 |w|")
    left.set_ylabel(f"count per {width:.3f} decades")
    left.legend(fontsize=7)
    left.set_title("body", fontsize=9)
    # Tail beyond q99: observed counts in log-spaced bins vs the body fit extrapolated.
    values, vcounts = data["values"], data["counts"]
    q99, top = data["q99"], data["max_abs"]
    tail_edges = np.geomspace(q99, top * 1.02, 25) if top > q99 else np.array([q99, q99 * 1.02])
    observed = np.histogram(values, bins=tail_edges, weights=vcounts)[0]
    seen = observed > 0  # empty bins are left blank on the log axis
    right.bar(
        tail_edges[:-1][seen],
        observed[seen],
        width=np.diff(tail_edges)[seen],
        align="edge",
        alpha=0.5,
        label="observed",
    )
    caption_tail = ""
    if fit.get("ok"):
        predicted = n * (weibull_tail(tail_edges[:-1], k, lam) - weibull_tail(tail_edges[1:], k, lam))
        centres = np.sqrt(tail_edges[:-1] * tail_edges[1:])
        right.plot(centres, np.maximum(predicted, 1e-3), color="tab:red", marker=".", label="Weibull body predicts")
        log10_ptail = -((top / lam) ** k) / math.log(10)
        beyond = int(vcounts[values > q99].sum())
        expected = float(n * weibull_tail(q99, k, lam))
        caption_tail = (
            f" Beyond q99: {beyond} observed vs {expected:.0f} predicted by the body; the largest |w| has "
            f"log10 P_tail = {log10_ptail:.1f} under the fit."
        )
        right.set_title(f"tail beyond q99: max/q99 = {top / q99:.1f}, log10 P_tail = {log10_ptail:.1f}", fontsize=9)
    right.axvline(top, color="tab:red", linestyle=":", label="max |w|")
    right.set_xscale("log")
    readable_log_ticks(right.xaxis, float(tail_edges[0]), float(tail_edges[-1]))
    right.set_yscale("log")
    right.set_ylim(bottom=0.05, top=max(float(observed.max()), 1.0) * 3)
    right.set_xlabel("|w|")
    right.set_ylabel("count")
    right.legend(fontsize=7)
    where = f"block {data['block']}, " if data["block"] is not None else ""
    drawn = f"\ndrawn as {data['why']}" if data.get("why") else ""
    fig.suptitle(
        literal(f"{data['name']} ({where}{data['kind']})" + (f" — {data['note']}" if data.get("note") else "") + drawn),
        fontsize=9,
    )
    path = save_figure(plt, fig, folder / f"hist_{safe_name(data['name'])}.png")
    at = f" at ({', '.join(map(str, data['argmax']))})" if data.get("argmax") else ""
    return PlotFile(
        path,
        f"|w| of {data['name']}",
        (f"Drawn as {data['why']}. " if data.get("why") else "")
        + f"{n:,} nonzero |w|; the fitted Weibull body (mid80 window) on log axes and the tail beyond q99 = "
        f"{q99:.4g}; largest |w| = {top:.4g}{at}." + caption_tail,
    )


def readable_log_ticks(axis: Any, lo: float, hi: float) -> None:
    """Plain-number labels (0.2, 0.5, 1) on a log axis over [lo, hi], never overlapping: matplotlib's default
    labels every minor tick of a range under a decade ("3x10^-1 4x10^-1" ran together, issue 21)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    decades = math.log10(hi / lo) if hi > lo > 0 else 1.0
    # 1-2-5 steps within about two decades, else powers of ten (thinned to at most 8 labels)
    mantissas = tuple(range(1, 10)) if decades <= 0.7 else (1.0, 2.0, 5.0) if decades <= 2.5 else (1.0,)
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks = [m * 10.0**e for e in range(first, last + 1) for m in mantissas if lo <= m * 10.0**e <= hi]
    if len(ticks) < 2:  # a range narrower than one 1-2-5 step: its two ends
        ticks = [lo, hi]
    ticks = ticks[:: math.ceil(len(ticks) / 8)]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    axis.set_minor_formatter(NullFormatter())


def _plain_log_labels(ax: Any) -> None:
    """readable_log_ticks on a log y axis over the range it shows now (its limits then kept)."""
    lo, hi = ax.get_ylim()
    if lo > 0 and hi > lo:
        readable_log_ticks(ax.yaxis, lo, hi)
        ax.set_ylim(lo, hi)


def _no_histogram(plt, data: dict[str, Any], folder: Path) -> PlotFile:
    """A matrix without a nonzero finite |w| (all NaN, Inf or zero): a placeholder that says so."""
    fig, ax = plt.subplots(figsize=(11, 2))
    ax.axis("off")
    why = "no nonzero finite |w|: every value is NaN, Inf or 0, so there is no distribution to draw"
    ax.text(0.5, 0.5, why, ha="center", va="center", fontsize=10)
    where = f"block {data['block']}, " if data["block"] is not None else ""
    fig.suptitle(literal(f"{data['name']} ({where}{data['kind']})"), fontsize=9)
    path = save_figure(plt, fig, folder / f"hist_{safe_name(data['name'])}.png")
    return PlotFile(path, f"|w| of {data['name']}", why + ".")

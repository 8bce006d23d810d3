"""Plots a reader would keep (issue 21), checked as images: the k heatmap's colours tell MiniLM's cells apart and
keep white at the init anchor, tick labels never overlap, every histogram says why it is drawn, the HTML tables
scroll inside the page, and the report's table titles name only the columns drawn at 80 columns.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from .conftest import run_cli

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def minilm_report(minilm_dir, tmp_path_factory):
    from weightdiag import api
    from weightdiag.run.measure import FitOptions

    folder = tmp_path_factory.mktemp("plots")
    report = api.report(
        str(minilm_dir),
        db_dir=folder / "db",
        options=FitOptions(device="cpu"),
        plot=folder / "plots",
        html=folder / "report.html",
    )
    return report, folder


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions make, kept open (save_figure still writes them)."""
    from weightdiag.render import plots

    kept = []

    def keep(plt, fig, path):
        fig.tight_layout()
        fig.savefig(path, dpi=plots.DPI)
        kept.append(fig)
        return path

    from weightdiag.render import spectrum_plots, trajectory_plots

    for module in (plots, spectrum_plots, trajectory_plots):  # each imported save_figure by name
        monkeypatch.setattr(module, "save_figure", keep)
    yield kept
    import matplotlib.pyplot as plt

    for fig in kept:
        plt.close(fig)


def _overlaps(fig, labels) -> list[tuple[str, str]]:
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_visible() and t.get_text()]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


def test_the_k_heatmap_scale_fits_the_model_and_is_centred_on_the_anchor(minilm_report, figures, tmp_path):
    from weightdiag.diagnose.classes import INIT_ANCHOR_K
    from weightdiag.render import plots

    report, _ = minilm_report
    plots.heatmap_k(plots.pyplot(), report.result, tmp_path)
    (fig,) = figures
    image = fig.axes[0].images[0]
    grid = np.ma.masked_invalid(np.asarray(image.get_array(), dtype=float))
    ks = grid.compressed()
    assert 1.07 < ks.min() < 1.09 and 1.19 < ks.max() < 1.21  # MiniLM's k: 1.08 (block 3 o) to 1.20
    assert image.norm(INIT_ANCHOR_K) == pytest.approx(0.5)  # white at the anchor
    colours = image.cmap(image.norm(ks))[:, :3]
    lowest, highest = colours[ks.argmin()], colours[ks.argmax()]
    assert np.linalg.norm(lowest - highest) > 0.6  # the deepest red against near white (was: one pale yellow)
    # cells 0.02 apart in k are told apart by eye (an RGB distance of at least 0.05)
    for i, j in itertools.combinations(range(ks.size), 2):
        if abs(ks[i] - ks[j]) >= 0.02:
            assert np.linalg.norm(colours[i] - colours[j]) > 0.05, (ks[i], ks[j])
    # the scale reaches the model's farthest k and no farther than 10% beyond it
    lo, hi = image.norm.vmin, image.norm.vmax
    assert lo <= ks.min() and hi - INIT_ANCHOR_K == pytest.approx(INIT_ANCHOR_K - lo)
    assert INIT_ANCHOR_K - lo < 1.1 * (INIT_ANCHOR_K - ks.min())
    bar = fig.axes[1]
    assert "anchor" in " ".join(t.get_text() for t in bar.get_yticklabels())
    assert not _overlaps(fig, bar.get_yticklabels())


@pytest.mark.parametrize(
    "grid",
    [[[1.2054, 1.2060]], [[0.5, 1.19], [1.7, 1.2]], [[1.18, 1.22], [1.05, 1.1]]],
    ids=["at-init", "very-wide", "around-the-cuts"],
)
def test_the_k_scale_of_other_models(grid):
    from weightdiag.diagnose.classes import INIT_ANCHOR_K
    from weightdiag.render import plots

    grid = np.asarray(grid, dtype=float)
    lo, hi = plots.k_color_range(grid)
    assert hi - INIT_ANCHOR_K == pytest.approx(INIT_ANCHOR_K - lo)
    assert hi - lo >= 2 * plots.K_COLOR_MIN_SPAN  # a model at its init stays pale, not painted by its noise
    assert lo <= grid.min() and grid.max() <= hi
    ticks = plots.colorbar_ticks(lo, hi, [(1.18, "1.18"), (1.045, "1.045"), (1.22, "1.22")])
    values = [v for v, _ in ticks]
    assert INIT_ANCHOR_K in values
    assert all(b - a >= 0.06 * (hi - lo) - 1e-12 for a, b in itertools.pairwise(values))


def test_histogram_tick_labels_never_overlap(minilm_report, figures, tmp_path):
    from weightdiag.render import plots

    report, _ = minilm_report
    hist = [p for p in report.result["plots"] if "hist_" in p["file"]]
    assert hist
    plt = plots.pyplot()
    # the MiniLM tails (0.17 to 1.5 and 0.17 to 0.34) and other spans, on the tail panel's axis
    for lo, hi in [(0.173, 1.52), (0.173, 0.342), (0.5, 0.52), (1e-3, 12.0), (2e-5, 3e-2), (0.9, 40.0)]:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        plots.readable_log_ticks(ax.xaxis, lo, hi)
        fig.canvas.draw()
        labels = [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)]
        shown = [t.get_text() for t in labels if t.get_text()]
        assert len(shown) >= 2, (lo, hi, shown)
        assert not _overlaps(fig, labels), (lo, hi, shown)
        assert not any("times" in s or "^" in s for s in shown), shown  # plain numbers, not 3x10^-1
        plt.close(fig)


def test_every_histogram_says_why_it_is_drawn(minilm_report):
    report, _ = minilm_report
    hist = [p for p in report.result["plots"] if "hist_" in p["file"]]
    assert len(hist) >= 2  # MiniLM: the super weight, and the lowest k
    for plot in hist:
        assert plot["caption"].startswith("Drawn as "), plot["caption"]
    captions = " ".join(p["caption"] for p in hist)
    assert "super weight" in captions and "lowest k" in captions


def test_html_tables_scroll_inside_the_page(minilm_report):
    _, folder = minilm_report
    page = (folder / "report.html").read_text()
    assert re.search(r"\.wide \{ overflow-x: auto; max-width: 100%; \}", page)
    tables = page.count("<table")
    assert tables >= 3 and page.count('<div class="wide"><table>') == tables


def test_report_titles_name_only_the_columns_drawn(minilm_dir, tmp_path):
    for width in ("80", "200"):
        out = run_cli("report", str(minilm_dir), "--db", str(tmp_path / "db"), "-q", env={"COLUMNS": width})
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        for title in ("blocks: structure and scale", "blocks: shape and tails"):
            at = next(i for i, line in enumerate(lines) if line.startswith(title))
            header = "\n".join(lines[at + 1 : at + 5])
            if "‖γ‖/√d" in lines[at]:
                assert "γ " in header, (width, lines[at], header)
            for column in ("kurtosis", "max/q99"):
                if column in lines[at]:
                    assert column in header, (width, lines[at], header)
        if width == "80":
            assert any(line.startswith("blocks: shape and tails (k per projection)") for line in lines)
        else:
            assert any("block max/q99 and kurtosis" in line for line in lines)


def test_log_axes_of_the_depth_and_norm_plots_read_as_plain_numbers(minilm_report, figures, tmp_path):
    from weightdiag.render import plots

    report, _ = minilm_report
    plt = plots.pyplot()
    plots.depth_profile(plt, report.result, tmp_path)
    plots.norms_plot(plt, report.result, tmp_path)
    log_axes = [ax for fig in figures for ax in fig.axes if ax.get_yscale() == "log"]
    assert len(log_axes) >= 4  # λ, std, max/q99, the block-to-block change; the norms
    for ax in log_axes:
        labels = [*ax.get_yticklabels(), *ax.get_yticklabels(minor=True)]
        shown = [t.get_text() for t in labels if t.get_text()]
        assert len(shown) >= 2 and not any("times" in s or "^" in s for s in shown), shown
        assert not _overlaps(ax.figure, labels), shown


def test_trajectory_step_0_and_step_1_are_drawn_apart(figures, tmp_path):
    """Issue 33: on a log step axis step 0 was drawn at 1, on top of step 1. Symmetric-log now: its own place."""
    from weightdiag.render.trajectory_plots import k_lambda_plot

    steps = [0, 1, 4, 16, 64, 512, 2000, 8000]
    result = {
        "model": "run",
        "band": [1.186, 1.204],
        "kinds": {"o": {"steps": steps, "k": [1.2] * len(steps), "lambda": [0.03 + 0.001 * s for s in range(8)]}},
    }
    k_lambda_plot(result, tmp_path / "k.png")
    (fig,) = figures
    fig.canvas.draw()
    for ax in fig.axes:
        (line,) = ax.get_lines()[:1]
        x0, x1 = (ax.transData.transform((x, 1.0))[0] for x in line.get_xdata()[:2])
        assert x1 - x0 > 20, (x0, x1)  # pixels apart: step 0 left of step 1, both visible
        assert ax.get_xlim()[0] < 0 < 1 < 8000 < ax.get_xlim()[1]
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels[:2] == ["0", "1"] and "1,000" in labels, labels
        assert not _overlaps(fig, ax.get_xticklabels())


def test_the_depth_profiles_reference_lines_are_in_its_legends(minilm_report, figures, tmp_path):
    """Issue 33: the dashed and dotted reference lines were named only in the HTML caption."""
    from weightdiag.render import plots

    report, _ = minilm_report
    plots.depth_profile(plots.pyplot(), report.result, tmp_path)
    (fig,) = figures
    k_panel, change_panel = fig.axes[0], fig.axes[4]
    named = {t.get_text() for t in k_panel.get_legend().get_texts()}
    assert {"init anchor 1.2054", "Transmission 1.18", "deep Selection below 1.045"} <= named, named
    assert {t.get_text() for t in change_panel.get_legend().get_texts()} == {"1: within sampling noise"}


def test_the_norms_plot_names_the_embedding_norm_instead_of_block_minus_1(minilm_report, figures, tmp_path):
    """Issue 33: MiniLM's embedding LayerNorm was drawn at block "-1"."""
    from weightdiag.render import plots

    report, _ = minilm_report
    plots.norms_plot(plots.pyplot(), report.result, tmp_path)
    (fig,) = figures
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert labels[0] == "emb" and "-1" not in labels and "−1" not in labels, labels
    assert labels[1:] == [str(b) for b in range(6)], labels


def test_the_html_says_what_the_coloured_k_cells_mean(minilm_report):
    """Issue 33: the blocks table's yellow (selection-mild) and red (selection-deep) cells had no legend."""
    _, folder = minilm_report
    page = (folder / "report.html").read_text()
    assert '<span class="mild">' in page  # MiniLM has selection-mild cells
    legend = page.split('<p class="legend">', 1)[1].split("</p>", 1)[0]
    assert '<span class="mild">mild</span> selection-mild (1.045 &le; k &lt; 1.18)' in legend
    assert '<span class="deep">deep</span> selection-deep (k &lt; 1.045)' in legend and 'class="quant"' in legend


# --- issue 42, item 17 ------------------------------------------------------------------------------------


def _html_tables(page: str) -> list[list[list[tuple[str, str]]]]:
    """Each table of a page as rows of (class, text) cells."""
    import html

    tables = []
    for table in re.findall(r"<table>(.*?)</table>", page, re.S):
        rows = []
        for row in re.findall(r"<tr>(.*?)</tr>", table, re.S):
            cells = re.findall(r'<t[hd](?: class="(\w+)")?>(.*?)</t[hd]>', row, re.S)
            rows.append([(css, html.unescape(re.sub(r"<[^>]+>", "", text)).strip()) for css, text in cells])
        tables.append(rows)
    return tables


def test_html_tables_fit_a_1280_px_page(minilm_report):
    """The blocks table was about 1,550 px wide for MiniLM (21 columns): now two, each within the page (1280 px
    less the margins), by an estimate of 7 px per character at the tables' 0.82em and 14 px of padding a cell."""
    _, folder = minilm_report
    for table in _html_tables((folder / "report.html").read_text()):
        columns = zip(*table, strict=False)
        width = sum(max(len(text) for _, text in column) * 7 + 14 for column in columns)
        assert width <= 1280 - 64, [text for _, text in table[0]]


def test_html_text_columns_are_left_aligned_and_numbers_right(minilm_report):
    """Text columns (biases, regime, findings, a tower's names) were right-aligned: only the first was not."""
    _, folder = minilm_report
    number = re.compile(r"[-+−]?[\d,]*\.?\d+(e[-+]?\d+)?%?")
    for table in _html_tables((folder / "report.html").read_text()):
        for i, column in enumerate(zip(*table, strict=False)):
            head, *cells = column
            texts = [text for _, text in cells if text not in ("", "-")]
            numeric = i > 0 and texts and all(number.fullmatch(t) for t in texts)
            assert all((css == "l") != numeric for css, _ in column), (head, column[:3])


def test_html_says_how_to_read_it_in_the_page(minilm_report):
    """A standalone page named "docs/report.md" as plain text, all it said of how to read it."""
    _, folder = minilm_report
    page = (folder / "report.html").read_text()
    assert "How to read it: docs/report.md." not in page
    guide = page.split("<h2>How to read this page</h2>", 1)[1].split("</ul>", 1)[0]
    assert "robust z" in guide and "‖γ‖/√d is 1 at the all-ones init" in guide


@pytest.mark.parametrize("n_layers", [2, 3, 30])
def test_depth_axes_name_block_0_and_the_last_in_whole_numbers(n_layers, figures, tmp_path):
    """Depth ticks at 0.2, 0.25, ... (2 or 3 blocks), or without the last block (30)."""
    from weightdiag import api
    from weightdiag.render import plots, spectrum_plots
    from weightdiag.run.measure import FitOptions
    from weightdiag.testing import synthetic

    model = synthetic.write_model(tmp_path / "m", synthetic.ModelSpec(n_layers=n_layers, d_model=32, ffn_size=64))
    report = api.report(str(model), db_dir=tmp_path / "db", options=FitOptions(device="cpu"), save=False)
    plots.depth_profile(plots.pyplot(), report.result, tmp_path)
    section = {"band": [2.0, 6.0], "depth": {"q": {str(b): 3.0 + b % 3 for b in range(n_layers)}}}
    spectrum_plots.alpha_by_depth(plots.pyplot(), section, tmp_path)
    for fig, ax in ((figures[0], figures[0].axes[4]), (figures[1], figures[1].axes[0])):
        fig.canvas.draw()
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert all(float(t).is_integer() for t in ticks), ticks
        assert 0 in ticks and n_layers - 1 in ticks, ticks
        assert not _overlaps(fig, ax.get_xticklabels())


def test_alpha_by_depth_says_median_over_experts_only_with_experts(figures, tmp_path):
    from weightdiag.render import plots, spectrum_plots

    section = {"band": [2.0, 6.0], "depth": {"q": {"0": 3.0, "1": 4.0}}}
    spectrum_plots.alpha_by_depth(plots.pyplot(), section, tmp_path)
    spectrum_plots.alpha_by_depth(plots.pyplot(), section, tmp_path, experts=True)
    dense, moe = (fig.axes[0].get_title() for fig in figures)
    assert "experts" not in dense and moe.endswith("(median over experts)")


def test_the_trajectory_lambda_panel_names_its_lines_and_none_hides_another(figures, tmp_path):
    """The λ panel had no legend, and a kind whose λ equals another's was drawn exactly under it."""
    from weightdiag.render.trajectory_plots import k_lambda_plot

    steps = [0, 10, 100]
    same = {"steps": steps, "k": [1.2, 1.19, 1.18], "lambda": [0.03, 0.04, 0.05]}
    result = {"model": "run", "band": [1.186, 1.204], "kinds": {"q": same, "k": dict(same), "v": dict(same)}}
    k_lambda_plot(result, tmp_path / "k.png")
    (fig,) = figures
    ax_l = fig.axes[1]
    assert ax_l.get_legend() is not None
    assert {t.get_text() for t in ax_l.get_legend().get_texts()} == {"q", "k", "v"}
    styles = {(line.get_marker(), line.get_linestyle()) for line in ax_l.get_lines()}
    assert len(styles) == 3  # each its own marker and dash: coinciding lines still show

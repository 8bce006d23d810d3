"""`report --plot/--html` of a model streamed from the Hub: its histograms re-read matrices with ranged
reads (the streaming reader's read_into), never exit 5."""

from __future__ import annotations

import pytest

from weightdiag.testing import synthetic

from .conftest import run_cli


def test_report_plots_and_html_of_a_hub_model(fake_hub, tmp_path):
    pytest.importorskip("matplotlib")
    folder = synthetic.write_model(tmp_path / "model", synthetic.ModelSpec(n_layers=2, d_model=64, ffn_size=128))
    fake_hub.add_folder("acme/tiny", folder)
    plots, html = tmp_path / "plots", tmp_path / "report.html"
    out = run_cli(
        "report",
        "acme/tiny",
        "--device",
        "cpu",
        "--db",
        str(tmp_path / "db"),
        "--plot",
        str(plots),
        "--html",
        str(html),
    )
    assert out.returncode == 0, out.stderr
    assert "histograms skipped" not in out.stderr
    assert sorted(p.suffix for p in plots.iterdir()) and {p.suffix for p in plots.iterdir()} == {".png"}
    assert html.stat().st_size > 10_000 and "<img" in html.read_text()

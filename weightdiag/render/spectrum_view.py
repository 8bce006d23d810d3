"""The spectrum in the terminal and in HTML: alpha per kind (report), alpha against other rows (compare)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from rich.table import Table

from .tables import FitWidth, fmt


def _band(section: Mapping[str, Any]) -> str:
    lo, hi = section["band"]
    return f"{lo:g}-{hi:g}"


# The columns of a kind's spectrum, in the terminal report and in the HTML report alike.
_KIND_COLUMNS = ("kind", "matrices", "alpha median", "alpha min", "alpha max", "< band", "> band", "MP spikes")


def _kind_cells(s: Mapping[str, Any]) -> list[str]:
    """One kind's cells under _KIND_COLUMNS after the kind: matrices, alpha summary, band counts, MP spikes."""
    return [
        str(s["count"]),
        fmt(s["alpha_median"], ".2f"),
        fmt(s["alpha_min"], ".2f"),
        fmt(s["alpha_max"], ".2f"),
        str(s["below_band"]),
        str(s["above_band"]),
        fmt(s["num_spikes_median"], ".1f"),
    ]


def report_spectrum_table(section: Mapping[str, Any]) -> FitWidth:
    """`report`: per kind, alpha over its matrices and how many leave WeightWatcher's band."""
    table = Table(title=f"Spectrum: alpha per kind (WeightWatcher's band {_band(section)})")
    for col in _KIND_COLUMNS:
        table.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    farms = any(s.get("alpha_farms_median") is not None for s in section["kinds"].values())
    if farms:
        table.add_column("FARMS alpha", justify="right", no_wrap=True)
    for kind, s in section["kinds"].items():
        cells = [kind, *_kind_cells(s)]
        if farms:
            cells.append(fmt(s.get("alpha_farms_median"), ".2f"))
        table.add_row(*cells)
    return FitWidth(table, optional=("MP spikes", "alpha min", "alpha max"))


def compare_spectrum_table(section: Mapping[str, Any]) -> FitWidth:
    """`compare`: per kind, this row's median alpha against the other rows with spectra."""
    table = Table(
        title=f"alpha per kind vs {len(section['peers'])} other rows with spectra (band {_band(section)})",
        caption="the cohort rows have no spectra",
    )
    for col in ("kind", "alpha", "< band", "> band", "others' alpha range", "nearest by alpha"):
        table.add_column(col, justify="right" if col in ("alpha", "< band", "> band") else "left")
    for kind, s in section["kinds"].items():
        peers = s["peers_alpha_range"]
        table.add_row(
            kind,
            fmt(s["alpha"], ".2f"),
            str(s["below_band"]),
            str(s["above_band"]),
            f"{peers[0]:.2f}-{peers[1]:.2f}" if peers else "-",
            s["nearest_by_alpha"] or "-",
        )
    return FitWidth(table, optional=("nearest by alpha",))


def spectrum_html(section: Mapping[str, Any] | None) -> str:
    """The HTML report's spectrum section ('' for a row without spectra)."""
    if not section:
        return ""
    rows = "".join(
        "<tr>"
        + f"<td class='l'>{escape(kind)}</td>"
        + "".join(f"<td>{escape(v)}</td>" for v in _kind_cells(s))
        + "</tr>"
        for kind, s in section["kinds"].items()
    )
    header = "".join(f"<th{' class=l' if i == 0 else ''}>{escape(h)}</th>" for i, h in enumerate(_KIND_COLUMNS))
    return (
        f"<h2>Spectrum</h2><p>alpha: the power-law exponent of each matrix's ESD tail (WeightWatcher 0.7.7's fit; "
        f"its band {_band(section)}); docs/spectrum.md.</p><table><tr>{header}</tr>{rows}</table>"
    )

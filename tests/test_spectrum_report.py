"""What the spectrum says in `report` and `compare`: findings for alpha outside WeightWatcher's 2-6 band, with
evidence, and none on null models (Gaussian matrices of several aspect ratios, many seeds); a planted
heavy-tailed layer is found; planted spikes are counted and not read as a tail; plots and HTML for a row with
spectra; compare against other rows with spectra, never against made-up cohort numbers.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weightdiag import api
from weightdiag.diagnose.compare import compare
from weightdiag.diagnose.health.spectrum import MIN_TAIL, spectrum_findings, spectrum_section
from weightdiag.diagnose.spectrum import NO_COHORT_SPECTRA, compare_spectra, holds_spectra_asked, spectrum_kinds
from weightdiag.fit.esd import fit_spectrum
from weightdiag.record.spectrum import spectrum_record
from weightdiag.reduce.gram import matrix_eigenvalues
from weightdiag.run.measure import FitOptions

from .conftest import run_cli

# A block of a small transformer: (kind, shape); d = 512 and 768 (BERT-base's width), FFN 4d, GQA k/v.
BLOCK = [
    ("q", (512, 512)),
    ("k", (128, 512)),
    ("v", (128, 512)),
    ("o", (512, 512)),
    ("up", (2048, 512)),
    ("down", (512, 2048)),
]
REALISTIC = [("q", (768, 768)), ("up", (3072, 768)), ("down", (768, 3072)), ("k", (256, 768))]


@cache
def gaussian(shape: tuple[int, int], seed: int) -> dict[str, Any]:
    rng = np.random.default_rng([seed, *shape])
    w = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    evals = matrix_eigenvalues(w)
    return spectrum_record(fit_spectrum(evals, *shape), evals)


def record(name: str, kind: str, block: int | None, spectrum: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "kind": kind, "block": block, "spectrum": spectrum}


def null_model(seed: int, blocks: int = 4, layout=BLOCK) -> list[dict[str, Any]]:
    return [
        record(f"model.layers.{b}.{kind}.weight", kind, b, gaussian(shape, seed * 100 + b))
        for b in range(blocks)
        for kind, shape in layout
    ]


def planted(shape: tuple[int, int], seed: int, *, cauchy: bool = False, spikes: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    m, n = shape
    if cauchy:  # heavy-tailed entries: the ESD's tail is a power law with alpha in (1.2, 2)
        w = (rng.standard_cauchy(shape) * 0.002).astype(np.float32)
    else:
        w = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    if spikes:
        u = np.linalg.qr(rng.standard_normal((m, spikes)))[0]
        v = np.linalg.qr(rng.standard_normal((n, spikes)))[0]
        edge = 0.02 * (math.sqrt(m) + math.sqrt(n))
        w = (w + (u * edge * np.linspace(3, 5, spikes)) @ v.T).astype(np.float32)
    evals = matrix_eigenvalues(w)
    return spectrum_record(fit_spectrum(evals, m, n), evals)


# --- null models -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_a_gaussian_model_has_no_spectrum_finding(seed):
    matrices = null_model(seed)
    findings, note = spectrum_findings(matrices)
    assert findings == []
    assert note is not None and "random matrices model-wide" in note  # said once, for the whole model
    for m in matrices:  # the null: a Marchenko-Pastur bulk, no spike, no tail heavier than the band
        assert m["spectrum"]["num_spikes"] == 0
        assert m["spectrum"]["alpha"] > 2


@pytest.mark.slow
def test_gaussian_matrices_of_realistic_sizes_over_many_seeds_give_no_finding():
    """20 seeds x 4 shapes (aspect ratios 1, 3 and 4, tall and wide) at BERT-base widths: 80 matrices."""
    alphas = []
    for seed in range(20):
        matrices = null_model(seed, blocks=1, layout=REALISTIC)
        assert spectrum_findings(matrices)[0] == []
        alphas += [m["spectrum"]["alpha"] for m in matrices]
        assert all(m["spectrum"]["num_spikes"] == 0 for m in matrices)
    assert min(alphas) > 3  # far from the band's lower edge (benchmarks/calibrate_spectrum.py: 4.37 over 270)


# --- planted layers ------------------------------------------------------------------------------------------


def test_a_planted_heavy_tailed_layer_is_found_with_its_evidence():
    matrices = null_model(0)
    heavy = planted((512, 512), 7, cauchy=True)
    assert 1.2 < heavy["alpha"] < 2 and heavy["num_pl_spikes"] >= MIN_TAIL
    matrices[9] = record("model.layers.1.o.weight", "o", 1, heavy)
    findings, _ = spectrum_findings(matrices)
    assert len(findings) == 1
    (f,) = findings
    assert f["category"] == "spectrum-heavy" and f["severity"] == "warning"
    assert f["tensors"] == ["model.layers.1.o.weight"] and f["blocks"] == [1]
    assert f["value"] == heavy["alpha"] and f["expected"] == 2.0
    for key in ("D", "xmin", "num_pl_spikes", "num_evals", "sigma", "num_spikes"):
        assert f[key] == heavy[key]
    assert f"{heavy['num_pl_spikes']} tail eigenvalues of 512" in f["_summary"]


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_planted_spikes_are_counted_and_not_read_as_a_heavy_tail(rank):
    spiked = planted((512, 2048), rank, spikes=rank)
    assert spiked["num_spikes"] == rank
    matrices = null_model(1)
    matrices[5] = record("model.layers.0.down.weight", "down", 0, spiked)
    assert spectrum_findings(matrices)[0] == []


def test_light_layers_among_trained_ones_are_notices_and_model_wide_randomness_is_one_note():
    trained = dict(gaussian((512, 512), 0), alpha=3.5, num_spikes=12)  # a trained layer: in the band, spikes
    light = dict(gaussian((512, 512), 1), alpha=9.0, num_spikes=3)
    matrices = [record(f"model.layers.{b}.q.weight", "q", b, trained) for b in range(5)]
    matrices.append(record("model.layers.5.q.weight", "q", 5, light))
    findings, note = spectrum_findings(matrices)
    assert note is None
    assert [(f["category"], f["severity"], f["blocks"]) for f in findings] == [("spectrum-light", "notice", [5])]
    few = dict(trained, alpha=1.5, num_evals=12, M=12)  # below WeightWatcher's small-sample cut-off: not read
    assert spectrum_findings([record("x", "q", 0, few)]) == ([], None)


def test_the_report_section_picks_the_findings_layers_for_esd_plots():
    matrices = null_model(2)
    matrices[3] = record("model.layers.0.o.weight", "o", 0, planted((512, 512), 3, cauchy=True))
    findings, _ = spectrum_findings(matrices)
    section = spectrum_section(matrices, findings)
    assert section is not None
    assert section["esd"][0]["name"] == "model.layers.0.o.weight"
    assert set(section["depth"]) == {kind for kind, _ in BLOCK}
    assert section["kinds"] == spectrum_kinds(matrices)
    assert spectrum_section([{"name": "x", "kind": "q", "block": 0}], []) is None


# --- compare ---------------------------------------------------------------------------------------------


def test_compare_reads_alpha_against_rows_with_spectra_and_says_the_cohort_has_none():
    mine = {"spectrum_kinds": spectrum_kinds(null_model(0))}
    other = {"spectrum_kinds": spectrum_kinds(null_model(1))}
    section = compare_spectra(mine, [("other@main", other), ("plain", {"kinds": {}})])
    assert section is not None and section["peers"] == ["other@main"]
    assert section["cohort"] == NO_COHORT_SPECTRA
    q = section["kinds"]["q"]
    assert q["alpha"] == mine["spectrum_kinds"]["q"]["alpha_median"]
    assert q["peers_alpha_range"] == [other["spectrum_kinds"]["q"]["alpha_median"]] * 2
    assert q["nearest_by_alpha"] == "other@main"
    assert compare_spectra({"matrices": []}, []) is None


def test_the_band_is_weightwatchers_and_a_plain_fit_does_not_load_scipy_for_it():
    import subprocess
    import sys

    from weightdiag.diagnose.spectrum import BAND
    from weightdiag.fit.esd import OVER_TRAINED, UNDER_TRAINED

    assert (OVER_TRAINED, UNDER_TRAINED) == BAND
    code = "import sys, weightdiag.diagnose.kinds, weightdiag.run.sweep; print('scipy' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_a_database_row_is_reused_only_when_it_holds_the_spectra_asked_for():
    plain = {"run": {}}
    spectra = {"run": {"spectrum": {"seconds": 1.0, "matrices": 3, "farms": False}}}
    farms = {"run": {"spectrum": {"seconds": 1.0, "matrices": 3, "farms": True}}}
    assert holds_spectra_asked(plain, False, False)
    assert not holds_spectra_asked(plain, True, False)
    assert holds_spectra_asked(spectra, True, False) and not holds_spectra_asked(spectra, True, True)
    assert holds_spectra_asked(farms, True, True)


# --- a real model end to end: report (text, JSON, plots, HTML) and compare ----------------------------------


@pytest.fixture(scope="module")
def minilm_db(minilm_dir, tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("db")
    out = run_cli("fit", str(minilm_dir), "--spectrum", "--db", str(db), "-q")
    assert out.returncode == 0, out.stderr
    return db


@pytest.mark.e2e
def test_report_of_a_row_with_spectra_has_findings_plots_and_html(minilm_db, tmp_path):
    pytest.importorskip("matplotlib")
    row_file = next((minilm_db / "rows").glob("*.json"))
    out = run_cli(
        "report", str(row_file), "--json", "--plot", str(tmp_path / "plots"), "--html", str(tmp_path / "r.html")
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    spectral = [f for f in report["findings"] if f["category"].startswith("spectrum-")]
    # MiniLM: its position embeddings' ESD is heavier than the band; its random-init pooler and a few deep
    # attention matrices are lighter; the token-type embedding (2 eigenvalues) is not read.
    heavy = [f["tensor"] for f in spectral if f["category"] == "spectrum-heavy"]
    assert heavy == ["embeddings.position_embeddings.weight"]
    assert "pooler.dense.weight" in [f["tensor"] for f in spectral if f["category"] == "spectrum-light"]
    assert all("tail eigenvalues of" in f["text"] and f["D"] is not None for f in spectral)
    files = {Path(p["file"]).name for p in report["plots"]}
    assert "spectrum_alpha_depth.png" in files
    assert "spectrum_esd_embeddings.position_embeddings.weight.png" in files
    assert all((tmp_path / "plots" / name).stat().st_size > 10_000 for name in files)
    html = (tmp_path / "r.html").read_text()
    assert "<h2>Spectrum</h2>" in html and "spectrum_alpha_depth.png" in html
    text = run_cli("report", str(row_file))
    assert "Spectrum: alpha per kind" in text.stdout


@pytest.mark.e2e
def test_compare_a_row_with_spectra(minilm_db, minilm_dir, tmp_path):
    row_file = next((minilm_db / "rows").glob("*.json"))
    (alone,) = json.loads(run_cli("compare", str(row_file), "--db", str(minilm_db), "--json").stdout)  # one per model
    assert alone["spectrum"]["peers"] == []  # its own row is not its peer
    assert NO_COHORT_SPECTRA in alone["findings"]
    assert any(line.startswith("spectrum: median alpha per kind") for line in alone["findings"])
    second = api.fit(str(minilm_dir), FitOptions(device="cpu", spectrum=True, model_id="minilm-copy"), db_dir=tmp_path)
    peers = json.loads(run_cli("compare", str(row_file), "--db", str(tmp_path), "--json").stdout)[0]["spectrum"]
    assert peers["peers"] == ["minilm-copy"]
    assert peers["kinds"]["q"]["nearest_by_alpha"] == "minilm-copy"
    assert peers["kinds"]["q"]["peers_alpha_range"][0] == second.row["spectrum_kinds"]["q"]["alpha_median"]
    text = run_cli("compare", str(row_file), "--db", str(tmp_path))
    assert "alpha per kind vs 1 other rows with spectra" in text.stdout
    plain = compare({**json.loads(row_file.read_text()), "spectrum_kinds": {}, "matrices": []})
    assert "spectrum" not in plain


@pytest.mark.e2e
def test_the_readme_spectrum_excerpt_is_a_real_run(minilm_db):
    from .test_readme_live import _blocks, _excerpt_matches, _section

    excerpt = _blocks(_section("The spectrum: `--spectrum`"))[0]
    row_file = next((minilm_db / "rows").glob("*.json"))
    out = run_cli("report", str(row_file))
    assert out.returncode == 0, out.stderr
    _excerpt_matches(excerpt, out.stdout)

"""Issue 11's small items: self-exclusion in `compare`, a stated tolerance for step-0 recipe matches,
no RuntimeWarning from an F32 fit, GGUF rows' sources and stored types, sources named by title."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weightdiag.codes import cohort_bins
from weightdiag.diagnose import trajectory as tr
from weightdiag.diagnose.cohort import load_cohort
from weightdiag.diagnose.compare import compare

from .docs_text import user_docs

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("entry", ["qwen3-8b", "pythia-70m", "llama-3-8b"])
def test_compare_on_a_cohort_entry_names_the_others(entry: str) -> None:
    row = next(c for c in load_cohort("v9_1") if c["model"]["id"] == entry)
    out = compare(row)
    assert out["nearest"]
    assert all(n["entry"] != entry for n in out["nearest"])
    assert all(n["distance"] > 0 for n in out["nearest"])
    assert all(v["nearest_by_k"] != entry for v in out["kinds"].values())
    assert not any(f"nearest cohort entry: {entry} " in f for f in out["findings"])


def _step0_row(n_layers: int, in_out_ratio: float) -> dict[str, Any]:
    matrices = []
    for b in range(n_layers):
        for kind, lam in (("up", in_out_ratio * 0.01), ("down", 0.01)):
            fit = {"ok": True, "k": 1.2054, "lambda": lam}
            matrices.append({"name": f"b{b}.{kind}", "block": b, "kind": kind, "numel": 10**6, "fits": {"mid80": fit}})
    return {"matrices": matrices, "vectors": [], "architecture": {"n_layers": n_layers}}


def _step0_lines(row: dict[str, Any]) -> list[str]:
    t = {"drift": {}, "duplicates": {}, "states": [], "step0": tr.step0_checks(row)}
    return [line for line in tr._findings(t) if "λ ratio" in line]


def test_step0_recipe_match_needs_the_stated_tolerance() -> None:
    wang = 12 / math.sqrt(10)
    near = tr.step0_checks(_step0_row(12, wang * 1.01))["lambda_ratio"]
    assert near["matches"]
    assert near["tolerance_percent"] == tr.RECIPE_TOLERANCE_PERCENT
    (line,) = _step0_lines(_step0_row(12, wang * 1.01))
    assert "matches small_init" in line
    assert f"within ±{tr.RECIPE_TOLERANCE_PERCENT:g}%" in line

    # A -19% miss from the closest recipe (the same sigma for all, ratio 1) is no match.
    miss = tr.step0_checks(_step0_row(12, 0.81))["lambda_ratio"]
    assert not miss["matches"]
    assert miss["error_percent"] == pytest.approx(-19, abs=0.01)
    (line,) = _step0_lines(_step0_row(12, 0.81))
    assert "matches no known init recipe" in line
    assert "-19.00%" in line


def test_cohort_bins_of_non_finite_values_raise_no_warning() -> None:
    values = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -3e-13], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bins = cohort_bins(values)
    assert list(bins[:4]) == [1024] * 4
    assert bins[4] == bins[5] == -1


@pytest.mark.e2e
def test_f32_fit_prints_no_runtime_warning(minilm_dir: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::RuntimeWarning",
            "-m",
            "weightdiag",
            "fit",
            str(minilm_dir),
            "--db",
            str(tmp_path / "db"),
            "--device",
            "cpu",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr


def test_readme_f32_bound_names_what_the_benchmark_measures(minilm_dir: Path) -> None:
    from weightdiag.fit.stats import Summary
    from weightdiag.fit.weibull import fit_exact
    from weightdiag.reduce.reduction import reduce_array
    from weightdiag.source.local import open_local

    readme = user_docs()
    plan, reader = open_local(minilm_dir)
    try:
        f32 = [t for t in plan.tensors if t.dtype.name == "F32" and len(t.shape) == 2]
        measured = [t for t in f32 if t.numel >= 1000]  # benchmarks/f32_exact_accuracy.py's selection
        assert f"the {len(measured)} F32 matrices of MiniLM with at least" in readme
        (small,) = [t for t in f32 if t.numel < 1000]
        raw = np.empty(small.nbytes, dtype=np.uint8)
        reader.read_into(small, raw)
    finally:
        reader.close()
    x = raw.view(np.float32)
    ours = Summary(reduce_array(x, "F32")).fit("exact", "mid80")
    values, counts = np.unique(np.abs(x[x != 0]).astype(np.float64), return_counts=True)
    error = abs(ours.k / fit_exact(values, counts, "mid80").k - 1)
    assert f"{small.numel}-value token-type embedding" in readme
    assert f"off by {error:.1e} in k (mid80)".replace("e-0", "e-") in readme


def test_no_user_facing_text_cites_a_seed_file() -> None:
    # Users have no seed files: sources are cited by title (weightdiag/citations.py).
    files = [*(ROOT / "weightdiag").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if "seed 00" in line.lower()]  # fmt: skip
    assert not hits, hits


def test_empty_findings_and_norm_table_name_the_norm_article() -> None:
    from weightdiag.citations import NORM_ARTICLE_SHORT
    from weightdiag.render.health_view import findings_view
    from weightdiag.render.html import _findings, _norms

    assert "Why √d_model Is Your North Star" in findings_view({"findings": []}).plain
    assert "North Star" in _findings({"findings": []})
    assert NORM_ARTICLE_SHORT in _norms({"norms": {"vectors": []}})

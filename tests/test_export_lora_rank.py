"""Issue 40: `--export-lora`'s default reproduces the rank of an exactly low-rank ΔW (a rank-8 merged LoRA came out
at rank 7 under the energy rule alone); the Gram-based factors against numpy's SVD on both sides; the wording of
the output options' errors (`db export --output ''`, a path under a file)."""

from __future__ import annotations

import numpy as np
import pytest

from weightdiag.delta.lora import DEFAULT_ENERGY, factor

from .conftest import run_cli


def _rank8(m: int, n: int) -> np.ndarray:
    """A rank-8 ΔW whose last direction holds well under 10% of its energy."""
    rng = np.random.default_rng(4)
    u, _ = np.linalg.qr(rng.standard_normal((m, 8)))
    v, _ = np.linalg.qr(rng.standard_normal((n, 8)))
    s = np.array([1, 1, 1, 1, 1, 1, 1, 0.8])  # the last direction holds 0.64 of 7.64: 8.4%
    return ((u * s) @ v.T).astype(np.float32)


@pytest.mark.parametrize("shape", [(300, 200), (200, 300)])  # the right and the left Gram
def test_the_default_keeps_the_rank_of_an_exactly_low_rank_delta(shape):
    delta = _rank8(*shape)
    energy = factor(delta, energy=DEFAULT_ENERGY)
    assert energy.rank == 7 and not energy.exact  # 8.4% beyond rank 7: under 10%
    default = factor(delta)
    assert default.rank == 8 and default.exact and default.error < 1e-3
    np.testing.assert_allclose(default.b.astype(np.float64) @ default.a, delta, rtol=0, atol=1e-5)


@pytest.mark.parametrize("shape", [(120, 80), (80, 120)])
def test_a_full_rank_delta_gets_the_energy_rule_by_default_and_numpys_truncated_svd(shape):
    rng = np.random.default_rng(9)
    delta = rng.standard_normal(shape) @ np.diag(np.linspace(1, 0.01, shape[1]) ** 2)
    delta = delta.astype(np.float32)
    f = factor(delta)
    assert not f.exact and f.rank == factor(delta, energy=DEFAULT_ENERGY).rank
    u, s, vt = np.linalg.svd(delta.astype(np.float64), full_matrices=False)
    best = (u[:, : f.rank] * s[: f.rank]) @ vt[: f.rank]
    np.testing.assert_allclose(f.b.astype(np.float64) @ f.a, best, rtol=0, atol=1e-5 * s[0])
    assert f.energy == pytest.approx(np.sum(s[: f.rank] ** 2) / np.sum(s**2), rel=1e-9)
    assert f.energy >= DEFAULT_ENERGY and np.sum(s[: f.rank - 1] ** 2) / np.sum(s**2) < DEFAULT_ENERGY


def test_a_zero_delta_has_rank_zero():
    f = factor(np.zeros((40, 30), dtype=np.float32))
    assert f.rank == 0 and f.error == 0 and f.b.shape == (40, 0)


@pytest.mark.parametrize(
    ("where", "words"),
    [("", "--output names no file; give a file path such as rows.csv"), ("/dev/null/x.csv", "is not a folder")],
)
def test_db_export_output_errors_are_one_line_naming_the_option(where, words, tmp_path):
    done = run_cli("db", "export", "--output", where, "--db", str(tmp_path / "db"))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--output" in done.stderr and words in done.stderr


def test_export_lora_of_an_empty_path_is_one_line_naming_the_option(tmp_path):
    done = run_cli("diff", str(tmp_path), str(tmp_path), "--export-lora", "", "--no-save")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--export-lora names no folder" in done.stderr

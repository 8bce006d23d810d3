"""The spectrum of ΔW from row blocks (weightdiag.delta.spectrum) against a full numpy SVD."""

from __future__ import annotations

import numpy as np
import pytest

from weightdiag.delta.spectrum import Gram, Sketch, accumulator, rank90_bounds, rank_at


def feed(acc, a: np.ndarray, rows: int):
    """Row blocks in order, as the paired stream hands them."""
    for r0 in range(0, a.shape[0], rows):
        acc.fold(acc.block_part(r0, a[r0 : r0 + rows]))
    return acc


def svd_rank90(a: np.ndarray) -> tuple[int, np.ndarray]:
    s = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    return rank_at(s**2, float(np.sum(a.astype(np.float64) ** 2))), s


def planted(m: int, n: int, r: int, seed: int, scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal((m, r)) @ rng.standard_normal((r, n)) / np.sqrt(r)).astype(np.float32)


def decaying(m: int, n: int, seed: int, decay: float = 0.93) -> np.ndarray:
    """Full rank with a geometric spectrum: rank90 well inside a sketch of 64."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, min(m, n))))
    v, _ = np.linalg.qr(rng.standard_normal((n, min(m, n))))
    s = decay ** np.arange(min(m, n))
    return ((u * s) @ v.T).astype(np.float32)


@pytest.mark.parametrize("r", [1, 4, 16])
def test_planted_rank_r_is_recovered_exactly_by_the_sketch(r):
    a = planted(300, 1200, r, seed=r)
    acc = feed(Sketch(300, 1200, seed=1, cap=32), a, 37)
    total = float(np.sum(a.astype(np.float64) ** 2))
    spec = acc.result(total)
    truth, s = svd_rank90(a)
    assert spec.method == "sketch"
    assert spec.rank90 == truth
    np.testing.assert_allclose(spec.singular[: min(r, 8)], s[: min(r, 8)], rtol=1e-4)
    assert spec.error < 1e-4  # rank <= k: Â = ΔW up to rounding


def test_gram_is_exact_against_the_svd():
    a = decaying(500, 96, seed=3) + planted(500, 96, 3, seed=4)
    spec = feed(Gram(500, 96), a, 64).result(float(np.sum(a.astype(np.float64) ** 2)))
    truth, s = svd_rank90(a)
    assert spec.method == "exact" and spec.rank90 == truth
    np.testing.assert_allclose(spec.singular, s[:8], rtol=1e-6)


def test_full_rank_noise_is_reported_beyond_the_sketch():
    """rank90 of Gaussian noise is ~60% of min(m, n): far beyond k = 32, so the sketch says rank90 > 32."""
    a = np.random.default_rng(5).standard_normal((256, 1100)).astype(np.float32)
    truth, _ = svd_rank90(a)
    spec = feed(Sketch(256, 1100, seed=0, cap=32), a, 50).result(float(np.sum(a.astype(np.float64) ** 2)))
    assert truth > 100
    assert spec.rank90 is None  # the error estimate cannot pin it: never a spuriously small rank90
    lo, hi = spec.rank90_range
    assert hi is None and spec.rank90_at_least == lo <= truth


@pytest.mark.parametrize(("seed", "noise"), [(0, 0.0), (1, 0.0), (2, 1e-4), (3, 2e-4), (4, 1e-3)])
def test_rank90_within_the_stated_bound(seed, noise):
    """The documented bound: ||σ̂ - σ|| <= ||ΔW - Â||_F = e (Mirsky), so the true rank90 lies in
    rank90_bounds(σ̂, e), reported as rank90_range with e estimated (x1.5); e itself within Tropp et al.'s
    Theorem 4.3 (an expectation: allowed 3x here), and estimated within 2x."""
    a = decaying(400, 1500, seed=seed, decay=0.9)
    a += noise * np.random.default_rng(seed).standard_normal(a.shape).astype(np.float32)
    total = float(np.sum(a.astype(np.float64) ** 2))
    acc = feed(Sketch(400, 1500, seed=seed, cap=64), a, 33)
    spec = acc.result(total)
    q, x = acc.factors(a @ acc.omega)  # Y = ΔW Ω, as the stream forms it (and never keeps)
    e = float(np.linalg.norm(a - q @ x))
    truth, s = svd_rank90(a)
    lo, hi = spec.rank90_range
    assert lo <= truth and (hi is None or truth <= hi)
    sketch_sv = np.linalg.svd(x, compute_uv=False)
    mirsky_lo, mirsky_hi = rank90_bounds(sketch_sv, total, e)  # with the true error: a certainty
    assert mirsky_lo <= truth <= mirsky_hi
    if noise == 0.0:  # a spectrum the sketch holds: rank90 pinned, and right
        assert spec.rank90 == truth
    if spec.rank90 is not None:
        assert lo <= spec.rank90 <= hi
    k, ell = acc.k, acc.l
    f = lambda a_, b_: a_ / (b_ - a_ - 1)  # noqa: E731
    bound = (1 + f(k, ell)) * min((1 + f(rho, k)) * float(np.sum(s[rho:] ** 2)) for rho in range(k - 1))
    assert e**2 <= 3 * bound
    assert 0.5 <= spec.error * np.sqrt(total) / e <= 2.0


def test_a_scaled_matrix_has_the_spectrum_of_the_matrix():
    w = decaying(300, 1100, seed=9, decay=0.9)
    a = 0.05 * w  # ΔW of W_tuned = 1.05 W_base
    total = float(np.sum(a.astype(np.float64) ** 2))
    spec = feed(Sketch(300, 1100, seed=0, cap=64), a, 64).result(total)
    truth, s = svd_rank90(a)
    assert spec.rank90 == truth
    np.testing.assert_allclose(spec.singular[0], s[0], rtol=1e-3)


def test_the_sketch_is_deterministic_whatever_the_thread_order():
    a = decaying(200, 1100, seed=1)
    total = float(np.sum(a.astype(np.float64) ** 2))
    one = feed(Sketch(200, 1100, seed=3, cap=16), a, 40).result(total)
    two = feed(Sketch(200, 1100, seed=3, cap=16), a, 40).result(total)
    assert one == two
    other = feed(Sketch(200, 1100, seed=4, cap=16), a, 40).result(total)
    assert other.singular != one.singular


def test_a_zero_delta_has_rank_0():
    a = np.zeros((64, 2000), dtype=np.float32)
    spec = feed(accumulator(64, 2000, False, cap=16), a, 16).result(0.0)
    assert spec.rank90 == 0
    spec = feed(accumulator(64, 32, False), a[:, :32], 16).result(0.0)
    assert spec.rank90 == 0


def test_torch_device_path_matches_numpy():
    pytest.importorskip("torch")
    a = planted(120, 1100, 5, seed=2)
    total = float(np.sum(a.astype(np.float64) ** 2))
    cpu = feed(Sketch(120, 1100, seed=0, cap=16), a, 30).result(total)
    on_torch = feed(Sketch(120, 1100, seed=0, cap=16, device="cpu", backend="torch"), a, 30).result(total)
    assert on_torch.rank90 == cpu.rank90 == 5
    np.testing.assert_allclose(on_torch.singular[:5], cpu.singular[:5], rtol=1e-4)  # the rest is rounding


def test_blas_is_single_threaded_only_inside_and_restored():
    from weightdiag.reduce.blas import blas_threads, openblas_controls

    controls = openblas_controls()
    if not controls:
        pytest.skip("numpy's BLAS is not OpenBLAS here")
    get, _ = controls[0]
    before = get()
    with blas_threads(1):
        assert get() == 1
    assert get() == before

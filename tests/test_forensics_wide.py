"""The subspace figures of matrices too wide for a Gram (delta/wide.py): planted wide matrices read in many row
blocks (the gram_cols knob at 64, blocks of 8 rows) against the exact Gram path on the same data (one block,
gram_cols 128: W W^T), each matrix's class (untouched, merged LoRA, dense update along the base's top directions,
isotropic noise, an int4 copy), the null (noise never classed principal), and the sketch alone against numpy's
SVD on a whole matrix."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from weightdiag import tuning
from weightdiag.delta import forensics
from weightdiag.delta import mechanism as rules
from weightdiag.delta.result import DiffOptions, TensorDiff
from weightdiag.delta.wide import SIDE, WideSketch
from weightdiag.run.diff import diff

from .diff_checkpoints import low_rank_update, write

M, N = 128, 512  # each matrix: wider than gram_cols 64 and read in 16 blocks on the sketch path
SKETCHED = {"block_elems": 8 * N, "gram_cols": 64}  # no Gram: the wide path
EXACT = {"gram_cols": M}  # one block, m <= gram_cols: the exact left Gram W W^T
NAME = "model.layers.{}.mlp.down_proj.weight"
# what each layer's matrix is made to be (the class matrix_class must give; None: untouched)
PLANTED = {0: None, 1: "exact-low-rank", 2: "dense-principal", 3: "dense-isotropic", 4: "grid"}


def _decaying(m: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """A trained-looking matrix: singular values decaying as i^-0.7 (distinct, so its top subspace is defined)."""
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    v, _ = np.linalg.qr(rng.standard_normal((n, m)))
    return 0.3 * (u * (1.0 + np.arange(m)) ** -0.7) @ v.T


def _principal(w: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A dense update mostly inside w's top-16 singular subspace (an SFT-like lean), a fifth of its norm outside."""
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    lean = (u[:, :16] * s[:16] * rng.standard_normal(16)) @ vt[:16]
    rest = rng.standard_normal(w.shape)
    delta = lean / np.linalg.norm(lean) + 0.2 * rest / np.linalg.norm(rest)
    return w + 0.02 * np.linalg.norm(w) * delta


def _noise(w: np.ndarray, size: float, rng: np.random.Generator) -> np.ndarray:
    return w + size * float(np.std(w)) * rng.standard_normal(w.shape)


def _int4(w: np.ndarray, group: int = 32) -> np.ndarray:
    x = w.reshape(w.shape[0], -1, group)
    scale = np.abs(x).max(axis=-1, keepdims=True) / 7
    return (np.clip(np.round(x / scale), -8, 7) * scale).reshape(w.shape)


def _checkpoint(tensors: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    out = {NAME.format(i): w.astype(np.float32) for i, w in tensors.items()}
    out["model.norm.weight"] = np.ones(M, dtype=np.float32)
    return out


def _config(layers: int) -> dict:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": layers,
            "hidden_size": M, "intermediate_size": N, "num_attention_heads": 4, "vocab_size": 64}  # fmt: skip


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(0)
    base = {i: _decaying(M, N, rng) for i in PLANTED}
    tuned = {
        0: base[0],
        1: low_rank_update(base[1], rank=4, seed=1, scale=0.05),
        2: _principal(base[2], rng),
        3: _noise(base[3], 0.01, rng),
        4: _int4(base[4]),
    }
    config = _config(len(PLANTED))
    b = write(root / "base", _checkpoint(base), config=config)
    return b, write(root / "tuned", _checkpoint(tuned), config=config)


def _run(base: Path, tuned: Path, knobs: dict, **options) -> dict[str, TensorDiff]:
    with tuning.override(**knobs):
        result = diff(str(base), str(tuned), DiffOptions(device="cpu", **options))
    return {t.name: t for t in result.matrices}


@pytest.fixture(scope="module")
def both(planted) -> tuple[dict[str, TensorDiff], dict[str, TensorDiff]]:
    """(exact, sketched) of the planted pair; the sketched with ΔW's spectrum sketched at k = 32 (< min(m, n)),
    so that a dense ΔW's rank999 is a lower bound there, a LoRA's pinned."""
    return _run(*planted, EXACT), _run(*planted, SKETCHED, sketch=32)


def test_the_paths_are_the_ones_meant(both):
    exact, sketched = both
    for i in PLANTED:
        e, s = exact[NAME.format(i)], sketched[NAME.format(i)]
        assert e.forensics is not None and e.forensics.side == "left" and e.spectrum.method == "exact"
        assert s.forensics is not None and s.forensics.side == SIDE and s.spectrum.method == "sketch"
        assert s.forensics.basis == 64 and s.forensics.to_json()["method"] == "sketch"
        assert e.forensics.to_json()["method"] == "gram" and e.forensics.basis is None


def test_an_untouched_wide_matrix_is_one_subspace_exactly(both):
    f = both[1][NAME.format(0)].forensics
    assert f is not None and f.k == forensics.TOP_K
    assert f.overlap == 1.0 and f.spectral_drift == 0.0 and f.intruders == 0
    assert set(f.principal_cosines) == {1.0} and f.principal_energy is None


@pytest.mark.parametrize("layer", [i for i, c in PLANTED.items() if c])
def test_each_planted_wide_matrix_is_classed_as_made_on_both_paths(both, layer):
    for path in both:
        assert rules.matrix_class(path[NAME.format(layer)]) == PLANTED[layer]


def test_a_dense_sketched_delta_is_dense_by_its_rank999_lower_bound_and_a_lora_pinned(both):
    exact, sketched = both
    lora = sketched[NAME.format(1)].spectrum
    assert lora.rank999 == lora.rank999_at_least == 4
    for layer in (2, 3, 4):  # dense: a lower bound beyond the class's cap (12), and below the true rank999
        name = NAME.format(layer)
        dense = sketched[name].spectrum
        assert dense.rank999 is None and 12 < dense.rank999_at_least <= exact[name].spectrum.rank999


def test_a_sketched_rank999_neither_pinned_nor_bounded_beyond_the_cap_is_unclassified(both):
    """matrix_class on the dense-isotropic matrix with its spectrum's lower bound moved: beyond the cap (12) it is
    dense, at or below it unclassified (it might be low rank), pinned within it exact-low-rank."""
    from dataclasses import replace

    t = both[1][NAME.format(3)]
    assert t.spectrum is not None
    cases = ((None, 13, "dense-isotropic"), (None, 12, "unclassified"), (5, 5, "exact-low-rank"))
    for rank, at_least, expected in cases:
        spectrum = replace(t.spectrum, rank999=rank, rank999_at_least=at_least)
        assert rules.matrix_class(replace(t, spectrum=spectrum)) == expected


@pytest.mark.parametrize("tail", [0.0, 5e-4, 5e-3, 0.3])
def test_the_sketchs_rank999_lower_bound_never_exceeds_the_true_rank999(tail):
    """A rank-8 ΔW with a full-rank tail holding `tail` of its energy: the bound stays at or below numpy's
    rank999 (8 while the tail is under 0.1%), and passes the cap once the tail is large."""
    from weightdiag.delta.spectrum import Sketch, rank_at

    rng = np.random.default_rng(9)
    low = rng.standard_normal((600, 8)) @ rng.standard_normal((8, 900))
    noise = rng.standard_normal(low.shape)
    delta = low + np.sqrt(tail * np.sum(low**2) / np.sum(noise**2) / (1 - tail)) * noise if tail else low
    delta = delta.astype(np.float32)
    truth = rank_at(np.linalg.svd(delta.astype(np.float64), compute_uv=False) ** 2, float(np.sum(delta**2.0)), 0.999)
    sketch = Sketch(*delta.shape, seed=0, cap=32)
    for r0 in range(0, delta.shape[0], 100):
        sketch.fold(sketch.block_part(r0, delta[r0 : r0 + 100]))
    spectrum = sketch.result(float(np.sum(delta.astype(np.float64) ** 2)))
    assert spectrum.rank999_at_least <= truth
    if tail == 0.3:
        assert spectrum.rank999_at_least > 12


# Agreement with the exact left Gram on the same data (measured: overlap within 2e-4, drift within 8%, the
# principal energy of the leaning update 0.84 of the exact, the isotropic ones within 2%); the bounds leave room.
@pytest.mark.parametrize("layer", [1, 2, 3])
def test_the_sketched_figures_are_the_exact_gram_paths_within_tolerance(both, layer):
    e, s = (path[NAME.format(layer)].forensics for path in both)
    assert e is not None and s is not None
    assert s.isotropic_energy == e.isotropic_energy == forensics.TOP_K / M
    assert s.overlap == pytest.approx(e.overlap, abs=2e-3)
    assert s.spectral_drift == pytest.approx(e.spectral_drift, rel=0.25)
    for a, b in zip(s.singular_change[:4], e.singular_change[:4], strict=True):
        assert a == pytest.approx(b, rel=0.25, abs=1e-4)
    if layer == 2:  # the sketched top-16 is a blur of the exact: less of a leaning ΔW in it, never more
        assert 0.6 * e.principal_energy <= s.principal_energy <= 1.05 * e.principal_energy
    else:
        assert s.principal_energy == pytest.approx(e.principal_energy, rel=0.1)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_a_planted_intruder_is_found_by_the_sketch_as_by_the_exact_gram_and_small_noise_gives_none(seed):
    rng = np.random.default_rng(seed)
    base = _decaying(M, N, rng)
    x, y = rng.standard_normal(M), rng.standard_normal(N)
    # a new direction three times as strong as the base's first: the tuned's first, spread over the base's
    intruded = base + 3 * np.linalg.norm(base, 2) * np.outer(x / np.linalg.norm(x), y / np.linalg.norm(y))
    for tuned, ranks in ((intruded, (1,)), (_noise(base, 0.01, rng), ())):
        f, e = _sketched(base, tuned), _exact(base, tuned)
        assert f.intruder_ranks == e.intruder_ranks == ranks, (f.intruder_cosines, e.intruder_cosines)
        # the base's 64 sketched vectors resolve its 10th less well than the exact basis (measured: 0.86 against
        # 1.00 at worst), far above the intruder threshold 0.5
        np.testing.assert_allclose(f.intruder_cosines, e.intruder_cosines, atol=0.2)


def _exact(base: np.ndarray, tuned: np.ndarray) -> forensics.Forensics:
    """The exact left path (W W^T) on the whole matrix."""
    acc = forensics.Accumulator(*base.shape, "left")
    b32, t32 = base.astype(np.float32), tuned.astype(np.float32)
    acc.fold(acc.block_part(b32, t32))
    d = t32.astype(np.float64) - b32
    return acc.result(d @ d.T)


def _sketched(base: np.ndarray, tuned: np.ndarray, rows: int = 8) -> forensics.Forensics:
    """The sketch over row blocks of `rows`, its parts pickled on the way (as to a Ray node)."""
    wide = WideSketch(*base.shape, seed=0)
    b32, t32 = base.astype(np.float32), tuned.astype(np.float32)
    for r0 in range(0, base.shape[0], rows):
        wide.fold(pickle.loads(pickle.dumps(wide.block_part(b32[r0 : r0 + rows], t32[r0 : r0 + rows]))))
    counts = forensics.Accumulator(*base.shape, None).result(None)
    return wide.result(counts, float(np.sum((t32.astype(np.float64) - b32) ** 2)))


def test_the_sketch_alone_against_numpys_svd_of_the_whole_matrix():
    rng = np.random.default_rng(5)
    base = _decaying(M, N, rng)
    tuned = _principal(base, rng)
    f = _sketched(base, tuned)
    ub, sb, _ = np.linalg.svd(base.astype(np.float32).astype(np.float64), full_matrices=False)
    ut, st, _ = np.linalg.svd(tuned.astype(np.float32).astype(np.float64), full_matrices=False)
    k = forensics.TOP_K
    cos = np.linalg.svd(ub[:, :k].T @ ut[:, :k], compute_uv=False)
    drift = np.linalg.norm(st[:k] - sb[:k]) / np.linalg.norm(sb[:k])
    d = tuned.astype(np.float32).astype(np.float64) - base.astype(np.float32)
    energy = np.sum((ub[:, :k].T @ d) ** 2) / np.sum(d**2)
    assert f.overlap == pytest.approx(np.mean(cos**2), abs=2e-3)
    assert f.spectral_drift == pytest.approx(drift, rel=0.25)
    assert 0.6 * energy <= f.principal_energy <= 1.05 * energy
    assert f.alpha_base is None and f.alpha_tuned is None  # no power-law fit on l eigenvalues


def test_non_finite_elements_are_left_out_of_the_sketch():
    rng = np.random.default_rng(6)
    base = _decaying(M, N, rng)
    tuned = _noise(base, 0.01, rng)
    spoiled_b, spoiled_t = base.copy(), tuned.copy()
    spoiled_b[5, 7], spoiled_t[70, 300] = np.nan, np.inf
    clean_b, clean_t = base.copy(), tuned.copy()
    clean_b[5, 7] = clean_t[5, 7] = clean_b[70, 300] = clean_t[70, 300] = 0.0
    f, g = _sketched(spoiled_b, spoiled_t), _sketched(clean_b, clean_t)
    assert f.overlap == pytest.approx(g.overlap, rel=1e-9) and f.spectral_drift == pytest.approx(g.spectral_drift)


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("size", [1e-3, 0.03])
def test_null_noise_of_any_size_is_never_classed_principal_on_the_sketch(tmp_path, seed, size):
    rng = np.random.default_rng(seed)
    base = {i: _decaying(M, N, rng) for i in range(3)}
    tuned = {i: _noise(w, size, rng) for i, w in base.items()}
    config = _config(3)
    b = write(tmp_path / "b", _checkpoint(base), config=config)
    t = write(tmp_path / "t", _checkpoint(tuned), config=config)
    for name, rec in _run(b, t, SKETCHED, sketch=32).items():
        assert rules.matrix_class(rec) == "dense-isotropic", (name, rec.forensics)

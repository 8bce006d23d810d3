"""`fit --spectrum --device cuda`: the Gram products and eigensolves with torch on the GPU give the spectra of the
CPU path (BLAS) to rounding, and the same fits. Skipped without a CUDA GPU (run where one is lent)."""

from __future__ import annotations

import pytest

from weightdiag import api
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic

from .test_spectrum_pipeline import TWIN_RTOL, assert_same, spectra

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_cuda_spectra_equal_the_cpu_ones(family, tmp_path):
    spec = synthetic.ModelSpec(family=family, n_layers=2, d_model=256, n_heads=4, ffn_size=1024, vocab=3000)
    folder = synthetic.write_model(tmp_path / family, spec)
    cpu = api.fit_model(str(folder), FitOptions(device="cpu", spectrum=True))
    cuda = api.fit_model(str(folder), FitOptions(device="cuda", spectrum=True))
    assert cuda["run"]["spectrum"]["device"] == "cuda"
    got, want = spectra(cuda), spectra(cpu)
    assert set(got) == set(want) and len(got) >= 14
    for name in want:
        assert_same(got[name], want[name], rtol=TWIN_RTOL, where=name)
    strip = lambda m: {k: v for k, v in m.items() if k != "spectrum"}  # noqa: E731
    assert [strip(m) for m in cuda["matrices"]] == [strip(m) for m in cpu["matrices"]]


def test_cuda_refines_eigenvalues_below_the_grams_floor(tmp_path):
    """fit --spectrum --device cuda on an ill-conditioned tall and wide matrix (singular values 1 .. 1e-7): the
    smallest eigenvalue within 1e-6 relative of a float64 SVD's, as on the CPU (the basis from torch's eigh on
    the GPU, then W times it through a streamed QR)."""
    import numpy as np

    from .test_spectrum_pipeline import ill_conditioned_model

    folder, tensors = ill_conditioned_model(tmp_path)
    row = api.fit_model(str(folder), FitOptions(device="cuda", spectrum=True))
    assert row["run"]["spectrum"]["device"] == "cuda"
    for m in row["matrices"]:
        svd = np.linalg.svd(tensors[m["name"]].astype(np.float64), compute_uv=False) ** 2
        assert abs(m["spectrum"]["sv_min"] ** 2 - svd.min()) <= 1e-6 * svd.min(), m["name"]

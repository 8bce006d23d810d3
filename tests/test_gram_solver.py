"""The spectrum's device eigensolves (issue 41), on torch's CPU device: the solver chosen from the torch build
(pytorch issue 183806), a failed device solve falling back to the host, Grams solved in batches on a thread of
their own with the same eigenvalues as one at a time, and the choice recorded in the row."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weightdiag import api  # noqa: E402
from weightdiag.reduce import gram_torch  # noqa: E402
from weightdiag.reduce.gram_torch import BatchedSolves, Solver, TorchGramSpectrum, choose_solver  # noqa: E402
from weightdiag.run.measure import FitOptions  # noqa: E402

from .conftest import write_safetensors  # noqa: E402


@pytest.mark.parametrize(
    ("torch_version", "cuda", "device", "want"),
    [
        ("2.11.0+cu130", "13.0", "cuda", "each"),  # the build of the report
        ("2.13.1+cu131", "13.1", "cuda", "each"),  # later builds on CUDA 13: no fix published yet
        ("2.11.0", "13.0", "cuda", "each"),
        ("2.5.1+cu124", "12.4", "cuda", "batched"),  # the report's fast build
        ("2.12.0+cu128", "12.8", "cuda", "batched"),  # torch 2.11+ on CUDA 12: not reported
        ("2.10.1+cu130", "13.0", "cuda", "batched"),  # CUDA 13 before torch 2.11: not reported
        ("2.13.0+cpu", None, "cpu", "batched"),
        ("2.13.0+cu130", "13.0", "cpu", "batched"),  # a CUDA build's CPU device: LAPACK, not cuSOLVER
    ],
)
def test_the_solver_follows_the_torch_build(torch_version, cuda, device, want):
    solver = choose_solver(torch_version, cuda, device)
    assert solver.name == want
    assert ("183806" in solver.why) == (want == "each")
    assert solver.record() == {"solver": want, "torch": torch_version, "cuda": cuda, "why": solver.why}


def _grams(sizes: list[int], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        w = rng.standard_normal((n + 5, n))
        out.append(w.T @ w)
    return out


def test_each_solves_small_grams_on_the_host_and_a_failed_device_solve_falls_back(monkeypatch):
    grams = [torch.from_numpy(g) for g in _grams([4, 20])]
    want = [np.linalg.eigvalsh(g.numpy()) for g in grams]
    device_calls: list[int] = []
    real = torch.linalg.eigvalsh
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda g: device_calls.append(g.shape[-1]) or real(g))
    monkeypatch.setattr(gram_torch, "HOST_BELOW", 10)
    each = Solver("each", "2.11.0+cu130", "13.0", "test")
    for got, w in zip(gram_torch.eigvalsh_all(grams, each), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12 * w.max())
    assert device_calls == [20]  # the 4 x 4 one on the host

    def broken(g):
        raise RuntimeError("cusolver error: CUSOLVER_STATUS_EXECUTION_FAILED")

    monkeypatch.setattr(torch.linalg, "eigvalsh", broken)
    batched = Solver("batched", "2.5.1+cu124", "12.4", "test")
    for got, w in zip(gram_torch.eigvalsh_all(grams[1:] * 2, batched), want[1:] * 2, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12 * w.max())


@pytest.mark.parametrize("name", ["batched", "each"])
def test_batched_solves_equal_one_at_a_time(monkeypatch, name):
    """Nine Grams of three sizes, batches of at most two, one of them not finite: every token comes back once,
    with the eigenvalues TorchGramSpectrum.solve gives on its own (tall and wide)."""
    monkeypatch.setattr(gram_torch, "BATCH", 2)
    rng = np.random.default_rng(5)
    shapes = [(30, 12), (12, 30), (40, 12), (25, 7), (30, 12), (7, 25), (50, 7), (12, 40), (30, 12)]
    solves = BatchedSolves(Solver(name, torch.__version__, None, "test"))
    want, got = {}, {}
    for i, (m, n) in enumerate(shapes):
        w = rng.standard_normal((m, n)).astype(np.float32)
        if i == 4:
            w[3, 3] = np.inf
        acc, alone = TorchGramSpectrum(m, n, "cpu"), TorchGramSpectrum(m, n, "cpu")
        for g in (acc, alone):
            g.add(0, w)
        want[i] = alone.solve()
        solves.submit(i, acc)
        got.update(solves.done())
    got.update(solves.done(wait=True))
    solves.close()
    assert sorted(got) == list(range(len(shapes)))
    assert got[4] is None and want[4] is None
    for i, values in want.items():
        if values is not None:
            np.testing.assert_allclose(got[i], values, rtol=1e-12, atol=1e-12 * values.max())


def test_the_row_says_which_solver(tmp_path):
    rng = np.random.default_rng(0)
    path = write_safetensors(
        tmp_path / "model.safetensors",
        {"model.layers.0.mlp.down_proj.weight": ("BF16", rng.standard_normal((64, 128)).astype(np.float32))},
    )
    row = api.fit_model(str(path), FitOptions(device="cpu", spectrum=True))
    assert row["run"]["spectrum"]["solver"]["solver"] == "lapack"


def test_grams_waiting_are_bounded_by_their_bytes(monkeypatch):
    """Below BATCH Grams, the bytes held waiting (a Gram, and a wide matrix's rows) start the solves."""
    monkeypatch.setattr(gram_torch, "BATCH_BYTES", 30 * 30 * 8 * 2)
    solves = BatchedSolves(Solver("batched", torch.__version__, None, "test"))
    rng = np.random.default_rng(2)
    for i in range(3):
        acc = TorchGramSpectrum(40, 30, "cpu")
        acc.add(0, rng.standard_normal((40, 30)).astype(np.float32))
        solves.submit(i, acc)
        assert len(solves._waiting.get(30, ())) == (0 if i == 1 else 1)  # the second one reached the bound
    assert sorted(token for token, _ in solves.done(wait=True)) == [0, 1, 2]
    solves.close()

"""The CUDA fit pipeline's structure (issue 41), run on torch's CPU device: the chunk staged once into one of two
slots, every part of a chunk read back with one synchronisation, privatised int32 sub-histograms, and rows equal
to the CPU path's byte for byte (BF16, F16) or in every fit, max and argmax (F32, whose float64 moments torch sums
in another order)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from weightdiag import tuning  # noqa: E402
from weightdiag.api import fit_path  # noqa: E402
from weightdiag.reduce import device_stage, reduction_torch, stream  # noqa: E402
from weightdiag.run.measure import FitOptions  # noqa: E402
from weightdiag.testing import synthetic  # noqa: E402

_CONTEXT = ("model", "files", "created", "run", "notes")


def _fit(folder, monkeypatch, on_torch: bool) -> dict:
    monkeypatch.setattr(stream, "uses_torch", lambda device: on_torch)
    with tuning.override(split_bytes=1 << 12, local_chunk_bytes=3 << 12, torch_chunk=1000):
        return fit_path(str(folder), FitOptions(device="cpu"))


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_rows_of_the_torch_pipeline_equal_the_cpu_rows(tmp_path, monkeypatch, dtype):
    spec = synthetic.ModelSpec(
        family="gpt_neox", n_layers=2, d_model=96, n_heads=4, n_kv_heads=2, ffn_size=200, vocab=300, dtype=dtype, seed=3
    )
    folder = synthetic.write_model(tmp_path / dtype, spec)
    monkeypatch.setattr(reduction_torch, "SMALL_PART", 2000)  # parts counted in 16 copies and parts in one
    reads: list[int] = []
    original = reduction_torch.read_back
    monkeypatch.setattr(reduction_torch, "read_back", lambda tensors: reads.append(len(tensors)) or original(tensors))
    chunks: list[int] = []
    original_chunk = stream.reduce_chunk

    def counted(*args, **kwargs):
        chunks.append(1)
        return original_chunk(*args, **kwargs)

    monkeypatch.setattr(stream, "reduce_chunk", counted)
    on_torch = _fit(folder, monkeypatch, True)
    assert reads and chunks, "the torch path did not run"
    # one read back per chunk, a second one for the power sums of F32 parts (an empty round reads nothing)
    assert len([r for r in reads if r]) <= len(chunks) * (2 if dtype == "F32" else 1)
    reads.clear()
    on_cpu = _fit(folder, monkeypatch, False)
    assert not reads
    assert len(on_cpu["matrices"]) == len(on_torch["matrices"]) > 0
    if dtype != "F32":
        science = [{k: v for k, v in r.items() if k not in _CONTEXT} for r in (on_cpu, on_torch)]
        assert json.dumps(science[0], sort_keys=True) == json.dumps(science[1], sort_keys=True)
    else:
        for a, b in zip(on_cpu["matrices"], on_torch["matrices"], strict=True):
            assert (a["name"], a["fits"], a["argmax"]) == (b["name"], b["fits"], b["argmax"])
            assert a["stats"]["max_abs"] == b["stats"]["max_abs"]
            assert a["stats"]["std"] == pytest.approx(b["stats"]["std"], rel=1e-12)


def test_sub_histograms_equal_bincount_across_flushes(monkeypatch):
    """Counts exact whatever the copies hold: a planted flush limit of 50 forces many int32 flushes."""
    rng = np.random.default_rng(1)
    codes = torch.from_numpy(rng.integers(0, 300, size=10_000)).to(torch.int64)
    codes[:3000] = 7  # one hot bin, as trained weights fill a few
    for small_part in (1 << 20, 100):  # one copy, or COPIES of them
        monkeypatch.setattr(reduction_torch, "SMALL_PART", small_part)
        for limit in (50, reduction_torch._INT32_MAX):
            monkeypatch.setattr(reduction_torch, "_INT32_MAX", limit)
            hist = reduction_torch.SubHistograms(300, "cpu", 1000, codes.numel())
            assert hist.copies == (1 if small_part > codes.numel() else reduction_torch.COPIES)
            for start in range(0, codes.numel(), 1000):
                hist.add(codes[start : start + 1000])
            assert torch.equal(hist.total(), torch.bincount(codes, minlength=300))


def test_a_chunk_is_staged_once_and_two_device_buffers_bound_the_device(monkeypatch):
    """Four workers, three host buffers, two device buffers: never more held at once, each chunk's bytes copied
    once (a misaligned piece on its own), the counts equal, every buffer given back."""
    monkeypatch.setattr(device_stage, "HOST_SLOTS", 3)
    staging = device_stage.Staging("cpu")
    staged: list[int] = []
    original = device_stage.Staged.put
    monkeypatch.setattr(device_stage.Staged, "put", lambda self, buf: staged.append(buf.size) or original(self, buf))
    held, most, lock = [0], [0], threading.Lock()
    errors: list[str] = []

    def worker(seed: int) -> None:
        buf = np.random.default_rng(seed).integers(0, 255, size=4096 + seed, dtype=np.uint8)
        chunk = device_stage.Staged(staging)
        try:
            pieces = stream.DevicePieces("cpu", buf, chunk)
            parts = pieces(buf[2:2050], "BF16", [None], 1)  # an aligned piece: a slice of the staged chunk
            parts += pieces(buf[3:2051], "BF16", [None], 1)  # a misaligned one: copied on its own
            with lock:
                held[0] += 1
                most[0] = max(most[0], held[0])
            if not np.array_equal(chunk._host.data[: buf.size].numpy(), buf):
                errors.append("staged bytes differ")
            time.sleep(0.05)
            reds = reduction_torch.resolve([p for ps in parts for p in ps])
            for red, lo in zip(reds, (2, 3), strict=True):
                want = reduction_torch.reduce_torch(buf[lo : lo + 2048].copy(), "BF16", "cpu")
                if not np.array_equal(red.counts, want.counts):
                    errors.append("counts differ")
            with lock:
                held[0] -= 1
        finally:
            chunk.release()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert most[0] == device_stage.SLOTS == 2
    assert sorted(staged) == [4096, 4097, 4098, 4099]
    assert staging.hosts.qsize() == 3 and staging.devices.qsize() == 2

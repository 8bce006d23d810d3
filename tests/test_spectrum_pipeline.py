"""`fit --spectrum` end to end: each matrix record's `spectrum` in the row equals fit/esd.py on the whole matrix
computed in numpy, for every record a tensor is cut into (fused qkv parts, experts, MLA's k/v rows), from
local files, the loopback Hub, GGUF and quantized checkpoints; the torch path on torch's CPU device; what
has no spectrum says why; the plain fit is unchanged; the options travel to sweeps; progress is reported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from weightdiag import api
from weightdiag.execution import Execution
from weightdiag.fit.esd import fit_spectrum
from weightdiag.record.spectrum import spectrum_record
from weightdiag.reduce.farms import farms_eigenvalues, window_plan
from weightdiag.reduce.gram import matrix_eigenvalues
from weightdiag.run.measure import FitOptions
from weightdiag.segments import Segments
from weightdiag.testing import synthetic

from . import layout_checkpoints as lc
from .conftest import run_cli, write_safetensors

FLOAT_RTOL = 1e-9  # the same eigenvalues (the same row blocks): the row's 10 significant digits
TWIN_RTOL = 1e-6  # the same matrix summed in other blocks or transposed: rounding of the Gram's sums


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values as a BF16 file holds them."""
    return (synthetic.to_bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(x.shape)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every F32/BF16/F16 tensor of a safetensors file as float32 (numpy only)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        data = raw[8 + n + lo : 8 + n + hi]
        dtype = info["dtype"]
        if dtype == "BF16":
            values = (np.frombuffer(data, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
        elif dtype in ("F32", "F16"):
            values = np.frombuffer(data, {"F32": np.float32, "F16": np.float16}[dtype]).astype(np.float32)
        else:
            continue
        out[name] = values.reshape(info["shape"])
    return out


def expected(w: np.ndarray, farms: bool = False) -> dict[str, Any]:
    """fit/esd.py on the whole matrix, in numpy, as the row writes it."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    evals = matrix_eigenvalues(w, block_rows=w.shape[0])
    pooled = farms_eigenvalues(w) if farms else None
    windows = window_plan(*w.shape).count if farms else None
    return spectrum_record(fit_spectrum(evals, *w.shape, farms_evals=pooled, farms_windows=windows), evals)


def assert_same(got: dict[str, Any], want: dict[str, Any], rtol: float = FLOAT_RTOL, where: str = "") -> None:
    assert set(got) == set(want), (where, set(got) ^ set(want))
    for key, value in want.items():
        if key == "esd":
            if rtol == FLOAT_RTOL:
                assert got[key] == value, (where, key)
            else:  # an eigenvalue on a bin edge may move by one bin
                assert got[key]["below"] == value["below"] and sum(got[key]["counts"]) == sum(value["counts"])
            continue
        if isinstance(value, float) and isinstance(got[key], float):
            assert math.isclose(got[key], value, rel_tol=rtol, abs_tol=1e-300), (where, key, got[key], value)
        else:
            assert got[key] == value, (where, key, got[key], value)


def spectra(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for m in row["matrices"]:
        if "spectrum" in m:
            out[m["name"]] = m["spectrum"]
        for i, p in enumerate(m.get("parts", ())):
            if "spectrum" in p:
                out[f"{m['name']}#{i}"] = p["spectrum"]
    return out


# --- local safetensors through the CLI: whole matrices and fused parts ------------------------------------


@pytest.fixture(scope="module")
def neox(tmp_path_factory) -> Path:
    """GPT-NeoX: a fused query_key_value whose q/k/v rows interleave per head, BF16."""
    spec = synthetic.ModelSpec(family="gpt_neox", n_layers=2, d_model=96, n_heads=4, ffn_size=256, vocab=320)
    return synthetic.write_model(tmp_path_factory.mktemp("neox"), spec)


@pytest.mark.e2e
def test_cli_spectrum_of_every_matrix_and_fused_part_equals_numpy_on_the_whole_matrix(neox, tmp_path):
    out = run_cli("fit", str(neox), "--spectrum", "--json", "--no-save", "-q", "--db", str(tmp_path))
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["schema"] == "weightdiag.row/2"
    weights = read_safetensors(neox / "model.safetensors")
    checked = 0
    for m in row["matrices"]:
        w = weights[m["name"]]
        assert_same(m["spectrum"], expected(w), where=m["name"])
        checked += 1
        if m["kind"] == "qkv":
            heads, hd = 4, 96 // 4
            per_head = w.reshape(heads, 3, hd, w.shape[1])
            assert [p["kind"] for p in m["parts"]] == ["q", "k", "v"]
            for i, part in enumerate(m["parts"]):
                assert_same(part["spectrum"], expected(per_head[:, i].reshape(heads * hd, -1)), where=part["kind"])
                checked += 1
    assert row["run"]["spectrum"]["matrices"] == checked == 2 * (4 + 3) + 2
    assert row["run"]["spectrum"]["device"] == "cpu" and row["run"]["spectrum"]["farms"] is False
    assert set(row["spectrum_kinds"]) == {m["kind"] for m in row["matrices"]}


def test_the_plain_fit_is_unchanged_and_has_no_spectrum(neox):
    row = api.fit_model(str(neox), FitOptions(device="cpu"))
    assert row["schema"] == "weightdiag.row/1"
    assert "spectrum_kinds" not in row and "spectrum" not in row["run"]
    assert not any("spectrum" in json.dumps(m) for m in row["matrices"])
    with_spectra = api.fit_model(str(neox), FitOptions(device="cpu", spectrum=True))
    for a, b in zip(row["matrices"], with_spectra["matrices"], strict=True):  # the same fits: spectra added
        assert {k: v for k, v in b.items() if k != "spectrum"} | {
            "parts": [{k: v for k, v in p.items() if k != "spectrum"} for p in b.get("parts", [])]
        } == a | {"parts": a.get("parts", [])}


# --- records cut from a stored tensor: experts, MLA's rows, interleaved gate/up --------------------------


@pytest.mark.parametrize("family", ["gpt_oss", "llama4", "deepseek_v3"])
def test_records_cut_from_fused_tensors_each_get_their_own_spectrum(family, tmp_path):
    config, tensors = getattr(lc, family)()
    folder = lc.write(tmp_path / family, config, tensors)
    row = api.fit_model(str(folder), FitOptions(device="cpu", spectrum=True))
    stored = {name: (bf16(v) if dtype == "BF16" else v) for name, (dtype, v) in tensors.items()}
    cut = 0
    for m in row["matrices"]:
        if "spectrum_skipped" in m:
            assert len(stored[m["name"]].shape) > 2, m
            continue
        if "slice_of" in m:
            off, length, stride, count = m["slice_of"]["segments"]
            flat = stored[m["slice_of"]["tensor"]].reshape(-1)
            piece = Segments(off, length, stride, count).view(flat).reshape(-1)
            w = piece.reshape(m["shape"][::-1]).T if _stored_in_out(m) else piece.reshape(m["shape"])
            cut += 1
        else:
            w = stored[m["name"]]
        assert_same(m["spectrum"], expected(w), where=m["name"])
    assert cut > 0


def _stored_in_out(m: dict[str, Any]) -> bool:
    """Fused experts stored (in, out) (gpt-oss, Llama-4): the record's matrix is the piece transposed."""
    return "experts" in m["slice_of"]["tensor"] and not m["slice_of"]["tensor"].endswith("_blocks")


# --- the loopback Hub ---------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_hub_spectra_equal_the_local_ones(fake_hub, tmp_path, monkeypatch, knobs):
    from .hub_server import small_model_in_small_chunks

    folder = small_model_in_small_chunks(fake_hub, tmp_path / "m", monkeypatch, knobs)
    options = FitOptions(device="cpu", spectrum=True, connections=4)
    hub = api.fit_model("acme/tiny", options)
    local = api.fit_model(str(folder), options)
    assert spectra(hub) == spectra(local) and len(spectra(hub)) == 2 * 7 + 2
    assert all(f["verified"] for f in hub["files"])  # the spectrum pass reads after the verified pass


# --- GGUF and quantized checkpoints: dequantized as fit does ------------------------------------------------


def test_gguf_spectra_equal_those_of_the_decoded_matrices(smollm_gguf):
    from weightdiag.decode.group import group_quantized
    from weightdiag.decode.loader import CompanionLoader
    from weightdiag.reduce.row_stream import float32_of
    from weightdiag.source.open import open_model

    include = ("blk.0.*", "token_embd.weight")
    row = api.fit_model(str(smollm_gguf), FitOptions(device="cpu", spectrum=True, include=include))
    plan, reader = open_model(str(smollm_gguf))
    with reader:
        group_quantized(plan, reader.tensor_bytes)
        refs = {r.name: r for r in plan.tensors}
        checked = 0
        for m in row["matrices"]:
            ref = refs[m["name"]]
            raw = reader.tensor_bytes(ref)
            if ref.quant is not None:
                loader = CompanionLoader(reader.tensor_bytes, [ref.quant])
                values, first = loader.decoder(0).decode(raw, 0)
                loader.close()
                assert first == 0
                values = values if values.dtype == np.float32 else float32_of(values.view(np.uint8), ref.dtype.name)
            else:
                values = float32_of(raw, ref.dtype.name)
            w = values.reshape(ref.shape)
            assert_same(m["spectrum"], expected(w), rtol=TWIN_RTOL, where=m["name"])
            checked += 1
    assert checked == 8  # token_embd (49152 x 576, tall) and blk.0 q, k, v, o, gate, up, down
    assert any(m.get("quantization") for m in row["matrices"])


@pytest.mark.parametrize("kind", ["gptq", "awq", "fp8"])
def test_quantized_spectra_equal_the_dequantized_twins(kind, minilm_dir, tmp_path):
    from . import quant_checkpoints as qc
    from . import quant_gptq_checkpoints as gq

    quantizer, config = {
        "gptq": (gq.gptq, gq.GPTQ_CONFIG),
        "awq": (gq.awq, gq.AWQ_CONFIG),
        "fp8": (qc.fp8_block, qc.FP8_BLOCK_CONFIG),
    }[kind]
    qdir, tdir = qc.write_pair(tmp_path, minilm_dir, quantizer(), config, layers=1)
    options = FitOptions(device="cpu", spectrum=True)
    quantized, twin = api.fit_model(str(qdir), options), api.fit_model(str(tdir), options)
    got, want = spectra(quantized), spectra(twin)
    assert set(got) == set(want) and len(got) >= 7
    for name in want:
        assert_same(got[name], want[name], rtol=TWIN_RTOL, where=name)
    assert any(m.get("dequantized") for m in quantized["matrices"])


# --- torch on a device (tested on torch's CPU device), FARMS, what has no spectrum ---------------------------


def test_the_torch_path_on_its_cpu_device_equals_blas(neox):
    pytest.importorskip("torch")
    from weightdiag.reduce.gram_torch import TorchGramSpectrum
    from weightdiag.run.spectrum import SpectrumInput, plan_spectra, record_names, take_spectra
    from weightdiag.source.local import open_local

    plan, reader = open_local(str(neox))
    inputs = [SpectrumInput(ref) for ref in plan.tensors if len(ref.shape) == 2]
    planned = plan_spectra(inputs, lambda i: record_names(i.views, i.ref.name))
    execution = Execution(threads=2, chunk_workers=2)
    with reader:
        blas = take_spectra(planned, reader, execution)
    plan, reader = open_local(str(neox))
    with reader:
        torch = take_spectra(planned, reader, execution, factory=lambda m, n: TorchGramSpectrum(m, n, "cpu"))
    assert set(blas.spectra) == set(torch.spectra) and len(blas.spectra) == 2 * 4 + 2
    for key, want in blas.spectra.items():
        assert_same(torch.spectra[key], want, rtol=TWIN_RTOL, where=str(key))


@pytest.mark.parametrize("shape", [(300, 40), (40, 300)])
def test_torch_gram_eigenvalues_tall_and_wide(shape):
    pytest.importorskip("torch")
    from weightdiag.reduce.gram_torch import TorchGramSpectrum

    w = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    acc = TorchGramSpectrum(*shape, "cpu")
    for r0 in range(0, shape[0], 7):
        acc.add(r0, w[r0 : r0 + 7])
    got, want = acc.eigenvalues(), matrix_eigenvalues(w)
    assert got.shape == (40,) and np.allclose(got, want, rtol=0, atol=1e-12 * want.max())
    assert acc.finite()
    w[5, 5] = np.nan
    bad = TorchGramSpectrum(*shape, "cpu")
    bad.add(0, w)
    assert not bad.finite()


def _ill_conditioned(m: int, n: int, seed: int) -> np.ndarray:
    """float32 weights with singular values from 1 down to 1e-7 (eigenvalues below the Gram's floor)."""
    rng = np.random.default_rng(seed)
    k = min(m, n)
    u = np.linalg.qr(rng.standard_normal((m, k)))[0]
    v = np.linalg.qr(rng.standard_normal((n, k)))[0]
    return ((u * np.geomspace(1.0, 1e-7, k)) @ v.T).astype(np.float32)


def ill_conditioned_model(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A model folder with one tall and one wide F32 matrix whose singular values fall from 1 to 1e-7."""
    tensors = {
        "model.layers.0.mlp.up_proj.weight": _ill_conditioned(300, 160, 1),
        "model.layers.0.mlp.down_proj.weight": _ill_conditioned(160, 300, 2),
    }
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {k: ("F32", w) for k, w in tensors.items()})
    return folder, tensors


def test_eigenvalues_below_the_grams_floor_are_refined_through_the_pipeline(tmp_path):
    """A tall matrix (refined by a second pass over its rows) and a wide one (from its held rows), through
    fit --spectrum on the CPU and take_spectra with the torch accumulator on torch's CPU device: the smallest
    eigenvalue (sv_min²) within 1e-6 relative of a float64 SVD's, where the Gram alone misses it by far more."""
    pytest.importorskip("torch")
    from weightdiag.reduce.gram import GramSpectrum
    from weightdiag.reduce.gram_torch import TorchGramSpectrum
    from weightdiag.run.spectrum import SpectrumInput, plan_spectra, record_names, take_spectra
    from weightdiag.source.local import open_local

    folder, tensors = ill_conditioned_model(tmp_path)
    row = api.fit_model(str(folder), FitOptions(device="cpu", spectrum=True))
    plan, reader = open_local(str(folder))
    inputs = [SpectrumInput(ref) for ref in plan.tensors]
    planned = plan_spectra(inputs, lambda i: record_names(i.views, i.ref.name))
    with reader:
        torch = take_spectra(
            planned, reader, Execution(threads=2, chunk_workers=2), factory=lambda m, n: TorchGramSpectrum(m, n, "cpu")
        )
    for m in row["matrices"]:
        w = tensors[m["name"]]
        svd = np.linalg.svd(w.astype(np.float64), compute_uv=False) ** 2
        want = svd.min()
        assert want < 1e-12 * svd.max()
        for got in (m["spectrum"]["sv_min"] ** 2, torch.spectra[(m["name"], None)]["sv_min"] ** 2):
            assert abs(got - want) <= 1e-6 * want, m["name"]
        alone = GramSpectrum(*w.shape)
        alone.add(0, w)
        assert abs(alone.eigenvalues()[0] - want) > 1e-3 * want  # what the refinement fixes


def test_farms_alpha_equals_the_windows_in_numpy(tmp_path):
    w = np.random.default_rng(5).standard_normal((600, 200)).astype(np.float32) * 0.02
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"model.layers.0.mlp.up_proj.weight": ("F32", w)})
    row = api.fit_model(str(folder), FitOptions(device="cpu", farms=True))
    got = row["matrices"][0]["spectrum"]
    assert got["farms_windows"] == window_plan(600, 200).count and got["alpha_farms"] is not None
    assert_same(got, expected(w, farms=True))
    assert row["run"]["spectrum"]["farms"] is True


def test_what_has_no_spectrum_says_why(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    w[3, 4] = np.inf
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(
        folder / "model.safetensors",
        {
            "model.layers.0.mlp.up_proj.weight": ("F32", w),
            "model.layers.0.conv.weight": ("F32", rng.standard_normal((8, 4, 3)).astype(np.float32)),
            "model.layers.0.mlp.down_proj.weight": ("F32", rng.standard_normal((32, 64)).astype(np.float32)),
        },
    )
    row = api.fit_model(str(folder), FitOptions(device="cpu", spectrum=True))
    by_name = {m["name"]: m for m in row["matrices"]}
    assert "not finite" in by_name["model.layers.0.mlp.up_proj.weight"]["spectrum_skipped"]
    assert "3 dimensions" in by_name["model.layers.0.conv.weight"]["spectrum_skipped"]
    assert "spectrum" in by_name["model.layers.0.mlp.down_proj.weight"]
    assert row["run"]["spectrum"]["matrices"] == 1


# --- planted spikes, progress, sweeps ------------------------------------------------------------------------


@pytest.mark.parametrize("rank", [1, 3])
def test_planted_rank_r_spikes_are_counted(rank, tmp_path):
    target = "model.layers.1.mlp.down_proj.weight"

    def plant(t: synthetic.TensorSpec, x: np.ndarray) -> np.ndarray:
        if t.name != target:
            return x
        rng = np.random.default_rng(rank)
        m, n = x.shape
        u = np.linalg.qr(rng.standard_normal((m, rank)))[0]
        v = np.linalg.qr(rng.standard_normal((n, rank)))[0]
        edge = t.sigma * (math.sqrt(m) + math.sqrt(n))  # the bulk's largest singular value
        strengths = edge * np.linspace(3.0, 5.0, rank)
        return (x + (u * strengths) @ v.T).astype(np.float32)

    spec = synthetic.ModelSpec(n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, ffn_size=768, vocab=512, dtype="F32")
    folder = synthetic.write_model(tmp_path / "m", spec, modify=plant)
    row = api.fit_model(str(folder), FitOptions(device="cpu", spectrum=True, include=("*mlp*",)))
    spikes = {m["name"]: m["spectrum"]["num_spikes"] for m in row["matrices"]}
    assert spikes.pop(target) == rank
    assert set(spikes.values()) == {0}  # the Gaussian layers: a Marchenko-Pastur bulk, no spike


def test_progress_reports_the_spectrum_pass(neox):
    from weightdiag.progress import Events

    events = Events()
    api.fit_model(str(neox), FitOptions(device="cpu", spectrum=True), events)
    names = [e for e, _ in events.calls]
    start = names.index("spectra_started")
    assert start > names.index("started") and names[-1] == "spectrum_taken"
    ((matrices, work),) = events.of("spectra_started")
    advances = [flops for (flops,) in events.of("spectrum_taken")]
    assert matrices == len(advances) == 2 * 7 + 2
    assert math.isclose(sum(advances), work)


def test_the_progress_bar_draws_the_spectrum_pass():
    import io

    from rich.console import Console

    from weightdiag.render.tables import FitProgress

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    bar = FitProgress(console)
    bar.enabled = True  # even where HF_HUB_DISABLE_PROGRESS_BARS is set
    bar.spectra_started(2, 10.0)
    bar.spectrum_taken(4.0)
    bar.spectrum_taken(6.0)
    assert bar._progress is not None and bar._progress.tasks[0].completed == 10.0
    bar.close()
    assert "spectra" in console.file.getvalue()


def test_sweeps_take_the_spectrum_in_their_workers_and_refit_rows_without_it(tmp_path):
    run = synthetic.RunSpec(steps=(0, 8), n_layers=2, d_model=64, ffn_size=128, vocab=128)
    synthetic.write_training_run(tmp_path / "run", run)
    db = tmp_path / "db"
    plain = api.sweep(str(tmp_path / "run"), db_dir=db, options=FitOptions(device="cpu"))
    assert [o.status for o in plain.outcomes] == ["fitted", "fitted"]
    again = api.sweep(str(tmp_path / "run"), db_dir=db, options=FitOptions(device="cpu", spectrum=True), jobs=2)
    assert [o.status for o in again.outcomes] == ["fitted", "fitted"]  # the plain rows lack the spectra asked for
    for outcome in again.outcomes:
        row = json.loads(Path(outcome.row_path).read_text())
        assert row["schema"] == "weightdiag.row/2" and row["spectrum_kinds"]
    kept = api.sweep(str(tmp_path / "run"), db_dir=db, options=FitOptions(device="cpu", spectrum=True))
    assert [o.status for o in kept.outcomes] == ["existing", "existing"]


def test_a_fit_cut_off_in_its_spectrum_pass_resumes_with_its_fits_and_takes_the_spectra_again(
    neox, tmp_path, monkeypatch
):
    from weightdiag.run import spectrum as spectrum_pass

    real = spectrum_pass.take_spectra

    def cut_off(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(spectrum_pass, "take_spectra", cut_off)
    options = FitOptions(device="cpu", spectrum=True)
    with pytest.raises(KeyboardInterrupt):
        api.fit(str(neox), options, db_dir=tmp_path)
    monkeypatch.setattr(spectrum_pass, "take_spectra", real)
    row = api.fit(str(neox), options, db_dir=tmp_path).row
    assert row["run"]["resumed"]["tensors"] > 0  # the fits came from the journal
    assert len(spectra(row)) == 2 * 7 + 2 and row["schema"] == "weightdiag.row/2"
    fresh = api.fit_model(str(neox), options)
    assert spectra(row) == spectra(fresh)


def test_a_pytorch_bin_checkpoint_gets_the_same_spectra(neox, tmp_path):
    torch = pytest.importorskip("torch")
    weights = read_safetensors(neox / "model.safetensors")
    folder = tmp_path / "bin"
    folder.mkdir()
    torch.save({k: torch.from_numpy(v.copy()) for k, v in weights.items()}, folder / "pytorch_model.bin")
    (folder / "config.json").write_text((neox / "config.json").read_text())
    options = FitOptions(device="cpu", spectrum=True)
    from_bin = spectra(api.fit_model(str(folder), options))
    from_safetensors = spectra(api.fit_model(str(neox), options))
    assert set(from_bin) == set(from_safetensors) and len(from_bin) == 2 * 7 + 2
    for name, want in from_safetensors.items():  # F32 there, BF16 here: the same values
        assert_same(from_bin[name], want, where=name)


# --- BLAS threads per matrix (issue 42, item 7) ---------------------------------------------------------------


def test_small_matrices_solve_on_one_blas_thread_and_large_ones_on_the_jobs(tmp_path, monkeypatch):
    """With a job of 2 threads, the Gram and eigensolve of a matrix whose smaller side is below 1,024 run on one
    OpenBLAS thread (threads spinning on a loaded machine made MiniLM's spectrum 3-5x slower), one of 1,024 on
    the job's two; and the eigenvalues are those of a whole-matrix solve on the same threads."""
    from weightdiag.reduce import blas, gram

    if not blas.openblas_controls():
        pytest.skip("no OpenBLAS loaded: nothing to set")
    rng = np.random.default_rng(7)
    small = rng.standard_normal((1536, 384)).astype(np.float32)
    large = rng.standard_normal((1100, 1024)).astype(np.float32)
    folder = tmp_path / "m"
    folder.mkdir()
    write_safetensors(
        folder / "model.safetensors",
        {"model.layers.0.mlp.up_proj.weight": ("F32", small), "model.layers.0.mlp.gate_proj.weight": ("F32", large)},
    )
    seen: dict[int, set[int]] = {}
    real = gram.dsyrk

    def counted(*args, **kwargs):
        order = kwargs["c"].shape[0] if kwargs.get("c") is not None else args[1].shape[0]
        seen.setdefault(order, set()).update(int(get()) for get, _ in blas.openblas_controls())
        return real(*args, **kwargs)

    monkeypatch.setattr(gram, "dsyrk", counted)
    monkeypatch.setenv("WEIGHTDIAG_THREADS", "2")
    row = api.fit_model(str(folder), FitOptions(device="cpu", spectrum=True))
    assert seen == {384: {1}, 1024: {2}}, seen
    by_name = {m["name"]: m["spectrum"] for m in row["matrices"]}
    assert_same(by_name["model.layers.0.mlp.up_proj.weight"], expected(small))
    assert_same(by_name["model.layers.0.mlp.gate_proj.weight"], expected(large))

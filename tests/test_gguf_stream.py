"""GGUF through the chunk engine: every quantized type weightdiag decodes, llama Q/K rows in whole heads, Gemma
norms, cut into many pieces or read whole, fitted and diffed; the figures checked against llama.cpp's own
`gguf` package (its dequantizer, 0.19.0) and numpy. Peak memory does not grow with the largest tensor.

Files are written with gguf.GGUFWriter: types gguf-py can quantize are quantized from Gaussian weights
(Q/K permuted first, as convert_hf_to_gguf.py does); the K-quants, IQ4_* and MXFP4, which it only
dequantizes, get random blocks with small scales.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from weightdiag import tuning
from weightdiag.api import fit_path
from weightdiag.delta.result import DiffOptions
from weightdiag.run.diff import diff
from weightdiag.run.measure import FitOptions
from weightdiag.testing.lineage_cases import GGUF_LLAMA_NAMES

from .conftest import run_cli

gguf = pytest.importorskip("gguf")
GT = gguf.GGMLQuantizationType

D, HEADS, KV_HEADS, FFN, VOCAB = 256, 4, 2, 512, 320
HEAD_DIM = D // HEADS
# Block 0 quantized with gguf-py's quantizers, block 1 random blocks of the types it only dequantizes; block 1's
# Q and K are F16 and BF16 rows: un-permuted, and reduced as F16 and BF16.
TYPES = {
    "token_embd.weight": "Q8_0",
    "blk.0.attn_q.weight": "Q4_1",
    "blk.0.attn_k.weight": "Q4_K",
    "blk.0.attn_v.weight": "Q5_0",
    "blk.0.attn_output.weight": "Q6_K",
    "blk.0.ffn_gate.weight": "Q4_0",
    "blk.0.ffn_up.weight": "Q5_1",
    "blk.0.ffn_down.weight": "Q2_K",
    "blk.1.attn_q.weight": "F16",
    "blk.1.attn_k.weight": "BF16",
    "blk.1.attn_v.weight": "IQ4_NL",
    "blk.1.attn_output.weight": "IQ4_XS",
    "blk.1.ffn_gate.weight": "Q3_K",
    "blk.1.ffn_up.weight": "Q5_K",
    "blk.1.ffn_down.weight": "MXFP4",
    "output.weight": "Q8_0",
}
HF_NAMES = {"token_embd": "model.embed_tokens", "output": "lm_head", "output_norm": "model.norm", **GGUF_LLAMA_NAMES}
# The types gguf-py cannot quantize: random blocks whose f16 scales (at these byte offsets) are set small.
SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_NL": (0,)}
SCALES |= {"IQ4_XS": (0,)}


def hf_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{HF_NAMES[parts[2]]}.{parts[3]}"
    return f"{HF_NAMES[parts[0]]}.{parts[1]}"


def shape_of(name: str) -> tuple[int, ...]:
    kind = name.split(".")[-2]
    return {
        "token_embd": (VOCAB, D),
        "output": (VOCAB, D),
        "attn_q": (D, D),
        "attn_k": (KV_HEADS * HEAD_DIM, D),
        "attn_v": (KV_HEADS * HEAD_DIM, D),
        "attn_output": (D, D),
        "ffn_gate": (FFN, D),
        "ffn_up": (FFN, D),
        "ffn_down": (D, FFN),
    }.get(kind, (D,))


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute (HF rows -> llama.cpp rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def heads_of(name: str) -> int | None:
    return {"attn_q": HEADS, "attn_k": KV_HEADS}.get(name.split(".")[-2])


def random_blocks(rng: np.random.Generator, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[GT[type_name]]
    rows, cols = shape
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in SCALES[type_name]:
        scale = (rng.uniform(0.002, 0.02, raw.shape[:-1]) * rng.choice([-1, 1], raw.shape[:-1])).astype("<f2")
        raw[..., at : at + 2] = scale[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def hf_weights(seed: int, norms_plus: float = 0.0) -> dict[str, np.ndarray]:
    """GGUF name -> float32 weights in HF row order."""
    rng = np.random.default_rng(seed)
    names = [*TYPES, "output_norm.weight", *(f"blk.{b}.{n}_norm.weight" for b in (0, 1) for n in ("attn", "ffn"))]
    out = {}
    for name in names:
        shape = shape_of(name)
        if len(shape) == 1:
            out[name] = (norms_plus + 1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    return out


def write_gguf(path: Path, weights: dict[str, np.ndarray], types: dict[str, str], seed: int = 0, arch="llama"):
    """A GGUF file of `weights` stored as `types` (F32 where none is given); random blocks where gguf-py has no
    quantizer. Returns what llama.cpp reads back, in HF row order (gguf-py's dequantizer, rows un-permuted)."""
    rng = np.random.default_rng(seed + 100)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(256)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    for name, w in weights.items():
        heads = heads_of(name) if arch == "llama" else None
        stored = llama_permute(w, heads) if heads else w
        qtype = GT[types.get(name, "F32")]
        quantizable = qtype.name not in SCALES
        data = gguf.quants.quantize(stored, qtype) if quantizable else random_blocks(rng, qtype.name, w.shape)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    back = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        with np.errstate(all="ignore"):
            values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        values = values.reshape(tuple(int(n) for n in reversed(t.shape)))
        heads = heads_of(t.name) if arch == "llama" else None
        back[t.name] = llama_unpermute(values, heads) if heads else values
    return back


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return path, write_gguf(path, hf_weights(0), TYPES, seed=0)


def _fit(path: Path, monkeypatch, split: int) -> dict:
    with tuning.override(split_bytes=split, local_chunk_bytes=max(split, 3 * split // 2 // 8 * 8)):
        return fit_path(str(path), FitOptions(device="cpu"))


def test_a_gguf_fit_matches_llama_cpps_values_read_whole_or_in_pieces(model, monkeypatch):
    path, values = model
    whole = _fit(path, monkeypatch, 16 << 20)
    cut = _fit(path, monkeypatch, 4 << 10)  # every matrix cut mid-tensor: 4080 bytes of Q4_1, whole heads of Q
    assert not whole["skipped"] and len(whole["matrices"]) == len(TYPES) == len(cut["matrices"])
    for a, b in zip(cut["matrices"], whole["matrices"], strict=True):
        assert a["name"] == b["name"] and a["fits"] == b["fits"] and a["argmax"] == b["argmax"]
        assert a["stats"]["max_abs"] == b["stats"]["max_abs"]
        assert a["stats"]["std"] == pytest.approx(b["stats"]["std"], rel=1e-12)
    assert cut["vectors"] == whole["vectors"]
    for m in whole["matrices"]:
        v = values[m["name"]]
        stored = TYPES[m["name"]]
        assert m["dtype"] == stored and m["numel"] == v.size
        if stored in ("F16", "BF16"):  # rows only un-permuted: reduced in their own dtype
            assert "fitted_dtype" not in m and m["note"] == "Q/K rows un-permuted to HF order"
        else:
            assert m["fitted_dtype"] == "F32" and m["quantization"] == stored
        mags = np.abs(v.astype(np.float64))
        # the first largest |w| in HF order: rows in llama.cpp's order would give another position
        assert m["argmax"] == list(np.unravel_index(np.argmax(mags), v.shape)), m["name"]
        assert m["stats"]["max_abs"] == pytest.approx(mags.max(), rel=1e-9)
        assert m["stats"]["mean"] == pytest.approx(v.astype(np.float64).mean(), rel=1e-7, abs=1e-12)
        assert m["stats"]["std"] == pytest.approx(v.astype(np.float64).std(), rel=1e-7)
        assert "dequantized" not in m  # GGUF records say what the file stores in dtype, quantization, note
    assert {v["name"]: v["mean"] for v in whole["vectors"]} == pytest.approx(
        {n: float(values[n].astype(np.float64).mean()) for n in values if values[n].ndim == 1}, rel=1e-9
    )


def test_gemma_norms_stored_as_one_plus_w_are_decoded_in_the_stream(tmp_path, monkeypatch, knobs):
    """Gemma GGUF norms hold 1 + w: the stream subtracts 1 (in float32, as the whole-tensor reader did) and the
    record adds the architecture's offset back, gathered whole or summarised piece by piece."""
    weights = {n: w for n, w in hf_weights(1, norms_plus=1.0).items() if n.endswith("norm.weight")}
    weights["token_embd.weight"] = hf_weights(1)["token_embd.weight"]
    types = {"blk.0.attn_norm.weight": "BF16", "blk.1.ffn_norm.weight": "F16", "token_embd.weight": "Q8_0"}
    path = tmp_path / "gemma.gguf"
    stored = write_gguf(path, weights, types, arch="gemma")
    gathered = _fit(path, monkeypatch, 16 << 20)
    knobs(vector_gather_bytes=64)  # every norm summarised piece by piece
    summarised = _fit(path, monkeypatch, 256)
    for row in (gathered, summarised):
        records = {v["name"]: v for v in row["vectors"]}
        assert set(records) == {n for n in weights if n.endswith("norm.weight")}
        for name, rec in records.items():
            w = (stored[name] - np.float32(1)).astype(np.float64) + 1  # 1 subtracted in float32, added back
            assert rec["offset_applied"] == 1.0
            assert rec["mean"] == pytest.approx(w.mean(), rel=1e-9)
            assert rec["std"] == pytest.approx(w.std(), rel=1e-6)
            assert (rec["min"], rec["max"]) == pytest.approx((w.min(), w.max()), rel=1e-9)
            assert rec["dtype"] == types.get(name, "F32")


def _numpy_figures(b: np.ndarray, t: np.ndarray) -> dict[str, float]:
    b64, t64 = b.astype(np.float64), t.astype(np.float64)
    return {
        "relative_change": float(np.linalg.norm(t64 - b64) / np.linalg.norm(b64)),
        "cosine": float((b64 * t64).sum() / np.linalg.norm(b64) / np.linalg.norm(t64)),
        "unchanged_fraction": float(np.count_nonzero(b.view(np.uint32) == t.view(np.uint32)) / b.size),
        "sign_flip_fraction": float(np.count_nonzero(np.sign(b64) * np.sign(t64) < 0) / b.size),
    }


def test_diff_of_two_gguf_files_equals_numpy_on_llama_cpps_values(model, tmp_path):
    base_path, base = model
    weights = hf_weights(0)
    rng = np.random.default_rng(7)
    tuned_weights = {n: (w + 2e-3 * rng.standard_normal(w.shape)).astype(np.float32) for n, w in weights.items()}
    tuned_weights["blk.0.ffn_up.weight"] = weights["blk.0.ffn_up.weight"]  # untouched: quantized alike
    tuned_path = tmp_path / "tuned.gguf"
    tuned = write_gguf(tuned_path, tuned_weights, TYPES, seed=0)
    r = run_cli("diff", str(base_path), str(tuned_path), "--json", "--no-save")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    records = {m["name"]: m for m in result["matrices"] + result["vectors"]}
    assert set(records) == set(base) and not result["only_base"] and not result["only_tuned"]
    for name, rec in records.items():
        b, t = base[name].astype(np.float32), tuned[name].astype(np.float32)
        want = _numpy_figures(b, t)
        if TYPES.get(name) in ("F16", "BF16"):  # stored elements compared as stored: the same bits here
            assert rec["base_dtype"] == TYPES[name]
        assert rec["unchanged_fraction"] == want["unchanged_fraction"], name
        assert rec["sign_flip_fraction"] == want["sign_flip_fraction"], name
        assert rec["relative_change"] == pytest.approx(want["relative_change"], rel=1e-6, abs=1e-12), name
        assert rec["cosine"] == pytest.approx(want["cosine"], rel=1e-9), name
    assert records["blk.0.ffn_up.weight"]["untouched"]


def test_diff_of_a_gguf_file_against_its_hugging_face_checkpoint(model, tmp_path, monkeypatch, knobs):
    """GGUF names pair with HF names by their layout role, and Q/K rows are compared in HF order: an F32 GGUF of
    the weights is unchanged everywhere, and a quantized one differs by exactly its quantization error, also
    read in blocks of a few rows (Q and K in blocks of whole heads)."""
    from safetensors.numpy import save_file

    weights = hf_weights(0)
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({hf_name(n): w for n, w in weights.items()}, str(hf / "model.safetensors"))
    plain = tmp_path / "plain.gguf"
    write_gguf(plain, weights, {"blk.0.attn_q.weight": "F32", "blk.0.attn_k.weight": "F32"})
    same = diff(str(hf), str(plain), DiffOptions(device="cpu", spectrum=False)).to_json()
    assert len(same["matrices"]) == len(TYPES) and len(same["vectors"]) == 5
    assert all(m["unchanged_fraction"] == 1.0 and m["relative_change"] == 0.0 for m in same["matrices"])
    quantized_path, quantized = model
    for block_elems in (tuning.Tuning().block_elems, 3 * D):
        knobs(block_elems=block_elems)
        result = diff(str(hf), str(quantized_path), DiffOptions(device="cpu", spectrum=False)).to_json()
        assert len(result["matrices"]) == len(TYPES)
        for rec in result["matrices"]:
            gguf_name = rec["tuned_name"]
            want = _numpy_figures(weights[gguf_name], quantized[gguf_name])
            assert rec["relative_change"] == pytest.approx(want["relative_change"], rel=1e-6), gguf_name
            assert rec["unchanged_fraction"] == want["unchanged_fraction"], gguf_name


def test_the_smollm_gguf_against_itself_is_unchanged(smollm_gguf):
    result = diff(str(smollm_gguf), str(smollm_gguf), DiffOptions(device="cpu", include=("blk.0.*",))).to_json()
    assert len(result["matrices"]) == 7 and len(result["vectors"]) == 2
    assert all(m["untouched"] and m["unchanged_fraction"] == 1.0 for m in result["matrices"] + result["vectors"])
    assert {m["base_dtype"] for m in result["matrices"]} == {"Q4_1"}


# VmHWM, not ru_maxrss: the latter inherits the (large) pytest parent's peak across fork + exec.
_PEAK_SCRIPT = """
import sys
from weightdiag.api import fit_path
from weightdiag.run.measure import FitOptions
fit_path(sys.argv[1], FitOptions(device="cpu"))
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""


def write_large_q8_0(path: Path, rows: int, cols: int = 16384) -> None:
    """One [rows, cols] Q8_0 matrix of random codes (every scale 2^-7) and a norm, written as blocks directly."""
    rng = np.random.default_rng(0)
    blocks = np.empty((rows, cols // 32, 34), dtype=np.uint8)
    blocks[..., :2] = np.array([2**-7], dtype="<f2").view(np.uint8)
    blocks[..., 2:] = rng.integers(0, 256, (rows, cols // 32, 32), dtype=np.uint8)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(cols)
    writer.add_tensor("blk.0.ffn_down.weight", blocks.reshape(rows, -1), raw_dtype=GT.Q8_0)
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(cols, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
def test_peak_memory_of_a_gguf_fit_does_not_grow_with_its_largest_tensor(tmp_path):
    """A Q8_0 matrix of 64 M values (256 MB as float32) and one of 128 M (512 MB): read in chunks and decoded
    piece by piece on two workers, the fit's peak stays put, under the larger one's float32 size over two (the
    whole-tensor reader held its float32 copy: 309 and 571 MB here, against 239 and 239 MB)."""
    peaks = {}
    for rows in (4096, 8192):
        path = tmp_path / f"m{rows}.gguf"
        write_large_q8_0(path, rows)
        env = {**os.environ, "WEIGHTDIAG_THREADS": "2"}  # the bound is per worker: the same on any machine
        out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(path)], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        peaks[rows] = int(out.stdout.split()[-1]) * 1024
        path.unlink()
    largest_f32 = 8192 * 16384 * 4
    assert peaks[8192] < peaks[4096] + 32 * 2**20, peaks  # no growth with the tensor beyond noise
    assert peaks[8192] < largest_f32 / 2, peaks

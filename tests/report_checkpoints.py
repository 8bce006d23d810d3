"""Small checkpoints with the real tensor names of their families, for the report's MoE and tower tests.

Names and config keys follow transformers' modelling files: Qwen2-MoE (models/qwen2_moe/modeling_qwen2_moe.py:
`mlp.experts.{e}.{gate,up,down}_proj`, the router `mlp.gate`, `mlp.shared_expert.*` and `mlp.shared_expert_gate`)
and Gemma-3 (models/gemma3/modeling_gemma3.py and the SigLIP vision tower of models/siglip/modeling_siglip.py:
`vision_tower.vision_model.encoder.layers.{i}.self_attn.*`, `mlp.fc1/fc2`, `layer_norm1/2`, the patch embedding,
and `multi_modal_projector.mm_input_projection_weight`), scaled down.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .conftest import write_safetensors

Tensors = dict[str, tuple[str, np.ndarray]]


def _gauss(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    return (rng.standard_normal(shape) * sigma).astype(np.float32)


def _student(rng: np.random.Generator, shape: tuple[int, ...], sigma: float, df: float) -> np.ndarray:
    """Student-t values scaled to standard deviation `sigma` (df > 2): a heavier-tailed body, lower k."""
    return (rng.standard_t(df, size=shape) * sigma / np.sqrt(df / (df - 2))).astype(np.float32)


def _norm(rng: np.random.Generator, d: int, spread: float = 0.05, centre: float = 1.0) -> np.ndarray:
    return (centre + spread * rng.standard_normal(d)).astype(np.float32)


# --- Qwen2-MoE ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MoESpec:
    n_layers: int = 6
    d_model: int = 64
    n_heads: int = 4
    n_experts: int = 16
    moe_ffn: int = 96
    shared_ffn: int = 128
    vocab: int = 256
    sigma: float = 0.02
    expert_scale_jitter: float = 0.15  # per expert sigma x U(1 - j, 1 + j): experts are trained unevenly
    expert_df: tuple[float, float] = (8.0, 30.0)  # per expert Student-t degrees of freedom: tails vary a little
    seed: int = 0


# (block, expert, kind) -> what to do with that expert's matrix
Plant = Callable[[np.random.Generator, tuple[int, ...], float], np.ndarray]


def heavy_tail(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
    return _student(rng, shape, sigma, 2.5)


def scaled(factor: float) -> Plant:
    def plant(rng: np.random.Generator, shape: tuple[int, ...], sigma: float) -> np.ndarray:
        return _gauss(rng, shape, sigma * factor)

    return plant


def write_qwen2_moe(root: Path, spec: MoESpec, plants: dict[tuple[int, int, str], Plant] | None = None) -> Path:
    """A Qwen2-MoE checkpoint: every layer MoE, with routed experts, a shared expert and both routers."""
    plants = plants or {}
    rng = np.random.default_rng(spec.seed)
    d, hd = spec.d_model, spec.d_model // spec.n_heads
    t: Tensors = {"model.embed_tokens.weight": ("BF16", _gauss(rng, (spec.vocab, d), spec.sigma))}
    for b in range(spec.n_layers):
        p = f"model.layers.{b}."
        t[p + "input_layernorm.weight"] = ("BF16", _norm(rng, d))
        for name in ("q_proj", "k_proj", "v_proj"):
            t[p + f"self_attn.{name}.weight"] = ("BF16", _gauss(rng, (spec.n_heads * hd, d), spec.sigma))
        t[p + "self_attn.o_proj.weight"] = ("BF16", _gauss(rng, (d, spec.n_heads * hd), spec.sigma))
        t[p + "post_attention_layernorm.weight"] = ("BF16", _norm(rng, d))
        t[p + "mlp.gate.weight"] = ("BF16", _gauss(rng, (spec.n_experts, d), spec.sigma))
        for e in range(spec.n_experts):
            # Each expert's own generator: planting one expert leaves every other expert's values unchanged.
            erng = np.random.default_rng([spec.seed, b, e])
            scale = spec.sigma * (1 + erng.uniform(-1, 1) * spec.expert_scale_jitter)
            df = erng.uniform(*spec.expert_df)
            for kind, shape in (
                ("gate", (spec.moe_ffn, d)),
                ("up", (spec.moe_ffn, d)),
                ("down", (d, spec.moe_ffn)),
            ):
                krng = np.random.default_rng([spec.seed, b, e, zlib.crc32(kind.encode())])
                plant = plants.get((b, e, kind))
                values = plant(krng, shape, scale) if plant else _student(krng, shape, scale, df)
                t[p + f"mlp.experts.{e}.{kind}_proj.weight"] = ("BF16", values)
        for kind, shape in (
            ("gate", (spec.shared_ffn, d)),
            ("up", (spec.shared_ffn, d)),
            ("down", (d, spec.shared_ffn)),
        ):
            t[p + f"mlp.shared_expert.{kind}_proj.weight"] = ("BF16", _gauss(rng, shape, spec.sigma))
        t[p + "mlp.shared_expert_gate.weight"] = ("BF16", _gauss(rng, (1, d), spec.sigma))
    t["model.norm.weight"] = ("BF16", _norm(rng, d))
    t["lm_head.weight"] = ("BF16", _gauss(rng, (spec.vocab, d), spec.sigma))
    root.mkdir(parents=True, exist_ok=True)
    write_safetensors(root / "model.safetensors", t)
    config = {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "hidden_size": d,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": spec.n_heads,
        "num_key_value_heads": spec.n_heads,
        "intermediate_size": spec.shared_ffn,
        "moe_intermediate_size": spec.moe_ffn,
        "shared_expert_intermediate_size": spec.shared_ffn,
        "num_experts": spec.n_experts,
        "num_experts_per_tok": 4,
        "vocab_size": spec.vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    (root / "config.json").write_text(json.dumps(config))
    return root


# --- Gemma-3 with a SigLIP vision tower ------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemma3Spec:
    n_layers: int = 6  # text blocks
    vision_layers: int = 9  # more than the text: the extra ones used to show as "(mtp)" blocks
    d_model: int = 64
    d_vision: int = 48
    n_heads: int = 4
    ffn: int = 128
    vision_ffn: int = 96
    vocab: int = 256
    sigma: float = 0.02
    seed: int = 0


VISION = "vision_tower.vision_model."
VISION_OUTLIER = VISION + "encoder.layers.3.mlp.fc2.weight"  # the model's largest |w|: a tower weight


def write_gemma3(root: Path, spec: Gemma3Spec, vision_outlier: float = 1.0) -> Path:
    rng = np.random.default_rng(spec.seed)
    d, hd, dv = spec.d_model, spec.d_model // spec.n_heads, spec.d_vision
    lm = "language_model.model."
    t: Tensors = {lm + "embed_tokens.weight": ("BF16", _gauss(rng, (spec.vocab, d), spec.sigma))}
    for b in range(spec.n_layers):
        p = f"{lm}layers.{b}."
        for site in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
            t[p + f"{site}.weight"] = ("BF16", _norm(rng, d, centre=0.0))  # Gemma stores gamma - 1
        t[p + "post_feedforward_layernorm.weight"] = ("BF16", _norm(rng, d, centre=0.0))
        t[p + "self_attn.q_norm.weight"] = ("BF16", _norm(rng, hd, centre=0.0))
        t[p + "self_attn.k_norm.weight"] = ("BF16", _norm(rng, hd, centre=0.0))
        for name in ("q_proj", "k_proj", "v_proj"):
            t[p + f"self_attn.{name}.weight"] = ("BF16", _gauss(rng, (spec.n_heads * hd, d), spec.sigma))
        t[p + "self_attn.o_proj.weight"] = ("BF16", _gauss(rng, (d, spec.n_heads * hd), spec.sigma))
        t[p + "mlp.gate_proj.weight"] = ("BF16", _gauss(rng, (spec.ffn, d), spec.sigma))
        t[p + "mlp.up_proj.weight"] = ("BF16", _gauss(rng, (spec.ffn, d), spec.sigma))
        t[p + "mlp.down_proj.weight"] = ("BF16", _gauss(rng, (d, spec.ffn), spec.sigma))
    t[lm + "norm.weight"] = ("BF16", _norm(rng, d, centre=0.0))
    t[VISION + "embeddings.patch_embedding.weight"] = ("BF16", _gauss(rng, (dv, 3, 4, 4), spec.sigma))
    t[VISION + "embeddings.position_embedding.weight"] = ("BF16", _gauss(rng, (16, dv), spec.sigma))
    for i in range(spec.vision_layers):
        p = f"{VISION}encoder.layers.{i}."
        t[p + "layer_norm1.weight"] = ("BF16", _norm(rng, dv))
        t[p + "layer_norm1.bias"] = ("BF16", _norm(rng, dv, centre=0.0))
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[p + f"self_attn.{name}.weight"] = ("BF16", _gauss(rng, (dv, dv), spec.sigma))
        t[p + "layer_norm2.weight"] = ("BF16", _norm(rng, dv))
        t[p + "mlp.fc1.weight"] = ("BF16", _gauss(rng, (spec.vision_ffn, dv), spec.sigma))
        fc2 = _gauss(rng, (dv, spec.vision_ffn), spec.sigma)
        if p + "mlp.fc2.weight" == VISION_OUTLIER:
            fc2[5, 7] = vision_outlier
        t[p + "mlp.fc2.weight"] = ("BF16", fc2)
    t[VISION + "post_layernorm.weight"] = ("BF16", _norm(rng, dv))
    t["multi_modal_projector.mm_input_projection_weight"] = ("BF16", _gauss(rng, (dv, d), spec.sigma))
    t["multi_modal_projector.mm_soft_emb_norm.weight"] = ("BF16", _norm(rng, dv, centre=0.0))
    root.mkdir(parents=True, exist_ok=True)
    write_safetensors(root / "model.safetensors", t)
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": d,
            "num_hidden_layers": spec.n_layers,
            "num_attention_heads": spec.n_heads,
            "num_key_value_heads": spec.n_heads,
            "head_dim": hd,
            "intermediate_size": spec.ffn,
            "vocab_size": spec.vocab,
            "rms_norm_eps": 1e-6,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": dv,
            "num_hidden_layers": spec.vision_layers,
            "intermediate_size": spec.vision_ffn,
            "patch_size": 4,
        },
    }
    (root / "config.json").write_text(json.dumps(config))
    return root

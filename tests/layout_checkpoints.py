"""Scaled-down checkpoints of today's architectures: the real tensor names, layouts and config.json fields
of each family (from transformers 5 models/<family>/modeling_<family>.py and the families' published
index files), with widths, layer and expert counts reduced. Values are Gaussian; what the tests read is
which record each tensor becomes, and that a record cut from a stored tensor equals that piece fitted alone.

Each builder returns (config, {name: (dtype, values)}); values are float32 arrays (BF16 tensors are
rounded when written) or uint8 arrays for packed MXFP4 codes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.conftest import write_safetensors

Tensors = dict[str, tuple[str, np.ndarray]]


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.tensors: Tensors = {}

    def add(self, name: str, *shape: int, dtype: str = "BF16", scale: float = 0.02) -> None:
        self.tensors[name] = (dtype, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(self, name: str, width: int) -> None:
        self.tensors[name] = ("BF16", (1 + 0.05 * self.rng.standard_normal(width)).astype(np.float32))

    def attention(self, p: str, d: int, heads: int, kv: int, hd: int, bias: bool = False, out: str = "o_proj") -> None:
        for proj, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            self.add(f"{p}.{proj}.weight", rows, d)
            if bias:
                self.add(f"{p}.{proj}.bias", rows)
        self.add(f"{p}.{out}.weight", d, heads * hd)
        if bias:
            self.add(f"{p}.{out}.bias", d)

    def swiglu(self, p: str, d: int, f: int, bias: bool = False) -> None:
        self.add(f"{p}.gate_proj.weight", f, d)
        self.add(f"{p}.up_proj.weight", f, d)
        self.add(f"{p}.down_proj.weight", d, f)
        if bias:
            self.add(f"{p}.gate_proj.bias", f)
            self.add(f"{p}.up_proj.bias", f)
            self.add(f"{p}.down_proj.bias", d)


def write(path: Path, config: dict, tensors: Tensors) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    write_safetensors(path / "model.safetensors", tensors)
    return path


# --- MLA: DeepSeek-V3 (and Kimi-K2, the same deepseek_v3 layout) -----------------------------------------

MLA = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12}


def deepseek_v3(model_type: str = "deepseek_v3") -> tuple[dict, Tensors]:
    """2 blocks (0 dense, 1 MoE: 4 routed experts + 1 shared) and the MTP layer 2 (DeepSeek-V3 layout:
    model.layers.61.{enorm,hnorm,eh_proj,shared_head} after 61 blocks)."""
    d, heads, vocab, experts, moe_f, f = 64, 4, 128, 4, 16, 48
    config = {
        "model_type": model_type,
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": d,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        **MLA,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "moe_intermediate_size": moe_f,
        "intermediate_size": f,
        "first_k_dense_replace": 1,
        "num_nextn_predict_layers": 1,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    b = _Builder(11)
    b.add("model.embed_tokens.weight", vocab, d)
    for i in range(3):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        a = f"{p}.self_attn"
        b.add(f"{a}.q_a_proj.weight", MLA["q_lora_rank"], d)
        b.norm(f"{a}.q_a_layernorm.weight", MLA["q_lora_rank"])
        b.add(f"{a}.q_b_proj.weight", heads * (MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"]), MLA["q_lora_rank"])
        b.add(f"{a}.kv_a_proj_with_mqa.weight", MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"], d)
        b.norm(f"{a}.kv_a_layernorm.weight", MLA["kv_lora_rank"])
        b.add(f"{a}.kv_b_proj.weight", heads * (MLA["qk_nope_head_dim"] + MLA["v_head_dim"]), MLA["kv_lora_rank"])
        b.add(f"{a}.o_proj.weight", d, heads * MLA["v_head_dim"])
        if i == 0:
            b.swiglu(f"{p}.mlp", d, f)
            continue
        b.add(f"{p}.mlp.gate.weight", experts, d)
        b.add(f"{p}.mlp.gate.e_score_correction_bias", experts, dtype="F32")
        for e in range(experts):
            b.swiglu(f"{p}.mlp.experts.{e}", d, moe_f)
        b.swiglu(f"{p}.mlp.shared_experts", d, moe_f)
    mtp = "model.layers.2"
    b.norm(f"{mtp}.enorm.weight", d)
    b.norm(f"{mtp}.hnorm.weight", d)
    b.add(f"{mtp}.eh_proj.weight", d, 2 * d)
    b.norm(f"{mtp}.shared_head.norm.weight", d)
    b.add(f"{mtp}.shared_head.head.weight", vocab, d)
    b.norm("model.norm.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Qwen3-MoE ----------------------------------------------------------------------------------------


def qwen3_moe() -> tuple[dict, Tensors]:
    d, heads, kv, hd, experts, f, vocab = 64, 4, 2, 16, 4, 16, 128
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": d,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "num_experts": experts,
        "moe_intermediate_size": f,
        "intermediate_size": 96,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    b = _Builder(12)
    b.add("model.embed_tokens.weight", vocab, d)
    for i in range(2):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        b.attention(f"{p}.self_attn", d, heads, kv, hd)
        b.norm(f"{p}.self_attn.q_norm.weight", hd)
        b.norm(f"{p}.self_attn.k_norm.weight", hd)
        b.add(f"{p}.mlp.gate.weight", experts, d)
        for e in range(experts):
            b.swiglu(f"{p}.mlp.experts.{e}", d, f)
    b.norm("model.norm.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Qwen3-Next: gated attention every 4th layer, gated DeltaNet otherwise, MoE, MTP ------------------------

QWEN3_NEXT = {"heads": 4, "kv": 2, "hd": 16, "k_heads": 2, "v_heads": 4, "k_dim": 8, "v_dim": 8, "kernel": 4}


def qwen3_next() -> tuple[dict, Tensors]:
    q = QWEN3_NEXT
    d, experts, f, vocab = 64, 4, 16, 128
    config = {
        "model_type": "qwen3_next",
        "hidden_size": d,
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "num_attention_heads": q["heads"],
        "num_key_value_heads": q["kv"],
        "head_dim": q["hd"],
        "linear_num_key_heads": q["k_heads"],
        "linear_num_value_heads": q["v_heads"],
        "linear_key_head_dim": q["k_dim"],
        "linear_value_head_dim": q["v_dim"],
        "linear_conv_kernel_dim": q["kernel"],
        "num_experts": experts,
        "moe_intermediate_size": f,
        "shared_expert_intermediate_size": f,
        "intermediate_size": 96,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    key_dim, value_dim = q["k_heads"] * q["k_dim"], q["v_heads"] * q["v_dim"]
    b = _Builder(13)
    b.add("model.embed_tokens.weight", vocab, d)

    def full_attention(p: str) -> None:
        b.add(f"{p}.q_proj.weight", q["heads"] * q["hd"] * 2, d)  # per head [query | gate]
        b.add(f"{p}.k_proj.weight", q["kv"] * q["hd"], d)
        b.add(f"{p}.v_proj.weight", q["kv"] * q["hd"], d)
        b.add(f"{p}.o_proj.weight", d, q["heads"] * q["hd"])
        b.norm(f"{p}.q_norm.weight", q["hd"])
        b.norm(f"{p}.k_norm.weight", q["hd"])

    def moe(p: str) -> None:
        b.add(f"{p}.gate.weight", experts, d)
        for e in range(experts):
            b.swiglu(f"{p}.experts.{e}", d, f)
        b.swiglu(f"{p}.shared_expert", d, f)
        b.add(f"{p}.shared_expert_gate.weight", 1, d)

    for i in range(4):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        if i == 3:
            full_attention(f"{p}.self_attn")
        else:
            la = f"{p}.linear_attn"
            b.add(f"{la}.in_proj_qkvz.weight", 2 * key_dim + 2 * value_dim, d)
            b.add(f"{la}.in_proj_ba.weight", 2 * q["v_heads"], d)
            b.add(f"{la}.conv1d.weight", 2 * key_dim + value_dim, 1, q["kernel"])
            b.add(f"{la}.dt_bias", q["v_heads"])
            b.add(f"{la}.A_log", q["v_heads"], dtype="F32")
            b.norm(f"{la}.norm.weight", q["v_dim"])
            b.add(f"{la}.out_proj.weight", d, value_dim)
        moe(f"{p}.mlp")
    b.norm("model.norm.weight", d)
    b.add("lm_head.weight", vocab, d)
    b.add("mtp.fc.weight", d, 2 * d)
    b.norm("mtp.pre_fc_norm_embedding.weight", d)
    b.norm("mtp.pre_fc_norm_hidden.weight", d)
    b.norm("mtp.layers.0.input_layernorm.weight", d)
    full_attention("mtp.layers.0.self_attn")
    moe("mtp.layers.0.mlp")
    b.norm("mtp.norm.weight", d)
    return config, b.tensors


# --- gpt-oss: fused experts with interleaved gate/up, BF16 and MXFP4 -------------------------------------


def gpt_oss(d: int = 48, f: int = 16, mxfp4: bool = False) -> tuple[dict, Tensors]:
    heads, kv, hd, experts, vocab = 4, 2, 16, 4, 128
    config = {
        "model_type": "gpt_oss",
        "hidden_size": d,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "num_local_experts": experts,
        "intermediate_size": f,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    if mxfp4:
        config["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn"],
        }
    b = _Builder(14)
    b.add("model.embed_tokens.weight", vocab, d)
    for i in range(2):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        b.attention(f"{p}.self_attn", d, heads, kv, hd, bias=True)
        b.add(f"{p}.self_attn.sinks", heads, dtype="F32", scale=1.0)
        b.add(f"{p}.mlp.router.weight", experts, d)
        b.add(f"{p}.mlp.router.bias", experts)
        x = f"{p}.mlp.experts"
        if mxfp4:  # integrations/mxfp4.py: blocks [E, rows, cols / 32, 16], E8M0 scales [E, rows, cols / 32]
            for proj, rows, cols in (("gate_up_proj", 2 * f, d), ("down_proj", d, f)):
                codes = b.rng.integers(0, 256, size=(experts, rows, cols // 32, 16), dtype=np.uint8)
                scales = b.rng.integers(118, 124, size=(experts, rows, cols // 32), dtype=np.uint8)
                b.tensors[f"{x}.{proj}_blocks"] = ("U8", codes)
                b.tensors[f"{x}.{proj}_scales"] = ("U8", scales)
        else:  # GptOssExperts: gate_up_proj [E, d, 2f], down_proj [E, f, d], both (in, out)
            b.add(f"{x}.gate_up_proj", experts, d, 2 * f)
            b.add(f"{x}.down_proj", experts, f, d)
        b.add(f"{x}.gate_up_proj_bias", experts, 2 * f)
        b.add(f"{x}.down_proj_bias", experts, d)
    b.norm("model.norm.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Llama-4: fused experts (halves), a shared expert, the vision model and projector ------------------------


def llama4() -> tuple[dict, Tensors]:
    d, heads, kv, hd, experts, f, vocab, vd = 64, 4, 2, 16, 4, 24, 128, 32
    config = {
        "model_type": "llama4",
        "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": {
            "model_type": "llama4_text",
            "hidden_size": d,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": hd,
            "num_local_experts": experts,
            "intermediate_size": f,
            "intermediate_size_mlp": 96,
            "interleave_moe_layer_step": 1,
            "vocab_size": vocab,
            "rms_norm_eps": 1e-5,
        },
        "vision_config": {"model_type": "llama4_vision_model", "hidden_size": vd, "num_hidden_layers": 2},
        "tie_word_embeddings": False,
    }
    b = _Builder(15)
    lm = "language_model.model"
    b.add(f"{lm}.embed_tokens.weight", vocab, d)
    for i in range(2):
        p = f"{lm}.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        b.attention(f"{p}.self_attn", d, heads, kv, hd)
        b.add(f"{p}.feed_forward.router.weight", experts, d)
        b.add(f"{p}.feed_forward.experts.gate_up_proj", experts, d, 2 * f)  # Llama4TextExperts: [E, d, 2f]
        b.add(f"{p}.feed_forward.experts.down_proj", experts, f, d)  # [E, f, d]
        b.swiglu(f"{p}.feed_forward.shared_expert", d, f)
    b.norm(f"{lm}.norm.weight", d)
    b.add("language_model.lm_head.weight", vocab, d)
    vm = "vision_model"
    b.add(f"{vm}.patch_embedding.linear.weight", vd, 3 * 4 * 4)
    b.add(f"{vm}.class_embedding", vd)
    b.add(f"{vm}.positional_embedding_vlm", 17, vd)
    b.norm(f"{vm}.layernorm_pre.weight", vd)
    for i in range(3):  # one more layer than the language model: never a block of it
        p = f"{vm}.model.layers.{i}"
        b.attention(f"{p}.self_attn", vd, 2, 2, 16, bias=True)
        b.add(f"{p}.mlp.fc1.weight", 2 * vd, vd)
        b.add(f"{p}.mlp.fc2.weight", vd, 2 * vd)
        b.norm(f"{p}.input_layernorm.weight", vd)
    b.add(f"{vm}.vision_adapter.mlp.fc1.weight", d, 4 * vd)
    b.add("multi_modal_projector.linear_1.weight", d, d)
    return config, b.tensors


# --- Granite-4.0-H: Mamba-2 and attention layers, fused experts (input_linear/output_linear), shared_mlp ---------

GRANITE = {"n_heads": 4, "d_head": 32, "d_state": 8, "groups": 1, "conv": 4}


def granite_h() -> tuple[dict, Tensors]:
    g = GRANITE
    d, experts, f, shared_f, vocab = 64, 4, 16, 32, 128
    d_inner = g["n_heads"] * g["d_head"]
    conv_dim = d_inner + 2 * g["groups"] * g["d_state"]
    config = {
        "model_type": "granitemoehybrid",
        "hidden_size": d,
        "num_hidden_layers": 3,
        "layer_types": ["mamba", "attention", "mamba"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": experts,
        "intermediate_size": f,
        "shared_intermediate_size": shared_f,
        "mamba_n_heads": g["n_heads"],
        "mamba_d_head": g["d_head"],
        "mamba_d_state": g["d_state"],
        "mamba_n_groups": g["groups"],
        "mamba_d_conv": g["conv"],
        "mamba_expand": 2,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }
    b = _Builder(16)
    b.add("model.embed_tokens.weight", vocab, d)
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        if kind == "attention":
            b.attention(f"{p}.self_attn", d, 4, 2, 16)
        else:
            m = f"{p}.mamba"
            b.add(f"{m}.in_proj.weight", d_inner + conv_dim + g["n_heads"], d)
            b.add(f"{m}.conv1d.weight", conv_dim, 1, g["conv"])
            b.add(f"{m}.conv1d.bias", conv_dim)
            b.add(f"{m}.dt_bias", g["n_heads"])
            b.add(f"{m}.A_log", g["n_heads"])
            b.add(f"{m}.D", g["n_heads"])
            b.norm(f"{m}.norm.weight", d_inner)
            b.add(f"{m}.out_proj.weight", d, d_inner)
        b.add(f"{p}.block_sparse_moe.input_linear.weight", experts, 2 * f, d)  # [E, 2f, d]: [gate | up] rows
        b.add(f"{p}.block_sparse_moe.output_linear.weight", experts, d, f)
        b.add(f"{p}.block_sparse_moe.router.layer.weight", experts, d)
        b.add(f"{p}.shared_mlp.input_linear.weight", 2 * shared_f, d)
        b.add(f"{p}.shared_mlp.output_linear.weight", d, shared_f)
    b.norm("model.norm.weight", d)
    return config, b.tensors


# --- DBRX: fused experts as [E * f, d] per kind -------------------------------------------------------------


def dbrx() -> tuple[dict, Tensors]:
    d, heads, kv, experts, f, vocab = 64, 4, 2, 4, 16, 128
    config = {
        "model_type": "dbrx",
        "d_model": d,
        "n_heads": heads,
        "n_layers": 2,
        "vocab_size": vocab,
        "attn_config": {"kv_n_heads": kv, "clip_qkv": 8},
        "ffn_config": {"ffn_hidden_size": f, "moe_num_experts": experts, "moe_top_k": 2},
        "tie_word_embeddings": False,
    }
    hd = d // heads
    b = _Builder(17)
    b.add("transformer.wte.weight", vocab, d)
    for i in range(2):
        p = f"transformer.blocks.{i}"
        b.norm(f"{p}.norm_attn_norm.norm_1.weight", d)
        b.add(f"{p}.norm_attn_norm.attn.Wqkv.weight", (heads + 2 * kv) * hd, d)
        b.add(f"{p}.norm_attn_norm.attn.out_proj.weight", d, d)
        b.norm(f"{p}.norm_attn_norm.norm_2.weight", d)
        b.add(f"{p}.ffn.router.layer.weight", experts, d)
        for w in ("w1", "v1", "w2"):
            b.add(f"{p}.ffn.experts.mlp.{w}", experts * f, d)
    b.norm("transformer.norm_f.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Jamba: Mamba-1 layers (in/x/dt/out_proj, 2-D A_log), attention every 4th, MoE every 2nd ------------------


def jamba() -> tuple[dict, Tensors]:
    d, d_inner, d_state, dt_rank, conv, experts, f, vocab = 64, 128, 8, 4, 4, 4, 32, 128
    config = {
        "model_type": "jamba",
        "hidden_size": d,
        "num_hidden_layers": 4,
        "attn_layer_period": 4,
        "attn_layer_offset": 2,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": experts,
        "intermediate_size": f,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "mamba_d_state": d_state,
        "mamba_d_conv": conv,
        "mamba_expand": 2,
        "mamba_dt_rank": dt_rank,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
    }
    b = _Builder(18)
    b.add("model.embed_tokens.weight", vocab, d)
    for i in range(4):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.pre_ff_layernorm.weight", d)
        if i == 2:
            b.attention(f"{p}.self_attn", d, 4, 2, 16)
        else:
            m = f"{p}.mamba"
            b.add(f"{m}.in_proj.weight", 2 * d_inner, d)
            b.add(f"{m}.conv1d.weight", d_inner, 1, conv)
            b.add(f"{m}.conv1d.bias", d_inner)
            b.add(f"{m}.x_proj.weight", dt_rank + 2 * d_state, d_inner)
            b.add(f"{m}.dt_proj.weight", d_inner, dt_rank)
            b.add(f"{m}.dt_proj.bias", d_inner)
            b.add(f"{m}.A_log", d_inner, d_state, dtype="F32")
            b.add(f"{m}.D", d_inner)
            b.add(f"{m}.out_proj.weight", d, d_inner)
            b.norm(f"{m}.dt_layernorm.weight", dt_rank)
            b.norm(f"{m}.b_layernorm.weight", d_state)
            b.norm(f"{m}.c_layernorm.weight", d_state)
        if i % 2:
            b.add(f"{p}.feed_forward.router.weight", experts, d)
            for e in range(experts):
                b.swiglu(f"{p}.feed_forward.experts.{e}", d, f)
        else:
            b.swiglu(f"{p}.feed_forward", d, f)
    b.norm("model.final_layernorm.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Falcon-H1: attention and Mamba-2 side by side in every layer -------------------------------------------


def falcon_h1() -> tuple[dict, Tensors]:
    d, n_heads, d_head, d_state, conv, f, vocab = 64, 4, 16, 8, 4, 96, 128
    d_inner = n_heads * d_head
    conv_dim = d_inner + 2 * d_state
    config = {
        "model_type": "falcon_h1",
        "hidden_size": d,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": f,
        "mamba_n_heads": n_heads,
        "mamba_d_head": d_head,
        "mamba_d_state": d_state,
        "mamba_d_conv": conv,
        "mamba_rms_norm": True,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    b = _Builder(19)
    b.add("model.embed_tokens.weight", vocab, d)
    for i in range(2):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.pre_ff_layernorm.weight", d)
        b.attention(f"{p}.self_attn", d, 4, 2, 16)
        m = f"{p}.mamba"
        b.add(f"{m}.in_proj.weight", d_inner + conv_dim + n_heads, d)
        b.add(f"{m}.conv1d.weight", conv_dim, 1, conv)
        b.add(f"{m}.conv1d.bias", conv_dim)
        b.add(f"{m}.dt_bias", n_heads)
        b.add(f"{m}.A_log", n_heads)
        b.add(f"{m}.D", n_heads)
        b.norm(f"{m}.norm.weight", d_inner)
        b.add(f"{m}.out_proj.weight", d, d_inner)
        b.swiglu(f"{p}.feed_forward", d, f)
    b.norm("model.final_layernorm.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Nemotron-H: backbone.layers.N.mixer is a Mamba-2, an MLP (up/down), attention or an MoE -----------------


def nemotron_h() -> tuple[dict, Tensors]:
    d, n_heads, d_head, d_state, conv, f, experts, moe_f, vocab = 64, 4, 16, 8, 4, 96, 4, 16, 128
    d_inner = n_heads * d_head
    conv_dim = d_inner + 2 * d_state
    config = {
        "model_type": "nemotron_h",
        "hidden_size": d,
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M-*E",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": f,
        "n_routed_experts": experts,
        "moe_intermediate_size": moe_f,
        "mamba_num_heads": n_heads,
        "mamba_head_dim": d_head,
        "ssm_state_size": d_state,
        "conv_kernel": conv,
        "vocab_size": vocab,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
    }
    b = _Builder(20)
    b.add("backbone.embeddings.weight", vocab, d)
    for i, kind in enumerate(config["hybrid_override_pattern"]):
        p = f"backbone.layers.{i}"
        b.norm(f"{p}.norm.weight", d)
        m = f"{p}.mixer"
        if kind == "M":
            b.add(f"{m}.in_proj.weight", 2 * d_inner + 2 * d_state + n_heads, d)
            b.add(f"{m}.conv1d.weight", conv_dim, 1, conv)
            b.add(f"{m}.conv1d.bias", conv_dim)
            b.add(f"{m}.dt_bias", n_heads)
            b.add(f"{m}.A_log", n_heads)
            b.add(f"{m}.D", n_heads)
            b.norm(f"{m}.norm.weight", d_inner)
            b.add(f"{m}.out_proj.weight", d, d_inner)
        elif kind == "-":
            b.add(f"{m}.up_proj.weight", f, d)
            b.add(f"{m}.down_proj.weight", d, f)
        elif kind == "*":
            b.attention(m, d, 4, 2, 16)
        else:
            b.add(f"{m}.gate.weight", experts, d, dtype="F32")
            b.add(f"{m}.gate.e_score_correction_bias", experts, dtype="F32")
            for e in range(experts):
                b.add(f"{m}.experts.{e}.up_proj.weight", moe_f, d)
                b.add(f"{m}.experts.{e}.down_proj.weight", d, moe_f)
            b.add(f"{m}.shared_experts.up_proj.weight", moe_f, d)
            b.add(f"{m}.shared_experts.down_proj.weight", d, moe_f)
    b.norm("backbone.norm_f.weight", d)
    b.add("lm_head.weight", vocab, d)
    return config, b.tensors


# --- Gemma-3 (SigLIP vision tower, projector) and Qwen2.5-VL (visual blocks, merger) ------------------------


def gemma3() -> tuple[dict, Tensors]:
    d, heads, kv, hd, f, vocab, vd = 64, 4, 2, 16, 96, 128, 32
    config = {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": d,
            "num_hidden_layers": 2,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "head_dim": hd,
            "intermediate_size": f,
            "vocab_size": vocab,
            "rms_norm_eps": 1e-6,
        },
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": vd, "num_hidden_layers": 3},
    }
    b = _Builder(21)
    lm = "language_model.model"
    b.add(f"{lm}.embed_tokens.weight", vocab, d)
    for i in range(2):
        p = f"{lm}.layers.{i}"
        for n in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            b.norm(f"{p}.{n}.weight", d)
        b.attention(f"{p}.self_attn", d, heads, kv, hd)
        b.norm(f"{p}.self_attn.q_norm.weight", hd)
        b.norm(f"{p}.self_attn.k_norm.weight", hd)
        b.swiglu(f"{p}.mlp", d, f)
    b.norm(f"{lm}.norm.weight", d)
    vt = "vision_tower.vision_model"
    b.add(f"{vt}.embeddings.patch_embedding.weight", vd, 3, 4, 4)
    b.add(f"{vt}.embeddings.patch_embedding.bias", vd)
    b.add(f"{vt}.embeddings.position_embedding.weight", 16, vd)
    for i in range(3):
        p = f"{vt}.encoder.layers.{i}"
        b.attention(f"{p}.self_attn", vd, 2, 2, 16, bias=True, out="out_proj")
        b.norm(f"{p}.layer_norm1.weight", vd)
        b.add(f"{p}.layer_norm1.bias", vd)
        b.add(f"{p}.mlp.fc1.weight", 2 * vd, vd)
        b.add(f"{p}.mlp.fc2.weight", vd, 2 * vd)
    b.norm(f"{vt}.post_layernorm.weight", vd)
    b.add("multi_modal_projector.mm_input_projection_weight", vd, d)
    b.norm("multi_modal_projector.mm_soft_emb_norm.weight", vd)
    return config, b.tensors


def qwen2_5_vl(tied: bool = True) -> tuple[dict, Tensors]:
    """Qwen2.5-VL-3B-like: tie_word_embeddings true, and lm_head.weight saved anyway (a copy of the embedding)."""
    d, heads, kv, hd, f, vocab, vd = 64, 4, 2, 16, 96, 128, 32
    config = {
        "model_type": "qwen2_5_vl",
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "hidden_size": d,
        "num_hidden_layers": 2,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": f,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied,
        "vision_config": {"hidden_size": vd, "depth": 3, "out_hidden_size": d},
    }
    b = _Builder(22)
    b.add("model.embed_tokens.weight", vocab, d)
    for i in range(2):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm.weight", d)
        b.norm(f"{p}.post_attention_layernorm.weight", d)
        b.attention(f"{p}.self_attn", d, heads, kv, hd, bias=True)
        b.swiglu(f"{p}.mlp", d, f)
    b.norm("model.norm.weight", d)
    b.tensors["lm_head.weight"] = b.tensors["model.embed_tokens.weight"]
    b.add("visual.patch_embed.proj.weight", vd, 3, 2, 4, 4)
    for i in range(3):
        p = f"visual.blocks.{i}"
        b.norm(f"{p}.norm1.weight", vd)
        b.norm(f"{p}.norm2.weight", vd)
        b.add(f"{p}.attn.qkv.weight", 3 * vd, vd)
        b.add(f"{p}.attn.qkv.bias", 3 * vd)
        b.add(f"{p}.attn.proj.weight", vd, vd)
        b.swiglu(f"{p}.mlp", vd, 2 * vd, bias=True)
    b.norm("visual.merger.ln_q.weight", vd)
    b.add("visual.merger.mlp.0.weight", 4 * vd, 4 * vd)
    b.add("visual.merger.mlp.2.weight", d, 4 * vd)
    return config, b.tensors

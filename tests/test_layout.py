"""Tensor names -> roles for every family the issue lists; config -> ArchInfo; fused splits."""

from __future__ import annotations

import numpy as np
import pytest

from weightdiag.layout import (
    ArchInfo,
    arch_from_config,
    attention_architecture,
    classify_tensor,
    complete_arch,
    split_parts,
)

M, V = (8, 8), (8,)  # a matrix and a vector shape

CASES = [
    # GPT-NeoX / Pythia
    ("gpt_neox.embed_in.weight", M, "embed", None),
    ("gpt_neox.layers.3.attention.query_key_value.weight", M, "qkv", 3),
    ("gpt_neox.layers.3.attention.dense.weight", M, "o", 3),
    ("gpt_neox.layers.3.mlp.dense_h_to_4h.weight", M, "ffn_in", 3),
    ("gpt_neox.layers.3.mlp.dense_4h_to_h.weight", M, "ffn_out", 3),
    ("gpt_neox.layers.3.input_layernorm.weight", V, "norm", 3),
    ("gpt_neox.layers.3.attention.query_key_value.bias", V, "bias", 3),
    ("gpt_neox.final_layer_norm.weight", V, "norm", None),
    ("embed_out.weight", M, "unembed", None),
    # Llama / Mistral / Qwen2 / Qwen2.5 / Qwen3 / OLMo-2 / Gemma (HF names)
    ("model.embed_tokens.weight", M, "embed", None),
    ("model.layers.12.self_attn.q_proj.weight", M, "q", 12),
    ("model.layers.12.self_attn.k_proj.weight", M, "k", 12),
    ("model.layers.12.self_attn.v_proj.weight", M, "v", 12),
    ("model.layers.12.self_attn.o_proj.weight", M, "o", 12),
    ("model.layers.12.self_attn.q_proj.bias", V, "bias", 12),
    ("model.layers.12.self_attn.q_norm.weight", V, "norm", 12),
    ("model.layers.12.self_attn.k_norm.weight", V, "norm", 12),
    ("model.layers.12.mlp.gate_proj.weight", M, "gate", 12),
    ("model.layers.12.mlp.up_proj.weight", M, "up", 12),
    ("model.layers.12.mlp.down_proj.weight", M, "down", 12),
    ("model.layers.12.pre_feedforward_layernorm.weight", V, "norm", 12),
    ("model.norm.weight", V, "norm", None),
    ("lm_head.weight", M, "unembed", None),
    # OLMo-1 native
    ("model.transformer.wte.weight", M, "embed", None),
    ("model.transformer.blocks.5.att_proj.weight", M, "qkv", 5),
    ("model.transformer.blocks.5.attn_out.weight", M, "o", 5),
    ("model.transformer.blocks.5.ff_proj.weight", M, "ffn_in", 5),
    ("model.transformer.blocks.5.ff_out.weight", M, "ffn_out", 5),
    ("model.transformer.ff_out.weight", M, "unembed", None),
    # BERT
    ("embeddings.word_embeddings.weight", M, "embed", None),
    ("encoder.layer.1.attention.self.query.weight", M, "q", 1),
    ("encoder.layer.1.attention.self.key.weight", M, "k", 1),
    ("encoder.layer.1.attention.self.value.weight", M, "v", 1),
    ("encoder.layer.1.attention.output.dense.weight", M, "o", 1),
    ("encoder.layer.1.intermediate.dense.weight", M, "ffn_in", 1),
    ("encoder.layer.1.output.dense.weight", M, "ffn_out", 1),
    ("encoder.layer.1.output.LayerNorm.weight", V, "norm", 1),
    ("pooler.dense.weight", M, "other", None),
    # GPT-2 (Conv1D)
    ("transformer.wte.weight", M, "embed", None),
    ("transformer.h.0.attn.c_attn.weight", M, "qkv", 0),
    ("transformer.h.0.attn.c_proj.weight", M, "o", 0),
    ("transformer.h.0.mlp.c_fc.weight", M, "ffn_in", 0),
    ("transformer.h.0.mlp.c_proj.weight", M, "ffn_out", 0),
    ("transformer.h.0.ln_1.weight", V, "norm", 0),
    # Phi-3
    ("model.layers.2.self_attn.qkv_proj.weight", M, "qkv", 2),
    ("model.layers.2.mlp.gate_up_proj.weight", M, "ffn_in", 2),
    # Mixtral / Qwen-MoE experts
    ("model.layers.0.block_sparse_moe.experts.5.w1.weight", M, "gate", 0),
    ("model.layers.0.block_sparse_moe.experts.5.w3.weight", M, "up", 0),
    ("model.layers.0.block_sparse_moe.experts.5.w2.weight", M, "down", 0),
    ("model.layers.0.block_sparse_moe.gate.weight", M, "router", 0),
    ("model.layers.0.mlp.experts.17.down_proj.weight", M, "down", 0),
    ("model.layers.0.mlp.shared_expert.gate_proj.weight", M, "gate", 0),
    ("model.layers.0.mlp.gate.weight", M, "router", 0),
    # llama.cpp GGUF names
    ("blk.7.attn_q.weight", M, "q", 7),
    ("blk.7.attn_output.weight", M, "o", 7),
    ("blk.7.ffn_down.weight", M, "down", 7),
    ("token_embd.weight", M, "embed", None),
    ("output.weight", M, "unembed", None),
    ("output_norm.weight", V, "norm", None),
    # unknown
    ("vision_tower.patch_embed.proj.weight", M, "other", None),
]


@pytest.mark.parametrize(("name", "shape", "kind", "block"), CASES)
def test_tensor_roles(name, shape, kind, block):
    role = classify_tensor(name, shape)
    assert (role.kind, role.block) == (kind, block)


def test_expert_index_and_classes():
    role = classify_tensor("model.layers.4.mlp.experts.17.gate_proj.weight", M)
    assert (role.block, role.expert, role.cls) == (4, 17, "transmission")
    assert classify_tensor("model.layers.4.self_attn.k_proj.weight", M).cls == "selection"
    assert classify_tensor("x.layers.1.attention.query_key_value.weight", M).cls == "selection"
    assert classify_tensor("model.layers.4.mlp.experts.17.gate_proj.weight", M).expert == 17
    assert classify_tensor("model.layers.0.mlp.shared_expert.up_proj.weight", M).note == "shared expert"


def test_norm_sites_depend_on_the_family():
    name = "model.layers.0.post_attention_layernorm.weight"
    assert classify_tensor(name, V, family="llama").site == "ffn"  # Llama: the pre-FFN norm
    assert classify_tensor(name, V, family="olmo2").site == "post_attn"
    assert classify_tensor("model.layers.61.enorm.weight", V, n_layers=61).site == "mtp"
    assert classify_tensor("model.norm.weight", V).site == "final"
    assert classify_tensor("model.layers.0.self_attn.q_norm.weight", V).site == "q_norm"


def test_buffers_and_masks_are_other():
    assert classify_tensor("gpt_neox.layers.0.attention.bias", (1, 1, 16, 16)).kind == "other"
    assert classify_tensor("gpt_neox.layers.0.attention.rotary_emb.inv_freq", (16,)).kind == "other"


def test_arch_from_configs():
    llama = arch_from_config(
        {
            "model_type": "llama",
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
        }
    )
    assert (llama.d_model, llama.n_kv_heads, llama.head_dim, llama.norm_type) == (4096, 8, 128, "rmsnorm")
    assert attention_architecture(llama) == "GQA 4:1"
    gpt2 = arch_from_config(
        {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "layer_norm_epsilon": 1e-5}
    )
    assert (gpt2.ffn_size, gpt2.norm_type) == (3072, "layernorm")
    # Conv1D is a property of the stored names (HF c_attn/c_fc/c_proj), not of the family: GGUF transposes them.
    assert complete_arch(gpt2, [("transformer.h.0.attn.c_attn.weight", (768, 2304))]).conv1d
    assert not complete_arch(arch_from_config({"model_type": "gpt2"}), [("blk.0.attn_qkv.weight", (2304, 768))]).conv1d
    bert = arch_from_config({"model_type": "bert", "hidden_size": 384, "num_attention_heads": 12})
    assert bert.norm_placement == "post"
    assert attention_architecture(bert) == "MHA"
    gemma = arch_from_config({"model_type": "gemma2", "hidden_size": 8})
    assert gemma.norm_offset == 1.0
    falcon = arch_from_config(
        {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8, "multi_query": True}
    )
    assert attention_architecture(falcon) == "MQA"


def test_complete_arch_from_tensors_alone():
    tensors = [
        ("model.embed_tokens.weight", (100, 16)),
        ("model.layers.0.self_attn.q_proj.weight", (16, 16)),
        ("model.layers.1.mlp.gate_proj.weight", (32, 16)),
        ("model.layers.1.input_layernorm.weight", (16,)),
        ("model.layers.1.self_attn.q_norm.weight", (4,)),
    ]
    info = complete_arch(ArchInfo(), tensors)
    assert (info.family, info.n_layers, info.d_model) == ("llama", 2, 16)
    assert info.tied_embeddings
    assert info.qk_norm
    assert info.ffn_type == "gated"
    assert info.norm_type == "rmsnorm"


def _parts(name, shape, arch):
    return split_parts(classify_tensor(name, shape), name, shape, arch)


def _gather(flat: np.ndarray, seg) -> np.ndarray:
    return seg.view(flat).reshape(-1)


def test_neox_fused_qkv_split_follows_heads():
    n_heads, hd, d = 4, 8, 32
    arch = ArchInfo(family="gpt_neox", n_heads=n_heads, n_kv_heads=n_heads, head_dim=hd, d_model=d)
    w = np.arange(3 * d * d).reshape(n_heads, 3, hd, d)  # rows grouped per head: q, k, v
    parts, reason = _parts("gpt_neox.layers.0.attention.query_key_value.weight", (3 * d, d), arch)
    assert reason is None
    assert [k for k, _ in parts] == ["q", "k", "v"]
    for i, (_, seg) in enumerate(parts):
        assert np.array_equal(_gather(w.reshape(-1), seg), w[:, i].reshape(-1))


def test_gpt2_c_attn_split_takes_columns():
    d = 16
    arch = arch_from_config({"model_type": "gpt2", "n_embd": d, "n_layer": 1, "n_head": 4})
    w = np.arange(d * 3 * d).reshape(d, 3 * d)
    parts, _ = _parts("transformer.h.0.attn.c_attn.weight", (d, 3 * d), arch)
    for i, (_, seg) in enumerate(parts):
        assert np.array_equal(_gather(w.reshape(-1), seg), w[:, i * d : (i + 1) * d].reshape(-1))


def test_phi3_qkv_and_gate_up_splits_take_rows():
    arch = arch_from_config(
        {
            "model_type": "phi3",
            "hidden_size": 16,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 24,
        }
    )
    w = np.arange((16 + 8 + 8) * 16).reshape(32, 16)
    parts, _ = _parts("model.layers.0.self_attn.qkv_proj.weight", (32, 16), arch)
    sizes = [np.array(_gather(w.reshape(-1), seg)).size for _, seg in parts]
    assert sizes == [16 * 16, 8 * 16, 8 * 16]
    assert np.array_equal(_gather(w.reshape(-1), parts[1][1]), w[16:24].reshape(-1))
    g = np.arange(48 * 16).reshape(48, 16)
    parts, _ = _parts("model.layers.0.mlp.gate_up_proj.weight", (48, 16), arch)
    assert [k for k, _ in parts] == ["gate", "up"]
    assert np.array_equal(_gather(g.reshape(-1), parts[1][1]), g[24:].reshape(-1))


def test_olmo_native_ff_proj_is_up_then_gate():
    arch = arch_from_config(
        {
            "model_type": "hf_olmo",
            "d_model": 16,
            "n_heads": 4,
            "mlp_hidden_size": 48,
            "activation_type": "swiglu",
        }
    )
    parts, _ = _parts("model.transformer.blocks.0.ff_proj.weight", (48, 16), arch)
    assert [k for k, _ in parts] == ["up", "gate"]


def test_ambiguous_splits_say_why():
    no_heads = ArchInfo(family="gpt_neox")
    parts, reason = _parts("gpt_neox.layers.0.attention.query_key_value.weight", (96, 32), no_heads)
    assert parts == []
    assert "head counts" in reason
    wrong = ArchInfo(family="gpt_neox", n_heads=4, n_kv_heads=4, head_dim=8)
    parts, reason = _parts("gpt_neox.layers.0.attention.query_key_value.weight", (90, 32), wrong)
    assert parts == []
    assert "rows" in reason


def test_internlm2_wqkv_split_follows_kv_groups():
    n_q, n_kv, hd, d = 4, 2, 2, 8
    arch = ArchInfo(family="internlm2", n_heads=n_q, n_kv_heads=n_kv, head_dim=hd, d_model=d)
    w = np.arange((n_q + 2 * n_kv) * hd * d).reshape(n_kv, n_q // n_kv + 2, hd, d)  # per group: q q k v
    parts, reason = _parts("model.layers.0.attention.wqkv.weight", ((n_q + 2 * n_kv) * hd, d), arch)
    assert reason is None
    assert [k for k, _ in parts] == ["q", "k", "v"]
    flat = w.reshape(-1)
    assert np.array_equal(_gather(flat, parts[0][1]), w[:, :2].reshape(-1))
    assert np.array_equal(_gather(flat, parts[1][1]), w[:, 2].reshape(-1))
    assert np.array_equal(_gather(flat, parts[2][1]), w[:, 3].reshape(-1))


def test_fused_qkv_of_an_unknown_family_is_not_guessed():
    arch = ArchInfo(family="someformer", n_heads=4, n_kv_heads=4, head_dim=4, d_model=16)
    parts, reason = _parts("model.layers.0.self_attn.qkv_proj.weight", (48, 16), arch)
    assert parts == []
    assert "someformer" in reason
    # GGUF attn_qkv is always [q | k | v] (llama.cpp's converter reorders it)
    parts, reason = _parts("blk.0.attn_qkv.weight", (48, 16), arch)
    assert reason is None
    assert [k for k, _ in parts] == ["q", "k", "v"]


def test_gpt_bigcode_c_attn_is_a_linear_not_conv1d():
    arch = arch_from_config({"model_type": "gpt_bigcode", "n_embd": 16, "n_layer": 1, "n_head": 4})
    role = classify_tensor("transformer.h.0.attn.c_attn.weight", (24, 16), family=arch.family)
    assert role.kind == "qkv"
    assert not (role.note and "Conv1D" in role.note)
    assert not complete_arch(arch, [("transformer.h.0.attn.c_attn.weight", (24, 16))]).conv1d


def test_vision_tower_is_kept_apart_from_the_language_model():
    role = classify_tensor("vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight", (64, 64), 2, "llava")
    assert role.kind == "other"
    assert "vision_tower" in role.note
    role = classify_tensor("language_model.model.layers.0.self_attn.q_proj.weight", (64, 64), 2, "llava")
    assert role.kind == "q"


def test_arch_from_a_config_with_wrong_types_ignores_those_fields():
    arch = arch_from_config(
        {
            "model_type": ["llama"],
            "architectures": "LlamaForCausalLM",
            "num_hidden_layers": "32",
            "hidden_size": 4096.0,
            "num_attention_heads": True,
            "intermediate_size": None,
            "mlp_ratio": "4",
            "vocab_size": -1,
            "tie_word_embeddings": "false",
        }
    )
    assert arch.family is None
    assert arch.architectures == []
    assert arch.n_layers is None
    assert arch.d_model == 4096
    assert arch.n_heads is None
    assert arch.head_dim is None
    assert arch.ffn_size is None
    assert arch.vocab_size is None
    assert arch.tied_embeddings is None


def test_openai_gpt_is_conv1d_and_qwen1_mlp_is_gated():
    role = classify_tensor("h.0.attn.c_attn.weight", (16, 48), family="openai-gpt")
    assert role.kind == "qkv"
    assert "Conv1D" in role.note
    kinds = {
        n: classify_tensor(f"transformer.h.0.mlp.{n}.weight", (8, 8), family="qwen").kind
        for n in ("w1", "w2", "c_proj")
    }
    assert kinds == {"w1": "up", "w2": "gate", "c_proj": "down"}
    assert classify_tensor("transformer.h.0.attn.c_proj.weight", (8, 8), family="qwen").kind == "o"


def test_chatglm_fused_qkv_is_not_split_as_contiguous():
    arch = ArchInfo(family="chatglm", n_heads=4, n_kv_heads=4, head_dim=4, d_model=16)
    parts, reason = _parts("transformer.layers.0.attention.query_key_value.weight", (48, 16), arch)
    assert parts == []
    assert reason

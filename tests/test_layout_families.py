"""Today's architectures end to end (issue 18, acceptance 1): every tensor of a scaled-down checkpoint with
the real names, layouts and config fields of its family (tests/layout_checkpoints.py) gets the kind its
modelling code gives it; nothing with a role lands in `other`; vision towers are marked and kept out of
the language model's kinds; records cut from a stored tensor (fused experts, MLA, a gated q_proj) equal
the same piece cut by hand with numpy and fitted alone, number for number."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests import layout_checkpoints as ck
from weightdiag import api
from weightdiag.errors import QuantizationError
from weightdiag.record.row import reduction_record
from weightdiag.reduce.reduction import reduce_array
from weightdiag.run.measure import FitOptions
from weightdiag.testing import synthetic
from weightdiag.vocabulary import SSM_KINDS

_ROWS: dict[str, dict] = {}


def fitted(tmp_path_factory, key: str, builder) -> tuple[dict, ck.Tensors]:
    config, tensors = builder()
    if key not in _ROWS:
        path = ck.write(tmp_path_factory.mktemp(key), config, tensors)
        _ROWS[key] = api.fit_model(str(path), FitOptions(device="cpu"))
    return _ROWS[key], tensors


def by_name(row: dict, field: str = "matrices") -> dict[str, dict]:
    return {m["name"]: m for m in row[field]}


def check_kinds(row: dict, rules: list[tuple[str, str]], field: str = "matrices") -> None:
    """Every record's kind is the first matching rule's; every rule matches at least one record."""
    used = set()
    wrong = []
    for rec in row[field]:
        rule = next((r for r in rules if re.search(r[0], rec["name"])), None)
        assert rule is not None, f"no rule for {rec['name']} ({rec['kind']})"
        used.add(rule)
        if rec["kind"] != rule[1]:
            wrong.append((rec["name"], rec["kind"], rule[1]))
    assert wrong == []
    assert [r for r in rules if r not in used] == []


def no_unclassified(row: dict) -> None:
    others = [m["name"] for m in row["matrices"] if m["kind"] == "other" and not m.get("tower")]
    assert others == [] and row["unclassified"] == []


def same_fit(record: dict, piece: np.ndarray, dtype: str = "BF16") -> None:
    """`record` equals `piece` (float32 values, the record's (out, in) orientation) reduced and fitted alone."""
    piece = np.ascontiguousarray(piece)
    flat = synthetic.to_bf16_bits(piece).reshape(-1) if dtype == "BF16" else piece.reshape(-1).view(np.uint32)
    expected = reduction_record(reduce_array(flat, dtype), piece.shape, "hist1024")
    assert record["shape"] == list(piece.shape)
    for key in ("numel", "stats", "argmax", "fits", "heaviness", "gamma_closure"):
        assert record[key] == expected[key], (record["name"], key)


def bf16(x: np.ndarray) -> np.ndarray:
    """float32 values as stored in BF16."""
    return (synthetic.to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


# --- MLA ------------------------------------------------------------------------------------------------

MLA_RULES = [
    (r"q_a_proj\.weight$", "q_a"),
    (r"q_b_proj\.weight\[q\]$", "q"),
    (r"q_b_proj\.weight\[q_rope\]$", "q_rope"),
    (r"kv_a_proj_with_mqa\.weight\[kv_a\]$", "kv_a"),
    (r"kv_a_proj_with_mqa\.weight\[k_rope\]$", "k_rope"),
    (r"kv_b_proj\.weight\[k\]$", "k"),
    (r"kv_b_proj\.weight\[v\]$", "v"),
    (r"o_proj\.weight$", "o"),
    (r"mlp\.gate\.weight$", "router"),
    (r"gate_proj\.weight$", "gate"),
    (r"up_proj\.weight$", "up"),
    (r"down_proj\.weight$", "down"),
    (r"eh_proj\.weight$", "mtp_proj"),
    (r"(shared_head\.head|lm_head)\.weight$", "unembed"),
    (r"embed_tokens\.weight$", "embed"),
]


@pytest.mark.parametrize("model_type", ["deepseek_v3", "kimi_k2"])
def test_mla_gets_q_k_v_and_its_latent_and_rope_pieces(tmp_path_factory, model_type):
    row, tensors = fitted(tmp_path_factory, model_type, lambda: ck.deepseek_v3(model_type))
    check_kinds(row, MLA_RULES)
    no_unclassified(row)
    m = by_name(row)
    heads, nope, rope, vdim = 4, ck.MLA["qk_nope_head_dim"], ck.MLA["qk_rope_head_dim"], ck.MLA["v_head_dim"]
    rank = ck.MLA["kv_lora_rank"]
    for i in range(3):
        a = f"model.layers.{i}.self_attn"
        kv_b = tensors[f"{a}.kv_b_proj.weight"][1].reshape(heads, nope + vdim, rank)  # per head [k_nope | v]
        same_fit(m[f"{a}.kv_b_proj.weight[k]"], kv_b[:, :nope].reshape(-1, rank))
        same_fit(m[f"{a}.kv_b_proj.weight[v]"], kv_b[:, nope:].reshape(-1, rank))
        kv_a = tensors[f"{a}.kv_a_proj_with_mqa.weight"][1]  # [latent | shared rope key]
        same_fit(m[f"{a}.kv_a_proj_with_mqa.weight[kv_a]"], kv_a[:rank])
        same_fit(m[f"{a}.kv_a_proj_with_mqa.weight[k_rope]"], kv_a[rank:])
        q_b = tensors[f"{a}.q_b_proj.weight"][1].reshape(heads, nope + rope, -1)
        same_fit(m[f"{a}.q_b_proj.weight[q_rope]"], q_b[:, nope:].reshape(heads * rope, -1))
        assert m[f"{a}.kv_b_proj.weight[k]"]["slice_of"] == {
            "tensor": f"{a}.kv_b_proj.weight",
            "segments": [0, nope * rank, (nope + vdim) * rank, heads],
        }
    # classes: the query/key pieces are Selection, the values Transmission
    assert {m[n]["class"] for n in m if "[k_rope]" in n or "[q_rope]" in n or "q_a_proj" in n} == {"selection"}
    assert {m[n]["class"] for n in m if n.endswith("[v]")} == {"transmission"}
    # the MTP layer (DeepSeek numbers it after the last block) and the router bias
    assert m["model.layers.2.eh_proj.weight"]["block"] == 2
    v = by_name(row, "vectors")
    assert v["model.layers.1.mlp.gate.e_score_correction_bias"]["of_kind"] == "router"
    assert v["model.layers.0.self_attn.kv_a_layernorm.weight"]["site"] == "latent"
    assert m["model.layers.1.mlp.shared_experts.gate_proj.weight"]["note"] == "shared expert"
    assert row["kinds"]["k"]["count"] == 3 and row["kinds"]["v"]["count"] == 3


def test_qwen3_moe_experts_and_router(tmp_path_factory):
    row, _ = fitted(tmp_path_factory, "qwen3_moe", ck.qwen3_moe)
    rules = [
        (r"self_attn\.([qkvo])_proj", ""),
        (r"mlp\.gate\.weight$", "router"),
        (r"gate_proj", "gate"),
        (r"up_proj", "up"),
        (r"down_proj", "down"),
        (r"embed_tokens", "embed"),
        (r"lm_head", "unembed"),
    ]
    for rec in row["matrices"]:
        attn = re.search(rules[0][0], rec["name"])
        if attn:
            assert rec["kind"] == attn.group(1)
    check_kinds({"matrices": [r for r in row["matrices"] if "self_attn" not in r["name"]]}, rules[1:])
    no_unclassified(row)
    experts = [r for r in row["matrices"] if r["expert"] is not None]
    assert len(experts) == 2 * 4 * 3 and {r["expert"] for r in experts} == {0, 1, 2, 3}


QWEN3_NEXT_RULES = [
    (r"self_attn\.q_proj\.weight\[q\]$", "q"),
    (r"self_attn\.q_proj\.weight\[attn_gate\]$", "attn_gate"),
    (r"self_attn\.k_proj", "k"),
    (r"self_attn\.v_proj", "v"),
    (r"self_attn\.o_proj", "o"),
    (r"linear_attn\.in_proj_qkvz", "lin_qkvz"),
    (r"linear_attn\.in_proj_ba", "lin_ba"),
    (r"linear_attn\.out_proj", "lin_out"),
    (r"shared_expert_gate|mlp\.gate\.weight$", "router"),
    (r"gate_proj", "gate"),
    (r"up_proj", "up"),
    (r"down_proj", "down"),
    (r"mtp\.fc", "mtp_proj"),
    (r"embed_tokens", "embed"),
    (r"lm_head", "unembed"),
]


def test_qwen3_next_gated_attention_and_delta_net(tmp_path_factory):
    row, tensors = fitted(tmp_path_factory, "qwen3_next", ck.qwen3_next)
    check_kinds(row, QWEN3_NEXT_RULES)
    no_unclassified(row)
    m = by_name(row)
    q = ck.QWEN3_NEXT
    stored = tensors["model.layers.3.self_attn.q_proj.weight"][1].reshape(q["heads"], 2 * q["hd"], -1)
    same_fit(m["model.layers.3.self_attn.q_proj.weight[q]"], stored[:, : q["hd"]].reshape(q["heads"] * q["hd"], -1))
    same_fit(m["model.layers.3.self_attn.q_proj.weight[attn_gate]"], stored[:, q["hd"] :].reshape(-1, stored.shape[-1]))
    # the DeltaNet's output is not an attention output, and its parameters are vectors, never projections
    assert {r["block"] for r in row["matrices"] if r["kind"] == "o"} == {3, 4}  # block 3 and the MTP layer
    assert row["kinds"]["lin_out"]["class"] == "recurrent" and row["kinds"]["lin_out"]["k_class"] is None
    v = by_name(row, "vectors")
    for name, param in (("conv1d.weight", "conv_weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias")):
        rec = v[f"model.layers.0.linear_attn.{name}"]
        assert (rec["kind"], rec["param"]) == ("ssm_param", param)
    assert (
        v["model.layers.0.linear_attn.conv1d.weight"]["numel"]
        == tensors["model.layers.0.linear_attn.conv1d.weight"][1].size
    )
    assert v["model.layers.0.linear_attn.norm.weight"]["site"] == "ssm"
    # MTP layers are numbered from 0 in mtp.layers.N: they follow the 4 blocks, never merge into block 0
    assert m["mtp.layers.0.self_attn.k_proj.weight"]["block"] == 4
    assert v["mtp.layers.0.input_layernorm.weight"]["site"] == "mtp"


# --- fused experts ----------------------------------------------------------------------------------------


def test_gpt_oss_interleaved_experts_and_their_biases(tmp_path_factory):
    row, tensors = fitted(tmp_path_factory, "gpt_oss", ck.gpt_oss)
    rules = [
        (r"self_attn\.q_proj", "q"),
        (r"self_attn\.k_proj", "k"),
        (r"self_attn\.v_proj", "v"),
        (r"self_attn\.o_proj", "o"),
        (r"router", "router"),
        (r"gate_up_proj\[\d+,gate\]$", "gate"),
        (r"gate_up_proj\[\d+,up\]$", "up"),
        (r"down_proj\[\d+\]$", "down"),
        (r"embed_tokens", "embed"),
        (r"lm_head", "unembed"),
    ]
    check_kinds(row, rules)
    no_unclassified(row)
    m, v = by_name(row), by_name(row, "vectors")
    x = "model.layers.1.mlp.experts"
    gate_up, down = tensors[f"{x}.gate_up_proj"][1], tensors[f"{x}.down_proj"][1]  # [E, d, 2f], [E, f, d]
    for e in range(4):  # GptOssExperts: gate = gate_up[..., ::2], up = gate_up[..., 1::2]; records are (out, in)
        same_fit(m[f"{x}.gate_up_proj[{e},gate]"], gate_up[e][:, ::2].T)
        same_fit(m[f"{x}.gate_up_proj[{e},up]"], gate_up[e][:, 1::2].T)
        same_fit(m[f"{x}.down_proj[{e}]"], down[e].T)
        assert m[f"{x}.gate_up_proj[{e},gate]"]["expert"] == e
        bias = bf16(tensors[f"{x}.gate_up_proj_bias"][1][e])
        gate_bias = v[f"{x}.gate_up_proj_bias[{e},gate]"]
        assert (gate_bias["kind"], gate_bias["of_kind"], gate_bias["expert"], gate_bias["numel"]) == (
            "bias",
            "gate",
            e,
            16,
        )
        assert gate_bias["mean"] == pytest.approx(float(bias[::2].astype(np.float64).mean()), rel=1e-9)
        assert v[f"{x}.gate_up_proj_bias[{e},up]"]["max"] == pytest.approx(float(bias[1::2].max()))
        assert v[f"{x}.down_proj_bias[{e}]"]["of_kind"] == "down"
    assert v["model.layers.0.self_attn.sinks"]["note"] == "attention sinks"
    assert row["architecture"]["ffn_type"] == "gated"


def test_gpt_oss_mxfp4_experts_are_cut_in_their_logical_rows(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    row, tensors = fitted(tmp_path_factory, "gpt_oss_mxfp4", lambda: ck.gpt_oss(d=96, f=32, mxfp4=True))
    m = by_name(row)
    x = "model.layers.0.mlp.experts"

    def dequantized(proj: str) -> np.ndarray:  # transformers' own dequantization: [E, cols, rows] (in, out)
        blocks, scales = (torch.from_numpy(tensors[f"{x}.{proj}_{s}"][1]) for s in ("blocks", "scales"))
        return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).numpy()

    gate_up, down = dequantized("gate_up_proj"), dequantized("down_proj")  # [E, d, 2f], [E, f, d]
    for e in range(4):
        for k, cols in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
            rec = m[f"{x}.gate_up_proj[{e},{k}]"]
            assert (rec["kind"], rec["expert"], rec["dequantized"]["format"]) == (k, e, "mxfp4")
            same_fit(rec, gate_up[e][:, cols].T, "F32")
        same_fit(m[f"{x}.down_proj[{e}]"], down[e].T, "F32")
    assert not [r for r in row["matrices"] if r["kind"] == "other"]


def test_llama4_fused_experts_halves_and_the_vision_model(tmp_path_factory):
    row, tensors = fitted(tmp_path_factory, "llama4", ck.llama4)
    lm = [r for r in row["matrices"] if not r.get("tower")]
    rules = [
        (r"self_attn\.([qkvo])_proj", None),
        (r"router", "router"),
        (r"gate_up_proj\[\d+,gate\]$|shared_expert\.gate_proj", "gate"),
        (r"gate_up_proj\[\d+,up\]$|shared_expert\.up_proj", "up"),
        (r"experts\.down_proj\[\d+\]$|shared_expert\.down_proj", "down"),
        (r"embed_tokens", "embed"),
        (r"lm_head", "unembed"),
    ]
    for r in lm:
        attn = re.search(rules[0][0], r["name"])
        if attn:
            assert r["kind"] == attn.group(1)
    check_kinds({"matrices": [r for r in lm if "self_attn" not in r["name"]]}, rules[1:])
    no_unclassified(row)
    m = by_name(row)
    p = "language_model.model.layers.0.feed_forward.experts"
    gate_up, down = tensors[f"{p}.gate_up_proj"][1], tensors[f"{p}.down_proj"][1]  # [E, d, 2f], [E, f, d]
    f = 24
    for e in range(4):  # Llama4TextExperts: gate, up = bmm(x, gate_up_proj).chunk(2, dim=-1)
        same_fit(m[f"{p}.gate_up_proj[{e},gate]"], gate_up[e][:, :f].T)
        same_fit(m[f"{p}.gate_up_proj[{e},up]"], gate_up[e][:, f:].T)
        same_fit(m[f"{p}.down_proj[{e}]"], down[e].T)
    towers = [r for r in row["matrices"] + row["vectors"] if r.get("tower")]
    assert {r["tower"] for r in towers} == {"vision_model", "multi_modal_projector"}
    assert all(r["kind"] == "other" for r in towers)
    assert {r["block"] for r in towers if r["name"].startswith("vision_model.model.layers.")} == {0, 1, 2}
    assert m["vision_model.model.layers.2.self_attn.q_proj.weight"]["tower_kind"] == "q"
    assert m["vision_model.model.layers.0.mlp.fc1.weight"]["tower_kind"] == "ffn_in"
    assert row["kinds"]["q"]["count"] == 2  # the language model's two blocks only
    assert row["architecture"]["n_layers"] == 2


def test_granite_h_mamba_fused_experts_and_shared_mlp(tmp_path_factory):
    row, tensors = fitted(tmp_path_factory, "granite_h", ck.granite_h)
    rules = [
        (r"self_attn\.q_proj", "q"),
        (r"self_attn\.k_proj", "k"),
        (r"self_attn\.v_proj", "v"),
        (r"self_attn\.o_proj", "o"),
        (r"mamba\.in_proj", "ssm_in"),
        (r"mamba\.out_proj", "ssm_out"),
        (r"router", "router"),
        (r"input_linear\.weight\[\d+,gate\]$", "gate"),
        (r"input_linear\.weight\[\d+,up\]$", "up"),
        (r"block_sparse_moe\.output_linear\.weight\[\d+\]$|shared_mlp\.output_linear", "down"),
        (r"shared_mlp\.input_linear", "ffn_in"),
        (r"embed_tokens", "embed"),
    ]
    check_kinds(row, rules)
    no_unclassified(row)
    m = by_name(row)
    p = "model.layers.1.block_sparse_moe"
    w_in, w_out = tensors[f"{p}.input_linear.weight"][1], tensors[f"{p}.output_linear.weight"][1]
    for e in range(4):  # GraniteMoeHybridExperts: linear(x, gate_up_proj[e]).chunk(2): gate rows first
        same_fit(m[f"{p}.input_linear.weight[{e},gate]"], w_in[e][:16])
        same_fit(m[f"{p}.input_linear.weight[{e},up]"], w_in[e][16:])
        same_fit(m[f"{p}.output_linear.weight[{e}]"], w_out[e])
    shared = m["model.layers.1.shared_mlp.input_linear.weight"]
    assert [part["kind"] for part in shared["parts"]] == ["gate", "up"] and shared["note"] == "shared expert"
    assert {r["block"] for r in row["matrices"] if r["kind"] == "o"} == {1}  # Mamba outputs are not attention outputs
    v = by_name(row, "vectors")
    assert {
        (v[f"model.layers.0.mamba.{n}"]["kind"], v[f"model.layers.0.mamba.{n}"]["param"]) for n in ("A_log", "D")
    } == {
        ("ssm_param", "A_log"),
        ("ssm_param", "D"),
    }
    assert row["architecture"]["tied_embeddings"] is True


def test_dbrx_experts_stacked_per_kind(tmp_path_factory):
    row, tensors = fitted(tmp_path_factory, "dbrx", ck.dbrx)
    rules = [
        (r"Wqkv", "qkv"),
        (r"attn\.out_proj", "o"),
        (r"router", "router"),
        (r"mlp\.w1\[\d+\]$", "gate"),
        (r"mlp\.v1\[\d+\]$", "up"),
        (r"mlp\.w2\[\d+\]$", "down"),
        (r"wte", "embed"),
        (r"lm_head", "unembed"),
    ]
    check_kinds(row, rules)
    no_unclassified(row)
    m = by_name(row)
    p = "transformer.blocks.0.ffn.experts.mlp"
    f = 16
    for e in range(4):  # DbrxExpertGLU: x @ w1[e].T, x @ v1[e].T, h @ w2[e]: w2 is stored (in, out)
        same_fit(m[f"{p}.w1[{e}]"], tensors[f"{p}.w1"][1][e * f : (e + 1) * f])
        same_fit(m[f"{p}.v1[{e}]"], tensors[f"{p}.v1"][1][e * f : (e + 1) * f])
        same_fit(m[f"{p}.w2[{e}]"], tensors[f"{p}.w2"][1][e * f : (e + 1) * f].T)
    qkv = m["transformer.blocks.0.norm_attn_norm.attn.Wqkv.weight"]
    assert [part["kind"] for part in qkv["parts"]] == ["q", "k", "v"]  # GQA 4:2 from attn_config.kv_n_heads
    v = by_name(row, "vectors")
    assert v["transformer.blocks.0.norm_attn_norm.norm_1.weight"]["site"] == "attn"
    assert v["transformer.blocks.0.norm_attn_norm.norm_2.weight"]["site"] == "ffn"


# --- SSM hybrids ------------------------------------------------------------------------------------------

SSM_RULES = [
    (r"self_attn\.q_proj|mixer\.q_proj", "q"),
    (r"self_attn\.k_proj|mixer\.k_proj", "k"),
    (r"self_attn\.v_proj|mixer\.v_proj", "v"),
    (r"self_attn\.o_proj|mixer\.o_proj", "o"),
    (r"(mamba|mixer)\.in_proj", "ssm_in"),
    (r"mamba\.x_proj", "ssm_x"),
    (r"mamba\.dt_proj", "ssm_dt"),
    (r"(mamba|mixer)\.out_proj", "ssm_out"),
    (r"router|mixer\.gate\.weight", "router"),
    (r"gate_proj", "gate"),
    (r"up_proj", "up"),
    (r"down_proj", "down"),
    (r"embed_tokens|backbone\.embeddings", "embed"),
    (r"lm_head", "unembed"),
]


@pytest.mark.parametrize(
    ("key", "builder", "prefix"),
    [
        ("jamba", ck.jamba, "model.layers.0.mamba"),
        ("falcon_h1", ck.falcon_h1, "model.layers.0.mamba"),
        ("nemotron_h", ck.nemotron_h, "backbone.layers.0.mixer"),
    ],
)
def test_ssm_hybrids(tmp_path_factory, key, builder, prefix):
    row, tensors = fitted(tmp_path_factory, key, builder)
    check_kinds(row, [r for r in SSM_RULES if any(re.search(r[0], m["name"]) for m in row["matrices"])])
    no_unclassified(row)
    assert {r["kind"] for r in row["matrices"] if r["name"].startswith(prefix)} <= set(SSM_KINDS)
    for kind in ("ssm_in", "ssm_out"):
        s = row["kinds"][kind]
        assert (s["class"], s["k_class"]) == ("recurrent", None)
    v = by_name(row, "vectors")
    params = {n: rec for n, rec in v.items() if n.startswith(prefix) and rec["kind"] == "ssm_param"}
    assert {rec["param"] for rec in params.values()} == {"A_log", "D", "conv_weight", "conv_bias"} | (
        set() if key == "jamba" else {"dt_bias"}
    )
    for name, rec in params.items():
        assert rec["numel"] == tensors[name][1].size
    assert not any(
        m["name"].startswith(prefix) and m["name"].endswith(("A_log", "D", "conv1d.weight")) for m in row["matrices"]
    )
    if key == "jamba":  # Jamba: 2-D A_log [d_inner, d_state] is a vector record, attention only in block 2
        assert v["model.layers.0.mamba.A_log"]["numel"] == 128 * 8
        assert {r["block"] for r in row["matrices"] if r["kind"] == "o"} == {2}
        assert v["model.layers.0.mamba.dt_layernorm.weight"]["site"] == "ssm"
        assert v["model.layers.0.pre_ff_layernorm.weight"]["site"] == "ffn"
        assert v["model.layers.0.mamba.dt_proj.bias"]["of_kind"] == "ssm_dt"
    if key == "nemotron_h":
        assert by_name(row)["backbone.embeddings.weight"]["kind"] == "embed"
        assert {r["block"] for r in row["matrices"] if r["kind"] == "o"} == {2}
        assert {r["expert"] for r in row["matrices"] if r["kind"] == "up" and r["block"] == 3} == {0, 1, 2, 3, None}


# --- vision towers and a tied head stored twice --------------------------------------------------------------


def test_gemma3_vision_tower_is_marked_and_kept_out(tmp_path_factory):
    row, _ = fitted(tmp_path_factory, "gemma3", ck.gemma3)
    towers = [r for r in row["matrices"] + row["vectors"] if r.get("tower")]
    assert {r["tower"] for r in towers} == {"vision_tower", "multi_modal_projector"}
    assert all(r["name"].startswith(("vision_tower.", "multi_modal_projector.")) for r in towers)
    assert all(not r.get("tower") for r in row["matrices"] + row["vectors"] if r["name"].startswith("language_model."))
    m = by_name(row)
    q = m["vision_tower.vision_model.encoder.layers.2.self_attn.q_proj.weight"]
    assert (q["kind"], q["block"], q["tower_kind"], q["class"]) == ("other", 2, "q", "other")
    assert m["vision_tower.vision_model.encoder.layers.0.self_attn.out_proj.weight"]["tower_kind"] == "o"
    assert m["multi_modal_projector.mm_input_projection_weight"]["tower"] == "multi_modal_projector"
    no_unclassified(row)
    assert row["kinds"]["q"]["count"] == 2  # the language model's two blocks: the tower's q_proj are not in it


def test_qwen2_5_vl_visual_blocks_and_a_tied_head_stored_twice(tmp_path_factory):
    row, _ = fitted(tmp_path_factory, "qwen2_5_vl", ck.qwen2_5_vl)
    m = by_name(row)
    assert m["visual.blocks.1.attn.qkv.weight"]["tower"] == "visual"
    assert m["visual.blocks.1.attn.qkv.weight"]["tower_kind"] == "qkv"
    assert m["visual.blocks.1.attn.proj.weight"]["tower_kind"] == "o"
    assert m["visual.merger.mlp.0.weight"]["tower"] == "visual"
    no_unclassified(row)
    # tie_word_embeddings true and lm_head.weight saved anyway: fitted once, as the embedding
    assert "lm_head.weight" not in m and "model.embed_tokens.weight" in m
    skipped = {s["name"]: s["reason"] for s in row["skipped"]}
    assert "tied to model.embed_tokens.weight" in skipped["lm_head.weight"]
    assert row["architecture"]["tied_embeddings"] is True


def test_an_untied_head_of_the_same_shape_is_fitted(tmp_path_factory):
    config, tensors = ck.qwen2_5_vl(tied=False)
    row = api.fit_model(str(ck.write(tmp_path_factory.mktemp("untied"), config, tensors)), FitOptions(device="cpu"))
    assert "lm_head.weight" in by_name(row) and row["architecture"]["tied_embeddings"] is False


# --- refusals and fallbacks ------------------------------------------------------------------------------------


def test_fused_experts_that_disagree_with_the_config_are_fitted_whole_and_say_why(tmp_path_factory):
    config, tensors = ck.gpt_oss()
    config["num_local_experts"] = 5  # 4 stored
    row = api.fit_model(
        str(ck.write(tmp_path_factory.mktemp("bad_experts"), config, tensors)), FitOptions(device="cpu")
    )
    rec = by_name(row)["model.layers.0.mlp.experts.gate_up_proj"]
    assert rec["kind"] == "other" and "4 experts stored, config says 5" in rec["parts_note"]
    assert rec["name"] in row["unclassified"]


def test_a_cut_a_quantized_format_cannot_select_is_refused(monkeypatch):
    from weightdiag.layout import ArchInfo, TensorRole
    from weightdiag.layout.views import views_of
    from weightdiag.run.measure import _check_quantized_views

    arch = ArchInfo(family="llama4", d_model=64, n_experts=2)
    role = TensorRole("other", 0, layout="experts")
    views, _ = views_of(role, "m.layers.0.feed_forward.experts.gate_up_proj", (2, 64, 48), arch, quantized=False)

    class Spec:
        format, label, method = "gptq", "GPTQ int4, group 128", "gptq"

    class Quant:
        spec = Spec()

    class Ref:
        name, shape, quant = "m.layers.0.feed_forward.experts.gate_up_proj", (2, 64, 48), Quant()

    with pytest.raises(QuantizationError, match="not whole rows"):
        _check_quantized_views(Ref(), views)
    Spec.format = "mxfp4"  # decoded in row-major order: any selection is exact
    _check_quantized_views(Ref(), views)


def test_deepseek_v2_lite_q_proj_without_a_query_latent_is_cut_into_q_and_q_rope():
    from weightdiag.layout import arch_from_config, classify_tensor
    from weightdiag.layout.views import views_of

    mla = {k: v for k, v in ck.MLA.items() if k != "q_lora_rank"}  # V2-Lite: q_proj, no q_a/q_b
    config = {"model_type": "deepseek_v2", "hidden_size": 64, "num_attention_heads": 4, **mla}
    arch = arch_from_config(config)
    name, shape = "model.layers.0.self_attn.q_proj.weight", (4 * 12, 64)
    views, why = views_of(classify_tensor(name, shape, family="deepseek_v2"), name, shape, arch)
    assert why is None and [(v.label, v.role.kind, v.shape) for v in views] == [
        ("q", "q", (32, 64)),
        ("q_rope", "q_rope", (16, 64)),
    ]
    # a Llama q_proj is never cut
    llama = arch_from_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})
    assert views_of(classify_tensor(name, (64, 64)), name, (64, 64), llama) == ([], None)

"""Architecture knowledge: tensor names -> (block, kind, class) and config.json -> ArchInfo.

Kinds (weightdiag.vocabulary): q, k, v, o, qkv (fused), MLA's q_a/kv_a/q_rope/k_rope, attn_gate,
the SSM and linear-attention projections (ssm_in/x/dt/out, lin_qkvz/ba/out), gate, up, down, ffn_in,
ffn_out, router, embed, unembed; vectors: norm, bias, ssm_param; other. Classes follow the paper
(Sec. 2.2): Selection = W_q, W_k and what holds them; Transmission = W_v, W_o and the FFN.

Families covered by name: GPT-NeoX/Pythia, Llama/Mistral/Qwen2/2.5/3/OLMo-2/Gemma (HF names),
OLMo-1 (HF and native att_proj/attn_out/ff_proj/ff_out), BERT/RoBERTa, GPT-2 (Conv1D), Phi-2,
Phi-3 (qkv_proj, gate_up_proj), Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3/R1 and Kimi-K2 (MLA, MTP
layers), Qwen3-Next (gated attention, gated DeltaNet, MTP), gpt-oss, Llama-4, DBRX, Granite-MoE and
Granite-4.0-H, Jamba, Falcon-H1, Nemotron-H, OPT, BLOOM, Falcon, llama.cpp GGUF names, and the vision
and audio towers of Gemma-3, Qwen2.5-VL, Llama-4 and Mistral-Small (kept apart: `tower`). Stored
tensors that hold several matrices (fused experts, MLA's kv_b_proj, Qwen3-Next's gated q_proj) are cut
into one record each by `views.views_of`. Anything else 2-D is fitted as `other` and listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..segments import Segments
from ..vocabulary import FFN_KINDS, kind_class


@dataclass(frozen=True)
class TensorRole:
    kind: str
    block: int | None = None
    expert: int | None = None  # MoE expert index; None for dense and shared experts
    # weight | bias | buffer; an ssm_param says which: A_log | D | dt_bias | conv_weight | conv_bias
    param: str = "weight"
    of_kind: str | None = None  # for biases: the projection they belong to
    # for norms: attn | ffn | post_attn | post_ffn | q_norm | k_norm | latent | ssm | embed | final | mtp
    site: str | None = None
    note: str | None = None
    # A vision/audio tower or multimodal projector (the name's prefix: vision_tower, visual, vision_model,
    # multi_modal_projector, ...): kind stays `other` so no language-model summary mixes it in, `block` is the
    # tower's own layer, `tower_kind` what the tensor does inside its tower (q, o, qkv, ffn_in, norm, ...).
    tower: str | None = None
    tower_kind: str | None = None
    # Stored tensors that views.views_of cuts into several records: "experts" (fused experts), "mla" (DeepSeek
    # kv_b_proj / kv_a_proj_with_mqa / q_b_proj), None otherwise. Never written to a row.
    layout: str | None = None

    @property
    def cls(self) -> str:
        return kind_class(self.kind)


# --- name parsing --------------------------------------------------------------------------

# Real prefixes: Gemma-3 vision_tower.vision_model.encoder.layers.N and multi_modal_projector; Qwen2.5-VL
# visual.blocks.N and visual.merger; Llama-4 vision_model.model.layers.N, vision_model.vision_adapter and
# multi_modal_projector; Mistral-Small-3.1 vision_tower.transformer.layers.N and multi_modal_projector
# (patch_merger); Gemma-3n embed_vision / embed_audio.
_TOWER = re.compile(
    r"(?:^|\.)(vision_tower|vision_model|visual|vision_encoder|image_encoder|audio_tower|audio_encoder|"
    r"audio_model|mm_projector|multi_modal_projector|vision_embed_tokens|embed_vision|embed_audio)\."
)
_BLOCK = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block|blk)\.(\d+)\.")
_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_MTP_BLOCK = re.compile(r"(?:^|\.)mtp\.(?:layers|layer)\.(\d+)\.")  # Qwen3-Next: mtp.layers.0 after the last block
_NORM = re.compile(
    r"(?:^|_)(?:layernorm|layer_norm|norm|rmsnorm|ln)(?:_?\d|_f|_attn|_mlp)?$|^ln_\w+$|^layernorm$|^[eh]norm$|norm_f$",
    re.IGNORECASE,
)

# Projection names (last component, lower-cased) -> kind; context-dependent names handled below.
_PROJECTIONS: dict[str, str] = {
    **dict.fromkeys(["q_proj", "query", "wq", "attn_q", "q_b_proj"], "q"),
    **dict.fromkeys(["k_proj", "key", "wk", "attn_k"], "k"),
    **dict.fromkeys(["v_proj", "value", "wv", "attn_v"], "v"),
    **dict.fromkeys(["o_proj", "out_proj", "attn_out", "wo", "attn_output"], "o"),
    **dict.fromkeys(["query_key_value", "c_attn", "qkv_proj", "att_proj", "wqkv", "w_pack", "attn_qkv"], "qkv"),
    # MLA (DeepSeek-V2/V3 modeling_deepseek_v3.py): q_a_proj = d -> q_lora_rank; kv_a_proj_with_mqa = d ->
    # [kv_lora_rank latent | qk_rope_head_dim shared rope key] (views.py cuts the rope key off as k_rope).
    "q_a_proj": "q_a",
    "kv_a_proj_with_mqa": "kv_a",
    **dict.fromkeys(["gate_proj", "ffn_gate", "ffn_gate_exps"], "gate"),
    **dict.fromkeys(["up_proj", "ffn_up", "ffn_up_exps"], "up"),
    **dict.fromkeys(["down_proj", "ffn_down", "ffn_down_exps"], "down"),
    **dict.fromkeys(["dense_h_to_4h", "c_fc", "fc1", "ff_proj", "gate_up_proj", "fc_in", "w_in"], "ffn_in"),
    **dict.fromkeys(["dense_4h_to_h", "fc2", "fc_out", "w_out"], "ffn_out"),
    **dict.fromkeys(
        [
            "embed_tokens",
            "word_embeddings",
            "wte",
            "wpe",
            "embed_in",
            "tok_embeddings",
            "token_embd",
            "position_embeddings",
            "token_type_embeddings",
            "embed_positions",
            "shared",
            "embeddings",  # Nemotron-H backbone.embeddings
        ],
        "embed",
    ),
    **dict.fromkeys(["lm_head", "embed_out"], "unembed"),
}
_ATTENTION_PARENTS = ("attention", "self_attention", "self_attn", "attn")
_SWIGLU_W = {"w1": "gate", "w3": "up", "w2": "down"}  # Mixtral experts, Llama-native feed_forward
_ROUTERS = {"router", "shared_expert_gate", "ffn_gate_inp"}
_ROUTER_PARENTS = ("block_sparse_moe", "mlp", "moe", "mixer", "feed_forward")  # `<parent>.gate` is a router
_QWEN1_MLP = {"w1": "up", "w2": "gate", "c_proj": "down"}  # Qwen-1: c_proj(w1(x) * silu(w2(x)))
ROUTER_NOTE = "MoE router"
SHARED_NOTE = "shared expert"

# Mamba mixers (Jamba modeling_jamba.py JambaMambaMixer: in_proj, x_proj, dt_proj, out_proj; Mamba-2 in
# Falcon-H1, Nemotron-H, Granite-4.0-H: in_proj, out_proj) live under these parents; Qwen3-Next's gated
# DeltaNet (modeling_qwen3_next.py Qwen3NextGatedDeltaNet) under linear_attn. Qwen3.5 splits in_proj_qkvz
# into in_proj_qkv + in_proj_z and in_proj_ba into in_proj_b + in_proj_a.
_SSM_PARENTS = ("mamba", "mixer", "ssm")
_LINEAR_ATTENTION_PARENTS = ("linear_attn",)
_SSM_PROJECTIONS = {"in_proj": "ssm_in", "x_proj": "ssm_x", "dt_proj": "ssm_dt", "out_proj": "ssm_out"}
_LINEAR_ATTENTION_PROJECTIONS = {
    **dict.fromkeys(["in_proj_qkvz", "in_proj_qkv", "in_proj_z"], "lin_qkvz"),
    **dict.fromkeys(["in_proj_ba", "in_proj_b", "in_proj_a"], "lin_ba"),
    "out_proj": "lin_out",
}
# A mixer's parameters that are not projections: fitted as vectors, whatever their number of dimensions
# (Jamba's A_log is [d_inner, d_state], the convolutions [channels, 1, kernel]).
_SSM_PARAMS = {"A_log": "A_log", "D": "D", "dt_bias": "dt_bias"}

# Fused experts, stored as one tensor per layer (views.py cuts them per expert): Llama-4 and gpt-oss
# experts.gate_up_proj / down_proj (+ gpt-oss *_bias), Granite-MoE block_sparse_moe.input_linear /
# output_linear (3-D), DBRX experts.mlp.w1 / v1 / w2 ([E * f, d]), llama.cpp ffn_*_exps (3-D).
_FUSED_EXPERTS = ("gate_up_proj", "down_proj", "gate_proj", "up_proj", "input_linear", "output_linear")
_FUSED_EXPERT_BIASES = ("gate_up_proj_bias", "down_proj_bias")
_DBRX_EXPERTS = ("w1", "v1", "w2")
_GGUF_EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
FUSED_EXPERTS_NOTE = "fused experts"

# Granite's MLP (modeling_granitemoehybrid.py GraniteMoeHybridMLP): input_linear = [gate | up] (chunk(2), the
# first half activated), output_linear = down; under block_sparse_moe 3-D per expert, under shared_mlp 2-D.
_GRANITE_MLP = {"input_linear": "ffn_in", "output_linear": "down"}


CONV1D_NOTE = "Conv1D: stored transposed (in, out)"
# Families that store c_attn / c_fc / c_proj as GPT-2's Conv1D (in, out); gpt_bigcode and Qwen-1 use
# the same names for ordinary Linear layers (out, in). Unknown family with these names: assume GPT-2.
_CONV1D_FAMILIES = {None, "gpt2", "openai-gpt", "imagegpt", "decision_transformer"}


def _projection_kind(
    stem: str, in_block: bool, in_expert: bool = False, family: str | None = None
) -> tuple[str | None, str | None]:
    """Kind (and a note) for a projection stem such as 'self_attn.q_proj' or 'attn.c_proj'."""
    parts = stem.lower().split(".")
    last = parts[-1]
    parent = parts[-2] if len(parts) > 1 else ""
    conv1d = CONV1D_NOTE if family in _CONV1D_FAMILIES else None
    if parent in _SSM_PARENTS and last in _SSM_PROJECTIONS:  # before out_proj -> o
        return _SSM_PROJECTIONS[last], None
    if parent in _LINEAR_ATTENTION_PARENTS and last in _LINEAR_ATTENTION_PROJECTIONS:
        return _LINEAR_ATTENTION_PROJECTIONS[last], None
    if "router" in parts[:-1] or last in _ROUTERS or (last == "gate" and parent in _ROUTER_PARENTS):
        return "router", ROUTER_NOTE  # DBRX/Granite router.layer, Qwen-MoE mlp.gate; not gate_proj
    if last in _GRANITE_MLP and parent in ("shared_mlp", "mlp", "block_sparse_moe"):
        return _GRANITE_MLP[last], None
    if last in _PROJECTIONS:
        kind = _PROJECTIONS[last]
        if (kind == "qkv" and last == "c_attn") or (kind == "ffn_in" and last == "c_fc"):
            return kind, conv1d
        if last in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa"):
            return kind, "MLA low-rank projection"
        return kind, None
    if family == "qwen" and parent == "mlp" and last in _QWEN1_MLP:
        return _QWEN1_MLP[last], None
    if last == "c_proj":  # GPT-2 style: attention output or FFN output by its parent
        return ("o" if parent in _ATTENTION_PARENTS else "ffn_out"), conv1d
    if last == "dense":
        if parent in _ATTENTION_PARENTS:  # GPT-NeoX attention.dense, BLOOM/Falcon self_attention.dense
            return "o", None
        if parent == "output":  # BERT: attention.output.dense vs (layer).output.dense
            return ("o" if len(parts) > 2 and parts[-3] in _ATTENTION_PARENTS else "ffn_out"), None
        if parent == "intermediate":
            return "ffn_in", None
    if last == "ff_out":  # OLMo native: inside a block the FFN output, at top level the unembedding
        return ("ffn_out" if in_block else "unembed"), None
    if last in _SWIGLU_W and (in_expert or parent in ("feed_forward", "mlp")):
        return _SWIGLU_W[last], None
    if last == "output" and not in_block:
        return "unembed", None  # llama.cpp 'output.weight'
    if last == "decoder" and "predictions" in parts:
        return "unembed", None  # BERT MLM head
    return None, None


# Families whose `post_attention_layernorm` normalises the attention output (not the FFN input).
_TRUE_POST_ATTN = {"olmo2", "gemma2", "gemma3", "gemma3_text"}


def _norm_site(stem: str, block: int | None, n_layers: int | None, family: str | None) -> str:
    low = stem.lower()
    parts = low.split(".")
    last = parts[-1]
    if (
        "mtp" in low
        or last in ("enorm", "hnorm")
        or "shared_head" in low
        or (block is not None and n_layers is not None and block >= n_layers)
    ):
        return "mtp"
    if block is None:
        return "embed" if "embed" in low else "final"
    if any(p in _SSM_PARENTS or p in _LINEAR_ATTENTION_PARENTS for p in parts[:-1]):
        return "ssm"  # a mixer's own norms: Mamba-2's gated norm, Jamba's dt/B/C norms, DeltaNet's output norm
    if "post_attention_layernorm" in low:
        return "post_attn" if family in _TRUE_POST_ATTN else "ffn"
    for key, site in (
        ("norm_attn_norm.norm_1", "attn"),  # DBRX (before "attn_norm", which its module name holds)
        ("norm_attn_norm.norm_2", "ffn"),
        ("q_a_layernorm", "latent"),  # MLA: the norms of the compressed query and key/value
        ("kv_a_layernorm", "latent"),
        ("q_norm", "q_norm"),
        ("k_norm", "k_norm"),
        ("q_layernorm", "q_norm"),
        ("k_layernorm", "k_norm"),
        ("post_feedforward_layernorm", "post_ffn"),
        ("post_attention_norm", "post_attn"),  # llama.cpp names (Gemma-2/3)
        ("post_ffw_norm", "post_ffn"),
        ("pre_feedforward_layernorm", "ffn"),
        ("pre_ff_layernorm", "ffn"),  # Jamba, Falcon-H1
        ("attention.output.layernorm", "post_attn"),
        ("output.layernorm", "post_ffn"),
        ("input_layernorm", "attn"),
        ("ln_1", "attn"),
        ("ln_2", "ffn"),
        ("attn_norm", "attn"),
        ("ff_norm", "ffn"),
        ("ffn_norm", "ffn"),
        ("self_attn_layer_norm", "attn"),
        ("final_layer_norm", "ffn"),
        ("ln_attn", "attn"),
        ("ln_mlp", "ffn"),
    ):
        if key in low:
            return site
    return "other"


def _param_of(local: str) -> tuple[str, str]:
    """(param, stem) of a name's local part: '.weight'/'.bias' suffixes, gpt-oss '*_proj_bias', else a buffer."""
    for suffix in (".weight", ".bias"):
        if local.endswith(suffix):
            return suffix[1:], local[: -len(suffix)]
    last = local.rsplit(".", 1)[-1]
    if last.endswith("_bias") or last == "bias":
        return "bias", local
    if last.endswith("weight"):
        return "weight", local
    return "buffer", local


def classify_tensor(
    name: str,
    shape: tuple[int, ...],
    n_layers: int | None = None,
    family: str | None = None,
    n_experts: int | None = None,
) -> TensorRole:
    """Role of a tensor from its name and shape (`n_layers` and `family` refine norm sites and MTP blocks;
    `n_experts` tells Granite's shared_mlp is a shared expert)."""
    match = _BLOCK.search(name)
    block = int(match.group(1)) if match else None
    mtp = _MTP_BLOCK.search(name)
    if mtp and n_layers is not None:  # Qwen3-Next numbers its MTP layers from 0: they follow the last block
        block = n_layers + int(mtp.group(1))
    expert_match = _EXPERT.search(name)
    expert = int(expert_match.group(1)) if expert_match else None
    local = name[match.end() :] if match else name
    if expert_match and expert_match.end() > (match.end() if match else 0):
        local = name[expert_match.end() :]
    param, stem = _param_of(local)
    shared = "shared_expert" in name and "shared_expert_gate" not in name
    shared = shared or (n_experts is not None and ".shared_mlp." in name)
    shared_note = SHARED_NOTE if shared else None
    parts = stem.split(".")
    last, parent = parts[-1], (parts[-2].lower() if len(parts) > 1 else "")
    ndim = len(shape)
    towers = list(_TOWER.finditer(name))
    if towers:  # a vision/audio encoder beside the language model: listed, never mixed into its kinds
        inner = classify_tensor(name[towers[-1].end() :], shape)  # what it does inside the tower
        tower = towers[0].group(1)
        return TensorRole(
            "other",
            block,
            expert,
            param,
            note=f"{tower} (not the language model)",
            tower=tower,
            tower_kind=inner.tower_kind
            or (inner.kind if inner.kind != "other" else _tower_kind(name[towers[-1].end() :])),
        )
    mixer = parent in _SSM_PARENTS or parent in _LINEAR_ATTENTION_PARENTS
    if mixer and last in _SSM_PARAMS:
        return TensorRole("ssm_param", block, expert, _SSM_PARAMS[last])
    if mixer and last == "conv1d":
        return TensorRole("ssm_param", block, expert, "conv_bias" if param == "bias" else "conv_weight")
    if _NORM.search(last) and ndim <= 1:
        site = _norm_site(stem if match is None else name, block, n_layers, family)
        return TensorRole("norm", block, expert, param, site=site)
    low_last = last.lower()
    fused = expert is None and (
        (low_last in _FUSED_EXPERTS and parent == "experts" and ndim == 3)
        or (low_last in ("input_linear", "output_linear") and parent == "block_sparse_moe" and ndim == 3)
        or (low_last in _DBRX_EXPERTS and stem.lower().endswith(f"experts.mlp.{low_last}") and ndim == 2)
        or (low_last in _GGUF_EXPERTS and ndim == 3)
    )
    if fused:  # one record per expert and kind (views.py); `other` only while not cut
        return TensorRole("other", block, None, "weight", note=FUSED_EXPERTS_NOTE, layout="experts")
    if low_last in _FUSED_EXPERT_BIASES and parent == "experts" and ndim == 2:
        return TensorRole("other", block, None, "bias", note=FUSED_EXPERTS_NOTE, layout="experts")
    if low_last == "e_score_correction_bias":  # DeepSeek-V3's router bias (mlp.gate.e_score_correction_bias)
        return TensorRole("bias", block, expert, "bias", of_kind="router", note=ROUTER_NOTE)
    if low_last in ("eh_proj", "fc") and ("mtp" in name or "eh_proj" in name) and ndim == 2:
        # DeepSeek-V3 layers.N.eh_proj, Qwen3-Next mtp.fc: the MTP layer's [embedding | hidden] -> d projection
        return TensorRole("mtp_proj", block, expert, param)
    if low_last == "head" and parent == "shared_head" and ndim == 2:  # DeepSeek-V3 MTP's own output head
        return TensorRole("unembed", block, expert, param, note="MTP head")
    if low_last == "sinks" and parent in _ATTENTION_PARENTS:  # gpt-oss: one learned logit per head
        return TensorRole("other", block, expert, "weight", note="attention sinks")
    kind, note = _projection_kind(stem, match is not None, expert is not None, family)
    note = note or shared_note
    if kind is None and low_last == "kv_b_proj" and ndim == 2:  # MLA: [k_nope | v] per head; views.py cuts it
        return TensorRole("other", block, expert, param, note="MLA key/value up-projection", layout="mla")
    if param == "bias" and ndim == 1:
        return TensorRole("bias", block, expert, "bias", of_kind=kind or "other", note=note)
    if ndim >= 2 and param != "buffer":
        if kind is None:
            return TensorRole("other", block, expert, param, note=note)
        if ndim > 2:
            note = f"{ndim}-D tensor fitted whole" + (f"; {note}" if note else "")
        return TensorRole(kind, block, expert, param, note=note)
    return TensorRole("other", block, expert, param if ndim else "buffer", note=note or "buffer or scalar")


def _tower_kind(stem: str) -> str:
    """Tower names the language model's table does not know: Qwen2.5-VL attn.qkv / attn.proj, patch embeddings."""
    parts = _param_of(stem)[1].lower().split(".")
    last, parent = parts[-1], (parts[-2] if len(parts) > 1 else "")
    if last == "qkv" and parent in _ATTENTION_PARENTS:
        return "qkv"
    if last == "proj" and parent in _ATTENTION_PARENTS:
        return "o"
    if "patch" in stem.lower() or "embed" in stem.lower():
        return "embed"
    return "other"


# --- architecture ------------------------------------------------------------------------------

_POST_LN_FAMILIES = {
    "bert",
    "roberta",
    "xlm-roberta",
    "electra",
    "distilbert",
    "albert",
    "camembert",
    "mpnet",
}
_GEMMA_FAMILIES = {"gemma", "gemma2", "gemma3", "gemma3_text", "recurrent_gemma"}


MAX_CONFIG_COUNT = 1 << 40  # above any real layer, head, width or vocabulary count


def _count(config: dict[str, Any], *keys: str, notes: list[str] | None = None) -> int | None:
    """The first of `keys` holding a positive integer; hand-edited configs with strings, floats or
    nulls in these fields are read as if the field were absent rather than failing later. Numbers
    that cannot be a count (negative, fractional, 1e308, Infinity, 10**30) are ignored too, with a
    note, so that no later arithmetic on them overflows."""
    for key in keys:
        given = value = config.get(key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONFIG_COUNT:
            return value
        if isinstance(given, (int, float)) and not isinstance(given, bool) and given != 0 and notes is not None:
            notes.append(f"config {key}={_short(given)} ignored: not a positive integer up to 2^40")
    return None


def _short(value: float) -> str:
    # 10**300 as an int would fill the note; its float form is enough to recognise it.
    if isinstance(value, float):
        return f"{value:.6g}"
    if abs(value) < 10**12:
        return str(value)
    return f"{'-' if value < 0 else ''}~2^{abs(value).bit_length() - 1}"  # str() of a huge int may raise


@dataclass
class ArchInfo:
    family: str | None = None  # config model_type, or inferred from tensor names
    architectures: list[str] = field(default_factory=list)
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    ffn_size: int | None = None
    vocab_size: int | None = None
    n_experts: int | None = None
    norm_type: str | None = None  # layernorm | rmsnorm
    norm_placement: str | None = None  # pre | post | peri (pre and post)
    norm_offset: float = 0.0  # Gemma stores gamma - 1
    tied_embeddings: bool | None = None
    qk_norm: bool | None = None
    fused_qkv: bool | None = None
    ffn_type: str | None = None  # gated (gate/up/down) | plain (in/out)
    conv1d: bool = False  # GPT-2 Conv1D: matrices stored (in, out)
    swiglu_fused_order: str | None = None  # for a fused FFN-in: "gate,up" or "up,gate"
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): ranks of the compressed query and key/value, and
    # the per-head widths of the content ("nope") and rotary parts of q/k and of v.
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    sources: list[str] = field(default_factory=list)  # where the facts came from

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def arch_from_config(config: dict[str, Any] | None, notes: list[str] | None = None) -> ArchInfo:
    """What config.json says about the architecture; fields that cannot be used add a line to `notes`."""
    info = ArchInfo()
    if not config:
        return info
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    cfg = {**config, **text} if text else config  # multimodal configs nest the language model
    for nested in ("attn_config", "ffn_config"):  # DBRX nests attention and FFN sizes
        if isinstance(cfg.get(nested), dict):
            cfg = {**cfg[nested], **cfg}
    # gguf.hf_config marks the config it builds from GGUF metadata; no config.json was read then.
    info.sources.append("GGUF metadata" if "gguf_architecture" in config else "config.json")
    info.family = cfg["model_type"] if isinstance(cfg.get("model_type"), str) else None
    arches = config.get("architectures")
    info.architectures = [a for a in arches if isinstance(a, str)] if isinstance(arches, list) else []
    info.n_layers = _count(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers", notes=notes)
    info.d_model = _count(cfg, "hidden_size", "n_embd", "d_model", "dim", notes=notes)
    info.n_heads = _count(cfg, "num_attention_heads", "n_head", "n_heads", "num_heads", notes=notes)
    info.n_kv_heads = _count(cfg, "num_key_value_heads", "n_kv_heads", "num_kv_heads", "kv_n_heads", notes=notes)
    if info.n_kv_heads is None and cfg.get("multi_query"):
        info.n_kv_heads = 1
    if info.n_kv_heads is None and info.n_heads is not None:
        info.n_kv_heads = info.n_heads
    info.head_dim = _count(cfg, "head_dim", notes=notes)
    if info.head_dim is None and info.d_model and info.n_heads:
        info.head_dim = info.d_model // info.n_heads
    ffn = _count(cfg, "intermediate_size", "n_inner", "ffn_hidden_size", "mlp_hidden_size", "ffn_dim", notes=notes)
    ratio = cfg.get("mlp_ratio")
    if ffn is None and info.d_model and isinstance(ratio, (int, float)) and not isinstance(ratio, bool):
        ffn = int(ratio * info.d_model) if 0 < ratio <= 1000 else None  # 1e308 x d_model is inf: int() overflows
        if ffn is None or not 0 < ffn <= MAX_CONFIG_COUNT:
            ffn = None
            if notes is not None:
                notes.append(f"config mlp_ratio={_short(ratio)} ignored: not a ratio between 0 and 1000")
    if ffn is None and info.d_model and info.family == "gpt2":
        ffn = 4 * info.d_model
    info.ffn_size = ffn
    info.vocab_size = _count(cfg, "vocab_size", notes=notes)
    info.n_experts = _count(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", notes=notes)
    for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        setattr(info, key, _count(cfg, key, notes=notes))

    if "rms_norm_eps" in cfg or cfg.get("layer_norm_type") == "rms" or str(cfg.get("norm_type", "")).startswith("rms"):
        info.norm_type = "rmsnorm"
    elif any(k in cfg for k in ("layer_norm_eps", "layer_norm_epsilon", "layernorm_epsilon")):
        info.norm_type = "layernorm"
    if info.family in _POST_LN_FAMILIES:
        info.norm_placement = "post"
    elif info.family in ("olmo2",):
        info.norm_placement = "post"  # OLMo-2 normalises sublayer outputs (reordered norm)
    elif info.family in _GEMMA_FAMILIES - {"gemma"}:
        info.norm_placement = "peri"
    elif info.family:
        info.norm_placement = "pre"
    if info.family in _GEMMA_FAMILIES:
        info.norm_offset = 1.0
    tie = config.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))
    if tie is None and "weight_tying" in cfg:
        tie = cfg["weight_tying"]  # OLMo native
    info.tied_embeddings = tie if isinstance(tie, bool) else None
    if info.family in ("hf_olmo", "olmo") and str(cfg.get("activation_type", "")).lower() == "swiglu":
        info.swiglu_fused_order = "up,gate"  # OLMo native ff_proj: x, x_gate = chunk(2)
        if info.ffn_size and "intermediate_size" not in cfg:
            info.ffn_size //= 2  # native mlp_hidden_size counts both halves of ff_proj
    if info.family in ("phi3",) or info.family in _GRANITE_FAMILIES:
        info.swiglu_fused_order = "gate,up"  # Phi-3 gate_up_proj, Granite shared_mlp.input_linear: chunk(2)
    return info


_GRANITE_FAMILIES = {"granitemoe", "granitemoeshared", "granitemoehybrid"}


def complete_arch(info: ArchInfo, tensors: Iterable[tuple[str, tuple[int, ...]]]) -> ArchInfo:
    """Fill what the config does not say from the tensor names and shapes."""
    tensors = list(tensors)
    if info.n_layers is None:  # MTP layer numbers follow the last block: count the blocks first
        blocks = {int(m.group(1)) for n, _ in tensors if (m := _BLOCK.search(n)) and not _TOWER.search(n)}
        n_layers = max(blocks) + 1 if blocks else None
    else:
        n_layers = info.n_layers
    roles = [
        (name, shape, classify_tensor(name, shape, n_layers, info.family, info.n_experts)) for name, shape in tensors
    ]
    kinds = {r.kind for _, _, r in roles}
    names = " ".join(n for n, _, _ in roles)
    if info.family is None:
        info.family = _family_from_names(names)
        if info.family:
            info.sources.append("tensor names")
            if info.family in _POST_LN_FAMILIES:
                info.norm_placement = "post"
            elif info.norm_placement is None:
                info.norm_placement = "pre"
    if info.n_layers is None:
        info.n_layers = n_layers
    if info.d_model is None:
        for _, shape, role in roles:
            if role.kind == "embed" and len(shape) == 2:
                info.d_model = shape[1]
                break
    info.qk_norm = any(r.kind == "norm" and r.site in ("q_norm", "k_norm") for _, _, r in roles)
    info.fused_qkv = "qkv" in kinds
    fused_experts = any(r.layout == "experts" for _, _, r in roles)
    if info.ffn_type is None and (kinds & set(FFN_KINDS) or fused_experts):
        gated = bool(kinds & {"gate", "up"}) or info.swiglu_fused_order is not None or fused_experts
        info.ffn_type = "gated" if gated else "plain"
    if info.tied_embeddings and tied_head(roles):
        pass  # the config ties them and the head stored beside the embedding is a copy: fitted once (tied_head)
    elif info.tied_embeddings is None or ("unembed" in kinds and info.tied_embeddings):
        info.tied_embeddings = not any(r.kind == "unembed" and r.note is None for _, _, r in roles)
    if info.norm_type is None:
        has_beta = any(r.kind == "norm" and r.param == "bias" for _, _, r in roles)
        has_gamma = any(r.kind == "norm" and r.param == "weight" for _, _, r in roles)
        if has_gamma:
            info.norm_type = "layernorm" if has_beta else "rmsnorm"
    info.conv1d = any(r.note and CONV1D_NOTE in r.note for _, _, r in roles)
    return info


def tied_head(roles: Iterable[tuple[str, tuple[int, ...], TensorRole]]) -> dict[str, str]:
    """{head name: embedding name} for every language-model head stored with the same shape as the token
    embedding (a tied head saved twice, e.g. lm_head.weight beside embed_tokens.weight): with
    tie_word_embeddings true the model computes with the embedding, so the copy is not fitted again."""
    roles = list(roles)
    embeds = {tuple(shape): name for name, shape, r in roles if r.kind == "embed" and r.block is None}
    return {
        name: embeds[tuple(shape)]
        for name, shape, r in roles
        if r.kind == "unembed" and r.block is None and r.note is None and tuple(shape) in embeds
    }


def _family_from_names(names: str) -> str | None:
    for needle, family in (
        ("gpt_neox.", "gpt_neox"),
        ("block_sparse_moe", "mixtral"),
        ("attention.self.query", "bert"),
        ("attn.c_attn", "gpt2"),
        ("qkv_proj", "phi3"),
        ("att_proj", "hf_olmo"),
        ("blk.0.attn_q", "llama"),
        ("self_attn.q_proj", "llama"),
    ):
        if needle in names:
            return family
    return None


# --- fused tensors -----------------------------------------------------------------------------


def split_parts(
    role: TensorRole, name: str, shape: tuple[int, ...], arch: ArchInfo
) -> tuple[list[tuple[str, Segments]], str | None]:
    """Parts of a fused matrix as (kind, Segments), or ([], reason) when the split is ambiguous."""
    if len(shape) != 2 or role.param != "weight":
        return [], None
    rows, cols = shape
    last = name.rsplit(".", 2)[-2].lower() if name.endswith(".weight") else ""
    if role.kind == "qkv":
        return _split_qkv(last, rows, cols, arch)
    if role.kind == "ffn_in" and last in ("gate_up_proj", "ff_proj", "input_linear") and arch.swiglu_fused_order:
        if rows % 2:
            return [], f"{rows} rows cannot hold two equal gate/up halves"
        if arch.ffn_size and rows != 2 * arch.ffn_size and last != "input_linear":  # Granite: shared size
            return [], f"{rows} rows != 2 x intermediate size {arch.ffn_size}"
        half = rows // 2 * cols
        first, second = arch.swiglu_fused_order.split(",")
        return [(first, Segments(0, half, half, 1)), (second, Segments(half, half, half, 1))], None
    return [], None


# Families whose fused qkv rows are [q | k | v] in whole-head blocks; others (InternLM2, Falcon's grouped
# layout, ChatGLM-6B's per-head layout, unknown ones) interleave differently and are split only where the
# layout is known.
_CONTIGUOUS_QKV = {"phi3", "phimoe", "hf_olmo", "olmo", "mpt", "dbrx", "qwen"}


def _split_qkv(last: str, rows: int, cols: int, arch: ArchInfo) -> tuple[list[tuple[str, Segments]], str | None]:
    n_q, n_kv, hd = arch.n_heads, arch.n_kv_heads, arch.head_dim
    if not (n_q and n_kv and hd):
        return [], "config.json does not give head counts and head size"
    if last == "c_attn" and arch.family in _CONV1D_FAMILIES:  # GPT-2 Conv1D (d, 3d): columns [q | k | v]
        if cols != 3 * rows or n_q != n_kv:
            return [], f"unexpected c_attn shape ({rows}, {cols})"
        return [(kind, Segments(i * rows, rows, cols, rows)) for i, kind in enumerate("qkv")], None
    if last == "query_key_value" and arch.family in ("gpt_neox", "bloom"):
        # Rows interleaved per head: [h0: q k v][h1: q k v]...
        if rows != 3 * n_q * hd or n_q != n_kv:
            return [], f"{rows} rows != 3 x {n_q} heads x {hd}"
        run = hd * cols
        return [(kind, Segments(i * run, run, 3 * run, n_q)) for i, kind in enumerate("qkv")], None
    if last == "wqkv" and arch.family == "internlm2":
        # Rows grouped per KV head: [g0: q x (n_q/n_kv) | k | v][g1: ...]
        if n_q % n_kv or rows != (n_q + 2 * n_kv) * hd:
            return [], f"{rows} rows != ({n_q} q + 2 x {n_kv} kv heads) x {hd}"
        per_q = n_q // n_kv * hd * cols
        group = per_q + 2 * hd * cols
        starts = (("q", 0, per_q), ("k", per_q, hd * cols), ("v", per_q + hd * cols, hd * cols))
        return [(kind, Segments(start, size, group, n_kv)) for kind, start, size in starts], None
    fused_names = ("qkv_proj", "att_proj", "wqkv", "c_attn", "query_key_value")
    if last == "attn_qkv" or (last in fused_names and arch.family in _CONTIGUOUS_QKV):
        # rows [q | k | v], blocks of whole heads (llama.cpp's converter stores every attn_qkv this way)
        sizes = (n_q * hd, n_kv * hd, n_kv * hd)
        if rows != sum(sizes):
            return [], f"{rows} rows != q {sizes[0]} + k {sizes[1]} + v {sizes[2]}"
        parts, start = [], 0
        for kind, size in zip("qkv", sizes, strict=True):
            parts.append((kind, Segments(start * cols, size * cols, size * cols, 1)))
            start += size
        return parts, None
    return [], f"fused layout of {last!r} ({arch.family}) is not split"


def attention_architecture(arch: ArchInfo) -> str:
    """F7: MHA, GQA r:1, MQA, with 'fused qkv' when Q/K/V share one stored tensor."""
    if not arch.n_heads:
        return "unknown"
    n_kv = arch.n_kv_heads or arch.n_heads
    if n_kv == arch.n_heads:
        label = "MHA"
    elif n_kv == 1:
        label = "MQA"
    elif arch.n_heads % n_kv == 0:
        label = f"GQA {arch.n_heads // n_kv}:1"
    else:
        label = f"GQA {arch.n_heads}:{n_kv}"
    return label + (" (fused qkv)" if arch.fused_qkv else "")

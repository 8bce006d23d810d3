"""Architecture knowledge: tensor names -> (block, kind, class) and config.json -> ArchInfo.

Kinds: q, k, v, o, qkv (fused), gate, up, down, ffn_in, ffn_out, embed, unembed, norm, bias,
other. Classes follow the paper (Sec. 2.2): Selection = W_q, W_k and the fused W_qkv that
contains them; Transmission = W_o and the FFN (and W_v, grouped with them in the paper's Fig. 4).

Families covered by name: GPT-NeoX/Pythia, Llama/Mistral/Qwen2/2.5/3/OLMo-2/Gemma (HF names),
OLMo-1 (HF and native att_proj/attn_out/ff_proj/ff_out), BERT/RoBERTa, GPT-2 (Conv1D), Phi-2,
Phi-3 (qkv_proj, gate_up_proj), Mixtral and Qwen-MoE experts, OPT, BLOOM, Falcon, DeepSeek MTP
layers, and llama.cpp GGUF names. Anything else 2-D is fitted as `other` and listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .segments import Segments
from .vocabulary import FFN_KINDS, kind_class


@dataclass(frozen=True)
class TensorRole:
    kind: str
    block: int | None = None
    expert: int | None = None  # MoE expert index; None for dense and shared experts
    param: str = "weight"  # weight | bias | buffer
    of_kind: str | None = None  # for biases: the projection they belong to
    site: str | None = None  # for norms: attn | ffn | post_attn | post_ffn | q_norm | k_norm | embed | final | mtp
    note: str | None = None

    @property
    def cls(self) -> str:
        return kind_class(self.kind)


# --- name parsing --------------------------------------------------------------------------

_TOWER = re.compile(
    r"(?:^|\.)(vision_tower|vision_model|visual|vision_encoder|image_encoder|audio_tower|audio_encoder|"
    r"audio_model|mm_projector|multi_modal_projector|vision_embed_tokens)\."
)
_BLOCK = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block|blk)\.(\d+)\.")
_EXPERT = re.compile(r"(?:^|\.)experts\.(\d+)\.")
_NORM = re.compile(
    r"(?:^|_)(?:layernorm|layer_norm|norm|rmsnorm|ln)(?:_?\d|_f|_attn|_mlp)?$|^ln_\w+$|^layernorm$|^[eh]norm$|norm_f$",
    re.IGNORECASE,
)

# Projection names (last component, lower-cased) -> kind; context-dependent names handled below.
_PROJECTIONS: dict[str, str] = {
    **dict.fromkeys(["q_proj", "query", "wq", "attn_q", "q_a_proj", "q_b_proj"], "q"),
    **dict.fromkeys(["k_proj", "key", "wk", "attn_k"], "k"),
    **dict.fromkeys(["v_proj", "value", "wv", "attn_v"], "v"),
    **dict.fromkeys(["o_proj", "out_proj", "attn_out", "wo", "attn_output"], "o"),
    **dict.fromkeys(["query_key_value", "c_attn", "qkv_proj", "att_proj", "wqkv", "w_pack", "attn_qkv"], "qkv"),
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
        ],
        "embed",
    ),
    **dict.fromkeys(["lm_head", "embed_out"], "unembed"),
}
_ATTENTION_PARENTS = ("attention", "self_attention", "self_attn", "attn")
_SWIGLU_W = {"w1": "gate", "w3": "up", "w2": "down"}  # Mixtral experts, Llama-native feed_forward
_ROUTERS = {"router", "shared_expert_gate", "ffn_gate_inp"}
_QWEN1_MLP = {"w1": "up", "w2": "gate", "c_proj": "down"}  # Qwen-1: c_proj(w1(x) * silu(w2(x)))


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
    if last in _PROJECTIONS:
        kind = _PROJECTIONS[last]
        if (kind == "qkv" and last == "c_attn") or (kind == "ffn_in" and last == "c_fc"):
            return kind, conv1d
        if kind == "q" and last in ("q_a_proj", "q_b_proj"):
            return kind, "MLA low-rank query projection"
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
    if last in _ROUTERS or (last == "gate" and parent in ("block_sparse_moe", "mlp", "moe")):  # not gate_proj
        return None, "MoE router"
    if last == "output" and not in_block:
        return "unembed", None  # llama.cpp 'output.weight'
    if last == "decoder" and "predictions" in parts:
        return "unembed", None  # BERT MLM head
    return None, None


# Families whose `post_attention_layernorm` normalises the attention output (not the FFN input).
_TRUE_POST_ATTN = {"olmo2", "gemma2", "gemma3", "gemma3_text"}


def _norm_site(stem: str, block: int | None, n_layers: int | None, family: str | None) -> str:
    low = stem.lower()
    last = low.split(".")[-1]
    if (
        "mtp" in low
        or last in ("enorm", "hnorm")
        or "shared_head" in low
        or (block is not None and n_layers is not None and block >= n_layers)
    ):
        return "mtp"
    if block is None:
        return "embed" if "embed" in low else "final"
    if "post_attention_layernorm" in low:
        return "post_attn" if family in _TRUE_POST_ATTN else "ffn"
    for key, site in (
        ("q_norm", "q_norm"),
        ("k_norm", "k_norm"),
        ("q_layernorm", "q_norm"),
        ("k_layernorm", "k_norm"),
        ("post_feedforward_layernorm", "post_ffn"),
        ("post_attention_norm", "post_attn"),  # llama.cpp names (Gemma-2/3)
        ("post_ffw_norm", "post_ffn"),
        ("pre_feedforward_layernorm", "ffn"),
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


def classify_tensor(
    name: str, shape: tuple[int, ...], n_layers: int | None = None, family: str | None = None
) -> TensorRole:
    """Role of a tensor from its name and shape (`n_layers` and `family` refine norm sites)."""
    match = _BLOCK.search(name)
    block = int(match.group(1)) if match else None
    expert_match = _EXPERT.search(name)
    expert = int(expert_match.group(1)) if expert_match else None
    local = name[match.end() :] if match else name
    if expert_match and expert_match.end() > (match.end() if match else 0):
        local = name[expert_match.end() :]
    param = "weight"
    stem = local
    for suffix in (".weight", ".bias"):
        if local.endswith(suffix):
            param, stem = suffix[1:], local[: -len(suffix)]
            break
    else:
        if not local.endswith(("weight", "bias")):
            param = "buffer"
    shared_note = "shared expert" if "shared_expert" in name and "shared_expert_gate" not in name else None
    last = stem.split(".")[-1]
    ndim = len(shape)
    tower = _TOWER.search(name)
    if tower:  # a vision/audio encoder beside the language model: listed, never mixed into its kinds
        return TensorRole("other", block, expert, param, note=f"{tower.group(1)} (not the language model)")
    if _NORM.search(last) and ndim <= 1:
        site = _norm_site(stem if match is None else name, block, n_layers, family)
        return TensorRole("norm", block, expert, param, site=site)
    kind, note = _projection_kind(stem, match is not None, expert is not None, family)
    note = note or shared_note
    if param == "bias" and ndim == 1:
        return TensorRole("bias", block, expert, "bias", of_kind=kind or "other", note=note)
    if ndim >= 2 and param != "buffer":
        if kind is None:
            return TensorRole("other", block, expert, param, note=note)
        if ndim > 2:
            note = f"{ndim}-D tensor fitted whole" + (f"; {note}" if note else "")
        return TensorRole(kind, block, expert, param, note=note)
    return TensorRole("other", block, expert, param if ndim else "buffer", note=note or "buffer or scalar")


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
    # gguf.hf_config marks the config it builds from GGUF metadata; no config.json was read then.
    info.sources.append("GGUF metadata" if "gguf_architecture" in config else "config.json")
    info.family = cfg["model_type"] if isinstance(cfg.get("model_type"), str) else None
    arches = config.get("architectures")
    info.architectures = [a for a in arches if isinstance(a, str)] if isinstance(arches, list) else []
    info.n_layers = _count(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers", notes=notes)
    info.d_model = _count(cfg, "hidden_size", "n_embd", "d_model", "dim", notes=notes)
    info.n_heads = _count(cfg, "num_attention_heads", "n_head", "n_heads", "num_heads", notes=notes)
    info.n_kv_heads = _count(cfg, "num_key_value_heads", "n_kv_heads", "num_kv_heads", notes=notes)
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
    info.n_experts = _count(cfg, "num_local_experts", "num_experts", "n_routed_experts", notes=notes)
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
    if info.family in ("phi3",):
        info.swiglu_fused_order = "gate,up"
    return info


def complete_arch(info: ArchInfo, tensors: Iterable[tuple[str, tuple[int, ...]]]) -> ArchInfo:
    """Fill what the config does not say from the tensor names and shapes."""
    roles = [(name, shape, classify_tensor(name, shape, info.n_layers, info.family)) for name, shape in tensors]
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
    blocks = {r.block for _, _, r in roles if r.block is not None}
    if info.n_layers is None and blocks:
        info.n_layers = max(blocks) + 1
    if info.d_model is None:
        for _, shape, role in roles:
            if role.kind == "embed" and len(shape) == 2:
                info.d_model = shape[1]
                break
    info.qk_norm = any(r.kind == "norm" and r.site in ("q_norm", "k_norm") for _, _, r in roles)
    info.fused_qkv = "qkv" in kinds
    if info.ffn_type is None and kinds & set(FFN_KINDS):
        gated = bool(kinds & {"gate", "up"}) or info.swiglu_fused_order is not None
        info.ffn_type = "gated" if gated else "plain"
    if info.tied_embeddings is None or ("unembed" in kinds and info.tied_embeddings):
        info.tied_embeddings = "unembed" not in kinds
    if info.norm_type is None:
        has_beta = any(r.kind == "norm" and r.param == "bias" for _, _, r in roles)
        has_gamma = any(r.kind == "norm" and r.param == "weight" for _, _, r in roles)
        if has_gamma:
            info.norm_type = "layernorm" if has_beta else "rmsnorm"
    info.conv1d = any(r.note and CONV1D_NOTE in r.note for _, _, r in roles)
    return info


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
    if role.kind == "ffn_in" and last in ("gate_up_proj", "ff_proj") and arch.swiglu_fused_order:
        if rows % 2:
            return [], f"{rows} rows cannot hold two equal gate/up halves"
        if arch.ffn_size and rows != 2 * arch.ffn_size:
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

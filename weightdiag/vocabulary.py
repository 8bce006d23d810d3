"""The words every stage shares: tensor kinds, their classes and order, and the cohort's trim.

A *kind* is what a weight matrix does in a block, whatever the family calls it (layout.py maps
names to kinds). The Weibull paper (arXiv 2605.18898, Sec. 2.2) reads k on two axes: Selection
matrices (queries and keys: they decide where attention goes) and Transmission matrices (values,
outputs and the FFN: they carry the signal). Fused matrices (GPT-NeoX qkv, fused gate/up) are split
into parts named `kind[part]`.
"""

from __future__ import annotations

# Multi-head latent attention (DeepSeek-V2/V3/R1, Kimi-K2): q_a and kv_a are the low-rank down-projections
# of the queries and of the keys and values; q/k are the heads' content ("nope") rows, q_rope/k_rope their
# rotary rows (k_rope is one key shared by every head), v the value rows (layout/views.py cuts them).
MLA_KINDS = ("q_a", "kv_a", "q_rope", "k_rope")
# State-space and linear-attention mixers (Jamba, Falcon-H1, Nemotron-H, Granite-4.0-H: Mamba; Qwen3-Next:
# gated DeltaNet). Their projections are neither of the paper's classes (below): class "recurrent".
SSM_KINDS = ("ssm_in", "ssm_x", "ssm_dt", "ssm_out")
LINEAR_ATTENTION_KINDS = ("lin_qkvz", "lin_ba", "lin_out")
RECURRENT_KINDS = (*SSM_KINDS, *LINEAR_ATTENTION_KINDS)
MATRIX_KINDS = (
    "q",
    "k",
    "v",
    "o",
    "qkv",
    *MLA_KINDS,
    "attn_gate",  # Qwen3-Next's per-head output gate, cut from its q_proj
    *RECURRENT_KINDS,
    "gate",
    "up",
    "down",
    "ffn_in",
    "ffn_out",
    "router",  # MoE routers (their note says "MoE router")
    "mtp_proj",  # a multi-token-prediction layer's [embedding | hidden] projection (DeepSeek eh_proj, Qwen3-Next fc)
    "embed",
    "unembed",
    "other",
)
# Every tensor, vectors included: `ssm_param` is a mixer's A_log, D, dt_bias or convolution (fitted as a
# vector whatever its number of dimensions, never as a projection).
KINDS = (*MATRIX_KINDS[:-1], "norm", "bias", "ssm_param", "other")
# The Weibull paper (arXiv 2605.18898, Sec. 2.2) defines Selection as the attention input projections W_q
# and W_k (sparse softmax attention needs selective Q/K) and counts Pythia's fused W_qkv in it because it
# holds them; MLA's factors of W_q and W_k (q_a, the rope rows) are Selection by the same definition, and
# kv_a, which holds the keys' compression beside the values', by the W_qkv precedent. Transmission is the
# OV circuit and the FFN, "which transmit information without gating" (W_v, W_o, FFN).
# Left out of both on purpose: the SSM and linear-attention projections (no softmax selection, never
# measured by the paper or its cohort: a class verdict would have no band to read against), Qwen3-Next's
# attention output gate (a sigmoid gate on the OV path: the paper's OV circuit has none, and no measurement
# places it), routers, embeddings.
SELECTION_KINDS = frozenset({"q", "k", "qkv", *MLA_KINDS})
TRANSMISSION_KINDS = frozenset({"v", "o", "gate", "up", "down", "ffn_in", "ffn_out"})
FFN_KINDS = ("gate", "up", "down", "ffn_in", "ffn_out")
WEIGHT_KINDS = ("q", "k", "v", "o", "qkv", *MLA_KINDS, *FFN_KINDS)  # the block matrices k is read on

# Display order of kinds and of fused parts: attention first, then the mixers, then the FFN, then the rest.
# A model has either ffn_in/ffn_out or gate/up/down (Phi-3: fused ffn_in with down), never both, so the
# order of the two FFN groups never meets. BLOCK_KEYS are the matrices the block-by-block health check reads:
# a kind is compared with the same kind in the other blocks, so the recurrent kinds and the attention gate
# are in (a Jamba block's Mamba projections against the other blocks' ones) though no class verdict reads them.
BLOCK_KEYS = (
    "qkv",
    "qkv[q]",
    "qkv[k]",
    "qkv[v]",
    "q_a",
    "q",
    "q_rope",
    "kv_a",
    "k",
    "k_rope",
    "v",
    "attn_gate",
    "o",
    *RECURRENT_KINDS,
    "ffn_in",
    "ffn_in[gate]",
    "ffn_in[up]",
    "ffn_out",
    "gate",
    "up",
    "down",
)
KIND_ORDER = (*BLOCK_KEYS, "router", "mtp_proj", "embed", "unembed", "other")
SELECTION_KEYS = frozenset({*SELECTION_KINDS, "qkv[q]", "qkv[k]"})  # kinds and fused parts
FFN_KEYS = frozenset({*FFN_KINDS, "ffn_in[gate]", "ffn_in[up]"})

# The two sides of the FFN: its inputs read the residual stream, its outputs (and W_o, and the mixers'
# output projections) write to it; every other matrix (q/k/v, embeddings) reads from it.
FFN_INPUT_KINDS = ("gate", "up", "ffn_in")
FFN_OUTPUT_KINDS = ("down", "ffn_out")
RESIDUAL_WRITERS = frozenset({"o", "ssm_out", "lin_out", *FFN_OUTPUT_KINDS})
# The Transmission kinds whose lambda the paper averages for its scaling fit (Sec. 5.4): Pythia's
# GELU FFN, and the SwiGLU one.
PYTHIA_LAMBDA_KINDS = ("o", "ffn_in", "ffn_out")
SWIGLU_LAMBDA_KINDS = ("o", "gate", "up", "down")

# The trim of the cohort database (DATABASE_v9_1) and of every comparison with it: the middle 80%
# of the probability plot (the paper's protocol, App. A.1).
COHORT_TRIM = "mid80"
# The trims a fit stores (the middle fraction of the probability plot fitted), and the fitting protocols: plain
# words of the options, here so that reading them (the command line's defaults) imports no numerics.
TRIMS: dict[str, float] = {"mid80": 0.80, "mid90": 0.90, "full": 1.00}
PROTOCOLS = ("hist1024", "exact")


def kind_order(kind: str) -> int:
    """Sort key of a kind or fused part (unknown ones last)."""
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def kind_class(kind: str) -> str:
    """selection, transmission, recurrent (SSM and linear-attention mixers), embedding or other."""
    if kind in SELECTION_KINDS:
        return "selection"
    if kind in TRANSMISSION_KINDS:
        return "transmission"
    if kind in RECURRENT_KINDS:
        return "recurrent"
    if kind in ("embed", "unembed"):
        return "embedding"
    return "other"

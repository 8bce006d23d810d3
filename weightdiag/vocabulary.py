"""The words every stage shares: tensor kinds, their classes and order, and the cohort's trim.

A *kind* is what a weight matrix does in a block, whatever the family calls it (layout.py maps
names to kinds). The Weibull paper (arXiv 2605.18898, Sec. 2.2) reads k on two axes: Selection
matrices (queries and keys: they decide where attention goes) and Transmission matrices (values,
outputs and the FFN: they carry the signal). Fused matrices (GPT-NeoX qkv, fused gate/up) are split
into parts named `kind[part]`.
"""

from __future__ import annotations

MATRIX_KINDS = ("q", "k", "v", "o", "qkv", "gate", "up", "down", "ffn_in", "ffn_out", "embed", "unembed", "other")
KINDS = (*MATRIX_KINDS[:-1], "norm", "bias", "other")  # every tensor, vectors included
SELECTION_KINDS = frozenset({"q", "k", "qkv"})
TRANSMISSION_KINDS = frozenset({"v", "o", "gate", "up", "down", "ffn_in", "ffn_out"})
FFN_KINDS = ("gate", "up", "down", "ffn_in", "ffn_out")
WEIGHT_KINDS = ("q", "k", "v", "o", "qkv", *FFN_KINDS)  # the block matrices k is read on

# Display order of kinds and of fused parts: attention first, then the FFN, then the rest. A model has
# either ffn_in/ffn_out or gate/up/down (Phi-3: fused ffn_in with down), never both, so the order
# of the two FFN groups never meets. BLOCK_KEYS are the matrices the block-by-block health check reads.
BLOCK_KEYS = (
    "qkv",
    "qkv[q]",
    "qkv[k]",
    "qkv[v]",
    "q",
    "k",
    "v",
    "o",
    "ffn_in",
    "ffn_in[gate]",
    "ffn_in[up]",
    "ffn_out",
    "gate",
    "up",
    "down",
)
KIND_ORDER = (*BLOCK_KEYS, "embed", "unembed", "other")
SELECTION_KEYS = frozenset({*SELECTION_KINDS, "qkv[q]", "qkv[k]"})  # kinds and fused parts
FFN_KEYS = frozenset({*FFN_KINDS, "ffn_in[gate]", "ffn_in[up]"})

# The two sides of the FFN: its inputs read the residual stream, its outputs (and W_o) write to it;
# every other matrix (q/k/v, embeddings) reads from it.
FFN_INPUT_KINDS = ("gate", "up", "ffn_in")
FFN_OUTPUT_KINDS = ("down", "ffn_out")
RESIDUAL_WRITERS = frozenset({"o", *FFN_OUTPUT_KINDS})
# The Transmission kinds whose lambda the paper averages for its scaling fit (Sec. 5.4): Pythia's
# GELU FFN, and the SwiGLU one.
PYTHIA_LAMBDA_KINDS = ("o", "ffn_in", "ffn_out")
SWIGLU_LAMBDA_KINDS = ("o", "gate", "up", "down")

# The trim of the cohort database (DATABASE_v9_1) and of every comparison with it: the middle 80%
# of the probability plot (the paper's protocol, App. A.1).
COHORT_TRIM = "mid80"


def kind_order(kind: str) -> int:
    """Sort key of a kind or fused part (unknown ones last)."""
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def kind_class(kind: str) -> str:
    """selection, transmission, embedding or other."""
    if kind in SELECTION_KINDS:
        return "selection"
    if kind in TRANSMISSION_KINDS:
        return "transmission"
    if kind in ("embed", "unembed"):
        return "embedding"
    return "other"

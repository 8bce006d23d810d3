"""Stored tensors that hold several matrices, cut into one record each.

A fused-experts tensor holds every expert's gate, up or down projection; DeepSeek's kv_b_proj holds the
keys' and the values' up-projections head by head; Qwen3-Next's q_proj holds each head's query and its
output gate. Each piece is fitted as its own matrix with its own kind (and expert), read in place from
the stored tensor through a `Segments` selection: no copy, one read of the tensor for all its pieces.

Layouts, from each family's modelling code (transformers 5, models/<family>/modeling_<family>.py):

- Llama-4 `feed_forward.experts.gate_up_proj` [E, d, 2f] (Llama4TextExperts: bmm(x, gate_up_proj), then
  chunk(2) on the last axis: gate = columns [0, f), up = [f, 2f)) and `down_proj` [E, f, d] (bmm): stored
  (in, out).
- gpt-oss `mlp.experts.gate_up_proj` [E, d, 2f] (GptOssExperts._apply_gate: gate = gate_up[..., ::2],
  up = gate_up[..., 1::2]: interleaved columns), `down_proj` [E, f, d], both (in, out); the biases
  `gate_up_proj_bias` [E, 2f] (interleaved the same way) and `down_proj_bias` [E, d]. Its MXFP4 release
  stores `*_blocks` [E, rows, cols/32, 16] whose logical matrix (quant/group.py `_group_mxfp4`) is
  [E, 2f, d] for gate_up (out, in: gate and up interleaved by rows) and [E, d, f] for down
  (transformers integrations/mxfp4.py convert_moe_packed_tensors transposes them after decoding).
- Granite-MoE / Granite-4.0-H `block_sparse_moe.input_linear` [E, 2f, d] and `output_linear` [E, d, f]
  (GraniteMoeHybridExperts: linear(x, gate_up_proj[e]).chunk(2): gate = rows [0, f)): stored (out, in).
- DBRX `ffn.experts.mlp.w1` / `v1` / `w2`, each [E * f, d] (DbrxExpertGLU: x @ w1[e].T is the gate, x @ v1[e].T
  the up, h @ w2[e] the down: w1/v1 (out, in), w2 (in, out)).
- llama.cpp `blk.N.ffn_{gate,up,down}_exps` [E, out, in].
- MLA (DeepseekV3Attention): kv_a_proj_with_mqa rows [kv_lora_rank latent | qk_rope_head_dim shared rope key]
  (torch.split(compressed_kv, [kv_lora_rank, qk_rope_head_dim])); kv_b_proj rows per head
  [qk_nope_head_dim keys | v_head_dim values] (view(..., -1, nope + v), split); q_b_proj (or q_proj without
  q_lora_rank) rows per head [qk_nope_head_dim | qk_rope_head_dim].
- Qwen3-Next (Qwen3NextAttention): q_proj rows per head [head_dim query | head_dim output gate]
  (view(..., -1, head_dim * 2), chunk(2)); attn_output * sigmoid(gate).

A record cut from a tensor is named `<tensor>[<label>]` (`...experts.gate_up_proj[3,gate]`, `...kv_b_proj.weight[k]`);
its `shape` and `argmax` are those of the piece as a matrix (out, in), whatever the stored orientation, so that
every reader of rows sees W as nn.Linear holds it; `slice_of` locates it in the stored tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..segments import Segments
from . import ArchInfo, TensorRole

# Families whose unquantized fused experts are stored (in, out) (bmm(x, W)); the rest (Granite, transformers-5
# saves of Mixtral-style experts) store (out, in) like nn.Linear.
_IN_OUT_EXPERT_FAMILIES = {"llama4", "llama4_text", "gpt_oss"}
_INTERLEAVED_GATE_UP = {"gpt_oss"}  # gate = [..., ::2], up = [..., 1::2]
# Qwen3-Next and Qwen3.5 gate their attention output with half of q_proj's rows.
_GATED_QUERY_FAMILIES = {"qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}


@dataclass(frozen=True)
class View:
    """One record cut from a stored tensor: its label, role and elements.

    The selected elements, in flat order, are a `rows` x `cols` matrix in row-major order; with
    `transposed` that matrix is (in, out) and the record is its transpose (out, in)."""

    label: str
    role: TensorRole
    segments: Segments  # in the stored tensor's flat elements (a quantized weight's logical ones)
    rows: int
    cols: int
    transposed: bool = False
    vector: bool = False  # an expert's bias: a vector record

    @property
    def shape(self) -> tuple[int, ...]:
        if self.vector:
            return (self.rows * self.cols,)
        return (self.cols, self.rows) if self.transposed else (self.rows, self.cols)

    def local_index(self, flat: int) -> int:
        """The flat index, in the record's `shape`, of the stored tensor's element `flat` (one of the view's)."""
        s = self.segments
        run, pos = divmod(flat - s.offset, s.stride)
        i = run * s.length + pos
        if not self.transposed:
            return i
        r, c = divmod(i, self.cols)
        return c * self.rows + r

    def slice_of(self, tensor: str) -> dict[str, object]:
        """The row's `slice_of`: the stored tensor and the selection of its flat elements."""
        s = self.segments
        return {"tensor": tensor, "segments": [s.offset, s.length, s.stride, s.count]}


Views = tuple[list[View], str | None]


def views_of(role: TensorRole, name: str, shape: tuple[int, ...], arch: ArchInfo, quantized: bool = False) -> Views:
    """The records a stored tensor is cut into, or ([], None) when it is one record; ([], reason) when it
    should be cut but the shapes and the config do not agree (it is then fitted whole, the reason noted).
    `quantized`: the shape is a quantized weight's logical one (its codes' orientation, see the module doc)."""
    parts = name.split(".")
    stem_parts = parts[:-1] if parts[-1] in ("weight", "bias") else parts
    last = stem_parts[-1].lower()
    if role.layout == "experts":
        return _experts(role, last, shape, arch, quantized)
    if role.kind == "kv_a" and len(shape) == 2 and role.param == "weight":
        return _mla_kv_a(role, shape, arch)
    if role.layout == "mla" and len(shape) == 2:
        return _mla_kv_b(role, shape, arch)
    if role.kind == "q" and len(shape) == 2 and role.param == "weight" and last in ("q_proj", "q_b_proj"):
        if arch.qk_rope_head_dim and (last == "q_b_proj" or arch.kv_lora_rank):
            return _per_head(
                role, shape, arch.n_heads, (("q", arch.qk_nope_head_dim), ("q_rope", arch.qk_rope_head_dim))
            )
        if arch.family in _GATED_QUERY_FAMILIES and arch.n_heads and arch.head_dim:
            if shape[0] == arch.n_heads * arch.head_dim:
                return [], None  # an ungated q_proj
            return _per_head(role, shape, arch.n_heads, (("q", arch.head_dim), ("attn_gate", arch.head_dim)))
    return [], None


def _per_head(role: TensorRole, shape: tuple[int, ...], heads: int | None, widths) -> Views:
    """Rows grouped per head as [part0 | part1 | ...] (each `width` rows): one view per part."""
    rows, cols = shape
    if not heads or any(not w for _, w in widths):
        return [], "config.json does not give the head count and per-head widths"
    group = sum(w for _, w in widths)
    if rows != heads * group:
        detail = " + ".join(f"{w} {k}" for k, w in widths)
        return [], f"{rows} rows != {heads} heads x ({detail})"
    out, start = [], 0
    for kind, width in widths:
        seg = Segments(start * cols, width * cols, group * cols, heads)
        out.append(View(kind, replace(role, kind=kind, layout=None, note=None), seg, heads * width, cols))
        start += width
    return out, None


def _mla_kv_b(role: TensorRole, shape: tuple[int, ...], arch: ArchInfo) -> Views:
    widths = (("k", arch.qk_nope_head_dim), ("v", arch.v_head_dim))
    return _per_head(role, shape, arch.n_heads, widths)


def _mla_kv_a(role: TensorRole, shape: tuple[int, ...], arch: ArchInfo) -> Views:
    rows, cols = shape
    rank, rope = arch.kv_lora_rank, arch.qk_rope_head_dim
    if not (rank and rope):
        return [], "config.json does not give kv_lora_rank and qk_rope_head_dim"
    if rows != rank + rope:
        return [], f"{rows} rows != kv_lora_rank {rank} + qk_rope_head_dim {rope}"
    base = replace(role, layout=None, note=None)
    return [
        View("kv_a", replace(base, kind="kv_a"), Segments(0, rank * cols, rank * cols, 1), rank, cols),
        View("k_rope", replace(base, kind="k_rope"), Segments(rank * cols, rope * cols, rope * cols, 1), rope, cols),
    ], None


def _experts(role: TensorRole, last: str, shape: tuple[int, ...], arch: ArchInfo, quantized: bool) -> Views:
    """Fused experts [E, a, b] (or DBRX's [E * f, d]) -> per expert gate/up/down records (biases as vectors)."""
    if last in ("gate_up_proj_bias", "down_proj_bias"):
        return _expert_biases(role, last, shape, arch)
    if last in ("w1", "v1", "w2"):  # DBRX: [E * f, d] per kind
        rows, d = shape
        n = arch.n_experts or (rows // arch.ffn_size if arch.ffn_size and rows % arch.ffn_size == 0 else None)
        if not n or rows % n:
            return [], f"{rows} rows are not a whole number of experts (config moe_num_experts {arch.n_experts})"
        f = rows // n
        kind = {"w1": "gate", "v1": "up", "w2": "down"}[last]
        return [
            View(str(e), _expert_role(role, kind, e), Segments(e * f * d, f * d, f * d, 1), f, d, last == "w2")
            for e in range(n)
        ], None
    if len(shape) != 3:
        return [], f"{len(shape)}-D fused experts"
    n, a, b = shape
    if arch.n_experts and n != arch.n_experts:
        return [], f"{n} experts stored, config says {arch.n_experts}"
    pair = last in ("gate_up_proj", "input_linear")
    kind = {"gate_proj": "gate", "up_proj": "up", "ffn_gate_exps": "gate", "ffn_up_exps": "up"}.get(last, "down")
    writes_d = not pair and kind == "down"  # down's output (out) axis is the hidden size
    in_out = _orientation(arch, a, b, writes_d, quantized)
    if isinstance(in_out, str):
        return [], in_out
    if last.endswith("_exps"):
        in_out = False  # llama.cpp stores [E, out, in]
    size = a * b
    if not pair:
        return [
            View(str(e), _expert_role(role, kind, e), Segments(e * size, size, size, 1), a, b, in_out) for e in range(n)
        ], None
    out_axis = b if in_out else a
    if out_axis % 2:
        return [], f"{out_axis} gate/up outputs cannot hold two equal halves"
    f = out_axis // 2
    interleaved = arch.family in _INTERLEAVED_GATE_UP
    views = []
    for e in range(n):
        base = e * size
        for i, k in enumerate(("gate", "up")):
            if in_out and interleaved:  # columns 2j (gate) and 2j+1 (up) of each of the a = d rows
                seg, rows, cols = Segments(base + i, 1, 2, a * f), a, f
            elif in_out:  # columns [0, f) and [f, 2f) of each row
                seg, rows, cols = Segments(base + i * f, f, b, a), a, f
            elif interleaved:  # rows 2j and 2j+1
                seg, rows, cols = Segments(base + i * b, b, 2 * b, f), f, b
            else:  # rows [0, f) and [f, 2f)
                seg, rows, cols = Segments(base + i * f * b, f * b, f * b, 1), f, b
            views.append(View(f"{e},{k}", _expert_role(role, k, e), seg, rows, cols, in_out))
    return views, None


def _orientation(arch: ArchInfo, a: int, b: int, writes_d: bool, quantized: bool) -> bool | str:
    """True when an expert's [a, b] is stored (in, out), False for (out, in); a reason when neither fits.

    The hidden size d is the input of gate/up and the output of down: (in, out) puts it on axis a for
    gate/up and on axis b for down. Where d fits both ways (or is unknown) the family decides."""
    default = arch.family in _IN_OUT_EXPERT_FAMILIES and not quantized
    d = arch.d_model
    if not d:
        return default
    in_out_fits = (b == d) if writes_d else (a == d)
    out_in_fits = (a == d) if writes_d else (b == d)
    if in_out_fits and out_in_fits:
        return default
    if in_out_fits or out_in_fits:
        return in_out_fits
    return f"[{a}, {b}] per expert has no axis of the hidden size {d}"


def _expert_biases(role: TensorRole, last: str, shape: tuple[int, ...], arch: ArchInfo) -> Views:
    if len(shape) != 2:
        return [], f"{len(shape)}-D expert biases"
    n, width = shape
    bias = replace(role, kind="bias", param="bias", layout=None, note=None)
    if last == "down_proj_bias":
        return [
            View(
                str(e),
                replace(bias, expert=e, of_kind="down"),
                Segments(e * width, width, width, 1),
                1,
                width,
                vector=True,
            )
            for e in range(n)
        ], None
    if width % 2:
        return [], f"{width} gate/up biases cannot hold two equal halves"
    f = width // 2
    interleaved = arch.family in _INTERLEAVED_GATE_UP
    views = []
    for e in range(n):
        for i, k in enumerate(("gate", "up")):
            seg = Segments(e * width + i, 1, 2, f) if interleaved else Segments(e * width + i * f, f, f, 1)
            views.append(View(f"{e},{k}", replace(bias, expert=e, of_kind=k), seg, 1, f, vector=True))
    return views, None


def _expert_role(role: TensorRole, kind: str, expert: int) -> TensorRole:
    return replace(role, kind=kind, expert=expert, layout=None, note=None)


def whole_rows(views: list[View], cols: int) -> bool:
    """Every view selects whole rows of a matrix `cols` wide (what a quantized format decoded in another
    order than row-major can select, quant/decoder.py `selection`)."""
    for v in views:
        s = v.segments
        if s.offset % cols or s.length % cols or (s.count > 1 and s.stride % cols):
            return False
    return True

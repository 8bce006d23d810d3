"""Labelled model pairs for `lineage` (tests/test_lineage.py, benchmarks/bench_lineage.py): derivations of a
checkpoint's state dict (fine-tuning, LoRA, quantization round trips, noise, function-preserving permutations and
rotations, dropped layers, added vocabulary, renaming) and tiny Llama models trained from scratch with different
seeds on the same data. Needs torch and transformers (test dependencies); imported by no stage."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

State = dict[str, Any]  # name -> torch.Tensor


def load_state(folder: Path) -> State:
    from safetensors.torch import load_file

    state: State = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def save_state(state: Mapping[str, Any], folder: Path, config: Mapping[str, Any] | Path | None) -> Path:
    """The state dict as model.safetensors (contiguous copies) with its config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().clone() for k, v in state.items()}, str(folder / "model.safetensors"))
    if isinstance(config, Path):
        shutil.copy(config, folder / "config.json")
    elif config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def _floats(state: State, f: Callable[[str, Any], Any], matrices_only: bool = True) -> State:
    return {k: f(k, v) if v.is_floating_point() and (v.ndim >= 2 or not matrices_only) else v for k, v in state.items()}


def noise(state: State, level: float = 0.01, seed: int = 1) -> State:
    """Gaussian noise of `level` times each matrix's std."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return _floats(state, lambda k, v: v + level * v.float().std() * torch.randn(v.shape, generator=g).to(v.dtype))


def fp8_round_trip(state: State) -> State:
    """Each matrix to FP8 E4M3 with a per-tensor scale and back (torch.float8_e4m3fn)."""
    import torch

    def rt(k: str, v: Any) -> Any:
        scale = v.float().abs().max() / 448.0
        return ((v.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(v.dtype)

    return _floats(state, rt)


def int4_round_trip(state: State, group: int = 32) -> State:
    """Symmetric 4-bit per group of `group` along each row (absmax scale), back to the stored dtype."""

    def rt(k: str, v: Any) -> Any:
        w = v.float()
        if w.shape[-1] % group:
            return v
        g = w.reshape(-1, group)
        scale = g.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 7.0
        return ((g / scale).round().clamp(-8, 7) * scale).reshape(w.shape).to(v.dtype)

    return _floats(state, rt)


def lora_merged(state: State, rank: int = 8, scale: float = 0.05, seed: int = 2) -> State:
    """W + B A on every square-or-wider matrix of a layer, a rank-`rank` update of ~`scale` of W's norm."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def merged(k: str, v: Any) -> Any:
        if ".layer" not in k and ".layers." not in k:
            return v
        out, inp = v.shape[0], v.shape[1]
        b = torch.randn(out, rank, generator=g)
        a = torch.randn(rank, inp, generator=g)
        delta = b @ a
        delta *= scale * v.float().norm() / delta.norm()
        return (v.float() + delta).to(v.dtype)

    return _floats(state, merged)


def restored(state: State, prefix: str = "renamed.", dtype: str = "float16") -> State:
    """Every tensor renamed (a prefix) and re-stored in `dtype`."""
    import torch

    to = getattr(torch, dtype)
    return {prefix + k.replace("layer", "blk"): v.to(to) if v.is_floating_point() else v for k, v in state.items()}


def merge(a: State, b: State) -> State:
    """The average of two state dicts of one architecture (a model soup / linear merge)."""
    return {k: (a[k].float() + b[k].float()).div(2).to(a[k].dtype) if a[k].is_floating_point() else a[k] for k in a}


def add_vocab(state: State, rows: int = 64, seed: int = 3) -> State:
    """`rows` new rows at the end of every matrix whose first dimension is the vocabulary's."""
    import torch

    g = torch.Generator().manual_seed(seed)
    vocab = max(v.shape[0] for v in state.values() if v.ndim == 2)
    out = dict(state)
    for k, v in state.items():
        if v.ndim == 2 and v.shape[0] == vocab:
            new = torch.randn(rows, v.shape[1], generator=g).to(v.dtype) * v.float().std().to(v.dtype)
            out[k] = torch.cat([v, new])
    return out


# --- BERT (MiniLM) ------------------------------------------------------------------------------------------


def bert_drop_layers(state: State, keep: int) -> State:
    """The first `keep` encoder layers only."""
    return {k: v for k, v in state.items() if ".layer." not in k or int(k.split(".layer.")[1].split(".")[0]) < keep}


def bert_permute_ffn(state: State, seed: int = 4) -> State:
    """Each layer's FFN units permuted (intermediate rows and bias, output columns): the same function."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = dict(state)
    for k in state:
        if k.endswith("intermediate.dense.weight"):
            base = k[: -len("intermediate.dense.weight")]
            p = torch.randperm(state[k].shape[0], generator=g)
            out[k] = state[k][p]
            out[base + "intermediate.dense.bias"] = state[base + "intermediate.dense.bias"][p]
            out[base + "output.dense.weight"] = state[base + "output.dense.weight"][:, p]
    return out


def bert_permute_heads(state: State, heads: int, seed: int = 5) -> State:
    """Each layer's attention heads permuted (Q, K, V rows and biases by head, the output's columns)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = dict(state)
    for k in state:
        if k.endswith("attention.self.query.weight"):
            base = k[: -len("self.query.weight")]
            d = state[k].shape[0]
            hd = d // heads
            order = torch.randperm(heads, generator=g)
            p = (order[:, None] * hd + torch.arange(hd)[None, :]).reshape(-1)
            for name in ("query", "key", "value"):
                out[f"{base}self.{name}.weight"] = state[f"{base}self.{name}.weight"][p]
                out[f"{base}self.{name}.bias"] = state[f"{base}self.{name}.bias"][p]
            out[f"{base}output.dense.weight"] = state[f"{base}output.dense.weight"][:, p]
    return out


def bert_permute_residual(state: State, seed: int = 6) -> State:
    """The residual stream's coordinates permuted everywhere (embeddings, LayerNorms, every matrix reading or
    writing it): the same function (LayerNorm commutes with a permutation)."""
    import torch

    hidden = state["embeddings.word_embeddings.weight"].shape[1]
    p = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed))
    out = {}
    for k, v in state.items():
        writes = any(s in k for s in ("attention.output.dense", "output.dense")) and "intermediate" not in k
        if k.startswith("embeddings.") and k.endswith("embeddings.weight"):
            out[k] = v[:, p]
        elif (
            "LayerNorm" in k
            or (v.ndim == 2 and writes and v.shape[0] == hidden)
            or (v.ndim == 1 and writes and v.shape[0] == hidden)
        ):
            out[k] = v[p]
        elif (
            v.ndim == 2 and v.shape[1] == hidden and not k.startswith("pooler")
        ) or k == "pooler.dense.weight":  # Q, K, V, FFN in: columns
            out[k] = v[:, p]
        else:
            out[k] = v
    return out


def bert_fine_tune(folder: Path, steps: int, lr: float, seed: int = 7) -> State:
    """A short full fine-tune of a BERT encoder (its mean-pooled output regressed on fixed random targets of
    random token sequences: every weight moves), returned as a state dict with the stored names."""
    import torch
    from transformers import BertModel

    torch.manual_seed(seed)
    model = BertModel.from_pretrained(str(folder))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    targets = torch.randn(8, hidden)
    for _ in range(steps):
        ids = torch.randint(1000, vocab, (8, 16))
        pooled = model(input_ids=ids).last_hidden_state.mean(dim=1)
        loss = torch.nn.functional.mse_loss(pooled, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    stored = load_state(folder)
    tuned = {k: v.detach() for k, v in model.state_dict().items()}
    return {k: tuned[k].to(v.dtype) if k in tuned else v for k, v in stored.items()}


# --- tiny Llama models trained from scratch -------------------------------------------------------------------

TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


def _corpus(batches: int, seed: int = 1234) -> Any:
    """The same token stream for every seed: a fixed random Markov chain over 256 tokens (sparse transitions)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    nxt = torch.randint(0, 256, (256, 4), generator=g)
    seqs = torch.empty(batches, 16, 33, dtype=torch.long)
    tok = torch.randint(0, 256, (batches, 16), generator=g)
    for t in range(33):
        seqs[:, :, t] = tok
        tok = nxt[tok, torch.randint(0, 4, tok.shape, generator=g)]
    return seqs


def tiny_llama(seed: int, steps: int, lr: float = 3e-3, init: State | None = None) -> tuple[State, State, dict]:
    """(trained state, initial state, config) of a tiny Llama initialised with `seed` (or from `init`) and trained
    `steps` steps of AdamW on the shared corpus."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY_LLAMA)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if init is not None:
        model.load_state_dict(init)
    first = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    data = _corpus(max(steps, 1))
    for step in range(steps):
        batch = data[step]
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    trained = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return trained, first, config.to_dict()


def llama_rotate(state: State, seed: int = 8) -> State:
    """An orthogonal rotation of the residual stream with the RMSNorm gains folded into the matrices that read
    it (the function is the same; as SliceGPT and QuaRot do)."""
    import torch

    hidden = state["model.embed_tokens.weight"].shape[1]
    q, _ = torch.linalg.qr(torch.randn(hidden, hidden, generator=torch.Generator().manual_seed(seed)))
    out = dict(state)
    layers = sorted({int(k.split(".")[2]) for k in state if k.startswith("model.layers.")})
    for i in layers:
        pre = f"model.layers.{i}."
        g1 = state[pre + "input_layernorm.weight"].float()
        g2 = state[pre + "post_attention_layernorm.weight"].float()
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            out[pre + m + ".weight"] = (state[pre + m + ".weight"].float() * g1) @ q.T
        for m in ("mlp.gate_proj", "mlp.up_proj"):
            out[pre + m + ".weight"] = (state[pre + m + ".weight"].float() * g2) @ q.T
        for m in ("self_attn.o_proj", "mlp.down_proj"):
            out[pre + m + ".weight"] = q @ state[pre + m + ".weight"].float()
        out[pre + "input_layernorm.weight"] = torch.ones_like(g1)
        out[pre + "post_attention_layernorm.weight"] = torch.ones_like(g2)
    gf = state["model.norm.weight"].float()
    out["model.embed_tokens.weight"] = state["model.embed_tokens.weight"].float() @ q.T
    if "lm_head.weight" in state:
        out["lm_head.weight"] = (state["lm_head.weight"].float() * gf) @ q.T
        out["model.norm.weight"] = torch.ones_like(gf)  # tied embeddings: the final gain stays (it cannot fold)
    return out


def llama_permute_residual(state: State, seed: int = 9) -> State:
    """The residual stream's coordinates permuted everywhere (a rotation by a permutation matrix, gains kept)."""
    import torch

    hidden = state["model.embed_tokens.weight"].shape[1]
    p = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed))
    out = {}
    for k, v in state.items():
        if k.endswith(("o_proj.weight", "down_proj.weight")) or k.endswith("norm.weight"):
            out[k] = v[p]
        elif v.ndim == 2:
            out[k] = v[:, p]
        else:
            out[k] = v
    return out


def llama_upcycle(state: State, experts: int = 4, level: float = 0.01, seed: int = 10) -> State:
    """A Mixtral-style MoE upcycled from a dense Llama: each layer's FFN copied into `experts` experts (w1 gate,
    w2 down, w3 up), each copy with Gaussian noise of `level` times the matrix's std, and a random router; the
    rest of the model kept (the case of the dispute over an MoE upcycled from a dense model)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out: State = {}
    for k, v in state.items():
        if ".mlp." not in k:
            out[k] = v
            continue
        pre, name = k.split(".mlp.")
        w = {"gate_proj.weight": "w1", "down_proj.weight": "w2", "up_proj.weight": "w3"}[name]
        for e in range(experts):
            jitter = level * v.float().std() * torch.randn(v.shape, generator=g)
            out[f"{pre}.block_sparse_moe.experts.{e}.{w}.weight"] = (v.float() + jitter).to(v.dtype)
        if name == "gate_proj.weight":
            router = torch.randn(experts, v.shape[1], generator=g) * 0.02
            out[f"{pre}.block_sparse_moe.gate.weight"] = router.to(v.dtype)
    return out


def mixtral_config(llama: Mapping[str, Any], experts: int = 4) -> dict[str, Any]:
    """The config of llama_upcycle's MoE for a Llama config."""
    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    return {
        **{k: llama[k] for k in keep},
        "num_key_value_heads": llama.get("num_key_value_heads", llama["num_attention_heads"]),
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": experts,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    }


GGUF_LLAMA_NAMES = {  # a block tensor's GGUF name -> its Hugging Face name (tests/test_gguf_stream.py too)
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def gguf_llama_state(path: Path, dtype: str = "bfloat16") -> tuple[State, dict[str, Any]]:
    """A Llama GGUF's tensors dequantized (gguf.quants.dequantize: Q4_1, Q8_0, ...) under Hugging Face names,
    stored as `dtype`, and a LlamaConfig dict from its metadata (embeddings tied when it has no output.weight)."""
    import gguf
    import torch

    reader = gguf.GGUFReader(str(path))

    def field(name: str) -> Any:
        f = reader.fields[name]
        return f.parts[f.data[0]].tolist()[0]

    to = getattr(torch, dtype)
    state: State = {}
    for t in reader.tensors:
        values = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).to(to)
        if t.name == "token_embd.weight":
            state["model.embed_tokens.weight"] = values
        elif t.name == "output_norm.weight":
            state["model.norm.weight"] = values
        elif t.name == "output.weight":
            state["lm_head.weight"] = values
        else:
            _, i, kind, _ = t.name.split(".")
            state[f"model.layers.{i}.{GGUF_LLAMA_NAMES[kind]}.weight"] = values
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(state["model.embed_tokens.weight"].shape[0]),
        "hidden_size": int(field("llama.embedding_length")),
        "intermediate_size": int(field("llama.feed_forward_length")),
        "num_hidden_layers": int(field("llama.block_count")),
        "num_attention_heads": int(field("llama.attention.head_count")),
        "num_key_value_heads": int(field("llama.attention.head_count_kv")),
        "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("llama.rope.freq_base")),
        "max_position_embeddings": int(field("llama.context_length")),
        "tie_word_embeddings": "lm_head.weight" not in state,
    }
    return state, config

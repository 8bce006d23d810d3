"""Small Llama-shaped checkpoints for diff tests: a base and tuned variants with known answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

LAYERS, D, FFN, VOCAB = 4, 128, 256, 320
Tensors = dict[str, np.ndarray]


def base_tensors(seed: int = 0) -> Tensors:
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    out: Tensors = {"model.embed_tokens.weight": w(VOCAB, D), "lm_head.weight": w(VOCAB, D)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name in ("q", "k", "v", "o"):
            out[p + f"self_attn.{name}_proj.weight"] = w(D, D)
        out[p + "mlp.gate_proj.weight"] = w(FFN, D)
        out[p + "mlp.up_proj.weight"] = w(FFN, D)
        out[p + "mlp.down_proj.weight"] = w(D, FFN)
        out[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
    out["model.norm.weight"] = np.ones(D, dtype=np.float32)
    return out


def noise(t: Tensors, scale: float, seed: int, keep: Callable[[str], bool] = lambda name: False) -> Tensors:
    """Full fine-tune-like change: small full-rank noise on every tensor (relative `scale`), but `keep`."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, v in t.items():
        if keep(name):
            out[name] = v.copy()
        else:
            out[name] = (v + scale * float(np.std(v) or 1.0) * rng.standard_normal(v.shape)).astype(np.float32)
    return out


def low_rank_update(w: np.ndarray, rank: int, seed: int, scale: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((w.shape[0], rank))
    a = rng.standard_normal((rank, w.shape[1]))
    delta = b @ a
    delta *= scale * np.linalg.norm(w) / np.linalg.norm(delta)
    return (w + delta).astype(np.float32)


CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": LAYERS,
    "hidden_size": D,
    "intermediate_size": FFN,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
}


def write(folder: Path, tensors: Tensors, dtype: torch.dtype = torch.float32, config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: torch.from_numpy(v).to(dtype).contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors")
    )
    (folder / "config.json").write_text(json.dumps(config or CONFIG))
    return folder


def values(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor as float64 (numpy's view of the truth)."""
    from safetensors.torch import load_file

    return {k: v.to(torch.float64).numpy() for k, v in load_file(str(folder / "model.safetensors")).items()}


def stored(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def write_gguf(
    path: Path, tensors: Tensors, qtype: str, quantize: Callable[[str, np.ndarray], bool], arch: str = "llama"
) -> dict[str, np.ndarray]:
    """`tensors` as a GGUF file, those `quantize` picks quantized by gguf-py's own quantizer (`qtype`) and stored so,
    the rest F32; returns the picked ones' values as gguf-py dequantizes them (float64, the tensors' shapes)."""
    import gguf
    from gguf import quants

    kind = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(path), arch)
    back = {}
    for name, w in tensors.items():
        if quantize(name, w):
            packed = quants.quantize(w, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)
            back[name] = quants.dequantize(packed, kind).reshape(w.shape).astype(np.float64)
        else:
            writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return back

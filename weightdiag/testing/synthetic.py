"""Synthetic checkpoints with known ground truth, for tests, benchmarks and demos.

`write_model` writes a sharded safetensors checkpoint (plus config.json and, when sharded,
model.safetensors.index.json) one tensor at a time, so a multi-GB model never sits in memory.
Each matrix is i.i.d. Gaussian with a per-kind sigma (the init recipes of the paper's App. A.3
are available as presets); `modify` can replace any tensor to plant anomalies.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..vocabulary import PYTHIA_LAMBDA_KINDS

ELEMENT_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "U8": 1}


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns, round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def encode(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        return to_bf16_bits(x).tobytes()
    if dtype == "F16":
        return np.ascontiguousarray(x, dtype=np.float16).tobytes()
    if dtype in ("F32", "F64", "I64", "U8"):
        numpy_type = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "U8": "u1"}[dtype]
        return np.ascontiguousarray(x, dtype=numpy_type).tobytes()
    raise ValueError(f"cannot encode {dtype}")


@dataclass
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str  # matrix kind, or "norm" / "bias"
    block: int | None
    sigma: float = 0.02  # for matrices
    fill: float | None = None  # constant fill (norm weights = 1.0, biases = 0.0)
    spread: float = 0.0  # per-element relative spread around a non-zero fill (a trained norm vector)


@dataclass
class ModelSpec:
    family: str = "llama"  # llama | gpt_neox (Pre-LN decoders) | bert (a Post-LN encoder: norms after the residual)
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_size: int = 688
    vocab: int = 1024
    dtype: str = "BF16"
    sigma: dict[str, float] = field(default_factory=dict)  # per kind; default 0.02
    tied_embeddings: bool = False
    shard_bytes: int = 2 << 30
    seed: int = 0
    # Realistic variation for calibration (all 0: the plain i.i.d. Gaussian model at its init):
    norm_spread: float = 0.0  # norm weights 1 + N(0, norm_spread) per element: trained, not at init
    depth_trend: float = 0.0  # matrix sigma grows linearly to (1 + depth_trend) x at the last block
    block_jitter: float = 0.0  # per-block, per-kind sigma factor uniform in [1 - j, 1 + j]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def config(self) -> dict[str, object]:
        if self.family == "bert":
            return {
                "architectures": ["BertModel"],
                "model_type": "bert",
                "hidden_size": self.d_model,
                "num_hidden_layers": self.n_layers,
                "num_attention_heads": self.n_heads,
                "intermediate_size": self.ffn_size,
                "vocab_size": self.vocab,
                "hidden_act": "gelu",
                "layer_norm_eps": 1e-12,
                "max_position_embeddings": BERT_POSITIONS,
                "type_vocab_size": 2,
            }
        if self.family == "gpt_neox":
            return {
                "architectures": ["GPTNeoXForCausalLM"],
                "model_type": "gpt_neox",
                "hidden_size": self.d_model,
                "num_hidden_layers": self.n_layers,
                "num_attention_heads": self.n_heads,
                "intermediate_size": self.ffn_size,
                "vocab_size": self.vocab,
                "layer_norm_eps": 1e-5,
                "tie_word_embeddings": False,
            }
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.d_model,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.ffn_size,
            "vocab_size": self.vocab,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": self.tied_embeddings,
            "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[self.dtype],
        }

    def tensors(self) -> list[TensorSpec]:
        build = {"gpt_neox": _neox_tensors, "bert": _bert_tensors}.get(self.family, _llama_tensors)
        out = build(self)
        for t in out:
            if t.block is None:
                continue
            if t.fill is None:
                # Own generator per (seed, block, kind): the main stream, so every default model, is unchanged.
                jitter = np.random.default_rng([self.seed, t.block, zlib.crc32(t.kind.encode())])
                depth = t.block / max(self.n_layers - 1, 1)
                t.sigma *= (1 + self.depth_trend * depth) * (1 + jitter.uniform(-1, 1) * self.block_jitter)
            elif t.fill:
                t.spread = self.norm_spread
        return out

    def sigma_of(self, kind: str) -> float:
        return self.sigma.get(kind, 0.02)


def _llama_tensors(s: ModelSpec) -> list[TensorSpec]:
    d, hd, f = s.d_model, s.head_dim, s.ffn_size
    out = [TensorSpec("model.embed_tokens.weight", (s.vocab, d), "embed", None, s.sigma_of("embed"))]
    for b in range(s.n_layers):
        p = f"model.layers.{b}."
        out += [
            TensorSpec(p + "input_layernorm.weight", (d,), "norm", b, fill=1.0),
            TensorSpec(p + "self_attn.q_proj.weight", (s.n_heads * hd, d), "q", b, s.sigma_of("q")),
            TensorSpec(p + "self_attn.k_proj.weight", (s.n_kv_heads * hd, d), "k", b, s.sigma_of("k")),
            TensorSpec(p + "self_attn.v_proj.weight", (s.n_kv_heads * hd, d), "v", b, s.sigma_of("v")),
            TensorSpec(p + "self_attn.o_proj.weight", (d, s.n_heads * hd), "o", b, s.sigma_of("o")),
            TensorSpec(p + "post_attention_layernorm.weight", (d,), "norm", b, fill=1.0),
            TensorSpec(p + "mlp.gate_proj.weight", (f, d), "gate", b, s.sigma_of("gate")),
            TensorSpec(p + "mlp.up_proj.weight", (f, d), "up", b, s.sigma_of("up")),
            TensorSpec(p + "mlp.down_proj.weight", (d, f), "down", b, s.sigma_of("down")),
        ]
    out.append(TensorSpec("model.norm.weight", (d,), "norm", None, fill=1.0))
    if not s.tied_embeddings:
        out.append(TensorSpec("lm_head.weight", (s.vocab, d), "unembed", None, s.sigma_of("unembed")))
    return out


def _neox_tensors(s: ModelSpec) -> list[TensorSpec]:
    d, f = s.d_model, s.ffn_size
    out = [TensorSpec("gpt_neox.embed_in.weight", (s.vocab, d), "embed", None, s.sigma_of("embed"))]
    for b in range(s.n_layers):
        p = f"gpt_neox.layers.{b}."
        out += [
            TensorSpec(p + "input_layernorm.weight", (d,), "norm", b, fill=1.0),
            TensorSpec(p + "input_layernorm.bias", (d,), "norm", b, fill=0.0),
            TensorSpec(p + "post_attention_layernorm.weight", (d,), "norm", b, fill=1.0),
            TensorSpec(p + "post_attention_layernorm.bias", (d,), "norm", b, fill=0.0),
            TensorSpec(p + "attention.query_key_value.weight", (3 * d, d), "qkv", b, s.sigma_of("qkv")),
            TensorSpec(p + "attention.query_key_value.bias", (3 * d,), "bias", b, fill=0.0),
            TensorSpec(p + "attention.dense.weight", (d, d), "o", b, s.sigma_of("o")),
            TensorSpec(p + "attention.dense.bias", (d,), "bias", b, fill=0.0),
            TensorSpec(p + "mlp.dense_h_to_4h.weight", (f, d), "ffn_in", b, s.sigma_of("ffn_in")),
            TensorSpec(p + "mlp.dense_h_to_4h.bias", (f,), "bias", b, fill=0.0),
            TensorSpec(p + "mlp.dense_4h_to_h.weight", (d, f), "ffn_out", b, s.sigma_of("ffn_out")),
            TensorSpec(p + "mlp.dense_4h_to_h.bias", (d,), "bias", b, fill=0.0),
        ]
    out += [
        TensorSpec("gpt_neox.final_layer_norm.weight", (d,), "norm", None, fill=1.0),
        TensorSpec("gpt_neox.final_layer_norm.bias", (d,), "norm", None, fill=0.0),
        TensorSpec("embed_out.weight", (s.vocab, d), "unembed", None, s.sigma_of("unembed")),
    ]
    return out


BERT_POSITIONS = 128


def _bert_tensors(s: ModelSpec) -> list[TensorSpec]:
    """BERT's layout: Post-LN, each sub-layer's LayerNorm after its residual add; biases everywhere."""
    d, f = s.d_model, s.ffn_size
    out = [
        TensorSpec("embeddings.word_embeddings.weight", (s.vocab, d), "embed", None, s.sigma_of("embed")),
        TensorSpec("embeddings.position_embeddings.weight", (BERT_POSITIONS, d), "embed", None, s.sigma_of("embed")),
        TensorSpec("embeddings.token_type_embeddings.weight", (2, d), "embed", None, s.sigma_of("embed")),
        TensorSpec("embeddings.LayerNorm.weight", (d,), "norm", None, fill=1.0),
        TensorSpec("embeddings.LayerNorm.bias", (d,), "norm", None, fill=0.0),
    ]
    for b in range(s.n_layers):
        p = f"encoder.layer.{b}."
        for name, kind, shape in (
            ("attention.self.query", "q", (d, d)),
            ("attention.self.key", "k", (d, d)),
            ("attention.self.value", "v", (d, d)),
            ("attention.output.dense", "o", (d, d)),
        ):
            out += [
                TensorSpec(p + name + ".weight", shape, kind, b, s.sigma_of(kind)),
                TensorSpec(p + name + ".bias", (shape[0],), "bias", b, fill=0.0),
            ]
        out += [
            TensorSpec(p + "attention.output.LayerNorm.weight", (d,), "norm", b, fill=1.0),
            TensorSpec(p + "attention.output.LayerNorm.bias", (d,), "norm", b, fill=0.0),
            TensorSpec(p + "intermediate.dense.weight", (f, d), "ffn_in", b, s.sigma_of("ffn_in")),
            TensorSpec(p + "intermediate.dense.bias", (f,), "bias", b, fill=0.0),
            TensorSpec(p + "output.dense.weight", (d, f), "ffn_out", b, s.sigma_of("ffn_out")),
            TensorSpec(p + "output.dense.bias", (d,), "bias", b, fill=0.0),
            TensorSpec(p + "output.LayerNorm.weight", (d,), "norm", b, fill=1.0),
            TensorSpec(p + "output.LayerNorm.bias", (d,), "norm", b, fill=0.0),
        ]
    return out


def pythia_init_sigmas(d_model: int, n_layers: int, recipe: str = "A") -> dict[str, float]:
    """Per-kind init sigma of the Pythia recipes (paper App. A.3, from GPT-NeoX).

    Recipe A (70m-1b): small_init sqrt(2 / (5 d)) for input-side (qkv, ffn_in), wang_init
    2 / (L sqrt(d)) for output-side (o, ffn_out). Recipe B (6.9b): normal 0.02 and
    scaled_normal 0.02 / sqrt(2 L).
    """
    if recipe == "A":
        sin, sout = math.sqrt(2 / (5 * d_model)), 2 / (n_layers * math.sqrt(d_model))
    else:
        sin, sout = 0.02, 0.02 / math.sqrt(2 * n_layers)
    return {"qkv": sin, "ffn_in": sin, "o": sout, "ffn_out": sout, "embed": sin, "unembed": sin}


Modifier = Callable[[TensorSpec, np.ndarray], np.ndarray]


def generate(spec: ModelSpec, t: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    if t.fill is not None:
        if t.spread:
            return (t.fill * (1 + t.spread * rng.standard_normal(t.shape))).astype(np.float32)
        return np.full(t.shape, t.fill, dtype=np.float32)
    return rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.sigma)


def _write_gaussian_rows(f, t: TensorSpec, dtype: str, rng: np.random.Generator) -> None:
    rows, cols = t.shape
    step = max(1, (1 << 22) // max(cols, 1))
    for start in range(0, rows, step):
        n = min(step, rows - start)
        f.write(encode(rng.standard_normal((n, cols), dtype=np.float32) * np.float32(t.sigma), dtype))


def _shards(spec: ModelSpec, tensors: list[TensorSpec]) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for t in tensors:
        n = math.prod(t.shape) * ELEMENT_BYTES[spec.dtype]
        if shards[-1] and size + n > spec.shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    return shards


def header_bytes(entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None) -> bytes:
    """A safetensors prefix + header for tensors laid out contiguously in the given order."""
    doc: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, dtype, shape in entries:
        n = math.prod(shape) * ELEMENT_BYTES[dtype]
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    return len(raw).to_bytes(8, "little") + raw


def write_model(path: str | Path, spec: ModelSpec, modify: Modifier | None = None) -> Path:
    """Write the checkpoint into folder `path`; returns the folder."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    tensors = spec.tensors()
    shards = _shards(spec, tensors)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map: dict[str, str] = {}
    for shard_name, members in zip(names, shards, strict=True):
        with open(root / shard_name, "wb") as f:
            f.write(header_bytes([(t.name, spec.dtype, t.shape) for t in members]))
            for t in members:
                if modify is None and t.fill is None and len(t.shape) == 2:
                    _write_gaussian_rows(f, t, spec.dtype, rng)  # chunked: no multi-GB temporaries
                else:
                    x = generate(spec, t, rng)
                    if modify is not None:
                        x = modify(t, x)
                    f.write(encode(x, spec.dtype))
                weight_map[t.name] = shard_name
    if len(shards) > 1:
        total = sum(math.prod(t.shape) * ELEMENT_BYTES[spec.dtype] for t in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (root / "config.json").write_text(json.dumps(spec.config(), indent=1))
    return root


def iter_matrices(spec: ModelSpec) -> Iterator[TensorSpec]:
    return (t for t in spec.tensors() if t.fill is None)


# --- a synthetic training run (for sweep/trajectory tests and demos) -------------------------------


@dataclass
class RunSpec:
    """A GPT-NeoX-shaped run with known dynamics, one checkpoint per step.

    - step 0 is the Pythia init (recipe A: small_init for qkv/ffn_in, wang_init for o/ffn_out);
    - Transmission sigma grows until `peak_step` (x (1 + growth)) then retreats halfway back;
    - W_qkv turns heavy-tailed over training (a Gaussian scale mixture), so its k falls;
    - the deepest `stagnant` blocks keep their init weights (deep-layer stagnation);
    - `duplicate` = (a, b): step b is written as an exact copy of step a (Pythia issue 205).
    """

    steps: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 4000, 8000)
    n_layers: int = 6
    d_model: int = 128
    n_heads: int = 4
    ffn_size: int = 512
    vocab: int = 512
    peak_step: int = 1000
    growth: float = 1.5
    stagnant: int = 2
    heavy_tail: float = 0.7
    duplicate: tuple[int, int] | None = (4000, 8000)
    seed: int = 0

    def model(self, step: int) -> ModelSpec:
        sigma = pythia_init_sigmas(self.d_model, self.n_layers, "A")
        return ModelSpec(
            family="gpt_neox",
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_kv_heads=self.n_heads,
            ffn_size=self.ffn_size,
            vocab=self.vocab,
            dtype="BF16",
            sigma=sigma,
            seed=self.seed + step,
        )

    def scale(self, step: int) -> float:
        """Transmission sigma multiplier: linear growth to the peak, then a retreat halfway back."""
        if step <= self.peak_step:
            return 1 + self.growth * step / self.peak_step
        last = max(self.steps)
        back = (step - self.peak_step) / max(last - self.peak_step, 1)
        return 1 + self.growth * (1 - 0.5 * back)

    def tail(self, step: int) -> float:
        last = max(self.steps)
        return self.heavy_tail * math.log1p(step) / math.log1p(last)


def write_training_run(root: str | Path, run: RunSpec) -> dict[int, Path]:
    """Write `root/step_<N>` checkpoint folders; returns {step: folder}."""
    import shutil

    root = Path(root)
    folders: dict[int, Path] = {}
    for step in run.steps:
        folder = root / f"step_{step}"
        if run.duplicate and step == run.duplicate[1]:
            # Hard links: the very same files, as a Hub serves one LFS object under two branches.
            shutil.copytree(folders[run.duplicate[0]], folder, dirs_exist_ok=True, copy_function=os.link)
            folders[step] = folder
            continue
        rng = np.random.default_rng(run.seed * 7919 + step)

        def modify(t: TensorSpec, x: np.ndarray, step: int = step, rng: np.random.Generator = rng) -> np.ndarray:
            if step == 0 or t.fill is not None or t.block is None or t.block >= run.n_layers - run.stagnant:
                return x
            if t.kind == "qkv":
                spread = run.tail(step)
                return x * np.exp(spread * rng.standard_normal(x.shape) - spread**2).astype(np.float32)
            if t.kind in PYTHIA_LAMBDA_KINDS:  # the Transmission matrices whose lambda grows
                return x * np.float32(run.scale(step))
            return x

        folders[step] = write_model(folder, run.model(step), modify=modify)
    return folders

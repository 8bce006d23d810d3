"""The quantization cohort of issue 40, made with the formats' own tools where they exist, for MiniLM and AntiBERTy.

Each member quantizes every 2-D weight but the embeddings (and AntiBERTy's MLM decoder, tied to them), as
quantizers leave embeddings and norms:
- GGUF Q8_0, Q5_0, Q5_1, Q4_0, Q4_1 and MXFP4: `gguf` (llama.cpp's gguf-py 0.19) `gguf.quants.quantize`, written
  as a .gguf file by `gguf.GGUFWriter` under the checkpoint's own tensor names (weightdiag decodes it itself);
  the values the model is run with are `gguf.quants.dequantize`'s. gguf 0.19 implements no K-quant, IQ or
  NVFP4 quantizer (NotImplementedError): they are not in the cohort.
- bitsandbytes NF4 and FP4 (blocks of 64): `bitsandbytes.functional.quantize_4bit` / `dequantize_4bit` (0.50.2,
  its CPU backend), stored dequantized (F32 safetensors).
- NVFP4 by NVIDIA's definition as compressed-tensors 0.20 applies it: E2M1 values, an FP8 E4M3 scale per 16
  elements of a row and a per-tensor FP32 global scale 448 x 6 / absmax(W); the group scale is
  absmax(group) / 6 x global, rounded to E4M3; value = e2m1(w / (scale / global)) x (scale / global), stored
  dequantized (F32).
- symmetric absmax integer groups (INT8 per row and per 32, INT4 per 32, 128 and per row) and per-tensor scaled
  FP8 e4m3 (torch's float8_e4m3fn): their reference definitions (benchmarks/forensic_pairs.py), dequantized.

    python benchmarks/quant_cohort.py OUT [--model minilm|antiberty]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import forensic_pairs as fp  # noqa: E402
from tests.diff_checkpoints import write_gguf  # noqa: E402

GGUF = ("Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "MXFP4")
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def nvfp4(w: torch.Tensor) -> torch.Tensor:
    """NVFP4 round trip (see the module docstring)."""
    rows, cols = w.shape
    x = w.double().reshape(rows, cols // 16, 16)
    glob = 448.0 * 6.0 / float(w.abs().max().clamp_min(1e-12))
    scale = (x.abs().amax(dim=-1, keepdim=True) / 6.0 * glob).clamp(max=448.0).float().to(torch.float8_e4m3fn)
    step = scale.double() / glob
    r = (x / torch.where(step > 0, step, 1.0)).abs().clamp(max=6.0)
    code = torch.argmin((r.unsqueeze(-1) - E2M1.double()).abs(), dim=-1)
    return (E2M1.double()[code] * x.sign() * step).reshape(rows, cols).float()


def bnb4(kind: str, blocksize: int = 64) -> Callable[[torch.Tensor], torch.Tensor]:
    def q(w: torch.Tensor) -> torch.Tensor:
        import bitsandbytes.functional as bf

        packed, state = bf.quantize_4bit(w.contiguous(), blocksize=blocksize, quant_type=kind)
        return bf.dequantize_4bit(packed, state).float().reshape(w.shape)

    return q


def fp8(w: torch.Tensor) -> torch.Tensor:
    scale = w.abs().max().clamp_min(1e-12) / 448.0
    return (w / scale).to(torch.float8_e4m3fn).float() * scale


# member -> a round trip of one weight, or the GGUF type made by gguf.quants
MEMBERS: dict[str, str | Callable[[torch.Tensor], torch.Tensor]] = {
    **{f"gguf-{t.lower()}": t for t in GGUF},
    "bnb-nf4": bnb4("nf4"),
    "bnb-fp4": bnb4("fp4"),
    "nvfp4": nvfp4,
    "int8-row": lambda w: fp.quantize_int(w, 8, w.shape[1]),
    "int8-g32": lambda w: fp.quantize_int(w, 8, 32),
    "int4-g32": lambda w: fp.quantize_int(w, 4, 32),
    "int4-g128": lambda w: fp.quantize_int(w, 4, 128),
    "int4-row": lambda w: fp.quantize_int(w, 4, w.shape[1]),
    "fp8-e4m3": fp8,
}


def antiberty_dir() -> Path:
    import antiberty

    return Path(antiberty.__file__).parent / "trained_models" / "AntiBERTy_md_smooth"


def load_base(model: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """The base checkpoint's folder (as shipped) and its tensors."""
    if model == "minilm":
        from safetensors.torch import load_file

        source = fp._script().minilm_dir()
        return source, {k: v.float() for k, v in load_file(str(source / "model.safetensors")).items()}
    source = antiberty_dir()
    return source, torch.load(source / "pytorch_model.bin", map_location="cpu", weights_only=True)


def quantizable(name: str, w: torch.Tensor) -> bool:
    return w.ndim == 2 and w.is_floating_point() and "embeddings" not in name and "predictions.decoder" not in name


def _gguf(path: Path, tensors: dict[str, torch.Tensor], qtype: str) -> dict[str, torch.Tensor]:
    """Write the GGUF file (the suite's writer: gguf-py's own quantizer); the values gguf's own dequantizer gives
    back, the tensors left F32 as they are."""
    # the quantized ones as float32; the rest in their own dtype (AntiBERTy's int64 position_ids stay int64)
    arrays = {name: w.numpy().astype(np.float32) if quantizable(name, w) else w.numpy() for name, w in tensors.items()}
    back = write_gguf(path, arrays, qtype, lambda name, w: quantizable(name, tensors[name]), arch="bert")
    return {name: torch.from_numpy(back[name].astype(np.float32)) if name in back else w for name, w in tensors.items()}


def make(out: Path, model: str, names: list[str] | None = None) -> dict[str, tuple[Path, dict[str, torch.Tensor]]]:
    """Every member's checkpoint under out/<member>/ (a .gguf file, or model.safetensors + config.json): name ->
    (what to diff against the base, the values the model is run with)."""
    from safetensors.torch import save_file

    source, base = load_base(model)
    made = {}
    for name in names or list(MEMBERS):
        how = MEMBERS[name]
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(how, str):
            path = folder / "model.gguf"
            made[name] = (path, _gguf(path, base, how))
            continue
        values = {k: (how(v.float()) if quantizable(k, v) else v.clone()) for k, v in base.items()}  # .bin: shared
        save_file({k: v.contiguous() for k, v in values.items()}, str(folder / "model.safetensors"))
        shutil.copy(source / "config.json", folder / "config.json")
        made[name] = (folder, values)
    return made


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", choices=("minilm", "antiberty"), default="minilm")
    args = parser.parse_args(argv)
    made = make(args.out, args.model)
    print(json.dumps({k: str(p) for k, (p, _) in made.items()}, indent=1))


if __name__ == "__main__":
    main()

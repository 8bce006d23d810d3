"""Fit throughput on quantized checkpoints against the BF16 path, per stored byte, on the same machine.

Writes three checkpoints of the same Llama-shaped matrices (Gaussian, per-kind sigma): BF16; block FP8
(E4M3 codes + a float32 scale per 128x128 block, quant_method fp8, as DeepSeek-V3 ships); and INT4
(compressed-tensors pack-quantized, symmetric, group 128, BF16 scales, as `*-quantized.w4a16` ship).
Each is read once to warm the page cache, then fitted through the API in a fresh process (`--repeat`
times, median), which prints its fit time and peak RSS (VmHWM). Reported: stored bytes/s of each, the
ratio to the BF16 path's, the same for weights/s (the three hold the same weights), and peak RSS against
BF16's, and the fit against `cat` of the same files (interleaved, median): the API fit over the I/O ceiling.

    python benchmarks/bench_quant.py                    # 8 layers: 0.73 GB BF16, 0.37 GB FP8, 0.19 GB INT4
    python benchmarks/bench_quant.py --layers 2 --repeat 1   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

D, KV, FFN = 2048, 512, 5632
SHAPES = {
    "self_attn.q_proj": (D, D),
    "self_attn.k_proj": (KV, D),
    "self_attn.v_proj": (KV, D),
    "self_attn.o_proj": (D, D),
    "mlp.gate_proj": (FFN, D),
    "mlp.up_proj": (FFN, D),
    "mlp.down_proj": (D, FFN),
}
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": D,
    "intermediate_size": FFN,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "tie_word_embeddings": True,
}

CHILD = """
import sys, time
from weightdiag.api import fit_path
from weightdiag.run.measure import FitOptions
start = time.perf_counter()
row = fit_path(sys.argv[1], FitOptions(device="cpu"))
took = time.perf_counter() - start
hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))
print(took, hwm, len(row["matrices"]))
"""


def matrices(layers: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    for i in range(layers):
        for name, shape in SHAPES.items():
            yield f"model.layers.{i}.{name}.weight", torch.randn(shape, generator=gen) * 0.02


def fp8_block(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    tiles = w.reshape(rows // block, block, cols // block, block)
    scale = tiles.abs().amax(dim=(1, 3)) / 448.0
    codes = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn).reshape(rows, cols)
    return codes, scale


def int4_pack(w: torch.Tensor, group: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors pack-quantized, symmetric INT4: q in [-8, 7], stored q + 8, eight per int32 along
    the input dimension, lowest bits first (compressed_tensors pack_to_int32); BF16 scale per group."""
    rows, cols = w.shape
    groups = w.reshape(rows, cols // group, group)
    scale = (groups.abs().amax(dim=2) / 7.5).to(torch.bfloat16)
    q = torch.clamp(torch.round(groups / scale.float()[:, :, None]), -8, 7).to(torch.int64).reshape(rows, cols)
    u = (q + 8).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for j in range(8):
        packed |= u[:, :, j] << (4 * j)
    packed = packed.to(torch.uint32).view(torch.int32) if hasattr(torch, "uint32") else packed.to(torch.int32)
    return packed, scale


def write(root: Path, layers: int) -> dict[str, Path]:
    folders = {name: root / name for name in ("bf16", "fp8", "int4")}
    tensors: dict[str, dict[str, torch.Tensor]] = {name: {} for name in folders}
    for name, w in matrices(layers):
        tensors["bf16"][name] = w.to(torch.bfloat16)
        codes, scale = fp8_block(w)
        tensors["fp8"][name] = codes
        tensors["fp8"][name + "_scale_inv"] = scale
        base = name[: -len(".weight")]
        packed, gscale = int4_pack(w)
        tensors["int4"][base + ".weight_packed"] = packed
        tensors["int4"][base + ".weight_scale"] = gscale
        tensors["int4"][base + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int64)
    configs = {
        "bf16": CONFIG,
        "fp8": {**CONFIG, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
        "int4": {
            **CONFIG,
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": {
                            "num_bits": 4,
                            "type": "int",
                            "symmetric": True,
                            "strategy": "group",
                            "group_size": 128,
                        },
                        "format": "pack-quantized",
                    }
                },
            },
        },
    }
    for name, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors[name], str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(configs[name]))
    return folders


# Children run as on a user's machine, with bytecode caches (a shell that sets PYTHONDONTWRITEBYTECODE would
# make each child compile the quantized formats' modules again, ~20 ms charged to the quantized fits only).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def fit_once(folder: Path) -> tuple[float, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, check=True, env=CHILD_ENV
    )
    took, hwm, _ = out.stdout.split()
    return float(took), int(hwm) * 1024


def cat_seconds(folder: Path) -> float:
    """Seconds for `cat` to copy the checkpoint's shards to /dev/null (from the page cache)."""
    start = time.perf_counter()
    subprocess.run(["cat", *map(str, sorted(folder.glob("*.safetensors")))], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the checkpoints (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench_quant_"))
    folders = write(root, args.layers)
    results = {}
    for name, folder in folders.items():
        stored = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        for p in folder.glob("*.safetensors"):
            p.read_bytes()  # into the page cache
        fit_once(folder)  # warm: bytecode caches, code tables
        runs, cats = [], []
        for _ in range(args.repeat):  # interleaved with `cat` of the same files, the I/O ceiling
            runs.append(fit_once(folder))
            cats.append(cat_seconds(folder))
        seconds = statistics.median(r[0] for r in runs)
        results[name] = {
            "stored_bytes": stored,
            "seconds": seconds,
            "cat_seconds": statistics.median(cats),
            "of_cat": statistics.median(cats) / seconds,
            "runs": [r[0] for r in runs],
            "bytes_per_s": stored / seconds,
            "peak_rss": max(r[1] for r in runs),
        }
    base = results["bf16"]
    print(
        f"{'checkpoint':<10} {'stored MB':>10} {'fit s':>8} {'MB/s':>9} {'vs BF16':>8} "
        f"{'weights/s vs BF16':>18} {'peak RSS MB':>12} {'ΔRSS MB':>8} {'of cat':>7}"
    )
    for name, r in results.items():
        r["ratio_to_bf16"] = r["bytes_per_s"] / base["bytes_per_s"]
        r["rss_over_bf16"] = r["peak_rss"] - base["peak_rss"]
        r["weights_ratio_to_bf16"] = base["seconds"] / r["seconds"]  # the three hold the same weights
        print(
            f"{name:<10} {r['stored_bytes'] / 1e6:>10.1f} {r['seconds']:>8.3f} {r['bytes_per_s'] / 1e6:>9.1f} "
            f"{r['ratio_to_bf16']:>8.2f} {r['weights_ratio_to_bf16']:>18.2f} {r['peak_rss'] / 1e6:>12.1f} "
            f"{r['rss_over_bf16'] / 1e6:>+8.1f} {r['of_cat']:>7.0%}"
        )
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "layers": args.layers,
        "repeat": args.repeat,
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()

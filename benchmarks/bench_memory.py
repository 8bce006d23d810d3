"""Peak memory of `weightdiag fit` where the number and shape of tensors, not their bytes, used to drive it.

Three checkpoints, each one safetensors file (BF16, Gaussian values, Llama-style names):
- `tiny`: 12,000 matrices of 16x16 (7.5 MB): thousands of tensors share each chunk;
- `moe`: an MoE of 18,674 expert matrices of 64x128 (306 MB): 24 layers x 256 experts x gate/up/down,
  plus attention, as DeepSeek-V3-style models carry tens of thousands of small expert matrices;
- `vector`: one 1-D tensor of 128 M BF16 values (256 MB) and a small matrix;
and one GGUF file (local only: the Hub source reads safetensors):
- `gguf`: one Q8_0 matrix of 8192 x 16384 (142 MB stored, 512 MB as float32: the whole-tensor GGUF reader
  held that) and a norm, decoded piece by piece in the stream.
Each is fitted by the CLI in a fresh process (`--no-save`, from the page cache), with the default
threads and with WEIGHTDIAG_THREADS=8, locally and through the loopback Hub (tests/hub_server.py, no
bandwidth cap); the child prints its peak resident memory (VmHWM).

    python benchmarks/bench_memory.py                    # all three, local and Hub
    python benchmarks/bench_memory.py --only tiny --no-hub
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHILD = """
import sys, time
from weightdiag.cli import main
start = time.perf_counter()
try:
    main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
else:
    code = 0
took = time.perf_counter() - start
hwm = next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM'))
print('RESULT', code, took, hwm, file=sys.stderr)
"""

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128}


def _bf16(rows: int, cols: int, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=gen) * 0.02).to(torch.bfloat16)


def write_tiny(folder: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {f"model.layers.{i // 4}.mlp.experts.{i % 4}.down_proj.weight": _bf16(16, 16, gen) for i in range(12000)}
    save_file(tensors, str(folder / "model.safetensors"))


def write_moe(folder: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(24):
        for expert in range(256):
            base = f"model.layers.{layer}.mlp.experts.{expert}"
            tensors[f"{base}.gate_proj.weight"] = _bf16(64, 128, gen)
            tensors[f"{base}.up_proj.weight"] = _bf16(64, 128, gen)
            tensors[f"{base}.down_proj.weight"] = _bf16(128, 64, gen)
    for layer in range(24):  # attention: 18,432 expert matrices + 24 x 10 = 18,672, and two more below
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj"):
            tensors[f"model.layers.{layer}.self_attn.{name}.weight"] = _bf16(128, 128, gen)
        tensors[f"model.layers.{layer}.mlp.shared_experts.up_proj.weight"] = _bf16(64, 128, gen)
        tensors[f"model.layers.{layer}.mlp.shared_experts.down_proj.weight"] = _bf16(128, 64, gen)
    tensors["model.embed_tokens.weight"] = _bf16(512, 128, gen)
    tensors["lm_head.weight"] = _bf16(512, 128, gen)
    save_file(tensors, str(folder / "model.safetensors"))


def write_vector(folder: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    big = (1 + 0.05 * torch.randn(128 << 20, generator=gen)).to(torch.bfloat16)
    tensors = {"model.per_layer_scale.weight": big, "model.layers.0.mlp.down_proj.weight": _bf16(128, 128, gen)}
    save_file(tensors, str(folder / "model.safetensors"))


def write_gguf(folder: Path) -> None:
    import gguf

    rows, cols = 8192, 16384
    rng = np.random.default_rng(0)
    blocks = np.empty((rows, cols // 32, 34), dtype=np.uint8)  # Q8_0: an f16 scale and 32 int8 codes
    blocks[..., :2] = np.array([2**-7], dtype="<f2").view(np.uint8)
    blocks[..., 2:] = rng.integers(0, 256, (rows, cols // 32, 32), dtype=np.uint8)
    writer = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(cols)
    writer.add_tensor("blk.0.ffn_down.weight", blocks.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(cols, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


CHECKPOINTS = {"tiny": write_tiny, "moe": write_moe, "vector": write_vector, "gguf": write_gguf}
LOCAL_ONLY = {"gguf"}


def ensure(root: Path, key: str) -> Path:
    folder = root / key
    if not any(folder.glob("model.*")):
        folder.mkdir(parents=True, exist_ok=True)
        CHECKPOINTS[key](folder)
        if key not in LOCAL_ONLY:
            (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def fit(target: str, env: dict[str, str]) -> tuple[int, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, "fit", target, "--no-save", "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    line = next((x for x in out.stderr.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"fit {target} failed:\n{out.stderr[-2000:]}")
    _, code, took, hwm = line.split()
    return int(code), float(took), int(hwm) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "bench_memory")
    parser.add_argument("--only", choices=sorted(CHECKPOINTS), action="append")
    parser.add_argument("--no-hub", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    keys = args.only or list(CHECKPOINTS)
    base_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "WEIGHTDIAG_THREADS")}
    results = []
    hub = None
    if not args.no_hub:
        from tests.hub_server import FakeHub

        hub = FakeHub().start()
    try:
        for key in keys:
            folder = ensure(args.dir, key)
            for p in folder.iterdir():
                p.read_bytes()  # page cache
            sources = [("local", str(folder), {})]
            if hub is not None and key not in LOCAL_ONLY:
                hub.add_folder(f"bench/{key}", folder)
                home = Path(tempfile.mkdtemp(prefix="bench_memory_hf-"))
                hub_env = {
                    "HF_ENDPOINT": hub.url,
                    "HF_HOME": str(home),
                    "HF_HUB_CACHE": str(home / "hub"),
                    "HF_HUB_DISABLE_TELEMETRY": "1",
                    "HF_HUB_DISABLE_XET": "1",
                    "NO_PROXY": "127.0.0.1,localhost",
                }
                sources.append(("hub", f"bench/{key}", hub_env))
            for where, target, extra in sources:
                for threads in (None, 8):
                    env = {**base_env, **extra, **({"WEIGHTDIAG_THREADS": str(threads)} if threads else {})}
                    code, took, peak = fit(target, env)
                    row = {"checkpoint": key, "source": where, "threads": threads or "default", "exit": code}
                    row |= {"seconds": round(took, 2), "peak_rss_mb": round(peak / 1e6, 1)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if hub is not None:
            hub.stop()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "numpy": np.__version__,
        "torch": torch.__version__,
    }
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()

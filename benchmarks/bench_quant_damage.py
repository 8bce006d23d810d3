"""Validate `weightdiag diff`'s quantization damage score against measured output damage (issue 40).

A cohort of round-trip quantizations of all-MiniLM-L6-v2 (every 2-D weight but the embeddings; by the formats'
reference definitions in benchmarks/forensic_pairs.py: symmetric absmax integer groups, NF4 of Dettmers et al.,
"QLoRA" (2023), per-tensor scaled FP8 through torch's float8 dtypes), each diffed against the base. Output
damage: both models run with transformers on fixed inputs (64 sequences of 32 random token ids, seed 0); the
damage is the mean over sequences of 1 - cosine of the mean-pooled last hidden states (MiniLM is a sentence
embedding model: the cosine is what it is used for). Prints each member's place in both rankings and the
Spearman rank correlation.

    python benchmarks/bench_quant_damage.py [--out DIR]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from benchmarks import forensic_pairs as fp  # noqa: E402
from weightdiag.delta.result import DiffOptions  # noqa: E402
from weightdiag.run.diff import diff  # noqa: E402


def fp8(dtype: torch.dtype, top: float):
    def q(w: torch.Tensor) -> torch.Tensor:
        scale = w.abs().max().clamp_min(1e-12) / top
        return (w / scale).to(dtype).float() * scale

    return q


COHORT = {
    "int8-row": lambda w: fp.quantize_int(w, 8, w.shape[1]),
    "int8-g128": lambda w: fp.quantize_int(w, 8, 128),
    "int8-g32": lambda w: fp.quantize_int(w, 8, 32),
    "fp8-e4m3": fp8(torch.float8_e4m3fn, 448.0),
    "fp8-e5m2": fp8(torch.float8_e5m2, 57344.0),
    "int6-g64": lambda w: fp.quantize_int(w, 6, 64),
    "int5-g32": lambda w: fp.quantize_int(w, 5, 32),
    "int4-g32": lambda w: fp.quantize_int(w, 4, 32),
    "int4-g128": lambda w: fp.quantize_int(w, 4, 128),
    "int4-row": lambda w: fp.quantize_int(w, 4, w.shape[1]),
    "nf4-g64": lambda w: fp.quantize_nf4(w, 64),
    "nf4-g128": lambda w: fp.quantize_nf4(w, 128),
    "int3-g32": lambda w: fp.quantize_int(w, 3, 32),
    "int3-g128": lambda w: fp.quantize_int(w, 3, 128),
    "int2-g32": lambda w: fp.quantize_int(w, 2, 32),
    "int2-g128": lambda w: fp.quantize_int(w, 2, 128),
}


def embed(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state.mean(dim=1)


def main(argv: list[str] | None = None) -> None:
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="quant-cohort-"))
    source = fp._script().minilm_dir()
    base = {k: v.float() for k, v in load_file(str(source / "model.safetensors")).items()}
    fp.write(out / "base", source, base)
    config = BertConfig.from_pretrained(str(source))
    torch.manual_seed(0)
    ids = torch.randint(1000, 20000, (64, 32))

    def model_of(tensors: dict[str, torch.Tensor]) -> BertModel:
        model = BertModel(config)
        model.load_state_dict(tensors, strict=False)
        return model.eval()

    reference = embed(model_of(base), ids)
    print(f"machine: {platform.machine()}, {platform.processor() or platform.platform()}")
    rows = []
    for name, fn in COHORT.items():
        tensors = fp.quantized(base, fn)
        fp.write(out / name, source, tensors)
        got = embed(model_of(tensors), ids)
        measured = float((1 - torch.nn.functional.cosine_similarity(reference, got, dim=1)).mean())
        result = diff(str(out / "base"), str(out / name), DiffOptions(device="cpu"))
        rows.append((name, result.damage["score"], result.damage["sqnr_db"], measured, result.mechanism.verdict))
    by_score = {r[0]: i + 1 for i, r in enumerate(sorted(rows, key=lambda r: r[1]))}
    by_measured = {r[0]: i + 1 for i, r in enumerate(sorted(rows, key=lambda r: r[3]))}
    print("| member | damage score | SQNR dB | rank (score) | 1 - cosine (measured) | rank (measured) | verdict |")
    print("|---|---|---|---|---|---|---|")
    for name, score, sqnr, measured, verdict in sorted(rows, key=lambda r: r[3]):
        ranks = f"{by_score[name]} | {measured:.3g} | {by_measured[name]}"
        print(f"| {name} | {score:.4g} | {sqnr:.1f} | {ranks} | {verdict} |")
    rho = spearmanr([r[1] for r in rows], [r[3] for r in rows]).statistic
    print(f"\n{len(rows)} members; Spearman rank correlation of the damage score with the measured damage: {rho:.3f}")


if __name__ == "__main__":
    main()

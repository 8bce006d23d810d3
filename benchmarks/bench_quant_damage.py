"""Validate `weightdiag diff`'s quantization damage score against measured output damage (issue 40).

The cohort of benchmarks/quant_cohort.py (made with the formats' own tools where they exist: GGUF by gguf-py's
quantizers, written as .gguf files; NF4/FP4 by bitsandbytes; NVFP4, integer groups and FP8 by their reference
definitions), each member diffed against the base as shipped (MiniLM: safetensors F32; AntiBERTy: its
pytorch_model.bin). Output damage, both models run with transformers on fixed inputs:
- MiniLM (a sentence-embedding model): mean over 64 sequences of 32 random token ids (seed 0) of 1 - cosine of
  the mean-pooled last hidden states;
- AntiBERTy (a masked language model of antibody sequences): the MLM head's KL divergence KL(p_base || p_member),
  averaged over every position of 64 sequences of 32 random residues between [CLS] and [SEP] (seed 0).
Prints each member's place in both rankings and the Spearman rank correlation.

    python benchmarks/bench_quant_damage.py [--model minilm|antiberty] [--out DIR]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from benchmarks import quant_cohort as qc  # noqa: E402
from weightdiag.delta.result import DiffOptions  # noqa: E402
from weightdiag.run.diff import diff  # noqa: E402


def inputs(model: str) -> torch.Tensor:
    torch.manual_seed(0)
    if model == "minilm":
        return torch.randint(1000, 20000, (64, 32))
    residues = torch.randint(5, 25, (64, 32))  # AntiBERTy's vocabulary: 5..24 are the 20 amino acids
    return torch.cat([torch.full((64, 1), 2), residues, torch.full((64, 1), 3)], dim=1)  # [CLS] ... [SEP]


def runner(model: str, source: Path):
    """tensors -> the output the damage is measured on."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    config = BertConfig.from_pretrained(str(source))
    ids = inputs(model)

    def run(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        net = (BertModel if model == "minilm" else BertForMaskedLM)(config)
        missing = net.load_state_dict(tensors, strict=False).missing_keys
        assert not [k for k in missing if "position_ids" not in k], missing
        with torch.no_grad():
            if model == "minilm":
                return net.eval()(input_ids=ids).last_hidden_state.mean(dim=1)
            return torch.log_softmax(net.eval()(input_ids=ids).logits.double(), dim=-1)

    return run


def measured(model: str, reference: torch.Tensor, got: torch.Tensor) -> float:
    if model == "minilm":
        return float((1 - torch.nn.functional.cosine_similarity(reference, got, dim=1)).mean())
    return float((reference.exp() * (reference - got)).sum(dim=-1).mean())  # KL(p_base || p_member) per position


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("minilm", "antiberty"), default="minilm")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix=f"quant-cohort-{args.model}-"))
    source, base = qc.load_base(args.model)
    run = runner(args.model, source)
    reference = run(base)
    what = "1 - cosine" if args.model == "minilm" else "MLM KL"
    print(f"machine: {platform.machine()}, {platform.processor() or platform.platform()}; model {args.model}")
    print(f"started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows = []
    for name, (path, values) in qc.make(out, args.model).items():
        damage = measured(args.model, reference, run(values))
        result = diff(str(source), str(path), DiffOptions(device="cpu"))
        kept = result.survival or {}
        outliers = f"{kept.get('outliers_survived')}/{kept.get('outliers')}"
        verdict = result.mechanism.verdict + (
            f" ({result.mechanism.details['format']})" if result.mechanism.details.get("format") else ""
        )
        rows.append((name, result.damage["score"], result.damage["sqnr_db"], damage, verdict, outliers))
    by_score = {r[0]: i + 1 for i, r in enumerate(sorted(rows, key=lambda r: r[1]))}
    by_measured = {r[0]: i + 1 for i, r in enumerate(sorted(rows, key=lambda r: r[3]))}
    print(
        f"| member | damage score | SQNR dB | rank (score) | {what} (measured) | rank (measured) | outliers kept "
        "| verdict |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, score, sqnr, damage, verdict, outliers in sorted(rows, key=lambda r: r[3]):
        ranks = f"{by_score[name]} | {damage:.3g} | {by_measured[name]}"
        print(f"| {name} | {score:.4g} | {sqnr:.1f} | {ranks} | {outliers} | {verdict} |")
    rho = spearmanr([r[1] for r in rows], [r[3] for r in rows]).statistic
    print(f"\n{len(rows)} members; Spearman rank correlation of the damage score with the measured damage: {rho:.3f}")
    print(f"ended {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main()

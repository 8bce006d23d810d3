"""Benchmark the mechanism verdict of `weightdiag diff` (issue 40) on pairs built from MiniLM's and AntiBERTy's
real weights and from a tiny causal LM trained here.

Builds (or reuses) the pairs of benchmarks/forensic_pairs.py, from MiniLM and from AntiBERTy: identical,
re-stored as BF16 and renamed, int8 / int4 / int2 / FP8 / NF4 round trips, rank-4 and rank-16 LoRAs merged into
q, v and the attention output, a 30-step AdamW fine-tune, Gaussian noise on every matrix, and a merge (the mean
of the fine-tune and the rank-16 LoRA). Diffs each against the base and prints:
  - the confusion table (true mechanism x verdict); "right" = the true mechanism or unsure; "wrong" = another
    mechanism named (the acceptance: none);
  - per pair: the verdict, its class counts, the damage score and SQNR, the seconds of the diff;
  - the damage ranking of the quantized pairs;
  - `--export-lora` on the rank-4 LoRA (energy 0.99999: the exported rank, the largest relative error) and on
    the fine-tune (energy 0.9: the smallest energy reached per matrix).

Each model's LoRA and fine-tune are also quantized (int8, int4 in groups of 32, NF4) and diffed against the base:
a changed model's quantized copy, which no one mechanism names (only `unsure` is right: "changed+quantized").

Then the pairs of a tiny causal LM trained here (benchmarks/causal_pairs.py: identical, re-stored as BF16 and
renamed, int8 and int4 round trips, continued pretraining, a GRPO-style RL update, SFT, a merged LoRA, two
merges), and every merge diffed twice: with its parents given (`--parent`) and without; and one null case for
the merge rule, the SFT model given two unrelated parents. `--causal` is repeatable: one set per folder (each
labelled by its folder's name), e.g. a second model trained from another seed (`causal_pairs.py --seed 2`), on
which no threshold was set. The confusion table is printed for all models and for each model apart, with the
mechanisms each model covers.

`--sketch-all` runs every diff with no Gram (the gram_cols knob at 16): every matrix's subspace figures come from
the wide matrices' sketch (delta/wide.py) and ΔW's spectrum from the one-pass sketch, as on a real LLM.

    python benchmarks/bench_forensics.py [--pairs DIR] [--antiberty DIR] [--causal DIR ...] [--steps 30]
        [--causal-only] [--sketch-all]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import causal_pairs, forensic_pairs  # noqa: E402
from weightdiag import tuning  # noqa: E402
from weightdiag.delta.mechanism import VERDICTS  # noqa: E402
from weightdiag.delta.result import DiffOptions  # noqa: E402
from weightdiag.run.diff import diff  # noqa: E402
from weightdiag.run.export_lora import export_lora  # noqa: E402

# A changed model quantized (a LoRA or a fine-tune, then a quantizer's round trip) against the base: no one
# mechanism names it, so only `unsure` is right (`quantized` hides the change, `lora` the rounding)
CHANGED_QUANTIZED = "changed+quantized"
QUANTIZED_CHANGED = (  # (the changed model, forensic_pairs.STORED's quantizer), where the folder has the first
    ("lora-r4", "quant-int8"),
    ("lora-r4", "quant-int4-g32"),
    ("lora-r16", "quant-nf4"),
    ("finetune", "quant-int8"),
    ("lora", "quant-int8"),
    ("lora", "quant-int4-g32"),
    ("sft", "quant-int8"),
)


def quantized_changed(folder: Path) -> list[str]:
    """Write (once) each changed model of `folder` through the quantizers of QUANTIZED_CHANGED; their names."""
    from safetensors.torch import load_file

    made = []
    for source, quantizer in QUANTIZED_CHANGED:
        if not (folder / source / "model.safetensors").exists():
            continue
        name = f"{source}+{quantizer}"
        if not (folder / name / "model.safetensors").exists():
            tensors = load_file(str(folder / source / "model.safetensors"))
            forensic_pairs.write(folder / name, folder / source, forensic_pairs.STORED[quantizer](tensors))
        made.append(name)
    return made


def confusion(rows: list) -> None:
    """The confusion table of `rows` (true mechanism x verdict) and its counts: named, unsure, wrong."""
    table = Counter((expected or "none", verdict) for _, expected, verdict, *_ in rows)
    seen = [v for v in VERDICTS if any(v == verdict for _, _, verdict, *_ in rows)]
    print("| true \\ verdict | " + " | ".join(seen) + " |")
    print("|---|" + "---|" * len(seen))
    for true in dict.fromkeys(expected or "none" for _, expected, *_ in rows):
        print(f"| {true} | " + " | ".join(str(table[(true, v)] or "") for v in seen) + " |")
    named = sum(verdict != "unsure" for _, _, verdict, *_ in rows)
    wrong = sum(verdict not in ("unsure", expected) for _, expected, verdict, *_ in rows)
    print(f"{len(rows)} pairs: {named} named, {len(rows) - named} unsure, {wrong} wrong")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, default=None, help="folder of pairs (built there when missing)")
    parser.add_argument("--antiberty", type=Path, default=None, help="folder of AntiBERTy's pairs (built there)")
    parser.add_argument(
        "--causal",
        type=Path,
        action="append",
        default=None,
        help="folder of a causal LM's pairs (built there with seed 0 when missing; repeatable)",
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--causal-only", action="store_true", help="the causal sets alone (no MiniLM, AntiBERTy)")
    parser.add_argument(
        "--sketch-all",
        action="store_true",
        help="every matrix on the wide path: no Gram (gram_cols 16), its subspaces sketched (delta/wide.py)",
    )
    args = parser.parse_args(argv)
    berts: list[tuple[str, Path]] = []
    if not args.causal_only:
        root = args.pairs or Path(tempfile.mkdtemp(prefix="forensic-pairs-"))
        if not (root / "pairs.json").exists():
            forensic_pairs.build(root, args.steps)
        antiberty = args.antiberty or Path(tempfile.mkdtemp(prefix="antiberty-pairs-"))
        if not (antiberty / "pairs.json").exists():
            forensic_pairs.build(antiberty, args.steps, model="antiberty")
        berts = [("minilm", root), ("antiberty", antiberty)]
    causals = args.causal or [Path(tempfile.mkdtemp(prefix="causal-pairs-"))]
    for causal in causals:
        if not (causal / "pairs.json").exists():
            causal_pairs.build(causal)
    print(f"machine: {platform.machine()}, {platform.processor() or platform.platform()}")
    print(f"mode: {'every matrix sketched (gram_cols 16)' if args.sketch_all else 'as is'}")
    print(f"pairs in {', '.join(str(f) for f in [*(f for _, f in berts), *causals])}")
    # (label, folder of the pairs, derived model, true mechanism, parents given)
    cases: list[tuple[str, Path, str, str | None, list[str]]] = []
    for model, folder in berts:
        for name, expected in json.loads((folder / "pairs.json").read_text()).items():
            cases.append((f"{model} {name}", folder, name, expected, []))
            if name in forensic_pairs.PARENTS:
                cases.append((f"{model} {name} --parent x2", folder, name, expected, forensic_pairs.PARENTS[name]))
    for causal in causals:
        model = causal.name
        for name, (expected, parents) in json.loads((causal / "pairs.json").read_text()).items():
            cases.append((f"{model} {name}", causal, name, expected, []))
            if parents:
                cases.append((f"{model} {name} --parent x2", causal, name, expected, parents))
        cases.append((f"{model} sft --parent cpt --parent rl", causal, "sft", "full_finetune", ["cpt", "rl"]))
    for label, folder in [*berts, *((c.name, c) for c in causals)]:
        for name in quantized_changed(folder):
            cases.append((f"{label} {name}", folder, name, CHANGED_QUANTIZED, []))
    rows = []
    for label, folder, name, expected, parents in cases:
        started = time.perf_counter()
        options = DiffOptions(device="cpu", parents=[str(folder / p) for p in parents])
        with tuning.override(**({"gram_cols": 16} if args.sketch_all else {})):
            result = diff(str(folder / "base"), str(folder / name), options)
        seconds = time.perf_counter() - started
        m = result.mechanism
        rows.append((label, expected, m.verdict, m.details, result.damage, seconds))
    print("\n| pair | true | verdict | right | classes | damage score | SQNR dB | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, expected, verdict, details, damage, seconds in rows:
        right = verdict == "unsure" or verdict == expected
        extra = f" (rank {details['rank']})" if verdict == "lora" else ""
        if verdict == "merge":
            extra = " (" + ", ".join(f"{c:.3g}" for c in details["coefficients"]) + ")"
        if verdict == "quantized" and details.get("format"):
            extra = f" ({details['format']})"
        classes = ", ".join(f"{k} {v}" for k, v in sorted((details.get("classes") or {}).items()))
        score = f"{damage['score']:.3g}" if damage["score"] else "0"
        sqnr = f"{damage['sqnr_db']:.1f}" if damage["sqnr_db"] is not None else "-"
        print(
            f"| {name} | {expected or 'none'} | {verdict}{extra} | {'yes' if right else 'NO'} | {classes} | {score} | "
            f"{sqnr} | {seconds:.1f} |"
        )
    print("\nconfusion, all models (rows: true mechanism, columns: verdict)")
    confusion(rows)
    models = list(dict.fromkeys(label.split()[0] for label, *_ in rows))
    for model in models:
        mine = [r for r in rows if r[0].split()[0] == model]
        covered = [m for m in VERDICTS if any(r[1] == m for r in mine)]
        print(f"\n{model}: {len(covered)} mechanisms ({', '.join(covered)})")
        confusion(mine)
    if not berts:
        return
    root = berts[0][1]
    quant = sorted((r for r in rows if r[1] == "quantized" and r[0].startswith("minilm")), key=lambda r: r[4]["score"])
    print("damage ranking (least first): " + ", ".join(f"{r[0]} {r[4]['score']:.3g}" for r in quant))
    for name, energy in (("lora-r4", 0.99999), ("finetune", 0.9)):
        out = Path(tempfile.mkdtemp()) / "adapter"
        started = time.perf_counter()
        report = export_lora(str(root / "base"), str(root / name), out, energy=energy)
        seconds = time.perf_counter() - started
        ranks = sorted(m["rank"] for m in report["modules"])
        reached = min(m["energy"] for m in report["modules"])
        print(
            f"--export-lora {name} --energy {energy}: {len(ranks)} modules, ranks {ranks[0]}-{ranks[-1]} "
            f"(median {ranks[len(ranks) // 2]}), "
            f"smallest energy held {reached:.6f}, largest relative error {report['max_relative_error']:.3g}, "
            f"{seconds:.1f} s"
        )
        shutil.rmtree(out.parent)


if __name__ == "__main__":
    main()

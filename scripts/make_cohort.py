#!/usr/bin/env python3
"""Generate the shipped cohort rows from the paper's released CSVs.

    python scripts/make_cohort.py [--reference ../shared/reference]

Reads DATABASE_v9_1.csv (the 12-entry cohort) and DATABASE_v9_1_qwen_cohort.csv (the 11-entry
Qwen companion) and writes one row per entry, in the same schema family as fitted rows
(`weightdiag.row/1`, model.source = "cohort"), to weightdiag/data/cohort/{v9_1,qwen}/ (shipped
with the package; DATABASE/cohort links there). Each file carries its provenance and the
CC BY 4.0 attribution. Deterministic: rerunning on the same CSVs rewrites identical files.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from weightdiag.diagnose.classes import k_class, k_flags  # noqa: E402
from weightdiag.diagnose.lambda_axis import Hyperparameters  # noqa: E402
from weightdiag.vocabulary import kind_class  # noqa: E402

OUT = REPO / "weightdiag" / "data" / "cohort"
# The kinds read from DATABASE_v9_1.csv, in the order the shipped cohort JSON lists them.
KINDS = ("qkv", "o", "ffn_in", "ffn_out", "q", "k", "v", "gate", "up", "down")

ATTRIBUTION = {
    "license": "CC BY 4.0",
    "copyright": "(c) 2026 Tiexin Ding",
    "paper": "T. Ding, A Two-Parameter Weibull Framework for Diagnosing Transformer Weight Distributions, "
    "arXiv:2605.18898 (2026)",
    "source": "github.com/tiexinding/NPM-Weibull-public, folder database_v9_1/",
    "changes": "converted from CSV to weightdiag rows by scripts/make_cohort.py; values unchanged",
}

# Hub repositories of the cohort (paper App. B.2) and published architecture facts the CSV leaves out.
V9_1_MODELS = {
    "pythia-70m": ("EleutherAI/pythia-70m", {"n_layers": 6, "d_model": 512, "n_heads": 8, "family": "gpt_neox"}),
    "pythia-160m": ("EleutherAI/pythia-160m", {"n_layers": 12, "d_model": 768, "n_heads": 12, "family": "gpt_neox"}),
    "pythia-410m": ("EleutherAI/pythia-410m", {"n_layers": 24, "d_model": 1024, "n_heads": 16, "family": "gpt_neox"}),
    "pythia-1b": ("EleutherAI/pythia-1b", {"n_layers": 16, "d_model": 2048, "n_heads": 8, "family": "gpt_neox"}),
    "pythia-6.9b": ("EleutherAI/pythia-6.9b", {"n_layers": 32, "d_model": 4096, "n_heads": 32, "family": "gpt_neox"}),
    "olmo-1-7b": ("allenai/OLMo-7B", {"n_layers": 32, "d_model": 4096, "family": "olmo"}),
    "olmo-2-7b": ("allenai/OLMo-2-1124-7B", {"n_layers": 32, "d_model": 4096, "family": "olmo2"}),
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", {"n_layers": 32, "d_model": 4096, "family": "llama"}),
    "mistral-7b": ("mistralai/Mistral-7B-v0.1", {"n_layers": 32, "d_model": 4096, "family": "mistral"}),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", {"n_layers": 28, "d_model": 3584, "family": "qwen2"}),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B", {"n_layers": 48, "d_model": 5120, "family": "qwen2"}),
    "qwen3-8b": ("Qwen/Qwen3-8B", {"n_layers": 36, "d_model": 4096, "family": "qwen3"}),
}


def _float(value: str) -> float | None:
    return float(value) if value not in ("", None) else None


def _attention(arch: str, n_q: int | None, n_kv: int | None) -> str:
    if arch == "MHA-merged":
        return "MHA (fused qkv)"
    if arch == "MHA-separate":
        return "MHA"
    if arch.startswith("GQA-"):
        return "GQA " + arch.split("-", 1)[1]
    return arch


def _kind_summary(kind: str, k: float, lam: float, r2: float | None, below: str | None) -> dict[str, object]:
    _, total = (int(x) for x in below.split("/")) if below else (None, None)
    axis = kind_class(kind) in ("selection", "transmission")
    return {
        "class": kind_class(kind),
        "count": total,
        "fitted": total,
        "k_median": k,
        "lambda_median": lam,
        "r2_median": r2,
        "r2_below_95": int(below.split("/")[0]) if below else None,  # the CSV's "a/b": a of b fitted
        "k_min": None,
        "k_max": None,
        "k_class": k_class(k, r2) if axis else None,
        "flags": k_flags(k) if axis else [],
    }


def _provenance(csv_path: Path, line: int) -> dict[str, object]:
    return {
        **ATTRIBUTION,
        "file": csv_path.name,
        "file_sha256": hashlib.sha256(csv_path.read_bytes()).hexdigest(),
        "line": line,
    }


def _base_row(entry: str, cohort: str, provenance: dict[str, object]) -> dict[str, object]:
    return {
        "schema": "weightdiag.row/1",
        "model": {"id": entry, "source": "cohort", "cohort": cohort, "location": None, "revision": None,
                  "commit": None, "fingerprint": None, "format": "summary"},
        "files": [],
        "metadata": {},
        "protocol": {"name": "hist1024", "trim": "mid80", "trims": ["mid80"], "bins": 1024,
                     "log10_range": [-12.0, 2.0]},
        "tool": {"name": "weightdiag", "version": None},
        "created": None,
        "run": None,
        "provenance": provenance,
        "part_kinds": {},
        "matrices": [],
        "vectors": [],
        "skipped": [],
        "unclassified": [],
        "notes": ["per-kind medians only: the paper released no per-matrix data"],
    }


def v9_1_rows(csv_path: Path) -> list[dict[str, object]]:
    rows = []
    with open(csv_path, newline="") as f:
        for line, rec in enumerate(csv.DictReader(f), start=2):
            entry = rec["entry_id"]
            repo, facts = V9_1_MODELS[entry]
            n_q, n_kv = (int(rec[c]) if rec[c] else None for c in ("n_q", "n_kv"))
            if n_q is None and "n_heads" in facts:
                n_q = n_kv = int(facts["n_heads"])
            row = _base_row(entry, "DATABASE_v9_1", _provenance(csv_path, line))
            row["model"].update({"hub_repo": repo, "family_name": rec["family"], "size": rec["size"]})
            row["architecture"] = {
                "family": facts["family"],
                "n_layers": facts.get("n_layers"),
                "d_model": facts.get("d_model"),
                "n_heads": n_q,
                "n_kv_heads": n_kv,
                "qk_norm": rec["qk_norm"] == "True",
                "fused_qkv": rec["arch"] == "MHA-merged",
                "attention": _attention(rec["arch"], n_q, n_kv),
                "arch_label": rec["arch"],
                "sources": ["DATABASE_v9_1.csv", "published configs"],
            }
            hp = Hyperparameters(_float(rec["eta_peak"]), _float(rec["lambda_wd"]), _float(rec["T_steps"]),
                                 source="DATABASE_v9_1.csv")
            row["hyperparameters"] = {
                **hp.to_json(),
                "training_tokens": rec["training_tokens"],
                "confidence": rec["hp_confidence"],
                "reported": {"tau_iter": _float(rec["tau_iter"]), "T_over_tau": _float(rec["T_over_tau"]),
                             "Physical_State": rec["Physical_State"]},
            }
            row["kinds"] = {
                kind: _kind_summary(kind, float(rec[f"k_median_{kind}"]), float(rec[f"lambda_median_{kind}"]),
                                    _float(rec[f"R2_median_{kind}"]), rec[f"R2_below_95_{kind}"] or None)
                for kind in KINDS if rec.get(f"k_median_{kind}")
            }
            row["n_records"] = int(rec["n_records"])
            rows.append(row)
    return rows


def qwen_rows(csv_path: Path) -> list[dict[str, object]]:
    rows = []
    with open(csv_path, newline="") as f:
        for line, rec in enumerate(csv.DictReader(f), start=2):
            entry = rec["entry_id"]
            row = _base_row(entry, "DATABASE_v9_1_qwen_cohort", _provenance(csv_path, line))
            row["model"].update({"hub_repo": f"Qwen/{entry.removesuffix('-base')}", "family_name": rec["family"],
                                 "size": rec["size"]})
            row["architecture"] = {"family": "qwen3" if rec["family"] == "Qwen3" else "qwen2",
                                   "n_layers": int(rec["n_layers"]), "sources": ["DATABASE_v9_1_qwen_cohort.csv"]}
            row["hyperparameters"] = {"training_tokens": rec["tokens"], "math_continued_pretraining":
                                      rec["math_cpt"] == "True"}
            row["kinds"] = {
                kind: _kind_summary(kind, float(rec[f"k_median_{kind}"]), float(rec[f"lambda_median_{kind}"]),
                                    None, None)
                for kind in ("q", "k", "v", "o", "gate", "up", "down")
            }
            row["shallow_ffn"] = {
                "regime": rec["regime"],
                "shallow_median_k_gate": float(rec["shallow_median_k_gate"]),
                "shallow_min_k": float(rec["shallow_min_k"]),
                "deep_median_k_gate": float(rec["deep_median_k_gate"]),
                "definition": "blocks 0-5 (shallow) vs blocks >= 10 (deep); regime A: min block k over "
                "gate/up/down in blocks 0-5 >= 1.0, regime B: that minimum <= 0.7",
            }
            rows.append(row)
    return rows


def write(rows: list[dict[str, object]], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    for row in rows:
        path = folder / f"{row['model']['id']}.json"
        path.write_text(json.dumps(row, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, default=REPO.parent / "shared" / "reference")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    write(v9_1_rows(args.reference / "DATABASE_v9_1.csv"), args.out / "v9_1")
    write(qwen_rows(args.reference / "DATABASE_v9_1_qwen_cohort.csv"), args.out / "qwen")
    print(f"wrote {len(list((args.out / 'v9_1').glob('*.json')))} + {len(list((args.out / 'qwen').glob('*.json')))} "
          f"cohort rows to {args.out}")


if __name__ == "__main__":
    main()

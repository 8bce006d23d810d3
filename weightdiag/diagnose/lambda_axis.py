"""The lambda axis: training progress as T/tau = T * eta * lambda_wd and its four states.

tau_iter = 1 / (eta * lambda_wd) is AdamW's characteristic timescale (Wang & Aitchison 2024,
Fan et al. 2025, as used in the paper's Sec. 4.2 and App. A.5); T/tau counts how many of them a
run lasted. State cuts (this tool's, fitted to the paper's cohort labels): Saturated >= 1.2,
Near-saturated [0.8, 1.2), Approaching [0.25, 0.8), Transition < 0.25. They reproduce the paper's
Pythia states: 70m 1.43 Saturated, 160m 0.858 Near-saturated, 410m/1B 0.429 Approaching,
6.9B 0.172 Transition.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

STATE_CUTS = ((1.2, "Saturated"), (0.8, "Near-saturated"), (0.25, "Approaching"))
TRANSITION = "Transition"
UNKNOWN = "unknown"

# Training recipes of the cohort families (paper Table 4; Pythia from the GPT-NeoX configs).
PRESETS: dict[str, dict[str, float]] = {
    "pythia-70m": {"lr": 1e-3, "weight_decay": 0.01, "steps": 143_000},
    "pythia-160m": {"lr": 6e-4, "weight_decay": 0.01, "steps": 143_000},
    "pythia-410m": {"lr": 3e-4, "weight_decay": 0.01, "steps": 143_000},
    "pythia-1b": {"lr": 3e-4, "weight_decay": 0.01, "steps": 143_000},
    "pythia-1.4b": {"lr": 2e-4, "weight_decay": 0.01, "steps": 143_000},
    "pythia-2.8b": {"lr": 1.6e-4, "weight_decay": 0.01, "steps": 143_000},
    "pythia-6.9b": {"lr": 1.2e-4, "weight_decay": 0.01, "steps": 143_000},
    "pythia-12b": {"lr": 1.2e-4, "weight_decay": 0.01, "steps": 143_000},
    "olmo-1-7b": {"lr": 3e-4, "weight_decay": 0.1, "steps": 477_000},
    "olmo-2-7b": {"lr": 3e-4, "weight_decay": 0.1, "steps": 480_000},
    "llama-3-8b": {"lr": 3e-4, "weight_decay": 0.1, "steps": 1_000_000},
    "mistral-7b": {"lr": 3e-4, "weight_decay": 0.1, "steps": 500_000},
    "qwen2.5-7b": {"lr": 3e-4, "weight_decay": 0.1, "steps": 1_100_000},
    "qwen2.5-14b": {"lr": 3e-4, "weight_decay": 0.1, "steps": 1_100_000},
    "qwen3-8b": {"lr": 5e-4, "weight_decay": 0.1, "steps": 2_200_000},
}

_STEP = re.compile(r"^(?:step|global_step|checkpoint-|step_|step-)(\d+)$")
_PYTHIA = re.compile(r"pythia-(\d+(?:\.\d+)?[mb])(?:-deduped)?", re.IGNORECASE)


def t_over_tau(steps: float, lr: float, weight_decay: float) -> float:
    return steps * lr * weight_decay


def state_of(ratio: float | None) -> str:
    if ratio is None:
        return UNKNOWN
    for cut, name in STATE_CUTS:
        if ratio >= cut:
            return name
    return TRANSITION


def step_from_revision(revision: str | None) -> int | None:
    """Training step of revisions named like Pythia's `step3000` (or `checkpoint-3000`, `step_3000`)."""
    match = _STEP.match(revision or "")
    return int(match.group(1)) if match else None


def preset_for(model_id: str) -> str | None:
    """The preset matching a model id, e.g. EleutherAI/pythia-410m-deduped -> pythia-410m."""
    match = _PYTHIA.search(model_id)
    if match:
        key = f"pythia-{match.group(1).lower()}"
        return key if key in PRESETS else None
    return None


@dataclass
class Hyperparameters:
    lr: float | None = None
    weight_decay: float | None = None
    steps: float | None = None
    source: str = "unknown"  # given | preset:<name> | preset:<name> + step from revision

    @property
    def t_over_tau(self) -> float | None:
        if self.lr is None or self.weight_decay is None or self.steps is None:
            return None
        return t_over_tau(self.steps, self.lr, self.weight_decay)

    @property
    def tau_iter(self) -> float | None:
        if not self.lr or not self.weight_decay:
            return None
        return 1.0 / (self.lr * self.weight_decay)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = asdict(self)
        ratio = self.t_over_tau
        out.update({"tau_iter": self.tau_iter, "t_over_tau": ratio, "state": state_of(ratio)})
        return out


def check_preset(preset: str | None) -> None:
    """An unknown --preset is the user's input (exit 2)."""
    if preset and preset not in PRESETS:
        from ..errors import OptionError, param

        raise OptionError(f"{param('preset')} {preset!r}: unknown; choose one of {', '.join(PRESETS)}", param="preset")


def resolve(
    model_id: str,
    revision: str | None = None,
    *,
    lr: float | None = None,
    weight_decay: float | None = None,
    steps: float | None = None,
    preset: str | None = None,
) -> Hyperparameters:
    """Explicit values win; then a preset (named, or recognised from the model id); the step of a
    `step*` revision replaces the preset's final step count."""
    name = preset or preset_for(model_id)
    check_preset(preset)
    base = PRESETS.get(name or "", {})
    step = step_from_revision(revision)
    hp = Hyperparameters(
        lr=lr if lr is not None else base.get("lr"),
        weight_decay=weight_decay if weight_decay is not None else base.get("weight_decay"),
        steps=steps if steps is not None else (step if step is not None else base.get("steps")),
    )
    parts = []
    if any(v is not None for v in (lr, weight_decay, steps)):
        parts.append("given")
    if base:
        parts.append(f"preset:{name}")
    if step is not None and steps is None:
        parts.append(f"step {step} from the revision")
    hp.source = " + ".join(parts) or "unknown"
    return hp

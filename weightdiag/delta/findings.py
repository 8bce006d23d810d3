"""Verdicts per matrix, summaries per block and kind, and the findings a diff reports (pure).

Thresholds, each tested on a planted case and on a null pair (small full-rank noise everywhere, as a full
fine-tune leaves):
- untouched: ΔW exactly 0 (every element equal in value).
- low rank ("LoRA-like"): rank90 <= LOW_RANK_SHARE of min(m, n) and <= LOW_RANK_MAX, on a matrix at least
  MIN_SIDE on each side. Full fine-tunes need rank90 in the thousands for 7B models ("LoRA Learns Less and
  Forgets Less", Biderman et al. 2024); noise needs more than half of min(m, n).
- scaled: ΔW points along W_base (alignment <ΔW, W_base> / (||ΔW|| ||W_base||) >= SCALED_ALIGNMENT):
  W_tuned ≈ c W_base. Cosine(W_base, W_tuned) is then 1 while relative_change = |c - 1| > 0. Noise gives an
  alignment near 0; BF16 rounding of c W leaves it above 0.98 for |c - 1| >= 2%.
- frozen blocks: every tensor of a block untouched while other blocks changed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from .result import Finding, GroupSummary, TensorDiff

LOW_RANK_SHARE = 0.1
LOW_RANK_MAX = 64
MIN_SIDE = 16
SCALED_ALIGNMENT = 0.98
CHANGED_MOST = 3  # blocks named as changed most
EMBEDDING_KINDS = ("embed", "unembed")


def is_low_rank(shape2d: tuple[int, int], rank90: int | None, relative_change: float) -> bool:
    side = min(shape2d)
    if rank90 is None or relative_change <= 0 or side < MIN_SIDE:
        return False
    return 0 < rank90 <= min(LOW_RANK_MAX, LOW_RANK_SHARE * side)


def is_scaled(alignment: float | None, relative_change: float) -> bool:
    return relative_change > 0 and alignment is not None and abs(alignment) >= SCALED_ALIGNMENT


def summarize(items: Sequence[TensorDiff], key: Callable[[TensorDiff], str | None]) -> list[GroupSummary]:
    groups: dict[str, list[TensorDiff]] = {}
    for item in items:
        k = key(item)
        if k is not None:
            groups.setdefault(k, []).append(item)
    out = []
    for k, members in groups.items():
        d2 = sum(m.figures.delta_norm**2 for m in members)
        b2 = sum(m.figures.base_norm**2 for m in members)
        numel = sum(m.figures.numel for m in members)
        unchanged = sum(m.figures.unchanged_fraction * m.figures.numel for m in members)
        out.append(
            GroupSummary(
                key=k,
                matrices=len(members),
                relative_change=math.sqrt(d2 / b2) if b2 > 0 else (0.0 if d2 == 0 else math.inf),
                max_relative_change=max(m.relative_change for m in members),
                untouched=sum(m.untouched for m in members),
                unchanged_fraction=unchanged / numel if numel else 1.0,
                low_rank=sum(m.low_rank for m in members),
            )
        )
    return out


def block_key(item: TensorDiff) -> str | None:
    return f"block {item.block}" if item.block is not None else None


def find(
    matrices: Sequence[TensorDiff], vectors: Sequence[TensorDiff], blocks: Sequence[GroupSummary]
) -> list[Finding]:
    """What a reader should know first, each with its evidence."""
    out: list[Finding] = []
    everything = [*matrices, *vectors]
    if everything and all(t.untouched for t in everything):
        out.append(Finding("nothing-changed", f"nothing changed: all {len(everything)} paired tensors are identical"))
        return out
    # Blocks that changed most, against the median block.
    changed = sorted(blocks, key=lambda b: -b.relative_change)
    if len(blocks) >= 2:
        median = statistics.median(b.relative_change for b in blocks)
        top = [b for b in changed[:CHANGED_MOST] if b.relative_change > 0]
        if top:
            described = ", ".join(f"{b.key} ({b.relative_change:.3g})" for b in top)
            out.append(
                Finding(
                    "changed-most",
                    f"changed most: {described}; median block {median:.3g}",
                    tuple(b.key for b in top),
                    {"median_block_relative_change": median, **{b.key: b.relative_change for b in top}},
                )
            )
    # Frozen blocks: every tensor of the block untouched.
    by_block: dict[int, list[TensorDiff]] = {}
    for t in everything:
        if t.block is not None:
            by_block.setdefault(t.block, []).append(t)
    frozen = sorted(b for b, members in by_block.items() if all(m.untouched for m in members))
    if frozen and len(frozen) < len(by_block):
        out.append(
            Finding(
                "frozen-blocks",
                f"frozen: block{'s' if len(frozen) > 1 else ''} {_ranges(frozen)} unchanged, every tensor bit for bit",
                tuple(f"block {b}" for b in frozen),
                {"blocks": frozen, "tensors": sum(len(by_block[b]) for b in frozen)},
            )
        )
    untouched = [m.name for m in matrices if m.untouched and (m.block is None or m.block not in frozen)]
    if untouched:
        out.append(
            Finding(
                "untouched",
                f"{len(untouched)} matri{'ces' if len(untouched) > 1 else 'x'} outside frozen blocks unchanged: "
                f"{_names(untouched)}",
                tuple(untouched),
            )
        )
    low = [m for m in matrices if m.low_rank]
    if low:
        ranks = sorted({m.rank90 for m in low if m.rank90 is not None})
        out.append(
            Finding(
                "low-rank",
                f"low rank (LoRA-like): {len(low)} of {len(matrices)} matrices changed at rank90 "
                f"{_ranges(ranks) if len(ranks) <= 3 else f'{ranks[0]}-{ranks[-1]}'}: {_names([m.name for m in low])}",
                tuple(m.name for m in low),
                {m.name: {"rank90": m.rank90, "shape": list(m.shape)} for m in low},
            )
        )
    scaled = [m for m in matrices if m.scaled]
    if scaled:
        out.append(
            Finding(
                "scaled",
                "scaled: "
                + ", ".join(f"{m.name} x{m.figures.scale:.4g}" for m in scaled[:5])
                + (f" and {len(scaled) - 5} more" if len(scaled) > 5 else "")
                + " (ΔW along W: cosine 1, relative change > 0)",
                tuple(m.name for m in scaled),
                {m.name: {"scale": m.figures.scale, "alignment": m.figures.alignment} for m in scaled},
            )
        )
    emb = [m for m in matrices if m.kind in EMBEDDING_KINDS]
    if emb:
        others = [
            m.relative_change for m in matrices if m.kind not in EMBEDDING_KINDS and math.isfinite(m.relative_change)
        ]
        median = statistics.median(others) if others else float("nan")
        out.append(
            Finding(
                "embeddings",
                "embeddings and heads: "
                + ", ".join(f"{m.name} {m.relative_change:.3g}" for m in emb)
                + f" (median of the other matrices {median:.3g})",
                tuple(m.name for m in emb),
                {m.name: m.relative_change for m in emb} | {"median_other": median},
            )
        )
    return out


def _names(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if v is not None:
            start = prev = v
    return ", ".join(parts)

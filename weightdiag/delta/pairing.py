"""Match the tensors of two checkpoints: by name, else by a name that differs only by a leading prefix
(`bert.encoder...` against `encoder...`, `model.layers...` against `layers...`), else by the layout's role
(block, kind, parameter: `model.layers.0.self_attn.q_proj.weight` against Meta's `layers.0.attention.wq.weight`)
when that role is held by one tensor on each side; shapes checked.

Pure: two tensor tables in, a `Pairing` out. A quantized weight is matched by its logical name and shape
(weightdiag.decode.group has already turned codes + companions into one logical TensorRef).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..source.plan import TensorRef


@dataclass(frozen=True)
class Pair:
    name: str  # the base side's name
    base: TensorRef
    tuned: TensorRef

    @property
    def renamed(self) -> bool:
        return self.base.name != self.tuned.name


@dataclass
class Pairing:
    pairs: list[Pair] = field(default_factory=list)
    only_base: list[str] = field(default_factory=list)
    only_tuned: list[str] = field(default_factory=list)
    shape_mismatches: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # paired but not comparable (dtype)


def _readable(ref: TensorRef) -> bool:
    """Values weightdiag can compare: a float dtype it reads, or a quantized weight it decodes."""
    return ref.quant is not None or ref.dtype.fittable


def pair_tensors(base: Sequence[TensorRef], tuned: Sequence[TensorRef]) -> Pairing:
    """Pairs in the base checkpoint's order; what only one side has, and shape mismatches, listed."""
    out = Pairing()
    tuned_by_name = {t.name: t for t in tuned}
    matched: dict[str, TensorRef] = {}
    unmatched: list[TensorRef] = []
    for ref in base:
        other = tuned_by_name.get(ref.name)
        if other is None:
            unmatched.append(ref)
        else:
            matched[ref.name] = other
    left = {name: t for name, t in tuned_by_name.items() if name not in {m.name for m in matched.values()}}
    renames = _by_suffix(unmatched, left)
    taken = {t.name for t in renames.values()}
    renames |= _by_role([r for r in unmatched if r.name not in renames], [t for n, t in left.items() if n not in taken])
    used: set[str] = set()
    for ref in base:
        other = matched.get(ref.name) or renames.get(ref.name)
        if other is None:
            out.only_base.append(ref.name)
            continue
        used.add(other.name)
        if tuple(ref.shape) != tuple(other.shape):
            out.shape_mismatches.append(
                {"name": ref.name, "tuned_name": other.name, "base": list(ref.shape), "tuned": list(other.shape)}
            )
            continue
        if ref.numel == 0:
            out.skipped.append({"name": ref.name, "reason": "empty tensor"})
            continue
        if not (_readable(ref) and _readable(other)):
            odd = ref if not _readable(ref) else other
            out.skipped.append({"name": ref.name, "reason": f"dtype {odd.dtype.name} is not compared"})
            continue
        out.pairs.append(Pair(ref.name, ref, other))
    out.only_tuned = [t.name for t in tuned if t.name not in used]
    return out


def _by_suffix(unmatched: list[TensorRef], left: dict[str, TensorRef]) -> dict[str, TensorRef]:
    """Names equal once one side's leading dotted components are dropped, and only one way."""

    def tails(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[i:]) for i in range(len(parts) - 1)]  # longest first, at least two components

    index: dict[str, list[TensorRef]] = {}
    for ref in left.values():
        for tail in tails(ref.name):
            index.setdefault(tail, []).append(ref)
    found: dict[str, TensorRef] = {}
    taken: set[str] = set()
    for ref in unmatched:
        for tail in tails(ref.name):
            candidates = [c for c in index.get(tail, []) if c.name not in taken]
            if len(candidates) == 1:
                found[ref.name] = candidates[0]
                taken.add(candidates[0].name)
                break
    return found


def _by_role(unmatched: list[TensorRef], left: list[TensorRef]) -> dict[str, TensorRef]:
    """Pairs of tensors that are the only holders of one layout role (kind, block, expert, parameter, site)
    on each side; `other` (unrecognised) never pairs this way."""
    from ..layout import classify_tensor

    def key(ref: TensorRef) -> tuple | None:
        role = classify_tensor(ref.name, tuple(ref.shape))
        if role.kind == "other" or role.tower:
            return None
        return role.kind, role.block, role.expert, role.param, role.of_kind, role.site

    def unique(refs: list[TensorRef]) -> dict[tuple, TensorRef]:
        seen: dict[tuple, list[TensorRef]] = {}
        for ref in refs:
            k = key(ref)
            if k is not None:
                seen.setdefault(k, []).append(ref)
        return {k: v[0] for k, v in seen.items() if len(v) == 1}

    ours, theirs = unique(unmatched), unique(left)
    return {ref.name: theirs[k] for k, ref in ours.items() if k in theirs}

"""A model's relatives by lineage among the database's rows (pure; docs/lineage.md): what `compare` names beside
its nearest by statistics and what `report` says of a copy. From lineage's judgements (diagnose.lineage): only
`derived` references are relatives; a copy is one whose sampled weights are the same (to the rounding of a
re-stored dtype) or the same values permuted. Independent rows are never named: the null says nothing."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .lineage import Judgement

TOP = 3  # relatives named


def is_copy(judged: Judgement) -> bool:
    """Derived, with the same weights (median relative change under lineage's SAME_WEIGHTS) or the same values at
    other positions (a permuted copy)."""
    same = ("same weights", "permuted: the same values")
    return judged.verdict == "derived" and any(r.startswith(same) for r in judged.relation)


def relatives(judgements: Iterable[Judgement], top: int = TOP) -> list[dict[str, Any]]:
    """The derived references, strongest evidence first (judge_all's order), at most `top`."""
    out = []
    for judged in judgements:
        if judged.verdict != "derived":
            continue
        out.append(
            {
                "reference": judged.reference,
                "log10_p": None if judged.log10_p is None else round(judged.log10_p, 2),
                "copy": is_copy(judged),
                "relation": judged.relation,
            }
        )
        if len(out) >= top:
            break
    return out


def describe(found: dict[str, Any]) -> str:
    """One line: the row and the relation, with the p-value against independent initialisations."""
    p = "" if found["log10_p"] is None else f"p = 1e{found['log10_p']:.0f}"
    what = "a copy of" if found["copy"] else "derived from"
    relation = "; ".join(found["relation"])
    return f"{what} {found['reference']} ({'; '.join(x for x in (relation, p) if x)})"

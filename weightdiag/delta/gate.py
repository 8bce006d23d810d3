"""The CI gate of `diff --fail-above X`: which selected matrices changed by more than X (exit 1 if any).

"This fine-tune must not touch blocks 0-3": --blocks 0-3 --fail-above 0. "Nothing changed": --fail-above 0.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import OptionError, param
from .result import DiffResult, TensorDiff


@dataclass(frozen=True)
class GateResult:
    threshold: float
    checked: int
    failed: list[TensorDiff] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failed

    def to_json(self) -> dict:
        return {
            "threshold": self.threshold,
            "checked": self.checked,
            "passed": self.passed,
            "failed": [{"name": t.name, "relative_change": t.relative_change} for t in self.failed],
        }


def parse_blocks(text: str | None) -> set[int] | None:
    """'0-3,7' -> {0, 1, 2, 3, 7}; None -> every block."""
    if text is None:
        return None
    out: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise OptionError(
            f"{param('blocks')} {text!r}: give block numbers and ranges, e.g. 0-3,7", param="blocks"
        ) from None
    return out


def gate(result: DiffResult, threshold: float, globs: Sequence[str] = (), blocks: set[int] | None = None) -> GateResult:
    """Matrices and vectors matching a glob (any when none) and in `blocks` (any when None), over `threshold`."""
    if not threshold >= 0:
        raise OptionError(f"{param('fail_above')} {threshold}: give a relative change >= 0", param="fail_above")
    chosen = [
        t
        for t in [*result.matrices, *result.vectors]
        if (not globs or any(fnmatch.fnmatchcase(t.name, g) for g in globs)) and (blocks is None or t.block in blocks)
    ]
    if not chosen:
        raise OptionError(
            f"{param('fail_above')}: no compared tensor is in the {param('blocks')} selection", param="blocks"
        )
    failed = [t for t in chosen if not t.relative_change <= threshold]  # NaN/inf fail too
    return GateResult(threshold, len(chosen), failed)

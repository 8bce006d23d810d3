"""`diff BASE TUNED --parent P1 --parent P2`: the figures delta/merge.py fits the tuned's change with.

Every squared difference norm it needs is a `diff`'s exact delta_norm, so the parents are read by the diff itself
(without the spectrum: local, Hub and Ray alike, memory bounded as any diff): base against each parent, the tuned
against each parent, and the parents two by two; base against tuned is the diff already made. With P parents
that is P (P + 3) / 2 more passes without the spectrum (5 for two parents).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from ..delta.merge import MergeFit, fit
from ..delta.result import DiffOptions, DiffResult, TensorDiff

# run/diff.py's diff, handed in by it (this module is its helper: importing it back would be a cycle)
Diff = Callable[[str, str, DiffOptions], DiffResult]


def parent_fits(
    base: str, tuned: str, paired: Sequence[TensorDiff], options: DiffOptions, diff: Diff
) -> list[MergeFit]:
    """One fit per tensor paired in base, tuned and every parent, whose change is not zero (delta/merge.py)."""

    def norms(first: str, other: str) -> dict[str, tuple[str, float]]:
        """Each paired tensor's name on the `first` side -> (its name on the other, |W_other - W_first|^2)."""
        result = diff(first, other, replace(options, spectrum=False, parents=()))
        return {t.name: (t.tuned_name, t.figures.delta_norm**2) for t in [*result.matrices, *result.vectors]}

    parents = list(options.parents)
    to_parent = [norms(base, p) for p in parents]  # base name -> (parent i's name, |d_i|^2)
    from_tuned = [norms(tuned, p) for p in parents]  # tuned name -> (parent's name, |W_t - W_i|^2)
    between = {(i, j): norms(parents[i], parents[j]) for i in range(len(parents)) for j in range(i + 1, len(parents))}
    fits = []
    for t in paired:
        try:
            names = [side[t.name][0] for side in to_parent]
            d = [side[t.name][1] for side in to_parent]
            cross = [side[t.tuned_name][1] for side in from_tuned]
            pairs = {(i, j): between[(i, j)][names[i]][1] for (i, j) in between}
        except KeyError:  # not in every parent under a name the pairing matches: no fit for it
            continue
        found = fit(t.name, t.figures.delta_norm**2, d, cross, pairs)
        if found is not None:
            fits.append(found)
    return fits

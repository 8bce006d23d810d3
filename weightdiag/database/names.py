"""The names a mistyped id was most likely meant to be, from what is here: the shipped cohort (its entry ids and the
Hub repos they were fitted from) and the database's fitted rows (id, id@revision). Never from the Hub: a typo is
answered at once, without a network round trip, and offline too (issue 42).

`nearest("pythia-70n")` -> ["pythia-70m"]; `nearest("all-MiniLM-L6-v2")` -> ["sentence-transformers/all-MiniLM-L6-v2"]
when a row or cohort entry was fitted from that repo.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

from ..errors import WeightdiagError
from .store import cohort_rows, iter_summaries

CUTOFF = 0.8  # difflib's ratio: pythia-70n ~ pythia-70m (0.9), gpt2 !~ gpt2-medium (0.53)
SHOWN = 3  # names offered at most
TIER = 0.05  # names this much less close than the closest are not offered


def known_names(db_dir: Path | None = None, hub_rows: bool = True) -> list[str]:
    """Every name a row answers to here: cohort entry ids and their Hub repos, then the database's fitted ids and
    id@revision names (a database that cannot be read gives none: this only ever adds a hint). hub_rows=False
    leaves out the rows fitted from the Hub: a name close to one of those (bert-base-cased beside a row of
    bert-base-uncased) may well be another Hub repository, and only the Hub can say it is not."""
    names: list[str] = []
    for row in cohort_rows():
        model = row["model"]
        names.append(model["id"])
        if model.get("hub_repo"):
            names.append(str(model["hub_repo"]))
    try:
        for _, summary in iter_summaries(db_dir, on_skip=lambda _: None):
            model = summary["model"]
            if not hub_rows and model.get("source") == "hub":
                continue
            names.append(model["id"])
            if model.get("revision"):
                names.append(f"{model['id']}@{model['revision']}")
    except (WeightdiagError, OSError):
        pass
    return list(dict.fromkeys(names))


def nearest(spec: str, names: Iterable[str]) -> list[str]:
    """The names `spec` was most likely meant to be: a Hub id ORG/NAME whose NAME is `spec` (an id given without
    its organisation), else the names closest to it ignoring case (difflib's ratio, at least CUTOFF), never
    `spec` itself."""
    by_folded: dict[str, str] = {}
    for name in names:
        by_folded.setdefault(name.casefold(), name)
    want = spec.casefold()
    bare, _, revision = want.partition("@")
    same_tail = [
        name
        for folded, name in by_folded.items()
        if "/" in folded
        and "/" not in bare
        and folded.partition("@")[0].rsplit("/", 1)[1] == bare
        and folded.partition("@")[2] == revision
    ]
    same_tail = [name for name in same_tail if name != spec]
    if same_tail:  # the id with its organisation: nothing else is as likely
        return same_tail[:SHOWN]
    matcher = difflib.SequenceMatcher()
    matcher.set_seq2(want)
    scored = []
    for folded in by_folded:
        matcher.set_seq1(folded)  # as difflib.get_close_matches: the cheap bounds first (thousands of rows)
        if folded != want and matcher.real_quick_ratio() >= CUTOFF and matcher.quick_ratio() >= CUTOFF:
            scored.append((matcher.ratio(), folded))
    scored.sort(reverse=True)
    best = scored[0][0] if scored else 0.0
    # The closest tier only: pythia-160 is pythia-160m (0.95), not also pythia-410m (0.84).
    return [by_folded[folded] for ratio, folded in scored if ratio >= max(CUTOFF, best - TIER)][:SHOWN]


def did_you_mean(spec: str, db_dir: Path | None = None) -> str:
    """The hint `(did you mean X?)`, with a space before it, for the names `spec` was most likely meant to be;
    else the empty string."""
    return hint(nearest(spec, known_names(db_dir)))


def hint(names: list[str]) -> str:
    if not names:
        return ""
    shown = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f" (did you mean {shown}?)"

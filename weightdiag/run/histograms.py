"""|w| histograms for report plots: choose a few matrices and re-read just those from the model.

Rows keep statistics and fits, not distributions, so the Figure-3 style histograms need the weights
again: the model is reopened (the spec just fitted, else the row's local folder or its Hub commit)
and only the chosen matrices are read and reduced.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import OptionError, WeightdiagError, param
from ..execution import Execution
from ..segments import Segments
from ..source.plan import ModelPlan
from ..source.reader import Reader
from ..vocabulary import COHORT_TRIM, FFN_KEYS

DEFAULT_HISTOGRAMS = 3


def histogram_choice(result: Mapping[str, Any], row: Mapping[str, Any], asked: list[str]) -> dict[str, str]:
    """--hist names/globs, else the most extreme max/q99, the lowest k and a typical FFN matrix: {name: why it is
    drawn} (said under each histogram, so a reader knows why a second or third one appears)."""
    names = [m["name"] for m in row["matrices"]]
    if asked:
        chosen: list[str] = []
        for pattern in asked:
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise OptionError(
                    f"{param('hist')} {pattern!r} matches no fitted matrix; names look like {names[len(names) // 2]!r}",
                    param="hist",
                )
            chosen += [h for h in hits if h not in chosen]
        return dict.fromkeys(chosen, "asked for with --hist")
    from ..diagnose.health.towers import tower_of  # the language model's blocks, never a vision tower's

    in_blocks = [
        m for m in row["matrices"] if m["block"] is not None and m["fits"][COHORT_TRIM]["ok"] and not tower_of(m)
    ]
    if not in_blocks:
        return dict.fromkeys(names[:1], "the first matrix (no block matrix has a fit)")
    # A super weight the report found, else the most extreme max/q99; the heaviest body; a typical FFN matrix.
    found = [f["tensor"] for f in result["findings"] if f["category"] == "super-weight"]
    extreme = found[0] if found else max(in_blocks, key=lambda m: m["stats"].get("max_over_q99") or 0)["name"]
    lowest = min(in_blocks, key=lambda m: m["fits"][COHORT_TRIM]["k"])["name"]
    ffn = [m for m in in_blocks if m["kind"] in FFN_KEYS] or in_blocks
    median_k = sorted(m["fits"][COHORT_TRIM]["k"] for m in ffn)[len(ffn) // 2]
    typical = min(ffn, key=lambda m: (abs(m["fits"][COHORT_TRIM]["k"] - median_k), m["stats"]["max_over_q99"]))["name"]
    reasons = [
        (extreme, "the super weight a finding names" if found else "the largest max/q99 (|w| far beyond its body)"),
        (lowest, "the lowest k of the block matrices (the heaviest-tailed body)"),
        (typical, "a typical FFN matrix (k nearest the FFN median), to compare the others with"),
    ]
    why: dict[str, list[str]] = {}
    for name, reason in reasons:
        why.setdefault(name, []).append(reason)
    return {name: ", and as ".join(text) for name, text in list(why.items())[:DEFAULT_HISTOGRAMS]}


def read_histograms(
    row: Mapping[str, Any], names: list[str], spec: str | None, token: str | None, execution: Execution
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Re-read the named matrices and reduce them to their |w| distributions.

    Rows do not store distributions, so the model is opened again: the spec just fitted, else the
    row's local location (checked against its fingerprint), else the Hub repo at the row's commit.
    Returns ({name: data}, a note when histograms are skipped or may differ). `execution`: the report's (the
    matrices are reduced by the fit's chunk pass on its executor: this machine, or a Ray cluster's nodes).
    """

    from ..decode.group import group_quantized
    from ..fit.stats import Summary
    from ..source.open import open_model

    model = row["model"]
    note = None
    target = spec
    if target is None:
        if model.get("source") == "local" and model.get("location") and Path(model["location"]).exists():
            target = model["location"]
        elif model.get("source") == "hub" and model.get("commit"):
            target = f"{model['id']}@{model['commit']}"
    if target is None:
        return (
            {},
            f"histograms skipped: the model of this row ({model.get('location') or model['id']}) is not reachable",
        )
    try:
        plan, reader = open_model(target, token=token)
    except WeightdiagError as exc:
        return {}, f"histograms skipped: cannot open {target} ({exc.message})"
    if spec is None and model.get("source") == "local":
        from ..source.local import content_fingerprint

        if model.get("fingerprint") and f"local-{content_fingerprint(plan)}" != model["fingerprint"]:
            note = f"note: {target} changed since the row was fitted; histograms show the files as they are now"
    try:
        group_quantized(plan, reader.tensor_bytes)
    except WeightdiagError as exc:
        reader.close()
        return {}, f"histograms skipped: cannot read {target} ({exc.message})"
    refs = {t.name: t for t in plan.tensors}
    by_name = {m["name"]: m for m in row["matrices"]}
    # Each chosen record's tensor and selection: a whole tensor, or the cut of a fused one (`slice_of`).
    wanted: list[tuple[str, Any, Segments | None]] = []
    for name in names:
        record = by_name.get(name)
        cut = (record or {}).get("slice_of")
        ref = refs.get(cut["tensor"] if cut else name)
        if record is None or ref is None:
            continue
        wanted.append((name, ref, Segments(*cut["segments"]) if cut else None))
    out: dict[str, dict[str, Any]] = {}
    try:
        for name, reduction in _reduce(wanted, plan, reader, execution):
            summary = Summary(reduction)
            mags = summary.magnitudes.nonzero()
            m = by_name[name]
            out[name] = {
                "name": name,
                "kind": m["kind"],
                "block": m["block"],
                "hist1024": summary.histogram,
                "values": mags.values,
                "counts": mags.counts,
                "n": int(mags.total),
                "q99": m["stats"]["q99_abs"],
                "max_abs": m["stats"]["max_abs"],
                "argmax": m.get("argmax"),
                "fit": m["fits"][COHORT_TRIM],
                "note": m.get("note"),
            }
    finally:
        reader.close()
    return out, note


def _reduce(
    wanted: list[tuple[str, Any, Segments | None]], plan: ModelPlan, reader: Reader, execution: Execution
) -> Iterator[tuple[str, Any]]:
    """(record name, its reduction), through the chunk engine's pass (the fit's, on the same executor): memory a
    few chunks, whatever the tensor's size."""
    from ..reduce.stream import Target, reduce_chunked

    # One target per tensor, in file order, with the selections of every record cut from it.
    tensors: dict[str, tuple[Any, list[tuple[str, Segments | None]]]] = {}
    for name, ref, cut in wanted:
        tensors.setdefault(ref.name, (ref, []))[1].append((name, cut))
    ordered = sorted(tensors.values(), key=lambda t: (t[0].shard, t[0].start))
    targets = [Target(ref, tuple(cut for _, cut in cuts)) for ref, cuts in ordered]
    for index, result in reduce_chunked(targets, (plan, reader), execution, lookahead=0):
        assert isinstance(result, list)  # matrices: a reduction per selection
        for (name, _), reduction in zip(ordered[index][1], result, strict=True):
            yield name, reduction

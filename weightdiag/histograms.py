"""|w| histograms for report plots: choose a few matrices and re-read just those from the model.

Rows keep statistics and fits, not distributions, so the Figure-3 style histograms need the weights
again: the model is reopened (the spec just fitted, else the row's local folder or its Hub commit)
and only the chosen matrices are read and reduced.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Any

from .errors import OptionError, WeightdiagError
from .vocabulary import COHORT_TRIM, FFN_KEYS

DEFAULT_HISTOGRAMS = 3


def histogram_choice(result: dict[str, Any], row: dict[str, Any], asked: list[str]) -> list[str]:
    """--hist names/globs, else the most extreme max/q99, the lowest k and a typical FFN matrix."""
    names = [m["name"] for m in row["matrices"]]
    if asked:
        chosen: list[str] = []
        for pattern in asked:
            hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise OptionError(
                    f"--hist {pattern!r} matches no fitted matrix; names look like {names[len(names) // 2]!r}",
                    option="--hist",
                )
            chosen += [h for h in hits if h not in chosen]
        return chosen
    from .diagnose.health.towers import tower_of  # the language model's blocks, never a vision tower's

    in_blocks = [
        m for m in row["matrices"] if m["block"] is not None and m["fits"][COHORT_TRIM]["ok"] and not tower_of(m)
    ]
    if not in_blocks:
        return names[:1]
    # A super weight the report found, else the most extreme max/q99; the heaviest body; a typical FFN matrix.
    found = [f["tensor"] for f in result["findings"] if f["category"] == "super-weight"]
    extreme = found[0] if found else max(in_blocks, key=lambda m: m["stats"].get("max_over_q99") or 0)["name"]
    lowest = min(in_blocks, key=lambda m: m["fits"][COHORT_TRIM]["k"])["name"]
    ffn = [m for m in in_blocks if m["kind"] in FFN_KEYS] or in_blocks
    median_k = sorted(m["fits"][COHORT_TRIM]["k"] for m in ffn)[len(ffn) // 2]
    typical = min(ffn, key=lambda m: (abs(m["fits"][COHORT_TRIM]["k"] - median_k), m["stats"]["max_over_q99"]))["name"]
    return list(dict.fromkeys([extreme, lowest, typical]))[:DEFAULT_HISTOGRAMS]


def read_histograms(
    row: dict[str, Any], names: list[str], spec: str | None, token: str | None
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Re-read the named matrices and reduce them to their |w| distributions.

    Rows do not store distributions, so the model is opened again: the spec just fitted, else the
    row's local location (checked against its fingerprint), else the Hub repo at the row's commit.
    Returns ({name: data}, a note when histograms are skipped or may differ).
    """
    import numpy as np

    from .engine.reduce import reduce_array
    from .engine.stats import Summary
    from .quant.group import group_quantized
    from .quant.loader import CompanionLoader
    from .source.open import open_model
    from .source.plan import storage_view

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
        from .source.local import content_fingerprint

        if model.get("fingerprint") and f"local-{content_fingerprint(plan)}" != model["fingerprint"]:
            note = f"note: {target} changed since the row was fitted; histograms show the files as they are now"
    try:
        group_quantized(plan, _reader_bytes(reader))
    except WeightdiagError as exc:
        reader.close()
        return {}, f"histograms skipped: cannot read {target} ({exc.message})"
    refs = {t.name: t for t in plan.tensors}
    by_name = {m["name"]: m for m in row["matrices"]}
    out: dict[str, dict[str, Any]] = {}
    try:
        for name in names:
            ref = refs.get(name)
            if ref is None:
                continue
            raw = np.empty(ref.nbytes, dtype=np.uint8)
            reader.read_into(ref, raw)
            if ref.quant is not None:  # a quantized weight: its codes decoded with its companions
                loader = CompanionLoader(_reader_bytes(reader), [ref.quant], lookahead=0)
                try:
                    values, _ = loader.decoder(0).decode(raw, 0)
                finally:
                    loader.close()
                summary = Summary(reduce_array(values, "F32"))
            else:
                summary = Summary(reduce_array(storage_view(ref, raw), ref.dtype.name))
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


def _reader_bytes(reader: Any) -> Any:
    """A tensor's stored bytes, read now (a quantized weight's companions)."""
    import numpy as np

    def read(ref: Any) -> Any:
        out = np.empty(ref.nbytes, dtype=np.uint8)
        reader.read_into(ref, out)
        return out

    return read

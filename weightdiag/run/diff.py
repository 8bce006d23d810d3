"""`weightdiag diff`, a job from start to end: open both checkpoints, pair their tensors, run the paired
comparison (delta/compare.py's PairsPass) on the execution's executor, then the verdicts, summaries and
findings: a `DiffResult`.

The numerics live in weightdiag/delta (pairing, measures, spectrum, findings), the views in render/.
"""

from __future__ import annotations

import time
from contextlib import closing
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from .. import __version__, settings
from ..delta.compare import PairsPass, hashing
from ..delta.extremes import summary as survival
from ..delta.findings import block_key, find, summarize
from ..delta.mechanism import by_block, judge
from ..delta.pairing import pair_tensors
from ..delta.result import DiffOptions, DiffResult, TensorDiff, damage
from ..errors import OptionError, param
from ..execution import Execution
from ..executor import PassRun, check_verified
from ..layout import arch_from_config, complete_arch
from ..progress import SILENT, Progress
from ..source.open import open_model
from ..source.plan import ModelPlan
from ..source.reader import Reader, closing_on_error
from .measure import selected


def check_options(options: DiffOptions) -> Execution:
    """Refuse unusable options (exit 2) before anything is read; how the diff runs (execution.py)."""
    if not (isinstance(options.sketch, int) and 2 <= options.sketch <= 4096):
        raise OptionError(f"{param('sketch')} {options.sketch}: choose a whole number from 2 to 4096", param="sketch")
    return Execution.build(
        options.device, executor=options.executor, ray_address=options.ray_address, connections=options.connections
    )


def open_side(spec: str, options: DiffOptions) -> tuple[ModelPlan, Reader]:
    """One checkpoint, opened for ranged reads, its quantized weights grouped."""
    from ..decode.group import group_quantized

    plan, reader = open_model(spec, token=options.token)
    with closing_on_error(reader):
        reader.set_connections(options.connections)
        group_quantized(plan, reader.tensor_bytes)
    return plan, reader


def base_of(tuned: str, options: DiffOptions) -> str:
    """`diff TUNED` alone: the base model its model card names (base_model in the card's front matter)."""
    plan, reader = open_model(tuned, token=options.token)
    reader.close()
    base = plan.base_model or (_hub_card_base(tuned, plan, options) if plan.source == "hub" else None)
    if not base:
        raise OptionError(
            f"{tuned}: its model card names no base_model; give both: weightdiag diff BASE {tuned}", param="base"
        )
    return base


def _hub_card_base(spec: str, plan: ModelPlan, options: DiffOptions) -> str | None:
    """base_model from a Hub repo's README.md (the Hub source reads the card of quantized repos only)."""
    names = hub_card_bases(spec, plan, options)
    return names[0] if names else None


def hub_card_bases(spec: str, plan: ModelPlan, options: DiffOptions) -> list[str]:
    """Every base_model a Hub repo's README.md names (empty without a card or a base_model)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    from ..source.files import CARD_HEAD, base_models_of
    from ..source.open import split_revision

    try:
        path = hf_hub_download(
            split_revision(spec)[0],
            "README.md",
            revision=plan.commit or plan.revision,
            token=options.token,
            cache_dir=settings.hf_cache_dir(),  # a command's --cache-dir too
        )
    except (EntryNotFoundError, HfHubHTTPError):  # no card, or none to be had: the caller says so in one line
        return []
    with open(path, "rb") as card:
        return base_models_of(card.read(CARD_HEAD).decode("utf-8", errors="replace"))


def describe_side(plan: ModelPlan) -> dict[str, Any]:
    return {
        "id": plan.model_id,
        "source": plan.source,
        "location": plan.location,
        "revision": plan.revision,
        "commit": plan.commit,
        "files": [{"name": s.name, "size": s.size, "sha256": s.sha256} for s in plan.shards],
    }


def diff(
    base_spec: str | None, tuned_spec: str, options: DiffOptions | None = None, progress: Progress | None = None
) -> DiffResult:
    """Compare two checkpoints tensor by tensor (see the package docstring)."""
    options = options or DiffOptions()
    execution = check_options(options)
    device = execution.device
    if base_spec is None:
        base_spec = base_of(tuned_spec, options)
    base_plan, base_reader = open_side(base_spec, options)
    try:
        tuned_plan, tuned_reader = open_side(tuned_spec, options)
    except BaseException:
        base_reader.close()
        raise
    started = time.perf_counter()
    try:
        base_refs = [t for t in base_plan.tensors if selected(t.name, options.include, options.exclude)]
        pairing = pair_tensors(base_refs, tuned_plan.tensors)
        if options.include or options.exclude:  # a tuned tensor outside the selection is not "only tuned"
            names = {p.tuned.name for p in pairing.pairs}
            pairing.only_tuned = [
                n for n in pairing.only_tuned if n not in names and selected(n, options.include, options.exclude)
            ]
        if not pairing.pairs:
            raise OptionError(
                f"{base_spec} and {tuned_spec} have no tensor in common to compare"
                + (f" (check {param('include')}/{param('exclude')})" if options.include or options.exclude else ""),
                param="include" if options.include else "base",
            )
        verify = not (options.include or options.exclude)  # a partial read cannot be checked against a hash
        progress = progress or SILENT
        total = sum(p.base.nbytes + p.tuned.nbytes for p in pairing.pairs)
        progress.started(f"{base_plan.model_id} -> {tuned_plan.model_id}", len(pairing.pairs), total)
        arch = complete_arch(arch_from_config(base_plan.config, []), [(t.name, t.shape) for t in base_plan.tensors])
        readers = (base_reader, tuned_reader)
        plans = (base_plan, tuned_plan)
        hashed = hashing(pairing.pairs, readers, verify)
        job = PairsPass(
            tuple(pairing.pairs),
            arch,
            replace(options, token=None),
            (hashed[0], hashed[1]),
            (len(base_plan.shards), len(tuned_plan.shards)),
            ((base_plan, base_reader), (tuned_plan, tuned_reader)),
        )

        def on_node(node: str, nbytes: int) -> None:
            progress.node_done(node, nbytes, False)

        run: PassRun[TensorDiff] = execution.executor.run_pass(job, execution, on_node)
        matrices: list[TensorDiff] = []
        vectors: list[TensorDiff] = []
        with closing(run.results) as results:  # ended now if a callback raises, before the executor closes
            for pair, item in zip(pairing.pairs, results, strict=True):
                (matrices if len(pair.base.shape) >= 2 else vectors).append(item)
                progress.read(pair.base.nbytes + pair.tuned.nbytes)
                progress.measured(pair.name)
        shards = [(plan.model_id, [s.name for s in plan.shards], [s.sha256 for s in plan.shards]) for plan in plans]
        check_verified(hashed, run.verified, shards)
        verification = {
            side: _verification(reader, plan, hashed[k] is not None, verify, run.verified[k])
            for k, (side, reader, plan) in enumerate(zip(("base", "tuned"), readers, plans, strict=True))
        }
        cluster = execution.executor.summary()
    finally:
        base_reader.close()
        tuned_reader.close()
        execution.close()
    elapsed = time.perf_counter() - started
    blocks = summarize(matrices, block_key)
    blocks.sort(key=lambda g: int(g.key.split()[1]))
    kinds = summarize(matrices, lambda t: t.kind)
    everything = [*matrices, *vectors]
    numel = sum(t.figures.numel for t in everything)
    d2 = sum(t.figures.delta_norm**2 for t in everything)
    b2 = sum(t.figures.base_norm**2 for t in everything)
    bytes_read = sum(p.base.nbytes + p.tuned.nbytes for p in pairing.pairs)
    totals = {
        "tensors": len(everything),
        "matrices": len(matrices),
        "elements": numel,
        "relative_change": (d2 / b2) ** 0.5 if b2 > 0 else None,
        "unchanged_fraction": sum(t.figures.unchanged_fraction * t.figures.numel for t in everything) / max(numel, 1),
        "untouched_matrices": sum(t.untouched for t in matrices),
        "low_rank_matrices": sum(t.low_rank for t in matrices),
        "scaled_matrices": sum(t.scaled for t in matrices),
    }
    notes = [*base_plan.notes, *tuned_plan.notes]
    unpaired = len(pairing.only_base) + len(pairing.only_tuned) + len(pairing.shape_mismatches)
    merge = None
    if options.parents:  # the parents' passes, each a diff of its own (run/parents.py)
        from .parents import parent_fits

        merge = parent_fits(base_spec, tuned_spec, everything, options, diff)
    mechanism = judge(matrices, vectors, unpaired, merge)
    blocks_differ = by_block(matrices, vectors, mechanism.verdict, merge)
    if blocks_differ:
        mechanism.details["blocks"] = blocks_differ
    return DiffResult(
        base=describe_side(base_plan),
        tuned=describe_side(tuned_plan),
        matrices=matrices,
        vectors=vectors,
        only_base=pairing.only_base,
        only_tuned=pairing.only_tuned,
        shape_mismatches=pairing.shape_mismatches,
        skipped=pairing.skipped,
        blocks=blocks,
        kinds=kinds,
        findings=find(matrices, vectors, blocks),
        totals=totals,
        run={
            "device": device,
            "seconds": round(elapsed, 3),
            "bytes_read": bytes_read,
            "include": list(options.include),
            "exclude": list(options.exclude),
            "sketch": options.sketch,
            "seed": options.seed,
            "verification": verification,
            **({"cluster": cluster} if cluster is not None else {}),  # which nodes read what
            **({"parents": list(options.parents)} if options.parents else {}),  # --parent, in the order given
            "tool": {"name": "weightdiag", "version": __version__},
            "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        notes=notes,
        mechanism=mechanism,
        damage=damage(matrices),
        survival=survival(matrices),
    )


def _verification(reader: Reader, plan: ModelPlan, read_whole: bool, verify: bool, verified: set[int] | None) -> str:
    """What was checked of one side's bytes (the runs raised VerificationError, exit 3, where a Hub shard's
    sha256 differed)."""
    if plan.source != "hub":
        return (plan.verification or {}).get("summary") or "not verified: read from local files"
    if not verify:
        return "not verified: --include/--exclude read part of the shards"
    if not read_whole:
        return "not verified: its tensors are stored in another order than the other side's, or no sha256 is published"
    confirmed = reader.confirmed(verified)
    return confirmed["summary"] if confirmed else "not verified: no sha256 published"

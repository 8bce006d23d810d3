"""A diff from start to end: open both checkpoints, pair their tensors, stream the pairs in lockstep,
fold the exact figures and the spectra, then the verdicts, summaries and findings: a `DiffResult`.

The only module of the package that opens models (I/O) on this machine (with --executor ray, cluster.py's
tasks open them again on the nodes); the pairs are compared in compare.py, the numerics live in measures,
spectrum, findings.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from .. import __version__, kernels
from ..errors import OptionError
from ..execution import Execution
from ..layout import arch_from_config, complete_arch
from ..run.measure import selected
from ..source.open import open_model
from ..source.plan import ModelPlan
from ..source.reader import Reader, closing_on_error
from .compare import Progress, compare
from .findings import block_key, find, summarize
from .pairing import pair_tensors
from .result import DiffOptions, DiffResult


def check_options(options: DiffOptions) -> None:
    if not (isinstance(options.sketch, int) and 2 <= options.sketch <= 4096):
        raise OptionError(f"--sketch {options.sketch}: choose a whole number from 2 to 4096", option="--sketch")
    if not (isinstance(options.connections, int) and 1 <= options.connections <= 64):
        raise OptionError(
            f"--connections {options.connections}: choose a whole number from 1 to 64", option="--connections"
        )
    if options.executor not in ("local", "ray"):
        raise OptionError(f"--executor {options.executor!r}: choose local or ray", option="--executor")
    if options.executor == "ray" and (options.device or "auto").lower() not in ("auto", "cpu"):
        raise OptionError(
            f"--device {options.device} with --executor ray: the nodes compare on their CPUs; leave --device out",
            option="--device",
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
            f"{tuned}: its model card names no base_model; give both: weightdiag diff BASE {tuned}", option="BASE"
        )
    return base


def _hub_card_base(spec: str, plan: ModelPlan, options: DiffOptions) -> str | None:
    """base_model from a Hub repo's README.md (the Hub source reads the card of quantized repos only)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    from ..source.files import CARD_HEAD, base_model_of
    from ..source.open import split_revision

    try:
        path = hf_hub_download(
            split_revision(spec)[0], "README.md", revision=plan.commit or plan.revision, token=options.token
        )
    except (EntryNotFoundError, HfHubHTTPError):  # no card, or none to be had: the caller says so in one line
        return None
    with open(path, "rb") as card:
        return base_model_of(card.read(CARD_HEAD).decode("utf-8", errors="replace"))


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
    check_options(options)
    execution = Execution.from_settings(options.device)
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
    cluster = None
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
                + (" (check --include/--exclude)" if options.include or options.exclude else ""),
                option="--include" if options.include else "BASE",
            )
        verify = not (options.include or options.exclude)  # a partial read cannot be checked against a hash
        verifying: dict[str, bool] = {}
        if progress is not None:
            total = sum(p.base.nbytes + p.tuned.nbytes for p in pairing.pairs)
            label = f"{base_plan.model_id} -> {tuned_plan.model_id}"
            progress("start", {"tensors": len(pairing.pairs), "bytes": total, "model": label})
        arch = complete_arch(arch_from_config(base_plan.config, []), [(t.name, t.shape) for t in base_plan.tensors])
        if options.executor == "ray":  # whole pairs compared by tasks on the cluster's nodes (diff/cluster.py)
            from ..reduce.cluster import Cluster
            from ..source.reopen import describe
            from .cluster import compare_on_cluster

            for plan, reader in ((base_plan, base_reader), (tuned_plan, tuned_reader)):
                describe(plan, reader)  # what the nodes cannot read (GGUF, .bin) is refused before connecting
            cluster = Cluster.join(options.ray_address)
            matrices, vectors = compare_on_cluster(
                cluster, pairing.pairs, arch, (base_plan, tuned_plan), (base_reader, tuned_reader), options,
                execution, verify, verifying, progress,
            )  # fmt: skip
        else:
            with kernels.thread_budget(execution.threads):
                matrices, vectors = compare(
                    pairing.pairs, arch, base_reader, tuned_reader, options, execution, verify, verifying, progress
                )
        verification = {
            side: _verification(reader, plan, verifying.get(side, False), verify, cluster is not None)
            for side, reader, plan in (("base", base_reader, base_plan), ("tuned", tuned_reader, tuned_plan))
        }
    finally:
        base_reader.close()
        tuned_reader.close()
        if cluster is not None:
            cluster.close()
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
            **({"cluster": cluster.summary()} if cluster is not None else {}),  # which nodes read what
            "tool": {"name": "weightdiag", "version": __version__},
            "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        notes=notes,
    )


def _verification(reader: Reader, plan: ModelPlan, read_whole: bool, verify: bool, on_cluster: bool = False) -> str:
    """What was checked of one side's bytes: raises VerificationError (exit 3) when a Hub shard's sha256 differs.
    `on_cluster`: the shards were hashed on the nodes, each checked there (diff/cluster.py)."""
    if plan.source != "hub":
        return (plan.verification or {}).get("summary") or "not verified: read from local files"
    if not verify:
        return "not verified: --include/--exclude read part of the shards"
    if not read_whole:
        return "not verified: its tensors are stored in another order than the other side's, or no sha256 is published"
    if on_cluster:
        from ..source.hub_stream import HubReader

        if isinstance(reader, HubReader):
            return reader.all_verified()["summary"]
    finished = reader.finish()
    return finished["summary"] if finished else "not verified: no sha256 published"

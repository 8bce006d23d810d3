"""Where a planned model's shards are, in a few plain fields: what a cluster node opens again
(source/reopen.py). Each reader says how it is described (Reader.describe)."""

from __future__ import annotations

from dataclasses import dataclass

from .plan import ModelPlan, ShardInfo


@dataclass(frozen=True)
class SourceSpec:
    """Where a planned model's shards are, for a reader opened elsewhere. Plain data (it is pickled)."""

    kind: str  # "local": files at the same path on every node; "hub": ranged reads of one commit
    location: str  # local: the folder the shard names are relative to; hub: the repo id
    shards: tuple[ShardInfo, ...]
    commit: str | None = None  # hub: the commit planned (its files never change)
    endpoint: str | None = None  # hub: the endpoint planned from (HF_ENDPOINT on the driver)


def hub_spec(plan: ModelPlan) -> SourceSpec:
    """The nodes read the same commit from the Hub (a model streamed, or read from this machine's HF cache)."""
    from .. import settings

    assert plan.commit is not None
    return SourceSpec("hub", _repo_of(plan), tuple(plan.shards), plan.commit, settings.hf_endpoint())


def _repo_of(plan: ModelPlan) -> str:
    """The repo id of a Hub plan (its location is ENDPOINT/ORG/NAME/tree/COMMIT)."""
    location = plan.location.split("/tree/", 1)[0]
    parts = location.rstrip("/").split("/")
    return "/".join(parts[-2:])

"""A reader described in a few plain fields, and opened again on another machine (a cluster node).

The machine that plans a fit (the driver) opens the model and plans its reads; the nodes of a cluster each
read some of its chunks. A node never plans again: it gets a `SourceSpec` (where the shards are, the commit,
each shard's size and header hash) and opens a reader of the same kind over the same shards. Each shard it
reads is checked to be the one planned (its size and the sha256 of its header) before any of its bytes are
reduced, so that a node that sees other bytes (another version at the same path, a stale mount, another
commit) fails with one line naming itself and the file, never a row that mixes two checkpoints.

No token travels: a node reads the Hub with its own (HF_TOKEN or `hf auth login`), as sweep workers do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..errors import HubResponseError, ModelPathError, OptionError
from .filecheck import FileIdentity
from .plan import ModelPlan, ShardInfo
from .reader import Reader


@dataclass(frozen=True)
class SourceSpec:
    """Where a planned model's shards are, for a reader opened elsewhere. Plain data (it is pickled)."""

    kind: str  # "local": files at the same path on every node; "hub": ranged reads of one commit
    location: str  # local: the folder the shard names are relative to; hub: the repo id
    shards: tuple[ShardInfo, ...]
    commit: str | None = None  # hub: the commit planned (its files never change)
    endpoint: str | None = None  # hub: the endpoint planned from (HF_ENDPOINT on the driver)


def describe(plan: ModelPlan, reader: Reader) -> SourceSpec:
    """The spec of an opened model whose chunks other machines will read: safetensors shards, local or Hub."""
    from .. import settings
    from .hub_stream import HubReader
    from .local import LocalReader

    shards = tuple(plan.shards)
    if plan.source == "hub" and plan.commit and isinstance(reader, (HubReader, LocalReader)):
        # Streamed, or read from this machine's HF cache: the nodes read the same commit from the Hub.
        return SourceSpec("hub", _repo_of(plan), shards, plan.commit, settings.hf_endpoint())
    if isinstance(reader, LocalReader):
        return SourceSpec("local", str(reader.root), shards)
    raise OptionError(
        f"{plan.location}: --executor ray reads safetensors checkpoints (local or from the Hub); this one is "
        f"{plan.file_format}: fit it without --executor ray",
        option="--executor",
    )


def _repo_of(plan: ModelPlan) -> str:
    """The repo id of a Hub plan (its location is ENDPOINT/ORG/NAME/tree/COMMIT)."""
    location = plan.location.split("/tree/", 1)[0]
    parts = location.rstrip("/").split("/")
    return "/".join(parts[-2:])


def reopen(spec: SourceSpec, read: Iterable[int], node: str) -> Reader:
    """A reader over the spec's shards on this machine; the shards `read` (their chunks or companions) are
    checked first to be the ones planned. Errors name `node` and the file."""
    wanted = sorted(set(read))
    if spec.kind == "local":
        return _reopen_local(spec, wanted, node)
    return _reopen_hub(spec, wanted, node)


def _reopen_local(spec: SourceSpec, wanted: list[int], node: str) -> Reader:
    from .local import LocalReader, read_file_header

    root = Path(spec.location)
    identities: list[FileIdentity | None] = [None] * len(spec.shards)
    for index in wanted:
        shard = spec.shards[index]
        path = root / shard.name
        try:
            _, digest, identity = read_file_header(path, str(path))
        except OSError as exc:
            raise ModelPathError(
                f"{node}: cannot read {path} ({exc.strerror or exc}); with --executor ray every node needs the "
                "checkpoint at the same path (a shared file system) or a Hub id",
                path=path,
            ) from None
        if identity.size != shard.size or digest != shard.header_sha256:
            differs = "its size" if identity.size != shard.size else "its header"
            raise ModelPathError(
                f"{node}: {path} is not the file that was planned ({differs} differs): every node must see the "
                "same checkpoint at that path",
                path=path,
            )
        identities[index] = identity
    return LocalReader(root, list(spec.shards), identities)


def _reopen_hub(spec: SourceSpec, wanted: list[int], node: str) -> Reader:
    from .hub import _read_head, _remote, _session_and_headers
    from .hub_stream import HubReader, StreamedShard
    from .ranged import RetryPolicy

    assert spec.commit is not None
    session, headers = _session_and_headers(None)  # this node's own token, if it has one
    policy = RetryPolicy.from_env()
    streamed: list[StreamedShard] = []
    for index, shard in enumerate(spec.shards):
        remote = _remote(spec.location, spec.commit, shard.name, shard.size, session, headers, spec.endpoint)
        head = first = b""  # a shard this task does not stream: only companions may be read from it
        if index in wanted:
            head, first, _ = _read_head(remote, policy)
            if hashlib.sha256(head).hexdigest() != shard.header_sha256:
                raise HubResponseError(
                    f"{node}: {spec.location}/{shard.name} at {spec.commit[:12]} has another header than the one "
                    "planned: this node reads another Hub (HF_ENDPOINT) than the machine that planned the fit",
                    repo=spec.location,
                    revision=spec.commit,
                    file=shard.name,
                )
        streamed.append(StreamedShard(remote, shard.name, head, first, shard.sha256))
    return HubReader(streamed, policy)

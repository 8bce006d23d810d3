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
from pathlib import Path

from ..errors import HubResponseError, ModelPathError
from .filecheck import FileIdentity
from .reader import Reader
from .spec import SourceSpec


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

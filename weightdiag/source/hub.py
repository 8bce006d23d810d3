"""Hugging Face Hub models: `ORG/NAME[@REVISION]`, streamed with ranged reads or downloaded.

Resolution and downloads go through huggingface_hub (tokens from --token, HF_TOKEN or
`hf auth login`; HF_ENDPOINT, HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE are honoured, read at
call time). Three ways to get the bytes, in this order:
1. the local HF cache (shared with transformers) already holds every weight file of the resolved
   commit: read it from there, no network transfer;
2. streaming (default): each safetensors header with two ranged reads, then each tensor with one
   ranged GET into a reusable buffer while the previous tensor is reduced; nothing is written to
   disk and memory stays at a few tensors;
3. `--download`: whole files into the HF cache through huggingface_hub, then read locally. The only
   way for revisions that have `pytorch_model*.bin` shards and no safetensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..errors import BadInputError, HubError
from .hub_stream import HubReader, StreamedShard
from .plan import ModelPlan, ShardInfo, TensorRef
from .ranged import RangedFile, RetryPolicy
from .safetensors_header import PREFIX_BYTES, header_length, parse_header

CONFIG = "config.json"
ST_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
_STEP = re.compile(r"^step(\d+)$")


def _endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _cache_dir() -> Path:
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(constants.HF_HUB_CACHE)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def open_hub(
    repo: str,
    revision: str | None,
    *,
    token: str | None = None,
    download: bool = False,
    model_id: str | None = None,
) -> tuple[ModelPlan, Any]:
    """Plan a Hub model; returns (plan, reader) like the local sources."""
    if _offline():
        return _from_cache_only(repo, revision, model_id, reason="HF_HUB_OFFLINE is set")
    try:
        info = _model_info(repo, revision, token)
    except HubError as exc:
        if "cannot reach" in str(exc):
            try:
                return _from_cache_only(repo, revision, model_id, reason="the Hub is unreachable")
            except HubError:
                raise exc from None
        raise
    commit = info.sha
    files = {s.rfilename: s for s in (info.siblings or [])}
    weights, fmt = _choose_weights(repo, revision, files)
    wanted = [f for f in (CONFIG, ST_INDEX, BIN_INDEX) if f in files] + weights
    snapshot = _cached_snapshot(repo, commit, wanted)
    if snapshot is None and (download or fmt == "bin"):
        if fmt == "bin" and not download:
            raise HubError(
                f"{repo}@{revision or 'main'} has only pytorch_model*.bin shards (pickles), which cannot be "
                "streamed; rerun with --download (they are then read with torch.load(weights_only=True))"
            )
        # Download by the revision's name, so the cache also records refs/<name> (offline use later).
        snapshot = _download(repo, revision or "main", wanted, token)
        commit = snapshot.name if re.fullmatch(r"[0-9a-f]{40}", snapshot.name) else commit
    lfs = {name: (s.lfs.sha256 if s.lfs else None) for name, s in files.items()}
    if snapshot is not None:
        plan, reader = _open_snapshot(snapshot, repo, model_id)
        plan.shards = [ShardInfo(s.name, s.size, lfs.get(s.name) or s.sha256, s.header_sha256) for s in plan.shards]
    else:
        plan, reader = _stream(repo, commit, files, weights, token, model_id)
    plan.source = "hub"
    plan.revision = revision or "main"
    plan.commit = commit
    plan.location = f"{_endpoint()}/{repo}/tree/{commit}"
    return plan, reader


# --- resolution and errors -----------------------------------------------------------------


def _model_info(repo: str, revision: str | None, token: str | None):
    from huggingface_hub import HfApi

    with hub_errors(repo, revision, token):
        return HfApi(endpoint=_endpoint(), token=token).model_info(repo, revision=revision, files_metadata=True)


def _unreachable(exc: BaseException) -> HubError:
    return HubError(
        f"cannot reach the Hub at {_endpoint()} ({type(exc).__name__}); check the network, or set "
        "HF_HUB_OFFLINE=1 to use models already in the local cache"
    )


@contextmanager
def hub_errors(repo: str, revision: str | None, token: str | None) -> Iterator[None]:
    """Turn huggingface_hub and network exceptions into one-line HubErrors (exit code 3)."""
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hf

    try:
        yield
    except hf.GatedRepoError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status == 403 or token or os.environ.get("HF_TOKEN"):
            raise HubError(
                f"{repo} is gated and this token has no access yet: request access at {_endpoint()}/{repo} "
                "and wait for approval"
            ) from None
        raise HubError(
            f"{repo} is gated: request access at {_endpoint()}/{repo}, then log in with `hf auth login` "
            "or set HF_TOKEN (or pass --token)"
        ) from None
    except hf.RevisionNotFoundError:
        api = HfApi(endpoint=_endpoint(), token=token)
        raise HubError(f"{repo}: revision {revision!r} not found{_nearest_steps(api, repo, revision)}") from None
    except hf.RepositoryNotFoundError:
        raise HubError(
            f"{repo}: no such model repository on {_endpoint()} (or it is private: set HF_TOKEN or pass --token)"
        ) from None
    except hf.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise HubError(f"{repo}: the Hub answered HTTP {status}; try again later") from None
    except hf.HFValidationError as exc:  # the id breaks the Hub's naming rules: the user's input
        reason = str(exc).splitlines()[0].rsplit(": ", 1)[0].rstrip(".")[:200] if str(exc) else "HFValidationError"
        raise BadInputError(f"{repo}: not a valid Hub repo id ({reason}); use ORG/NAME[@REVISION]") from None
    except (OSError, ValueError) as exc:  # connection refused, DNS, TLS, timeouts
        raise _unreachable(exc) from None
    except Exception as exc:
        if type(exc).__module__.split(".")[0] in ("httpx2", "httpx", "httpcore", "requests"):
            raise _unreachable(exc) from None
        raise


def _nearest_steps(api, repo: str, revision: str | None) -> str:
    """For Pythia-style `stepN` revisions, name the nearest existing ones."""
    match = _STEP.match(revision or "")
    if not match:
        return "; check the branch, tag or commit name"
    try:
        refs = api.list_repo_refs(repo)
    except Exception:
        return ""
    steps = sorted(int(m.group(1)) for b in refs.branches if (m := _STEP.match(b.name)))
    if not steps:
        return "; this repo has no step* branches"
    want = int(match.group(1))
    nearest = sorted(steps, key=lambda s: (abs(s - want), s))[:3]
    return "; nearest existing: " + ", ".join(f"step{s}" for s in sorted(nearest))


def _choose_weights(repo: str, revision: str | None, files: dict[str, Any]) -> tuple[list[str], str]:
    names = sorted(files)
    root = [n for n in names if "/" not in n]
    if ST_INDEX in files:
        return [], "safetensors-index"  # shards come from the index, read below
    safetensors = [n for n in root if n.endswith(".safetensors")]
    if safetensors:
        return safetensors, "safetensors"
    bins = [n for n in root if re.match(r"^pytorch_model.*\.bin$", n)]
    if bins:
        return bins, "bin"
    raise HubError(
        f"{repo}@{revision or 'main'}: no weights in this revision (no *.safetensors or pytorch_model*.bin "
        "at the top level); pick another revision"
    )


# --- the local cache ---------------------------------------------------------------------------


def _cached_snapshot(repo: str, commit: str, names: list[str]) -> Path | None:
    """The cache snapshot folder of `commit` if every file in `names` is there."""
    from huggingface_hub import try_to_load_from_cache

    if not names:
        return None
    folder = None
    for name in names:
        path = try_to_load_from_cache(repo, name, cache_dir=_cache_dir(), revision=commit)
        if not isinstance(path, str):
            return None
        folder = Path(path).parent
    if ST_INDEX in names and folder is not None:
        # Shards named by the index must be cached too.
        from .local import load_weight_map

        shards = set(load_weight_map(folder / ST_INDEX).values())
        for shard in shards:
            if not isinstance(try_to_load_from_cache(repo, shard, cache_dir=_cache_dir(), revision=commit), str):
                return None
    return folder


def _from_cache_only(repo: str, revision: str | None, model_id: str | None, reason: str):
    from huggingface_hub import errors as hf
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo, revision=revision, cache_dir=_cache_dir(), local_files_only=True)
    except (hf.LocalEntryNotFoundError, FileNotFoundError, ValueError, OSError):
        raise HubError(
            f"{repo}@{revision or 'main'} is not in the local cache ({_cache_dir()}) and {reason}; connect "
            "to the network (unset HF_HUB_OFFLINE) or fit a local folder"
        ) from None
    plan, reader = _open_snapshot(Path(folder), repo, model_id)
    plan.source = "hub"
    plan.revision = revision or "main"
    plan.notes.append(f"read from the local HF cache: {reason}")
    return plan, reader


def _download(repo: str, revision: str, names: list[str], token: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    folder = None
    todo = list(names)
    while todo:
        name = todo.pop(0)
        try:
            path = hf_hub_download(
                repo, name, revision=revision, cache_dir=_cache_dir(), token=token, endpoint=_endpoint()
            )
        except Exception as exc:
            raise HubError(f"{repo}: downloading {name} failed ({type(exc).__name__}: {str(exc)[:160]})") from None
        folder = Path(path)
        for _ in PurePosixPath(name).parts:  # the snapshot root, also for shards in sub-folders
            folder = folder.parent
        if name in (ST_INDEX, BIN_INDEX):
            from .local import load_weight_map

            shards = sorted(set(load_weight_map(Path(path)).values()))
            todo += [s for s in shards if s not in todo and s not in names]
    assert folder is not None
    return folder


def _open_snapshot(folder: Path, repo: str, model_id: str | None):
    from .local import open_local

    return open_local(folder, model_id or repo)


# --- streaming ---------------------------------------------------------------------------------


def _session_and_headers(token: str | None) -> tuple[Any, dict[str, str]]:
    from huggingface_hub.utils import build_hf_headers, get_session

    return get_session(), build_hf_headers(token=token, library_name="weightdiag")


def _remote(repo: str, commit: str, name: str, size: int, session, headers: dict[str, str]) -> RangedFile:
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, name, revision=commit, endpoint=_endpoint())
    signed_in = "authorization" in {k.lower() for k in headers}
    return RangedFile(url, size, session, headers, f"{repo}/{name}", lambda status: _denied(repo, status, signed_in))


def _denied(repo: str, status: int, signed_in: bool) -> HubError:
    """A file read refused by the Hub itself: gated repos serve their metadata to anyone and refuse only
    file reads, with 401 to anonymous users and 403 to tokens without access."""
    if status == 403 or signed_in:
        return HubError(
            f"{repo} is gated and this token has no access yet: request access at {_endpoint()}/{repo} "
            "and wait for approval"
        )
    return HubError(
        f"{repo} is gated (or private): request access at {_endpoint()}/{repo}, then log in with "
        "`hf auth login` or set HF_TOKEN (or pass --token)"
    )


def _small_file(remote: RangedFile, policy: RetryPolicy) -> bytes:
    out = np.empty(remote.size, dtype=np.uint8)
    if remote.size:
        remote.read(0, out, policy)
    return out.tobytes()


def _stream(
    repo: str, commit: str, files: dict[str, Any], weights: list[str], token: str | None, model_id: str | None
) -> tuple[ModelPlan, HubReader]:
    session, headers = _session_and_headers(token)
    policy = RetryPolicy.from_env()

    def remote(name: str) -> RangedFile:
        return _remote(repo, commit, name, files[name].size, session, headers)

    config = None
    if CONFIG in files:
        try:
            config = json.loads(_small_file(remote(CONFIG), policy))
        except ValueError:
            config = None
    if ST_INDEX in files:
        from .local import weight_map_of

        try:
            weight_map = weight_map_of(json.loads(_small_file(remote(ST_INDEX), policy)))
        except ValueError:
            weight_map = None
        if weight_map is None:
            raise HubError(f"{repo}/{ST_INDEX}: not a valid safetensors index")
        weights = sorted(set(weight_map.values()))
        missing = [w for w in weights if w not in files]
        if missing:
            raise HubError(f"{repo}: the index names {missing[0]!r}, which is not in the repo at {commit[:12]}")
    remotes = [remote(name) for name in weights]
    with ThreadPoolExecutor(min(8, len(remotes)), thread_name_prefix="weightdiag-header") as pool:
        heads = list(pool.map(lambda r: _read_head(r, policy), remotes))  # latency-bound: all at once
    streamed: list[StreamedShard] = []
    shards: list[ShardInfo] = []
    tensors: list[TensorRef] = []
    metadata: dict[str, str] = {}
    seen: set[str] = set()
    for i, (name, shard, (head, first, header)) in enumerate(zip(weights, remotes, heads, strict=True)):
        sibling = files[name]
        metadata.update(header.metadata)
        lfs_sha256 = sibling.lfs.sha256 if sibling.lfs else None
        shards.append(ShardInfo(name, shard.size, lfs_sha256, hashlib.sha256(head).hexdigest()))
        streamed.append(StreamedShard(shard, name, head, first, lfs_sha256))
        for entry in header.tensors:
            if entry.name in seen:
                raise HubError(f"{repo}: tensor {entry.name!r} appears in two shards")
            seen.add(entry.name)
            tensors.append(TensorRef(entry.name, entry.dtype, entry.shape, i, entry.start, entry.end))
    plan = ModelPlan(
        model_id=model_id or repo,
        source="hub",
        location=f"{_endpoint()}/{repo}",
        shards=shards,
        tensors=tensors,
        config=config if isinstance(config, dict) else None,
        metadata=metadata,
        notes=["streamed with ranged reads (nothing written to disk)"],
    )
    return plan, HubReader(streamed, policy)


HEAD_GUESS = 256 << 10  # most safetensors headers fit: one request instead of two per shard


def _read_head(shard: RangedFile, policy: RetryPolicy):
    """The shard's length prefix + JSON header, every byte read so far, and the parsed header."""
    first = np.empty(min(shard.size, HEAD_GUESS), dtype=np.uint8)
    shard.read(0, first, policy)
    n = header_length(first[:PREFIX_BYTES].tobytes(), shard.size, shard.where)
    if PREFIX_BYTES + n > first.size:
        rest = np.empty(PREFIX_BYTES + n - first.size, dtype=np.uint8)
        shard.read(first.size, rest, policy)
        first = np.concatenate([first, rest])
    head = first[: PREFIX_BYTES + n].tobytes()
    return head, first.tobytes(), parse_header(head[PREFIX_BYTES:], shard.size, shard.where)

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

import contextlib
import hashlib
import json
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

import numpy as np

from .. import settings, tuning
from ..errors import (
    GatedRepoError,
    HubError,
    HubResponseError,
    HubUnreachableError,
    ModelPathError,
    NotCachedError,
    OptionError,
    RepoNotFoundError,
    RevisionNotFoundError,
    TransferError,
    VerificationError,
    WeightdiagError,
)
from ..settings import http_timeout
from .files import CARD_HEAD, MODEL_CARD, base_model_of
from .hub_stream import HubReader, StreamedShard
from .plan import ModelPlan, ShardInfo, TensorRef
from .ranged import RangedFile, RetryPolicy
from .reader import Reader
from .safetensors_header import PREFIX_BYTES, header_length, parse_header


@dataclass(frozen=True)
class LfsInfo:
    sha256: Any
    size: Any


@dataclass(frozen=True)
class RepoFile:
    """One entry of a model info's file list (`siblings`), as far as weightdiag reads it."""

    rfilename: str
    size: Any  # checked by _files_of for the files weightdiag reads
    blob_id: Any = None
    lfs: LfsInfo | None = None


@dataclass(frozen=True)
class ModelInfo:
    """The fields of the Hub's model info that weightdiag uses: the resolved commit and the file list.

    Parsed here rather than with huggingface_hub.hf_api.ModelInfo: importing hf_api costs 0.13-0.2 s, a
    third of a Hub fit's start-up, for two fields whose shape _parse_info checks anyway.
    """

    sha: str
    siblings: list[RepoFile]


CONFIG = "config.json"
ST_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
QUANT_CONFIG = "hf_quant_config.json"  # modelopt checkpoints: how they are quantized (see quant.group)
_STEP = re.compile(r"^step(\d+)$")


def _cache_dir() -> Path:
    return Path(settings.hf_cache_dir())


def open_hub(
    repo: str,
    revision: str | None,
    *,
    token: str | None = None,
    download: bool = False,
    model_id: str | None = None,
) -> tuple[ModelPlan, Reader]:
    """Plan a Hub model; returns (plan, reader) like the local sources."""
    if settings.hf_offline():
        return _from_cache_only(repo, revision, model_id, reason="HF_HUB_OFFLINE is set")
    try:
        info = model_info(repo, revision, token)
    except HubUnreachableError as exc:
        try:
            return _from_cache_only(repo, revision, model_id, reason="the Hub is unreachable")
        except HubError:
            raise exc from None
    commit = info.sha
    files = _files_of(repo, info)
    weights, fmt = _choose_weights(repo, revision, files)
    wanted = [f for f in (CONFIG, ST_INDEX, BIN_INDEX) if f in files] + weights
    snapshot = _cached_snapshot(repo, commit, wanted)
    if snapshot is None and (download or fmt == "bin"):
        if fmt == "bin" and not download:
            raise HubError(
                f"{repo}@{revision or 'main'} has only pytorch_model*.bin shards (pickles), which cannot be "
                "streamed; rerun with --download (they are then read with torch.load(weights_only=True))",
                repo=repo,
                revision=revision or "main",
            )
        # Download by the revision's name, so the cache also records refs/<name> (offline use later).
        snapshot = _download(repo, revision or "main", wanted, token)
        commit = snapshot.name if re.fullmatch(r"[0-9a-f]{40}", snapshot.name) else commit
        downloaded = True
    else:
        downloaded = False
    lfs = {name: (s.lfs.sha256 if s.lfs else None) for name, s in files.items()}
    if snapshot is not None:
        plan, reader = _open_snapshot(snapshot, repo, model_id)
        plan.shards = [ShardInfo(s.name, s.size, lfs.get(s.name) or s.sha256, s.header_sha256) for s in plan.shards]
        if downloaded:
            try:
                plan.verification = _verify_download(repo, revision or "main", snapshot, plan.shards)
            except BaseException:
                reader.close()
                raise
    else:
        plan, reader = _stream(repo, commit, files, weights, token, model_id)
    plan.source = "hub"
    plan.revision = revision or "main"
    plan.commit = commit
    plan.location = f"{settings.hf_endpoint()}/{repo}/tree/{commit}"
    return plan, reader


# --- resolution and errors -----------------------------------------------------------------

# Far above any real config or index (the index of a 1T-parameter model is a few MB): a bigger JSON file is
# a broken listing, and reading it would allocate that much.
MAX_JSON_BYTES = 64 << 20
MAX_API_BYTES = 128 << 20  # a model info or refs answer (repos with 100k files list a few tens of MB)
_JSON_FILES = (CONFIG, ST_INDEX, BIN_INDEX, QUANT_CONFIG)
_WEIGHT_SUFFIXES = (".safetensors", ".bin")
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
T = TypeVar("T")


class _Malformed(Exception):
    """An answer the Hub should never give (raised where it is parsed, turned into a HubResponseError by
    hub_errors)."""


def _malformed(repo: str, what: str, revision: str | None = None, file: str | None = None) -> HubResponseError:
    return HubResponseError(
        f"the Hub's answer for {repo} is malformed: {what}; try again later or use --download",
        repo=repo,
        revision=revision,
        file=file,
    )


def _too_slow(repo: str, revision: str | None = None) -> TransferError:
    return TransferError(
        f"{repo}: the Hub did not answer within {http_timeout():g} s; check the network or raise "
        "WEIGHTDIAG_HTTP_TIMEOUT",
        repo=repo,
        revision=revision,
    )


def _unreachable(exc: BaseException, repo: str | None = None) -> HubUnreachableError:
    return HubUnreachableError(
        f"cannot reach the Hub at {settings.hf_endpoint()} ({type(exc).__name__}); check the network, or set "
        "HF_HUB_OFFLINE=1 to use models already in the local cache",
        endpoint=settings.hf_endpoint(),
        repo=repo,
    )


def _json_kind(value: object) -> str:
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


class _Daemon(Generic[T]):
    """`call()` in a daemon thread whose result or exception the caller collects, or abandons.

    A daemon thread, so that an abandoned call cannot hold the process at exit (a ThreadPoolExecutor is joined
    at exit). Used where read timeouts are not enough: they bound each wait for the next bytes, not a server
    that trickles a byte now and then."""

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self._done: list[T] = []
        self._failed: list[BaseException] = []
        self._call = call
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._done.append(self._call())
        except BaseException as exc:  # handed to the caller's thread
            self._failed.append(exc)

    def result(self) -> T:
        """What the call returned (or raise what it raised); only once the thread has ended."""
        if self._failed:
            raise self._failed[0]
        return self._done[0]


def _within_deadline(repo: str, call: Callable[[], T]) -> T:
    """`call()`, abandoned after http_timeout() s with a HubError."""
    job = _Daemon(call, "weightdiag-hub-metadata")
    job.thread.join(http_timeout())
    if job.thread.is_alive():
        raise _too_slow(repo)
    return job.result()


def _api_get(url: str, token: str | None, params: dict[str, Any] | None = None) -> bytes:
    """One GET of the Hub's JSON API through huggingface_hub's session, with connect and read timeouts."""
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers(token=token, library_name="weightdiag")
    with get_session().stream("GET", url, headers=headers, params=params, timeout=http_timeout()) as response:
        if response.status_code >= 400:
            response.read()  # hf_raise_for_status quotes the body of an error
            hf_raise_for_status(response)
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_API_BYTES:
                raise _Malformed(f"more than {MAX_API_BYTES >> 20} MiB of metadata")
        return bytes(body)


def _api_url(repo: str, *rest: str) -> str:
    from huggingface_hub.utils import validate_repo_id

    validate_repo_id(repo)  # HFValidationError: the user's input (exit 2), before any request
    return "/".join([f"{settings.hf_endpoint()}/api/models/{repo}", *(quote(part, safe="") for part in rest)])


def model_info(repo: str, revision: str | None, token: str | None) -> ModelInfo:
    """The model info with file sizes and LFS hashes, within the deadline; an answer that is not
    a model info (not a JSON object, no commit id, file list of the wrong shape) is a HubError (exit 3)."""
    with hub_errors(repo, revision, token):
        url = _api_url(repo, *(("revision", revision) if revision is not None else ()))
        body = _within_deadline(repo, lambda: _api_get(url, token, {"blobs": True}))
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json's C scanner can go
            raise _Malformed("the model info is not JSON") from None
        if not isinstance(data, dict):
            raise _Malformed(f"the model info is {_json_kind(data)}, not an object")
        siblings = data.get("siblings")
        if not isinstance(siblings, list):
            raise _Malformed(f"the file list (siblings) is {_json_kind(siblings)}, not a list")
        if bad := [s for s in siblings if not isinstance(s, dict) or not isinstance(s.get("rfilename"), str)]:
            what = "an entry without a file name (rfilename)" if isinstance(bad[0], dict) else _json_kind(bad[0])
            raise _Malformed(f"the file list (siblings) holds {what}")
        if not isinstance(sha := data.get("sha"), str) or not _HEX40.fullmatch(sha):
            raise _Malformed(f"the commit id (sha) is {_json_kind(sha)}, not 40 hex digits")
        files = []
        for entry in siblings:
            lfs = entry.get("lfs")
            if lfs is not None and not isinstance(lfs, dict):
                raise _Malformed(f"the LFS entry of {entry['rfilename']} is {_json_kind(lfs)}, not an object")
            lfs_info = LfsInfo(lfs.get("sha256"), lfs.get("size")) if lfs is not None else None
            files.append(RepoFile(entry["rfilename"], entry.get("size"), entry.get("blobId"), lfs_info))
        return ModelInfo(sha, files)


def list_refs(repo: str, token: str | None) -> list[tuple[str, str]]:
    """(name, commit) of every branch, then every tag, within the deadline; malformed answers are HubErrors."""
    with hub_errors(repo, None, token):
        url = _api_url(repo, "refs")
        body = _within_deadline(repo, lambda: _api_get(url, token))
        try:
            data = json.loads(body)
            refs = [(ref["name"], ref["targetCommit"]) for key in ("branches", "tags") for ref in data[key]]
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            raise _Malformed(f"its list of branches and tags cannot be read ({type(exc).__name__})") from None
        if not all(isinstance(name, str) and isinstance(sha, str) and _HEX40.fullmatch(sha) for name, sha in refs):
            raise _Malformed("a branch or tag has no name or no 40-hex commit")
        return refs


def _files_of(repo: str, info: ModelInfo) -> dict[str, RepoFile]:
    """The siblings by name, after checking the sizes and hashes of every file weightdiag may read."""
    files = {s.rfilename: s for s in info.siblings or []}
    for name, sibling in files.items():
        is_json = name in _JSON_FILES or name.endswith("/" + ST_INDEX)
        if not (is_json or name.endswith(_WEIGHT_SUFFIXES)):
            continue
        size = sibling.size
        if size is None:
            raise _malformed(repo, f"{name} is listed without a size", file=name)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _malformed(repo, f"{name} is listed with size {size!r}", file=name)
        if is_json and size > MAX_JSON_BYTES:
            raise _malformed(
                repo, f"{name} is listed with {size} bytes (a JSON file of at most 64 MiB is expected)", file=name
            )
        lfs = sibling.lfs
        if lfs is not None and not (isinstance(lfs.sha256, str) and _HEX64.fullmatch(lfs.sha256)):
            raise _malformed(repo, f"{name} is listed with an LFS sha256 that is not 64 hex digits", file=name)
        if lfs is not None and lfs.size != size:
            raise _malformed(repo, f"{name} is listed with two sizes ({size} and LFS {lfs.size!r})", file=name)
    return files


def _network_error(repo: str, exc: BaseException, revision: str | None = None) -> WeightdiagError | None:
    """The HubError for a transport failure (or an OptionError for an unusable HF_ENDPOINT); None if `exc`
    is not one."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "FileMetadataError" in names:  # a /resolve answer without X-Repo-Commit or ETag
        return _malformed(repo, f"a file's answer lacks the Hub's headers ({str(exc).split('.')[0][:120]})", revision)
    if "TooManyRedirects" in names:
        return _malformed(repo, "it redirects in a loop", revision)
    # httpx (huggingface_hub 1.x) reports a Location it cannot parse as a RemoteProtocolError ("Invalid URL in
    # location header"), httpx2 as InvalidURL: a malformed answer either way, not an unreachable Hub.
    bad_location = "RemoteProtocolError" in names and "location header" in str(exc).lower()
    if names & {"UnsupportedProtocol", "InvalidURL"} or bad_location or (type(exc) is ValueError and "URL" in str(exc)):
        if urlsplit(settings.hf_endpoint()).scheme not in ("http", "https"):
            return OptionError(
                f"HF_ENDPOINT={settings.hf_endpoint()!r} is not an http(s) URL; fix or unset it", param="HF_ENDPOINT"
            )
        return _malformed(repo, f"it redirects to an unusable location ({str(exc)[:120]})", revision)
    if names & {"ConnectTimeout", "ConnectError"}:
        return _unreachable(exc, repo)
    if isinstance(exc, TimeoutError) or "TimeoutException" in names:
        return _too_slow(repo, revision)
    module = type(exc).__module__.split(".")[0]
    if module in ("httpx2", "httpx", "httpcore2", "httpcore", "requests", "urllib3"):
        return _unreachable(exc, repo)  # refused, reset, DNS, TLS, a cut connection
    if isinstance(exc, (ConnectionError, socket.gaierror, socket.herror, ssl.SSLError)):
        return _unreachable(exc, repo)  # not other OSErrors: a full disk or an unwritable cache is no network failure
    return None


@contextmanager
def hub_errors(repo: str, revision: str | None, token: str | None) -> Iterator[None]:
    """Turn huggingface_hub and network exceptions into one-line HubErrors (exit code 3)."""
    from huggingface_hub import errors as hf

    try:
        yield
    except _Malformed as exc:
        raise _malformed(repo, str(exc), revision) from None
    except hf.GatedRepoError as exc:
        status = _status_of(exc)
        if status == 403 or token or settings.hf_token_env():
            raise GatedRepoError(
                f"{repo} is gated and this token has no access yet: request access at {settings.hf_endpoint()}/{repo} "
                "and wait for approval",
                repo=repo,
                status=status,
            ) from None
        raise GatedRepoError(
            f"{repo} is gated: request access at {settings.hf_endpoint()}/{repo}, then log in with `hf auth login` "
            "or set HF_TOKEN (or pass --token)",
            repo=repo,
            status=status,
        ) from None
    except hf.RevisionNotFoundError:
        raise RevisionNotFoundError(
            f"{repo}: revision {revision!r} not found{_nearest_steps(repo, revision, token)}",
            repo=repo,
            revision=revision,
        ) from None
    except hf.RepositoryNotFoundError:
        raise repo_not_found(repo) from None
    except hf.HfHubHTTPError as exc:
        status = _status_of(exc)
        names = {cls.__name__ for cls in type(exc).__mro__}
        if status == 404 and not names & {"EntryNotFoundError", "RemoteEntryNotFoundError"}:
            # A 404 without the Hub's error code (a bare NAME with no ORG/ on some Hub versions): the repo is not
            # there, which waiting will not change (it read "HTTP 404; try again later": issue 42).
            raise repo_not_found(repo) from None
        raise HubResponseError(
            f"{repo}: the Hub answered HTTP {status if status is not None else '?'}; try again later",
            repo=repo,
            revision=revision,
            status=status,
        ) from None
    except hf.HFValidationError as exc:  # the id breaks the Hub's naming rules: the user's input
        raise _invalid_id(repo, exc) from None
    except hf.LocalEntryNotFoundError as exc:  # hf_hub_download: the Hub failed and the cache has no copy
        cause = _network_error(repo, exc.__cause__, revision) if exc.__cause__ else None
        raise cause or _unreachable(exc, repo) from None
    except WeightdiagError:
        raise
    except Exception as exc:
        if (error := _network_error(repo, exc, revision)) is None:
            raise
        raise error from None


def repo_not_found(repo: str, hint: str = "") -> RepoNotFoundError:
    """No repository `repo` on the Hub; `hint`: " (did you mean X?)" from what the caller knows (the cohort and
    the database: run.fitting), said right after the name."""
    check = "check the id (a Hub id is ORG/NAME)" if "/" not in repo else "check the id"
    return RepoNotFoundError(
        f"{repo}: no such model repository on {settings.hf_endpoint()}{hint}; {check}, or for a private repo set "
        "HF_TOKEN or pass --token",
        repo=repo,
    )


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of a huggingface_hub error's response, None without one."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _invalid_id(repo: str, exc: Exception) -> ModelPathError:
    reason = str(exc).splitlines()[0].rsplit(": ", 1)[0].rstrip(".")[:200] if str(exc) else type(exc).__name__
    return ModelPathError(f"{repo}: not a valid Hub repo id ({reason}); use ORG/NAME[@REVISION]", path=repo)


def _nearest_steps(repo: str, revision: str | None, token: str | None) -> str:
    """For Pythia-style `stepN` revisions, name the nearest existing ones."""
    if not _STEP.match(revision or ""):
        return "; check the branch, tag or commit name"
    try:
        refs = list_refs(repo, token)
    except WeightdiagError:  # only a hint: the error being reported is the revision
        return ""
    return nearest_revisions(revision or "", [name for name, _ in refs])


def nearest_revisions(revision: str, names: list[str]) -> str:
    """What to say of the revisions `names` when `revision` is not among them (the same words for `fit ORG/NAME@REV`
    and `sweep --revisions`): for a `stepN`, the three nearest steps; else the names closest to it; else a few."""
    import difflib

    match = _STEP.match(revision)
    if match:
        steps = sorted(int(m.group(1)) for name in names if (m := _STEP.match(name)))
        if not steps:
            return "; this repo has no step* branches"
        want = int(match.group(1))
        nearest = sorted(steps, key=lambda s: (abs(s - want), s))[:3]
        return "; nearest existing: " + ", ".join(f"step{s}" for s in sorted(nearest))
    close = difflib.get_close_matches(revision, names, n=3, cutoff=0.6)
    if close:
        return "; nearest existing: " + ", ".join(close)
    if names:
        return "; existing: " + ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
    return "; check the branch, tag or commit name"


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
        "at the top level); pick another revision",
        repo=repo,
        revision=revision or "main",
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
        from .files import load_weight_map

        shards = set(load_weight_map(folder / ST_INDEX).values())
        for shard in shards:
            if not isinstance(try_to_load_from_cache(repo, shard, cache_dir=_cache_dir(), revision=commit), str):
                return None
    return folder


def _from_cache_only(repo: str, revision: str | None, model_id: str | None, reason: str) -> tuple[ModelPlan, Reader]:
    from huggingface_hub import errors as hf
    from huggingface_hub import snapshot_download

    where = f"{repo}@{revision or 'main'}"
    advice = "connect to the network (unset HF_HUB_OFFLINE) or fit a local folder"
    try:
        folder = Path(snapshot_download(repo, revision=revision, cache_dir=_cache_dir(), local_files_only=True))
    except hf.HFValidationError as exc:  # the user's input (exit 2), offline as online
        raise _invalid_id(repo, exc) from None
    except (hf.LocalEntryNotFoundError, OSError, ValueError):
        raise NotCachedError(
            f"{where} is not in the local cache ({_cache_dir()}) and {reason}; {advice}", repo=repo, revision=revision
        ) from None
    if not _snapshot_complete(folder):  # a cached config.json or index without its weights
        raise NotCachedError(
            f"{where} is only partly in the local cache ({folder}) and {reason}; {advice}", repo=repo, revision=revision
        )
    plan, reader = _open_snapshot(folder, repo, model_id)
    plan.source = "hub"
    plan.revision = revision or "main"
    plan.notes.append(f"read from the local HF cache: {reason}")
    return plan, reader


def _snapshot_complete(folder: Path) -> bool:
    """Whether a cached snapshot holds its weights: every shard of an index, or else a top-level weight file
    (is_file() is False for a link whose blob is gone)."""
    if not folder.is_dir():
        return False
    for index in (ST_INDEX, BIN_INDEX):
        if (folder / index).is_file():
            from .files import load_weight_map

            return all((folder / shard).is_file() for shard in set(load_weight_map(folder / index).values()))
    return any(p.is_file() for pattern in ("*.safetensors", "pytorch_model*.bin") for p in folder.glob(pattern))


@contextmanager
def _download_timeouts() -> Iterator[float]:
    """WEIGHTDIAG_HTTP_TIMEOUT as huggingface_hub's timeouts while downloading: the etag_timeout argument covers
    the first HEAD only; the body reads and the HEAD retried after a failure read module globals at call time
    (HF_HUB_DOWNLOAD_TIMEOUT, default 10 s, and _ETAG_RETRY_TIMEOUT, 60 s). Restored afterwards."""
    from huggingface_hub import constants, file_download

    limit = http_timeout()
    saved = [
        (module, name, getattr(module, name))
        for module, name in (
            (constants, "HF_HUB_DOWNLOAD_TIMEOUT"),
            (file_download, "_ETAG_RETRY_TIMEOUT"),
        )
        if hasattr(module, name)
    ]
    for module, name, _ in saved:
        setattr(module, name, limit)
    try:
        yield limit
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _watched(call: Callable[[], T], blobs: Path, limit: float, repo: str, name: str) -> T:
    """`call()` (one hf_hub_download) in a daemon thread, watched by the growth of its partial file.

    huggingface_hub's read timeout ends a download that stalls, but not one that trickles a few bytes now and
    then; its partial file in the cache (blobs/*.incomplete) shows how far it got. Some bytes but less than
    MIN_PROGRESS in twice `limit` seconds is a trickle; nothing for longer than huggingface_hub's own timeouts and
    retries take is a dead server. Either is abandoned (a daemon thread cannot hold the process at exit), exit 3.
    """
    from .ranged import MIN_PROGRESS

    def partial_bytes() -> int:
        try:
            return sum(p.stat().st_size for p in blobs.glob("*.incomplete"))
        except OSError:
            return 0

    what = f"{repo}/{name}"
    job = _Daemon(call, "weightdiag-download")
    thread = job.thread
    window = 2 * limit
    mark = partial_bytes()
    marked_at = grew_at = time.monotonic()
    while thread.is_alive():
        thread.join(min(0.25, limit / 4))
        now, size = time.monotonic(), partial_bytes()
        if size < mark:  # a file finished and the next one began
            mark, marked_at, grew_at = size, now, now
            continue
        if size > mark:
            grew_at = now
        if not thread.is_alive() or now - marked_at < window:
            continue
        if 0 < size - mark < MIN_PROGRESS:  # bytes keep coming, too slowly for a read timeout to fire
            raise TransferError(
                f"{what}: the server stopped sending (less than {MIN_PROGRESS >> 10} KiB in {window:g} s); check "
                "your connection, or raise WEIGHTDIAG_HTTP_TIMEOUT for a very slow link",
                repo=repo,
                file=name,
            )
        if now - grew_at > 4 * limit + 10:  # silent for longer than huggingface_hub's timeouts and retries take
            raise TransferError(
                f"{what}: the server stopped sending (nothing for {now - grew_at:.0f} s); check your connection, "
                "or raise WEIGHTDIAG_HTTP_TIMEOUT for a very slow link",
                repo=repo,
                file=name,
            )
        mark, marked_at = size, now
    return job.result()


def _verify_download(repo: str, revision: str, snapshot: Path, shards: list[ShardInfo]) -> dict[str, Any]:
    """The sha256 of every downloaded shard against the Hub's LFS hash (huggingface_hub does not check it).

    A mismatch removes the damaged copy from the cache, so that running the command again downloads it anew.
    """
    verified = []
    for shard in shards:
        if not shard.sha256:
            verified.append(False)
            continue
        path = snapshot / shard.name
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(8 << 20):
                digest.update(block)
        got = digest.hexdigest()
        if got != shard.sha256:
            for damaged in {path.resolve(), path}:
                with contextlib.suppress(OSError):
                    damaged.unlink()
            raise VerificationError(
                f"{repo}@{revision}: the downloaded {shard.name} does not match the Hub's sha256 (got {got[:12]}..., "
                f"expected {shard.sha256[:12]}...): the download was corrupted; the damaged copy was removed from the "
                "cache and nothing was written, run the command again",
                repo=repo,
                file=shard.name,
                expected=shard.sha256,
                got=got,
            )
        verified.append(True)
    summary = (
        "sha256 of every downloaded shard verified against the Hub"
        if all(verified)
        else "not verified: no sha256 published for some shards"
    )
    return {"summary": summary, "shards": verified}


def _download(repo: str, revision: str, names: list[str], token: str | None) -> Path:
    from huggingface_hub import errors as hf
    from huggingface_hub import hf_hub_download

    folder = None
    todo = list(names)
    with _download_timeouts() as limit:
        while todo:
            name = todo.pop(0)
            try:
                # The same lines as everywhere for gated repos, malformed answers, timeouts and the network.
                with hub_errors(repo, revision, token):
                    try:
                        path = _watched(
                            partial(
                                hf_hub_download,
                                repo,
                                name,
                                revision=revision,
                                cache_dir=_cache_dir(),
                                token=token,
                                endpoint=settings.hf_endpoint(),
                                etag_timeout=limit,
                            ),
                            _cache_dir() / f"models--{repo.replace('/', '--')}" / "blobs",
                            limit,
                            repo,
                            name,
                        )
                    except hf.RemoteEntryNotFoundError:  # listed in the model info, yet /resolve says 404
                        raise HubResponseError(
                            f"{repo}: {name} is listed but the Hub does not serve it at {revision}; try again later",
                            repo=repo,
                            revision=revision,
                            file=name,
                            status=404,
                        ) from None
            except (WeightdiagError, PermissionError):  # an unwritable cache is the user's to fix (exit 2)
                raise
            except Exception as exc:  # a damaged download, a full disk: name the file
                what = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) else type(exc).__name__
                raise TransferError(
                    f"{repo}: downloading {name} failed ({what})", repo=repo, revision=revision, file=name
                ) from None
            folder = Path(path)
            for _ in PurePosixPath(name).parts:  # the snapshot root, also for shards in sub-folders
                folder = folder.parent
            if name in (ST_INDEX, BIN_INDEX):
                from .files import load_weight_map

                shards = sorted(set(load_weight_map(Path(path)).values()))
                todo += [s for s in shards if s not in todo and s not in names]
    assert folder is not None
    return folder


def _open_snapshot(folder: Path, repo: str, model_id: str | None) -> tuple[ModelPlan, Reader]:
    from .local import open_local

    return open_local(folder, model_id or repo)


# --- streaming ---------------------------------------------------------------------------------


def _session_and_headers(token: str | None) -> tuple[Any, dict[str, str]]:
    from huggingface_hub.utils import build_hf_headers, get_session

    return get_session(), build_hf_headers(token=token, library_name="weightdiag")


def _remote(
    repo: str, commit: str, name: str, size: int, session, headers: dict[str, str], endpoint: str | None = None
) -> RangedFile:
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, name, revision=commit, endpoint=endpoint or settings.hf_endpoint())
    signed_in = "authorization" in {k.lower() for k in headers}
    return RangedFile(
        url,
        size,
        session,
        headers,
        f"{repo}/{name}",
        lambda status: _denied(repo, name, status, signed_in),
        repo=repo,
        file=name,
    )


def _denied(repo: str, name: str, status: int, signed_in: bool) -> GatedRepoError:
    """A file read refused by the Hub itself: gated repos serve their metadata to anyone and refuse only
    file reads, with 401 to anonymous users and 403 to tokens without access."""
    if status == 403 or signed_in:
        return GatedRepoError(
            f"{repo} is gated and this token has no access yet: request access at {settings.hf_endpoint()}/{repo} "
            "and wait for approval",
            repo=repo,
            status=status,
            file=name,
        )
    return GatedRepoError(
        f"{repo} is gated (or private): request access at {settings.hf_endpoint()}/{repo}, then log in with "
        "`hf auth login` or set HF_TOKEN (or pass --token)",
        repo=repo,
        status=status,
        file=name,
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
        except (ValueError, RecursionError):  # a config is optional: an unreadable one is ignored
            config = None
        if not isinstance(config, dict):  # `[1, 2]` or `3` is no config either
            config = None
    quant_config = None
    if QUANT_CONFIG in files:
        try:
            quant_config = json.loads(_small_file(remote(QUANT_CONFIG), policy))
        except (ValueError, RecursionError):
            quant_config = None
        if not isinstance(quant_config, dict):
            raise HubResponseError(
                f"{repo}/{QUANT_CONFIG}: not a JSON object", repo=repo, revision=commit, file=QUANT_CONFIG
            )
    base_model = None
    quantized = quant_config is not None or bool({"quantization_config", "compression_config"} & set(config or {}))
    if quantized and MODEL_CARD in files:  # what to fit instead, should the quantization be refused
        card = remote(MODEL_CARD)
        head = np.empty(min(card.size, CARD_HEAD), dtype=np.uint8)
        try:  # advice only: a card that cannot be read leaves the general advice, never fails the fit
            if head.size:
                card.read(0, head, policy)
            base_model = base_model_of(head.tobytes().decode("utf-8", errors="replace"))
        except HubError:
            base_model = None
    if ST_INDEX in files:
        from .files import weight_map_of

        try:
            weight_map = weight_map_of(json.loads(_small_file(remote(ST_INDEX), policy)))
        except (ValueError, RecursionError):
            weight_map = None
        if weight_map is None:
            raise HubResponseError(
                f"{repo}/{ST_INDEX}: not a valid safetensors index", repo=repo, revision=commit, file=ST_INDEX
            )
        weights = sorted(set(weight_map.values()))
        missing = [w for w in weights if w not in files]
        if missing:
            raise HubResponseError(
                f"{repo}: the index names {missing[0]!r}, which is not in the repo at {commit[:12]}",
                repo=repo,
                revision=commit,
                file=ST_INDEX,
            )
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
                raise HubResponseError(
                    f"{repo}: tensor {entry.name!r} appears in two shards", repo=repo, revision=commit, file=name
                )
            seen.add(entry.name)
            tensors.append(TensorRef(entry.name, entry.dtype, entry.shape, i, entry.start, entry.end))
    plan = ModelPlan(
        model_id=model_id or repo,
        source="hub",
        location=f"{settings.hf_endpoint()}/{repo}",
        shards=shards,
        tensors=tensors,
        config=config if isinstance(config, dict) else None,
        metadata=metadata,
        notes=["streamed with ranged reads (nothing written to disk)"],
        quant_config=quant_config,
        base_model=base_model,
    )
    return plan, HubReader(streamed, policy)


def _read_head(shard: RangedFile, policy: RetryPolicy):
    """The shard's length prefix + JSON header, every byte read so far, and the parsed header."""
    first = np.empty(min(shard.size, tuning.current().head_guess), dtype=np.uint8)
    shard.read(0, first, policy)
    n = header_length(first[:PREFIX_BYTES].tobytes(), shard.size, shard.where)
    if PREFIX_BYTES + n > first.size:
        rest = np.empty(PREFIX_BYTES + n - first.size, dtype=np.uint8)
        shard.read(first.size, rest, policy)
        first = np.concatenate([first, rest])
    head = first[: PREFIX_BYTES + n].tobytes()
    return head, first.tobytes(), parse_header(head[PREFIX_BYTES:], shard.size, shard.where)

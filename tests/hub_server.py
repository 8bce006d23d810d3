"""A fake Hugging Face Hub on loopback, for tests (see /work/shared/guides/offline-testing.md).

`FakeHub` is a real `http.server.ThreadingHTTPServer` on 127.0.0.1 speaking the subset of the Hub protocol
that huggingface_hub 1.x/2.x uses to read models: model info, refs, tree listings and `/resolve` downloads
(302 to a signed "CDN" URL for LFS files, direct answers for small git files, HTTP ranges everywhere).
It counts requests and bytes, throttles bandwidth and injects faults. The `fake_hub` fixture starts one and
points huggingface_hub (environment and already-imported constants) at it.

    hub.add_repo("org/model", {"config.json": b"{}", "model.safetensors": Path(...)})  # -> commit sha
    hub.add_repo("org/model", {...}, branch="step1000")    # another branch, its own files and commit
    hub.add_tag("org/model", "v1.0", "main")               # a tag on a branch or commit
    hub.add_folder("org/model", folder)                    # every file of a folder, served from disk
    hub.fail("429", "model-00001", times=2, retry_after=1) # fault injection (kinds in `FakeHub.fail`)
    hub.fail("stall", "/cdn/", after_bytes=100)            # body faults: drop stall trickle gzip corrupt short
    hub.fail("redirect_loop", "config.json", times=None)   # /resolve faults: redirect_loop, bad_redirect
    hub.bandwidth = 4e6                                    # bytes/s shared by all connections
    hub.connection_bandwidth = 1e6                         # bytes/s of file bodies per TCP connection
    hub.xet = True                                         # LFS files redirect to a second server (/xet/)
    hub.expire_cdn_urls()                                  # CDN and bridge URLs issued so far answer 403
    hub.requests, hub.bytes_sent, hub.file_bytes_sent, hub.connections, hub.reset_counters()

Malformed metadata: model info (/api/models/R and /api/models/R/revision/X) can be replaced per request or
patched per file, to test what a client does with an answer the real Hub should never give:

    hub.fail("api_body", "org/model", body=b"[1,2]", times=None)          # raw bytes instead of the document
    hub.fail("api_body", "org/model", doc={"id": "org/model"})            # another JSON document
    hub.fail("api_body", "org/model", mutate=lambda info: info.pop("sha"))  # edit a deep copy of the real one
    hub.override_sibling("org/model", "config.json", size=2**45)          # one sibling's fields, every answer
    hub.override_sibling("org/model", "model.safetensors", size=MISSING)  # MISSING deletes the field
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import hashlib
import hmac
import http.server
import json
import math
import os
import re
import select
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

import numpy as np
import pytest

from weightdiag.testing import synthetic

# Patterns a Hub repo's default .gitattributes stores in LFS.
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".npy", ".npz")
DATE = "2024-01-01T00:00:00.000Z"
_API_SUBPATHS = {"revision", "tree", "refs", "resolve", "paths-info", "commits", "discussions"}
_RANGE = re.compile(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", re.IGNORECASE)
_UNSATISFIABLE = (-1, -1)
_STATUS_PARAMS = {"retry_after"}
_FAULT_PARAMS: dict[str, set[str]] = {
    "drop": {"after_bytes", "reset"},
    "ignore_range": set(),
    "delay": {"seconds"},
    "stall": {"after_bytes", "seconds", "api"},
    "trickle": {"after_bytes", "rate", "api"},
    "gzip": set(),
    "corrupt": {"at"},
    "short": {"missing"},
    "api_body": {"body", "doc", "mutate", "status"},
    "redirect_loop": set(),
    "bad_redirect": {"location"},
}
_BODY_FAULTS = ("drop", "stall", "trickle", "gzip", "corrupt", "short")  # at most one per file body
_POLL = 0.05  # seconds between checks for a stopping hub or a client that went away
MISSING: Any = object()  # override_sibling(..., field=MISSING) deletes the field from the sibling
_HASH_CACHE: dict[tuple[str, int, int], tuple[str, str]] = {}  # (path, size, mtime) -> (sha256, lfs-less git oid)
_HASH_CACHE_LOCK = threading.Lock()


def _xet_hash(sha256: str) -> str:
    # Xet names content by a Merkle hash of its chunks, not by its sha256: any other stable 64-hex name will do.
    return hashlib.sha256(b"xet\0" + bytes.fromhex(sha256)).hexdigest()


def _git_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _hash_file(path: Path, size: int) -> tuple[str, str]:
    """sha256 and git blob oid of a file, streamed; cached so that big real checkpoints are hashed once."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _HASH_CACHE_LOCK:
        if key in _HASH_CACHE:
            return _HASH_CACHE[key]
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha256.update(chunk)
            sha1.update(chunk)
    result = (sha256.hexdigest(), sha1.hexdigest())
    with _HASH_CACHE_LOCK:
        _HASH_CACHE[key] = result
    return result


@dataclass(frozen=True)
class Blob:
    """One file's content: in memory (`data`) or on disk (`path`, read by ranges, never loaded whole)."""

    size: int
    sha256: str
    git_oid: str  # oid of what git stores: the content, or the LFS pointer for LFS files
    lfs: bool
    pointer_size: int  # 0 when not LFS
    data: bytes | None = None
    path: Path | None = None

    def chunks(self, start: int, length: int, chunk: int) -> Iterator[bytes]:
        if self.data is not None:
            view = memoryview(self.data)
            for pos in range(start, start + length, chunk):
                yield bytes(view[pos : min(pos + chunk, start + length)])
            return
        assert self.path is not None
        with open(self.path, "rb") as f:
            f.seek(start)
            left = length
            while left > 0:
                piece = f.read(min(chunk, left))
                if not piece:
                    raise OSError(f"{self.path} shrank while being served")
                left -= len(piece)
                yield piece

    def read(self, start: int = 0, length: int | None = None) -> bytes:
        length = self.size - start if length is None else length
        return b"".join(self.chunks(start, length, 1 << 20))


@dataclass(frozen=True)
class Commit:
    sha: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_id: str
    gated: str | None = None
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit sha
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)  # every commit ever added stays resolvable

    def commit(self, rev: str) -> Commit | None:
        sha = self.branches.get(rev) or self.tags.get(rev) or (rev if rev in self.commits else None)
        return self.commits.get(sha) if sha else None


class Logged(NamedTuple):
    method: str
    path: str  # percent-decoded, without the query
    range: str | None
    status: int
    authorized: bool = False  # an Authorization header came with the request


@dataclass
class Fault:
    kind: str
    match: str
    times: int | None  # None: until clear_faults()
    method: str | None
    params: dict[str, Any]


class Pacer:
    """A link of `rate` bytes/s as a virtual clock: each piece books n/rate seconds after the previous booking
    (or now, if the link was idle longer than BURST) and its sender sleeps until its booking ends.

    BURST is the token bucket's depth: a sender that woke up late (a busy machine) catches up instead of
    losing that time for good, as a real rate limiter does; an idle link earns no more than that."""

    BURST = 0.05  # seconds

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0

    def delay(self, n: int, rate: float | None, now: float) -> float:
        """Book n bytes at `now`; returns the seconds to wait before sending them (0 without a rate)."""
        if not rate:
            return 0.0
        with self._lock:
            self._next = max(now - self.BURST, self._next) + n / rate
            return self._next - now

    def pace(self, n: int, rate: float | None) -> None:
        if (wait := self.delay(n, rate, time.monotonic())) > 0:
            time.sleep(wait)


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class FakeHub:
    """The server and its content. Public knobs (plain attributes, change them at any time):

    redirects: LFS files answer /resolve with 302 to /cdn/<sha256> (False: answer directly, like a mirror).
    cdn_host: host name in the CDN Location. "localhost" is another origin than 127.0.0.1, as cdn-lfs.hf.co is
        for huggingface.co: the client then reads metadata off the 302 and drops the token for the CDN.
    cdn_ttl: seconds a signed CDN URL stays valid. bandwidth: bytes/s for all bodies together, None = no limit.
    ignore_range: True, or a path substring: Range is ignored and the whole file sent with 200.
    connection_bandwidth: bytes/s of file bodies per TCP connection (as CDN edges cap each connection), on top
        of `bandwidth`; None = no limit. Both pace in 64 KiB pieces.
    xet: LFS files answer /resolve with 302 to a second server (the "bridge", on its own port, like
        cas-bridge.xethub.hf.co) at /xet/<xet hash>?X-Xet-Expires=..&X-Xet-Signature=.. (its own signing key,
        valid `cdn_ttl` s), with an `X-Xet-Hash` header; the bridge serves ranges like the CDN and its requests
        are logged with paths starting "/xet/". No `Link: rel="xet-auth"` is sent, so huggingface_hub reads the
        bridge over plain HTTP (as it does without hf_xet) instead of trying the Xet CAS protocol. Wins over
        `redirects`.
    cdn_origin: an external origin (e.g. "http://127.0.0.1:8081", nginx serving a folder of files named by their
        sha256): LFS files answer /resolve with 302 to <cdn_origin>/<sha256>, unsigned, and the bodies, faults and
        counters are that origin's (benchmarks/bench_hub_origin.py). Wins over `xet` and `redirects`.
    approved_tokens: bearer tokens granted access to gated repos. gate_api: gate /api/* too (the real Hub
        serves the metadata of gated repos to anyone and gates only /resolve, with the same X-Error-Code
        GatedRepo and X-Error-Message texts as here: 401 without a token, 403 with a token not approved).
    tree_page_size: entries per /tree page (the Hub's 1000; 50 with expand); pages are linked with `Link`.
    """

    def __init__(
        self, *, redirects: bool = True, lfs_threshold: int = 1024, cdn_host: str = "localhost", xet: bool = False
    ):
        self.redirects = redirects
        self.xet = xet
        self.lfs_threshold = lfs_threshold
        self.cdn_host = cdn_host
        self.cdn_ttl = 3600.0
        self.cdn_origin: str | None = None
        self.bandwidth: float | None = None
        self.connection_bandwidth: float | None = None
        self.ignore_range: bool | str = False
        self.approved_tokens: set[str] = set()
        self.gate_api = False
        self.tree_page_size = 1000
        self.requests: list[Logged] = []
        self.bytes_sent = 0  # every body byte written (JSON included)
        self.file_bytes_sent = 0  # file content bytes only
        self.connections = 0  # TCP connections accepted (keep-alive reuse shows as few)
        self.errors: list[str] = []  # tracebacks of the fake's own bugs (the fixture fails the test on any)
        self._lock = threading.RLock()
        self._link = Pacer()  # the shared `bandwidth`
        self._repos: dict[str, Repo] = {}
        self._blobs: dict[str, Blob] = {}  # sha256 -> blob, for the CDN
        self._blob_names: dict[str, set[str]] = {}
        self._xet_hashes: dict[str, str] = {}  # xet hash -> sha256, for the bridge
        self._faults: list[Fault] = []
        self._sibling_overrides: dict[tuple[str, str], dict[str, Any]] = {}
        self._cdn_epoch = 0
        self._secret = os.urandom(16)
        self._xet_secret = os.urandom(16)
        self._safetensors_params: dict[str, dict[str, int] | None] = {}
        self._stopping = threading.Event()  # held connections (stall, trickle) end when it is set
        self._server: _Server | None = None
        self._bridge: _Server | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> FakeHub:
        self._stopping.clear()
        self._server, self._bridge = _Server(self), _Server(self, bridge=True)
        for server, name in ((self._server, "fake-hub"), (self._bridge, "fake-hub-xet-bridge")):
            # A short poll interval: shutdown() waits for the next poll.
            thread = threading.Thread(target=server.serve_forever, args=(0.02,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._stopping.set()  # before shutdown: stalled and trickling handlers let go of their connections
        for server in (self._server, self._bridge):
            assert server is not None
            server.shutdown()
            server.close_all()  # idle keep-alive handlers would otherwise wait for their socket timeout
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()
        self._server = self._bridge = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the hub first"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bridge_port(self) -> int:
        assert self._bridge is not None, "start() the hub first"
        return self._bridge.server_address[1]

    # -- content ---------------------------------------------------------------------------------------------

    def add_repo(
        self, repo_id: str, files: Mapping[str, bytes | Path], branch: str = "main", gated: str | None = None
    ) -> str:
        """Create or update `repo_id`: `branch` now points to a new commit holding exactly `files`.

        `gated` ("auto"/"manual") gates the repo; None leaves an existing repo as it was. Returns the commit sha
        (deterministic: sha1 of repo, branch and file listing).
        """
        blobs = {name.strip("/"): self._make_blob(name, src) for name, src in sorted(files.items())}
        listing = "".join(f"{name}\0{blob.sha256}\n" for name, blob in blobs.items())
        sha = hashlib.sha1(f"{repo_id}\0{branch}\0{listing}".encode()).hexdigest()
        with self._lock:
            repo = self._repos.setdefault(repo_id, Repo(repo_id))
            if gated is not None:
                repo.gated = gated
            repo.commits[sha] = Commit(sha, blobs)
            repo.branches[branch] = sha
            for name, blob in blobs.items():
                if blob.lfs:
                    self._blobs[blob.sha256] = blob
                    self._blob_names.setdefault(blob.sha256, set()).add(name)
                    self._xet_hashes[_xet_hash(blob.sha256)] = blob.sha256
        return sha

    def add_folder(self, repo_id: str, folder: str | Path, branch: str = "main", gated: str | None = None) -> str:
        """Serve every file under `folder` (from disk) as the content of `branch`."""
        root = Path(folder)
        files: dict[str, bytes | Path] = {
            p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()
        }
        return self.add_repo(repo_id, files, branch=branch, gated=gated)

    def add_tag(self, repo_id: str, tag: str, commit: str) -> str:
        """Tag a commit (given as a sha, branch or tag); returns the sha."""
        with self._lock:
            target = self._repos[repo_id].commit(commit)
            if target is None:
                raise KeyError(f"{repo_id} has no revision {commit!r}")
            self._repos[repo_id].tags[tag] = target.sha
            return target.sha

    def blob(self, repo_id: str, path: str, rev: str = "main") -> Blob:
        with self._lock:
            commit = self._repos[repo_id].commit(rev)
            assert commit is not None, f"{repo_id} has no revision {rev!r}"
            return commit.files[path]

    def _make_blob(self, name: str, src: bytes | Path) -> Blob:
        if isinstance(src, (bytes, bytearray, memoryview)):
            data = bytes(src)
            size, path = len(data), None
            sha256, git_oid = hashlib.sha256(data).hexdigest(), _git_oid(data)
        else:
            data, path = None, Path(src).resolve()
            size = path.stat().st_size
            sha256, git_oid = _hash_file(path, size)
        lfs = name.endswith(LFS_SUFFIXES) or size >= self.lfs_threshold
        pointer_size = 0
        if lfs:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
            git_oid, pointer_size = _git_oid(pointer), len(pointer)
        return Blob(size, sha256, git_oid, lfs, pointer_size, data, path)

    # -- faults and knobs ------------------------------------------------------------------------------------

    def fail(
        self, kind: str, match: str = "", *, times: int | None = 1, method: str | None = None, **params: Any
    ) -> None:
        """Inject a fault into the next `times` requests (None: all, until clear_faults()) whose decoded path
        contains `match` (CDN and bridge requests also match the repo file names of their blob), optionally only
        `method`. A request that a fault does not apply to (wrong route or method) leaves it for a later one.

        Any request, on the hub, the CDN or the bridge:
        kind "429", "500", "503" (any 4xx/5xx): answer that status before routing; `retry_after=s` adds
            Retry-After (429 gets 1 by default).
        kind "delay": sleep `seconds` (default 1) before answering.

        File bodies (GET with a non-empty body on /resolve, /cdn/ and /xet/; at most one of these per request):
        kind "ignore_range": answer ranged file requests with 200 and the whole file (as some CDNs do).
        kind "drop": send the headers and `after_bytes` (default 0) of a file body, then close the connection
            (FIN; `reset=True`: RST).
        kind "stall": send the headers and `after_bytes` (default 0) body bytes, then nothing more; hold the
            connection until the client closes it, `seconds` (default 600) pass or the hub stops, then close it.
        kind "trickle": send `after_bytes` (default 0) at full speed, the rest at `rate` bytes/s (default 16) in
            pieces of about 1/20 s, until done, the client goes away or the hub stops.
            "stall" and "trickle" with `api=True` also apply to JSON answers of GET /api/... (metadata).
        kind "gzip": the body is the gzip of the requested bytes with `Content-Encoding: gzip` and Content-Length
            the compressed length; a ranged request still gets 206 with the Content-Range of the requested range.
        kind "corrupt": a normal answer with one byte of the body flipped (xor 0xFF) at body offset `at`
            (default: the middle of the body).
        kind "short": the normal status and Content-Range, but Content-Length and body `missing` (default 1)
            bytes shorter; the connection stays usable.

        /resolve (HEAD and GET), after the repo, revision and file are found:
        kind "redirect_loop": 302 to the very same URL (use times=None for a loop the client cannot escape).
        kind "bad_redirect": 302 to `location` (default "ftp://nowhere.invalid/x"). Both 302s carry the
            X-Repo-Commit, ETag, X-Linked-Etag and X-Linked-Size of the file, like a real LFS redirect.

        Model info (GET /api/models/R and /api/models/R/revision/X of an existing repo), exactly one of:
        kind "api_body": `body=b"..."` (raw bytes), `doc=...` (any JSON value) or `mutate=f` (f gets a deep copy
            of the real document and edits it in place; its return value is ignored); `status` (default 200).
        See also override_sibling() for a persistent change of one file's entry.
        """
        allowed = _STATUS_PARAMS if kind.isdigit() and 400 <= int(kind) < 600 else _FAULT_PARAMS.get(kind)
        if allowed is None:
            raise ValueError(f"unknown fault kind {kind!r}")
        if unknown := set(params) - allowed:
            raise ValueError(f"fault {kind!r} takes no {sorted(unknown)}")
        if kind == "api_body" and len({"body", "doc", "mutate"} & set(params)) != 1:
            raise ValueError("fault 'api_body' takes exactly one of body=, doc= or mutate=")
        with self._lock:
            self._faults.append(Fault(kind, match, times, method.upper() if method else None, params))

    def fail_once(self, kind: str, match: str = "", **params: Any) -> None:
        self.fail(kind, match, times=1, **params)

    def clear_faults(self) -> None:
        """Remove every pending fault and sibling override."""
        with self._lock:
            self._faults.clear()
            self._sibling_overrides.clear()

    def override_sibling(self, repo_id: str, filename: str, **fields: Any) -> None:
        """Model info of `repo_id` (any revision) lists `filename` with these fields replaced, e.g. size=2**45,
        size="12", lfs=None; a field set to MISSING is left out. The sibling is added if the repo lacks it.
        The tree listing and /resolve are unchanged. clear_faults() removes the overrides."""
        with self._lock:
            self._sibling_overrides.setdefault((repo_id, filename), {}).update(fields)

    def expire_cdn_urls(self) -> None:
        """Every CDN and bridge URL issued so far answers 403 (expired signature); new /resolve redirects work."""
        with self._lock:
            self._cdn_epoch += 1

    def reset_counters(self) -> None:
        with self._lock:
            self.requests.clear()
            self.bytes_sent = self.file_bytes_sent = self.connections = 0

    def requests_to(self, contains: str = "", method: str | None = None) -> list[Logged]:
        with self._lock:
            return [r for r in self.requests if contains in r.path and (method is None or r.method == method)]

    def _take_fault(
        self, kinds: tuple[str, ...], method: str, target: str, where: Callable[[Fault], bool] | None = None
    ) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                kind_ok = fault.kind in kinds or ("status" in kinds and fault.kind.isdigit())
                if kind_ok and fault.method in (None, method) and fault.match in target and (not where or where(fault)):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def _sign(self, sha256: str, expires: int, epoch: int, secret: bytes | None = None) -> str:
        key = secret or self._secret
        return hmac.new(key, f"{sha256}:{expires}:{epoch}".encode(), hashlib.sha256).hexdigest()[:32]

    def _cdn_url(self, blob: Blob, filename: str) -> str:
        expires = int(time.time() + self.cdn_ttl)
        with self._lock:
            sig = self._sign(blob.sha256, expires, self._cdn_epoch)
        query = urlencode({"expires": expires, "sig": sig, "filename": filename.rsplit("/", 1)[-1]})
        return f"http://{self.cdn_host}:{self.port}/cdn/{blob.sha256}?{query}"

    def _xet_url(self, blob: Blob, filename: str) -> str:
        xet, expires = _xet_hash(blob.sha256), int(time.time() + self.cdn_ttl)
        with self._lock:
            sig = self._sign(xet, expires, self._cdn_epoch, self._xet_secret)
        params = {"X-Xet-Expires": expires, "X-Xet-Signature": sig, "filename": filename.rsplit("/", 1)[-1]}
        return f"http://{self.cdn_host}:{self.bridge_port}/xet/{xet}?{urlencode(params)}"

    # -- JSON documents --------------------------------------------------------------------------------------

    def _safetensors_parameters(self, blob: Blob) -> dict[str, int] | None:
        """Parameter count per dtype from a safetensors header, as the Hub's `safetensors` field reports."""
        if blob.sha256 not in self._safetensors_params:
            try:
                n = struct.unpack("<Q", blob.read(0, 8))[0]
                header = json.loads(blob.read(8, n)) if 0 < n <= min(100 << 20, blob.size - 8) else {}
                counts: dict[str, int] = {}
                for name, entry in header.items():
                    if name != "__metadata__":
                        counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + math.prod(entry["shape"])
                self._safetensors_params[blob.sha256] = counts or None
            except (ValueError, KeyError, TypeError, struct.error, OSError):
                self._safetensors_params[blob.sha256] = None
        return self._safetensors_params[blob.sha256]

    def _model_info(self, repo: Repo, commit: Commit, query: dict[str, list[str]]) -> dict[str, Any]:
        blobs_meta = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings: list[dict[str, Any]] = []
        with self._lock:
            overrides = {name: f for (rid, name), f in self._sibling_overrides.items() if rid == repo.repo_id}
        for name in sorted(set(commit.files) | set(overrides)):
            sibling: dict[str, Any] = {"rfilename": name}
            if blobs_meta and (blob := commit.files.get(name)) is not None:
                sibling.update(size=blob.size, blobId=blob.git_oid)
                if blob.lfs:
                    sibling["lfs"] = {"sha256": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
            for key, value in overrides.get(name, {}).items():
                if value is MISSING:
                    sibling.pop(key, None)
                else:
                    sibling[key] = value
            siblings.append(sibling)
        config: dict[str, Any] | None = None
        if (cfg := commit.files.get("config.json")) is not None and cfg.size < 1 << 20:
            try:
                full = json.loads(cfg.read())
                config = {k: full[k] for k in ("architectures", "model_type") if k in full}
            except ValueError:
                config = None
        params: dict[str, int] = {}
        for name, blob in commit.files.items():
            if name.endswith(".safetensors"):
                for dtype, count in (self._safetensors_parameters(blob) or {}).items():
                    params[dtype] = params.get(dtype, 0) + count
        tags = (["safetensors"] if params else []) + (
            [config["model_type"]] if config and "model_type" in config else []
        )
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
            "sha": commit.sha,
            "lastModified": DATE,
            "createdAt": DATE,
            "private": False,
            "gated": repo.gated or False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [*tags, "region:us"],
            "library_name": "transformers" if config else None,
            "siblings": siblings,
            "usedStorage": sum(b.size for b in commit.files.values()),
        }
        if config is not None:
            info["config"] = config
        if params:
            info["safetensors"] = {"parameters": params, "total": sum(params.values())}
        if expand := query.get("expand"):  # the Hub returns only the expanded properties (and the ids)
            info = {k: v for k, v in info.items() if k in {"_id", "id", *expand}}
        return info

    def _refs(self, repo: Repo, with_prs: bool) -> dict[str, Any]:
        branches = sorted(repo.branches.items(), key=lambda kv: (kv[0] != "main", kv[0]))
        refs: dict[str, Any] = {
            "branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": s} for n, s in branches],
            "converts": [],
            "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": s} for n, s in sorted(repo.tags.items())],
        }
        if with_prs:
            refs["pullRequests"] = []
        return refs

    def _tree(self, commit: Commit, path: str, recursive: bool, expand: bool) -> list[dict[str, Any]]:
        dirs = {"/".join(name.split("/")[:i]) for name in commit.files for i in range(1, name.count("/") + 1)}
        if path and path not in dirs:
            raise _HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.sha})
        prefix = f"{path}/" if path else ""

        def wanted(p: str) -> bool:
            return p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])

        last_commit = {"id": commit.sha, "title": "Upload folder", "date": DATE}
        entries: list[dict[str, Any]] = []
        for d in sorted(filter(wanted, dirs)):
            inside = "".join(f"{n}\0{b.git_oid}\n" for n, b in commit.files.items() if n.startswith(d + "/"))
            entry: dict[str, Any] = {"type": "directory", "oid": hashlib.sha1(inside.encode()).hexdigest()}
            entries.append({**entry, "size": 0, "path": d, **({"lastCommit": last_commit} if expand else {})})
        for name in sorted(filter(wanted, commit.files)):
            blob = commit.files[name]
            entry = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": name}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
            if expand:
                entry["lastCommit"] = last_commit
            entries.append(entry)
        return entries

    def _repo(self, repo_id: str, auth: str | None, gate: bool) -> Repo:
        """The repo, after the existence and gating checks, in the Hub's order."""
        with self._lock:
            repo = self._repos.get(repo_id)
        if repo is None:
            raise _HubError(404, "Repository not found", "RepoNotFound")
        if gate and repo.gated:
            token = auth[7:].strip() if auth and auth.lower().startswith("bearer ") else None
            if token is None:
                raise _HubError(
                    401,
                    f"Access to model {repo_id} is restricted. You must have access to it and be authenticated"
                    " to access it. Please log in.",
                    "GatedRepo",
                )
            if token not in self.approved_tokens:
                raise _HubError(
                    403,
                    f"Access to model {repo_id} is restricted and you are not in the authorized list. Visit"
                    f" {self.url}/{repo_id} to ask for access.",
                    "GatedRepo",
                )
        return repo

    def _lookup(self, repo_id: str, rev: str | None, auth: str | None, gate: bool) -> tuple[Repo, Commit]:
        repo = self._repo(repo_id, auth, gate)
        with self._lock:
            commit = repo.commit(rev or "main")
        if commit is None:
            raise _HubError(404, f"Invalid rev id: {rev or 'main'}", "RevisionNotFound")
        return repo, commit

    def _find_repo_id(self, segs: list[str]) -> tuple[str, list[str]]:
        """Split decoded path segments into a repo id (one or two segments) and the rest."""
        with self._lock:
            for n in (2, 1):
                if len(segs) >= n and "/".join(segs[:n]) in self._repos:
                    return "/".join(segs[:n]), segs[n:]
        n = 1 if len(segs) < 2 or segs[1] in _API_SUBPATHS else 2  # unknown repo: guess its extent
        return "/".join(segs[:n]), segs[n:]


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) byte; None when the header is not one byte range (then ignored, as RFC 9110 allows);
    _UNSATISFIABLE for a range outside the file."""
    m = _RANGE.fullmatch(header)
    if not m or not (m[1] or m[2]):
        return None
    if not m[1]:
        n = int(m[2])
        return _UNSATISFIABLE if n == 0 or size == 0 else (max(0, size - n), size - 1)
    first, last = int(m[1]), int(m[2]) if m[2] else size - 1
    if m[2] and last < first:
        return None
    return _UNSATISFIABLE if first >= size else (first, min(last, size - 1))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: FakeHub, bridge: bool = False) -> None:
        self.hub = hub
        self.bridge = bridge  # the Xet bridge: serves /xet/ only
        self._live: set[socket.socket] = set()
        self._live_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._live_lock:
            self._live.add(request)
        with self.hub._lock:
            self.hub.connections += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._live_lock:
            self._live.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (or a reset we injected) is not the fake's failure: stay quiet about it.
        if isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError, TimeoutError)):
            return
        super().handle_error(request, client_address)

    def close_all(self) -> None:
        with self._live_lock:
            live = list(self._live)
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every response carries Content-Length
    server_version = "FakeHub/1.0"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid the 40 ms delayed-ACK stall
    timeout = 60  # idle keep-alive connections end eventually
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self._pacer = Pacer()  # one handler per TCP connection: its own clock for `connection_bandwidth`

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # keep the connection usable
        self._dispatch("POST")

    # -- plumbing --------------------------------------------------------------------------------------------

    @property
    def hub(self) -> FakeHub:
        return self.server.hub

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        raw_segs = split.path.split("/")[1:]
        self._method, self._status, self._logged = method, 0, False
        self._path = unquote(split.path)
        target = self._path
        if raw_segs[:1] in (["cdn"], ["xet"]) and len(raw_segs) == 2:
            with self.hub._lock:
                sha256 = self.hub._xet_hashes.get(raw_segs[1], "") if raw_segs[0] == "xet" else raw_segs[1]
                target += " " + " ".join(sorted(self.hub._blob_names.get(sha256, ())))
        try:
            if (fault := self.hub._take_fault(("delay",), method, target)) is not None:
                time.sleep(float(fault.params.get("seconds", 1.0)))
            if (fault := self.hub._take_fault(("status",), method, target)) is not None:
                status = int(fault.kind)
                headers = {}
                if status == 429 or "retry_after" in fault.params:
                    headers["Retry-After"] = str(int(fault.params.get("retry_after", 1)))
                raise _HubError(status, f"Injected fault {status}", None, headers)
            self._route(method, raw_segs, parse_qs(split.query), target)
        except _HubError as err:
            self._send_error(err)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception:  # a bug in the fake must not pass for a client failure: record it, answer 500
            with self.hub._lock:
                self.hub.errors.append(traceback.format_exc())
            if self._status == 0:
                self._send_error(_HubError(500, "fake hub internal error"))
            self.close_connection = True
        finally:
            if not self._logged:  # nothing was sent
                self._log()

    def _log(self) -> None:
        # Logged before the response leaves, so a client that has its answer always finds it in the log.
        self._logged = True
        with self.hub._lock:
            auth = "Authorization" in self.headers
            self.hub.requests.append(Logged(self._method, self._path, self.headers.get("Range"), self._status, auth))

    def _route(self, method: str, raw: list[str], query: dict[str, list[str]], target: str) -> None:
        segs = [unquote(s) for s in raw]
        if method == "POST":
            raise _HubError(405, "Method not allowed by the fake hub")
        if self.server.bridge:
            if segs[:1] == ["xet"] and len(segs) == 2:
                return self._xet(segs[1], query, target)
            return self._xml_error(404, "NoSuchKey", "The specified key does not exist.")
        if segs[:1] == ["cdn"] and len(segs) == 2:
            return self._cdn(segs[1], query, target)
        if segs[:2] == ["api", "models"] and len(segs) > 2:
            # A path inside the repo arrives percent-encoded in one segment (quote(path, safe="")): split the raw
            # segments and decode each, then rejoin what follows the revision.
            repo_id, _ = self.hub._find_repo_id(segs[2:])
            rest = raw[2 + repo_id.count("/") + 1 :]
            auth, gate = self.headers.get("Authorization"), self.hub.gate_api
            if not rest or (len(rest) == 2 and rest[0] == "revision"):
                repo, commit = self.hub._lookup(repo_id, unquote(rest[1]) if rest else None, auth, gate)
                info = self.hub._model_info(repo, commit, query)
                if (fault := self.hub._take_fault(("api_body",), method, target)) is not None:
                    return self._api_body(fault, info)
                return self._json(info)
            if rest == ["refs"]:
                return self._json(self.hub._refs(self.hub._repo(repo_id, auth, gate), "include_prs" in query))
            if len(rest) >= 2 and rest[0] == "tree":
                return self._tree(repo_id, unquote(rest[1]), unquote("/".join(rest[2:])), query)
            raise _HubError(404, "Not found")
        if "resolve" in segs[1:]:
            i = segs.index("resolve", 1)
            if len(segs) > i + 2:
                filename = unquote("/".join(raw[i + 2 :]))
                return self._resolve(method, "/".join(segs[:i]), segs[i + 1], filename, target)
        raise _HubError(404, "Not found")

    def _tree(self, repo_id: str, rev: str, path: str, query: dict[str, list[str]]) -> None:
        _, commit = self.hub._lookup(repo_id, rev, self.headers.get("Authorization"), self.hub.gate_api)

        def flag(name: str) -> bool:
            return query.get(name, ["false"])[0].lower() in ("1", "true")

        entries = self.hub._tree(commit, path.strip("/"), flag("recursive"), flag("expand"))
        page = self.hub.tree_page_size if not flag("expand") else min(50, self.hub.tree_page_size)
        start = int(query.get("cursor", ["0"])[0] or 0)
        headers = {}
        if start + page < len(entries):
            params = {k: v[0] for k, v in query.items() if k != "cursor"} | {"cursor": str(start + page)}
            next_url = f"{self.hub.url}{urlsplit(self.path).path}?{urlencode(params)}"
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._json(entries[start : start + page], headers=headers)

    def _resolve(self, method: str, repo_id: str, rev: str, filename: str, target: str) -> None:
        _, commit = self.hub._lookup(repo_id, rev, self.headers.get("Authorization"), True)
        blob = commit.files.get(filename)
        if blob is None:
            raise _HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit.sha})
        headers = {"X-Repo-Commit": commit.sha}
        etag = f'"{blob.sha256 if blob.lfs else blob.git_oid}"'
        redirect = {"X-Linked-Etag": etag, "X-Linked-Size": str(blob.size), "ETag": etag}
        if (fault := self.hub._take_fault(("redirect_loop", "bad_redirect"), method, target)) is not None:
            if fault.kind == "redirect_loop":
                location = self.hub.url + self.path  # the very same URL, query included
            else:
                location = str(fault.params.get("location", "ftp://nowhere.invalid/x"))
            return self._send(302, {**headers, **redirect, "Location": location}, b"")
        if blob.lfs and self.hub.cdn_origin:
            location = f"{self.hub.cdn_origin.rstrip('/')}/{blob.sha256}"
            return self._send(302, {**headers, **redirect, "Location": location}, b"")
        if blob.lfs and self.hub.xet:
            xet = {"Location": self.hub._xet_url(blob, filename), "X-Xet-Hash": _xet_hash(blob.sha256)}
            return self._send(302, {**headers, **redirect, **xet}, b"")
        if blob.lfs and self.hub.redirects:
            return self._send(302, {**headers, **redirect, "Location": self.hub._cdn_url(blob, filename)}, b"")
        headers["ETag"] = etag
        self._send_blob(method, blob, headers, target)

    def _cdn(self, sha256: str, query: dict[str, list[str]], target: str) -> None:
        with self.hub._lock:
            blob, epoch = self.hub._blobs.get(sha256), self.hub._cdn_epoch
        if blob is None:
            return self._xml_error(404, "NoSuchKey", "The specified key does not exist.")
        expires, sig = query.get("expires", [""])[0], query.get("sig", [""])[0]
        if not expires.isdigit() or not hmac.compare_digest(sig, self.hub._sign(sha256, int(expires), epoch)):
            return self._xml_error(403, "AccessDenied", "Request has expired or the signature does not match")
        if int(expires) < time.time():
            return self._xml_error(403, "AccessDenied", "Request has expired")
        name = query.get("filename", [sha256])[0]
        ascii_name = name.encode("ascii", "replace").decode().replace('"', "'")  # headers are latin-1
        headers = {
            "ETag": f'"{sha256}"',
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}; filename=\"{ascii_name}\";",
        }
        self._send_blob(self._method, blob, headers, target)

    def _xet(self, xet: str, query: dict[str, list[str]], target: str) -> None:
        """The bridge: like the CDN, under its own signature (X-Xet-Expires, X-Xet-Signature)."""
        with self.hub._lock:
            sha256, epoch = self.hub._xet_hashes.get(xet), self.hub._cdn_epoch
            blob = self.hub._blobs.get(sha256) if sha256 else None
        if blob is None:
            return self._xml_error(404, "NoSuchKey", "The specified key does not exist.")
        expires, sig = query.get("X-Xet-Expires", [""])[0], query.get("X-Xet-Signature", [""])[0]
        if not expires.isdigit() or not hmac.compare_digest(
            sig, self.hub._sign(xet, int(expires), epoch, self.hub._xet_secret)
        ):
            return self._xml_error(403, "AccessDenied", "Request has expired or the signature does not match")
        if int(expires) < time.time():
            return self._xml_error(403, "AccessDenied", "Request has expired")
        name = query.get("filename", [xet])[0]
        ascii_name = name.encode("ascii", "replace").decode().replace('"', "'")
        headers = {
            "ETag": f'"{blob.sha256}"',
            "X-Xet-Hash": xet,
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}; filename=\"{ascii_name}\";",
        }
        self._send_blob(self._method, blob, headers, target)

    def _api_body(self, fault: Fault, info: dict[str, Any]) -> None:
        status = int(fault.params.get("status", 200))
        if "body" in fault.params:
            body = bytes(fault.params["body"])
        elif "doc" in fault.params:
            body = json.dumps(fault.params["doc"]).encode()
        else:
            doc = copy.deepcopy(info)
            fault.params["mutate"](doc)  # edits in place; what it returns is ignored (dict.pop returns a value)
            body = json.dumps(doc).encode()
        self._send(status, {"Content-Type": "application/json; charset=utf-8"}, body)

    # -- responses -------------------------------------------------------------------------------------------

    def _send(self, status: int, headers: Mapping[str, str], body: bytes, *, file: bool = False) -> None:
        self._send_head(status, headers, len(body))
        if self._method != "HEAD" and body:
            fault = None
            if self._method == "GET" and self._path.startswith("/api/"):  # metadata: only faults with api=True
                api_only = lambda f: bool(f.params.get("api"))  # noqa: E731
                fault = self.hub._take_fault(("stall", "trickle"), "GET", self._path, api_only)
            self._send_body(lambda start, n: self._pieces(body, start, n), len(body), fault, file=file)

    def _send_head(self, status: int, headers: Mapping[str, str], length: int) -> None:
        self._status = status
        self._log()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if "Content-Length" not in headers:
            self.send_header("Content-Length", str(length))
        self.send_header("X-Request-Id", f"fake-{id(self):x}-{time.monotonic_ns():x}")
        self.end_headers()

    def _chunk(self) -> int:
        return 64 << 10 if self.hub.bandwidth or self.hub.connection_bandwidth else 1 << 20

    def _pieces(self, body: bytes, start: int, n: int, size: int = 0) -> Iterator[bytes]:
        size = size or self._chunk()
        view = memoryview(body)
        for pos in range(start, start + n, size):
            yield bytes(view[pos : min(pos + size, start + n)])

    def _send_body(
        self, read: Callable[[int, int], Iterator[bytes]], length: int, fault: Fault | None, *, file: bool
    ) -> None:
        """Write body bytes [0, length) from read(start, n), as `fault` (drop, stall, trickle or None) says."""
        kind = fault.kind if fault is not None else None
        head = length
        if fault is not None and kind in ("drop", "stall", "trickle"):
            head = min(length, int(fault.params.get("after_bytes", 0)))
        for piece in read(0, head):
            self._write_chunk(piece, file=file)
        if fault is None or (head == length and kind == "trickle"):
            return
        if kind == "trickle":
            rate = float(fault.params.get("rate", 16))
            step = max(1, min(64 << 10, int(rate / 20)))  # about 20 pieces a second
            for big in read(head, length - head):
                for piece in self._pieces(big, 0, len(big), step):
                    if self._wait_gone(len(piece) / rate):
                        self.close_connection = True
                        return
                    self._write_chunk(piece, file=file)
            return
        self.close_connection = True  # the server then shuts the socket down: the client sees EOF mid-body
        if kind == "stall":
            self._wait_gone(float(fault.params.get("seconds", 600)))
        elif kind == "drop" and fault.params.get("reset"):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()  # closing with linger 0 sends RST instead of FIN

    def _wait_gone(self, seconds: float) -> bool:
        """Wait up to `seconds`; True as soon as the client closed its end or the hub is stopping."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.hub._stopping.is_set():
                return True
            try:
                readable, _, _ = select.select([self.connection], [], [], min(left, _POLL))
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    return True  # EOF: the client hung up
            except (OSError, ValueError):  # reset, or the socket was closed under us
                return True
            if readable:  # the client sent something (it should not while it waits for us): do not spin
                time.sleep(min(left, _POLL))
        return self.hub._stopping.is_set()

    def _write_chunk(self, piece: bytes, *, file: bool) -> None:
        self.hub._link.pace(len(piece), self.hub.bandwidth)
        if file:
            self._pacer.pace(len(piece), self.hub.connection_bandwidth)
        self._count(len(piece), file)  # before the write: the client may check the counters once it has the bytes
        try:
            self.wfile.write(piece)
        except OSError:
            self._count(-len(piece), file)
            raise

    def _count(self, n: int, file: bool) -> None:
        with self.hub._lock:
            self.hub.bytes_sent += n
            if file:
                self.hub.file_bytes_sent += n

    def _json(self, doc: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(doc).encode()
        self._send(status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body)

    def _send_error(self, err: _HubError) -> None:
        headers = dict(err.headers)
        if err.code:
            headers["X-Error-Code"] = err.code
        headers["X-Error-Message"] = err.message
        self._json({"error": err.message}, err.status, headers)

    def _xml_error(self, status: int, code: str, message: str, size: int | None = None) -> None:
        """An S3/CloudFront-style error (the CDN answers XML, without X-Error-Code)."""
        body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
        headers = {"Content-Type": "application/xml"} | (
            {"Content-Range": f"bytes */{size}"} if size is not None else {}
        )
        self._send(status, headers, body.encode())

    def _send_blob(self, method: str, blob: Blob, headers: dict[str, str], target: str) -> None:
        size = blob.size
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        first, last, status = 0, size - 1, 200
        range_header = self.headers.get("Range")
        ignore = self.hub.ignore_range
        ignored = ignore is True or (isinstance(ignore, str) and bool(ignore) and ignore in target)
        if range_header and not ignored and self.hub._take_fault(("ignore_range",), method, target) is None:
            parsed = _parse_range(range_header, size)
            if parsed == _UNSATISFIABLE:
                return self._xml_error(416, "InvalidRange", "The requested range is not satisfiable", size)
            if parsed is not None:
                (first, last), status = parsed, 206
                headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        length = last - first + 1
        fault = self.hub._take_fault(_BODY_FAULTS, method, target) if method == "GET" and length else None
        if fault is not None and fault.kind in ("gzip", "corrupt", "short"):
            body = blob.read(first, length)
            if fault.kind == "gzip":
                body = gzip.compress(body)
                headers["Content-Encoding"] = "gzip"
            elif fault.kind == "corrupt":
                flipped = bytearray(body)
                if 0 <= (at := int(fault.params.get("at", length // 2))) < length:
                    flipped[at] ^= 0xFF
                body = bytes(flipped)
            else:
                body = body[: max(0, length - int(fault.params.get("missing", 1)))]
            headers["Content-Length"] = str(len(body))
            self._send_head(status, headers, len(body))
            self._send_body(lambda start, n: self._pieces(body, start, n), len(body), None, file=True)
            return
        headers["Content-Length"] = str(length)
        self._send_head(status, headers, length)
        if method == "HEAD" or length == 0:
            return
        self._send_body(lambda start, n: blob.chunks(first + start, n, self._chunk()), length, fault, file=True)


# -- pytest fixture and helpers ------------------------------------------------------------------------------


def patch_hf_client(monkeypatch: pytest.MonkeyPatch, endpoint: str, home: Path) -> None:
    """Point huggingface_hub at `endpoint` with its home in `home`: environment variables for subprocesses and
    imports to come, and the module constants that huggingface_hub already read at import time."""
    import huggingface_hub
    from huggingface_hub import constants

    hub_cache = home / "hub"
    hub_cache.mkdir(parents=True, exist_ok=True)
    env = {
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_OFFLINE": "0",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HUGGINGFACE_HUB_CACHE", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(key, raising=False)

    host = urlsplit(endpoint).hostname or "127.0.0.1"
    values: dict[str, Any] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_URL_HOSTS": frozenset(getattr(constants, "HF_URL_HOSTS", frozenset())) | {host},
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(hub_cache),
        "HUGGINGFACE_HUB_CACHE": str(hub_cache),
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
        "HF_HUB_DISABLE_PROGRESS_BARS": True,
    }
    for name, value in values.items():
        if hasattr(constants, name):  # older huggingface_hub versions lack some of them
            monkeypatch.setattr(constants, name, value)
    # Modules that copied a constant with `from ..constants import X`.
    for module, name, value in (
        ("huggingface_hub.utils.tqdm", "HF_HUB_DISABLE_PROGRESS_BARS", True),
        ("huggingface_hub.utils._cache_manager", "HF_HUB_CACHE", str(hub_cache)),
        ("huggingface_hub.utils._cache_assets", "HF_ASSETS_CACHE", str(home / "assets")),
    ):
        if hasattr(mod := sys.modules.get(module), name):
            monkeypatch.setattr(mod, name, value)
    # The module-level HfApi behind huggingface_hub.model_info & co. froze the endpoint when it was created.
    import huggingface_hub.hf_api  # a lazy submodule: make sure it is loaded before patching

    if (api := getattr(huggingface_hub.hf_api, "api", None)) is not None:
        monkeypatch.setattr(api, "endpoint", endpoint)
    http = sys.modules.get("huggingface_hub.utils._http")
    if http is not None and hasattr(http, "_HUB_ORIGINS"):
        monkeypatch.setattr(http, "_HUB_ORIGINS", http._HUB_ORIGINS | {http._url_origin(endpoint)})


@pytest.fixture
def fake_hub(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A started FakeHub with huggingface_hub pointed at it (HF_HOME and the cache in a fresh temp dir)."""
    hub = FakeHub().start()
    patch_hf_client(monkeypatch, hub.url, tmp_path_factory.mktemp("hf_home"))
    try:
        yield hub
    finally:
        hub.stop()
        from huggingface_hub.utils import close_session

        close_session()  # drop pooled keep-alive connections to this server
        from weightdiag.source.direct_get import POOL

        POOL.clear()  # and those of the direct CDN reads
    assert not hub.errors, "the fake hub failed internally:\n" + "\n".join(hub.errors)


def safetensors_bytes(tensors: Mapping[str, tuple[str, np.ndarray]], metadata: dict[str, str] | None = None) -> bytes:
    """A valid safetensors file from {name: (dtype, array)} (BF16 given as float32 values)."""
    entries = [(name, dtype, tuple(arr.shape)) for name, (dtype, arr) in tensors.items()]
    return synthetic.header_bytes(entries, metadata) + b"".join(
        synthetic.encode(arr, dtype) for dtype, arr in tensors.values()
    )


def small_model_in_small_chunks(
    fake_hub: Any,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    knobs: Callable[..., Any],
    *,
    attempts: int | None = None,
) -> Path:
    """write_small_model's 3 shards as acme/tiny on the loopback Hub, read in 16 KiB chunks (so that a fault or
    an interruption lands inside a shard) and retried without back-off (`attempts` times when given). `knobs`:
    the test's fixture of that name (conftest.py), which keeps the small pieces until the test ends."""
    # head_guess: else planning reads small shards whole
    knobs(split_bytes=16 << 10, hub_chunk_bytes=16 << 10, head_guess=4096)
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0")
    if attempts is not None:
        monkeypatch.setenv("WEIGHTDIAG_HTTP_ATTEMPTS", str(attempts))
    model = write_small_model(folder, shard_bytes=50_000)
    fake_hub.add_folder("acme/tiny", model)
    return model


def write_small_model(folder: Path, **spec: Any) -> Path:
    """A small sharded synthetic Llama checkpoint (config.json, index, shards) in `folder`."""
    defaults: dict[str, Any] = dict(
        n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, ffn_size=128, vocab=256, shard_bytes=60_000, seed=1
    )
    return synthetic.write_model(folder, synthetic.ModelSpec(**(defaults | spec)))

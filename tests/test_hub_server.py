"""The fake Hub (tests/hub_server.py) against huggingface_hub's own client, in-process."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    list_repo_refs,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import get_session

from .hub_server import MISSING, FakeHub, Pacer, safetensors_bytes, write_small_model

# The HTTP client huggingface_hub is built on, used here directly against the fake Hub: httpx2 from
# huggingface_hub 2.0 on, httpx in 1.x (one API; the floor test installs 1.x, which does not bring httpx2).
try:
    import httpx2
except ImportError:
    httpx2 = pytest.importorskip("httpx")

REPO = "org/tiny"
SHARD = "model-00001-of-00004.safetensors"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_small_model(tmp_path_factory.mktemp("tiny"))
    assert (folder / SHARD).exists()
    assert (folder / "model.safetensors.index.json").exists()
    return folder


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fixture_points_the_client_and_subprocesses_at_the_hub(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    assert os.environ["HF_ENDPOINT"] == fake_hub.url == constants.ENDPOINT
    assert "HF_TOKEN" not in os.environ
    assert Path(constants.HF_HUB_CACHE).is_relative_to(Path(os.environ["HF_HOME"]))
    assert hf_hub_url(REPO, "config.json").startswith(fake_hub.url + "/")
    code = f"from huggingface_hub import HfApi; print(HfApi().model_info({REPO!r}).sha)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == sha


def test_model_info_with_files_metadata(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    assert len(sha) == 40
    assert sha == fake_hub.add_folder(REPO, model_dir)  # deterministic
    info = HfApi().model_info(REPO, files_metadata=True)
    assert (info.id, info.sha, info.private, info.gated, info.disabled) == (REPO, sha, False, False, False)
    assert info.last_modified is not None
    assert info.config == {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
    }
    siblings = {s.rfilename: s for s in info.siblings or []}
    assert set(siblings) == {p.name for p in model_dir.iterdir()}
    shard = (model_dir / SHARD).read_bytes()
    lfs = siblings[SHARD].lfs
    assert lfs is not None
    assert (lfs.sha256, lfs.size, siblings[SHARD].size) == (_sha256(shard), len(shard), len(shard))
    config = (model_dir / "config.json").read_bytes()
    assert siblings["config.json"].lfs is None  # small JSON: a git file, oid = git's blob sha1
    assert siblings["config.json"].blob_id == hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    header_params = json.loads((model_dir / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    assert info.safetensors is not None
    assert info.safetensors.total * 2 == header_params  # BF16: 2 bytes each
    plain = HfApi().model_info(REPO)  # without files_metadata only the names come back
    assert plain.siblings
    assert all(s.size is None and s.lfs is None for s in plain.siblings)


def test_branches_tags_and_commits(fake_hub: FakeHub, model_dir: Path) -> None:
    shard = (model_dir / SHARD).read_bytes()
    first = fake_hub.add_repo(REPO, {"config.json": b'{"step": 0}', SHARD: shard})
    step = fake_hub.add_repo(REPO, {"config.json": b'{"step": 1000}', SHARD: shard}, branch="step1000")
    main = fake_hub.add_repo(REPO, {"config.json": b'{"step": 2000}', SHARD: shard})  # main moves on
    assert fake_hub.add_tag(REPO, "v1.0", "step1000") == step
    refs = list_repo_refs(REPO)
    assert [(b.name, b.ref, b.target_commit) for b in refs.branches] == [
        ("main", "refs/heads/main", main),
        ("step1000", "refs/heads/step1000", step),
    ]
    assert [(t.name, t.ref, t.target_commit) for t in refs.tags] == [("v1.0", "refs/tags/v1.0", step)]
    assert HfApi().list_repo_refs(REPO, include_pull_requests=True).pull_requests == []
    api = HfApi()
    for rev, expected in [("main", main), ("step1000", step), ("v1.0", step), (first, first), (None, main)]:
        assert api.model_info(REPO, revision=rev).sha == expected
    path = hf_hub_download(REPO, "config.json", revision="step1000")
    assert Path(path).read_bytes() == b'{"step": 1000}'
    assert step in path
    # Pythia-like: identical weights in two branches share their LFS oid, not their commit.
    trees = {rev: {f.path: f for f in api.list_repo_tree(REPO, revision=rev)} for rev in ("main", "step1000")}
    assert trees["main"][SHARD].lfs == trees["step1000"][SHARD].lfs
    assert main != step


def test_list_repo_tree(fake_hub: FakeHub) -> None:
    weights = safetensors_bytes({"w": ("F32", np.arange(600, dtype=np.float32).reshape(20, 30))})
    files = {"README.md": b"# tiny", "config.json": b"{}", "weights/a.safetensors": weights, "weights/sub/b.bin": b"x"}
    fake_hub.add_repo(REPO, files)
    api = HfApi()
    everything = list(api.list_repo_tree(REPO, recursive=True))
    assert [(type(e).__name__, e.path) for e in everything] == [
        ("RepoFolder", "weights"),
        ("RepoFolder", "weights/sub"),
        ("RepoFile", "README.md"),
        ("RepoFile", "config.json"),
        ("RepoFile", "weights/a.safetensors"),
        ("RepoFile", "weights/sub/b.bin"),
    ]
    by_path = {e.path: e for e in everything}
    a = by_path["weights/a.safetensors"]
    assert a.lfs is not None
    assert (a.lfs.sha256, a.lfs.size, a.size) == (_sha256(weights), len(weights), len(weights))
    assert by_path["weights/sub/b.bin"].lfs is not None  # LFS by name, whatever the size
    assert by_path["README.md"].lfs is None
    assert [e.path for e in api.list_repo_tree(REPO)] == ["weights", "README.md", "config.json"]
    assert [e.path for e in api.list_repo_tree(REPO, "weights")] == ["weights/sub", "weights/a.safetensors"]
    assert all(e.last_commit is not None for e in api.list_repo_tree(REPO, recursive=True, expand=True))
    assert sorted(api.list_repo_files(REPO)) == sorted(files)
    assert api.model_info(REPO).safetensors.total == 600  # type: ignore[union-attr]
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(REPO, "nope"))
    fake_hub.tree_page_size = 2  # the client follows the Link header page by page
    fake_hub.reset_counters()
    assert [e.path for e in api.list_repo_tree(REPO, recursive=True)] == list(by_path)
    assert len(fake_hub.requests_to("/tree/")) == 3


def test_get_hf_file_metadata_reads_the_redirect(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    shard = (model_dir / SHARD).read_bytes()
    fake_hub.reset_counters()
    meta = get_hf_file_metadata(hf_hub_url(REPO, SHARD))
    assert (meta.commit_hash, meta.etag, meta.size) == (sha, _sha256(shard), len(shard))
    assert meta.location.startswith(f"http://localhost:{fake_hub.port}/cdn/{_sha256(shard)}?")
    assert [(r.method, r.status) for r in fake_hub.requests] == [("HEAD", 302)]  # the CDN is another origin
    config = (model_dir / "config.json").read_bytes()
    meta = get_hf_file_metadata(hf_hub_url(REPO, "config.json"))
    assert (meta.commit_hash, meta.size, meta.location) == (sha, len(config), hf_hub_url(REPO, "config.json"))
    assert meta.etag == hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest()
    fake_hub.redirects = False  # a mirror answering LFS files itself
    meta = get_hf_file_metadata(hf_hub_url(REPO, SHARD))
    assert (meta.etag, meta.size, meta.location) == (_sha256(shard), len(shard), hf_hub_url(REPO, SHARD))


def test_cdn_on_the_hub_origin_breaks_the_client(fake_hub: FakeHub, model_dir: Path) -> None:
    # A same-origin redirect is followed even by HEAD: the metadata then comes from the CDN answer, which
    # (like a real CDN) has no X-Repo-Commit, so hf_hub_download refuses it.
    fake_hub.add_folder(REPO, model_dir)
    fake_hub.cdn_host = "127.0.0.1"
    meta = get_hf_file_metadata(hf_hub_url(REPO, SHARD))
    assert meta.commit_hash is None
    assert meta.location.startswith(f"{fake_hub.url}/cdn/")
    with pytest.raises(LocalEntryNotFoundError, match="X-Repo-Commit"):
        hf_hub_download(REPO, SHARD)


def test_hf_hub_download_sharded_model(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    fake_hub.reset_counters()
    index = json.loads(Path(hf_hub_download(REPO, "model.safetensors.index.json")).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 4
    for name in shards:
        path = Path(hf_hub_download(REPO, name))
        assert path.is_relative_to(Path(constants.HF_HUB_CACHE) / "models--org--tiny" / "snapshots" / sha)
        assert path.read_bytes() == (model_dir / name).read_bytes()
    names = [*shards, "model.safetensors.index.json"]
    assert fake_hub.file_bytes_sent == sum((model_dir / n).stat().st_size for n in names)
    assert len(fake_hub.requests_to("/cdn/", "GET")) == 5
    assert not fake_hub.requests_to("/resolve/", "GET")
    fake_hub.reset_counters()
    hf_hub_download(REPO, shards[0])  # cached: one HEAD, no body
    assert [r.method for r in fake_hub.requests] == ["HEAD"]
    assert fake_hub.file_bytes_sent == 0


def test_snapshot_download_allow_patterns(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    fake_hub.reset_counters()
    folder = Path(snapshot_download(REPO, allow_patterns=["*.json"]))
    assert folder.name == sha
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors.index.json"]
    for p in folder.iterdir():
        assert p.read_bytes() == (model_dir / p.name).read_bytes()
    assert fake_hub.file_bytes_sent == sum((model_dir / p.name).stat().st_size for p in folder.iterdir())
    assert not [r for r in fake_hub.requests if r.path.endswith(".safetensors")]


def test_error_mapping(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    api = HfApi()
    with pytest.raises(RepositoryNotFoundError) as err:
        api.model_info("org/missing")
    assert err.value.response.status_code == 404
    assert err.value.server_message == "Repository not found"
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "config.json")
    with pytest.raises(RepositoryNotFoundError):
        list_repo_refs("missing-single-segment")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="nope")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="nope")
    with pytest.raises(RemoteEntryNotFoundError) as missing:
        hf_hub_download(REPO, "nope.json")
    assert isinstance(missing.value, EntryNotFoundError)
    # X-Repo-Commit on the 404 lets the client remember the file is absent at that commit.
    assert (Path(constants.HF_HUB_CACHE) / "models--org--tiny" / ".no_exist" / sha / "nope.json").exists()


def test_gated_repo(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder("org/gated", model_dir, gated="auto")
    fake_hub.approved_tokens.add("hf_approved")
    assert HfApi().model_info("org/gated").gated == "auto"  # metadata is public, as on the Hub
    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download("org/gated", "config.json")
    assert anonymous.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as unapproved:
        hf_hub_download("org/gated", "config.json", token="hf_someone_else")
    assert unapproved.value.response.status_code == 403
    assert "not in the authorized list" in (unapproved.value.server_message or "")
    path = hf_hub_download("org/gated", SHARD, token="hf_approved")  # the CDN leg goes without the token
    assert Path(path).read_bytes() == (model_dir / SHARD).read_bytes()
    fake_hub.gate_api = True
    with pytest.raises(GatedRepoError):
        HfApi().model_info("org/gated")
    assert HfApi().model_info("org/gated", token="hf_approved").gated == "auto"


def test_ranged_get_through_the_redirect(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    size, url, session = len(data), hf_hub_url(REPO, SHARD), get_session()
    r = session.get(url, headers={"Range": "bytes=10-99"})
    assert r.status_code == 206
    assert r.content == data[10:100]
    assert r.headers["Content-Range"] == f"bytes 10-99/{size}"
    assert r.headers["Content-Length"] == "90"
    assert r.headers["ETag"] == f'"{_sha256(data)}"'
    assert r.headers["Accept-Ranges"] == "bytes"
    hop = r.history[0]
    assert hop.status_code == 302
    assert hop.headers["X-Repo-Commit"] == sha
    assert (hop.headers["X-Linked-Size"], hop.headers["X-Linked-Etag"]) == (str(size), f'"{_sha256(data)}"')
    for spec, expected in [("-16", data[-16:]), (f"{size - 5}-", data[-5:]), (f"0-{size + 100}", data)]:
        r = session.get(url, headers={"Range": f"bytes={spec}"})
        assert (r.status_code, r.content) == (206, expected)
    r = session.get(url, headers={"Range": f"bytes={size}-"})
    assert r.status_code == 416
    assert r.headers["Content-Range"] == f"bytes */{size}"
    config = (model_dir / "config.json").read_bytes()
    r = session.get(hf_hub_url(REPO, "config.json"), headers={"Range": "bytes=0-9"})
    assert (r.status_code, r.content, r.history) == (206, config[:10], [])  # a git file: no redirect
    assert r.headers["X-Repo-Commit"] == sha
    assert r.headers["Content-Range"] == f"bytes 0-9/{len(config)}"


def test_keep_alive_and_byte_counters(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    fake_hub.reset_counters()
    with httpx2.Client() as client:
        for _ in range(5):
            assert client.get(f"{fake_hub.url}/api/models/{REPO}").status_code == 200
        assert client.head(f"{fake_hub.url}/{REPO}/resolve/main/config.json").status_code == 200
        r = client.get(f"{fake_hub.url}/{REPO}/resolve/main/config.json", headers={"Range": "bytes=0-99"})
    assert r.status_code == 206
    assert fake_hub.connections == 1  # Content-Length everywhere: one connection
    assert fake_hub.file_bytes_sent == 100
    assert fake_hub.bytes_sent > 100  # JSON bodies count in bytes_sent
    assert fake_hub.requests[-1][:4] == ("GET", f"/{REPO}/resolve/main/config.json", "bytes=0-99", 206)
    fake_hub.reset_counters()
    assert (fake_hub.requests, fake_hub.bytes_sent, fake_hub.file_bytes_sent) == ([], 0, 0)


def test_drop_mid_body(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    fake_hub.fail_once("drop", SHARD, after_bytes=1000)
    got = bytearray()
    with httpx2.Client(follow_redirects=True) as client:
        with pytest.raises(httpx2.RemoteProtocolError), client.stream("GET", hf_hub_url(REPO, SHARD)) as r:
            assert r.headers["Content-Length"] == str(len(data))
            for chunk in r.iter_bytes():
                got += chunk
        assert bytes(got) == data[:1000]
        assert client.get(hf_hub_url(REPO, SHARD)).content == data  # the fault is spent
        fake_hub.fail_once("drop", "/cdn/", after_bytes=10, reset=True)  # RST instead of FIN
        with pytest.raises(httpx2.ReadError):
            client.get(hf_hub_url(REPO, SHARD))
    fake_hub.fail_once("drop", "/cdn/", after_bytes=10, reset=True)
    with pytest.raises(httpx2.ReadError):  # hf_hub_download retries RemoteProtocolError (FIN), not a reset
        hf_hub_download(REPO, SHARD)
    # hf_hub_download retries a cut body after 1 s. It keeps only whole 10 MiB chunks (DOWNLOAD_CHUNK_SIZE), so
    # a cut inside the first one restarts from byte 0 without a Range.
    fake_hub.fail_once("drop", "/cdn/", after_bytes=10_000)
    fake_hub.reset_counters()
    assert Path(hf_hub_download(REPO, SHARD)).read_bytes() == data
    assert [(r.range, r.status) for r in fake_hub.requests_to("/cdn/")] == [(None, 200), (None, 200)]


def test_429_with_retry_after(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    fake_hub.fail_once("429", f"/api/models/{REPO}", retry_after=7)
    r = get_session().get(f"{fake_hub.url}/api/models/{REPO}")
    assert r.status_code == 429
    assert r.headers["Retry-After"] == "7"
    fake_hub.fail_once("429", "/api/models/")
    with pytest.raises(HfHubHTTPError) as err:  # the API calls do not retry by themselves
        HfApi().model_info(REPO)
    assert err.value.response.status_code == 429
    assert HfApi().model_info(REPO).sha == sha
    fake_hub.fail_once("429", "/resolve/", method="HEAD")  # hf_hub_download repeats a failed HEAD once
    fake_hub.reset_counters()
    assert Path(hf_hub_download(REPO, "config.json")).read_bytes() == (model_dir / "config.json").read_bytes()
    assert [(r.method, r.status) for r in fake_hub.requests] == [("HEAD", 429), ("HEAD", 200), ("GET", 200)]


def test_500_once_then_ok(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    fake_hub.fail_once("500", SHARD)
    session = get_session()
    assert session.get(hf_hub_url(REPO, SHARD)).status_code == 500
    assert session.get(hf_hub_url(REPO, SHARD)).content == data
    fake_hub.fail("500", "/cdn/", times=1)  # a 5xx on the download itself is not retried by hf_hub_download
    with pytest.raises(HfHubHTTPError) as err:
        hf_hub_download(REPO, SHARD)
    assert err.value.response.status_code == 500
    assert Path(hf_hub_download(REPO, SHARD)).read_bytes() == data
    with pytest.raises(ValueError, match="unknown fault"):
        fake_hub.fail("teapot", SHARD)


def test_ignore_range(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    session, url = get_session(), hf_hub_url(REPO, SHARD)
    fake_hub.ignore_range = True
    r = session.get(url, headers={"Range": "bytes=0-99"})
    assert (r.status_code, r.content, "Content-Range" in r.headers) == (200, data, False)
    fake_hub.ignore_range = "00002-of"  # per path
    assert session.get(url, headers={"Range": "bytes=0-99"}).status_code == 206
    fake_hub.ignore_range = False
    fake_hub.fail_once("ignore_range", SHARD)
    assert session.get(url, headers={"Range": "bytes=0-99"}).status_code == 200
    assert session.get(url, headers={"Range": "bytes=0-99"}).status_code == 206


def test_expired_cdn_urls(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    session, url = get_session(), hf_hub_url(REPO, SHARD)
    old = get_hf_file_metadata(url).location
    assert session.get(old, headers={"Range": "bytes=0-7"}).content == data[:8]
    fake_hub.expire_cdn_urls()
    r = session.get(old, headers={"Range": "bytes=0-7"})
    assert r.status_code == 403
    assert b"AccessDenied" in r.content
    assert "X-Error-Code" not in r.headers
    fresh = get_hf_file_metadata(url).location
    assert fresh != old
    assert session.get(fresh, headers={"Range": "bytes=0-7"}).content == data[:8]
    fake_hub.cdn_ttl = -10  # URLs that are already past their expiry
    assert session.get(get_hf_file_metadata(url).location).status_code == 403


def _record_bookings(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[tuple[int, float]]]:
    """Every rate-limited booking, (bytes, rate) by pacer: how the caps are checked without a wall clock."""
    booked: dict[int, list[tuple[int, float]]] = {}
    delay = Pacer.delay

    def spy(self: Pacer, n: int, rate: float | None, now: float) -> float:
        if rate:
            booked.setdefault(id(self), []).append((n, rate))
        return delay(self, n, rate, now)

    monkeypatch.setattr(Pacer, "delay", spy)
    return booked


def _run_side_by_side(fetch: Callable[[int], None], n: int) -> None:
    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_bandwidth_is_shared_across_connections(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked on the bookings, not the wall clock: every body byte of every connection is booked on the one
    shared link clock at the shared rate."""
    payload = np.random.default_rng(0).integers(0, 256, 2_000_000, dtype=np.uint8).tobytes()
    fake_hub.add_repo(REPO, {"big.bin": payload})
    fake_hub.bandwidth = 4e6
    booked = _record_bookings(monkeypatch)
    url = hf_hub_url(REPO, "big.bin")
    assert httpx2.get(url, follow_redirects=True).content == payload
    halves: list[bytes] = [b"", b""]

    def fetch(i: int) -> None:
        first, last = i * 1_000_000, (i + 1) * 1_000_000 - 1
        halves[i] = httpx2.get(url, headers={"Range": f"bytes={first}-{last}"}, follow_redirects=True).content

    _run_side_by_side(fetch, 2)
    assert b"".join(halves) == payload
    # One clock for all connections, at the shared rate: the link is shared.
    assert [sum(n for n, _ in b) for b in booked.values()] == [4_000_000]
    assert {r for b in booked.values() for _, r in b} == {4e6}


def test_resume_after_a_drop_past_the_first_download_chunk(fake_hub: FakeHub) -> None:
    chunk = constants.DOWNLOAD_CHUNK_SIZE
    payload = np.random.default_rng(1).integers(0, 256, chunk + (1 << 20), dtype=np.uint8).tobytes()
    fake_hub.add_repo(REPO, {"big.bin": payload})
    fake_hub.fail_once("drop", "/cdn/", after_bytes=chunk + 1000)
    assert Path(hf_hub_download(REPO, "big.bin")).read_bytes() == payload
    assert [(r.range, r.status) for r in fake_hub.requests_to("/cdn/")] == [(None, 200), (f"bytes={chunk}-", 206)]


def test_odd_file_names(fake_hub: FakeHub) -> None:
    files = {"docs/naïve name.txt": b"hello", "weights/a+b%.bin": b"\0" * 10}
    sha = fake_hub.add_repo(REPO, files, branch="refs/pr/1")
    assert HfApi().model_info(REPO, revision="refs/pr/1").sha == sha
    for name, content in files.items():
        assert Path(hf_hub_download(REPO, name, revision="refs/pr/1")).read_bytes() == content
    assert [e.path for e in HfApi().list_repo_tree(REPO, "docs", revision="refs/pr/1")] == ["docs/naïve name.txt"]


def test_internal_errors_are_recorded(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo(REPO, {"config.json": b"{}"})

    def broken(*args: object) -> None:
        raise RuntimeError("bug in the fake")

    monkeypatch.setattr(fake_hub, "_model_info", broken)
    r = get_session().get(f"{fake_hub.url}/api/models/{REPO}")
    assert r.status_code == 500
    assert "bug in the fake" in fake_hub.errors[0]
    fake_hub.errors.clear()  # otherwise the fixture fails the test at teardown


# -- knobs and faults for streaming clients (per-connection caps, held bodies, bad encodings) -----------------


def test_pacer_books_a_virtual_clock() -> None:
    pacer = Pacer()
    assert pacer.delay(100, None, now=5.0) == 0.0  # no rate: no wait, nothing booked
    burst = Pacer.BURST
    assert pacer.delay(100, 100.0, now=10.0) == pytest.approx(1.0 - burst)  # an idle link has a burst's credit
    assert pacer.delay(100, 100.0, now=10.0) == pytest.approx(2.0 - burst)  # queued behind the first booking
    assert pacer.delay(50, 100.0, now=10.5) == pytest.approx(2.0 - burst)
    assert pacer.delay(100, 100.0, now=20.0) == pytest.approx(1.0 - burst)  # idle meanwhile: credit capped
    late = pacer.delay(100, 100.0, now=21.0 - burst + 0.01)  # a sender that woke up a little late catches up
    assert late == pytest.approx(1.0 - 0.01)


def test_connection_bandwidth_caps_each_connection_not_the_total(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked on the pacers' bookings, not the wall clock: every connection books its own bytes on its
    own clock at the per-connection rate, and nothing is booked on the shared link."""
    payload = np.random.default_rng(2).integers(0, 256, 1_200_000, dtype=np.uint8).tobytes()
    fake_hub.add_repo(REPO, {"big.bin": payload})
    location = get_hf_file_metadata(hf_hub_url(REPO, "big.bin")).location
    fake_hub.connection_bandwidth = 2e6
    booked = _record_bookings(monkeypatch)
    got: list[bytes] = [b""] * 4

    def fetch(i: int) -> None:
        with httpx2.Client() as client:  # one connection each
            rng = f"bytes={i * 300_000}-{(i + 1) * 300_000 - 1}"
            got[i] = client.get(location, headers={"Range": rng}).content

    _run_side_by_side(fetch, 4)
    assert b"".join(got) == payload
    assert len(booked) == 4  # four clocks, one per connection (a shared cap would book all on one)
    assert all(sum(n for n, _ in b) == 300_000 and {r for _, r in b} == {2e6} for b in booked.values())
    fake_hub.connection_bandwidth = None
    fake_hub.reset_counters()
    assert httpx2.get(f"{fake_hub.url}/api/models/{REPO}").status_code == 200  # JSON is not file content


def test_stall_holds_the_connection_without_blocking_stop(model_dir: Path) -> None:
    data = (model_dir / SHARD).read_bytes()
    hub = FakeHub().start()
    try:
        hub.add_folder(REPO, model_dir)
        url = f"{hub.url}/{REPO}/resolve/main/{SHARD}"
        hub.fail("stall", SHARD, after_bytes=100)
        got = bytearray()
        with httpx2.Client(follow_redirects=True, timeout=httpx2.Timeout(5, read=0.3)) as client:
            with pytest.raises(httpx2.ReadTimeout), client.stream("GET", url) as r:
                assert r.status_code == 200
                assert r.headers["Content-Length"] == str(len(data))
                for chunk in r.iter_raw():
                    got += chunk
            assert bytes(got) == data[:100]
            assert client.get(url).content == data  # spent; a fresh connection works
        hub.fail("stall", "config.json", seconds=600)  # a client that never hangs up
        sock = socket.create_connection(("127.0.0.1", hub.port))
        request = f"GET /{REPO}/resolve/main/config.json HTTP/1.1\r\nHost: x\r\nRange: bytes=0-9\r\n\r\n"
        sock.sendall(request.encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 206")
        start = time.monotonic()
    finally:
        hub.stop()
    assert time.monotonic() - start < 30  # not the stalled client's 600 s (a hang guard)
    sock.close()


def test_trickle_outlives_read_timeouts(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    fake_hub.fail("trickle", SHARD, rate=2000, after_bytes=10)
    got = bytearray()
    with httpx2.Client(follow_redirects=True, timeout=httpx2.Timeout(5, read=0.2)) as client:
        start = time.monotonic()
        with client.stream("GET", hf_hub_url(REPO, SHARD)) as r:
            for chunk in r.iter_raw():  # bytes keep coming: the read timeout never fires
                got += chunk
                if time.monotonic() - start > 0.25:
                    break
        assert 10 < len(got) < 10 + 2000
        assert bytes(got) == data[: len(got)]
        assert client.get(hf_hub_url(REPO, SHARD)).content == data  # spent
    # Metadata too, with api=True: the model info JSON arrives byte by byte.
    fake_hub.fail("trickle", f"/api/models/{REPO}", rate=100, api=True)
    body = bytearray()
    with httpx2.Client(timeout=httpx2.Timeout(5, read=0.2)) as client:
        start = time.monotonic()
        with client.stream("GET", f"{fake_hub.url}/api/models/{REPO}") as r:
            for chunk in r.iter_raw():
                body += chunk
                if time.monotonic() - start > 0.2:
                    break
        assert 0 < len(body) < 100
        assert int(r.headers["Content-Length"]) > 100
        assert client.get(f"{fake_hub.url}/api/models/{REPO}").json()["id"] == REPO
    fake_hub.fail("stall", f"/api/models/{REPO}", api=True)
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.get(f"{fake_hub.url}/api/models/{REPO}", timeout=httpx2.Timeout(5, read=0.1))
    fake_hub.fail("stall", REPO)  # without api=True a stall waits for a file body
    assert get_session().get(f"{fake_hub.url}/api/models/{REPO}").status_code == 200
    with pytest.raises(httpx2.ReadTimeout):
        get_session().get(hf_hub_url(REPO, "config.json"), timeout=0.1)


def test_gzip_corrupt_and_short_bodies(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    data = (model_dir / SHARD).read_bytes()
    url, size = hf_hub_url(REPO, SHARD), len(data)
    with httpx2.Client(follow_redirects=True) as client:
        fake_hub.fail("gzip", SHARD)
        with client.stream("GET", url, headers={"Range": "bytes=10-1009"}) as r:
            raw = b"".join(r.iter_raw())
        assert (r.status_code, r.headers["Content-Encoding"], r.headers["Content-Range"]) == (
            206,
            "gzip",
            f"bytes 10-1009/{size}",
        )
        assert int(r.headers["Content-Length"]) == len(raw) != 1000
        assert gzip.decompress(raw) == data[10:1010]
        fake_hub.fail("gzip", SHARD)
        assert client.get(url, headers={"Range": "bytes=10-1009"}).content == data[10:1010]  # httpx decodes it

        fake_hub.fail("corrupt", SHARD)
        r = client.get(url, headers={"Range": "bytes=0-99"})
        assert (r.status_code, r.headers["Content-Length"], len(r.content)) == (206, "100", 100)
        assert [i for i in range(100) if r.content[i] != data[i]] == [50]
        assert r.content[50] == data[50] ^ 0xFF
        fake_hub.fail("corrupt", SHARD, at=3)
        r = client.get(url)
        assert r.status_code == 200
        assert [i for i in range(size) if r.content[i] != data[i]] == [3]

        fake_hub.reset_counters()
        fake_hub.fail("short", SHARD, missing=7)
        r = client.get(url, headers={"Range": "bytes=0-99"})
        assert (r.status_code, r.headers["Content-Range"], r.headers["Content-Length"]) == (
            206,
            f"bytes 0-99/{size}",
            "93",
        )
        assert r.content == data[:93]
        assert client.get(url, headers={"Range": "bytes=0-99"}).content == data[:100]
        assert fake_hub.connections == 0  # no new connection: the short answer left both in use
    with pytest.raises(ValueError, match="takes no"):
        fake_hub.fail("short", SHARD, at=3)


def test_api_body_replaces_or_edits_model_info(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    api, session = HfApi(), get_session()
    fake_hub.fail("api_body", REPO, body=b"[1,2]", times=2)
    assert session.get(f"{fake_hub.url}/api/models/{REPO}/revision/main").json() == [1, 2]
    with pytest.raises(TypeError):  # huggingface_hub's own parse fails: ModelInfo(**[1, 2])
        api.model_info(REPO)
    assert api.model_info(REPO).sha == sha  # times=2 spent
    fake_hub.fail("api_body", REPO, body=b"not json")
    with pytest.raises(ValueError):
        api.model_info(REPO)
    fake_hub.fail("api_body", REPO, doc={"id": REPO, "sha": sha, "siblings": "config.json"})
    with pytest.raises(TypeError):
        api.model_info(REPO, files_metadata=True)
    fake_hub.fail("api_body", REPO, mutate=lambda info: info.update(siblings=[1, 2]))
    with pytest.raises(TypeError):
        api.model_info(REPO)
    fake_hub.fail("api_body", REPO, mutate=lambda info: info.pop("sha"), status=200)
    assert api.model_info(REPO).sha is None
    fake_hub.fail("api_body", f"{REPO}/revision/", doc={"id": REPO}, times=None)  # by path: only /revision/
    assert api.model_info(REPO).sha == sha
    assert api.model_info(REPO, revision="main").sha is None
    fake_hub.clear_faults()
    assert session.get(f"{fake_hub.url}/api/models/{REPO}/refs").status_code == 200  # other routes untouched

    fake_hub.override_sibling(REPO, "config.json", size=2**45)
    fake_hub.override_sibling(REPO, SHARD, size=MISSING, lfs=MISSING)
    fake_hub.override_sibling(REPO, "ghost.bin", size=-1)
    siblings = {s.rfilename: s for s in api.model_info(REPO, files_metadata=True).siblings or []}
    assert siblings["config.json"].size == 2**45
    assert siblings["config.json"].blob_id  # other fields kept
    assert (siblings[SHARD].size, siblings[SHARD].lfs) == (None, None)
    assert siblings["ghost.bin"].size == -1
    assert {f.path: f.size for f in api.list_repo_tree(REPO)}["config.json"] < 2**20  # tree unchanged
    fake_hub.clear_faults()
    assert "ghost.bin" not in {s.rfilename for s in api.model_info(REPO).siblings or []}
    with pytest.raises(ValueError, match="exactly one"):
        fake_hub.fail("api_body", REPO)


def test_redirect_faults_on_resolve(fake_hub: FakeHub, model_dir: Path) -> None:
    sha = fake_hub.add_folder(REPO, model_dir)
    fake_hub.fail("redirect_loop", "config.json", times=None)
    with pytest.raises(httpx2.TooManyRedirects):
        hf_hub_download(REPO, "config.json")
    r = get_session().get(hf_hub_url(REPO, "config.json"), follow_redirects=False)
    assert r.status_code == 302
    assert r.headers["Location"] == hf_hub_url(REPO, "config.json")
    assert r.headers["X-Repo-Commit"] == sha
    assert Path(hf_hub_download(REPO, SHARD)).exists()  # other files resolve
    fake_hub.clear_faults()
    fake_hub.fail("bad_redirect", "config.json", times=None)
    meta = get_hf_file_metadata(hf_hub_url(REPO, "config.json"))  # another origin: the 302 is the answer
    assert (meta.location, meta.commit_hash) == ("ftp://nowhere.invalid/x", sha)
    with pytest.raises(httpx2.UnsupportedProtocol):
        hf_hub_download(REPO, "config.json")
    fake_hub.clear_faults()
    fake_hub.fail("bad_redirect", "config.json", location="http://[::1")
    # httpx2 refuses the unparsable Location with a ValueError (IPv6), httpx (huggingface_hub 1.x) with a
    # RemoteProtocolError ("Invalid URL in location header"): hub._network_error makes both a malformed answer.
    with pytest.raises((ValueError, httpx2.RemoteProtocolError), match=r"IPv6|location header"):
        hf_hub_download(REPO, "config.json")
    assert Path(hf_hub_download(REPO, "config.json")).read_bytes() == (model_dir / "config.json").read_bytes()


def test_xet_bridge_is_a_second_origin(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder(REPO, model_dir)
    fake_hub.xet = True
    data = (model_dir / SHARD).read_bytes()
    session, url = get_session(), hf_hub_url(REPO, SHARD)
    hop = session.get(url, follow_redirects=False)
    location = hop.headers["Location"]
    assert hop.status_code == 302
    assert location.startswith(f"http://localhost:{fake_hub.bridge_port}/xet/")
    assert fake_hub.bridge_port != fake_hub.port
    assert "X-Xet-Signature=" in location
    assert "X-Xet-Expires=" in location
    assert hop.headers["X-Xet-Hash"] == location.split("/xet/")[1].split("?")[0] != _sha256(data)
    assert hop.headers["X-Linked-Size"] == str(len(data))
    assert hop.headers["X-Linked-Etag"] == f'"{_sha256(data)}"'
    fake_hub.reset_counters()
    r = session.get(url, headers={"Range": "bytes=5-104"})
    assert (r.status_code, r.content, r.headers["Content-Range"]) == (206, data[5:105], f"bytes 5-104/{len(data)}")
    assert [(x.path.split("/")[1], x.status) for x in fake_hub.requests] == [("org", 302), ("xet", 206)]
    assert Path(hf_hub_download(REPO, SHARD, token="hf_secret")).read_bytes() == data  # plain HTTP, no CAS
    bridge = fake_hub.requests_to("/xet/", "GET")
    assert bridge
    assert not any(x.authorized for x in bridge)  # another origin: the token stays home
    fake_hub.fail("corrupt", SHARD, at=0)  # faults match bridge requests by file name
    assert session.get(location, headers={"Range": "bytes=0-9"}).content[0] == data[0] ^ 0xFF
    fake_hub.fail("500", "/xet/")
    assert session.get(location).status_code == 500
    fake_hub.expire_cdn_urls()
    r = session.get(location, headers={"Range": "bytes=0-9"})
    assert r.status_code == 403
    assert b"AccessDenied" in r.content
    assert session.get(url, headers={"Range": "bytes=0-9"}).content == data[:10]  # re-resolved: a fresh URL
    assert session.get(f"http://127.0.0.1:{fake_hub.bridge_port}/cdn/x").status_code == 404  # the bridge only
    fake_hub.xet = False
    assert "/cdn/" in session.get(url, follow_redirects=False).headers["Location"]


def test_gated_answers_match_the_real_hub(fake_hub: FakeHub, model_dir: Path) -> None:
    fake_hub.add_folder("org/gated", model_dir, gated="manual")
    session, url = get_session(), hf_hub_url("org/gated", "config.json")
    assert HfApi().model_info("org/gated", files_metadata=True).gated == "manual"  # metadata is public
    assert [f.path for f in HfApi().list_repo_tree("org/gated")] == sorted(p.name for p in model_dir.iterdir())
    anonymous = session.get(url)
    assert (anonymous.status_code, anonymous.headers["X-Error-Code"]) == (401, "GatedRepo")
    assert anonymous.headers["X-Error-Message"] == (
        "Access to model org/gated is restricted. You must have access to it and be authenticated to access it."
        " Please log in."
    )
    denied = session.head(url, headers={"Authorization": "Bearer hf_other"})
    assert (denied.status_code, denied.headers["X-Error-Code"]) == (403, "GatedRepo")
    assert denied.headers["X-Error-Message"] == (
        f"Access to model org/gated is restricted and you are not in the authorized list. Visit"
        f" {fake_hub.url}/org/gated to ask for access."
    )

"""The metadata side of Hub models (model info, refs, --download): malformed answers, deadlines, redirects and
gated repos end in one line with exit code 3 (2 for the user's own input), never a traceback or exit 1.

Streaming body faults belong to tests/test_hub_stream.py; these tests stop before any weight byte is read.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from weightdiag import api
from weightdiag.errors import BadInputError, HubError, TransferError
from weightdiag.run import sweep
from weightdiag.run.measure import FitOptions
from weightdiag.source import hub

from .conftest import run_cli
from .hub_server import MISSING, FakeHub, write_small_model

pytestmark = pytest.mark.e2e  # the loopback Hub, and the CLI against it

REPO = "acme/tiny"
SHARD = "model-00001-of-00004.safetensors"
INDEX = "model.safetensors.index.json"
MALFORMED = f"the Hub's answer for {REPO} is malformed"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = write_small_model(tmp_path_factory.mktemp("tiny"))
    assert (folder / SHARD).exists()
    assert (folder / INDEX).exists()
    return folder


@pytest.fixture
def hub_repo(fake_hub: FakeHub, model_dir: Path) -> FakeHub:
    fake_hub.add_folder(REPO, model_dir)
    return fake_hub


def _fit(**kw: Any) -> dict[str, Any]:
    return api.fit_model(REPO, FitOptions(device="cpu"), **kw)


def _cli_env(**extra: str) -> dict[str, str]:
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    return {k: os.environ[k] for k in keys if k in os.environ} | extra


def _expect_line(out: Any, code: int, *needles: str) -> str:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _no_weights_read(hub: FakeHub) -> None:
    assert hub.file_bytes_sent == 0 or not hub.requests_to(".safetensors", "GET")


# --- malformed model info ------------------------------------------------------------------------------------


def _siblings(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda info: info.update(siblings=value)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"body": b"[1, 2]"}, "the model info is a list, not an object"),
        ({"body": b"<html>502 Bad Gateway</html>"}, "the model info is not JSON"),
        ({"mutate": _siblings("config.json")}, "the file list (siblings) is a string, not a list"),
        ({"mutate": lambda info: info.pop("siblings")}, "the file list (siblings) is null, not a list"),
        ({"mutate": _siblings([1, 2])}, "the file list (siblings) holds a number"),
        ({"mutate": _siblings([{"size": 3}])}, "holds an entry without a file name (rfilename)"),
        ({"mutate": lambda info: info.pop("sha")}, "the commit id (sha) is null"),
        ({"mutate": lambda info: info.update(sha=12)}, "the commit id (sha) is a number"),
        ({"mutate": _siblings([{"rfilename": SHARD, "lfs": "x"}])}, f"the LFS entry of {SHARD} is a string"),
    ],
)
def test_malformed_model_info_is_a_hub_error(hub_repo: FakeHub, params: dict[str, Any], expected: str) -> None:
    hub_repo.fail("api_body", REPO, times=None, **params)
    with pytest.raises(HubError) as err:
        _fit()
    assert str(err.value).startswith(MALFORMED), str(err.value)
    assert expected in str(err.value), str(err.value)
    assert str(err.value).endswith("; try again later or use --download")
    _no_weights_read(hub_repo)


@pytest.mark.parametrize(
    ("name", "fields", "expected"),
    [
        (SHARD, {"size": MISSING}, f"{SHARD} is listed without a size"),
        (SHARD, {"size": -1}, f"{SHARD} is listed with size -1"),
        (SHARD, {"size": "60000"}, f"{SHARD} is listed with size '60000'"),
        (SHARD, {"size": 1.5}, f"{SHARD} is listed with size 1.5"),
        (SHARD, {"size": True}, f"{SHARD} is listed with size True"),
        ("config.json", {"size": 2**45}, f"config.json is listed with {2**45} bytes"),
        (INDEX, {"size": 2**45}, f"{INDEX} is listed with {2**45} bytes"),
        (SHARD, {"lfs": {"sha256": "not-hex", "size": 1, "pointerSize": 1}}, "LFS sha256 that is not 64 hex digits"),
        (SHARD, {"size": 10}, f"{SHARD} is listed with two sizes"),
    ],
)
def test_file_sizes_and_hashes_are_checked(hub_repo: FakeHub, name: str, fields: dict[str, Any], expected: str) -> None:
    hub_repo.override_sibling(REPO, name, **fields)
    for download in (False, True):  # before anything is read or written, in both modes
        with pytest.raises(HubError) as err:
            _fit(download=download)
        assert str(err.value).startswith(MALFORMED), str(err.value)
        assert expected in str(err.value), str(err.value)
    _no_weights_read(hub_repo)
    assert not hub_repo.requests_to("/resolve/")
    assert not list(Path(os.environ["HF_HUB_CACHE"]).rglob("*.json"))


def test_unrelated_files_may_lack_sizes(hub_repo: FakeHub, model_dir: Path) -> None:
    hub_repo.override_sibling(REPO, "README.md", size=MISSING)  # only files weightdiag reads are checked
    info = hub.model_info(REPO, None, None)
    assert "README.md" in hub._files_of(REPO, info)


def test_malformed_answers_through_the_cli(hub_repo: FakeHub, tmp_path: Path) -> None:
    hub_repo.fail("api_body", REPO, body=b"[1,2]", times=None)
    _expect_line(run_cli("fit", REPO, "--db", str(tmp_path), env=_cli_env()), 3, MALFORMED, "a list, not an object")
    hub_repo.clear_faults()
    hub_repo.override_sibling(REPO, "config.json", size=2**45)
    out = run_cli("fit", REPO, "--db", str(tmp_path), env=_cli_env())
    _expect_line(out, 3, MALFORMED, "config.json is listed with 35184372088832 bytes", "use --download")
    assert not list(tmp_path.rglob("*.json"))


def test_malformed_refs_and_sweep(hub_repo: FakeHub, model_dir: Path) -> None:
    step = hub_repo.add_folder(REPO, model_dir, branch="step1000")
    assert ("step1000", step) in hub.list_refs(REPO, None)
    assert [r.name for r in sweep.hub_revisions(REPO)] == ["step1000", "main"]
    assert sweep.hub_identity(REPO, sweep.hub_revisions(REPO)[0])  # model info through the same checks
    hub_repo.fail("api_body", REPO, body=b"[1,2]")
    with pytest.raises(HubError, match="malformed"):
        sweep.hub_identity(REPO, sweep.Revision("main", None, f"{REPO}@main"))


# --- deadlines -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["trickle", "stall"])
def test_a_slow_model_info_ends_within_the_deadline(
    hub_repo: FakeHub, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setenv("WEIGHTDIAG_HTTP_TIMEOUT", "1")
    # 15 bytes every 50 ms: no read timeout ever fires. Both end after about 10 s (without a deadline, the test
    # then fails on time instead of hanging).
    params = {"rate": 300} if kind == "trickle" else {"seconds": 10}
    hub_repo.fail(kind, f"/api/models/{REPO}", api=True, times=None, **params)
    start = time.monotonic()
    with pytest.raises(HubError) as err:
        _fit()
    assert time.monotonic() - start < 8  # the 1 s deadline ended it, not the server's 10 s (a hang guard)
    assert str(err.value) == (
        f"{REPO}: the Hub did not answer within 1 s; check the network or raise WEIGHTDIAG_HTTP_TIMEOUT"
    )


def test_slow_refs_end_within_the_deadline(hub_repo: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEIGHTDIAG_HTTP_TIMEOUT", "0.5")
    hub_repo.fail("trickle", "/refs", api=True, rate=40, times=None)
    start = time.monotonic()
    with pytest.raises(HubError, match=r"did not answer within 0\.5 s"):
        sweep.hub_revisions(REPO)
    # A missing step* revision looks up the nearest branches, a hint dropped when the refs are too slow.
    with pytest.raises(HubError) as err:
        _fit(revision="step3")
    assert str(err.value) == f"{REPO}: revision 'step3' not found"
    assert time.monotonic() - start < 8  # deadlines of 0.5 s, not the trickle's pace (a hang guard)


def test_the_deadline_setting_is_read_at_call_time_and_checked(hub_repo: FakeHub, tmp_path: Path) -> None:
    out = run_cli("fit", REPO, "--db", str(tmp_path), env=_cli_env(WEIGHTDIAG_HTTP_TIMEOUT="soon"))
    _expect_line(out, 2, "WEIGHTDIAG_HTTP_TIMEOUT='soon'")
    hub_repo.fail("stall", f"/api/models/{REPO}", api=True, times=None, seconds=10)
    out = run_cli("fit", REPO, "--db", str(tmp_path), env=_cli_env(WEIGHTDIAG_HTTP_TIMEOUT="0.5"))
    _expect_line(out, 3, "did not answer within 0.5 s", "WEIGHTDIAG_HTTP_TIMEOUT")


def test_download_mode_uses_the_deadline_for_its_requests(
    hub_repo: FakeHub, model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from huggingface_hub import constants, file_download

    # _ETAG_RETRY_TIMEOUT is a private global of later huggingface_hub releases (1.0 has none: left alone).
    def timeouts() -> tuple[float, float]:
        return constants.HF_HUB_DOWNLOAD_TIMEOUT, getattr(file_download, "_ETAG_RETRY_TIMEOUT", 0.5)

    before = timeouts()
    monkeypatch.setenv("WEIGHTDIAG_HTTP_TIMEOUT", "0.5")
    with hub._download_timeouts() as limit:
        assert (limit, limit) == (0.5, 0.5) == timeouts()
    assert before == timeouts()
    # A CDN that sits 3 s on the first shard: the 0.5 s read timeout fires and huggingface_hub resumes after 1 s
    # (with its own 10 s timeout it would wait the 3 s out).
    hub_repo.fail("delay", SHARD, method="GET", seconds=3)
    if not hasattr(file_download, "_ETAG_RETRY_TIMEOUT"):  # huggingface_hub 1.0 does not resume after a timeout
        with pytest.raises(TransferError, match=r"did not answer within 0\.5 s"):
            _fit(download=True)
        return
    with caplog.at_level(logging.WARNING, logger="huggingface_hub"):
        row = _fit(download=True)
    assert row["model"]["source"] == "hub"
    assert not hub_repo._faults  # the delay did fire
    # The delayed answer was given up on and asked for again (with the 10 s default it would have been waited out).
    assert any("timed out" in r.getMessage() for r in caplog.records)


# --- redirects in --download mode ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "params", "expected"),
    [
        ("redirect_loop", {}, "it redirects in a loop"),
        ("bad_redirect", {}, "it redirects to an unusable location"),
        ("bad_redirect", {"location": "http://[::1"}, "it redirects to an unusable location"),
    ],
)
def test_redirect_faults_on_a_download(hub_repo: FakeHub, kind: str, params: dict[str, Any], expected: str) -> None:
    hub_repo.fail(kind, "config.json", times=None, **params)
    with pytest.raises(HubError) as err:
        _fit(download=True)
    assert str(err.value).startswith(MALFORMED), str(err.value)
    assert expected in str(err.value), str(err.value)


def test_redirect_loop_through_the_cli(hub_repo: FakeHub, tmp_path: Path) -> None:
    hub_repo.fail("redirect_loop", "config.json", times=None)
    out = run_cli("fit", REPO, "--download", "--db", str(tmp_path), env=_cli_env())
    _expect_line(out, 3, MALFORMED, "redirects in a loop")


def test_a_listed_file_the_hub_does_not_serve(hub_repo: FakeHub) -> None:
    hub_repo.override_sibling(REPO, "pytorch_model.bin", size=10)  # listed, yet /resolve answers 404
    hub_repo.fail("api_body", REPO, mutate=lambda info: info.update(siblings=info["siblings"][-1:]))
    with pytest.raises(HubError, match=r"pytorch_model\.bin is listed but the Hub does not serve it at main"):
        _fit(download=True)


# --- gated repos ---------------------------------------------------------------------------------------------


@pytest.fixture
def gated(fake_hub: FakeHub, model_dir: Path) -> FakeHub:
    fake_hub.add_folder(REPO, model_dir, gated="manual")
    fake_hub.approved_tokens.add("hf_good")
    return fake_hub


def test_fields_weightdiag_does_not_read_may_be_anything(hub_repo: FakeHub) -> None:
    """Only the commit and the file list are read: a damaged date or a missing id is no reason to fail."""
    hub_repo.fail("api_body", REPO, times=None, mutate=lambda info: (info.pop("id"), info.update(lastModified="?")))
    assert len(_fit()["matrices"]) > 0


def test_gated_metadata_is_public(gated: FakeHub) -> None:
    info = hub.model_info(REPO, None, None)
    assert len(info.sha or "") == 40
    assert SHARD in hub._files_of(REPO, info)
    assert [(r.status, r.authorized) for r in gated.requests_to(f"/api/models/{REPO}")] == [(200, False)]


def test_gated_download_without_and_with_a_token(gated: FakeHub, tmp_path: Path) -> None:
    out = run_cli("fit", REPO, "--download", "--db", str(tmp_path), env=_cli_env())
    _expect_line(out, 3, f"{REPO} is gated: request access at {gated.url}/{REPO}", "hf auth login", "HF_TOKEN")
    with pytest.raises(HubError) as err:
        _fit(download=True, token="hf_nope")
    assert str(err.value) == (
        f"{REPO} is gated and this token has no access yet: request access at {gated.url}/{REPO} and wait for approval"
    )
    statuses = [(r.method, r.status, r.authorized) for r in gated.requests_to("/resolve/")]
    assert statuses == [("HEAD", 401, False), ("HEAD", 403, True)]  # the file reads, not the metadata
    assert _fit(download=True, token="hf_good")["model"]["source"] == "hub"


# --- the local cache -----------------------------------------------------------------------------------------


def test_offline_with_a_partly_cached_snapshot(hub_repo: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import hf_hub_download

    hf_hub_download(REPO, "config.json")
    hf_hub_download(REPO, INDEX)  # the index, not its shards
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=f"{REPO}@main is only partly in the local cache .* HF_HUB_OFFLINE is set"):
        _fit()
    with pytest.raises(HubError, match="is not in the local cache"):
        _fit(revision="step5")
    with pytest.raises(BadInputError, match="not a valid Hub repo id"):
        api.fit_model("acme/ti..ny", FitOptions(device="cpu"))

"""Streaming from a hostile or slow Hub: parallel chunks, verification, deadlines. Exact or nothing.

Every test runs against the loopback fake Hub (tests/hub_server.py) with small chunks, so that a small
model is read in many ranged GETs at once. No wall-clock assertions: deadlines are made short with
WEIGHTDIAG_HTTP_TIMEOUT and the tests check outcomes (exit codes, messages, equal rows, counters).
"""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest

from weightdiag import api, tuning
from weightdiag.api import fit_path
from weightdiag.errors import HubError, VerificationError
from weightdiag.run.measure import FitOptions
from weightdiag.source import hub_stream
from weightdiag.testing import synthetic

from .conftest import run_cli
from .hub_server import write_small_model

pytestmark = pytest.mark.e2e  # the loopback Hub, and the CLI against it

_CONTEXT = ("model", "files", "created", "run", "notes")
CHUNK = 16 << 10


def _science(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in _CONTEXT}


@pytest.fixture
def small_chunks(monkeypatch):
    """16 KiB chunks: the small test model becomes dozens of ranged GETs, several in flight."""
    monkeypatch.setenv("WEIGHTDIAG_HTTP_BACKOFF", "0")
    # head_guess: else the first read takes whole shards
    with tuning.override(split_bytes=CHUNK, local_chunk_bytes=CHUNK, hub_chunk_bytes=CHUNK, head_guess=4096):
        yield


@pytest.fixture
def model(tmp_path_factory) -> Path:
    return write_small_model(tmp_path_factory.mktemp("model"), shard_bytes=120_000)


def _fit(spec: str, connections: int = 8, **kw) -> dict:
    return api.fit_model(spec, FitOptions(device="cpu", connections=connections), **kw)


def _cli_env() -> dict[str, str]:
    keys = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE")
    return {k: os.environ[k] for k in keys if k in os.environ}


def _one_error_line(out, code: int, *needles: str) -> str:
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_parallel_chunks_equal_the_local_fit_and_every_shard_is_verified(fake_hub, model, small_chunks):
    fake_hub.add_folder("acme/tiny", model)
    fake_hub.connection_bandwidth = 2e6  # a CDN edge's per-connection cap: several connections are needed
    fake_hub.reset_counters()
    row = _fit("acme/tiny")
    assert _science(row) == _science(fit_path(str(model), FitOptions(device="cpu")))
    assert all(f["verified"] for f in row["files"])
    assert row["run"]["verification"].startswith("sha256 of every")
    gets = fake_hub.requests_to("/cdn/", method="GET")
    assert len(gets) > 8
    assert all(r.range for r in gets)
    assert fake_hub.connections >= 4  # reads really ran side by side
    # Each weight file was resolved through the Hub once; every later read went straight to the CDN.
    for shard in sorted(p.name for p in model.glob("*.safetensors")):
        assert len(fake_hub.requests_to(f"/resolve/{row['model']['commit']}/{shard}")) == 1
    # Exactly the files' bytes moved: nothing read twice (the small shards' headers carry data too).
    sizes = sum(p.stat().st_size for p in model.iterdir())
    assert fake_hub.file_bytes_sent <= sizes


def test_one_connection_gives_the_same_row(fake_hub, model, small_chunks):
    fake_hub.add_folder("acme/tiny", model)
    assert _science(_fit("acme/tiny", connections=1)) == _science(_fit("acme/tiny", connections=8))


def test_include_reads_part_of_the_shards_and_says_not_verified(fake_hub, model, small_chunks):
    fake_hub.add_folder("acme/tiny", model)
    row = api.fit_model("acme/tiny", FitOptions(device="cpu", include=["*.layers.0.*"]))
    assert row["run"]["verification"] == "not verified: --include/--exclude read part of the shards"
    assert not any(f["verified"] for f in row["files"])


def test_a_429_storm_slows_down_and_still_gives_the_same_row(fake_hub, model, small_chunks, monkeypatch):
    fake_hub.add_folder("acme/tiny", model)
    clean = _fit("acme/tiny")
    limits: list[int] = []
    throttled = hub_stream.Concurrency.throttled

    def spy(self) -> None:
        throttled(self)
        limits.append(self.limit)

    monkeypatch.setattr(hub_stream.Concurrency, "throttled", spy)
    fake_hub.fail("429", "/cdn/", times=12, retry_after=0)
    assert _science(_fit("acme/tiny")) == _science(clean)
    assert not fake_hub._faults
    assert limits
    assert min(limits) < 8  # concurrency was lowered


@pytest.mark.parametrize(
    ("kind", "params"),
    [("drop", {"after_bytes": 3000}), ("drop", {"after_bytes": 100, "reset": True}), ("short", {}), ("gzip", {})],
)
def test_broken_bodies_are_retried_never_used(fake_hub, model, small_chunks, kind, params):
    fake_hub.add_folder("acme/tiny", model)
    clean = _fit("acme/tiny")
    fake_hub.fail(kind, "/cdn/", times=3, **params)
    assert _science(_fit("acme/tiny")) == _science(clean)
    assert not fake_hub._faults


def test_gzip_encoded_ranges_end_in_exit_3_never_in_other_numbers(fake_hub, model, small_chunks, tmp_path):
    fake_hub.add_folder("acme/tiny", model)
    fake_hub.fail("gzip", "/cdn/", times=None)
    out = run_cli("fit", "acme/tiny", "--db", str(tmp_path), "-q", env={**_cli_env(), "WEIGHTDIAG_HTTP_BACKOFF": "0"})
    _one_error_line(out, 3, "gzip")
    assert not list(tmp_path.rglob("*.json"))


def test_corrupted_bytes_fail_the_sha256_check_and_nothing_is_written(fake_hub, model, small_chunks, tmp_path):
    fake_hub.add_folder("acme/tiny", model)
    shard = sorted(p.name for p in model.glob("*.safetensors"))[1]
    fake_hub.fail("corrupt", shard, times=1, method="GET")
    with pytest.raises(VerificationError, match=shard):
        _fit("acme/tiny")
    fake_hub.fail("corrupt", shard, times=1, method="GET")
    out = run_cli("fit", "acme/tiny", "--db", str(tmp_path), "-q", env=_cli_env())
    _one_error_line(out, 3, shard, "sha256", "nothing was written")
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.parametrize("kind", ["stall", "trickle"])
def test_a_stalled_or_trickling_server_ends_in_exit_3(fake_hub, model, small_chunks, tmp_path, kind):
    fake_hub.add_folder("acme/tiny", model)
    fake_hub.fail(kind, "/cdn/", times=None, after_bytes=10)
    env = {**_cli_env(), "WEIGHTDIAG_HTTP_TIMEOUT": "1", "WEIGHTDIAG_HTTP_BACKOFF": "0"}
    out = run_cli("fit", "acme/tiny", "--db", str(tmp_path), "-q", env=env)
    _one_error_line(out, 3, "stopped sending", "WEIGHTDIAG_HTTP_TIMEOUT")
    assert not list(tmp_path.rglob("*.json"))


def test_a_302_to_a_second_origin_xet_bridge(fake_hub, model, small_chunks):
    fake_hub.xet = True
    fake_hub.add_folder("acme/tiny-bridge", model)
    row = _fit("acme/tiny-bridge", token="hf_secret")
    assert _science(row) == _science(fit_path(str(model), FitOptions(device="cpu")))
    bridge = fake_hub.requests_to("/xet/", method="GET")
    assert bridge
    assert all(r.status == 206 for r in bridge)
    assert not any(r.authorized for r in bridge)  # the token stays with the Hub
    fake_hub.expire_cdn_urls()  # signed bridge URLs expire: resolved again, same row
    assert _science(_fit("acme/tiny-bridge")) == _science(row)


@pytest.mark.parametrize("token", [None, "hf_not_approved"])
def test_gated_file_reads_give_the_gated_message_while_metadata_is_public(fake_hub, model, tmp_path, token):
    fake_hub.add_folder("acme/llama-weights", model, gated="manual")
    args = ["fit", "acme/llama-weights", "--db", str(tmp_path), "-q"] + (["--token", token] if token else [])
    line = _one_error_line(run_cli(*args, env=_cli_env()), 3, "acme/llama-weights", "request access")
    assert ("no access yet" in line) == bool(token)
    assert ("hf auth login" in line) != bool(token)
    assert {r.status for r in fake_hub.requests_to("/api/models/")} == {200}
    assert {r.status for r in fake_hub.requests_to("/resolve/")} == {401 if token is None else 403}


def test_memory_stays_at_a_few_chunks_whatever_the_largest_tensor(fake_hub, tmp_path, monkeypatch, knobs):
    """A 49 MB embedding streamed in 1 MiB chunks: Python's peak allocation stays far below the tensor."""
    knobs(split_bytes=1 << 20, hub_chunk_bytes=1 << 20)
    spec = synthetic.ModelSpec(n_layers=1, d_model=1024, n_heads=8, n_kv_heads=8, ffn_size=1024, vocab=24_000)
    folder = synthetic.write_model(tmp_path / "big-embed", spec)
    fake_hub.add_folder("acme/big-embed", folder)
    tracemalloc.start()
    try:
        row = _fit("acme/big-embed", connections=4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    embed = next(m for m in row["matrices"] if m["kind"] == "embed")
    assert all(f["verified"] for f in row["files"])
    assert peak < embed["numel"] * 2 / 2, f"peak {peak / 1e6:.1f} MB for a {embed['numel'] * 2 / 1e6:.0f} MB tensor"


def test_stream_errors_name_the_file_and_range(fake_hub, model, small_chunks, monkeypatch):
    monkeypatch.setenv("WEIGHTDIAG_HTTP_ATTEMPTS", "2")
    fake_hub.add_folder("acme/tiny", model)
    fake_hub.fail("500", "model-00002", times=None, method="GET")
    with pytest.raises(HubError, match=r"acme/tiny/model-00002.*failed 2 times"):
        _fit("acme/tiny")


def test_the_last_round_of_chunks_is_read_in_parts(fake_hub, model, small_chunks):
    """No connection idles at the end: the last chunks are fetched as several ranged GETs each."""
    fake_hub.add_folder("acme/tiny", model)
    fake_hub.reset_counters()
    whole = _fit("acme/tiny")
    requests_whole = len(fake_hub.requests_to("/cdn/"))
    fake_hub.reset_counters()
    with tuning.override(tail_part_bytes=2048):
        parted = _fit("acme/tiny")
    assert _science(parted) == _science(whole)
    assert all(f["verified"] for f in parted["files"])
    assert len(fake_hub.requests_to("/cdn/")) >= requests_whole + 8  # the last chunks came in parts


@pytest.mark.slow  # waits out its deadlines: 10 s or more
def test_a_trickling_download_ends_in_exit_3(fake_hub, model, monkeypatch):
    """--download goes through huggingface_hub, whose read timeout never fires on a trickle: the growth of
    the partial file in the cache is watched instead."""
    monkeypatch.setenv("WEIGHTDIAG_HTTP_TIMEOUT", "1")
    fake_hub.add_folder("acme/tiny", model)
    fake_hub.fail("trickle", "model-00002", times=None, rate=2000, after_bytes=10)
    with pytest.raises(HubError, match=r"model-00002.*stopped sending.*WEIGHTDIAG_HTTP_TIMEOUT"):
        _fit("acme/tiny", download=True)


def test_files_without_a_published_sha256_are_read_and_said_not_verified(fake_hub, model, small_chunks):
    fake_hub.add_folder("acme/tiny", model)
    for shard in sorted(p.name for p in model.glob("*.safetensors")):
        fake_hub.override_sibling("acme/tiny", shard, lfs=None)
    row = _fit("acme/tiny")
    assert row["run"]["verification"] == "not verified: no sha256 published"
    assert not any(f["verified"] for f in row["files"])
    assert _science(row) == _science(fit_path(str(model), FitOptions(device="cpu")))


def test_corrupted_bytes_through_download_are_exit_3_and_leave_no_damaged_copy(fake_hub, model):
    """huggingface_hub stores what it receives: --download checks each shard's sha256 itself, removes a
    damaged copy from the cache (so a rerun downloads it anew) and records verified shards in the row."""
    from weightdiag.errors import VerificationError

    fake_hub.add_folder("acme/tiny", model)
    shard = sorted(p.name for p in model.glob("*.safetensors"))[-1]
    fake_hub.fail("corrupt", shard, times=None)
    with pytest.raises(VerificationError, match="does not match the Hub's sha256") as caught:
        _fit("acme/tiny", download=True)
    assert caught.value.file == shard
    fake_hub.clear_faults()
    row = _fit("acme/tiny", download=True)  # downloaded again, not read from a damaged cache
    assert all(f["verified"] for f in row["files"])
    assert row["run"]["verification"] == "sha256 of every downloaded shard verified against the Hub"
    assert _science(row) == _science(fit_path(str(model), FitOptions(device="cpu")))

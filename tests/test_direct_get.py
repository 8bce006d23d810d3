"""The Hub reader's direct path (source/direct_get.py): once a file's CDN location is known, its byte ranges are
read with http.client straight into the buffer over kept-alive connections, with ranged.py's checks unchanged.

Each test first reads a few bytes (through the Hub's 302, on httpx, which remembers the location), then reads
again at that location, where faults are injected: they land on the direct path.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from weightdiag import settings
from weightdiag.errors import TransferError
from weightdiag.source import direct_get
from weightdiag.source.ranged import Cancelled, Concurrency, RangedFile, RetryPolicy

from .hub_server import write_small_model

pytestmark = pytest.mark.e2e


@pytest.fixture
def remote(fake_hub, tmp_path_factory) -> tuple[RangedFile, bytes]:
    """The largest shard of a small model on the fake Hub, its location already resolved."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import get_session

    model = write_small_model(tmp_path_factory.mktemp("model"))
    fake_hub.add_folder("acme/tiny", model)
    path = max(model.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    data = Path(path).read_bytes()
    file = RangedFile(hf_hub_url("acme/tiny", path.name), len(data), get_session(), {}, path.name)
    first = np.empty(100, dtype=np.uint8)
    file.read(0, first, RetryPolicy(backoff=0))
    assert first.tobytes() == data[:100]
    fake_hub.reset_counters()
    return file, data


@pytest.fixture
def opened(monkeypatch) -> list[str]:
    """URLs of the requests the direct path sent."""
    urls: list[str] = []
    real = direct_get.DirectGet.__init__

    def spy(self, url, *args, **kwargs):
        urls.append(url)
        real(self, url, *args, **kwargs)

    monkeypatch.setattr(direct_get.DirectGet, "__init__", spy)
    return urls


def _read(file: RangedFile, start: int, n: int, policy: RetryPolicy | None = None) -> bytes:
    out = np.empty(n, dtype=np.uint8)
    file.read(start, out, policy or RetryPolicy(backoff=0))
    return out.tobytes()


def test_ranges_at_the_remembered_location_go_direct_over_one_kept_connection(fake_hub, remote, opened):
    file, data = remote
    for start in (1000, 5000, 20_000, len(data) - 300):
        assert _read(file, start, 300) == data[start : start + 300]
    assert len(opened) == 4 and all("/cdn/" in url for url in opened)
    assert [r.status for r in fake_hub.requests] == [206] * 4  # the Hub's resolver was not asked again
    assert fake_hub.connections == 1  # keep-alive: one TCP connection for the four reads


def test_a_body_dropped_midway_resumes_with_the_rest_only(fake_hub, remote, opened):
    file, data = remote
    fake_hub.fail("drop", "/cdn/", after_bytes=3000)
    assert _read(file, 1000, 20_000) == data[1000:21_000]
    assert [r.range for r in fake_hub.requests] == ["bytes=1000-20999", "bytes=4000-20999"]
    assert len(opened) == 2


def test_a_short_body_is_never_used(fake_hub, remote):
    file, data = remote
    fake_hub.fail("short", "/cdn/", times=2)
    assert _read(file, 1000, 20_000) == data[1000:21_000]
    assert not fake_hub._faults


def test_a_trickling_location_ends_in_a_transfer_error(fake_hub, remote, opened):
    file, _ = remote
    fake_hub.fail("trickle", "/cdn/", times=None, after_bytes=10, rate=64)
    start = time.monotonic()
    with pytest.raises(TransferError, match="stopped sending"):
        _read(file, 1000, 20_000, RetryPolicy(backoff=0, timeout=1))
    assert time.monotonic() - start < 10
    assert opened  # the watchdog saw each recv of the direct path, not one blocking read of the whole body


def test_a_kept_connection_the_server_closed_is_replaced_without_a_failed_attempt(fake_hub, remote, opened):
    file, data = remote
    assert _read(file, 1000, 300) == data[1000:1300]
    assert fake_hub._server is not None
    fake_hub._server.close_all()  # the idle keep-alive connection in the pool is now dead
    time.sleep(0.2)
    assert _read(file, 2000, 300, RetryPolicy(attempts=1, backoff=0)) == data[2000:2300]
    assert fake_hub.connections == 2


def test_cancel_ends_a_read_blocked_on_the_socket(fake_hub, remote):
    file, _ = remote
    fake_hub.fail("stall", "/cdn/", after_bytes=10, seconds=60)
    concurrency = Concurrency(1)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            _read_with(file, concurrency)
        except BaseException as exc:  # the test looks at it
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.5)
    concurrency.cancelled.set()
    file.cancel()
    thread.join(5)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], Cancelled)


def _read_with(file: RangedFile, concurrency: Concurrency) -> None:
    file.read(1000, np.empty(20_000, dtype=np.uint8), RetryPolicy(backoff=0, timeout=60), concurrency)


def test_a_location_behind_a_proxy_is_left_to_httpx(monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert not settings.http_proxied("https://cdn-lfs.hf.co/x")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert settings.http_proxied("https://cdn-lfs.hf.co/x")
    assert not settings.http_proxied("http://cdn-lfs.hf.co/x")  # only https goes through that one
    monkeypatch.setenv("NO_PROXY", "hf.co")
    assert not settings.http_proxied("https://cdn-lfs.hf.co/x")

"""Ranged HTTP reads that are either exactly right or an error: never silently wrong bytes.

Each read asks for `bytes=a-b` with `Accept-Encoding: identity` and accepts only a 206 whose
Content-Range is exactly that range of a file of the expected size; anything else is a failed
range read. Transient failures are retried with a bounded budget:
- 429: wait Retry-After (capped), then again;
- 5xx and connection errors: exponential backoff; a connection dropped mid-body resumes with
  the remaining range (the bytes already received are kept);
- 401/403 from a redirected (CDN) URL: the signed URL expired, resolve it again.
The CDN location of each file is remembered after the first redirect, so later tensors of the
same file cost one request each.
"""

from __future__ import annotations

import importlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import HubError

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


@dataclass
class RetryPolicy:
    attempts: int = 6  # tries per read, counting the first
    backoff: float = 0.5  # seconds before the second try; doubles after each failure
    max_wait: float = 60.0  # cap on one wait, Retry-After included
    chunk: int = 1 << 20  # body bytes per read call

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """Defaults, overridable with WEIGHTDIAG_HTTP_ATTEMPTS and WEIGHTDIAG_HTTP_BACKOFF (seconds)."""
        policy = cls()
        try:
            policy.attempts = max(1, int(os.environ.get("WEIGHTDIAG_HTTP_ATTEMPTS", policy.attempts)))
            policy.backoff = max(0.0, float(os.environ.get("WEIGHTDIAG_HTTP_BACKOFF", policy.backoff)))
        except ValueError:
            raise HubError("WEIGHTDIAG_HTTP_ATTEMPTS / WEIGHTDIAG_HTTP_BACKOFF must be numbers") from None
        return policy


class RangedFile:
    """One remote file: resolve URL, expected size, and the HTTP session/headers to use."""

    def __init__(self, resolve_url: str, size: int, session, headers: dict[str, str], where: str) -> None:
        self.resolve_url = resolve_url
        self.size = size
        self.where = where
        self._session = session
        # huggingface_hub's session is an httpx (1.x) or httpx2 (2.x) client; both name these alike.
        self._httpx = importlib.import_module(type(session).__module__.split(".")[0])
        self._headers = headers
        self._public_headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        self._cdn_url: str | None = None
        self._lock = threading.Lock()

    def _url(self) -> str:
        with self._lock:
            return self._cdn_url or self.resolve_url

    def _remember(self, final_url: str) -> None:
        with self._lock:
            if final_url != self.resolve_url:
                self._cdn_url = final_url

    def _forget(self) -> None:
        with self._lock:
            self._cdn_url = None

    def read(self, start: int, out: np.ndarray, policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep):
        """Fill `out` (uint8) with bytes [start, start + len(out)) of the file."""
        httpx = self._httpx
        total = out.size
        done = 0
        failures = 0
        wait = policy.backoff
        last_error = "no attempt made"
        while done < total:
            if failures >= policy.attempts:
                raise HubError(
                    f"{self.where}: reading bytes {start}-{start + total - 1} failed {failures} times "
                    f"(last: {last_error}); check your connection and try again, or use --download"
                )
            first, last = start + done, start + total - 1
            url = self._url()
            headers = {"Range": f"bytes={first}-{last}", "Accept-Encoding": "identity"}
            # The token goes to the Hub only, never to a remembered CDN location.
            headers.update(self._headers if url == self.resolve_url else self._public_headers)
            try:
                with self._session.stream(
                    "GET",
                    url,
                    headers=headers,
                    follow_redirects=True,
                    timeout=httpx.Timeout(30.0, read=120.0),
                ) as response:
                    status = response.status_code
                    if status == 206:
                        self._check_content_range(response.headers.get("content-range"), first, last)
                        self._remember(str(response.url))
                        for chunk in response.iter_raw(policy.chunk):
                            n = min(len(chunk), total - done)
                            out[done : done + n] = np.frombuffer(chunk, dtype=np.uint8, count=n)
                            done += n
                        if done < total:  # the server closed early without an error
                            raise httpx.RemoteProtocolError("body ended early")
                        return
                    if status == 200:
                        raise HubError(
                            f"{self.where}: the server ignored the byte range and sent the whole file "
                            "(HTTP 200, not 206); streaming needs ranged reads: rerun with --download"
                        )
                    failures += 1
                    last_error = f"HTTP {status}"
                    if status == 429:
                        sleep(min(_retry_after(response.headers.get("retry-after"), wait), policy.max_wait))
                        continue
                    if status in (401, 403) and url != self.resolve_url:
                        self._forget()  # an expired signed CDN URL: resolve again
                        continue
                    if status >= 500 or status == 408:
                        sleep(min(wait, policy.max_wait))
                        wait *= 2
                        continue
                    raise HubError(f"{self.where}: HTTP {status} while reading a byte range; try --download")
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                failures += 1
                last_error = f"{type(exc).__name__}: {exc}"[:200]
                sleep(min(wait, policy.max_wait))
                wait *= 2

    def _check_content_range(self, header: str | None, first: int, last: int) -> None:
        match = _CONTENT_RANGE.match((header or "").strip())
        if not match:
            raise HubError(f"{self.where}: a 206 reply without a valid Content-Range ({header!r}); try --download")
        got_first, got_last, size = int(match.group(1)), int(match.group(2)), match.group(3)
        if (got_first, got_last) != (first, last) or (size != "*" and int(size) != self.size):
            raise HubError(
                f"{self.where}: asked for bytes {first}-{last} of {self.size}, the server sent {header!r}; "
                "refusing a wrong range: try --download"
            )


def _retry_after(header: str | None, default: float) -> float:
    try:
        return max(0.0, float(header)) if header is not None else default
    except ValueError:
        return default

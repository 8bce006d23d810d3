"""Ranged HTTP reads that are either exactly right or an error: never silently wrong bytes, never a hang.

Each read asks for `bytes=a-b` with `Accept-Encoding: identity` and accepts only a 206 whose
Content-Range is exactly that range of a file of the expected size, with no content coding and a body
of exactly that length; anything else is a failed read. Transient failures are retried with a bounded
budget:
- 429: the shared `Concurrency` is halved and Retry-After (capped) is waited; it grows back by one
  request for every window of successes (additive increase, multiplicative decrease, as TCP does);
- 5xx, connection errors, wrong encodings or lengths: exponential backoff; a connection dropped
  mid-body resumes with the remaining range (the bytes already received are kept);
- 401/403 from a redirected (CDN or Xet bridge) URL: the signed URL expired, resolve it again;
  401/403 from the Hub itself: access denied (gated or private), not retried.
Deadlines: connect and read timeouts of `settings.http_timeout()`, and a minimum-progress watchdog on
every body (a server that trickles bytes slowly never trips a read timeout). A read that stalls twice
gives up, so a dead server ends the run within about twice the timeout.
The final location of each file is remembered after the first redirect, so later reads of the same
file go straight to the CDN, without asking the Hub's (rate-limited) resolver again. Those reads go through
direct_get (http.client on pooled keep-alive connections, each recv landing in the chunk's buffer: 3-4x less
CPU per byte than httpx's 64 KiB pieces), with the same checks, deadlines and retries as here; the first
read of each file, and every URL that a proxy setting covers, go through the Hub's httpx session.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..errors import GatedRepoError, HubError, HubResponseError, TransferError
from ..settings import http_proxied
from .direct_get import DirectGet

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
MIN_PROGRESS = 256 << 10  # bytes a body must deliver per half timeout (a 8.7 KB/s floor at the 30 s default)
STALLS_ALLOWED = 2  # stalled or trickling attempts before a read gives up
THROTTLES_ALLOWED = 4  # 429s per read, in multiples of the attempts: being told to wait is not a failure


class Cancelled(Exception):
    """The run was abandoned (another read failed); not an error of this read."""


@dataclass
class RetryPolicy:
    attempts: int = 6  # tries per read, counting the first
    backoff: float = 0.5  # seconds before the second try; doubles after each failure
    max_wait: float = 60.0  # cap on one wait, Retry-After included
    timeout: float = 45.0  # connect/read timeout; a body is watched over half of it

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """Defaults, overridable with WEIGHTDIAG_HTTP_ATTEMPTS, WEIGHTDIAG_HTTP_BACKOFF, WEIGHTDIAG_HTTP_TIMEOUT."""
        from ..settings import http_retries, http_timeout

        attempts, backoff = http_retries()
        return cls(attempts=attempts, backoff=backoff, timeout=http_timeout())


@dataclass
class Concurrency:
    """How many requests may be in flight: at most `maximum`, halved on 429, regrown by one per window."""

    maximum: int
    limit: int = 0
    active: int = 0
    cancelled: threading.Event = field(default_factory=threading.Event)
    _successes: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.limit = self.limit or self.maximum

    @contextmanager
    def slot(self) -> Iterator[None]:
        with self._cond:
            while self.active >= self.limit:
                if self.cancelled.is_set():
                    raise Cancelled
                self._cond.wait(0.25)
            self.active += 1
        try:
            yield
        finally:
            with self._cond:
                self.active -= 1
                self._cond.notify()

    def throttled(self) -> None:
        with self._cond:
            self.limit = max(1, self.limit // 2)
            self._successes = 0

    def succeeded(self) -> None:
        with self._cond:
            self._successes += 1
            if self._successes >= self.limit and self.limit < self.maximum:
                self.limit += 1
                self._successes = 0
                self._cond.notify()


class _Failed(Exception):
    """One failed attempt that may be retried."""

    def __init__(self, reason: str, stalled: bool = False) -> None:
        super().__init__(reason)
        self.stalled = stalled


class RangedFile:
    """One remote file: resolve URL, expected size, and the HTTP session/headers to use.

    `denied(status)` builds the error for a 401/403 from the Hub itself (gated or private repos). `repo` and
    `file` (the path in the repo; `where` when not given) fill the fields of the errors raised.
    """

    def __init__(
        self,
        resolve_url: str,
        size: int,
        session,
        headers: dict[str, str],
        where: str,
        denied: Callable[[int], HubError] | None = None,
        *,
        repo: str | None = None,
        file: str | None = None,
    ) -> None:
        self.resolve_url = resolve_url
        self.size = size
        self.where = where
        self.repo = repo
        self.file = file if file is not None else where
        self._session = session
        # huggingface_hub's session is an httpx (1.x) or httpx2 (2.x) client; both name these alike.
        self._httpx = importlib.import_module(type(session).__module__.split(".")[0])
        self._headers = headers
        self._public_headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        self._denied = denied
        self._cdn_url: str | None = None
        self._lock = threading.Lock()
        self._open: set = set()  # responses being read, closed by cancel()

    def _transfer_error(self, message: str) -> TransferError:
        return TransferError(message, repo=self.repo, file=self.file)

    def _response_error(self, message: str, status: int | None = None) -> HubResponseError:
        return HubResponseError(message, repo=self.repo, file=self.file, status=status)

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

    def cancel(self) -> None:
        """Close every response being read, so that reads blocked on a socket end now."""
        with self._lock:
            responses = list(self._open)
        for response in responses:
            with contextlib.suppress(Exception):
                response.close()

    def read(
        self,
        start: int,
        out: np.ndarray,
        policy: RetryPolicy,
        concurrency: Concurrency | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Fill `out` (uint8) with bytes [start, start + len(out)) of the file."""
        httpx = self._httpx
        concurrency = concurrency or Concurrency(1)
        total = out.size
        done = failures = stalls = throttles = 0
        wait = policy.backoff
        last_error = "no attempt made"
        while done < total:
            if concurrency.cancelled.is_set():
                raise Cancelled
            if stalls >= STALLS_ALLOWED:
                raise self._transfer_error(
                    f"{self.where}: the server stopped sending while bytes {start}-{start + total - 1} were read "
                    f"({last_error}); check your connection, or raise WEIGHTDIAG_HTTP_TIMEOUT (now "
                    f"{policy.timeout:g} s) for a very slow link"
                )
            if failures >= policy.attempts:
                raise self._transfer_error(
                    f"{self.where}: reading bytes {start}-{start + total - 1} failed {failures} times "
                    f"(last: {last_error}); check your connection and try again, or use --download"
                )
            first, last = start + done, start + total - 1
            url = self._url()
            headers = {"Range": f"bytes={first}-{last}", "Accept-Encoding": "identity"}
            # The token goes to the Hub only, never to a remembered CDN location.
            headers.update(self._headers if url == self.resolve_url else self._public_headers)
            retry_after: float | None = None
            try:
                attempt = self._attempt_direct if self._direct(url, out) else self._attempt
                with concurrency.slot():
                    done, retry_after = attempt(url, headers, first, last, out, done, policy, concurrency)
                if retry_after is None:
                    concurrency.succeeded()
                    continue
            except _Failed as exc:
                failures += 1
                stalls += exc.stalled
                last_error = str(exc)
                if isinstance(exc, _Resume):
                    done = exc.done
            except httpx.TooManyRedirects:
                raise self._response_error(
                    f"{self.where}: the Hub's redirects go round in a loop; try again later"
                ) from None
            except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}"[:160]
                raise self._response_error(
                    f"{self.where}: the Hub redirected to an unusable location ({reason})"
                ) from None
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                if concurrency.cancelled.is_set():
                    raise Cancelled from None
                failures += 1
                stalls += isinstance(exc, httpx.ReadTimeout)
                last_error = f"{type(exc).__name__}: {exc}"[:200]
            if retry_after is not None:  # 429: fewer requests at once, then wait as asked
                throttles += 1
                if throttles > THROTTLES_ALLOWED * policy.attempts:
                    raise self._transfer_error(
                        f"{self.where}: the Hub kept answering 429 (too many requests) {throttles} times; wait a "
                        "while, or use fewer --connections"
                    )
                concurrency.throttled()
                sleep(min(retry_after, policy.max_wait))
                continue
            if last_error.startswith("expired"):  # re-resolving costs no wait
                continue
            sleep(min(wait, policy.max_wait))
            wait *= 2

    def _direct(self, url: str, out: np.ndarray) -> bool:
        """Whether to read `url` with direct_get: a location the Hub redirected to, reached without a proxy."""
        return url != self.resolve_url and out.flags.c_contiguous and not http_proxied(url)

    def _attempt_direct(
        self,
        url: str,
        headers: dict[str, str],
        first: int,
        last: int,
        out: np.ndarray,
        done: int,
        policy: RetryPolicy,
        concurrency: Concurrency,
    ) -> tuple[int, float | None]:
        """_attempt for a remembered location, the body read straight into `out` (see direct_get)."""
        get = DirectGet(url, headers, policy.timeout, policy.timeout / 2)
        with self._lock:
            self._open.add(get)
        ok = False
        try:
            try:
                get.open()
            except (OSError, http.client.HTTPException) as exc:
                if concurrency.cancelled.is_set():
                    raise Cancelled from None
                raise _Failed(f"{type(exc).__name__}: {exc}"[:200], stalled=isinstance(exc, TimeoutError)) from None
            if 300 <= get.status < 400:  # the location moved on: ask the Hub again, as for an expired one
                self._forget()
                raise _Failed(f"expired location (HTTP {get.status} from the remembered URL)")
            retry_after = self._check_status(get.status, get.headers, url, url, policy.backoff)
            if retry_after is not None:
                return done, retry_after
            self._check_reply(get.headers, first, last)
            done = self._body_direct(get, out, done, first, last, policy, concurrency)
            if not get.at_end():
                raise _Failed(f"the body is longer than the {last - first + 1} bytes asked for")
            ok = True
            return done, None
        finally:
            with self._lock:
                self._open.discard(get)
            if ok:
                get.release()
            else:
                get.close()

    def _body_direct(
        self, get: DirectGet, out: np.ndarray, done: int, first: int, last: int, policy, concurrency
    ) -> int:
        """_body for direct_get: each recv lands in out[done:], watched like _body; returns the new `done`."""
        total = out.size
        view = memoryview(out).cast("B")  # type: ignore[arg-type]  # numpy's stubs: ndarray is a Buffer on 3.12+ only
        progress = _Progress(policy.timeout / 2, done, total)
        try:
            while done < total:
                if concurrency.cancelled.is_set():
                    raise Cancelled
                n = get.readinto1(view[done:])
                if n == 0:  # the server closed early without an error
                    raise _Resume(done, "the body ended early")
                done += n
                if (trickle := progress.trickle(done)) is not None:
                    raise _Resume(done, trickle, stalled=True)
        except (OSError, http.client.HTTPException) as exc:
            if concurrency.cancelled.is_set():
                raise Cancelled from None
            # Keep what arrived: the next attempt asks for the rest only.
            raise _Resume(done, f"{type(exc).__name__}: {exc}"[:200], isinstance(exc, TimeoutError)) from None
        return done

    def _attempt(
        self,
        url: str,
        headers: dict[str, str],
        first: int,
        last: int,
        out: np.ndarray,
        done: int,
        policy: RetryPolicy,
        concurrency: Concurrency,
    ) -> tuple[int, float | None]:
        """One request; returns (bytes done, Retry-After seconds on a 429 else None)."""
        httpx = self._httpx
        timeout = httpx.Timeout(policy.timeout, read=policy.timeout / 2)
        with self._session.stream("GET", url, headers=headers, follow_redirects=True, timeout=timeout) as response:
            retry_after = self._check_status(
                response.status_code, response.headers, str(response.url), url, policy.backoff
            )
            if retry_after is not None:
                return done, retry_after
            self._check_reply(response.headers, first, last)
            self._remember(str(response.url))
            with self._lock:
                self._open.add(response)
            try:
                return self._body(response, out, done, first, last, policy, concurrency), None
            finally:
                with self._lock:
                    self._open.discard(response)

    def _body(self, response, out: np.ndarray, done: int, first: int, last: int, policy, concurrency) -> int:
        """Copy the body into out[done:], watching its progress; returns the new `done`."""
        httpx = self._httpx
        total = out.size
        progress = _Progress(policy.timeout / 2, done, total)
        try:
            for piece in response.iter_raw():  # as the bytes arrive: a trickle cannot hide in a buffer
                if concurrency.cancelled.is_set():
                    raise Cancelled
                n = len(piece)
                if done + n > total:
                    raise _Failed(f"the body is longer than the {last - first + 1} bytes asked for")
                out[done : done + n] = np.frombuffer(piece, dtype=np.uint8)
                done += n
                if (trickle := progress.trickle(done)) is not None:
                    raise _Failed(trickle, stalled=True)
        except (httpx.TransportError, httpx.StreamError) as exc:
            if concurrency.cancelled.is_set():
                raise Cancelled from None
            # Keep what arrived: the next attempt asks for the rest only.
            stalled = isinstance(exc, httpx.ReadTimeout)
            raise _Resume(done, f"{type(exc).__name__}: {exc}"[:200], stalled) from None
        if done < total:  # the server closed early without an error
            raise _Resume(done, "the body ended early")
        return done

    def _check_status(self, status: int, headers, final_url: str, url: str, backoff: float) -> float | None:
        """Raise for any status but 206 (429: return the seconds to wait); `final_url` is where the request ended
        up after redirects, `url` where it was sent."""
        if status == 429:
            return _retry_after(headers.get("retry-after"), backoff)
        if status == 200:
            raise self._response_error(
                f"{self.where}: the server ignored the byte range and sent the whole file "
                "(HTTP 200, not 206); streaming needs ranged reads: rerun with --download",
                status,
            )
        if status in (401, 403):
            if final_url != self.resolve_url or url != self.resolve_url:
                self._forget()  # an expired signed CDN or bridge URL: resolve again
                raise _Failed(f"expired signed URL (HTTP {status})")
            if self._denied is not None:
                raise self._denied(status)
            raise GatedRepoError(
                f"{self.where}: access denied (HTTP {status}); check your token",
                repo=self.repo,
                status=status,
                file=self.file,
            )
        if status != 206:
            if status >= 500 or status == 408:
                raise _Failed(f"HTTP {status}")
            if status == 416:
                raise self._response_error(
                    f"{self.where}: the file is shorter than the {self.size} bytes the Hub lists", status
                )
            raise self._response_error(
                f"{self.where}: HTTP {status} while reading a byte range; try again later", status
            )
        return None

    def _check_reply(self, headers, first: int, last: int) -> None:
        header = headers.get("content-range")
        match = _CONTENT_RANGE.match((header or "").strip())
        if not match:
            raise self._response_error(
                f"{self.where}: a 206 reply without a valid Content-Range ({header!r}); try --download", 206
            )
        got_first, got_last, size = int(match.group(1)), int(match.group(2)), match.group(3)
        if (got_first, got_last) != (first, last) or (size != "*" and int(size) != self.size):
            raise self._response_error(
                f"{self.where}: asked for bytes {first}-{last} of {self.size}, the server sent {header!r}; "
                "refusing a wrong range: try --download",
                206,
            )
        encoding = (headers.get("content-encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise _Failed(f"the body came {encoding}-encoded although identity was asked for")
        length = headers.get("content-length")
        if length is not None and length.strip() != str(last - first + 1):
            raise _Failed(f"Content-Length {length.strip()} for {last - first + 1} bytes asked for")


class _Progress:
    """The watch on a body's progress (both HTTP clients): every `window` seconds at least MIN_PROGRESS bytes,
    or the rest of the body, must have arrived."""

    def __init__(self, window: float, done: int, total: int) -> None:
        self.window, self.total = window, total
        self.start, self.done = time.monotonic(), done

    def trickle(self, done: int) -> str | None:
        """Why the body is too slow once a window has passed with too little of it (else None: a new window)."""
        now = time.monotonic()
        if now - self.start < self.window:
            return None
        if done - self.done < min(MIN_PROGRESS, self.total - self.done):
            return f"only {done - self.done} bytes in {now - self.start:.0f} s"
        self.start, self.done = now, done
        return None


class _Resume(_Failed):
    """A body that broke off after `done` bytes: keep them, ask for the rest."""

    def __init__(self, done: int, reason: str, stalled: bool = False) -> None:
        super().__init__(reason, stalled)
        self.done = done


def _retry_after(header: str | None, default: float) -> float:
    try:
        return max(0.0, float(header)) if header is not None else default
    except ValueError:
        return default

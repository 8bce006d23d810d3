"""Ranged GETs of an already resolved location (the CDN URL a Hub redirect led to), each body read straight into
the caller's buffer over a pooled keep-alive connection.

Why not the Hub's httpx session, which ranged.py uses for everything else: httpx hands a body over as bytes
objects of at most 64 KiB (`iter_raw`), each then copied into the chunk's buffer; with the per-piece Python
work that capped a fit at about 0.27 GB/s from a local nginx that curl reads at 2 GB/s (benchmarks/RESULTS.md,
bench_hub_origin.py). Here http.client (stdlib) writes the request and parses the status line and headers, and
the body is read with the response's BufferedReader.readinto1 into a memoryview of the destination: for reads
larger than its 8 KiB buffer that is one recv_into per call, the kernel copying into the numpy buffer with the
GIL released, no Python object per piece. readinto1, not readinto: readinto loops until the whole view is
full, which would hide a trickling server from ranged.py's minimum-progress watchdog; readinto1 returns what
one recv gave. Considered and not taken: pycurl (a C extension on libcurl, not a dependency here, and its
write callback still hands Python one bytes object per piece), hf_xet (reads Xet's CAS protocol, not a plain
CDN URL with byte ranges).

Only the bytes of a location are read here; ranged.py keeps every check (status, Content-Range, length,
encoding, retries, the watchdog, resume) and sends the Hub's own requests (redirects, tokens, proxies) through
httpx. A URL that HTTP(S)_PROXY sends through a proxy is never read here (settings.http_proxied).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from urllib.parse import urlsplit

MAX_IDLE = 64  # idle connections kept per origin (the most --connections sensible against one CDN host)
# A reused keep-alive connection the server closed meanwhile fails like this before any reply: try a fresh one.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

_Key = tuple[str, str, int]


def _tls_context() -> ssl.SSLContext:
    """The default context (system CAs, SSL_CERT_FILE), plus certifi's roots when installed, as httpx uses."""
    context = ssl.create_default_context()
    with contextlib.suppress(ImportError, OSError):
        import certifi

        context.load_verify_locations(certifi.where())
    return context


class Pool:
    """Idle keep-alive connections per (scheme, host, port), shared by every reader of the process."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self._idle: dict[_Key, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._max_idle = max_idle
        self._tls: ssl.SSLContext | None = None

    def take(self, key: _Key, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection to `key` (reused: True), else a new unconnected one."""
        with self._lock:
            idle = self._idle.get(key)
            if idle:
                return idle.pop(), True
            if key[0] == "https" and self._tls is None:
                self._tls = _tls_context()
            tls = self._tls
        scheme, host, port = key
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=tls), False
        return http.client.HTTPConnection(host, port, timeout=timeout), False

    def give(self, key: _Key, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self._max_idle:
                idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()


POOL = Pool()


class DirectGet:
    """One GET in flight: `status` and `headers` once open(), then readinto1() the body; release() hands the
    connection back when the body was read to its end, close() (from any thread) drops it."""

    def __init__(self, url: str, headers: dict[str, str], connect_timeout: float, read_timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url[:100]}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._key: _Key = (parts.scheme, parts.hostname, port)
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._headers = headers
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._conn: http.client.HTTPConnection | None = None
        self._response: http.client.HTTPResponse | None = None
        self._sock: socket.socket | None = None
        self._left: int | None = None  # body bytes still to come, when Content-Length gave them
        self._closed = False
        self._lock = threading.Lock()

    def open(self) -> DirectGet:
        """Send the request and read the reply's head; OSError or http.client.HTTPException when that fails."""
        for _ in range(2):
            conn, reused = POOL.take(self._key, self._connect_timeout)
            try:
                if conn.sock is None:
                    conn.connect()
                sock = conn.sock
                assert sock is not None
                sock.settimeout(self._read_timeout)  # connect had the connect timeout; every read has this one
                with self._lock:
                    if self._closed:
                        conn.close()
                        raise ConnectionAbortedError("cancelled")
                    self._conn, self._sock = conn, sock
                conn.request("GET", self._target, headers=self._headers)
                response = conn.getresponse()
            except _STALE:
                conn.close()
                if reused and not self._closed:
                    continue  # the server had closed the idle connection: once more on a new one
                raise
            except BaseException:
                conn.close()
                raise
            self._response = response
            self._left = None if response.chunked else response.length
            return self
        raise AssertionError("unreachable")

    @property
    def status(self) -> int:
        assert self._response is not None
        return self._response.status

    @property
    def headers(self) -> http.client.HTTPMessage:
        assert self._response is not None
        return self._response.headers

    def readinto1(self, view: memoryview) -> int:
        """Body bytes into `view` from at most one recv; 0 at the end of the body."""
        response = self._response
        assert response is not None
        if self._left is None:  # chunked or read to the close: http.client takes the framing apart
            piece = response.read1(len(view))
            view[: len(piece)] = piece
            return len(piece)
        n = min(len(view), self._left)
        if n == 0 or response.fp is None:
            return 0
        got = response.fp.readinto1(view[:n])
        self._left -= got
        return got

    def at_end(self) -> bool:
        """Whether the body has no byte after those read (a chunked or close-delimited body is asked for one)."""
        if self._left is not None:
            return self._left == 0
        assert self._response is not None
        return self._response.read1(1) == b""

    def release(self) -> None:
        """The body was read to its end: the connection goes back to the pool for the next request."""
        response, conn = self._response, self._conn
        with self._lock:
            closed, self._closed = self._closed, True
        if closed or response is None or conn is None:
            return
        response.close()  # the socket stays open: the connection owns it
        if response.will_close or conn.sock is None:
            conn.close()
        else:
            POOL.give(self._key, conn)

    def close(self) -> None:
        """Drop the connection; from another thread, a read blocked on it ends now."""
        with self._lock:
            already, self._closed = self._closed, True
            sock, conn = self._sock, self._conn
        if already or conn is None:
            return
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        conn.close()

"""The one door for HTTP (`hpctrain prefetch`'s listings and files): every request within a
deadline that holds while the server keeps sending, and at a minimum rate.

A client's timeouts bound each read, not the whole: a server that sends one byte a second (its
headers, or its body) never trips a read timeout of 60 s, and `prefetch` waited on it without
end. Here each request has a `Pace`: after `grace` seconds (connecting, the server's first
answer, a redirect) the bytes received must keep up with `min_rate` per second on average, and
every read of the connection is given only the time that leaves; one that cannot keep up is
`TooSlow` (FetchFailed, exit 1). Built on httpcore, whose network backend takes the pace (httpx's
client takes none), with proxies from the environment (HTTP_PROXY, HTTPS_PROXY, NO_PROXY: the
standard library's reading of them) and redirects followed here, at most MAX_REDIRECTS, the
credentials dropped when one leaves the host.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from hpctrain.errors import FetchFailed

MAX_REDIRECTS = 5
REDIRECTS = (301, 302, 303, 307, 308)
READ_BYTES = 1 << 16


@dataclass(frozen=True)
class Patience:
    """How slow a server may be: `grace` seconds for the first answer, then `min_rate` bytes
    a second on average (`hpctrain prefetch --min-rate --grace`)."""

    min_rate: float = 64 * 1024
    grace: float = 30.0


class TooSlow(FetchFailed):
    """A server past its pace: what came, in how long, and what was allowed."""


class Pace:
    """One request's clock and byte count (its redirects included), checked at every read."""

    def __init__(self, url: str, patience: Patience):
        self.url, self.patience = url, patience
        self.started, self.received = time.monotonic(), 0

    def left(self) -> float:
        """The seconds the next read may wait: until the bytes so far fall behind the pace;
        TooSlow when they already have."""
        elapsed = time.monotonic() - self.started
        allowed = self.patience.grace + self.received / self.patience.min_rate
        if elapsed >= allowed:
            raise TooSlow(f"{self.url}: {self.received:,} bytes in {elapsed:.0f} s, slower than "
                          f"{self.patience.min_rate:,.0f} bytes/s after {self.patience.grace:g} "
                          "s (--min-rate, --grace); stopped, nothing kept")
        return allowed - elapsed


class _PacedStream:
    """A connection whose every read and write waits no longer than its pace allows."""

    def __init__(self, stream, pace: Pace):
        self._stream, self._pace = stream, pace

    def _bound(self, timeout: float | None) -> float:
        left = self._pace.left()
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        import httpcore

        try:
            data = self._stream.read(max_bytes, self._bound(timeout))
        except httpcore.ReadTimeout:
            self._pace.left()  # TooSlow where the pace, not the server's silence, bound it
            raise
        self._pace.received += len(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._bound(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _PacedStream(self._stream.start_tls(ssl_context, server_hostname,
                                                   self._bound(timeout)), self._pace)

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _PacedBackend:
    """httpcore's own network backend, its connections paced."""

    def __init__(self, pace: Pace):
        import httpcore

        self._backend, self._pace = httpcore.SyncBackend(), pace

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        left = self._pace.left()
        stream = self._backend.connect_tcp(host, port, left if timeout is None else
                                           min(timeout, left), local_address, socket_options)
        return _PacedStream(stream, self._pace)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _PacedStream(self._backend.connect_unix_socket(path, timeout, socket_options),
                            self._pace)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def _ssl_context() -> ssl.SSLContext:
    """The certificates of SSL_CERT_FILE where set, else certifi's (as httpx and requests)."""
    import certifi

    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or certifi.where())


def _pool(url: str, pace: Pace):
    """A connection pool for `url`: through the environment's proxy for its scheme, unless
    NO_PROXY names its host."""
    import httpcore

    parts = urlsplit(url)
    proxy = None if urllib.request.proxy_bypass(parts.hostname or "") else \
        urllib.request.getproxies().get(parts.scheme)
    return httpcore.ConnectionPool(ssl_context=_ssl_context(), network_backend=_PacedBackend(pace),
                                   proxy=httpcore.Proxy(proxy) if proxy else None)


# what a failed connection or exchange raises, each said in one line by `get`'s caller
def errors() -> tuple[type[Exception], ...]:
    import httpcore

    return (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
            httpcore.ProxyError, httpcore.UnsupportedProtocol, OSError)


@dataclass
class Response:
    """A response being received: its status, headers (lower-cased names) and body."""

    url: str
    status: int
    headers: dict[str, str]
    _body: Iterator[bytes]

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives, a network read at a time."""
        return self._body


@contextmanager
def get(url: str, headers: dict[str, str], patience: Patience = Patience()):
    """`with get(url, headers) as response:` a GET of `url` (redirects followed), paced as
    above from its first connection to its body's end. FetchFailed for a redirect loop or
    past MAX_REDIRECTS; TooSlow past the pace; `errors()` for the network's failures."""
    pace = Pace(url, patience)
    for _ in range(MAX_REDIRECTS + 1):
        with _pool(url, pace) as pool, pool.stream(
                "GET", url, headers=list(headers.items())) as answer:
            found = {k.decode("latin-1").lower(): v.decode("latin-1")
                     for k, v in answer.headers}
            if answer.status in REDIRECTS and "location" in found:
                target = urljoin(url, found["location"])
                if urlsplit(target).netloc != urlsplit(url).netloc:  # credentials stay home
                    headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                url = target
                continue
            yield Response(url, answer.status, found, answer.iter_stream())
            return
    raise FetchFailed(f"{pace.url}: more than {MAX_REDIRECTS} redirects (a loop?); nothing "
                      "kept")

"""The proxy's connections to the engine: raw HTTP/1.1 on asyncio, parsed by httptools, kept alive in a pool.

Theory of operation. httpx costs tens of microseconds per streamed chunk (a task hop per read, an
iterator per layer); the sidecar only needs to write one request and hear its answer as events. So each
upstream connection is an ``asyncio.Protocol`` whose ``data_received`` feeds an llhttp response parser,
whose callbacks go straight to the listener of the exchange in flight (``Listener``): the status and
headers once, each body piece as it is parsed (de-chunked), the end of the message, or a failure. No task,
no queue and no copy sit on the per-chunk path; the listener decides what to do with the bytes.

A connection serves one exchange at a time. When the answer ended cleanly and the engine keeps the
connection alive it goes back to the pool (most recently used first: the one least likely to have been
closed by the engine's keep-alive timeout); anything else closes it. A pooled connection can still be
closed by the engine at the moment it is reused; ``Connection.reused`` and ``received`` let the caller
retry such a request once on a fresh connection (nothing of it reached the engine's application).

Timeouts: connecting is bounded by ``connect_timeout_s``; a silent engine by ``read_timeout_s``: no byte
for that long on a connection with an exchange in flight, found by ``Pool.sweep`` (the sidecar's background
loop calls it), so neither a request nor a read arms a timer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from fleethealth.serve.records import Headers

log = logging.getLogger("fleethealth.sidecar")


class UpstreamError(Exception):
    """The engine could not be reached (connect failed or timed out)."""


class Listener(Protocol):
    """Who hears one exchange's answer (``proxy.Exchange``)."""

    def on_head(self, status: int, headers: Headers) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_end(self) -> None: ...

    def on_fail(self, error: str) -> None: ...


class Connection(asyncio.Protocol):
    __slots__ = ("pool", "transport", "parser", "listener", "headers", "closed", "reused", "received",
                 "keep_alive", "last_rx", "_in_message")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.listener: Listener | None = None
        self.headers: Headers = []
        self.closed = False
        self.reused = False
        self.received = 0  # bytes of the current exchange's answer
        self.keep_alive = True
        self.last_rx = 0.0
        self._in_message = False

    # ---- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self.last_rx = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError:
            log.exception("handling the engine's answer failed")
            self._fail("the sidecar failed while relaying the answer")
        except httptools.HttpParserError as e:
            self._fail(f"bad HTTP from the engine: {e}")

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.busy.discard(self)
        if self._in_message or self.listener is not None:
            why = f"{type(exc).__name__}: {exc}" if exc is not None else "the engine closed the connection"
            self._fail(f"{why} before the answer ended")
        self.pool.forget(self)

    def pause_writing(self) -> None:  # requests are small; nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # ---- httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self.headers = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.listener is not None:
            self.listener.on_head(self.parser.get_status_code(), self.headers)

    def on_body(self, body: bytes) -> None:
        if self.listener is not None:
            self.listener.on_body(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        listener, self.listener = self.listener, None
        self.pool.busy.discard(self)
        if listener is not None:
            listener.on_end()  # may hand this connection back to the pool (``release``)

    # ---- use -------------------------------------------------------------------------------------

    def send(self, data: bytes, listener: Listener) -> None:
        assert self.transport is not None
        self.listener = listener
        self.received = 0
        self.last_rx = time.monotonic()
        self.pool.busy.add(self)
        self.transport.write(data)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        """Drop the connection (an exchange abandoned before its end); the listener hears nothing more."""
        self.listener = None
        self._in_message = False
        self.closed = True
        self.pool.busy.discard(self)
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: str) -> None:
        listener, self.listener = self.listener, None
        self._in_message = False
        self.close()
        if listener is not None:
            listener.on_fail(error)

    def fail(self, error: str) -> None:
        self._fail(error)


class Pool:
    """Keep-alive connections to one engine base URL (``http://host:port[/prefix]``, or https)."""

    def __init__(self, base_url: str, connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0,
                 max_idle: int = 64) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"upstream must be an http:// or https:// URL, got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/").encode()
        default_port = (u.scheme == "https" and self.port == 443) or (u.scheme == "http" and self.port == 80)
        self.host_header = (u.hostname if default_port else f"{u.hostname}:{self.port}").encode()
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if u.scheme == "https" else None
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self._idle: list[Connection] = []
        self.busy: set[Connection] = set()  # an exchange in flight

    def request_head(self, method: bytes, target: bytes, headers: Headers, body_len: int,
                     skip: frozenset[bytes] = frozenset()) -> bytes:
        """The request line and headers for ``target`` (path and query, from the client); headers named in
        ``skip`` are left out (the proxy's hop-by-hop set: filtered here, in the one pass that writes them)."""
        parts = [b"%b %b%b HTTP/1.1\r\nhost: %b\r\ncontent-length: %d\r\naccept-encoding: identity\r\n"
                 % (method, self.prefix, target, self.host_header, body_len)]
        for k, v in headers:
            if k not in skip:
                parts += (k, b": ", v, b"\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def take(self) -> Connection | None:
        """An idle pooled connection, or None (then ``connect``)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    async def acquire(self, fresh: bool = False) -> Connection:
        conn = None if fresh else self.take()
        return conn if conn is not None else await self.connect()

    async def connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(self), self.host, self.port, ssl=self.ssl),
                self.connect_timeout_s)
        except (OSError, TimeoutError) as e:
            raise UpstreamError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
        return conn

    def release(self, conn: Connection) -> None:
        """Back to the pool after a clean end, or closed."""
        if conn.closed or not conn.keep_alive or conn.listener is not None or len(self._idle) >= self.max_idle:
            conn.close()
        else:
            self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def sweep(self) -> None:
        """Fail every exchange whose engine has sent nothing for ``read_timeout_s``."""
        if self.read_timeout_s <= 0:
            return
        now = time.monotonic()
        for conn in [c for c in self.busy if now - c.last_rx >= self.read_timeout_s]:
            conn.fail(f"ReadTimeout: no byte from the engine for {self.read_timeout_s:g}s")

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

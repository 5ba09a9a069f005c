"""The sidecar's HTTP fronts: a lean one for the proxied paths, and the FastAPI routes' adapter.

Theory of operation. The sidecar's server is uvicorn with its httptools protocol, subclassed
(``SidecarProtocol``, bound to one ``Sidecar`` by ``protocol_for``). When a request's headers are parsed the
protocol looks at method and path: ``POST /v1/completions``, ``POST /v1/chat/completions`` and
``GET /v1/models`` become a ``LeanCycle``; every other request (probes, ``/admin/*``, ``/metrics``, docs)
goes on to uvicorn's own ASGI cycle and the FastAPI app in ``app.py``, exactly as before, so whatever that
app does to them (authentication, audit, body limits) still applies.

A ``LeanCycle`` stands where uvicorn's ``RequestResponseCycle`` stands (same attributes the protocol reads:
``response_complete``, ``keep_alive``, ``disconnected``, ``message_event``, ``run_asgi``), so the protocol's
own machinery keeps working for it: pipelined requests queue behind it, keep-alive and its timeout,
graceful shutdown (``keep_alive`` turned off, the connection closed after the answer), and connection loss
(``disconnected = True`` reaches the exchange as ``client_gone``). The cycle is also the exchange's
``Sink``: it writes the status line, headers and body straight to the transport; a stream is written as
HTTP/1.1 chunks, one per body piece parsed from the engine (the engine's own chunk framing is parsed, not
trusted, so a stream can always be ended cleanly with the sidecar's final event). The transport telling
the protocol to pause writing (a slow client) pauses reading from the engine.

Request bodies over ``max_body_bytes`` get 413 before they are read (``Content-Length``) or as soon as a
chunked body crosses the limit, with the same words as ``auth.http.BodyLimit`` on the other paths, and the
connection is closed. ``asgi_proxy`` serves the same proxy from the FastAPI routes (another ASGI server, an
ASGI test transport): a queue between the exchange's callbacks and Starlette's streaming response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from fleethealth.auth.http import _too_large
from fleethealth.serve.records import Answer, Headers, error_json, json_answer

if TYPE_CHECKING:
    from fleethealth.serve.proxy import Exchange
    from fleethealth.serve.sidecar import Sidecar

log = logging.getLogger("fleethealth.sidecar")

BODY_LIMIT_HINT = " (--max-body-bytes of the sidecar)"
# (method, path) served by the lean front; True: an inference request (admission, drain, OOM handling).
LEAN_ROUTES: dict[tuple[bytes, bytes], bool] = {
    (b"POST", b"/v1/completions"): True,
    (b"POST", b"/v1/chat/completions"): True,
    (b"GET", b"/v1/models"): False,
}


def protocol_for(sc: Sidecar) -> type[SidecarProtocol]:
    """uvicorn's ``http=`` protocol class for this sidecar."""
    return type("BoundSidecarProtocol", (SidecarProtocol,), {"sidecar": sc, "idle": IdleSweep()})


class IdleSweep:
    """Closes client connections left idle past uvicorn's keep-alive timeout after a proxied answer. uvicorn
    arms a timer per answer and cancels it on the next request; at a few thousand requests a second that
    pair costs about a sixth of the proxy's own per-request time, so instead connections note when they
    went idle and one sweep a second closes the stale ones (the timeout is kept to within a second)."""

    def __init__(self) -> None:
        self.handle: asyncio.TimerHandle | None = None

    def watch(self, proto: SidecarProtocol) -> None:
        if self.handle is None:
            self.handle = proto.loop.call_later(1.0, self._sweep, proto.loop, proto.connections,
                                                proto.timeout_keep_alive)

    def _sweep(self, loop: asyncio.AbstractEventLoop, connections: set[Any], timeout_s: float) -> None:
        self.handle = None
        now = loop.time()
        waiting = False
        for proto in list(connections):
            since = getattr(proto, "idle_since", None)
            if since is None:
                continue
            if now - since >= timeout_s:
                proto.idle_since = None
                if not proto.transport.is_closing():
                    proto.transport.close()
            else:
                waiting = True
        if waiting:
            self.handle = loop.call_later(1.0, self._sweep, loop, connections, timeout_s)


class SidecarProtocol(HttpToolsProtocol):
    sidecar: Sidecar
    idle: IdleSweep
    idle_since: float | None = None  # set when a proxied answer left the connection idle (IdleSweep)

    def on_headers_complete(self) -> None:
        method = self.parser.get_method()
        target = self.url
        q = target.find(b"?")
        path = target if q < 0 else target[:q]
        inference = LEAN_ROUTES.get((method, path))
        if inference is None or self.parser.should_upgrade():
            self._asgi_headers_complete()
            return
        version = self.parser.get_http_version()
        cycle = LeanCycle(self, inference, method, path, target, self.headers,
                          keep_alive=version != "1.0" and self.parser.should_keep_alive(), version=version,
                          expect_100=self.expect_100_continue)
        limit = self.sidecar.config.max_body_bytes
        for k, v in self.headers:
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = -1
                cycle.too_large = n > limit or n < 0
        existing = self.cycle
        self.cycle = cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            cycle.begin()  # no task: the request is dispatched from on_message_complete
        else:  # pipelined behind an answer still being written: as uvicorn queues its own cycles
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.app))  # type: ignore[arg-type]

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if not isinstance(cycle, LeanCycle):
            super().on_body(body)
            return
        if cycle.too_large or cycle.response_complete:
            return
        cycle.body += body
        if len(cycle.body) > self.sidecar.config.max_body_bytes:
            cycle.too_large = True
            cycle.body = bytearray()
            if cycle.started:
                cycle.answer_too_large()
            cycle.message_event.set()

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if not isinstance(cycle, LeanCycle):
            super().on_message_complete()
            return
        cycle.more_body = False
        if cycle._event is not None:
            cycle._event.set()
        if cycle.started:
            cycle.dispatch()

    def on_message_begin(self) -> None:
        # uvicorn builds the ASGI scope here; a proxied request never needs it, so it is built only when the
        # request turns out to be for the app (``_asgi_headers_complete``).
        self.idle_since = None
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def _asgi_headers_complete(self) -> None:
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if not isinstance(self.cycle, LeanCycle) or self.pipeline:
            super().on_response_complete()
            return
        # uvicorn's own, less its keep-alive timer (IdleSweep does that job).
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        self.idle_since = self.loop.time()
        self.idle.watch(self)

    def pause_writing(self) -> None:
        super().pause_writing()
        if isinstance(self.cycle, LeanCycle):
            self.cycle.set_write_paused(True)

    def resume_writing(self) -> None:
        super().resume_writing()
        if isinstance(self.cycle, LeanCycle):
            self.cycle.set_write_paused(False)


class LeanCycle:
    """One proxied request on a client connection, and the ``Sink`` its exchange writes to."""

    __slots__ = ("proto", "transport", "inference", "method", "path", "target", "headers", "keep_alive", "version",
                 "chunked", "expect_100", "body", "more_body", "too_large", "_event", "response_started",
                 "response_complete", "started", "write_paused", "exchange", "task", "_disconnected", "on_response")

    def __init__(self, proto: SidecarProtocol, inference: bool, method: bytes, path: bytes, target: bytes,
                 headers: Headers, keep_alive: bool, version: str, expect_100: bool) -> None:
        self.proto = proto
        self.transport = proto.transport
        self.inference = inference
        self.method = method
        self.path = path
        self.target = target
        self.headers = headers
        self.keep_alive = keep_alive
        self.version = version
        self.chunked = version == "1.1"
        self.expect_100 = expect_100
        self.body = bytearray()
        self.more_body = True
        self.too_large = False
        self._event: asyncio.Event | None = None  # made only when someone waits or pokes (pipelining, loss)
        self.response_started = False
        self.response_complete = False
        self.started = False  # dispatched when its body is complete (False while pipelined)
        self.write_paused = False
        self.exchange: Exchange | None = None
        self.task: asyncio.Task[Any] | None = None
        self._disconnected = False
        self.on_response = proto.on_response_complete

    # ---- what uvicorn's protocol reads and writes ------------------------------------------------

    @property
    def message_event(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    @property
    def disconnected(self) -> bool:
        return self._disconnected

    @disconnected.setter
    def disconnected(self, value: bool) -> None:
        if not value or self._disconnected:
            return
        self._disconnected = True
        if self.exchange is not None:
            self.exchange.client_gone()
        elif self.task is not None and not self.task.done() and self.task is not asyncio.current_task():
            self.task.cancel()  # queued for admission, or reading the body: nothing to answer anymore

    def begin(self) -> None:
        """The connection's current request: answered as soon as its body is complete."""
        self.started = True
        if self.too_large:
            self.answer_too_large()
        elif self.expect_100 and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def run_asgi(self, app: Any) -> None:  # a pipelined request's turn; ``app`` is unused
        if self.more_body and not self.too_large:
            if self.expect_100 and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.message_event.wait()
        self.started = True
        if self.too_large:
            self.answer_too_large()
        else:
            self.dispatch()

    def dispatch(self) -> None:
        if self._disconnected or self.response_started:
            return
        body, self.body = bytes(self.body), bytearray()
        core = self.proto.sidecar.proxy_core
        try:
            if self.inference:
                core.inference(self.path.decode("latin-1"), self.target, self.headers, body, self)
            else:
                self.task = asyncio.get_running_loop().create_task(self._passthrough(body))
        except Exception:
            self._failed()

    async def _passthrough(self, body: bytes) -> None:
        try:
            await self.proto.sidecar.proxy_core.passthrough(self.method, self.target, self.headers, body, self)
        except asyncio.CancelledError:
            if not self._disconnected:
                raise
        except Exception:
            self._failed()

    def _failed(self) -> None:
        log.exception("proxying %s failed", self.path.decode("latin-1"))
        if not self.response_started:
            self.answer(json_answer(500, error_json("the sidecar failed on this request", "internal_error",
                                                    "sidecar_error")))
        else:
            self.transport.close()

    def set_write_paused(self, paused: bool) -> None:
        self.write_paused = paused
        ex = self.exchange
        if ex is not None:
            if paused:
                ex.pause()
            else:
                ex.resume()

    # ---- Sink ------------------------------------------------------------------------------------

    def answer(self, a: Answer) -> None:
        if self.response_started:
            return
        self.response_started = True
        if self._disconnected:
            self.response_complete = True
            return
        out = self._head(a.status, a.headers, b"content-length: %d\r\n\r\n" % len(a.body))
        out.append(a.body)
        self.transport.write(b"".join(out))
        self._complete()

    def begin_stream(self, status: int, headers: Headers) -> None:
        self.response_started = True
        if self._disconnected:
            return
        if not self.chunked:  # an HTTP/1.0 client: the body ends when the connection does
            self.keep_alive = False
        self.transport.write(b"".join(self._head(
            status, headers, b"transfer-encoding: chunked\r\n\r\n" if self.chunked else b"\r\n")))

    def chunk(self, data: bytes) -> None:
        if self.chunked:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.transport.write(data)

    def end_stream(self, tail: bytes, cut: bool) -> None:
        if self._disconnected or self.response_complete:
            return
        out = (b"%x\r\n%b\r\n" % (len(tail), tail) if self.chunked else tail) if tail else b""
        if self.chunked:
            out += b"0\r\n\r\n"
        if out:
            self.transport.write(out)
        if cut and self.write_paused:
            # The client stopped reading: it gets what is queued (ending with the final event) and then the
            # connection closes; it cannot hold the drain, or this connection, open.
            self.keep_alive = False
        self._complete()

    # ---- helpers ---------------------------------------------------------------------------------

    def _head(self, status: int, headers: Headers, last: bytes) -> list[bytes]:
        proto = self.proto
        if proto.access_log:
            client = f"{proto.client[0]}:{proto.client[1]}" if proto.client else "-"
            proto.access_logger.info('%s - "%s %s HTTP/%s" %d', client, self.method.decode(),
                                     self.target.decode("latin-1"), self.version, status)
        out = [STATUS_LINE[status]]
        for k, v in headers:
            out += (k, b": ", v, b"\r\n")
        if not self.keep_alive:
            out.append(b"connection: close\r\n")
        out.append(last)
        return out

    def _complete(self) -> None:
        self.response_complete = True
        self.exchange = None
        if self._event is not None:
            self._event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def answer_too_large(self) -> None:
        self.keep_alive = False
        start, body = _too_large(self.proto.sidecar.config.max_body_bytes, BODY_LIMIT_HINT)
        headers = [(k, v) for k, v in start["headers"] if k not in (b"content-length", b"connection")]
        self.answer(Answer(413, body["body"], headers))


# ---- the FastAPI routes' adapter ----------------------------------------------------------------------


class QueueSink:
    """Sink for the ASGI path: a whole answer becomes a Response; a stream goes through a queue that
    Starlette's StreamingResponse drains (the engine connection pauses while the queue is long)."""

    def __init__(self) -> None:
        self.exchange: Exchange | None = None
        self.response: Response | None = None
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._paused = False
        self._ended = False
        self._writer: asyncio.Task[Any] | None = None
        self.decided: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def answer(self, a: Answer) -> None:
        r = Response(a.body, a.status)
        r.raw_headers.extend(a.headers)
        self._decide(r)

    def begin_stream(self, status: int, headers: Headers) -> None:
        r = StreamingResponse(self._body(), status_code=status)
        r.raw_headers.extend(headers)
        self._decide(r)

    def _decide(self, r: Response) -> None:
        if self.response is None:
            self.response = r
            self.decided.set_result(None)

    def chunk(self, data: bytes) -> None:
        self._queue.put_nowait(data)
        if not self._paused and self._queue.qsize() >= 64 and self.exchange is not None:
            self._paused = True
            self.exchange.pause()

    def end_stream(self, tail: bytes, cut: bool) -> None:
        self._ended = True
        if tail:
            self._queue.put_nowait(tail)
        self._queue.put_nowait(None)
        if cut and self._writer is not None:
            # A writer still blocked on a client that stopped reading is cancelled after a short grace;
            # Starlette then closes the connection.
            writer = self._writer
            asyncio.get_running_loop().call_later(1.0, lambda: writer.done() or writer.cancel())

    async def _body(self) -> AsyncIterator[bytes]:
        self._writer = asyncio.current_task()
        try:
            while True:
                item = await self._queue.get()
                if self._paused and self._queue.qsize() < 8:
                    self._paused = False
                    if self.exchange is not None:
                        self.exchange.resume()
                if item is None:
                    return
                yield item
        finally:
            if not self._ended and self.exchange is not None:
                with contextlib.suppress(Exception):
                    self.exchange.client_gone()


async def asgi_proxy(sc: Sidecar, request: Request, path: str, inference: bool) -> Response:
    body = await request.body()
    raw_path: bytes = request.scope.get("raw_path") or path.encode()
    qs: bytes = request.scope.get("query_string") or b""
    target = raw_path + (b"?" + qs if qs else b"")
    headers: Headers = list(request.scope["headers"])
    sink = QueueSink()
    if inference:
        sc.proxy_core.inference(path, target, headers, body, sink)
        await sink.decided
    else:
        await sc.proxy_core.passthrough(request.method.encode(), target, headers, body, sink)
    if sink.response is None:  # the client left before anything was decided
        return Response(status_code=499)
    return sink.response

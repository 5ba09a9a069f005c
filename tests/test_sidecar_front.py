"""The sidecar's lean proxy front and its engine pool, on real loopback sockets: pipelining, clients that leave
(mid-stream, while queued), HTTP/1.0 and Expect: 100-continue clients, an engine that drops pooled
connections, a silent engine, and the FastAPI routes' proxy (the path any other ASGI server takes)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from typing import Any

import httpx

from fake_engine import ServerThread, running_pair, wait_until
from fleethealth.serve.app import create_app
from fleethealth.serve.config import SidecarConfig
from fleethealth.serve.proxy import Exchange
from fleethealth.serve.server import http_protocol


def _post(path: str, body: dict[str, Any], version: str = "1.1", extra: bytes = b"") -> bytes:
    raw = json.dumps(body).encode()
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n").encode() + extra + b"\r\n" + raw


def _read_until_closed(s: socket.socket) -> bytes:
    out = b""
    s.settimeout(10)
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_pipelined_requests_are_answered_in_order() -> None:
    with running_pair() as p:
        s = socket.create_connection(("127.0.0.1", p.sidecar_srv.port))
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 2}
        s.sendall(_post("/v1/completions", body) + b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
                  + _post("/v1/completions", {**body, "max_tokens": 3}, extra=b"Connection: close\r\n"))
        out = _read_until_closed(s).decode()
        s.close()
        assert re.findall(r"HTTP/1\.1 (\d{3})", out) == ["200"] * 3, out
        assert out.index('"t0 t1 "') < out.index('"ready"') < out.index('"t0 t1 t2 "')


def test_a_client_that_leaves_mid_stream_frees_the_engine() -> None:
    with running_pair() as p:
        p.engine.set(token_delay_s=0.02)
        s = socket.create_connection(("127.0.0.1", p.sidecar_srv.port))
        s.sendall(_post("/v1/completions", {"model": "fake-model", "prompt": "x", "max_tokens": 1000, "stream": True}))
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        wait_until(lambda: any(r.phase.value == "decoding" for r in p.sc.active), 5)
        s.close()
        wait_until(lambda: not p.sc.active and p.engine.running == 0, 5)
        assert p.sc.outcomes["client_gone"] == 1 and p.sc.admission.active == 0


def test_a_client_that_leaves_while_queued_never_reaches_the_engine() -> None:
    with running_pair(max_concurrency=1) as p:
        p.engine.set(token_delay_s=0.02)
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 40, "stream": True}
        n0 = p.engine.requests
        first = threading.Thread(target=lambda: httpx.post(p.url + "/v1/completions", json=body, timeout=30))
        first.start()
        wait_until(lambda: p.engine.running == 1, 5)
        s = socket.create_connection(("127.0.0.1", p.sidecar_srv.port))
        s.sendall(_post("/v1/completions", body))
        wait_until(lambda: p.sc.admission.queued == 1, 5)
        s.close()
        wait_until(lambda: p.sc.admission.queued == 0 and len(p.sc.active) == 1, 5)
        first.join(10)
        wait_until(lambda: not p.sc.active, 5)
        assert p.engine.requests == n0 + 1  # the first stream only: never the queued one
        assert p.sc.admission.active == 0 and p.sc.outcomes["completed"] == 1


def test_http10_client_gets_a_stream_that_ends_with_the_connection() -> None:
    with running_pair() as p:
        s = socket.create_connection(("127.0.0.1", p.sidecar_srv.port))
        s.sendall(_post("/v1/completions", {"model": "fake-model", "prompt": "x", "max_tokens": 5, "stream": True},
                        version="1.0"))
        out = _read_until_closed(s)
        s.close()
        head, body = out.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
        events = [e for e in body.split(b"\n\n") if e]
        assert len(events) == 6 and events[-1] == b"data: [DONE]"


def test_expect_100_continue_is_answered_before_the_body() -> None:
    with running_pair() as p:
        raw = json.dumps({"model": "fake-model", "prompt": "x", "max_tokens": 2}).encode()
        s = socket.create_connection(("127.0.0.1", p.sidecar_srv.port))
        s.settimeout(10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(raw))
        assert s.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(raw)
        out = _read_until_closed(s)
        s.close()
        assert out.startswith(b"HTTP/1.1 200") and b'"t0 t1 "' in out


class DroppingEngine:
    """A raw engine whose connections answer one request and then drop the next one unanswered: what an
    engine's keep-alive timeout does to a pooled connection at the moment it is reused."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        buf, answered = b"", 0
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    _, buf = buf.split(b"\r\n\r\n", 1)
                    if answered:
                        return  # the second request on this connection: dropped
                    body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                                 % len(body) + body)
                    answered += 1

    def close(self) -> None:
        self.sock.close()


def test_a_pooled_connection_the_engine_dropped_is_retried_on_a_fresh_one() -> None:
    engine = DroppingEngine()
    cfg = SidecarConfig(upstream=engine.url, replica="r", probe_interval_s=3600, admin_token="t")
    app = create_app(cfg)
    try:
        with ServerThread(app, http=http_protocol(app.state.sidecar)) as s:
            for _ in range(5):
                r = httpx.get(s.url + "/v1/models", timeout=10)
                assert r.status_code == 200 and r.json()["data"][0]["id"] == "m"
            assert engine.connections >= 5
            # Inference requests too (the engine answers anything with the same JSON).
            wait_until(lambda: app.state.sidecar.state.value == "READY", 10)
            for _ in range(5):
                r = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": "x"}, timeout=10)
                assert r.status_code == 200 and r.json()["data"][0]["id"] == "m"
            assert engine.connections >= 10 and app.state.sidecar.outcomes["completed"] == 5
    finally:
        engine.close()


def test_a_silent_engine_is_cut_after_the_read_timeout() -> None:
    with running_pair(upstream_read_timeout_s=0.5) as p:
        p.engine.set(mode="hang")
        t0 = time.monotonic()
        r = httpx.post(p.url + "/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2},
                       timeout=30)
        assert r.status_code == 503 and "ReadTimeout" in r.json()["error"]["message"], r.text
        assert time.monotonic() - t0 < 10
        assert p.sc.outcomes["engine_unreachable"] == 1
        p.engine.set(mode="normal")


def test_the_fastapi_routes_proxy_streams_and_drain_them_the_same_way() -> None:
    # Any other ASGI server (or none of the sidecar's protocol) serves the proxy through app.py's routes.
    with running_pair(max_drain_seconds=0.5) as p:
        p.engine.set(token_delay_s=0.05)
        with ServerThread(p.app) as plain:  # the same app and sidecar, uvicorn's own protocol
            ok = httpx.post(plain.url + "/v1/completions", json={"model": "fake-model", "prompt": "x",
                                                                 "max_tokens": 3}, timeout=10)
            assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == "t0 t1 t2 "
            body = {"model": "fake-model", "prompt": "hello", "max_tokens": 100, "stream": True}
            with httpx.stream("POST", plain.url + "/v1/completions", json=body, timeout=10) as resp:
                it = resp.iter_raw()
                first = next(it)
                assert httpx.post(p.url + "/admin/drain", headers=p.auth, timeout=5).status_code == 202
                rest = b"".join(it)
            events = [e for e in (first + rest).split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]"
            assert json.loads(events[-2][len(b"data: "):])["error"]["code"] == "stream_ended_by_sidecar"
            wait_until(lambda: p.sc.outcomes["cut_at_deadline"] == 1, 5)


def test_many_concurrent_streams_and_requests_are_relayed_whole_and_leave_nothing_behind() -> None:
    import asyncio

    with running_pair(max_concurrency=20, queue_limit=1000) as p:
        p.engine.set(token_delay_s=0.001)

        async def scenario() -> list[tuple[int, Any]]:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
            async with httpx.AsyncClient(base_url=p.url, timeout=60, limits=limits) as c:
                async def stream() -> tuple[int, Any]:
                    body = {"model": "fake-model", "prompt": "x", "max_tokens": 50, "stream": True}
                    async with c.stream("POST", "/v1/completions", json=body) as r:
                        raw = b"".join([chunk async for chunk in r.aiter_bytes()])
                    return r.status_code, [e for e in raw.split(b"\n\n") if e]

                async def whole() -> tuple[int, Any]:
                    r = await c.post("/v1/chat/completions", json={"model": "fake-model", "max_tokens": 3,
                                                                   "messages": [{"role": "user", "content": "hi"}]})
                    return r.status_code, r.json()["choices"][0]["message"]["content"]

                return await asyncio.gather(*[stream() for _ in range(60)], *[whole() for _ in range(120)])

        results = asyncio.run(scenario())
        for status, events in results[:60]:  # every stream whole, in order (admission queued most of them)
            assert status == 200 and len(events) == 51 and events[-1] == b"data: [DONE]"
            assert [json.loads(e[6:])["choices"][0]["text"] for e in events[:-1]] == [f"t{i} " for i in range(50)]
        assert all(r == (200, "t0 t1 t2 ") for r in results[60:])
        wait_until(lambda: not p.sc.active, 5)
        assert p.sc.outcomes == {"completed": 180}
        assert (p.sc.admission.active, p.sc.admission.queued, p.sc._busy_streams, p.sc._busy_whole) == (0, 0, 0, 0)
        # The background loop polls the engine every 50 ms on the same pool, so one of its fetches may be in
        # flight: no connection may still be held by a proxied request.
        assert not [c for c in p.sc.proxy_core.pool.busy if isinstance(c.listener, Exchange)]
        assert p.sc.progress.proxy_active == 0


def test_idle_client_connections_are_closed_after_the_keep_alive_timeout() -> None:
    with running_pair() as p:
        p.sidecar_srv.server.config.timeout_keep_alive = 1  # read by each new connection
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 2}
        s = socket.create_connection(("127.0.0.1", p.sidecar_srv.port))
        s.settimeout(10)
        for _ in range(3):  # used again before the timeout: still open
            s.sendall(_post("/v1/completions", body))
            assert s.recv(65536).startswith(b"HTTP/1.1 200")
            time.sleep(0.3)
        assert s.recv(65536) == b""  # then idle: the sidecar closes it (a hang here fails on the timeout)
        s.close()

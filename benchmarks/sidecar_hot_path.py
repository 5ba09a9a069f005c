"""The sidecar's own Python cost per proxied request and per streamed chunk, in process with hot caches: no
sockets, no event-loop wakeups, no other tenants. The lean front (serve/front.py) is fed a client request, the
engine connection (serve/upstream.py) the engine's answer, through stand-in transports that only collect
what is written. What this leaves out of bench_sidecar.py's figures is the event loop, the system calls
and, on a shared machine, cold caches.

Usage: ``python benchmarks/sidecar_hot_path.py [--requests 20000] [--chunks 100000]`` (run from a tree whose
src/ has serve/front.py; bench_sidecar.py runs it for the new tree). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from fleethealth.decide.model import State
from fleethealth.serve.app import create_app
from fleethealth.serve.config import SidecarConfig
from fleethealth.serve.front import protocol_for
from fleethealth.serve.upstream import Connection


class Collect:
    """A transport that keeps nothing."""

    def __init__(self) -> None:
        self.closing = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _request(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:8080\r\naccept: */*\r\naccept-encoding: gzip\r\n"
            b"connection: keep-alive\r\nuser-agent: python-httpx/0.28.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(raw)) + raw


async def measure(requests: int, chunks: int) -> dict[str, float]:
    logging.getLogger("fleethealth").setLevel(logging.ERROR)
    cfg = SidecarConfig(upstream="http://127.0.0.1:9", replica="r", probe_interval_s=3600, use_nvml=False,
                        admin_token="x")
    app = create_app(cfg)
    sc = app.state.sidecar
    sc.lifecycle.state = State.READY
    ucfg = uvicorn.Config(app, log_level="warning")
    ucfg.load()
    proto = protocol_for(sc)(config=ucfg, server_state=ServerState(), app_state={})
    proto.connection_made(Collect())  # type: ignore[arg-type]
    conn = Connection(sc.proxy_core.pool)
    conn.connection_made(Collect())  # type: ignore[arg-type]
    pool = sc.proxy_core.pool

    answer = json.dumps({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "fake-model",
                         "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
                         "choices": [{"index": 0, "finish_reason": "length", "text": "t0 "}]}).encode()
    whole = (b"HTTP/1.1 200 OK\r\ndate: Wed, 02 Dec 2026 01:13:30 GMT\r\nserver: uvicorn\r\n"
             b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer)) + answer
    req = _request({"model": "fake-model", "prompt": "hello", "max_tokens": 1})

    def one() -> None:
        if not pool._idle:  # the answer's end gives the connection back; the first time, we do
            pool._idle.append(conn)
        proto.data_received(req)
        conn.data_received(whole)

    for _ in range(200):
        one()
    done0 = sc.outcomes["completed"]
    t0 = time.process_time()
    for _ in range(requests):
        one()
    per_request = (time.process_time() - t0) / requests
    assert sc.outcomes["completed"] - done0 == requests, sc.outcomes

    event = b'data: {"id": "cmpl-2", "object": "text_completion", "created": 1, "model": "fake-model", ' \
            b'"choices": [{"index": 0, "text": "t1 ", "finish_reason": null}]}\n\n'
    chunk = b"%x\r\n%s\r\n" % (len(event), event)
    proto.data_received(_request({"model": "fake-model", "prompt": "hello", "max_tokens": chunks + 1,
                                  "stream": True}))
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                       b"transfer-encoding: chunked\r\n\r\n" + chunk)
    rec = next(iter(sc.active))
    t0 = time.process_time()
    for _ in range(chunks):
        conn.data_received(chunk)
    per_chunk = (time.process_time() - t0) / chunks
    assert rec.chunks == chunks + 1, rec.chunks
    conn.data_received(b"0\r\n\r\n")
    return {"hot_request_us": 1e6 * per_request, "hot_chunk_us": 1e6 * per_chunk}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--chunks", type=int, default=100000)
    a = ap.parse_args()
    try:  # the loop the sidecar runs on (its timers and futures are part of the cost)
        import uvloop

        result = uvloop.run(measure(a.requests, a.chunks))
    except ImportError:
        result = asyncio.run(measure(a.requests, a.chunks))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

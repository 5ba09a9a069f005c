"""What the request-body limit (fleethealth.auth.http.BodyLimit) costs per request on the sidecar's proxy
path, old (no middleware) vs new side by side: the ASGI app is called directly (no sockets), with a 2 KB
JSON body in one message, so the figure is the middleware's own CPU per request.

Usage: ``python benchmarks/bench_body_limit.py [--requests 20000]``. Prints microseconds per request
(median of 5 rounds, thread CPU time) for each arm and the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from fleethealth.auth.http import BodyLimit

BODY = b'{"model": "m", "prompt": "' + b"x" * 2000 + b'", "max_tokens": 16}'
SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions",
         "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]}


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, answers 200: what a proxy endpoint does before forwarding."""
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def run(target: Any, n: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(m: Any) -> None:
        return None

    t0 = time.thread_time()
    for _ in range(n):
        await target(dict(SCOPE), receive, send)
    return (time.thread_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    a = ap.parse_args()
    limited = BodyLimit(app, 16 << 20)
    old, new = [], []
    for _ in range(5):
        old.append(asyncio.run(run(app, a.requests)))
        new.append(asyncio.run(run(limited, a.requests)))
    o, nw = statistics.median(old), statistics.median(new)
    print(f"{'arm':<28}{'us/request (CPU)':>18}")
    print(f"{'old: no body limit':<28}{o:>18.2f}")
    print(f"{'new: BodyLimit(16 MiB)':<28}{nw:>18.2f}")
    print(f"{'added by the limit':<28}{nw - o:>18.2f}")


if __name__ == "__main__":
    main()

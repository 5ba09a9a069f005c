"""Request-body limits for the controller's and the sidecar's HTTP servers (an ASGI middleware).

Theory of operation: a request whose ``Content-Length`` is over the limit is answered 413 at once, its
body never read. A chunked body (no length) is counted while the application reads it; the chunk that
crosses the limit is not handed over: the application sees the client disconnect, whatever it answers is
dropped, and the client gets 413 instead. So the memory a request can take is the limit plus one chunk,
never the body's size. The message says what the limit is and how to change it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _too_large(limit: int, hint: str) -> tuple[dict[str, Any], dict[str, Any]]:
    body = json.dumps({"detail": f"request body larger than {limit} bytes{hint}"}).encode()
    start = {"type": "http.response.start", "status": 413,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")]}
    return start, {"type": "http.response.body", "body": body}


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, hint: str = "") -> None:
        self.app = app
        self.max_bytes = int(max_bytes)
        self.hint = hint  # e.g. " (api.max_body_bytes in the controller config)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for k, v in scope.get("headers") or ():
            if k.lower() == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = -1
                if n > limit or n < 0:
                    for m in _too_large(limit, self.hint):
                        await send(m)
                    return
        seen = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if over:
                return  # the application's answer to a body it never fully got is replaced by the 413
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            for m in _too_large(limit, self.hint):
                await send(m)

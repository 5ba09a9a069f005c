"""/api/v1 on a sharded replica (``controller.sharded``): each replica serves the API of the shards it holds
and names the holder of the others.

Theory of operation
- A shard's controller runs in a process of its own, and that process serves the ordinary controller API
  (``controller.api.create_app``: reads, and the authenticated, audited writes: events such as ack,
  active_test, reset; the kill switch; incident labels) on a loopback port of its own, with the same
  security as one controller (``controller.security``: token file or TokenReview, SubjectAccessReview,
  audit rows in the shard's part of the store and Kubernetes Events), started after the shard's first
  cycle (a shard taken over decides first). Its port goes to the replica through the shared slots.
- The replica's listener routes ``/api/v1/shards/<shard>/<endpoint>`` (or ``/api/v1/<endpoint>?pool=P``:
  the shard whose matcher selects pool P) to that process (``ShardApiRouter.route``), passing the
  caller's Authorization, body and address. The address travels in ``X-Fleethealth-Peer`` with a secret
  the replica gave its processes (``X-Fleethealth-Proxy``); ``ForwardedPeer`` in the shard's process
  takes it only with that secret, so the loopback rule for reads and the audit's ``remote`` see the real
  caller, never the replica, and no one else can claim an address.
- A shard not held here: 421 (Misdirected Request) with one line naming the replica that holds it (the
  Lease's holderIdentity, as last listed) and the header ``X-Fleethealth-Shard-Holder``; a shard held by
  no one (a take-over under way) or whose controller is still starting here: 503 with Retry-After. A
  request naming no shard: 400 listing the shards and who holds each. Nothing is redirected: replicas
  know each other by identity, not by address.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from fleethealth.controller.shards import ShardSpec, owns

PEER_HEADER = "x-fleethealth-peer"
PROXY_HEADER = "x-fleethealth-proxy"
HOLDER_HEADER = "X-Fleethealth-Shard-Holder"
PREFIX = "/api/v1/shards/"


class ForwardedPeer:
    """ASGI middleware of a shard's API: the caller's address from ``X-Fleethealth-Peer`` when the request
    carries the replica's secret, else the TCP peer as it is."""

    def __init__(self, app: Any, secret: str) -> None:
        self.app, self.secret = app, secret.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            headers = dict(scope.get("headers") or [])
            peer = headers.get(PEER_HEADER.encode())
            if peer and hmac.compare_digest(headers.get(PROXY_HEADER.encode(), b""), self.secret):
                host, _, port = peer.decode("latin-1").rpartition(":")
                scope = {**scope, "client": (host, int(port) if port.isdigit() else 0)}
        await self.app(scope, receive, send)


Reply = tuple[int, bytes, dict[str, str]]


def _error(status: int, detail: str, **extra: Any) -> Reply:
    headers = {"Content-Type": "application/json"}
    if status == 503:
        headers["Retry-After"] = "2"
    if extra.get("holder"):
        headers[HOLDER_HEADER] = str(extra["holder"])
    return status, json.dumps({"detail": detail, **extra}).encode(), headers


class ShardApiRouter:
    """The replica's half: which shard a request is for, and the answer (forwarded, or why not).
    ``held``: whether this replica holds a shard now; ``holder``: a shard's holder as last listed;
    ``port``: the loopback port of a held shard's API (0 while it starts); ``forward``: the HTTP call
    (method, url, headers, body) -> (status, body, headers)."""

    def __init__(self, identity: str, specs: Sequence[ShardSpec], label: str, secret: str,
                 held: Callable[[str], bool], holder: Callable[[str], str | None], port: Callable[[str], int],
                 forward: Callable[[str, str, Mapping[str, str], bytes], Reply], max_body_bytes: int) -> None:
        self.identity, self.specs, self.label, self.secret = identity, list(specs), label, secret
        self.held, self.holder, self.port, self.forward = held, holder, port, forward
        self.max_body_bytes = max_body_bytes

    def where(self) -> str:
        """The shards and who holds each, for people: ``s1 here, s2 at rep-b, s3 at no one``."""
        return ", ".join(f"{s.name} " + ("here" if self.held(s.name) else f"at {self.holder(s.name) or 'no one'}")
                         for s in self.specs)

    def shard_for(self, target: str) -> tuple[str | None, str, str]:
        """(shard or None, the shard API's path, its query) of a request target."""
        parts = urlsplit(target)
        query = parse_qsl(parts.query, keep_blank_values=True)
        if parts.path.startswith(PREFIX):
            shard, _, rest = parts.path[len(PREFIX):].partition("/")
            return shard, "/api/v1/" + rest, urlencode(query)
        pools = [v for k, v in query if k == "pool"]
        if pools:
            owner = next((s.name for s in self.specs if owns(s, self.specs, {self.label: pools[0]}, self.label)), None)
            return owner, parts.path, urlencode(query)
        return None, parts.path, urlencode(query)

    def route(self, method: str, target: str, headers: Mapping[str, str], body: bytes, peer: str) -> Reply:
        shard, path, query = self.shard_for(target)
        if any(seg in (".", "..") for seg in path.split("/")):  # only the shard's /api/v1 is reachable
            return _error(400, "no '.' or '..' segments in an API path")
        if shard is None:
            return _error(400, "a sharded replica serves /api/v1 per shard: /api/v1/shards/<shard>/<endpoint> "
                               f"or ?pool=<pool> (shards: {self.where()})")
        if shard not in {s.name for s in self.specs}:
            return _error(404, f"no shard {shard!r} (shards: {self.where()})")
        if not self.held(shard):
            holder = self.holder(shard)
            if holder is None:
                return _error(503, f"shard {shard} is held by no replica right now (a take-over is under way); "
                                   "retry in a few seconds", shard=shard)
            return _error(421, f"shard {shard} is held by replica {holder}, not by {self.identity}: send the "
                               "request to that replica", shard=shard, holder=holder)
        port = self.port(shard)
        if port <= 0:
            return _error(503, f"shard {shard} was just taken by {self.identity}; its controller is starting, "
                               "retry in a few seconds", shard=shard)
        if len(body) > self.max_body_bytes:
            return _error(413, f"request body over {self.max_body_bytes} bytes (api.max_body_bytes in the "
                               "controller config)")
        out = {k: v for k, v in headers.items() if k.lower() in ("authorization", "content-type", "accept")}
        out[PEER_HEADER] = peer
        out[PROXY_HEADER] = self.secret
        url = f"http://127.0.0.1:{port}{path}" + (f"?{query}" if query else "")
        try:
            status, data, got = self.forward(method, url, out, body)
        except Exception as e:  # the shard's process went away mid-request (lost, stopping)
            return _error(503, f"shard {shard}'s controller did not answer: {type(e).__name__}; retry", shard=shard)
        keep = {k: v for k, v in got.items() if k.lower() in ("content-type", "www-authenticate", "retry-after")}
        return status, data, keep


def httpx_forward(timeout_s: float = 30.0) -> Callable[[str, str, Mapping[str, str], bytes], Reply]:
    """The router's HTTP call, on one connection pool."""
    import httpx

    client = httpx.Client(timeout=timeout_s)

    def forward(method: str, url: str, headers: Mapping[str, str], body: bytes) -> Reply:
        r = client.request(method, url, headers=dict(headers), content=body or None)
        return r.status_code, r.content, dict(r.headers)

    return forward


def serve_shard_api(asm: Any, secret: str, attempts: int = 5) -> Any:
    """In a shard's process: the controller API on a free loopback port (``controller.api.ApiServer``
    with the shard's security and ``ForwardedPeer``); returns the started server (``.port``)."""
    import socket

    from fleethealth.controller.api import ApiServer
    from fleethealth.controller.security import build_security

    cfg = asm.config
    sec = build_security(cfg, asm.store)
    asm.closers.append(sec.close)
    last: Exception | None = None
    for _ in range(attempts):  # a free port may be taken between the probe and the bind: try another
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            server = ApiServer(asm.controller, "127.0.0.1", port, runner=asm.runner, guard=sec.guard,
                               auditor=sec.auditor, api=cfg.api,
                               wrap=lambda app: ForwardedPeer(app, secret)).start()
        except RuntimeError as e:
            last = e
            continue
        asm.closers.append(server.stop)
        return server
    raise RuntimeError(f"cannot serve the shard's API: {last}")

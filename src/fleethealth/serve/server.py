"""Running the sidecar as a process: uvicorn with signal handling that drains before exiting.

The sidecar sits in every token's path, so the process runs on uvloop (libuv event loop) with the sidecar's
own httptools protocol (``front.SidecarProtocol``: proxied paths bypass ASGI and relay the engine's bytes
from callback to socket; every other path is uvicorn's ASGI cycle and the FastAPI app). Without uvloop or
httptools installed (both are dependencies) it falls back to asyncio + h11 and the FastAPI proxy routes:
slower, same behaviour. benchmarks/bench_sidecar.py measures the difference.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import uvicorn

from fleethealth.serve.app import create_app
from fleethealth.serve.config import SidecarConfig
from fleethealth.serve.sidecar import Sidecar


class DrainingServer(uvicorn.Server):
    """SIGTERM/SIGINT first drains (as POST /admin/drain would), then exits; a second signal exits at once.
    With a preStop hook the drain is already done and this returns at once; without one (docker stop, a
    bare process) streams in flight still finish and queued requests still get their 503 + Retry-After."""

    _draining = False

    def __init__(self, config: uvicorn.Config, sidecar: Sidecar) -> None:
        super().__init__(config)
        self.sidecar = sidecar

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets=sockets)
        # Everything loaded so far (FastAPI, pydantic, numpy, the policy) lives as long as the process: move
        # it out of the cyclic collector's generations, so its periodic full collections stop walking a few
        # hundred thousand objects that can never be garbage (the proxy allocates per request and triggers
        # them).
        gc.collect()
        gc.freeze()

    def handle_exit(self, sig: int, frame: object) -> None:
        if self._draining or self.should_exit:
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            return
        self._draining = True
        # Signal handlers run in the thread of the event loop, between its callbacks.
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(lambda: loop.create_task(self._drain_then_exit()))

    async def _drain_then_exit(self) -> None:
        sc = self.sidecar
        sc.start_drain("SIGTERM", fault=False)
        await sc.wait_drained(sc.config.max_drain_seconds + 5)
        self.should_exit = True


def _fast(module: str, fallback: str) -> str:
    """The C-backed implementation when importable, else uvicorn's pure-Python one (named explicitly so a
    missing wheel is a slower sidecar, never a failed start)."""
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module


def http_protocol(sc: Sidecar) -> Any:
    """uvicorn's ``http=`` for this sidecar: the lean front when httptools is there, else uvicorn's h11."""
    if _fast("httptools", "h11") == "h11":
        return "h11"
    from fleethealth.serve.front import protocol_for

    return protocol_for(sc)


def run_sidecar(cfg: SidecarConfig, host: str, port: int, log_level: str = "info") -> None:
    # proxy_headers off: the admin loopback check must see the real peer, not X-Forwarded-For.
    app = create_app(cfg)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, proxy_headers=False,
                            timeout_graceful_shutdown=int(cfg.max_drain_seconds) + 5,
                            loop=_fast("uvloop", "asyncio"), http=http_protocol(app.state.sidecar))
    from fleethealth.auth.redact import install_log_redaction

    install_log_redaction()  # uvicorn's logging is configured by now: no URL credentials in any line
    DrainingServer(config, app.state.sidecar).run()

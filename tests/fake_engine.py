"""A small real OpenAI-compatible test engine (FastAPI + uvicorn on a loopback port) that streams tokens over
server-sent events, exports vLLM-named metrics, and can be told to hang, crash, slow down or OOM.

Behaviour is switched through ``engine.behavior`` in-process, or ``POST /control`` with the same fields
as JSON (for the benchmark, which runs the engine as a subprocess):
``python tests/fake_engine.py --port 8000``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {req} GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which {free} GiB is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and "
    "{reserved} GiB is reserved by PyTorch but unallocated."
)


@dataclass
class Behavior:
    mode: str = "normal"  # normal | hang (no tokens, /health still 200) | crash (dead engine) | oom | error
    ttft_s: float = 0.0  # delay before the first token
    token_delay_s: float = 0.005  # between tokens
    default_max_tokens: int = 16
    max_running: int = 10_000  # beyond this, requests wait (engine queue) before their first token
    oom_over_tokens: int | None = None  # in mode oom: only requests with prompt+max_tokens above this OOM
    oom_free_gib: float = 0.2
    oom_reserved_gib: float = 0.1
    oom_request_gib: float = 2.0
    error_text: str = "CUDA error: an illegal memory access was encountered"
    max_model_len: int = 4096
    kv_cache_usage: float = 0.3
    token_padding: int = 0  # extra bytes per streamed token (to fill socket buffers in tests)
    export_metrics: bool = True  # False: /metrics answers 404 (an engine without Prometheus metrics)


class FakeEngine:
    def __init__(self, model: str = "fake-model") -> None:
        self.model = model
        self.behavior = Behavior()
        self.running = 0
        self.waiting = 0
        self.generated = 0
        self.requests = 0
        self.oom_count = 0
        self._sem: asyncio.Semaphore | None = None
        self._sem_size = 0
        self._ids = itertools.count(1)
        self.app = self._build()

    def set(self, **kw: Any) -> None:
        for k, v in kw.items():
            if k not in {f.name for f in fields(Behavior)}:
                raise KeyError(k)
            setattr(self.behavior, k, v)

    def _semaphore(self) -> asyncio.Semaphore:
        if self._sem is None or self._sem_size != self.behavior.max_running:
            self._sem = asyncio.Semaphore(self.behavior.max_running)
            self._sem_size = self.behavior.max_running
        return self._sem

    def _build(self) -> FastAPI:
        app = FastAPI(title="fake engine")

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=503 if self.behavior.mode == "crash" else 200)

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [
                {"id": self.model, "object": "model", "max_model_len": self.behavior.max_model_len}]})

        @app.get("/metrics")
        async def metrics() -> PlainTextResponse:
            if not self.behavior.export_metrics:
                return PlainTextResponse("not found", status_code=404)
            m = f'model_name="{self.model}",engine="0"'
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{m}}} {self.running}\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{m}}} {self.waiting}\n"
                "# TYPE vllm:kv_cache_usage_perc gauge\n"
                f"vllm:kv_cache_usage_perc{{{m}}} {self.behavior.kv_cache_usage}\n"
                "# TYPE vllm:generation_tokens_total counter\n"
                f"vllm:generation_tokens_total{{{m}}} {float(self.generated)}\n"
            )
            return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

        @app.post("/control")
        async def control(request: Request) -> JSONResponse:
            self.set(**(await request.json()))
            return JSONResponse(asdict(self.behavior))

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await self._generate(await request.json(), chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await self._generate(await request.json(), chat=True)

        return app

    async def _generate(self, body: dict[str, Any], chat: bool) -> Response:
        b = self.behavior
        self.requests += 1
        if chat:
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        else:
            prompt = str(body.get("prompt", ""))
        prompt_tokens = max(1, (len(prompt) + 3) // 4)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or b.default_max_tokens)
        if b.mode == "crash":
            return JSONResponse({"error": {"message": "engine is dead", "type": "EngineDeadError"}}, 500)
        if b.mode == "error":
            return JSONResponse({"error": {"message": b.error_text, "type": "InternalServerError"}}, 500)
        if b.mode == "oom" and (b.oom_over_tokens is None or prompt_tokens + max_tokens > b.oom_over_tokens):
            self.oom_count += 1
            msg = TORCH_OOM.format(req=b.oom_request_gib, free=b.oom_free_gib, reserved=b.oom_reserved_gib)
            return JSONResponse({"object": "error", "message": msg, "type": "InternalServerError",
                                 "code": 500, "prompt_tokens": prompt_tokens}, 500)
        rid = f"cmpl-{next(self._ids)}"
        stream = bool(body.get("stream"))
        if not stream:
            async with self._slot():
                text = []
                for i in range(max_tokens):
                    await self._next_token(i)
                    text.append(f"t{i} ")
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                     "total_tokens": prompt_tokens + max_tokens}
            if chat:
                return JSONResponse({"id": rid, "object": "chat.completion", "created": int(time.time()),
                                     "model": self.model, "usage": usage, "choices": [{
                                         "index": 0, "finish_reason": "length",
                                         "message": {"role": "assistant", "content": "".join(text)}}]})
            return JSONResponse({"id": rid, "object": "text_completion", "created": int(time.time()),
                                 "model": self.model, "usage": usage, "choices": [{
                                     "index": 0, "finish_reason": "length", "text": "".join(text)}]})
        return StreamingResponse(self._stream(rid, chat, max_tokens), media_type="text/event-stream")

    def _slot(self) -> Any:
        engine = self

        class _Slot:
            async def __aenter__(self) -> None:
                engine.waiting += 1
                try:
                    await engine._semaphore().acquire()
                finally:
                    engine.waiting -= 1
                engine.running += 1

            async def __aexit__(self, *exc: Any) -> None:
                engine.running -= 1
                engine._semaphore().release()

        return _Slot()

    async def _next_token(self, i: int) -> None:
        b = self.behavior
        await asyncio.sleep(b.ttft_s if i == 0 else b.token_delay_s)
        while self.behavior.mode == "hang":
            await asyncio.sleep(0.02)
        if self.behavior.mode == "crash":
            raise RuntimeError("engine crashed")
        self.generated += 1

    async def _stream(self, rid: str, chat: bool, n: int) -> AsyncIterator[bytes]:
        created = int(time.time())
        async with self._slot():
            for i in range(n):
                await self._next_token(i)
                last = i == n - 1
                if chat:
                    delta: dict[str, Any] = {"content": f"t{i} "}
                    if i == 0:
                        delta["role"] = "assistant"
                    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": "length" if last else None}
                    obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model,
                           "choices": [choice]}
                else:
                    text = f"t{i} " + "x" * self.behavior.token_padding
                    obj = {"id": rid, "object": "text_completion", "created": created, "model": self.model,
                           "choices": [{"index": 0, "text": text, "finish_reason": "length" if last else None}]}
                yield f"data: {json.dumps(obj)}\n\n".encode()
            yield b"data: [DONE]\n\n"


class ServerThread:
    """Runs an ASGI app with uvicorn on a free loopback port in a background thread."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, http: Any = "auto") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        cfg = uvicorn.Config(app, log_level="warning", lifespan="on", proxy_headers=False,
                             timeout_graceful_shutdown=2, limit_concurrency=None, backlog=1024, http=http)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ---- harness for the sidecar tests ------------------------------------------------------------------

ADMIN_TOKEN = "test-admin-token"


def wait_until(pred: Any, timeout_s: float = 10.0, interval_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(interval_s)


class Pair:
    """A fake engine and a sidecar in front of it, both on real loopback ports."""

    def __init__(self, engine: FakeEngine, engine_srv: ServerThread, sidecar_srv: ServerThread, app: Any) -> None:
        self.engine = engine
        self.engine_srv = engine_srv
        self.sidecar_srv = sidecar_srv
        self.app = app
        self.sc = app.state.sidecar
        self.url = sidecar_srv.url
        self.auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@contextmanager
def running_pair(clock: Any = None, gpu_reader: Any = None, **cfg: Any) -> Iterator[Pair]:
    from fleethealth.serve.app import create_app
    from fleethealth.serve.config import SidecarConfig
    from fleethealth.serve.server import http_protocol

    engine = FakeEngine()
    with ServerThread(engine.app) as esrv:
        defaults: dict[str, Any] = {"replica": "replica-0", "admin_token": ADMIN_TOKEN, "probe_interval_s": 0.05,
                                    "liveness_timeout_s": 1.0, "max_drain_seconds": 5.0, "retry_after_s": 3}
        defaults.update(cfg)
        app = create_app(SidecarConfig(upstream=esrv.url, **defaults), clock=clock, gpu_reader=gpu_reader)
        # The sidecar's own server protocol (its lean proxy front), as `fleethealth sidecar` runs it.
        with ServerThread(app, http=http_protocol(app.state.sidecar)) as ssrv:
            pair = Pair(engine, esrv, ssrv, app)
            from fleethealth.decide.model import State

            wait_until(lambda: pair.sc.state is State.READY, 10)
            yield pair


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="fake OpenAI-compatible engine")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--token-delay", type=float, default=0.0)
    args = ap.parse_args()
    eng = FakeEngine()
    eng.behavior.token_delay_s = args.token_delay
    uvicorn.run(eng.app, host=args.host, port=args.port, log_level="warning", access_log=False)

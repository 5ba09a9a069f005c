"""The sidecar's proxy: admission of an inference request, its exchange with the engine, and what the sidecar
reads from the answer (first token, progress, OOMs and CUDA errors).

Theory of operation. A front (``front.SidecarProtocol`` on the hot path, ``front.asgi_proxy`` for the
FastAPI routes) parses the client's request and hands ``Proxy.inference`` its path, headers and body with a
``Sink``: the client side of the exchange, written through plain calls (``answer`` for a whole answer,
``begin_stream``/``chunk``/``end_stream`` for a stream). ``inference`` checks the body and the replica's
state (lifecycle, canary share, DEGRADED's length limit, the learned oversize limit), then waits for
admission (``Admission``), then an ``Exchange`` forwards the request on a pooled engine connection
(``upstream``) and listens to the answer through callbacks:

- the engine's status and headers; a stream that answers 200 with ``text/event-stream`` waits for its first
  body bytes (SENT -> DECODING; a drain before that answers 503, the client saw nothing), anything else is
  collected whole (errors are read for OOM and CUDA texts, then classified);
- once a stream is DECODING each body piece goes from the parser's callback to the client's socket in the
  same call: count, timestamp (inter-token latency, engine progress for /livez), a look for ``"error"``,
  and the write. No task, no queue: this path is what every streamed token costs;
- the end: the stream is closed (chunked terminator), the request recorded, the connection pooled again.

A drain reaches an exchange through ``RequestRecord.abort``; a client that goes away through
``Exchange.client_gone``; a client that reads slower than the engine writes through ``pause``/``resume``
(the engine connection stops being read, so nothing piles up in the sidecar). A stream ended by the
sidecar (drain deadline, engine failure) ends on an SSE event boundary with a final
``data: {"error": ...}`` event and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
import time
from typing import TYPE_CHECKING, Any, Protocol

from fleethealth.decide.model import State, Tier
from fleethealth.decide.oom import (
    OomClass,
    OomEvent,
    classify_oom,
    context_errors_in,
    is_oom_text,
    oom_intents,
    parse_torch_oom,
    xids_in,
)
from fleethealth.serve.admission import Rejected
from fleethealth.serve.config import SystemClock
from fleethealth.serve.lifecycle import admits
from fleethealth.serve.records import (
    HOP_BY_HOP,
    Answer,
    Headers,
    Phase,
    RequestRecord,
    error_json,
    estimate_tokens,
    json_answer,
    prompt_text,
)
from fleethealth.serve.upstream import Connection, Pool, UpstreamError

if TYPE_CHECKING:
    from fleethealth.serve.sidecar import Sidecar

_HOP = frozenset(h.encode() for h in HOP_BY_HOP)

# Exchange stages (ints: compared once per streamed chunk).
_QUEUED, _WAIT_HEAD, _WAIT_FIRST, _STREAM, _COLLECT, _OVER = range(6)


class Sink(Protocol):
    """The client side of one exchange. ``exchange`` is set once the request is forwarded, so the front can
    tell it about the client (gone, slow)."""

    exchange: Exchange | None

    def answer(self, a: Answer) -> None: ...

    def begin_stream(self, status: int, headers: Headers) -> None: ...

    def chunk(self, data: bytes) -> None: ...

    def end_stream(self, tail: bytes, cut: bool) -> None:
        """``tail``: last bytes of the body (a final event, or nothing). ``cut``: the sidecar ended it; a
        client that stopped reading must not keep the connection."""
        ...


def forward_headers(headers: Headers) -> Headers:
    return [(k, v) for k, v in headers if k not in _HOP]


def answer_headers(headers: Headers) -> Headers:
    return [(k, v) for k, v in headers if k not in _HOP]


def _is_event_stream(headers: Headers) -> bool:
    return any(k == b"content-type" and b"text/event-stream" in v for k, v in headers)


class Proxy:
    def __init__(self, sc: Sidecar) -> None:
        self.sc = sc
        c = sc.config
        self.pool = Pool(c.upstream, c.upstream_connect_timeout_s, c.upstream_read_timeout_s,
                         max_idle=c.max_concurrency + 16)
        # The per-chunk path stamps time with the clock's function itself (no method hop) when it is the
        # system clock; tests inject theirs.
        self.now = time.time if isinstance(sc.clock, SystemClock) else sc.clock.now

    def close(self) -> None:
        self.pool.close()

    # ---- inference: admission, then the exchange --------------------------------------------------

    def inference(self, path: str, target: bytes, headers: Headers, raw: bytes, sink: Sink) -> None:
        """Answers at once (refused), or starts the exchange; its answer reaches ``sink`` later. Runs in the
        caller's callback: a task exists only while the request waits for admission or a new connection."""
        sc = self.sc
        c = sc.config
        try:
            payload = json.loads(raw.decode()) if raw else {}  # str: json skips guessing the encoding
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            sink.answer(json_answer(400, error_json("request body must be a JSON object", "invalid_request_error",
                                                    "invalid_json")))
            return
        stream = bool(payload.get("stream"))
        mt = payload.get("max_tokens", payload.get("max_completion_tokens"))
        max_tokens = int(mt) if isinstance(mt, (int, float)) else None  # noqa: UP038 (a tuple: no union built per call)
        text = prompt_text(payload)
        est = estimate_tokens(text)
        st = sc.state
        if not admits(st):
            sink.answer(sc._unavailable(f"replica {c.replica} is {st}; retry on another replica"))
            return
        canary = st is State.RECOVERING
        if canary:
            short = max_tokens is not None and max_tokens <= c.canary.short_max_tokens
            if not short or not sc.share_gate.admit(sc._canary_weight):
                sink.answer(sc._unavailable(f"replica {c.replica} is RECOVERING (canary at weight "
                                            f"{sc._canary_weight:.2f}); retry on another replica", "canary"))
                return
        if st is State.DEGRADED and c.degraded_max_tokens is not None \
                and (max_tokens is None or max_tokens > c.degraded_max_tokens):
            sink.answer(sc._unavailable(f"replica {c.replica} is DEGRADED and takes no new long requests "
                                        f"(max_tokens above {c.degraded_max_tokens}); retry on another replica",
                                        "degraded_long_request"))
            return
        if sc.oversize_limit_tokens is not None and est + (max_tokens or 0) >= sc.oversize_limit_tokens:
            allowed = sc.oversize_limit_tokens - est - 1
            if c.oom_clip_max_tokens and allowed > 0:
                payload["max_tokens"] = allowed
                payload.pop("max_completion_tokens", None)
                max_tokens = allowed
                raw = json.dumps(payload).encode()
            else:
                sc.outcomes["rejected_oversized"] += 1
                sink.answer(json_answer(400, error_json(
                    f"request too large for this replica: about {est} prompt tokens + max_tokens {max_tokens} "
                    f"reached {sc.oversize_limit_tokens} tokens, where it ran out of GPU memory before"
                    + (f"; lower max_tokens to at most {allowed}" if allowed > 0 else "; shorten the prompt"),
                    "invalid_request_error", "oom_oversized_request")))
                return
        rec = RequestRecord(
            id=next(sc._ids), path=path, stream=stream, model=str(payload.get("model", "")),
            max_tokens=max_tokens, prompt_tokens_est=est,
            prompt_digest=hashlib.sha256(text.encode()).hexdigest()[:16], prompt_chars=len(text),
            prompt_text=None if c.redact_prompts else text, canary=canary, started=self.now(),
        )
        sc.active.add(rec)
        ex = Exchange(self, rec, payload, sink, pool_request(self.pool, target, headers, raw))
        if sc.admission.try_acquire():
            ex.admitted()
        else:
            ex.task = asyncio.get_running_loop().create_task(ex.queue_for_admission())

    # ---- passthrough ------------------------------------------------------------------------------

    async def passthrough(self, method: bytes, target: bytes, headers: Headers, body: bytes, sink: Sink) -> None:
        """Non-inference endpoints (e.g. /v1/models): forwarded without admission, answered whole."""
        try:
            status, got_headers, got = await self.fetch(method, target, self.sc.config.health_timeout_s,
                                                        forward_headers(headers), body)
        except UpstreamError as e:
            sink.answer(self.sc._unavailable(f"engine unreachable: {e}", "engine_unreachable"))
            return
        sink.answer(Answer(status, got, answer_headers(got_headers)))

    async def fetch(self, method: bytes, target: bytes, timeout_s: float, headers: Headers | None = None,
                    body: bytes = b"") -> tuple[int, Headers, bytes]:
        """One whole exchange on the pool (passthrough, and the background loop's health and metrics polls).
        Raises UpstreamError when the engine cannot be reached or does not answer within ``timeout_s``."""
        pool = self.pool
        data = pool.request_head(method, target, headers or [], len(body)) + body
        for attempt in (0, 1):
            got = _Whole()
            conn = await pool.acquire(fresh=attempt > 0)
            conn.send(data, got)
            try:
                await asyncio.wait_for(asyncio.shield(got.done), timeout_s)
            except TimeoutError:
                conn.close()
                raise UpstreamError(f"ReadTimeout: no answer within {timeout_s:g}s") from None
            except asyncio.CancelledError:
                conn.close()
                raise
            if got.error is not None and conn.reused and conn.received == 0 and attempt == 0:
                continue  # a pooled connection the engine had just closed: once more on a fresh one
            break
        if got.error is not None or got.status is None:
            raise UpstreamError(got.error or "no answer")
        pool.release(conn)
        return got.status, got.headers, b"".join(got.parts)

    # ---- error answers: OOM classification, CUDA errors ------------------------------------------

    def upstream_error(self, rec: RequestRecord, payload: dict[str, Any], status: int, headers: Headers,
                       body: bytes) -> Answer:
        sc = self.sc
        text = body.decode("utf-8", "replace")
        if is_oom_text(text):
            return self._on_oom(rec, payload, text)
        sc._inspect_error_text(text)
        sc._record_error("upstream", f"HTTP {status}: {text[:300]}")
        sc._finish(rec, f"http_{status}", status, status >= 500)
        if sc.cuda_errors and sc.cuda_errors[-1][0] >= (rec.sent_at or 0):
            tier = Tier.NODE if context_errors_in(text) or xids_in(text) else Tier.POD
            sc.start_drain(f"CUDA error in engine response: {text[:200]}", fault=True, tier=tier)
            return sc._unavailable("the engine hit a CUDA error; retry on another replica", "cuda_error")
        return Answer(status, body, answer_headers(headers))

    def _on_oom(self, rec: RequestRecord, payload: dict[str, Any], text: str) -> Answer:
        sc = self.sc
        now = sc.clock.now()
        c = sc.config
        nums = parse_torch_oom(text)
        m = re.search(r"prompt[_ ]tokens\D{0,3}(\d+)", text)
        prompt_tokens = int(m.group(1)) if m else rec.prompt_tokens_est
        kv = sc.engine.get("vllm:kv_cache_usage_perc", sc.engine.get("vllm:gpu_cache_usage_perc"))
        running = sc.engine.get("vllm:num_requests_running")
        sc._inspect_error_text(text)
        ev = OomEvent(
            ts=now, prompt_tokens=prompt_tokens, max_tokens=rec.max_tokens, max_batch_tokens=c.max_batch_tokens,
            kv_capacity_tokens=c.kv_capacity_tokens,
            running_requests=int(running) if running is not None else sc.admission.active,
            kv_cache_usage=kv, requested_bytes=nums.requested_bytes, free_bytes=nums.free_bytes,
            reserved_bytes=nums.reserved_unallocated_bytes, allocated_bytes=nums.allocated_bytes,
            total_bytes=nums.total_bytes,
            recent_xids=tuple(x for t, x in sc.recent_xids if now - t <= c.cuda_error_window_s),
            cuda_errors=tuple(e for t, e in sc.cuda_errors if now - t <= c.cuda_error_window_s),
            model_max_len=sc.model_max_len, entity=c.replica, model=sc.model or rec.model,
        )
        v = classify_oom(ev, c.oom)
        intents = oom_intents(ev, now, c.oom, current_limit=sc.admission.limit,
                              policy_version=sc.lifecycle.policy_version)
        for i in intents:
            sc._record_intent(i)
        sc.ooms[str(v.cls)] += 1
        sc.last_oom_at = now
        # ``event`` has OomEvent's fields: the decisions layer's "oom" events take exactly this payload.
        sc.oom_events.append({"ts": now, "class": str(v.cls), "explanation": v.explanation,
                              "event": {k: (list(x) if isinstance(x, tuple) else x)
                                        for k, x in dataclasses.asdict(ev).items()},
                              "evidence": list(v.evidence), "request": rec.sample(), "text": text[:500]})
        sc._record_error("oom", f"{v.cls}: {v.explanation}")
        sc._finish(rec, f"oom_{v.cls}", 400 if v.cls is OomClass.OVERSIZED_REQUEST else 503,
                   v.cls is not OomClass.OVERSIZED_REQUEST)
        if v.cls is OomClass.OVERSIZED_REQUEST:
            req_tokens = prompt_tokens + (rec.max_tokens or 0)
            sc.oversize_limit_tokens = min(sc.oversize_limit_tokens or req_tokens, req_tokens)
            return json_answer(400, error_json(f"request too large for this replica: {v.explanation}",
                                               "invalid_request_error", "oom_oversized_request"))
        if v.cls is OomClass.BATCH_OVERLOAD:
            for i in intents:
                if "max_concurrency" in i.params:
                    sc.admission.set_limit(int(i.params["max_concurrency"]))
            sc.last_limit_raise = now
        elif v.cls is OomClass.FRAGMENTATION:
            sc.start_drain(f"OOM: {v.explanation}", fault=True, tier=Tier.POD)
        else:
            sc.start_drain(f"OOM: {v.explanation}", fault=True, tier=Tier.NODE)
        return sc._unavailable(f"the engine ran out of GPU memory ({v.cls}); retry on another replica",
                               f"oom_{v.cls}")


class _Whole:
    """Listener that collects a whole answer (passthrough)."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: Headers = []
        self.parts: list[bytes] = []
        self.error: str | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_head(self, status: int, headers: Headers) -> None:
        self.status, self.headers = status, headers

    def on_body(self, data: bytes) -> None:
        self.parts.append(data)

    def on_end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_fail(self, error: str) -> None:
        self.error = error
        self.on_end()


def pool_request(pool: Pool, target: bytes, headers: Headers, body: bytes) -> bytes:
    return pool.request_head(b"POST", target, headers, len(body), _HOP) + body


class Exchange:
    """One inference request from admission to its end: the upstream connection's listener, the sink's
    ``exchange`` (client gone, slow client) and the record's ``on_abort`` (drain). Every event is a plain
    call; the only awaits are the admission queue and opening a new engine connection (``task``)."""

    __slots__ = ("proxy", "sc", "rec", "payload", "sink", "data", "conn", "stage", "task", "status", "headers",
                 "parts", "upstream_done", "fail_error", "ended_clean", "now", "watch", "retried")

    def __init__(self, proxy: Proxy, rec: RequestRecord, payload: dict[str, Any], sink: Sink, data: bytes) -> None:
        self.proxy = proxy
        self.sc = proxy.sc
        self.rec = rec
        self.payload = payload
        self.sink = sink
        self.data = data  # the request as sent upstream
        self.conn: Connection | None = None
        self.stage = _QUEUED
        self.task: asyncio.Task[None] | None = None
        self.status: int | None = None
        self.headers: Headers = []
        self.parts: list[bytes] = []
        self.upstream_done = False
        self.fail_error: str | None = None
        self.ended_clean = True
        self.now = proxy.now
        self.watch = proxy.sc.progress
        self.retried = False
        sink.exchange = self

    # ---- admission and sending --------------------------------------------------------------------

    async def queue_for_admission(self) -> None:
        sc, rec = self.sc, self.rec
        try:
            await sc.admission.acquire(sc.config.queue_timeout_s)
        except Rejected as e:
            self.task = None
            self._over()
            sc.active.discard(rec)
            sc.outcomes["rejected_queue"] += 1
            rec.outcome, rec.status = "rejected_queue", 503
            sc.samples.append(rec)
            self.sink.answer(sc._unavailable(f"not admitted: {e.reason}; retry on another replica", "not_admitted"))
            return
        except asyncio.CancelledError:  # the client went away while queued
            self._over()
            sc.active.discard(rec)
            return
        self.task = None
        self.admitted()

    def admitted(self) -> None:
        sc, rec = self.sc, self.rec
        rec.phase = Phase.SENT
        rec.sent_at = now = self.now()
        sc._busy(rec, 1, now)
        if rec.abort_reason is not None:  # a drain started while it was being admitted
            self._over()
            sc._finish(rec, "rejected_draining", 503, False)
            self.sink.answer(sc._unavailable(f"{rec.abort_reason}; retry on another replica", "draining"))
            return
        rec.on_abort = self.abort
        self.stage = _WAIT_HEAD
        self._send(fresh=False)

    def _send(self, fresh: bool) -> None:
        conn = None if fresh else self.proxy.pool.take()
        if conn is None:
            self.task = asyncio.get_running_loop().create_task(self._connect_and_send())
        else:
            self.conn = conn
            conn.send(self.data, self)

    async def _connect_and_send(self) -> None:
        try:
            conn = await self.proxy.pool.connect()
        except UpstreamError as e:
            self.task = None
            if self.stage != _OVER:
                self.fail_error = str(e)
                self._settle("fail")
            return
        except asyncio.CancelledError:  # ended meanwhile (client gone, drain)
            return
        self.task = None
        if self.stage == _OVER:
            self.proxy.pool.release(conn)
            return
        self.conn = conn
        conn.send(self.data, self)

    # ---- how it ends, unless it streams -----------------------------------------------------------

    def _settle(self, what: str) -> None:
        sc, rec, sink = self.sc, self.rec, self.sink
        stage = self.stage
        if what == "first" and rec.abort_reason is None:
            self._begin_stream()
            return
        self._over()
        if what in ("abort", "first"):
            self._close_upstream()
            outcome = "cut_at_deadline" if stage == _COLLECT and self.parts else "rejected_draining"
            sc._finish(rec, outcome, 503, False)
            sink.answer(sc._unavailable(f"{rec.abort_reason}; retry on another replica", "draining"))
        elif what == "gone":
            self._close_upstream()
            sc._finish(rec, "client_gone", 499, False)
        elif what == "fail":
            err = self.fail_error or "no answer"
            sc._record_error("upstream", err)
            if self.status is None:
                sc._finish(rec, "engine_unreachable", 503, True)
                sink.answer(sc._unavailable(f"engine unreachable: {err}", "engine_unreachable"))
            else:
                sc._finish(rec, "upstream_failed", 502, True)
                sink.answer(json_answer(502, error_json(f"engine failed: {err}", "upstream_error", "engine_failed")))
        else:  # "end": a whole answer
            body = b"".join(self.parts)
            status = self.status or 502
            if status >= 400:
                sink.answer(self.proxy.upstream_error(rec, self.payload, status, self.headers, body))
                return
            now = self.now()
            rec.first_at = rec.last_chunk_at = now
            sc.progress.progress(now)
            if b'"error"' in body[:200]:
                sc._inspect_error_text(body[:2000].decode("utf-8", "replace"))
            sc._finish(rec, "completed", status, False)
            sink.answer(Answer(status, body, answer_headers(self.headers)))

    def _begin_stream(self) -> None:
        rec, sc = self.rec, self.sc
        now = self.now()
        rec.phase = Phase.DECODING
        rec.first_at = rec.last_chunk_at = now
        rec.chunks = len(self.parts)
        sc.progress.progress(now)
        self.stage = _STREAM
        self.sink.begin_stream(self.status or 200, answer_headers(self.headers))
        for part in self.parts:
            if b'"error"' in part:
                sc._inspect_error_text(part.decode("utf-8", "replace"))
            self.sink.chunk(part)
        self.ended_clean = self.parts[-1].endswith(b"\n\n")
        self.parts = []

    # ---- the connection's callbacks ---------------------------------------------------------------

    def on_head(self, status: int, headers: Headers) -> None:
        self.status = status
        self.headers = headers
        self.stage = _WAIT_FIRST if status < 400 and self.rec.stream and _is_event_stream(headers) else _COLLECT

    def on_body(self, data: bytes) -> None:
        if self.stage == _STREAM:  # the per-token path
            rec = self.rec
            now = self.now()
            rec.itl_sum += now - rec.last_chunk_at
            rec.last_chunk_at = now
            rec.chunks += 1
            if now > self.watch.last_progress:
                self.watch.last_progress = now
            if b'"error"' in data:
                self.sc._inspect_error_text(data.decode("utf-8", "replace"))
            self.ended_clean = data.endswith(b"\n\n")
            self.sink.chunk(data)
            return
        if self.stage == _OVER:
            return
        self.parts.append(data)
        if self.stage == _WAIT_FIRST:
            self._settle("first")

    def on_end(self) -> None:
        self.upstream_done = True
        conn, self.conn = self.conn, None
        if conn is not None:
            self.proxy.pool.release(conn)
        if self.stage == _STREAM:
            self._end_stream(None, "completed", False)
        elif self.stage != _OVER:
            self._settle("end")

    def on_fail(self, error: str) -> None:
        self.fail_error = error
        conn, self.conn = self.conn, None  # the connection closed itself
        if self.stage == _STREAM:
            self.sc._record_error("upstream", error)
            self._end_stream(f"engine failed: {error}", "upstream_failed", True)
        elif self.stage == _OVER:
            return
        elif self.status is None and conn is not None and conn.reused and conn.received == 0 and not self.retried:
            self.retried = True  # a pooled connection the engine had just closed: once more on a fresh one
            self.fail_error = None
            self._send(fresh=True)
        else:
            self._settle("fail")

    # ---- from the drain and the front -------------------------------------------------------------

    def abort(self, reason: str) -> None:
        if self.stage == _STREAM:
            self._close_upstream()
            self._end_stream(reason, "cut_at_deadline", False, cut=True)
        elif self.stage != _OVER:
            self._settle("abort")

    def client_gone(self) -> None:
        if self.stage == _QUEUED:
            if self.task is not None:
                self.task.cancel()
        elif self.stage == _STREAM:
            self._close_upstream()
            self._over()
            self.sc._finish(self.rec, "client_gone" if self.rec.abort_reason is None else "cut_at_deadline", 499, False)
        elif self.stage != _OVER:
            self._settle("gone")

    def pause(self) -> None:
        if self.conn is not None:
            self.conn.pause()

    def resume(self) -> None:
        if self.conn is not None:
            self.conn.resume()

    # ---- helpers ----------------------------------------------------------------------------------

    def _over(self) -> None:
        self.stage = _OVER
        self.rec.on_abort = None
        self.sink.exchange = None
        task, self.task = self.task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _close_upstream(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def _end_stream(self, message: str | None, outcome: str, error: bool, cut: bool = False) -> None:
        self._over()
        tail = b""
        if message is not None:
            ev = json.dumps(error_json(message, "service_unavailable", "stream_ended_by_sidecar"))
            tail = (b"" if self.ended_clean else b"\n\n") + f"data: {ev}\n\ndata: [DONE]\n\n".encode()
        self.sink.end_stream(tail, cut)
        self.sc._finish(self.rec, outcome, 200, error)

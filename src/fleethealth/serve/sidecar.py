"""The sidecar's imperative shell for one inference replica: its lifecycle, the background loop (engine health
and metrics, GPU check, engine log), drain, canary, evidence and probes, around the pure parts (lifecycle
table, canary, progress watch, OOM classifier, GPU verdict).

Theory of operation. ``Sidecar`` holds every piece of state that outlives a request; the proxy path lives
elsewhere and reports back through ``_finish`` (one call per request, with its outcome):
- ``records``: the request record and its phases (QUEUED, SENT, DECODING), drain progress, helpers;
- ``proxy``: admission and the exchange with the engine, OOM classification of error answers;
- ``upstream``: pooled raw HTTP/1.1 connections to the engine;
- ``front``: the lean HTTP front that parses proxied requests itself and hands every other path (probes,
  admin, metrics) to the FastAPI app in ``app``.
The background loop (``tick``, every ``probe_interval_s``) polls the engine through httpx (off the hot
path), scores the GPU, reads the engine log and moves the lifecycle; a drain runs as a task that waits for
in-flight requests up to the deadline, then aborts the rest (``RequestRecord.abort``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import re
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.decide.oom import context_errors_in, fatal_xids, is_oom_text, xids_in
from fleethealth.serve.admission import Admission
from fleethealth.serve.canary import Canary, Observation, ShareGate, Verdict, recent_failures
from fleethealth.serve.config import Clock, SidecarConfig, as_clock
from fleethealth.serve.gpu import GpuCheck, GpuReader, GpuVerdict
from fleethealth.serve.lifecycle import Event, ReplicaLifecycle, admits
from fleethealth.serve.progress import ProgressWatch
from fleethealth.serve.proxy import Proxy
from fleethealth.serve.records import (
    HOP_BY_HOP,
    Answer,
    DrainProgress,
    Phase,
    RequestRecord,
    engine_values,
    error_json,
    json_answer,
)
from fleethealth.serve.upstream import UpstreamError

__all__ = ["HOP_BY_HOP", "DrainProgress", "Phase", "RequestRecord", "Sidecar", "engine_values"]

log = logging.getLogger("fleethealth.sidecar")


class Sidecar:
    def __init__(self, config: SidecarConfig, clock: Clock | Callable[[], float] | None = None, gpu_reader: GpuReader | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.clock: Clock = as_clock(clock)
        self.gpu_reader = gpu_reader
        self._transport = transport
        now = self.clock.now()
        self.lifecycle = ReplicaLifecycle(config.replica, State.STARTING, now, config.policy.version_tag)
        self.admission = Admission(config.max_concurrency, config.queue_limit)
        self.progress = ProgressWatch(config.liveness_timeout_s, last_progress=now)
        self.gpu = GpuCheck(config.policy, config.gpu_fail_below)
        self.share_gate = ShareGate()
        self.canary: Canary | None = None
        self.canary_stats: dict[str, float] = {}
        self.canary_failures: list[float] = []
        self.transitions: deque[Transition] = deque(maxlen=200)
        self.intents: deque[Intent] = deque(maxlen=200)
        self.last_errors: deque[dict[str, Any]] = deque(maxlen=50)
        self.samples: deque[RequestRecord] = deque(maxlen=100)  # finished requests (as dicts in evidence)
        self.metrics_window: deque[dict[str, Any]] = deque(maxlen=120)
        self.engine_log_tail: deque[str] = deque(maxlen=200)
        self.cuda_errors: deque[tuple[float, str]] = deque(maxlen=50)
        self.recent_xids: deque[tuple[float, int]] = deque(maxlen=50)
        self.ooms: Counter[str] = Counter()
        self.oom_events: deque[dict[str, Any]] = deque(maxlen=50)
        self.outcomes: Counter[str] = Counter()
        self.requests_total = 0
        self.errors_total = 0
        self.active: set[RequestRecord] = set()
        self._busy_streams = 0  # requests at the engine (SENT or DECODING), streams and whole answers
        self._busy_whole = 0
        self._ids = itertools.count(1)
        self.engine: dict[str, float] = {}
        self.engine_up = False
        self.engine_ever_up = False
        self.engine_down_since: float | None = None
        self.engine_fail_streak = 0
        self.model: str | None = None
        self.model_max_len: int | None = None
        self.had_fault = False  # a crash or fault happened: the next warm-up leads to RECOVERING, not READY
        self.quarantine_tier: Tier | None = None
        self.drain: DrainProgress | None = None
        self.drain_history: deque[dict[str, Any]] = deque(maxlen=20)
        self.oversize_limit_tokens: int | None = None
        self.last_oom_at: float | None = None
        self.last_limit_raise: float = now
        self.score: float | None = None
        self._below_since: float | None = None
        self._above_since: float | None = None
        self.evidence_last: dict[str, Any] | None = None
        self._log_pos: int | None = None
        self._client: httpx.AsyncClient | None = None
        self.proxy_core = Proxy(self)  # the request path (admission, exchange with the engine)
        self._loop_task: asyncio.Task[None] | None = None
        self._warming = False
        self._probe_inflight = False
        self._canary_weight = 0.0
        self.fb_baseline_mib: float | None = None  # GPU memory in use while last READY

    # ---- lifecycle helpers -----------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.lifecycle.state

    def _step(self, event: Event, reason: str, detail: str = "") -> Transition | None:
        t = self.lifecycle.step(event, self.clock.now(), reason, value=self.score, detail=detail)
        if t is not None:
            self.transitions.append(t)
            log.info("state %s -> %s (%s)", t.from_state, t.to_state, reason)
            if t.to_state is State.RECOVERING:
                self.canary = Canary(t.ts, self.config.canary)
                self.canary_stats = {"requests": 0, "errors": 0, "probe_ok": 0, "probe_fail": 0,
                                     "ttft_sum": 0.0, "ttft_n": 0, "itl_sum": 0.0, "itl_n": 0}
                self.share_gate = ShareGate()
                self._canary_weight = 0.0
            if t.to_state is State.READY:
                self.had_fault = False
                self.quarantine_tier = None
        return t

    def weight(self) -> float:
        st = self.state
        if st is State.RECOVERING:
            return self._canary_weight
        if st in (State.READY, State.DEGRADED):
            return 1.0 if self.score is None else round(max(0.0, min(1.0, self.score)), 4)
        return 0.0

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            c = self.config
            self._client = httpx.AsyncClient(
                base_url=c.upstream.rstrip("/"),
                timeout=httpx.Timeout(connect=c.upstream_connect_timeout_s, read=c.upstream_read_timeout_s,
                                      write=30.0, pool=c.queue_timeout_s),
                # The background loop's calls only (health, metrics, models, warm-up and canary probes):
                # proxied requests use the proxy's own pool (serve/upstream.py).
                limits=httpx.Limits(max_connections=8, max_keepalive_connections=8),
                transport=self._transport,
                # Plain-http upstreams (the usual pod-local engine) need no CA bundle: loading one costs
                # a noticeable fraction of a second at start.
                verify=not c.upstream.startswith("http://"),
            )
        return self._client

    # ---- background loop -------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        if self.drain is not None and self.drain.task is not None:
            self.drain.task.cancel()
        if self._client is not None:
            await self._client.aclose()
        self.proxy_core.close()
        aclose = getattr(self.gpu_reader, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must survive anything one tick does
                log.exception("sidecar tick failed")
            await asyncio.sleep(self.config.probe_interval_s)

    async def tick(self) -> None:
        """One round of observation: engine health and metrics, GPU, engine log, state changes, canary."""
        self.proxy_core.pool.sweep()  # engine connections silent past the read timeout
        await self._poll_engine()
        now = self.clock.now()
        self._read_engine_log()
        verdict = await self._check_gpu(now)
        if verdict.ok is False and self.state in (State.WARMING, State.READY, State.DEGRADED, State.RECOVERING):
            self.start_drain(f"gpuz: {verdict.reason}", fault=True,
                             tier=Tier.NODE if verdict.fatal else Tier.POD)
        if self.state is State.READY and verdict.fb_used_mib is not None:
            self.fb_baseline_mib = verdict.fb_used_mib
        self._score_dwell(now)
        if self.state is State.RECOVERING:
            await self._canary_tick(now)
        self._raise_limit(now)

    async def _poll_engine(self) -> None:
        c = self.config
        now = self.clock.now()
        up = False
        # On the proxy's engine pool (raw HTTP/1.1): polling costs the sidecar about a millisecond of CPU a
        # second instead of several with httpx.
        fetch = self.proxy_core.fetch
        try:
            status, _, _ = await fetch(b"GET", b"/health", c.health_timeout_s)
            up = status == 200
        except UpstreamError:
            up = False
        if up and self.model is None:
            try:
                _, _, body = await fetch(b"GET", b"/v1/models", c.health_timeout_s)
                data = json.loads(body).get("data") or []
                if data:
                    self.model = str(data[0].get("id"))
                    mml = data[0].get("max_model_len")
                    self.model_max_len = int(mml) if isinstance(mml, int | float) else None
            except (UpstreamError, ValueError, AttributeError, TypeError, KeyError, IndexError):
                pass
        vals: dict[str, float] = {}
        if up:
            try:
                status, _, body = await fetch(b"GET", b"/metrics", c.health_timeout_s)
                if status == 200:
                    vals = engine_values(body.decode("utf-8", "replace"))
                    self.metrics_window.append({"ts": now, **vals, "proxy_in_flight": len(self.active),
                                                "proxy_queued": self.admission.queued})
            except UpstreamError:
                pass
        # Engine figures we could not read are unknown, not their last value: a stale "running" would
        # look like a hang, a stale token counter would hide one.
        self.engine = vals
        gen = vals.get("vllm:generation_tokens_total")
        if gen is None:
            self.progress.last_gen_tokens = None
        running = vals.get("vllm:num_requests_running", vals.get("sglang:num_running_reqs"))
        self.progress.observe_engine(now, running if running is not None else 0.0, gen)
        self._update_active(now)
        was_up = self.engine_up
        if up:
            self.engine_fail_streak = 0
            self.engine_down_since = None
            self.engine_up = True
            self.engine_ever_up = True
            if self.state is State.STARTING and self.model is not None:
                self._step(Event.ENGINE_UP, "engine answers and lists its model")
            if self.state is State.QUARANTINED and not was_up and self.quarantine_tier is not Tier.NODE:
                self._step(Event.WORKER_REBUILT, "engine came back after a pod-tier quarantine")
            if self.state is State.WARMING and not self._warming:
                self._warming = True
                asyncio.create_task(self._warmup())
        else:
            self.engine_fail_streak += 1
            if self.engine_down_since is None:
                self.engine_down_since = now
            if self.engine_fail_streak >= 2:
                if self.engine_up:
                    self.model = None  # a restarted engine may serve something else
                self.engine_up = False
                if self.state in (State.WARMING, State.READY, State.DEGRADED, State.RECOVERING):
                    self.had_fault = self.had_fault or self.state is not State.WARMING
                    self._step(Event.ENGINE_DOWN, "engine unreachable")

    async def _inference(self, timeout_s: float) -> tuple[bool, float | None, str]:
        """One tiny completion straight to the engine (warm-up and canary probes)."""
        body = {"model": self.model or "", "prompt": self.config.warmup_prompt,
                "max_tokens": self.config.warmup_max_tokens, "temperature": 0}
        t0 = self.clock.now()
        try:
            r = await self.client.post("/v1/completions", json=body, timeout=timeout_s)
        except httpx.HTTPError as e:
            return False, None, f"{type(e).__name__}: {e}"
        dt = self.clock.now() - t0
        if r.status_code != 200:
            self._inspect_error_text(r.text)
            return False, dt, f"HTTP {r.status_code}: {r.text[:200]}"
        self.progress.progress(self.clock.now())
        return True, dt, "ok"

    async def _warmup(self) -> None:
        try:
            ok, _, why = await self._inference(self.config.warmup_timeout_s)
            if self.state is not State.WARMING:
                return
            if ok:
                if self.had_fault:
                    self._step(Event.WARMED_AFTER_FAULT, "warm-up inference succeeded after a fault")
                else:
                    self._step(Event.WARMED, "warm-up inference succeeded")
            else:
                self._record_error("warmup", why)
                self._step(Event.WARMUP_FAILED, f"warm-up inference failed: {why}")
        finally:
            self._warming = False

    async def _check_gpu(self, now: float) -> GpuVerdict:
        errs = [e for t, e in self.cuda_errors if now - t <= self.config.cuda_error_window_s]
        fx = fatal_xids([x for t, x in self.recent_xids if now - t <= self.config.cuda_error_window_s],
                        self.config.oom)
        errs.extend(f"Xid {x}" for x in fx)
        try:
            snap = await self.gpu_reader.read(now) if self.gpu_reader is not None else None
            v = self.gpu.evaluate(snap, now, errs)
        except Exception as e:  # a broken check is unknown, and says why; it never reads as a tested GPU
            log.exception("GPU check failed")
            v = self.gpu.evaluate(None, now, errs)  # CUDA errors and Xids still count without the signals
            if v.ok is None:
                v = dataclasses.replace(v, reason=f"GPU check failed: {type(e).__name__}: {e}"[:300])
            self.gpu.last = v
        self.score = v.score
        return v

    def _read_engine_log(self) -> None:
        path = self.config.engine_log
        if path is None:
            return
        first = self._log_pos is None
        try:
            with open(path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                pos = self._log_pos or 0
                if size < pos:
                    pos = 0  # truncated or rotated
                f.seek(max(pos, size - 256 * 1024))
                data = f.read()
                self._log_pos = f.tell()
        except OSError:
            return
        for line in data.decode("utf-8", "replace").splitlines():
            self.engine_log_tail.append(line)
            # What was in the log before the sidecar started is history (a previous engine's errors, kept
            # by an append-only log): evidence, not a reason to drain the engine running now.
            if not first:
                self._inspect_error_text(line, from_log=True)

    def _inspect_error_text(self, text: str, from_log: bool = False) -> None:
        now = self.clock.now()
        ctx = context_errors_in(text)
        if ctx or (not from_log and "cuda error" in text.lower() and not is_oom_text(text)):
            self.cuda_errors.append((now, text.strip()[:500]))
        for x in xids_in(text) if ("xid" in text.lower()) else []:
            self.recent_xids.append((now, x))

    def _score_dwell(self, now: float) -> None:
        lc = self.config.policy.lifecycle
        s = self.score
        if s is None:
            self._below_since = self._above_since = None
            return
        if s < lc.degraded_below:
            self._below_since = self._below_since if self._below_since is not None else now
            self._above_since = None
        elif s >= lc.ready_above:
            self._above_since = self._above_since if self._above_since is not None else now
            self._below_since = None
        else:
            self._below_since = self._above_since = None
        if self.state is State.READY and self._below_since is not None and now - self._below_since >= lc.degraded_dwell_s:
            self._step(Event.DEGRADE, f"score {s:.2f} below {lc.degraded_below} for {lc.degraded_dwell_s:g}s")
        if self.state is State.DEGRADED and self._above_since is not None and now - self._above_since >= lc.ready_dwell_s:
            self._step(Event.RECOVER, f"score {s:.2f} at or above {lc.ready_above} for {lc.ready_dwell_s:g}s")

    def _raise_limit(self, now: float) -> None:
        c = self.config
        if self.admission.limit >= c.max_concurrency:
            self.last_limit_raise = now
            return
        quiet_since = max(self.last_oom_at or 0.0, self.last_limit_raise)
        if now - quiet_since >= c.concurrency_recover_s:
            self.admission.set_limit(self.admission.limit + 1)
            self.last_limit_raise = now

    # ---- canary ----------------------------------------------------------------------------------

    async def _canary_tick(self, now: float) -> None:
        assert self.canary is not None
        cs = self.canary_stats
        needs_probe = self.canary.ramp_started_at is None or cs["requests"] < self.config.canary.min_requests
        if needs_probe and not self._probe_inflight:
            self._probe_inflight = True
            try:
                ok, dt, why = await self._inference(self.config.canary.probe_timeout_s)
            finally:
                self._probe_inflight = False
            if self.state is not State.RECOVERING:
                return
            if ok:
                cs["probe_ok"] += 1
                if self.canary.ramp_started_at is not None:
                    cs["requests"] += 1
                    if dt is not None:
                        cs["ttft_sum"] += dt
                        cs["ttft_n"] += 1
            elif self.canary.ramp_started_at is not None:  # during the ramp a failed probe is a failed request
                cs["requests"] += 1
                cs["errors"] += 1
                self._record_error("canary_probe", why)
            else:
                cs["probe_fail"] += 1
                self._record_error("canary_probe", why)
        now = self.clock.now()
        obs = Observation(
            requests=int(cs["requests"]), errors=int(cs["errors"]), probe_successes=int(cs["probe_ok"]),
            probe_failures=int(cs["probe_fail"]),
            mean_ttft_s=cs["ttft_sum"] / cs["ttft_n"] if cs["ttft_n"] else None,
            mean_itl_s=cs["itl_sum"] / cs["itl_n"] if cs["itl_n"] else None,
            gpu_ok=self.gpu.last.ok, memory_released=self._memory_released(),
        )
        d = self.canary.step(obs, now)
        self._canary_weight = d.weight
        if d.verdict is Verdict.PASS:
            self._step(Event.CANARY_PASSED, f"canary passed: {d.reason}")
        elif d.verdict is Verdict.FAIL:
            self.canary_failures.append(now)
            n = recent_failures(self.canary_failures, now, self.config.canary.failure_window_s)
            if n >= self.config.canary.max_failures:
                self._step(Event.CANARY_FAILED_REPEATEDLY,
                           f"canary failed {n} times within {self.config.canary.failure_window_s:g}s: {d.reason}")
                self._record_intent(Intent(now, IntentKind.PAGE, self.config.replica,
                                           f"replica FAILED after {n} canary failures: {d.reason}", {},
                                           Tier.POD, policy_version=self.lifecycle.policy_version))
            else:
                self._step(Event.CANARY_FAILED, f"canary failed: {d.reason}")
            self._canary_weight = 0.0

    def _memory_released(self) -> bool | None:
        """After a rebuild, GPU memory in use must come back to the healthy level (a leaked or zombie
        allocation shows as more). Unknown without GPU memory readings or a healthy baseline."""
        used, base = self.gpu.last.fb_used_mib, self.fb_baseline_mib
        if used is None or base is None or base <= 0:
            return None
        return used <= base * (1.0 + self.config.canary.memory_tolerance)

    def _canary_observe(self, rec: RequestRecord, ok: bool) -> None:
        if not rec.canary or self.state is not State.RECOVERING:
            return
        cs = self.canary_stats
        cs["requests"] += 1
        if not ok:
            cs["errors"] += 1
        if rec.stream and rec.first_at is not None and rec.sent_at is not None:  # non-streams have no TTFT
            cs["ttft_sum"] += rec.first_at - rec.sent_at
            cs["ttft_n"] += 1
        if rec.chunks > 1:
            cs["itl_sum"] += rec.itl_sum / (rec.chunks - 1)
            cs["itl_n"] += 1

    # ---- drain -----------------------------------------------------------------------------------

    def start_drain(self, reason: str, fault: bool, tier: Tier | None = None) -> DrainProgress | None:
        now = self.clock.now()
        if fault:
            self.had_fault = True
            self.quarantine_tier = tier if self.quarantine_tier is None else self.quarantine_tier
            if tier is Tier.NODE:
                self.quarantine_tier = Tier.NODE
        if self.drain is not None and self.drain.finished is None:
            self.drain.fault = self.drain.fault or fault
            return self.drain
        t = self._step(Event.FAULT if fault else Event.ADMIN_DRAIN, reason)
        if t is None and self.state is not State.DRAINING:
            return None
        if t is None and self.drain is not None:
            # Already drained (admin); a fault now upgrades it.
            if fault and not self.drain.fault:
                self.drain.fault = True
                self._step(Event.DRAINED_AFTER_FAULT, reason)
            return self.drain
        d = DrainProgress(started=now, deadline=now + self.config.max_drain_seconds, reason=reason, fault=fault,
                          tier=tier)
        d.at_start = {"queued": self.admission.queued,
                      "sent": sum(1 for r in self.active if r.phase is Phase.SENT),
                      "decoding": sum(1 for r in self.active if r.phase is Phase.DECODING)}
        self.drain = d
        d.outcomes["rejected_queued"] += self.admission.reject_waiting("replica is draining")
        for r in list(self.active):
            if r.phase is Phase.SENT and r.stream:
                r.abort("replica is draining")
        d.task = asyncio.create_task(self._drain_watch(d))
        if fault:
            self._record_intent(Intent(now, IntentKind.DRAIN, self.config.replica, reason, {"fault": True}, tier,
                                       policy_version=self.lifecycle.policy_version))
        return d

    async def _drain_watch(self, d: DrainProgress) -> None:
        while self.active and self.clock.now() < d.deadline:
            await asyncio.sleep(0.02)
        for r in list(self.active):
            r.abort(f"drain deadline ({self.config.max_drain_seconds:g}s) reached")
        # A stream ends at once (its final event is queued on the client's connection, which a client that
        # stopped reading does not keep: the front closes it); a request still waiting on the engine ends
        # when its forwarder wakes up. Give those a moment, in real time even under an injected clock.
        loop = asyncio.get_running_loop()
        grace_end = loop.time() + 1.0
        while self.active and loop.time() < grace_end:
            await asyncio.sleep(0.01)
        d.finished = self.clock.now()
        self.drain_history.append(d.to_dict(d.finished, len(self.active)))
        d.evidence_path = self.write_evidence(d)
        if d.fault and self.state is State.DRAINING:
            self._step(Event.DRAINED_AFTER_FAULT, f"drained after fault: {d.reason}")
            kind = "QUARANTINE" if d.tier is Tier.NODE else "REBUILD_WORKER"
            self._record_intent(Intent(d.finished, IntentKind[kind], self.config.replica, d.reason,
                                       {"evidence": d.evidence_path}, d.tier or Tier.POD,
                                       policy_version=self.lifecycle.policy_version))

    def undrain(self) -> Transition | None:
        d = self.drain
        if d is not None and d.task is not None and not d.task.done():
            d.task.cancel()
        if d is not None and d.finished is None:
            d.finished = self.clock.now()
        clean = self.state is State.DRAINING and not self.had_fault and (d is None or not d.fault)
        t = self._step(Event.UNDRAIN_CLEAN if clean else Event.UNDRAIN, "admin undrain")
        if t is not None:
            self.drain = None
        return t

    async def wait_drained(self, timeout_s: float) -> None:
        d = self.drain
        if d is None or d.task is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(d.task), timeout_s)

    # ---- evidence --------------------------------------------------------------------------------

    def evidence(self, d: DrainProgress | None = None) -> dict[str, Any]:
        now = self.clock.now()
        return {
            "replica": self.config.replica, "ts": now, "state": str(self.state),
            "policy_version": self.lifecycle.policy_version, "model": self.model,
            "drain": None if d is None else d.to_dict(now, len(self.active)),
            "transitions": [t.to_dict() for t in self.transitions],
            "intents": [i.to_dict() for i in self.intents],
            "last_errors": list(self.last_errors),
            "cuda_errors": [{"ts": t, "text": e} for t, e in self.cuda_errors],
            "ooms": list(self.oom_events),
            "gpu": self.gpu.last.to_dict(),
            "metrics_window": list(self.metrics_window),
            "request_samples": [r.sample() for r in self.samples] + [r.sample() for r in self.active],
            "prompts_redacted": self.config.redact_prompts,
            "engine_log_tail": list(self.engine_log_tail),
        }

    def write_evidence(self, d: DrainProgress | None) -> str | None:
        bundle = self.evidence(d)
        self.evidence_last = bundle
        if self.config.evidence_dir is None:
            return None
        try:
            self.config.evidence_dir.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", self.config.replica)
            path = Path(self.config.evidence_dir) / f"evidence-{safe}-{int(bundle['ts'] * 1000)}.json"
            path.write_text(json.dumps(bundle, indent=1, default=str))
            return str(path)
        except OSError as e:
            self._record_error("evidence", f"cannot write evidence: {e}")
            return None

    # ---- bookkeeping -----------------------------------------------------------------------------

    def _record_error(self, where: str, text: str) -> None:
        self.last_errors.append({"ts": self.clock.now(), "where": where, "error": text[:500]})

    def _record_intent(self, intent: Intent) -> None:
        self.intents.append(intent)

    def _finish(self, rec: RequestRecord, outcome: str, status: int, error: bool) -> None:
        if rec.released:
            return
        rec.released = True
        rec.outcome = outcome
        rec.status = status
        if rec.phase is Phase.SENT or rec.phase is Phase.DECODING:
            self._busy(rec, -1, self.clock.now())
        rec.phase = Phase.DONE
        if rec.sent_at is not None:
            self.admission.release()
        self.active.discard(rec)
        self.outcomes[outcome] += 1
        self.requests_total += 1
        if error:
            self.errors_total += 1
        if self.drain is not None and self.drain.finished is None:
            self.drain.outcomes[outcome] += 1
        self._canary_observe(rec, not error)
        self.samples.append(rec)

    def _busy(self, rec: RequestRecord, delta: int, now: float) -> None:
        """A request reached the engine (+1, SENT) or ended (-1): counted, not searched for, per request."""
        if rec.stream:
            self._busy_streams += delta
        else:
            self._busy_whole += delta
        self._update_active(now)

    def _update_active(self, now: float) -> None:
        # A long non-streaming request shows no chunk until it ends: when the engine exports a token
        # counter its progress comes from there, and only streams count as proxy-visible work. Without a
        # counter, a non-streaming request running past the timeout is the only sign of a hang left.
        counted = self.progress.last_gen_tokens is None
        self.progress.set_proxy_active(self._busy_streams + (self._busy_whole if counted else 0), now)

    def _unavailable(self, message: str, code: str = "replica_unavailable") -> Answer:
        """503 + Retry-After: the gateway retries the request on another replica."""
        self.outcomes[f"rejected_{code}"] += 1
        return json_answer(503, error_json(message, "service_unavailable", code),
                           [(b"retry-after", str(self.config.retry_after_s).encode())])

    # ---- the proxy (the FastAPI routes' way in; the lean front calls self.proxy_core directly) ------

    async def proxy(self, request: Request, path: str) -> Response:
        from fleethealth.serve.front import asgi_proxy

        return await asgi_proxy(self, request, "/" + path, inference=True)

    async def passthrough(self, request: Request, path: str) -> Response:
        """Non-inference endpoints (e.g. /v1/models): forwarded without admission."""
        from fleethealth.serve.front import asgi_proxy

        return await asgi_proxy(self, request, "/" + path, inference=False)

    # ---- probes ----------------------------------------------------------------------------------

    def livez(self) -> tuple[bool, dict[str, Any]]:
        now = self.clock.now()
        stalled = self.progress.stalled_for(now)
        reasons = []
        if stalled > self.config.liveness_timeout_s:
            reasons.append(f"engine made no progress for {stalled:.1f}s with work running")
        if self.engine_ever_up and self.engine_down_since is not None \
                and now - self.engine_down_since > self.config.engine_down_grace_s:
            reasons.append(f"engine unreachable for {now - self.engine_down_since:.0f}s")
        return not reasons, {"alive": not reasons, "state": str(self.state), "stalled_s": round(stalled, 3),
                             "in_flight": len(self.active), "engine_running": self.engine.get(
                                 "vllm:num_requests_running"), "reasons": reasons}

    def readyz(self) -> tuple[bool, dict[str, Any]]:
        st = self.state
        c = self.config
        reasons = []
        if not admits(st):
            reasons.append(f"state is {st}")
        if st is State.RECOVERING and self._canary_weight <= 0:
            reasons.append("canary has not admitted traffic yet")
        if self.admission.queued >= c.ready_queue_limit:
            reasons.append(f"{self.admission.queued} requests queued (protection level {c.ready_queue_limit})")
        waiting = self.engine.get("vllm:num_requests_waiting", self.engine.get("sglang:num_queue_reqs"))
        if waiting is not None and waiting >= c.ready_engine_waiting_limit:
            reasons.append(f"engine has {waiting:g} requests waiting (protection level {c.ready_engine_waiting_limit:g})")
        if self.gpu.last.ok is False:
            reasons.append(f"gpuz: {self.gpu.last.reason}")
        if not self.engine_up:
            reasons.append("engine not reachable")
        return not reasons, {"ready": not reasons, "state": str(st), "weight": self.weight(), "reasons": reasons}

    def gpuz(self) -> tuple[bool, dict[str, Any]]:
        v = self.gpu.last
        return v.ok is not False, {"trusted": v.ok, **v.to_dict()}

    def state_dict(self) -> dict[str, Any]:
        now = self.clock.now()
        return {
            "replica": self.config.replica, "state": str(self.state), "since": self.lifecycle.since,
            "weight": self.weight(), "score": self.score, "model": self.model,
            "engine_up": self.engine_up, "in_flight": len([r for r in self.active if r.phase is not Phase.QUEUED]),
            "queued": self.admission.queued, "concurrency_limit": self.admission.limit,
            "oversize_limit_tokens": self.oversize_limit_tokens,
            "drain": None if self.drain is None else self.drain.to_dict(now, len(self.active)),
            "canary": None if self.canary is None or self.state is not State.RECOVERING else {
                "weight": self._canary_weight, "stats": dict(self.canary_stats),
                "ramp_started_at": self.canary.ramp_started_at},
            "canary_failures": len(self.canary_failures),
            "gpu": self.gpu.last.to_dict(), "ooms": dict(self.ooms), "outcomes": dict(self.outcomes),
            "oom_events": list(self.oom_events)[-10:],
            "transitions": [t.to_dict() for t in list(self.transitions)[-20:]],
            "intents": [i.to_dict() for i in list(self.intents)[-20:]],
            "last_errors": list(self.last_errors)[-10:],
        }



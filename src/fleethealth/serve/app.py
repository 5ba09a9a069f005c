"""The sidecar's HTTP surface: probes, admin, metrics and the OpenAI-compatible proxy.

``create_app(config, clock=...)`` builds a FastAPI app; the lifespan starts the background loop. Tests
run it in-process on a real loopback port. /docs, /redoc and /openapi.json are served only with
``config.docs`` (``--docs``); request bodies over ``config.max_body_bytes`` are 413 before they are read
(Content-Length) or as soon as a chunked body crosses the limit (fleethealth.auth.http.BodyLimit, outside
the proxy's own code).

Admin endpoints (serve.admin_security): state-changing ones (``POST /admin/drain``, ``/admin/undrain``)
need ``Authorization: Bearer <token>``, checked by the same ``auth`` module as the controller's API: the
static admin token (a file or FLEETHEALTH_ADMIN_TOKEN), a token file, or the cluster (TokenReview, then
SubjectAccessReview on the verb ``drain``/``undrain`` of ``replicas/<replica>`` in ``fleethealth.io``);
401/403/503 with one line, and every action audited (JSON Lines file, Kubernetes Event on the Pod) before
it is done. Reads (``/admin/state``, ``/admin/evidence``) are open to loopback clients by default
(``admin_read``). By default the admin endpoints also answer only a loopback client address: the pod's
preStop hook calls them on localhost, while the gateway and other pods reach only the proxy and probes.
The check is on the TCP peer address (uvicorn's proxy-headers handling is turned off by the CLI, so an
X-Forwarded-For header cannot fake a loopback client). ``admin_loopback_only=False`` opens them to the
network, where the token and its permission still decide. Auth and audit do blocking I/O (the API
server, fsync), so they run in a worker thread, never on the event loop that relays tokens.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fleethealth.auth.access import Denied, Principal, entity_problem, is_loopback
from fleethealth.auth.audit import AuditFailed
from fleethealth.auth.http import BodyLimit
from fleethealth.decide.model import State
from fleethealth.serve.admin_security import build_admin_security
from fleethealth.serve.config import Clock, SidecarConfig
from fleethealth.serve.gpu import ExporterGpuReader, GpuReader, NvmlGpuReader, nvml_present
from fleethealth.serve.sidecar import Phase, Sidecar

log = logging.getLogger("fleethealth.sidecar.admin")
CONTENT_TYPE_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


_is_loopback = is_loopback


class SidecarCollector(Collector):
    """Reads the sidecar's state at scrape time (no gauges to keep in sync)."""

    def __init__(self, sc: Sidecar) -> None:
        self.sc = sc

    def collect(self) -> Iterable[Any]:
        sc = self.sc
        rep = sc.config.replica
        now = sc.clock.now()
        st = GaugeMetricFamily("fleethealth_sidecar_state", "1 for the replica's current lifecycle state",
                               labels=["replica", "state"])
        for s in State:
            st.add_metric([rep, str(s)], 1.0 if sc.state is s else 0.0)
        yield st

        def gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["replica"])
            g.add_metric([rep], float("nan") if value is None else float(value))
            return g

        yield gauge("fleethealth_sidecar_score", "GPU health score used by the sidecar (NaN: unknown)", sc.score)
        yield gauge("fleethealth_sidecar_weight", "routing weight the replica publishes (0..1)", sc.weight())
        yield gauge("fleethealth_sidecar_in_flight", "requests forwarded to the engine and not finished",
                    sum(1 for r in sc.active if r.phase in (Phase.SENT, Phase.DECODING)))
        yield gauge("fleethealth_sidecar_decoding", "streams that have produced their first token",
                    sum(1 for r in sc.active if r.phase is Phase.DECODING))
        yield gauge("fleethealth_sidecar_queued", "requests waiting in the proxy's admission queue",
                    sc.admission.queued)
        yield gauge("fleethealth_sidecar_concurrency_limit", "current admission limit (lowered by OOMs)",
                    sc.admission.limit)
        yield gauge("fleethealth_sidecar_engine_waiting", "engine-reported waiting requests",
                    sc.engine.get("vllm:num_requests_waiting"))
        yield gauge("fleethealth_sidecar_engine_up", "engine answers /health", 1.0 if sc.engine_up else 0.0)
        yield gauge("fleethealth_sidecar_stalled_seconds", "seconds of running work without a token",
                    sc.progress.stalled_for(now))
        d = sc.drain
        active = d is not None and d.finished is None
        yield gauge("fleethealth_sidecar_draining", "1 while a drain is in progress", 1.0 if active else 0.0)
        yield gauge("fleethealth_sidecar_drain_remaining", "requests still running in the current drain",
                    len(sc.active) if active else 0)
        yield gauge("fleethealth_sidecar_drain_elapsed_seconds", "seconds since the drain started",
                    None if d is None else (d.finished or now) - d.started)
        yield gauge("fleethealth_sidecar_drain_deadline_seconds", "seconds left before in-flight streams are cut",
                    None if not active or d is None else max(0.0, d.deadline - now))
        oom = CounterMetricFamily("fleethealth_sidecar_ooms", "CUDA OOMs seen in engine responses, by class",
                                  labels=["replica", "class"])
        for cls in ("oversized_request", "batch_overload", "fragmentation", "device_fault"):
            oom.add_metric([rep, cls], float(sc.ooms.get(cls, 0)))
        yield oom
        out = CounterMetricFamily("fleethealth_sidecar_requests", "requests by outcome", labels=["replica", "outcome"])
        for k, v in sorted(sc.outcomes.items()):
            out.add_metric([rep, k], float(v))
        yield out
        tr = CounterMetricFamily("fleethealth_sidecar_transitions", "lifecycle transitions (flapping shows here)",
                                 labels=["replica"])
        tr.add_metric([rep], float(len(sc.transitions)))
        yield tr
        # The names the default policy's error_slo signal reads, so the scorer can rate this replica.
        req = CounterMetricFamily("fleethealth_replica_requests", "requests proxied", labels=["replica"])
        req.add_metric([rep], float(sc.requests_total))
        yield req
        err = CounterMetricFamily("fleethealth_replica_errors", "requests that failed on the replica's side",
                                  labels=["replica"])
        err.add_metric([rep], float(sc.errors_total))
        yield err


class AdminCollector(Collector):
    """Admin calls refused, by status (401 no valid token, 403 no permission or not loopback, 503 could
    not check or audit)."""

    def __init__(self, replica: str, refused: dict[int, int]) -> None:
        self.replica = replica
        self.refused = refused

    def collect(self) -> Iterable[Any]:
        c = CounterMetricFamily("fleethealth_sidecar_admin_refused", "admin calls refused, by HTTP status",
                                labels=["replica", "code"])
        for code in (401, 403, 503):
            c.add_metric([self.replica, str(code)], float(self.refused.get(code, 0)))
        yield c


def create_app(config: SidecarConfig, clock: Clock | Callable[[], float] | None = None, gpu_reader: GpuReader | None = None,
               transport: httpx.AsyncBaseTransport | None = None, kube_api: Any = None) -> FastAPI:
    """``kube_api``: a KubeApi for admin auth and audit Events instead of one made from the config (tests).
    Raises TokenFileError / AuditLogError / ValueError (one line) for an unusable admin setup."""
    if gpu_reader is None and config.gpu_metrics_url:
        gpu_reader = ExporterGpuReader(config.gpu_metrics_url, node=config.gpu_node)
    elif gpu_reader is None and (config.use_nvml or (config.use_nvml is None and nvml_present())):
        gpu_reader = NvmlGpuReader(config.gpu_node or config.replica)
    security = build_admin_security(config, kube_api)
    guard, auditor = security.guard, security.auditor
    refused: dict[int, int] = {}
    sc = Sidecar(config, clock=clock, gpu_reader=gpu_reader, transport=transport)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(sc))
    registry.register(AdminCollector(config.replica, refused))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await sc.start()
        try:
            yield
        finally:
            await sc.stop()

    app = FastAPI(
        title="fleethealth sidecar",
        version="1",
        description="Health truth for one inference replica: probes, drain, OOM handling, canary recovery, "
        "and a proxy of the OpenAI-compatible API.",
        lifespan=lifespan,
        docs_url="/docs" if config.docs else None,
        redoc_url="/redoc" if config.docs else None,
        openapi_url="/openapi.json" if config.docs else None,
    )
    app.state.sidecar = sc

    def probe(result: tuple[bool, dict[str, Any]]) -> JSONResponse:
        ok, body = result
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/livez", tags=["probes"], summary="Alive and the engine is making progress")
    async def livez() -> JSONResponse:
        return probe(sc.livez())

    @app.get("/readyz", tags=["probes"], summary="May this replica take new requests now")
    async def readyz() -> JSONResponse:
        return probe(sc.readyz())

    @app.get("/gpuz", tags=["probes"], summary="Can the GPU be trusted (unknown passes)")
    async def gpuz() -> JSONResponse:
        return probe(sc.gpuz())

    @app.get("/metrics", tags=["probes"], summary="Prometheus metrics (classic text format)")
    async def metrics() -> Response:
        # Classic text format 0.0.4 (what every Prometheus parses; prometheus-client's "latest" is 1.0.0).
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_0_0_4)

    target = f"replica/{config.replica}"

    def peer(request: Request) -> str:
        c = request.client
        return "unknown" if c is None else f"{c.host}:{c.port}"

    refused_lock = threading.Lock()  # counted from worker threads

    def refuse(status: int, reason: str) -> HTTPException:
        with refused_lock:
            refused[status] = refused.get(status, 0) + 1
        return HTTPException(status, reason, headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)

    def network_gate(request: Request) -> None:
        if config.admin_loopback_only and not _is_loopback(request.client.host if request.client else None):
            raise refuse(403, "admin endpoints answer loopback clients only (--admin-allow-remote opens them)")

    async def admin_read(request: Request) -> None:
        network_gate(request)
        try:
            await asyncio.to_thread(guard.check, request.headers.get("authorization"),
                                    request.client.host if request.client else None, "get", "replicas",
                                    config.replica)
        except Denied as e:
            raise refuse(e.status, e.reason) from None

    def authorise_and_audit(request: Request, verb: str, detail: dict[str, Any]) -> Principal:
        """Runs in a worker thread: TokenReview/SubjectAccessReview and the audit write may block."""
        try:
            who = guard.authenticate(request.headers.get("authorization"))
        except Denied as e:
            raise refuse(e.status, e.reason) from None
        try:
            guard.authorize(who, verb, "replicas", config.replica)
        except Denied as e:
            if e.status == 403:
                auditor.record(who, verb, target, peer(request), False, {**detail, "refused": e.reason})
            raise refuse(e.status, e.reason) from None
        try:
            auditor.record(who, verb, target, peer(request), True, detail)
        except AuditFailed as e:
            raise refuse(503, f"{e}; nothing was done") from None
        return who

    async def admin_act(request: Request, verb: str, detail: dict[str, Any]) -> Principal:
        network_gate(request)
        return await asyncio.to_thread(authorise_and_audit, request, verb, detail)

    @app.post("/admin/drain", tags=["admin"], summary="Stop admitting; finish decoding requests; 503 the rest")
    async def admin_drain(request: Request, wait: bool = Query(False, description="block until drained"),
                          reason: str = Query("admin drain")) -> JSONResponse:
        if (why := entity_problem(reason)) is not None:
            raise HTTPException(400, why.replace("entity", "reason", 1))
        who = await admin_act(request, "drain", {"reason": reason, "wait": wait})
        log.info("admin drain by %s from %s: %s", who.user, peer(request), reason)
        sc.start_drain(reason, fault=False)
        if wait:
            await sc.wait_drained(config.max_drain_seconds + 5)
        return JSONResponse(sc.state_dict(), status_code=202 if not wait else 200)

    @app.post("/admin/undrain", tags=["admin"], summary="Admit again (through the canary after a fault)")
    async def admin_undrain(request: Request) -> JSONResponse:
        who = await admin_act(request, "undrain", {})
        log.info("admin undrain by %s from %s", who.user, peer(request))
        sc.undrain()
        return JSONResponse(sc.state_dict())

    @app.get("/admin/state", tags=["admin"], summary="State, drain progress, canary, intents, errors")
    async def admin_state(request: Request) -> JSONResponse:
        await admin_read(request)
        return JSONResponse(sc.state_dict())

    @app.get("/admin/evidence", tags=["admin"], summary="The last evidence bundle (or a fresh one)")
    async def admin_evidence(request: Request) -> JSONResponse:
        await admin_read(request)
        return JSONResponse(sc.evidence_last or sc.evidence(sc.drain))

    @app.post("/v1/completions", tags=["proxy"])
    async def completions(request: Request) -> Response:
        return await sc.proxy(request, "v1/completions")

    @app.post("/v1/chat/completions", tags=["proxy"])
    async def chat_completions(request: Request) -> Response:
        return await sc.proxy(request, "v1/chat/completions")

    @app.get("/v1/models", tags=["proxy"])
    async def models(request: Request) -> Response:
        return await sc.passthrough(request, "v1/models")

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, hint=" (--max-body-bytes of the sidecar)")
    return app

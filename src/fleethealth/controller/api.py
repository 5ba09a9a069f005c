"""The controller's HTTP endpoint: /metrics for Prometheus, /healthz, and a JSON API for routers,
schedulers and people.

It only reads ``Controller.published`` (an immutable record swapped once per cycle), so requests never
block the loop and always see one consistent cycle. The two write endpoints (events, kill switch) hand
their input to the loop or to the actuation runner; they never change state directly.

Access (fleethealth.auth.access has the verbs): every POST needs a bearer token, checked by the token
file or a Kubernetes TokenReview, and a permission (a SubjectAccessReview on group ``fleethealth.io``, or
the token file's verbs): 401 without a valid token, 403 without the permission, each with a one-line
reason. Every allowed action, and every refused one of an authenticated caller, is audited (store and
Kubernetes Event) before it is handed on; the event's ``actor`` is the authenticated user, never the
body's. Reads follow ``api.read`` (default: open to loopback clients only), /metrics ``api.metrics``,
/healthz is always open. Bodies over ``api.max_body_bytes`` are 413; entity names with control
characters are 400; /docs and /openapi.json exist only with ``api.docs``; /api/v1/status is redacted.

JSON API
- GET  /api/v1/health[?kind=node&entity=X&node=N&details=1]  health tuples of the last cycle (node=N: N's GPUs)
- GET  /api/v1/states[?kind=node]                      lifecycle per node/replica
- GET  /api/v1/intents[?since=TS&until=TS&entity=X&limit=N]      recent intents (from the state store)
- GET  /api/v1/transitions[?since=TS&until=TS&entity=X&limit=N]  recent transitions (from the state store)
- GET  /api/v1/weights                                 router weights (the decisions' last SET_WEIGHT)
- GET  /api/v1/status                                  cycle timing, sources, actuation mode
- GET  /api/v1/audit[?since=TS]                        operator actions (who, what, when, from where)
- POST /api/v1/events                                  {"kind": "ack"|"active_test"|"reset"|"handover", "entity": ..}
- POST /api/v1/kill, /api/v1/resume                    the actuation kill switch
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from fleethealth.agent.exposition import escape_label_value
from fleethealth.auth.access import Denied, Guard, Principal, entity_problem, entity_resource, event_verb
from fleethealth.auth.audit import AuditFailed, Auditor
from fleethealth.auth.http import BodyLimit
from fleethealth.auth.redact import redact_value
from fleethealth.controller.config import ApiConfig
from fleethealth.controller.loop import Controller, Published
from fleethealth.controller.view import recent_history
from fleethealth.decide.safety import version_hold_summary
from fleethealth.decide.state import Event
from fleethealth.score.health import ENTITY_KINDS

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _labels(d: dict[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in d.items() if v is not None) + "}"


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Metrics:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples: Iterable[tuple[dict[str, Any], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels) if labels else ''} {_num(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _budget_left(pub: Published, controller: Controller, hard: bool,
                 physical: bool = False) -> dict[tuple[str, str], float]:
    """Quarantines still allowed per (kind, pool) in the current budget window, counted the way the
    decider counts them: distinct entities under the ledger key ``decide.decider.budget_key`` gives (pool
    label default "default"); confirmed hard gates (``hard``) have their own, larger budget."""
    from fleethealth.decide.decider import budget_key

    b = controller.policy.budgets
    sizes: dict[tuple[str, str], int] = {}
    for es in pub.state.entities.values():
        key = (es.kind, es.labels.get("pool", "default"))
        sizes[key] = sizes.get(key, 0) + 1
    spent: dict[str, set[str]] = {}
    for ts, ledger_key, entity in pub.state.ledger:
        if pub.ts - ts < b.window_s:
            spent.setdefault(ledger_key, set()).add(entity)
    lo, frac = ((b.physical_min_per_hour, b.physical_fraction_per_hour) if physical
                else (b.hard_gate_min_per_hour, b.hard_gate_fraction_per_hour) if hard
                else (b.quarantine_min_per_hour, b.quarantine_fraction_per_hour))
    return {(kind, pool): float(max(0, max(lo, math.floor(frac * n))
                                    - len(spent.get(budget_key(kind, pool, hard, physical), ()))))
            for (kind, pool), n in sorted(sizes.items())}


def budget_remaining(pub: Published, controller: Controller) -> dict[tuple[str, str], float]:
    """The rate budget left per (kind, pool)."""
    return _budget_left(pub, controller, hard=False)


def hard_gate_budget_remaining(pub: Published, controller: Controller) -> dict[tuple[str, str], float]:
    """The confirmed hard gates' budget left per (kind, pool)."""
    return _budget_left(pub, controller, hard=True)


def physical_budget_remaining(pub: Published, controller: Controller) -> dict[tuple[str, str], float]:
    """The budget of physical evidence (a GPU off the bus, a DBE, a failed remap) left per (kind, pool)."""
    return _budget_left(pub, controller, hard=True, physical=True)


def render_metrics(controller: Controller, runner: Any = None) -> str:
    pub = controller.published
    m = _Metrics()
    c = pub.counters
    m.family("fleethealth_cycles_total", "counter", "Reconcile cycles completed.", [({}, c.get("cycles_total", 0))])
    m.family("fleethealth_cycle_overruns_total", "counter", "Cycles that took longer than the interval.",
             [({}, c.get("overruns_total", 0))])
    m.family("fleethealth_cycle_skipped_ticks_total", "counter", "Ticks skipped after overruns (never stacked).",
             [({}, c.get("skipped_ticks_total", 0))])
    m.family("fleethealth_cycle_duration_seconds", "gauge", "Duration of the last cycle.",
             [({}, c.get("last_cycle_s", 0.0))])
    m.family("fleethealth_cycle_seconds_total", "counter", "Time spent in cycles.",
             [({}, c.get("cycle_seconds_sum", 0.0))])
    m.family("fleethealth_cycle_interval_seconds", "gauge", "Configured interval.", [({}, c.get("interval_s", 0.0))])
    if pub.report is not None:
        m.family("fleethealth_cycle_stage_seconds", "gauge", "Duration of each stage of the last cycle.",
                 [({"stage": k}, v) for k, v in pub.report.stage_s.items()])
        m.family("fleethealth_cycle_stage_cpu_seconds", "gauge", "CPU time of each stage of the last cycle.",
                 [({"stage": k}, v) for k, v in pub.report.stage_cpu_s.items()])
    m.family("fleethealth_last_cycle_timestamp_seconds", "gauge", "When the last cycle ran (its clock).",
             [({}, pub.ts)])

    src = pub.sources
    m.family("fleethealth_source_up", "gauge", "1 if the source's last read had no error.",
             [({"source": s["name"]}, 1.0 if s["up"] else 0.0) for s in src])
    m.family("fleethealth_source_last_success_timestamp_seconds", "gauge", "Last read without error.",
             [({"source": s["name"]}, s["last_success"]) for s in src if s["last_success"] is not None])
    m.family("fleethealth_source_age_seconds", "gauge", "Seconds since the last read without error.",
             [({"source": s["name"]}, s["age_s"]) for s in src if s["age_s"] is not None])
    m.family("fleethealth_source_partial", "gauge", "1 if the last read returned data but some endpoints failed.",
             [({"source": s["name"]}, 1.0 if s["partial"] else 0.0) for s in src])
    m.family("fleethealth_source_last_errors", "gauge", "Errors (endpoints, queries, files) in the last read.",
             [({"source": s["name"]}, s["last_errors"]) for s in src])
    m.family("fleethealth_source_errors_total", "counter", "Reads that reported an error.",
             [({"source": s["name"]}, s["errors_total"]) for s in src])
    m.family("fleethealth_source_read_seconds", "gauge", "Duration of the last read.",
             [({"source": s["name"]}, s["last_read_s"]) for s in src])
    m.family("fleethealth_source_samples", "gauge", "Samples in the last read.",
             [({"source": s["name"]}, s["last_samples"]) for s in src])

    m.family("fleethealth_scrape_targets_down", "gauge", "Exporter targets whose last scrape failed (up == 0).",
             [({}, c.get("targets_down", 0))])
    m.family("fleethealth_scrape_slowest_seconds", "gauge", "Slowest target scrape in the last cycle.",
             [({}, c.get("slowest_scrape_s", 0.0))])
    m.family("fleethealth_absence_held", "gauge", "Absence signals (GPUs missing, series vanished) not raised "
             "last cycle because a source could not read the metrics they rest on.",
             [({}, c.get("absence_held", 0))])

    health = pub.health
    if health is not None:
        value_rows: list[tuple[dict[str, Any], float]] = []
        conf_rows: list[tuple[dict[str, Any], float]] = []
        known_rows: list[tuple[dict[str, Any], float]] = []
        cat_rows: list[tuple[dict[str, Any], float]] = []
        for kind, ks in health.kinds.items():
            for i, name in enumerate(ks.names):
                v = float(ks.value[i])
                base = {"entity": name, "kind": kind}
                w = int(ks.worst[i])
                known_rows.append((base, 0.0 if math.isnan(v) else 1.0))
                conf_rows.append((base, float(ks.confidence[i])))
                if not math.isnan(v):
                    value_rows.append(({**base, "reason": ks.reason[i],
                                        "worst": ks.categories[w] if w >= 0 else ""}, v))
                if kind in ("node", "replica"):
                    for k, cat in enumerate(ks.categories):
                        cv = float(ks.cat[i, k])
                        if not math.isnan(cv):
                            cat_rows.append(({**base, "category": cat}, cv))
        m.family("fleethealth_health", "gauge",
                 "Health value in [0, 1] (absent when unknown), with the reason code and worst category.", value_rows)
        m.family("fleethealth_health_known", "gauge", "1 when the entity's health is known, 0 when unknown.",
                 known_rows)
        m.family("fleethealth_confidence", "gauge", "Share of expected signals that are fresh.", conf_rows)
        m.family("fleethealth_category_score", "gauge", "Per-category score of nodes and replicas.", cat_rows)

    ents = list(pub.state.entities.values())
    m.family("fleethealth_state", "gauge", "Lifecycle state (1 for the current one).",
             [({"entity": e.entity, "kind": e.kind, "state": str(e.state)}, 1.0) for e in ents])
    m.family("fleethealth_entity_info", "gauge", "1 per node and replica, with its pool (join on entity, kind).",
             [({"entity": e.entity, "kind": e.kind, "pool": e.labels.get("pool", "default")}, 1.0) for e in ents])
    m.family("fleethealth_entity_transitions_total", "counter", "Lifecycle transitions per entity (flapping).",
             [({"entity": e.entity, "kind": e.kind}, float(e.transitions)) for e in ents])
    m.family("fleethealth_router_weight", "gauge", "Last router weight published per replica.",
             [({"entity": e.entity}, e.weight) for e in ents if e.weight is not None])
    m.family("fleethealth_transitions_total", "counter", "Lifecycle transitions since the controller started.",
             [({"from": a, "to": b}, n) for (a, b), n in sorted(c.get("transitions_total", {}).items())])
    m.family("fleethealth_intents_total", "counter", "Intents emitted since the controller started.",
             [({"intent": k}, n) for k, n in sorted(c.get("intents_total", {}).items())])
    m.family("fleethealth_budget_remaining", "gauge", "Quarantines still allowed per pool in the budget window.",
             [({"kind": k, "pool": p}, v) for (k, p), v in budget_remaining(pub, controller).items()])
    m.family("fleethealth_hard_gate_budget_remaining", "gauge",
             "Quarantines of confirmed hard gates (dead hardware) still allowed per pool in the window.",
             [({"kind": k, "pool": p}, v) for (k, p), v in hard_gate_budget_remaining(pub, controller).items()])
    m.family("fleethealth_physical_budget_remaining", "gauge",
             "Quarantines on physical evidence (GPU off the bus, DBE, failed remap) still allowed per pool.",
             [({"kind": k, "pool": p}, v) for (k, p), v in physical_budget_remaining(pub, controller).items()])
    m.family("fleethealth_remediation_frozen", "gauge", "1 while fleet-wide confidence is low (telemetry problem).",
             [({}, 1.0 if pub.state.frozen else 0.0)])
    if runner is not None:
        killed = bool(getattr(runner, "killed", False))
        mode = getattr(getattr(runner, "config", None), "mode", "advise")
        m.family("fleethealth_actuation_killed", "gauge", "1 while the kill switch is engaged.",
                 [({}, 1.0 if killed else 0.0)])
        m.family("fleethealth_actuation_mode", "gauge", "Actuation mode (1 for the current one).",
                 [({"mode": mode}, 1.0)])
    from fleethealth.controller.control_metrics import control_plane_families

    for name, kind, help_, rows in control_plane_families(controller, runner, pub.ts):  # leader, outbox, store
        m.family(name, kind, help_, rows)
    return m.text()


def _jsonable(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            v = {("->".join(kk) if isinstance(kk, tuple) else str(kk)): vv for kk, vv in v.items()}
        out[k] = v
    return out


def _peer(request: Request) -> str:
    c = request.client
    return "unknown" if c is None else f"{c.host}:{c.port}"


def create_app(controller: Controller, runner: Any = None, *, guard: Guard | None = None,
               auditor: Auditor | None = None, api: ApiConfig | None = None) -> FastAPI:
    """``guard`` None: no authority, so every POST is 401 (and reads follow ``api.read``)."""
    api = api or ApiConfig()
    guard = guard or Guard(read=api.read)
    auditor = auditor or Auditor()
    docs = api.docs
    app = FastAPI(title="fleethealth controller", docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)

    refused: dict[int, int] = {}  # requests refused per status, since start (/metrics)
    refused_lock = threading.Lock()  # sync endpoints run in a thread pool

    def refuse(e: Denied) -> HTTPException:
        with refused_lock:
            refused[e.status] = refused.get(e.status, 0) + 1
        hdr = {"WWW-Authenticate": 'Bearer realm="fleethealth"'} if e.status == 401 else None
        return HTTPException(e.status, e.reason, headers=hdr)

    def may_read(request: Request) -> None:
        try:
            guard.check(request.headers.get("authorization"), request.client.host if request.client else None,
                        "get")
        except Denied as e:
            raise refuse(e) from None

    def permit(request: Request, who: Principal, verb: str, resource: str, name: str,
               detail: dict[str, Any]) -> None:
        """Authorise and audit one action (refusals of a known caller are audited too)."""
        target = f"{resource.rstrip('s')}/{name}" if name else resource
        try:
            guard.authorize(who, verb, resource, name)
        except Denied as e:
            if e.status == 403:  # a refusal that cannot be stored is still logged (record never raises for it)
                auditor.record(who, verb, target, _peer(request), False, {**detail, "refused": e.reason})
            raise refuse(e) from None
        try:
            auditor.record(who, verb, target, _peer(request), True, detail)
        except AuditFailed as e:
            raise HTTPException(503, f"{e}; nothing was done") from None

    def caller(request: Request) -> Principal:
        try:
            return guard.authenticate(request.headers.get("authorization"))
        except Denied as e:
            raise refuse(e) from None

    def entity_param(entity: str | None) -> None:
        if entity is not None and (why := entity_problem(entity)) is not None:
            raise HTTPException(400, why)

    # Rendering every entity of a 100k-GPU fleet costs about a second: do it once per cycle, not per
    # scrape (several Prometheus replicas may scrape the controller). The kill switch state is live.
    cache: dict[str, Any] = {"pub": None, "killed": None, "text": ""}

    @app.get("/metrics")
    def metrics(request: Request) -> PlainTextResponse:
        if api.metrics == "authenticated":
            try:
                guard.check(request.headers.get("authorization"), None, "get")
            except Denied as e:
                raise refuse(e) from None
        pub = controller.published
        killed = None if runner is None else bool(getattr(runner, "killed", False))
        if cache["pub"] is not pub or cache["killed"] != killed:
            cache["text"] = render_metrics(controller, runner) + live_kpis.metrics_text()
            cache["pub"], cache["killed"] = pub, killed
        m = _Metrics()
        m.family("fleethealth_api_refused_total", "counter",
                 "API requests refused: 401 no valid token, 403 no permission, 503 could not check.",
                 [({"code": str(k)}, float(refused.get(k, 0))) for k in (401, 403, 503)])
        return PlainTextResponse(cache["text"] + m.text(), media_type=CONTENT_TYPE_TEXT)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        pub = controller.published
        # Healthy once a cycle has completed recently; a loop stuck or crashing every cycle is not.
        age = time.time() - pub.ts if pub.report is not None else None
        limit = 3 * controller.interval_s + 30
        ok = age is not None and age < limit
        # A dead source is reported, not failed on: restarting the controller (liveness) or taking it out
        # of the Service (readiness) would not bring a Prometheus back, and its data reads unknown anyway.
        down = sorted(str(x["name"]) for x in pub.sources if not x["up"])
        body = {"ok": ok, "last_cycle_age_s": None if age is None else round(age, 3),
                "cycles": pub.counters.get("cycles_total", 0),
                "sources": {str(x["name"]): {"up": bool(x["up"]), "age_s": x["age_s"]} for x in pub.sources},
                "sources_down": down,
                "status": ("no cycle yet" if pub.report is None else "loop stalled" if not ok
                           else f"degraded: source {', '.join(down)} down" if down else "ok")}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/api/v1/health")
    def health(request: Request, kind: str | None = None, entity: str | None = None,
               details: bool = False, node: str | None = None) -> JSONResponse:
        may_read(request)
        entity_param(entity)
        entity_param(node)
        h = controller.published.health
        if h is None:
            return JSONResponse({"ts": None, "tuples": []})
        if entity is not None:
            t = h.get(entity)
            if t is None:
                raise HTTPException(404, f"no entity {entity!r}")
            tuples = [t]
        elif kind is not None:
            if kind not in ENTITY_KINDS:
                raise HTTPException(400, f"unknown kind {kind!r}: expected one of {', '.join(ENTITY_KINDS)}")
            tuples = h.by_kind(kind)
        else:
            tuples = list(h)
        if node is not None:  # one node's members (its GPUs): what `describe node` lists below its tuple
            tuples = [t for t in tuples if t.kind != "node" and (t.labels.get("node") or t.entity.split("/")[0]) == node]
        return JSONResponse({"ts": h.now, "policy_version": h.policy_version,
                             "tuples": [t.to_dict(with_details=details) for t in tuples]})

    @app.get("/api/v1/states")
    def states(request: Request, kind: str | None = None) -> JSONResponse:
        may_read(request)
        if kind is not None and kind not in ("node", "replica"):
            raise HTTPException(400, f"unknown kind {kind!r}: expected node or replica")
        pub = controller.published
        ents = [e.to_dict() for e in pub.state.entities.values() if kind is None or e.kind == kind]
        for d in ents:  # which version incident holds a node, since when, what releases it (decide.safety)
            if d.get("version_hold") is not None:
                d["version_hold_detail"] = version_hold_summary(pub.state.entities[d["entity"]], pub.state.incidents)
        return JSONResponse({"ts": pub.ts, "frozen": pub.state.frozen, "entities": ents})

    @app.get("/api/v1/intents")
    def intents(request: Request, since: float | None = None, until: float | None = None,
                entity: str | None = None, limit: int = Query(500, ge=1, le=10_000)) -> JSONResponse:
        may_read(request)
        entity_param(entity)
        # from the store (a restart or a take-over keeps the history), bounded by limit and the window
        rows = recent_history(controller, since=since, until=until, entity=entity, limit=limit)[1]
        return JSONResponse({"ts": controller.published.ts, "intents": rows})

    @app.get("/api/v1/transitions")
    def transitions(request: Request, since: float | None = None, until: float | None = None,
                    entity: str | None = None, limit: int = Query(500, ge=1, le=10_000)) -> JSONResponse:
        may_read(request)
        entity_param(entity)
        rows = recent_history(controller, since=since, until=until, entity=entity, limit=limit)[0]
        return JSONResponse({"ts": controller.published.ts, "transitions": rows})

    @app.get("/api/v1/weights")
    def weights(request: Request) -> JSONResponse:
        """What the router actuator published (enforce mode), else the weights the decisions hold (advise
        mode: nothing is pushed, but readers can still follow them). Same shape either way."""
        may_read(request)
        pub = controller.published
        if pub.weights and pub.weights.get("replicas"):
            return JSONResponse({**dict(pub.weights), "source": "router"})
        reps = {e.entity: {"replica": e.entity, "weight": e.weight, "state": str(e.state),
                           "value": e.last_value, "confidence": e.last_confidence}
                for e in sorted(pub.state.entities.values(), key=lambda e: e.entity)
                if e.kind == "replica" and e.weight is not None}
        return JSONResponse({"ts": pub.ts, "replicas": reps, "source": "decisions"})

    @app.get("/api/v1/status")
    def status(request: Request) -> JSONResponse:
        may_read(request)
        pub = controller.published
        body: dict[str, Any] = {
            "ts": pub.ts, "counters": _jsonable(pub.counters), "sources": list(pub.sources),
            "last_cycle": None if pub.report is None else pub.report.to_dict(),
            "summary": None if pub.health is None else pub.health.summary(),
            "policy_version": controller.policy.version_tag,
        }
        if runner is not None and hasattr(runner, "status"):
            body["actuation"] = runner.status()
        return JSONResponse(redact_value(body))  # no credentials of a configured URL are served

    @app.get("/api/v1/audit")
    def audit(request: Request, since: float | None = None, limit: int = Query(500, ge=1)) -> JSONResponse:
        may_read(request)
        store = auditor.store
        rows = store.audit_log(since=since, limit=limit) if store is not None and hasattr(store, "audit_log") else []
        return JSONResponse({"audit": rows})

    @app.post("/api/v1/events")
    async def post_event(request: Request) -> JSONResponse:
        who = caller(request)  # 401 before the body is even looked at
        try:
            d = await request.json()
            if not isinstance(d, dict):
                raise ValueError("expected a JSON object")
            if (why := entity_problem(d.get("entity"))) is not None:
                raise ValueError(why)
            ev = Event.from_dict({**d, "ts": controller.clock.now(), "actor": who.user})
        except Exception as e:
            raise HTTPException(400, f"not a valid event: {' '.join(str(e).split())[:300]}") from None
        es = controller.published.state.entities.get(ev.entity)
        verb = event_verb(ev.kind, ev.to)
        detail = {"kind": ev.kind, **({"to": ev.to} if ev.to else {}),
                  **({"passed": ev.passed} if ev.passed is not None else {})}
        permit(request, who, verb, entity_resource(None if es is None else es.kind), ev.entity, detail)
        controller.add_event(ev)
        return JSONResponse({"accepted": ev.to_dict()}, status_code=202)

    @app.post("/api/v1/kill")
    async def kill(request: Request) -> JSONResponse:
        who = caller(request)
        reason = " ".join((await request.body()).decode(errors="replace").split())[:200] or "via API"
        permit(request, who, "kill", "fleet", "", {"reason": reason})
        if runner is None:
            raise HTTPException(409, "no actuation runner configured")
        runner.kill(f"{reason} (by {who.user})" if reason == "via API" else reason)
        return JSONResponse({"killed": True})

    @app.post("/api/v1/incidents/label")
    async def label_incident(request: Request) -> JSONResponse:
        """An operator's verdict on an incident of ``fleethealth review`` (confirmed or false), kept in the
        store and counted by ``review`` and ``tune``."""
        import re

        from fleethealth.review.incidents import LABELS

        who = caller(request)
        try:
            d = await request.json()
            if not isinstance(d, dict):
                raise ValueError("expected a JSON object")
            key, label = str(d.get("key", "")), str(d.get("label", ""))
            if not re.fullmatch(r"[^\x00-\x1f@]{1,253}@\d{1,12}", key):
                raise ValueError("key: expected an incident key like node-37@1764000000")
            if label not in LABELS:
                raise ValueError(f"label: expected one of {', '.join(LABELS)}")
            cause = " ".join(str(d.get("cause") or "").split())[:500]
            onset = None if d.get("onset") is None else float(d["onset"])
        except Exception as e:
            raise HTTPException(400, f"not a valid label: {' '.join(str(e).split())[:300]}") from None
        permit(request, who, "label", "incidents", key, {"label": label, "cause": cause})
        store = auditor.store
        if store is None or not hasattr(store, "label_incident"):
            raise HTTPException(409, "no state store that keeps labels")
        store.label_incident(key, label, cause, who.user, controller.clock.now(), onset)
        return JSONResponse({"labelled": {"key": key, "label": label, "cause": cause, "by": who.user}},
                            status_code=202)

    @app.post("/api/v1/resume")
    def resume(request: Request) -> JSONResponse:
        who = caller(request)
        permit(request, who, "resume", "fleet", "", {})
        if runner is None:
            raise HTTPException(409, "no actuation runner configured")
        runner.resume()
        return JSONResponse({"killed": bool(runner.killed)})

    from fleethealth.controller.view import add_view_routes

    # GET / and /entity/NAME: the fleet view (read-only); GET /api/v1/pools: the fleet KPIs (also in /metrics)
    live_kpis = add_view_routes(app, controller, runner, may_read)
    app.add_middleware(BodyLimit, max_bytes=api.max_body_bytes, hint=" (api.max_body_bytes in the controller config)")
    return app


class ApiServer:
    """uvicorn in a daemon thread; ``start()`` returns once the socket accepts connections."""

    def __init__(self, controller: Controller, host: str, port: int, runner: Any = None, *,
                 guard: Guard | None = None, auditor: Auditor | None = None, api: ApiConfig | None = None,
                 wrap: Callable[[Any], Any] | None = None) -> None:
        """``wrap``: an ASGI middleware around the app (a sharded replica's shard: the caller's address
        forwarded by the replica, controller.shard_api)."""
        import uvicorn

        self.host, self.port = host, port
        app = create_app(controller, runner, guard=guard, auditor=auditor, api=api)
        # proxy_headers off: the loopback rule for reads must see the TCP peer, not X-Forwarded-For.
        config = uvicorn.Config(app if wrap is None else wrap(app), host=host, port=port, log_level="warning", access_log=False,
                                lifespan="off", proxy_headers=False)
        from fleethealth.auth.redact import install_log_redaction

        install_log_redaction()
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="fleethealth-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> ApiServer:
        self.thread.start()
        deadline = time.time() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"cannot listen on {self.host}:{self.port}")
            if time.time() > deadline:
                raise RuntimeError(f"API server did not start within {timeout_s} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

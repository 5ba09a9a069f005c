"""The live fleet view, served by the controller on its API port: GET / (the fleet) and GET /entity/NAME.

Theory of operation: server-rendered HTML from ``Controller.published`` (one consistent cycle), no
JavaScript, no CDN, inline CSS only, so it works offline and behind any proxy; a meta refresh reloads it.
Per pool, a heatmap of nodes (rows) by GPUs (cells) coloured by score; unknown GPUs are hatched grey with
a "?" (never a colour of the health scale), and each node's lifecycle state is marked beside it. Above it:
actuation mode, kill switch, remediation freeze, budgets, and what waits for a human (FAILED entities,
pages). Below: serving replicas with state and router weight (a replica whose node is being drained or
quarantined, or that is out of routing, is marked draining, with why; one STARTING or WARMING is not in
routing yet, not draining), the fleet KPIs per pool
(controller.fleet_kpis), and the feed of transitions and intents with their reasons (a return to READY
says "healthy", not the least good category). The entity page shows the tuple, its score/state/intent
timeline of the last hours from the state store (controller.timeline: an inline SVG), the signals behind
it (the explain detail), its GPUs, its evidence bundles (GET /evidence/KEY lists a bundle's files), the
runbooks of its reasons and intents, and recent transitions and intents. Read-only: it follows ``api.read`` like the JSON
API; actions go through the authenticated POST endpoints (or `fleethealth ack|ready|kill|resume`).
"""

from __future__ import annotations

import contextlib
import html
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from fleethealth.controller.fleet_kpis import LiveKpis
from fleethealth.controller.timeline import legend, timeline_svg
from fleethealth.decide.safety import version_hold_summary
from fleethealth.review.incidents import reason_family
from fleethealth.review.kpis import summary_table
from fleethealth.runbooks import intent_path, reason_path, url

log = logging.getLogger(__name__)

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;padding:12px;max-width:1400px;color:#111;background:#fafafa}
h1{font-size:20px;margin:4px 0} h2{font-size:16px;margin:18px 0 6px} a{color:#0645ad}
.bar{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}
.pill{padding:3px 9px;border-radius:12px;background:#e8e8e8;font-weight:600}
.pill.bad{background:#c62828;color:#fff} .pill.warn{background:#f9a825} .pill.ok{background:#2e7d32;color:#fff}
.hm{border-collapse:collapse;margin:4px 0}
.hm td{padding:0;border:1px solid #fff}
.hm td.n{padding:0 8px 0 0;white-space:nowrap;font-family:monospace;font-size:13px}
.hm td.c{width:22px;height:22px;text-align:center;font-size:11px;font-family:monospace}
.st{font-size:11px;padding:1px 5px;border-radius:3px;margin-left:4px;background:#ddd}
.st-READY{background:#c8e6c9} .st-DEGRADED{background:#fff59d} .st-QUARANTINED,.st-FAILED{background:#c62828;color:#fff}
.st-DRAINING,.st-RECOVERING{background:#ffcc80} .st-STARTING,.st-WARMING{background:#bbdefb}
.unknown{background:repeating-linear-gradient(45deg,#9e9e9e,#9e9e9e 3px,#e0e0e0 3px,#e0e0e0 6px)!important;color:#000}
.wrap{overflow-x:auto}
table.t{border-collapse:collapse;width:100%;background:#fff} table.t td,table.t th{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
.legend span{display:inline-block;padding:1px 6px;margin-right:4px;font-size:12px}
.note{font-size:12px;color:#555;margin:4px 0}
@media (max-width:640px){body{padding:6px;font-size:13px} .hm td.c{width:14px;height:18px;font-size:9px} .hide-narrow{display:none}}
"""


def colour(v: float | None) -> str:
    """Red (0) to yellow (0.5) to green (1); unknown has no colour of its own (the hatched class)."""
    if v is None:
        return ""
    v = min(1.0, max(0.0, v))
    hue = int(120 * v)
    return f"background:hsl({hue},70%,{45 + 10 * (1 - abs(v - 0.5) * 2):.0f}%)"


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _num(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.2f}"


def _ago(now: float, ts: float | None) -> str:
    if ts is None:
        return "-"
    s = max(0.0, now - ts)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def _span(s: float) -> str:
    return f"{s / 60:.0f} minutes" if s < 7200 else f"{s / 3600:.0f} hours"


def _page(title: str, body: str, refresh: int | None = 15) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{meta}'
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{body}</body></html>")


def _runbook(reason: str) -> str:
    link = url(reason_path(reason))
    return f' <a href="{_e(link)}">runbook</a>' if link else ""


def render_fleet(controller: Any, runner: Any = None, now: float | None = None, kpis: LiveKpis | None = None) -> str:
    from fleethealth.controller.api import (
        budget_remaining,
        hard_gate_budget_remaining,
        physical_budget_remaining,
    )

    pub = controller.published
    now = pub.ts if now is None else now
    health = pub.health
    ents = pub.state.entities
    killed = bool(getattr(runner, "killed", False)) if runner is not None else False
    mode = getattr(getattr(runner, "config", None), "mode", "advise") if runner is not None else "advise"
    parts = ['<h1>fleethealth: fleet</h1>',
             f'<div>cycle at {_e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(pub.ts)))}, '
             f'policy {_e(controller.policy.version_tag)}</div><div class="bar">',
             f'<span class="pill {"warn" if mode == "advise" else "ok"}" id="mode">actuation: {_e(mode)}</span>',
             f'<span class="pill {"bad" if killed else "ok"}" id="kill">kill switch: {"ENGAGED" if killed else "off"}</span>',
             f'<span class="pill {"bad" if pub.state.frozen else "ok"}" id="frozen">remediation: '
             f'{"FROZEN (telemetry problem)" if pub.state.frozen else "active"}</span>']
    # the rate budget, then the confirmed hard gates' and physical evidence's own (decide.safety)
    for label, left_of in (("budget", budget_remaining), ("hard-gate budget", hard_gate_budget_remaining),
                           ("physical budget", physical_budget_remaining)):
        for (kind, pool), left in left_of(pub, controller).items():
            parts.append(f'<span class="pill {"bad" if left <= 0 else ""}">{label} {_e(kind)} {_e(pool)}: '
                         f'{left:.0f} left</span>')
    parts.append("</div>")
    waiting = [e for e in ents.values() if str(e.state) == "FAILED"]
    pages = [i for i in pub.recent_intents if i.get("intent") in ("page", "fleet_alert")][-10:]
    parts.append('<h2>Waiting for a human</h2>')
    if not waiting and not pages:
        parts.append("<div>nothing</div>")
    else:
        parts.append('<ul id="waiting">' + "".join(
            f'<li><a href="/entity/{_e(e.entity)}">{_e(e.entity)}</a> FAILED: {_e(e.last_reason)}</li>' for e in waiting)
            + "".join(f'<li>page for {_e(i["entity"])}: {_e(i["reason"])} ({_ago(now, i.get("ts"))})</li>' for i in pages)
            + "</ul>")
    # per pool heatmap: nodes by GPUs
    gpus: dict[str, list[tuple[str, float | None]]] = {}
    node_t = {}
    if health is not None:
        for t in health.by_kind("gpu"):
            node = t.labels.get("node") or t.entity.split("/")[0]
            gpus.setdefault(node, []).append((t.entity, t.value))
        node_t = {t.entity: t for t in health.by_kind("node")}
    pools: dict[str, list[Any]] = {}
    for e in ents.values():
        if e.kind == "node":
            pools.setdefault(e.labels.get("pool", "default"), []).append(e)
    parts.append(f'<div class="legend">score: <span style="{colour(0.0)}">0</span><span style="{colour(0.5)}">0.5'
                 f'</span><span style="{colour(1.0)}">1</span><span class="unknown">? unknown</span></div>')
    for pool in sorted(pools):
        parts.append(f'<h2>Pool {_e(pool)}</h2><div class="wrap"><table class="hm" id="pool-{_e(pool)}">')
        for e in sorted(pools[pool], key=lambda e: e.entity):
            t = node_t.get(e.entity)
            v = None if t is None else t.value
            state = str(e.state)
            cells = []
            for name, gv in sorted(gpus.get(e.entity, []), key=lambda x: x[0]):
                cls = "c unknown" if gv is None else "c"
                cells.append(f'<td class="{cls}" style="{colour(gv)}" title="{_e(name)}: {_num(gv)}">'
                             f'{"?" if gv is None else ""}</td>')
            if not cells:
                cells.append(f'<td class="c{" unknown" if v is None else ""}" style="{colour(v)}">{"?" if v is None else ""}</td>')
            reason = "" if t is None or v is None or (state == "READY" and v >= 0.8) else t.reason
            parts.append(
                f'<tr data-entity="{_e(e.entity)}" data-state="{_e(state)}" data-known="{"0" if v is None else "1"}"'
                f' data-reason="{_e(t.reason if t else "")}"><td class="n"><a href="/entity/{_e(e.entity)}">'
                f'{_e(e.entity)}</a><span class="st st-{_e(state)}">{_e(state)}</span>'
                + (f'<span class="st st-DRAINING" data-held="{_e(e.version_hold)}" title="held by version incident '
                   f'{_e(e.version_hold)}">held: version</span>' if e.version_hold else "")
                + f'<span class="hide-narrow"> {_num(v)} {_e(reason)}</span></td>{"".join(cells)}</tr>')
        parts.append("</table></div>")
    reps = sorted((e for e in ents.values() if e.kind == "replica"), key=lambda e: e.entity)
    if reps:
        node_state = {e.entity: str(e.state) for e in ents.values() if e.kind == "node"}
        parts.append('<h2>Serving replicas</h2><div class="wrap"><table class="t" id="replicas"><tr><th>replica</th>'
                     '<th>state</th><th>health</th><th>weight</th><th class="hide-narrow">reason</th></tr>')
        for e in reps:
            why = draining(e, node_state)
            mark = f' <span class="st st-DRAINING" title="{_e(why)}">draining</span>' if why else ""
            reason = why or not_yet_routed(e) or (e.last_reason if str(e.state) != "READY" else "")
            parts.append(f'<tr data-entity="{_e(e.entity)}" data-state="{_e(e.state)}" data-draining="{"1" if why else "0"}"'
                         f' data-node="{_e(e.labels.get("node", ""))}"><td><a href="/entity/{_e(e.entity)}">'
                         f'{_e(e.entity)}</a></td><td><span class="st st-{_e(e.state)}">{_e(e.state)}</span>{mark}</td>'
                         f'<td>{_num(e.last_value)}</td><td>{_num(e.weight)}</td>'
                         f'<td class="hide-narrow">{_e(reason)}</td></tr>')
        parts.append("</table></div>")
    if kpis is not None:
        parts.append(_kpi_table(kpis))
    parts.append(_feed(controller, now, None))
    return _page("fleethealth: fleet", "".join(parts))


# A replica in these states has not entered routing yet: weight 0 there is no drain.
NOT_YET_ROUTED = ("STARTING", "WARMING")


def draining(replica: Any, node_state: dict[str, str]) -> str:
    """Why a replica is being taken out of service, or "" when it is not: its own lifecycle drains it, its
    router weight is 0 while it is not READY (STARTING and WARMING are not in routing yet: no drain), or its
    node is being drained or quarantined (its pods go)."""
    state = str(replica.state)
    if state == "DRAINING":
        return "draining: " + (replica.last_reason or "its lifecycle drains it")
    node = replica.labels.get("node", "")
    if node_state.get(node) in ("DRAINING", "QUARANTINED"):
        return f"draining: its node {node} is {node_state[node]}"
    if replica.weight is not None and replica.weight <= 0.0 and state not in ("READY", *NOT_YET_ROUTED):
        return f"draining: out of routing (weight 0, {state})"
    return ""


def not_yet_routed(replica: Any) -> str:
    """What the replicas table says of a replica that has not entered routing yet ("" for any other)."""
    state = str(replica.state)
    return f"{state.lower()}: not in routing yet" if state in NOT_YET_ROUTED else ""


def _transition_reason(t: dict[str, Any]) -> str:
    """What a transition says to a person: into READY, that it is healthy (its reason code is then only the
    least good category of a healthy score, which reads like an alarm); otherwise the reason code."""
    if str(t.get("to")) == "READY":
        v = t.get("value")
        return "healthy" + (f" ({float(v):.2f})" if v is not None else "")
    return str(t.get("reason", ""))


def recent_history(controller: Any, *, since: float | None = None, until: float | None = None,
                   entity: str | None = None, limit: int = 500
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The newest ``limit`` transitions and intents with ``since < ts <= until`` (of one entity), oldest
    first: from the state store, so a restarted controller or a new leader shows what happened before it;
    from this process's memory when there is no store (or it cannot answer)."""
    store = _store(controller)
    if store is not None and hasattr(store, "recent_transitions"):
        try:
            window = {"since": since, "until": until, "entity": entity, "limit": limit}
            return store.recent_transitions(**window), store.recent_intents(**window)
        except Exception as e:  # noqa: BLE001 (the API and the view still answer from memory)
            log.warning("recent transitions and intents from memory: state store: %s", e)
    pub = controller.published

    def keep(r: dict[str, Any]) -> bool:
        ts = float(r["ts"])
        return ((since is None or ts > since) and (until is None or ts <= until)
                and (entity is None or r["entity"] == entity))

    trs = [t for t in pub.recent_transitions if keep(t)]
    ints = [i for i in pub.recent_intents if keep(i)]
    return trs[-limit:] if limit > 0 else [], ints[-limit:] if limit > 0 else []


def _feed(controller: Any, now: float, entity: str | None) -> str:
    trs, ints = recent_history(controller, entity=entity, limit=100)
    rows = [("transition", t["ts"], t["entity"], f'{t["from"]} → {t["to"]}', _transition_reason(t)) for t in trs]
    rows += [("intent", i["ts"], i["entity"], i["intent"], i["reason"]) for i in ints]
    rows.sort(key=lambda r: -float(r[1]))
    out = ['<h2>Recent transitions and intents</h2><div class="wrap"><table class="t" id="feed"><tr><th>when</th>'
           '<th>entity</th><th>what</th><th>reason</th></tr>']
    for kind, ts, ent, what, reason in rows[:100]:
        out.append(f'<tr class="{kind}"><td>{_ago(now, ts)}</td><td><a href="/entity/{_e(ent)}">{_e(ent)}</a></td>'
                   f'<td>{_e(what)}</td><td>{_e(reason)}{_runbook(str(reason))}</td></tr>')
    if not rows:
        out.append('<tr><td colspan="4">nothing yet</td></tr>')
    out.append("</table></div>")
    return "".join(out)


def _store(controller: Any) -> Any:
    return getattr(getattr(controller, "loop", None), "store", None)


def _collector(runner: Any) -> Any:
    """The evidence collector among the runner's actuators (it keeps its own index of bundles), or None."""
    from fleethealth.decide.model import IntentKind

    routes = getattr(runner, "routes", None) or {}
    return next((a for a in routes.get(IntentKind.CAPTURE_EVIDENCE, []) if hasattr(a, "index")), None)


def entity_history(controller: Any, name: str, since: float, runner: Any = None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The entity's transitions (all: the state before the window counts), its intents since ``since`` and
    its evidence bundles (``key, ts, reason, location``: the state store's index, and the evidence
    collector's), from the state store; without one (or when it fails), from recent memory."""
    pub = controller.published
    store = _store(controller)
    trs: list[dict[str, Any]] | None = None
    ints: list[dict[str, Any]] = []
    ev: dict[str, dict[str, Any]] = {}
    if store is not None:
        try:
            # bounded: the newest 1000 of the entity's transitions (the state before the window counts)
            trs = (store.recent_transitions(entity=name, limit=1000) if hasattr(store, "recent_transitions")
                   else store.transitions(name))
            ints = (store.recent_intents(since=since, entity=name, limit=1000) if hasattr(store, "recent_intents")
                    else [i for i in store.intents(since=since) if i["entity"] == name])
            for r in store.evidence(name) if hasattr(store, "evidence") else []:
                ev[str(r["key"])] = r
        except Exception:  # the view still answers from memory when the store cannot
            trs = None
    if trs is None:
        trs = [t for t in pub.recent_transitions if t["entity"] == name]
        ints = [i for i in pub.recent_intents if i["entity"] == name and float(i["ts"]) >= since]
    col = _collector(runner)
    if col is not None:
        for r in col.index.list(name):
            key = str(r.get("intent_key") or "")
            if key and (key not in ev or not ev[key].get("location")):
                ev[key] = {"key": key, "ts": r["ts"], "entity": name, "reason": r["reason"], "location": r["path"]}
    return trs, ints, list(ev.values())


def _runbooks(reason: str | None, intents: list[dict[str, Any]], transitions: list[dict[str, Any]]) -> str:
    links: dict[str, str] = {}
    for r in [reason or ""] + [str(t.get("reason", "")) for t in transitions[-5:]]:
        p = reason_path(r)
        if p is not None:
            links.setdefault(p, f"reason {reason_family(r)}")
    for i in intents:
        kind = str(i.get("intent", i.get("kind", "")))
        links.setdefault(intent_path(kind), f"intent {kind}")
    if not links:
        return ""
    return ('<h2>Runbooks</h2><ul id="runbooks">' + "".join(
        f'<li><a href="{_e(url(p))}">{_e(what)}</a></li>' for p, what in sorted(links.items(), key=lambda x: x[1]))
        + "</ul>")


def _evidence(rows: list[dict[str, Any]], now: float) -> str:
    if not rows:
        return '<h2>Evidence</h2><div id="evidence">no evidence bundle captured for it</div>'
    out = ['<h2>Evidence</h2><div class="wrap"><table class="t" id="evidence"><tr><th>captured</th><th>why</th>'
           "<th>bundle</th></tr>"]
    for r in sorted(rows, key=lambda r: -float(r["ts"]))[:20]:
        link = (f'<a href="/evidence/{_e(r["key"])}">files</a>' if r.get("location")
                else "not written yet (the actuator has not run, or it runs in advise mode)")
        out.append(f'<tr><td>{_ago(now, r["ts"])}</td><td>{_e(r["reason"])}</td><td>{link}</td></tr>')
    out.append("</table></div>")
    return "".join(out)


def render_entity(controller: Any, name: str, hours: float = 6.0, runner: Any = None,
                  kpis: LiveKpis | None = None) -> str | None:
    pub = controller.published
    es = pub.state.entities.get(name)
    t = pub.health.get(name) if pub.health is not None else None
    if es is None and t is None:
        return None
    state = str(es.state) if es is not None else "-"
    parts = ['<a href="/">← fleet</a>', f"<h1>{_e(name)}</h1>",
             f'<div class="bar"><span class="pill st st-{_e(state)}" id="state">{_e(state)}</span>']
    if t is not None:
        parts.append(f'<span class="pill" id="value">health {_num(t.value)}</span>'
                     f'<span class="pill">confidence {t.confidence:.2f}</span>')
        if t.value is None or state != "READY":
            parts.append(f'<span class="pill">reason {_e(t.reason)}{_runbook(t.reason)}</span>')
    parts.append("</div>")
    trs, ints, ev = entity_history(controller, name, pub.ts - hours * 3600.0, runner)
    if es is not None:  # the count of its stored transitions (a restart keeps them), not this process's
        parts.append(f"<div>in {_e(state)} since {_ago(pub.ts, es.since)}; {len(trs)} transitions; "
                     f'pool {_e(es.labels.get("pool", "default"))}</div>')
        if (hold := version_hold_summary(es, pub.state.incidents)) is not None:
            opened = "" if hold["opened"] is None else f", opened {_ago(pub.ts, float(hold['opened']))}"
            retest = ("; retest under the hold out" if hold["retesting"] else
                      "; its retest failed (evidence for the version)" if hold["retest_failed"] else "")
            parts.append(f'<div class="note" id="version-hold">held by version incident {_e(hold["incident"])}'
                         f"{_e(opened)}: {_e(hold['version'])} is suspect{_e(retest)}. Released by: "
                         f"{_e(hold['releases'])}</div>")
    # records begin at the controller's first cycle (or this entity's first stored transition, if older);
    # a young controller's timeline spans its life (at least 5 minutes), not hours of nothing
    firsts = [float(x["ts"]) for x in trs[:1]] + ([kpis.since] if kpis is not None and kpis.since else [])
    known_from = min(firsts) if firsts else None
    start = pub.ts - hours * 3600.0
    if known_from is not None:
        start = max(start, min(known_from, pub.ts - 300.0))
    value_now = t.value if t is not None else (es.last_value if es is not None else None)
    samples: list[tuple[float, float | None]] = []
    if kpis is not None:
        kpis.observe()
        samples = kpis.samples(name, start)
    parts.append(f'<h2>Last {_span(pub.ts - start)}</h2>{legend()}'
                 + timeline_svg(trs, ints, start=start, end=pub.ts, state_now=state, value_now=value_now,
                                known_from=known_from, samples=samples)
                 + f'<div class="note">{len([x for x in trs if float(x["ts"]) >= start])} state changes and '
                 f'{len(ints)} intents in the window; other windows: '
                 + " ".join(f'<a href="/entity/{_e(name)}?hours={h}">{h} h</a>' for h in (1, 6, 24, 72)) + "</div>")
    if t is not None:
        parts.append('<h2>Categories</h2><table class="t"><tr><th>category</th><th>score</th></tr>')
        for c, v in t.categories.items():
            parts.append(f'<tr><td>{_e(c)}</td><td style="{colour(v)}">{_num(v)}</td></tr>')
        parts.append("</table>")
        if t.details:
            parts.append('<h2>Signals (explain)</h2><div class="wrap"><table class="t" id="explain"><tr><th>category</th>'
                         '<th>signal</th><th>score</th><th class="hide-narrow">note</th></tr>')
            for d in t.details:
                parts.append(f'<tr><td>{_e(d.category)}</td><td>{_e(d.signal)}</td><td>{_num(d.score)}</td>'
                             f'<td class="hide-narrow">{_e(d.note)}</td></tr>')
            parts.append("</table></div>")
    if pub.health is not None and (es is None or es.kind == "node"):
        gs = [g for g in pub.health.by_kind("gpu") if (g.labels.get("node") or g.entity.split("/")[0]) == name]
        if gs:
            parts.append('<h2>GPUs</h2><div class="wrap"><table class="t" id="gpus"><tr><th>GPU</th><th>health</th>'
                         '<th>reason</th><th class="hide-narrow">signals below 1</th></tr>')
            for g in sorted(gs, key=lambda g: g.entity):
                low = ", ".join(f"{d.signal} {_num(d.score)}" for d in g.details
                                if d.score is not None and d.score < 1.0)
                cls = ' class="unknown"' if g.value is None else f' style="{colour(g.value)}"'
                parts.append(f'<tr data-gpu="{_e(g.entity)}"><td>{_e(g.entity)}</td><td{cls}>{_num(g.value)}</td>'
                             f'<td>{_e(g.reason if g.value is None or g.value < 0.8 else "")}</td>'
                             f'<td class="hide-narrow">{_e(low)}</td></tr>')
            parts.append("</table></div>")
    parts.append(_evidence(ev, pub.ts))
    parts.append(_runbooks(t.reason if t is not None and (t.value is None or state != "READY") else None, ints, trs))
    parts.append(_feed(controller, pub.ts, name))
    return _page(f"fleethealth: {name}", "".join(parts))


def evidence_files(controller: Any, runner: Any, key: str) -> tuple[dict[str, Any], Path] | None:
    """The evidence bundle of an intent key and its directory (None: no such bundle on this controller)."""
    row: dict[str, Any] | None = None
    store = _store(controller)
    if store is not None and hasattr(store, "evidence"):
        with contextlib.suppress(Exception):
            row = next((r for r in store.evidence() if r["key"] == key and r.get("location")), None)
    col = _collector(runner)
    if row is None and col is not None:
        r = col.index.by_key(key)
        if r is not None:
            row = {"key": key, "ts": r["ts"], "entity": r["entity"], "reason": r["reason"], "location": r["path"]}
    if row is None:
        return None
    d = Path(str(row["location"]))
    return (row, d) if d.is_dir() else None


def _kpi_table(kpis: LiveKpis) -> str:
    k = kpis.kpis()
    if not k:
        return ""
    rows = summary_table({p: v.to_dict() for p, v in k.items()})
    narrow = {0, 2, 4, 5}  # pool, goodput, SLO attainment, precision: the rest only on wider screens

    def cls(i: int) -> str:
        return "" if i in narrow else ' class="hide-narrow"'

    out = ['<h2>Fleet KPIs since the controller started</h2><div class="wrap"><table class="t" id="kpis"><tr>'
           + "".join(f"<th{cls(i)}>{_e(h)}</th>" for i, h in enumerate(rows[0])) + "</tr>"]
    for r, pool in zip(rows[1:], sorted(k, key=lambda p: (p == "all", p)), strict=True):
        out.append(f'<tr data-pool="{_e(pool)}">' + "".join(f"<td{cls(i)}>{_e(c)}</td>" for i, c in enumerate(r))
                   + "</tr>")
    out.append('</table></div><div class="note">GPU goodput: GPU-hours not lost to isolated, unknown or '
               "DEGRADED nodes; SLO attainment: replica time within every SLO's error budget; precision: "
               "quarantines an active test, a hard gate or FAILED confirmed; detect / repair: first bad "
               "transition to isolation / to READY. Also at /api/v1/pools and `fleethealth get pools`. "
               f'<a href="{_e(url("kpis.md"))}">What they mean, and comparing before and after an upgrade</a>.</div>')
    return "".join(out)


def add_view_routes(app: FastAPI, controller: Any, runner: Any, may_read: Callable[[Request], None]) -> LiveKpis:
    """The fleet view's routes, and GET /api/v1/pools; returns the app's ``LiveKpis`` (for /metrics)."""
    kpis = LiveKpis(controller)

    @app.get("/", response_class=HTMLResponse)
    def fleet(request: Request) -> HTMLResponse:
        may_read(request)
        return HTMLResponse(render_fleet(controller, runner, kpis=kpis))

    @app.get("/api/v1/pools")
    def pools(request: Request) -> JSONResponse:
        """Per pool: the fleet KPIs since the controller started (full precision)."""
        may_read(request)
        return JSONResponse(kpis.as_json())

    @app.get("/evidence/{key}", response_class=HTMLResponse)
    def evidence(request: Request, key: str) -> HTMLResponse:
        """An evidence bundle's files (read-only, on this controller's disk)."""
        may_read(request)
        found = evidence_files(controller, runner, key)
        if found is None:
            raise HTTPException(404, f"no evidence bundle {key!r} on this controller")
        row, d = found
        files = sorted(f.name for f in d.iterdir() if f.is_file())
        body = (f'<a href="/entity/{_e(row["entity"])}">← {_e(row["entity"])}</a><h1>Evidence: {_e(row["entity"])}</h1>'
                f'<div>captured {_e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(row["ts"]))))} for '
                f'{_e(row["reason"])}; bundle {_e(d)}</div><ul id="files">'
                + "".join(f'<li><a href="/evidence/{_e(key)}/{_e(f)}">{_e(f)}</a></li>' for f in files) + "</ul>")
        return HTMLResponse(_page(f"evidence {row['entity']}", body, refresh=None))

    @app.get("/evidence/{key}/{file}")
    def evidence_file(request: Request, key: str, file: str) -> PlainTextResponse:
        may_read(request)
        found = evidence_files(controller, runner, key)
        if found is None or "/" in file or "\\" in file or file.startswith("."):
            raise HTTPException(404, "no such evidence file")
        f = found[1] / file
        if not f.is_file():
            raise HTTPException(404, "no such evidence file")
        return PlainTextResponse(f.read_text(encoding="utf-8", errors="replace"))

    @app.get("/entity/{name:path}", response_class=HTMLResponse)
    def entity(request: Request, name: str, hours: float = Query(6.0, gt=0, le=168)) -> HTMLResponse:
        may_read(request)
        page = render_entity(controller, name, hours, runner, kpis)
        if page is None:
            raise HTTPException(404, f"no entity {name!r}")
        return HTMLResponse(page)

    return kpis

"""kubectl-style client verbs against a running controller's HTTP API:

    fleethealth get nodes|replicas|intents|pools [--state S] [-o wide|json]
    fleethealth describe node NAME
    fleethealth ack|ready|quarantine NODE --reason "..."
    fleethealth kill --reason "..." | fleethealth resume

Theory of operation: a thin shell over the API (GET /api/v1/{states,health,intents,transitions};
POST /api/v1/events, /kill, /resume with a bearer token). The server is ``--server`` or
FLEETHEALTH_SERVER (default http://127.0.0.1:9108), the token ``--token`` or FLEETHEALTH_TOKEN. Tables round
numbers for people; ``-o json`` prints the server's values at full precision. Exit codes: 0 done, 1 not
found, 2 bad usage (unknown resource, state or output format), 3 the controller could not be reached or
failed, 4 refused (401/403: no token, or not allowed).
"""

from __future__ import annotations

import json
import os
from typing import Any

import typer

from fleethealth.cli.common import err_console, fail
from fleethealth.runbooks import intent_path, reason_path, url

DEFAULT_SERVER = "http://127.0.0.1:9108"
RESOURCES = ("nodes", "replicas", "intents", "pools")
OUTPUTS = ("table", "wide", "json")
STATES = ("STARTING", "WARMING", "READY", "DEGRADED", "DRAINING", "QUARANTINED", "RECOVERING", "FAILED")

ServerOpt = typer.Option(None, "--server", "-s", help="Controller URL (env FLEETHEALTH_SERVER).")
TokenOpt = typer.Option(None, "--token", help="Bearer token (env FLEETHEALTH_TOKEN).")


class _Client:
    def __init__(self, server: str | None, token: str | None) -> None:
        import httpx

        self.server = (server or os.environ.get("FLEETHEALTH_SERVER") or DEFAULT_SERVER).rstrip("/")
        tok = token or os.environ.get("FLEETHEALTH_TOKEN")
        if not self.server.startswith(("http://", "https://")):
            fail(f"--server {self.server!r}: expected a URL like {DEFAULT_SERVER}")
        try:
            self.http = httpx.Client(base_url=self.server, timeout=10.0,
                                     headers={"Authorization": f"Bearer {tok}"} if tok else {})
        except (httpx.InvalidURL, ValueError) as e:
            fail(f"--server {self.server!r}: not a usable URL ({e})")

    def call(self, method: str, path: str, **kw: Any) -> Any:
        import httpx

        try:
            r = self.http.request(method, path, **kw)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
            fail(f"--server {self.server!r}: not a usable URL ({e})")
        except httpx.HTTPError as e:
            fail(f"cannot reach the controller at {self.server}: {e}", 3)
        if r.status_code in (401, 403):
            fail(f"refused by {self.server} ({r.status_code}): {_detail(r)}", 4)
        if r.status_code == 404:
            fail(_detail(r), 1)
        if r.status_code >= 400:
            fail(f"{self.server} answered {r.status_code}: {_detail(r)}", 3 if r.status_code >= 500 else 2)
        return r.json()


def _detail(r: Any) -> str:
    try:
        return str(r.json().get("detail", r.text))
    except ValueError:
        return " ".join(r.text.split())[:200]


def _r(v: Any, nd: int = 2) -> str:
    if v is None:
        return "unknown"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def _ago(now: float | None, ts: float | None) -> str:
    if now is None or ts is None:
        return "-"
    s = max(0.0, now - ts)
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


def _healthy(value: Any, state: Any) -> bool:
    """READY with a known score that rounds to 1.00: the only case a reason would say nothing (a healthy
    score's reason is just its least good category). A READY node scored 0.00 shows its reason."""
    return isinstance(value, (int, float)) and round(float(value), 2) >= 1.0 and state == "READY"


def _signal_line(d: dict[str, Any]) -> str:
    """One signal of the explain tree: score and raw value for people; an unknown value never reads healthy."""
    score, raw = d.get("score"), d.get("raw", d.get("value"))
    note = str(d.get("note") or "")
    if score is None:
        shown = "score unknown"
        if d.get("expected_by"):
            note = f"{note}  expected: {d['expected_by']}".strip()
    elif raw is None:
        shown = f"score {_r(score)}  value unknown (not counted as healthy)"
    else:
        shown = f"score {_r(score)}  value {_r(raw, 3)}"
    return (f"  {str(d.get('category', '')):<12} {str(d.get('signal', d.get('name', ''))):<22} {shown}  {note}").rstrip()


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    for line in [header, *rows]:
        typer.echo("   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def _check(value: str | None, allowed: tuple[str, ...], what: str) -> str | None:
    if value is None:
        return None
    v = value.upper() if what == "state" else value.lower()
    if v not in allowed:
        fail(f"unknown {what} {value!r}: expected one of {', '.join(a.lower() if what == 'state' else a for a in allowed)}")
    return v


def get(resource: str = typer.Argument(..., help="nodes | replicas | intents | pools (the fleet KPIs per pool)"),
        state: str = typer.Option(None, "--state", help="Only entities in this lifecycle state (e.g. quarantined)."),
        output: str = typer.Option("table", "--output", "-o", help="table | wide | json"),
        server: str = ServerOpt, token: str = TokenOpt) -> None:
    """List nodes, replicas or recent intents of a controller."""
    res = _check(resource, RESOURCES, "resource") or ""
    st = _check(state, STATES, "state")
    out = _check(output, OUTPUTS, "output format")
    c = _Client(server, token)
    if res == "pools":
        _pools(c.call("GET", "/api/v1/pools"), out)
        return
    if res == "intents":
        body = c.call("GET", "/api/v1/intents")
        rows_i = body["intents"]
        if out == "json":
            typer.echo(json.dumps(rows_i, indent=2))
            return
        header = ["AGE", "INTENT", "ENTITY", "REASON"] + (["TIER", "POLICY"] if out == "wide" else [])
        _table([[_ago(body["ts"], i.get("ts")), str(i.get("intent")), str(i.get("entity")), str(i.get("reason"))]
                + ([str(i.get("tier") or "-"), str(i.get("policy_version") or "-")] if out == "wide" else [])
                for i in rows_i], header)
        return
    kind = res.removesuffix("s")
    states = c.call("GET", "/api/v1/states", params={"kind": kind})
    ents = [e for e in states["entities"] if st is None or str(e.get("state")) == st]
    if out == "json":
        typer.echo(json.dumps({"ts": states["ts"], "frozen": states["frozen"], "entities": ents}, indent=2))
        return
    header = ["NAME", "STATE", "HEALTH", "CONFIDENCE", "REASON", "SINCE"]
    if out == "wide":
        header += ["POOL", "WEIGHT", "TRANSITIONS"]
    rows = []
    for e in sorted(ents, key=lambda e: str(e["entity"])):
        healthy = _healthy(e.get("last_value"), e.get("state"))
        row = [str(e["entity"]), str(e.get("state")), _r(e.get("last_value")), _r(e.get("last_confidence")),
               "-" if healthy else str(e.get("last_reason") or "-"), _ago(states["ts"], e.get("since"))]
        if out == "wide":
            row += [str(e.get("labels", {}).get("pool", "default")), _r(e.get("weight")) if e.get("weight") is not None
                    else "-", str(e.get("transitions", 0))]
        rows.append(row)
    if states.get("frozen"):
        typer.echo("remediation frozen: fleet-wide confidence is low (a telemetry problem)")
    _table(rows, header)


def _pools(body: dict[str, Any], out: str | None) -> None:
    """The per-pool fleet summary: KPIs since the controller started."""
    from fleethealth.review.kpis import summary_table

    if out == "json":
        typer.echo(json.dumps(body, indent=2))
        return
    pools = body.get("pools") or {}
    if not pools:
        typer.echo("no cycle yet")
        return
    rows = summary_table(pools)
    if out != "wide":  # the narrow table: the figures compared before and after an upgrade
        keep = [0, 1, 2, 3, 4, 5, 7, 8]
        rows = [[r[i] for i in keep] for r in rows]
    since, ts = body.get("since"), body.get("ts")
    if since is not None and ts is not None:
        typer.echo(f"over the last {_ago(ts, since)} (since the controller started)")
    _table([r for r in rows[1:]], [h.upper() for h in rows[0]])


def describe(resource: str = typer.Argument(..., help="node | replica"), name: str = typer.Argument(...),
             output: str = typer.Option("table", "--output", "-o", help="table | json"),
             server: str = ServerOpt, token: str = TokenOpt) -> None:
    """A node or replica: its tuple, the explain tree, recent transitions and intents, runbooks."""
    _check(resource, ("node", "replica"), "resource")
    out = _check(output, ("table", "json"), "output format")
    c = _Client(server, token)
    health = c.call("GET", "/api/v1/health", params={"entity": name, "details": 1})
    states = c.call("GET", "/api/v1/states")
    st = next((e for e in states["entities"] if e["entity"] == name), None)
    trs = [t for t in c.call("GET", "/api/v1/transitions")["transitions"] if t["entity"] == name][-10:]
    ints = c.call("GET", "/api/v1/intents", params={"entity": name})["intents"][-10:]
    t = health["tuples"][0] if health["tuples"] else {}
    members: list[dict[str, Any]] = []
    if t.get("kind", resource) == "node":
        gpus = c.call("GET", "/api/v1/health", params={"kind": "gpu", "node": name, "details": 1})["tuples"]
        members = sorted((g for g in gpus if str(g.get("entity", "")).split("/")[0] == name
                          and not _healthy(g.get("value"), "READY")), key=lambda g: str(g.get("entity")))
    width = max((len(str(g.get("entity"))) for g in members), default=0)
    if out == "json":
        typer.echo(json.dumps({"health": t, "state": st, "transitions": trs, "intents": ints,
                               "members_below_1": members}, indent=2))
        return
    reason = str(t.get("reason") or "")
    healthy = _healthy(t.get("value"), (st or {}).get("state"))
    typer.echo(f"Name:        {name}")
    typer.echo(f"Kind:        {t.get('kind', resource)}")
    typer.echo(f"State:       {(st or {}).get('state', 'unknown')}"
               f" (since {_ago(states['ts'], (st or {}).get('since'))} ago)")
    typer.echo(f"Health:      {_r(t.get('value'))}   confidence {_r(t.get('confidence'))}")
    if not healthy:
        typer.echo(f"Reason:      {reason or '-'}   worst category {t.get('worst') or '-'}")
        if (link := url(reason_path(reason))) is not None:
            typer.echo(f"Runbook:     {link}")
    details = t.get("details") or t.get("signals") or []
    if details:
        typer.echo("Signals:")
        for d in details if isinstance(details, list) else []:
            if isinstance(d, dict):
                typer.echo(_signal_line(d))
    if members:
        typer.echo("GPUs below 1:")
    for g in members:  # a node's GPUs below 1 (or unknown) and their signals below 1, as the entity page
        low = ", ".join(f"{d.get('signal')} {_r(d.get('score'))}" for d in g.get("details") or []
                        if isinstance(d, dict) and isinstance(d.get("score"), (int, float)) and d["score"] < 1.0)
        typer.echo(f"  {str(g.get('entity')):<{width}} health {_r(g.get('value'))}  {g.get('reason') or '-'}"
                   f"{'  ' + low if low else ''}")
    if (hold := (st or {}).get("version_hold_detail")):  # a suspect version's incident holds it (decide.safety)
        since = f" (opened {_ago(states['ts'], hold.get('opened'))} ago)" if hold.get("opened") is not None else ""
        typer.echo(f"Held by:     version incident {hold.get('incident')}{since}: its {hold.get('version')} is "
                   "suspect, so its failures are the version's, not the node's")
        if hold.get("retesting"):
            typer.echo("  retest under the hold: out")
        elif hold.get("retest_failed"):
            typer.echo("  retest under the hold: failed (counted for the version; the node stays held)")
        typer.echo(f"  released by: {hold.get('releases')}")
    rep = (st or {}).get("repair")
    if rep:
        typer.echo(f"Repair:      ladder {rep.get('ladder')}, step {int(rep.get('step', 0)) + 1}, {rep.get('phase')}"
                   f" (since {_ago(states['ts'], rep.get('since'))} ago)")
        for h in rep.get("history", []):
            typer.echo(f"  {_ago(states['ts'], h.get('ts')):>6} ago  {h.get('action')}: {h.get('result')}")
        if rep.get("waiting"):  # a held step: its precondition or the repair budget
            typer.echo(f"  waiting: {rep['waiting']}")
    typer.echo("Transitions:" if trs else "Transitions: none recent")
    for tr in trs:
        # into READY the reason code is only the least good category of a healthy score: say healthy
        why = (f"healthy ({_r(tr.get('value'))})" if tr["to"] == "READY" and tr.get("value") is not None
               else "healthy" if tr["to"] == "READY" else tr["reason"])
        typer.echo(f"  {_ago(states['ts'], tr['ts']):>6} ago  {tr['from']} -> {tr['to']}  {why}")
    typer.echo("Intents:" if ints else "Intents:     none recent")
    for i in ints:
        typer.echo(f"  {_ago(states['ts'], i['ts']):>6} ago  {i['intent']}  {i['reason']}")
    books = sorted({str(i["intent"]) for i in ints})
    if books:
        typer.echo("Runbooks:")
        for kind in books:
            typer.echo(f"  {kind:<18} {url(intent_path(kind))}")
    typer.echo(f"Page:        {c.server}/entity/{name} (timeline, evidence, runbooks)")


def _event(name: str, to: str | None, reason: str, server: str | None, token: str | None) -> None:
    c = _Client(server, token)
    body = c.call("POST", "/api/v1/events",
                  json={"kind": "ack", "entity": name, **({"to": to} if to else {}), "payload": {"reason": reason}})
    acc = body.get("accepted", {})
    typer.echo(f"{name}: accepted ({'to ' + to if to else 'acknowledged'}) by {acc.get('actor') or 'the controller'}")


ReasonOpt = typer.Option(..., "--reason", help="Why (kept with the event and in the audit log).")


def ack(node: str, reason: str = ReasonOpt, server: str = ServerOpt, token: str = TokenOpt) -> None:
    """Acknowledge an entity (a human has it; holds it where it is)."""
    _event(node, None, reason, server, token)


def ready(node: str, reason: str = ReasonOpt, server: str = ServerOpt, token: str = TokenOpt) -> None:
    """Return a quarantined or FAILED entity to READY."""
    _event(node, "READY", reason, server, token)


def quarantine(node: str, reason: str = ReasonOpt, server: str = ServerOpt, token: str = TokenOpt) -> None:
    """Hold a FAILED entity in QUARANTINED (the lifecycle takes a human quarantine from FAILED only)."""
    states = _Client(server, token).call("GET", "/api/v1/states")
    st = next((str(e["state"]) for e in states["entities"] if e["entity"] == node), None)
    if st is None:
        fail(f"no entity {node!r}", 1)
    if st != "FAILED":
        err_console.print(f"note: {node} is {st}; the lifecycle takes a human quarantine from FAILED only, "
                          "so the controller records the acknowledgement and the state stays")
    _event(node, "QUARANTINED", reason, server, token)


def kill(reason: str = typer.Option("via the fleethealth client", "--reason"), server: str = ServerOpt,
         token: str = TokenOpt) -> None:
    """Engage the kill switch: stop all actuation at once."""
    body = _Client(server, token).call("POST", "/api/v1/kill", content=reason.encode())
    typer.echo("kill switch engaged: nothing is carried out until resume" if body.get("killed") else str(body))


def resume(server: str = ServerOpt, token: str = TokenOpt) -> None:
    """Release the kill switch."""
    body = _Client(server, token).call("POST", "/api/v1/resume")
    typer.echo("actuation resumed" if not body.get("killed") else "still killed (the config sets kill_switch)")


def register(app: typer.Typer) -> None:
    for f in (get, describe, ack, ready, quarantine, kill, resume):
        app.command(f.__name__)(f)

"""Pages as incidents: one condition, one page, updated while it lasts and resolved when it ends. Pure.

Theory of operation
-------------------
A condition a human must look at (a quarantine budget exhausted in a pool, a tensor-parallel group at
its isolation limit, a suspect driver or build, a job crashing on many nodes, a failure domain degrading)
is *asserted* by the decider on every cycle in which it holds, under a stable key (``budget:node:a100``,
``version:node:driver_version=575.1``). The first assertion opens an incident and emits one PAGE with
``state: firing``. Later assertions only refresh it; when what the page says changes materially (its
*signature*: e.g. how many nodes wait), an ``update`` PAGE is emitted, at most once per
``budgets.incident_update_s``. When no cycle has asserted the condition for ``budgets.incident_clear_s``,
one ``resolved`` PAGE closes it. Entity, reason and the identifying params (pool, kind, tp_group, ...) are
the firing page's, so Alertmanager resolves the alert it received (its label set is built from them).

Only ``firing`` pages are new pages: the backtest and the monthly review count those. While the fleet's
telemetry is frozen (fleet confidence), no incident resolves: nothing is known about the condition.

Durability: the open incidents live in ``DecisionState.incidents`` (JSON-safe), and each also leaves
``pages["incident:<key>"] = opened`` so that a store that keeps only the pages table still knows after a
restart that the incident is open; the record is then adopted again, without a second page, at the next
assertion (and dropped silently if none comes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MARK = "incident:"
FIRING, UPDATE, RESOLVED = "firing", "update", "resolved"

Page = tuple[str, str, dict[str, Any]]  # entity, reason, params of a PAGE intent to emit


def assert_incident(incidents: dict[str, dict[str, Any]], pages: dict[str, float], key: str, entity: str,
                    reason: str, params: dict[str, Any], sig: Any, now: float, update_s: float) -> Page | None:
    """The condition ``key`` holds at ``now``. Returns the PAGE to emit (firing or update), if any.
    ``sig``: a JSON-safe summary of what the page says; a change is an update."""
    rec = incidents.get(key)
    if rec is None:
        adopted = MARK + key in pages  # open before a restart that lost the record: no second page
        opened = pages.get(MARK + key, now)
        incidents[key] = {"entity": entity, "reason": reason, "params": dict(params), "sig": sig,
                          "opened": opened, "seen": now, "sent": opened, "updates": 0}
        pages[MARK + key] = opened
        if adopted:
            return None
        return entity, reason, {**params, "state": FIRING, "incident": key, "opened": opened}
    rec["seen"] = now
    pages[MARK + key] = rec["opened"]
    if sig == rec["sig"] or now - rec["sent"] < update_s:
        return None
    rec["sig"], rec["sent"] = sig, now
    rec["updates"] = int(rec["updates"]) + 1
    kept = {**params, **{k: v for k, v in rec["params"].items() if k in IDENTITY}}
    return rec["entity"], rec["reason"], {**kept, "state": UPDATE, "incident": key, "opened": rec["opened"],
                                          "updates": rec["updates"]}


# Params that name the alert (Alertmanager label set): kept from the firing page on updates and resolves.
IDENTITY = frozenset({"severity", "pool", "kind", "tp_group", "version_label", "version", "domain",
                      "domain_label", "job", "label", "value", "page_kind"})


def close_stale(incidents: dict[str, dict[str, Any]], pages: dict[str, float], now: float, clear_s: float,
                frozen: bool) -> list[Page]:
    """Resolve the incidents not asserted for ``clear_s`` (none while frozen); drop orphaned marks."""
    out: list[Page] = []
    if frozen:
        return out
    for key in sorted(incidents):
        rec = incidents[key]
        if now - rec["seen"] < clear_s:
            continue
        del incidents[key]
        pages.pop(MARK + key, None)
        ident = {k: v for k, v in rec["params"].items() if k in IDENTITY}
        out.append((rec["entity"], rec["reason"],
                    {**ident, "state": RESOLVED, "incident": key, "opened": rec["opened"],
                     "open_s": round(now - rec["opened"], 3), "updates": rec["updates"]}))
    for k in [k for k in pages if k.startswith(MARK) and k[len(MARK):] not in incidents]:
        if now - pages[k] >= clear_s:
            del pages[k]  # a mark from before a restart whose condition never came back
    return out


def refresh(incidents: dict[str, dict[str, Any]], key: str, now: float) -> None:
    """The condition still holds but there is nothing new to say (an open incident stays open)."""
    rec = incidents.get(key)
    if rec is not None:
        rec["seen"] = now


def is_new_page(params: dict[str, Any]) -> bool:
    """A PAGE that tells a human something new (not an incident's update or resolution)."""
    return str(params.get("state", FIRING)).lower() not in (UPDATE, RESOLVED)


def is_ticket(params: dict[str, Any]) -> bool:
    """A PAGE of severity ``ticket`` (a chronic node's, a job's): work for the day shift, nobody woken."""
    return str(params.get("severity", "page")) == "ticket"


def open_keys(incidents: dict[str, dict[str, Any]]) -> Iterable[str]:
    return sorted(incidents)

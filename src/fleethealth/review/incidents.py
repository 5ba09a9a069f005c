"""The monthly review: what the controller did over a period, read back from its own state store.

Theory of operation
-------------------
The store keeps every lifecycle transition and every intent the controller emitted. This module turns
those rows (plain dicts, as ``StateStore.transitions()`` and ``StateStore.intents()`` return them, so any
backend works) into *incidents* and the figures the policy is tuned against. It is pure: the rows, the
operator's labels and the period come in as arguments, a ``Review`` comes out.

An **incident** is one episode of one entity: it opens on the first transition out of a healthy state
(STARTING, WARMING, READY) into DEGRADED, DRAINING, QUARANTINED or FAILED, and closes on the next
transition into READY (or stays open at the end of the period). Its key, ``entity@start`` (start in unix
seconds), is stable, so an operator's label stays attached to it.

Each entry into QUARANTINED inside an incident has an **outcome**, read from what left the quarantine:

* ``confirmed``: the active test failed, or the entity recovered too often (FAILED), or the quarantine was
  entered on a hard gate (``gate:*``: the hardware itself reported the fault, so passing the test after a
  reset shows the repair worked, not that the quarantine was wrong), or an operator labelled it so;
* ``cleared``: the active test passed on a quarantine that no gate had asked for: nothing was found;
* ``released``: a human let it out (``human_ready``) without a test;
* ``false``: an operator labelled the incident a false alarm (this overrides the above);
* ``pending``: still quarantined at the end of the period.

**Live quarantine precision** is confirmed / (confirmed + cleared + released + false); pending ones are
left out, and it is None (printed n/a) when no quarantine was decided. **Detection time** is from the
incident's start (or the onset an operator labelled) to the first isolation (DRAINING or QUARANTINED);
**repair time** from the first isolation to READY. A **flap** is a return to the state an entity left,
within ``flap_window_s`` (A -> B -> A); the return transition is counted. Pages are PAGE intents, counted
per reason; a budget exhaustion is a page with reason ``budget_exhausted`` or a soft intent (a fallback
taken because a budget or a freeze held the hard action back).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleethealth.decide.incidents import is_new_page

HEALTHY = frozenset({"STARTING", "WARMING", "READY"})
ISOLATED = frozenset({"DRAINING", "QUARANTINED"})
OUTCOMES = ("confirmed", "cleared", "released", "false", "pending")
LABELS = ("confirmed", "false")


@dataclass(frozen=True, slots=True)
class IncidentLabel:
    """An operator's verdict on one incident."""

    key: str
    label: str  # confirmed | false
    cause: str = ""
    by: str = ""
    ts: float = 0.0
    onset: float | None = None  # when the fault really began, if the operator knows

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label, "cause": self.cause, "by": self.by, "ts": self.ts,
                "onset": self.onset}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> IncidentLabel:
        onset = d.get("onset")
        return IncidentLabel(str(d["key"]), str(d["label"]), str(d.get("cause") or ""), str(d.get("by") or ""),
                             float(d.get("ts") or 0.0), None if onset is None else float(onset))


@dataclass(slots=True)
class Quarantine:
    ts: float
    reason: str
    outcome: str
    left_ts: float | None = None
    left_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "reason": self.reason, "outcome": self.outcome, "left_ts": self.left_ts,
                "left_reason": self.left_reason}


@dataclass(slots=True)
class Incident:
    key: str
    entity: str
    kind: str
    pool: str
    start: float
    reason: str
    end: float | None = None
    path: list[str] = field(default_factory=list)  # states visited, in order
    isolated_at: float | None = None
    quarantines: list[Quarantine] = field(default_factory=list)
    label: IncidentLabel | None = None

    @property
    def outcome(self) -> str:
        """The incident's verdict: an operator's label first, then its last decided quarantine."""
        if self.label is not None:
            return self.label.label
        decided = [q.outcome for q in self.quarantines if q.outcome != "pending"]
        if decided:
            return "confirmed" if "confirmed" in decided else decided[-1]
        if self.quarantines:
            return "pending"
        return "not_quarantined"

    @property
    def detect_s(self) -> float | None:
        if self.isolated_at is None:
            return None
        onset = self.label.onset if self.label is not None and self.label.onset is not None else self.start
        return max(0.0, self.isolated_at - onset)

    @property
    def repair_s(self) -> float | None:
        if self.isolated_at is None or self.end is None:
            return None
        return self.end - self.isolated_at

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "entity": self.entity, "kind": self.kind, "pool": self.pool,
                "start": self.start, "end": self.end, "reason": self.reason, "path": list(self.path),
                "isolated_at": self.isolated_at, "outcome": self.outcome, "detect_s": self.detect_s,
                "repair_s": self.repair_s, "quarantines": [q.to_dict() for q in self.quarantines],
                "label": None if self.label is None else self.label.to_dict()}


@dataclass(frozen=True, slots=True)
class Figures:
    """The review's figures over a set of incidents (the whole period, one pool or one reason)."""

    incidents: int
    quarantines: int
    outcomes: dict[str, int]
    precision: float | None
    detect_median_s: float | None
    detect_p90_s: float | None
    repair_median_s: float | None
    repair_p90_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"incidents": self.incidents, "quarantines": self.quarantines, "outcomes": dict(self.outcomes),
                "precision": self.precision, "detect_median_s": self.detect_median_s,
                "detect_p90_s": self.detect_p90_s, "repair_median_s": self.repair_median_s,
                "repair_p90_s": self.repair_p90_s}


@dataclass(slots=True)
class Review:
    since: float | None
    until: float | None
    incidents: list[Incident]
    overall: Figures
    by_pool: dict[str, Figures]
    by_reason: dict[str, Figures]
    flaps: int
    flaps_by_entity: dict[str, int]
    transitions: int
    pages: dict[str, int]
    budget_exhaustions: int
    soft_intents: int
    intents: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since, "until": self.until, "overall": self.overall.to_dict(),
            "by_pool": {k: v.to_dict() for k, v in sorted(self.by_pool.items())},
            "by_reason": {k: v.to_dict() for k, v in sorted(self.by_reason.items())},
            "flaps": self.flaps, "flaps_by_entity": dict(sorted(self.flaps_by_entity.items())),
            "transitions": self.transitions, "pages": dict(sorted(self.pages.items())),
            "budget_exhaustions": self.budget_exhaustions, "soft_intents": self.soft_intents,
            "intents": dict(sorted(self.intents.items())),
            "incidents": [i.to_dict() for i in self.incidents],
        }


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def figures(incidents: Iterable[Incident]) -> Figures:
    incs = list(incidents)
    outcomes: Counter[str] = Counter()
    for inc in incs:
        if inc.label is not None and inc.quarantines:
            # an operator's verdict speaks for every quarantine of the incident
            outcomes[inc.label.label] += len(inc.quarantines)
        else:
            outcomes.update(q.outcome for q in inc.quarantines)
    decided = sum(n for o, n in outcomes.items() if o != "pending")
    detect = [d for d in (i.detect_s for i in incs) if d is not None]
    repair = [r for r in (i.repair_s for i in incs) if r is not None]
    return Figures(
        incidents=len(incs), quarantines=sum(len(i.quarantines) for i in incs),
        outcomes={o: outcomes.get(o, 0) for o in OUTCOMES},
        precision=None if decided == 0 else outcomes.get("confirmed", 0) / decided,
        detect_median_s=None if not detect else statistics.median(detect), detect_p90_s=_quantile(detect, 0.9),
        repair_median_s=None if not repair else statistics.median(repair), repair_p90_s=_quantile(repair, 0.9),
    )


def _condition(row: Mapping[str, Any]) -> str:
    """The lifecycle rule's condition that fired (the first word of a transition's detail)."""
    detail = str(row.get("detail") or "")
    return detail.split(" ", 1)[0] if detail else str(row.get("reason", ""))


def _quarantine_outcome(entry_reason: str, left_to: str | None, left_cond: str) -> str:
    if left_to is None:
        return "pending"
    if left_to == "FAILED":
        return "confirmed"
    if entry_reason.startswith("gate:"):
        return "confirmed"
    if left_cond == "human_ready" or left_to == "READY":
        return "released"
    return "cleared"


def build_incidents(transitions: Iterable[Mapping[str, Any]], pools: Mapping[str, str] | None = None,
                    labels: Mapping[str, IncidentLabel] | None = None) -> list[Incident]:
    """Incidents from transition rows (``ts, entity, kind, from, to, reason``), in start order."""
    pools = pools or {}
    labels = labels or {}
    per_entity: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for t in transitions:
        per_entity[str(t["entity"])].append(t)
    out: list[Incident] = []
    for entity, rows in per_entity.items():
        rows.sort(key=lambda r: float(r["ts"]))
        cur: Incident | None = None
        open_q: Quarantine | None = None
        for r in rows:
            ts, src, dst, reason = float(r["ts"]), str(r["from"]), str(r["to"]), str(r["reason"])
            if cur is None:
                if src in HEALTHY and dst not in HEALTHY:
                    start = int(ts)
                    cur = Incident(key=f"{entity}@{start}", entity=entity, kind=str(r.get("kind", "")),
                                   pool=pools.get(entity, "default"), start=ts, reason=reason, path=[src])
                else:
                    continue
            if open_q is not None and src == "QUARANTINED":
                open_q.left_ts, open_q.left_reason = ts, reason
                open_q.outcome = _quarantine_outcome(open_q.reason, dst, _condition(r))
                open_q = None
            cur.path.append(dst)
            if dst in ISOLATED and cur.isolated_at is None:
                cur.isolated_at = ts
            if dst == "QUARANTINED":
                open_q = Quarantine(ts=ts, reason=reason, outcome="pending")
                cur.quarantines.append(open_q)
            if dst == "READY":
                cur.end = ts
                cur.label = labels.get(cur.key)
                out.append(cur)
                cur, open_q = None, None
        if cur is not None:
            cur.label = labels.get(cur.key)
            out.append(cur)
    out.sort(key=lambda i: (i.start, i.entity))
    return out


def count_flaps(transitions: Iterable[Mapping[str, Any]], window_s: float) -> dict[str, int]:
    """Returns to the state just left within ``window_s`` (A -> B, then B -> A), per entity."""
    last: dict[str, tuple[str, str, float]] = {}  # entity -> (from, to, ts) of its previous transition
    flaps: Counter[str] = Counter()
    for t in sorted(transitions, key=lambda r: float(r["ts"])):
        e, src, dst, ts = str(t["entity"]), str(t["from"]), str(t["to"]), float(t["ts"])
        prev = last.get(e)
        if prev is not None and prev[1] == src and prev[0] == dst and ts - prev[2] <= window_s:
            flaps[e] += 1
        last[e] = (src, dst, ts)
    return dict(flaps)


def review(transitions: Iterable[Mapping[str, Any]], intents: Iterable[Mapping[str, Any]], *,
           since: float | None = None, until: float | None = None, pools: Mapping[str, str] | None = None,
           labels: Iterable[IncidentLabel] = (), flap_window_s: float = 3600.0) -> Review:
    """The period's review. Incidents are those that started inside [since, until]; flaps, pages and
    intents are counted inside it too."""

    def inside(ts: float) -> bool:
        return (since is None or ts >= since) and (until is None or ts <= until)

    rows = [t for t in transitions if until is None or float(t["ts"]) <= until]
    label_map = {lb.key: lb for lb in labels}
    incs = [i for i in build_incidents(rows, pools, label_map) if inside(i.start)]
    in_period = [t for t in rows if inside(float(t["ts"]))]
    flaps = count_flaps(in_period, flap_window_s)
    ints = [i for i in intents if inside(float(i["ts"]))]
    # an incident's updates and its resolution are not new pages (decide.incidents)
    pages = Counter(str(i["reason"]) for i in ints if str(i.get("intent", i.get("kind"))) == "page"
                    and is_new_page(dict(i.get("params") or {})))
    soft = sum(1 for i in ints if i.get("soft"))
    by_pool: dict[str, list[Incident]] = defaultdict(list)
    by_reason: dict[str, list[Incident]] = defaultdict(list)
    for inc in incs:
        by_pool[inc.pool].append(inc)
        by_reason[reason_family(inc.reason)].append(inc)
    return Review(
        since=since, until=until, incidents=incs, overall=figures(incs),
        by_pool={k: figures(v) for k, v in by_pool.items()},
        by_reason={k: figures(v) for k, v in by_reason.items()},
        flaps=sum(flaps.values()), flaps_by_entity=flaps, transitions=len(in_period), pages=dict(pages),
        budget_exhaustions=pages.get("budget_exhausted", 0) + soft, soft_intents=soft,
        intents=dict(Counter(str(i.get("intent", i.get("kind"))) for i in ints)),
    )


def reason_family(reason: str) -> str:
    """``gate:xid:79`` -> ``gate:xid``; ``min:performance`` -> ``min:performance``; ``below_degraded`` as is."""
    parts = reason.split(":")
    return ":".join(parts[:2]) if len(parts) > 1 else reason

"""Scoring an arm's decisions against ground truth. Pure functions over plain data.

Definitions (also in the README's backtest section):

* **Quarantine**: an entity (node or replica) entering QUARANTINED; counted once per entity and episode.
  It is a *true positive* when ground truth says an entity on the same node (the node, one of its GPUs,
  or a replica on it) is faulty with expected action ``quarantine`` and that fault was active at the time
  (or ended less than ``grace_s`` before). A quarantine of a node whose truth is ``schedule_reset`` (a
  pending row remap: reset, do not repair) is *false*. Quarantines of members of a correlated event
  (truth ``group`` on a faulty entity, e.g. a bad driver rollout) are judged as a group, not one by one:
  they are neither true nor false positives; the group's check is that the budget held (each quarantine
  against the budget it spent: a transition whose detail names ``budget:physical`` (physical evidence,
  ``decide.safety``) spends the physical budget, a confirmed hard gate's reason, ``budgets.hard_gates``, the
  hard-gate budget, any other the rate budget) and a human was
  paged about the event (a page for an exhausted budget, a suspect version or a TP-group limit; a page for
  one node failing its active test does not count). Quarantining a replica of a regressed build (truth
  ``group`` but not faulty) is false.
* **precision** = true / (true + false) quarantines; **None (shown n/a) when there were no quarantines**
  (nothing to be right or wrong about; a miss shows in recall, a quiet run's target is no quarantine);
  1.0 when every quarantine belonged to a correlated event (judged as a group, below). **recall** = caught incidents / incidents due a quarantine; **1.0 when
  none was due**. An incident is one injected fault on one node (its node, GPU and replica truth rows
  together); it is caught when an entity of it is quarantined while it is active.
* **detection_s**: median over incidents that expect an action of the time from onset to the first
  response: DEGRADED, DRAINING, QUARANTINED or FAILED, a router weight lowered below 1, or a remediation
  intent (quarantine, drain, reset, rebuild, limit concurrency, reject request, no new work, active
  test); for incidents whose expected action is a page, also a PAGE. **removal_s**: median time from
  onset to QUARANTINED (or DRAINING) of the node or of any replica on it over caught incidents, per episode: an incident's removal is
  the first one while it is active, so an entity's second fault has its own removal time. None when there is nothing to take a median of.
* **flaps_per_node_day**: flaps of node lifecycles per node per simulated day; replicas likewise in
  ``flaps_per_replica_day``. A *flap* is a transition that takes an entity back to the state it left by
  its previous transition, less than ``FLAP_WINDOW_S`` (1 h) after it (READY -> DEGRADED -> READY inside
  an hour: one flap). Remediation that runs its course (READY -> QUARANTINED -> RECOVERING -> READY) is
  no flap, nor is a slow return (a day in DEGRADED), nor the way out of STARTING and WARMING.
  **transitions_per_node_day** / ``transitions_per_replica_day``: all transitions after warm-up.
* **pages**: PAGE intents that open something (an incident's ``update`` and ``resolved`` pages are not
  new pages: decide.incidents), not counting tickets; **tickets**: those of severity ``ticket`` (a chronic
  node's or a job's ticket: work for the day shift, nobody woken); **budget_exhaustions**: pages whose
  reason is ``budget_exhausted``.
* **job_slowdown_gpu_h** (printed "job GPU-h lost, slow undetected"; old key ``gpu_hours_lost``, kept as an
  alias): the seed's arithmetic. A synchronous job runs at its slowest rank's pace, so while a truly faulty
  node's ranks run x% slow and that node is not yet removed, the job loses x% of its GPU-hours (the job's
  slowdown is its slowest faulty node's). ``job_slowdown_gpu_h_if_undetected`` (old
  ``gpu_hours_lost_if_undetected``): the same had no node ever been removed. Not the fleet KPI "node
  GPU-hours lost" (review.kpis: the GPU-hours of nodes isolated, of unknown health or DEGRADED), which
  counts what removing a node costs, where this counts what leaving it in costs.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleethealth.backtest.arms import ArmLog
from fleethealth.decide.decider import is_hard_gate_reason
from fleethealth.decide.incidents import is_new_page, is_ticket
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.safety import PHYSICAL_BUDGET_NOTE
from fleethealth.policy import Policy
from fleethealth.sim.truth import GroundTruth

REMOVAL_STATES = frozenset({State.QUARANTINED, State.DRAINING})
RESPONSE_STATES = frozenset({State.DEGRADED, State.DRAINING, State.QUARANTINED, State.FAILED})
RESPONSE_INTENTS = frozenset({
    IntentKind.QUARANTINE, IntentKind.DRAIN, IntentKind.SCHEDULE_RESET, IntentKind.REBUILD_WORKER,
    IntentKind.LIMIT_CONCURRENCY, IntentKind.REJECT_REQUEST, IntentKind.NO_NEW_WORK, IntentKind.RUN_ACTIVE_TEST,
})
ACTION_INTENT = {
    "schedule_reset": IntentKind.SCHEDULE_RESET, "reject_request": IntentKind.REJECT_REQUEST,
    "limit_concurrency": IntentKind.LIMIT_CONCURRENCY, "rebuild_worker": IntentKind.REBUILD_WORKER,
    "page": IntentKind.PAGE,
}
WARMUP_STATES = frozenset({State.STARTING, State.WARMING})
_RANK = {"none": 0, "quarantine": 4, "schedule_reset": 3, "page": 2}
# Pages about a correlated event (as opposed to one node failing its active test).
CORRELATED_PAGES = frozenset({"budget_exhausted", "version_correlation", "tp_group_limit", "domain_correlation"})


FLAP_WINDOW_S = 3600.0
DEFAULT_POOL = "default"  # the decider's pool of a node without a pool label


def flap_counts(transitions: Iterable[Any], window_s: float = FLAP_WINDOW_S) -> dict[str, int]:
    """Flaps per entity: transitions back to the state the previous transition left, within
    ``window_s`` of it (warm-up transitions excluded)."""
    last: dict[str, Any] = {}
    out: dict[str, int] = defaultdict(int)
    for tr in sorted(transitions, key=lambda x: x.ts):
        if tr.from_state in WARMUP_STATES:
            last.pop(tr.entity, None)
            continue
        prev = last.get(tr.entity)
        if prev is not None and tr.to_state == prev.from_state and tr.ts - prev.ts < window_s:
            out[tr.entity] += 1
        last[tr.entity] = tr
    return dict(out)


@dataclass(slots=True)
class Incident:
    """One injected fault on one node, with what each arm did about it."""

    fault: str
    node: str
    entities: set[str]  # node, GPUs, replicas named by the truth rows
    onset: float
    end: float | None
    expected: str
    faulty: bool
    group: str | None
    detail: str = ""

    def active(self, t: float, grace_s: float = 0.0) -> bool:
        return t >= self.onset and (self.end is None or t < self.end + grace_s)


@dataclass(slots=True)
class IncidentOutcome:
    incident: Incident
    response_s: float | None
    removal_s: float | None
    action_ok: bool
    how: str  # what the arm did first (state or intent), for the report


@dataclass(slots=True)
class ArmScore:
    name: str
    metrics: dict[str, Any]
    outcomes: list[IncidentOutcome] = field(default_factory=list)
    false_quarantines: list[tuple[float, str, str]] = field(default_factory=list)  # (ts, entity, why false)


def node_of(entity: str, replica_node: dict[str, str]) -> str:
    if entity in replica_node:
        return replica_node[entity]
    return entity.split("/")[0]


def incidents(truths: Iterable[GroundTruth], replica_node: dict[str, str]) -> list[Incident]:
    """Truth rows grouped into incidents: one per (fault, onset, node)."""
    out: dict[tuple[str, float, str], Incident] = {}
    for g in truths:
        node = node_of(g.entity, replica_node)
        key = (g.fault, g.onset, node)
        inc = out.get(key)
        if inc is None:
            out[key] = Incident(g.fault, node, {g.entity}, g.onset, g.end, g.expected_action, g.faulty, g.group,
                                g.detail)
            continue
        inc.entities.add(g.entity)
        # one fault's rows on one node may differ (a build regression: the replica wants a page, its node
        # nothing; an OOM device fault: replica, GPU and node): the incident takes the strongest
        if _RANK.get(g.expected_action, 1) > _RANK.get(inc.expected, 1):
            inc.expected = g.expected_action
        inc.faulty = inc.faulty or g.faulty
        inc.group = inc.group or g.group
    return sorted(out.values(), key=lambda i: (i.onset, i.node, i.fault))


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def score_arm(
    log: ArmLog,
    truths: Sequence[GroundTruth],
    *,
    replica_node: dict[str, str],
    nodes: Sequence[str],
    node_pool: dict[str, str],
    start: float,
    end: float,
    policy: Policy,
    slow: Sequence[Any] = (),
    step_s: float = 15.0,
    grace_s: float = 1800.0,
) -> ArmScore:
    incs = incidents(truths, replica_node)
    days = max((end - start) / 86400.0, 1e-9)

    # quarantine episodes: (ts, entity) on entry into QUARANTINED
    quarantines: list[tuple[float, str]] = []
    first_removed: dict[str, float] = {}
    removed_times: dict[str, list[float]] = defaultdict(list)
    hard_q: set[tuple[float, str]] = set()  # quarantines that spent the hard-gate budget
    physical_q: set[tuple[float, str]] = set()  # ... the physical-evidence budget (decide.safety)
    for tr in log.transitions:
        if tr.to_state == State.QUARANTINED and tr.from_state != State.QUARANTINED:
            quarantines.append((tr.ts, tr.entity))
            if PHYSICAL_BUDGET_NOTE in tr.detail.split():
                physical_q.add((tr.ts, tr.entity))
            elif is_hard_gate_reason(tr.reason, policy):
                hard_q.add((tr.ts, tr.entity))
        if tr.to_state in REMOVAL_STATES:
            first_removed.setdefault(tr.entity, tr.ts)
            removed_times[tr.entity].append(tr.ts)  # every episode's removal, not only the first
            if tr.entity in replica_node:
                # a replica taken out of service removes its node's fault from serving, whether or not
                # the truth rows name that replica (a GPU fault's rows name the node and the GPU only)
                removed_times[replica_node[tr.entity]].append(tr.ts)

    tp = fp = grouped = 0
    false_q: list[tuple[float, str, str]] = []
    group_q: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for ts, ent in quarantines:
        node = node_of(ent, replica_node)
        here = [i for i in incs if i.node == node and i.active(ts, grace_s)]
        if any(i.faulty and i.expected == "quarantine" and i.group is None for i in here):
            tp += 1
            continue
        # only faulty members of a correlated event are judged as a group (budget-bounded quarantines of
        # a bad driver rollout are fine); quarantining a replica of a regressed build is still false
        grp = next((i.group for i in here if i.group is not None and i.faulty), None)
        if grp is not None:
            grouped += 1
            group_q[grp].append((ts, ent))
            continue
        fp += 1
        why = "healthy"
        if any(i.expected == "schedule_reset" for i in here):
            why = "needs a reset, not a repair"
        elif here:
            why = f"not a hardware fault: {here[0].fault} ({here[0].detail or here[0].expected})"
        false_q.append((ts, ent, why))

    # responses per entity, time-ordered
    resp: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for tr in log.transitions:
        if tr.to_state in RESPONSE_STATES:
            resp[node_of(tr.entity, replica_node)].append((tr.ts, f"{tr.to_state}:{tr.reason}"))
            if tr.entity in replica_node:
                resp[tr.entity].append((tr.ts, f"{tr.to_state}:{tr.reason}"))
    pages: list[tuple[float, str]] = []
    tickets = 0
    intents_by: dict[tuple[str, IntentKind], list[float]] = defaultdict(list)
    for it in log.intents:
        if it.kind == IntentKind.PAGE and is_new_page(it.params):
            # an incident's updates and resolution are not new pages; a ticket (severity "ticket": work
            # for the day shift, nobody woken) is counted apart from the pages
            if is_ticket(it.params):
                tickets += 1
            else:
                pages.append((it.ts, it.reason))
        intents_by[(it.entity, it.kind)].append(it.ts)
        weight_down = it.kind == IntentKind.SET_WEIGHT and float(it.params.get("weight", 1.0) or 0.0) < 1.0
        if it.kind in RESPONSE_INTENTS or weight_down:
            resp[node_of(it.entity, replica_node)].append((it.ts, str(it.kind)))
            if it.entity in replica_node:
                resp[it.entity].append((it.ts, str(it.kind)))

    outcomes: list[IncidentOutcome] = []
    caught = due = 0
    for inc in incs:
        if inc.expected == "none":
            continue
        keys = {inc.node} | {e for e in inc.entities if e in replica_node}
        cand = sorted(x for k in keys for x in resp.get(k, []) if inc.active(x[0], grace_s))
        if inc.expected == "page":
            cand = sorted(cand + [p for p in pages if inc.active(p[0], grace_s)])
        first = cand[0] if cand else None
        removal = None
        # this incident's removal: the first one while it was active (a relapse's episode has its own)
        rem = [ts for e in keys for ts in removed_times.get(e, ()) if inc.active(ts, grace_s)]
        if rem:
            removal = min(rem) - inc.onset
        if inc.expected == "quarantine" and inc.faulty and inc.group is None:
            due += 1
            ok = any(inc.active(ts, grace_s) and node_of(e, replica_node) == inc.node for ts, e in quarantines)
            caught += ok
        elif inc.expected == "page":
            ok = any(inc.active(ts, grace_s) and (inc.group is None or r in CORRELATED_PAGES) for ts, r in pages)
        else:
            kind = ACTION_INTENT.get(inc.expected)
            ok = kind is not None and any(inc.active(ts, grace_s) for k in keys
                                          for ts in intents_by.get((k, kind), []))
            if inc.expected == "schedule_reset":
                ok = ok and not any(node_of(e, replica_node) == inc.node and inc.active(ts, grace_s)
                                    for ts, e in quarantines)
        outcomes.append(IncidentOutcome(inc, None if first is None else first[0] - inc.onset, removal, bool(ok),
                                        "" if first is None else first[1]))

    # correlated groups: budget held and a human paged
    def pool_of(node: str) -> str:
        # a node without a pool is in the decider's default pool, for its members, quarantines and size
        # alike (the members' pool and the quarantines' pool used different defaults, so a missing node's
        # quarantines were never counted against any budget)
        return node_pool.get(node, DEFAULT_POOL)

    groups: list[dict[str, Any]] = []
    for gname in sorted({i.group for i in incs if i.group is not None}):
        members = [i for i in incs if i.group == gname]
        onset = min(i.onset for i in members)
        pools = sorted({pool_of(i.node) for i in members})
        qs = sorted(group_q.get(gname, []))
        held = True
        b = policy.budgets
        for pool in pools:
            size = sum(1 for n in nodes if pool_of(n) == pool)
            # each quarantine is held to the budget it spent: confirmed hard gates and physical evidence
            # have their own
            for spent, allowed in (
                    ("rate", max(b.quarantine_min_per_hour, math.floor(b.quarantine_fraction_per_hour * size))),
                    ("hard", max(b.hard_gate_min_per_hour, math.floor(b.hard_gate_fraction_per_hour * size))),
                    ("physical", max(b.physical_min_per_hour, math.floor(b.physical_fraction_per_hour * size)))):
                times = [ts for ts, e in qs if pool_of(node_of(e, replica_node)) == pool
                         and ("physical" if (ts, e) in physical_q else "hard" if (ts, e) in hard_q else "rate")
                         == spent]
                for k, t0 in enumerate(times):
                    if sum(1 for t in times[k:] if t - t0 < b.window_s) > allowed:
                        held = False
        paged = any(ts >= onset and r in CORRELATED_PAGES for ts, r in pages)
        groups.append({"group": gname, "members": len(members), "faulty": sum(i.faulty for i in members),
                       "quarantined": len(qs), "budget_held": held, "paged": paged})

    # transitions and flaps (a return to the state left, within FLAP_WINDOW_S)
    node_set = set(nodes)
    node_tr = sum(1 for tr in log.transitions if tr.entity in node_set and tr.from_state not in WARMUP_STATES)
    rep_tr = sum(1 for tr in log.transitions if tr.entity in replica_node and tr.from_state not in WARMUP_STATES)
    flaps = flap_counts(log.transitions)
    node_flaps = sum(n for e, n in flaps.items() if e in node_set)
    rep_flaps = sum(n for e, n in flaps.items() if e in replica_node)

    # GPU-hours lost to undetected slow nodes
    per_step: dict[tuple[float, str], tuple[float, int]] = {}
    lost_never = 0.0
    per_step_never: dict[tuple[float, str], tuple[float, int]] = {}
    for r in slow:
        sk = (float(r.t), str(r.job))
        if r.slowdown > per_step_never.get(sk, (0.0, 0))[0]:
            per_step_never[sk] = (r.slowdown, r.job_gpus)
        removed_at = first_removed.get(r.node)
        if removed_at is not None and r.t >= removed_at:
            continue
        if r.slowdown > per_step.get(sk, (0.0, 0))[0]:
            per_step[sk] = (r.slowdown, r.job_gpus)
    lost = sum(s * g for s, g in per_step.values()) * step_s / 3600.0
    lost_never = sum(s * g for s, g in per_step_never.values()) * step_s / 3600.0

    responses = [o.response_s for o in outcomes if o.response_s is not None]
    removals = [o.removal_s for o in outcomes
                if o.removal_s is not None and o.incident.expected == "quarantine" and o.incident.faulty
                and o.incident.group is None]
    n_q = tp + fp + grouped
    metrics: dict[str, Any] = {
        # n/a when nothing was quarantined; 1.0 when all were members of a correlated event (judged as a group)
        "precision": (None if tp + fp + grouped == 0 else 1.0) if tp + fp == 0 else tp / (tp + fp),
        "recall": 1.0 if due == 0 else caught / due,
        "detection_s": _median(responses),
        "removal_s": _median(removals),
        "quarantines": n_q,
        "true_quarantines": tp,
        "false_quarantines": fp,
        "group_quarantines": grouped,
        "incidents_due_quarantine": due,
        "incidents_caught": caught,
        "actions_ok": sum(o.action_ok for o in outcomes),
        "actions_expected": len(outcomes),
        "flaps_per_node_day": node_flaps / max(len(nodes), 1) / days,
        "flaps_per_replica_day": rep_flaps / max(len(replica_node), 1) / days if replica_node else 0.0,
        "transitions_per_node_day": node_tr / max(len(nodes), 1) / days,
        "transitions_per_replica_day": rep_tr / max(len(replica_node), 1) / days if replica_node else 0.0,
        "transitions": len(log.transitions),
        "pages": len(pages),
        "tickets": tickets,
        "budget_exhaustions": sum(1 for _, r in pages if r == "budget_exhausted"),
        "groups": groups,
        "job_slowdown_gpu_h": round(lost, 3),
        "job_slowdown_gpu_h_if_undetected": round(lost_never, 3),
        "gpu_hours_lost": round(lost, 3),  # old names of the two above, kept for existing JSON readers
        "gpu_hours_lost_if_undetected": round(lost_never, 3),
        "cycles": log.cycles,
        "cpu_s": round(log.cpu_s, 3),
    }
    return ArmScore(log.name, metrics, outcomes, false_q)

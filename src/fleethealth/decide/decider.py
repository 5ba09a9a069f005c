"""The decider: health tuples + events + remembered state -> transitions and intents. Pure.

One call per cycle: ``Decider(policy).decide(state, health, now, events)``. The lifecycle table
(``decide.lifecycle``) says what each entity would do; the decider runs the passes around it, in this
order, on a private copy of the state (``decide.cycle.Cycle``):

1. tuples (``decide.tuples``): node and replica tuples, flagged GPUs, labels remembered per entity;
2. presence and fleet confidence, application-Xid attribution, version correlation
   (``decide.safety``); row remaps, OOM events and repair ladders in progress (``decide.repairs``);
3. every entity that can change this cycle is stepped through the lifecycle table (``_step_entity``),
   the longest-waiting first; each candidate remediation passes the safety vetoes
   (``decide.safety.SafetyRules._veto``: freeze, versions, TP group, budgets) or falls back softly;
   a transition emits its intents (``_transition``);
4. consumers: the router gets SET_WEIGHT (weight = serving score, rounded to 0.01; held for
   ``router.hold_s`` after the last usable tuple, then lowered by ``drain_step`` per cycle); the training
   scheduler gets NO_NEW_WORK for a node that is not READY or whose health is unknown (a node never yet
   usable, seen for less than ``freshness.max_age_s``, is a cold history, not held), ALLOW_NEW_WORK
   when it is READY and known again;
5. incidents that no longer hold are resolved.

Intents carry ``params.n`` (a running number kept in the state), so the same cycle replayed after a crash
yields the same idempotency keys. Every name other modules import from here (``Decider``, ``decide``,
``REMEDIATION_KINDS``, ``WORSE_STATES``, ``budget_key``, ``is_hard_gate_reason``, ``node_of``, the tuple
helpers) stays importable from this module.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from fleethealth.decide import chronic, incidents, ladder, recurring
from fleethealth.decide.cycle import (
    ABSENT_GRACE_S,
    DRAIN_FLAGS,
    EVENT_CONDS,
    FLAG_TIMER,
    FORGET_AFTER_S,
    FORGETTABLE_STATES,
    POD_TIER_HINTS,
    RECOVERY_PREFIX,
    REMEDIATION_KINDS,
    WORSE_STATES,
    Cycle,
    budget_key,
    choose_tier,
    is_hard_gate_reason,
)
from fleethealth.decide.domains import FailureDomains, quiet_hold
from fleethealth.decide.lifecycle import (
    ISOLATED_STATES,
    REMEDIATION_TARGETS,
    Cond,
    Observation,
    Rule,
    Timer,
    advance_timers,
    candidate_rules,
    holding_conds,
    timers_after_transition,
)
from fleethealth.decide.model import IntentKind, State, Tier, Transition
from fleethealth.decide.repairs import Repairs
from fleethealth.decide.safety import PHYSICAL_BUDGET_NOTE, SafetyRules
from fleethealth.decide.state import Decision, DecisionState, EntityLifecycle, Event
from fleethealth.decide.tuples import (
    LIFECYCLE_KINDS,
    HealthSource,
    LabelMemo,
    _all_tuples,
    _bits,
    _changed_rows,
    _lifecycle_and_flagged,
    _light_tuples,
    _light_tuples_reusing,
    _replica_tuple,
    _Rows,
    _serving_replicas,
    _tuple_at,
    node_of,
)
from fleethealth.memory import gc_paused
from fleethealth.policy import Policy, default_policy
from fleethealth.score.health import HealthTuple

_Cycle = Cycle  # the name before the split (decide.cycle)
# events a version-held node ignores: the bad driver fails its tests and repairs, not the node
VERSION_HELD_CONDS = frozenset({Cond.TEST_FAILED, Cond.REPAIR_EXHAUSTED, Cond.RESET_FAILED, Cond.RECURRING})
_NO_FLAGS = (False, False)  # (drain_reset, floor) of nearly every observation: one tuple, not one per entity

__all__ = [
    "ABSENT_GRACE_S", "DRAIN_FLAGS", "EVENT_CONDS", "FLAG_TIMER", "FORGETTABLE_STATES", "FORGET_AFTER_S",
    "LIFECYCLE_KINDS", "POD_TIER_HINTS", "RECOVERY_PREFIX", "REMEDIATION_KINDS", "WORSE_STATES", "Decider",
    "HealthSource", "LabelMemo", "_Cycle", "_Rows", "_all_tuples", "_bits", "_changed_rows", "_light_tuples",
    "_light_tuples_reusing", "_lifecycle_and_flagged", "_replica_tuple", "_serving_replicas", "_tuple_at",
    "budget_key", "choose_tier", "decide", "is_hard_gate_reason", "node_of",
]

class Decider(SafetyRules, Repairs, FailureDomains):
    """``fast`` (the default) reuses, from one cycle to the next, what cannot have changed: the tuple and
    observation objects of entities whose scores are bit-for-bit the same, the verdict that a steady
    entity's (unchanged) lifecycle and observation need nothing, the step of a quiet node that would only
    record its reading (a fleet's first decision: every node; ``_quiet_node``), and it skips the per-entity
    work of the passes that only act on flagged, held or unhealthy entities. Every cache is keyed on object
    identity (the decider's own outputs are never modified in place) or on equal inputs, so a fast
    decider answers exactly as ``fast=False`` (the plain code, every entity every cycle) does; the
    property tests hold the two side by side."""

    def __init__(self, policy: Policy | None = None, fast: bool = True) -> None:
        self.policy = policy or default_policy()
        self.fast = fast
        self._version = self.policy.version_tag  # hashing the policy costs; once per decider
        # Metadata labels by (kind, entity) for the last ``labels_key`` (not state: a cache of the
        # engine's answers, valid while the set of series they come from is unchanged).
        self._label_memo: tuple[Hashable, LabelMemo] | None = None
        # fast path caches (answers, never state: a decider handed any other state answers the same)
        self._rows: dict[str, _Rows] = {}
        self._serving_rows: list[Any] = []
        self._obs_of: dict[str, tuple[HealthTuple, tuple[bool, bool], Observation]] = {}
        self._labels_ok: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self._steady_ok: dict[str, tuple[EntityLifecycle, Observation]] = {}
        self._app_flags = frozenset(f"xid:{x}" for x in self.policy.xid.app_xids)
        self._chronic_kept: dict[str, Any] = {}  # chronic.node_evidence's: signal rows, job sizes
        # _flagged_by_node's answer and the flagged GPU tuples it was made of
        self._flagged_kept: tuple[list[HealthTuple], dict[str, frozenset[str]], dict[str, list[HealthTuple]]] | None = None

    # ------------------------------------------------------------------------------------------
    def decide(self, state: DecisionState, health: Any, now: float, events: Sequence[Event] = (),
               serving: Any = None, labels_key: Hashable | None = None,
               fleet_peers: tuple[int, int] = (0, 0)) -> Decision:
        """One cycle. ``health``: the remediation consumer's FleetHealth (or a mapping / iterable of
        HealthTuples); ``serving``: the serving consumer's FleetHealth for router weights (defaults to
        ``health``). ``labels_key``: equal across cycles only while the entities' metadata labels cannot
        differ (``DecisionLoop`` passes ``signals.history.shape_token`` of the scored view); labels are
        then reused instead of asked for again. ``fleet_peers``: the rest of the fleet's (in service, low
        confidence) counts, added to this decider's own before ``fleet.low_confidence_fraction`` applies
        (a shard's controller passes the other shards' published counts, ``controller.shards``, so a
        telemetry loss anywhere freezes every shard); the decision's ``confidence_counts`` are its own,
        without them (what a shard publishes). The input state is not modified.

        Without cyclic garbage collection inside (``fleethealth.memory.gc_paused``): a fleet's first decision
        makes a lifecycle, a tuple and an observation per node, a flag storm copies every node each cycle,
        none of them in a reference cycle, and the collector walked the whole heap twice over them (0.25 s
        of a 0.7 s first decision at 100k GPUs). What the call made is collected as usual afterwards."""
        with gc_paused():
            return self._decide(state, health, now, events, serving, labels_key, fleet_peers)

    def _decide(self, state: DecisionState, health: Any, now: float, events: Sequence[Event],
                serving: Any, labels_key: Hashable | None, fleet_peers: tuple[int, int]) -> Decision:
        p = self.policy
        lc = p.lifecycle
        c = Cycle(p, state.shallow(), now, self._version)
        s = c.s
        s.ledger = [x for x in s.ledger if now - x[0] < p.budgets.window_s]
        keep_pages = 2 * max(p.budgets.window_s, p.attribution.app_xid_window_s)
        s.pages = {k: ts for k, ts in s.pages.items() if now - ts < keep_pages or k.startswith(incidents.MARK)}
        memo: LabelMemo | None = None
        if labels_key is not None:
            if self._label_memo is None or self._label_memo[0] != labels_key:
                self._label_memo = (labels_key, {})
            memo = self._label_memo[1]
        fast = self.fast
        life, flagged_gpus = _lifecycle_and_flagged(health, memo, self._rows if fast else None)
        if serving is None:
            serving_by_id: dict[str, HealthTuple] = {}
        else:
            serving_by_id = _serving_replicas(serving, self._serving_rows if fast else None)
        by_id = {t.entity: t for t in life}

        # flags per node (its own and its GPUs'), and GPU tuples per node
        node_flags: dict[str, set[str]] = defaultdict(set)
        gpu_by_node: dict[str, list[HealthTuple]] = defaultdict(list)
        for t in life:
            if t.kind == "node" and t.flags:
                node_flags[t.entity].update(t.flags)
        flags_of, gpus_of = self._flagged_by_node(flagged_gpus)
        for n, nf in flags_of.items():
            node_flags[n].update(nf)
        for n, gs in gpus_of.items():
            gpu_by_node[n] = list(gs)
        c.node_flags = node_flags  # physical evidence, asked by the version passes below

        labels_ok = self._labels_ok
        for t in life:
            es = s.entities.get(t.entity)
            if es is None:
                # born with the labels the update below would give it (a fleet's first decision: every node)
                start = State.READY if t.kind == "node" else State.STARTING
                es = s.entities[t.entity] = EntityLifecycle(t.entity, t.kind, start, now,
                                                            labels={k: str(v) for k, v in t.labels.items()})
                c.copied.add(t.entity)
                if fast:
                    labels_ok[t.entity] = (t.labels, es.labels)
                continue
            if fast:
                # labels only ever grow, and only here; dicts of tuples and states are never changed in
                # place once handed out, so a pair found covered once stays covered
                ok = labels_ok.get(t.entity)
                if ok is not None and ok[0] is t.labels and ok[1] is es.labels:
                    continue
            if t.labels and not (t.labels.items() <= es.labels.items()):
                es = c.mut(t.entity)
                es.labels.update({k: str(v) for k, v in t.labels.items()})
            if fast:
                labels_ok[t.entity] = (t.labels, es.labels)

        self._absences(c, by_id)

        obs: dict[str, Observation | None] = {}
        obs_of = self._obs_of
        for eid in s.entities:
            ht = by_id.get(eid)
            if ht is None:
                obs[eid] = None
                continue
            fl = node_flags.get(eid)
            if fl or ht.flags:
                drain = bool((fl and not DRAIN_FLAGS.isdisjoint(fl)) or (ht.flags and not DRAIN_FLAGS.isdisjoint(ht.flags)))
                floor = chronic.at_floor(fl, ht.flags)  # the lifecycle's fast path
            else:  # nearly every entity, every cycle: no flag at all
                drain = floor = False
            df = _NO_FLAGS if not (drain or floor) else (drain, floor)
            if fast:
                hit = obs_of.get(eid)
                if hit is not None and hit[0] is ht and hit[1] == df:
                    obs[eid] = hit[2]
                    continue
            made = obs[eid] = Observation(ht.value, ht.confidence, ht.reason, gate=ht.reason.startswith("gate:"),
                                          drain_reset=drain, floor=floor)
            if fast:
                obs_of[eid] = (ht, df, made)

        own_counts = self._fleet_confidence(c, obs, fleet_peers)
        blamed = self._app_xids(c, life, flagged_gpus)
        for n, why in blamed.items():
            o = obs.get(n)
            if o is not None and o.usable(lc) and not o.gate:
                obs[n] = Observation(o.value, o.confidence, why, gate=True, drain_reset=o.drain_reset)
        suspects = self._versions(c, obs)
        self._own_stalls(c, obs, health, by_id, suspects)
        self._domains(c, obs, suspects)
        self._row_remaps(c, obs, node_flags, gpu_by_node)

        ev_by_entity: dict[str, list[Event]] = defaultdict(list)
        for e in sorted(events, key=lambda e: (e.ts, e.entity, e.kind)):
            if e.kind != "oom":
                ev_by_entity[e.entity].append(e)
                continue
            faulty = self._oom(c, e)
            if faulty is None:
                continue
            es_f = s.entities.get(faulty)
            targets = [faulty] + ([es_f.labels["node"]] if es_f is not None and es_f.labels.get("node") else [])
            for eid in targets:
                o = obs.get(eid)
                if eid in s.entities and o is not None and o.usable(lc):
                    obs[eid] = Observation(o.value, o.confidence, "gate:oom_device_fault", gate=True,
                                           drain_reset=o.drain_reset)

        c.gpu_by_node = gpu_by_node
        self._repairs(c, obs, node_flags, ev_by_entity)

        # Deterministic order that spends budgets on whoever has waited longest (a held remediation's
        # blocked_since), then the worst first: gates, then lowest value; the name only breaks exact ties.
        def order(eid: str) -> tuple[float, int, float, str]:
            o = obs.get(eid)
            since = s.entities[eid].blocked_since
            return (now if since is None else since, 0 if o is not None and o.gate else 1,
                    1.0 if o is None or o.value is None else o.value, eid)

        # nodes slow enough to price, the DEGRADED slow ones and the ticketed ones (decide.chronic): never steady
        c.chronic = chronic.node_evidence(
            health, p, degraded=lambda n: (e := s.entities.get(n)) is not None and e.state == State.DEGRADED,
            watch=[k[len(chronic.TICKET_PREFIX):] for k in s.incidents if k.startswith(chronic.TICKET_PREFIX)],
            memo=memo, kept=self._chronic_kept if fast else None)
        if fast:
            # A steady entity is skipped whatever the order (stepping one entity never changes another),
            # so only the others are sorted.
            todo: Iterable[str] = sorted(set(self._unsteady(c, obs, serving_by_id, by_id, ev_by_entity))
                                         | (c.chronic.keys() & s.entities.keys()), key=order)
        else:
            todo = sorted(s.entities, key=order)
        for eid in todo:
            if (not fast and eid not in ev_by_entity and eid not in c.chronic
                    and self._steady(s.entities[eid], obs.get(eid))):
                continue
            es = c.mut(eid)
            self._step_entity(c, es, obs.get(eid), by_id.get(eid), ev_by_entity.get(eid, []), suspects,
                              node_flags.get(eid, set()))
            if es.kind == "node":
                self._scheduler(c, es, obs.get(eid))
                if es.state == State.DEGRADED:  # chronically slow, no swap that pays: one ticket
                    due = chronic.ticket(eid, es.state, es.timers, c.chronic.get(eid), p, s.incidents)
                    if due is not None and due[1] is not None:
                        c.incident(due[0], eid, chronic.TICKET_REASON, due[1], sig=due[2])
                    elif due is not None:
                        incidents.refresh(s.incidents, due[0], now)
            else:
                st = serving_by_id.get(eid) or by_id.get(eid)
                self._router(c, es, None if st is None else Observation(st.value, st.confidence, st.reason))
        c.close_incidents()
        s.last_ts = now
        return Decision(s, c.transitions, c.intents, now, confidence_counts=own_counts)

    def _flagged_by_node(self, flagged: list[HealthTuple]) -> tuple[dict[str, frozenset[str]],
                                                                    dict[str, list[HealthTuple]]]:
        """Per node (``node_of``), the union of its flagged GPUs' flags and those GPUs in order. Fast: kept
        while the flagged tuples are the same objects as last cycle's (a flag storm: 100k GPUs, every
        cycle); the caller copies what it hands on."""
        kept = self._flagged_kept
        if self.fast and kept is not None and len(kept[0]) == len(flagged) and all(map(operator.is_, kept[0], flagged)):
            return kept[1], kept[2]
        sets: dict[str, set[str]] = {}
        gpus_of: dict[str, list[HealthTuple]] = {}
        for g in flagged:
            n = node_of(g)
            fl = sets.get(n)
            if fl is None:
                fl = sets[n] = set()
                gpus_of[n] = []
            fl.update(g.flags)
            gpus_of[n].append(g)
        flags_of = {n: frozenset(fl) for n, fl in sets.items()}
        self._flagged_kept = (list(flagged), flags_of, gpus_of) if self.fast else None
        return flags_of, gpus_of

    def _unsteady(self, c: Cycle, obs: Mapping[str, Observation | None], serving_by_id: Mapping[str, HealthTuple],
                  by_id: Mapping[str, HealthTuple], ev_by_entity: Mapping[str, list[Event]]) -> list[str]:
        """The entities that need a step this cycle. A steady node is skipped as in the plain loop (its
        verdict remembered while its lifecycle and observation objects are the same ones); a quiet node
        (``_quiet_node``: a fleet's first usable readings) and a steady serving replica
        (``_steady_replica``) get in one go what their step would do."""
        out: list[str] = []
        seen = self._steady_ok
        ents = c.s.entities
        lc, r = self.policy.lifecycle, self.policy.router
        lims = (lc.min_confidence, lc.quarantine_below, lc.degraded_below, lc.flag_below, r.min_weight, r.hold_s)
        for eid, es in ents.items():
            if eid in ev_by_entity:
                out.append(eid)
                continue
            o = obs.get(eid)
            if es.kind == "node":
                hit = seen.get(eid)
                if hit is not None and hit[0] is es and hit[1] is o:
                    continue
                if es.last_known_ts is not None and self._steady(es, o):  # (never usable yet: not steady)
                    seen[eid] = (es, o)  # type: ignore[assignment]
                    continue
                if o is not None and eid not in c.chronic and self._quiet_node(es, o, lims):
                    # a new node's first usable reading (a whole fleet at once on a start's first
                    # decision): its step would record the observation and nothing else
                    if eid in c.copied:  # this cycle's own copy (a node new this cycle): as its step would
                        es.last_value, es.last_confidence, es.last_reason = o.value, o.confidence, o.reason
                        es.last_known_ts = c.now
                    else:
                        ents[eid] = es.seen(o.value, o.confidence, o.reason, c.now)
                    continue
            elif es.kind == "replica" and o is not None:
                st = serving_by_id.get(eid) or by_id.get(eid)
                if self._steady_replica(c, es, o, st, lims):
                    ents[eid] = es.seen(o.value, o.confidence, o.reason, c.now)
                    continue
            out.append(eid)
        return out

    def _steady_replica(self, c: Cycle, es: EntityLifecycle, o: Observation, st: HealthTuple | None,
                        lims: tuple[float, float, float, float, float, float]) -> bool:
        """A READY replica whose step changes nothing but its last observation (value, confidence,
        reason, last_known_ts): usable and not gated, no timer running or started, nothing held or
        blocked, its flag already on the side its value is, and the router would publish the weight it
        already has (or, without a usable serving tuple, hold it). ``lims``: the policy's min_confidence,
        quarantine_below, degraded_below, flag_below, router min_weight and hold_s."""
        minc, q_below, d_below, f_below, min_w, hold_s = lims
        v = o.value
        if (es.state != State.READY or v is None or not o.confidence >= minc or o.gate or o.drain_reset
                or es.timers or es.blocked or v < q_below or v < d_below or (v < f_below) != es.flagged):
            return False
        if st is not None and st.value is not None and st.confidence >= minc:
            if es.weight is None:
                return False
            w = round(max(min_w, min(1.0, st.value)), 2)
            return abs(w - es.weight) < 0.005
        # no usable serving tuple: the router holds (its last known time is now, after this step)
        return es.weight is None or c.s.frozen or hold_s >= 0.0

    def _quiet_node(self, es: EntityLifecycle, o: Observation,
                    lims: tuple[float, float, float, float, float, float]) -> bool:
        """A READY node whose step changes nothing but its last observation (value, confidence, reason,
        last_known_ts): usable, no gate, drain or floor reading, no timer running and none that would
        start (at or above quarantine_below and degraded_below), nothing held, blocked or pending, its
        flag already on the side its value is, no scheduler hold to lift. The caller has checked for
        events and chronic evidence. Its last value was unknown or at least degraded_below as well: the
        only reader of another node's last observation (``_own_fault``, during the steps) then answers
        the same whether it reads this node before or after its step, so the step may be taken early.
        ``lims`` as ``_steady_replica``'s."""
        minc, q_below, d_below, f_below = lims[0], lims[1], lims[2], lims[3]
        v = o.value
        last = es.last_value
        return (es.state == State.READY and v is not None and o.confidence >= minc and not o.gate
                and not o.drain_reset and not o.floor and not es.timers and not es.blocked
                and not es.no_new_work and es.version_hold is None and v >= q_below and v >= d_below
                and (v < f_below) == es.flagged and (last is None or last >= d_below))

    def _steady(self, es: EntityLifecycle, o: Observation | None) -> bool:
        """A healthy READY node whose tuple is exactly what it was last cycle: nothing can change (no
        timer runs, nothing is flagged, held or blocked), so it is skipped without a copy."""
        return (
            es.kind == "node" and es.state == State.READY and o is not None and o.value is not None
            and not es.timers and not es.blocked and not es.flagged and not es.no_new_work
            and not o.gate and not o.drain_reset and o.value >= self.policy.lifecycle.flag_below
            and o.confidence >= self.policy.lifecycle.min_confidence and es.last_value == o.value
            and es.last_confidence == o.confidence and es.last_reason == o.reason and es.last_known_ts is not None
        )


    def _step_entity(self, c: Cycle, es: EntityLifecycle, o: Observation | None, t: HealthTuple | None,
                     events: list[Event], suspects: Mapping[tuple[str, str], str], flags: set[str]) -> None:
        p = self.policy
        lc = p.lifecycle
        now = c.now
        usable = o is not None and o.usable(lc)
        if o is not None:
            es.last_value, es.last_confidence, es.last_reason = o.value, o.confidence, o.reason
        if usable:
            es.last_known_ts = now
        conds = holding_conds(o, lc)
        advance_timers(es.timers, o, now, lc, es.state, conds)
        if es.kind == "node":
            conds |= chronic.conds(es.state, es.timers, c.chronic.get(es.entity), now, p, o)
        if usable and es.state == State.STARTING:
            conds.add(Cond.FIRST_DATA)
        if es.state in recurring.EPISODE_ISOLATIONS and recurring.escalation(es, now, p) is not None:
            conds.add(Cond.RECURRING)  # the same fault again: a repair, not another release
        event_of: dict[Cond, Event] = {}
        for e in events:
            cond: Cond | None = None
            if e.kind in ("active_test", "reset", "repair") and e.passed is not None:
                cond = EVENT_CONDS.get((e.kind, bool(e.passed)))
                if e.kind == "reset":
                    es.reset_scheduled = False
                if cond == Cond.TEST_PASSED:
                    recent = [r for r in es.recoveries if now - r < lc.recovery_window_s]
                    if len(recent) >= lc.max_recoveries:
                        cond = Cond.TOO_MANY_RECOVERIES
            elif e.kind == "ack":
                cond = {"READY": Cond.HUMAN_READY, "QUARANTINED": Cond.HUMAN_QUARANTINE}.get(str(e.to).upper())
            if cond is not None:
                conds.add(cond)
                event_of[cond] = e
        if es.version_hold is not None:
            # held by a bad version's incident (decide.safety): what its driver makes fail is not the node's
            conds -= VERSION_HELD_CONDS
            for e in events:
                if e.kind == "active_test" and e.passed is not None:
                    self._version_test_result(c, es, bool(e.passed))  # a failed one: the version's evidence
            if self._version_retesting(c, es):
                if es.state == State.FAILED:
                    conds.add(Cond.VERSION_CLEARED)  # back to QUARANTINED for its retest, still held
            elif self._version_release(c, es) is not None:
                if es.state == State.FAILED:
                    conds.add(Cond.VERSION_CLEARED)
                else:
                    released, es.version_hold = es.version_hold, None
                    tests = list(lc.active_test)
                    c.emit(IntentKind.RUN_ACTIVE_TEST, es.entity, f"version_resolved:{released}",
                           {"tests": tests}, Tier.NODE)
        chosen: Rule | None = None
        # (vetoes and soft fallbacks change neither state, timers nor conditions: asked once)
        candidates = candidate_rules(es.state, conds, es.timers, now - es.since, lc)
        for rule in candidates:
            if rule.cond == Cond.DRAIN_TIMEOUT and ladder.running(es.repair):
                continue  # the repair ladder's own timeouts apply while it runs
            why = self._veto(c, es, rule, suspects, approved=Cond.HUMAN_QUARANTINE in conds,
                             observation=o)
            if why is None:
                chosen = rule
                break
            self._soft_fallback(c, es, why, o)
        if chosen is None:
            if es.blocked and not any(r.dst in REMEDIATION_TARGETS for r in candidates):
                es.blocked, es.blocked_since = None, None  # nothing wants remediation any more
            self._flag(c, es, o)
            return
        self._transition(c, es, chosen, o, t, event_of.get(chosen.cond), flags)

    def _transition(self, c: Cycle, es: EntityLifecycle, rule: Rule, o: Observation | None, t: HealthTuple | None,
                    ev: Event | None, flags: set[str]) -> None:
        p = self.policy
        now = c.now
        src, dst = es.state, rule.dst
        # back to QUARANTINED for a retest while it still runs the version that holds it: it stays held
        held_retest = rule.cond == Cond.VERSION_CLEARED and self._version_retesting(c, es)
        if ev is not None:
            reason = f"event:{rule.cond}" + (f":{ev.actor}" if ev.actor else "")
        elif rule.cond == Cond.RECURRING:
            reason = recurring.escalation(es, now, p) or str(rule.cond)
        elif rule.cond == Cond.VERSION_CLEARED:
            reason = f"version_{'retest' if held_retest else 'resolved'}:{es.version_hold}"
        else:
            reason = o.reason if o is not None else str(rule.cond)
        priced = chronic.on_transition(rule.cond, es.entity, es.timers, c.chronic, p)
        if priced is not None:
            reason = priced[0]
        # the budget the veto checked (decide.safety); a physical one is named, so a judge can charge it
        spends = self._budget_class(c, es, rule) if dst in REMEDIATION_TARGETS and src not in ISOLATED_STATES \
            else None
        detail = str(rule.cond) + (f" dwell {getattr(p.lifecycle, rule.dwell):g}s" if rule.dwell else "") + (
            f" {PHYSICAL_BUDGET_NOTE}" if spends is not None and spends[0] else "")
        c.transitions.append(Transition(
            now, es.entity, es.kind, src, dst, reason, None if o is None else o.value,
            0.0 if o is None else o.confidence, c.version, detail,
        ))
        es.timers = timers_after_transition(es.timers, src, dst)
        advance_timers(es.timers, o, now, p.lifecycle, dst)  # the new state's windows start now
        prev_since = es.since
        es.state, es.since = dst, now
        es.transitions += 1
        if dst not in ISOLATED_STATES or (rule.cond == Cond.VERSION_CLEARED and not held_retest):
            es.version_hold = None
        self._episode(c, es, src, dst, prev_since, o.reason if o is not None else reason, flags, t)
        if dst in REMEDIATION_TARGETS or dst == State.READY:
            es.blocked, es.blocked_since = None, None
        es.flagged = False
        if spends is not None:
            physical, hard = spends
            c.s.ledger.append((now, budget_key(es.kind, es.labels.get("pool", "default"), hard, physical),
                               es.entity))
        worst = None if t is None else t.worst
        tier = choose_tier(es.kind, reason, worst)
        info: dict[str, Any] = {"from": str(src), "value": None if o is None else o.value}
        if priced is not None:  # the price goes with every intent; a swap (not a drift) pages a human
            info["chronic"] = priced[1]
            if dst == State.QUARANTINED and reason != chronic.IDLE_REASON:  # idle: its ticket says it
                c.emit(IntentKind.PAGE, es.entity, reason, {"severity": "page", **info})
        fresh_isolation = src not in ISOLATED_STATES
        # the max_episodes-th isolation of one family: FAILED in this same cycle, before a test or a
        # repair ladder is started that could only release the node into its next episode
        escalate = recurring.escalates_now(es, src, dst, now, p)
        if dst == State.QUARANTINED:
            if es.kind == "node" and not es.no_new_work:
                es.no_new_work = True
                c.emit(IntentKind.NO_NEW_WORK, es.entity, reason, {}, Tier.NODE)
            if fresh_isolation:
                c.emit(IntentKind.CAPTURE_EVIDENCE, es.entity, reason,
                       {"window_s": p.freshness.rate_window_s, "before": "quarantine", **info}, tier)
            if es.kind == "node":
                c.emit(IntentKind.QUARANTINE, es.entity, reason, info, Tier.NODE)
            else:
                c.emit(IntentKind.DRAIN, es.entity, reason, info, tier)
                if tier == Tier.POD:
                    c.emit(IntentKind.REBUILD_WORKER, es.entity, reason, info, Tier.POD)
            if not (escalate or ladder.isolating(es.repair)
                    or fresh_isolation and self._start_repair(c, es, flags, reason)):
                for f in sorted(flags):
                    action = f.removeprefix(RECOVERY_PREFIX)
                    if f.startswith(RECOVERY_PREFIX) and action in ("GPU_RESET", "NODE_REBOOT"):
                        c.emit(IntentKind.SCHEDULE_RESET, es.entity, f, {"action": action, "when": "now"},
                               Tier.NODE)
                tests = list(p.lifecycle.active_test) if es.kind == "node" else ["probe_inference"]
                c.emit(IntentKind.RUN_ACTIVE_TEST, es.entity, reason, {"tests": tests}, tier)
        elif dst == State.DRAINING:
            scope = "p2p" if RECOVERY_PREFIX + "DRAIN_P2P" in flags and \
                RECOVERY_PREFIX + "DRAIN_AND_RESET" not in flags else "all"
            if es.kind == "node" and not es.no_new_work:
                es.no_new_work = True
                c.emit(IntentKind.NO_NEW_WORK, es.entity, reason, {}, Tier.NODE)
            c.emit(IntentKind.CAPTURE_EVIDENCE, es.entity, reason,
                   {"window_s": p.freshness.rate_window_s, "before": "drain", **info}, Tier.NODE)
            c.emit(IntentKind.DRAIN, es.entity, reason, {"scope": scope, **info}, Tier.NODE)
            if not (escalate or ladder.isolating(es.repair)
                    or fresh_isolation and self._start_repair(c, es, flags, reason)):
                c.emit(IntentKind.SCHEDULE_RESET, es.entity, reason,
                       {"action": "GPU_RESET", "when": "after_drain", "drain": True}, Tier.NODE)
        elif dst == State.RECOVERING:
            es.recoveries = [r for r in es.recoveries if now - r < p.lifecycle.recovery_window_s] + [now]
            repaired = {} if es.repair is None else {"repair": ladder.summary(es.repair)}
            es.repair = None
            c.emit(IntentKind.RELEASE, es.entity, reason, {"canary": True, **info, **repaired}, tier)
        elif dst == State.FAILED:
            tried = {} if es.repair is None else {"repair": ladder.summary(es.repair), "action": "replace"}
            again = recurring.page_params(es, now, p) if rule.cond == Cond.RECURRING else {}
            c.emit(IntentKind.PAGE, es.entity, reason,
                   {"severity": "page", "state": "FAILED", "recoveries": len(es.recoveries), **info, **tried,
                    **again})
        elif dst == State.READY and src in ISOLATED_STATES:
            es.repair = None
            c.emit(IntentKind.RELEASE, es.entity, reason, {"canary": False, **info}, tier)
        if escalate is not None:
            self._transition(c, es, escalate, o, t, None, flags)

    def _episode(self, c: Cycle, es: EntityLifecycle, src: State, dst: State, prev_since: float, why: str,
                 flags: set[str], t: HealthTuple | None) -> None:
        """Remember the isolation or degraded spell this transition starts (``decide.recurring``); a human
        releasing a FAILED node (a repair) clears the node's episodes."""
        if src == State.FAILED and dst == State.READY:
            recurring.forget(es)
            return
        if dst not in recurring.EPISODE_ISOLATIONS and dst != State.DEGRADED:
            return
        gpus = [g.entity for g in c.gpu_by_node.get(es.entity, [])]
        if t is not None and t.worst_member and "/" in t.worst_member:
            gpus.append(t.worst_member)
        recurring.record(es, src, dst, c.now, prev_since, recurring.family_of(why, flags, self.policy), gpus,
                         self.policy)

    def _flag(self, c: Cycle, es: EntityLifecycle, o: Observation | None) -> None:
        """READY but below ``flag_below``: a published condition (SET_CONDITION), not an action. Raised
        and cleared only after ``degraded_dwell_s`` on the other side, so peer noise does not flap it;
        the timer (key ``flag``) pauses on unknown like the lifecycle's."""
        lc = self.policy.lifecycle
        if es.state != State.READY:
            es.timers.pop(FLAG_TIMER, None)
            return
        usable = o is not None and o.usable(lc) and o.value is not None
        tm = es.timers.get(FLAG_TIMER)
        if not usable:
            if tm is not None:
                tm.last_ts = None
            return
        assert o is not None and o.value is not None
        if (o.value < lc.flag_below) == es.flagged:
            es.timers.pop(FLAG_TIMER, None)  # on the side it already is
            return
        if tm is None:
            tm = es.timers[FLAG_TIMER] = Timer(0.0, c.now)
        elif tm.last_ts is None:
            tm.last_ts = c.now
        else:
            tm.accum_s += c.now - tm.last_ts
            tm.last_ts = c.now
        if tm.accum_s >= lc.degraded_dwell_s:
            es.timers.pop(FLAG_TIMER, None)
            es.flagged = not es.flagged
            c.emit(IntentKind.SET_CONDITION, es.entity, o.reason if es.flagged else "recovered",
                   {"condition": "HealthFlagged", "status": es.flagged, "value": o.value})

    # ------------------------------------------------------------------------------------------
    def _scheduler(self, c: Cycle, es: EntityLifecycle, o: Observation | None) -> None:
        """Training scheduler: no new work on a node that is not READY, or whose health is unknown."""
        lc = self.policy.lifecycle
        usable = o is not None and o.usable(lc)
        held = es.blocked is not None and not quiet_hold(es.blocked, self.policy)
        if es.state == State.READY and not held:
            if usable:
                want = False
            elif c.s.frozen:
                return  # telemetry outage: keep what was decided before it
            elif (es.last_known_ts is None and es.transitions == 0 and not es.no_new_work
                    and c.now - es.since < self.policy.freshness.max_age_s):
                # A cold history, not a node going dark: first seen less than one staleness window ago
                # (es.since is when the entity was created: no transition yet) and never usable, as every
                # node is on a replay's or a backtest's first cycle (counters need two samples). Holding
                # it would cordon the whole fleet for one cycle and lift it the next. Safe to wait:
                # nothing was published for it before, so the scheduler places work as it did before we
                # saw the node; a gate is usable evidence (confidence 1) and still quarantines at once
                # through the lifecycle; an existing hold is never lifted here; and a node still unknown
                # after max_age_s is held as before. The fleet's confidence count skips never-usable
                # entities for the same reason (safety._confidence_counts); the live controller warms
                # up its first cycle without deciding (controller.loop).
                return
            else:
                want = True
        else:
            want = es.state not in (State.STARTING, State.WARMING)
        if want != es.no_new_work:
            es.no_new_work = want
            if want:
                why = "unknown" if es.state == State.READY else f"state:{es.state}"
                c.emit(IntentKind.NO_NEW_WORK, es.entity, why,
                       {"value": None if o is None else o.value, "confidence": None if o is None else o.confidence},
                       Tier.NODE)
            else:
                c.emit(IntentKind.ALLOW_NEW_WORK, es.entity, "ready", {"value": None if o is None else o.value},
                       Tier.NODE)

    def _router(self, c: Cycle, es: EntityLifecycle, o: Observation | None) -> None:
        """Router weight = serving score; held while unknown for hold_s, then stepped down."""
        r = self.policy.router
        lc = self.policy.lifecycle
        now = c.now
        serving_states = (State.READY, State.DEGRADED, State.RECOVERING)
        reason = "score"
        if es.state not in serving_states:
            w = 0.0
            reason = f"state:{es.state}"
        elif es.blocked and not quiet_hold(es.blocked, self.policy):
            return  # the soft fallback set it
        elif o is not None and o.usable(lc) and o.value is not None:
            w = max(r.min_weight, min(1.0, o.value))
            if es.state == State.RECOVERING and lc.recovering_dwell_s > 0:
                w *= max(0.1, min(1.0, (now - es.since) / lc.recovering_dwell_s))  # canary ramp
                reason = "canary"
        else:
            if es.weight is None:
                return
            held_for = now - (es.last_known_ts if es.last_known_ts is not None else es.since)
            if c.s.frozen or held_for <= r.hold_s:
                return  # hold the last known weight
            w = max(r.min_weight, es.weight - r.drain_step)
            reason = "unknown:drain"
        w = round(w, 2)
        if es.weight is None or abs(w - es.weight) >= 0.005:
            es.weight = w
            c.emit(IntentKind.SET_WEIGHT, es.entity, reason, {"weight": w}, Tier.INSTANCE)


def decide(state: DecisionState, health: Any, now: float, events: Sequence[Event] = (),
           policy: Policy | None = None, serving: Any = None) -> Decision:
    """Functional entry point: ``Decider(policy).decide(...)``."""
    return Decider(policy).decide(state, health, now, events, serving)

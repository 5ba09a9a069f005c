"""The decider: health tuples + events + remembered state -> transitions and intents. Pure.

One call per cycle: ``Decider(policy).decide(state, health, now, events)``. The lifecycle table
(``decide.lifecycle``) says what each entity would do; this module adds what the consumers need and the
safety rules that keep a scorer bug, a metrics outage or a bad rollout from draining a cluster:

* Fleet-wide confidence: when at least ``fleet.low_confidence_fraction`` of the (at least
  ``fleet.min_entities``) lifecycle entities in service are unknown, silent or below ``min_confidence``
  together (see ``_fleet_confidence`` for which count), the problem
  is telemetry: one FLEET_ALERT, remediation frozen (no signal-driven move to a worse state, no drain, no
  quarantine, no reset), router weights and scheduler holds kept as they were, until confidence returns
  (a resolving FLEET_ALERT). Events (test results, humans) still apply.
* Budgets per pool (label ``pool``): at most max(quarantine_min_per_hour, floor(fraction * pool size))
  quarantines per ``budgets.window_s``; never more than ``max_per_tp_group`` nodes of one ``tp_group``
  in QUARANTINED or DRAINING (FAILED is a human's and does not count). A confirmed hard gate (reason
  ``gate:<signal>`` for a signal in ``budgets.hard_gates``, or an Xid 154 drain-and-reset) takes a node
  that is already out of service: it spends a separate, larger budget (``hard_gate_*``: a fleet-wide
  burst of bogus gates still stops there) and skips the TP rule. The longest-waiting entity gets a freed
  budget first (``blocked_since``). Exhausted: one incident (``decide.incidents``: a firing PAGE, updates,
  one resolution) and a soft fallback (``soft=True``: NO_NEW_WORK for a node, a lowered weight for a
  replica) instead of the quarantine, retried every cycle. A human approves a held quarantine with an
  ``ack`` event (``to`` QUARANTINED): the table's rule then fires unvetoed.
* Attribution: application Xids (``policy.xid.app_xids``, flags ``xid:N``) are charged to the job (GPU
  label ``job``) with one ticket-severity PAGE per job; the node is blamed (a hard gate) only when
  ``attribution.app_xid_distinct_jobs`` distinct jobs hit it within ``app_xid_window_s``. A version label
  value (driver, build, kernel) shared by at least ``version_min_entities`` unhealthy entities and at least
  ``version_fraction`` of all unhealthy ones, and over-represented against the rest of the fleet (its
  unhealthy rate more than twice that of the other versions; or, when every entity runs it, at least
  ``version_fraction`` of them unhealthy), is suspect: one incident about it, and no entity carrying it
  is quarantined.
* Pending row remap (flag ``row_remap_pending`` or a ``policy.xid.reset_xids`` flag): one SCHEDULE_RESET
  (drain and reset at the next safe point), no state change. Xid 154 recovery actions: GPU_RESET and
  NODE_REBOOT ride on the gate's quarantine with a SCHEDULE_RESET of that action; DRAIN_AND_RESET and
  DRAIN_P2P move the entity to DRAINING (drain, then reset).

Consumers: the router gets SET_WEIGHT (weight = serving score, rounded to 0.01; held for
``router.hold_s`` after the last usable tuple, then lowered by ``drain_step`` per cycle); the training
scheduler gets NO_NEW_WORK for a node that is not READY or whose health is unknown, ALLOW_NEW_WORK when it
is READY and known again. Intents carry ``params.n`` (a running number kept in the state), so the same
cycle replayed after a crash yields the same idempotency keys.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fleethealth.decide import incidents, ladder
from fleethealth.decide.lifecycle import (
    ISOLATED_STATES,
    REMEDIATION_TARGETS,
    SIGNAL_CONDS,
    Cond,
    Observation,
    Rule,
    Timer,
    advance_timers,
    candidate_rules,
    holding_conds,
    timers_after_transition,
)
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.decide.state import Decision, DecisionState, EntityLifecycle, Event
from fleethealth.policy import Policy, default_policy
from fleethealth.score.health import EntityKind, HealthTuple

LIFECYCLE_KINDS = ("node", "replica")
FLAG_TIMER = "flag"  # the READY-but-flagged condition's own timer, kept with the lifecycle's
# An entity the engine stopped reporting still counts for fleet confidence this long (a metrics outage),
# and is forgotten after FORGET_AFTER_S if it holds nothing (decommissioned, scaled down).
ABSENT_GRACE_S = 6 * 3600.0
FORGET_AFTER_S = 24 * 3600.0
FORGETTABLE_STATES: frozenset[State] = frozenset({State.READY, State.STARTING, State.WARMING})
WORSE_STATES: frozenset[State] = frozenset({State.DEGRADED, State.DRAINING, State.QUARANTINED, State.FAILED})
# Intents that change what runs where; never caused by unknown data, never issued while frozen.
REMEDIATION_KINDS: frozenset[IntentKind] = frozenset({
    IntentKind.DRAIN, IntentKind.QUARANTINE, IntentKind.SCHEDULE_RESET, IntentKind.RUN_ACTIVE_TEST,
    IntentKind.REBUILD_WORKER, IntentKind.RELEASE,
})
RECOVERY_PREFIX = "recovery_action:"
DRAIN_FLAGS = frozenset({RECOVERY_PREFIX + "DRAIN_AND_RESET", RECOVERY_PREFIX + "DRAIN_P2P"})
# Replica faults that a rebuilt worker fixes (pod tier); the rest of a replica's faults are the instance's.
POD_TIER_HINTS = ("memory", "fragment", "leak", "deadlock", "hang", "stuck", "gate:")
EVENT_CONDS = {
    ("active_test", True): Cond.TEST_PASSED, ("active_test", False): Cond.TEST_FAILED,
    ("reset", True): Cond.RESET_PASSED, ("reset", False): Cond.RESET_FAILED,
    ("repair", False): Cond.REPAIR_EXHAUSTED,
}


class HealthSource(Protocol):
    """What the decider reads of a FleetHealth (score.engine): tuples keyed by entity id."""

    @property
    def tuples(self) -> Mapping[str, HealthTuple]: ...


def _all_tuples(health: HealthSource | Mapping[str, HealthTuple] | Iterable[HealthTuple]) -> list[HealthTuple]:
    if hasattr(health, "tuples"):
        return list(health.tuples.values())
    if isinstance(health, Mapping):
        return list(health.values())
    return list(health)


LabelMemo = dict[tuple[str, str], dict[str, str]]


def _lifecycle_and_flagged(health: Any, memo: LabelMemo | None = None,
                           rows: dict[str, _Rows] | None = None) -> tuple[list[HealthTuple], list[HealthTuple]]:
    """Node and replica tuples, and the GPU tuples that carry flags. The engine's FleetHealth is
    columnar: only the flagged GPUs are turned into tuples (a 100k-GPU fleet has few). ``rows``: the
    decider's cache of last cycle's columns and tuples (unchanged rows keep their tuple)."""
    kinds = getattr(health, "kinds", None)
    if kinds is not None and hasattr(health, "by_kind") and hasattr(health, "tuples"):
        try:
            if rows is None:
                life = [t for k in LIFECYCLE_KINDS for t in _light_tuples(health, k, memo)]
            else:
                life = [t for k in LIFECYCLE_KINDS for t in _light_tuples_reusing(health, k, memo, rows)]
        except (AttributeError, TypeError, IndexError, KeyError):  # an engine without these columns
            if rows is not None:
                rows.clear()
            life = [t for k in LIFECYCLE_KINDS for t in health.by_kind(k)]
        gpus: list[HealthTuple] = []
        ks = kinds.get("gpu")
        if ks is not None:
            for i in sorted(ks.flags):
                if ks.flags[i]:
                    t = health.get(ks.names[i])
                    if t is not None:
                        gpus.append(t)
        return life, gpus
    tuples = _all_tuples(health)
    return ([t for t in tuples if t.kind in LIFECYCLE_KINDS],
            [t for t in tuples if t.kind == "gpu" and t.flags])


def _replica_tuple(name: str, kind: EntityKind, value: float, confidence: float, reason: str, now: float) -> HealthTuple:
    """A serving tuple as the router reads it: value (None for NaN), confidence, reason."""
    v = float(value)
    return HealthTuple(entity=name, kind=kind, value=None if v != v else v,
                       confidence=float(confidence), worst=None, reason=reason, ts=now)


def _serving_replicas(serving: Any, cache: list[Any] | None = None) -> dict[str, HealthTuple]:
    """The serving consumer's replica tuples: only value, confidence and reason are read (router
    weights), so the engine's columns are read without metadata labels or node tuples. ``cache``: a
    one-slot list holding last cycle's (names, value bits, confidence bits, reasons, tuples); a row
    unchanged bit for bit keeps its tuple object."""
    kinds = getattr(serving, "kinds", None)
    if kinds is not None and hasattr(serving, "by_kind") and hasattr(serving, "tuples"):
        try:
            ks = kinds.get("replica")
            if ks is None:
                return {}
            now = serving.now
            if cache is not None:
                vb, cb, rs = _bits(ks.value), _bits(ks.confidence), [str(r) for r in ks.reason]
                prev = cache[0] if cache else None
                if (prev is not None and (ks.names is prev[0] or ks.names == prev[0])
                        and vb.shape == prev[1].shape and cb.shape == prev[2].shape):
                    same = ((vb == prev[1]) & (cb == prev[2])).tolist()
                    tuples = list(prev[4])
                    vals, cfs = vb.view(np.float64), cb.view(np.float64)
                    for i, name in enumerate(prev[0]):
                        if not same[i] or rs[i] != prev[3][i]:
                            tuples[i] = _replica_tuple(name, ks.kind, vals[i], cfs[i], rs[i], now)
                    names = prev[0]
                else:
                    names = list(ks.names)
                    tuples = [_replica_tuple(name, ks.kind, v, cf, r, now)
                              for name, v, cf, r in zip(names, ks.value.tolist(), ks.confidence.tolist(), rs,
                                                        strict=True)]
                cache[:] = [(names, vb, cb, rs, tuples)]
                return dict(zip(names, tuples, strict=True))
            values = ks.value.tolist()
            conf = ks.confidence.tolist()
            return {name: _replica_tuple(name, ks.kind, v, cf, str(r), now)
                    for name, v, cf, r in zip(ks.names, values, conf, ks.reason, strict=True)}
        except (AttributeError, TypeError, IndexError, KeyError, ValueError):
            if cache is not None:
                cache.clear()
    return {t.entity: t for t in _lifecycle_and_flagged(serving)[0] if t.kind == "replica"}


def _light_tuples(health: Any, kind: str, memo: LabelMemo | None = None) -> list[HealthTuple]:
    """The engine's tuples without the per-signal details and category maps the decider never reads
    (building those was most of a cycle's cost). ``memo``: labels already fetched for views with the
    same set of series (the engine's lazy labels are the rest of the cost)."""
    ks = health.kinds.get(kind)
    if ks is None:
        return []
    meta = health.meta
    values = ks.value.tolist()
    conf = ks.confidence.tolist()
    worst = ks.worst.tolist()
    out = []
    for i, name in enumerate(ks.names):
        v = values[i]
        w = int(worst[i])
        if memo is None:
            labels = meta.labels(kind, i)
        else:
            labels = memo.get((kind, name))  # type: ignore[assignment]
            if labels is None:
                labels = memo[(kind, name)] = meta.labels(kind, i)
        out.append(HealthTuple(
            entity=name, kind=ks.kind, value=None if v != v else float(v), confidence=float(conf[i]),
            worst=ks.categories[w] if w >= 0 else None, reason=str(ks.reason[i]), labels=labels,
            worst_member=ks.worst_member.get(i), flags=tuple(ks.flags.get(i, ())), ts=health.now,
        ))
    return out


@dataclass(slots=True)
class _Rows:
    """One kind's columns as last read, and the tuples built from them: a row whose columns are
    bit-for-bit the same (and whose labels come from the same memo) gets the same tuple object again."""

    kind: str
    names: list[str]
    value: np.ndarray  # float64 bits as int64
    conf: np.ndarray
    worst: np.ndarray
    reason: list[str]
    flags: dict[int, tuple[str, ...]]
    worst_member: dict[int, str]
    categories: list[str]
    memo: LabelMemo | None
    tuples: list[HealthTuple]


def _bits(a: Any) -> np.ndarray:
    return np.array(a, np.float64).view(np.int64)  # a copy: the engine's arrays are not ours to keep


def _changed_rows(ks: Any, prev: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str],
                                                  dict[int, tuple[str, ...]], dict[int, str]] | None:
    """Which rows of ``ks`` differ from ``prev`` (None: not comparable, rebuild all). Also returns the
    new columns in the cached form."""
    names = ks.names
    if names is not prev.names and names != prev.names:
        return None
    if list(ks.categories) != prev.categories:
        return None
    value, conf = _bits(ks.value), _bits(ks.confidence)
    worst = np.array(ks.worst, np.int64)
    if value.shape != prev.value.shape or conf.shape != prev.conf.shape or worst.shape != prev.worst.shape:
        return None
    changed = (value != prev.value) | (conf != prev.conf) | (worst != prev.worst)
    reason = [str(r) for r in ks.reason]
    if reason != prev.reason:
        for i, (a, b) in enumerate(zip(reason, prev.reason, strict=True)):
            if a != b:
                changed[i] = True
    flags = {int(i): tuple(f) for i, f in ks.flags.items()}
    if flags != prev.flags:
        for i in set(flags) | set(prev.flags):
            if flags.get(i, ()) != prev.flags.get(i, ()):
                changed[i] = True
    wm = dict(ks.worst_member)
    if wm != prev.worst_member:
        for i in set(wm) | set(prev.worst_member):
            if wm.get(i) != prev.worst_member.get(i):
                changed[i] = True
    return changed, value, conf, reason, flags, wm


def _light_tuples_reusing(health: Any, kind: str, memo: LabelMemo | None, cache: dict[str, _Rows]) -> list[HealthTuple]:
    """``_light_tuples``, handing back last cycle's tuple object for every row whose columns and labels
    are unchanged (a steady fleet: nearly all). The tuples' ``ts`` is then that of the cycle that built
    them; the decider never reads it. Without a memo (no ``labels_key``: the set of series may have
    changed) every row's labels are asked for, as ``_light_tuples`` does, and a row is unchanged only if
    they are equal too."""
    ks = health.kinds.get(kind)
    prev = cache.get(kind)
    if ks is None:
        cache.pop(kind, None)
        return []
    asked: list[dict[str, str]] | None = None
    if memo is None:
        meta = health.meta
        asked = [meta.labels(kind, i) for i in range(len(ks.names))]
    diff = None if prev is None or prev.memo is not memo else _changed_rows(ks, prev)
    if diff is None or prev is None:
        if asked is None:
            out = _light_tuples(health, kind, memo)
        else:
            out = [_tuple_at(health, ks, i, asked[i]) for i in range(len(ks.names))]
        cache[kind] = _Rows(kind, list(ks.names), _bits(ks.value), _bits(ks.confidence), np.array(ks.worst, np.int64),
                            [str(r) for r in ks.reason], {int(i): tuple(f) for i, f in ks.flags.items()},
                            dict(ks.worst_member), list(ks.categories), memo, out)
        return out
    changed, value, conf, reason, flags, wm = diff
    if asked is not None:
        for i, lab in enumerate(asked):
            if not changed[i] and lab != prev.tuples[i].labels:
                changed[i] = True
    tuples = list(prev.tuples)
    if changed.any():
        meta = health.meta
        for i in np.flatnonzero(changed).tolist():
            if asked is not None:
                labels = asked[i]
            else:
                assert memo is not None
                name = ks.names[i]
                labels = memo.get((kind, name))  # type: ignore[assignment]
                if labels is None:
                    labels = memo[(kind, name)] = meta.labels(kind, i)
            tuples[i] = _tuple_at(health, ks, i, labels)
    cache[kind] = _Rows(kind, prev.names, value, conf, np.array(ks.worst, np.int64), reason, flags, wm,
                        prev.categories, memo, tuples)
    return tuples


def _tuple_at(health: Any, ks: Any, i: int, labels: dict[str, str]) -> HealthTuple:
    """Row ``i`` of the engine's columns as ``_light_tuples`` builds it."""
    v = float(ks.value[i])
    w = int(ks.worst[i])
    return HealthTuple(
        entity=ks.names[i], kind=ks.kind, value=None if v != v else v, confidence=float(ks.confidence[i]),
        worst=ks.categories[w] if w >= 0 else None, reason=str(ks.reason[i]), labels=labels,
        worst_member=ks.worst_member.get(i), flags=tuple(ks.flags.get(i, ())), ts=health.now,
    )


def is_hard_gate_reason(reason: str, policy: Policy) -> bool:
    """``gate:<signal>`` for a signal named in ``budgets.hard_gates``."""
    return reason.startswith("gate:") and reason[5:] in policy.budgets.hard_gates


def budget_key(kind: str, pool: str, hard: bool) -> str:
    """The ledger's key: confirmed hard gates spend their own budget (``hard:`` prefix)."""
    return f"hard:{kind}:{pool}" if hard else f"{kind}:{pool}"


def node_of(t: HealthTuple) -> str:
    if t.kind == "node":
        return t.entity
    for k in ("node", "Hostname", "hostname"):
        if t.labels.get(k):
            return t.labels[k]
    return t.entity.rsplit("/", 1)[0]


def choose_tier(kind: str, obs_reason: str, worst: str | None) -> Tier:
    """Smallest isolation that fits: a node's faults isolate the node; a replica's own faults drain the
    instance, except memory trouble, leaks, hangs and gates, which need a rebuilt worker (pod)."""
    if kind == "node":
        return Tier.NODE
    text = f"{obs_reason} {worst or ''}".lower()
    return Tier.POD if any(h in text for h in POD_TIER_HINTS) else Tier.INSTANCE


class _Cycle:
    """Mutable working set of one ``decide`` call (on a private copy of the state)."""

    def __init__(self, policy: Policy, state: DecisionState, now: float, version: str) -> None:
        self.p = policy
        self.s = state
        self.now = now
        self.transitions: list[Transition] = []
        self.intents: list[Intent] = []
        self.version = version
        self.pool_sizes: dict[str, int] | None = None  # computed on the first budget check of a cycle
        self.copied: set[str] = set()
        self.gpu_by_node: Mapping[str, list[HealthTuple]] = {}  # this cycle's flagged GPUs per node

    def incident(self, key: str, entity: str, reason: str, params: dict[str, Any], sig: Any = None) -> None:
        """The condition ``key`` holds this cycle: one PAGE when it opens, an update when ``sig``
        changes (decide.incidents), one resolution once it has not held for incident_clear_s."""
        b = self.p.budgets
        page = incidents.assert_incident(self.s.incidents, self.s.pages, key, entity, reason,
                                         {"severity": "page", **params}, sig, self.now, b.incident_update_s)
        if page is not None:
            self.emit(IntentKind.PAGE, page[0], page[1], page[2])

    def close_incidents(self) -> None:
        for entity, reason, params in incidents.close_stale(self.s.incidents, self.s.pages, self.now,
                                                            self.p.budgets.incident_clear_s, self.s.frozen):
            self.emit(IntentKind.PAGE, entity, reason, params)

    def mut(self, eid: str) -> EntityLifecycle:
        """The entity, copied on first change: the caller's state is never modified, and a steady
        entity costs no copy."""
        if eid not in self.copied:
            self.s.entities[eid] = self.s.entities[eid].copy()
            self.copied.add(eid)
        return self.s.entities[eid]

    def emit(self, kind: IntentKind, entity: str, reason: str, params: dict[str, Any] | None = None,
             tier: Tier | None = None, soft: bool = False) -> None:
        pr = dict(params or {})
        pr["n"] = self.s.seq
        self.s.seq += 1
        self.intents.append(Intent(self.now, kind, entity, reason, pr, tier, soft, self.version))


class Decider:
    """``fast`` (the default) reuses, from one cycle to the next, what cannot have changed: the tuple and
    observation objects of entities whose scores are bit-for-bit the same, the verdict that a steady
    entity's (unchanged) lifecycle and observation need nothing, and it skips the per-entity work of the
    passes that only act on flagged, held or unhealthy entities. Every cache is keyed on object
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
        self._obs_of: dict[str, tuple[HealthTuple, bool, Observation]] = {}
        self._labels_ok: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self._steady_ok: dict[str, tuple[EntityLifecycle, Observation]] = {}
        self._app_flags = frozenset(f"xid:{x}" for x in self.policy.xid.app_xids)

    # ------------------------------------------------------------------------------------------
    def decide(self, state: DecisionState, health: Any, now: float, events: Sequence[Event] = (),
               serving: Any = None, labels_key: Hashable | None = None) -> Decision:
        """One cycle. ``health``: the remediation consumer's FleetHealth (or a mapping / iterable of
        HealthTuples); ``serving``: the serving consumer's FleetHealth for router weights (defaults to
        ``health``). ``labels_key``: equal across cycles only while the entities' metadata labels cannot
        differ (``DecisionLoop`` passes ``signals.history.shape_token`` of the scored view); labels are
        then reused instead of asked for again. The input state is not modified."""
        p = self.policy
        lc = p.lifecycle
        c = _Cycle(p, state.shallow(), now, self._version)
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
        for g in flagged_gpus:
            n = node_of(g)
            node_flags[n].update(g.flags)
            gpu_by_node[n].append(g)

        labels_ok = self._labels_ok
        for t in life:
            es = s.entities.get(t.entity)
            if es is None:
                start = State.READY if t.kind == "node" else State.STARTING
                es = s.entities[t.entity] = EntityLifecycle(t.entity, t.kind, start, now)
                c.copied.add(t.entity)
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
            drain = bool((fl and not DRAIN_FLAGS.isdisjoint(fl)) or (ht.flags and not DRAIN_FLAGS.isdisjoint(ht.flags)))
            if fast:
                hit = obs_of.get(eid)
                if hit is not None and hit[0] is ht and hit[1] == drain:
                    obs[eid] = hit[2]
                    continue
            made = obs[eid] = Observation(ht.value, ht.confidence, ht.reason, gate=ht.reason.startswith("gate:"),
                                          drain_reset=drain)
            if fast:
                obs_of[eid] = (ht, drain, made)

        self._fleet_confidence(c, obs)
        blamed = self._app_xids(c, life, flagged_gpus)
        for n, why in blamed.items():
            o = obs.get(n)
            if o is not None and o.usable(lc) and not o.gate:
                obs[n] = Observation(o.value, o.confidence, why, gate=True, drain_reset=o.drain_reset)
        suspects = self._versions(c, obs)
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

        if fast:
            # A steady entity is skipped whatever the order (stepping one entity never changes another),
            # so only the others are sorted.
            todo: Iterable[str] = sorted(self._unsteady(c, obs, serving_by_id, by_id, ev_by_entity), key=order)
        else:
            todo = sorted(s.entities, key=order)
        for eid in todo:
            if not fast and eid not in ev_by_entity and self._steady(s.entities[eid], obs.get(eid)):
                continue
            es = c.mut(eid)
            self._step_entity(c, es, obs.get(eid), by_id.get(eid), ev_by_entity.get(eid, []), suspects,
                              node_flags.get(eid, set()))
            if es.kind == "node":
                self._scheduler(c, es, obs.get(eid))
            else:
                st = serving_by_id.get(eid) or by_id.get(eid)
                self._router(c, es, None if st is None else Observation(st.value, st.confidence, st.reason))
        c.close_incidents()
        s.last_ts = now
        return Decision(s, c.transitions, c.intents, now)

    def _unsteady(self, c: _Cycle, obs: Mapping[str, Observation | None], serving_by_id: Mapping[str, HealthTuple],
                  by_id: Mapping[str, HealthTuple], ev_by_entity: Mapping[str, list[Event]]) -> list[str]:
        """The entities that need a step this cycle. A steady node is skipped as in the plain loop (its
        verdict remembered while its lifecycle and observation objects are the same ones); a steady
        serving replica (``_steady_replica``) gets in one go what its step would do."""
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
                if self._steady(es, o):
                    seen[eid] = (es, o)  # type: ignore[assignment]
                    continue
            elif es.kind == "replica" and o is not None:
                st = serving_by_id.get(eid) or by_id.get(eid)
                if self._steady_replica(c, es, o, st, lims):
                    ents[eid] = es.seen(o.value, o.confidence, o.reason, c.now)
                    continue
            out.append(eid)
        return out

    def _steady_replica(self, c: _Cycle, es: EntityLifecycle, o: Observation, st: HealthTuple | None,
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

    # ------------------------------------------------------------------------------------------
    def _absences(self, c: _Cycle, present: Mapping[str, HealthTuple]) -> None:
        """Track entities the engine no longer reports at all; forget those gone for FORGET_AFTER_S that
        hold nothing (never an isolated, degraded or held one: no quarantine is ever forgotten)."""
        for eid in list(c.s.entities):
            es = c.s.entities[eid]
            if eid in present:
                if es.absent_since is not None:
                    c.mut(eid).absent_since = None
            elif es.absent_since is None:
                c.mut(eid).absent_since = c.now
            elif (c.now - es.absent_since >= FORGET_AFTER_S and es.state in FORGETTABLE_STATES
                  and not es.no_new_work and not es.blocked):
                del c.s.entities[eid]

    def _fleet_confidence(self, c: _Cycle, obs: Mapping[str, Observation | None]) -> None:
        """Entities out of service do not count (their telemetry may rightly be gone), nor do ones gone
        for longer than ABSENT_GRACE_S (scaled down, decommissioned), nor ones that never had a usable
        observation (a controller's first cycles: rates and burn rates need two samples, so a whole fleet
        reads low confidence at start; that is warm-up, not a telemetry outage, and nothing acts on it
        anyway), except while frozen: a freeze ends when data returns, never because the silent entities
        were forgotten by the history."""
        p = self.policy
        if self.fast:
            total, n_low = self._confidence_counts(c, obs)
        else:
            def usable(eid: str) -> bool:
                o = obs.get(eid)
                return o is not None and o.usable(p.lifecycle)

            counted = [eid for eid, es in c.s.entities.items()
                       if es.state != State.STARTING and es.state not in ISOLATED_STATES
                       and (es.absent_since is None or c.s.frozen or c.now - es.absent_since < ABSENT_GRACE_S)
                       and (es.last_known_ts is not None or c.s.frozen or usable(eid))]
            low = [eid for eid in counted if not usable(eid)]
            total, n_low = len(counted), len(low)
        frac = n_low / total if total else 0.0
        frozen = total >= p.fleet.min_entities and frac >= p.fleet.low_confidence_fraction
        if frozen and not c.s.frozen:
            c.s.frozen, c.s.frozen_since = True, c.now
            c.emit(IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_low",
                   {"state": "firing", "low": n_low, "total": total, "fraction": round(frac, 4),
                    "remediation": "frozen"})
        elif not frozen and c.s.frozen:
            c.s.frozen, c.s.frozen_since = False, None
            c.emit(IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_restored",
                   {"state": "resolved", "low": n_low, "total": total, "fraction": round(frac, 4),
                    "remediation": "resumed"})

    def _confidence_counts(self, c: _Cycle, obs: Mapping[str, Observation | None]) -> tuple[int, int]:
        """``_fleet_confidence``'s two counts in one pass: entities counted, and those without a usable
        observation."""
        lc = self.policy.lifecycle
        frozen, now = c.s.frozen, c.now
        total = low = 0
        for eid, es in c.s.entities.items():
            st = es.state
            if st == State.STARTING or st in ISOLATED_STATES:
                continue
            if es.absent_since is not None and not frozen and not now - es.absent_since < ABSENT_GRACE_S:
                continue
            o = obs.get(eid)
            bad = o is None or not o.usable(lc)
            if bad and es.last_known_ts is None and not frozen:
                continue  # never usable yet (a fresh start, counters seen once): warming up, not an outage
            total += 1
            low += bad
        return total, low

    def _app_xids(self, c: _Cycle, life: list[HealthTuple], gpus: list[HealthTuple]) -> dict[str, str]:
        """Charge application Xids to jobs; return the nodes that distinct jobs keep hitting."""
        p = self.policy
        app = {f"xid:{x}" for x in p.xid.app_xids}
        win = p.attribution.app_xid_window_s
        # GPU tuples know their job; a node tuple is used only when none of its GPUs said anything.
        hits: list[tuple[str, str, str]] = []  # node, job, flag
        seen_nodes: set[str] = set()
        for g in gpus:
            for f in g.flags:
                if f in app:
                    n = node_of(g)
                    hits.append((n, g.labels.get("job", "") or "unknown", f))
                    seen_nodes.add(n)
        for t in life:
            if t.kind == "node" and t.entity not in seen_nodes:
                for f in t.flags:
                    if f in app:
                        hits.append((t.entity, t.labels.get("job", "") or "unknown", f))
        jobs: dict[str, set[str]] = defaultdict(set)
        job_xids: dict[str, set[str]] = defaultdict(set)
        for n, job, f in hits:
            c.s.app_xids.setdefault(n, {})[job] = c.now
            jobs[job].add(n)
            job_xids[job].add(f)
        for n in list(c.s.app_xids):
            kept = {j: ts for j, ts in c.s.app_xids[n].items() if c.now - ts <= win}
            if kept:
                c.s.app_xids[n] = kept
            else:
                del c.s.app_xids[n]
        for job in sorted(jobs):
            c.incident(f"job:{job}", f"job/{job}", "app_xid:job",
                       {"severity": "ticket", "job": job, "xids": sorted(job_xids[job]),
                        "nodes": sorted(jobs[job])[:20], "n_nodes": len(jobs[job])},
                       sig=[len(jobs[job]), sorted(job_xids[job])])
        for job in sorted({j for js in c.s.app_xids.values() for j in js} - set(jobs)):
            incidents.refresh(c.s.incidents, f"job:{job}", c.now)  # still inside its window: still open
        out: dict[str, str] = {}
        for n, js in c.s.app_xids.items():
            if len(js) >= p.attribution.app_xid_distinct_jobs:
                out[n] = f"attribution:app_xid:{len(js)}_jobs"
        return out

    def _versions(self, c: _Cycle, obs: Mapping[str, Observation | None]) -> dict[tuple[str, str], str]:
        """Version label values that failures correlate with: (label, value) -> page reason."""
        p = self.policy
        a = p.attribution
        lc = p.lifecycle
        out: dict[tuple[str, str], str] = {}
        kinds: Iterable[str] = LIFECYCLE_KINDS
        if self.fast:
            # a kind with fewer unhealthy entities than version_min_entities has nothing to say: count
            # them in one pass before building anything
            n_bad: dict[str, int] = defaultdict(int)
            minc, deg = lc.min_confidence, lc.degraded_below
            ents = c.s.entities
            for eid, o in obs.items():
                if (o is not None and o.value is not None and o.confidence >= minc
                        and (o.gate or o.value < deg)):
                    n_bad[ents[eid].kind] += 1
            kinds = [k for k in LIFECYCLE_KINDS if n_bad[k] >= a.version_min_entities]
        for kind in kinds:
            usable = {eid: o for eid, o in obs.items()
                      if o is not None and o.usable(lc) and c.s.entities[eid].kind == kind}
            bad = {eid for eid, o in usable.items() if o.gate or (o.value is not None and o.value < lc.degraded_below)}
            if len(bad) < a.version_min_entities:
                continue
            for label in a.version_labels:
                pop: dict[str, int] = defaultdict(int)
                nbad: dict[str, int] = defaultdict(int)
                for eid in usable:
                    v = c.s.entities[eid].labels.get(label)
                    if v is None:
                        continue
                    pop[v] += 1
                    if eid in bad:
                        nbad[v] += 1
                total_pop = sum(pop.values())
                for v, k in sorted(nbad.items()):
                    if k < a.version_min_entities or k / len(bad) < a.version_fraction:
                        continue
                    rate = k / pop[v]
                    other_pop = total_pop - pop[v]
                    if other_pop > 0:
                        other_rate = (sum(nbad.values()) - k) / other_pop
                        if not rate > 2 * other_rate:
                            continue
                    elif rate < a.version_fraction:
                        continue
                    out[(label, v)] = f"version:{label}={v}"
                    c.incident(f"version:{kind}:{label}={v}", f"version/{label}={v}", "version_correlation",
                               {"label": label, "value": v, "kind": kind, "unhealthy": k,
                                "unhealthy_total": len(bad), "population": pop[v]}, sig=k)
        return out

    def _repairs(self, c: _Cycle, obs: Mapping[str, Observation | None], node_flags: Mapping[str, set[str]],
                 ev_by_entity: dict[str, list[Event]]) -> None:
        """Advance every repair ladder in progress (``decide.ladder``): executor results (``reset``
        events) and verification results (``active_test``) go to the ladder, not straight to the
        lifecycle; timeouts escalate; the ladder's verdicts come back as lifecycle events (verified: an
        active-test pass; exhausted: a ``repair`` failure, to FAILED). While remediation is frozen or the
        node's data is unusable, results are still recorded but no timeout fires."""
        rem = self.policy.remediation
        lc = self.policy.lifecycle
        # only the few entities with a ladder running do any work (replacing a value while iterating is safe)
        running = [(eid, es) for eid, es in c.s.entities.items() if es.repair is not None]
        for eid, es in running:
            rep = es.repair
            if rep is None or rep.get("phase") in ("verified", "exhausted"):
                continue
            lad = ladder.ladder_of(rem, rep)
            if lad is None or not rem.enabled:  # the policy no longer has it: the lifecycle decides alone
                c.mut(eid).repair = None
                continue
            evs = ev_by_entity.get(eid, [])
            keep: list[Event] = []
            intents: list[ladder.StepIntent] = []
            verdict: str | None = None
            for e in evs:
                r: ladder.LadderStep | None = None
                if verdict is None and e.kind == "reset" and e.passed is not None:
                    detail = str(e.payload.get("detail") or e.payload.get("reason") or "")
                    r = ladder.on_result(lad, rep, bool(e.passed), c.now, detail)
                elif verdict is None and e.kind == "active_test" and e.passed is not None:
                    r = ladder.on_test(lad, rep, bool(e.passed), c.now)
                    if r is None:
                        if e.passed:
                            keep.append(e)  # a pass from elsewhere still lets the node out
                        continue  # a failure outside verification: the ladder goes on
                elif e.kind == "reset":
                    continue  # the ladder owns reset results while it runs
                if r is None:
                    keep.append(e)
                    continue
                rep, verdict = r.repair or rep, r.verdict
                intents += r.intents
            o = obs.get(eid)
            if verdict is None and not c.s.frozen and o is not None and o.usable(lc):
                # timeouts are read on usable data only, like the drain timeout: nothing escalates on unknown
                r = ladder.on_tick(lad, rep, c.now, node_flags.get(eid, set()), True)
                rep, verdict = r.repair or rep, r.verdict
                intents += r.intents
            if rep is not es.repair:
                c.mut(eid).repair = rep
            for si in intents:
                c.emit(si.kind, eid, f"repair:{lad.name}", si.params, si.tier)
            if verdict == ladder.VERIFIED:
                keep.append(Event(c.now, "active_test", eid, passed=True, actor=f"repair:{lad.name}"))
            elif verdict == ladder.EXHAUSTED:
                keep.append(Event(c.now, "repair", eid, passed=False, actor=f"repair:{lad.name}"))
            if keep != evs:
                if keep:
                    ev_by_entity[eid] = keep
                else:
                    ev_by_entity.pop(eid, None)
                    # the entity still needs a step this cycle when its ladder moved
                    if rep is not es.repair or intents:
                        ev_by_entity[eid] = []

    def _start_repair(self, c: _Cycle, es: EntityLifecycle, flags: set[str], reason: str) -> bool:
        """On a fresh isolation of a node, start the first ladder that covers its fault. True: started
        (its first step replaces the plain reset / entry test)."""
        from fleethealth.signals.xid import xid_bucket

        if es.kind != "node" or ladder.running(es.repair):
            return False
        lad = ladder.match(self.policy.remediation, flags, reason, xid_bucket)
        if lad is None:
            return False
        when = set(lad.when)
        trig = sorted(f for f in flags if ladder.tokens([f], xid_bucket) & when)
        gpus = sorted(g.entity for g in c.gpu_by_node.get(es.entity, []) if set(g.flags) & set(trig))
        r = ladder.begin(lad, c.now, reason, trig, gpus, self.policy.lifecycle.active_test)
        es.repair = r.repair
        for si in r.intents:
            c.emit(si.kind, es.entity, f"repair:{lad.name}", si.params, si.tier)
        return True

    def _row_remaps(self, c: _Cycle, obs: Mapping[str, Observation | None], node_flags: Mapping[str, set[str]],
                    gpu_by_node: Mapping[str, list[HealthTuple]]) -> None:
        p = self.policy
        reset_flags = {"row_remap_pending"} | {f"xid:{x}" for x in p.xid.reset_xids}
        if self.fast:
            # only a flagged node or one with a reset outstanding has anything to do here
            todo: Iterable[str] = sorted({eid for eid, es in c.s.entities.items() if es.reset_scheduled}
                                         | {eid for eid in node_flags if eid in c.s.entities})
        else:
            todo = sorted(c.s.entities)
        for eid in todo:
            es = c.s.entities[eid]
            o = obs.get(eid)
            if es.kind != "node" or o is None or o.value is None:
                continue
            nf = node_flags.get(eid)
            flags = nf & reset_flags if nf else set()
            if not flags:
                if o.usable(p.lifecycle) and es.reset_scheduled:
                    c.mut(eid).reset_scheduled = False
                continue
            if es.reset_scheduled or c.s.frozen or es.state in ISOLATED_STATES or not o.usable(p.lifecycle):
                continue
            gpus = sorted(g.entity for g in gpu_by_node.get(eid, []) if set(g.flags) & reset_flags)
            es = c.mut(eid)
            es.reset_scheduled = True
            c.emit(IntentKind.SCHEDULE_RESET, eid, "row_remap_pending",
                   {"action": "GPU_RESET", "when": "next_safe_point", "drain": True, "gpus": gpus,
                    "flags": sorted(flags)}, Tier.NODE)
            self._recurring_remaps(c, es, gpus)

    def _recurring_remaps(self, c: _Cycle, es: EntityLifecycle, gpus: list[str]) -> None:
        """A GPU whose memory needs row-remap resets again and again is failing: at the
        ``lifecycle.max_row_remaps``-th within ``recovery_window_s``, page for repair (the reset still
        goes ahead). A node-level remap (no GPU named) counts for the node."""
        lc = self.policy.lifecycle
        es.remaps = [r for r in es.remaps if c.now - float(r[0]) < lc.recovery_window_s] + [[c.now, list(gpus)]]
        for g in gpus or [es.entity]:
            times = [float(r[0]) for r in es.remaps if g in r[1] or (not r[1] and g == es.entity)]
            if len(times) >= lc.max_row_remaps:
                c.emit(IntentKind.PAGE, g, "recurring:row_remap",
                       {"severity": "page", "node": es.entity, "gpu": g, "remaps": len(times),
                        "first": min(times), "window_s": lc.recovery_window_s, "action": "repair",
                        "summary": f"{g}: {len(times)} row-remap resets in {lc.recovery_window_s / 86400:g} days; "
                                   "its memory keeps failing, schedule a repair (RMA)"})

    def _oom(self, c: _Cycle, e: Event) -> str | None:
        """Classify a CUDA OOM with ``decide.oom``. The small actions (reject, limit concurrency, rebuild a
        fragmented worker) pass through (the rebuild not while frozen); a device fault instead becomes a
        gate on the replica's and its node's lifecycles, so budgets and freezes apply. Returns the node
        (or replica) to gate, if any."""
        from fleethealth.decide import oom

        fields: dict[str, Any] = {"ts": e.ts, "entity": e.entity}
        for k, v in e.payload.items():
            fields[k] = tuple(v) if isinstance(v, list) else v
        try:
            ev = oom.OomEvent(**fields)
        except TypeError as err:
            c.emit(IntentKind.PAGE, e.entity, "oom:unreadable_event", {"severity": "ticket", "error": str(err)})
            return None
        produced = oom.oom_intents(ev, c.now, policy_version=c.version)
        if any(it.kind == IntentKind.QUARANTINE for it in produced):
            return e.entity
        if any(it.kind == IntentKind.LIMIT_CONCURRENCY for it in produced) and e.entity in c.s.entities:
            c.mut(e.entity).overload_until = c.now + self.policy.lifecycle.overload_hold_s
        for it in produced:
            if c.s.frozen and it.kind in REMEDIATION_KINDS:
                continue
            c.emit(it.kind, it.entity or e.entity, it.reason, dict(it.params), it.tier, it.soft)
        return None

    # ------------------------------------------------------------------------------------------
    def _veto(self, c: _Cycle, es: EntityLifecycle, rule: Rule, suspects: Mapping[tuple[str, str], str],
              approved: bool = False) -> str | None:
        """Why this remediation may not happen now (None: it may). ``approved``: a human acknowledged
        (``ack`` to QUARANTINED) a quarantine that budgets, TP groups, versions or a freeze held back."""
        if approved and rule.dst in REMEDIATION_TARGETS:
            return None
        signal_driven = rule.cond in SIGNAL_CONDS or rule.cond in (Cond.HARD_GATE, Cond.DRAIN_RESET)
        if c.s.frozen and signal_driven and rule.dst in WORSE_STATES:
            return "frozen:fleet_confidence"  # the telemetry itself is in doubt
        if rule.dst not in REMEDIATION_TARGETS:
            return None
        if es.state in ISOLATED_STATES or rule.cond in (Cond.HUMAN_QUARANTINE, Cond.HUMAN_READY):
            return None  # already out of service, or a human said so
        if (es.kind == "replica" and es.overload_until is not None and c.now < es.overload_until
                and rule.cond in SIGNAL_CONDS):
            # the smallest tier that fits: overload was answered at the instance (concurrency limit)
            return "held:overload"
        p = self.policy
        for label in p.attribution.version_labels:
            v = es.labels.get(label)
            if v is not None and (label, v) in suspects:
                return suspects[(label, v)]
        b = p.budgets
        hard = self._hard_gate(rule, es.last_reason)
        if es.kind == "node" and not hard:
            # a confirmed hard gate's node already costs its group its capacity: isolating it costs nothing
            g = es.labels.get("tp_group")
            if g:
                # isolations that still cost the group capacity: FAILED is a human's and does not count
                isolated = sum(1 for o in c.s.entities.values() if o.entity != es.entity and o.kind == "node"
                               and o.labels.get("tp_group") == g and o.state in REMEDIATION_TARGETS)
                if isolated >= b.max_per_tp_group:
                    c.incident(f"tp_group:{g}", f"tp_group/{g}", "tp_group_limit",
                               {"tp_group": g, "isolated": isolated, "wanted": es.entity,
                                "limit": b.max_per_tp_group}, sig=isolated)
                    return f"tp_group:{g}"
        pool = es.labels.get("pool", "default")
        key = budget_key(es.kind, pool, hard)
        if c.pool_sizes is None:
            c.pool_sizes = defaultdict(int)
            for o in c.s.entities.values():
                c.pool_sizes[f"{o.kind}:{o.labels.get('pool', 'default')}"] += 1
        size = c.pool_sizes[f"{es.kind}:{pool}"]
        if hard:
            allowed = max(b.hard_gate_min_per_hour, math.floor(b.hard_gate_fraction_per_hour * size))
        else:
            allowed = max(b.quarantine_min_per_hour, math.floor(b.quarantine_fraction_per_hour * size))
        # Distinct entities: isolating the same node again (a relapse) spends nothing new.
        spent = {e for ts, k, e in c.s.ledger if k == key and c.now - ts < b.window_s}
        used = len(spent)
        if es.entity not in spent and used >= allowed:
            c.incident(f"budget:{es.kind}:{pool}", f"pool/{pool}", "budget_exhausted",
                       {"pool": pool, "kind": es.kind, "used": used, "allowed": allowed, "pool_size": size,
                        "wanted": es.entity, "window_s": b.window_s, "budget": "hard_gate" if hard else "rate"},
                       sig=used)
            return f"budget:{pool}" + (":hard_gate" if hard else "")
        return None

    def _hard_gate(self, rule: Rule, reason: str) -> bool:
        """A confirmed hard gate: the hardware is already out of service (a GPU off the bus, a DBE, a
        catalog action that needs a reset or reboot), not a score's judgement or an inference."""
        if rule.cond == Cond.DRAIN_RESET:
            return True
        return rule.cond == Cond.HARD_GATE and is_hard_gate_reason(reason, self.policy)

    def _soft_fallback(self, c: _Cycle, es: EntityLifecycle, why: str, o: Observation | None) -> None:
        if es.blocked == why:
            return
        if es.blocked is None:
            es.blocked_since = c.now
        es.blocked = why
        if why.startswith("frozen"):
            return  # a metrics outage: no action at all
        if es.kind == "node":
            es.no_new_work = True
            c.emit(IntentKind.NO_NEW_WORK, es.entity, f"held:{why}", {"instead_of": "quarantine"}, Tier.NODE, soft=True)
        else:
            cur = 1.0 if es.weight is None else es.weight
            val = cur if o is None or o.value is None else min(cur, o.value)
            w = round(max(self.policy.router.min_weight, val * 0.5), 2)
            es.weight = w
            c.emit(IntentKind.SET_WEIGHT, es.entity, f"held:{why}", {"weight": w, "instead_of": "quarantine"},
                   Tier.INSTANCE, soft=True)

    def _step_entity(self, c: _Cycle, es: EntityLifecycle, o: Observation | None, t: HealthTuple | None,
                     events: list[Event], suspects: Mapping[tuple[str, str], str], flags: set[str]) -> None:
        p = self.policy
        lc = p.lifecycle
        now = c.now
        usable = o is not None and o.usable(lc)
        if o is not None:
            es.last_value, es.last_confidence, es.last_reason = o.value, o.confidence, o.reason
        if usable:
            es.last_known_ts = now
        advance_timers(es.timers, o, now, lc, es.state)
        conds = holding_conds(o, lc)
        if usable and es.state == State.STARTING:
            conds.add(Cond.FIRST_DATA)
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
        chosen: Rule | None = None
        for rule in candidate_rules(es.state, conds, es.timers, now - es.since, lc):
            if rule.cond == Cond.DRAIN_TIMEOUT and ladder.running(es.repair):
                continue  # the repair ladder's own timeouts apply while it runs
            why = self._veto(c, es, rule, suspects, approved=Cond.HUMAN_QUARANTINE in conds)
            if why is None:
                chosen = rule
                break
            self._soft_fallback(c, es, why, o)
        if chosen is None:
            if es.blocked and not any(r.dst in REMEDIATION_TARGETS for r in
                                      candidate_rules(es.state, conds, es.timers, now - es.since, lc)):
                es.blocked, es.blocked_since = None, None  # nothing wants remediation any more
            self._flag(c, es, o)
            return
        self._transition(c, es, chosen, o, t, event_of.get(chosen.cond), flags)

    def _transition(self, c: _Cycle, es: EntityLifecycle, rule: Rule, o: Observation | None, t: HealthTuple | None,
                    ev: Event | None, flags: set[str]) -> None:
        p = self.policy
        now = c.now
        src, dst = es.state, rule.dst
        if ev is not None:
            reason = f"event:{rule.cond}" + (f":{ev.actor}" if ev.actor else "")
        else:
            reason = o.reason if o is not None else str(rule.cond)
        detail = str(rule.cond) + (f" dwell {getattr(p.lifecycle, rule.dwell):g}s" if rule.dwell else "")
        c.transitions.append(Transition(
            now, es.entity, es.kind, src, dst, reason, None if o is None else o.value,
            0.0 if o is None else o.confidence, c.version, detail,
        ))
        es.timers = timers_after_transition(es.timers, src, dst)
        advance_timers(es.timers, o, now, p.lifecycle, dst)  # the new state's windows start now
        es.state, es.since = dst, now
        es.transitions += 1
        if dst in REMEDIATION_TARGETS or dst == State.READY:
            es.blocked, es.blocked_since = None, None
        es.flagged = False
        if dst in REMEDIATION_TARGETS and src not in ISOLATED_STATES:
            c.s.ledger.append((now, budget_key(es.kind, es.labels.get("pool", "default"),
                                               self._hard_gate(rule, es.last_reason)), es.entity))
        worst = None if t is None else t.worst
        tier = choose_tier(es.kind, reason, worst)
        info = {"from": str(src), "value": None if o is None else o.value}
        fresh_isolation = src not in ISOLATED_STATES
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
            if not (ladder.running(es.repair) or fresh_isolation and self._start_repair(c, es, flags, reason)):
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
            if not (ladder.running(es.repair) or fresh_isolation and self._start_repair(c, es, flags, reason)):
                c.emit(IntentKind.SCHEDULE_RESET, es.entity, reason,
                       {"action": "GPU_RESET", "when": "after_drain", "drain": True}, Tier.NODE)
        elif dst == State.RECOVERING:
            es.recoveries = [r for r in es.recoveries if now - r < p.lifecycle.recovery_window_s] + [now]
            repaired = {} if es.repair is None else {"repair": ladder.summary(es.repair)}
            es.repair = None
            c.emit(IntentKind.RELEASE, es.entity, reason, {"canary": True, **info, **repaired}, tier)
        elif dst == State.FAILED:
            tried = {} if es.repair is None else {"repair": ladder.summary(es.repair), "action": "replace"}
            c.emit(IntentKind.PAGE, es.entity, reason,
                   {"severity": "page", "state": "FAILED", "recoveries": len(es.recoveries), **info, **tried})
        elif dst == State.READY and src in ISOLATED_STATES:
            es.repair = None
            c.emit(IntentKind.RELEASE, es.entity, reason, {"canary": False, **info}, tier)

    def _flag(self, c: _Cycle, es: EntityLifecycle, o: Observation | None) -> None:
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
    def _scheduler(self, c: _Cycle, es: EntityLifecycle, o: Observation | None) -> None:
        """Training scheduler: no new work on a node that is not READY, or whose health is unknown."""
        lc = self.policy.lifecycle
        usable = o is not None and o.usable(lc)
        held = es.blocked is not None and not es.blocked.startswith("frozen")
        if es.state == State.READY and not held:
            if usable:
                want = False
            elif c.s.frozen:
                return  # telemetry outage: keep what was decided before it
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

    def _router(self, c: _Cycle, es: EntityLifecycle, o: Observation | None) -> None:
        """Router weight = serving score; held while unknown for hold_s, then stepped down."""
        r = self.policy.router
        lc = self.policy.lifecycle
        now = c.now
        serving_states = (State.READY, State.DEGRADED, State.RECOVERING)
        reason = "score"
        if es.state not in serving_states:
            w = 0.0
            reason = f"state:{es.state}"
        elif es.blocked and not es.blocked.startswith("frozen"):
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

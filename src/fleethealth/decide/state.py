"""The decisions layer's state and its inputs and outputs, as plain serialisable data.

Everything here round-trips through ``to_dict``/``from_dict`` (JSON-safe), so the store can persist it
and a restarted controller resumes exactly where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleethealth.decide.lifecycle import Timer
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition


@dataclass(slots=True)
class EntityLifecycle:
    """One node's or serving replica's lifecycle, timers and consumer-facing facts."""

    entity: str
    kind: str  # node | replica
    state: State
    since: float  # when the current state was entered
    timers: dict[str, Timer] = field(default_factory=dict)
    transitions: int = 0  # flapping metric
    recoveries: list[float] = field(default_factory=list)  # entries into RECOVERING
    labels: dict[str, str] = field(default_factory=dict)
    last_value: float | None = None
    last_confidence: float = 0.0
    last_reason: str = ""
    last_known_ts: float | None = None  # last usable observation (a steady healthy node: when it became so)
    weight: float | None = None  # replica: last published router weight
    no_new_work: bool = False  # node: last published scheduler hold
    flagged: bool = False  # READY but below lifecycle.flag_below
    blocked: str | None = None  # why a wanted remediation is held back (budget, tp group, version, ...)
    reset_scheduled: bool = False  # a SCHEDULE_RESET is outstanding (row remap pending, ...)
    absent_since: float | None = None  # no tuple at all since then (the engine forgot it)
    # replica: an OOM from batch overload limited its concurrency; until then its latency is overload,
    # handled at the instance tier, not a reason to quarantine it
    overload_until: float | None = None
    # the repair ladder in progress (decide.ladder): which ladder, step, phase, since, history
    repair: dict[str, Any] | None = None
    blocked_since: float | None = None  # when the wanted remediation was first held back (oldest first)
    remaps: list[list[Any]] = field(default_factory=list)  # node: [ts, gpus] of each row-remap reset scheduled
    # isolations and degraded spells: [ts, family, gpus, kind] within recurring.window_s (decide.recurring)
    episodes: list[list[Any]] = field(default_factory=list)
    # node: the open version incident (``version:node:<label>=<value>``) that explains its isolation
    # (decide.safety ``_version_holds``): held, no repair ladder, retested when the incident resolves
    version_hold: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "entity": self.entity, "kind": self.kind, "state": str(self.state), "since": self.since,
            "timers": {k: t.to_dict() for k, t in sorted(self.timers.items())},
            "transitions": self.transitions, "recoveries": list(self.recoveries), "labels": dict(self.labels),
            "last_value": self.last_value, "last_confidence": self.last_confidence,
            "last_reason": self.last_reason, "last_known_ts": self.last_known_ts, "weight": self.weight,
            "no_new_work": self.no_new_work, "flagged": self.flagged, "blocked": self.blocked,
            "reset_scheduled": self.reset_scheduled, "absent_since": self.absent_since,
            "overload_until": self.overload_until, "repair": self.repair,
            "blocked_since": self.blocked_since, "remaps": [list(x) for x in self.remaps],
            "episodes": [[e[0], e[1], list(e[2]), e[3]] for e in self.episodes],
            "version_hold": self.version_hold,
        }

    def copy(self) -> EntityLifecycle:
        """A deep copy (much cheaper than copy.deepcopy, which dominated a cycle)."""
        return EntityLifecycle(
            self.entity, self.kind, self.state, self.since,
            {k: Timer(t.accum_s, t.last_ts) for k, t in self.timers.items()}, self.transitions,
            list(self.recoveries), dict(self.labels), self.last_value, self.last_confidence, self.last_reason,
            self.last_known_ts, self.weight, self.no_new_work, self.flagged, self.blocked, self.reset_scheduled,
            self.absent_since, self.overload_until, repair=self.repair, blocked_since=self.blocked_since,
            remaps=[list(x) for x in self.remaps], episodes=[[e[0], e[1], list(e[2]), e[3]] for e in self.episodes],
            version_hold=self.version_hold,
        )

    def fork(self) -> EntityLifecycle:
        """The decider's working copy of an entity it changes this cycle (``Cycle.mut``): ``copy`` except that
        the lists the decider only ever replaces, never changes in place (recoveries, remaps, episodes: each
        pass assigns a new list), are shared, as ``seen`` shares them. A fleet-wide flag storm changes every
        node every cycle: three lists less per node per cycle for the cyclic collector to walk."""
        return EntityLifecycle(
            self.entity, self.kind, self.state, self.since,
            {k: Timer(t.accum_s, t.last_ts) for k, t in self.timers.items()}, self.transitions,
            self.recoveries, dict(self.labels), self.last_value, self.last_confidence, self.last_reason,
            self.last_known_ts, self.weight, self.no_new_work, self.flagged, self.blocked, self.reset_scheduled,
            self.absent_since, self.overload_until, repair=self.repair, blocked_since=self.blocked_since,
            remaps=self.remaps, episodes=self.episodes, version_hold=self.version_hold,
        )

    def seen(self, value: float | None, confidence: float, reason: str, ts: float) -> EntityLifecycle:
        """This entity after a usable observation that changed nothing else (the decider's steady
        replicas): a new object sharing the containers, which neither object ever changes in place (the
        decider copies an entity before changing it)."""
        return EntityLifecycle(
            self.entity, self.kind, self.state, self.since, self.timers, self.transitions, self.recoveries,
            self.labels, value, confidence, reason, ts, self.weight, self.no_new_work, self.flagged,
            self.blocked, self.reset_scheduled, self.absent_since, self.overload_until, repair=self.repair,
            blocked_since=self.blocked_since, remaps=self.remaps, episodes=self.episodes,
            version_hold=self.version_hold,
        )

    @staticmethod
    def from_dict(d: dict[str, Any]) -> EntityLifecycle:
        return EntityLifecycle(
            entity=d["entity"], kind=d["kind"], state=State(d["state"]), since=float(d["since"]),
            timers={k: Timer.from_dict(v) for k, v in d.get("timers", {}).items()},
            transitions=int(d.get("transitions", 0)), recoveries=[float(x) for x in d.get("recoveries", [])],
            labels=dict(d.get("labels", {})), last_value=d.get("last_value"),
            last_confidence=float(d.get("last_confidence", 0.0)), last_reason=d.get("last_reason", ""),
            last_known_ts=d.get("last_known_ts"), weight=d.get("weight"),
            no_new_work=bool(d.get("no_new_work", False)), flagged=bool(d.get("flagged", False)),
            blocked=d.get("blocked"), reset_scheduled=bool(d.get("reset_scheduled", False)),
            absent_since=d.get("absent_since"), overload_until=d.get("overload_until"),
            repair=d.get("repair"), blocked_since=d.get("blocked_since"),
            remaps=[list(x) for x in d.get("remaps", [])],
            episodes=[[float(e[0]), str(e[1]), [str(g) for g in e[2]], str(e[3])] for e in d.get("episodes", [])
                      if isinstance(e, list) and len(e) == 4],
            version_hold=d["version_hold"] if isinstance(d.get("version_hold"), str) else None,
        )


@dataclass(slots=True)
class DecisionState:
    """All that the decisions layer remembers between cycles."""

    entities: dict[str, EntityLifecycle] = field(default_factory=dict)
    # quarantines granted: (ts, budget key "kind:pool", entity)
    ledger: list[tuple[float, str, str]] = field(default_factory=list)
    # application Xids seen per node: node -> job -> last ts
    app_xids: dict[str, dict[str, float]] = field(default_factory=dict)
    # pages already sent: page key -> ts (re-sent once the budget window has passed)
    pages: dict[str, float] = field(default_factory=dict)
    frozen: bool = False
    frozen_since: float | None = None
    seq: int = 0  # intents emitted so far (part of each intent's idempotency key)
    last_ts: float | None = None  # the last cycle decided
    # open incidents (decide.incidents): key -> entity, reason, params, signature, opened, seen, sent
    incidents: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entities": {k: e.to_dict() for k, e in sorted(self.entities.items())},
            "ledger": [list(x) for x in self.ledger],
            "app_xids": {n: dict(sorted(j.items())) for n, j in sorted(self.app_xids.items())},
            "pages": dict(sorted(self.pages.items())), "frozen": self.frozen, "frozen_since": self.frozen_since,
            "seq": self.seq, "last_ts": self.last_ts,
            "incidents": {k: dict(v) for k, v in sorted(self.incidents.items())},
        }

    def transition_counts(self) -> dict[str, int]:
        """Transitions per entity so far: the flapping metric (dwell times keep it low)."""
        return {k: e.transitions for k, e in sorted(self.entities.items())}

    def shallow(self) -> DecisionState:
        """Containers copied, entities shared: the decider copies an entity before changing it."""
        return DecisionState(
            dict(self.entities), list(self.ledger), {n: dict(j) for n, j in self.app_xids.items()},
            dict(self.pages), self.frozen, self.frozen_since, self.seq, self.last_ts,
            {k: dict(v) for k, v in self.incidents.items()},
        )

    def copy(self) -> DecisionState:
        return DecisionState(
            {k: e.copy() for k, e in self.entities.items()}, list(self.ledger),
            {n: dict(j) for n, j in self.app_xids.items()}, dict(self.pages), self.frozen, self.frozen_since,
            self.seq, self.last_ts, {k: dict(v) for k, v in self.incidents.items()},
        )

    @staticmethod
    def from_dict(d: dict[str, Any]) -> DecisionState:
        return DecisionState(
            entities={k: EntityLifecycle.from_dict(v) for k, v in d.get("entities", {}).items()},
            ledger=[(float(a), str(b), str(c)) for a, b, c in d.get("ledger", [])],
            app_xids={n: {j: float(t) for j, t in js.items()} for n, js in d.get("app_xids", {}).items()},
            pages={k: float(v) for k, v in d.get("pages", {}).items()}, frozen=bool(d.get("frozen", False)),
            frozen_since=d.get("frozen_since"), seq=int(d.get("seq", 0)), last_ts=d.get("last_ts"),
            incidents={k: dict(v) for k, v in d.get("incidents", {}).items()},
        )


# repair: a ladder exhausted; handover: a node's tensor-parallel peers' work was handed over (its ladder's
# tp_peers_handled precondition is met)
EVENT_KINDS = ("active_test", "reset", "ack", "oom", "repair", "handover")


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened outside the signals: an active-test or reset result, a human
    acknowledgement (``to`` READY or QUARANTINED), or a CUDA OOM (``payload`` holds the OomEvent fields)."""

    ts: float
    kind: str  # one of EVENT_KINDS
    entity: str
    passed: bool | None = None
    to: str | None = None
    actor: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {self.kind!r}: expected one of {', '.join(EVENT_KINDS)}")

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "kind": self.kind, "entity": self.entity, "passed": self.passed, "to": self.to,
                "actor": self.actor, "payload": dict(self.payload)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Event:
        return Event(float(d["ts"]), str(d["kind"]), str(d["entity"]), d.get("passed"), d.get("to"),
                     str(d.get("actor", "")), dict(d.get("payload") or {}))


def transition_from_dict(d: dict[str, Any]) -> Transition:
    return Transition(
        ts=float(d["ts"]), entity=d["entity"], kind=d["kind"], from_state=State(d["from"]),
        to_state=State(d["to"]), reason=d["reason"], value=d.get("value"),
        confidence=float(d.get("confidence", 0.0)), policy_version=d.get("policy_version", ""),
        detail=d.get("detail", ""),
    )


def intent_from_dict(d: dict[str, Any]) -> Intent:
    return Intent(
        ts=float(d["ts"]), kind=IntentKind(d["intent"]), entity=d["entity"], reason=d["reason"],
        params=dict(d.get("params") or {}), tier=None if d.get("tier") is None else Tier(d["tier"]),
        soft=bool(d.get("soft", False)), policy_version=d.get("policy_version", ""),
    )


@dataclass(slots=True)
class Decision:
    """One cycle's outcome: the new state, what changed and what should be done."""

    state: DecisionState
    transitions: list[Transition] = field(default_factory=list)
    intents: list[Intent] = field(default_factory=list)
    ts: float = 0.0
    # this decider's own (in service, low confidence) counts of the freeze, before any ``fleet_peers``
    # were added (what a shard publishes to the others); not persisted
    confidence_counts: tuple[int, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ts": self.ts, "state": self.state.to_dict(),
                "transitions": [t.to_dict() for t in self.transitions],
                "intents": [i.to_dict() for i in self.intents]}

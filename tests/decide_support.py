"""Helpers for the decisions tests: hand-made health tuples and a tiny driver over cycles."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from fleethealth.decide.decider import Decider
from fleethealth.decide.model import Intent, IntentKind, State, Transition
from fleethealth.decide.state import DecisionState, Event
from fleethealth.policy import Policy, default_policy
from fleethealth.score.health import HealthTuple


def tup(entity: str, value: float | None, conf: float = 1.0, reason: str | None = None, kind: str = "node",
        labels: dict[str, str] | None = None, flags: Sequence[str] = (), worst: str | None = None) -> HealthTuple:
    if reason is None:
        reason = "no_fresh_data" if value is None else f"min:{worst or 'performance'}"
    return HealthTuple(entity=entity, kind=kind, value=value, confidence=conf,  # type: ignore[arg-type]
                       worst=worst if value is not None else None, reason=reason, labels=dict(labels or {}),
                       flags=tuple(flags))


@dataclass
class Run:
    """Drives a Decider cycle by cycle and collects everything it said."""

    policy: Policy = field(default_factory=default_policy)
    state: DecisionState = field(default_factory=DecisionState)
    transitions: list[Transition] = field(default_factory=list)
    intents: list[Intent] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.decider = Decider(self.policy)

    def step(self, now: float, tuples: Iterable[HealthTuple], events: Sequence[Event] = ()) -> tuple[
            list[Transition], list[Intent]]:
        d = self.decider.decide(self.state, list(tuples), now, events)
        self.state = d.state
        self.transitions += d.transitions
        self.intents += d.intents
        return d.transitions, d.intents

    def steps(self, start: float, end: float, every: float, make: Callable[[float], Iterable[HealthTuple]]) -> None:
        t = start
        while t <= end + 1e-9:
            self.step(t, make(t))
            t += every

    def st(self, entity: str) -> State:
        return self.state.entities[entity].state

    def kinds(self, entity: str | None = None) -> list[IntentKind]:
        return [i.kind for i in self.intents if entity is None or i.entity == entity]

    def of(self, kind: IntentKind, entity: str | None = None) -> list[Intent]:
        return [i for i in self.intents if i.kind == kind and (entity is None or i.entity == entity)]

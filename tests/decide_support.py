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


def fleet_scrape(t: float, nodes: int = 12, hot: dict[str, float] | None = None,
                 xid: dict[str, int] | None = None, labels: Callable[[str], dict[str, str]] | None = None,
                 ) -> list[dict[str, object]]:
    """One dcgm-exporter-like scrape as table rows (ts, metric, value, labels...): 8 GPUs per node.
    ``hot``: node -> GPU temperature of its gpu0; ``xid``: node -> last Xid of its gpu0."""
    rows: list[dict[str, object]] = []
    for n in range(nodes):
        node = f"node-{n:02d}"
        extra = labels(node) if labels else {}
        for g in range(8):
            lab = {"Hostname": node, "gpu": str(g), "modelName": "NVIDIA H100 80GB HBM3",
                   "UUID": f"GPU-{n}-{g}", **extra}
            temp = (hot or {}).get(node, 60.0) if g == 0 else 60.0 + (g % 3)
            x = (xid or {}).get(node, 0) if g == 0 else 0
            clock = 1980.0 + ((n * 8 + g) % 7) * 3.0
            for metric, v in (("DCGM_FI_DEV_GPU_TEMP", temp), ("DCGM_FI_DEV_XID_ERRORS", x),
                              ("DCGM_FI_DEV_SM_CLOCK", clock), ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0.0)):
                rows.append({"ts": t, "metric": metric, "value": v, **lab})
    return rows


def scenario_rows(minutes: int = 40, every: float = 15.0, start: float = 1_767_000_000.0,
                  xid_at: float = 20.0, nodes: int = 12) -> list[dict[str, object]]:
    """node-03 overheats from minute 5; node-07 falls off the bus (Xid 79) at ``xid_at`` (if it exists);
    with up to 49 nodes the hourly budget (one quarantine) is spent by node-03 and node-07 is held with a
    page."""
    rows: list[dict[str, object]] = []
    t = start
    while t < start + minutes * 60:
        m = (t - start) / 60
        hot = {"node-03": 99.0} if m >= 5 else {}
        xid = {"node-07": 79} if m >= xid_at else {}
        rows += fleet_scrape(t, nodes=nodes, hot=hot, xid=xid)
        t += every
    return rows


def write_jsonl(path: str, rows: list[dict[str, object]]) -> None:
    import json

    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

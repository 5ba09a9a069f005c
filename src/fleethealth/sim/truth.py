"""What really happened in a simulation: ground truth per entity, and non-metric events (OOMs, Xid log
lines) that the decisions layer needs alongside the metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

EntityKind = Literal["gpu", "node", "replica"]

# Expected actions, in the vocabulary of fleethealth.decide.model.IntentKind where one exists.
ACTIONS = (
    "quarantine", "schedule_reset", "none", "page", "reject_request", "limit_concurrency", "rebuild_worker",
)


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """One entity's truth for one injected fault.

    ``faulty`` says whether the entity itself is broken (a quarantine of it is correct). ``group`` names a
    correlated event (``pool:train-b``): the backtest should judge such entities together (a human page,
    quarantines bounded by budget), not one by one.
    """

    entity: str
    kind: EntityKind
    fault: str
    onset: float
    end: float | None
    faulty: bool
    expected_action: str
    detail: str = ""
    group: str | None = None

    def active(self, t: float) -> bool:
        return self.onset <= t and (self.end is None or t < self.end)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class SimEvent:
    """A non-metric event at simulated time ``ts``: ``cuda_oom`` (with the context the seed asks to
    record: tokens, batch, KV use, GPU, versions, recent Xids) or ``xid`` (with the kernel log line)."""

    ts: float
    kind: str
    entity: str
    node: str
    context: dict[str, Any] = field(default_factory=dict)
    truth: str = ""  # e.g. the OOM class: single_request | batch_overload | fragmentation | driver

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

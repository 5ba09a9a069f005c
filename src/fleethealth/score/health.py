"""The health tuple: what the scoring engine says about one entity at one moment."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

EntityKind = Literal["gpu", "node", "replica", "rank"]
ENTITY_KINDS: tuple[EntityKind, ...] = ("gpu", "node", "replica", "rank")

REASON_NO_FRESH_DATA = "no_fresh_data"


@dataclass(frozen=True, slots=True)
class SignalDetail:
    """One signal's contribution, for `explain`: raw value, rate, z, sub-score and age."""

    signal: str
    category: str
    shape: str
    raw: float | None
    rate: float | None
    z: float | None
    score: float | None
    age_s: float | None
    weight: float
    note: str = ""
    # why the signal is expected of this entity (the expectation model: its own exporter, its past, its
    # peers, declared inventory); "" when it is not expected
    expected_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "signal": self.signal, "category": self.category, "shape": self.shape, "raw": self.raw,
            "rate": self.rate, "z": self.z, "score": self.score, "age_s": self.age_s, "weight": self.weight,
            "note": self.note, "expected_by": self.expected_by,
        }


@dataclass(frozen=True, slots=True)
class HealthTuple:
    """value is None when unknown (no fresh data); it is never 1.0 by default.

    reason: ``gate:<signal>``, ``min:<category>``, ``gmean:<category>``, ``no_fresh_data``.
    """

    entity: str
    kind: EntityKind
    value: float | None
    confidence: float
    worst: str | None
    reason: str
    categories: dict[str, float | None] = field(default_factory=dict)
    details: tuple[SignalDetail, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # node, pool, job, model, build, driver ...
    worst_member: str | None = None  # for a node: the GPU that decided it
    # Facts the decisions layer acts on that are not a score: "xid:13", "row_remap_pending",
    # "recovery_action:GPU_RESET", "peer_group_too_small:sm_clock" ...
    flags: tuple[str, ...] = ()
    ts: float = 0.0  # the `now` it was scored at

    @property
    def known(self) -> bool:
        return self.value is not None

    def to_dict(self, with_details: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "entity": self.entity, "kind": self.kind,
            "value": None if self.value is None else round(self.value, 6),
            "confidence": round(self.confidence, 6), "worst": self.worst, "reason": self.reason,
            "categories": {k: (None if v is None else round(v, 6)) for k, v in self.categories.items()},
        }
        if self.worst_member:
            d["worst_member"] = self.worst_member
        if self.flags:
            d["flags"] = list(self.flags)
        if self.labels:
            d["labels"] = dict(self.labels)
        if with_details:
            d["details"] = [x.to_dict() for x in self.details]
        return d

"""Plain data of the decisions layer: lifecycle states, transitions and intents.

Decisions are data first: an Intent says what should happen, to whom, and why. Actuators turn intents
into side effects; dry-run and advise mode simply log them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class State(StrEnum):
    STARTING = "STARTING"
    WARMING = "WARMING"
    READY = "READY"
    DEGRADED = "DEGRADED"
    DRAINING = "DRAINING"
    QUARANTINED = "QUARANTINED"
    RECOVERING = "RECOVERING"
    FAILED = "FAILED"


class IntentKind(StrEnum):
    SET_WEIGHT = "set_weight"  # router weight for a replica (0..1)
    NO_NEW_WORK = "no_new_work"  # cordon / NoSchedule taint: place nothing new
    ALLOW_NEW_WORK = "allow_new_work"  # uncordon
    DRAIN = "drain"  # evict / stop admitting; tier says instance, pod or node
    QUARANTINE = "quarantine"  # isolate: cordon + taint + drain, at node tier
    RELEASE = "release"  # lift quarantine after a passed active test
    SCHEDULE_RESET = "schedule_reset"  # GPU reset / reboot at the next safe point
    RUN_ACTIVE_TEST = "run_active_test"  # DCGM diag / NCCL check; only way out of quarantine
    CAPTURE_EVIDENCE = "capture_evidence"
    PAGE = "page"  # a human must look
    REBUILD_WORKER = "rebuild_worker"  # pod tier: restart the serving worker
    LIMIT_CONCURRENCY = "limit_concurrency"  # OOM from batch overload
    REJECT_REQUEST = "reject_request"  # OOM from one oversized request
    FLEET_ALERT = "fleet_alert"  # telemetry problem: remediation frozen
    SET_CONDITION = "set_condition"  # publish state/score (node condition, labels)


class Tier(StrEnum):
    INSTANCE = "instance"
    POD = "pod"
    NODE = "node"


@dataclass(frozen=True, slots=True)
class Transition:
    ts: float
    entity: str
    kind: str  # node | replica
    from_state: State
    to_state: State
    reason: str
    value: float | None
    confidence: float
    policy_version: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts, "entity": self.entity, "kind": self.kind, "from": str(self.from_state),
            "to": str(self.to_state), "reason": self.reason, "value": self.value,
            "confidence": self.confidence, "policy_version": self.policy_version, "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Intent:
    ts: float
    kind: IntentKind
    entity: str
    reason: str
    params: dict[str, Any] = field(default_factory=dict)
    tier: Tier | None = None
    soft: bool = False  # a fallback taken because a budget or freeze blocked the hard action
    policy_version: str = ""

    @property
    def key(self) -> str:
        """Idempotency key: the same intent for the same entity and episode maps to the same key."""
        body = json.dumps(
            {"k": str(self.kind), "e": self.entity, "p": self.params, "t": self.tier and str(self.tier)},
            sort_keys=True, default=str,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts, "intent": str(self.kind), "entity": self.entity, "reason": self.reason,
            "params": dict(self.params), "tier": None if self.tier is None else str(self.tier),
            "soft": self.soft, "policy_version": self.policy_version, "key": self.key,
        }

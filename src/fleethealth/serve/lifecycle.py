"""The serving replica's lifecycle, as a table. All of the sidecar's state changes go through ``step``.

Theory of operation. The sidecar observes facts (the engine answered /health, the warm-up inference
succeeded, /gpuz failed, an admin asked to drain, the canary passed...) and turns each into one ``Event``.
The guard work (was this drain caused by a fault? has the canary failed too often?) is done by the
shell before it names the event, so the table below is the whole of the transition logic: a pair
(state, event) maps to the next state, and a pair that is not in the table changes nothing (a fault
while QUARANTINED is already handled; a second drain while DRAINING is a no-op). That is what makes
repeated events and repeated admin calls harmless.

    STARTING -> WARMING -> READY <-> DEGRADED
    any serving state --fault/admin--> DRAINING --drained after a fault--> QUARANTINED
    QUARANTINED --undrain or worker rebuilt--> RECOVERING --canary passed--> READY
    RECOVERING --canary failed--> QUARANTINED, --failed too often--> FAILED (a human must look)

What each state means for traffic is also here (``admits``, ``ready``), so /readyz, the proxy's
admission and the published weight cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fleethealth.decide.model import State, Transition


class Event(StrEnum):
    ENGINE_UP = "engine_up"  # engine answers and lists its model
    ENGINE_DOWN = "engine_down"  # engine unreachable (crash, restart)
    WARMED = "warmed"  # warm-up inference succeeded on a fresh start
    WARMED_AFTER_FAULT = "warmed_after_fault"  # ... after a crash or rebuild: prove it with a canary
    WARMUP_FAILED = "warmup_failed"
    DEGRADE = "degrade"  # score below the degraded threshold for the dwell time
    RECOVER = "recover"  # score back above the (stricter) ready threshold for the (longer) dwell time
    FAULT = "fault"  # /gpuz failed, CUDA error, OOM of class fragmentation or device fault
    ADMIN_DRAIN = "admin_drain"
    DRAINED_AFTER_FAULT = "drained_after_fault"  # drain finished and the cause was a fault
    UNDRAIN_CLEAN = "undrain_clean"  # admin undrain of an admin-only drain: straight back
    UNDRAIN = "undrain"  # admin undrain after a fault (or of QUARANTINED / FAILED): canary first
    WORKER_REBUILT = "worker_rebuilt"  # engine came back after a pod-tier quarantine
    CANARY_PASSED = "canary_passed"
    CANARY_FAILED = "canary_failed"
    CANARY_FAILED_REPEATEDLY = "canary_failed_repeatedly"


S, E = State, Event
_SERVING = (S.WARMING, S.READY, S.DEGRADED, S.RECOVERING)

TABLE: dict[tuple[State, Event], State] = {
    (S.STARTING, E.ENGINE_UP): S.WARMING,
    (S.WARMING, E.WARMED): S.READY,
    (S.WARMING, E.WARMED_AFTER_FAULT): S.RECOVERING,
    (S.WARMING, E.WARMUP_FAILED): S.STARTING,
    (S.READY, E.DEGRADE): S.DEGRADED,
    (S.DEGRADED, E.RECOVER): S.READY,
    (S.STARTING, E.ADMIN_DRAIN): S.DRAINING,
    (S.DRAINING, E.DRAINED_AFTER_FAULT): S.QUARANTINED,
    (S.DRAINING, E.UNDRAIN_CLEAN): S.READY,
    (S.DRAINING, E.UNDRAIN): S.RECOVERING,
    (S.QUARANTINED, E.UNDRAIN): S.RECOVERING,
    (S.QUARANTINED, E.WORKER_REBUILT): S.RECOVERING,
    (S.FAILED, E.UNDRAIN): S.RECOVERING,  # FAILED needs a human: the admin call is that human
    (S.RECOVERING, E.CANARY_PASSED): S.READY,
    (S.RECOVERING, E.CANARY_FAILED): S.QUARANTINED,
    (S.RECOVERING, E.CANARY_FAILED_REPEATEDLY): S.FAILED,
}
for _s in _SERVING:
    TABLE[(_s, E.FAULT)] = S.DRAINING
    TABLE[(_s, E.ADMIN_DRAIN)] = S.DRAINING
    TABLE[(_s, E.ENGINE_DOWN)] = S.STARTING

# States whose requests the proxy admits (RECOVERING: only the canary's share, see canary.py).
ADMITTING = frozenset({S.READY, S.DEGRADED, S.RECOVERING})


def admits(state: State) -> bool:
    return state in ADMITTING


def next_state(state: State, event: Event) -> State | None:
    """The next state, or None when the event changes nothing in this state."""
    return TABLE.get((state, event))


@dataclass(slots=True)
class ReplicaLifecycle:
    """The one mutable holder of the replica's state; every change is recorded as a Transition."""

    entity: str
    state: State = State.STARTING
    since: float = 0.0
    policy_version: str = ""

    def step(self, event: Event, now: float, reason: str, value: float | None = None,
             confidence: float = 1.0, detail: str = "") -> Transition | None:
        nxt = next_state(self.state, event)
        if nxt is None or nxt == self.state:
            return None
        t = Transition(ts=now, entity=self.entity, kind="replica", from_state=self.state, to_state=nxt,
                       reason=reason or str(event), value=value, confidence=confidence,
                       policy_version=self.policy_version, detail=detail or str(event))
        self.state = nxt
        self.since = now
        return t


def state_diagram() -> str:
    """Mermaid state diagram generated from TABLE, so the picture cannot drift from the code."""
    lines = ["stateDiagram-v2", "    [*] --> STARTING"]
    for (src, ev), dst in sorted(TABLE.items(), key=lambda kv: (list(State).index(kv[0][0]), kv[0][1])):
        lines.append(f"    {src} --> {dst}: {ev}")
    return "\n".join(lines) + "\n"

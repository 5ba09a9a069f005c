"""One decision cycle's working set, and the vocabulary the decider's passes share. Pure.

``Cycle`` holds what one ``Decider.decide`` call builds up: a shallow copy of the caller's
``DecisionState`` (entities are copied on their first change, ``mut``, so the caller's state is never
modified and a steady entity costs no copy), the transitions and intents made so far, and this cycle's
pool sizes and flagged GPUs per node. Every intent goes through ``emit``, which stamps the cycle's time,
the policy version and a running number (``params.n``) kept in the state, so the same cycle replayed
after a crash yields the same idempotency keys. Conditions that page (budgets, TP groups, versions,
jobs, domains) go through ``incident`` (``decide.incidents``: one firing page, updates, one resolution).

The constants below name the sets of states and intents the passes (``decide.safety``,
``decide.repairs``, ``decide.decider``) agree on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleethealth.decide import incidents
from fleethealth.decide.lifecycle import Cond
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.decide.state import DecisionState, EntityLifecycle
from fleethealth.policy import Policy
from fleethealth.score.health import HealthTuple

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


def is_hard_gate_reason(reason: str, policy: Policy) -> bool:
    """``gate:<signal>`` for a signal named in ``budgets.hard_gates``."""
    return reason.startswith("gate:") and reason[5:] in policy.budgets.hard_gates


def budget_key(kind: str, pool: str, hard: bool, physical: bool = False) -> str:
    """The ledger's key: confirmed hard gates spend their own budget (``hard:`` prefix), physical
    evidence of dead hardware another one (``physical:``, ``decide.safety._physical_evidence``)."""
    if physical:
        return f"physical:{kind}:{pool}"
    return f"hard:{kind}:{pool}" if hard else f"{kind}:{pool}"


def choose_tier(kind: str, obs_reason: str, worst: str | None) -> Tier:
    """Smallest isolation that fits: a node's faults isolate the node; a replica's own faults drain the
    instance, except memory trouble, leaks, hangs and gates, which need a rebuilt worker (pod)."""
    if kind == "node":
        return Tier.NODE
    text = f"{obs_reason} {worst or ''}".lower()
    return Tier.POD if any(h in text for h in POD_TIER_HINTS) else Tier.INSTANCE


class Cycle:
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
        self.node_flags: Mapping[str, set[str]] = {}  # this cycle's flags per node (its own and its GPUs')
        self.domains: dict[tuple[str, str], str] = {}  # (label, value) -> open domain incident (decide.domains)
        self.chronic: Mapping[str, Any] = {}  # node -> this cycle's chronic-slowness evidence (decide.chronic)

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
            self.s.entities[eid] = self.s.entities[eid].fork()
            self.copied.add(eid)
        return self.s.entities[eid]

    def emit(self, kind: IntentKind, entity: str, reason: str, params: dict[str, Any] | None = None,
             tier: Tier | None = None, soft: bool = False) -> None:
        pr = dict(params or {})
        pr["n"] = self.s.seq
        self.s.seq += 1
        self.intents.append(Intent(self.now, kind, entity, reason, pr, tier, soft, self.version))

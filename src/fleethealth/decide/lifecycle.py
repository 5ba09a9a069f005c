"""The lifecycle state machine of one node or serving replica: the transition table and its timers.

Theory of operation
-------------------
A raw score moves with every scrape; actions must not. Each node and each serving replica carries one
lifecycle (states in ``decide.model.State``). Every cycle it receives one *observation* (the entity's
health tuple reduced to value, confidence, reason, flags) and the *events* addressed to it (active-test
results, reset results, human acknowledgements). ``RULES`` below is the whole machine: for the current
state, the first rule (in table order) whose condition holds fires, at most one transition per cycle.

Conditions come in two kinds:

* signal conditions (``at_floor``, ``below_degraded``, ``below_quarantine``, ``above_ready``,
  ``recovering_ok``, ``warm_ok``) compare the value with a policy threshold and must hold for a *dwell*
  (``policy.lifecycle``) before they fire. ``at_floor`` is the fast path: a score at or below
  ``floor_at`` that a counter at its critical rate on both windows causes (the observation's ``floor``,
  from the scorer's ``floor:<signal>`` flag) quarantines after ``floor_dwell_s`` (about two decision
  cycles) instead of the degraded-then-quarantine chain; off when ``floor_dwell_s`` is unset. Peer and
  SLO scores at 0 keep the chain: they are statistical readings whose noise the dwell absorbs. Each has a timer; ``hard_gate`` (reason ``gate:*``, or a node blamed by attribution)
  and ``drain_reset`` (Xid 154 asks to drain and reset) fire at once.
* chronic conditions (``chronic_drift``, ``chronic_cost``; ``decide.chronic``) fire at once: their
  evidence (a combined z, a CUSUM over hours) and price (GPU-hours lost against a swap) are their own
  dwell.
* ``recurring`` (``decide.recurring``) holds while an isolation is the ``recurring.max_episodes``-th
  episode of its signal family within ``recurring.window_s``: FAILED at once, before a test can release
  a flaky node again.
* event conditions (``test_passed``, ``test_failed``, ``too_many_recoveries``, ``reset_passed``,
  ``reset_failed``, ``repair_exhausted``, ``human_ready``, ``human_quarantine``, ``version_cleared``) and ``drain_timeout`` (time in state, checked
  only on usable data like the signal conditions).

Timers, exactly: only the signal conditions that some rule of the current state reads are timed. An
observation is *usable* when its value is known and its confidence is at least
``lifecycle.min_confidence``. On a usable observation at time t, every timed condition that holds adds the
time since the previous usable observation (if the timer was running) to its accumulated time; every
condition that does not hold has its timer reset to nothing. An unusable observation pauses all timers:
their accumulated time is kept, and the span between the last usable observation and the next one does
not count. So unknown data neither advances a timer nor resets it, and no signal condition ever holds on
unknown data: nothing moves to a worse state on unknown. Every transition restarts all timers, so a
window is measured inside the state it leaves, with one exception: on the slide READY -> DEGRADED the
timers of the worsening conditions (``below_*``) survive, so a node that slid is quarantined
``quarantine_dwell_s`` after it first fell below the quarantine threshold, not after it entered DEGRADED.

Hysteresis: the way down is ``below degraded_below for degraded_dwell_s``; the way back is ``above
ready_above (> degraded_below) for ready_dwell_s (>= degraded_dwell_s)``. Out of QUARANTINED only by a
passed active test (RUN_ACTIVE_TEST is issued on entry), then RECOVERING, then READY after a sustained
good window. A test that fails, or a pass that would be the (max_recoveries+1)-th recovery inside
``recovery_window_s``, ends in FAILED, which only a human leaves, or ``version_cleared``: a node
isolated by evidence a bad version explains (``decide.safety``'s version holds) goes from FAILED back
to QUARANTINED, and so to an active test, when that version's incident resolves.

This module holds all transition logic; safety (budgets, freezes, attribution) lives in ``decider`` and
may veto a rule, in which case the next matching rule is tried. ``mermaid_diagram()`` renders the table
for the README, so the picture cannot drift from the code.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from fleethealth.decide.model import State
from fleethealth.policy import Lifecycle


class Cond(StrEnum):
    HARD_GATE = "hard_gate"
    DRAIN_RESET = "drain_reset"
    AT_FLOOR = "at_floor"
    BELOW_QUARANTINE = "below_quarantine"
    BELOW_DEGRADED = "below_degraded"
    ABOVE_READY = "above_ready"
    RECOVERING_OK = "recovering_ok"
    WARM_OK = "warm_ok"
    FIRST_DATA = "first_data"
    CHRONIC_COST = "chronic_cost"
    CHRONIC_DRIFT = "chronic_drift"
    TEST_PASSED = "test_passed"
    TEST_FAILED = "test_failed"
    TOO_MANY_RECOVERIES = "too_many_recoveries"
    RECURRING = "recurring"
    RESET_PASSED = "reset_passed"
    RESET_FAILED = "reset_failed"
    REPAIR_EXHAUSTED = "repair_exhausted"
    DRAIN_TIMEOUT = "drain_timeout"
    HUMAN_READY = "human_ready"
    HUMAN_QUARANTINE = "human_quarantine"
    VERSION_CLEARED = "version_cleared"


# Signal conditions with a threshold (lifecycle attribute) and a comparison; they need a dwell.
SIGNAL_CONDS: dict[Cond, tuple[str, str]] = {
    Cond.AT_FLOOR: ("floor_at", "<="),
    Cond.BELOW_QUARANTINE: ("quarantine_below", "<"),
    Cond.BELOW_DEGRADED: ("degraded_below", "<"),
    Cond.ABOVE_READY: ("ready_above", ">"),
    Cond.RECOVERING_OK: ("recovering_ok_above", ">"),
    Cond.WARM_OK: ("degraded_below", ">="),
}
# Timers of these restart at every transition (a good window is measured inside the state it leaves).
IMPROVING_CONDS: frozenset[Cond] = frozenset({Cond.ABOVE_READY, Cond.RECOVERING_OK, Cond.WARM_OK})


@dataclass(frozen=True, slots=True)
class Rule:
    src: State
    cond: Cond
    dst: State
    dwell: str | None = None  # attribute of policy.lifecycle holding the dwell time in seconds
    note: str = ""


# Priority order inside a state is the table order: the first rule whose condition holds (and that the
# safety layer does not veto) fires.
RULES: tuple[Rule, ...] = (
    Rule(State.STARTING, Cond.HARD_GATE, State.QUARANTINED, note="fatal before serving"),
    Rule(State.STARTING, Cond.FIRST_DATA, State.WARMING, note="first confident tuple"),
    Rule(State.WARMING, Cond.HARD_GATE, State.QUARANTINED),
    Rule(State.WARMING, Cond.WARM_OK, State.READY, "warming_s"),
    Rule(State.READY, Cond.DRAIN_RESET, State.DRAINING, note="Xid 154 drain and reset"),
    Rule(State.READY, Cond.HARD_GATE, State.QUARANTINED, note="at once"),
    Rule(State.READY, Cond.AT_FLOOR, State.QUARANTINED, "floor_dwell_s", "fast path, a counter at crit on both windows"),
    Rule(State.READY, Cond.BELOW_QUARANTINE, State.QUARANTINED, "quarantine_dwell_s"),
    Rule(State.READY, Cond.BELOW_DEGRADED, State.DEGRADED, "degraded_dwell_s"),
    Rule(State.READY, Cond.CHRONIC_DRIFT, State.DEGRADED, note="slow for hours (CUSUM), costs more than a swap"),
    Rule(State.DEGRADED, Cond.DRAIN_RESET, State.DRAINING, note="Xid 154 drain and reset"),
    Rule(State.DEGRADED, Cond.HARD_GATE, State.QUARANTINED, note="at once"),
    Rule(State.DEGRADED, Cond.AT_FLOOR, State.QUARANTINED, "floor_dwell_s", "fast path, a counter at crit on both windows"),
    Rule(State.DEGRADED, Cond.BELOW_QUARANTINE, State.QUARANTINED, "quarantine_dwell_s"),
    Rule(State.DEGRADED, Cond.CHRONIC_COST, State.QUARANTINED, note="slow and costs more than a swap"),
    Rule(State.DEGRADED, Cond.ABOVE_READY, State.READY, "ready_dwell_s"),
    Rule(State.DRAINING, Cond.RECURRING, State.FAILED, note="recurring fault, repair"),
    Rule(State.DRAINING, Cond.RESET_PASSED, State.RECOVERING, note="reset done"),
    Rule(State.DRAINING, Cond.TEST_PASSED, State.RECOVERING, note="repair verified"),
    Rule(State.DRAINING, Cond.REPAIR_EXHAUSTED, State.FAILED, note="repair ladder exhausted"),
    Rule(State.DRAINING, Cond.TOO_MANY_RECOVERIES, State.FAILED, note="recovers too often"),
    Rule(State.DRAINING, Cond.RESET_FAILED, State.QUARANTINED),
    Rule(State.DRAINING, Cond.DRAIN_TIMEOUT, State.QUARANTINED, "drain_timeout_s"),
    Rule(State.QUARANTINED, Cond.RECURRING, State.FAILED, note="recurring fault, repair"),
    Rule(State.QUARANTINED, Cond.TOO_MANY_RECOVERIES, State.FAILED, note="recovers too often"),
    Rule(State.QUARANTINED, Cond.REPAIR_EXHAUSTED, State.FAILED, note="repair ladder exhausted"),
    Rule(State.QUARANTINED, Cond.TEST_PASSED, State.RECOVERING, note="active test passed"),
    Rule(State.QUARANTINED, Cond.TEST_FAILED, State.FAILED, note="active test failed"),
    Rule(State.QUARANTINED, Cond.HUMAN_READY, State.READY, note="human"),
    Rule(State.RECOVERING, Cond.HARD_GATE, State.QUARANTINED),
    Rule(State.RECOVERING, Cond.BELOW_DEGRADED, State.QUARANTINED, "degraded_dwell_s", "relapse"),
    Rule(State.RECOVERING, Cond.RECOVERING_OK, State.READY, "recovering_dwell_s"),
    Rule(State.FAILED, Cond.HUMAN_READY, State.READY, note="human"),
    Rule(State.FAILED, Cond.HUMAN_QUARANTINE, State.QUARANTINED, note="human"),
    Rule(State.FAILED, Cond.VERSION_CLEARED, State.QUARANTINED, note="its version incident resolved, retest"),
)

# States in which the entity is out of service (counted against tensor-parallel groups).
ISOLATED_STATES: frozenset[State] = frozenset({State.DRAINING, State.QUARANTINED, State.FAILED})
# Transitions into these are remediation: subject to freeze, budgets and attribution vetoes.
REMEDIATION_TARGETS: frozenset[State] = frozenset({State.DRAINING, State.QUARANTINED})


_SIGNAL_KEYS = frozenset(str(c) for c in SIGNAL_CONDS)
_COND_OF_KEY: dict[str, Cond] = {str(c): c for c in Cond}  # a timer's key -> its condition (no enum call)
# Per state, the signal conditions its rules read (only those need timers).
TIMED_CONDS: dict[State, tuple[Cond, ...]] = {
    st: tuple(dict.fromkeys(r.cond for r in RULES if r.src == st and r.cond in SIGNAL_CONDS)) for st in State
}
_TIMED_KEYS: dict[State, tuple[tuple[Cond, str], ...]] = {st: tuple((c, str(c)) for c in cs) for st, cs in TIMED_CONDS.items()}
# Per state, its rules in table order: looked up every step of every entity (a flag storm steps them all).
_RULES_FROM: dict[State, tuple[Rule, ...]] = {st: tuple(r for r in RULES if r.src == st) for st in State}
_OPS: dict[str, Callable[[float, float], bool]] = {"<": operator.lt, ">": operator.gt, ">=": operator.ge,
                                                   "<=": operator.le}
_SIGNAL_TESTS = tuple((cond, attr, _OPS[op]) for cond, (attr, op) in SIGNAL_CONDS.items())


def rules_from(state: State) -> list[Rule]:
    return list(_RULES_FROM[state])


@dataclass(slots=True)
class Timer:
    accum_s: float = 0.0
    last_ts: float | None = None  # None: paused (the last observation was unusable)

    def to_dict(self) -> dict[str, Any]:
        return {"accum_s": self.accum_s, "last_ts": self.last_ts}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Timer:
        return Timer(float(d["accum_s"]), None if d.get("last_ts") is None else float(d["last_ts"]))


@dataclass(frozen=True, slots=True)
class Observation:
    """What the lifecycle sees of one entity in one cycle."""

    value: float | None
    confidence: float
    reason: str
    gate: bool = False  # reason gate:* or blamed by attribution
    drain_reset: bool = False  # Xid 154 recovery action DRAIN_AND_RESET / DRAIN_P2P
    floor: bool = False  # a counter at its critical rate on both windows (flag floor:*): the fast path
    # its own ranks stalled while the other nodes of its suspect version run (decide.safety ``_own_stalls``):
    # node evidence, which a version hold does not hold
    own_stall: bool = False

    def usable(self, lc: Lifecycle) -> bool:
        return self.value is not None and self.confidence >= lc.min_confidence


def holding_conds(obs: Observation | None, lc: Lifecycle) -> set[Cond]:
    """Signal conditions that hold for this observation (none when it is not usable)."""
    if obs is None or not obs.usable(lc):
        return set()
    v = float(obs.value)  # type: ignore[arg-type]
    out = {cond for cond, attr, op in _SIGNAL_TESTS if op(v, float(getattr(lc, attr)))}
    if lc.floor_dwell_s is None or not obs.floor:  # the fast path is off, or not a counter at the floor
        out.discard(Cond.AT_FLOOR)
    if obs.gate:
        out.add(Cond.HARD_GATE)
    if obs.drain_reset:
        out.add(Cond.DRAIN_RESET)
    out.add(Cond.DRAIN_TIMEOUT)  # time-based, but like every condition only on usable data
    return out


def advance_timers(timers: dict[str, Timer], obs: Observation | None, now: float, lc: Lifecycle,
                   state: State, holding: set[Cond] | None = None) -> None:
    """Apply one observation to the timers (in place), as described in the module docstring. Only the
    conditions that some rule of ``state`` reads are timed; other timers are dropped. ``holding``:
    ``holding_conds(obs, lc)`` where the caller has computed it already."""
    timed = TIMED_CONDS[state]
    if timers:
        for key in [k for k in timers if k in _SIGNAL_KEYS and _COND_OF_KEY[k] not in timed]:
            del timers[key]
    if obs is None or not obs.usable(lc):
        for t in timers.values():
            t.last_ts = None
        return
    if holding is None:
        holding = holding_conds(obs, lc)
    for cond, key in _TIMED_KEYS[state]:
        if cond in holding:
            tm = timers.get(key)
            if tm is None:
                timers[key] = Timer(0.0, now)
            else:
                if tm.last_ts is not None and now > tm.last_ts:
                    tm.accum_s += now - tm.last_ts
                tm.last_ts = now
        else:
            timers.pop(key, None)


def timers_after_transition(timers: dict[str, Timer], src: State, dst: State) -> dict[str, Timer]:
    """The timers that survive a transition (see the module docstring)."""
    if src == State.READY and dst == State.DEGRADED:
        return {k: t for k, t in timers.items() if (k in _SIGNAL_KEYS and _COND_OF_KEY[k] not in IMPROVING_CONDS)
                or k == "chronic_cusum"}  # the CUSUM of decide.chronic keeps adding up
    return {}


def dwell_of(rule: Rule, lc: Lifecycle) -> float:
    if rule.dwell is None:
        return 0.0
    dwell = getattr(lc, rule.dwell)
    return float("inf") if dwell is None else float(dwell)  # None: the rule is off


def rule_holds(rule: Rule, conds: set[Cond], timers: dict[str, Timer], in_state_s: float,
               lc: Lifecycle) -> bool:
    """Does the rule's condition hold now? ``conds`` has the signal conditions of this observation and
    the event conditions of this cycle."""
    if rule.cond not in conds:
        return False
    if rule.cond in SIGNAL_CONDS:
        t = timers.get(str(rule.cond))
        return t is not None and t.accum_s >= dwell_of(rule, lc)
    if rule.cond == Cond.DRAIN_TIMEOUT:
        return in_state_s >= dwell_of(rule, lc)
    return True


def candidate_rules(state: State, conds: set[Cond], timers: dict[str, Timer], in_state_s: float,
                    lc: Lifecycle) -> list[Rule]:
    """Every rule of this state whose condition holds, in priority order (the caller takes the first one
    that safety allows)."""
    return [r for r in _RULES_FROM[state] if rule_holds(r, conds, timers, in_state_s, lc)]


def _cond_label(rule: Rule, lc: Lifecycle | None) -> str:
    if rule.cond in SIGNAL_CONDS:
        attr, op = SIGNAL_CONDS[rule.cond]
        op = {"<": "below", ">": "above", ">=": "at least", "<=": "at or below"}[op]
        thr = f"{attr}" if lc is None else f"{getattr(lc, attr):g}"
        dw = rule.dwell or ""
        dws = dw if lc is None else f"{dwell_of(rule, lc):g}s"
        return f"score {op} {thr} for {dws}"
    if rule.cond == Cond.DRAIN_TIMEOUT:
        return "drain timeout" + ("" if lc is None else f" {lc.drain_timeout_s:g}s")
    return str(rule.cond).replace("_", " ")


def mermaid_diagram(lc: Lifecycle | None = None, rules: Iterable[Rule] = RULES) -> str:
    """The lifecycle as a Mermaid state diagram, generated from ``RULES`` (with the policy's numbers
    when ``lc`` is given)."""
    lines = ["stateDiagram-v2", "    [*] --> READY: node", "    [*] --> STARTING: replica"]
    for r in rules:
        label = _cond_label(r, lc)
        if r.note:
            label = f"{label}, {r.note}"
        lines.append(f"    {r.src} --> {r.dst}: {label}")
    return "\n".join(lines) + "\n"


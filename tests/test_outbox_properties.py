"""The outbox's invariant under crashes anywhere (hypothesis): whatever points the runner is killed at (before
an actuator call, after it but before the ledger heard, after the ledger but before the store's mark), a
restarted runner on the same database ends with every committed intent applied, nothing pending, and each
key's actuator called once more only for each crash that fell between its call and its record (the
actuator's effects, keyed by intent key, are then the same as one call's)."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from decide_support import tup
from fleethealth.act.ledger import Ledger
from fleethealth.act.outcome import Outcome
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import Intent, IntentKind
from fleethealth.decide.state import DecisionState
from fleethealth.store.sqlite import SqliteStore

POINTS = ("before_apply", "after_apply", "before_mark")


class Crash(BaseException):
    """SIGKILL, as far as the runner can tell: nothing after it runs (it is not an Exception)."""


class World:
    """What the actuators did, kept across 'process' restarts, and the crash plan."""

    def __init__(self, plan: list[tuple[str, int]]) -> None:
        self.plan = list(plan)
        self.calls: Counter[str] = Counter()
        self.effects: set[str] = set()
        self.step = 0
        self.reapplies: Counter[str] = Counter()

    def maybe_crash(self, point: str, key: str) -> None:
        self.step += 1
        if self.plan and self.plan[0][0] == point and self.step >= self.plan[0][1]:
            self.plan.pop(0)
            if point == "after_apply":
                self.reapplies[key] += 1
            raise Crash(point)


class Act:
    name = "act"

    def __init__(self, world: World) -> None:
        self.world = world

    def apply(self, intent: Intent) -> Outcome:
        self.world.maybe_crash("before_apply", intent.key)
        self.world.calls[intent.key] += 1
        self.world.effects.add(intent.key)  # idempotent: a second call adds nothing
        self.world.maybe_crash("after_apply", intent.key)
        return Outcome.success()


class CrashingOutbox:
    def __init__(self, store: SqliteStore, world: World) -> None:
        self.store, self.world = store, world

    def intents(self, since: float | None = None, status: str | None = None) -> list[dict[str, Any]]:
        return self.store.intents(since, status)

    def mark_intent(self, key: str, status: str, outcome: str | None = None) -> bool:
        self.world.maybe_crash("before_mark", key)
        return self.store.mark_intent(key, status, outcome)


@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(1, 4),
       plan=st.lists(st.tuples(st.sampled_from(POINTS), st.integers(1, 12)), max_size=6))
def test_every_intent_applied_once_whatever_the_crashes(nodes: int, plan: list[tuple[str, int]]) -> None:
    d = Path(tempfile.mkdtemp(prefix="fh-outbox-"))
    store = SqliteStore(d / "state.db")
    dec = Decider().decide(DecisionState(), [tup(f"n{i}", 0.0, reason="gate:xid", labels={"pool": "p"})
                                             for i in range(nodes)], 0)
    store.commit(dec)
    keys = [i["key"] for i in store.intents()]
    assert keys
    store.close()
    world = World(sorted(plan, key=lambda p: p[1]))
    for _run in range(len(plan) + 2):  # each crash costs one restart; then a clean drain
        store = SqliteStore(d / "state.db")
        runner = ActuationRunner({k: [Act(world)] for k in IntentKind}, Ledger(d / "state.actions.db"),
                                 "enforce")
        try:
            runner.drain(CrashingOutbox(store, world))
            runner.drain(CrashingOutbox(store, world))  # a later cycle: nothing more to do
            break
        except Crash:
            continue
        finally:
            store.close()
            runner.ledger.close()
    store = SqliteStore(d / "state.db")
    assert store.intents(status="pending") == []
    assert {i["status"] for i in store.intents()} == {"applied"}
    assert world.effects == set(keys)
    for k in keys:  # once, plus once per crash between its call and its ledger record
        assert world.calls[k] == 1 + world.reapplies[k], (k, world.calls[k], world.reapplies[k])
    store.close()

"""Version holds survive a controller restart and a kill mid-cycle, on both state-store backends (SQLite
and PostgreSQL, the real server from tests/pg_harness.py; skipped where it is not installed).

A node's ``version_hold`` lives in its lifecycle row; the version incident that holds it (when it last
correlated, the retests it has out, the retests that failed) in the ``open_incidents`` table. Both must come
back: before that table the incident record was lost at a restart, so in the gap where the version no longer
correlated (its victims held and idle) a restarted controller released the held nodes and retested them
on the bad driver at once, and resolved the incident at another time than an uninterrupted one.

The scenario is ``tests/test_decide_version_holds.py``'s: a bad driver gates six nodes, the fourth makes it
suspect and the three isolated before are tied to it; the driver is never rolled back, the victims' gates
go quiet at 1800 s, the held nodes are retested under the hold and the driver fails those tests. The
restarted run must say exactly what the uninterrupted one says: transitions, intents, final state."""

from __future__ import annotations

from typing import Any

import pytest

from fleethealth.decide.decider import Decider
from fleethealth.decide.state import DecisionState, Event
from fleethealth.score.health import HealthTuple
from fleethealth.store import open_store
from test_decide_version_holds import KEY, NEW, OLD, _node, _policy, _rollout
from test_store_conformance import postgres, url  # noqa: F401  (fixtures: a fresh database of each backend)

QUIET = 1800.0  # the victims' gates clear; the driver stays
RETEST = QUIET - 60.0 + 900.0  # the version last correlated at QUIET - 60; incident_clear_s 900 s later
FAIL_AT = RETEST + 120.0
END = FAIL_AT + 1200.0


def _make() -> Any:
    base, _ = _rollout()
    on_new = {f"n{i:02d}" for i in range(12)}

    def make(t: float) -> list[HealthTuple]:
        out = []
        for x in base(t):
            lab = {**x.labels, "driver_version": NEW if x.entity in on_new else OLD}
            gated = t < QUIET and x.value is not None and x.value < 0.5
            out.append(_node(x.entity, 0.0, lab, x.reason, x.flags) if gated else _node(x.entity, 0.97, lab))
        return out

    return make


EVENTS = {660.0: [Event(660.0, "repair", "n00", passed=False, actor="agent")],
          FAIL_AT: [Event(FAIL_AT, "active_test", n, passed=False, actor="agent") for n in ("n00", "n02", "n04")]}


def _said(d: Any) -> tuple[list[Any], list[Any]]:
    return ([(t.ts, t.entity, str(t.from_state), str(t.to_state), t.reason, t.detail) for t in d.transitions],
            [(i.ts, str(i.kind), i.entity, i.reason, sorted(i.params.items(), key=str)) for i in d.intents])


def _run(start: float, end: float, st: DecisionState, store: Any | None) -> tuple[DecisionState, list[Any], list[Any]]:
    make, decider = _make(), Decider(_policy())
    tr: list[Any] = []
    it: list[Any] = []
    t = start
    while t <= end:
        d = decider.decide(st, make(t), t, EVENTS.get(t, []))
        if store is not None:
            store.commit(d)
        a, b = _said(d)
        tr += a
        it += b
        st = d.state
        t += 60.0
    return st, tr, it


@pytest.mark.parametrize("restart_at", [QUIET + 300.0, RETEST + 60.0],
                         ids=["held-while-quiet", "retests-out"])
def test_a_restart_keeps_version_holds_and_their_incident(url: str, restart_at: float) -> None:  # noqa: F811
    whole, tr_w, it_w = _run(0.0, END, DecisionState(), None)
    held = whole.entities
    assert [held[n].version_hold for n in ("n00", "n02", "n04")] == [KEY] * 3  # the driver failed the retests
    assert KEY in whole.incidents and whole.incidents[KEY]["retest_failed"] == ["n00", "n02", "n04"]

    store = open_store(url)
    st, tr1, it1 = _run(0.0, restart_at - 60.0, DecisionState(), store)
    store.close()
    again: Any = open_store(url)
    loaded = again.load()
    assert loaded is not None and loaded.to_dict() == st.to_dict()  # holds and the open incident, as committed
    assert loaded.incidents[KEY]["seen"] == st.incidents[KEY]["seen"]
    if restart_at > RETEST:
        assert loaded.incidents[KEY]["retesting"] == ["n00", "n02", "n04"]
    end, tr2, it2 = _run(restart_at, END, loaded, again)
    again.close()
    assert tr1 + tr2 == tr_w
    assert it1 + it2 == it_w
    assert end.to_dict() == whole.to_dict()


def test_a_cycle_killed_before_its_commit_is_decided_again_the_same_way(url: str) -> None:  # noqa: F811
    """A SIGKILL mid-cycle loses that cycle whole (one transaction per cycle): the restarted controller
    decides it again from the last committed state, with the same holds, retests and idempotency keys."""
    whole, tr_w, it_w = _run(0.0, END, DecisionState(), None)
    store = open_store(url)
    st, tr1, it1 = _run(0.0, RETEST - 60.0, DecisionState(), store)
    Decider(_policy()).decide(st, _make()(RETEST), RETEST, [])  # decided, never committed: killed here
    store.close()
    again: Any = open_store(url)
    loaded = again.load()
    assert loaded is not None
    end, tr2, it2 = _run(RETEST, END, loaded, again)
    assert tr1 + tr2 == tr_w and it1 + it2 == it_w
    assert end.to_dict() == whole.to_dict()
    keys = [i["key"] for i in again.intents()]
    assert len(keys) == len(set(keys)) == len(it_w)
    again.close()

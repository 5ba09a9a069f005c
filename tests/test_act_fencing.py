"""Fencing without Kubernetes: the state store's claim. Two controllers on one SQLite file (the
PostgreSQL store runs the same SQL); once the second one claims the store, the first one's actuator calls
are refused before anything is written, its intent stays pending, and the log says so once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.act.config import ActuationConfig
from fleethealth.act.fence import Fences, StoreFence, Unfenced, stale_epoch
from fleethealth.act.ledger import Ledger
from fleethealth.act.router import RouterActuator, WeightBoard
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import Intent, IntentKind, Tier
from fleethealth.decide.state import Decision, DecisionState
from fleethealth.store.sqlite import SqliteStore

CFG = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.SET_WEIGHT}))


def _weight(n: int) -> Intent:
    return Intent(100.0 + n, IntentKind.SET_WEIGHT, "replica-7", "min:latency",
                  {"weight": 0.25, "state": "DEGRADED", "n": n}, Tier.INSTANCE)


def _runner(store: SqliteStore, board: WeightBoard, ledger: Path) -> ActuationRunner:
    return ActuationRunner({IntentKind.SET_WEIGHT: [RouterActuator(board)]}, Ledger(ledger), CFG,
                           fence=Fences([StoreFence(store)]))


def test_a_controller_whose_store_claim_was_taken_writes_nothing(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "state.db"
    old, new = SqliteStore(db), SqliteStore(db)
    old.claim("controller-a")
    it = _weight(1)
    old.commit(Decision(DecisionState(), [], [it], it.ts))
    board_old, board_new = WeightBoard(), WeightBoard()
    zombie = _runner(old, board_old, tmp_path / "ledger.db")
    new.claim("controller-b")  # the standby took over: the old leader does not know yet
    with caplog.at_level(logging.WARNING):
        assert zombie.drain(old) == []
        assert zombie.drain(old) == []  # a second cycle: refused again, not logged again
        assert zombie.retry_due() == []
    assert board_old.weights == {}  # nothing written
    assert [r["status"] for r in new.intents()] == ["pending"]  # kept for the new leader
    lines = [r.getMessage() for r in caplog.records if "not acting" in r.getMessage()]
    assert lines == ["not acting: another controller claimed the state store after this one; "
                     "pending intents stay for the leader"]
    assert zombie.fenced_total >= 2 and zombie.status()["fenced"] is not None
    assert zombie.ledger.actions() == []  # not even a 'started' record

    leader = _runner(new, board_new, tmp_path / "ledger.db")
    assert [r.status for r in leader.drain(new)] == ["applied"]
    assert board_new.weights["replica-7"].weight == 0.25
    assert [r["status"] for r in new.intents()] == ["applied"]


def test_a_lone_controller_is_never_fenced(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    assert store.holds_fence()  # never claimed
    store.claim("only")
    assert store.holds_fence() and StoreFence(store).check() is None and Unfenced().check() is None
    it = _weight(2)
    store.commit(Decision(DecisionState(), [], [it], it.ts))
    board = WeightBoard()
    assert [r.status for r in _runner(store, board, tmp_path / "l.db").drain(store)] == ["applied"]


@pytest.mark.parametrize(("have", "mine", "stale"), [
    (None, 3, False), ("3", 3, False), ("2", 3, False), ("4", 3, True), ("4", None, False), ("x", 3, False),
])
def test_stale_epoch(have: str | None, mine: int | None, stale: bool) -> None:
    assert stale_epoch(have, mine) is stale


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=3)), min_size=1, max_size=12))
def test_fenced_drains_write_nothing_and_every_intent_is_applied_once(tmp_path_factory: pytest.TempPathFactory,
                                                                      steps: list[tuple[bool, int]]) -> None:
    """Any sequence of cycles, each committing some intents and draining while this controller holds its
    claim or not (another one claimed the store meanwhile): a fenced drain changes nothing, a holding drain
    settles everything pending, and no intent is applied twice."""
    d = tmp_path_factory.mktemp("fence")
    mine, other = SqliteStore(d / "state.db"), SqliteStore(d / "state.db")
    writer = SqliteStore(d / "state.db")  # commits the cycles' intents; never claims, so never fenced
    mine.claim("me")
    board = WeightBoard()
    runner = _runner(mine, board, d / "l.db")
    n = 0
    for holds, new in steps:
        if holds:
            mine.claim("me")
        else:
            other.claim("them")
        intents = []
        for _ in range(new):
            n += 1
            intents.append(Intent(float(n), IntentKind.SET_WEIGHT, f"replica-{n}", "min:latency",
                                  {"weight": 0.5, "state": "DEGRADED", "n": n}, Tier.INSTANCE))
        writer.commit(Decision(DecisionState(), [], intents, float(n)))
        before = (dict(board.weights), [r["status"] for r in mine.intents()])
        results = runner.drain(mine)
        if holds:
            assert {r["status"] for r in mine.intents()} <= {"applied"}
        else:
            assert results == [] and (dict(board.weights), [r["status"] for r in mine.intents()]) == before
    applied = [r for r in runner.ledger.actions(limit=10_000) if r.status == "applied"]
    assert len(applied) == len({r.key for r in applied})  # none twice
    assert set(board.weights) == {f"replica-{r['params']['n']}" for r in mine.intents() if r["status"] == "applied"}

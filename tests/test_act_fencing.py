"""Fencing without Kubernetes: the state store's claim. Two controllers on one SQLite file (the
PostgreSQL store runs the same SQL); once the second one claims the store, the first one's actuator calls
are refused before anything is written, its intent stays pending, and the log says so once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

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

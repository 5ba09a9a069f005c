"""The controller's commit-then-act order on both store backends (SQLite, and PostgreSQL where installed):

- intents committed but never acted on (the process died) are drained at the next start, each once;
- only the leader decides, commits and acts; a standby that takes over resumes from the store (the same
  state, no transition repeated) and drains what the old leader left pending; an old leader that has not
  noticed (a zombie) is fenced off: it neither commits nor acts;
- a database locked by another writer skips the cycle with one log line (no traceback, no 30 s wait),
  keeps the operator events of that cycle, and the next cycle commits.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pg_harness
from fleethealth.act.ledger import Ledger
from fleethealth.act.outcome import Outcome
from fleethealth.act.runner import ActuationRunner
from fleethealth.controller.loop import Controller
from fleethealth.decide.model import Intent, IntentKind, State
from fleethealth.decide.state import Event
from fleethealth.policy import default_policy
from fleethealth.store import open_store
from test_controller import FakeClock, FleetSource

PG_SKIP = pg_harness.skip_reason()


@pytest.fixture(scope="module")
def postgres() -> Iterator[pg_harness.Postgres | None]:
    if PG_SKIP is not None:
        yield None
        return
    pg = pg_harness.Postgres().start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path, postgres: pg_harness.Postgres | None) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    if postgres is None:
        pytest.skip(str(PG_SKIP))
    return postgres.new_database()


class Effects:
    """An actuator that counts its effects per intent key (what the real ones make idempotent)."""

    name = "effects"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def apply(self, intent: Intent) -> Outcome:
        self.calls.append(intent.key)
        return Outcome.success()


def ledger_url(url: str) -> str:
    return url if url.startswith("postgresql://") else str(Path(url).with_suffix(".actions.db"))


def controller(url: str, src: FleetSource, clock: FakeClock, eff: Effects | None,
               leader: list[bool] | None = None) -> Controller:
    is_leader = (lambda: leader[0]) if leader is not None else None
    runner = None
    if eff is not None:
        runner = ActuationRunner({k: [eff] for k in IntentKind}, Ledger(ledger_url(url)), "enforce",
                                 clock=clock.now, is_leader=is_leader)
    return Controller(default_policy(), [src], interval_s=15.0, clock=clock, store=open_store(url), runner=runner,
                      is_leader=is_leader)


def cycles(ctl: Controller, clock: FakeClock, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        out.append(ctl.cycle())
        clock.t += ctl.interval_s
    return out


def test_committed_but_never_acted_on_is_drained_once_at_the_next_start(url: str) -> None:
    src, clock = FleetSource(), FakeClock()
    first = controller(url, src, clock, None)  # commits, never acts: as if killed between commit and act
    cycles(first, clock, 3)
    src.xid = 79
    cycles(first, clock, 2)
    store: Any = first.loop.store
    pending = store.intents(status="pending")
    assert {i["intent"] for i in pending} >= {"quarantine", "capture_evidence"}
    store.close()

    eff = Effects()
    again = controller(url, src, clock, eff)
    again.drain_outbox()  # what run() does before its first cycle
    assert sorted(eff.calls) == sorted(i["key"] for i in pending)
    cycles(again, clock, 3)  # later cycles drain again: nothing repeated
    keys = [i["key"] for i in again.loop.store.intents()]  # type: ignore[union-attr]
    assert sorted(eff.calls) == sorted(keys) and len(set(eff.calls)) == len(eff.calls)
    assert again.loop.store.intents(status="pending") == []  # type: ignore[union-attr]


def test_only_the_leader_commits_and_a_standby_resumes_from_the_store(url: str) -> None:
    src, clock = FleetSource(), FakeClock()
    a_leads, b_leads = [True], [False]
    eff_a, eff_b = Effects(), Effects()
    a = controller(url, src, clock, eff_a, a_leads)
    b = controller(url, src, clock, eff_b, b_leads)

    def both(n: int) -> None:
        for _ in range(n):
            a.cycle()
            b.cycle()
            clock.t += 15.0

    both(3)
    src.xid = 79
    both(2)
    assert a.state.entities["n0"].state == State.QUARANTINED
    assert b.published.report is not None and b.published.report.skipped.startswith("standby")
    hb = b.published.health  # a standby scores (its read endpoints show the fleet), it does not decide
    assert hb is not None and hb.tuples["n0"].value == 0.0 and hb.tuples["n1"].value is not None
    # an operator's event posted to the standby (the Service picks either pod) reaches the leader, once
    seen: list[Event] = []
    for ctl in (a, b):
        inner = ctl.loop.cycle

        def spy(snap: Any, now: float, events: Any = (), inner: Any = inner) -> Any:
            seen.extend(events)
            return inner(snap, now, events)
        ctl.loop.cycle = spy  # type: ignore[method-assign]
    ack = Event(clock.t - 5, "ack", "n3", to="QUARANTINED", actor="oncall")
    b.add_event(ack)
    both(2)
    assert seen == [ack]  # taken by the leader's next cycle, and only by it
    assert b.loop.store.pending_events() == []  # type: ignore[union-attr]
    assert eff_b.calls == [] and eff_a.calls
    a_trans = a.loop.store.transitions()  # type: ignore[union-attr]
    assert [t["to"] for t in a_trans if t["entity"] == "n0"] == ["QUARANTINED"]
    # the standby takes the Lease (the old leader, paused or partitioned, has not noticed: a zombie)
    b_leads[0] = True
    committed = b.loop.store.load()  # type: ignore[union-attr]
    assert committed is not None
    rep = b.cycle()
    clock.t += 15.0
    assert rep.skipped == "" and b.takeovers_total == 1
    assert b.state.entities["n0"].state == State.QUARANTINED  # resumed, not rediscovered
    assert rep.transitions == []  # nothing repeated
    calls_a = len(eff_a.calls)
    src.xid = 0
    src.down_nodes = {"n5"}  # something new to decide, that only one of them may write
    both(3)
    zombie = a.published.report
    assert zombie is not None and "another controller took over" in zombie.skipped
    assert len(eff_a.calls) == calls_a  # fenced: the zombie neither commits nor acts
    trans = b.loop.store.transitions()  # type: ignore[union-attr]
    assert [t["to"] for t in trans if t["entity"] == "n0"] == ["QUARANTINED"]  # none repeated
    assert seen == [ack]  # the new leader did not take the ack again
    assert eff_b.calls == [] or set(eff_b.calls).isdisjoint(eff_a.calls)  # nothing applied twice
    assert b.state.last_ts is not None and b.state.last_ts > (committed.last_ts or 0)
    assert b.loop.store.load().last_ts == b.state.last_ts  # type: ignore[union-attr]  # B's writes stand


def _lock(url: str) -> tuple[threading.Event, threading.Thread]:
    release, held = threading.Event(), threading.Event()
    if url.startswith("postgresql://"):
        import psycopg

        def run() -> None:
            with psycopg.connect(url) as c:
                c.execute("LOCK TABLE meta IN ACCESS EXCLUSIVE MODE")
                held.set()
                release.wait(30)
    else:
        def run() -> None:
            c = sqlite3.connect(url, isolation_level=None)
            c.execute("BEGIN IMMEDIATE")
            held.set()
            release.wait(30)
            c.execute("ROLLBACK")
            c.close()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert held.wait(10)
    return release, th


def test_a_locked_database_skips_the_cycle_in_one_line(url: str, caplog: pytest.LogCaptureFixture) -> None:
    src, clock = FleetSource(), FakeClock()
    eff = Effects()
    ctl = controller(url, src, clock, eff)
    cycles(ctl, clock, 3)
    before = ctl.state.to_dict()
    src.xid = 79
    ctl.add_event(Event(clock.t, "ack", "n3", actor="oncall"))
    release, th = _lock(url)
    try:
        with caplog.at_level(logging.ERROR, logger="fleethealth.controller"):
            rep = ctl.cycle()
    finally:
        release.set()
        th.join(10)
    errs = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errs) == 1 and errs[0].exc_info is None and "\n" not in errs[0].getMessage()
    assert "skipped" in errs[0].getMessage() and ("locked" in errs[0].getMessage() or "busy" in errs[0].getMessage())
    assert rep.skipped.startswith("state store") and rep.intents == [] and eff.calls == []
    assert ctl.state.to_dict() == before and ctl.store_errors_total == 1
    store: Any = ctl.loop.store
    assert [e["entity"] for e in store.pending_events()] == ["n3"]  # the operator's ack waits in the inbox
    clock.t += 15.0
    rep2 = ctl.cycle()
    assert rep2.skipped == "" and [t.entity for t in rep2.transitions] == ["n0"]
    assert eff.calls and store.pending_events() == []  # taken once, by the cycle that committed

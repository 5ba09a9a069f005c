"""One suite, both state-store backends: SQLite (the embedded default) and PostgreSQL (Debian's server,
started on loopback by tests/pg_harness.py; skipped where it is not installed). The same store and
ledger methods must give the same answers: round trip of the whole state, idempotent intents, resumed
timers, the outbox (pending -> applied / failed, drained after a restart), the ledger's idempotency, and a
database held locked by another writer reported as StoreBusy after the short busy timeout."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pg_harness
from decide_support import Run, tup
from fleethealth.act.ledger import Ledger, intent_from_dict
from fleethealth.act.outcome import Outcome
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import Intent, IntentKind, State
from fleethealth.decide.state import DecisionState, Event
from fleethealth.store import StateStore, StoreBusy, StoreError, open_store
from fleethealth.store.db import PgSchema, safe_url

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
    """A fresh, empty database of each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    if postgres is None:
        pytest.skip(str(PG_SKIP))
    return postgres.new_database()


def _run(store: Any, start: float, end: float, make: Callable[[float], list[Any]],
         st: DecisionState | None = None) -> DecisionState:
    d = Decider()
    st = st or DecisionState()
    for t in range(int(start), int(end), 15):
        dec = d.decide(st, make(t), t)
        store.commit(dec)
        st = dec.state
    return st


def test_round_trip_of_state_and_logs(url: str) -> None:
    store = open_store(url)
    assert isinstance(store, StateStore)
    assert store.load() is None
    st = _run(store, 0, 400, lambda t: [tup("n1", 0.1, labels={"pool": "p"}), tup("r1", 0.8, kind="replica")])
    store.close()
    again: Any = open_store(url)
    loaded = again.load()
    assert loaded is not None and loaded.to_dict() == st.to_dict()  # timers, ledgers, weights, counters
    assert [t["to"] for t in again.transitions("n1")] == ["DEGRADED", "QUARANTINED"]
    kinds = [i["intent"] for i in again.intents()]
    assert "quarantine" in kinds and "set_weight" in kinds
    assert all(i["status"] == "pending" for i in again.intents())  # the outbox, nothing acted on yet
    assert again.last_ts() == 390.0 and again.cycles() == len(range(0, 400, 15))
    ev = again.evidence("n1")
    assert len(ev) == 1 and ev[0]["location"] is None
    assert again.add_evidence_location(ev[0]["key"], "/var/lib/fleethealth/evidence/n1")
    assert again.evidence("n1")[0]["location"] == "/var/lib/fleethealth/evidence/n1"
    q = [i for i in again.intents() if i["intent"] == "quarantine"][0]
    assert again.mark_intent(q["key"], "applied", '{"kube": "applied"}')
    assert not again.mark_intent("no-such-key", "applied")
    assert [i["key"] for i in again.intents(status="applied")] == [q["key"]]
    assert q["key"] not in {i["key"] for i in again.intents(status="pending")}
    seqs = [i["params"]["n"] for i in again.intents()]
    assert seqs == sorted(seqs)  # the outbox drains in commit order
    again.label_incident("n1@0", "true_positive", "ecc", "oncall", 500.0, 120.0)
    again.label_incident("n1@0", "false_positive", "", "oncall", 600.0)  # the latest verdict wins
    assert again.incident_labels() == [{"key": "n1@0", "label": "false_positive", "cause": "", "by": "oncall",
                                        "ts": 600.0, "onset": None}]
    again.close()


def test_recent_transitions_and_intents_are_bounded_windows_read_back_after_a_restart(url: str) -> None:
    """Finding 4: what the API and the fleet view show as recent history comes from the store, so a
    restarted controller (or a new leader) shows it: the newest `limit` rows in since < ts <= until, of one
    entity or all, oldest first, in the shape the loop serves them."""
    store = open_store(url)
    _run(store, 0, 400, lambda t: [tup("n1", 0.1), tup("n2", 0.1 if t >= 200 else 1.0), tup("r1", 0.8, kind="replica")])
    store.close()
    again: Any = open_store(url)  # a fresh process's view: nothing in memory
    everything = again.transitions()
    assert len(everything) >= 4
    trs = again.recent_transitions()
    assert [(t["entity"], t["to"], t["ts"]) for t in trs] == [(t["entity"], t["to"], t["ts"]) for t in everything]
    assert set(trs[0]) >= {"ts", "entity", "kind", "from", "to", "reason", "value", "confidence"}
    assert [t["to"] for t in again.recent_transitions(entity="n1")] == ["DEGRADED", "QUARANTINED"]
    n2 = again.recent_transitions(entity="n2")
    assert n2 and n2[0]["to"] == "DEGRADED" and all(t["ts"] >= 200 for t in n2)
    newest = again.recent_transitions(limit=2)
    assert newest == trs[-2:]  # the newest two, oldest first
    first_ts = trs[0]["ts"]
    assert all(first_ts < t["ts"] <= 300 for t in again.recent_transitions(since=first_ts, until=300))
    assert again.recent_transitions(since=10_000) == [] and again.recent_transitions(limit=0) == []
    ints = again.recent_intents(entity="n1")
    assert ints and {i["entity"] for i in ints} == {"n1"} and "quarantine" in {i["intent"] for i in ints}
    assert set(ints[0]) >= {"ts", "intent", "entity", "reason", "params", "tier", "soft", "key", "status"}
    stored = [i for i in again.intents() if i["entity"] == "n1"]
    assert [i["key"] for i in ints] == [i["key"] for i in sorted(stored, key=lambda i: i["ts"])]
    assert [i["key"] for i in again.recent_intents(entity="n1", limit=1)] == [ints[-1]["key"]]
    assert all(100 < i["ts"] <= 200 for i in again.recent_intents(since=100, until=200))
    again.close()


def test_recommitting_a_cycle_keeps_one_row_per_intent_key(url: str) -> None:
    store = open_store(url)
    st = DecisionState()
    dec = Decider().decide(st, [tup("n1", 0.0, reason="gate:xid")], 0)
    store.commit(dec)
    n = len(store.intents())
    dec2 = Decider().decide(st, [tup("n1", 0.0, reason="gate:xid")], 0)  # the same cycle again
    store.commit(dec2)
    assert len(store.intents()) == n and n > 0
    store.close()


def test_resume_keeps_timers_and_repeats_no_action(url: str) -> None:
    r = Run()
    store = open_store(url)
    for t in range(0, 240, 15):
        d = r.decider.decide(r.state, [tup("n1", 0.1)], t)
        store.commit(d)
        r.state = d.state
    store.close()
    store2 = open_store(url)
    st = store2.load()
    assert st is not None and st.entities["n1"].timers["below_quarantine"].accum_s == 225.0
    out = []
    for t in range(240, 600, 15):
        d = Decider().decide(st, [tup("n1", 0.1)], t)
        store2.commit(d)
        st = d.state
        out += d.transitions
    assert [(x.ts, x.to_state) for x in out] == [(300, State.QUARANTINED)]
    assert len([i for i in store2.intents() if i["intent"] == str(IntentKind.QUARANTINE)]) == 1
    store2.close()


def test_events_and_removed_entities_survive_a_restart(url: str) -> None:
    store = open_store(url)
    st = DecisionState()
    for t, ev in ((0, []), (15, [Event(10, "active_test", "n1", passed=False)])):
        d = Decider().decide(st, [tup("n1", 0.0, reason="gate:xid"), tup("n2", 0.9)], t, ev)
        store.commit(d)
        st = d.state
    store.close()
    st2 = open_store(url).load()
    assert st2 is not None and st2.entities["n1"].state == State.FAILED and "n2" in st2.entities


class Recorder:
    name = "rec"

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def apply(self, intent: Intent) -> Outcome:
        self.calls.append(intent.key)
        if self.fail is not None and intent.kind == IntentKind.CAPTURE_EVIDENCE:
            return Outcome.failure(self.fail, retry=False)
        return Outcome.success()


def test_outbox_drain_applies_each_pending_intent_once_across_restarts(url: str) -> None:
    store: Any = open_store(url)
    _run(store, 0, 400, lambda t: [tup("n1", 0.0, reason="gate:xid", labels={"pool": "p"})])
    pending = store.intents(status="pending")
    assert {i["intent"] for i in pending} >= {"quarantine", "capture_evidence"}
    rec = Recorder(fail="evidence directory not writable")
    routes = {k: [rec] for k in IntentKind}
    runner = ActuationRunner(routes, Ledger(url), "enforce")
    runner.drain(store)
    assert sorted(rec.calls) == sorted(i["key"] for i in pending)  # each once, in commit order
    assert rec.calls == [i["key"] for i in pending]
    by = {i["key"]: i for i in store.intents()}
    assert all(by[i["key"]]["status"] in ("applied", "failed") for i in pending)
    failed = [i for i in by.values() if i["status"] == "failed"]
    assert failed and all(i["intent"] == "capture_evidence" and "not writable" in i["outcome"] for i in failed)
    assert runner.status()["outbox"]["failed_total"] == len(failed)
    store.close()
    # a restart (or the standby taking over) drains again: nothing left to do, nothing repeated
    store2: Any = open_store(url)
    rec2 = Recorder()
    ActuationRunner({k: [rec2] for k in IntentKind}, Ledger(url), "enforce").drain(store2)
    assert rec2.calls == [] and store2.intents(status="pending") == []
    store2.close()


def test_outbox_marked_applied_in_the_ledger_but_not_in_the_store_is_not_reapplied(url: str) -> None:
    """Crash after the ledger said applied, before the store's mark: the drain marks it, acts not again."""
    store: Any = open_store(url)
    _run(store, 0, 30, lambda t: [tup("n1", 0.0, reason="gate:xid", labels={"pool": "p"})])
    rec = Recorder()
    led = Ledger(url)
    runner = ActuationRunner({k: [rec] for k in IntentKind}, led, "enforce")
    for i in store.intents(status="pending"):  # applied by hand, as if the process died right after
        runner.submit(intent_from_dict(i))
    n = len(rec.calls)
    assert n > 0 and len(store.intents(status="pending")) == n
    runner.drain(store)
    assert len(rec.calls) == n and store.intents(status="pending") == []
    assert {i["status"] for i in store.intents()} == {"applied"}


def test_audit_and_inbox_on_both_backends(url: str) -> None:
    store: Any = open_store(url)
    store.audit(100.0, "alice", "ack", "n1", "10.0.0.7", True, {"to": "READY"})
    store.audit(101.0, "mallory", "kill", "-", "10.0.0.9", False)
    log = store.audit_log()
    assert [(r["actor"], r["allowed"], r["detail"]) for r in log] == [("alice", True, {"to": "READY"}),
                                                                       ("mallory", False, {})]
    assert [r["actor"] for r in store.audit_log(since=101.0)] == ["mallory"]
    ev = Event(99.0, "ack", "n1", to="READY", actor="alice").to_dict()
    store.put_event(ev)
    assert store.pending_events() == [ev]
    dec = Decider().decide(DecisionState(), [tup("n1", 0.9)], 100)
    store.commit(dec)  # the cycle that took the event removes it
    assert store.pending_events() == []
    store.close()


def test_a_writer_fenced_off_by_a_later_claim_cannot_commit(url: str) -> None:
    from fleethealth.store import StoreFenced

    a: Any = open_store(url)
    b: Any = open_store(url)
    d = Decider()
    st = DecisionState()
    a.claim("ctl-a:1")
    dec = d.decide(st, [tup("n1", 0.9)], 0)
    a.commit(dec)
    assert a.holds_fence() and b.holds_fence()  # b never claimed: nothing to lose
    b.claim("ctl-b:2")  # the standby takes over: claim, then load
    assert not a.holds_fence() and b.holds_fence()  # what the actuation runner checks before each write
    loaded = b.load()
    assert loaded is not None and loaded.last_ts == 0
    stale = d.decide(dec.state, [tup("n1", 0.0, reason="gate:xid")], 15)
    with pytest.raises(StoreFenced, match="another controller took over"):
        a.commit(stale)
    assert a.stats["fenced_total"] == 1 and a.stats["commits_total"] == 1
    b.commit(d.decide(loaded, [tup("n1", 0.9)], 15))
    after = open_store(url).load()
    assert after is not None and after.last_ts == 15 and after.entities["n1"].state == State.READY
    assert not [t for t in b.transitions("n1") if t["to"] == "QUARANTINED"]  # the fenced write left nothing


def test_ledger_idempotency_and_settings_on_both_backends(url: str) -> None:
    led = Ledger(url)
    it = Intent(1000.0, IntentKind.QUARANTINE, "n1", "gate:xid", {"n": 1})
    led.record_status(it, "kube", "started", 1000.0)
    assert led.get(it.key, "kube") is not None and led.get(it.key, "kube").status == "started"  # type: ignore[union-attr]
    led.record_attempt(it, "kube", Outcome.failure("503", retry=True), 1001.0, "retrying", next_ts=1010.0)
    assert [r.key for r in led.due(1005.0)] == [] and [r.key for r in led.due(1010.0)] == [it.key]
    led.record_attempt(it, "kube", Outcome.success(), 1011.0, "applied")
    rec = led.get(it.key, "kube")
    assert rec is not None and rec.status == "applied" and rec.attempts == 2
    assert [a["ok"] for a in led.attempts(it.key)] == [False, True]
    assert led.entities_acted(["quarantine"], 0.0) == {"n1"}
    assert led.counts() == {"applied": 1}
    assert [r.key for r in led.actions(entity="n1", limit=5)] == [it.key]
    led.set_setting("kill_switch", '{"reason": "x"}')
    assert Ledger(url).get_setting("kill_switch") == '{"reason": "x"}'  # another replica sees it
    led.set_setting("kill_switch", None)
    assert led.get_setting("kill_switch") is None
    assert led.prune(2000.0) == 1 and led.counts() == {}
    led.close()


def _hold_lock(url: str) -> tuple[Callable[[], None], threading.Event]:
    """Another writer holding the database locked until released."""
    release = threading.Event()
    held = threading.Event()
    if url.startswith("postgresql://"):
        import psycopg

        def pg() -> None:
            with psycopg.connect(url) as c:
                c.execute("LOCK TABLE meta IN ACCESS EXCLUSIVE MODE")
                held.set()
                release.wait(30)
        th = threading.Thread(target=pg, daemon=True)
    else:
        def lite() -> None:
            c = sqlite3.connect(url, isolation_level=None)
            c.execute("BEGIN IMMEDIATE")
            held.set()
            release.wait(30)
            c.execute("ROLLBACK")
            c.close()
        th = threading.Thread(target=lite, daemon=True)
    th.start()
    assert held.wait(10)

    def done() -> None:
        release.set()
        th.join(10)
    return done, held


def test_a_database_locked_by_another_writer_is_store_busy_in_one_line(url: str) -> None:
    store = open_store(url)
    st = DecisionState()
    dec = Decider().decide(st, [tup("n1", 0.0, reason="gate:xid")], 0)
    release, _ = _hold_lock(url)
    try:
        with pytest.raises(StoreBusy) as err:
            store.commit(dec)
        msg = str(err.value)
        assert "\n" not in msg and ("locked" in msg or "busy" in msg) and "1 s" in msg
    finally:
        release()
    store.commit(dec)  # the lock gone, the same cycle commits
    assert store.load() is not None
    stats: Any = store.stats  # type: ignore[attr-defined]
    assert stats["busy_total"] == 1 and stats["commits_total"] == 1 and stats["commit_seconds_last"] > 0
    # the outbox figures of /metrics: the gate's intents are pending, committed at 0, so 60 s old at 60
    summary = store.outbox_summary(60.0)  # type: ignore[attr-defined]
    assert summary["counts"]["pending"] == len(dec.intents) > 0 and summary["oldest_pending_age_s"] == 60.0
    store.mark_intent(dec.intents[0].key, "applied")  # type: ignore[attr-defined]
    assert store.outbox_summary(60.0)["counts"]["applied"] == 1  # type: ignore[attr-defined]
    store.close()


def test_a_lost_postgresql_connection_skips_one_commit_then_reconnects(
    postgres: pg_harness.Postgres | None,
) -> None:
    if postgres is None:
        pytest.skip(str(PG_SKIP))
    import psycopg

    from fleethealth.store.base import StoreUnavailable

    url = postgres.new_database()
    store: Any = open_store(url)
    d, st = Decider(), DecisionState()
    dec = d.decide(st, [tup("n1", 0.9)], 0)
    store.commit(dec)
    with psycopg.connect(url, autocommit=True) as admin:  # the server drops the controller's session
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    dec2 = d.decide(dec.state, [tup("n1", 0.9)], 15)
    with pytest.raises(StoreUnavailable) as err:
        store.commit(dec2)
    assert "\n" not in str(err.value) and "connection" in str(err.value)
    store.commit(dec2)  # the next cycle: a new connection, the same commit
    loaded = open_store(url).load()
    assert loaded is not None and loaded.last_ts == 15


def test_unreachable_or_unsupported_databases_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="unsupported"):
        open_store("mysql://db/fleet")
    from fleethealth.store.base import StoreUnavailable

    with pytest.raises(StoreUnavailable) as err:
        open_store("postgresql://fh:hunter2@127.0.0.1:1/fleet")
    assert "hunter2" not in str(err.value) and "\n" not in str(err.value)
    assert safe_url("postgresql://fh:hunter2@db:5432/x") == "postgresql://fh:***@db:5432/x"


def test_sqlite_dialect_translation() -> None:
    sch = PgSchema()
    ddl = sch.translate("CREATE TABLE IF NOT EXISTS t (key TEXT PRIMARY KEY, ts REAL NOT NULL, n INTEGER, "
                        "by_ TEXT)")
    assert "DOUBLE PRECISION" in ddl and "BIGINT" in ddl and "rowid BIGINT GENERATED" in ddl
    assert sch.statement("INSERT OR REPLACE INTO t VALUES (?,?)") == (
        "INSERT INTO t VALUES (%s,%s) ON CONFLICT (key) DO UPDATE SET ts=EXCLUDED.ts")
    assert sch.statement("INSERT OR IGNORE INTO t (key, n) VALUES (?, ?)") == (
        "INSERT INTO t (key, n) VALUES (%s, %s) ON CONFLICT DO NOTHING")
    assert sch.statement("BEGIN IMMEDIATE") == "BEGIN"
    assert sch.statement("SELECT * FROM t WHERE key LIKE 'a%' AND n=?") == (
        "SELECT * FROM t WHERE key LIKE 'a%%' AND n=%s")


def test_the_two_replica_manifest_uses_postgresql_not_a_shared_sqlite_file() -> None:
    import yaml

    from fleethealth.controller.config import ControllerConfig

    docs = list(yaml.safe_load_all((Path(__file__).resolve().parent.parent / "deploy" / "controller.yaml")
                                   .read_text()))
    dep = next(d for d in docs if d["kind"] == "Deployment")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    cfg = ControllerConfig.model_validate(yaml.safe_load(cm["data"]["controller.yaml"]))
    assert dep["spec"]["replicas"] == 2 and cfg.state_db is not None
    assert cfg.state_db.startswith("postgresql://") and ":" not in cfg.state_db.split("@")[0].split("//")[1]
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "fleethealth-postgres"
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"
                and "ReadWriteMany" in d["spec"].get("accessModes", [])]

"""ActuationRunner and its SQLite ledger: advise by default, per-kind enforcement, kill switch, idempotency
across restarts, retries with backoff that are recorded and never lost.

The actuators here are small in-process recorders (the runner's contract is with the Actuator protocol,
not with any server); the real servers are exercised in test_act_k8s.py, test_act_pager.py and
test_act_evidence.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleethealth.act.config import ActuationConfig, load_actuation_config
from fleethealth.act.ledger import Ledger
from fleethealth.act.outcome import Outcome
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import Intent, IntentKind, Tier


class Recorder:
    def __init__(self, name: str = "rec", script: list[Outcome] | None = None) -> None:
        self.name = name
        self.calls: list[str] = []
        self.script = list(script or [])

    def apply(self, intent: Intent) -> Outcome:
        self.calls.append(intent.key)
        if self.script:
            return self.script.pop(0)
        return Outcome.success(done=True)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def q(entity: str = "node-a", kind: IntentKind = IntentKind.QUARANTINE, n: int = 1) -> Intent:
    return Intent(ts=1000.0, kind=kind, entity=entity, reason="gate:xid_79", params={"n": n}, tier=Tier.NODE)


def make(tmp_path: Path, cfg: ActuationConfig | str | None, *acts: Recorder, clock: Clock | None = None,
         leader: list[bool] | None = None) -> ActuationRunner:
    clock = clock or Clock()
    routes = {IntentKind.QUARANTINE: list(acts), IntentKind.PAGE: list(acts)}
    return ActuationRunner(routes, Ledger(tmp_path / "ledger.db"), cfg, clock=clock, sleep=clock.sleep,
                           is_leader=(lambda: leader[0]) if leader is not None else None)


def test_advise_is_the_default_and_records_without_acting(tmp_path: Path) -> None:
    rec = Recorder()
    r = make(tmp_path, None, rec)
    res = r.submit(q())
    assert [x.status for x in res] == ["advised"]
    assert rec.calls == []
    [row] = r.ledger.actions()
    assert row.status == "advised" and row.kind == "quarantine" and row.entity == "node-a"
    assert r.status()["mode"] == "advise"


def test_enforcement_is_per_intent_kind(tmp_path: Path) -> None:
    rec = Recorder()
    r = make(tmp_path, ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE})), rec)
    assert r.submit(q())[0].status == "advised"
    assert r.submit(q(kind=IntentKind.PAGE))[0].status == "applied"
    assert len(rec.calls) == 1


def test_applied_intent_is_never_reapplied_even_after_restart(tmp_path: Path) -> None:
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind))
    rec = Recorder()
    r = make(tmp_path, cfg, rec)
    assert r.submit(q())[0].status == "applied"
    assert r.submit(q())[0].status == "duplicate"
    r.ledger.close()
    rec2 = Recorder()
    r2 = make(tmp_path, cfg, rec2)  # a new process on the same database
    assert r2.submit(q())[0].status == "duplicate"
    assert rec2.calls == [] and len(rec.calls) == 1
    # A different episode (new key) does act.
    assert r2.submit(q(n=2))[0].status == "applied"


def test_advised_then_enforced_acts_once(tmp_path: Path) -> None:
    rec = Recorder()
    make(tmp_path, None, rec).submit(q())
    r = make(tmp_path, ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.QUARANTINE})), rec)
    assert r.submit(q())[0].status == "applied"
    assert r.submit(q())[0].status == "duplicate"
    assert len(rec.calls) == 1


def test_kill_switch_stops_everything_and_survives_restart(tmp_path: Path) -> None:
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind))
    rec = Recorder()
    r = make(tmp_path, cfg, rec)
    r.kill("operator said stop")
    assert r.submit(q())[0].status == "killed"
    assert rec.calls == []
    r2 = make(tmp_path, cfg, rec)
    assert r2.killed and r2.status()["kill"]["reason"] == "operator said stop"
    assert r2.submit(q())[0].status == "killed"
    r2.resume()
    assert r2.submit(q())[0].status == "applied"
    assert len(rec.calls) == 1
    # The config flag cannot be lifted at run time.
    r3 = make(tmp_path, cfg.model_copy(update={"kill_switch": True}), rec)
    r3.resume()
    assert r3.submit(q(n=5))[0].status == "killed"


def test_retryable_failures_back_off_and_every_attempt_is_recorded(tmp_path: Path) -> None:
    clock = Clock()
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), attempts_per_cycle=3,
                          backoff_initial_s=1.0, backoff_max_s=3.0)
    rec = Recorder(script=[Outcome.from_status(503, "unavailable"), Outcome.from_status(429, "throttled"),
                           Outcome.from_status(409, "conflict"), Outcome.failure("timeout", retry=True)])
    r = make(tmp_path, cfg, rec, clock=clock)
    res = r.submit(q())[0]
    assert res.status == "retrying" and res.attempts == 3
    assert clock.sleeps == [1.0, 2.0]  # exponential, within the cycle
    # Not due yet: a resubmission waits instead of hammering the API.
    assert r.submit(q())[0].status == "waiting"
    assert r.retry_due() == []
    clock.t += 3.0  # capped backoff elapsed
    res2 = r.retry_due()
    assert [x.status for x in res2] == ["applied"]
    att = r.ledger.attempts(q().key)
    assert [a["n"] for a in att] == [1, 2, 3, 4, 5]
    assert [a["ok"] for a in att] == [False, False, False, False, True]
    assert att[0]["error"].startswith("503") and att[1]["error"].startswith("429")


def test_retries_survive_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), attempts_per_cycle=1)
    rec = Recorder(script=[Outcome.from_status(500, "boom")])
    make(tmp_path, cfg, rec, clock=clock).submit(q())
    clock.t += 60
    rec2 = Recorder()
    r2 = make(tmp_path, cfg, rec2, clock=clock)
    assert [x.status for x in r2.retry_due()] == ["applied"]
    assert rec2.calls == [q().key]


def test_non_retryable_and_exhausted_failures_are_reported_as_failed(tmp_path: Path) -> None:
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), max_attempts=2, attempts_per_cycle=5)
    rec = Recorder(script=[Outcome.from_status(403, "forbidden")])
    r = make(tmp_path, cfg, rec)
    assert r.submit(q())[0].status == "failed"
    rec2 = Recorder("rec2", script=[Outcome.from_status(503, "x"), Outcome.from_status(503, "x")])
    r2 = make(tmp_path, cfg, rec2)
    res = r2.submit(q(n=9))[0]
    assert res.status == "failed" and res.attempts == 2
    assert r2.ledger.get(q(n=9).key, "rec2").status == "failed"  # type: ignore[union-attr]


def test_actuator_exception_is_recorded_not_lost(tmp_path: Path) -> None:
    class Boom:
        name = "boom"

        def apply(self, intent: Intent) -> Outcome:
            raise RuntimeError("bug")

    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), attempts_per_cycle=1)
    clock = Clock()
    r = ActuationRunner({IntentKind.QUARANTINE: [Boom()]}, Ledger(tmp_path / "l.db"), cfg, clock=clock,
                        sleep=clock.sleep)
    res = r.submit(q())[0]
    assert res.status == "retrying" and "RuntimeError" in res.error
    assert r.ledger.attempts(q().key)[0]["error"] == "RuntimeError: bug"


def test_not_leader_does_nothing_and_records_nothing(tmp_path: Path) -> None:
    leader = [False]
    rec = Recorder()
    r = make(tmp_path, ActuationConfig(mode="enforce", enforce=frozenset(IntentKind)), rec, leader=leader)
    assert r.submit(q())[0].status == "not_leader"
    assert rec.calls == [] and r.ledger.actions() == []
    leader[0] = True
    assert r.submit(q())[0].status == "applied"


def test_routes_run_in_order_each_with_its_own_ledger_entry(tmp_path: Path) -> None:
    order: list[str] = []

    class Named(Recorder):
        def apply(self, intent: Intent) -> Outcome:
            order.append(self.name)
            return super().apply(intent)

    ev, k8s = Named("evidence", [Outcome.from_status(500, "prom down")]), Named("kubernetes")
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), attempts_per_cycle=1)
    r = make(tmp_path, cfg, ev, k8s)
    res = r.submit(q())
    assert [(x.actuator, x.status) for x in res] == [("evidence", "retrying"), ("kubernetes", "applied")]
    assert order == ["evidence", "kubernetes"]


def test_config_loading_rejects_typos_and_accepts_all(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("actuation:\n  mode: enforce\n  enforce: all\n")
    cfg = load_actuation_config(p)
    assert cfg.enforces(IntentKind.QUARANTINE) and cfg.enforces(IntentKind.PAGE)
    with pytest.raises(ValueError):
        load_actuation_config({"mode": "enforce", "enforse": ["page"]})
    assert not load_actuation_config(None).enforces(IntentKind.PAGE)


def test_in_progress_outcomes_do_not_use_up_attempts_or_block_the_cycle(tmp_path: Path) -> None:
    clock = Clock()
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), attempts_per_cycle=3, max_attempts=2,
                          backoff_initial_s=1.0, backoff_max_s=1.0)
    held = Outcome.failure("drain in progress", retry=True, in_progress=True)
    rec = Recorder(script=[held] * 5)
    r = make(tmp_path, cfg, rec, clock=clock)
    assert r.submit(q())[0].status == "retrying"
    assert len(rec.calls) == 1 and clock.sleeps == []  # one pass per cycle, no sleeping in the caller
    for _ in range(4):
        clock.t += 1.0
        assert [x.status for x in r.retry_due()] == ["retrying"]  # past max_attempts, still not failed
    clock.t += 1.0
    assert [x.status for x in r.retry_due()] == ["applied"]
    assert len(r.ledger.attempts(q().key)) == 6


def test_ledger_counts_and_prune_keep_retrying_actions(tmp_path: Path) -> None:
    clock = Clock()
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), attempts_per_cycle=1)
    r = make(tmp_path, cfg, Recorder(script=[Outcome.success(), Outcome.from_status(503, "x")]), clock=clock)
    r.submit(q(n=1))
    r.submit(q(n=2))
    assert r.ledger.counts() == {"applied": 1, "retrying": 1}
    assert r.status()["actions"] == {"applied": 1, "retrying": 1}
    assert r.ledger.prune(clock.t + 1) == 1
    assert r.ledger.counts() == {"retrying": 1} and r.ledger.attempts(q(n=1).key) == []


def test_actuators_as_a_list_route_by_their_kinds_and_mode_shorthand(tmp_path: Path) -> None:
    class Pager(Recorder):
        kinds = frozenset({IntentKind.PAGE})

    class Node(Recorder):
        kinds = frozenset({IntentKind.QUARANTINE, IntentKind.NO_NEW_WORK})

    pager, node = Pager("pager"), Node("node")
    r = ActuationRunner([pager, node], Ledger(tmp_path / "l.db"), "enforce")
    assert r.submit(q(kind=IntentKind.PAGE))[0].actuator == "pager"
    assert [x.status for x in r.submit(q())] == ["applied"] and node.calls
    assert r.submit(q(kind=IntentKind.SET_WEIGHT))[0].status == "unrouted"
    assert ActuationRunner([node], Ledger(tmp_path / "m.db"), "advise").submit(q(n=3))[0].status == "advised"


def test_circuit_breaker_holds_isolations_beyond_the_limit(tmp_path: Path) -> None:
    clock = Clock()
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), breaker_max_entities=2,
                          breaker_window_s=300)
    ev, node = Recorder("evidence"), Recorder("node")
    r = make(tmp_path, cfg, ev, node, clock=clock)
    assert [x.status for x in r.submit(q("n1"))] == ["applied", "applied"]  # evidence + node: one entity
    assert [x.status for x in r.submit(q("n2"))] == ["applied", "applied"]
    held = r.submit(q("n3"))
    assert [x.status for x in held] == ["breaker", "breaker"] and "limit 2" in held[0].error
    assert r.submit(q("n1", n=2))[0].status == "applied"  # an entity already isolated is not a new one
    assert r.submit(q("n3", kind=IntentKind.PAGE))[0].status == "applied"  # pages are never held
    assert r.retry_due() == []  # not due yet
    clock.t += 301
    # Held, never lost: the retry pass picks it up once the window moved on, without a resubmission.
    assert [x.status for x in r.retry_due()] == ["applied", "applied"]
    assert r.ledger.get(q("n3").key, "node").status == "applied"  # type: ignore[union-attr]

"""Version holds and a node's own stall under a bad driver rollout (issue 16, rollout items 1 and 2).

1. The driver's first victims are gated before the version is suspect: they are quarantined and climb the
   reset ladder, which cannot help while the driver is bad. When the version incident opens they are tied
   to it: the ladder in flight stops with the reason, failed tests and repairs no longer fail them, the page
   names them, and when the incident resolves (the rollback) each is retested, a FAILED one first going back
   to QUARANTINED. Physical evidence keeps its own path.
2. A node of the suspect version whose own ranks stall (a performance category at 0) while the version's
   other nodes run is the node's fault: isolated on the rate budget, not held; many stalling together are
   the version's.

Decider level, the shape of QA's ``qa-budget`` (a 16-node pool, the version suspect at its fourth victim)."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import Event
from fleethealth.policy import default_policy
from fleethealth.score.health import HealthTuple

NEW, OLD = "560.28.03", "550.54.15"
POOL = 16
KEY = f"version:node:driver_version={NEW}"
ROLLBACK = 3 * 3600.0
GATE_FLAGS = ("xid:119", "recovery_action:GPU_RESET")


def _policy():  # type: ignore[no-untyped-def]
    p = default_policy()
    # four driver victims make the version suspect: the first three are quarantined before it is
    return p.model_copy(update={"attribution": p.attribution.model_copy(update={"version_min_entities": 4})})


def _node(n: str, value: float, lab: dict[str, str], reason: str | None = None, flags: tuple[str, ...] = (),
          perf: float = 1.0) -> HealthTuple:
    t = tup(n, value, reason=reason, labels=lab, flags=flags, worst="hardware" if value < 0.5 else None)
    return HealthTuple(t.entity, t.kind, t.value, t.confidence, t.worst, t.reason,
                       {"hardware": value, "performance": perf}, labels=t.labels, flags=t.flags)


def _rollout(stalls: dict[str, float] | None = None, dead: str | None = None):  # type: ignore[no-untyped-def]
    """Nodes 0-11 run the new driver until ROLLBACK, 12-15 the old one. Victims n00, n02, n04, n06, n08,
    n10 gate on Xid 119 from 600 s, one every two minutes, until ROLLBACK. ``stalls``: node -> onset of its
    ranks stalling (performance 0). ``dead``: a node whose GPU falls off the bus (Xid 79) at 500 s."""
    victims = {f"n{i:02d}": 600.0 + 60.0 * i for i in range(0, 12, 2)}

    def make(t: float) -> list[HealthTuple]:
        out = []
        for i in range(POOL):
            n = f"n{i:02d}"
            lab = {"pool": "train-a", "driver_version": NEW if i < 12 and t < ROLLBACK else OLD,
                   "tp_group": f"tp{i}"}
            perf = 0.0 if stalls and n in stalls and t >= stalls[n] else 1.0
            if n == dead and t >= 500.0:
                out.append(_node(n, 0.0, lab, "gate:xid", ("xid:79",), perf))
            elif n in victims and victims[n] <= t < ROLLBACK:
                out.append(_node(n, 0.0, lab, "gate:xid", GATE_FLAGS, perf))
            elif perf == 0.0:
                out.append(_node(n, 0.0, lab, "min:performance", (), perf))
            else:
                out.append(_node(n, 0.97, lab))
        return out

    return make, victims


def _drive(r: Run, make, start: float, end: float,  # type: ignore[no-untyped-def]
           events: dict[float, list[Event]] | None = None) -> None:
    t = start
    while t <= end:
        r.step(t, make(t), (events or {}).get(t, []))
        t += 60.0


def _version_pages(r: Run) -> list:
    return [i for i in r.of(IntentKind.PAGE) if i.reason == "version_correlation" and incidents.is_new_page(i.params)]


def test_the_drivers_first_victims_are_held_by_the_version_incident_and_retested_after_the_rollback() -> None:
    make, _ = _rollout()
    r = Run(policy=_policy())
    # n00: its reset failed and its ladder was exhausted before the version was suspect: FAILED, paged
    early = {660.0: [Event(660.0, "repair", "n00", passed=False, actor="agent")]}
    _drive(r, make, 0.0, 900.0, early)
    assert r.st("n00") == State.FAILED
    assert [r.st(n) for n in ("n02", "n04")] == [State.QUARANTINED, State.QUARANTINED]
    assert r.state.entities["n02"].repair["phase"] == "acting"  # the reset ladder climbs
    # 960 s: the fourth victim makes the version suspect; the three isolated victims are tied to it
    _drive(r, make, 960.0, 960.0)
    assert {n: r.state.entities[n].version_hold for n in ("n00", "n02", "n04")} == dict.fromkeys(
        ("n00", "n02", "n04"), KEY)
    rep = r.state.entities["n02"].repair
    assert rep["phase"] == "stopped" and rep["stopped"] == f"version incident {KEY}"
    assert rep["history"][-1]["result"] == f"stopped: version incident {KEY}"
    (page,) = _version_pages(r)
    assert (page.params["held"], page.params["failed_held"], page.params["n_held"]) == (
        ["n00", "n02", "n04"], ["n00"], 3)
    # the driver fails their tests and repairs: that no longer fails them, and no ladder step goes out
    later = {1200.0: [Event(1200.0, "active_test", "n02", passed=False, actor="agent"),
                      Event(1200.0, "repair", "n04", passed=False, actor="agent")]}
    resets_before = len(r.of(IntentKind.SCHEDULE_RESET))
    _drive(r, make, 1020.0, ROLLBACK - 60.0, later)
    assert [r.st(n) for n in ("n00", "n02", "n04")] == [State.FAILED, State.QUARANTINED, State.QUARANTINED]
    assert len(r.of(IntentKind.SCHEDULE_RESET)) == resets_before
    assert [i.params["state"] for i in r.of(IntentKind.PAGE, "n02")] == []
    # the rollback: each held node runs the old driver now (its label changed), so it is retested at once
    # (n00 back to QUARANTINED first), without waiting for the incident to resolve
    _drive(r, make, ROLLBACK, ROLLBACK + 1200.0)
    tests = {i.entity: (i.ts, i.reason) for i in r.of(IntentKind.RUN_ACTIVE_TEST) if i.ts >= ROLLBACK}
    assert tests == dict.fromkeys(("n00", "n02", "n04"), (ROLLBACK, f"version_resolved:{KEY}"))
    back = next(t for t in r.transitions if t.entity == "n00" and t.ts >= ROLLBACK)
    assert (back.from_state, back.to_state, back.reason) == (State.FAILED, State.QUARANTINED,
                                                             f"version_resolved:{KEY}")
    assert all(r.state.entities[n].version_hold is None for n in ("n00", "n02", "n04"))
    # the tests pass: the normal path releases them
    t = ROLLBACK + 1260.0
    passed = {t: [Event(t, "active_test", n, passed=True, actor="agent") for n in ("n00", "n02", "n04")]}
    _drive(r, make, t, t, passed)
    assert [r.st(n) for n in ("n00", "n02", "n04")] == [State.RECOVERING] * 3


def test_physical_evidence_before_the_incident_is_not_tied_and_keeps_its_ladder() -> None:
    make, _ = _rollout(dead="n05")
    r = Run(policy=_policy())
    _drive(r, make, 0.0, 1020.0)
    dead = r.state.entities["n05"]
    assert dead.state == State.QUARANTINED and dead.version_hold is None
    assert dead.repair is not None and dead.repair["phase"] in ("acting", "verifying")
    (iso,) = [t for t in r.transitions if t.entity == "n05"]
    assert iso.detail == "hard_gate budget:physical"  # the budget it spent, for the backtest's judge
    assert r.state.entities["n00"].version_hold == KEY


def test_a_node_isolated_longer_than_the_lookback_before_the_incident_is_not_tied() -> None:
    p = _policy()
    p = p.model_copy(update={"attribution": p.attribution.model_copy(update={"version_hold_lookback_s": 200.0})})
    make, _ = _rollout()
    r = Run(policy=p)
    _drive(r, make, 0.0, 960.0)
    # isolated at 600, 720, 840; the incident opened at 960: only n04 (120 s before) is within 200 s
    assert {n: r.state.entities[n].version_hold for n in ("n00", "n02", "n04")} == {
        "n00": None, "n02": None, "n04": KEY}


def test_a_victims_own_stall_under_a_version_hold_is_isolated_at_once_on_the_rate_budget() -> None:
    # n06 is a victim (gated by Xid 119, held by the version) whose ranks then stall: the hang of QA's run
    make, _ = _rollout(stalls={"n06": 1800.0})
    r = Run(policy=_policy())
    _drive(r, make, 0.0, 1740.0)
    assert r.state.entities["n06"].blocked == f"version:driver_version={NEW}"
    _drive(r, make, 1800.0, 2400.0)
    (q,) = r.of(IntentKind.QUARANTINE, "n06")
    assert (q.ts, q.reason) == (1800.0, "min:performance")  # the gate's dwell had long run: at once
    assert ("node:train-a", "n06") in [(k, e) for _, k, e in r.state.ledger]  # the rate budget
    # isolated while the incident was open, on its own evidence: never tied to the version
    assert r.state.entities["n06"].version_hold is None


def test_a_healthy_nodes_own_stall_under_a_version_hold_is_isolated() -> None:
    make, _ = _rollout(stalls={"n07": 1800.0})
    r = Run(policy=_policy())
    _drive(r, make, 0.0, 2400.0)
    (q,) = r.of(IntentKind.QUARANTINE, "n07")
    assert q.reason == "min:performance"
    assert q.ts <= 1800.0 + _policy().lifecycle.quarantine_dwell_s + 60.0
    assert r.state.entities["n07"].version_hold is None


def test_many_nodes_of_the_version_stalling_together_are_the_versions_and_held() -> None:
    stalls = {f"n{i:02d}": 1800.0 for i in (1, 3, 5, 7)}
    make, _ = _rollout(stalls=stalls)
    r = Run(policy=_policy())
    _drive(r, make, 0.0, 2400.0)
    assert not [i for i in r.of(IntentKind.QUARANTINE) if i.ts >= 1800.0]
    for n in stalls:
        assert r.state.entities[n].blocked == f"version:driver_version={NEW}"


def test_the_version_stays_suspect_while_its_incident_is_open() -> None:
    # the ladder's resets clear the first victims' gates for a while: only one node reads unhealthy, the
    # version no longer correlates, but its incident is still open, and the next victim is held, not
    # quarantined (full-length bad-driver-rollout: node-36 quarantined in such a gap, then FAILED)
    base, _ = _rollout()

    def make(t: float) -> list[HealthTuple]:
        out = base(t)
        if t >= 1200.0:
            lab = {"pool": "train-a", "driver_version": NEW}
            gated = {"n08"} if t >= 1260.0 else set()
            out = [(_node(x.entity, 0.0, {**lab, "tp_group": x.labels["tp_group"]}, "gate:xid", GATE_FLAGS)
                    if x.entity in gated else _node(x.entity, 0.97, x.labels)) for x in out]
        return out

    r = Run(policy=_policy())
    _drive(r, make, 0.0, 1800.0)
    assert KEY in r.state.incidents
    assert not r.of(IntentKind.QUARANTINE, "n08")
    assert r.state.entities["n08"].blocked == f"version:driver_version={NEW}"


def test_held_nodes_still_on_the_bad_driver_are_retested_under_the_hold_when_its_victims_gates_clear() -> None:
    # No rollback: the driver stays on every node, but its victims' gates clear at 1800 s (they are held and
    # idle), so the version stops correlating. Before its incident resolves, each held node still on the
    # driver is retested under the hold; the driver fails those tests: more evidence for the version (one
    # update of its incident, which stays open), the nodes stay QUARANTINED and held, none FAILED, no page
    # of their own. n04 was upgraded meanwhile (its label changed): it is retested at once and its failed
    # test takes the normal path (FAILED).
    p = _policy()
    clear_s = p.budgets.incident_clear_s
    base, _ = _rollout()
    quiet = 1800.0

    def make(t: float) -> list[HealthTuple]:
        out = []
        for x in base(t):
            lab = {**x.labels, "driver_version": NEW if x.entity in {f"n{i:02d}" for i in range(12)} else OLD}
            if x.entity == "n04" and t >= quiet:
                lab["driver_version"] = "570.1"
            out.append(_node(x.entity, 0.97, lab) if t >= quiet else _node(
                x.entity, x.value or 0.0, lab, x.reason, x.flags) if x.value is not None and x.value < 0.5
                else _node(x.entity, 0.97, lab))
        return out

    r = Run(policy=p)
    early = {660.0: [Event(660.0, "repair", "n00", passed=False, actor="agent")]}
    _drive(r, make, 0.0, quiet - 60.0, early)
    assert r.st("n00") == State.FAILED
    assert {n: r.state.entities[n].version_hold for n in ("n00", "n02", "n04")} == dict.fromkeys(
        ("n00", "n02", "n04"), KEY)
    # n04 upgraded: retested at once, not held
    _drive(r, make, quiet, quiet)
    assert r.state.entities["n04"].version_hold is None
    assert [(i.ts, i.reason) for i in r.of(IntentKind.RUN_ACTIVE_TEST, "n04") if i.ts >= quiet] == [
        (quiet, f"version_resolved:{KEY}")]
    r.step(quiet + 60.0, make(quiet + 60.0), [Event(quiet + 60.0, "active_test", "n04", passed=False, actor="agent")])
    assert r.st("n04") == State.FAILED  # its own failure now: the normal path
    # the version has not correlated since `quiet`: at quiet + clear_s its incident would resolve; the held
    # nodes still on it are retested first (n00 back to QUARANTINED for it) and the incident stays open
    _drive(r, make, quiet + 120.0, quiet + clear_s + 60.0)
    retest = quiet - 60.0 + clear_s  # last correlated at quiet - 60
    tests = {i.entity: (i.ts, i.reason) for i in r.of(IntentKind.RUN_ACTIVE_TEST) if i.ts >= retest}
    assert tests == dict.fromkeys(("n00", "n02"), (retest, f"version_retest:{KEY}"))
    back = next(t for t in r.transitions if t.entity == "n00" and t.ts >= retest)
    assert (back.from_state, back.to_state) == (State.FAILED, State.QUARANTINED)
    assert KEY in r.state.incidents
    assert all(r.state.entities[n].version_hold == KEY for n in ("n00", "n02"))
    # the driver fails both retests: the nodes stay held and QUARANTINED, the incident is updated and open
    t = retest + 120.0
    failed = {t: [Event(t, "active_test", n, passed=False, actor="agent") for n in ("n00", "n02")]}
    _drive(r, make, t, t + clear_s - 60.0, failed)
    assert [r.st(n) for n in ("n00", "n02")] == [State.QUARANTINED, State.QUARANTINED]
    assert all(r.state.entities[n].version_hold == KEY for n in ("n00", "n02"))
    assert KEY in r.state.incidents
    version_pages = [i for i in r.of(IntentKind.PAGE, f"version/driver_version={NEW}") if i.ts >= quiet]
    assert [i.params["state"] for i in version_pages] == ["update"]
    # one update per incident_update_s: the first failed retest is in it, the record has both
    assert version_pages[0].params["retest_failed"] == ["n00"]
    assert r.state.incidents[KEY]["retest_failed"] == ["n00", "n02"]
    assert not [i for i in r.of(IntentKind.PAGE) if i.entity in ("n00", "n02") and i.ts >= quiet]
    assert _version_pages(r) == _version_pages(r)[:1]  # still one page for the rollout
    # the next round backs off: 2 x incident_clear_s after the first was sent, then 4 x after the second
    _drive(r, make, t + clear_s, retest + 2 * clear_s + 4 * clear_s + 60.0,
           {retest + 2 * clear_s + 120.0: [Event(retest + 2 * clear_s + 120.0, "active_test", n, passed=False,
                                                 actor="agent") for n in ("n00", "n02")]})
    rounds = sorted({i.ts for i in r.of(IntentKind.RUN_ACTIVE_TEST) if i.reason == f"version_retest:{KEY}"})
    assert rounds == [retest, retest + 2 * clear_s, retest + 6 * clear_s]
    assert [r.st(n) for n in ("n00", "n02")] == [State.QUARANTINED, State.QUARANTINED]

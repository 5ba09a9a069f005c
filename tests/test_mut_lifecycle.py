"""The lifecycle's timers and rules at their edges (issue 21): confidence exactly at ``min_confidence``,
scores exactly at each threshold, a dwell met to the second, a drain timeout that does not fire before
``drain_timeout_s``, timers that pause on unknown data, and the diagram an operator reads."""

from __future__ import annotations

from fleethealth.decide.lifecycle import (
    RULES,
    Cond,
    Observation,
    Rule,
    Timer,
    advance_timers,
    candidate_rules,
    dwell_of,
    holding_conds,
    mermaid_diagram,
    rule_holds,
    timers_after_transition,
)
from fleethealth.decide.model import State
from fleethealth.policy import default_policy

LC = default_policy().lifecycle  # min_confidence 0.5, degraded_below 0.7, ready_above 0.85, quarantine 0.3


def obs(v: float | None, conf: float = 1.0, gate: bool = False, drain_reset: bool = False) -> Observation:
    return Observation(v, conf, "r", gate=gate, drain_reset=drain_reset)


def test_confidence_exactly_at_min_confidence_is_usable() -> None:
    assert LC.min_confidence == 0.5
    assert obs(0.1, 0.5).usable(LC)
    assert not obs(0.1, 0.4999).usable(LC)
    assert not obs(None, 1.0).usable(LC)
    # and so its conditions hold (below quarantine), while just under it nothing holds at all
    assert Cond.BELOW_QUARANTINE in holding_conds(obs(0.1, 0.5), LC)
    assert holding_conds(obs(0.1, 0.4999, gate=True), LC) == set()
    assert holding_conds(None, LC) == set()


def test_conditions_exactly_at_each_threshold() -> None:
    # 0.3 is not below quarantine_below 0.3 but is below degraded_below
    assert holding_conds(obs(0.3), LC) == {Cond.BELOW_DEGRADED, Cond.DRAIN_TIMEOUT}
    assert holding_conds(obs(0.2999), LC) == {Cond.BELOW_QUARANTINE, Cond.BELOW_DEGRADED, Cond.DRAIN_TIMEOUT}
    # 0.7 is not below degraded_below, and warming is done at (not only above) it
    assert holding_conds(obs(0.7), LC) == {Cond.WARM_OK, Cond.DRAIN_TIMEOUT}
    # 0.85 is not above ready_above; 0.9 is not above recovering_ok_above
    assert holding_conds(obs(0.85), LC) == {Cond.WARM_OK, Cond.DRAIN_TIMEOUT}
    assert holding_conds(obs(0.9), LC) == {Cond.WARM_OK, Cond.ABOVE_READY, Cond.DRAIN_TIMEOUT}
    assert holding_conds(obs(0.9001), LC) == {Cond.WARM_OK, Cond.ABOVE_READY, Cond.RECOVERING_OK,
                                              Cond.DRAIN_TIMEOUT}
    assert holding_conds(obs(1.0, gate=True, drain_reset=True), LC) == {
        Cond.WARM_OK, Cond.ABOVE_READY, Cond.RECOVERING_OK, Cond.HARD_GATE, Cond.DRAIN_RESET, Cond.DRAIN_TIMEOUT}


def test_timers_accumulate_pause_on_unknown_and_reset_when_the_condition_ends() -> None:
    timers: dict[str, Timer] = {}
    advance_timers(timers, obs(0.5), 100.0, LC, State.READY)
    assert {k: (t.accum_s, t.last_ts) for k, t in timers.items()} == {"below_degraded": (0.0, 100.0)}
    advance_timers(timers, obs(0.5), 115.0, LC, State.READY)
    assert (timers["below_degraded"].accum_s, timers["below_degraded"].last_ts) == (15.0, 115.0)
    # unknown data (confidence under the floor) pauses: nothing accrues over the gap
    advance_timers(timers, obs(0.5, 0.1), 130.0, LC, State.READY)
    assert (timers["below_degraded"].accum_s, timers["below_degraded"].last_ts) == (15.0, None)
    advance_timers(timers, obs(None), 200.0, LC, State.READY)
    assert timers["below_degraded"].last_ts is None
    advance_timers(timers, obs(0.5), 300.0, LC, State.READY)
    assert (timers["below_degraded"].accum_s, timers["below_degraded"].last_ts) == (15.0, 300.0)
    advance_timers(timers, obs(0.5), 310.0, LC, State.READY)
    assert timers["below_degraded"].accum_s == 25.0
    # the same time again (a repeated cycle) adds nothing
    advance_timers(timers, obs(0.5), 310.0, LC, State.READY)
    assert timers["below_degraded"].accum_s == 25.0
    # dipping below quarantine starts that timer too; a good reading ends both
    advance_timers(timers, obs(0.2), 320.0, LC, State.READY)
    assert set(timers) == {"below_degraded", "below_quarantine"}
    assert timers["below_quarantine"].accum_s == 0.0 and timers["below_degraded"].accum_s == 35.0
    advance_timers(timers, obs(0.95), 330.0, LC, State.READY)
    assert timers == {}


def test_only_the_states_own_conditions_are_timed() -> None:
    # READY times neither above_ready nor warm_ok; a DEGRADED timer left over is dropped in READY
    timers = {"above_ready": Timer(50.0, 10.0), "custom": Timer(1.0, 1.0)}
    advance_timers(timers, obs(0.95), 20.0, LC, State.READY)
    assert set(timers) == {"custom"}  # non-signal timers are not the lifecycle's to drop
    timers2 = {"above_ready": Timer(50.0, 10.0)}
    advance_timers(timers2, None, 20.0, LC, State.READY)  # dropped even on no observation
    assert timers2 == {}
    t3: dict[str, Timer] = {}
    advance_timers(t3, obs(0.95), 20.0, LC, State.DEGRADED)
    assert set(t3) == {"above_ready"}
    t4: dict[str, Timer] = {}
    advance_timers(t4, obs(0.95), 20.0, LC, State.RECOVERING)
    assert set(t4) == {"recovering_ok"}
    t5: dict[str, Timer] = {}
    advance_timers(t5, obs(0.75), 20.0, LC, State.WARMING)
    assert set(t5) == {"warm_ok"}


def test_only_the_slide_to_degraded_keeps_the_worsening_timers() -> None:
    timers = {"below_degraded": Timer(120.0, 5.0), "below_quarantine": Timer(60.0, 5.0),
              "above_ready": Timer(1.0, 5.0), "custom": Timer(1.0, 5.0)}
    kept = timers_after_transition(timers, State.READY, State.DEGRADED)
    assert set(kept) == {"below_degraded", "below_quarantine"}
    assert kept["below_quarantine"].accum_s == 60.0
    assert timers_after_transition(timers, State.READY, State.QUARANTINED) == {}
    assert timers_after_transition(timers, State.DEGRADED, State.READY) == {}
    assert timers_after_transition(timers, State.RECOVERING, State.DEGRADED) == {}


def test_a_dwell_met_to_the_second() -> None:
    rule = next(r for r in RULES if r.src == State.READY and r.cond == Cond.BELOW_DEGRADED)
    assert dwell_of(rule, LC) == 120.0
    conds = {Cond.BELOW_DEGRADED}
    assert rule_holds(rule, conds, {"below_degraded": Timer(120.0, 0.0)}, 0.0, LC)
    assert not rule_holds(rule, conds, {"below_degraded": Timer(119.99, 0.0)}, 10_000.0, LC)
    assert not rule_holds(rule, conds, {}, 10_000.0, LC)  # no timer: never held
    assert not rule_holds(rule, set(), {"below_degraded": Timer(500.0, 0.0)}, 0.0, LC)  # not holding now
    gate = next(r for r in RULES if r.src == State.READY and r.cond == Cond.HARD_GATE)
    assert dwell_of(gate, LC) == 0.0
    assert rule_holds(gate, {Cond.HARD_GATE}, {}, 0.0, LC)


def test_drain_timeout_does_not_fire_before_drain_timeout_s() -> None:
    rule = next(r for r in RULES if r.src == State.DRAINING and r.cond == Cond.DRAIN_TIMEOUT)
    assert (rule.dst, dwell_of(rule, LC)) == (State.QUARANTINED, 900.0)
    usable = holding_conds(obs(0.95), LC)
    assert not rule_holds(rule, usable, {}, 899.9, LC)
    assert rule_holds(rule, usable, {}, 900.0, LC)
    # on unknown data it does not fire, however long the drain took
    assert not rule_holds(rule, holding_conds(obs(0.95, 0.1), LC), {}, 10_000.0, LC)
    assert [r.dst for r in candidate_rules(State.DRAINING, usable, {}, 899.0, LC)] == []
    assert [r.dst for r in candidate_rules(State.DRAINING, usable, {}, 900.0, LC)] == [State.QUARANTINED]


def test_candidate_rules_in_table_order() -> None:
    conds = holding_conds(obs(0.1, gate=True, drain_reset=True), LC)
    timers = {"below_quarantine": Timer(300.0, 0.0), "below_degraded": Timer(300.0, 0.0)}
    got = candidate_rules(State.READY, conds, timers, 0.0, LC)
    assert [(r.cond, r.dst) for r in got] == [
        (Cond.DRAIN_RESET, State.DRAINING), (Cond.HARD_GATE, State.QUARANTINED),
        (Cond.BELOW_QUARANTINE, State.QUARANTINED), (Cond.BELOW_DEGRADED, State.DEGRADED)]
    # event conditions fire without a dwell
    assert [r.dst for r in candidate_rules(State.QUARANTINED, {Cond.TEST_PASSED}, {}, 0.0, LC)] == [
        State.RECOVERING]


def test_timer_round_trips_through_the_store() -> None:
    assert Timer(12.5, 100.0).to_dict() == {"accum_s": 12.5, "last_ts": 100.0}
    assert Timer.from_dict({"accum_s": 12.5, "last_ts": 100.0}) == Timer(12.5, 100.0)
    assert Timer.from_dict({"accum_s": "3", "last_ts": None}) == Timer(3.0, None)
    assert Timer.from_dict({"accum_s": 3}) == Timer(3.0, None)
    assert Timer() == Timer(0.0, None)


def test_the_diagram_with_and_without_the_policys_numbers() -> None:
    d = mermaid_diagram(LC).splitlines()
    assert d[:3] == ["stateDiagram-v2", "    [*] --> READY: node", "    [*] --> STARTING: replica"]
    assert "    STARTING --> QUARANTINED: hard gate, fatal before serving" in d
    assert "    WARMING --> READY: score at least 0.7 for 60s" in d
    assert "    READY --> QUARANTINED: score below 0.3 for 300s" in d
    assert "    DEGRADED --> READY: score above 0.85 for 600s" in d
    assert "    DRAINING --> QUARANTINED: drain timeout 900s" in d
    assert "    DRAINING --> QUARANTINED: reset failed" in d
    assert "    RECOVERING --> QUARANTINED: score below 0.7 for 120s, relapse" in d
    assert len(d) == 3 + len(RULES)
    assert "    FAILED --> QUARANTINED: human quarantine, human" in d
    assert mermaid_diagram(LC).endswith("version cleared, its version incident resolved, retest\n")
    plain = mermaid_diagram().splitlines()
    assert "    READY --> DEGRADED: score below degraded_below for degraded_dwell_s" in plain
    assert "    DRAINING --> QUARANTINED: drain timeout" in plain
    one = mermaid_diagram(LC, [Rule(State.READY, Cond.HUMAN_QUARANTINE, State.QUARANTINED)])
    assert one.splitlines()[3:] == ["    READY --> QUARANTINED: human quarantine"]

"""The decider's intents as the actuators, the audit log and a person read them (issue 21: the decider's
sampled survivors were intents whose params, tier or reason no test read): the evidence captured before a
quarantine or drain, the quarantine and the scheduler hold with the value that caused them, the ledger's
budget of a node without a pool, the page of a node that failed its test, and the release; the decider's own
resets and entry test when no repair ladder takes over, the flag at its edge, the router's canary ramp and
unknown drain, the budget's order (worst first), a human release without telemetry."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import Intent, IntentKind, State, Tier
from fleethealth.decide.state import DecisionState, Event
from fleethealth.policy import Policy, default_policy


def _said(r: Run, entity: str) -> list[tuple[float, str, str, dict, Tier | None]]:
    return [(i.ts, i.kind.value, i.reason, {k: v for k, v in i.params.items() if k != "n"}, i.tier)
            for i in r.intents if i.entity == entity]


def test_a_quarantine_by_dwell_says_what_it_saw_and_when_and_the_release_says_why() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
    r.steps(75, 600, 15, lambda t: [tup("n1", 0.1, worst="hardware")])
    assert _said(r, "n1") == [
        (195, "no_new_work", "state:DEGRADED", {"value": 0.1, "confidence": 1.0}, Tier.NODE),
        (375, "capture_evidence", "min:hardware", {"window_s": 300.0, "before": "quarantine", "from": "DEGRADED",
                                                   "value": 0.1}, Tier.NODE),
        (375, "quarantine", "min:hardware", {"from": "DEGRADED", "value": 0.1}, Tier.NODE),
        (375, "run_active_test", "min:hardware", {"tests": ["dcgm_diag_r2", "nccl_bandwidth"]}, Tier.NODE),
    ]
    (q,) = [t for t in r.transitions if t.to_state == State.QUARANTINED]
    assert (q.value, q.confidence, q.from_state) == (0.1, 1.0, State.DEGRADED)
    # a node without a pool spends the default pool's budget
    assert [(k, e) for _, k, e in r.state.ledger] == [("node:default", "n1")]
    n = len(r.intents)
    r.step(615, [tup("n1", 0.1, worst="hardware")], [Event(610, "active_test", "n1", passed=True)])
    (rel,) = [i for i in r.intents[n:] if i.kind == IntentKind.RELEASE]
    assert (rel.reason, {k: v for k, v in rel.params.items() if k != "n"}) == (
        "event:test_passed", {"canary": True, "from": "QUARANTINED", "value": 0.1})


def test_a_node_back_in_service_is_allowed_new_work_because_it_is_ready() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
    r.steps(75, 390, 15, lambda t: [tup("n1", 0.1, worst="hardware")])
    r.step(405, [tup("n1", 0.95)], [Event(400, "active_test", "n1", passed=True)])
    r.steps(420, 420 + 2 * r.policy.lifecycle.recovering_dwell_s + 600, 15, lambda t: [tup("n1", 0.95)])
    assert r.st("n1") == State.READY
    (allow,) = r.of(IntentKind.ALLOW_NEW_WORK, "n1")
    assert (allow.reason, allow.params["value"], allow.tier) == ("ready", 0.95, Tier.NODE)


def test_a_drain_and_reset_drains_the_node_after_capturing_its_evidence() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n2", 0.95)])
    r.step(75, [tup("n2", 0.0, reason="gate:recovery_action", flags=("recovery_action:DRAIN_AND_RESET",),
                    worst="hardware")])
    said = _said(r, "n2")
    assert said[1:3] == [
        (75, "capture_evidence", "gate:recovery_action", {"window_s": 300.0, "before": "drain", "from": "READY",
                                                          "value": 0.0}, Tier.NODE),
        (75, "drain", "gate:recovery_action", {"scope": "all", "from": "READY", "value": 0.0}, Tier.NODE),
    ]


def test_a_node_that_fails_its_test_pages_a_person_with_its_state() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n4", 0.95)])
    r.steps(75, 200, 15, lambda t: [tup("n4", 0.0, reason="gate:xid", worst="hardware")])
    r.step(215, [tup("n4", 0.0, reason="gate:xid", worst="hardware")], [Event(210, "active_test", "n4", passed=False)])
    (page,) = r.of(IntentKind.PAGE, "n4")
    assert (page.ts, page.reason) == (215, "event:test_failed")
    assert {k: v for k, v in page.params.items() if k != "n"} == {
        "severity": "page", "state": "FAILED", "recoveries": 0, "from": "QUARANTINED", "value": 0.0}
    assert r.st("n4") == State.FAILED


def _no_ladders() -> Policy:
    """The default policy with repair ladders off: the decider's own reset and entry test apply."""
    p = default_policy()
    return p.model_copy(update={"remediation": p.remediation.model_copy(update={"enabled": False})})


def _recovery_gate(r: Run, entity: str, flag: str) -> None:
    r.steps(0, 60, 15, lambda t: [tup(entity, 0.95)])
    r.step(75, [tup(entity, 0.0, reason="gate:recovery_action", flags=(flag,), worst="hardware")])


def test_without_a_ladder_a_drain_and_reset_schedules_the_reset_after_the_drain() -> None:
    r = Run(policy=_no_ladders())
    _recovery_gate(r, "n2", "recovery_action:DRAIN_AND_RESET")
    assert r.st("n2") == State.DRAINING
    assert _said(r, "n2")[2:] == [
        (75, "drain", "gate:recovery_action", {"scope": "all", "from": "READY", "value": 0.0}, Tier.NODE),
        (75, "schedule_reset", "gate:recovery_action", {"action": "GPU_RESET", "when": "after_drain", "drain": True},
         Tier.NODE),
    ]
    # a peer-to-peer drain drains only the p2p jobs, then resets the same way
    r2 = Run(policy=_no_ladders())
    _recovery_gate(r2, "n5", "recovery_action:DRAIN_P2P")
    assert [(k, p.get("scope"), p.get("when")) for _, k, _, p, _ in _said(r2, "n5")[2:]] == [
        ("drain", "p2p", None), ("schedule_reset", None, "after_drain")]


def test_without_a_ladder_a_gpu_reset_or_reboot_is_scheduled_now_then_the_entry_test() -> None:
    for flag, action in (("recovery_action:GPU_RESET", "GPU_RESET"), ("recovery_action:NODE_REBOOT", "NODE_REBOOT")):
        r = Run(policy=_no_ladders())
        _recovery_gate(r, "n3", flag)
        assert r.st("n3") == State.QUARANTINED
        assert _said(r, "n3")[2:] == [
            (75, "quarantine", "gate:recovery_action", {"from": "READY", "value": 0.0}, Tier.NODE),
            (75, "schedule_reset", flag, {"action": action, "when": "now"}, Tier.NODE),
            (75, "run_active_test", "gate:recovery_action", {"tests": ["dcgm_diag_r2", "nccl_bandwidth"]},
             Tier.NODE),
        ]


def test_recoveries_older_than_the_recovery_window_are_forgotten_at_the_next_release() -> None:
    """The page of a node that fails its test counts the recoveries within ``recovery_window_s``; one
    exactly a window old no longer counts."""
    base = default_policy()
    window = 1000.0
    pol = base.model_copy(update={
        "lifecycle": base.lifecycle.model_copy(update={"recovery_window_s": window}),
        "recurring": base.recurring.model_copy(update={"max_episodes": 10}),
    })

    def page_after_two_releases(gap: float) -> Intent:
        r = Run(policy=pol)
        r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
        bad = [tup("n1", 0.0, reason="gate:xid", worst="hardware")]
        r.step(75, bad)
        r.step(90, [tup("n1", 0.95)], [Event(85, "active_test", "n1", passed=True)])
        t2 = 90 + gap
        r.step(t2 - 15, bad)
        r.step(t2, [tup("n1", 0.95)], [Event(t2 - 5, "active_test", "n1", passed=True)])
        r.step(t2 + 15, bad)
        r.step(t2 + 30, bad, [Event(t2 + 25, "active_test", "n1", passed=False)])
        assert r.st("n1") == State.FAILED
        (page,) = r.of(IntentKind.PAGE, "n1")
        assert page.reason == "event:test_failed"
        return page

    assert page_after_two_releases(window - 15).params["recoveries"] == 2
    assert page_after_two_releases(window).params["recoveries"] == 1


def test_a_ready_node_exactly_at_flag_below_is_not_flagged_just_under_it_is_after_the_dwell() -> None:
    lc = default_policy().lifecycle
    for value, flagged in ((lc.flag_below, False), (lc.flag_below - 0.01, True)):
        r = Run()
        r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
        for ts in range(75, 301, 15):
            r.step(ts, [tup("n1", value)])
        r.steps(315, 600, 15, lambda t: [tup("n1", 0.95)])
        conds = [(i.ts, i.reason, i.params["status"], i.params["value"]) for i in r.of(IntentKind.SET_CONDITION, "n1")]
        if not flagged:
            assert conds == []
        else:
            # raised once degraded_dwell_s has passed below, cleared degraded_dwell_s after it is back
            assert conds == [(75 + lc.degraded_dwell_s, "min:performance", True, value),
                             (315 + lc.degraded_dwell_s, "recovered", False, 0.95)]
        assert r.st("n1") == State.READY


def test_a_released_replica_ramps_its_weight_over_the_recovering_dwell_then_drains_when_unknown() -> None:
    """RECOVERING: weight = score x (time since the release / recovering_dwell_s), at least a tenth
    (reason ``canary``); its serving tuple then goes unknown: the weight is held for ``hold_s`` after the
    last usable tuple, then stepped down by ``drain_step`` a cycle to ``min_weight`` (``unknown:drain``)."""
    base = default_policy()
    pol = base.model_copy(update={"router": base.router.model_copy(update={"min_weight": 0.15})})
    lc, rt = pol.lifecycle, pol.router
    r = Run(policy=pol)
    r.steps(0, 90, 15, lambda t: [tup("r1", 0.95, kind="replica")])
    r.step(105, [tup("r1", 0.0, kind="replica", reason="gate:xid", worst="hardware")])
    r.step(120, [tup("r1", 0.8, kind="replica")], [Event(115, "active_test", "r1", passed=True)])
    assert r.st("r1") == State.RECOVERING
    half = 120 + lc.recovering_dwell_s / 2
    r.steps(135, half, 15, lambda t: [tup("r1", 0.8, kind="replica")])
    ramp = [(i.ts, i.reason, i.params["weight"]) for i in r.of(IntentKind.SET_WEIGHT, "r1") if i.ts >= 120]
    assert ramp[0] == (120, "canary", 0.08)  # a tenth of 0.8 at the release
    assert ramp[-1] == (half, "canary", 0.4)  # half of 0.8 half-way through the dwell
    assert all(why == "canary" for _, why, _ in ramp)
    assert [w for _, _, w in ramp] == sorted({w for _, _, w in ramp})
    n = len(r.intents)
    r.steps(half + 15, half + 600, 15, lambda t: [tup("r1", None, kind="replica")])
    drained = [(i.ts, i.reason, i.params["weight"]) for i in r.intents[n:] if i.kind == IntentKind.SET_WEIGHT]
    first = half + rt.hold_s + 15  # the first cycle more than hold_s after the last usable tuple
    assert drained == [(first, "unknown:drain", 0.3), (first + 15, "unknown:drain", 0.2),
                       (first + 30, "unknown:drain", 0.15)]


def test_the_flag_is_published_as_the_health_flagged_condition() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
    r.steps(75, 200, 15, lambda t: [tup("n1", 0.8)])
    (cond,) = r.of(IntentKind.SET_CONDITION, "n1")
    assert (cond.params["condition"], cond.params["status"], cond.params["value"]) == ("HealthFlagged", True, 0.8)


def test_a_human_release_of_a_node_without_telemetry_says_so() -> None:
    """Two events in one cycle (a human's release of n1, a reset result for n2); n1 has no tuple any more:
    its transition and RELEASE carry no value, confidence 0, and the actor."""
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n1", 0.95), tup("n2", 0.95)])
    r.step(75, [tup("n1", 0.0, reason="gate:xid", worst="hardware"), tup("n2", 0.95)])
    r.step(90, [tup("n2", 0.95)], [Event(85, "ack", "n1", to="READY", actor="alice"),
                                   Event(80, "reset", "n2", passed=True)])
    assert r.st("n1") == State.READY
    last = r.transitions[-1]
    assert (last.ts, last.entity, last.from_state, last.reason, last.value, last.confidence) == (
        90, "n1", State.QUARANTINED, "event:human_ready:alice", None, 0.0)
    (rel,) = r.of(IntentKind.RELEASE, "n1")
    assert (rel.ts, rel.reason, {k: v for k, v in rel.params.items() if k != "n"}, rel.tier) == (
        90, "event:human_ready:alice", {"canary": False, "from": "QUARANTINED", "value": None}, Tier.NODE)


def test_the_worst_node_gets_the_last_quarantine_of_the_budget() -> None:
    """Two nodes past their quarantine dwell in the same cycle, room for one: the lower score goes first,
    whatever the names; the other is held (the budget's page and a soft hold)."""
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n1", 0.95), tup("n2", 0.95), tup("n3", 0.95)])
    r.steps(75, 600, 15, lambda t: [tup("n1", 0.2), tup("n2", 0.1), tup("n3", 0.95)])
    assert (r.st("n1"), r.st("n2")) == (State.DEGRADED, State.QUARANTINED)
    assert [(t.ts, t.entity, t.to_state) for t in r.transitions] == [
        (195, "n2", State.DEGRADED), (195, "n1", State.DEGRADED), (375, "n2", State.QUARANTINED)]
    (held,) = [i for i in r.intents if i.soft and i.entity == "n1"]
    assert (held.ts, held.kind, held.reason) == (375, IntentKind.NO_NEW_WORK, "held:budget:default")


def test_a_node_that_joins_later_is_tracked_with_its_labels() -> None:
    r = Run()
    n1 = tup("n1", 0.95, labels={"pool": "p"})  # the same tuple every cycle, as a columnar view reuses it
    r.steps(0, 30, 15, lambda t: [n1])
    r.steps(45, 60, 15, lambda t: [n1, tup("n2", 0.95, labels={"pool": "p"})])
    assert sorted(r.state.entities) == ["n1", "n2"]
    assert r.state.entities["n2"].labels == {"pool": "p"}


def test_the_router_weighs_a_replica_by_its_serving_tuple() -> None:
    d = Decider()
    s = DecisionState()
    weights = []
    for ts in range(0, 120, 15):
        dec = d.decide(s, [tup("r1", 0.95, kind="replica")], ts, serving=[tup("r1", 0.6, kind="replica")])
        s = dec.state
        weights += [(i.ts, i.reason, i.params["weight"]) for i in dec.intents if i.kind == IntentKind.SET_WEIGHT]
    assert weights == [(0, "state:WARMING", 0.0), (60, "score", 0.6)]


def test_a_steady_replica_follows_its_score_and_drains_when_its_confidence_drops() -> None:
    r = Run()
    r.steps(0, 90, 15, lambda t: [tup("r1", 1.0, kind="replica")])
    r.steps(105, 150, 15, lambda t: [tup("r1", 0.95, kind="replica")])
    assert r.state.entities["r1"].last_value == 0.95
    # the confidence drops under min_confidence: held for hold_s after the last usable tuple, then drained
    r.steps(165, 300, 15, lambda t: [tup("r1", 0.95, conf=0.3, kind="replica")])
    hold_s = default_policy().router.hold_s
    assert [(i.ts, i.reason, i.params["weight"]) for i in r.of(IntentKind.SET_WEIGHT, "r1")] == [
        (0, "state:WARMING", 0.0), (60, "score", 1.0), (105, "score", 0.95),
        (150 + hold_s + 15, "unknown:drain", 0.85), (150 + hold_s + 30, "unknown:drain", 0.75)]


def test_a_healthy_node_remembers_its_latest_value() -> None:
    """What `explain` shows as the last observation follows the score even while nothing else changes."""
    r = Run()
    for ts in range(0, 91, 15):
        r.step(ts, [tup("n1", 0.95 + ts / 10000)])
        es = r.state.entities["n1"]
        assert (es.last_value, es.last_known_ts) == (0.95 + ts / 10000, ts)


def test_a_counter_at_its_floor_quarantines_on_the_fast_path_whether_the_node_or_a_gpu_says_so() -> None:
    dwell = default_policy().lifecycle.floor_dwell_s
    assert dwell is not None
    floor = ("floor:DCGM_FI_DEV_PCIE_REPLAY_COUNTER",)
    for on_gpu in (False, True):
        r = Run()
        r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
        for ts in range(75, 301, 15):
            if on_gpu:
                r.step(ts, [tup("n1", 0.0, worst="errors"),
                            tup("n1/gpu0", 0.0, kind="gpu", flags=floor, worst="errors", labels={"node": "n1"})])
            else:
                r.step(ts, [tup("n1", 0.0, flags=floor, worst="errors")])
        assert [(t.ts, t.to_state, t.detail) for t in r.transitions] == [
            (75 + dwell, State.QUARANTINED, f"at_floor dwell {dwell:g}s")]


def test_a_gpus_drain_and_reset_flag_drains_its_node_and_resets_that_gpu() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n1", 0.95)])
    r.step(75, [tup("n1", 0.0, reason="gate:recovery_action", worst="hardware"),
                tup("n1/gpu3", 0.0, reason="gate:recovery_action", kind="gpu", flags=("recovery_action:DRAIN_AND_RESET",),
                    worst="hardware", labels={"node": "n1"})])
    assert r.st("n1") == State.DRAINING
    (reset,) = r.of(IntentKind.SCHEDULE_RESET, "n1")
    assert (reset.params["when"], reset.params["gpus"]) == ("after_drain", ["n1/gpu3"])


def test_a_steady_node_keeps_the_time_it_became_steady_in_both_deciders() -> None:
    """``last_known_ts`` of a healthy node whose tuple does not change is when it became so (what the state
    store keeps and `explain` shows), in the fast decider and the plain one alike; a changed score or a
    flag moves it."""
    for fast in (True, False):
        r = Run()
        r.decider = Decider(r.policy, fast=fast)
        for ts in range(0, 91, 15):
            r.step(ts, [tup("n1", 0.95), tup("n2", 0.95)])
        assert [r.state.entities[n].last_known_ts for n in ("n1", "n2")] == [0, 0]
        r.step(105, [tup("n1", 0.96), tup("n2", 0.95)])
        assert [r.state.entities[n].last_known_ts for n in ("n1", "n2")] == [105, 0]


def test_a_draining_node_under_a_repair_ladder_waits_for_the_ladders_timeout_not_the_drain_timeout() -> None:
    lc = default_policy().lifecycle
    r = Run()
    r.steps(0, 60, 15, lambda t: [tup("n2", 0.95)])
    r.steps(75, 75 + lc.drain_timeout_s + 300, 15, lambda t: [
        tup("n2", 0.0, reason="gate:recovery_action", flags=("recovery_action:DRAIN_AND_RESET",), worst="hardware")])
    assert [(t.ts, t.to_state) for t in r.transitions] == [(75, State.DRAINING)]
    resets = r.of(IntentKind.SCHEDULE_RESET, "n2")
    # the ladder's first step timed out after its own 900 s (the next cycle after): its next step
    assert [(i.ts, i.reason, i.params["step"]) for i in resets] == [(75, "repair:reset-class", 0),
                                                                 (990, "repair:reset-class", 1)]


def test_the_functional_entry_point_answers_as_a_decider() -> None:
    from fleethealth.decide.decider import decide

    pol = default_policy()
    s = DecisionState()
    weights = []
    for ts in range(0, 120, 15):
        dec = decide(s, [tup("r1", 0.95, kind="replica")], ts, (), pol, serving=[tup("r1", 0.6, kind="replica")])
        s = dec.state
        weights += [(i.ts, i.params["weight"], i.policy_version) for i in dec.intents
                    if i.kind == IntentKind.SET_WEIGHT]
    assert weights == [(0, 0.0, pol.version_tag), (60, 0.6, pol.version_tag)]

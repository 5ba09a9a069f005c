"""The decider's intents as the actuators, the audit log and a person read them (issue 21: the decider's
sampled survivors were intents whose params, tier or reason no test read): the evidence captured before a
quarantine or drain, the quarantine and the scheduler hold with the value that caused them, the ledger's
budget of a node without a pool, the page of a node that failed its test, and the release."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import Intent, IntentKind, State, Tier
from fleethealth.decide.state import Event
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

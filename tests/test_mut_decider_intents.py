"""The decider's intents as the actuators, the audit log and a person read them (issue 21: the decider's
sampled survivors were intents whose params, tier or reason no test read): the evidence captured before a
quarantine or drain, the quarantine and the scheduler hold with the value that caused them, the ledger's
budget of a node without a pool, the page of a node that failed its test, and the release."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State, Tier
from fleethealth.decide.state import Event


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

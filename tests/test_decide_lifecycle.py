"""Lifecycle state machine on hand-made tuples: hysteresis, dwell, gates, the active-test exit, FAILED."""

from __future__ import annotations

import json

from decide_support import Run, tup
from fleethealth.decide.decider import REMEDIATION_KINDS, Decider
from fleethealth.decide.lifecycle import RULES, mermaid_diagram
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import DecisionState, Event
from fleethealth.policy import default_policy

LC = default_policy().lifecycle


def test_defaults_are_the_seeds_numbers() -> None:
    assert (LC.flag_below, LC.degraded_below, LC.ready_above, LC.quarantine_below) == (0.9, 0.7, 0.85, 0.3)
    assert LC.ready_dwell_s > LC.degraded_dwell_s


def test_node_at_082_stays_ready_but_flagged() -> None:
    r = Run()
    r.steps(0, 3600, 15, lambda t: [tup("node-37", 0.82)])
    assert r.st("node-37") == State.READY
    assert r.state.entities["node-37"].flagged
    assert r.transitions == []
    cond = r.of(IntentKind.SET_CONDITION, "node-37")
    assert len(cond) == 1 and cond[0].params["status"] is True
    assert not [i for i in r.intents if i.kind in REMEDIATION_KINDS]


def test_degraded_only_after_dwell_and_back_only_above_stricter_threshold_for_longer() -> None:
    r = Run()
    r.steps(0, 105, 15, lambda t: [tup("n1", 0.6)])
    assert r.st("n1") == State.READY  # 105 s < degraded_dwell_s
    r.step(120, [tup("n1", 0.6)])
    assert r.st("n1") == State.DEGRADED
    assert r.of(IntentKind.NO_NEW_WORK, "n1")
    # 0.8 is above the entry threshold but below the exit one: stays DEGRADED however long
    r.steps(135, 2000, 15, lambda t: [tup("n1", 0.8)])
    assert r.st("n1") == State.DEGRADED
    # above 0.85: back to READY after ready_dwell_s (600 s), not before
    r.steps(2015, 2015 + 585, 15, lambda t: [tup("n1", 0.9)])
    assert r.st("n1") == State.DEGRADED
    r.step(2015 + 600, [tup("n1", 0.9)])
    assert r.st("n1") == State.READY
    assert r.of(IntentKind.ALLOW_NEW_WORK, "n1")
    assert [t.to_state for t in r.transitions] == [State.DEGRADED, State.READY]
    tr = r.transitions[0]
    assert tr.value == 0.6 and tr.confidence == 1.0 and tr.reason == "min:performance"
    assert tr.policy_version == default_policy().version_tag
    assert r.state.entities["n1"].transitions == 2
    assert r.state.transition_counts() == {"n1": 2}


def test_a_dip_shorter_than_the_dwell_resets_the_timer() -> None:
    r = Run()
    for t in range(0, 3600, 15):
        r.step(t, [tup("n1", 0.6 if (t // 60) % 2 == 0 else 0.95)])  # 60 s bad, 60 s good
    assert r.st("n1") == State.READY and r.transitions == []


def test_hard_gate_quarantines_at_once_with_evidence_first_and_an_active_test() -> None:
    r = Run()
    r.step(0, [tup("n1", 1.0)])
    tr, intents = r.step(15, [tup("n1", 0.0, reason="gate:xid", worst="hardware")])
    assert [t.to_state for t in tr] == [State.QUARANTINED]
    kinds = [i.kind for i in intents]
    assert kinds.index(IntentKind.CAPTURE_EVIDENCE) < kinds.index(IntentKind.QUARANTINE)
    assert IntentKind.RUN_ACTIVE_TEST in kinds
    test = r.of(IntentKind.RUN_ACTIVE_TEST)[0]
    assert test.params["tests"] == ["dcgm_diag_r2", "nccl_bandwidth"]
    assert r.of(IntentKind.QUARANTINE)[0].tier == "node"


def test_seed_slide_quarantined_quarantine_dwell_after_falling_below_03() -> None:
    r = Run()
    r.steps(0, 285, 15, lambda t: [tup("n1", 0.0)])
    assert r.st("n1") == State.DEGRADED  # at 120 s
    r.step(300, [tup("n1", 0.0)])
    assert r.st("n1") == State.QUARANTINED
    assert [t.ts for t in r.transitions] == [120, 300]


def test_only_a_passed_active_test_leaves_quarantine_then_recovering_then_ready() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.0, reason="gate:xid")])
    r.steps(15, 20000, 15, lambda t: [tup("n1", 1.0)])
    assert r.st("n1") == State.QUARANTINED  # healthy passive telemetry is not enough
    r.step(20015, [tup("n1", 1.0)], [Event(20010, "active_test", "n1", passed=True)])
    assert r.st("n1") == State.RECOVERING
    assert r.of(IntentKind.RELEASE, "n1")
    r.steps(20030, 20015 + 1785, 15, lambda t: [tup("n1", 0.95)])
    assert r.st("n1") == State.RECOVERING
    r.step(20015 + 1800, [tup("n1", 0.95)])
    assert r.st("n1") == State.READY
    assert r.of(IntentKind.ALLOW_NEW_WORK, "n1")


def test_failed_test_means_failed_and_a_page_and_only_a_human_gets_it_out() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.0, reason="gate:xid")])
    r.step(15, [tup("n1", 1.0)], [Event(10, "active_test", "n1", passed=False)])
    assert r.st("n1") == State.FAILED
    assert r.of(IntentKind.PAGE, "n1")
    r.steps(30, 30000, 60, lambda t: [tup("n1", 1.0)])
    assert r.st("n1") == State.FAILED
    r.step(30015, [tup("n1", 1.0)], [Event(30010, "active_test", "n1", passed=True)])
    assert r.st("n1") == State.FAILED  # a test result is not a human
    r.step(30030, [tup("n1", 1.0)], [Event(30020, "ack", "n1", to="QUARANTINED", actor="alice")])
    assert r.st("n1") == State.QUARANTINED
    assert r.transitions[-1].reason == "event:human_quarantine:alice"
    assert len(r.of(IntentKind.RUN_ACTIVE_TEST, "n1")) == 2


def test_too_many_recoveries_end_in_failed() -> None:
    # the same gate four times would be a recurring fault (tests/test_decide_recurring.py) at the third
    p = default_policy()
    r = Run(policy=p.model_copy(update={"recurring": p.recurring.model_copy(update={"max_episodes": 0})}))
    t = 0.0
    for _ in range(LC.max_recoveries):
        r.step(t, [tup("n1", 0.0, reason="gate:xid")])
        assert r.st("n1") == State.QUARANTINED
        r.step(t + 15, [tup("n1", 1.0)], [Event(t + 10, "active_test", "n1", passed=True)])
        assert r.st("n1") == State.RECOVERING
        t += 3600
    r.step(t, [tup("n1", 0.0, reason="gate:xid")])
    r.step(t + 15, [tup("n1", 1.0)], [Event(t + 10, "active_test", "n1", passed=True)])
    assert r.st("n1") == State.FAILED
    assert r.transitions[-1].detail.startswith("too_many_recoveries")


def test_relapse_while_recovering_goes_back_to_quarantine() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.0, reason="gate:xid")])
    r.step(15, [tup("n1", 1.0)], [Event(10, "active_test", "n1", passed=True)])
    r.steps(30, 30 + 120, 15, lambda t: [tup("n1", 0.5)])
    assert r.st("n1") == State.QUARANTINED
    assert len(r.of(IntentKind.RUN_ACTIVE_TEST, "n1")) == 2


def test_unknown_never_moves_to_a_worse_state_and_pauses_timers() -> None:
    r = Run()
    r.steps(0, 105, 15, lambda t: [tup("n1", 0.6)])  # 105 s of the 120 s dwell
    r.steps(120, 5000, 15, lambda t: [tup("n1", None, conf=0.0)])
    assert r.st("n1") == State.READY
    kinds = [i.kind for i in r.intents if i.entity == "n1" and i.kind != IntentKind.SET_CONDITION]
    assert kinds == [IntentKind.NO_NEW_WORK]  # the scheduler's hold on unknown, nothing else
    r.step(5015, [tup("n1", 0.6)])  # the timer resumes at 105 s: the unknown hour did not count
    assert r.st("n1") == State.READY
    assert r.state.entities["n1"].timers["below_degraded"].accum_s == 105.0
    r.step(5030, [tup("n1", 0.6)])  # 105 + 15 = 120 s of usable bad data
    assert r.st("n1") == State.DEGRADED


def test_low_confidence_is_treated_like_unknown() -> None:
    r = Run()
    r.steps(0, 3000, 15, lambda t: [tup("n1", 0.0, conf=0.4, reason="gate:xid")])
    assert r.st("n1") == State.READY
    assert not [i for i in r.intents if i.kind in REMEDIATION_KINDS]


def test_unknown_node_gets_no_new_work_lifted_when_known_again() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.95)])
    r.step(15, [tup("n1", None, conf=0.0)])
    r.step(30, [tup("n1", 0.95)])
    assert r.kinds("n1") == [IntentKind.NO_NEW_WORK, IntentKind.ALLOW_NEW_WORK]


def test_state_round_trips_through_json_and_decides_the_same() -> None:
    r = Run()
    r.steps(0, 200, 15, lambda t: [tup("n1", 0.2), tup("r1", 0.5, kind="replica")])
    blob = json.dumps(r.state.to_dict())
    back = DecisionState.from_dict(json.loads(blob))
    assert back.to_dict() == r.state.to_dict()
    d1 = Decider().decide(r.state, [tup("n1", 0.2)], 300)
    d2 = Decider().decide(back, [tup("n1", 0.2)], 300)
    assert [t.to_dict() for t in d1.transitions] == [t.to_dict() for t in d2.transitions]
    assert [i.to_dict() for i in d1.intents] == [i.to_dict() for i in d2.intents]
    assert r.state.entities["n1"].state == State.DEGRADED  # decide() did not touch its input


def test_mermaid_diagram_is_generated_from_the_table() -> None:
    text = mermaid_diagram(LC)
    assert text.startswith("stateDiagram-v2")
    for rule in RULES:
        assert f"{rule.src} --> {rule.dst}" in text
    assert "below 0.3 for 300s" in text and "above 0.85 for 600s" in text
    for s in State:
        assert str(s) in text


def test_flag_needs_the_dwell_both_ways_so_peer_noise_does_not_flap_it() -> None:
    r = Run()
    for t in range(0, 3600, 60):
        r.step(t, [tup("n1", 0.8 if (t // 60) % 3 == 0 else 1.0)])  # one noisy scrape in three
    assert not r.of(IntentKind.SET_CONDITION)
    r.steps(3600, 3720, 60, lambda t: [tup("n1", 0.82)])
    assert [i.params["status"] for i in r.of(IntentKind.SET_CONDITION)] == [True]
    r.steps(3780, 3840, 60, lambda t: [tup("n1", 0.95)])
    assert r.state.entities["n1"].flagged  # 60 s above: not yet
    r.step(3900, [tup("n1", 0.95)])
    assert [i.params["status"] for i in r.of(IntentKind.SET_CONDITION)] == [True, False]

"""Recurring faults (issue 16 item 4): a GPU whose row remaps keep coming back is paged for repair."""

from __future__ import annotations

import json

import pytest

from decide_support import Run, tup
from fleethealth.decide import recurring
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import DecisionState, EntityLifecycle, Event
from fleethealth.policy import default_policy

DAY = 86400.0


def _remap(gpu: str) -> list:
    return [tup("n1", 0.8, reason="min:memory", flags=("row_remap_pending",)),
            tup(f"n1/{gpu}", 0.8, kind="gpu", labels={"node": "n1"}, flags=("row_remap_pending", "xid:63"))]


def _day(r: Run, t0: float, gpu: str = "gpu3") -> None:
    """A remap pending for ten minutes, then the reset at the safe point clears it."""
    r.steps(t0, t0 + 600, 60, lambda t: _remap(gpu))
    r.step(t0 + 660, [tup("n1", 0.97)], [Event(t0 + 650, "reset", "n1", passed=True)])


def test_a_pending_remap_on_the_same_gpu_three_days_running_pages_for_repair() -> None:
    r = Run()
    for d in range(3):
        _day(r, d * DAY)
    assert len(r.of(IntentKind.SCHEDULE_RESET)) == 3  # each remap still gets its reset
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"]
    # one incident for the GPU (decide16b): fired at the second remap, updated (not sent again as a new
    # page) at the third, still open between them and after: the GPU still needs its repair
    assert [(p.ts, p.entity, p.params["remaps"], p.params["state"]) for p in pages] == [
        (DAY, "n1/gpu3", 2, "firing"), (2 * DAY, "n1/gpu3", 3, "update")]
    assert [p.params["incident"] for p in pages] == ["row_remap:n1/gpu3"] * 2
    assert "row_remap:n1/gpu3" in r.state.incidents
    assert pages[0].params["action"] == "repair" and pages[0].params["node"] == "n1"
    assert pages[0].params["first"] == 0.0 and "RMA" in pages[0].params["summary"]
    # the count survives a restart (it is in the lifecycle's JSON)
    st = DecisionState.from_dict(r.state.to_dict())
    assert [x[1] for x in st.entities["n1"].remaps] == [["n1/gpu3"]] * 3


def test_the_remap_incident_resolves_once_the_node_is_repaired_or_the_remaps_age_out() -> None:
    r = Run()
    for d in range(2):
        _day(r, d * DAY)
    # a human returns the node from its repair: its remaps are forgotten and the incident resolves once
    r.step(DAY + 3600, [tup("n1", 0.97)], [Event(DAY + 3590, "ack", "n1", to="READY")])
    r.steps(DAY + 3660, DAY + 3 * 3600, 60, lambda t: [tup("n1", 0.97)])
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"]
    assert [(p.params["state"], p.entity) for p in pages] == [("firing", "n1/gpu3"), ("resolved", "n1/gpu3")]
    assert r.state.entities["n1"].remaps == [] and "row_remap:n1/gpu3" not in r.state.incidents
    # without a repair, the incident stays open until the remaps fall out of recovery_window_s
    r2 = Run()
    for d in range(2):
        _day(r2, d * DAY)
    r2.steps(2 * DAY, 7 * DAY + 3600, 3600, lambda t: [tup("n1", 0.97)])
    assert [p.params["state"] for p in r2.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"] == [
        "firing", "resolved"]
    (resolved,) = [p for p in r2.of(IntentKind.PAGE) if p.params.get("state") == "resolved"]
    assert resolved.ts >= 7 * DAY  # the first remap (day 0) left the 7-day window


def test_remaps_on_other_gpus_or_outside_the_window_do_not_add_up() -> None:
    r = Run()
    _day(r, 0.0, "gpu3")
    _day(r, DAY, "gpu5")  # another GPU: its first
    _day(r, 8 * DAY, "gpu3")  # gpu3 again, but a week and a day later
    assert len(r.of(IntentKind.SCHEDULE_RESET)) == 3
    assert not [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"]


# ---- recurring faults: episodes per entity and GPU, escalation to FAILED (issue 16 item 4) -------------

HOUR = 3600.0


def _burst(value: float = 0.0, reason: str = "gate:xid", xid: str = "xid:74", gpu: str = "gpu2") -> list:
    """A flaky NVLink's burst: an Xid 74 on one GPU gates the node."""
    return [tup("n1", value, reason=reason, flags=(xid,), worst="hardware"),
            tup(f"n1/{gpu}", 0.0, kind="gpu", labels={"node": "n1"}, flags=(xid,), reason=reason)]


def _flaky(r: Run, bursts: int, start: float = 0.0, every: float = HOUR) -> None:
    """A burst every hour; the active test 10 minutes after each quarantine passes (the link is quiet)."""
    for k in range(bursts):
        t0 = start + k * every
        r.step(t0, _burst())
        r.step(t0 + 600, [tup("n1", 0.97)], [Event(t0 + 590, "active_test", "n1", passed=True)])
        r.steps(t0 + 660, t0 + every - 60, 60, lambda t: [tup("n1", 0.97)])


def _recurring_off() -> Run:
    p = default_policy()
    return Run(policy=p.model_copy(update={"recurring": p.recurring.model_copy(update={"max_episodes": 0})}))


def test_a_flaky_link_is_failed_for_repair_at_its_third_episode_instead_of_released_again() -> None:
    r = Run()
    _flaky(r, 3)
    # released after the first two episodes, not after the third
    assert [i.ts for i in r.of(IntentKind.QUARANTINE)] == [0.0, HOUR, 2 * HOUR]
    assert [i.ts for i in r.of(IntentKind.RELEASE) if i.params.get("canary")] == [600.0, HOUR + 600]
    failed = [t for t in r.transitions if t.to_state == State.FAILED]
    assert [(t.ts, t.reason, t.detail) for t in failed] == [(2 * HOUR, "recurring:xid:74", "recurring")]
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:xid:74"]
    assert page.params["state"] == "FAILED" and page.params["action"] == "repair"
    assert (page.params["episodes"], page.params["first"], page.params["family"]) == (3, 0.0, "xid:74")
    assert page.params["gpus"] == {"n1/gpu2": 3}
    assert page.params["summary"].startswith("n1: 3 episodes of xid:74 in 7 days, on n1/gpu2 (3)")
    assert r.st("n1") == State.FAILED


def test_the_escalation_happens_in_the_cycle_of_the_quarantine_and_no_test_is_sent() -> None:
    # the third episode: cordoned, evidence captured, FAILED and paged in that one cycle; no active test
    # (it would pass, the link being quiet, and release the node into its fourth episode), no repair ladder
    r = Run()
    _flaky(r, 2)
    transitions, intents = r.step(2 * HOUR, _burst())
    assert [(t.from_state, t.to_state, t.reason) for t in transitions] == [
        (State.READY, State.QUARANTINED, "gate:xid"), (State.QUARANTINED, State.FAILED, "recurring:xid:74")]
    assert [(i.kind, i.reason) for i in intents] == [
        (IntentKind.NO_NEW_WORK, "gate:xid"), (IntentKind.CAPTURE_EVIDENCE, "gate:xid"),
        (IntentKind.QUARANTINE, "gate:xid"), (IntentKind.PAGE, "recurring:xid:74")]
    page = intents[-1].params
    assert (page["state"], page["from"], page["action"], page["episodes"], page["family"]) == (
        "FAILED", "QUARANTINED", "repair", 3, "xid:74")
    assert page["gpus"] == {"n1/gpu2": 3} and page["severity"] == "page"
    assert r.st("n1") == State.FAILED and r.state.entities["n1"].repair is None
    # the test result that would have come does nothing to a FAILED node
    transitions, intents = r.step(2 * HOUR + 600, [tup("n1", 0.97)],
                                  [Event(2 * HOUR + 590, "active_test", "n1", passed=True)])
    assert not transitions and IntentKind.RELEASE not in [i.kind for i in intents]


def test_a_recurring_drain_and_reset_is_failed_in_its_cycle_without_the_reset() -> None:
    # Xid 154 drain-and-reset three times: drained each time; the third time no reset is scheduled
    def burst() -> list:
        return [tup("n1", 0.0, reason="gate:xid", flags=("xid:74", "recovery_action:DRAIN_AND_RESET"),
                    worst="hardware")]

    r = Run()
    for k in range(3):
        t0 = k * HOUR
        transitions, intents = r.step(t0, burst())
        if k < 2:
            assert IntentKind.SCHEDULE_RESET in [i.kind for i in intents]
            r.step(t0 + 600, [tup("n1", 0.97)], [Event(t0 + 590, "reset", "n1", passed=True)])
            r.step(t0 + 660, [tup("n1", 0.97)], [Event(t0 + 650, "active_test", "n1", passed=True)])
            r.steps(t0 + 720, t0 + HOUR - 60, 60, lambda t: [tup("n1", 0.97)])
            assert r.st("n1") == State.READY
    assert [(t.from_state, t.to_state) for t in transitions] == [
        (State.READY, State.DRAINING), (State.DRAINING, State.FAILED)]
    assert [i.kind for i in intents] == [IntentKind.NO_NEW_WORK, IntentKind.CAPTURE_EVIDENCE, IntentKind.DRAIN,
                                         IntentKind.PAGE]
    assert intents[-1].reason == "recurring:xid:74" and intents[-1].params["episodes"] == 3


def test_without_the_rule_the_same_link_is_released_three_times() -> None:
    r = _recurring_off()
    _flaky(r, 4)
    assert len(r.of(IntentKind.QUARANTINE)) == 4
    assert len([i for i in r.of(IntentKind.RELEASE) if i.params.get("canary")]) == 3
    assert [t.reason for t in r.transitions if t.to_state == State.FAILED] == ["event:too_many_recoveries"]


def test_episodes_survive_a_restart_in_the_lifecycle_json() -> None:
    r = Run()
    _flaky(r, 2)
    assert [e[1:] for e in r.state.entities["n1"].episodes] == [["xid:74", ["n1/gpu2"], "isolation"]] * 2
    r2 = Run(state=DecisionState.from_dict(json.loads(json.dumps(r.state.to_dict()))))
    _flaky(r2, 1, start=2 * HOUR)
    assert [t.reason for t in r2.transitions if t.to_state == State.FAILED] == ["recurring:xid:74"]


def test_degraded_spells_count_and_a_spell_that_escalates_is_one_episode() -> None:
    r = Run()
    for k in range(2):  # two slow spells of the interconnect, each back to READY
        t0 = k * 2 * HOUR
        r.steps(t0, t0 + 600, 60, lambda t: [tup("n1", 0.5, reason="min:interconnect")])
        r.steps(t0 + 660, t0 + 2 * HOUR - 60, 60, lambda t: [tup("n1", 0.97)])
    assert [t.to_state for t in r.transitions] == [State.DEGRADED, State.READY] * 2
    assert not [t for t in r.transitions if t.to_state == State.FAILED]  # a spell alone never fails a node
    # the third: degraded, then below quarantine_below; one episode, the third of its family
    t0 = 4 * HOUR
    r.steps(t0, t0 + 180, 60, lambda t: [tup("n1", 0.5, reason="min:interconnect")])
    r.steps(t0 + 240, t0 + 900, 60, lambda t: [tup("n1", 0.1, reason="min:interconnect")])
    eps = r.state.entities["n1"].episodes
    assert [e[3] for e in eps] == ["degraded", "degraded", "isolation"]
    assert r.st("n1") == State.FAILED
    assert [t.reason for t in r.transitions if t.to_state == State.FAILED] == ["recurring:interconnect"]


def test_other_families_and_old_episodes_do_not_add_up() -> None:
    r = Run()
    _flaky(r, 2)
    t0 = 2 * HOUR
    r.step(t0, [tup("n1", 0.0, reason="gate:ecc_dbe", worst="hardware")])  # another fault: a DBE
    r.step(t0 + 600, [tup("n1", 0.97)], [Event(t0 + 590, "active_test", "n1", passed=True)])
    assert r.st("n1") == State.RECOVERING
    # the flaky link again, eight days after its first two episodes: the window has forgotten them
    r.steps(t0 + 660, t0 + 3600, 60, lambda t: [tup("n1", 0.97)])
    _flaky(r, 1, start=8 * 86400.0)
    assert not [t for t in r.transitions if t.to_state == State.FAILED]


def test_a_human_release_after_the_repair_starts_the_count_again() -> None:
    r = Run()
    _flaky(r, 3)
    assert r.st("n1") == State.FAILED
    t0 = 3 * HOUR
    r.step(t0, [tup("n1", 0.97)], [Event(t0, "ack", "n1", to="READY", actor="alice")])
    assert r.st("n1") == State.READY and r.state.entities["n1"].episodes == []
    _flaky(r, 1, start=4 * HOUR)  # one more would be the fourth recovery in a week (max_recoveries)
    assert r.st("n1") == State.READY and len(r.state.entities["n1"].episodes) == 1


@pytest.mark.parametrize(("reason", "flags", "family"), [
    ("gate:xid", ("xid:13", "xid:119", "xid:74"), "xid:74"),  # application Xids aside, the lowest Xid
    ("gate:xid", ("xid:62", "xid:48"), "xid:48"),  # by number
    ("gate:xid", ("xid:9", "xid:74"), "xid:9"),
    ("gate:xid_count", (), "xid_count"),  # an Xid gate with no Xid flagged
    ("gate:kernel_xid", ("xid:79",), "xid:79"),
    ("gate:kernel_fallen_off", ("xid:79",), "kernel"),  # not an Xid-shaped signal: its family
    ("gate:ecc_dbe", ("xid:48",), "ecc_dbe"),  # no family: its name
    ("gate:not_in_policy", (), "not_in_policy"),
    ("attribution:app_xid:2_jobs", ("xid:13",), "app_xid"),
    ("min:interconnect", ("xid:74",), "interconnect"),
    ("mean:thermal:gpu_temp", (), "thermal"),
    ("gmean:performance", (), "performance"),
    ("floor:pcie_replay", (), "pcie_replay"),
    ("chronic:cost", (), "chronic"),
    ("no_fresh_data", (), "no_fresh_data"),
    ("", (), "unknown"),
])
def test_the_family_of_an_episode(reason: str, flags: tuple[str, ...], family: str) -> None:
    assert recurring.family_of(reason, flags, default_policy()) == family


def _policy(max_episodes: int = 3, window_s: float = 7 * 86400.0):  # type: ignore[no-untyped-def]
    p = default_policy()
    return p.model_copy(update={"recurring": p.recurring.model_copy(
        update={"max_episodes": max_episodes, "window_s": window_s})})


def test_which_transitions_start_an_episode() -> None:
    p = _policy(max_episodes=1)  # one episode is already the limit: still recorded
    es = EntityLifecycle("n1", "node", State.QUARANTINED, 100.0)
    for src, dst in [(State.READY, State.QUARANTINED), (State.RECOVERING, State.QUARANTINED),
                     (State.READY, State.DRAINING), (State.READY, State.DEGRADED)]:
        es.episodes = []
        recurring.record(es, src, dst, 200.0, 100.0, "f", ["n1/gpu1", "n1/gpu0", "n1/gpu1"], p)
        kind = "degraded" if dst == State.DEGRADED else "isolation"
        assert es.episodes == [[200.0, "f", ["n1/gpu0", "n1/gpu1"], kind]], (src, dst)
    for src, dst in [(State.QUARANTINED, State.DRAINING), (State.DRAINING, State.QUARANTINED),
                     (State.QUARANTINED, State.RECOVERING), (State.RECOVERING, State.READY),
                     (State.DEGRADED, State.DEGRADED), (State.READY, State.RECOVERING)]:
        es.episodes = []
        recurring.record(es, src, dst, 200.0, 100.0, "f", [], p)
        assert es.episodes == [], (src, dst)
    es.episodes = []
    recurring.record(es, State.READY, State.QUARANTINED, 200.0, 100.0, "f", [], _policy(max_episodes=0))
    assert es.episodes == []  # the rule is off: nothing remembered


def test_a_spell_is_replaced_by_its_own_escalation_only_and_old_episodes_are_pruned() -> None:
    p = _policy(window_s=1000.0)
    es = EntityLifecycle("n1", "node", State.DEGRADED, 500.0)
    es.episodes = [[10.0, "a", [], "isolation"], [400.0, "b", [], "degraded"], [500.0, "c", [], "degraded"]]
    recurring.record(es, State.DEGRADED, State.QUARANTINED, 1010.0, 500.0, "c", [], p)
    # the spell begun at 500 became this isolation; 10 is exactly window_s old and gone; 400 stays
    assert es.episodes == [[400.0, "b", [], "degraded"], [1010.0, "c", [], "isolation"]]
    es.episodes = [[400.0, "b", [], "degraded"]]  # a spell from before this DEGRADED stint: kept
    recurring.record(es, State.DEGRADED, State.QUARANTINED, 1010.0, 500.0, "b", [], p)
    assert [e[3] for e in es.episodes] == ["degraded", "isolation"]


def test_escalation_at_exactly_the_limit_of_one_family_in_the_window() -> None:
    p = _policy(max_episodes=3, window_s=1000.0)
    es = EntityLifecycle("n1", "node", State.QUARANTINED, 900.0)
    es.episodes = [[100.0, "f", ["g1"], "degraded"], [500.0, "g", [], "isolation"], [900.0, "f", ["g1"], "isolation"]]
    assert recurring.escalation(es, 950.0, p) is None  # two of family f
    es.episodes.insert(0, [0.0, "f", [], "isolation"])
    assert recurring.escalation(es, 950.0, p) == "recurring:f"  # three of f within 1000 s
    assert recurring.escalation(es, 1000.0, p) is None  # the first is exactly window_s old
    assert recurring.escalation(es, 950.0, _policy(max_episodes=4, window_s=1000.0)) is None
    assert recurring.escalation(es, 950.0, _policy(max_episodes=0)) is None
    one = EntityLifecycle("n1", "node", State.QUARANTINED, 900.0, episodes=[[900.0, "f", [], "isolation"]])
    assert recurring.escalation(one, 950.0, _policy(max_episodes=1)) == "recurring:f"
    assert recurring.escalation(EntityLifecycle("n1", "node", State.READY, 0.0, episodes=es.episodes), 950.0, p) is None
    es.episodes.append([940.0, "f", [], "degraded"])  # the latest episode is a spell: nothing to escalate
    assert recurring.escalation(es, 950.0, p) is None


def test_the_page_names_the_gpus_most_involved_first() -> None:
    p = _policy()
    es = EntityLifecycle("n1", "node", State.FAILED, 900.0)
    gpus = [["n1/g2"], ["n1/g2", "n1/g1"], ["n1/g5", "n1/g4", "n1/g3", "n1/g2"], ["n1/g1"]]
    es.episodes = [[100.0 * (k + 1), "f", g, "isolation"] for k, g in enumerate(gpus)]
    pp = recurring.page_params(es, 900.0, p)
    assert pp["gpus"] == {"n1/g1": 2, "n1/g2": 3, "n1/g3": 1, "n1/g4": 1, "n1/g5": 1}
    assert pp["summary"] == ("n1: 4 episodes of f in 7 days, on n1/g2 (3), n1/g1 (2), n1/g3 (1), n1/g4 (1); it "
                             "passes its tests between episodes, so it is not released again: schedule a repair")
    assert (pp["episodes"], pp["first"], pp["window_s"], pp["action"]) == (4, 100.0, 7 * 86400.0, "repair")
    es.episodes = [[100.0, "f", [], "isolation"]]
    assert recurring.page_params(es, 900.0, p)["summary"] == (
        "n1: 1 episode of f in 7 days; it passes its tests between episodes, so it is not released again: "
        "schedule a repair")
    assert recurring.page_params(EntityLifecycle("n1", "node", State.FAILED, 0.0), 900.0, p) == {}

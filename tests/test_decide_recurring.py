"""Recurring faults (issue 16 item 4): a GPU whose row remaps keep coming back is paged for repair."""

from __future__ import annotations

import json

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import DecisionState, Event
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
    assert [(p.ts, p.entity, p.params["remaps"]) for p in pages] == [(DAY, "n1/gpu3", 2), (2 * DAY, "n1/gpu3", 3)]
    assert pages[0].params["action"] == "repair" and pages[0].params["node"] == "n1"
    assert pages[0].params["first"] == 0.0 and "RMA" in pages[0].params["summary"]
    # the count survives a restart (it is in the lifecycle's JSON)
    st = DecisionState.from_dict(r.state.to_dict())
    assert [x[1] for x in st.entities["n1"].remaps] == [["n1/gpu3"]] * 3


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
    assert [(t.ts, t.reason, t.detail) for t in failed] == [(2 * HOUR + 600, "recurring:xid:74", "recurring")]
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:xid:74"]
    assert page.params["state"] == "FAILED" and page.params["action"] == "repair"
    assert (page.params["episodes"], page.params["first"], page.params["family"]) == (3, 0.0, "xid:74")
    assert page.params["gpus"] == {"n1/gpu2": 3}
    assert page.params["summary"].startswith("n1: 3 episodes of xid:74 in 7 days, on n1/gpu2 (3)")
    assert r.st("n1") == State.FAILED


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

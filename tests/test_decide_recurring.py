"""Recurring faults (issue 16 item 4): a GPU whose row remaps keep coming back is paged for repair."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind
from fleethealth.decide.state import DecisionState, Event

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

"""Budgets that guard against scorer bugs without delaying dead hardware (issue 16 item 2): confirmed hard
gates spend their own budget and skip the tensor-parallel rule, the longest-waiting node goes first, FAILED
does not block its group, and pages are incidents (one firing page, updates, one resolution)."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import DecisionState, Event


def _pool(n: int, bad: dict[int, str], labels=None) -> list:
    out = []
    for i in range(n):
        lab = {"pool": "h100", **((labels or (lambda i: {}))(i))}
        if i in bad:
            out.append(tup(f"n{i:02d}", 0.0, reason=bad[i], labels=lab, worst="hardware"))
        else:
            out.append(tup(f"n{i:02d}", 0.97, labels=lab))
    return out


def _new_pages(r: Run, reason: str | None = None) -> list:
    return [i for i in r.of(IntentKind.PAGE) if incidents.is_new_page(i.params)
            and (reason is None or i.reason == reason)]


def test_three_gpus_off_the_bus_within_ten_minutes_are_all_quarantined_at_once() -> None:
    # 48 nodes: the rate budget is max(1, 2% of 48) = 1 an hour; the hard-gate budget is max(3, 10%) = 4
    r = Run()
    onsets = {3: 0.0, 17: 240.0, 40: 600.0}
    def f(t: float) -> list:
        return _pool(48, {n: "gate:kernel_fallen_off" for n, t0 in onsets.items() if t >= t0})
    r.steps(0, 900, 15, f)
    q = {i.entity: i.ts for i in r.of(IntentKind.QUARANTINE)}
    assert q == {"n03": 0.0, "n17": 240.0, "n40": 600.0}  # each the cycle its GPU fell off
    assert not _new_pages(r, "budget_exhausted")
    ledger = sorted(k for _, k, _ in r.state.ledger)
    # physical evidence (a GPU off the bus) has its own budget; the rate budget is untouched for the
    # scorer's judgements
    assert ledger == ["physical:node:h100"] * 3


def test_a_fleet_wide_burst_of_hard_gates_still_stops_at_the_hard_budget_and_pages_once() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: _pool(50, {i: "gate:xid" for i in range(20)}))
    hard = [i.entity for i in r.of(IntentKind.QUARANTINE)]
    assert len(hard) == 5  # max(3, floor(10% of 50))
    (page,) = _new_pages(r, "budget_exhausted")
    assert page.params["budget"] == "hard_gate" and page.params["allowed"] == 5 and page.entity == "pool/h100"
    assert page.params["state"] == "firing" and page.params["incident"] == "budget:node:h100"


def test_oldest_waiting_goes_first_not_the_lowest_name() -> None:
    r = Run()
    # n30 is held from t=0 (rate budget 1/h spent by n40 at t=0); n05 starts waiting at 600 s
    def f(t: float) -> list:
        bad = {40: "gate:oom_device_fault", 30: "gate:oom_device_fault"}
        if t >= 600:
            bad[5] = "gate:oom_device_fault"
        return _pool(50, bad)
    r.steps(0, 3700, 60, f)
    q = [(i.entity, i.ts) for i in r.of(IntentKind.QUARANTINE)]
    assert q[0] == ("n30", 0.0) or q[0] == ("n40", 0.0)
    first, second = q[0][0], q[1][0]
    assert {first, second} == {"n30", "n40"} and q[1][1] >= 3600  # the one waiting since t=0, not n05
    assert r.state.entities["n05"].blocked is not None and r.state.entities["n05"].blocked_since == 600


def test_failed_does_not_block_its_tp_group_and_the_group_page_resolves() -> None:
    r = Run()
    labels = lambda i: {"tp_group": f"g{i // 4}"}  # noqa: E731
    bad = {0: "gate:oom_device_fault", 1: "gate:oom_device_fault"}
    r.steps(0, 60, 15, lambda t: _pool(200, bad, labels))
    assert r.st("n00") == State.QUARANTINED and r.st("n01") != State.QUARANTINED
    assert [p.params["state"] for p in r.of(IntentKind.PAGE) if p.reason == "tp_group_limit"] == ["firing"]
    # n00 fails its active test: FAILED is a human's now and no longer costs the group a slot
    r.step(75, _pool(200, bad, labels), [Event(70, "active_test", "n00", passed=False)])
    assert r.st("n00") == State.FAILED
    r.step(90, _pool(200, bad, labels))
    assert r.st("n01") == State.QUARANTINED
    r.steps(105, 1200, 15, lambda t: _pool(200, bad, labels))
    tp = [p for p in r.of(IntentKind.PAGE) if p.reason == "tp_group_limit"]
    assert [p.params["state"] for p in tp] == ["firing", "resolved"]
    assert tp[1].entity == tp[0].entity == "tp_group/g0" and tp[1].params["tp_group"] == "g0"
    assert tp[1].ts == 75 + r.policy.budgets.incident_clear_s  # last held at 75 (n01 vetoed), then 15 min


def test_a_hard_gate_is_not_held_by_its_tp_group() -> None:
    r = Run()
    labels = lambda i: {"tp_group": f"g{i // 4}"}  # noqa: E731
    r.steps(0, 30, 15, lambda t: _pool(200, {0: "gate:xid", 1: "gate:ecc_dbe"}, labels))
    assert r.st("n00") == State.QUARANTINED and r.st("n01") == State.QUARANTINED
    assert not [p for p in r.of(IntentKind.PAGE) if p.reason == "tp_group_limit"]


def test_an_exhausted_budget_is_one_incident_for_hours_then_resolved() -> None:
    r = Run()
    # 10 nodes of 50 degrade past quarantine on the rate budget (1 an hour): the wait lasts hours
    bad = {i: "min:hardware" for i in range(10)}
    r.steps(0, 4 * 3600, 60, lambda t: _pool(50, bad))
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    states = [p.params["state"] for p in pages]
    assert states[0] == "firing" and states.count("firing") == 1  # not re-sent every hour
    assert all(s == "update" for s in states[1:])
    assert all(b.ts - a.ts >= r.policy.budgets.incident_update_s for a, b in zip(pages, pages[1:], strict=False))
    # the fault clears: nothing waits any more, the incident resolves once
    r.steps(4 * 3600 + 60, 4 * 3600 + 3600, 60, lambda t: _pool(50, {}))
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    assert pages[-1].params["state"] == "resolved" and pages[-1].params["pool"] == "h100"
    assert [p.params["state"] for p in pages].count("resolved") == 1
    assert not r.state.incidents


def test_version_correlation_pages_once_per_rollout() -> None:
    r = Run()
    bad = set(range(0, 40, 4))
    labels = lambda i: {"driver_version": "575.1" if i in bad else "550.9"}  # noqa: E731
    r.steps(0, 14 * 3600, 300, lambda t: _pool(40, {i: "min:performance" for i in bad}, labels))
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"]
    assert [p.params["state"] for p in pages] == ["firing"]  # 14 hours, one page (was 14)
    r.steps(14 * 3600 + 300, 15 * 3600, 300, lambda t: _pool(40, {}, labels))  # rolled back
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"]
    assert [p.params["state"] for p in pages] == ["firing", "resolved"]
    assert pages[1].entity == "version/driver_version=575.1" and pages[1].params["value"] == "575.1"


def test_an_open_incident_survives_a_restart_that_kept_only_the_pages_table() -> None:
    r = Run()
    bad = {i: "gate:oom_device_fault" for i in range(3)}
    r.steps(0, 120, 15, lambda t: _pool(50, bad))
    assert len(_new_pages(r, "budget_exhausted")) == 1
    st = r.state
    r.state = DecisionState(dict(st.entities), list(st.ledger), dict(st.app_xids), dict(st.pages), st.frozen,
                            st.frozen_since, st.seq, st.last_ts)  # incidents lost, pages kept
    r.steps(135, 600, 15, lambda t: _pool(50, bad))
    assert len(_new_pages(r, "budget_exhausted")) == 1  # adopted again, not re-sent
    assert "budget:node:h100" in r.state.incidents


def test_nodes_the_hard_gate_budget_held_are_not_quarantined_later_on_the_rate_budget() -> None:
    # 20 gates in a pool of 50: the hard-gate budget takes 5 an hour. The held 15 keep reading gate:xid at
    # score 0, which the score-dwell rule would also quarantine after its dwell: that is the same evidence,
    # so it spends the same (exhausted) budget instead of the rate budget beside it (budgets do not add up).
    r = Run()
    r.steps(0, 1800, 15, lambda t: _pool(50, {i: "gate:xid" for i in range(20)}))
    assert len(r.of(IntentKind.QUARANTINE)) == 5
    assert sorted(k for _, k, _ in r.state.ledger) == ["hard:node:h100"] * 5  # the rate budget untouched
    assert len(_new_pages(r, "budget_exhausted")) == 1


"""What a domain event explains (issue 16, decide16b item 1): while a rack's cooling failure is open, its
nodes' thermal and slowed-clock readings are held (the rack is the suspect), but a node whose own evidence
the event cannot explain (a PCIe replay storm on one GPU: a bad riser) is decided as outside the event and
removed, instead of waiting hours for the rack's incident to resolve. The mapping is policy
(``domains.explains``), validated against the policy's signals and categories."""

from __future__ import annotations

import pytest

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.domains import reason_item, unexplained
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import PolicyError, default_policy, default_policy_text, parse_policy

RACKS, PER_RACK = 6, 8


def _fleet(t: float, extra: dict[int, tuple[float, str, tuple[str, ...]]]) -> list:
    """Rack r2 (n16-n23) runs hot from t=0 to 3 h (score 0.2, min:thermal); ``extra`` overrides a node."""
    out = []
    for i in range(RACKS * PER_RACK):
        lab = {"pool": "h100", "rack": f"r{i // PER_RACK}", "tp_group": f"tp{i // 2}", "driver_version": "v1"}
        v, why, flags = 0.97, "min:performance", ()
        if 16 <= i < 24 and t < 3 * 3600.0:
            v, why = 0.2, "min:thermal"
        if i in extra and t >= 1800.0:
            v, why, flags = extra[i]
        out.append(tup(f"n{i:02d}", v, reason=why, labels=lab, flags=flags))
    return out


def _quarantined(r: Run, node: str) -> list[float]:
    return [t.ts for t in r.transitions if t.entity == node and t.to_state == State.QUARANTINED]


def test_a_pcie_storm_on_a_node_of_a_hot_rack_is_removed_during_the_event() -> None:
    r = Run()
    # n19 also gets a PCIe replay storm 30 min in: its worst category is now pcie, which cooling cannot cause
    r.steps(0, 2 * 3600, 60, lambda t: _fleet(t, {19: (0.0, "min:pcie", ())}))
    pages = [i for i in r.of(IntentKind.PAGE) if incidents.is_new_page(i.params)]
    assert [(p.entity, p.reason) for p in pages] == [("domain/rack=r2", "domain_correlation")]
    assert "domain:rack=r2" in r.state.incidents  # the rack's event is still open
    q = _quarantined(r, "n19")
    assert q and q[0] - 1800.0 <= 600.0, q  # within the lifecycle's dwell, not at the event's end
    for n in (16, 17, 18, 20, 21, 22, 23):  # the rest of the rack is still held, not drained
        assert not _quarantined(r, f"n{n}")


def test_a_floor_flag_the_event_does_not_explain_passes_the_hold_even_when_the_worst_is_performance() -> None:
    r = Run()
    # the node's worst category is its slowed rank (performance, which cooling explains), but one of its
    # GPUs' PCIe replay counter runs at its critical rate (flag floor:pcie_replay)
    r.steps(0, 2 * 3600, 60, lambda t: _fleet(t, {19: (0.0, "min:performance", ("floor:pcie_replay",))}))
    q = _quarantined(r, "n19")
    assert q and q[0] - 1800.0 <= 600.0, q


def test_what_the_event_explains_stays_held() -> None:
    r = Run()
    r.steps(0, 2 * 3600, 60, lambda t: _fleet(t, {19: (0.0, "min:clocks", ("floor:thermal_violation",))}))
    assert not r.of(IntentKind.QUARANTINE) and not r.of(IntentKind.DRAIN)
    held = {i.entity for i in r.of(IntentKind.NO_NEW_WORK) if i.reason == "held:domain:rack=r2"}
    assert "n19" in held


def test_unexplained_items() -> None:
    p = default_policy()
    assert reason_item("gate:pcie_replay") == "pcie_replay" and reason_item("min:thermal") == "thermal"
    assert reason_item("attribution:app_xid:3_jobs") == "app_xid" and reason_item("no_fresh_data") is None
    assert unexplained(p, "rack", ["min:thermal", "gate:gpu_temp", "floor:clock_throttle"]) == []
    assert unexplained(p, "rack", ["min:performance", "min:pcie", "floor:pcie_replay"]) == ["pcie", "pcie_replay"]
    assert unexplained(p, "cooling_zone", ["gate:xid", "min:memory"]) == ["xid", "memory"]
    assert unexplained(p, "power_zone", ["gate:xid", "min:hardware"]) == []  # a brownout's Xids
    assert unexplained(p, "nvlink_domain", ["attribution:app_xid:2_jobs", "min:hardware"]) == []
    assert unexplained(p, "switch", ["min:nvlink"]) == ["nvlink"]
    # a label the mapping does not name explains everything (the hold as before the mapping)
    q = p.model_copy(update={"domains": p.domains.model_copy(update={"explains": {}})})
    assert unexplained(q, "rack", ["min:pcie"]) == []


def test_explains_errors_name_the_key_and_the_line() -> None:
    bad = default_policy_text().replace("    switch: [performance, serving, errors, load, clocks, power, thermal]\n",
                                        "    switch: [performance, bogus]\n")
    with pytest.raises(PolicyError, match=r"p.yaml:\d+: domains: .*explains.switch: \['bogus'\] are neither"):
        parse_policy(bad, "p.yaml")
    bad = default_policy_text().replace("    switch: [performance, serving, errors, load, clocks, power, thermal]\n",
                                        "    row: [performance]\n")
    with pytest.raises(PolicyError, match=r"p.yaml:\d+: domains: .*explains.row: not one of labels"):
        parse_policy(bad, "p.yaml")

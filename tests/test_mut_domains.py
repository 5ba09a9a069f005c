"""Failure domains at their edges (issue 21: decide/domains.py): a node that went bad exactly
``domains.window_s`` before the others still makes the event with them; the page's summary lists three
signals without an ellipsis and its evidence at most ten; a hard gate met first does not hide the rest."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.model import IntentKind, State

RACKS, PER_RACK = 6, 8


def _fleet(bad: dict[int, tuple[float, str]]) -> list:
    """Six racks of eight; racks r2 and r3 share cooling zone cz1, the others cz0."""
    out = []
    for i in range(RACKS * PER_RACK):
        lab = {"pool": "h100", "rack": f"r{i // PER_RACK}", "tp_group": f"tp{i // 2}", "driver_version": "v1",
               "cooling_zone": "cz1" if i // PER_RACK in (2, 3) else "cz0"}
        v, why = bad.get(i, (0.97, "min:performance"))
        out.append(tup(f"n{i:02d}", v, reason=why, labels=lab))
    return out


def _domain_pages(r: Run) -> list:
    return [i for i in r.of(IntentKind.PAGE) if incidents.is_new_page(i.params) and i.reason == "domain_correlation"]


def test_a_node_degraded_exactly_window_s_before_still_makes_the_event() -> None:
    r = Run()
    window = r.policy.domains.window_s
    # n16 slows (0.5: degraded, not quarantined) from 0 and is DEGRADED after the dwell, at 120 s
    def make(t: float) -> list:
        bad = {16: (0.5, "min:clocks")}
        if t >= 120.0 + window:
            bad |= {17: (0.5, "min:clocks"), 18: (0.5, "min:clocks")}
        return _fleet(bad)

    r.steps(0, 120.0 + window + 300, 60, make)
    (deg,) = [t for t in r.transitions if t.entity == "n16"]
    assert (deg.to_state, deg.ts) == (State.DEGRADED, 120.0)
    (page,) = _domain_pages(r)
    assert page.ts == 120.0 + window and page.params["nodes"] == ["n16", "n17", "n18"]


def test_a_node_degraded_longer_than_window_s_before_does_not() -> None:
    r = Run()
    window = r.policy.domains.window_s

    def make(t: float) -> list:
        bad = {16: (0.5, "min:clocks")}
        if t >= 180.0 + window:
            bad |= {17: (0.5, "min:clocks"), 18: (0.5, "min:clocks")}
        return _fleet(bad)

    r.steps(0, 180.0 + window + 600, 60, make)
    assert not _domain_pages(r)


def test_the_summary_lists_three_signals_without_an_ellipsis_and_the_evidence_ten_at_most() -> None:
    r = Run()
    r.steps(0, 300, 60, lambda t: _fleet({16: (0.2, "min:a"), 17: (0.2, "min:b"), 18: (0.2, "min:c")}))
    (page,) = _domain_pages(r)
    assert "(min:a, min:b, min:c); the domain is the suspect" in page.params["summary"]
    # eleven different signals across cooling zone cz1 (racks r2 and r3): the evidence keeps the first ten
    big = Run()
    sigs = {16 + k: (0.2, f"min:s{k % 11:02d}") for k in range(16)}
    big.steps(0, 300, 60, lambda t: _fleet(sigs))
    (zone,) = _domain_pages(big)
    assert zone.entity == "domain/cooling_zone=cz1" and zone.params["n_nodes"] == 16
    assert zone.params["signals"] == [f"min:s{k:02d}" for k in range(10)]
    assert zone.params["summary"].startswith("cooling_zone cz1: 16 of 16 nodes unhealthy together (min:s00, "
                                             "min:s01, min:s02, ...)")


def test_a_hard_gate_on_a_node_met_first_does_not_hide_the_domain_behind_it() -> None:
    r = Run()
    # n00 (rack r0, first in the fleet) has a GPU off the bus: hardware, no domain member; rack r2 heats
    r.steps(0, 300, 60, lambda t: _fleet({0: (0.0, "gate:kernel_fallen_off"), 16: (0.2, "min:thermal"),
                                          17: (0.2, "min:thermal"), 18: (0.2, "min:thermal")}))
    assert [p.entity for p in _domain_pages(r)] == ["domain/rack=r2"]
    assert r.st("n00") == State.QUARANTINED


def test_a_domains_size_counts_every_node_of_it_whatever_else_the_fleet_holds() -> None:
    """3 bad nodes of cooling zone cz1's 16 are under its fraction (0.3): no event, also when a serving
    replica was seen before any node."""
    r = Run()
    bad = {16: (0.2, "min:thermal"), 17: (0.2, "min:thermal"), 24: (0.2, "min:thermal")}
    r.steps(0, 600, 60, lambda t: [tup("r1", 0.95, kind="replica"), *_fleet(bad)])
    assert not _domain_pages(r)


def test_a_suspect_versions_nodes_met_first_do_not_hide_a_domain_event_behind_them() -> None:
    """Nodes n01, n09 and n25 (three racks) run driver v2 and go bad: the version is the suspect. Rack r4
    overheats at the same time on driver v1: that is still the rack's event."""
    r = Run()
    v2 = {1, 9, 25}

    def make(t: float) -> list:
        bad = {i: (0.2, "min:clocks") for i in v2} | {32 + k: (0.2, "min:thermal") for k in range(3)}
        out = _fleet(bad)
        return [tup(x.entity, x.value, x.confidence, x.reason,
                    labels={**x.labels, "driver_version": "v2" if i in v2 else "v1"}) for i, x in enumerate(out)]

    r.steps(0, 600, 60, make)
    assert [p.entity for p in _domain_pages(r)] == ["domain/rack=r4"]
    assert [p.entity for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"] == [
        "version/driver_version=v2"]


# --- what an event of a domain explains (policy.domains.explains): reason_item / unexplained ---------------

from fleethealth.decide.domains import reason_item, unexplained  # noqa: E402
from fleethealth.policy import default_policy  # noqa: E402


def test_reason_item_names_the_signal_the_category_or_the_attribution_blame() -> None:
    assert reason_item("gate:xid") == "xid"
    assert reason_item("floor:ecc_dbe") == "ecc_dbe"
    assert reason_item("min:clocks") == "clocks"
    # the attribution's blame is its first field, whatever follows it
    assert reason_item("attribution:app_xid:n01:gpu3") == "app_xid"
    # a reason with no item: every domain explains it
    assert reason_item("xid") is None
    assert reason_item("gate:") is None


def test_a_rack_event_does_not_explain_a_pcie_storm_once() -> None:
    p = default_policy()
    assert unexplained(p, "rack", ["gate:pcie_replay"]) == ["pcie_replay"]
    assert unexplained(p, "rack", ["gate:pcie_replay", "floor:pcie_replay", "min:clocks"]) == ["pcie_replay"]
    # a label the policy has no explains entry for explains everything
    assert unexplained(p, "tp_group", ["gate:pcie_replay"]) == []


def test_a_signal_of_a_named_category_is_explained_and_a_named_signal_brings_its_category() -> None:
    p = default_policy()
    assert unexplained(p, "rack", ["gate:gpu_temp"]) == []  # thermal is named for racks
    # power_zone names the signal xid, so the hardware category comes with it
    assert unexplained(p, "power_zone", ["gate:gpus_missing"]) == []
    assert unexplained(p, "cooling_zone", ["gate:gpus_missing"]) == ["gpus_missing"]


def test_only_an_app_xid_attribution_makes_a_rack_event_explain_the_hardware_category() -> None:
    p = default_policy()
    assert unexplained(p, "rack", ["attribution:app_xid:n01", "gate:xid"]) == []
    assert unexplained(p, "rack", ["min:clocks", "gate:xid"]) == ["xid"]
    assert unexplained(p, "cooling_zone", ["attribution:app_xid:n01", "gate:xid"]) == ["app_xid", "xid"]

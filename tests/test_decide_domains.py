"""Failure domains (issue 16 item 1): nodes of one rack (NVLink domain, switch, power or cooling zone)
that go bad together are one incident and one page for the domain, held instead of drained one per
budget window; a confirmed hard gate inside the event is still hardware; an Xid storm across a domain
goes to the jobs and the domain, not to each node."""

from __future__ import annotations

import pytest

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import PolicyError, default_policy, default_policy_text, parse_policy

RACKS, PER_RACK = 6, 8  # 48 nodes in one pool: the rate budget is max(1, 2% of 48) = 1 an hour


def _fleet(bad: dict[int, tuple[float, str]], labels: dict[int, dict[str, str]] | None = None,
           flags: dict[int, tuple[str, ...]] | None = None) -> list:
    out = []
    for i in range(RACKS * PER_RACK):
        lab = {"pool": "h100", "rack": f"r{i // PER_RACK}", "tp_group": f"tp{i // 2}", "driver_version": "v1",
               **(labels or {}).get(i, {})}
        v, why = bad.get(i, (0.97, "min:performance"))
        out.append(tup(f"n{i:02d}", v, reason=why, labels=lab, flags=(flags or {}).get(i, ())))
    return out


def _new_pages(r: Run, reason: str | None = None) -> list:
    return [i for i in r.of(IntentKind.PAGE) if incidents.is_new_page(i.params)
            and (reason is None or i.reason == reason)]


def _cooling(onsets: dict[int, float], end: float = 3 * 3600.0):
    """Rack r2's nodes (16-23) run hot and slow from their onset until ``end``: score 0.2 (below
    quarantine_below), as a thermal slowdown scores."""
    def make(t: float) -> list:
        return _fleet({n: (0.2, "min:thermal") for n, t0 in onsets.items() if t0 <= t < end})
    return make


def test_a_rack_that_overheats_is_one_page_for_the_rack_and_no_node_is_drained() -> None:
    r = Run()
    onsets = {16 + k: 60.0 * k for k in range(8)}  # one more node every minute
    r.steps(0, 4 * 3600, 60, _cooling(onsets))
    assert not r.of(IntentKind.QUARANTINE) and not r.of(IntentKind.DRAIN)
    (page,) = _new_pages(r)  # no budget, tensor-parallel or per-node page besides it
    assert (page.entity, page.reason, page.ts) == ("domain/rack=r2", "domain_correlation", 120.0)  # 3rd node
    assert page.params["nodes"] == ["n16", "n17", "n18"] and page.params["domain_size"] == 8
    assert page.params["signals"] == ["min:thermal"] and page.params["action"] == "no_new_work"
    assert page.params["incident"] == "domain:rack=r2" and page.params["page_kind"] == "domain"
    assert (page.params["domain_label"], page.params["domain"]) == ("rack", "r2")
    assert page.params["summary"] == ("rack r2: 3 of 8 nodes unhealthy together (min:thermal); the domain is the "
                                      "suspect (cooling, power, switch, fabric): its nodes are held, not drained "
                                      "(no_new_work)")
    # the page is updated as more of the rack goes (at most every incident_update_s), resolved once after
    updates = [p for p in r.of(IntentKind.PAGE) if p.params.get("state") == "update"]
    assert updates and updates[0].params["n_nodes"] == 8 and updates[0].ts == 120.0 + 1800.0
    resolved = [p for p in r.of(IntentKind.PAGE) if p.params.get("state") == "resolved"]
    last_seen = 3 * 3600.0 - 60  # the last cycle with the rack hot
    assert [(p.entity, p.ts) for p in resolved] == [("domain/rack=r2", last_seen + 900.0)]
    # every node of the rack is held, none gets past DEGRADED, and the held ones get no new work
    for n in range(16, 24):
        assert State.QUARANTINED not in {t.to_state for t in r.transitions if t.entity == f"n{n:02d}"}
    held = {i.entity for i in r.of(IntentKind.NO_NEW_WORK) if i.reason == "held:domain:rack=r2"}
    assert held == {f"n{n}" for n in range(16, 24)}
    # after the cooling is back, the rack recovers on its own
    assert all(r.st(f"n{n}") == State.READY for n in range(16, 24))


def test_two_bad_nodes_of_a_rack_are_not_a_domain_event() -> None:
    r = Run()
    r.steps(0, 3600, 60, _cooling({16: 0.0, 17: 0.0}))
    assert not _new_pages(r, "domain_correlation")
    assert [i.entity for i in r.of(IntentKind.QUARANTINE)] == ["n16"]  # the budget allows one an hour


def test_a_dead_gpu_inside_a_domain_event_is_still_hardware() -> None:
    r = Run()
    cooling = _cooling({16 + k: 0.0 for k in range(8)})

    def make(t: float) -> list:
        out = cooling(t)
        if t >= 900:  # n20's GPU falls off the bus during the event
            out[20] = tup("n20", 0.0, reason="gate:kernel_fallen_off", labels=out[20].labels, worst="hardware")
        return out

    r.steps(0, 1800, 60, make)
    assert [(i.entity, i.ts) for i in r.of(IntentKind.QUARANTINE)] == [("n20", 900.0)]
    assert len(_new_pages(r, "domain_correlation")) == 1


def test_hold_keeps_the_domain_s_work_where_it_is() -> None:
    text = default_policy_text().replace("  action: no_new_work\n", "  action: hold\n")
    r = Run(policy=parse_policy(text))
    r.steps(0, 1800, 60, _cooling({16 + k: 0.0 for k in range(8)}))
    assert not r.of(IntentKind.QUARANTINE)
    assert not [i for i in r.intents if i.reason.startswith("held:")]
    assert r.state.entities["n16"].blocked == "domain:rack=r2"
    assert _new_pages(r)[0].params["action"] == "hold"


def test_an_xid_storm_across_a_rack_goes_to_the_jobs_and_the_rack_not_to_each_node() -> None:
    """Two jobs on rack r1 are killed (Xid 45 on every node, a job's crash): each node has seen two jobs
    crash, which alone blames the node; across the rack it is the rack's event."""
    r = Run()

    def make(t: float) -> list:
        if t < 600:
            return _fleet({})
        job = "train-a" if t < 1200 else "train-b"
        lab = {n: {"job": job} for n in range(8, 16)}
        return _fleet({}, labels=lab, flags={n: ("xid:45",) for n in range(8, 16)})

    r.steps(0, 2400, 60, make)
    assert not r.of(IntentKind.QUARANTINE)
    jobs = {p.entity: p for p in _new_pages(r, "app_xid:job")}
    assert set(jobs) == {"job/train-a", "job/train-b"}
    assert jobs["job/train-a"].params["domains"] == ["rack=r1"]  # the ticket names the rack its crash covered
    (dom,) = _new_pages(r, "domain_correlation")
    assert dom.entity == "domain/rack=r1" and dom.params["n_nodes"] == 8
    assert dom.params["signals"] == ["attribution:app_xid:2_jobs"]


def test_a_node_isolated_long_before_does_not_make_an_event_with_two_fresh_ones() -> None:
    r = Run()
    r.steps(0, 7200, 60, _cooling({16: 0.0, 17: 5400.0, 18: 5400.0}, end=10**9))
    assert r.st("n16") == State.QUARANTINED
    assert not _new_pages(r, "domain_correlation")


def test_domain_policy_errors_name_the_key_and_the_line() -> None:
    text = default_policy_text().replace("  labels: [rack, nvlink_domain, switch, power_zone, cooling_zone]\n",
                                         "  labels: [rack, row]\n")
    line = text.splitlines().index("  labels: [rack, row]") + 1  # the key's own line, not the section's
    with pytest.raises(PolicyError, match=rf"p.yaml:{line}: domains.labels: \['row'\] are not in metadata_labels"):
        parse_policy(text, "p.yaml")
    bad = default_policy_text().replace("  action: no_new_work\n", "  action: drain\n")
    with pytest.raises(PolicyError, match=r"p.yaml:\d+: domains.action: .*'hold' or 'no_new_work'"):
        parse_policy(bad, "p.yaml")
    assert default_policy().domains.window_s == 1800.0  # written as 30m


def test_one_event_seen_through_several_labels_is_one_page() -> None:
    """Each rack is also its NVLink domain (NVL72), and a cooling zone spans racks r2 and r3: a hot rack is
    paged once, as the rack (the first label of the policy that has these nodes); the whole zone going hot
    is the zone's event, not three."""
    def labels(i: int) -> dict[str, str]:
        return {"nvlink_domain": f"nvl{i // PER_RACK}", "cooling_zone": f"z{i // (2 * PER_RACK)}"}

    def run(bad: range) -> list:
        r = Run()
        r.steps(0, 1200, 60, lambda t: _fleet({n: (0.2, "min:thermal") for n in bad},
                                              labels={i: labels(i) for i in range(RACKS * PER_RACK)}))
        assert not r.of(IntentKind.QUARANTINE)
        return [(p.entity, p.params["n_nodes"]) for p in _new_pages(r)]

    assert run(range(16, 24)) == [("domain/rack=r2", 8)]  # rack r2 = nvl2; the zone z1 has 8 of 16 too
    assert run(range(16, 32)) == [("domain/cooling_zone=z1", 16)]


def _with_domains(**kw: object) -> Run:
    p = default_policy()
    return Run(policy=p.model_copy(update={"domains": p.domains.model_copy(update=kw)}))


def test_who_counts_and_the_thresholds() -> None:
    """min_nodes and fraction both hold, exactly; a node at min_confidence counts, one at degraded_below
    does not; a confirmed hard gate and a stray bad node of another rack are passed over."""
    bad = {16: (0.0, "gate:kernel_fallen_off"), 17: (0.2, "min:a"), 18: (0.2, "min:b"), 19: (0.2, "min:c"),
           21: (0.7, "min:x"), 3: (0.2, "min:z")}

    def fleet(extra: dict[int, tuple[float, str]], conf20: float = 0.5) -> list:
        out = _fleet({**bad, **extra})
        out[20] = tup("n20", 0.2, conf=conf20, reason="min:d", labels=out[20].labels)
        return out

    def pages(r: Run, extra: dict[int, tuple[float, str]] | None = None, conf20: float = 0.5) -> list:
        r.steps(0, 600, 60, lambda t: fleet(extra or {}, conf20))
        return [p for p in _new_pages(r) if p.reason == "domain_correlation"]

    # n17-n20: 4 of 8 = fraction 0.5 exactly (n16 is hardware, n21 sits at degraded_below)
    (page,) = pages(_with_domains(fraction=0.5, min_nodes=4))
    assert page.params["nodes"] == ["n17", "n18", "n19", "n20"]
    assert page.params["summary"].startswith("rack r2: 4 of 8 nodes unhealthy together (min:a, min:b, min:c, ...);")
    assert not pages(_with_domains(fraction=0.5, min_nodes=4), conf20=0.49)  # n20 below min_confidence
    assert not pages(_with_domains(fraction=0.5, min_nodes=5))  # min_nodes not met, fraction is
    assert not pages(_with_domains(fraction=0.6, min_nodes=4))  # fraction not met, min_nodes is
    # a suspect version explains its nodes: rack r2's bad nodes all run the new driver
    drv = {i: {"driver_version": "v2"} for i in range(17, 21)}
    r = _with_domains(fraction=0.5, min_nodes=4)
    r.steps(0, 600, 60, lambda t: [tup(x.entity, x.value, x.confidence, x.reason,
                                       labels={**x.labels, **drv.get(i, {})})
                                   for i, x in enumerate(fleet({}))])
    assert [p.reason for p in _new_pages(r)] == ["version_correlation"]


def test_an_open_domain_incident_still_holds_its_last_bad_nodes() -> None:
    """The rack cools down but two nodes stay hot: fewer than min_nodes, yet the incident is open for
    incident_clear_s, and until then they are held, not quarantined."""
    r = Run()
    onsets = {16 + k: 0.0 for k in range(8)}
    hot = _cooling(onsets, end=1800.0)
    r.steps(0, 3600, 60, lambda t: hot(t) if t < 1800 else _fleet({16: (0.2, "min:thermal"), 17: (0.2, "min:thermal")}))
    (resolved,) = [p for p in r.of(IntentKind.PAGE) if p.params.get("state") == "resolved"]
    assert resolved.ts == 1740.0 + 900.0  # the last cycle it held, plus incident_clear_s
    # held up to the cycle that resolves it; the next cycle it is a node on its own (budget: one an hour)
    assert [(i.entity, i.ts) for i in r.of(IntentKind.QUARANTINE)] == [("n16", resolved.ts + 60)]


def _zones(bad_racks: set[int]):  # type: ignore[no-untyped-def]
    """Racks r0-r2 behind power zone pz0, r3-r5 behind pz1, every node on driver v1; the nodes of
    ``bad_racks`` power-braked (score 0.2) from the start."""
    zone = {i: {"power_zone": f"pz{i // (3 * PER_RACK)}"} for i in range(RACKS * PER_RACK)}

    def make(t: float) -> list:
        return _fleet({i: (0.2, "min:clocks") for i in range(RACKS * PER_RACK) if i // PER_RACK in bad_racks},
                      labels=zone)
    return make


def test_half_a_small_fleet_in_one_power_zone_is_the_zone_not_the_driver_every_node_runs() -> None:
    """A brownout of pz1 takes half the fleet (24 of 48 nodes, all on the one driver there is): a version
    with no contrast would be 'suspect' at 50%, but one domain holds every bad node, so the zone pages."""
    r = Run()
    r.steps(0, 1800, 60, _zones({3, 4, 5}))
    assert not r.of(IntentKind.QUARANTINE) and not r.of(IntentKind.DRAIN)
    assert not _new_pages(r, "version_correlation")
    assert [p.entity for p in _new_pages(r, "domain_correlation")] == ["domain/power_zone=pz1"]


def test_half_a_fleet_spread_over_domains_still_suspects_the_version() -> None:
    r = Run()
    r.steps(0, 1800, 60, _zones({0, 2, 4}))
    assert [p.entity for p in _new_pages(r, "version_correlation")] == ["version/driver_version=v1"]

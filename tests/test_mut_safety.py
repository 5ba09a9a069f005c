"""decide/safety.py at its edges (issue 21): what an operator reads from the safety rules. The fleet
confidence alert's numbers (firing and resolved) on both the fast and the plain decider; the job ticket of
an application Xid storm (one job, the Xids it logged over the window, the rack its crash covered, no
"unknown" job from the node's rolled-up flags); a version over-represented exactly twice against the rest
of the fleet, which is not a suspect (more than twice is); a rack's domain event holding its nodes instead
of draining them."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import default_policy
from fleethealth.score.health import HealthTuple

POL = default_policy()


def _run(fast: bool) -> Run:
    r = Run()
    r.decider = Decider(r.policy, fast=fast)
    return r


def _confidence_fleet(n_unknown: int) -> list:
    return [tup(f"n{i:02d}", None, conf=0.0) if i < n_unknown else tup(f"n{i:02d}", 0.97) for i in range(30)]


@pytest.mark.parametrize("fast", [True, False])
def test_the_fleet_confidence_alert_says_how_many_were_low_of_how_many_and_what_it_did(fast: bool) -> None:
    r = _run(fast)
    r.steps(0, 300, 15, lambda t: _confidence_fleet(0))
    assert not r.of(IntentKind.FLEET_ALERT)
    # 10 of 30 nodes go silent together (a third of the fleet, above low_confidence_fraction 0.2)
    r.steps(315, 600, 15, lambda t: _confidence_fleet(10))
    # 1 of 30 still silent (0.0333): below the threshold, the freeze ends
    r.steps(615, 630, 15, lambda t: _confidence_fleet(1))
    alerts = r.of(IntentKind.FLEET_ALERT)
    assert [(a.ts, a.entity, a.reason) for a in alerts] == [(315.0, "fleet", "fleet_confidence_low"),
                                                           (615.0, "fleet", "fleet_confidence_restored")]
    firing, resolved = ({k: v for k, v in a.params.items() if k != "n"} for a in alerts)
    assert firing == {"state": "firing", "low": 10, "total": 30, "fraction": 0.3333, "remediation": "frozen"}
    assert resolved == {"state": "resolved", "low": 1, "total": 30, "fraction": 0.0333, "remediation": "resumed"}
    # frozen: nobody was drained or quarantined for going silent
    assert not r.of(IntentKind.QUARANTINE) and not r.of(IntentKind.DRAIN)
    assert all(s.state != State.QUARANTINED for s in r.state.entities.values())


def _gpu(node: str, job: str, flag: str, rack: str) -> HealthTuple:
    return tup(f"{node}/gpu0", 0.98, kind="gpu", labels={"job": job, "node": node, "rack": rack}, flags=(flag,))


def test_a_job_ticket_lists_every_xid_the_job_logged_and_the_rack_its_crash_covered() -> None:
    """Xid 13 on three nodes of rack r1, then (a later cycle) the Xid 45 cleanup: one ticket for the job,
    updated with both Xids; the nodes' own tuples carry the same flags rolled up and add no "unknown"
    job."""
    r = Run()
    nodes = ["n1", "n2", "n3"]

    def make(flag: str | None) -> list[HealthTuple]:
        out = [tup(n, 0.98, labels={"rack": "r1"}, flags=(flag,) if flag else ()) for n in nodes]
        out.append(tup("n4", 0.98, labels={"rack": "r2"}))
        if flag:
            out += [_gpu(n, "llama-train", flag, "r1") for n in nodes]
        return out

    r.steps(0, 60, 15, lambda t: make(None))
    r.step(75, make("xid:13"))
    later = 75 + POL.budgets.incident_update_s
    r.step(later, make("xid:45"))
    tickets = [p for p in r.of(IntentKind.PAGE) if p.reason == "app_xid:job"]
    assert {p.entity for p in tickets} == {"job/llama-train"}  # no job/unknown from the nodes' own flags
    first, last = tickets[0], tickets[-1]
    assert incidents.is_new_page(first.params) and first.ts == 75.0
    assert first.params["severity"] == "ticket" and first.params["xids"] == ["xid:13"]
    assert first.params["nodes"] == nodes and first.params["n_nodes"] == 3
    assert first.params["domains"] == ["rack=r1"]  # three nodes of one rack: domains.min_nodes
    assert last.ts == later and last.params["xids"] == ["xid:13", "xid:45"]  # all it logged, not only 45
    assert not r.of(IntentKind.QUARANTINE)


def test_two_nodes_of_a_rack_are_not_the_rack_on_a_job_ticket() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.98, labels={"rack": "r1"}), tup("n2", 0.98, labels={"rack": "r1"})]
           + [_gpu(n, "job-a", "xid:13", "r1") for n in ("n1", "n2")])
    (ticket,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "app_xid:job"]
    assert ticket.params["n_nodes"] == 2 and ticket.params["domains"] == []


def _version_fleet(bad_new: int, bad_old: int) -> list:
    """30 nodes: n00-n09 on driver 575.1, n10-n29 on 550.9; the first ``bad_new`` / ``bad_old`` of each
    read 0.2 (below degraded_below)."""
    out = []
    for i in range(30):
        new = i < 10
        bad = i < bad_new if new else i - 10 < bad_old
        out.append(tup(f"n{i:02d}", 0.2 if bad else 0.97,
                       labels={"pool": "a100", "driver_version": "575.1" if new else "550.9"}))
    return out


def test_a_version_failing_exactly_twice_as_often_as_the_rest_is_not_suspect() -> None:
    """575.1: 4 of 10 unhealthy (0.4); 550.9: 4 of 20 (0.2). Twice the rate is not "more than twice":
    no version page, and the nodes are decided on their own."""
    r = Run()
    r.steps(0, 120, 15, lambda t: _version_fleet(4, 4))
    assert not [p for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"]


def test_a_version_failing_more_than_twice_as_often_as_the_rest_is_suspect() -> None:
    r = Run()
    r.steps(0, 120, 15, lambda t: _version_fleet(5, 4))  # 0.5 against 0.2
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"]
    assert page.entity == "version/driver_version=575.1"
    assert (page.params["unhealthy"], page.params["unhealthy_total"], page.params["population"]) == (5, 9, 10)


def test_a_rack_running_hot_together_holds_its_nodes_instead_of_draining_them() -> None:
    r = Run()

    def make(t: float) -> list:
        out = []
        for i in range(24):
            hot = 8 <= i < 11
            out.append(tup(f"n{i:02d}", 0.2 if hot else 0.97, reason="min:thermal" if hot else None,
                           labels={"pool": "h100", "rack": f"r{i // 8}"}))
        return out

    r.steps(0, 900, 30, make)
    assert not r.of(IntentKind.QUARANTINE) and not r.of(IntentKind.DRAIN)
    held = {i.entity for i in r.of(IntentKind.NO_NEW_WORK) if i.reason == "held:domain:rack=r1"}
    assert held == {"n08", "n09", "n10"}
    assert all(r.st(f"n{i:02d}") != State.QUARANTINED for i in range(24))


# --- the second 10% sample (`--only '*__mutmut_*5'`): presence, the threshold itself, peers, budgets ---


@pytest.mark.parametrize("fast", [True, False])
def test_a_fifth_of_the_fleet_silent_is_exactly_the_threshold_and_freezes(fast: bool) -> None:
    r = _run(fast)
    r.steps(0, 300, 15, lambda t: _confidence_fleet(0))
    r.step(315, _confidence_fleet(6))  # 6 of 30 = low_confidence_fraction 0.2: at the threshold is over it
    (alert,) = r.of(IntentKind.FLEET_ALERT)
    assert alert.params["state"] == "firing" and (alert.params["low"], alert.params["total"]) == (6, 30)
    assert alert.params["fraction"] == 0.2


@pytest.mark.parametrize("fast", [True, False])
def test_nodes_that_vanish_from_the_scrape_count_as_silent_within_the_grace(fast: bool) -> None:
    """A third of the fleet stops being reported at all (no tuple, not an unknown one): within
    ABSENT_GRACE_S that is a metrics outage, and remediation freezes."""
    r = _run(fast)
    t0 = 1_767_000_000.0  # a real clock: the grace is measured from the absence, not from 0
    r.steps(t0, t0 + 300, 15, lambda t: _confidence_fleet(0))
    r.step(t0 + 315, _confidence_fleet(0)[10:])
    (alert,) = r.of(IntentKind.FLEET_ALERT)
    assert (alert.params["state"], alert.params["low"], alert.params["total"]) == ("firing", 10, 30)
    assert r.state.entities["n00"].absent_since == t0 + 315


@pytest.mark.parametrize("fast", [True, False])
def test_a_silent_quarantined_node_is_not_counted_by_either_decider(fast: bool) -> None:
    r = _run(fast)
    r.step(0, [tup("n00", 0.0, reason="gate:oom_device_fault", labels={"pool": "a100"})]
           + [tup(f"n{i:02d}", 0.97, labels={"pool": "a100"}) for i in range(1, 5)])
    assert r.st("n00") == State.QUARANTINED
    r.steps(15, 600, 15, lambda t: [tup(f"n{i:02d}", 0.97, labels={"pool": "a100"}) for i in range(1, 5)])
    assert not r.of(IntentKind.FLEET_ALERT)  # 0 of 4 in service low; the powered-off node is not one


def test_a_node_that_comes_back_is_present_again_and_its_next_absence_starts_anew() -> None:
    r = Run()
    r.steps(0, 120, 15, lambda t: _confidence_fleet(0))
    r.step(135, _confidence_fleet(0)[1:])  # n00 missing from one scrape
    assert r.state.entities["n00"].absent_since == 135.0
    r.steps(150, 300, 15, lambda t: _confidence_fleet(0))
    assert r.state.entities["n00"].absent_since is None
    r.steps(315, 330, 15, lambda t: _confidence_fleet(0)[1:])
    assert r.state.entities["n00"].absent_since == 315.0
    assert r.st("n00") == State.READY and not r.of(IntentKind.FLEET_ALERT)


def test_other_shards_silent_entities_count_toward_the_freeze() -> None:
    """This shard's 10 nodes are all fine; the other shards report 20 in service, 10 of them low: 10 of
    30 fleet-wide is a telemetry outage here too."""
    r = Run()
    nodes = [tup(f"n{i:02d}", 0.97) for i in range(10)]
    for t in range(0, 121, 15):
        d = r.decider.decide(r.state, nodes, float(t), fleet_peers=(20, 10 if t >= 60 else 0))
        r.state = d.state
        r.intents += d.intents
    (alert,) = r.of(IntentKind.FLEET_ALERT)
    assert (alert.ts, alert.params["low"], alert.params["total"]) == (60.0, 10, 30)


def test_an_xid_on_a_node_without_a_job_label_goes_to_the_unknown_job() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.98, flags=("xid:13",)), tup("n2", 0.98)])
    (ticket,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "app_xid:job"]
    assert ticket.entity == "job/unknown" and ticket.params["job"] == "unknown"
    assert ticket.params["nodes"] == ["n1"]


def test_a_job_ticket_lists_at_most_twenty_nodes_and_counts_them_all() -> None:
    r = Run()
    nodes = [f"n{i:02d}" for i in range(25)]
    r.step(0, [tup(n, 0.98) for n in nodes]
           + [tup(f"{n}/gpu0", 0.98, kind="gpu", labels={"job": "big", "node": n}, flags=("xid:13",))
              for n in nodes])
    (ticket,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "app_xid:job"]
    assert ticket.params["nodes"] == nodes[:20] and ticket.params["n_nodes"] == 25


@pytest.mark.parametrize("fast", [True, False])
def test_low_confidence_readings_are_not_unhealthy_for_a_version(fast: bool) -> None:
    """Three nodes on 575.1 read 0.2 at confidence 0.3 (below min_confidence): unknown, not unhealthy; the
    three bad ones the fleet has run 550.9 like everyone else. No version is suspect."""
    r = _run(fast)

    def make(t: float) -> list:
        out = [tup(f"n{i:02d}", 0.2, conf=0.3, labels={"driver_version": "575.1"}) for i in range(3)]
        out += [tup(f"n{i:02d}", 0.2 if i < 6 else 0.97, labels={"driver_version": "550.9"})
                for i in range(3, 30)]
        return out

    r.steps(0, 120, 15, make)
    assert not [p for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"]


@pytest.mark.parametrize("fast", [True, False])
def test_a_replica_build_is_suspect_while_the_nodes_are_fine(fast: bool) -> None:
    """Nodes come first in the decider's kinds: too few unhealthy nodes must not end the search before
    the replicas are looked at."""
    r = _run(fast)

    def make(t: float) -> list:
        out = [tup(f"n{i:02d}", 0.97, labels={"build": "b1"}) for i in range(10)]
        out += [tup(f"r{i:02d}", 0.2 if i < 4 else 0.97, kind="replica", worst="serving",
                    labels={"build": "v0.9" if i < 5 else "v0.8"}) for i in range(20)]
        return out

    r.steps(0, 120, 15, make)
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "version_correlation"]
    assert page.entity == "version/build=v0.9" and page.params["kind"] == "replica"
    assert page.params["unhealthy"] == 4


def test_a_node_with_a_fault_of_its_own_is_quarantined_beside_an_isolated_group_mate() -> None:
    """n00 is quarantined for a device fault; later n01, of the same tensor-parallel group, reads its own
    slowdown (a reason no mate reads; n02 and n03 are healthy): the group's job is down already, so
    n01 is quarantined too instead of held."""
    r = Run()
    labels = lambda i: {"tp_group": f"g{i // 4}"}  # noqa: E731
    r.steps(0, 60, 15, lambda t: _fleet200({0} if t >= 30 else set(), labels))
    assert r.st("n00") == State.QUARANTINED
    r.steps(75, 900, 15, lambda t: _fleet200({0}, labels, slow={1}))
    assert r.st("n01") == State.QUARANTINED
    assert not [p for p in r.of(IntentKind.PAGE) if p.reason == "tp_group_limit"]


def _fleet200(bad: set[int], labels: Callable[[int], dict[str, str]],
              slow: Collection[int] = ()) -> list[HealthTuple]:
    out = []
    for i in range(200):
        lab = {"pool": "a100", **labels(i)}
        if i in bad:
            out.append(tup(f"n{i:02d}", 0.0, reason="gate:oom_device_fault", labels=lab, worst="hardware"))
        elif i in slow:
            out.append(tup(f"n{i:02d}", 0.1, labels=lab))
        else:
            out.append(tup(f"n{i:02d}", 0.97, labels=lab))
    return out


def test_nodes_without_a_pool_label_share_the_default_pool_s_rate_budget() -> None:
    """200 unlabelled nodes, 10 failing: the default pool's rate budget is 2% of 200 = 4 an hour; the page
    names the pool, its size and which budget ran out."""
    r = Run()

    def make(t: float) -> list:
        return [tup(f"n{i:03d}", 0.0, reason="gate:oom_device_fault", worst="hardware") if i < 10
                else tup(f"n{i:03d}", 0.97) for i in range(200)]

    r.steps(0, 120, 15, make)
    assert sum(s.state == State.QUARANTINED for s in r.state.entities.values()) == 4
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    assert page.entity == "pool/default"
    assert (page.params["pool"], page.params["pool_size"], page.params["allowed"], page.params["used"]) == (
        "default", 200, 4, 4)
    assert page.params["budget"] == "rate" and page.params["window_s"] == POL.budgets.window_s
    assert page.params["kind"] == "node" and page.params["wanted"] == "n004"


def test_five_entities_are_enough_for_a_fleet_freeze() -> None:
    r = Run()
    r.steps(0, 120, 15, lambda t: [tup(f"n{i}", 0.97) for i in range(5)])
    r.step(135, [tup("n0", None, conf=0.0)] + [tup(f"n{i}", 0.97) for i in range(1, 5)])
    (alert,) = r.of(IntentKind.FLEET_ALERT)  # fleet.min_entities 5, 1 of 5 = 0.2
    assert (alert.params["low"], alert.params["total"]) == (1, 5)


def test_gpu_and_node_xids_are_charged_to_the_job_label_or_to_the_unknown_job() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.98, labels={"job": "train-x"}, flags=("xid:13",)), tup("n2", 0.98),
               tup("n2/gpu0", 0.98, kind="gpu", labels={"node": "n2"}, flags=("xid:43",))])
    tickets = {p.entity: p.params for p in r.of(IntentKind.PAGE) if p.reason == "app_xid:job"}
    assert set(tickets) == {"job/train-x", "job/unknown"}
    assert tickets["job/train-x"]["nodes"] == ["n1"] and tickets["job/unknown"]["nodes"] == ["n2"]
    assert tickets["job/unknown"]["xids"] == ["xid:43"]


def test_a_second_job_exactly_at_the_window_s_end_still_blames_the_node() -> None:
    r = Run()
    win = POL.attribution.app_xid_window_s
    r.step(0, [tup("n1", 0.98), tup("n2", 0.98), _gpu("n1", "job-a", "xid:13", "r1")])
    r.step(win, [tup("n1", 0.98), tup("n2", 0.98), _gpu("n1", "job-b", "xid:13", "r1")])
    assert r.st("n1") == State.QUARANTINED
    assert r.transitions[-1].reason == "attribution:app_xid:2_jobs"


def test_an_exhausted_hard_gate_budget_holds_with_its_own_reason() -> None:
    r = Run()
    n_bad = POL.budgets.hard_gate_min_per_hour + 3
    r.steps(0, 60, 15, lambda t: [tup(f"n{i:02d}", 0.0, reason="gate:xid", worst="hardware",
                                      labels={"pool": "a100"}) if i < n_bad
                                  else tup(f"n{i:02d}", 0.97, labels={"pool": "a100"}) for i in range(20)])
    held = {i.reason for i in r.of(IntentKind.NO_NEW_WORK) if i.soft}  # instead of the quarantine
    assert held == {"held:budget:a100:hard_gate"}
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    assert page.params["budget"] == "hard_gate"

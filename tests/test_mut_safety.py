"""decide/safety.py at its edges (issue 21): what an operator reads from the safety rules. The fleet
confidence alert's numbers (firing and resolved) on both the fast and the plain decider; the job ticket of
an application Xid storm (one job, the Xids it logged over the window, the rack its crash covered, no
"unknown" job from the node's rolled-up flags); a version over-represented exactly twice against the rest
of the fleet, which is not a suspect (more than twice is); a rack's domain event holding its nodes instead
of draining them."""

from __future__ import annotations

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
    # 3 of 30 still silent (0.1): below the threshold, the freeze ends
    r.steps(615, 630, 15, lambda t: _confidence_fleet(3))
    alerts = r.of(IntentKind.FLEET_ALERT)
    assert [(a.ts, a.entity, a.reason) for a in alerts] == [(315.0, "fleet", "fleet_confidence_low"),
                                                           (615.0, "fleet", "fleet_confidence_restored")]
    firing, resolved = ({k: v for k, v in a.params.items() if k != "n"} for a in alerts)
    assert firing == {"state": "firing", "low": 10, "total": 30, "fraction": 0.3333, "remediation": "frozen"}
    assert resolved == {"state": "resolved", "low": 3, "total": 30, "fraction": 0.1, "remediation": "resumed"}
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

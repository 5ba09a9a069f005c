"""Backtest scoring at its edges, as the report's reader sees it (issue 21): recall when the only quarantine
during an incident is of the wrong node, quarantines through a replica, within and past the grace period,
what counts as a response and how it is named, incidents merged from several truth rows, the budget of a
correlated event per pool and window, and the bookkeeping numbers of the report."""

from __future__ import annotations

import pytest

from fleethealth.backtest.arms import ArmLog
from fleethealth.backtest.metrics import Incident, incidents, node_of, score_arm
from fleethealth.backtest.runner import SlowRecord
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.policy import default_policy
from fleethealth.sim.truth import GroundTruth

T0 = 1_767_225_600.0
NODES = [f"node-{i:02d}" for i in range(10)]
POOL = {n: ("train-a" if i < 5 else "train-b") for i, n in enumerate(NODES)}
REPLICAS = {"llama-000": "node-09", "llama-001": "node-08"}


def tr(ts: float, entity: str, to: State, frm: State = State.READY, reason: str = "r") -> Transition:
    return Transition(T0 + ts, entity, "replica" if entity in REPLICAS else "node", frm, to, reason, 0.1, 1.0, "v")


def gt(entity: str, fault: str, onset: float, faulty: bool = True, action: str = "quarantine",
       kind: str = "node", group: str | None = None, end: float | None = None, detail: str = "") -> GroundTruth:
    return GroundTruth(entity, kind, fault, T0 + onset, None if end is None else T0 + end, faulty, action,  # type: ignore[arg-type]
                       detail, group)


def it(ts: float, kind: IntentKind, entity: str, reason: str = "r", **params: object) -> Intent:
    return Intent(T0 + ts, kind, entity, reason, dict(params), Tier.NODE)


def score(log: ArmLog, truths: list[GroundTruth], days: float = 1.0, slow: list[SlowRecord] | None = None,
          grace_s: float = 1800.0):  # type: ignore[no-untyped-def]
    return score_arm(log, truths, replica_node=REPLICAS, nodes=NODES, node_pool=POOL, start=T0,
                     end=T0 + days * 86400, policy=default_policy(), slow=slow or [], step_s=15.0, grace_s=grace_s)


def test_recall_when_the_only_quarantine_during_an_incident_is_of_the_wrong_node() -> None:
    truths = [gt("node-01", "nvlink_errors", 100)]
    s = score(ArmLog("x", transitions=[tr(400, "node-02", State.QUARANTINED)]), truths)
    m = s.metrics
    assert (m["recall"], m["incidents_due_quarantine"], m["incidents_caught"]) == (0.0, 1, 0)
    assert (m["precision"], m["true_quarantines"], m["false_quarantines"], m["quarantines"]) == (0.0, 0, 1, 1)
    assert s.false_quarantines == [(T0 + 400, "node-02", "healthy")]
    (o,) = s.outcomes
    assert (o.response_s, o.removal_s, o.action_ok, o.how) == (None, None, False, "")
    assert m["detection_s"] is None and m["removal_s"] is None


def test_a_replica_quarantined_on_the_faulty_node_catches_the_incident() -> None:
    truths = [gt("node-09", "ecc_dbe", 100), gt("llama-000", "ecc_dbe", 100, kind="replica")]
    s = score(ArmLog("x", transitions=[tr(160, "llama-000", State.QUARANTINED, reason="gate:xid")]), truths)
    m = s.metrics
    assert (m["recall"], m["true_quarantines"], m["false_quarantines"]) == (1.0, 1, 0)
    (o,) = s.outcomes
    assert (o.response_s, o.removal_s, o.action_ok, o.how) == (60.0, 60.0, True, "QUARANTINED:gate:xid")
    assert node_of("llama-000", REPLICAS) == "node-09"
    assert node_of("node-03/gpu2", REPLICAS) == "node-03"
    assert node_of("node-03", REPLICAS) == "node-03"


def test_grace_after_the_fault_ended() -> None:
    truths = [gt("node-01", "thermal_drift", 100, end=1000, detail="fan")]
    inside = score(ArmLog("x", transitions=[tr(1000 + 1799, "node-01", State.QUARANTINED)]), truths).metrics
    assert (inside["true_quarantines"], inside["recall"]) == (1, 1.0)
    s = score(ArmLog("x", transitions=[tr(1000 + 1800, "node-01", State.QUARANTINED)]), truths)
    assert (s.metrics["false_quarantines"], s.metrics["recall"]) == (1, 0.0)
    assert s.false_quarantines == [(T0 + 2800, "node-01", "healthy")]
    # no grace: the end itself is already past
    assert score(ArmLog("x", transitions=[tr(1000, "node-01", State.QUARANTINED)]), truths,
                 grace_s=0.0).metrics["false_quarantines"] == 1
    assert score(ArmLog("x", transitions=[tr(999, "node-01", State.QUARANTINED)]), truths,
                 grace_s=0.0).metrics["true_quarantines"] == 1
    # at the onset itself: active
    assert score(ArmLog("x", transitions=[tr(100, "node-01", State.QUARANTINED)]), truths).metrics["recall"] == 1.0


def test_why_a_quarantine_was_false_is_named() -> None:
    truths = [gt("node-03", "oom_fragmentation", 100, faulty=False, action="rebuild_worker", detail="fragmented"),
              gt("node-04", "noisy_neighbour", 100, faulty=False, action="none")]
    s = score(ArmLog("x", transitions=[tr(200, "node-03", State.QUARANTINED), tr(300, "node-04", State.QUARANTINED)]),
              truths)
    assert s.false_quarantines == [
        (T0 + 200, "node-03", "not a hardware fault: oom_fragmentation (fragmented)"),
        (T0 + 300, "node-04", "not a hardware fault: noisy_neighbour (none)")]
    # a faulty entity whose expected action is not a quarantine: still a false quarantine
    s2 = score(ArmLog("x", transitions=[tr(200, "node-05", State.QUARANTINED)]),
               [gt("node-05", "xid13_app", 100, action="page")])
    assert s2.metrics["false_quarantines"] == 1 and s2.metrics["recall"] == 1.0


def test_staying_quarantined_is_one_quarantine() -> None:
    truths = [gt("node-01", "nvlink_errors", 100)]
    log = ArmLog("x", transitions=[tr(200, "node-01", State.QUARANTINED),
                                   tr(300, "node-01", State.QUARANTINED, State.QUARANTINED)])
    m = score(log, truths).metrics
    assert (m["quarantines"], m["true_quarantines"], m["transitions"]) == (1, 1, 2)


def test_what_counts_as_a_response() -> None:
    truths = [gt("node-01", "thermal_drift", 100), gt("llama-001", "slo_burn", 100, kind="replica",
                                                        action="limit_concurrency", faulty=False)]
    # a router weight at 1 is no response; lowered below 1 is; a SET_CONDITION is not a remediation
    log = ArmLog("x", intents=[
        it(110, IntentKind.SET_WEIGHT, "llama-001", weight=1.0),
        it(120, IntentKind.SET_CONDITION, "node-01"),
        it(130, IntentKind.SET_WEIGHT, "llama-001", weight=0.5),
        it(150, IntentKind.NO_NEW_WORK, "node-01"),
        it(170, IntentKind.LIMIT_CONCURRENCY, "llama-001"),
    ], transitions=[tr(140, "node-01", State.DEGRADED, reason="below_degraded")])
    s = score(log, truths)
    by = {o.incident.node: o for o in s.outcomes}
    assert (by["node-01"].response_s, by["node-01"].how) == (40.0, "DEGRADED:below_degraded")
    assert (by["node-08"].response_s, by["node-08"].how) == (30.0, "set_weight")
    assert by["node-08"].action_ok is True and by["node-01"].action_ok is False
    assert by["node-01"].removal_s is None
    assert s.metrics["detection_s"] == pytest.approx(35.0)
    assert (s.metrics["actions_ok"], s.metrics["actions_expected"]) == (1, 2)
    # a weight given as 0 (or None) is lowered
    s0 = score(ArmLog("x", intents=[it(110, IntentKind.SET_WEIGHT, "llama-001", weight=None)]), truths)
    assert {o.incident.node: o.response_s for o in s0.outcomes}["node-08"] == 10.0


def test_responses_outside_the_incident_do_not_count_and_none_expected_is_not_scored() -> None:
    truths = [gt("node-01", "thermal_drift", 1000), gt("node-02", "benign", 100, faulty=False, action="none")]
    log = ArmLog("x", transitions=[tr(900, "node-01", State.DEGRADED), tr(1200, "node-01", State.DRAINING)])
    s = score(log, truths)
    (o,) = s.outcomes  # node-02's incident expects nothing: not an outcome
    assert o.incident.node == "node-01"
    assert (o.response_s, o.removal_s, o.how) == (200.0, 200.0, "DRAINING:r")
    assert s.metrics["removal_s"] == 200.0


def test_page_incidents_count_pages_as_responses() -> None:
    truths = [gt("node-06", "xid13_app", 500, action="page", faulty=False)]
    s = score(ArmLog("x", intents=[it(450, IntentKind.PAGE, "node-06", "event:x"),
                                   it(520, IntentKind.PAGE, "someone-else", "event:test_failed")]), truths)
    (o,) = s.outcomes
    assert (o.response_s, o.how, o.action_ok) == (20.0, "event:test_failed", True)
    assert s.metrics["pages"] == 2 and s.metrics["budget_exhaustions"] == 0


def test_schedule_reset_is_ok_only_without_a_quarantine_on_its_node() -> None:
    truths = [gt("node-04", "row_remap_pending", 100, action="schedule_reset")]
    reset = it(115, IntentKind.SCHEDULE_RESET, "node-04")
    assert [o.action_ok for o in score(ArmLog("x", intents=[reset]), truths).outcomes] == [True]
    other = [tr(200, "node-05", State.QUARANTINED)]
    assert [o.action_ok for o in score(ArmLog("x", intents=[reset], transitions=other), truths).outcomes] == [True]
    own = [tr(200, "node-04", State.QUARANTINED)]
    s = score(ArmLog("x", intents=[reset], transitions=own), truths)
    assert [o.action_ok for o in s.outcomes] == [False]
    assert s.false_quarantines == [(T0 + 200, "node-04", "needs a reset, not a repair")]
    # a reset intent for another node does not do
    assert [o.action_ok for o in score(ArmLog("x", intents=[it(115, IntentKind.SCHEDULE_RESET, "node-05")]),
                                       truths).outcomes] == [False]
    # an expected action with no intent kind (a typo in a scenario) is never ok
    odd = [gt("node-04", "x", 100, action="call_vendor")]
    assert [o.action_ok for o in score(ArmLog("x", intents=[reset]), odd).outcomes] == [False]


def test_incidents_merge_rows_of_one_fault_on_one_node() -> None:
    rows = [gt("llama-000", "build_regression", 600, faulty=False, action="page", kind="replica", group="build:x"),
            gt("node-09", "build_regression", 600, faulty=False, action="none"),
            gt("node-09/gpu1", "oom_device", 50, action="schedule_reset", kind="gpu"),
            gt("node-09", "oom_device", 50, action="quarantine", faulty=False),
            gt("node-01", "nvlink", 600, action="none", faulty=False),
            gt("node-01/gpu0", "nvlink", 600, action="page", faulty=True)]
    got = incidents(rows, REPLICAS)
    assert [(i.onset - T0, i.node, i.fault) for i in got] == [
        (50, "node-09", "oom_device"), (600, "node-01", "nvlink"), (600, "node-09", "build_regression")]
    oom, nv, build = got
    assert oom.expected == "quarantine" and oom.faulty is True and oom.entities == {"node-09/gpu1", "node-09"}
    assert nv.expected == "page" and nv.faulty is True and nv.group is None
    assert build.expected == "page" and build.faulty is False and build.group == "build:x"
    assert build.entities == {"llama-000", "node-09"}
    # an unranked action does not displace a ranked one, and beats "none"
    a = incidents([gt("node-02", "f", 1, action="page"), gt("node-02", "f", 1, action="rebuild_worker")], REPLICAS)
    assert a[0].expected == "page"
    b = incidents([gt("node-02", "f", 1, action="none"), gt("node-02", "f", 1, action="rebuild_worker")], REPLICAS)
    assert b[0].expected == "rebuild_worker"
    c = incidents([gt("node-02", "f", 1, group=None), gt("node-02/gpu1", "f", 1, kind="gpu", group="g")], REPLICAS)
    assert c[0].group == "g"
    assert Incident("f", "n", {"n"}, 10.0, None, "quarantine", True, None).active(10.0)
    assert not Incident("f", "n", {"n"}, 10.0, 20.0, "quarantine", True, None).active(20.0)
    assert Incident("f", "n", {"n"}, 10.0, 20.0, "quarantine", True, None).active(20.0, 0.5)


def test_a_correlated_event_is_judged_per_pool_and_budget_window() -> None:
    # six faulty members across two pools of five; budget max(1, floor(0.02 * 5)) = 1 per pool per hour
    members = ["node-00", "node-01", "node-02", "node-05", "node-06", "node-07"]
    truths = [gt(n, "bad_driver", 600, action="page", group="driver:x") for n in members]
    one_each = ArmLog("x", transitions=[tr(1200, "node-00", State.QUARANTINED), tr(1300, "node-05", State.QUARANTINED),
                                        tr(1200 + 3600, "node-01", State.QUARANTINED)],
                      intents=[it(700, IntentKind.PAGE, "version/driver", "version_correlation")])
    m = score(one_each, truths).metrics
    assert m["groups"] == [{"group": "driver:x", "members": 6, "faulty": 6, "quarantined": 3,
                            "budget_held": True, "paged": True}]
    assert (m["group_quarantines"], m["quarantines"], m["false_quarantines"], m["precision"]) == (3, 3, 0, 1.0)
    # two in one pool less than an hour apart: the budget did not hold; a page before the onset is not about it
    two = ArmLog("x", transitions=[tr(1200, "node-00", State.QUARANTINED),
                                   tr(1200 + 3599, "node-01", State.QUARANTINED)],
                 intents=[it(500, IntentKind.PAGE, "pool/train-a", "budget_exhausted")])
    g = score(two, truths).metrics["groups"][0]
    assert (g["budget_held"], g["paged"], g["quarantined"]) == (False, False, 2)
    # a page at the onset about the event counts; a page about one node's failed test does not
    at = ArmLog("x", intents=[it(600, IntentKind.PAGE, "pool/train-a", "tp_group_limit")])
    assert score(at, truths).metrics["groups"][0]["paged"] is True
    test_failed = ArmLog("x", intents=[it(900, IntentKind.PAGE, "node-00", "event:test_failed")])
    assert score(test_failed, truths).metrics["groups"][0]["paged"] is False


def test_flaps_per_replica_day_and_the_reports_bookkeeping() -> None:
    trs = [tr(0, "llama-000", State.WARMING, State.STARTING), tr(60, "llama-000", State.READY, State.WARMING),
           tr(100, "llama-000", State.DEGRADED), tr(200, "llama-000", State.READY, State.DEGRADED),
           tr(300, "llama-001", State.DEGRADED), tr(400, "node-03", State.DEGRADED)]
    log = ArmLog("arm-1", transitions=trs, cycles=240, cpu_s=1.23456)
    s = score(log, [], days=2.0)
    m = s.metrics
    assert s.name == "arm-1"
    assert m["flaps_per_replica_day"] == pytest.approx(1 / 2 / 2)  # llama-000 back to READY in 100 s
    assert m["transitions_per_replica_day"] == pytest.approx(3 / 2 / 2)
    assert m["flaps_per_node_day"] == 0.0 and m["transitions_per_node_day"] == pytest.approx(1 / 10 / 2)
    assert (m["transitions"], m["cycles"], m["cpu_s"]) == (6, 240, 1.235)
    assert (m["gpu_hours_lost"], m["gpu_hours_lost_if_undetected"], m["groups"]) == (0.0, 0.0, [])
    no_reps = score_arm(log, [], replica_node={}, nodes=NODES, node_pool=POOL, start=T0, end=T0 + 86400,
                        policy=default_policy())
    assert no_reps.metrics["flaps_per_replica_day"] == 0.0


def test_gpu_hours_take_the_slowest_node_of_a_job_per_step() -> None:
    # two faulty nodes in one 64-GPU job, 10% and 30% slow, for 240 steps of 15 s (one hour)
    slow = [SlowRecord(T0 + k * 15.0, n, "job-a", 64, x) for k in range(240) for n, x in
            (("node-01", 0.1), ("node-02", 0.3))]
    truths = [gt("node-01", "thermal", 0), gt("node-02", "thermal", 0)]
    m = score(ArmLog("x"), truths, slow=slow).metrics
    assert m["gpu_hours_lost"] == pytest.approx(0.3 * 64, rel=1e-9)
    # the 30% node removed at half-time: the job then runs at the 10% node's pace
    half = ArmLog("x", transitions=[tr(1800, "node-02", State.DRAINING)])
    m2 = score(half, truths, slow=slow).metrics
    assert m2["gpu_hours_lost"] == pytest.approx(0.3 * 64 / 2 + 0.1 * 64 / 2, rel=1e-9)
    assert m2["gpu_hours_lost_if_undetected"] == pytest.approx(0.3 * 64, rel=1e-9)
    assert m2["removal_s"] == pytest.approx(1800.0)


def test_the_defaults_grace_half_an_hour_steps_of_fifteen_seconds() -> None:
    truths = [gt("node-01", "thermal", 0, end=1000)]
    slow = [SlowRecord(T0 + k * 15.0, "node-01", "j", 8, 0.5) for k in range(60)]  # 15 minutes, 4 GPU-hours/h

    def default(log: ArmLog):  # type: ignore[no-untyped-def]
        return score_arm(log, truths, replica_node=REPLICAS, nodes=NODES, node_pool=POOL, start=T0,
                         end=T0 + 86400, policy=default_policy(), slow=slow)

    assert default(ArmLog("x", transitions=[tr(1000 + 1799, "node-01", State.QUARANTINED)])).metrics[
        "true_quarantines"] == 1
    m = default(ArmLog("x", transitions=[tr(1000 + 1800, "node-01", State.QUARANTINED)])).metrics
    assert m["false_quarantines"] == 1
    assert m["gpu_hours_lost"] == pytest.approx(1.0)


def test_responses_removals_pages_and_actions_inside_the_grace_after_the_end() -> None:
    # a fault that ended at 1000 s: what an arm did up to half an hour later still answers it
    q = [gt("node-01", "thermal", 0, end=1000)]
    s = score(ArmLog("x", transitions=[tr(1500, "node-01", State.DRAINING)]), q)
    (o,) = s.outcomes
    assert (o.response_s, o.removal_s) == (1500.0, 1500.0)
    pg = [gt("node-06", "xid13_app", 0, end=1000, action="page", faulty=False)]
    (o2,) = score(ArmLog("x", intents=[it(1500, IntentKind.PAGE, "node-06", "event:x")]), pg).outcomes
    assert (o2.response_s, o2.action_ok) == (1500.0, True)
    rs = [gt("node-04", "row_remap_pending", 0, end=1000, action="schedule_reset")]
    reset = it(1500, IntentKind.SCHEDULE_RESET, "node-04")
    assert [o.action_ok for o in score(ArmLog("x", intents=[reset]), rs).outcomes] == [True]
    late_q = [tr(1500, "node-04", State.QUARANTINED)]
    assert [o.action_ok for o in score(ArmLog("x", intents=[reset], transitions=late_q), rs).outcomes] == [False]


def test_two_false_quarantines_and_precision_at_one_half() -> None:
    truths = [gt("node-01", "nvlink_errors", 100)]
    m = score(ArmLog("x", transitions=[tr(400, "node-02", State.QUARANTINED), tr(500, "node-03", State.QUARANTINED)]),
              truths).metrics
    assert (m["false_quarantines"], m["precision"]) == (2, 0.0)
    m2 = score(ArmLog("x", transitions=[tr(400, "node-01", State.QUARANTINED), tr(500, "node-03", State.QUARANTINED)]),
               truths).metrics
    assert (m2["true_quarantines"], m2["false_quarantines"], m2["precision"]) == (1, 1, 0.5)


def test_a_weight_intent_without_a_weight_is_no_response() -> None:
    truths = [gt("llama-001", "slo_burn", 100, kind="replica", action="limit_concurrency", faulty=False)]
    (o,) = score(ArmLog("x", intents=[it(110, IntentKind.SET_WEIGHT, "llama-001")]), truths).outcomes
    assert o.response_s is None


def test_flaps_over_half_a_day_one_node_one_replica() -> None:
    trs = [tr(100, "n", State.DEGRADED), tr(200, "n", State.READY, State.DEGRADED), tr(300, "r", State.DEGRADED)]
    m = score_arm(ArmLog("x", transitions=trs), [], replica_node={"r": "n"}, nodes=["n"], node_pool={"n": "p"},
                  start=T0, end=T0 + 43200, policy=default_policy()).metrics
    assert m["flaps_per_node_day"] == pytest.approx(2.0) and m["transitions_per_node_day"] == pytest.approx(4.0)
    assert m["flaps_per_replica_day"] == 0.0 and m["transitions_per_replica_day"] == pytest.approx(2.0)


def test_a_large_pools_budget_scales_with_its_size() -> None:
    nodes = [f"big-{i:03d}" for i in range(150)]
    pool = dict.fromkeys(nodes, "big")
    truths = [gt(n, "bad_driver", 0, action="page", group="driver:y") for n in nodes[:10]]

    def held(k: int) -> bool:
        log = ArmLog("x", transitions=[tr(100 + i, n, State.QUARANTINED) for i, n in enumerate(nodes[:k])])
        s = score_arm(log, truths, replica_node={}, nodes=nodes, node_pool=pool, start=T0, end=T0 + 86400,
                      policy=default_policy())
        return bool(s.metrics["groups"][0]["budget_held"])

    # max(1, floor(0.02 * 150)) = 3 an hour
    assert held(3) is True
    assert held(4) is False


def test_gpu_hours_per_job_and_step_whatever_the_order() -> None:
    # two jobs on one step each lose their own slowest node; the larger slowdown first in the list
    slow = []
    for k in range(240):
        t = T0 + k * 15.0
        slow += [SlowRecord(t, "node-02", "job-a", 64, 0.3), SlowRecord(t, "node-01", "job-a", 64, 0.1),
                 SlowRecord(t, "node-03", "job-b", 16, 0.2)]
    truths = [gt(n, "thermal", 0) for n in ("node-01", "node-02", "node-03")]
    m = score(ArmLog("x"), truths, slow=slow).metrics
    assert m["gpu_hours_lost"] == pytest.approx(0.3 * 64 + 0.2 * 16)
    assert m["gpu_hours_lost_if_undetected"] == pytest.approx(0.3 * 64 + 0.2 * 16)
    # rounded to three decimals: one 15 s step of 1% on one GPU is 0.0000417 h
    tiny = [SlowRecord(T0, "node-01", "j", 1, 0.01)]
    m2 = score(ArmLog("x"), [gt("node-01", "thermal", 0)], slow=tiny).metrics
    assert (m2["gpu_hours_lost"], m2["gpu_hours_lost_if_undetected"]) == (0.0, 0.0)
    small = [SlowRecord(T0 + k * 15.0, "node-01", "j", 1, 0.5) for k in range(3)]  # 0.00625 h
    m3 = score(ArmLog("x"), [gt("node-01", "thermal", 0)], slow=small).metrics
    assert (m3["gpu_hours_lost"], m3["gpu_hours_lost_if_undetected"]) == (0.006, 0.006)


def test_incidents_keep_the_first_of_two_unranked_actions_and_let_a_page_displace_one() -> None:
    a = incidents([gt("node-02", "f", 1, action="rebuild_worker"), gt("node-02", "f", 1, action="limit_concurrency")],
                  REPLICAS)
    assert a[0].expected == "rebuild_worker"
    b = incidents([gt("node-02", "f", 1, action="rebuild_worker"), gt("node-02", "f", 1, action="page")], REPLICAS)
    assert b[0].expected == "page"


def test_a_correlated_event_on_nodes_missing_from_the_pool_map_is_still_held_to_a_budget() -> None:
    """Nodes the pool map does not know are in the default pool (as the decider counts them): their
    quarantines count against that pool's budget (they escaped every budget check before)."""
    ghosts = ["ghost-0", "ghost-1", "ghost-2"]  # in no pool and not in NODES
    truths = [gt(n, "bad_driver", 600, action="page", group="driver:z") for n in ghosts]
    three = ArmLog("x", transitions=[tr(1200 + 60 * i, n, State.QUARANTINED) for i, n in enumerate(ghosts)])
    g = score(three, truths).metrics["groups"][0]
    assert (g["quarantined"], g["budget_held"]) == (3, False)  # max(1, 2% of 0) = 1 an hour, 3 taken
    one = ArmLog("x", transitions=[tr(1200, "ghost-0", State.QUARANTINED), tr(1200 + 3600, "ghost-1", State.QUARANTINED)])
    assert score(one, truths).metrics["groups"][0]["budget_held"] is True


def test_the_job_slowdown_is_reported_under_its_current_names_as_under_the_old_ones() -> None:
    """``job_slowdown_gpu_h`` and ``..._if_undetected`` (the printed "job GPU-h lost, slow undetected") are
    the figures the report reads; the old names are aliases. Both rounded to three decimals."""
    small = [SlowRecord(T0 + k * 15.0, "node-01", "j", 1, 0.5) for k in range(3)]  # 0.00625 h
    caught = ArmLog("x", transitions=[tr(30, "node-01", State.QUARANTINED)])  # removed after two steps
    m = score(caught, [gt("node-01", "thermal", 0)], slow=small).metrics
    assert (m["job_slowdown_gpu_h"], m["job_slowdown_gpu_h_if_undetected"]) == (0.004, 0.006)
    assert (m["gpu_hours_lost"], m["gpu_hours_lost_if_undetected"]) == (0.004, 0.006)
    tiny = [SlowRecord(T0, "node-01", "j", 1, 0.01)]  # 0.0000417 h
    m2 = score(ArmLog("x"), [gt("node-01", "thermal", 0)], slow=tiny).metrics
    assert (m2["job_slowdown_gpu_h"], m2["job_slowdown_gpu_h_if_undetected"]) == (0.0, 0.0)


def test_a_return_after_a_restart_through_warm_up_is_no_flap() -> None:
    # node-03 degraded, restarted (STARTING) and, once warm, degraded again within the flap window: the
    # restart ends the episode, so the second DEGRADED is no return to the state the first one left
    trs = [tr(0, "node-03", State.DEGRADED), tr(60, "node-03", State.STARTING, State.DEGRADED),
           tr(120, "node-03", State.READY, State.STARTING), tr(180, "node-03", State.DEGRADED)]
    m = score(ArmLog("x", transitions=trs), []).metrics
    assert m["flaps_per_node_day"] == 0.0
    assert m["transitions_per_node_day"] == pytest.approx(3 / 10)  # the way out of STARTING is not counted


def test_only_new_pages_count_and_other_intents_are_no_pages() -> None:
    log = ArmLog("x", intents=[it(100, IntentKind.PAGE, "pool/train-a", "budget_exhausted"),
                               it(200, IntentKind.PAGE, "pool/train-a", "budget_exhausted", state="update"),
                               it(300, IntentKind.PAGE, "pool/train-a", "budget_exhausted", state="resolved"),
                               it(400, IntentKind.DRAIN, "node-01", "budget_exhausted"),
                               it(500, IntentKind.SET_WEIGHT, "llama-000", "budget_exhausted", weight=0.5)])
    m = score(log, []).metrics
    assert (m["pages"], m["budget_exhaustions"]) == (1, 1)


def test_a_correlated_events_hard_gate_quarantines_spend_their_own_budget() -> None:
    """Confirmed hard gates (Xid, ECC DBE, ...) spend ``hard:`` budget: max(3, 10% of the pool) an hour,
    next to the ordinary max(1, 2%); three Xid quarantines in an hour of a pool of five hold the budget,
    three ordinary ones do not."""
    members = ["node-00", "node-01", "node-02"]
    truths = [gt(n, "xid_79", 600, group="xid:x") for n in members]
    hard = ArmLog("x", transitions=[tr(1200 + 60 * i, n, State.QUARANTINED, reason="gate:xid")
                                    for i, n in enumerate(members)])
    assert score(hard, truths).metrics["groups"][0]["budget_held"] is True
    four = truths + [gt("node-03", "xid_79", 600, group="xid:x")]
    hard4 = ArmLog("x", transitions=[tr(1200 + 60 * i, n, State.QUARANTINED, reason="gate:xid")
                                     for i, n in enumerate(members + ["node-03"])])
    assert score(hard4, four).metrics["groups"][0]["budget_held"] is False
    soft = ArmLog("x", transitions=[tr(1200 + 60 * i, n, State.QUARANTINED, reason="min:thermal")
                                    for i, n in enumerate(members)])
    assert score(soft, truths).metrics["groups"][0]["budget_held"] is False
    # one ordinary and three hard in the hour: each budget holds on its own
    mixed = ArmLog("x", transitions=[*hard4.transitions[:3], tr(1500, "node-03", State.QUARANTINED)])
    assert score(mixed, four).metrics["groups"][0]["budget_held"] is True


def test_nodes_missing_from_the_pool_map_share_the_budget_of_the_pool_named_default() -> None:
    ghosts = ["ghost-0", "ghost-1"]
    truths = [gt(n, "bad_driver", 600, action="page", group="driver:z") for n in ghosts]
    log = ArmLog("x", transitions=[tr(1200, "ghost-0", State.QUARANTINED), tr(1300, "ghost-1", State.QUARANTINED)])
    # with 100 known nodes in the pool 'default' its budget is 2 an hour: the two unmapped nodes fit in it
    big = [f"d-{i:03d}" for i in range(100)]
    m = score_arm(log, truths, replica_node={}, nodes=big + ghosts, node_pool=dict.fromkeys(big, "default"),
                  start=T0, end=T0 + 86400, policy=default_policy())
    assert m.metrics["groups"][0]["budget_held"] is True


def test_flaps_and_transitions_per_replica_day_with_one_replica_and_with_none() -> None:
    trs = [tr(100, "llama-000", State.DEGRADED), tr(200, "llama-000", State.READY, State.DEGRADED)]
    m = score_arm(ArmLog("x", transitions=trs), [], replica_node={"llama-000": "node-09"}, nodes=NODES,
                  node_pool=POOL, start=T0, end=T0 + 86400, policy=default_policy()).metrics
    assert (m["flaps_per_replica_day"], m["transitions_per_replica_day"]) == (1.0, 2.0)
    none = score_arm(ArmLog("x", transitions=trs), [], replica_node={}, nodes=NODES, node_pool=POOL, start=T0,
                     end=T0 + 86400, policy=default_policy()).metrics
    assert (none["flaps_per_replica_day"], none["transitions_per_replica_day"]) == (0.0, 0.0)

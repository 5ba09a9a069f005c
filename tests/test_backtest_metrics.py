"""Backtest scoring against ground truth on hand-made decisions: definitions of precision and recall
(including when undefined), reset-vs-repair, correlated groups and budgets, flapping, the seed's GPU-hours
arithmetic; and the simulator's OOM context mapped onto the OOM classifier's classes."""

from __future__ import annotations

import pytest

from fleethealth.backtest.arms import ArmLog
from fleethealth.backtest.events import World, oom_event
from fleethealth.backtest.metrics import score_arm
from fleethealth.backtest.runner import SlowRecord
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.decide.oom import OomClass, OomEvent, classify_oom
from fleethealth.policy import default_policy
from fleethealth.sim.truth import GroundTruth, SimEvent

T0 = 1_767_225_600.0
NODES = [f"node-{i:02d}" for i in range(10)]
POOL = {n: "train-a" for n in NODES}
REPLICAS = {"llama-000": "node-09"}


def tr(ts: float, entity: str, to: State, frm: State = State.READY, reason: str = "r") -> Transition:
    return Transition(T0 + ts, entity, "replica" if entity in REPLICAS else "node", frm, to, reason, 0.1, 1.0, "v")


def gt(entity: str, fault: str, onset: float, faulty: bool = True, action: str = "quarantine",
       kind: str = "node", group: str | None = None, end: float | None = None) -> GroundTruth:
    return GroundTruth(entity, kind, fault, T0 + onset, None if end is None else T0 + end, faulty, action, "",
                       group)  # type: ignore[arg-type]


def score(log: ArmLog, truths: list[GroundTruth], days: float = 1.0, slow: list[SlowRecord] | None = None):  # type: ignore[no-untyped-def]
    return score_arm(log, truths, replica_node=REPLICAS, nodes=NODES, node_pool=POOL, start=T0,
                     end=T0 + days * 86400, policy=default_policy(), slow=slow or [], step_s=15.0)


def test_true_and_false_quarantines_and_times() -> None:
    truths = [gt("node-01/gpu3", "xid79_off_bus", 3600, kind="gpu"), gt("node-01", "xid79_off_bus", 3600),
              gt("node-02", "thermal_drift", 7200)]
    log = ArmLog("x", transitions=[
        tr(3615, "node-01", State.QUARANTINED, reason="gate:xid"),
        tr(9000, "node-02", State.DEGRADED), tr(9300, "node-02", State.QUARANTINED, State.DEGRADED),
        tr(20000, "node-05", State.QUARANTINED),
    ])
    m = score(log, truths).metrics
    assert m["quarantines"] == 3 and m["true_quarantines"] == 2 and m["false_quarantines"] == 1
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == 1.0
    # responses: 15 s (gate) and 1800 s (DEGRADED); removals 15 s and 2100 s
    assert m["detection_s"] == pytest.approx((15 + 1800) / 2)
    assert m["removal_s"] == pytest.approx((15 + 2100) / 2)


def test_undefined_precision_and_recall_read_one() -> None:
    m = score(ArmLog("x"), []).metrics
    assert m["precision"] is None and m["recall"] == 1.0 and m["quarantines"] == 0  # n/a: none quarantined
    assert m["detection_s"] is None and m["removal_s"] is None
    # a miss: no quarantine (precision n/a, nothing was quarantined), recall 0
    m = score(ArmLog("x"), [gt("node-03", "nvlink_errors", 100)]).metrics
    assert m["precision"] is None and m["recall"] == 0.0


def test_quarantine_before_onset_is_false() -> None:
    m = score(ArmLog("x", transitions=[tr(50, "node-03", State.QUARANTINED)]),
              [gt("node-03", "nvlink_errors", 100)]).metrics
    assert m["false_quarantines"] == 1 and m["recall"] == 0.0


def test_pending_remap_wants_a_reset_not_a_quarantine() -> None:
    truths = [gt("node-04/gpu2", "row_remap_pending", 100, action="schedule_reset", kind="gpu"),
              gt("node-04", "row_remap_pending", 100, action="schedule_reset")]
    good = ArmLog("good", intents=[Intent(T0 + 115, IntentKind.SCHEDULE_RESET, "node-04", "row_remap_pending",
                                          {}, Tier.NODE)])
    s = score(good, truths)
    assert s.metrics["false_quarantines"] == 0 and s.metrics["recall"] == 1.0
    assert [o.action_ok for o in s.outcomes] == [True] and s.outcomes[0].response_s == 15
    bad = ArmLog("bad", transitions=[tr(115, "node-04", State.QUARANTINED, reason="static:xid_63")])
    s = score(bad, truths)
    assert s.metrics["false_quarantines"] == 1
    assert s.false_quarantines[0][2] == "needs a reset, not a repair"
    assert [o.action_ok for o in s.outcomes] == [False]


def test_correlated_group_budget_and_page() -> None:
    truths = [gt(n, "bad_driver_rollout", 600, action="page", group="driver:pool:train-a") for n in NODES[:6]]
    # budget: max(1, floor(0.02 * 10)) = 1 per hour
    one = ArmLog("one", transitions=[tr(1200, "node-00", State.QUARANTINED)],
                 intents=[Intent(T0 + 1300, IntentKind.PAGE, "pool/train-a", "budget_exhausted", {}, None)])
    m = score(one, truths).metrics
    assert m["groups"] == [{"group": "driver:pool:train-a", "members": 6, "faulty": 6, "quarantined": 1,
                            "budget_held": True, "paged": True}]
    assert m["false_quarantines"] == 0 and m["budget_exhaustions"] == 1 and m["pages"] == 1
    many = ArmLog("many", transitions=[tr(1200 + k, n, State.QUARANTINED) for k, n in enumerate(NODES[:6])])
    g = score(many, truths).metrics["groups"][0]
    assert g["budget_held"] is False and g["paged"] is False and g["quarantined"] == 6


def test_regressed_build_wants_a_page_about_the_version_not_quarantines() -> None:
    truths = [gt("llama-000", "serving_build_regression", 600, faulty=False, action="page", kind="replica",
                 group="build:v0.7.0"),
              gt("node-09", "serving_build_regression", 600, faulty=False, action="none")]
    failed_page = Intent(T0 + 900, IntentKind.PAGE, "node-03", "event:test_failed", {}, None)
    s = score(ArmLog("q", transitions=[tr(900, "llama-000", State.QUARANTINED)], intents=[failed_page]), truths)
    assert s.metrics["false_quarantines"] == 1 and s.metrics["precision"] == 0.0
    assert [o.action_ok for o in s.outcomes] == [False]
    version_page = Intent(T0 + 700, IntentKind.PAGE, "version/build=v0.7.0", "version_correlation", {}, None)
    s = score(ArmLog("p", intents=[version_page]), truths)
    assert s.metrics["quarantines"] == 0 and [o.action_ok for o in s.outcomes] == [True]
    assert s.outcomes[0].response_s == 100


def test_flaps_exclude_warm_up() -> None:
    trs = []
    for n in NODES:
        trs += [tr(0, n, State.WARMING, State.STARTING), tr(60, n, State.READY, State.WARMING)]
    trs += [tr(5000, "node-07", State.DEGRADED), tr(6000, "node-07", State.READY, State.DEGRADED)]
    m = score(ArmLog("x", transitions=trs), [], days=2.0).metrics
    assert m["flaps_per_node_day"] == pytest.approx(1 / 10 / 2)  # READY -> DEGRADED -> READY inside an hour
    assert m["transitions_per_node_day"] == pytest.approx(2 / 10 / 2)


def test_a_flap_is_a_quick_return_and_remediation_is_not_one() -> None:
    from fleethealth.backtest.metrics import FLAP_WINDOW_S, flap_counts

    trs = [tr(0, "node-01", State.QUARANTINED), tr(600, "node-01", State.RECOVERING, State.QUARANTINED),
           tr(2400, "node-01", State.READY, State.RECOVERING),  # remediation ran its course: no flap
           tr(0, "node-02", State.DEGRADED), tr(FLAP_WINDOW_S, "node-02", State.READY, State.DEGRADED),  # slow
           tr(0, "node-03", State.DEGRADED), tr(300, "node-03", State.READY, State.DEGRADED),
           tr(400, "node-03", State.DEGRADED), tr(500, "node-03", State.READY, State.DEGRADED)]
    assert flap_counts(trs) == {"node-03": 3}
    m = score(ArmLog("x", transitions=trs), [], days=1.0).metrics
    assert m["flaps_per_node_day"] == pytest.approx(3 / 10)
    assert m["transitions_per_node_day"] == pytest.approx(9 / 10)


def test_gpu_hours_lost_follow_the_seed_arithmetic() -> None:
    # a 2% slow node in a 512-GPU job for a whole day costs 2% of 12,288 GPU-hours (~245)
    slow = [SlowRecord(T0 + k * 15.0, "node-02", "pretrain", 512, 0.02) for k in range(5760)]
    truths = [gt("node-02", "thermal_drift", 0)]
    m = score(ArmLog("never"), truths, slow=slow).metrics
    assert m["gpu_hours_lost"] == pytest.approx(245.76, rel=1e-6)
    half = ArmLog("half", transitions=[tr(43200, "node-02", State.QUARANTINED)])
    m = score(half, truths, slow=slow).metrics
    assert m["gpu_hours_lost"] == pytest.approx(245.76 / 2, rel=1e-3)
    assert m["gpu_hours_lost_if_undetected"] == pytest.approx(245.76, rel=1e-6)


@pytest.mark.parametrize(("cls", "ctx", "want"), [
    ("single_request", {"prompt_tokens": 200_000, "max_tokens": 8192, "batch_size": 4, "num_batched_tokens": 5000,
                        "kv_cache_usage": 0.5, "tried_to_allocate_mib": 20000, "recent_xids": []},
     OomClass.OVERSIZED_REQUEST),
    ("batch_overload", {"prompt_tokens": 2000, "max_tokens": 1024, "batch_size": 240, "num_batched_tokens": 60000,
                        "kv_cache_usage": 0.98, "tried_to_allocate_mib": 1024, "recent_xids": []},
     OomClass.BATCH_OVERLOAD),
    ("fragmentation", {"prompt_tokens": 2000, "max_tokens": 1024, "batch_size": 30, "num_batched_tokens": 8000,
                       "kv_cache_usage": 0.6, "tried_to_allocate_mib": 2048, "reserved_unallocated_mib": 9000,
                       "uptime_s": 864000, "recent_xids": []},
     OomClass.FRAGMENTATION),
    ("driver", {"prompt_tokens": 2000, "max_tokens": 1024, "batch_size": 20, "num_batched_tokens": 6000,
                "kv_cache_usage": 0.5, "tried_to_allocate_mib": 128, "recent_xids": [119],
                "cuda_error": "CUDA error: unspecified launch failure (cudaErrorLaunchFailure)"},
     OomClass.DEVICE_FAULT),
])
def test_simulated_oom_context_classifies_as_injected(cls: str, ctx: dict, want: OomClass) -> None:
    ev = oom_event(SimEvent(T0, "cuda_oom", "llama-000", "node-09", ctx | {"model": "llama3-70b"}, cls))
    assert ev.kind == "oom" and ev.entity == "llama-000"
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in ev.payload.items()}
    assert classify_oom(OomEvent(ts=ev.ts, entity=ev.entity, **fields)).cls == want


def test_world_answers_active_tests_from_ground_truth() -> None:
    broken = {"node-01"}
    w = World(lambda node, t: node not in broken, {"llama-000": "node-09"}, test_s=600, probe_s=60)
    w.react([], [Intent(T0, IntentKind.RUN_ACTIVE_TEST, "node-01", "gate", {}, Tier.NODE),
                 Intent(T0, IntentKind.RUN_ACTIVE_TEST, "node-02", "z", {}, Tier.NODE),
                 Intent(T0, IntentKind.RUN_ACTIVE_TEST, "llama-000", "slo", {}, Tier.INSTANCE)])
    assert [(e.entity, e.passed) for e in w.due(T0 + 60)] == [("llama-000", True)]
    assert sorted((e.entity, e.passed) for e in w.due(T0 + 600)) == [("node-01", False), ("node-02", True)]
    assert w.due(T0 + 10_000) == []


def test_detection_and_removal_are_per_episode() -> None:
    # node-04 has an NVLink fault twice: removed 120 s after the first onset and 300 s after the second
    truths = [gt("node-04", "nvlink_errors", 1000, end=5000), gt("node-04", "nvlink_errors", 20000)]
    trs = [tr(1060, "node-04", State.DEGRADED), tr(1120, "node-04", State.QUARANTINED, State.DEGRADED),
           tr(6000, "node-04", State.RECOVERING, State.QUARANTINED), tr(9000, "node-04", State.READY, State.RECOVERING),
           tr(20100, "node-04", State.DEGRADED), tr(20300, "node-04", State.QUARANTINED, State.DEGRADED)]
    s = score(ArmLog("x", transitions=trs), truths)
    by_onset = {o.incident.onset - T0: o for o in s.outcomes}
    assert (by_onset[1000].response_s, by_onset[1000].removal_s) == (60, 120)
    assert (by_onset[20000].response_s, by_onset[20000].removal_s) == (100, 300)  # not None: its own episode
    assert s.metrics["recall"] == 1.0


def test_a_replica_drained_off_a_faulty_node_is_its_removal_though_no_truth_row_names_it() -> None:
    # a GPU fault on node-09 names the node and its GPU, not the replica serving on it (llama-000); the
    # replica drained 30 s after onset took the fault out of service: removal 30 s, not the node's 600 s
    truths = [gt("node-09/gpu1", "xid79_off_bus", 1000, kind="gpu"), gt("node-09", "xid79_off_bus", 1000)]
    trs = [tr(1030, "llama-000", State.DRAINING), tr(1600, "node-09", State.QUARANTINED, reason="gate:xid")]
    s = score(ArmLog("x", transitions=trs), truths)
    (o,) = s.outcomes
    assert o.incident.entities == {"node-09", "node-09/gpu1"}
    assert (o.response_s, o.removal_s) == (30, 30)
    assert s.metrics["removal_s"] == 30 and s.metrics["incidents_caught"] == 1
    # a replica drained on another node is no removal of this fault
    other = score(ArmLog("x", transitions=[tr(1030, "llama-000", State.DRAINING)]),
                  [gt("node-03", "xid79_off_bus", 1000)])
    assert other.outcomes[0].removal_s is None

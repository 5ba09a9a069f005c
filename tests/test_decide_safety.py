"""Safety rules on hand-made tuples: budgets, TP groups, fleet confidence, attribution, resets, router."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.decider import REMEDIATION_KINDS
from fleethealth.decide.model import IntentKind, State, Tier
from fleethealth.decide.state import Event
from fleethealth.policy import default_policy


# A gate the rate budget governs (inferred, not a confirmed hard gate: see test_decide_budgets.py)
def _fleet(n: int, bad: set[int], t: float, value_bad: float = 0.0, reason: str = "gate:oom_device_fault",
           labels=None) -> list:
    out = []
    for i in range(n):
        lab = {"pool": "a100", **((labels or (lambda i: {}))(i))}
        if i in bad:
            out.append(tup(f"n{i:02d}", value_bad, reason=reason, labels=lab, worst="hardware"))
        else:
            out.append(tup(f"n{i:02d}", 0.97, labels=lab))
    return out


def test_budget_holds_when_many_nodes_fail_at_once_and_a_page_goes_out() -> None:
    r = Run()
    bad = set(range(10))
    r.steps(0, 600, 15, lambda t: _fleet(50, bad if t >= 60 else set(), t))
    quarantined = [e for e, s in r.state.entities.items() if s.state == State.QUARANTINED]
    assert len(quarantined) == 1  # max(1, 2% of 50)
    pages = r.of(IntentKind.PAGE)
    assert len(pages) == 1 and pages[0].reason == "budget_exhausted"
    assert pages[0].params["allowed"] == 1 and pages[0].params["pool"] == "a100"
    soft = [i for i in r.intents if i.soft]
    assert len(soft) == 9 and {i.kind for i in soft} == {IntentKind.NO_NEW_WORK}
    assert len({i.entity for i in soft}) == 9  # once per node, not per cycle
    assert len(r.of(IntentKind.QUARANTINE)) == 1


def test_budget_refills_after_the_window() -> None:
    r = Run()
    r.steps(0, 3700, 30, lambda t: _fleet(50, {0, 1}, t))
    assert sum(s.state == State.QUARANTINED for s in r.state.entities.values()) == 2
    q = r.of(IntentKind.QUARANTINE)
    assert q[1].ts - q[0].ts >= 3600


def test_budget_scales_with_pool_size() -> None:
    r = Run()
    r.steps(0, 120, 15, lambda t: _fleet(200, set(range(10)), t))
    assert sum(s.state == State.QUARANTINED for s in r.state.entities.values()) == 4  # 2% of 200


def test_bad_driver_rollout_pages_about_the_version_and_quarantines_none_of_it() -> None:
    r = Run()
    bad = set(range(0, 40, 4))  # 10 of 40 nodes, all of them on the new driver
    labels = lambda i: {"driver_version": "575.1" if i in bad else "550.9"}  # noqa: E731
    r.steps(0, 1800, 15, lambda t: _fleet(40, bad if t >= 60 else set(), t, 0.2, "min:performance", labels))
    assert not r.of(IntentKind.QUARANTINE)
    pages = [i for i in r.of(IntentKind.PAGE) if i.reason == "version_correlation"]
    assert len(pages) == 1
    assert pages[0].params["label"] == "driver_version" and pages[0].params["value"] == "575.1"
    assert all(r.st(f"n{i:02d}") == State.DEGRADED for i in bad)  # soft: no new work, still there


def test_same_version_everywhere_with_few_failures_is_not_a_version_problem() -> None:
    r = Run()
    labels = lambda i: {"driver_version": "550.9"}  # noqa: E731
    r.steps(0, 400, 15, lambda t: _fleet(100, {3, 7, 11}, t, 0.0, "gate:xid", labels))
    assert not [i for i in r.of(IntentKind.PAGE) if i.reason == "version_correlation"]
    assert r.st("n03") == State.QUARANTINED  # the budget's one, not blocked by a version suspicion


def test_never_more_than_one_node_per_tp_group_without_a_human() -> None:
    r = Run()
    labels = lambda i: {"tp_group": f"g{i // 4}"}  # noqa: E731
    r.steps(0, 300, 15, lambda t: _fleet(200, {0, 1, 8}, t, labels=labels))
    assert r.st("n00") == State.QUARANTINED
    assert r.st("n01") != State.QUARANTINED  # same group g0
    assert r.st("n08") == State.QUARANTINED  # another group
    pages = [i for i in r.of(IntentKind.PAGE) if i.reason == "tp_group_limit"]
    assert len(pages) == 1 and pages[0].params["tp_group"] == "g0"
    soft = [i for i in r.intents if i.soft and i.entity == "n01"]
    assert [i.kind for i in soft] == [IntentKind.NO_NEW_WORK]


def test_metrics_outage_freezes_remediation_with_one_fleet_alert_and_no_action() -> None:
    r = Run()
    r.steps(0, 300, 15, lambda t: _fleet(30, set(), t))
    before = len(r.intents)
    # the exporter pipeline dies: every node unknown for two hours, one still reports a gate
    def outage(t: float) -> list:
        return [tup("n00", 0.0, reason="gate:xid")] + [tup(f"n{i:02d}", None, conf=0.0) for i in range(1, 30)]
    r.steps(315, 7500, 15, outage)
    new = [i for i in r.intents[before:] if i.kind != IntentKind.SET_CONDITION]  # published, not acted
    assert [i.kind for i in new] == [IntentKind.FLEET_ALERT]
    assert new[0].params["state"] == "firing"
    assert all(s.state == State.READY for s in r.state.entities.values())
    # telemetry returns: the alert resolves and remediation resumes
    r.steps(7515, 7530, 15, lambda t: _fleet(30, {0}, t))
    alerts = r.of(IntentKind.FLEET_ALERT)
    assert [a.params["state"] for a in alerts] == ["firing", "resolved"]
    assert r.st("n00") == State.QUARANTINED


def test_partial_outage_under_threshold_does_not_freeze() -> None:
    r = Run()
    def f(t: float) -> list:
        return [tup(f"n{i:02d}", None, conf=0.0) if i < 3 else tup(f"n{i:02d}", 0.97) for i in range(30)]
    r.steps(0, 300, 15, f)
    assert not r.of(IntentKind.FLEET_ALERT)
    assert {i.entity for i in r.of(IntentKind.NO_NEW_WORK)} == {"n00", "n01", "n02"}


def _gpu(node: str, job: str, flags=("xid:13",)):
    return tup(f"{node}/gpu0", 0.98, kind="gpu", labels={"job": job, "node": node}, flags=flags)


def test_xid13_storm_from_one_job_blames_the_job_not_the_nodes() -> None:
    r = Run()
    def f(t: float) -> list:
        nodes = [tup(f"n{i:02d}", 0.98) for i in range(20)]
        return nodes + [_gpu(f"n{i:02d}", "llama-train") for i in range(12)]
    r.steps(0, 1800, 15, f)
    assert not r.of(IntentKind.QUARANTINE)
    assert all(s.state == State.READY for s in r.state.entities.values())
    pages = r.of(IntentKind.PAGE)
    assert len(pages) == 1 and pages[0].entity == "job/llama-train"
    assert pages[0].params["severity"] == "ticket" and pages[0].params["n_nodes"] == 12


def test_node_hit_by_two_distinct_jobs_is_blamed() -> None:
    r = Run()
    r.steps(0, 300, 15, lambda t: [tup("n1", 0.98), tup("n2", 0.98), _gpu("n1", "job-a")])
    assert r.st("n1") == State.READY
    r.steps(3600, 3615, 15, lambda t: [tup("n1", 0.98), tup("n2", 0.98), _gpu("n1", "job-b")])
    assert r.st("n1") == State.QUARANTINED
    assert r.transitions[-1].reason.startswith("attribution:app_xid")
    assert r.st("n2") == State.READY


def test_two_jobs_far_apart_do_not_blame_the_node() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.98), _gpu("n1", "job-a")])
    r.step(7 * 3600, [tup("n1", 0.98), _gpu("n1", "job-b")])
    assert r.st("n1") == State.READY


def test_row_remap_pending_schedules_one_reset_and_no_quarantine() -> None:
    r = Run()
    def f(t: float) -> list:
        return [tup("n1", 0.8, reason="min:memory", flags=("row_remap_pending",)),
                tup("n1/gpu3", 0.8, kind="gpu", labels={"node": "n1"}, flags=("row_remap_pending", "xid:63"))]
    r.steps(0, 1800, 15, f)
    resets = r.of(IntentKind.SCHEDULE_RESET)
    assert len(resets) == 1
    assert resets[0].params["when"] == "next_safe_point" and resets[0].params["drain"] is True
    assert resets[0].params["gpus"] == ["n1/gpu3"]
    assert not r.of(IntentKind.QUARANTINE) and r.st("n1") == State.READY
    # the reset happened (the flag is gone): a later remap schedules a new one
    r.step(1815, [tup("n1", 0.97)], [Event(1810, "reset", "n1", passed=True)])
    r.step(1830, f(1830))
    assert len(r.of(IntentKind.SCHEDULE_RESET)) == 2


def test_xid154_drain_and_reset_drains_then_recovers_after_the_reset() -> None:
    r = Run()
    flags = ("recovery_action:DRAIN_AND_RESET",)
    r.step(0, [tup("n1", 0.0, reason="gate:recovery_action", flags=flags, worst="hardware")])
    assert r.st("n1") == State.DRAINING
    kinds = r.kinds("n1")
    assert IntentKind.DRAIN in kinds and IntentKind.SCHEDULE_RESET in kinds
    assert kinds.index(IntentKind.CAPTURE_EVIDENCE) < kinds.index(IntentKind.DRAIN)
    reset = r.of(IntentKind.SCHEDULE_RESET)[-1]
    assert reset.params["action"] == "GPU_RESET" and reset.params["ladder"] == "reset-class"
    # the reset ran: the repair is verified by an active test before the node may go back
    r.step(60, [tup("n1", 1.0)], [Event(50, "reset", "n1", passed=True)])
    assert r.st("n1") == State.DRAINING
    test = r.of(IntentKind.RUN_ACTIVE_TEST)[-1]
    assert test.params["verify"] == "reset_gpu" and test.ts == 60
    r.step(120, [tup("n1", 1.0)], [Event(110, "active_test", "n1", passed=True)])
    assert r.st("n1") == State.RECOVERING
    release = r.of(IntentKind.RELEASE)[-1]
    assert [h["result"] for h in release.params["repair"]["history"]] == [
        "reset_gpu done", "verified: active test passed"]


def test_xid154_node_reboot_quarantines_and_asks_for_the_reboot() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.0, reason="gate:recovery_action", flags=("recovery_action:NODE_REBOOT",))])
    assert r.st("n1") == State.QUARANTINED
    resets = r.of(IntentKind.SCHEDULE_RESET)
    assert len(resets) == 1 and resets[0].params["action"] == "NODE_REBOOT"


def test_drain_timeout_quarantines() -> None:
    r = Run()
    flags = ("recovery_action:DRAIN_P2P",)
    r.step(0, [tup("n1", 0.9, flags=flags)])
    assert r.st("n1") == State.DRAINING
    assert r.of(IntentKind.DRAIN)[0].params["scope"] == "p2p"
    r.steps(60, 900, 60, lambda t: [tup("n1", 0.9, flags=flags)])
    assert r.st("n1") == State.QUARANTINED


def test_router_weight_follows_score_holds_when_unknown_then_drains_gradually() -> None:
    pol = default_policy()
    r = Run()
    r.step(0, [tup("r1", 0.9, kind="replica")])
    assert r.st("r1") == State.WARMING
    r.steps(15, 90, 15, lambda t: [tup("r1", 0.9, kind="replica")])
    assert r.st("r1") == State.READY
    r.step(105, [tup("r1", 0.5, kind="replica", worst="serving")])
    assert r.of(IntentKind.SET_WEIGHT, "r1")[-1].params["weight"] == 0.5
    n_before = len(r.of(IntentKind.SET_WEIGHT, "r1"))
    r.steps(120, 105 + pol.router.hold_s, 15, lambda t: [tup("r1", None, conf=0.0, kind="replica")])
    assert len(r.of(IntentKind.SET_WEIGHT, "r1")) == n_before  # held
    r.steps(105 + pol.router.hold_s + 15, 105 + pol.router.hold_s + 150, 15,
            lambda t: [tup("r1", None, conf=0.0, kind="replica")])
    ws = [i.params["weight"] for i in r.of(IntentKind.SET_WEIGHT, "r1")[n_before:]]
    assert ws == [0.4, 0.3, 0.2, 0.1, 0.0]
    assert r.st("r1") == State.READY  # the router drains; remediation does not act on unknown
    assert not [i for i in r.intents if i.kind in REMEDIATION_KINDS]


def test_replica_tiers_smallest_that_fits() -> None:
    r = Run()
    a, b = {"pool": "a"}, {"pool": "b"}
    r.steps(0, 90, 15, lambda t: [tup("r1", 0.95, kind="replica", labels=a),
                                  tup("r2", 0.95, kind="replica", labels=b)])
    r.steps(105, 105 + 300, 15, lambda t: [tup("r1", 0.1, kind="replica", worst="errors", labels=a),
                                            tup("r2", 0.1, kind="replica", worst="memory", labels=b)])
    d1 = r.of(IntentKind.DRAIN, "r1")
    assert d1 and d1[0].tier == Tier.INSTANCE and not r.of(IntentKind.REBUILD_WORKER, "r1")
    assert r.of(IntentKind.REBUILD_WORKER, "r2")[0].tier == Tier.POD
    assert r.of(IntentKind.SET_WEIGHT, "r1")[-1].params["weight"] == 0.0


def test_oom_events_are_classified_not_restarted() -> None:
    r = Run()
    r.step(0, [tup("r1", 0.95, kind="replica")])
    ev = Event(5, "oom", "r1", payload={"prompt_tokens": 200_000, "max_tokens": 1000, "model_max_len": 32768})
    _, intents = r.step(15, [tup("r1", 0.95, kind="replica")], [ev])
    kinds = {i.kind for i in intents}
    assert IntentKind.REBUILD_WORKER not in kinds and IntentKind.QUARANTINE not in kinds
    assert kinds & {IntentKind.REJECT_REQUEST, IntentKind.PAGE}


def test_silent_quarantined_node_does_not_freeze_a_small_fleet() -> None:
    r = Run()
    r.step(0, _fleet(5, {0}, 0))
    assert r.st("n00") == State.QUARANTINED
    r.steps(15, 600, 15, lambda t: _fleet(5, set(), t)[1:])  # n00 powered off for repair: no tuple at all
    assert not r.of(IntentKind.FLEET_ALERT)
    assert r.st("n00") == State.QUARANTINED


def test_gone_replica_is_forgotten_after_a_day_a_quarantined_node_never() -> None:
    r = Run()
    reps = lambda t: [tup(f"r{i}", 0.95, kind="replica") for i in range(4)]  # noqa: E731
    r.steps(0, 120, 15, lambda t: _fleet(12, {0}, t) + reps(t))
    assert r.st("n00") == State.QUARANTINED and r.st("r0") == State.READY
    # n00 (quarantined), n01 (READY) and replica r0 (scaled down) go silent
    r.steps(3600, 3600 * 30, 3600, lambda t: _fleet(12, set(), t)[2:] + reps(t)[1:])
    assert "r0" not in r.state.entities
    assert r.st("n00") == State.QUARANTINED  # no quarantine is ever forgotten
    assert r.state.entities["n01"].no_new_work  # held while unknown, so remembered
    assert not r.of(IntentKind.FLEET_ALERT)  # 2 of 14 silent: not a telemetry outage


def test_outage_longer_than_the_engines_memory_stays_frozen() -> None:
    r = Run()
    r.steps(0, 60, 15, lambda t: _fleet(30, set(), t))
    r.steps(75, 3600, 15, lambda t: [tup(f"n{i:02d}", None, conf=0.0) for i in range(30)])
    r.steps(3615, 3600 * 8, 300, lambda t: [])  # the history forgot them: no tuples at all
    alerts = r.of(IntentKind.FLEET_ALERT)
    assert [a.params["state"] for a in alerts] == ["firing"]
    assert not r.of(IntentKind.NO_NEW_WORK)
    assert len(r.state.entities) == 30


def test_oom_device_fault_quarantines_through_the_lifecycle_with_its_safety_rules() -> None:
    r = Run()
    rep = lambda t: [tup("r1", 0.95, kind="replica", labels={"node": "n1"}), tup("n1", 0.97)]  # noqa: E731
    r.steps(0, 90, 15, rep)
    ev = Event(100, "oom", "r1", payload={"prompt_tokens": 1200, "max_tokens": 512, "recent_xids": [79],
                                          "cuda_errors": ["CUDA error: an illegal memory access was encountered"]})
    r.step(105, rep(105), [ev])
    assert r.st("r1") == State.QUARANTINED and r.st("n1") == State.QUARANTINED
    assert r.transitions[-1].reason == "gate:oom_device_fault"
    assert r.of(IntentKind.QUARANTINE, "n1") and r.of(IntentKind.REBUILD_WORKER, "r1")


def test_human_release_from_quarantine() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.0, reason="gate:xid")])
    r.step(15, [tup("n1", 1.0)], [Event(10, "ack", "n1", to="READY", actor="bob")])
    assert r.st("n1") == State.READY
    assert r.of(IntentKind.RELEASE, "n1") and r.of(IntentKind.ALLOW_NEW_WORK, "n1")


def test_a_human_approves_a_quarantine_the_tp_group_rule_held() -> None:
    r = Run()
    labels = lambda i: {"tp_group": f"g{i // 4}"}  # noqa: E731
    r.steps(0, 60, 15, lambda t: _fleet(200, {0, 1}, t, labels=labels))
    assert r.st("n01") != State.QUARANTINED
    r.step(75, _fleet(200, {0, 1}, 75, labels=labels), [Event(70, "ack", "n01", to="QUARANTINED", actor="carol")])
    assert r.st("n01") == State.QUARANTINED


def test_a_fresh_start_at_low_confidence_is_warm_up_not_a_fleet_freeze() -> None:
    r = Run()
    nodes = [f"n{i}" for i in range(8)]
    # first cycle: every counter rate still needs its second sample, so every node reads low confidence
    r.step(0, [tup(n, 1.0, conf=0.3) for n in nodes])
    assert not r.state.frozen and not r.of(IntentKind.FLEET_ALERT)
    r.step(60, [tup(n, 1.0) for n in nodes])
    # once the nodes have reported usable data, losing it together is a telemetry problem: frozen
    r.step(120, [tup(n, 1.0, conf=0.3) for n in nodes])
    assert r.state.frozen and r.of(IntentKind.FLEET_ALERT)[-1].reason == "fleet_confidence_low"

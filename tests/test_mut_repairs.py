"""Repair ladders as the decider runs them, in the words an operator reads (issue 21: decide/repairs.py):
the first step's intent, an executor's failure reason in the ladder's history, the page of a ladder
exhausted in place, the repair budget's page for a node without a pool, and a precondition naming the
peers still in service; the recurring row-remap incident per GPU (its summary, another GPU's
remap, the plain decider), a FAILED node's remap without a reset, and a ladder chosen by the gate's reason."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import Event
from fleethealth.policy import parse_policy
from test_decide_recurring import DAY
from test_decide_recurring import _day as _remap_day  # a remap pending ten minutes, then its reset
from test_repair_ladder import default_policy_text_with
from test_repair_preconditions import BUDGET_POLICY, TP_POLICY


def _gated(node: str, tp: str, labels: dict[str, str] | None = None) -> object:
    return tup(node, 0.0, reason="gate:recovery_action", flags=("recovery_action:GPU_RESET",), worst="hardware",
               labels={"tp_group": tp, **(labels or {})})


def _ok(node: str, tp: str, labels: dict[str, str] | None = None) -> object:
    return tup(node, 0.99, labels={"tp_group": tp, **(labels or {})})


def _remap(node: str = "n1") -> list:
    return [tup(node, 0.8, reason="min:memory", flags=("row_remap_pending",), labels={"pool": "p"}),
            tup(f"{node}/gpu3", 0.8, kind="gpu", labels={"node": node}, flags=("row_remap_pending", "xid:63"))]


def test_a_ladder_starts_with_its_first_steps_intent_in_the_cycle_of_the_quarantine() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(BUDGET_POLICY)))
    r.steps(0, 120, 60, lambda t: [_gated("n3", "g2", {"pool": "p"}), _ok("n4", "g3", {"pool": "p"})])
    mine = [(i.kind, i.reason, i.ts) for i in r.intents if i.entity == "n3"]
    assert mine[-2:] == [(IntentKind.QUARANTINE, "gate:recovery_action", 0),
                         (IntentKind.SCHEDULE_RESET, "repair:reset", 0)]


def test_an_executors_failure_reason_is_kept_in_the_ladders_history() -> None:
    r = Run()
    r.steps(0, 300, 60, lambda t: _remap())
    r.step(360, _remap(), [Event(350, "reset", "n1", passed=False, payload={"detail": "gpu in use by pid 42"})])
    assert r.state.entities["n1"].repair["history"][0] == {
        "step": 0, "action": "reset_gpu", "ts": 360, "result": "reset_gpu failed: gpu in use by pid 42"}
    # the next step goes out at once: a reboot at the next safe point
    assert [i.params["action"] for i in r.of(IntentKind.SCHEDULE_RESET)] == ["GPU_RESET", "NODE_REBOOT"]
    # an executor that says why under 'reason' is heard as well
    r2 = Run()
    r2.steps(0, 300, 60, lambda t: _remap())
    r2.step(360, _remap(), [Event(350, "reset", "n1", passed=False, payload={"reason": "driver busy"})])
    assert r2.state.entities["n1"].repair["history"][0]["result"] == "reset_gpu failed: driver busy"


def test_a_ladder_exhausted_in_place_pages_what_was_tried() -> None:
    r = Run()
    r.steps(0, 300, 60, lambda t: _remap())
    r.step(360, _remap(), [Event(350, "reset", "n1", passed=True)])
    r.steps(420, 2400, 60, lambda t: _remap())
    r.step(2460, _remap(), [Event(2450, "reset", "n1", passed=True)])
    r.steps(2520, 4400, 60, lambda t: _remap())
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "repair:row-remap:exhausted"]
    assert page.params["severity"] == "page"
    assert page.params["summary"] == ("n1: row_remap_pending survived reset_gpu, reset_gpu, reboot_node, "
                                      "reboot_node; replace or repair the GPU")
    assert r.st("n1") == State.READY  # in place: the node never left service


def test_the_repair_budget_of_a_node_without_a_pool_is_the_default_pools() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(BUDGET_POLICY)))
    r.steps(0, 600, 60, lambda t: [_gated("n3", "g2"), _gated("n4", "g3"), _ok("n5", "g4"), _ok("n6", "g5")])
    assert [i.entity for i in r.of(IntentKind.SCHEDULE_RESET)] == ["n3"]
    assert r.state.entities["n4"].repair["waiting"] == "repair budget: 1 of 1 reset_gpu in pool default within 3600 s"
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    assert page.entity == "pool/default"
    assert {k: page.params[k] for k in ("pool", "kind", "used", "allowed", "wanted", "window_s", "budget")} == {
        "pool": "default", "kind": "node", "used": 1, "allowed": 1, "wanted": "n4", "window_s": 3600.0,
        "budget": "repair:reset_gpu"}


def test_a_reset_waiting_on_many_peers_names_three_and_counts_the_rest() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(TP_POLICY)))
    r.steps(0, 300, 60, lambda t: [_gated("n1", "g1"), *[_ok(f"n{i}", "g1") for i in range(2, 7)]])
    assert r.state.entities["n1"].repair["waiting"] == (
        "tp_peers_handled: 5 peer(s) of tp_group g1 still in service (n2, n3, n4 and 2 more); drain them or "
        "send a handover event")
    assert not r.of(IntentKind.SCHEDULE_RESET)


def test_an_oom_answer_is_stamped_with_the_cycle_time() -> None:
    r = Run()
    r.steps(0, 90, 15, lambda t: [tup("r1", 0.95, kind="replica")])
    _, intents = r.step(105, [tup("r1", 0.95, kind="replica")],
                        [Event(100, "oom", "r1", payload={"kv_cache_usage": 0.97, "running_requests": 16})])
    (lim,) = [i for i in intents if i.kind == IntentKind.LIMIT_CONCURRENCY]
    assert lim.ts == 105 and lim.entity == "r1"


# ---- the recurring row-remap incident, one per GPU: fire, update, resolve (issue 21) -------------------

def test_the_recurring_remap_page_says_how_many_resets_in_how_many_days() -> None:
    r = Run()
    for d in range(2):
        _remap_day(r, d * DAY)
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"]
    assert page.entity == "n1/gpu3" and page.params["state"] == "firing"
    assert page.params["summary"] == ("n1/gpu3: 2 row-remap resets in 7 days; its memory keeps failing, "
                                      "schedule a repair (RMA)")
    assert page.params["remaps"] == 2 and page.params["window_s"] == 7 * DAY


def test_a_remap_on_another_gpu_of_the_node_keeps_the_first_gpus_incident_open_and_its_own_count() -> None:
    r = Run()
    _remap_day(r, 0.0, "gpu3")
    _remap_day(r, DAY, "gpu3")  # gpu3's incident fires
    _remap_day(r, 2 * DAY, "gpu5")  # gpu5's first: counted for gpu5 only
    r.steps(2 * DAY + 720, 2 * DAY + 3600, 60, lambda t: [tup("n1", 0.97)])
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"]
    assert [(p.entity, p.params["state"]) for p in pages] == [("n1/gpu3", "firing")]
    assert "row_remap:n1/gpu3" in r.state.incidents and "row_remap:n1/gpu5" not in r.state.incidents


def test_the_plain_decider_schedules_the_remaps_reset_as_the_fast_one_does() -> None:
    from fleethealth.decide.decider import Decider

    r = Run()
    r.decider = Decider(r.policy, fast=False)
    for d in range(2):
        _remap_day(r, d * DAY)
    assert len(r.of(IntentKind.SCHEDULE_RESET)) == 2
    assert [p.params["state"] for p in r.of(IntentKind.PAGE) if p.reason == "recurring:row_remap"] == ["firing"]


def test_a_second_nodes_remap_is_verified_after_the_first_nodes_ladder_finished() -> None:
    r = Run()
    r.steps(0, 300, 60, lambda t: _remap("n1") + [tup("n2", 0.97, labels={"pool": "p"})])
    r.step(360, [tup("n1", 0.97, labels={"pool": "p"}), tup("n2", 0.97, labels={"pool": "p"})],
           [Event(350, "reset", "n1", passed=True)])
    assert r.state.entities["n1"].repair["phase"] == "verified"
    r.steps(420, 720, 60, lambda t: [tup("n1", 0.97, labels={"pool": "p"})] + _remap("n2"))
    r.step(780, [tup("n1", 0.97, labels={"pool": "p"}), tup("n2", 0.97, labels={"pool": "p"})],
           [Event(770, "reset", "n2", passed=True)])
    rep = r.state.entities["n2"].repair
    assert rep["phase"] == "verified" and rep["history"][-1]["result"] == "verified: the fault's flags cleared"
    assert not r.state.entities["n2"].reset_scheduled
    assert [i.entity for i in r.of(IntentKind.SCHEDULE_RESET)] == ["n1", "n2"] and not r.of(IntentKind.PAGE)


def test_a_quarantined_nodes_reset_that_passes_its_active_test_returns_it_to_service() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(BUDGET_POLICY)))
    fleet = lambda t: [_gated("n3", "g2", {"pool": "p"}), _ok("n4", "g3", {"pool": "p"})]  # noqa: E731
    r.steps(0, 120, 60, fleet)
    assert r.st("n3") == State.QUARANTINED
    r.step(180, [_ok("n3", "g2", {"pool": "p"}), _ok("n4", "g3", {"pool": "p"})],
           [Event(170, "reset", "n3", passed=True)])
    r.step(240, [_ok("n3", "g2", {"pool": "p"}), _ok("n4", "g3", {"pool": "p"})],
           [Event(230, "active_test", "n3", passed=True)])
    r.steps(300, 1800, 60, lambda t: [_ok("n3", "g2", {"pool": "p"}), _ok("n4", "g3", {"pool": "p"})])
    (rel,) = r.of(IntentKind.RELEASE)
    assert (rel.entity, rel.reason, rel.ts) == ("n3", "event:test_passed:repair:reset", 240)
    assert r.st("n3") == State.RECOVERING and r.state.entities["n3"].repair is None


def test_a_ladder_exhausted_out_of_place_fails_the_node() -> None:
    from test_repair_preconditions import _fleet

    r = Run(policy=parse_policy(default_policy_text_with(TP_POLICY)))
    r.steps(0, 720, 60, lambda t: _fleet(t, {"n1"}))
    assert r.st("n1") == State.FAILED
    assert [s for s in (r.st(f"n{i}") for i in range(2, 7)) if s != State.READY] == []


def test_a_failed_node_with_a_pending_remap_gets_no_reset() -> None:
    from test_repair_preconditions import _fleet

    r = Run(policy=parse_policy(default_policy_text_with(TP_POLICY)))
    r.steps(0, 720, 60, lambda t: _fleet(t, {"n1"}))
    assert r.st("n1") == State.FAILED
    r.steps(780, 1200, 60, lambda t: [*_remap("n1"), *[_ok(f"n{i}", f"g{i}") for i in range(2, 7)]])
    assert not [i for i in r.of(IntentKind.SCHEDULE_RESET) if i.reason == "row_remap_pending"]
    assert r.st("n1") == State.FAILED and not r.state.entities["n1"].reset_scheduled


REASON_POLICY = """
remediation:
  ladders:
    - name: by-reason
      when: [reason:gate:recovery]
      steps:
        - {action: reset_gpu, requires: [drained], timeout_s: 86400, verify: active_test}
        - {action: replace, verify: none}
"""


def test_a_ladder_chosen_by_the_gates_reason_starts_its_first_step() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(REASON_POLICY)))
    r.steps(0, 120, 60, lambda t: [
        tup("n3", 0.0, reason="gate:recovery_action", flags=("recovery_action:GPU_RESET",), worst="hardware",
            labels={"pool": "p", "tp_group": "g2"}),
        tup("n4", 0.99, labels={"pool": "p", "tp_group": "g3"})])
    assert r.st("n3") == State.QUARANTINED
    (reset,) = r.of(IntentKind.SCHEDULE_RESET)
    assert (reset.entity, reset.reason, reset.ts) == ("n3", "repair:by-reason", 0)
    assert r.state.entities["n3"].repair["ladder"] == "by-reason"

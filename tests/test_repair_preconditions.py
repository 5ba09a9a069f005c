"""Issue 17's last parts: a ladder step's ``tp_peers_handled`` precondition is checked by the decider
(the node's tensor-parallel peers drained or out of service, or a ``handover`` event) before the reset or
reboot goes out; a pending row remap goes through a ladder in place (reset at the next safe point, the
remap must clear, else reboot, else a page); and ladder steps spend a repair budget of their own per pool
(exhausted: the step waits, one incident pages). Before, ``tp_peers_handled`` was accepted and ignored,
a row remap had its own reset path with no verification, and a ladder step spent no budget."""

from __future__ import annotations

import pytest

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import Event
from fleethealth.policy import default_policy, default_policy_text, parse_policy
from test_repair_ladder import default_policy_text_with

TP_POLICY = """
remediation:
  ladders:
    - name: tp
      when: [recovery:GPU_RESET]
      steps:
        - {action: reset_gpu, requires: [drained, tp_peers_handled], timeout_s: 600, verify: active_test}
        - {action: replace, verify: none}
"""


def _gated(node: str, tp: str, pool: str = "p") -> object:
    return tup(node, 0.0, reason="gate:recovery_action", flags=("recovery_action:GPU_RESET",), worst="hardware",
               labels={"pool": pool, "tp_group": tp})


def _ok(node: str, tp: str, pool: str = "p") -> object:
    return tup(node, 0.99, labels={"pool": pool, "tp_group": tp})


def _fleet(t: float, gated: set[str]) -> list:
    """n1 and n2 share tensor-parallel group g1; n3..n6 are elsewhere."""
    nodes = {"n1": "g1", "n2": "g1", "n3": "g2", "n4": "g3", "n5": "g4", "n6": "g5"}
    return [_gated(n, g) if n in gated else _ok(n, g) for n, g in nodes.items()]


def test_a_reset_waits_until_its_tensor_parallel_peers_are_handed_over() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(TP_POLICY)))
    r.step(0, _fleet(0, {"n1"}))
    assert r.st("n1") == State.QUARANTINED
    assert not r.of(IntentKind.SCHEDULE_RESET)  # n2 still runs the group's work
    rep = r.state.entities["n1"].repair
    assert rep is not None and rep["waiting"].startswith("tp_peers_handled: 1 peer(s) of tp_group g1 still in service (n2)")
    r.step(60, _fleet(60, {"n1"}))
    assert not r.of(IntentKind.SCHEDULE_RESET)
    # the training operator hands the group's work over: the reset goes out, its wait in the history
    r.step(120, _fleet(120, {"n1"}), [Event(115, "handover", "n1", actor="operator")])
    [reset] = r.of(IntentKind.SCHEDULE_RESET)
    assert reset.entity == "n1" and reset.params["requires"] == ["drained", "tp_peers_handled"] and reset.ts == 120
    rep = r.state.entities["n1"].repair
    assert "waiting" not in rep and rep["history"][-1]["result"].startswith("waited: tp_peers_handled")


def test_a_peer_taken_out_of_service_handles_it_too() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(TP_POLICY)))
    r.step(0, _fleet(0, {"n1"}))
    r.step(60, _fleet(60, {"n1", "n2"}))  # n2 gated as well (a confirmed hard gate skips the TP limit)
    assert r.st("n2") == State.QUARANTINED
    r.step(120, _fleet(120, {"n1", "n2"}))  # the next cycle reads n2 out of service
    assert {(i.entity, i.ts) for i in r.of(IntentKind.SCHEDULE_RESET)} == {("n2", 60), ("n1", 120)}


def test_peers_never_handled_time_out_into_escalation() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(TP_POLICY)))
    r.steps(0, 720, 60, lambda t: _fleet(t, {"n1"}))
    assert not r.of(IntentKind.SCHEDULE_RESET)
    assert r.st("n1") == State.FAILED
    [page] = [p for p in r.of(IntentKind.PAGE, "n1") if p.params.get("action") == "replace"]
    results = [h["result"] for h in page.params["repair"]["history"]]
    assert results[0].startswith("reset_gpu not started in 600 s: tp_peers_handled: 1 peer(s) of tp_group g1")


BUDGET_POLICY = """
remediation:
  ladders:
    - name: reset
      when: [recovery:GPU_RESET]
      steps:
        - {action: reset_gpu, requires: [drained], timeout_s: 86400, verify: active_test}
        - {action: replace, verify: none}
  budget: {reset_gpu: 1, reboot_node: 1}
"""


def test_ladder_steps_spend_a_repair_budget_of_their_own() -> None:
    r = Run(policy=parse_policy(default_policy_text_with(BUDGET_POLICY)))
    gated = {"n3", "n4"}  # different TP groups, one pool: one reset per hour there
    r.steps(0, 600, 60, lambda t: _fleet(t, gated))
    assert r.st("n3") == State.QUARANTINED and r.st("n4") == State.QUARANTINED
    resets = r.of(IntentKind.SCHEDULE_RESET)
    assert [i.entity for i in resets] == ["n3"]
    assert r.state.entities["n4"].repair["waiting"] == "repair budget: 1 of 1 reset_gpu in pool p within 3600 s"
    pages = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    assert len(pages) == 1 and pages[0].params["budget"] == "repair:reset_gpu" and pages[0].params["wanted"] == "n4"
    assert [(k, e) for _, k, e in r.state.ledger if k.startswith("repair:")] == [("repair:reset_gpu:p", "n3")]
    # an hour after n3's reset the window has room: n4's goes out, with its own idempotency key
    r.steps(660, 3660, 60, lambda t: _fleet(t, gated))
    resets = r.of(IntentKind.SCHEDULE_RESET)
    assert [i.entity for i in resets] == ["n3", "n4"] and resets[1].ts == 3600
    assert len({i.key for i in resets}) == 2
    assert len([p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]) == 1


def _remap(node: str = "n1") -> list:
    return [tup(node, 0.8, reason="min:memory", flags=("row_remap_pending",), labels={"pool": "p"}),
            tup(f"{node}/gpu3", 0.8, kind="gpu", labels={"node": node}, flags=("row_remap_pending", "xid:63"))]


def test_a_pending_row_remap_climbs_its_ladder_in_place() -> None:
    r = Run()
    r.steps(0, 300, 60, lambda t: _remap())
    [reset] = r.of(IntentKind.SCHEDULE_RESET)
    assert reset.params["ladder"] == "row-remap" and reset.params["when"] == "next_safe_point"
    assert reset.params["action"] == "GPU_RESET" and reset.params["gpus"] == ["n1/gpu3"]
    assert reset.reason == "row_remap_pending" and r.st("n1") == State.READY
    # the reset ran but the remap is still pending: the verification times out, a reboot at the next safe point
    r.step(360, _remap(), [Event(350, "reset", "n1", passed=True)])
    r.steps(420, 2400, 60, lambda t: _remap())
    steps = [i.params["action"] for i in r.of(IntentKind.SCHEDULE_RESET)]
    assert steps == ["GPU_RESET", "NODE_REBOOT"] and r.of(IntentKind.SCHEDULE_RESET)[1].params["when"] == "next_safe_point"
    # the reboot does not clear it either: a person, with what was tried; the node stays in service
    r.step(2460, _remap(), [Event(2450, "reset", "n1", passed=True)])
    r.steps(2520, 4400, 60, lambda t: _remap())
    [page] = [p for p in r.of(IntentKind.PAGE) if p.reason == "repair:row-remap:exhausted"]
    assert page.params["action"] == "replace"
    assert [h["action"] for h in page.params["repair"]["history"]] == [
        "reset_gpu", "reset_gpu", "reboot_node", "reboot_node", "replace"]
    assert r.st("n1") == State.READY and not r.of(IntentKind.QUARANTINE)


def test_a_remap_cleared_by_its_reset_is_verified() -> None:
    r = Run()
    r.steps(0, 300, 60, lambda t: _remap())
    r.step(360, [tup("n1", 0.97, labels={"pool": "p"})], [Event(350, "reset", "n1", passed=True)])
    rep = r.state.entities["n1"].repair
    assert rep["phase"] == "verified" and rep["history"][-1]["result"] == "verified: the fault's flags cleared"
    assert not r.state.entities["n1"].reset_scheduled
    assert len(r.of(IntentKind.SCHEDULE_RESET)) == 1 and not r.of(IntentKind.PAGE)


def test_without_a_remap_ladder_the_plain_reset_remains() -> None:
    text = default_policy_text()
    start = text.index("    - name: row-remap")
    end = text.index("  # resets / reboots")
    r = Run(policy=parse_policy(text[:start] + text[end:]))
    r.steps(0, 300, 60, lambda t: _remap())
    [reset] = r.of(IntentKind.SCHEDULE_RESET)
    assert "ladder" not in reset.params and reset.params["when"] == "next_safe_point"


def test_the_row_remap_scenario_meets_its_targets_through_the_ladder() -> None:
    from fleethealth.backtest import evaluate, run_backtest
    from fleethealth.sim import load_scenario

    run = run_backtest(load_scenario("row-remap-pending"), default_policy(), [], cycle_s=60.0, closed_loop=True)
    log = run.arms["fleethealth"]
    for node in ("node-21", "node-60"):
        resets = [i for i in log.intents if i.entity == node and i.kind == IntentKind.SCHEDULE_RESET]
        assert [(i.params["ladder"], i.params["action"]) for i in resets] == [("row-remap", "GPU_RESET")]
        assert not [i for i in log.intents if i.entity == node and i.kind == IntentKind.PAGE]
    res = evaluate(run)
    assert all(res["targets"].values()) and res["precision"] == 1.0 and res["recall"] == 1.0


@pytest.mark.parametrize("bad", ["{reset_gpu: -1}", "{reset: 2}"])
def test_repair_budget_is_validated(bad: str) -> None:
    from fleethealth.policy import PolicyError

    with pytest.raises(PolicyError, match="budget"):
        parse_policy(default_policy_text_with(BUDGET_POLICY.replace("{reset_gpu: 1, reboot_node: 1}", bad)))

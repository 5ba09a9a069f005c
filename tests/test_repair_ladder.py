"""The remediation ladder: each step an intent, moved on by results, verified, escalated, and the whole
loop in the simulator without a human (reset fixes; reset fails then reboot fixes; both fail: a page)."""

from __future__ import annotations

import pytest

from fleethealth.decide import ladder
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import PolicyError, default_policy, parse_policy
from fleethealth.repair_policy import Remediation


def rem() -> Remediation:
    return default_policy().remediation


def test_match_by_recovery_action_catalog_bucket_and_reason() -> None:
    r = rem()
    assert ladder.match(r, ["recovery_action:DRAIN_AND_RESET"], "gate:recovery_action").name == "reset-class"
    assert ladder.match(r, ["recovery_action:NODE_REBOOT"], "gate:recovery_action").name == "reboot-class"
    assert ladder.match(r, ["xid:79"], "gate:xid", lambda c: {79: "RESTART_BM"}.get(c)).name == "reboot-class"
    assert ladder.match(r, ["xid:31"], "gate:xid", lambda c: "RESTART_APP") is None
    assert ladder.match(r, [], "min:thermal") is None
    off = Remediation(enabled=False)
    assert ladder.match(off, ["recovery_action:GPU_RESET"], "gate:recovery_action") is None


def test_steps_results_verification_and_escalation() -> None:
    lad = ladder.match(rem(), ["recovery_action:GPU_RESET"], "gate:recovery_action")
    assert lad is not None
    b = ladder.begin(lad, 100.0, "gate:recovery_action", ["recovery_action:GPU_RESET"], ["n1/gpu3"])
    # a step is entered held: its intent goes out when the decider releases it (precondition, budget)
    assert b.intents == [] and ladder.held(b.repair)
    assert ladder.on_tick(lad, b.repair, 5000.0, [], True).repair is b.repair  # the decider's hold() times it
    s = ladder.release(lad, b.repair, 100.0)
    assert s.verdict is None and s.repair["phase"] == "acting" and s.repair["step"] == 0
    [it] = s.intents
    assert it.kind == IntentKind.SCHEDULE_RESET and it.params["action"] == "GPU_RESET"
    assert it.params["gpus"] == ["n1/gpu3"] and it.params["requires"] == ["drained", "no_gpu_process"]
    # nothing moves on a timer alone before the timeout
    assert ladder.on_tick(lad, s.repair, 100.0 + 899, [], True).repair is s.repair
    s2 = ladder.on_result(lad, s.repair, True, 400.0)
    assert s2.repair["phase"] == "verifying" and s2.intents[0].kind == IntentKind.RUN_ACTIVE_TEST
    # the verification fails: escalate to the reboot
    s3h = ladder.on_test(lad, s2.repair, False, 900.0)
    assert s3h is not None and s3h.repair["step"] == 1 and ladder.held(s3h.repair)
    s3 = ladder.release(lad, s3h.repair, 900.0)
    assert s3.intents[0].params["action"] == "NODE_REBOOT"
    # the reboot's result never comes: timeout (1800 s) escalates to replace, the ladder is exhausted
    s4 = ladder.on_tick(lad, s3.repair, 900.0 + 1801, [], True)
    assert s4.verdict == ladder.EXHAUSTED and s4.intents == []
    assert [h["result"] for h in s4.repair["history"]] == [
        "reset_gpu done", "active test failed after reset_gpu", "reboot_node: no result in 1800 s",
        "handed to a person"]
    # a late answer after the ladder moved on changes nothing
    assert ladder.on_result(lad, s4.repair, True, 5000.0).repair is s4.repair


def test_failed_action_escalates_and_cleared_verification() -> None:
    pol = parse_policy(default_policy_text_with("""
remediation:
  ladders:
    - name: remap
      when: [flag:row_remap_pending]
      steps:
        - {action: reset_gpu, requires: [drained], timeout_s: 600, verify: cleared, verify_timeout_s: 900}
        - {action: replace}
"""))
    lad = pol.remediation.ladders[0]
    s = ladder.release(lad, ladder.begin(lad, 0.0, "flag", ["row_remap_pending"]).repair, 0.0)
    failed = ladder.on_result(lad, s.repair, False, 60.0, "persistence mode is on")
    assert failed.verdict == ladder.EXHAUSTED
    assert failed.repair["history"][0]["result"] == "reset_gpu failed: persistence mode is on"
    ok = ladder.on_result(lad, s.repair, True, 60.0)
    assert ok.intents == []  # "cleared" waits for the flags to go, no test
    assert ladder.on_tick(lad, ok.repair, 120.0, ["row_remap_pending"], True).verdict is None
    assert ladder.on_tick(lad, ok.repair, 120.0, [], False).verdict is None  # unusable data proves nothing
    assert ladder.on_tick(lad, ok.repair, 180.0, [], True).verdict == ladder.VERIFIED


def default_policy_text_with(extra: str) -> str:
    """The shipped policy with its ``remediation`` section replaced by ``extra``."""
    from fleethealth.policy import default_policy_text

    text = default_policy_text()
    cut = text.find("\nremediation:")
    return (text if cut < 0 else text[:cut + 1]) + extra.lstrip("\n")


def test_policy_validation() -> None:
    with pytest.raises(PolicyError, match="replace"):
        parse_policy(default_policy_text_with("""
remediation:
  ladders:
    - {name: x, when: [flag:a], steps: [{action: replace}, {action: reset_gpu}]}
"""))
    with pytest.raises(PolicyError, match="expected recovery:ACTION"):
        parse_policy(default_policy_text_with("""
remediation:
  ladders:
    - {name: x, when: [GPU_RESET], steps: [{action: reset_gpu}]}
"""))
    with pytest.raises(PolicyError, match="reboot_nod"):
        parse_policy(default_policy_text_with("""
remediation:
  ladders:
    - {name: x, when: [flag:a], steps: [{action: reboot_nod}]}
"""))


def test_lifecycle_diagram_shows_the_repair_rules() -> None:
    from fleethealth.decide.lifecycle import mermaid_diagram

    d = mermaid_diagram(default_policy().lifecycle)
    assert "repair verified" in d and "repair ladder exhausted" in d


def test_the_loop_in_the_simulator_without_a_human() -> None:
    from fleethealth.backtest import evaluate, run_backtest
    from fleethealth.sim import load_scenario

    run = run_backtest(load_scenario("repair-ladder"), default_policy(), [], cycle_s=60.0, closed_loop=True)
    log = run.arms["fleethealth"]
    path = {n: [(str(t.to_state), t.detail.split(" ")[0]) for t in log.transitions if t.entity == n]
            for n in ("node-07", "node-23", "node-40")}
    # a reset fixes node-07: quarantined at once, reset, verified, READY
    assert path["node-07"] == [("QUARANTINED", "hard_gate"), ("RECOVERING", "test_passed"),
                               ("READY", "recovering_ok")]
    # node-23 asks to drain and reset; the reset does not fix it, the reboot does: DRAINING all along
    assert path["node-23"] == [("DRAINING", "drain_reset"), ("RECOVERING", "test_passed"),
                               ("READY", "recovering_ok")]
    steps23 = [i.params["action"] for i in log.intents if i.entity == "node-23" and i.kind == IntentKind.SCHEDULE_RESET]
    assert steps23 == ["GPU_RESET", "NODE_REBOOT"]
    # node-40 survives both: FAILED and one page carrying what was tried
    assert path["node-40"] == [("QUARANTINED", "hard_gate"), ("FAILED", "repair_exhausted")]
    pages = [i for i in log.intents if i.entity == "node-40" and i.kind == IntentKind.PAGE]
    assert len(pages) == 1 and pages[0].params["action"] == "replace"
    assert [h["action"] for h in pages[0].params["repair"]["history"]] == [
        "reset_gpu", "reset_gpu", "reboot_node", "reboot_node", "replace"]
    res = evaluate(run)
    assert res["precision"] == 1.0 and res["recall"] == 1.0 and res["pages"] == 1
    assert all(res["targets"].values())
    released = [t for t in log.transitions if t.to_state == State.READY and t.entity in ("node-07", "node-23")]
    assert len(released) == 2


def test_explain_names_the_ladder_a_node_would_climb(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from fleethealth.cli.main import app

    page = tmp_path / "node.prom"
    lines = []
    for g in range(8):
        lab = f'gpu="{g}",UUID="GPU-{g}",Hostname="node-1"'
        lines.append(f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} 45")
        lines.append(f"DCGM_FI_DEV_GPU_RECOVERY_ACTION{{{lab}}} {1 if g == 3 else 0}")
    page.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(app, ["explain", "node-1", str(page)])
    assert r.exit_code == 0, r.output
    assert "repair if isolated: reset-class" in r.output and "reset_gpu" in r.output

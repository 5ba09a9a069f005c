"""The repair ladder's behaviours that mutation testing found unpinned (issue 21; docs/mutation.md): the
exact intents each step emits (what the executor acts on), the history an operator reads in the page,
the edges of every timeout, which flags select which ladder, and what ``describe``/``summary`` print."""

from __future__ import annotations

from typing import Any

from fleethealth.decide import ladder
from fleethealth.decide.model import IntentKind, Tier
from fleethealth.repair_policy import Ladder, Remediation, RepairStep


def lad_of(*steps: dict[str, Any], name: str = "l", when: list[str] | None = None) -> Ladder:
    return Ladder(name=name, when=when or ["flag:x"], steps=[RepairStep(**s) for s in steps])


RESET = {"action": "reset_gpu", "requires": ["drained"], "timeout_s": 600, "verify": "active_test",
         "verify_timeout_s": 300}
REBOOT = {"action": "reboot_node", "requires": ["drained"], "timeout_s": 1800, "verify": "none"}
REPLACE = {"action": "replace", "verify": "none"}


def acting(lad: Ladder, now: float = 100.0, trigger: tuple[str, ...] = ("x",)) -> dict[str, Any]:
    b = ladder.begin(lad, now, "gate:x", list(trigger), ["n1/gpu1"], ["dcgm_diag_r2"])
    return ladder.release(lad, b.repair, now).repair  # type: ignore[arg-type]


# --- which ladder a node's flags select -------------------------------------------------------------

def test_flags_give_flag_recovery_xid_and_catalog_tokens() -> None:
    buckets = {79: "RESTART_BM", 31: ""}
    got = ladder.tokens(["recovery_action:GPU_RESET", "xid:79", "xid:31", "xid:abc", "row_remap_pending"],
                        buckets.get)
    assert got == {"flag:recovery_action:GPU_RESET", "recovery:GPU_RESET", "flag:xid:79", "xid:79",
                   "catalog:RESTART_BM", "flag:xid:31", "xid:31", "flag:xid:abc", "xid:abc",
                   "flag:row_remap_pending"}
    # no catalog: the Xid tokens only; a recovery flag is never read as an Xid
    assert ladder.tokens(["xid:79"]) == {"flag:xid:79", "xid:79"}
    assert "xid:recovery_action:x" not in ladder.tokens(["recovery_action:x"], buckets.get)


def test_the_first_matching_ladder_wins_and_reason_prefixes_match() -> None:
    a = lad_of(RESET, name="a", when=["flag:other", "reason:gate:xid"])
    b = lad_of(RESET, name="b", when=["flag:x"])
    rem = Remediation(ladders=[a, b])
    assert ladder.match(rem, ["x"], "gate:xid:79").name == "a"  # type: ignore[union-attr]
    assert ladder.match(rem, ["x"], "min:thermal").name == "b"  # type: ignore[union-attr]
    assert ladder.match(rem, ["other"], "").name == "a"  # type: ignore[union-attr]
    assert ladder.match(rem, ["y"], "min:gate:xid") is None  # a prefix, not a substring
    assert ladder.match(rem, [], "") is None


def test_ladder_of_finds_the_ladder_by_name() -> None:
    a, b = lad_of(RESET, name="a"), lad_of(REBOOT, name="b")
    rem = Remediation(ladders=[a, b])
    assert ladder.ladder_of(rem, {"ladder": "b"}) is b
    assert ladder.ladder_of(rem, {"ladder": "gone"}) is None


# --- the phases ---------------------------------------------------------------------------------------

def test_running_and_isolating_by_phase_and_inplace() -> None:
    assert not ladder.running(None)
    assert ladder.running({"phase": "acting"}) and ladder.running({"phase": "verifying"})
    assert not ladder.running({"phase": "verified"}) and not ladder.running({"phase": "exhausted"})
    assert not ladder.running({})
    assert ladder.isolating({"phase": "acting"})
    assert not ladder.isolating({"phase": "acting", "inplace": True})
    assert not ladder.isolating(None) and not ladder.isolating({"phase": "verified"})


def test_held_only_while_acting_and_held() -> None:
    assert ladder.held({"phase": "acting", "held": True})
    assert not ladder.held({"phase": "acting"}) and not ladder.held({"phase": "acting", "held": False})
    assert not ladder.held({"phase": "verifying", "held": True}) and not ladder.held(None)


def test_step_of_is_the_current_step_or_none_past_the_end() -> None:
    lad = lad_of(RESET, REBOOT)
    assert ladder.step_of(lad, {}).action == "reset_gpu"  # type: ignore[union-attr]
    assert ladder.step_of(lad, {"step": 1}).action == "reboot_node"  # type: ignore[union-attr]
    assert ladder.step_of(lad, {"step": 2}) is None and ladder.step_of(lad, {"step": -1}) is None


# --- begin and release: what the executor receives ------------------------------------------------

def test_begin_records_the_fault_and_holds_the_first_step() -> None:
    lad = lad_of(RESET, REPLACE, name="reset")
    b = ladder.begin(lad, 50.0, "gate:recovery_action", ["b", "a", "a"], ["n1/gpu2", "n1/gpu0", "n1/gpu2"],
                     ["t1"])
    assert b.verdict is None and b.intents == []
    assert b.repair == {"ladder": "reset", "reason": "gate:recovery_action", "trigger": ["a", "b"],
                        "gpus": ["n1/gpu0", "n1/gpu2"], "started": 50.0, "history": [], "tests": ["t1"],
                        "step": 0, "phase": "acting", "since": 50.0, "held": True}


def test_a_ladder_of_only_replace_is_exhausted_at_once_with_its_history() -> None:
    b = ladder.begin(lad_of(REPLACE), 7.0, "r", ["x"])
    assert b.verdict == ladder.EXHAUSTED and b.intents == []
    assert b.repair["phase"] == "exhausted" and b.repair["step"] == 0 and b.repair["since"] == 7.0  # type: ignore[index]
    assert b.repair["history"] == [{"step": 0, "action": "replace", "ts": 7.0,  # type: ignore[index]
                                    "result": "handed to a person", "note": "start"}]


def test_release_emits_the_reset_intent_with_every_parameter() -> None:
    lad = lad_of(RESET, REPLACE, name="reset")
    b = ladder.begin(lad, 100.0, "r", ["x"], ["n1/gpu1"])
    s = ladder.release(lad, b.repair, 160.0)  # type: ignore[arg-type]
    assert s.repair["since"] == 160.0 and "held" not in s.repair  # type: ignore[index,operator]
    [it] = s.intents
    assert it.kind == IntentKind.SCHEDULE_RESET and it.tier == Tier.NODE
    assert it.params == {"action": "GPU_RESET", "when": "after_drain", "drain": True, "gpus": ["n1/gpu1"],
                         "ladder": "reset", "step": 0, "of": 2, "requires": ["drained"], "timeout_s": 600,
                         "trigger": ["x"]}
    # releasing again (not held any more) changes nothing and emits nothing
    again = ladder.release(lad, s.repair, 200.0)  # type: ignore[arg-type]
    assert again.repair is s.repair and again.intents == []


def test_release_emits_the_reboot_and_worker_restart_intents() -> None:
    reboot = lad_of({**REBOOT, "at": "next_safe_point"}, name="rb")
    [it] = ladder.release(reboot, ladder.begin(reboot, 0.0, "r", ["x"]).repair, 0.0).intents  # type: ignore[arg-type]
    assert it.kind == IntentKind.SCHEDULE_RESET and it.tier == Tier.NODE
    assert it.params == {"action": "NODE_REBOOT", "when": "next_safe_point", "drain": True, "ladder": "rb",
                         "step": 0, "of": 1, "requires": ["drained"], "timeout_s": 1800, "trigger": ["x"]}
    worker = lad_of({"action": "restart_worker", "timeout_s": 120}, name="w")
    [it] = ladder.release(worker, ladder.begin(worker, 0.0, "r", ["x"]).repair, 0.0).intents  # type: ignore[arg-type]
    assert it.kind == IntentKind.REBUILD_WORKER and it.tier == Tier.POD
    assert it.params == {"ladder": "w", "step": 0, "of": 1, "requires": [], "timeout_s": 120, "trigger": ["x"]}


def test_a_wait_is_recorded_in_the_history_when_the_step_is_released() -> None:
    lad = lad_of(RESET)
    b = ladder.begin(lad, 0.0, "r", ["x"])
    w = ladder.hold(lad, b.repair, 10.0, "tp peers not drained", times_out=True)  # type: ignore[arg-type]
    assert w.repair["waiting"] == "tp peers not drained" and w.repair["since"] == 0.0  # type: ignore[index]
    assert ladder.summary(w.repair)["waiting"] == "tp peers not drained"  # type: ignore[arg-type]
    s = ladder.release(lad, w.repair, 30.0)  # type: ignore[arg-type]
    assert "waiting" not in s.repair  # type: ignore[operator]
    assert s.repair["history"] == [{"step": 0, "action": "reset_gpu", "ts": 30.0,  # type: ignore[index]
                                    "result": "waited: tp peers not drained"}]
    # released without a wait: nothing recorded
    assert ladder.release(lad, b.repair, 30.0).repair["history"] == []  # type: ignore[arg-type,index]


# --- hold: the precondition's timeout ----------------------------------------------------------------

def test_a_held_step_times_out_only_after_its_timeout_and_only_when_asked() -> None:
    lad = lad_of(RESET, REBOOT)
    b = ladder.begin(lad, 0.0, "r", ["x"]).repair
    at_limit = ladder.hold(lad, b, 600.0, "peers busy", times_out=True)  # type: ignore[arg-type]
    assert at_limit.repair["step"] == 0 and at_limit.repair["waiting"] == "peers busy"  # type: ignore[index]
    past = ladder.hold(lad, b, 600.5, "peers busy", times_out=True)  # type: ignore[arg-type]
    assert past.repair["step"] == 1 and ladder.held(past.repair)
    assert past.repair["history"] == [{"step": 0, "action": "reset_gpu", "ts": 600.5,  # type: ignore[index]
                                       "result": "reset_gpu not started in 600 s: peers busy"}]
    # a budget wait never times out
    budget = ladder.hold(lad, b, 99999.0, "budget", times_out=False)  # type: ignore[arg-type]
    assert budget.repair["step"] == 0 and budget.repair["waiting"] == "budget"  # type: ignore[index]


def test_hold_repeated_with_the_same_reason_returns_the_same_progress() -> None:
    lad = lad_of(RESET)
    b = ladder.begin(lad, 0.0, "r", ["x"]).repair
    w = ladder.hold(lad, b, 1.0, "why", times_out=False).repair  # type: ignore[arg-type]
    assert ladder.hold(lad, w, 2.0, "why", times_out=False).repair is w  # type: ignore[arg-type]
    assert ladder.hold(lad, w, 2.0, "other", times_out=False).repair["waiting"] == "other"  # type: ignore[arg-type,index]
    released = ladder.release(lad, w, 3.0).repair  # type: ignore[arg-type]
    assert ladder.hold(lad, released, 9999.0, "why", times_out=True).repair is released  # type: ignore[arg-type]


# --- results, verification, timeouts ----------------------------------------------------------------

def test_a_passed_action_with_active_test_verification_asks_for_the_test() -> None:
    lad = lad_of(RESET, REPLACE, name="reset")
    r = acting(lad)
    s = ladder.on_result(lad, r, True, 400.0, "took 40 s")
    assert s.verdict is None and s.repair["phase"] == "verifying" and s.repair["since"] == 400.0  # type: ignore[index]
    assert s.repair["history"] == [{"step": 0, "action": "reset_gpu", "ts": 400.0,  # type: ignore[index]
                                    "result": "reset_gpu done: took 40 s"}]
    [it] = s.intents
    assert it.kind == IntentKind.RUN_ACTIVE_TEST and it.tier == Tier.NODE
    assert it.params == {"ladder": "reset", "step": 0, "verify": "reset_gpu", "tests": ["dcgm_diag_r2"]}


def test_a_passed_action_without_verification_is_verified_at_once() -> None:
    lad = lad_of(REBOOT)
    s = ladder.on_result(lad, acting(lad), True, 500.0)
    assert s.verdict == ladder.VERIFIED and s.intents == []
    assert s.repair["phase"] == "verified" and s.repair["since"] == 500.0  # type: ignore[index]
    assert s.repair["history"][-1]["result"] == "reboot_node done"  # type: ignore[index]


def test_a_failed_action_escalates_with_the_executors_reason() -> None:
    lad = lad_of(RESET, REBOOT)
    s = ladder.on_result(lad, acting(lad), False, 200.0)
    assert s.repair["step"] == 1 and ladder.held(s.repair) and s.repair["since"] == 200.0  # type: ignore[index]
    assert s.repair["history"] == [{"step": 0, "action": "reset_gpu", "ts": 200.0,  # type: ignore[index]
                                    "result": "reset_gpu failed"}]
    assert s.verdict is None


def test_a_result_while_held_or_verifying_is_ignored() -> None:
    lad = lad_of(RESET)
    b = ladder.begin(lad, 0.0, "r", ["x"]).repair
    assert ladder.on_result(lad, b, True, 1.0).repair is b  # type: ignore[arg-type]
    v = ladder.on_result(lad, acting(lad), True, 1.0).repair
    assert ladder.on_result(lad, v, False, 2.0).repair is v  # type: ignore[arg-type]


def test_an_active_test_pass_verifies_and_a_fail_escalates() -> None:
    lad = lad_of(RESET, REBOOT)
    v = ladder.on_result(lad, acting(lad), True, 400.0).repair
    ok = ladder.on_test(lad, v, True, 450.0)  # type: ignore[arg-type]
    assert ok is not None and ok.verdict == ladder.VERIFIED
    assert ok.repair["phase"] == "verified" and ok.repair["since"] == 450.0  # type: ignore[index]
    assert ok.repair["history"][-1] == {"step": 0, "action": "reset_gpu", "ts": 450.0,  # type: ignore[index]
                                        "result": "verified: active test passed"}
    bad = ladder.on_test(lad, v, False, 450.0)  # type: ignore[arg-type]
    assert bad is not None and bad.repair["step"] == 1  # type: ignore[index]
    assert bad.repair["history"][-1]["result"] == "active test failed after reset_gpu"  # type: ignore[index]


def test_an_active_test_the_ladder_does_not_wait_for_is_left_to_the_lifecycle() -> None:
    lad = lad_of(RESET, REBOOT)
    assert ladder.on_test(lad, acting(lad), True, 1.0) is None  # still acting
    cleared = lad_of({**RESET, "verify": "cleared"})
    v = ladder.on_result(cleared, acting(cleared), True, 1.0).repair
    assert ladder.on_test(cleared, v, True, 2.0) is None  # verifying, but not by a test
    assert ladder.on_test(lad, {"phase": "verifying", "step": 5}, True, 2.0) is None  # past the last step


def test_the_action_timeout_fires_only_past_timeout_s() -> None:
    lad = lad_of(RESET, REBOOT)
    r = acting(lad, now=100.0)
    assert ladder.on_tick(lad, r, 700.0, [], True).repair is r  # exactly 600 s: not yet
    s = ladder.on_tick(lad, r, 700.5, None, False)
    assert s.repair["step"] == 1 and s.repair["history"][-1] == {  # type: ignore[index]
        "step": 0, "action": "reset_gpu", "ts": 700.5, "result": "reset_gpu: no result in 600 s"}


def test_the_verification_timeout_fires_only_past_verify_timeout_s() -> None:
    lad = lad_of(RESET, REBOOT)
    v = ladder.on_result(lad, acting(lad), True, 1000.0).repair
    assert ladder.on_tick(lad, v, 1300.0, ["x"], True).repair is v  # type: ignore[arg-type]
    s = ladder.on_tick(lad, v, 1300.5, ["x"], True)  # type: ignore[arg-type]
    assert s.repair["step"] == 1  # type: ignore[index]
    assert s.repair["history"][-1]["result"] == "reset_gpu: not verified in 300 s"  # type: ignore[index]


def test_cleared_verification_needs_usable_data_without_any_trigger_flag() -> None:
    lad = lad_of({**RESET, "verify": "cleared"}, REBOOT)
    r = acting(lad, trigger=("a", "b"))
    v = ladder.on_result(lad, r, True, 100.0).repair
    assert ladder.on_tick(lad, v, 110.0, ["b"], True).verdict is None  # type: ignore[arg-type]
    assert ladder.on_tick(lad, v, 110.0, None, True).verdict is None  # type: ignore[arg-type]
    s = ladder.on_tick(lad, v, 110.0, ["c"], True)  # type: ignore[arg-type]
    assert s.verdict == ladder.VERIFIED and s.repair["phase"] == "verified" and s.repair["since"] == 110.0  # type: ignore[index]
    assert s.repair["history"][-1] == {"step": 0, "action": "reset_gpu", "ts": 110.0,  # type: ignore[index]
                                       "result": "verified: the fault's flags cleared"}
    # an active-test verification is not verified by flags clearing
    at = lad_of(RESET, REBOOT)
    va = ladder.on_result(at, acting(at), True, 100.0).repair
    assert ladder.on_tick(at, va, 110.0, [], True).repair is va  # type: ignore[arg-type]


def test_ticks_change_nothing_once_held_verified_or_exhausted() -> None:
    lad = lad_of(RESET)
    b = ladder.begin(lad, 0.0, "r", ["x"]).repair
    assert ladder.on_tick(lad, b, 1e9, [], True).repair is b  # type: ignore[arg-type]
    done = {"phase": "verified", "step": 0, "since": 0.0}
    assert ladder.on_tick(lad, done, 1e9, [], True).repair is done


def test_escalating_past_the_last_step_hands_the_node_to_a_person() -> None:
    lad = lad_of(RESET)  # no replace step: past the end is the same
    s = ladder.on_result(lad, acting(lad), False, 300.0, "no device")
    assert s.verdict == ladder.EXHAUSTED and s.repair["step"] == 1 and s.repair["phase"] == "exhausted"  # type: ignore[index]
    assert s.repair["history"][-1] == {"step": 1, "action": "replace", "ts": 300.0,  # type: ignore[index]
                                       "result": "handed to a person", "note": "reset_gpu failed: no device"}


# --- what operators read -------------------------------------------------------------------------------

def test_describe_lists_when_and_each_step() -> None:
    lad = lad_of(RESET, {"action": "reboot_node", "timeout_s": 1800.5, "verify": "cleared"}, REPLACE,
                 name="reset-class", when=["recovery:GPU_RESET", "catalog:RESET_GPU"])
    assert ladder.describe(lad) == (
        "reset-class: when recovery:GPU_RESET or catalog:RESET_GPU: reset_gpu [drained] (verify active_test, 600 s)"
        " -> reboot_node (verify cleared, 1800.5 s) -> replace")


def test_summary_carries_ladder_phase_step_reason_and_history() -> None:
    lad = lad_of(RESET, REPLACE, name="reset")
    s = ladder.on_result(lad, acting(lad), False, 300.0)
    out = ladder.summary(s.repair)  # type: ignore[arg-type]
    assert out == {"ladder": "reset", "phase": "exhausted", "step": 1, "reason": "gate:x",
                   "history": s.repair["history"]}  # type: ignore[index]
    assert "waiting" not in out


# --- found by the mutation run: edges the tests above left open ------------------------------------------

def test_progress_saved_without_its_lists_resumes_with_empty_ones() -> None:
    """A progress dict restored from the state store that lacks ``trigger``/``gpus``/``tests``/``history``
    (saved before they existed, or trimmed) resumes: intents carry empty lists, nothing crashes."""
    reset = lad_of({**RESET, "verify": "cleared"}, REBOOT, name="reset")
    held = {"ladder": "reset", "step": 0, "phase": "acting", "since": 0.0, "held": True, "waiting": "budget"}
    s = ladder.release(reset, held, 10.0)
    assert s.repair["history"] == [{"step": 0, "action": "reset_gpu", "ts": 10.0,  # type: ignore[index]
                                    "result": "waited: budget"}]
    [it] = s.intents
    assert it.params["gpus"] == [] and it.params["trigger"] == []
    bare = {"ladder": "reset", "step": 0, "phase": "acting", "since": 0.0}
    v = ladder.on_result(reset, bare, True, 20.0)
    assert v.repair["history"] == [{"step": 0, "action": "reset_gpu", "ts": 20.0, "result": "reset_gpu done"}]  # type: ignore[index]
    # no trigger recorded: any usable observation clears it
    cleared = ladder.on_tick(reset, {**bare, "phase": "verifying"}, 30.0, ["x"], True)
    assert cleared.verdict == ladder.VERIFIED
    tested = lad_of(RESET, REBOOT)
    [t] = ladder.on_result(tested, bare, True, 20.0).intents
    assert t.params["tests"] == []
    assert ladder.summary(bare)["history"] == []
    rb = lad_of({**REBOOT, "verify": "active_test"}, name="reset")
    [r] = ladder.release(rb, {**held, "waiting": None}, 10.0).intents
    assert r.params["trigger"] == []


def test_a_wait_is_not_carried_into_the_next_step() -> None:
    lad = lad_of(RESET, REBOOT)
    b = ladder.begin(lad, 0.0, "r", ["x"]).repair
    w = ladder.hold(lad, b, 10.0, "tp peers busy", times_out=True).repair  # type: ignore[arg-type]
    nxt = ladder.hold(lad, w, 601.0, "tp peers busy", times_out=True).repair  # type: ignore[arg-type]
    assert nxt["step"] == 1 and "waiting" not in nxt  # type: ignore[index,operator]
    released = ladder.release(lad, nxt, 620.0).repair  # type: ignore[arg-type]
    # the history keeps the first step's timeout and no second "waited" entry
    assert [h["result"] for h in released["history"]] == ["reset_gpu not started in 600 s: tp peers busy"]  # type: ignore[index]


def test_a_wait_on_a_later_step_keeps_the_earlier_history() -> None:
    lad = lad_of(RESET, REBOOT)
    failed = ladder.on_result(lad, acting(lad, now=0.0), False, 50.0).repair
    w = ladder.hold(lad, failed, 60.0, "budget", times_out=False).repair  # type: ignore[arg-type]
    s = ladder.release(lad, w, 70.0).repair  # type: ignore[arg-type]
    assert [h["result"] for h in s["history"]] == ["reset_gpu failed", "waited: budget"]  # type: ignore[index]


def test_the_hold_timeout_counts_from_when_the_step_was_entered() -> None:
    lad = lad_of(RESET, REBOOT)
    b = ladder.begin(lad, 100.0, "r", ["x"]).repair
    assert ladder.hold(lad, b, 650.0, "busy", times_out=True).repair["step"] == 0  # type: ignore[arg-type,index]
    assert ladder.hold(lad, b, 700.5, "busy", times_out=True).repair["step"] == 1  # type: ignore[arg-type,index]


def test_escalations_are_stamped_with_their_time() -> None:
    lad = lad_of(RESET, REBOOT)
    v = ladder.on_result(lad, acting(lad, now=0.0), True, 100.0).repair
    bad = ladder.on_test(lad, v, False, 150.0)  # type: ignore[arg-type]
    assert bad is not None and bad.repair["since"] == 150.0 and bad.repair["history"][-1]["ts"] == 150.0  # type: ignore[index]
    late = ladder.on_tick(lad, v, 400.5, ["x"], True).repair  # type: ignore[arg-type]
    assert late["since"] == 400.5 and late["history"][-1]["ts"] == 400.5  # type: ignore[index]


def test_describe_lists_every_precondition_of_a_step() -> None:
    lad = lad_of({**RESET, "requires": ["drained", "no_gpu_process"]}, name="r")
    assert ladder.describe(lad) == "r: when flag:x: reset_gpu [drained, no_gpu_process] (verify active_test, 600 s)"


def test_a_policy_reload_that_shortens_a_ladder_hands_a_node_past_its_end_to_a_person() -> None:
    """Found by the mutation run (on_test's ``<`` against the ladder's length): a node on step 2 of a
    ladder that a policy reload cut to one step crashed the decider's cycle (IndexError in on_tick and
    on_result). Now the ladder is exhausted, with why, and the lifecycle pages."""
    long = lad_of(RESET, REBOOT, REPLACE, name="reset")
    short = lad_of(RESET, name="reset")
    r = ladder.on_result(long, acting(long, now=0.0), False, 10.0).repair
    on_reboot = ladder.release(long, r, 10.0).repair  # type: ignore[arg-type]
    assert on_reboot["step"] == 1  # type: ignore[index]
    for s in (ladder.on_tick(short, on_reboot, 20.0, [], True),  # type: ignore[arg-type]
              ladder.on_result(short, on_reboot, True, 20.0),  # type: ignore[arg-type]
              ladder.on_tick(short, r, 20.0, None, False)):  # type: ignore[arg-type]  # held on step 1
        assert s.verdict == ladder.EXHAUSTED and s.repair["phase"] == "exhausted"  # type: ignore[index]
        assert s.repair["history"][-1] == {  # type: ignore[index]
            "step": 1, "action": "replace", "ts": 20.0, "result": "handed to a person",
            "note": "the policy's ladder reset has no step 2 any more"}
    verifying = {**on_reboot, "phase": "verifying"}  # type: ignore[dict-item]
    assert ladder.on_test(short, verifying, True, 20.0) is None  # the lifecycle reads the test
    assert ladder.on_tick(short, verifying, 20.0, [], True).verdict == ladder.EXHAUSTED

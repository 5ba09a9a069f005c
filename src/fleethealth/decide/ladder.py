"""The remediation ladder: which repair to try next on an isolated node, and when to stop trying. Pure.

Theory of operation
-------------------
When a node enters QUARANTINED or DRAINING, the decider asks ``match`` whether one of the policy's ladders
(``policy.remediation``, see ``fleethealth.repair_policy``) covers what the node reports: its flags (the
driver's recovery action, Xids by catalog bucket, ``row_remap_pending``) and its reason. If one does,
``begin`` starts it and the node's lifecycle carries the ladder's progress (``EntityLifecycle.repair``, a
JSON-safe dict, so a restarted controller resumes the same step). Every step is one intent with its own
idempotency key:

* ``reset_gpu``   SCHEDULE_RESET ``action: GPU_RESET`` (the node agent resets the drained GPU);
* ``reboot_node`` SCHEDULE_RESET ``action: NODE_REBOOT`` (a Medik8s remediation resource or a Job);
* ``restart_worker`` REBUILD_WORKER at pod tier;
* ``replace``     no action of ours: the ladder is exhausted and the lifecycle goes to FAILED, whose page
  carries the ladder's history (what was tried, what each step answered) as evidence.

A step is entered *held*: its intent goes out only when the decider releases it (``release``), after checking
what only it can see: the ``tp_peers_handled`` precondition (every other node of the node's ``tp_group``
is drained or out of service, or a ``handover`` event says their work was handed over) and the repair
budget (``remediation.budget``: resets and reboots per pool per budget window). While held, ``hold``
records why (shown by ``describe``); a precondition not met within the step's ``timeout_s`` escalates
like a failed step, an exhausted budget waits (one incident pages) without timing out. The executor
checks the preconditions it can see itself (``drained``, ``no_gpu_process``).

A step moves on **only on events**, never on a timer alone, except its timeout: the executor reports
the action's result as a ``reset`` event (``passed`` true or false, ``payload.action``); then the step's
verification runs: ``active_test`` issues RUN_ACTIVE_TEST and waits for its result, ``cleared`` waits
for a usable observation without the flags that started the ladder, ``none`` accepts the result. A
failed action, a failed verification or a timeout (``timeout_s`` for the action, ``verify_timeout_s``
for the verification) escalates to the next step. The decider turns the ladder's verdicts into lifecycle
events: ``verified`` -> an ``active_test`` pass (QUARANTINED or DRAINING -> RECOVERING, with the
recovery count checked as for any pass), ``exhausted`` -> a ``repair`` failure (-> FAILED, which pages).

The functions take the progress dict and return a new one (never changed in place) with the intents to
emit as plain ``StepIntent`` data; the decider stamps them with its running number and policy version.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fleethealth.decide.model import IntentKind, Tier
from fleethealth.repair_policy import Ladder, Remediation, RepairStep

RECOVERY_PREFIX = "recovery_action:"
VERIFIED = "verified"
EXHAUSTED = "exhausted"


@dataclass(frozen=True, slots=True)
class StepIntent:
    kind: IntentKind
    params: dict[str, Any]
    tier: Tier | None = Tier.NODE


@dataclass(frozen=True, slots=True)
class LadderStep:
    """What one call decided: the new progress (None: the ladder is over), intents, a lifecycle verdict."""

    repair: dict[str, Any] | None
    intents: list[StepIntent] = field(default_factory=list)
    verdict: str | None = None  # VERIFIED | EXHAUSTED | None


def tokens(flags: Iterable[str], catalog_bucket: Any = None) -> set[str]:
    """The ``when`` tokens a set of flags satisfies. ``catalog_bucket(code) -> bucket | None``."""
    out: set[str] = set()
    for f in flags:
        out.add(f"flag:{f}")
        if f.startswith(RECOVERY_PREFIX):
            out.add("recovery:" + f.removeprefix(RECOVERY_PREFIX))
        elif f.startswith("xid:"):
            out.add(f)
            code = f.removeprefix("xid:")
            if catalog_bucket is not None and code.isdigit():
                b = catalog_bucket(int(code))
                if b:
                    out.add(f"catalog:{b}")
    return out


def match(rem: Remediation, flags: Iterable[str], reason: str, catalog_bucket: Any = None) -> Ladder | None:
    """The first ladder of the policy whose ``when`` covers these flags or this reason."""
    if not rem.enabled:
        return None
    have = tokens(flags, catalog_bucket)
    for lad in rem.ladders:
        for w in lad.when:
            if w in have or (w.startswith("reason:") and reason.startswith(w.removeprefix("reason:"))):
                return lad
    return None


def running(repair: dict[str, Any] | None) -> bool:
    """A ladder is acting or verifying (not yet verified, exhausted, or absent)."""
    return repair is not None and repair.get("phase") in ("acting", "verifying")


def stop(repair: dict[str, Any], now: float, why: str) -> dict[str, Any]:
    """The ladder stops where it is (phase ``stopped``, no further step, no verdict): the node's evidence
    turned out to be someone else's (a suspect version's, ``decide.safety``); ``why`` goes in its history."""
    hist = [*repair.get("history", []), {"step": repair.get("step"), "action": "stop", "ts": now,
                                         "result": f"stopped: {why}"}]
    new = {**repair, "phase": "stopped", "since": now, "history": hist, "stopped": why}
    new.pop("held", None)
    new.pop("waiting", None)
    return new


def isolating(repair: dict[str, Any] | None) -> bool:
    """A ladder repairs an isolated node (not one that stays in service, ``inplace``: a row remap's)."""
    return running(repair) and not (repair or {}).get("inplace")


def ladder_of(rem: Remediation, repair: dict[str, Any]) -> Ladder | None:
    return next((lad for lad in rem.ladders if lad.name == repair.get("ladder")), None)


def _step_intents(lad: Ladder, i: int, repair: dict[str, Any]) -> list[StepIntent]:
    st = lad.steps[i]
    base = {"ladder": lad.name, "step": i, "of": len(lad.steps), "requires": list(st.requires),
            "timeout_s": st.timeout_s, "trigger": list(repair.get("trigger", []))}
    if st.action == "reset_gpu":
        gpus = list(repair.get("gpus", []))
        return [StepIntent(IntentKind.SCHEDULE_RESET, {"action": "GPU_RESET", "when": st.at, "drain": True,
                                                       "gpus": gpus, **base})]
    if st.action == "reboot_node":
        return [StepIntent(IntentKind.SCHEDULE_RESET, {"action": "NODE_REBOOT", "when": st.at,
                                                       "drain": True, **base})]
    if st.action == "restart_worker":
        return [StepIntent(IntentKind.REBUILD_WORKER, base, Tier.POD)]
    return []


def _at_step(lad: Ladder, repair: dict[str, Any], i: int, now: float, note: str) -> LadderStep:
    """Enter step ``i`` (acting), or end the ladder when it is ``replace`` or past the last step."""
    hist = list(repair.get("history", []))
    if i >= len(lad.steps) or lad.steps[i].action == "replace":
        hist.append({"step": i, "action": "replace", "ts": now, "result": "handed to a person", "note": note})
        return LadderStep({**repair, "step": i, "phase": "exhausted", "since": now, "history": hist},
                          verdict=EXHAUSTED)
    new = {**repair, "step": i, "phase": "acting", "since": now, "history": hist, "held": True}
    new.pop("waiting", None)
    return LadderStep(new)


def held(repair: dict[str, Any] | None) -> bool:
    """The current step's intent has not gone out yet (the decider checks its precondition and budget)."""
    return repair is not None and repair.get("phase") == "acting" and bool(repair.get("held"))


def release(lad: Ladder, repair: dict[str, Any], now: float) -> LadderStep:
    """The held step may act: its intents, and its timeout counted from now."""
    if not held(repair):
        return LadderStep(repair)
    new = {**repair, "since": now}
    new.pop("held", None)
    waited = new.pop("waiting", None)
    if waited:
        st = lad.steps[new["step"]]
        new["history"] = [*new.get("history", []), {"step": new["step"], "action": st.action, "ts": now,
                                                    "result": f"waited: {waited}"}]
    return LadderStep(new, _step_intents(lad, new["step"], new))


def hold(lad: Ladder, repair: dict[str, Any], now: float, why: str, times_out: bool) -> LadderStep:
    """The held step waits (``why``: what is not met, for ``describe``); with ``times_out``, a wait
    longer than the step's ``timeout_s`` escalates to the next step."""
    if not held(repair):
        return LadderStep(repair)
    st = lad.steps[repair["step"]]
    if times_out and now - float(repair["since"]) > st.timeout_s:
        return _escalate(lad, repair, now, f"{st.action} not started in {st.timeout_s:g} s: {why}")
    if repair.get("waiting") == why:
        return LadderStep(repair)
    return LadderStep({**repair, "waiting": why})


def step_of(lad: Ladder, repair: dict[str, Any]) -> RepairStep | None:
    i = int(repair.get("step", 0))
    return lad.steps[i] if 0 <= i < len(lad.steps) else None


def begin(lad: Ladder, now: float, reason: str, trigger: Iterable[str], gpus: Iterable[str] = (),
          tests: Iterable[str] = ()) -> LadderStep:
    """Start ``lad``; ``tests``: the active tests a verification runs (``lifecycle.active_test``)."""
    repair = {"ladder": lad.name, "reason": reason, "trigger": sorted(set(trigger)), "gpus": sorted(set(gpus)),
              "started": now, "history": [], "tests": list(tests)}
    return _at_step(lad, repair, 0, now, "start")


def _record(repair: dict[str, Any], step: RepairStep, now: float, result: str) -> list[dict[str, Any]]:
    return [*repair.get("history", []), {"step": repair["step"], "action": step.action, "ts": now, "result": result}]


def _escalate(lad: Ladder, repair: dict[str, Any], now: float, result: str) -> LadderStep:
    st = lad.steps[repair["step"]]
    after = {**repair, "history": _record(repair, st, now, result)}
    return _at_step(lad, after, repair["step"] + 1, now, result)


def _verify(lad: Ladder, repair: dict[str, Any], now: float, result: str) -> LadderStep:
    st = lad.steps[repair["step"]]
    hist = _record(repair, st, now, result)
    if st.verify == "none":
        return LadderStep({**repair, "phase": "verified", "since": now, "history": hist}, verdict=VERIFIED)
    new = {**repair, "phase": "verifying", "since": now, "history": hist}
    if st.verify == "active_test":
        return LadderStep(new, [StepIntent(IntentKind.RUN_ACTIVE_TEST, {
            "ladder": lad.name, "step": repair["step"], "verify": st.action, "tests": list(repair.get("tests", []))})])
    return LadderStep(new)


def _step_gone(lad: Ladder, repair: dict[str, Any], now: float) -> LadderStep:
    """The policy's ladder no longer has the current step (a reload shortened it while a node was on a
    later step): nothing left to try that the policy names, so a person decides (exhausted, pages)."""
    return _at_step(lad, repair, len(lad.steps), now,
                    f"the policy's ladder {lad.name} has no step {int(repair.get('step', 0)) + 1} any more")


def on_result(lad: Ladder, repair: dict[str, Any], passed: bool, now: float, detail: str = "") -> LadderStep:
    """The executor's answer for the current step's action (a ``reset`` event)."""
    if repair.get("phase") != "acting" or repair.get("held"):
        return LadderStep(repair)  # a late or repeated answer: already moved on
    if step_of(lad, repair) is None:
        return _step_gone(lad, repair, now)
    st = lad.steps[repair["step"]]
    if not passed:
        return _escalate(lad, repair, now, f"{st.action} failed" + (f": {detail}" if detail else ""))
    return _verify(lad, repair, now, f"{st.action} done" + (f": {detail}" if detail else ""))


def on_test(lad: Ladder, repair: dict[str, Any], passed: bool, now: float) -> LadderStep | None:
    """An active-test result; None when the ladder is not waiting for one (the lifecycle reads it)."""
    st = lad.steps[repair["step"]] if repair.get("step", 0) < len(lad.steps) else None
    if repair.get("phase") != "verifying" or st is None or st.verify != "active_test":
        return None
    if passed:
        hist = _record(repair, st, now, "verified: active test passed")
        return LadderStep({**repair, "phase": "verified", "since": now, "history": hist}, verdict=VERIFIED)
    return _escalate(lad, repair, now, "active test failed after " + st.action)


def on_tick(lad: Ladder, repair: dict[str, Any], now: float, flags_now: Iterable[str] | None,
            usable: bool) -> LadderStep:
    """Timeouts, and the ``cleared`` verification on this cycle's observation (``flags_now`` None: no
    tuple this cycle)."""
    phase = repair.get("phase")
    if phase in ("acting", "verifying") and step_of(lad, repair) is None:
        return _step_gone(lad, repair, now)
    if phase not in ("acting", "verifying") or repair.get("held"):  # a held step: the decider's hold()
        return LadderStep(repair)
    st = lad.steps[repair["step"]]
    waited = now - float(repair["since"])
    if phase == "acting" and waited > st.timeout_s:
        return _escalate(lad, repair, now, f"{st.action}: no result in {st.timeout_s:g} s")
    if phase == "verifying":
        if st.verify == "cleared" and usable and flags_now is not None and \
                not (set(repair.get("trigger", [])) & set(flags_now)):
            hist = _record(repair, st, now, "verified: the fault's flags cleared")
            return LadderStep({**repair, "phase": "verified", "since": now, "history": hist}, verdict=VERIFIED)
        if waited > st.verify_timeout_s:
            return _escalate(lad, repair, now, f"{st.action}: not verified in {st.verify_timeout_s:g} s")
    return LadderStep(repair)


def describe(lad: Ladder) -> str:
    """One line per ladder for ``explain``/``describe``: when it applies and its steps."""
    steps = " -> ".join(
        s.action + (f" [{', '.join(s.requires)}]" if s.requires else "")
        + ("" if s.action == "replace" else f" (verify {s.verify}, {s.timeout_s:g} s)") for s in lad.steps)
    return f"{lad.name}: when {' or '.join(lad.when)}: {steps}"


def summary(repair: dict[str, Any]) -> dict[str, Any]:
    """What an operator reads of a ladder in a page or a release: which ladder, where it stopped, what each
    step answered."""
    out = {"ladder": repair.get("ladder"), "phase": repair.get("phase"), "step": repair.get("step"),
           "reason": repair.get("reason"), "history": list(repair.get("history", []))}
    if repair.get("waiting"):
        out["waiting"] = repair["waiting"]
    if repair.get("stopped"):
        out["stopped"] = repair["stopped"]
    return out

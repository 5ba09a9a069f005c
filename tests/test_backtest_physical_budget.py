"""The backtest judge charges each quarantine of a correlated event to the budget it spent (issue 16):
physical evidence (a GPU off the bus during a bad driver rollout, ``decide.safety``) spends its own budget
(``budgets.physical_*``), named in the transition's detail, not the hard-gate budget the driver's own gates
spend; before, the judge charged both to the hard-gate budget and read a held budget as broken."""

from __future__ import annotations

from fleethealth.backtest.arms import ArmLog
from fleethealth.backtest.metrics import score_arm
from fleethealth.decide.model import Intent, IntentKind, State, Transition
from fleethealth.decide.safety import PHYSICAL_BUDGET_NOTE
from fleethealth.policy import default_policy
from fleethealth.sim.truth import GroundTruth

T0 = 1_767_225_600.0
NODES = [f"node-{i:02d}" for i in range(10)]
GROUP = "driver:pool:train-a"


def _q(ts: float, node: str, detail: str) -> Transition:
    return Transition(T0 + ts, node, "node", State.READY, State.QUARANTINED, "gate:xid", 0.0, 1.0, "v", detail)


def _group(log: ArmLog) -> dict:  # type: ignore[type-arg]
    truths = [GroundTruth(n, "node", "bad_driver_rollout", T0 + 600, None, True, "page", "", GROUP)
              for n in NODES[:8]]
    m = score_arm(log, truths, replica_node={}, nodes=NODES, node_pool=dict.fromkeys(NODES, "train-a"), start=T0,
                  end=T0 + 86400, policy=default_policy(), slow=[], step_s=15.0).metrics
    (g,) = m["groups"]
    return g  # type: ignore[no-any-return]


def test_physical_quarantines_are_charged_to_the_physical_budget() -> None:
    page = Intent(T0 + 1300, IntentKind.PAGE, "version/driver_version=560.28.03", "version_correlation", {}, None)
    # three driver gates (the hard-gate budget: max(3, 10% of 10)) and two dead GPUs (the physical budget:
    # max(3, 10%)) within one hour: both budgets held
    trs = [_q(700 + k, n, "hard_gate") for k, n in enumerate(NODES[:3])]
    trs += [_q(900 + k, n, f"hard_gate {PHYSICAL_BUDGET_NOTE}") for k, n in enumerate(NODES[3:5])]
    g = _group(ArmLog("x", transitions=trs, intents=[page]))
    assert (g["quarantined"], g["budget_held"], g["paged"]) == (5, True, True)


def test_a_fourth_physical_quarantine_in_an_hour_breaks_the_physical_budget() -> None:
    trs = [_q(900 + k, n, f"hard_gate {PHYSICAL_BUDGET_NOTE}") for k, n in enumerate(NODES[:4])]
    assert _group(ArmLog("x", transitions=trs))["budget_held"] is False

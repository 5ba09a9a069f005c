"""One decision cycle's shared vocabulary and bookkeeping (issue 21: decide/cycle.py): which isolation
tier a fault gets, which budget a quarantine spends (the ledger's key an operator reads), the running
number that makes intents idempotent, the caller's state left untouched, and what an incident's page
carries (severity, updates when its evidence changes)."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.cycle import budget_key, choose_tier, is_hard_gate_reason
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import IntentKind, State, Tier
from fleethealth.decide.state import DecisionState
from fleethealth.policy import default_policy

POL = default_policy()


def test_a_node_is_isolated_whole_and_a_replica_as_small_as_its_fault_allows() -> None:
    assert choose_tier("node", "min:serving", "serving") == Tier.NODE
    for reason, worst in (("min:memory", None), ("x", "fragmentation"), ("kv Leak", None),
                          ("engine deadlock", None), ("hang", None), ("stuck step", None), ("gate:oom", None)):
        assert choose_tier("replica", reason, worst) == Tier.POD, reason
    assert choose_tier("replica", "min:serving", "serving") == Tier.INSTANCE
    assert choose_tier("replica", "min:serving", None) == Tier.INSTANCE
    assert choose_tier("replica", "min:serving", "MEMORY") == Tier.POD  # the category names it, any case


def test_only_a_gate_of_a_listed_hard_signal_spends_the_hard_budget() -> None:
    assert is_hard_gate_reason("gate:xid", POL) and is_hard_gate_reason("gate:ecc_dbe", POL)
    assert not is_hard_gate_reason("gate:slo", POL)  # a gate, but not hardware
    assert not is_hard_gate_reason("min:xid", POL) and not is_hard_gate_reason("xid", POL)
    assert budget_key("node", "h100", True) == "hard:node:h100"
    assert budget_key("replica", "llama", False) == "replica:llama"


def _pool(n: int, bad: dict[int, str]) -> list:
    return [tup(f"n{i:02d}", 0.0 if i in bad else 0.97, reason=bad.get(i), labels={"pool": "h100"},
                worst="hardware") for i in range(n)]


def test_quarantines_are_booked_on_the_budget_they_spent() -> None:
    r = Run()
    r.steps(0, 120, 15, lambda t: _pool(20, {}))
    r.steps(135, 1200, 15, lambda t: _pool(20, {0: "gate:xid", 1: "gate:xid", 2: "min:hardware"}))
    booked = {e: key for _, key, e in r.state.ledger}
    assert booked["n00"] == "hard:node:h100" and booked["n01"] == "hard:node:h100"
    assert booked["n02"] == "node:h100"


def test_intents_are_numbered_stamped_and_the_callers_state_is_untouched() -> None:
    d = Decider(POL)
    s0 = DecisionState()
    out = d.decide(s0, _pool(3, {}), 0.0)
    assert s0 == DecisionState()  # the caller's state is never modified
    s1 = out.state
    before = s1.to_dict()
    bad = d.decide(s1, _pool(3, {0: "gate:xid"}), 15.0)
    assert s1.to_dict() == before and s1.entities["n00"].state != bad.state.entities["n00"].state
    assert bad.state.entities["n01"] is s1.entities["n01"]  # a steady entity is not copied
    ns = [i.params["n"] for i in out.intents + bad.intents]
    assert ns == list(range(len(ns))) and bad.state.seq == len(ns)
    assert all(i.ts == 15.0 and i.policy_version == POL.version_tag for i in bad.intents)
    # the same cycle decided again from the same state: the same intents, the same idempotency keys
    again = d.decide(s1, _pool(3, {0: "gate:xid"}), 15.0)
    assert [i.key for i in again.intents] == [i.key for i in bad.intents]
    assert bad.state.entities["n00"].state == State.QUARANTINED


def test_an_incident_page_is_a_page() -> None:
    r = Run()
    # 10 of 50 nodes wait on the rate budget (1 an hour): one incident, paged with severity page
    bad = {i: "min:hardware" for i in range(10)}
    r.steps(0, 900, 60, lambda t: _pool(50, bad))
    (page,) = [p for p in r.of(IntentKind.PAGE) if p.reason == "budget_exhausted"]
    assert (page.entity, page.params["severity"], page.params["state"]) == ("pool/h100", "page", "firing")
    # its updates and resolution (spaced by incident_update_s, after incident_clear_s) are pinned by
    # test_decide_budgets and test_decide_domains

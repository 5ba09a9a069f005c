"""Physical evidence past the version veto (issue 16, QA finding 12): during a bad driver rollout a GPU
that falls off the bus (Xid 79), a DBE or a failed row remap on a node running the suspect driver is dead
hardware, quarantined at once on its own budget, while the driver's own gates (Xid 119 GSP timeouts, which
the catalog cannot tell from a dead GPU) stay held and the rollout pages once. Decider level, the QA
scenario's shape (``qa-budget``: a 16-node pool, the driver's first gates spend the hard-gate budget before
the version is suspect)."""

from __future__ import annotations

import pytest

from decide_support import Run, tup
from fleethealth.decide import incidents
from fleethealth.decide.cycle import Cycle
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import DecisionState, EntityLifecycle
from fleethealth.policy import default_policy

NEW, OLD = "560.28.03", "550.54.15"
POOL = 16


def _policy():  # type: ignore[no-untyped-def]
    p = default_policy()
    # four driver victims make the version suspect: the first three spend the whole hard-gate budget
    # (max(3, 10% of 16)) before it is, as in the QA run
    return p.model_copy(update={"attribution": p.attribution.model_copy(update={"version_min_entities": 4})})


def _rollout(dead: str | None, dead_reason: str = "gate:xid", dead_flags: tuple[str, ...] = ("xid:79",),
             dead_at: float = 1800.0):  # type: ignore[no-untyped-def]
    """Nodes 0-11 run the new driver, 12-15 the old one. The driver's victims (nodes 0, 2, 4, 6, 8, 10:
    one every two minutes from 600 s) gate on Xid 119 with a GPU-reset recovery action; ``dead`` (on the
    new driver, not a victim) gates with ``dead_reason``/``dead_flags`` from ``dead_at``."""
    victims = {f"n{i:02d}": 600.0 + 60.0 * i for i in range(0, 12, 2)}

    def make(t: float) -> list:
        out = []
        for i in range(POOL):
            n = f"n{i:02d}"
            lab = {"pool": "train-a", "driver_version": NEW if i < 12 else OLD, "tp_group": f"tp{i // 4}"}
            if n == dead and t >= dead_at:
                out.append(tup(n, 0.0, reason=dead_reason, labels=lab, flags=dead_flags, worst="hardware"))
            elif n in victims and t >= victims[n]:
                out.append(tup(n, 0.0, reason="gate:xid", labels=lab, flags=("xid:119", "recovery_action:GPU_RESET"),
                               worst="hardware"))
            else:
                out.append(tup(n, 0.97, labels=lab))
        return out

    return make, victims


def _version_pages(r: Run) -> list:
    return [i for i in r.of(IntentKind.PAGE) if i.reason == "version_correlation" and incidents.is_new_page(i.params)]


def test_a_gpu_off_the_bus_on_the_suspect_driver_is_quarantined_at_once_and_the_drivers_victims_held() -> None:
    make, victims = _rollout("n05")
    r = Run(policy=_policy())
    r.steps(0, 1800, 60, make)
    # the dead GPU spent the physical budget; the driver's three gates the hard-gate budget
    assert sorted((k, e) for _, k, e in r.state.ledger if not k.startswith("repair:")) == [
        ("hard:node:train-a", "n00"), ("hard:node:train-a", "n02"), ("hard:node:train-a", "n04"),
        ("physical:node:train-a", "n05")]
    r.steps(1860, 3 * 3600, 60, make)
    q = {i.entity: i.ts for i in r.of(IntentKind.QUARANTINE)}
    # the driver's first three gates spent the hard-gate budget before the version was suspect
    assert {n: q[n] for n in ("n00", "n02", "n04")} == {"n00": 600.0, "n02": 720.0, "n04": 840.0}
    assert [n for n in victims if n in q] == ["n00", "n02", "n04"]  # the rest: held by the version
    for n in ("n06", "n08", "n10"):
        assert r.st(n) != State.QUARANTINED and r.state.entities[n].blocked == f"version:driver_version={NEW}"
    # the dead GPU: the cycle it fell off the bus, on the physical budget, its own reason
    first = next(t for t in r.transitions if t.entity == "n05")
    assert (first.ts, first.to_state, first.reason, q["n05"]) == (1800.0, State.QUARANTINED, "gate:xid", 1800.0)
    (quarantine,) = r.of(IntentKind.QUARANTINE, "n05")
    assert quarantine.reason == "gate:xid"
    assert not [i for i in r.of(IntentKind.NO_NEW_WORK, "n05") if i.reason.startswith("held:")]
    # the rollout: one page, not one per hour and not one per node
    (page,) = _version_pages(r)
    assert page.entity == f"version/driver_version={NEW}" and page.params["state"] == "firing"


def test_before_the_physical_class_the_same_gpu_waited_for_the_rollout() -> None:
    # Without the class (an empty one: the behaviour QA found), the same node is held as 'suspect version'
    p = _policy()
    p = p.model_copy(update={"attribution": p.attribution.model_copy(update={"physical_xids": [],
                                                                            "physical_gates": []})})
    make, _ = _rollout("n05")
    r = Run(policy=p)
    r.steps(0, 3 * 3600, 60, make)
    assert not r.of(IntentKind.QUARANTINE, "n05")
    assert r.state.entities["n05"].blocked == f"version:driver_version={NEW}"


@pytest.mark.parametrize(("reason", "flags", "evidence"), [
    ("gate:xid", ("xid:79",), "xid:79"),  # off the bus
    ("gate:xid", ("xid:48", "xid:64"), "xid:48"),  # DBE, then a failed remap
    ("gate:xid", ("xid:119", "xid:95"), "xid:95"),  # uncontained ECC beside a GSP timeout
    ("gate:xid", ("xid:140",), "xid:140"),  # ECC escape
    ("gate:gpus_missing", (), "gate:gpus_missing"),  # vanished from the bus, no Xid seen
    ("gate:kernel_fallen_off", (), "gate:kernel_fallen_off"),
    ("gate:ecc_dbe", (), "gate:ecc_dbe"),  # the DBE counter, no Xid
    ("gate:row_remap_failure", (), "gate:row_remap_failure"),
])
def test_physical_evidence_passes_the_version_veto(reason: str, flags: tuple[str, ...], evidence: str) -> None:
    make, _ = _rollout("n05", reason, flags)
    r = Run(policy=_policy())
    r.steps(0, 1800, 60, make)
    assert [i.ts for i in r.of(IntentKind.QUARANTINE, "n05")] == [1800.0]
    assert _evidence(reason, flags) == evidence


@pytest.mark.parametrize("flags", [
    ("xid:119",), ("xid:120",), ("xid:62",), ("xid:74",),  # the driver's own, a PMU halt, NVLink (undecoded)
    ("xid:92", "xid:119"),  # a high SBE rate is physical but not a gate: the GSP timeout gates here
    ("xid:63", "xid:119"),  # a pending remap schedules a reset; it does not make a GSP timeout physical
])
def test_software_and_ambiguous_gates_stay_held_by_the_suspect_version(flags: tuple[str, ...]) -> None:
    make, _ = _rollout("n05", "gate:xid", flags)
    r = Run(policy=_policy())
    r.steps(0, 2 * 3600, 60, make)
    assert not r.of(IntentKind.QUARANTINE, "n05")
    assert r.state.entities["n05"].blocked == f"version:driver_version={NEW}"


def test_physical_evidence_is_only_a_gate_and_only_a_node() -> None:
    assert _evidence("min:performance", ("xid:79",)) is None  # a score, not a gate
    assert _evidence("attribution:app_xid:2_jobs", ("xid:79",)) is None  # an inference
    assert _evidence("gate:gpus_missing", (), kind="replica") is None
    assert _evidence("gate:xid", ()) is None  # an Xid gate with no physical Xid flagged
    assert _evidence("gate:nvlink_down", ("xid:74",)) is None
    assert _evidence("gate:xid", ("xid:95", "xid:48")) == "xid:48"  # the lowest, deterministic


def test_physical_evidence_has_its_own_budget_that_still_stops_a_burst() -> None:
    # a burst of GPUs vanishing across the pool (an exporter bug reading as gpus_missing) stops at
    # max(3, 10% of 50) = 5 an hour on the physical budget, and pages once naming that budget
    r = Run()
    pool = [tup(f"n{i:02d}", 0.0 if i < 20 else 0.97, reason="gate:gpus_missing" if i < 20 else None,
                labels={"pool": "h100"}, worst="hardware") for i in range(50)]
    r.steps(0, 600, 60, lambda t: pool)
    assert len(r.of(IntentKind.QUARANTINE)) == 5
    pages = [i for i in r.of(IntentKind.PAGE) if i.reason == "budget_exhausted" and incidents.is_new_page(i.params)]
    assert [p.params["budget"] for p in pages] == ["physical"]
    assert r.state.entities["n19"].blocked == "budget:h100:physical"


def _evidence(reason: str, flags: tuple[str, ...], kind: str = "node") -> str | None:
    """The pure helper on one entity whose last observation had ``reason`` and whose node flagged
    ``flags`` this cycle."""
    p = _policy()
    es = EntityLifecycle("x", kind, State.READY, 0.0, last_reason=reason)
    c = Cycle(p, DecisionState(entities={"x": es}), 0.0, "test")
    c.node_flags = {"x": set(flags)}
    return Decider(p)._physical_evidence(c, es)

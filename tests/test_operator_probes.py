"""Issue 16's operator probes (``examples/scenarios/``): fault patterns written as an operator would see
them, on fleets, names, sizes, timings and seeds unlike the built-in scenarios. Every probe file must
load and build its fleet and faults; three of them run here, cut short after their events, closed loop
at the default cadence: a domain event on a fleet labelled with ``switch`` only pages the switch, not its
racks, and drains nothing; a real Xid 79 inside an NVL72 job's Xid 45 storm is still removed at once;
a real DBE on a node of the suspect driver is removed at once while the rollout is paged and held.
Their full-length results are in each file's header (``fleethealth backtest -s FILE -b static-rules``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from decide_support import Run, tup
from fleethealth.backtest import evaluate, run_backtest
from fleethealth.decide import incidents
from fleethealth.decide.model import IntentKind
from fleethealth.policy import default_policy
from fleethealth.sim.scenario import load_scenario
from fleethealth.sim.simulation import Simulation

PROBES = Path(__file__).parent.parent / "examples" / "scenarios"


def backtest(name: str, duration_s: float) -> dict[str, Any]:
    sc = load_scenario(str(PROBES / f"{name}.yaml"))
    sc = sc.with_overrides(duration=duration_s)
    return evaluate(run_backtest(sc, default_policy(), [], cycle_s=60.0))


@pytest.mark.parametrize("path", sorted(PROBES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_probe_loads_and_builds_its_fleet_and_faults(path: Path) -> None:
    sc = load_scenario(str(path))
    assert sc.faults, path
    sim = Simulation(sc)  # resolves every fault's target against the fleet
    assert len(sim.fleet.nodes) >= 12


def test_a_domain_event_on_a_switch_label_only_pages_the_switch_and_drains_nothing() -> None:
    res = backtest("switch-only-domain-event", 7 * 3600.0)
    assert res["quarantines"] == 0, res["false_quarantine_list"]
    assert res["pages"] == 1
    assert res["targets"]["power:switch:sw-01:paged"] and res["targets"]["power:switch:sw-01:budget_held"]
    assert {r["first_response"] for r in res["incidents"]} == {"domain_correlation"}
    assert len(res["incidents"]) == 12  # the two racks behind sw-01, every node answered by the switch's page


def test_a_real_xid79_inside_an_nvl72_job_crash_storm_is_removed_at_once() -> None:
    res = backtest("nvl72-xid45-storm-with-xid79", 4 * 3600.0)
    assert res["false_quarantines"] == 0, res["false_quarantine_list"]
    (inc,) = res["incidents"]
    assert inc["node"] == "ct-25" and inc["removal_s"] is not None and inc["removal_s"] <= 30, inc


def test_a_real_dbe_on_a_node_of_the_suspect_driver_is_removed_while_the_rollout_is_paged() -> None:
    res = backtest("driver-rollout-with-dbe", 8 * 3600.0)
    assert res["false_quarantines"] == 0, res["false_quarantine_list"]
    (dbe,) = [r for r in res["incidents"] if r["fault"] == "ecc_dbe_remap_failure"]
    assert dbe["node"] == "g-37" and dbe["removal_s"] is not None and dbe["removal_s"] <= 30, dbe
    (g,) = res["groups"]
    assert g["budget_held"] and g["paged"], g


# ---- a domain incident while its nodes' scores hover around degraded_below ----------------------------
# Found by `fleethealth backtest -s rack-cooling --nodes 20`: rack-01's incident resolved at 7.72 h while the
# cooling was still off (fewer than min_nodes scores under degraded_below for incident_clear_s) and paged
# again at 7.75 h: two new pages (and two resolutions) for one event.


def _rack(hot: dict[int, float]) -> list:
    """48 nodes, 8 to a rack, one pool; nodes in ``hot`` score that value (thermal)."""
    out = []
    for i in range(48):
        lab = {"pool": "h100", "rack": f"r{i // 8}", "tp_group": f"tp{i // 2}", "driver_version": "v1"}
        v = hot.get(i, 0.97)
        out.append(tup(f"n{i:02d}", v, reason="min:thermal" if i in hot else "min:performance", labels=lab))
    return out


def test_a_rack_still_warm_just_above_degraded_below_stays_one_incident() -> None:
    hot = range(16, 24)  # rack r2

    def make(t: float) -> list:
        if t < 3600 or 5400 <= t < 9000:
            return _rack({n: 0.2 for n in hot})  # hot and throttled
        if t < 5400:
            return _rack({n: 0.78 for n in hot})  # still warm: above degraded_below, below ready_above
        return _rack({})  # cooling restored

    r = Run()
    r.steps(0, 4 * 3600, 60, make)
    new = [p for p in r.of(IntentKind.PAGE) if incidents.is_new_page(p.params)]
    assert [(p.entity, p.reason) for p in new] == [("domain/rack=r2", "domain_correlation")]
    resolved = [p for p in r.of(IntentKind.PAGE) if p.params.get("state") == "resolved"]
    assert [(p.entity, p.ts) for p in resolved] == [("domain/rack=r2", 9000 - 60 + 900.0)]
    assert not r.of(IntentKind.QUARANTINE) and not r.of(IntentKind.DRAIN)

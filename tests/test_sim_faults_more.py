"""The simulator's chronic, intermittent, silent, correlated and exporter faults (issue 16 item 5): what
each does to the telemetry, measured against the same seed without the fault, and its ground truth."""

from __future__ import annotations

import numpy as np

from fleethealth.signals.snapshot import Snapshot
from fleethealth.sim import Simulation
from fleethealth.sim.faults import FAULT_CLASSES
from fleethealth.sim.faults_more import MORE_FAULT_CLASSES
from fleethealth.sim.scenario import FAULT_KINDS, builtin_names, load_scenario
from sim_support import small_scenario, values

NEW = ("sbe_climb", "slow_rank", "intermittent", "silent_hang", "cooling_event", "frozen_exporter", "clock_skew")
GAUGES = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_POWER_USAGE",
          "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


def run(sim: Simulation, n: int) -> list[Snapshot]:
    return [sim.step() for _ in range(n)]


def touched(sim: Simulation, t: float) -> set[str]:
    """The Effects fields the simulation's faults write at ``t`` (the rest stay neutral)."""
    eff = sim._effects(t)
    return set() if eff is None else {k for k in eff.__dict__ if not k.startswith("_") and k != "node_reason"}


def pair(fault: dict, n: int, duration: str = "2h") -> tuple[list[Snapshot], list[Snapshot], Simulation]:
    sim = Simulation(small_scenario([fault], duration=duration))
    base = Simulation(small_scenario(duration=duration))
    return run(sim, n), run(base, n), sim


def test_every_new_kind_is_registered_with_a_docstring() -> None:
    for k in NEW:
        assert k in FAULT_KINDS and k in FAULT_CLASSES
        assert len((FAULT_CLASSES[k].__doc__ or "").split()) > 15
    assert {c.kind for c in MORE_FAULT_CLASSES} == set(NEW)


def test_sbe_rate_climbs_then_becomes_a_dbe() -> None:
    fault = {"kind": "sbe_climb", "target": "node-01/gpu4", "onset": 0,
             "params": {"base_per_s": 0.02, "doubling_s": 600, "fault_after_s": 1800}}
    snaps, plain, sim = pair(fault, 125)
    sbe = [values(s, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", Hostname="node-01", gpu="4")[0] for s in snaps]
    first, last = sbe[40] - sbe[0], sbe[120] - sbe[80]  # 10-minute windows, 20 minutes apart: x4
    assert first > 5 and 2.5 < last / first < 6.5
    assert values(snaps[115], "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Hostname="node-01", gpu="4") == [0.0]
    assert values(snaps[121], "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Hostname="node-01", gpu="4") == [1.0]
    assert values(snaps[121], "DCGM_FI_DEV_XID_ERRORS", Hostname="node-01", gpu="4") == [48.0]
    assert touched(sim, sim.t + 15) == {"sbe_rate"}  # nothing else moves
    rows = {(r.entity, r.faulty, r.expected_action) for r in sim.ground_truth}
    assert ("node-01", True, "quarantine") in rows


def test_slow_rank_has_no_thermal_or_clock_signature() -> None:
    snaps, plain, sim = pair({"kind": "slow_rank", "target": "node-02", "onset": 0, "params": {"cause": "nic"}}, 20)
    s, p = snaps[-1], plain[-1]
    ratio = (np.mean(values(s, "fleethealth_rank_compute_seconds", node="node-02"))
             / np.mean(values(p, "fleethealth_rank_compute_seconds", node="node-02")))
    assert 1.035 < ratio < 1.045
    for g in GAUGES:
        assert values(s, g, Hostname="node-02") == values(p, g, Hostname="node-02")
    assert touched(sim, sim.t + 15) == {"compute_mul"}
    (row,) = [r for r in sim.ground_truth if r.entity == "node-02"]
    assert row.faulty and row.expected_action == "quarantine" and "nic" in row.detail


def test_intermittent_fault_bursts_with_its_duty_cycle() -> None:
    fault = {"kind": "intermittent", "target": "node-02", "onset": 0, "params": {"duty": 0.25, "period_s": 600}}
    snaps, _, sim = pair(fault, 160)  # 40 minutes: four periods
    flit = np.array([sum(values(s, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", Hostname="node-02"))
                     for s in snaps])
    rising = np.diff(flit) > 50
    assert 0.18 < rising.mean() < 0.3  # a quarter of the steps
    bursts = int(np.count_nonzero(rising[1:] & ~rising[:-1])) + int(rising[0])
    assert bursts == 4
    xid = [e for e in sim.all_events if e.kind == "xid" and e.node == "node-02"]
    assert len(xid) == 4  # one Xid 74 per burst
    rows = [r for r in sim.ground_truth if r.entity == "node-02"]
    assert len(rows) == 1 and rows[0].faulty  # one incident, not four


def test_silent_hang_stops_progress_and_nothing_else_moves() -> None:
    snaps, plain, sim = pair({"kind": "silent_hang", "target": "node-01", "onset": 150}, 40)
    step = [values(s, "fleethealth_rank_step_seconds")[0] for s in snaps]
    assert step[8] < 5 and step[-1] > 300  # the step in flight grows
    # the ranks waiting at the collective report the compute they finished with (frozen); the hung
    # node's never got there: their compute in flight grows with the hang
    other = values(snaps[-1], "fleethealth_rank_compute_seconds", node="node-02")
    assert other == values(snaps[-2], "fleethealth_rank_compute_seconds", node="node-02")
    comp = np.array(values(snaps[-1], "fleethealth_rank_compute_seconds", node="node-01"))
    before = np.array(values(snaps[-2], "fleethealth_rank_compute_seconds", node="node-01"))
    assert np.allclose(comp - before, 15.0) and comp.min() > 300
    assert not [e for e in sim.all_events if e.kind == "xid"]
    for g in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS"):
        assert values(snaps[-1], g) == values(plain[-1], g)
    assert touched(sim, sim.t + 15) == {"job_hang", "rank_stuck"}
    assert [r.expected_action for r in sim.ground_truth if r.entity == "node-01"] == ["quarantine"]


def test_rack_cooling_is_one_group_to_page_not_drain() -> None:
    snaps, plain, sim = pair({"kind": "cooling_event", "target": "rack:rack-00", "onset": 0, "end": 3600,
                              "params": {"ramp_s": 600}}, 60)
    s, p = snaps[-1], plain[-1]
    for n in ("node-00", "node-01"):
        hot = np.mean(values(s, "DCGM_FI_DEV_GPU_TEMP", Hostname=n)) - np.mean(values(p, "DCGM_FI_DEV_GPU_TEMP", Hostname=n))
        assert 10 < hot < 14
        assert set(values(s, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", Hostname=n)) == {32.0}
    assert values(s, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-02") == values(p, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-02")
    rows = sim.ground_truth
    assert {(r.entity, r.faulty, r.expected_action, r.group) for r in rows} == {
        ("node-00", False, "page", "cooling:rack:rack-00"), ("node-01", False, "page", "cooling:rack:rack-00")}


def test_frozen_exporter_serves_stale_values_with_fresh_timestamps() -> None:
    snaps, plain, sim = pair({"kind": "frozen_exporter", "target": "node-03", "onset": 60, "end": 300}, 30)
    m = "DCGM_FI_DEV_GPU_TEMP"
    frozen = [values(s, m, Hostname="node-03") for s in snaps[4:20]]
    assert all(v == frozen[0] for v in frozen)  # 60 s .. 285 s: the same values
    assert values(snaps[25], m, Hostname="node-03") == values(plain[25], m, Hostname="node-03")  # thawed
    assert values(snaps[10], m, Hostname="node-02") == values(plain[10], m, Hostname="node-02")
    s = snaps[10]
    assert np.all(s.ts == s.at)  # timestamps fresh
    assert [r.faulty for r in sim.ground_truth] == [False]


def test_clock_skew_shifts_one_nodes_timestamps_only() -> None:
    snaps, plain, _ = pair({"kind": "clock_skew", "target": "node-02", "onset": 0, "params": {"skew_s": -120}}, 4)
    s, p = snaps[-1], plain[-1]
    assert np.array_equal(s.values, p.values)
    node_of = np.array([dict(s.labelsets[int(i)]).get("Hostname", dict(s.labelsets[int(i)]).get("node"))
                        for i in s.series_ids])
    assert np.all(s.ts[node_of == "node-02"] == s.at - 120)
    assert np.all(s.ts[node_of == "node-01"] == s.at)


def test_builtin_scenarios_for_each_new_pattern_load() -> None:
    kinds: set[str] = set()
    for name in ("sbe-climb", "slow-rank-host", "intermittent-nvlink", "silent-hang", "rack-cooling",
                 "frozen-exporter", "clock-skew", "pcie-downtrain"):
        assert name in builtin_names()
        kinds |= {f.kind for f in load_scenario(name).faults}
    assert kinds == set(NEW)


POOLS = [{"name": "train", "nodes": 4, "workload": "training", "jobs": [{"name": "job-a", "pp": 2}]},
         {"name": "serve", "nodes": 2, "workload": "serving", "dcgm_fields": "default",
          "serving": {"model": "llama3-8b", "gpus_per_replica": 4}}]


def test_pcie_downtrain_shows_in_the_link_fields_and_retrains_at_the_end() -> None:
    fault = {"kind": "slow_rank", "target": "node-01/gpu2", "onset": 30, "end": 120, "params": {"cause": "pcie"}}
    sim = Simulation(small_scenario([fault], pcie_link_fields=True, pools=POOLS))
    s = run(sim, 6)[-1]
    assert values(s, "DCGM_FI_DEV_PCIE_LINK_GEN", Hostname="node-01") == [5.0, 5.0, 3.0] + [5.0] * 5
    assert values(s, "DCGM_FI_DEV_PCIE_LINK_WIDTH", Hostname="node-01", gpu="2") == [8.0]
    assert values(s, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", Hostname="node-01", gpu="2") == [5.0]
    assert values(s, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", Hostname="node-01", gpu="2") == [16.0]
    back = run(sim, 4)[-1]
    assert values(back, "DCGM_FI_DEV_PCIE_LINK_WIDTH", Hostname="node-01", gpu="2") == [16.0]
    plain = Simulation(small_scenario())  # off by default: no link rows, as before
    assert values(run(plain, 1)[-1], "DCGM_FI_DEV_PCIE_LINK_GEN") == []


def test_a_pool_on_the_default_field_list_lacks_the_optional_fields() -> None:
    sim = Simulation(small_scenario(pools=POOLS))
    s = run(sim, 3)[-1]
    for m in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
              "DCGM_FI_DEV_ROW_REMAP_PENDING"):
        assert values(s, m, Hostname="node-04") == [] and len(values(s, m, Hostname="node-01")) == 8
    for m in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"):
        assert len(values(s, m, Hostname="node-04")) == 8
    assert "ECC_SBE" not in sim.render_node("node-04") and "ECC_SBE" in sim.render_node("node-01")

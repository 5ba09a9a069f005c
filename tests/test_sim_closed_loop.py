"""The simulated world reacts to decisions (``Simulation.apply_action``): a drained node idles and its
ranks leave the job, a drained replica gets no traffic, each OOM class stops once it is answered the way
its class asks, a reset clears a pending remap (a repair does not come into it). Small fleets, real code."""

from __future__ import annotations

import numpy as np
import pytest

from fleethealth.sim import Simulation
from sim_support import small_scenario, values


def run(sim: Simulation, steps: int) -> list:
    return [s for _, s in sim.steps(steps)]


def ooms(sim: Simulation, replica: str) -> list[float]:
    return [e.ts for e in sim.all_events if e.kind == "cuda_oom" and e.entity == replica]


def test_a_drained_node_idles_its_ranks_leave_and_release_brings_it_back() -> None:
    sim = Simulation(small_scenario())
    a = run(sim, 4)[-1]
    assert min(values(a, "DCGM_FI_DEV_GPU_UTIL", Hostname="node-01")) > 80
    assert len(values(a, "fleethealth_rank_compute_seconds", node="node-01")) == 8
    sim.apply_action("node-01", "drain", sim.t)
    b = run(sim, 2)[-1]
    assert max(values(b, "DCGM_FI_DEV_GPU_UTIL", Hostname="node-01")) < 5
    assert values(b, "fleethealth_rank_compute_seconds", node="node-01") == []
    # the others keep training, and their step no longer waits for the drained node
    assert len(values(b, "fleethealth_rank_compute_seconds", node="node-00")) == 8
    assert min(values(b, "DCGM_FI_DEV_GPU_UTIL", Hostname="node-00")) > 80
    sim.apply_action("node-01", "release", sim.t)
    c = run(sim, 1)[-1]
    assert len(values(c, "fleethealth_rank_compute_seconds", node="node-01")) == 8
    assert min(values(c, "DCGM_FI_DEV_GPU_UTIL", Hostname="node-01")) > 80


def test_a_drained_replica_gets_no_traffic() -> None:
    sim = Simulation(small_scenario())
    rep = sim.fleet.replicas[0].name
    a = run(sim, 2)[-1]
    req0 = values(a, "fleethealth_replica_requests_total", replica=rep)[0]
    sim.apply_action(rep, "drain", sim.t)
    b = run(sim, 4)[-1]
    assert values(b, "fleethealth_replica_requests_total", replica=rep)[0] == req0
    assert values(b, "vllm:num_requests_running", replica=rep) == [0.0]
    other = sim.fleet.replicas[1].name
    assert values(b, "vllm:num_requests_running", replica=other)[0] > 0


@pytest.mark.parametrize(("cls", "answer"), [
    ("batch_overload", "limit_concurrency"), ("single_request", "reject_oversized"), ("fragmentation", "rebuild"),
    ("driver", "drain"),
])
def test_each_oom_class_stops_once_answered(cls: str, answer: str) -> None:
    spec = {"kind": "cuda_oom", "target": "replica:llama3-8b-001", "onset": 60,
            "params": {"class": cls, "count": 5, "interval_s": 120}}
    open_sim = Simulation(small_scenario([spec]))
    run(open_sim, 60)
    assert len(ooms(open_sim, "llama3-8b-001")) == 5  # nobody answers: every OOM happens
    sim = Simulation(small_scenario([spec]))
    run(sim, 6)  # t = 75: the first OOM (at 60) happened
    assert len(ooms(sim, "llama3-8b-001")) == 1
    sim.apply_action("llama3-8b-001", answer, sim.t)
    run(sim, 54)
    assert len(ooms(sim, "llama3-8b-001")) == 1


def test_a_concurrency_limit_ends_the_overload_in_the_telemetry() -> None:
    spec = {"kind": "cuda_oom", "target": "replica:llama3-8b-001", "onset": 0,
            "params": {"class": "batch_overload", "count": 3, "interval_s": 600}}
    sim = Simulation(small_scenario([spec]))
    over = np.mean([values(s, "vllm:kv_cache_usage_perc", replica="llama3-8b-001")[0] for s in run(sim, 8)])
    sim.apply_action("llama3-8b-001", "limit_concurrency", sim.t)
    limited = np.mean([values(s, "vllm:kv_cache_usage_perc", replica="llama3-8b-001")[0] for s in run(sim, 8)])
    assert over > 0.85 and limited < 0.75


def test_reset_clears_a_pending_remap_but_not_a_failed_one() -> None:
    sim = Simulation(small_scenario([
        {"kind": "row_remap_pending", "target": "node-02/gpu2", "onset": 30},
        {"kind": "ecc_dbe_remap_failure", "target": "node-03/gpu5", "onset": 30},
    ]))
    a = run(sim, 4)[-1]
    assert values(a, "DCGM_FI_DEV_ROW_REMAP_PENDING", Hostname="node-02", gpu="2") == [1.0]
    assert not sim.active_test("node-02", sim.t)
    assert sim.apply_action("node-02", "reset", sim.t) == ["row_remap_pending"]
    assert sim.apply_action("node-03", "reset", sim.t) == []
    b = run(sim, 1)[-1]
    assert values(b, "DCGM_FI_DEV_ROW_REMAP_PENDING", Hostname="node-02", gpu="2") == [0.0]
    assert sim.active_test("node-02", sim.t) and not sim.active_test("node-03", sim.t)
    assert sim.apply_action("node-03", "repair", sim.t) == ["ecc_dbe_remap_failure"]


def test_unknown_action_or_entity_is_an_error() -> None:
    sim = Simulation(small_scenario())
    with pytest.raises(ValueError, match="unknown action"):
        sim.apply_action("node-01", "pray", sim.t)
    with pytest.raises(ValueError, match="no node or replica"):
        sim.apply_action("node-99", "drain", sim.t)


def test_a_rollback_reboots_onto_the_old_driver_and_its_error_state_is_gone() -> None:
    sim = Simulation(small_scenario([{"kind": "bad_driver_rollout", "target": "pool:train", "onset": 0,
                                      "end": 1800, "params": {"rollout_s": 60, "delay_s": 60}}]))
    a = run(sim, 100)[-1]  # every node failed by now (delay + exponential(900 s) after its upgrade)
    failed = [n for n in ("node-00", "node-01", "node-02", "node-03")
              if 119.0 in values(a, "DCGM_FI_DEV_XID_ERRORS", Hostname=n)]
    assert failed and all(1.0 in values(a, "DCGM_FI_DEV_GPU_RECOVERY_ACTION", Hostname=n) for n in failed)
    b = run(sim, 25)[-1]  # past the rollback at 30 min
    for n in failed:
        assert set(values(b, "DCGM_FI_DEV_XID_ERRORS", Hostname=n)) == {0.0}
        assert set(values(b, "DCGM_FI_DEV_GPU_RECOVERY_ACTION", Hostname=n)) == {0.0}
        assert sim.active_test(n, sim.t)

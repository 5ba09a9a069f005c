"""The simulator's telemetry: determinism, real names, counters, workload shape, and every fault showing
up in the right signals at onset (small fleets, real code, no mocks)."""

from __future__ import annotations

import numpy as np

from fleethealth.sim import Simulation
from fleethealth.sim.simulation import GPU_COUNTERS, GPU_GAUGES
from sim_support import series, small_scenario, values

START = 1767225600.0


def run(sim: Simulation, steps: int) -> list:
    return [s for _, s in sim.steps(steps)]


def test_deterministic_from_seed() -> None:
    a = run(Simulation(small_scenario(seed=3)), 20)
    b = run(Simulation(small_scenario(seed=3)), 20)
    c = run(Simulation(small_scenario(seed=4)), 20)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.values, y.values) and np.array_equal(x.series_ids, y.series_ids)
        assert x.labelsets == y.labelsets
    assert not np.array_equal(a[-1].values, c[-1].values)


def test_a_fault_does_not_change_the_background_noise() -> None:
    plain = run(Simulation(small_scenario()), 12)[-1]
    faulty = run(Simulation(small_scenario([{"kind": "thermal_drift", "target": "node-00", "onset": 0}])), 12)[-1]
    other = {"Hostname": "node-03"}
    assert series(plain, "DCGM_FI_DEV_GPU_TEMP", **other) == series(faulty, "DCGM_FI_DEV_GPU_TEMP", **other)


def test_real_names_and_labels() -> None:
    sim = Simulation(small_scenario())
    snap = run(sim, 2)[-1]
    names = set(snap.metrics)
    for m in GPU_GAUGES + GPU_COUNTERS + [
        "fleethealth_rank_compute_seconds", "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:request_success_total",
        "fleethealth_replica_errors_total", "fleethealth_replica_requests_total", "fleethealth_node_info",
        "fleethealth_replica_info",
    ]:
        assert m in names, m
    temp = series(snap, "DCGM_FI_DEV_GPU_TEMP")
    assert len(temp) == 6 * 8
    labels = dict(next(iter(temp)))
    for k in ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"):
        assert k in labels
    rank = dict(next(iter(series(snap, "fleethealth_rank_compute_seconds"))))
    assert {"job", "rank", "node", "gpu", "peer_group"} <= set(rank)
    info = [dict(ls) for ls in series(snap, "fleethealth_node_info")]
    assert {"node", "pool", "rack", "tp_group", "driver_version", "kernel_version"} <= set(info[0])
    rinfo = [dict(ls) for ls in series(snap, "fleethealth_replica_info")]
    assert len(rinfo) == 4 and {"replica", "node", "build", "model"} <= set(rinfo[0])
    # plausible healthy values
    t = np.array(list(temp.values()))
    assert 50 < t.mean() < 80 and t.max() < 85
    assert 1850 < np.median(values(snap, "DCGM_FI_DEV_SM_CLOCK")) < 1990


def test_counters_are_monotonic_and_histograms_cumulative() -> None:
    sim = Simulation(small_scenario())
    snaps = run(sim, 40)
    counters = [m for m in snaps[0].metrics if m.endswith(("_total", "_COUNTER", "_VIOLATION", "_bucket", "_count",
                                                                  "_CONSUMPTION"))]
    prev: dict = {}
    for s in snaps:
        for m in counters:
            for ls, v in series(s, m).items():
                assert v >= prev.get((m, ls), 0.0), (m, dict(ls))
                prev[(m, ls)] = v
    last = snaps[-1]
    ttft = series(last, "vllm:time_to_first_token_seconds_bucket", replica="llama3-8b-000")
    by_le = sorted(((float(dict(ls)["le"]), v) for ls, v in ttft.items()))
    counts = [v for _, v in by_le]
    assert counts == sorted(counts) and by_le[-1][0] == float("inf")
    total = values(last, "vllm:time_to_first_token_seconds_count", replica="llama3-8b-000")[0]
    assert counts[-1] == total
    assert values(last, "fleethealth_replica_requests_total", replica="llama3-8b-000")[0] > 0


def test_replica_restart_resets_counters() -> None:
    sim = Simulation(small_scenario([{"kind": "replica_restart", "target": "replica:llama3-8b-001",
                                      "onset": 150}]))
    before = run(sim, 10)[-1]
    after = run(sim, 2)[-1]
    r = {"replica": "llama3-8b-001"}
    assert values(before, "fleethealth_replica_requests_total", **r)[0] > 1000
    assert values(after, "fleethealth_replica_requests_total", **r)[0] < 500
    assert [g.faulty for g in sim.ground_truth] == [False]


def test_step_time_equal_on_every_rank_and_stages_are_peers() -> None:
    sim = Simulation(small_scenario())
    snap = run(sim, 3)[-1]
    steps = values(snap, "fleethealth_rank_step_seconds", job="job-a")
    comp = values(snap, "fleethealth_rank_compute_seconds", job="job-a")
    assert len(steps) == 32 and len(set(steps)) == 1
    assert steps[0] > max(comp)
    assert len(set(comp)) > 20
    stages = {dict(ls)["peer_group"] for ls in series(snap, "fleethealth_rank_compute_seconds")}
    assert stages == {"stage0", "stage1"}


def test_stage_imbalance_and_seq_imbalance_shapes() -> None:
    sim = Simulation(small_scenario([
        {"kind": "stage_imbalance", "target": "job:job-a", "onset": 0, "params": {"stage_weights": [1.0, 1.6]}},
    ]))
    snap = run(sim, 2)[-1]
    s0 = np.median(values(snap, "fleethealth_rank_compute_seconds", peer_group="stage0"))
    s1 = np.median(values(snap, "fleethealth_rank_compute_seconds", peer_group="stage1"))
    assert 1.5 < s1 / s0 < 1.7
    gt = sim.ground_truth
    assert gt and not any(g.faulty for g in gt) and {g.entity for g in gt} == {"node-01", "node-03"}

    sim = Simulation(small_scenario([{"kind": "seq_imbalance", "target": "job:job-a", "onset": 0}]))
    slowest = []
    for snap in run(sim, 30):
        comp = series(snap, "fleethealth_rank_compute_seconds", peer_group="stage0")
        slowest.append(dict(max(comp, key=comp.__getitem__))["node"])
    # different ranks are slow at different steps, no persistent straggler
    assert len(set(slowest)) == 2


def test_thermal_drift_follows_the_seed() -> None:
    fault = [{"kind": "thermal_drift", "target": "node-02", "onset": 0, "params": {"ramp_s": 600}}]
    sim = Simulation(small_scenario(fault, duration="2h"))
    base = Simulation(small_scenario(duration="2h"))  # same seed, same noise: the difference is the fault
    snaps = run(sim, 41)  # severity 1 at 600 s (step 40)
    plain = run(base, 41)
    s, p = snaps[-1], plain[-1]
    n2 = {"Hostname": "node-02"}
    hot = np.mean(values(s, "DCGM_FI_DEV_GPU_TEMP", **n2)) - np.mean(values(p, "DCGM_FI_DEV_GPU_TEMP", **n2))
    assert 3 < hot < 5  # seed: +4 C
    clk = np.mean(values(s, "DCGM_FI_DEV_SM_CLOCK", **n2)) / np.mean(values(p, "DCGM_FI_DEV_SM_CLOCK", **n2))
    assert 0.965 < clk < 0.975  # seed: -3 %
    comp = np.mean(values(s, "fleethealth_rank_compute_seconds", node="node-02"))
    ref = np.mean(values(p, "fleethealth_rank_compute_seconds", node="node-02"))
    assert 1.018 < comp / ref < 1.026  # seed: 1.82 -> 1.86 s
    assert values(s, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-00") == values(p, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-00")
    later = run(sim, 80)[-1]  # severity 3: worse, and now thermal violations accumulate
    assert np.mean(values(later, "DCGM_FI_DEV_THERMAL_VIOLATION", **n2)) > 0
    assert max(values(later, "DCGM_FI_DEV_THERMAL_VIOLATION", Hostname="node-00")) == 0


def test_xid79_gpu_vanishes_and_active_test_fails_until_repair() -> None:
    sim = Simulation(small_scenario([{"kind": "xid79_off_bus", "target": "node-01/gpu3", "onset": 60}]))
    run(sim, 4)
    at = run(sim, 1)[-1]  # t = 60
    assert values(at, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-01", gpu="3") == [79.0]
    assert values(at, "DCGM_EXP_XID_ERRORS_COUNT", Hostname="node-01", gpu="3", xid="79") == [1.0]
    gone = run(sim, 3)[-1]
    assert len(values(gone, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-01")) == 7
    assert values(gone, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-01", gpu="3") == []
    assert values(gone, "fleethealth_rank_compute_seconds", node="node-01", gpu="3") == []
    assert not sim.active_test("node-01", sim.t) and sim.active_test("node-00", sim.t)
    ev = [e for e in sim.all_events if e.kind == "xid"]
    assert ev and "Xid (PCI:0000:5D:00): 79" in ev[0].context["line"]
    assert sim.apply_action("node-01", "repair", sim.t) == ["xid79_off_bus"]
    back = run(sim, 1)[-1]
    assert len(values(back, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-01")) == 8
    assert sim.active_test("node-01", sim.t)


def test_dbe_then_remap_failure_and_pending_remap() -> None:
    sim = Simulation(small_scenario([
        {"kind": "ecc_dbe_remap_failure", "target": "node-00/gpu5", "onset": 30},
        {"kind": "row_remap_pending", "target": "node-04/gpu2", "onset": 30},
    ]))
    run(sim, 2)
    a = run(sim, 1)[-1]
    assert values(a, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", Hostname="node-00", gpu="5") == [1.0]
    assert values(a, "DCGM_FI_DEV_ROW_REMAP_PENDING", Hostname="node-04", gpu="2") == [1.0]
    assert values(a, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-04", gpu="2") == [63.0]
    b = run(sim, 1)[-1]
    assert values(b, "DCGM_FI_DEV_ROW_REMAP_FAILURE", Hostname="node-00", gpu="5") == [1.0]
    assert values(b, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-00", gpu="5") == [64.0]
    assert not sim.active_test("node-04", sim.t)
    assert sim.apply_action("node-04/gpu2", "reset", sim.t) == ["row_remap_pending"]
    c = run(sim, 1)[-1]
    assert values(c, "DCGM_FI_DEV_ROW_REMAP_PENDING", Hostname="node-04", gpu="2") == [0.0]
    assert sim.active_test("node-04", sim.t)
    assert not sim.active_test("node-00", sim.t)  # a failed remap needs a repair, not a reset


def test_nvlink_errors_hang_the_job_and_pcie_storm() -> None:
    sim = Simulation(small_scenario([
        {"kind": "nvlink_errors", "target": "node-02", "onset": 30, "params": {"hang_after_s": 60}},
        {"kind": "pcie_replay_storm", "target": "node-05/gpu6", "onset": 30},
    ]))
    before = run(sim, 2)[-1]
    snaps = run(sim, 12)
    last = snaps[-1]
    flit = np.array(values(last, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", Hostname="node-02"))
    assert (flit > 1000).all()
    assert values(last, "DCGM_EXP_XID_ERRORS_COUNT", Hostname="node-02", xid="74")
    step_before = values(before, "fleethealth_rank_step_seconds")[0]
    assert values(last, "fleethealth_rank_step_seconds")[0] > 100 > step_before
    rate = (values(last, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Hostname="node-05", gpu="6")[0]
            - values(before, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", Hostname="node-05", gpu="6")[0]) / (12 * 15)
    assert rate > 50


def test_missing_data_is_missing_not_healthy() -> None:
    sim = Simulation(small_scenario([
        {"kind": "exporter_outage", "target": "node-01", "onset": 30, "end": 90},
        {"kind": "network_partition", "target": "rack:rack-02", "onset": 30, "end": 60},
    ]))
    run(sim, 2)
    s = run(sim, 1)[-1]
    hosts = {dict(ls)["Hostname"] for ls in series(s, "DCGM_FI_DEV_GPU_TEMP")}
    assert hosts == {"node-00", "node-02", "node-03"}
    assert {e.source for e in s.source_errors} == {"target node-01:9400", "target node-04:9400",
                                                   "target node-05:9400"}
    up = {dict(ls)["instance"]: v for ls, v in series(s, "up").items()}
    assert up["node-01:9400"] == 0 and up["node-00:9400"] == 1
    assert all(not g.faulty for g in sim.ground_truth)
    assert sim.active_test("node-01", sim.t)
    later = run(sim, 4)[-1]
    assert len({dict(ls)["Hostname"] for ls in series(later, "DCGM_FI_DEV_GPU_TEMP")}) == 6
    assert not later.source_errors


def test_xid13_many_nodes_none_faulty() -> None:
    sim = Simulation(small_scenario([{"kind": "xid13_bad_kernel", "target": "job:job-a", "onset": 0,
                                      "params": {"per_node_per_hour": 60}}]))
    last = run(sim, 40)[-1]
    hit = {dict(ls)["Hostname"] for ls in series(last, "DCGM_EXP_XID_ERRORS_COUNT", xid="13")}
    assert hit == {"node-00", "node-01", "node-02", "node-03"}
    assert all(not g.faulty and g.expected_action == "none" for g in sim.ground_truth)
    assert sim.active_test("node-00", sim.t)


def test_bad_driver_rollout_relabels_then_fails() -> None:
    sim = Simulation(small_scenario([{"kind": "bad_driver_rollout", "target": "pool:train", "onset": 0,
                                      "params": {"rollout_s": 60, "delay_s": 30, "driver": "560.28.03"}}]))
    snaps = run(sim, 200)
    last = snaps[-1]
    drivers = {dict(ls)["DCGM_FI_DRIVER_VERSION"] for ls in series(last, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-00")}
    assert drivers == {"560.28.03"}
    info = [dict(ls) for ls in series(last, "fleethealth_node_info", pool="train")]
    assert {i["driver_version"] for i in info} == {"560.28.03"}
    serve = {dict(ls)["DCGM_FI_DRIVER_VERSION"] for ls in series(last, "DCGM_FI_DEV_GPU_TEMP", Hostname="node-05")}
    assert serve == {"550.54.15"}
    failed = {dict(ls)["Hostname"] for ls in series(last, "DCGM_EXP_XID_ERRORS_COUNT", xid="119")}
    assert len(failed) >= 3
    gt = sim.ground_truth
    assert {g.expected_action for g in gt} == {"page"} and len({g.group for g in gt}) == 1


def test_serving_regression_and_slo_burn() -> None:
    sim = Simulation(small_scenario([
        {"kind": "serving_build_regression", "target": "build:v2", "onset": 0},
        {"kind": "replica_slo_burn", "target": "replica:llama3-8b-000", "onset": 0},
    ]))
    first = run(sim, 1)[-1]
    last = run(sim, 40)[-1]

    def err_rate(rep: str) -> float:
        e = values(last, "fleethealth_replica_errors_total", replica=rep)[0] - values(
            first, "fleethealth_replica_errors_total", replica=rep)[0]
        n = values(last, "fleethealth_replica_requests_total", replica=rep)[0] - values(
            first, "fleethealth_replica_requests_total", replica=rep)[0]
        return e / n

    def slow_share(rep: str) -> float:  # share of TTFT above 2.5 s in the window
        def b(s, le):  # type: ignore[no-untyped-def]
            return values(s, "vllm:time_to_first_token_seconds_bucket", replica=rep, le=le)[0]
        n = b(last, "+Inf") - b(first, "+Inf")
        return 1 - (b(last, "2.5") - b(first, "2.5")) / n

    healthy = "llama3-8b-002"  # build v1
    assert err_rate("llama3-8b-001") > 0.03 and err_rate("llama3-8b-003") > 0.03  # build v2
    assert err_rate(healthy) < 0.01
    assert slow_share("llama3-8b-001") > 0.05 > slow_share(healthy)
    assert err_rate("llama3-8b-000") > 0.02
    clk = series(last, "DCGM_FI_DEV_SM_CLOCK", Hostname="node-04", gpu="0")
    assert list(clk.values())[0] < 1500
    gt = {(g.entity, g.faulty) for g in sim.ground_truth}
    assert ("llama3-8b-000", True) in gt and ("node-04/gpu0", True) in gt
    assert ("llama3-8b-001", False) in gt


def test_oom_events_carry_context_and_class() -> None:
    faults = [
        {"kind": "cuda_oom", "target": "replica:llama3-8b-000", "onset": 15, "params": {"class": c, "count": 1}}
        for c in ("single_request", "batch_overload", "fragmentation", "driver")
    ]
    sim = Simulation(small_scenario(faults))
    run(sim, 3)
    ooms = [e for e in sim.events(sim.t, since=START) if e.kind == "cuda_oom"]
    assert sorted(e.truth for e in ooms) == ["batch_overload", "driver", "fragmentation", "single_request"]
    for e in ooms:
        for k in ("prompt_tokens", "max_tokens", "batch_size", "kv_cache_usage", "gpu", "model_version",
                  "adapter_version", "recent_xids"):
            assert k in e.context, (e.truth, k)
    by = {e.truth: e.context for e in ooms}
    assert by["single_request"]["prompt_tokens"] > 100_000
    assert by["batch_overload"]["kv_cache_usage"] >= 0.98
    assert by["fragmentation"]["reserved_unallocated_mib"] > 0
    assert by["driver"]["recent_xids"] == [119]
    assert not sim.active_test("node-04", sim.t)


def test_live_injection() -> None:
    sim = Simulation(small_scenario())
    run(sim, 4)
    sim.inject({"kind": "xid79_off_bus", "target": "node-00/gpu1", "onset": 0})
    s = run(sim, 1)[-1]
    assert values(s, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-00", gpu="1") == [79.0]
    assert sim.ground_truth[0].onset == START + 4 * 15 - 15


def test_oom_contexts_classify_as_their_ground_truth() -> None:
    """The decisions layer's OOM classifier, fed the simulator's events the way the backtest feeds them,
    finds each event's true class."""
    import dataclasses

    from fleethealth.backtest.events import oom_event
    from fleethealth.decide.oom import OomEvent, classify_oom

    expect = {"single_request": "oversized_request", "batch_overload": "batch_overload",
              "fragmentation": "fragmentation", "driver": "device_fault"}
    faults = [{"kind": "cuda_oom", "target": "replica:llama3-8b-000", "onset": 15,
               "params": {"class": c, "count": 4, "interval_s": 15}} for c in expect]
    sim = Simulation(small_scenario(faults))
    run(sim, 6)
    names = {f.name for f in dataclasses.fields(OomEvent)}
    seen = 0
    for e in sim.all_events:
        if e.kind != "cuda_oom":
            continue
        payload = oom_event(e).payload
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in payload.items() if k in names}
        assert str(classify_oom(OomEvent(ts=e.ts, **fields)).cls) == expect[e.truth]
        seen += 1
    assert seen == 16


def test_default_dcgm_field_list_leaves_optional_fields_out() -> None:
    sim = Simulation(small_scenario([{"kind": "row_remap_pending", "target": "node-00/gpu1", "onset": 0}],
                                    dcgm_fields="default"))
    snap = run(sim, 2)[-1]
    names = set(snap.metrics[i] for i in np.unique(snap.metric_ids))
    assert "DCGM_FI_DEV_GPU_TEMP" in names and "DCGM_FI_DEV_XID_ERRORS" in names
    for m in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_PENDING",
              "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_THERMAL_VIOLATION"):
        assert m not in names
    # the Xid still shows: the remap is visible as Xid 63 only
    assert values(snap, "DCGM_FI_DEV_XID_ERRORS", Hostname="node-00", gpu="1") == [63.0]


def test_training_only_serving_only_and_idle_fleets_run() -> None:
    from fleethealth.sim import Scenario

    for pool in ({"name": "t", "nodes": 3}, {"name": "s", "nodes": 2, "workload": "serving"},
                 {"name": "i", "nodes": 2, "workload": "idle"}):
        sim = Simulation(Scenario.model_validate({"name": "x", "duration": "2m", "fleet": {"pools": [pool]}}))
        snaps = [s for _, s in sim.steps()]
        assert len(snaps) == 8 and all(np.isfinite(s.values).all() for s in snaps)
        assert "DCGM_FI_DEV_GPU_TEMP" in sim.render_node(sim.fleet.nodes[0])


def test_replicas_generate_tokens_and_inter_token_latencies() -> None:
    # Every request generates its replica's output tokens, and each token adds an inter-token latency
    # sample (a bug once left both counters standing still while requests kept coming).
    sim = Simulation(small_scenario())
    first, last = run(sim, 2)[-1], run(sim, 40)[-1]
    r = {"replica": "llama3-8b-001"}

    def grew(metric: str, **match: str) -> float:
        return values(last, metric, **r, **match)[0] - values(first, metric, **r, **match)[0]

    requests = grew("vllm:request_success_total", finished_reason="stop") + grew(
        "vllm:request_success_total", finished_reason="length")
    tokens = grew("vllm:generation_tokens_total")
    spec = next(x for x in sim.fleet.replicas if x.name == "llama3-8b-001").spec
    assert requests > 100 and 0.5 * spec.output_tokens < tokens / requests < 2.0 * spec.output_tokens
    itl = grew("vllm:inter_token_latency_seconds_count")
    assert 0.9 * tokens < itl < 1.1 * tokens

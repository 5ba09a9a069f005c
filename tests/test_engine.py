"""Behaviour of the scoring engine: shapes, gates, freshness, confidence, peers, rates, SLOs, roll-up."""

from __future__ import annotations

import numpy as np
import pytest

from fleethealth.bench.fleet import synthetic_fleet
from fleethealth.bench.scoring import compare
from fleethealth.policy import default_policy, default_policy_text, parse_policy
from fleethealth.score import shapes
from fleethealth.score.engine import score_snapshot
from fleethealth.score.reference import score_reference
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder

NOW = 1_800_000_000.0
POL = default_policy()


def gpu_labels(node: str, g: int, model: str = "NVIDIA H100 80GB HBM3") -> dict[str, str]:
    return dict(gpu=str(g), UUID=f"GPU-{node}-{g}", Hostname=node, modelName=model,
                pci_bus_id=f"00000000:{0x18 + g:02X}:00.0")


def healthy_node(b: SnapshotBuilder, node: str, ts: float = NOW - 5, gpus: int = 8, clock: float = 1980.0) -> None:
    for g in range(gpus):
        lab = gpu_labels(node, g)
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, ts)
        b.add("DCGM_FI_DEV_SM_CLOCK", lab, clock + g, ts)
        b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, ts)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts - 30)
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts)


def fleet(n_nodes: int = 6, **kw: float) -> SnapshotBuilder:
    b = SnapshotBuilder()
    for i in range(n_nodes):
        healthy_node(b, f"n{i}", **kw)
    return b


def test_shapes_basics() -> None:
    assert shapes.ramp(np.array([50.0, 85, 90, 95, 100]), 85, 95).tolist() == [1, 1, 0.5, 0, 0]
    assert shapes.ramp(np.array([1.0, 0.5, 0.0]), 1.0, 0.0).tolist() == [1, 0.5, 0]  # worse when lower
    g = shapes.gate(np.array([0.0, 1.0, np.nan]), above=0)
    assert g[0] == 1 and g[1] == 0 and np.isnan(g[2])
    # MAD of zero: identical peers, one slightly different: finite z, no division by zero
    z, med, mad, counts = shapes.peer_robust_z(np.array([1.0, 1, 1, 1, 1.5]), np.zeros(5, np.int64), 1)
    assert np.isfinite(z).all() and med[0] == 1.0 and mad[0] == 0.0 and z[4] > 6


def test_healthy_fleet_is_healthy_with_full_confidence() -> None:
    fh = score_snapshot(fleet().build(NOW), POL, NOW)
    nodes = fh.by_kind("node")
    assert len(nodes) == 6 and all(t.value == 1.0 and t.confidence == 1.0 for t in nodes)
    assert len(fh.by_kind("gpu")) == 48


def test_fatal_xid_gates_gpu_and_node() -> None:
    b = fleet()
    b.add("DCGM_FI_DEV_XID_ERRORS", gpu_labels("n2", 3), 79, NOW - 1)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    t = fh.tuples["n2"]
    assert t.value == 0.0 and t.reason == "gate:xid" and t.worst == "hardware"
    assert t.worst_member == "n2/gpu3" and "xid:79" in t.flags
    assert fh.tuples["n2/gpu3"].value == 0.0
    assert fh.tuples["n1"].value == 1.0


@pytest.mark.parametrize("xid", [13, 31, 43, 94])
def test_application_xids_do_not_gate(xid: int) -> None:
    b = fleet()
    b.add("DCGM_FI_DEV_XID_ERRORS", gpu_labels("n2", 3), xid, NOW - 1)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["n2"]
    assert t.value == 1.0 and f"xid:{xid}" in t.flags


def test_row_remap_pending_is_a_flag_not_a_gate() -> None:
    b = fleet()
    b.add("DCGM_FI_DEV_XID_ERRORS", gpu_labels("n1", 0), 63, NOW - 1)
    b.add("DCGM_FI_DEV_ROW_REMAP_PENDING", gpu_labels("n1", 1), 1, NOW - 1)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["n1"]
    assert t.value is not None and t.value >= 0.7
    assert "row_remap_pending" in t.flags and "xid:63" in t.flags


def test_xid_counter_with_label_and_unknown_xid() -> None:
    b = fleet()
    lab = gpu_labels("n3", 2)
    b.add("DCGM_EXP_XID_ERRORS_COUNT", {**lab, "xid": "48"}, 0, NOW - 60)
    b.add("DCGM_EXP_XID_ERRORS_COUNT", {**lab, "xid": "48"}, 1, NOW - 5)
    b.add("DCGM_EXP_XID_ERRORS_COUNT", {**gpu_labels("n4", 1), "xid": "9999"}, 0, NOW - 60)
    b.add("DCGM_EXP_XID_ERRORS_COUNT", {**gpu_labels("n4", 1), "xid": "9999"}, 2, NOW - 5)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    assert fh.tuples["n3"].reason == "gate:xid_count"
    t4 = fh.tuples["n4"]
    assert t4.value == 1.0 and "xid_unknown:9999" in t4.flags
    assert any("unknown Xid 9999" in i.reason for i in fh.issues)


def test_stale_data_is_unknown_never_healthy() -> None:
    b = fleet()
    healthy_node(b, "dead", ts=NOW - 3000)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    t = fh.tuples["dead"]
    assert t.value is None and t.confidence == 0.0 and t.reason == "no_fresh_data"


def test_partial_exporter_loss_lowers_confidence() -> None:
    b = fleet()
    for g in range(8):  # only temperature left for node n9
        b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("n9", g), 60, NOW - 5)
        b.add("DCGM_FI_DEV_SM_CLOCK", gpu_labels("n9", g), 1980, NOW - 900)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["n9"]
    assert t.value == 1.0 and t.confidence < 0.5


def test_inventory_entity_without_samples_is_unknown() -> None:
    fh = score_snapshot(fleet().build(NOW), POL, NOW, inventory={"node": ["ghost"]})
    t = fh.tuples["ghost"]
    assert t.value is None and t.confidence == 0.0


def test_clock_skew_samples_ignored_and_reported() -> None:
    b = fleet()
    b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("n0", 0), 200, NOW + 3600)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    assert fh.tuples["n0"].value == 1.0
    assert any("clock skew" in i.reason for i in fh.issues)


def test_thermal_ramp_and_reason() -> None:
    b = fleet()
    b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("n1", 5), 90, NOW - 1)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["n1"]
    assert t.value == pytest.approx(0.5) and t.reason == "min:thermal" and t.worst_member == "n1/gpu5"


def test_counter_reset_is_not_negative_rate_and_raw_counter_never_scored() -> None:
    b = fleet()
    lab = gpu_labels("n0", 0)
    # a huge cumulative counter that does not move: rate 0, healthy
    b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", lab, 1e9, NOW - 60)
    b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", lab, 1e9, NOW - 5)
    # reset: 500 -> 10 means 10 new errors since restart
    lab1 = gpu_labels("n0", 1)
    b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", lab1, 500, NOW - 60)
    b.add("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", lab1, 10, NOW - 5)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    d0 = {d.signal: d for d in fh.tuples["n0/gpu0"].details}
    d1 = {d.signal: d for d in fh.tuples["n0/gpu1"].details}
    assert d0["nvlink_crc_flit"].rate == 0.0 and d0["nvlink_crc_flit"].score == 1.0
    assert d1["nvlink_crc_flit"].rate == pytest.approx(10 / 55)


def test_counter_storm_scores_low() -> None:
    b = fleet()
    lab = gpu_labels("n0", 0)
    b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 0, NOW - 61)
    b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 6000, NOW - 1)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["n0"]
    assert t.value == 0.0 and t.reason == "min:pcie"


def test_too_few_peers_not_scored_and_lowers_confidence() -> None:
    b = SnapshotBuilder()
    healthy_node(b, "solo", gpus=3)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["solo/gpu0"]
    d = {x.signal: x for x in t.details}
    assert d["sm_clock"].score is None and "too few peers" in d["sm_clock"].note
    assert t.confidence < 1.0 and t.value == 1.0


def test_peers_are_chosen_by_labels() -> None:
    b = fleet()
    for g in range(8):  # a different GPU model clocks lower: not an outlier among its own peers
        lab = gpu_labels("a100", g, model="NVIDIA A100-SXM4-80GB")
        b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1410 + g, NOW - 5)
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60, NOW - 5)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    # only 8 A100 peers... enough (min 5): all fine
    assert fh.tuples["a100"].value == 1.0


def test_serving_consumer_uses_geometric_mean() -> None:
    b = fleet()
    b.add("DCGM_FI_DEV_GPU_TEMP", gpu_labels("n1", 9), 90, NOW - 1)  # thermal 0.5
    for i, t in enumerate((NOW - 61, NOW - 31, NOW - 1)):  # pcie 0.5: 25.5/s on its long and short window
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", gpu_labels("n1", 9), 25.5 * 30 * i, t)
    snap = b.build(NOW)
    t_min = score_snapshot(snap, POL, NOW, consumer="training").tuples["n1/gpu9"]
    t_g = score_snapshot(snap, POL, NOW, consumer="serving").tuples["n1/gpu9"]
    assert t_min.value == pytest.approx(0.5)
    assert t_g.reason.startswith("gmean:")
    n_cats = sum(1 for v in t_g.categories.values() if v is not None)
    assert t_g.value == pytest.approx(0.25 ** (1 / n_cats), rel=1e-6)


def _replica(b: SnapshotBuilder, name: str, t: float, reqs: float, errs: float, fast: float) -> None:
    lab = dict(replica=name, model_name="llama", build="v1")
    b.add("fleethealth_replica_requests_total", lab, reqs, t)
    b.add("fleethealth_replica_errors_total", lab, errs, t)
    b.add("vllm:time_to_first_token_seconds_count", lab, reqs, t)
    b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "2.0"}, fast, t)
    b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "+Inf"}, reqs, t)


def test_slo_burn_rate_scores_replicas() -> None:
    b = SnapshotBuilder()
    for k in range(0, 3601, 60):
        t = NOW - 3600 + k
        _replica(b, "good", t, reqs=10 * k, errs=0.001 * 10 * k, fast=10 * k)
        _replica(b, "burning", t, reqs=10 * k, errs=0.2 * 10 * k, fast=10 * k)  # 20x budget
        _replica(b, "slow", t, reqs=10 * k, errs=0, fast=0.96 * 10 * k)  # 4% slow: 4x budget
    fh = score_snapshot(b.build(NOW), POL, NOW, consumer="serving")
    good, burning, slow = fh.tuples["good"], fh.tuples["burning"], fh.tuples["slow"]
    assert good.kind == "replica" and good.value == 1.0
    assert burning.value == 0.0 and burning.worst == "errors"
    assert slow.value is not None and 0.0 < slow.value < 0.7 and slow.worst == "serving"


def test_history_rates_across_snapshots_and_dead_exporter() -> None:
    h = SignalHistory(POL)
    for k in range(10):
        t = NOW - 300 + 30 * k
        b = SnapshotBuilder()
        for i in range(6):
            node = f"n{i}"
            if node == "n5" and k > 3:
                continue  # exporter died
            for g in range(8):
                lab = gpu_labels(node, g)
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60, t)
                b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980, t)
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, t)
                b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 3000 * k if node == "n1" else 3, t)
        h.add(b.build(t))
    view = h.view(NOW - 30)
    fh = score_snapshot(view, POL, NOW - 30)
    assert fh.tuples["n1"].reason == "min:pcie" and fh.tuples["n1"].value is not None
    assert fh.tuples["n1"].value < 0.1  # 3000 replays / 30 s = 100/s
    assert fh.tuples["n0"].value == 1.0
    assert fh.tuples["n5"].value is None  # stale, still visible


def test_policy_override_changes_scores() -> None:
    text = default_policy_text().replace("    warn: 85\n    crit: 95", "    warn: 50\n    crit: 70")
    pol = parse_policy(text)
    t = score_snapshot(fleet().build(NOW), pol, NOW).tuples["n0"]
    assert t.value == pytest.approx(0.5) and t.reason == "min:thermal"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_engine_matches_scalar_reference(seed: int) -> None:
    snap = synthetic_fleet(800, seed=seed, fault_rate=0.05)
    fh = score_snapshot(snap, POL, snap.at)
    ref = score_reference(snap, POL, snap.at)
    assert compare(fh, ref) == []
    assert len(ref) == 900


def test_gpu_without_node_label_is_scored_under_a_placeholder() -> None:
    b = SnapshotBuilder()
    for g in range(6):
        b.add("DCGM_FI_DEV_GPU_TEMP", {"gpu": str(g), "UUID": f"U{g}"}, 99 if g == 2 else 50, NOW - 1)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    t = fh.tuples["(no-node-label)"]
    assert t.value == 0.0 and t.worst_member == "(no-node-label)/gpu2"


def test_empty_snapshot_scores_nothing() -> None:
    fh = score_snapshot(SnapshotBuilder().build(NOW), POL, NOW)
    assert len(fh) == 0


def test_last_xid_gauge_that_never_resets_stops_gating_after_the_window() -> None:
    """dcgm-exporter keeps the last Xid until it restarts: an old value is not a new occurrence."""
    h = SignalHistory(POL)
    lab = gpu_labels("n0", 0)
    t0 = NOW - 3000
    for k in range(0, 3001, 30):
        b = SnapshotBuilder()
        b.add("DCGM_FI_DEV_XID_ERRORS", lab, 79 if k >= 600 else 0, t0 + k)
        b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60, t0 + k)
        h.add(b.build(t0 + k))
        if k == 900:
            early = score_snapshot(h.view(t0 + k), POL, t0 + k).tuples["n0/gpu0"]
    assert early.reason == "gate:xid"
    late = score_snapshot(h.view(NOW), POL, NOW).tuples["n0/gpu0"]
    assert late.value == 1.0 and "xid:79" not in late.flags
    b = SnapshotBuilder()
    b.add("DCGM_FI_DEV_XID_ERRORS", lab, 48, NOW + 30)
    h.add(b.build(NOW + 30))
    assert score_snapshot(h.view(NOW + 30), POL, NOW + 30).tuples["n0/gpu0"].reason == "gate:xid"


def test_kernel_log_fallen_off_gates_the_gpu() -> None:
    b = fleet()
    lab = {"Hostname": "n3", "gpu": "4", "pci_bus_id": "0000:3b:00.0"}
    b.add("fleethealth_kernel_gpu_fallen_off_total", lab, 0, NOW - 100)
    b.add("fleethealth_kernel_gpu_fallen_off_total", lab, 1, NOW - 99.999)
    t = score_snapshot(b.build(NOW), POL, NOW).tuples["n3"]
    assert t.reason == "gate:kernel_fallen_off" and t.worst_member == "n3/gpu4"

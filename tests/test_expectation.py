"""Issue 14's problem list on the scorer, one test per case, each reproduced first with ``fleethealth
score``: missing data is never healthy. What the structural tracker and the controller do (absence inside
a fresh read, the tracker's memory kept in the state store across a restart) is tested in
test_sources_structural.py and test_controller_restart.py. An expected GPU that is unknown makes its node unknown (``missing:gpuN``);
a signal that needs two samples (a rate, a burn rate) seen while its exporter reports fresh is expected
and not yet fresh (``pending:<signals>``); a family most GPUs carry is expected of every GPU (peers:
``missing:<family>``). Each test failed on the engine before these rules."""

from __future__ import annotations

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import SnapshotBuilder

POL = default_policy()
NOW = 1_000_000.0


def _gpu(b: SnapshotBuilder, node: str, g: int, t: float) -> None:
    lab = {"gpu": str(g), "UUID": f"GPU-{node}-{g}", "Hostname": node, "modelName": "H100"}
    b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0, t)
    b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, t)
    b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
    b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 0.0, t)



def test_a_node_whose_dcgm_exporter_is_gone_while_its_ranks_report_is_not_confident() -> None:
    """``fleethealth score`` on four nodes' pages, n4 with rank timings only: n4 read 1.000, confidence
    1.00. Its peers (the job's other nodes) carry the DCGM family: on n4 it is expected and missing."""
    b = SnapshotBuilder()
    for i, node in enumerate(("n1", "n2", "n3", "n4")):
        for g in range(8):
            if node != "n4":
                _gpu(b, node, g, NOW)
            b.add("fleethealth_rank_compute_seconds", {"job": "train", "rank": str(8 * i + g), "node": node,
                                                       "gpu": str(g), "peer_group": "s0"}, 0.5, NOW)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    n4 = fh.tuples["n4"]
    assert n4.value is None or n4.confidence < POL.lifecycle.min_confidence
    assert n4.reason == "missing:DCGM"
    assert fh.tuples["n1"].confidence > POL.lifecycle.min_confidence and fh.tuples["n1"].reason == "min:hardware"


def test_a_gpu_that_fell_off_the_bus_is_not_left_out_of_its_nodes_minimum() -> None:
    """A recording 50 minutes after gpu4 fell off the bus (its samples stop, the Xid is out of its
    window): the node read 1.000, confidence 0.97, reason ``min:hardware``."""
    b = SnapshotBuilder()
    for g in range(8):
        _gpu(b, "n1", g, NOW - 3000 if g == 4 else NOW)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    n1 = fh.tuples["n1"]
    assert n1.value is None and n1.reason == "missing:gpu4"
    assert fh.tuples["n1/gpu4"].value is None and fh.tuples["n1/gpu3"].value == 1.0
    # every GPU unknown (the whole exporter gone): no fresh data, as before
    b = SnapshotBuilder()
    for g in range(8):
        _gpu(b, "n1", g, NOW - 3000)
    assert score_snapshot(b.build(NOW), POL, NOW).tuples["n1"].reason == "no_fresh_data"


def test_a_gpu_known_only_from_inventory_leaves_its_node_unknown() -> None:
    """The controller hands the scorer the GPUs a node is known to have had (the structural tracker's
    memory, kept in the state store); one that reports nothing at all is shown and makes the node unknown."""
    b = SnapshotBuilder()
    for g in range(7):
        _gpu(b, "n1", g, NOW)
    fh = score_snapshot(b.build(NOW), POL, NOW, inventory={"gpu": [f"n1/gpu{g}" for g in range(8)]})
    assert fh.tuples["n1"].value is None and fh.tuples["n1"].reason == "missing:gpu7"


def test_a_replica_whose_slo_counters_were_seen_once_is_not_confident() -> None:
    """A vLLM replica just started: its request counters and TTFT histogram have one sample each (no rate
    yet), its queue gauge is fresh. It read confidence 1.0 with only ``load`` scored."""
    b = SnapshotBuilder()
    lab = {"replica": "r1", "model_name": "llama"}
    b.add("vllm:num_requests_waiting", lab, 0.0, NOW)
    b.add("fleethealth_replica_requests_total", lab, 10.0, NOW)
    b.add("fleethealth_replica_errors_total", lab, 0.0, NOW)
    b.add("vllm:time_to_first_token_seconds_count", lab, 10.0, NOW)
    b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "2.0"}, 10.0, NOW)
    b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "+Inf"}, 10.0, NOW)
    r1 = score_snapshot(b.build(NOW), POL, NOW, consumer="serving").tuples["r1"]
    assert r1.confidence < POL.lifecycle.min_confidence
    assert r1.reason == "pending:ttft_slo,error_slo"
    # two samples a minute apart: the burn rates are fresh, the replica is confident and healthy
    b2 = SnapshotBuilder()
    for t, n in ((NOW - 60, 10.0), (NOW, 70.0)):
        b2.add("vllm:num_requests_waiting", lab, 0.0, t)
        b2.add("fleethealth_replica_requests_total", lab, n, t)
        b2.add("fleethealth_replica_errors_total", lab, 0.0, t)
        b2.add("vllm:time_to_first_token_seconds_count", lab, n, t)
        b2.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "2.0"}, n, t)
        b2.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "+Inf"}, n, t)
    r1 = score_snapshot(b2.build(NOW), POL, NOW, consumer="serving").tuples["r1"]
    assert r1.confidence == 1.0 and r1.value == 1.0 and not r1.reason.startswith("pending:")

"""QA finding 8: a GPU that lost most of its signals (one gauge left, as an Xid 79 looks on a real
exporter) must not leave its node healthy at high confidence: it counts as a missing GPU
(``missing:gpuN``), in the engine and in the scalar reference alike."""

from __future__ import annotations

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.score.reference import score_reference
from fleethealth.signals.snapshot import SnapshotBuilder

NOW = 1_800_000_000.0
POL = default_policy()


def _labels(node: str, g: int) -> dict[str, str]:
    return dict(gpu=str(g), UUID=f"GPU-{node}-{g}", Hostname=node, modelName="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + g:02X}:00.0")


def _fleet(lost: tuple[str, int] | None) -> SnapshotBuilder:
    b = SnapshotBuilder()
    ts = NOW - 5
    for n in range(6):
        node = f"node-{n:02d}"
        for g in range(8):
            lab = _labels(node, g)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0 + g, ts)
            if (node, g) == lost:
                continue  # only the SM clock survives
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, ts)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, ts)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts - 30)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 5, ts)
    return b


def test_gpu_below_min_confidence_makes_its_node_unknown_not_healthy() -> None:
    snap = _fleet(("node-03", 3)).build(NOW)
    fh = score_snapshot(snap, POL, NOW)
    gpu = fh.tuples["node-03/gpu3"]
    assert gpu.value is not None and gpu.confidence < POL.lifecycle.min_confidence
    node = fh.tuples["node-03"]
    assert node.value is None, (node.value, node.confidence, node.reason)
    assert node.reason == "missing:gpu3"
    assert node.worst_member == "node-03/gpu3"
    # the other nodes stay healthy at full confidence
    other = fh.tuples["node-02"]
    assert other.value == 1.0 and other.confidence == 1.0
    ref = score_reference(snap, POL, NOW)
    assert ref["node-03"].value is None and ref["node-03"].reason == "missing:gpu3"
    assert ref["node-02"].value == 1.0


def test_all_gpus_low_confidence_is_the_nodes_own_low_confidence() -> None:
    """Every GPU of a node degraded alike (an exporter that lost fields on all of them): the node is
    not 'missing' GPUs, it is low confidence, which nothing acts on."""
    b = SnapshotBuilder()
    for n in range(4):
        node = f"node-{n:02d}"
        for g in range(8):
            lab = _labels(node, g)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, NOW - 5)
            if n != 1:
                b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, NOW - 5)
                b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0, NOW - 5)
    fh = score_snapshot(b.build(NOW), POL, NOW)
    node = fh.tuples["node-01"]
    assert node.confidence < POL.lifecycle.min_confidence
    assert not node.reason.startswith("missing:gpu")

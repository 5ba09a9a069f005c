"""The seed's worked example: a slow node in a 512-GPU job (64 nodes x 8 GPUs)."""

from __future__ import annotations

import numpy as np
import pytest

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import SnapshotBuilder

NOW = 1_700_000_000.0


def seed_fleet(compute_37: float = 1.86, clock_drop: float = 0.03, temp_delta: float = 4.0):
    """Per-rank compute median 1.82 s with MAD 0.01 s; node-37 slower, clock ~3% low, 4 C warmer."""
    b = SnapshotBuilder()
    rng = np.random.default_rng(7)
    # symmetric offsets whose median is 0 and MAD exactly 1 unit
    offs = np.tile(np.array([-1.0, 1.0, -1.0, 1.0, 0.0, 0.0, -2.0, 2.0]), 64)
    rng.shuffle(offs)
    clock_mad = 0.03 * 1980 / (4.1 * 1.4826)
    rank = 0
    for n in range(64):
        node = f"node-{n:02d}"
        for g in range(8):
            base = dict(gpu=str(g), UUID=f"GPU-{n}-{g}", pci_bus_id=f"00000000:{g:02X}:00.0",
                        device=f"nvidia{g}", modelName="NVIDIA H100 80GB HBM3", Hostname=node,
                        DCGM_FI_DRIVER_VERSION="550.54.15")
            slow = n == 37
            o = offs[rank]
            ct = compute_37 if slow else 1.82 + 0.01 * o
            clock = 1980 * (1 - clock_drop) if slow else 1980 + clock_mad * o
            temp = 60 + (temp_delta if slow else 0)
            b.add("DCGM_FI_DEV_SM_CLOCK", base, clock, NOW - 5)
            b.add("DCGM_FI_DEV_GPU_TEMP", base, temp, NOW - 5)
            b.add("DCGM_FI_DEV_XID_ERRORS", base, 0, NOW - 5)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", base, 10, NOW - 35)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", base, 10, NOW - 5)
            b.add("fleethealth_rank_compute_seconds",
                  dict(job="llama-pretrain", rank=str(rank), node=node, gpu=str(g), peer_group="dp"), ct, NOW - 3)
            rank += 1
    return b.build(NOW)


def test_node37_flagged_at_082() -> None:
    fh = score_snapshot(seed_fleet(), default_policy(), NOW, consumer="training")
    t = fh.tuples["node-37"]
    assert t.kind == "node"
    assert t.reason == "min:performance"
    assert t.worst == "performance"
    assert t.value == pytest.approx(0.82, abs=0.01)
    assert t.confidence == pytest.approx(1.0)
    assert t.worst_member is not None and t.worst_member.startswith("node-37/gpu")
    gpu = fh.tuples[t.worst_member]
    d = {x.signal: x for x in gpu.details}
    assert d["rank_compute_time"].z == pytest.approx(2.7, abs=0.05)
    assert d["rank_compute_time"].score == 1.0
    assert d["sm_clock"].z == pytest.approx(4.1, abs=0.1)
    assert d["sm_clock"].score == pytest.approx(0.63, abs=0.02)
    assert d["gpu_temp"].score == 1.0
    # every other node is healthy
    others = [x for x in fh.by_kind("node") if x.entity != "node-37"]
    assert len(others) == 63 and all(x.value == 1.0 for x in others)
    # the rank view exists too
    ranks = fh.by_kind("rank")
    assert len(ranks) == 512


def test_a_day_later_performance_falls_to_zero() -> None:
    fh = score_snapshot(seed_fleet(compute_37=1.95), default_policy(), NOW)
    t = fh.tuples["node-37"]
    gpu = fh.tuples[t.worst_member]  # type: ignore[index]
    d = {x.signal: x for x in gpu.details}
    assert d["rank_compute_time"].z == pytest.approx(8.8, abs=0.1)
    assert t.value == pytest.approx(0.0, abs=1e-9)
    assert t.reason == "min:performance"

"""A synthetic fleet snapshot for benchmarks and property tests: N GPUs (8 per node) with 15 DCGM
signals each (gauges, and counters with two scrapes so they become rates) plus one rank timing per GPU,
and a sprinkling of faults (hot GPUs, slow ranks, fatal Xids, dead exporters) so that scores differ."""

from __future__ import annotations

import numpy as np

from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

GAUGES = (
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
)
COUNTERS = (
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
)
RANK_METRIC = "fleethealth_rank_compute_seconds"


def synthetic_fleet(n_gpus: int, now: float = 1_700_000_000.0, seed: int = 0, fault_rate: float = 0.002,
                    scrape_s: float = 15.0) -> Snapshot:
    rng = np.random.default_rng(seed)
    n_nodes = max(1, (n_gpus + 7) // 8)
    b = SnapshotBuilder()
    gpu_ls = np.empty(n_gpus, np.int32)
    rank_ls = np.empty(n_gpus, np.int32)
    for i in range(n_gpus):
        node, g = divmod(i, 8)
        host = f"node-{node:05d}"
        gpu_ls[i] = b.series_id((
            ("DCGM_FI_DRIVER_VERSION", "550.54.15"), ("Hostname", host), ("UUID", f"GPU-{i:08x}"),
            ("device", f"nvidia{g}"), ("gpu", str(g)), ("modelName", "NVIDIA H100 80GB HBM3"),
            ("pci_bus_id", f"00000000:{0x18 + g:02X}:00.0"),
        ))
        job = f"job-{node // 64}"
        rank_ls[i] = b.series_id((
            ("gpu", str(g)), ("job", job), ("node", host), ("peer_group", f"stage{(node % 64) // 16}"),
            ("rank", str(i % 512)),
        ))
    faulty = rng.random(n_gpus) < fault_rate
    kind = rng.integers(0, 5, n_gpus)
    t1 = np.full(n_gpus, now - rng.uniform(0, 10, n_gpus))
    dead = faulty & (kind == 4)
    node_dead = np.repeat(dead.reshape(-1, 8).any(axis=1) if n_gpus % 8 == 0 else dead[: n_nodes], 8)[:n_gpus]
    t1 = np.where(node_dead, now - 3600, t1)  # a dead exporter: everything on the node is stale
    t0 = t1 - scrape_s
    vals = {
        "DCGM_FI_DEV_GPU_TEMP": 62 + rng.normal(0, 2, n_gpus) + np.where(faulty & (kind == 0), 30, 0),
        "DCGM_FI_DEV_MEMORY_TEMP": 70 + rng.normal(0, 2, n_gpus),
        "DCGM_FI_DEV_SM_CLOCK": 1980 + rng.normal(0, 8, n_gpus) - np.where(faulty & (kind == 1), 200, 0),
        "DCGM_FI_DEV_XID_ERRORS": np.where(faulty & (kind == 2), 79, 0).astype(float),
        "DCGM_FI_DEV_ROW_REMAP_PENDING": np.where(faulty & (kind == 3), 1, 0).astype(float),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": np.zeros(n_gpus),
        "DCGM_FI_DEV_GPU_RECOVERY_ACTION": np.zeros(n_gpus),
    }
    rank_t = 1.82 + rng.normal(0, 0.01, n_gpus) + np.where(faulty & (kind == 1), 0.2, 0)
    for name in GAUGES:
        m = b.metric_id(name)
        b.add_arrays(np.full(n_gpus, m), gpu_ls, vals[name], t1)
    for name in COUNTERS:
        m = b.metric_id(name)
        base = rng.integers(0, 1000, n_gpus).astype(float)
        inc = rng.poisson(0.2, n_gpus).astype(float)
        if name == "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL":
            base[:] = 0
            inc[:] = 0
        b.add_arrays(np.full(n_gpus, m), gpu_ls, base, t0)
        b.add_arrays(np.full(n_gpus, m), gpu_ls, base + inc, t1)
    m = b.metric_id(RANK_METRIC)
    b.add_arrays(np.full(n_gpus, m), rank_ls, rank_t, t1)
    return b.build(now)

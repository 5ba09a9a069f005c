"""What the simulated exporters export: metric names, their kinds and help texts, histogram buckets.

Theory of operation. The simulator (``simulation.Simulation``) lays out one row per exported series; the
names here decide which blocks of rows exist (dcgm-exporter's GPU gauges and counters, with
``DEFAULT_DCGM_FIELDS`` the subset its default field list switches on; the per-rank training timers; vLLM's
replica gauges, counters and latency histograms; the info series that carry node and replica labels).
``METRIC_TYPES`` and ``HELP`` are what the exporter page (``telemetry.render_node``) writes as ``# TYPE``
and ``# HELP``; ``le_strings`` writes a histogram's bucket bounds exactly as prometheus_client does, so a
recording scraped from the simulator reads like one scraped from vLLM. Constants only, no state.
"""

from __future__ import annotations

import functools

FB_TOTAL_MIB = 81559.0

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0]

# Healthy latency spread (lognormal sigma): narrow enough that a healthy replica's TTFT stays well inside
# a 2 s SLO even when the histogram is interpolated inside vLLM's 1.0-2.5 s bucket.
TTFT_SIGMA = 0.4
ITL_SIGMA = 0.3

GPU_GAUGES = [
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_GPU_RECOVERY_ACTION", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
]
GPU_COUNTERS = [
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
]
# dcgm-exporter's default counter list (the rest is commented out there and must be switched on)
DEFAULT_DCGM_FIELDS = frozenset({
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
})
# PCIe link state (exported with FleetSpec.pcie_link_fields): current and device-maximum generation, width
PCIE_LINK_GAUGES = ["DCGM_FI_DEV_PCIE_LINK_GEN", "DCGM_FI_DEV_PCIE_LINK_WIDTH", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
                    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"]
PCIE_LINK_DEFAULT = (5.0, 16.0, 5.0, 16.0)  # H100 SXM: PCIe Gen5 x16
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
RANK_COMPUTE = "fleethealth_rank_compute_seconds"
RANK_STEP = "fleethealth_rank_step_seconds"
REPLICA_GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
REPLICA_COUNTERS = [
    "vllm:num_preemptions_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
    "fleethealth_replica_requests_total", "fleethealth_replica_errors_total",
]
SUCCESS = "vllm:request_success_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
NODE_INFO = "fleethealth_node_info"
REPLICA_INFO = "fleethealth_replica_info"

# Metric kinds for exposition (# TYPE); histogram families keyed by their base name.
METRIC_TYPES: dict[str, str] = {m: "gauge" for m in GPU_GAUGES + REPLICA_GAUGES + PCIE_LINK_GAUGES + [
    RANK_COMPUTE, RANK_STEP, NODE_INFO, REPLICA_INFO]}
METRIC_TYPES |= {m: "counter" for m in GPU_COUNTERS + REPLICA_COUNTERS + [XID_COUNT, SUCCESS]}
METRIC_TYPES |= {TTFT: "histogram", ITL: "histogram"}

HELP: dict[str, str] = {
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    XID_COUNT: "Count of XID errors by xid.",
    RANK_COMPUTE: "Per-rank compute time of the last step, up to entry into the collective (seconds).",
    RANK_STEP: "Whole-step time of the last step (equal on every rank of a job).",
}


@functools.cache
def le_strings(hist: str) -> tuple[str, ...]:
    """The histogram's bucket bounds as Prometheus writes them (imported here: the library costs ~0.1 s
    to import and only a simulator with serving replicas needs it, once per process)."""
    from prometheus_client.utils import floatToGoString

    return tuple(floatToGoString(v) for v in (TTFT_BUCKETS if hist == TTFT else ITL_BUCKETS))


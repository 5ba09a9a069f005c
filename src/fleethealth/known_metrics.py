"""Metric names that known exporters emit, so that a policy naming another one is caught as a likely typo.

Theory of operation. A signal whose metric no exporter emits is never fed: every entity would read the
signal as missing (lowering confidence) or, for an optional signal, silently never score it. ``policy
check`` warns about such names with the line they are on. The list covers DCGM's field identifiers
(``dcgm_fields.h``: ``DCGM_FI_*``, as dcgm-exporter names them, per-lane and per-port fields included),
dcgm-exporter's own counters (``DCGM_EXP_*``), vLLM (v0 and v1 engine), SGLang, and fleethealth's own
metrics (kernel-log watcher, structural signals, rank timer, sidecar, agent, controller). Histograms
count with their ``_bucket`` / ``_sum`` / ``_count`` samples, counters with ``_total`` and ``_created``.
A name outside the list is a warning, never an error: an operator's own exporter is allowed.

Pure data and lookups; no I/O.
"""

from __future__ import annotations

import difflib
from functools import lru_cache

__all__ = ["is_known_metric", "known_metrics", "suggest_metric"]

_DCGM_FIELDS = """
DRIVER_VERSION NVML_VERSION PROCESS_NAME DEV_COUNT CUDA_DRIVER_VERSION DEV_NAME DEV_BRAND DEV_NVML_INDEX DEV_SERIAL
DEV_UUID DEV_MINOR_NUMBER DEV_OEM_INFOROM_VER DEV_PCI_BUSID DEV_PCI_COMBINED_ID DEV_PCI_SUBSYS_ID GPU_TOPOLOGY_PCI
GPU_TOPOLOGY_NVLINK GPU_TOPOLOGY_AFFINITY DEV_CUDA_COMPUTE_CAPABILITY DEV_COMPUTE_MODE DEV_PERSISTENCE_MODE
DEV_MIG_MODE DEV_CUDA_VISIBLE_DEVICES_STR DEV_MIG_MAX_SLICES DEV_CPU_AFFINITY_0 DEV_CPU_AFFINITY_1 DEV_CPU_AFFINITY_2
DEV_CPU_AFFINITY_3 DEV_ECC_INFOROM_VER DEV_POWER_INFOROM_VER DEV_INFOROM_IMAGE_VER DEV_INFOROM_CONFIG_CHECK
DEV_INFOROM_CONFIG_VALID DEV_VBIOS_VERSION DEV_BAR1_TOTAL SYNC_BOOST DEV_BAR1_USED DEV_BAR1_FREE DEV_SM_CLOCK
DEV_MEM_CLOCK DEV_VIDEO_CLOCK DEV_APP_SM_CLOCK DEV_APP_MEM_CLOCK DEV_CLOCK_THROTTLE_REASONS DEV_CLOCKS_EVENT_REASONS
DEV_MAX_SM_CLOCK DEV_MAX_MEM_CLOCK DEV_MAX_VIDEO_CLOCK DEV_AUTOBOOST DEV_SUPPORTED_CLOCKS DEV_MEMORY_TEMP DEV_GPU_TEMP
DEV_MEM_MAX_OP_TEMP DEV_GPU_MAX_OP_TEMP DEV_POWER_USAGE DEV_TOTAL_ENERGY_CONSUMPTION DEV_POWER_USAGE_INSTANT
DEV_SLOWDOWN_TEMP DEV_SHUTDOWN_TEMP DEV_POWER_MGMT_LIMIT DEV_POWER_MGMT_LIMIT_MIN DEV_POWER_MGMT_LIMIT_MAX
DEV_POWER_MGMT_LIMIT_DEF DEV_ENFORCED_POWER_LIMIT DEV_PSTATE DEV_FAN_SPEED DEV_PCIE_TX_THROUGHPUT
DEV_PCIE_RX_THROUGHPUT DEV_PCIE_REPLAY_COUNTER DEV_GPU_UTIL DEV_MEM_COPY_UTIL DEV_ACCOUNTING_DATA DEV_ENC_UTIL
DEV_DEC_UTIL DEV_MEM_COPY_UTIL_SAMPLES DEV_GPU_UTIL_SAMPLES DEV_GRAPHICS_PIDS DEV_COMPUTE_PIDS DEV_XID_ERRORS
DEV_PCIE_MAX_LINK_GEN DEV_PCIE_MAX_LINK_WIDTH DEV_PCIE_LINK_GEN DEV_PCIE_LINK_WIDTH DEV_POWER_VIOLATION
DEV_THERMAL_VIOLATION DEV_SYNC_BOOST_VIOLATION DEV_BOARD_LIMIT_VIOLATION DEV_LOW_UTIL_VIOLATION
DEV_RELIABILITY_VIOLATION DEV_TOTAL_APP_CLOCKS_VIOLATION DEV_TOTAL_BASE_CLOCKS_VIOLATION DEV_FB_TOTAL DEV_FB_FREE
DEV_FB_USED DEV_FB_RESERVED DEV_FB_USED_PERCENT DEV_ECC_CURRENT DEV_ECC_PENDING DEV_ECC_SBE_VOL_TOTAL
DEV_ECC_DBE_VOL_TOTAL DEV_ECC_SBE_AGG_TOTAL DEV_ECC_DBE_AGG_TOTAL DEV_ECC_SBE_VOL_L1 DEV_ECC_DBE_VOL_L1
DEV_ECC_SBE_VOL_L2 DEV_ECC_DBE_VOL_L2 DEV_ECC_SBE_VOL_DEV DEV_ECC_DBE_VOL_DEV DEV_ECC_SBE_VOL_REG DEV_ECC_DBE_VOL_REG
DEV_ECC_SBE_VOL_TEX DEV_ECC_DBE_VOL_TEX DEV_ECC_SBE_AGG_L1 DEV_ECC_DBE_AGG_L1 DEV_ECC_SBE_AGG_L2 DEV_ECC_DBE_AGG_L2
DEV_ECC_SBE_AGG_DEV DEV_ECC_DBE_AGG_DEV DEV_ECC_SBE_AGG_REG DEV_ECC_DBE_AGG_REG DEV_ECC_SBE_AGG_TEX
DEV_ECC_DBE_AGG_TEX DEV_RETIRED_SBE DEV_RETIRED_DBE DEV_RETIRED_PENDING DEV_UNCORRECTABLE_REMAPPED_ROWS
DEV_CORRECTABLE_REMAPPED_ROWS DEV_ROW_REMAP_FAILURE DEV_ROW_REMAP_PENDING DEV_GPU_NVLINK_ERRORS DEV_VIRTUAL_MODE
DEV_SUPPORTED_TYPE_INFO DEV_CREATABLE_VGPU_TYPE_IDS DEV_VGPU_INSTANCE_IDS DEV_VGPU_UTILIZATIONS
DEV_VGPU_PER_PROCESS_UTILIZATION DEV_ENC_STATS DEV_FBC_STATS DEV_FBC_SESSIONS_INFO DEV_VGPU_VM_ID DEV_VGPU_VM_NAME
DEV_VGPU_TYPE DEV_VGPU_UUID DEV_VGPU_DRIVER_VERSION DEV_VGPU_MEMORY_USAGE DEV_VGPU_LICENSE_STATUS
DEV_VGPU_FRAME_RATE_LIMIT DEV_VGPU_ENC_STATS DEV_VGPU_ENC_SESSIONS_INFO DEV_VGPU_FBC_STATS DEV_VGPU_FBC_SESSIONS_INFO
DEV_VGPU_LICENSE_INSTANCE_STATUS DEV_NVSWITCH_FATAL_ERRORS DEV_NVSWITCH_NON_FATAL_ERRORS DEV_GPU_RECOVERY_ACTION
DEV_FABRIC_MANAGER_STATUS DEV_FABRIC_MANAGER_ERROR_CODE DEV_FABRIC_CLUSTER_UUID DEV_FABRIC_CLIQUE_ID
DEV_NVLINK_LINK_STATUS DEV_NVLINK_GET_STATE
DEV_NVLINK_BANDWIDTH_TOTAL DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL DEV_NVLINK_ERROR_DL_CRC
DEV_NVLINK_ERROR_DL_RECOVERY DEV_NVLINK_ERROR_DL_REPLAY DEV_NVLINK_COUNT_RX_MALFORMED_PACKET_ERRORS
DEV_NVLINK_COUNT_RX_BUFFER_OVERRUN_ERRORS DEV_NVLINK_COUNT_RX_ERRORS DEV_NVLINK_COUNT_RX_REMOTE_ERRORS
DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS DEV_NVLINK_COUNT_EFFECTIVE_ERRORS DEV_NVLINK_COUNT_SYMBOL_ERRORS
DEV_NVLINK_COUNT_SYMBOL_BER DEV_NVLINK_COUNT_EFFECTIVE_BER
PROF_GR_ENGINE_ACTIVE PROF_SM_ACTIVE PROF_SM_OCCUPANCY PROF_PIPE_TENSOR_ACTIVE PROF_DRAM_ACTIVE PROF_PIPE_FP64_ACTIVE
PROF_PIPE_FP32_ACTIVE PROF_PIPE_FP16_ACTIVE PROF_PCIE_TX_BYTES PROF_PCIE_RX_BYTES PROF_NVLINK_TX_BYTES
PROF_NVLINK_RX_BYTES PROF_PIPE_TENSOR_IMMA_ACTIVE PROF_PIPE_TENSOR_HMMA_ACTIVE PROF_PIPE_TENSOR_DFMA_ACTIVE
PROF_PIPE_INT_ACTIVE PROF_NVDEC0_ACTIVE PROF_NVJPG0_ACTIVE PROF_NVOFA0_ACTIVE PROF_C2C_TX_ALL_BYTES
PROF_C2C_RX_ALL_BYTES
"""
# Per-lane NVLink fields (lanes 0..17) and per-port NVSwitch fields (ports 0..17).
_PER_LANE = ("CRC_FLIT_ERROR_COUNT", "CRC_DATA_ERROR_COUNT", "REPLAY_ERROR_COUNT", "RECOVERY_ERROR_COUNT", "BANDWIDTH")
_PER_PORT = ("LATENCY_LOW", "LATENCY_MED", "LATENCY_HIGH", "LATENCY_MAX", "BANDWIDTH_TX_0", "BANDWIDTH_RX_0",
             "BANDWIDTH_TX_1", "BANDWIDTH_RX_1")

_DCGM_EXPORTER = "DCGM_EXP_XID_ERRORS_COUNT DCGM_EXP_CLOCK_EVENTS_COUNT DCGM_EXP_GPU_HEALTH_STATUS"

_VLLM = """
num_requests_running num_requests_waiting num_requests_swapped gpu_cache_usage_perc cpu_cache_usage_perc
kv_cache_usage_perc gpu_prefix_cache_hit_rate cpu_prefix_cache_hit_rate gpu_prefix_cache_queries
gpu_prefix_cache_hits prefix_cache_queries prefix_cache_hits num_preemptions prompt_tokens generation_tokens
request_success iteration_tokens_total request_prompt_tokens request_generation_tokens request_max_num_generation_tokens
request_params_n request_params_max_tokens time_to_first_token_seconds time_per_output_token_seconds
inter_token_latency_seconds e2e_request_latency_seconds request_queue_time_seconds request_inference_time_seconds
request_prefill_time_seconds request_decode_time_seconds max_num_generation_tokens lora_requests_info
cache_config_info num_requests_waiting_by_reason spec_decode_num_drafts spec_decode_num_draft_tokens
spec_decode_num_accepted_tokens spec_decode_num_accepted_tokens_per_pos request_time_per_output_token_seconds
engine_sleep_state external_prefix_cache_queries external_prefix_cache_hits mm_cache_queries mm_cache_hits
"""
_SGLANG = """
num_running_reqs num_queue_reqs num_used_tokens token_usage gen_throughput cache_hit_rate spec_accept_length
prompt_tokens generation_tokens cached_tokens num_requests func_latency_seconds time_to_first_token_seconds
inter_token_latency_seconds time_per_output_token_seconds e2e_request_latency_seconds num_grammar_queue_reqs
num_prefill_prealloc_queue_reqs num_prefill_inflight_queue_reqs num_decode_prealloc_queue_reqs
num_decode_transfer_queue_reqs queue_time_seconds num_aborted_requests
"""
_FLEETHEALTH = """
kernel_xid kernel_sxid kernel_gpu_fallen_off node_gpus_missing node_info series_vanished rank_compute_seconds
rank_first_collective_seconds rank_step_seconds rank_steps replica_errors replica_requests replica_info
source_up source_age_seconds source_errors source_samples source_partial source_read_seconds
source_last_success_timestamp_seconds source_last_errors scrape_targets_down scrape_slowest_seconds health
health_known confidence category_score state router_weight budget_remaining remediation_frozen actuation_mode
actuation_killed intents transitions entity_transitions cycles cycle_duration_seconds cycle_interval_seconds
cycle_overruns cycle_seconds cycle_skipped_ticks cycle_stage_seconds cycle_stage_cpu_seconds
last_cycle_timestamp_seconds agent_collect_seconds agent_gpus agent_nvml_errors agent_source_up sidecar_score
sidecar_state sidecar_weight sidecar_engine_up sidecar_engine_waiting sidecar_in_flight sidecar_queued
sidecar_requests sidecar_ooms sidecar_transitions sidecar_decoding sidecar_draining sidecar_drain_deadline_seconds
sidecar_drain_elapsed_seconds sidecar_drain_remaining sidecar_stalled_seconds sidecar_concurrency_limit
"""
# Common metrics a serving pod also exposes (vLLM's HTTP instrumentation, Prometheus' own up).
_COMMON = "up http_requests http_request_duration_seconds http_request_size_bytes http_response_size_bytes"

_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count")


@lru_cache(maxsize=1)
def known_metrics() -> frozenset[str]:
    """Every known metric name, with the sample suffixes of counters and histograms."""
    base: set[str] = {"DCGM_FI_" + f for f in _DCGM_FIELDS.split()}
    base |= {f"DCGM_FI_DEV_NVLINK_{f}_L{i}" for f in _PER_LANE for i in range(18)}
    base |= {f"DCGM_FI_DEV_NVSWITCH_{f}_P{i:02d}" for f in _PER_PORT for i in range(18)}
    base |= set(_DCGM_EXPORTER.split())
    base |= {"vllm:" + m for m in _VLLM.split()}
    base |= {"sglang:" + m for m in _SGLANG.split()}
    base |= {"fleethealth_" + m for m in _FLEETHEALTH.split()}
    base |= set(_COMMON.split())
    return frozenset(b + s for b in base for s in _SUFFIXES)


def is_known_metric(name: str) -> bool:
    return name in known_metrics()


def suggest_metric(name: str) -> str | None:
    """The known name closest to ``name`` (a likely intended spelling), or None."""
    close = difflib.get_close_matches(name, sorted(known_metrics()), n=1, cutoff=0.8)
    return close[0] if close else None

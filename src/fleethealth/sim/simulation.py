"""The fleet simulator: deterministic, vectorised, simulated time.

Theory of operation. At construction the fleet's topology is built and every series it can emit is
interned once into a fixed row layout (metric id, series id, owning node / GPU / replica per row). Each
step fills one float array over that layout from per-entity state arrays (temperatures with static
offsets, slow AR(1) drift and noise; cumulative counters; per-rank compute times; per-replica request
histograms drawn as Poisson bucket counts), applies the active faults through an ``Effects`` object, masks
the rows whose exporter, GPU or replica is gone, and wraps the arrays in a ``Snapshot`` that shares the
interned names and label sets. Nothing loops per GPU in Python; faults are few and loop over themselves.

While no fault has an effect and nothing is out of service (the quiet regime: a healthy fleet's days), a
step's random draws are known in advance: up to 64 steps are drawn at once, in the same order and from the
same generator as step by step, and what follows from the draws is computed for all of them together
(``_draw_ahead``); each step then copies its rows into the buffer and adds its counter increments. The
telemetry is the same, bit for bit, as the step-by-step path's (``_step_plain``).

The same state renders as per-node exposition text (``render_node``) for the HTTP exporter.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleethealth.agent.exposition import escape_label_value
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot
from fleethealth.sim.faults import Effects, Fault, make_fault
from fleethealth.sim.fleet import Fleet, build_fleet, bus_id
from fleethealth.sim.scenario import FaultSpec, Scenario
from fleethealth.sim.truth import GroundTruth, SimEvent

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

# State arrays that are output blocks (bound into the value buffer, see Simulation._bind): attribute,
# block key. Multi-row ones are views over consecutive blocks.
_STATE: tuple[tuple[str, str], ...] = (
    ("mem_clock", "DCGM_FI_DEV_MEM_CLOCK"), ("xid_last", "DCGM_FI_DEV_XID_ERRORS"),
    ("remap_pending", "DCGM_FI_DEV_ROW_REMAP_PENDING"), ("remap_failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    ("recovery_action", "DCGM_FI_DEV_GPU_RECOVERY_ACTION"), ("energy", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    ("pcie", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), ("sbe", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ("dbe", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), ("corr_rows", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    ("uncorr_rows", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"), ("therm_viol", "DCGM_FI_DEV_THERMAL_VIOLATION"),
    ("power_viol", "DCGM_FI_DEV_POWER_VIOLATION"), ("nvl", "nvl"),
    ("rank_compute", RANK_COMPUTE), ("last_kv", "vllm:kv_cache_usage_perc"), ("_rep_ctr", "rep_ctr"),
    ("ttft_b", TTFT + "_bucket"), ("ttft_sum", TTFT + "_sum"), ("itl_b", ITL + "_bucket"), ("itl_sum", ITL + "_sum"),
    ("ones_node", NODE_INFO), ("ones_rep", REPLICA_INFO),
)
# replica counters in block order (rows of Simulation._rep_ctr; the last two are `success`)
_REP_CTR = ("preempt", "gen_tokens", "prompt_tokens", "replica_requests", "replica_errors", "success_stop",
            "success_length")
_SPANS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("nvl", tuple(GPU_COUNTERS[8:12])),
    ("rep_ctr", (*REPLICA_COUNTERS, SUCCESS + "|stop", SUCCESS + "|length")),
)

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

_SQRT2 = math.sqrt(2.0)
# 0-d constants for the step's element-wise operations (same values, same bits as the Python floats)
_K0, _K1, _K2, _K6, _K38, _K100, _K1935 = (np.array(x) for x in (0.0, 1.0, 2.0, 6.0, 38.0, 100.0, 1935.0))
_K0_35, _K0_4, _K0_5, _K0_6, _K1_6 = (np.array(x) for x in (0.35, 0.4, 0.5, 0.6, 1.6))
_K0_01, _K0_02, _K0_1, _K0_15, _K0_75, _K0_8, _K0_85, _K0_9, _K30, _K40, _K256 = (
    np.array(x) for x in (0.01, 0.02, 0.1, 0.15, 0.75, 0.8, 0.85, 0.9, 30.0, 40.0, 256.0))
_FB_USABLE = np.array(FB_TOTAL_MIB - 300.0)
# latency CDF lookup table: medians from 0.1 ms to 1000 s in steps of 0.5 % (log space)
_CDF_LO = math.log(1e-4)
_CDF_STEP = 0.005
_CDF_N = int((math.log(1e3) - _CDF_LO) / _CDF_STEP) + 1
_CDF_LAST = np.array(float(_CDF_N - 1))
# a lognormal's mean over its median
_TTFT_MEAN = math.exp(TTFT_SIGMA * TTFT_SIGMA / 2)
_ITL_MEAN = math.exp(ITL_SIGMA * ITL_SIGMA / 2)


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not a dependency."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _lognormal_bucket_probs(median: np.ndarray, sigma: float, les: np.ndarray) -> np.ndarray:
    """P(bucket) per row for lognormal latencies: shape (len(median), len(les) + 1), last = above the top."""
    z = (np.log(les)[None, :] - np.log(median)[:, None]) / (sigma * _SQRT2)
    cdf = 0.5 * (1.0 + _erf(z))
    full = np.concatenate([np.zeros((len(median), 1)), cdf, np.ones((len(median), 1))], axis=1)
    return np.clip(np.diff(full, axis=1), 0.0, 1.0)


def _with_inf(cdf: np.ndarray) -> np.ndarray:
    """A CDF table with a column for the +Inf bucket (filled per step with the count, not looked up)."""
    return np.concatenate([cdf, np.ones((len(cdf), 1))], axis=1)


def _runs(idx: np.ndarray, tag: np.ndarray, limit: int, same: bool = False) -> list[tuple[int, int, int]] | None:
    """Maximal runs (lo, hi, t) of consecutive values lo..hi-1 in the sorted ``idx`` over which ``tag``
    goes up by one (``same``: stays equal), with ``t`` the tag at lo; None beyond ``limit`` runs."""
    out: list[tuple[int, int, int]] = []
    step = 0 if same else 1
    for g, t in zip(idx.tolist(), tag.tolist(), strict=True):
        if out and g == out[-1][1] and t == out[-1][2] + step * (g - out[-1][0]):
            out[-1] = (out[-1][0], g + 1, out[-1][2])
        else:
            out.append((g, g + 1, t))
    return out if len(out) <= limit else None


def _counts(rng: np.random.Generator, lam: np.ndarray) -> np.ndarray:
    """Poisson counts: exact for small means (the latency tail matters for SLOs), normal approximation
    for large ones, where Poisson sampling is the most expensive call of a step."""
    big = np.rint(lam + np.sqrt(lam) * rng.standard_normal(lam.shape))
    return np.where(lam >= 30.0, np.maximum(big, 0.0), rng.poisson(np.minimum(lam, 30.0)))


def _sprinkle(rng: np.random.Generator, counter: np.ndarray, mean_total: float) -> None:
    """Rare independent increments over a whole fleet: draw how many, then where (cheaper than a
    Poisson draw per GPU when almost all are zero)."""
    k = int(rng.poisson(mean_total))
    if k:
        np.add.at(counter, rng.integers(0, counter.shape[-1], k), 1.0)


@functools.cache
def _le_strings(hist: str) -> tuple[str, ...]:
    """The histogram's bucket bounds as Prometheus writes them (imported here: the library costs ~0.1 s
    to import and only a simulator with serving replicas needs it, once per process)."""
    from prometheus_client.utils import floatToGoString

    return tuple(floatToGoString(v) for v in (TTFT_BUCKETS if hist == TTFT else ITL_BUCKETS))


@dataclass(slots=True)
class _Block:
    metric: str
    kind: str  # gpu | rank | replica | replica_bucket | node
    start: int
    stop: int
    key: str  # which per-step value array fills this block


@dataclass(slots=True)
class _Entities:
    """The exposed label sets of one kind of entity (GPUs, ranks, replicas, ...) with each row's owning
    node, GPU and replica (-1: none); interned and rendered once, on first use, for every metric."""

    labels: list[dict[str, str]]
    node: np.ndarray
    gpu: np.ndarray
    rep: np.ndarray
    sids: np.ndarray | None = None
    rendered: list[str] | None = None


@dataclass(slots=True)
class _Plan:
    """What no random draw enters, for consecutive steps (row i: step k0 + i): gain * load + offset +
    static for temperature, (unused), power, utilisation and framebuffer of the serving GPUs (steps, 5,
    serving GPUs), and of every GPU only where some node is drained (steps, 5, GPUs; otherwise None: the
    others are at their base load, ``Simulation._w_base``); per replica the TTFT and ITL medians, the
    uncapped means of requests arriving and running with their square roots and whether they take the
    normal approximation (steps, 2, replicas), the capped Poisson means of requests, errors, waiting,
    running (steps, 4, replicas), the rows of the TTFT and ITL latency CDF tables (steps, 2, replicas)
    and the KV-cache use before noise. A plain step writes its own row of ``w`` in place."""

    k0: int
    w: np.ndarray | None
    w_serve: np.ndarray
    med: np.ndarray
    lam2: np.ndarray
    sqrt_lam2: np.ndarray
    lam2_big: np.ndarray
    lam: np.ndarray
    cdf_rows: np.ndarray
    kv: np.ndarray


# steps per shared plan
_PLAN_STEPS = 64
# at most this many steps drawn ahead (0: never; every step draws and computes on its own)
_DRAW_AHEAD = 64
# a first draw-ahead after a rewind covers this many steps, each next one twice as many (up to _DRAW_AHEAD):
# a world that keeps leaving the quiet regime wastes little on draws it has to replay
_DRAW_FIRST = 8
# numpy's standard normals never exceed 12.3 in magnitude (its ziggurat tail draws from 53-bit uniforms),
# so a KV-cache use planned at most this high stays under the 0.9 that triggers the preemption draw
# (0.6 + 0.02 * 14 < 0.9) and the draw-ahead needs no check of its noise
_KV_SAFE = 0.6


@dataclass(slots=True)
class _Drawn:
    """Steps ``k0 .. k0 + n - 1`` drawn ahead in the quiet regime (no fault effect, nothing out of
    service), and everything the step computes from the draws and the plan alone, for step k0 + i: the
    GPU gauges ``gpu[:, i]`` (temperature, memory temperature, SM clock, memory clock (state, as it was),
    power, utilisation, copy utilisation, framebuffer used and free), the energy increments, the
    slow-drift and rack-ambient states (one row: GPUs, then racks), the rank gauges ``ranks[:, i]``
    (compute, step), the replica gauges (running, waiting, KV-cache use) and the increments of the
    replica counters and histograms (one contiguous region of the value buffer), plus the rare sprinkled
    counter increments {i: [(counter, GPUs)]}. ``kv`` and ``lam`` are the plan's rows the draws depend
    on; ``state0`` the generator before the first step's draws (a world leaving the regime mid-way
    replays the draws it consumed from there)."""

    k0: int
    n: int
    state0: Mapping[str, Any]
    kv: np.ndarray
    lam: np.ndarray
    gpu: np.ndarray
    energy: np.ndarray
    drift: np.ndarray
    ranks: np.ndarray
    rep_gauges: np.ndarray
    rep_inc: np.ndarray
    sprinkles: dict[int, list[tuple[int, np.ndarray]]]


@dataclass(slots=True)
class _Draws:
    """The random draws of consecutive quiet steps, one row per step, in the generator's order: unit
    normals of the GPUs (7 rows) and racks, uniforms of the SM clocks, the sprinkles, the training job's
    common normals and the ranks' uniforms, then one run of normals (imbalance per node, step jitter per
    job, the replicas' 4 rows), the replicas' uniforms (2 rows), their Poisson counts (4 rows) and the rare
    preemption counts."""

    gpu_z: np.ndarray
    clock_u: np.ndarray
    sprinkles: dict[int, list[tuple[int, np.ndarray]]]
    common_z: np.ndarray
    dev_u: np.ndarray
    tail_z: np.ndarray
    rep_u: np.ndarray
    small: np.ndarray
    preempt: np.ndarray


class _Scratch:
    """Named arrays the draw-ahead writes its blocks into, kept from one block to the next: memory fresh
    from the allocator costs several times more to write than memory just used (and on a busy machine
    the block's arrays would not stay in cache). A block's ``_Drawn`` holds views into them until the
    next block overwrites them; a copy of the simulator gets its own (``__getstate__`` leaves them out,
    so the views of a block in progress travel as arrays of their own)."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, n: int, *shape: int, axis: int = 0) -> np.ndarray:
        """``n`` steps of array ``name``: steps along ``axis``, ``shape`` the other axes in order."""
        a = self._arrays.get(name)
        rest = a.shape[:axis] + a.shape[axis + 1:] if a is not None else None
        if a is None or rest != shape or a.shape[axis] < n:
            full = (*shape[:axis], max(n, _DRAW_AHEAD), *shape[axis:])
            a = self._arrays[name] = np.empty(full)
        return a[(slice(None),) * axis + (slice(0, n),)]


class _Interner:
    """Copy-on-write interning: snapshots already handed out keep their (shorter) lists, ids never move."""

    def __init__(self) -> None:
        self.metrics: list[str] = []
        self.labelsets: list[LabelSet] = []
        self._m: dict[str, int] = {}
        self._s: dict[LabelSet, int] = {}
        self.frozen = False

    def metric(self, name: str) -> int:
        ix = self._m.get(name)
        if ix is None:
            if self.frozen:
                self.metrics = [*self.metrics, name]
            else:
                self.metrics.append(name)
            ix = self._m[name] = len(self.metrics) - 1
        return ix

    def series(self, labels: dict[str, str]) -> int:
        key = tuple(sorted(labels.items()))
        ix = self._s.get(key)
        if ix is None:
            if self.frozen:
                self.labelsets = [*self.labelsets, key]
            else:
                self.labelsets.append(key)
            ix = self._s[key] = len(self.labelsets) - 1
        return ix


# exposition label-value escaping: backslash, newline, double quote (one pass, each character mapped once)
def _render_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items()) + "}"


class Simulation:
    """Steps a scenario's fleet through simulated time. ``steps()`` yields ``(t, Snapshot)``."""

    SCRAPE_PORT = 9400

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.step_s = float(scenario.step)
        self.start = float(scenario.start)
        self.fleet: Fleet = build_fleet(scenario.fleet, scenario.seed)
        self.rng = np.random.default_rng([scenario.seed, 1])
        self.t = self.start - self.step_s  # time of the last generated step
        self.k = -1
        self._events: list[SimEvent] = []
        self._event_ts: list[float] = []  # the events' times, nondecreasing while _events_sorted
        self._events_sorted = True
        self._build_layout()
        self._init_state()
        self._bind(fill=True)
        if self.fleet.spec.pcie_link_fields:
            for m, val in zip(PCIE_LINK_GAUGES, PCIE_LINK_DEFAULT, strict=True):
                self._v[m].fill(val)
        self.faults: list[Fault] = []
        for i, fs in enumerate(scenario.faults):
            try:
                self.faults.append(make_fault(fs, i, self.fleet, self.start, scenario.seed))
            except ValueError as e:
                raise ValueError(f"faults[{i}] ({fs.kind}): {e}") from None
        self.last: Snapshot | None = None
        self._keep: np.ndarray | None = None
        self._values: np.ndarray | None = None

    # ---- layout -------------------------------------------------------------------------------
    def _instance(self, n: int) -> str:
        return f"{self.fleet.nodes[n]}:{self.SCRAPE_PORT}"

    def _entities(self, labels: list[dict[str, str]], node: list[int], gpu: list[int] | None = None,
                  rep: list[int] | None = None) -> _Entities:
        n = len(labels)
        return _Entities(labels, np.asarray(node, np.int64).reshape(n),
                         np.full(n, -1, np.int64) if gpu is None else np.asarray(gpu, np.int64).reshape(n),
                         np.full(n, -1, np.int64) if rep is None else np.asarray(rep, np.int64).reshape(n))

    def _add_rows(self, metric: str, kind: str, ents: _Entities, key: str | None = None, emit: bool = True) -> None:
        """One block of rows, one per entity. ``emit=False``: the value is still computed (its state is
        kept, its random draws made) but not exported; the block then lives past the emitted rows."""
        if not emit:
            self._shadow.append(_Block(metric, kind, 0, len(ents.labels), key or metric))
            return
        mid = self.intern.metric(metric)
        if ents.sids is None:
            # Prometheus adds the target's instance; its `job` label would clash with the training job's,
            # so recordings carry only instance (scrape with honor_labels: true to keep exposed labels).
            # Interned in entity order on first use, rendered once however many metrics share them.
            inst = [self._instance(int(n)) for n in ents.node.tolist()]
            ents.sids = np.array([self.intern.series(lb | {"instance": i}) for lb, i in zip(ents.labels, inst, strict=True)],
                                 np.int32)
            ents.rendered = [_render_labels(lb) for lb in ents.labels]
        assert ents.rendered is not None
        start = self._n_rows
        self._n_rows += len(ents.labels)
        self._row_parts.append((ents.sids, np.full(len(ents.labels), mid, np.int32), ents.node, ents.gpu, ents.rep))
        self._row_prefix += [metric + r for r in ents.rendered]
        self.blocks.append(_Block(metric, kind, start, self._n_rows, key or metric))

    def _gpu_labels(self, g: int, driver: str | None = None) -> dict[str, str]:
        f = self.fleet
        n, i = divmod(g, f.gpus_per_node)
        return {
            "gpu": str(i), "UUID": f.uuids[g], "pci_bus_id": bus_id(i), "device": f"nvidia{i}",
            "modelName": f.spec.model_name, "Hostname": f.nodes[n],
            "DCGM_FI_DRIVER_VERSION": driver or f.node_driver[n],
        }

    def _replica_labels(self, r: int, vllm: bool) -> dict[str, str]:
        rep = self.fleet.replicas[r]
        d = {"replica": rep.name, "pod": rep.pod, "node": self.fleet.nodes[rep.node], "model_name": rep.model,
             "build": rep.build}
        if vllm:
            d["engine"] = "0"
        return d

    def _build_layout(self) -> None:
        f = self.fleet
        self.intern = _Interner()
        self.blocks: list[_Block] = []
        self._shadow: list[_Block] = []
        self._n_rows = 0
        self._row_parts: list[tuple[np.ndarray, ...]] = []
        self._row_prefix: list[str] = []
        G = f.n_gpus
        gpn = f.gpus_per_node
        gpus = self._entities([self._gpu_labels(g) for g in range(G)], [g // gpn for g in range(G)], list(range(G)))
        pool_fields = {p.name: p.dcgm_fields or f.spec.dcgm_fields for p in f.spec.pools}
        default_only = all(v == "default" for v in pool_fields.values())
        for m in GPU_GAUGES + GPU_COUNTERS:
            self._add_rows(m, "gpu", gpus, emit=not default_only or m in DEFAULT_DCGM_FIELDS)
        rank_gpu = f.rank_gpu.tolist()
        ranks = self._entities([{
            "job": f.jobs[j].name, "rank": str(r), "node": f.nodes[g // gpn], "gpu": str(g % gpn), "peer_group": f"stage{s}",
        } for g, j, r, s in zip(rank_gpu, f.rank_job.tolist(), f.rank_number.tolist(), f.rank_stage.tolist(), strict=True)],
            [g // gpn for g in rank_gpu], rank_gpu)
        for m in (RANK_COMPUTE, RANK_STEP):
            self._add_rows(m, "rank", ranks)
        R = len(f.replicas)
        rep_node = [r.node for r in f.replicas]
        vl_labels = [self._replica_labels(r, True) for r in range(R)]
        vl = self._entities(vl_labels, rep_node, rep=list(range(R)))
        fl = self._entities([self._replica_labels(r, False) for r in range(R)], rep_node, rep=list(range(R)))
        for m in REPLICA_GAUGES + REPLICA_COUNTERS:
            self._add_rows(m, "replica", fl if m.startswith("fleethealth_") else vl)
        for reason in ("stop", "length"):
            self._add_rows(SUCCESS, "replica", self._entities([d | {"finished_reason": reason} for d in vl_labels],
                                                              rep_node, rep=list(range(R))), key=f"{SUCCESS}|{reason}")
        self._les = {TTFT: np.asarray(TTFT_BUCKETS), ITL: np.asarray(ITL_BUCKETS)}
        self._log_les = {k: np.log(v) for k, v in self._les.items()}
        self._cdf_tab: tuple[np.ndarray, np.ndarray] | None = None
        for h in (TTFT, ITL):
            les = [*_le_strings(h), "+Inf"]
            nb = len(les)
            self._add_rows(h + "_bucket", "replica_bucket", self._entities(
                [d | {"le": le} for d in vl_labels for le in les], np.repeat(rep_node, nb).tolist(),
                rep=np.repeat(np.arange(R), nb).tolist()))
            self._add_rows(h + "_sum", "replica", vl)
            self._add_rows(h + "_count", "replica", vl)
        self._add_rows(NODE_INFO, "node", self._entities([f.node_labels(n) for n in range(f.n_nodes)],
                                                         list(range(f.n_nodes))))
        self._add_rows(REPLICA_INFO, "replica", self._entities([{
            "replica": rep.name, "node": f.nodes[rep.node], "build": rep.build, "model": rep.model,
        } for rep in f.replicas], rep_node, rep=[rep.index for rep in f.replicas]))
        if f.spec.pcie_link_fields:
            for m in PCIE_LINK_GAUGES:
                self._add_rows(m, "gpu", gpus)
        self.up_metric = self.intern.metric("up")
        self.up_series = np.array(
            [self.intern.series({"instance": self._instance(n), "job": "fleethealth-sim"}) for n in range(f.n_nodes)],
            np.int32)
        self.xid_metric = self.intern.metric(XID_COUNT)
        self.intern.frozen = True
        self.n_static = self._n_rows
        # pools whose exporter is on the default field list while others export more: their extra rows
        # are computed as everywhere else and dropped from what is served (None: nothing to drop)
        self._field_keep: np.ndarray | None = None
        if not default_only and "default" in pool_fields.values():
            lacks = np.array([pool_fields[p] == "default" for p in f.node_pool], bool)
            keep = np.ones(self._n_rows, bool)
            for b in self.blocks:
                if b.kind == "gpu" and b.metric in GPU_GAUGES + GPU_COUNTERS and b.metric not in DEFAULT_DCGM_FIELDS:
                    keep[b.start:b.stop] = ~lacks[np.arange(G) // gpn]
            self._field_keep = keep
        self.row_series, self.row_metric, self.row_node, self.row_gpu, self.row_rep = (
            np.concatenate(c) for c in zip(*self._row_parts, strict=True))
        del self._row_parts
        self.row_prefix = self._row_prefix
        self.row_is_rank = np.zeros(self.n_static, bool)
        for b in self.blocks:
            if b.kind == "rank":
                self.row_is_rank[b.start:b.stop] = True
        self.block_index = {b.metric: b for b in self.blocks}
        # dynamic rows: DCGM_EXP_XID_ERRORS_COUNT{xid} appear when a GPU first logs that Xid
        self.xid_rows: dict[tuple[int, int], int] = {}
        self.xid_counts: list[float] = []
        self._layout_version = 0
        self._node_rows_cache: dict[int, tuple[int, np.ndarray]] = {}
        self._full_cache: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]] | None = None
        self._all_up = np.ones(self.fleet.n_nodes, bool)
        self._all_up_values = np.ones(self.fleet.n_nodes)
        # One value buffer over the whole static layout, plus the blocks computed but not exported (the
        # shadow): each step writes every block in place and the snapshot is one copy of the emitted part.
        off = self.n_static
        for b in self._shadow:
            b.start, b.stop = off, off + b.stop
            off = b.stop
        self._buf = np.zeros(off)

    # ---- state --------------------------------------------------------------------------------
    def _init_state(self) -> None:
        f = self.fleet
        G, R, N, J = f.n_gpus, len(f.replicas), f.n_nodes, len(f.jobs)
        rng = np.random.default_rng([self.scenario.seed, 2])
        slot = np.tile(np.linspace(-1.5, 1.5, f.gpus_per_node), N)  # GPUs at the back of the chassis run hotter
        self.temp_static = slot + rng.normal(0.0, 1.6, G)
        self.temp_drift = rng.normal(0.0, 0.8, G)
        self.rack_names = sorted(set(f.node_rack))
        self.gpu_rack = np.array([self.rack_names.index(f.node_rack[g // f.gpus_per_node]) for g in range(G)])
        self.rack_amb = rng.normal(0.0, 0.8, len(self.rack_names))
        self.power_static = rng.normal(0.0, 12.0, G)
        self.rank_static = rng.uniform(-0.001, 0.001, len(f.rank_gpu))
        self.gpu_pool_kind = np.zeros(G, np.int64)  # 0 training, 1 serving, 2 idle
        for n in range(N):
            pool = next(p for p in f.spec.pools if p.name == f.node_pool[n])
            self.gpu_pool_kind[f.gpus_of_node(n)] = {"training": 0, "serving": 1, "idle": 2}[pool.workload]
        self.fb_base = np.where(self.gpu_pool_kind == 0, 76000.0 + rng.normal(0, 300, G),
                                np.where(self.gpu_pool_kind == 1, 0.9 * FB_TOTAL_MIB, 1.0))
        # cumulative counters start from plausible lifetime values
        self.energy = np.floor(rng.uniform(1e11, 5e11, G))
        self.pcie = np.floor(rng.exponential(2.0, G))
        self.sbe = np.floor(rng.exponential(1.0, G))
        self.dbe = np.zeros(G)
        self.corr_rows = np.zeros(G)
        self.uncorr_rows = np.zeros(G)
        self.therm_viol = np.zeros(G)
        self.power_viol = np.floor(rng.uniform(0, 5e6, G))
        self.nvl = np.zeros((4, G))
        self.xid_last = np.zeros(G)
        self.remap_pending = np.zeros(G)
        self.remap_failure = np.zeros(G)
        self.recovery_action = np.zeros(G)
        # training
        self.rank_compute = np.zeros(len(f.rank_gpu))
        self.rank_step = np.zeros(len(f.rank_gpu))
        self.job_hang_since = np.full(J, np.nan)
        self.job_comm = np.array([j.spec.comm_s for j in f.jobs])
        self.job_sigma = np.array([j.spec.seq_imbalance for j in f.jobs])
        stage_w = np.concatenate([j.stage_weights for j in f.jobs]) if J else np.zeros(0)
        offs = np.cumsum([0] + [len(j.stage_weights) for j in f.jobs])[:-1]
        rj = f.rank_job
        job_compute = np.array([j.spec.compute_s for j in f.jobs])
        self.rank_base = job_compute[rj] * stage_w[offs[rj] + f.rank_stage] if len(rj) else np.zeros(0)
        self.rank_noise = np.array([j.spec.rank_noise for j in f.jobs])[rj] if len(rj) else np.zeros(0)
        self.node_of_rank = f.rank_gpu // f.gpus_per_node
        self.job_rank_start = np.searchsorted(rj, np.arange(J)) if len(rj) else np.zeros(0, np.int64)
        self.mem_clock = np.full(G, 2619.0)
        self.base_load = np.where(self.gpu_pool_kind == 0, 0.95, 0.0)
        self.serve_gpus = np.nonzero(f.gpu_replica >= 0)[0]
        self.serve_rep = f.gpu_replica[self.serve_gpus]
        # serving
        self.rep_phase = rng.uniform(-0.3, 0.3, R)
        self.rep_rate = np.array([r.spec.rate_rps for r in f.replicas]) * rng.uniform(0.9, 1.1, R)
        self.rep_ttft = np.array([r.spec.ttft_s for r in f.replicas])
        self.rep_itl = np.array([r.spec.itl_s for r in f.replicas])
        self.rep_tokens = np.array([r.spec.output_tokens for r in f.replicas])  # output tokens per request
        self.rep_prompt = np.array([r.spec.prompt_tokens for r in f.replicas])
        self.rep_err = np.array([r.spec.error_rate for r in f.replicas])
        self.rep_diurnal = np.array([r.spec.diurnal for r in f.replicas])
        age = rng.uniform(1e4, 5e5, R)  # seconds each engine has been up
        self.replica_requests = np.floor(age * self.rep_rate)
        self.replica_errors = np.floor(self.replica_requests * self.rep_err)
        self.success = np.stack([np.floor((self.replica_requests - self.replica_errors) * 0.85),
                                 np.floor((self.replica_requests - self.replica_errors) * 0.15)])
        self.preempt = np.floor(rng.uniform(0, 50, R))
        self.gen_tokens = np.floor(self.replica_requests * self.rep_tokens)
        self.prompt_tokens = np.floor(self.replica_requests * self.rep_prompt)
        nb1, nb2 = len(TTFT_BUCKETS) + 1, len(ITL_BUCKETS) + 1
        p1 = _lognormal_bucket_probs(self.rep_ttft * 1.3, TTFT_SIGMA, self._les[TTFT]) if R else np.zeros((0, nb1))
        p2 = _lognormal_bucket_probs(self.rep_itl * 1.3, ITL_SIGMA, self._les[ITL]) if R else np.zeros((0, nb2))
        self.ttft_b = np.floor(np.cumsum(p1, axis=1) * self.replica_requests[:, None])
        self.itl_b = np.floor(np.cumsum(p2, axis=1) * self.gen_tokens[:, None])
        self.ttft_sum = self.ttft_b[:, -1] * self.rep_ttft * 1.4 if R else np.zeros(0)
        self.itl_sum = self.itl_b[:, -1] * self.rep_itl * 1.35 if R else np.zeros(0)
        self.last_kv = np.full(R, 0.4)
        self.ones_node = np.ones(N)
        self.ones_rep = np.ones(R)
        # The world's answers to decisions (closed loop, ``apply_action``): nodes and replicas taken out of
        # service (drained, quarantined), replicas behind a concurrency limit or an admission rule that
        # rejects oversized requests.
        self.node_out = np.zeros(N, bool)
        self.rep_out = np.zeros(R, bool)
        self.rep_limited = np.zeros(R, bool)
        self.rep_reject_oversized = np.zeros(R, bool)
        self.rep_node = np.array([r.node for r in f.replicas], np.int64)
        self.gpu_node = np.arange(G) // f.gpus_per_node
        # constants of the step, computed once exactly as the step used to compute them
        self._G, self._R, self._J, self._nr = G, R, J, len(f.rank_gpu)
        a = math.exp(-self.step_s / 7200.0)
        b = math.exp(-self.step_s / 10800.0)
        self._drift = (np.array(a), np.array(b), np.array(math.sqrt(1 - b * b) * 0.8))
        # rows of the step's unit normals: temperature, (unused), power, utilisation, framebuffer, memory
        # temperature, drift
        self._noise_scale = np.array([0.4, 1.0, 10.0, 1.5, 40.0, 0.5, math.sqrt(1 - a * a) * 0.8])[:, None]
        # temperature, (unused), power, utilisation, framebuffer: gain * load + offset + static (constant
        # after construction)
        self._load_gain = np.array([40.0, 0.0, 560.0, 100.0, 0.0])[:, None]
        self._load_offset = np.array([30.0, 0.0, 120.0, 0.0, 0.0])[:, None]
        zero = np.zeros(G)
        self._gpu_static = np.stack([self.temp_static, zero, self.power_static, zero, self.fb_base])
        # the same for every GPU at its base load (a plan's rows of the GPUs that serve nothing)
        self._w_base = np.multiply(self.base_load[None, :], self._load_gain)
        self._w_base += self._load_offset
        self._w_base += self._gpu_static
        self._serve_static = self._gpu_static[:, self.serve_gpus]
        self._ms_per_step = np.array(self.step_s * 1000.0)
        self._rank_noise2 = 2.0 * self.rank_noise
        self._seq_imbalance = bool(np.count_nonzero(self.job_sigma))  # job_sigma is constant
        self._rank_job = f.rank_job
        self._rank_gpu = f.rank_gpu
        self._plan_cache: _Plan | None = None
        self._inc = np.zeros((len(_REP_CTR), R))  # scratch: per-step increments of the replica counters
        # the sprinkles' mean counts per step, written as the step writes them (same floats)
        dt = self.step_s
        self._sprinkle_means = (2e-6 * dt * G, 1e-6 * dt * G, 1e-6 * dt * G)
        # numpy draws a Poisson count with a mean under 10 by multiplying uniforms until the product is
        # at most exp(-mean) (libm's exp, as math.exp): the count is 0 exactly when the first uniform is
        self._sprinkle_zero = tuple(math.exp(-m) for m in self._sprinkle_means)
        self._drawn: _Drawn | None = None
        self._ahead = _DRAW_FIRST
        self._gpu_rows: np.ndarray | None = None  # a drawn step's GPU gauges, for _emit
        # runs of consecutive GPUs (serving ones; of one rack) and each job's ranks, for sliced arithmetic
        self._serve_runs = _runs(self.serve_gpus, np.arange(len(self.serve_gpus)), 16)
        self._rack_runs = _runs(np.arange(G), self.gpu_rack, 64, same=True)
        self._racks_uniform = self._rack_runs is not None and self._rack_runs == [
            (i * (G // len(self._rack_runs)), (i + 1) * (G // len(self._rack_runs)), i)
            for i in range(len(self._rack_runs))] and len(self._rack_runs) == len(self.rack_amb)
        bounds = [*self.job_rank_start.tolist(), len(f.rank_gpu)]
        self._job_spans = list(zip(bounds[:-1], bounds[1:], strict=True))
        self._scratch = _Scratch()
        # drawn ahead: the scale of each normal of a step's first run (7 GPU rows, then the racks), and
        # the AR(1) coefficients of slow drift and rack ambient as one state (GPUs, then racks)
        nrk = len(self.rack_amb)
        self._gpu_z_scale = np.concatenate([np.repeat(self._noise_scale[:, 0], G), np.full(nrk, self._drift[2])])
        self._ar_coef = np.concatenate([np.full(G, a), np.full(nrk, b)])

    # ---- the value buffer ---------------------------------------------------------------------
    def _bind(self, fill: bool) -> None:
        """Point ``_v`` (one view per block) and the state arrays that are blocks of the output into the
        value buffer, so that counters advance in place and a snapshot is one copy. ``fill``: the state
        arrays hold the values (construction); otherwise the buffer does (a copy being restored)."""
        buf = self._buf
        pos = {b.key: b for b in (*self.blocks, *self._shadow)}
        self._v = v = {k: buf[b.start:b.stop] for k, b in pos.items()}
        R = self._R
        for h in (TTFT, ITL):
            v[h + "_bucket"] = v[h + "_bucket"].reshape(R, len(self._les[h]) + 1)
        for name, keys in _SPANS:
            first, last = pos[keys[0]], pos[keys[-1]]
            # consecutive blocks (both all emitted or all shadow), viewed as one (rows, entities) array
            assert all(pos[k].stop == pos[n].start for k, n in zip(keys, keys[1:], strict=False))
            v[name] = buf[first.start:last.stop].reshape(len(keys), first.stop - first.start)
        if fill:
            self._rep_ctr = np.stack([getattr(self, a) for a in _REP_CTR[:5]] + [self.success[0], self.success[1]])
        for name, key in _STATE:
            if fill:
                np.copyto(v[key], getattr(self, name))
            setattr(self, name, v[key])
        self.success = self._rep_ctr[5:7]
        for i, name in enumerate(_REP_CTR[:5]):
            setattr(self, name, self._rep_ctr[i])

        def span(*keys: str) -> np.ndarray:
            first, last = pos[keys[0]], pos[keys[-1]]
            assert all(pos[k].stop == pos[n].start for k, n in zip(keys, keys[1:], strict=False))
            return buf[first.start:last.stop]

        # what a drawn-ahead step writes (_step_drawn): the first nine GPU gauges (the memory clock among
        # them is constant state, written back as it is), the rank gauges, the replica gauges, and the
        # replica counters with the histograms (sums and counts included) as one run
        G, nr = self._G, self._nr
        self._gpu_span = (pos[GPU_GAUGES[0]].start, pos[GPU_GAUGES[8]].stop)
        self._fast_views = (
            span(*GPU_GAUGES[:9]).reshape(9, G),
            span(RANK_COMPUTE, RANK_STEP).reshape(2, nr), span(*REPLICA_GAUGES).reshape(3, R),
            span(*REPLICA_COUNTERS, SUCCESS + "|stop", SUCCESS + "|length", *(
                h + suf for h in (TTFT, ITL) for suf in ("_bucket", "_sum", "_count"))),
        )

    def __getstate__(self) -> dict[str, Any]:
        # the bound state is in the buffer; views would come back as detached copies (deepcopy, pickle)
        drop = {"_v", "_plan_cache", "_fast_views", "_scratch", "success", *_REP_CTR[:5], *(name for name, _ in _STATE)}
        return {k: v for k, v in self.__dict__.items() if k not in drop}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._plan_cache = None  # a pure function of the step: made again when needed
        self._scratch = _Scratch()  # a drawn block in progress comes along as copies of its rows
        self._bind(fill=False)

    # ---- callbacks used by faults --------------------------------------------------------------
    def emit_xid(self, g: int, xid: int, t: float, message: str = "") -> None:
        f = self.fleet
        self.xid_last[g] = xid
        key = (g, xid)
        if key not in self.xid_rows:
            labels = self._gpu_labels(g) | {"xid": str(xid)}
            n = g // f.gpus_per_node
            full = labels | {"instance": self._instance(n)}
            sid = self.intern.series(full)
            self.xid_rows[key] = len(self.xid_counts)
            self.xid_counts.append(0.0)
            self._dyn_series = np.append(getattr(self, "_dyn_series", np.zeros(0, np.int32)), np.int32(sid))
            self._dyn_node = np.append(getattr(self, "_dyn_node", np.zeros(0, np.int64)), n)
            self._dyn_gpu = np.append(getattr(self, "_dyn_gpu", np.zeros(0, np.int64)), g)
            self.row_prefix = [*self.row_prefix, XID_COUNT + _render_labels(labels)]
            self._layout_version += 1
        self.xid_counts[self.xid_rows[key]] += 1
        bus = bus_id(g % f.gpus_per_node)[4:]
        line = f"NVRM: Xid (PCI:{bus[:-2]}): {xid}, pid=0, {message}".rstrip()
        self.add_event("xid", f.gpu_entity(g), g // f.gpus_per_node, t,
                       {"xid": xid, "pci_bus_id": bus_id(g % f.gpus_per_node), "line": line}, "")

    def set_pcie_link(self, g: int, gen: float, width: float) -> None:
        """GPU ``g``'s PCIe link now runs at ``gen`` x ``width`` (a downtrain, or its retrain back); a gauge
        no step rewrites, so it holds until changed. A no-op where the fleet exports no link fields."""
        if self.fleet.spec.pcie_link_fields:
            self._v["DCGM_FI_DEV_PCIE_LINK_GEN"][g] = gen
            self._v["DCGM_FI_DEV_PCIE_LINK_WIDTH"][g] = width

    def add_event(self, kind: str, entity: str, node: int, t: float, ctx: dict, truth: str) -> None:
        if self._event_ts and t < self._event_ts[-1]:
            self._events_sorted = False
        self._events.append(SimEvent(t, kind, entity, self.fleet.nodes[node], ctx, truth))
        self._event_ts.append(t)

    def relabel_driver(self, n: int, version: str) -> None:
        """A driver change (an upgrade, or a rollback): the node's DCGM series carry the new version label
        (new series); the node rebooted onto it, so volatile counters restart from zero and the last Xid
        and any pending recovery action are gone with the old driver's state."""
        f = self.fleet
        f.node_driver[n] = version
        self.row_series = self.row_series.copy()
        gpus = f.gpus_of_node(n)
        inst = {"instance": self._instance(n)}
        # each label set interned and rendered once, for every block (in the order the blocks would)
        gpu_labels = [self._gpu_labels(int(g), version) for g in gpus]
        gpu_sids = np.array([self.intern.series(lb | inst) for lb in gpu_labels], np.int32)
        gpu_text = [_render_labels(lb) for lb in gpu_labels]
        node_labels = f.node_labels(n)
        node_sid = self.intern.series(node_labels | inst) if "node" in {b.kind for b in self.blocks} else -1
        node_text = _render_labels(node_labels)
        prefix = list(self.row_prefix)
        for b in self.blocks:
            if b.kind == "gpu":
                self.row_series[b.start + gpus] = gpu_sids
                for g, text in zip(gpus.tolist(), gpu_text, strict=True):
                    prefix[b.start + g] = b.metric + text
            elif b.kind == "node":
                self.row_series[b.start + n] = node_sid
                prefix[b.start + n] = b.metric + node_text
        self.row_prefix = prefix
        self.sbe[gpus] = 0
        self.dbe[gpus] = 0
        self.xid_last[gpus] = 0
        self.recovery_action[gpus] = 0
        self._layout_version += 1

    def reset_replica_counters(self, r: int) -> None:
        for arr in (self.replica_requests, self.replica_errors, self.preempt, self.gen_tokens, self.prompt_tokens,
                    self.ttft_sum, self.itl_sum):
            arr[r] = 0.0
        self.success[:, r] = 0.0
        self.ttft_b[r] = 0.0
        self.itl_b[r] = 0.0
        # a histogram's count is its +Inf bucket; a drawn-ahead step advances both by the same increment
        self._v[TTFT + "_count"][r] = 0.0
        self._v[ITL + "_count"][r] = 0.0

    def serving(self, r: int) -> bool:
        """Replica ``r`` takes traffic: neither it nor its node was taken out of service."""
        return not (self.rep_out[r] or self.node_out[self.rep_node[r]])

    # ---- stepping -----------------------------------------------------------------------------
    def _effects(self, t: float) -> Effects | None:
        f = self.fleet
        eff: Effects | None = None
        for fault in self.faults:
            if fault.stopped or t < fault.onset:
                continue
            if fault.end is not None and t >= fault.end:
                if fault.started:
                    fault.stop(self, t)
                fault.stopped = True
                continue
            if eff is None:
                eff = Effects(f.n_gpus, len(f.replicas), len(f.jobs), f.n_nodes, len(f.rank_gpu))
            if not fault.started:
                fault.started = True
                fault.start(self, t)
            fault.apply(self, t, eff)
        return eff

    def step(self) -> Snapshot:
        """Advance one step and return its snapshot.

        Every block is written in place into the value buffer (``_v``). Each value's arithmetic is the
        same, operation for operation and in the same order, as when every quantity was computed on its
        own (element-wise IEEE operations give the same bits whichever array they run over), and the
        random draws are the same calls in the same order: a seed's telemetry does not depend on how the
        step is organised. Constants are 0-d arrays, which numpy applies faster than Python floats.

        In the quiet regime (no fault effect, nothing out of service) a step's draws are known in advance:
        up to ``_DRAW_AHEAD`` steps are drawn at once, in the same order as one by one, and what follows
        from the draws and the plan is computed for all of them together (``_draw_ahead``); each step
        then copies its rows into the buffer and adds its increments (``_step_drawn``). A step outside the
        regime first puts the generator back where the last consumed step left it (``_undraw``)."""
        self.k += 1
        t = self.start + self.k * self.step_s
        self.t = t
        eff = self._effects(t)
        any_out = bool(np.count_nonzero(self.node_out))
        if eff is None and not any_out and not (self._R and np.count_nonzero(self.rep_out)) and _DRAW_AHEAD:
            self._step_drawn()
        else:
            if self._drawn is not None:
                self._undraw()
            self._step_plain(t, eff, any_out)
        return self._emit(t, eff, any_out)

    def _step_plain(self, t: float, eff: Effects | None, any_out: bool) -> None:
        """One step's draws and values, computed on their own."""
        rng = self.rng
        G = self._G
        v = self._v
        day = (t - self.start) / 86400.0
        # Seven rows of unit normals: temperature, (unused), power, utilisation, framebuffer, memory
        # temperature, drift; scaled in one operation. Slow drift: AR(1) with a two-hour time constant,
        # and a rack ambient with a daily swing.
        n01 = rng.standard_normal((7, G))
        n01 *= self._noise_scale
        a, b, b_c = self._drift
        drift = self.temp_drift
        drift *= a
        drift += n01[6]
        amb = self.rack_amb
        amb *= b
        noise = rng.standard_normal(len(amb))
        noise *= b_c
        amb += noise
        ambient = amb[self.gpu_rack]
        ambient += np.array(1.0 * math.sin(2 * math.pi * (day - 0.6)))

        plan, i = self._plan_for(self.k, eff, any_out)
        # temperature, (unused), power, utilisation, framebuffer as rows of one array, each
        # gain * load + offset + static (planned) + (drift + ambient for the temperature) + noise
        if plan.w is not None:
            w = plan.w[i]
        else:
            w = self._w_base.copy()
            w[:, self.serve_gpus] = plan.w_serve[i]
        temp = w[0]
        temp += drift
        temp += ambient
        w += n01[:5]
        power, util, fb = w[2], w[3], w[4]
        # A loaded GPU's clock jitters uniformly inside a band under its power/boost limits: the peer spread
        # is what the seed describes (MAD-based sigma 14 MHz, so -3 % reads as z = 4.1) while a healthy GPU
        # never strays 1 % from the pack (no Gaussian tail, and no small peer group's tiny MAD, fakes an
        # outlier).
        clock = rng.random(G)
        clock -= _K0_5
        clock *= _K38
        clock += _K1935
        # the effects faults touched (the others are neutral: adding zero, multiplying by one, changes nothing)
        reasons = None
        if eff is not None:
            for arr, name in ((temp, "temp_add"), (power, "power_add"), (fb, "fb_add")):
                if (add := eff.get(name)) is not None:
                    arr += add
            if (mul := eff.get("clock_mul")) is not None:
                clock *= mul
            reasons = eff.get("clock_reasons")
        if reasons is not None:
            v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"][...] = reasons
        else:
            v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].fill(0.0)
        np.rint(temp, out=v["DCGM_FI_DEV_GPU_TEMP"])
        mem_temp = np.add(temp, _K6, out=v["DCGM_FI_DEV_MEMORY_TEMP"])
        mem_temp += n01[5]
        np.rint(mem_temp, out=mem_temp)
        np.rint(clock, out=v["DCGM_FI_DEV_SM_CLOCK"])
        v["DCGM_FI_DEV_POWER_USAGE"][...] = power
        util = np.rint(util, out=v["DCGM_FI_DEV_GPU_UTIL"])
        np.maximum(util, _K0, out=util)
        np.minimum(util, _K100, out=util)
        copy_util = np.multiply(util, _K0_4, out=v["DCGM_FI_DEV_MEM_COPY_UTIL"])
        np.rint(copy_util, out=copy_util)
        fb = np.rint(fb, out=v["DCGM_FI_DEV_FB_USED"])
        np.minimum(_FB_USABLE, fb, out=fb)
        np.subtract(_FB_USABLE, fb, out=v["DCGM_FI_DEV_FB_FREE"])
        joules = np.multiply(power, self._ms_per_step)
        self.energy += np.rint(joules, out=joules)
        # rare healthy counter noise: a replay, a corrected bit, one CRC flit now and then
        dt = self.step_s
        _sprinkle(rng, self.pcie, 2e-6 * dt * G)
        _sprinkle(rng, self.sbe, 1e-6 * dt * G)
        _sprinkle(rng, self.nvl[0], 1e-6 * dt * G)
        if eff is not None:
            if (rate := eff.get("pcie_rate")) is not None and np.count_nonzero(rate):
                self.pcie += _counts(rng, rate * dt)
            if (rate := eff.get("sbe_rate")) is not None and np.count_nonzero(rate):
                self.sbe += _counts(rng, rate * dt)
            if (rate := eff.get("thermal_viol_rate")) is not None:
                self.therm_viol += np.rint(rate * dt)
            if (rate := eff.get("power_viol_rate")) is not None:
                self.power_viol += np.rint(rate * dt)
            if (rate := eff.get("nvlink_rate")) is not None and np.count_nonzero(rate):
                nr = rate * dt
                self.nvl += _counts(rng, np.stack([nr, nr * 0.1, nr * 0.05, nr * 0.002]))
        self._step_training(t, eff, any_out)
        self._step_serving(dt, plan, i)

    def _emit(self, t: float, eff: Effects | None, any_out: bool) -> Snapshot:
        """The snapshot of the step just computed (the buffer's emitted rows, dynamic Xid rows, `up`)."""
        metric, series, row_node, row_gpu, row_rep, n_up = self._full_ids()
        node_up = self._all_up
        errors: list[InputIssue] = []
        keep: np.ndarray | None = None
        if eff is not None and any(
                (gone := eff.get(name)) is not None and np.count_nonzero(gone)
                for name in ("node_down", "gpu_gone", "replica_gone")):
            node_up = ~eff.node_down
            gpu_ok = np.append(~eff.gpu_gone, True)
            rep_ok = np.append(~eff.replica_gone, True)
            keep = node_up[row_node] & gpu_ok[row_gpu] & rep_ok[row_rep]
            keep[-n_up:] = True  # `up` itself is always there: 0 for a target that failed its scrape
            for n, why in sorted(eff.node_reason.items()):
                errors.append(InputIssue(f"target {self._instance(n)}", 0, why))
        if self._field_keep is not None:
            fk = np.ones(len(row_node), bool)
            fk[: self.n_static] = self._field_keep
            keep = fk if keep is None else keep & fk
        if any_out:
            # the ranks of a drained node are gone: the job runs on without them
            gone = np.zeros(len(row_node), bool)
            gone[: self.n_static] = self.row_is_rank & self.node_out[self.row_node]
            keep = ~gone if keep is None else keep & ~gone
        # a fresh array per step: snapshots handed out stay as they were
        emitted = self._buf[: self.n_static]
        if self._gpu_rows is not None:
            lo, hi = self._gpu_span
            values = np.concatenate((emitted[:lo], *self._gpu_rows, emitted[hi:], self._all_up_values))
            self._gpu_rows = None
        elif self.xid_counts:
            values = np.concatenate((emitted, np.asarray(self.xid_counts), node_up), dtype=np.float64)
        elif node_up is self._all_up:
            values = np.concatenate((emitted, self._all_up_values))
        else:
            values = np.concatenate((emitted, node_up), dtype=np.float64)
        self._keep = keep
        self._values = values
        if keep is not None:
            metric, series, values = metric[keep], series[keep], values[keep]
        ts = np.empty(len(values))
        ts.fill(t)
        if eff is not None:
            # exporter faults (frozen values, a skewed clock) change what is served, not the fleet
            adjusting = [f for f in self.faults if getattr(f, "adjusts_output", False) and f.started
                         and not f.stopped and f.active(t)]
            if adjusting:
                rn = row_node if keep is None else row_node[keep]
                for fault in adjusting:
                    fault.adjust_output(self, t, values, ts, rn)  # type: ignore[attr-defined]
        snap = Snapshot(
            at=t, metrics=self.intern.metrics, labelsets=self.intern.labelsets, metric_ids=metric,
            series_ids=series, values=values, ts=ts, source_errors=errors,
        )
        self.last = snap
        return snap

    # ---- the quiet regime: draws made ahead --------------------------------------------------------
    def _step_drawn(self) -> None:
        """A quiet step from the rows drawn ahead: its gauges copied into the buffer, its increments
        added to the counters there (which actions may have changed meanwhile: added, not copied)."""
        d = self._drawn
        k = self.k
        if d is None or k >= d.k0 + d.n:
            d = self._drawn = self._draw_ahead(k)
        i = k - d.k0
        gpu, ranks, rep_gauges, rep_counters = self._fast_views
        if self.xid_counts:
            np.copyto(gpu, d.gpu[:, i])
        else:
            # the GPU gauges go straight into the snapshot (_emit): the buffer's rows of them are only
            # ever written (each step, plain or drawn, writes them all), never read
            self._gpu_rows = d.gpu[:, i]
        self.energy += d.energy[i]
        if d.sprinkles and (hits := d.sprinkles.get(i)):
            counters = (self.pcie, self.sbe, self.nvl[0])
            for c, gpus in hits:
                np.add.at(counters[c], gpus, 1.0)
        drift = d.drift[i]
        self.temp_drift = drift[:self._G]
        self.rack_amb = drift[self._G:]
        np.copyto(ranks, d.ranks[:, i])
        np.copyto(rep_gauges, d.rep_gauges[i])
        rep_counters += d.rep_inc[i]

    def _undraw(self) -> None:
        """Leave the quiet regime: put the generator where the consumed steps left it (replaying their
        draws from the first one's state) and forget the rest."""
        d = self._drawn
        assert d is not None
        self._drawn = None
        used = self.k - d.k0  # steps k0 .. k - 1 are consumed; step k draws on its own
        if used < d.n:
            self.rng.bit_generator.state = d.state0
            if used:
                self._draws(used, d.kv[:used], d.lam[:used], d.state0)
            self._ahead = _DRAW_FIRST

    def _draws(self, n: int, kv: np.ndarray, lam: np.ndarray, state0: Mapping[str, Any]) -> _Draws:
        """The draws of ``n`` quiet steps (planned KV-cache use ``kv`` and capped Poisson means ``lam``,
        one row per step; ``state0``: the generator's state now): the calls ``_step_plain`` makes, in
        its order, except that consecutive normal draws are one call (numpy's Generator gives the same
        numbers for one call of n + m as for n then m: each value takes the next raw outputs, nothing is
        buffered between calls), and the three sprinkles' Poisson draws ride on the clocks' uniforms:
        three more uniforms, each at most its sprinkle's ``_sprinkle_zero``, are three zero counts, the
        same raw outputs consumed. Otherwise (a sprinkle hits, 1 step in 20 on 512 GPUs) the generator
        steps back over the three and draws the sprinkles as the plain step does; stepping back empties
        the generator's buffered half output (32-bit draws, the sprinkles' GPU picks), which is put back."""
        rng = self.rng
        bg = rng.bit_generator
        assert isinstance(bg, np.random.PCG64)  # default_rng's: it can step back
        half = (state0["has_uint32"], state0["uinteger"])
        G, R, J, nr = self._G, self._R, self._J, self._nr
        tail = (self.fleet.n_nodes if nr and self._seq_imbalance else 0) + (J if nr else 0) + 4 * R
        ws = self._scratch
        dr = _Draws(ws("gpu_z", n, 7 * G + len(self.rack_amb)), ws("clock_u", n, G + 3), {}, ws("common_z", n, J if nr else 0),
                    ws("dev_u", n, nr), ws("tail_z", n, tail), ws("rep_u", n, 2 * R), ws("small", n, 4 * R),
                    ws("preempt", n, R))
        dr.preempt.fill(0.0)
        means = self._sprinkle_means
        z0, z1, z2 = self._sprinkle_zero
        hot = (kv.max(axis=1) > _KV_SAFE).tolist() if R else []
        dt = self.step_s
        normal, uniform, poisson = rng.standard_normal, rng.random, rng.poisson
        gpu_z, clock_u, common_z, dev_u, tail_z, rep_u = dr.gpu_z, dr.clock_u, dr.common_z, dr.dev_u, dr.tail_z, dr.rep_u
        counts: list[np.ndarray] = []
        for i in range(n):
            normal(out=gpu_z[i])
            u = clock_u[i]
            uniform(out=u)
            if u.item(G) > z0 or u.item(G + 1) > z1 or u.item(G + 2) > z2:
                bg.advance(-3)
                if half[0]:
                    bg.state = {**bg.state, "has_uint32": half[0], "uinteger": half[1]}
                for c, mean in enumerate(means):
                    hits = int(poisson(mean))
                    if hits:
                        dr.sprinkles.setdefault(i, []).append((c, rng.integers(0, G, hits)))
                        now = bg.state
                        half = (now["has_uint32"], now["uinteger"])
            if nr:
                normal(out=common_z[i])
                uniform(out=dev_u[i])
            if tail:
                normal(out=tail_z[i])
            if R:
                uniform(out=rep_u[i])
                counts.append(poisson(lam[i]))
                if hot[i]:
                    level = np.multiply(tail_z[i, tail - R:], _K0_02)
                    level = np.add(kv[i], level)
                    np.maximum(level, _K0, out=level)
                    np.minimum(level, _K1, out=level)
                    if np.count_nonzero(np.greater(level, _K0_9)):
                        dr.preempt[i] = poisson(np.maximum(0.0, level - 0.9) * 5.0 * dt)
        if counts:
            dr.small[...] = counts
        return dr

    def _serving_cols(self, out: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
        """``out[:, g] = w[:, j] + x[:, g]`` for the serving GPUs g = serve_gpus[j] (steps on axis 0): by
        slices over runs of consecutive GPUs (a replica's GPUs are consecutive), or gathered."""
        runs = self._serve_runs
        if runs is None:
            out[:, self.serve_gpus] = w + x[:, self.serve_gpus]
            return
        for lo, hi, j in runs:
            np.add(w[:, j:j + hi - lo], x[:, lo:hi], out=out[:, lo:hi])

    def _add_rack_ambient(self, temp: np.ndarray, ambient: np.ndarray) -> None:
        """``temp[:, g] += ambient[:, rack of g]`` (steps on axis 0): one broadcast when the GPUs come in
        equal runs, rack after rack; else by slices over runs of one rack, or gathered."""
        runs = self._rack_runs
        if runs is None:
            temp += ambient[:, self.gpu_rack]
        elif self._racks_uniform:
            by_rack = temp.reshape(len(temp), len(runs), -1)
            by_rack += ambient[:, :, None]
        else:
            for lo, hi, rack in runs:
                temp[:, lo:hi] += ambient[:, rack:rack + 1]

    def _draw_ahead(self, k: int) -> _Drawn:
        """Draw the quiet steps from ``k`` on (to the end of the shared plan, at most ``_ahead``) and
        compute what follows from the draws and the plan for all of them at once: ``_step_plain``'s
        arithmetic, operation for operation, along a leading axis of steps (numpy's element-wise
        functions, exp included, give each element the same bits whatever the array: tested). Only the
        recurrences (slow drift, rack ambient) go step by step."""
        plan = self._plan_cache
        if plan is None or not plan.k0 <= k < plan.k0 + len(plan.med):
            plan = self._plan_cache = self._plan(k, _PLAN_STEPS)
        i0 = k - plan.k0
        n = min(self._ahead, _DRAW_AHEAD, len(plan.med) - i0)
        self._ahead = min(2 * self._ahead, _DRAW_AHEAD)
        rows = slice(i0, i0 + n)
        kv, lam = plan.kv[rows], plan.lam[rows].reshape(n, -1)
        state0 = self.rng.bit_generator.state
        dr = self._draws(n, kv, lam, state0)
        G, R, J, nr = self._G, self._R, self._J, self._nr
        v = self._v
        # what the plain step rewrites every step and nothing else writes: the same for all these steps
        v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].fill(0.0)
        self.job_hang_since.fill(np.nan)
        for h, hist in ((TTFT, self.ttft_b), (ITL, self.itl_b)):
            v[h + "_count"][...] = hist[:, -1]  # from here on advanced with the +Inf bucket

        # GPUs. Each row of unit normals is scaled into one contiguous (steps, GPUs) scratch just before
        # its use (numpy is several times slower on strided views of large arrays, and the scratch stays
        # in cache); slow drift and rack ambient are one AR(1) state (GPUs, then racks), each step from the
        # last; the gauges are contiguous (steps, GPUs) rows of ``gpu``.
        ws = self._scratch
        gz = dr.gpu_z
        rows_z = gz[:, :7 * G].reshape(n, 7, G)
        scale = self._noise_scale[:, 0].tolist()
        noise = ws("noise", n, G)

        def scaled(r: int) -> np.ndarray:
            return np.multiply(rows_z[:, r], scale[r], out=noise)

        innov = gz[:, 6 * G:]
        innov *= self._gpu_z_scale[6 * G:]
        state = ws("state", n, G + len(self.rack_amb))
        prev = np.concatenate((self.temp_drift, self.rack_amb))  # (they may be views of the state rows)
        coef = self._ar_coef
        for i in range(n):
            cur = np.multiply(prev, coef, out=state[i])
            cur += innov[i]
            prev = cur
        days = [(self.start + kk * self.step_s - self.start) / 86400.0 for kk in range(k, k + n)]
        ambient = state[:, G:] + np.array([1.0 * math.sin(2 * math.pi * (day - 0.6)) for day in days])[:, None]
        # gain * load + offset + static: the base rows for every GPU, then the serving GPUs' own
        # (the plan is read only: a step that leaves the regime may still use its later rows)
        w_base, w = self._w_base, plan.w_serve[rows]
        gpu = ws("gpu", n, 9, G, axis=1)
        temp = np.add(w_base[0], state[:, :G], out=ws("temp", n, G))
        self._serving_cols(temp, w[:, 0], state[:, :G])
        self._add_rack_ambient(temp, ambient)
        temp += scaled(0)
        np.rint(temp, out=gpu[0])
        mem_temp = np.add(temp, _K6, out=ws("mem_temp", n, G))
        mem_temp += scaled(5)
        np.rint(mem_temp, out=gpu[1])
        clock = np.subtract(dr.clock_u[:, :G], _K0_5, out=gpu[2])
        clock *= _K38
        clock += _K1935
        np.rint(clock, out=clock)
        gpu[3] = self.mem_clock  # nothing changes it (no fault, no action): copied back as it is
        for r, out in ((2, 4), (3, 5), (4, 7)):
            x = scaled(r)
            np.add(w_base[r], x, out=gpu[out])
            self._serving_cols(gpu[out], w[:, r], x)
        power, util, fb = gpu[4], gpu[5], gpu[7]
        np.rint(util, out=util)
        np.maximum(util, _K0, out=util)
        np.minimum(util, _K100, out=util)
        copy_util = np.multiply(util, _K0_4, out=gpu[6])
        np.rint(copy_util, out=copy_util)
        np.rint(fb, out=fb)
        np.minimum(_FB_USABLE, fb, out=fb)
        np.subtract(_FB_USABLE, fb, out=gpu[8])
        energy = np.multiply(power, self._ms_per_step, out=ws("energy", n, G))
        np.rint(energy, out=energy)

        # training: rank compute times and whole-step times
        ranks = ws("ranks", n, 2, nr, axis=1)
        off = 0
        if nr:
            rj = self._rank_job
            common = dr.common_z
            common *= _K0_01
            np.exp(common, out=common)
            dev = dr.dev_u
            dev -= _K0_5
            dev *= self._rank_noise2
            dev += self.rank_static
            dev += _K1
            comp = ranks[0]
            for j, (lo, hi) in enumerate(self._job_spans):  # ranks are contiguous per job
                np.multiply(common[:, j:j + 1], self.rank_base[lo:hi], out=comp[:, lo:hi])
            comp *= dev
            if self._seq_imbalance:
                N = self.fleet.n_nodes
                sig = self.job_sigma[rj]
                comp *= np.exp(sig * dr.tail_z[:, :N][:, self.node_of_rank] - 0.5 * sig * sig)
                off = N
            step_max = np.maximum.reduceat(comp, self.job_rank_start, axis=1)
            jitter = np.multiply(dr.tail_z[:, off:off + J], _K0_02)
            jitter += _K1
            jitter *= self.job_comm
            step = np.add(step_max, jitter, out=jitter)
            for j, (lo, hi) in enumerate(self._job_spans):
                ranks[1][:, lo:hi] = step[:, j:j + 1]
            off += J

        # serving: gauges, then the increments of the counters and histograms in buffer order
        rep_gauges = ws("rep_gauges", n, 3, R)
        rep_inc = ws("rep_inc", n, self._fast_views[3].size)
        if R:
            z = dr.tail_z[:, off:off + 4 * R].reshape(n, 4, R)
            u = dr.rep_u.reshape(n, 2, R)
            small = dr.small.reshape(n, 4, R)
            big = np.multiply(plan.sqrt_lam2[rows], z[:, :2])
            big += plan.lam2[rows]
            np.rint(big, out=big)
            np.maximum(big, _K0, out=big)
            counts = np.where(plan.lam2_big[rows], big, small[:, ::3])
            n_req = counts[:, 0]
            rep_gauges[:, 0] = counts[:, 1]
            rep_gauges[:, 1] = small[:, 2]
            ctr = rep_inc[:, :7 * R].reshape(n, 7, R)
            errs = np.minimum(n_req, small[:, 1], out=ctr[:, 4])
            lam_tok = n_req * self.rep_tokens
            n_tok = np.sqrt(lam_tok)
            n_tok *= z[:, 2]
            n_tok += lam_tok
            np.rint(n_tok, out=n_tok)
            np.maximum(n_tok, _K0, out=n_tok)
            med = plan.med[rows]
            cdf_rows = plan.cdf_rows[rows]
            assert self._cdf_tab is not None
            o = 7 * R
            for j, cnt, u_h, mean in ((0, n_req, u[:, 0], _TTFT_MEAN), (1, n_tok, u[:, 1], _ITL_MEAN)):
                tab = self._cdf_tab[j]
                nb = tab.shape[1]
                cdf = tab.take(cdf_rows[:, j], axis=0, out=ws(f"cdf{j}", n, R, nb), mode="clip")
                cdf *= cnt[:, :, None]
                cdf += u_h[:, :, None]
                hist = np.floor(cdf, out=rep_inc[:, o:o + R * nb].reshape(n, R, nb))
                hist[:, :, -1] = cnt
                o += R * nb
                total = np.multiply(cnt, med[:, j], out=rep_inc[:, o:o + R])
                total *= mean
                rep_inc[:, o + R:o + 2 * R] = cnt  # the count: the +Inf bucket's increment
                o += 2 * R
            ok = n_req - errs
            stop = np.multiply(ok, _K0_85, out=ctr[:, 5])
            stop += u[:, 0]
            np.floor(stop, out=stop)
            np.subtract(ok, stop, out=ctr[:, 6])
            ctr[:, 3] = n_req
            np.add(n_tok, n_req, out=ctr[:, 1])
            prompt = np.multiply(n_req, self.rep_prompt, out=ctr[:, 2])
            np.rint(prompt, out=prompt)
            noise_kv = np.multiply(z[:, 3], _K0_02)
            level = np.add(kv, noise_kv, out=rep_gauges[:, 2])
            np.maximum(level, _K0, out=level)
            np.minimum(level, _K1, out=level)
            ctr[:, 0] = dr.preempt
        return _Drawn(k, n, state0, kv, lam, gpu, energy, state, ranks, rep_gauges, rep_inc, dr.sprinkles)

    def _full_ids(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """Row arrays of the whole layout (static blocks, dynamic Xid counters, then one `up` per node),
        rebuilt only when the layout changes; snapshots share them, so they are never written in place."""
        hit = self._full_cache
        if hit is not None and hit[0] == self._layout_version:
            return hit[1]
        f = self.fleet
        nd = len(self.xid_counts)
        dyn_s = self._dyn_series if nd else np.zeros(0, np.int32)
        dyn_n = self._dyn_node if nd else np.zeros(0, np.int64)
        dyn_g = self._dyn_gpu if nd else np.zeros(0, np.int64)
        up_nodes = np.arange(f.n_nodes)
        out = (
            np.concatenate([self.row_metric, np.full(nd, self.xid_metric, np.int32),
                            np.full(f.n_nodes, self.up_metric, np.int32)]),
            np.concatenate([self.row_series, dyn_s, self.up_series]).astype(np.int32),
            np.concatenate([self.row_node, dyn_n, up_nodes]),
            np.concatenate([self.row_gpu, dyn_g, np.full(f.n_nodes, -1)]),
            np.concatenate([self.row_rep, np.full(nd + f.n_nodes, -1)]),
            f.n_nodes,
        )
        # read-only: the history then knows these very arrays still hold the layout it planned for
        out[0].flags.writeable = False
        out[1].flags.writeable = False
        self._full_cache = (self._layout_version, out)
        return out

    def _step_training(self, t: float, eff: Effects | None, any_out: bool) -> None:
        if self._nr == 0:
            return
        rng = self.rng
        J = self._J
        v = self._v
        seq = eff.get("seq_sigma") if eff is not None else None
        job_sigma = self.job_sigma + seq if seq is not None else self.job_sigma
        imbalance = np.count_nonzero(job_sigma) > 0 if seq is not None else self._seq_imbalance
        common = rng.standard_normal(J)  # the whole job is a little slower on some steps
        common *= _K0_01
        common = np.exp(common, out=common)
        rj = self._rank_job
        node_of_rank = self.node_of_rank
        # Healthy ranks of one stage stay within 1.1 % of each other's typical time, uniformly (seed: MAD
        # 0.01 s at 1.82 s, so 1.86 s reads as z ~ 2.7); anything beyond that comes from a fault or from
        # the workload (unequal stages, sequence lengths).
        dev = rng.random(self._nr)
        dev -= _K0_5
        dev *= self._rank_noise2
        dev += self.rank_static
        dev += _K1
        comp = common[rj]
        comp *= self.rank_base
        comp *= dev
        if imbalance:
            # sequence-length imbalance: the ranks of one node share a micro-batch, so they are slow together
            z = rng.standard_normal(self.fleet.n_nodes)
            sig = job_sigma[rj]
            comp = comp * np.exp(sig * z[node_of_rank] - 0.5 * sig * sig)
        if eff is not None:
            if (mul := eff.get("compute_mul")) is not None:
                comp = comp * mul[self._rank_gpu]
            if (mul := eff.get("rank_mul")) is not None:
                comp = comp * mul
        out = self.node_out[node_of_rank] if any_out else None
        # ranks are contiguous per job; a drained node's ranks no longer hold the step up
        step_max = np.maximum.reduceat(comp if out is None else np.where(out, 0.0, comp), self.job_rank_start)
        jitter = rng.standard_normal(J)
        jitter *= _K0_02
        jitter += _K1
        jitter *= self.job_comm
        step = np.add(step_max, jitter, out=jitter)
        hung = eff.get("job_hang") if eff is not None else None
        if hung is not None and np.count_nonzero(hung):
            newly = hung & np.isnan(self.job_hang_since)
            self.job_hang_since[newly] = t
            # a hung collective: no step completes, compute times freeze, the step in flight grows
            hang_ranks = hung[rj]
            comp = np.where(hang_ranks, self.rank_compute, comp)
            stuck = eff.get("rank_stuck") if eff is not None else None
            if stuck is not None:
                # the ranks that never reach the collective: their compute is still running (the rank
                # timer's reading in flight), while their peers' ended at the collective they wait in
                since = self.job_hang_since[rj]
                comp = np.where(stuck & hang_ranks, self.rank_base + (t - np.nan_to_num(since)), comp)
            step = np.where(hung, t - np.nan_to_num(self.job_hang_since) + self.step_s, step)
        if hung is not None:
            self.job_hang_since[~hung] = np.nan
        else:
            self.job_hang_since.fill(np.nan)
        self.rank_compute[...] = comp
        v[RANK_STEP][...] = step[rj]

    def _step_serving(self, dt: float, plan: _Plan, i: int) -> None:
        R = self._R
        if R == 0:
            return
        rng = self.rng
        v = self._v
        # One call per distribution per step: with 32 replicas the cost is per call, not per number.
        z = rng.standard_normal((4, R))
        u = rng.random((2, R))
        small = rng.poisson(plan.lam[i].reshape(-1)).astype(np.float64).reshape(4, R)
        # requests arriving and requests running (two rows): Poisson counts, exact for small means, by the
        # normal approximation for large ones
        big = np.multiply(plan.sqrt_lam2[i], z[:2])
        big += plan.lam2[i]
        np.rint(big, out=big)
        np.maximum(big, _K0, out=big)
        counts = np.where(plan.lam2_big[i], big, small[::3])
        n_req = counts[0]
        v["vllm:num_requests_running"][...] = counts[1]
        v["vllm:num_requests_waiting"][...] = small[2]
        inc = self._inc  # this step's increments of the replica counters, rows in _REP_CTR order
        errs = np.minimum(n_req, small[1], out=inc[4])
        lam_tok = n_req * self.rep_tokens
        n_tok = np.sqrt(lam_tok)
        n_tok *= z[2]
        n_tok += lam_tok
        np.rint(n_tok, out=n_tok)
        np.maximum(n_tok, _K0, out=n_tok)
        # Requests and tokens are spread over the buckets by systematic sampling (one uniform per replica):
        # cumulative counts floor(N * CDF(le) + u) are monotone, have exactly the right means, and a rare
        # slow request still lands in the tail with the right probability; a multinomial per replica per
        # step would cost ten times more. The planned CDF rows are this step's own: used up in place.
        assert self._cdf_tab is not None
        for hist, cdf, n, u_h in ((self.ttft_b, self._cdf_tab[0][plan.cdf_rows[i, 0]], n_req, u[0]),
                                  (self.itl_b, self._cdf_tab[1][plan.cdf_rows[i, 1]], n_tok, u[1])):
            # the table's last column (+Inf) is a placeholder: the count itself goes there, so that the
            # whole (contiguous) histogram block takes one addition
            cdf *= n[:, None]
            cdf += u_h[:, None]
            np.floor(cdf, out=cdf)
            cdf[:, -1] = n
            hist += cdf
        med = plan.med[i]
        self.ttft_sum += n_req * med[0] * _TTFT_MEAN
        self.itl_sum += n_tok * med[1] * _ITL_MEAN
        v[TTFT + "_count"][...] = self.ttft_b[:, -1]
        v[ITL + "_count"][...] = self.itl_b[:, -1]
        ok = n_req - errs
        stop = np.multiply(ok, _K0_85, out=inc[5])
        stop += u[0]
        np.floor(stop, out=stop)
        np.subtract(ok, stop, out=inc[6])
        inc[3] = n_req
        np.add(n_tok, n_req, out=inc[1])
        prompt = np.multiply(n_req, self.rep_prompt, out=inc[2])
        np.rint(prompt, out=prompt)
        noise = z[3]
        noise *= _K0_02
        kv = np.add(plan.kv[i], noise, out=self.last_kv)
        np.maximum(kv, _K0, out=kv)
        np.minimum(kv, _K1, out=kv)
        if np.count_nonzero(np.greater(kv, _K0_9)):
            inc[0] = rng.poisson(np.maximum(0.0, kv - 0.9) * 5.0 * dt)
        else:
            inc[0].fill(0.0)
        self._rep_ctr += inc

    # ---- the plan: what no random draw enters ----------------------------------------------------
    def _plan_for(self, k: int, eff: Effects | None, any_out: bool) -> tuple[_Plan, int]:
        """The plan holding step ``k`` and its row. While nothing bends load, rates or latencies (no
        fault effect on them, nothing out of service) the steps share a plan made for ``_PLAN_STEPS``
        at once; otherwise step ``k`` gets its own, from the same code."""
        idle: np.ndarray | None = None
        if self._R and (any_out or np.count_nonzero(self.rep_out)):
            idle = self.rep_out | self.node_out[self.rep_node]
            if not np.count_nonzero(idle):
                idle = None
        if eff is not None and eff.neutral_for_serving():
            eff = None
        if eff is not None or any_out or idle is not None:
            return self._plan(k, 1, eff, idle, any_out), 0
        plan = self._plan_cache
        if plan is None or not plan.k0 <= k < plan.k0 + len(plan.med):
            plan = self._plan_cache = self._plan(k, _PLAN_STEPS)
        return plan, k - plan.k0

    def _plan(self, k0: int, n: int, eff: Effects | None = None, idle: np.ndarray | None = None,
              any_out: bool = False) -> _Plan:
        """Steps ``k0 .. k0 + n - 1``: diurnal load per replica and GPU, request rates, latency medians,
        Poisson means and latency CDF rows. Row by row the same operations a single step would do (a
        leading axis changes no element-wise result)."""
        R, dt = self._R, self.step_s
        t = self.start + np.arange(k0, k0 + n, dtype=np.float64) * dt
        day = (t - self.start) / 86400.0
        # serving load per replica (diurnal), mapped onto its GPUs
        rate = self.rep_rate * (1.0 + self.rep_diurnal * np.sin(2 * math.pi * (day[:, None] + self.rep_phase - 0.35)))
        rep_load = rate / (self.rep_rate * _K1_6)
        if eff is not None:
            rep_load += eff.load_add
        np.maximum(rep_load, _K0, out=rep_load)
        np.minimum(rep_load, _K2, out=rep_load)
        if eff is not None:
            rate = rate * eff.rate_mul
        if idle is not None:
            # out of service: the router sends nothing, the engine idles with its weights loaded
            rate = np.where(idle, 0.0, rate)
            rep_load = np.where(idle, 0.0, rep_load)
        gl = rep_load[:, self.serve_rep]
        gl *= _K0_6
        gl += _K0_35
        np.minimum(_K1, gl, out=gl)
        # only the serving GPUs' load moves (the others' rows are computed once, the same operations),
        # unless nodes are drained
        w_serve = np.multiply(gl[:, None, :], self._load_gain)
        w_serve += self._load_offset
        w_serve += self._serve_static
        w = None
        if any_out:
            load = np.repeat(self.base_load[None, :], n, axis=0)
            load[:, self.node_out[self.gpu_node]] = 0.0  # drained: the workload went elsewhere
            load[:, self.serve_gpus] = gl
            w = np.multiply(load[:, None, :], self._load_gain)
            w += self._load_offset
            w += self._gpu_static
        # latency medians: TTFT grows with the square of the load, ITL linearly
        med = np.empty((n, 2, R))
        ttft = np.multiply(rep_load, _K0_8, out=med[:, 0])
        ttft *= rep_load
        ttft += _K1
        ttft *= self.rep_ttft
        itl = np.multiply(rep_load, _K0_5, out=med[:, 1])
        itl += _K1
        itl *= self.rep_itl
        err = self.rep_err
        if eff is not None:
            ttft *= eff.ttft_mul
            itl *= eff.itl_mul
            err = np.minimum(err + eff.err_add, 1.0)
        # Poisson means: requests arriving and running (uncapped, for the normal approximation), and the
        # capped means of requests, errors, waiting, running
        lam2 = np.empty((n, 2, R))
        np.multiply(rate, dt, out=lam2[:, 0])
        e2e = self.rep_tokens * itl
        e2e += ttft
        e2e *= rate
        np.minimum(e2e, _K256, out=lam2[:, 1])
        lam = np.empty((n, 4, R))
        np.minimum(lam2, _K30, out=lam[:, ::3])
        np.multiply(lam2[:, 0], err, out=lam[:, 1])
        waiting = np.subtract(rep_load, _K0_75, out=lam[:, 2])
        np.maximum(_K0, waiting, out=waiting)
        waiting *= _K40
        waiting += _K0_1
        cdf_rows = self._latency_cdf(med)
        kv = np.multiply(rep_load, _K0_5)
        kv += _K0_15
        return _Plan(k0, w, w_serve, med, lam2, np.sqrt(lam2), lam2 >= _K30, lam, cdf_rows, kv)

    def _latency_cdf(self, med: np.ndarray) -> np.ndarray:
        """The rows of the tables of P(latency <= le) per bucket for the TTFT and the ITL histograms, per
        step and replica (``med``: (steps, 2, replicas) medians; the rows have the same shape).

        Looked up in a table over log(median) at 0.5 % resolution, built once: the erf per bucket per
        replica per step was the most expensive line of the serving model."""
        if self._cdf_tab is None:
            grid = _CDF_LO + _CDF_STEP * np.arange(_CDF_N)
            zt = (self._log_les[TTFT][None, :] - grid[:, None]) * (1.0 / (TTFT_SIGMA * _SQRT2))
            zi = (self._log_les[ITL][None, :] - grid[:, None]) * (1.0 / (ITL_SIGMA * _SQRT2))
            self._cdf_tab = (_with_inf(0.5 * (1.0 + _erf(zt))), _with_inf(0.5 * (1.0 + _erf(zi))))
        ix = np.log(med)
        ix -= _CDF_LO
        ix *= 1 / _CDF_STEP
        np.rint(ix, out=ix)
        np.maximum(ix, _K0, out=ix)
        np.minimum(ix, _CDF_LAST, out=ix)
        return ix.astype(np.intp)

    # ---- public API ---------------------------------------------------------------------------
    def steps(self, n: int | None = None) -> Iterator[tuple[float, Snapshot]]:
        """Yield ``(t, snapshot)`` for the rest of the scenario (or ``n`` more steps)."""
        total = self.scenario.n_steps
        left = total - (self.k + 1) if n is None else n
        for _ in range(max(0, left)):
            snap = self.step()
            yield self.t, snap

    def advance_to(self, t: float) -> Snapshot | None:
        """Step until the last step's time is at least ``t`` (never backwards)."""
        while self.t + self.step_s <= t + 1e-9:
            self.step()
        return self.last

    @property
    def ground_truth(self) -> list[GroundTruth]:
        out: list[GroundTruth] = []
        for fault in self.faults:
            out += fault.truth()
        return out

    def events(self, t: float, since: float | None = None) -> list[SimEvent]:
        """Non-metric events with ``since < ts <= t`` (default: the step ending at ``t``)."""
        lo = t - self.step_s if since is None else since
        if self._events_sorted:
            # called every step by the backtest: a search, not a scan of everything that happened so far
            return self._events[bisect.bisect_right(self._event_ts, lo):bisect.bisect_right(self._event_ts, t)]
        return [e for e in self._events if lo < e.ts <= t]

    @property
    def all_events(self) -> list[SimEvent]:
        return list(self._events)

    def active_test(self, node: str, t: float) -> bool:
        """A DCGM diag / NCCL check on ``node`` at ``t``: passes unless a real fault is still present and
        shows while the test runs (an intermittent link between bursts passes: Fault.caught_by_test)."""
        n = self.fleet.node_index(node)
        return all(not (fault.active(t) and n in fault.faulty_nodes() and fault.caught_by_test(t))
                   for fault in self.faults)

    def inject(self, spec: FaultSpec | dict, at: float | None = None) -> Fault:
        """Add a fault while running (the exporter's control endpoint uses this). ``onset`` in the spec is
        relative to ``at`` (default: now)."""
        fs = spec if isinstance(spec, FaultSpec) else FaultSpec.model_validate(spec)
        base = (self.t if at is None else at) - self.start
        fs = fs.model_copy(update={"onset": base + fs.onset, "end": None if fs.end is None else base + fs.end})
        fault = make_fault(fs, len(self.faults), self.fleet, self.start, self.scenario.seed)
        self.faults.append(fault)
        return fault

    ACTIONS = ("repair", "reset", "reboot", "rollback", "restart", "rebuild", "drain", "release",
               "limit_concurrency", "reject_oversized")

    def apply_action(self, entity: str, action: str, t: float) -> list[str]:
        """Close the loop: the world's side of a decision, at simulated time ``t``.

        ``repair`` ends every hardware fault on a node (and clears its error state), ``reset`` (a GPU or
        node reset) clears pending remaps and Xid state and ends the faults a reset fixes, ``reboot`` (the
        whole node) does what a reset of all its GPUs does and ends the faults a reboot fixes, ``rollback``
        ends a bad driver rollout, ``restart`` resets a replica's counters, ``rebuild`` restarts a serving
        worker (counters reset, a fragmented heap is gone). ``drain`` takes a node or replica out of
        service (its GPUs idle, its ranks leave the job, its replicas get no traffic, so it raises no more
        OOMs) and ``release`` puts it back. ``limit_concurrency`` caps a replica's batch (an overload no
        longer piles up, no more overload OOMs); ``reject_oversized`` makes its admission reject requests
        too large for the model (no more oversized-request OOMs). Returns the kinds of the faults it
        ended. Raises ValueError for an unknown action or entity."""
        if action not in self.ACTIONS:
            raise ValueError(f"unknown action {action!r}: expected one of {', '.join(self.ACTIONS)}")
        f = self.fleet
        node = entity.split("/")[0]
        rep: int | None = None
        with contextlib.suppress(KeyError):
            rep = f.replica_by_name(entity).index
        if rep is None and node not in f.nodes:
            raise ValueError(f"no node or replica {entity!r} in this fleet")
        ended: list[str] = []
        for fault in self.faults:
            if not fault.active(t) or fault.stopped:
                continue
            if not (fault.covers(entity) or fault.covers(node)):
                continue
            fixes = fault.fixed_by()
            if action in fixes or (action == "reboot" and "reset" in fixes):
                fault.end = t
                if fault.started:
                    fault.stop(self, t)
                fault.stopped = True
                ended.append(fault.kind)
        if rep is None:
            n = f.node_index(node)
            if action in ("repair", "reset", "reboot"):
                gpus = f.gpus_of_node(n) if "/" not in entity else [n * f.gpus_per_node + int(entity.split("gpu")[-1])]
                self.xid_last[gpus] = 0
                self.recovery_action[gpus] = 0
                self.remap_pending[gpus] = 0
            elif action in ("drain", "release"):
                self.node_out[n] = action == "drain"
            return ended
        if action in ("restart", "rebuild"):
            self.reset_replica_counters(rep)
        elif action in ("drain", "release"):
            self.rep_out[rep] = action == "drain"
        elif action == "limit_concurrency":
            self.rep_limited[rep] = True
        elif action == "reject_oversized":
            self.rep_reject_oversized[rep] = True
        return ended

    # ---- exposition -----------------------------------------------------------------------------
    def _node_rows(self, n: int) -> np.ndarray:
        hit = self._node_rows_cache.get(n)
        if hit is not None and hit[0] == self._layout_version:
            return hit[1]
        rows = np.nonzero(self.row_node == n)[0]
        if self.xid_counts:
            dyn = np.nonzero(self._dyn_node == n)[0] + len(self.row_node)
            rows = np.concatenate([rows, dyn])
        self._node_rows_cache[n] = (self._layout_version, rows)
        return rows

    def render_node(self, node: str, t: float | None = None) -> str:
        """The node's exporter page at ``t`` in the classic text format 0.0.4 (``vllm:`` names kept).
        Raises ``LookupError`` if the node's exporter is down at that time."""
        if t is not None:
            self.advance_to(t)
        if self._values is None:
            self.step()
        n = self.fleet.node_index(node)
        assert self._values is not None
        rows = self._node_rows(n)
        if self._keep is not None:
            if not self._keep[rows].any():
                raise LookupError(f"{node}: exporter down")
            rows = rows[self._keep[rows]]
        metric = np.concatenate([self.row_metric, np.full(len(self.xid_counts), self.xid_metric, np.int32)])
        # group by family so that each family's samples are contiguous, as the format requires
        fam_names = [_family(m) for m in self.intern.metrics]
        order = sorted(range(len(rows)), key=lambda i: (fam_names[metric[rows[i]]], i))
        vals = self._values
        out: list[str] = []
        cur = None
        for i in order:
            r = int(rows[i])
            fam = fam_names[metric[r]]
            if fam != cur:
                cur = fam
                out.append(f"# HELP {fam} {HELP.get(fam, fam)}")
                out.append(f"# TYPE {fam} {METRIC_TYPES.get(fam, 'gauge')}")
            out.append(f"{self.row_prefix[r]} {_fmt_value(float(vals[r]))}")
        return "\n".join(out) + "\n"


def _family(metric: str) -> str:
    for suf in ("_bucket", "_sum", "_count"):
        if metric.endswith(suf) and metric[: -len(suf)] in (TTFT, ITL):
            return metric[: -len(suf)]
    return metric


def _fmt_value(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def simulate(scenario: Scenario) -> Simulation:
    return Simulation(scenario)

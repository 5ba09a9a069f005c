"""The simulator as it was before the value buffer, the plan and the stacked arithmetic (session 10): the
reference that tests/test_sim_fastpath.py holds the fast simulator to, bit for bit. Frozen; not used by
the package. Fault effects, the fleet and the scenario model are the live ones."""

# ruff: noqa
# mypy: ignore-errors

from __future__ import annotations
import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

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
METRIC_TYPES: dict[str, str] = {m: "gauge" for m in GPU_GAUGES + REPLICA_GAUGES + [RANK_COMPUTE, RANK_STEP,
                                                                                    NODE_INFO, REPLICA_INFO]}
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

_SQRT2 = math.sqrt(2.0)
# latency CDF lookup table: medians from 0.1 ms to 1000 s in steps of 0.5 % (log space)
_CDF_LO = math.log(1e-4)
_CDF_STEP = 0.005
_CDF_N = int((math.log(1e3) - _CDF_LO) / _CDF_STEP) + 1


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf and scipy is not a dependency."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _lognormal_cdf(median: np.ndarray, sigma: float, log_les: np.ndarray) -> np.ndarray:
    """P(X <= le) per row for lognormal latencies: shape (len(median), len(les))."""
    z = (log_les[None, :] - np.log(median)[:, None]) * (1.0 / (sigma * _SQRT2))
    return 0.5 * (1.0 + _erf(z))


def _lognormal_bucket_probs(median: np.ndarray, sigma: float, les: np.ndarray) -> np.ndarray:
    """P(bucket) per row for lognormal latencies: shape (len(median), len(les) + 1), last = above the top."""
    z = (np.log(les)[None, :] - np.log(median)[:, None]) / (sigma * _SQRT2)
    cdf = 0.5 * (1.0 + _erf(z))
    full = np.concatenate([np.zeros((len(median), 1)), cdf, np.ones((len(median), 1))], axis=1)
    return np.clip(np.diff(full, axis=1), 0.0, 1.0)


def _counts(rng: np.random.Generator, lam: np.ndarray) -> np.ndarray:
    """Poisson counts: exact for small means (the latency tail matters for SLOs), normal approximation
    for large ones, where Poisson sampling is the most expensive call of a step."""
    big = np.rint(lam + np.sqrt(lam) * rng.standard_normal(lam.shape))
    return np.where(lam >= 30.0, np.maximum(big, 0.0), rng.poisson(np.minimum(lam, 30.0)))


def _big_counts(rng: np.random.Generator, lam: np.ndarray) -> np.ndarray:
    """Poisson counts with large means (thousands of tokens): the normal approximation is exact enough."""
    return np.maximum(np.rint(lam + np.sqrt(lam) * rng.standard_normal(lam.shape)), 0.0)


def _sprinkle(rng: np.random.Generator, counter: np.ndarray, mean_total: float) -> None:
    """Rare independent increments over a whole fleet: draw how many, then where (cheaper than a
    Poisson draw per GPU when almost all are zero)."""
    k = int(rng.poisson(mean_total))
    if k:
        np.add.at(counter, rng.integers(0, counter.shape[-1], k), 1.0)


def _fmt_le(v: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(v)


@dataclass(slots=True)
class _Block:
    metric: str
    kind: str  # gpu | rank | replica | replica_bucket | node
    start: int
    stop: int
    key: str  # which per-step value array fills this block


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


def _render_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + "n").replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels.items()
    )
    return "{" + body + "}"


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
        self._build_layout()
        self._init_state()
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

    def _add_rows(self, metric: str, kind: str, entries: list[tuple[dict[str, str], int, int, int]],
                  key: str | None = None) -> None:
        """entries: (exposed labels, node, gpu or -1, replica or -1)."""
        mid = self.intern.metric(metric)
        start = len(self._row_series)
        for labels, n, g, r in entries:
            full = dict(labels)
            # Prometheus adds the target's instance; its `job` label would clash with the training job's,
            # so recordings carry only instance (scrape with honor_labels: true to keep exposed labels).
            full["instance"] = self._instance(n)
            self._row_series.append(self.intern.series(full))
            self._row_metric.append(mid)
            self._row_node.append(n)
            self._row_gpu.append(g)
            self._row_rep.append(r)
            self._row_prefix.append(metric + _render_labels(labels))
        self.blocks.append(_Block(metric, kind, start, len(self._row_series), key or metric))

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
        self._row_series: list[int] = []
        self._row_metric: list[int] = []
        self._row_node: list[int] = []
        self._row_gpu: list[int] = []
        self._row_rep: list[int] = []
        self._row_prefix: list[str] = []
        G = f.n_gpus
        gpu_entries = [(self._gpu_labels(g), g // f.gpus_per_node, g, -1) for g in range(G)]
        default_only = f.spec.dcgm_fields == "default"
        for m in GPU_GAUGES + GPU_COUNTERS:
            if default_only and m not in DEFAULT_DCGM_FIELDS:
                continue
            self._add_rows(m, "gpu", gpu_entries)
        rank_entries = []
        for rk in range(len(f.rank_gpu)):
            g = int(f.rank_gpu[rk])
            job = f.jobs[int(f.rank_job[rk])]
            rank_entries.append(({
                "job": job.name, "rank": str(int(f.rank_number[rk])), "node": f.nodes[g // f.gpus_per_node],
                "gpu": str(g % f.gpus_per_node), "peer_group": f"stage{int(f.rank_stage[rk])}",
            }, g // f.gpus_per_node, g, -1))
        for m in (RANK_COMPUTE, RANK_STEP):
            self._add_rows(m, "rank", rank_entries)
        R = len(f.replicas)
        vl = [(self._replica_labels(r, True), f.replicas[r].node, -1, r) for r in range(R)]
        fl = [(self._replica_labels(r, False), f.replicas[r].node, -1, r) for r in range(R)]
        for m in REPLICA_GAUGES + REPLICA_COUNTERS:
            self._add_rows(m, "replica", fl if m.startswith("fleethealth_") else vl)
        for reason in ("stop", "length"):
            self._add_rows(SUCCESS, "replica", [(d | {"finished_reason": reason}, n, g, r) for d, n, g, r in vl],
                           key=f"{SUCCESS}|{reason}")
        self._les = {TTFT: np.asarray(TTFT_BUCKETS), ITL: np.asarray(ITL_BUCKETS)}
        self._log_les = {k: np.log(v) for k, v in self._les.items()}
        self._cdf_tab: tuple[np.ndarray, np.ndarray] | None = None
        for h in (TTFT, ITL):
            les = [_fmt_le(x) for x in self._les[h]] + ["+Inf"]
            self._add_rows(h + "_bucket", "replica_bucket",
                           [(d | {"le": le}, n, g, r) for d, n, g, r in vl for le in les])
            self._add_rows(h + "_sum", "replica", vl)
            self._add_rows(h + "_count", "replica", vl)
        self._add_rows(NODE_INFO, "node", [(f.node_labels(n), n, -1, -1) for n in range(f.n_nodes)])
        self._add_rows(REPLICA_INFO, "replica", [({
            "replica": rep.name, "node": f.nodes[rep.node], "build": rep.build, "model": rep.model,
        }, rep.node, -1, rep.index) for rep in f.replicas])
        self.up_metric = self.intern.metric("up")
        self.up_series = np.array(
            [self.intern.series({"instance": self._instance(n), "job": "fleethealth-sim"}) for n in range(f.n_nodes)],
            np.int32)
        self.xid_metric = self.intern.metric(XID_COUNT)
        self.intern.frozen = True
        self.n_static = len(self._row_series)
        self.row_series = np.asarray(self._row_series, np.int32)
        self.row_metric = np.asarray(self._row_metric, np.int32)
        self.row_node = np.asarray(self._row_node, np.int64)
        self.row_gpu = np.asarray(self._row_gpu, np.int64)
        self.row_rep = np.asarray(self._row_rep, np.int64)
        self.row_prefix = list(self._row_prefix)
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

    def add_event(self, kind: str, entity: str, node: int, t: float, ctx: dict, truth: str) -> None:
        self._events.append(SimEvent(t, kind, entity, self.fleet.nodes[node], ctx, truth))

    def relabel_driver(self, n: int, version: str) -> None:
        """A driver change (an upgrade, or a rollback): the node's DCGM series carry the new version label
        (new series); the node rebooted onto it, so volatile counters restart from zero and the last Xid
        and any pending recovery action are gone with the old driver's state."""
        f = self.fleet
        f.node_driver[n] = version
        self.row_series = self.row_series.copy()
        gpus = f.gpus_of_node(n)
        for b in self.blocks:
            if b.kind == "gpu":
                for g in gpus:
                    labels = self._gpu_labels(int(g), version) | {"instance": self._instance(n)}
                    self.row_series[b.start + int(g)] = self.intern.series(labels)
            elif b.kind == "node":
                labels = f.node_labels(n) | {"instance": self._instance(n)}
                self.row_series[b.start + n] = self.intern.series(labels)
        prefix = list(self.row_prefix)
        for b in self.blocks:
            if b.kind == "gpu":
                for g in gpus:
                    prefix[b.start + int(g)] = b.metric + _render_labels(self._gpu_labels(int(g)))
            elif b.kind == "node":
                prefix[b.start + n] = b.metric + _render_labels(f.node_labels(n))
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
        """Advance one step and return its snapshot."""
        self.k += 1
        t = self.start + self.k * self.step_s
        self.t = t
        dt = self.step_s
        f = self.fleet
        rng = self.rng
        G, R = f.n_gpus, len(f.replicas)
        eff = self._effects(t)
        day = (t - self.start) / 86400.0
        # slow drift: AR(1) with a two-hour time constant, and a rack ambient with a daily swing
        n01 = rng.standard_normal((7, G))
        a = math.exp(-dt / 7200.0)
        self.temp_drift = a * self.temp_drift + math.sqrt(1 - a * a) * 0.8 * n01[6]
        b = math.exp(-dt / 10800.0)
        self.rack_amb = b * self.rack_amb + math.sqrt(1 - b * b) * 0.8 * rng.standard_normal(len(self.rack_amb))
        ambient = self.rack_amb[self.gpu_rack] + 1.0 * math.sin(2 * math.pi * (day - 0.6))

        # serving load per replica (diurnal), mapped onto its GPUs
        load = self.base_load.copy()
        any_out = bool(self.node_out.any())
        if any_out:
            load[self.node_out[self.gpu_node]] = 0.0  # drained: the workload went elsewhere
        rep_load = np.zeros(R)
        if R:
            rate = self.rep_rate * (1.0 + self.rep_diurnal * np.sin(2 * math.pi * (day + self.rep_phase - 0.35)))
            rep_load = np.minimum(np.maximum(rate / (self.rep_rate * 1.6) + (eff.load_add if eff else 0.0), 0.0), 2.0)
            if eff is not None:
                rate = rate * eff.rate_mul
            idle = self.rep_out | self.node_out[self.rep_node] if (any_out or self.rep_out.any()) else None
            if idle is not None and idle.any():
                # out of service: the router sends nothing, the engine idles with its weights loaded
                rate = np.where(idle, 0.0, rate)
                rep_load = np.where(idle, 0.0, rep_load)
            load[self.serve_gpus] = np.minimum(1.0, 0.35 + 0.6 * rep_load[self.serve_rep])

        temp = 30.0 + 40.0 * load + self.temp_static + self.temp_drift + ambient + 0.4 * n01[0]
        # A loaded GPU's clock jitters uniformly inside a band under its power/boost limits: the peer spread
        # is what the seed describes (MAD-based sigma 14 MHz, so -3 % reads as z = 4.1) while a healthy GPU
        # never strays 1 % from the pack (no Gaussian tail, and no small peer group's tiny MAD, fakes an
        # outlier).
        clock = 1935.0 + 38.0 * (rng.random(G) - 0.5)
        power = 120.0 + 560.0 * load + self.power_static + 10.0 * n01[2]
        clock_reasons = np.zeros(G)
        fb_add: float | np.ndarray = 0.0
        if eff is not None:
            temp = temp + eff.temp_add
            clock = clock * eff.clock_mul
            power = power + eff.power_add
            clock_reasons = eff.clock_reasons.astype(np.float64)
            fb_add = eff.fb_add
        util = np.minimum(np.maximum(np.rint(100.0 * load + 1.5 * n01[3]), 0.0), 100.0)
        fb_used = np.minimum(FB_TOTAL_MIB - 300.0, np.rint(self.fb_base + 40.0 * n01[4] + fb_add))
        fb_free = FB_TOTAL_MIB - 300.0 - fb_used
        self.energy += np.rint(power * (dt * 1000.0))
        # rare healthy counter noise: a replay, a corrected bit, one CRC flit now and then
        _sprinkle(rng, self.pcie, 2e-6 * dt * G)
        _sprinkle(rng, self.sbe, 1e-6 * dt * G)
        _sprinkle(rng, self.nvl[0], 1e-6 * dt * G)
        if eff is not None:
            if eff.pcie_rate.any():
                self.pcie += _counts(rng, eff.pcie_rate * dt)
            if eff.sbe_rate.any():
                self.sbe += _counts(rng, eff.sbe_rate * dt)
            self.therm_viol += np.rint(eff.thermal_viol_rate * dt)
            self.power_viol += np.rint(eff.power_viol_rate * dt)
            if eff.nvlink_rate.any():
                nr = eff.nvlink_rate * dt
                self.nvl += _counts(rng, np.stack([nr, nr * 0.1, nr * 0.05, nr * 0.002]))

        vals: dict[str, np.ndarray] = {
            "DCGM_FI_DEV_GPU_TEMP": np.rint(temp),
            "DCGM_FI_DEV_MEMORY_TEMP": np.rint(temp + 6.0 + 0.5 * n01[5]),
            "DCGM_FI_DEV_SM_CLOCK": np.rint(clock),
            "DCGM_FI_DEV_MEM_CLOCK": self.mem_clock,
            "DCGM_FI_DEV_POWER_USAGE": power,
            "DCGM_FI_DEV_GPU_UTIL": util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": np.rint(util * 0.4),
            "DCGM_FI_DEV_FB_USED": fb_used,
            "DCGM_FI_DEV_FB_FREE": fb_free,
            "DCGM_FI_DEV_XID_ERRORS": self.xid_last,
            "DCGM_FI_DEV_ROW_REMAP_PENDING": self.remap_pending,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": self.remap_failure,
            "DCGM_FI_DEV_GPU_RECOVERY_ACTION": self.recovery_action,
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": clock_reasons,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": self.pcie,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": self.sbe,
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": self.dbe,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": self.corr_rows,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": self.uncorr_rows,
            "DCGM_FI_DEV_THERMAL_VIOLATION": self.therm_viol,
            "DCGM_FI_DEV_POWER_VIOLATION": self.power_viol,
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": self.nvl[0],
            "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": self.nvl[1],
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": self.nvl[2],
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": self.nvl[3],
        }
        self._step_training(t, eff, vals)
        self._step_serving(dt, eff, vals, rate if R else np.zeros(0), rep_load)
        vals[NODE_INFO] = self.ones_node
        vals[REPLICA_INFO] = self.ones_rep

        metric, series, row_node, row_gpu, row_rep, n_up = self._full_ids()
        node_up = self._all_up
        errors: list[InputIssue] = []
        keep: np.ndarray | None = None
        if eff is not None and (eff.node_down.any() or eff.gpu_gone.any() or eff.replica_gone.any()):
            node_up = ~eff.node_down
            gpu_ok = np.append(~eff.gpu_gone, True)
            rep_ok = np.append(~eff.replica_gone, True)
            keep = node_up[row_node] & gpu_ok[row_gpu] & rep_ok[row_rep]
            keep[-n_up:] = True  # `up` itself is always there: 0 for a target that failed its scrape
            for n, why in sorted(eff.node_reason.items()):
                errors.append(InputIssue(f"target {self._instance(n)}", 0, why))
        if any_out:
            # the ranks of a drained node are gone: the job runs on without them
            gone = np.zeros(len(row_node), bool)
            gone[: self.n_static] = self.row_is_rank & self.node_out[self.row_node]
            keep = ~gone if keep is None else keep & ~gone
        parts = [vals[b.key] for b in self.blocks]
        if self.xid_counts:
            parts.append(np.asarray(self.xid_counts))
        parts.append(node_up.astype(np.float64))
        values = np.concatenate(parts)
        self._keep = keep
        self._values = values
        if keep is not None:
            metric, series, values = metric[keep], series[keep], values[keep]
        ts = np.empty(len(values))
        ts.fill(t)
        snap = Snapshot(
            at=t, metrics=self.intern.metrics, labelsets=self.intern.labelsets, metric_ids=metric,
            series_ids=series, values=values, ts=ts, source_errors=errors,
        )
        self.last = snap
        return snap

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
        self._full_cache = (self._layout_version, out)
        return out

    def _step_training(self, t: float, eff: Effects | None, vals: dict[str, np.ndarray]) -> None:
        f = self.fleet
        nr = len(f.rank_gpu)
        if nr == 0:
            vals[RANK_COMPUTE] = np.zeros(0)
            vals[RANK_STEP] = np.zeros(0)
            return
        rng = self.rng
        J = len(f.jobs)
        job_sigma = self.job_sigma + eff.seq_sigma if eff is not None else self.job_sigma
        common = np.exp(0.01 * rng.standard_normal(J))  # the whole job is a little slower on some steps
        rj = f.rank_job
        node_of_rank = self.node_of_rank
        # Healthy ranks of one stage stay within 1.1 % of each other's typical time, uniformly (seed: MAD
        # 0.01 s at 1.82 s, so 1.86 s reads as z ~ 2.7); anything beyond that comes from a fault or from
        # the workload (unequal stages, sequence lengths).
        dev = self.rank_static + 2.0 * self.rank_noise * (rng.random(nr) - 0.5)
        comp = self.rank_base * common[rj] * (1.0 + dev)
        if job_sigma.any():
            # sequence-length imbalance: the ranks of one node share a micro-batch, so they are slow together
            z = rng.standard_normal(f.n_nodes)
            sig = job_sigma[rj]
            comp = comp * np.exp(sig * z[node_of_rank] - 0.5 * sig * sig)
        if eff is not None:
            comp = comp * eff.compute_mul[f.rank_gpu] * eff.rank_mul
        out = self.node_out[node_of_rank] if self.node_out.any() else None
        # ranks are contiguous per job; a drained node's ranks no longer hold the step up
        step_max = np.maximum.reduceat(comp if out is None else np.where(out, 0.0, comp), self.job_rank_start)
        step = step_max + self.job_comm * (1.0 + 0.02 * rng.standard_normal(J))
        if eff is not None and eff.job_hang.any():
            hung = eff.job_hang
            newly = hung & np.isnan(self.job_hang_since)
            self.job_hang_since[newly] = t
            # a hung collective: no step completes, compute times freeze, the step in flight grows
            hang_ranks = hung[rj]
            comp = np.where(hang_ranks, self.rank_compute, comp)
            # the hung node's own ranks never reach the collective: their compute in flight grows
            stuck = eff.get("rank_stuck")
            if stuck is not None:
                comp = np.where(stuck & hang_ranks, self.rank_base + (t - np.nan_to_num(self.job_hang_since[rj])), comp)
            step = np.where(hung, t - np.nan_to_num(self.job_hang_since) + self.step_s, step)
        self.job_hang_since[~(eff.job_hang if eff is not None else np.zeros(J, bool))] = np.nan
        self.rank_compute = comp
        vals[RANK_COMPUTE] = comp
        vals[RANK_STEP] = step[rj]

    def _step_serving(self, dt: float, eff: Effects | None, vals: dict[str, np.ndarray], rate: np.ndarray,
                      load: np.ndarray) -> None:
        R = len(self.fleet.replicas)
        rng = self.rng
        if R == 0:
            for m in REPLICA_GAUGES + REPLICA_COUNTERS:
                vals[m] = np.zeros(0)
            vals[SUCCESS + "|stop"] = np.zeros(0)
            vals[SUCCESS + "|length"] = np.zeros(0)
            for h in (TTFT, ITL):
                vals[h + "_bucket"] = np.zeros(0)
                vals[h + "_sum"] = np.zeros(0)
                vals[h + "_count"] = np.zeros(0)
            return
        ttft_med = self.rep_ttft * (1.0 + 0.8 * load * load)
        itl_med = self.rep_itl * (1.0 + 0.5 * load)
        err = self.rep_err
        if eff is not None:
            ttft_med = ttft_med * eff.ttft_mul
            itl_med = itl_med * eff.itl_mul
            err = np.minimum(err + eff.err_add, 1.0)
        # One call per distribution per step: with 32 replicas the cost is per call, not per number.
        z = rng.standard_normal((4, R))
        u = rng.random((2, R))
        lam_req = rate * dt
        e2e = ttft_med + self.rep_tokens * itl_med
        lam_run = np.minimum(rate * e2e, 256.0)
        small = rng.poisson(np.concatenate([
            np.minimum(lam_req, 30.0), lam_req * err, np.maximum(0.0, load - 0.75) * 40.0 + 0.1,
            np.minimum(lam_run, 30.0),
        ])).astype(np.float64)
        # Poisson counts: exact for small means, normal approximation for large ones
        n_req = np.where(lam_req >= 30.0, np.maximum(np.rint(lam_req + np.sqrt(lam_req) * z[0]), 0.0), small[:R])
        running = np.where(lam_run >= 30.0, np.maximum(np.rint(lam_run + np.sqrt(lam_run) * z[1]), 0.0),
                           small[3 * R:])
        waiting = small[2 * R:3 * R]
        errs = np.minimum(n_req, small[R:2 * R])
        lam_tok = n_req * self.rep_tokens
        n_tok = np.maximum(np.rint(lam_tok + np.sqrt(lam_tok) * z[2]), 0.0)
        # Requests and tokens are spread over the buckets by systematic sampling (one uniform per replica):
        # cumulative counts floor(N * CDF(le) + u) are monotone, have exactly the right means, and a rare
        # slow request still lands in the tail with the right probability; a multinomial per replica per
        # step would cost ten times more.
        cdf = self._latency_cdf(ttft_med, itl_med)
        nb = len(TTFT_BUCKETS)
        self.ttft_b[:, :-1] += np.floor(n_req[:, None] * cdf[:, :nb] + u[0][:, None])
        self.ttft_b[:, -1] += n_req
        self.itl_b[:, :-1] += np.floor(n_tok[:, None] * cdf[:, nb:] + u[1][:, None])
        self.itl_b[:, -1] += n_tok
        self.ttft_sum += n_req * ttft_med * math.exp(TTFT_SIGMA * TTFT_SIGMA / 2)
        self.itl_sum += n_tok * itl_med * math.exp(ITL_SIGMA * ITL_SIGMA / 2)
        ok = n_req - errs
        stop = np.floor(ok * 0.85 + u[0])
        self.success[0] += stop
        self.success[1] += ok - stop
        self.replica_requests += n_req
        self.replica_errors += errs
        self.gen_tokens += n_tok + n_req
        self.prompt_tokens += np.rint(n_req * self.rep_prompt)
        kv = np.minimum(np.maximum(0.15 + 0.5 * load + 0.02 * z[3], 0.0), 1.0)
        self.last_kv = kv
        if kv.max() > 0.9:
            self.preempt += rng.poisson(np.maximum(0.0, kv - 0.9) * 5.0 * dt)
        vals["vllm:num_requests_running"] = running
        vals["vllm:num_requests_waiting"] = waiting
        vals["vllm:kv_cache_usage_perc"] = kv
        vals["vllm:num_preemptions_total"] = self.preempt
        vals["vllm:generation_tokens_total"] = self.gen_tokens
        vals["vllm:prompt_tokens_total"] = self.prompt_tokens
        vals["fleethealth_replica_requests_total"] = self.replica_requests
        vals["fleethealth_replica_errors_total"] = self.replica_errors
        vals[SUCCESS + "|stop"] = self.success[0]
        vals[SUCCESS + "|length"] = self.success[1]
        vals[TTFT + "_bucket"] = self.ttft_b.reshape(-1)
        vals[TTFT + "_sum"] = self.ttft_sum
        vals[TTFT + "_count"] = self.ttft_b[:, -1]
        vals[ITL + "_bucket"] = self.itl_b.reshape(-1)
        vals[ITL + "_sum"] = self.itl_sum
        vals[ITL + "_count"] = self.itl_b[:, -1]

    def _latency_cdf(self, ttft_med: np.ndarray, itl_med: np.ndarray) -> np.ndarray:
        """P(latency <= le) for both histograms at once: (R, TTFT buckets + ITL buckets).

        Looked up in a table over log(median) at 0.5 % resolution, built once: the erf per bucket per
        replica per step was the most expensive line of the serving model."""
        if self._cdf_tab is None:
            grid = _CDF_LO + _CDF_STEP * np.arange(_CDF_N)
            zt = (self._log_les[TTFT][None, :] - grid[:, None]) * (1.0 / (TTFT_SIGMA * _SQRT2))
            zi = (self._log_les[ITL][None, :] - grid[:, None]) * (1.0 / (ITL_SIGMA * _SQRT2))
            self._cdf_tab = (0.5 * (1.0 + _erf(zt)), 0.5 * (1.0 + _erf(zi)))
        it = np.minimum(np.maximum(np.rint((np.log(ttft_med) - _CDF_LO) * (1 / _CDF_STEP)), 0), _CDF_N - 1)
        ii = np.minimum(np.maximum(np.rint((np.log(itl_med) - _CDF_LO) * (1 / _CDF_STEP)), 0), _CDF_N - 1)
        return np.concatenate([self._cdf_tab[0][it.astype(np.intp)], self._cdf_tab[1][ii.astype(np.intp)]], axis=1)

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
        return [e for e in self._events if lo < e.ts <= t]

    @property
    def all_events(self) -> list[SimEvent]:
        return list(self._events)

    def active_test(self, node: str, t: float) -> bool:
        """A DCGM diag / NCCL check on ``node`` at ``t``: passes unless a real fault is still present."""
        n = self.fleet.node_index(node)
        return all(not (fault.active(t) and n in fault.faulty_nodes()) for fault in self.faults)

    def inject(self, spec: FaultSpec | dict, at: float | None = None) -> Fault:
        """Add a fault while running (the exporter's control endpoint uses this). ``onset`` in the spec is
        relative to ``at`` (default: now)."""
        fs = spec if isinstance(spec, FaultSpec) else FaultSpec.model_validate(spec)
        base = (self.t if at is None else at) - self.start
        fs = fs.model_copy(update={"onset": base + fs.onset, "end": None if fs.end is None else base + fs.end})
        fault = make_fault(fs, len(self.faults), self.fleet, self.start, self.scenario.seed)
        self.faults.append(fault)
        return fault

    ACTIONS = ("repair", "reset", "rollback", "restart", "rebuild", "drain", "release", "limit_concurrency",
               "reject_oversized")

    def apply_action(self, entity: str, action: str, t: float) -> list[str]:
        """Close the loop: the world's side of a decision, at simulated time ``t``.

        ``repair`` ends every hardware fault on a node (and clears its error state), ``reset`` (a GPU or
        node reset) clears pending remaps and Xid state and ends the faults a reset fixes, ``rollback``
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
            if action in fault.fixed_by():
                fault.end = t
                if fault.started:
                    fault.stop(self, t)
                fault.stopped = True
                ended.append(fault.kind)
        if rep is None:
            n = f.node_index(node)
            if action in ("repair", "reset"):
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

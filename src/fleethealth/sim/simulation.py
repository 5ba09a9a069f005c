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
(``quiet_regime.draw_ahead``); each step then copies its rows into the buffer and adds its counter
increments. The telemetry is the same, bit for bit, as the step-by-step path's (``plain_step.step_plain``).

The same state renders as per-node exposition text (``render_node``) for the HTTP exporter.

This module holds the ``Simulation`` object: its state (built once: the layout, the per-entity arrays, the
value buffer they are bound into), the callbacks faults use, and the public API
(stepping, events, ground truth, injecting faults, the world's side of actions). The rest of the step
lives in modules of its own that work on this object's state:

- ``metric_catalog``: metric names, kinds, help texts, histogram buckets;
- ``numerics``: the step's shared arithmetic (0-d constants, erf, Poisson counts);
- ``load_plan``: what no random draw enters (load, latency medians, Poisson means), many steps at once;
- ``plain_step``: a step computed on its own: GPUs, the training jobs' ranks, the serving replicas;
- ``quiet_regime``: quiet steps drawn ahead in blocks, and the replay when the world leaves the regime;
- ``telemetry``: the row layout's types, each step's snapshot, a node's exporter page.
"""
from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from fleethealth.signals.snapshot import Snapshot
from fleethealth.sim import quiet_regime
from fleethealth.sim.faults import Effects, Fault, make_fault
from fleethealth.sim.fleet import Fleet, build_fleet, bus_id
from fleethealth.sim.job_end import JobEnds
from fleethealth.sim.load_plan import LoadPlan
from fleethealth.sim.metric_catalog import (
    DEFAULT_DCGM_FIELDS,
    FB_TOTAL_MIB,
    GPU_COUNTERS,
    GPU_GAUGES,
    ITL,
    ITL_BUCKETS,
    ITL_SIGMA,
    NODE_INFO,
    PCIE_LINK_DEFAULT,
    PCIE_LINK_GAUGES,
    RANK_COMPUTE,
    RANK_STEP,
    REPLICA_COUNTERS,
    REPLICA_GAUGES,
    REPLICA_INFO,
    SUCCESS,
    TTFT,
    TTFT_BUCKETS,
    TTFT_SIGMA,
    XID_COUNT,
)
from fleethealth.sim.metric_catalog import le_strings as _le_strings  # tests import it from here
from fleethealth.sim.numerics import consecutive_runs, lognormal_bucket_probs
from fleethealth.sim.plain_step import step_plain
from fleethealth.sim.quiet_regime import DRAW_FIRST, DrawnSteps, Scratch
from fleethealth.sim.scenario import FaultSpec, Scenario
from fleethealth.sim.telemetry import Block, Entities, Interner, emit, render_node
from fleethealth.sim.telemetry import render_labels as _render_labels  # tests import it from here
from fleethealth.sim.truth import GroundTruth, SimEvent

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
                  rep: list[int] | None = None) -> Entities:
        n = len(labels)
        return Entities(labels, np.asarray(node, np.int64).reshape(n),
                         np.full(n, -1, np.int64) if gpu is None else np.asarray(gpu, np.int64).reshape(n),
                         np.full(n, -1, np.int64) if rep is None else np.asarray(rep, np.int64).reshape(n))

    def _add_rows(self, metric: str, kind: str, ents: Entities, key: str | None = None, emit: bool = True) -> None:
        """One block of rows, one per entity. ``emit=False``: the value is still computed (its state is
        kept, its random draws made) but not exported; the block then lives past the emitted rows."""
        if not emit:
            self._shadow.append(Block(metric, kind, 0, len(ents.labels), key or metric))
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
        self.blocks.append(Block(metric, kind, start, self._n_rows, key or metric))

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
        self.intern = Interner()
        self.blocks: list[Block] = []
        self._shadow: list[Block] = []
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
        p1 = lognormal_bucket_probs(self.rep_ttft * 1.3, TTFT_SIGMA, self._les[TTFT]) if R else np.zeros((0, nb1))
        p2 = lognormal_bucket_probs(self.rep_itl * 1.3, ITL_SIGMA, self._les[ITL]) if R else np.zeros((0, nb2))
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
        self.job_ends = JobEnds(f, self.start)  # jobs with an ``ends_at``: their nodes fall idle then
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
        self._plan_cache: LoadPlan | None = None
        self._inc = np.zeros((len(_REP_CTR), R))  # scratch: per-step increments of the replica counters
        # the sprinkles' mean counts per step, written as the step writes them (same floats)
        dt = self.step_s
        self._sprinkle_means = (2e-6 * dt * G, 1e-6 * dt * G, 1e-6 * dt * G)
        # numpy draws a Poisson count with a mean under 10 by multiplying uniforms until the product is
        # at most exp(-mean) (libm's exp, as math.exp): the count is 0 exactly when the first uniform is
        self._sprinkle_zero = tuple(math.exp(-m) for m in self._sprinkle_means)
        self._drawn: DrawnSteps | None = None
        self._ahead = DRAW_FIRST
        self._gpu_rows: np.ndarray | None = None  # a drawn step's GPU gauges, for telemetry.emit
        # runs of consecutive GPUs (serving ones; of one rack) and each job's ranks, for sliced arithmetic
        self._serve_runs = consecutive_runs(self.serve_gpus, np.arange(len(self.serve_gpus)), 16)
        self._rack_runs = consecutive_runs(np.arange(G), self.gpu_rack, 64, same=True)
        self._racks_uniform = self._rack_runs is not None and self._rack_runs == [
            (i * (G // len(self._rack_runs)), (i + 1) * (G // len(self._rack_runs)), i)
            for i in range(len(self._rack_runs))] and len(self._rack_runs) == len(self.rack_amb)
        bounds = [*self.job_rank_start.tolist(), len(f.rank_gpu)]
        self._job_spans = list(zip(bounds[:-1], bounds[1:], strict=True))
        self._scratch = Scratch()
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

        # what a drawn-ahead step writes (quiet_regime.step_drawn): the first nine GPU gauges (the memory
        # clock among them is constant state, written back as it is), the rank gauges, the replica gauges,
        # and the replica counters with the histograms (sums and counts included) as one run
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
        self._scratch = Scratch()  # a drawn block in progress comes along as copies of its rows
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
        up to ``DRAW_AHEAD`` steps are drawn at once, in the same order as one by one, and what follows
        from the draws and the plan is computed for all of them together (``quiet_regime.draw_ahead``);
        each step then copies its rows into the buffer and adds its increments (``quiet_regime.step_drawn``).
        A step outside the regime first puts the generator back where the last consumed step left it
        (``quiet_regime.undraw``) and is computed on its own (``plain_step.step_plain``)."""
        self.k += 1
        t = self.start + self.k * self.step_s
        self.t = t
        eff = self._effects(t)
        self.job_ends.advance(t, self.node_out)
        any_out = bool(np.count_nonzero(self.node_out))
        if eff is None and not any_out and not (self._R and np.count_nonzero(self.rep_out)) and quiet_regime.DRAW_AHEAD:
            quiet_regime.step_drawn(self)
        else:
            if self._drawn is not None:
                quiet_regime.undraw(self)
            step_plain(self, t, eff, any_out)
        return emit(self, t, eff, any_out)

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
                self.node_out[n] = action == "drain" or self.job_ends.keeps_out(n)
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
    def render_node(self, node: str, t: float | None = None) -> str:
        """The node's exporter page at ``t`` in the classic text format 0.0.4 (``vllm:`` names kept).
        Raises ``LookupError`` if the node's exporter is down at that time."""
        return render_node(self, node, t)



def simulate(scenario: Scenario) -> Simulation:
    return Simulation(scenario)

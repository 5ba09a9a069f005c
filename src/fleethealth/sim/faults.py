"""The fault library: each fault knows its targets, its ground truth, and how it bends the fleet's
signals while active.

Faults act in two ways. Continuous effects are written every step into ``Effects`` (arrays over GPUs,
replicas, jobs and nodes, neutral by default), so the simulation stays vectorised however many faults run.
One-shot changes (an Xid, a DBE count, a pending remap, a driver relabel, a counter reset) call back into
the simulation. Each fault draws from its own random stream (seeded by scenario seed and fault index), so
adding a fault never changes the background noise of the rest of the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.sim.fleet import DOMAIN_PREFIX, Fleet
from fleethealth.sim.scenario import FaultSpec
from fleethealth.sim.truth import GroundTruth

if TYPE_CHECKING:
    from fleethealth.sim.simulation import Simulation

# DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40


# Effects' fields: (what they are indexed by, neutral value, dtype)
_EFFECT_FIELDS: dict[str, tuple[str, float, type]] = {
    "temp_add": ("gpu", 0.0, np.float64),
    "clock_mul": ("gpu", 1.0, np.float64),
    "compute_mul": ("gpu", 1.0, np.float64),
    "power_add": ("gpu", 0.0, np.float64),
    "thermal_viol_rate": ("gpu", 0.0, np.float64),  # microseconds per second
    "power_viol_rate": ("gpu", 0.0, np.float64),
    "pcie_rate": ("gpu", 0.0, np.float64),  # replays per second
    "nvlink_rate": ("gpu", 0.0, np.float64),  # CRC flit errors per second (others follow)
    "sbe_rate": ("gpu", 0.0, np.float64),
    "fb_add": ("gpu", 0.0, np.float64),  # MiB
    "clock_reasons": ("gpu", 0, np.int64),
    "gpu_gone": ("gpu", False, np.bool_),
    "ttft_mul": ("rep", 1.0, np.float64),
    "itl_mul": ("rep", 1.0, np.float64),
    "err_add": ("rep", 0.0, np.float64),
    "rate_mul": ("rep", 1.0, np.float64),
    "load_add": ("rep", 0.0, np.float64),
    "replica_gone": ("rep", False, np.bool_),
    "rank_mul": ("rank", 1.0, np.float64),
    "job_hang": ("job", False, np.bool_),
    "rank_stuck": ("rank", False, np.bool_),  # in a hung job: never reaches the collective
    "seq_sigma": ("job", 0.0, np.float64),
    "node_down": ("node", False, np.bool_),
}


class Effects:
    """Per-step modifiers, neutral unless a fault writes them.

    A field's array is made (neutral) when a fault first touches it; ``get`` tells the simulator which
    were, so that a step with a fault on one GPU does not build and apply two dozen fleet-wide neutral
    arrays (adding zero or multiplying by one would change no value)."""

    temp_add: np.ndarray
    clock_mul: np.ndarray
    compute_mul: np.ndarray
    power_add: np.ndarray
    thermal_viol_rate: np.ndarray
    power_viol_rate: np.ndarray
    pcie_rate: np.ndarray
    nvlink_rate: np.ndarray
    sbe_rate: np.ndarray
    fb_add: np.ndarray
    clock_reasons: np.ndarray
    gpu_gone: np.ndarray
    ttft_mul: np.ndarray
    itl_mul: np.ndarray
    err_add: np.ndarray
    rate_mul: np.ndarray
    load_add: np.ndarray
    replica_gone: np.ndarray
    rank_mul: np.ndarray
    job_hang: np.ndarray
    rank_stuck: np.ndarray
    seq_sigma: np.ndarray
    node_down: np.ndarray

    def __init__(self, n_gpu: int, n_rep: int, n_job: int, n_node: int, n_rank: int) -> None:
        self._sizes = {"gpu": n_gpu, "rep": n_rep, "job": n_job, "node": n_node, "rank": n_rank}
        self.node_reason: dict[int, str] = {}

    def __getattr__(self, name: str) -> np.ndarray:
        # only reached for a field not made yet
        spec = _EFFECT_FIELDS.get(name)
        if spec is None or name.startswith("_"):
            raise AttributeError(name)
        of, neutral, dtype = spec
        arr: np.ndarray = np.full(self._sizes[of], neutral, dtype)
        self.__dict__[name] = arr
        return arr

    def get(self, name: str) -> np.ndarray | None:
        """The field if a fault touched it this step, else None (neutral everywhere)."""
        assert name in _EFFECT_FIELDS, name
        return self.__dict__.get(name)

    def neutral_for_serving(self) -> bool:
        """No effect on load, request rates, latencies or errors (the simulator's plan of those holds)."""
        for name, neutral in (("load_add", 0.0), ("err_add", 0.0), ("rate_mul", 1.0), ("ttft_mul", 1.0),
                              ("itl_mul", 1.0)):
            arr = self.get(name)
            # count_nonzero: several times cheaper than .any() on small arrays
            if arr is not None and np.count_nonzero(arr != neutral):
                return False
        return True


@dataclass
class Targets:
    nodes: list[int]
    gpus: list[int]
    replicas: list[int]
    jobs: list[int]
    label: str


def resolve_targets(fleet: Fleet, targets: list[str], gpu_default: int | None) -> Targets:
    """Turn target strings into ids; raises ValueError with a readable message."""
    nodes: list[int] = []
    gpus: list[int] = []
    reps: list[int] = []
    jobs: list[int] = []
    gpn = fleet.gpus_per_node
    for t in targets:
        kind, _, name = t.partition(":") if ":" in t else ("", "", t)
        try:
            if kind == "pool":
                ns = fleet.pool_nodes(name)
                if not ns:
                    raise KeyError(name)
                nodes += ns
            elif kind == "rack" or kind in DOMAIN_PREFIX:
                ns = fleet.domain_nodes(kind, name)
                if not ns:
                    raise KeyError(name)
                nodes += ns
            elif kind == "job":
                j = fleet.job_by_name(name)
                jobs.append(j.index)
                nodes += j.nodes.tolist()
            elif kind == "replica":
                r = fleet.replica_by_name(name)
                reps.append(r.index)
                nodes.append(r.node)
                gpus += r.gpus.tolist()
            elif kind == "build":
                rs = [r for r in fleet.replicas if r.build == name]
                if not rs:
                    raise KeyError(name)
                for r in rs:
                    reps.append(r.index)
                    nodes.append(r.node)
            elif kind == "":
                node, _, g = name.partition("/gpu")
                n = fleet.node_index(node)
                nodes.append(n)
                if g:
                    gi = int(g)
                    if not 0 <= gi < gpn:
                        raise KeyError(name)
                    gpus.append(n * gpn + gi)
                elif gpu_default is not None:
                    gpus.append(n * gpn + gpu_default)
                else:
                    gpus += list(range(n * gpn, (n + 1) * gpn))
            else:
                raise ValueError(f"unknown target kind {kind!r} in {t!r} (use node, node/gpuN, pool:, rack:, "
                                 "nvlink_domain:, switch:, power_zone:, cooling_zone:, job:, replica:, build:)")
        except (KeyError, ValueError) as e:
            if isinstance(e, ValueError) and "unknown target kind" in str(e):
                raise
            raise ValueError(f"target {t!r} matches nothing in this fleet") from None
    if not gpus and not reps:
        for n in nodes:
            gpus += list(range(n * gpn, (n + 1) * gpn))
    return Targets(sorted(set(nodes)), sorted(set(gpus)), sorted(set(reps)), sorted(set(jobs)), ", ".join(targets))


class Fault:
    """Base: active between onset and end (absolute sim times); ``hardware`` faults fail active tests."""

    kind = "fault"
    gpu_default: int | None = None
    hardware = True
    expected_action = "quarantine"

    def __init__(self, spec: FaultSpec, index: int, fleet: Fleet, start: float, seed: int) -> None:
        self.spec = spec
        self.index = index
        self.fleet = fleet
        self.onset = start + spec.onset
        self.end: float | None = None if spec.end is None else start + spec.end
        self.m = spec.magnitude
        self.p: dict[str, Any] = dict(spec.params)
        self.rng = np.random.default_rng([seed, 7919, index])
        gd = self.p.pop("gpu", self.gpu_default)
        self.t = resolve_targets(fleet, spec.targets, gd)
        self.started = False
        self.stopped = False
        self.setup()

    def setup(self) -> None:
        pass

    def param(self, name: str, default: Any) -> Any:
        return self.p.get(name, default)

    def active(self, t: float) -> bool:
        return self.onset <= t and (self.end is None or t < self.end)

    def start(self, sim: Simulation, t: float) -> None:
        """One-shot changes at onset."""

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        """Continuous effects while active."""

    def stop(self, sim: Simulation, t: float) -> None:
        """Undo lasting state when the fault ends (repair, reset, end of an outage)."""

    # ---- ground truth -------------------------------------------------------------------------
    def gt(self, entity: str, kind: str, faulty: bool, action: str, detail: str = "",
           group: str | None = None) -> GroundTruth:
        return GroundTruth(entity, kind, self.kind, self.onset, self.end, faulty, action, detail, group)  # type: ignore[arg-type]

    def truth(self) -> list[GroundTruth]:
        f = self.fleet
        out = [self.gt(f.gpu_entity(g), "gpu", self.hardware, self.expected_action) for g in self.gpu_level()]
        out += [self.gt(f.nodes[n], "node", self.hardware, self.expected_action) for n in self.t.nodes]
        return out

    def gpu_level(self) -> list[int]:
        """GPUs that get their own truth row (only for faults of single GPUs)."""
        return self.t.gpus if self.gpu_default is not None or self._explicit_gpu() else []

    def _explicit_gpu(self) -> bool:
        return any("/gpu" in s for s in self.spec.targets)

    def faulty_nodes(self) -> set[int]:
        return set(self.t.nodes) if self.hardware else set()

    def caught_by_test(self, t: float) -> bool:
        """Whether an active test (DCGM diag, NCCL) that reports at ``t`` sees this fault: a steady fault
        always; an intermittent one only while it shows (faults_more.Intermittent)."""
        return True

    def fixed_by(self) -> frozenset[str]:
        """The world's actions (``Simulation.apply_action``) that end this fault: a repair ends hardware
        faults; the rest say what fixes them. A scenario can say it per fault (``params: {fixed_by: [reset]}``,
        ``[reboot]``), e.g. a fault a GPU reset clears, or one that survives a reset but not a reboot."""
        declared = self._declared_fixes()
        if declared is not None:
            return declared
        return frozenset({"repair"}) if self.hardware else frozenset()

    def _declared_fixes(self) -> frozenset[str] | None:
        d = self.p.get("fixed_by")
        if d is None:
            return None
        return frozenset([str(d)] if isinstance(d, str) else [str(x) for x in d]) | {"repair"}

    def covers(self, entity: str) -> bool:
        f = self.fleet
        names = {f.nodes[n] for n in self.t.nodes} | {f.gpu_entity(g) for g in self.t.gpus}
        names |= {f.replicas[r].name for r in self.t.replicas}
        return entity in names


class ThermalDrift(Fault):
    """A clogged fan tray: temperature creeps up, the SM clock throttles, compute time grows (seed node-37:
    +4 C, -3 % clock, 1.82 -> 1.86 s at severity 1; 1.95 s about a day later)."""

    kind = "thermal_drift"

    def severity(self, t: float) -> float:
        ramp = float(self.param("ramp_s", 39600.0))
        return min(float(self.param("max_severity", 4.0)), self.m * max(0.0, t - self.onset) / ramp)

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        s = self.severity(t)
        g = self.t.gpus
        eff.temp_add[g] += 4.0 * s
        eff.clock_mul[g] *= 1.0 - 0.03 * s
        eff.compute_mul[g] *= 1.0 + 0.022 * s
        eff.power_add[g] -= 8.0 * s
        if s > 1.0:
            eff.thermal_viol_rate[g] += 20000.0 * (s - 1.0)
            eff.clock_reasons[g] |= SW_THERMAL


class OffBus(Fault):
    """Xid 79: the GPU falls off the bus; a scrape or two later its series vanish from the exporter."""

    kind = "xid79_off_bus"
    gpu_default = 3

    def start(self, sim: Simulation, t: float) -> None:
        for g in self.t.gpus:
            sim.emit_xid(g, 79, t, "GPU has fallen off the bus.")
            sim.recovery_action[g] = 2

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        if t - self.onset >= float(self.param("vanish_after_s", 30.0)):
            eff.gpu_gone[self.t.gpus] = True
            for g in self.t.gpus:
                r = self.fleet.gpu_replica[g]
                if r >= 0:
                    eff.replica_gone[r] = True


class DbeRemapFailure(Fault):
    """Double-bit ECC error (Xid 48) followed by a failed row remap (Xid 64): the memory needs repair."""

    kind = "ecc_dbe_remap_failure"
    gpu_default = 5

    def start(self, sim: Simulation, t: float) -> None:
        for g in self.t.gpus:
            sim.dbe[g] += 1
            sim.emit_xid(g, 48, t, "An uncorrectable double bit error (DBE) has been detected on GPU.")
        self._second = False

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        if not getattr(self, "_second", True) and t > self.onset:
            for g in self.t.gpus:
                sim.emit_xid(g, 64, t, "Row remapping failure.")
                sim.remap_failure[g] = 1
                sim.uncorr_rows[g] += 1
            self._second = True

    def stop(self, sim: Simulation, t: float) -> None:
        sim.remap_failure[self.t.gpus] = 0


class RowRemapPending(Fault):
    """Xid 63: a row remap is pending and takes effect at the next GPU reset. Needs a reset, not a repair."""

    kind = "row_remap_pending"
    gpu_default = 2
    expected_action = "schedule_reset"

    def fixed_by(self) -> frozenset[str]:
        return frozenset({"reset", "repair"})

    def start(self, sim: Simulation, t: float) -> None:
        for g in self.t.gpus:
            sim.emit_xid(g, 63, t, "Row remapping event: pending remap, reset required.")
            sim.sbe[g] += int(self.rng.integers(4, 24))
            sim.corr_rows[g] += 1
            sim.remap_pending[g] = 1

    def stop(self, sim: Simulation, t: float) -> None:
        sim.remap_pending[self.t.gpus] = 0


class NvlinkErrors(Fault):
    """NVLink CRC/replay/recovery errors climbing, Xid 74; tensor-parallel work on the node hangs."""

    kind = "nvlink_errors"

    def start(self, sim: Simulation, t: float) -> None:
        self._next_xid = t

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        g = self.t.gpus
        eff.nvlink_rate[g] += 40.0 * self.m
        if t >= self._next_xid:
            sim.emit_xid(g[0], 74, t, "NVLink: fatal error detected on link 4(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
            self._next_xid = t + float(self.param("xid_every_s", 600.0))
        if t - self.onset >= float(self.param("hang_after_s", 60.0)):
            for gi in g:
                if sim.node_out[gi // self.fleet.gpus_per_node]:
                    continue  # drained: its work left the broken links, nothing waits on them any more
                rk = self.fleet.gpu_rank[gi]
                if rk >= 0:
                    eff.job_hang[self.fleet.rank_job[rk]] = True
                r = self.fleet.gpu_replica[gi]
                if r >= 0:
                    eff.rate_mul[r] *= 0.05
                    eff.itl_mul[r] *= 20.0
                    eff.ttft_mul[r] *= 20.0
                    eff.err_add[r] += 0.3
                    eff.load_add[r] += 1.5


class PcieReplayStorm(Fault):
    """PCIe replays climbing at ~80/s on one GPU (link retraining, a bad riser); compute slows ~3 %."""

    kind = "pcie_replay_storm"
    gpu_default = 6

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        g = self.t.gpus
        eff.pcie_rate[g] += 80.0 * self.m
        eff.compute_mul[g] *= 1.0 + 0.03 * self.m


class Xid13BadKernel(Fault):
    """One bad kernel rolled out with a job: Xid 13 on many nodes, none of them faulty."""

    kind = "xid13_bad_kernel"
    hardware = False
    expected_action = "none"

    def start(self, sim: Simulation, t: float) -> None:
        self._next = {n: t + float(self.rng.uniform(0, 120)) for n in self.t.nodes}

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        rate_h = float(self.param("per_node_per_hour", 3.0)) * self.m
        xid = int(self.param("xid", 13))
        gpn = self.fleet.gpus_per_node
        for n, nxt in self._next.items():
            if t >= nxt:
                g = n * gpn + int(self.rng.integers(0, gpn))
                sim.emit_xid(g, xid, t, "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address")
                self._next[n] = t + float(self.rng.exponential(3600.0 / rate_h))

    def truth(self) -> list[GroundTruth]:
        return [self.gt(self.fleet.nodes[n], "node", False, "none", "application Xid") for n in self.t.nodes]


class BadDriverRollout(Fault):
    """A new driver rolled to a whole pool: nodes take the new version one after another, then start
    throwing Xid 119 (GSP RPC timeout) with a GPU-reset recovery action. Correlated: page a human."""

    kind = "bad_driver_rollout"
    expected_action = "page"

    def fixed_by(self) -> frozenset[str]:
        return frozenset({"rollback"})

    def setup(self) -> None:
        n = len(self.t.nodes)
        span = float(self.param("rollout_s", 1800.0))
        self.upgrade_at = {nd: self.onset + span * i / max(1, n) for i, nd in enumerate(self.t.nodes)}
        delay = float(self.param("delay_s", 600.0))
        frac = float(self.param("fraction", 1.0))
        hit = self.rng.random(n) < frac
        self.fail_at = {
            nd: self.upgrade_at[nd] + delay + float(self.rng.exponential(900.0))
            for i, nd in enumerate(self.t.nodes) if hit[i]
        }
        self.done: set[int] = set()
        self.failed: set[int] = set()

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        version = str(self.param("driver", "560.28.03"))
        gpn = self.fleet.gpus_per_node
        for nd in self.t.nodes:
            if nd not in self.done and t >= self.upgrade_at[nd]:
                sim.relabel_driver(nd, version)
                self.done.add(nd)
            if nd in self.fail_at and nd not in self.failed and t >= self.fail_at[nd]:
                g = nd * gpn + int(self.rng.integers(0, gpn))
                sim.emit_xid(g, 119, t, "Timeout after 6s of waiting for RPC response from GPU0 GSP!")
                sim.recovery_action[g] = 1
                self.failed.add(nd)

    def stop(self, sim: Simulation, t: float) -> None:
        for nd in self.done:
            sim.relabel_driver(nd, self.fleet.spec.driver_version)

    def truth(self) -> list[GroundTruth]:
        grp = "driver:" + self.t.label
        return [
            self.gt(self.fleet.nodes[n], "node", n in self.fail_at, "page", "bad driver rollout", grp)
            for n in self.t.nodes
        ]


class ExporterOutage(Fault):
    """The node's exporter dies: its series vanish and the scrape fails. Missing data, not a fault."""

    kind = "exporter_outage"
    hardware = False
    expected_action = "none"
    reason = "scrape failed: connection refused"

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        for n in self.t.nodes:
            eff.node_down[n] = True
            eff.node_reason[n] = self.reason

    def truth(self) -> list[GroundTruth]:
        return [self.gt(self.fleet.nodes[n], "node", False, "none", "missing data") for n in self.t.nodes]


class NetworkPartition(ExporterOutage):
    """A rack (or any set of nodes) cut off from the metrics pipeline: scrapes time out, data goes
    missing, the workloads keep running. Not a fault."""

    kind = "network_partition"
    reason = "scrape failed: context deadline exceeded"


class StageImbalance(Fault):
    """Unequal pipeline stages (like the ST trace: the last stage does ~1.6x the work). Not a fault."""

    kind = "stage_imbalance"
    hardware = False
    expected_action = "none"

    def setup(self) -> None:
        if not self.t.jobs:
            raise ValueError("stage_imbalance needs a job:NAME target")
        self.weights = {}
        for j in self.t.jobs:
            job = self.fleet.jobs[j]
            pp = len(job.stage_weights)
            w = self.p.get("stage_weights") or ([1.0] * (pp - 1) + [1.63])
            if len(w) != pp:
                raise ValueError(f"stage_weights needs {pp} entries for job {job.name}")
            self.weights[j] = np.asarray(w, np.float64) / np.asarray(job.stage_weights)
        fl = self.fleet
        self._mul = np.ones(len(fl.rank_gpu))
        for j, w in self.weights.items():
            sel = fl.rank_job == j
            self._mul[sel] = w[fl.rank_stage[sel]]

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        eff.rank_mul *= self._mul

    def truth(self) -> list[GroundTruth]:
        out = []
        for j, w in self.weights.items():
            job = self.fleet.jobs[j]
            heavy = {s for s in range(len(w)) if w[s] * job.stage_weights[s] > np.median(w * job.stage_weights)}
            out += [self.gt(self.fleet.nodes[int(n)], "node", False, "none", "heavier pipeline stage")
                    for n, s in zip(job.nodes, job.stage_of_node, strict=True) if int(s) in heavy]
        return out


class SeqImbalance(Fault):
    """Sequence-length imbalance (like the SE trace): each step, different ranks are slow. Not a fault."""

    kind = "seq_imbalance"
    hardware = False
    expected_action = "none"

    def setup(self) -> None:
        if not self.t.jobs:
            raise ValueError("seq_imbalance needs a job:NAME target")

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        eff.seq_sigma[self.t.jobs] += float(self.param("sigma", 0.14)) * self.m

    def truth(self) -> list[GroundTruth]:
        return [self.gt(self.fleet.nodes[n], "node", False, "none", "sequence-length imbalance")
                for n in self.t.nodes]


RECOVERY_CODES = {"GPU_RESET": 1, "NODE_REBOOT": 2, "DRAIN_P2P": 3, "DRAIN_AND_RESET": 4}


class ResetRequired(Fault):
    """Xid 154: the driver says the GPU needs a recovery action (param ``action``: GPU_RESET, the default,
    NODE_REBOOT, DRAIN_AND_RESET) before it can be trusted. A GPU reset clears it unless the scenario says
    otherwise: ``fixed_by: [reboot]`` survives a reset but not a reboot, ``fixed_by: [repair]`` survives
    both (hardware to replace). While it lasts the recovery action stays set (a reset that did not fix it
    sees it come back) and an active test fails."""

    kind = "gpu_reset_required"
    gpu_default = 0
    expected_action = "quarantine"

    def setup(self) -> None:
        action = str(self.param("action", "GPU_RESET"))
        if action not in RECOVERY_CODES:
            raise ValueError(f"gpu_reset_required: action {action!r}: expected one of {', '.join(RECOVERY_CODES)}")
        self.code = RECOVERY_CODES[action]
        # a drain-and-reset asks for exactly that (drain, reset, back), not a quarantine
        self.expected_action = "schedule_reset" if action.startswith("DRAIN") else "quarantine"

    def fixed_by(self) -> frozenset[str]:
        declared = self._declared_fixes()
        return declared if declared is not None else frozenset({"reset", "repair"})

    def start(self, sim: Simulation, t: float) -> None:
        for g in self.t.gpus:
            sim.emit_xid(g, 154, t, f"GPU recovery action changed from 0x0 (None) to 0x{self.code:x}")
            sim.recovery_action[g] = self.code

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        gone = [g for g in self.t.gpus if sim.recovery_action[g] != self.code]
        if gone:  # reset, not fixed: the driver asks again
            sim.recovery_action[gone] = self.code

    def stop(self, sim: Simulation, t: float) -> None:
        sim.recovery_action[self.t.gpus] = 0


from fleethealth.sim.faults_domain import DOMAIN_FAULT_CLASSES  # noqa: E402  (they subclass Fault)
from fleethealth.sim.faults_more import MORE_FAULT_CLASSES  # noqa: E402
from fleethealth.sim.faults_serving import (  # noqa: E402  (moved there; still importable from here)
    BuildRegression,
    CudaOom,
    ReplicaRestart,
    ReplicaSloBurn,
)

_CLASSES: tuple[type[Fault], ...] = (
    ThermalDrift, OffBus, DbeRemapFailure, RowRemapPending, NvlinkErrors, PcieReplayStorm, Xid13BadKernel,
    BadDriverRollout, ExporterOutage, NetworkPartition, BuildRegression, ReplicaSloBurn, CudaOom,
    StageImbalance, SeqImbalance, ReplicaRestart, ResetRequired,
)
FAULT_CLASSES: dict[str, type[Fault]] = {c.kind: c for c in _CLASSES + MORE_FAULT_CLASSES + DOMAIN_FAULT_CLASSES}


def make_fault(spec: FaultSpec, index: int, fleet: Fleet, start: float, seed: int) -> Fault:
    return FAULT_CLASSES[spec.kind](spec, index, fleet, start, seed)

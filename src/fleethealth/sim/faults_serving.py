"""Serving faults for the simulator: a build that regresses, a replica burning its SLO, CUDA OOMs of each
class, an engine restart. Moved out of ``fleethealth.sim.faults`` (which still exports every class, and
holds the registry ``FAULT_CLASSES``) to keep that module under the size rule.

They work through the same two channels as every fault: continuous per-replica effects written into
``Effects`` each step (latency and error multipliers, load, a replica gone), and one-shot calls back into
the simulation (an OOM event with its context, an Xid, a counter reset). Ground truth names the replica,
never the GPUs, except for a driver OOM (a device fault: quarantine its node).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleethealth.sim.faults import HW_SLOWDOWN, Effects, Fault
from fleethealth.sim.truth import GroundTruth

if TYPE_CHECKING:
    from fleethealth.sim.simulation import Simulation


class BuildRegression(Fault):
    """A serving build regresses: latency and errors up on every replica of that build; GPUs are fine."""

    kind = "serving_build_regression"
    hardware = False
    expected_action = "page"

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        r = self.t.replicas
        eff.ttft_mul[r] *= 1.0 + float(self.param("ttft_factor", 5.0)) * self.m
        eff.itl_mul[r] *= 1.0 + float(self.param("itl_factor", 1.5)) * self.m
        eff.err_add[r] += float(self.param("error_rate", 0.06)) * self.m

    def truth(self) -> list[GroundTruth]:
        f = self.fleet
        lab = self.t.label
        grp = lab if lab.startswith("build:") else "build:" + lab  # target build:v0.7.0 is group build:v0.7.0
        out = [self.gt(f.replicas[r].name, "replica", False, "page", "build regression", grp)
               for r in self.t.replicas]
        out += [self.gt(f.nodes[n], "node", False, "none", "build regression") for n in self.t.nodes]
        return out


class ReplicaSloBurn(Fault):
    """One replica burns its SLO budget because one of its GPUs runs slow (HW slowdown, power brake)."""

    kind = "replica_slo_burn"

    def setup(self) -> None:
        if not self.t.replicas:
            for g in self.t.gpus:
                r = int(self.fleet.gpu_replica[g])
                if r >= 0:
                    self.t.replicas.append(r)
            self.t.replicas = sorted(set(self.t.replicas))
        if not self.t.replicas:
            raise ValueError(f"target {self.t.label!r} is not a serving replica or its GPU")
        if not self._explicit_gpu():
            self.t.gpus = [int(self.fleet.replicas[r].gpus[0]) for r in self.t.replicas]

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        g = self.t.gpus
        eff.clock_mul[g] *= 1.0 - 0.3 * min(self.m, 2.0)
        eff.clock_reasons[g] |= HW_SLOWDOWN
        eff.power_viol_rate[g] += 300000.0 * self.m
        r = self.t.replicas
        eff.ttft_mul[r] *= 1.0 + 3.0 * self.m
        eff.itl_mul[r] *= 1.0 + 2.0 * self.m
        eff.err_add[r] += 0.04 * self.m

    def gpu_level(self) -> list[int]:
        return self.t.gpus

    def truth(self) -> list[GroundTruth]:
        f = self.fleet
        out = super().truth()
        out += [self.gt(f.replicas[r].name, "replica", True, "quarantine", "slow GPU") for r in self.t.replicas]
        return out


OOM_ACTIONS = {
    "single_request": "reject_request",
    "batch_overload": "limit_concurrency",
    "fragmentation": "rebuild_worker",
    "driver": "quarantine",
}


class CudaOom(Fault):
    """CUDA OOMs of one of the four classes (seed 002): one oversized request, batch overload, memory
    fragmentation after long uptime, or a driver/device fault (OOM with an Xid and a CUDA context error).
    Each OOM is an event with the context needed to classify it; metrics move as each class would."""

    kind = "cuda_oom"

    def setup(self) -> None:
        self.cls = str(self.param("class", "single_request"))
        if self.cls not in OOM_ACTIONS:
            raise ValueError(f"cuda_oom class must be one of {', '.join(OOM_ACTIONS)}, got {self.cls!r}")
        if not self.t.replicas:
            raise ValueError(f"cuda_oom target {self.t.label!r} must be a replica (replica:NAME)")
        self.hardware = self.cls == "driver"
        self.expected_action = OOM_ACTIONS[self.cls]
        self.count = int(self.param("count", 3))
        self.interval = float(self.param("interval_s", 300.0))
        self.times = [self.onset + k * self.interval for k in range(self.count)]
        if self.end is None and self.cls in ("batch_overload", "fragmentation") :
            self.end = self.onset + self.count * self.interval + 60.0
        self.fired = 0

    def fixed_by(self) -> frozenset[str]:
        # a rebuilt worker starts with a clean heap; a device fault needs a repair; an oversized request
        # or an overload is answered by admission (``reject_oversized``, ``limit_concurrency``), not ended
        return frozenset({"fragmentation": {"rebuild", "repair"}, "driver": {"repair"}}.get(self.cls, set()))

    def answered(self, sim: Simulation, r: int) -> bool:
        """The world already answered this class on replica ``r``: no more OOMs of it there."""
        if not sim.serving(r):
            return True  # no traffic, nothing to run out of memory on
        if self.cls == "batch_overload":
            return bool(sim.rep_limited[r])
        if self.cls == "single_request":
            return bool(sim.rep_reject_oversized[r])
        return False

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        r_ids = self.t.replicas
        if self.cls == "batch_overload":
            # behind a concurrency limit the batch no longer piles up past what fits
            over = [r for r in r_ids if not sim.rep_limited[r]]
            eff.load_add[over] += 0.9 * self.m
            eff.ttft_mul[over] *= 2.0
        elif self.cls == "fragmentation":
            for r in r_ids:
                eff.fb_add[self.fleet.replicas[r].gpus] += min(5000.0, (t - self.onset) / 10.0)
        elif self.cls == "driver":
            eff.err_add[r_ids] += 0.2
        while self.fired < len(self.times) and t >= self.times[self.fired]:
            for r in r_ids:
                if not self.answered(sim, r):
                    self._oom(sim, r, t)
            self.fired += 1

    def _oom(self, sim: Simulation, r: int, t: float) -> None:
        rep = self.fleet.replicas[r]
        g = int(rep.gpus[0])
        rng = self.rng
        ctx: dict[str, Any] = {
            "replica": rep.name, "pod": rep.pod, "gpu": int(g % self.fleet.gpus_per_node),
            "gpu_uuid": self.fleet.uuids[g], "model": rep.model, "model_version": rep.build,
            "adapter_version": "none", "error": "torch.OutOfMemoryError: CUDA out of memory.",
        }
        kv = float(sim.last_kv[r])
        if self.cls == "single_request":
            ctx |= {"prompt_tokens": int(rng.integers(150_000, 260_000)), "max_tokens": 8192,
                    "batch_size": int(rng.integers(2, 12)), "num_batched_tokens": int(rng.integers(2000, 8000)),
                    "kv_cache_usage": round(kv, 3), "num_requests_waiting": int(rng.integers(0, 3)),
                    "tried_to_allocate_mib": int(rng.integers(18000, 40000)), "recent_xids": []}
            sim.replica_errors[r] += 1
        elif self.cls == "batch_overload":
            ctx |= {"prompt_tokens": int(rng.integers(800, 4000)), "max_tokens": 1024,
                    "batch_size": int(rng.integers(200, 256)), "num_batched_tokens": int(rng.integers(30000, 65536)),
                    "kv_cache_usage": round(max(kv, 0.98), 3), "num_requests_waiting": int(rng.integers(60, 200)),
                    "tried_to_allocate_mib": int(rng.integers(512, 2048)), "recent_xids": []}
            sim.replica_errors[r] += int(rng.integers(5, 30))
        elif self.cls == "fragmentation":
            ctx |= {"prompt_tokens": int(rng.integers(800, 4000)), "max_tokens": 1024,
                    "batch_size": int(rng.integers(16, 64)), "num_batched_tokens": int(rng.integers(4000, 16000)),
                    "kv_cache_usage": round(min(kv, 0.7), 3), "num_requests_waiting": int(rng.integers(0, 5)),
                    "tried_to_allocate_mib": int(rng.integers(1024, 4096)),
                    "reserved_unallocated_mib": int(rng.integers(6000, 14000)),
                    "uptime_s": int(rng.integers(6, 14) * 86400), "recent_xids": []}
            sim.replica_errors[r] += 1
        else:
            xid = int(self.param("xid", 119))
            sim.emit_xid(g, xid, t, "Timeout after 6s of waiting for RPC response from GPU0 GSP!")
            sim.recovery_action[g] = 1
            ctx |= {"prompt_tokens": int(rng.integers(800, 4000)), "max_tokens": 1024,
                    "batch_size": int(rng.integers(8, 48)), "num_batched_tokens": int(rng.integers(2000, 12000)),
                    "kv_cache_usage": round(kv, 3), "num_requests_waiting": int(rng.integers(0, 5)),
                    "tried_to_allocate_mib": int(rng.integers(64, 512)), "recent_xids": [xid],
                    "cuda_error": "CUDA error: unspecified launch failure (cudaErrorLaunchFailure)"}
            sim.replica_errors[r] += int(rng.integers(5, 30))
        sim.add_event("cuda_oom", rep.name, rep.node, t, ctx, self.cls)

    def stop(self, sim: Simulation, t: float) -> None:
        if self.cls == "driver":
            sim.recovery_action[[int(self.fleet.replicas[r].gpus[0]) for r in self.t.replicas]] = 0

    def truth(self) -> list[GroundTruth]:
        f = self.fleet
        out = [self.gt(f.replicas[r].name, "replica", self.hardware, self.expected_action, self.cls)
               for r in self.t.replicas]
        if self.cls == "driver":
            out += [self.gt(f.gpu_entity(int(f.replicas[r].gpus[0])), "gpu", True, "quarantine", self.cls)
                    for r in self.t.replicas]
            out += [self.gt(f.nodes[f.replicas[r].node], "node", True, "quarantine", self.cls)
                    for r in self.t.replicas]
        return out

    def faulty_nodes(self) -> set[int]:
        return {self.fleet.replicas[r].node for r in self.t.replicas} if self.hardware else set()

    def gt(self, entity: str, kind: str, faulty: bool, action: str, detail: str = "",
           group: str | None = None) -> GroundTruth:
        g = super().gt(entity, kind, faulty, action, detail, group)
        return GroundTruth(g.entity, g.kind, f"cuda_oom:{self.cls}", g.onset, g.end, faulty, action, detail, group)


class ReplicaRestart(Fault):
    """The serving engine restarts (a deploy, a crash): its counters reset to zero, optionally after a
    short gap. Counters must be read reset-aware; not a fault."""

    kind = "replica_restart"
    hardware = False
    expected_action = "none"

    def setup(self) -> None:
        if not self.t.replicas:
            raise ValueError("replica_restart needs a replica:NAME target")
        if self.end is None:
            self.end = self.onset + float(self.param("gap_s", 0.0)) + 1.0

    def start(self, sim: Simulation, t: float) -> None:
        for r in self.t.replicas:
            sim.reset_replica_counters(r)

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        if t - self.onset < float(self.param("gap_s", 0.0)):
            eff.replica_gone[self.t.replicas] = True

    def truth(self) -> list[GroundTruth]:
        return [self.gt(self.fleet.replicas[r].name, "replica", False, "none", "restart") for r in self.t.replicas]

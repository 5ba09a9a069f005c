"""Failure-domain faults for the simulator (issue 16 items 1 and 5): events that make many nodes of one
domain look bad at once while none of them is broken: a job's crash, a power zone's brownout, an NVLink
domain's fabric.

Theory of operation
-------------------
Both kinds work through the channels every fault uses (``fleethealth.sim.faults``): continuous effects
written into ``Effects`` each step, and one-shot calls back into the simulation (``emit_xid``). Their
targets are usually a whole domain of the scenario's topology (``nvlink_domain:nvl-01``,
``power_zone:pz-00``) or a job (``job:pretrain-a``), resolved once by ``resolve_targets``.

* ``job_crash`` (the NVL72 Xid 45 storm operators report: "77 nodes in 11 racks; 672 fatal events in 3 h"):
  one job's process faults on one GPU (``first_xid``, default 13, a graphics engine exception; 43 works
  too), the job is torn down, and the driver logs Xid 45 (``ROBUST_CHANNEL_PREEMPTIVE_REMOVAL``,
  "preemptive cleanup, due to previous errors") on every GPU the job held, across its whole NVLink domain,
  within ``spread_s`` seconds. The job restarts and crashes again every ``repeat_s`` (default 45 min; 0:
  once) until ``end``. NVIDIA's catalog: Xid 45 not alone is IGNORE (follow the other Xid), Xid 13 is
  RESTART_APP. Ground truth: no node is faulty (expected action ``none``): the fault is the job's, and the
  right answer is the job's ticket and the domain's, never a drained rack.
* ``power_brownout``: a power shelf or PDU group sags (``power_zone:pz-00``): every GPU behind it is held to
  a lower power limit over ``ramp_s`` (default 10 min): power drawn drops by up to ``power_drop_w``, the
  clocks fall (``clock_drop``, default 10%), compute slows, the power-violation counter runs and the
  clock-event reasons carry the hardware power brake (0x80). Nothing on the nodes is broken. Ground truth:
  not faulty, expected action ``page``, group ``power:<target>``: one page for the zone, its nodes held,
  not drained one per budget window.

* ``nvlink_fabric``: the NVSwitch fabric of one multi-node NVLink domain degrades (a switch tray, a
  cable cartridge; ``nvlink_domain:nvl-01``): every GPU of the domain counts NVLink CRC errors at ``rate``
  per second (default 40; replays and recoveries follow) and its collectives slow (``slowdown``, default
  4%). No Xid, no GPU is broken: ground truth not faulty, expected action ``page``, group
  ``fabric:<target>``: one page for the domain (its fabric is the suspect), not 18 drained trays.

No fault here reads the wall clock or draws from a shared stream: time is the simulated ``t`` and each fault
has its own generator (``Fault.rng``), so adding one never changes the rest of the fleet's noise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleethealth.sim.faults import HW_SLOWDOWN, Effects, Fault
from fleethealth.sim.truth import GroundTruth

if TYPE_CHECKING:
    from fleethealth.sim.simulation import Simulation

HW_POWER_BRAKE = 0x80  # DCGM_FI_DEV_CLOCKS_EVENT_REASONS: power brake slowdown (an external power signal)

XID_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 1): Out Of Range Address",
    43: "pid=<unknown>, name=<unknown>, Ch 00000008",
    45: "pid=<unknown>, name=<unknown>, Ch 00000010, Preemptive cleanup, due to previous errors",
}


class JobCrash(Fault):
    """A job crashes (Xid 13 on one GPU) and every GPU it held logs Xid 45 (preemptive cleanup) across its
    NVLink domain; it restarts and crashes again every repeat_s. No node is faulty: the job's ticket."""

    kind = "job_crash"
    hardware = False
    expected_action = "none"

    def setup(self) -> None:
        if not self.t.nodes:
            raise ValueError("job_crash needs nodes: a job:NAME, a domain or node targets")
        self.first_xid = int(self.param("first_xid", 13))
        self.xid = int(self.param("xid", 45))
        self.repeat_s = float(self.param("repeat_s", 2700.0))
        self.spread_s = float(self.param("spread_s", 10.0))
        self.crashes = 0
        self._next = self.onset
        self._pending: list[tuple[float, int]] = []  # (when, gpu): Xid 45 lines still to log for this crash

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        if t >= self._next:
            gpus = self.t.gpus
            origin = int(gpus[int(self.rng.integers(0, len(gpus)))])
            sim.emit_xid(origin, self.first_xid, t, XID_MESSAGES.get(self.first_xid, ""))
            delays = self.rng.uniform(0.0, self.spread_s, len(gpus))
            self._pending += [(t + float(d), int(g)) for g, d in zip(gpus, delays, strict=True)]
            self.crashes += 1
            self._next = t + self.repeat_s if self.repeat_s > 0 else float("inf")
        if self._pending:
            due = [g for when, g in self._pending if when <= t]
            if due:
                self._pending = [(when, g) for when, g in self._pending if when > t]
                for g in due:
                    sim.emit_xid(g, self.xid, t, XID_MESSAGES.get(self.xid, ""))

    def truth(self) -> list[GroundTruth]:
        why = f"job crash: Xid {self.first_xid} once, Xid {self.xid} cleanup on every GPU of the job"
        return [self.gt(self.fleet.nodes[n], "node", False, "none", why) for n in self.t.nodes]


class PowerBrownout(Fault):
    """A power zone browns out (target power_zone:NAME): every GPU behind it power-braked (clock-event
    0x80), clocks down 10%, compute slower. Not broken: one page for the zone, its nodes held."""

    kind = "power_brownout"
    hardware = False
    expected_action = "page"

    def severity(self, t: float) -> float:
        return self.m * min(1.0, max(0.0, t - self.onset) / max(1.0, float(self.param("ramp_s", 600.0))))

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        s = self.severity(t)
        g = self.t.gpus
        drop = float(self.param("clock_drop", 0.10))
        eff.power_add[g] -= float(self.param("power_drop_w", 180.0)) * s
        eff.clock_mul[g] *= 1.0 - drop * s
        eff.compute_mul[g] *= 1.0 + 0.8 * drop * s
        if s > 0.3:
            eff.power_viol_rate[g] += 400000.0 * s
            eff.clock_reasons[g] |= HW_POWER_BRAKE | HW_SLOWDOWN

    def truth(self) -> list[GroundTruth]:
        grp = "power:" + self.t.label
        return [self.gt(self.fleet.nodes[n], "node", False, "page", "power zone brownout", grp)
                for n in self.t.nodes]


class NvlinkFabric(Fault):
    """An NVLink domain's NVSwitch fabric degrades (target nvlink_domain:NAME): NVLink CRC errors on all its
    GPUs, collectives slower, no Xid. Not broken: one page for the domain, its nodes held."""

    kind = "nvlink_fabric"
    hardware = False
    expected_action = "page"

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        g = self.t.gpus
        eff.nvlink_rate[g] += float(self.param("rate", 40.0)) * self.m
        eff.compute_mul[g] *= 1.0 + float(self.param("slowdown", 0.04)) * self.m

    def truth(self) -> list[GroundTruth]:
        grp = "fabric:" + self.t.label
        return [self.gt(self.fleet.nodes[n], "node", False, "page", "NVLink fabric degraded", grp)
                for n in self.t.nodes]


DOMAIN_FAULT_CLASSES: tuple[type[Fault], ...] = (JobCrash, PowerBrownout, NvlinkFabric)

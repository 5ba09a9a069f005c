"""More fault classes for the simulator (issue 16 item 5): chronic, intermittent, silent and correlated
faults, and exporter faults, each with its ground truth.

Every class here works through the same two channels as ``fleethealth.sim.faults``: continuous effects
written into ``Effects`` each step, and one-shot calls back into the simulation (an Xid, a DBE). Exporter
faults (a frozen exporter, a skewed clock) change what the exporter serves, not what the GPUs do: they
implement ``adjust_output``, which the simulation calls on the snapshot's values and timestamps just
before it is handed out. No fault here reads the wall clock: time is the simulated ``t``.

Ground truth (``truth()``) says for each entity whether it is broken and what the right answer is
(quarantine, schedule_reset, page, none); a correlated event names its ``group`` so the backtest judges
its nodes together.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fleethealth.sim.faults import Effects, Fault
from fleethealth.sim.truth import GroundTruth

if TYPE_CHECKING:
    from fleethealth.sim.simulation import Simulation


class SbeClimb(Fault):
    """Single-bit ECC errors on one GPU at a rate that doubles every ``doubling_s`` (default 12 h) from
    ``base_per_s`` (default 0.0005/s, about 2 an hour); after ``fault_after_s`` (default 3 d) the memory
    fails: a double-bit error (Xid 48) and a failed row remap. Nothing else moves (no clock, temperature
    or compute change). The right answer is a quarantine, ideally before the DBE."""

    kind = "sbe_climb"
    gpu_default = 4

    def setup(self) -> None:
        self._failed = False

    def rate(self, t: float) -> float:
        base = float(self.param("base_per_s", 0.0005)) * self.m
        doubling = float(self.param("doubling_s", 43200.0))
        return min(float(self.param("max_per_s", 50.0)), base * math.pow(2.0, max(0.0, t - self.onset) / doubling))

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        g = self.t.gpus
        eff.sbe_rate[g] += self.rate(t)
        if not self._failed and t - self.onset >= float(self.param("fault_after_s", 3 * 86400.0)):
            for gi in g:
                sim.dbe[gi] += 1
                sim.emit_xid(gi, 48, t, "An uncorrectable double bit error (DBE) has been detected on GPU.")
                sim.remap_failure[gi] = 1
                sim.uncorr_rows[gi] += 1
            self._failed = True

    def stop(self, sim: Simulation, t: float) -> None:
        sim.remap_failure[self.t.gpus] = 0

    def truth(self) -> list[GroundTruth]:
        return [GroundTruth(r.entity, r.kind, r.fault, r.onset, r.end, r.faulty, r.expected_action,
                            "SBE rate climbing to a DBE") for r in super().truth()]


class SlowRank(Fault):
    """A rank runs slow for a reason no GPU sensor sees (param ``cause``: host, the default, a CPU or
    memory-bandwidth problem on the host; nic, a degraded network card; pcie, the GPU's PCIe link
    downtrained, to ``link_gen`` x ``link_width``, default Gen3 x8, which DCGM_FI_DEV_PCIE_LINK_GEN /
    _LINK_WIDTH show below their device maxima where the fleet has ``pcie_link_fields: true``): its
    compute time grows by ``slowdown`` (default 4 %) with no temperature, clock, power or clock-event
    change, so only the rank-time peer comparison (or the link fields) can find it. Target a node (all
    its ranks) or ``node/gpuN`` (one rank)."""

    kind = "slow_rank"

    def setup(self) -> None:
        cause = str(self.param("cause", "host"))
        if cause not in ("host", "nic", "pcie"):
            raise ValueError(f"slow_rank: cause {cause!r}: expected host, nic or pcie")
        self.cause = cause

    def start(self, sim: Simulation, t: float) -> None:
        if self.cause == "pcie":
            for g in self.t.gpus:
                sim.set_pcie_link(g, float(self.param("link_gen", 3)), float(self.param("link_width", 8)))

    def stop(self, sim: Simulation, t: float) -> None:
        if self.cause == "pcie":
            for g in self.t.gpus:
                sim.set_pcie_link(g, 5.0, 16.0)

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        eff.compute_mul[self.t.gpus] *= 1.0 + float(self.param("slowdown", 0.04)) * self.m

    def truth(self) -> list[GroundTruth]:
        return [GroundTruth(r.entity, r.kind, r.fault, r.onset, r.end, r.faulty, r.expected_action,
                            f"slow rank ({self.cause}), no thermal or clock signature") for r in super().truth()]


class Intermittent(Fault):
    """One intermittent fault, many bursts: an NVLink (param ``signal: nvlink``, the default) or PCIe
    (``signal: pcie``) error burst for ``duty`` (default 0.2) of every ``period_s`` (default 1 h), clean in
    between; each NVLink burst starts with an Xid 74. A burst slows the GPU's compute by 3 %. One incident:
    the node is faulty for the whole time, quiet phases included."""

    kind = "intermittent"

    def setup(self) -> None:
        sig = str(self.param("signal", "nvlink"))
        if sig not in ("nvlink", "pcie"):
            raise ValueError(f"intermittent: signal {sig!r}: expected nvlink or pcie")
        self.signal = sig
        duty = float(self.param("duty", 0.2))
        if not 0.0 < duty <= 1.0:
            raise ValueError(f"intermittent: duty {duty} must be in (0, 1]")
        self.duty = duty
        self.period = float(self.param("period_s", 3600.0))
        self._burst = -1

    def in_burst(self, t: float) -> bool:
        return ((t - self.onset) % self.period) < self.duty * self.period

    def caught_by_test(self, t: float) -> bool:
        """A DCGM diag or NCCL bandwidth test passes on a link that is quiet while it runs: the test sees
        the fault only during a burst (why a flaky node keeps getting released)."""
        return self.in_burst(t)

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        if not self.in_burst(t):
            return
        g = self.t.gpus
        if self.signal == "nvlink":
            eff.nvlink_rate[g] += 40.0 * self.m
            burst = int((t - self.onset) // self.period)
            if burst != self._burst:
                sim.emit_xid(g[0], 74, t, "NVLink: fatal error detected on link 2(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)")
                self._burst = burst
        else:
            eff.pcie_rate[g] += 80.0 * self.m
        eff.compute_mul[g] *= 1.0 + 0.03 * self.m

    def truth(self) -> list[GroundTruth]:
        detail = f"intermittent {self.signal}: {self.duty:g} of every {self.period:g} s"
        return [GroundTruth(r.entity, r.kind, r.fault, r.onset, r.end, r.faulty, r.expected_action, detail)
                for r in super().truth()]


class SilentHang(Fault):
    """A node hangs without any error: no Xid, no counter, every GPU gauge as before; its job's collective
    stops completing (the step in flight grows on every rank of the job). The ranks that wait at the
    collective report the compute time they finished with; the node's own ranks never get there, so their
    compute time is the one still in flight and grows (the rank timer's in-flight reading). Draining the
    node lets the job restart without it. Target one node of a training job."""

    kind = "silent_hang"

    def setup(self) -> None:
        fl = self.fleet
        self._jobs = sorted({int(fl.rank_job[rk]) for g in self.t.gpus if (rk := int(fl.gpu_rank[g])) >= 0})
        if not self._jobs:
            raise ValueError(f"silent_hang: target {self.t.label!r} runs no training rank")

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        if all(sim.node_out[n] for n in self.t.nodes):
            return  # drained: the job went on without it
        eff.job_hang[self._jobs] = True
        ranks = self.fleet.gpu_rank[self.t.gpus]
        eff.rank_stuck[ranks[ranks >= 0]] = True

    def truth(self) -> list[GroundTruth]:
        return [GroundTruth(r.entity, r.kind, r.fault, r.onset, r.end, r.faulty, r.expected_action,
                            "hang without errors") for r in super().truth()]


class CoolingEvent(Fault):
    """A rack's cooling fails (a CDU, a row's air handler): every GPU in the target (``rack:NAME``) warms
    by up to ``max_c`` (default 12 C) over ``ramp_s`` (default 30 min), clocks throttle with the
    temperature (SW thermal slowdown, thermal violation time), compute slows. The nodes are not broken:
    the right answer is one page for the rack, not drained nodes. Ends with ``end`` (cooling restored)."""

    kind = "cooling_event"
    hardware = False
    expected_action = "page"

    def severity(self, t: float) -> float:
        return self.m * min(1.0, max(0.0, t - self.onset) / float(self.param("ramp_s", 1800.0)))

    def apply(self, sim: Simulation, t: float, eff: Effects) -> None:
        s = self.severity(t)
        g = self.t.gpus
        eff.temp_add[g] += float(self.param("max_c", 12.0)) * s
        eff.clock_mul[g] *= 1.0 - 0.06 * s
        eff.compute_mul[g] *= 1.0 + 0.05 * s
        eff.power_add[g] -= 15.0 * s
        if s > 0.5:
            eff.thermal_viol_rate[g] += 40000.0 * s
            eff.clock_reasons[g] |= 0x20  # SW thermal slowdown

    def truth(self) -> list[GroundTruth]:
        grp = "cooling:" + self.t.label
        return [self.gt(self.fleet.nodes[n], "node", False, "page", "rack cooling event", grp) for n in self.t.nodes]


class ExporterFault(Fault):
    """Base of faults in the exporter: what is served changes, the hardware does not. Not a fault of
    the node; the right answer is none (missing or stale data, never a quarantine)."""

    hardware = False
    expected_action = "none"
    adjusts_output = True
    detail = "exporter fault"

    def adjust_output(self, sim: Simulation, t: float, values: np.ndarray, ts: np.ndarray,
                      row_node: np.ndarray) -> None:
        """Change the values and timestamps of this step's snapshot in place (rows before ``keep``)."""

    def truth(self) -> list[GroundTruth]:
        return [self.gt(self.fleet.nodes[n], "node", False, "none", self.detail) for n in self.t.nodes]


class FrozenExporter(ExporterFault):
    """The node's exporter serves the same values over and over (a wedged DCGM host engine): every sample
    carries a fresh timestamp, but gauges and counters are those of the onset step. Staleness has to be
    read from values that stop changing. ``up`` stays 1."""

    kind = "frozen_exporter"
    detail = "frozen exporter: stale values, fresh timestamps"

    def setup(self) -> None:
        self._frozen: np.ndarray | None = None
        self._rows: np.ndarray | None = None

    def adjust_output(self, sim: Simulation, t: float, values: np.ndarray, ts: np.ndarray,
                      row_node: np.ndarray) -> None:
        rows = np.flatnonzero(np.isin(row_node, self.t.nodes))
        if self._frozen is None or self._rows is None or len(self._rows) != len(rows):
            self._rows = rows
            self._frozen = values[rows].copy()
            return
        values[rows] = self._frozen


class ClockSkew(ExporterFault):
    """The node's clock is off by ``skew_s`` (default +90 s, ahead; negative: behind) and its exporter
    stamps samples with it: its timestamps lead (or trail) the rest of the fleet's. Values are right."""

    kind = "clock_skew"
    detail = "clock skew on the exporter"

    def adjust_output(self, sim: Simulation, t: float, values: np.ndarray, ts: np.ndarray,
                      row_node: np.ndarray) -> None:
        ts[np.isin(row_node, self.t.nodes)] += float(self.param("skew_s", 90.0))


MORE_FAULT_CLASSES: tuple[type[Fault], ...] = (
    SbeClimb, SlowRank, Intermittent, SilentHang, CoolingEvent, FrozenExporter, ClockSkew,
)

"""Run a scenario through the simulator and every arm's decisions, on the simulator's clock.

Per telemetry step (the scenario's ``step``, 15 s by default): the simulator's snapshot goes into one
shared rolling history, the rule baselines look at it, and the slow-rank tracker measures how slow the
truly faulty nodes' ranks are. Per decision cycle: the controller's sequence exactly (history view ->
structural signals -> ``DecisionLoop.cycle`` with that cycle's events) for the product and for each
engine baseline.

Decision cadence: a cycle every ``cycle_s`` of simulated time (60 s by default; the engine costs about a
third of a CPU second per cycle for a 512-GPU fleet, so a 15 s cadence makes a day four times slower),
plus an immediate cycle on any step that carries a non-metric event (an Xid line in the kernel log, a CUDA
OOM), as the controller's event-driven sources would. ``cycle_s`` equal to the scenario's step gives the
controller's own cadence.

Each arm keeps what it decided in its ``ArmLog`` (transitions and intents, in decision order);
``decision_records`` flattens chosen arms' logs into one time-ordered list of records for operators
(``fleethealth backtest --decisions FILE``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleethealth.backtest.arms import (
    BASELINES,
    ENGINE_BASELINES,
    PRODUCT,
    RULE_BASELINES,
    ArmLog,
    EngineArm,
    EngineScore,
    LivenessArm,
    RuleArm,
    SharedHistory,
    StaticRulesArm,
    engine_scorer,
)
from fleethealth.backtest.events import EngineLimits, World, oom_event
from fleethealth.decide.state import Event
from fleethealth.policy import Policy
from fleethealth.score.scorer import Scorer
from fleethealth.signals.history import SignalHistory
from fleethealth.sim.scenario import Scenario
from fleethealth.sim.simulation import Simulation
from fleethealth.sim.truth import GroundTruth
from fleethealth.sources.structural import StructuralTracker


@dataclass(slots=True)
class Timeline:
    """The product's scores per decision cycle (for the report): value per node and replica, NaN when
    unknown or absent."""

    ts: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    rows: list[np.ndarray] = field(default_factory=list)
    _ix: dict[str, int] = field(default_factory=dict)
    _cols: dict[str, tuple[list[str], np.ndarray]] = field(default_factory=dict)

    def add(self, now: float, health: Any) -> None:
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        for kind in ("node", "replica"):
            ks = getattr(health, "kinds", {}).get(kind)
            if ks is None:
                continue
            parts.append((self._columns(kind, ks.names), np.asarray(ks.value, np.float64)))
        row = np.full(len(self.names), np.nan)
        for ix, values in parts:
            row[ix] = values
        self.ts.append(now)
        self.rows.append(row)

    def _columns(self, kind: str, names: list[str]) -> np.ndarray:
        """Timeline columns of a kind's entities, remembered per names list (the engine's list is the same
        from cycle to cycle while the fleet is)."""
        hit = self._cols.get(kind)
        if hit is not None and (hit[0] is names or hit[0] == names):
            return hit[1]
        ix = np.empty(len(names), np.int64)
        for k, name in enumerate(names):
            i = self._ix.get(name)
            if i is None:
                i = self._ix[name] = len(self.names)
                self.names.append(name)
                self.kinds[name] = kind
            ix[k] = i
        self._cols[kind] = (list(names), ix)
        return ix

    def matrix(self) -> np.ndarray:
        """cycles x entities."""
        n = len(self.names)
        out = np.full((len(self.rows), n), np.nan)
        for k, r in enumerate(self.rows):
            out[k, : r.size] = r
        return out


# A node's median rank runs this much over its stage's median before it counts as slow: the simulated
# per-rank noise moves a node's median by a few tenths of a percent, which is not a slowdown.
MIN_SLOWDOWN = 0.005


@dataclass(slots=True)
class SlowRecord:
    """How slow a truly faulty node's ranks ran at one step: (t, node, job, slowdown fraction)."""

    t: float
    node: str
    job: str
    job_gpus: int
    slowdown: float


class SlowTracker:
    """Measures, per telemetry step, the slowdown of ranks on nodes that ground truth says are faulty:
    the median over the node's ranks of compute time / its pipeline stage's median, minus one. A
    synchronous job runs at its slowest rank's pace, so the job loses that fraction of its GPU-hours."""

    def __init__(self, sim: Simulation, truths: Sequence[GroundTruth]) -> None:
        f = sim.fleet
        self.sim = sim
        self.faulty = [(g.entity, g.onset, g.end) for g in truths if g.kind == "node" and g.faulty]
        self.rank_job = np.asarray(f.rank_job)
        self.rank_stage = np.asarray(f.rank_stage)
        self.node_of_rank = np.asarray(sim.node_of_rank)
        self.job_names = [j.name for j in f.jobs]
        self.job_gpus = np.bincount(self.rank_job, minlength=len(f.jobs)) if len(self.rank_job) else np.zeros(0)
        self.node_ix = {n: i for i, n in enumerate(f.nodes)}
        self.records: list[SlowRecord] = []

    def observe(self, t: float, sim: Simulation | None = None) -> None:
        """``sim``: the product's world (closed loop it may be a fork of the one this tracker started on)."""
        active = [e for e, on, end in self.faulty if on <= t and (end is None or t < end)]
        if not active or self.rank_job.size == 0:
            return
        comp = np.asarray((sim or self.sim).rank_compute, np.float64)
        for node in active:
            n = self.node_ix.get(node)
            if n is None:
                continue
            mine = np.nonzero(self.node_of_rank == n)[0]
            if mine.size == 0:
                continue
            j = int(self.rank_job[mine[0]])
            ratios = []
            for st in np.unique(self.rank_stage[mine]).tolist():
                peers = np.nonzero((self.rank_job == j) & (self.rank_stage == st))[0]
                med = float(np.median(comp[peers]))
                own = mine[self.rank_stage[mine] == st]
                if med > 0:
                    ratios.append(float(np.median(comp[own])) / med)
            if ratios:
                slow = min(1.0, max(0.0, max(ratios) - 1.0))
                if slow >= MIN_SLOWDOWN:
                    self.records.append(SlowRecord(t, node, self.job_names[j], int(self.job_gpus[j]), slow))


@dataclass(slots=True)
class BacktestRun:
    scenario: Scenario
    policy: Policy
    start: float
    end: float
    step_s: float
    cycle_s: float
    nodes: list[str]
    node_pool: dict[str, str]
    node_tp_group: dict[str, str]
    replica_node: dict[str, str]
    truths: list[GroundTruth]
    sim_events: list[Any]
    arms: dict[str, ArmLog]
    timeline: Timeline
    slow: list[SlowRecord]
    wall_s: float
    cpu_s: float
    steps: int
    gpus: int
    closed_loop: bool = False
    world_actions: dict[str, int] = field(default_factory=dict)  # simulator actions applied, per arm
    worlds: int = 1  # simulated worlds at the end (closed loop: one per arm that acted, plus the shared one)


class Lane:
    """One simulated world, the rolling history and structural tracker fed from it, and the arms living in
    it. All arms start in one lane, on the same telemetry; closed loop, an arm whose decisions are about to
    change the world first forks a private copy of it, so no arm ever sees another arm's actions and arms
    that never act share the cost of one world."""

    def __init__(self, sim: Simulation, history: SharedHistory, structural: StructuralTracker,
                 next_cycle: float) -> None:
        self.sim = sim
        self.history = history
        self.structural = structural
        self.next_cycle = next_cycle
        self.pending: list[Event] = []  # OOM events since the last cycle
        self.engine_arms: list[EngineArm] = []
        self.rule_arms: list[RuleArm] = []
        self.worlds: list[World] = []  # of the arms in this lane

    @property
    def size(self) -> int:
        return len(self.engine_arms) + len(self.rule_arms)

    def fork(self, arm: EngineArm | RuleArm, world: World, policy: Policy) -> Lane:
        """Move ``arm`` (with its ``world``) into a copy of this lane's world as it is now."""
        # the policy is read-only and shared; everything else (simulator state and random streams,
        # history, structural tracker) is copied; a rule arm reads raw snapshots and needs no history
        memo: dict[int, Any] = {id(policy): policy}
        if isinstance(arm, EngineArm):
            sim, history, structural, pending = copy.deepcopy(
                (self.sim, self.history, self.structural, self.pending), memo)
        else:
            sim, pending = copy.deepcopy((self.sim, self.pending), memo)
            history, structural = self.history, self.structural  # never read in a lane of rule arms
        new = Lane(sim, history, structural, self.next_cycle)
        new.pending = pending
        if isinstance(arm, EngineArm):
            self.engine_arms.remove(arm)
            new.engine_arms.append(arm)
            arm.loop.history = history
            if isinstance(arm.loop.scorer, EngineScore):
                arm.loop.scorer.engine = Scorer()  # its own stream now: a scorer of its own
        else:
            self.rule_arms.remove(arm)
            new.rule_arms.append(arm)
        self.worlds.remove(world)
        new.worlds.append(world)
        world.sim = sim
        return new


def _arm_names(baselines: Sequence[str]) -> list[str]:
    bad = [b for b in baselines if b not in BASELINES]
    if bad:
        raise ValueError(f"unknown baseline {', '.join(bad)}: expected some of {', '.join(BASELINES)}")
    return [PRODUCT] + [b for b in BASELINES if b in baselines]


def run_backtest(
    scenario: Scenario,
    policy: Policy,
    baselines: Sequence[str] = BASELINES,
    cycle_s: float = 60.0,
    on_cycle: Callable[[float, Any, ArmLog], None] | None = None,
    limits: EngineLimits = EngineLimits(),
    closed_loop: bool = True,
) -> BacktestRun:
    """Run ``scenario`` through the product and ``baselines``; ``on_cycle(now, CycleResult, product
    log)`` is called after each of the product's cycles (the demo's live view). ``closed_loop``: each
    arm's decisions act on its own copy of the world (``backtest.events``); otherwise every arm sees the
    same telemetry, which no decision changes."""
    names = _arm_names(baselines)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    sim = Simulation(scenario)
    f = sim.fleet
    # what was injected, as written: an arm that ends a fault early (a reset, a rebuild) changes its own
    # world, not the truth it is judged against
    truths = sim.ground_truth
    replica_node = {r.name: f.nodes[r.node] for r in f.replicas}
    inventory = {"node": list(f.nodes)}
    history = SharedHistory(SignalHistory(policy))
    structural = StructuralTracker(node_labels=policy.node_labels, max_age_s=policy.freshness.max_age_s,
                                   future_skew_s=policy.freshness.future_skew_s)
    first = Lane(sim, history, structural, sim.start + cycle_s)
    lanes = [first]
    node_set = frozenset(f.nodes)

    def new_world() -> World:
        w = World(None, replica_node, closed=closed_loop, nodes=node_set, sim=sim)
        first.worlds.append(w)
        return w

    worlds: dict[str, World] = {}
    lane_engine = Scorer()  # the lane's engine arms read the same views: one evaluation per view
    for name in names:
        if name == PRODUCT or name in ENGINE_BASELINES:
            scorer = engine_scorer(inventory, aggregation="mean" if name == "weighted-mean" else None,
                                   naive=name == "no-confidence", engine=lane_engine)
            worlds[name] = new_world()
            first.engine_arms.append(EngineArm(name, policy, history, scorer, worlds[name]))
    for name in names:
        if name == "static-rules":
            first.rule_arms.append(StaticRulesArm(f.nodes))
        elif name == "liveness-only":
            first.rule_arms.append(LivenessArm(f.nodes, replica_node))
        else:
            continue
        worlds[name] = new_world()
    assert set(RULE_BASELINES) >= {a.name for a in first.rule_arms}
    slow = SlowTracker(sim, truths)
    timeline = Timeline()
    steps = 0

    def lane_of(arm_name: str) -> Lane:
        return next(ln for ln in lanes if any(a.name == arm_name for a in ln.engine_arms)
                    or any(a.name == arm_name for a in ln.rule_arms))

    for _ in range(scenario.n_steps):
        steps += 1
        for lane in list(lanes):  # a lane forked during this step has already stepped
            for w in lane.worlds:
                w.apply_due(lane.sim, lane.sim.t + lane.sim.step_s)
            snap = lane.sim.step()
            t = lane.sim.t
            if lane.engine_arms:
                lane.history.add(snap)
            for ra in list(lane.rule_arms):
                c0 = time.process_time()
                n_tr, n_it = len(ra.log.transitions), len(ra.log.intents)
                ra.observe(t, snap)
                w = worlds[ra.name]
                if w.react(ra.log.transitions[n_tr:], ra.log.intents[n_it:]) and lane.size > 1:
                    lanes.append(lane.fork(ra, w, policy))
                ra.log.cpu_s += time.process_time() - c0
            evs = lane.sim.events(t)
            lane.pending += [oom_event(e, limits) for e in evs if e.kind == "cuda_oom"]
            if t + 1e-9 < lane.next_cycle and not evs:
                continue
            while lane.next_cycle <= t + 1e-9:
                lane.next_cycle += cycle_s
            if not lane.engine_arms:
                continue
            c0 = time.process_time()
            view = lane.history.view(t)
            derived = lane.structural.observe(view, t).snapshot
            shared_s = time.process_time() - c0
            pending, lane.pending = lane.pending, []
            n_arms = len(lane.engine_arms)
            for arm in list(lane.engine_arms):
                c0 = time.process_time()
                res = arm.cycle(derived, t, pending)
                d = res.decision
                if arm.world.react(d.transitions, d.intents) and lane.size > 1:
                    lanes.append(lane.fork(arm, arm.world, policy))
                arm.log.cpu_s += time.process_time() - c0 + shared_s / n_arms
                if arm.name == PRODUCT:
                    timeline.add(t, res.health)
                    if on_cycle is not None:
                        on_cycle(t, res, arm.log)
        prod = lane_of(PRODUCT)
        slow.observe(prod.sim.t, prod.sim)
    prod_sim = lane_of(PRODUCT).sim
    logs = {a.name: a.log for ln in lanes for a in ln.engine_arms} | {a.name: a.log for ln in lanes for a in ln.rule_arms}
    return BacktestRun(
        scenario=scenario, policy=policy, start=sim.start, end=sim.start + steps * sim.step_s, step_s=sim.step_s,
        cycle_s=cycle_s, nodes=list(f.nodes), node_pool=dict(zip(f.nodes, f.node_pool, strict=True)),
        node_tp_group={n: f.node_labels(i).get("tp_group", "") for i, n in enumerate(f.nodes)},
        replica_node=replica_node, truths=truths, sim_events=prod_sim.all_events,
        arms={n: logs[n] for n in names}, timeline=timeline, slow=slow.records,
        wall_s=time.perf_counter() - t_wall, cpu_s=time.process_time() - t_cpu, steps=steps, gpus=f.n_gpus,
        closed_loop=closed_loop, world_actions={n: worlds[n].applied for n in names}, worlds=len(lanes),
    )


def decision_records(run: BacktestRun, arms: Sequence[str] = (PRODUCT,)) -> list[dict[str, Any]]:
    """The decision log of ``arms`` as flat records, one per transition or intent, in time order (ties:
    the arms' order as given, then the order the arm decided them in): ``arm``, ``t_s`` (seconds since the
    run's start), ``ts``, ``record`` (transition | intent), the entity and the decision with its reason.
    No policy version, idempotency key or intent sequence number (params ``n``: one extra intent would
    renumber every later one), so two runs under two policies diff line by line."""
    unknown = [a for a in arms if a not in run.arms]
    if unknown:
        raise ValueError(f"no arm {', '.join(unknown)} in this run: it has {', '.join(run.arms)}")
    keyed: list[tuple[float, int, int, dict[str, Any]]] = []
    for rank, name in enumerate(arms):
        log = run.arms[name]
        rows: list[tuple[float, dict[str, Any]]] = []
        for tr in log.transitions:
            rows.append((tr.ts, {"record": "transition", "entity": tr.entity, "kind": tr.kind,
                                 "from": str(tr.from_state), "to": str(tr.to_state), "reason": tr.reason,
                                 "value": tr.value, "confidence": tr.confidence, "detail": tr.detail}))
        for it in log.intents:
            params = {k: v for k, v in it.params.items() if k != "n"}
            rows.append((it.ts, {"record": "intent", "entity": it.entity, "intent": str(it.kind),
                                 "reason": it.reason, "params": params,
                                 "tier": None if it.tier is None else str(it.tier), "soft": it.soft}))
        # a cycle's transitions come before the intents they caused: stable sort on time keeps that
        rows.sort(key=lambda r: r[0])
        for seq, (ts, body) in enumerate(rows):
            keyed.append((ts, rank, seq, {"arm": name, "t_s": ts - run.start, "ts": ts} | body))
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed]


def compress(scenario: Scenario, lead_s: float = 1800.0, tail_s: float = 3 * 3600.0,
             gap_s: float | None = None) -> Scenario:
    """The same scenario with the quiet hours cut: the first fault starts ``lead_s`` in, consecutive
    onsets are at most ``gap_s`` apart (None: spacing kept), and the run ends ``tail_s`` after the last
    onset (or end) of a fault. Faults keep their order, kinds, targets, magnitudes and durations. For
    tests and quick runs; the built-in scenarios as written are the reference."""
    if not scenario.faults:
        return scenario.with_overrides(duration=min(scenario.duration, lead_s + tail_s))
    data = scenario.model_dump()
    faults = data["faults"]
    order = sorted(range(len(faults)), key=lambda k: faults[k]["onset"])
    prev_old = prev_new = None
    last = 0.0
    for k in order:
        f = faults[k]
        old = f["onset"]
        if prev_old is None:
            new = min(old, lead_s)
        else:
            gap = old - prev_old
            new = prev_new + (gap if gap_s is None else min(gap, gap_s))
        prev_old, prev_new = old, new
        f["onset"] = new
        if f.get("end") is not None:
            f["end"] = f["end"] - old + new
        last = max(last, new if f.get("end") is None else min(f["end"], new + tail_s))
    data["duration"] = max(scenario.step, min(scenario.duration, last + tail_s))
    return Scenario.model_validate(data)

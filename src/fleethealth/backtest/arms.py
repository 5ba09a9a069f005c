"""The arms of a backtest: fleethealth itself and the baselines it is compared with, all fed the same
telemetry.

* ``fleethealth``: the product. ``decide.loop.DecisionLoop`` with the engine scorer, exactly the per-cycle
  code of the controller (history, structural signals, score, decide).
* ``weighted-mean``: the same loop, but the engine aggregates categories with a weighted mean instead of
  the minimum (``score_snapshot(..., aggregation="mean")``): a zero in one category is averaged away.
* ``no-confidence``: the same loop, but the scorer has no notion of unknown (the seed's naive scorer):
  an entity with no fresh data reads 1.0 (healthy) and every confidence reads 1.0.
* ``static-rules``: no scores; any Xid on a GPU drains its node, and so does a GPU temperature above
  ``temp_limit_c``; evaluated on every scrape, no dwell, no budget, never released.
* ``liveness-only``: acts only on total failure, like a liveness probe: a node whose exporter stops
  answering, or that lost a GPU, for ``failures`` scrapes in a row; a replica whose engine vanished.
  Degradations are invisible to it.

The rule baselines use a simple policy of their own (threshold -> quarantine, no budgets): that is what
those tools do, and what the comparison is about.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleethealth.backtest.events import World
from fleethealth.decide.loop import DecisionLoop
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.decide.state import Event
from fleethealth.policy import Policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot

PRODUCT = "fleethealth"
ENGINE_BASELINES = ("weighted-mean", "no-confidence")
RULE_BASELINES = ("static-rules", "liveness-only")
BASELINES = ("static-rules", "liveness-only", "weighted-mean", "no-confidence")
BASELINE_HELP = {
    "static-rules": "any Xid drains the node; GPU temperature over 85 C drains it (no dwell, no budget)",
    "liveness-only": "drains only on total failure: exporter gone or a GPU lost for 3 scrapes, engine gone",
    "weighted-mean": "the engine with a weighted mean across categories instead of the minimum",
    "no-confidence": "the engine without confidence: unknown reads as healthy (1.0)",
}


class SharedHistory:
    """One rolling history for several decision loops: a snapshot handed to every loop is added once,
    and the view of a given ``now`` is computed once. (Each loop would otherwise repeat the same work.)"""

    def __init__(self, inner: SignalHistory) -> None:
        self.inner = inner
        self._last: Snapshot | None = None
        self._view: tuple[float, Snapshot] | None = None

    @property
    def issues(self) -> list[Any]:
        return self.inner.issues

    def add(self, snap: Snapshot) -> None:
        if snap is self._last:
            return
        self._last = snap
        self._view = None
        self.inner.add(snap)

    def view(self, now: float) -> Snapshot:
        if self._view is not None and self._view[0] == now:
            return self._view[1]
        v = self.inner.view(now)
        self._view = (now, v)
        return v


Scorer = Callable[[Snapshot, Policy, float, str], Any]


class EngineScore:
    """An engine arm's scorer: the engine (``score.Scorer``, what it keeps between cycles) is the
    lane's, shared by the engine arms that read the lane's views (one evaluation per view for them all,
    each arm aggregating its own way); an arm forked into a lane of its own gets a scorer of its own."""

    def __init__(self, inventory: dict[str, list[str]] | None, aggregation: str | None, naive: bool,
                 engine: Any) -> None:
        self.inventory, self.aggregation, self.naive, self.engine = inventory, aggregation, naive, engine

    def __call__(self, view: Snapshot, policy: Policy, now: float, consumer: str) -> Any:
        with warnings.catch_warnings():
            # a mean over an entity with no category known is NaN (unknown), as it should be; numpy warns
            warnings.simplefilter("ignore", RuntimeWarning)
            fh = self.engine.score(view, policy, now, consumer=consumer, inventory=self.inventory,
                                   aggregation=self.aggregation)
        if self.naive:
            for ks in fh.kinds.values():
                unknown = np.isnan(ks.value)
                if unknown.any():
                    ks.value[unknown] = 1.0
                    for i in np.nonzero(unknown)[0].tolist():
                        ks.reason[i] = "no_data_reads_healthy"
                ks.confidence[:] = 1.0
        return fh


def engine_scorer(inventory: dict[str, list[str]] | None, aggregation: str | None = None,
                  naive: bool = False, engine: Any = None) -> EngineScore:
    """An engine arm's scorer on ``engine`` (a ``score.Scorer``; None: one of its own)."""
    from fleethealth.score.engine import Scorer as EngineScorer

    return EngineScore(inventory, aggregation, naive, engine if engine is not None else EngineScorer())


@dataclass(slots=True)
class ArmLog:
    """Everything one arm decided, in time order."""

    name: str
    transitions: list[Transition] = field(default_factory=list)
    intents: list[Intent] = field(default_factory=list)
    cycles: int = 0
    cpu_s: float = 0.0


class EngineArm:
    """A DecisionLoop (the product's per-cycle code) with a given scorer, plus the world's answers."""

    def __init__(self, name: str, policy: Policy, history: SharedHistory, scorer: Scorer, world: World) -> None:
        self.name = name
        self.loop = DecisionLoop(policy, store=None, scorer=scorer, history=history)
        self.world = world
        self.log = ArmLog(name)
        self.last: Any = None  # the last cycle's CycleResult

    def cycle(self, derived: Snapshot, now: float, events: Sequence[Event]) -> Any:
        evs = list(events) + self.world.due(now)
        res = self.loop.cycle(derived, now, evs)
        d = res.decision
        self.log.transitions.extend(d.transitions)
        self.log.intents.extend(d.intents)
        self.log.cycles += 1
        self.last = res  # the runner hands this cycle's decisions to the world (and forks it if need be)
        return res


class _SeriesIndex:
    """Series id -> node index for the simulator's (append-only) label-set list."""

    def __init__(self, nodes: Sequence[str], keys: Sequence[str] = ("Hostname", "node", "instance")) -> None:
        self.node_ix = {n: i for i, n in enumerate(nodes)}
        self.keys = keys
        self.arr = np.zeros(0, np.int64)
        self.replica_of: dict[int, str] = {}

    def update(self, labelsets: Sequence[Any]) -> np.ndarray:
        n0 = len(self.arr)
        if len(labelsets) > n0:
            new = np.full(len(labelsets) - n0, -1, np.int64)
            for k, ls in enumerate(labelsets[n0:]):
                d = dict(ls)
                for key in self.keys:
                    v = d.get(key)
                    if v is not None:
                        new[k] = self.node_ix.get(v.split(":")[0], -1)
                        break
                if "replica" in d:
                    self.replica_of[n0 + k] = d["replica"]
            self.arr = np.concatenate([self.arr, new])
        return self.arr


class RuleArm:
    """Base of the rule baselines: evaluated on every scrape, quarantine at once, never release."""

    reason = "rule"

    def __init__(self, name: str, nodes: Sequence[str]) -> None:
        self.name = name
        self.nodes = list(nodes)
        self.index = _SeriesIndex(nodes)
        self.log = ArmLog(name)
        self.out: set[str] = set()
        self._rows_of: tuple[np.ndarray, list[str], int, dict[str, np.ndarray]] | None = None

    def quarantine(self, entity: str, kind: str, now: float, why: str) -> None:
        if entity in self.out:
            return
        self.out.add(entity)
        self.log.transitions.append(Transition(now, entity, kind, State.READY, State.QUARANTINED, why, None, 1.0,
                                               f"baseline:{self.name}"))
        self.log.intents.append(Intent(now, IntentKind.QUARANTINE, entity, why, {}, Tier.NODE,
                                       policy_version=f"baseline:{self.name}"))

    def _rows(self, snap: Snapshot, metric: str) -> np.ndarray:
        """The snapshot's rows of ``metric``. A simulator sends the same layout arrays every step (a
        snapshot's arrays are never changed in place), so the rows are remembered per metric-id array."""
        if self._rows_of is None or self._rows_of[0] is not snap.metric_ids or self._rows_of[1] is not snap.metrics \
                or self._rows_of[2] != len(snap.metrics):
            self._rows_of = (snap.metric_ids, snap.metrics, len(snap.metrics), {})
        memo = self._rows_of[3]
        rows = memo.get(metric)
        if rows is None:
            try:
                mid = snap.metrics.index(metric)
            except ValueError:
                rows = np.zeros(0, np.int64)
            else:
                rows = np.nonzero(snap.metric_ids == mid)[0]
            memo[metric] = rows
        return rows

    def observe(self, now: float, snap: Snapshot) -> None:
        raise NotImplementedError


class StaticRulesArm(RuleArm):
    def __init__(self, nodes: Sequence[str], temp_limit_c: float = 85.0) -> None:
        super().__init__("static-rules", nodes)
        self.temp_limit_c = temp_limit_c

    def observe(self, now: float, snap: Snapshot) -> None:
        self.log.cycles += 1
        node_of = self.index.update(snap.labelsets)
        rows = self._rows(snap, "DCGM_FI_DEV_XID_ERRORS")
        hit = rows[snap.values[rows] > 0]
        for r in hit.tolist():
            n = int(node_of[snap.series_ids[r]])
            if n >= 0:
                self.quarantine(self.nodes[n], "node", now, f"static:xid_{int(snap.values[r])}")
        rows = self._rows(snap, "DCGM_FI_DEV_GPU_TEMP")
        hot = rows[snap.values[rows] > self.temp_limit_c]
        for r in hot.tolist():
            n = int(node_of[snap.series_ids[r]])
            if n >= 0:
                self.quarantine(self.nodes[n], "node", now, "static:gpu_temp")


class LivenessArm(RuleArm):
    def __init__(self, nodes: Sequence[str], replicas: dict[str, str], failures: int = 3) -> None:
        super().__init__("liveness-only", nodes)
        node_ix = {nd: i for i, nd in enumerate(nodes)}
        self.replicas = {r: node_ix.get(nd, -1) for r, nd in replicas.items()}
        self.failures = failures
        self.fail_n = np.zeros(len(nodes), np.int64)
        self.rep_fail: dict[str, int] = {r: 0 for r in replicas}
        self.max_gpus = np.zeros(len(nodes), np.int64)

    def observe(self, now: float, snap: Snapshot) -> None:
        self.log.cycles += 1
        node_of = self.index.update(snap.labelsets)
        n = len(self.nodes)
        down = np.zeros(n, bool)
        rows = self._rows(snap, "up")
        if rows.size:
            ix = node_of[snap.series_ids[rows]]
            ok = ix >= 0
            down[ix[ok]] |= snap.values[rows][ok] == 0
        rows = self._rows(snap, "DCGM_FI_DEV_GPU_TEMP")
        ix = node_of[snap.series_ids[rows]]
        gpus = np.bincount(ix[ix >= 0], minlength=n)[:n]
        self.max_gpus = np.maximum(self.max_gpus, gpus)
        lost = (gpus < self.max_gpus) & ~down
        bad = down | lost
        self.fail_n = np.where(bad, self.fail_n + 1, 0)
        for i in np.nonzero(self.fail_n >= self.failures)[0].tolist():
            self.quarantine(self.nodes[i], "node", now, "liveness:gpu_lost" if lost[i] else "liveness:target_down")
        rows = self._rows(snap, "vllm:num_requests_running")
        alive = {self.index.replica_of.get(int(s)) for s in snap.series_ids[rows].tolist()}
        for r, ni in self.replicas.items():
            # a replica whose whole node is down is the node's business (counted there)
            gone = r not in alive and not (ni >= 0 and down[ni])
            self.rep_fail[r] = self.rep_fail[r] + 1 if gone else 0
            if self.rep_fail[r] >= self.failures:
                self.quarantine(r, "replica", now, "liveness:engine_gone")

"""One decision cycle, the same for ``replay``, ``backtest`` and the live controller:
new samples -> rolling history -> score (remediation, and serving for router weights) -> decide ->
persist. The loop holds no clock: each cycle is given its ``now``.

``DecisionLoop.cycle`` is the per-cycle function; ``replay_cycles`` drives it over a recording with the
recording's own clock (samples grouped by scrape time), resuming after the last cycle a store committed.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleethealth.decide.decider import Decider
from fleethealth.decide.state import Decision, DecisionState, Event
from fleethealth.policy import Policy
from fleethealth.signals.history import shape_token
from fleethealth.signals.snapshot import Snapshot

Scorer = Callable[[Snapshot, Policy, float, str], Any]  # (view, policy, now, consumer) -> FleetHealth


def _engine_scorer() -> Scorer:
    """The engine's scorer for one loop: a ``score.Scorer`` of its own (what it keeps between cycles
    serves this loop's stream alone)."""
    from fleethealth.score.scorer import Scorer as EngineScorer

    return EngineScorer().score


def _has_replicas(health: Any) -> bool:
    kinds = getattr(health, "kinds", None)
    if kinds is not None:
        ks = kinds.get("replica")
        return ks is not None and len(ks.names) > 0
    return any(getattr(t, "kind", None) == "replica" for t in getattr(health, "tuples", {}).values())


def _labels_key(health: Any, view: Snapshot, now: float, policy: Policy,
                newest: _NewestTs) -> Hashable | None:
    """The engine's metadata labels come from which series the view holds, and the history says when
    that set is unchanged. Only for a FleetHealth whose labels are read from this very view (a custom
    scorer may derive labels from anything), and only while no sample is too far in the future (the
    engine ignores those now and reads them later, with the same set of series)."""
    meta = getattr(health, "meta", None)
    if getattr(meta, "snap", None) is not view:
        return None
    limit = now + policy.freshness.future_skew_s
    # the history's bound on its view's times spares the pass over them
    if len(view) and view.index_upto(limit) is None and newest(view) > limit:
        return None
    return shape_token(view)


class _NewestTs:
    """A view's newest timestamp (a pass over every row), kept for the last view asked about: a loop
    asks once per cycle at most, and only when the view holds samples too far in the future."""

    def __init__(self) -> None:
        self._last: tuple[Snapshot, float] | None = None  # holds the view: its identity cannot recur

    def __call__(self, view: Snapshot) -> float:
        hit = self._last
        if hit is not None and hit[0] is view:
            return hit[1]
        t = float(view.ts.max())
        self._last = (view, t)
        return t


@dataclass(slots=True)
class CycleResult:
    now: float
    decision: Decision
    health: Any  # the remediation FleetHealth the decision was made on


class DecisionLoop:
    """History + scorer + decider + store. ``store`` may be None (dry run, nothing persisted)."""

    def __init__(self, policy: Policy, store: Any = None, scorer: Scorer | None = None,
                 history: Any = None) -> None:
        from fleethealth.signals.history import SignalHistory

        self.policy = policy
        self.store = store
        self.scorer: Scorer = scorer or _engine_scorer()
        self._newest = _NewestTs()
        # After a label change the old series stays in the view (stale) beside the new one and the newest
        # speaks (score.result._MetaIndex): which is newest may change with no change of the set of series
        # (a rollback to a label set still remembered). Kept for the last labels_key whose labels were
        # decided so: (that key, the series lists, their winners then, the key the decider was given).
        self._by_freshness: tuple[Hashable, frozenset[tuple[int, ...]], tuple[int, ...], Hashable] | None = None
        self.history = history if history is not None else SignalHistory(policy)
        self.decider = Decider(policy)
        # the rest of the fleet's (in service, low confidence) counts for the freeze (Decider.decide's
        # fleet_peers: a shard's controller sets the other shards' before each cycle), and this loop's own
        # from its last decision (what the shard publishes)
        self.fleet_peers: tuple[int, int] = (0, 0)
        self.confidence_counts: tuple[int, int] | None = None
        loaded = store.load() if store is not None else None
        self.state: DecisionState = loaded if loaded is not None else DecisionState()

    @property
    def last_ts(self) -> float | None:
        return self.state.last_ts

    def observe(self, snapshot: Snapshot) -> None:
        """Feed samples without deciding (warming the history up to a resumed cycle)."""
        self.history.add(snapshot)

    def cycle(self, snapshot: Snapshot | None, now: float, events: Sequence[Event] = ()) -> CycleResult:
        if snapshot is not None:
            self.history.add(snapshot)
        view = self.history.view(now)
        health = self.scorer(view, self.policy, now, "remediation")
        serving = self.scorer(view, self.policy, now, "serving") if _has_replicas(health) else None
        labels_key = given = _labels_key(health, view, now, self.policy, self._newest)
        fresh = self._by_freshness
        if labels_key is not None and fresh is not None and fresh[0] == labels_key:
            winners = health.meta.winners(fresh[1])
            if winners != fresh[2]:  # another series now speaks for a relabelled entity: ask again
                given = (labels_key, winners)
                self._by_freshness = (labels_key, fresh[1], winners, given)
            else:
                given = fresh[3]
        decision = self.decider.decide(self.state, health, now, events, serving, labels_key=given,
                                       fleet_peers=self.fleet_peers)
        if labels_key is not None and (fresh is None or fresh[0] != labels_key):
            groups = frozenset(getattr(health.meta, "by_freshness", ()))
            self._by_freshness = (labels_key, groups, health.meta.winners(groups), labels_key) if groups else None
        if self.store is not None:
            self.store.commit(decision)
        self.state = decision.state
        self.confidence_counts = decision.confidence_counts
        return CycleResult(now, decision, health)


def scrape_groups(snapshot: Snapshot, group_s: float = 1.0) -> list[tuple[float, np.ndarray]]:
    """Split a recording into scrapes: sample indices grouped by timestamp, a new group whenever a
    timestamp is more than ``group_s`` after the group's first one. Returns (cycle time = the group's
    last timestamp, indices) in time order."""
    if len(snapshot) == 0:
        return []
    order = np.argsort(snapshot.ts, kind="stable")
    ts = snapshot.ts[order]
    starts = [0]
    first = ts[0]
    # Group boundaries need a scan (each group's start depends on the previous one); it runs over unique
    # timestamps only, a few thousand for a day of 15 s scrapes.
    uniq, first_ix = np.unique(ts, return_index=True)
    for u, i in zip(uniq.tolist(), first_ix.tolist(), strict=True):
        if u - first > group_s:
            starts.append(i)
            first = u
    bounds = starts + [ts.size]
    return [(float(ts[b - 1]), order[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def take(snapshot: Snapshot, idx: np.ndarray, at: float) -> Snapshot:
    return Snapshot(at, snapshot.metrics, snapshot.labelsets, snapshot.metric_ids[idx], snapshot.series_ids[idx],
                    snapshot.values[idx], snapshot.ts[idx], [], [])


def replay_cycles(loop: DecisionLoop, recording: Snapshot, events: Sequence[Event] = (), group_s: float = 1.0,
                  pace: Callable[[], None] | None = None) -> Iterator[CycleResult]:
    """Run the loop over a recording in time order. Scrapes at or before the loop's last committed cycle
    only warm the history (a resumed replay repeats nothing); events are delivered to the first cycle at
    or after their time."""
    done = loop.last_ts
    evs = sorted(events, key=lambda e: e.ts)
    ei = 0
    if recording.issues:
        loop.history.issues.extend(recording.issues)
    for now, idx in scrape_groups(recording, group_s):
        part = take(recording, idx, now)
        due: list[Event] = []
        while ei < len(evs) and evs[ei].ts <= now:
            due.append(evs[ei])
            ei += 1
        if done is not None and now <= done:
            loop.observe(part)
            continue
        yield loop.cycle(part, now, due)
        if pace is not None:
            pace()

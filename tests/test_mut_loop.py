"""The decision loop over a recording (issue 21: decide/loop.py): how samples are cut into scrapes (the
cycle times an operator sees in a replay), which cycle an event reaches, what a resumed replay repeats
(nothing), and that the serving consumer is scored only when there are replicas to weigh.

The scorer here is a custom one (the loop takes any ``Scorer``): it reports what it was asked, so the
tests can say which view and consumer each cycle scored; the store is the real SQLite store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fleethealth.decide.loop import DecisionLoop, replay_cycles, scrape_groups, take
from fleethealth.decide.model import State
from fleethealth.decide.state import Event
from fleethealth.policy import Policy, default_policy
from fleethealth.score.health import HealthTuple
from fleethealth.signals.snapshot import InputIssue, Snapshot, SnapshotBuilder
from fleethealth.store.sqlite import SqliteStore

POLICY = default_policy()


def recording(times: list[float], node: str = "n1") -> Snapshot:
    """One temperature sample per time (in the order given), value = its time, each of another GPU of
    ``node`` (the GPU named by the sample's time): a view holds as many samples as GPUs seen."""
    b = SnapshotBuilder()
    for t in times:
        b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": node, "gpu": f"{t:g}"}, t, t)
    return b.build(max(times) if times else 0.0)


@dataclass
class Health:
    tuples: dict[str, HealthTuple]


@dataclass
class AskingScorer:
    """Scores every node healthy (and a replica when ``replica``) and records (now, consumer, samples)."""

    replica: bool = False
    asked: list[tuple[float, str, int]] = field(default_factory=list)

    def __call__(self, view: Snapshot, policy: Policy, now: float, consumer: str) -> Health:
        self.asked.append((now, consumer, len(view)))
        ts = {"n1": HealthTuple("n1", "node", 0.95, 1.0, "thermal", "min:thermal")}
        if self.replica:
            ts["r1"] = HealthTuple("r1", "replica", 0.9, 1.0, "serving", "min:serving")
        return Health(ts)


def _groups(snap: Snapshot, group_s: float = 1.0) -> list[tuple[float, list[float]]]:
    return [(at, sorted(snap.ts[idx].tolist())) for at, idx in scrape_groups(snap, group_s)]


def test_samples_are_cut_into_scrapes_at_the_group_width_and_each_cycle_runs_at_its_last_sample() -> None:
    snap = recording([15.2, 0.0, 30.0, 1.0, 0.5, 15.0, 1.5])
    # 1.0 is exactly group_s after the group's first sample: still the same scrape; 1.5 starts the next
    assert _groups(snap) == [(1.0, [0.0, 0.5, 1.0]), (1.5, [1.5]), (15.2, [15.0, 15.2]), (30.0, [30.0])]
    # a wider group merges them
    assert _groups(snap, 2.0) == [(1.5, [0.0, 0.5, 1.0, 1.5]), (15.2, [15.0, 15.2]), (30.0, [30.0])]
    assert scrape_groups(Snapshot.empty(0.0)) == []


def test_equal_timestamps_keep_their_recorded_order_within_a_scrape() -> None:
    snap = recording([5.0, 5.0, 5.0, 0.0])
    ((_, first), (at, second)) = scrape_groups(snap)
    assert first.tolist() == [3] and at == 5.0 and second.tolist() == [0, 1, 2]


def test_a_scrape_taken_from_a_recording_holds_its_rows_only_at_the_cycle_time() -> None:
    snap = recording([0.0, 15.0, 30.0])
    part = take(snap, np.array([2, 0]), 31.0)
    assert part.at == 31.0 and part.ts.tolist() == [30.0, 0.0] and part.values.tolist() == [30.0, 0.0]
    assert part.metrics == snap.metrics and part.labelsets == snap.labelsets
    assert part.metric_ids.tolist() == [0, 0] and part.series_ids.tolist() == [2, 0]
    assert part.issues == [] and part.source_errors == []


def _recorded_events(loop: DecisionLoop) -> list[tuple[float, list[float]]]:
    seen: list[tuple[float, list[float]]] = []
    inner = loop.decider.decide

    def decide(state: Any, health: Any, now: float, events: Any, *a: Any, **k: Any) -> Any:
        seen.append((now, [e.ts for e in events]))
        return inner(state, health, now, events, *a, **k)

    loop.decider.decide = decide  # type: ignore[method-assign]
    return seen


def test_an_event_reaches_the_first_cycle_at_or_after_its_time() -> None:
    scorer = AskingScorer()
    loop = DecisionLoop(POLICY, scorer=scorer)
    seen = _recorded_events(loop)
    events = [Event(15.2, "ack", "n1", to="READY"), Event(0.7, "ack", "n1", to="READY"),
              Event(14.0, "ack", "n1", to="READY"), Event(99.0, "ack", "n1", to="READY")]
    paced: list[int] = []
    results = list(replay_cycles(loop, recording([0.0, 1.0, 15.0, 15.2, 30.0]), events,
                                 pace=lambda: paced.append(len(paced))))
    assert [r.now for r in results] == [1.0, 15.2, 30.0]
    assert seen == [(1.0, [0.7]), (15.2, [14.0, 15.2]), (30.0, [])]
    assert paced == [0, 1, 2]  # once after each cycle
    # each cycle scored the history up to it (remediation only: no replicas)
    assert scorer.asked == [(1.0, "remediation", 2), (15.2, "remediation", 4), (30.0, "remediation", 5)]
    assert results[-1].decision.ts == 30.0 and results[-1].health.tuples["n1"].value == 0.95
    assert loop.state is results[-1].decision.state and loop.last_ts == 30.0


def test_a_recordings_input_issues_reach_the_history() -> None:
    snap = recording([0.0])
    snap.issues.append(InputIssue("dump.prom", 7, "not a number", "x"))
    loop = DecisionLoop(POLICY, scorer=AskingScorer())
    list(replay_cycles(loop, snap))
    assert [str(i) for i in loop.history.issues] == ["dump.prom:7: not a number: x"]


def test_a_resumed_replay_repeats_no_cycle_and_scores_on_the_whole_history(tmp_path: Path) -> None:
    db = tmp_path / "state.db"
    rec = recording([0.0, 15.0, 30.0, 45.0])
    first = DecisionLoop(POLICY, store=SqliteStore(db), scorer=AskingScorer())
    done = [r.now for r in replay_cycles(first, recording([0.0, 15.0]))]
    assert done == [0.0, 15.0]
    scorer = AskingScorer()
    resumed = DecisionLoop(POLICY, store=SqliteStore(db), scorer=scorer)
    assert resumed.last_ts == 15.0 and resumed.state.entities["n1"].state == first.state.entities["n1"].state
    seen = _recorded_events(resumed)
    events = [Event(10.0, "ack", "n1", to="READY"), Event(20.0, "ack", "n1", to="READY")]
    again = [r.now for r in replay_cycles(resumed, rec, events)]
    assert again == [30.0, 45.0]
    # the event of a cycle already done is not delivered again; the history was warmed with 0 and 15
    assert seen == [(30.0, [20.0]), (45.0, [])]
    assert scorer.asked == [(30.0, "remediation", 3), (45.0, "remediation", 4)]
    assert SqliteStore(db).load().last_ts == 45.0  # type: ignore[union-attr]


def test_replicas_are_also_scored_for_serving_and_a_dry_run_persists_nothing() -> None:
    scorer = AskingScorer(replica=True)
    loop = DecisionLoop(POLICY, scorer=scorer)
    assert loop.store is None and loop.last_ts is None
    res = loop.cycle(recording([0.0]), 0.0)
    assert scorer.asked == [(0.0, "remediation", 1), (0.0, "serving", 1)]
    assert res.now == 0.0 and set(res.decision.state.entities) == {"n1", "r1"}
    loop.observe(recording([5.0]))
    loop.cycle(None, 10.0)
    assert scorer.asked[2:] == [(10.0, "remediation", 2), (10.0, "serving", 2)]
    assert loop.state.entities["r1"].state in (State.STARTING, State.WARMING, State.READY)

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


def test_samples_of_one_time_keep_their_recorded_order_in_a_large_scrape() -> None:
    # 64 samples of one scrape time after an earlier one: the cycle takes them in the order recorded
    snap = recording([0.0] + [7.0] * 64)
    ((_, first), (_, second)) = scrape_groups(snap)
    assert first.tolist() == [0] and second.tolist() == list(range(1, 65))


def _engine_asking() -> tuple[list[str], Any]:
    from fleethealth.score.scorer import Scorer as EngineScorer

    asked: list[str] = []
    engine = EngineScorer()

    def score(view: Snapshot, policy: Policy, now: float, consumer: str) -> Any:
        asked.append(consumer)
        return engine.score(view, policy, now, consumer)

    return asked, score


def test_the_engine_scores_serving_only_for_a_fleet_with_replicas() -> None:
    b = SnapshotBuilder()
    b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "n1", "gpu": "0", "UUID": "GPU-1"}, 50.0, 0.0)
    asked, score = _engine_asking()
    loop = DecisionLoop(POLICY, scorer=score)
    loop.cycle(b.build(0.0), 0.0)
    assert asked == ["remediation"]
    lab = {"replica": "r1", "model_name": "llama", "build": "v1"}
    b2 = SnapshotBuilder()
    b2.add("fleethealth_replica_requests_total", lab, 100.0, 15.0)
    b2.add("fleethealth_replica_errors_total", lab, 0.0, 15.0)
    loop.cycle(b2.build(15.0), 15.0)
    assert asked == ["remediation", "remediation", "serving"]
    assert "r1" in loop.state.entities


def test_a_sample_from_the_future_is_read_when_its_time_comes_with_its_labels() -> None:
    """A node whose first sample is stamped an hour ahead (clock skew) is ignored now and read at its
    time, with its own labels: the loop does not reuse the labels of the cycles before it."""
    def scrape(at: float, extra: bool) -> Snapshot:
        b = SnapshotBuilder()
        b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "n1", "gpu": "0", "UUID": "GPU-1"}, 50.0, at)
        b.add("fleethealth_node_info", {"node": "n1", "pool": "p1"}, 1.0, at)
        if extra:
            b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "n9", "gpu": "0", "UUID": "GPU-9"}, 50.0, 3600.0)
            b.add("fleethealth_node_info", {"node": "n9", "pool": "p9"}, 1.0, 3600.0)
        return b.build(at)

    asked, score = _engine_asking()
    loop = DecisionLoop(POLICY, scorer=score)
    loop.cycle(scrape(0.0, True), 0.0)
    assert "n9" not in loop.state.entities
    for k in range(1, 4):
        loop.cycle(scrape(15.0 * k, False), 15.0 * k)
    loop.cycle(scrape(3600.0, False), 3600.0)
    assert loop.state.entities["n9"].labels.get("pool") == "p9"
    assert loop.state.entities["n1"].labels.get("pool") == "p1"


@dataclass
class ListScorer:
    """A scorer that hands back a plain list of tuples (the decider accepts one)."""

    asked: list[str] = field(default_factory=list)

    def __call__(self, view: Snapshot, policy: Policy, now: float, consumer: str) -> list[HealthTuple]:
        self.asked.append(consumer)
        return [HealthTuple("n1", "node", 0.95, 1.0, "thermal", "min:thermal")]


def test_a_scorer_that_returns_a_plain_list_of_tuples_is_decided_on() -> None:
    scorer = ListScorer()
    loop = DecisionLoop(POLICY, scorer=scorer)
    loop.cycle(recording([0.0]), 0.0)
    assert scorer.asked == ["remediation"] and loop.state.entities["n1"].last_value == 0.95


def test_a_given_history_and_policy_are_the_loops() -> None:
    from fleethealth.signals.history import SignalHistory

    pol = POLICY.model_copy(update={"fleet": POLICY.fleet.model_copy(update={"min_entities": 1})})
    assert pol.version_tag != POLICY.version_tag
    history = SignalHistory(pol)
    history.add(recording([0.0, 5.0]))
    scorer = AskingScorer()
    loop = DecisionLoop(pol, scorer=scorer, history=history)
    assert loop.history is history
    res = loop.cycle(recording([10.0]), 10.0)
    assert scorer.asked == [(10.0, "remediation", 3)]  # the samples already in the given history count
    assert res.decision.state.entities["n1"].state == State.READY

    def gate(view: Snapshot, policy: Policy, now: float, consumer: str) -> list[HealthTuple]:
        return [HealthTuple("n1", "node", 0.0, 1.0, "xid", "gate:xid")]

    loop.scorer = gate
    bad = loop.cycle(None, 25.0).decision
    assert bad.intents and {i.policy_version for i in bad.intents} == {pol.version_tag}
    assert {t.policy_version for t in bad.transitions} == {pol.version_tag}


def test_replay_cuts_scrapes_at_the_group_width_it_is_given() -> None:
    loop = DecisionLoop(POLICY, scorer=AskingScorer())
    assert [r.now for r in replay_cycles(loop, recording([0.0, 1.5, 15.0]), group_s=2.0)] == [1.5, 15.0]


def test_the_other_shards_low_confidence_freezes_this_shards_loop() -> None:
    """A sharded controller sets ``fleet_peers`` (the other shards' entities in service and how many of
    them read low confidence) before each cycle: telemetry lost elsewhere freezes remediation here too;
    ``confidence_counts`` are this loop's own, for the other shards."""
    scorer = AskingScorer()
    loop = DecisionLoop(POLICY, scorer=scorer)
    for k in range(3):
        loop.cycle(recording([15.0 * k]), 15.0 * k)
    assert loop.fleet_peers == (0, 0) and not loop.state.frozen
    assert loop.confidence_counts == (1, 0)
    loop.fleet_peers = (100, 90)
    res = loop.cycle(recording([45.0]), 45.0)
    assert loop.state.frozen and [i.reason for i in res.decision.intents if i.kind.value == "fleet_alert"] == [
        "fleet_confidence_low"]
    assert loop.confidence_counts == (1, 0)  # its own, not the fleet's

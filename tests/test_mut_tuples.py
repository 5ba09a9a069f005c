"""The serving consumer's replica tuples as the router reads them (issue 21: decide/tuples.py): the
decider reads each replica's serving value, confidence and reason from the engine's columns, reuses last
cycle's tuple for a row unchanged bit for bit, and a router weight follows the serving score, cycle by
cycle, exactly as when every tuple is built afresh."""

from __future__ import annotations

from fleethealth.decide.decider import Decider
from fleethealth.decide.model import IntentKind
from fleethealth.decide.state import DecisionState
from fleethealth.decide.tuples import _serving_replicas
from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POL = default_policy()
NOW = 1_767_225_600.0


def _replicas(now: float, burning_from: float) -> Snapshot:
    """Three replicas' request and error counters over the hour before ``now``; r-burn's errors run at
    20x the budget from ``burning_from`` on."""
    b = SnapshotBuilder()
    for k in range(0, 3601, 60):
        t = now - 3600 + k
        for name in ("r-good", "r-burn", "r-slow"):
            lab = {"replica": name, "model_name": "llama", "build": "v1"}
            reqs = 10.0 * (t - NOW + 7200)
            bad = 0.2 * 10.0 * max(0.0, t - burning_from) if name == "r-burn" else 0.0
            fast = 0.96 * reqs if name == "r-slow" else reqs
            b.add("fleethealth_replica_requests_total", lab, reqs, t)
            b.add("fleethealth_replica_errors_total", lab, bad, t)
            b.add("vllm:time_to_first_token_seconds_count", lab, reqs, t)
            b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "2.0"}, fast, t)
            b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": "+Inf"}, reqs, t)
    return b.build(now)


def test_serving_tuples_from_the_columns_and_reused_when_unchanged() -> None:
    fh = score_snapshot(_replicas(NOW, NOW - 1800), POL, NOW, consumer="serving")
    cache: list = []
    first = _serving_replicas(fh, cache)
    plain = _serving_replicas(fh)
    assert set(first) == {"r-good", "r-burn", "r-slow"} == set(plain)
    for name, t in first.items():
        want = fh.tuples[name]
        assert (t.entity, t.kind, t.value, t.confidence, t.reason, t.ts) == (
            name, "replica", want.value, want.confidence, want.reason, NOW)
        assert (plain[name].value, plain[name].reason) == (want.value, want.reason)
    assert first["r-burn"].value == 0.0 and first["r-good"].value == 1.0
    # the same columns again: the same tuple objects; a changed row: a new tuple with the new value
    again = _serving_replicas(fh, cache)
    assert all(again[n] is first[n] for n in first)
    later = score_snapshot(_replicas(NOW + 60, NOW - 1800), POL, NOW + 60, consumer="serving")
    moved = _serving_replicas(later, cache)
    for name, t in moved.items():
        assert (t.value, t.confidence, t.reason) == (later.tuples[name].value, later.tuples[name].confidence,
                                                     later.tuples[name].reason)
    assert moved["r-good"] is first["r-good"] or moved["r-good"].value == first["r-good"].value


def test_router_weights_follow_the_serving_score_with_and_without_reuse() -> None:
    fast, plain = Decider(POL), Decider(POL, fast=False)
    sa, sb = DecisionState(), DecisionState()
    weights: dict[str, list[float]] = {}
    for k in range(12):
        now = NOW + 60 * k
        snap = _replicas(now, NOW + 300)  # r-burn starts burning five minutes in
        rem = score_snapshot(snap, POL, now)
        srv = score_snapshot(snap, POL, now, consumer="serving")
        da = fast.decide(sa, rem, now, (), srv)
        db = plain.decide(sb, rem, now, (), srv)
        assert [i.to_dict() for i in da.intents] == [i.to_dict() for i in db.intents]
        sa, sb = da.state, db.state
        for i in da.intents:
            if i.kind == IntentKind.SET_WEIGHT:
                weights.setdefault(i.entity, []).append(i.params["weight"])
    # r-burn's weight steps down as its error budget burns (0.0 while starting, then 1.0 before the burn)
    assert weights["r-burn"][:2] == [0.0, 1.0]
    assert weights["r-burn"][1:] == sorted(weights["r-burn"][1:], reverse=True)
    assert weights["r-good"][-1] == 1.0  # 0 while starting, then its serving score
    assert weights["r-burn"][-1] < 1.0

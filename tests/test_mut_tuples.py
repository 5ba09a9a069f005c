"""The serving consumer's replica tuples as the router reads them (issue 21: decide/tuples.py): the
decider reads each replica's serving value, confidence and reason from the engine's columns, reuses last
cycle's tuple for a row unchanged bit for bit, and a router weight follows the serving score, cycle by
cycle, exactly as when every tuple is built afresh. Below: the decider's node, replica and flagged-GPU
tuples read from the engine's columns and reused from one cycle to the next read exactly as freshly built
ones, and health handed over as plain tuples decides as the engine's columns."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fleethealth.decide.decider import Decider
from fleethealth.decide.model import IntentKind
from fleethealth.decide.state import DecisionState
from fleethealth.decide.tuples import _lifecycle_and_flagged, _serving_replicas, node_of
from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.score.health import HealthTuple
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from test_decide_fast_equiv import KS, Health, Meta

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


# --- the decider's tuples from the engine's columns, reused across cycles (decide/tuples.py) -------------------
# A columnar FleetHealth stand-in (tests/test_decide_fast_equiv.py's), whose metadata labels count the times the
# engine is asked for them: reuse is what keeps a 100k-GPU cycle cheap, and a reused tuple must read exactly as a
# freshly built one (value, reason, worst category, worst member, flags, labels).


class _Fleet(Health):
    @property
    def tuples(self) -> dict[str, HealthTuple]:  # the decider only checks it is there (the fake's builds them all)
        return {}


def _fleet(now: float, *, n2: tuple[float, float, int, str] = (1.0, 1.0, 0, "min:hardware"),
           n2_member: str = "n2/gpu0", gpu_reason: str = "gate:xid", gpu_flags: tuple[str, ...] = ("xid:79",),
           node_flags: tuple[str, ...] = ("row_remap_pending",)) -> Health:
    """Nodes n1..n3 (n1 flagged), one replica, two GPUs of n1 (gpu0 flagged): n2's row is the one that moves."""
    v2, c2, w2, r2 = n2
    node = KS("node", ["n1", "n2", "n3"], np.array([0.9, v2, 1.0]), np.array([1.0, c2, 1.0]),
              np.array([1, w2, 0], np.int64), ["min:performance", r2, "min:hardware"], {0: list(node_flags)},
              worst_member={0: "n1/gpu1", 1: n2_member})
    rep = KS("replica", ["r1"], np.array([1.0]), np.array([1.0]), np.array([0], np.int64), ["min:hardware"], {})
    gpu = KS("gpu", ["n1/gpu0", "n1/gpu1"], np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.array([0, 0], np.int64),
             [gpu_reason, "min:hardware"], {0: list(gpu_flags)})
    return _Fleet({"node": node, "replica": rep, "gpu": gpu}, now)


class _Counted:
    """Counts the engine's label look-ups (the cost the memo and the row cache save)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        orig = Meta.labels

        def labels(meta: Meta, kind: str, i: int) -> dict[str, str]:
            self.n += 1
            return orig(meta, kind, i)

        monkeypatch.setattr(Meta, "labels", labels)


def _read(t: HealthTuple) -> tuple:
    return (t.entity, t.kind, t.value, t.confidence, t.worst, t.reason, dict(t.labels), t.worst_member, t.flags)


def _fresh(h: Health) -> dict[str, tuple]:
    life, flagged = _lifecycle_and_flagged(h)
    return {t.entity: _read(t) for t in life + flagged}


@pytest.mark.parametrize("with_memo", [True, False])
def test_a_steady_fleet_hands_back_the_same_tuples_and_a_moved_row_reads_as_new(
        with_memo: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = _Counted(monkeypatch)
    memo: dict = {} if with_memo else None  # type: ignore[assignment]
    rows: dict = {}
    life, flagged = _lifecycle_and_flagged(_fleet(NOW), memo, rows)
    assert [t.entity for t in life] == ["n1", "n2", "n3", "r1"] and [t.entity for t in flagged] == ["n1/gpu0"]
    assert {t.entity: _read(t) for t in life + flagged} == _fresh(_fleet(NOW))
    first = {t.entity: t for t in life + flagged}
    assert {t.ts for t in life + flagged} == {NOW}  # read at this cycle
    # the same columns next cycle: every tuple is last cycle's object, and with a memo no label is asked for
    counted.n = 0
    life, flagged = _lifecycle_and_flagged(_fleet(NOW + 15), memo, rows)
    # (without a memo the labels may have changed: the flagged GPUs are built afresh)
    assert [t.entity for t in life + flagged if t is not first[t.entity]] == ([] if with_memo else ["n1/gpu0"])
    if with_memo:
        assert counted.n == 0
    # n2 goes dark (no data: no worst category), the flagged GPU's reason and flags change: new tuples that read
    # as freshly built ones; the rest are still last cycle's objects, and the memo still answers the labels
    counted.n = 0
    moved = _fleet(NOW + 30, n2=(float("nan"), 0.0, -1, "no_fresh_data"), gpu_reason="gate:xid:94",
                   gpu_flags=("xid:94",))
    life, flagged = _lifecycle_and_flagged(moved, memo, rows)
    asked = counted.n
    got = {t.entity: t for t in life + flagged}
    assert {n: _read(t) for n, t in got.items()} == _fresh(moved)
    assert (got["n2"].value, got["n2"].worst, got["n2"].reason) == (None, None, "no_fresh_data")
    assert got["n2"].ts == got["n1/gpu0"].ts == NOW + 30
    assert (got["n1/gpu0"].reason, got["n1/gpu0"].flags) == ("gate:xid:94", ("xid:94",))
    assert got["n2"] is not first["n2"] and got["n1/gpu0"] is not first["n1/gpu0"]
    assert all(got[n] is first[n] for n in ("n1", "n3", "r1"))
    if with_memo:
        assert asked == 0
    # and that state again: the new tuples are kept in turn
    again = _lifecycle_and_flagged(_fleet(NOW + 45, n2=(float("nan"), 0.0, -1, "no_fresh_data"),
                                          gpu_reason="gate:xid:94", gpu_flags=("xid:94",)), memo, rows)
    assert all(t is got[t.entity] for t in again[0] + (again[1] if with_memo else []))


def test_a_node_whose_worst_member_or_flags_alone_change_reads_the_new_ones() -> None:
    memo: dict = {}
    rows: dict = {}
    life, _ = _lifecycle_and_flagged(_fleet(NOW), memo, rows)
    assert life[1].worst_member == "n2/gpu0" and life[0].flags == ("row_remap_pending",)
    h = _fleet(NOW + 15, n2_member="n2/gpu5", node_flags=("recovery_action:GPU_RESET",))
    life, _ = _lifecycle_and_flagged(h, memo, rows)
    assert life[1].worst_member == "n2/gpu5"  # the operator is pointed at the GPU that is now the worst
    assert life[0].flags == ("recovery_action:GPU_RESET",)
    assert {t.entity: _read(t) for t in life} == {k: v for k, v in _fresh(h).items() if k != "n1/gpu0"}


def test_health_as_a_plain_mapping_of_tuples_decides_as_the_engine_columns() -> None:
    snap = _replicas(NOW, NOW - 1800)
    rem = score_snapshot(snap, POL, NOW)
    srv = score_snapshot(snap, POL, NOW, consumer="serving")
    a = Decider(POL).decide(DecisionState(), rem, NOW, (), srv)
    b = Decider(POL).decide(DecisionState(), dict(rem.tuples), NOW, (), dict(srv.tuples))
    c = Decider(POL, fast=False).decide(DecisionState(), list(rem.tuples.values()), NOW, (), srv.tuples)
    weights = {i.entity: i.params["weight"] for i in a.intents if i.kind == IntentKind.SET_WEIGHT}
    assert set(weights) == {"r-good", "r-burn", "r-slow"}
    assert [i.to_dict() for i in b.intents] == [i.to_dict() for i in a.intents] == [i.to_dict() for i in c.intents]


def test_serving_tuples_carry_only_what_the_router_reads_and_stay_reused_after_a_change() -> None:
    fh = score_snapshot(_replicas(NOW, NOW - 1800), POL, NOW, consumer="serving")
    for t in _serving_replicas(fh).values():  # no metadata labels, no worst category: not read, not fetched
        assert (t.labels, t.worst, t.flags) == ({}, None, ())
    cache: list = []
    _serving_replicas(fh, cache)
    later = score_snapshot(_replicas(NOW + 60, NOW - 1800), POL, NOW + 60, consumer="serving")
    moved = _serving_replicas(later, cache)
    assert all((t.labels, t.worst) == ({}, None) for t in moved.values())
    assert all(t is moved[n] for n, t in _serving_replicas(later, cache).items())


def test_a_gpu_tuple_labelled_only_by_lowercase_hostname_belongs_to_that_node() -> None:
    t = HealthTuple(entity="GPU-5f1c", kind="gpu", value=0.0, confidence=1.0, worst=None, reason="gate:xid",
                    labels={"hostname": "node-7"}, ts=NOW)
    assert node_of(t) == "node-7"
    assert node_of(replace(t, labels={"node": "node-8", "hostname": "node-7"})) == "node-8"
    assert node_of(replace(t, labels={"Hostname": "node-9"})) == "node-9"  # DCGM's exporter label
    assert node_of(replace(t, entity="node-7", kind="node", labels={"Hostname": "node-7.dc1"})) == "node-7"
    assert node_of(replace(t, entity="pool-a/node-7/gpu3", labels={})) == "pool-a/node-7"
    assert node_of(HealthTuple(entity="node-7/gpu3", kind="gpu", value=0.0, confidence=1.0, worst=None,
                               reason="gate:xid", ts=NOW)) == "node-7"


def test_a_replica_whose_error_budget_starts_burning_gets_a_new_serving_tuple_and_keeps_it() -> None:
    cache: list = []
    calm = _serving_replicas(score_snapshot(_replicas(NOW, NOW + 300), POL, NOW, consumer="serving"), cache)
    burning = score_snapshot(_replicas(NOW + 60, NOW - 900), POL, NOW + 60, consumer="serving")
    moved = _serving_replicas(burning, cache)
    assert calm["r-burn"].value == 1.0 and moved["r-burn"].value is not None and moved["r-burn"].value < 1.0
    for name, t in moved.items():  # the router reads the new cycle's values, reasons and confidences
        want = burning.tuples[name]
        assert (t.entity, t.value, t.confidence, t.reason, t.labels, t.worst) == (
            name, want.value, want.confidence, want.reason, {}, None)
    assert moved["r-good"] is calm["r-good"]  # unchanged: last cycle's tuple
    assert all(t is moved[n] for n, t in _serving_replicas(burning, cache).items())


def test_router_weights_follow_a_serving_mapping_not_the_remediation_score() -> None:
    decider, state = Decider(POL), DecisionState()
    weights: dict[str, list[float]] = {}
    for k in range(3):
        now = NOW + 60 * k
        snap = _replicas(now, NOW - 1800)
        rem = score_snapshot(snap, POL, now)
        serving = {n: replace(t, value=0.42) for n, t in score_snapshot(snap, POL, now, consumer="serving").tuples.items()
                   if t.kind == "replica"}
        d = decider.decide(state, rem, now, (), serving)
        state = d.state
        for i in d.intents:
            if i.kind == IntentKind.SET_WEIGHT:
                weights.setdefault(i.entity, []).append(i.params["weight"])
    assert weights["r-good"][-1] == 0.42 and rem.tuples["r-good"].value == 1.0


class _Replay:
    """A recorded FleetHealth's tuples (no engine columns), as a replay or a test hands them over."""

    def __init__(self, tuples: dict[str, HealthTuple]) -> None:
        self.tuples = tuples

    def by_kind(self, kind: str) -> list[HealthTuple]:
        return [t for t in self.tuples.values() if t.kind == kind]


def test_a_health_source_without_engine_columns_decides_as_the_engine() -> None:
    snap = _replicas(NOW, NOW - 1800)
    rem = score_snapshot(snap, POL, NOW)
    srv = score_snapshot(snap, POL, NOW, consumer="serving")
    a = Decider(POL).decide(DecisionState(), rem, NOW, (), srv)
    b = Decider(POL).decide(DecisionState(), _Replay(dict(rem.tuples)), NOW, (), _Replay(dict(srv.tuples)))
    assert [i.to_dict() for i in b.intents] == [i.to_dict() for i in a.intents]
    assert a.intents


def test_a_node_joining_asks_the_engine_for_its_labels_only(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = _Counted(monkeypatch)
    memo: dict = {}
    rows: dict = {}
    _lifecycle_and_flagged(_fleet(NOW), memo, rows)
    grown = _fleet(NOW + 15)
    ks = grown.kinds["node"]
    grown.kinds["node"] = KS("node", ks.names + ["n4"], np.append(ks.value, 1.0), np.append(ks.confidence, 1.0),
                             np.append(ks.worst, 0), ks.reason + ["min:hardware"], ks.flags,
                             worst_member=ks.worst_member)
    counted.n = 0
    life, _ = _lifecycle_and_flagged(grown, memo, rows)
    assert counted.n == 1 and [t.entity for t in life] == ["n1", "n2", "n3", "n4", "r1"]
    assert life[3].labels == {"pool": "p2", "tp_group": "tp3", "driver_version": "535"}


def test_a_cycle_of_plain_serving_tuples_leaves_the_column_reuse_intact() -> None:
    fh = score_snapshot(_replicas(NOW, NOW - 1800), POL, NOW, consumer="serving")
    cache: list = []
    first = _serving_replicas(fh, cache)
    replayed = _serving_replicas(_Replay(dict(fh.tuples)), cache)  # e.g. a replayed cycle in between
    assert {n: t.value for n, t in replayed.items()} == {n: t.value for n, t in first.items()}
    assert all(t is first[n] for n, t in _serving_replicas(fh, cache).items())


def test_plain_tuples_name_the_flagged_gpus_as_the_engine_columns_do() -> None:
    h = _fleet(NOW)
    plain = {t.entity: t for k in ("node", "replica", "gpu") for t in h.by_kind(k)}
    life, flagged = _lifecycle_and_flagged(plain)
    assert [t.entity for t in flagged] == ["n1/gpu0"] == [t.entity for t in _lifecycle_and_flagged(h)[1]]
    assert flagged[0].flags == ("xid:79",) and [t.entity for t in life] == ["n1", "n2", "n3", "r1"]


def test_the_plain_decider_reads_light_tuples_from_the_engine() -> None:
    """Without reuse the decider still builds no category maps or per-signal details (most of a cycle's cost
    at 100k GPUs): the engine's full tuples carry them, the decider's carry the rest the same."""
    rem = score_snapshot(_replicas(NOW, NOW - 1800), POL, NOW)
    life, _ = _lifecycle_and_flagged(rem)
    assert life and {t.entity for t in life} == {n for n, t in rem.tuples.items() if t.kind in ("node", "replica")}
    for t in life:
        full = rem.tuples[t.entity]
        assert full.categories and (t.categories, t.details) == ({}, ())
        assert (t.value, t.confidence, t.worst, t.reason, dict(t.labels)) == (
            full.value, full.confidence, full.worst, full.reason, dict(full.labels))


def test_a_serving_replica_without_data_reads_unknown_not_a_number() -> None:
    ks = KS("replica", ["r1", "r2"], np.array([np.nan, 0.8]), np.array([0.0, 1.0]), np.array([-1, 0], np.int64),
            ["no_fresh_data", "gmean:serving"], {})
    caches: tuple[list | None, ...] = (None, [])
    for cache in caches:
        got = _serving_replicas(Health({"replica": ks}, NOW), cache)
        assert (got["r1"].value, got["r1"].reason, got["r2"].value) == (None, "no_fresh_data", 0.8)


def test_columns_the_light_path_cannot_read_fall_back_to_the_engine_tuples() -> None:
    h = _fleet(NOW)
    h.kinds["node"].value = list(h.kinds["node"].value)  # type: ignore[assignment]  # no .tolist(): not ndarray
    life, flagged = _lifecycle_and_flagged(h)
    assert {t.entity: _read(t) for t in life + flagged} == _fresh(_fleet(NOW))

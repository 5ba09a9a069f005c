"""A fleet's first decision (issue 19: every node new at once) answers as before: quiet nodes take their
step in one go (``Decider._quiet_node``), labels are asked for in one batch (``_MetaIndex.labels_many``,
``decide.tuples._ask_labels``), and the decisions, intents and state are those of the plain decider."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.decide.decider import Decider
from fleethealth.decide.lifecycle import Timer
from fleethealth.decide.model import State
from fleethealth.decide.state import DecisionState, EntityLifecycle, Event
from fleethealth.decide.tuples import _lifecycle_and_flagged
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.history import SignalHistory
from test_decide_fast_equiv import GPUS, NODES, POL, REPLICAS, Health, _columns, cycle, row
from test_decide_fastpath import POLICY, scrape

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _kinds(rows: dict[str, Any], absent: set[str] = frozenset()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "node": _columns("node", [n for n in NODES if n not in absent], rows),
        "replica": _columns("replica", [r for r in REPLICAS if r not in absent], rows),
        "gpu": _columns("gpu", GPUS, rows),
    }


@SETTINGS
@given(first=st.fixed_dictionaries({n: row for n in NODES + REPLICAS + GPUS}),
       known=st.dictionaries(st.sampled_from(NODES), st.tuples(st.one_of(st.none(), st.floats(0.0, 1.0)),
                                                               st.sampled_from(["min:hardware", "gate:xid"]),
                                                               st.sampled_from(["READY", "QUARANTINED"]))),
       script=st.lists(cycle, max_size=6))
def test_a_first_decision_with_any_rows_answers_as_the_plain_decider(
        first: dict[str, Any], known: dict[str, Any], script: list[dict[str, Any]]) -> None:
    """Every entity's first row drawn (quiet and not), some nodes already known from an earlier run (any
    last value, READY or isolated: a quiet node's step taken early must not change what a group-mate's
    veto reads of it), then a few cycles as the fast-path property test has them."""
    sf = DecisionState()
    for n, (v, why, st_) in known.items():
        sf.entities[n] = EntityLifecycle(n, "node", State(st_), 0.0, last_value=v, last_reason=why,
                                         last_confidence=0.2, labels={"tp_group": "tp1"})
    sp = sf.copy()
    fast, plain = Decider(POL), Decider(POL, fast=False)
    rows = dict(first)
    t = 1_000.0
    steps = [{"rows": {}, "serving": {}, "absent": set(), "events": [], "dt": 15.0, "no_key": False,
              "rollout": None}, *script]
    for step in steps:
        t += step["dt"]
        rows.update(step["rows"])
        kinds = _kinds(rows, step["absent"])
        key = None if step["no_key"] else tuple(kinds["node"].names + kinds["replica"].names)
        events = [Event(t, k, e, passed=p, to=to) for k, e, p, to in step["events"]]
        before = sf.to_dict()
        df = fast.decide(sf, Health(kinds, t), t, events, labels_key=key)
        dp = plain.decide(sp, Health(kinds, t), t, events, labels_key=key)
        assert sf.to_dict() == before  # the input state is not modified
        assert [x.to_dict() for x in df.transitions] == [x.to_dict() for x in dp.transitions]
        assert [x.to_dict() for x in df.intents] == [x.to_dict() for x in dp.intents]
        assert df.state.to_dict() == dp.state.to_dict()
        sf, sp = df.state, dp.state


def test_a_healthy_fleet_s_first_decision_steps_no_node(monkeypatch: Any) -> None:
    """Every node new and healthy: none goes through the lifecycle step, and the state is the plain one's
    (each node READY, its reading and labels recorded); a known node with a low last reading is stepped."""
    rows = {n: (0.95, 1.0, "min:hardware", ()) for n in NODES + REPLICAS + GPUS}
    stepped: list[str] = []
    orig = Decider._step_entity

    def counting(self: Decider, c: Any, es: EntityLifecycle, *a: Any) -> None:
        stepped.append(es.entity)
        orig(self, c, es, *a)

    monkeypatch.setattr(Decider, "_step_entity", counting)
    state = DecisionState()
    state.entities["n4"] = EntityLifecycle("n4", "node", State.READY, 0.0, last_value=0.3,
                                           last_confidence=0.2)
    df = Decider(POL).decide(state, Health(_kinds(rows), 100.0), 100.0, labels_key="k")
    fast_stepped = [e for e in stepped if e in NODES]
    dp = Decider(POL, fast=False).decide(state, Health(_kinds(rows), 100.0), 100.0, labels_key="k")
    assert fast_stepped == ["n4"]
    assert df.state.to_dict() == dp.state.to_dict()
    for n in NODES:
        es = df.state.entities[n]
        assert (es.state, es.last_value, es.last_known_ts) == (State.READY, 0.95, 100.0)
        assert es.labels == dp.state.entities[n].labels and es.labels["pool"]
    assert state.entities["n4"].last_value == 0.3  # the caller's state untouched


def _engine_health(cycles: int = 3) -> Any:
    """The engine's FleetHealth of a small fleet whose n1 was upgraded (two driver series disagree: the
    newest speaks) and whose n2 moved TP group."""
    nodes = {f"n{i}": list(range(3)) for i in range(4)}
    hist = SignalHistory(POLICY)
    for c in range(cycles):
        drv = {n: ("560" if (n == "n1" and c >= 1) else "550") for n in nodes}
        hist.add(scrape(15.0 * c, drv, nodes, temp=50.0 + c, tp={"n2": "tp-moved"} if c >= 2 else {}))
    t = 15.0 * (cycles - 1)
    return score_snapshot(hist.view(t), POLICY, t)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(asks=st.lists(st.tuples(st.sampled_from(["node", "gpu"]), st.lists(st.integers(0, 11), max_size=14)),
                     min_size=1, max_size=4))
def test_labels_many_answers_as_labels_row_by_row(asks: list[tuple[str, list[int]]]) -> None:
    """Any rows, in any order, repeated, of either kind, asked in any sequence of batches: the same dicts as
    ``labels`` asked row by row of a fresh result (driver change and info labels included)."""
    ref = _engine_health()
    got = _engine_health()
    for kind, rows in asks:
        n = len(got.kinds[kind].names)
        rows = [r % n for r in rows]
        many = got.meta.labels_many(kind, rows)
        assert many == [ref.meta.labels(kind, r) for r in rows]
        assert all(a is got.meta.labels(kind, r) for a, r in zip(many, rows, strict=True))  # cached, same dicts
    node = ref.kinds["node"].names.index("n1")
    assert ref.meta.labels("node", node)["driver_version"] == "560"  # the newest series speaks
    assert ref.meta.labels("node", ref.kinds["node"].names.index("n2"))["tp_group"] == "tp-moved"


@given(memo=st.booleans(), reuse=st.booleans())
@settings(max_examples=8, deadline=None)
def test_tuples_from_batched_labels_read_as_the_row_by_row_ones(memo: bool, reuse: bool) -> None:
    """The decider's lifecycle tuples, built with the batched labels (with or without a label memo and a
    row cache), carry the labels ``labels`` gives row by row."""
    h, ref = _engine_health(), _engine_health()
    life, _ = _lifecycle_and_flagged(h, {} if memo else None, {} if reuse else None)
    names = {k: list(ref.kinds[k].names) for k in ("node", "replica")}
    assert [t.entity for t in life] == names["node"] + names["replica"]
    for t in life:
        assert t.labels == ref.meta.labels(t.kind, names[t.kind].index(t.entity))


class _OneGroup(Health):
    """Every node in TP group tpA."""

    def __init__(self, kinds: dict[str, Any], now: float) -> None:
        super().__init__(kinds, now)
        self.meta.labels = lambda kind, i: {"tp_group": "tpA", "pool": "p1"}  # type: ignore[method-assign]


def test_a_quiet_node_with_a_low_last_reading_is_stepped_in_order() -> None:
    """n2 wants quarantine while its group-mate n1 is isolated; whether that is its own fault depends on
    what n3 (same group, same reason) read last. n3 reads healthy now but read low (unusable) before: the
    plain decider steps n2 first, so n2's veto reads n3's low last reading and holds n2. Taking n3's step
    early would let n2 go; the quiet path leaves such a node to its step."""
    rows = {n: (0.95, 1.0, "min:performance", ()) for n in NODES + REPLICAS + GPUS}
    rows["n2"] = (0.1, 1.0, "min:performance", ())
    state = DecisionState()
    lbl = {"tp_group": "tpA", "pool": "p1"}
    state.entities["n1"] = EntityLifecycle("n1", "node", State.QUARANTINED, 0.0, labels=dict(lbl))
    state.entities["n2"] = EntityLifecycle(
        "n2", "node", State.READY, 0.0, labels=dict(lbl), last_value=0.1, last_confidence=1.0,
        last_reason="min:performance", last_known_ts=985.0,
        timers={k: Timer(1e6, 985.0) for k in ("below_quarantine", "below_degraded")})
    state.entities["n3"] = EntityLifecycle("n3", "node", State.READY, 0.0, labels=dict(lbl),
                                           last_value=0.2, last_confidence=0.2, last_reason="min:performance")
    df = Decider(POL).decide(state, _OneGroup(_kinds(rows), 1000.0), 1000.0, labels_key="k")
    dp = Decider(POL, fast=False).decide(state, _OneGroup(_kinds(rows), 1000.0), 1000.0, labels_key="k")
    assert df.state.entities["n2"].blocked == "tp_group:tpA"  # held: n3 read low too when n2 was stepped
    assert [x.to_dict() for x in df.intents] == [x.to_dict() for x in dp.intents]
    assert df.state.to_dict() == dp.state.to_dict()


def test_a_flag_storm_answers_as_the_plain_decider_cycle_after_cycle() -> None:
    """Every GPU flagged from the second cycle on (Xid 79, a recovery action on some), held for cycles: the
    flagged tuples and their per-node flags kept from cycle to cycle answer as the plain decider does, and a
    GPU whose flags change is read anew."""
    rows: dict[str, Any] = {n: (0.95, 1.0, "min:hardware", ()) for n in NODES + REPLICAS + GPUS}
    fast, plain = Decider(POL), Decider(POL, fast=False)
    sf, sp = DecisionState(), DecisionState()
    t = 1_000.0
    for cycle_no in range(7):
        if cycle_no == 1:
            rows.update({g: (0.0, 1.0, "gate:xid", ("xid:79",)) for g in GPUS})
        if cycle_no == 4:
            rows[GPUS[2]] = (0.0, 1.0, "gate:xid", ("xid:79", "recovery_action:DRAIN_AND_RESET"))
        if cycle_no == 5:
            rows[GPUS[0]] = (0.95, 1.0, "min:hardware", ())
        kinds = _kinds(rows)
        df = fast.decide(sf, Health(kinds, t), t, labels_key="k")
        dp = plain.decide(sp, Health(kinds, t), t, labels_key="k")
        assert [x.to_dict() for x in df.transitions] == [x.to_dict() for x in dp.transitions]
        assert [x.to_dict() for x in df.intents] == [x.to_dict() for x in dp.intents]
        assert df.state.to_dict() == dp.state.to_dict()
        sf, sp = df.state, dp.state
        t += 15.0
    assert any(es.state != State.READY for es in sf.entities.values())


def test_decide_runs_without_cyclic_collection_and_leaves_the_collector_as_it_found_it(monkeypatch: Any) -> None:
    import gc

    seen: list[bool] = []
    orig = Decider._decide

    def spy(self: Decider, *a: Any) -> Any:
        seen.append(gc.isenabled())
        return orig(self, *a)

    monkeypatch.setattr(Decider, "_decide", spy)
    rows = {n: (0.95, 1.0, "min:hardware", ()) for n in NODES + REPLICAS + GPUS}
    was = gc.isenabled()
    try:
        gc.enable()
        Decider(POL).decide(DecisionState(), Health(_kinds(rows), 100.0), 100.0)
        assert gc.isenabled()
        gc.disable()
        Decider(POL).decide(DecisionState(), Health(_kinds(rows), 100.0), 100.0)
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()
    assert seen == [False, False]

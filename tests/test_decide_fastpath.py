"""The per-cycle fast paths answer as the plain ones do: the decider's label reuse (while the history's
set of series is unchanged) and its label-free serving tuples, and the structural tracker's per-series
tables cached per label-set list."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.decide.loop import DecisionLoop
from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.structural import StructuralTracker

POLICY = default_policy()


def scrape(at: float, driver: dict[str, str], gpus: dict[str, list[int]], up: dict[str, float] | None = None,
           temp: float = 50.0, tp: dict[str, str] | None = None) -> Snapshot:
    b = SnapshotBuilder()
    for node, gs in gpus.items():
        for g in gs:
            lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}", "instance": f"{node}:9400",
                   "DCGM_FI_DRIVER_VERSION": driver[node], "pool": "train-a", "modelName": "H100"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, temp + g, at)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, at)
        tpg = (tp or {}).get(node, f"tp-{node}")
        b.add("fleethealth_node_info", {"node": node, "pool": "train-a", "tp_group": tpg}, 1.0, at)
    for inst, v in (up or {}).items():
        b.add("up", {"instance": inst, "job": "dcgm"}, v, at)
    return b.build(at)


def _plain(loop: DecisionLoop) -> DecisionLoop:
    """The same loop with the label reuse off (every cycle asks the engine)."""
    inner = loop.decider.decide

    def decide(*a: Any, labels_key: Any = None, **k: Any) -> Any:
        return inner(*a, labels_key=None, **k)  # type: ignore[misc]

    loop.decider.decide = decide  # type: ignore[method-assign]
    return loop


def test_labels_are_reused_while_the_series_stay_and_refreshed_when_they_change() -> None:
    nodes = {f"n{i}": list(range(4)) for i in range(3)}
    fast = DecisionLoop(POLICY)
    plain = _plain(DecisionLoop(POLICY))
    meta_cls = type(score_snapshot(scrape(0.0, dict.fromkeys(nodes, "550"), nodes), POLICY, 0.0).meta)
    calls = {"n": 0}
    orig, orig_many = meta_cls.labels, meta_cls.labels_many

    def counting(self: Any, kind: str, e: int) -> dict[str, str]:
        calls["n"] += 1
        return orig(self, kind, e)

    def counting_many(self: Any, kind: str, rows: Any) -> list[dict[str, str]]:  # the batched ask counts per row
        rows = list(rows)
        calls["n"] += len(rows)
        return orig_many(self, kind, rows)

    meta_cls.labels = counting  # type: ignore[method-assign]
    meta_cls.labels_many = counting_many  # type: ignore[method-assign]
    try:
        per_cycle = []
        for c in range(8):
            t = 15.0 * c
            drv = {n: ("560" if (n == "n1" and c >= 4) else "550") for n in nodes}  # n1 upgraded at cycle 4
            tp = {"n2": "tp-moved"} if c >= 6 else {}  # n2 moved to another TP group at cycle 6
            snap = scrape(t, drv, nodes, temp=50.0 + c, tp=tp)
            calls["n"] = 0
            a = fast.cycle(snap, t)
            per_cycle.append(calls["n"])
            b = plain.cycle(snap, t)
            assert a.decision.to_dict() == b.decision.to_dict()
        assert fast.state.entities["n2"].labels["tp_group"] == "tp-moved"
        assert fast.state.to_dict() == plain.state.to_dict()
        assert per_cycle[2] == 0 and per_cycle[3] == 0 and per_cycle[5] == 0  # same series: none asked for
        assert per_cycle[4] > 0 and per_cycle[6] > 0  # new series (label sets): asked again
    finally:
        meta_cls.labels, meta_cls.labels_many = orig, orig_many  # type: ignore[method-assign]


def test_a_custom_scorer_gets_no_label_reuse() -> None:
    seen: list[Any] = []
    loop = DecisionLoop(POLICY, scorer=lambda v, p, now, c: score_snapshot(copy.copy(v), p, now, consumer=c))
    inner = loop.decider.decide

    def spy(*a: Any, labels_key: Any = None, **k: Any) -> Any:
        seen.append(labels_key)
        return inner(*a, labels_key=labels_key, **k)  # type: ignore[misc]

    loop.decider.decide = spy  # type: ignore[method-assign]
    nodes = {"n0": [0, 1]}
    for c in range(3):
        loop.cycle(scrape(15.0 * c, {"n0": "550"}, nodes), 15.0 * c)
    assert seen == [None, None, None]  # its FleetHealth was not read from the history's own view


steps = st.lists(
    st.tuples(
        st.fixed_dictionaries({n: st.sets(st.integers(0, 3)) for n in ("a", "b", "c")}),  # GPUs reporting
        st.dictionaries(st.sampled_from(["a:9400", "b:9400", "c:9400"]), st.sampled_from([0.0, 1.0])),  # up
        st.floats(5, 120),  # seconds since the last scrape
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(steps)
def test_structural_cached_tables_answer_as_a_fresh_tracker_on_a_copied_view(script: list) -> None:
    h = SignalHistory(POLICY, memory_s=300.0)
    fast = StructuralTracker(max_age_s=90)
    plain = StructuralTracker(max_age_s=90)
    t = 0.0
    for gpus, up, dt in script:
        t += dt
        h.add(scrape(t, dict.fromkeys(gpus, "550"), {n: sorted(g) for n, g in gpus.items()}, up))
        v = h.view(t)
        # new label-set lists every time: no cached table, no shape token
        cv = Snapshot(v.at, list(v.metrics), list(v.labelsets), v.metric_ids.copy(), v.series_ids.copy(),
                      v.values.copy(), v.ts.copy(), list(v.issues), list(v.source_errors))
        a, b = fast.observe(v, t), plain.observe(cv, t)
        assert list(a.snapshot.rows()) == list(b.snapshot.rows())
        assert a.snapshot.source_errors == b.snapshot.source_errors
        assert (a.gpus_now, a.gpus_expected, a.targets_down) == (b.gpus_now, b.gpus_expected, b.targets_down)
        assert fast.max_gpus == plain.max_gpus and fast.target_nodes == plain.target_nodes
        h.add(a.snapshot)

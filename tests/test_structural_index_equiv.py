"""The structural tracker's index path (a history view read through its ``ViewIndex``: the gauge blocks'
rows, each counter series' latest sample off its matrix, and, while the layout of those is unchanged and
every (metric, series) pair is fresh, the pair facts the layout remembers) answers exactly as the
session-9 tracker (tests/structural_reference.py) and as the row path (the same view without its index),
cycle by cycle: derived samples bit for bit, issues, source errors, reports and learned memory. The
scrapes carry counters of two retentions (GPU counters and a replica's request counter), an event-like
gauge whose value-start rows come and go, GPUs and whole nodes that stop reporting (their series stay in
the history while no longer fresh, counters with holes), clock skew into the future and the past, and
targets shared between nodes."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import structural_reference as ref
from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.structural import StructuralReport, StructuralTracker
from structural_support import same_report

POL = default_policy()
NODES = ("a", "b", "c")


def _scrape(at: float, gpus: dict[str, set[int]], up: dict[str, float], skew: dict[str, float], slow: float,
            shared: bool, xid: int) -> Snapshot:
    b = SnapshotBuilder()
    for node, gs in gpus.items():
        t = at + skew.get(node, 0.0)
        inst = "shared:9400" if shared and node != "c" else f"{node}:9400"
        for g in sorted(gs):
            lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}", "instance": inst}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0 + g, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, float(xid if g == 0 else 0), t)  # event-like: value start
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, at / 15.0 + g, t)  # counter
            b.add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", lab, 0.0, t)  # counter
        if gs:
            b.add("fleethealth_replica_requests_total", {"replica": f"r-{node}", "node": node}, at, t)
        else:
            b.add("node_load1", {"instance": inst, "node": node}, 1.0, t)
    for node, v in up.items():
        inst = "shared:9400" if shared and node != "c" else f"{node}:9400"
        b.add("up", {"instance": inst, "job": "dcgm"}, v, at)
        b.add("scrape_duration_seconds", {"instance": inst, "job": "dcgm"}, slow, at)
    b.add("up", {"instance": "c-node:9100", "job": "node", "node": "c"}, up.get("c", 1.0), at)
    return b.build(at)


def _plain(v: Snapshot) -> Snapshot:
    """The same rows without the index: the tracker reads every row."""
    return Snapshot(v.at, v.metrics, v.labelsets, v.metric_ids, v.series_ids, v.values, v.ts,
                    list(v.issues), list(v.source_errors))


_same = same_report


step = st.tuples(
    st.fixed_dictionaries({n: st.sets(st.integers(0, 3)) for n in NODES}),  # GPUs reporting
    st.dictionaries(st.sampled_from(NODES), st.sampled_from([0.0, 1.0, 1.0])),  # up per target
    st.dictionaries(st.sampled_from(NODES), st.sampled_from([0.0, -200.0, 20.0, 60.0]), max_size=1),  # skew
    st.sampled_from([0.02, 0.02, 12.0]),  # scrape duration
    st.booleans(),  # a and b behind one shared instance
    st.sampled_from([15.0, 15.0, 15.0, 60.0, 200.0]),  # seconds since the last scrape
    st.integers(1, 4),  # identical scrapes in a row (the layout is remembered from the second)
    st.sampled_from([0, 0, 13]),  # GPU 0's Xid field
)


class _Run:
    def __init__(self, capacity: bool) -> None:
        self.h = SignalHistory(POL, memory_s=600.0)
        self.fast = StructuralTracker(max_age_s=90)
        self.rows = StructuralTracker(max_age_s=90)
        self.ref = ref.StructuralTracker(max_age_s=90)
        self.cap = {"a": 4} if capacity else None
        self.indexed = 0

    def cycle(self, t: float, snap: Snapshot) -> StructuralReport:
        self.h.add(snap)
        v = self.h.view(t)
        st_ = self.fast._series(v.labelsets)
        if self.fast._fresh_indexed(v, t, st_, self.fast._metric_masks(v.metrics)) is not None:
            self.indexed += 1
        a = self.fast.observe(v, t, self.cap)
        p = _plain(v)
        b, c = self.rows.observe(p, t, self.cap), self.ref.observe(p, t, self.cap)
        _same(a, b)
        _same(a, c)
        for tr in (self.rows, self.ref):
            assert self.fast.max_gpus == tr.max_gpus and self.fast.target_nodes == tr.target_nodes
        self.h.add(a.snapshot)  # fed back, as the controller does
        return a


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(step, min_size=1, max_size=8), capacity=st.booleans())
def test_index_path_answers_as_the_reference_and_the_row_path(script: list, capacity: bool) -> None:
    run = _Run(capacity)
    t = 1_000.0
    for gpus, up, skew, slow, shared, dt, repeat, xid in script:
        for _ in range(repeat):
            t += dt
            run.cycle(t, _scrape(t, gpus, up, skew, slow, shared, xid))


def test_steady_layout_then_a_gpu_falls_off_and_a_node_goes_quiet() -> None:
    """The remembered layout is used in the steady state, and the answers stay the reference's when a
    GPU's series (gauges and counters) stop while still held, and when a whole node stops."""
    run = _Run(capacity=False)
    full = {n: {0, 1, 2, 3} for n in NODES}
    up = {n: 1.0 for n in NODES}
    t = 1_000.0
    for _ in range(6):
        t += 15.0
        run.cycle(t, _scrape(t, full, up, {}, 0.02, False, 0))
    lay = run.fast._layout
    assert lay is not None and lay.built and run.indexed == 6
    # GPU 2 of b falls off the bus: its pairs stay in the history, no longer fresh
    less = dict(full, b={0, 1, 3})
    seen = []
    for _ in range(12):
        t += 15.0
        r = run.cycle(t, _scrape(t, less, up, {}, 0.02, False, 13))
        seen.append((r.gpus_now.get("b"), r.gpus_expected.get("b")))
    assert (3, 4) in seen
    # node c goes quiet (its exporter is gone): missing data, not missing GPUs
    quiet = {"a": full["a"], "b": less["b"], "c": set()}
    for _ in range(10):
        t += 15.0
        run.cycle(t, _scrape(t, quiet, {"a": 1.0, "b": 1.0}, {}, 0.02, False, 13))
    assert run.indexed == 28


def test_index_path_with_a_sample_from_the_future_and_on_an_empty_view() -> None:
    run = _Run(capacity=False)
    full = {n: {0, 1} for n in NODES}
    t = 1_000.0
    for skew in (0.0, 0.0, 200.0, 0.0, 0.0):
        t += 15.0
        run.cycle(t, _scrape(t, full, {"a": 1.0}, {"b": skew}, 0.02, False, 0))
    empty = SignalHistory(POL)
    v = empty.view(5.0)
    _same(StructuralTracker().observe(v, 5.0), ref.StructuralTracker().observe(v, 5.0))


def test_an_index_the_tracker_cannot_read_off_falls_back_to_the_rows() -> None:
    """A counter group with a column outside every metric's range, or ``up`` as a counter matrix: the
    tracker reads every row instead, with the same answers."""
    h = SignalHistory(POL, memory_s=600.0)
    full = {n: {0, 1} for n in NODES}
    t = 1_000.0
    for _ in range(4):
        t += 15.0
        h.add(_scrape(t, full, {"a": 1.0, "b": 0.0}, {}, 0.02, False, 0))
    for bend in ("gap", "up"):
        v = h.view(t)
        ix = v.index
        assert ix is not None and ix.counters
        m, cm = next(iter(ix.counters.items()))
        counters = dict(ix.counters)
        if bend == "gap":
            counters[m] = dataclasses.replace(cm, c0=cm.c0 + 1) if cm.c0 == 0 else dataclasses.replace(cm, c1=cm.c1 - 1)
        else:
            counters[v.metrics.index("up")] = cm
        v.index = dataclasses.replace(ix, counters=counters)
        tr = StructuralTracker(max_age_s=90)
        st_ = tr._series(v.labelsets)
        assert tr._fresh_indexed(v, t, st_, tr._metric_masks(v.metrics)) is None
        _same(tr.observe(v, t), ref.StructuralTracker(max_age_s=90).observe(v, t))


def test_memory_and_capacity_changes_between_identical_cycles() -> None:
    """The node-level answer is reused only while the counts, the capacity and the tracker's memory are
    the same: an operator's ``forget`` or a new capacity between two identical scrapes changes it."""
    run = _Run(capacity=False)
    t = 1_000.0
    full = {n: {0, 1, 2, 3} for n in NODES}
    less = dict(full, a={0, 1, 2})
    up = {n: 1.0 for n in NODES}
    for gpus in (full, full, less, less, less, less, less, less, less):
        t += 15.0
        r = run.cycle(t, _scrape(t, gpus, up, {}, 0.02, False, 0))
    assert r.gpus_expected["a"] == 4 and r.gpus_now["a"] == 3
    run.fast.forget("a")  # the GPU was really removed
    run.rows.forget("a")
    run.ref.forget("a")
    t += 15.0
    r = run.cycle(t, _scrape(t, less, up, {}, 0.02, False, 0))
    assert r.gpus_expected["a"] == 3
    run.cap = {"a": 4, "b": 8}
    for _ in range(2):
        t += 15.0
        r = run.cycle(t, _scrape(t, less, up, {}, 0.02, False, 0))
        assert r.gpus_expected == {"a": 4, "b": 8, "c": 4}
    run.cap = None
    t += 15.0
    r = run.cycle(t, _scrape(t, less, up, {}, 0.02, False, 0))
    assert r.gpus_expected["b"] == 4

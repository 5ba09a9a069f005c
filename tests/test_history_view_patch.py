"""A history's view is the same whichever way it is made: patched from the last view (only gauge samples of
series it holds came in since, at the same ``now``: a cycle's derived signals) or built in full, and its
counter rows, written only when read (``HistoryView``), are the rows a full build writes."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import HistoryView, Snapshot, SnapshotBuilder

POLICY = default_policy()
COUNTER = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
GAUGE = "DCGM_FI_DEV_GPU_TEMP"
XID = "DCGM_FI_DEV_XID_ERRORS"  # event-like: the view carries when its value started
DERIVED = "fleethealth_node_gpus_missing"


def _full_view(h: SignalHistory, now: float) -> Snapshot:
    """The view a history that has never made one builds (a copy starts without a last view)."""
    c = copy.deepcopy(h)
    assert c._view_layout is None
    return c.view(now)


def _same_view(a: Snapshot, b: Snapshot) -> None:
    assert len(a) == len(b)
    for f in ("metric_ids", "series_ids", "values", "ts"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert a.index is not None and b.index is not None
    assert a.index.bounds == b.index.bounds and a.index.max_ts == b.index.max_ts
    assert a.index.counters.keys() == b.index.counters.keys()
    for k, m in a.index.counters.items():
        n = b.index.counters[k]
        assert np.array_equal(m.series, n.series) and np.array_equal(m.last, n.last)
        assert np.array_equal(m.t, n.t, equal_nan=True) and np.array_equal(m.v, n.v, equal_nan=True)


steps = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=4, max_size=4),  # xid values of the 4 GPUs
        st.floats(0, 30),  # seconds since the last scrape
        st.lists(  # derived snapshots added after the cycle's first view, each followed by a view
            st.tuples(st.integers(0, 5), st.floats(-20, 0), st.sampled_from(["derived", "gauge", "xid", "counter"])),
            max_size=3,
        ),
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_a_patched_view_equals_a_full_one(script: list) -> None:
    h = SignalHistory(POLICY, memory_s=120.0, dense_s=60.0, coarse_s=30.0)
    b = SnapshotBuilder()
    mids = [b.metric_id(m) for m in (GAUGE, XID, COUNTER)]
    gpus = [b.series_id({"Hostname": f"n{i // 2}", "gpu": str(i % 2)}) for i in range(4)]
    t = 1000.0
    for step, (xids, dt, derived) in enumerate(script):
        t += dt
        vals = [40.0 + step % 3, *map(float, xids), float(step // 2)]
        rows = [(mids[0], g, vals[0] + i) for i, g in enumerate(gpus)] + \
            [(mids[1], g, vals[1 + i]) for i, g in enumerate(gpus)] + [(mids[2], g, vals[5]) for g in gpus]
        h.add(Snapshot(t, b.metrics, b.labelsets, np.array([r[0] for r in rows], np.int32),
                       np.array([r[1] for r in rows], np.int32), np.array([r[2] for r in rows]),
                       np.full(len(rows), t), [], []))
        v = h.view(t)
        _same_view(v, _full_view(h, t))
        for node, back, what in derived:
            d = SnapshotBuilder()
            if what == "derived":
                d.add(DERIVED, {"Hostname": f"n{node}"}, float(node), t + back)
            elif what == "gauge":
                d.add(GAUGE, {"Hostname": f"n{node % 2}", "gpu": "0"}, 50.0 + node, t + back)
            elif what == "xid":
                d.add(XID, {"Hostname": "n0", "gpu": "1"}, float(node), t)
            else:
                d.add(COUNTER, {"Hostname": "n1", "gpu": "0"}, 100.0 + node, t)
            h.add(d.build(t))
            _same_view(h.view(t), _full_view(h, t))  # (about one in ten of these is patched)


def test_a_cycles_derived_gauges_patch_the_view_and_leave_the_counter_rows_unwritten() -> None:
    h = SignalHistory(POLICY)
    b = SnapshotBuilder()
    for i, t in enumerate((100.0, 115.0, 130.0)):
        b2 = SnapshotBuilder()
        for g in range(4):
            b2.add(GAUGE, {"Hostname": "n0", "gpu": str(g)}, 40.0 + i, t)
            b2.add(COUNTER, {"Hostname": "n0", "gpu": str(g)}, float(i), t)
        h.add(b2.build(t))
    v = h.view(130.0)
    assert isinstance(v, HistoryView) and v._fill is not None  # counter rows not written yet
    assert len(v) == 4 + 12 and v.index is not None and v.index.valid_for(v)
    b.add(DERIVED, {"Hostname": "n0"}, 0.0, 130.0)
    h.add(b.build(130.0))
    v1 = h.view(130.0)  # the derived series is new: a full view
    b3 = SnapshotBuilder()
    b3.add(DERIVED, {"Hostname": "n0"}, 1.0, 130.0)
    h.add(b3.build(130.0))
    v2 = h.view(130.0)
    assert v2.index is not None and v1.index is not None and v2.index.counters is v1.index.counters  # patched
    assert v2._fill is not None
    sid, vals, ts = v2.index.rows(v2, *v2.index.bounds[v2.metrics.index(DERIVED)])
    assert vals.tolist() == [1.0] and v2._fill is not None  # the head answers without writing the rest
    _same_view(v2, _full_view(h, 130.0))
    assert v2._fill is None  # read: written


def test_a_view_copied_or_given_new_rows_drops_its_index() -> None:
    h = SignalHistory(POLICY)
    b = SnapshotBuilder()
    b.add(GAUGE, {"Hostname": "n0", "gpu": "0"}, 40.0, 100.0)
    b.add(COUNTER, {"Hostname": "n0", "gpu": "0"}, 1.0, 100.0)
    h.add(b.build(100.0))
    v = h.view(110.0)
    w = dataclasses.replace(v, values=v.values.copy())
    assert w.index is not None and not w.index.valid_for(w)
    p = pickle.loads(pickle.dumps(v))
    assert type(p) is Snapshot and p.index is None and np.array_equal(p.values, v.values)
    assert v.index is not None and v.index.valid_for(v)
    v.values = v.values + 1.0
    assert v.index is None  # new rows: the index no longer describes them

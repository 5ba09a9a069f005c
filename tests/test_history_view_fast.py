"""The view side's shortcuts (``signals.history_view``, ``signals.history_pairs``) answer exactly what the
plain numpy expressions they replace answer: forgetting by the exact float bound of ``now - memory_s``,
the all-live check by reductions, an id's rows and blocks by binary search over ids in order; and a view
that holds the history's own gauge arrays (lent) keeps its rows whatever the history does next."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.history_counters import _id_runs
from fleethealth.signals.history_pairs import _all_live, _blocks, _metric_rows
from fleethealth.signals.history_view import _forgotten, _last_stale
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

finite = st.floats(-1e12, 1e12, allow_nan=False)
odd = st.sampled_from([np.inf, -np.inf, np.nan, 0.0, -0.0, 5e-324, 1e308, -1e308])


@settings(max_examples=400, deadline=None)
@given(st.one_of(finite, odd, st.sampled_from([1.7e9, 1_700_000_015.0, 0.1])),
       st.one_of(finite, odd, st.sampled_from([3600.0, 1e-9, 0.0, -5.0])),
       st.lists(st.one_of(finite, odd, st.integers(-8, 8)), max_size=30), st.data())
def test_forgotten_is_the_plain_comparison(now: float, memory_s: float, picks: list[float | int],
                                           data: st.DataObject) -> None:
    # times at and around the boundary (a few ulps either side of now - memory_s), and anywhere
    edge = now - memory_s
    ts = []
    for p in picks:
        if isinstance(p, int) and np.isfinite(edge):
            x = edge
            for _ in range(abs(p)):
                x = float(np.nextafter(x, np.inf if p > 0 else -np.inf))
            ts.append(x)
        else:
            ts.append(float(p))
    g_t = np.array(ts, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (now - g_t > memory_s) & np.isfinite(g_t)
        got = _forgotten(g_t, now, memory_s) if g_t.size else None
    if want.any():
        assert got is not None and np.array_equal(got, want)
    else:
        assert got is None
    bound = _last_stale(now, memory_s)
    if bound is not None:  # the bound itself: the largest time older than memory_s
        assert now - bound > memory_s and not now - float(np.nextafter(bound, np.inf)) > memory_s


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(-1e3, 1e3), st.sampled_from([np.inf, -np.inf, np.nan])),
                          st.one_of(st.floats(-1e3, 1e3), st.sampled_from([np.inf, -np.inf, np.nan]))),
                max_size=20))
def test_all_live_is_the_elementwise_check(tv: list[tuple[float, float]]) -> None:
    g_t = np.array([t for t, _ in tv], np.float64)
    g_v = np.array([v for _, v in tv], np.float64)
    assert _all_live(g_t, g_v) == bool((np.isfinite(g_t) & ~np.isnan(g_v)).all())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=40), st.lists(st.booleans(), min_size=10, max_size=10))
def test_rows_and_blocks_of_ids_in_order(ids: list[int], of_metric: list[bool]) -> None:
    g_m = np.array(sorted(ids), np.int32)
    mask = np.array(of_metric)
    got = _metric_rows(g_m, mask)
    assert got.dtype == np.int64 and np.array_equal(got, np.flatnonzero(mask[g_m]))
    assert list(_blocks(g_m).items()) == [(m, (a, b)) for m, a, b in _id_runs(g_m)]


METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.sampled_from([0.0, 1.0, 7.0])),
                                   max_size=14),
                          st.sampled_from([0.0, 0.0, 15.0, 5000.0]), st.booleans()), min_size=1, max_size=7))
def test_views_keep_their_rows_while_the_history_moves_on(steps: list[tuple[list[tuple[int, int, float]], float,
                                                                             bool]]) -> None:
    """A view whose rows are every gauge slot in order holds the history's own value and time arrays
    (lent, read-only): later writes, forgetting and growth go to copies, never into a view's rows."""
    h = SignalHistory(default_policy())
    now = 1000.0
    held: list[tuple[Snapshot, list[np.ndarray]]] = []
    last: list[tuple[int, int, float]] = []
    for rows, gap, look in steps:
        now += gap
        if not rows:  # the last scrape's layout again (its plan: gauges written as one slice)
            rows = last
        last = rows
        b = SnapshotBuilder()
        for mi, si, v in rows:
            b.add(METRICS[mi], {"Hostname": f"n{si}"}, v + now if mi == 3 else v, now)
        h.add(b.build(now))
        if look:
            view = h.view(now)
            assert view.index is not None
            held.append((view, [a.copy() for a in (*view.index.head, view.metric_ids, view.series_ids, view.values,
                                                   view.ts)]))
    h.view(now + 4000.0)  # (forgets every gauge: written in place unless lent)
    for view, was in held:
        assert view.index is not None
        now_arrays = (*view.index.head, view.metric_ids, view.series_ids, view.values, view.ts)
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(now_arrays, was, strict=True))

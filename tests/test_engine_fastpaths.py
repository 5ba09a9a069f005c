"""The engine's fast paths (sorting shortcuts, grouped medians, vectorised flags, one-sort counter runs)
give exactly what the plain algorithms give, on arbitrary inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.score.engine import _counter_runs, _increase_per_series, _value_flags
from fleethealth.score.shapes import group_median
from fleethealth.signals.snapshot import order_by_series_time

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def samples(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_series = draw(st.integers(1, 40000 if draw(st.booleans()) else 50))
    n_scrapes = draw(st.integers(1, 6))
    per = draw(st.integers(1, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    layout = draw(st.sampled_from(["scrapes", "shuffled", "reverse"]))
    ids = rng.choice(n_series, size=min(per, n_series), replace=False)
    if layout == "scrapes":  # each scrape lists the same series in the same order, in time order
        ids = np.sort(ids)
    series = np.tile(ids, n_scrapes)
    ts = np.repeat(np.arange(n_scrapes, dtype=np.float64) * 15.0, ids.size)
    if layout == "shuffled":
        p = rng.permutation(series.size)
        series, ts = series[p], ts[p]
    elif layout == "reverse":
        series, ts = series[::-1].copy(), ts[::-1].copy()
    values = np.cumsum(rng.poisson(2.0, series.size).astype(np.float64))
    if draw(st.booleans()):  # counter resets
        values[rng.random(series.size) < 0.1] = 0.0
    return series.astype(np.int32), ts, values


@SETTINGS
@given(samples())
def test_order_by_series_time_sorts_by_series_then_time(s: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    series, ts, _ = s
    order = order_by_series_time(series, ts)
    assert sorted(order.tolist()) == list(range(series.size))
    ref = np.lexsort((ts, series))
    assert np.array_equal(series[order], series[ref])
    assert np.array_equal(ts[order], ts[ref])


@SETTINGS
@given(samples(), st.floats(-10, 100))
def test_counter_runs_match_the_two_pass_definition(s: tuple[np.ndarray, np.ndarray, np.ndarray], start: float) -> None:
    series, ts, values = s
    s_ids, inc, t0, t1, last_v, last_t = _counter_runs(series, values, ts, start)
    inw = ts > start
    ref_ids, ref_inc, ref_t0, ref_t1, _ = _increase_per_series(series[inw], values[inw], ts[inw])
    pos = {int(x): i for i, x in enumerate(s_ids.tolist())}
    assert sorted(pos) == sorted(set(series.tolist()))
    for j, sid in enumerate(ref_ids.tolist()):
        i = pos[int(sid)]
        assert np.array_equal(inc[i], ref_inc[j], equal_nan=True)
        assert t1[i] == ref_t1[j] and t0[i] == ref_t0[j]
    for sid, i in pos.items():
        mine = series == sid
        last = np.flatnonzero(mine)[np.argmax(ts[mine])] if mine.any() else None
        assert last is not None and last_t[i] == ts[last]
        if sid not in set(ref_ids.tolist()):
            assert np.isnan(inc[i]) and np.isnan(t1[i])


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 7), st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))), max_size=300))
def test_group_median_equals_numpy(rows: list[tuple[int, float]]) -> None:
    g = np.array([r[0] for r in rows], np.int64)
    v = np.array([r[1] for r in rows], np.float64)
    med, counts = group_median(v, g, 8)
    for k in range(8):
        vals = v[(g == k) & ~np.isnan(v)]
        assert counts[k] == vals.size
        if vals.size:
            assert med[k] == np.median(vals)
        else:
            assert np.isnan(med[k])


@SETTINGS
@given(st.lists(st.one_of(st.floats(-5, 200), st.sampled_from([1.0, 2.0, 3.5, float("nan"), 1e19])), max_size=200))
def test_value_flags_match_the_per_entity_loop(xs: list[float]) -> None:
    x = np.array(xs, np.float64)
    flags = {1: "one", 2: "two", 3: "three", 150: "big"}
    ref = []
    for e in np.flatnonzero(~np.isnan(x)).tolist():
        f = flags.get(int(x[e]))
        if f:
            ref.append((e, f))
    assert _value_flags(x, flags) == ref

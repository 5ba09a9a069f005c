"""A counter window read off only the rows that straddle its start (``score.kernels._rows_out``, fed by
the history's per-row sample times) gives exactly what reading every row gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.score.kernels import _fresh_rate, _uniform_rates, _window, _windows
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder


def _matrix(seed: int, k: int, c: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    """A dense counter matrix: times ascending down each column (each column its own jitter, or every
    column one scrape time with ``ties``), cumulative values."""
    rng = np.random.default_rng(seed)
    step = np.full((k, c), 15.0) if ties else rng.uniform(1.0, 30.0, (k, c))
    t = 1000.0 + np.cumsum(step, axis=0)
    v = np.cumsum(rng.integers(0, 3, (k, c)).astype(np.float64), axis=0)
    return t, v


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 40), c=st.integers(1, 12), ties=st.booleans(),
       where=st.floats(-0.2, 1.2))
def test_a_window_over_the_straddling_rows_equals_one_over_every_row(seed: int, k: int, c: int, ties: bool,
                                                                     where: float) -> None:
    t, v = _matrix(seed, k, c, ties)
    last = np.full(c, k - 1)
    lo, hi = float(t.min()), float(t.max())
    start = lo + where * (hi - lo)
    if ties:
        start = float(t[min(int(where * k), k - 1) if where > 0 else 0, 0])  # exactly on a row's time
    rows = (t.min(axis=1), t.max(axis=1))
    full = _window(t, v, last, start, True)
    banded = _window(t, v, last, start, True, rows)
    for a, b in zip(full, banded, strict=True):
        np.testing.assert_array_equal(a, b)
    starts = np.array([start, start - 40.0, start + 40.0, lo - 1.0, hi + 1.0])
    for a, b in zip(_windows(t, v, last, starts, True), _windows(t, v, last, starts, True, rows), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_history_keeps_each_rows_earliest_and_latest_time_through_thinning_and_expiry() -> None:
    pol = default_policy()
    h = SignalHistory(pol)
    rng = np.random.default_rng(7)
    total = 0.0
    for i in range(600):  # 2.5 hours of 15 s scrapes: thinned past 15 min and past an hour
        now = 15.0 * i
        b = SnapshotBuilder()
        total += float(rng.integers(0, 2))
        for g in range(4):
            b.add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", {"Hostname": "n1", "gpu": str(g)}, total, now - g * 0.5)
            if g < 3 or i % 2:  # one series skips every other scrape: rows with holes
                b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", {"Hostname": "n1", "gpu": str(g)}, total, now - g)
        h.add(b.build(now))
        if i % 4 == 3:
            view = h.view(now)
            assert view.index is not None
            for grp in h._groups:
                T = grp.T[grp.r0:grp.r1]
                lo, hi = grp.row_times()
                np.testing.assert_array_equal(lo, np.nanmin(T, axis=1))
                np.testing.assert_array_equal(hi, np.nanmax(T, axis=1))
            for cm in view.index.groups:
                assert cm.row_times is not None
                np.testing.assert_array_equal(cm.row_times[0], np.nanmin(cm.t, axis=1))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 40), c=st.integers(1, 12), ties=st.booleans(),
       where=st.floats(-0.2, 1.2), max_age=st.sampled_from([0.0, 30.0, 1e9]),
       min_span=st.sampled_from([0.0, 100.0, 1e5]))
def test_a_rate_over_rows_of_one_time_each_equals_the_general_one(seed: int, k: int, c: int, ties: bool,
                                                                   where: float, max_age: float,
                                                                   min_span: float) -> None:
    t, v = _matrix(seed, k, c, ties)
    last = np.full(c, k - 1)
    lo, hi = float(t.min()), float(t.max())
    start = lo + where * (hi - lo)
    now = hi + 10.0
    rows = (t.min(axis=1), t.max(axis=1))
    fast = _uniform_rates(t, v, start, now, max_age, min_span, rows)
    if ties and fast is None:  # rows of one time each: only a window of fewer than two rows is left out
        assert k < 2 or start >= float(t[-2, 0])
    if fast is None:
        return
    inc, t0, t1, lv, lt, _ = _window(t, v, last, start, True, rows)
    for a, b in zip(fast, (_fresh_rate(inc, t0, t1, now, max_age, min_span), lv, now - lt), strict=True):
        np.testing.assert_array_equal(a, b)

"""The history's fast paths give the plain paths' answers: a cached ingest plan ingests a known snapshot
layout exactly as the row-by-row path does, and ``shape_token`` changes whenever the view's set of
(metric, series) pairs does."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory, shape_token
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POLICY = default_policy()
COUNTER = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"  # a counter the policy keeps for 300 s
GAUGE = "DCGM_FI_DEV_GPU_TEMP"


class PlainHistory(SignalHistory):
    """The same history with the ingest plans turned off."""

    def _plan_for(self, snap: Snapshot) -> None:  # type: ignore[override]
        return None


def _layout(n_series: int) -> SnapshotBuilder:
    b = SnapshotBuilder()
    b.metric_id(GAUGE)
    b.metric_id(COUNTER)
    for i in range(n_series):
        b.series_id({"Hostname": f"n{i // 2}", "gpu": str(i % 2)})
    return b


def _same(a: Snapshot, b: Snapshot) -> None:
    assert a.metrics == b.metrics and a.labelsets == b.labelsets
    for f in ("metric_ids", "series_ids", "values", "ts"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


def _pairs(v: Snapshot) -> set[tuple[int, int]]:
    return set(zip(v.metric_ids.tolist(), v.series_ids.tolist(), strict=True))


steps = st.lists(
    st.tuples(
        st.integers(0, 3),  # which of a few fixed layouts (sizes) this scrape has
        st.lists(st.floats(0, 50), min_size=8, max_size=8),  # values (counters may go down: resets)
        st.floats(0, 40),  # seconds since the last scrape
        st.booleans(),  # one value NaN (the row is dropped: no plan)
        st.booleans(),  # view after this scrape
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps)
def test_planned_ingest_equals_the_plain_path_and_tokens_follow_the_series(script: list) -> None:
    assert COUNTER in SignalHistory(POLICY).counter_keep and GAUGE not in SignalHistory(POLICY).counter_keep
    fast = SignalHistory(POLICY, memory_s=120.0, dense_s=60.0, coarse_s=30.0)
    plain = PlainHistory(POLICY, memory_s=120.0, dense_s=60.0, coarse_s=30.0)
    builders = [_layout(8) for _ in range(4)]
    # one label-set list per layout, reused scrape after scrape like a scraper's or the simulator's
    lists = [(b.metrics, b.labelsets) for b in builders]
    t = 1000.0
    last: tuple[object, set[tuple[int, int]]] | None = None
    for k, vals, dt, nan, look in script:
        t += dt
        n = 2 + 2 * k  # series 0..n-1 report this scrape
        mids = np.array([0] * n + [1] * n, np.int32)
        sids = np.array(list(range(n)) * 2, np.int32)
        values = np.array((vals * 2)[: 2 * n], np.float64)
        if nan:
            values[0] = np.nan
        snap = Snapshot(t, lists[k][0], lists[k][1], mids, sids, values, np.full(2 * n, t), [], [])
        fast.add(snap)
        plain.add(snap)
        if look:
            now = t + dt / 2
            vf, vp = fast.view(now), plain.view(now)
            _same(vf, vp)
            tok, pairs = shape_token(vf), _pairs(vf)
            assert tok is not None
            if last is not None and last[0] == tok:
                assert last[1] == pairs  # equal tokens: the same set of series
            last = (tok, pairs)


def test_the_token_moves_when_a_series_appears_or_is_forgotten() -> None:
    h = SignalHistory(POLICY, memory_s=100.0)
    b = SnapshotBuilder()
    b.add(GAUGE, {"Hostname": "n1", "gpu": "0"}, 50.0, 0.0)
    h.add(b.build(0.0))
    t0 = shape_token(h.view(0.0))
    h.add(b.build(0.0))  # the same series again
    assert shape_token(h.view(10.0)) == t0
    b2 = SnapshotBuilder()
    b2.add(GAUGE, {"Hostname": "n2", "gpu": "0"}, 50.0, 20.0)
    h.add(b2.build(20.0))
    t1 = shape_token(h.view(20.0))
    assert t1 != t0
    assert shape_token(h.view(150.0)) != t1  # n1 forgotten after memory_s
    assert shape_token(Snapshot.empty(0.0)) is None  # not a history's view


def test_a_copied_history_has_its_own_tokens() -> None:
    # The backtest deep-copies a lane's history when an arm acts on its world: the copy's views must keep
    # a token (or every per-shape cache downstream is lost in that lane) and never share one with the
    # original, whose set of series may diverge from then on.
    import copy
    import pickle

    h = SignalHistory(POLICY, memory_s=100.0)
    b = SnapshotBuilder()
    b.add(GAUGE, {"Hostname": "n1", "gpu": "0"}, 50.0, 0.0)
    h.add(b.build(0.0))
    t0 = shape_token(h.view(0.0))
    for c in (copy.deepcopy(h), pickle.loads(pickle.dumps(h))):
        tc = shape_token(c.view(10.0))
        assert tc is not None and tc != t0
        assert shape_token(c.view(11.0)) == tc
        b2 = SnapshotBuilder()
        b2.add(GAUGE, {"Hostname": "n2", "gpu": "0"}, 50.0, 12.0)
        c.add(b2.build(12.0))
        assert shape_token(c.view(12.0)) not in (tc, t0)
    assert shape_token(h.view(12.0)) == t0


def test_id_arrays_reused_across_scrapes_are_trusted_only_when_read_only() -> None:
    # A producer may hand the same id arrays every scrape (the simulator does). Read-only arrays that own
    # their memory cannot change, so the plan takes them without a comparison; writable ones are compared
    # every time, so one rewritten in place between scrapes is noticed.
    b = _layout(4)
    mids = np.array([0] * 4 + [1] * 4, np.int32)
    sids = np.array(list(range(4)) * 2, np.int32)
    for read_only in (True, False):
        fast = SignalHistory(POLICY)
        plain = PlainHistory(POLICY)
        m, s = mids.copy(), sids.copy()
        m.flags.writeable = s.flags.writeable = not read_only
        for k in range(6):
            t = 100.0 + 15 * k
            if k == 3 and not read_only:
                s[[0, 1]] = s[[1, 0]]  # the layout rewritten in place: another plan
            snap = Snapshot(t, b.metrics, b.labelsets, m, s, np.arange(8, dtype=np.float64) + k, np.full(8, t), [], [])
            fast.add(snap)
            plain.add(snap)
            _same(fast.view(t), plain.view(t))
        plan = next(iter(fast._plans.values()))
        assert (plan.seen_ids is not None) == read_only


def test_a_layout_rebuilt_in_new_lists_reuses_its_plan() -> None:
    # The structural signals (and any source that builds every snapshot afresh) hand the same layout in
    # new lists each cycle: the plan is found by content, and the ingest equals the plain path's.
    fast, plain = SignalHistory(POLICY), PlainHistory(POLICY)
    for k in range(5):
        b = _layout(4)  # new lists, same names and label sets
        t = 100.0 + 15 * k
        snap = Snapshot(t, b.metrics, b.labelsets, np.array([0] * 4 + [1] * 4, np.int32),
                        np.array(list(range(4)) * 2, np.int32), np.arange(8, dtype=np.float64) * k, np.full(8, t),
                        [], [])
        fast.add(snap)
        plain.add(snap)
        _same(fast.view(t), plain.view(t))
        assert all(p.metrics is b.metrics or p.metrics == b.metrics for p in fast._plans.values())
    # one plan built, the others found by content
    assert len({id(p.g_rows) for p in fast._plans.values()}) == 1

"""A history's first write (``SignalHistory._first_plan``: every pair new) leaves the history exactly as
the plain path does (the same slots, slot index, gauge arrays, counter groups, epoch) and so the same
views; ``_first_rows`` is the stable argsort of the packed pairs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals import history_pairs
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.history_pairs import _first_layout, _first_rows, _Room, _split_layout
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

POLICY = default_policy()
# gauges (one event-like), counters (a rate's and an SLO's) and a histogram read at a threshold
METRICS = ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
           "fleethealth_replica_requests_total", "vllm:time_to_first_token_seconds_bucket", "DCGM_FI_DEV_SM_CLOCK"]
LE = ["0.5", "1.0", "2.0", "5.0", "+Inf"]


class PlainHistory(SignalHistory):
    def _plan_for(self, snap: Snapshot) -> None:  # type: ignore[override]
        return None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 60)), max_size=80),
       st.sampled_from([np.int32, np.int64]))
def test_first_rows_is_stable_argsort(pairs: list[tuple[int, int]], dtype: type) -> None:
    m: np.ndarray = np.array([p[0] for p in pairs], dtype)
    s: np.ndarray = np.array([p[1] * (1000 if len(pairs) % 3 == 0 else 1) for p in pairs], dtype)  # sparse too
    key = (m.astype(np.int64) << 32) | s.astype(np.int64)
    got = _first_rows(m, s)
    if np.unique(key).size < key.size:
        assert got is None
    else:
        o = np.argsort(key, kind="stable")
        assert got is not None and np.array_equal(got[0], o) and np.array_equal(got[1], key[o])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 40)), max_size=60), st.lists(st.booleans(), min_size=7,
       max_size=7), st.lists(st.booleans(), min_size=7, max_size=7), st.booleans(), st.booleans(), st.booleans())
def test_first_layout_table_is_the_sorted_split(pairs: list[tuple[int, int]], is_c: list[bool], track: list[bool],
                                               subset: bool, sparse: bool, room: bool) -> None:
    m: np.ndarray = np.array([p[0] for p in pairs], np.int32)
    s: np.ndarray = np.array([p[1] * (10**6 if sparse else 1) for p in pairs], np.int32)  # sparse: no table
    kept = np.arange(0, 3 * m.size, 3) if subset else None
    # (with a room: the gauges' keys and metric ids made in its buffers; the table written in chunks of
    # a few rows, as a cold start's millions are)
    chunk = history_pairs._CHUNK
    try:
        history_pairs._CHUNK = 3 if room else chunk
        a = _first_layout(m, s, np.array(is_c), np.array(track), kept, _Room() if room else None)
    finally:
        history_pairs._CHUNK = chunk
    b = _split_layout(m, s, np.array(is_c), np.array(track), kept)
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y)


def _snapshot(rows: list[tuple[int, int, float, float]], shuffle: list[int], n_names: int) -> Snapshot:
    b = SnapshotBuilder()
    for i in shuffle[:n_names]:  # names interned in another order than the rows use them
        b.metric_id(METRICS[i % len(METRICS)])
    for mi, si, v, dt in rows:
        name = METRICS[mi]
        labels = {"Hostname": f"n{si // 2}", "gpu": str(si % 2)}
        if name.endswith("_bucket"):
            labels = {"replica": f"r{si // 5}", "le": LE[si % 5]}
        b.add(name, labels, v, 1000.0 + dt)
    return b.build(1000.0)


def _state(h: SignalHistory) -> list[object]:
    out: list[object] = [h._epoch, h._n_slots, h.labelsets, h.metrics]
    # (a value start is defined for event-like gauges only: nothing reads the others')
    since = h._g_since[h._track_start[h._g_m]] if h._g_m.size else h._g_since
    for a in (h._g_m, h._g_s, h._g_v, h._g_t, since, h._c_grp, h._c_col, h._c_last, h._c_off):
        out.append((a.dtype.str, np.nan_to_num(a, nan=-7.0).tolist()))
    for table in ("gauge", "counter"):
        idx = h._index.get(table, (np.zeros(0, np.int64), None))
        slots = np.arange(idx[0].size) if idx[1] is None else idx[1]  # (None: each key's slot its position)
        keys = h._slot_ms[table]
        out.append((idx[0].tolist(), slots.tolist(), idx[1] is None, np.concatenate(keys).tolist() if keys else []))
    for g in h._groups:
        out.append((g.keep, g.cm.tolist(), g.cs.tolist(), np.nan_to_num(g.T[g.r0:g.r1], nan=-7.0).tolist(),
                    np.nan_to_num(g.V[g.r0:g.r1], nan=-7.0).tolist()))
    return out


def _view(v: Snapshot) -> list[object]:
    out: list[object] = [sorted(v.index.bounds.items()) if v.index is not None else None]
    for a in (v.metric_ids, v.series_ids, v.values, v.ts):
        out.append((a.dtype.str, np.nan_to_num(a, nan=-7.0).tolist()))
    return out


rows_st = st.lists(st.tuples(st.integers(0, len(METRICS) - 1), st.integers(0, 11),
                             st.sampled_from([0.0, 1.0, 3.0, 80.0]), st.sampled_from([0.0, -5.0, 2.0, np.nan])),
                   min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(rows_st, st.permutations(range(len(METRICS))), st.integers(0, len(METRICS)), st.booleans(), rows_st,
       st.booleans())
def test_first_write_is_the_plain_path(rows: list[tuple[int, int, float, float]], shuffle: list[int], n_names: int,
                                       view_first: bool, later: list[tuple[int, int, float, float]],
                                       frozen: bool) -> None:
    first = _snapshot(rows, shuffle, n_names)
    then = _snapshot(later, shuffle, n_names)
    if frozen:  # ids nothing can write to: the plans keep the very arrays (no copy) and know them again
        for snap in (first, then):
            snap.metric_ids.flags.writeable = snap.series_ids.flags.writeable = False
    fast, plain = SignalHistory(POLICY), PlainHistory(POLICY)
    for h in (fast, plain):
        if view_first:
            h.view(990.0)
        h.add(first)
    assert _state(fast) == _state(plain)
    assert _view(fast.view(1010.0)) == _view(plain.view(1010.0))
    for h in (fast, plain):
        h.add(then.with_at(1015.0))
        h.add(first.with_at(1030.0))
    assert _state(fast) == _state(plain)
    assert _view(fast.view(1040.0)) == _view(plain.view(1040.0))
    if frozen:
        plans = [p for p in fast._plans.values() if p.labelsets is first.labelsets]
        assert all(p.metric_ids is first.metric_ids and p.seen_ids is not None for p in plans)

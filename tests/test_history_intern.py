"""The history interns label sets in batches (signals/history.py ``_intern``): a first write builds the
index in one pass when its label sets are distinct, later batches look each one up once and intern only
those not found. The ids, the history's label-set list and its index are those of the loop that
interned one label set at a time, for any sequence of batches (duplicates within a batch, label sets
seen before, a first batch with duplicates); and counter slots land in the groups of their metric's
(retention, SLO) whichever metrics a first write brings."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder

_SETS = [(("node", f"n{i % 5}"), ("gpu", str(i))) for i in range(12)] + [(), (("node", "n0"),)]


def _loop(batches: list[list[tuple[tuple[str, str], ...]]]) -> tuple[list[list[int]], list[tuple[tuple[str, str], ...]]]:
    ix: dict[tuple[tuple[str, str], ...], int] = {}
    out = []
    for b in batches:
        out.append([ix.setdefault(ls, len(ix)) for ls in b])
    return out, list(ix)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_SETS), max_size=10), max_size=5))
def test_batches_intern_as_the_loop(batches: list[list[tuple[tuple[str, str], ...]]]) -> None:
    h = SignalHistory(default_policy())
    got = [h._intern(b).tolist() for b in batches]
    want, sets = _loop(batches)
    assert got == want
    assert h.labelsets == sets
    assert h._ls_ix == {ls: i for i, ls in enumerate(sets)}


def test_first_write_of_distinct_sets_and_later_lists() -> None:
    h = SignalHistory(default_policy())
    first: list[tuple[tuple[str, str], ...]] = [(("node", f"n{i}"),) for i in range(1000)]
    assert h._intern(first).tolist() == list(range(1000))
    again: list[tuple[tuple[str, str], ...]] = [(("node", "n5"),), (("node", "x"),), (("node", "n5"),), (("node", "x"),)]
    assert h._intern(again).tolist() == [5, 1000, 5, 1000]
    assert h.labelsets == first + [(("node", "x"),)]


def test_cold_counters_land_in_their_metrics_groups() -> None:
    """A first write with gauges and counters of several retentions (and an SLO's request counter):
    each counter column is in the group of its metric's (retention, SLO), as the view reads them."""
    pol = default_policy()
    h = SignalHistory(pol)
    b = SnapshotBuilder()
    counters = sorted(h.counter_keep)
    for g in range(40):
        labels = {"Hostname": f"n{g // 8}", "gpu": str(g % 8)}
        for name in counters:
            b.add(name, labels, float(g), 1000.0)
        b.add("DCGM_FI_DEV_GPU_TEMP", labels, 50.0, 1000.0)
    h.add(b.build(1000.0))
    assert h._groups
    for slot in range(h._c_grp.size):
        key = np.concatenate(h._slot_ms["counter"])[slot]
        metric = h.metrics[int(key >> 32)]
        grp = h._groups[int(h._c_grp[slot])]
        assert grp.keep == h.counter_keep[metric]
        assert h._group_of_keep[(grp.keep, metric in h.slo_counters)] == int(h._c_grp[slot])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 40)), max_size=60),
       st.sampled_from([np.int32, np.int64]))
def test_unique_pairs_is_np_unique(pairs: list[tuple[int, int]], dtype: type) -> None:
    """The presence table (in place, int32 or int64 ids) answers as np.unique of the packed pairs; so
    does its sort fallback (a sparse table)."""
    from fleethealth.signals.history_pairs import _unique_pairs

    m: np.ndarray = np.asarray([p[0] for p in pairs], dtype)
    s: np.ndarray = np.asarray([p[1] for p in pairs], dtype)
    uniq, inv = _unique_pairs(m, s)
    want_u, want_inv = np.unique((m.astype(np.int64) << 32) | s.astype(np.int64), return_inverse=True)
    assert uniq.tolist() == want_u.tolist()
    assert inv.tolist() == want_inv.reshape(-1).tolist()
    sparse_m = m.astype(np.int64) * 1000  # a table far larger than the pairs: the sort
    uniq, inv = _unique_pairs(sparse_m, s)
    want_u, want_inv = np.unique((sparse_m << 32) | s.astype(np.int64), return_inverse=True)
    assert uniq.tolist() == want_u.tolist() and inv.tolist() == want_inv.reshape(-1).tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.booleans())
def test_stable_order_is_a_stable_argsort(slots: list[int], run: bool) -> None:
    """Distinct slots forming a run are placed at their offsets; anything else is sorted: either way a
    stable argsort."""
    from fleethealth.signals.history_pairs import _stable_order

    a = np.asarray(slots if not run else list(np.random.default_rng(len(slots)).permutation(len(slots)) + 5),
                   np.int64)
    assert _stable_order(a).tolist() == np.argsort(a, kind="stable").tolist()

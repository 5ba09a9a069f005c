"""A rolling window of signals: what the engine needs to score "now" from a stream of snapshots.

Gauges need only their latest sample per series (older ones are staler), but the entity must stay
visible after its exporter dies, so the latest sample is remembered for ``memory_s`` and the engine sees
it as stale: unknown, never healthy. Counters need a window of samples to become rates, and SLO
counters need hours: counter samples are kept per metric for as long as the policy's longest window for
that metric, thinned to one sample per ``coarse_s`` once older than ``dense_s`` and one per
``sparse_coarse_s`` once older than ``sparse_s`` (a rate over hours needs its end points, not every
scrape). Thinning goes by the ages as of the last multiple of ``thin_every_s`` (4 minutes), not ``now``:
a long group's matrices are copied when its rows are thinned (a view's slices must stay valid), so the
copy is paid once per 4 minutes, not every ingest; a thinned row lives up to that much past its tier's
age, where no window of the default policy starts (30 min, 1 h and 6 h read rows far from 15 and 65
min), and the views stay a function of ``now`` (``tests/history_reference.py`` thins by the same rule).
Counter resets are folded in on arrival (a reset-corrected
cumulative value), so thinning can never hide a reset; a drop that comes back to the old count soon
after is an exporter glitch, not a reset (``signals.counter_glitch``).

Counters are stored grouped by retention (and by reader: SLO or rate) as matrices (a row per ingest, a
column per series: ``signals.history_counters``), so a view hands the engine each counter's samples as a
``CounterMatrix`` on its ``ViewIndex``: a window's increase is a difference of two entries, read without
sorting the view's rows. This module keeps the gauges, ingests snapshots (a layout seen before lands
through its ``_Plan`` without re-deriving slots; label sets are interned in batches, a first write's in
one C-level pass; the first write itself, every pair new, orders its rows once and stores its gauges as
their arrays are made: ``_first_plan``; gauge arrays grow into room left after them, ``_Room``), expires
and thins the counter chunks as of ``now`` and builds the views (slots in key order, all live: the gauge
rows are the slots, read without a sort or gather; ``signals.history_pairs``): the view side is the mixin
``signals.history_view._HistoryViews``.

Pure data structure: no clock, no I/O; ``now`` is an argument.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np

from fleethealth.policy import Policy
from fleethealth.signals.counter_glitch import CounterGlitches
from fleethealth.signals.history_counters import (
    _Chunk,
    _Group,
    _run,
    counter_metrics,
    slo_counter_metrics,
    value_start_metrics,
)
from fleethealth.signals.history_pairs import (
    _first_layout,
    _frozen,
    _grown,
    _is_identity,
    _Plan,
    _Room,
    _slice_or_none,
    _stable_order,
    _tail,
    _unique_pairs,
)
from fleethealth.signals.history_view import _HistoryViews
from fleethealth.signals.slo_buckets import HistogramIds, buckets_at_threshold
from fleethealth.signals.snapshot import (
    InputIssue,
    LabelSet,
    Snapshot,
    label_float,
    order_by_series_time,
)

_SERIAL = itertools.count()
# Live histories, so that ``shape_token(view)`` finds the one that made a view (a wrapper such as the
# backtest's shared history need not forward anything).
_HISTORIES: weakref.WeakSet[SignalHistory] = weakref.WeakSet()


def shape_token(view: Snapshot) -> Hashable | None:
    """A token equal for two views of one history exactly when both hold the same set of (metric,
    series) pairs: whatever is derived from which series exist (an entity's metadata labels, its series
    list) and not from values or times can be reused between views with equal tokens. None when the
    view did not come from a live SignalHistory."""
    for h in list(_HISTORIES):
        if h._last_view is view:
            return h._last_token
    return None


def _layout_ids(snap: Snapshot) -> tuple[np.ndarray, np.ndarray]:
    """A snapshot's metric and series ids as a plan keeps them: copies, unless nothing can write to them
    (``_frozen``: then the very arrays, and no new 20 MB on a cold start at 100k GPUs)."""
    m, s = snap.metric_ids, snap.series_ids
    return (m if _frozen(m) else m.copy()), (s if _frozen(s) else s.copy())


def _seen_ids(snap: Snapshot) -> tuple[np.ndarray, np.ndarray] | None:
    """``_Plan.seen_ids`` of a plan made from ``snap``: its id arrays when nothing can write to them."""
    m, s = snap.metric_ids, snap.series_ids
    return (m, s) if _frozen(m) and _frozen(s) else None


class SignalHistory(_HistoryViews):
    def __init__(
        self,
        policy: Policy,
        memory_s: float = 3600.0,
        dense_s: float = 900.0,
        coarse_s: float = 60.0,
        sparse_s: float = 3900.0,
        sparse_coarse_s: float = 300.0,
        thin_every_s: float = 240.0,
    ) -> None:
        self.policy = policy
        self.memory_s = memory_s
        self.dense_s = dense_s
        self.coarse_s = coarse_s
        # Beyond an hour (plus margin, so an hour-long window keeps its minute resolution) one sample
        # per 5 minutes: a 6-hour burn rate moves by well under 2% for its start a few minutes later,
        # and the view, scored every cycle, is 2.5x smaller.
        self.sparse_s = max(sparse_s, dense_s)
        self.sparse_coarse_s = sparse_coarse_s
        # thinning by the ages as of the last multiple of this: one copy of a long group per thin_every_s
        # (module docstring); a function of ``now`` only, so views do not depend on how often they are taken
        self.thin_every_s = thin_every_s
        self.counter_keep = counter_metrics(policy)
        self.slo_counters = slo_counter_metrics(policy)
        self.value_start = value_start_metrics(policy)
        # Histogram buckets an SLO reads at a latency threshold: the engine reads one bucket (the
        # largest bound <= threshold), so only that one is kept - most of a histogram's rows otherwise.
        self._bucket_thresholds: dict[str, list[float]] = {}
        for spec in policy.signals:
            if spec.shape == "slo" and spec.threshold_s is not None:
                self._bucket_thresholds.setdefault(spec.metric + "_bucket", []).append(spec.threshold_s)
        self._le: list[float] = []  # per history label set: its `le` bound (NaN without one)
        self._hist_ids = HistogramIds()  # per history label set: its histogram (the label set without `le`)
        self._track_start = np.zeros(0, bool)
        self.metrics: list[str] = []
        self._metric_ix: dict[str, int] = {}
        self.labelsets: list[LabelSet] = []
        self._ls_ix: dict[LabelSet, int] = {}
        self._map_cache: dict[int, tuple[list[str], list[LabelSet], int, int, np.ndarray, np.ndarray]] = {}
        # gauges: latest per (metric, series) slot
        self._g_m = np.zeros(0, np.int32)
        self._g_s = np.zeros(0, np.int32)
        self._g_v = np.zeros(0, np.float64)
        self._g_t = np.full(0, -np.inf)
        # when the current value started: read and written only for event-like gauges (``_track_start``),
        # undefined for the others (a first write leaves theirs unwritten: ``_Room.first_gauges``)
        self._g_since = np.full(0, -np.inf)
        self._room = _Room()  # where the gauge arrays grow (``history_pairs._Room``)
        # gauge slots below this: their values and times are lent to a view, never written in place
        # (``_writable_gauges``)
        self._g_lent = 0
        # counters: matrices per retention (``_Group``) of corrected values and times, the ingests that
        # made their rows (``_Chunk``, for retention and thinning); reset correction per slot
        self._chunks: list[_Chunk] = []
        # per chunk, in list order: its time, shortest and longest retention, cid (what ``_compact`` reads
        # every view, as arrays: not a pass of Python over a few hundred chunks); appended rows wait in
        # ``_chunk_new`` until the next compaction
        self._chunk_arr = np.zeros((0, 4))
        self._chunk_new: list[tuple[float, float, float, float]] = []
        self._groups: list[_Group] = []
        # a group per (retention, read by an SLO): an SLO reads several windows at once over its
        # whole group (``score.slo``), a rate counter one window, so neither pays for the other's columns
        self._group_of_keep: dict[tuple[float, bool], int] = {}
        self._cid = 0
        self._c_grp = np.zeros(0, np.int64)  # counter slot -> group
        self._c_col = np.zeros(0, np.int64)  # counter slot -> column in its group
        self._c_last = np.zeros(0, np.float64)
        self._c_off = np.zeros(0, np.float64)
        self._glitches = CounterGlitches()  # drops that are exporter glitches, not resets, if they come back
        self._max_t = -np.inf  # latest sample time ever added (bounds the view's)
        self._keep_of_metric = np.zeros(0, np.float64)
        self._slo_metric = np.zeros(0, bool)
        self.issues: list[InputIssue] = []
        self.source_errors: list[InputIssue] = []
        self.last_at = -np.inf
        # per table: its keys ascending and each key's slot; None: the slot is the key's position (slots
        # made in key order, as a cold start's are: no arange of 2.4M slots to make or keep)
        self._index: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        self._n_slots: dict[str, int] = {}
        self._slot_ms: dict[str, list[np.ndarray]] = {"gauge": [], "counter": []}  # (metric << 32 | series) per slot
        # The view's set of (metric, series) pairs changes only when a gauge slot is born, revived or
        # forgotten, or a counter slot's count of retained chunks moves between zero and non-zero:
        # ``_epoch`` counts those moments (see ``shape_token``).
        self._serial = next(_SERIAL)
        self._epoch = 0
        # gauge slots sorted by (metric, series), and their keys
        self._g_order: tuple[int, np.ndarray | None, np.ndarray] | None = None
        self._last_view: Snapshot | None = None
        self._last_token: Hashable | None = None
        # The last full view's gauge layout, to patch it when only gauge values of series it holds have
        # come in since at the same ``now`` (a cycle's derived signals; see ``_patched_view``):
        # (now, epoch, chunk serial, gauge slot -> view row or -1 (None: the slot itself), gauge slots).
        self._view_layout: tuple[float, int, int, np.ndarray | None, int] | None = None
        # the gauge part of a view's layout (see ``_gauge_layout``)
        self._g_base: tuple[int, int, np.ndarray | None, np.ndarray, Any] | None = None
        self._dirty: list[np.ndarray | slice] = []  # gauge slots stored since the last view
        self._plans: dict[tuple[int, int], _Plan] = {}
        _HISTORIES.add(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A copy (deepcopy, pickle: the backtest forks a lane's history when an arm acts) diverges from
        # its original, so it gets its own serial, and it registers so that shape_token finds its views.
        self.__dict__.update(state)
        self._serial = next(_SERIAL)
        self._last_view, self._last_token = None, None
        self._view_layout, self._dirty, self._g_base = None, [], None
        self._g_lent = 0  # (a copy's arrays are its own)
        _HISTORIES.add(self)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_room"] = _Room()  # a copy's arrays are its own: its room is made when it first grows
        return state

    # -- interning -------------------------------------------------------------------------------
    def _metric(self, name: str) -> int:
        ix = self._metric_ix.get(name)
        if ix is None:
            ix = self._metric_ix[name] = len(self.metrics)
            self.metrics.append(name)
            keep = self.counter_keep.get(name)
            self._keep_of_metric = np.append(self._keep_of_metric, -1.0 if keep is None else keep)
            self._slo_metric = np.append(self._slo_metric, name in self.slo_counters)
            self._track_start = np.append(self._track_start, name in self.value_start)
        return ix

    def _maps(self, snap: Snapshot) -> tuple[np.ndarray, np.ndarray]:
        """Snapshot ids -> history ids. Cached per label-set list, extended as that list grows (the
        simulator and a long-lived parser builder keep appending to one list)."""
        key = id(snap.labelsets)
        c = self._map_cache.get(key)
        if c is not None and c[0] is snap.metrics and c[1] is snap.labelsets:
            _, _, nm, ns, mmap, smap = c
        else:
            nm, ns, mmap, smap = 0, 0, np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(snap.metrics) > nm:
            mmap = np.concatenate((mmap, np.array([self._metric(m) for m in snap.metrics[nm:]], np.int64)))
        if len(snap.labelsets) > ns:
            smap = np.concatenate((smap, self._intern(snap.labelsets[ns:])))
        if len(self._map_cache) > 16:
            self._map_cache.clear()
        self._map_cache[key] = (snap.metrics, snap.labelsets, len(snap.metrics), len(snap.labelsets), mmap, smap)
        return mmap, smap

    def _intern(self, batch: list[LabelSet]) -> np.ndarray:
        """History ids of ``batch``'s label sets, interning new ones in order of first appearance. A label
        set is hashed once where it can be (a tuple of pairs: its hash is not cached): a first write
        (100k GPUs: ~112k label sets, all new) builds the index in one C-level pass, and a batch of only new
        ones joins it in one; otherwise one lookup each, and only label sets not found go through the loop
        that interns them."""
        ix = self._ls_ix
        base = len(self.labelsets)
        if not ix:
            fresh = dict(zip(batch, itertools.count(base)))
            if len(fresh) == len(batch):  # all distinct: their ids are their positions
                self._ls_ix = fresh
                self.labelsets.extend(batch)
                return np.arange(base, base + len(batch), dtype=np.int64)
        ids = list(map(ix.get, batch))
        if None in ids:
            if ids.count(None) == len(ids):  # all new (a cycle's derived signals on a cold start)
                fresh = dict(zip(batch, itertools.count(base)))
                if len(fresh) == len(batch):  # and distinct: their ids are their positions after the known
                    ix.update(fresh)  # (a dict's entries carry their hashes: nothing is hashed again)
                    self.labelsets.extend(batch)
                    return np.arange(base, base + len(batch), dtype=np.int64)
            for j in [j for j, i in enumerate(ids) if i is None]:
                ls = batch[j]
                i = ix.get(ls)
                if i is None:
                    i = ix[ls] = len(self.labelsets)
                    self.labelsets.append(ls)
                ids[j] = i
        return np.array(ids, np.int64)

    def _le_of(self, series: np.ndarray) -> np.ndarray:
        self._le.extend(label_float(ls, "le") for ls in self.labelsets[len(self._le):])
        return np.asarray(self._le, np.float64)[series]

    def _wanted(self, m: np.ndarray, s: np.ndarray) -> np.ndarray | None:
        """Rows to keep (None: all): of a histogram an SLO reads at a threshold, only the bucket at the
        largest bound <= threshold among this snapshot's buckets of that histogram."""
        keep: np.ndarray | None = None
        for name, thresholds in self._bucket_thresholds.items():
            mid = self._metric_ix.get(name)
            if mid is None:
                continue
            rows = np.flatnonzero(m == mid)
            if rows.size == 0:
                continue
            le = self._le_of(s[rows])
            hist = self._hist_ids.of(self.labelsets, s[rows])  # per histogram (signals.slo_buckets)
            want = np.zeros(rows.size, bool)
            for thr in thresholds:
                want |= buckets_at_threshold(le, hist, thr)
            if keep is None:
                keep = np.ones(m.size, bool)
            keep[rows] = want
        return keep

    # -- ingest ----------------------------------------------------------------------------------
    def add(self, snap: Snapshot) -> None:
        self.issues.extend(snap.issues)
        del self.issues[:-1000]  # keep the latest; the sources report them as they come
        self.source_errors.extend(snap.source_errors)
        self.last_at = max(self.last_at, snap.at)
        if len(snap) == 0:
            return
        plan = self._plan_for(snap)
        if plan is not None:
            self._add_planned(snap, plan, gauges=not plan.gauges_stored)
            plan.gauges_stored = False
            return
        mmap, smap = self._maps(snap)
        m = mmap[snap.metric_ids]
        s = smap[snap.series_ids]
        v = snap.values
        t = snap.ts
        ok = ~np.isnan(v)
        m, s, v, t = m[ok], s[ok], v[ok], t[ok]
        wanted = self._wanted(m, s)
        if wanted is not None:
            m, s, v, t = m[wanted], s[wanted], v[wanted], t[wanted]
        is_c = self._keep_of_metric[m] > 0
        self._add_gauges(m[~is_c], s[~is_c], v[~is_c], t[~is_c])
        if is_c.any():
            self._add_counters(snap.at, m[is_c], s[is_c], v[is_c], t[is_c])

    def _plan_for(self, snap: Snapshot) -> _Plan | None:
        """The plan of this snapshot's layout (cached per label-set list, the few most recent), or None
        for a snapshot with NaN values (dropped rows change the layout) or a pair twice in it."""
        if np.isnan(snap.values).any():
            return None
        key = (id(snap.metrics), id(snap.labelsets))
        p = self._plans.pop(key, None)
        mmap, smap = self._maps(snap)  # interns label sets the rows do not use yet, as the plain path does
        if p is not None and p.metrics is snap.metrics and p.labelsets is snap.labelsets:
            ids = p.seen_ids
            if ids is not None and ids[0] is snap.metric_ids and ids[1] is snap.series_ids:
                self._plans[key] = p  # most recent last; the very arrays, unchanged since (read-only)
                return p
            if (p.metric_ids.shape == snap.metric_ids.shape and np.array_equal(p.metric_ids, snap.metric_ids)
                    and np.array_equal(p.series_ids, snap.series_ids)):
                self._plans[key] = p
                if _frozen(snap.metric_ids) and _frozen(snap.series_ids):
                    p.seen_ids = (snap.metric_ids, snap.series_ids)
                return p
        if len(self._plans) >= 8:
            self._plans.pop(next(iter(self._plans)))
        # the same layout in new lists (a producer that builds each snapshot afresh, like the structural
        # signals every cycle): equal names and ids give equal slots, so the plan holds
        for q in reversed(self._plans.values()):
            if (len(q.labelsets) == len(snap.labelsets) and len(q.metrics) == len(snap.metrics)
                    and q.metric_ids.shape == snap.metric_ids.shape and np.array_equal(q.metric_ids, snap.metric_ids)
                    and np.array_equal(q.series_ids, snap.series_ids) and q.metrics == snap.metrics
                    and q.labelsets == snap.labelsets):
                p = self._plans[key] = dataclasses.replace(q, metrics=snap.metrics, labelsets=snap.labelsets,
                                                           seen_ids=None)
                return p
        if not self._n_slots:  # the history's first write
            p = self._first_plan(snap, mmap, smap)
            if p is not None:
                self._plans[key] = p
                return p
        # ids as int32 (they fit: metric and series ids of one history): half the new memory of a cold
        # start's gathers, which is page faults
        m = mmap.astype(np.int32)[snap.metric_ids]
        s = smap.astype(np.int32)[snap.series_ids]
        is_c = self._keep_of_metric[m] > 0
        wanted = self._wanted(m, s)
        g_rows = np.flatnonzero(~is_c if wanted is None else ~is_c & wanted)
        c_rows = np.flatnonzero(is_c if wanted is None else is_c & wanted)
        g_slot, g_new = self._slots("gauge", m[g_rows], s[g_rows])
        c_slot, c_new = self._slots("counter", m[c_rows], s[c_rows])
        if g_new or c_new:
            # slots just made for this plan: the first add gives them their arrays (the plain path)
            self._unplanned_slots(g_new, c_new)
        go, co = _stable_order(g_slot), _stable_order(c_slot)
        g_slot, c_slot = g_slot[go], c_slot[co]
        if (g_slot[1:] == g_slot[:-1]).any() or (c_slot[1:] == c_slot[:-1]).any():
            return None  # a pair twice in one snapshot: its order depends on the timestamps
        g_rows, c_rows = g_rows[go], c_rows[co]
        p = _Plan(snap.metrics, snap.labelsets, *_layout_ids(snap), g_rows, _run(g_slot),
                  np.flatnonzero(self._track_start[m[g_rows]]), c_rows, c_slot,
                  _slice_or_none(_run(c_slot)), self._parts(c_slot), {}, _seen_ids(snap))
        self._plans[key] = p
        return p

    def _first_plan(self, snap: Snapshot, mmap: np.ndarray, smap: np.ndarray) -> _Plan | None:
        """``_plan_for``'s new plan on the history's first write (no slot yet), None when a pair occurs twice:
        the same slots (each table's in (metric, series) order) from one ordering of the rows
        (``history_pairs._first_layout``), the gauges stored as their arrays are made, not NaN-filled and
        written over: the cold start at 100k GPUs is 2.5M new series, and every pass over them 20 MB."""
        m = snap.metric_ids if _is_identity(mmap, snap.metric_ids) else mmap.astype(np.int32)[snap.metric_ids]
        s = snap.series_ids if _is_identity(smap, snap.series_ids) else smap.astype(np.int32)[snap.series_ids]
        wanted = self._wanted(m, s)
        kept = None if wanted is None else np.flatnonzero(wanted)
        m, s = (m, s) if kept is None else (m[kept], s[kept])
        first = _first_layout(m, s, self._keep_of_metric > 0, self._track_start, kept, self._room)
        if first is None:
            return None
        g_rows, g_key, g_m, g_track, c_rows, c_key = first
        n_g, n_c = g_rows.size, c_rows.size
        for table, k in (("gauge", g_key), ("counter", c_key)):
            if k.size:  # (the gauges' keys with room to grow: ``_first_layout``; slot i is key i)
                self._index[table] = (k, None)
                self._n_slots[table] = k.size
                self._slot_ms[table].append(k)
        stored = True
        if n_g:
            arrays = self._room.first_gauges(snap.values, snap.ts, g_rows, g_m, g_key, g_track)
            latest = float(arrays[3].max())  # (NaN if any time is: one pass for both)
            if np.isnan(latest):  # a sample with no time is not stored: the plain way
                self._room = _Room()
                self._unplanned_slots(n_g, 0)
                stored = False
            else:  # = ``_store_gauges`` into new slots (each takes its sample; value start: its time)
                self._g_m, self._g_s, self._g_v, self._g_t, self._g_since = arrays
                self._g_lent = 0
                self._epoch += 1
                if self._view_layout is not None:
                    self._dirty.append(slice(0, n_g))
                self._max_t = max(self._max_t, latest)
        if n_c:
            self._unplanned_slots(0, n_c)
        c_slot = np.arange(n_c)
        return _Plan(snap.metrics, snap.labelsets, *_layout_ids(snap), g_rows,
                     slice(0, n_g) if n_g else np.zeros(0, np.int64), g_track, c_rows, c_slot,
                     slice(0, n_c) if n_c else None, self._parts(c_slot), {}, _seen_ids(snap), gauges_stored=stored)

    def _unplanned_slots(self, g_new: int, c_new: int) -> None:
        if g_new:
            key = _tail(self._slot_ms["gauge"], g_new)
            room = self._room
            self._g_m = room.grown("m", self._g_m, (key >> 32).astype(np.int32))
            self._g_s = room.grown("s", self._g_s, (key & 0xFFFFFFFF).astype(np.int32))
            self._g_v = room.grown("v", self._g_v, np.full(g_new, np.nan))
            self._g_t = room.grown("t", self._g_t, np.full(g_new, -np.inf))
            self._g_since = room.grown("since", self._g_since, np.full(g_new, -np.inf))
        if c_new:
            base = self._c_last.size
            self._c_last = _grown(self._c_last, np.full(c_new, np.nan))
            self._c_off = _grown(self._c_off, np.zeros(c_new))
            self._c_grp = _grown(self._c_grp, np.zeros(c_new, np.int64))
            self._c_col = _grown(self._c_col, np.zeros(c_new, np.int64))
            key = _tail(self._slot_ms["counter"], c_new)  # (the slots base .. base + c_new)
            m, s = key >> 32, key & 0xFFFFFFFF
            keeps = self._keep_of_metric[m]
            slo = self._slo_metric[m]
            slots = np.arange(base, base + c_new)
            # (retention, SLO) is a function of the metric: the distinct pairs from the distinct metrics
            # (a set over every new slot's pair costs ~0.05 s on a cold 100k-GPU start)
            ms = np.flatnonzero(np.bincount(m, minlength=1)).tolist()
            km, sm = self._keep_of_metric.tolist(), self._slo_metric.tolist()
            for keep, is_slo in sorted({(km[i], sm[i]) for i in ms}):
                gi = self._group_of_keep.get((keep, is_slo))
                if gi is None:
                    gi = self._group_of_keep[(keep, is_slo)] = len(self._groups)
                    self._groups.append(_Group(keep))
                sel = (keeps == keep) & (slo == is_slo)
                g = self._groups[gi]
                g.add_columns(m[sel], s[sel], slots[sel])
                self._c_grp[slots[sel]] = gi
                self._c_col[g.cslot] = np.arange(g.cslot.size)
            self._epoch += 1

    def _parts(self, slot: np.ndarray) -> list[tuple[int, np.ndarray]]:
        grp = self._c_grp[slot]
        if grp.size and bool((grp == grp[0]).all()):
            return [(int(grp[0]), np.arange(grp.size))]
        return [(int(g), np.flatnonzero(grp == g)) for g in np.unique(grp).tolist()]

    def _add_planned(self, snap: Snapshot, p: _Plan, gauges: bool = True) -> None:
        """``add`` for a known layout: the same arithmetic as the plain path, on precomputed rows."""
        v, t = snap.values, snap.ts
        if gauges and p.g_rows.size:
            gv, gt = v[p.g_rows], t[p.g_rows]
            self._store_gauges(p.g_slot, gv, gt, p.g_track)
        if p.c_rows.size:
            self._store_counters(snap.at, p.c_slot, v[p.c_rows], t[p.c_rows], p.c_parts, p.c_run, p.c_cols)

    def _slots(self, table: str, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, int]:
        """Slot of each (metric, series) pair, creating slots for new pairs; vectorised with a sorted key
        index (a Python dictionary per pair costs seconds per cycle at 100k GPUs)."""
        keys_sorted, slots_sorted = self._index.get(table, (np.zeros(0, np.int64), None))
        uniq, inv = _unique_pairs(m, s)
        n_have = keys_sorted.size
        if n_have == 0 and uniq.size:  # the first write (a cold start): every pair new, the index is uniq
            # itself (np.insert into an empty index argsorts its 2.5M positions at 100k GPUs: ~0.3 s)
            base = self._n_slots.get(table, 0)
            self._index[table] = (uniq, None if base == 0 else np.arange(base, base + uniq.size))
            self._n_slots[table] = base + uniq.size
            self._slot_ms[table].append(uniq)
            inv += base  # = slots_u[inv], in place (inv is _unique_pairs' own)
            return inv, int(uniq.size)
        pos = np.asarray(np.searchsorted(keys_sorted, uniq), np.int64)
        found = np.zeros(uniq.size, bool)
        if n_have:
            found = keys_sorted[np.minimum(pos, n_have - 1)] == uniq
        slots_u = np.empty(uniq.size, np.int64)
        if slots_sorted is None:  # (each key's slot is its position)
            slots_u[found] = pos[found]
        else:
            slots_u[found] = slots_sorted[np.minimum(pos, max(n_have - 1, 0))[found]]
        new = ~found
        n_new = int(new.sum())
        base = self._n_slots.get(table, 0)
        slots_u[new] = np.arange(base, base + n_new)
        if n_new:
            if n_have and uniq[new][0] > keys_sorted[-1]:  # all after the last: appended (into room)
                # (slots base, base + 1, ... after keys at positions base, base + 1, ...: still each key's
                # slot its position where it was)
                same = slots_sorted is None and base == n_have
                self._index[table] = (self._room.grown(table + " keys", keys_sorted, uniq[new]), None if same else
                                      self._room.grown(table + " slots", np.arange(n_have) if slots_sorted is None
                                                       else slots_sorted, slots_u[new]))
            else:
                every = np.arange(n_have) if slots_sorted is None else slots_sorted
                self._index[table] = (np.insert(keys_sorted, pos[new], uniq[new]),
                                      np.insert(every, pos[new], slots_u[new]))
            self._n_slots[table] = base + n_new
            self._slot_ms[table].append(uniq[new])  # in slot order (slots_u[new] is ascending)
        return slots_u[inv], n_new

    def _add_gauges(self, m: np.ndarray, s: np.ndarray, v: np.ndarray, t: np.ndarray) -> None:
        if m.size == 0:
            return
        slot, grown = self._slots("gauge", m, s)
        self._unplanned_slots(grown, 0)
        # keep the latest sample per slot (ties: the later one in the batch)
        order = order_by_series_time(slot, t)
        so = slot[order]
        last = np.ones(so.size, bool)
        last[:-1] = so[1:] != so[:-1]
        pick = order[last]
        self._store_gauges(slot[pick], v[pick], t[pick], None)

    def _store_gauges(self, sl: np.ndarray | slice, v: np.ndarray, t: np.ndarray, track: np.ndarray | None) -> None:
        """One sample per slot (distinct ``sl``): kept where not older than the slot's. ``track``: the
        positions of event-like gauges (None: find them)."""
        gt = self._g_t[sl]
        newer = t >= gt
        if not newer.all():
            if isinstance(sl, slice):
                sl = np.arange(sl.start, sl.stop)
            sl, v, t, gt, track = sl[newer], v[newer], t[newer], gt[newer], None
        if not np.isfinite(gt).all():
            self._epoch += 1  # a slot born or revived: a new pair in the view
        if track is None:
            track = np.flatnonzero(self._track_start[self._g_m[sl]])
        if track.size:  # when the current value started: only event-like gauges read it
            ts_ = sl[track] if isinstance(sl, np.ndarray) else track + sl.start
            changed = ~(self._g_v[ts_] == v[track])  # NaN (new slot) counts as a change
            self._g_since[ts_] = np.where(changed, t[track], self._g_since[ts_])
        if self._g_lent:  # (a slice is written in full below: not copied)
            if isinstance(sl, slice):
                self._writable_gauges(sl.start, sl.stop)
            else:
                self._writable_gauges(int(sl.min()) if sl.size else self._g_lent)
        self._g_v[sl] = v
        self._g_t[sl] = t
        if self._view_layout is not None:
            self._dirty.append(sl)
        if t.size:
            self._max_t = max(self._max_t, float(t.max()))

    def _add_counters(self, at: float, m: np.ndarray, s: np.ndarray, v: np.ndarray, t: np.ndarray) -> None:
        slot, grown = self._slots("counter", m, s)
        self._unplanned_slots(0, grown)
        order = order_by_series_time(slot, t)
        v, t, slot = v[order], t[order], slot[order]
        self._store_counters(at, slot, v, t, self._parts(slot), None, None)

    def _store_counters(self, at: float, slot: np.ndarray, v: np.ndarray, t: np.ndarray,
                        parts: list[tuple[int, np.ndarray]], run: slice | None,
                        cols: dict[int, tuple[int, np.ndarray | None]] | None) -> None:
        """Samples in (slot, time) order become one chunk of reset-corrected values: rows of the groups
        (``parts``: which of the samples go to which group; ``run``: ``slot`` as a slice, if it is one)."""
        same = None if run is not None else slot[1:] == slot[:-1]
        rank = None
        if same is None or not same.any():  # one sample per slot (a scrape)
            sl = run if run is not None else slot
            prev = self._c_last[sl]
            reset = v < prev  # (never with NaN: a slot's first sample)
            if reset.any() or len(self._glitches):  # a drop, or one that may turn out an exporter glitch
                self._glitches.scrape(sl, v, t, prev, reset, self._c_off)
            off = self._c_off[sl]
            corrected = v + off
            self._c_last[sl] = v
        else:
            # resets within and across batches: sequential per slot, vectorised across slots
            same = np.concatenate(([False], same))
            prev = np.where(same, np.concatenate(([np.nan], v[:-1])), self._c_last[slot])
            reset = (~np.isnan(prev)) & (v < prev)
            add = np.where(reset, prev, 0.0)
            # offset within each slot run, added up sample by sample: a difference of a running sum over
            # the whole batch would be off by rounding, and a corrected value a hair below the one before
            # reads as a reset (the whole count again) to whoever takes differences
            off = self._c_off[slot] + add
            for i in np.flatnonzero(same).tolist():  # later samples of a series in one batch (rare)
                off[i] = off[i - 1] + add[i]
            if reset.any() or len(self._glitches):  # drops that may be exporter glitches, sample by sample
                off = self._glitches.runs(slot, v, t, self._c_last[slot], self._c_off[slot], off, ~same)
            corrected = v + off
            last_pos = np.ones(slot.size, bool)
            last_pos[:-1] = slot[1:] != slot[:-1]
            uslots = slot[last_pos]
            self._c_last[uslots] = v[last_pos]
            self._c_off[uslots] = off[last_pos]
            idx = np.arange(slot.size)
            rank = idx - np.maximum.accumulate(np.where(~same, idx, 0))
        cid = self._cid
        self._cid += 1
        keeps = []
        born = False
        for gi, sel in parts:
            g = self._groups[gi]
            hit = cols.get(gi) if cols is not None else None
            if hit is not None and hit[0] == g.version:
                c = hit[1]
            else:
                c = self._c_col[slot[sel]]
                if rank is None and c.size == g.cm.size and bool((c == np.arange(c.size)).all()):
                    c = None  # every column once, in order (a scrape of the whole fleet)
                if cols is not None:
                    cols[gi] = (g.version, c)
            whole = sel.size == slot.size
            born |= g.append(at, cid, c, None if rank is None else rank[sel], t if whole else t[sel],
                             corrected if whole else corrected[sel])
            keeps.append(g.keep)
        if born:
            self._epoch += 1
        if t.size:
            self._max_t = max(self._max_t, float(t.max()))
        keeps.sort()
        self._chunks.append(_Chunk(at, cid, keeps))
        self._chunk_new.append((at, keeps[0], keeps[-1], float(cid)))

    def extend(self, snaps: Iterable[Snapshot]) -> None:
        for s in snaps:
            self.add(s)

"""The session-9 SignalHistory (chunk list storage), kept verbatim as the reference the grouped storage of
``fleethealth.signals.history`` is tested against: both must give views with the same samples.

A rolling window of signals: what the engine needs to score "now" from a stream of snapshots.

Gauges need only their latest sample per series (older ones are staler), but the entity must stay
visible after its exporter dies, so the latest sample is remembered for ``memory_s`` and the engine sees
it as stale: unknown, never healthy. Counters need a window of samples to become rates, and SLO
counters need hours: counter samples are kept per metric for as long as the policy's longest window for
that metric, thinned to one sample per ``coarse_s`` once older than ``dense_s`` and one per
``sparse_coarse_s`` once older than ``sparse_s`` (a rate over hours needs its end points, not every
scrape); by the ages as of the last multiple of ``thin_every_s``, as ``signals.history`` (the one change
from session 9: thinning in batches). Counter resets are folded in on arrival (a reset-corrected
cumulative value), so thinning can never hide a reset.

Pure data structure: no clock, no I/O; ``now`` is an argument.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from fleethealth.policy import Policy
from fleethealth.signals.counter_glitch import GLITCH_S
from fleethealth.signals.snapshot import (
    InputIssue,
    LabelSet,
    Snapshot,
    label_float,
    order_by_series_time,
)


def value_start_metrics(policy: Policy) -> set[str]:
    """Gauges whose *change* is the event (DCGM's last-Xid value): the view also carries the time the
    current value started, so an old value is not mistaken for a new occurrence."""
    return {s.metric for s in policy.signals if s.shape == "xid" and s.kind == "gauge"}


def counter_metrics(policy: Policy) -> dict[str, float]:
    """Counter-like metric names the policy reads, with how long each must be kept (seconds)."""
    out: dict[str, float] = {}

    def keep(name: str, s: float) -> None:
        out[name] = max(out.get(name, 0.0), s)

    longest_slo = max((w.long_s for w in policy.slo.windows), default=3600.0)
    for s in policy.signals:
        if s.shape == "slo":
            assert s.requests_metric is not None
            keep(s.requests_metric, longest_slo)
            if s.threshold_s is not None:
                keep(s.metric + "_bucket", longest_slo)
            else:
                keep(s.metric, longest_slo)
        elif s.kind == "counter":
            w = s.rate_window_s or policy.freshness.rate_window_s
            if s.shape == "xid":
                w = max(w, s.xid_window_s or policy.xid.window_s)
            keep(s.metric, w)
    return out


@dataclass(slots=True)
class _Chunk:
    """One ingest's counter samples, sorted by slot then time; ``uslots``: its distinct slots (what it
    contributes to the view's set of series); ``kmin``/``kmax``: the shortest and longest retention of
    its metrics (a chunk younger than ``kmin`` is kept whole without a per-row test)."""

    at: float
    m: np.ndarray
    s: np.ndarray
    v: np.ndarray
    t: np.ndarray
    slot: np.ndarray
    uslots: np.ndarray
    kmin: float
    kmax: float


@dataclass(slots=True)
class _Plan:
    """How one snapshot layout (metric and series ids, row by row) lands in the history: which rows are
    gauges and counters, their slots, and the slot orderings, all independent of values and times.
    A scraper or the simulator sends the same layout every scrape; only when each (metric, series)
    pair occurs once per snapshot, so that the orderings cannot depend on the timestamps."""

    metrics: list[str]
    labelsets: list[LabelSet]
    metric_ids: np.ndarray
    series_ids: np.ndarray
    g_rows: np.ndarray  # snapshot rows of gauges, in slot order
    g_slot: np.ndarray
    g_m: np.ndarray
    g_s: np.ndarray
    c_rows: np.ndarray  # snapshot rows of counters, in slot order
    c_slot: np.ndarray
    c_m32: np.ndarray
    c_s32: np.ndarray
    c_slot32: np.ndarray
    c_kmin: float
    c_kmax: float


_SERIAL = itertools.count()
# Live histories, so that ``shape_token(view)`` finds the one that made a view (a wrapper such as the
# backtest's shared history need not forward anything).
_HISTORIES: weakref.WeakSet[ReferenceHistory] = weakref.WeakSet()


def shape_token(view: Snapshot) -> Hashable | None:
    """A token equal for two views of one history exactly when both hold the same set of (metric,
    series) pairs: whatever is derived from which series exist (an entity's metadata labels, its series
    list) and not from values or times can be reused between views with equal tokens. None when the
    view did not come from a live SignalHistory."""
    for h in list(_HISTORIES):
        if h._last_view is view:
            return h._last_token
    return None


class ReferenceHistory:
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
        self.thin_every_s = thin_every_s  # thinning goes by the ages as of the last multiple of this
        self.counter_keep = counter_metrics(policy)
        self.value_start = value_start_metrics(policy)
        # Histogram buckets an SLO reads at a latency threshold: the engine reads one bucket (the
        # largest bound <= threshold), so only that one is kept - most of a histogram's rows otherwise.
        self._bucket_thresholds: dict[str, list[float]] = {}
        for spec in policy.signals:
            if spec.shape == "slo" and spec.threshold_s is not None:
                self._bucket_thresholds.setdefault(spec.metric + "_bucket", []).append(spec.threshold_s)
        self._le: list[float] = []  # per history label set: its `le` bound (NaN without one)
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
        self._g_since = np.full(0, -np.inf)  # when the current value started (event-like gauges)
        # counters: chunks of (metric, series, corrected value, time); reset correction per slot
        self._chunks: list[_Chunk] = []
        self._c_last = np.zeros(0, np.float64)
        self._c_off = np.zeros(0, np.float64)
        self._glitch: dict[int, tuple[float, float, float]] = {}  # slot -> (value before a drop, offset, time)
        self._keep_of_metric = np.zeros(0, np.float64)
        self.issues: list[InputIssue] = []
        self.source_errors: list[InputIssue] = []
        self.last_at = -np.inf
        self._index: dict[str, list[np.ndarray]] = {}
        self._n_slots: dict[str, int] = {}
        # The view's set of (metric, series) pairs changes only when a gauge slot is born, revived or
        # forgotten, or a counter slot's count of retained chunks moves between zero and non-zero:
        # ``_epoch`` counts those moments (see ``shape_token``).
        self._serial = next(_SERIAL)
        self._epoch = 0
        self._c_count = np.zeros(0, np.int64)
        self._chunks_version = 0
        self._counter_cat: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._last_view: Snapshot | None = None
        self._last_token: Hashable | None = None
        self._plans: dict[tuple[int, int], _Plan] = {}
        _HISTORIES.add(self)

    # -- interning -------------------------------------------------------------------------------
    def _metric(self, name: str) -> int:
        ix = self._metric_ix.get(name)
        if ix is None:
            ix = self._metric_ix[name] = len(self.metrics)
            self.metrics.append(name)
            keep = self.counter_keep.get(name)
            self._keep_of_metric = np.append(self._keep_of_metric, -1.0 if keep is None else keep)
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
            new = []
            for ls in snap.labelsets[ns:]:
                ix = self._ls_ix.get(ls)
                if ix is None:
                    ix = self._ls_ix[ls] = len(self.labelsets)
                    self.labelsets.append(ls)
                new.append(ix)
            smap = np.concatenate((smap, np.array(new, np.int64)))
        if len(self._map_cache) > 16:
            self._map_cache.clear()
        self._map_cache[key] = (snap.metrics, snap.labelsets, len(snap.metrics), len(snap.labelsets), mmap, smap)
        return mmap, smap

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
            hist = [tuple(p for p in self.labelsets[x] if p[0] != "le") for x in s[rows].tolist()]
            want = np.zeros(rows.size, bool)
            for thr in thresholds:  # per histogram (its label set without `le`): its largest bound <= thr
                best: dict[object, float] = {}
                for h, b in zip(hist, le.tolist(), strict=True):
                    if b <= thr + 1e-12:
                        best[h] = max(best.get(h, b), b)
                want |= np.array([h in best and b == best[h] for h, b in zip(hist, le.tolist(), strict=True)], bool)
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
            self._add_planned(snap, plan)
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
        if p is not None and p.metrics is snap.metrics and p.labelsets is snap.labelsets and (
                p.metric_ids.shape == snap.metric_ids.shape and np.array_equal(p.metric_ids, snap.metric_ids)
                and np.array_equal(p.series_ids, snap.series_ids)):
            self._plans[key] = p  # most recent last
            return p
        if len(self._plans) >= 8:
            self._plans.pop(next(iter(self._plans)))
        m = mmap[snap.metric_ids]
        s = smap[snap.series_ids]
        is_c = self._keep_of_metric[m] > 0
        wanted = self._wanted(m, s)
        g_rows = np.flatnonzero(~is_c if wanted is None else ~is_c & wanted)
        c_rows = np.flatnonzero(is_c if wanted is None else is_c & wanted)
        g_slot, g_new = self._slots("gauge", m[g_rows], s[g_rows])
        c_slot, c_new = self._slots("counter", m[c_rows], s[c_rows])
        if g_new or c_new:
            # slots just made for this plan: the first add gives them their arrays (the plain path)
            self._unplanned_slots(g_new, c_new)
        go, co = np.argsort(g_slot, kind="stable"), np.argsort(c_slot, kind="stable")
        g_slot, c_slot = g_slot[go], c_slot[co]
        if (g_slot[1:] == g_slot[:-1]).any() or (c_slot[1:] == c_slot[:-1]).any():
            return None  # a pair twice in one snapshot: its order depends on the timestamps
        g_rows, c_rows = g_rows[go], c_rows[co]
        keeps = self._keep_of_metric[m[c_rows]]
        p = _Plan(snap.metrics, snap.labelsets, snap.metric_ids.copy(), snap.series_ids.copy(), g_rows, g_slot,
                  m[g_rows], s[g_rows], c_rows, c_slot, m[c_rows].astype(np.int32), s[c_rows].astype(np.int32),
                  c_slot.astype(np.int32), float(keeps.min()) if keeps.size else 0.0,
                  float(keeps.max()) if keeps.size else 0.0)
        self._plans[key] = p
        return p

    def _unplanned_slots(self, g_new: int, c_new: int) -> None:
        if g_new:
            self._g_m = np.concatenate((self._g_m, np.zeros(g_new, np.int32)))
            self._g_s = np.concatenate((self._g_s, np.zeros(g_new, np.int32)))
            self._g_v = np.concatenate((self._g_v, np.full(g_new, np.nan)))
            self._g_t = np.concatenate((self._g_t, np.full(g_new, -np.inf)))
            self._g_since = np.concatenate((self._g_since, np.full(g_new, -np.inf)))
        if c_new:
            self._c_last = np.concatenate((self._c_last, np.full(c_new, np.nan)))
            self._c_off = np.concatenate((self._c_off, np.zeros(c_new)))
            self._c_count = np.concatenate((self._c_count, np.zeros(c_new, np.int64)))

    def _add_planned(self, snap: Snapshot, p: _Plan) -> None:
        """``add`` for a known layout: the same arithmetic as the plain path, on precomputed rows."""
        v, t = snap.values, snap.ts
        if p.g_rows.size:
            gv, gt = v[p.g_rows], t[p.g_rows]
            self._store_gauges(p.g_slot, p.g_m, p.g_s, gv, gt)
        if p.c_rows.size:
            self._store_counters(snap.at, p.c_slot, p.c_m32, p.c_s32, p.c_slot32, v[p.c_rows], t[p.c_rows],
                                 p.c_kmin, p.c_kmax)

    def _slots(self, table: str, m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, int]:
        """Slot of each (metric, series) pair, creating slots for new pairs; vectorised with a sorted key
        index (a Python dictionary per pair costs seconds per cycle at 100k GPUs)."""
        idx = self._index.setdefault(table, [np.zeros(0, np.int64), np.zeros(0, np.int64)])
        keys_sorted, slots_sorted = idx
        keys = (m.astype(np.int64) << 32) | s.astype(np.int64)
        uniq, inv = np.unique(keys, return_inverse=True)
        n_have = keys_sorted.size
        pos = np.asarray(np.searchsorted(keys_sorted, uniq), np.int64)
        found = np.zeros(uniq.size, bool)
        if n_have:
            found = keys_sorted[np.minimum(pos, n_have - 1)] == uniq
        slots_u = np.empty(uniq.size, np.int64)
        slots_u[found] = slots_sorted[np.minimum(pos, max(n_have - 1, 0))[found]]
        new = ~found
        n_new = int(new.sum())
        base = self._n_slots.get(table, 0)
        slots_u[new] = np.arange(base, base + n_new)
        if n_new:
            idx[0] = np.insert(keys_sorted, pos[new], uniq[new])
            idx[1] = np.insert(slots_sorted, pos[new], slots_u[new])
            self._n_slots[table] = base + n_new
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
        self._store_gauges(slot[pick], m[pick], s[pick], v[pick], t[pick])

    def _store_gauges(self, sl: np.ndarray, m: np.ndarray, s: np.ndarray, v: np.ndarray, t: np.ndarray) -> None:
        """One sample per slot (distinct ``sl``): kept where not older than the slot's."""
        newer = t >= self._g_t[sl]
        if not newer.all():
            sl, m, s, v, t = sl[newer], m[newer], s[newer], v[newer], t[newer]
        if not np.isfinite(self._g_t[sl]).all():
            self._epoch += 1  # a slot born or revived: a new pair in the view
        changed = ~(self._g_v[sl] == v)  # NaN (new slot) counts as a change
        self._g_since[sl] = np.where(changed, t, self._g_since[sl])
        self._g_m[sl] = m
        self._g_s[sl] = s
        self._g_v[sl] = v
        self._g_t[sl] = t

    def _add_counters(self, at: float, m: np.ndarray, s: np.ndarray, v: np.ndarray, t: np.ndarray) -> None:
        slot, grown = self._slots("counter", m, s)
        self._unplanned_slots(0, grown)
        order = order_by_series_time(slot, t)
        m, s, v, t, slot = m[order], s[order], v[order], t[order], slot[order]
        keeps = self._keep_of_metric[m]
        self._store_counters(at, slot, m.astype(np.int32), s.astype(np.int32), slot.astype(np.int32), v, t,
                             float(keeps.min()), float(keeps.max()))

    def _store_counters(self, at: float, slot: np.ndarray, m32: np.ndarray, s32: np.ndarray, slot32: np.ndarray,
                        v: np.ndarray, t: np.ndarray, kmin: float, kmax: float) -> None:
        """Samples in (slot, time) order become one chunk of reset-corrected values; a drop that comes back
        to the count before it within GLITCH_S was an exporter glitch (fleethealth.signals.counter_glitch's
        rule), here sample by sample."""
        off = np.empty(slot.size)
        for i, s in enumerate(slot.tolist()):
            x, ti = float(v[i]), float(t[i])
            prev, o, cand = float(self._c_last[s]), float(self._c_off[s]), self._glitch.get(s)
            back = False
            if cand is not None:
                pre, base_off, t0 = cand
                if ti - t0 > GLITCH_S:
                    cand = None
                elif x >= pre:
                    o, cand, back = max(base_off, prev + o - x), None, True
                elif x > prev:
                    cand = None
            if not back and not math.isnan(prev) and x < prev:
                cand = cand or (prev, o, ti)
                o += prev
            if cand is None:
                self._glitch.pop(s, None)
            else:
                self._glitch[s] = cand
            self._c_last[s], self._c_off[s], off[i] = x, o, o
        corrected = v + off
        last_pos = np.ones(slot.size, bool)
        last_pos[:-1] = slot[1:] != slot[:-1]
        uslots = slot[last_pos]
        self._c_last[uslots] = v[last_pos]
        self._c_off[uslots] = off[last_pos]
        if (self._c_count[uslots] == 0).any():
            self._epoch += 1
        self._c_count[uslots] += 1
        self._chunks.append(_Chunk(at, m32, s32, corrected, t, slot32, uslots, kmin, kmax))
        self._chunks_version += 1

    # -- view ------------------------------------------------------------------------------------
    def _drop(self, ch: _Chunk) -> None:
        self._c_count[ch.uslots] -= 1
        if (self._c_count[ch.uslots] == 0).any():
            self._epoch += 1

    def _compact(self, now: float) -> None:
        kept: list[_Chunk] = []
        changed = False
        for ch in self._chunks:
            age = now - ch.at
            if ch.kmin >= age:
                kept.append(ch)
                continue
            changed = True
            if ch.kmax < age:
                self._drop(ch)
                continue
            keep = self._keep_of_metric[ch.m] >= age  # some metrics expire, others stay (kmin < age <= kmax)
            sl = ch.slot[keep]
            last = np.ones(sl.size, bool)
            last[:-1] = sl[1:] != sl[:-1]
            uslots = sl[last]
            self._c_count[uslots] += 1
            self._drop(ch)
            km = self._keep_of_metric[ch.m[keep]]
            kept.append(_Chunk(ch.at, ch.m[keep], ch.s[keep], ch.v[keep], ch.t[keep], sl, uslots,
                               float(km.min()), float(km.max())))
        # thinning: beyond dense_s only the first chunk of each coarse bucket survives
        # (by the ages as of the last multiple of thin_every_s)
        out: list[_Chunk] = []
        last_bucket = None
        thin_now = (now // self.thin_every_s) * self.thin_every_s
        for ch in kept:
            age = thin_now - ch.at
            if age > self.dense_s:
                b = int(ch.at // (self.sparse_coarse_s if age > self.sparse_s else self.coarse_s))
                b = b if age > self.sparse_s else -1 - b  # the tiers never share a bucket id
                if b == last_bucket:
                    self._drop(ch)
                    changed = True
                    continue
                last_bucket = b
            out.append(ch)
        self._chunks = out
        if changed:
            self._chunks_version += 1
        # forget gauges nobody has reported for memory_s
        if self._g_t.size:
            dead = (now - self._g_t > self.memory_s) & np.isfinite(self._g_t)
            if dead.any():
                self._g_t[dead] = -np.inf
                self._g_v[dead] = np.nan
                self._epoch += 1

    def view(self, now: float) -> Snapshot:
        self._compact(now)
        live = np.isfinite(self._g_t) & ~np.isnan(self._g_v)
        parts_m = [self._g_m[live]]
        parts_s = [self._g_s[live]]
        parts_v = [self._g_v[live]]
        parts_t = [self._g_t[live]]
        if self._track_start.any():
            ev = live & self._track_start[self._g_m] & (self._g_since < self._g_t) & np.isfinite(self._g_since)
            parts_m.append(self._g_m[ev])
            parts_s.append(self._g_s[ev])
            parts_v.append(self._g_v[ev])
            parts_t.append(self._g_since[ev])
        # The counters' part changes once per ingest or compaction, not per view (a cycle views twice).
        if self._counter_cat is None or self._counter_cat[0] != self._chunks_version:
            ch = self._chunks
            cat = (
                np.concatenate([c.m for c in ch]) if ch else np.zeros(0, np.int32),
                np.concatenate([c.s for c in ch]) if ch else np.zeros(0, np.int32),
                np.concatenate([c.v for c in ch]) if ch else np.zeros(0, np.float64),
                np.concatenate([c.t for c in ch]) if ch else np.zeros(0, np.float64),
            )
            self._counter_cat = (self._chunks_version, cat)
        cm, cs, cv, ct = self._counter_cat[1]
        parts_m.append(cm)
        parts_s.append(cs)
        parts_v.append(cv)
        parts_t.append(ct)
        snap = Snapshot(
            at=now,
            metrics=self.metrics,
            labelsets=self.labelsets,
            metric_ids=np.concatenate(parts_m).astype(np.int32, copy=False),
            series_ids=np.concatenate(parts_s).astype(np.int32, copy=False),
            values=np.concatenate(parts_v),
            ts=np.concatenate(parts_t),
            issues=self.issues[-1000:],
            source_errors=list(self.source_errors),
        )
        self.source_errors = []
        self._last_view, self._last_token = snap, (self._serial, self._epoch)
        return snap

    def extend(self, snaps: Iterable[Snapshot]) -> None:
        for s in snaps:
            self.add(s)

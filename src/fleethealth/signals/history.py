"""A rolling window of signals: what the engine needs to score "now" from a stream of snapshots.

Gauges need only their latest sample per series (older ones are staler), but the entity must stay
visible after its exporter dies, so the latest sample is remembered for ``memory_s`` and the engine sees
it as stale: unknown, never healthy. Counters need a window of samples to become rates, and SLO
counters need hours: counter samples are kept per metric for as long as the policy's longest window for
that metric, thinned to one sample per ``coarse_s`` once older than ``dense_s`` (a rate over hours
needs its end points, not every scrape). Counter resets are folded in on arrival (a reset-corrected
cumulative value), so thinning can never hide a reset.

Pure data structure: no clock, no I/O; ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from fleethealth.policy import Policy
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot, order_by_series_time


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


class SignalHistory:
    def __init__(
        self,
        policy: Policy,
        memory_s: float = 3600.0,
        dense_s: float = 900.0,
        coarse_s: float = 60.0,
    ) -> None:
        self.policy = policy
        self.memory_s = memory_s
        self.dense_s = dense_s
        self.coarse_s = coarse_s
        self.counter_keep = counter_metrics(policy)
        self.value_start = value_start_metrics(policy)
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
        # counters: chunks (at, m, s, corrected v, t); reset correction per (metric, series)
        self._chunks: list[tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._c_last = np.zeros(0, np.float64)
        self._c_off = np.zeros(0, np.float64)
        self._keep_of_metric = np.zeros(0, np.float64)
        self.issues: list[InputIssue] = []
        self.source_errors: list[InputIssue] = []
        self.last_at = -np.inf
        self._index: dict[str, list[np.ndarray]] = {}
        self._n_slots: dict[str, int] = {}

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

    # -- ingest ----------------------------------------------------------------------------------
    def add(self, snap: Snapshot) -> None:
        self.issues.extend(snap.issues)
        del self.issues[:-1000]  # keep the latest; the sources report them as they come
        self.source_errors.extend(snap.source_errors)
        self.last_at = max(self.last_at, snap.at)
        if len(snap) == 0:
            return
        mmap, smap = self._maps(snap)
        m = mmap[snap.metric_ids]
        s = smap[snap.series_ids]
        v = snap.values
        t = snap.ts
        ok = ~np.isnan(v)
        m, s, v, t = m[ok], s[ok], v[ok], t[ok]
        is_c = self._keep_of_metric[m] > 0
        self._add_gauges(m[~is_c], s[~is_c], v[~is_c], t[~is_c])
        if is_c.any():
            self._add_counters(snap.at, m[is_c], s[is_c], v[is_c], t[is_c])

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
        if grown:
            self._g_m = np.concatenate((self._g_m, np.zeros(grown, np.int32)))
            self._g_s = np.concatenate((self._g_s, np.zeros(grown, np.int32)))
            self._g_v = np.concatenate((self._g_v, np.full(grown, np.nan)))
            self._g_t = np.concatenate((self._g_t, np.full(grown, -np.inf)))
            self._g_since = np.concatenate((self._g_since, np.full(grown, -np.inf)))
        # keep the latest sample per slot (ties: the later one in the batch)
        order = order_by_series_time(slot, t)
        so = slot[order]
        last = np.ones(so.size, bool)
        last[:-1] = so[1:] != so[:-1]
        pick = order[last]
        sl = slot[pick]
        newer = t[pick] >= self._g_t[sl]
        sl, pick = sl[newer], pick[newer]
        changed = ~(self._g_v[sl] == v[pick])  # NaN (new slot) counts as a change
        self._g_since[sl] = np.where(changed, t[pick], self._g_since[sl])
        self._g_m[sl] = m[pick]
        self._g_s[sl] = s[pick]
        self._g_v[sl] = v[pick]
        self._g_t[sl] = t[pick]

    def _add_counters(self, at: float, m: np.ndarray, s: np.ndarray, v: np.ndarray, t: np.ndarray) -> None:
        slot, grown = self._slots("counter", m, s)
        if grown:
            self._c_last = np.concatenate((self._c_last, np.full(grown, np.nan)))
            self._c_off = np.concatenate((self._c_off, np.zeros(grown)))
        order = order_by_series_time(slot, t)
        m, s, v, t, slot = m[order], s[order], v[order], t[order], slot[order]
        corrected = np.empty_like(v)
        # resets within and across batches: sequential per slot, vectorised across slots
        prev = self._c_last[slot]
        same = np.zeros(slot.size, bool)
        same[1:] = slot[1:] == slot[:-1]
        prev = np.where(same, np.concatenate(([np.nan], v[:-1])), prev)
        reset = (~np.isnan(prev)) & (v < prev)
        add = np.where(reset, prev, 0.0)
        # cumulative offset within each slot run
        run_start = ~same
        cum = np.cumsum(add)
        base = np.maximum.accumulate(np.where(run_start, np.arange(slot.size), 0))
        cum_before_run = np.where(base > 0, cum[base - 1], 0.0)
        off = self._c_off[slot] + (cum - cum_before_run)
        corrected = v + off
        last_pos = np.ones(slot.size, bool)
        last_pos[:-1] = slot[1:] != slot[:-1]
        self._c_last[slot[last_pos]] = v[last_pos]
        self._c_off[slot[last_pos]] = off[last_pos]
        self._chunks.append((at, m.astype(np.int32), s.astype(np.int32), corrected, t))

    # -- view ------------------------------------------------------------------------------------
    def _compact(self, now: float) -> None:
        kept = []
        for at, m, s, v, t in self._chunks:
            keep = self._keep_of_metric[m] >= now - at
            if keep.all():
                kept.append((at, m, s, v, t))
            elif keep.any():
                kept.append((at, m[keep], s[keep], v[keep], t[keep]))
        # thinning: beyond dense_s only the first chunk of each coarse bucket survives
        out = []
        last_bucket = None
        for at, m, s, v, t in kept:
            if now - at > self.dense_s:
                b = int(at // self.coarse_s)
                if b == last_bucket:
                    continue
                last_bucket = b
            out.append((at, m, s, v, t))
        self._chunks = out
        # forget gauges nobody has reported for memory_s
        if self._g_t.size and (now - self._g_t > self.memory_s).any():
            dead = now - self._g_t > self.memory_s
            self._g_t[dead] = -np.inf
            self._g_v[dead] = np.nan

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
        for _at, m, s, v, t in self._chunks:
            parts_m.append(m)
            parts_s.append(s)
            parts_v.append(v)
            parts_t.append(t)
        snap = Snapshot(
            at=now,
            metrics=self.metrics,
            labelsets=self.labelsets,
            metric_ids=np.concatenate(parts_m).astype(np.int32),
            series_ids=np.concatenate(parts_s).astype(np.int32),
            values=np.concatenate(parts_v),
            ts=np.concatenate(parts_t),
            issues=self.issues[-1000:],
            source_errors=list(self.source_errors),
        )
        self.source_errors = []
        return snap

    def extend(self, snaps: Iterable[Snapshot]) -> None:
        for s in snaps:
            self.add(s)

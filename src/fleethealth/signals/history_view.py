"""The view side of the signal history (``signals.history``): expiry and thinning as of ``now``, and the
views the engine scores.

Theory of operation
-------------------
``SignalHistory`` keeps its state in arrays (module ``signals.history``); this mixin reads them. A view as
of ``now`` first compacts: counter chunks past their retention expire and old ones are thinned (vectorised
over the chunk list, ``history_counters._thinned``), and gauges nobody has reported for ``memory_s`` are
forgotten. Then it lays out its rows: the live gauge slots in (metric, series) order (the gauge rows are
the slots themselves when every slot is live and in order: no sort or gather; an event-like gauge's
value-start row just before its latest), a layout kept while the set of live slots (``_epoch``) and of
value-start rows are unchanged (``history_pairs._live_gauges`` and ``_gauge_rows``), then each counter
metric's block, written only when asked for (``HistoryView``'s ``fill``); each counter metric's samples
also go to the engine as a ``CounterMatrix`` on the view's ``ViewIndex``. A view at the same ``now`` as
the last one, after only new samples of gauge series it holds (a cycle's derived signals), is the last
view's rows with those samples written over (``_patched_view``).

When the gauge rows are every slot in order (a cold start's first views: no value-start row yet), the
view holds the history's own value and time arrays, read-only, instead of copies: the history then
never writes those slots in place (``_g_lent``), but copies its arrays first (``_writable_gauges``: the
next scrape; a cold cycle's derived signals land in new slots past the lent ones and copy nothing).
Forgetting compares the times with the exact float bound of ``now - memory_s`` (``_last_stale``), and
the all-live check and each metric's block come from reductions and binary searches: no pass that makes
an array of every slot's.

Pure data structure: no clock, no I/O; ``now`` is an argument.
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable
from typing import Any

import numpy as np

from fleethealth.signals.history_counters import _Chunk, _Group, _thinned
from fleethealth.signals.history_pairs import _gauge_rows, _live_gauges, _Room
from fleethealth.signals.snapshot import CounterMatrix, HistoryView, InputIssue, LabelSet, Snapshot, ViewIndex


def _last_stale(now: float, memory_s: float) -> float | None:
    """The largest float ``x`` with ``now - x > memory_s`` (in float arithmetic), None where there is none
    to find in a few steps (``now`` or ``memory_s`` not finite). ``now - x`` rounded is non-increasing in
    ``x``, so exactly the times ``<= x`` are older than ``memory_s``: one comparison per slot instead of
    a subtraction (a new float array) and a comparison."""
    x = now - memory_s
    if not (np.isfinite(now) and np.isfinite(memory_s) and np.isfinite(x)):
        return None
    for _ in range(64):  # (a step or two: the rounding of now - x is within an ulp or so)
        if now - x > memory_s:
            up = float(np.nextafter(x, np.inf))
            if not now - up > memory_s:
                return x
            x = up
        else:
            x = float(np.nextafter(x, -np.inf))
    return None


def _forgotten(g_t: np.ndarray, now: float, memory_s: float) -> np.ndarray | None:
    """``(now - g_t > memory_s) & np.isfinite(g_t)`` (the gauge slots to forget), None where no slot is.
    Usually none: the smallest time, one pass with no new array, says so (``-inf``: a slot forgotten
    before, which then takes the comparison)."""
    x = _last_stale(now, memory_s)
    if x is None:
        dead = (now - g_t > memory_s) & np.isfinite(g_t)
    else:
        if g_t.min() > x:  # (NaN: not greater, so the comparison decides)
            return None
        dead = g_t <= x
        dead &= np.isfinite(g_t)
    return dead if dead.any() else None


class _HistoryViews:
    """``SignalHistory``'s views (a mixin: the state is the history's, set in its ``__init__``)."""

    # the history's state this side reads and writes (``SignalHistory.__init__`` says what each is)
    metrics: list[str]
    labelsets: list[LabelSet]
    memory_s: float
    dense_s: float
    coarse_s: float
    sparse_s: float
    sparse_coarse_s: float
    thin_every_s: float
    issues: list[InputIssue]
    source_errors: list[InputIssue]
    _track_start: np.ndarray
    _g_m: np.ndarray
    _g_s: np.ndarray
    _g_v: np.ndarray
    _g_t: np.ndarray
    _g_since: np.ndarray
    _g_lent: int
    _room: _Room
    _chunks: list[_Chunk]
    _chunk_arr: np.ndarray
    _chunk_new: list[tuple[float, float, float, float]]
    _groups: list[_Group]
    _cid: int
    _max_t: float
    _slot_ms: dict[str, list[np.ndarray]]
    _index: dict[str, tuple[np.ndarray, np.ndarray | None]]
    _serial: int
    _epoch: int
    _g_order: tuple[int, np.ndarray | None, np.ndarray] | None
    _last_view: Snapshot | None
    _last_token: Hashable | None
    _view_layout: tuple[float, int, int, np.ndarray | None, int] | None
    _g_base: tuple[int, int, np.ndarray | None, np.ndarray, Any] | None
    _dirty: list[np.ndarray | slice]

    def _compact(self, now: float) -> None:
        """Expire and thin the chunks as of ``now`` (vectorised over the chunks: a view's main cost
        once its rows are lazy)."""
        chunks = self._chunks
        n = len(chunks)
        if self._chunk_new:
            self._chunk_arr = np.concatenate((self._chunk_arr, np.array(self._chunk_new, np.float64)))
            self._chunk_new = []
        if n:
            arr = self._chunk_arr
            at, kmin, kmax = arr[:, 0], arr[:, 1].copy(), arr[:, 2]
            age = now - at
            whole = kmin >= age
            expired = not bool(whole.all())
            gone = kmax < age
            if expired:
                for i in np.flatnonzero(~whole & ~gone).tolist():  # some metrics expire, others stay
                    ch = chunks[i]
                    ch.keeps = [k for k in ch.keeps if k >= age[i]]
                    arr[i, 1] = ch.keeps[0]
            drop = _thinned(at, gone, now, self.thin_every_s, self.dense_s, self.coarse_s, self.sparse_s,
                            self.sparse_coarse_s)
            if drop.any():
                keep_ix = np.flatnonzero(~drop)
                self._chunks = [chunks[i] for i in keep_ix.tolist()]
                self._chunk_arr = arr[keep_ix]
                dropped = arr[drop, 3].astype(np.int64).tolist()
            else:
                dropped = []
            if expired or dropped:
                gone_ids = np.sort(np.asarray(dropped, np.int64)) if dropped else None
                for g in self._groups:
                    if g.expire(now, gone_ids):
                        self._epoch += 1
        # forget gauges nobody has reported for memory_s
        if self._g_t.size:
            dead = _forgotten(self._g_t, now, self.memory_s)
            if dead is not None:
                self._writable_gauges(0)
                self._g_t[dead] = -np.inf
                self._g_v[dead] = np.nan
                self._epoch += 1

    def _writable_gauges(self, lo: int, hi: int = -1) -> None:
        """Before gauge values or times of slots ``lo`` on are written in place: where a view holds the
        history's own arrays (lent by a view whose rows are every slot in order: no copy of 2.4M values
        and times per view on a cold start) over slots from ``lo`` on, the history writes copies (made with
        room, ``history_pairs._Room``) and the views keep what they were made with. ``lo:hi``: slots
        the caller writes in full right after (not copied: a scrape's write covers most slots)."""
        if lo < self._g_lent:
            n, room = self._g_v.size, self._room
            hi = max(hi, lo)
            v, t = room.made("v", n, np.float64), room.made("t", n, np.float64)
            v[:lo], t[:lo] = self._g_v[:lo], self._g_t[:lo]
            v[hi:], t[hi:] = self._g_v[hi:], self._g_t[hi:]
            self._g_v, self._g_t, self._g_lent = v, t, 0

    def _gauge_keys(self) -> np.ndarray:
        """(metric << 32 | series) per gauge slot."""
        self._gauge_order()
        assert self._g_order is not None
        return self._g_order[2]

    def _gauge_order(self) -> np.ndarray | None:
        """The gauge slots in key order; None when they are in it (slots made in key order: a cold start's)."""
        n = self._g_t.size
        if self._g_order is None or self._g_order[0] != n:
            parts = self._slot_ms["gauge"]
            index = self._index.get("gauge")
            if index is not None and index[1] is None and index[0].size == n:
                # each slot its key's position in the index: the keys in slot order are the index's keys
                # (no join of the parts, a new array, nor a pass to find them in order)
                keys, order = index[0], None
                parts[:] = [keys]
            else:
                if len(parts) > 1:
                    parts[:] = [np.concatenate(parts)]  # joined once per growth, not once per view
                keys = parts[0][:n] if parts else np.zeros(0, np.int64)
                order = None if bool((keys[1:] > keys[:-1]).all()) else np.argsort(keys, kind="stable")
            self._g_order = (n, order, keys)
        return self._g_order[1]

    def view(self, now: float) -> Snapshot:
        """The window as of ``now``: every live gauge's latest sample (and, for event-like gauges, the
        time its value started) and the retained counter samples. Each metric's rows are one block,
        counters' in (series, time) order; ``Snapshot.index`` says so, with each counter metric's samples
        as a matrix (``CounterMatrix``)."""
        patched = self._patched_view(now)
        if patched is not None:
            return patched
        self._compact(now)
        src, since, pos, gauge_bounds, gm, gs = self._gauge_layout()
        bounds = dict(gauge_bounds)
        gv, gt = self._g_v[src], self._g_t[src]
        if not isinstance(src, np.ndarray):
            # every slot a row, in order: views of the history's own arrays, lent read-only (``_writable_gauges``)
            gv.flags.writeable = gt.flags.writeable = False
            self._g_lent = max(self._g_lent, src.stop)
        if isinstance(src, np.ndarray) and since.size:  # (value-start rows: never the slice of all)
            gt[since] = self._g_since[src[since]]
        n_rows = int(gm.size)
        matrices: dict[int, CounterMatrix] = {}
        groups: list[CounterMatrix] = []
        # counters: each metric one block of rows, in time order (as the ingests came), series ascending
        # within; written straight into the view's arrays (sizes first)
        blocks: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, int, int]] = []
        for g in self._groups:
            k = g.r1 - g.r0
            if k == 0 or g.cm.size == 0:
                continue
            T, V = g.T[g.r0:g.r1], g.V[g.r0:g.r1]
            have = None
            last = np.full(g.cm.size, k - 1, np.int64)
            if g.holes:
                have = ~np.isnan(T)
                last = np.where(have.any(axis=0), k - 1 - np.argmax(have[::-1], axis=0), -1)
                sizes = np.cumsum(have.sum(axis=0))
            gi = len(groups)
            groups.append(CounterMatrix(g.cs, T, V, last, gi, 0, g.cm.size, have is None, g.row_times()))
            for m, c0, c1 in g.ranges():
                size = k * (c1 - c0) if have is None else int(sizes[c1 - 1]) - (int(sizes[c0 - 1]) if c0 else 0)
                if size:
                    bounds[m] = (n_rows, n_rows + size)
                    blocks.append((m, T[:, c0:c1], V[:, c0:c1], g.cs[c0:c1],
                                   None if have is None else have[:, c0:c1], n_rows, n_rows + size))
                    n_rows += size
                if g.monotone:
                    matrices[m] = CounterMatrix(g.cs[c0:c1], T[:, c0:c1], V[:, c0:c1], last[c0:c1], gi, c0, c1,
                                                have is None)
        head = (gm, gs, gv, gt)

        def fill() -> tuple[np.ndarray, ...]:
            ng = head[0].size
            out_m, out_s = np.empty(n_rows, np.int32), np.empty(n_rows, np.int32)
            out_v, out_t = np.empty(n_rows), np.empty(n_rows)
            out_m[:ng], out_s[:ng], out_v[:ng], out_t[:ng] = head
            for m, Tm, Vm, cs, hm, a, b in blocks:
                out_m[a:b] = m
                if hm is None:
                    shape = Tm.shape
                    out_t[a:b].reshape(shape)[...] = Tm
                    out_v[a:b].reshape(shape)[...] = Vm
                    out_s[a:b].reshape(shape)[...] = cs
                else:
                    out_t[a:b], out_v[a:b] = Tm[hm], Vm[hm]
                    out_s[a:b] = np.broadcast_to(cs, hm.shape)[hm]
            return out_m, out_s, out_v, out_t

        self._view_layout = (now, self._epoch, self._cid, pos, self._g_t.size)
        return self._publish(now, head, n_rows, fill, bounds, matrices, groups)

    def _gauge_layout(self) -> tuple[np.ndarray | slice, np.ndarray, np.ndarray | None, dict[int, tuple[int, int]],
                                     np.ndarray, np.ndarray]:
        """Where a view's gauge rows come from: the slot of each row (live slots in (metric, series)
        order, an event-like gauge's value-start row just before its latest), the rows that carry a
        value-start time, each slot's row (-1: none; None: the slot itself), each gauge metric's block, and the rows' metric
        and series ids (shared by the views made with this layout: read-only). Kept while the
        set of live slots (``_epoch``) and of value-start rows are unchanged: a view then only gathers
        (``history_pairs._live_gauges`` and ``_gauge_rows``)."""
        n = self._g_t.size
        base = self._g_base
        if base is None or base[0] != self._epoch or base[1] != n:
            rows, track = _live_gauges(self._gauge_order(), self._g_t, self._g_v, self._g_m, self._track_start)
            base = self._g_base = (self._epoch, n, rows, track, None)
        _, _, rows, track, hit = base
        since = self._g_since[track]
        er = track[(since < self._g_t[track]) & np.isfinite(since)]
        if hit is not None and np.array_equal(hit[0], er):
            return hit[1:]  # type: ignore[no-any-return]
        got = _gauge_rows(rows, er, self._gauge_keys(), self._g_m, self._g_s)
        self._g_base = (base[0], n, rows, track, (er, *got))
        return got

    def _publish(self, now: float, head: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], n_rows: int,
                 fill: Any, bounds: dict[int, tuple[int, int]], counters: dict[int, CounterMatrix],
                 groups: list[CounterMatrix]) -> Snapshot:
        """A view of ``head`` then the rows ``fill`` writes (only when asked for: ``HistoryView``)."""
        empty = n_rows == head[0].size  # nothing to write later: the head is every row
        snap = HistoryView(
            now, self.metrics, self.labelsets, *(head if empty else (np.zeros(0, np.int32),) * 2 + (np.zeros(0),) * 2),
            issues=self.issues[-1000:], source_errors=list(self.source_errors), fill=None if empty else fill,
            n_rows=n_rows,
        )
        snap.index = ViewIndex(bounds, counters, groups, self._max_t, head, weakref.ref(snap))
        self.source_errors = []
        self._last_view, self._last_token = snap, (self._serial, self._epoch)
        self._dirty = []
        return snap

    def _patched_view(self, now: float) -> Snapshot | None:
        """The view as of the same ``now`` as the last one when all that came in since are new samples
        of gauge series it already holds (no counter, no new or revived series, no event-like gauge):
        the last view's rows with those values and times written over, its counter matrices shared.
        The same rows as a full view: compaction at an unchanged ``now`` changes nothing."""
        lay, last = self._view_layout, self._last_view
        if lay is None or last is None or last.index is None:
            return None
        at, epoch, cid, pos, n = lay
        if at != now or epoch != self._epoch or cid != self._cid or n != self._g_t.size:
            return None
        slots = np.concatenate([np.arange(d.start, d.stop) if isinstance(d, slice) else d for d in self._dirty]) \
            if self._dirty else np.zeros(0, np.int64)
        rows = slots if pos is None else pos[slots]  # (None: each slot its own row)
        if (rows < 0).any() or self._track_start[self._g_m[slots]].any():
            return None
        ix = last.index
        hm, hs, hv, ht = ix.head
        hv, ht = hv.copy(), ht.copy()
        hv[rows] = self._g_v[slots]
        ht[rows] = self._g_t[slots]
        head = (hm, hs, hv, ht)

        def fill() -> tuple[np.ndarray, ...]:
            v, t = last.values.copy(), last.ts.copy()
            v[:hv.size], t[:ht.size] = hv, ht
            return last.metric_ids, last.series_ids, v, t

        return self._publish(now, head, len(last), fill, ix.bounds, ix.counters, ix.groups)

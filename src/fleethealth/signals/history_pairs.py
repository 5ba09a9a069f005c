"""Slot bookkeeping of the signal history (signals/history.py): its ingest plans and pure numpy functions.

Theory of operation
-------------------
The history gives each (metric, series) pair a slot, and remembers how a snapshot layout lands in the
slots (``_Plan``), so that the next snapshot of that layout is ingested by gathers alone. ``_unique_pairs`` finds a batch's distinct pairs
and each row's rank among them (what ``np.unique`` of the packed pairs answers) with a presence table
over metric x series, ids being small and dense; ``_stable_order`` is a stable argsort of slots that
places distinct slots forming one run (a cold start's) at their offsets instead of sorting. Both make
their temporaries in place where they can: on a cold start at 100k GPUs every new MB is page faults.
A history's first write (every pair new, no slot yet) needs neither: ``_first_layout`` puts the rows in
(metric, series) order by scattering their numbers into a metric x series table (int32, a chunk of rows
at a time, so no array the size of the rows is made for it) and reading it back a metric at a time, and
the new slots are then simply 0, 1, ... in that order (what the general path's unique-and-rank followed
by a stable sort of the slots arrives at), the gauges' metrics first and the counters' after; ids too
sparse for a table take a stable sort instead (``_first_rows``). Its slot index then needs no slot array
(each key's slot is its position), and value starts are written for event-like gauges only.
No I/O, no state (a ``_Plan`` is state the history holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleethealth.signals.snapshot import LabelSet

# rows per chunk of a first write's table scatter (``_first_layout``): its temporaries stay in cache
_CHUNK = 1 << 16


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
    g_slot: np.ndarray | slice  # a slice when the slots are a run (as made for this layout)
    g_track: np.ndarray  # positions (in g_rows) of event-like gauges
    c_rows: np.ndarray  # snapshot rows of counters, in slot order
    c_slot: np.ndarray
    c_run: slice | None  # c_slot as a slice when it is a run of slots
    c_parts: list[tuple[int, np.ndarray]]  # (group, positions in c_rows) per group the rows land in
    c_cols: dict[int, tuple[int, np.ndarray | None]]  # group -> (its version, the parts' columns; None: all)
    # the id arrays last found equal to the layout, when nothing can write to them (see ``_frozen``)
    seen_ids: tuple[np.ndarray, np.ndarray] | None = None
    gauges_stored: bool = False  # the first add's gauges are in (``SignalHistory._first_plan``)


def _frozen(a: np.ndarray) -> bool:
    """Whether ``a``'s contents can no longer change: read-only and owning its memory (a read-only
    view of a writable array could change under it)."""
    return not a.flags.writeable and a.base is None


def _grown(a: np.ndarray, more: np.ndarray) -> np.ndarray:
    """``a`` with ``more`` appended (of a's dtype); ``more`` itself when ``a`` is empty (a cold start's
    first slots: no copy, whose memory would be new pages)."""
    return more.astype(a.dtype, copy=False) if a.size == 0 else np.concatenate((a, more))


def _slice_or_none(a: np.ndarray | slice) -> slice | None:
    return a if isinstance(a, slice) else None


def _is_identity(idmap: np.ndarray, ids: np.ndarray) -> bool:
    """Whether ``idmap[ids]`` is ``ids`` as int32 (a map 0, 1, ... of ids the history numbers alike)."""
    return ids.dtype == np.int32 and bool((idmap == np.arange(idmap.size)).all())


def _unique_pairs(m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique((m << 32) | s, return_inverse=True)``. Ids are small and dense (a few dozen metrics,
    series numbered from 0), so a presence table over metric x series replaces the sort: at 100k GPUs
    (2.9M pairs on a cold start) a sort costs ~0.5 s, the table a tenth of that. Temporaries are made in
    place where they can be: on a cold start each new MB is page faults (~0.25 ms per MB)."""
    if m.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    n_s = int(s.max()) + 1
    cells = (int(m.max()) + 1) * n_s
    if int(m.min()) < 0 or int(s.min()) < 0 or cells > 4 * m.size + 4096:
        uniq, inv = np.unique((m.astype(np.int64) << 32) | s.astype(np.int64), return_inverse=True)
        return uniq, inv.reshape(-1)
    flat = m.astype(np.int64)
    flat *= n_s
    flat += s
    present = np.zeros(cells, bool)
    present[flat] = True
    cell = np.flatnonzero(present)
    rank = np.cumsum(present, dtype=np.int64)
    rank -= 1
    inv = rank[flat]
    del rank, flat
    hi, lo = np.divmod(cell, n_s)
    hi <<= 32
    hi |= lo
    return hi, inv


def _stable_order(slot: np.ndarray) -> np.ndarray:
    """``np.argsort(slot, kind="stable")``; for distinct slots forming one run (a plan made on a cold
    start: every slot new) by placing each at its offset instead of sorting."""
    if slot.size > 1:
        lo = int(slot.min())
        if int(slot.max()) - lo + 1 == slot.size:
            at = slot - lo
            seen = np.zeros(slot.size, bool)
            seen[at] = True
            if bool(seen.all()):  # each offset taken once: distinct, so the order is the sort
                order = np.empty(slot.size, np.int64)
                order[at] = np.arange(slot.size)
                return order
    return np.argsort(slot, kind="stable")


def _first_rows(m: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows in (metric, series) order and their keys ``(m << 32) | s``, ascending: ``o =
    np.argsort(keys, kind="stable")`` and ``keys[o]``; None when a pair occurs twice. For a first write
    whose ids are too sparse (or negative) for ``_first_layout``'s metric x series table."""
    if m.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    key = (m.astype(np.int64) << 32) | s.astype(np.int64)
    o = np.argsort(key, kind="stable")
    key = key[o]
    return None if bool((key[1:] == key[:-1]).any()) else (o, key)


def _first_layout(m: np.ndarray, s: np.ndarray, is_c: np.ndarray, track: np.ndarray, kept: np.ndarray | None,
                  room: _Room | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """A first write's slots, split into gauges and counters (``is_c``: per metric id): the gauges' rows
    in (metric, series) order, their keys, metric ids (int32) and the positions of event-like ones
    (``track``: per metric id), then the counters' rows and keys; None when a pair occurs twice.
    ``kept``: the snapshot rows that ``m`` and ``s`` are of (None: all). As ``_first_rows``, with the
    gauge metrics before the counters' (each part still in metric id order), so that both parts come out
    as slices: no pass to split them. With ``room``, the gauges' keys and metric ids are made in its
    buffers "gauge keys" (the slot index grows into it) and "m" (``_Room.first_gauges``).

    Each row's number goes into a metric x series table (int32, in chunks of rows: no array of every
    row's cell or number, whose 20 MB each would be new pages on a cold start, and the chunk's scatter
    stays in cache); then each metric's row of the table, in that order, gives its series in order:
    its rows, keys and metric ids are written in place, a block at a time."""
    n = m.size
    n_s = int(s.max()) + 1 if n else 0
    n_m = int(m.max()) + 1 if n else 0
    if n == 0 or int(m.min()) < 0 or int(s.min()) < 0 or n_m * n_s > 4 * n + 4096:
        return _split_layout(m, s, is_c, track, kept)
    at: np.ndarray = np.full(n_m * n_s, -1, np.int32 if n < 2**31 else np.int64)
    for i in range(0, n, _CHUNK):
        j = min(i + _CHUNK, n)
        cell = m[i:j].astype(np.int64)
        cell *= n_s
        cell += s[i:j]
        at[cell] = np.arange(i, j, dtype=at.dtype)
    taken = at >= 0
    count = np.count_nonzero(taken.reshape(n_m, n_s), axis=1)  # rows per metric
    if int(count.sum()) != n:
        return None  # a pair twice: one of its rows was written over
    order = np.argsort(is_c[:n_m], kind="stable").tolist()  # gauges, then counters
    n_gm = n_m - int(np.count_nonzero(is_c[:n_m]))
    n_g = int(count[order[:n_gm]].sum())
    rows = np.empty(n, np.int64)
    g_key = room.made("gauge keys", n_g, np.int64) if room is not None else np.empty(n_g, np.int64)
    g_m = room.made("m", n_g, np.int32) if room is not None else np.empty(n_g, np.int32)
    c_key = np.empty(n - n_g, np.int64)
    tracked: list[np.ndarray] = []
    a = 0
    for metric in order:
        k = int(count[metric])
        if k == 0:
            continue
        series = np.flatnonzero(taken[metric * n_s:(metric + 1) * n_s])
        rows[a:a + k] = at[metric * n_s:(metric + 1) * n_s][series]
        if a < n_g:
            np.add(series, metric << 32, out=g_key[a:a + k])
            g_m[a:a + k] = metric
            if track[metric]:
                tracked.append(np.arange(a, a + k))
        else:
            np.add(series, metric << 32, out=c_key[a - n_g:a - n_g + k])
        a += k
    if kept is not None:
        rows = kept[rows]
    g_track = np.concatenate(tracked) if tracked else np.zeros(0, np.int64)
    return rows[:n_g], g_key, g_m, g_track, rows[n_g:], c_key


def _split_layout(m: np.ndarray, s: np.ndarray, is_c: np.ndarray, track: np.ndarray, kept: np.ndarray | None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``_first_layout`` for ids too sparse for a table: ``_first_rows``, then split by metric kind."""
    first = _first_rows(m, s)
    if first is None:
        return None
    rows, key = first
    if kept is not None:
        rows = kept[rows]
    count = np.bincount(m, minlength=1) if m.size else np.zeros(1, np.int64)
    ids = np.arange(count.size)
    c_metric = is_c[ids]
    g_count = np.where(c_metric, 0, count)
    c_pos = np.repeat(c_metric, count)
    g_m = np.repeat(ids.astype(np.int32), g_count)
    g_track = np.flatnonzero(np.repeat(track[ids], g_count))
    return rows[~c_pos], key[~c_pos], g_m, g_track, rows[c_pos], key[c_pos]


class _Room:
    """Per-slot arrays that grow at their end (new slots) into room left after them: a history's first
    write makes its gauge arrays and slot index (2.4M slots at 100k GPUs; the index grows at its end when
    the new keys sort after all known ones) with a quarter more room (``made``; the room
    is never written, so it costs no page), and the slots the next writes add (a cycle's structural
    signals) go into it (``grown``) instead of a copy of every array. An array is grown in place only
    while it is the start of its buffer (anything else, e.g. a deep copy's, is copied into a new one);
    the arrays handed out before stay as they were (the room lies beyond them). State the history holds."""

    __slots__ = ("bufs",)

    def __init__(self) -> None:
        self.bufs: dict[str, np.ndarray] = {}

    def made(self, name: str, n: int, dtype: type | np.dtype) -> np.ndarray:
        """An uninitialised array of ``n`` items with room after it."""
        buf = self.bufs[name] = np.empty(n + n // 4 + 1024, dtype)
        return buf[:n]

    def first_gauges(self, v: np.ndarray, t: np.ndarray, rows: np.ndarray, g_m: np.ndarray, g_key: np.ndarray,
                     track: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A first write's gauge arrays, made with room: per slot its metric, series (``g_key``'s low
        half), value and time (samples ``rows`` of ``v`` and ``t``) and value start (its time for the
        event-like slots ``track``; left unwritten for the others, whose value start nothing reads: a
        cold start's 2.4M slots are a few percent event-like, and untouched memory costs no page)."""
        n = rows.size
        if g_m.base is self.bufs.get("m") and g_m.base is not None:  # (made there: ``_first_layout``)
            m = g_m
        else:
            m = self.made("m", n, np.int32)
            m[:] = g_m
        s = self.made("s", n, np.int32)
        np.copyto(s, g_key, casting="unsafe")  # (an int64 -> int32 cast keeps the low half)
        gv, gt = self.made("v", n, np.float64), self.made("t", n, np.float64)
        np.take(v, rows, out=gv, mode="clip")  # (rows in range: "clip" writes to ``out`` unbuffered)
        np.take(t, rows, out=gt, mode="clip")
        since = self.made("since", n, np.float64)
        since[track] = gt[track]
        return m, s, gv, gt, since

    def arange(self, name: str, n: int) -> np.ndarray:
        """``np.arange(n)`` with room after it."""
        out = self.made(name, n, np.int64)
        np.copyto(out, np.arange(n))
        return out

    def grown(self, name: str, a: np.ndarray, more: np.ndarray) -> np.ndarray:
        """``a`` with ``more`` appended (as ``a``'s dtype); ``more`` itself when ``a`` is empty."""
        n, k = a.size, more.size
        if n == 0:
            return more.astype(a.dtype, copy=False)
        buf = self.bufs.get(name)
        if buf is None or a.base is not buf or a.ctypes.data != buf.ctypes.data or buf.size < n + k:
            buf = self.made(name, n + k, a.dtype).base
            assert buf is not None
            buf[:n] = a
        buf[n:n + k] = more
        return buf[:n + k]


def _tail(parts: list[np.ndarray], k: int) -> np.ndarray:
    """The last ``k`` items of the concatenation of ``parts`` (joining only the parts that hold them)."""
    total, i = 0, len(parts)
    while total < k:
        i -= 1
        total += parts[i].size
    last = parts[i:]
    return (last[0] if len(last) == 1 else np.concatenate(last))[total - k:]


def _live_gauges(order: np.ndarray | None, g_t: np.ndarray, g_v: np.ndarray, g_m: np.ndarray,
                 track_start: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """The live gauge slots in key order (``order``: the slots in key order, None when they are in it)
    - None when that is every slot in order (a cold start's) - and the live event-like ones."""
    if order is None and _all_live(g_t, g_v):
        return None, _metric_rows(g_m, track_start)
    live = np.isfinite(g_t) & ~np.isnan(g_v)
    if order is None:
        if bool(live.all()):
            return None, np.flatnonzero(track_start[g_m])
        rows = np.flatnonzero(live)
    else:
        rows = order[live[order]]
    return rows, rows[track_start[g_m[rows]]]


def _all_live(g_t: np.ndarray, g_v: np.ndarray) -> bool:
    """``(np.isfinite(g_t) & ~np.isnan(g_v)).all()`` by three reductions that make no array (a minimum or
    maximum is NaN when any item is): a cold start's 2.4M slots are all live."""
    if g_t.size == 0:
        return True
    return bool(np.isfinite(g_t.min()) and np.isfinite(g_t.max()) and not np.isnan(g_v.min()))


def _metric_rows(g_m: np.ndarray, of_metric: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(of_metric[g_m])`` for ``g_m`` ascending (slots in key order: each metric a block),
    from the blocks' ends instead of a pass over every slot."""
    ids = np.flatnonzero(of_metric)
    if ids.size == 0 or g_m.size == 0:
        return np.zeros(0, np.int64)
    ids = ids.astype(g_m.dtype)  # (searching int64 in int32 would cast all of ``g_m``: a new array)
    lo, hi = np.searchsorted(g_m, ids, "left"), np.searchsorted(g_m, ids, "right")
    if ids.size == 1:
        return np.arange(lo[0], hi[0], dtype=np.int64)
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(lo.tolist(), hi.tolist(), strict=True)])


def _gauge_rows(rows: np.ndarray | None, er: np.ndarray, keys: np.ndarray, g_m: np.ndarray, g_s: np.ndarray
                ) -> tuple[np.ndarray | slice, np.ndarray, np.ndarray | None, dict[int, tuple[int, int]], np.ndarray,
                           np.ndarray]:
    """A view's gauge rows from the live slots in key order (``rows``, None: every slot, in order) and
    the event-like slots whose value started before their latest sample (``er``): the slot of each row
    (a value-start row just before its series' latest), the value-start rows, each slot's row (-1: none;
    None: the slot itself), each metric's block, and the rows' metric and series ids. With every slot a
    row, in order, the rows are the slice of all and the ids read-only views of ``g_m`` and ``g_s``
    (never written in place)."""
    n = g_m.size
    src: np.ndarray | slice
    pos: np.ndarray | None
    if er.size:
        # a value-start row goes just before its series' latest (each metric one block, its rows in
        # (series, time) order)
        at = np.searchsorted(keys if rows is None else keys[rows], keys[er])
        src = np.insert(np.arange(n) if rows is None else rows, at, er)
        since_rows = at + np.arange(er.size)  # (np.insert: each before index ``at``, in order)
        is_since = np.zeros(src.size, bool)
        is_since[since_rows] = True
        pos = np.full(n, -1, np.int64)
        latest = np.flatnonzero(~is_since)
        pos[src[latest]] = latest
        gm, gs = g_m[src], g_s[src]
    else:
        since_rows = np.zeros(0, np.int64)
        if rows is None:
            src, pos = slice(0, n), None  # (not an arange of 2.4M slots: new memory on a cold start)
            gm, gs = g_m[:n], g_s[:n]
            gm.flags.writeable = gs.flags.writeable = False
        else:
            src, pos = rows, np.full(n, -1, np.int64)
            pos[rows] = np.arange(rows.size)
            gm, gs = g_m[src], g_s[src]
    bounds = _blocks(gm)
    return src, since_rows, pos, bounds, gm, gs


def _blocks(gm: np.ndarray) -> dict[int, tuple[int, int]]:
    """Each id's (start, end) in ``gm``, ascending (a view's gauge rows are in key order: each metric one
    block): ``history_counters._id_runs`` by a binary search per id instead of a pass over the rows."""
    if gm.size == 0:
        return {}
    ids = np.arange(int(gm[-1]) + 1, dtype=gm.dtype)  # (of gm's type: else all of gm would be cast)
    lo, hi = np.searchsorted(gm, ids, "left").tolist(), np.searchsorted(gm, ids, "right").tolist()
    return {m: (a, b) for m, a, b in zip(ids.tolist(), lo, hi, strict=True) if b > a}

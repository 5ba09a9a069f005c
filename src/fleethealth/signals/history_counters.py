"""The rolling history's counter storage: what ``signals.history`` keeps of counter samples, and for how long.

Theory of operation
-------------------
A counter needs a window of samples to become a rate, and an SLO's counters need hours
(``counter_metrics``: per metric, the longest window the policy reads it over). Samples are stored
grouped by that retention and by their reader (``slo_counter_metrics``: an SLO reads several windows at
once over its whole group, a rate counter one window, so neither pays for the other's columns), each
group as matrices (``_Group``): a row per ingest, a column per (metric, series) slot, columns sorted by
(metric, series), NaN where a slot has no sample in a row. A metric's samples are a block of columns in
time order down each column, so a view hands them to the engine as they are (``CounterMatrix``) and a
window's increase is a difference of two entries.

Rows are appended and never written again. The history expires and thins them by ingest (``_Chunk``:
the ingest's time and the retentions of what it still holds; ``_thinned``: which ingests thinning drops): dropping the oldest rows moves the start
of the live rows; dropping any other (thinning: one row per minute past a quarter of an hour, one per
five minutes past an hour) or adding columns builds new arrays (``_Group._realloc``), so the slices a
view handed out stay valid after later ingests. A group thinned every ingest (an SLO's or a 6 h rate's:
a row crosses into the five-minute tier every minute) would allocate fresh matrices every ingest, and
fresh memory costs its page faults as much again as the copy; so the arrays it left two copies ago
are written again once nothing holds them any more (``_Group._arrays``: no view's slice refers to them).

Pure data structures: no clock, no I/O.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleethealth.policy import Policy


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


def value_start_metrics(policy: Policy) -> set[str]:
    """Gauges whose *change* is the event (DCGM's last-Xid value): the view also carries the time the
    current value started, so an old value is not mistaken for a new occurrence."""
    return {s.metric for s in policy.signals if s.shape == "xid" and s.kind == "gauge"}


def slo_counter_metrics(policy: Policy) -> set[str]:
    """The counters SLO signals read (their requests, and their errors or latency buckets)."""
    out: set[str] = set()
    for s in policy.signals:
        if s.shape == "slo":
            assert s.requests_metric is not None
            out |= {s.requests_metric, s.metric + "_bucket" if s.threshold_s is not None else s.metric}
    return out


@dataclass(slots=True)
class _Chunk:
    """One ingest's counter samples, stored as rows of the groups (``_Group``) tagged ``cid``; ``keeps``:
    the distinct retentions of the metrics it still holds, ascending (a chunk younger than the shortest
    is kept whole without a per-row test; older than the longest, it is gone)."""

    at: float
    cid: int
    keeps: list[float]


class _Group:
    """The counter samples of every metric kept equally long, as matrices: a row per ingest (more when an
    ingest brings several samples of one series), a column per (metric, series) slot, columns sorted by
    (metric, series); NaN where a slot has no sample in a row. A metric's samples are a block of columns,
    in time order down each column (``monotone``, checked on arrival), so the engine reads window
    aggregates off the columns without sorting.

    Rows are appended and never written again: dropping anything but the oldest rows, or adding columns,
    builds new arrays, so the slices a view hands out stay valid after later ingests."""

    __slots__ = ("keep", "cm", "cs", "cslot", "T", "V", "at", "cid", "tlo", "thi", "tdone", "r0", "r1", "cnt", "holes",
                 "last_t", "monotone", "version", "_ranges", "_spare")

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self.cm = np.zeros(0, np.int32)  # column -> metric
        self.cs = np.zeros(0, np.int32)  # column -> series
        self.cslot = np.zeros(0, np.int64)  # column -> counter slot
        self.T = np.full((8, 0), np.nan)
        self.V = np.full((8, 0), np.nan)
        self.at = np.zeros(8)
        self.cid = np.zeros(8, np.int64)
        # per row, its earliest and latest sample time (NaN: none): a window's start falls between the
        # rows all before it and those all after it, so only the few rows between are read (``row_times``,
        # which fills them for the rows below ``tdone`` when a view asks, not on every ingest)
        self.tlo = np.zeros(8)
        self.thi = np.zeros(8)
        self.tdone = 0
        self.r0 = 0  # live rows: r0 .. r1
        self.r1 = 0
        self.cnt = np.zeros(0, np.int64)  # samples per column in the live rows
        self.holes = 0  # NaN cells in the live rows
        self.last_t = np.zeros(0)  # latest time written per column
        self.monotone = True
        self.version = 0  # changes with the columns
        self._ranges: tuple[int, list[tuple[int, int, int]]] | None = None
        self._spare: tuple[np.ndarray, np.ndarray] | None = None  # the matrices before the last copy

    def __getstate__(self) -> dict[str, Any]:
        # a copy (the backtest forks a lane's history) takes the live matrices, not the spare ones
        return {name: getattr(self, name) for name in self.__slots__ if name != "_spare"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._spare = None

    def _arrays(self, cap: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Matrices of at least ``cap`` rows and ``n`` columns for ``_realloc`` (contents undefined): the
        ones left by the copy before the last when they fit and nothing but this group holds them any
        more (a view's slice holds its array: numpy's ``base``), else new ones. The current ones become
        the spare ones, up to ``_SPARE_BYTES`` (at 100k GPUs a group's matrices are not kept twice)."""
        spare = self._spare
        self._spare = (self.T, self.V) if 2 * self.T.nbytes <= _SPARE_BYTES else None
        if (spare is not None and spare[0].shape[1] == n and cap <= spare[0].shape[0] <= cap + cap // 2
                and sys.getrefcount(spare[0]) <= _HELD_ONCE and sys.getrefcount(spare[1]) <= _HELD_ONCE):
            return spare
        return np.empty((cap, n)), np.empty((cap, n))

    def _realloc(self, n: int, keep_rows: np.ndarray, room: int, cols_at: np.ndarray | None = None) -> None:
        """New arrays with ``n`` columns (old column j at ``cols_at[j]``) holding the rows ``keep_rows``."""
        k = keep_rows.size
        # room for half the live rows again: a copy every k/2 ingests, and at 100k GPUs (900k counter
        # columns) the matrices stay under the chunk lists' footprint (1.5x the live samples at most);
        # a small matrix (up to 32 MiB of spare rows) gets 64 spare rows, a copy every 64 ingests
        spare = max(8, k // 2)
        if n * 64 * 16 <= 32 * 2**20:
            spare = max(spare, 64)
        cap = max(16, k + room + spare)
        cap += -cap % 32  # (a few sizes, so that the spare matrices fit again as the live rows vary)
        # Memory traffic is most of an ingest's cost: the kept rows are copied once, run by run of
        # consecutive rows (slices: no gathered temporary; thinning leaves a few runs), and a spare row is
        # written only when it is appended (``append`` fills what it leaves).
        T, V = self._arrays(cap, n)
        cap = T.shape[0]
        if cols_at is None:
            heads = np.flatnonzero(np.diff(keep_rows) != 1) + 1
            if heads.size <= 16:
                for a, b in itertools.pairwise([0, *heads.tolist(), k]):
                    src = int(keep_rows[a])
                    T[a:b], V[a:b] = self.T[src:src + b - a], self.V[src:src + b - a]
            else:
                np.take(self.T, keep_rows, axis=0, out=T[:k])
                np.take(self.V, keep_rows, axis=0, out=V[:k])
        else:
            rows = _run(keep_rows)
            T[:k], V[:k] = np.nan, np.nan
            T[:k, cols_at], V[:k, cols_at] = self.T[rows], self.V[rows]
        at, cid, tlo, thi = np.zeros(cap), np.zeros(cap, np.int64), np.zeros(cap), np.zeros(cap)
        at[:k], cid[:k] = self.at[keep_rows], self.cid[keep_rows]
        tlo[:k], thi[:k] = self.tlo[keep_rows], self.thi[keep_rows]
        self.tdone = int(np.searchsorted(keep_rows, self.tdone))  # (kept rows ascend)
        self.T, self.V, self.at, self.cid, self.tlo, self.thi = T, V, at, cid, tlo, thi
        self.r0, self.r1 = 0, k

    def add_columns(self, m: np.ndarray, s: np.ndarray, slots: np.ndarray) -> None:
        cm = np.concatenate((self.cm, m.astype(np.int32)))
        cs = np.concatenate((self.cs, s.astype(np.int32)))
        order = np.lexsort((cs, cm))
        old_pos = np.argsort(order)[: self.cm.size]  # where each old column lands
        n, k = cm.size, self.r1 - self.r0
        self._realloc(n, np.arange(self.r0, self.r1), 0, old_pos)
        cnt = np.zeros(n, np.int64)
        cnt[old_pos] = self.cnt
        last_t = np.full(n, -np.inf)
        last_t[old_pos] = self.last_t
        self.holes += k * m.size
        self.cm, self.cs = cm[order], cs[order]
        self.cslot = np.concatenate((self.cslot, slots.astype(np.int64)))[order]
        self.cnt, self.last_t = cnt, last_t
        self.version += 1
        self._ranges = None

    def append(self, at: float, cid: int, col: np.ndarray | None, rank: np.ndarray | None, t: np.ndarray,
               v: np.ndarray) -> bool:
        """Samples (each column's adjacent, in time order; ``col`` None: one per column, in column order;
        ``rank``: each one's place among its column's samples in this ingest, None when all are first) as
        new rows. True when a column had no sample before."""
        rows = 1 if rank is None else int(rank.max()) + 1
        if self.r1 + rows > self.T.shape[0]:
            self._realloc(self.cm.size, np.arange(self.r0, self.r1), rows)
        r = self.r1
        if col is None:  # every column once, in order: slices, no scatter
            self.T[r] = t
            self.V[r] = v
            if (t < self.last_t).any():
                self.monotone = False
            born = bool((self.cnt == 0).any())
            self.cnt += 1
            self.last_t[:] = t
        elif rank is None:
            self.T[r], self.V[r] = np.nan, np.nan  # (spare rows hold garbage: see ``_realloc``)
            self.T[r, col] = t
            self.V[r, col] = v
            if (t < self.last_t[col]).any():
                self.monotone = False
            born = bool((self.cnt[col] == 0).any())
            self.cnt[col] += 1
            self.last_t[col] = t
        else:
            self.T[r:r + rows], self.V[r:r + rows] = np.nan, np.nan
            self.T[r + rank, col] = t
            self.V[r + rank, col] = v
            first = rank == 0
            if (t[first] < self.last_t[col[first]]).any():
                self.monotone = False  # (a column's samples of one ingest are in time order)
            born = bool((self.cnt[col] == 0).any())
            np.add.at(self.cnt, col, 1)
            last = np.ones(col.size, bool)
            last[:-1] = col[1:] != col[:-1]
            self.last_t[col[last]] = t[last]
        self.at[r:r + rows] = at
        self.cid[r:r + rows] = cid
        self.r1 = r + rows
        self.holes += rows * self.cm.size - t.size
        return born

    def expire(self, now: float, dropped: np.ndarray | None) -> bool:
        """Drop the rows older than ``keep`` and those of ``dropped`` chunks (sorted cids). True when a
        column was left without samples."""
        if self.r1 == self.r0:
            return False
        dead = (now - self.at[self.r0:self.r1]) > self.keep
        if dropped is not None and dropped.size:
            # (row cids ascend: rows are appended ingest by ingest; ``dropped`` is sorted)
            cids = self.cid[self.r0:self.r1]
            at = np.searchsorted(dropped, cids)
            dead |= dropped[np.minimum(at, dropped.size - 1)] == cids
        nd = int(np.count_nonzero(dead))
        if nd == 0:
            return False
        rows = np.flatnonzero(dead) + self.r0
        if self.holes == 0:
            per_col = np.full(self.cm.size, nd, np.int64)
        else:
            per_col = (~np.isnan(self.T[rows])).sum(axis=0)
        before = self.cnt > 0
        self.cnt = self.cnt - per_col
        self.holes -= nd * self.cm.size - int(per_col.sum())
        emptied = bool((before & (self.cnt == 0)).any())
        if bool(dead[:nd].all()):
            self.r0 += nd  # the oldest rows: the common case
        else:
            self._realloc(self.cm.size, np.flatnonzero(~dead) + self.r0, 0)
        if not self.monotone:
            T = self.T[self.r0:self.r1]
            run = np.fmax.accumulate(T, axis=0)
            self.monotone = not bool((T[1:] < run[:-1]).any())
        return emptied

    def row_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Each live row's earliest and latest sample time (NaN: an empty row)."""
        a, b = max(self.tdone, self.r0), self.r1
        if a < b:  # rows appended since the last view (fmin/fmax skip the NaN of empty cells)
            self.tlo[a:b] = np.fmin.reduce(self.T[a:b], axis=1) if self.cm.size else np.nan
            self.thi[a:b] = np.fmax.reduce(self.T[a:b], axis=1) if self.cm.size else np.nan
        self.tdone = b
        return self.tlo[self.r0:self.r1], self.thi[self.r0:self.r1]

    def ranges(self) -> list[tuple[int, int, int]]:
        """(metric, first column, end column) of each metric's block of columns."""
        if self._ranges is None or self._ranges[0] != self.version:
            self._ranges = (self.version, _id_runs(self.cm))
        return self._ranges[1]


def _held_once() -> int:
    """What ``sys.getrefcount`` reads for an array held only by a tuple, read as ``_Group._arrays`` reads
    it (the count includes the call's own reference, which interpreters count differently)."""
    held = (np.empty(0),)
    return sys.getrefcount(held[0])


_HELD_ONCE = _held_once()
_SPARE_BYTES = 32 * 2**20


def _id_runs(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(id, start, end) of each run of equal ids, in order."""
    if ids.size == 0:
        return []
    heads = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    ends = np.concatenate((heads[1:], [ids.size]))
    return [(int(ids[a]), int(a), int(b)) for a, b in zip(heads, ends, strict=True)]


def _run(a: np.ndarray) -> np.ndarray | slice:
    """``a`` as a slice when it is a run of consecutive ints (fancy indexing by a slice is a view)."""
    if a.size and int(a[-1]) - int(a[0]) == a.size - 1 and bool((np.diff(a) == 1).all()):
        return slice(int(a[0]), int(a[-1]) + 1)
    return a


def _thinned(at: np.ndarray, gone: np.ndarray, now: float, thin_every_s: float, dense_s: float, coarse_s: float,
             sparse_s: float, sparse_coarse_s: float) -> np.ndarray:
    """``gone`` and the chunks (made at ``at``, in list order) that thinning drops as of ``now``: beyond
    ``dense_s`` only the first chunk of each ``coarse_s`` bucket survives, beyond ``sparse_s`` of each
    ``sparse_coarse_s`` bucket (the first in list order among the old chunks left); ages as of the last
    multiple of ``thin_every_s`` (``SignalHistory.thin_every_s``)."""
    thin_age = np.floor(now / thin_every_s) * thin_every_s - at
    old = np.flatnonzero(~gone & (thin_age > dense_s))
    drop = gone
    if old.size > 1:
        sparse = thin_age[old] > sparse_s
        b = np.where(sparse, np.floor_divide(at[old], sparse_coarse_s),
                     -1.0 - np.floor_divide(at[old], coarse_s))  # the tiers never share an id
        same = np.flatnonzero(b[1:] == b[:-1]) + 1
        if same.size:
            drop = gone.copy()
            drop[old[same]] = True
    return drop

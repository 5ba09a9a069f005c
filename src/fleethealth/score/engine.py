"""The scoring engine: a whole fleet snapshot -> one health tuple per GPU, node, replica and rank.

Theory of operation
-------------------
1. Resolve: every interned label set is mapped once to its entity keys (gpu ``node/gpuN``, node, replica,
   rank ``job/rankN``). Label sets are shared by all metrics of a GPU, so this is ~one dictionary lookup
   per GPU, cached across cycles when the snapshot's label-set list is reused (history, simulator).
2. Evaluate each policy signal for each entity kind it describes, on arrays: the latest fresh sample per
   series (gauges) or a reset-aware rate over the window (counters), reduced per entity, then shaped into
   a sub-score in [0, 1] (gate, ramp, peer robust z with grouped median/MAD by sorting, SLO burn rate).
   Missing or stale data is NaN: never a score.
3. Aggregate per entity on an entities x signals matrix: hard gates first (a fresh gate at 0 forces 0),
   weighted mean inside a category, then min (or geometric mean, or mean for baselines) across
   categories. Confidence is the share of *expected* signals that are fresh; no fresh data -> unknown.
4. A node is the weakest of its GPUs and its node-wide signals; the tuple names the worst GPU.

A history's view (``Snapshot.index``) is read without sorting: each metric's rows are one block, counters
come as matrices (``CounterMatrix``: a window's increase is a difference of two entries, computed once for
every counter kept alike), and what depends only on which series exist (entity tables, series->entity
maps) is kept from the last cycle while the history's shape token says that set is unchanged. Any other
snapshot takes the row path, which stays the reference: both give the same numbers (tests).

On a history's view the steady-state cycle is a fixed sequence of numpy operations over every kind at
once (``_Plan``, kept while the view's layout is the one it was built on): each quantity (sub, raw, rate,
z, age) is one flat buffer of which a kind's signals x entities matrix is a block; all gauges are one
gather, each counter group's rates one window; ramps, gates and flags one element-wise pass; the SLOs of
a kind one batch; peer medians a row sort of a padded groups x width matrix. What follows from inputs
equal to last cycle's is kept by equality, never assumed: the seen/fresh masks' consequences, a kind's
category scores when its sub-scores are bit for bit last cycle's, the node roll-up made from those.

The result (``FleetHealth``) is columnar; ``HealthTuple`` objects are built lazily on access so that a
100k-GPU fleet scores in a fraction of a second; the serving consumer's kinds are aggregated when first
read (its router reads replicas only). Pure: no I/O, no clock; ``now`` is an argument.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from fleethealth.policy import Policy, SignalSpec
from fleethealth.score import shapes
from fleethealth.score.health import REASON_NO_FRESH_DATA, EntityKind, HealthTuple, SignalDetail
from fleethealth.signals.history import shape_token
from fleethealth.signals.snapshot import (
    CounterMatrix,
    InputIssue,
    LabelSet,
    Snapshot,
    bucket_at_threshold,
    label_float,
    order_by_series_time,
)
from fleethealth.signals.xid import classify_xid

Consumer = Literal["training", "serving", "remediation"]
CONSUMERS: tuple[str, ...] = ("training", "serving", "remediation")
NODE_INFO_METRIC = "fleethealth_node_info"
REPLICA_INFO_METRIC = "fleethealth_replica_info"
KINDS: tuple[EntityKind, ...] = ("gpu", "node", "replica", "rank")
UNNAMED_NODE = "(no-node-label)"
_GPU_SPECIFIC = {"UUID", "pci_bus_id", "gpu", "device", "job", "pod", "container", "rank", "peer_group", "xid", "le"}


# --------------------------------------------------------------------------------------------------
# Label-set resolution (cached, incremental)
# --------------------------------------------------------------------------------------------------
class _Resolver:
    """Maps label sets to entity key ids. Append-only: re-used while the snapshot's label-set list
    only grows (the history and the simulator keep one list), so each label set is resolved once."""

    def __init__(self, node_labels: Sequence[str], replica_labels: Sequence[str]) -> None:
        self.node_labels = tuple(node_labels)
        self.replica_labels = tuple(replica_labels)
        self.n = 0
        self.key_names: list[str] = []
        self.key_ix: dict[str, int] = {}
        self.key_node: list[int] = []  # key id -> node key id (for gpu keys), else -1
        self.display: list[str] = []  # key id -> entity name without the kind prefix
        self._display_arr = np.zeros(0, object)
        self.cols: dict[str, list[int]] = {k: [] for k in KINDS}
        self.arr: dict[str, np.ndarray] = {}
        self.labelsets: list[LabelSet] | None = None
        self._groups: dict[tuple[str, ...], tuple[int, dict[tuple[str, ...], int], list[int], np.ndarray]] = {}
        self._key_node_arr = np.zeros(0, np.int64)
        self.meta_cache: dict[tuple[str, tuple[int, ...]], dict[str, str]] = {}
        self._floats: dict[str, list[float]] = {}
        self._matches: dict[tuple[tuple[str, str], ...], list[bool]] = {}
        self._arrays: dict[tuple[str, Any], np.ndarray] = {}  # the two above as arrays, while complete

    def label_floats(self, label: str) -> np.ndarray:
        """Per label set, the float value of ``label`` (NaN when absent or not a number); incremental."""
        assert self.labelsets is not None
        vals = self._floats.setdefault(label, [])
        arr = self._arrays.get(("f", label))
        if arr is None or len(vals) < len(self.labelsets):
            vals.extend(label_float(ls, label) for ls in self.labelsets[len(vals):])
            arr = self._arrays[("f", label)] = np.asarray(vals, np.float64)
        return arr

    def label_match(self, match: Mapping[str, str]) -> np.ndarray:
        """Per label set, whether every label fully matches its regular expression; incremental."""
        assert self.labelsets is not None
        key = tuple(sorted(match.items()))
        hits = self._matches.setdefault(key, [])
        arr = self._arrays.get(("m", key))
        if arr is None or len(hits) < len(self.labelsets):
            rx = [(k, re.compile(v)) for k, v in key]
            for ls in self.labelsets[len(hits):]:
                d = dict(ls)
                hits.append(all(r.fullmatch(d.get(k, "")) is not None for k, r in rx))
            arr = self._arrays[("m", key)] = np.asarray(hits, bool)
        return arr

    def group_ids(self, labels: tuple[str, ...]) -> np.ndarray:
        """Per label set, the id of its peer group (the values of ``labels``); incremental, cached."""
        assert self.labelsets is not None
        n_done, keys, ids, arr = self._groups.get(labels, (0, {}, [], np.zeros(0, np.int64)))
        if n_done < len(self.labelsets):
            for ls in self.labelsets[n_done:]:
                d = dict(ls)
                key = tuple(d.get(k, "") for k in labels)
                ids.append(keys.setdefault(key, len(keys)))
            arr = np.asarray(ids, np.int64)
            self._groups[labels] = (len(self.labelsets), keys, ids, arr)
        return arr

    def _kid(self, name: str, node_kid: int = -1) -> int:
        ix = self.key_ix.get(name)
        if ix is None:
            ix = self.key_ix[name] = len(self.key_names)
            self.key_names.append(name)
            self.display.append(name.split(":", 1)[1])
            self.key_node.append(node_kid)
        return ix

    def update(self, labelsets: list[LabelSet]) -> None:
        if len(labelsets) == self.n:
            return
        gpu_c, node_c, rep_c, rank_c = (self.cols[k] for k in KINDS)
        for ls in labelsets[self.n :]:
            d = dict(ls)
            node = None
            for k in self.node_labels:
                node = d.get(k)
                if node:
                    break
            g = d.get("gpu")
            if not node and g:
                # A GPU sample without any node label (a bare exporter file): scored under a visible
                # placeholder node rather than silently dropped.
                node = UNNAMED_NODE
            node_kid = self._kid("node:" + node) if node else -1
            node_c.append(node_kid)
            gpu_c.append(self._kid(f"gpu:{node}/gpu{g}", node_kid) if (node and g is not None and g != "") else -1)
            rep = None
            for k in self.replica_labels:
                rep = d.get(k)
                if rep:
                    break
            rep_c.append(self._kid("replica:" + rep) if rep else -1)
            job, rank = d.get("job"), d.get("rank")
            rank_c.append(self._kid(f"rank:{job}/rank{rank}") if (job and rank is not None and rank != "") else -1)
        self.n = len(labelsets)
        self.arr = {k: np.asarray(v, np.int64) for k, v in self.cols.items()}
        self.labelsets = labelsets

    def display_names(self, ids: np.ndarray) -> list[str]:
        if self._display_arr.size != len(self.display):
            self._display_arr = np.array(self.display, dtype=object)
        return self._display_arr[ids].tolist() if ids.size else []

    @property
    def key_node_arr(self) -> np.ndarray:
        """key id -> node key id (gpu keys), else -1; as an array, rebuilt only when keys were added."""
        if self._key_node_arr.size != len(self.key_node):
            self._key_node_arr = np.asarray(self.key_node, np.int64)
        return self._key_node_arr


_RESOLVERS: dict[tuple[int, tuple[str, ...], tuple[str, ...]], _Resolver] = {}


def _resolver_for(snap: Snapshot, policy: Policy) -> _Resolver:
    key = (id(snap.labelsets), tuple(policy.node_labels), tuple(policy.replica_labels))
    r = _RESOLVERS.get(key)
    # Identity alone could be recycled after garbage collection: also require the list object to match
    # and never to have shrunk or been rewritten (first label set unchanged).
    if r is None or r.labelsets is not snap.labelsets or len(snap.labelsets) < r.n:
        r = _Resolver(policy.node_labels, policy.replica_labels)
        if len(_RESOLVERS) >= 8:
            _RESOLVERS.pop(next(iter(_RESOLVERS)))
        _RESOLVERS[key] = r
    r.update(snap.labelsets)
    return r


# --------------------------------------------------------------------------------------------------
# Per-signal evaluation
# --------------------------------------------------------------------------------------------------
class _SignalResult:
    """Per entity of one kind, one signal: sub-score (NaN = missing), raw, rate, z, age, seen (any
    sample), as row ``j`` of its kind's matrices (``_Mats``): each attribute is a view of that row, made
    on access (written in place, never rebound), plus the signal's flags and notes."""

    __slots__ = ("_m", "_j", "flags", "notes")

    def __init__(self, mats: _Mats, j: int) -> None:
        self._m, self._j = mats, j
        self.flags: list[tuple[int, str]] = []
        self.notes: dict[int, str] = {}

    @property
    def sub(self) -> np.ndarray:
        return self._m.sub[self._j]

    @property
    def raw(self) -> np.ndarray:
        return self._m.raw[self._j]

    @property
    def rate(self) -> np.ndarray:
        return self._m.rate[self._j]

    @property
    def z(self) -> np.ndarray:
        return self._m.z[self._j]

    @property
    def age(self) -> np.ndarray:
        return self._m.age[self._j]

    @property
    def seen(self) -> np.ndarray:
        return self._m.seen[self._j]


class _Mats:
    """One kind's per-signal results as signals x entities matrices (NaN / unseen to start): each
    signal's ``_SignalResult`` holds rows of them, so that several signals are evaluated and shaped by
    one numpy operation and aggregation reads the matrices without stacking."""

    def __init__(self, m: int, n: int) -> None:
        self.sub = np.full((m, n), np.nan)
        self.raw = np.full((m, n), np.nan)
        self.rate = np.full((m, n), np.nan)
        self.z = np.full((m, n), np.nan)
        self.age = np.full((m, n), np.nan)
        self.seen = np.zeros((m, n), bool)

    def result(self, j: int) -> _SignalResult:
        return _SignalResult(self, j)


def _uniq(a: np.ndarray) -> np.ndarray:
    """Sorted unique of non-negative ints; a presence mask beats hashing/sorting for dense ids."""
    if a.size == 0:
        return np.zeros(0, np.int64)
    k = int(a.max()) + 1
    if k <= 8 * a.size + 1_000_000:
        mask = np.zeros(k, bool)
        mask[a] = True
        return np.flatnonzero(mask)
    return np.unique(a)


def _is_counter(spec: SignalSpec) -> bool:
    return spec.kind == "counter"


def _in_order(series: np.ndarray, ts: np.ndarray, presorted: bool) -> np.ndarray:
    """``order_by_series_time``; with ``presorted`` (a history view's gauge rows), first a check that the
    rows already are in that order (one pass instead of a sort)."""
    if presorted and series.size > 1:
        ds = np.diff(series)
        if bool((ds >= 0).all()) and bool(((ds > 0) | (np.diff(ts) >= 0)).all()):
            return np.arange(series.size)
    return order_by_series_time(series, ts)


def _latest_per_series(series: np.ndarray, ts: np.ndarray, presorted: bool = False) -> np.ndarray:
    """Positions (into the given arrays) of the latest sample of each series."""
    if series.size == 0:
        return np.zeros(0, np.int64)
    if np.bincount(series).max() <= 1:  # one sample per series: each is its own latest
        return np.arange(series.size)
    order = _in_order(series, ts, presorted)
    s = series[order]
    last = np.ones(s.size, bool)
    last[:-1] = s[1:] != s[:-1]
    return order[last]


def _increase_per_series(
    series: np.ndarray, values: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Reset-aware increase per series (like PromQL): a drop means the counter restarted from 0.

    Returns (series ids, increase, first ts, last ts, last value); series with one sample have NaN.
    """
    order = order_by_series_time(series, ts)
    s, v, t = series[order], values[order], ts[order]
    if s.size == 0:
        e = np.zeros(0)
        return np.zeros(0, np.int64), e, e, e, e
    start = np.ones(s.size, bool)
    start[1:] = s[1:] != s[:-1]
    starts = np.flatnonzero(start)
    ends = np.concatenate((starts[1:], [s.size])) - 1
    d = np.diff(v, prepend=v[0])
    d = np.where(d < 0, v, d)  # reset: the new value is what was counted since the restart
    d[start] = 0.0
    inc = np.add.reduceat(d, starts)
    t0, t1 = t[starts], t[ends]
    one = starts == ends
    inc = inc.astype(np.float64)
    inc[one] = np.nan
    return s[starts], inc, t0, t1, v[ends]


def _counter_runs(
    series: np.ndarray, values: np.ndarray, ts: np.ndarray, start: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One sort by (series, time) for everything a counter needs: per series, the reset-aware increase
    over the samples after ``start`` (NaN with fewer than two), the first and last of those timestamps
    (NaN with none), and the latest value and timestamp overall."""
    order = order_by_series_time(series, ts)
    s, v, t = series[order], values[order], ts[order]
    if s.size == 0:
        e = np.zeros(0)
        return np.zeros(0, np.int64), e, e, e, e, e
    first = np.ones(s.size, bool)
    first[1:] = s[1:] != s[:-1]
    starts = np.flatnonzero(first)
    ends = np.concatenate((starts[1:], [s.size])) - 1
    inw = t > start
    d = np.diff(v, prepend=v[0])
    d = np.where(d < 0, v, d)  # reset: the new value is what was counted since the restart
    # a step counts when both of its samples are in the window (times are sorted within a series)
    pair = np.zeros(s.size, bool)
    pair[1:] = inw[:-1]
    d = np.where(pair & ~first, d, 0.0)
    run = s.size // starts.size
    if run * starts.size == s.size and bool((ends - starts == run - 1).all()):
        inc = d.reshape(-1, run).sum(axis=1)  # every series has as many samples: no segmented reduce
    else:
        inc = np.add.reduceat(d, starts).astype(np.float64)
    # the window is a suffix of each series' run: count it by a running count, start at its first
    c = np.cumsum(inw, dtype=np.int64)
    n_in = c[ends] - c[starts] + inw[starts]
    t0 = np.where(n_in > 0, t[np.minimum(ends + 1 - n_in, ends)], np.nan)
    t1 = np.where(n_in > 0, t[ends], np.nan)
    inc[n_in < 2] = np.nan
    return s[starts], inc, t0, t1, v[ends], t[ends]


class _Ctx:
    """Everything one scoring call shares: snapshot views sorted by metric, the resolver, entities."""

    def __init__(self, snap: Snapshot, policy: Policy, now: float) -> None:
        self.snap = snap
        self.policy = policy
        self.now = now
        self.issues: list[InputIssue] = []
        self.metric_ix = snap.metric_index()
        self.resolver = _resolver_for(snap, policy)
        skew = policy.freshness.future_skew_s
        # A history's view says where each metric's rows are and holds its counters as matrices: nothing
        # to sort, unless a sample lies in the future (those rows are left out: the plain path below).
        self.index = snap.index_upto(now + skew)
        self.order = np.zeros(0, np.int64)
        self.bounds: dict[int, tuple[int, int]] = {}
        self._windows: dict[tuple[int, float], tuple[np.ndarray, ...]] = {}
        self._rates: dict[tuple[int, float, float], tuple[np.ndarray, ...]] = {}
        self._stacks: dict[tuple[int, tuple[float, ...]], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        if self.index is not None:
            self.bounds = self.index.bounds
            return
        ok = snap.ts <= now + skew
        n_future = int((~ok).sum())
        if n_future:
            self.issues.append(
                InputIssue("<snapshot>", 0, f"{n_future} samples are more than {skew:g}s in the future (clock skew): ignored")
            )
        ok &= ~np.isnan(snap.values)
        all_ok = bool(ok.all())
        idx = np.arange(ok.size) if all_ok else np.flatnonzero(ok)
        mids_all = snap.metric_ids if all_ok else snap.metric_ids[idx]
        # Sources write a metric's samples together (an exposition family, a table column, a simulator
        # block): when each metric already is one contiguous block, no sort is needed at all.
        heads = np.concatenate(([0], np.flatnonzero(mids_all[1:] != mids_all[:-1]) + 1)) if mids_all.size else idx
        if np.unique(mids_all[heads]).size == heads.size:
            order = idx
        else:
            if len(snap.metrics) < 32000:
                mids_all = mids_all.astype(np.int16)  # stable sort of 16-bit ints is a radix sort: O(n)
            order = idx[np.argsort(mids_all, kind="stable")]
        self.order = order
        mids = snap.metric_ids[order]
        if order.size:
            chg = np.ones(mids.size, bool)
            chg[1:] = mids[1:] != mids[:-1]
            first = np.flatnonzero(chg)
            uniq = mids[first]
            last = np.concatenate((first[1:], [order.size]))
            for u, a, b in zip(uniq.tolist(), first.tolist(), last.tolist(), strict=True):
                self.bounds[u] = (a, b)

    def row_arrays(self, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Series ids, values and times to read rows below ``end`` from: a history view's head when it
        holds them, else the snapshot's arrays."""
        if self.index is not None:  # a history view writes its counter rows only when they are read
            return self.index.arrays(self.snap, end)
        return self.snap.series_ids, self.snap.values, self.snap.ts

    def samples(self, metric: str, match: Mapping[str, str] | None = None) -> np.ndarray:
        mid = self.metric_ix.get(metric)
        if mid is None or mid not in self.bounds:
            return np.zeros(0, np.int64)
        a, b = self.bounds[mid]
        idx = np.arange(a, b) if self.index is not None else self.order[a:b]
        if match:
            idx = idx[self.resolver.label_match(match)[self.row_arrays(b)[0][idx]]]
        return idx

    def series_of(self, metric: str) -> np.ndarray:
        """Series ids of the metric's samples (repeats allowed)."""
        mat = self.matrix(metric)
        if mat is not None:
            return mat.series[mat.last >= 0]
        mid = self.metric_ix.get(metric)
        if self.index is not None and mid is not None and mid in self.bounds:
            a, b = self.bounds[mid]
            return self.row_arrays(b)[0][a:b]
        idx = self.samples(metric)
        return self.row_arrays(int(idx.max()) + 1 if idx.size else 0)[0][idx]

    def matrix(self, metric: str) -> CounterMatrix | None:
        if self.index is None:
            return None
        mid = self.metric_ix.get(metric)
        return None if mid is None else self.index.counters.get(mid)

    def columns(self, metric: str, match: Mapping[str, str] | None, kind: str,
                table: _KindTable) -> _Columns | None:
        """The metric's counter matrix, restricted to series with samples that belong to an entity of
        ``kind`` (and match ``match``); None when the view has no matrix for it (then: rows)."""
        mat = self.matrix(metric)
        if mat is None:
            return None
        # which entity each series is: the same while the series and the tables are (cycle after cycle)
        key = (metric, tuple(sorted(match.items())) if match else (), kind, id(table))
        hit = _COLUMNS.get(key)
        if hit is not None and hit[0] is table and np.array_equal(hit[1], mat.series):
            ent, ok, single = hit[2], hit[3], hit[4]
        else:
            ent = table.entities(self.resolver.arr[kind][mat.series])
            ok = ent >= 0
            if match:
                ok &= self.resolver.label_match(match)[mat.series]
            single = bool(ok.all()) and (ent.size == 0 or int(np.bincount(ent).max()) <= 1)
            if len(_COLUMNS) > 512:
                _COLUMNS.clear()
            _COLUMNS[key] = (table, mat.series.copy(), ent, ok, single)
        keep = ok & (mat.last >= 0)
        if bool(keep.all()):
            return _Columns(self, mat, mat.series, ent, slice(mat.c0, mat.c1), single)
        sel = np.flatnonzero(keep)
        return _Columns(self, mat, mat.series[sel], ent[sel], sel + mat.c0)

    def windows(self, mat: CounterMatrix, starts: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Increase and sample count in each window (rows: ``starts``) and the latest timestamp, per
        column of ``mat``'s group."""
        key = (mat.group, starts)
        hit = self._stacks.get(key)
        if hit is None:
            assert self.index is not None
            g = self.index.groups[mat.group]
            hit = self._stacks[key] = _windows(g.t, g.v, g.last, np.asarray(starts, np.float64), g.dense)
        return hit

    def gauge_rows(self, metric: str, match: Mapping[str, str] | None, kind: str,
                   table: _KindTable) -> _GaugeRows | None:
        """A history view's rows of a gauge, one per series, with their entities of ``kind``; None when
        a series has several (then: the row path)."""
        mid = self.metric_ix.get(metric)
        if mid is None or mid not in self.bounds:
            return None
        a, b = self.bounds[mid]
        block = self.row_arrays(b)[0][a:b]
        key = ("g", metric, tuple(sorted(match.items())) if match else (), kind, id(table))
        hit = _GAUGES.get(key)
        if hit is not None and hit[0] is table and np.array_equal(hit[1], block):
            g = hit[2]
            return None if g is None else _GaugeRows(a, b, g.sel, g.ser, g.ent, g.single)
        ent = table.entities(self.resolver.arr[kind][block])
        keep = ent >= 0
        if match:
            keep &= self.resolver.label_match(match)[block]
        sel = None if bool(keep.all()) else np.flatnonzero(keep)
        ser, ent = (block, ent) if sel is None else (block[sel], ent[sel])
        g = None
        if ser.size == 0 or int(np.bincount(ser).max()) <= 1:
            g = _GaugeRows(a, b, sel, ser.copy(), ent, ent.size == 0 or int(np.bincount(ent).max()) <= 1)
        if len(_GAUGES) > 512:
            _GAUGES.clear()
        _GAUGES[key] = (table, block.copy(), g)
        return g

    def rates(self, mat: CounterMatrix, window: float, max_age: float) -> tuple[np.ndarray, ...]:
        """Per column of ``mat``'s group: rate over the window (NaN unless fresh), latest value, age."""
        key = (mat.group, window, max_age)
        hit = self._rates.get(key)
        if hit is None:
            inc, t0, t1, lv, lt, _ = self.window(mat, self.now - window)
            hit = self._rates[key] = (_fresh_rate(inc, t0, t1, self.now, max_age), lv, self.now - lt)
        return hit

    def window(self, mat: CounterMatrix, start: float) -> tuple[np.ndarray, ...]:
        """``_window`` over the whole matrix of ``mat``'s group: once per (group, start) and call, for
        every metric of the group (all of a GPU's counters are one matrix)."""
        key = (mat.group, start)
        hit = self._windows.get(key)
        if hit is None:
            assert self.index is not None
            g = self.index.groups[mat.group]
            hit = self._windows[key] = _window(g.t, g.v, g.last, start, g.dense)
        return hit


def _window(t: np.ndarray, v: np.ndarray, last: np.ndarray, start: float, dense: bool = False) -> tuple[np.ndarray, ...]:
    """Per column of a counter matrix, as ``_counter_runs`` per series: the increase over the samples
    after ``start`` (NaN with fewer than two), their first and last timestamps (NaN with none), the
    latest value and timestamp, and how many samples are in the window. The values are cumulative and
    times sorted down each column, so the window is a suffix and its increase a difference of two
    entries."""
    k, c = t.shape
    # counts down the columns in a small integer type (the sum of a bool matrix is faster so), and
    # one entry per column picked by a flat index where the matrices are contiguous
    small = np.uint8 if k < 255 else np.uint16 if k < 65535 else np.int64
    cols = np.arange(c)
    flat = t.flags.c_contiguous and v.flags.c_contiguous
    flat_t, flat_v = (t.reshape(-1), v.reshape(-1)) if flat else (t, v)

    def pick(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per column, the entry at ``rows`` (-1: the last row)."""
        return a[rows * c + cols] if flat else a[rows, cols]

    if dense:  # every series a sample in every row: the first in the window is the count before it
        n_out = (t <= start).sum(axis=0, dtype=small).astype(np.int64)
        n_in = k - n_out
        first = np.minimum(n_out, k - 1)
        lt, lv = t[k - 1], v[k - 1]
    else:
        inw = t > start
        n_in = inw.sum(axis=0, dtype=small).astype(np.int64)
        first = inw.argmax(axis=0)
        lt = pick(flat_t, last)
        lv = pick(flat_v, last)
    has = n_in > 0
    t0 = np.where(has, pick(flat_t, first), np.nan)
    t1 = np.where(has, lt, np.nan)
    inc = np.where(n_in >= 2, lv - pick(flat_v, first), np.nan)
    return inc, t0, t1, lv, lt, n_in


def _windows(t: np.ndarray, v: np.ndarray, last: np.ndarray, starts: np.ndarray,
             dense: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_window`` for several starts at once: the increase (NaN with fewer than two samples) and the
    sample count in each window (rows: ``starts``), and the latest timestamp, per column."""
    k, c = t.shape
    small = np.uint8 if k < 255 else np.uint16 if k < 65535 else np.int64
    cols = np.arange(c)
    flat = t.flags.c_contiguous and v.flags.c_contiguous
    flat_t, flat_v = (t.reshape(-1), v.reshape(-1)) if flat else (t, v)

    def pick(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return a[rows * c + cols] if flat else a[rows, np.broadcast_to(cols, rows.shape)]

    if dense:
        n_out = (t[None, :, :] <= starts[:, None, None]).sum(axis=1, dtype=small).astype(np.int64)
        n_in = k - n_out
        first = np.minimum(n_out, k - 1)
        lt, lv = t[k - 1], v[k - 1]
    else:
        inw = t[None, :, :] > starts[:, None, None]
        n_in = inw.sum(axis=1, dtype=small).astype(np.int64)
        first = inw.argmax(axis=1)
        lt = pick(flat_t, last)
        lv = pick(flat_v, last)
    inc = np.where(n_in >= 2, lv[None, :] - pick(flat_v, first), np.nan)
    return inc, n_in, lt


@dataclass
class _GaugeRows:
    """A gauge's rows ``a:b`` of a view (``sel``: those of the kind's entities, None: all): one per
    series ``ser``, entity ``ent``; ``single``: one series per entity."""

    a: int
    b: int
    sel: np.ndarray | None
    ser: np.ndarray
    ent: np.ndarray
    single: bool


_GAUGES: dict[tuple[Any, ...], tuple[_KindTable, np.ndarray, _GaugeRows | None]] = {}
# (metric, match, kind, id(table)) -> (table, series, entity per series, series usable, one per entity)
_COLUMNS: dict[tuple[Any, ...], tuple[_KindTable, np.ndarray, np.ndarray, np.ndarray, bool]] = {}


class _Columns:
    """A counter matrix's columns (series) of one entity kind: ``ent`` per column; ``cols``: where they
    are in the matrix of the view's group."""

    def __init__(self, ctx: _Ctx, mat: CounterMatrix, series: np.ndarray, ent: np.ndarray,
                 cols: slice | np.ndarray, single: bool = False) -> None:
        self.ctx, self.mat, self.series, self.ent, self.cols = ctx, mat, series, ent, cols
        self.single = single  # known: one series per entity

    def window(self, start: float) -> tuple[np.ndarray, ...]:
        return tuple(a[self.cols] for a in self.ctx.window(self.mat, start))

    def only(self, sel: np.ndarray) -> _Columns:
        cols = np.arange(self.cols.start, self.cols.stop)[sel] if isinstance(self.cols, slice) else self.cols[sel]
        return _Columns(self.ctx, self.mat, self.series[sel], self.ent[sel], cols)


@dataclass
class _KindTable:
    kind: EntityKind
    key_ids: np.ndarray  # resolver key id per entity
    lut: np.ndarray  # resolver key id -> entity index (-1)
    names: list[str]

    def entities(self, kid: np.ndarray) -> np.ndarray:
        """Entity index per resolver key id (-1: no key, or no entity of this kind)."""
        return np.where(kid >= 0, self.lut[np.maximum(kid, 0)], -1)


def _entity_tables(ctx: _Ctx, policy: Policy, inventory: Mapping[str, Sequence[str]] | None) -> dict[str, _KindTable]:
    r = ctx.resolver
    found: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
    # which label sets carry a signal of each kind: one presence mask, then their keys once
    has_series: dict[str, np.ndarray] = {}
    for spec in policy.signals:
        # an SLO's samples are its request counter (the histogram's name itself has no samples)
        ser = ctx.series_of(spec.requests_metric if spec.shape == "slo" and spec.requests_metric else spec.metric)
        if ser.size == 0:
            continue
        for kind in spec.entities:
            mask = has_series.get(kind)
            if mask is None:
                mask = has_series[kind] = np.zeros(len(ctx.snap.labelsets), bool)
            mask[ser] = True
    for k, mask in has_series.items():
        kid = r.arr[k][np.flatnonzero(mask)]
        found[k].append(_uniq(kid[kid >= 0]))
    # gpus imply their nodes
    if found["gpu"]:
        g = _uniq(np.concatenate(found["gpu"]))
        found["gpu"] = [g]
        kn = r.key_node_arr[g] if g.size else np.zeros(0, np.int64)
        found["node"].append(kn[kn >= 0])
    if inventory:
        for inv_kind, names in inventory.items():
            if inv_kind not in found:
                continue
            inv_ids: list[int] = []
            for name in names:
                if inv_kind == "gpu" and "/gpu" in name:
                    node = name.rsplit("/gpu", 1)[0]
                    inv_ids.append(r._kid(f"gpu:{name}", r._kid("node:" + node)))
                else:
                    inv_ids.append(r._kid(f"{inv_kind}:{name}"))
            found[inv_kind].append(np.asarray(inv_ids, np.int64))
    out: dict[str, _KindTable] = {}
    n_keys = len(r.key_names)
    for kind in KINDS:
        ids = _uniq(np.concatenate(found[kind])) if found[kind] else np.zeros(0, np.int64)
        lut = np.full(max(n_keys, 1), -1, np.int64)
        lut[ids] = np.arange(ids.size)
        names = r.display_names(ids)
        out[kind] = _KindTable(kind, ids, lut, names)
    return out


def _reduce_worst(ent: np.ndarray, vals: np.ndarray, n: int, higher_worse: bool) -> np.ndarray:
    out = np.full(n, np.nan)
    if ent.size and np.bincount(ent, minlength=1).max() <= 1:  # one value per entity: no reduction
        out[ent] = vals
    elif ent.size:
        if higher_worse:
            np.fmax.at(out, ent, vals)
        else:
            np.fmin.at(out, ent, vals)
    return out


def _evaluate(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, table: _KindTable,
              res: _SignalResult | None = None) -> _SignalResult:
    """One signal for every entity of ``kind``, written into ``res`` (all NaN / unseen on entry; a fresh
    one when None). Every writer fills the result's arrays in place: they may be rows of one matrix."""
    n = len(table.names)
    pol = ctx.policy
    if res is None:
        res = _Mats(1, n).result(0)
    snap = ctx.snap
    if spec.shape == "slo":
        return _evaluate_slo(ctx, spec, kind, table, res)
    if _is_counter(spec) and spec.shape != "xid":
        cols = ctx.columns(spec.metric, spec.match, kind, table)
        if cols is not None:
            return _evaluate_counter_columns(ctx, spec, kind, cols, res)
    elif spec.shape != "xid" and ctx.index is not None:
        rows = ctx.gauge_rows(spec.metric, spec.match, kind, table)
        if rows is not None:
            return _evaluate_gauge_rows(ctx, spec, kind, rows, res)
    if spec.shape == "xid" and spec.kind == "gauge" and ctx.index is not None:
        xid_rows = _xid_rows(ctx, spec, kind, table)
        if xid_rows is not None:
            idx, ser, ent, layout = xid_rows
            if idx.size:
                res.seen[ent] = True
                _evaluate_xid(ctx, spec, idx, ser, ent, res, layout)
            return res
    idx = ctx.samples(spec.metric, spec.match)
    if idx.size == 0:
        return res
    ser = snap.series_ids[idx]
    ent = table.entities(ctx.resolver.arr[kind][ser])
    keep = ent >= 0
    idx, ser, ent = idx[keep], ser[keep], ent[keep]
    if idx.size == 0:
        return res
    res.seen[ent] = True
    max_age = spec.max_age_s or pol.freshness.max_age_s
    now = ctx.now
    if spec.shape == "xid":
        return _evaluate_xid(ctx, spec, idx, ser, ent, res)
    vals, ts = snap.values[idx], snap.ts[idx]
    higher_worse = spec.worse_if == "higher"
    if _is_counter(spec):
        window = spec.rate_window_s or pol.freshness.rate_window_s
        s_ids, inc, t0, t1, last_v, last_t = _counter_runs(ser, vals, ts, now - window)
        # series -> entity: counters of one entity add up (e.g. per-link NVLink counters)
        ent_of_series = np.full(int(ser.max()) + 1, -1, np.int64)
        ent_of_series[ser] = ent
        _counter_rates(res, ent_of_series[s_ids], inc, t0, t1, last_v, last_t, now, max_age)
        x = res.rate
    else:
        lp = _latest_per_series(ser, ts)
        age_s = now - ts[lp]
        fresh = age_s <= max_age
        res.age[:] = _reduce_worst(ent[lp], np.maximum(age_s, 0.0), n, False)
        lpf = lp[fresh]
        res.raw[:] = _reduce_worst(ent[lpf], vals[lpf], n, higher_worse)
        x = res.raw
    res.sub[:] = _shape(ctx, spec, kind, x, ser, ent, lp if not _is_counter(spec) else None, res, n)
    return res


@dataclass
class _ShapePlan:
    """Per signal of one kind's list, what the batched evaluation needs from the policy alone."""

    code: np.ndarray  # 0 other, 1 ramp, 2 gate, 3 flag, 4 peer
    counter: np.ndarray  # bool: the shape reads the rate (else the raw value)
    max_age: np.ndarray
    window: np.ndarray
    warn: np.ndarray  # ramp
    span: np.ndarray  # ramp: crit - warn
    above: np.ndarray  # gate / flag threshold (NaN: none; nothing is above NaN)
    flag_score: np.ndarray


_SHAPE_PLANS: dict[tuple[int, tuple[int, ...]], tuple[Policy, list[SignalSpec], _ShapePlan]] = {}
_SHAPE_CODES = {"ramp": 1, "gate": 2, "flag": 3, "peer": 4}


def _shape_plan(policy: Policy, specs: list[SignalSpec]) -> _ShapePlan:
    key = (id(policy), tuple(id(s) for s in specs))
    hit = _SHAPE_PLANS.get(key)
    if hit is not None and hit[0] is policy and all(a is b for a, b in zip(hit[1], specs, strict=True)):
        return hit[2]
    fr = policy.freshness

    def col(f: Any) -> np.ndarray:
        return np.array([f(s) for s in specs], np.float64)

    plan = _ShapePlan(
        np.array([_SHAPE_CODES.get(s.shape, 0) if s.shape != "xid" else 0 for s in specs], np.int64),
        np.array([_is_counter(s) for s in specs], bool),
        col(lambda s: s.max_age_s or fr.max_age_s),
        col(lambda s: s.rate_window_s or fr.rate_window_s),
        col(lambda s: s.warn if s.shape == "ramp" else np.nan),
        # the same float subtraction shapes.ramp does per call
        col(lambda s: (s.crit - s.warn) if s.shape == "ramp" else np.nan),
        col(lambda s: s.above if s.above is not None else np.nan),
        col(lambda s: s.flag_score if s.shape == "flag" else np.nan),
    )
    if len(_SHAPE_PLANS) > 64:
        _SHAPE_PLANS.clear()
    _SHAPE_PLANS[key] = (policy, list(specs), plan)
    return plan


def _evaluate_kind(ctx: _Ctx, kind: EntityKind, table: _KindTable,
                   specs: list[SignalSpec]) -> tuple[list[_SignalResult], _Mats]:
    """Every signal of one kind, one by one (the plain path: a snapshot without a view index)."""
    mats = _Mats(len(specs), len(table.names))
    results = [mats.result(j) for j in range(len(specs))]
    for j, spec in enumerate(specs):
        _evaluate(ctx, spec, kind, table, results[j])
    return results, mats


# an SLO's (request, good) columns: (metric, series, entity, column in the matrix group) each
_SloColumns = tuple[tuple[str, np.ndarray, np.ndarray, np.ndarray], tuple[str, np.ndarray, np.ndarray, np.ndarray]]


def _rows_of(off: int, n: int, js: list[int]) -> np.ndarray:
    """Flat positions of whole signal rows ``js`` of a kind's m x n block starting at ``off``."""
    if not js:
        return np.zeros(0, np.int64)
    return (off + np.asarray(js, np.int64)[:, None] * n + np.arange(n)[None, :]).reshape(-1)


class _Plan:
    """How one view layout is evaluated, every kind at once: built from the per-signal lookups
    (``gauge_rows``, ``columns``) on a history's view, kept while the layout it read is the same (the
    checks in ``holds``), so that a steady-state cycle is a fixed sequence of numpy operations:

    * every kind's results live in one flat buffer per quantity (sub, raw, rate, z, age, seen); a
      kind's ``_Mats`` are m x n views of its block and a signal's result is rows of those;
    * gauges with one row per series and one series per entity: one gather of values and times for all
      of them, one scatter into raw and age;
    * counters with one column per entity: the group's rates (once per group and window, shared with
      every signal of the group), one gather per group;
    * ramp, gate and flag shapes: one element-wise pass over all their rows (the same arithmetic as
      ``shapes.ramp`` / ``shapes.gate`` with the parameters repeated per element);
    * peer signals shaped one by one (grouped medians), everything else (Xids, SLOs, several series
      per entity, rows without a matrix) through ``_evaluate``.
    """

    def __init__(self, ctx: _Ctx, tables: dict[str, _KindTable], specs: dict[str, list[SignalSpec]]) -> None:
        pol = ctx.policy
        self.policy, self.tables = pol, tables
        self.kinds: list[tuple[EntityKind, int, int, int]] = []  # (kind, offset, m, n)
        off = 0
        for kind in KINDS:
            n = len(tables[kind].names)
            if n:
                self.kinds.append((kind, off, len(specs[kind]), n))
                off += len(specs[kind]) * n
        self.size = off
        self.mids: dict[str, int | None] = {}  # every metric the checks read: its id (None: absent)
        self.absent: list[str] = []  # gauges without a sample: nothing to read (unseen, NaN)
        self.absent_any: list[str] = []  # metrics without a sample or a matrix (likewise)
        self.gbounds: dict[int, tuple[int, int]] = {}
        self.cmats: dict[int, tuple[int, int, int]] = {}  # counter metric -> (group, c0, c1)
        self.rest: list[tuple[EntityKind, int]] = []
        self.slos: list[tuple[EntityKind, int]] = []  # SLOs whose columns are looked up every cycle
        # SLOs read off dense matrices: their request and good columns (metric, series, entity, column
        # in the group; None: nothing to score), as long as the plan holds
        self.fixed_slos: list[tuple[EntityKind, int, _SloColumns | None]] = []
        self.peers: list[tuple[EntityKind, int, np.ndarray, np.ndarray]] = []  # (kind, signal, source series, has one)
        g_src: list[np.ndarray] = []
        g_dest: list[np.ndarray] = []
        g_age: list[np.ndarray] = []
        c_sets: dict[tuple[int, float, float], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        shaped: dict[int, list[tuple[EntityKind, int, int, int, bool]]] = {1: [], 2: [], 3: []}
        params: dict[int, list[tuple[float, float]]] = {1: [], 2: [], 3: []}  # per shaped entry: see shapes
        self.order: list[tuple[EntityKind, int]] = []  # flat result index -> (kind, signal)
        seen = np.zeros(self.size, bool)
        assert ctx.index is not None
        for kind, off, _, n in self.kinds:
            table = tables[kind]
            plan = _shape_plan(pol, specs[kind])
            for j, spec in enumerate(specs[kind]):
                self.order.append((kind, j))
                code = int(plan.code[j])
                if spec.shape == "slo":
                    fixed = self._fixed_slo(ctx, spec, kind, table)
                    if isinstance(fixed, bool):
                        self.slos.append((kind, j))
                    else:
                        self.fixed_slos.append((kind, j, fixed))
                    continue
                if spec.shape == "xid" or code == 0:
                    mid = ctx.metric_ix.get(spec.metric)
                    self.mids[spec.metric] = mid
                    if mid is None or (mid not in ctx.bounds and mid not in ctx.index.counters):
                        self.absent_any.append(spec.metric)  # no sample, no matrix: unseen, NaN
                    else:
                        self.rest.append((kind, j))
                    continue
                mid = ctx.metric_ix.get(spec.metric)
                self.mids[spec.metric] = mid
                if _is_counter(spec):
                    cols = ctx.columns(spec.metric, spec.match, kind, table)
                    if cols is None and (mid is None or mid not in ctx.bounds):
                        self.absent_any.append(spec.metric)  # no sample, no matrix: unseen, NaN
                        continue
                    # one column per entity: every column of the metric's (cols.single), or those with
                    # samples when some have none (a vanished exporter's, while remembered)
                    if (cols is None or not cols.series.size or code == 4 or not (
                            cols.single or (not isinstance(cols.cols, slice)
                                            and int(np.bincount(cols.ent).max()) <= 1))):
                        self.rest.append((kind, j))
                        continue
                    assert mid is not None
                    self.cmats[mid] = (cols.mat.group, cols.mat.c0, cols.mat.c1)
                    dest = off + j * n + cols.ent
                    src, dst = c_sets.setdefault((cols.mat.group, float(plan.window[j]), float(plan.max_age[j])),
                                                 ([], []))
                    src.append(_cols_ix(cols))
                    dst.append(dest)
                else:
                    if mid is None or mid not in ctx.bounds:
                        self.absent.append(spec.metric)
                        continue
                    rows = ctx.gauge_rows(spec.metric, spec.match, kind, table)
                    if rows is None or not rows.single or not rows.ent.size:
                        self.rest.append((kind, j))
                        continue
                    self.gbounds[mid] = (rows.a, rows.b)
                    dest = off + j * n + rows.ent
                    g_src.append(rows.a + (np.arange(rows.b - rows.a) if rows.sel is None else rows.sel))
                    g_dest.append(dest)
                    g_age.append(np.full(rows.ent.size, plan.max_age[j]))
                    if code == 4:
                        src_series = np.full(n, -1, np.int64)
                        src_series[rows.ent] = rows.ser
                        self.peers.append((kind, j, src_series, src_series >= 0))
                seen[dest] = True
                if code in shaped:
                    shaped[code].append((kind, j, off, n, bool(plan.counter[j])))
                    # ramp: warn, crit - warn; gate / flag: the threshold (NaN: none), the flag's score
                    params[code].append((plan.warn[j], plan.span[j]) if code == 1 else
                                        (plan.above[j], plan.flag_score[j]))
        self.seen = seen
        z = np.zeros(0, np.int64)
        self.g_src = np.concatenate(g_src) if g_src else z
        self.g_dest = np.concatenate(g_dest) if g_dest else z
        self.g_age = np.concatenate(g_age) if g_age else np.zeros(0)
        # the gauges' whole blocks, to check that their rows still hold the same series
        self.g_blocks = (np.concatenate([np.arange(a, b) for a, b in self.gbounds.values()])
                         if self.gbounds else z)
        self.g_end = max((b for _, b in self.gbounds.values()), default=0)
        self.g_block_series = ctx.row_arrays(self.g_end)[0][self.g_blocks].copy()
        self.c_sets = [(g, w, a, np.concatenate(src), np.concatenate(dst)) for (g, w, a), (src, dst) in c_sets.items()]
        self.c_series = {g: ctx.index.groups[g].series.copy() for g in sorted({g for g, _, _ in self.cmats.values()})}
        self.c_cols = {g: np.concatenate([np.arange(c0, c1) for gg, c0, c1 in self.cmats.values() if gg == g])
                       for g in self.c_series}
        # which of those columns have samples (the columns read are those: they must stay so)
        self.c_keep = {g: ctx.index.groups[g].last[c] >= 0 for g, c in self.c_cols.items()}
        self.c_keep_all = {g: bool(k.all()) for g, k in self.c_keep.items()}
        index_of = {kj: i for i, kj in enumerate(self.order)}
        self.shapes: dict[int, tuple[np.ndarray, ...]] = {}
        self.shaped = shaped
        for code, rows_ in shaped.items():
            if not rows_:
                continue
            idx = np.concatenate([_rows_of(off, n, [j]) for _, j, off, n, _ in rows_])
            per = [n for *_, n, _ in rows_]
            rate = np.repeat([c for *_, c in rows_], per)
            res = np.repeat([index_of[(k, j)] for k, j, *_ in rows_], per)
            ent = np.concatenate([np.arange(n) for *_, n, _ in rows_])
            p1 = np.repeat([a for a, _ in params[code]], per)
            p2 = np.repeat([b for _, b in params[code]], per)
            self.shapes[code] = (idx, np.flatnonzero(rate), res, ent, p1, p2)

    def _fixed_slo(self, ctx: _Ctx, spec: SignalSpec, kind: EntityKind,
                   table: _KindTable) -> _SloColumns | None | bool:
        """An SLO's request and good columns when both counters are dense matrices read whole (every
        series has samples: what they are follows from the layout ``holds`` checks); False otherwise."""
        assert spec.requests_metric is not None and ctx.index is not None
        good_name = spec.metric + "_bucket" if spec.threshold_s is not None else spec.metric
        req = ctx.columns(spec.requests_metric, None, kind, table)
        good_c = ctx.columns(good_name, spec.match, kind, table)
        if req is None or good_c is None:
            return False
        groups = ctx.index.groups
        for c in (req, good_c):
            if not (isinstance(c.cols, slice) and groups[c.mat.group].dense and groups[c.mat.group].t.shape[0]):
                return False
        for name, c in ((spec.requests_metric, req), (good_name, good_c)):
            self.mids[name] = ctx.metric_ix.get(name)
            mid = self.mids[name]
            assert mid is not None
            self.cmats[mid] = (c.mat.group, c.mat.c0, c.mat.c1)
        inputs = _slo_inputs(ctx, spec, kind, req, good_c)
        if inputs is None:
            return None
        # what the columns are, without the view they came from (the plan outlives it)
        return tuple((name, c.series, c.ent, _cols_ix(c))  # type: ignore[return-value]
                     for name, c in ((spec.requests_metric, inputs[0]), (good_name, inputs[1])))

    def holds(self, ctx: _Ctx) -> bool:
        """Whether this view is laid out as the one the plan was built on, where the plan reads it."""
        ix = ctx.index
        if ix is None or ctx.policy is not self.policy:
            return False
        metric_ix, bounds = ctx.metric_ix, ctx.bounds
        for name, mid in self.mids.items():
            if metric_ix.get(name) != mid:
                return False
        for name in self.absent:
            mid = metric_ix.get(name)
            if mid is not None and mid in bounds:
                return False
        for name in self.absent_any:
            mid = metric_ix.get(name)
            if mid is not None and (mid in bounds or mid in ix.counters):
                return False
        for mid, ab in self.gbounds.items():
            if bounds.get(mid) != ab:
                return False
        for mid, (g, c0, c1) in self.cmats.items():
            mat = ix.counters.get(mid)
            if mat is None or mat.group != g or mat.c0 != c0 or mat.c1 != c1:
                return False
        for g, ser in self.c_series.items():
            grp = ix.groups[g] if g < len(ix.groups) else None
            if grp is None or not np.array_equal(grp.series, ser):
                return False
            # the same columns have samples (every one in a dense matrix)
            if not (grp.dense and grp.t.shape[0] and self.c_keep_all[g]) and not np.array_equal(
                    grp.last[self.c_cols[g]] >= 0, self.c_keep[g]):
                return False
        return bool(np.array_equal(ctx.row_arrays(self.g_end)[0][self.g_blocks], self.g_block_series))

    def run(self, ctx: _Ctx, specs: dict[str, list[SignalSpec]],
            ) -> tuple[dict[str, list[_SignalResult]], dict[str, _Mats]]:
        L = self.size
        sub_f, raw_f, rate_f, z_f, age_f = np.full((5, L), np.nan)  # one allocation
        seen_f = self.seen.copy()
        mats: dict[str, _Mats] = {}
        results: dict[str, list[_SignalResult]] = {}
        flat: list[_SignalResult] = []
        for kind, off, m, n in self.kinds:
            mt = mats[kind] = _Mats.__new__(_Mats)
            mt.sub, mt.raw, mt.rate, mt.z, mt.age, mt.seen = (
                a[off:off + m * n].reshape(m, n) for a in (sub_f, raw_f, rate_f, z_f, age_f, seen_f))
            results[kind] = [mt.result(j) for j in range(m)]
            flat.extend(results[kind])
        now = ctx.now
        if self.g_src.size:
            _, values, ts = ctx.row_arrays(self.g_end)
            age_s = now - ts[self.g_src]
            fresh = age_s <= self.g_age
            age_f[self.g_dest] = np.maximum(age_s, 0.0)
            raw_f[self.g_dest[fresh]] = values[self.g_src[fresh]]
        for g, window, max_age, src, dest in self.c_sets:
            rate, last_v, age = ctx.rates(ctx.index.groups[g], window, max_age)  # type: ignore[union-attr]
            rate_f[dest] = rate[src]
            raw_f[dest] = last_v[src]
            age_f[dest] = age[src]
        with np.errstate(invalid="ignore", divide="ignore"):
            for code, (idx, rate_pos, res_ix, ent, p1, p2) in self.shapes.items():
                x = raw_f[idx]
                if rate_pos.size:
                    x[rate_pos] = rate_f[idx[rate_pos]]
                if code == 1:
                    sub_f[idx] = np.clip(1.0 - (x - p1) / p2, 0.0, 1.0)
                    continue
                bad = x > p1
                if code == 2:
                    at = 0
                    for kind, j, _, n, _ in self.shaped[2]:
                        spec = specs[kind][j]
                        for val in spec.values or ():  # np.isin's answer for a few floats: equality
                            bad[at:at + n] |= x[at:at + n] == float(val)
                        at += n
                    sub = np.where(bad, 0.0, 1.0)
                    sub[np.isnan(x)] = np.nan
                    sub_f[idx] = sub
                    for h in np.flatnonzero(sub == 0).tolist():
                        kind, j = self.order[int(res_ix[h])]
                        flat[int(res_ix[h])].notes[int(ent[h])] = f"gate fired: {specs[kind][j].metric}={x[h]:g}"
                else:
                    sub_f[idx] = np.where(bad, p2, np.where(np.isnan(x), np.nan, 1.0))
                    for h in np.flatnonzero(bad).tolist():
                        kind, j = self.order[int(res_ix[h])]
                        if specs[kind][j].flag:
                            flat[int(res_ix[h])].flags.append((int(ent[h]), specs[kind][j].flag))  # type: ignore[arg-type]
                for kind, j, *_, counter in self.shaped[code]:
                    spec = specs[kind][j]
                    if spec.value_flags:
                        res = results[kind][j]
                        res.flags.extend(_value_flags(res.rate if counter else res.raw, spec.value_flags))
        for kind, j, src_series, has_src in self.peers:
            res = results[kind][j]
            res.sub[:] = _shape_peer(ctx, specs[kind][j], kind, res.raw, src_series, has_src, res)
        for kind, j in self.rest:
            _evaluate(ctx, specs[kind][j], kind, self.tables[kind], results[kind][j])
        slo_jobs: dict[str, list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]]] = {}
        for kind, j, fixed in self.fixed_slos:
            if fixed is not None:
                fixed_req, fixed_good = (_Columns(ctx, ctx.matrix(name), ser, ent, cols)  # type: ignore[arg-type]
                                         for name, ser, ent, cols in fixed)
                slo_jobs.setdefault(kind, []).append((specs[kind][j], fixed_req, fixed_good, results[kind][j]))
        for kind, j in self.slos:
            spec, table, res = specs[kind][j], self.tables[kind], results[kind][j]
            assert spec.requests_metric is not None
            req = ctx.columns(spec.requests_metric, None, kind, table)
            good_c = ctx.columns(spec.metric + "_bucket" if spec.threshold_s is not None else spec.metric,
                                 spec.match, kind, table)
            if req is None or good_c is None:
                _evaluate(ctx, spec, kind, table, res)  # rows
                continue
            inputs = _slo_inputs(ctx, spec, kind, req, good_c)
            if inputs is not None:
                slo_jobs.setdefault(kind, []).append((spec, inputs[0], inputs[1], res))
        for jobs in slo_jobs.values():
            _slo_batch(ctx, jobs)
        return results, mats


def _evaluate_gauge_rows(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, rows: _GaugeRows,
                         res: _SignalResult) -> _SignalResult:
    """``_evaluate`` of a gauge whose view rows hold one sample per series (a history's view): the same
    numbers, with the row -> entity map kept from the last cycle."""
    n = res.sub.size
    if rows.ent.size == 0:
        return res
    now = ctx.now
    res.seen[rows.ent] = True
    max_age = spec.max_age_s or ctx.policy.freshness.max_age_s
    _, values, times = ctx.row_arrays(rows.b)
    vals, ts = values[rows.a:rows.b], times[rows.a:rows.b]
    if rows.sel is not None:
        vals, ts = vals[rows.sel], ts[rows.sel]
    age_s = now - ts
    fresh = age_s <= max_age
    if rows.single:
        res.age[rows.ent] = np.maximum(age_s, 0.0)
        res.raw[rows.ent[fresh]] = vals[fresh]
    else:
        res.age[:] = _reduce_worst(rows.ent, np.maximum(age_s, 0.0), n, False)
        res.raw[:] = _reduce_worst(rows.ent[fresh], vals[fresh], n, spec.worse_if == "higher")
    res.sub[:] = _shape(ctx, spec, kind, res.raw, rows.ser, rows.ent, np.arange(rows.ent.size), res, n)
    return res


def _fresh_rate(inc: np.ndarray, t0: np.ndarray, t1: np.ndarray, now: float, max_age: float) -> np.ndarray:
    """Per series: the increase over the time between its first and last sample in the window, NaN
    without two samples at different times or when the last is older than ``max_age``."""
    dt = t1 - t0
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(dt > 0, inc / np.where(dt > 0, dt, 1.0), np.nan)
        fresh = (now - t1) <= max_age
    return np.where(fresh, rate, np.nan)


def _counter_rates(res: _SignalResult, e: np.ndarray, inc: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                   last_v: np.ndarray, last_t: np.ndarray, now: float, max_age: float) -> None:
    """A counter's rate, raw (latest value) and age per entity from its per-series window (``e``: the
    entity of each series)."""
    n = res.rate.size
    rate = _fresh_rate(inc, t0, t1, now, max_age)
    good = ~np.isnan(rate)
    one_per_entity = e.size == 0 or np.bincount(e).max() <= 1
    if good.any():
        if one_per_entity:
            res.rate[e[good]] = rate[good]
        else:
            acc = np.zeros(n)
            cnt = np.zeros(n)
            np.add.at(acc, e[good], rate[good])
            np.add.at(cnt, e[good], 1)
            res.rate[:] = np.where(cnt > 0, acc, np.nan)
    # the latest sample of a series is its latest in the window whenever it has one in the window
    res.raw[:] = _reduce_worst(e, last_v, n, True)
    res.age[:] = _reduce_worst(e, now - last_t, n, False)


def _evaluate_counter_columns(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, cols: _Columns,
                              res: _SignalResult) -> _SignalResult:
    """``_evaluate`` of a counter read off the view's matrix: the same numbers without the rows."""
    if cols.series.size == 0:
        return res
    pol, now = ctx.policy, ctx.now
    res.seen[cols.ent] = True
    window = spec.rate_window_s or pol.freshness.rate_window_s
    max_age = spec.max_age_s or pol.freshness.max_age_s
    if cols.single:  # one series per entity: rates of the whole group at once, then placed
        rate, last_v, age = (a[cols.cols] for a in ctx.rates(cols.mat, window, max_age))
        res.rate[cols.ent] = rate
        res.raw[cols.ent] = last_v
        res.age[cols.ent] = age
    else:
        inc, t0, t1, last_v, last_t, _ = cols.window(now - window)
        _counter_rates(res, cols.ent, inc, t0, t1, last_v, last_t, now, max_age)
    res.sub[:] = _shape(ctx, spec, kind, res.rate, cols.series, cols.ent, None, res, res.sub.size)
    return res


def _value_flags(x: np.ndarray, value_flags: Mapping[int, str]) -> list[tuple[int, str]]:
    """(entity, flag) for every entity whose value (truncated to an int) names a flag, in entity order."""
    named = [v for v, f in value_flags.items() if f]
    if not named:
        return []
    # trunc(x) == v only for x in (v - 1, v + 1): usually no value is near any named one
    with np.errstate(invalid="ignore"):
        if not bool(((x > min(named) - 1) & (x < max(named) + 1)).any()):
            return []
        xi = np.where(np.isnan(x), np.nan, np.trunc(x))
    pairs: list[tuple[int, str]] = []
    for v, f in value_flags.items():
        if f:
            pairs.extend((e, f) for e in np.flatnonzero(xi == v).tolist())
    pairs.sort(key=lambda p: p[0])
    return pairs


def _shape(
    ctx: _Ctx, spec: SignalSpec, kind: EntityKind, x: np.ndarray, ser: np.ndarray, ent: np.ndarray,
    lp: np.ndarray | None, res: _SignalResult, n: int,
) -> np.ndarray:
    if spec.shape == "ramp":
        assert spec.warn is not None and spec.crit is not None
        return shapes.ramp(x, spec.warn, spec.crit)
    if spec.shape == "gate":
        sub = shapes.gate(x, spec.above, spec.values)
        if spec.value_flags:
            res.flags.extend(_value_flags(x, spec.value_flags))
        for e in np.flatnonzero(sub == 0).tolist():
            res.notes[e] = f"gate fired: {spec.metric}={x[e]:g}"
        return sub
    if spec.shape == "flag":
        sub = np.where(np.isnan(x), np.nan, 1.0)
        raised = np.zeros(n, bool)
        if spec.above is not None:
            with np.errstate(invalid="ignore"):
                raised = x > spec.above
        sub = np.where(raised, spec.flag_score, sub)
        for e in np.flatnonzero(raised).tolist():
            if spec.flag:
                res.flags.append((e, spec.flag))
        if spec.value_flags:
            res.flags.extend(_value_flags(x, spec.value_flags))
        return sub
    if spec.shape == "peer":
        # Peer group of an entity: the peer labels of the label set its (latest) sample came from.
        assert lp is not None
        src_series = np.full(n, -1, np.int64)
        src_series[ent[lp]] = ser[lp]
        return _shape_peer(ctx, spec, kind, x, src_series, src_series >= 0, res)
    raise AssertionError(f"unhandled shape {spec.shape}")


def _shape_peer(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, x: np.ndarray, src_series: np.ndarray,
                has_src: np.ndarray, res: _SignalResult) -> np.ndarray:
    """The peer shape: robust z of each entity's value (``x``) against its peer group, the group
    chosen by the labels of the series its value came from (``src_series``, -1: none); writes ``res.z``
    (NaN on entry) and the notes of groups too small to score."""
    pol = ctx.policy
    have = ~np.isnan(x) & has_src
    peers = _peer_groups(ctx, spec, kind, src_series, have)
    if peers is None:
        return np.full(x.size, np.nan)
    ents, groups, n_groups, layout, small = peers
    k_warn = spec.k_warn if spec.k_warn is not None else pol.peer.k_warn
    k_crit = spec.k_crit if spec.k_crit is not None else pol.peer.k_crit
    xv = x[ents]
    if layout is not None and bool(np.isfinite(xv).all()):
        z, _med, _mad, _ = shapes.peer_robust_z_laid_out(
            xv, layout, worse_if=spec.worse_if, min_rel_dev=spec.min_rel_dev, mad_floor_rel=spec.mad_floor_rel)
    else:
        z, _med, _mad, _ = shapes.peer_robust_z(
            xv, groups, n_groups, worse_if=spec.worse_if, min_rel_dev=spec.min_rel_dev,
            mad_floor_rel=spec.mad_floor_rel,
        )
    if small is not None:
        min_peers = spec.min_peers if spec.min_peers is not None else pol.peer.min_peers
        z = np.where(small, np.nan, z)
        for e in ents[small].tolist():
            res.notes[e] = f"too few peers (< {min_peers}) in its group: not scored"
            res.flags.append((e, f"too_few_peers:{spec.name}"))
    res.z[ents] = z
    return shapes.ramp(res.z, k_warn, k_crit)


_PeerGroups = tuple[np.ndarray, np.ndarray, int, "shapes.PeerLayout | None", "np.ndarray | None"]
# (spec, kind, entity count) -> (spec, group ids per label set, source series, usable, _peer_groups' result)
_PEERS: dict[tuple[int, str, int], tuple[SignalSpec, np.ndarray, np.ndarray, np.ndarray, _PeerGroups | None]] = {}


def _peer_groups(ctx: _Ctx, spec: SignalSpec, kind: str, src_series: np.ndarray,
                 have: np.ndarray) -> _PeerGroups | None:
    """The entities a peer signal scores (``have``), their peer group ids (0..n_groups-1, in order of
    first label-set group id), a ``PeerLayout`` when the groups suit it, and which entities are in
    groups below the minimum size (None: none); None when no entity is scored. Depends only on which
    series each entity's sample came from: kept while that is unchanged (``src_series`` is not changed
    by its owner once passed)."""
    label_groups = ctx.resolver.group_ids(tuple(spec.peer_by))
    key = (id(spec), kind, src_series.size)
    hit = _PEERS.get(key)
    if (hit is not None and hit[0] is spec and hit[1] is label_groups
            and (hit[2] is src_series or np.array_equal(hit[2], src_series)) and np.array_equal(hit[3], have)):
        return hit[4]
    ents = np.flatnonzero(have)
    out: _PeerGroups | None = None
    if ents.size:
        raw_groups = label_groups[src_series[ents]]
        present = _uniq(raw_groups)
        remap = np.full(int(raw_groups.max()) + 1, -1, np.int64)
        remap[present] = np.arange(present.size)
        groups = remap[raw_groups]
        n_groups = int(present.size)
        layout = shapes.PeerLayout(groups, n_groups) if shapes.PeerLayout.fits(groups, n_groups) else None
        min_peers = spec.min_peers if spec.min_peers is not None else ctx.policy.peer.min_peers
        small = np.bincount(groups, minlength=n_groups)[groups] < min_peers
        out = (ents, groups, n_groups, layout, small if small.any() else None)
    if len(_PEERS) > 64:
        _PEERS.clear()
    _PEERS[key] = (spec, label_groups, src_series, have.copy(), out)
    return out


@dataclass
class _XidLayout:
    """Rows of a last-Xid gauge in a history's view, one block in series order: where each series'
    rows end (``lp``, ``last``), where a new series starts (``change``, between rows), the entity of
    each series' latest row and whether those are one per entity. Valid while the rows are in time
    order within each series (checked per call)."""

    lp: np.ndarray
    last: np.ndarray
    change: np.ndarray
    ent_lp: np.ndarray
    single: bool
    steps: np.ndarray  # 0..size-1


# (spec, kind) -> (table, the block's series, rows kept (relative), series, entity, layout or None)
_XIDS: dict[tuple[int, str], tuple[_KindTable, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray,
                                   _XidLayout | None]] = {}


def _xid_rows(ctx: _Ctx, spec: SignalSpec, kind: str, table: _KindTable,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, _XidLayout | None] | None:
    """A last-Xid gauge's rows of a history's view that belong to an entity of ``kind`` (positions,
    series, entities) and their ``_XidLayout``; kept while the block holds the same series. None when
    the metric has no rows."""
    mid = ctx.metric_ix.get(spec.metric)
    if mid is None or mid not in ctx.bounds:
        return None
    a, b = ctx.bounds[mid]
    block = ctx.row_arrays(b)[0][a:b]
    key = (id(spec), kind)
    hit = _XIDS.get(key)
    if hit is None or hit[0] is not table or not np.array_equal(hit[1], block):
        ent = table.entities(ctx.resolver.arr[kind][block])
        keep = ent >= 0
        if spec.match:
            keep &= ctx.resolver.label_match(spec.match)[block]
        sel = None if bool(keep.all()) else np.flatnonzero(keep)
        ser, ent = (block.copy(), ent) if sel is None else (block[sel], ent[sel])
        layout = None
        if ser.size and bool((np.diff(ser) >= 0).all()):
            change = ser[1:] != ser[:-1]
            last = np.append(change, True)
            lp = np.flatnonzero(last)
            ent_lp = ent[lp]
            layout = _XidLayout(lp, last, change, ent_lp, int(np.bincount(ent_lp).max()) <= 1, np.arange(ser.size))
        hit = (table, block.copy(), sel, ser, ent, layout)
        if len(_XIDS) > 64:
            _XIDS.clear()
        _XIDS[key] = hit
    _, _, sel, ser, ent, layout = hit
    idx = np.arange(a, b) if sel is None else a + sel
    return idx, ser, ent, layout


def _evaluate_xid(
    ctx: _Ctx, spec: SignalSpec, idx: np.ndarray, ser: np.ndarray, ent: np.ndarray, res: _SignalResult,
    layout: _XidLayout | None = None,
) -> _SignalResult:
    """Xids from DCGM's last-Xid gauge (value = the Xid) or a per-xid counter (label ``xid``).
    ``layout``: how a history view's rows of the gauge lie (``_xid_rows``)."""
    pol, snap, now = ctx.policy, ctx.snap, ctx.now
    xp = pol.xid
    window = spec.xid_window_s or xp.window_s
    max_age = spec.max_age_s or pol.freshness.max_age_s
    n = res.sub.size
    _, values, times = ctx.row_arrays(int(idx.max()) + 1 if idx.size else 0)
    vals, ts = values[idx], times[idx]
    presorted = ctx.index is not None
    if layout is not None and not bool((layout.change | (np.diff(ts) >= 0)).all()):
        layout = None  # not in time order within a series: sort, as without a layout
    # Fresh evidence that the source is alive: sub-score 1 unless an Xid gates it.
    lp = layout.lp if layout is not None else _latest_per_series(ser, ts, presorted)
    ent_lp = layout.ent_lp if layout is not None else ent[lp]
    age_s = now - ts[lp]
    fresh_lp = age_s <= max_age
    if layout is not None and layout.single:
        res.age[ent_lp] = np.maximum(age_s, 0.0)
    else:
        res.age[:] = _reduce_worst(ent_lp, np.maximum(age_s, 0.0), n, False)
    fresh_e = np.zeros(n, bool)
    fresh_e[ent_lp[fresh_lp]] = True
    codes: list[tuple[int, int]] = []  # (entity, xid)
    if spec.kind == "gauge":
        # DCGM's last-Xid field keeps its value until the exporter restarts, so a value is an occurrence
        # only when it *started* within the Xid window: the start of the series' final run of equal
        # values (the history keeps that start). With no earlier evidence the first sample is the start.
        if layout is not None:  # rows already in (series, time) order
            s_o, v_o, t_o, e_o = ser, vals, ts, ent
            change, last, steps = layout.change, layout.last, layout.steps
        else:
            order = _in_order(ser, ts, presorted)
            s_o, v_o, t_o, e_o = ser[order], vals[order], ts[order], ent[order]
            change = s_o[1:] != s_o[:-1]
            last = np.append(change, True)
            steps = np.arange(s_o.size)
        new_run = np.ones(s_o.size, bool)
        new_run[1:] = change | (v_o[1:] != v_o[:-1])
        run_start_ts = t_o[np.maximum.accumulate(np.where(new_run, steps, 0))]
        w = last & (v_o > 0) & (run_start_ts > now - window) & (now - t_o <= max_age)
        if w.any():
            for e, v in set(zip(e_o[w].tolist(), v_o[w].astype(np.int64).tolist(), strict=True)):
                codes.append((e, v))
        if layout is not None and layout.single:
            res.raw[ent_lp[fresh_lp]] = vals[lp][fresh_lp]
        else:
            res.raw[:] = _reduce_worst(ent_lp[fresh_lp], vals[lp][fresh_lp], n, True)
    else:
        inw = ts > now - window
        s_ids, inc, _t0, _t1, _ = _increase_per_series(ser[inw], vals[inw], ts[inw])
        hit = np.flatnonzero(np.nan_to_num(inc) > 0)
        ent_of_series = {s: e for s, e in zip(ser.tolist(), ent.tolist(), strict=True)}
        for i in hit.tolist():
            s = int(s_ids[i])
            x = dict(snap.labelsets[s]).get("xid", "")
            try:
                codes.append((ent_of_series[s], int(float(x))))
            except ValueError:
                ctx.issues.append(InputIssue("<snapshot>", 0, f"{spec.metric}: xid label is not a number", x))
        res.raw[:] = np.where(fresh_e, 0.0, np.nan)
    sub = np.where(fresh_e, 1.0, np.nan)
    for e, code in sorted(codes):
        cls = classify_xid(code, xp.gate_buckets, xp.gate_xids, xp.app_xids, xp.reset_xids)
        res.flags.append((e, f"xid:{code}"))
        if cls == "gate":
            sub[e] = 0.0
            res.notes[e] = f"Xid {code} gates the GPU (needs reset or reboot)"
        elif cls == "reset":
            res.flags.append((e, "row_remap_pending"))
        elif cls == "unknown":
            res.flags.append((e, f"xid_unknown:{code}"))
            ctx.issues.append(InputIssue("<snapshot>", 0, f"unknown Xid {code}: not in NVIDIA's catalog; counted, not scored"))
        res.raw[e] = float(code) if np.isnan(res.raw[e]) or res.raw[e] == 0 else res.raw[e]
    res.sub[:] = sub
    return res


def _evaluate_slo(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, table: _KindTable, res: _SignalResult) -> _SignalResult:
    """Error ratio (``metric`` errors / ``requests_metric``) or latency (histogram ``metric``_bucket at
    ``threshold_s``) against the SLO, as multi-window burn rates."""
    pol, snap, now = ctx.policy, ctx.snap, ctx.now
    n = res.sub.size
    objective = spec.objective or pol.slo.objective
    max_age = spec.max_age_s or pol.freshness.max_age_s
    assert spec.requests_metric is not None
    good_name = spec.metric + "_bucket" if spec.threshold_s is not None else spec.metric
    req_c = ctx.columns(spec.requests_metric, None, kind, table)
    good_c = ctx.columns(good_name, spec.match, kind, table)
    if req_c is not None and good_c is not None:
        return _evaluate_slo_columns(ctx, spec, kind, req_c, good_c, res)
    req_idx = ctx.samples(spec.requests_metric)
    if spec.threshold_s is not None:
        bidx = ctx.samples(spec.metric + "_bucket", spec.match)
        at = bucket_at_threshold(ctx.resolver.label_floats("le")[snap.series_ids[bidx]], spec.threshold_s)
        if not at.any():
            return res
        good_idx = bidx[at]
    else:
        good_idx = ctx.samples(spec.metric, spec.match)
    if req_idx.size == 0:
        return res

    class _Windows:
        """Sorted once per metric; increase over any (start, now] by binary search. Values are made
        reset-corrected cumulative along each series first (like PromQL), so an increase is a
        difference of two entries."""

        def __init__(self, idx: np.ndarray) -> None:
            ser = snap.series_ids[idx]
            ent = table.entities(ctx.resolver.arr[kind][ser])
            keep = ent >= 0
            ser, ent, ts, v = ser[keep], ent[keep], snap.ts[idx][keep], snap.values[idx][keep]
            order = order_by_series_time(ser, ts)
            self.ser, self.ent, self.ts, v = ser[order], ent[order], ts[order], v[order]
            n_s = self.ser.size
            start = np.ones(n_s, bool)
            start[1:] = self.ser[1:] != self.ser[:-1]
            d = np.diff(v, prepend=v[0] if n_s else 0.0)
            d = np.where(d < 0, v, d)
            d[start] = 0.0
            self.cum = np.cumsum(d)
            self.starts = np.flatnonzero(start)
            self.ends = np.concatenate((self.starts[1:], [n_s])) - 1 if n_s else np.zeros(0, np.int64)
            self.t0 = float(self.ts.min()) if n_s else 0.0
            self.span = float(self.ts.max()) - self.t0 + 1.0 if n_s else 1.0
            self.key = self.ser.astype(np.float64) * self.span + (self.ts - self.t0)

        def per_entity(self, start: float) -> tuple[np.ndarray, np.ndarray]:
            """increase per entity over (start, now] and the age of the last sample."""
            inc_e = np.full(n, np.nan)
            age_e = np.full(n, np.nan)
            if self.ser.size == 0:
                return inc_e, age_e
            sids = self.ser[self.starts]
            q = sids.astype(np.float64) * self.span + (start - self.t0)
            first = np.maximum(np.searchsorted(self.key, q, side="right"), self.starts)
            last = self.ends
            ok = last > first
            inc = np.where(ok, self.cum[last] - self.cum[np.minimum(first, last)], np.nan)
            e = self.ent[self.starts]
            good = ok & ~np.isnan(inc)
            acc = np.zeros(n)
            cnt = np.zeros(n)
            np.add.at(acc, e[good], inc[good])
            np.add.at(cnt, e[good], 1)
            inc_e = np.where(cnt > 0, acc, np.nan)
            has = first <= last
            np.fmin.at(age_e, e[has], now - self.ts[last[has]])
            return inc_e, age_e

    # seen / freshness from the request counter
    ser_all = snap.series_ids[req_idx]
    ent_all = table.entities(ctx.resolver.arr[kind][ser_all])
    res.seen[ent_all[ent_all >= 0]] = True
    burns: list[tuple[np.ndarray, np.ndarray, float]] = []
    last_total = None
    req_w, good_w = _Windows(req_idx), _Windows(good_idx)
    for w in pol.slo.windows:
        pair = []
        for win in (w.long_s, w.short_s):
            total, age = req_w.per_entity(now - win)
            good, _ = good_w.per_entity(now - win)
            if spec.threshold_s is not None:
                bad = np.where(np.isnan(good), np.where(total > 0, np.nan, 0.0), total - good)
                bad = np.clip(bad, 0.0, None)
            else:
                bad = np.where(np.isnan(good), 0.0, good)  # no error samples in window: no errors
            pair.append(shapes.burn_rate(bad, total, objective))
            if last_total is None:
                res.age[:] = age
                last_total = total
        burns.append((pair[0], pair[1], w.factor))
    return _slo_result(res, burns, max_age)


def _slo_result(res: _SignalResult, burns: list[tuple[np.ndarray, np.ndarray, float]], max_age: float) -> _SignalResult:
    sub = shapes.slo_score(burns)
    fresh = res.age <= max_age
    res.sub[:] = np.where(fresh, sub, np.nan)
    # explanation: burn rate of the fastest pair's short window
    res.rate[:] = burns[0][1]
    res.raw[:] = burns[0][0]
    return res


# (spec, kind) -> (spec, le per label set, histogram series, present, entity columns' series, chosen)
_BUCKETS: dict[tuple[int, str], tuple[SignalSpec, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray | None]] = {}


def _slo_bucket(ctx: _Ctx, spec: SignalSpec, kind: str, mat: CounterMatrix, present: np.ndarray,
                good_c: _Columns) -> np.ndarray | None:
    """Which of ``good_c``'s columns are the bucket a latency SLO reads (``bucket_at_threshold`` among
    the histogram's ``present`` series); None when no bucket is low enough. Kept while its inputs are."""
    assert spec.threshold_s is not None
    le = ctx.resolver.label_floats("le")
    key = (id(spec), kind)
    hit = _BUCKETS.get(key)
    if (hit is not None and hit[0] is spec and hit[1] is le and np.array_equal(hit[2], mat.series)
            and np.array_equal(hit[3], present) and np.array_equal(hit[4], good_c.series)):
        return hit[5]
    le_all = le[mat.series[present]]
    at = bucket_at_threshold(le_all, spec.threshold_s)
    sel = np.flatnonzero(le[good_c.series] == le_all[at][0]) if at.any() else None
    if len(_BUCKETS) > 64:
        _BUCKETS.clear()
    _BUCKETS[key] = (spec, le, mat.series.copy(), present.copy(), good_c.series.copy(), sel)
    return sel


def _slo_inputs(ctx: _Ctx, spec: SignalSpec, kind: str, req: _Columns,
                good_c: _Columns) -> tuple[_Columns, _Columns] | None:
    """The request and good (bucket at the threshold, or error) columns an SLO reads off the view's
    matrices; None when it has nothing to score (no bucket low enough, no request series)."""
    if spec.threshold_s is not None:
        # the bucket is chosen among all of the histogram's series, as on rows, then read per entity
        mat = ctx.matrix(spec.metric + "_bucket")
        assert mat is not None
        present = mat.last >= 0
        if spec.match:
            present &= ctx.resolver.label_match(spec.match)[mat.series]
        sel = _slo_bucket(ctx, spec, kind, mat, present, good_c)
        if sel is None:
            return None
        good_c = good_c.only(sel)
    if req.series.size == 0:
        return None
    return req, good_c


def _cols_ix(c: _Columns) -> np.ndarray:
    return np.arange(c.cols.start, c.cols.stop) if isinstance(c.cols, slice) else c.cols


def _evaluate_slo_columns(ctx: _Ctx, spec: SignalSpec, kind: str, req: _Columns, good_c: _Columns,
                          res: _SignalResult) -> _SignalResult:
    """``_evaluate_slo`` read off the view's counter matrices, every window at once."""
    inputs = _slo_inputs(ctx, spec, kind, req, good_c)
    if inputs is not None:
        _slo_batch(ctx, [(spec, inputs[0], inputs[1], res)])
    return res


def _slo_batch(ctx: _Ctx, jobs: list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]]) -> None:
    """Several SLOs of one kind off the view's counter matrices at once: each SLO's request and good
    counts per entity over every window (one bincount for all of them, bins (SLO, counter, window,
    entity): each bin sums its series in the same order as one SLO alone would), then the burn rates
    and the multi-window score as arrays of SLOs x windows x entities, element by element the
    arithmetic of ``shapes.burn_rate`` / ``shapes.slo_score`` for one SLO."""
    by_group: dict[int, list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]]] = {}
    for job in jobs:
        if job[1].mat.group == job[2].mat.group:
            by_group.setdefault(job[1].mat.group, []).append(job)
        else:  # request and good counters kept apart: each its own batch, two groups
            by_group.setdefault(-1 - len(by_group), []).append(job)
    for group_jobs in by_group.values():
        if group_jobs[0][1].mat.group != group_jobs[0][2].mat.group:
            for job in group_jobs:
                _slo_batch_one_group(ctx, [job], split=True)
        else:
            _slo_batch_one_group(ctx, group_jobs, split=False)


def _slice_key(c: slice | np.ndarray) -> Hashable:
    return (c.start, c.stop) if isinstance(c, slice) else id(c)


# (entity count, windows, slots, columns) -> (arrays held, column index, bins, counts, age bins, one per bin)
_SLO_BINS: dict[Hashable, tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, np.ndarray, bool]] = {}


def _slo_counts(ctx: _Ctx, cols: list[_Columns], slots: list[int], n_slots: int, starts: tuple[float, ...],
                n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slot (each ``cols[i]`` is slot ``slots[i]``) x window x entity: the increase over each
    (start, now] (the entity's series added up; NaN without one with two samples in the window), and per
    slot x entity the age of its latest sample among series with one in the first window. All columns
    of one matrix group."""
    w = len(starts)
    size = n_slots * w * n
    inc_g, n_in_g, lt_g = ctx.windows(cols[0].mat, starts)
    # which columns, bins and counts: the same while the columns are (kept by their arrays' identity)
    refs: list[Any] = [x for c in cols for x in (c.ent, c.cols if not isinstance(c.cols, slice) else None)]
    key = ("slo", n, w, tuple(slots), tuple((id(c.ent), _slice_key(c.cols)) for c in cols))
    hit = _SLO_BINS.get(key)
    if hit is None or len(hit[0]) != len(refs) or not all(a is b for a, b in zip(hit[0], refs, strict=True)):
        ix = np.concatenate([_cols_ix(c) for c in cols])
        ent = np.concatenate([c.ent for c in cols])
        slot = np.repeat(np.asarray(slots, np.int64), [c.ent.size for c in cols])
        bins_all = (slot[None, :] * w + np.arange(w)[:, None]) * n + ent[None, :]
        age_bins = slot * n + ent
        unique = age_bins.size == 0 or int(np.bincount(age_bins).max()) <= 1
        hit = (refs, ix, bins_all, np.bincount(bins_all.reshape(-1), minlength=size).reshape(n_slots, w, n),
               age_bins, unique)
        if len(_SLO_BINS) > 64:
            _SLO_BINS.clear()
        _SLO_BINS[key] = hit
    _, ix, bins_all, cnt_all, age_bins, unique = hit
    inc, n_in, lt = inc_g[:, ix], n_in_g[:, ix], lt_g[ix]
    good = n_in >= 2
    if bool(good.all()):  # the usual case: every bin's counts as kept; sums in the same order
        acc = np.bincount(bins_all.reshape(-1), weights=inc.reshape(-1), minlength=size).reshape(n_slots, w, n)
        cnt = cnt_all
    else:
        bins = bins_all[good]
        acc = np.bincount(bins, weights=inc[good], minlength=size).reshape(n_slots, w, n)
        cnt = np.bincount(bins, minlength=size).reshape(n_slots, w, n)
    age = np.full(n_slots * n, np.nan)
    has = n_in[0] > 0
    if unique:  # one column per bin: its value (fmin with NaN is the other operand)
        age[age_bins[has]] = ctx.now - lt[has]
    else:
        np.fmin.at(age, age_bins[has], ctx.now - lt[has])
    return np.where(cnt > 0, acc, np.nan), age.reshape(n_slots, n)


def _slo_batch_one_group(ctx: _Ctx, jobs: list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]],
                         split: bool) -> None:
    pol, now = ctx.policy, ctx.now
    k = len(jobs)
    n = jobs[0][3].sub.size
    starts = tuple(now - win for w in pol.slo.windows for win in (w.long_s, w.short_s))
    for _, req, _, res in jobs:
        res.seen[req.ent] = True
    if split:  # request counters in one group, good counters in another
        counts, age = _slo_counts(ctx, [jobs[0][1]], [0], 2, starts, n)
        good_counts, _ = _slo_counts(ctx, [jobs[0][2]], [1], 2, starts, n)
        counts[1] = good_counts[1]
    else:
        cols = [c for _, req, good_c, _ in jobs for c in (req, good_c)]
        counts, age = _slo_counts(ctx, cols, list(range(2 * k)), 2 * k, starts, n)
    total, good = counts[0::2], counts[1::2]  # SLO x window x entity
    latency = np.array([spec.threshold_s is not None for spec, *_ in jobs], bool)[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        bad_lat = np.where(np.isnan(good), np.where(total > 0, np.nan, 0.0), total - good)
        bad_lat = np.clip(bad_lat, 0.0, None)
        bad = np.where(latency, bad_lat, np.where(np.isnan(good), 0.0, good))  # no error samples: no errors
        # shapes.burn_rate, per SLO objective
        frac = np.where(total > 0, bad / np.where(total > 0, total, 1.0), 0.0)
        frac = np.clip(frac, 0.0, 1.0)
        budget = np.array([1.0 - (spec.objective or pol.slo.objective) for spec, *_ in jobs])
        burn = frac / budget[:, None, None]
        burn[np.isnan(bad) | np.isnan(total)] = np.nan
        # shapes.slo_score: the worst window pair
        sub: np.ndarray | None = None
        for i, w in enumerate(pol.slo.windows):
            long_b, short_b = burn[:, 2 * i], burn[:, 2 * i + 1]
            eff = np.fmin(long_b, short_b)
            eff = np.where(np.isnan(long_b) | np.isnan(short_b), np.nan, eff)
            s = shapes.ramp(eff, 1.0, w.factor)
            sub = s if sub is None else np.fmin(sub, s)
    assert sub is not None
    max_age = np.array([spec.max_age_s or pol.freshness.max_age_s for spec, *_ in jobs])
    req_age = age[0::2]
    sub = np.where(req_age <= max_age[:, None], sub, np.nan)
    for i, (_, _, _, res) in enumerate(jobs):
        res.age[:] = req_age[i]
        res.sub[:] = sub[i]
        # explanation: burn rate of the fastest pair's short window
        res.rate[:] = burn[i, 1]
        res.raw[:] = burn[i, 0]


@dataclass
class KindScores:
    """Columnar scores of every entity of one kind. raw/rate/z/age matrices (for explanation only) are
    stacked on first use."""

    kind: EntityKind
    names: list[str]
    signals: list[SignalSpec]
    sub: np.ndarray  # entities x signals
    results: list[_SignalResult]
    expected: np.ndarray  # entities x signals (bool)
    categories: list[str]
    cat: np.ndarray  # entities x categories
    value: np.ndarray  # NaN = unknown
    confidence: np.ndarray
    worst: np.ndarray  # category index or -1
    reason: list[str]
    flags: dict[int, list[str]]
    notes: dict[tuple[int, int], str]
    worst_member: Mapping[int, str] = field(default_factory=dict)
    member_of: np.ndarray | None = None  # for gpu: node index
    gated: np.ndarray | None = None  # bool per entity: a hard gate decided it
    n_expected: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per entity: expected signals
    n_fresh: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per entity: fresh ones
    _stacked: dict[str, np.ndarray] = field(default_factory=dict)
    # what its scores were made from (the kind's derived scores, this consumer's entry of them): equal
    # tokens, equal scores (the node roll-up keeps its results by them)
    _made_from: tuple[Any, Any] | None = None

    def _stack(self, attr: str) -> np.ndarray:
        m = self._stacked.get(attr)
        if m is None:
            n = len(self.names)
            m = self._stacked[attr] = (
                np.column_stack([getattr(r, attr) for r in self.results]) if self.results else np.zeros((n, 0))
            )
        return m

    @property
    def raw(self) -> np.ndarray:
        return self._stack("raw")

    @property
    def rate(self) -> np.ndarray:
        return self._stack("rate")

    @property
    def z(self) -> np.ndarray:
        return self._stack("z")

    @property
    def age(self) -> np.ndarray:
        return self._stack("age")


def _lowest_category(cat_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per entity (columns of ``cat_t``, categories x entities): the lowest known category score (inf
    when none is known) and its index, the first of equal minima (-1 when none is known)."""
    c, n = cat_t.shape
    if c == 0:
        return np.full(n, np.inf), np.full(n, -1, np.int64)
    filled = np.where(np.isnan(cat_t), np.inf, cat_t)
    worst = filled.argmin(axis=0)  # the first of equal minima, as a scan that keeps strict improvements
    low = filled.min(axis=0)
    return low, np.where(low < np.inf, worst, -1)


def _cross_value(cat_t: np.ndarray, low: np.ndarray, any_: np.ndarray, how: str) -> np.ndarray:
    """The cross-category value per entity (NaN when no category is known): min, geometric mean
    (0 when any category is 0) or mean (baselines only: averages away a fatal category)."""
    n = cat_t.shape[1]
    if cat_t.shape[0] == 0:
        return np.full(n, np.nan)
    if how == "min":
        return np.where(any_, low, np.nan)
    if how == "gmean":
        have = ~np.isnan(cat_t)
        logs = np.where(have, np.log(np.maximum(np.where(have, cat_t, 1.0), 1e-300)), 0.0)
        k_have = have.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            val = np.where(any_, np.exp(logs.sum(axis=0) / np.maximum(k_have, 1)), np.nan)
        return np.where(any_ & (low == 0), 0.0, val)
    with np.errstate(invalid="ignore"):
        return np.where(any_, np.nanmean(cat_t, axis=0), np.nan) if n else np.zeros(0)


@dataclass
class _Base:
    """One kind's aggregation up to the cross-category step: the same for every consumer, computed once
    per evaluation and shared read-only (what a consumer may change is copied out of it)."""

    sub_t: np.ndarray  # signals x entities
    expected_t: np.ndarray
    n_exp: np.ndarray
    n_fresh: np.ndarray
    confidence: np.ndarray  # a gated entity's is 1 (a gate is certain evidence)
    cat_t: np.ndarray  # categories x entities
    cat_ix: np.ndarray
    gated: np.ndarray
    first_gate: np.ndarray
    flags: dict[int, list[str]]
    notes: dict[tuple[int, int], str]
    low: np.ndarray  # lowest known category score (inf: none)
    worst: np.ndarray  # its index (-1: none); a gated entity's is its first gate's category
    any_gated: bool
    n_exp_f: np.ndarray = field(default_factory=lambda: np.zeros(0))  # n_exp, n_fresh as floats (read-only)
    n_fresh_f: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # per cross-category function: (reasons, worst category, value)
    by_how: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = field(default_factory=dict)


def _aggregate(
    kind: EntityKind, names: list[str], specs: list[SignalSpec], results: list[_SignalResult], how: str,
    categories: list[str], critical_zeroes: bool = True, cache: dict[str, _Base] | None = None,
    mats: _Mats | None = None,
) -> KindScores:
    """Scores of one kind for one cross-category function ``how``. Everything before the cross-category
    step is the same for every consumer: kept in ``cache`` (per evaluation) and shared, read-only; what
    a caller may change in place (per-entity vectors, flags, category list) is its own copy."""
    base = cache.get(kind) if cache is not None else None
    if base is None:
        base = _aggregate_base(names, specs, results, categories, critical_zeroes, mats)
        if cache is not None:
            cache[kind] = base
    m = len(specs)
    hit = base.by_how.get(how)
    if hit is None:
        value = _cross_value(base.cat_t, base.low, base.worst >= 0, how)
        if base.any_gated:
            value = np.where(base.gated, 0.0, value)
        unknown = np.isnan(value)
        gate_reasons, cat_reasons = _spec_plan(specs, categories).reasons(how)
        reason_arr = np.where(
            base.gated, gate_reasons[base.first_gate] if m else "",
            np.where(unknown, REASON_NO_FRESH_DATA, cat_reasons[np.maximum(base.worst, 0)] if len(categories) else ""),
        )
        hit = base.by_how[how] = (reason_arr.tolist(), np.where(unknown, -1, base.worst), value)
    reason, worst, value = hit
    ks = KindScores(
        kind, names, specs, base.sub_t.T, list(results), base.expected_t.T, list(categories), base.cat_t.T,
        value.copy(), base.confidence.copy(), worst.copy(), list(reason),
        {e: list(f) for e, f in base.flags.items()}, dict(base.notes), gated=base.gated,
        n_expected=base.n_exp_f, n_fresh=base.n_fresh_f,
    )
    if mats is not None and m:  # the results are rows of these: nothing to stack
        ks._stacked.update(raw=mats.raw.T, rate=mats.rate.T, z=mats.z.T, age=mats.age.T)
    ks._made_from = (base.by_how, hit)
    return ks


@dataclass
class _SpecPlan:
    """What aggregation needs from a kind's signal list alone (the same every cycle)."""

    fam_rows: list[np.ndarray]  # per family: its signals
    fam_ix: np.ndarray
    exp_flag: np.ndarray
    cat_ix: np.ndarray
    direct: list[tuple[int, int]]  # (category, signal) where the category is that one signal
    multi: list[tuple[int, np.ndarray, np.ndarray]]  # (category, its signals, their weights)
    gate_rows: np.ndarray
    gate_reasons: np.ndarray
    categories: list[str]
    weights: np.ndarray = field(default_factory=lambda: np.zeros(0))
    direct_cats: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    direct_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _cat_reasons: dict[str, np.ndarray] = field(default_factory=dict)
    # (seen, fresh, expected, n expected, n fresh, confidence, per multi category (weight > 0, weight
    # sum or 1)): the last masks' consequences (see _aggregate_base)
    fixed: tuple[Any, ...] | None = None
    # (that ``fixed``, critical zeroes, sub-scores, what _derive made of them): the last cycle's
    memo: tuple[Any, ...] | None = None

    def reasons(self, how: str) -> tuple[np.ndarray, np.ndarray]:
        """Reason strings (object arrays): per signal when it gates, per category when it is the worst."""
        cat = self._cat_reasons.get(how)
        if cat is None:
            prefix = "min" if how == "min" else how
            cat = self._cat_reasons[how] = np.array(
                [f"{prefix}:{c}" for c in self.categories] or [REASON_NO_FRESH_DATA], dtype=object)
        return self.gate_reasons, cat


_SPEC_PLANS: dict[tuple[tuple[int, ...], tuple[str, ...]], tuple[list[SignalSpec], _SpecPlan]] = {}


# (specs list, categories list) identities -> their plan: the lists of ``_policy_kinds``, kept per policy
_SPEC_PLAN_OF_LISTS: dict[tuple[int, int], tuple[list[SignalSpec], list[str], _SpecPlan]] = {}


def _spec_plan(specs: list[SignalSpec], categories: list[str]) -> _SpecPlan:
    hit_lists = _SPEC_PLAN_OF_LISTS.get((id(specs), id(categories)))
    if hit_lists is not None and hit_lists[0] is specs and hit_lists[1] is categories:
        return hit_lists[2]
    plan = _spec_plan_of(specs, categories)
    if len(_SPEC_PLAN_OF_LISTS) > 64:
        _SPEC_PLAN_OF_LISTS.clear()
    _SPEC_PLAN_OF_LISTS[(id(specs), id(categories))] = (specs, categories, plan)
    return plan


def _spec_plan_of(specs: list[SignalSpec], categories: list[str]) -> _SpecPlan:
    key = (tuple(id(s) for s in specs), tuple(categories))
    hit = _SPEC_PLANS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], specs, strict=True)):
        return hit[1]
    fams = sorted({s.family_name for s in specs})
    fam_ix = np.array([fams.index(s.family_name) for s in specs], np.int64)
    cat_ix = np.array([categories.index(s.category) for s in specs], np.int64)
    w = np.array([s.weight for s in specs], np.float64)
    direct: list[tuple[int, int]] = []
    multi: list[tuple[int, np.ndarray, np.ndarray]] = []
    for c in range(len(categories)):
        rows = np.flatnonzero(cat_ix == c)
        if rows.size == 0:
            continue
        if rows.size == 1 and w[rows[0]] > 0:
            direct.append((c, int(rows[0])))
        else:
            multi.append((c, rows, w[rows]))
    plan = _SpecPlan(
        [np.flatnonzero(fam_ix == fi) for fi in range(len(fams))], fam_ix,
        np.array([s.expected for s in specs], bool), cat_ix, direct, multi,
        np.flatnonzero(np.array([s.shape in ("gate", "xid") for s in specs], bool)),
        np.array([f"gate:{s.name}" for s in specs] or ["gate:"], dtype=object), list(categories), w,
        np.array([c for c, _ in direct], np.int64), np.array([j for _, j in direct], np.int64),
    )
    if len(_SPEC_PLANS) > 64:
        _SPEC_PLANS.clear()
    _SPEC_PLANS[key] = (list(specs), plan)
    return plan


def _aggregate_base(
    names: list[str], specs: list[SignalSpec], results: list[_SignalResult], categories: list[str],
    critical_zeroes: bool, mats: _Mats | None = None,
) -> _Base:
    # Signals x entities: each signal's column is one contiguous row, so stacking is a memcpy per signal
    # and a category is a block of rows; the entities x signals views handed out are transposes. With
    # ``mats`` the results already are those rows.
    n = len(names)
    m = len(specs)
    plan = _spec_plan(specs, categories)
    if mats is not None and m:
        sub_t, seen_t = mats.sub, mats.seen
    else:
        sub_t = np.stack([r.sub for r in results]) if m else np.zeros((0, n))
        seen_t = np.stack([r.seen for r in results]) if m else np.zeros((0, n), bool)
    fresh_t = ~np.isnan(sub_t)
    # What depends only on which signals are seen and fresh (expected signals, confidence, each
    # category's weight sum) is as last cycle's while those masks are: the steady state.
    fixed = plan.fixed
    if fixed is None or not (np.array_equal(fixed[0], seen_t) and np.array_equal(fixed[1], fresh_t)):
        fam_seen = np.zeros((len(plan.fam_rows), n), bool)
        for fi, rows in enumerate(plan.fam_rows):
            fam_seen[fi] = seen_t[rows[0]] if rows.size == 1 else seen_t[rows].any(axis=0)
        expected_t = (plan.exp_flag[:, None] & fam_seen[plan.fam_ix]) | fresh_t if m else np.zeros((0, n), bool)
        n_exp = expected_t.sum(axis=0)
        n_fresh = fresh_t.sum(axis=0)  # fresh implies expected
        with np.errstate(invalid="ignore", divide="ignore"):
            confidence = np.where(n_exp > 0, n_fresh / np.maximum(n_exp, 1), 0.0)
        weights = []
        for _, rows, wr in plan.multi:
            ws = (wr[:, None] * fresh_t[rows]).sum(axis=0)
            weights.append((ws > 0, np.where(ws > 0, ws, 1.0)))
        for a in (expected_t, n_exp, n_fresh, confidence):
            a.setflags(write=False)  # shared by every cycle while the masks hold
        fixed = plan.fixed = (seen_t.copy(), fresh_t.copy(), expected_t, n_exp, n_fresh, confidence, weights)
    _, _, expected_t, n_exp, n_fresh, confidence, weights = fixed

    flags: dict[int, list[str]] = {}
    notes: dict[tuple[int, int], str] = {}
    for j, r in enumerate(results):
        for e, f in r.flags:
            lst = flags.setdefault(e, [])
            if f not in lst:
                lst.append(f)
        for e, note in r.notes.items():
            notes[(e, j)] = note
    # Everything else follows from the sub-scores alone (with the masks above): as last cycle's when they
    # are equal, bit for bit (a healthy fleet's sub-scores mostly sit at exactly 1).
    memo = plan.memo
    if (memo is not None and memo[0] is fixed and memo[1] == critical_zeroes
            and np.array_equal(memo[2], sub_t, equal_nan=True)):
        derived = memo[3]
    else:
        derived = _derive(plan, sub_t, fresh_t, weights, confidence, n_exp, n_fresh, critical_zeroes)
        plan.memo = (fixed, critical_zeroes, sub_t.copy(), derived)
    cat_t, gated, first_gate, low, worst, any_gated, conf, n_exp_f, n_fresh_f, by_how = derived
    return _Base(sub_t, expected_t, n_exp, n_fresh, conf, cat_t, plan.cat_ix, gated, first_gate, flags, notes,
                 low, worst, any_gated, n_exp_f, n_fresh_f, by_how)


def _derive(plan: _SpecPlan, sub_t: np.ndarray, fresh_t: np.ndarray, weights: list[tuple[np.ndarray, np.ndarray]],
            confidence: np.ndarray, n_exp: np.ndarray, n_fresh: np.ndarray, critical_zeroes: bool,
            ) -> tuple[Any, ...]:
    """Category scores, gates, the lowest category and confidence from one kind's sub-scores: read-only
    arrays (shared by every consumer, and by later cycles with equal sub-scores)."""
    m, n = sub_t.shape
    cat_ix = plan.cat_ix
    # Weighted mean per category. A sum over axis 0 adds the rows one after the other, in signal order
    # (the same numbers as a loop of row additions). A one-signal category is that signal.
    cat_t = np.full((len(plan.categories), n), np.nan)
    if plan.direct:
        cat_t[plan.direct_cats] = sub_t[plan.direct_rows]
    if plan.multi:
        wsub = plan.weights[:, None] * np.where(fresh_t, sub_t, 0.0)  # NaN exactly where not fresh
        zero = sub_t == 0  # NaN is never == 0: only fresh zeroes
        with np.errstate(invalid="ignore", divide="ignore"):
            for (c, rows, _), (pos, safe) in zip(plan.multi, weights, strict=True):
                cat_t[c] = np.where(pos, wsub[rows].sum(axis=0) / safe, np.nan)
                if critical_zeroes:
                    cat_t[c][zero[rows].any(axis=0)] = 0.0
    gate_rows = plan.gate_rows
    if gate_rows.size:
        gate_hit = sub_t[gate_rows] == 0
        gated = gate_hit.any(axis=0)
        first_gate = gate_rows[gate_hit.argmax(axis=0)]
    else:
        gated = np.zeros(n, bool)
        first_gate = np.zeros(n, np.int64)
    gated = np.asarray(gated, bool)
    low, worst = _lowest_category(cat_t)
    any_gated = bool(gated.any())
    if any_gated:
        confidence = np.where(gated, 1.0, confidence)
        worst = np.where(gated, cat_ix[first_gate] if m else -1, worst)
    n_exp_f, n_fresh_f = n_exp.astype(np.float64), n_fresh.astype(np.float64)
    for a in (cat_t, gated, first_gate, low, worst, confidence, n_exp_f, n_fresh_f):
        a.setflags(write=False)  # handed to every consumer's scores as they are
    by_how: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = {}
    return cat_t, gated, first_gate, low, worst, any_gated, confidence, n_exp_f, n_fresh_f, by_how


class _WorstMembers(Mapping[int, str]):
    """node index -> name of the GPU that decided it; an index array, names looked up on access."""

    def __init__(self, n: int, names: list[str]) -> None:
        self.ix = np.full(n, -1, np.int64)
        self.names = names

    def __getitem__(self, i: int) -> str:
        g = int(self.ix[i]) if 0 <= i < self.ix.size else -1
        if g < 0:
            raise KeyError(i)
        return self.names[g]

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.ix >= 0).tolist())

    def __len__(self) -> int:
        return int(np.count_nonzero(self.ix >= 0))


_ROLL_UP: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []


def _roll_up_nodes(gpu: KindScores, node: KindScores, gpu_node: np.ndarray,
                   shared: dict[str, Any] | None = None) -> None:
    """A node is the weakest of its GPUs and its node-wide signals (min; never averaged away).

    Reductions over each node's GPUs are one stable sort by node and ``reduceat``, never a loop. What
    does not depend on the consumer (categories, confidence, flags) is computed once per evaluation and
    kept in ``shared``; each consumer gets copies of what it may change."""
    nn = len(node.names)
    if gpu_node.size == 0 or nn == 0:
        return
    hit = _ROLL_UP[0] if _ROLL_UP else None  # (one read: another thread may replace it)
    if hit is not None and hit[0] is gpu_node:  # the GPUs of each node: as last cycle while tables are
        _, go, starts, present = hit
    else:
        go = np.argsort(gpu_node, kind="stable")
        gn = gpu_node[go]
        starts = np.flatnonzero(np.concatenate(([True], gn[1:] != gn[:-1])))
        present = gn[starts]  # node index of each GPU group
        _ROLL_UP[:] = [(gpu_node, go, starts, present)]
    gated_gpu = gpu.gated if gpu.gated is not None else np.zeros(len(gpu.names), bool)
    g_from, n_from = gpu._made_from, node._made_from
    fixed = shared.get("fixed") if shared is not None else None
    last_a = _ROLL_UP_A[0] if _ROLL_UP_A else None
    if fixed is None and g_from is not None and n_from is not None and last_a is not None and (
            last_a[0] is g_from[0] and last_a[1] is n_from[0] and last_a[2] is gpu_node):
        # categories, confidence and gates from the same derived scores as last cycle's: as then
        cat_names, cmap, cat, conf, node_gated, gate_any = last_a[3]
        fixed = (cat_names, cmap, cat, conf, node_gated, gate_any, _node_flags(gpu, node, gpu_node))
        if shared is not None:
            shared["fixed"] = fixed
    if fixed is None:
        # per category: min over GPUs and the node's own
        cat_names = list(node.categories)
        gpu_cat_to_node = []
        n_own = len(cat_names)
        for cname in gpu.categories:
            if cname not in cat_names:
                cat_names.append(cname)
            gpu_cat_to_node.append(cat_names.index(cname))
        cmap = np.asarray(gpu_cat_to_node, np.int64)
        # a NaN column per GPU-only category
        cat = np.full((nn, len(cat_names)), np.nan)
        cat[:, :n_own] = node.cat
        if cmap.size:
            gmin = np.fmin.reduceat(gpu.cat[go], starts, axis=0)
            cat[np.ix_(present, cmap)] = np.fmin(cat[np.ix_(present, cmap)], gmin)
        # confidence: share of expected signals fresh over the node's GPUs and its own signals
        n_exp = node.n_expected.copy()
        n_fresh = node.n_fresh.copy()
        n_exp[present] += np.add.reduceat(gpu.n_expected[go], starts)
        n_fresh[present] += np.add.reduceat(gpu.n_fresh[go], starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            conf = np.where(n_exp > 0, n_fresh / np.maximum(n_exp, 1), 0.0)
        node_gated = node.gated if node.gated is not None else np.zeros(nn, bool)
        any_gpu_gate = np.zeros(nn, bool)
        any_gpu_gate[present] = np.logical_or.reduceat(gated_gpu[go], starts)
        gate_any = node_gated | any_gpu_gate
        part_a = (cat_names, cmap, cat, np.where(gate_any, 1.0, conf), node_gated.copy(), gate_any)
        for a in part_a[1:]:
            a.setflags(write=False)  # shared by consumers (and cycles, below)
        fixed = (*part_a, _node_flags(gpu, node, gpu_node))
        if shared is not None:
            shared["fixed"] = fixed
        if g_from is not None and n_from is not None:
            _ROLL_UP_A[:] = [(g_from[0], n_from[0], gpu_node, part_a)]
    cat_names, cmap, cat, conf, node_gated, gate_any, flags = fixed
    node.categories[:] = cat_names
    node.cat = cat
    node.confidence = conf.copy()
    node.flags = {e: list(f) for e, f in flags.items()}
    # the per-consumer part: as last cycle's when made from the same scores
    key_c = (g_from[1] if g_from is not None else None, n_from[1] if n_from is not None else None)
    last_c = _ROLL_UP_C.get(id(key_c[0]))
    if (key_c[0] is not None and key_c[1] is not None and last_c is not None and last_c[0] is key_c[0]
            and last_c[1] is key_c[1] and last_c[2] is cat and last_c[3] is gpu_node):
        value, reason, worst, members_ix = last_c[4]
        node.value, node.reason, node.worst = value.copy(), list(reason), worst.copy()
        if members_ix is not None:
            members = _WorstMembers(nn, gpu.names)
            members.ix[:] = members_ix
            node.worst_member = members
        return
    # value: min over known GPU values and the node's own value
    own = node.value.copy()
    v = node.value.copy()
    v[present] = np.fmin(v[present], np.fmin.reduceat(gpu.value[go], starts))
    # worst GPU per node: gated first, then lowest value
    gv = np.where(np.isnan(gpu.value), np.inf, gpu.value)
    order = np.lexsort((~gated_gpu, gv, gpu_node))
    first = np.ones(order.size, bool)
    first[1:] = gpu_node[order][1:] != gpu_node[order][:-1]
    best = order[first]  # worst gpu index for each node present
    ni = gpu_node[best]
    gval = gpu.value[best]
    take = ~node_gated[ni] & ~np.isnan(gval)
    with np.errstate(invalid="ignore"):
        take &= gated_gpu[best] | np.isnan(own[ni]) | (gval < own[ni])
    node.worst = np.array(node.worst)
    if take.any():
        tb, tn = best[take], ni[take]
        reasons = np.array(node.reason, dtype=object)
        reasons[tn] = np.array(gpu.reason, dtype=object)[tb]
        node.reason = reasons.tolist()
        gw = gpu.worst[tb]
        node.worst[tn] = np.where(gw >= 0, cmap[np.maximum(gw, 0)] if cmap.size else -1, -1)
        members = _WorstMembers(nn, gpu.names)
        members.ix[tn] = tb
        node.worst_member = members
    node.value = np.where(gate_any, 0.0, v)
    for i in np.flatnonzero(np.isnan(node.value)).tolist():
        node.reason[i] = REASON_NO_FRESH_DATA
        node.worst[i] = -1
    if key_c[0] is not None and key_c[1] is not None:
        wm = node.worst_member
        made = (node.value.copy(), list(node.reason), node.worst.copy(),
                wm.ix.copy() if isinstance(wm, _WorstMembers) else None)
        if len(_ROLL_UP_C) > 8:
            _ROLL_UP_C.clear()
        _ROLL_UP_C[id(key_c[0])] = (key_c[0], key_c[1], cat, gpu_node, made)


def _node_flags(gpu: KindScores, node: KindScores, gpu_node: np.ndarray) -> dict[int, list[str]]:
    """Node flags: its own and the union of its GPUs' flags."""
    flags = {e: list(f) for e, f in node.flags.items()}
    for g, fl in gpu.flags.items():
        i = int(gpu_node[g])
        lst = flags.setdefault(i, [])
        for f in fl:
            if f not in lst:
                lst.append(f)
    return flags


# (GPU derived scores, node derived scores, gpu -> node, the roll-up's consumer-independent arrays)
_ROLL_UP_A: list[tuple[Any, Any, np.ndarray, tuple[Any, ...]]] = []
# per GPU consumer entry: (that entry, the node's, categories array, gpu -> node, (value, reasons, worst,
# worst member per node))
_ROLL_UP_C: dict[int, tuple[Any, Any, np.ndarray, np.ndarray, tuple[Any, ...]]] = {}


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------
class _Kinds(Mapping[str, KindScores]):
    """``FleetHealth.kinds``: each kind's scores aggregated on first access, from the evaluation every
    consumer shares (a serving consumer's reader, the router, asks for replicas only). GPUs and nodes
    come together, the roll-up right after the GPUs' scores are made, so that it reads them as made,
    before any caller changes them in place. The same scores as made eagerly."""

    def __init__(self, ev: _Evaluation, how: str) -> None:
        self._ev, self._how = ev, how
        self._done: dict[str, KindScores] = {}

    def _make(self, kind: str) -> KindScores:
        ev = self._ev
        specs, table, results = ev.specs[kind], ev.tables[kind], ev.results[kind]
        kind_cats = ev.kind_cats[kind]
        return _aggregate(
            table.kind, table.names, specs if table.names else [], results, self._how, kind_cats,
            ev.policy.critical_zeroes_category, ev.bases, ev.mats.get(kind),
        )

    def __getitem__(self, kind: str) -> KindScores:
        ks = self._done.get(kind)
        if ks is not None:
            return ks
        if kind not in KINDS:
            raise KeyError(kind)
        if kind in ("gpu", "node"):
            gpu, node = self._make("gpu"), self._make("node")
            gpu.member_of = self._ev.gpu_node
            _roll_up_nodes(gpu, node, self._ev.gpu_node, self._ev.roll_up)
            self._done.update(gpu=gpu, node=node)
            return gpu if kind == "gpu" else node
        ks = self._done[kind] = self._make(kind)
        return ks

    def __iter__(self) -> Iterator[str]:
        return iter(KINDS)

    def __len__(self) -> int:
        return len(KINDS)


class _LazyTuples(Mapping[str, HealthTuple]):
    def __init__(self, fh: FleetHealth) -> None:
        self._fh = fh
        self._cache: dict[str, HealthTuple] = {}

    def __getitem__(self, key: str) -> HealthTuple:
        t = self._cache.get(key)
        if t is None:
            loc = self._fh._index.get(key)
            if loc is None:
                raise KeyError(key)
            t = self._cache[key] = self._fh._build(*loc)
        return t

    def __iter__(self) -> Iterator[str]:
        return iter(self._fh._index)

    def __len__(self) -> int:
        return len(self._fh._index)


class FleetHealth:
    """Health of every entity at ``now`` for one consumer. Columnar inside (``kinds``), tuples on demand.

    Entity ids: gpu ``node/gpuN``, node ``node``, replica, rank ``job/rankN``. Should two kinds share a
    name (a replica called like a node), the later kind's id is prefixed ``kind:``.
    """

    def __init__(
        self, now: float, consumer: str, policy_version: str, kinds: Mapping[str, KindScores],
        meta: _MetaIndex, issues: list[InputIssue],
    ) -> None:
        self.now = now
        self.consumer = consumer
        self.policy_version = policy_version
        self.kinds = kinds
        self.meta = meta
        self.issues = issues
        self._index_cache: dict[str, tuple[str, int]] | None = None
        self.tuples: Mapping[str, HealthTuple] = _LazyTuples(self)

    @property
    def _index(self) -> dict[str, tuple[str, int]]:
        if self._index_cache is None:
            index: dict[str, tuple[str, int]] = {}
            for kind in KINDS:
                ks = self.kinds.get(kind)
                if ks is None:
                    continue
                for i, name in enumerate(ks.names):
                    key = name if name not in index else f"{kind}:{name}"
                    index[key] = (kind, i)
            self._index_cache = index
        return self._index_cache

    def _build(self, kind: str, i: int) -> HealthTuple:
        ks = self.kinds[kind]
        v = ks.value[i]
        details = []
        for j, s in enumerate(ks.signals):
            if not (ks.expected[i, j] or not np.isnan(ks.age[i, j])):
                continue

            def f(a: np.ndarray, j: int = j) -> float | None:
                x = a[i, j]
                return None if np.isnan(x) else float(x)

            details.append(
                SignalDetail(
                    s.name, s.category, s.shape, f(ks.raw), f(ks.rate), f(ks.z), f(ks.sub), f(ks.age), s.weight,
                    ks.notes.get((i, j), "" if not np.isnan(ks.sub[i, j]) else ("stale" if not np.isnan(ks.age[i, j]) else "missing")),
                )
            )
        cats = {c: (None if np.isnan(ks.cat[i, k]) else float(ks.cat[i, k])) for k, c in enumerate(ks.categories)}
        cats = {c: x for c, x in cats.items() if x is not None or any(s.category == c for s in ks.signals)}
        w = int(ks.worst[i])
        return HealthTuple(
            entity=ks.names[i], kind=ks.kind, value=None if np.isnan(v) else float(v),
            confidence=float(ks.confidence[i]), worst=ks.categories[w] if w >= 0 else None, reason=ks.reason[i],
            categories=cats, details=tuple(details), labels=self.meta.labels(kind, i),
            worst_member=ks.worst_member.get(i), flags=tuple(ks.flags.get(i, ())), ts=self.now,
        )

    def by_kind(self, kind: str) -> list[HealthTuple]:
        ks = self.kinds.get(kind)
        if ks is None:
            return []
        return [self._build(kind, i) for i in range(len(ks.names))]

    def get(self, entity: str) -> HealthTuple | None:
        try:
            return self.tuples[entity]
        except KeyError:
            return None

    def __iter__(self) -> Iterator[HealthTuple]:
        for key in self._index:
            yield self.tuples[key]

    def __len__(self) -> int:
        return len(self._index)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, ks in self.kinds.items():
            if not ks.names:
                continue
            known = ~np.isnan(ks.value)
            out[kind] = {
                "entities": len(ks.names),
                "unknown": int((~known).sum()),
                "below_0.7": int((known & (np.nan_to_num(ks.value, nan=1.0) < 0.7)).sum()),
                "mean_confidence": float(ks.confidence.mean()) if ks.names else None,
            }
        return out


class _MetaIndex:
    """Metadata labels per entity (pool, versions, job ...), gathered lazily from the label sets of the
    entity's samples and from info metrics: building 200k label dictionaries is not scoring's job."""

    def __init__(self, ctx: _Ctx, policy: Policy, tables: dict[str, _KindTable], gpu_node: np.ndarray) -> None:
        self.snap = ctx.snap
        self.wanted = set(policy.metadata_labels)
        self.shared = ctx.resolver.meta_cache
        self.gpu_node = gpu_node
        self._pairs: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._node_gpus: tuple[np.ndarray, np.ndarray] | None = None
        self._cache: dict[tuple[str, int], dict[str, str]] = {}
        self._ctx = ctx
        self._policy = policy
        self._tables = tables
        self._raw_cache: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] | None = None
        self._info_cache: dict[tuple[str, int], dict[str, str]] | None = None

    @property
    def _raw(self) -> dict[str, tuple[list[np.ndarray], list[np.ndarray]]]:
        """entity -> series, per kind, from every signal sample (on first use: scoring never needs it)."""
        if self._raw_cache is None:
            ctx, tables, r = self._ctx, self._tables, self._ctx.resolver
            ents: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
            sers: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}
            for spec in self._policy.signals:
                ser = ctx.series_of(spec.metric if spec.shape != "slo" else (spec.requests_metric or spec.metric))
                if ser.size == 0:
                    continue
                ser = ser.astype(np.int64)
                for kind in spec.entities:
                    ent = tables[kind].entities(r.arr[kind][ser])
                    ok = ent >= 0
                    ents[kind].append(ent[ok])
                    sers[kind].append(ser[ok])
            self._raw_cache = {k: (ents[k], sers[k]) for k in KINDS}
        return self._raw_cache

    @property
    def info(self) -> dict[tuple[str, int], dict[str, str]]:
        """Labels of the info metrics (fleethealth_node_info, fleethealth_replica_info) per entity."""
        if self._info_cache is None:
            ctx, tables, r = self._ctx, self._tables, self._ctx.resolver
            info: dict[tuple[str, int], dict[str, str]] = {}
            for metric, kind in ((NODE_INFO_METRIC, "node"), (REPLICA_INFO_METRIC, "replica")):
                idx = ctx.samples(metric)
                series = ctx.row_arrays(int(idx.max()) + 1 if idx.size else 0)[0]
                for sid in _uniq(series[idx].astype(np.int64)).tolist():
                    kid = int(r.arr[kind][sid])
                    if kid < 0 or kid >= tables[kind].lut.size:
                        continue
                    e = int(tables[kind].lut[kid])
                    if e >= 0:
                        info.setdefault((kind, e), {}).update(
                            {k: v for k, v in self.snap.labelsets[sid] if k != "__name__"}
                        )
            self._info_cache = info
        return self._info_cache

    def _series_of(self, kind: str, e: int) -> list[int]:
        if kind not in self._pairs:
            ent_l, ser_l = self._raw[kind]
            if not ent_l:
                self._pairs[kind] = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64))
            else:
                ent = np.concatenate(ent_l)
                ser = np.concatenate(ser_l)
                order = np.lexsort((ser, ent))
                ent, ser = ent[order], ser[order]
                keep = np.ones(ent.size, bool)
                keep[1:] = (ent[1:] != ent[:-1]) | (ser[1:] != ser[:-1])
                ent, ser = ent[keep], ser[keep]
                self._pairs[kind] = (ent, ser, np.zeros(0, np.int64))
        ent, ser, _ = self._pairs[kind]
        a = int(np.searchsorted(ent, e, "left"))
        b = int(np.searchsorted(ent, e, "right"))
        return ser[a:b].tolist()

    def labels(self, kind: str, e: int) -> dict[str, str]:
        hit = self._cache.get((kind, e))
        if hit is not None:
            return hit
        d: dict[str, str] = {}
        series = tuple(self._series_of(kind, e))
        # Label sets are interned for the life of a history: their merged labels are too.
        cached = self.shared.get((kind, series))
        if cached is None:
            cached = {}
            for sid in series:
                for k, v in self.snap.labelsets[sid]:
                    if k in self.wanted and k not in cached:
                        cached[k] = v
            if len(self.shared) > 500_000:
                self.shared.clear()
            self.shared[(kind, series)] = cached
        d.update(cached)
        if kind == "node":
            if self._node_gpus is None:
                order = np.argsort(self.gpu_node, kind="stable")
                self._node_gpus = (self.gpu_node[order], order)
            gn, order = self._node_gpus
            a, b = int(np.searchsorted(gn, e, "left")), int(np.searchsorted(gn, e, "right"))
            # The node's first GPU speaks for the node-wide labels (driver, model, pool): GPU-specific
            # ones are excluded anyway, and asking all eight costs 8x for the same answer.
            for g in order[a:min(b, a + 1)].tolist():
                for k, v in self.labels("gpu", int(g)).items():
                    if k not in _GPU_SPECIFIC and k not in d:
                        d[k] = v
        d.update(self.info.get((kind, e), {}))
        if "driver_version" not in d and "DCGM_FI_DRIVER_VERSION" in d:
            d["driver_version"] = d["DCGM_FI_DRIVER_VERSION"]
        self._cache[(kind, e)] = d
        return d


def score_snapshot(
    snapshot: Snapshot,
    policy: Policy,
    now: float,
    consumer: str = "remediation",
    inventory: Mapping[str, Sequence[str]] | None = None,
    aggregation: str | None = None,
) -> FleetHealth:
    """Score every entity in ``snapshot`` as of ``now`` for one consumer.

    ``inventory`` names entities that must get a tuple even with no samples at all (known nodes whose
    exporter vanished): they come out unknown, never healthy. ``aggregation`` overrides the consumer's
    cross-category function (min, gmean, mean) for baselines.
    """
    if consumer not in CONSUMERS:
        raise ValueError(f"unknown consumer {consumer!r}: expected one of {', '.join(CONSUMERS)}")
    how = aggregation or policy.aggregation.get(consumer, "min")  # type: ignore[call-overload]
    ev = _evaluation(snapshot, policy, now, inventory)
    kinds = _Kinds(ev, how)
    if consumer != "serving":
        # Scores are made here, not on first access: a remediation or training reader takes every
        # kind, and a caller timing this call times the scoring. The serving consumer's one reader,
        # the router, takes replicas alone: its other kinds are made when asked for.
        for kind in KINDS:
            kinds[kind]
    return FleetHealth(now, consumer, policy.version_tag, kinds, ev.meta, list(snapshot.issues) + ev.issues)


@dataclass
class _Evaluation:
    """The consumer-independent part of scoring: entities and every signal's sub-scores."""

    snapshot: Snapshot
    policy: Policy
    now: float
    inventory: Mapping[str, Sequence[str]] | None
    specs: dict[str, list[SignalSpec]]
    tables: dict[str, _KindTable]
    results: dict[str, list[_SignalResult]]
    categories: list[str]
    gpu_node: np.ndarray
    meta: _MetaIndex
    issues: list[InputIssue]
    bases: dict[str, _Base] = field(default_factory=dict)  # per kind: the consumer-independent aggregation
    kind_cats: dict[str, list[str]] = field(default_factory=dict)
    mats: dict[str, _Mats] = field(default_factory=dict)  # per kind: the results as matrices
    roll_up: dict[str, Any] = field(default_factory=dict)  # the node roll-up's consumer-independent part


# A controller cycle scores the same snapshot for several consumers (remediation, serving); the
# signals and their normalisation do not depend on the consumer, only the aggregation does. One entry,
# holding its snapshot and policy so that identity cannot be recycled while it is cached.
_LAST_EVALUATION: list[_Evaluation] = []
# (shape token, policy, inventory, resolver, its key count, tables, gpu -> node): the last history view's
_LAST_TABLES: list[tuple[Hashable, Policy, Any, _Resolver, int, dict[str, _KindTable], np.ndarray]] = []


# policy id -> (policy, signals per kind, categories, categories per kind)
_POLICY_KINDS: dict[int, tuple[Policy, dict[str, list[SignalSpec]], list[str], dict[str, list[str]]]] = {}


def _policy_kinds(policy: Policy) -> tuple[dict[str, list[SignalSpec]], list[str], dict[str, list[str]]]:
    """A policy's signals per entity kind, its categories and each kind's categories, in policy order:
    the same lists every cycle (so that what is kept per list is found by identity)."""
    hit = _POLICY_KINDS.get(id(policy))
    if hit is None or hit[0] is not policy:
        specs: dict[str, list[SignalSpec]] = {kind: [s for s in policy.signals if kind in s.entities] for kind in KINDS}
        categories = list(dict.fromkeys(s.category for s in policy.signals))
        kind_cats: dict[str, list[str]] = {
            kind: [c for c in categories if any(s.category == c for s in specs[kind])] for kind in KINDS}
        if len(_POLICY_KINDS) > 16:
            _POLICY_KINDS.clear()
        made = _POLICY_KINDS[id(policy)] = (policy, specs, categories, kind_cats)
        return made[1], made[2], made[3]
    return hit[1], hit[2], hit[3]


# (the tables it was built with, the plan): how the last history view was evaluated
_LAST_PLAN: list[tuple[dict[str, _KindTable], _Plan]] = []


def forget_evaluations() -> None:
    """Drop the cached evaluation and every score kept because the inputs were equal last time
    (benchmarks: time a full scoring, not a re-aggregation). What depends only on which series exist
    (entity maps per label set, series -> entity) stays."""
    _LAST_EVALUATION.clear()
    _LAST_TABLES.clear()
    _LAST_PLAN.clear()
    _SPEC_PLANS.clear()  # their seen/fresh consequences and derived scores
    _SPEC_PLAN_OF_LISTS.clear()
    _ROLL_UP_A.clear()
    _ROLL_UP_C.clear()


def _evaluation(
    snapshot: Snapshot, policy: Policy, now: float, inventory: Mapping[str, Sequence[str]] | None
) -> _Evaluation:
    if _LAST_EVALUATION:
        last = _LAST_EVALUATION[0]
        if (
            last.snapshot is snapshot and last.policy is policy and last.now == now
            and (last.inventory is inventory or last.inventory == inventory)
            and len(last.snapshot) == len(snapshot)
        ):
            return last
    ctx = _Ctx(snapshot, policy, now)
    # Entities come from which series the view holds: while a history says that set is unchanged (its
    # shape token), last cycle's tables are this cycle's (not with samples in the future left out).
    token = shape_token(snapshot) if ctx.index is not None else None
    r = ctx.resolver
    hit = _LAST_TABLES[0] if _LAST_TABLES else None
    if (
        hit is not None and token is not None and hit[0] == token and hit[1] is policy and hit[3] is r
        and hit[4] == len(r.key_names) and (hit[2] is inventory or hit[2] == inventory)
    ):
        tables, gpu_node = hit[5], hit[6]
    else:
        tables = _entity_tables(ctx, policy, inventory)
        gt = tables["gpu"]
        key_node = r.key_node_arr
        gpu_node_kid = key_node[gt.key_ids] if gt.key_ids.size else np.zeros(0, np.int64)
        nt = tables["node"]
        gpu_node = nt.entities(gpu_node_kid) if gpu_node_kid.size else gpu_node_kid
        if not (gpu_node >= 0).all():  # gpus always imply their node
            raise AssertionError("gpu without node")
        if token is not None:
            _LAST_TABLES[:] = [(token, policy, inventory, r, len(r.key_names), tables, gpu_node)]
    specs, categories, kind_cats = _policy_kinds(policy)
    results: dict[str, list[_SignalResult]] = {kind: [] for kind in KINDS}
    mats: dict[str, _Mats] = {}
    if ctx.index is not None:
        # a history's view: the plan built on the last view of this layout, else one for this view
        prev = _LAST_PLAN[0] if _LAST_PLAN else None
        plan = prev[1] if prev is not None and prev[0] is tables and prev[1].holds(ctx) else None
        if plan is None:
            plan = _Plan(ctx, tables, specs)
            if token is not None:
                _LAST_PLAN[:] = [(tables, plan)]
        found, mats = plan.run(ctx, specs)
        results.update(found)
    else:
        for kind in KINDS:
            if tables[kind].names:
                results[kind], mats[kind] = _evaluate_kind(ctx, kind, tables[kind], specs[kind])
    meta = _MetaIndex(ctx, policy, tables, gpu_node)
    ev = _Evaluation(
        snapshot, policy, now, inventory, specs, tables, results, categories, gpu_node, meta, ctx.issues,
        kind_cats=kind_cats, mats=mats,
    )
    _LAST_EVALUATION[:] = [ev]
    return ev

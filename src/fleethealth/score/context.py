"""One scoring call's context: the snapshot read by metric, the resolver, entity tables, result rows.

Theory of operation
-------------------
``_Ctx`` is what every stage of one call shares: the snapshot's rows per metric (a history's view says
where each metric's block is and holds its counters as matrices; any other snapshot is sorted by metric
once, samples too far in the future left out with an input issue), the resolver, and the scorer's memory
(``Kept``) through which the per-signal lookups (``gauge_rows``, ``columns``) are kept from cycle to cycle
while the series they read are the same. ``_entity_tables`` decides which entities exist this cycle
(every entity with a sample of a signal of its kind, the GPUs' nodes, the inventory's names). A kind's
per-signal results are rows of signals x entities matrices (``_Mats``), written in place by the
evaluators so that aggregation reads them without stacking; the quantities only explanations read (raw,
rate, z, age) are kept per row taken (``_Rows``) and stacked when a whole matrix is asked for.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fleethealth.policy import Policy
from fleethealth.score.kernels import _fresh_rate, _uniform_rates, _window, _windows
from fleethealth.score.resolve import KINDS, UNNAMED_NODE, _KindTable, _resolver_for, _uniq
from fleethealth.signals.snapshot import CounterMatrix, InputIssue, Snapshot

if TYPE_CHECKING:
    from fleethealth.score.kept import Kept


class _SignalResult:
    """Per entity of one kind, one signal: sub-score (NaN = missing), raw, rate, z, age, seen (any
    sample), as row ``j`` of its kind's matrices (``_Mats``): each attribute is that row, taken on access
    (written in place, never rebound), plus the signal's flags and notes."""

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
        return self._m.rows["raw"].row(self._j)

    @property
    def rate(self) -> np.ndarray:
        return self._m.rows["rate"].row(self._j)

    @property
    def z(self) -> np.ndarray:
        return self._m.rows["z"].row(self._j)

    @property
    def age(self) -> np.ndarray:
        return self._m.rows["age"].row(self._j)

    @property
    def seen(self) -> np.ndarray:
        return self._m.seen[self._j]


class _Rows:
    """One explanatory quantity of a kind's results (raw, rate, z, age): an m x n matrix, NaN to start,
    kept as the rows taken (each made NaN on its first access, or handed in: the layout plan's rows of
    its compact buffers) and stacked into the matrix only when the whole matrix is asked for
    (``matrix``); from then on rows are views of it. Rows are written where they are taken, by the
    evaluation, before anything asks for the matrix (aggregation reads sub-scores and seen alone; the
    matrices are for explanations)."""

    __slots__ = ("shape", "taken", "full")

    def __init__(self, m: int, n: int, taken: dict[int, np.ndarray] | None = None) -> None:
        self.shape = (m, n)
        self.taken: dict[int, np.ndarray] = {} if taken is None else taken
        self.full: np.ndarray | None = None

    def row(self, j: int) -> np.ndarray:
        if self.full is not None:
            return self.full[j]
        r = self.taken.get(j)
        if r is None:
            r = self.taken[j] = np.full(self.shape[1], np.nan)
        return r

    def matrix(self) -> np.ndarray:
        if self.full is None:
            full = np.full(self.shape, np.nan)
            for j, r in self.taken.items():
                full[j] = r
            self.full, self.taken = full, {}
        return self.full


class _Mats:
    """One kind's per-signal results as signals x entities matrices (NaN / unseen to start): each
    signal's ``_SignalResult`` holds rows of them, so that several signals are evaluated and shaped by
    one numpy operation and aggregation reads the matrices without stacking.

    Sub-scores and seen are whole matrices (aggregation reads them). raw, rate, z and age are only read
    to explain an entity, and most of their rows are never written (a policy's signals the fleet does not
    export; rates of gauges; z of all but peer signals): they are kept per row (``_Rows``) and stacked
    into an m x n matrix when the whole matrix is asked for. Full NaN matrices of them were faulted in
    (every page touched) each cycle for nothing: 23 MB each at 100k GPUs."""

    def __init__(self, m: int, n: int) -> None:
        self.sub = np.full((m, n), np.nan)
        self.seen = np.zeros((m, n), bool)
        self.lazy_rows(m, n)

    def lazy_rows(self, m: int, n: int, raw: dict[int, np.ndarray] | None = None,
                  rate: dict[int, np.ndarray] | None = None, age: dict[int, np.ndarray] | None = None) -> None:
        """Start raw, rate, z and age as the rows given (else none: all NaN) of m x n matrices."""
        self.rows = {"raw": _Rows(m, n, raw), "rate": _Rows(m, n, rate), "z": _Rows(m, n), "age": _Rows(m, n, age)}

    @property
    def raw(self) -> np.ndarray:
        return self.rows["raw"].matrix()

    @property
    def rate(self) -> np.ndarray:
        return self.rows["rate"].matrix()

    @property
    def z(self) -> np.ndarray:
        return self.rows["z"].matrix()

    @property
    def age(self) -> np.ndarray:
        return self.rows["age"].matrix()

    def result(self, j: int) -> _SignalResult:
        return _SignalResult(self, j)


class _Ctx:
    """Everything one scoring call shares: snapshot views sorted by metric, the resolver, entities."""

    def __init__(self, snap: Snapshot, policy: Policy, now: float, kept: Kept) -> None:
        # the scorer's memory, held weakly: a result's metadata index holds this context, and the
        # memory holds its last result (a cycle would keep a dropped scorer's memory until a gc pass)
        self._kept = weakref.ref(kept)
        self.snap = snap
        self.policy = policy
        self.now = now
        self.issues: list[InputIssue] = []
        self.metric_ix = snap.metric_index()
        self.resolver = _resolver_for(kept, snap, policy)
        skew = policy.freshness.future_skew_s
        # A history's view says where each metric's rows are and holds its counters as matrices: nothing
        # to sort, unless a sample lies in the future (those rows are left out: the plain path below).
        self.index = snap.index_upto(now + skew)
        self.order = np.zeros(0, np.int64)
        self.bounds: dict[int, tuple[int, int]] = {}
        self._windows: dict[tuple[int, float], tuple[np.ndarray, ...]] = {}
        self._rates: dict[tuple[int, float, float, float], tuple[np.ndarray, ...]] = {}
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

    @property
    def kept(self) -> Kept:
        """The scorer's memory (a fresh one once the scorer is gone: only a result read later asks)."""
        kept = self._kept()
        if kept is None:
            from fleethealth.score.kept import Kept

            kept = Kept()
            self._kept = weakref.ref(kept)
            self._own = kept
        return kept

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
        hit = self.kept.columns.get(key)
        if hit is not None and hit[0] is table and np.array_equal(hit[1], mat.series):
            ent, ok, single = hit[2], hit[3], hit[4]
        else:
            ent = table.entities(self.resolver.arr[kind][mat.series])
            ok = ent >= 0
            if match:
                ok &= self.resolver.label_match(match)[mat.series]
            single = bool(ok.all()) and (ent.size == 0 or int(np.bincount(ent).max()) <= 1)
            if len(self.kept.columns) > 512:
                self.kept.columns.clear()
            self.kept.columns[key] = (table, mat.series.copy(), ent, ok, single)
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
            hit = self._stacks[key] = _windows(g.t, g.v, g.last, np.asarray(starts, np.float64), g.dense,
                                               g.row_times)
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
        hit = self.kept.gauges.get(key)
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
        if len(self.kept.gauges) > 512:
            self.kept.gauges.clear()
        self.kept.gauges[key] = (table, block.copy(), g)
        return g

    def rates(self, mat: CounterMatrix, window: float, max_age: float,
              min_span: float = 0.0) -> tuple[np.ndarray, ...]:
        """Per column of ``mat``'s group: rate over the window (NaN unless fresh; over at least
        ``min_span``), latest value, age."""
        key = (mat.group, window, max_age, min_span)
        hit = self._rates.get(key)
        if hit is None:
            assert self.index is not None
            g = self.index.groups[mat.group]
            hit = _uniform_rates(g.t, g.v, self.now - window, self.now, max_age, min_span, g.row_times) \
                if g.dense else None
            if hit is None:
                inc, t0, t1, lv, lt, _ = self.window(mat, self.now - window)
                hit = (_fresh_rate(inc, t0, t1, self.now, max_age, min_span), lv, self.now - lt)
            self._rates[key] = hit
        return hit

    def window(self, mat: CounterMatrix, start: float) -> tuple[np.ndarray, ...]:
        """``_window`` over the whole matrix of ``mat``'s group: once per (group, start) and call, for
        every metric of the group (all of a GPU's counters are one matrix)."""
        key = (mat.group, start)
        hit = self._windows.get(key)
        if hit is None:
            assert self.index is not None
            g = self.index.groups[mat.group]
            hit = self._windows[key] = _window(g.t, g.v, g.last, start, g.dense, g.row_times)
        return hit


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
            inv_nodes: list[int] = []
            for name in names:
                if inv_kind == "gpu":
                    # a declared GPU implies its node, as a sampled one does: the structural tracker
                    # declares the GPUs of a node whose samples have all left the view (else: "gpu
                    # without node", the whole cycle lost); a name not node/gpuN sits under the placeholder
                    node = name.rsplit("/gpu", 1)[0] if "/gpu" in name else UNNAMED_NODE
                    inv_nodes.append(r._kid("node", node))
                    inv_ids.append(r._kid("gpu", name, inv_nodes[-1]))
                else:
                    inv_ids.append(r._kid(inv_kind, name))  # type: ignore[arg-type]
            found[inv_kind].append(np.asarray(inv_ids, np.int64))
            if inv_nodes:
                found["node"].append(np.asarray(inv_nodes, np.int64))
    out: dict[str, _KindTable] = {}
    n_keys = r.n_keys
    for kind in KINDS:
        ids = _uniq(np.concatenate(found[kind])) if found[kind] else np.zeros(0, np.int64)
        lut = np.full(max(n_keys, 1), -1, np.int64)
        lut[ids] = np.arange(ids.size)
        names = r.display_names(ids)
        out[kind] = _KindTable(kind, ids, lut, names)
    return out


def _cols_ix(c: _Columns) -> np.ndarray:
    return np.arange(c.cols.start, c.cols.stop) if isinstance(c.cols, slice) else c.cols

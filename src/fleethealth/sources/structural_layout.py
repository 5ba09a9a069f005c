"""The layout of a history view's entries, as the structural tracker reads them (``_Layout``), and the
helpers of that reading. Split out of ``sources/structural.py`` (see its docstring: the tracker reads a
history view through its index, and while the layout of the entries is unchanged, only their times).

Theory of operation. A history view's entries are the rows of every block that is not a counter matrix
(gauges: a row or two per series) and each counter series' latest sample. ``_Layout`` keeps, for one
such layout, the (metric, series) pair of each entry, the entries per pair and what follows from the set
of pairs (present series, pairs and GPUs per node, the entries of each node), built the second time the
same layout is seen; a steady fleet then reads only the entries' times each cycle. Pure: the tracker
holds the layout (``StructuralTracker._layout``), nothing is kept here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fleethealth.sources.structural import StructuralTracker, _SeriesTable

# per metric: up, scrape duration, GPU metric, target (not a sample of the node itself)
_Masks = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# a view's blocks read row by row: (first row, end row, metric), by first row; the counter groups:
# (group, its metrics' (first column, end column, metric) ranges, its columns), by group
_Blocks = tuple[tuple[int, int, int], ...]
_CGroups = tuple[tuple[int, tuple[tuple[int, int, int], ...], int], ...]


_NO_IDS = np.zeros(0, np.int64)
_NO_IDS32 = np.zeros(0, np.int32)
_NO_VALS = np.zeros(0, np.float64)



def _latest_arrays(rows: np.ndarray, sids: np.ndarray, ts: np.ndarray, values: np.ndarray,
                   mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The newest value of each series among the masked rows (ties: the later row), as (series ids in
    increasing order, values). ``sids``/``ts``/``mask`` are per row of ``rows``; ``values`` the view's."""
    if not mask.any():
        return _NO_IDS, _NO_VALS
    sel = np.flatnonzero(mask)
    sids, ts, vals = sids[sel], ts[sel], values[rows[sel]]
    if sids.size < 2 or bool((sids[1:] > sids[:-1]).all()):  # one row per series, in order
        return sids.astype(np.int64), vals.astype(np.float64)
    order = np.lexsort((ts, sids))
    sids, vals = sids[order], vals[order]
    last = np.ones(sids.size, bool)
    np.not_equal(sids[1:], sids[:-1], out=last[:-1])
    return sids[last].astype(np.int64), vals[last].astype(np.float64)


class _Layout:
    """The entries of a history view (block rows, then the counter columns with a sample, group by group)
    and, once the same layout has come twice in a row (built then, not for a layout seen once), what
    follows from it: the (metric, series) pair of each entry, the entries per pair, the pair facts when
    every pair is fresh (present series, pairs and GPUs per node), the pairs in the whole view per node,
    and per node the entries to take the newest time of."""

    def __init__(self, key: tuple[object, ...], blocks: _Blocks, cgroups: _CGroups, bs: np.ndarray,
                 g_series: list[np.ndarray], g_valid: list[np.ndarray | None]) -> None:
        self.key = key
        self.blocks, self.cgroups = blocks, cgroups
        self.bs = bs.copy()
        # a history never writes a counter group's series array again (new columns: a new array), so the
        # same array object holds the same series
        self.g_series_of = list(g_series)
        self.g_series = [s.copy() for s in g_series]
        self.g_valid = [None if v is None else v.copy() for v in g_valid]
        self.built = False
        # the last answer of ``facts``: (stale block rows, stale counter columns, the facts)
        self._stale: tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    def matches(self, key: tuple[object, ...], bs: np.ndarray, g_series: list[np.ndarray],
                g_valid: list[np.ndarray | None]) -> bool:
        k = self.key
        # the series table and the metric list by identity (both grow in place), the rest by value
        return (k[0] is key[0] and k[2] is key[2] and k[1:2] + k[3:] == key[1:2] + key[3:]
                and _same(self.bs, bs)
                and all(o is b or _same(a, b) for a, o, b in zip(self.g_series, self.g_series_of, g_series, strict=True))
                and all(a is b or (a is not None and b is not None and _same(a, b))
                        for a, b in zip(self.g_valid, g_valid, strict=True)))

    def facts(self, tr: StructuralTracker, st: _SeriesTable, masks: _Masks, stale_b: np.ndarray,
              stale_a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_pair_facts`` of the fresh pairs, given the entries that are not fresh (block rows, counter
        columns): the layout's own when every pair still has a fresh entry (a steady state), and the
        same answer as last time for the same stale entries (a GPU that has fallen off stays so)."""
        if not stale_b.size and not stale_a.size:
            return self.present, self.retained, self.gpus
        c = self._stale
        if c is not None and _same(c[0], stale_b) and _same(c[1], stale_a):
            return c[2]
        u, n = np.unique(np.concatenate((self.pair_b[stale_b], self.pair_a[stale_a])), return_counts=True)
        gone = u[n == self.npe[u]]  # pairs none of whose entries is fresh
        if not gone.size:
            out = (self.present, self.retained, self.gpus)
        else:
            fresh = np.ones(self.npe.size, bool)
            fresh[gone] = False
            out = tr._pair_facts(st, masks, self.present.size, self.p_sid[fresh], self.p_mid[fresh])
        self._stale = (stale_b, stale_a, out)
        return out

    def build(self, tr: StructuralTracker, st: _SeriesTable, masks: _Masks, n_labelsets: int,
              n_metric_names: int) -> None:
        is_up, is_dur, _, is_target = masks
        blocks, cgroups = self.blocks, self.cgroups
        n_series, n_metrics = max(n_labelsets, 1), max(n_metric_names, 1)
        nb = self.bs.size
        bm = _block_metrics(blocks, nb)
        am, as_ = _columns(cgroups, self.g_series, self.g_valid)
        sids = np.concatenate((self.bs, as_)).astype(np.int64)
        mids = np.concatenate((bm, am)).astype(np.int64)
        # distinct pairs by a stable sort: the entries are runs already in key order (a block's series
        # ascending, a group's columns by (metric, series)), which it merges
        keys = sids * n_metrics + mids
        order = np.argsort(keys, kind="stable")
        sk = keys[order]
        first = np.ones(sk.size, bool)
        np.not_equal(sk[1:], sk[:-1], out=first[1:])
        keys = sk[first]
        pair = np.empty(sk.size, np.int32 if sk.size < 2**31 else np.int64)  # (kept: half the memory)
        pair[order] = np.cumsum(first) - 1
        self.pair_b, self.pair_a = pair[:nb], pair[nb:]
        self.npe = np.diff(np.append(np.flatnonzero(first), sk.size))  # entries per pair
        self.p_sid, self.p_mid = np.divmod(keys, n_metrics)
        self.present, self.retained, self.gpus = tr._pair_facts(st, masks, n_series, self.p_sid, self.p_mid)
        node_of = st.node_of()


        def by_node(s: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            # entries of a node (not of a target metric), by node; as intp: the fastest gather
            nodes = node_of[s]
            rows = np.flatnonzero((nodes >= 0) & ~is_target[m])
            rows = rows[np.argsort(nodes[rows], kind="stable")]
            nodes = nodes[rows]
            starts = np.flatnonzero(np.concatenate(([True], nodes[1:] != nodes[:-1]))) if rows.size else _NO_IDS
            return rows, starts, nodes[starts]

        self.nb_order, self.nb_starts, self.nb_nodes = by_node(self.bs, bm)
        self.na_order, self.na_starts, self.na_nodes = by_node(as_, am)
        # per target metric (up, scrape duration): its block rows, their series, whether one row each and
        # in series order (then the latest fresh value of each is its row's when every row is fresh)
        self.targets: list[tuple[np.ndarray, np.ndarray, bool]] = []
        for mask in (is_up, is_dur):
            rows = np.flatnonzero(mask[bm])
            sids = self.bs[rows].astype(np.int64)
            self.targets.append((rows, sids, sids.size < 2 or bool((sids[1:] > sids[:-1]).all())))
        self.built = True

    def target_rows(self, which: int, bs: np.ndarray, bt: np.ndarray, bv: np.ndarray,
                    lo: float) -> tuple[np.ndarray, np.ndarray]:
        """``_latest_arrays`` of the fresh rows of ``up`` (0) or the scrape duration (1)."""
        rows, sids, one_each = self.targets[which]
        if one_each and bool((bt[rows] > lo).all()):
            return sids, bv[rows]
        rows = rows[bt[rows] > lo]
        return _latest_arrays(rows, bs[rows], bt[rows], bv, np.ones(rows.size, bool))


def _block_metrics(blocks: _Blocks, n: int) -> np.ndarray:
    """The metric id of each row of the blocks (a, b, metric), in order, laid end to end."""
    out = np.empty(n, np.int32)
    at = 0
    for a, b, m in blocks:
        out[at:at + b - a] = m
        at += b - a
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def _cat(parts: list[np.ndarray], empty: np.ndarray) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else empty


def _columns(cgroups: _CGroups, g_series: list[np.ndarray], g_valid: list[np.ndarray | None]
             ) -> tuple[np.ndarray, np.ndarray]:
    """Metric and series ids of the counter groups' columns with a sample, laid end to end."""
    mids = [_column_metrics(r, s.size) for (_, r, _), s in zip(cgroups, g_series, strict=True)]
    return (_cat([m if v is None else m[v] for m, v in zip(mids, g_valid, strict=True)], _NO_IDS32),
            _cat([s if v is None else s[v] for s, v in zip(g_series, g_valid, strict=True)], _NO_IDS32))


def _run_end(ranges: list[tuple[int, int, int]]) -> int:
    """The end of the (c0, c1, metric) ranges when they tile columns 0.. one after another, else -1."""
    at = 0
    for c0, c1, _ in ranges:
        if c0 != at:
            return -1
        at = c1
    return at


def _column_metrics(ranges: tuple[tuple[int, int, int], ...], n: int) -> np.ndarray:
    """The metric id of each of a counter group's ``n`` columns ((c0, c1, metric) ranges; -1: none)."""
    out = np.full(n, -1, np.int32)
    for c0, c1, m in ranges:
        out[c0:c1] = m
    return out

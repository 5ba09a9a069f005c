"""The structural tracker's per-series table (``_SeriesTable``) and the layout of a history view's
entries, as the tracker reads them (``_Layout``), with the helpers of that reading. Split out of
``sources/structural.py`` (see its docstring: the tracker reads a history view through its index, and
while the layout of the entries is unchanged, only their times).

Theory of operation. ``_SeriesTable`` describes each label set of a history's (append-only) list once,
as the list grows: its node, GPU and target, the tracker-wide ids of its node name, instance and (node,
GPU) pair. A cold 100k-GPU cycle brings 100k label sets, read a chunk of ~1000 at a time: a chunk whose
label sets have the same names at the same positions (one exporter's pages) is transposed into columns
(``_transposed``: the name at each position checked, the values read only of the labels the tracker
reads), others are split by length or read one ``dict(ls)`` at a time; the chunk's names are interned by
C-level dict and map passes while its strings are in the CPU's caches, and the (node, GPU) pairs as int
keys in numpy (the tracker keeps them as arrays). No Python step per label set.

A history view's entries are the rows of every block that is not a counter matrix (gauges: a row or two
per series) and each counter series' latest sample. ``_Layout`` keeps, for one such layout, the (metric,
series) pair of each entry, the entries per pair and what follows from the set of pairs (present series,
pairs and GPUs per node, the node each entry's time counts for), built the first time the layout is
seen, in passes over the entries (a bitmap of the pairs, a row of series per metric, set block by block:
no sort, no key per entry); a steady fleet then reads only the entries' times each cycle. Consecutive
blocks with the same series (one exporter's metrics: every GPU's series in the same order) form a run:
the layout keeps a run's series and node slots once (a cold 100k-GPU view's 2.4M block entries are 3
runs of 100k), copies its bitmap row from block to block, and scatters the elementwise maximum of a
run's times once when it looks for each node's newest time. Pure: the tracker holds the layout
(``StructuralTracker._layout``), nothing is kept here.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import filterfalse, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, cast

import numpy as np

from fleethealth.signals.snapshot import LabelSet

if TYPE_CHECKING:
    from fleethealth.sources.structural import StructuralTracker

# per metric: up, scrape duration, GPU metric, target (not a sample of the node itself)
_Masks = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
# a view's blocks read row by row: (first row, end row, metric), by first row; the counter groups:
# (group, its metrics' (first column, end column, metric) ranges, its columns), by group
_Blocks = tuple[tuple[int, int, int], ...]
_CGroups = tuple[tuple[int, tuple[tuple[int, int, int], ...], int], ...]


_NO_IDS = np.zeros(0, np.int64)
_NO_IDS32 = np.zeros(0, np.int32)
_NO_VALS = np.zeros(0, np.float64)
# (a label set's node, GPU and instance labels: None where it has none)
_Described = tuple[list[str | None], list[str | None], list[str | None]]


class _SeriesTable:
    """Node, GPU and scrape-target facts of each label set of one label-set list, as arrays."""

    def __init__(self, labelsets: list[LabelSet]) -> None:
        self.labelsets = labelsets
        self.n = 0
        self.last: LabelSet | None = None
        self.node: list[str | None] = []
        self.inst: list[str | None] = []
        self.name_id = np.zeros(0, np.int64)  # tracker-wide node name id per series (-1: none)
        self.inst_id = np.zeros(0, np.int64)  # tracker-wide instance label id per series (-1: none)
        self.pair_id = np.zeros(0, np.int64)  # tracker-wide (node, GPU) id per series (-1: none)
        self.learnable = np.zeros(0, bool)  # has an instance and a node label that differ
        self.learned = np.zeros(0, bool)  # already taught the tracker its target -> node pair
        self.node_names: list[str] = []  # sorted names of this list's nodes
        self.node_ix: dict[str, int] = {}
        self.rank = np.zeros(0, np.int64)  # name id -> index in node_names (-1)
        self.rank_n = 0
        self._node_of: np.ndarray | None = None

    def extend(self, tr: StructuralTracker, labelsets: list[LabelSet]) -> None:
        """Describe the label sets past ``n`` and intern their node names, GPU ids and (node, GPU) pairs
        with the tracker, ids in order of first appearance. No Python step per label set: a cold 100k-GPU
        cycle brings 100k new label sets, described a chunk of columns at a time (``_describe_chunk``),
        12.5k nodes, 12.5k instances and 8 GPU ids, interned chunk by chunk by C-level dict and map
        passes, and 100k pairs, interned as int keys in numpy (``_intern_pairs``)."""
        new = labelsets[self.n:]
        k = len(new)
        # (looked up with None too: never a key, so -1)
        name_ix = cast("dict[str | None, int]", tr._name_ix)
        gpu_ix = cast("dict[str | None, int]", tr._gpu_ix)
        inst_ix = cast("dict[str | None, int]", tr._inst_ix)
        name_id = np.empty(k, np.int64)
        gpu_id = np.empty(k, np.int64)
        inst_id = np.empty(k, np.int64)
        # a chunk at a time: its names are interned while its strings are in the CPU's caches
        for i in range(0, k, _CHUNK):
            nodes, gpus, insts = _describe_chunk(new[i:i + _CHUNK], tr.node_labels, tr.gpu_labels)
            j = i + len(nodes)
            self.node.extend(nodes)
            self.inst.extend(insts)
            name_id[i:j] = _interned(name_ix, tr._names, nodes)
            gpu_id[i:j] = _interned(gpu_ix, tr._gpus, gpus)
            inst_id[i:j] = _interned(inst_ix, tr._insts, insts)
        # (node, GPU) pairs: only where both are labelled (-1 elsewhere), as (name id, GPU id) int keys
        pair_id = np.full(k, -1, np.int64)
        paired = (name_id >= 0) & (gpu_id >= 0)
        if paired.any():
            pair_id[paired] = _intern_pairs(tr, (name_id[paired] << 32) | gpu_id[paired])
        # a target it can learn: an instance and a node label that differ, by ids (an instance's name id:
        # that of the node name spelled as it is, -1 none), looked up once per distinct instance
        has_inst = inst_id >= 0
        learn = (name_id >= 0) & has_inst
        if learn.any():
            inst_seen = np.zeros(len(tr._insts), bool)
            inst_seen[inst_id[has_inst]] = True
            ids = np.flatnonzero(inst_seen)
            as_name = np.full(len(tr._insts), -1, np.int64)
            as_name[ids] = np.fromiter(map(name_ix.get, map(tr._insts.__getitem__, ids.tolist()), repeat(-1)),
                                       np.int64, ids.size)
            learn &= as_name[np.maximum(inst_id, 0)] != name_id
        self.name_id = np.concatenate((self.name_id, name_id))
        self.inst_id = np.concatenate((self.inst_id, inst_id))
        self.pair_id = np.concatenate((self.pair_id, pair_id))
        self.learnable = np.concatenate((self.learnable, learn))
        self.learned = np.concatenate((self.learned, np.zeros(k, bool)))
        self.n = len(labelsets)
        self.last = labelsets[-1]
        # the table's sorted node names change only when it gains a name (a derived series' node is one
        # the GPU series already named)
        named = name_id[name_id >= 0]
        if (named >= self.rank.size).any() or (self.rank[named[named < self.rank.size]] < 0).any():
            has = np.zeros(len(tr._names), bool)  # (the table's name ids: a bitmap, no sort of the series)
            has[self.name_id[self.name_id >= 0]] = True
            ids = np.flatnonzero(has)
            names = list(map(tr._names.__getitem__, ids.tolist()))
            order = sorted(range(len(names)), key=names.__getitem__)
            self.node_names = list(map(names.__getitem__, order))
            self.node_ix = dict(zip(self.node_names, range(len(names)), strict=True))
            self.rank = np.full(len(tr._names), -1, np.int64)
            self.rank[ids[np.array(order, np.int64)]] = np.arange(len(names))
            self.rank_n = len(names)
        self._node_of = None

    def node_of(self) -> np.ndarray:
        """Sorted-node index per series (-1: none); at least one entry, as indexing needs."""
        if self._node_of is None:
            if self.n == 0:
                self._node_of = np.full(1, -1, np.int64)
            else:
                self._node_of = np.where(self.name_id >= 0, self.rank[np.maximum(self.name_id, 0)], -1)
        return self._node_of


# label sets described together: a chunk's label sets and their pairs stay in the CPU's caches between
# the passes of a column-wise reading (one transposition of 100k label sets is slower than a dict each)
_CHUNK = 1024


def _describe_many(sets: Sequence[LabelSet], node_labels: Sequence[str], gpu_labels: Sequence[str]
                   ) -> _Described:
    """Each label set's node (the first of ``node_labels`` with a non-empty value), GPU (the same of
    ``gpu_labels``) and ``instance`` label (as it is, empty included), as ``dict(ls)`` reads them (the
    last of a repeated name). Column-wise, a chunk at a time (``_describe_chunk``): the label sets of
    one exporter's pages have the same names at the same positions."""
    nodes: list[str | None] = []
    gpus: list[str | None] = []
    insts: list[str | None] = []
    for i in range(0, len(sets), _CHUNK):
        n_, g_, i_ = _describe_chunk(sets[i:i + _CHUNK], node_labels, gpu_labels)
        nodes.extend(n_)
        gpus.extend(g_)
        insts.extend(i_)
    return nodes, gpus, insts


def _describe_chunk(chunk: Sequence[LabelSet], node_labels: Sequence[str], gpu_labels: Sequence[str]
                    ) -> tuple[Sequence[str | None], Sequence[str | None], Sequence[str | None]]:
    """``_describe_many`` of a few label sets: off their columns when all have the same names at the same
    positions, else by length (label sets of different exporters interleaved: each length's columns),
    else one at a time."""
    k = len(chunk)
    cols = _transposed(chunk)
    if cols is not None:
        inst = cols.get("instance")
        return (_first_set(cols, node_labels, k), _first_set(cols, gpu_labels, k),
                [None] * k if inst is None else list(map(_VALUE, inst)))
    lens = np.fromiter(map(len, chunk), np.int64, k)
    if k < 16 or bool((lens == lens[0]).all()):
        return _describe_each(chunk, node_labels, gpu_labels)
    out = [np.empty(k, object) for _ in range(3)]
    for n in np.unique(lens).tolist():
        at = np.flatnonzero(lens == n)
        sub = [chunk[i] for i in at.tolist()]
        for o, col in zip(out, _describe_chunk(sub, node_labels, gpu_labels), strict=True):
            o[at] = col if isinstance(col, list) else list(col)
    return out[0].tolist(), out[1].tolist(), out[2].tolist()


def _transposed(chunk: Sequence[LabelSet]) -> dict[str, tuple[tuple[str, str], ...]] | None:
    """Label -> every label set's (name, value) pair at its position, when all of ``chunk`` have the same
    names at the same positions (else None; a name twice in a label set: the last, as ``dict`` reads
    it). The pairs as they are: only the names are read here (a C-level map and count per position, no
    split of each pair into two tuples, whose ``zip`` makes an iterator per pair), and the values only of
    the few labels the tracker reads (``_first_set``)."""
    k = len(chunk)
    if not k:
        return None
    cols: dict[str, tuple[tuple[str, str], ...]] = {}
    try:
        for at in zip(*chunk, strict=True):  # (strict: label sets of other lengths raise)
            first = at[0]
            # (one pair object at this position in every label set, as the parser shares a label that
            # every series of a page carries: an identity count, no names read)
            if at[-1] is first and at.count(first) == k:
                cols[first[0]] = at
                continue
            keys = list(map(_NAME, at))
            key = keys[0]
            if keys.count(key) != k:
                return None
            cols[key] = at
    except ValueError:
        return None
    return cols


# a label pair's name and value
_NAME, _VALUE = itemgetter(0), itemgetter(1)


def _first_set(cols: dict[str, tuple[tuple[str, str], ...]], labels: Sequence[str], k: int
               ) -> Sequence[str | None]:
    """Per label set (``cols``: ``_transposed``), the value of the first of ``labels`` that is non-empty
    (None: none is)."""
    out: Sequence[str | None] | None = None
    for lab in labels:
        c = cols.get(lab)
        if c is None:
            continue
        vals: list[str] = list(map(_VALUE, c))
        out = vals if out is None else [a or b for a, b in zip(out, vals, strict=True)]
        if all(out):  # every one set: a later label changes nothing
            return out
    return [None] * k if out is None else [x or None for x in out]


def _describe_each(sets: Sequence[LabelSet], node_labels: Sequence[str], gpu_labels: Sequence[str]
                   ) -> _Described:
    """``_describe_many`` one label set at a time, through ``dict(ls)``."""
    nodes: list[str | None] = []
    gpus: list[str | None] = []
    insts: list[str | None] = []
    for ls in sets:
        d = dict(ls)
        node = gpu = None
        for key in node_labels:
            node = d.get(key)
            if node:
                break
        for key in gpu_labels:
            gpu = d.get(key)
            if gpu:
                break
        nodes.append(node or None)
        gpus.append(gpu or None)
        insts.append(d.get("instance"))
    return nodes, gpus, insts


def _interned(ix: dict[str | None, int], names: list[str], values: Sequence[str | None]) -> np.ndarray:
    """The ids of ``values`` in ``ix`` (None: -1), new names taking the next ids in order of first
    appearance (appended to ``names``): C-level dict and map passes."""
    distinct = dict.fromkeys(values)
    distinct.pop(None, None)
    new = list(filterfalse(ix.__contains__, distinct))
    if new:
        ix.update(zip(new, range(len(names), len(names) + len(new)), strict=True))
        names.extend(cast("list[str]", new))
    return np.fromiter(map(ix.get, values, repeat(-1)), np.int64, len(values))


def _intern_pairs(tr: StructuralTracker, keys: np.ndarray) -> np.ndarray:
    """The tracker-wide ids of (node, GPU) pairs (``keys``: name id << 32 | GPU id), new pairs taking
    the next ids in order of first appearance, one memory bump each; a sorted array of the known keys,
    not a dict of (node, GPU) tuples (a cold 100k-GPU cycle brings 100k new pairs)."""
    ids = np.full(keys.size, -1, np.int64)
    known, known_ids = tr._pair_keys, tr._pair_key_ids
    if known.size:
        pos = np.minimum(np.searchsorted(known, keys), known.size - 1)
        hit = known[pos] == keys
        ids[hit] = known_ids[pos[hit]]
        new = ~hit
    else:
        new = np.ones(keys.size, bool)
    if new.any():
        u, first, inv = np.unique(keys[new], return_index=True, return_inverse=True)
        rank = np.empty(u.size, np.int64)  # each distinct new key's place in order of first appearance
        order = np.argsort(first, kind="stable")
        rank[order] = np.arange(u.size)
        p0 = tr._pair_node_arr.size
        ids[new] = p0 + rank[inv.reshape(-1)]
        fresh = u[order]
        tr._pair_node_arr = np.concatenate((tr._pair_node_arr, fresh >> 32))
        tr._pair_gpu_arr = np.concatenate((tr._pair_gpu_arr, fresh & 0xFFFFFFFF))
        if known.size:
            all_keys, all_ids = np.concatenate((known, u)), np.concatenate((known_ids, p0 + rank))
            by_key = np.argsort(all_keys, kind="stable")
            tr._pair_keys, tr._pair_key_ids = all_keys[by_key], all_ids[by_key]
        else:  # (the first pairs: ``u`` is sorted already)
            tr._pair_keys, tr._pair_key_ids = u, p0 + rank
        tr.memory_version += u.size  # (one bump per new pair, as one at a time)
    return ids


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
    and, once built (``build``: when the layout is first seen), what follows from it: the (metric, series)
    pair of each entry, the entries per pair, the pair facts when every pair is fresh (present series,
    pairs and GPUs per node), the pairs in the whole view per node, and per entry the node whose newest
    time it counts for."""

    # block entries' node slots, run by run: (first entry, entries per block, blocks); ``b_node`` holds
    # each run's slots once, end to end (None: ``b_node`` is every entry's slot)
    _b_runs: list[tuple[int, int, int]] | None = None

    def __init__(self, key: tuple[object, ...], blocks: _Blocks, cgroups: _CGroups, bs: np.ndarray,
                 g_series: list[np.ndarray], g_valid: list[np.ndarray | None]) -> None:
        self.key = key
        self.blocks, self.cgroups = blocks, cgroups
        # the block entries' series: read by ``build``, which keeps them run by run (``_bs_heads``)
        self.bs = bs
        self._bs_heads, self._nb = _NO_IDS32, bs.size
        # a history never writes a counter group's series array again (new columns: a new array), so the
        # same array object holds the same series
        self.g_series_of = list(g_series)
        self.g_series = [s.copy() for s in g_series]
        self.g_valid = [None if v is None else v.copy() for v in g_valid]
        self.built = False
        # (set by ``build``: the pair facts of every pair, the bitmap of the pairs, each pair's bit)
        self.present = self.retained = self.gpus = self._seen = _NO_IDS
        self._am = self._as = _NO_IDS32  # the counter columns' metric and series ids, laid end to end
        self._n_series = 1
        self._keys: np.ndarray | None = None
        self._pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # the last answer of ``facts``: (stale block rows, stale counter columns, the facts)
        self._stale: tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        # (set by ``build``: the node slots, the spare one included; ``newest``: the entries at the newest
        # time last asked, block rows and counter columns, and the slots they cover)
        self._n_slots = 1
        self._top: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def matches(self, key: tuple[object, ...], bs: np.ndarray, g_series: list[np.ndarray],
                g_valid: list[np.ndarray | None]) -> bool:
        k = self.key
        # the series table and the metric list by identity (both grow in place), the rest by value
        return (k[0] is key[0] and k[2] is key[2] and k[1:2] + k[3:] == key[1:2] + key[3:]
                and self._same_entries(bs)
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
        pair_b, pair_a, npe = self._numbering()
        u, n = np.unique(np.concatenate((pair_b[stale_b], pair_a[stale_a])), return_counts=True)
        gone = u[n == npe[u]]  # pairs none of whose entries is fresh
        if not gone.size:
            out = (self.present, self.retained, self.gpus)
        else:
            if self._keys is None:
                self._keys = np.flatnonzero(self._seen)  # each pair's bit, in pair order
            seen = self._seen.copy()
            seen[self._keys[gone]] = False
            out = tr._pair_facts(st, masks, seen)
        self._stale = (stale_b, stale_a, out)
        return out

    def build(self, tr: StructuralTracker, st: _SeriesTable, masks: _Masks, n_labelsets: int,
              n_metric_names: int) -> None:
        """What follows from the layout, in passes over the entries and no sort: the pairs are the set
        bits of a bitmap with a row of series per metric, set block by block and counter range by range
        (a scatter of the entries' series ids, no key per entry), their facts read off its rows
        (``_pair_facts``)."""
        is_up, is_dur, _, is_target = masks
        blocks, cgroups, bs = self.blocks, self.cgroups, self.bs
        n_series, n_metrics = max(n_labelsets, 1), max(n_metric_names, 1)
        seen = np.zeros((n_metrics, n_series), bool)
        # per entry, the node whose newest time it counts for (not a target metric's entry, nor a
        # series without a node: the spare slot ``rank_n``), for a scatter-max each cycle
        node_of = st.node_of()
        slot = np.where(node_of >= 0, node_of, st.rank_n).astype(np.int32 if st.rank_n < 2**31 else np.int64)
        # A block with the same series as the block before (one exporter's metrics: every GPU's series,
        # in the same order) copies that block's bitmap row, and joins its run: consecutive blocks with
        # the same node slots, kept once (``b_node``: each run's slots, end to end) and scattered once,
        # the elementwise maximum of the run's times (``newest``). A compare per block, no scatter or
        # gather of its entries (which would also cast its series ids to intp first).
        runs: list[list[int]] = []  # [first entry, entries per block, blocks]
        slots: list[np.ndarray] = []
        at, prev = 0, (-1, -1, -1)  # (the block before: its first entry, entries, metric)
        for a, b, m in blocks:
            n = b - a
            same = prev[1] == n and _same(bs[prev[0]:prev[0] + n], bs[at:at + n])
            if same:
                seen[m] = seen[prev[2]]
            else:
                seen[m][bs[at:at + n]] = True
            if same and not is_target[m] and not is_target[prev[2]]:
                runs[-1][2] += 1
            else:
                runs.append([at, n, 1])
                slots.append(np.full(n, st.rank_n, slot.dtype) if is_target[m] else slot[bs[at:at + n]])
            prev = (at, n, m)
            at += n
        self.b_node = _cat(slots, np.zeros(0, slot.dtype))
        self._b_runs = [(a, n, k) for a, n, k in runs]
        # the entries' series, each run's first block only (a copy: the view's arrays are the history's):
        # a cold 100k-GPU cycle's 2.4M entries are 3 runs of 100k
        self._bs_heads = np.concatenate([bs[a:a + n] for a, n, _ in runs]) if runs else bs[:0].copy()
        for (_, ranges, _), s, v in zip(cgroups, self.g_series, self.g_valid, strict=True):
            for c0, c1, m in ranges:  # (a history's counter columns are its ranges, end to end)
                seen[m][s[c0:c1] if v is None else s[c0:c1][v[c0:c1]]] = True
        self._seen, self._n_series = seen.reshape(-1), n_series
        # (numbered when an entry first goes stale, each pair's bit when a pair does: neither in a
        # steady fleet, nor in its first cycles)
        self._pairs = self._keys = None
        self.present, self.retained, self.gpus = tr._pair_facts(st, masks, self._seen)
        self._am, self._as = am, as_ = _columns(cgroups, self.g_series, self.g_valid)
        self.a_node = slot[as_]
        self._n_slots, self._top = st.rank_n + 1, None
        self.a_node[is_target[am]] = st.rank_n
        # per target metric (up, scrape duration): its block rows, their series, whether one row each and
        # in series order (then the latest fresh value of each is its row's when every row is fresh)
        rows_of: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        at = 0
        for a, b, m in blocks:
            if is_target[m]:
                for mask, parts in zip((is_up, is_dur), rows_of, strict=True):
                    if mask[m]:
                        parts.append(np.arange(at, at + b - a))
            at += b - a
        self.targets: list[tuple[np.ndarray, np.ndarray, bool]] = []
        for rows_l in rows_of:
            rows = _cat(rows_l, _NO_IDS)
            sids = bs[rows].astype(np.int64)
            self.targets.append((rows, sids, sids.size < 2 or bool((sids[1:] > sids[:-1]).all())))
        self.bs = _NO_IDS32  # (the view's array: not kept past this call)
        self.built = True

    def _same_entries(self, bs: np.ndarray) -> bool:
        """Whether ``bs`` are the entries' series (``_bs_heads``, run by run)."""
        if bs.size != self._nb or self._b_runs is None:
            return False
        at = 0
        for a, n, k in self._b_runs:
            if not bool((bs[a:a + n * k].reshape(k, n) == self._bs_heads[at:at + n]).all()):
                return False
            at += n
        return True

    def _entries(self) -> np.ndarray:
        """The entries' series, every block's (``_bs_heads`` repeated over each run's blocks)."""
        heads, runs = self._bs_heads, self._b_runs or []
        parts, at = [], 0
        for _, n, k in runs:
            parts.append(np.tile(heads[at:at + n], k))
            at += n
        return _cat(parts, heads[:0])

    def newest(self, bt: np.ndarray, ta: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Per node slot (``b_node``/``a_node``, the spare slot last), the newest time of its entries
        (block rows' times ``bt``, counter columns' ``ta``; -inf: none), exact for the nodes ``need``
        flags (the others may get the newest time of all: the caller drops them). A scatter-max over the
        entries (a run of blocks with the same slots: the elementwise maximum of their times, scattered
        once), unless the entries at the newest time of all are those of the last call (a steady fleet
        read in one scrape; its value-start and derived rows older) and cover every node needed: then
        that time for the nodes they covered (``_top``), no scatter."""
        out = np.full(self._n_slots, -np.inf)
        tops = [t.max() for t in (bt, ta) if t.size]
        if not tops:
            return out
        exact = all(t == t for t in tops)  # (a NaN time: scattered, as np.maximum spreads it)
        if exact:
            t_max = max(tops)
            at_b, at_a = bt == t_max, ta == t_max
            c = self._top
            if c is not None and _same(c[0], at_b) and _same(c[1], at_a) and not (need & ~c[2][:-1]).any():
                out[c[2]] = t_max
                return out
        runs = self._b_runs
        if runs is None:  # (slots per entry)
            np.maximum.at(out, self.b_node, bt)
        else:
            at = 0
            for a, n, k in runs:  # a run's blocks: the same slots, their times' maximum scattered once
                np.maximum.at(out, self.b_node[at:at + n], bt[a:a + n] if k == 1 else bt[a:a + n * k].reshape(k, n).max(axis=0))
                at += n
        np.maximum.at(out, self.a_node, ta)
        if exact and t_max > -np.inf:  # the slots with an entry at the newest time of all: those whose
            self._top = (at_b, at_a, out == t_max)  # newest it is (-inf: also the slots with no entry)
        return out

    def _numbering(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each entry's pair (block rows, counter columns: pairs numbered in bit order, a running count
        of the bitmap, which is the order of their keys, metric * series count + series) and the
        entries per pair."""
        if self._pairs is None:
            nb, n_series = self._nb, self._n_series
            kt = np.int32 if self._seen.size < 2**31 else np.int64
            keys: np.ndarray = np.concatenate((_block_metrics(self.blocks, nb), self._am)).astype(kt)
            keys *= kt(n_series)
            keys += np.concatenate((self._entries(), self._as))
            pair = np.cumsum(self._seen, dtype=kt)[keys]
            pair -= 1
            npe = np.bincount(pair, minlength=int(pair.max()) + 1 if pair.size else 0)
            self._pairs = (pair[:nb], pair[nb:], npe)
        return self._pairs

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

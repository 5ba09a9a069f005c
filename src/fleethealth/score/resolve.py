"""Label-set resolution: every interned label set -> its entity keys (gpu, node, replica, rank).

Theory of operation
-------------------
A snapshot's samples point at interned label sets, shared by every metric of a GPU. ``_Resolver`` maps
each label set once to the key ids of the entities it describes (gpu ``node/gpuN``, node, replica, rank
``job/rankN``) and keeps per-label-set answers the engine asks for again and again (a label's float
value, a match's verdict, a peer group id). It is append-only: reused while the snapshot's label-set list
only grows (the history and the simulator keep one list), so a label set is resolved once for the life
of a stream. New label sets are read column by column with C-level maps, a chunk at a time (a cold
100k-GPU cycle resolves ~112k of them; a chunk whose label sets all have the same labels is transposed,
not made into a dict per label set, and only the labels asked for are read out: ``_Columns``): key ids are kept
per kind by display name (a node's or replica's is the label's own string), new ones handed out in the order a
loop over the label sets would (by first label set, then node, gpu, replica, rank). A chunk's values are coded
by a small dict of its own, so a kind's big dict of every key is touched once per distinct value: written
with the id the value takes if it is new (``setdefault``; a cold cycle's values all are), renumbered among
the new ones when some were known. A grouping label's values are kept per chunk as read and spelled out
per label set when the label is first asked for (``_label_col``: a policy names labels a fleet may not
have); peer-group ids are coded per distinct value, not per label set, and kept as arrays that the new
label sets' ids are added to. Which resolver serves a snapshot is the scorer's choice (``_resolver_for``, kept in
``Kept.resolvers``). ``_KindTable`` is one kind's entities for one cycle: key id <-> entity index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, count, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.memory import gc_paused
from fleethealth.policy import Policy
from fleethealth.score.health import EntityKind
from fleethealth.signals.snapshot import LabelSet, Snapshot, label_float

if TYPE_CHECKING:
    from fleethealth.score.kept import Kept

KINDS: tuple[EntityKind, ...] = ("gpu", "node", "replica", "rank")
UNNAMED_NODE = "(no-node-label)"
_UPDATE_CHUNK = 2048  # label sets resolved together: their dicts stay in the CPU cache across the columns


class _Resolver:
    """Maps label sets to entity key ids. Append-only: re-used while the snapshot's label-set list
    only grows (the history and the simulator keep one list), so each label set is resolved once."""

    def __init__(self, node_labels: Sequence[str], replica_labels: Sequence[str],
                 grouping: Sequence[str] = ()) -> None:
        self.node_labels = tuple(node_labels)
        self.replica_labels = tuple(replica_labels)
        # Labels peer groups are asked by (``grouping_labels``): each one's exposed value and whether it
        # came from ``exported_<name>``, per label set, read in ``update``'s one pass over the new label
        # sets (a pass of its own per label costs ~0.15 s at 100k GPUs, three of them on a cold start).
        # Kept per chunk as read (``_segs``: the chunk's size, the label's values or None when no label set
        # has it, the exported_<name> values or None) and made into per-label-set lists when a label is
        # first asked for (``_label_col``): a policy names labels a fleet may not have at all (model,
        # role, peer_group on a dcgm-exporter fleet), and those are never spelled out per label set.
        self._segs: dict[str, list[tuple[int, Sequence[Any] | None, Sequence[str | None] | None]]] = {
            k: [] for k in dict.fromkeys(grouping)}
        self._lcols: dict[str, tuple[list[str], list[bool], int]] = {}
        self.n = 0
        # Key ids: per kind, an entity's name without the kind prefix (its display name) -> key id. The
        # key's name is "<kind>:<display>" (``key_names``); kept per kind, a node's or replica's display
        # name is the label value itself (no string made per label set) and a GPU's is made once.
        self.kind_ix: dict[str, dict[str, int]] = {k: {} for k in KINDS}
        self.key_kind: list[int] = []  # key id -> its kind's position in ``_ORDER``
        # key id -> node key id (for gpu keys), else -1: arrays of new keys' in order (``key_node_arr``; a
        # list of 100k Python ints was 4 MB more on a cold 100k-GPU cycle)
        self._key_node_parts: list[np.ndarray] = []
        self._n_key_node = 0
        self.display: list[str] = []  # key id -> entity name without the kind prefix
        self._parts: dict[str, list[np.ndarray]] = {k: [] for k in KINDS}  # key ids of chunks not in ``arr``
        self.arr: dict[str, np.ndarray] = {}
        self.labelsets: list[LabelSet] | None = None
        self._groups: dict[tuple[str, ...], tuple[int, dict[tuple[str, ...], int], np.ndarray]] = {}
        self._exported: dict[tuple[str, ...], np.ndarray] = {}
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
        """Per label set, the id of its peer group (the values of ``labels``); incremental, cached.
        A label a scraper displaced (``exported_<name>``, Prometheus' honor_labels: false) counts with
        the exporter's own value: a rank sample's training job, never the scrape job shared by all.
        The new label sets' ids and flags are arrays added to the kept ones (not a list of every label
        set's id made into an array again each time some are added)."""
        assert self.labelsets is not None
        n_done, keys, arr = self._groups.get(labels, (0, {}, np.zeros(0, np.int64)))
        if n_done < len(self.labelsets):
            if all(k in self._segs and self._absent_from(k, n_done) for k in labels):
                # none of the new label sets has any of the labels (a policy's grouping labels a fleet
                # does not carry, ~9 ms each at 100k GPUs spelled out): one tuple of "", no exported flag
                m = len(self.labelsets) - n_done
                ids = np.full(m, keys.setdefault(("",) * len(labels), len(keys)), np.int64)
                flags = np.zeros(m, bool)
            elif all(k in self._segs for k in labels):
                cols = [self._label_col(k) for k in labels]  # as long as the label sets (``update``)
                ids = _first_ids([c[0][n_done:] for c in cols], keys)
                if len(cols) == 1:
                    flags = np.asarray(cols[0][1][n_done:], bool)
                else:
                    flags = np.fromiter(map(any, zip(*[c[1][n_done:] for c in cols], strict=True)), bool)
            else:
                id_list: list[int] = []
                flag_list: list[bool] = []
                for ls in self.labelsets[n_done:]:
                    d = dict(ls)
                    key = tuple(exposed_label(d, k) for k in labels)
                    id_list.append(keys.setdefault(key, len(keys)))
                    flag_list.append(any(d.get("exported_" + k) for k in labels))
                ids, flags = np.asarray(id_list, np.int64), np.asarray(flag_list, bool)
            arr = np.concatenate((arr, ids)) if n_done else ids
            old = self._exported.get(labels)
            self._exported[labels] = np.concatenate((old, flags)) if n_done and old is not None else flags
            self._groups[labels] = (len(self.labelsets), keys, arr)
        return arr

    def _absent_from(self, label: str, start: int) -> bool:
        """Whether no label set from ``start`` on has ``label`` or ``exported_<label>`` (by the chunks read:
        a chunk reaching back before ``start`` counts whole)."""
        at = self.n
        for n, vs, xs in reversed(self._segs[label]):
            if at <= start:
                break
            if vs is not None or xs is not None:
                return False
            at -= n
        return True

    @property
    def _label_cols(self) -> dict[str, tuple[list[str], list[bool]]]:
        """Per grouping label, each label set's exposed value and whether it came from exported_<name>."""
        return {k: self._label_col(k) for k in self._segs}

    def _label_col(self, label: str) -> tuple[list[str], list[bool]]:
        """``label``'s values and exported flags per label set (as ``exposed_label`` reads it), its
        chunks read so far spelled out on the lists kept for it."""
        vals, exp, done = self._lcols.get(label, ([], [], 0))
        segs = self._segs[label]
        for n, vs, xs in segs[done:]:
            if xs is not None and any(xs):
                vals.extend([x or v for x, v in zip(xs, vs if vs is not None else repeat("", n), strict=True)])
                exp.extend(map(bool, xs))
            else:
                vals.extend(vs if vs is not None else repeat("", n))
                exp.extend(repeat(False, n))
        self._lcols[label] = (vals, exp, len(segs))
        return vals, exp

    def group_exported(self, labels: tuple[str, ...]) -> np.ndarray:
        """Per label set, whether its peer group took a label from ``exported_<name>`` (``group_ids``)."""
        self.group_ids(labels)
        return self._exported[labels]

    def group_values(self, labels: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The label values of each id ``group_ids(labels)`` hands out, by id (``""``: label absent)."""
        self.group_ids(labels)
        keys = self._groups[labels][1]
        out: list[tuple[str, ...]] = [()] * len(keys)
        for key, i in keys.items():
            out[i] = key
        return out

    @property
    def n_keys(self) -> int:
        return len(self.display)

    @property
    def key_names(self) -> list[str]:
        """Every key's name, "<kind>:<display name>", by key id."""
        return list(map(str.__add__, map(_PREFIXES.__getitem__, self.key_kind), self.display))

    def _kid(self, kind: EntityKind, display: str, node_kid: int = -1) -> int:
        """The key id of ``kind``'s entity ``display`` (a new one: the next id)."""
        ix = self.kind_ix[kind].get(display)
        if ix is None:
            ix = self.kind_ix[kind][display] = len(self.display)
            self.display.append(display)
            self.key_kind.append(_ORDER.index(kind))
            self._key_node_parts.append(np.array([node_kid], np.int64))
            self._n_key_node += 1
        return ix

    def update(self, labelsets: list[LabelSet]) -> None:
        if len(labelsets) == self.n:
            return
        # Column by column with C-level maps (a cold 100k-GPU cycle resolves 100k label sets, and a loop
        # per label set cost ~0.4 s); the key ids are handed out in the order they always were: label set
        # by label set, node, gpu, replica, rank.
        for lo in range(self.n, len(labelsets), _UPDATE_CHUNK):
            self._update_chunk(labelsets[lo : lo + _UPDATE_CHUNK])
        self.n = len(labelsets)
        self.arr = {k: np.concatenate([self.arr[k], *self._parts[k]] if k in self.arr else self._parts[k])
                    for k in KINDS}
        self._parts = {k: [] for k in KINDS}
        self.labelsets = labelsets

    @property
    def cols(self) -> dict[str, list[int]]:
        """Per kind, each label set's key id (-1: none), as lists (``arr``: the same as arrays)."""
        return {k: self.arr[k].tolist() if k in self.arr else [] for k in KINDS}

    def _update_chunk(self, new: list[LabelSet]) -> None:
        n = len(new)
        col = _Columns(new)
        for k, segs in self._segs.items():
            vs = col.get(k)
            if vs is not None and col.pairs is None:
                vs = list(col.get_or(k, ""))  # (read as dicts: "" where a label set lacks it)
            segs.append((n, vs, col.get("exported_" + k)))
        nodes = col.first_set(self.node_labels)
        gpus = col.get("gpu") or [None] * n
        if not all(nodes) and any(gpus):
            # A GPU sample without any node label (a bare exporter file): scored under a visible
            # placeholder node rather than silently dropped.
            nodes = [node or (UNNAMED_NODE if g else node) for node, g in zip(nodes, gpus, strict=True)]
        reps = col.first_set(self.replica_labels)
        # Each kind's entity per label set by its name without the kind prefix (its display name, "" or
        # None: no such entity): a node's or replica's is the label's own string (shared by a page's label
        # sets: coded through a dict of the distinct ones), a GPU's and a rank's made per label set.
        if col.get("gpu") is None:
            gpu_d: list[str] = []  # (no gpu label anywhere: none)
        elif all(nodes) and all(gpus):  # (every label set names both: a page of GPUs)
            gpu_d = list(map("/gpu".join, zip(nodes, gpus, strict=True)))  # type: ignore[arg-type]
        else:
            gpu_d = [f"{x}/gpu{g}" if x and g else "" for x, g in zip(nodes, gpus, strict=True)]
        ranks = col.get("rank")
        if ranks is not None:
            xjobs = col.get("exported_job")
            jobs = ([x or j for x, j in zip(xjobs, col.get_or("job", ""), strict=True)]
                    if xjobs is not None and any(xjobs) else col.get_or("job", ""))
            rank_d = [f"{j}/rank{r}" if (j and r is not None and r != "") else ""
                      for j, r in zip(jobs, ranks, strict=True)]
        else:
            rank_d = []  # (no rank anywhere: none)
        cols: list[list[Any]] = [nodes, gpu_d, reps, rank_d]
        ixs = [self.kind_ix[k] for k in _ORDER]
        # Per kind, each label set's value coded by a small dict of the chunk's distinct values (one
        # ``setdefault`` per label set: the index of the label set the value first appears in), so the
        # kind's big dict of every key (cache misses at 100k GPUs) is asked once per distinct value.
        firsts: list[np.ndarray | None] = []  # per label set: the first label set in the chunk with its value
        rows_k: list[np.ndarray] = []  # per kind: the first label set of each distinct value
        names_k: list[list[str]] = []  # per kind: the distinct values, in order of first appearance
        for c in cols:
            if not c:
                firsts.append(None)
                rows_k.append(np.zeros(0, np.int64))
                names_k.append([])
                continue
            seen: dict[Any, int] = {}
            firsts.append(np.fromiter(map(seen.setdefault, c, count()), np.int64, n))
            seen.pop(None, None)  # no entity of this kind
            seen.pop("", None)
            rows_k.append(np.fromiter(seen.values(), np.int64, len(seen)))
            names_k.append(list(seen))
        # New keys take the next ids in the order they always did: label set by label set, and within
        # one node, gpu, replica, rank (so: by first label set * 4 + kind). Each distinct value is written
        # into its kind's dict with the id it takes if every value is new (``setdefault``: the big dict
        # is touched once per value, as a cold cycle's values all are new); a value found there keeps its
        # id (never one of the new ids), and when some were found the new ones are numbered again alone.
        start = len(self.display)
        lens = [len(x) for x in names_k]
        at = np.concatenate([r * 4 + kn for kn, r in enumerate(rows_k)])
        order, want = _new_ids(at, start)
        got_k: list[np.ndarray] = []
        fresh_k: list[np.ndarray] = []
        lo = 0
        for names, ix, m in zip(names_k, ixs, lens, strict=True):
            w = want[lo : lo + m]
            lo += m
            got = np.fromiter(map(ix.setdefault, names, w.tolist()), np.int64, m)
            got_k.append(got)
            fresh_k.append(got == w)
        n_new = sum(int(f.sum()) for f in fresh_k)
        if n_new != at.size:  # some were known: number the new ones alone, in the same order
            at = np.concatenate([r[f] * 4 + kn for kn, (r, f) in enumerate(zip(rows_k, fresh_k, strict=True))])
            order, want = _new_ids(at, start)
            lo = 0
            for kn, (names, ix) in enumerate(zip(names_k, ixs, strict=True)):
                f = fresh_k[kn]
                m = int(f.sum())
                if m:
                    w = want[lo : lo + m]
                    lo += m
                    got_k[kn][f] = w
                    names_k[kn] = list(compress(names, f.tolist()))
                    ix.update(zip(names_k[kn], w.tolist(), strict=True))
                else:
                    names_k[kn] = []
        if at.size:
            new_disp = [x for names in names_k for x in names]
            if order is not None:
                at = at[order]
                new_disp = list(itemgetter(*order.tolist())(new_disp))
            self.display.extend(new_disp)
            kinds = at & 3
            self.key_kind.extend(kinds.tolist())
        # per label set, each kind's key id
        ids: list[np.ndarray] = []
        for first, r, got in zip(firsts, rows_k, got_k, strict=True):
            if first is None:
                ids.append(np.full(n, -1, np.int64))
                continue
            kid = np.full(n, -1, np.int64)  # by the first label set of each value
            kid[r] = got
            ids.append(kid[first])
        if at.size:
            # a new gpu key's node: the node of the first label set naming it
            part = np.where(kinds == 1, ids[0][at >> 2], -1)
            self._key_node_parts.append(part)
            self._n_key_node += part.size
        for kind, kids in zip(_ORDER, ids, strict=True):
            self._parts[kind].append(kids)

    def display_names(self, ids: np.ndarray) -> list[str]:
        # (picked from the list: an object array of every key, made once per new key set, cost more
        # than the pick in a cold cycle, and the tables asking for names are kept while the keys are)
        return list(map(self.display.__getitem__, ids.tolist())) if ids.size else []

    @property
    def key_node_arr(self) -> np.ndarray:
        """key id -> node key id (gpu keys), else -1; as an array, rebuilt only when keys were added."""
        if self._key_node_arr.size != self._n_key_node:
            self._key_node_arr = np.concatenate((self._key_node_arr, *self._key_node_parts)).astype(np.int64, copy=False)
            self._key_node_parts = []
        return self._key_node_arr

    @property
    def key_node(self) -> list[int]:
        """key id -> node key id (gpu keys), else -1; as a list."""
        return self.key_node_arr.tolist()


# The kinds in the order a label set's keys are handed out (node first: a new gpu key names its node's)
_ORDER: tuple[EntityKind, ...] = ("node", "gpu", "replica", "rank")
_PREFIXES = tuple(k + ":" for k in _ORDER)


def _new_ids(at: np.ndarray, start: int) -> tuple[np.ndarray | None, np.ndarray]:
    """New keys' ids from their places ``at`` (first label set * 4 + kind, in kind order): ids from
    ``start`` on in the order of ``at``. Returns the sorting order (None: ``at`` is sorted already) and
    each key's id, in ``at``'s own order."""
    if at.size > 1 and not (at[1:] > at[:-1]).all():
        order = np.argsort(at)
        ids = np.empty(at.size, np.int64)
        ids[order] = np.arange(start, start + at.size)
        return order, ids
    return None, np.arange(start, start + at.size)


class _Columns:
    """A chunk of label sets read label by label: ``get(label)`` is each label set's value (None where it
    has none), or None when none of them has the label. Label sets that all have the same labels (a
    page's GPUs, a tracker's nodes: the common case) are transposed, every label's values one tuple,
    without a dict per label set (half the cost of a cold resolve, ~0.07 s at 100k GPUs); otherwise each
    becomes a dict and a label is looked up in each."""

    def __init__(self, new: list[LabelSet]) -> None:
        self.n = len(new)
        self.pairs: dict[str, tuple[tuple[str, str], ...]] | None = _transposed(new)
        self.cols: dict[str, Sequence[str]] = {}  # values read out of ``pairs``: only labels asked for
        self.ds: list[dict[str, str]] = []
        self.present: set[str] = set()
        if self.pairs is None:
            self.ds = list(map(dict, new))
            self.present = set().union(*self.ds)  # a label none has is not looked up in each

    def get(self, label: str) -> Sequence[str | None] | None:
        if self.pairs is not None:
            c = self.cols.get(label)
            if c is None:
                at = self.pairs.get(label)
                if at is None:
                    return None
                c = self.cols[label] = list(map(_VALUE, at))
            return c
        return list(map(dict.get, self.ds, repeat(label))) if label in self.present else None

    def get_or(self, label: str, default: str) -> Iterable[str]:
        """Each label set's value of ``label``, ``default`` where it has none."""
        if self.pairs is not None:
            c = self.get(label)
            return repeat(default, self.n) if c is None else c  # type: ignore[return-value]
        return map(dict.get, self.ds, repeat(label), repeat(default)) if label in self.present \
            else repeat(default, self.n)

    def first_set(self, labels: Sequence[str]) -> list[str | None]:
        """Per label set, the first of ``labels`` with a non-empty value, else a falsy value (None or ""),
        as a loop over ``labels`` taking the first that is set reads it."""
        out: list[str | None] | None = None
        for k in labels:
            if out is not None and all(out):  # every one set: a later label changes nothing
                break
            c = self.get(k)
            if c is None:
                continue
            out = list(c) if out is None else [a or b for a, b in zip(out, c, strict=True)]
        return [None] * self.n if out is None else out


def _transposed(new: list[LabelSet]) -> dict[str, tuple[tuple[str, str], ...]] | None:
    """Label -> every label set's (label, value) pair, when all of ``new`` have the same labels at the
    same positions (else None): one zip per position, the labels checked on the way (a label twice in a
    label set: the last, as a dict of it reads it). The values are read out only for the labels asked for
    (``_Columns.get``: about half of a dcgm-exporter label set's)."""
    if not new or len(set(map(len, new))) != 1:
        return None
    cols: dict[str, tuple[tuple[str, str], ...]] = {}
    for at in zip(*new, strict=True):
        keys = list(map(_KEY, at))
        k = keys[0]
        if keys.count(k) != len(keys):
            return None
        cols[k] = at
    return cols


_KEY, _VALUE = itemgetter(0), itemgetter(1)


def _first_ids(cols: list[list[str]], keys: dict[tuple[str, ...], int]) -> np.ndarray:
    """Per row of ``cols`` (one list of values per label), the id of its tuple of values in ``keys``,
    a new tuple taking the next id in order of first appearance (as a loop over the rows with
    ``keys.setdefault`` hands them out), with a Python step per distinct tuple, not per row: each label's
    values are coded by C-level dict maps (codes in order of first appearance); a label with one value
    throughout does not tell rows apart, and several labels that do are combined on arrays."""
    n = len(cols[0]) if cols else 0
    if n == 0:
        return np.zeros(0, np.int64)
    firsts = [dict.fromkeys(vals) for vals in cols]
    varying = [i for i, f in enumerate(firsts) if len(f) > 1]
    if len(varying) <= 1:
        # the tuples follow one label's values (or there is one tuple): that label's codes are the
        # tuples' order of first appearance
        v = varying[0] if varying else 0
        const = [next(iter(f)) for f in firsts]
        vmap = {}
        for x in firsts[v]:
            const[v] = x
            vmap[x] = keys.setdefault(tuple(const), len(keys))
        if len(vmap) == 1:  # one tuple throughout (a label no label set has: the common case)
            return np.full(n, next(iter(vmap.values())), np.int64)
        return np.fromiter(map(vmap.__getitem__, cols[v]), np.int64, n)
    key = np.zeros(n, np.int64)
    radix = 1
    for i in varying:
        vmap = {x: c for c, x in enumerate(firsts[i])}
        if radix * len(vmap) >= 2**62:  # (never with real labels) the rows one by one
            return np.asarray([keys.setdefault(k, len(keys)) for k in zip(*cols, strict=True)], np.int64)
        key += np.fromiter(map(vmap.__getitem__, cols[i]), np.int64, n) * radix
        radix *= len(vmap)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    ids = np.zeros(first.size, np.int64)
    for u in np.argsort(first, kind="stable").tolist():  # distinct tuples, in order of first appearance
        row = int(first[u])
        ids[u] = keys.setdefault(tuple(c[row] for c in cols), len(keys))
    return ids[inv.reshape(-1)]


def exposed_label(labels: Mapping[str, str], name: str) -> str:
    """The exporter's own value of a label: ``exported_<name>`` when a scraper displaced it (Prometheus'
    honor_labels: false renames a page's ``job`` so), else ``name``; ``""`` when absent."""
    return labels.get("exported_" + name) or labels.get(name, "")


def grouping_labels(policy: Policy) -> tuple[str, ...]:
    """The labels a policy groups peers by (``group_ids`` asks for them every cycle): the expectation
    model's GPU and replica groups, with their aliases (score/expect.py), and every peer signal's
    ``peer_by``."""
    from fleethealth.score.expect import _ALIASES  # (expect imports this module's types)

    ex = policy.expectation
    labels = [a for k in (*ex.gpu_group_by, *ex.replica_group_by) for a in _ALIASES.get(k, (k,))]
    labels += [k for s in policy.signals for k in s.peer_by]
    return tuple(dict.fromkeys(labels))


def _resolver_for(kept: Kept, snap: Snapshot, policy: Policy) -> _Resolver:
    grouping = grouping_labels(policy)
    key = (id(snap.labelsets), tuple(policy.node_labels), tuple(policy.replica_labels), grouping)
    r = kept.resolvers.get(key)
    # Identity alone could be recycled after garbage collection: also require the list object to match
    # and never to have shrunk or been rewritten (first label set unchanged).
    if r is None or r.labelsets is not snap.labelsets or len(snap.labelsets) < r.n:
        r = _Resolver(policy.node_labels, policy.replica_labels, grouping)
        if len(kept.resolvers) >= 8:
            kept.resolvers.pop(next(iter(kept.resolvers)))
        kept.resolvers[key] = r
    with gc_paused():  # (new label sets: a cold 100k-GPU cycle makes ~300k keys and ids, no cycles)
        r.update(snap.labelsets)
    return r


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


@dataclass
class _KindTable:
    kind: EntityKind
    key_ids: np.ndarray  # resolver key id per entity
    lut: np.ndarray  # resolver key id -> entity index (-1)
    names: list[str]

    def entities(self, kid: np.ndarray) -> np.ndarray:
        """Entity index per resolver key id (-1: no key, or no entity of this kind)."""
        return np.where(kid >= 0, self.lut[np.maximum(kid, 0)], -1)

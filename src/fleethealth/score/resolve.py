"""Label-set resolution: every interned label set -> its entity keys (gpu, node, replica, rank).

Theory of operation
-------------------
A snapshot's samples point at interned label sets, shared by every metric of a GPU. ``_Resolver`` maps
each label set once to the key ids of the entities it describes (gpu ``node/gpuN``, node, replica, rank
``job/rankN``) and keeps per-label-set answers the engine asks for again and again (a label's float
value, a match's verdict, a peer group id). It is append-only: reused while the snapshot's label-set list
only grows (the history and the simulator keep one list), so a label set is resolved once for the life
of a stream. Which resolver serves a snapshot is the scorer's choice (``_resolver_for``, kept in
``Kept.resolvers``). ``_KindTable`` is one kind's entities for one cycle: key id <-> entity index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
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
        self._label_cols: dict[str, tuple[list[str], list[bool]]] = {k: ([], []) for k in dict.fromkeys(grouping)}
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
        self._exported: dict[tuple[str, ...], list[bool]] = {}
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
        the exporter's own value: a rank sample's training job, never the scrape job shared by all."""
        assert self.labelsets is not None
        n_done, keys, ids, arr = self._groups.get(labels, (0, {}, [], np.zeros(0, np.int64)))
        if n_done < len(self.labelsets) and all(k in self._label_cols for k in labels):
            exported = self._exported.setdefault(labels, [])
            cols = [self._label_cols[k] for k in labels]  # as long as the label sets (``update``)
            for key in zip(*[c[0][n_done:] for c in cols], strict=True):
                i = keys.get(key)
                if i is None:
                    i = keys[key] = len(keys)
                ids.append(i)
            if len(cols) == 1:
                exported.extend(cols[0][1][n_done:])
            else:
                exported.extend(map(any, zip(*[c[1][n_done:] for c in cols], strict=True)))
            arr = np.asarray(ids, np.int64)
            self._groups[labels] = (len(self.labelsets), keys, ids, arr)
        elif n_done < len(self.labelsets):
            exported = self._exported.setdefault(labels, [])
            for ls in self.labelsets[n_done:]:
                d = dict(ls)
                key = tuple(exposed_label(d, k) for k in labels)
                ids.append(keys.setdefault(key, len(keys)))
                exported.append(any(d.get("exported_" + k) for k in labels))
            arr = np.asarray(ids, np.int64)
            self._groups[labels] = (len(self.labelsets), keys, ids, arr)
        return arr

    def group_exported(self, labels: tuple[str, ...]) -> np.ndarray:
        """Per label set, whether its peer group took a label from ``exported_<name>`` (``group_ids``)."""
        self.group_ids(labels)
        flags = self._exported[labels]
        arr = self._arrays.get(("x", labels))
        if arr is None or arr.size != len(flags):
            arr = self._arrays[("x", labels)] = np.asarray(flags, bool)
        return arr

    def group_values(self, labels: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The label values of each id ``group_ids(labels)`` hands out, by id (``""``: label absent)."""
        self.group_ids(labels)
        keys = self._groups[labels][1]
        out: list[tuple[str, ...]] = [()] * len(keys)
        for key, i in keys.items():
            out[i] = key
        return out

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
        # Column by column with C-level maps (a cold 100k-GPU cycle resolves 100k label sets, and a loop
        # per label set and grouping label cost ~0.4 s); only the key ids are handed out label set by
        # label set, in the order they always were.
        for lo in range(self.n, len(labelsets), _UPDATE_CHUNK):
            self._update_chunk(labelsets[lo : lo + _UPDATE_CHUNK])
        self.n = len(labelsets)
        self.arr = {k: np.asarray(v, np.int64) for k, v in self.cols.items()}
        self.labelsets = labelsets

    def _update_chunk(self, new: list[LabelSet]) -> None:
        gpu_c, node_c, rep_c, rank_c = (self.cols[k] for k in KINDS)
        ds = list(map(dict, new))
        n = len(ds)
        for k, (vals, exp) in self._label_cols.items():  # as ``exposed_label`` reads it
            xs = list(map(dict.get, ds, repeat("exported_" + k)))
            if any(xs):
                vals.extend([x or d.get(k, "") for x, d in zip(xs, ds, strict=True)])
                exp.extend(map(bool, xs))
            else:
                vals.extend(map(dict.get, ds, repeat(k), repeat("")))
                exp.extend(repeat(False, n))
        nodes = _first_set(ds, self.node_labels)
        reps = _first_set(ds, self.replica_labels)
        gpus = list(map(dict.get, ds, repeat("gpu")))
        xjobs = list(map(dict.get, ds, repeat("exported_job")))
        jobs = [x or d.get("job", "") for x, d in zip(xjobs, ds, strict=True)] if any(xjobs) else list(
            map(dict.get, ds, repeat("job"), repeat("")))
        ranks = list(map(dict.get, ds, repeat("rank")))
        key_ix = self.key_ix
        for node, g, rep, job, rank in zip(nodes, gpus, reps, jobs, ranks, strict=True):
            if not node and g:
                # A GPU sample without any node label (a bare exporter file): scored under a visible
                # placeholder node rather than silently dropped.
                node = UNNAMED_NODE
            node_kid = -1
            if node:
                name = "node:" + node
                node_kid = key_ix.get(name, -1)
                if node_kid < 0:
                    node_kid = self._kid(name)
            node_c.append(node_kid)
            if node and g:
                name = f"gpu:{node}/gpu{g}"
                gpu_kid = key_ix.get(name, -1)
                gpu_c.append(gpu_kid if gpu_kid >= 0 else self._kid(name, node_kid))
            else:
                gpu_c.append(-1)
            rep_c.append(self._kid("replica:" + rep) if rep else -1)
            rank_c.append(self._kid(f"rank:{job}/rank{rank}") if (job and rank is not None and rank != "") else -1)

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


def _first_set(ds: list[dict[str, str]], labels: Sequence[str]) -> list[str | None]:
    """Per label set (as a dict), the first of ``labels`` with a non-empty value (else the last one's
    value: None or "", both falsy), as a loop over ``labels`` taking the first that is set reads it."""
    if not labels:
        return [None] * len(ds)
    out: list[str | None] = list(map(dict.get, ds, repeat(labels[0])))
    for k in labels[1:]:
        out = [a or b for a, b in zip(out, map(dict.get, ds, repeat(k)), strict=True)]
    return out


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

"""The columnar result: ``FleetHealth``, its kinds made on first access and its tuples built lazily.

Theory of operation
-------------------
``FleetHealth.kinds`` maps each kind to its ``KindScores``, aggregated from the shared evaluation when
first read (the serving consumer's one reader, the router, reads replicas alone; GPUs and nodes come
together with the roll-up). ``HealthTuple`` objects are built on access, so a 100k-GPU fleet scores in a
fraction of a second; their metadata labels (``_MetaIndex``) are gathered lazily from the label sets of
an entity's samples and from the info metrics, for many rows in one pass where a caller asks for many
(``labels_many``: the decider's first decision asks for every node's). A result holds its scorer's memory weakly: read after the
scorer is gone, it aggregates with a memory of its own, the same numbers.

A label that changes (a driver upgraded or rolled back) is a new series with the new value; the old one
stays in a history view, stale, for its memory (an hour). Where an entity's series disagree on a label,
the series with the newest sample speaks (``_MetaIndex._by_freshness``), so the change is read the
cycle it is scraped, not when the old series is forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.policy import Policy
from fleethealth.score.aggregate import KindScores, _aggregate
from fleethealth.score.context import _Ctx
from fleethealth.score.expect import expected_by
from fleethealth.score.health import HealthTuple, SignalDetail
from fleethealth.score.kept import Kept
from fleethealth.score.resolve import KINDS, _KindTable, _uniq
from fleethealth.score.rollup import _roll_up_nodes
from fleethealth.signals.snapshot import InputIssue

if TYPE_CHECKING:
    from fleethealth.score.scorer import _Evaluation

NODE_INFO_METRIC = "fleethealth_node_info"
REPLICA_INFO_METRIC = "fleethealth_replica_info"
_GPU_SPECIFIC = frozenset(
    {"UUID", "pci_bus_id", "gpu", "device", "job", "pod", "container", "rank", "peer_group", "xid", "le"})


class _Kinds(Mapping[str, KindScores]):
    """``FleetHealth.kinds``: each kind's scores aggregated on first access, from the evaluation every
    consumer shares (a serving consumer's reader, the router, asks for replicas only). GPUs and nodes
    come together, the roll-up right after the GPUs' scores are made, so that it reads them as made,
    before any caller changes them in place. The same scores as made eagerly."""

    def __init__(self, ev: _Evaluation, how: str) -> None:
        self._ev, self._how = ev, how
        self._done: dict[str, KindScores] = {}
        self._own: Kept | None = None

    def _make(self, kind: str) -> KindScores:
        ev = self._ev
        specs, table, results = ev.specs[kind], ev.tables[kind], ev.results[kind]
        kind_cats = ev.kind_cats[kind]
        return _aggregate(
            table.kind, table.names, specs if table.names else [], results, self._how, kind_cats,
            ev.policy.critical_zeroes_category, ev.bases, ev.mats.get(kind), self._kept(), ev.expect.get(kind),
        )

    def _kept(self) -> Kept:
        """The scorer's memory this evaluation was made with (held weakly: a result kept after its
        scorer was dropped aggregates with a memory of its own, the same numbers)."""
        kept = self._ev.kept()
        if kept is None:
            if self._own is None:
                self._own = Kept()
            kept = self._own
        return kept

    def __getitem__(self, kind: str) -> KindScores:
        ks = self._done.get(kind)
        if ks is not None:
            return ks
        if kind not in KINDS:
            raise KeyError(kind)
        if kind in ("gpu", "node"):
            gpu, node = self._make("gpu"), self._make("node")
            gpu.member_of = self._ev.gpu_node
            _roll_up_nodes(gpu, node, self._ev.gpu_node, self._ev.roll_up, self._kept(),
                           self._ev.policy.lifecycle.min_confidence, self._ev.policy.expectation)
            self._done.update(gpu=gpu, node=node)
            return gpu if kind == "gpu" else node
        ks = self._done[kind] = self._make(kind)
        return ks

    def __iter__(self) -> Iterator[str]:
        return iter(KINDS)

    def __len__(self) -> int:
        return len(KINDS)


class _LazyTuples(Mapping[str, HealthTuple]):
    """``FleetHealth.tuples``: a result's tuples by entity id, built on first access into the result's cache."""

    def __init__(self, fh: FleetHealth) -> None:
        self._fh = fh
        self._cache = fh._tuple_cache

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
        self._tuple_cache: dict[str, HealthTuple] = {}

    @property
    def tuples(self) -> Mapping[str, HealthTuple]:
        """Tuples by entity id, built on first access. A new mapping per read over the one cache: a
        result holding a mapping that holds it back was a reference cycle, and the cycle kept the
        result's metadata index, its scoring context and the history view (rows, counter matrices)
        alive until a gc pass instead of freeing them when the caller drops the result."""
        return _LazyTuples(self)

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
            if not s.score or not (ks.expected[i, j] or not np.isnan(ks.age[i, j])):
                continue  # (a read-only signal is read by decisions, no detail of a health score)

            def f(a: np.ndarray, j: int = j) -> float | None:
                x = a[i, j]
                return None if np.isnan(x) else float(x)

            details.append(
                SignalDetail(
                    s.name, s.category, s.shape or "", f(ks.raw), f(ks.rate), f(ks.z), f(ks.sub), f(ks.age), s.weight,
                    ks.notes.get((i, j), "" if not np.isnan(ks.sub[i, j]) else ("stale" if not np.isnan(ks.age[i, j]) else "missing")),
                    expected_by(int(ks.expected_by[i, j]), ks.expect, i, j, ks.carry)
                    if ks.expected_by is not None else "",
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
        tuples = self.tuples
        for key in self._index:
            yield tuples[key]

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
        self._newest: np.ndarray | None = None
        # The series lists of entities whose series disagree on a label (the newest decided): their labels
        # depend on which series is newest, not only on which exist; ``winners`` says, for another view
        # of the same series, whether the same ones still win (``decide.loop`` reuses labels only then).
        self.by_freshness: set[tuple[int, ...]] = set()

    def _newest_sample(self, only: np.ndarray | None = None) -> np.ndarray:
        """Per label set, the time of its newest sample in this snapshot (-inf: none); ``only``: just
        those label sets (the others -inf). Asked only where an entity's series disagree on a label."""
        if only is None and self._newest is not None:
            return self._newest
        newest = np.full(len(self.snap.labelsets), -np.inf)
        index = self._ctx.index
        if index is None or (not index.counters and len(self.snap) > index.head[0].size):
            parts = [(self.snap.series_ids, self.snap.ts)]
        else:  # the view's gauge rows and each counter's latest sample: no counter rows written
            parts = [(index.head[1], index.head[3])]
            for mat in index.counters.values():
                has = np.flatnonzero(mat.last >= 0)
                parts.append((mat.series[has], mat.t[mat.last[has], has]))
        for series, ts in parts:
            series = series.astype(np.int64)
            if only is not None:
                keep = np.isin(series, only)
                series, ts = series[keep], ts[keep]
            if series.size:
                np.maximum.at(newest, series, ts)
        if only is None:
            self._newest = newest
        return newest

    def _by_freshness(self, series: list[int], newest: np.ndarray | None = None) -> list[int]:
        """``series`` newest sample first. Equal times (two series of one entity in the same scrape): the
        label set interned last first, the latest this stream has seen (a relabel interns the new one)."""
        if newest is None:
            newest = self._newest_sample()
            self.by_freshness.add(tuple(series))
        return sorted(series, key=lambda sid: (-float(newest[sid]), -sid))

    def winners(self, groups: Iterable[tuple[int, ...]]) -> tuple[int, ...]:
        """Per series list of ``by_freshness`` (of this view or an earlier one of the same series), the
        series that speaks for it in this view: equal answers, equal labels."""
        groups = sorted(groups)
        if not groups:
            return ()
        newest = self._newest_sample(np.unique(np.concatenate([np.asarray(g, np.int64) for g in groups])))
        return tuple(self._by_freshness(list(g), newest)[0] for g in groups)

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
                of_entity: dict[tuple[str, int], list[int]] = {}
                for sid in _uniq(series[idx].astype(np.int64)).tolist():
                    kid = int(r.arr[kind][sid])
                    if kid < 0 or kid >= tables[kind].lut.size:
                        continue
                    e = int(tables[kind].lut[kid])
                    if e >= 0:
                        of_entity.setdefault((kind, e), []).append(sid)
                for key, sids in of_entity.items():
                    if len(sids) > 1 and _disagree([self.snap.labelsets[sid] for sid in sids]):
                        sids = self._by_freshness(sids)[::-1]  # relabelled: the newest series applied last
                    merged = info.setdefault(key, {})
                    for sid in sids:
                        merged.update({k: v for k, v in self.snap.labelsets[sid] if k != "__name__"})
            self._info_cache = info
        return self._info_cache

    def _pairs_of(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(entity, series) pairs of ``kind``, sorted and unique (built on first use)."""
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
        return ent, ser

    def _merged(self, series: tuple[int, ...], agreed: bool = True) -> dict[str, str] | None:
        """The wanted labels of ``series``, the first series' value where several carry one; None when
        ``agreed`` and two of them carry different values (the caller then orders them by freshness)."""
        labelsets, wanted = self.snap.labelsets, self.wanted
        merged: dict[str, str] = {}
        for sid in series:
            for k, v in labelsets[sid]:
                if k in wanted:
                    had = merged.setdefault(k, v)
                    if agreed and had != v:
                        return None
        return merged

    def labels(self, kind: str, e: int) -> dict[str, str]:
        hit = self._cache.get((kind, e))
        if hit is not None:
            return hit
        return self.labels_many(kind, [e])[0]

    def labels_many(self, kind: str, rows: Iterable[int]) -> list[dict[str, str]]:
        """``labels`` of each of ``rows`` (entity rows of ``kind``), in order: the same dicts, cached the
        same way. The rows' series and a node's first GPU are looked up with one ``searchsorted`` over
        all the rows, and the GPUs' labels in one call: a fleet's first decision asks for every node's
        labels (12,500 nodes at 100k GPUs), and scalar numpy calls per row were most of its cost."""
        rows = [int(e) for e in rows]
        cache = self._cache
        todo = list(dict.fromkeys(e for e in rows if (kind, e) not in cache))
        if todo:
            at = np.array(todo, np.int64)
            ent, ser = self._pairs_of(kind)
            lo, hi = np.searchsorted(ent, at, "left").tolist(), np.searchsorted(ent, at, "right").tolist()
            # The node's first GPU speaks for the node-wide labels (driver, model, pool): GPU-specific
            # ones are excluded anyway, and asking all eight costs 8x for the same answer.
            first_gpu: list[int] = []
            gpu_labels: dict[int, dict[str, str]] = {}
            if kind == "node":
                if self._node_gpus is None:
                    order = np.argsort(self.gpu_node, kind="stable")
                    self._node_gpus = (self.gpu_node[order], order)
                gn, order = self._node_gpus
                a, b = np.searchsorted(gn, at, "left"), np.searchsorted(gn, at, "right")
                has = a < b
                first_gpu = np.where(has, order[np.minimum(a, max(order.size - 1, 0))] if order.size else -1,
                                     -1).tolist()
                gpus = [g for g in dict.fromkeys(first_gpu) if g >= 0]
                gpu_labels = dict(zip(gpus, self.labels_many("gpu", gpus), strict=True))
            info = self.info
            shared, merge = self.shared, self._merged
            # the rows' series as Python ints: one list for a batch, a slice for a few rows
            ser_all = ser.tolist() if 8 * len(todo) >= ser.size else None
            for j, e in enumerate(todo):
                series = tuple(ser_all[lo[j]:hi[j]] if ser_all is not None else ser[lo[j]:hi[j]].tolist())
                # Label sets are interned for the life of a history: their merged labels are too.
                cached = shared.get((kind, series))
                if cached is None:
                    cached = merge(series)
                    if cached is None:
                        # the series disagree (a label changed): the newest speaks; depends on times, never shared
                        cached = merge(tuple(self._by_freshness(list(series))), agreed=False)
                        assert cached is not None
                    else:
                        if len(shared) > 500_000:
                            shared.clear()
                        shared[(kind, series)] = cached
                d = dict(cached)
                if first_gpu and first_gpu[j] >= 0:
                    for k, v in gpu_labels[first_gpu[j]].items():
                        if k not in _GPU_SPECIFIC and k not in d:
                            d[k] = v
                if info:
                    d.update(info.get((kind, e), {}))
                if "driver_version" not in d and "DCGM_FI_DRIVER_VERSION" in d:
                    d["driver_version"] = d["DCGM_FI_DRIVER_VERSION"]
                cache[(kind, e)] = d
        return [cache[(kind, e)] for e in rows]


def _disagree(labelsets: list[tuple[tuple[str, str], ...]]) -> bool:
    """Whether two of the label sets carry different values for one label."""
    seen: dict[str, str] = {}
    return any(seen.setdefault(k, v) != v for ls in labelsets for k, v in ls)

"""The structural tracker as of session 9 (before the pair-based fast path): the reference the tracker is tested against. Structural signals: what the *shape* of the telemetry says, not its values.

A GPU that falls off the bus does not report a bad temperature; its series simply stop. If the scorer only
looked at values, that GPU would be "unknown" and the node would look fine. So this module watches shape:

- ``fleethealth_node_gpus_missing{node}``: GPUs a node should have (the most it has ever reported, or its
  Kubernetes ``nvidia.com/gpu`` capacity when known) minus the GPUs it reports now. Emitted only while
  the node's telemetry is alive (fresh series, or a target of the node answering ``up == 1``): when the
  whole exporter is gone that is missing data (stale, low confidence), not a hardware signal. The default
  policy gates on it.
- ``fleethealth_series_vanished{node}``: series present in the retained history but no longer fresh while
  the node still reports others (informational; a policy may score it).
- Scrape health from ``up`` and ``scrape_duration_seconds`` (Prometheus' per-target series, or the ones the
  direct scraper writes): a target that failed its last scrape is reported as a source error naming the
  target, and a target slower than ``slow_scrape_s`` as an issue.

The tracker is pure apart from its own memory (the most GPUs each node has shown): it takes the history
view and ``now`` as arguments and returns a snapshot of derived samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fleethealth.signals.history import shape_token
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot, SnapshotBuilder

GPUS_MISSING = "fleethealth_node_gpus_missing"
SERIES_VANISHED = "fleethealth_series_vanished"
GPU_METRIC_PREFIX = "DCGM_FI_DEV_"


@dataclass(slots=True)
class StructuralReport:
    snapshot: Snapshot
    gpus_now: dict[str, int] = field(default_factory=dict)
    gpus_expected: dict[str, int] = field(default_factory=dict)
    targets_down: list[str] = field(default_factory=list)
    scrape_seconds: dict[str, float] = field(default_factory=dict)


class StructuralTracker:
    def __init__(
        self,
        node_labels: Sequence[str] = ("Hostname", "node", "hostname", "instance"),
        max_age_s: float = 90.0,
        gpu_labels: Sequence[str] = ("gpu", "UUID"),
        gpu_metric_prefix: str = GPU_METRIC_PREFIX,
        slow_scrape_s: float = 10.0,
        future_skew_s: float = 30.0,
    ) -> None:
        # `instance` names the scrape target, not the node, whenever a better label exists; it is a node
        # name only for exporters that carry nothing else.
        self.node_labels = tuple(node_labels)
        self.max_age_s = max_age_s
        self.gpu_labels = tuple(gpu_labels)
        self.gpu_metric_prefix = gpu_metric_prefix
        self.slow_scrape_s = slow_scrape_s
        self.future_skew_s = future_skew_s
        self.max_gpus: dict[str, int] = {}
        self.target_nodes: dict[str, set[str]] = {}
        self._ls_cache: dict[LabelSet, tuple[str | None, str | None, str | None]] = {}
        # interned node names and (node, GPU) pairs, and the per-series table of the last label-set list
        self._names: list[str] = []
        self._name_ix: dict[str, int] = {}
        self._pair_ix: dict[tuple[str, str], int] = {}
        self._pair_node: list[int] = []
        self._table: _SeriesTable | None = None
        self._mcache: tuple[list[str], int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._pair_node_arr = np.zeros(0, np.int64)
        self._retained_cache: tuple[Hashable, _SeriesTable, int, np.ndarray] | None = None

    def forget(self, node: str) -> None:
        """After a repair that really removed GPUs, an operator resets the node's expected count."""
        self.max_gpus.pop(node, None)

    def _describe(self, ls: LabelSet) -> tuple[str | None, str | None, str | None]:
        hit = self._ls_cache.get(ls)
        if hit is None:
            d = dict(ls)
            node = next((d[k] for k in self.node_labels if d.get(k)), None)
            gpu = next((d[k] for k in self.gpu_labels if d.get(k)), None)
            hit = (node, gpu, d.get("instance"))
            if len(self._ls_cache) > 2_000_000:
                self._ls_cache.clear()
            self._ls_cache[ls] = hit
        return hit

    def _series(self, labelsets: list[LabelSet]) -> _SeriesTable:
        """Per-series facts of a label-set list, extended as the list grows: a history's list is
        append-only and the same object every cycle, so each label set is described once."""
        st = self._table
        if st is None or st.labelsets is not labelsets or len(labelsets) < st.n or (
                st.n and labelsets[st.n - 1] is not st.last):
            st = self._table = _SeriesTable(labelsets)
        if len(labelsets) > st.n:
            st.extend(self, labelsets)
        return st

    def observe(
        self, view: Snapshot, now: float, gpu_capacity: Mapping[str, int] | None = None
    ) -> StructuralReport:
        b = SnapshotBuilder()
        report = StructuralReport(snapshot=Snapshot.empty(now))
        st = self._series(view.labelsets)
        node_names = list(st.node_names)
        node_ix = dict(st.node_ix)
        node_of = st.node_of()
        n_series = max(len(view.labelsets), 1)
        metric_names = view.metrics
        is_up, is_dur, is_gpu_metric, is_target = self._metric_masks(metric_names)
        n_metrics = max(len(metric_names), 1)

        # Everything but the retained-series count reads fresh rows only: a few per series, while the
        # view also holds hours of counter samples.
        ts = view.ts
        n = len(view)
        fresh_rows = np.flatnonzero((ts <= now + self.future_skew_s) & (ts > now - self.max_age_s))
        fm = view.metric_ids[fresh_rows]
        fs = view.series_ids[fresh_rows].astype(np.int64)
        f_target = is_target[fm] if n else np.zeros(0, bool)
        f_sample = ~f_target

        # Learn which nodes each scrape target carries (a sample with both an instance and a node label).
        alive_by_target: set[int] = set()
        dead_nodes: set[str] = set()
        if n:
            present = np.zeros(n_series, bool)
            present[fs[f_sample]] = True
            todo = present & st.learnable & ~st.learned
            for sid in np.flatnonzero(todo).tolist():
                self.target_nodes.setdefault(st.inst[sid], set()).add(st.node[sid])  # type: ignore[index,arg-type]
            st.learned |= todo

        # Scrape health: latest `up` / `scrape_duration_seconds` per target.
        ft = ts[fresh_rows]
        fv = view.values[fresh_rows]
        up_latest = _latest_of(fs, ft, fv, is_up[fm]) if n else {}
        for sid, v in up_latest.items():
            node, _, inst_l = self._describe(view.labelsets[sid])
            inst = inst_l or dict(view.labelsets[sid]).get("job", "?")
            own = node
            # A target carrying its own node label (one target per node, e.g. a path per node on one
            # host:port) speaks for that node only, whatever else shares its instance.
            names = {own} if own is not None and own != inst else set(self.target_nodes.get(inst, ()))
            if v < 0.5:
                report.targets_down.append(inst)
                b.source_errors.append(InputIssue(f"target {inst}", 0, "scrape failed (up=0)"))
                # The node's exporter is known dead now, even while its last samples are not yet stale:
                # what it reported before says nothing about GPUs missing now.
                dead_nodes.update(names)
            else:
                for nm in names:
                    if nm in node_ix:
                        alive_by_target.add(node_ix[nm])
                    else:
                        node_ix[nm] = len(node_names)
                        node_names.append(nm)
                        alive_by_target.add(node_ix[nm])
        n_nodes = len(node_names)
        dur_latest = _latest_of(fs, ft, fv, is_dur[fm]) if n else {}
        for sid, v in dur_latest.items():
            inst = self._describe(view.labelsets[sid])[2] or "?"
            report.scrape_seconds[inst] = v
            if v > self.slow_scrape_s:
                b.issues.append(InputIssue(f"target {inst}", 0, f"slow scrape: {v:.2f} s"))

        if n_nodes == 0:
            report.snapshot = b.build(now)
            return report

        def series_per_node(sids: np.ndarray, mids: np.ndarray) -> np.ndarray:
            # distinct (metric, series) pairs via a dense bitmap: O(n), no sort or hash (np.unique is
            # the slowest step here at 100k GPUs). Nodes known only from a scrape target have none.
            seen = np.zeros(n_metrics * n_series, bool)
            seen[sids.astype(np.int64) * n_metrics + mids] = True
            keys = np.flatnonzero(seen)
            nodes = node_of[keys // n_metrics]
            out = np.zeros(n_nodes, np.int64)
            out[: st.rank_n] = np.bincount(nodes[nodes >= 0], minlength=st.rank_n)
            return out

        if n:
            retained = np.zeros(n_nodes, np.int64)
            retained[: st.rank_n] = self._retained(view, now, st, series_per_node, is_target)
            current = series_per_node(fs[f_sample], fm[f_sample])
        else:
            retained = current = np.zeros(n_nodes, np.int64)
        alive = current > 0
        for i in alive_by_target:
            alive[i] = True
        for nm in dead_nodes:
            if nm in node_ix:
                alive[node_ix[nm]] = False
        # Derived samples carry the time of the newest observation they come from, so they go stale
        # together with the data (never fresher than what they were computed from).
        newest = np.full(n_nodes, -np.inf)
        if n:
            nodes_r = node_of[fs[f_sample]]
            ok = nodes_r >= 0
            np.maximum.at(newest, nodes_r[ok], ft[f_sample][ok])

        # GPUs per node now: distinct (node, GPU id) pairs among fresh GPU-metric samples.
        gpu_now = np.zeros(n_nodes, np.int64)
        if n:
            present = np.zeros(n_series, bool)
            present[fs[is_gpu_metric[fm]]] = True
            pid = st.pair_id[present[: st.n]]
            pid = pid[pid >= 0]
            if pid.size:
                hit = np.zeros(len(self._pair_node), bool)
                hit[pid] = True
                gnodes = st.rank[self._pair_nodes()[hit]]
                gpu_now[: st.rank_n] += np.bincount(gnodes, minlength=st.rank_n)

        # (session 14) a GPU still fresh whose newest sample of each GPU metric it has is older than
        # its node's newest sample of that metric is missing from the read just made: not counted now
        # (per metric: a source that queries metric by metric may see a scrape land between two queries)
        pair_t: dict[tuple[int, int], float] = {}
        node_t: dict[tuple[int, int], float] = {}
        if n:
            g = is_gpu_metric[fm]
            for sid, m, t in zip(fs[g].tolist(), fm[g].tolist(), ft[g].tolist(), strict=True):
                p = int(st.pair_id[sid])
                if p >= 0:
                    pair_t[(p, m)] = max(pair_t.get((p, m), -math.inf), t)
            pn = {p: int(st.rank[self._pair_nodes()[p]]) for p, _ in pair_t}
            for (p, m), t in pair_t.items():
                node_t[(pn[p], m)] = max(node_t.get((pn[p], m), -math.inf), t)
            read_now = {p for (p, m), t in pair_t.items() if t >= node_t[(pn[p], m)]}
            for p in {p for p, _ in pair_t} - read_now:
                gpu_now[pn[p]] -= 1

        cap = gpu_capacity or {}
        gpu_now_l, retained_l, current_l = gpu_now.tolist(), retained.tolist(), current.tolist()
        newest_l = newest.tolist()
        alive_l = alive.tolist()
        # Two samples per node, (missing, vanished), in node order: the layout SnapshotBuilder.add gives.
        labelsets: list[LabelSet] = []
        vals: list[float] = []
        ats: list[float] = []
        for node, i in node_ix.items():
            if not alive_l[i]:
                continue  # the exporter itself is gone: missing data, the scorer marks it stale
            g = gpu_now_l[i]
            seen = max(self.max_gpus.get(node, 0), g)
            self.max_gpus[node] = seen
            expected = max(seen, int(cap.get(node, 0)))
            if expected == 0:
                continue  # a node without GPU telemetry (a serving pod, a CPU host): nothing to count
            report.gpus_now[node] = g
            report.gpus_expected[node] = expected
            labelsets.append((("node", node),))
            at = newest_l[i] if math.isfinite(newest_l[i]) else now  # alive by `up` alone: now
            vals += (float(expected - g), float(max(0, retained_l[i] - current_l[i])))
            ats += (at, at)
        k = len(labelsets)
        report.snapshot = Snapshot(
            at=now, metrics=[GPUS_MISSING, SERIES_VANISHED] if k else [], labelsets=labelsets,
            metric_ids=np.tile(np.array([0, 1], np.int32), k), series_ids=np.repeat(np.arange(k, dtype=np.int32), 2),
            values=np.array(vals, np.float64), ts=np.array(ats, np.float64),
            issues=list(b.issues), source_errors=list(b.source_errors),
        )
        return report

    def _metric_masks(self, metrics: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per metric: up, scrape duration, GPU metric, target (not a sample of the node itself)."""
        c = self._mcache
        if c is not None and c[0] is metrics and c[1] == len(metrics):
            return c[2]
        is_up = np.array([m == "up" for m in metrics] or [False], bool)
        is_dur = np.array([m == "scrape_duration_seconds" for m in metrics] or [False], bool)
        is_gpu = np.array([m.startswith(self.gpu_metric_prefix) for m in metrics] or [False], bool)
        # Our own derived series (fed back through the history) must never count as the node being alive.
        is_own = np.array([m in (GPUS_MISSING, SERIES_VANISHED) for m in metrics] or [False], bool)
        masks = (is_up, is_dur, is_gpu, is_up | is_dur | is_own)
        self._mcache = (metrics, len(metrics), masks)
        return masks

    def _retained(self, view: Snapshot, now: float, st: _SeriesTable,
                  series_per_node: Callable[[np.ndarray, np.ndarray], np.ndarray],
                  is_target: np.ndarray) -> np.ndarray:
        """Series per node in the whole view (not future-skewed): the one count that reads every row.
        It depends only on which (metric, series) pairs the view holds, so a view of a history whose
        set of pairs is unchanged (``shape_token``) reuses the last count."""
        all_valid = bool(view.ts.max() <= now + self.future_skew_s)
        token = shape_token(view) if all_valid else None
        c = self._retained_cache
        if token is not None and c is not None and c[0] == token and c[1] is st and c[2] == st.n:
            return c[3]  # same pairs, same series table: the same count (nodes from targets are zeros)
        rows = ~is_target[view.metric_ids]
        if not all_valid:
            rows &= view.ts <= now + self.future_skew_s
        out = series_per_node(view.series_ids[rows], view.metric_ids[rows])[: st.rank_n]
        self._retained_cache = (token, st, st.n, out) if token is not None else None
        return out

    def _pair_nodes(self) -> np.ndarray:
        if self._pair_node_arr.size != len(self._pair_node):
            self._pair_node_arr = np.asarray(self._pair_node, np.int64)
        return self._pair_node_arr


class _SeriesTable:
    """Node, GPU and scrape-target facts of each label set of one label-set list, as arrays."""

    def __init__(self, labelsets: list[LabelSet]) -> None:
        self.labelsets = labelsets
        self.n = 0
        self.last: LabelSet | None = None
        self.node: list[str | None] = []
        self.inst: list[str | None] = []
        self.name_id = np.zeros(0, np.int64)  # tracker-wide node name id per series (-1: none)
        self.pair_id = np.zeros(0, np.int64)  # tracker-wide (node, GPU) id per series (-1: none)
        self.learnable = np.zeros(0, bool)  # has an instance and a node label that differ
        self.learned = np.zeros(0, bool)  # already taught the tracker its target -> node pair
        self.node_names: list[str] = []  # sorted names of this list's nodes
        self.node_ix: dict[str, int] = {}
        self.rank = np.zeros(0, np.int64)  # name id -> index in node_names (-1)
        self.rank_n = 0
        self._node_of: np.ndarray | None = None

    def extend(self, tr: StructuralTracker, labelsets: list[LabelSet]) -> None:
        n0 = self.n
        new = labelsets[n0:]
        k = len(new)
        name_id = np.full(k, -1, np.int64)
        pair_id = np.full(k, -1, np.int64)
        learnable = np.zeros(k, bool)
        for j, ls in enumerate(new):
            node, gpu, inst = tr._describe(ls)
            self.node.append(node)
            self.inst.append(inst)
            if node is None:
                continue
            nid = tr._name_ix.get(node)
            if nid is None:
                nid = tr._name_ix[node] = len(tr._names)
                tr._names.append(node)
            name_id[j] = nid
            if gpu is not None:
                pid = tr._pair_ix.get((node, gpu))
                if pid is None:
                    pid = tr._pair_ix[(node, gpu)] = len(tr._pair_node)
                    tr._pair_node.append(nid)
                pair_id[j] = pid
            learnable[j] = inst is not None and node != inst
        self.name_id = np.concatenate((self.name_id, name_id))
        self.pair_id = np.concatenate((self.pair_id, pair_id))
        self.learnable = np.concatenate((self.learnable, learnable))
        self.learned = np.concatenate((self.learned, np.zeros(k, bool)))
        self.n = len(labelsets)
        self.last = labelsets[-1]
        ids = np.unique(self.name_id[self.name_id >= 0])
        if ids.size != self.rank_n or (name_id >= 0).any():
            self.node_names = sorted(tr._names[i] for i in ids.tolist())
            self.node_ix = {nm: i for i, nm in enumerate(self.node_names)}
            self.rank = np.full(len(tr._names), -1, np.int64)
            for nm, i in self.node_ix.items():
                self.rank[tr._name_ix[nm]] = i
            self.rank_n = len(self.node_names)
        self._node_of = None

    def node_of(self) -> np.ndarray:
        """Sorted-node index per series (-1: none); at least one entry, as indexing needs."""
        if self._node_of is None:
            if self.n == 0:
                self._node_of = np.full(1, -1, np.int64)
            else:
                self._node_of = np.where(self.name_id >= 0, self.rank[np.maximum(self.name_id, 0)], -1)
        return self._node_of


def _latest_of(sids: np.ndarray, ts: np.ndarray, vals: np.ndarray, mask: np.ndarray) -> dict[int, float]:
    """The newest value of each series among the masked rows (ties: the later row)."""
    if not mask.any():
        return {}
    sids, ts, vals = sids[mask], ts[mask], vals[mask]
    order = np.lexsort((ts, sids))
    sids, vals = sids[order], vals[order]
    last = np.r_[sids[1:] != sids[:-1], True]
    return dict(zip(sids[last].tolist(), vals[last].tolist(), strict=True))

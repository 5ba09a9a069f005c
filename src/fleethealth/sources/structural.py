"""Structural signals: what the *shape* of the telemetry says, not its values.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

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

    def observe(
        self, view: Snapshot, now: float, gpu_capacity: Mapping[str, int] | None = None
    ) -> StructuralReport:
        b = SnapshotBuilder()
        report = StructuralReport(snapshot=Snapshot.empty(now))
        desc = [self._describe(ls) for ls in view.labelsets]
        node_names = sorted({d[0] for d in desc if d[0] is not None})
        node_ix = {n: i for i, n in enumerate(node_names)}
        n_nodes = len(node_names)
        node_of = np.array([node_ix[d[0]] if d[0] is not None else -1 for d in desc] or [-1], np.int64)

        valid = view.ts <= now + self.future_skew_s
        fresh = valid & (view.ts > now - self.max_age_s)
        metric_names = view.metrics
        is_up = np.array([m == "up" for m in metric_names] or [False], bool)
        is_dur = np.array([m == "scrape_duration_seconds" for m in metric_names] or [False], bool)
        is_gpu_metric = np.array([m.startswith(self.gpu_metric_prefix) for m in metric_names] or [False], bool)
        # Our own derived series (fed back through the history) must never count as the node being alive.
        is_own = np.array([m in (GPUS_MISSING, SERIES_VANISHED) for m in metric_names] or [False], bool)
        target_rows = (
            (is_up | is_dur | is_own)[view.metric_ids] if len(view) else np.zeros(0, bool)
        )

        # Learn which nodes each scrape target carries (a sample with both an instance and a node label).
        alive_by_target: set[int] = set()
        dead_nodes: set[str] = set()
        if len(view):
            present = np.zeros(max(len(view.labelsets), 1), bool)
            present[view.series_ids[fresh & ~target_rows]] = True
            for sid in np.flatnonzero(present).tolist():
                node, _, inst = desc[sid]
                if inst is not None and node is not None and node != inst:
                    self.target_nodes.setdefault(inst, set()).add(node)

        # Scrape health: latest `up` / `scrape_duration_seconds` per target.
        up_latest = _latest_per_series(view, fresh & is_up[view.metric_ids]) if len(view) else {}
        for sid, v in up_latest.items():
            inst = desc[sid][2] or dict(view.labelsets[sid]).get("job", "?")
            own = desc[sid][0]
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
                for n in names:
                    if n in node_ix:
                        alive_by_target.add(node_ix[n])
                    else:
                        node_ix[n] = len(node_names)
                        node_names.append(n)
                        alive_by_target.add(node_ix[n])
        n_nodes = len(node_names)
        dur_latest = _latest_per_series(view, fresh & is_dur[view.metric_ids]) if len(view) else {}
        for sid, v in dur_latest.items():
            inst = desc[sid][2] or "?"
            report.scrape_seconds[inst] = v
            if v > self.slow_scrape_s:
                b.issues.append(InputIssue(f"target {inst}", 0, f"slow scrape: {v:.2f} s"))

        if n_nodes == 0:
            report.snapshot = b.build(now)
            return report

        sample_rows = ~target_rows if len(view) else np.zeros(0, bool)
        n_series = max(len(view.labelsets), 1)

        n_metrics = max(len(metric_names), 1)

        def series_per_node(mask: np.ndarray) -> np.ndarray:
            # distinct (metric, series) pairs via a dense bitmap: O(n), no sort or hash (np.unique is
            # the slowest step here at 100k GPUs)
            seen = np.zeros(n_metrics * n_series, bool)
            seen[view.series_ids[mask].astype(np.int64) * n_metrics + view.metric_ids[mask]] = True
            keys = np.flatnonzero(seen)
            nodes = node_of[keys // n_metrics]
            return np.bincount(nodes[nodes >= 0], minlength=n_nodes)

        retained = series_per_node(valid & sample_rows) if len(view) else np.zeros(n_nodes, np.int64)
        current = series_per_node(fresh & sample_rows) if len(view) else np.zeros(n_nodes, np.int64)
        alive = current > 0
        for i in alive_by_target:
            alive[i] = True
        for n in dead_nodes:
            if n in node_ix:
                alive[node_ix[n]] = False
        # Derived samples carry the time of the newest observation they come from, so they go stale
        # together with the data (never fresher than what they were computed from).
        newest = np.full(n_nodes, -np.inf)
        if len(view):
            rows = fresh & sample_rows
            nodes_r = node_of[view.series_ids[rows]]
            ok = nodes_r >= 0
            np.maximum.at(newest, nodes_r[ok], view.ts[rows][ok])

        # GPUs per node now: distinct GPU ids among fresh GPU-metric samples.
        gpu_now = np.zeros(n_nodes, np.int64)
        if len(view):
            gmask = fresh & is_gpu_metric[view.metric_ids]
            present = np.zeros(n_series, bool)
            present[view.series_ids[gmask]] = True
            sids = np.flatnonzero(present).tolist()
            pairs: set[tuple[str, str]] = set()
            for s in sids:
                nd, gp = desc[s][0], desc[s][1]
                if nd is not None and gp is not None:
                    pairs.add((nd, gp))
            for nd, _gp in pairs:
                gpu_now[node_ix[nd]] += 1

        cap = gpu_capacity or {}
        for node, i in node_ix.items():
            if not alive[i]:
                continue  # the exporter itself is gone: missing data, the scorer marks it stale
            seen = max(self.max_gpus.get(node, 0), int(gpu_now[i]))
            self.max_gpus[node] = seen
            expected = max(seen, int(cap.get(node, 0)))
            if expected == 0:
                continue  # a node without GPU telemetry (a serving pod, a CPU host): nothing to count
            missing = expected - int(gpu_now[i])
            report.gpus_now[node] = int(gpu_now[i])
            report.gpus_expected[node] = expected
            labels = (("node", node),)
            at = float(newest[i]) if np.isfinite(newest[i]) else now  # alive by `up` alone: now
            b.add(GPUS_MISSING, labels, float(missing), at)
            b.add(SERIES_VANISHED, labels, float(max(0, int(retained[i]) - int(current[i]))), at)
        report.snapshot = b.build(now)
        return report


def _latest_per_series(view: Snapshot, mask: np.ndarray) -> dict[int, float]:
    """The newest value of each series among the masked rows."""
    if not mask.any():
        return {}
    sids = view.series_ids[mask]
    ts = view.ts[mask]
    vals = view.values[mask]
    order = np.lexsort((ts, sids))
    sids, vals = sids[order], vals[order]
    last = np.r_[sids[1:] != sids[:-1], True]
    return dict(zip(sids[last].tolist(), vals[last].tolist(), strict=True))

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

The tracker is pure apart from its own memory (the most GPUs each node has shown, and their GPU ids): it
takes the history view and ``now`` as arguments and returns a snapshot of derived samples. That memory is
what a node is expected to have by its own past (the expectation model's "prior"): ``memory()`` hands it
to the controller, which keeps it in the state store, and ``restore()`` takes it back after a restart, so
a GPU that fell off the bus before (or while the controller was down) is still expected.

Absence inside a fresh read is evidence at once: a GPU whose newest samples are fresh but older, metric
by metric, than the newest sample of that metric on its node (it was on the exporter's page and is
missing from the page just read) is not counted among the node's GPUs now, so ``gpus_missing`` rises on
the first read without it, not a staleness window later (``_absent_now``; one exporter page carries one
timestamp, as Prometheus stores a scrape; compared per metric because a source that queries metric by
metric can see a scrape land between two queries).

It runs every decision cycle, so a history view is read through its index (``_fresh_indexed``): the
gauge rows and each counter series' latest sample, never the hours of counter samples, and while the
layout of those is unchanged (a steady fleet) only their times (``structural_layout._Layout``, built
when a layout is first seen: a fleet settles in the cycle after the first, whose derived series the
history adds). Any other snapshot is read row by row; both give the same answers
(tests/test_structural_index_equiv.py). Label sets are described once each, as the history's list
grows (``structural_layout._SeriesTable``). A cold cycle makes tens of thousands of sets, tuples and
dicts here (12.5k nodes' targets, label sets and counts at 100k GPUs), none in a reference cycle, so
``observe`` runs with the cyclic garbage collector paused (``fleethealth.memory.gc_paused``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat

import numpy as np

from fleethealth.memory import gc_paused
from fleethealth.signals.history import shape_token
from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot, SnapshotBuilder
from fleethealth.sources.structural_layout import (
    _NO_IDS,
    _NO_IDS32,
    _NO_VALS,
    _Blocks,
    _cat,
    _CGroups,
    _latest_arrays,
    _Layout,
    _Masks,
    _run_end,
    _SeriesTable,
)

GPUS_MISSING = "fleethealth_node_gpus_missing"
# ``_node_answer``: kept node indexes, their names, GPUs now, GPUs expected, derived values, label sets
_NodeAnswer = tuple[np.ndarray, list[str], dict[str, int], dict[str, int], np.ndarray, list[LabelSet]]
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
        # GPU ids a node had before this process saw it (``restore``: from the state store)
        self.prior_gpus: dict[str, set[str]] = {}
        # bumped whenever the memory (``memory()``) may have changed: the controller saves it then
        self.memory_version = 0
        self.target_nodes: dict[str, set[str]] = {}
        # interned node names, GPU ids, instance labels and (node, GPU) pairs (each pair's name and GPU id; the known pairs'
        # keys, name id << 32 | GPU id, sorted, and their pair ids), and the per-series table of the last
        # label-set list
        self._names: list[str] = []
        self._name_ix: dict[str, int] = {}
        self._gpus: list[str] = []
        self._gpu_ix: dict[str, int] = {}
        self._insts: list[str] = []
        self._inst_ix: dict[str, int] = {}
        # (each pair's name id and GPU id as arrays: a cold 100k-GPU cycle brings 100k pairs, no int object each)
        self._pair_node_arr = np.zeros(0, np.int64)
        self._pair_gpu_arr = np.zeros(0, np.int64)
        self._pair_keys = np.zeros(0, np.int64)
        self._pair_key_ids = np.zeros(0, np.int64)
        self._table: _SeriesTable | None = None
        self._mcache: tuple[list[str], int, _Masks] | None = None
        self._retained_cache: tuple[Hashable, _SeriesTable, int, np.ndarray] | None = None
        # the last history view's layout of entries, and what it says (see ``_fresh_indexed``)
        self._layout: _Layout | None = None
        self._blocks_cache: tuple[list[tuple[int, tuple[int, int]]], list[tuple[int, int, int, int]],
                                  tuple[_Blocks, list[tuple[int, int]], _CGroups]] | None = None
        self._rm_cache: tuple[_Masks, list[int]] | None = None
        # the last node-level answer, the counts it came from and the memory it left (see ``observe``)
        self._out_cache: tuple[tuple[object, ...], dict[str, int], _NodeAnswer] | None = None
        # what the `up` series said last cycle, and the tracker's learning counter it was read with
        self._targets_version = 0
        self._up_cache: tuple[_SeriesTable, tuple[int, bytes, bytes, int],
                              tuple[list[str], dict[str, int], set[int], set[str], list[tuple[str, InputIssue]]]] | None = None

    def forget(self, node: str) -> None:
        """After a repair that really removed GPUs, an operator resets the node's expected count."""
        self.max_gpus.pop(node, None)
        self.prior_gpus.pop(node, None)
        self.memory_version += 1

    def memory(self) -> dict[str, tuple[int, list[str]]]:
        """What the tracker expects of each node by its past: (the most GPUs it has shown, the GPU ids it
        has shown), for the state store."""
        ids: dict[str, set[str]] = {nm: set(v) for nm, v in self.prior_gpus.items()}
        names, gpus = self._names, self._gpus
        for node, gpu in zip(self._pair_node, self._pair_gpu, strict=True):
            ids.setdefault(names[node], set()).add(gpus[gpu])
        return {nm: (int(n), sorted(ids.get(nm, ()), key=_gpu_order)) for nm, n in self.max_gpus.items()}

    @property
    def _pair_node(self) -> list[int]:
        """Each (node, GPU) pair's node name id, in pair order."""
        return self._pair_node_arr.tolist()  # type: ignore[no-any-return]

    @property
    def _pair_gpu(self) -> list[int]:
        """Each (node, GPU) pair's GPU id, in pair order."""
        return self._pair_gpu_arr.tolist()  # type: ignore[no-any-return]

    @property
    def _pair_ix(self) -> dict[tuple[str, str], int]:
        """(node, GPU) -> pair id, in pair order (made on demand: the tracker keeps its pairs as ids)."""
        names, gpus = self._names, self._gpus
        return {(names[n], gpus[g]): i for i, (n, g) in enumerate(zip(self._pair_node, self._pair_gpu, strict=True))}

    def restore(self, memory: Mapping[str, tuple[int, Sequence[str]]]) -> None:
        """Take back a ``memory()`` (a controller restart): the counts and ids join what is known now."""
        for nm, (n, gpus) in memory.items():
            self.max_gpus[nm] = max(int(n), self.max_gpus.get(nm, 0))
            if gpus:
                self.prior_gpus.setdefault(nm, set()).update(str(g) for g in gpus)
        self.memory_version += 1

    def expected_gpus(self, report: StructuralReport) -> dict[str, list[str]]:
        """For each node with fewer GPUs now than expected (``report``), the GPU ids it is known to have
        had: the entities the scorer must show, unknown where they report nothing."""
        short = [nm for nm, n in report.gpus_expected.items() if report.gpus_now.get(nm, 0) < n]
        if not short:
            return {}
        mem = self.memory()
        return {nm: mem[nm][1] for nm in short if nm in mem and mem[nm][1]}

    def _series(self, labelsets: list[LabelSet]) -> _SeriesTable:
        """Per-series facts of a label-set list, extended as the list grows: a history's list is
        append-only and the same object every cycle, so each label set is described once."""
        st = self._table
        if st is None or st.labelsets is not labelsets or len(labelsets) < st.n or (
                st.n and labelsets[st.n - 1] is not st.last):
            st = self._table = _SeriesTable(labelsets)
        if len(labelsets) > st.n:
            st.extend(self, labelsets)  # (inside ``observe``'s pause of garbage collection)
        return st

    def observe(
        self, view: Snapshot, now: float, gpu_capacity: Mapping[str, int] | None = None
    ) -> StructuralReport:
        # (no cyclic garbage collection inside: a cold 100k-GPU cycle makes ~40k sets, tuples and dicts
        # here, none in a reference cycle; a collection inside would also walk what the stages before
        # made with collection paused)
        with gc_paused():
            return self._observe(view, now, gpu_capacity)

    def _observe(self, view: Snapshot, now: float, gpu_capacity: Mapping[str, int] | None) -> StructuralReport:
        b = SnapshotBuilder()
        report = StructuralReport(snapshot=Snapshot.empty(now))
        st = self._series(view.labelsets)
        node_names = list(st.node_names)
        node_ix = dict(st.node_ix)
        masks = self._metric_masks(view.metrics)
        # What the fresh samples say (and the retained-series count): off a history view's index when it
        # holds, else off every row.
        fr = self._fresh_indexed(view, now, st, masks) or self._fresh_rows(view, now, st, masks)

        # Learn which nodes each scrape target carries (a sample with both an instance and a node label).
        alive_by_target: set[int] = set()
        dead_nodes: set[str] = set()
        if fr.present is not None:
            todo = fr.present & st.learnable & ~st.learned
            if todo.any():
                # each distinct (target, node) pair once, in order of first appearance (a set's
                # insertion order, which its iteration follows, is then the same as series by series):
                # distinct by their interned ids, one Python step per pair, not per series; a pair's first
                # series heads a run of series of that pair, so the runs' heads are made distinct (a
                # node's GPUs are a run: 12.5k heads of 100k series at 100k GPUs)
                sids = np.flatnonzero(todo)
                key = (st.inst_id[sids] << 32) | st.name_id[sids]
                head = np.ones(key.size, bool)
                np.not_equal(key[1:], key[:-1], out=head[1:])
                sids, key = sids[head], key[head]
                _, first = np.unique(key, return_index=True)
                self._learn_targets(st, sids[np.sort(first)])
                st.learned |= todo
                self._targets_version += 1

        # Scrape health: latest `up` / `scrape_duration_seconds` per target.
        up_sids, up_vals = fr.up
        # What the targets say depends only on which targets answered up or down, their label sets and
        # what the tracker has learned of targets: the same answer as last cycle while those are the same.
        up_key = (st.n, up_sids.tobytes(), (up_vals < 0.5).tobytes(), self._targets_version)
        uc = self._up_cache
        downs: list[tuple[str, InputIssue]]
        if uc is not None and uc[0] is st and uc[1] == up_key:
            node_names, node_ix, alive_by_target, dead_nodes, downs = uc[2]
            node_names, node_ix = list(node_names), dict(node_ix)
            report.targets_down.extend(inst for inst, _ in downs)
            b.source_errors.extend(err for _, err in downs)
        else:
            downs = []
            for sid, v in zip(up_sids.tolist(), up_vals.tolist(), strict=True):
                own, inst_l = st.node[sid], st.inst[sid]
                inst = inst_l or dict(view.labelsets[sid]).get("job", "?")
                # A target carrying its own node label (one target per node, e.g. a path per node on one
                # host:port) speaks for that node only, whatever else shares its instance.
                names = {own} if own is not None and own != inst else set(self.target_nodes.get(inst, ()))
                if v < 0.5:
                    err = InputIssue(f"target {inst}", 0, "scrape failed (up=0)")
                    report.targets_down.append(inst)
                    b.source_errors.append(err)
                    downs.append((inst, err))
                    # The node's exporter is known dead now, even while its last samples are not yet
                    # stale: what it reported before says nothing about GPUs missing now.
                    dead_nodes.update(names)
                else:
                    for nm in names:
                        if nm in node_ix:
                            alive_by_target.add(node_ix[nm])
                        else:
                            node_ix[nm] = len(node_names)
                            node_names.append(nm)
                            alive_by_target.add(node_ix[nm])
            self._up_cache = (st, up_key, (list(node_names), dict(node_ix), alive_by_target, dead_nodes, downs))
        n_nodes = len(node_names)
        dur_sids, dur_vals = fr.dur
        for sid, v in zip(dur_sids.tolist(), dur_vals.tolist(), strict=True):
            inst = st.inst[sid] or "?"
            report.scrape_seconds[inst] = v
            if v > self.slow_scrape_s:
                b.issues.append(InputIssue(f"target {inst}", 0, f"slow scrape: {v:.2f} s"))

        if n_nodes == 0:
            report.snapshot = b.build(now)
            return report

        # per node of the series table, then the nodes known only from a scrape target (none of those)
        retained, current, gpu_now = (_padded(a, n_nodes, 0) for a in (fr.retained, fr.current, fr.gpus))
        absent = self._absent_now(view, now, st, masks)
        if absent is not None:
            gpu_now = gpu_now - _padded(absent, n_nodes, 0)
        alive = current > 0
        if alive_by_target:
            alive[list(alive_by_target)] = True
        for nm in dead_nodes:
            if nm in node_ix:
                alive[node_ix[nm]] = False
        # Derived samples carry the time of the newest observation they come from, so they go stale
        # together with the data (never fresher than what they were computed from).
        newest = _padded(fr.newest, n_nodes, -np.inf)

        # All but the times follows from the nodes' counts, which a steady fleet repeats cycle after cycle:
        # then the last answer is this one, and the tracker's memory is already what this one makes it.
        cap = dict(gpu_capacity or {})
        okey = (node_names, alive.tobytes(), gpu_now.tobytes(), retained.tobytes(), current.tobytes(), cap)
        oc = self._out_cache
        if oc is not None and oc[0] == okey and oc[1] == self.max_gpus:
            out = oc[2]
        else:
            out = self._node_answer(node_names, alive, gpu_now, retained, current, cap)
            self._out_cache = (okey, dict(self.max_gpus), out)
        kept, out_names, gpus_now, gpus_expected, vals, node_sets = out
        report.gpus_now.update(gpus_now)
        report.gpus_expected.update(gpus_expected)
        at = newest[kept]
        at = np.where(np.isfinite(at), at, now)  # alive by `up` alone: now
        k = len(out_names)
        report.snapshot = Snapshot(
            at=now, metrics=[GPUS_MISSING, SERIES_VANISHED] if k else [],
            labelsets=list(node_sets),  # (a copy: the answer may serve the next cycle)
            metric_ids=np.arange(2 * k, dtype=np.int32) & 1, series_ids=np.arange(2 * k, dtype=np.int32) >> 1,
            values=vals.copy(), ts=np.repeat(at.astype(np.float64), 2),
            issues=list(b.issues), source_errors=list(b.source_errors),
        )
        return report

    def _node_answer(self, node_names: list[str], alive: np.ndarray, gpu_now: np.ndarray, retained: np.ndarray,
                     current: np.ndarray, cap: Mapping[str, int]
                     ) -> _NodeAnswer:
        """The nodes that get derived samples (their indexes and names), their GPUs now and expected, the
        samples' values: two per node, (missing, vanished), in node order (the layout SnapshotBuilder.add
        gives), and their label sets. Nodes whose exporter is gone get none (missing data: the scorer
        marks them stale). Learns the most GPUs each node has shown. C-level passes over the nodes (a
        cold 100k-GPU cycle: 12.5k of them)."""
        idx = np.flatnonzero(alive)
        names_alive = list(node_names) if idx.size == len(node_names) else list(compress(node_names, alive.tolist()))
        g = gpu_now[idx]
        before = np.fromiter(map(self.max_gpus.get, names_alive, repeat(0)), np.int64, len(names_alive))
        seen_gpus = np.maximum(before, g)
        if (seen_gpus != before).any():
            self.memory_version += 1
        self.max_gpus.update(zip(names_alive, seen_gpus.tolist(), strict=True))
        expected = seen_gpus
        if cap:
            expected = np.maximum(seen_gpus, np.array([int(cap.get(nm, 0)) for nm in names_alive], np.int64))
        keep = expected != 0  # a node without GPU telemetry (a serving pod, a CPU host): nothing to count
        kept = idx[keep]
        out_names = names_alive if keep.all() else list(compress(names_alive, keep.tolist()))
        g, expected = g[keep], expected[keep]
        vals = np.empty((len(out_names), 2), np.float64)
        vals[:, 0] = expected - g
        vals[:, 1] = np.maximum(0, retained[kept] - current[kept])
        return (kept, out_names, dict(zip(out_names, g.tolist(), strict=True)),
                dict(zip(out_names, expected.tolist(), strict=True)), vals.reshape(-1),
                list(zip(zip(repeat("node"), out_names, strict=False), strict=True)))

    def _absent_now(self, view: Snapshot, now: float, st: _SeriesTable, masks: _Masks) -> np.ndarray | None:
        """Per node of the series table, the GPUs still fresh whose newest sample of every GPU metric they
        have is older than their node's newest sample of that metric: missing from the read just made
        (None: none). Per metric, because a source that queries metric by metric (Prometheus) may see a
        scrape land between two queries: then every GPU's newest sample of a metric read later is newer
        than its samples of one read earlier, and a metric only some GPUs carry would make the others
        look absent. Read off the GPU metrics' gauge blocks of a history view (counters' series stop
        with the gauges), or every row."""
        is_gpu = masks[2]
        limit = now + self.future_skew_s
        ix = view.index_upto(limit)
        parts: list[tuple[np.ndarray, np.ndarray]] = []  # (series, time) of one GPU metric's rows
        if ix is not None:
            parts = [ix.rows(view, a, b)[::2] for m, (a, b) in ix.bounds.items()
                     if b > a and m < is_gpu.size and is_gpu[m] and m not in ix.counters]
            for m, cm in ix.counters.items():  # a counter's newest sample per series: its column's last
                if m < is_gpu.size and is_gpu[m]:
                    g = ix.groups[cm.group]
                    if not g.t.shape[0]:
                        continue
                    if g.dense:
                        parts.append((g.series[cm.c0:cm.c1], g.t[-1, cm.c0:cm.c1]))
                    else:
                        cols = np.arange(cm.c0, cm.c1)
                        last = g.last[cols]
                        ok = last >= 0
                        parts.append((g.series[cols[ok]], g.t[last[ok], cols[ok]]))
        elif len(view):
            rows = is_gpu[view.metric_ids] & (view.ts <= limit)
            mids = view.metric_ids[rows]
            sids, ts = view.series_ids[rows], view.ts[rows]
            parts = [(sids[mids == m], ts[mids == m]) for m in np.unique(mids).tolist()]
        if not parts:
            return None
        # None at once where every fresh GPU series has a sample at its metric's newest time (no node's
        # newest is later, so each of its GPUs is current: none absent, as below): a steady fleet read
        # in one scrape, value-start rows and all. Series bitmaps, no gather of pairs or nodes.
        lo = now - self.max_age_s
        fresh = np.zeros(st.n, bool)
        top = np.zeros(st.n, bool)
        for s_, t_ in parts:
            if t_.size:
                t_max = t_.max()
                if t_max > lo and t_.min() == t_max:
                    continue  # every sample at the newest time: its series would be marked in both
                fresh[s_[t_ > lo]] = True
                if t_max > lo:  # (a metric with no fresh sample marks none: its newest is stale)
                    top[s_[t_ == t_max]] = True
        if not (fresh & ~top & (st.pair_id >= 0)).any():
            return None
        # every metric's rows at once (one pass, not one per metric: ~30 metrics every cycle), each
        # compared with its (node, metric)'s newest
        sids = np.concatenate([p[0] for p in parts])
        ts = np.concatenate([p[1] for p in parts])
        part = np.repeat(np.arange(len(parts)), [p[0].size for p in parts])
        pid = st.pair_id[sids]
        ok = (ts > now - self.max_age_s) & (pid >= 0)
        pid, ts, part = pid[ok], ts[ok], part[ok]
        if pid.size < 2 or ts.min() == ts.max():  # one read time for every GPU: none absent
            return None
        pair_nodes = self._pair_node_arr
        key = st.rank[pair_nodes[pid]] * len(parts) + part
        nt = np.full(st.rank_n * len(parts), -np.inf)
        np.maximum.at(nt, key, ts)
        seen = np.zeros(self._pair_node_arr.size, bool)
        current = np.zeros(self._pair_node_arr.size, bool)
        seen[pid] = True
        current[pid[ts >= nt[key]]] = True
        gone = np.flatnonzero(seen & ~current)
        if not gone.size:
            return None
        return np.bincount(st.rank[pair_nodes[gone]], minlength=st.rank_n)

    # -- what the fresh samples say ----------------------------------------------------------------

    def _fresh_rows(self, view: Snapshot, now: float, st: _SeriesTable, masks: _Masks) -> _Fresh:
        """Off every row of the view: fresh rows are those in (now - max_age_s, now + future_skew_s]."""
        if not len(view):
            return _Fresh.none(st.rank_n)
        is_target = masks[3]
        ts = view.ts
        not_future = ts <= now + self.future_skew_s
        all_valid = bool(not_future.all())
        fresh_rows = np.flatnonzero(not_future & (ts > now - self.max_age_s))

        def all_pairs() -> tuple[np.ndarray, np.ndarray]:
            rows = ~is_target[view.metric_ids]
            if not all_valid:
                rows &= view.ts <= now + self.future_skew_s
            return view.series_ids[rows], view.metric_ids[rows]

        fr = self._from_entries(view, st, masks, view.metric_ids[fresh_rows], view.series_ids[fresh_rows],
                                ts[fresh_rows], fresh_rows, view.values)
        fr.retained = self._retained(view, st, all_pairs, all_valid)
        return fr

    def _from_entries(self, view: Snapshot, st: _SeriesTable, masks: _Masks, fm: np.ndarray, fs: np.ndarray,
                      ft: np.ndarray, rows: np.ndarray, values: np.ndarray) -> _Fresh:
        """From fresh entries (metric, series, time; ``values[rows[i]]`` the value of entry i where its
        metric is ``up`` or the scrape duration): at least one entry per fresh (metric, series) pair, at
        least its newest, and every fresh row of those two metrics."""
        is_up, is_dur, is_gpu_metric, is_target = masks
        n_series = max(len(view.labelsets), 1)
        n_metrics = max(len(view.metrics), 1)
        node_of = st.node_of()
        # Presence, series counts and GPUs depend on which (metric, series) pairs have fresh rows, not on
        # how many (a counter has several fresh samples per pair): the distinct pairs, via a dense bitmap
        # (O(n), no sort or hash), and everything after that on pairs.
        bitmap = np.zeros(n_metrics * n_series, bool)  # (a row of series per metric)
        if n_metrics * n_series < 2**31 and fs.dtype == np.int32 and fm.dtype == np.int32:
            bitmap[fm * np.int32(n_series) + fs] = True  # int32 keys: no int64 copy of every row
        else:
            bitmap[fm.astype(np.int64) * n_series + fs] = True
        present, current, gpus = self._pair_facts(st, masks, bitmap)
        newest = np.full(st.rank_n, -np.inf)
        _newest(newest, node_of, fm, fs, ft, is_target, current)
        return _Fresh(present, current, gpus, newest, current,
                      _latest_arrays(rows, fs, ft, values, _rows_of(fm, is_up)),
                      _latest_arrays(rows, fs, ft, values, _rows_of(fm, is_dur)))

    def _pair_facts(self, st: _SeriesTable, masks: _Masks, seen: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For a set of (metric, series) pairs (``seen``: a bitmap of the view's metrics by its series,
        flat, metric-major): the series with pairs of the node's own samples, those pairs per node, and
        the distinct (node, GPU) pairs per node among series with GPU-metric pairs. By rows of the bitmap
        (a metric's series side by side): per-series counts, then per node, no pass per pair."""
        is_gpu_metric, is_target = masks[2], masks[3]
        pairs = seen.reshape(is_target.size, -1)
        own = np.flatnonzero(~is_target)
        # (the metrics' rows added up in place, bytes as counts: no copy of the rows, no per-row sum;
        # wider counts past 255 metrics)
        per_series: np.ndarray = np.zeros(pairs.shape[1], np.uint8 if own.size < 256 else np.int64)
        for r in own.tolist():
            np.add(per_series, pairs[r].view(np.uint8), out=per_series)
        present = per_series > 0
        node_of = st.node_of()[: st.n]
        ok = node_of >= 0
        # (float weights, exact for any count a view holds)
        current = np.bincount(node_of[ok], per_series[: st.n][ok], minlength=st.rank_n).astype(np.int64)
        # GPUs per node now: distinct (node, GPU id) pairs among fresh GPU-metric samples.
        gpus = np.zeros(st.rank_n, np.int64)
        gpu_cols = np.flatnonzero(is_gpu_metric)
        if gpu_cols.size:
            has_gpu = np.asarray(pairs[gpu_cols].any(axis=0))
            pid = st.pair_id[has_gpu[: st.n]]
            pid = pid[pid >= 0]
            if pid.size:
                hit = np.zeros(self._pair_node_arr.size, bool)
                hit[pid] = True
                gpus += np.bincount(st.rank[self._pair_node_arr[hit]], minlength=st.rank_n)
        return present, current, gpus

    def _pairs_per_node(self, st: _SeriesTable, n_metrics: int, n_series: int, sids: np.ndarray,
                        mids: np.ndarray) -> np.ndarray:
        """Distinct (metric, series) pairs per node (rows may repeat a pair), via a dense bitmap: O(n), no
        sort or hash (np.unique is the slowest step here at 100k GPUs)."""
        seen = np.zeros(n_metrics * n_series, bool)
        seen[sids.astype(np.int64) * n_metrics + mids] = True
        nodes = st.node_of()[np.flatnonzero(seen) // n_metrics]
        return np.bincount(nodes[nodes >= 0], minlength=st.rank_n)

    def _fresh_indexed(self, view: Snapshot, now: float, st: _SeriesTable, masks: _Masks) -> _Fresh | None:
        """Off a history view's index, or None where it does not hold, does not bound every time at
        ``now + future_skew_s`` (then every row is looked at) or has ``up`` or the scrape duration as a
        counter matrix (their rows are read).

        Entries are (metric, series, time): the rows of every block that is not a counter matrix (gauges:
        a row or two per series), and each counter series' latest sample (a counter matrix column is in
        time order, so its latest sample is its newest). Everything the tracker reads off fresh rows is
        the same on the fresh entries: the set of fresh (metric, series) pairs, the newest fresh time per
        node and the latest ``up`` / scrape duration per target.

        A layout of the entries (the blocks, the series of each, the counter columns) is built when first
        seen (``_Layout.build``). While it is the same as the last cycle's, which pairs are fresh follows
        from which entries are stale (few, and the same from one cycle to the next: none in a steady
        state), and what depends only on the set of fresh pairs is the layout's: then a cycle reads the
        entries' times once (a scatter-max of them per node: the newest) and the rows of ``up`` and the
        scrape duration, nothing else."""
        if not len(view):
            return None
        ix = view.index_upto(now + self.future_skew_s)
        if ix is None:
            return None
        counters = ix.counters
        if any(m in counters for m in self._row_metrics(masks)):
            return None
        lo = now - self.max_age_s
        # the blocks read row by row (by first row) and the counter groups, as the last view's while its
        # bounds and counter columns are the same
        clay = [(m, cm.group, cm.c0, cm.c1) for m, cm in counters.items()]
        rows_at = [(m, ab) for m, ab in ix.bounds.items() if m not in counters]
        bc = self._blocks_cache
        if bc is not None and bc[0] == rows_at and bc[1] == clay:
            blocks, spans, cgroups = bc[2]
        else:
            blocks = tuple(sorted((a, b, m) for m, (a, b) in rows_at if b > a))
            spans = []  # merged where adjacent (a history view's gauges are one run)
            for a, b, _ in blocks:
                if spans and spans[-1][1] == a:
                    spans[-1] = (spans[-1][0], b)
                else:
                    spans.append((a, b))
            cols: dict[int, list[tuple[int, int, int]]] = {}
            for m, gi, c0, c1 in clay:
                cols.setdefault(gi, []).append((c0, c1, m))
            cgroups = tuple(sorted((gi, tuple(sorted(r)), _run_end(sorted(r))) for gi, r in cols.items()))
            self._blocks_cache = (rows_at, clay, (blocks, spans, cgroups))
        parts = [ix.rows(view, a, b) for a, b in spans]
        if len(parts) == 1:
            bs, bv, bt = parts[0]
        elif parts:
            bs, bv, bt = (np.concatenate(p) for p in zip(*parts, strict=True))
        else:
            bs, bv, bt = _NO_IDS32, _NO_VALS, _NO_VALS
        # counter matrices: each series' latest time, a gather per group of metrics kept alike (none
        # where every column has a sample in every row: the last row)
        g_series: list[np.ndarray] = []
        g_valid: list[np.ndarray | None] = []  # columns with a sample (None: all)
        g_t: list[np.ndarray] = []
        for gi, _, ncol in cgroups:
            g = ix.groups[gi]
            if g.last.size != ncol:
                return None  # a column of no counter metric (a history's groups are their metrics' columns)
            if not g.t.shape[0]:
                g_valid.append(np.zeros(ncol, bool))
                g_t.append(np.full(ncol, -np.inf))
            elif g.dense:
                g_valid.append(None)
                g_t.append(g.t[-1])
            else:
                last = np.maximum(g.last, 0)
                g_valid.append(g.last >= 0)
                g_t.append(g.t.reshape(-1)[last * ncol + np.arange(ncol)] if g.t.flags.c_contiguous
                           else g.t[last, np.arange(ncol)])
            g_series.append(g.series)
        key = (st, st.n, view.metrics, len(view.metrics), blocks, cgroups)
        lay = self._layout
        if lay is None or not lay.matches(key, bs, g_series, g_valid):
            # a new layout is built at once (a pass over the entries, as reading them pair by pair would
            # be): the next cycle of a steady fleet then reads only the times
            lay = self._layout = _Layout(key, blocks, cgroups, bs, g_series, g_valid)
            lay.build(self, st, masks, len(view.labelsets), len(view.metrics))
        ta = _cat([t if v is None else t[v] for t, v in zip(g_t, g_valid, strict=True)], _NO_VALS)
        present, current, gpus = lay.facts(self, st, masks, np.flatnonzero(bt <= lo), np.flatnonzero(~(ta > lo)))
        # A node's newest entry is its newest fresh one when it has a fresh one (later than every stale
        # entry); without one (``current`` 0) it has no fresh time.
        alive = current > 0
        newest = lay.newest(bt, ta, alive)[: st.rank_n]  # (less the spare slot: entries of no node)
        newest[~alive] = -np.inf
        return _Fresh(present, current, gpus, newest, lay.retained, lay.target_rows(0, bs, bt, bv, lo),
                      lay.target_rows(1, bs, bt, bv, lo))

    def _learn_targets(self, st: _SeriesTable, sids: np.ndarray) -> None:
        """``target_nodes`` learns the (target, node) pair of each series ``sids`` (distinct pairs, in
        order of first appearance) as one ``setdefault(target, set()).add(node)`` after the other would:
        by C-level passes where every target is new and carries one node (a cold fleet: 12.5k targets of
        one node each), else one pair at a time."""
        inst_l, node_l, tn = st.inst, st.node, self.target_nodes
        sid_l = sids.tolist()
        insts = list(map(inst_l.__getitem__, sid_l))
        if np.unique(st.inst_id[sids]).size == sids.size and tn.keys().isdisjoint(insts):
            tn.update(zip(insts, map(set, zip(map(node_l.__getitem__, sid_l))), strict=True))  # type: ignore[arg-type]
            return
        for inst, sid in zip(insts, sid_l, strict=True):
            tn.setdefault(inst, set()).add(node_l[sid])  # type: ignore[arg-type]

    def _metric_masks(self, metrics: list[str]) -> _Masks:
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

    def _row_metrics(self, masks: _Masks) -> list[int]:
        """The metrics whose rows are read (``up``, the scrape duration)."""
        c = self._rm_cache
        if c is None or c[0] is not masks:
            c = self._rm_cache = (masks, np.flatnonzero(masks[0] | masks[1]).tolist())
        return c[1]

    def _retained(self, view: Snapshot, st: _SeriesTable,
                  all_pairs: Callable[[], tuple[np.ndarray, np.ndarray]], all_valid: bool) -> np.ndarray:
        """Series per node in the whole view (not future-skewed): the one count that reads every row
        (``all_pairs``: the series and metric ids of the node's own samples, a row or more per pair).
        It depends only on which (metric, series) pairs the view holds, so a view of a history whose
        set of pairs is unchanged (``shape_token``) reuses the last count."""
        token = shape_token(view) if all_valid else None
        c = self._retained_cache
        if token is not None and c is not None and c[0] == token and c[1] is st and c[2] == st.n:
            return c[3]  # same pairs, same series table: the same count (nodes from targets are zeros)
        out = self._pairs_per_node(st, max(len(view.metrics), 1), max(len(view.labelsets), 1), *all_pairs())
        self._retained_cache = (token, st, st.n, out) if token is not None else None
        return out



def _rows_of(fm: np.ndarray, is_metric: np.ndarray) -> np.ndarray:
    """Mask of the rows whose metric is flagged (a view's metric names are interned: at most one)."""
    ids = np.flatnonzero(is_metric)
    if ids.size == 0:
        return np.zeros(fm.size, bool)
    if ids.size == 1:
        return fm == ids[0]
    return is_metric[fm]


@dataclass(slots=True)
class _Fresh:
    """What a view's fresh samples say, per node of the series table (in its order)."""

    present: np.ndarray | None  # per series: a fresh sample of the node's own (None: an empty view)
    current: np.ndarray  # fresh (metric, series) pairs of the node's own samples
    gpus: np.ndarray  # distinct GPUs among series with fresh GPU-metric samples
    newest: np.ndarray  # newest time of the node's own fresh samples (-inf: none)
    retained: np.ndarray  # (metric, series) pairs of the node's own samples in the whole view (not future)
    up: tuple[np.ndarray, np.ndarray]  # latest fresh `up` per series: (series ids ascending, values)
    dur: tuple[np.ndarray, np.ndarray]  # the same for `scrape_duration_seconds`

    @staticmethod
    def none(n_nodes: int) -> _Fresh:
        zeros = np.zeros(n_nodes, np.int64)
        return _Fresh(None, zeros, zeros, np.full(n_nodes, -np.inf), zeros, (_NO_IDS, _NO_VALS), (_NO_IDS, _NO_VALS))


def _gpu_order(g: str) -> tuple[int, str]:
    """GPU ids in index order (2 before 10), other ids after, by name."""
    return (int(g), "") if g.isdigit() else (1 << 30, g)


def _padded(a: np.ndarray, n: int, fill: float) -> np.ndarray:
    """``a`` (per node of the series table) followed by ``fill`` up to ``n`` nodes (``a`` itself when no
    node is missing: read only, it may be a kept layout's)."""
    if a.size == n:
        return a
    out = np.full(n, fill, a.dtype)
    out[: a.size] = a
    return out


def _newest(newest: np.ndarray, node_of: np.ndarray, fm: np.ndarray, fs: np.ndarray, ft: np.ndarray,
            is_target: np.ndarray, current: np.ndarray) -> None:
    """Per node, the newest time among its fresh entries (in place; -inf: none). Most nodes report in
    the newest scrape, so that scrape's entries are looked at first; a per-entry maximum over every
    fresh entry only when some node with fresh samples (``current`` > 0) has none in it."""
    if not ft.size:
        return
    t_max = ft.max()
    at = np.flatnonzero(ft == t_max)
    nodes = node_of[fs[at]]
    nodes = nodes[(nodes >= 0) & ~is_target[fm[at]]]
    has = np.zeros(newest.size, bool)
    has[nodes] = True
    if not (current > 0)[~has].any():
        newest[has] = t_max
        return
    nodes_r = node_of[fs]
    ok = (nodes_r >= 0) & ~is_target[fm]
    np.maximum.at(newest, nodes_r[ok], ft[ok])

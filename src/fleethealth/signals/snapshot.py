"""The columnar snapshot every source produces and the scoring engine consumes.

A snapshot is a bag of samples: (metric, series, value, timestamp). Series are interned label sets, so a
fleet of 100k GPUs with 25 metrics each carries 100k label sets, not 2.5M dictionaries. The engine never
sees text: sources parse, the snapshot stores numbers and ids.

A snapshot may carry several samples per series (a window of history); counters need that to become rates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class InputIssue:
    """A piece of input that became missing data instead of a signal: where it was and why."""

    source: str
    line: int
    reason: str
    text: str = ""

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.reason}" + (f": {self.text[:120]}" if self.text else "")


def label_float(labelset: LabelSet, label: str) -> float:
    """The float value of one label (a histogram's ``le``, ``+Inf`` included); NaN if absent or not a
    number."""
    for k, v in labelset:
        if k == label:
            try:
                return float(v)
            except ValueError:
                return float("nan")
    return float("nan")


def bucket_at_threshold(le: np.ndarray, threshold: float) -> np.ndarray:
    """Which histogram bucket samples (their ``le`` bounds) a latency SLO reads at ``threshold``: those
    at the largest bound <= threshold (none when no bound is that low). The engine scores with them and
    the history keeps only them, so both must use this one rule."""
    with np.errstate(invalid="ignore"):
        usable = le <= threshold + 1e-12
    if not usable.any():
        return np.zeros(le.shape, bool)
    return le == le[usable].max()


def freeze_labels(labels: Mapping[str, str]) -> LabelSet:
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


@dataclass(frozen=True, slots=True)
class CounterMatrix:
    """One counter metric's samples in a view, as a matrix: column j holds series ``series[j]``'s samples
    down the rows in time order (NaN: none in that row), values cumulative and reset-corrected (never
    decreasing down a column), ``last[j]`` the row of its latest sample (-1: none). A window's increase
    is then a difference of two entries, found without sorting anything."""

    series: np.ndarray  # (n,) ascending
    t: np.ndarray  # (rows, n)
    v: np.ndarray  # (rows, n)
    last: np.ndarray  # (n,)
    # Where it sits in a larger matrix of metrics kept alike (``ViewIndex.groups[group]``, columns
    # c0..c1): windows of several metrics are read off that one matrix at once.
    group: int = -1
    c0: int = 0
    c1: int = 0
    dense: bool = False  # no NaN: every series has a sample in every row
    # each row's earliest and latest sample time (a group's matrix: see ``score.kernels._rows_out``)
    row_times: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True, slots=True)
class ViewIndex:
    """What the maker of a view (the history) guarantees about its rows, so that the engine can skip
    sorting and read counter windows off matrices: each metric's rows are the block ``bounds[metric]``;
    ``counters``: the same samples as a ``CounterMatrix`` per counter metric (all of them, or none where
    a series' samples are out of time order); no NaN value; no timestamp after ``max_ts``. ``head``: the
    view's first rows (metric ids, series ids, values, times: every gauge's), readable without the rest
    being written (see ``HistoryView``). Valid only for the view it was made for, while its arrays are
    the ones it was made with (a snapshot rebuilt from a view's arrays does not carry it over)."""

    bounds: dict[int, tuple[int, int]]
    counters: dict[int, CounterMatrix]
    groups: list[CounterMatrix]
    max_ts: float
    head: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    owner: Callable[[], object]  # a weak reference to the view

    def valid_for(self, snap: Snapshot) -> bool:
        return self.owner() is snap

    def arrays(self, snap: Snapshot, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Series ids, values and times to read ``snap``'s rows below ``end`` from: ``head`` when it holds
        them (a HistoryView's other rows are then not written), else the snapshot's arrays."""
        if end <= self.head[0].size:
            return self.head[1], self.head[2], self.head[3]
        return snap.series_ids, snap.values, snap.ts

    def rows(self, snap: Snapshot, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Series ids, values and times of ``snap``'s rows a..b (see ``arrays``)."""
        s, v, t = self.arrays(snap, b)
        return s[a:b], v[a:b], t[a:b]


@dataclass(slots=True)
class Snapshot:
    """Columnar samples observed up to ``at``.

    metric_ids[i] indexes ``metrics``; series_ids[i] indexes ``labelsets``. Values are float64 with NaN
    never stored (bad values are dropped at the source and recorded in ``issues``).
    """

    at: float
    metrics: list[str]
    labelsets: list[LabelSet]
    metric_ids: np.ndarray
    series_ids: np.ndarray
    values: np.ndarray
    ts: np.ndarray
    issues: list[InputIssue] = field(default_factory=list)
    # Per-source errors (a dead exporter, an unreadable file): their entities go stale, never healthy.
    source_errors: list[InputIssue] = field(default_factory=list)
    # Set by the history on its views (a precomputed layout the engine may use; see ViewIndex).
    index: ViewIndex | None = None

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def index_upto(self, limit: float) -> ViewIndex | None:
        """``index`` when it holds for these very arrays and bounds every timestamp at or below ``limit``."""
        ix = self.index
        return ix if ix is not None and ix.valid_for(self) and ix.max_ts <= limit else None

    @staticmethod
    def empty(at: float) -> Snapshot:
        return Snapshot(
            at=at,
            metrics=[],
            labelsets=[],
            metric_ids=np.zeros(0, np.int32),
            series_ids=np.zeros(0, np.int32),
            values=np.zeros(0, np.float64),
            ts=np.zeros(0, np.float64),
        )

    def labels(self, series_id: int) -> dict[str, str]:
        return dict(self.labelsets[series_id])

    def metric_index(self) -> dict[str, int]:
        return {m: i for i, m in enumerate(self.metrics)}

    def rows(self) -> Iterable[tuple[str, dict[str, str], float, float]]:
        """Slow row view for tests, exports and explanation; never on the hot path."""
        for m, s, v, t in zip(
            self.metric_ids.tolist(), self.series_ids.tolist(), self.values.tolist(), self.ts.tolist(), strict=True
        ):
            yield self.metrics[m], dict(self.labelsets[s]), v, t

    def with_at(self, at: float) -> Snapshot:
        return Snapshot(
            at, self.metrics, self.labelsets, self.metric_ids, self.series_ids, self.values, self.ts,
            list(self.issues), list(self.source_errors),
        )


_ROWS = ("metric_ids", "series_ids", "values", "ts")
_ROW_SLOTS = {name: Snapshot.__dict__[name] for name in _ROWS}  # the base class's slot descriptors


class HistoryView(Snapshot):
    """A history's view: the first rows (every gauge, ``index.head``) are written when it is made; the
    rest (the counter samples of the window, most of it, which the engine reads off
    ``index.counters`` instead) only when something first reads ``metric_ids``, ``series_ids``,
    ``values`` or ``ts``. Otherwise a Snapshot: assigning new arrays to it drops its index, and a copy
    (pickle, deepcopy) is a plain Snapshot with every row and no index."""

    __slots__ = ("_fill", "_n", "__weakref__")

    def __init__(self, *args: Any, fill: Callable[[], tuple[np.ndarray, ...]] | None = None, n_rows: int = 0,
                 **kwargs: Any) -> None:
        self._fill = None
        self._n = -1  # being made: assignments are the constructor's
        Snapshot.__init__(self, *args, **kwargs)
        self._fill = fill
        self._n = n_rows

    def _materialize(self) -> None:
        fill, self._fill = self._fill, None
        assert fill is not None
        for name, arr in zip(_ROWS, fill(), strict=True):
            _ROW_SLOTS[name].__set__(self, arr)

    def __len__(self) -> int:
        return self._n if self._fill is not None else Snapshot.__len__(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Snapshot, (self.at, self.metrics, self.labelsets, self.metric_ids, self.series_ids, self.values,
                           self.ts, list(self.issues), list(self.source_errors)))


def _row_property(name: str) -> property:
    slot = _ROW_SLOTS[name]

    def get(self: HistoryView) -> np.ndarray:
        if self._fill is not None:
            self._materialize()
        return slot.__get__(self, Snapshot)  # type: ignore[no-any-return]

    def put(self: HistoryView, value: np.ndarray) -> None:
        if self._fill is not None:
            self._materialize()
        slot.__set__(self, value)
        if self._n >= 0 and self.index is not None and self.index.valid_for(self):
            self.index = None  # the index describes the rows the view was made with

    return property(get, put)


for _name in _ROWS:
    setattr(HistoryView, _name, _row_property(_name))


class SnapshotBuilder:
    """Accumulates samples with interned metric names and label sets, then freezes into a Snapshot."""

    def __init__(self) -> None:
        self.metrics: list[str] = []
        self._metric_ix: dict[str, int] = {}
        self.labelsets: list[LabelSet] = []
        self._labelset_ix: dict[LabelSet, int] = {}
        self._m: list[int] = []
        self._s: list[int] = []
        self._v: list[float] = []
        self._t: list[float] = []
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.issues: list[InputIssue] = []
        self.source_errors: list[InputIssue] = []
        self._shared = False  # see ``sharing``

    @classmethod
    def sharing(cls, names: SnapshotBuilder) -> SnapshotBuilder:
        """An empty builder that interns into ``names``' metric and label-set lists (appending to them) and
        builds snapshots holding those very lists, not copies. A source that builds every scrape this way
        (``exposition_plan.PagePlans``) hands the history the same lists every time, and the history
        (which maps ids per list, extending as a list grows) re-interns nothing. Ids stay valid: the lists
        are only ever appended to."""
        b = cls()
        b.metrics, b._metric_ix = names.metrics, names._metric_ix
        b.labelsets, b._labelset_ix = names.labelsets, names._labelset_ix
        b._shared = True
        return b

    def chunks(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The rows added so far, as (metric ids, series ids, values, times) arrays."""
        head = (np.asarray(self._m, np.int32), np.asarray(self._s, np.int32), np.asarray(self._v, np.float64),
                np.asarray(self._t, np.float64))
        return [head, *self._chunks] if self._m else list(self._chunks)

    def metric_id(self, name: str) -> int:
        ix = self._metric_ix.get(name)
        if ix is None:
            ix = self._metric_ix[name] = len(self.metrics)
            self.metrics.append(name)
        return ix

    def series_id(self, labels: LabelSet | Mapping[str, str]) -> int:
        key = labels if isinstance(labels, tuple) else freeze_labels(labels)
        ix = self._labelset_ix.get(key)
        if ix is None:
            ix = self._labelset_ix[key] = len(self.labelsets)
            self.labelsets.append(key)
        return ix

    def series_ids(self, sets: Sequence[LabelSet]) -> list[int]:
        """``series_id`` for many frozen label sets at once (same ids, same order of first appearance),
        with C-level dict and list operations: a new 100k-GPU scrape interns 100k label sets. One pass
        (``setdefault`` with the id each set gets if all are new) when all are new and none twice (a cold
        scrape) or all are known; a mix is undone and interned in four passes."""
        ix = self._labelset_ix
        n0, n = len(self.labelsets), len(sets)
        ids = list(map(ix.setdefault, sets, range(n0, n0 + n)))
        if len(ix) == n0 + n:  # all new and distinct: ids n0, n0 + 1, ... in order
            self.labelsets.extend(sets)
            return ids
        if len(ix) == n0:
            return ids
        for ls in [ls for ls, i in zip(sets, ids, strict=True) if i >= n0]:
            ix.pop(ls, None)
        new = [ls for ls in dict.fromkeys(sets) if ls not in ix]
        if new:
            ix.update(zip(new, range(len(self.labelsets), len(self.labelsets) + len(new)), strict=True))
            self.labelsets.extend(new)
        return list(map(ix.__getitem__, sets))

    def add(self, metric: str, labels: LabelSet | Mapping[str, str], value: float, ts: float) -> None:
        self._m.append(self.metric_id(metric))
        self._s.append(self.series_id(labels))
        self._v.append(float(value))
        self._t.append(float(ts))

    def add_arrays(self, metric_ids: np.ndarray, series_ids: np.ndarray, values: np.ndarray, ts: np.ndarray) -> None:
        """Bulk add with ids already obtained from ``metric_id``/``series_id``."""
        self._chunks.append(
            (
                np.asarray(metric_ids, np.int32),
                np.asarray(series_ids, np.int32),
                np.asarray(values, np.float64),
                np.asarray(ts, np.float64),
            )
        )

    def extend_snapshot(self, snap: Snapshot) -> None:
        """Merge another snapshot's samples, re-interning its ids into this builder."""
        if len(snap) == 0 and not snap.issues and not snap.source_errors:
            return
        mmap = np.array([self.metric_id(m) for m in snap.metrics] or [0], np.int32)
        smap = np.array([self.series_id(ls) for ls in snap.labelsets] or [0], np.int32)
        if len(snap):
            self.add_arrays(mmap[snap.metric_ids], smap[snap.series_ids], snap.values, snap.ts)
        self.issues.extend(snap.issues)
        self.source_errors.extend(snap.source_errors)

    def build(self, at: float) -> Snapshot:
        parts_m = [np.asarray(self._m, np.int32)] + [c[0] for c in self._chunks]
        parts_s = [np.asarray(self._s, np.int32)] + [c[1] for c in self._chunks]
        parts_v = [np.asarray(self._v, np.float64)] + [c[2] for c in self._chunks]
        parts_t = [np.asarray(self._t, np.float64)] + [c[3] for c in self._chunks]
        return Snapshot(
            at=at,
            metrics=self.metrics if self._shared else list(self.metrics),
            labelsets=self.labelsets if self._shared else list(self.labelsets),
            metric_ids=np.concatenate(parts_m),
            series_ids=np.concatenate(parts_s),
            values=np.concatenate(parts_v),
            ts=np.concatenate(parts_t),
            issues=list(self.issues),
            source_errors=list(self.source_errors),
        )


def merge_snapshots(snaps: Sequence[Snapshot], at: float | None = None) -> Snapshot:
    b = SnapshotBuilder()
    for s in snaps:
        b.extend_snapshot(s)
    when = at if at is not None else max((s.at for s in snaps), default=0.0)
    return b.build(when)


def window(snap: Snapshot, start: float, end: float) -> Snapshot:
    """Samples with start < ts <= end (ids and interning unchanged)."""
    keep = (snap.ts > start) & (snap.ts <= end)
    return Snapshot(
        end, snap.metrics, snap.labelsets, snap.metric_ids[keep], snap.series_ids[keep], snap.values[keep],
        snap.ts[keep], list(snap.issues), list(snap.source_errors),
    )


def order_by_series_time(series: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Permutation ordering samples by (series, time).

    Samples usually arrive in time order (scrapes, history chunks), each scrape listing its series in
    the same order, so a *stable* sort by series alone already orders each series by time: with few
    series (relabelled densely) that is a 16-bit radix sort, and with few sorted runs it is a timsort
    merge, both O(n). That is checked, not assumed; otherwise one sort of a combined float key (series
    major, time minor), several times faster than ``np.lexsort`` and exact while series x time span
    stays far below 2**52, with a lexsort fallback beyond."""
    n = series.size
    if n == 0:
        return np.zeros(0, np.int64)
    smax = int(series.max())
    order: np.ndarray | None = None
    if n > 64 and smax < 8 * n + 1_000_000:
        present = np.zeros(smax + 1, bool)
        present[series] = True
        if int(np.count_nonzero(present)) < 32768:
            dense = (np.cumsum(present, dtype=np.int64) - 1)[series].astype(np.int16)
            order = np.argsort(dense, kind="stable")
    if order is None and n > 64 and 16 * int(np.count_nonzero(series[1:] < series[:-1])) < n:
        order = np.argsort(series, kind="stable")  # few ascending runs: timsort merges them
    if order is not None:
        s_o, t_o = series[order], ts[order]
        if bool(((t_o[1:] >= t_o[:-1]) | (s_o[1:] != s_o[:-1])).all()):
            return order
    t0 = float(ts.min())
    span = float(ts.max()) - t0 + 1.0
    if float(smax) * span < 2.0**52 / 1024:
        return np.argsort(series.astype(np.float64) * span + (ts - t0))
    return np.lexsort((ts, series))

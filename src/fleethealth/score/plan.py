"""The layout plan: a history view's whole evaluation, every kind at once, as fixed numpy operations.

Theory of operation
-------------------
On a history's view the steady-state cycle is a fixed sequence of numpy operations (``_Plan``, kept in
the scorer's memory while the view's layout is the one it was built on: ``holds``): sub-scores and seen
are one flat buffer each of which a kind's signals x entities matrix is a block; raw and age one compact
buffer of the rows the plan writes, rates one of its counter rows (every other row of raw, rate, z, age
is made per row where taken: ``_Mats``); all gauges are one gather, each counter group's rates one window
(a sustained signal's over its whole window; a two-window ramp's short window gathered too, then
confirmed by the long one in one pass); ramps, gates and flags one element-wise pass per kind's block of
rows (``_ShapeBlock``), then the two-window ramps' floor flags; the SLOs of a kind one batch; peers
shaped one by one; anything else (Xids, several series per entity) goes through ``_evaluate``. The plan is built from the same per-signal lookups as the row path and gives the
same numbers (tests: batched == row path == scalar reference). ``_ShapePlan`` is what the batched shapes
need from a kind's signal list alone. A snapshot without a view index is evaluated signal by signal
(``signals._evaluate_kind``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.policy import Policy, SignalSpec
from fleethealth.score.context import _cols_ix, _Columns, _Ctx, _Mats, _SignalResult
from fleethealth.score.health import EntityKind
from fleethealth.score.kernels import _is_counter, _value_flags
from fleethealth.score.resolve import KINDS, _KindTable
from fleethealth.score.signals import _evaluate, _shape_peer
from fleethealth.score.slo import _slo_batch, _slo_inputs

if TYPE_CHECKING:
    from fleethealth.score.kept import Kept


@dataclass
class _ShapePlan:
    """Per signal of one kind's list, what the batched evaluation needs from the policy alone."""

    code: np.ndarray  # 0 other, 1 ramp, 2 gate, 3 flag, 4 peer
    counter: np.ndarray  # bool: the shape reads the rate (else the raw value)
    max_age: np.ndarray
    window: np.ndarray
    warn: np.ndarray  # ramp
    span: np.ndarray  # ramp: crit - warn
    above: np.ndarray  # gate / flag threshold (NaN: none; nothing is above NaN)
    flag_score: np.ndarray


_SHAPE_CODES = {"ramp": 1, "gate": 2, "flag": 3, "peer": 4}


def _shape_plan(kept: Kept, policy: Policy, specs: list[SignalSpec]) -> _ShapePlan:
    key = (id(policy), tuple(id(s) for s in specs))
    hit = kept.shape_plans.get(key)
    if hit is not None and hit[0] is policy and all(a is b for a, b in zip(hit[1], specs, strict=True)):
        return hit[2]
    fr = policy.freshness

    def col(f: Any) -> np.ndarray:
        return np.array([f(s) for s in specs], np.float64)

    plan = _ShapePlan(
        np.array([_SHAPE_CODES.get(s.shape or "", 0) if s.shape != "xid" else 0 for s in specs], np.int64),
        np.array([_is_counter(s) for s in specs], bool),
        col(lambda s: s.max_age_s or fr.max_age_s),
        col(lambda s: s.rate_window_s or fr.rate_window_s),
        col(lambda s: s.warn if s.shape == "ramp" else np.nan),
        # the same float subtraction shapes.ramp does per call
        col(lambda s: (s.crit - s.warn) if s.shape == "ramp" else np.nan),
        col(lambda s: s.above if s.above is not None else np.nan),
        col(lambda s: s.flag_score if s.shape == "flag" else np.nan),
    )
    if len(kept.shape_plans) > 64:
        kept.shape_plans.clear()
    kept.shape_plans[key] = (policy, list(specs), plan)
    return plan


# an SLO's (request, good) columns: (metric, series, entity, column in the matrix group) each
_SloColumns = tuple[tuple[str, np.ndarray, np.ndarray, np.ndarray], tuple[str, np.ndarray, np.ndarray, np.ndarray]]


class _RowOffsets:
    """A compact buffer's layout: per (kind, signal), the offset of its row (of the kind's entity count),
    handed out in order of first asking."""

    def __init__(self) -> None:
        self.at: dict[tuple[EntityKind, int], int] = {}
        self.size = 0

    def of(self, kind: EntityKind, j: int, n: int) -> int:
        o = self.at.get((kind, j))
        if o is None:
            o = self.at[(kind, j)] = self.size
            self.size += n
        return o

    def rows_of(self, kind: EntityKind) -> list[tuple[int, int]]:
        """``kind``'s rows: (signal, offset)."""
        return [(j, o) for (k, j), o in self.at.items() if k == kind]


@dataclass
class _ShapeBlock:
    """One kind's rows of one shape (ramp, gate, flag) in the layout plan: shaped as one rows x
    entities block."""

    kind: EntityKind
    off: int  # the kind's block in the flat sub-scores: offset, signals, entities
    m: int
    n: int
    js: np.ndarray  # the rows' signals
    src: list[tuple[bool, int]]  # per row: whether it reads its rate (else its raw value), the row's offset
    p1: np.ndarray  # per row (a column): ramp warn; gate / flag threshold
    p2: np.ndarray  # ramp crit - warn; flag score


class _Plan:
    """How one view layout is evaluated, every kind at once: built from the per-signal lookups
    (``gauge_rows``, ``columns``) on a history's view, kept while the layout it read is the same (the
    checks in ``holds``), so that a steady-state cycle is a fixed sequence of numpy operations:

    * every kind's sub-scores and seen live in one flat buffer each (a kind's ``_Mats`` are m x n views
      of its block); raw and age in compact buffers of the rows written here, rates of the counter rows
      (the rows of ``_Mats``' per-row quantities), a signal's result is rows of those;
    * gauges with one row per series and one series per entity: one gather of values and times for all
      of them, one scatter into raw and age;
    * counters with one column per entity: the group's rates (once per group, window and least span,
      shared with every signal of the group), one gather per group; a two-window ramp's short-window
      rates gathered likewise into one buffer, then ``_confirmed_short`` for all of them at once;
    * ramp, gate and flag shapes: one element-wise pass per kind over its rows of the shape (the same
      arithmetic as ``shapes.ramp`` / ``shapes.gate``, the parameters broadcast per row); then the floor flags
      of every two-window ramp (``_floor_flags``) from one comparison;
    * peer signals shaped one by one (grouped medians), everything else (Xids, SLOs, several series
      per entity, rows without a matrix) through ``_evaluate``.
    """

    def __init__(self, ctx: _Ctx, tables: dict[str, _KindTable], specs: dict[str, list[SignalSpec]]) -> None:
        pol = ctx.policy
        self.policy, self.tables = pol, tables
        self.kinds: list[tuple[EntityKind, int, int, int]] = []  # (kind, offset, m, n)
        off = 0
        for kind in KINDS:
            n = len(tables[kind].names)
            if n:
                self.kinds.append((kind, off, len(specs[kind]), n))
                off += len(specs[kind]) * n
        self.size = off
        self.mids: dict[str, int | None] = {}  # every metric the checks read: its id (None: absent)
        self.absent: list[str] = []  # gauges without a sample: nothing to read (unseen, NaN)
        self.absent_any: list[str] = []  # metrics without a sample or a matrix (likewise)
        self.gbounds: dict[int, tuple[int, int]] = {}
        self.cmats: dict[int, tuple[int, int, int]] = {}  # counter metric -> (group, c0, c1)
        self.rest: list[tuple[EntityKind, int]] = []
        self.slos: list[tuple[EntityKind, int]] = []  # SLOs whose columns are looked up every cycle
        # SLOs read off dense matrices: their request and good columns (metric, series, entity, column
        # in the group; None: nothing to score), as long as the plan holds
        self.fixed_slos: list[tuple[EntityKind, int, _SloColumns | None]] = []
        self.peers: list[tuple[EntityKind, int, np.ndarray, np.ndarray]] = []  # (kind, signal, source series, has one)
        g_src: list[np.ndarray] = []
        g_dest: list[np.ndarray] = []
        g_age: list[tuple[int, float]] = []  # per gauge signal: its entities, its max age
        # per group, window, max age and least span: the columns read, where they go in raw / age and in rate
        c_sets: dict[tuple[int, float, float, float], tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
        # two-window counter ramps: their short windows' rates land in one compact buffer (a signal's n
        # entities at a time, ``tw``) read by the confirmation pass
        s_sets: dict[tuple[int, float, float], tuple[list[np.ndarray], list[np.ndarray]]] = {}
        tw: list[tuple[int, int, int, float]] = []  # (flat result index, offset of its row, n, warn)
        tw_names: list[str] = []
        tw_rt: list[int] = []  # per two-window row: its offset in rate
        shaped: dict[int, list[tuple[EntityKind, int, int, int, bool]]] = {1: [], 2: [], 3: []}
        params: dict[int, list[tuple[float, float]]] = {1: [], 2: [], 3: []}  # per shaped entry: see shapes
        self.order: list[tuple[EntityKind, int]] = []  # flat result index -> (kind, signal)
        # raw and age live in one compact buffer of the rows the plan writes, rates in one of the counter
        # rows (the rest of those matrices is NaN, never written here: ``_Mats``): per (kind, signal), the
        # offset of its row there
        self.ra, self.rt = _RowOffsets(), _RowOffsets()
        ra, rt = self.ra.of, self.rt.of

        seen = np.zeros(self.size, bool)
        assert ctx.index is not None
        for kind, off, _, n in self.kinds:
            table = tables[kind]
            plan = _shape_plan(ctx.kept, pol, specs[kind])
            for j, spec in enumerate(specs[kind]):
                self.order.append((kind, j))
                code = int(plan.code[j])
                if spec.shape == "slo":
                    fixed = self._fixed_slo(ctx, spec, kind, table)
                    if isinstance(fixed, bool):
                        self.slos.append((kind, j))
                    else:
                        self.fixed_slos.append((kind, j, fixed))
                    continue
                # xids, and shapes the batched pass does not do (a flag on values or bits, a ratio of two
                # metrics): the per-signal path
                if spec.shape == "xid" or code == 0 or spec.relative_to is not None or (
                        spec.shape == "flag" and (spec.values or spec.bits)):
                    mid = ctx.metric_ix.get(spec.metric)
                    self.mids[spec.metric] = mid
                    if mid is None or (mid not in ctx.bounds and mid not in ctx.index.counters):
                        self.absent_any.append(spec.metric)  # no sample, no matrix: unseen, NaN
                    else:
                        self.rest.append((kind, j))
                    continue
                mid = ctx.metric_ix.get(spec.metric)
                self.mids[spec.metric] = mid
                if _is_counter(spec):
                    cols = ctx.columns(spec.metric, spec.match, kind, table)
                    if cols is None and (mid is None or mid not in ctx.bounds):
                        self.absent_any.append(spec.metric)  # no sample, no matrix: unseen, NaN
                        continue
                    # one column per entity: every column of the metric's (cols.single), or those with
                    # samples when some have none (a vanished exporter's, while remembered)
                    if (cols is None or not cols.series.size or code == 4 or (
                            spec.short_window_s is not None and code != 1) or not (
                            cols.single or (not isinstance(cols.cols, slice)
                                            and int(np.bincount(cols.ent).max()) <= 1))):
                        self.rest.append((kind, j))
                        continue
                    assert mid is not None
                    self.cmats[mid] = (cols.mat.group, cols.mat.c0, cols.mat.c1)
                    dest = off + j * n + cols.ent
                    # a sustained signal's rate is over its whole window (``min_span``), as in
                    # ``_evaluate_counter_columns``
                    span = float(plan.window[j]) if spec.sustained else 0.0
                    src, dst, dst_rt = c_sets.setdefault(
                        (cols.mat.group, float(plan.window[j]), float(plan.max_age[j]), span), ([], [], []))
                    src.append(_cols_ix(cols))
                    dst.append(ra(kind, j, n) + cols.ent)
                    dst_rt.append(rt(kind, j, n) + cols.ent)
                    if spec.short_window_s is not None:
                        assert spec.warn is not None
                        base = sum(t[2] for t in tw)
                        tw.append((len(self.order) - 1, off + j * n, n, float(spec.warn)))
                        tw_rt.append(rt(kind, j, n))
                        tw_names.append(f"floor:{spec.name}")
                        src, dst = s_sets.setdefault(
                            (cols.mat.group, float(spec.short_window_s), float(plan.max_age[j])), ([], []))
                        src.append(_cols_ix(cols))
                        dst.append(base + cols.ent)
                else:
                    if mid is None or mid not in ctx.bounds:
                        self.absent.append(spec.metric)
                        continue
                    rows = ctx.gauge_rows(spec.metric, spec.match, kind, table)
                    if rows is None or not rows.single or not rows.ent.size:
                        self.rest.append((kind, j))
                        continue
                    self.gbounds[mid] = (rows.a, rows.b)
                    dest = off + j * n + rows.ent
                    g_src.append(rows.a + (np.arange(rows.b - rows.a) if rows.sel is None else rows.sel))
                    g_dest.append(ra(kind, j, n) + rows.ent)
                    g_age.append((int(rows.ent.size), plan.max_age[j]))
                    if code == 4:
                        src_series = np.full(n, -1, np.int64)
                        src_series[rows.ent] = rows.ser
                        self.peers.append((kind, j, src_series, src_series >= 0))
                seen[dest] = True
                if code in shaped:
                    shaped[code].append((kind, j, off, n, bool(plan.counter[j])))
                    # ramp: warn, crit - warn; gate / flag: the threshold (NaN: none), the flag's score
                    params[code].append((plan.warn[j], plan.span[j]) if code == 1 else
                                        (plan.above[j], plan.flag_score[j]))
        self.seen = seen
        z = np.zeros(0, np.int64)
        self.g_src = np.concatenate(g_src) if g_src else z
        self.g_dest = np.concatenate(g_dest) if g_dest else z
        self.g_age = g_age  # (runs of one max age each, not an array of it per element)
        # the gauges' whole blocks (their series, one after the other), to check that their rows still
        # hold the same series
        self.g_end = max((b for _, b in self.gbounds.values()), default=0)
        series = ctx.row_arrays(self.g_end)[0]
        self.g_block_series = (np.concatenate([series[a:b] for a, b in self.gbounds.values()]) if self.gbounds
                               else series[:0].copy())
        self.c_sets = [(g, w, a, span, np.concatenate(src), np.concatenate(dst), np.concatenate(dst_rt))
                       for (g, w, a, span), (src, dst, dst_rt) in c_sets.items()]
        self.s_sets = [(g, w, a, np.concatenate(src), np.concatenate(dst)) for (g, w, a), (src, dst) in s_sets.items()]
        # the two-window rows, flat: position, warn, result index, entity, and which signal (its floor flag)
        per_tw = [n for _, _, n, _ in tw]
        self.tw_idx = np.concatenate([row + np.arange(n) for _, row, n, _ in tw]) if tw else z
        self.tw_rt = np.concatenate([o + np.arange(n) for o, n in zip(tw_rt, per_tw, strict=True)]) if tw else z
        self.tw_warn = np.repeat([w for *_, w in tw], per_tw) if tw else np.zeros(0)
        self.tw_res = np.repeat([r for r, *_ in tw], per_tw) if tw else z
        self.tw_ent = np.concatenate([np.arange(n) for n in per_tw]) if tw else z
        self.tw_sig = np.repeat(np.arange(len(tw)), per_tw) if tw else z
        self.tw_names = tw_names
        self.c_series = {g: ctx.index.groups[g].series.copy() for g in sorted({g for g, _, _ in self.cmats.values()})}
        self.c_cols = {g: np.concatenate([np.arange(c0, c1) for gg, c0, c1 in self.cmats.values() if gg == g])
                       for g in self.c_series}
        # which of those columns have samples (the columns read are those: they must stay so)
        self.c_keep = {g: ctx.index.groups[g].last[c] >= 0 for g, c in self.c_cols.items()}
        self.c_keep_all = {g: bool(k.all()) for g, k in self.c_keep.items()}
        # per shape, per kind: a block of rows shaped together (rows x entities, the parameters per row,
        # broadcast), not flat per-element index and parameter arrays (20 MB kept at 100k GPUs)
        self.shapes: dict[int, list[_ShapeBlock]] = {}
        self.shaped = shaped
        for code, rows_ in shaped.items():
            blocks: list[_ShapeBlock] = []
            for kind, off, m, n in self.kinds:
                at = [i for i, r in enumerate(rows_) if r[0] == kind]
                if not at:
                    continue
                # where each row's value is: its rate (compact rate buffer) or its raw value
                reads = [(True, self.rt.at[(kind, rows_[i][1])]) if rows_[i][4] else
                         (False, self.ra.at[(kind, rows_[i][1])]) for i in at]
                blocks.append(_ShapeBlock(
                    kind, off, m, n, np.array([rows_[i][1] for i in at], np.int64), reads,
                    np.array([params[code][i][0] for i in at], np.float64)[:, None],
                    np.array([params[code][i][1] for i in at], np.float64)[:, None]))
            if blocks:
                self.shapes[code] = blocks
        # per kind, its rows of the compact buffers: (signal, offset)
        self.ra_rows = {kind: self.ra.rows_of(kind) for kind, *_ in self.kinds}
        self.rt_rows = {kind: self.rt.rows_of(kind) for kind, *_ in self.kinds}

    def _fixed_slo(self, ctx: _Ctx, spec: SignalSpec, kind: EntityKind,
                   table: _KindTable) -> _SloColumns | None | bool:
        """An SLO's request and good columns when both counters are dense matrices read whole (every
        series has samples: what they are follows from the layout ``holds`` checks); False otherwise."""
        assert spec.requests_metric is not None and ctx.index is not None
        good_name = spec.metric + "_bucket" if spec.threshold_s is not None else spec.metric
        req = ctx.columns(spec.requests_metric, None, kind, table)
        good_c = ctx.columns(good_name, spec.match, kind, table)
        if req is None or good_c is None:
            return False
        groups = ctx.index.groups
        for c in (req, good_c):
            if not (isinstance(c.cols, slice) and groups[c.mat.group].dense and groups[c.mat.group].t.shape[0]):
                return False
        for name, c in ((spec.requests_metric, req), (good_name, good_c)):
            self.mids[name] = ctx.metric_ix.get(name)
            mid = self.mids[name]
            assert mid is not None
            self.cmats[mid] = (c.mat.group, c.mat.c0, c.mat.c1)
        inputs = _slo_inputs(ctx, spec, kind, req, good_c)
        if inputs is None:
            return None
        # what the columns are, without the view they came from (the plan outlives it)
        return tuple((name, c.series, c.ent, _cols_ix(c))  # type: ignore[return-value]
                     for name, c in ((spec.requests_metric, inputs[0]), (good_name, inputs[1])))

    def holds(self, ctx: _Ctx) -> bool:
        """Whether this view is laid out as the one the plan was built on, where the plan reads it."""
        ix = ctx.index
        if ix is None or ctx.policy is not self.policy:
            return False
        metric_ix, bounds = ctx.metric_ix, ctx.bounds
        for name, mid in self.mids.items():
            if metric_ix.get(name) != mid:
                return False
        for name in self.absent:
            mid = metric_ix.get(name)
            if mid is not None and mid in bounds:
                return False
        for name in self.absent_any:
            mid = metric_ix.get(name)
            if mid is not None and (mid in bounds or mid in ix.counters):
                return False
        for mid, ab in self.gbounds.items():
            if bounds.get(mid) != ab:
                return False
        for mid, (g, c0, c1) in self.cmats.items():
            mat = ix.counters.get(mid)
            if mat is None or mat.group != g or mat.c0 != c0 or mat.c1 != c1:
                return False
        for g, ser in self.c_series.items():
            grp = ix.groups[g] if g < len(ix.groups) else None
            if grp is None or not np.array_equal(grp.series, ser):
                return False
            # the same columns have samples (every one in a dense matrix)
            if not (grp.dense and grp.t.shape[0] and self.c_keep_all[g]) and not np.array_equal(
                    grp.last[self.c_cols[g]] >= 0, self.c_keep[g]):
                return False
        series, at = ctx.row_arrays(self.g_end)[0], 0
        for a, b in self.gbounds.values():
            if not np.array_equal(series[a:b], self.g_block_series[at:at + b - a]):
                return False
            at += b - a
        return True

    def run(self, ctx: _Ctx, specs: dict[str, list[SignalSpec]],
            ) -> tuple[dict[str, list[_SignalResult]], dict[str, _Mats]]:
        L = self.size
        # separate allocations, not one: each stays under malloc's mmap threshold (32 MiB, memory.py) at
        # 100k GPUs, so a steady cycle reuses the last one's freed blocks instead of faulting them in.
        # Sub-scores are whole matrices (aggregation reads them); raw, age and rate only the rows the plan
        # writes (a third of them at 100k GPUs on a dcgm-exporter fleet: 45 MB less), other rows and z
        # made per row where taken (``_Mats``)
        sub_f = np.full(L, np.nan)
        raw_f, age_f, rate_f = np.full(self.ra.size, np.nan), np.full(self.ra.size, np.nan), np.full(
            self.rt.size, np.nan)
        seen_f = self.seen.copy()
        mats: dict[str, _Mats] = {}
        results: dict[str, list[_SignalResult]] = {}
        flat: list[_SignalResult] = []
        for kind, off, m, n in self.kinds:
            mt = mats[kind] = _Mats.__new__(_Mats)
            mt.sub, mt.seen = (a[off:off + m * n].reshape(m, n) for a in (sub_f, seen_f))
            ra_rows = self.ra_rows[kind]
            mt.lazy_rows(m, n, {j: raw_f[o:o + n] for j, o in ra_rows}, {j: rate_f[o:o + n] for j, o in self.rt_rows[kind]},
                         {j: age_f[o:o + n] for j, o in ra_rows})
            results[kind] = [mt.result(j) for j in range(m)]
            flat.extend(results[kind])
        now = ctx.now
        if self.g_src.size:
            _, values, ts = ctx.row_arrays(self.g_end)
            age_s = now - ts[self.g_src]
            fresh = np.empty(age_s.size, bool)
            at = 0
            for k, max_age in self.g_age:
                np.less_equal(age_s[at:at + k], max_age, out=fresh[at:at + k])
                at += k
            age_f[self.g_dest] = np.maximum(age_s, 0.0)
            raw_f[self.g_dest[fresh]] = values[self.g_src[fresh]]
        for g, window, max_age, span, src, dest, dest_rt in self.c_sets:
            rate, last_v, age = ctx.rates(ctx.index.groups[g], window, max_age, span)  # type: ignore[union-attr]
            rate_f[dest_rt] = rate[src]
            raw_f[dest] = last_v[src]
            age_f[dest] = age[src]
        if self.tw_idx.size:  # the short windows, where the long window confirms them (``_confirmed_short``)
            short = np.full(self.tw_idx.size, np.nan)
            for g, window, max_age, src, dest in self.s_sets:
                short[dest] = ctx.rates(ctx.index.groups[g], window, max_age)[0][src]  # type: ignore[union-attr]
            long_rate = rate_f[self.tw_rt]
            with np.errstate(invalid="ignore"):
                confirmed = long_rate > self.tw_warn
            rate_f[self.tw_rt] = np.where(confirmed, np.fmax(long_rate, short), long_rate)
        with np.errstate(invalid="ignore", divide="ignore"):
            for code, blocks in self.shapes.items():
                for blk in blocks:
                    kind, n, js, p1, p2 = blk.kind, blk.n, blk.js, blk.p1, blk.p2
                    x = np.empty((js.size, n))
                    for i, (is_rate, o) in enumerate(blk.src):
                        x[i] = (rate_f if is_rate else raw_f)[o:o + n]
                    sub_k = sub_f[blk.off:blk.off + blk.m * n].reshape(blk.m, n)
                    if code == 1:
                        sub_k[js] = np.clip(1.0 - (x - p1) / p2, 0.0, 1.0)
                        continue
                    bad = x > p1
                    if code == 2:
                        for i, j in enumerate(js.tolist()):
                            for val in specs[kind][j].values or ():  # np.isin's answer for a few floats: equality
                                bad[i] |= x[i] == float(val)
                        sub = np.where(bad, 0.0, 1.0)
                        sub[np.isnan(x)] = np.nan
                        sub_k[js] = sub
                        for i, e in zip(*(a.tolist() for a in np.nonzero(sub == 0)), strict=True):
                            j = int(js[i])
                            results[kind][j].notes[e] = f"gate fired: {specs[kind][j].metric}={x[i, e]:g}"
                    else:
                        sub_k[js] = np.where(bad, p2, np.where(np.isnan(x), np.nan, 1.0))
                        for i, e in zip(*(a.tolist() for a in np.nonzero(bad)), strict=True):
                            j = int(js[i])
                            if specs[kind][j].flag:
                                results[kind][j].flags.append((e, specs[kind][j].flag))  # type: ignore[arg-type]
                for kind, j, *_, counter in self.shaped[code]:
                    spec = specs[kind][j]
                    if spec.value_flags:
                        res = results[kind][j]
                        res.flags.extend(_value_flags(res.rate if counter else res.raw, spec.value_flags))
        # a two-window ramp's floor: ``_floor_flags``
        for h in np.flatnonzero(sub_f[self.tw_idx] == 0).tolist():
            flat[int(self.tw_res[h])].flags.append((int(self.tw_ent[h]), self.tw_names[int(self.tw_sig[h])]))
        for kind, j, src_series, has_src in self.peers:
            res = results[kind][j]
            res.sub[:] = _shape_peer(ctx, specs[kind][j], kind, res.raw, src_series, has_src, res)
        for kind, j in self.rest:
            _evaluate(ctx, specs[kind][j], kind, self.tables[kind], results[kind][j])
        slo_jobs: dict[str, list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]]] = {}
        for kind, j, fixed in self.fixed_slos:
            if fixed is not None:
                fixed_req, fixed_good = (_Columns(ctx, ctx.matrix(name), ser, ent, cols)  # type: ignore[arg-type]
                                         for name, ser, ent, cols in fixed)
                slo_jobs.setdefault(kind, []).append((specs[kind][j], fixed_req, fixed_good, results[kind][j]))
        for kind, j in self.slos:
            spec, table, res = specs[kind][j], self.tables[kind], results[kind][j]
            assert spec.requests_metric is not None
            req = ctx.columns(spec.requests_metric, None, kind, table)
            good_c = ctx.columns(spec.metric + "_bucket" if spec.threshold_s is not None else spec.metric,
                                 spec.match, kind, table)
            if req is None or good_c is None:
                _evaluate(ctx, spec, kind, table, res)  # rows
                continue
            inputs = _slo_inputs(ctx, spec, kind, req, good_c)
            if inputs is not None:
                slo_jobs.setdefault(kind, []).append((spec, inputs[0], inputs[1], res))
        for jobs in slo_jobs.values():
            _slo_batch(ctx, jobs)
        return results, mats

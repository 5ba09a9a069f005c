"""Signal evaluation: one policy signal for every entity of a kind -> sub-scores in [0, 1].

Theory of operation
-------------------
Per signal and kind: the latest fresh sample per series (gauges) or a reset-aware rate over the window
(counters; a counter ramp with ``short_window_s`` also reads a short window, which counts once the long
window's rate is past ``warn``: ``_confirmed_short``), reduced per entity (the worst), then shaped into a sub-score (gate, ramp, flag, peer robust z
with grouped median/MAD, Xid classes; SLOs in score/slo.py). Missing or stale data is NaN: never a score.
A gauge series superseded by a newer one of the same entity (a relabel: a driver rolled back) no longer
counts, as Prometheus marks it stale at the first scrape without it: only the entity's series at its newest
sample time do (``_current``; series of one scrape share a timestamp).
A read-only signal (``score: false``) stops at its fresh raw value and age: its sub-score is NaN.
``_evaluate`` is the reference per-signal path; on a history's view it reads gauge rows and counter
matrices directly (``_evaluate_gauge_rows``, ``_evaluate_counter_columns``) with the same numbers. Peer
groups and an Xid gauge's row layout depend only on which series exist: kept in the scorer's memory
(``ctx.kept``) while those are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleethealth.policy import SignalSpec
from fleethealth.score import shapes
from fleethealth.score.context import _Columns, _Ctx, _GaugeRows, _Mats, _SignalResult
from fleethealth.score.health import EntityKind
from fleethealth.score.kernels import (
    _counter_runs,
    _fresh_rate,
    _in_order,
    _increase_per_series,
    _is_counter,
    _latest_per_series,
    _reduce_worst,
    _value_flags,
)
from fleethealth.score.resolve import _KindTable, _uniq
from fleethealth.score.slo import _evaluate_slo
from fleethealth.signals.snapshot import InputIssue
from fleethealth.signals.xid import classify_xid


def _evaluate(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, table: _KindTable,
              res: _SignalResult | None = None) -> _SignalResult:
    """One signal for every entity of ``kind``, written into ``res`` (all NaN / unseen on entry; a fresh
    one when None). Every writer fills the result's arrays in place: they may be rows of one matrix."""
    n = len(table.names)
    pol = ctx.policy
    if res is None:
        res = _Mats(1, n).result(0)
    snap = ctx.snap
    if spec.shape == "slo":
        return _evaluate_slo(ctx, spec, kind, table, res)
    if spec.relative_to is not None:
        return _evaluate_relative(ctx, spec, kind, table, res)
    if _is_counter(spec) and spec.shape != "xid":
        cols = ctx.columns(spec.metric, spec.match, kind, table)
        if cols is not None:
            return _evaluate_counter_columns(ctx, spec, kind, cols, res)
    elif spec.shape != "xid" and ctx.index is not None:
        rows = ctx.gauge_rows(spec.metric, spec.match, kind, table)
        if rows is not None:
            return _evaluate_gauge_rows(ctx, spec, kind, rows, res)
    if spec.shape == "xid" and spec.kind == "gauge" and ctx.index is not None:
        xid_rows = _xid_rows(ctx, spec, kind, table)
        if xid_rows is not None:
            idx, ser, ent, layout = xid_rows
            if idx.size:
                res.seen[ent] = True
                _evaluate_xid(ctx, spec, idx, ser, ent, res, layout)
            return res
    idx = ctx.samples(spec.metric, spec.match)
    if idx.size == 0:
        return res
    ser = snap.series_ids[idx]
    ent = table.entities(ctx.resolver.arr[kind][ser])
    keep = ent >= 0
    idx, ser, ent = idx[keep], ser[keep], ent[keep]
    if idx.size == 0:
        return res
    res.seen[ent] = True
    max_age = spec.max_age_s or pol.freshness.max_age_s
    now = ctx.now
    if spec.shape == "xid":
        return _evaluate_xid(ctx, spec, idx, ser, ent, res)
    vals, ts = snap.values[idx], snap.ts[idx]
    higher_worse = spec.worse_if == "higher"
    if _is_counter(spec):
        window = spec.rate_window_s or pol.freshness.rate_window_s
        s_ids, inc, t0, t1, last_v, last_t = _counter_runs(ser, vals, ts, now - window)
        # series -> entity: counters of one entity add up (e.g. per-link NVLink counters)
        ent_of_series = np.full(int(ser.max()) + 1, -1, np.int64)
        ent_of_series[ser] = ent
        _counter_rates(res, ent_of_series[s_ids], inc, t0, t1, last_v, last_t, now, max_age,
                       window if spec.sustained else 0.0)
        if spec.short_window_s is not None:
            s_ids, inc, t0, t1, _, _ = _counter_runs(ser, vals, ts, now - spec.short_window_s)
            short = _entity_rates(ent_of_series[s_ids], inc, t0, t1, now, max_age, n)
            res.rate[:] = _confirmed_short(res.rate, short, spec)
        x = res.rate
    else:
        lp = _latest_per_series(ser, ts)
        lp = lp[_current(ent[lp], ts[lp], n)]
        age_s = now - ts[lp]
        fresh = age_s <= max_age
        res.age[:] = _reduce_worst(ent[lp], np.maximum(age_s, 0.0), n, False)
        lpf = lp[fresh]
        res.raw[:] = _reduce_worst(ent[lpf], vals[lpf], n, higher_worse)
        _any_series_at(spec, ent[lpf], vals[lpf], res)
        x = res.raw
    res.sub[:] = _shape(ctx, spec, kind, x, ser, ent, lp if not _is_counter(spec) else None, res, n)
    if spec.short_window_s is not None:
        _floor_flags(res, spec)
    return res


def _evaluate_relative(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, table: _KindTable,
                       res: _SignalResult) -> _SignalResult:
    """A gauge scored as a share of another metric of the same entity (``relative_to``: the PCIe link
    generation of its device maximum): both read as plain gauges (the worst series of each entity), the
    ratio is ``raw``; no fresh reference (or a reference of 0) is no score."""
    own = _evaluate(ctx, spec.model_copy(update={"relative_to": None}), kind, table)
    ref = _evaluate(ctx, spec.model_copy(update={"relative_to": None, "metric": spec.relative_to}), kind, table)
    res.seen[:] = own.seen
    res.age[:] = own.age
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(ref.raw > 0, own.raw / np.where(ref.raw > 0, ref.raw, 1.0), np.nan)
    res.raw[:] = ratio
    res.sub[:] = _shape(ctx, spec, kind, ratio, np.zeros(0, np.int64), np.zeros(0, np.int64), None, res, ratio.size)
    return res


def _evaluate_kind(ctx: _Ctx, kind: EntityKind, table: _KindTable,
                   specs: list[SignalSpec]) -> tuple[list[_SignalResult], _Mats]:
    """Every signal of one kind, one by one (the plain path: a snapshot without a view index)."""
    mats = _Mats(len(specs), len(table.names))
    results = [mats.result(j) for j in range(len(specs))]
    for j, spec in enumerate(specs):
        _evaluate(ctx, spec, kind, table, results[j])
    return results, mats


def _evaluate_gauge_rows(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, rows: _GaugeRows,
                         res: _SignalResult) -> _SignalResult:
    """``_evaluate`` of a gauge whose view rows hold one sample per series (a history's view): the same
    numbers, with the row -> entity map kept from the last cycle."""
    n = res.sub.size
    if rows.ent.size == 0:
        return res
    now = ctx.now
    res.seen[rows.ent] = True
    max_age = spec.max_age_s or ctx.policy.freshness.max_age_s
    _, values, times = ctx.row_arrays(rows.b)
    vals, ts = values[rows.a:rows.b], times[rows.a:rows.b]
    if rows.sel is not None:
        vals, ts = vals[rows.sel], ts[rows.sel]
    age_s = now - ts
    fresh = age_s <= max_age
    if rows.single:
        res.age[rows.ent] = np.maximum(age_s, 0.0)
        res.raw[rows.ent[fresh]] = vals[fresh]
        lp = np.arange(rows.ent.size)
    else:
        cur = _current(rows.ent, ts, n)
        fresh &= cur
        lp = np.flatnonzero(cur)
        res.age[:] = _reduce_worst(rows.ent[cur], np.maximum(age_s[cur], 0.0), n, False)
        res.raw[:] = _reduce_worst(rows.ent[fresh], vals[fresh], n, spec.worse_if == "higher")
        _any_series_at(spec, rows.ent[fresh], vals[fresh], res)
    res.sub[:] = _shape(ctx, spec, kind, res.raw, rows.ser, rows.ent, lp, res, n)
    return res


def _current(ent: np.ndarray, ts: np.ndarray, n: int) -> np.ndarray:
    """Per series (its latest sample ``ts``, its entity ``ent``): whether it is current, not superseded.
    A relabel (a driver rolled back) ends a series and starts another for the same entity and metric; the
    old one's last sample stays fresh for ``max_age`` but Prometheus would have marked it stale at the
    first scrape without it. Series of one entity scraped together share a timestamp exactly (a node's
    GPUs, per-link NVLink series), so only those at the entity's newest sample time count."""
    if ent.size < 2:
        return np.ones(ent.size, bool)
    newest = np.full(n, -np.inf)
    np.maximum.at(newest, ent, ts)
    return np.asarray(ts >= newest[ent])


def _any_series_at(spec: SignalSpec, ent: np.ndarray, vals: np.ndarray, res: _SignalResult) -> None:
    """A flag on exact ``values`` over several series per entity (an NVLink state per link): the entity's
    raw value is a flagged one when any of its series is at one, whatever the others' order (a link down
    among links up, or not supported, is still down)."""
    if spec.shape != "flag" or not spec.values or ent.size == 0:
        return
    at = np.isin(vals, np.asarray(spec.values, np.float64))
    if at.any():
        res.raw[ent[at]] = vals[at]


def _entity_rates(e: np.ndarray, inc: np.ndarray, t0: np.ndarray, t1: np.ndarray, now: float, max_age: float,
                  n: int, min_span: float = 0.0) -> np.ndarray:
    """A counter's rate per entity (NaN: none fresh) from its per-series window (``e``: the entity of each
    series); the series of one entity add up (e.g. per-link NVLink counters)."""
    out = np.full(n, np.nan)
    rate = _fresh_rate(inc, t0, t1, now, max_age, min_span)
    good = ~np.isnan(rate)
    one_per_entity = e.size == 0 or np.bincount(e).max() <= 1
    if good.any():
        if one_per_entity:
            out[e[good]] = rate[good]
        else:
            acc = np.zeros(n)
            cnt = np.zeros(n)
            np.add.at(acc, e[good], rate[good])
            np.add.at(cnt, e[good], 1)
            out[:] = np.where(cnt > 0, acc, np.nan)
    return out


def _confirmed_short(long_rate: np.ndarray, short_rate: np.ndarray, spec: SignalSpec) -> np.ndarray:
    """The rate a counter ramp with ``short_window_s`` scores: the long window's, or the short window's
    where that is worse and the long window confirms it (its rate past ``warn``: enough events that the
    short window is not reading noise). Only ever worse than the long window alone, so onset is the
    short window's and recovery the long window's."""
    assert spec.warn is not None
    with np.errstate(invalid="ignore"):
        confirmed = long_rate > spec.warn
    return np.where(confirmed, np.fmax(long_rate, short_rate), long_rate)


def _counter_rates(res: _SignalResult, e: np.ndarray, inc: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                   last_v: np.ndarray, last_t: np.ndarray, now: float, max_age: float, min_span: float = 0.0) -> None:
    """A counter's rate, raw (latest value) and age per entity from its per-series window (``e``: the
    entity of each series; ``min_span``: a sustained signal's window, the least time a rate is over)."""
    n = res.rate.size
    res.rate[:] = _entity_rates(e, inc, t0, t1, now, max_age, n, min_span)
    # the latest sample of a series is its latest in the window whenever it has one in the window
    res.raw[:] = _reduce_worst(e, last_v, n, True)
    res.age[:] = _reduce_worst(e, now - last_t, n, False)


def _evaluate_counter_columns(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, cols: _Columns,
                              res: _SignalResult) -> _SignalResult:
    """``_evaluate`` of a counter read off the view's matrix: the same numbers without the rows."""
    if cols.series.size == 0:
        return res
    pol, now = ctx.policy, ctx.now
    res.seen[cols.ent] = True
    window = spec.rate_window_s or pol.freshness.rate_window_s
    max_age = spec.max_age_s or pol.freshness.max_age_s
    span = window if spec.sustained else 0.0
    if cols.single:  # one series per entity: rates of the whole group at once, then placed
        rate, last_v, age = (a[cols.cols] for a in ctx.rates(cols.mat, window, max_age, span))
        res.rate[cols.ent] = rate
        res.raw[cols.ent] = last_v
        res.age[cols.ent] = age
    else:
        inc, t0, t1, last_v, last_t, _ = cols.window(now - window)
        _counter_rates(res, cols.ent, inc, t0, t1, last_v, last_t, now, max_age, span)
    if spec.short_window_s is not None:
        n = res.rate.size
        if cols.single:
            short = np.full(n, np.nan)
            short[cols.ent] = ctx.rates(cols.mat, spec.short_window_s, max_age)[0][cols.cols]
        else:
            inc, t0, t1, *_ = cols.window(now - spec.short_window_s)
            short = _entity_rates(cols.ent, inc, t0, t1, now, max_age, n)
        res.rate[:] = _confirmed_short(res.rate, short, spec)
    res.sub[:] = _shape(ctx, spec, kind, res.rate, cols.series, cols.ent, None, res, res.sub.size)
    if spec.short_window_s is not None:
        _floor_flags(res, spec)
    return res


def _floor_flags(res: _SignalResult, spec: SignalSpec) -> None:
    """Flag ``floor:<signal>`` on every entity a two-window counter ramp scores 0: its critical rate,
    confirmed by the long window. The lifecycle's fast path (``lifecycle.floor_dwell_s``) acts on it."""
    for e in np.flatnonzero(res.sub == 0).tolist():
        res.flags.append((e, f"floor:{spec.name}"))


def _shape(
    ctx: _Ctx, spec: SignalSpec, kind: EntityKind, x: np.ndarray, ser: np.ndarray, ent: np.ndarray,
    lp: np.ndarray | None, res: _SignalResult, n: int,
) -> np.ndarray:
    if not spec.score:  # read-only: its fresh raw value is all there is (no shape, no peer statistics)
        return np.full(n, np.nan)
    if spec.shape == "ramp":
        assert spec.warn is not None and spec.crit is not None
        return shapes.ramp(x, spec.warn, spec.crit)
    if spec.shape == "gate":
        sub = shapes.gate(x, spec.above, spec.values)
        if spec.value_flags:
            res.flags.extend(_value_flags(x, spec.value_flags))
        for e in np.flatnonzero(sub == 0).tolist():
            res.notes[e] = f"gate fired: {spec.metric}={x[e]:g}"
        return sub
    if spec.shape == "flag":
        sub = np.where(np.isnan(x), np.nan, 1.0)
        raised = np.zeros(n, bool)
        if spec.above is not None:
            with np.errstate(invalid="ignore"):
                raised = x > spec.above
        if spec.values:
            raised = raised | np.isin(x, np.asarray(spec.values, np.float64))
        if spec.bits:
            known = np.isfinite(x) & (x >= 0)
            xi = np.where(known, x, 0.0).astype(np.int64)
            for bit, name in sorted(spec.bits.items()):
                on = known & ((xi & bit) != 0)
                raised = raised | on
                res.flags.extend((e, name) for e in np.flatnonzero(on).tolist())
        sub = np.where(raised, spec.flag_score, sub)
        for e in np.flatnonzero(raised).tolist():
            if spec.flag:
                res.flags.append((e, spec.flag))
        if spec.value_flags:
            res.flags.extend(_value_flags(x, spec.value_flags))
        return sub
    if spec.shape == "peer":
        # Peer group of an entity: the peer labels of the label set its (latest) sample came from.
        assert lp is not None
        src_series = np.full(n, -1, np.int64)
        src_series[ent[lp]] = ser[lp]
        return _shape_peer(ctx, spec, kind, x, src_series, src_series >= 0, res)
    raise AssertionError(f"unhandled shape {spec.shape}")


def _shape_peer(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, x: np.ndarray, src_series: np.ndarray,
                has_src: np.ndarray, res: _SignalResult) -> np.ndarray:
    """The peer shape: robust z of each entity's value (``x``) against its peer group, the group
    chosen by the labels of the series its value came from (``src_series``, -1: none); writes ``res.z``
    (NaN on entry) and the notes of groups too small to score."""
    pol = ctx.policy
    have = ~np.isnan(x) & has_src
    peers = _peer_groups(ctx, spec, kind, src_series, have)
    if peers is None:
        return np.full(x.size, np.nan)
    ents, groups, n_groups, layout, small = peers
    k_warn = spec.k_warn if spec.k_warn is not None else pol.peer.k_warn
    k_crit = spec.k_crit if spec.k_crit is not None else pol.peer.k_crit
    xv = x[ents]
    if layout is not None and bool(np.isfinite(xv).all()):
        z, med, _mad, _ = shapes.peer_robust_z_laid_out(
            xv, layout, worse_if=spec.worse_if, min_rel_dev=spec.min_rel_dev, mad_floor_rel=spec.mad_floor_rel)
    else:
        z, med, _mad, _ = shapes.peer_robust_z(
            xv, groups, n_groups, worse_if=spec.worse_if, min_rel_dev=spec.min_rel_dev,
            mad_floor_rel=spec.mad_floor_rel,
        )
    # a peer signal's ``rate`` is its relative deviation from the group's median, positive = worse (what
    # a slow rank costs its synchronous job: decide.chronic prices it)
    m = med[groups]
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(m != 0, (xv - m) / np.abs(np.where(m != 0, m, 1.0)), np.nan)
    res.rate[ents] = -rel if spec.worse_if == "lower" else rel
    if small is not None:
        min_peers = spec.min_peers if spec.min_peers is not None else pol.peer.min_peers
        z = np.where(small, np.nan, z)
        res.rate[ents[small]] = np.nan
        for e in ents[small].tolist():
            res.notes[e] = f"too few peers (< {min_peers}) in its group: not scored"
            res.flags.append((e, f"too_few_peers:{spec.name}"))
    res.z[ents] = z
    exported = ctx.resolver.group_exported(tuple(spec.peer_by))[src_series[ents]]
    if exported.any():  # a scraper renamed the exporter's peer labels: say which ones the peers came from
        by = "/".join(spec.peer_by)
        for e in ents[exported].tolist():
            res.notes.setdefault(e, f"peers grouped by the exporter's own {by} (exported_*: a scraper with"
                                    " honor_labels: false replaced them)")
    return shapes.ramp(res.z, k_warn, k_crit)


_PeerGroups = tuple[np.ndarray, np.ndarray, int, "shapes.PeerLayout | None", "np.ndarray | None"]


def _peer_groups(ctx: _Ctx, spec: SignalSpec, kind: str, src_series: np.ndarray,
                 have: np.ndarray) -> _PeerGroups | None:
    """The entities a peer signal scores (``have``), their peer group ids (0..n_groups-1, in order of
    first label-set group id), a ``PeerLayout`` when the groups suit it, and which entities are in
    groups below the minimum size (None: none); None when no entity is scored. Depends only on which
    series each entity's sample came from: kept while that is unchanged (``src_series`` is not changed
    by its owner once passed)."""
    label_groups = ctx.resolver.group_ids(tuple(spec.peer_by))
    key = (id(spec), kind, src_series.size)
    hit = ctx.kept.peers.get(key)
    if (hit is not None and hit[0] is spec and hit[1] is label_groups
            and (hit[2] is src_series or np.array_equal(hit[2], src_series)) and np.array_equal(hit[3], have)):
        return hit[4]
    ents = np.flatnonzero(have)
    out: _PeerGroups | None = None
    if ents.size:
        raw_groups = label_groups[src_series[ents]]
        present = _uniq(raw_groups)
        remap = np.full(int(raw_groups.max()) + 1, -1, np.int64)
        remap[present] = np.arange(present.size)
        groups = remap[raw_groups]
        n_groups = int(present.size)
        layout = shapes.PeerLayout(groups, n_groups) if shapes.PeerLayout.fits(groups, n_groups) else None
        min_peers = spec.min_peers if spec.min_peers is not None else ctx.policy.peer.min_peers
        small = np.bincount(groups, minlength=n_groups)[groups] < min_peers
        out = (ents, groups, n_groups, layout, small if small.any() else None)
    if len(ctx.kept.peers) > 64:
        ctx.kept.peers.clear()
    ctx.kept.peers[key] = (spec, label_groups, src_series, have.copy(), out)
    return out


@dataclass
class _XidLayout:
    """Rows of a last-Xid gauge in a history's view, one block in series order: where each series'
    rows end (``lp``, ``last``), where a new series starts (``change``, between rows), the entity of
    each series' latest row and whether those are one per entity. Valid while the rows are in time
    order within each series (checked per call)."""

    lp: np.ndarray
    last: np.ndarray
    change: np.ndarray
    ent_lp: np.ndarray
    single: bool
    steps: np.ndarray  # 0..size-1


def _xid_rows(ctx: _Ctx, spec: SignalSpec, kind: str, table: _KindTable,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, _XidLayout | None] | None:
    """A last-Xid gauge's rows of a history's view that belong to an entity of ``kind`` (positions,
    series, entities) and their ``_XidLayout``; kept while the block holds the same series. None when
    the metric has no rows."""
    mid = ctx.metric_ix.get(spec.metric)
    if mid is None or mid not in ctx.bounds:
        return None
    a, b = ctx.bounds[mid]
    block = ctx.row_arrays(b)[0][a:b]
    key = (id(spec), kind)
    hit = ctx.kept.xids.get(key)
    if hit is None or hit[0] is not table or hit[6] is not spec or not np.array_equal(hit[1], block):
        ent = table.entities(ctx.resolver.arr[kind][block])
        keep = ent >= 0
        if spec.match:
            keep &= ctx.resolver.label_match(spec.match)[block]
        sel = None if bool(keep.all()) else np.flatnonzero(keep)
        ser, ent = (block.copy(), ent) if sel is None else (block[sel], ent[sel])
        layout = None
        if ser.size and bool((np.diff(ser) >= 0).all()):
            change = ser[1:] != ser[:-1]
            last = np.append(change, True)
            lp = np.flatnonzero(last)
            ent_lp = ent[lp]
            layout = _XidLayout(lp, last, change, ent_lp, int(np.bincount(ent_lp).max()) <= 1, np.arange(ser.size))
        hit = (table, block.copy(), sel, ser, ent, layout, spec)  # holds the spec its key names
        if len(ctx.kept.xids) > 64:
            ctx.kept.xids.clear()
        ctx.kept.xids[key] = hit
    _, _, sel, ser, ent, layout, _ = hit
    idx = np.arange(a, b) if sel is None else a + sel
    return idx, ser, ent, layout


def _evaluate_xid(
    ctx: _Ctx, spec: SignalSpec, idx: np.ndarray, ser: np.ndarray, ent: np.ndarray, res: _SignalResult,
    layout: _XidLayout | None = None,
) -> _SignalResult:
    """Xids from DCGM's last-Xid gauge (value = the Xid) or a per-xid counter (label ``xid``).
    ``layout``: how a history view's rows of the gauge lie (``_xid_rows``)."""
    pol, snap, now = ctx.policy, ctx.snap, ctx.now
    xp = pol.xid
    window = spec.xid_window_s or xp.window_s
    max_age = spec.max_age_s or pol.freshness.max_age_s
    n = res.sub.size
    _, values, times = ctx.row_arrays(int(idx.max()) + 1 if idx.size else 0)
    vals, ts = values[idx], times[idx]
    presorted = ctx.index is not None
    if layout is not None and not bool((layout.change | (np.diff(ts) >= 0)).all()):
        layout = None  # not in time order within a series: sort, as without a layout
    # Fresh evidence that the source is alive: sub-score 1 unless an Xid gates it.
    lp = layout.lp if layout is not None else _latest_per_series(ser, ts, presorted)
    ent_lp = layout.ent_lp if layout is not None else ent[lp]
    age_s = now - ts[lp]
    fresh_lp = age_s <= max_age
    newest: np.ndarray | None = None  # per entity, its newest sample: older series are superseded
    if layout is not None and layout.single:
        res.age[ent_lp] = np.maximum(age_s, 0.0)
    else:
        cur_lp = _current(ent_lp, ts[lp], n)
        if not cur_lp.all():  # a relabel: the old series' Xids no longer count (``_current``)
            newest = np.full(n, -np.inf)
            np.maximum.at(newest, ent_lp, ts[lp])
            fresh_lp &= cur_lp
        res.age[:] = _reduce_worst(ent_lp[cur_lp], np.maximum(age_s[cur_lp], 0.0), n, False)
    fresh_e = np.zeros(n, bool)
    fresh_e[ent_lp[fresh_lp]] = True
    codes: list[tuple[int, int]] = []  # (entity, xid)
    if spec.kind == "gauge":
        # DCGM's last-Xid field keeps its value until the exporter restarts, so a value is an occurrence
        # only when it *started* within the Xid window: the start of the series' final run of equal
        # values (the history keeps that start). With no earlier evidence the first sample is the start.
        if layout is not None:  # rows already in (series, time) order
            s_o, v_o, t_o, e_o = ser, vals, ts, ent
            change, last, steps = layout.change, layout.last, layout.steps
        else:
            order = _in_order(ser, ts, presorted)
            s_o, v_o, t_o, e_o = ser[order], vals[order], ts[order], ent[order]
            change = s_o[1:] != s_o[:-1]
            last = np.append(change, True)
            steps = np.arange(s_o.size)
        new_run = np.ones(s_o.size, bool)
        new_run[1:] = change | (v_o[1:] != v_o[:-1])
        run_start_ts = t_o[np.maximum.accumulate(np.where(new_run, steps, 0))]
        w = last & (v_o > 0) & (run_start_ts > now - window) & (now - t_o <= max_age)
        if newest is not None:
            w &= t_o >= newest[e_o]
        if w.any():
            for e, v in set(zip(e_o[w].tolist(), v_o[w].astype(np.int64).tolist(), strict=True)):
                codes.append((e, v))
        if layout is not None and layout.single:
            res.raw[ent_lp[fresh_lp]] = vals[lp][fresh_lp]
        else:
            res.raw[:] = _reduce_worst(ent_lp[fresh_lp], vals[lp][fresh_lp], n, True)
    else:
        inw = ts > now - window
        s_ids, inc, _t0, _t1, _ = _increase_per_series(ser[inw], vals[inw], ts[inw])
        hit = np.flatnonzero(np.nan_to_num(inc) > 0)
        ent_of_series = {s: e for s, e in zip(ser.tolist(), ent.tolist(), strict=True)}
        last_of_series = dict(zip(ser[lp].tolist(), ts[lp].tolist(), strict=True))
        for i in hit.tolist():
            s = int(s_ids[i])
            if newest is not None and last_of_series[s] < newest[ent_of_series[s]]:
                continue  # superseded by a newer series of the same GPU
            x = dict(snap.labelsets[s]).get("xid", "")
            try:
                codes.append((ent_of_series[s], int(float(x))))
            except ValueError:
                ctx.issues.append(InputIssue("<snapshot>", 0, f"{spec.metric}: xid label is not a number", x))
        res.raw[:] = np.where(fresh_e, 0.0, np.nan)
    sub = np.where(fresh_e, 1.0, np.nan)
    for e, code in sorted(codes):
        cls = classify_xid(code, xp.gate_buckets, xp.gate_xids, xp.app_xids, xp.reset_xids)
        res.flags.append((e, f"xid:{code}"))
        if cls == "gate":
            sub[e] = 0.0
            res.notes[e] = f"Xid {code} gates the GPU (needs reset or reboot)"
        elif cls == "reset":
            res.flags.append((e, "row_remap_pending"))
        elif cls == "unknown":
            res.flags.append((e, f"xid_unknown:{code}"))
            ctx.issues.append(InputIssue("<snapshot>", 0, f"unknown Xid {code}: not in NVIDIA's catalog; counted, not scored"))
        res.raw[e] = float(code) if np.isnan(res.raw[e]) or res.raw[e] == 0 else res.raw[e]
    res.sub[:] = sub
    return res

"""SLO signals: error ratio or latency (a histogram bucket at a threshold) as multi-window burn rates.

Theory of operation
-------------------
An SLO's sub-score is the worst of its window pairs (long and short, Google SRE's multi-window burn
rate): per entity, the bad share of requests over each window against the error budget, ramped from 1x
to the pair's factor. On rows (``_evaluate_slo``) each counter is sorted once and made cumulative, so an
increase over any window is a difference found by binary search. On a history's counter matrices the
SLOs of one kind are one batch (``_slo_batch``): every SLO's request and good counts over every window in
one bincount, then the burn rates as SLOs x windows x entities arrays, element by element the arithmetic
of ``shapes.burn_rate`` / ``shapes.slo_score``. Which bucket a latency SLO reads (so which entities it sees and
what their notes say) and the bins of a batch depend only on which series exist: kept in the scorer's
memory while those are unchanged.

A latency threshold that is not a bound of an entity's histogram is read at the histogram's nearest bound
below it (``signals.slo_buckets``: conservative, requests in between count as slow), and the entity's
detail says so; one whose histogram has no bound that low is not scored, and says why, rather than read
``pending:`` for ever.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from fleethealth.policy import SignalSpec
from fleethealth.score import shapes
from fleethealth.score.context import _cols_ix, _Columns, _Ctx, _SignalResult
from fleethealth.score.health import EntityKind
from fleethealth.score.resolve import _KindTable
from fleethealth.signals.slo_buckets import buckets_at_threshold, histogram_ids
from fleethealth.signals.snapshot import CounterMatrix, order_by_series_time


def _evaluate_slo(ctx: _Ctx, spec: SignalSpec, kind: EntityKind, table: _KindTable, res: _SignalResult) -> _SignalResult:
    """Error ratio (``metric`` errors / ``requests_metric``) or latency (histogram ``metric``_bucket at
    ``threshold_s``) against the SLO, as multi-window burn rates."""
    pol, snap, now = ctx.policy, ctx.snap, ctx.now
    n = res.sub.size
    objective = spec.objective or pol.slo.objective
    max_age = spec.max_age_s or pol.freshness.max_age_s
    assert spec.requests_metric is not None
    good_name = spec.metric + "_bucket" if spec.threshold_s is not None else spec.metric
    req_c = ctx.columns(spec.requests_metric, None, kind, table)
    good_c = ctx.columns(good_name, spec.match, kind, table)
    if req_c is not None and good_c is not None:
        return _evaluate_slo_columns(ctx, spec, kind, req_c, good_c, res)
    req_idx = ctx.samples(spec.requests_metric)
    if req_idx.size == 0:
        return res
    with_bucket: np.ndarray | None = None  # latency: entities whose histogram has a bound to read
    if spec.threshold_s is not None:
        bidx = ctx.samples(spec.metric + "_bucket", spec.match)
        bser = snap.series_ids[bidx]
        le = ctx.resolver.label_floats("le")[bser]
        at = buckets_at_threshold(le, histogram_ids(snap.labelsets, bser), spec.threshold_s)
        good_idx = bidx[at]
        ent_b = table.entities(ctx.resolver.arr[kind][bser[at]])
        with_bucket = _bucket_notes(res.notes, n, spec, ent_b[ent_b >= 0], le[at][ent_b >= 0])
    else:
        good_idx = ctx.samples(spec.metric, spec.match)

    class _Windows:
        """Sorted once per metric; increase over any (start, now] by binary search. Values are made
        reset-corrected cumulative along each series first (like PromQL), so an increase is a
        difference of two entries."""

        def __init__(self, idx: np.ndarray) -> None:
            ser = snap.series_ids[idx]
            ent = table.entities(ctx.resolver.arr[kind][ser])
            keep = ent >= 0
            ser, ent, ts, v = ser[keep], ent[keep], snap.ts[idx][keep], snap.values[idx][keep]
            order = order_by_series_time(ser, ts)
            self.ser, self.ent, self.ts, v = ser[order], ent[order], ts[order], v[order]
            n_s = self.ser.size
            start = np.ones(n_s, bool)
            start[1:] = self.ser[1:] != self.ser[:-1]
            d = np.diff(v, prepend=v[0] if n_s else 0.0)
            d = np.where(d < 0, v, d)
            d[start] = 0.0
            self.cum = np.cumsum(d)
            self.starts = np.flatnonzero(start)
            self.ends = np.concatenate((self.starts[1:], [n_s])) - 1 if n_s else np.zeros(0, np.int64)
            self.t0 = float(self.ts.min()) if n_s else 0.0
            self.span = float(self.ts.max()) - self.t0 + 1.0 if n_s else 1.0
            self.key = self.ser.astype(np.float64) * self.span + (self.ts - self.t0)

        def per_entity(self, start: float) -> tuple[np.ndarray, np.ndarray]:
            """increase per entity over (start, now] and the age of the last sample."""
            inc_e = np.full(n, np.nan)
            age_e = np.full(n, np.nan)
            if self.ser.size == 0:
                return inc_e, age_e
            sids = self.ser[self.starts]
            q = sids.astype(np.float64) * self.span + (start - self.t0)
            first = np.maximum(np.searchsorted(self.key, q, side="right"), self.starts)
            last = self.ends
            ok = last > first
            inc = np.where(ok, self.cum[last] - self.cum[np.minimum(first, last)], np.nan)
            e = self.ent[self.starts]
            good = ok & ~np.isnan(inc)
            acc = np.zeros(n)
            cnt = np.zeros(n)
            np.add.at(acc, e[good], inc[good])
            np.add.at(cnt, e[good], 1)
            inc_e = np.where(cnt > 0, acc, np.nan)
            has = first <= last
            np.fmin.at(age_e, e[has], now - self.ts[last[has]])
            return inc_e, age_e

    # seen / freshness from the request counter
    ser_all = snap.series_ids[req_idx]
    ent_all = table.entities(ctx.resolver.arr[kind][ser_all])
    _seen(res.seen, res.notes, spec, ent_all[ent_all >= 0], with_bucket)
    burns: list[tuple[np.ndarray, np.ndarray, float]] = []
    last_total = None
    req_w, good_w = _Windows(req_idx), _Windows(good_idx)
    for w in pol.slo.windows:
        pair = []
        for win in (w.long_s, w.short_s):
            total, age = req_w.per_entity(now - win)
            good, _ = good_w.per_entity(now - win)
            if spec.threshold_s is not None:
                bad = np.where(np.isnan(good), np.where(total > 0, np.nan, 0.0), total - good)
                bad = np.clip(bad, 0.0, None)
            else:
                bad = np.where(np.isnan(good), 0.0, good)  # no error samples in window: no errors
            pair.append(shapes.burn_rate(bad, total, objective))
            if last_total is None:
                res.age[:] = age
                last_total = total
        burns.append((pair[0], pair[1], w.factor))
    return _slo_result(res, burns, max_age)


def _bucket_notes(notes: dict[int, str], n: int, spec: SignalSpec, ent: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Say, per entity, which bucket bound its latency SLO reads where that is below the threshold (the
    nearest bound at or below it: requests between the two count as slow); returns the entities with a
    bucket to read."""
    assert spec.threshold_s is not None
    low = bound < spec.threshold_s - 1e-12
    if low.any():
        lowest = np.full(n, np.inf)
        np.minimum.at(lowest, ent[low], bound[low])
        for e in np.flatnonzero(np.isfinite(lowest)).tolist():
            notes[e] = (f"no histogram bucket at {spec.threshold_s:g} s: read at le={lowest[e]:g} s, the "
                        f"nearest bound below (requests between the two count as slow)")
    return np.unique(ent)


def _seen(seen: np.ndarray, notes: dict[int, str], spec: SignalSpec, req_ent: np.ndarray,
          with_bucket: np.ndarray | None) -> None:
    """Mark the entities with request counters seen; of a latency SLO only those with a bucket at or below
    the threshold to read (one without is not pending for ever: it says why it is not scored)."""
    if with_bucket is None:
        seen[req_ent] = True
        return
    ok = np.isin(req_ent, with_bucket)
    seen[req_ent[ok]] = True
    for e in np.unique(req_ent[~ok]).tolist():
        notes[e] = (f"no histogram bucket at or below the {spec.threshold_s:g} s threshold (the policy's "
                    f"threshold is below the histogram's first bound): not scored")


def _seen_and_notes(ctx: _Ctx, spec: SignalSpec, req: _Columns, good_c: _Columns, res: _SignalResult) -> None:
    """``_seen`` and, for a latency SLO, ``_bucket_notes`` off the view's columns. Both depend only on which
    series are read (not on their values): a latency SLO's seen entities and notes are kept in the scorer's
    memory while its columns are the same arrays (a kept plan's), and written again each cycle."""
    if spec.threshold_s is None:
        res.seen[req.ent] = True
        return
    le = ctx.resolver.label_floats("le")
    n = res.sub.size
    key = (id(spec), n)
    hit = ctx.kept.slo_seen.get(key)
    if (hit is None or hit[0] is not spec or hit[1] is not le or hit[2] is not req.ent or hit[3] is not good_c.ent
            or hit[4] is not good_c.series):
        seen, notes = np.zeros(n, bool), dict[int, str]()
        _seen(seen, notes, spec, req.ent, _bucket_notes(notes, n, spec, good_c.ent, le[good_c.series]))
        hit = (spec, le, req.ent, good_c.ent, good_c.series, np.flatnonzero(seen), list(notes.items()))
        if len(ctx.kept.slo_seen) > 64:
            ctx.kept.slo_seen.clear()
        ctx.kept.slo_seen[key] = hit
    res.seen[hit[5]] = True
    res.notes.update(hit[6])


def _slo_result(res: _SignalResult, burns: list[tuple[np.ndarray, np.ndarray, float]], max_age: float) -> _SignalResult:
    sub = shapes.slo_score(burns)
    fresh = res.age <= max_age
    res.sub[:] = np.where(fresh, sub, np.nan)
    # explanation: burn rate of the fastest pair's short window
    res.rate[:] = burns[0][1]
    res.raw[:] = burns[0][0]
    return res


def _slo_bucket(ctx: _Ctx, spec: SignalSpec, kind: str, mat: CounterMatrix, present: np.ndarray,
                good_c: _Columns) -> np.ndarray:
    """Which of ``good_c``'s columns are the buckets a latency SLO reads (``buckets_at_threshold``, per
    histogram among the metric's ``present`` series; none of a histogram without a bound low enough).
    Kept while its inputs are."""
    assert spec.threshold_s is not None
    le = ctx.resolver.label_floats("le")
    key = (id(spec), kind)
    hit = ctx.kept.buckets.get(key)
    if (hit is not None and hit[0] is spec and hit[1] is le and np.array_equal(hit[2], mat.series)
            and np.array_equal(hit[3], present) and np.array_equal(hit[4], good_c.series)):
        return hit[5]  # type: ignore[return-value]  # always an array since buckets became per histogram
    pres = mat.series[present]
    at = buckets_at_threshold(le[pres], histogram_ids(ctx.snap.labelsets, pres), spec.threshold_s)
    sel = np.flatnonzero(np.isin(good_c.series, pres[at]))
    if len(ctx.kept.buckets) > 64:
        ctx.kept.buckets.clear()
    ctx.kept.buckets[key] = (spec, le, mat.series.copy(), present.copy(), good_c.series.copy(), sel)
    return sel


def _slo_inputs(ctx: _Ctx, spec: SignalSpec, kind: str, req: _Columns,
                good_c: _Columns) -> tuple[_Columns, _Columns] | None:
    """The request and good (buckets at the threshold, or error) columns an SLO reads off the view's
    matrices; None when it has nothing to score (no request series). A latency SLO's entities without a
    bucket to read are among the request columns only: not scored, and they say why."""
    if spec.threshold_s is not None:
        # each histogram's bucket is chosen among its present series, as on rows, then read per entity
        mat = ctx.matrix(spec.metric + "_bucket")
        assert mat is not None
        present = mat.last >= 0
        if spec.match:
            present &= ctx.resolver.label_match(spec.match)[mat.series]
        good_c = good_c.only(_slo_bucket(ctx, spec, kind, mat, present, good_c))
    if req.series.size == 0:
        return None
    return req, good_c


def _evaluate_slo_columns(ctx: _Ctx, spec: SignalSpec, kind: str, req: _Columns, good_c: _Columns,
                          res: _SignalResult) -> _SignalResult:
    """``_evaluate_slo`` read off the view's counter matrices, every window at once."""
    inputs = _slo_inputs(ctx, spec, kind, req, good_c)
    if inputs is not None:
        _slo_batch(ctx, [(spec, inputs[0], inputs[1], res)])
    return res


def _slo_batch(ctx: _Ctx, jobs: list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]]) -> None:
    """Several SLOs of one kind off the view's counter matrices at once: each SLO's request and good
    counts per entity over every window (one bincount for all of them, bins (SLO, counter, window,
    entity): each bin sums its series in the same order as one SLO alone would), then the burn rates
    and the multi-window score as arrays of SLOs x windows x entities, element by element the
    arithmetic of ``shapes.burn_rate`` / ``shapes.slo_score`` for one SLO."""
    by_group: dict[int, list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]]] = {}
    for job in jobs:
        if job[1].mat.group == job[2].mat.group:
            by_group.setdefault(job[1].mat.group, []).append(job)
        else:  # request and good counters kept apart: each its own batch, two groups
            by_group.setdefault(-1 - len(by_group), []).append(job)
    for group_jobs in by_group.values():
        if group_jobs[0][1].mat.group != group_jobs[0][2].mat.group:
            for job in group_jobs:
                _slo_batch_one_group(ctx, [job], split=True)
        else:
            _slo_batch_one_group(ctx, group_jobs, split=False)


def _slice_key(c: slice | np.ndarray) -> Hashable:
    return (c.start, c.stop) if isinstance(c, slice) else id(c)


def _slo_counts(ctx: _Ctx, cols: list[_Columns], slots: list[int], n_slots: int, starts: tuple[float, ...],
                n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per slot (each ``cols[i]`` is slot ``slots[i]``) x window x entity: the increase over each
    (start, now] (the entity's series added up; NaN without one with two samples in the window), and per
    slot x entity the age of its latest sample among series with one in the first window. All columns
    of one matrix group."""
    w = len(starts)
    size = n_slots * w * n
    inc_g, n_in_g, lt_g = ctx.windows(cols[0].mat, starts)
    # which columns, bins and counts: the same while the columns are (kept by their arrays' identity)
    refs: list[Any] = [x for c in cols for x in (c.ent, c.cols if not isinstance(c.cols, slice) else None)]
    key = ("slo", n, w, tuple(slots), tuple((id(c.ent), _slice_key(c.cols)) for c in cols))
    hit = ctx.kept.slo_bins.get(key)
    if hit is None or len(hit[0]) != len(refs) or not all(a is b for a, b in zip(hit[0], refs, strict=True)):
        ix = np.concatenate([_cols_ix(c) for c in cols])
        ent = np.concatenate([c.ent for c in cols])
        slot = np.repeat(np.asarray(slots, np.int64), [c.ent.size for c in cols])
        bins_all = (slot[None, :] * w + np.arange(w)[:, None]) * n + ent[None, :]
        age_bins = slot * n + ent
        unique = age_bins.size == 0 or int(np.bincount(age_bins).max()) <= 1
        hit = (refs, ix, bins_all, np.bincount(bins_all.reshape(-1), minlength=size).reshape(n_slots, w, n),
               age_bins, unique)
        if len(ctx.kept.slo_bins) > 64:
            ctx.kept.slo_bins.clear()
        ctx.kept.slo_bins[key] = hit
    _, ix, bins_all, cnt_all, age_bins, unique = hit
    inc, n_in, lt = inc_g[:, ix], n_in_g[:, ix], lt_g[ix]
    good = n_in >= 2
    if bool(good.all()):  # the usual case: every bin's counts as kept; sums in the same order
        acc = np.bincount(bins_all.reshape(-1), weights=inc.reshape(-1), minlength=size).reshape(n_slots, w, n)
        cnt = cnt_all
    else:
        bins = bins_all[good]
        acc = np.bincount(bins, weights=inc[good], minlength=size).reshape(n_slots, w, n)
        cnt = np.bincount(bins, minlength=size).reshape(n_slots, w, n)
    age = np.full(n_slots * n, np.nan)
    has = n_in[0] > 0
    if unique:  # one column per bin: its value (fmin with NaN is the other operand)
        age[age_bins[has]] = ctx.now - lt[has]
    else:
        np.fmin.at(age, age_bins[has], ctx.now - lt[has])
    return np.where(cnt > 0, acc, np.nan), age.reshape(n_slots, n)


def _slo_batch_one_group(ctx: _Ctx, jobs: list[tuple[SignalSpec, _Columns, _Columns, _SignalResult]],
                         split: bool) -> None:
    pol, now = ctx.policy, ctx.now
    k = len(jobs)
    n = jobs[0][3].sub.size
    starts = tuple(now - win for w in pol.slo.windows for win in (w.long_s, w.short_s))
    for spec, req, good_c, res in jobs:
        _seen_and_notes(ctx, spec, req, good_c, res)
    if split:  # request counters in one group, good counters in another
        counts, age = _slo_counts(ctx, [jobs[0][1]], [0], 2, starts, n)
        good_counts, _ = _slo_counts(ctx, [jobs[0][2]], [1], 2, starts, n)
        counts[1] = good_counts[1]
    else:
        cols = [c for _, req, good_c, _ in jobs for c in (req, good_c)]
        counts, age = _slo_counts(ctx, cols, list(range(2 * k)), 2 * k, starts, n)
    total, good = counts[0::2], counts[1::2]  # SLO x window x entity
    latency = np.array([spec.threshold_s is not None for spec, *_ in jobs], bool)[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        bad_lat = np.where(np.isnan(good), np.where(total > 0, np.nan, 0.0), total - good)
        bad_lat = np.clip(bad_lat, 0.0, None)
        bad = np.where(latency, bad_lat, np.where(np.isnan(good), 0.0, good))  # no error samples: no errors
        # shapes.burn_rate, per SLO objective
        frac = np.where(total > 0, bad / np.where(total > 0, total, 1.0), 0.0)
        frac = np.clip(frac, 0.0, 1.0)
        budget = np.array([1.0 - (spec.objective or pol.slo.objective) for spec, *_ in jobs])
        burn = frac / budget[:, None, None]
        burn[np.isnan(bad) | np.isnan(total)] = np.nan
        # shapes.slo_score: the worst window pair
        sub: np.ndarray | None = None
        for i, w in enumerate(pol.slo.windows):
            long_b, short_b = burn[:, 2 * i], burn[:, 2 * i + 1]
            eff = np.fmin(long_b, short_b)
            eff = np.where(np.isnan(long_b) | np.isnan(short_b), np.nan, eff)
            s = shapes.ramp(eff, 1.0, w.factor)
            sub = s if sub is None else np.fmin(sub, s)
    assert sub is not None
    max_age = np.array([spec.max_age_s or pol.freshness.max_age_s for spec, *_ in jobs])
    req_age = age[0::2]
    sub = np.where(req_age <= max_age[:, None], sub, np.nan)
    for i, (_, _, _, res) in enumerate(jobs):
        res.age[:] = req_age[i]
        res.sub[:] = sub[i]
        # explanation: burn rate of the fastest pair's short window
        res.rate[:] = burn[i, 1]
        res.raw[:] = burn[i, 0]

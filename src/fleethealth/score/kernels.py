"""Per-series arithmetic on sample arrays: latest sample, reset-aware increase, counter windows.

Theory of operation
-------------------
The row path (any snapshot) sorts a metric's samples by (series, time) once and reads each series'
latest sample or its reset-aware increase over a window (a drop means the counter restarted, as in
PromQL). A history's counter matrices (``CounterMatrix``: samples x series, cumulative down each column)
make a window's increase a difference of two entries (``_window``, ``_windows`` for several starts).
``_reduce_worst`` turns per-series values into one per entity (the worst); ``_value_flags`` names the
entities whose value is one a policy flags. No state, no I/O: arrays in, arrays out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fleethealth.policy import SignalSpec
from fleethealth.signals.snapshot import order_by_series_time


def _is_counter(spec: SignalSpec) -> bool:
    return spec.kind == "counter"


def _in_order(series: np.ndarray, ts: np.ndarray, presorted: bool) -> np.ndarray:
    """``order_by_series_time``; with ``presorted`` (a history view's gauge rows), first a check that the
    rows already are in that order (one pass instead of a sort)."""
    if presorted and series.size > 1:
        ds = np.diff(series)
        if bool((ds >= 0).all()) and bool(((ds > 0) | (np.diff(ts) >= 0)).all()):
            return np.arange(series.size)
    return order_by_series_time(series, ts)


def _latest_per_series(series: np.ndarray, ts: np.ndarray, presorted: bool = False) -> np.ndarray:
    """Positions (into the given arrays) of the latest sample of each series."""
    if series.size == 0:
        return np.zeros(0, np.int64)
    if np.bincount(series).max() <= 1:  # one sample per series: each is its own latest
        return np.arange(series.size)
    order = _in_order(series, ts, presorted)
    s = series[order]
    last = np.ones(s.size, bool)
    last[:-1] = s[1:] != s[:-1]
    return order[last]


def _increase_per_series(
    series: np.ndarray, values: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Reset-aware increase per series (like PromQL): a drop means the counter restarted from 0.

    Returns (series ids, increase, first ts, last ts, last value); series with one sample have NaN.
    """
    order = order_by_series_time(series, ts)
    s, v, t = series[order], values[order], ts[order]
    if s.size == 0:
        e = np.zeros(0)
        return np.zeros(0, np.int64), e, e, e, e
    start = np.ones(s.size, bool)
    start[1:] = s[1:] != s[:-1]
    starts = np.flatnonzero(start)
    ends = np.concatenate((starts[1:], [s.size])) - 1
    d = np.diff(v, prepend=v[0])
    d = np.where(d < 0, v, d)  # reset: the new value is what was counted since the restart
    d[start] = 0.0
    inc = np.add.reduceat(d, starts)
    t0, t1 = t[starts], t[ends]
    one = starts == ends
    inc = inc.astype(np.float64)
    inc[one] = np.nan
    return s[starts], inc, t0, t1, v[ends]


def _counter_runs(
    series: np.ndarray, values: np.ndarray, ts: np.ndarray, start: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One sort by (series, time) for everything a counter needs: per series, the reset-aware increase
    over the samples after ``start`` (NaN with fewer than two), the first and last of those timestamps
    (NaN with none), and the latest value and timestamp overall."""
    order = order_by_series_time(series, ts)
    s, v, t = series[order], values[order], ts[order]
    if s.size == 0:
        e = np.zeros(0)
        return np.zeros(0, np.int64), e, e, e, e, e
    first = np.ones(s.size, bool)
    first[1:] = s[1:] != s[:-1]
    starts = np.flatnonzero(first)
    ends = np.concatenate((starts[1:], [s.size])) - 1
    inw = t > start
    d = np.diff(v, prepend=v[0])
    d = np.where(d < 0, v, d)  # reset: the new value is what was counted since the restart
    # a step counts when both of its samples are in the window (times are sorted within a series)
    pair = np.zeros(s.size, bool)
    pair[1:] = inw[:-1]
    d = np.where(pair & ~first, d, 0.0)
    run = s.size // starts.size
    if run * starts.size == s.size and bool((ends - starts == run - 1).all()):
        inc = d.reshape(-1, run).sum(axis=1)  # every series has as many samples: no segmented reduce
    else:
        inc = np.add.reduceat(d, starts).astype(np.float64)
    # the window is a suffix of each series' run: count it by a running count, start at its first
    c = np.cumsum(inw, dtype=np.int64)
    n_in = c[ends] - c[starts] + inw[starts]
    t0 = np.where(n_in > 0, t[np.minimum(ends + 1 - n_in, ends)], np.nan)
    t1 = np.where(n_in > 0, t[ends], np.nan)
    inc[n_in < 2] = np.nan
    return s[starts], inc, t0, t1, v[ends], t[ends]


def _rows_out(t: np.ndarray, starts: np.ndarray, small: type,
              row_times: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Per start (rows) and column, how many of the column's samples are at or before the start (a
    matrix without NaN). With ``row_times`` (each row's earliest and latest time) only the rows that
    straddle a start are compared, start by start: the leading rows wholly at or before it count whole,
    the trailing rows wholly after it not at all (the same counts; a 6-hour window over a few hundred
    rows reads one or two)."""
    if row_times is None or starts.size < 2:
        a, b = _straddling(t.shape[0], starts, row_times)
        out = (t[None, a:b, :] <= starts[:, None, None]).sum(axis=1, dtype=small).astype(np.int64)
        return out + a if a else out
    out = np.empty((starts.size, t.shape[1]), np.int64)
    for i in range(starts.size):  # (an SLO's windows start hours apart: a band each)
        out[i] = _rows_out(t, starts[i:i + 1], small, row_times)[0]
    return out


def _straddling(k: int, starts: np.ndarray, row_times: tuple[np.ndarray, np.ndarray] | None) -> tuple[int, int]:
    """Rows ``a:b`` of ``k``: those before ``a`` are wholly at or before every start, those from ``b`` on
    wholly after every start (``a == b``: every column has ``a`` samples at or before each start)."""
    if row_times is None or not k or not starts.size:
        return 0, k
    lo, hi = row_times
    before = hi <= starts.min()  # (NaN: an empty row, never in a matrix without NaN)
    a = k if bool(before.all()) else int(np.argmax(~before))
    straddle = np.flatnonzero(lo <= starts.max())
    return a, max(a, int(straddle[-1]) + 1 if straddle.size else 0)


def _window(t: np.ndarray, v: np.ndarray, last: np.ndarray, start: float, dense: bool = False,
            row_times: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """Per column of a counter matrix, as ``_counter_runs`` per series: the increase over the samples
    after ``start`` (NaN with fewer than two), their first and last timestamps (NaN with none), the
    latest value and timestamp, and how many samples are in the window. The values are cumulative and
    times sorted down each column, so the window is a suffix and its increase a difference of two
    entries (``row_times``: see ``_rows_out``)."""
    k, c = t.shape
    # counts down the columns in a small integer type (the sum of a bool matrix is faster so), and
    # one entry per column picked by a flat index where the matrices are contiguous
    small = np.uint8 if k < 255 else np.uint16 if k < 65535 else np.int64
    cols = np.arange(c)
    flat = t.flags.c_contiguous and v.flags.c_contiguous
    flat_t, flat_v = (t.reshape(-1), v.reshape(-1)) if flat else (t, v)

    def pick(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per column, the entry at ``rows`` (-1: the last row)."""
        return a[rows * c + cols] if flat else a[rows, cols]

    if dense:  # every series a sample in every row: the first in the window is the count before it
        a, b = _straddling(k, np.array([start]), row_times)
        if a == b:  # the start falls between two rows: every column's window starts at row a
            lt, lv = t[k - 1], v[k - 1]
            if k - a == 0:
                none = np.full(c, np.nan)
                return none, none.copy(), none.copy(), lv, lt, np.zeros(c, np.int64)
            inc = lv - v[a] if k - a >= 2 else np.full(c, np.nan)
            return inc, t[a].copy(), lt.copy(), lv, lt, np.full(c, k - a, np.int64)
        n_out = _rows_out(t, np.array([start]), small, row_times)[0]
        n_in = k - n_out
        first = np.minimum(n_out, k - 1)
        lt, lv = t[k - 1], v[k - 1]
    else:
        inw = t > start
        n_in = inw.sum(axis=0, dtype=small).astype(np.int64)
        first = inw.argmax(axis=0)
        lt = pick(flat_t, last)
        lv = pick(flat_v, last)
    has = n_in > 0
    t0 = np.where(has, pick(flat_t, first), np.nan)
    t1 = np.where(has, lt, np.nan)
    inc = np.where(n_in >= 2, lv - pick(flat_v, first), np.nan)
    return inc, t0, t1, lv, lt, n_in


def _uniform_rates(t: np.ndarray, v: np.ndarray, start: float, now: float, max_age: float, min_span: float,
                   row_times: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, ...] | None:
    """``_fresh_rate`` over ``_window`` (with the latest value and age) of a dense matrix whose window
    starts between two rows and whose first and last rows in it each hold one time (a scrape stamped
    once): every column's window is then the same rows over the same span, so its rate is its increase
    over one number. The same numbers as the general path; None where it does not apply."""
    k, c = t.shape
    if row_times is None or k == 0:
        return None
    a, b = _straddling(k, np.array([start]), row_times)
    lo, hi = row_times
    if a != b or k - a < 2 or lo[a] != hi[a] or lo[k - 1] != hi[k - 1]:
        return None
    t0, t1 = float(lo[a]), float(lo[k - 1])
    lv = v[k - 1]
    age = np.full(c, now - t1)
    if not (t1 - t0 > 0 and now - t1 <= max_age):
        return np.full(c, np.nan), lv, age
    return (lv - v[a]) / max(t1 - t0, min_span), lv, age


def _windows(t: np.ndarray, v: np.ndarray, last: np.ndarray, starts: np.ndarray, dense: bool = False,
             row_times: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_window`` for several starts at once: the increase (NaN with fewer than two samples) and the
    sample count in each window (rows: ``starts``), and the latest timestamp, per column."""
    k, c = t.shape
    small = np.uint8 if k < 255 else np.uint16 if k < 65535 else np.int64
    cols = np.arange(c)
    flat = t.flags.c_contiguous and v.flags.c_contiguous
    flat_t, flat_v = (t.reshape(-1), v.reshape(-1)) if flat else (t, v)

    def pick(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return a[rows * c + cols] if flat else a[rows, np.broadcast_to(cols, rows.shape)]

    if dense:
        n_out = _rows_out(t, starts, small, row_times)
        n_in = k - n_out
        first = np.minimum(n_out, k - 1)
        lt, lv = t[k - 1], v[k - 1]
    else:
        inw = t[None, :, :] > starts[:, None, None]
        n_in = inw.sum(axis=1, dtype=small).astype(np.int64)
        first = inw.argmax(axis=1)
        lt = pick(flat_t, last)
        lv = pick(flat_v, last)
    inc = np.where(n_in >= 2, lv[None, :] - pick(flat_v, first), np.nan)
    return inc, n_in, lt


def _reduce_worst(ent: np.ndarray, vals: np.ndarray, n: int, higher_worse: bool) -> np.ndarray:
    out = np.full(n, np.nan)
    if ent.size and np.bincount(ent, minlength=1).max() <= 1:  # one value per entity: no reduction
        out[ent] = vals
    elif ent.size:
        if higher_worse:
            np.fmax.at(out, ent, vals)
        else:
            np.fmin.at(out, ent, vals)
    return out


def _fresh_rate(inc: np.ndarray, t0: np.ndarray, t1: np.ndarray, now: float, max_age: float,
                min_span: float = 0.0) -> np.ndarray:
    """Per series: the increase over the time between its first and last sample in the window (at least
    ``min_span``: a sustained signal's whole window), NaN without two samples at different times or when
    the last is older than ``max_age``."""
    dt = t1 - t0
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(dt > 0, inc / np.where(dt > 0, np.maximum(dt, min_span), 1.0), np.nan)
        fresh = (now - t1) <= max_age
    return np.where(fresh, rate, np.nan)


def _value_flags(x: np.ndarray, value_flags: Mapping[int, str]) -> list[tuple[int, str]]:
    """(entity, flag) for every entity whose value (truncated to an int) names a flag, in entity order."""
    named = [v for v, f in value_flags.items() if f]
    if not named:
        return []
    # trunc(x) == v only for x in (v - 1, v + 1): usually no value is near any named one
    with np.errstate(invalid="ignore"):
        if not bool(((x > min(named) - 1) & (x < max(named) + 1)).any()):
            return []
        xi = np.where(np.isnan(x), np.nan, np.trunc(x))
    pairs: list[tuple[int, str]] = []
    for v, f in value_flags.items():
        if f:
            pairs.extend((e, f) for e in np.flatnonzero(xi == v).tolist())
    pairs.sort(key=lambda p: p[0])
    return pairs

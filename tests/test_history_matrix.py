"""The history's counter matrices and the engine's fast path read off them give the plain answers:

* the history's views hold exactly the samples the session-9 history (chunk lists, kept verbatim in
  ``history_reference.py``) holds, whatever the ingests: resets, NaN values, a series twice in one
  scrape, samples out of time order, series appearing and vanishing, retention and thinning;
* scoring a view with its ``ViewIndex`` (counter rates and SLO burn windows read off the matrices, no
  sort) equals scoring the same rows without it (the row path, the reference).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.score.engine import KINDS, forget_evaluations, score_snapshot
from fleethealth.signals.history import SignalHistory, shape_token
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from history_reference import ReferenceHistory

POLICY = default_policy()
GPU_COUNTERS = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL")
GAUGE = "DCGM_FI_DEV_GPU_TEMP"
SLO_COUNTERS = ("fleethealth_replica_requests_total", "fleethealth_replica_errors_total",
                "vllm:time_to_first_token_seconds_count")
BUCKET = "vllm:time_to_first_token_seconds_bucket"
GPUS = [{"Hostname": f"n{i // 2}", "gpu": str(i % 2)} for i in range(4)]
REPLICAS = [{"replica": f"r{i}", "node": f"n{i}"} for i in range(2)]
KW = {"memory_s": 400.0, "dense_s": 120.0, "coarse_s": 60.0, "sparse_s": 600.0, "sparse_coarse_s": 300.0}

scrape = st.tuples(
    st.floats(5, 500),  # seconds since the last scrape (past memory_s: series are forgotten)
    st.lists(st.integers(0, 3), min_size=4, max_size=4),  # per GPU: 0 normal, 1 absent, 2 reset, 3 NaN
    st.integers(0, 6),  # 0: a GPU counter sample twice (later ts); 1: one out of order; 6: GPU 3 gone for good
    st.booleans(),  # replicas report
    st.booleans(),  # view after this scrape
)


def _rows(v: Snapshot) -> list[tuple[str, tuple[tuple[str, str], ...], float, float]]:
    names = [v.metrics[m] for m in v.metric_ids.tolist()]
    sets = [v.labelsets[s] for s in v.series_ids.tolist()]
    return sorted(zip(names, sets, v.ts.tolist(), v.values.tolist(), strict=True))


def _same_rows(a: Snapshot, b: Snapshot) -> None:
    """The same samples; values equal up to rounding (the reference history's reset offsets were a
    difference of a running sum over the whole scrape, a few ulps off; this history adds them up)."""
    ra, rb = _rows(a), _rows(b)
    assert [r[:3] for r in ra] == [r[:3] for r in rb]
    assert np.allclose([r[3] for r in ra], [r[3] for r in rb], rtol=1e-12, atol=1e-12)


def _ingest(script: list, histories: list, look: callable) -> None:  # type: ignore[valid-type]
    rng = np.random.default_rng(len(script))
    t = 10_000.0
    cum = np.zeros((len(GPU_COUNTERS), len(GPUS)))
    req = np.zeros(len(REPLICAS))
    retired = False
    for dt, modes, extra, replicas, view in script:
        t += dt
        retired |= extra == 6
        b = SnapshotBuilder()
        for g, labels in enumerate(GPUS):
            if modes[g] == 1 or (retired and g == 3):
                continue
            b.add(GAUGE, labels, 50.0 + g, t)
            for c, name in enumerate(GPU_COUNTERS):
                cum[c, g] = rng.integers(0, 3) if modes[g] == 2 else cum[c, g] + rng.integers(0, 4)
                b.add(name, labels, float("nan") if modes[g] == 3 and c == 0 else cum[c, g], t)
        if extra == 0:
            b.add(GPU_COUNTERS[1], GPUS[0], cum[1, 0] + 1, t + 1.0)
        elif extra == 1:
            b.add(GPU_COUNTERS[2], GPUS[1], cum[2, 1], t - 1.5 * dt)
        if replicas:
            for r, labels in enumerate(REPLICAS):
                req[r] += rng.integers(0, 50)
                b.add(SLO_COUNTERS[0], labels, req[r], t)
                b.add(SLO_COUNTERS[1], labels, float(rng.integers(0, 3)) * req[r] / 100, t)
                b.add(SLO_COUNTERS[2], labels, req[r], t)
                for le, share in (("1", 0.5), ("2.5", 0.9), ("+Inf", 1.0)):
                    b.add(BUCKET, {**labels, "le": le}, round(req[r] * share), t)
        snap = b.build(t)
        for h in histories:
            h.add(snap)
        if view:
            look(t + dt / 3)


@settings(max_examples=25, deadline=None)
@given(st.lists(scrape, min_size=1, max_size=25))
def test_views_hold_the_reference_histories_samples(script: list) -> None:
    new, ref = SignalHistory(POLICY, **KW), ReferenceHistory(POLICY, **KW)
    last: list[tuple[object, set[tuple[int, int]]]] = []

    def look(now: float) -> None:
        vn, vr = new.view(now), ref.view(now)
        _same_rows(vn, vr)
        ix = vn.index
        assert ix is not None and ix.valid_for(vn)
        assert float(vn.ts.max(initial=-np.inf)) <= ix.max_ts
        for mid, (a, b) in ix.bounds.items():  # each metric one block
            assert (vn.metric_ids[a:b] == mid).all()
        assert sum(b - a for a, b in ix.bounds.values()) == len(vn)
        for mid, mat in ix.counters.items():  # the matrix holds the metric's rows, times sorted per series
            a, b = ix.bounds.get(mid, (0, 0))
            have = ~np.isnan(mat.t)
            got = sorted(zip(np.broadcast_to(mat.series, mat.t.shape)[have].tolist(), mat.t[have].tolist(),
                             mat.v[have].tolist(), strict=True))
            assert got == sorted(zip(vn.series_ids[a:b].tolist(), vn.ts[a:b].tolist(), vn.values[a:b].tolist(),
                                     strict=True))
            for j in range(mat.series.size):
                col = mat.t[:, j][have[:, j]]
                assert (np.diff(col) >= 0).all()
                assert mat.last[j] == (np.flatnonzero(have[:, j])[-1] if have[:, j].any() else -1)
        tok, pairs = shape_token(vn), set(zip(vn.metric_ids.tolist(), vn.series_ids.tolist(), strict=True))
        if last and last[-1][0] == tok:
            assert last[-1][1] == pairs
        last.append((tok, pairs))

    _ingest(script, [new, ref], look)


def _same_scores(a: object, b: object) -> None:
    for kind in KINDS:
        ka, kb = a.kinds[kind], b.kinds[kind]  # type: ignore[attr-defined]
        assert ka.names == kb.names
        for f in ("value", "confidence", "sub", "cat", "raw", "rate", "age", "z"):
            x, y = np.asarray(getattr(ka, f), float), np.asarray(getattr(kb, f), float)
            assert np.array_equal(np.isnan(x), np.isnan(y)), (kind, f)
            assert np.allclose(x, y, rtol=1e-12, atol=1e-12, equal_nan=True), (kind, f)
        assert ka.reason == kb.reason and ka.flags == kb.flags and ka.notes == kb.notes
        assert np.array_equal(ka.worst, kb.worst) and np.array_equal(ka.expected, kb.expected)


@settings(max_examples=15, deadline=None)
@given(st.lists(scrape, min_size=1, max_size=20))
def test_scores_off_the_matrices_equal_the_row_path(script: list) -> None:
    h = SignalHistory(POLICY, **KW)
    checked = []

    def look(now: float) -> None:
        v = h.view(now)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for consumer in ("serving",):
                forget_evaluations()
                fast = score_snapshot(v, POLICY, now, consumer)
                forget_evaluations()
                plain = score_snapshot(dataclasses.replace(v, index=None), POLICY, now, consumer)
                _same_scores(fast, plain)
        checked.append(now)

    _ingest(script, [h], look)


@settings(max_examples=15, deadline=None)
@given(st.lists(scrape, min_size=1, max_size=20))
def test_scores_cycle_after_cycle_equal_a_scoring_from_scratch(script: list) -> None:
    """What the engine keeps between cycles (entity tables while the set of series is unchanged,
    series->entity maps, the node roll-up's grouping) never shows: each cycle, as production scores it
    (no cache dropped), equals the row path scored from scratch."""
    h = SignalHistory(POLICY, **KW)
    inventory = {"node": ["n0", "n1", "n9"]}

    def look(now: float) -> None:
        v = h.view(now)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fast = [score_snapshot(v, POLICY, now, c, inventory) for c in ("remediation", "serving")]
            plain = dataclasses.replace(v, index=None)
            for c, f in zip(("remediation", "serving"), fast, strict=True):
                _same_scores(f, score_snapshot(plain, POLICY, now, c, inventory))

    forget_evaluations()
    _ingest(script, [h], look)


def test_a_view_rebuilt_from_arrays_does_not_carry_the_index() -> None:
    h = SignalHistory(POLICY)
    b = SnapshotBuilder()
    b.add(GPU_COUNTERS[0], GPUS[0], 1.0, 100.0)
    h.add(b.build(100.0))
    v = h.view(110.0)
    assert v.index is not None and v.index.valid_for(v)
    w = dataclasses.replace(v, values=v.values.copy())
    assert w.index is not None and not w.index.valid_for(w)  # the engine falls back to the rows

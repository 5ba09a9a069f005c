"""A counter group thinned every ingest writes its matrices again into the ones it left two copies ago
(``_Group._arrays``) only once nothing holds them: every view a caller still holds keeps the samples it
was made with, however many ingests, thinnings and copies come after, and the history's views are the
reference history's (``history_reference``) all along."""

from __future__ import annotations

import copy
import weakref

import numpy as np

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from history_reference import ReferenceHistory

POLICY = default_policy()
T0 = 1_800_000_000.0
BOUNDS = ["0.5", "1.0", "2.0", "2.5", "+Inf"]  # the TTFT SLO's threshold is 2.0 s


def _scrape(t: float, k: int) -> Snapshot:
    """Two replicas' TTFT histograms and request counters (cumulative, rising by scrape)."""
    b = SnapshotBuilder()
    for r, rep in enumerate(("a", "b")):
        lab = {"replica": rep, "node": f"node-{rep}"}
        n = float(k * (40 + r))
        for i, le in enumerate(BOUNDS):
            b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": le}, n * (i + 1) / len(BOUNDS), t)
        b.add("vllm:time_to_first_token_seconds_count", lab, n, t)
    return b.build(t)


Samples = tuple[list[tuple[int, int, float, float]], list[tuple[np.ndarray, np.ndarray, np.ndarray]]]


def _samples(v: Snapshot) -> Samples:
    """A view's rows and its counter matrices, as copies."""
    rows = sorted(zip(v.metric_ids.tolist(), v.series_ids.tolist(), v.values.tolist(), v.ts.tolist(), strict=True))
    assert v.index is not None
    mats = [(g.t.copy(), g.v.copy(), g.last.copy()) for g in v.index.groups]
    return rows, mats


def _same(a: Samples, b: Samples) -> None:
    assert a[0] == b[0]
    assert len(a[1]) == len(b[1])
    for x, y in zip(a[1], b[1], strict=True):
        for p, q in zip(x, y, strict=True):
            np.testing.assert_array_equal(p, q)


def _named(v: Snapshot) -> list[tuple[str, tuple[tuple[str, str], ...], float, float]]:
    return sorted((v.metrics[m], tuple(sorted(v.labelsets[s])), val, t) for m, s, val, t in
                  zip(v.metric_ids.tolist(), v.series_ids.tolist(), v.values.tolist(), v.ts.tolist(), strict=True))


def test_held_views_keep_their_samples_while_the_matrices_are_written_again() -> None:
    # thinned at every scrape (thin_every_s 15, not the default batching) to copy as often as possible
    h, ref = SignalHistory(POLICY, thin_every_s=15.0), ReferenceHistory(POLICY, thin_every_s=15.0)
    held: list[tuple[Snapshot, Samples]] = []
    seen: list[weakref.ref[np.ndarray]] = []
    rewritten = 0
    # every 15 s for 80 minutes: rows are thinned past a quarter of an hour (one a minute) and past 65
    # minutes (one per five), so the 6-hour SLO group is copied nearly every scrape
    for k in range(320):
        t = T0 + 15.0 * k
        snap = _scrape(t, k)
        h.add(snap)
        ref.add(snap)
        v = h.view(t)
        if k % 40 == 0 or k > 300:
            assert _named(v) == _named(ref.view(t))
        if k % 9 == 0:  # a caller holding a view for a long time
            held.append((v, _samples(v)))
        group = max(h._groups, key=lambda g: g.keep)
        if not seen or seen[-1]() is not group.T:
            rewritten += any(w() is group.T for w in seen)
            seen.append(weakref.ref(group.T))
        for old, samples in held[-5:] if k % 10 else held:
            _same(_samples(old), samples)
    assert rewritten > 100  # the spare matrices were written again, not only new ones made


def test_a_copied_history_gives_the_same_views_and_keeps_no_spare_matrices() -> None:
    h = SignalHistory(POLICY)
    for k in range(300):
        h.add(_scrape(T0 + 15.0 * k, k))
        h.view(T0 + 15.0 * k)
    twin = copy.deepcopy(h)
    assert all(g._spare is None for g in twin._groups)
    for k in range(300, 340):
        t = T0 + 15.0 * k
        for x in (h, twin):
            x.add(_scrape(t, k))
        _same(_samples(h.view(t)), _samples(twin.view(t)))


def test_thinning_waits_for_the_next_multiple_of_thin_every_s_and_views_do_not_depend_on_how_often_taken() -> None:
    every, sometimes, ref = SignalHistory(POLICY), SignalHistory(POLICY), ReferenceHistory(POLICY)
    thinned_at: list[float] = []
    for k in range(400):  # every 15 s for 100 minutes: past both tiers (15 and 65 minutes)
        t = T0 + 15.0 * k
        snap = _scrape(t, k)
        for x in (every, sometimes, ref):
            x.add(snap)
        before = len(every._chunks)
        v = every.view(t)
        if len(every._chunks) < before:
            thinned_at.append(t)
        if k % 7 == 0 or k > 380:
            assert _named(v) == _named(sometimes.view(t)) == _named(ref.view(t))
    assert thinned_at and all(t % every.thin_every_s == 0 for t in thinned_at)  # one copy per 4 minutes
    # a row a tier thins is gone within thin_every_s of reaching the tier's age: the minute tier
    now = T0 + 15.0 * 399
    ts = np.unique(every.view(now).ts)
    assert np.diff(ts[ts < now - every.dense_s - every.thin_every_s]).min() >= 60.0

"""What the history drops to keep views small changes no score that matters: of a latency histogram
only the bucket the SLO reads is kept, and counters older than an hour are thinned to one sample per
five minutes without moving a 6-hour burn rate by more than a few percent."""

from __future__ import annotations

import numpy as np

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder, merge_snapshots

POLICY = default_policy()
T0 = 1_800_000_000.0
BOUNDS = ["0.5", "1.0", "2.0", "2.5", "5.0", "+Inf"]  # the TTFT SLO's threshold is 2.0 s


def _scrape(t: float, counts: dict[str, dict[str, float]]) -> Snapshot:
    """One scrape of three replicas' TTFT histograms and request counters (cumulative)."""
    b = SnapshotBuilder()
    for rep, c in counts.items():
        lab = {"replica": rep, "node": f"node-{rep}"}
        for le in BOUNDS:
            b.add("vllm:time_to_first_token_seconds_bucket", {**lab, "le": le}, c[le], t)
        b.add("vllm:time_to_first_token_seconds_count", lab, c["+Inf"], t)
    return b.build(t)


def _run(hours: float, slow_share: dict[str, float]) -> tuple[SignalHistory, list[Snapshot]]:
    rng = np.random.default_rng(7)
    h = SignalHistory(POLICY)
    cum = {r: dict.fromkeys(BOUNDS, 0.0) for r in slow_share}
    scrapes = []
    for k in range(int(hours * 3600 / 15)):
        t = T0 + 15 * k
        for rep, share in slow_share.items():
            n = float(rng.poisson(40))
            slow = float(rng.binomial(int(n), share))
            for le in BOUNDS:
                # fast requests take 0.3 s, slow ones 3 s: below 2.5 s only the fast ones
                cum[rep][le] += n - slow if float(le) < 2.5 else n
        snap = _scrape(t, {r: dict(c) for r, c in cum.items()})
        h.add(snap)
        scrapes.append(snap)
    return h, scrapes


def test_only_the_bucket_the_slo_reads_is_kept_and_scores_do_not_change() -> None:
    h, scrapes = _run(0.5, {"r-ok": 0.0, "r-burn": 0.05, "r-mid": 0.002})
    now = scrapes[-1].at
    view = h.view(now)
    les = {dict(view.labelsets[s]).get("le") for s, m in zip(view.series_ids.tolist(), view.metric_ids.tolist(),
                                                             strict=True)
           if view.metrics[m].endswith("_bucket")}
    assert les == {"2.0"}  # the largest bound <= 2.0 s: every other bucket is gone
    full = merge_snapshots(scrapes, at=now)  # every sample, every bucket
    a = score_snapshot(view, POLICY, now, "serving")
    b = score_snapshot(full, POLICY, now, "serving")
    for rep in ("r-ok", "r-burn", "r-mid"):
        x, y = a.tuples[rep], b.tuples[rep]
        assert x.value == y.value and x.reason == y.reason
    assert a.tuples["r-burn"].value is not None and a.tuples["r-burn"].value < a.tuples["r-ok"].value  # type: ignore[operator]


def test_old_counter_samples_are_sparse_and_a_six_hour_burn_rate_barely_moves() -> None:
    h, scrapes = _run(7.0, {"r-a": 0.004, "r-b": 0.01, "r-c": 0.05})
    now = scrapes[-1].at
    view = h.view(now)
    ts = np.unique(view.ts)
    # (thinning goes by the ages as of the last multiple of thin_every_s: up to that much later)
    old = ts[ts < now - 3900 - h.thin_every_s]
    # one sample per 5 minutes beyond the hour (the oldest may be a bucket's last survivor of retention)
    assert old.size > 2 and np.diff(old)[1:].min() >= 300 - 15
    mid = ts[(ts < now - 900 - h.thin_every_s) & (ts >= now - 3900)]
    assert np.diff(mid)[1:].min() >= 60 - 15
    full = merge_snapshots([s for s in scrapes if s.at > now - 6.5 * 3600], at=now)
    a = score_snapshot(view, POLICY, now, "serving")
    b = score_snapshot(full, POLICY, now, "serving")
    assert a.tuples["r-c"].value is not None and a.tuples["r-c"].value < 0.5  # burning: the 6 h pair counts
    for rep in ("r-a", "r-b", "r-c"):
        da = {d.signal: d for d in a.tuples[rep].details}["ttft_slo"]
        db = {d.signal: d for d in b.tuples[rep].details}["ttft_slo"]
        assert da.raw is not None and db.raw is not None
        assert abs(da.raw - db.raw) <= 0.03 * db.raw + 1e-9  # the 1h/5m pair is unaffected
        assert a.tuples[rep].value is not None
        assert abs(a.tuples[rep].value - b.tuples[rep].value) <= 0.03  # type: ignore[operator]
    assert len(view) < 0.5 * len(full)

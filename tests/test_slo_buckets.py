"""A latency SLO whose threshold is not a bucket bound (signals.slo_buckets, score.slo).

Before: the bucket was chosen once for the whole fleet (the largest bound <= threshold among every
replica's buckets), so with two bucket layouts (threshold 0.3 s; replica r0's buckets 0.25 / 0.5, r1's
0.3) r0 had no bucket at the chosen 0.3 and read ``pending:ttft_slo`` for ever at confidence 0.5. Now
each histogram is read at its own nearest bound at or below the threshold (r0 at 0.25: conservative) and
its detail says so; a histogram with no bound that low is not scored and says why, never pending.
Checked on the history's matrices (the controller's path) and on plain rows, alike.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleethealth.policy import Policy, default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.slo_buckets import buckets_at_threshold, histogram_ids
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder, merge_snapshots

T0 = 1_800_000_000.0
TTFT = "vllm:time_to_first_token_seconds"


def _policy(threshold_s: float) -> Policy:
    p = default_policy()
    sigs = [s.model_copy(update={"threshold_s": threshold_s}) if s.name == "ttft_slo" else s for s in p.signals]
    return p.model_copy(update={"signals": sigs})


def _run(policy: Policy, layouts: dict[str, list[float]], slow_at: float, scrapes: int = 30
         ) -> tuple[SignalHistory, list[Snapshot]]:
    """Replicas serving 40 requests a scrape: 0.1 s each, but a ``slow_at`` share at 0.28 s (within a
    0.3 s threshold, above a 0.25 s bound); histograms with the bounds of ``layouts`` and +Inf."""
    h = SignalHistory(policy)
    cum = {r: dict.fromkeys([*b, float("inf")], 0.0) for r, b in layouts.items()}
    snaps = []
    for k in range(scrapes):
        t = T0 + 15 * k
        b = SnapshotBuilder()
        for r in layouts:
            lab = {"replica": r, "node": f"node-{r}"}
            mid = round(40 * slow_at)  # requests at 0.28 s; the rest at 0.1 s
            for le in cum[r]:
                cum[r][le] += 40 if le >= 0.28 else (40 - mid if le >= 0.1 else 0)
                b.add(TTFT + "_bucket", {**lab, "le": "+Inf" if le == float("inf") else f"{le:g}"}, cum[r][le], t)
            b.add(TTFT + "_count", lab, cum[r][float("inf")], t)
            b.add("vllm:num_requests_waiting", lab, 1.0, t)
        snap = b.build(t)
        snaps.append(snap)
        h.add(snap)
    return h, snaps


def _ttft(policy: Policy, view: Snapshot, now: float, replica: str) -> tuple[float | None, float, str, str]:
    tu = score_snapshot(view, policy, now, "serving").tuples[replica]
    d = {x.signal: x for x in tu.details}["ttft_slo"]
    return d.score, tu.confidence, tu.reason, d.note


@pytest.mark.parametrize("path", ["history", "rows"])
def test_two_bucket_layouts_each_read_their_nearest_bound_below_never_pending(path: str) -> None:
    policy = _policy(0.3)
    h, snaps = _run(policy, {"r0": [0.1, 0.25, 0.5, 1.0], "r1": [0.1, 0.3, 0.5]}, slow_at=0.0)
    now = snaps[-1].at
    view = h.view(now) if path == "history" else merge_snapshots(snaps, at=now)
    s0, c0, why0, note0 = _ttft(policy, view, now, "r0")
    s1, c1, why1, note1 = _ttft(policy, view, now, "r1")
    assert not why0.startswith("pending:") and c0 == 1.0 and s0 == 1.0  # was: pending:ttft_slo, 0.5
    assert "read at le=0.25 s" in note0 and "0.3 s" in note0
    assert s1 == 1.0 and c1 == 1.0 and note1 == ""  # r1 has the bound itself


@pytest.mark.parametrize("path", ["history", "rows"])
def test_reading_below_the_threshold_is_conservative(path: str) -> None:
    """A quarter of r0's requests take 0.28 s: within the 0.3 s SLO, but above r0's 0.25 s bound, so they
    count as slow and burn its budget; r1 (bound 0.3) reads them as fast. Never the other way round."""
    policy = _policy(0.3)
    h, snaps = _run(policy, {"r0": [0.1, 0.25, 0.5], "r1": [0.1, 0.3, 0.5]}, slow_at=0.25)
    now = snaps[-1].at
    view = h.view(now) if path == "history" else merge_snapshots(snaps, at=now)
    s0, *_ = _ttft(policy, view, now, "r0")
    s1, *_ = _ttft(policy, view, now, "r1")
    assert s1 == 1.0
    assert s0 is not None and s0 < 0.5


@pytest.mark.parametrize("path", ["history", "rows"])
def test_a_threshold_below_every_bound_is_not_scored_and_says_why(path: str) -> None:
    policy = _policy(0.05)
    h, snaps = _run(policy, {"r0": [0.1, 0.25, 0.5]}, slow_at=0.0)
    now = snaps[-1].at
    view = h.view(now) if path == "history" else merge_snapshots(snaps, at=now)
    score, conf, why, note = _ttft(policy, view, now, "r0")
    assert score is None and not why.startswith("pending:") and conf == 1.0
    assert "no histogram bucket at or below the 0.05 s threshold" in note


def test_buckets_at_threshold_is_per_histogram() -> None:
    labelsets = [(("le", le), ("replica", r)) for r, les in (("a", ("0.25", "0.5")), ("b", ("0.3", "0.5")),
                                                             ("c", ("1", "2"))) for le in les]
    series = np.arange(len(labelsets))
    le = np.array([float(dict(ls)["le"]) for ls in labelsets])
    hist = histogram_ids(labelsets, series)
    assert hist.tolist() == [0, 0, 1, 1, 2, 2]
    assert buckets_at_threshold(le, hist, 0.3).tolist() == [True, False, True, False, False, False]

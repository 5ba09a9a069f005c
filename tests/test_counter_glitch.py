"""Exporter glitches on counters (signals.counter_glitch): a counter that reads 0 for a scrape or two and
then its old value again adds no errors; a real reset (a restart: small, growing from there) loses none.

Properties over the rolling history's reset-corrected values (what every rate and increase is computed
from), fed scrape by scrape and as one batch (several samples per series: the other code path), and
against the reference history's sample-by-sample rule; plus what the scorer makes of it.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.counter_glitch import GLITCH_S
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder
from history_reference import ReferenceHistory

POLICY = default_policy()
METRIC = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"  # kept 6 h: every sample of a test stays in the view
LABELS = {"Hostname": "n1", "gpu": "0"}
OTHER = {"Hostname": "n1", "gpu": "1"}  # a steady neighbour: its counter is never touched by the rule
T0 = 1_800_000_000.0
STEP = 15.0


def corrected(values: list[float], batch: bool = False, reference: bool = False) -> np.ndarray:
    """The history's reset-corrected values of the series, in time order (scrapes ``STEP`` apart)."""
    h = ReferenceHistory(POLICY) if reference else SignalHistory(POLICY)
    times = [T0 + STEP * i for i in range(len(values))]
    if batch:
        b = SnapshotBuilder()
        for i, (t, v) in enumerate(zip(times, values, strict=True)):
            b.add(METRIC, LABELS, v, t)
            b.add(METRIC, OTHER, float(i), t)
        h.add(b.build(times[-1]))
    else:
        for i, (t, v) in enumerate(zip(times, values, strict=True)):
            b = SnapshotBuilder()
            b.add(METRIC, LABELS, v, t)
            b.add(METRIC, OTHER, float(i), t)
            h.add(b.build(t))
    view = h.view(times[-1])
    rows = [(float(view.ts[i]), float(view.values[i])) for i in range(len(view))
            if view.metrics[view.metric_ids[i]] == METRIC and dict(view.labelsets[view.series_ids[i]]) == LABELS]
    other = [float(view.values[i]) for i in range(len(view))
             if view.metrics[view.metric_ids[i]] == METRIC and dict(view.labelsets[view.series_ids[i]]) == OTHER]
    assert sorted(other) == [float(i) for i in range(len(values))]
    assert len(rows) == len(values)
    return np.array([v for _, v in sorted(rows)])


def _all_paths(values: list[float]) -> np.ndarray:
    """The corrected series, the same by scrape, by batch and by the reference's sample-by-sample rule."""
    a = corrected(values)
    assert np.allclose(a, corrected(values, batch=True), rtol=1e-12, atol=1e-9)
    assert np.allclose(a, corrected(values, reference=True), rtol=1e-12, atol=1e-9)
    assert (np.diff(a) >= -1e-9).all()  # a corrected counter never goes down
    return a


increments = st.lists(st.integers(0, 50), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 100_000), before=increments, zeros=st.integers(1, 3),
       back=st.integers(0, 50), after=st.lists(st.integers(0, 50), max_size=6))
def test_a_glitch_to_zero_and_back_adds_no_errors(start: int, before: list[int], zeros: int, back: int,
                                                  after: list[int]) -> None:
    """The true counter only grows; the exporter reads 0 for one to three scrapes in between. Counted:
    exactly the true increase (what it grew by while it read 0 shows up on its return, nothing more)."""
    true = list(np.cumsum([start, *before]))
    true_after = list(true[-1] + back + np.cumsum([0, *after]))
    read = [float(x) for x in true] + [0.0] * zeros + [float(x) for x in true_after]
    c = _all_paths(read)
    assert c[-1] - c[0] == true_after[-1] - true[0]


@settings(max_examples=60, deadline=None)
@given(start=st.integers(1, 100_000), before=increments, restart=st.integers(0, 20),
       growth=st.lists(st.integers(0, 50), min_size=1, max_size=10))
def test_a_real_reset_loses_no_error(start: int, before: list[int], restart: int, growth: list[int]) -> None:
    """The counter restarts (driver reload, exporter restart) at a small value and grows from there: its
    first growth stays below the count before the restart. Counted: the increase before, plus every
    count since the restart (from 0, as PromQL's rate)."""
    true = list(np.cumsum([start, *before]))
    pre = true[-1]
    after = list(restart + np.cumsum([0, *growth]))
    first_growth = next((x for x in after if x > restart), None)
    assume(restart < pre and (first_growth is None or first_growth < pre))
    c = _all_paths([float(x) for x in true] + [float(x) for x in after])
    assert c[-1] - c[0] == (pre - true[0]) + after[-1]


def test_a_drop_that_stays_down_longer_than_the_glitch_window_was_a_reset() -> None:
    """Down at 0 for more than GLITCH_S, then back to 120 (more than the 100 before): a restart whose
    counter took a while to move (120 errors since the restart count), not a glitch."""
    down = int(GLITCH_S // STEP) + 2
    c = _all_paths([90.0, 100.0] + [0.0] * down + [120.0])
    assert c[-1] - c[0] == 10 + 120
    g = _all_paths([90.0, 100.0] + [0.0] * (down - 3) + [120.0])  # back within the window: a glitch
    assert g[-1] - g[0] == 30


def test_a_partial_drop_and_a_second_drop_keep_the_series_monotone() -> None:
    """100 -> 40 -> 0 -> 100: a glitch; what the reset correction counted during it (the 40, read as
    a restart's count) stays counted (never a corrected value going down), nothing more."""
    c = _all_paths([100.0, 40.0, 0.0, 100.0, 103.0])
    assert list(c - c[0]) == [0.0, 40.0, 40.0, 40.0, 43.0]


def test_the_scorer_reads_no_replay_storm_from_a_glitch_and_a_real_restart_keeps_its_new_dbe() -> None:
    """A PCIe replay counter at 10,000 reads 0 twice (DCGM field briefly unavailable) and 10,000 again:
    healthy, as before the glitch. A DBE counter at 3 that restarts at 0 and then reads 1 (a new
    uncorrectable error after a driver reload): the gate still fires on the new one."""
    h = SignalHistory(POLICY)
    replay = [10_000.0] * 6 + [0.0, 0.0] + [10_000.0] * 4
    dbe = [3.0] * 6 + [0.0, 0.0] + [1.0] * 4
    t = T0
    for r, d in zip(replay, dbe, strict=True):
        b = SnapshotBuilder()
        b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", LABELS, r, t)
        b.add("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", OTHER, d, t)
        b.add("DCGM_FI_DEV_GPU_TEMP", LABELS, 50.0, t)
        b.add("DCGM_FI_DEV_GPU_TEMP", OTHER, 50.0, t)
        h.add(b.build(t))
        t += STEP
    now = t - STEP
    fh = score_snapshot(h.view(now), POLICY, now, "remediation")
    gpu0 = next(tu for k, tu in fh.tuples.items() if k.endswith("gpu0"))
    gpu1 = next(tu for k, tu in fh.tuples.items() if k.endswith("gpu1"))
    pcie = {d.signal: d for d in gpu0.details}["pcie_replay"]
    assert pcie.score == 1.0 and pcie.rate == 0.0, pcie
    assert gpu1.value == 0.0 and gpu1.reason == "gate:ecc_dbe", gpu1.reason

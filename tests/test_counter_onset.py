"""Onset speed of counter faults (issue 16 item 7): a counter ramp with ``short_window_s`` reads its rate
over a short and a long window, as a burn rate does. Once the long window's rate is past ``warn`` (the
count is significant) the worse of the two is scored, so a storm reaches its critical level within the
short window and raises ``floor:<signal>``; sparse noise never gets that far. A counter at its floor takes
the lifecycle's fast path (``floor_dwell_s``), while a peer or SLO score at 0 keeps the dwell chain.
The batched engine, the row path and the scalar reference agree on all of it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from decide_support import Run, tup
from fleethealth.backtest import evaluate, run_backtest
from fleethealth.backtest.arms import PRODUCT
from fleethealth.decide.model import State
from fleethealth.policy import default_policy
from fleethealth.score.engine import FleetHealth, score_snapshot
from fleethealth.score.reference import score_reference
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sim.scenario import Scenario

POL = default_policy()
T0 = 1_700_000_000.0
STEP = 15.0


def _scrape(t: float, replays: dict[str, float]) -> Snapshot:
    """Six nodes of four healthy GPUs at time ``t``; ``replays``: each GPU's PCIe replay counter."""
    b = SnapshotBuilder()
    for n in range(6):
        for g in range(4):
            lab = {"Hostname": f"n{n}", "gpu": str(g), "UUID": f"GPU-{n}-{g}", "modelName": "NVIDIA H100 80GB HBM3"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, replays.get(f"n{n}/gpu{g}", 0.0), t)
    return b.build(t)


def _scored(counter: Any, seconds: float = 300.0) -> tuple[list[FleetHealth], dict[str, Any], float]:
    """Scrapes every 15 s for ``seconds``; n1/gpu2's counter is ``counter(t since start)``. Returns the
    batched (history view) and row-path results, the scalar reference, and the time scored."""
    h = SignalHistory(POL)
    rows = SnapshotBuilder()
    t = T0
    while t <= T0 + seconds:
        snap = _scrape(t, {"n1/gpu2": float(counter(t - T0))})
        h.add(snap)
        rows.extend_snapshot(snap)
        t += STEP
    now = t - STEP + 1.0
    view = h.view(now)
    assert view.index is not None
    batched = score_snapshot(view, POL, now)
    plain = score_snapshot(dataclasses.replace(view, index=None), POL, now)
    ref = score_reference(rows.build(now), POL, now)
    return [batched, plain], ref, now


def _pcie(fh: FleetHealth, gpu: str = "n1/gpu2") -> Any:
    return next(d for d in fh.tuples[gpu].details if d.signal == "pcie_replay")


def test_a_storm_reads_at_its_rate_within_the_short_window_and_raises_the_floor_flag() -> None:
    # 80 replays/s for the last 45 s: the 5-minute window reads ~12.6/s (ramp 0.76 alone), the minute 80/s
    fhs, ref, _ = _scored(lambda s: max(0.0, s - 255.0) * 80.0)
    for fh in fhs:
        d = _pcie(fh)
        assert d.rate == pytest.approx(80.0) and d.score == 0.0
        t = fh.tuples["n1/gpu2"]
        assert t.value == 0.0 and t.reason == "min:pcie"
        assert "floor:pcie_replay" in t.flags
        assert fh.tuples["n1"].value == 0.0
        assert fh.tuples["n0/gpu2"].value == 1.0 and "floor:pcie_replay" not in fh.tuples["n0/gpu2"].flags
    assert ref["n1/gpu2"].value == 0.0 and ref["n1/gpu2"].reason == "min:pcie"


def test_the_long_window_alone_would_have_read_the_same_storm_as_mild() -> None:
    pol = default_policy()
    spec = next(s for s in pol.signals if s.name == "pcie_replay")
    long_only = pol.model_copy(update={"signals": [s if s is not spec else spec.model_copy(update={"short_window_s": None})
                                                   for s in pol.signals]})
    b = SnapshotBuilder()
    for k in range(21):
        b.extend_snapshot(_scrape(T0 + k * STEP, {"n1/gpu2": max(0.0, k * STEP - 255.0) * 80.0}))
    now = T0 + 301.0
    d = next(x for x in score_snapshot(b.build(now), long_only, now).tuples["n1/gpu2"].details
             if x.signal == "pcie_replay")
    assert d.rate == pytest.approx(3600 / 285) and d.score == pytest.approx(1 - (3600 / 285 - 1) / 49)


@pytest.mark.parametrize("counter", [
    lambda s: 250.0 if s >= 285 else 0.0,  # one burst of 250 replays: 5.6/s over the minute, 0.88/s long
    lambda s: 0.5 * s,  # a steady trickle below warn
    lambda s: 3000.0 if s >= 60 else 0.0,  # a big burst four minutes ago: out of the short window
])
def test_noise_the_long_window_does_not_confirm_scores_as_before(counter: Any) -> None:
    fhs, ref, _ = _scored(counter)
    for fh in fhs:
        t = fh.tuples["n1/gpu2"]
        assert "floor:pcie_replay" not in t.flags
        d = _pcie(fh)
        assert d.score == pytest.approx(ref["n1/gpu2"].value)
    assert fhs[0].tuples["n1/gpu2"].value == pytest.approx(fhs[1].tuples["n1/gpu2"].value)


def test_batched_row_path_and_reference_agree_while_a_storm_starts_and_ends() -> None:
    for end in (270.0, 285.0, 300.0):  # the storm ended 30, 15 and 0 s before the last scrape
        fhs, ref, _ = _scored(lambda s, e=end: (min(s, e) - 200.0) * 30.0 if s > 200 else 0.0)
        a, b = fhs
        for name in ("n1/gpu2", "n1"):
            assert a.tuples[name].value == pytest.approx(b.tuples[name].value, abs=1e-12)
            assert a.tuples[name].flags == b.tuples[name].flags
            assert a.tuples[name].value == pytest.approx(ref[name].value, abs=1e-12)
        # recovery is the long window's: the short window only ever makes a reading worse
        assert _pcie(a).rate >= 30.0 * (end - 200.0) / 285.0 - 1e-9


def test_a_counter_at_its_floor_quarantines_after_the_fast_dwell_a_peer_at_zero_keeps_the_chain() -> None:
    lc = POL.lifecycle
    assert lc.floor_dwell_s == 60.0 and lc.floor_at == 0.0
    r = Run()
    b = {"pool": "b"}  # another pool: its own quarantine budget
    r.steps(0, 45, 15, lambda t: [tup("n1", 0.0, flags=("floor:pcie_replay",)), tup("n2", 0.0, labels=b)])
    assert r.st("n1") == State.READY
    r.step(60, [tup("n1", 0.0, flags=("floor:pcie_replay",)), tup("n2", 0.0, labels=b)])
    assert r.st("n1") == State.QUARANTINED and r.st("n2") == State.READY
    assert [t.detail for t in r.transitions] == ["at_floor dwell 60s"]
    r.steps(75, 300, 15, lambda t: [tup("n2", 0.0, labels=b)])
    assert [(t.entity, t.ts, t.to_state) for t in r.transitions] == [
        ("n1", 60, State.QUARANTINED), ("n2", 120, State.DEGRADED), ("n2", 300, State.QUARANTINED)]


def test_the_fast_path_is_off_without_floor_dwell_s() -> None:
    pol = default_policy()
    pol = pol.model_copy(update={"lifecycle": pol.lifecycle.model_copy(update={"floor_dwell_s": None})})
    r = Run(pol)
    r.steps(0, 285, 15, lambda t: [tup("n1", 0.0, flags=("floor:pcie_replay",))])
    assert r.st("n1") == State.DEGRADED


SCENARIO = """
name: onset-{name}
seed: {seed}
duration: 45m
step: 15s
fleet:
  pools:
    - name: train-a
      nodes: 16
      workload: training
      jobs:
        - {{name: pretrain, pp: 2, compute_s: 1.82}}
faults: {faults}
"""


def test_a_replay_storm_is_quarantined_two_cycles_after_onset_and_a_quiet_fleet_is_not() -> None:
    faults = "[{kind: pcie_replay_storm, target: node-05/gpu2, onset: 1800}]"
    sc = Scenario.model_validate(yaml.safe_load(SCENARIO.format(name="storm", seed=3, faults=faults)))
    run = run_backtest(sc, POL, [], cycle_s=60.0)
    ev = evaluate(run)
    trs = [(t.ts - run.start - 1800, t.to_state, t.detail) for t in run.arms[PRODUCT].transitions
           if t.entity == "node-05"]
    # the storm shows on the first cycle after onset (60 s) and is quarantined on the next; it used to
    # reach DEGRADED at 120-180 s and QUARANTINED at 420 s (5-minute window, 120 s + 300 s dwells)
    assert trs[0] == (120.0, State.QUARANTINED, "at_floor dwell 60s")
    assert ev["incidents"][0]["removal_s"] == 120.0
    assert ev["quarantines"] == 1 and ev["precision"] == 1.0

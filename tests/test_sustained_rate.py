"""A sustained counter signal (``sustained: true``: the rate over its whole window) after a short history.

The default policy's ``ecc_sbe_sustained`` reads single-bit ECC errors over 6 h, for memory wearing out
over days. A controller that has just started (or a recording that begins minutes before a burst) holds
far less than 6 h: read over the samples it has, one burst of two dozen SBEs in the first half hour
became 48 an hour "sustained" and quarantined a node that only needed its row-remap reset (the demo's
node-07). Over the whole window it is two dozen in 6 h: no alarm. A rate that really is sustained reads
the same either way once the history covers the window.
"""

from __future__ import annotations

import dataclasses

import pytest

from fleethealth.policy import PolicyError, default_policy, default_policy_text, parse_policy
from fleethealth.score.engine import FleetHealth, score_snapshot
from fleethealth.score.reference import score_reference
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder

POL = default_policy()
T0 = 1_700_000_000.0
STEP = 15.0


def _history(seconds: float, sbe_at: dict[str, list[tuple[float, float]]]) -> SignalHistory:
    """Two nodes of two GPUs, scraped every 15 s for ``seconds``; ``sbe_at``: GPU -> (time, count) bursts."""
    h = SignalHistory(POL)
    totals = {f"n{n}/gpu{g}": 0.0 for n in range(2) for g in range(2)}
    t = T0
    while t <= T0 + seconds:
        b = SnapshotBuilder()
        for name in totals:
            node, gpu = name.split("/gpu")
            for at, count in sbe_at.get(name, []):
                if t - STEP < T0 + at <= t:
                    totals[name] += count
            lab = {"Hostname": node, "gpu": gpu, "UUID": f"GPU-{node}-{gpu}", "pool": "train"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
            b.add("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", lab, totals[name], t)
        h.add(b.build(t))
        t += STEP
    return h


def _sbe(fh: FleetHealth, gpu: str) -> tuple[float | None, float | None]:
    d = next(d for d in fh.tuples[gpu].details if d.signal == "ecc_sbe_sustained")
    return d.rate, d.score


def _paths(h: SignalHistory, now: float) -> list[FleetHealth]:
    view = h.view(now)
    return [score_snapshot(view, POL, now), score_snapshot(dataclasses.replace(view, index=None), POL, now)]


def test_one_burst_in_a_short_history_is_spread_over_the_window() -> None:
    h = _history(1800, {"n0/gpu1": [(600, 24.0)]})  # 24 SBEs at minute 10 of a 30-minute history
    now = T0 + 1800
    for fh in _paths(h, now):  # the batched engine and the row path
        rate, score = _sbe(fh, "n0/gpu1")
        assert rate == pytest.approx(24 / 21600)  # not 24 / 1800 s (48 an hour, past crit)
        assert score == 1.0  # 4 an hour over 6 h is under warn (6 an hour)
        assert fh.tuples["n0"].value == 1.0
    ref = score_reference(h.view(now), POL, now)
    assert ref["n0/gpu1"].value == 1.0


def test_a_rate_sustained_over_the_whole_window_still_reads_as_such() -> None:
    # 24 an hour for seven hours: past warn (6/h), under crit (36/h): the memory category degrades
    bursts = [(float(s), 6.0) for s in range(0, 7 * 3600, 900)]
    h = _history(7 * 3600, {"n1/gpu0": bursts})
    now = T0 + 7 * 3600
    for fh in _paths(h, now):
        rate, score = _sbe(fh, "n1/gpu0")
        # 23 or 24 bursts of 6 fall inside the 6 h window, depending on where its edge falls
        assert rate is not None and rate == pytest.approx(24 / 3600, rel=0.06)
        assert score is not None and 0.0 < score < 1.0
        assert score == pytest.approx(1 - (rate - 0.00167) / (0.01 - 0.00167), abs=1e-3)
        assert _sbe(fh, "n1/gpu1")[1] == 1.0


def test_sustained_is_for_counters() -> None:
    text = default_policy_text().replace(
        "  - name: row_remap_pending\n", "  - name: row_remap_pending\n    sustained: true\n", 1)
    with pytest.raises(PolicyError, match="sustained: is for counters"):
        parse_policy(text)

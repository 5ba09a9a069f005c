"""Chronic slowness priced against a swap (issue 16 item 3, decide/chronic.py): weak but consistent
evidence adds up (combined z across performance peer signals; a CUSUM of a small shift over hours), and a
node whose slowdown costs its synchronous job more over the horizon than one checkpoint restart is
escalated (READY -> DEGRADED on a drift, DEGRADED -> QUARANTINED), with the estimate in the intents, a page
and explain. A healthy fleet, and a small job whose loss does not pay for a swap, are left alone."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest

from fleethealth.decide import chronic
from fleethealth.decide.lifecycle import Timer
from fleethealth.decide.loop import DecisionLoop
from fleethealth.decide.model import IntentKind, State
from fleethealth.policy import Policy, default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

MODEL = "NVIDIA H100 80GB HBM3"
POL = default_policy()


def _quantiles(n: int, center: float, sigma: float, rng: np.random.Generator) -> np.ndarray:
    nd = NormalDist(center, sigma)
    v = np.array([nd.inv_cdf((i + 0.5) / n) for i in range(n)])
    rng.shuffle(v)
    return v


def _scrape(t: float, rng: np.random.Generator, compute: float, clock: float, nodes: int = 48) -> Snapshot:
    """``nodes`` x 8 GPUs in one synchronous job; rank compute median 1.82 s (MAD 0.01 s), SM clock 1980
    MHz (MAD ~9.9 MHz, robust sigma ~14.6 MHz); node-07 computes ``compute`` at ``clock``."""
    b = SnapshotBuilder()
    n_gpu = nodes * 8
    comp = _quantiles(n_gpu, 1.82, 0.01 / 0.6745, rng)
    clk = _quantiles(n_gpu, 1980.0, 9.87 / 0.6745, rng)
    for n in range(nodes):
        node = f"node-{n:02d}"
        for g in range(8):
            r = n * 8 + g
            c, k = (compute, clock) if n == 7 else (comp[r], clk[r])
            b.add("fleethealth_rank_compute_seconds",
                  {"job": "pretrain", "rank": str(r), "node": node, "gpu": str(g), "peer_group": "stage0"}, c, t)
            lab = {"Hostname": node, "gpu": str(g), "modelName": MODEL, "UUID": f"GPU-{node}-{g}"}
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, k, t)
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 60.0, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
    return b.build(t)


def _without_chronic() -> Policy:
    return POL.model_copy(update={"chronic": POL.chronic.model_copy(update={"enabled": False})})


def _run(pol: Policy, compute: float, clock: float, hours: float, every: float = 600.0, nodes: int = 48,
         ) -> tuple[DecisionLoop, list, list]:
    rng = np.random.default_rng(7)
    loop = DecisionLoop(pol)
    trs, intents = [], []
    t = 0.0
    while t <= hours * 3600:
        res = loop.cycle(_scrape(t, rng, compute, clock, nodes), t)
        trs += res.decision.transitions
        intents += res.decision.intents
        t += every
    return loop, trs, intents


def test_cusum_adds_up_a_small_shift_caps_a_wild_one_and_forgets_at_zero() -> None:
    timers: dict[str, Timer] = {}
    assert chronic.feed_cusum(timers, 0.9, 0.0, 1.0) == 0.0 and not timers  # inside the allowance: nothing
    s = 0.0
    for k in range(0, 7201, 60):  # z 3 for two hours: (3 - 1) z an hour
        s = chronic.feed_cusum(timers, 3.0, float(k), 1.0)
    assert s == pytest.approx(4.0)
    for k in range(7260, 7260 + 4 * 3600 + 1, 60):  # nothing past the allowance: counts as 0, back to 0
        s = chronic.feed_cusum(timers, None, float(k), 1.0)
    assert s == 0.0 and chronic.CUSUM_KEY not in timers


def test_the_issues_node_stuck_in_degraded_for_a_day_is_priced_and_quarantined() -> None:
    # SM clock z ~5 low, rank compute 2.4 % slow (z ~2.9) in a 384-GPU job: scores ~0.67, DEGRADED
    compute, clock = 1.82 * 1.024, 1980.0 - 5 * 14.63
    _, trs, _ = _run(_without_chronic(), compute, clock, hours=3)
    assert [(x.entity, x.to_state) for x in trs] == [("node-07", State.DEGRADED)]  # and there it stays
    loop, trs, intents = _run(POL, compute, clock, hours=3)
    assert [(x.entity, x.to_state, x.reason) for x in trs] == [
        ("node-07", State.DEGRADED, "min:performance"), ("node-07", State.QUARANTINED, "chronic:cost")]
    assert trs[1].ts - trs[0].ts == 600.0  # the next cycle: the combined z is evidence enough
    q = [i for i in intents if i.kind == IntentKind.QUARANTINE][0]
    est = q.params["chronic"]
    z = est["z"]
    assert z["sm_clock"] == pytest.approx(5.0, abs=0.3) and z["rank_compute_time"] == pytest.approx(2.9, abs=0.3)
    assert est["combined_z"] == pytest.approx((z["sm_clock"] + z["rank_compute_time"]) / 2 ** 0.5) and est["combined_z"] >= 5
    assert est["job"] == "pretrain" and est["job_gpus"] == 384
    assert est["slowdown"] == pytest.approx(0.024, abs=1e-3)
    assert est["loss_gpu_hours_per_hour"] == pytest.approx(384 * 0.024, rel=0.05)
    assert est["loss_over_horizon_gpu_hours"] == pytest.approx(384 * 0.024 * 24, rel=0.05)  # ~221
    assert est["swap_cost_gpu_hours"] == 100.0 and est["when"] == "next_safe_point"
    page = [i for i in intents if i.kind == IntentKind.PAGE and i.entity == "node-07"]
    assert len(page) == 1 and "GPU-h per hour" in page[0].params["chronic"]["summary"]
    assert loop.state.entities["node-07"].state == State.QUARANTINED
    assert all(e.state == State.READY for k, e in loop.state.entities.items() if k != "node-07")


def test_a_small_sustained_clock_drift_gets_a_response_within_hours() -> None:
    # 1.5 % SM clock (z ~2, score 1.0: no threshold sees it) and 1.5 % compute (inside min_rel_dev)
    compute, clock = 1.82 * 1.015, 1980.0 * 0.985
    fh = score_snapshot(_scrape(0.0, np.random.default_rng(1), compute, clock), POL, 0.0)
    assert fh.tuples["node-07"].value == 1.0
    _, trs, _ = _run(_without_chronic(), compute, clock, hours=14)
    assert trs == []
    _, trs, intents = _run(POL, compute, clock, hours=14)
    assert [(x.entity, x.to_state, x.reason) for x in trs] == [
        ("node-07", State.DEGRADED, "chronic:drift"), ("node-07", State.QUARANTINED, "chronic:cost")]
    # the combined z ~(2 + 0) / sqrt 2 = 1.4 adds ~0.4 z-hours an hour: the 4 z-hour alarm after ~10 h
    assert 8 * 3600 <= trs[0].ts <= 12 * 3600 and trs[1].ts == trs[0].ts + 600
    pages = [i for i in intents if i.kind == IntentKind.PAGE and i.entity == "node-07"]
    assert [p.reason for p in pages] == ["chronic:cost"]  # the swap pages; the drift only holds new work
    held = [i for i in intents if i.kind == IntentKind.NO_NEW_WORK and i.entity == "node-07"]
    assert held and held[0].ts == trs[0].ts
    drift = [i for i in intents if i.entity == "node-07" and i.reason == "chronic:drift"]
    assert all(i.params["chronic"]["cusum_z_hours"] >= POL.chronic.cusum_h for i in drift if "chronic" in i.params)


def test_a_job_too_small_to_pay_for_a_swap_and_a_healthy_fleet_are_left_alone() -> None:
    compute, clock = 1.82 * 1.024, 1980.0 - 5 * 14.63
    _, trs, _ = _run(POL, compute, clock, hours=12, nodes=12)  # 96 GPUs: 2.4 % is 55 GPU-h a day < 100
    assert not [x for x in trs if x.to_state == State.QUARANTINED or x.reason.startswith("chronic")]
    fh = score_snapshot(_scrape(0.0, np.random.default_rng(1), compute, clock, 12), POL, 0.0)
    assert "node-07" not in chronic.node_evidence(fh, POL)  # it cannot pay for a swap: not even priced
    loop, trs, intents = _run(POL, 1.82, 1980.0, hours=6)  # node-07 as its peers
    assert trs == [] and not [i for i in intents if i.kind == IntentKind.PAGE]
    # peers' tails past the allowance come and go: their sums stay far from the alarm
    sums = [e.timers[chronic.CUSUM_KEY].accum_s for e in loop.state.entities.values() if chronic.CUSUM_KEY in e.timers]
    assert max(sums, default=0.0) < POL.chronic.cusum_h / 4


def test_explain_prints_the_estimate() -> None:
    compute, clock = 1.82 * 1.024, 1980.0 - 5 * 14.63
    fh = score_snapshot(_scrape(0.0, np.random.default_rng(1), compute, clock), POL, 0.0)
    ev = chronic.node_evidence(fh, POL)
    assert max(ev, key=lambda n: ev[n].combined_z) == "node-07"  # (healthy tails past the allowance too)
    words = chronic.describe(chronic.estimate(ev["node-07"], {}, POL))
    assert "384 GPUs" in words and "against 100 GPU-h for a swap" in words and "2.4% slower" in words

"""Chronic slowness priced against a swap, function by function (issue 21: decide/chronic.py): the floor
flag, the price of a slow rank, the CUSUM's arithmetic (grows by z - k per hour, never below zero, paused
by unknown data, forgotten at zero), which condition holds where (at the exact thresholds), and the
estimate and words an operator reads on the intent and the page."""

from __future__ import annotations

import pytest

from fleethealth.decide import chronic
from fleethealth.decide.chronic import CUSUM_KEY, Evidence, at_floor, conds, describe, estimate, feed_cusum
from fleethealth.decide.lifecycle import Cond, Observation, Timer
from fleethealth.decide.model import State
from fleethealth.policy import default_policy

POL = default_policy()
CH, LC = POL.chronic, POL.lifecycle  # swap 100 GPU-h, horizon 24 h, combined_z 5, k 1, h 4, cap 3


def ev(z: float = 6.0, slowdown: float | None = 0.05, job_gpus: int = 128) -> Evidence:
    return Evidence(z, {"sm_clock": 5.0, "rank_compute_time": 3.5}, "node-3/gpu2", slowdown, "job-a", job_gpus)


def obs(value: float = 0.8, conf: float = 1.0) -> Observation:
    return Observation(value, conf, "min:performance")


def test_the_floor_flag_is_found_in_any_of_the_sets() -> None:
    assert not at_floor() and not at_floor(None, set(), ())
    assert at_floor(None, {"floor:pcie_replay"}) and at_floor(["x", "floor:ecc"], None)
    assert not at_floor({"xfloor:pcie", "gate:xid"})


def test_a_slow_rank_costs_its_whole_job_and_a_fast_one_nothing() -> None:
    assert ev(slowdown=0.05, job_gpus=128).loss_gpu_h_per_h() == pytest.approx(6.4)
    assert ev(slowdown=-0.02).loss_gpu_h_per_h() == 0.0
    assert ev(slowdown=None).loss_gpu_h_per_h() is None
    assert ev(job_gpus=0).loss_gpu_h_per_h() is None


def test_the_cusum_adds_z_minus_k_per_hour_and_forgets_at_zero() -> None:
    timers: dict[str, Timer] = {}
    assert feed_cusum(timers, 1.0, 0.0, 1.0) == 0.0 and timers == {}  # at the allowance: nothing starts
    assert feed_cusum(timers, None, 0.0, 1.0) == 0.0 and timers == {}
    assert feed_cusum(timers, 3.0, 0.0, 1.0) == 0.0 and timers[CUSUM_KEY] == Timer(0.0, 0.0)
    assert feed_cusum(timers, 3.0, 1800.0, 1.0) == pytest.approx(1.0)  # (3 - 1) z for half an hour
    assert feed_cusum(timers, 3.0, 1800.0, 1.0) == pytest.approx(1.0)  # the same time again adds nothing
    assert feed_cusum(timers, 1.5, 5400.0, 1.0) == pytest.approx(1.5)
    assert timers[CUSUM_KEY].last_ts == 5400.0
    # no z this cycle counts as z 0: S falls by k per hour and the entry goes at zero
    assert feed_cusum(timers, None, 5400.0 + 3600.0, 1.0) == pytest.approx(0.5)
    assert feed_cusum(timers, None, 5400.0 + 3 * 3600.0, 1.0) == 0.0 and CUSUM_KEY not in timers


def test_a_paused_cusum_resumes_without_counting_the_gap() -> None:
    timers = {CUSUM_KEY: Timer(2.0, None)}  # paused by unknown data
    assert feed_cusum(timers, 3.0, 7200.0, 1.0) == 2.0 and timers[CUSUM_KEY].last_ts == 7200.0
    assert feed_cusum(timers, 3.0, 9000.0, 1.0) == pytest.approx(3.0)


def test_unknown_or_unusable_data_pauses_the_cusum_and_decides_nothing() -> None:
    for o in (None, Observation(None, 1.0, "no_fresh_data"), obs(conf=LC.min_confidence - 0.01)):
        timers = {CUSUM_KEY: Timer(3.0, 100.0)}
        assert conds(State.READY, timers, ev(), 200.0, POL, o) == set()
        assert timers[CUSUM_KEY] == Timer(3.0, None)
    timers = {CUSUM_KEY: Timer(3.0, 100.0)}  # exactly at min_confidence: usable, fed
    conds(State.READY, timers, ev(), 3700.0, POL, obs(conf=LC.min_confidence))
    assert timers[CUSUM_KEY].accum_s == pytest.approx(5.0)  # z capped at 3: + (3 - 1) for an hour


def test_a_degraded_node_whose_loss_pays_for_a_swap_is_quarantined_at_the_combined_z() -> None:
    t: dict[str, Timer] = {}
    # 5% of 128 GPUs = 6.4 GPU-h an hour, 153.6 over the 24 h horizon >= 100 for a swap
    assert conds(State.DEGRADED, t, ev(z=CH.combined_z), 0.0, POL, obs(LC.quarantine_below)) == {Cond.CHRONIC_COST}
    assert conds(State.DEGRADED, {}, ev(z=CH.combined_z - 0.01), 0.0, POL, obs(0.5)) == set()
    assert conds(State.DEGRADED, {}, ev(), 0.0, POL, obs(LC.quarantine_below - 0.01)) == set()  # the score acts
    # a job too small: 5% of 32 GPUs over 24 h is 38.4 GPU-h, less than a swap
    assert conds(State.DEGRADED, {}, ev(job_gpus=32), 0.0, POL, obs(0.5)) == set()
    # exactly the swap cost: 100 GPU-h over 24 h
    exact = Evidence(6.0, {}, "g", 100.0 / 24.0 / 100.0, "j", 100)
    assert conds(State.DEGRADED, {}, exact, 0.0, POL, obs(0.5)) == {Cond.CHRONIC_COST}
    assert conds(State.DEGRADED, {}, ev(slowdown=None), 0.0, POL, obs(0.5)) == set()
    # neither READY nor DEGRADED, or chronic pricing off: nothing
    assert conds(State.QUARANTINED, {}, ev(), 0.0, POL, obs(0.5)) == set()
    off = POL.model_copy(update={"chronic": CH.model_copy(update={"enabled": False})})
    assert conds(State.DEGRADED, {}, ev(), 0.0, off, obs(0.5)) == set()


def test_a_ready_node_drifts_to_degraded_once_its_cusum_reaches_h() -> None:
    timers = {CUSUM_KEY: Timer(CH.cusum_h - 2.0, 0.0)}
    # one more hour at z 6 (capped at 3): + 2 z-hours, exactly h
    assert conds(State.READY, timers, ev(), 3600.0, POL, obs(LC.degraded_below)) == {Cond.CHRONIC_DRIFT}
    below = {CUSUM_KEY: Timer(CH.cusum_h - 2.01, 0.0)}
    assert conds(State.READY, below, ev(), 3600.0, POL, obs(0.9)) == set()
    scored = {CUSUM_KEY: Timer(CH.cusum_h, 0.0)}  # the score already degrades it: its usual way
    assert conds(State.READY, scored, ev(), 3600.0, POL, obs(LC.degraded_below - 0.01)) == set()
    # a DEGRADED node with the CUSUM at h is priced even under the combined z
    drifted = {CUSUM_KEY: Timer(CH.cusum_h, 0.0)}
    assert conds(State.DEGRADED, drifted, ev(z=2.0), 3600.0, POL, obs(0.5)) == {Cond.CHRONIC_COST}
    # without evidence the CUSUM is fed with z 0 and nothing holds
    fed = {CUSUM_KEY: Timer(3.0, 0.0)}
    assert conds(State.READY, fed, None, 3600.0, POL, obs(0.9)) == set()
    assert fed[CUSUM_KEY].accum_s == pytest.approx(2.0)


def test_the_estimate_on_the_intent_and_the_words_on_the_page() -> None:
    timers = {CUSUM_KEY: Timer(4.25, 0.0)}
    est = estimate(ev(), timers, POL)
    assert est == {"gpu": "node-3/gpu2", "combined_z": 6.0, "z": {"sm_clock": 5.0, "rank_compute_time": 3.5},
                   "cusum_z_hours": 4.25, "slowdown": 0.05, "job": "job-a", "job_gpus": 128,
                   "loss_gpu_hours_per_hour": pytest.approx(6.4), "horizon_s": 86400.0,
                   "loss_over_horizon_gpu_hours": pytest.approx(153.6), "swap_cost_gpu_hours": 100.0,
                   "when": "next_safe_point", "loss_gpu_hours_per_day": pytest.approx(153.6), "pays": True,
                   "slow_for_s": 0.0}
    assert describe(est) == ("combined z 6.0 (rank_compute_time 3.5, sm_clock 5.0) on node-3/gpu2; CUSUM 4.2 "
                             "z-hours; 5.0% slower than its peers in job-a (128 GPUs): 6.4 GPU-h per hour, 154 GPU-h "
                             "over 24 h against 100 GPU-h for a swap")
    no_rank = estimate(ev(slowdown=None), {}, POL)
    assert no_rank["cusum_z_hours"] == 0.0 and no_rank["loss_over_horizon_gpu_hours"] is None
    assert describe(no_rank).endswith("CUSUM 0.0 z-hours; no rank compute time: no job to price")
    assert estimate(None, timers, POL) == {} and describe({}) == "no chronic-slowness evidence"


def test_a_chronic_transition_is_named_and_carries_the_estimate_and_its_summary() -> None:
    timers = {CUSUM_KEY: Timer(4.25, 0.0)}
    why, params = chronic.on_transition(Cond.CHRONIC_COST, "node-3", timers, {"node-3": ev()}, POL)  # type: ignore[misc]
    assert why == "chronic:cost" and params["job"] == "job-a" and params["summary"].startswith("combined z 6.0")
    why, params = chronic.on_transition(Cond.CHRONIC_DRIFT, "node-3", timers, {}, POL)  # type: ignore[misc]
    assert (why, params) == ("chronic:drift", {"summary": "no chronic-slowness evidence"})
    assert chronic.on_transition(Cond.BELOW_QUARANTINE, "node-3", timers, {"node-3": ev()}, POL) is None

"""The plain step: one step's draws and values computed on their own (outside the quiet regime).

Theory of operation. ``step_plain`` is what a step does whenever a fault has an effect or something is out
of service (and, with the draw-ahead switched off, always). The GPUs first: seven rows of unit normals
(temperature, an unused row, power, utilisation, framebuffer, memory temperature, slow drift) scaled in
one operation; slow drift is an AR(1) with a two-hour time constant and each rack's ambient swings daily;
gain * load + offset + static comes from the load plan (``load_plan``); a loaded GPU's SM clock jitters
uniformly inside a band; the faults' effects add or multiply where they touch; rare healthy counter noise
(a replay, a corrected bit, a CRC flit) is sprinkled over the fleet. Then the workloads:

- ``step_training``: a training job's ranks each report the compute time of the last step up to the
  collective and the whole-step time (the slowest rank plus communication, equal on every rank of a
  job). Healthy ranks of one stage stay within about 1 % of each other, the whole job is a little slower
  on some steps, and sequence-length imbalance makes the ranks of one node slow together. Faults multiply
  compute times or hang a collective (no step completes, compute times freeze except on the ranks that
  never reach it, the step in flight grows); a drained node's ranks leave the job.
- ``step_serving``: a serving replica's requests, errors, waiting queue and tokens are Poisson counts
  around the plan's means (exact for small means, the normal approximation for large ones), its TTFT and
  ITL histograms are filled by systematic sampling over the planned latency CDF rows, and a KV cache used
  past 0.9 preempts. One draw per distribution per step for all replicas: the cost is per call.

The random draws come from the simulator's generator in a fixed order, which the quiet regime's
draw-ahead (``quiet_regime``) replays exactly. Every value is written in place into the simulator's state
and value buffer: these functions are part of ``Simulation``, kept here for the simulator's readability.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from fleethealth.sim.load_plan import LoadPlan, plan_for
from fleethealth.sim.metric_catalog import ITL, RANK_STEP, TTFT
from fleethealth.sim.numerics import (
    FB_USABLE,
    ITL_MEAN,
    K0,
    K0_01,
    K0_02,
    K0_4,
    K0_5,
    K0_9,
    K0_85,
    K1,
    K6,
    K38,
    K100,
    K1935,
    TTFT_MEAN,
    poisson_counts,
    sprinkle,
)

if TYPE_CHECKING:
    from fleethealth.sim.faults import Effects
    from fleethealth.sim.simulation import Simulation


def step_plain(sim: Simulation, t: float, eff: Effects | None, any_out: bool) -> None:
    """One step's draws and values, computed on their own."""
    rng = sim.rng
    G = sim._G
    v = sim._v
    day = (t - sim.start) / 86400.0
    # Seven rows of unit normals: temperature, (unused), power, utilisation, framebuffer, memory
    # temperature, drift; scaled in one operation. Slow drift: AR(1) with a two-hour time constant,
    # and a rack ambient with a daily swing.
    n01 = rng.standard_normal((7, G))
    n01 *= sim._noise_scale
    a, b, b_c = sim._drift
    drift = sim.temp_drift
    drift *= a
    drift += n01[6]
    amb = sim.rack_amb
    amb *= b
    noise = rng.standard_normal(len(amb))
    noise *= b_c
    amb += noise
    ambient = amb[sim.gpu_rack]
    ambient += np.array(1.0 * math.sin(2 * math.pi * (day - 0.6)))

    plan, i = plan_for(sim, sim.k, eff, any_out)
    # temperature, (unused), power, utilisation, framebuffer as rows of one array, each
    # gain * load + offset + static (planned) + (drift + ambient for the temperature) + noise
    if plan.w is not None:
        w = plan.w[i]
    else:
        w = sim._w_base.copy()
        w[:, sim.serve_gpus] = plan.w_serve[i]
    temp = w[0]
    temp += drift
    temp += ambient
    w += n01[:5]
    power, util, fb = w[2], w[3], w[4]
    # A loaded GPU's clock jitters uniformly inside a band under its power/boost limits: the peer spread
    # is what the seed describes (MAD-based sigma 14 MHz, so -3 % reads as z = 4.1) while a healthy GPU
    # never strays 1 % from the pack (no Gaussian tail, and no small peer group's tiny MAD, fakes an
    # outlier).
    clock = rng.random(G)
    clock -= K0_5
    clock *= K38
    clock += K1935
    # the effects faults touched (the others are neutral: adding zero, multiplying by one, changes nothing)
    reasons = None
    if eff is not None:
        for arr, name in ((temp, "temp_add"), (power, "power_add"), (fb, "fb_add")):
            if (add := eff.get(name)) is not None:
                arr += add
        if (mul := eff.get("clock_mul")) is not None:
            clock *= mul
        reasons = eff.get("clock_reasons")
    if reasons is not None:
        v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"][...] = reasons
    else:
        v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].fill(0.0)
    np.rint(temp, out=v["DCGM_FI_DEV_GPU_TEMP"])
    mem_temp = np.add(temp, K6, out=v["DCGM_FI_DEV_MEMORY_TEMP"])
    mem_temp += n01[5]
    np.rint(mem_temp, out=mem_temp)
    np.rint(clock, out=v["DCGM_FI_DEV_SM_CLOCK"])
    v["DCGM_FI_DEV_POWER_USAGE"][...] = power
    util = np.rint(util, out=v["DCGM_FI_DEV_GPU_UTIL"])
    np.maximum(util, K0, out=util)
    np.minimum(util, K100, out=util)
    copy_util = np.multiply(util, K0_4, out=v["DCGM_FI_DEV_MEM_COPY_UTIL"])
    np.rint(copy_util, out=copy_util)
    fb = np.rint(fb, out=v["DCGM_FI_DEV_FB_USED"])
    np.minimum(FB_USABLE, fb, out=fb)
    np.subtract(FB_USABLE, fb, out=v["DCGM_FI_DEV_FB_FREE"])
    joules = np.multiply(power, sim._ms_per_step)
    sim.energy += np.rint(joules, out=joules)
    # rare healthy counter noise: a replay, a corrected bit, one CRC flit now and then
    dt = sim.step_s
    sprinkle(rng, sim.pcie, 2e-6 * dt * G)
    sprinkle(rng, sim.sbe, 1e-6 * dt * G)
    sprinkle(rng, sim.nvl[0], 1e-6 * dt * G)
    if eff is not None:
        if (rate := eff.get("pcie_rate")) is not None and np.count_nonzero(rate):
            sim.pcie += poisson_counts(rng, rate * dt)
        if (rate := eff.get("sbe_rate")) is not None and np.count_nonzero(rate):
            sim.sbe += poisson_counts(rng, rate * dt)
        if (rate := eff.get("thermal_viol_rate")) is not None:
            sim.therm_viol += np.rint(rate * dt)
        if (rate := eff.get("power_viol_rate")) is not None:
            sim.power_viol += np.rint(rate * dt)
        if (rate := eff.get("nvlink_rate")) is not None and np.count_nonzero(rate):
            nr = rate * dt
            sim.nvl += poisson_counts(rng, np.stack([nr, nr * 0.1, nr * 0.05, nr * 0.002]))
    step_training(sim, t, eff, any_out)
    step_serving(sim, dt, plan, i)


def step_training(sim: Simulation, t: float, eff: Effects | None, any_out: bool) -> None:
    if sim._nr == 0:
        return
    rng = sim.rng
    J = sim._J
    v = sim._v
    seq = eff.get("seq_sigma") if eff is not None else None
    job_sigma = sim.job_sigma + seq if seq is not None else sim.job_sigma
    imbalance = np.count_nonzero(job_sigma) > 0 if seq is not None else sim._seq_imbalance
    common = rng.standard_normal(J)  # the whole job is a little slower on some steps
    common *= K0_01
    common = np.exp(common, out=common)
    rj = sim._rank_job
    node_of_rank = sim.node_of_rank
    # Healthy ranks of one stage stay within 1.1 % of each other's typical time, uniformly (seed: MAD
    # 0.01 s at 1.82 s, so 1.86 s reads as z ~ 2.7); anything beyond that comes from a fault or from
    # the workload (unequal stages, sequence lengths).
    dev = rng.random(sim._nr)
    dev -= K0_5
    dev *= sim._rank_noise2
    dev += sim.rank_static
    dev += K1
    comp = common[rj]
    comp *= sim.rank_base
    comp *= dev
    if imbalance:
        # sequence-length imbalance: the ranks of one node share a micro-batch, so they are slow together
        z = rng.standard_normal(sim.fleet.n_nodes)
        sig = job_sigma[rj]
        comp = comp * np.exp(sig * z[node_of_rank] - 0.5 * sig * sig)
    if eff is not None:
        if (mul := eff.get("compute_mul")) is not None:
            comp = comp * mul[sim._rank_gpu]
        if (mul := eff.get("rank_mul")) is not None:
            comp = comp * mul
    out = sim.node_out[node_of_rank] if any_out else None
    # ranks are contiguous per job; a drained node's ranks no longer hold the step up
    step_max = np.maximum.reduceat(comp if out is None else np.where(out, 0.0, comp), sim.job_rank_start)
    jitter = rng.standard_normal(J)
    jitter *= K0_02
    jitter += K1
    jitter *= sim.job_comm
    step = np.add(step_max, jitter, out=jitter)
    hung = eff.get("job_hang") if eff is not None else None
    if hung is not None and np.count_nonzero(hung):
        newly = hung & np.isnan(sim.job_hang_since)
        sim.job_hang_since[newly] = t
        # a hung collective: no step completes, compute times freeze, the step in flight grows
        hang_ranks = hung[rj]
        comp = np.where(hang_ranks, sim.rank_compute, comp)
        stuck = eff.get("rank_stuck") if eff is not None else None
        if stuck is not None:
            # the ranks that never reach the collective: their compute is still running (the rank
            # timer's reading in flight), while their peers' ended at the collective they wait in
            since = sim.job_hang_since[rj]
            comp = np.where(stuck & hang_ranks, sim.rank_base + (t - np.nan_to_num(since)), comp)
        step = np.where(hung, t - np.nan_to_num(sim.job_hang_since) + sim.step_s, step)
    if hung is not None:
        sim.job_hang_since[~hung] = np.nan
    else:
        sim.job_hang_since.fill(np.nan)
    sim.rank_compute[...] = comp
    v[RANK_STEP][...] = step[rj]


def step_serving(sim: Simulation, dt: float, plan: LoadPlan, i: int) -> None:
    R = sim._R
    if R == 0:
        return
    rng = sim.rng
    v = sim._v
    # One call per distribution per step: with 32 replicas the cost is per call, not per number.
    z = rng.standard_normal((4, R))
    u = rng.random((2, R))
    small = rng.poisson(plan.lam[i].reshape(-1)).astype(np.float64).reshape(4, R)
    # requests arriving and requests running (two rows): Poisson counts, exact for small means, by the
    # normal approximation for large ones
    big = np.multiply(plan.sqrt_lam2[i], z[:2])
    big += plan.lam2[i]
    np.rint(big, out=big)
    np.maximum(big, K0, out=big)
    counts = np.where(plan.lam2_big[i], big, small[::3])
    n_req = counts[0]
    v["vllm:num_requests_running"][...] = counts[1]
    v["vllm:num_requests_waiting"][...] = small[2]
    inc = sim._inc  # this step's increments of the replica counters, rows in ``simulation._REP_CTR`` order
    errs = np.minimum(n_req, small[1], out=inc[4])
    lam_tok = n_req * sim.rep_tokens
    n_tok = np.sqrt(lam_tok)
    n_tok *= z[2]
    n_tok += lam_tok
    np.rint(n_tok, out=n_tok)
    np.maximum(n_tok, K0, out=n_tok)
    # Requests and tokens are spread over the buckets by systematic sampling (one uniform per replica):
    # cumulative counts floor(N * CDF(le) + u) are monotone, have exactly the right means, and a rare
    # slow request still lands in the tail with the right probability; a multinomial per replica per
    # step would cost ten times more. The planned CDF rows are this step's own: used up in place.
    assert sim._cdf_tab is not None
    for hist, cdf, n, u_h in ((sim.ttft_b, sim._cdf_tab[0][plan.cdf_rows[i, 0]], n_req, u[0]),
                              (sim.itl_b, sim._cdf_tab[1][plan.cdf_rows[i, 1]], n_tok, u[1])):
        # the table's last column (+Inf) is a placeholder: the count itself goes there, so that the
        # whole (contiguous) histogram block takes one addition
        cdf *= n[:, None]
        cdf += u_h[:, None]
        np.floor(cdf, out=cdf)
        cdf[:, -1] = n
        hist += cdf
    med = plan.med[i]
    sim.ttft_sum += n_req * med[0] * TTFT_MEAN
    sim.itl_sum += n_tok * med[1] * ITL_MEAN
    v[TTFT + "_count"][...] = sim.ttft_b[:, -1]
    v[ITL + "_count"][...] = sim.itl_b[:, -1]
    ok = n_req - errs
    stop = np.multiply(ok, K0_85, out=inc[5])
    stop += u[0]
    np.floor(stop, out=stop)
    np.subtract(ok, stop, out=inc[6])
    inc[3] = n_req
    np.add(n_tok, n_req, out=inc[1])
    prompt = np.multiply(n_req, sim.rep_prompt, out=inc[2])
    np.rint(prompt, out=prompt)
    noise = z[3]
    noise *= K0_02
    kv = np.add(plan.kv[i], noise, out=sim.last_kv)
    np.maximum(kv, K0, out=kv)
    np.minimum(kv, K1, out=kv)
    if np.count_nonzero(np.greater(kv, K0_9)):
        inc[0] = rng.poisson(np.maximum(0.0, kv - 0.9) * 5.0 * dt)
    else:
        inc[0].fill(0.0)
    sim._rep_ctr += inc

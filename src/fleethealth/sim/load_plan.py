"""The load plan: everything of a step that no random draw enters, for many steps at once.

Theory of operation. A serving replica's load follows a diurnal curve of simulated time; from it follow
the GPU rows that load drives (temperature, power, utilisation, framebuffer: gain * load + offset +
static), the latency medians (TTFT grows with the square of the load, ITL linearly), the Poisson means of
requests arriving, running, failing and waiting, the rows of the latency CDF table each histogram draw
uses, and the KV-cache use before noise. None of it depends on the random stream, so while nothing bends
load, rates or latencies (no fault effect on them, nothing out of service) ``shared_plan`` computes it for
``PLAN_STEPS`` steps in one go and the steps read their row; otherwise ``plan_for`` makes a one-step plan
from the same code. Every operation is element-wise along a leading axis of steps, so a row is the same,
bit for bit, whichever batch computed it (tested). The plan is read only: the quiet regime's draw-ahead
(``quiet_regime``) reads rows of the same shared plan as the plain step.

These functions are part of ``Simulation`` (they read and keep its state: ``sim._plan_cache``, the
latency CDF table ``sim._cdf_tab``); they live here to keep the simulator's module readable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fleethealth.sim.metric_catalog import ITL, ITL_SIGMA, TTFT, TTFT_SIGMA
from fleethealth.sim.numerics import (
    CDF_LAST,
    CDF_LO,
    CDF_N,
    CDF_STEP,
    K0,
    K0_1,
    K0_5,
    K0_6,
    K0_8,
    K0_15,
    K0_35,
    K0_75,
    K1,
    K1_6,
    K2,
    K30,
    K40,
    K256,
    SQRT2,
    erf,
    with_inf_column,
)

if TYPE_CHECKING:
    from fleethealth.sim.faults import Effects
    from fleethealth.sim.simulation import Simulation


@dataclass(slots=True)
class LoadPlan:
    """What no random draw enters, for consecutive steps (row i: step k0 + i): gain * load + offset +
    static for temperature, (unused), power, utilisation and framebuffer of the serving GPUs (steps, 5,
    serving GPUs), and of every GPU only where some node is drained (steps, 5, GPUs; otherwise None: the
    others are at their base load, ``Simulation._w_base``); per replica the TTFT and ITL medians, the
    uncapped means of requests arriving and running with their square roots and whether they take the
    normal approximation (steps, 2, replicas), the capped Poisson means of requests, errors, waiting,
    running (steps, 4, replicas), the rows of the TTFT and ITL latency CDF tables (steps, 2, replicas)
    and the KV-cache use before noise. A plain step writes its own row of ``w`` in place."""

    k0: int
    w: np.ndarray | None
    w_serve: np.ndarray
    med: np.ndarray
    lam2: np.ndarray
    sqrt_lam2: np.ndarray
    lam2_big: np.ndarray
    lam: np.ndarray
    cdf_rows: np.ndarray
    kv: np.ndarray


# steps per shared plan
PLAN_STEPS = 64


def plan_for(sim: Simulation, k: int, eff: Effects | None, any_out: bool) -> tuple[LoadPlan, int]:
    """The plan holding step ``k`` and its row. While nothing bends load, rates or latencies (no
    fault effect on them, nothing out of service) the steps share a plan made for ``PLAN_STEPS``
    at once; otherwise step ``k`` gets its own, from the same code."""
    idle: np.ndarray | None = None
    if sim._R and (any_out or np.count_nonzero(sim.rep_out)):
        idle = sim.rep_out | sim.node_out[sim.rep_node]
        if not np.count_nonzero(idle):
            idle = None
    if eff is not None and eff.neutral_for_serving():
        eff = None
    if eff is not None or any_out or idle is not None:
        return make_plan(sim, k, 1, eff, idle, any_out), 0
    return shared_plan(sim, k)


def shared_plan(sim: Simulation, k: int) -> tuple[LoadPlan, int]:
    """The plan of ``PLAN_STEPS`` steps that holds step ``k`` (kept on the simulator, made when ``k`` is
    past it) and ``k``'s row in it: for steps that nothing bends."""
    plan = sim._plan_cache
    if plan is None or not plan.k0 <= k < plan.k0 + len(plan.med):
        plan = sim._plan_cache = make_plan(sim, k, PLAN_STEPS)
    return plan, k - plan.k0


def make_plan(sim: Simulation, k0: int, n: int, eff: Effects | None = None, idle: np.ndarray | None = None,
              any_out: bool = False) -> LoadPlan:
    """Steps ``k0 .. k0 + n - 1``: diurnal load per replica and GPU, request rates, latency medians,
    Poisson means and latency CDF rows. Row by row the same operations a single step would do (a
    leading axis changes no element-wise result)."""
    R, dt = sim._R, sim.step_s
    t = sim.start + np.arange(k0, k0 + n, dtype=np.float64) * dt
    day = (t - sim.start) / 86400.0
    # serving load per replica (diurnal), mapped onto its GPUs
    rate = sim.rep_rate * (1.0 + sim.rep_diurnal * np.sin(2 * math.pi * (day[:, None] + sim.rep_phase - 0.35)))
    rep_load = rate / (sim.rep_rate * K1_6)
    if eff is not None:
        rep_load += eff.load_add
    np.maximum(rep_load, K0, out=rep_load)
    np.minimum(rep_load, K2, out=rep_load)
    if eff is not None:
        rate = rate * eff.rate_mul
    if idle is not None:
        # out of service: the router sends nothing, the engine idles with its weights loaded
        rate = np.where(idle, 0.0, rate)
        rep_load = np.where(idle, 0.0, rep_load)
    gl = rep_load[:, sim.serve_rep]
    gl *= K0_6
    gl += K0_35
    np.minimum(K1, gl, out=gl)
    # only the serving GPUs' load moves (the others' rows are computed once, the same operations),
    # unless nodes are drained
    w_serve = np.multiply(gl[:, None, :], sim._load_gain)
    w_serve += sim._load_offset
    w_serve += sim._serve_static
    w = None
    if any_out:
        load = np.repeat(sim.base_load[None, :], n, axis=0)
        load[:, sim.node_out[sim.gpu_node]] = 0.0  # drained: the workload went elsewhere
        load[:, sim.serve_gpus] = gl
        w = np.multiply(load[:, None, :], sim._load_gain)
        w += sim._load_offset
        w += sim._gpu_static
    # latency medians: TTFT grows with the square of the load, ITL linearly
    med = np.empty((n, 2, R))
    ttft = np.multiply(rep_load, K0_8, out=med[:, 0])
    ttft *= rep_load
    ttft += K1
    ttft *= sim.rep_ttft
    itl = np.multiply(rep_load, K0_5, out=med[:, 1])
    itl += K1
    itl *= sim.rep_itl
    err = sim.rep_err
    if eff is not None:
        ttft *= eff.ttft_mul
        itl *= eff.itl_mul
        err = np.minimum(err + eff.err_add, 1.0)
    # Poisson means: requests arriving and running (uncapped, for the normal approximation), and the
    # capped means of requests, errors, waiting, running
    lam2 = np.empty((n, 2, R))
    np.multiply(rate, dt, out=lam2[:, 0])
    e2e = sim.rep_tokens * itl
    e2e += ttft
    e2e *= rate
    np.minimum(e2e, K256, out=lam2[:, 1])
    lam = np.empty((n, 4, R))
    np.minimum(lam2, K30, out=lam[:, ::3])
    np.multiply(lam2[:, 0], err, out=lam[:, 1])
    waiting = np.subtract(rep_load, K0_75, out=lam[:, 2])
    np.maximum(K0, waiting, out=waiting)
    waiting *= K40
    waiting += K0_1
    cdf_rows = latency_cdf(sim, med)
    kv = np.multiply(rep_load, K0_5)
    kv += K0_15
    return LoadPlan(k0, w, w_serve, med, lam2, np.sqrt(lam2), lam2 >= K30, lam, cdf_rows, kv)


def latency_cdf(sim: Simulation, med: np.ndarray) -> np.ndarray:
    """The rows of the tables of P(latency <= le) per bucket for the TTFT and the ITL histograms, per
    step and replica (``med``: (steps, 2, replicas) medians; the rows have the same shape).

    Looked up in a table over log(median) at 0.5 % resolution, built once: the erf per bucket per
    replica per step was the most expensive line of the serving model."""
    if sim._cdf_tab is None:
        grid = CDF_LO + CDF_STEP * np.arange(CDF_N)
        zt = (sim._log_les[TTFT][None, :] - grid[:, None]) * (1.0 / (TTFT_SIGMA * SQRT2))
        zi = (sim._log_les[ITL][None, :] - grid[:, None]) * (1.0 / (ITL_SIGMA * SQRT2))
        sim._cdf_tab = (with_inf_column(0.5 * (1.0 + erf(zt))), with_inf_column(0.5 * (1.0 + erf(zi))))
    ix = np.log(med)
    ix -= CDF_LO
    ix *= 1 / CDF_STEP
    np.rint(ix, out=ix)
    np.maximum(ix, K0, out=ix)
    np.minimum(ix, CDF_LAST, out=ix)
    return ix.astype(np.intp)

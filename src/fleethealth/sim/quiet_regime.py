"""The quiet regime: a healthy fleet's steps, drawn ahead in blocks.

Theory of operation. While no fault has an effect and nothing is out of service (a healthy fleet's days),
a step's random draws do not depend on anything the step computes, so they are known in advance: up to
``DRAW_AHEAD`` steps are drawn at once (``_draws``), in the same order and from the same generator as the
plain step (``plain_step.step_plain``) would draw them one by one, and what follows from the draws and
the load plan is computed for all of them together (``draw_ahead``, the plain step's arithmetic operation
for operation along a leading axis of steps). Each step then copies its rows into the value buffer and
adds its counter increments (``step_drawn``). The telemetry is the same, bit for bit, as the plain path's.

A world that leaves the regime mid-block (a fault starts, an action drains a node) first puts the
generator back where the last consumed step left it, replaying the consumed steps' draws from the
block's first state (``undraw``), and the next block starts short (``DRAW_FIRST`` steps, doubling up to
``DRAW_AHEAD``), so a fault that flickers wastes few draws. Blocks write into ``Scratch`` arrays kept
from one block to the next (memory just used is faster to write than memory fresh from the allocator).

These functions are part of ``Simulation`` (they read and keep its state: ``sim._drawn``, ``sim._ahead``,
``sim._scratch``); they live here to keep the simulator's module readable.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from fleethealth.sim.load_plan import shared_plan
from fleethealth.sim.metric_catalog import ITL, TTFT
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
)

if TYPE_CHECKING:
    from fleethealth.sim.simulation import Simulation

# at most this many steps drawn ahead (0: never; every step draws and computes on its own)
DRAW_AHEAD = 64
# a first draw-ahead after a rewind covers this many steps, each next one twice as many (up to DRAW_AHEAD):
# a world that keeps leaving the quiet regime wastes little on draws it has to replay
DRAW_FIRST = 8
# numpy's standard normals never exceed 12.3 in magnitude (its ziggurat tail draws from 53-bit uniforms),
# so a KV-cache use planned at most this high stays under the 0.9 that triggers the preemption draw
# (0.6 + 0.02 * 14 < 0.9) and the draw-ahead needs no check of its noise
KV_SAFE = 0.6


@dataclass(slots=True)
class DrawnSteps:
    """Steps ``k0 .. k0 + n - 1`` drawn ahead in the quiet regime (no fault effect, nothing out of
    service), and everything the step computes from the draws and the plan alone, for step k0 + i: the
    GPU gauges ``gpu[:, i]`` (temperature, memory temperature, SM clock, memory clock (state, as it was),
    power, utilisation, copy utilisation, framebuffer used and free), the energy increments, the
    slow-drift and rack-ambient states (one row: GPUs, then racks), the rank gauges ``ranks[:, i]``
    (compute, step), the replica gauges (running, waiting, KV-cache use) and the increments of the
    replica counters and histograms (one contiguous region of the value buffer), plus the rare sprinkled
    counter increments {i: [(counter, GPUs)]}. ``kv`` and ``lam`` are the plan's rows the draws depend
    on; ``state0`` the generator before the first step's draws (a world leaving the regime mid-way
    replays the draws it consumed from there)."""

    k0: int
    n: int
    state0: Mapping[str, Any]
    kv: np.ndarray
    lam: np.ndarray
    gpu: np.ndarray
    energy: np.ndarray
    drift: np.ndarray
    ranks: np.ndarray
    rep_gauges: np.ndarray
    rep_inc: np.ndarray
    sprinkles: dict[int, list[tuple[int, np.ndarray]]]


@dataclass(slots=True)
class QuietDraws:
    """The random draws of consecutive quiet steps, one row per step, in the generator's order: unit
    normals of the GPUs (7 rows) and racks, uniforms of the SM clocks, the sprinkles, the training job's
    common normals and the ranks' uniforms, then one run of normals (imbalance per node, step jitter per
    job, the replicas' 4 rows), the replicas' uniforms (2 rows), their Poisson counts (4 rows) and the rare
    preemption counts."""

    gpu_z: np.ndarray
    clock_u: np.ndarray
    sprinkles: dict[int, list[tuple[int, np.ndarray]]]
    common_z: np.ndarray
    dev_u: np.ndarray
    tail_z: np.ndarray
    rep_u: np.ndarray
    small: np.ndarray
    preempt: np.ndarray


class Scratch:
    """Named arrays the draw-ahead writes its blocks into, kept from one block to the next: memory fresh
    from the allocator costs several times more to write than memory just used (and on a busy machine
    the block's arrays would not stay in cache). A block's ``DrawnSteps`` holds views into them until the
    next block overwrites them; a copy of the simulator gets its own (``__getstate__`` leaves them out,
    so the views of a block in progress travel as arrays of their own)."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}

    def __call__(self, name: str, n: int, *shape: int, axis: int = 0) -> np.ndarray:
        """``n`` steps of array ``name``: steps along ``axis``, ``shape`` the other axes in order."""
        a = self._arrays.get(name)
        rest = a.shape[:axis] + a.shape[axis + 1:] if a is not None else None
        if a is None or rest != shape or a.shape[axis] < n:
            full = (*shape[:axis], max(n, DRAW_AHEAD), *shape[axis:])
            a = self._arrays[name] = np.empty(full)
        return a[(slice(None),) * axis + (slice(0, n),)]


def step_drawn(sim: Simulation) -> None:
    """A quiet step from the rows drawn ahead: its gauges copied into the buffer, its increments
    added to the counters there (which actions may have changed meanwhile: added, not copied)."""
    d = sim._drawn
    k = sim.k
    if d is None or k >= d.k0 + d.n:
        d = sim._drawn = draw_ahead(sim, k)
    i = k - d.k0
    gpu, ranks, rep_gauges, rep_counters = sim._fast_views
    if sim.xid_counts:
        np.copyto(gpu, d.gpu[:, i])
    else:
        # the GPU gauges go straight into the snapshot (telemetry.emit): the buffer's rows of them are only
        # ever written (each step, plain or drawn, writes them all), never read
        sim._gpu_rows = d.gpu[:, i]
    sim.energy += d.energy[i]
    if d.sprinkles and (hits := d.sprinkles.get(i)):
        counters = (sim.pcie, sim.sbe, sim.nvl[0])
        for c, gpus in hits:
            np.add.at(counters[c], gpus, 1.0)
    drift = d.drift[i]
    sim.temp_drift = drift[:sim._G]
    sim.rack_amb = drift[sim._G:]
    np.copyto(ranks, d.ranks[:, i])
    np.copyto(rep_gauges, d.rep_gauges[i])
    rep_counters += d.rep_inc[i]


def undraw(sim: Simulation) -> None:
    """Leave the quiet regime: put the generator where the consumed steps left it (replaying their
    draws from the first one's state) and forget the rest."""
    d = sim._drawn
    assert d is not None
    sim._drawn = None
    used = sim.k - d.k0  # steps k0 .. k - 1 are consumed; step k draws on its own
    if used < d.n:
        sim.rng.bit_generator.state = d.state0
        if used:
            _draws(sim, used, d.kv[:used], d.lam[:used], d.state0)
        sim._ahead = DRAW_FIRST


def _draws(sim: Simulation, n: int, kv: np.ndarray, lam: np.ndarray, state0: Mapping[str, Any]) -> QuietDraws:
    """The draws of ``n`` quiet steps (planned KV-cache use ``kv`` and capped Poisson means ``lam``,
    one row per step; ``state0``: the generator's state now): the calls ``plain_step.step_plain`` makes, in
    its order, except that consecutive normal draws are one call (numpy's Generator gives the same
    numbers for one call of n + m as for n then m: each value takes the next raw outputs, nothing is
    buffered between calls), and the three sprinkles' Poisson draws ride on the clocks' uniforms:
    three more uniforms, each at most its sprinkle's ``_sprinkle_zero``, are three zero counts, the
    same raw outputs consumed. Otherwise (a sprinkle hits, 1 step in 20 on 512 GPUs) the generator
    steps back over the three and draws the sprinkles as the plain step does; stepping back empties
    the generator's buffered half output (32-bit draws, the sprinkles' GPU picks), which is put back."""
    rng = sim.rng
    bg = rng.bit_generator
    assert isinstance(bg, np.random.PCG64)  # default_rng's: it can step back
    half = (state0["has_uint32"], state0["uinteger"])
    G, R, J, nr = sim._G, sim._R, sim._J, sim._nr
    tail = (sim.fleet.n_nodes if nr and sim._seq_imbalance else 0) + (J if nr else 0) + 4 * R
    ws = sim._scratch
    dr = QuietDraws(ws("gpu_z", n, 7 * G + len(sim.rack_amb)), ws("clock_u", n, G + 3), {}, ws("common_z", n, J if nr else 0),
                ws("dev_u", n, nr), ws("tail_z", n, tail), ws("rep_u", n, 2 * R), ws("small", n, 4 * R),
                ws("preempt", n, R))
    dr.preempt.fill(0.0)
    means = sim._sprinkle_means
    z0, z1, z2 = sim._sprinkle_zero
    hot = (kv.max(axis=1) > KV_SAFE).tolist() if R else []
    dt = sim.step_s
    normal, uniform, poisson = rng.standard_normal, rng.random, rng.poisson
    gpu_z, clock_u, common_z, dev_u, tail_z, rep_u = dr.gpu_z, dr.clock_u, dr.common_z, dr.dev_u, dr.tail_z, dr.rep_u
    counts: list[np.ndarray] = []
    for i in range(n):
        normal(out=gpu_z[i])
        u = clock_u[i]
        uniform(out=u)
        if u.item(G) > z0 or u.item(G + 1) > z1 or u.item(G + 2) > z2:
            bg.advance(-3)
            if half[0]:
                bg.state = {**bg.state, "has_uint32": half[0], "uinteger": half[1]}
            for c, mean in enumerate(means):
                hits = int(poisson(mean))
                if hits:
                    dr.sprinkles.setdefault(i, []).append((c, rng.integers(0, G, hits)))
                    now = bg.state
                    half = (now["has_uint32"], now["uinteger"])
        if nr:
            normal(out=common_z[i])
            uniform(out=dev_u[i])
        if tail:
            normal(out=tail_z[i])
        if R:
            uniform(out=rep_u[i])
            counts.append(poisson(lam[i]))
            if hot[i]:
                level = np.multiply(tail_z[i, tail - R:], K0_02)
                level = np.add(kv[i], level)
                np.maximum(level, K0, out=level)
                np.minimum(level, K1, out=level)
                if np.count_nonzero(np.greater(level, K0_9)):
                    dr.preempt[i] = poisson(np.maximum(0.0, level - 0.9) * 5.0 * dt)
    if counts:
        dr.small[...] = counts
    return dr


def _serving_cols(sim: Simulation, out: np.ndarray, w: np.ndarray, x: np.ndarray) -> None:
    """``out[:, g] = w[:, j] + x[:, g]`` for the serving GPUs g = serve_gpus[j] (steps on axis 0): by
    slices over runs of consecutive GPUs (a replica's GPUs are consecutive), or gathered."""
    runs = sim._serve_runs
    if runs is None:
        out[:, sim.serve_gpus] = w + x[:, sim.serve_gpus]
        return
    for lo, hi, j in runs:
        np.add(w[:, j:j + hi - lo], x[:, lo:hi], out=out[:, lo:hi])


def _add_rack_ambient(sim: Simulation, temp: np.ndarray, ambient: np.ndarray) -> None:
    """``temp[:, g] += ambient[:, rack of g]`` (steps on axis 0): one broadcast when the GPUs come in
    equal runs, rack after rack; else by slices over runs of one rack, or gathered."""
    runs = sim._rack_runs
    if runs is None:
        temp += ambient[:, sim.gpu_rack]
    elif sim._racks_uniform:
        by_rack = temp.reshape(len(temp), len(runs), -1)
        by_rack += ambient[:, :, None]
    else:
        for lo, hi, rack in runs:
            temp[:, lo:hi] += ambient[:, rack:rack + 1]


def draw_ahead(sim: Simulation, k: int) -> DrawnSteps:
    """Draw the quiet steps from ``k`` on (to the end of the shared plan, at most ``sim._ahead``) and
    compute what follows from the draws and the plan for all of them at once: ``plain_step.step_plain``'s
    arithmetic, operation for operation, along a leading axis of steps (numpy's element-wise
    functions, exp included, give each element the same bits whatever the array: tested). Only the
    recurrences (slow drift, rack ambient) go step by step."""
    plan, i0 = shared_plan(sim, k)
    n = min(sim._ahead, DRAW_AHEAD, len(plan.med) - i0)
    sim._ahead = min(2 * sim._ahead, DRAW_AHEAD)
    rows = slice(i0, i0 + n)
    kv, lam = plan.kv[rows], plan.lam[rows].reshape(n, -1)
    state0 = sim.rng.bit_generator.state
    dr = _draws(sim, n, kv, lam, state0)
    G, R, J, nr = sim._G, sim._R, sim._J, sim._nr
    v = sim._v
    # what the plain step rewrites every step and nothing else writes: the same for all these steps
    v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].fill(0.0)
    sim.job_hang_since.fill(np.nan)
    for h, hist in ((TTFT, sim.ttft_b), (ITL, sim.itl_b)):
        v[h + "_count"][...] = hist[:, -1]  # from here on advanced with the +Inf bucket

    # GPUs. Each row of unit normals is scaled into one contiguous (steps, GPUs) scratch just before
    # its use (numpy is several times slower on strided views of large arrays, and the scratch stays
    # in cache); slow drift and rack ambient are one AR(1) state (GPUs, then racks), each step from the
    # last; the gauges are contiguous (steps, GPUs) rows of ``gpu``.
    ws = sim._scratch
    gz = dr.gpu_z
    rows_z = gz[:, :7 * G].reshape(n, 7, G)
    scale = sim._noise_scale[:, 0].tolist()
    noise = ws("noise", n, G)

    def scaled(r: int) -> np.ndarray:
        return np.multiply(rows_z[:, r], scale[r], out=noise)

    innov = gz[:, 6 * G:]
    innov *= sim._gpu_z_scale[6 * G:]
    state = ws("state", n, G + len(sim.rack_amb))
    prev = np.concatenate((sim.temp_drift, sim.rack_amb))  # (they may be views of the state rows)
    coef = sim._ar_coef
    for i in range(n):
        cur = np.multiply(prev, coef, out=state[i])
        cur += innov[i]
        prev = cur
    days = [(sim.start + kk * sim.step_s - sim.start) / 86400.0 for kk in range(k, k + n)]
    ambient = state[:, G:] + np.array([1.0 * math.sin(2 * math.pi * (day - 0.6)) for day in days])[:, None]
    # gain * load + offset + static: the base rows for every GPU, then the serving GPUs' own
    # (the plan is read only: a step that leaves the regime may still use its later rows)
    w_base, w = sim._w_base, plan.w_serve[rows]
    gpu = ws("gpu", n, 9, G, axis=1)
    temp = np.add(w_base[0], state[:, :G], out=ws("temp", n, G))
    _serving_cols(sim, temp, w[:, 0], state[:, :G])
    _add_rack_ambient(sim, temp, ambient)
    temp += scaled(0)
    np.rint(temp, out=gpu[0])
    mem_temp = np.add(temp, K6, out=ws("mem_temp", n, G))
    mem_temp += scaled(5)
    np.rint(mem_temp, out=gpu[1])
    clock = np.subtract(dr.clock_u[:, :G], K0_5, out=gpu[2])
    clock *= K38
    clock += K1935
    np.rint(clock, out=clock)
    gpu[3] = sim.mem_clock  # nothing changes it (no fault, no action): copied back as it is
    for r, out in ((2, 4), (3, 5), (4, 7)):
        x = scaled(r)
        np.add(w_base[r], x, out=gpu[out])
        _serving_cols(sim, gpu[out], w[:, r], x)
    power, util, fb = gpu[4], gpu[5], gpu[7]
    np.rint(util, out=util)
    np.maximum(util, K0, out=util)
    np.minimum(util, K100, out=util)
    copy_util = np.multiply(util, K0_4, out=gpu[6])
    np.rint(copy_util, out=copy_util)
    np.rint(fb, out=fb)
    np.minimum(FB_USABLE, fb, out=fb)
    np.subtract(FB_USABLE, fb, out=gpu[8])
    energy = np.multiply(power, sim._ms_per_step, out=ws("energy", n, G))
    np.rint(energy, out=energy)

    # training: rank compute times and whole-step times
    ranks = ws("ranks", n, 2, nr, axis=1)
    off = 0
    if nr:
        rj = sim._rank_job
        common = dr.common_z
        common *= K0_01
        np.exp(common, out=common)
        dev = dr.dev_u
        dev -= K0_5
        dev *= sim._rank_noise2
        dev += sim.rank_static
        dev += K1
        comp = ranks[0]
        for j, (lo, hi) in enumerate(sim._job_spans):  # ranks are contiguous per job
            np.multiply(common[:, j:j + 1], sim.rank_base[lo:hi], out=comp[:, lo:hi])
        comp *= dev
        if sim._seq_imbalance:
            N = sim.fleet.n_nodes
            sig = sim.job_sigma[rj]
            comp *= np.exp(sig * dr.tail_z[:, :N][:, sim.node_of_rank] - 0.5 * sig * sig)
            off = N
        step_max = np.maximum.reduceat(comp, sim.job_rank_start, axis=1)
        jitter = np.multiply(dr.tail_z[:, off:off + J], K0_02)
        jitter += K1
        jitter *= sim.job_comm
        step = np.add(step_max, jitter, out=jitter)
        for j, (lo, hi) in enumerate(sim._job_spans):
            ranks[1][:, lo:hi] = step[:, j:j + 1]
        off += J

    # serving: gauges, then the increments of the counters and histograms in buffer order
    rep_gauges = ws("rep_gauges", n, 3, R)
    rep_inc = ws("rep_inc", n, sim._fast_views[3].size)
    if R:
        z = dr.tail_z[:, off:off + 4 * R].reshape(n, 4, R)
        u = dr.rep_u.reshape(n, 2, R)
        small = dr.small.reshape(n, 4, R)
        big = np.multiply(plan.sqrt_lam2[rows], z[:, :2])
        big += plan.lam2[rows]
        np.rint(big, out=big)
        np.maximum(big, K0, out=big)
        counts = np.where(plan.lam2_big[rows], big, small[:, ::3])
        n_req = counts[:, 0]
        rep_gauges[:, 0] = counts[:, 1]
        rep_gauges[:, 1] = small[:, 2]
        ctr = rep_inc[:, :7 * R].reshape(n, 7, R)
        errs = np.minimum(n_req, small[:, 1], out=ctr[:, 4])
        lam_tok = n_req * sim.rep_tokens
        n_tok = np.sqrt(lam_tok)
        n_tok *= z[:, 2]
        n_tok += lam_tok
        np.rint(n_tok, out=n_tok)
        np.maximum(n_tok, K0, out=n_tok)
        med = plan.med[rows]
        cdf_rows = plan.cdf_rows[rows]
        assert sim._cdf_tab is not None
        o = 7 * R
        for j, cnt, u_h, mean in ((0, n_req, u[:, 0], TTFT_MEAN), (1, n_tok, u[:, 1], ITL_MEAN)):
            tab = sim._cdf_tab[j]
            nb = tab.shape[1]
            cdf = tab.take(cdf_rows[:, j], axis=0, out=ws(f"cdf{j}", n, R, nb), mode="clip")
            cdf *= cnt[:, :, None]
            cdf += u_h[:, :, None]
            hist = np.floor(cdf, out=rep_inc[:, o:o + R * nb].reshape(n, R, nb))
            hist[:, :, -1] = cnt
            o += R * nb
            total = np.multiply(cnt, med[:, j], out=rep_inc[:, o:o + R])
            total *= mean
            rep_inc[:, o + R:o + 2 * R] = cnt  # the count: the +Inf bucket's increment
            o += 2 * R
        ok = n_req - errs
        stop = np.multiply(ok, K0_85, out=ctr[:, 5])
        stop += u[:, 0]
        np.floor(stop, out=stop)
        np.subtract(ok, stop, out=ctr[:, 6])
        ctr[:, 3] = n_req
        np.add(n_tok, n_req, out=ctr[:, 1])
        prompt = np.multiply(n_req, sim.rep_prompt, out=ctr[:, 2])
        np.rint(prompt, out=prompt)
        noise_kv = np.multiply(z[:, 3], K0_02)
        level = np.add(kv, noise_kv, out=rep_gauges[:, 2])
        np.maximum(level, K0, out=level)
        np.minimum(level, K1, out=level)
        ctr[:, 0] = dr.preempt
    return DrawnSteps(k, n, state0, kv, lam, gpu, energy, state, ranks, rep_gauges, rep_inc, dr.sprinkles)

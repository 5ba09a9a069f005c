"""Chronic slowness priced against a swap, and the counter fast path: pure helpers the decider calls.

Theory of operation
-------------------
Fast path. A counter ramp read over a short and a long window (``short_window_s``) that scores 0 raises
the flag ``floor:<signal>`` on its GPU (``score.signals``); ``at_floor`` tells the decider whether a
node's flags carry one, and the lifecycle then quarantines after ``lifecycle.floor_dwell_s`` instead of
the degraded-then-quarantine dwell chain.

Chronic slowness (issue 16 item 3). A synchronous job runs at the pace of its slowest rank, so a node
whose ranks compute ``s`` (relative) slower than their peers' median costs the job ``job GPUs x s``
GPU-hours per hour. Swapping the node out costs about one checkpoint restart
(``chronic.swap_cost_gpu_hours``). The loss over ``chronic.horizon_s`` against that cost is the price;
the evidence that the node really is slow is one of two documented methods:

* **combined z** (Stouffer): the performance peer signals' robust z of one GPU (positive = worse; SM
  clock, rank compute time), summed and divided by the square root of their number. Signals deviating
  in the same direction add up: SM clock z 5 and rank compute z 3.3 combine to 5.9, past
  ``chronic.combined_z`` (5), where each alone sits on its ramp (the node scores ~0.56);
* **one-sided CUSUM** of the node's combined z over time: ``S <- max(0, S + (min(z, cap) - k) * dt)`` in
  z-hours (``chronic.cusum_k``, the allowance: healthy GPUs read z 0 inside ``min_rel_dev``; the cap,
  ``chronic.cusum_cap``, keeps one wild reading from alarming: it is a detector of small shifts),
  alarming at ``chronic.cusum_h``. A 1.5 % SM-clock drift (z ~2) that no threshold sees alarms after a few hours.
  The accumulator is state: it lives in the node's lifecycle timers (key ``chronic_cusum``: ``accum_s``
  holds S, ``last_ts`` the time it was last fed), which the caller keeps and stores.

Decisions (lifecycle conditions, no dwell: the evidence has its own), only where the score alone
decides nothing: ``chronic_cost`` (DEGRADED -> QUARANTINED, score still at or above
``quarantine_below``) when there is evidence (combined z or CUSUM) and the loss over the horizon is at
least the swap cost; ``chronic_drift`` (READY -> DEGRADED, score at or above ``degraded_below``) when
the CUSUM alarms and the loss is at least the swap cost. Without a rank compute time (no synchronous job to price) nothing escalates. The estimate goes into
the transition's intents (params ``chronic``) and a page, and ``explain`` prints it.

A swap that does not pay (a small job) is no reason for silence. A DEGRADED node is priced whatever its
job's size (``Evidence.pays`` False), and one that has shown evidence (combined z or CUSUM alarm) for
``chronic.ticket_after_s`` in DEGRADED (timer ``chronic_slow``: accumulates while the evidence holds,
pauses while it does not) gets ONE ticket-severity incident (``ticket``, key ``chronic:<node>``) naming
the node, its GPU-hours lost a day, the swap cost and why it is not swapped; it is updated when the
rounded loss or the plan changes and resolved when the node leaves DEGRADED (recovered, or taken out).
Once ticketed, a node whose job has ended (``idle``) is quarantined for its active test
(``chronic_cost``, reason ``chronic:idle``) before new work lands on it (``chronic.quarantine_when_idle``);
its ticket says so instead of a page. "Its job has ended" is positive evidence, never missing data
(``idle_evidence``): no rank reports a compute time on it AND every one of its GPUs reads
``chronic.idle_signal`` (utilisation) fresh and below ``chronic.idle_util_below``, with its confidence
usable and no source error this cycle, for ``chronic.idle_dwell_s`` without a break (timer
``chronic_idle``; a cycle without that evidence drops it). A dead rank-timer endpoint or a Prometheus
gap while the job runs leaves the GPUs busy: no ``chronic:idle``. Without that it would
read as recovered when idle, take new work and be slow again: DEGRADED had no way out but recovery.

``node_evidence`` reads the engine's columns (numpy over all GPUs, one reduction per node; first one max
per performance signal, and nothing more when even their sum cannot pass the allowance); the per-node
work that follows runs only for nodes with positive evidence, and, for the ticket, for the DEGRADED ones
among them (the decider's look-up, one per candidate node) and the ticketed ones (``watch``): a healthy
fleet pays nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleethealth.decide.lifecycle import Cond, Observation, Timer
from fleethealth.decide.model import State
from fleethealth.decide.tuples import LabelMemo, _labels_at
from fleethealth.policy import Policy

FLOOR_PREFIX = "floor:"
CUSUM_KEY = "chronic_cusum"
SLOW_KEY = "chronic_slow"  # lifecycle timer: how long a DEGRADED node has shown chronic evidence
IDLE_KEY = "chronic_idle"  # lifecycle timer: how long a ticketed node has shown positive idle evidence
TICKET_PREFIX = "chronic:"  # incident key of a node's ticket: chronic:<node>
TICKET_REASON = "chronic:ticket"
IDLE_REASON = "chronic:idle"
SLOWDOWN_SIGNAL_SHAPE = "peer"


def at_floor(*flag_sets: Iterable[str] | None) -> bool:
    """Whether any of the flag sets names a counter at its critical rate on both windows."""
    # (called for every entity every cycle, and the sets are nearly always empty: plain loops, no generator)
    for fs in flag_sets:
        if fs:
            for f in fs:
                if f.startswith(FLOOR_PREFIX):
                    return True
    return False


@dataclass(frozen=True, slots=True)
class Evidence:
    """One node's chronic-slowness evidence and price this cycle."""

    combined_z: float  # of its worst GPU (Stouffer over the performance peer signals)
    z: Mapping[str, float]  # that GPU's z per performance signal
    gpu: str  # that GPU
    slowdown: float | None  # relative, its slowest rank against its peers' median (None: no rank timer)
    job: str | None
    job_gpus: int
    pays: bool = True  # its loss over the horizon is at least the swap cost
    # positive evidence this cycle that its job has ended (``idle_evidence``): no rank reports a compute
    # time on it AND its GPUs' own telemetry, fresh and confident, shows no work. Missing rank data
    # alone is not idleness (a dead rank-timer endpoint, a Prometheus gap while the job still runs).
    idle: bool = False

    def loss_gpu_h_per_h(self) -> float | None:
        if self.slowdown is None or self.job_gpus <= 0:
            return None
        return self.job_gpus * max(0.0, self.slowdown)


def node_evidence(health: Any, policy: Policy, degraded: Callable[[str], bool] | None = None,
                  watch: Collection[str] = (), memo: LabelMemo | None = None,
                  kept: dict[str, Any] | None = None) -> dict[str, Evidence]:
    """Per node whose worst GPU's combined z is past the CUSUM allowance and whose slowest rank, in the
    biggest job, would cost more than a swap: its evidence (a READY node that cannot pay for a swap is
    never escalated, so its CUSUM is not fed). Also, priced or not (``pays`` False): such a node for
    which ``degraded(name)`` is true (the decider's DEGRADED nodes: their ticket, ``ticket``), and every
    node in ``watch`` (the ticketed ones, also below the allowance: is it idle yet?). ``health``: the
    engine's FleetHealth (anything else, e.g. a list of tuples, has no per-signal columns: no evidence).
    Without ``degraded`` and ``watch`` the work is what it was: healthy fleets pay nothing more.
    ``memo``: the decider's label memo (``decide.tuples``), so a GPU's job label is fetched once while the
    series are the same, not through the engine's whole label index every cycle a node is priced.
    ``kept``: a dict the caller holds (the decider's): which rows are the performance signals and the
    job sizes, kept while the engine's signal list and rank names are the same objects (answers, never
    state)."""
    ch = policy.chronic
    kinds = getattr(health, "kinds", None)
    if not ch.enabled or kinds is None or "gpu" not in kinds or "node" not in kinds:
        return {}
    ks = kinds["gpu"]
    if not getattr(ks, "names", None) or getattr(ks, "member_of", None) is None or not hasattr(ks, "results"):
        return {}  # a stand-in without the engine's columns
    perf = _perf_rows(ks.signals, ch, kept)
    if not perf:
        return {}
    if not watch and _below_allowance([ks.results[j].z for j in perf], ch.cusum_k):
        return {}  # a quiet fleet: no GPU's combined z can pass the allowance (one max per signal)
    zs = np.vstack([ks.results[j].z for j in perf])  # signals x GPUs, positive = worse
    have = np.isfinite(zs)
    n = have.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        comb = np.where(n > 0, np.where(have, zs, 0.0).sum(axis=0) / np.sqrt(np.maximum(n, 1)), np.nan)
    cand = np.flatnonzero(comb > ch.cusum_k)  # below the allowance nothing accumulates or escalates
    if cand.size == 0 and not watch:
        return {}
    rank_j = next((j for j, s in enumerate(ks.signals) if s.name == ch.slowdown_signal), None)
    # the peer shape leaves each entity's relative deviation from its group's median in ``rate``
    slow = ks.results[rank_j].rate if rank_j is not None else np.full(len(ks.names), np.nan)
    node_names = kinds["node"].names
    member = np.asarray(ks.member_of)
    best: dict[int, int] = {}  # node index -> its GPU with the highest combined z
    for i in cand[np.argsort(-comb[cand], kind="stable")].tolist():
        best.setdefault(int(member[i]), i)
    worst_slow = np.full(len(node_names), np.nan)
    ok = np.isfinite(slow) & (member >= 0)
    np.fmax.at(worst_slow, member[ok], slow[ok])
    # only a node that could pay for a swap in the biggest job is worth its labels (a Python step each)
    need = ch.swap_cost_gpu_hours * 3600.0 / ch.horizon_s  # GPU-hours an hour
    # no job is bigger than all the ranks together: a node that cannot pay even so is out before the
    # job sizes are counted (a pass over every rank's name)
    rk = kinds.get("rank")
    most = len(rk.names) if rk is not None and rk.names else 0
    priced = [n for n in best if n >= 0 and worst_slow[n] > 0 and worst_slow[n] * most >= need]
    # the DEGRADED (a dict look-up per candidate node, the loop above's order) and the watched: a handful
    extra = [] if degraded is None else [n for n in best if n >= 0 and degraded(node_names[n])]
    watched = set(_watched(watch, node_names, member, comb, best))
    extra += sorted(watched)
    sizes = _job_sizes(kinds, kept) if priced or extra else {}
    biggest = max(sizes.values(), default=0)
    out: dict[str, Evidence] = {}
    for node in priced + extra:
        name = node_names[node]
        if name in out or (node not in extra and not worst_slow[node] * biggest >= need):
            continue
        i = best[node]
        job = _label(health, ks, i, "job", memo)
        sd = float(worst_slow[node])
        slowdown = None if math.isnan(sd) else sd
        gpus = sizes.get(job, 0) if job else 0
        z_i = float(comb[i])
        out[name] = Evidence(
            z_i if math.isfinite(z_i) else 0.0, {ks.signals[j].name: float(ks.results[j].z[i]) for j in perf
                                                 if math.isfinite(float(ks.results[j].z[i]))},
            ks.names[i], slowdown, job, gpus,
            pays=slowdown is not None and gpus * max(0.0, slowdown) >= need,
            idle=node in watched and slowdown is None and idle_evidence(health, policy, node))
    return out


def _below_allowance(zs: list[np.ndarray], k: float) -> bool:
    """Whether no GPU's combined z (``node_evidence``: the sum of its finite z over the square root of
    their number, at least 1) can exceed ``k``: true when the signals' largest positive z, summed in the
    same order, do not (each GPU's sum is at most that sum; dividing by a root >= 1 never raises it).
    One NaN-skipping max per signal instead of the GPUs x signals arrays on most cycles of a quiet fleet."""
    bound = 0.0
    for z in zs:
        if z.size:
            m = float(np.fmax.reduce(z))  # NaN only when every GPU's z is
            if m > 0.0:
                bound += m
    return bound <= k


def idle_evidence(health: Any, policy: Policy, node: int) -> bool:
    """Whether node index ``node``'s own GPU telemetry shows this cycle that no work runs on it: every GPU
    of the node reads ``chronic.idle_signal`` fresh (a raw value: seen within its max age; read-only,
    never scored) with a raw value below ``chronic.idle_util_below``, the node's confidence is at least
    ``lifecycle.min_confidence`` and no source reported an error this cycle (what is unread might be the
    work). Missing, stale or doubtful data is never idleness. Called for the ticketed nodes only."""
    ch = policy.chronic
    if getattr(health, "issues", None):
        return False
    ks, nodes = health.kinds["gpu"], health.kinds["node"]
    j = next((k for k, s in enumerate(ks.signals) if s.name == ch.idle_signal), None)
    if j is None or not float(nodes.confidence[node]) >= policy.lifecycle.min_confidence:
        return False
    gpus = np.flatnonzero(np.asarray(ks.member_of) == node)
    if gpus.size == 0:
        return False
    res = ks.results[j]
    max_age = ks.signals[j].max_age_s or policy.freshness.max_age_s
    fresh = np.isfinite(res.raw[gpus]) & (res.age[gpus] <= max_age)  # (age NaN: never seen)
    return bool(fresh.all() and (res.raw[gpus] < ch.idle_util_below).all()
                and (np.asarray(ks.confidence)[gpus] >= policy.lifecycle.min_confidence).all())


def _watched(watch: Collection[str], node_names: Any, member: np.ndarray, comb: np.ndarray,
             best: dict[int, int]) -> list[int]:
    """The node indices of the watched nodes (each gets its GPU with the highest combined z into
    ``best``, in place, also below the allowance). A name look-up each: only ever a handful."""
    out: list[int] = []
    for name in watch:
        try:
            node = list(node_names).index(name) if not isinstance(node_names, list) else node_names.index(name)
        except ValueError:
            continue  # not scored this cycle
        if node not in best:
            gpus = np.flatnonzero(member == node)
            if gpus.size == 0:
                continue
            z = comb[gpus]
            best[node] = int(gpus[int(np.nanargmax(z))]) if np.isfinite(z).any() else int(gpus[0])
        out.append(node)
    return out


def _perf_rows(signals: list[Any], ch: Any, kept: dict[str, Any] | None) -> list[int]:
    """The rows of the performance peer signals (``chronic.categories``) among a kind's ``signals``."""
    hit = None if kept is None else kept.get("perf")
    if hit is not None and hit[0] is signals and hit[1] == len(signals) and hit[2] is ch:
        return hit[3]  # type: ignore[no-any-return]
    perf = [j for j, s in enumerate(signals) if s.shape == "peer" and s.category in ch.categories]
    if kept is not None:
        kept["perf"] = (signals, len(signals), ch, perf)
    return perf


def _job_sizes(kinds: Mapping[str, Any], kept: dict[str, Any] | None = None) -> dict[str, int]:
    """GPUs (ranks) per training job, from the rank entities (``job/rankN``); in ``kept`` while the rank
    names are the same list."""
    rk = kinds.get("rank")
    if rk is None or not rk.names:
        return {}
    hit = None if kept is None else kept.get("sizes")
    if hit is not None and hit[0] is rk.names and hit[1] == len(rk.names):
        return hit[2]  # type: ignore[no-any-return]
    jobs, counts = np.unique(np.array([n.rpartition("/")[0] for n in rk.names]), return_counts=True)
    sizes = dict(zip(jobs.tolist(), counts.tolist(), strict=True))
    if kept is not None:
        kept["sizes"] = (rk.names, len(rk.names), sizes)
    return sizes


def _label(health: Any, ks: Any, i: int, key: str, memo: LabelMemo | None) -> str | None:
    if getattr(health, "meta", None) is None:
        return None
    return _labels_at(health, ks, i, memo).get(key)


def feed_cusum(timers: dict[str, Timer], z: float | None, now: float, k: float) -> float:
    """One cycle of the node's one-sided CUSUM (in place in its lifecycle timers): S grows by (z - k)
    per hour since it was last fed and never below 0; an entry at 0 is dropped (a healthy node carries
    none). No z this cycle (nothing past the allowance) counts as z 0. Returns S (z-hours)."""
    t = timers.get(CUSUM_KEY)
    if t is None:
        if z is None or z <= k:
            return 0.0
        timers[CUSUM_KEY] = Timer(0.0, now)
        return 0.0
    if t.last_ts is not None and now > t.last_ts:
        t.accum_s = max(0.0, t.accum_s + ((z or 0.0) - k) * (now - t.last_ts) / 3600.0)
    t.last_ts = now
    if t.accum_s <= 0.0:
        del timers[CUSUM_KEY]
        return 0.0
    return t.accum_s


def conds(state: State, timers: dict[str, Timer], ev: Evidence | None, now: float, policy: Policy,
          obs: Observation | None) -> set[Cond]:
    """The chronic conditions that hold for a node this cycle (and the CUSUM fed, on usable data only).
    Only where the score alone would decide nothing: ``chronic_drift`` for a READY node at or above
    ``degraded_below``, ``chronic_cost`` for a DEGRADED one at or above ``quarantine_below`` (a node the
    score already takes down goes its usual way)."""
    ch, lc = policy.chronic, policy.lifecycle
    if not ch.enabled or state not in (State.READY, State.DEGRADED):
        return set()
    if obs is None or obs.value is None or not obs.usable(lc):
        t = timers.get(CUSUM_KEY)
        if t is not None:
            t.last_ts = None  # unknown data pauses the accumulator, as it pauses the dwell timers
        timers.pop(IDLE_KEY, None)  # ...and is never evidence of idleness: the idle dwell restarts
        return set()
    z = None if ev is None else min(ev.combined_z, ch.cusum_cap)
    s = feed_cusum(timers, z, now, ch.cusum_k)
    drift = s >= ch.cusum_h
    if state == State.DEGRADED:
        _feed_slow(timers, ev is not None and (drift or ev.combined_z >= ch.combined_z), now)
    if ev is None:
        timers.pop(IDLE_KEY, None)
        return set()
    idle_for = _feed_idle(timers, state == State.DEGRADED and ev.idle, now)
    if (state == State.DEGRADED and ev.idle and ch.quarantine_when_idle and ticketed(timers, policy)
            and obs.value >= lc.quarantine_below and idle_for >= ch.idle_dwell_s):
        return {Cond.CHRONIC_COST}  # its job has ended: out for its active test before new work lands
    loss = ev.loss_gpu_h_per_h()
    if loss is None or loss * ch.horizon_s / 3600.0 < ch.swap_cost_gpu_hours:
        return set()
    out: set[Cond] = set()
    if (state == State.DEGRADED and obs.value >= lc.quarantine_below
            and (drift or ev.combined_z >= ch.combined_z)):
        out.add(Cond.CHRONIC_COST)
    if state == State.READY and obs.value >= lc.degraded_below and drift:
        out.add(Cond.CHRONIC_DRIFT)
    return out


def _feed_idle(timers: dict[str, Timer], idle: bool, now: float) -> float:
    """How long a node has shown positive idle evidence without a break (seconds): a cycle without it
    (busy again, rank data back, or the evidence missing or doubtful) drops the timer, so the dwell
    restarts. Returns the time idle so far."""
    if not idle:
        timers.pop(IDLE_KEY, None)
        return 0.0
    t = timers.get(IDLE_KEY)
    if t is None:
        timers[IDLE_KEY] = Timer(0.0, now)
        return 0.0
    if t.last_ts is not None and now > t.last_ts:
        t.accum_s += now - t.last_ts
    t.last_ts = now
    return t.accum_s


def _feed_slow(timers: dict[str, Timer], slow: bool, now: float) -> None:
    """How long a DEGRADED node has shown chronic evidence (combined z or CUSUM alarm): accumulates while
    it does, pauses (kept) while it does not; dropped with the state's other timers when it leaves."""
    t = timers.get(SLOW_KEY)
    if not slow:
        if t is not None:
            t.last_ts = None
        return
    if t is None:
        timers[SLOW_KEY] = Timer(0.0, now)
        return
    if t.last_ts is not None and now > t.last_ts:
        t.accum_s += now - t.last_ts
    t.last_ts = now


def ticketed(timers: Mapping[str, Timer], policy: Policy) -> bool:
    """Slow for ``chronic.ticket_after_s`` in DEGRADED: its ticket is due (or open)."""
    after = policy.chronic.ticket_after_s
    t = timers.get(SLOW_KEY)
    return after is not None and t is not None and t.accum_s >= after


def when(ev: Evidence, policy: Policy) -> str:
    """When the node comes out: ``next_safe_point`` (the swap pays), ``now`` (idle: its job has ended),
    ``job_end`` (it does not pay: it is taken out when its job ends), ``not_swapped`` (policy keeps it)."""
    if ev.pays:
        return "next_safe_point"
    if not policy.chronic.quarantine_when_idle:
        return "not_swapped"
    return "now" if ev.idle else "job_end"


def estimate(ev: Evidence | None, timers: Mapping[str, Timer], policy: Policy) -> dict[str, Any]:
    """The price and evidence, for intents, pages and explain (full precision: JSON)."""
    if ev is None:
        return {}
    ch = policy.chronic
    loss = ev.loss_gpu_h_per_h()
    t = timers.get(CUSUM_KEY)
    slow = timers.get(SLOW_KEY)
    return {
        "gpu": ev.gpu, "combined_z": ev.combined_z, "z": dict(ev.z), "cusum_z_hours": 0.0 if t is None else t.accum_s,
        "slowdown": ev.slowdown, "job": ev.job, "job_gpus": ev.job_gpus, "loss_gpu_hours_per_hour": loss,
        "loss_gpu_hours_per_day": None if loss is None else loss * 24.0,
        "horizon_s": ch.horizon_s,
        "loss_over_horizon_gpu_hours": None if loss is None else loss * ch.horizon_s / 3600.0,
        "swap_cost_gpu_hours": ch.swap_cost_gpu_hours, "pays": ev.pays, "when": when(ev, policy),
        "slow_for_s": 0.0 if slow is None else slow.accum_s,
    }


def describe(est: Mapping[str, Any]) -> str:
    """The estimate in words for an operator (rounded)."""
    if not est:
        return "no chronic-slowness evidence"
    zs = ", ".join(f"{k} {v:.1f}" for k, v in sorted(est["z"].items()))
    head = f"combined z {est['combined_z']:.1f} ({zs}) on {est['gpu']}; CUSUM {est['cusum_z_hours']:.1f} z-hours"
    if est["loss_gpu_hours_per_hour"] is None:
        return head + "; no rank compute time: no job to price" + _then(est)
    return (f"{head}; {est['slowdown']:.1%} slower than its peers in {est['job']} ({est['job_gpus']} GPUs): "
            f"{est['loss_gpu_hours_per_hour']:.1f} GPU-h per hour, {est['loss_over_horizon_gpu_hours']:.0f} GPU-h "
            f"over {est['horizon_s'] / 3600:.0f} h against {est['swap_cost_gpu_hours']:.0f} GPU-h for a swap"
            + _then(est))


_WHEN_WORDS = {
    "job_end": "the swap does not pay: not swapped; taken out for an active test when its job ends",
    "now": "its job has ended: taken out for an active test now",
    "not_swapped": "the swap does not pay: not swapped, stays DEGRADED (no new work) until it recovers",
}


def _then(est: Mapping[str, Any]) -> str:
    words = _WHEN_WORDS.get(str(est.get("when")))
    return "" if words is None else "; " + words


def ticket(entity: str, state: State, timers: Mapping[str, Timer], ev: Evidence | None,
           policy: Policy, open_incidents: Mapping[str, Mapping[str, Any]] | None = None,
           ) -> tuple[str, dict[str, Any] | None, Any] | None:
    """A DEGRADED node's chronic-slowness ticket this cycle, or None when none is due (or open): its
    incident key and, when there is evidence to say (else None: an open ticket is only kept open), the
    params of its ticket-severity PAGE and their signature (``_loss_sig``: an update when the daily loss
    moves by half or more from what the ticket says, or the plan changes; ``open_incidents``: the
    state's, where the open ticket's signature is). Due when the node has been slow for
    ``chronic.ticket_after_s`` in DEGRADED and the swap does not pay (a node that pays is quarantined by
    ``chronic_cost``; a vetoed one has the veto's page). A node that leaves DEGRADED (recovered,
    swapped) is no longer asserted: its ticket resolves (decide.incidents)."""
    key = TICKET_PREFIX + entity
    if state != State.DEGRADED or not ticketed(timers, policy):
        return None
    if ev is None or ev.pays:
        return key, None, None
    est = estimate(ev, timers, policy)
    per_day = est["loss_gpu_hours_per_day"]
    rec = (open_incidents or {}).get(key)
    said = rec.get("sig") if rec is not None else None
    sig = [_loss_sig(per_day, said[0] if isinstance(said, list) and said else None), est["when"]]
    return key, {
        "severity": "ticket", "node": entity, "loss_gpu_hours_per_day": per_day,
        "swap_cost_gpu_hours": est["swap_cost_gpu_hours"], "when": est["when"], "chronic": est,
        "summary": f"{entity} chronically slow for {est['slow_for_s'] / 3600:.1f} h: " + describe(est),
    }, sig


def _loss_sig(per_day: float | None, said: Any) -> float | None:
    """The daily loss a ticket's signature holds (two significant digits): what it already says while
    the new estimate is within a factor 1.5 of it (a noisy estimate is no news), else the new one."""
    if per_day is None:
        return None
    if isinstance(said, int | float) and said > 0 and 1 / 1.5 < per_day / said < 1.5:
        return float(said)
    return float(f"{per_day:.2g}")


CONDS = frozenset({Cond.CHRONIC_COST, Cond.CHRONIC_DRIFT})


def on_transition(cond: Cond, entity: str, timers: Mapping[str, Timer], evidence: Mapping[str, Evidence],
                  policy: Policy) -> tuple[str, dict[str, Any]] | None:
    """For a chronic transition (before its timers are reset): its reason (``chronic:cost``,
    ``chronic:drift``) and the estimate its intents and page carry; None for any other."""
    if cond not in CONDS:
        return None
    ev = evidence.get(entity)
    est = estimate(ev, timers, policy)
    reason = "chronic:cost" if cond == Cond.CHRONIC_COST else "chronic:drift"
    if cond == Cond.CHRONIC_COST and ev is not None and ev.idle:
        reason = IDLE_REASON  # ticketed, and its job has ended (conds)
    return reason, {**est, "summary": describe(est)}

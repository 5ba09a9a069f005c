"""Fleet KPIs beside the health score: what the fleet delivered, per pool, over a period.

Theory of operation
-------------------
A health score alone gets gamed (a controller that never isolates anything scores its fleet well), so the
figures an operator compares before and after an upgrade are outcomes, computed here from what the
controller recorded: its lifecycle transitions and intents (rows as ``StateStore.transitions()`` /
``intents()`` and ``Transition.to_dict()`` give them), plus two measurements the caller takes because only
it sees every cycle: how long each node's health was unknown, and how much of the serving time met the SLO.
Everything is pure: rows, the period and those measurements come in, ``PoolKpis`` per pool come out.

Definitions (per pool; the same words in the fleet view, the backtest report and the metrics' HELP):

* **GPU-hours**: the pool's node GPUs times the period.
* **GPU-hours lost** (printed "node GPU-hours lost"; not a backtest's job slowdown, backtest.metrics), each
  hour counted once, in this order: *isolated* (a node in DRAINING, QUARANTINED, RECOVERING or FAILED: out
  of work), *unknown* (health unknown while not isolated: nobody can tell if its work is right), *slow*
  (DEGRADED while neither: a synchronous job runs at its slowest rank's pace).
* **training goodput**: 1 - lost / GPU-hours, the share of GPU time that did useful work.
* **serving SLO attainment**: the share of replica time (replicas with known SLO signals) in which every
  SLO signal of the replica was within its error budget on every burn-rate window; None without replicas.
* **live quarantine precision** and the outcome of each quarantine: ``review.incidents`` (confirmed by an
  active test, a hard gate, FAILED or a label).
* **time to detect** and **time to repair**: from the fault's start to the first isolation (DRAINING or
  QUARANTINED) and to READY again (open incidents are not counted). The fault's start is the onset an
  operator labelled, else (a backtest) the ground truth's onset, else the incident's first bad transition.
  An onset belongs to the first incident after it: a node released and isolated again for the same fault
  counts its next incident from that incident's own first bad transition.
* **flap rate**: returns to the state just left within the flap window, per node or replica per day.

``compare`` puts two summaries side by side (a backtest JSON before and after a policy change, or two time
ranges of one store) and says per figure whether it got better or worse.

A store knows nothing before its first record: ``clamp_to_records`` cuts a period's start to it, and a period
entirely before it has no figures at all (``no_records``: every figure None, ``compare`` says "no records"),
never the perfect figures of an empty period.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from fleethealth.decide.incidents import is_new_page, is_ticket
from fleethealth.review.incidents import build_incidents, count_flaps, figures

ISOLATED_STATES = frozenset({"DRAINING", "QUARANTINED", "RECOVERING", "FAILED"})
SLOW_STATES = frozenset({"DEGRADED"})
DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class EntityInfo:
    """What the KPIs need to know of one node or replica: its kind, pool, GPUs (nodes) and its state at the
    end of the period (used when it made no transition in it)."""

    kind: str
    pool: str
    gpus: int = 0
    state: str = "READY"


@dataclass(frozen=True, slots=True)
class PoolKpis:
    pool: str
    nodes: int
    replicas: int
    gpus: int
    period_s: float
    gpu_hours: float
    lost_isolated_gpu_h: float
    lost_unknown_gpu_h: float
    lost_slow_gpu_h: float
    goodput: float | None  # None: no GPUs in the pool
    slo_attainment: float | None  # None: no replica with known SLO signals
    incidents: int
    quarantines: int
    confirmed: int
    precision: float | None
    detect_median_s: float | None
    repair_median_s: float | None
    flaps: int
    flaps_per_entity_day: float
    pages: int
    health_mean: float | None = None  # mean known node health at the end (or over the run, as given)
    tickets: int = 0  # new tickets (severity "ticket": a chronic node's, a job's), not counted in pages
    outcomes: dict[str, int] = field(default_factory=dict)  # quarantines per outcome (review.incidents.OUTCOMES)

    @property
    def lost_gpu_h(self) -> float:
        return self.lost_isolated_gpu_h + self.lost_unknown_gpu_h + self.lost_slow_gpu_h

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lost_gpu_h": self.lost_gpu_h}


# Direction of each figure compare() judges: +1 higher is better, -1 lower is better.
DIRECTION: dict[str, int] = {
    "goodput": 1, "slo_attainment": 1, "precision": 1, "health_mean": 1, "lost_gpu_h": -1,
    "lost_isolated_gpu_h": -1, "lost_unknown_gpu_h": -1, "lost_slow_gpu_h": -1, "detect_median_s": -1,
    "repair_median_s": -1, "flaps_per_entity_day": -1, "pages": -1,
}
LABELS: dict[str, str] = {
    "goodput": "GPU goodput", "slo_attainment": "serving SLO attainment", "precision": "quarantine precision",
    "health_mean": "mean node health", "lost_gpu_h": "node GPU-hours lost", "lost_isolated_gpu_h": "  to isolated nodes",
    "lost_unknown_gpu_h": "  to unknown nodes", "lost_slow_gpu_h": "  to slow nodes",
    "detect_median_s": "time to detect (median)", "repair_median_s": "time to repair (median)",
    "flaps_per_entity_day": "flaps per entity-day", "pages": "pages", "tickets": "tickets", "quarantines": "quarantines",
    "incidents": "incidents",
}


def state_seconds(transitions: Iterable[Mapping[str, Any]], entities: Mapping[str, EntityInfo], start: float,
                  end: float) -> dict[str, dict[str, float]]:
    """Seconds each entity spent in each lifecycle state inside [start, end]. Before its first transition
    in the period an entity was in that transition's ``from`` state; with none up to the period's end, in
    the ``from`` state of its first later transition (a past period is not in today's state), else in the
    state ``entities`` gives."""
    rows: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in transitions:
        if str(r["entity"]) in entities:
            rows[str(r["entity"])].append(r)
    out: dict[str, dict[str, float]] = {}
    for name, info in entities.items():
        mine = sorted(rows.get(name, []), key=lambda r: float(r["ts"]))
        before = [r for r in mine if float(r["ts"]) < start]
        inside = [r for r in mine if start <= float(r["ts"]) <= end]
        later = [r for r in mine if float(r["ts"]) > end]
        if before:
            state = str(before[-1]["to"])
        elif inside:
            state = str(inside[0]["from"])
        elif later:
            state = str(later[0]["from"])
        else:
            state = info.state
        acc: dict[str, float] = defaultdict(float)
        t = start
        for r in inside:
            ts = float(r["ts"])
            acc[state] += max(0.0, ts - t)
            t, state = ts, str(r["to"])
        acc[state] += max(0.0, end - t)
        out[name] = dict(acc)
    return out


def slo_met(sub: np.ndarray, slo_columns: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per entity (rows of ``sub``, entities x signals sub-scores, NaN unknown): whether any SLO signal is
    known, and whether every known one is within budget (sub-score 1: burn rate at most 1x on every
    window). Returns (known, met) boolean vectors."""
    if not len(slo_columns) or sub.size == 0:
        z = np.zeros(sub.shape[0], bool)
        return z, z
    s = sub[:, list(slo_columns)]
    known = ~np.isnan(s)
    any_known = known.any(axis=1)
    within = np.where(known, s >= 1.0 - 1e-9, True).all(axis=1)
    return any_known, any_known & within


class SloSampler:
    """Serving SLO attainment over a run: fed each cycle's replica scores, it integrates replica-seconds
    with known SLO signals and those within budget, per pool. The caller holds it (one per run)."""

    def __init__(self, pool_of: Mapping[str, str]) -> None:
        self.pool_of = dict(pool_of)
        self.known_s: dict[str, float] = defaultdict(float)
        self.met_s: dict[str, float] = defaultdict(float)
        self._last: float | None = None

    def observe(self, now: float, health: Any) -> None:
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        ks = getattr(health, "kinds", {}).get("replica") if health is not None else None
        if ks is None or not ks.names or dt == 0.0:
            return
        cols = [j for j, s in enumerate(ks.signals) if s.shape == "slo"]
        known, met = slo_met(np.asarray(ks.sub, np.float64), cols)
        for i in np.nonzero(known)[0].tolist():
            pool = self.pool_of.get(ks.names[i], "default")
            self.known_s[pool] += dt
            if met[i]:
                self.met_s[pool] += dt

    def attainment(self) -> dict[str, float | None]:
        return {p: (self.met_s[p] / k if k > 0 else None) for p, k in self.known_s.items()}


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def pool_kpis(
    transitions: Sequence[Mapping[str, Any]],
    intents: Sequence[Mapping[str, Any]],
    entities: Mapping[str, EntityInfo],
    *,
    start: float,
    end: float,
    unknown_s: Mapping[str, float] | None = None,
    slo: Mapping[str, float | None] | None = None,
    health_mean: Mapping[str, float | None] | None = None,
    flap_window_s: float = 3600.0,
    onsets: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, PoolKpis]:
    """The KPIs of each pool over [start, end], and of the whole fleet under the key ``"all"``.

    ``unknown_s``: seconds each node's health was unknown in the period (the caller measured it).
    ``slo``: SLO attainment per pool (``SloSampler.attainment``); ``health_mean``: mean node health per pool.
    ``onsets``: when faults really began, per entity (a backtest's ground truth): an incident's detect and
    repair times then count from the latest onset before its first bad transition and after the entity's
    previous incident began (an operator's labelled onset still comes first), else from that transition.
    """
    unknown_s = unknown_s or {}
    slo = slo or {}
    health_mean = health_mean or {}
    period = max(0.0, end - start)
    spent = state_seconds(transitions, entities, start, end)
    pools = sorted({i.pool for i in entities.values()})
    pool_of = {n: i.pool for n, i in entities.items()}
    every = build_incidents(transitions, pool_of)
    incs = [i for i in every if start <= i.start <= end and i.entity in entities]
    # An onset belongs to the first incident after it: a node released and isolated again for the same fault
    # (an intermittent one) was detected when it first was, so its next incident counts from its own start,
    # not from an hour-old onset. Each incident takes the onsets after its entity's previous incident began.
    previous: dict[tuple[str, float], float] = {}
    seen: dict[str, float] = {}
    for i in sorted(every, key=lambda i: i.start):
        previous[(i.entity, i.start)] = seen.get(i.entity, float("-inf"))
        seen[i.entity] = i.start
    flaps = count_flaps([t for t in transitions if start <= float(t["ts"]) <= end], flap_window_s)
    pages_by_entity: dict[str, int] = defaultdict(int)
    tickets_by_entity: dict[str, int] = defaultdict(int)
    for it in intents:
        if start <= float(it["ts"]) <= end and str(it.get("intent", it.get("kind"))) == "page":
            params = dict(it.get("params") or {})
            if is_new_page(params):
                # a ticket wakes nobody: counted apart from the pages
                (tickets_by_entity if is_ticket(params) else pages_by_entity)[str(it["entity"])] += 1

    def onset_of(i: Any) -> float:
        if i.label is not None and i.label.onset is not None:
            return float(i.label.onset)
        after = previous.get((i.entity, i.start), float("-inf"))
        before = [o for o in (onsets or {}).get(i.entity, ()) if after < o <= i.start]
        return max(before) if before else float(i.start)

    def build(name: str, ordered: list[str]) -> PoolKpis:
        # Members in ``entities``' order, never a set's: the lost hours are float sums, and a set of strings
        # iterates in an order PYTHONHASHSEED picks, so the same run's figures changed in their last digits.
        members = set(ordered)
        nodes = [n for n in ordered if entities[n].kind == "node"]
        reps = [n for n in ordered if entities[n].kind == "replica"]
        gpus = sum(entities[n].gpus for n in nodes)
        iso = unk = slow = 0.0
        for n in nodes:
            s = spent.get(n, {})
            g = entities[n].gpus
            i_s = sum(v for k, v in s.items() if k in ISOLATED_STATES)
            u_s = min(float(unknown_s.get(n, 0.0)), max(0.0, period - i_s))
            sl_s = min(sum(v for k, v in s.items() if k in SLOW_STATES), max(0.0, period - i_s - u_s))
            iso += g * i_s / 3600.0
            unk += g * u_s / 3600.0
            slow += g * sl_s / 3600.0
        gpu_h = gpus * period / 3600.0
        mine = [i for i in incs if i.entity in members]
        fig = figures(mine)
        detect = [max(0.0, i.isolated_at - onset_of(i)) for i in mine if i.isolated_at is not None]
        repair = [i.end - onset_of(i) for i in mine if i.end is not None]
        n_flaps = sum(v for e, v in flaps.items() if e in members)
        ent_days = max(len(nodes) + len(reps), 1) * max(period, 1e-9) / DAY_S
        if name == "all":
            known = {p: v for p, v in slo.items() if v is not None}
            att = None if not known else float(np.mean(list(known.values())))
            hm_vals = [v for v in health_mean.values() if v is not None]
            hm = None if not hm_vals else float(np.mean(hm_vals))
        else:
            att, hm = slo.get(name), health_mean.get(name)
        return PoolKpis(
            pool=name, nodes=len(nodes), replicas=len(reps), gpus=gpus, period_s=period, gpu_hours=gpu_h,
            lost_isolated_gpu_h=iso, lost_unknown_gpu_h=unk, lost_slow_gpu_h=slow,
            goodput=None if gpu_h <= 0 else max(0.0, 1.0 - (iso + unk + slow) / gpu_h), slo_attainment=att,
            incidents=len(mine), quarantines=fig.quarantines, confirmed=fig.outcomes.get("confirmed", 0),
            precision=fig.precision, detect_median_s=_median(detect), repair_median_s=_median(repair),
            flaps=n_flaps, flaps_per_entity_day=n_flaps / ent_days,
            pages=sum(v for e, v in pages_by_entity.items() if e in members), health_mean=hm,
            tickets=sum(v for e, v in tickets_by_entity.items() if e in members),
            outcomes=dict(fig.outcomes),
        )

    out = {p: build(p, [n for n, i in entities.items() if i.pool == p]) for p in pools}
    out["all"] = build("all", list(entities))
    return out


def clamp_to_records(start: float, end: float, first_record: float) -> tuple[float, float, bool] | None:
    """The part of [start, end] a store can speak for, given its first record: (start, end, clamped) with the
    start moved up to ``first_record`` if it was earlier (``clamped``), or None when the whole period is
    before it."""
    if end <= first_record:
        return None
    return (first_record, end, True) if start < first_record else (start, end, False)


def no_records(pools: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The figures of a period with no records: every judged figure unknown, marked ``no_records``."""
    return {p: {"pool": p, "no_records": True, **{k: None for k in DIRECTION}} for p in pools}


def compare(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
            tolerance: float = 0.005) -> list[dict[str, Any]]:
    """Per pool present in both and per judged figure: before, after, change and a verdict (``better``,
    ``worse``, ``same``, ``no records`` when either side is a period with none (``no_records``), or ``n/a``
    when either side has no value). ``tolerance``: relative change below which a figure reads ``same``."""
    rows: list[dict[str, Any]] = []
    for pool in sorted(set(before) & set(after), key=lambda p: (p == "all", p)):
        a, b = before[pool], after[pool]
        for key, sign in DIRECTION.items():
            x, y = a.get(key), b.get(key)
            if a.get("no_records") or b.get("no_records"):
                verdict, delta = "no records", None
            elif x is None or y is None:
                verdict, delta = "n/a", None
            else:
                delta = float(y) - float(x)
                scale = max(abs(float(x)), abs(float(y)), 1e-9)
                verdict = "same" if abs(delta) <= tolerance * scale else ("better" if delta * sign > 0 else "worse")
            rows.append({"pool": pool, "figure": key, "before": x, "after": y, "change": delta, "verdict": verdict})
    return rows


def fmt_value(key: str, v: Any) -> str:
    """One figure for people: shares as percentages, times as s/min/h, GPU-hours to one decimal."""
    if v is None:
        return "n/a"
    if key in ("goodput", "slo_attainment", "precision"):
        return f"{100 * float(v):.1f}%"
    if key.endswith("_s"):
        s = float(v)
        return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}min" if s < 7200 else f"{s / 3600:.1f}h"
    if key.endswith("gpu_h"):
        return f"{float(v):.1f}"
    if key == "health_mean":
        return f"{float(v):.2f}"
    if key == "flaps_per_entity_day":
        return f"{float(v):.3f}"
    return f"{float(v):g}" if isinstance(v, (int, float)) else str(v)


SUMMARY_COLUMNS = ("goodput", "lost_gpu_h", "slo_attainment", "precision", "quarantines", "detect_median_s",
                   "repair_median_s", "flaps_per_entity_day", "health_mean")


def summary_table(kpis: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    """Rows for people (header first): one per pool, then the whole fleet."""
    head = ["pool", "GPUs"] + [LABELS.get(c, c).strip() for c in SUMMARY_COLUMNS]
    rows = [head]
    for pool in sorted(kpis, key=lambda p: (p == "all", p)):
        k = kpis[pool]
        rows.append([pool if pool != "all" else "all pools", str(k.get("gpus", 0))]
                    + [fmt_value(c, k.get(c)) for c in SUMMARY_COLUMNS])
    return rows


def compare_table(rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    out = [["pool", "figure", "before", "after", "change", "verdict"]]
    for r in rows:
        key = str(r["figure"])
        ch = r["change"]
        if ch is None:
            change = ""
        elif key in ("goodput", "slo_attainment", "precision"):
            change = f"{100 * ch:+.1f} pt"
        else:
            change = ("+" if ch >= 0 else "-") + fmt_value(key, abs(ch))
        out.append([str(r["pool"]) if r["pool"] != "all" else "all pools", LABELS.get(key, key).strip(),
                    fmt_value(key, r["before"]), fmt_value(key, r["after"]), change, str(r["verdict"])])
    return out


def text_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in rows)

"""The backtest's result: the product's metrics at the top level (the JSON contract: ``precision``,
``recall``, ``detection_s``, ``removal_s``, ``quarantines``, ``false_quarantines``,
``flaps_per_node_day``, ``pages``), the same object per baseline, the per-incident outcomes, the
scenario's targets checked, and the fleet KPIs per pool (``kpis``: review.kpis, the same figures the
controller exports, so a backtest before and after a change compares with ``backtest --compare``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fleethealth.backtest.arms import PRODUCT, ArmLog
from fleethealth.backtest.metrics import ArmScore, score_arm
from fleethealth.backtest.runner import BacktestRun
from fleethealth.review.kpis import EntityInfo, pool_kpis

# Scenarios where nothing is faulty: any quarantine is a false one (issue 4's targets).
NO_QUARANTINE = frozenset({"exporter-outage", "rack-partition", "xid13-bad-kernel", "serving-build-regression",
                           "stage-imbalance", "noise-only", "frozen-exporter", "clock-skew"})


# Faults whose first sign is a fatal Xid (a hard gate): removed within two scrape intervals.
HARD_GATE_FAULTS = frozenset({"xid79_off_bus", "ecc_dbe_remap_failure", "nvlink_errors"})


def score_all(run: BacktestRun) -> dict[str, ArmScore]:
    return {
        name: score_arm(log, run.truths, replica_node=run.replica_node, nodes=run.nodes, node_pool=run.node_pool,
                        start=run.start, end=run.end, policy=run.policy, slow=run.slow, step_s=run.step_s)
        for name, log in run.arms.items()
    }


def targets(run: BacktestRun, m: dict[str, Any], outcomes: list[Any]) -> dict[str, bool]:
    """The issue's targets that apply to this scenario, checked on one arm's metrics."""
    prec = m["precision"]  # None: nothing quarantined, so no quarantine was wrong
    out: dict[str, bool] = {"precision>=0.95": prec is None or prec >= 0.95, "recall>=0.95": m["recall"] >= 0.95}
    name = run.scenario.name
    if name in NO_QUARANTINE or not any(g.faulty for g in run.truths):
        out["no_quarantine"] = m["quarantines"] == 0
    if name == "noise-only":
        out["flaps<=0.1/node/day"] = m["flaps_per_node_day"] <= 0.1
    for g in m["groups"]:
        out[f"{g['group']}:budget_held"] = bool(g["budget_held"])
        out[f"{g['group']}:paged"] = bool(g["paged"])
    gates = [o for o in outcomes if o.incident.fault in HARD_GATE_FAULTS]
    if gates:
        out["hard_gate_removed<=2_scrapes"] = all(
            o.removal_s is not None and o.removal_s <= 2 * run.step_s for o in gates)
    return out


def _outcome_rows(score: ArmScore, start: float) -> list[dict[str, Any]]:
    rows = []
    for o in score.outcomes:
        i = o.incident
        rows.append({
            "fault": i.fault, "node": i.node, "entities": sorted(i.entities), "onset_s": round(i.onset - start, 1),
            "expected": i.expected, "faulty": i.faulty, "group": i.group, "action_ok": o.action_ok,
            "response_s": None if o.response_s is None else round(o.response_s, 1),
            "removal_s": None if o.removal_s is None else round(o.removal_s, 1), "first_response": o.how,
        })
    return rows


def _timeline_figures(run: BacktestRun) -> tuple[dict[str, float], dict[str, float | None]]:
    """From the product's per-cycle scores: seconds each node's health was unknown (a cycle's score holds
    until the next cycle), and the mean known node health per pool over the run."""
    tl = run.timeline
    if not tl.ts:
        return {}, {}
    m = tl.matrix()
    ts = np.asarray(tl.ts, np.float64)
    dt = np.diff(np.append(ts, run.end))
    cols = [k for k, n in enumerate(tl.names) if tl.kinds.get(n) == "node"]
    unknown = {tl.names[k]: float(dt[np.isnan(m[:, k])].sum()) for k in cols}
    health: dict[str, float | None] = {}
    for pool in sorted(set(run.node_pool.values())):
        mine = [k for k in cols if run.node_pool.get(tl.names[k]) == pool]
        vals = m[:, mine]
        known = vals[~np.isnan(vals)]
        health[pool] = float(known.mean()) if known.size else None
    return unknown, health


def fleet_kpis(run: BacktestRun, log: ArmLog, slo: Mapping[str, float | None] | None = None,
               with_timeline: bool = True) -> dict[str, dict[str, Any]]:
    """One arm's fleet KPIs per pool (review.kpis) over the run. ``slo``: the product's SLO attainment per
    pool (measured per cycle by the caller, ``review.kpis.SloSampler``); unknown time and mean health come
    from the product's timeline (``with_timeline``)."""
    gpn = run.gpus // max(len(run.nodes), 1)
    ents = {n: EntityInfo("node", run.node_pool.get(n, "default"), gpn) for n in run.nodes}
    ents |= {r: EntityInfo("replica", run.node_pool.get(n, "default")) for r, n in run.replica_node.items()}
    unknown, health = _timeline_figures(run) if with_timeline else ({}, {})
    onsets: dict[str, list[float]] = {}
    for g in run.truths:  # a GPU's fault is its node's; detect and repair count from the true onset
        if g.faulty:
            onsets.setdefault(g.entity.split("/")[0] if g.kind == "gpu" else g.entity, []).append(g.onset)
    k = pool_kpis([t.to_dict() for t in log.transitions], [i.to_dict() for i in log.intents], ents,
                  start=run.start, end=run.end, unknown_s=unknown, slo=slo, health_mean=health, onsets=onsets)
    return {p: v.to_dict() for p, v in k.items()}


def evaluate(run: BacktestRun, slo: Mapping[str, float | None] | None = None) -> dict[str, Any]:
    """``slo``: the product's serving SLO attainment per pool, if the caller sampled it."""
    scores = score_all(run)
    prod = scores[PRODUCT]
    out: dict[str, Any] = {
        "scenario": run.scenario.name,
        "policy_version": run.policy.version_tag,
        "gpus": run.gpus,
        "simulated_s": run.end - run.start,
        "step_s": run.step_s,
        "cycle_s": run.cycle_s,
        **prod.metrics,
        "targets": targets(run, prod.metrics, prod.outcomes),
        "kpis": fleet_kpis(run, run.arms[PRODUCT], slo),
        "incidents": _outcome_rows(prod, run.start),
        "false_quarantine_list": [{"ts_s": round(ts - run.start, 1), "entity": e, "why": w}
                                  for ts, e, w in prod.false_quarantines],
        "baselines": {},
        "closed_loop": run.closed_loop,
        "world_actions": run.world_actions.get(PRODUCT, 0),
        "worlds": run.worlds,
        "wall_s": round(run.wall_s, 2),
        "cpu_s": round(run.cpu_s, 2),
        "gpu_hours_per_cpu_s": round(run.gpus * (run.end - run.start) / 3600.0 / max(run.cpu_s, 1e-9), 1),
    }
    for name, sc in scores.items():
        if name == PRODUCT:
            continue
        out["baselines"][name] = {
            **sc.metrics,
            "world_actions": run.world_actions.get(name, 0),
            "targets": targets(run, sc.metrics, sc.outcomes),
            "kpis": fleet_kpis(run, run.arms[name], with_timeline=False),
            "incidents": _outcome_rows(sc, run.start),
            "false_quarantine_list": [{"ts_s": round(ts - run.start, 1), "entity": e, "why": w}
                                      for ts, e, w in sc.false_quarantines],
        }
    return out

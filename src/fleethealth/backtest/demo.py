"""`fleethealth demo`: a small simulated fleet with a scripted mix of faults through the full loop, with a
live terminal view. The scenario is embedded (it is the demo's script, not a fixture): 256 GPUs on 32
nodes, training and serving, three simulated hours, one fault of each family the seed warns about, spaced so that
the remediation budget (one quarantine per pool per hour here) is not what the demo is about, in an
order that reads like a shift: a hard gate, a slow thermal drift, a pending remap, a dead exporter, an
oversized request, a replica burning its SLO, an NVLink failure, a DBE with a failed remap.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleethealth.decide.model import IntentKind, State
from fleethealth.sim.scenario import Scenario, parse_scenario

DEMO_SCENARIO = """\
name: demo
description: "256 GPUs (training and serving), three hours, one fault of each kind the seed warns about"
seed: 42
duration: 3h
step: 15s
fleet:
  pools:
    - name: train-a
      nodes: 24
      workload: training
      jobs:
        - {name: pretrain-34b, pp: 4, compute_s: 1.82}
    - name: serve-a
      nodes: 8
      workload: serving
      serving: {model: llama3-70b, gpus_per_replica: 4, builds: [v0.6.3]}
faults:
  - {kind: xid79_off_bus, target: node-03/gpu5, onset: 15m}
  - {kind: row_remap_pending, target: node-07/gpu2, onset: 30m}
  - {kind: thermal_drift, target: node-11, onset: 40m, params: {ramp_s: 1800}}
  - {kind: exporter_outage, target: node-17, onset: 50m, end: 70m}
  - {kind: cuda_oom, target: "replica:llama3-70b-003", onset: 60m, params: {class: single_request, count: 2}}
  - {kind: replica_slo_burn, target: "replica:llama3-70b-010", onset: 90m}
  - {kind: nvlink_errors, target: node-21, onset: 145m}
  - {kind: ecc_dbe_remap_failure, target: node-30/gpu5, onset: 160m}
"""


def demo_scenario() -> Scenario:
    return parse_scenario(DEMO_SCENARIO, "demo")


def _hms(s: float) -> str:
    s = max(0.0, s)
    return f"{int(s // 3600):d}:{int(s % 3600 // 60):02d}:{int(s % 60):02d}"


@dataclass(slots=True)
class LiveState:
    """What the live view shows, updated once per decision cycle. Pure bookkeeping (no terminal I/O)."""

    start: float
    duration: float
    pool_sizes: dict[str, int]
    budget_fraction: float
    budget_min: int
    window_s: float
    now: float = 0.0
    cycles: int = 0
    states: Counter[str] = field(default_factory=Counter)
    unknown: int = 0
    mean_score: float | None = None
    low_conf: float = 0.0
    frozen: bool = False
    transitions: deque[tuple[float, str, str, str, str]] = field(default_factory=lambda: deque(maxlen=12))
    intents: deque[tuple[float, str, str, str]] = field(default_factory=lambda: deque(maxlen=10))
    intent_counts: Counter[str] = field(default_factory=Counter)
    budget_left: dict[str, int] = field(default_factory=dict)
    wall_start: float = field(default_factory=time.perf_counter)

    def update(self, now: float, res: Any) -> None:
        self.now = now
        self.cycles += 1
        st = res.decision.state
        self.frozen = bool(st.frozen)
        self.states = Counter(str(e.state) for e in st.entities.values())
        ks = getattr(res.health, "kinds", {}).get("node")
        if ks is not None and len(ks.names):
            vals = [v for v in ks.value.tolist() if not math.isnan(v)]
            self.unknown = len(ks.names) - len(vals)
            self.mean_score = sum(vals) / len(vals) if vals else None
            self.low_conf = float((ks.confidence < 0.5).mean())
        for t in res.decision.transitions:
            self.transitions.append((t.ts, t.entity, str(t.from_state), str(t.to_state), t.reason))
        for i in res.decision.intents:
            self.intent_counts[str(i.kind)] += 1
            if i.kind in (IntentKind.SET_WEIGHT, IntentKind.SET_CONDITION, IntentKind.CAPTURE_EVIDENCE):
                continue
            extra = f" w={i.params['weight']}" if "weight" in i.params else ""
            self.intents.append((i.ts, i.entity, str(i.kind) + (" (soft)" if i.soft else "") + extra, i.reason))
        for pool, size in self.pool_sizes.items():
            allowed = max(self.budget_min, math.floor(self.budget_fraction * size))
            spent = {e for ts, k, e in st.ledger if k.endswith(":" + pool) and now - ts < self.window_s}
            self.budget_left[pool] = allowed - len(spent)


def render_live(ls: LiveState, scenario: Scenario) -> Any:
    """The rich renderable of the live view."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    el = ls.now - ls.start
    frac = min(1.0, el / max(ls.duration, 1.0))
    bar = "#" * int(frac * 40) + "-" * (40 - int(frac * 40))
    wall = time.perf_counter() - ls.wall_start
    head = Text.assemble(
        (f"fleethealth demo - {scenario.name}", "bold"), f"   simulated {_hms(el)} / {_hms(ls.duration)} [{bar}]",
        f"   {el / max(wall, 1e-6):,.0f}x real time", ("   REMEDIATION FROZEN (telemetry)", "bold red")
        if ls.frozen else "")
    summ = Table.grid(padding=(0, 2))
    summ.add_row(
        Text("nodes+replicas by state: " + ", ".join(f"{k} {v}" for k, v in sorted(ls.states.items())), "cyan"),
        Text("mean node score " + ("-" if ls.mean_score is None else f"{ls.mean_score:.3f}")),
        Text(f"unknown {ls.unknown}", "yellow" if ls.unknown else ""),
        Text("budget left " + ", ".join(f"{p} {n}" for p, n in sorted(ls.budget_left.items())),
             "red" if any(n <= 0 for n in ls.budget_left.values()) else "green"),
    )
    tr = Table(title="state changes", expand=True, title_justify="left")
    for c in ("sim time", "entity", "from", "to", "reason"):
        tr.add_column(c, no_wrap=c != "reason")
    colour = {"QUARANTINED": "red", "FAILED": "magenta", "DEGRADED": "yellow", "READY": "green",
              "RECOVERING": "blue", "DRAINING": "dark_orange"}
    for ts, e, a, b, r in list(ls.transitions)[-8:]:
        tr.add_row(_hms(ts - ls.start), e, a, Text(b, colour.get(b, "")), r)
    it = Table(title="intents issued (" + ", ".join(f"{k} {v}" for k, v in ls.intent_counts.most_common(6)) + ")",
               expand=True, title_justify="left")
    for c in ("sim time", "entity", "intent", "reason"):
        it.add_column(c, no_wrap=c != "reason", overflow="ellipsis")
    for ts, e, k, r in list(ls.intents)[-8:]:
        it.add_row(_hms(ts - ls.start), e, k, r[:70])
    return Panel(Group(head, summ, tr, it), border_style="blue")


def plain_line(ls: LiveState, res: Any) -> list[str]:
    """--no-live: one line per transition and per remediation intent, for CI logs."""
    out = []
    for t in res.decision.transitions:
        out.append(f"{_hms(t.ts - ls.start)} {t.entity:<18} {t.from_state} -> {t.to_state} ({t.reason})")
    for i in res.decision.intents:
        if i.kind in (IntentKind.SET_WEIGHT, IntentKind.SET_CONDITION, IntentKind.CAPTURE_EVIDENCE):
            continue
        out.append(f"{_hms(i.ts - ls.start)} {i.entity:<18} intent {i.kind}{' (soft)' if i.soft else ''} ({i.reason})")
    return out


def live_state_for(scenario: Scenario, policy: Any) -> LiveState:
    b = policy.budgets
    return LiveState(start=scenario.start, duration=scenario.duration,
                     pool_sizes={p.name: p.nodes for p in scenario.fleet.pools},
                     budget_fraction=b.quarantine_fraction_per_hour, budget_min=b.quarantine_min_per_hour,
                     window_s=b.window_s)


def pacer(speed: float, start: float) -> Callable[[float], None]:
    """Sleep so that simulated time runs at most ``speed`` times real time (0: as fast as possible)."""
    w0 = time.perf_counter()

    def pace(now: float) -> None:
        if speed <= 0:
            return
        ahead = (now - start) / speed - (time.perf_counter() - w0)
        if ahead > 0:
            time.sleep(min(ahead, 5.0))

    return pace


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


__all__ = ["DEMO_SCENARIO", "LiveState", "demo_scenario", "live_state_for", "pacer", "plain_line", "render_live",
           "State"]

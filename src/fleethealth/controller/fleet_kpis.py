"""The fleet KPIs of a running controller (review.kpis over what it published), for /metrics, the fleet
view, GET /api/v1/pools and `fleethealth get pools`.

Theory of operation: a ``LiveKpis`` object, held by the controller's HTTP app, looks at each published
cycle it has not seen yet whenever someone reads the KPIs (a Prometheus scrape, the fleet view, the API):
it integrates, between two cycles it saw, the time each node's health was unknown and the replica time
within its SLO (``review.kpis.SloSampler``), holding a cycle's picture until the next one it sees. The
period begins where the controller's records do (the oldest lifecycle's start: the first cycle, or a
restored store's, at most a week back) and ends at the last cycle; unknown time and SLO attainment are
counted from the first cycle this object saw. Transitions and intents come from
the state store when the controller has one (all of them, so a state entered before the start is known),
else from the controller's recent memory. The figures are computed at most once per published cycle, and
no more often than ten times their own computing time (a large store's history costs about a second).
GPUs per node: the node's GPU tuples in the last cycle it saw with any (8 when it never saw one).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fleethealth.controller.timeline import ScoreTrail
from fleethealth.review.kpis import EntityInfo, PoolKpis, SloSampler, pool_kpis

DEFAULT_GPUS_PER_NODE = 8
# Recompute when the controller's clock has moved on by BUDGET times the last computation's duration (at
# most ~10% of a core): a 12,500-node fleet with 100k stored transitions takes about a second (then every
# 10 s of cycles), a small fleet a few milliseconds (then every cycle).
BUDGET = 10.0
MAX_PERIOD_S = 7 * 86400.0


class LiveKpis:
    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self._lock = threading.Lock()
        self._seen: Any = None
        self._start: float | None = None
        self._last_ts: float | None = None
        self._unknown_now: set[str] = set()
        self.unknown_s: dict[str, float] = {}
        self._gpus: dict[str, int] = {}
        self._slo = SloSampler({})
        self.trail = ScoreTrail()  # the entity page's score line between state changes
        self._cache: tuple[Any, dict[str, PoolKpis]] | None = None
        self._computed_at = 0.0
        self._cost_s = 0.0

    def _observe(self, pub: Any) -> None:
        """Account one newly published cycle (under the lock)."""
        if pub is self._seen or pub.report is None:
            return
        self._seen = pub
        now = float(pub.ts)
        if self._start is None:
            # records begin with the oldest lifecycle (an entity in its first state since the first cycle),
            # at most a week back; unknown time and SLO attainment are counted from here on
            first = min((float(e.since) for e in pub.state.entities.values()), default=now)
            self._start = max(min(first, now), now - MAX_PERIOD_S)
        dt = 0.0 if self._last_ts is None else max(0.0, now - self._last_ts)
        for n in self._unknown_now:  # the previous picture holds until this cycle
            self.unknown_s[n] = self.unknown_s.get(n, 0.0) + dt
        self._last_ts = now
        h = pub.health
        self._unknown_now = set()
        if h is not None:
            ks = h.kinds.get("node")
            if ks is not None:
                vals = np.asarray(ks.value, np.float64)
                self._unknown_now = {ks.names[i] for i in np.nonzero(np.isnan(vals))[0].tolist()}
            gk = h.kinds.get("gpu")
            if gk is not None and gk.names:
                counts: dict[str, int] = {}
                for name in gk.names:
                    node = name.split("/")[0]
                    counts[node] = counts.get(node, 0) + 1
                self._gpus.update(counts)
        self._slo.pool_of = {e.entity: pool_of(e, pub.state.entities) for e in pub.state.entities.values()
                             if e.kind == "replica"}
        self._slo.observe(now, h)
        self.trail.observe(now, h)

    @property
    def since(self) -> float | None:
        """The first cycle these KPIs saw (the start of their period)."""
        return self._start

    def observe(self) -> None:
        """Look at the latest published cycle (the entity page calls this before reading the trail)."""
        with self._lock:
            self._observe(self.controller.published)

    def samples(self, entity: str, start: float) -> list[tuple[float, float | None]]:
        with self._lock:
            return self.trail.series(entity, start)

    def kpis(self) -> dict[str, PoolKpis]:
        """The KPIs per pool (and ``all``) as of the last published cycle; {} before the first."""
        pub = self.controller.published
        with self._lock:
            self._observe(pub)
            # controller time, so a fake clock (tests, replays) always gets fresh figures
            if self._cache is not None and (self._cache[0] is pub or
                                            float(pub.ts) - self._computed_at < BUDGET * self._cost_s):
                return self._cache[1]
            t0 = time.perf_counter()
            if self._start is None or self._last_ts is None:
                return {}
            ents = {e.entity: EntityInfo(e.kind, pool_of(e, pub.state.entities),
                                         self._gpus.get(e.entity, DEFAULT_GPUS_PER_NODE) if e.kind == "node" else 0,
                                         str(e.state))
                    for e in pub.state.entities.values() if e.kind in ("node", "replica")}
            trs, ints = self._rows(pub)
            health_mean: dict[str, float | None] = {}
            if pub.health is not None:
                vals: dict[str, list[float]] = {}
                for t in pub.health.by_kind("node"):
                    if t.value is not None and t.entity in ents:
                        vals.setdefault(ents[t.entity].pool, []).append(t.value)
                health_mean = {p: float(np.mean(v)) for p, v in vals.items()}
            out = pool_kpis(trs, ints, ents, start=self._start, end=self._last_ts, unknown_s=dict(self.unknown_s),
                            slo=self._slo.attainment(), health_mean=health_mean,
                            flap_window_s=3600.0)
            self._cache = (pub, out)
            self._computed_at = float(pub.ts)
            self._cost_s = time.perf_counter() - t0
            return out

    def _rows(self, pub: Any) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
        store = getattr(getattr(self.controller, "loop", None), "store", None)
        if store is not None and hasattr(store, "transitions") and hasattr(store, "intents"):
            try:
                return store.transitions(), store.intents(since=self._start)
            except Exception:  # an unreachable store: the recent memory still answers
                pass
        return list(pub.recent_transitions), list(pub.recent_intents)

    def as_json(self) -> dict[str, Any]:
        k = self.kpis()
        return {"ts": self._last_ts, "since": self._start, "pools": {p: v.to_dict() for p, v in k.items()}}

    def metrics_text(self) -> str:
        """Prometheus text for the KPI gauges, one series per pool (``all``: the whole fleet)."""
        k = self.kpis()
        if not k:
            return ""
        fams: list[tuple[str, str, str]] = [
            ("fleethealth_kpi_goodput_ratio", "goodput", "GPU goodput: 1 - GPU-hours lost / GPU-hours since the "
             "controller started (lost: isolated, else unknown, else DEGRADED nodes)."),
            ("fleethealth_kpi_gpu_hours", "gpu_hours", "GPU-hours of the pool's nodes since the controller started."),
            ("fleethealth_kpi_slo_attainment_ratio", "slo_attainment", "Share of replica time with every SLO "
             "signal within its error budget."),
            ("fleethealth_kpi_quarantine_precision_ratio", "precision", "Quarantines confirmed (failed test, "
             "hard gate, FAILED) / decided quarantines."),
            ("fleethealth_kpi_detect_seconds", "detect_median_s", "Median time from an entity's first bad "
             "transition to its isolation."),
            ("fleethealth_kpi_repair_seconds", "repair_median_s", "Median time from an entity's first bad "
             "transition to READY."),
            ("fleethealth_kpi_flaps_per_entity_day", "flaps_per_entity_day", "Returns to the state just left "
             "within an hour, per node or replica per day."),
            ("fleethealth_kpi_quarantines", "quarantines", "Quarantines since the controller started."),
            ("fleethealth_kpi_health_mean", "health_mean", "Mean known node health in the last cycle."),
        ]
        lines: list[str] = []
        for name, key, help_ in fams:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
            for pool, v in sorted(k.items()):
                x = getattr(v, key)
                if x is not None and not (isinstance(x, float) and math.isnan(x)):
                    lines.append(f'{name}{{pool="{_label(pool)}"}} {float(x)!r}')
        name = "fleethealth_kpi_quarantine_outcomes"
        lines += [f"# HELP {name} Quarantines since the controller started by outcome (confirmed, cleared, released, "
                  "false, pending); precision = confirmed / all but pending.", f"# TYPE {name} gauge"]
        for pool, v in sorted(k.items()):
            for outcome, n in sorted(v.outcomes.items()):
                lines.append(f'{name}{{pool="{_label(pool)}",outcome="{outcome}"}} {float(n)!r}')
        name = "fleethealth_kpi_gpu_hours_lost"
        lines += [f"# HELP {name} GPU-hours lost since the controller started, by cause (each hour once).",
                  f"# TYPE {name} gauge"]
        for pool, v in sorted(k.items()):
            for cause, x in (("isolated", v.lost_isolated_gpu_h), ("unknown", v.lost_unknown_gpu_h),
                             ("slow", v.lost_slow_gpu_h)):
                lines.append(f'{name}{{pool="{_label(pool)}",cause="{cause}"}} {float(x)!r}')
        return "\n".join(lines) + "\n"


def pool_of(es: Any, entities: Mapping[str, Any]) -> str:
    """An entity's pool: its own label, else (a replica whose series carry no pool) its node's."""
    pool = es.labels.get("pool")
    if pool:
        return str(pool)
    node = entities.get(es.labels.get("node", ""))
    return str(node.labels.get("pool", "default")) if node is not None else "default"


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

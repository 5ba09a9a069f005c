"""Small fleets for the simulator tests: a few nodes, so each test runs in well under a second."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleethealth.signals.snapshot import Snapshot
from fleethealth.sim.scenario import Scenario


def small_scenario(faults: list[dict[str, Any]] | None = None, seed: int = 5, duration: str = "1h",
                   **fleet: Any) -> Scenario:
    data: dict[str, Any] = {
        "name": "small",
        "seed": seed,
        "duration": duration,
        "step": "15s",
        "fleet": {
            "nodes_per_rack": 2,
            "pools": [
                {"name": "train", "nodes": 4, "workload": "training",
                 "jobs": [{"name": "job-a", "pp": 2, "compute_s": 1.82}]},
                {"name": "serve", "nodes": 2, "workload": "serving",
                 "serving": {"model": "llama3-8b", "gpus_per_replica": 4, "builds": ["v1", "v2"]}},
            ],
        } | fleet,
        "faults": faults or [],
    }
    return Scenario.model_validate(data)


def series(snap: Snapshot, metric: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{labelset: value} for one metric, optionally filtered by label values."""
    mi = snap.metric_index().get(metric)
    out: dict[tuple[tuple[str, str], ...], float] = {}
    if mi is None:
        return out
    sel = np.nonzero(snap.metric_ids == mi)[0]
    for i in sel.tolist():
        ls = snap.labelsets[int(snap.series_ids[i])]
        d = dict(ls)
        if all(d.get(k) == v for k, v in match.items()):
            out[ls] = float(snap.values[i])
    return out


def values(snap: Snapshot, metric: str, **match: str) -> list[float]:
    return list(series(snap, metric, **match).values())

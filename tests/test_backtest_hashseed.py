"""The backtest gives the same numbers run to run: its JSON (less the timing keys) does not depend on Python's
string-hash randomisation (PYTHONHASHSEED), so replay and backtest of the same code and scenario agree to the
last digit.

Each run is its own interpreter (the hash seed is fixed at start-up), both at once. The scenario is small and
short on purpose (one 16-node pool, a bad driver rolled to it in the first quarter hour, one simulated hour,
product arm only): many nodes slow or isolated for different lengths of time, so the pool's lost GPU-hours
are a float sum of many terms whose order showed in the last digits (review.kpis summed them over a set of
node names: seeds 1 and 2 gave 67.39999999999999 and 67.4 node GPU-hours lost before that was fixed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCENARIO = """\
name: hashseed-small
description: "A bad driver rolled to one small pool early: many nodes slow or isolated at different times"
seed: 560
duration: 1h
step: 15s
fleet:
  pools:
    - name: train-b
      nodes: 16
      workload: training
      jobs:
        - {name: pretrain-34b, pp: 2, compute_s: 1.1}
faults:
  - kind: bad_driver_rollout
    target: pool:train-b
    onset: 5m
    end: 50m
    params: {driver: 560.28.03, rollout_s: 900, delay_s: 120}
"""

TIMING_KEYS = frozenset({"cpu_s", "wall_s", "gpu_hours_per_cpu_s"})  # measured, expected to differ
CLI = "from fleethealth.cli.main import main; main()"


def without_timing(o: Any) -> Any:
    if isinstance(o, dict):
        return {k: without_timing(v) for k, v in o.items() if k not in TIMING_KEYS}
    if isinstance(o, list):
        return [without_timing(v) for v in o]
    return o


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as ``path: a != b`` lines (a readable failure, not a dict dump)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_backtest_json_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    scenario = tmp_path / "hashseed-small.yaml"
    scenario.write_text(SCENARIO, encoding="utf-8")
    args = [sys.executable, "-c", CLI, "backtest", "-s", str(scenario), "-b", "none", "--format", "json",
            "--no-progress"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed})
             for seed in ("1", "2")]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(without_timing(json.loads(out)))
    a, b = results
    assert a["kpis"]["train-b"]["lost_gpu_h"] > 0  # the sum under test has many terms
    assert a["kpis"]["train-b"]["incidents"] > 5
    assert differences(a, b) == []

"""Simulator cost alone: construction and CPU per telemetry step (the backtest's per-step simulator share).

    python benchmarks/bench_sim.py [--scenario noise-only] [--steps 2000] [--skip 0] [--json]

``--skip`` steps are run first, unmeasured (e.g. 1500 to measure after a fault's onset). CPU time
(process time) is reported with a calibration figure (``sum(range(10**6))``, ~13 ms on an idle box) since
the machine may be shared; the step figure is the 10th percentile and the median over chunks of 20 steps,
so that other processes' bursts do not count.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from fleethealth.bench.calibration import cpu_calibration_ms
from fleethealth.sim import load_scenario
from fleethealth.sim.simulation import Simulation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="noise-only")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sc = load_scenario(a.scenario)
    sc = sc.with_overrides(duration=max(sc.duration, (a.skip + a.steps + 1) * sc.step))
    cal = cpu_calibration_ms()
    c0 = time.process_time()
    sim = Simulation(sc)
    init_ms = (time.process_time() - c0) * 1e3
    for _ in range(a.skip):
        sim.step()
    chunk, per_step = 20, []
    for _ in range(max(1, a.steps // chunk)):
        c0 = time.process_time()
        for _ in range(chunk):
            sim.step()
        per_step.append((time.process_time() - c0) / chunk * 1e3)
    out = {
        "scenario": a.scenario, "gpus": sim.fleet.n_gpus, "rows": int(sim.n_static + sim.fleet.n_nodes),
        "init_ms": round(init_ms, 1), "step_ms_p10": round(float(np.percentile(per_step, 10)), 3),
        "step_ms_median": round(float(np.median(per_step)), 3), "steps": len(per_step) * chunk,
        "calibration_ms": round((cal + cpu_calibration_ms()) / 2, 1),
    }
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:<16} {v}")


if __name__ == "__main__":
    main()

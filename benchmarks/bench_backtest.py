"""Backtest throughput: simulated GPU-hours per second on a 512-GPU fleet at 15-second telemetry.

    python benchmarks/bench_backtest.py [--hours 168] [--cycle 60] [--baselines none|rules|all] [--json]
    python benchmarks/bench_backtest.py --hours 24 --compare /tmp/old/src [--rounds 3]

``--compare SRC`` runs this benchmark alternately on the tree at ``SRC`` (a ``git worktree`` of an older
commit: its ``src``) and on this one, each in a fresh process, ``--rounds`` times, and prints the medians
side by side (the machine may be shared: alternating spreads its load over both).

The fleet is the ``noise-only`` scenario's (48 training nodes, 16 serving nodes: 512 GPUs, 15 s steps).
Every telemetry step goes through the simulator and the rolling history; every ``--cycle`` simulated
seconds the product's full decision cycle runs (history view, structural signals, remediation and serving
scores, decisions). The decision cadence is coarser than the telemetry on purpose (a controller's dwell
times are minutes; an Xid or OOM event still triggers a cycle at once); a cycle costs a few CPU ms for
this fleet (3.8 ms on an idle x86 core, the week 53 s). CPU time
(process time) is reported next to wall time because the machine may be shared, with a calibration loop's
CPU time (about 13 ms idle); the full week is 40,320 steps, so ``--hours`` lets you measure a slice and the
script projects the week from it. ``decide_ms_per_cycle`` and ``structural_ms_per_cycle`` time the two
per-cycle parts that are neither scoring nor the history.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from fleethealth.backtest import evaluate, run_backtest
from fleethealth.bench.calibration import cpu_calibration_ms
from fleethealth.policy import default_policy
from fleethealth.sim import load_scenario

WEEK_H = 168.0


def _time_parts() -> dict[str, list[float]]:
    """CPU seconds and calls of Decider.decide and StructuralTracker.observe during the run (wrapped
    here, in the benchmark only)."""
    from fleethealth.decide.decider import Decider
    from fleethealth.sources.structural import StructuralTracker

    acc: dict[str, list[float]] = {"decide": [0.0, 0], "structural": [0.0, 0]}

    def wrap(cls: Any, name: str, key: str) -> None:
        inner = getattr(cls, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                acc[key][0] += time.process_time() - t
                acc[key][1] += 1

        setattr(cls, name, timed)

    wrap(Decider, "decide", "decide")
    wrap(StructuralTracker, "observe", "structural")
    return acc


def _compare(old_src: str, rounds: int, args: list[str]) -> None:
    """Old and new, alternating, each a fresh process; medians side by side."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for _ in range(rounds):
        for name, src in (("old", old_src), ("new", here)):
            env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *args, "--json"], env=env,
                                 check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    keys = ("cpu_per_cycle_ms", "cpu_s", "projected_week_cpu_s", "cpu_per_step_ms_sim_and_ingest",
            "decide_ms_per_cycle", "structural_ms_per_cycle", "calibration_ms", "quarantines")
    print(f"{'median of ' + str(rounds):<34} {'old':>10} {'new':>10}")
    for k in keys:
        o, n = (statistics.median(r[k] for r in runs[x]) for x in ("old", "new"))
        print(f"{k:<34} {o:>10} {n:>10}")
    print(f"{'cpu_per_cycle_ms, every round':<34} {[r['cpu_per_cycle_ms'] for r in runs['old']]} "
          f"{[r['cpu_per_cycle_ms'] for r in runs['new']]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=WEEK_H, help="simulated hours (default: a week)")
    ap.add_argument("--cycle", type=float, default=60.0, help="decision cycle, simulated seconds")
    ap.add_argument("--baselines", choices=("none", "rules", "all"), default="none")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--compare", metavar="SRC", help="an older tree's src: run both alternately")
    ap.add_argument("--rounds", type=int, default=3, help="with --compare: runs of each")
    a = ap.parse_args()
    if a.compare:
        _compare(a.compare, a.rounds, ["--hours", str(a.hours), "--cycle", str(a.cycle), "--baselines", a.baselines])
        return
    bl = {"none": [], "rules": ["static-rules", "liveness-only"],
          "all": ["static-rules", "liveness-only", "weighted-mean", "no-confidence"]}[a.baselines]
    sc = load_scenario("noise-only").with_overrides(duration=a.hours * 3600.0)
    gpus = sum(p.nodes for p in sc.fleet.pools) * sc.fleet.gpus_per_node
    parts = _time_parts()
    w0, c0 = time.perf_counter(), time.process_time()
    run = run_backtest(sc, default_policy(), bl, cycle_s=a.cycle)
    res = evaluate(run)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    gpu_h = gpus * a.hours
    arm_cpu = {n: round(log.cpu_s, 2) for n, log in run.arms.items()}
    decide_cpu = sum(arm_cpu.values())
    out: dict[str, Any] = {
        "gpus": gpus, "simulated_h": a.hours, "steps": run.steps, "cycle_s": a.cycle,
        "cycles": res["cycles"], "baselines": bl, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "gpu_hours_per_cpu_s": round(gpu_h / cpu, 1), "gpu_hours_per_wall_s": round(gpu_h / wall, 1),
        "cpu_per_cycle_ms": round(1000 * arm_cpu.get("fleethealth", 0.0) / max(res["cycles"], 1), 1),
        "cpu_per_step_ms_sim_and_ingest": round(1000 * (cpu - decide_cpu) / max(run.steps, 1), 2),
        "arm_cpu_s": arm_cpu,
        # the per-cycle parts that are neither scoring nor the history, over every engine arm's cycles
        "decide_ms_per_cycle": round(1000 * parts["decide"][0] / max(parts["decide"][1], 1), 2),
        "structural_ms_per_cycle": round(1000 * parts["structural"][0] / max(parts["structural"][1], 1), 2),
        "calibration_ms": cpu_calibration_ms(),
        "projected_week_cpu_s": round(cpu * WEEK_H / a.hours, 0),
        "quarantines": res["quarantines"], "flaps_per_node_day": round(res["flaps_per_node_day"], 4),
    }
    if a.json:
        print(json.dumps(out))
        return
    for k, v in out.items():
        print(f"{k:<34} {v}")


if __name__ == "__main__":
    main()

"""Every built-in scenario through the backtest, one table: the product against its baselines.

Runs ``fleethealth backtest --format json`` for each scenario in its own process (``--jobs`` at a time),
keeps each run's JSON under ``--out`` and prints a Markdown table: precision, recall, detection, removal,
pages, flaps per node-day and whether the scenario's targets were met, each cell ``fleethealth / baseline``.
Full length by default (the scenario's own duration); ``--compress 90m`` for a quick look. ``--nodes N``
(repeat) runs each scenario at those fleet sizes too (``backtest --nodes``: pools scaled, each fault on the
same place of its pool; ``0`` is the scenario's own size), one row per scenario and size.

    python benchmarks/scenario_table.py --out /tmp/table --jobs 2
    python benchmarks/scenario_table.py --compress 90m -s nvlink-down -s rack-cooling
    python benchmarks/scenario_table.py -s mixed -s rack-cooling --nodes 32 --nodes 0 --nodes 256
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def _scenarios() -> list[str]:
    from fleethealth.sim.scenario import builtin_names

    return sorted(builtin_names())


def _run(name: str, out: Path, baseline: str, compress: str | None,
         nodes: int = 0) -> tuple[str, dict[str, Any] | str, float]:
    path = out / (f"{name}.json" if not nodes else f"{name}@{nodes}.json")
    cmd = [sys.executable, "-m", "fleethealth.cli.main", "backtest", "-s", name, "-b", baseline, "--format", "json",
           "--no-progress"]
    if compress:
        cmd += ["--compress", compress]
    if nodes:
        cmd += ["--nodes", str(nodes)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return name, (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1], wall
    path.write_text(proc.stdout)
    return name, json.loads(proc.stdout), wall


def _num(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and v != int(v):
        return f"{v:.3g}{unit}"
    return f"{int(v)}{unit}" if isinstance(v, (int, float)) else str(v)


def _size(r: dict[str, Any]) -> str:
    """The run's fleet size in GPUs, from its JSON (empty when it does not say)."""
    g = r.get("gpus")
    return f"{g} GPUs" if isinstance(g, int) else ""


def _cells(r: dict[str, Any]) -> list[str]:
    targets = r.get("targets") or {}
    met = "yes" if all(targets.values()) else "no: " + ", ".join(k for k, ok in targets.items() if not ok)
    return [_num(r.get("precision")), _num(r.get("recall")), _num(r.get("detection_s"), " s"),
            _num(r.get("removal_s"), " s"), _num(r.get("pages")), _num(r.get("flaps_per_node_day")),
            met if targets else "-"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-s", "--scenario", action="append", help="scenario name (repeat); default: all built-ins")
    ap.add_argument("-b", "--baseline", default="static-rules")
    ap.add_argument("--compress", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("scenario-table"))
    ap.add_argument("--nodes", type=int, action="append",
                    help="fleet size (repeat; 0: the scenario's own); default: the scenario's own only")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    names = a.scenario or _scenarios()
    runs = [(n, k) for n in names for k in (a.nodes or [0])]
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda nk: _run(nk[0], a.out, a.baseline, a.compress, nk[1]), runs))
    head = ["scenario", "size", "precision", "recall", "detection", "removal", "pages", "flaps/node-day", "targets met"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (name, r, wall), (_, k) in zip(results, runs, strict=True):
        if isinstance(r, str):
            print(f"| {name} | {k or 'own'} | error: {r} |" + " |" * (len(head) - 3))
            continue
        size = _size(r) or str(k or "own")
        ours = _cells(r)
        base = (r.get("baselines") or {}).get(a.baseline)
        theirs = _cells(base) if isinstance(base, dict) else ["-"] * len(ours)
        row = [f"{x} / {y}" for x, y in zip(ours[:-1], theirs[:-1], strict=True)] + [ours[-1] + " / " + theirs[-1]]
        print(f"| {name} | {size} | " + " | ".join(row) + f" |  <!-- {wall:.0f} s wall, {r.get('cpu_s')} s CPU -->")
    print(f"\ncells: fleethealth / {a.baseline}; {'compressed ' + a.compress if a.compress else 'full length'}; "
          f"JSON per scenario in {a.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Controller cycle time for a large fleet read from exposition text, parsing included.

    python benchmarks/bench_cycle.py [--gpus 100000] [--cycles 6] [--prom-sample-nodes 200] [--json]
    python benchmarks/bench_cycle.py --old /tmp/old-tree [--rounds 2]   # old vs new, alternating runs
    python benchmarks/bench_cycle.py --storm [--old /tmp/old-tree]      # a fleet-wide flag storm

The fleet is N GPUs behind N/8 dcgm-exporter endpoints (25 default fields, real label sets, as
``fleethealth.bench.parse`` generates them). Each cycle the source parses every endpoint's page with our
exposition parser in one batched call (``parse_many``, as the direct scraper does, each page with its
own ``instance`` label, keeping its ``PagePlans`` across reads as the direct scraper does), and the
controller runs its whole cycle on it: history, structural signals, scoring, decisions. HTTP is left
out: it is the network's cost, not the controller's. The first cycle is cold (no label string seen
before); later cycles are the steady state (same label strings, new values): the median of the later
half of the cycles (the structural tracker settles its layout in the cycle after the first, and every node first
enters its lifecycle in the second). ``--old PATH`` runs this benchmark (the same pages) on another tree's fleethealth
(``git worktree add PATH COMMIT``) and on this one, each in a fresh process, alternately, and prints them side by side with the CPU
calibration taken before each run (the machine may be shared). The run tunes its process's memory as the controller
process does (``fleethealth.memory``: numpy's huge pages off, malloc keeping freed blocks); ``--untuned`` times
the code alone with numpy's and glibc's defaults (setting a ``MALLOC_*_`` variable instead would also switch off
glibc's dynamic mmap threshold: not its default). ``--storm``: from the third cycle on every GPU
reports Xid 79 (a fleet-wide flag storm: every GPU flagged, every node gated), and the decisions' CPU
per cycle is what to read. prometheus-client's parser and our one-call-per-page path are timed on a subsample of the same
pages, and all are reported in samples per second of CPU. CPU time (process time) is reported next to
wall time: the machine may be shared.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fleethealth.bench.calibration import cpu_calibration_ms
from fleethealth.bench.parse import _RANGES, DCGM_DEFAULT_FIELDS, SENTINEL, dcgm_label_strings
from fleethealth.controller.loop import Controller
from fleethealth.policy import default_policy
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources import exposition

parse_exposition, parse_many = exposition.parse_exposition, exposition.parse_many
# an older tree (run by --old) kept parsed label strings in a module-level cache; today the caller holds
# them (PagePlans' LabelCache), so a fresh source is cold by itself
clear_label_cache = getattr(exposition, "clear_label_cache", lambda: None)


def node_pages(n_gpus: int, seed: int = 0) -> list[bytes]:
    """One dcgm-exporter page per node of 8 GPUs, of a healthy fleet (the steady state a controller spends
    its cycles on; uniform random gauges read as row-remap failures and throttling on every GPU)."""
    labels = dcgm_label_strings(n_gpus, seed)
    rng = np.random.default_rng(seed + 1)
    cols: list[list[str]] = []
    for name, typ, _ in DCGM_DEFAULT_FIELDS:
        if name.startswith("DCGM_FI_PROF"):
            vals = [f"{x:.6f}" for x in rng.random(n_gpus).tolist()]
        elif name == "DCGM_FI_DEV_XID_ERRORS":
            vals = ["0"] * n_gpus
        elif name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"):
            vals = [str(x) for x in rng.integers(35, 70, n_gpus).tolist()]
        elif name == "DCGM_FI_DEV_SM_CLOCK":
            vals = [str(x) for x in rng.integers(1970, 1990, n_gpus).tolist()]
        elif typ == "counter":
            vals = [str(x) for x in rng.integers(0, 10**9, n_gpus).tolist()]
        else:  # a healthy fleet: plausible ranges (no row-remap failure, no throttle reason but idle)
            lo, hi = _RANGES.get(name, (0, 2000))
            vals = [str(x) for x in rng.integers(lo, hi, n_gpus).tolist()]
        if name == "DCGM_FI_DEV_MEMORY_TEMP":
            vals[::50] = [SENTINEL] * len(vals[::50])
        cols.append(vals)
    pages = []
    for node in range(n_gpus // 8):
        lo, hi = node * 8, node * 8 + 8
        parts = []
        for (name, typ, help_), vals in zip(DCGM_DEFAULT_FIELDS, cols, strict=True):
            parts.append(f"# HELP {name} {help_}\n# TYPE {name} {typ}\n")
            parts.extend(f"{name}{labels[i]} {vals[i]}\n" for i in range(lo, hi))
        pages.append("".join(parts).encode())
    return pages


class PagesSource:
    """Parses every page on each read, like the direct scraper after its fetches. ``storm``: the pages
    read from the third read on (``storm_pages``)."""

    name = "pages"

    def __init__(self, pages: list[bytes], storm: list[bytes] | None = None) -> None:
        self.pages = pages
        self.storm = storm
        self.reads = 0
        self.parse_s = 0.0
        self.parse_cpu_s = 0.0
        # (an older tree, run by --old, may have no page plans: it parses as it did)
        self.plans = exposition.PagePlans() if hasattr(exposition, "PagePlans") else None

    def read(self, now: float) -> Snapshot:
        self.reads += 1
        t0, c0 = time.perf_counter(), time.process_time()
        snap = parse_many(self.items, default_ts=now, plans=self.plans) if self.plans is not None else parse_many(
            self.items, default_ts=now)
        self.parse_s = time.perf_counter() - t0
        self.parse_cpu_s = time.process_time() - c0
        return snap

    @property
    def items(self) -> list[tuple[bytes, dict[str, str], str]]:
        pages = self.storm if self.storm is not None and self.reads > 2 else self.pages
        return [(page, {"instance": f"node-{i:05d}:9400"}, f"node-{i:05d}") for i, page in enumerate(pages)]


def storm_pages(pages: list[bytes]) -> list[bytes]:
    """The same pages with Xid 79 (fallen off the bus) on every GPU."""
    return [re.sub(rb"(DCGM_FI_DEV_XID_ERRORS\{[^}]*\}) 0", rb"\1 79", p) for p in pages]


def prom_client_rate(pages: list[bytes]) -> tuple[float, int]:
    from prometheus_client.parser import text_string_to_metric_families

    texts = [p.decode() for p in pages]
    c0 = time.process_time()
    n = 0
    for t in texts:
        for fam in text_string_to_metric_families(t):
            n += len(fam.samples)
    cpu = time.process_time() - c0
    return n / cpu, n


def our_rate(pages: list[bytes]) -> tuple[float, int]:
    """Our parser one call per page (the path before parse_many), merged as the old source did."""
    c0 = time.process_time()
    b = SnapshotBuilder()
    for i, p in enumerate(pages):
        b.extend_snapshot(parse_exposition(p, default_ts=1.0, source=f"node-{i:05d}",
                                           extra_labels={"instance": f"node-{i:05d}:9400"}))
    n = len(b.build(1.0))
    cpu = time.process_time() - c0
    return n / cpu, n


def batched_rate(pages: list[bytes]) -> tuple[float, int]:
    c0 = time.process_time()
    n = len(parse_many([(p, {"instance": f"node-{i:05d}:9400"}, f"node-{i:05d}") for i, p in enumerate(pages)],
                       default_ts=1.0))
    cpu = time.process_time() - c0
    return n / cpu, n


def bench_cycle(gpus: int = 100_000, cycles: int = 6, interval_s: float = 15.0,
                prom_sample_nodes: int = 200, storm: bool = False, untuned: bool = False) -> dict[str, Any]:
    try:  # as the controller process does at start (controller.build); an older tree has no such setting
        from fleethealth.memory import tune_process_memory
    except ImportError:
        memory: dict[str, bool] = {}
    else:
        memory = {} if untuned else tune_process_memory()
    calibration = cpu_calibration_ms()
    t0 = time.perf_counter()
    pages = node_pages(gpus)
    gen_s = time.perf_counter() - t0
    sample = pages[:prom_sample_nodes]
    prom_rate, prom_n = prom_client_rate(sample)
    ours_sample_rate, _ = our_rate(sample)
    batched_sample_rate, _ = batched_rate(sample)
    clear_label_cache()  # the first cycle below is cold

    src = PagesSource(pages, storm_pages(pages) if storm else None)
    ctl = Controller(default_policy(), [src], interval_s=interval_s)
    reports = []
    now = 1_700_000_000.0
    for _ in range(cycles):
        gc.collect()
        c0 = time.process_time()
        rep = ctl.cycle(now)
        cpu = time.process_time() - c0
        reports.append((rep, cpu, src.parse_s, src.parse_cpu_s))
        now += interval_s
    # The steady state: the later half of the cycles. The first is cold (every label set new, no counter
    # history yet), and the structural tracker settles its layout in the next one (see the per-cycle
    # figures, which are all reported).
    last = reports[max(1, cycles // 2):] or reports
    samples = reports[-1][0].samples
    parse_cpu = statistics.median(r[3] for r in last)
    h = ctl.published.health
    cycle_cpu = statistics.median(r[1] for r in last)
    return {
        "gpus": gpus, "endpoints": len(pages), "samples_per_cycle": samples, "cycles": cycles,
        "calibration_ms": calibration,
        "first_cycle_over_steady": round(reports[0][1] / cycle_cpu, 2),
        # one controller core, linear in GPUs (parse, history and scoring are; see the README's table)
        "gpus_per_15s_on_one_core": round(gpus * 15.0 / cycle_cpu),
        "generate_s": round(gen_s, 2),
        "cycle_wall_s": round(statistics.median(r[0].duration_s for r in last), 3),
        "cycle_cpu_s": round(statistics.median(r[1] for r in last), 3),
        "parse_wall_s": round(statistics.median(r[2] for r in last), 3),
        "parse_cpu_s": round(parse_cpu, 3),
        "stage_wall_s": {k: round(v, 3) for k, v in reports[-1][0].stage_s.items()},
        "stage_cpu_s": {k: round(v, 3) for k, v in reports[-1][0].stage_cpu_s.items()},
        "parse_samples_per_cpu_s": round(samples / parse_cpu),
        "parse_wall_s_per_cycle": [round(r[2], 3) for r in reports],
        "parse_cpu_s_per_cycle": [round(r[3], 3) for r in reports],
        "cycle_cpu_s_per_cycle": [round(r[1], 3) for r in reports],
        "decide_cpu_s_per_cycle": [round(r[0].stage_cpu_s.get("decide_persist", 0.0), 3) for r in reports],
        "intents_per_cycle": [len(r[0].intents) for r in reports],
        "storm": storm, "process_memory": memory,
        "parse_cold_cpu_s": round(reports[0][3], 3),
        "parse_samples_per_cpu_s_subsample_batched": round(batched_sample_rate),
        "parse_samples_per_cpu_s_subsample_per_page": round(ours_sample_rate),
        "prom_client_samples_per_cpu_s": round(prom_rate),
        "prom_client_sample": {"endpoints": len(sample), "samples": prom_n},
        "speedup_vs_prom_client": round(samples / parse_cpu / prom_rate, 1),
        "endpoints_per_15s_on_one_core": round(len(pages) * 15.0 / parse_cpu),
        "interval_s": interval_s, "overran": any(r[0].overran for r in last),
        "entities": {k: len(v.names) for k, v in (h.kinds.items() if h is not None else [])},
        # peak resident memory of the whole run (pages held in memory included), Linux reports KiB
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=6)
    ap.add_argument("--prom-sample-nodes", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--old", help="another tree (git worktree) to run beside this one, alternately")
    ap.add_argument("--rounds", type=int, default=2, help="with --old: runs of each tree")
    ap.add_argument("--storm", action="store_true", help="every GPU reports Xid 79 from the third cycle on")
    ap.add_argument("--untuned", action="store_true", help="numpy's and glibc's memory defaults (the code alone)")
    a = ap.parse_args()
    if a.old:
        side_by_side(Path(a.old), a.gpus, a.cycles, a.rounds, a.prom_sample_nodes, a.storm, a.untuned)
        return
    r = bench_cycle(a.gpus, a.cycles, prom_sample_nodes=a.prom_sample_nodes, storm=a.storm, untuned=a.untuned)
    if a.json:
        print(json.dumps(r))
        return
    print(f"fleet: {r['gpus']} GPUs, {r['endpoints']} dcgm-exporter endpoints, {r['samples_per_cycle']} samples/cycle")
    print(f"cycle (parse + history + structural + score + decide): {r['cycle_wall_s']} s wall, "
          f"{r['cycle_cpu_s']} s CPU (interval {r['interval_s']:g} s, overran: {r['overran']})")
    print(f"  stages (CPU s, last cycle; read = parse + history ingest): {r['stage_cpu_s']}")
    print(f"parse (parse_many, all {r['endpoints']} pages, median of steady cycles): {r['parse_cpu_s']} s CPU, "
          f"{r['parse_wall_s']} s wall = {r['parse_samples_per_cpu_s']:,} samples/s CPU; "
          f"{r['endpoints_per_15s_on_one_core']:,} endpoints per 15 s on one core; cold first cycle "
          f"{r['parse_cold_cpu_s']} s CPU")
    print(f"on {r['prom_client_sample']['endpoints']} endpoints: prometheus-client {r['prom_client_samples_per_cpu_s']:,} "
          f"samples/s; ours one call per page {r['parse_samples_per_cpu_s_subsample_per_page']:,}/s, batched "
          f"{r['parse_samples_per_cpu_s_subsample_batched']:,}/s; whole-fleet batched vs prometheus-client: "
          f"{r['speedup_vs_prom_client']}x")
    print(f"first cycle {r['cycle_cpu_s_per_cycle'][0]} s CPU (cold: no label string seen before) = "
          f"{r['first_cycle_over_steady']}x the steady state; peak memory {r['max_rss_mib']:,} MiB (the generated "
          f"pages included); one core, 15 s interval: about {r['gpus_per_15s_on_one_core']:,} GPUs; CPU "
          f"calibration {r['calibration_ms']} ms")
    if r["storm"]:
        print(f"flag storm from cycle 3 (every GPU Xid 79): decisions CPU s per cycle {r['decide_cpu_s_per_cycle']}, "
              f"intents per cycle {r['intents_per_cycle']}")


def _run_tree(tree: Path, gpus: int, cycles: int, prom_sample_nodes: int, storm: bool = False,
              untuned: bool = False) -> dict[str, Any]:
    """This benchmark (this very script, the same pages) on ``tree``'s fleethealth, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--gpus", str(gpus), "--cycles", str(cycles),
           "--prom-sample-nodes", str(prom_sample_nodes), "--json", *(["--storm"] if storm else []),
           *(["--untuned"] if untuned else [])]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree).stdout
    r: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return r


def side_by_side(old: Path, gpus: int, cycles: int, rounds: int, prom_sample_nodes: int, storm: bool = False,
                 untuned: bool = False) -> None:
    here = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for k in range(rounds):
        for which, tree in (("old", old), ("new", here)) if k % 2 == 0 else (("new", here), ("old", old)):
            runs[which].append(_run_tree(tree, gpus, cycles, prom_sample_nodes, storm, untuned))
    rows: list[tuple[str, str | Callable[[dict[str, Any]], Any]]] = [
        ("cycle CPU s (steady median)", "cycle_cpu_s"), ("parse CPU s (steady median)", "parse_cpu_s"),
        ("first cycle CPU s", lambda r: r["cycle_cpu_s_per_cycle"][0]),
        ("CPU s per cycle", "cycle_cpu_s_per_cycle"), ("parse CPU s per cycle", "parse_cpu_s_per_cycle"),
        ("first / steady", lambda r: round(r["cycle_cpu_s_per_cycle"][0] / r["cycle_cpu_s"], 2)),
        ("stage CPU s, last cycle", "stage_cpu_s"), ("decisions CPU s per cycle", "decide_cpu_s_per_cycle"),
        ("intents per cycle", "intents_per_cycle"),
        ("peak memory MiB", "max_rss_mib"),
        ("GPUs per 15 s on one core", lambda r: round(r["gpus"] * 15.0 / r["cycle_cpu_s"])),
        ("CPU calibration ms", "calibration_ms"),
        ("process memory tuned", lambda r: r.get("process_memory") or "no"),
    ]
    print(f"{gpus:,} GPUs, {cycles} cycles per run, {rounds} runs per tree, alternating; old = {old}"
          + ("; flag storm (every GPU Xid 79) from cycle 3" if storm else "")
          + ("; untuned (numpy's and glibc's memory defaults in both)" if untuned else ""))
    for label, key in rows:
        for which in ("old", "new"):
            vals = [key(r) if callable(key) else r.get(key) for r in runs[which]]
            print(f"  {label:<30} {which}: " + " | ".join(str(v) for v in vals))


if __name__ == "__main__":
    main()

"""What one shard costs against its GPUs, and what a fleet of a million GPUs needs in shards, cores and memory.

    python benchmarks/bench_shards.py [--sizes 2000,5000,10000,20000] [--cycles 4] [--fleet 1000000] [--json]

A shard is a controller reading only its pools from a Prometheus-compatible store through a label matcher,
so each size here is measured the way a shard runs: a real VictoriaMetrics (Debian's ``victoria-metrics``,
on loopback) holds the scrapes of every size's pool (``bench_cycle.node_pages``' dcgm-exporter pages: 25
default fields per GPU, real label sets, a ``pool`` and an ``instance`` label added as relabeling would),
one scrape every 15 s of simulated time; then a child process per size runs ``Controller`` with a
``PrometheusSource`` whose selectors carry ``pool="<size's pool>"`` for ``--cycles`` cycles at those times:
read (the API's JSON, decoded), history, structural signals, scoring, decisions. Reported per size: the
median CPU seconds of the steady cycles (the first only fills the history, the second makes every
lifecycle) by stage, the most either of the first two took, and the child's peak resident memory (the
whole shard process: interpreter, libraries, the controller's state). The store's own CPU (VictoriaMetrics answering) is not the controller's and is
left out. From a linear fit of CPU and memory against GPUs, the table for ``--fleet`` GPUs: the largest
shard whose steady cycle stays within ``--budget`` of a 15 s interval on one core, how many shards, and
the cores and memory for all of them, with one spare replica of that size for take-overs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

INTERVAL_S = 15.0
HISTORY_SCRAPES = 4  # scrapes before the first cycle: a minute of history, as a freshly started shard finds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VM:
    def __init__(self) -> None:
        exe = shutil.which("victoria-metrics")
        if exe is None:
            raise SystemExit("victoria-metrics not installed (apt-get install victoria-metrics)")
        self.dir = Path(tempfile.mkdtemp(prefix="fh-bench-vm-"))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([exe, f"-storageDataPath={self.dir}", f"-httpListenAddr=127.0.0.1:{self.port}",
                                      "-search.latencyOffset=0s", "-search.disableCache", "-retentionPeriod=1d",
                                      "-loggerLevel=ERROR"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("VictoriaMetrics did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def pool_lines(gpus: int, pool: str) -> list[str]:
    """The pool's scrape as exposition sample lines without a timestamp (pool and instance labels added)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_cycle import node_pages

    out: list[str] = []
    for i, page in enumerate(node_pages(gpus)):
        extra = f'{{pool="{pool}",instance="{pool}-node-{i:05d}:9400",'
        out.extend(ln.replace('Hostname="node-', f'Hostname="{pool}-node-').replace("{", extra, 1)
                   for ln in page.decode().splitlines() if ln and not ln.startswith("#"))
    return out


def ingest(vm: VM, lines: list[str], ts: float) -> None:
    body = (f" {int(ts * 1000)}\n".join(lines) + f" {int(ts * 1000)}\n").encode()
    for lo in range(0, len(body), 32 << 20):  # whole lines per request
        hi = body.rfind(b"\n", lo, lo + (32 << 20)) + 1 if lo + (32 << 20) < len(body) else len(body)
        r = httpx.post(f"{vm.url}/api/v1/import/prometheus", content=body[lo:hi], timeout=120)
        r.raise_for_status()


def child(url: str, pool: str, times: list[float]) -> dict[str, Any]:
    """One shard's process: a controller on the pool's selectors, one cycle per scrape time."""
    from fleethealth.controller.loop import Controller
    from fleethealth.policy import default_policy
    from fleethealth.sources.prometheus import PrometheusSource

    pol = default_policy()
    src = PrometheusSource(url, pol, matchers=f'pool="{pool}"', timeout_s=120)
    ctl = Controller(pol, [src], interval_s=INTERVAL_S)
    rows = []
    for t in times:
        rep = ctl.cycle(t)
        rows.append({"cpu_s": rep.cpu_s, "stage_cpu_s": dict(rep.stage_cpu_s), "samples": rep.samples,
                     "errors": [str(e) for e in rep.source_errors][:2]})
    h = ctl.published.health
    return {"cycles": rows, "entities": sum(len(v.names) for v in h.kinds.values()) if h is not None else 0,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(vm: VM, gpus: int, cycles: int) -> dict[str, Any]:
    pool = f"b{gpus}"
    lines = pool_lines(gpus, pool)
    t_end = time.time() - 60
    times = [t_end - (cycles - 1 - k) * INTERVAL_S for k in range(cycles)]
    for k in range(HISTORY_SCRAPES, 0, -1):
        ingest(vm, lines, times[0] - k * INTERVAL_S)
    for t in times:
        ingest(vm, lines, t - 1.0)  # scraped a second before the cycle reads
    del lines
    httpx.get(f"{vm.url}/internal/force_flush", timeout=30)
    out = subprocess.run([sys.executable, __file__, "--child", vm.url, pool, json.dumps(times)],
                         capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # cycle 1 fills the history (warm-up), cycle 2 is the first decision (every lifecycle new); then steady
    steady = r["cycles"][2:] or r["cycles"]
    stages = {k: round(statistics.median(c["stage_cpu_s"].get(k, 0.0) for c in steady), 3)
              for k in ("read", "structural", "score", "decide_persist")}
    return {
        "gpus": gpus, "entities": r["entities"],
        "cycle_cpu_s": round(statistics.median(c["cpu_s"] for c in steady), 3),
        "read_cpu_s": stages["read"], "stage_cpu_s": stages,
        "samples_per_cycle": int(statistics.median(c["samples"] for c in steady)),
        "first_cycle_cpu_s": round(max(c["cpu_s"] for c in r["cycles"][:2]), 3),
        "cycle_cpu_s_each": [round(c["cpu_s"], 3) for c in r["cycles"]],
        "max_rss_mib": round(r["max_rss_mib"]), "errors": steady[-1]["errors"],
    }


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def sizing(rows: list[dict[str, Any]], fleet: int, budget: float) -> dict[str, Any]:
    g = [float(r["gpus"]) for r in rows]
    cpu_a, cpu_b = fit(g, [r["cycle_cpu_s"] for r in rows])
    first_a, first_b = fit(g, [r["first_cycle_cpu_s"] for r in rows])
    mem_a, mem_b = fit(g, [float(r["max_rss_mib"]) for r in rows])
    limit = budget * INTERVAL_S
    per_shard = int((limit - cpu_a) / cpu_b) if cpu_b > 0 else fleet
    per_shard = max(1000, min(fleet, per_shard // 1000 * 1000))
    shards = math.ceil(fleet / per_shard)
    gpus = fleet / shards  # spread evenly
    cpu = cpu_a + cpu_b * gpus
    mem = mem_a + mem_b * gpus
    return {
        "fleet_gpus": fleet, "budget": budget, "max_gpus_per_shard": per_shard, "shards": shards,
        "gpus_per_shard": round(gpus), "cycle_cpu_s_per_shard": round(cpu, 2),
        "first_cycle_cpu_s_per_shard": round(first_a + first_b * gpus, 2),
        "cores_busy": round(shards * cpu / INTERVAL_S, 1),
        # one core per shard replica (a shard runs on one thread), plus one spare replica for take-overs
        "replicas": shards + 1, "memory_gib": round((shards + 1) * mem / 1024, 1),
        "fit": {"cpu_s": [round(cpu_a, 4), cpu_b], "first_cpu_s": [round(first_a, 4), first_b],
                "rss_mib": [round(mem_a, 1), mem_b]},
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2000,5000,10000,20000", help="GPUs per shard, comma-separated")
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--fleet", type=int, default=1_000_000)
    ap.add_argument("--budget", type=float, default=0.5, help="share of the interval one steady cycle may use")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    vm = VM()
    try:
        rows = [measure(vm, int(s), a.cycles) for s in a.sizes.split(",")]
    finally:
        vm.stop()
    plan = sizing(rows, a.fleet, a.budget)
    if a.json:
        print(json.dumps({"shards": rows, "sizing": plan}))
        return
    print("| GPUs per shard | entities | samples read per cycle | CPU per steady cycle | read / structural / "
          "score / decide+persist | first cycles' CPU (most) | peak memory |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        st = r["stage_cpu_s"]
        print(f"| {r['gpus']:,} | {r['entities']:,} | {r['samples_per_cycle']:,} | {r['cycle_cpu_s']:.2f} s | "
              f"{st['read']:.2f} / {st['structural']:.2f} / {st['score']:.2f} / {st['decide_persist']:.2f} s | "
              f"{r['first_cycle_cpu_s']:.2f} s | {r['max_rss_mib']:,} MiB |")
        if r["errors"]:
            print(f"  source errors: {r['errors']}")
    p = plan
    print(f"\n{p['fleet_gpus']:,} GPUs at 15 s cycles, a steady cycle within {p['budget']:.0%} of the interval on "
          f"one core: at most {p['max_gpus_per_shard']:,} GPUs per shard -> {p['shards']} shards of "
          f"{p['gpus_per_shard']:,} GPUs ({p['cycle_cpu_s_per_shard']} s CPU per cycle, first cycle "
          f"{p['first_cycle_cpu_s_per_shard']} s); {p['cores_busy']} cores busy; {p['replicas']} replicas "
          f"(one core each, one spare for take-overs), {p['memory_gib']} GiB in all")


if __name__ == "__main__":
    main()

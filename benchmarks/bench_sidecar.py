"""What the sidecar costs: added latency per request and per streamed token, and throughput in requests per
second, against a direct connection to the test engine.

Runs the test engine (tests/fake_engine.py, zero token delay so the engine is not the bottleneck) and the
sidecar (`fleethealth sidecar`) as separate processes on loopback, and drives both from this process with
httpx. Usage: ``python benchmarks/bench_sidecar.py [--requests 300] [--tokens 200] [--concurrency 16]
[--seconds 5] [--old /tmp/old-tree]``. Numbers depend on the machine and its load; the report prints what it
measured.

With ``--old PATH`` (a worktree of an earlier commit, e.g. ``git worktree add /tmp/old HEAD~1``) a second
sidecar runs from that tree's src/ against the same engine, and every figure is measured for old and new
alternately (old, new, old, new over ``--rounds``), printed side by side; throughput is measured in
``--slices`` short runs per target, interleaved (direct, old, new, direct, ...), and latency in single requests
interleaved the same way. ``--old-h11`` hides uvloop and
httptools from the old sidecar (for trees before they became dependencies, which ran on asyncio + h11).

Latency and throughput are wall-clock figures and on a shared machine mostly measure the other tenants; the
CPU figures (from /proc) hold. "chain CPU per request" is the CPU that client, sidecar and engine together
spent per request under concurrency: when the chain saturates the cores, direct's chain CPU over a target's
is the throughput ratio, without the other tenants' noise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ok(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not come up within {timeout_s}s")


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far (Linux /proc): figures that hold on a busy machine,
    where wall-clock latencies mostly measure the other tenants. On loopback the kernel delivers a send
    in the sender's context, so system time includes the receiving side's TCP work."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def per(a: tuple[float, float], b: tuple[float, float], n: int, scale: float) -> str:
    return f"user {scale * (b[0] - a[0]) / n:.1f} + system {scale * (b[1] - a[1]) / n:.1f}"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def sequential_latency(base: str, n: int) -> list[float]:
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 1}
    out = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        for _ in range(20):  # warm the connection pools
            await c.post("/v1/completions", json=body)
        for _ in range(n):
            t0 = time.perf_counter()
            r = await c.post("/v1/completions", json=body)
            out.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
    return out


async def stream_times(base: str, tokens: int, n: int) -> tuple[list[float], list[float]]:
    """Per stream: total duration, and mean gap between chunks."""
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": tokens, "stream": True}
    totals, gaps = [], []
    async with httpx.AsyncClient(base_url=base, timeout=60) as c:
        for i in range(n + 2):
            t0 = time.perf_counter()
            last = t0
            g: list[float] = []
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for _chunk in r.aiter_raw():
                    now = time.perf_counter()
                    g.append(now - last)
                    last = now
            if i >= 2:  # first two warm up
                totals.append(last - t0)
                gaps.append(statistics.fmean(g[1:]) if len(g) > 1 else 0.0)
    return totals, gaps


async def throughput(c: httpx.AsyncClient, concurrency: int, seconds: float) -> tuple[float, int]:
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 1}
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            r = await c.post("/v1/completions", json=body)
            if r.status_code == 200:
                done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0), done


def hot_path(tree: Path) -> dict[str, float] | None:
    """benchmarks/sidecar_hot_path.py for a tree that has the lean front (None for one that has not)."""
    if not (tree / "src" / "fleethealth" / "serve" / "front.py").exists():
        return None
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sidecar_hot_path.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(f"# hot path in {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


HIDE_FAST = """raise ImportError('hidden by bench_sidecar: the old sidecar runs as it shipped')\n"""


def start_sidecar(src: Path, upstream: str, port: int, hide_fast: bool, tmp: Path) -> subprocess.Popen[bytes]:
    path = [str(src)]
    if hide_fast:  # modules that raise ImportError shadow uvloop and httptools: uvicorn falls back to asyncio+h11
        shim = tmp / "hide-fast"
        shim.mkdir(exist_ok=True)
        for mod in ("uvloop", "httptools"):
            (shim / f"{mod}.py").write_text(HIDE_FAST)
        path.insert(0, str(shim))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]),
           "FLEETHEALTH_ADMIN_TOKEN": "bench"}
    return subprocess.Popen(
        [sys.executable, "-m", "fleethealth.cli.main", "sidecar", "--upstream", upstream,
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning", "--max-concurrency", "1024"], env=env, cwd=tmp)


def measure(base: str, pid: int | None, engine_pid: int, a: argparse.Namespace) -> dict[str, float]:
    """One round of every figure for one target (pid None: the engine directly)."""
    me = pid or engine_pid
    out: dict[str, float] = {}
    c0 = cpu_s(me), cpu_s(engine_pid)
    lat = asyncio.run(sequential_latency(base, a.requests))
    c1 = cpu_s(me), cpu_s(engine_pid)
    n_req = a.requests + 20
    out["lat_med_ms"] = 1e3 * statistics.median(lat)
    out["lat_p99_ms"] = 1e3 * pct(lat, 0.99)
    out["req_cpu_ms"] = 1e3 * (sum(c1[0]) - sum(c0[0])) / n_req
    out["req_user_ms"] = 1e3 * (c1[0][0] - c0[0][0]) / n_req
    out["req_sys_ms"] = 1e3 * (c1[0][1] - c0[0][1]) / n_req
    out["req_engine_cpu_ms"] = 1e3 * (sum(c1[1]) - sum(c0[1])) / n_req
    tot, gap = asyncio.run(stream_times(base, a.tokens, a.streams))
    c2 = cpu_s(me), cpu_s(engine_pid)
    n_tok = a.tokens * (a.streams + 2)
    out["tok_cpu_us"] = 1e6 * (sum(c2[0]) - sum(c1[0])) / n_tok
    out["tok_user_us"] = 1e6 * (c2[0][0] - c1[0][0]) / n_tok
    out["tok_sys_us"] = 1e6 * (c2[0][1] - c1[0][1]) / n_tok
    out["tok_engine_cpu_us"] = 1e6 * (sum(c2[1]) - sum(c1[1])) / n_tok
    out["stream_ms"] = 1e3 * statistics.median(tot)
    out["gap_us"] = 1e6 * statistics.median(gap)
    return out


def interleaved_latency(targets: dict[str, tuple[str, int | None]], n: int) -> dict[str, dict[str, float]]:
    """Sequential latency, interleaved: request i goes to every target in turn (the order rotating), so the
    other tenants' load at that moment weighs on all targets alike; one warm client per target."""
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 1}
    names = list(targets)
    lat: dict[str, list[float]] = {k: [] for k in names}

    async def run() -> None:
        clients = {k: httpx.AsyncClient(base_url=base, timeout=30) for k, (base, _) in targets.items()}
        try:
            for c in clients.values():
                for _ in range(20):
                    await c.post("/v1/completions", json=body)
            for i in range(n):
                for k in names[i % len(names):] + names[:i % len(names)]:
                    t0 = time.perf_counter()
                    r = await clients[k].post("/v1/completions", json=body)
                    lat[k].append(time.perf_counter() - t0)
                    assert r.status_code == 200, r.text
        finally:
            for c in clients.values():
                await c.aclose()

    asyncio.run(run())
    return {k: {"lat_med_ms": 1e3 * statistics.median(v), "lat_p99_ms": 1e3 * pct(v, 0.99)} for k, v in lat.items()}


def throughput_slices(targets: dict[str, tuple[str, int | None]], engine_pid: int,
                      a: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Throughput, interleaved: every target gets ``--slices`` short runs, one after the other in turn, so a
    change in the other tenants' load hits all of them alike; each target keeps one warm client (connections
    are not reopened per slice). Besides requests per second, the CPU the whole chain spent per request
    (this client, the sidecar if any, the engine): on a machine whose cores the chain saturates, throughput
    is the inverse of that, so direct's chain CPU over a target's is the throughput ratio that the load of
    other tenants cannot blur."""
    rps: dict[str, list[float]] = {k: [] for k in targets}
    cpu: dict[str, list[float]] = {k: [] for k in targets}
    slice_s = a.seconds / a.slices
    limits = httpx.Limits(max_connections=a.concurrency, max_keepalive_connections=a.concurrency)

    async def run() -> None:
        clients = {k: httpx.AsyncClient(base_url=base, timeout=30, limits=limits) for k, (base, _) in targets.items()}
        try:
            for c in clients.values():  # open the connections
                await throughput(c, a.concurrency, 0.2)
            for _ in range(a.slices):
                for name, (_, pid) in targets.items():
                    procs = [os.getpid(), engine_pid] + ([pid] if pid is not None else [])
                    c0 = [sum(cpu_s(p)) for p in procs]
                    r, n = await throughput(clients[name], a.concurrency, slice_s)
                    c1 = [sum(cpu_s(p)) for p in procs]
                    rps[name].append(r)
                    cpu[name].append(1e3 * (sum(c1) - sum(c0)) / max(1, n))
        finally:
            for c in clients.values():
                await c.aclose()

    asyncio.run(run())
    return {k: {"rps": statistics.median(rps[k]), "chain_cpu_ms": statistics.median(cpu[k])} for k in targets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per target; medians reported")
    ap.add_argument("--slices", type=int, default=6, help="interleaved throughput runs per target (of --seconds)")
    ap.add_argument("--old", type=Path, default=None, help="tree of an earlier commit to measure beside this one")
    ap.add_argument("--old-h11", action="store_true", help="hide uvloop/httptools from the old sidecar")
    a = ap.parse_args()

    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    ep = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    engine = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_engine.py"), "--port", str(ep)], env=env)
    direct = f"http://127.0.0.1:{ep}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    try:
        if a.old is not None:
            ports["old"] = free_port()
            procs["old"] = start_sidecar(a.old.resolve() / "src", direct, ports["old"], a.old_h11, tmp)
        ports["new"] = free_port()
        procs["new"] = start_sidecar(ROOT / "src", direct, ports["new"], False, tmp)
        wait_ok(direct + "/health")
        for port in ports.values():
            wait_ok(f"http://127.0.0.1:{port}/readyz")
        print(f"# fleethealth sidecar benchmark ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
              f"{a.requests} sequential requests, {a.streams} streams of {a.tokens} tokens, "
              f"{a.concurrency} concurrent for {a.seconds:g} s; {a.rounds} alternating rounds, medians)")
        results: dict[str, list[dict[str, float]]] = {"direct": [], **{k: [] for k in procs}}
        for _ in range(a.rounds):
            results["direct"].append(measure(direct, None, engine.pid, a))
            for name in procs:
                results[name].append(measure(f"http://127.0.0.1:{ports[name]}", procs[name].pid, engine.pid, a))
        med = {k: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for k, rs in results.items()}
        targets: dict[str, tuple[str, int | None]] = {"direct": (direct, None)}
        targets.update({n: (f"http://127.0.0.1:{ports[n]}", procs[n].pid) for n in procs})
        for k, v in throughput_slices(targets, engine.pid, a).items():
            med[k].update(v)
        for k, v in interleaved_latency(targets, a.requests * a.rounds).items():
            med[k].update(v)  # replaces the per-round latencies: interleaved is the figure that holds
        d = med["direct"]
        rows: list[tuple[str, Any]] = [
            ("added median latency per request (ms)", lambda m: f"{m['lat_med_ms'] - d['lat_med_ms']:.2f}"),
            ("median latency / p99 (ms)", lambda m: f"{m['lat_med_ms']:.2f} / {m['lat_p99_ms']:.2f}"),
            ("sidecar CPU per request (ms)", lambda m: f"{m['req_cpu_ms']:.3f}"),
            ("  of which user / system (ms)", lambda m: f"{m['req_user_ms']:.3f} / {m['req_sys_ms']:.3f}"),
            ("sidecar CPU per streamed token (us)", lambda m: f"{m['tok_cpu_us']:.1f}"),
            ("  of which user / system (us)", lambda m: f"{m['tok_user_us']:.1f} / {m['tok_sys_us']:.1f}"),
            ("added per streamed token, wall (us)",
             lambda m: f"{1e3 * (m['stream_ms'] - d['stream_ms']) / a.tokens:.1f}"),
            ("throughput (req/s, % of direct)", lambda m: f"{m['rps']:.0f} ({100 * m['rps'] / d['rps']:.0f}%)"),
            ("chain CPU per request (ms, direct/this)",
             lambda m: f"{m['chain_cpu_ms']:.3f} ({100 * d['chain_cpu_ms'] / m['chain_cpu_ms']:.0f}%)"),
        ]
        names = list(procs)
        hot = {n: hot_path(a.old.resolve() if n == "old" and a.old is not None else ROOT) for n in names}
        rows += [
            ("  sidecar's own Python, hot: request (us)", lambda m: m["hot_request"]),
            ("  sidecar's own Python, hot: chunk (us)", lambda m: m["hot_chunk"]),
        ]
        for n in names:
            h = hot[n]
            med[n]["hot_request"] = "-" if h is None else f"{h['hot_request_us']:.1f}"  # type: ignore[assignment]
            med[n]["hot_chunk"] = "-" if h is None else f"{h['hot_chunk_us']:.2f}"  # type: ignore[assignment]
        print(f"{'':40s}" + "".join(f"{n:>18s}" for n in names))
        for label, fmt in rows:
            print(f"{label:40s}" + "".join(f"{fmt(med[n]):>18s}" for n in names))
        print(f"direct to the engine: median latency {d['lat_med_ms']:.2f} ms, engine CPU per request "
              f"{d['req_engine_cpu_ms']:.3f} ms, per streamed token {d['tok_cpu_us']:.1f} us, "
              f"{d['rps']:.0f} req/s, chain CPU (client + engine) {d['chain_cpu_ms']:.3f} ms per request")
    finally:
        for p in (*procs.values(), engine):
            p.send_signal(signal.SIGTERM)
        for p in (*procs.values(), engine):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()

"""What the sidecar costs: added latency per request and per streamed token, and throughput in requests per
second, against a direct connection to the test engine.

Runs the test engine (tests/fake_engine.py, zero token delay so the engine is not the bottleneck) and the
sidecar (`fleethealth sidecar`) as separate processes on loopback, and drives both from this process with
httpx. Usage: ``python benchmarks/bench_sidecar.py [--requests 300] [--tokens 200] [--concurrency 16]
[--seconds 5] [--old /tmp/old-tree] [--floor] [--rt] [--cpus 1:1:1]``. Numbers depend on the machine and its load; the report prints what it
measured.

With ``--old PATH`` (a worktree of an earlier commit, e.g. ``git worktree add /tmp/old HEAD~1``) a second
sidecar runs from that tree's src/ against the same engine, and every figure is measured for old and new
alternately (old, new, old, new over ``--rounds``), printed side by side; throughput is measured in
``--slices`` short runs per target, interleaved (direct, old, new, direct, ...), and latency in single requests
interleaved the same way. ``--old-h11`` hides uvloop and
httptools from the old sidecar (for trees before they became dependencies, which ran on asyncio + h11).

Latency and throughput are wall-clock figures and on a shared machine mostly measure the other tenants; the
CPU figures (from /proc, schedstat at ns precision) hold. Three ways to make the wall figures about this
chain: the latency rows also show each request's wall time less the run-queue wait its chain accrued (time
a process of it was runnable while another tenant held the CPU); ``--rt`` runs the chain SCHED_FIFO during
the latency phase (sequential requests: one core busy at a time, so the others keep one core; the kernel's
RT throttle keeps 5% for them anyway); ``--cpus CLIENT:SIDECAR:ENGINE`` pins every process the same way
for direct and via a sidecar (``1:1:1``: the whole chain on one core, so no wakeup crosses CPUs, which on
this VM costs an inter-processor interrupt each). ``--floor`` adds a bare uvloop byte relay (no parsing,
nothing recorded) as a third target: what any user-space Python proxy costs here, the floor the sidecar is
measured against. "chain CPU per request" is the CPU that client, sidecar and engine together
spent per request under concurrency: when the chain saturates the cores, direct's chain CPU over a target's
is the throughput ratio, without the other tenants' noise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
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


def sched(pid: int, tid: int | None = None) -> tuple[int, int]:
    """(ran, waited) nanoseconds of one thread (a process's main thread by default), from its schedstat: CPU
    time at ns precision, and the time it was runnable but waited for a CPU. On a shared machine that wait is
    mostly other tenants' work: it is what separates this chain's latency from theirs."""
    path = f"/proc/{pid}/task/{tid}/schedstat" if tid is not None else f"/proc/{pid}/schedstat"
    ran, waited, _ = Path(path).read_text().split()
    return int(ran), int(waited)


def sched_all(pid: int) -> tuple[int, int]:
    """``sched`` summed over every thread of a process (its CPU figures: thread pools included)."""
    ran = waited = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            r, w = sched(pid, int(tid))
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        ran += r
        waited += w
    return ran, waited


def set_threads(pid: int, fn: Any) -> None:
    """Applies ``fn(tid)`` to every thread of a process (affinity and scheduling policy are per thread)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            fn(int(tid))


def realtime(pids: list[int], on: bool) -> None:
    """SCHED_FIFO priority 1 for every thread of ``pids`` (``--rt``), or back to SCHED_OTHER (nice kept)."""
    policy, prio = (os.SCHED_FIFO, 1) if on else (os.SCHED_OTHER, 0)
    for pid in pids:
        set_threads(pid, lambda tid: os.sched_setscheduler(tid, policy, os.sched_param(prio)))


def run_chain(run: Callable[[], Coroutine[Any, Any, None]], targets: dict[str, tuple[str, int | None]],
              engine_pid: int, rt: bool) -> None:
    """Runs ``run()`` to its end; with ``rt`` the whole chain (this process, the engine, every target's
    sidecar) runs SCHED_FIFO meanwhile (``realtime``) and goes back to SCHED_OTHER however it ends."""
    everyone = sorted({os.getpid(), engine_pid, *(pid for _, pid in targets.values() if pid is not None)})
    if rt:
        realtime(everyone, True)
    try:
        asyncio.run(run())
    finally:
        if rt:
            realtime(everyone, False)


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


class _RelayIn(asyncio.Protocol):
    """The floor (``--floor``): a client connection relayed byte for byte to its own engine connection, both
    kept alive; no parsing, no admission, nothing recorded. What any user-space proxy in Python on uvloop
    costs on this machine: the reads, the writes, the wakeups."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.out: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        out, _ = await loop.create_connection(lambda: _RelayOut(self.transport), "127.0.0.1", self.upstream_port)
        self.out = out
        if self.pending:
            out.write(b"".join(self.pending))
            self.pending = []

    def data_received(self, data: bytes) -> None:
        if self.out is None:
            self.pending.append(data)
        else:
            self.out.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.out is not None:
            self.out.close()


class _RelayOut(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


def relay(listen_port: int, upstream_port: int) -> None:
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _RelayIn(upstream_port), "127.0.0.1", listen_port, backlog=1024)
        await server.serve_forever()

    uvloop.run(serve())


def start_relay(listen_port: int, upstream_port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--relay",
                             f"{listen_port}:{upstream_port}"])


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
    s0 = sched_all(me)[0], sched_all(engine_pid)[0]
    lat = asyncio.run(sequential_latency(base, a.requests))
    c1 = cpu_s(me), cpu_s(engine_pid)
    s1 = sched_all(me)[0], sched_all(engine_pid)[0]
    n_req = a.requests + 20
    out["lat_med_ms"] = 1e3 * statistics.median(lat)
    out["lat_p99_ms"] = 1e3 * pct(lat, 0.99)
    # totals at ns precision (schedstat); the user/system split from /proc/PID/stat is tick-sampled
    out["req_cpu_ms"] = 1e-6 * (s1[0] - s0[0]) / n_req
    out["req_user_ms"] = 1e3 * (c1[0][0] - c0[0][0]) / n_req
    out["req_sys_ms"] = 1e3 * (c1[0][1] - c0[0][1]) / n_req
    out["req_engine_cpu_ms"] = 1e-6 * (s1[1] - s0[1]) / n_req
    tot, gap = asyncio.run(stream_times(base, a.tokens, a.streams))
    c2 = cpu_s(me), cpu_s(engine_pid)
    s2 = sched_all(me)[0], sched_all(engine_pid)[0]
    n_tok = a.tokens * (a.streams + 2)
    out["tok_cpu_us"] = 1e-3 * (s2[0] - s1[0]) / n_tok
    out["tok_user_us"] = 1e6 * (c2[0][0] - c1[0][0]) / n_tok
    out["tok_sys_us"] = 1e6 * (c2[0][1] - c1[0][1]) / n_tok
    out["tok_engine_cpu_us"] = 1e-3 * (s2[1] - s1[1]) / n_tok
    out["stream_ms"] = 1e3 * statistics.median(tot)
    out["gap_us"] = 1e6 * statistics.median(gap)
    return out


def interleaved_latency(targets: dict[str, tuple[str, int | None]], engine_pid: int, n: int,
                        rt: bool) -> dict[str, dict[str, float]]:
    """Sequential latency, interleaved: request i goes to every target in turn (the order rotating), so the
    other tenants' load at that moment weighs on all targets alike; one warm client per target.

    Besides the wall time, each request's wall time less the run-queue wait its chain (this client's thread,
    the sidecar if any, the engine) accrued meanwhile: the time one of them was runnable but another tenant
    held the CPU. In a sequential request at most one process of the chain works at a time, so what is left
    is the chain's own latency: its CPU, the system calls and the wakeups (a lower bound: two processes of
    the chain that wait at once are both subtracted, so on a crowded machine it can read below the
    uncontended figure, even below direct's). ``rt``: the chain runs SCHED_FIFO
    for this phase (the other tenants cannot delay it; sequential, so it holds one core at a time)."""
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 1}
    names = list(targets)
    lat: dict[str, list[float]] = {k: [] for k in names}
    net: dict[str, list[float]] = {k: [] for k in names}
    me, tid = os.getpid(), threading.get_native_id()
    chains = {k: [engine_pid] + ([pid] if pid is not None else []) for k, (_, pid) in targets.items()}

    def waited(pids: list[int]) -> int:
        return sched(me, tid)[1] + sum(sched(p)[1] for p in pids)

    async def run() -> None:
        clients = {k: httpx.AsyncClient(base_url=base, timeout=30) for k, (base, _) in targets.items()}
        try:
            for c in clients.values():
                for _ in range(20):
                    await c.post("/v1/completions", json=body)
            for i in range(n):
                for k in names[i % len(names):] + names[:i % len(names)]:
                    w0 = waited(chains[k])
                    t0 = time.perf_counter()
                    r = await clients[k].post("/v1/completions", json=body)
                    t1 = time.perf_counter()
                    w1 = waited(chains[k])
                    lat[k].append(t1 - t0)
                    net[k].append(max(0.0, t1 - t0 - 1e-9 * (w1 - w0)))
                    assert r.status_code == 200, r.text
        finally:
            for c in clients.values():
                await c.aclose()

    run_chain(run, targets, engine_pid, rt)
    return {k: {"lat_med_ms": 1e3 * statistics.median(v), "lat_p99_ms": 1e3 * pct(v, 0.99),
                "net_med_ms": 1e3 * statistics.median(net[k])} for k, v in lat.items()}


def throughput_slices(targets: dict[str, tuple[str, int | None]], engine_pid: int,
                      a: argparse.Namespace, rt: bool) -> dict[str, dict[str, float]]:
    """Throughput, interleaved: every target gets ``--slices`` short runs, one after the other in turn, so a
    change in the other tenants' load hits all of them alike; each target keeps one warm client (connections
    are not reopened per slice). Figures: requests per second (median), the ratio to direct as the median of
    each slice against direct's slice in the same turn (adjacent in time), and the CPU the whole chain spent
    per request (this client, the sidecar if any, the engine; schedstat, ns): on a machine whose cores the
    chain saturates, throughput is the inverse of that, so direct's chain CPU over a target's is the
    throughput ratio that the load of other tenants cannot blur. ``rt``: the chain runs SCHED_FIFO (only
    when it is pinned to fewer CPUs than the machine has, so the other tenants keep the rest)."""
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
                    c0 = [sched_all(p)[0] for p in procs]
                    r, n = await throughput(clients[name], a.concurrency, slice_s)
                    c1 = [sched_all(p)[0] for p in procs]
                    rps[name].append(r)
                    cpu[name].append(1e-6 * (sum(c1) - sum(c0)) / max(1, n))
        finally:
            for c in clients.values():
                await c.aclose()

    run_chain(run, targets, engine_pid, rt)
    d_rps, d_cpu = rps["direct"], cpu["direct"]
    return {k: {"rps": statistics.median(rps[k]), "chain_cpu_ms": statistics.median(cpu[k]),
                "rps_ratio": statistics.median(x / y for x, y in zip(rps[k], d_rps, strict=True)),
                "cpu_ratio": statistics.median(y / x for x, y in zip(cpu[k], d_cpu, strict=True))}
            for k in targets}


def chain_cpus(spec: str) -> set[int]:
    return {int(c) for part in spec.split(":") for c in part.split(",")}


def pin(pids: dict[str, list[int]], spec: str) -> None:
    """``--cpus CLIENT:SIDECAR:ENGINE`` (e.g. 0:1:1): every thread of each pinned to that CPU list."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise SystemExit(f"--cpus {spec!r}: expected CLIENT:SIDECAR:ENGINE, e.g. 0:1:1 or 0:0,1:1")
    for role, cpus in zip(("client", "sidecar", "engine"), parts, strict=True):
        mask = {int(c) for c in cpus.split(",")}
        for pid in pids[role]:
            set_threads(pid, lambda tid, m=mask: os.sched_setaffinity(tid, m))


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
    ap.add_argument("--cpus", default=None, metavar="CLIENT:SIDECAR:ENGINE",
                    help="pin the processes (every thread) to these CPUs, e.g. 0:1:1; direct and sidecars alike")
    ap.add_argument("--floor", action="store_true",
                    help="also measure a bare uvloop byte relay (no parsing): the floor for any Python proxy")
    ap.add_argument("--relay", default=None, help=argparse.SUPPRESS)  # LISTEN:UPSTREAM, the floor's process
    ap.add_argument("--rt", action="store_true",
                    help="the chain under SCHED_FIFO (not delayed by other tenants): the latency phase, and the "
                         "throughput phase too when --cpus leaves the others a CPU (1:1:1 on 2 cores)")
    a = ap.parse_args()
    if a.relay:
        listen, upstream = a.relay.split(":")
        relay(int(listen), int(upstream))
        return

    import tempfile

    # Throughput saturates the chain's CPUs: real-time only when they leave the other tenants a CPU.
    rt_throughput = a.rt and bool(a.cpus) and len(chain_cpus(a.cpus)) < (os.cpu_count() or 1)
    rt_phases = "latency and throughput" if rt_throughput else "latency" if a.rt else "no"

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
        if a.floor:
            ports["floor"] = free_port()
            procs["floor"] = start_relay(ports["floor"], ep)
        wait_ok(direct + "/health")
        for name, port in ports.items():
            wait_ok(f"http://127.0.0.1:{port}" + ("/health" if name == "floor" else "/readyz"))
        if a.cpus:
            pin({"client": [os.getpid()], "sidecar": [p.pid for p in procs.values()], "engine": [engine.pid]},
                a.cpus)
        print(f"# fleethealth sidecar benchmark ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
              f"{a.requests} sequential requests, {a.streams} streams of {a.tokens} tokens, "
              f"{a.concurrency} concurrent for {a.seconds:g} s; {a.rounds} alternating rounds, medians; "
              f"pinned {a.cpus or 'no'}; real-time {rt_phases})")
        results: dict[str, list[dict[str, float]]] = {"direct": [], **{k: [] for k in procs}}
        for _ in range(a.rounds):
            results["direct"].append(measure(direct, None, engine.pid, a))
            for name in procs:
                results[name].append(measure(f"http://127.0.0.1:{ports[name]}", procs[name].pid, engine.pid, a))
        med = {k: {f: statistics.median(r[f] for r in rs) for f in rs[0]} for k, rs in results.items()}
        targets: dict[str, tuple[str, int | None]] = {"direct": (direct, None)}
        targets.update({n: (f"http://127.0.0.1:{ports[n]}", procs[n].pid) for n in procs})
        for k, v in throughput_slices(targets, engine.pid, a, rt_throughput).items():
            med[k].update(v)
        for k, v in interleaved_latency(targets, engine.pid, a.requests * a.rounds, a.rt).items():
            med[k].update(v)  # replaces the per-round latencies: interleaved is the figure that holds
        d = med["direct"]
        rows: list[tuple[str, Any]] = [
            ("added median latency per request (ms)", lambda m: f"{m['lat_med_ms'] - d['lat_med_ms']:.2f}"),
            ("  less run-queue wait (ms)", lambda m: f"{m['net_med_ms'] - d['net_med_ms']:.2f}"),
            ("median latency / p99 (ms)", lambda m: f"{m['lat_med_ms']:.2f} / {m['lat_p99_ms']:.2f}"),
            ("sidecar CPU per request (ms)", lambda m: f"{m['req_cpu_ms']:.3f}"),
            ("  of which user / system (ms)", lambda m: f"{m['req_user_ms']:.3f} / {m['req_sys_ms']:.3f}"),
            ("sidecar CPU per streamed token (us)", lambda m: f"{m['tok_cpu_us']:.1f}"),
            ("  of which user / system (us)", lambda m: f"{m['tok_user_us']:.1f} / {m['tok_sys_us']:.1f}"),
            ("added per streamed token, wall (us)",
             lambda m: f"{1e3 * (m['stream_ms'] - d['stream_ms']) / a.tokens:.1f}"),
            ("throughput (req/s, % of direct)", lambda m: f"{m['rps']:.0f} ({100 * m['rps_ratio']:.0f}%)"),
            ("chain CPU per request (ms, direct/this)",
             lambda m: f"{m['chain_cpu_ms']:.3f} ({100 * m['cpu_ratio']:.0f}%)"),
        ]
        names = list(procs)
        hot = {n: None if n == "floor" else hot_path(a.old.resolve() if n == "old" and a.old is not None else ROOT)
               for n in names}
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
        print(f"direct to the engine: median latency {d['lat_med_ms']:.2f} ms ({d['net_med_ms']:.2f} less run-queue "
              f"wait), engine CPU per request "
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

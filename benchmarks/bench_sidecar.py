"""What the sidecar costs: added latency per request and per streamed token, and throughput in requests per
second, against a direct connection to the test engine.

Runs the test engine (tests/fake_engine.py, zero token delay so the engine is not the bottleneck) and the
sidecar (`fleethealth sidecar`) as separate processes on loopback, and drives both from this process with
httpx. Usage: ``python benchmarks/bench_sidecar.py [--requests 300] [--tokens 200] [--concurrency 16]
[--seconds 5]``. Numbers depend on the machine and its load; the report prints what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


async def throughput(base: str, concurrency: int, seconds: float) -> float:
    body = {"model": "fake-model", "prompt": "hello", "max_tokens": 1}
    done = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as c:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                r = await c.post("/v1/completions", json=body)
                if r.status_code == 200:
                    done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--streams", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()

    ep, sp = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    engine = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake_engine.py"), "--port", str(ep)], env=env)
    side = subprocess.Popen(
        [sys.executable, "-m", "fleethealth.cli.main", "sidecar", "--upstream", f"http://127.0.0.1:{ep}",
         "--listen", f"127.0.0.1:{sp}", "--log-level", "warning", "--max-concurrency", "1024"],
        env={**env, "FLEETHEALTH_ADMIN_TOKEN": "bench"})
    direct, proxied = f"http://127.0.0.1:{ep}", f"http://127.0.0.1:{sp}"
    try:
        wait_ok(direct + "/health")
        wait_ok(proxied + "/readyz")
        print(f"# fleethealth sidecar benchmark ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})")
        lat_d = asyncio.run(sequential_latency(direct, a.requests))
        c0 = cpu_s(side.pid), cpu_s(engine.pid)
        lat_p = asyncio.run(sequential_latency(proxied, a.requests))
        c1 = cpu_s(side.pid), cpu_s(engine.pid)
        n_req = a.requests + 20
        print(f"request latency (max_tokens=1, {a.requests} sequential): direct median {1e3 * statistics.median(lat_d):.2f} ms "
              f"p99 {1e3 * pct(lat_d, 0.99):.2f} ms; via sidecar median {1e3 * statistics.median(lat_p):.2f} ms "
              f"p99 {1e3 * pct(lat_p, 0.99):.2f} ms; added median {1e3 * (statistics.median(lat_p) - statistics.median(lat_d)):.2f} ms")
        print(f"CPU per proxied request (ms): sidecar {per(c0[0], c1[0], n_req, 1e3)}; "
              f"engine {per(c0[1], c1[1], n_req, 1e3)} ({n_req} requests)")
        tot_d, gap_d = asyncio.run(stream_times(direct, a.tokens, a.streams))
        c2 = cpu_s(side.pid), cpu_s(engine.pid)
        tot_p, gap_p = asyncio.run(stream_times(proxied, a.tokens, a.streams))
        c3 = cpu_s(side.pid), cpu_s(engine.pid)
        n_tok = a.tokens * (a.streams + 2)
        print(f"CPU per proxied streamed token (us): sidecar {per(c2[0], c3[0], n_tok, 1e6)}; "
              f"engine {per(c2[1], c3[1], n_tok, 1e6)}")
        per_tok = (statistics.median(tot_p) - statistics.median(tot_d)) / a.tokens
        print(f"streaming ({a.tokens} tokens, {a.streams} streams): direct median {1e3 * statistics.median(tot_d):.1f} ms/stream, "
              f"via sidecar {1e3 * statistics.median(tot_p):.1f} ms/stream; added per token {1e6 * per_tok:.1f} us "
              f"(mean chunk gap direct {1e6 * statistics.median(gap_d):.1f} us, via sidecar {1e6 * statistics.median(gap_p):.1f} us)")
        rps_d = asyncio.run(throughput(direct, a.concurrency, a.seconds))
        rps_p = asyncio.run(throughput(proxied, a.concurrency, a.seconds))
        print(f"throughput (max_tokens=1, {a.concurrency} concurrent, {a.seconds:g} s): direct {rps_d:.0f} req/s, "
              f"via sidecar {rps_p:.0f} req/s ({100 * rps_p / rps_d:.0f}% of direct)")
    finally:
        for p in (side, engine):
            p.send_signal(signal.SIGTERM)
        for p in (side, engine):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()

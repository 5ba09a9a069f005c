"""Real servers for the source and controller tests: a Prometheus (Debian's binary) on a free loopback port,
and a tiny exporter built on prometheus-client that serves dcgm-exporter and vLLM series.

Prometheus gets a temp config and TSDB, scrape_interval 1s; we poll its readiness and the first scrape
instead of sleeping. The exporter serves the classic text format 0.0.4 (prometheus-client's
``generate_latest``) so ``vllm:`` names survive; its series are mutable so a test can inject a fault
(an Xid, a GPU that falls off the bus) while Prometheus scrapes it.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from act_support import free_port
from proc_support import stop_process

PROMETHEUS = shutil.which("prometheus")


DCGM_GAUGES = {
    "DCGM_FI_DEV_GPU_TEMP": 55.0,
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_POWER_USAGE": 400.0,
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
}
DCGM_COUNTERS = {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0}


class FakeFleet(Collector):
    """Mutable dcgm-exporter-like series for a few nodes of N GPUs (thread-safe)."""

    def __init__(self, nodes: Mapping[str, int], model: str = "NVIDIA H100 80GB HBM3") -> None:
        self.lock = threading.Lock()
        self.model = model
        self.gpus: dict[str, set[int]] = {n: set(range(k)) for n, k in nodes.items()}
        self.overrides: dict[tuple[str, int, str], float] = {}
        self.fault_at: float | None = None

    def labels(self, node: str, gpu: int) -> dict[str, str]:
        return {
            "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
            "device": f"nvidia{gpu}", "modelName": self.model, "Hostname": node,
            "DCGM_FI_DRIVER_VERSION": "550.54.15",
        }

    def set(self, node: str, gpu: int, metric: str, value: float) -> None:
        with self.lock:
            self.overrides[(node, gpu, metric)] = value
            self.fault_at = time.time()

    def remove_gpu(self, node: str, gpu: int) -> None:
        with self.lock:
            self.gpus[node].discard(gpu)
            self.fault_at = time.time()

    def collect(self, node: str | None = None) -> Any:  # type: ignore[override]
        with self.lock:
            nodes = {n: sorted(g) for n, g in self.gpus.items() if node is None or n == node}
            ov = dict(self.overrides)
        for metric, base in DCGM_GAUGES.items():
            fam = GaugeMetricFamily(metric, metric, labels=list(self.labels("x", 0)))
            for n, gs in nodes.items():
                for g in gs:
                    lab = self.labels(n, g)
                    fam.add_metric(list(lab.values()), ov.get((n, g, metric), base + (0.1 * g if metric.endswith('TEMP') else 0)))
            yield fam
        for metric, base in DCGM_COUNTERS.items():
            # CounterMetricFamily would append _total; dcgm-exporter's counters keep their own names.
            fam = GaugeMetricFamily(metric, metric, labels=list(self.labels("x", 0)))
            fam.type = "counter"
            for n, gs in nodes.items():
                for g in gs:
                    fam.add_metric(list(self.labels(n, g).values()), ov.get((n, g, metric), base))
            yield fam
        info = GaugeMetricFamily("fleethealth_node_info", "node metadata", labels=["node", "pool", "tp_group"])
        for i, n in enumerate(nodes):
            info.add_metric([n, "pool-a", f"tp{i // 2}"], 1.0)
        yield info
        vllm = CounterMetricFamily("vllm:num_preemptions", "preemptions", labels=["model_name", "replica"])
        vllm.add_metric(["llama", "r0"], 0.0)
        yield vllm


class _NodeView(Collector):
    def __init__(self, fleet: FakeFleet, node: str | None) -> None:
        self.fleet, self.node = fleet, node

    def collect(self) -> Any:
        return self.fleet.collect(self.node)


class ExporterServer:
    """Serves /metrics (all nodes) and /metrics/<node> in the classic text format. ``hang`` makes every
    request sleep (a stuck exporter); ``fail`` answers 500."""

    def __init__(self, fleet: FakeFleet) -> None:
        self.fleet = fleet
        self.hang_s = 0.0
        self.fail = False
        self.lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0  # the most requests served at once: shows a client's concurrency
        self.port = free_port()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                with outer.lock:
                    outer.inflight += 1
                    outer.max_inflight = max(outer.max_inflight, outer.inflight)
                try:
                    self._get()
                finally:
                    with outer.lock:
                        outer.inflight -= 1

            def _get(self) -> None:
                if outer.hang_s:
                    time.sleep(outer.hang_s)
                if outer.fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                parts = self.path.strip("/").split("/")
                if parts[0] != "metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                node = parts[1] if len(parts) > 1 else None
                reg = CollectorRegistry()
                reg.register(_NodeView(outer.fleet, node))
                body = generate_latest(reg)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ExporterServer:
        self.thread.start()
        return self

    def __exit__(self, *a: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class PrometheusServer:
    """A real Prometheus scraping the given targets every second. ``targets``: (host:port, path, labels)."""

    def __init__(self, targets: list[tuple[str, str, dict[str, str]]], scrape_interval_s: float = 1.0,
                 http_sd: list[str] | None = None) -> None:
        if PROMETHEUS is None:
            raise RuntimeError("prometheus binary not installed (apt-get install -y prometheus)")
        self.dir = Path(tempfile.mkdtemp(prefix="fh-prom-"))
        self.port = free_port()
        lines = [
            "global:",
            f"  scrape_interval: {scrape_interval_s:g}s",
            f"  scrape_timeout: {scrape_interval_s:g}s",
            "scrape_configs:",
        ]
        for i, (addr, path, labels) in enumerate(targets):
            lab = "".join(f"\n          {k}: '{v}'" for k, v in labels.items())
            lines += [
                f"  - job_name: t{i}",
                f"    metrics_path: {path}",
                # classic text first: keeps vllm: names (prometheus-client rewrites them in OpenMetrics)
                "    static_configs:",
                f"      - targets: ['{addr}']" + (f"\n        labels:{lab}" if labels else ""),
            ]
        for i, url in enumerate(http_sd or []):
            lines += [f"  - job_name: sd{i}", "    http_sd_configs:", f"      - url: '{url}'",
                      "        refresh_interval: 1s"]
        (self.dir / "prometheus.yml").write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusServer:
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [
                PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=(self.dir / "log.txt").open("wb"), stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 20
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited: " + (self.dir / "log.txt").read_text()[-2000:])
            time.sleep(0.05)
        raise RuntimeError("prometheus not ready after 20 s")

    def wait_for(self, query: str, timeout_s: float = 20.0, min_results: int = 1) -> float:
        """Poll until ``query`` returns at least ``min_results`` series; returns seconds waited."""
        t0 = time.time()
        while time.time() - t0 < timeout_s:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = httpx.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=2).json()
                if r.get("status") == "success" and len(r["data"]["result"]) >= min_results:
                    return time.time() - t0
            time.sleep(0.1)
        raise TimeoutError(f"{query} had no {min_results} results within {timeout_s} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc, self.dir)


@contextlib.contextmanager
def prometheus(targets: list[tuple[str, str, dict[str, str]]], scrape_interval_s: float = 1.0,
               http_sd: list[str] | None = None) -> Iterator[PrometheusServer]:
    srv = PrometheusServer(targets, scrape_interval_s, http_sd)
    try:
        yield srv.start()
    finally:
        srv.stop()

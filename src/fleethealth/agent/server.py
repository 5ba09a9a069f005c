"""The agent: collect NVML and kernel-log signals every interval, serve the latest page on /metrics.

Collection runs on its own thread at a fixed interval (as dcgm-exporter does), so a scrape never waits on
NVML and many scrapers cost one collection. /healthz answers 200 while collections are recent (within
three intervals) and 503 otherwise, so a wedged NVML shows up as an unhealthy exporter, not stale numbers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fleethealth.agent.exposition import CONTENT_TYPE, render_exposition
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder, merge_snapshots
from fleethealth.sources.kernel_log import KernelLogSource, normalize_bus_id
from fleethealth.sources.nvml import METRIC_HELP, NvmlSource

log = logging.getLogger("fleethealth.agent")

SOURCE_UP_METRIC = "fleethealth_agent_source_up"
COLLECT_SECONDS_METRIC = "fleethealth_agent_collect_seconds"
AGENT_HELP: dict[str, tuple[str, str]] = {
    **METRIC_HELP,
    SOURCE_UP_METRIC: ("gauge", "1 if the source was read without error in the last collection."),
    COLLECT_SECONDS_METRIC: ("gauge", "How long the last collection took (in s)."),
    "fleethealth_kernel_xid_total": ("counter", "NVIDIA Xid events in the kernel log read by the agent."),
    "fleethealth_kernel_sxid_total": ("counter", "NVSwitch SXid events in the kernel log read by the agent."),
    "fleethealth_kernel_gpu_fallen_off_total": ("counter", "'GPU has fallen off the bus' notices in the kernel log."),
}


class Agent:
    """Owns the sources and the latest rendered page. ``collect(now)`` is one cycle (tests call it
    directly); ``start()`` runs cycles on a thread and serves HTTP."""

    def __init__(
        self,
        nvml: NvmlSource,
        kernel_log: KernelLogSource | None = None,
        *,
        interval: float = 15.0,
        xid_hold_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml
        self.kernel_log = kernel_log
        self.interval = interval
        self.xid_hold_s = xid_hold_s
        self.clock = clock
        self._lock = threading.Lock()
        self._page = ""
        self._last_ok: float | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None
        self._reported: set[str] = set()

    # -- one collection ---------------------------------------------------------------------------------

    def _xid_gauges(self, now: float) -> Snapshot:
        """DCGM_FI_DEV_XID_ERRORS per GPU: the last Xid the kernel log showed for its bus, for
        ``xid_hold_s`` after it happened, then 0. DCGM keeps the last value for good, which would gate a
        GPU long after a reset fixed it; the exact record is the ``fleethealth_kernel_xid_total`` counter."""
        b = SnapshotBuilder()
        if self.kernel_log is None:
            return b.build(now)
        last = self.kernel_log.last_xid
        for g in self.nvml.gpus:
            bus = normalize_bus_id(g.pci_bus_id)
            e = last.get(bus) if bus is not None else None
            recent = e is not None and now - e.ts <= self.xid_hold_s
            b.add("DCGM_FI_DEV_XID_ERRORS", g.labels(self.nvml.hostname, self.nvml.driver),
                  float(e.xid) if recent and e is not None else 0.0, now)
        return b.build(now)

    def collect(self, now: float) -> Snapshot:
        started = time.perf_counter()
        parts = [self.nvml.read(now)]
        if self.kernel_log is not None:
            self.kernel_log.set_bus_map(self.nvml.bus_to_gpu())
            parts.append(self.kernel_log.read(now))
            parts.append(self._xid_gauges(now))
        meta = SnapshotBuilder()
        host = self.nvml.hostname
        for source, snap in zip(["nvml", "kernel_log"], parts, strict=False):
            up = not snap.source_errors
            meta.add(SOURCE_UP_METRIC, {"Hostname": host, "source": source}, 1.0 if up else 0.0, now)
            for err in snap.source_errors:
                if err.reason not in self._reported:  # log each distinct failure once, not every cycle
                    self._reported.add(err.reason)
                    log.warning("%s", err)
        meta.add(COLLECT_SECONDS_METRIC, {"Hostname": host}, time.perf_counter() - started, now)
        snap = merge_snapshots([*parts, meta.build(now)], at=now)
        page = render_exposition(snap, AGENT_HELP)
        with self._lock:
            self._page = page
            if not parts[0].source_errors:
                self._last_ok = now
        return snap

    def page(self) -> str:
        with self._lock:
            return self._page

    def healthy(self, now: float) -> bool:
        with self._lock:
            return self._last_ok is not None and now - self._last_ok <= 3 * self.interval

    # -- threads and HTTP ---------------------------------------------------------------------------------

    def _loop(self) -> None:
        delay = self.interval
        while not self._stop.wait(delay):
            t0 = time.monotonic()
            try:
                self.collect(self.clock())
            except Exception:  # a bug in one cycle must not kill the exporter; /healthz turns 503
                log.exception("collection failed")
            delay = max(0.0, self.interval - (time.monotonic() - t0))

    def start(self, host: str = "0.0.0.0", port: int = 9400) -> tuple[str, int]:
        """Collect once, then serve; returns the bound address (port 0 picks a free one)."""
        self.collect(self.clock())
        agent = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, agent.page().encode(), CONTENT_TYPE)
                elif path in ("/healthz", "/health"):
                    ok = agent.healthy(agent.clock())
                    self._send(200 if ok else 503, b"ok\n" if ok else b"stale\n", "text/plain")
                else:
                    self._send(404, b"not found: try /metrics\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug(format, *args)

        self._http = ThreadingHTTPServer((host, port), Handler)
        self._http.daemon_threads = True
        for target, name in ((self._http.serve_forever, "agent-http"), (self._loop, "agent-collect")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        addr = self._http.server_address
        return str(addr[0]), int(addr[1])

    def stop(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for t in self._threads:
            t.join(timeout=5)
        if self.kernel_log is not None:
            self.kernel_log.close()
        self.nvml.close()

    def request_stop(self) -> None:
        """Signal-safe: ends ``wait()``; the caller then calls ``stop()``."""
        self._stop.set()

    def wait(self) -> None:
        """Block until stopped (the CLI's foreground)."""
        while not self._stop.wait(1.0):
            pass

"""An HTTP exporter for a running simulation, so a real Prometheus (or the direct scraper) can scrape it.

One port serves every node: ``GET /metrics/<node>`` is that node's exporter page (classic text format
0.0.4, which keeps ``vllm:`` names; 503 while the node's exporter is down), ``GET /sd`` lists the targets
in Prometheus ``http_sd`` form (``__metrics_path__`` per node, ``instance`` = ``<node>:9400`` as in
recordings). Control: ``POST /control/fault`` with a fault spec as JSON (onset relative to now),
``POST /control/advance?seconds=N`` (manual clock), ``POST /control/action`` with
``{"entity", "action"}``; ``GET /control/time``, ``GET /truth``, ``GET /events?since=T``, ``GET /nodes``.

Time is simulated. With ``speed=None`` it moves only when told (tests drive it); with ``speed=S`` it runs
S times faster than the wall clock, stepping the simulation lazily when a page is asked for.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from fleethealth.sim.scenario import FaultSpec
from fleethealth.sim.simulation import Simulation

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class SimExporterServer:
    def __init__(self, sim: Simulation, host: str = "127.0.0.1", port: int = 0, speed: float | None = None) -> None:
        self.sim = sim
        self.host = host
        self.speed = speed
        self.lock = threading.RLock()
        if sim.last is None:
            sim.step()
        self._wall0 = time.monotonic()
        self._sim0 = sim.t
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> SimExporterServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="sim-exporter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        # shutdown() waits for serve_forever to notice; calling it on a server never started would hang
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> SimExporterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    # ---- clock and control ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def node_url(self, node: str) -> str:
        return f"{self.url}/metrics/{node}"

    def now(self) -> float:
        with self.lock:
            if self.speed is not None:
                target = self._sim0 + (time.monotonic() - self._wall0) * self.speed
                self.sim.advance_to(target)
            return self.sim.t

    def advance(self, seconds: float) -> float:
        with self.lock:
            self.sim.advance_to(self.sim.t + seconds)
            return self.sim.t

    def inject(self, spec: FaultSpec | dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            t = self.now()
            fault = self.sim.inject(spec, at=t)
            return {"ok": True, "fault": fault.kind, "index": fault.index, "onset": fault.onset, "end": fault.end,
                    "truth": [g.to_dict() for g in fault.truth()]}

    def render(self, node: str) -> str:
        with self.lock:
            self.now()
            return self.sim.render_node(node)

    def sd_targets(self) -> list[dict[str, Any]]:
        addr = f"{self.host}:{self.port}"
        return [
            {"targets": [addr], "labels": {"__metrics_path__": f"/metrics/{n}",
                                           "instance": f"{n}:{self.sim.SCRAPE_PORT}"}}
            for n in self.sim.fleet.nodes
        ]

    def scrape_config(self, job: str = "fleethealth-sim", interval: str = "15s") -> dict[str, Any]:
        """A Prometheus scrape_config (as a dict; dump it as YAML) that scrapes every node via /sd."""
        return {"job_name": job, "scrape_interval": interval, "honor_labels": True,
                "http_sd_configs": [{"url": f"{self.url}/sd"}]}

    # ---- HTTP ---------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet: tests and Prometheus poll a lot
                pass

            def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, code: int, obj: Any) -> None:
                self._send(code, json.dumps(obj, default=str))

            def do_GET(self) -> None:
                u = urlparse(self.path)
                q = parse_qs(u.query)
                path = u.path.rstrip("/")
                if path.startswith("/metrics/"):
                    node = path[len("/metrics/"):]
                    if node not in server.sim.fleet.nodes:
                        return self._send(404, f"no node {node}\n", "text/plain")
                    try:
                        body = server.render(node)
                    except LookupError as e:
                        return self._send(503, f"{e}\n", "text/plain")
                    return self._send(200, body, CONTENT_TYPE)
                if path == "/sd":
                    return self._json(200, server.sd_targets())
                if path == "/nodes":
                    return self._json(200, server.sim.fleet.nodes)
                if path == "/control/time":
                    return self._json(200, {"t": server.now(), "start": server.sim.start})
                if path == "/truth":
                    return self._json(200, [g.to_dict() for g in server.sim.ground_truth])
                if path == "/events":
                    with server.lock:
                        now = server.now()
                        since = float(q.get("since", [server.sim.start - 1])[0])
                        evs = server.sim.events(now, since=since)
                    return self._json(200, [e.to_dict() for e in evs])
                if path in ("", "/healthz"):
                    return self._send(200, "ok\n", "text/plain")
                return self._send(404, "not found\n", "text/plain")

            def do_POST(self) -> None:
                u = urlparse(self.path)
                q = parse_qs(u.query)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else {}
                except json.JSONDecodeError as e:
                    return self._json(400, {"ok": False, "error": f"not JSON: {e}"})
                try:
                    if u.path == "/control/fault":
                        return self._json(200, server.inject(body))
                    if u.path == "/control/advance":
                        secs = float(q.get("seconds", [body.get("seconds", server.sim.step_s)])[0])
                        return self._json(200, {"ok": True, "t": server.advance(secs)})
                    if u.path == "/control/action":
                        with server.lock:
                            ended = server.sim.apply_action(str(body["entity"]), str(body["action"]), server.now())
                        return self._json(200, {"ok": True, "ended": ended})
                except (ValueError, KeyError, TypeError) as e:
                    return self._json(400, {"ok": False, "error": str(e)})
                return self._send(404, "not found\n", "text/plain")

        return Handler

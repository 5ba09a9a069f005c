"""Real servers for the actuator tests: Alertmanager (Debian's binary) delivering to a webhook receiver on
loopback. Free ports, temp dirs, readiness polled (never slept)."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from proc_support import stop_process

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(pred: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # the server may not be up yet
            last_exc = e
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what or pred}: {last_exc}")


class Webhook:
    """Collects every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.port = free_port()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n) or b"{}")
                with outer.lock:
                    outer.received.append(body)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def alerts(self) -> list[dict[str, Any]]:
        with self.lock:
            return [a for body in self.received for a in body.get("alerts", [])]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class AlertmanagerServer:
    def __init__(self, webhook_url: str) -> None:
        if ALERTMANAGER is None:
            raise RuntimeError("alertmanager not installed (apt-get install -y prometheus-alertmanager)")
        self.dir = Path(tempfile.mkdtemp(prefix="fh-am-"))
        self.port = free_port()
        (self.dir / "am.yml").write_text(
            "route:\n  receiver: hook\n  group_by: ['alertname']\n  group_wait: 100ms\n  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            f"receivers:\n  - name: hook\n    webhook_configs:\n      - url: '{webhook_url}'\n"
            "        send_resolved: true\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> AlertmanagerServer:
        assert ALERTMANAGER is not None
        self.proc = subprocess.Popen(
            [ALERTMANAGER, f"--config.file={self.dir / 'am.yml'}", f"--storage.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="],
            stdout=(self.dir / "log.txt").open("wb"), stderr=subprocess.STDOUT)
        wait_until(lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200, 20,
                   what="alertmanager ready")
        return self

    def alerts(self) -> list[dict[str, Any]]:
        return list(httpx.get(f"{self.url}/api/v2/alerts", timeout=5).json())

    def stop(self) -> None:
        stop_process(self.proc, self.dir)


@contextlib.contextmanager
def alertmanager_with_webhook() -> Iterator[tuple[AlertmanagerServer, Webhook]]:
    hook = Webhook()
    am = AlertmanagerServer(hook.url)
    try:
        yield am.start(), hook
    finally:
        am.stop()
        hook.close()

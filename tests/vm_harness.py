"""A real VictoriaMetrics (Debian's ``victoria-metrics`` single-node binary) on a free loopback port, scraping
targets from a file_sd file (each target with its labels: a shard's ``pool`` is a target label, as a
Kubernetes relabeling of the node's label would make it). Readiness and the first scrape are polled,
never slept. Instant queries see samples at once (``-search.latencyOffset=0s``; VictoriaMetrics hides
the last 30 s by default, which would read as a stale fleet)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from act_support import free_port, wait_until
from proc_support import stop_process

VICTORIA_METRICS = shutil.which("victoria-metrics")


def skip_reason() -> str | None:
    if VICTORIA_METRICS is None:
        return "victoria-metrics not installed (apt-get install victoria-metrics; scripts/install-deps does it)"
    return None


class VictoriaMetrics:
    """``targets``: (host:port, metrics path, labels). Scrapes every ``scrape_interval_s``."""

    def __init__(self, targets: Sequence[tuple[str, str, Mapping[str, str]]], scrape_interval_s: float = 2.0) -> None:
        if VICTORIA_METRICS is None:
            raise RuntimeError(str(skip_reason()))
        self.dir = Path(tempfile.mkdtemp(prefix="fh-vm-"))
        self.port = free_port()
        sd = [{"targets": [addr], "labels": {"__metrics_path__": path, **labels}} for addr, path, labels in targets]
        (self.dir / "targets.json").write_text(json.dumps(sd))
        (self.dir / "scrape.yml").write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval_s:g}s\n"
            f"  scrape_timeout: {scrape_interval_s:g}s\n"
            "scrape_configs:\n"
            "  - job_name: sim\n"
            "    honor_labels: true\n"
            "    file_sd_configs:\n"
            f"      - files: ['{self.dir / 'targets.json'}']\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.n_targets = len(targets)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VictoriaMetrics:
        assert VICTORIA_METRICS is not None
        self.proc = subprocess.Popen(
            [VICTORIA_METRICS, f"-storageDataPath={self.dir / 'data'}", f"-httpListenAddr=127.0.0.1:{self.port}",
             f"-promscrape.config={self.dir / 'scrape.yml'}", "-search.latencyOffset=0s",
             "-search.disableCache", "-retentionPeriod=1d", "-loggerLevel=ERROR"],
            stdout=subprocess.DEVNULL, stderr=(self.dir / "vm.log").open("wb"))
        wait_until(lambda: httpx.get(f"{self.url}/health", timeout=1).status_code == 200, 30, 0.1,
                   what="VictoriaMetrics ready")
        return self

    def query(self, q: str) -> list[dict[str, Any]]:
        r = httpx.post(f"{self.url}/api/v1/query", data={"query": q}, timeout=10).json()
        return list(r["data"]["result"]) if r.get("status") == "success" else []

    def wait_scraped(self, at_least: int | None = None, timeout_s: float = 60) -> None:
        """Until (at least) every target has been scraped once."""
        want = self.n_targets if at_least is None else at_least
        wait_until(lambda: len(self.query("up")) >= want, timeout_s, 0.2, what=f"{want} targets scraped")

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "vm.log").read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        stop_process(self.proc, self.dir)

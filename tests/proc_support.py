"""Teardown shared by the harnesses that run a real server as a child process (Prometheus, Alertmanager,
VictoriaMetrics): stop it politely, then for sure, and remove its scratch directory."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def stop_process(proc: subprocess.Popen[bytes] | None, scratch: Path | str | None, grace_s: float = 10.0) -> None:
    """SIGTERM, wait ``grace_s``, then SIGKILL; a server that ignores SIGTERM must not outlive the test run."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)

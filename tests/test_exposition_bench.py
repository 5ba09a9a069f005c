"""`fleethealth bench parse` end to end (small N): JSON keys, equality with prometheus-client, exit code."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_parse_json() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fleethealth.cli.main", "bench", "parse", "--gpus", "200", "--prom-gpus", "40",
         "--repeats", "2", "--format", "json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    for key in ("samples", "parse_s", "samples_per_s", "prom_client_samples_per_s", "speedup", "equal"):
        assert key in r
    assert r["samples"] == 200 * 25 - 4  # every 50th GPU's memory temperature is DCGM's blank sentinel
    assert r["dropped_with_issue"] == 4
    assert r["equal"] is True and r["compared_samples"] == 40 * 25
    assert r["samples_per_s"] > r["prom_client_samples_per_s"]
    assert len(r["cpu_calibration_runs_ms"]) == 2 and r["cpu_calibration_ms"] > 0


def test_bench_parse_rejects_bad_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fleethealth.cli.main", "bench", "parse", "--gpus", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert out.returncode == 2
    assert "at least 1" in out.stderr

"""`fleethealth run`: as a real process (config file in, HTTP endpoint up, SIGTERM out) and one-shot."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from prom_harness import free_port

DCGM = """# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",Hostname="n1",modelName="H100"} 50
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",pci_bus_id="00000000:5D:00.0",Hostname="n1",modelName="H100"} 51
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-c",pci_bus_id="00000000:3B:00.0",Hostname="n2",modelName="H100"} 50
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",pci_bus_id="00000000:3B:00.0",Hostname="n1",modelName="H100"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-b",pci_bus_id="00000000:5D:00.0",Hostname="n1",modelName="H100"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-c",pci_bus_id="00000000:3B:00.0",Hostname="n2",modelName="H100"} 0
"""


def fh(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleethealth.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_once_with_files_and_a_kernel_log(tmp_path: Path) -> None:
    (tmp_path / "dcgm.prom").write_text(DCGM)
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    # a journald line naming the host; the bus id maps to n1's GPU 1 through dcgm-exporter's pci_bus_id
    (tmp_path / "kern.log").write_text(
        f"{now} n1 kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n")
    (tmp_path / "ctl.yaml").write_text("interval_s: 5\nstate_db: state.db\nsources:\n  files: [dcgm.prom]\n")
    r = fh("run", "--config", "ctl.yaml", "--once", "--kernel-log", "kern.log", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [(t["entity"], t["to"]) for t in rep["transitions_detail"]] == [("n1", "QUARANTINED")]
    assert {i["intent"] for i in rep["intents"] if i["entity"] == "n1"} >= {"quarantine", "capture_evidence"}
    assert rep["source_errors"] == []
    assert (tmp_path / "state.db").exists()  # decisions persisted
    # a second one-shot resumes the stored state: n1 is already quarantined, no new transition
    r2 = fh("run", "--config", "ctl.yaml", "--once", cwd=tmp_path)
    assert r2.returncode == 0 and json.loads(r2.stdout)["transitions"] == 0


def test_bad_config_exits_2_with_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("interval_s: fast\nsources: {files: [x]}\n")
    r = fh("run", "--config", "bad.yaml", cwd=tmp_path)
    assert r.returncode == 2
    assert "bad.yaml:1: interval_s:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    (tmp_path / "dcgm.prom").write_text(DCGM)
    port = free_port()
    (tmp_path / "ctl.yaml").write_text(
        f"interval_s: 0.5\nstate_db: null\nlisten: 127.0.0.1:{port}\nsources:\n  files: [dcgm.prom, gone.prom]\n")
    proc = subprocess.Popen([sys.executable, "-m", "fleethealth.cli.main", "run", "--config", "ctl.yaml"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 60
        ok = False
        while time.time() < deadline and not ok:
            with contextlib.suppress(httpx.HTTPError):
                ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ok, proc.stderr.read() if proc.poll() is not None else "no healthy endpoint"
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'fleethealth_health{entity="n1",kind="node"' in text
        st = httpx.get(f"http://127.0.0.1:{port}/api/v1/status").json()
        src = st["sources"][0]
        # one file readable, one missing: up but partial, and the missing file is named
        assert src["up"] and src["partial"] and "gone.prom" in src["last_error"]
        assert 'fleethealth_source_partial{source="files:' in text
        assert st["actuation"]["mode"] == "advise"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_bad_token_file_exits_2_with_the_line(tmp_path: Path) -> None:
    (tmp_path / "dcgm.prom").write_text(DCGM)
    (tmp_path / "tokens.yaml").write_text("tokens:\n  - {user: a, token: short, verbs: [ack]}\n")
    (tmp_path / "ctl.yaml").write_text(f"state_db: null\nlisten: 127.0.0.1:{free_port()}\n"
                                       "sources: {files: [dcgm.prom]}\napi: {token_file: tokens.yaml}\n")
    r = fh("run", "--config", "ctl.yaml", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "tokens.yaml:2: tokens[0].token:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_running_controller_refuses_anonymous_posts_and_audits_the_rest(tmp_path: Path) -> None:
    from fleethealth.store.sqlite import SqliteStore

    (tmp_path / "dcgm.prom").write_text(DCGM)
    token = "cli-sre-token-0123456789"
    (tmp_path / "tokens.yaml").write_text(f'tokens:\n  - {{user: sre, token: "{token}", verbs: [ack, ready]}}\n')
    port = free_port()
    (tmp_path / "ctl.yaml").write_text(
        f"interval_s: 0.5\nstate_db: state.db\nlisten: 127.0.0.1:{port}\nsources:\n  files: [dcgm.prom]\n"
        "api: {token_file: tokens.yaml}\n")
    proc = subprocess.Popen([sys.executable, "-m", "fleethealth.cli.main", "run", "--config", "ctl.yaml"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        ok = False
        while time.time() < deadline and not ok:
            with contextlib.suppress(httpx.HTTPError):
                ok = httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ok, proc.stderr.read() if proc.poll() is not None else "no healthy endpoint"
        ack = {"kind": "ack", "entity": "n1", "to": "READY"}
        assert httpx.post(f"{url}/api/v1/events", json=ack).status_code == 401
        assert httpx.post(f"{url}/api/v1/kill", headers={"Authorization": f"Bearer {token}"}).status_code == 403
        r = httpx.post(f"{url}/api/v1/events", json=ack, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 202 and r.json()["accepted"]["actor"] == "sre"
        assert httpx.get(f"{url}/docs").status_code == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    rows = SqliteStore(tmp_path / "state.db").audit_log()
    assert [(r["actor"], r["verb"], r["target"], r["allowed"]) for r in rows] == [
        ("sre", "kill", "fleet", False), ("sre", "ready", "node/n1", True)]

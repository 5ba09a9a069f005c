"""The client verbs (`fleethealth get|describe|ack|ready|quarantine|kill|resume`) as a person runs them:
real processes throughout, a controller (`fleethealth run`) scraping the simulator's exporter
(`fleethealth sim serve`), the verbs against its URL with a token from its token file."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prom_harness import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOKEN = "s3cret-operator-token"


def fh(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("FLEETHEALTH_SERVER", "FLEETHEALTH_TOKEN")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "fleethealth.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env=e)


def until(cond, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            if (v := cond()):
                return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextlib.contextmanager
def controller(tmp_path: Path) -> Iterator[str]:
    sim_port, api_port = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "fleethealth.cli.main", "sim", "serve", "--scenario", "mixed",
                               "--port", str(sim_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        sd = until(lambda: httpx.get(f"http://127.0.0.1:{sim_port}/sd", timeout=2).json(), 60, "the simulator")
        targets = [f"http://{t}{g['labels'].get('__metrics_path__', '/metrics')}" for g in sd for t in g["targets"]]
        (tmp_path / "tokens.yaml").write_text(
            f"tokens:\n  - {{user: alice, token: {TOKEN}, verbs: [ack, ready, kill, resume, get]}}\n")
        (tmp_path / "ctl.yaml").write_text(json.dumps({
            "interval_s": 1, "state_db": str(tmp_path / "state.db"), "listen": f"127.0.0.1:{api_port}",
            "sources": {"scrape": {"timeout_s": 2, "targets": targets}},
            "api": {"token_file": str(tmp_path / "tokens.yaml")}}))
        procs.append(subprocess.Popen([sys.executable, "-m", "fleethealth.cli.main", "run", "--config",
                                       str(tmp_path / "ctl.yaml")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                      stderr=(tmp_path / "ctl.log").open("w")))
        url = f"http://127.0.0.1:{api_port}"
        until(lambda: len(httpx.get(f"{url}/api/v1/states", params={"kind": "node"}, timeout=2).json()["entities"]) > 3,
              90, "the controller's first cycles")
        yield url
    finally:
        for p in reversed(procs):
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(15)
            if p.poll() is None:
                p.kill()


def test_the_client_verbs_against_a_controller_on_the_simulator(tmp_path: Path) -> None:
    with controller(tmp_path) as url:
        env = {"FLEETHEALTH_SERVER": url}
        r = fh("get", "nodes", env=env)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split()[:4] == ["NAME", "STATE", "HEALTH", "CONFIDENCE"]
        node = lines[1].split()[0]
        assert "None" not in r.stdout and "{" not in r.stdout
        # rounded for people, full precision in -o json
        js = json.loads(fh("get", "nodes", "-o", "json", env=env).stdout)
        assert {e["entity"] for e in js["entities"]} >= {node}
        r = fh("get", "replicas", "-o", "wide", env=env)
        assert r.returncode == 0 and "POOL" in r.stdout.splitlines()[0] and "WEIGHT" in r.stdout.splitlines()[0]
        assert fh("get", "intents", env=env).returncode == 0
        # unknown enum values are errors, exit 2, one line
        for bad in (["get", "gpus"], ["get", "nodes", "--state", "sleepy"], ["get", "nodes", "-o", "yaml"]):
            r = fh(*bad, env=env)
            assert r.returncode == 2 and "unknown" in r.stderr and "Traceback" not in r.stderr, (bad, r.stderr)
        r = fh("describe", "node", node, env=env)
        assert r.returncode == 0 and f"Name:        {node}" in r.stdout and "State:" in r.stdout, r.stdout + r.stderr
        r = fh("describe", "node", "no-such-node", env=env)
        assert r.returncode == 1 and "no-such-node" in r.stderr
        # writes need a token: 401 -> exit 4
        r = fh("quarantine", node, "--reason", "fan noise", env=env)
        assert r.returncode == 4 and "401" in r.stderr
        env_t = {**env, "FLEETHEALTH_TOKEN": TOKEN}
        r = fh("quarantine", node, "--reason", "fan noise", env=env_t)
        assert r.returncode == 0 and "accepted" in r.stdout and "alice" in r.stdout, r.stderr
        assert "FAILED only" in r.stderr  # a READY node: the lifecycle keeps it, and the client says so
        r = fh("ack", node, "--reason", "looking at it", env=env_t)
        assert r.returncode == 0 and "acknowledged" in r.stdout, r.stderr
        r = fh("ready", node, "--reason", "checked, fine", env=env_t)
        assert r.returncode == 0 and "to READY" in r.stdout, r.stderr
        audit = httpx.get(f"{url}/api/v1/audit").json()["audit"]
        assert [(a.get("actor", a.get("user")), a.get("verb")) for a in audit][-3:] == [
            ("alice", "ack"), ("alice", "ack"), ("alice", "ready")], audit[-3:]
        assert fh("quarantine", "no-such-node", "--reason", "x", env=env_t).returncode == 1
        r = fh("kill", "--reason", "incident 42", env=env_t)
        assert r.returncode == 0 and "engaged" in r.stdout, r.stderr
        assert httpx.get(f"{url}/api/v1/status").json()["actuation"]["killed"] is True
        r = fh("resume", env=env_t)
        assert r.returncode == 0 and "resumed" in r.stdout, r.stderr
    # the controller is gone: exit 3
    r = fh("get", "nodes", env={"FLEETHEALTH_SERVER": url})
    assert r.returncode == 3 and "cannot reach" in r.stderr


def test_a_ready_node_scored_below_1_says_why(tmp_path: Path) -> None:
    """Finding 3: a READY node whose score fell (one slow rank: only the rank-time peer comparison sees it)
    prints its tuple's reason in `get nodes`, and `describe node` lists the GPU below 1 with its signal."""
    with controller(tmp_path) as url:
        sd_port = int(json.loads((tmp_path / "ctl.yaml").read_text())["sources"]["scrape"]["targets"][0]
                      .split(":")[2].split("/")[0])
        r = httpx.post(f"http://127.0.0.1:{sd_port}/control/fault",
                       json={"kind": "slow_rank", "target": "node-05/gpu3", "onset": 0, "params": {"slowdown": 0.6}})
        assert r.status_code == 200, r.text
        low = until(lambda: [t for t in httpx.get(f"{url}/api/v1/health", params={"entity": "node-05"}, timeout=2)
                             .json()["tuples"] if t["value"] is not None and t["value"] < 0.99], 90,
                    "node-05 scored below 1")[0]
        env = {"FLEETHEALTH_SERVER": url}
        row = until(lambda: [ln.split() for ln in fh("get", "nodes", env=env).stdout.splitlines()
                             if ln.startswith("node-05 ")], 30, "node-05 listed")[0]
        state = row[1]
        # the reason column is the tuple's reason whenever the score is below 1, READY or not
        assert row[4].startswith(("min:", "gmean:", "gate:")), (row, low)
        out = fh("describe", "node", "node-05", env=env).stdout
        assert "Reason:" in out and "GPUs below 1:" in out, out
        gpu_line = next(ln for ln in out.splitlines() if ln.strip().startswith("node-05/gpu3"))
        assert "rank_compute_time" in gpu_line, out
        # a node-level signal with no value never prints as a bare healthy score
        assert "value unknown" not in out or "not counted as healthy" in out, out
        assert state in {"READY", "DEGRADED", "QUARANTINED", "DRAINING"}, row

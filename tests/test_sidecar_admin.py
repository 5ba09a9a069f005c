"""Admin endpoints refuse without the token and outside loopback; the OpenAPI spec and the CLI."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from act_support import free_port
from fake_engine import ADMIN_TOKEN, FakeEngine, ServerThread, running_pair, wait_until
from fleethealth.serve.app import create_app
from fleethealth.serve.config import SidecarConfig


def test_admin_refuses_without_the_right_token() -> None:
    with running_pair() as p:
        for method, path in (("POST", "/admin/drain"), ("POST", "/admin/undrain")):
            r = httpx.request(method, p.url + path)
            assert r.status_code == 401 and r.json()["detail"].startswith("authentication required")
            r = httpx.request(method, p.url + path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["detail"] == "the bearer token is not valid"
        assert p.sc.state.value == "READY"  # nothing happened
        # Reads are open to loopback clients by default (admin_read="loopback")
        for path in ("/admin/state", "/admin/evidence"):
            assert httpx.get(p.url + path).status_code == 200
        r = httpx.get(p.url + "/admin/state", headers=p.auth)
        assert r.status_code == 200 and r.json()["state"] == "READY"
        metrics = httpx.get(p.url + "/metrics").text
        assert 'fleethealth_sidecar_admin_refused_total{code="401",replica="replica-0"} 4.0' in metrics


def test_reads_need_a_token_when_configured() -> None:
    with running_pair(admin_read="authenticated") as p:
        assert httpx.get(p.url + "/admin/state").status_code == 401
        assert httpx.get(p.url + "/admin/state", headers=p.auth).status_code == 200


def test_admin_refuses_everything_when_no_token_is_configured() -> None:
    with running_pair(admin_token=None) as p:
        assert httpx.post(p.url + "/admin/drain", headers={"Authorization": "Bearer"}).status_code == 401
        assert httpx.post(p.url + "/admin/drain", headers={"Authorization": "Bearer x"}).status_code == 401


def test_admin_is_loopback_only_by_default() -> None:
    # The ASGI transport lets the test present a non-loopback peer address (no second host exists here).
    async def call(loopback_only: bool) -> int:
        cfg = SidecarConfig(upstream="http://127.0.0.1:9", replica="r", admin_token=ADMIN_TOKEN,
                            admin_loopback_only=loopback_only)
        transport = httpx.ASGITransport(app=create_app(cfg), client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as c:
            r = await c.get("/admin/state", headers={"Authorization": f"Bearer {ADMIN_TOKEN}",
                                                     "X-Forwarded-For": "127.0.0.1"})
            return r.status_code

    assert asyncio.run(call(True)) == 403
    assert asyncio.run(call(False)) == 200


def test_openapi_spec_lists_every_endpoint() -> None:
    app = create_app(SidecarConfig(upstream="http://127.0.0.1:9", replica="r"))
    paths = set(app.openapi()["paths"])
    assert {"/livez", "/readyz", "/gpuz", "/metrics", "/admin/drain", "/admin/undrain", "/admin/state",
            "/v1/completions", "/v1/chat/completions", "/v1/models"} <= paths


def test_drain_wait_blocks_until_drained_for_prestop() -> None:
    with running_pair(max_drain_seconds=3.0) as p:
        p.engine.set(token_delay_s=0.02)
        t0 = time.monotonic()
        r = httpx.post(p.url + "/admin/drain", headers=p.auth, params={"wait": True}, timeout=10)
        assert r.status_code == 200 and r.json()["state"] == "DRAINING"
        assert r.json()["drain"]["finished"] is not None
        assert time.monotonic() - t0 < 2.0  # nothing in flight: returns at once


@pytest.mark.slow  # a subprocess importing the whole CLI: about 10 s on a loaded 2-core box
def test_cli_runs_the_sidecar_and_sigterm_drains_before_exit(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("cli-token\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "FLEETHEALTH_ADMIN_TOKEN"}
    engine = FakeEngine()
    with ServerThread(engine.app) as esrv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleethealth.cli.main", "sidecar", "--upstream", esrv.url,
             "--listen", f"127.0.0.1:{port}", "--admin-token-file", str(token), "--max-drain-seconds", "10",
             "--log-level", "warning", "--no-nvml", "--audit-log", str(tmp_path / "audit.jsonl")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        base = f"http://127.0.0.1:{port}"
        try:
            def ready() -> bool:
                try:
                    return httpx.get(base + "/readyz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(ready, 40, 0.1)
            assert httpx.post(base + "/admin/undrain").status_code == 401
            assert httpx.post(base + "/admin/undrain", headers={"Authorization": "Bearer cli-token"}).status_code == 200
            assert httpx.get(base + "/admin/state").status_code == 200  # reads: open on loopback
            audited = (tmp_path / "audit.jsonl").read_text().splitlines()
            assert len(audited) == 1 and '"verb": "undrain"' in audited[0] and '"actor": "sidecar-admin-token"' in audited[0]
            # A stream is decoding when SIGTERM arrives: it finishes, then the process exits by itself.
            engine.set(token_delay_s=0.05)
            body = {"model": "fake-model", "prompt": "x", "max_tokens": 60, "stream": True}
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
                it = r.iter_raw()
                first = next(it)
                proc.send_signal(signal.SIGTERM)
                # Still listening, but draining: new requests get a retryable 503 instead of a refused connection.
                wait_until(lambda: httpx.get(base + "/readyz", timeout=5).json()["state"] == "DRAINING", 10, 0.05)
                late = httpx.post(base + "/v1/completions", json={**body, "stream": False}, timeout=10)
                assert late.status_code == 503 and late.headers["retry-after"]
                rest = b"".join(it)
            events = [e for e in (first + rest).split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]" and b'"error"' not in rest
            assert len(events) == 61
            assert proc.wait(20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_cli_errors_are_one_line() -> None:
    from typer.testing import CliRunner

    from fleethealth.cli.main import app

    r = CliRunner().invoke(app, ["sidecar", "--upstream", "http://x:1", "--admin-token-file", "/nonexistent/token"])
    assert r.exit_code == 2
    assert "cannot read --admin-token-file" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sidecar", "--upstream", "http://x:1", "--listen", "nonsense"])
    assert r.exit_code == 2 and "HOST:PORT" in r.output
    r = CliRunner().invoke(app, ["sidecar", "--upstream", "http://x:1", "--admin-tokens-file", "/nonexistent/t.yaml"])
    assert r.exit_code == 2 and "cannot read token file" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sidecar", "--upstream", "http://x:1", "--admin-kubernetes-auth"])
    assert r.exit_code == 2 and "needs a Kubernetes API" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sidecar", "--upstream", "http://x:1", "--admin-read", "everyone"])
    assert r.exit_code == 2 and "--admin-read" in r.output


def test_deployment_example_is_consistent() -> None:
    import yaml

    path = Path(__file__).resolve().parents[1] / "deploy" / "sidecar" / "deployment.yaml"
    docs = {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    side = containers["fleethealth-sidecar"]
    args = dict((a.split("=", 1) + [""])[:2] for a in side["command"][2:])
    drain_s = float(args["--max-drain-seconds"])
    # admin: the cluster's RBAC decides who may drain, every action audited to a file and as Events
    assert "--admin-kubernetes-auth" in args and args["--audit-log"].startswith("/var/lib/fleethealth/audit/")
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    granted = {(g, r, v) for rule in docs["ClusterRole"]["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("authentication.k8s.io", "tokenreviews", "create"),
                       ("authorization.k8s.io", "subjectaccessreviews", "create")}
    assert docs["Role"]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    env = {e["name"] for e in side["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env
    assert pod["terminationGracePeriodSeconds"] > drain_s
    engine = containers["vllm"]
    assert engine["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert engine["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert side["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for c in (engine, side):
        hook = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
        assert "/admin/drain?wait=true" in hook and "Bearer" in hook
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] == 8080

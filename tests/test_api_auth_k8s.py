"""The controller API decides with the cluster's RBAC, on a real kube-apiserver (tests/k8s_harness.py):
service-account tokens from the TokenRequest API, the shipped deploy/rbac.yaml for the controller (it
needs tokenreviews and subjectaccessreviews create, nothing more for this), the shipped example
ClusterRoles for operators. Anonymous POST /api/v1/events is 401; a valid token without the RBAC
permission is 403; with it the event is taken and audited in the store and as a Kubernetes Event."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from act_support import free_port, wait_until
from fleethealth.act.kube_api import Kube
from fleethealth.controller.api import ApiServer
from fleethealth.controller.config import parse_config
from fleethealth.controller.security import build_security

k8s_harness = pytest.importorskip("k8s_harness")
from test_controller import make, run_for  # noqa: E402

pytestmark = [
    pytest.mark.skipif(k8s_harness.skip_reason() is not None, reason=str(k8s_harness.skip_reason())),
    pytest.mark.timeout(300),
]
DEPLOY = Path(__file__).parent.parent / "deploy"
NS = "fleethealth-system"
sa_token = k8s_harness.sa_token


def bind(kube: Kube, role: str, ns: str, sa: str) -> None:
    k8s_harness.apply_manifest(kube, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{role}-{sa}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]})


def test_rbac_decides_who_may_ack_and_every_action_is_audited(cluster: k8s_harness.KubeCluster,
                                                               tmp_path: Path) -> None:
    admin = cluster.kube()
    for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()):
        if doc:
            k8s_harness.apply_manifest(admin, doc)
    ctl_token = sa_token(admin, NS, "fleethealth-controller")
    sre = sa_token(admin, NS, "sre")
    bind(admin, "fleethealth-operator", NS, "sre")
    reporter = sa_token(admin, NS, "ci-reporter")
    bind(admin, "fleethealth-reporter", NS, "ci-reporter")
    nobody = sa_token(admin, NS, "nobody")
    cluster.add_node("n0")

    cfg = parse_config(f"""
state_db: {tmp_path / 'state.db'}
sources: {{files: [{tmp_path / 'none.prom'}]}}
kubernetes: {{host: "{cluster.url}", token: "{ctl_token}", verify_ssl: false, leader_election: false}}
api: {{read: authenticated}}
""")
    sec = build_security(cfg)  # the controller's own service account asks the reviews (shipped RBAC)
    ctl, src, clock = make()
    run_for(ctl, clock, 30)
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=sec.guard, auditor=sec.auditor, api=cfg.api).start()
    events = f"{srv.url}/api/v1/events"
    ready = {"kind": "ack", "entity": "n0", "to": "READY"}
    try:
        r = httpx.post(events, json=ready)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert httpx.post(events, json=ready, headers={"Authorization": "Bearer forged.jwt.token"}).status_code == 401

        r = httpx.post(events, json=ready, headers={"Authorization": f"Bearer {nobody}"})
        assert r.status_code == 403, r.text
        assert r.json()["detail"].startswith("system:serviceaccount:fleethealth-system:nobody may not ready nodes/n0")
        # the reporter may report a test result, not return a node to service or lift the kill switch
        hdr = {"Authorization": f"Bearer {reporter}"}
        assert httpx.post(events, json=ready, headers=hdr).status_code == 403
        assert httpx.post(events, json={"kind": "active_test", "entity": "n0", "passed": True},
                          headers=hdr).status_code == 202
        assert httpx.post(f"{srv.url}/api/v1/resume", headers=hdr).status_code == 403
        assert httpx.get(f"{srv.url}/api/v1/states", headers=hdr).status_code == 403  # no 'get' on fleet
        assert len(ctl._pending_events) == 1

        hdr = {"Authorization": f"Bearer {sre}"}
        r = httpx.post(events, json={**ready, "actor": "someone-else"}, headers=hdr)
        assert r.status_code == 202, r.text
        assert ctl._pending_events[-1].actor == "system:serviceaccount:fleethealth-system:sre"
        assert httpx.get(f"{srv.url}/api/v1/states", headers=hdr).status_code == 200
        # the node agent (shipped ClusterRole fleethealth-agent) reports its GPU resets, nothing more
        hdr = {"Authorization": f"Bearer {sa_token(admin, NS, 'fleethealth-agent')}"}
        assert httpx.post(events, json={"kind": "reset", "entity": "n0", "passed": True},
                          headers=hdr).status_code == 202
        assert httpx.post(f"{srv.url}/api/v1/kill", headers=hdr).status_code == 403

        rows = sec.auditor.store.audit_log()
        assert [(r["actor"].rsplit(":", 1)[1], r["verb"], r["target"], r["allowed"]) for r in rows] == [
            ("nobody", "ready", "node/n0", False), ("ci-reporter", "ready", "node/n0", False),
            ("ci-reporter", "report", "node/n0", True), ("ci-reporter", "resume", "fleet", False),
            ("sre", "ready", "node/n0", True), ("fleethealth-agent", "report", "node/n0", True),
            ("fleethealth-agent", "kill", "fleet", False)]
        assert all(r["remote"].startswith("127.0.0.1:") for r in rows)

        def audit_events() -> list[dict[str, object]]:
            evs = admin.list_events(NS) + admin.list_events("default")
            return [e for e in evs if (e["metadata"].get("labels") or {}).get("fleethealth.io/audit") == "true"]

        evs = wait_until(lambda: len(audit_events()) == 7 and audit_events(), 10, what="audit events")
        ok = [e for e in evs if e["reason"] == "FleetHealthOperatorReady"]
        assert len(ok) == 1 and ok[0]["involvedObject"]["name"] == "n0" and ok[0]["involvedObject"]["kind"] == "Node"
        assert ok[0]["message"].startswith("system:serviceaccount:fleethealth-system:sre ready node/n0 from 127.0.0.1:")
    finally:
        srv.stop()
        sec.close()


def test_the_controller_cannot_review_without_the_shipped_rules(cluster: k8s_harness.KubeCluster,
                                                                 tmp_path: Path) -> None:
    """Fail closed: a controller whose account may not create reviews answers 503, it never lets in."""
    admin = cluster.kube()
    bare = sa_token(admin, "default", "bare-controller")
    sre = sa_token(admin, NS, "sre2")
    bind(admin, "fleethealth-operator", NS, "sre2")
    cfg = parse_config(f"""
state_db: {tmp_path / 'state.db'}
sources: {{files: [{tmp_path / 'none.prom'}]}}
kubernetes: {{host: "{cluster.url}", token: "{bare}", verify_ssl: false, leader_election: false}}
""")
    sec = build_security(cfg)
    ctl, src, clock = make()
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=sec.guard, auditor=sec.auditor, api=cfg.api).start()
    try:
        r = httpx.post(f"{srv.url}/api/v1/events", json={"kind": "ack", "entity": "n0"},
                       headers={"Authorization": f"Bearer {sre}"})
        assert r.status_code == 503 and "cannot check the token" in r.json()["detail"] and "403" in r.json()["detail"]
        assert not ctl._pending_events
    finally:
        srv.stop()
        sec.close()

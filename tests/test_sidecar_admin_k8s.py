"""The sidecar's /admin/* decided by the cluster's RBAC on a real kube-apiserver (tests/k8s_harness.py):
the sidecar's service account has only the shipped deploy/sidecar RBAC (TokenReview, SubjectAccessReview,
Events), the operator the shipped deploy/rbac.yaml ClusterRole. Anonymous is 401, a token without the
permission is 403 (one line), the operator drains and undrains; every action is in the JSON Lines audit
log and an Event on the replica's Pod; a sidecar that cannot ask the reviews answers 503 (fail closed)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from act_support import wait_until
from fake_engine import running_pair

k8s_harness = pytest.importorskip("k8s_harness")
from test_api_auth_k8s import bind, sa_token  # noqa: E402

pytestmark = [
    pytest.mark.needs_k8s,
    pytest.mark.skipif(k8s_harness.skip_reason() is not None, reason=str(k8s_harness.skip_reason())),
    pytest.mark.timeout(300),
]
DEPLOY = Path(__file__).parent.parent / "deploy"
NS = "fleethealth-system"
REPLICA = "llm-replica-k0"


def shipped_rbac(admin: object) -> None:
    for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()):
        if doc:
            k8s_harness.apply_manifest(admin, doc)
    for doc in yaml.safe_load_all((DEPLOY / "sidecar" / "deployment.yaml").read_text()):
        if not doc or doc["kind"] not in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                          "RoleBinding"):
            continue
        if doc["kind"] in ("ServiceAccount", "Role", "RoleBinding"):  # kubectl apply's default namespace
            doc["metadata"].setdefault("namespace", "default")
        k8s_harness.apply_manifest(admin, doc)


def test_rbac_decides_who_may_drain_and_every_action_is_audited(cluster: k8s_harness.KubeCluster,
                                                                 tmp_path: Path) -> None:
    admin = cluster.kube()
    shipped_rbac(admin)
    sidecar_sa = sa_token(admin, "default", "llm-replica")
    sre = sa_token(admin, NS, "sre")
    bind(admin, "fleethealth-operator", NS, "sre")
    viewer = sa_token(admin, NS, "dash")
    bind(admin, "fleethealth-viewer", NS, "dash")
    cluster.add_node("side-n0")
    cluster.add_pod(REPLICA, "side-n0")
    audit = tmp_path / "admin.jsonl"
    with running_pair(replica=REPLICA, admin_kubernetes_auth=True, kube_host=cluster.url, kube_token=sidecar_sa,
                      kube_verify_ssl=False, namespace="default", audit_log=audit, admin_token=None) as p:
        drain, undrain = p.url + "/admin/drain", p.url + "/admin/undrain"
        r = httpx.post(drain)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.post(drain, headers={"Authorization": "Bearer forged.jwt.token"}).status_code == 401
        r = httpx.post(drain, headers={"Authorization": f"Bearer {viewer}"}, params={"reason": "dash tries"})
        assert r.status_code == 403, r.text
        assert r.json()["detail"].startswith(
            f"system:serviceaccount:{NS}:dash may not drain replicas/{REPLICA} (fleethealth.io)")
        assert "\n" not in r.json()["detail"] and p.sc.state.value == "READY"
        # the viewer may read the state from anywhere the network lets it (here: loopback, open anyway)
        assert httpx.get(p.url + "/admin/state", headers={"Authorization": f"Bearer {viewer}"}).status_code == 200

        hdr = {"Authorization": f"Bearer {sre}"}
        r = httpx.post(drain, headers=hdr, params={"reason": "node maintenance"})
        assert r.status_code == 202, r.text
        wait_until(lambda: p.sc.state.value == "DRAINING", 10)
        assert httpx.post(undrain, headers=hdr).status_code == 200

    recs = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["actor"].rsplit(":", 1)[1], r["verb"], r["target"], r["allowed"]) for r in recs] == [
        ("dash", "drain", f"replica/{REPLICA}", False), ("sre", "drain", f"replica/{REPLICA}", True),
        ("sre", "undrain", f"replica/{REPLICA}", True)]
    assert all(r["remote"].startswith("127.0.0.1:") for r in recs)
    assert recs[1]["detail"]["reason"] == "node maintenance"

    def audit_events() -> list[dict[str, object]]:
        return [e for e in admin.list_events("default")
                if (e["metadata"].get("labels") or {}).get("fleethealth.io/audit") == "true"
                and e["involvedObject"]["name"] == REPLICA]

    evs = wait_until(lambda: len(audit_events()) == 3 and audit_events(), 10, what="audit events on the pod")
    by_reason = {e["reason"]: e for e in evs}
    assert set(by_reason) == {"FleetHealthOperatorDrainRefused", "FleetHealthOperatorDrain",
                              "FleetHealthOperatorUndrain"}
    ok = by_reason["FleetHealthOperatorDrain"]
    assert ok["involvedObject"]["kind"] == "Pod" and ok["source"]["component"] == "fleethealth-sidecar"
    assert ok["message"].startswith(f"system:serviceaccount:{NS}:sre drain replica/{REPLICA} from 127.0.0.1:")


def test_a_sidecar_that_cannot_ask_the_reviews_fails_closed(cluster: k8s_harness.KubeCluster,
                                                             tmp_path: Path) -> None:
    admin = cluster.kube()
    shipped_rbac(admin)
    bare = sa_token(admin, "default", "bare-sidecar")  # no binding: may not create reviews
    sre = sa_token(admin, NS, "sre3")
    bind(admin, "fleethealth-operator", NS, "sre3")
    with running_pair(replica="llm-replica-k1", admin_kubernetes_auth=True, kube_host=cluster.url, kube_token=bare,
                      kube_verify_ssl=False, namespace="default", audit_log=tmp_path / "a.jsonl",
                      admin_token=None) as p:
        r = httpx.post(p.url + "/admin/drain", headers={"Authorization": f"Bearer {sre}"})
        assert r.status_code == 503, r.text
        assert r.json()["detail"].startswith("cannot check the token: the Kubernetes API answered 403")
        assert p.sc.state.value == "READY"
        assert 'fleethealth_sidecar_admin_refused_total{code="503",replica="llm-replica-k1"} 1.0' in httpx.get(
            p.url + "/metrics").text
    assert (tmp_path / "a.jsonl").read_text() == ""  # nothing done, nothing to audit

"""Every manifest in deploy/ passes `kubectl apply --dry-run=server` against the real kube-apiserver the
suite builds (tests/k8s_harness.py): the API server validates each object against its schema (unknown
fields, wrong types, missing required fields) and admission, without persisting anything.

Setup done for real first, as a cluster would have it: the namespace (rbac.yaml creates it, but a dry run
of the same apply cannot see it) and Prometheus Operator's CRDs (ServiceMonitor, PodMonitor,
PrometheusRule; here as schemaless stand-ins: the operator's own CRDs carry the full schemas).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import k8s_harness

ROOT = Path(__file__).resolve().parent.parent
KUBECTL = shutil.which("kubectl")

pytestmark = [
    pytest.mark.needs_k8s,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl missing (apt-get install -y kubernetes-client)"),
    pytest.mark.skipif(k8s_harness.skip_reason() is not None, reason=str(k8s_harness.skip_reason())),
    pytest.mark.timeout(240),
]

CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.monitoring.coreos.com}}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {{kind: {kind}, plural: {plural}, singular: {singular}, listKind: {kind}List}}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    c = k8s_harness.KubeCluster().start()
    try:
        yield c.kubeconfig
    finally:
        c.stop()


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    return subprocess.run([KUBECTL, f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True,
                          text=True, timeout=120)


MANIFESTS = sorted(p for p in (ROOT / "deploy").rglob("*.yaml") if p.parent.name != "monitoring"
                   or p.name in ("servicemonitor.yaml", "prometheusrule.yaml"))


def test_the_manifests_pass_a_server_side_dry_run(kubeconfig: Path) -> None:
    r = kubectl(kubeconfig, "create", "namespace", "fleethealth-system")
    assert r.returncode == 0, r.stderr
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PodMonitor", "podmonitors"),
                         ("PrometheusRule", "prometheusrules")):
        r = kubectl(kubeconfig, "apply", "-f", "-", stdin=CRD.format(kind=kind, plural=plural, singular=kind.lower()))
        assert r.returncode == 0, r.stderr
    r = kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    assert r.returncode == 0, r.stderr
    names = {p.relative_to(ROOT).as_posix() for p in MANIFESTS}
    assert {"deploy/rbac.yaml", "deploy/controller.yaml", "deploy/agent.yaml", "deploy/sidecar/deployment.yaml",
            "deploy/monitoring/servicemonitor.yaml", "deploy/monitoring/prometheusrule.yaml"} <= names
    versions = set(kubectl(kubeconfig, "api-versions").stdout.split())
    for p in MANIFESTS:
        text = p.read_text()
        if "policy/v1" not in versions:
            # the suite's API server is 1.20, before PodDisruptionBudget's policy/v1 (1.21); the manifests
            # target current clusters, so their PDBs are checked against the same schema as policy/v1beta1
            text = text.replace("apiVersion: policy/v1 ", "apiVersion: policy/v1beta1 ").replace(
                "apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n")
        r = kubectl(kubeconfig, "apply", "--dry-run=server", "-f", "-", stdin=text)
        assert r.returncode == 0, f"{p.relative_to(ROOT)}: {r.stderr.strip()}"
        assert "(server dry run)" in r.stdout, r.stdout
    # and a dry run does not create: the controller's Deployment is not there
    r = kubectl(kubeconfig, "-n", "fleethealth-system", "get", "deployment", "fleethealth-controller")
    assert r.returncode != 0 and "NotFound" in r.stderr

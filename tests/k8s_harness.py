"""A real Kubernetes control plane on loopback for the actuator tests: etcd (Debian's etcd-server),
kube-apiserver and kube-controller-manager 1.20.2 built by scripts/build-kube (cached in
/var/cache/fleethealth/kube). No kubelet: tests create Node objects, play the kubelet's part on pod status
(Running/Ready, Succeeded) and delete evicted pods themselves.

Auth: a static admin token (group system:masters) and service-account tokens signed with a key made here;
authorization is RBAC, so the shipped ClusterRole can be tested for least privilege. TLS uses the
apiserver's self-signed serving certificate (the client does not verify it; loopback only).
The controller-manager runs only what the tests need: the disruption controller (PDB status), the Job
controller, the service-account token controller and the garbage collector. The node lifecycle controller
is off: with no kubelet it would mark every node NotReady and taint it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from act_support import free_port, wait_until
from fleethealth.act.kube_api import Kube, KubeError, OfficialKubeApi

KUBE_CACHE = Path(os.environ.get("FLEETHEALTH_KUBE_CACHE", "/var/cache/fleethealth/kube"))
APISERVER = KUBE_CACHE / "kube-apiserver"
CONTROLLER_MANAGER = KUBE_CACHE / "kube-controller-manager"
ETCD = shutil.which("etcd")


def skip_reason() -> str | None:
    if not APISERVER.exists() or not CONTROLLER_MANAGER.exists():
        return f"kube-apiserver/kube-controller-manager not built in {KUBE_CACHE} (run scripts/build-kube)"
    if ETCD is None:
        return "etcd not installed (apt-get install etcd-server; scripts/build-kube does it)"
    return None


def _rsa_keypair(dir_: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = dir_ / "sa.key", dir_ / "sa.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


class KubeCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fh-kube-"))
        self.token = secrets.token_hex(16)
        self.etcd_port, self.peer_port, self.port = free_port(), free_port(), free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(args, stdout=(self.dir / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
                             cwd=self.dir)
        self.procs[name] = p
        return p

    def log(self, name: str, tail: int = 3000) -> str:
        f = self.dir / f"{name}.log"
        return f.read_text(errors="replace")[-tail:] if f.exists() else ""

    def start(self) -> KubeCluster:
        t0 = time.monotonic()
        assert ETCD is not None
        self._spawn("etcd", [
            ETCD, "--name", "fh", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"fh=http://127.0.0.1:{self.peer_port}", "--log-level", "warn",
        ])
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{self.etcd_port}/health", timeout=1).status_code == 200,
                   20, what="etcd")
        priv, pub = _rsa_keypair(self.dir)
        (self.dir / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        self._spawn("apiserver", [
            str(APISERVER), f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            "--insecure-port=0", f"--cert-dir={self.dir / 'certs'}",
            f"--token-auth-file={self.dir / 'tokens.csv'}", "--authorization-mode=RBAC",
            f"--service-account-key-file={pub}", f"--service-account-signing-key-file={priv}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            # Pods are created without a token volume (no kubelet would mount it anyway).
            "--disable-admission-plugins=ServiceAccount",
            "--logtostderr=true", "--v=0",
        ])
        headers = {"Authorization": f"Bearer {self.token}"}

        def ready() -> bool:
            if self.procs["apiserver"].poll() is not None:
                raise RuntimeError("kube-apiserver exited:\n" + self.log("apiserver"))
            return httpx.get(f"{self.url}/readyz", headers=headers, verify=False, timeout=2).status_code == 200

        wait_until(ready, 150, 0.1, what="kube-apiserver /readyz")
        kubeconfig = self.dir / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fh\n  cluster:\n"
            f"    server: {self.url}\n    insecure-skip-tls-verify: true\n"
            f"users:\n- name: admin\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: fh\n  context:\n    cluster: fh\n    user: admin\ncurrent-context: fh\n")
        self.kubeconfig = kubeconfig
        self._spawn("controller-manager", [
            str(CONTROLLER_MANAGER), f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--port=0",
            "--secure-port=0", "--controllers=disruption,job,serviceaccount-token,garbagecollector",
            f"--service-account-private-key-file={priv}", "--use-service-account-credentials=false",
            "--concurrent-gc-syncs=2", "--logtostderr=true", "--v=0",
        ])
        # The default namespace appears once the apiserver's bootstrap controllers ran.
        wait_until(lambda: self.kube().api.request("GET", "/api/v1/namespaces/default"), 30,
                   what="default namespace")
        self.start_s = time.monotonic() - t0
        return self

    def api(self, token: str | None = None, timeout_s: float = 10.0) -> OfficialKubeApi:
        return OfficialKubeApi.from_host(self.url, token=token or self.token, verify_ssl=False, timeout_s=timeout_s)

    def kube(self, token: str | None = None) -> Kube:
        return Kube(self.api(token))

    def stop(self) -> None:
        for name in ("controller-manager", "apiserver", "etcd"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- playing the kubelet's and the user's parts ---------------------------------------------------
    def add_node(self, name: str, gpus: int = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
        kube = self.kube()
        node = kube.api.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        })
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kube.patch_node_status(name, {"status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
        }})
        return node

    def add_pod(self, name: str, node: str, namespace: str = "default", labels: dict[str, str] | None = None,
                owner: dict[str, Any] | None = None, ready: bool = True, annotations: dict[str, str] | None = None,
                gpus: int = 0, container_port: int | None = None) -> dict[str, Any]:
        kube = self.kube()
        md: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
        if owner:
            md["ownerReferences"] = [owner]
        if annotations:
            md["annotations"] = annotations
        container: dict[str, Any] = {"name": "main", "image": "busybox"}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        if container_port:
            container["ports"] = [{"containerPort": container_port}]
        pod = kube.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"nodeName": node, "containers": [container], "terminationGracePeriodSeconds": 30},
        })
        if ready:
            self.set_pod_phase(namespace, name, "Running", ready=True)
        return pod

    def set_pod_phase(self, namespace: str, name: str, phase: str, ready: bool = False) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conds = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now}]
        self.kube().patch_pod_status(namespace, name, {"status": {"phase": phase, "conditions": conds}})

    def delete_terminating_pods(self) -> list[str]:
        """What a kubelet would do after an eviction: remove pods marked for deletion."""
        kube = self.kube()
        gone = []
        for p in kube.list_pods():
            md = p["metadata"]
            if md.get("deletionTimestamp"):
                try:
                    kube.delete_pod(md["namespace"], md["name"], grace_s=0)
                except KubeError as e:
                    if e.status != 404:
                        raise
                gone.append(f"{md['namespace']}/{md['name']}")
        return gone


# kind -> (collection path, namespaced) for the manifests the tests apply.
_PATHS = {
    "Namespace": ("/api/v1/namespaces", False),
    "ServiceAccount": ("/api/v1/namespaces/{ns}/serviceaccounts", True),
    "ConfigMap": ("/api/v1/namespaces/{ns}/configmaps", True),
    "Service": ("/api/v1/namespaces/{ns}/services", True),
    "PersistentVolumeClaim": ("/api/v1/namespaces/{ns}/persistentvolumeclaims", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1/clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", True),
    "Deployment": ("/apis/apps/v1/namespaces/{ns}/deployments", True),
    "DaemonSet": ("/apis/apps/v1/namespaces/{ns}/daemonsets", True),
    "PodDisruptionBudget": ("/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets", True),
}


def apply_manifest(kube: Kube, doc: dict[str, Any]) -> dict[str, Any]:
    """Create one object (409 AlreadyExists is fine)."""
    path, namespaced = _PATHS[doc["kind"]]
    if namespaced:
        path = path.format(ns=doc["metadata"].get("namespace", "default"))
    try:
        return kube.api.request("POST", path, doc)
    except KubeError as e:
        if e.status != 409:
            raise
        return {}


def sa_token(kube: Kube, ns: str, name: str) -> str:
    """A service account (created if absent) and a one-hour token for it, from the TokenRequest API."""
    apply_manifest(kube, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}})
    r = kube.api.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                          "spec": {"expirationSeconds": 3600}})
    return str(r["status"]["token"])

"""A narrow, dict-in/dict-out seam over the official `kubernetes` client.

The actuators need about twenty calls; going through the client's ApiClient (auth, TLS, kubeconfig and
in-cluster config all handled by the official library) with plain JSON bodies keeps them independent of
the generated models' strict validation and of which API version of a kind the server serves (1.20
serves Eviction only at policy/v1beta1: the eviction body carries no apiVersion so the server's own
version applies). Every failure becomes a KubeError with the HTTP status (0: no answer).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class KubeError(Exception):
    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def not_found(self) -> bool:
        return self.status == 404


class KubeApi(Protocol):
    """Raw REST access: path relative to the server root, JSON bodies as dicts."""

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
                content_type: str | None = None) -> dict[str, Any]: ...


class OfficialKubeApi:
    """KubeApi over kubernetes.client.ApiClient (the official client)."""

    def __init__(self, api_client: Any, timeout_s: float = 10.0) -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s
        if not getattr(api_client.configuration, "verify_ssl", True):
            # The operator chose an unverified API endpoint (insecure-skip-tls-verify): say nothing per call.
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)

    @classmethod
    def from_host(cls, host: str, token: str | None = None, verify_ssl: bool = True,
                  ca_cert: str | None = None, timeout_s: float = 10.0) -> OfficialKubeApi:
        from kubernetes import client

        cfg = client.Configuration(host=host, verify_ssl=verify_ssl, ssl_ca_cert=ca_cert)
        if token:
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cls(client.ApiClient(cfg), timeout_s)

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None,
                    timeout_s: float = 10.0) -> OfficialKubeApi:
        """In-cluster config when running in a pod, else the kubeconfig file."""
        from kubernetes import client, config

        cfg = client.Configuration()
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=cfg)
                return cls(client.ApiClient(cfg), timeout_s)
            except config.ConfigException:
                pass
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        return cls(client.ApiClient(cfg), timeout_s)

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, str] | None = None,
                content_type: str | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        req = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=list((query or {}).items()),
            header_params=headers, body=body, auth_settings=["BearerToken"],
        )
        try:
            resp = self.api_client.call_api(*req, _request_timeout=self.timeout_s)
            resp.read()
        except ApiException as e:  # raised by the REST layer for some statuses
            raise KubeError(int(e.status or 0), str(e.reason), str(e.body or "")) from e
        except Exception as e:  # urllib3 timeouts, refused connections, TLS errors
            raise KubeError(0, type(e).__name__, str(e)) from e
        text = resp.data.decode("utf-8", "replace") if resp.data else ""
        if not 200 <= resp.status <= 299:
            reason = resp.reason or ""
            with contextlib.suppress(ValueError, AttributeError):
                reason = json.loads(text).get("reason", reason) or reason
            raise KubeError(int(resp.status), str(reason), text)
        return json.loads(text) if text else {}


def _q(s: str) -> str:
    return quote(s, safe="")


class Kube:
    """The typed calls the actuators use, over any KubeApi."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    # nodes
    def get_node(self, name: str) -> dict[str, Any]:
        return self.api.request("GET", f"/api/v1/nodes/{_q(name)}")

    def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        q = {"labelSelector": label_selector} if label_selector else None
        return list(self.api.request("GET", "/api/v1/nodes", query=q).get("items", []))

    def patch_node(self, name: str, patch: dict[str, Any], content_type: str = STRATEGIC) -> dict[str, Any]:
        return self.api.request("PATCH", f"/api/v1/nodes/{_q(name)}", patch, content_type=content_type)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("PATCH", f"/api/v1/nodes/{_q(name)}/status", patch, content_type=STRATEGIC)

    # pods
    def list_pods(self, namespace: str | None = None, field_selector: str | None = None,
                  label_selector: str | None = None) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods" if namespace else "/api/v1/pods"
        q = {}
        if field_selector:
            q["fieldSelector"] = field_selector
        if label_selector:
            q["labelSelector"] = label_selector
        return list(self.api.request("GET", path, query=q).get("items", []))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.request("GET", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}")

    def find_pod(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A replica's pod by name: in ``namespace`` if known, else in whichever namespace has it (the
        decisions layer names replicas, not namespaces). None if there is no such pod."""
        if namespace:
            try:
                return self.get_pod(namespace, name)
            except KubeError as e:
                if e.not_found:
                    return None
                raise
        pods = self.list_pods(field_selector=f"metadata.name={name}")
        return pods[0] if pods else None

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("PATCH", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}", patch,
                                content_type=STRATEGIC)

    def patch_pod_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("PATCH", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/status", patch,
                                content_type=STRATEGIC)

    def evict_pod(self, namespace: str, name: str, grace_s: int | None = None,
                  dry_run: bool = False) -> dict[str, Any]:
        # No apiVersion/kind: the server applies the version it serves (policy/v1beta1 on 1.20, v1 later).
        body: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace}}
        if grace_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_s}
        # A dry run checks the PodDisruptionBudgets (429 if one would break) without evicting.
        q = {"dryRun": "All"} if dry_run else None
        return self.api.request("POST", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}/eviction", body,
                                query=q)

    def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> dict[str, Any]:
        q = {"gracePeriodSeconds": str(grace_s)} if grace_s is not None else None
        return self.api.request("DELETE", f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}", query=q)

    # jobs
    def create_job(self, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("POST", f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs", job)

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.request("GET", f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}")

    def list_jobs(self, namespace: str | None = None, label_selector: str | None = None) -> list[dict[str, Any]]:
        path = f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs" if namespace else "/apis/batch/v1/jobs"
        q = {"labelSelector": label_selector} if label_selector else None
        return list(self.api.request("GET", path, query=q).get("items", []))

    def delete_job(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.request("DELETE", f"/apis/batch/v1/namespaces/{_q(namespace)}/jobs/{_q(name)}",
                                query={"propagationPolicy": "Background"})

    # events
    def list_events(self, namespace: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{_q(namespace)}/events" if namespace else "/api/v1/events"
        q = {"fieldSelector": field_selector} if field_selector else None
        return list(self.api.request("GET", path, query=q).get("items", []))

    def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("POST", f"/api/v1/namespaces/{_q(namespace)}/events", event)

    # leases
    def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases/{_q(name)}")

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        return self.api.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases", lease)

    def replace_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        return self.api.request(
            "PUT", f"/apis/coordination.k8s.io/v1/namespaces/{_q(namespace)}/leases/{_q(name)}", lease)

    # namespaces (the active-test namespace may need creating)
    def ensure_namespace(self, name: str) -> None:
        try:
            self.api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": name}})
        except KubeError as e:
            if e.status != 409:
                raise

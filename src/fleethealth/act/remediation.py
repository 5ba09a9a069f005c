"""Node reboot and power fencing through the engines clusters already run, and their results as events.

Theory of operation
-------------------
A repair ladder's ``reboot_node`` step is a SCHEDULE_RESET intent with ``action: NODE_REBOOT``. Instead of
rebooting anything itself, fleethealth hands it to what the cluster already runs:

* ``medik8s`` (default): the Medik8s remediation contract, as NodeHealthCheck uses it: a remediation
  custom resource **named after the node**, made from a template (``SelfNodeRemediation`` by default, or
  any other remediator's kind: ``FenceAgentsRemediation``, a Metal3 ``Metal3Remediation``), labelled as
  fleethealth's and annotated with the intent's idempotency key. SelfNodeRemediation or fence-agents carry
  it out and report in ``status.conditions`` (``Succeeded`` True or False).
* ``job``: a configured Job template (``{node}`` replaced by the node's name), for clusters with their
  own reboot tooling (an IPMI or cloud-API call); its completion or failure is the result.

A reboot at the next safe point (``when: next_safe_point``: the row-remap ladder's, on a node that stays
in service) is requested only once no GPU work runs on the node (``gpu_work``); until then the actuator
answers "in progress" and the runner tries again (the ladder's step timeout bounds the wait).

``request`` is idempotent: a resource that already exists for the node is left alone (a remediation is
under way, ours or NodeHealthCheck's: never two at once). ``results`` turns finished remediations into
``reset`` events (``payload.action: NODE_REBOOT``) that move the ladder on, then deletes our resource
(the remediator then stops fencing, as after NodeHealthCheck). Nothing moves on a timer here: a
remediation that never finishes is the ladder's timeout.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from fleethealth.act.kube_api import Kube, KubeError, _q
from fleethealth.decide.state import Event

MANAGED_BY = "app.kubernetes.io/managed-by"
KEY_ANNOTATION = "fleethealth.io/request-key"
REASON_ANNOTATION = "fleethealth.io/reason"


@dataclass(frozen=True)
class RemediatorConfig:
    via: str = "medik8s"  # medik8s | job
    api_version: str = "self-node-remediation.medik8s.io/v1alpha1"
    kind: str = "SelfNodeRemediation"
    plural: str = "selfnoderemediations"
    namespace: str = "medik8s"
    spec: dict[str, Any] = field(default_factory=lambda: {"remediationStrategy": "Automatic"})
    job_template: dict[str, Any] | None = None  # a batch/v1 Job; "{node}" anywhere is the node's name


def gpu_work(kube: Kube, node: str) -> list[str]:
    """The pods on ``node`` that request ``nvidia.com/gpu`` and have not finished (daemon sets aside):
    while there are any, the node is not at a safe point for a reset or a reboot."""
    busy = []
    for p in kube.list_pods(field_selector=f"spec.nodeName={node}"):
        md = p.get("metadata") or {}
        owners = [o.get("kind") for o in md.get("ownerReferences") or []]
        if "DaemonSet" in owners or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if any("nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {})
               for c in (p.get("spec") or {}).get("containers") or []):
            busy.append(f"{md.get('namespace')}/{md.get('name')}")
    return busy


def _subst(obj: Any, node: str) -> Any:
    return json.loads(json.dumps(obj).replace("{node}", node))


class NodeRemediator:
    def __init__(self, kube: Kube, cfg: RemediatorConfig | None = None) -> None:
        self.kube = kube
        self.cfg = cfg or RemediatorConfig()
        if self.cfg.via not in ("medik8s", "job"):
            raise ValueError(f"remediation via {self.cfg.via!r}: expected medik8s or job")
        if self.cfg.via == "job" and not self.cfg.job_template:
            raise ValueError("remediation via job needs a job_template")

    def _base(self) -> str:
        group_version = self.cfg.api_version
        return f"/apis/{group_version}/namespaces/{_q(self.cfg.namespace)}/{self.cfg.plural}"

    def _name(self, node: str) -> str:
        return node if self.cfg.via == "medik8s" else f"fleethealth-reboot-{node}"[:63].rstrip("-.")

    def request(self, node: str, key: str, reason: str) -> dict[str, Any]:
        """Ask for a reboot of ``node`` for intent ``key``. Returns what was done (for the outcome)."""
        labels = {MANAGED_BY: "fleethealth"}
        meta: dict[str, Any] = {"name": self._name(node), "namespace": self.cfg.namespace, "labels": labels,
                                "annotations": {KEY_ANNOTATION: key, REASON_ANNOTATION: reason[:250]}}
        if self.cfg.via == "medik8s":
            body: dict[str, Any] = {"apiVersion": self.cfg.api_version, "kind": self.cfg.kind, "metadata": meta,
                                    "spec": copy.deepcopy(self.cfg.spec)}
            path = self._base()
        else:
            body = _subst(self.cfg.job_template, node)
            body.setdefault("metadata", {})
            body["metadata"] = {**body["metadata"], **meta,
                                "labels": {**(body["metadata"].get("labels") or {}), **labels}}
            path = f"/apis/batch/v1/namespaces/{_q(self.cfg.namespace)}/jobs"
        try:
            self.kube.api.request("POST", path, body)
        except KubeError as e:
            if e.status == 409:
                return {"node": node, "remediation": self._name(node), "created": False, "exists": True}
            raise
        return {"node": node, "remediation": self._name(node), "created": True, "kind": body.get("kind", "Job")}

    def _items(self) -> list[dict[str, Any]]:
        q = {"labelSelector": f"{MANAGED_BY}=fleethealth"}
        path = self._base() if self.cfg.via == "medik8s" else f"/apis/batch/v1/namespaces/{_q(self.cfg.namespace)}/jobs"
        return list(self.kube.api.request("GET", path, query=q).get("items", []))

    @staticmethod
    def _verdict_medik8s(obj: dict[str, Any]) -> tuple[bool, str] | None:
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Succeeded" and c.get("status") in ("True", "False"):
                return c["status"] == "True", str(c.get("message") or c.get("reason") or "")
        return None

    @staticmethod
    def _verdict_job(obj: dict[str, Any]) -> tuple[bool, str] | None:
        st = obj.get("status") or {}
        for c in st.get("conditions") or []:
            if c.get("status") == "True" and c.get("type") in ("Complete", "Failed"):
                return c["type"] == "Complete", str(c.get("message") or c.get("reason") or "")
        return None

    def results(self, now: float) -> list[Event]:
        """Finished remediations as ``reset`` events; their resources are deleted once reported."""
        out: list[Event] = []
        for obj in self._items():
            md = obj.get("metadata") or {}
            verdict = self._verdict_medik8s(obj) if self.cfg.via == "medik8s" else self._verdict_job(obj)
            if verdict is None:
                continue
            passed, msg = verdict
            name = str(md.get("name", ""))
            node = name if self.cfg.via == "medik8s" else name.removeprefix("fleethealth-reboot-")
            key = (md.get("annotations") or {}).get(KEY_ANNOTATION, "")
            out.append(Event(now, "reset", node, passed=passed, actor=f"{self.cfg.kind if self.cfg.via == 'medik8s' else 'job'}",
                             payload={"action": "NODE_REBOOT", "key": key, "detail": msg}))
            base = self._base() if self.cfg.via == "medik8s" else f"/apis/batch/v1/namespaces/{_q(self.cfg.namespace)}/jobs"
            try:
                self.kube.api.request("DELETE", f"{base}/{_q(name)}", query={"propagationPolicy": "Background"})
            except KubeError as e:
                if e.status != 404:
                    raise
        return out

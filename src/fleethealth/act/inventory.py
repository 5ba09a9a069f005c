"""What runs where: nodes, pods and events read from Kubernetes into plain data for the decisions layer
(Xid attribution to jobs, the one-node-per-tensor-parallel-group rule, GPU capacity per node)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleethealth.act.config import ActuationConfig
from fleethealth.act.kube import is_daemonset_pod, tp_group_of
from fleethealth.act.kube_api import Kube

JOB_LABELS = ("job-name", "batch.kubernetes.io/job-name", "training.kubeflow.org/job-name",
              "jobset.sigs.k8s.io/jobset-name", "job")


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    node: str
    phase: str
    job: str | None
    tp_group: str | None
    gpus: int
    daemonset: bool
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    unschedulable: bool
    taints: tuple[tuple[str, str, str], ...]
    gpu_capacity: int
    gpu_allocatable: int
    conditions: dict[str, str]


@dataclass
class Inventory:
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    pods: list[PodInfo] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    def pods_on(self, node: str) -> list[PodInfo]:
        return [p for p in self.pods if p.node == node]

    def jobs_on(self, node: str) -> set[str]:
        return {p.job for p in self.pods_on(node) if p.job}

    def nodes_of_job(self, job: str) -> set[str]:
        return {p.node for p in self.pods if p.job == job and p.node}

    def tp_groups_on(self, node: str) -> set[str]:
        return {p.tp_group for p in self.pods_on(node) if p.tp_group}

    def nodes_of_tp_group(self, group: str) -> set[str]:
        return {p.node for p in self.pods if p.tp_group == group and p.node}

    def events_for(self, kind: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if (e.get("involvedObject") or {}).get("kind") == kind
                and (e.get("involvedObject") or {}).get("name") == name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": {n: {"labels": i.labels, "unschedulable": i.unschedulable, "taints": [list(t) for t in i.taints],
                          "gpu_capacity": i.gpu_capacity, "gpu_allocatable": i.gpu_allocatable,
                          "conditions": i.conditions, "pods": [p.id for p in self.pods_on(n)],
                          "jobs": sorted(self.jobs_on(n)), "tp_groups": sorted(self.tp_groups_on(n))}
                      for n, i in sorted(self.nodes.items())},
            "pods": [{"pod": p.id, "node": p.node, "phase": p.phase, "job": p.job, "tp_group": p.tp_group,
                      "gpus": p.gpus} for p in self.pods],
        }


def _int(v: Any) -> int:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return 0


def pod_info(pod: dict[str, Any], cfg: ActuationConfig) -> PodInfo:
    md, spec = pod.get("metadata", {}), pod.get("spec", {})
    labels = dict(md.get("labels") or {})
    job = next((labels[k] for k in JOB_LABELS if labels.get(k)), None)
    if job is None:
        job = next((o.get("name") for o in md.get("ownerReferences") or [] if o.get("kind") == "Job"), None)
    grp = tp_group_of(pod, cfg.tp_group_labels)
    gpus = sum(_int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
               for c in spec.get("containers") or [])
    return PodInfo(namespace=md.get("namespace", "default"), name=md.get("name", ""),
                   node=spec.get("nodeName") or "", phase=(pod.get("status") or {}).get("phase", ""),
                   job=job, tp_group=None if grp is None else f"{grp[0]}/{grp[2]}", gpus=gpus,
                   daemonset=is_daemonset_pod(pod), labels=labels)


def node_info(node: dict[str, Any]) -> NodeInfo:
    md, spec, st = node.get("metadata", {}), node.get("spec", {}), node.get("status", {})
    return NodeInfo(
        name=md.get("name", ""), labels=dict(md.get("labels") or {}),
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple((t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in spec.get("taints") or []),
        gpu_capacity=_int((st.get("capacity") or {}).get("nvidia.com/gpu", 0)),
        gpu_allocatable=_int((st.get("allocatable") or {}).get("nvidia.com/gpu", 0)),
        conditions={c.get("type", ""): c.get("status", "") for c in st.get("conditions") or []},
    )


def read_inventory(kube: Kube, cfg: ActuationConfig | None = None, with_events: bool = True) -> Inventory:
    cfg = cfg or ActuationConfig()
    inv = Inventory()
    for n in kube.list_nodes():
        ni = node_info(n)
        inv.nodes[ni.name] = ni
    inv.pods = [pod_info(p, cfg) for p in kube.list_pods()]
    if with_events:
        inv.events = kube.list_events()
    return inv

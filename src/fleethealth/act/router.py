"""Publishing replica weights where gateways can use them.

Health *scales* a weight; it never replaces the routing policy. Each gateway keeps its own policy (base
weights, locality, least-request, prefix/KV-cache affinity); fleethealth only multiplies the base weight
by the replica's health weight (0..1) and says whether the replica should take traffic at all:
- JSON (the controller's API): every replica's weight, state and the facts behind it.
- Envoy EDS: a ClusterLoadAssignment with load_balancing_weight = base x health (integer >= 1, Envoy's
  minimum) and health_status HEALTHY, DEGRADED (used only when healthy capacity runs out) or DRAINING.
- Yes/no gateways (Gateway API Inference Extension, llm-d, vLLM production-stack): a pod condition that a
  readiness gate names (fleethealth.io/healthy) and labels, so an unhealthy replica leaves the endpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fleethealth.act.config import ActuationConfig
from fleethealth.act.fence import EPOCH_ANNOTATION, Fence, StaleEpoch, stale_epoch
from fleethealth.act.kube import rfc3339
from fleethealth.act.kube_api import Kube, KubeError
from fleethealth.act.outcome import Outcome
from fleethealth.decide.model import Intent, IntentKind

CLA_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
OUT_OF_SERVICE = frozenset({"DRAINING", "QUARANTINED", "FAILED"})


@dataclass(frozen=True, slots=True)
class ReplicaWeight:
    replica: str
    weight: float  # 0..1 health weight, already held/ramped by the decisions layer
    state: str = "READY"
    value: float | None = None
    confidence: float | None = None
    address: str | None = None
    port: int | None = None
    ts: float = 0.0
    namespace: str = "default"
    pod: str | None = None
    zone: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"replica": self.replica, "weight": round(self.weight, 6), "state": self.state,
                "value": self.value, "confidence": self.confidence, "address": self.address, "port": self.port,
                "ts": self.ts}


def takes_traffic(w: ReplicaWeight, threshold: float = 0.5) -> bool:
    """The yes/no answer for gateways that cannot weight."""
    return w.state not in OUT_OF_SERVICE and w.weight >= threshold


def envoy_health(w: ReplicaWeight) -> str:
    if w.state in OUT_OF_SERVICE or w.weight <= 0.0:
        return "DRAINING"
    if w.state == "DEGRADED":
        return "DEGRADED"
    return "HEALTHY"


def envoy_weight(w: ReplicaWeight, base: int = 100) -> int:
    """base x health, at least 1 (Envoy rejects 0; a replica at 0 is marked DRAINING instead)."""
    return max(1, int(round(base * max(0.0, min(1.0, w.weight)))))


def weights_document(weights: Mapping[str, ReplicaWeight], now: float) -> dict[str, Any]:
    return {"ts": now, "replicas": {r: w.to_dict() | {"takes_traffic": takes_traffic(w)}
                                    for r, w in sorted(weights.items())}}


def cluster_load_assignment(cluster: str, weights: Mapping[str, ReplicaWeight],
                            base_weights: Mapping[str, int] | None = None, default_base: int = 100) -> dict[str, Any]:
    """Envoy v3 ClusterLoadAssignment (JSON form). Replicas without an address are left out."""
    by_zone: dict[str, list[dict[str, Any]]] = {}
    for r, w in sorted(weights.items()):
        if not w.address or not w.port:
            continue
        base = (base_weights or {}).get(r, default_base)
        by_zone.setdefault(w.zone or "", []).append({
            "endpoint": {"address": {"socket_address": {"address": w.address, "port_value": int(w.port)}},
                         "hostname": r},
            "health_status": envoy_health(w),
            "load_balancing_weight": envoy_weight(w, base),
            "metadata": {"filter_metadata": {"fleethealth": {"replica": r, "state": w.state,
                                                             "health_weight": round(w.weight, 4)}}},
        })
    endpoints = []
    for zone, lbs in sorted(by_zone.items()):
        group: dict[str, Any] = {"lb_endpoints": lbs}
        if zone:
            group["locality"] = {"zone": zone}
        endpoints.append(group)
    return {"@type": CLA_TYPE, "cluster_name": cluster, "endpoints": endpoints}


def eds_discovery_response(cluster: str, weights: Mapping[str, ReplicaWeight], version_info: str,
                           base_weights: Mapping[str, int] | None = None) -> dict[str, Any]:
    """A DiscoveryResponse for Envoy's REST EDS (POST /v3/discovery:endpoints)."""
    return {"version_info": version_info, "type_url": CLA_TYPE,
            "resources": [cluster_load_assignment(cluster, weights, base_weights)]}


class WeightBoard:
    """The latest weight per replica, shared by the SET_WEIGHT actuator and the controller's API."""

    def __init__(self) -> None:
        self.weights: dict[str, ReplicaWeight] = {}
        self.version = 0

    def set(self, w: ReplicaWeight) -> bool:
        old = self.weights.get(w.replica)
        if old is not None and (old.weight, old.state, old.address, old.port) == (w.weight, w.state, w.address,
                                                                                  w.port):
            return False
        self.weights[w.replica] = w
        self.version += 1
        return True


def weight_from_intent(intent: Intent) -> ReplicaWeight:
    p = intent.params
    return ReplicaWeight(
        replica=intent.entity, weight=float(p.get("weight", 0.0)), state=str(p.get("state", "READY")),
        value=p.get("value"), confidence=p.get("confidence"), address=p.get("address"),
        port=None if p.get("port") is None else int(p["port"]), ts=intent.ts,
        namespace=str(p.get("namespace", "default")), pod=p.get("pod"), zone=p.get("zone"),
    )


class RouterActuator:
    """SET_WEIGHT: update the weight board; with a Kube, also the pod's readiness-gate condition and labels."""

    name = "router"
    kinds = frozenset({IntentKind.SET_WEIGHT})

    def __init__(self, board: WeightBoard, kube: Kube | None = None, config: ActuationConfig | None = None) -> None:
        self.board = board
        self.kube = kube
        self.cfg = config or ActuationConfig()
        self.fence: Fence | None = None

    def bind_fence(self, fence: Fence) -> None:
        """The runner's fence: pod writes carry its epoch (``<prefix>/leader-epoch``) and the pod's
        resourceVersion, and a pod a newer leader wrote is left alone (act.fence.StaleEpoch)."""
        self.fence = fence

    def apply(self, intent: Intent) -> Outcome:
        w = weight_from_intent(intent)
        changed = self.board.set(w)
        if self.kube is None or not (w.pod or intent.params.get("pod_gate", True)):
            return Outcome.success(replica=w.replica, changed=changed)
        pod = w.pod or w.replica
        yes = takes_traffic(w, self.cfg.healthy_weight_threshold)
        try:
            found = self.kube.find_pod(pod, intent.params.get("namespace"))
        except KubeError as e:
            return Outcome.from_status(e.status, e.reason)
        if found is None:
            return Outcome.success(replica=w.replica, changed=changed, pod="absent")
        cur = found
        w = replace(w, namespace=cur["metadata"].get("namespace", w.namespace), pod=pod)
        if self.board.weights.get(w.replica) is not None:
            self.board.weights[w.replica] = replace(self.board.weights[w.replica], namespace=w.namespace, pod=pod)
        if w.address is None or w.port is None:
            # EDS needs an address: the pod's IP and its first container port, unless the intent said.
            ip = (cur.get("status") or {}).get("podIP")
            ports = [pt.get("containerPort") for c in (cur.get("spec") or {}).get("containers") or []
                     for pt in c.get("ports") or [] if pt.get("containerPort")]
            w = replace(w, address=w.address or ip, port=w.port or (int(ports[0]) if ports else None))
            if w.address and w.port:
                changed = self.board.set(w) or changed
        p = self.cfg.label_prefix
        want = {f"{p}/healthy": "true" if yes else "false", f"{p}/state": w.state}
        md = cur.get("metadata", {})
        labels = md.get("labels") or {}
        mine = None if self.fence is None else self.fence.epoch
        epoch_key = f"{p}/{EPOCH_ANNOTATION}"
        if stale_epoch((md.get("annotations") or {}).get(epoch_key), mine):
            raise StaleEpoch(f"pod {w.namespace}/{pod} was written by a newer leader "
                             f"(epoch {(md.get('annotations') or {}).get(epoch_key)}, this one {mine})")
        # conditional on the version read: a write in between is a 409, retried by the runner
        pre = {"resourceVersion": md.get("resourceVersion")} if mine is not None else {}
        try:
            if any(labels.get(k) != v for k, v in want.items()):
                ann = {"annotations": {epoch_key: str(mine)}} if mine is not None else {}
                self.kube.patch_pod(w.namespace, pod, {"metadata": {"labels": want, **ann, **pre}})
                pre = {}  # the version moved on: the status patch below follows our own write
            status = "True" if yes else "False"
            old = next((c for c in (cur.get("status") or {}).get("conditions") or []
                        if c.get("type") == self.cfg.readiness_condition), None)
            if old is None or old.get("status") != status:
                self.kube.patch_pod_status(w.namespace, pod, {**({"metadata": pre} if pre else {}),
                                                              "status": {"conditions": [{
                    "type": self.cfg.readiness_condition, "status": status,
                    "reason": "HealthWeight" if yes else "Unhealthy",
                    "message": f"weight={w.weight:.3f} state={w.state}",
                    "lastTransitionTime": rfc3339(intent.ts or 0.0)}]}})
        except KubeError as e:
            return Outcome.from_status(e.status, e.reason)
        return Outcome.success(replica=w.replica, changed=changed, takes_traffic=yes)

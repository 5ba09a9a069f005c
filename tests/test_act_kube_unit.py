"""Pure parts of the Kubernetes actuator: drain planning as kubectl drain does it (plus tensor-parallel
groups), taints, conditions, label values, score bands, Job manifests. The real API server is exercised
in test_act_k8s.py."""

from __future__ import annotations

from typing import Any

from fleethealth.act.active_test import dns_name, job_manifest, job_verdict
from fleethealth.act.config import ActuationConfig
from fleethealth.act.kube import (
    condition,
    label_value,
    plan_drain,
    score_band,
    with_taints,
    without_taints,
)


def pod(name: str, ns: str = "default", labels: dict[str, str] | None = None, owner: str | None = None,
        mirror: bool = False, phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {}}
    if owner:
        md["ownerReferences"] = [{"kind": owner, "name": "o", "uid": "u", "controller": True}]
    if mirror:
        md["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    if deleting:
        md["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": md, "status": {"phase": phase}}


def test_plan_drain_skips_like_kubectl_and_groups_tensor_parallel_pods() -> None:
    cfg = ActuationConfig()
    tp = {"fleethealth.io/tp-group": "job7"}
    others = {("default", "fleethealth.io/tp-group", "job7"): [pod("tp-0", labels=tp), pod("tp-1", labels=tp),
                                                                 pod("tp-2", labels=tp, deleting=True)]}
    test_pod = pod("dcgm-diag")
    test_pod["spec"] = {"tolerations": [{"key": cfg.taint_key, "operator": "Exists"}]}
    node_pods = [pod("web", owner="ReplicaSet"), pod("ds", owner="DaemonSet"), pod("static", mirror=True),
                 pod("done", phase="Succeeded"), pod("going", deleting=True), pod("tp-0", labels=tp),
                 pod("bare"), test_pod]
    plan = plan_drain(node_pods, cfg, lambda ns, lab, val: others[(ns, lab, val)])
    assert plan.groups == [[("default", "bare")], [("default", "tp-0"), ("default", "tp-1")], [("default", "web")]]
    why = {s["pod"]: s["why"] for s in plan.skipped}
    assert why == {"default/ds": "daemonset pod", "default/static": "mirror pod", "default/done": "finished",
                   "default/going": "already terminating", "default/dcgm-diag": "tolerates the quarantine taint"}
    # With ignore_daemonsets off, a DaemonSet pod is evicted like any other.
    plan2 = plan_drain([pod("ds", owner="DaemonSet")], ActuationConfig(ignore_daemonsets=False))
    assert plan2.groups == [[("default", "ds")]]


def test_taints_touch_only_our_key() -> None:
    theirs = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    out = with_taints([theirs, {"key": "fh", "value": "old", "effect": "NoExecute"}], "fh", "QUARANTINED",
                      ["NoSchedule"])
    assert out == [theirs, {"key": "fh", "value": "QUARANTINED", "effect": "NoSchedule"}]
    assert without_taints(out, "fh") == [theirs]


def test_condition_keeps_transition_time_and_is_none_when_unchanged() -> None:
    node: dict[str, Any] = {"status": {"conditions": []}}
    c1 = condition(node, "GPUHealthy", False, "gate:xid_79", "m", 100.0)
    assert c1 is not None and c1["reason"] == "GateXid79" and c1["status"] == "False"
    node["status"]["conditions"] = [c1]
    assert condition(node, "GPUHealthy", False, "gate:xid_79", "m", 200.0) is None
    c2 = condition(node, "GPUHealthy", False, "gate:xid_79", "m2", 200.0)
    assert c2 is not None and c2["lastTransitionTime"] == c1["lastTransitionTime"]
    c3 = condition(node, "GPUHealthy", True, "recovered", "ok", 300.0)
    assert c3 is not None and c3["lastTransitionTime"] != c1["lastTransitionTime"]
    c4 = condition(node, "GPUHealthy", None, "no_fresh_data", "stale", 400.0)
    assert c4 is not None and c4["status"] == "Unknown" and c4["reason"] == "NoFreshData"


def test_label_values_and_bands() -> None:
    assert label_value("gate:xid_79") == "gate_xid_79"
    assert len(label_value("x" * 100)) == 63
    assert [score_band(v) for v in (None, 0.95, 0.8, 0.5, 0.1)] == ["unknown", "high", "medium", "low", "critical"]


def test_active_test_job_is_pinned_and_tolerates_our_taint() -> None:
    cfg = ActuationConfig()
    job = job_manifest("gpu-node-1.example", "dcgm_diag_r2", "fleethealth-system", "abcdef0123456789", cfg, gpus=8)
    spec = job["spec"]["template"]["spec"]
    assert spec["nodeName"] == "gpu-node-1.example"
    assert {"key": cfg.taint_key, "operator": "Exists"} in spec["tolerations"]
    assert spec["containers"][0]["command"] == ["dcgmi", "diag", "-r", "2"]
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert job["spec"]["backoffLimit"] == 0 and spec["restartPolicy"] == "Never"
    assert len(job["metadata"]["name"]) <= 63 and job["metadata"]["name"] == dns_name(job["metadata"]["name"])
    nccl = job_manifest("n", "nccl_bandwidth", "ns", "k" * 16, cfg, gpus=4)
    assert nccl["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "4"
    assert job_verdict({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "passed"
    assert job_verdict({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "failed"
    assert job_verdict({"status": {"active": 1}}) == "running"


def test_deploy_manifests_parse_and_the_controller_config_validates() -> None:
    from pathlib import Path

    import yaml

    from fleethealth.controller.config import ControllerConfig

    deploy = Path(__file__).resolve().parent.parent / "deploy"
    docs = {f: list(yaml.safe_load_all((deploy / f).read_text())) for f in ("rbac.yaml", "controller.yaml",
                                                                             "agent.yaml")}
    kinds = {d["kind"] for ds in docs.values() for d in ds}
    assert {"ServiceAccount", "ClusterRole", "Deployment", "DaemonSet", "Role"} <= kinds
    dep = next(d for d in docs["controller.yaml"] if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 2
    cm = next(d for d in docs["controller.yaml"] if d["kind"] == "ConfigMap")
    cfg = ControllerConfig.model_validate(yaml.safe_load(cm["data"]["controller.yaml"]))
    assert cfg.actuation.mode == "advise" and cfg.kubernetes is not None and cfg.kubernetes.leader_election
    role = next(d for d in docs["rbac.yaml"] if d["kind"] == "ClusterRole" and d["metadata"]["name"] ==
                "fleethealth-controller")
    grants = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert ("pods/eviction", "create") in grants and ("nodes/status", "patch") in grants
    assert not any(r == "secrets" for r, _ in grants)
    assert ("pods", "delete") not in grants and ("nodes", "delete") not in grants
    ds = docs["agent.yaml"][0]
    tol = ds["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "fleethealth.io/unhealthy", "operator": "Exists"} in tol  # keeps reporting in quarantine


def test_intent_state_names_unknown_and_params() -> None:
    from fleethealth.act.kube import intent_state
    from fleethealth.decide.model import Intent, IntentKind, Tier

    assert intent_state(Intent(0, IntentKind.QUARANTINE, "n", "r", {}, Tier.NODE)) == "QUARANTINED"
    assert intent_state(Intent(0, IntentKind.NO_NEW_WORK, "n", "r", {"value": None}, Tier.NODE)) == "UNKNOWN"
    assert intent_state(Intent(0, IntentKind.NO_NEW_WORK, "n", "r", {"value": 0.6}, Tier.NODE)) == "DEGRADED"
    assert intent_state(Intent(0, IntentKind.DRAIN, "n", "r", {"state": "DRAINING"}, Tier.NODE)) == "DRAINING"

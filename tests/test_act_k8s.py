"""The actuators against a real kube-apiserver 1.20.2 + kube-controller-manager (k8s_harness), a real
Alertmanager and a real Prometheus, driven with intents as the decisions layer emits them.

End to end: quarantine -> cordoned, tainted, conditioned node, evicted pods (a PDB-protected pod stays,
reported; DaemonSet pods stay; a tensor-parallel group goes together), a page reaching the webhook with the
evidence link, an evidence bundle on disk; then a passed active-test Job -> RELEASE -> uncordon.
Leader election: the second replica takes over when the first stops, and nothing is done twice.
RBAC: the shipped ClusterRole is enough for every action and forbids what it should.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from act_support import ALERTMANAGER, alertmanager_with_webhook, free_port, wait_until
from fleethealth.act.active_test import ActiveTests
from fleethealth.act.config import ActuationConfig
from fleethealth.act.evidence import EvidenceCollector, EvidenceIndex, PrometheusRange
from fleethealth.act.inventory import read_inventory
from fleethealth.act.kube import KubeNodeActuator
from fleethealth.act.kube_api import Kube, KubeError
from fleethealth.act.lease import LeaseElector
from fleethealth.act.ledger import Ledger
from fleethealth.act.pager import AlertmanagerPager
from fleethealth.act.router import RouterActuator, WeightBoard
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import Intent, IntentKind, Tier
from k8s_harness import KubeCluster, apply_manifest, skip_reason

pytestmark = [pytest.mark.needs_k8s, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def rv(kube: Kube, node: str) -> str:
    return str(kube.get_node(node)["metadata"]["resourceVersion"])


def pdb(kube: Kube, name: str, selector: dict[str, str], min_available: int = 1) -> None:
    apply_manifest(kube, {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
                          "metadata": {"name": name, "namespace": "default"},
                          "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}}})

    def computed() -> bool:
        st = kube.api.request("GET", f"/apis/policy/v1beta1/namespaces/default/poddisruptionbudgets/{name}")
        return st.get("status", {}).get("observedGeneration") == st["metadata"]["generation"] and \
            st["status"].get("currentHealthy", 0) >= min_available

    wait_until(computed, 30, 0.1, what=f"PDB {name} status from the disruption controller")


def daemonset(kube: Kube, name: str) -> dict[str, Any]:
    """A real DaemonSet object (no controller runs it) so its pods' ownerReference survives the GC."""
    ds = apply_manifest(kube, {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"ds": name}}, "template": {
            "metadata": {"labels": {"ds": name}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": ds["metadata"]["uid"],
            "controller": True}


def terminating(kube: Kube, ns: str, name: str) -> bool:
    try:
        return bool(kube.get_pod(ns, name)["metadata"].get("deletionTimestamp"))
    except KubeError as e:
        return e.status == 404


def test_quarantine_page_evidence_then_active_test_and_release(cluster: KubeCluster, tmp_path: Path) -> None:
    if ALERTMANAGER is None:
        pytest.skip("prometheus-alertmanager not installed")
    kube = cluster.kube()
    node, other = "gpu-node-1", "gpu-node-2"
    cluster.add_node(node, gpus=8, labels={"pool": "pool-a"})
    cluster.add_node(other, gpus=8)
    ds_owner = daemonset(kube, "fleethealth-agent")
    tp = {"fleethealth.io/tp-group": "llama-tp0"}
    cluster.add_pod("free-1", node, labels={"job-name": "train-3"}, gpus=4)
    cluster.add_pod("guarded-1", node, labels={"app": "guarded"}, gpus=2)
    cluster.add_pod("agent-x", node, owner=ds_owner, labels={"ds": "fleethealth-agent"})
    cluster.add_pod("tp-0", node, labels=tp, gpus=1)
    cluster.add_pod("tp-1", other, labels=tp, gpus=1)
    cluster.add_pod("bystander", other)
    pdb(kube, "guarded", {"app": "guarded"})

    # Inventory: what runs where, GPU capacity, jobs and TP groups.
    inv = read_inventory(kube)
    assert inv.nodes[node].gpu_capacity == 8
    assert {p.name for p in inv.pods_on(node)} == {"free-1", "guarded-1", "agent-x", "tp-0"}
    assert inv.jobs_on(node) == {"train-3"}
    assert inv.nodes_of_tp_group("default/llama-tp0") == {node, other}

    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), drain_timeout_s=30.0, drain_block_s=1.0,
                          backoff_initial_s=0.2, attempts_per_cycle=1, test_namespace="fleethealth-system")
    ledger = Ledger(tmp_path / "state.db")
    index = EvidenceIndex(tmp_path / "state.db")
    tests = ActiveTests(kube, cfg)
    with alertmanager_with_webhook() as (am, hook):
        evidence = EvidenceCollector(tmp_path / "evidence", index, kube=kube,
                                     prometheus=PrometheusRange(f"http://127.0.0.1:{free_port()}", timeout_s=1),  # down
                                     tuple_history=lambda e: [{"ts": 1.0, "value": 0.05, "flags": ["xid:79"]}])
        node_act = KubeNodeActuator(kube, cfg, active_tests=tests)
        pager = AlertmanagerPager(am.url)  # the runner links it to the evidence collector
        runner = ActuationRunner({
            IntentKind.NO_NEW_WORK: [node_act], IntentKind.CAPTURE_EVIDENCE: [evidence],
            IntentKind.QUARANTINE: [evidence, node_act], IntentKind.RUN_ACTIVE_TEST: [tests],
            IntentKind.PAGE: [pager], IntentKind.RELEASE: [node_act],
        }, ledger, cfg)

        now = time.time()
        info = {"from": "DEGRADED", "value": 0.05}
        intents = [
            Intent(now, IntentKind.NO_NEW_WORK, node, "gate:xid_79", {"n": 1}, Tier.NODE),
            Intent(now, IntentKind.CAPTURE_EVIDENCE, node, "gate:xid_79",
                   {"window_s": 300, "before": "quarantine", **info, "n": 2}, Tier.NODE),
            Intent(now, IntentKind.QUARANTINE, node, "gate:xid_79", {**info, "n": 3}, Tier.NODE),
            Intent(now, IntentKind.RUN_ACTIVE_TEST, node, "gate:xid_79",
                   {"tests": ["dcgm_diag_r2", "nccl_bandwidth"], "n": 4}, Tier.NODE),
            Intent(now, IntentKind.PAGE, node, "gate:xid_79", {"severity": "page", "state": "FAILED", "n": 5}),
        ]
        t0 = time.monotonic()
        results = {(r.kind, r.actuator): r for r in runner.submit_all(intents)}
        elapsed = time.monotonic() - t0
        print(f"quarantine intents applied in {elapsed:.2f}s (one drain pass waits {cfg.drain_block_s}s at most)")

        assert results[("no_new_work", "kubernetes")].status == "applied"
        q = results[("quarantine", "kubernetes")]
        # The PDB keeps guarded-1: the drain is in progress, retried later (not holding the caller for the
        # whole drain limit), never forced.
        assert q.status == "retrying" and q.detail["in_progress"], q
        assert elapsed < 10.0
        assert q.detail["not_evicted"] == ["default/guarded-1"]
        assert q.detail["blocked"]["default/guarded-1"].startswith("429")
        assert set(q.detail["evicted"]) == {"default/free-1", "default/tp-0", "default/tp-1"}
        assert {"pod": "default/agent-x", "why": "daemonset pod"} in q.detail["skipped"]
        assert q.detail["groups"] == [["default/tp-0", "default/tp-1"]]
        assert q.detail["forced"] == []

        n = kube.get_node(node)
        assert n["spec"]["unschedulable"] is True
        assert {"key": "fleethealth.io/unhealthy", "value": "QUARANTINED", "effect": "NoSchedule"} in n["spec"]["taints"]
        assert not any(t["effect"] == "NoExecute" for t in n["spec"]["taints"])  # not unless configured
        assert n["metadata"]["labels"]["fleethealth.io/state"] == "QUARANTINED"
        assert n["metadata"]["labels"]["fleethealth.io/score-band"] == "critical"
        cond = next(c for c in n["status"]["conditions"] if c["type"] == "GPUHealthy")
        assert cond["status"] == "False" and cond["reason"] == "GateXid79" and "score=0.050" in cond["message"]
        assert next(c for c in n["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"  # untouched

        assert terminating(kube, "default", "free-1") and terminating(kube, "default", "tp-1")
        assert not terminating(kube, "default", "guarded-1")
        assert not terminating(kube, "default", "agent-x") and not terminating(kube, "default", "bystander")
        cluster.delete_terminating_pods()  # the kubelet's part

        # Evidence bundle, before the quarantine, with the Kubernetes events of our own NO_NEW_WORK.
        ev = results[("capture_evidence", "evidence")]
        assert ev.status == "applied"
        bundle = Path(ev.detail["path"])
        assert (bundle / "manifest.json").exists()
        events = json.loads((bundle / "events.json").read_text())["events"]
        assert any(e["reason"] == "FleetHealthNoNewWork" for e in events)
        assert results[("quarantine", "evidence")].detail.get("reused") is True
        assert index.list(node)[0]["path"] == str(bundle)
        node_doc = json.loads((bundle / "node.json").read_text())
        assert node_doc["spec"]["unschedulable"] is True and node_doc["capacity"]["nvidia.com/gpu"] == "8"
        assert {p["name"] for p in node_doc["pods"]} >= {"free-1", "guarded-1"}

        # The page reaches the webhook with the evidence link.
        wait_until(lambda: any(a["labels"]["entity"] == node for a in hook.alerts()), 20, what="page at webhook")
        page = next(a for a in hook.alerts() if a["labels"]["entity"] == node)
        assert page["labels"]["alertname"] == "FleetHealthEntityFailed"
        assert page["annotations"]["evidence"] == str(bundle)

        # Replaying the same intents (a restart) changes nothing on the node.
        before = rv(kube, node)
        again = runner.submit_all([intents[0], intents[1], intents[3], intents[4]])
        assert {r.status for r in again} == {"duplicate"}
        assert rv(kube, node) == before

        # The PDB-blocked pod is retried later; still blocked, still not forced.
        time.sleep(0.3)
        [retry] = [r for r in runner.retry_due() if r.kind == "quarantine"]
        assert retry.status == "retrying" and retry.detail["not_evicted"] == ["default/guarded-1"]

        # Active tests: Jobs pinned to the node, tolerating our taint.
        jobs = kube.list_jobs("fleethealth-system")
        assert len(jobs) == 2
        for j in jobs:
            spec = j["spec"]["template"]["spec"]
            assert spec["nodeName"] == node
            assert any(t.get("key") == "fleethealth.io/unhealthy" for t in spec["tolerations"])
        assert tests.latest_verdict(node) == "running"
        # No pass, no uncordon.
        release = Intent(time.time(), IntentKind.RELEASE, node, "event:test_passed", {"canary": True, "n": 6}, Tier.NODE)
        refused = node_act.apply(release)
        assert not refused.ok and refused.retry and "(latest: running)" in refused.error
        assert kube.get_node(node)["spec"]["unschedulable"] is True

        # Play the kubelet: the Job controller's test pods succeed.
        def test_pods() -> list[dict[str, Any]]:
            return kube.list_pods("fleethealth-system", label_selector="fleethealth.io/active-test=true")

        try:
            wait_until(lambda: len(test_pods()) == 2, 30, 0.1, what="job controller creating test pods")
        except TimeoutError:
            print([(e["reason"], e["message"]) for e in kube.list_events("fleethealth-system")])
            print(cluster.log("controller-manager", 3000))
            raise
        for p in test_pods():
            assert p["spec"]["nodeName"] == node
            cluster.set_pod_phase("fleethealth-system", p["metadata"]["name"], "Succeeded")
        wait_until(lambda: tests.latest_verdict(node) == "passed", 30, 0.1, what="jobs complete")
        [round_] = tests.rounds(node)  # both tests of the round passed: one event for the decisions layer
        ev_ = round_.to_event()
        assert ev_["passed"] and ev_["entity"] == node and ev_["test"] == "dcgm_diag_r2+nccl_bandwidth"

        [rel] = runner.submit(release)
        assert rel.status == "applied", rel
        n = kube.get_node(node)
        assert not n["spec"].get("unschedulable")
        assert not any(t["key"] == "fleethealth.io/unhealthy" for t in n["spec"].get("taints") or [])
        assert n["metadata"]["labels"]["fleethealth.io/state"] == "RECOVERING"
        cond = next(c for c in n["status"]["conditions"] if c["type"] == "GPUHealthy")
        assert cond["status"] == "True"


def test_one_failed_test_fails_the_round_and_blocks_release(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-node-9")
    cfg = ActuationConfig(test_namespace="fh-round")
    tests = ActiveTests(kube, cfg)
    act = KubeNodeActuator(kube, cfg, active_tests=tests)
    assert act.apply(Intent(1.0, IntentKind.NO_NEW_WORK, "gpu-node-9", "x", {"value": 0.2}, Tier.NODE)).ok
    assert tests.apply(Intent(1.0, IntentKind.RUN_ACTIVE_TEST, "gpu-node-9", "x",
                              {"tests": ["dcgm_diag_r2", "nccl_bandwidth"]}, Tier.NODE)).ok
    wait_until(lambda: len(kube.list_pods("fh-round")) == 2, 30, 0.1, what="test pods")
    for p in kube.list_pods("fh-round"):
        ok = p["metadata"]["labels"]["fleethealth.io/test"] == "dcgm_diag_r2"
        cluster.set_pod_phase("fh-round", p["metadata"]["name"], "Succeeded" if ok else "Failed")
    wait_until(lambda: [r.verdict for r in tests.rounds("gpu-node-9")] == ["failed"], 30, 0.1, what="round failed")
    out = act.apply(Intent(2.0, IntentKind.RELEASE, "gpu-node-9", "x", {}, Tier.NODE))
    assert not out.ok and not out.retry and "(latest: failed)" in out.error
    assert kube.get_node("gpu-node-9")["spec"]["unschedulable"] is True


def test_tensor_parallel_group_goes_whole_or_not_at_all(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-node-10")
    cluster.add_node("gpu-node-11")
    grp = {"fleethealth.io/tp-group": "tp-held"}
    cluster.add_pod("tph-0", "gpu-node-10", labels=grp)
    cluster.add_pod("tph-1", "gpu-node-11", labels={**grp, "app": "tph1"})
    pdb(kube, "tph1", {"app": "tph1"})  # the member on the other node is protected
    out = KubeNodeActuator(kube, ActuationConfig(drain_timeout_s=1.0, backoff_initial_s=0.2)).apply(
        Intent(1.0, IntentKind.DRAIN, "gpu-node-10", "x", {}, Tier.NODE))
    # At the drain limit: reported (not retried, not forced) for a human to look at.
    assert not out.ok and not out.retry and "not evicted within" in out.error
    assert sorted(out.detail["not_evicted"]) == ["default/tph-0", "default/tph-1"]
    assert out.detail["blocked"]["default/tph-1"].startswith("429")
    # Neither rank was evicted: the job keeps running until the whole group can go.
    assert not terminating(kube, "default", "tph-0") and not terminating(kube, "default", "tph-1")
    # ...and `kubectl describe node` says why.
    events = kube.list_events(field_selector="involvedObject.name=gpu-node-10")
    blocked_ev = [e for e in events if e["reason"] == "FleetHealthDrainBlocked"]
    assert blocked_ev and "default/tph-1" in blocked_ev[0]["message"]


def test_noexecute_only_when_configured(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-node-12")
    KubeNodeActuator(kube, ActuationConfig(noexecute=True)).apply(
        Intent(1.0, IntentKind.NO_NEW_WORK, "gpu-node-12", "x", {"value": 0.1}, Tier.NODE))
    effects = {t["effect"] for t in kube.get_node("gpu-node-12")["spec"]["taints"] if t["key"] == "fleethealth.io/unhealthy"}
    assert effects == {"NoSchedule", "NoExecute"}


def test_missing_node_condition_is_skipped_but_a_missing_node_cordon_fails(cluster: KubeCluster) -> None:
    act = KubeNodeActuator(cluster.kube(), ActuationConfig())
    flag = act.apply(Intent(1.0, IntentKind.SET_CONDITION, "vllm-replica-3", "min:latency",
                            {"condition": "HealthFlagged", "status": True, "value": 0.8}))
    assert flag.ok and "no Kubernetes node" in flag.detail["skipped"]
    cordon = act.apply(Intent(1.0, IntentKind.NO_NEW_WORK, "ghost-node", "x", {"value": 0.1}, Tier.NODE))
    assert not cordon.ok and not cordon.retry and cordon.error.startswith("404")


def test_replica_pod_is_found_in_any_namespace_and_rebuilt_by_eviction(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    kube.ensure_namespace("serving")
    cluster.add_node("gpu-node-15")
    cluster.add_pod("vllm-7", "gpu-node-15", namespace="serving", labels={"app": "vllm"}, container_port=8000)
    act = KubeNodeActuator(kube, ActuationConfig())
    out = act.apply(Intent(1.0, IntentKind.REBUILD_WORKER, "vllm-7", "leak:kv_cache", {"from": "DEGRADED"},
                           Tier.POD))
    assert out.ok and out.detail["evicted"] == ["serving/vllm-7"]
    assert terminating(kube, "serving", "vllm-7")
    gone = act.apply(Intent(1.0, IntentKind.REBUILD_WORKER, "vllm-404", "x", {}, Tier.POD))
    assert gone.ok and gone.detail["skipped"] == "no pod vllm-404"
    board = WeightBoard()
    assert RouterActuator(board, kube).apply(Intent(2.0, IntentKind.SET_WEIGHT, "vllm-7", "x", {"weight": 0.1},
                                                    Tier.INSTANCE)).ok
    labels = kube.get_pod("serving", "vllm-7")["metadata"]["labels"]
    assert labels["fleethealth.io/healthy"] == "false" and board.weights["vllm-7"].namespace == "serving"


def test_no_fresh_data_is_unknown_not_unhealthy(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-node-14")
    act = KubeNodeActuator(kube, ActuationConfig())
    assert act.apply(Intent(1.0, IntentKind.NO_NEW_WORK, "gpu-node-14", "no_fresh_data",
                            {"value": None, "confidence": 0.0}, Tier.NODE)).ok
    n = kube.get_node("gpu-node-14")
    assert n["spec"]["unschedulable"] is True  # nothing new lands on an unknown node
    assert n["metadata"]["labels"]["fleethealth.io/state"] == "UNKNOWN"
    assert n["metadata"]["labels"]["fleethealth.io/score-band"] == "unknown"
    cond = next(c for c in n["status"]["conditions"] if c["type"] == "GPUHealthy")
    assert cond["status"] == "Unknown" and cond["reason"] == "NoFreshData"


def test_operator_cordon_is_not_lifted_by_us(cluster: KubeCluster, tmp_path: Path) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-node-op")
    kube.patch_node("gpu-node-op", {"spec": {"unschedulable": True}})  # an operator's own cordon
    act = KubeNodeActuator(kube, ActuationConfig())
    out = act.apply(Intent(1.0, IntentKind.ALLOW_NEW_WORK, "gpu-node-op", "ready", {"value": 0.95}, Tier.NODE))
    assert out.ok
    assert kube.get_node("gpu-node-op")["spec"]["unschedulable"] is True


def test_leader_failover_acts_once(cluster: KubeCluster, tmp_path: Path) -> None:
    kube = cluster.kube()
    kube.ensure_namespace("fleethealth-system")
    cluster.add_node("gpu-node-3")
    a = LeaseElector(kube, "replica-a", name="fh-test-lease", lease_duration_s=2.0, renew_deadline_s=1.5)
    b = LeaseElector(kube, "replica-b", name="fh-test-lease", lease_duration_s=2.0, renew_deadline_s=1.5)
    assert a.step() and not b.step()
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.NO_NEW_WORK}))
    ledger_path = tmp_path / "shared.db"  # both replicas on one ledger (RWX volume in deploy/)
    runner_a = ActuationRunner({IntentKind.NO_NEW_WORK: [KubeNodeActuator(kube, cfg)]}, Ledger(ledger_path), cfg,
                               is_leader=a.is_leader)
    runner_b = ActuationRunner({IntentKind.NO_NEW_WORK: [KubeNodeActuator(kube, cfg)]}, Ledger(ledger_path), cfg,
                               is_leader=b.is_leader)
    it = Intent(time.time(), IntentKind.NO_NEW_WORK, "gpu-node-3", "min:thermal", {"value": 0.5, "n": 1}, Tier.NODE)
    assert [r.status for r in runner_a.submit(it)] == ["applied"]
    assert [r.status for r in runner_b.submit(it)] == ["not_leader"]
    acted_rv = rv(kube, "gpu-node-3")

    # Replica A dies (stops renewing). It stops acting by itself within its renew deadline...
    t_dead = time.monotonic()
    wait_until(lambda: not a.is_leader(), 3, 0.05, what="A to step down")
    assert runner_a.submit(it)[0].status == "not_leader"
    # ...and B takes over once the lease expires.
    wait_until(lambda: b.step(), 10, 0.2, what="B to take the lease")
    takeover = time.monotonic() - t_dead
    print(f"leader takeover after {takeover:.2f}s (lease 2s)")
    assert takeover < 5.0
    lease = kube.get_lease("fleethealth-system", "fh-test-lease")
    assert lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] >= 1
    assert not a.step()  # A comes back: B holds a live lease

    # B replays the intent: the shared ledger knows it is done; the node is not written again.
    assert [r.status for r in runner_b.submit(it)] == ["duplicate"]
    # Even with a ledger of its own, the idempotent actuator writes nothing.
    lone = ActuationRunner({IntentKind.NO_NEW_WORK: [KubeNodeActuator(kube, cfg)]}, Ledger(tmp_path / "own.db"),
                           cfg, is_leader=b.is_leader)
    [r] = lone.submit(it)
    assert r.status == "applied" and r.detail["spec"] is False and r.detail["condition"] is False
    assert rv(kube, "gpu-node-3") == acted_rv
    b.release()
    assert not b.is_leader()


def test_readiness_gate_condition_and_labels(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-node-4")
    cluster.add_pod("vllm-0", "gpu-node-4", labels={"app": "vllm"}, container_port=8000)
    board = WeightBoard()
    act = RouterActuator(board, kube)
    low = Intent(1.0, IntentKind.SET_WEIGHT, "vllm-0", "min:latency", {"weight": 0.2, "state": "DEGRADED"},
                 Tier.INSTANCE)
    assert act.apply(low).ok
    p = kube.get_pod("default", "vllm-0")
    assert p["metadata"]["labels"]["fleethealth.io/healthy"] == "false"
    gate = next(c for c in p["status"]["conditions"] if c["type"] == "fleethealth.io/healthy")
    assert gate["status"] == "False"
    high = Intent(2.0, IntentKind.SET_WEIGHT, "vllm-0", "ok", {"weight": 0.9, "state": "READY"}, Tier.INSTANCE)
    assert act.apply(high).ok
    p = kube.get_pod("default", "vllm-0")
    assert p["metadata"]["labels"]["fleethealth.io/healthy"] == "true"
    assert next(c for c in p["status"]["conditions"] if c["type"] == "fleethealth.io/healthy")["status"] == "True"
    assert board.weights["vllm-0"].weight == 0.9
    # The pod's IP and port fill the EDS endpoint (the decisions layer knows replicas, not addresses).
    kube.patch_pod_status("default", "vllm-0", {"status": {"podIP": "10.9.8.7"}})
    act.apply(Intent(3.0, IntentKind.SET_WEIGHT, "vllm-0", "ok", {"weight": 0.8, "state": "READY"}, Tier.INSTANCE))
    w = board.weights["vllm-0"]
    assert (w.address, w.port, w.weight) == ("10.9.8.7", 8000, 0.8)
    from fleethealth.act.router import cluster_load_assignment

    [ep] = cluster_load_assignment("llama", board.weights)["endpoints"][0]["lb_endpoints"]
    assert ep["endpoint"]["address"]["socket_address"] == {"address": "10.9.8.7", "port_value": 8000}
    assert ep["load_balancing_weight"] == 80


def _sa_token(kube: Kube, ns: str, sa: str) -> str:
    import base64

    def token() -> str | None:
        acct = kube.api.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}")
        for ref in acct.get("secrets") or []:
            sec = kube.api.request("GET", f"/api/v1/namespaces/{ns}/secrets/{ref['name']}")
            if sec.get("data", {}).get("token"):
                return base64.b64decode(sec["data"]["token"]).decode()
        return None

    return str(wait_until(token, 30, 0.2, what="service-account token from the token controller"))


def test_shipped_rbac_is_enough_and_least_privilege(cluster: KubeCluster, tmp_path: Path) -> None:
    admin = cluster.kube()
    for doc in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()):
        apply_manifest(admin, doc)
    token = _sa_token(admin, "fleethealth-system", "fleethealth-controller")
    sa = cluster.kube(token)
    cluster.add_node("gpu-node-5", gpus=4)
    cluster.add_pod("w-0", "gpu-node-5", labels={"job-name": "j"})
    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), drain_timeout_s=1.0)
    tests = ActiveTests(sa, cfg)
    act = KubeNodeActuator(sa, cfg)
    # Every action the controller takes works with the shipped role (RBAC errors would be 403).
    q = act.apply(Intent(1.0, IntentKind.QUARANTINE, "gpu-node-5", "gate:xid_48", {"value": 0.0}, Tier.NODE))
    assert q.ok, q
    assert tests.apply(Intent(1.0, IntentKind.RUN_ACTIVE_TEST, "gpu-node-5", "gate:xid_48",
                              {"tests": ["dcgm_diag_r2"]}, Tier.NODE)).ok
    assert tests.results("gpu-node-5")
    assert read_inventory(sa).nodes["gpu-node-5"].gpu_capacity == 4
    elector = LeaseElector(sa, "controller-0", lease_duration_s=5)
    assert elector.step()
    evidence = EvidenceCollector(tmp_path / "ev", EvidenceIndex(tmp_path / "i.db"), kube=sa)
    ev = evidence.apply(Intent(1.0, IntentKind.CAPTURE_EVIDENCE, "gpu-node-5", "x", {}))
    assert not [p for p in ev.detail["problems"] if "kubernetes" in p]
    # ...and nothing more.
    forbidden = [
        lambda: sa.api.request("GET", "/api/v1/namespaces/fleethealth-system/secrets"),
        lambda: sa.api.request("DELETE", "/api/v1/nodes/gpu-node-5"),
        lambda: sa.delete_pod("default", "w-0"),
        lambda: sa.get_lease("kube-system", "kube-controller-manager"),
    ]
    for call in forbidden:
        with pytest.raises(KubeError) as exc:
            call()
        assert exc.value.status == 403


class RacingApi:
    """Wraps the real API: just before our first node PATCH, another writer changes the node, so the real
    server answers 409 to our stale resourceVersion (no mock of the answer itself)."""

    def __init__(self, inner: Any, other: Kube, node: str) -> None:
        self.inner, self.other, self.node, self.raced = inner, other, node, 0

    def request(self, method: str, path: str, body: Any = None, query: Any = None,
                content_type: str | None = None) -> dict[str, Any]:
        if method == "PATCH" and path == f"/api/v1/nodes/{self.node}" and not self.raced:
            self.raced += 1
            self.other.patch_node(self.node, {"metadata": {"labels": {"someone-else": "was-here"}}})
        return dict(self.inner.request(method, path, body, query, content_type))


def test_conflicting_writer_gets_409_and_we_recompute(cluster: KubeCluster) -> None:
    admin = cluster.kube()
    cluster.add_node("gpu-node-6")
    racing = RacingApi(cluster.api(), admin, "gpu-node-6")
    out = KubeNodeActuator(Kube(racing), ActuationConfig()).apply(
        Intent(1.0, IntentKind.NO_NEW_WORK, "gpu-node-6", "min:thermal", {"value": 0.6}, Tier.NODE))
    assert out.ok and racing.raced == 1
    n = admin.get_node("gpu-node-6")
    assert n["spec"]["unschedulable"] is True
    assert n["metadata"]["labels"]["someone-else"] == "was-here"  # their write survived ours


def test_unreachable_api_is_retryable_and_recorded(tmp_path: Path) -> None:
    from fleethealth.act.kube_api import OfficialKubeApi

    kube = Kube(OfficialKubeApi.from_host(f"https://127.0.0.1:{free_port()}", token="x", verify_ssl=False,
                                          timeout_s=1.0))
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.NO_NEW_WORK}), attempts_per_cycle=2,
                          backoff_initial_s=0.05)
    runner = ActuationRunner({IntentKind.NO_NEW_WORK: [KubeNodeActuator(kube, cfg)]}, Ledger(tmp_path / "l.db"), cfg)
    it = Intent(1.0, IntentKind.NO_NEW_WORK, "n", "x", {}, Tier.NODE)
    [r] = runner.submit(it)
    assert r.status == "retrying" and r.error.startswith("0:")
    assert len(runner.ledger.attempts(it.key)) == 2


def test_kill_switch_stops_a_drain_in_progress(cluster: KubeCluster, tmp_path: Path) -> None:
    import threading

    kube = cluster.kube()
    cluster.add_node("gpu-node-7")
    cluster.add_pod("held-7", "gpu-node-7", labels={"app": "held7"})
    pdb(kube, "held7", {"app": "held7"})
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.DRAIN}), drain_timeout_s=60.0,
                          drain_block_s=60.0, attempts_per_cycle=1)
    act = KubeNodeActuator(kube, cfg)  # the runner binds its kill switch to the drain
    runner = ActuationRunner({IntentKind.DRAIN: [act]}, Ledger(tmp_path / "l.db"), cfg)
    threading.Timer(1.0, runner.kill, args=("operator",)).start()
    t0 = time.monotonic()
    [r] = runner.submit(Intent(1.0, IntentKind.DRAIN, "gpu-node-7", "x", {}, Tier.NODE))
    took = time.monotonic() - t0
    assert took < 10.0, took  # not the 60 s drain limit
    assert r.detail["not_evicted"] == ["default/held-7"] and r.detail["forced"] == []
    assert not terminating(kube, "default", "held-7")
    assert runner.submit(Intent(2.0, IntentKind.DRAIN, "gpu-node-7", "y", {}, Tier.NODE))[0].status == "killed"


def test_controller_and_agent_manifests_are_accepted_by_the_api_server(cluster: KubeCluster) -> None:
    admin = cluster.kube()
    for f in ("rbac.yaml", "controller.yaml", "agent.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / f).read_text()):
            if doc["kind"] == "PodDisruptionBudget":
                doc["apiVersion"] = "policy/v1beta1"  # 1.20 predates policy/v1
            apply_manifest(admin, doc)
    dep = admin.api.request("GET", "/apis/apps/v1/namespaces/fleethealth-system/deployments/fleethealth-controller")
    assert dep["spec"]["replicas"] == 2
    ds = admin.api.request("GET", "/apis/apps/v1/namespaces/fleethealth-system/daemonsets/fleethealth-agent")
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "fleethealth-agent"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fault_on_simulated_exporter_to_quarantine_and_back(cluster: KubeCluster, tmp_path: Path) -> None:
    """The whole loop on real servers: simulator exporter -> Prometheus -> controller (score, decide) ->
    runner -> kube-apiserver. An Xid 79 on node-02 ends with node-02 cordoned, tainted and conditioned, its
    pod evicted and an evidence bundle with Prometheus' window; a repair and passed active-test Jobs bring
    it back (RELEASE -> uncordon)."""
    import threading

    sim_server = pytest.importorskip("fleethealth.sim.server", reason="simulator exporter not available")
    from fleethealth.controller.loop import Controller
    from fleethealth.decide.state import Event
    from fleethealth.policy import default_policy
    from fleethealth.sim.scenario import Scenario
    from fleethealth.sim.simulation import Simulation
    from fleethealth.sources.prometheus import PrometheusSource
    from prom_harness import PROMETHEUS, prometheus

    if PROMETHEUS is None:
        pytest.skip("prometheus not installed")
    p = default_policy()
    policy = p.model_copy(update={
        "freshness": p.freshness.model_copy(update={"max_age_s": 4.0, "rate_window_s": 30.0}),
        "lifecycle": p.lifecycle.model_copy(update={
            "degraded_dwell_s": 2.0, "quarantine_dwell_s": 2.0, "ready_dwell_s": 4.0, "warming_s": 1.0,
            "recovering_dwell_s": 4.0}),
        "fleet": p.fleet.model_copy(update={"min_entities": 3}),
        "xid": p.xid.model_copy(update={"window_s": 5.0}),
        # the way out through active-test Jobs only: the repair ladder (a reboot first for an Xid 79) has its
        # own end-to-end test on this API server (tests/test_repair_executors.py)
        "remediation": p.remediation.model_copy(update={"enabled": False}),
    })
    scenario = Scenario.model_validate({"name": "act-e2e", "seed": 5, "duration": "1d", "fleet": {"pools": [
        {"name": "train-a", "nodes": 6, "workload": "training", "jobs": [{"name": "pretrain", "pp": 1}]}]}})
    sim = Simulation(scenario)
    nodes = list(sim.fleet.nodes)
    kube = cluster.kube()
    for n in nodes:
        cluster.add_node(n, gpus=8, labels={"pool": "train-a"})
    bad = "node-02"
    cluster.add_pod("pretrain-rank-2", bad, labels={"job-name": "pretrain"}, gpus=8)

    cfg = ActuationConfig(mode="enforce", enforce=frozenset(IntentKind), drain_timeout_s=2.0,
                          attempts_per_cycle=1, backoff_initial_s=0.2, test_namespace="fh-e2e")
    tests = ActiveTests(kube, cfg)
    node_act = KubeNodeActuator(kube, cfg, active_tests=tests)
    exporter = sim_server.SimExporterServer(sim).start()
    try:
        with prometheus([], scrape_interval_s=1.0, http_sd=[f"{exporter.url}/sd"]) as prom:
            prom.wait_for("up == 1", min_results=len(nodes), timeout_s=30)
            evidence = EvidenceCollector(tmp_path / "evidence", EvidenceIndex(tmp_path / "state.db"),
                                         prometheus=PrometheusRange(prom.url), kube=kube, window_s=120)
            runner = ActuationRunner({
                IntentKind.NO_NEW_WORK: [node_act], IntentKind.ALLOW_NEW_WORK: [node_act],
                IntentKind.SET_CONDITION: [node_act], IntentKind.CAPTURE_EVIDENCE: [evidence],
                IntentKind.QUARANTINE: [evidence, node_act], IntentKind.DRAIN: [evidence, node_act],
                IntentKind.RELEASE: [node_act], IntentKind.RUN_ACTIVE_TEST: [tests],
                IntentKind.SET_WEIGHT: [RouterActuator(WeightBoard())],
            }, Ledger(tmp_path / "ledger.db"), cfg)
            def test_events(now: float) -> list[Event]:
                return [Event(now, "active_test", r.entity, passed=r.verdict == "passed", actor=f"job/{r.job}")
                        for r in tests.new_verdicts()]

            source = PrometheusSource(prom.url, policy, timeout_s=2)
            ctl = Controller(policy, [source], interval_s=0.5, runner=runner, events=test_events)
            th = threading.Thread(target=ctl.run, daemon=True)
            th.start()
            try:
                wait_until(lambda: all(ctl.state.entities.get(n) is not None
                                       and ctl.state.entities[n].state.value == "READY" for n in nodes),
                           60, 0.1, what="every node READY")
                wait_until(lambda: not any(kube.get_node(n)["spec"].get("unschedulable") for n in nodes), 20, 0.2,
                           what="no node cordoned while healthy")

                exporter.inject({"kind": "xid79_off_bus", "target": f"{bad}/gpu3", "onset": 0})
                exporter.advance(scenario.step)
                t_fault = time.monotonic()

                def isolated() -> bool:
                    n = kube.get_node(bad)
                    return bool(n["spec"].get("unschedulable")) and any(
                        t["key"] == cfg.taint_key and t["value"] == "QUARANTINED" for t in n["spec"].get("taints") or [])

                wait_until(isolated, 30, 0.05, what=f"{bad} cordoned and tainted QUARANTINED")
                latency = time.monotonic() - t_fault
                print(f"\nfault on the exporter -> node cordoned+tainted on the API server: {latency:.2f}s")
                n = kube.get_node(bad)
                cond = next(c for c in n["status"]["conditions"] if c["type"] == "GPUHealthy")
                assert cond["status"] == "False" and cond["reason"].startswith("Gate")
                wait_until(lambda: terminating(kube, "default", "pretrain-rank-2"), 15, 0.1, what="pod evicted")
                cluster.delete_terminating_pods()
                for other in nodes:
                    if other != bad:
                        assert not any(t["key"] == cfg.taint_key for t in kube.get_node(other)["spec"].get("taints")
                                       or []), other
                [bundle] = evidence.index.list(bad)
                metrics = json.loads((Path(bundle["path"]) / "metrics.json").read_text())
                assert any(q["series"] > 0 for q in metrics["queries"].values())

                # A technician repairs the node; the active tests (Jobs pinned to it) pass.
                wait_until(lambda: len(kube.list_pods("fh-e2e")) >= 2, 30, 0.1, what="active-test pods")
                sim.apply_action(bad, "repair", exporter.now())
                exporter.advance(scenario.step)
                assert sim.active_test(bad, exporter.now())
                for pod in kube.list_pods("fh-e2e"):
                    cluster.set_pod_phase("fh-e2e", pod["metadata"]["name"], "Succeeded")

                def released() -> bool:
                    return any(r.status == "applied" for r in runner.ledger.actions(entity=bad)
                               if r.kind == "release")

                try:
                    wait_until(released, 60, 0.1, what=f"RELEASE of {bad} applied")
                except TimeoutError:
                    print("STATE", ctl.state.entities[bad])
                    print("TESTS", [r.to_event() for r in tests.results()])
                    for r in runner.ledger.actions(entity=bad):
                        print("LEDGER", r.kind, r.actuator, r.status, r.last_error, r.intent.get("reason"))
                    print("TRANS", [t for t in ctl.published.recent_transitions if t["entity"] == bad])
                    raise
                wait_until(lambda: not kube.get_node(bad)["spec"].get("unschedulable"), 10, 0.1,
                           what=f"{bad} uncordoned")
                n = kube.get_node(bad)
                assert not any(t["key"] == cfg.taint_key for t in n["spec"].get("taints") or [])
                print(f"{bad}: {ctl.state.entities[bad].state.value} after release; "
                      f"{len(runner.ledger.actions(status='applied'))} actions applied in all")
            finally:
                ctl.stop()
                th.join(10)
                source.close()
    finally:
        exporter.stop()


def test_kubeconfig_and_inventory_cli(cluster: KubeCluster) -> None:
    from typer.testing import CliRunner

    from fleethealth.act.kube_api import OfficialKubeApi
    from fleethealth.cli.main import app

    cluster.add_node("gpu-node-13", gpus=4)
    cluster.add_pod("inv-0", "gpu-node-13", labels={"job-name": "train-x", "fleethealth.io/tp-group": "g1"}, gpus=4)
    via_file = Kube(OfficialKubeApi.from_config(str(cluster.kubeconfig)))
    assert "gpu-node-13" in {n["metadata"]["name"] for n in via_file.list_nodes()}
    res = CliRunner().invoke(app, ["act", "inventory", "--kubeconfig", str(cluster.kubeconfig)])
    assert res.exit_code == 0, res.output
    inv, _ = json.JSONDecoder().raw_decode(res.output[res.output.index("{"):])
    n = inv["nodes"]["gpu-node-13"]
    assert n["gpu_capacity"] == 4 and n["jobs"] == ["train-x"] and n["tp_groups"] == ["default/g1"]


def test_sigkilled_leader_is_replaced_and_nothing_is_done_twice(cluster: KubeCluster, tmp_path: Path) -> None:
    """Two replica processes share a ledger; the leader is SIGKILLed; the other takes over and finds the
    intent already applied."""
    import subprocess
    import sys
    import threading

    kube = cluster.kube()
    kube.ensure_namespace("fleethealth-system")
    cluster.add_node("gpu-node-16")
    intent = Intent(time.time(), IntentKind.NO_NEW_WORK, "gpu-node-16", "min:thermal", {"value": 0.55, "n": 1},
                    Tier.NODE)
    ledger = str(tmp_path / "shared.db")
    script = str(Path(__file__).with_name("act_replica.py"))

    class Replica:
        def __init__(self, identity: str) -> None:
            self.lines: list[dict[str, Any]] = []
            self.proc = subprocess.Popen(
                [sys.executable, script, cluster.url, cluster.token, identity, ledger, json.dumps(intent.to_dict())],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

        def _read(self) -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(json.loads(line))

        def saw(self, **kv: Any) -> bool:
            return any(all(line.get(k) == v for k, v in kv.items()) for line in self.lines)

    a = Replica("replica-a")
    try:
        wait_until(lambda: a.saw(status="applied"), 60, 0.1, what="replica A leading and applying")
        b = Replica("replica-b")
        try:
            wait_until(lambda: a.saw(status="duplicate"), 20, 0.1, what="A's next loop (duplicate)")
            assert not b.saw(leader=True)
            acted_rv = rv(kube, "gpu-node-16")
            t_kill = time.monotonic()
            a.proc.kill()  # SIGKILL: no release of the lease, no goodbye
            a.proc.wait(10)
            wait_until(lambda: b.saw(leader=True), 20, 0.1, what="B taking the lease")
            takeover = time.monotonic() - t_kill
            wait_until(lambda: b.saw(status="duplicate"), 20, 0.1, what="B replaying the intent")
            print(f"\nSIGKILLed leader replaced after {takeover:.2f}s (lease 2s)")
            assert not b.saw(status="applied")  # the shared ledger knew: acted on once
            assert rv(kube, "gpu-node-16") == acted_rv
            assert kube.get_lease("fleethealth-system", "fh-replica-lease")["spec"]["holderIdentity"] == "replica-b"
        finally:
            b.proc.kill()
            b.proc.wait(10)
    finally:
        if a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait(10)

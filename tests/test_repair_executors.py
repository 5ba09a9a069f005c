"""The repair ladder's executors. The agent's GPU reset against a fake NVML and a fake `nvidia-smi`
(never a real GPU: a reset would take a GPU from whatever runs on it): success, a busy GPU, persistence
mode, a failing reset with its bug-report bundle. The request/answer path on a real kube-apiserver: the
node actuator writes the request, the agent answers it once; a node reboot through a Medik8s remediation
resource (its CRD installed in the test cluster; the test plays the remediator by setting its status),
whose result comes back as the event that moves the ladder on."""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path
from typing import Any

import pytest

from decide_support import tup
from fleethealth.act.kube import KubeNodeActuator
from fleethealth.act.remediation import NodeRemediator, RemediatorConfig
from fleethealth.agent.reset import RESULT, RESULT_DETAIL, RESULT_KEY, GpuResetter, ResetWatcher
from fleethealth.decide.decider import Decider
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import DecisionState, Event
from fleethealth.policy import default_policy
from fleethealth.sources.nvml import FakeGpu, FakeNvml
from k8s_harness import KubeCluster, skip_reason


def fake_smi(tmp: Path, rc: int = 0, stderr: str = "") -> tuple[str, Path]:
    """A stand-in `nvidia-smi` that logs its arguments and exits ``rc``."""
    logf = tmp / "smi.log"
    script = tmp / "nvidia-smi"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {logf}\necho '{stderr}' >&2\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), logf


def resetter(tmp: Path, gpus: list[FakeGpu], rc: int = 0, stderr: str = "", **kw: Any) -> tuple[GpuResetter, Path]:
    smi, logf = fake_smi(tmp, rc, stderr)
    nv = FakeNvml(gpus)
    nv.nvmlInit()
    return GpuResetter(nv, smi=smi, bug_report="no-such-bug-report-tool", bundle_dir=tmp / "bundles",
                       node="node-1", **kw), logf


def test_reset_success_runs_nvidia_smi_per_gpu(tmp_path: Path) -> None:
    r, logf = resetter(tmp_path, [FakeGpu(0), FakeGpu(1), FakeGpu(2)])
    res = r.reset([1, 2])
    assert res.passed and res.gpus == ("gpu1", "gpu2") and res.bundle is None
    assert logf.read_text().splitlines() == ["--gpu-reset -i 00000000:38:00.0", "--gpu-reset -i 00000000:58:00.0"]


def test_busy_gpu_is_refused_with_the_pids(tmp_path: Path) -> None:
    r, logf = resetter(tmp_path, [FakeGpu(0, processes=[4242, 4343])])
    res = r.reset([0])
    assert res.status == "refused" and "2 process(es) still hold it (pid 4242, 4343)" in res.detail
    assert not logf.exists()  # nothing was reset


def test_persistence_mode_refused_or_turned_off_and_back(tmp_path: Path) -> None:
    r, logf = resetter(tmp_path, [FakeGpu(0, persistence=1)])
    res = r.reset([0])
    assert res.status == "refused" and "persistence mode is on" in res.detail and not logf.exists()
    (tmp_path / "b").mkdir()
    r2, logf2 = resetter(tmp_path / "b", [FakeGpu(0, persistence=1)], allow_persistence_off=True)
    assert r2.reset([0]).passed
    assert logf2.read_text().splitlines() == ["-i 00000000:18:00.0 -pm 0", "--gpu-reset -i 00000000:18:00.0",
                                              "-i 00000000:18:00.0 -pm 1"]


def test_failed_reset_collects_a_bundle(tmp_path: Path) -> None:
    r, _ = resetter(tmp_path, [FakeGpu(0)], rc=1, stderr="Unable to reset GPU: In use by another client")
    res = r.reset([0])
    assert res.status == "failed" and "In use by another client" in res.detail
    assert res.bundle is not None and Path(res.bundle).is_file()
    assert "Unable to reset GPU" in Path(res.bundle).read_text()
    (tmp_path / "lost").mkdir()
    lost, _ = resetter(tmp_path / "lost", [FakeGpu(0, lost=True)])
    res = lost.reset([0])
    assert res.status == "failed" and "GpuIsLost" in res.detail and "reboot" in res.detail


# ---- on a real kube-apiserver -----------------------------------------------------------------------

needs_k8s = [pytest.mark.needs_k8s, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]

SNR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "selfnoderemediations.self-node-remediation.medik8s.io"},
    "spec": {"group": "self-node-remediation.medik8s.io", "scope": "Namespaced",
             "names": {"plural": "selfnoderemediations", "singular": "selfnoderemediation",
                       "kind": "SelfNodeRemediation", "listKind": "SelfNodeRemediationList"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def _wait_crd(kube: Any) -> None:
    import time

    for _ in range(100):
        try:
            kube.api.request("GET", "/apis/self-node-remediation.medik8s.io/v1alpha1/namespaces/medik8s/"
                                    "selfnoderemediations")
            return
        except Exception:
            time.sleep(0.1)
    raise AssertionError("the remediation CRD was never served")


@pytest.mark.needs_k8s
def test_agent_answers_the_reset_request_once(cluster: KubeCluster, tmp_path: Path) -> None:
    kube = cluster.kube()
    cluster.add_node("gpu-a")
    act = KubeNodeActuator(kube)
    # the ladder's first step, as the decider emits it
    dec = Decider(default_policy())
    d = dec.decide(DecisionState(), [tup("gpu-a", 0.0, reason="gate:recovery_action",
                                         flags=("recovery_action:GPU_RESET",))], 0.0)
    reset = next(i for i in d.intents if i.kind == IntentKind.SCHEDULE_RESET)
    assert act.apply(reset).ok
    ann = kube.get_node("gpu-a")["metadata"]["annotations"]
    assert ann["fleethealth.io/reset-requested"] == "GPU_RESET"
    assert ann["fleethealth.io/reset-request-key"] == reset.key
    reported: list[dict[str, Any]] = []
    r, logf = resetter(tmp_path, [FakeGpu(i) for i in range(8)])
    w = ResetWatcher("gpu-a", kube, r, reported.append)
    # not cordoned yet: refused, with the reason, and reported as a failure (the ladder escalates)
    res = w.poll()
    assert res is not None and res.status == "refused" and "not cordoned" in res.detail
    assert reported[-1]["passed"] is False and reported[-1]["payload"]["key"] == reset.key
    assert w.poll() is None  # answered once
    # a new request (a new key) after the node is cordoned: reset and passed
    kube.patch_node("gpu-a", {"spec": {"unschedulable": True}})
    kube.patch_node("gpu-a", {"metadata": {"annotations": {"fleethealth.io/reset-request-key": "k2",
                                                           "fleethealth.io/reset-gpus": "gpu-a/gpu3"}}})
    w2 = ResetWatcher("gpu-a", kube, r, reported.append)  # a restarted agent reads the record on the node
    res = w2.poll()
    assert res is not None and res.passed and logf.read_text().count("--gpu-reset") == 1
    ann = kube.get_node("gpu-a")["metadata"]["annotations"]
    assert ann[RESULT] == "passed" and ann[RESULT_KEY] == "k2" and "gpu3" in ann[RESULT_DETAIL]
    assert ResetWatcher("gpu-a", kube, r).poll() is None  # the result key on the node is the record


@pytest.mark.needs_k8s
def test_reboot_through_a_medik8s_resource_moves_the_ladder(cluster: KubeCluster) -> None:
    kube = cluster.kube()
    kube.ensure_namespace("medik8s")
    kube.api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SNR_CRD)
    _wait_crd(kube)
    cluster.add_node("gpu-b")
    pol = default_policy()
    dec = Decider(pol)
    act = KubeNodeActuator(kube)
    act.remediator = NodeRemediator(kube, RemediatorConfig())
    bad = [tup("gpu-b", 0.0, reason="gate:recovery_action", flags=("recovery_action:NODE_REBOOT",))]
    d = dec.decide(DecisionState(), bad, 0.0)
    assert d.state.entities["gpu-b"].state == State.QUARANTINED
    reboot = next(i for i in d.intents if i.kind == IntentKind.SCHEDULE_RESET)
    assert reboot.params["action"] == "NODE_REBOOT" and reboot.params["ladder"] == "reboot-class"
    out = act.apply(reboot)
    assert out.ok
    base = "/apis/self-node-remediation.medik8s.io/v1alpha1/namespaces/medik8s/selfnoderemediations"
    cr = kube.api.request("GET", f"{base}/gpu-b")
    assert cr["metadata"]["annotations"]["fleethealth.io/request-key"] == reboot.key
    assert act.apply(reboot).ok  # again: the resource exists, nothing new
    rem = act.remediator
    assert rem.results(60.0) == []  # not finished: no event, nothing on a timer
    # the test plays SelfNodeRemediation: the node was fenced and rebooted
    cr["status"] = {"conditions": [{"type": "Succeeded", "status": "True", "reason": "RemediationFinished",
                                    "message": "node rebooted"}]}
    kube.api.request("PUT", f"{base}/gpu-b", cr)
    [ev] = rem.results(120.0)
    assert ev.kind == "reset" and ev.entity == "gpu-b" and ev.passed is True
    assert ev.payload["action"] == "NODE_REBOOT" and ev.payload["key"] == reboot.key
    assert kube.api.request("GET", base)["items"] == []  # ours, reported, deleted
    # the event moves the ladder on: verification by an active test, then the node may recover
    good = [tup("gpu-b", 1.0)]
    d2 = dec.decide(d.state, good, 120.0, [ev])
    test = next(i for i in d2.intents if i.kind == IntentKind.RUN_ACTIVE_TEST)
    assert test.params["verify"] == "reboot_node"
    d3 = dec.decide(d2.state, good, 700.0, [Event(690.0, "active_test", "gpu-b", passed=True)])
    assert d3.state.entities["gpu-b"].state == State.RECOVERING


@pytest.mark.needs_k8s
def test_a_row_remap_reset_waits_for_the_next_safe_point(cluster: KubeCluster, tmp_path: Path) -> None:
    """The row-remap ladder's reset (the node stays in service) is not refused while GPU work runs: the
    agent answers it once the node is drained (issue 17: the remap's reset through the ladder)."""
    kube = cluster.kube()
    cluster.add_node("gpu-r")
    act = KubeNodeActuator(kube)
    dec = Decider(default_policy())
    d = dec.decide(DecisionState(), [
        tup("gpu-r", 0.8, reason="min:memory", flags=("row_remap_pending",)),
        tup("gpu-r/gpu2", 0.8, kind="gpu", labels={"node": "gpu-r"}, flags=("row_remap_pending", "xid:63"))], 0.0)
    reset = next(i for i in d.intents if i.kind == IntentKind.SCHEDULE_RESET)
    assert reset.params["ladder"] == "row-remap" and reset.params["when"] == "next_safe_point"
    assert act.apply(reset).ok
    assert kube.get_node("gpu-r")["metadata"]["annotations"]["fleethealth.io/reset-when"] == "next_safe_point"
    cluster.add_pod("train-0", "gpu-r", gpus=8)  # a training job still runs on it
    reported: list[dict[str, Any]] = []
    r, logf = resetter(tmp_path, [FakeGpu(i) for i in range(8)])
    w = ResetWatcher("gpu-r", kube, r, reported.append)
    assert w.poll() is None and w.poll() is None and not reported  # waits, answers nothing yet
    cluster.set_pod_phase("default", "train-0", "Succeeded")  # the job ends: the safe point
    res = w.poll()
    assert res is not None and res.passed and reported[-1]["payload"]["key"] == reset.key
    assert logf.read_text().count("--gpu-reset") == 1


@pytest.mark.needs_k8s
def test_a_reboot_at_the_next_safe_point_waits_for_the_gpu_work_to_end(cluster: KubeCluster) -> None:
    """The row-remap ladder's reboot step on a node in service: no remediation resource while a GPU pod
    runs (in progress, retried), one once it is gone."""
    from fleethealth.decide.model import Intent

    kube = cluster.kube()
    kube.ensure_namespace("medik8s")
    with contextlib.suppress(Exception):  # the CRD may be installed by the reboot test already
        kube.api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SNR_CRD)
    _wait_crd(kube)
    cluster.add_node("gpu-s")
    cluster.add_pod("serve-0", "gpu-s", gpus=4)
    act = KubeNodeActuator(kube)
    act.remediator = NodeRemediator(kube)
    it = Intent(0.0, IntentKind.SCHEDULE_RESET, "gpu-s", "repair:row-remap",
                {"action": "NODE_REBOOT", "when": "next_safe_point", "drain": True, "ladder": "row-remap", "n": 1})
    out = act.apply(it)
    assert not out.ok and out.retry and out.detail["in_progress"] and "default/serve-0" in out.error
    def snrs() -> list[str]:
        return [x["metadata"]["name"] for x in kube.api.request(
            "GET", "/apis/self-node-remediation.medik8s.io/v1alpha1/namespaces/medik8s/selfnoderemediations")["items"]]

    assert "gpu-s" not in snrs()
    cluster.set_pod_phase("default", "serve-0", "Failed")
    assert act.apply(it).ok and "gpu-s" in snrs()

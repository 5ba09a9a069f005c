"""The controller assembled from its config against a real kube-apiserver (tests/k8s_harness.py): leader
election through a Lease, GPU capacity from the Kubernetes inventory, and enforced node actions.

A node whose exporter lists 7 GPUs while Kubernetes says it has 8 is a hardware signal
(fleethealth_node_gpus_missing): it is quarantined, cordoned and tainted on the API server; its healthy
peer is left alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleethealth.controller.build import build
from fleethealth.controller.config import parse_config

k8s_harness = pytest.importorskip("k8s_harness")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_k8s,
    pytest.mark.skipif(k8s_harness.skip_reason() is not None, reason=str(k8s_harness.skip_reason())),
    pytest.mark.timeout(300),
]


def dcgm_page(nodes: dict[str, int]) -> str:
    fields = {"DCGM_FI_DEV_GPU_TEMP": 50, "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_XID_ERRORS": 0}
    lines = []
    for metric, value in fields.items():
        lines.append(f"# TYPE {metric} gauge")
        for node, n in nodes.items():
            for g in range(n):
                lines.append(f'{metric}{{gpu="{g}",UUID="GPU-{node}-{g}",Hostname="{node}",'
                             f'modelName="H100",pci_bus_id="00000000:{0x18 + g:02X}:00.0"}} {value}')
    return "\n".join(lines) + "\n"


def test_capacity_from_kubernetes_gates_the_node_and_it_is_cordoned(
    cluster: k8s_harness.KubeCluster, tmp_path: Path
) -> None:
    kube = cluster.kube()
    for ns in ("fleethealth-system", "fh-ctl-tests"):
        k8s_harness.apply_manifest(kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.add_node("ctl-n1", gpus=8, labels={"pool": "p"})
    cluster.add_node("ctl-n2", gpus=8, labels={"pool": "p"})
    cluster.add_node("ctl-n3", gpus=8, labels={"pool": "p"})  # its exporter never reported
    (tmp_path / "dcgm.prom").write_text(dcgm_page({"ctl-n1": 7, "ctl-n2": 8}))
    cfg = parse_config(f"""
interval_s: 1
state_db: state.db
listen: null
sources:
  files: [dcgm.prom]
kubernetes:
  host: {cluster.url}
  token: {cluster.token}
  verify_ssl: false
  identity: ctl-test
  lease_namespace: fleethealth-system
actuation:
  mode: enforce
  enforce: [no_new_work, quarantine, set_condition]
  test_namespace: fh-ctl-tests
  drain_timeout_s: 2
""", "ctl.yaml", base_dir=tmp_path)
    asm = build(cfg)
    try:
        ctl = asm.controller
        assert ctl.cycle().skipped.startswith("warming up")  # the first scrape fills the history
        rep = ctl.cycle()
        assert [(t.entity, t.to_state.value) for t in rep.transitions] == [("ctl-n1", "QUARANTINED")]
        h = ctl.published.health
        assert h is not None and h.tuples["ctl-n1"].reason == "gate:gpus_missing"
        assert h.tuples["ctl-n2"].value is not None and h.tuples["ctl-n2"].value > 0.9
        n3 = h.tuples["ctl-n3"]  # known to Kubernetes, silent: unknown, never healthy, never remediated
        assert n3.value is None and n3.confidence == 0.0
        assert not any(i.entity == "ctl-n3" and i.kind.value == "quarantine" for i in rep.intents)
        lease = kube.get_lease("fleethealth-system", "fleethealth-controller")
        assert lease["spec"]["holderIdentity"] == "ctl-test"  # leader: allowed to act
        n1 = kube.get_node("ctl-n1")
        assert n1["spec"].get("unschedulable") is True
        assert any(t["key"] == "fleethealth.io/unhealthy" for t in n1["spec"].get("taints") or [])
        n2 = kube.get_node("ctl-n2")
        assert not n2["spec"].get("unschedulable")
        statuses = {r.status for r in rep.actions if getattr(r, "entity", "") == "ctl-n1"}
        assert "applied" in statuses
    finally:
        asm.close()

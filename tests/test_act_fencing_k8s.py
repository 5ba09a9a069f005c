"""Fencing of actuator calls on a real kube-apiserver (tests/k8s_harness.py): a leader whose Lease another
holder took attempts an apply and writes nothing; the intent stays pending for the new leader, whose writes
carry its epoch; a zombie that slipped past the check cannot write over a node the newer leader wrote."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from fleethealth.act.config import ActuationConfig
from fleethealth.act.fence import Fences, LeaseFence, StaleEpoch, StoreFence
from fleethealth.act.kube import KubeNodeActuator
from fleethealth.act.lease import LeaseElector, micro_time
from fleethealth.act.ledger import Ledger
from fleethealth.act.router import RouterActuator, WeightBoard
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import Intent, IntentKind, Tier
from fleethealth.decide.state import Decision, DecisionState
from fleethealth.store.sqlite import SqliteStore

k8s_harness = pytest.importorskip("k8s_harness")

pytestmark = [pytest.mark.needs_k8s,
              pytest.mark.skipif(k8s_harness.skip_reason() is not None, reason=str(k8s_harness.skip_reason())),
              pytest.mark.timeout(300)]
NS = "fleethealth-system"
CFG = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.NO_NEW_WORK, IntentKind.ALLOW_NEW_WORK}))


def test_a_leader_that_lost_its_lease_writes_nothing(cluster: k8s_harness.KubeCluster, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    kube = cluster.kube()
    kube.ensure_namespace(NS)
    cluster.add_node("fence-n1")
    # A long lease: A's own clock says it still leads for the whole test (a paused, partitioned zombie).
    a = LeaseElector(kube, "leader-a", name="fh-fence", namespace=NS, lease_duration_s=60.0)
    assert a.step() and a.epoch is not None
    store_a = SqliteStore(tmp_path / "state.db")
    store_a.claim("leader-a")
    it = Intent(time.time(), IntentKind.NO_NEW_WORK, "fence-n1", "min:thermal", {"value": 0.5, "n": 1}, Tier.NODE)
    store_a.commit(Decision(DecisionState(), [], [it], it.ts))
    ledger = tmp_path / "ledger.db"
    runner_a = ActuationRunner({IntentKind.NO_NEW_WORK: [KubeNodeActuator(kube, CFG)]}, Ledger(ledger), CFG,
                               is_leader=a.is_leader, fence=Fences([LeaseFence(a), StoreFence(store_a)]))

    # Another holder takes the Lease on the API server (what a standby does once it saw A's lease expire).
    lease = kube.get_lease(NS, "fh-fence")
    lease["spec"].update(holderIdentity="leader-b", renewTime=micro_time(time.time()),
                         leaseTransitions=int(lease["spec"].get("leaseTransitions") or 0) + 1)
    kube.replace_lease(NS, "fh-fence", lease)
    assert a.is_leader()  # A does not know yet
    before = kube.get_node("fence-n1")
    with caplog.at_level(logging.WARNING):
        assert runner_a.drain(store_a) == []
        assert runner_a.drain(store_a) == []  # next cycle: refused again, logged once
    after = kube.get_node("fence-n1")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # nothing written
    assert not after["spec"].get("unschedulable")
    assert not [t for t in after["spec"].get("taints") or [] if t["key"] == CFG.taint_key]
    assert [r["status"] for r in store_a.intents()] == ["pending"]  # stays for the new leader
    assert runner_a.ledger.actions() == []
    lines = [r.getMessage() for r in caplog.records if "not acting" in r.getMessage()]
    assert len(lines) == 1 and "held by leader-b" in lines[0] and "not by leader-a" in lines[0], lines

    # The new leader takes over: claims the store, drains the outbox, its write carries its epoch.
    b = LeaseElector(kube, "leader-b", name="fh-fence", namespace=NS, lease_duration_s=60.0)
    assert b.step() and b.epoch == a.epoch + 1
    store_b = SqliteStore(tmp_path / "state.db")
    store_b.claim("leader-b")
    act_b = KubeNodeActuator(kube, CFG)
    runner_b = ActuationRunner({IntentKind.NO_NEW_WORK: [act_b]}, Ledger(ledger), CFG, is_leader=b.is_leader,
                               fence=Fences([LeaseFence(b), StoreFence(store_b)]))
    assert [r.status for r in runner_b.drain(store_b)] == ["applied"]
    node = kube.get_node("fence-n1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"]["fleethealth.io/leader-epoch"] == str(b.epoch)
    assert [r["status"] for r in store_b.intents()] == ["applied"]

    # A zombie call that got past the check just before it lost the Lease: the node shows a newer
    # epoch, so the actuator refuses it (no write), and through the runner it is 'fenced', not failed.
    act_a = KubeNodeActuator(kube, CFG)
    act_a.bind_fence(_FixedEpoch(a.epoch))
    rv = node["metadata"]["resourceVersion"]
    undo = Intent(time.time(), IntentKind.ALLOW_NEW_WORK, "fence-n1", "ready", {"value": 0.95, "n": 2}, Tier.NODE)
    with pytest.raises(StaleEpoch):
        act_a.apply(undo)
    racing = ActuationRunner({IntentKind.ALLOW_NEW_WORK: [act_a]}, Ledger(tmp_path / "own.db"), CFG)
    [res] = racing.submit(undo)
    assert res.status == "fenced" and "newer leader" in res.error
    assert kube.get_node("fence-n1")["metadata"]["resourceVersion"] == rv

    # The same for a replica's pod (router weights: readiness-gate labels and condition).
    cluster.add_pod("fence-r1", "fence-n1", labels={"app": "vllm"}, container_port=8000)
    router_b = RouterActuator(WeightBoard(), kube, CFG)
    router_b.bind_fence(LeaseFence(b))
    low = Intent(time.time(), IntentKind.SET_WEIGHT, "fence-r1", "min:latency",
                 {"weight": 0.1, "state": "DEGRADED", "n": 3}, Tier.INSTANCE)
    assert router_b.apply(low).ok
    pod = kube.get_pod("default", "fence-r1")
    assert pod["metadata"]["annotations"]["fleethealth.io/leader-epoch"] == str(b.epoch)
    router_a = RouterActuator(WeightBoard(), kube, CFG)
    router_a.bind_fence(_FixedEpoch(a.epoch))
    high = Intent(time.time(), IntentKind.SET_WEIGHT, "fence-r1", "ok", {"weight": 1.0, "state": "READY", "n": 4},
                  Tier.INSTANCE)
    with pytest.raises(StaleEpoch):
        router_a.apply(high)
    assert kube.get_pod("default", "fence-r1")["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    b.release()


class _FixedEpoch:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def check(self) -> str | None:
        return None

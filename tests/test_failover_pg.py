"""Failover for real: two ``fleethealth run`` processes with Lease election on a real kube-apiserver
(tests/k8s_harness.py) sharing one real PostgreSQL (tests/pg_harness.py) for state and ledger.

The leader quarantines a node (an Xid 79 on one GPU: fallen off the bus): cordon, taint, and a
drain that a PodDisruptionBudget holds (in progress, retried every cycle). The leader is SIGKILLed
mid-drain. The standby takes the Lease, reloads the state from the database and drains the outbox; once
the budget is lifted it finishes the drain. Checked: one QUARANTINED transition, every intent settled and
none repeated (one ledger action per key and actuator, one Kubernetes Event for the node change, one
taint), and the take-over time (SIGKILL -> the standby's first committed cycle) within the lease duration
plus one cycle. The figures are printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import pg_harness
from act_support import wait_until
from prom_harness import free_port
from test_controller_k8s import dcgm_page

k8s_harness = pytest.importorskip("k8s_harness")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_k8s,
    pytest.mark.skipif(k8s_harness.skip_reason() is not None, reason=str(k8s_harness.skip_reason())),
    pytest.mark.skipif(pg_harness.skip_reason() is not None, reason=str(pg_harness.skip_reason())),
    pytest.mark.timeout(300),
]

LEASE_S = 3.0
CYCLE_S = 0.5
NODES = ("fo-n1", "fo-n2", "fo-n3")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    c = k8s_harness.KubeCluster().start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def postgres() -> Iterator[pg_harness.Postgres]:
    pg = pg_harness.Postgres().start()
    try:
        yield pg
    finally:
        pg.stop()


def sql(url: str, q: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as c:
            return list(c.execute(q, args or None).fetchall())
    except psycopg.errors.UndefinedTable:
        return []


def test_standby_takes_over_mid_drain_and_nothing_is_lost_or_repeated(
    cluster: Any, postgres: pg_harness.Postgres, tmp_path: Path
) -> None:
    kube = cluster.kube()
    k8s_harness.apply_manifest(kube, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "fleethealth-system"}})
    for n in NODES:
        cluster.add_node(n, gpus=8, labels={"pool": "fo"})
    for i in range(2):
        cluster.add_pod(f"fo-train-{i}", "fo-n1", labels={"app": "fo-train"})
    k8s_harness.apply_manifest(kube, {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
                                      "metadata": {"name": "fo-train", "namespace": "default"},
                                      "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "fo-train"}}}})
    wait_until(lambda: (kube.api.request("GET", "/apis/policy/v1beta1/namespaces/default/poddisruptionbudgets/"
                                         "fo-train").get("status") or {}).get("currentHealthy") == 2, 30, 0.1,
               what="the PDB's status")
    db = postgres.new_database()
    listen = {"a": "null", "b": f"127.0.0.1:{free_port()}"}  # the standby's API: history from the shared store
    page = tmp_path / "dcgm.prom"
    page.write_text(dcgm_page({n: 8 for n in NODES}))
    for who in ("a", "b"):
        (tmp_path / f"{who}.yaml").write_text(f"""
interval_s: {CYCLE_S}
state_db: {db}
listen: {listen[who]}
sources:
  files: [dcgm.prom]
kubernetes:
  host: {cluster.url}
  token: {cluster.token}
  verify_ssl: false
  identity: ctl-{who}
  lease_name: fo-lease
  lease_namespace: fleethealth-system
  lease_duration_s: {LEASE_S}
actuation:
  mode: enforce
  enforce: [no_new_work, quarantine, set_condition]
  drain_timeout_s: 120
  drain_block_s: 0.1
  backoff_initial_s: 0.2
  backoff_max_s: 0.5
  max_attempts: 100
""")
    logs = {w: tmp_path / f"{w}.log" for w in ("a", "b")}

    def start(who: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if k != "FLEETHEALTH_FAILPOINT"}
        return subprocess.Popen([sys.executable, "-m", "fleethealth.cli.main", "run", "--config",
                                 str(tmp_path / f"{who}.yaml")], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=logs[who].open("wb"))

    def holder() -> str | None:
        return kube.get_lease("fleethealth-system", "fo-lease")["spec"].get("holderIdentity")

    procs = {"a": start("a")}
    try:
        wait_until(lambda: holder() == "ctl-a", 60, 0.05, what="ctl-a holding the Lease")
        wait_until(lambda: (sql(db, "SELECT COUNT(*) FROM cycles") or [(0,)])[0][0] >= 2, 60, 0.05,
                   what="the leader committing cycles")
        procs["b"] = start("b")
        wait_until(lambda: "fleethealth controller:" in logs["b"].read_text(errors="replace"), 60, 0.05,
                   what="the standby running")
        assert holder() == "ctl-a"

        # -- the fault: the leader quarantines fo-n1 and its drain is held by the budget ---------------
        healthy = dcgm_page({n: 8 for n in NODES})
        line = next(ln for ln in healthy.splitlines() if ln.startswith("DCGM_FI_DEV_XID_ERRORS")
                    and 'UUID="GPU-fo-n1-3"' in ln)
        page.write_text(healthy.replace(line, line.removesuffix(" 0") + " 79"))
        wait_until(lambda: sql(db, "SELECT attempts FROM actions WHERE kind='quarantine' AND "
                                   "entity='fo-n1' AND status IN ('retrying', 'started') AND attempts >= 2"),
                   60, 0.05, what="the leader's drain of fo-n1 in progress (held by the PDB)")
        assert kube.get_node("fo-n1")["spec"].get("unschedulable") is True
        assert "ctl-b" not in logs["b"].read_text(errors="replace") or holder() == "ctl-a"

        # -- SIGKILL the leader mid-drain ------------------------------------------------------------------
        t_kill, wall_kill = time.monotonic(), time.time()
        os.kill(procs["a"].pid, signal.SIGKILL)
        procs["a"].wait(10)
        wait_until(lambda: holder() == "ctl-b", LEASE_S + 10, 0.02, what="ctl-b taking the Lease")
        lease_s = time.monotonic() - t_kill
        first = wait_until(lambda: sql(db, "SELECT MIN(ts) FROM cycles WHERE ts > %s", wall_kill)[0][0],
                           LEASE_S + 10, 0.02, what="the new leader's first committed cycle")
        visible_s = time.monotonic() - t_kill
        takeover_s = float(first) - wall_kill
        print(f"\nfailover: Lease taken {lease_s:.2f} s after SIGKILL; the new leader's first cycle started "
              f"{takeover_s:.2f} s after it, its commit seen at {visible_s:.2f} s (lease duration {LEASE_S:g} s, "
              f"cycle {CYCLE_S:g} s, bound {LEASE_S + CYCLE_S:g} s)")
        assert takeover_s <= LEASE_S + CYCLE_S, takeover_s
        # the new leader serves the old leader's transitions and intents (read from the store, not memory)
        api_b = f"http://{listen['b']}/api/v1"
        trs = httpx.get(f"{api_b}/transitions", params={"entity": "fo-n1"}, timeout=10).json()["transitions"]
        assert [(t["from"], t["to"]) for t in trs] == [("READY", "QUARANTINED")], trs
        ints = httpx.get(f"{api_b}/intents", params={"entity": "fo-n1"}, timeout=10).json()["intents"]
        assert "quarantine" in {i["intent"] for i in ints} and min(i["ts"] for i in ints) < wall_kill, ints

        # -- the budget is lifted: the new leader finishes the drain it took over ------------------------
        kube.api.request("DELETE", "/apis/policy/v1beta1/namespaces/default/poddisruptionbudgets/fo-train")
        wait_until(lambda: sql(db, "SELECT status FROM intents WHERE kind='quarantine' AND entity='fo-n1'")
                   == [("applied",)], 60, 0.05, what="the quarantine applied by the new leader")
        procs["b"].send_signal(signal.SIGTERM)
        assert procs["b"].wait(30) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
    log_b = logs["b"].read_text(errors="replace")
    assert "took over as leader" in log_b and "Traceback" not in log_b

    trans = sql(db, "SELECT entity, from_state, to_state FROM transitions ORDER BY id")
    assert [t for t in trans if t[0] == "fo-n1"] == [("fo-n1", "READY", "QUARANTINED")]  # once, not twice
    assert not [t for t in trans if t[0] != "fo-n1"]
    intents = sql(db, "SELECT key, kind, entity, status FROM intents")
    assert [i for i in intents if i[3] == "pending"] == []  # none lost
    acts = sql(db, "SELECT key, actuator, status, attempts FROM actions")
    assert max(Counter((k, a) for k, a, _, _ in acts).values()) == 1
    qkey = next(k for k, kind, e, _ in intents if kind == "quarantine" and e == "fo-n1")
    assert [(s, n > 2) for k, _, s, n in acts if k == qkey] == [("applied", True)]  # retried across both
    node = kube.get_node("fo-n1")
    assert node["spec"].get("unschedulable") is True
    assert [t["key"] for t in node["spec"].get("taints") or []].count("fleethealth.io/unhealthy") == 1
    events = kube.api.request("GET", "/api/v1/namespaces/default/events")["items"]
    marked = [e for e in events if f"intent={qkey}" in (e.get("message") or "")
              and e.get("reason") == "FleetHealthQuarantine"]
    assert len(marked) == 1  # the node was changed once; the new leader's re-apply changed nothing
    pods = {p["metadata"]["name"]: p for p in kube.list_pods(namespace="default")}
    assert all(pods[f"fo-train-{i}"]["metadata"].get("deletionTimestamp") for i in range(2) if f"fo-train-{i}" in pods)

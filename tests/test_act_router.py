"""Router weights: JSON for the controller's API, Envoy EDS (ClusterLoadAssignment), yes/no for gateways."""

from __future__ import annotations

import json

from fleethealth.act.router import (
    CLA_TYPE,
    ReplicaWeight,
    RouterActuator,
    WeightBoard,
    cluster_load_assignment,
    eds_discovery_response,
    envoy_health,
    envoy_weight,
    takes_traffic,
    weights_document,
)
from fleethealth.decide.model import Intent, IntentKind, Tier


def rw(r: str, w: float, state: str = "READY", port: int | None = 8000, zone: str | None = None) -> ReplicaWeight:
    return ReplicaWeight(replica=r, weight=w, state=state, address=f"10.0.0.{len(r)}", port=port, zone=zone)


def test_health_scales_the_routing_policy_base_weight_never_replaces_it() -> None:
    weights = {"a": rw("a", 1.0), "b": rw("b", 0.5), "c": rw("cc", 0.5)}
    cla = cluster_load_assignment("llama", weights, base_weights={"a": 300, "b": 300, "c": 100})
    lb = {e["endpoint"]["hostname"]: e for g in cla["endpoints"] for e in g["lb_endpoints"]}
    assert lb["a"]["load_balancing_weight"] == 300  # full health keeps the policy's weight
    assert lb["b"]["load_balancing_weight"] == 150  # half health halves it
    assert lb["c"]["load_balancing_weight"] == 50
    # Relative order of the policy among equally healthy replicas is preserved.
    assert lb["b"]["load_balancing_weight"] > lb["c"]["load_balancing_weight"]


def test_envoy_health_status_and_minimum_weight() -> None:
    assert envoy_health(rw("a", 0.9)) == "HEALTHY"
    assert envoy_health(rw("a", 0.6, "DEGRADED")) == "DEGRADED"
    assert envoy_health(rw("a", 0.0)) == "DRAINING"
    for st in ("DRAINING", "QUARANTINED", "FAILED"):
        assert envoy_health(rw("a", 0.7, st)) == "DRAINING"
    assert envoy_weight(rw("a", 0.0)) == 1  # Envoy rejects 0: DRAINING carries the meaning
    assert envoy_weight(rw("a", 1.7)) == 100  # clamped


def test_eds_response_shape_is_envoy_v3_json() -> None:
    weights = {"a": rw("a", 1.0, zone="z1"), "b": rw("b", 0.3, "DEGRADED", zone="z2"),
               "nohost": ReplicaWeight("nohost", 1.0)}
    resp = eds_discovery_response("llama", weights, version_info="7")
    assert resp["type_url"] == CLA_TYPE and resp["version_info"] == "7"
    [cla] = resp["resources"]
    assert cla["@type"] == CLA_TYPE and cla["cluster_name"] == "llama"
    zones = {g["locality"]["zone"]: g for g in cla["endpoints"]}
    assert set(zones) == {"z1", "z2"}
    ep = zones["z2"]["lb_endpoints"][0]
    assert ep["endpoint"]["address"]["socket_address"] == {"address": "10.0.0.1", "port_value": 8000}
    assert ep["health_status"] == "DEGRADED" and ep["load_balancing_weight"] == 30
    assert "nohost" not in json.dumps(cla)  # no address, no endpoint


def test_yes_no_for_gateways_and_weights_document() -> None:
    assert takes_traffic(rw("a", 0.8))
    assert not takes_traffic(rw("a", 0.3))
    assert not takes_traffic(rw("a", 0.9, "DRAINING"))
    doc = weights_document({"a": rw("a", 0.8), "b": rw("b", 0.2)}, now=5.0)
    assert doc["replicas"]["a"]["takes_traffic"] and not doc["replicas"]["b"]["takes_traffic"]
    assert doc["replicas"]["a"]["weight"] == 0.8 and doc["ts"] == 5.0


def test_set_weight_actuator_updates_the_board_idempotently() -> None:
    board = WeightBoard()
    act = RouterActuator(board)
    it = Intent(1.0, IntentKind.SET_WEIGHT, "r0", "min:latency", {"weight": 0.4, "address": "10.1.1.1", "port": 80},
                Tier.INSTANCE)
    out = act.apply(it)
    assert out.ok and out.detail["changed"]
    assert act.apply(it).detail["changed"] is False
    assert board.weights["r0"].weight == 0.4 and board.version == 1


def test_cli_eds_kill_and_ledger(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from fleethealth.act.ledger import Ledger
    from fleethealth.act.runner import ActuationRunner
    from fleethealth.cli.main import app

    w = tmp_path / "w.json"
    w.write_text(json.dumps({"ts": 7, "replicas": {
        "r0": {"weight": 0.5, "state": "READY", "address": "10.0.0.1", "port": 8000},
        "r1": {"weight": 0.0, "state": "DRAINING", "address": "10.0.0.2", "port": 8000}}}))
    out = tmp_path / "eds.json"
    cli = CliRunner()
    res = cli.invoke(app, ["act", "eds", "--cluster", "llama", "--weights", str(w), "--out", str(out)])
    assert res.exit_code == 0, res.output
    eps = json.loads(out.read_text())["resources"][0]["endpoints"][0]["lb_endpoints"]
    assert [(e["health_status"], e["load_balancing_weight"]) for e in eps] == [("HEALTHY", 50), ("DRAINING", 1)]

    db = tmp_path / "ledger.db"
    runner = ActuationRunner({}, Ledger(db), "enforce")
    assert cli.invoke(app, ["act", "kill", "--db", str(db), "--reason", "maintenance"]).exit_code == 0
    assert runner.killed and runner.status()["kill"]["reason"] == "maintenance"
    assert cli.invoke(app, ["act", "resume", "--db", str(db)]).exit_code == 0
    assert not runner.killed
    runner.submit(Intent(1.0, IntentKind.PAGE, "node-a", "x", {}))
    res = cli.invoke(app, ["act", "ledger", "--db", str(db)])
    assert res.exit_code == 0 and json.loads(res.output.splitlines()[0])["status"] == "unrouted"
    assert cli.invoke(app, ["act", "ledger", "--db", str(tmp_path / "nope.db")]).exit_code == 2

"""The monitoring that ships in deploy/: alerting and recording rules (promtool check and promtool test),
the Prometheus Operator copies of them, and the Grafana dashboard, whose every PromQL expression (and every
rule) is evaluated by a real Prometheus that scrapes a real controller on the simulator and must return
series.

The live test: the simulator's exporter (two pools, one training, one serving), a Prometheus scraping it
(http_sd) and the controller (job ``fleethealth-controller``, as the ServiceMonitor names it) every second
with the rules loaded at a 1 s evaluation interval, the controller reading that Prometheus. A GPU falls off
the bus on one node (a transition, a quarantine, a budget spent) and one node's exporter dies (an unknown
node), so that every panel has something to show.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MON = ROOT / "deploy" / "monitoring"
DASHBOARD = ROOT / "deploy" / "grafana" / "fleethealth.json"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (apt-get install -y prometheus)")


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load((MON / "rules.yaml").read_text())["groups"]
    return groups


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expression) for every query of the dashboard."""
    d = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]


def grafana_to_promql(expr: str) -> str:
    """What Grafana sends for the dashboard's variables with 'All' pools selected."""
    return expr.replace("$__rate_interval", "30s").replace("$pool", ".*")


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    r = subprocess.run([str(PROMTOOL), "check", "rules", str(MON / "rules.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in r.stdout


@needs_promtool
def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    r = subprocess.run([str(PROMTOOL), "test", "rules", "rules-test.yaml"], cwd=MON, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
    tested = set(re.findall(r"alertname: (\w+)", (MON / "rules-test.yaml").read_text()))
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r}
    assert alerts <= tested, f"alerts without a promtool test: {sorted(alerts - tested)}"


def test_the_prometheus_operator_copy_equals_the_rules() -> None:
    doc = yaml.safe_load((MON / "prometheusrule.yaml").read_text())
    assert doc["kind"] == "PrometheusRule" and doc["spec"]["groups"] == rule_groups()


def test_every_alert_has_severity_summary_and_a_runbook_that_exists() -> None:
    for g in rule_groups():
        for r in g["rules"]:
            if "alert" not in r:
                continue
            assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
            assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
            url = r["annotations"]["runbook_url"]
            assert url.endswith(f"docs/runbooks/alerts/{r['alert']}.md"), url
            assert (ROOT / "docs" / "runbooks" / "alerts" / f"{r['alert']}.md").is_file(), r["alert"]


def test_dashboard_is_well_formed() -> None:
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in d["templating"]["list"]}
    assert names == {"datasource", "pool"}
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["targets"] and p["description"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
    text = DASHBOARD.read_text()
    for needle in ("fleethealth_health", "fleethealth_confidence", "fleethealth_state", "fleethealth_transitions_total",
                   "fleethealth_entity_transitions_total", "fleethealth_intents_total", "fleethealth_budget_remaining",
                   "fleethealth_cycle_duration_seconds", "fleethealth_source_up"):
        assert needle in text, needle


# -- live: a real Prometheus scraping a real controller ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.needs_prometheus
@pytest.mark.timeout(240)
def test_every_dashboard_and_rule_expression_returns_series(tmp_path: Path) -> None:
    from act_support import free_port
    from prom_harness import PROMETHEUS, PrometheusServer

    if PROMETHEUS is None:
        pytest.skip("prometheus binary missing (apt-get install -y prometheus)")
    from fleethealth.act.ledger import Ledger
    from fleethealth.act.runner import ActuationRunner
    from fleethealth.controller.api import ApiServer
    from fleethealth.controller.loop import Controller
    from fleethealth.sim.scenario import Scenario
    from fleethealth.sim.server import SimExporterServer
    from fleethealth.sim.simulation import Simulation
    from fleethealth.sources.prometheus import PrometheusSource
    from test_controller_e2e import e2e_policy, wait

    scenario = Scenario.model_validate({"name": "dash", "seed": 7, "duration": "1d", "fleet": {"pools": [
        {"name": "train-a", "nodes": 6, "workload": "training", "jobs": [{"name": "pretrain", "pp": 1}]},
        {"name": "serve-a", "nodes": 2, "workload": "serving"},
    ]}})
    sim = Simulation(scenario)
    nodes = list(sim.fleet.nodes)
    exporter = SimExporterServer(sim).start()
    policy = e2e_policy()
    api_port = free_port()
    rules = {"groups": [{**g, "interval": "1s"} for g in rule_groups()]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    prom = PrometheusServer([])
    (prom.dir / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {"job_name": "fleethealth-controller", "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}]},
            {"job_name": "sim", "http_sd_configs": [{"url": f"{exporter.url}/sd", "refresh_interval": "1s"}]},
        ]}))
    try:
        prom.start()
        prom.wait_for("DCGM_FI_DEV_GPU_TEMP", min_results=len(nodes) * 8, timeout_s=30)
        source = PrometheusSource(prom.url, policy, timeout_s=2)
        runner = ActuationRunner({}, Ledger(":memory:"))
        ctl = Controller(policy, [source], interval_s=0.5, runner=runner)
        api = ApiServer(ctl, "127.0.0.1", api_port, runner=runner).start()
        th = threading.Thread(target=ctl.run, daemon=True)
        th.start()
        try:
            wait(lambda: ctl.published.health is not None
                 and all((t := ctl.published.health.get(n)) is not None and t.value is not None for n in nodes),
                 40, "a known fleet")
            exporter.inject({"kind": "xid79_off_bus", "target": "node-02/gpu3", "onset": 0})
            exporter.inject({"kind": "exporter_outage", "target": "node-05", "onset": 0})
            exporter.advance(scenario.step)
            wait(lambda: (e := ctl.state.entities.get("node-02")) is not None and e.state.value == "QUARANTINED", 30,
                 "node-02 quarantined")
            wait(lambda: (h := ctl.published.health) is not None and (t := h.get("node-05")) is not None
                 and t.value is None, 30,
                 "node-05 unknown")
            # Prometheus has scraped the controller since, and the 1 s rules have run on it
            prom.wait_for('fleethealth_state{entity="node-02",state="QUARANTINED"}', timeout_s=20)
            prom.wait_for('fleethealth:pool_unknown:count{pool="train-a"}', timeout_s=20)
            time.sleep(2.5)  # two more scrapes, so that rate() and increase() have two samples after the fault

            def series(expr: str) -> list[dict[str, Any]]:
                r = httpx.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=5).json()
                assert r["status"] == "success", (expr, r)
                return list(r["data"]["result"])

            exprs = [(t, grafana_to_promql(e)) for t, e in dashboard_exprs()]
            exprs += [(f"rule {r['record']}", r["record"]) for g in rule_groups() for r in g["rules"] if "record" in r]
            exprs += [(f"alert {r['alert']}", r["expr"]) for g in rule_groups() for r in g["rules"] if "alert" in r]

            def empty_ones() -> list[str]:
                empty = []
                for title, e in exprs:
                    if title.startswith("alert "):
                        series(e)  # an alert's condition need only evaluate (most are quiet on a healthy controller)
                        continue
                    if not series(e):
                        empty.append(f"{title}: {e}")
                return empty

            deadline = time.time() + 20  # on a loaded machine a scrape or a rule evaluation may come late
            while (empty := empty_ones()) and time.time() < deadline:
                time.sleep(1)
            assert not empty, "expressions without series:\n" + "\n".join(empty)
            print(f"\n{len(exprs)} expressions evaluated against a live Prometheus scraping the controller")
            # values that are checkable: node-05 is the one unknown node of train-a, node-02 is gated
            unk = series('fleethealth:pool_unknown:count{kind="node"}')
            assert {s["metric"]["pool"]: float(s["value"][1]) for s in unk} == {"train-a": 1.0}
            low = series('fleethealth:pool_health:min{kind="node", pool="train-a"}')
            assert float(low[0]["value"][1]) == 0.0
            ctl_down = series('absent(up{job="fleethealth-controller"} == 1)')
            assert ctl_down == []  # the controller is up
        finally:
            ctl.stop()
            th.join(10)
            api.stop()
    finally:
        prom.stop()
        exporter.stop()

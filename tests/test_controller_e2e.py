"""End to end against real servers: the simulator's HTTP exporter, scraped every second by a real
Prometheus (Debian's binary), read by the controller through the Prometheus HTTP API.

1. A GPU falls off the bus on the simulated exporter: the controller shows a transition and a quarantine
   intent within two scrape intervals (plus one controller interval); the latency from the fault
   appearing on the exporter to the intent is measured and printed.
2. Prometheus is killed mid-run: the controller reports the source down, confidence drops (entities
   unknown), a fleet alert goes out and no remediation is taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
import pytest

from fleethealth.act.ledger import Ledger
from fleethealth.act.runner import ActuationRunner
from fleethealth.controller.api import ApiServer
from fleethealth.controller.loop import Controller
from fleethealth.policy import Policy, default_policy
from fleethealth.sources.prometheus import PrometheusSource
from prom_harness import PROMETHEUS, free_port, prometheus

sim_server = pytest.importorskip("fleethealth.sim.server", reason="simulator exporter not available")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_prometheus,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary missing (apt-get install -y prometheus)"),
    pytest.mark.timeout(180),
]

SCRAPE_S = 1.0
CYCLE_S = 0.5
REMEDIATION = {"quarantine", "drain", "schedule_reset", "run_active_test", "release", "rebuild_worker"}


def e2e_policy() -> Policy:
    """The default policy with freshness and dwell scaled down to a test's seconds."""
    p = default_policy()
    return p.model_copy(update={
        "freshness": p.freshness.model_copy(update={"max_age_s": 4.0, "rate_window_s": 30.0}),
        "lifecycle": p.lifecycle.model_copy(update={"degraded_dwell_s": 2.0, "quarantine_dwell_s": 2.0,
                                                    "ready_dwell_s": 4.0, "warming_s": 1.0}),
        "fleet": p.fleet.model_copy(update={"min_entities": 3}),
    })


def wait(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if cond():
            return time.time() - t0
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_fault_to_intent_and_prometheus_outage() -> None:
    from fleethealth.sim.scenario import Scenario
    from fleethealth.sim.simulation import Simulation

    scenario = Scenario.model_validate({"name": "e2e", "seed": 5, "duration": "1d", "fleet": {"pools": [
        {"name": "train-a", "nodes": 6, "workload": "training", "jobs": [{"name": "pretrain", "pp": 1}]},
        {"name": "serve-a", "nodes": 2, "workload": "serving"},
    ]}})
    sim = Simulation(scenario)
    nodes = list(sim.fleet.nodes)
    exporter = sim_server.SimExporterServer(sim).start()  # simulated time moves only when told
    policy = e2e_policy()
    # Dwells longer than max_age_s, as in production (90 s fresh, 120 s / 300 s dwells): while the outage
    # turns the fleet stale signal by signal, a node scored on what is still fresh must not sit below a
    # line for a whole dwell before the freeze (2 s dwells under a 4 s max_age once quarantined node-00
    # from READY one cycle before the freeze on a loaded CI box). The fault here is a gate: no dwell.
    policy = policy.model_copy(update={"lifecycle": policy.lifecycle.model_copy(
        update={"degraded_dwell_s": 6.0, "quarantine_dwell_s": 12.0})})
    try:
        with prometheus([], scrape_interval_s=SCRAPE_S, http_sd=[f"{exporter.url}/sd"]) as prom:
            prom.wait_for("up == 1", min_results=len(nodes), timeout_s=30)
            prom.wait_for("DCGM_FI_DEV_GPU_TEMP", min_results=len(nodes) * 8, timeout_s=30)
            source = PrometheusSource(prom.url, policy, timeout_s=2)
            runner = ActuationRunner({}, Ledger(":memory:"))  # advise mode: recorded, nothing enforced
            ctl = Controller(policy, [source], interval_s=CYCLE_S, runner=runner)
            api = ApiServer(ctl, "127.0.0.1", free_port(), runner=runner).start()
            th = threading.Thread(target=ctl.run, daemon=True)
            th.start()
            try:
                wait(lambda: ctl.published.health is not None
                     and all((t := ctl.published.health.get(n)) is not None and t.value is not None
                             and t.value > 0.5 for n in nodes[:6])
                     and "node-02" in ctl.state.entities, 30, "a healthy, known fleet")
                assert ctl.state.entities["node-02"].state.value == "READY"

                def replicas_weighted() -> bool:
                    w = httpx.get(f"{api.url}/api/v1/weights").json()["replicas"]
                    return len(w) == 4 and all(r["state"] == "READY" and r["weight"] > 0.9 for r in w.values())

                # serving replicas warm up, then the router weight follows their (healthy) score
                wait(replicas_weighted, 20, "router weights for the 4 serving replicas")

                # -- 1. a GPU falls off the bus --------------------------------------------------
                exporter.inject({"kind": "xid79_off_bus", "target": "node-02/gpu3", "onset": 0})
                exporter.advance(scenario.step)
                page = httpx.get(exporter.node_url("node-02")).text
                t_fault = time.time()  # the fault is on the exporter from now on
                assert 'xid="79"' in page

                def quarantined() -> bool:
                    return any(i["intent"] == "quarantine" and i["entity"] == "node-02"
                               for i in ctl.published.recent_intents)

                wait(quarantined, 30, "a quarantine intent for node-02")
                latency = time.time() - t_fault
                trs = [t for t in ctl.published.recent_transitions if t["entity"] == "node-02"]
                print(f"\nend-to-end latency, fault on the exporter -> quarantine intent: {latency:.3f} s "
                      f"(scrape interval {SCRAPE_S:g} s, controller interval {CYCLE_S:g} s)")
                assert trs and trs[-1]["to"] == "QUARANTINED" and trs[-1]["reason"].startswith("gate:")
                assert latency <= 2 * SCRAPE_S + CYCLE_S + 0.5, latency
                others = {i["entity"] for i in ctl.published.recent_intents if i["intent"] in REMEDIATION}
                assert others == {"node-02"}
                text = httpx.get(f"{api.url}/metrics").text
                assert 'fleethealth_state{entity="node-02",kind="node",state="QUARANTINED"} 1.0' in text
                assert 'fleethealth_source_up{source="prometheus:' in text

                # -- 2. Prometheus dies mid-run -------------------------------------------------
                t_kill = time.time()
                prom.kill()
                down_after = wait(lambda: not ctl.published.sources[0]["up"], 10, "the source reported down")
                # the first failure may be a reset connection; then refused connections
                wait(lambda: "cannot connect" in (ctl.published.sources[0]["last_error"] or ""), 10,
                     "'cannot connect' reported")
                print(f"Prometheus killed: source reported down after {down_after:.2f} s")

                def all_unknown() -> bool:
                    # node-02's Xid 79 stays a fact for the policy's Xid window: gated (0), never healthy
                    h = ctl.published.health
                    return h is not None and all(
                        (t := h.get(n)) is not None
                        and (t.value is None and t.confidence < policy.lifecycle.min_confidence
                             or n == "node-02" and t.value == 0.0)
                        for n in nodes[:6])

                try:
                    went_stale = wait(all_unknown, 20, "every node unknown (stale), never healthy")
                except AssertionError:
                    h = ctl.published.health
                    assert h is not None
                    print({n: h.tuples[n].to_dict(with_details=True) for n in nodes[:6]})
                    raise
                print(f"after Prometheus died: source down at once, nodes unknown after {went_stale:.1f} s "
                      f"(max_age_s {policy.freshness.max_age_s:g})")
                wait(lambda: ctl.published.state.frozen, 10, "remediation frozen on low fleet confidence")
                time.sleep(3 * CYCLE_S)
                after = [i for i in ctl.published.recent_intents if i["ts"] >= t_kill]
                assert "fleet_alert" in {i["intent"] for i in after}
                assert not [i for i in after if i["intent"] in REMEDIATION], [(i["entity"], i["intent"], i["reason"], i["params"]) for i in after]
                assert httpx.get(f"{api.url}/healthz").status_code == 200  # the loop itself is fine
                text = httpx.get(f"{api.url}/metrics").text
                assert 'fleethealth_remediation_frozen 1.0' in text
                assert 'fleethealth_health_known{entity="node-00",kind="node"} 0.0' in text
            finally:
                ctl.stop()
                th.join(10)
                api.stop()
                source.close()
    finally:
        exporter.stop()


def test_direct_scrape_outage_goes_stale_and_fault_is_caught() -> None:
    """Without Prometheus: the controller scrapes the simulator's endpoints itself. A dead exporter makes
    its node unknown (never healthy, never remediated); a GPU falling off the bus elsewhere is caught."""
    from fleethealth.sim.scenario import Scenario
    from fleethealth.sim.simulation import Simulation
    from fleethealth.sources.scrape import ScrapeSource, ScrapeTarget

    scenario = Scenario.model_validate({"name": "e2e-scrape", "seed": 7, "duration": "1d", "fleet": {"pools": [
        {"name": "train-a", "nodes": 6, "workload": "training", "jobs": [{"name": "pretrain", "pp": 1}]},
    ]}})
    sim = Simulation(scenario)
    exporter = sim_server.SimExporterServer(sim).start()
    policy = e2e_policy()
    clock_t = [time.time()]

    class Clock:
        def now(self) -> float:
            return clock_t[0]

        def sleep(self, s: float) -> None:
            clock_t[0] += s

    src = ScrapeSource([ScrapeTarget(exporter.node_url(n), {"node": n}) for n in sim.fleet.nodes], timeout_s=2)
    ctl = Controller(policy, [src], interval_s=1.0, clock=Clock())

    def step(n: int = 1) -> None:
        for _ in range(n):
            ctl.cycle()
            clock_t[0] += 1.0

    try:
        step(3)
        h = ctl.published.health
        assert h is not None and all((t := h.get(n)) is not None and t.value is not None for n in sim.fleet.nodes)
        exporter.inject({"kind": "exporter_outage", "target": "node-01", "onset": 0})
        exporter.advance(scenario.step)
        step(6)  # past max_age_s (4 s): node-01's last samples are stale
        st = ctl.published.sources[0]
        assert st["up"] and st["partial"] and "node-01" in st["last_error"]  # one endpoint failed
        h = ctl.published.health
        assert h is not None
        n1 = h.get("node-01")
        assert n1 is not None and n1.value is None and n1.confidence == 0.0
        assert ctl.targets_down == 1
        exporter.inject({"kind": "xid79_off_bus", "target": "node-04/gpu2", "onset": 0})
        exporter.advance(scenario.step)
        step(2)
        remediated = {i["entity"] for i in ctl.published.recent_intents if i["intent"] in REMEDIATION}
        assert remediated == {"node-04"}  # the dead exporter's node is never remediated
        assert ctl.state.entities["node-01"].state.value == "READY"
    finally:
        src.close()
        exporter.stop()

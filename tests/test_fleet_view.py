"""The fleet view (GET / and /entity/NAME on the controller's port) in a real headless Chromium, against a
controller scoring the simulator through a real Prometheus, with a SQLite state store and the real
evidence collector (only evidence captures are carried out): a GPU off the bus on node-02 (gated,
QUARANTINED), node-05's exporter dead (unknown), node-06 (serving) asked for a drain and reset (DRAINING),
so its replicas are being drained. DOM checks on what Chromium rendered (the node states, the draining
replicas, the KPI table; the entity page's timeline from the store with state bands and intent marks,
its runbooks and evidence links, the bundle's files), and screenshots at a laptop and a phone width (kept
in $FLEETHEALTH_SHOTS when set)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [pytest.mark.slow, pytest.mark.needs_prometheus, pytest.mark.timeout(240),
              pytest.mark.skipif(CHROMIUM is None, reason="chromium missing (apt-get install -y chromium)")]


def chromium(tmp: Path, *args: str) -> str:
    assert CHROMIUM is not None
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={tmp / 'profile'}", *args], capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_fleet_view_in_chromium(tmp_path: Path) -> None:
    from act_support import free_port
    from prom_harness import PROMETHEUS, prometheus

    if PROMETHEUS is None:
        pytest.skip("prometheus binary missing")
    from fleethealth.act.config import ActuationConfig
    from fleethealth.act.evidence import EvidenceCollector, EvidenceIndex, PrometheusRange
    from fleethealth.act.ledger import Ledger
    from fleethealth.act.runner import ActuationRunner
    from fleethealth.controller.api import ApiServer
    from fleethealth.controller.loop import Controller
    from fleethealth.decide.model import IntentKind
    from fleethealth.sim.scenario import Scenario
    from fleethealth.sim.server import SimExporterServer
    from fleethealth.sim.simulation import Simulation
    from fleethealth.sources.prometheus import PrometheusSource
    from fleethealth.store.sqlite import SqliteStore
    from test_controller_e2e import e2e_policy, wait

    scenario = Scenario.model_validate({"name": "view", "seed": 5, "duration": "1d", "fleet": {"pools": [
        {"name": "train-a", "nodes": 6, "workload": "training", "jobs": [{"name": "pretrain", "pp": 1}]},
        {"name": "serve-a", "nodes": 2, "workload": "serving"},
    ]}})
    sim = Simulation(scenario)
    exporter = SimExporterServer(sim).start()
    policy = e2e_policy()
    try:
        with prometheus([], scrape_interval_s=1.0, http_sd=[f"{exporter.url}/sd"]) as prom:
            prom.wait_for("DCGM_FI_DEV_GPU_TEMP", min_results=64, timeout_s=30)
            evidence = EvidenceCollector(tmp_path / "evidence", EvidenceIndex(tmp_path / "evidence-index.db"),
                                         prometheus=PrometheusRange(prom.url))
            runner = ActuationRunner([evidence], Ledger(":memory:"),
                                     ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.CAPTURE_EVIDENCE})))
            store = SqliteStore(tmp_path / "state.db")
            ctl = Controller(policy, [PrometheusSource(prom.url, policy, timeout_s=2)], interval_s=0.5, runner=runner,
                             store=store)
            api = ApiServer(ctl, "127.0.0.1", free_port(), runner=runner).start()
            th = threading.Thread(target=ctl.run, daemon=True)
            th.start()
            try:
                wait(lambda: (h := ctl.published.health) is not None
                     and all((t := h.get(n)) is not None and t.value is not None for n in sim.fleet.nodes), 40,
                     "a known fleet")
                exporter.inject({"kind": "xid79_off_bus", "target": "node-02/gpu3", "onset": 0})
                exporter.inject({"kind": "exporter_outage", "target": "node-05", "onset": 0})
                exporter.inject({"kind": "gpu_reset_required", "target": "node-06/gpu0", "onset": 0,
                                 "params": {"action": "DRAIN_AND_RESET"}})
                exporter.advance(scenario.step)
                wait(lambda: (e := ctl.state.entities.get("node-02")) is not None and e.state.value == "QUARANTINED", 30,
                 "node-02 quarantined")
                wait(lambda: any(e.state.value == "DRAINING" for e in ctl.state.entities.values()), 30,
                     "an entity draining")
                draining = sorted(e.entity for e in ctl.state.entities.values() if e.state.value == "DRAINING")
                wait(lambda: (h := ctl.published.health) is not None and (t := h.get("node-05")) is not None
                     and t.value is None, 30, "node-05 unknown")
                assert httpx.get(f"{api.url}/").status_code == 200
                dom = chromium(tmp_path, "--dump-dom", f"{api.url}/")
                row = {m.group(1): m.group(0) for m in re.finditer(r'<tr data-entity="([^"]+)"[^>]*>', dom)}
                assert 'data-state="QUARANTINED"' in row["node-02"] and 'data-reason="gate:' in row["node-02"]
                for d in draining:  # node-06, draining for its GPU reset
                    assert 'data-state="DRAINING"' in row[d], row[d]
                # node-06's replicas go with its drain: shown draining, with why
                reps = {m.group(1): m.group(0) for m in re.finditer(r'<tr data-entity="([^"]+)"[^>]*data-draining[^>]*>.*?</tr>', dom)}
                on6 = [r for r, html_ in reps.items() if 'data-node="node-06"' in html_]
                assert on6 and all('data-draining="1"' in reps[r] and ">draining<" in reps[r]
                                   and "its node node-06 is DRAINING" in reps[r] for r in on6), reps
                assert any('data-draining="0"' in h for h in reps.values())  # node-07's replicas serve on
                kpi = dom[dom.index('id="kpis"'):]
                assert 'data-pool="train-a"' in kpi and 'data-pool="all"' in kpi and "GPU goodput" in dom
                assert 'data-known="0"' in row["node-05"] and 'data-known="1"' in row["node-01"]
                node05 = dom[dom.index('data-entity="node-05"'):]
                node05 = node05[:node05.index("</tr>")]
                assert 'class="c unknown"' in node05 and ">?<" in node05  # hatched and marked, not a colour
                assert 'id="pool-train-a"' in dom and 'id="pool-serve-a"' in dom and 'id="feed"' in dom
                assert "QUARANTINED" in dom and "kill switch: off" in dom
                wait(lambda: evidence.index.latest("node-02") is not None, 30, "node-02's evidence bundle")
                ent = chromium(tmp_path, "--dump-dom", f"{api.url}/entity/node-02")
                assert "QUARANTINED" in ent and "gate:" in ent and "runbook" in ent and 'id="gpus"' in ent
                # the timeline from the store: state bands (READY, then QUARANTINED), the score line, intent marks
                svg = ent[ent.index('id="timeline"'):ent.index("</svg>", ent.index('id="timeline"'))]
                bands = re.findall(r'class="band" data-state="([A-Z]+)"', svg)
                # (READY before it, unless on a loaded machine the controller's first deciding cycle was the one
                # that quarantined it: then its records begin QUARANTINED)
                assert bands[-1] == "QUARANTINED" and set(bands[:-1]) <= {"none", "READY"}, bands
                assert 'class="score"' in svg and 'data-intent="quarantine"' in svg and 'data-intent="capture_evidence"' in svg
                runbooks = ent[ent.index('id="runbooks"'):]
                assert "reasons/gate-xid.md" in runbooks and "intents/quarantine.md" in runbooks
                ev_link = re.search(r'href="/evidence/([0-9a-f]+)"', ent)
                assert ev_link is not None, ent[ent.index('id="evidence"'):][:500]
                files = chromium(tmp_path, "--dump-dom", f"{api.url}/evidence/{ev_link.group(1)}")
                names = re.findall(r'href="/evidence/[0-9a-f]+/([^"]+)"', files)
                assert "manifest.json" in names or names, files
                got = httpx.get(f"{api.url}/evidence/{ev_link.group(1)}/{names[0]}")
                assert got.status_code == 200 and got.text.strip()
                assert httpx.get(f"{api.url}/evidence/{ev_link.group(1)}/..%2Fstate.db").status_code == 404
                assert httpx.get(f"{api.url}/entity/node-02", params={"hours": 1}).status_code == 200
                gpu_rows = re.findall(r'<tr data-gpu="([^"]+)">.*?</tr>', ent)
                assert len(gpu_rows) >= 7 and any("gpu3" in g or g.endswith("3") for g in gpu_rows), gpu_rows
                assert httpx.get(f"{api.url}/entity/nope").status_code == 404
                shots = Path(os.environ.get("FLEETHEALTH_SHOTS") or tmp_path)
                shots.mkdir(parents=True, exist_ok=True)
                for w, h in ((1280, 1000), (390, 1400)):
                    out = shots / f"fleet-view-{w}.png"
                    chromium(tmp_path, f"--screenshot={out}", f"--window-size={w},{h}", f"{api.url}/")
                    assert out.stat().st_size > 5000
                for w, h in ((1280, 1300), (390, 2000)):
                    chromium(tmp_path, f"--screenshot={shots / f'entity-{w}.png'}", f"--window-size={w},{h}",
                             f"{api.url}/entity/node-02")
            finally:
                ctl.stop()
                th.join(10)
                api.stop()
                store.close()
    finally:
        exporter.stop()

"""The simulator as an exporter: exposition text that prometheus_client's parser reads (``vllm:`` names
kept), the HTTP server with live fault injection, and a real Prometheus scraping it via http_sd."""

from __future__ import annotations

import math
import shutil

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleethealth.sim import Simulation
from fleethealth.sim.server import SimExporterServer
from sim_support import small_scenario


def parse(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
        out.setdefault("__type__" + fam.name, []).append(fam.type)
    return out


def test_render_node_parses_and_keeps_vllm_names() -> None:
    sim = Simulation(small_scenario())
    sim.advance_to(sim.start + 120)
    serving = parse(sim.render_node("node-04"))
    assert "vllm:time_to_first_token_seconds" in serving
    assert serving["__type__vllm:time_to_first_token_seconds"] == ["histogram"]
    assert "vllm:num_requests_waiting" in serving and "vllm:kv_cache_usage_perc" in serving
    buckets = [s for s in serving["vllm:time_to_first_token_seconds"]
               if s.name.endswith("_bucket") and s.labels["replica"] == "llama3-8b-000"]
    assert len(buckets) == 23 and math.isinf(float(buckets[-1].labels["le"]))
    counts = [s.value for s in buckets]
    assert counts == sorted(counts)
    temps = serving["DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 8 and {s.labels["Hostname"] for s in temps} == {"node-04"}
    assert "instance" not in temps[0].labels  # Prometheus adds the target's own
    training = parse(sim.render_node("node-00"))
    ranks = training["fleethealth_rank_compute_seconds"]
    assert len(ranks) == 8 and ranks[0].labels["job"] == "job-a"
    assert "vllm:time_to_first_token_seconds" not in training
    assert training["fleethealth_node_info"][0].labels["pool"] == "train"
    # the page and the snapshot agree
    snap = sim.last
    assert snap is not None
    mi = snap.metric_index()["DCGM_FI_DEV_GPU_TEMP"]
    in_snap = sorted(v for m, ls, v in zip(snap.metric_ids, snap.series_ids, snap.values, strict=True)
                     if m == mi and dict(snap.labelsets[ls])["Hostname"] == "node-04")
    assert sorted(s.value for s in temps) == in_snap


def test_render_shows_dynamic_xid_series_and_outage() -> None:
    sim = Simulation(small_scenario([
        {"kind": "xid79_off_bus", "target": "node-01/gpu2", "onset": 30},
        {"kind": "exporter_outage", "target": "node-03", "onset": 30, "end": 120},
    ]))
    sim.advance_to(sim.start + 30)
    fams = parse(sim.render_node("node-01"))
    xids = fams["DCGM_EXP_XID_ERRORS_COUNT"]
    assert [(s.labels["gpu"], s.labels["xid"], s.value) for s in xids] == [("2", "79", 1.0)]
    with pytest.raises(LookupError):
        sim.render_node("node-03")
    sim.advance_to(sim.start + 90)
    assert len(parse(sim.render_node("node-01"))["DCGM_FI_DEV_GPU_TEMP"]) == 7


def test_http_server_serves_nodes_and_injects_faults() -> None:
    sim = Simulation(small_scenario())
    with SimExporterServer(sim, port=0) as srv, httpx.Client(timeout=5) as http:
        r = http.get(srv.node_url("node-02"))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "DCGM_FI_DEV_SM_CLOCK" in parse(r.text)
        assert http.get(f"{srv.url}/metrics/node-99").status_code == 404
        sd = http.get(f"{srv.url}/sd").json()
        assert len(sd) == 6 and sd[0]["labels"]["__metrics_path__"] == "/metrics/node-00"
        t0 = http.get(f"{srv.url}/control/time").json()["t"]
        assert http.post(f"{srv.url}/control/advance?seconds=60").json()["t"] == t0 + 60
        bad = http.post(f"{srv.url}/control/fault", json={"kind": "meteor", "target": "node-00"})
        assert bad.status_code == 400 and "kind" in bad.json()["error"]
        ok = http.post(f"{srv.url}/control/fault", json={"kind": "exporter_outage", "target": "node-02",
                                                          "onset": 0, "end": 120}).json()
        assert ok["ok"] and ok["truth"][0]["entity"] == "node-02"
        http.post(f"{srv.url}/control/advance?seconds=15")
        assert http.get(srv.node_url("node-02")).status_code == 503
        http.post(f"{srv.url}/control/fault", json={"kind": "xid79_off_bus", "target": "node-01/gpu0"})
        http.post(f"{srv.url}/control/advance?seconds=15")
        page = parse(http.get(srv.node_url("node-01")).text)
        assert [s.value for s in page["DCGM_FI_DEV_XID_ERRORS"] if s.labels["gpu"] == "0"] == [79.0]
        events = http.get(f"{srv.url}/events").json()
        assert any(e["kind"] == "xid" and e["context"]["xid"] == 79 for e in events)
        truth = http.get(f"{srv.url}/truth").json()
        assert {g["fault"] for g in truth} == {"exporter_outage", "xid79_off_bus"}
        done = http.post(f"{srv.url}/control/action", json={"entity": "node-01", "action": "repair"})
        assert done.json()["ended"] == ["xid79_off_bus"]


def test_realtime_clock_advances() -> None:
    sim = Simulation(small_scenario())
    srv = SimExporterServer(sim, port=0, speed=600.0)
    t0 = srv.now()
    import time

    time.sleep(0.2)
    assert srv.now() >= t0 + 60  # 0.2 s of wall time at 600x is two minutes of simulated time
    srv.stop()


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus binary not installed "
                    "(scripts/install-deps installs Debian's prometheus)")
def test_real_prometheus_scrapes_the_simulator() -> None:
    from prom_harness import prometheus

    sim = Simulation(small_scenario())
    with SimExporterServer(sim, port=0, speed=15.0) as srv, prometheus([], http_sd=[f"{srv.url}/sd"]) as prom:
        prom.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="node-03"}', min_results=8, timeout_s=30)
        prom.wait_for('vllm:time_to_first_token_seconds_bucket{le="+Inf"}', min_results=4, timeout_s=30)
        prom.wait_for("up == 1", min_results=6, timeout_s=30)  # every node's page scraped (poll, not sleep)
        r = httpx.get(f"{prom.url}/api/v1/query",
                      params={"query": 'count(DCGM_FI_DEV_GPU_TEMP{instance="node-00:9400"})'}, timeout=5).json()
        assert r["data"]["result"][0]["value"][1] == "8"

"""The fleet KPIs of a running controller (controller.fleet_kpis): GPU-hours lost to a quarantined node and
to a node whose exporter went silent, goodput, live precision of a quarantine still pending; served at
/metrics, /api/v1/pools and in the fleet view; `fleethealth get pools` prints them for people. A controller
on a fake clock (test_controller's six-node source) and a real HTTP server."""

from __future__ import annotations

import math

import httpx
import pytest
from typer.testing import CliRunner

from fleethealth.controller.api import ApiServer
from fleethealth.controller.fleet_kpis import LiveKpis
from prom_harness import free_port
from test_controller import make, sre_guard


def test_live_kpis_count_the_hours_a_quarantine_and_a_silent_exporter_cost() -> None:
    ctl, src, clock = make()
    kpis = LiveKpis(ctl)

    def cycles(n: int) -> None:
        for _ in range(n):
            ctl.cycle()
            kpis.kpis()  # a scrape after every cycle
            clock.t += ctl.interval_s

    assert kpis.kpis() == {}  # no cycle yet
    cycles(4)
    src.xid = 79
    cycles(1)
    q_ts = next(t["ts"] for t in ctl.recent_transitions if t["entity"] == "n0" and t["to"] == "QUARANTINED")
    src.down_nodes = {"n5"}
    cycles(40)
    k = kpis.kpis()
    a = k["a"]
    end = ctl.published.ts
    assert a.nodes == 6 and a.gpus == 48 and kpis._start is not None
    assert a.gpu_hours == pytest.approx(48 * (end - kpis._start) / 3600)
    assert a.lost_isolated_gpu_h == pytest.approx(8 * (end - q_ts) / 3600)  # n0, quarantined to the end
    assert kpis.unknown_s["n5"] > 0 and a.lost_unknown_gpu_h == pytest.approx(8 * kpis.unknown_s["n5"] / 3600)
    assert a.goodput == pytest.approx(1 - (a.lost_isolated_gpu_h + a.lost_unknown_gpu_h + a.lost_slow_gpu_h)
                                      / a.gpu_hours)
    assert a.quarantines == 1 and a.precision is None  # still quarantined: pending, nothing decided yet
    assert a.detect_median_s == 0.0  # a hard gate isolates on the first bad cycle
    assert k["all"].gpus == 48 and a.slo_attainment is None  # no replicas
    assert a.health_mean is not None and 0.9 < a.health_mean <= 1.0
    text = kpis.metrics_text()
    line = next(ln for ln in text.splitlines() if ln.startswith('fleethealth_kpi_goodput_ratio{pool="a"}'))
    assert math.isclose(float(line.split()[-1]), a.goodput or 0.0)
    assert 'fleethealth_kpi_gpu_hours_lost{pool="a",cause="isolated"}' in text
    assert "fleethealth_kpi_quarantine_precision_ratio{" not in text  # no value: no series, not a zero


def test_pools_over_http_in_the_view_and_the_client() -> None:
    ctl, src, clock = make()
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=sre_guard()).start()
    try:
        for k in range(8):
            src.xid = 79 if k >= 5 else 0
            ctl.cycle()
            httpx.get(f"{srv.url}/metrics")
            clock.t += ctl.interval_s
        body = httpx.get(f"{srv.url}/api/v1/pools").json()
        a = body["pools"]["a"]
        assert a["gpus"] == 48 and a["quarantines"] == 1 and 0 < a["goodput"] < 1 and body["since"] < body["ts"]
        text = httpx.get(f"{srv.url}/metrics").text
        from prometheus_client.parser import text_string_to_metric_families

        fams = {f.name: f for f in text_string_to_metric_families(text)}
        assert fams["fleethealth_kpi_goodput_ratio"].samples[0].value == pytest.approx(a["goodput"])
        page = httpx.get(f"{srv.url}/").text
        assert 'id="kpis"' in page and 'data-pool="a"' in page and "GPU goodput" in page
        from fleethealth.cli.main import app

        res = CliRunner().invoke(app, ["get", "pools", "--server", srv.url])
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        assert lines[0].startswith("over the last ") and lines[1].split()[:3] == ["POOL", "GPUS", "GPU"]
        row = next(ln for ln in lines if ln.startswith("a "))
        assert row.split()[1] == "48" and f"{100 * a['goodput']:.1f}%" in row and "None" not in res.stdout
        js = CliRunner().invoke(app, ["get", "pools", "--server", srv.url, "-o", "json"])
        assert json_goodput(js.stdout) == a["goodput"]  # full precision in -o json
    finally:
        srv.stop()


def json_goodput(out: str) -> float:
    import json

    return float(json.loads(out)["pools"]["a"]["goodput"])

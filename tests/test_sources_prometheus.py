"""The Prometheus HTTP API source: query planning, failure handling against a real (scripted) HTTP server,
and reading from a real Prometheus that scrapes a real exporter."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from fleethealth.policy import default_policy
from fleethealth.sources.base import Source
from fleethealth.sources.prometheus import (
    PrometheusAPI,
    PrometheusSource,
    PromQueryError,
    name_selector,
    plan_queries,
    read_range,
)
from prom_harness import PROMETHEUS, ExporterServer, FakeFleet, free_port, prometheus


def test_plan_queries_reads_only_what_the_policy_needs() -> None:
    plan = plan_queries(default_policy())
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in plan.counters  # counter: raw window, engine rates it
    assert "DCGM_FI_DEV_GPU_TEMP" in plan.gauges
    assert "vllm:time_to_first_token_seconds_bucket" in plan.counters  # latency SLO histogram
    assert "vllm:time_to_first_token_seconds_count" in plan.counters
    assert "fleethealth_replica_errors_total" in plan.counters
    assert {"fleethealth_node_info", "fleethealth_replica_info"} <= set(plan.gauges)
    assert "DCGM_FI_DEV_GPU_UTIL" in plan.gauges  # read-only (score: false): read for chronic:idle
    assert "DCGM_FI_DEV_FB_USED" not in plan.all_names  # not in the policy: never queried
    assert not set(plan.gauges) & set(plan.counters)
    assert plan.targets == ("up", "scrape_duration_seconds")


def test_name_selector() -> None:
    assert name_selector(["up"]) == "up"
    assert name_selector(["a", "vllm:b"]) == '{__name__=~"a|vllm:b"}'
    assert name_selector(["a", "b"], 'job="x"') == '{__name__=~"a|b",job="x"}'


# ---- a scripted HTTP server that speaks (or fails to speak) the API ---------------------------------


class Scripted:
    def __init__(self) -> None:
        self.mode = "ok"
        self.queries: list[dict[str, list[str]]] = []
        self.port = free_port()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                form = parse_qs(self.rfile.read(n).decode())
                outer.queries.append(form)
                status, body = outer.answer(form)
                if outer.mode == "slow":
                    time.sleep(1.5)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), H)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, form: dict[str, list[str]]) -> tuple[int, str]:
        if self.mode == "error":
            return 422, json.dumps({"status": "error", "errorType": "execution", "error": "query too big"})
        if self.mode == "garbage":
            return 502, "<html>bad gateway</html>"
        t = float(form["time"][0])
        q = form["query"][0]
        result: list[dict[str, Any]] = []
        if "DCGM_FI_DEV_GPU_TEMP" in q and q.endswith("]"):
            lab = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "n1", "gpu": "0"}
            result = [{"metric": lab, "values": [[t - 20, "60"], [t - 5, "61"], [t - 4, "NaN"]]}]
        elif "DCGM_FI_DEV_GPU_TEMP" in q:
            result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "n1", "gpu": "0"},
                       "value": [t, "61"]}]
        body: dict[str, Any] = {"status": "success",
                                "data": {"resultType": "matrix" if q.endswith("]") else "vector", "result": result}}
        if self.mode == "partial":
            body["warnings"] = ["store gateway 3 unavailable"]
        return 200, json.dumps(body)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def scripted() -> Iterator[Scripted]:
    s = Scripted()
    yield s
    s.close()


def test_reads_raw_samples_with_their_timestamps_and_dedups(scripted: Scripted) -> None:
    src = PrometheusSource(scripted.url, default_policy(), timeout_s=2)
    assert isinstance(src, Source)
    now = 1_700_000_000.0
    snap = src.read(now)
    rows = [(m, v, t) for m, _, v, t in snap.rows()]
    assert ("DCGM_FI_DEV_GPU_TEMP", 61.0, now - 5) in rows and ("DCGM_FI_DEV_GPU_TEMP", 60.0, now - 20) in rows
    assert not snap.source_errors
    assert any("NaN" in i.reason for i in snap.issues)  # dropped, counted, never a value
    # the same samples come back on the next read: emitted once only
    again = src.read(now + 1)
    assert [r for r in again.rows() if r[3] <= now - 5] == []
    # windows: full rate window on the first read, then shrunk to the gap plus slack
    first = [f["query"][0] for f in scripted.queries[: len(src.queries(now))]]
    assert any(q.endswith("[300s]") for q in first) and any(q.endswith("[90s]") for q in first)
    assert all(q.endswith("[31s]") or q.endswith("[30s]") for q in (x[1] for x in src.queries(now + 2)))
    # every query is evaluated at `now`
    assert {f["time"][0] for f in scripted.queries[: len(first)]} == {f"{now:.3f}"}


def test_instant_mode_stamps_evaluation_time(scripted: Scripted) -> None:
    src = PrometheusSource(scripted.url, default_policy(), gauge_mode="instant")
    snap = src.read(1000.0)
    assert [(m, v, t) for m, _, v, t in snap.rows()] == [("DCGM_FI_DEV_GPU_TEMP", 61.0, 1000.0)]


@pytest.mark.parametrize(
    ("mode", "reason"),
    [("error", "execution: query too big"), ("garbage", "not JSON"), ("slow", "timeout")],
)
def test_failures_are_source_errors_never_exceptions(scripted: Scripted, mode: str, reason: str) -> None:
    scripted.mode = mode
    src = PrometheusSource(scripted.url, default_policy(), timeout_s=0.5, chunk=64)
    snap = src.read(1000.0)
    assert len(snap) == 0
    assert snap.source_errors and all(reason in e.reason for e in snap.source_errors)
    assert src.last_error is not None and src.last_success is None


def test_down_server_is_a_source_error() -> None:
    src = PrometheusSource(f"http://127.0.0.1:{free_port()}", default_policy(), timeout_s=0.5)
    snap = src.read(1000.0)
    assert len(snap) == 0 and "cannot connect" in snap.source_errors[0].reason


def test_partial_response_keeps_data_and_reports_warning(scripted: Scripted) -> None:
    scripted.mode = "partial"
    snap = PrometheusSource(scripted.url, default_policy()).read(1000.0)
    assert len(snap) > 0 and not snap.source_errors
    assert any("partial response: store gateway 3 unavailable" in i.reason for i in snap.issues)


def test_api_raises_one_line_errors(scripted: Scripted) -> None:
    scripted.mode = "error"
    api = PrometheusAPI(scripted.url)
    with pytest.raises(PromQueryError, match="query too big"):
        api.query("up", 1.0)


# ---- a real Prometheus ---------------------------------------------------------------------------

needs_prom = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary missing (apt-get install prometheus)")


@needs_prom
@pytest.mark.needs_prometheus
def test_against_real_prometheus(tmp_path: Path) -> None:
    fleet = FakeFleet({"node-a": 2, "node-b": 2})
    with ExporterServer(fleet) as exp, prometheus([(f"127.0.0.1:{exp.port}", "/metrics", {})]) as prom:
        prom.wait_for("DCGM_FI_DEV_GPU_TEMP", min_results=4)
        prom.wait_for("count_over_time(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[1m]) > 1", min_results=4)
        src = PrometheusSource(prom.url, default_policy(), timeout_s=5)
        now = time.time()
        snap = src.read(now)
        assert not snap.source_errors, snap.source_errors
        by_metric: dict[str, list[tuple[dict[str, str], float, float]]] = {}
        for m, lab, v, t in snap.rows():
            by_metric.setdefault(m, []).append((lab, v, t))
        temps = by_metric["DCGM_FI_DEV_GPU_TEMP"]
        assert {(lab["Hostname"], lab["gpu"]) for lab, _, _ in temps} == {
            ("node-a", "0"), ("node-a", "1"), ("node-b", "0"), ("node-b", "1")}
        assert all(now - 10 < t <= now for _, _, t in temps)  # real sample times, not evaluation time
        assert len(by_metric["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]) > 4  # a window of raw counter samples
        assert "vllm:num_preemptions_total" in by_metric  # classic text keeps the colon names
        assert {lab["instance"] for lab, _, _ in by_metric["up"]} == {f"127.0.0.1:{exp.port}"}
        assert "DCGM_FI_DEV_POWER_USAGE" not in by_metric  # not needed by the policy: not read
        # a range query for recordings
        rec = read_range(src.api, ["DCGM_FI_DEV_GPU_TEMP"], now - 3, now, 1.0)
        assert len(rec) >= 4 and {round(now - t, 3) for t in rec.ts.tolist()} <= {0.0, 1.0, 2.0, 3.0}
        # `fleethealth record`: the policy's series over a window, as a table replay can read
        from typer.testing import CliRunner

        from fleethealth.cli.main import app
        from fleethealth.sources.tables import read_table

        out = tmp_path / "rec.parquet"
        res = CliRunner().invoke(app, ["record", "--prometheus", prom.url, "--out", str(out), "--start",
                                       f"{now - 3:.3f}", "--end", f"{now:.3f}", "--step", "1"])
        assert res.exit_code == 0, res.output
        back = read_table(out)
        assert "DCGM_FI_DEV_GPU_TEMP" in back.metrics and "up" in back.metrics and len(back) > 20
        # Prometheus dies: errors, no exception, no samples
        prom.kill()
        dead = src.read(time.time())
        assert len(dead) == 0 and dead.source_errors
        assert all("cannot connect" in e.reason for e in dead.source_errors)
        res = CliRunner().invoke(app, ["record", "--prometheus", prom.url, "--out", str(out)])
        assert res.exit_code == 2 and "cannot connect" in res.output


def test_rank_samples_behind_a_prometheus_with_honor_labels_false_keep_their_training_jobs() -> None:
    """Finding 2 behind a real Prometheus with its default honor_labels: false: the training job of each
    rank sample arrives as exported_job (job is the scrape job's name), and ranks and their peers are still
    keyed by the training job (16 ranks of two jobs, none compared with the other job's)."""
    from test_sources_scrape import assert_ranks_kept_apart, rank_page_server

    with rank_page_server() as url:
        addr, path = url.removeprefix("http://").split("/", 1)
        with prometheus([(addr, "/" + path, {})]) as prom:
            prom.wait_for("fleethealth_rank_compute_seconds", min_results=16)
            src = PrometheusSource(prom.url, default_policy(), timeout_s=5)
            now = time.time()
            snap = src.read(now)
    assert not snap.source_errors, snap.source_errors
    rows = [lab for m, lab, _, _ in snap.rows() if m == "fleethealth_rank_compute_seconds"]
    assert {lab["job"] for lab in rows} == {"t0"}
    assert {lab["exported_job"] for lab in rows} == {"pretrain-70b", "finetune-8b"}
    assert_ranks_kept_apart(snap, now, exported=True)


def test_reads_share_interning_and_compaction_keeps_last_timestamps(scripted: Scripted) -> None:
    from fleethealth.sources.prometheus import _Series

    src = PrometheusSource(scripted.url, default_policy())
    a = src.read(1000.0)
    b = src.read(1001.0)
    # the same growing lists: the rolling history maps ids once, not on every read
    assert a.labelsets is b.labelsets and a.metrics is b.metrics
    ser = _Series()
    ser.slot("m", (("a", "1"),))[2:] = [5.0, 1]
    ser.slot("m", (("a", "2"),))[2:] = [6.0, 3]
    live = ser.compacted(2)
    assert list(live.slots) == [("m", (("a", "2"),))] and live.slots[("m", (("a", "2"),))][2:] == [6.0, 3]

"""A read that had errors never supports an absence conclusion (tests/test_controller_e2e.py's outage flake).

The mechanism, found by looping that e2e test: the structural tracker counts a node's GPUs among its fresh
GPU samples and emits ``fleethealth_node_gpus_missing`` while the node's telemetry is alive, which a fresh
``up == 1`` of its scrape target is enough for. The Prometheus source reads the policy's series in several
queries (counters, then GPU gauges, then ``up`` and the info metrics last). Two ways the GPU samples end
up older than ``up`` and go stale first while ``up`` still reads fresh:

- the GPU queries fail (time out, answer an error) while the small ``up`` query still answers;
- the last good read saw a scrape land between the GPU queries and the ``up`` query, and then every query
  fails (Prometheus killed: the e2e test). For the one target whose scrape landed in between (node-04 in
  the flake), ``up`` stays fresh one scrape interval longer than its GPUs.

Either way the node read ``gpus_missing`` = all its GPUs, a hard gate, quarantined before the fleet's
telemetry-loss freeze engaged. Missing data is never healthy and never a hard gate either: while a read
could not read GPU metrics, the controller holds every node's absence signals at what they were (a rise is
not emitted; the node goes stale, unknown), and a GPU really gone is counted again once the reads work.

Real parts: a real HTTP server that speaks the Prometheus query API (``/api/v1/query``, range selectors
answered with raw samples and their timestamps) over loopback, read by the real PrometheusSource and
Controller; it answers some queries and fails others (HTTP 503 with Prometheus' error body), or is shut
down (refused connections). No timing: the controller's clock is the test's argument to ``cycle``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from act_support import free_port
from fleethealth.controller.api import render_metrics
from fleethealth.controller.loop import AbsenceHold, Controller
from fleethealth.policy import Policy, default_policy
from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sources.prometheus import PrometheusSource
from fleethealth.sources.structural import GPUS_MISSING, SERIES_VANISHED

T0 = 1_800_000_000.0
NODES = ("node-a", "node-b", "node-c", "node-d", "node-e", "node-f")
GPUS = 8
GAUGES = {"DCGM_FI_DEV_GPU_TEMP": 55.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_XID_ERRORS": 0.0}
COUNTERS = {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0}
_NAMES = re.compile(r'__name__=~"([^"]+)"')
_WINDOW = re.compile(r"\[(\d+)s\]$")


class PromAPI:
    """A Prometheus query API over loopback with a scripted TSDB: ``scrape(t)`` appends one sample per
    series at ``t`` (every node's GPUs and its target's ``up``); a query answers the named series' raw
    samples in (time - window, time]. ``fails(names)`` picks queries to answer with an error;
    ``after_query(names)`` runs once a query is answered (a scrape landing between two queries)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        self.gone: set[tuple[str, int]] = set()  # (node, gpu) no longer on its exporter's page
        self.fails: Callable[[list[str]], bool] = lambda names: False
        self.after_query: Callable[[list[str]], None] = lambda names: None
        self.answered: list[list[str]] = []
        self.port = free_port()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                form = parse_qs(self.rfile.read(n).decode())
                status, body, names = outer.answer(form)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if status == 200:
                    outer.answered.append(names)
                    outer.after_query(names)

            def log_message(self, *a: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def scrape(self, t: float) -> None:
        with self.lock:
            for node in NODES:
                inst = {"instance": f"{node}:9400", "job": "dcgm"}
                self._add({"__name__": "up", **inst}, t, 1.0)
                for gpu in range(GPUS):
                    if (node, gpu) in self.gone:
                        continue
                    lab = {**inst, "Hostname": node, "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}"}
                    for name, v in {**GAUGES, **COUNTERS}.items():
                        self._add({"__name__": name, **lab}, t, v)

    def _add(self, labels: dict[str, str], t: float, v: float) -> None:
        self.series.setdefault(tuple(sorted(labels.items())), []).append((t, v))

    def answer(self, form: dict[str, list[str]]) -> tuple[int, str, list[str]]:
        q, at = form["query"][0], float(form["time"][0])
        m = _NAMES.search(q)
        names = m.group(1).split("|") if m else [re.split(r"[{\[]", q, maxsplit=1)[0]]
        if self.fails(names):
            return 503, json.dumps({"status": "error", "errorType": "timeout",
                                    "error": "query timed out in expression evaluation"}), names
        w = _WINDOW.search(q)
        lo = at - float(w.group(1)) if w else at - 300.0
        with self.lock:
            result = [{"metric": dict(key), "values": [[t, repr(v)] for t, v in pts if lo < t <= at]}
                      for key, pts in self.series.items() if dict(key)["__name__"] in names]
        result = [r for r in result if r["values"]]
        return 200, json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}), names

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture()
def api() -> Iterator[PromAPI]:
    a = PromAPI()
    try:
        yield a
    finally:
        a.stop()


def _policy() -> Policy:
    p = default_policy()
    # Without the read-only gpu_util (DCGM_FI_DEV_GPU_UTIL, which this API never serves): with it in the
    # policy a total GPU-query failure derives no gpus_missing at all, so nothing rises for the hold to
    # keep back and the hold's own path goes untested. (Safe either way: no absence from unread data.)
    signals = [s for s in p.signals if s.score or s.metric in GAUGES]
    return p.model_copy(update={"signals": signals,
                                "fleet": p.fleet.model_copy(update={"min_entities": 3})})


class Run:
    """The controller reading the API, one cycle per call at the test's time, with what it concluded."""

    def __init__(self, api: PromAPI) -> None:
        self.policy = _policy()
        self.source = PrometheusSource(api.url, self.policy, timeout_s=5)
        self.ctl = Controller(self.policy, [self.source], interval_s=15.0)
        self.missing: list[dict[str, float]] = []  # per cycle: the gpus_missing samples it derived

        def on_cycle(_: Any) -> None:
            view = self.ctl.history.view(self.ctl.published.ts)
            out: dict[str, float] = {}
            if "fleethealth_node_gpus_missing" in view.metrics:
                mid = view.metrics.index("fleethealth_node_gpus_missing")
                for i in range(len(view)):
                    if int(view.metric_ids[i]) == mid:
                        out[dict(view.labelsets[int(view.series_ids[i])])["node"]] = float(view.values[i])
            self.missing.append(out)

        self.ctl.on_cycle = on_cycle

    def cycle(self, now: float) -> None:
        self.ctl.cycle(now)

    def gated(self) -> dict[str, str]:
        h = self.ctl.published.health
        assert h is not None
        return {n: t.reason for n in NODES if (t := h.get(n)) is not None and t.reason.startswith("gate:")}

    def remediated(self) -> list[tuple[str, str, str]]:
        return [(i["entity"], i["intent"], i["reason"]) for i in self.ctl.published.recent_intents
                if i["intent"] in ("quarantine", "drain", "schedule_reset", "run_active_test")]

    def close(self) -> None:
        self.source.close()


def _healthy_start(api: PromAPI, run: Run) -> float:
    """Four scrapes 15 s apart, a cycle 5 s after each: every node READY-bound with all 8 GPUs."""
    for k in range(4):
        api.scrape(T0 + 15 * k)
        run.cycle(T0 + 15 * k + 5)
    assert run.missing[-1] == dict.fromkeys(NODES, 0.0)
    assert not run.gated()
    return T0 + 45


def test_gpu_queries_failing_while_up_answers_is_no_gpus_missing(api: PromAPI) -> None:
    """The GPU queries time out (the big ones), ``up`` keeps answering fresh: after max_age_s the GPUs are
    stale and the targets alive. Before: gpus_missing 8 on every node (a hard gate, quarantine intents).
    Now: no absence while those queries fail, the nodes go unknown; once the reads work again a GPU that
    really fell off is counted at once."""
    run = Run(api)
    try:
        last = _healthy_start(api, run)
        api.fails = lambda names: any(n.startswith("DCGM_FI_DEV_") for n in names)
        t = last
        for _ in range(10):  # 150 s of failed GPU queries, Prometheus scraping on
            t += 15
            api.scrape(t)
            run.cycle(t + 5)
            assert run.source.unread_metrics >= set(GAUGES) | set(COUNTERS)
            assert all(v == 0.0 for v in run.missing[-1].values()), run.missing[-1]
            assert not run.gated()
        # past max_age_s every node's 8 missing GPUs were held back: counted, and served to operators
        assert run.ctl.published.counters["absence_held"] >= len(NODES)
        assert f"fleethealth_absence_held {run.ctl.published.counters['absence_held']:.1f}" in \
            render_metrics(run.ctl)
        h = run.ctl.published.health
        assert h is not None
        assert all((tu := h.get(n)) is not None and tu.value is None for n in NODES)  # unknown: stale
        assert run.remediated() == []
        # the reads work again; node-a's GPU 3 falls off the bus: one GPU missing at once, a gate
        api.fails = lambda names: False
        api.gone.add(("node-a", 3))
        t += 15
        api.scrape(t)
        run.cycle(t + 5)
        assert run.source.unread_metrics == frozenset()
        assert run.missing[-1]["node-a"] == 1.0
        assert run.gated() == {"node-a": "gate:gpus_missing"}
    finally:
        run.close()


def test_a_scrape_landing_before_the_up_query_then_prometheus_dies_is_no_gpus_missing(api: PromAPI) -> None:
    """The e2e flake: in the last good read a scrape lands after the GPU queries and before the ``up``
    query, so ``up`` is one scrape newer than the GPUs; then Prometheus dies (refused connections). For
    those 10 s the GPUs were stale and ``up`` fresh: gpus_missing 8 on every node before the fix."""
    run = Run(api)
    try:
        last = _healthy_start(api, run)
        t_read = last + 14.0
        landed: list[float] = []

        def scrape_between(names: list[str]) -> None:
            if "DCGM_FI_DEV_GPU_TEMP" in names and not landed:
                landed.append(t_read - 0.5)
                api.scrape(t_read - 0.5)  # newer than the GPUs just read, older than the read's time

        api.after_query = scrape_between
        run.cycle(t_read)  # the last good read: GPUs at last, up at t_read - 0.5
        assert landed and run.source.unread_metrics == frozenset()
        api.stop()  # Prometheus killed: every query refused from now on
        t = t_read
        while t < last + 90 + 40:
            t += 2.0
            run.cycle(t)
            assert run.source.unread_metrics >= set(GAUGES) | set(COUNTERS)
            assert all(v == 0.0 for v in run.missing[-1].values()), (t - last, run.missing[-1])
            assert not run.gated(), (t - last, run.gated())
        assert run.remediated() == []
    finally:
        run.close()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 8), min_size=3, max_size=3),
                          st.sampled_from(["", "DCGM_FI_DEV_GPU_TEMP", "vllm:num_requests_waiting", "*"])),
                min_size=1, max_size=12))
def test_an_incomplete_read_never_raises_an_absence_value(cycles: list[tuple[list[int], str]]) -> None:
    """Whatever the tracker derives, cycle after cycle: while GPU metrics are unread (or everything, a
    source that raised) no gpus_missing above the last value emitted for that node gets out, and while
    anything is unread no series_vanished above its last; a complete read passes everything through;
    nothing but a rise is ever held back."""
    hold = AbsenceHold("DCGM_FI_DEV_")
    seen: dict[tuple[str, str], float] = {}
    for k, (values, unread) in enumerate(cycles):
        b = SnapshotBuilder()
        for node, x in zip(NODES, values, strict=False):
            b.add(GPUS_MISSING, {"node": node}, float(x), T0 + k)
            b.add(SERIES_VANISHED, {"node": node}, float(2 * x), T0 + k)
        snap = b.build(T0 + k)
        out = hold.apply(snap, {unread} if unread else set())
        if not unread:
            assert out is snap and hold.held == 0
        rows = {(out.metrics[m], dict(out.labelsets[s])["node"]): v for m, s, v in
                zip(out.metric_ids.tolist(), out.series_ids.tolist(), out.values.tolist(), strict=True)}
        gpu_unread = unread in ("*", "DCGM_FI_DEV_GPU_TEMP")
        for node, x in zip(NODES, values, strict=False):
            for metric, v in ((GPUS_MISSING, float(x)), (SERIES_VANISHED, float(2 * x))):
                rose = v > seen.get((metric, node), 0.0)
                held = bool(unread) and rose and (metric == SERIES_VANISHED or gpu_unread)
                assert ((metric, node) in rows) is not held
                if not held:
                    assert rows[(metric, node)] == v
                    seen[(metric, node)] = v

"""Direct scrape of exporter endpoints: real HTTP servers on loopback (prometheus-client text), concurrent
fetches, timeouts and failures that make entities stale, never healthy."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import Snapshot
from fleethealth.sources.base import Source
from fleethealth.sources.scrape import ScrapeSource, ScrapeTarget
from prom_harness import ExporterServer, FakeFleet, free_port


def by_metric(snap: object) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for m, lab, v, _ in snap.rows():  # type: ignore[attr-defined]
        out.setdefault(m, []).append((lab, v))
    return out


def test_scrapes_good_and_reports_bad_endpoints() -> None:
    good = ExporterServer(FakeFleet({"node-a": 2}))
    hung = ExporterServer(FakeFleet({"node-b": 2}))
    broken = ExporterServer(FakeFleet({"node-c": 2}))
    hung.hang_s = 5.0
    broken.fail = True
    dead_url = f"http://127.0.0.1:{free_port()}/metrics"
    with good, hung, broken:
        src = ScrapeSource(
            [ScrapeTarget(f"{good.url}/metrics", {"pool": "p1"}, job="dcgm"), f"{hung.url}/metrics",
             f"{broken.url}/metrics", dead_url],
            timeout_s=0.5,
        )
        assert isinstance(src, Source)
        t0 = time.perf_counter()
        now = 1_700_000_000.0
        snap = src.read(now)
        took = time.perf_counter() - t0
        src.close()
    assert took < 4.0  # the hung endpoint costs its timeout (0.5 s), not its 5 s hang
    m = by_metric(snap)
    temps = m["DCGM_FI_DEV_GPU_TEMP"]
    assert {lab["Hostname"] for lab, _ in temps} == {"node-a"}  # only the healthy endpoint's samples
    lab = temps[0][0]
    assert lab["instance"] == f"127.0.0.1:{good.port}" and lab["job"] == "dcgm" and lab["pool"] == "p1"
    assert "vllm:num_preemptions_total" in m  # classic text: colon names intact
    ups = {lab["instance"]: v for lab, v in m["up"]}
    assert ups == {f"127.0.0.1:{good.port}": 1.0, f"127.0.0.1:{hung.port}": 0.0,
                   f"127.0.0.1:{broken.port}": 0.0, dead_url.split("/")[2]: 0.0}
    assert len(m["scrape_duration_seconds"]) == 4
    errs = {e.source: e.reason for e in snap.source_errors}
    assert errs[f"{hung.url}/metrics"].startswith("timeout")
    assert errs[f"{broken.url}/metrics"] == "HTTP 500"
    assert errs[dead_url].startswith("cannot connect")
    assert all(t == now for t in snap.ts.tolist())  # samples without timestamps are observed at `now`


def test_many_endpoints_concurrently() -> None:
    nodes = {f"n{i:02d}": 8 for i in range(24)}
    exp = ExporterServer(FakeFleet(nodes))
    exp.hang_s = 0.3  # every endpoint is slow
    with exp:
        src = ScrapeSource([f"{exp.url}/metrics/{n}" for n in nodes], timeout_s=5, concurrency=32)
        t0 = time.perf_counter()
        snap = src.read(1000.0)
        took = time.perf_counter() - t0
        # a second read reuses the connection pool
        snap2 = src.read(1015.0)
        src.close()
    assert not snap.source_errors and not snap2.source_errors
    assert exp.max_inflight >= 8  # fetched concurrently (bounded by `concurrency`), not one by one
    assert took < 0.3 * 24  # below the serial 7.2 s even on a loaded machine
    temps = by_metric(snap)["DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 24 * 8


def test_dead_endpoint_makes_its_entities_stale() -> None:
    fleet = FakeFleet({"node-a": 2, "node-b": 2})
    a = ExporterServer(fleet)
    with a:
        ok = ScrapeSource([f"{a.url}/metrics/node-a", f"{a.url}/metrics/node-b"], timeout_s=1)
        first = ok.read(1000.0)
        a.fail = True
        later = ok.read(1200.0)
        ok.close()
    from fleethealth.signals.history import SignalHistory

    h = SignalHistory(default_policy())
    h.add(first)
    h.add(later)
    fh = score_snapshot(h.view(1200.0), default_policy(), 1200.0)
    node = fh.tuples["node-a"]
    assert node.value is None and node.confidence == 0.0  # unknown, never healthy
    gpu = fh.tuples["node-a/gpu0"]
    assert gpu.categories.get("thermal") is None  # the temperature is stale: excluded, not healthy
    assert len(later.source_errors) == 2


def _rank_page() -> bytes:
    """Two training jobs' per-rank exporter page (each sample carries its own `job`, the training job): a
    slow job (1.8 s per step) and a fast one (0.63 s), 8 ranks each in the same peer group name."""
    lines = ["# TYPE fleethealth_rank_compute_seconds gauge"]
    for job, secs, first_node in (("pretrain-70b", 1.8, 0), ("finetune-8b", 0.63, 4)):
        for r in range(8):
            lines.append(f'fleethealth_rank_compute_seconds{{job="{job}",rank="{r}",peer_group="stage0",'
                         f'node="node-{first_node + r // 2:02d}",gpu="{r % 2}"}} {secs + 0.001 * r}')
    return ("\n".join(lines) + "\n").encode()


@contextlib.contextmanager
def rank_page_server() -> Iterator[str]:
    """A real HTTP exporter serving ``_rank_page`` on loopback; yields its /metrics URL."""
    body = _rank_page()

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    finally:
        srv.shutdown()
        srv.server_close()


def assert_ranks_kept_apart(snap: Snapshot, now: float, exported: bool) -> None:
    """Both jobs' 8 ranks are entities of their own training job, each job's ranks peers of their own job
    only (all alike: performance 1.0); a rank whose job came from exported_job says so in its note."""
    fh = score_snapshot(snap, default_policy(), now)
    ranks = fh.by_kind("rank")
    assert sorted(t.entity for t in ranks) == sorted(
        f"{j}/rank{r}" for j in ("pretrain-70b", "finetune-8b") for r in range(8))
    for t in ranks:
        assert t.categories["performance"] == 1.0, (t.entity, t.details)
    notes = [d.note for t in ranks for d in t.details if d.signal == "rank_compute_time" and d.note]
    assert len(notes) == (16 if exported else 0), notes
    assert all("exported" in n and "job" in n for n in notes)


def test_a_page_with_its_own_job_label_keeps_its_jobs_apart() -> None:
    """Finding 2: the scraper's job label must not merge ranks of different training jobs into one peer
    group. honor_labels (default) keeps the page's `job`; with honor_labels: false (Prometheus' default)
    the training job is in `exported_job`, and the engine still keys ranks and peers by it, and says so."""
    now = 1_700_000_000.0
    with rank_page_server() as url:
        honored = ScrapeSource([ScrapeTarget(url, job="ranks")])
        snap_h = honored.read(now)
        honored.close()
        replaced = ScrapeSource([ScrapeTarget(url, job="ranks", honor_labels=False)])
        snap_r = replaced.read(now)
        replaced.close()
    jobs = {lab["job"] for lab, _ in by_metric(snap_h)["fleethealth_rank_compute_seconds"]}
    assert jobs == {"pretrain-70b", "finetune-8b"}  # the page's own job kept
    assert {lab["job"] for lab, _ in by_metric(snap_h)["up"]} == {"ranks"}  # the target's own series: its job
    moved = by_metric(snap_r)["fleethealth_rank_compute_seconds"]
    assert {lab["job"] for lab, _ in moved} == {"ranks"}
    assert {lab["exported_job"] for lab, _ in moved} == {"pretrain-70b", "finetune-8b"}
    assert_ranks_kept_apart(snap_h, now, exported=False)
    assert_ranks_kept_apart(snap_r, now, exported=True)


def test_honor_labels_in_the_controller_config() -> None:
    """The scrape section's honor_labels (default true) is every target's, unless a target sets its own."""
    from fleethealth.controller.build import build_sources
    from fleethealth.controller.config import parse_config

    cfg = parse_config("sources:\n  scrape:\n    targets:\n      - http://127.0.0.1:1/metrics\n"
                       "      - {url: 'http://127.0.0.1:2/metrics', honor_labels: false}\n")
    assert cfg.sources.scrape is not None and cfg.sources.scrape.honor_labels is True
    sources, closers = build_sources(cfg, default_policy())
    try:
        src = next(s for s in sources if isinstance(s, ScrapeSource))
        assert [t.honor_labels for t in src.targets] == [True, False]
    finally:
        for c in closers:
            c()
    cfg = parse_config("sources:\n  scrape:\n    honor_labels: false\n    targets: [http://127.0.0.1:1/metrics]\n")
    sources, closers = build_sources(cfg, default_policy())
    try:
        assert [t.honor_labels for s in sources if isinstance(s, ScrapeSource) for t in s.targets] == [False]
    finally:
        for c in closers:
            c()

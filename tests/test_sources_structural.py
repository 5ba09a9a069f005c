"""Structural signals: a GPU that vanishes is a hardware signal for its node; a dead exporter is missing data."""

from __future__ import annotations

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.structural import GPUS_MISSING, SERIES_VANISHED, StructuralTracker


def dcgm(at: float, nodes: dict[str, list[int]], up: dict[str, float] | None = None) -> Snapshot:
    b = SnapshotBuilder()
    for node, gpus in nodes.items():
        for g in gpus:
            lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}", "instance": f"{node}:9400",
                   "modelName": "H100"}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0, at)
            b.add("DCGM_FI_DEV_SM_CLOCK", lab, 1980.0, at)
    for inst, v in (up or {}).items():
        b.add("up", {"instance": inst, "job": "dcgm"}, v, at)
        b.add("scrape_duration_seconds", {"instance": inst, "job": "dcgm"}, 0.02, at)
    return b.build(at)


def derived(snap: Snapshot) -> dict[tuple[str, str], float]:
    return {(m, lab["node"]): v for m, lab, v, _ in snap.rows()}


def test_gpu_vanishing_counts_against_the_nodes_own_history() -> None:
    tr = StructuralTracker(max_age_s=90)
    h = SignalHistory(default_policy())
    h.add(dcgm(0, {"n1": list(range(8)), "n2": list(range(8))}))
    r = tr.observe(h.view(0), 0)
    assert derived(r.snapshot)[(GPUS_MISSING, "n1")] == 0.0
    # GPU 3 of n1 falls off the bus: its series stop; the node keeps reporting the other seven
    for t in (15, 30, 45, 60, 75, 90, 105):
        h.add(dcgm(t, {"n1": [0, 1, 2, 4, 5, 6, 7], "n2": list(range(8))}))
    r = tr.observe(h.view(105), 105)
    d = derived(r.snapshot)
    assert d[(GPUS_MISSING, "n1")] == 1.0 and d[(GPUS_MISSING, "n2")] == 0.0
    assert d[(SERIES_VANISHED, "n1")] == 2.0 and d[(SERIES_VANISHED, "n2")] == 0.0
    assert r.gpus_now == {"n1": 7, "n2": 8} and r.gpus_expected == {"n1": 8, "n2": 8}
    # the engine gates the node on it (hardware), not just "unknown"
    h.add(r.snapshot)
    fh = score_snapshot(h.view(105), default_policy(), 105)
    n1 = fh.tuples["n1"]
    assert n1.value == 0.0 and n1.reason == "gate:gpus_missing"
    assert fh.tuples["n2"].value is not None and fh.tuples["n2"].value > 0.9


def test_dead_exporter_is_missing_data_not_missing_gpus() -> None:
    tr = StructuralTracker(max_age_s=90)
    h = SignalHistory(default_policy())
    h.add(dcgm(0, {"n1": list(range(8))}, up={"n1:9400": 1.0}))
    tr.observe(h.view(0), 0)
    h.add(dcgm(200, {}, up={"n1:9400": 0.0}))  # exporter down: no series at all, up == 0
    r = tr.observe(h.view(200), 200)
    assert (GPUS_MISSING, "n1") not in derived(r.snapshot)
    assert r.targets_down == ["n1:9400"]
    assert [e.source for e in r.snapshot.source_errors] == ["target n1:9400"]


def test_all_gpus_gone_while_the_exporter_answers_is_hardware() -> None:
    tr = StructuralTracker(max_age_s=90)
    h = SignalHistory(default_policy())
    h.add(dcgm(0, {"n1": list(range(4))}, up={"n1:9400": 1.0}))
    tr.observe(h.view(0), 0)
    h.add(dcgm(200, {}, up={"n1:9400": 1.0}))  # exporter answers but lists no GPU (driver gone)
    r = tr.observe(h.view(200), 200)
    assert derived(r.snapshot)[(GPUS_MISSING, "n1")] == 4.0


def test_kubernetes_capacity_sets_the_expected_count() -> None:
    tr = StructuralTracker(max_age_s=90)
    r = tr.observe(dcgm(0, {"n1": list(range(7))}), 0, gpu_capacity={"n1": 8})
    assert derived(r.snapshot)[(GPUS_MISSING, "n1")] == 1.0
    tr.forget("n1")
    assert derived(tr.observe(dcgm(1, {"n1": list(range(7))}), 1).snapshot)[(GPUS_MISSING, "n1")] == 0.0


def test_slow_scrape_is_reported() -> None:
    b = SnapshotBuilder()
    b.add("scrape_duration_seconds", {"instance": "h:1", "job": "x"}, 12.5, 0)
    r = StructuralTracker(slow_scrape_s=10).observe(b.build(0), 0)
    assert r.scrape_seconds == {"h:1": 12.5}
    assert any("slow scrape" in i.reason for i in r.snapshot.issues)


def test_samples_without_gpus_emit_nothing() -> None:
    b = SnapshotBuilder()
    b.add("vllm:num_requests_waiting", {"replica": "r1", "instance": "r1:8000"}, 3, 0)
    assert len(StructuralTracker().observe(b.build(0), 0).snapshot) == 0


def test_a_failed_scrape_silences_the_node_at_once_and_derived_samples_age_with_their_data() -> None:
    tr = StructuralTracker(max_age_s=90)
    h = SignalHistory(default_policy())
    h.add(dcgm(0, {"n1": list(range(8)), "n2": list(range(8))}, up={"n1:9400": 1.0, "n2:9400": 1.0}))
    r = tr.observe(h.view(10), 10)
    assert {t for _, _, _, t in r.snapshot.rows()} == {0.0}  # stamped with the data's time, not `now`
    # n1's exporter fails now; its samples from t=0 are still within max_age, but it is known dead
    b = SnapshotBuilder()
    b.add("up", {"instance": "n1:9400", "job": "dcgm"}, 0.0, 15)
    h.add(b.build(15))
    r = tr.observe(h.view(15), 15)
    assert (GPUS_MISSING, "n1") not in derived(r.snapshot) and (GPUS_MISSING, "n2") in derived(r.snapshot)


def test_targets_sharing_an_instance_speak_for_their_own_node_only() -> None:
    tr = StructuralTracker(max_age_s=90)
    b = SnapshotBuilder()
    for n in ("n1", "n2"):
        for g in range(2):
            b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": n, "gpu": str(g), "instance": "sim:80", "node": n}, 50, 0)
    b.add("up", {"instance": "sim:80", "node": "n1", "job": "x"}, 1.0, 0)
    b.add("up", {"instance": "sim:80", "node": "n2", "job": "x"}, 1.0, 0)
    tr.observe(b.build(0), 0)
    b = SnapshotBuilder()
    b.add("up", {"instance": "sim:80", "node": "n1", "job": "x"}, 1.0, 200)
    b.add("up", {"instance": "sim:80", "node": "n2", "job": "x"}, 0.0, 200)  # n2's page is down
    for g in range(2):
        b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "n1", "gpu": str(g), "instance": "sim:80", "node": "n1"}, 50, 200)
    d = derived(tr.observe(b.build(200), 200).snapshot)
    assert d[(GPUS_MISSING, "n1")] == 0.0 and (GPUS_MISSING, "n2") not in d


def test_a_gpu_missing_from_the_page_just_read_is_missing_at_once() -> None:
    """Absence inside a fresh read is evidence: GPU 3 was on n1's page at 0 and is not on the page read at
    15, so n1 misses a GPU at 15 (its old samples are still fresh: before, only after the 90 s window).
    n2, read at another time (its own scrape offset), and n1's non-GPU series read later lose nothing."""
    for indexed in (True, False):
        tr = StructuralTracker(max_age_s=90)
        h = SignalHistory(default_policy())
        h.add(dcgm(0, {"n1": list(range(8))}))
        h.add(dcgm(7, {"n2": list(range(8))}))
        tr.observe(h.view(7), 7)
        h.add(dcgm(15, {"n1": [0, 1, 2, 4, 5, 6, 7]}))
        b = SnapshotBuilder()
        b.add("node_load1", {"Hostname": "n1", "instance": "n1:9100"}, 1.0, 18)
        h.add(b.build(18))
        v = h.view(18)
        if not indexed:
            v = Snapshot(v.at, v.metrics, v.labelsets, v.metric_ids, v.series_ids, v.values, v.ts)
        r = tr.observe(v, 18)
        d = derived(r.snapshot)
        assert d[(GPUS_MISSING, "n1")] == 1.0 and d[(GPUS_MISSING, "n2")] == 0.0, indexed
        assert r.gpus_now == {"n1": 7, "n2": 8}
        # the next page has it again: nothing missing
        h.add(dcgm(30, {"n1": list(range(8))}))
        assert derived(tr.observe(h.view(30), 30).snapshot)[(GPUS_MISSING, "n1")] == 0.0


def test_a_scrape_landing_between_two_metric_queries_misses_no_gpu() -> None:
    """A Prometheus source queries metric by metric, so a scrape can land between two queries: the
    metric read later has the newer time. With a metric only GPU 0 carries read after the scrape, the
    other seven GPUs' newest samples are older than their node's newest, yet none left the page (before
    the fix: gpus_missing 7, a hard gate on a healthy node). A GPU really gone still counts at once."""
    def read(tr: StructuralTracker, h: SignalHistory, at: float, temp_at: float, gpus: list[int],
             indexed: bool) -> tuple[float, dict[str, int]]:
        b = SnapshotBuilder()
        for g in gpus:
            b.add("DCGM_FI_DEV_GPU_TEMP", {"Hostname": "n1", "gpu": str(g)}, 50.0, temp_at)
        b.add("DCGM_FI_DEV_FB_USED", {"Hostname": "n1", "gpu": "0"}, 1.0, at)  # only GPU 0 reports it
        h.add(b.build(at))
        v = h.view(at + 1)
        if not indexed:
            v = Snapshot(v.at, v.metrics, v.labelsets, v.metric_ids, v.series_ids, v.values, v.ts)
        r = tr.observe(v, at + 1)
        return derived(r.snapshot)[(GPUS_MISSING, "n1")], r.gpus_now

    for indexed in (True, False):
        tr = StructuralTracker(max_age_s=90)
        h = SignalHistory(default_policy())
        assert read(tr, h, 0, 0, list(range(8)), indexed) == (0.0, {"n1": 8})
        # the temperatures queried before the scrape of 15 landed (their samples still those of 0), the
        # framebuffer after it
        assert read(tr, h, 15, 0, list(range(8)), indexed) == (0.0, {"n1": 8}), indexed
        # GPU 3 gone from the page read at 30: its temperature stops at 14, the others' reach 30
        assert read(tr, h, 30, 30, [0, 1, 2, 4, 5, 6, 7], indexed) == (1.0, {"n1": 7}), indexed


def test_the_trackers_memory_survives_a_restart() -> None:
    """``memory()`` (kept in the state store by the controller) and ``restore()``: a GPU removed while the
    controller was down is missing on the first read of the new tracker, without any capacity."""
    tr = StructuralTracker(max_age_s=90)
    h = SignalHistory(default_policy())
    h.add(dcgm(0, {"n1": list(range(8))}))
    tr.observe(h.view(0), 0)
    v0 = tr.memory_version
    mem = tr.memory()
    assert mem == {"n1": (8, [str(g) for g in range(8)])} and v0 > 0
    tr.observe(h.view(10), 10)
    assert tr.memory_version == v0  # nothing new learned: nothing to save
    fresh = StructuralTracker(max_age_s=90)
    fresh.restore(mem)
    h2 = SignalHistory(default_policy())
    h2.add(dcgm(500, {"n1": [0, 1, 2, 3, 5, 6, 7]}))
    r = fresh.observe(h2.view(500), 500)
    assert derived(r.snapshot)[(GPUS_MISSING, "n1")] == 1.0
    assert fresh.expected_gpus(r) == {"n1": [str(g) for g in range(8)]}
    fresh.forget("n1")
    r = fresh.observe(h2.view(510), 510)
    assert derived(r.snapshot)[(GPUS_MISSING, "n1")] == 0.0 and fresh.expected_gpus(r) == {}

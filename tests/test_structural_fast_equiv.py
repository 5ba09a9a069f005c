"""The structural tracker's pair-based fast path (distinct fresh (metric, series) pairs instead of fresh
rows, the newest scrape's rows first, the `up` answers remembered while the same targets say the same,
vectorised output) answers exactly as the session-9 tracker (tests/structural_reference.py) on the same
views: same derived samples (values and times, bit for bit), issues, source errors, reports and learned
memory, cycle by cycle, through dead exporters, GPUs falling off, future-skewed samples, slow scrapes and
targets shared between nodes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import structural_reference as ref
from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.structural import StructuralTracker
from structural_support import same_report

POL = default_policy()
NODES = ("a", "b", "c")


def _scrape(at: float, gpus: dict[str, set[int]], up: dict[str, float], skew: dict[str, float], slow: float,
            shared: bool) -> Snapshot:
    b = SnapshotBuilder()
    for node, gs in gpus.items():
        t = at + skew.get(node, 0.0)
        inst = "shared:9400" if shared and node != "c" else f"{node}:9400"
        for g in sorted(gs):
            lab = {"Hostname": node, "gpu": str(g), "UUID": f"GPU-{node}-{g}", "instance": inst}
            b.add("DCGM_FI_DEV_GPU_TEMP", lab, 50.0 + g, t)
            b.add("DCGM_FI_DEV_XID_ERRORS", lab, 0.0, t)
        if not gs:
            b.add("node_load1", {"instance": inst, "node": node}, 1.0, t)
    for node, v in up.items():
        inst = "shared:9400" if shared and node != "c" else f"{node}:9400"
        b.add("up", {"instance": inst, "job": "dcgm"}, v, at)
        b.add("scrape_duration_seconds", {"instance": inst, "job": "dcgm"}, slow, at)
    b.add("up", {"instance": "c-node:9100", "job": "node", "node": "c"}, up.get("c", 1.0), at)
    return b.build(at)


step = st.tuples(
    st.fixed_dictionaries({n: st.sets(st.integers(0, 3)) for n in NODES}),  # GPUs reporting
    st.dictionaries(st.sampled_from(NODES), st.sampled_from([0.0, 1.0, 1.0])),  # up per target
    st.dictionaries(st.sampled_from(NODES), st.sampled_from([0.0, -200.0, 60.0, 120.0]), max_size=1),  # clock skew
    st.sampled_from([0.02, 0.02, 12.0]),  # scrape duration
    st.booleans(),  # a and b behind one shared instance
    st.sampled_from([15.0, 15.0, 15.0, 60.0, 200.0]),  # seconds since the last scrape
    st.integers(1, 3),  # identical scrapes in a row (what the caches are for)
)


_same = same_report


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(step, min_size=1, max_size=10), capacity=st.booleans())
def test_fast_tracker_answers_as_the_reference_on_the_same_views(script: list, capacity: bool) -> None:
    h = SignalHistory(POL, memory_s=600.0)
    fast = StructuralTracker(max_age_s=90)
    plain = ref.StructuralTracker(max_age_s=90)
    cap = {"a": 4} if capacity else None
    t = 1_000.0
    for gpus, up, skew, slow, shared, dt, repeat in script:
        for _ in range(repeat):
            t += dt
            h.add(_scrape(t, gpus, up, skew, slow, shared))
            v = h.view(t)
            a, b = fast.observe(v, t, cap), plain.observe(v, t, cap)
            _same(a, b)
            assert fast.max_gpus == plain.max_gpus and fast.target_nodes == plain.target_nodes
            h.add(a.snapshot)  # fed back, as the controller does


def test_fast_tracker_on_an_empty_view_and_one_without_nodes() -> None:
    fast, plain = StructuralTracker(), ref.StructuralTracker()
    _same(fast.observe(Snapshot.empty(5.0), 5.0), plain.observe(Snapshot.empty(5.0), 5.0))
    b = SnapshotBuilder()
    b.add("up", {"instance": "x:1", "job": "j"}, 0.0, 5.0)
    b.add("some_metric", {"job": "j"}, 1.0, 5.0)
    v = b.build(5.0)
    _same(fast.observe(v, 5.0), plain.observe(v, 5.0))

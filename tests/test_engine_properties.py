"""Property tests for the scoring engine's core invariants (hypothesis)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.score.engine import score_snapshot
from fleethealth.signals.snapshot import SnapshotBuilder

NOW = 1_800_000_000.0
POL = default_policy()
N_NODES, N_GPUS = 3, 8
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

gpu_state = st.fixed_dictionaries({
    "temp": st.floats(20, 120),
    "clock": st.floats(1000, 2100),
    "xid": st.sampled_from([0, 0, 0, 13, 31, 63, 79, 48, 74, 92]),
    "pcie_inc": st.floats(0, 5000),
    "compute": st.floats(1.0, 3.0),
    "age": st.sampled_from([1.0, 10.0, 60.0, 200.0, 5000.0]),
    "present": st.lists(st.booleans(), min_size=5, max_size=5),
})
fleet_state = st.lists(gpu_state, min_size=N_NODES * N_GPUS, max_size=N_NODES * N_GPUS)


def build(states: list[dict], drop: tuple[int, int] | None = None):
    b = SnapshotBuilder()
    for i, s in enumerate(states):
        node, g = divmod(i, N_GPUS)
        lab = dict(gpu=str(g), Hostname=f"n{node}", modelName="H100", UUID=f"U{i}")
        t = NOW - s["age"]
        rows = [
            ("DCGM_FI_DEV_GPU_TEMP", s["temp"], t),
            ("DCGM_FI_DEV_SM_CLOCK", s["clock"], t),
            ("DCGM_FI_DEV_XID_ERRORS", s["xid"], t),
        ]
        for k, (m, v, ts) in enumerate(rows):
            if s["present"][k] and drop != (i, k):
                b.add(m, lab, v, ts)
        if s["present"][3] and drop != (i, 3):
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, 0, t - 60)
            b.add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lab, s["pcie_inc"], t)
        if s["present"][4] and drop != (i, 4):
            b.add("fleethealth_rank_compute_seconds",
                  dict(job="j", rank=str(i), node=f"n{node}", gpu=str(g), peer_group="p"), s["compute"], t)
    return b.build(NOW)


@SETTINGS
@given(fleet_state, st.sampled_from(["training", "serving", "remediation"]))
def test_values_and_confidence_in_range(states, consumer) -> None:
    fh = score_snapshot(build(states), POL, NOW, consumer=consumer)
    for t in fh:
        assert t.value is None or 0.0 <= t.value <= 1.0
        assert 0.0 <= t.confidence <= 1.0
        assert t.value is not None or t.reason == "no_fresh_data" or t.reason.startswith("missing:")
        assert t.value is None or t.reason != "no_fresh_data"
        for c in t.categories.values():
            assert c is None or 0.0 <= c <= 1.0


@SETTINGS
@given(fleet_state, st.integers(0, N_NODES * N_GPUS - 1),
       st.sampled_from(["temp", "pcie_inc", "compute", "clock"]), st.floats(0.0, 1000.0))
def test_worse_signal_never_raises_score(states, i, which, delta) -> None:
    before = score_snapshot(build(states), POL, NOW)
    worse = [dict(s) for s in states]
    if which == "clock":
        worse[i]["clock"] = worse[i]["clock"] - delta
    else:
        worse[i][which] = worse[i][which] + delta
    after = score_snapshot(build(worse), POL, NOW)
    node, g = divmod(i, N_GPUS)
    for ent in (f"n{node}/gpu{g}", f"n{node}"):
        tb, ta = before.get(ent), after.get(ent)
        if tb is None or ta is None:
            continue
        b, a = tb.value, ta.value
        if b is not None and a is not None:
            assert a <= b + 1e-9, (ent, b, a)


@SETTINGS
@given(fleet_state, st.integers(0, N_NODES * N_GPUS - 1), st.sampled_from([79, 48, 64, 95, 119]))
def test_gate_always_dominates(states, i, xid) -> None:
    st2 = [dict(s) for s in states]
    st2[i]["xid"] = xid
    st2[i]["age"] = 1.0
    st2[i]["present"] = [True, True, True, st2[i]["present"][3], st2[i]["present"][4]]
    fh = score_snapshot(build(st2), POL, NOW)
    node, g = divmod(i, N_GPUS)
    for ent in (f"n{node}/gpu{g}", f"n{node}"):
        t = fh.tuples[ent]
        assert t.value == 0.0 and t.reason.startswith("gate:")


@SETTINGS
@given(fleet_state, st.integers(0, N_NODES * N_GPUS - 1), st.integers(0, 4))
def test_removing_a_signal_never_raises_confidence(states, i, k) -> None:
    full = score_snapshot(build(states), POL, NOW)
    less = score_snapshot(build(states, drop=(i, k)), POL, NOW)
    node, g = divmod(i, N_GPUS)
    if less.get(f"n{node}/gpu{g}") is None:
        return  # the GPU vanished entirely: a structural signal (gpus_missing), tested elsewhere
    family = range(0, 4) if k < 4 else range(4, 5)  # DCGM fields, or the rank timing
    if not any(states[i]["present"][j] for j in family if j != k):
        # The entity's last signal of a family: in one snapshot that is indistinguishable from an entity
        # that never had that exporter. Over time the history remembers it (see the test below).
        return
    for ent in (f"n{node}/gpu{g}", f"n{node}"):
        a, b = full.get(ent), less.get(ent)
        if a is None or b is None:
            continue
        if a.reason.startswith("gate:") or b.reason.startswith("gate:"):
            continue  # a gate is certain evidence (confidence 1); removing it is covered above
        assert b.confidence <= a.confidence + 1e-9, (ent, a.confidence, b.confidence)


@SETTINGS
@given(fleet_state, st.integers(0, N_NODES * N_GPUS - 1), st.integers(0, 4))
def test_an_exporter_that_stops_never_raises_confidence(states, i, k) -> None:
    """Live, through the rolling history: a signal that stops arriving goes stale, and the entity's
    confidence does not rise, even when it was the last of its family."""
    from fleethealth.signals.history import SignalHistory

    fresh = [dict(s, age=1.0) for s in states]
    h = SignalHistory(POL)
    h.add(build(fresh))
    before = score_snapshot(h.view(NOW), POL, NOW)
    later = NOW + 120.0  # past the policy's freshness for the dropped signal

    def shifted(drop: tuple[int, int] | None) -> object:
        snap = build(fresh, drop=drop)
        snap.ts = snap.ts + 120.0
        snap.at = later
        return snap

    h.add(shifted((i, k)))  # type: ignore[arg-type]
    after = score_snapshot(h.view(later), POL, later)
    h2 = SignalHistory(POL)
    h2.add(build(fresh))
    h2.add(shifted(None))  # type: ignore[arg-type]
    same = score_snapshot(h2.view(later), POL, later)
    node, g = divmod(i, N_GPUS)
    for ent in (f"n{node}/gpu{g}", f"n{node}"):
        a, b = same.get(ent), after.get(ent)
        if a is None or b is None or before.get(ent) is None:
            continue
        if a.reason.startswith("gate:") or b.reason.startswith("gate:"):
            continue
        assert b.confidence <= a.confidence + 1e-9, (ent, a.confidence, b.confidence)

"""The fast simulator (one value buffer, counters as views of it, a plan of what no random draw enters,
stacked arithmetic) against the simulator as it was (tests/sim_reference.py): the same telemetry bit for
bit, through faults, drains, restarts, driver relabels, Xid rows appearing, deep copies and pickles."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.signals.snapshot import Snapshot
from fleethealth.sim import Scenario, load_plan, load_scenario
from fleethealth.sim.simulation import Simulation
from sim_reference import Simulation as Reference
from sim_support import small_scenario


def same(a: Snapshot, b: Snapshot) -> None:
    assert a.at == b.at
    for x, y in ((a.metric_ids, b.metric_ids), (a.series_ids, b.series_ids), (a.values, b.values), (a.ts, b.ts)):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert list(a.metrics) == list(b.metrics) and list(a.labelsets) == list(b.labelsets)
    assert a.source_errors == b.source_errors and a.issues == b.issues


def lockstep(scenario: Scenario, steps: int, actions: dict[int, list[tuple[str, str]]] | None = None) -> Simulation:
    """Step the reference and the fast simulator side by side, applying the same actions to both."""
    ref, fast = Reference(scenario), Simulation(scenario)
    for k in range(steps):
        same(ref.step(), fast.step())
        assert ref.events(ref.t) == fast.events(fast.t)
        for entity, action in (actions or {}).get(k, []):
            assert ref.apply_action(entity, action, ref.t) == fast.apply_action(entity, action, fast.t)
    assert ref.all_events == fast.all_events
    for node in (fast.fleet.nodes[0], fast.fleet.nodes[-1]):
        try:
            page = ref.render_node(node)
        except LookupError:
            with pytest.raises(LookupError):
                fast.render_node(node)
        else:
            assert fast.render_node(node) == page
    return fast


FAULTS: list[dict[str, Any]] = [
    {"kind": "thermal_drift", "target": "node-01", "onset": 60, "params": {"ramp_s": 600}},
    {"kind": "xid79_off_bus", "target": "node-02/gpu3", "onset": 120, "params": {"vanish_after_s": 60}},
    {"kind": "ecc_dbe_remap_failure", "target": "node-00/gpu1", "onset": 90},
    {"kind": "row_remap_pending", "target": "node-03/gpu0", "onset": 30},
    {"kind": "nvlink_errors", "target": "node-00", "onset": 150},
    {"kind": "pcie_replay_storm", "target": "node-03/gpu2", "onset": 45},
    {"kind": "xid13_bad_kernel", "target": "pool:train", "onset": 0, "end": 300, "params": {"per_node_per_hour": 60}},
    {"kind": "bad_driver_rollout", "target": "pool:serve", "onset": 60, "end": 400, "params": {"rollout_s": 120}},
    {"kind": "exporter_outage", "target": "node-02", "onset": 75, "end": 200},
    {"kind": "network_partition", "target": "rack:rack-01", "onset": 200, "end": 260},
    {"kind": "serving_build_regression", "target": "build:v2", "onset": 30, "end": 300},
    {"kind": "replica_slo_burn", "target": "replica:llama3-8b-000", "onset": 30},
    {"kind": "cuda_oom", "target": "replica:llama3-8b-001", "onset": 15, "params": {"class": "fragmentation"}},
    {"kind": "cuda_oom", "target": "replica:llama3-8b-002", "onset": 15, "params": {"class": "driver"}},
    {"kind": "stage_imbalance", "target": "job:job-a", "onset": 0, "params": {"stage_weights": [1.0, 1.1]}},
    {"kind": "seq_imbalance", "target": "job:job-a", "onset": 100, "params": {"sigma": 0.1}},
    {"kind": "replica_restart", "target": "replica:llama3-8b-003", "onset": 90, "params": {"gap_s": 30}},
]
ACTIONS = [("node-01", "drain"), ("node-01", "release"), ("node-04", "drain"), ("node-04", "release"),
           ("llama3-8b-000", "restart"), ("llama3-8b-001", "rebuild"), ("llama3-8b-002", "limit_concurrency"),
           ("llama3-8b-003", "reject_oversized"), ("llama3-8b-000", "drain"), ("llama3-8b-000", "release"),
           ("node-00/gpu1", "reset"), ("node-02", "repair"), ("node-05", "rollback")]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31), faults=st.lists(st.sampled_from(FAULTS), max_size=4, unique_by=repr),
       actions=st.dictionaries(st.integers(0, 29), st.lists(st.sampled_from(ACTIONS), max_size=2), max_size=4),
       default_fields=st.booleans())
def test_fast_simulator_emits_what_the_reference_emits(seed: int, faults: list[dict[str, Any]],
                                                       actions: dict[int, list[tuple[str, str]]],
                                                       default_fields: bool) -> None:
    sc = small_scenario(faults, seed=seed, duration="8m", dcgm_fields="default" if default_fields else "full")
    lockstep(sc, sc.n_steps, actions)


@pytest.mark.parametrize("pool", [
    {"name": "t", "nodes": 3, "jobs": [{"name": "a", "nodes": 2, "pp": 2, "seq_imbalance": 0.1},
                                       {"name": "b", "nodes": 1}]},
    {"name": "s", "nodes": 2, "workload": "serving", "serving": {"gpus_per_replica": 3}},
    {"name": "i", "nodes": 2, "workload": "idle"},
])
def test_single_workload_fleets_match_the_reference(pool: dict[str, Any]) -> None:
    sc = Scenario.model_validate({"name": "x", "seed": 3, "duration": "5m", "fleet": {"pools": [pool]}})
    lockstep(sc, sc.n_steps)


def test_a_shared_plan_gives_what_a_plan_per_step_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan made for many steps at once (the fast path) against one made per step (plain)."""
    sc = load_scenario("noise-only").with_overrides(duration=90 * 15.0)
    shared = [s.values.tobytes() for _, s in Simulation(sc).steps()]
    monkeypatch.setattr(load_plan, "PLAN_STEPS", 1)
    assert [s.values.tobytes() for _, s in Simulation(sc).steps()] == shared


@settings(max_examples=15, deadline=None)
@given(k0=st.integers(0, 40_000), n=st.integers(1, 70), i=st.integers(0, 69))
def test_plan_rows_do_not_depend_on_the_batch(k0: int, n: int, i: int) -> None:
    sim = _small_sim()
    i = min(i, n - 1)
    batch, single = load_plan.make_plan(sim, k0, n), load_plan.make_plan(sim, k0 + i, 1)
    for name in ("w_serve", "med", "lam2", "sqrt_lam2", "lam2_big", "lam", "cdf_rows", "kv"):
        assert getattr(batch, name)[i].tobytes() == getattr(single, name)[0].tobytes(), name


_SMALL: list[Simulation] = []


def _small_sim() -> Simulation:
    if not _SMALL:
        _SMALL.append(Simulation(small_scenario()))
    return _SMALL[0]


def test_copies_are_independent_worlds_that_continue_identically() -> None:
    """Counters are views of the value buffer; a deep copy (the backtest forks worlds) or a pickle must
    get its own buffer with the views bound into it."""
    sc = small_scenario([{"kind": "cuda_oom", "target": "replica:llama3-8b-000", "onset": 30}], duration="20m")
    sim = Simulation(sc)
    for _ in range(20):
        sim.step()
    twin = copy.deepcopy(sim)
    thawed = pickle.loads(pickle.dumps(sim))
    for other in (twin, thawed):
        assert other.energy.base is other._buf and other.ttft_b.base is other._buf
        assert other.success.base is other._buf and other.nvl.base is other._buf
    for _ in range(10):
        a, b, c = sim.step(), twin.step(), thawed.step()
        same(a, b)
        same(a, c)
    # an action in one world changes nothing in the other
    before = sim.replica_requests.copy()
    twin.apply_action("llama3-8b-000", "restart", twin.t)
    assert twin.replica_requests[0] == 0.0 and np.array_equal(sim.replica_requests, before)
    snap = twin.step()
    sim.step()
    mid = snap.metric_index()["fleethealth_replica_requests_total"]
    assert snap.values[snap.metric_ids == mid][0] < sim.last.values[sim.last.metric_ids == mid][0]  # type: ignore[union-attr]


def test_snapshots_handed_out_do_not_change_afterwards() -> None:
    sim = Simulation(small_scenario())
    first = sim.step()
    kept = first.values.copy()
    for _ in range(5):
        sim.step()
    sim.apply_action("node-00", "repair", sim.t)
    assert np.array_equal(first.values, kept)


def test_events_found_by_search_are_the_events_of_a_scan() -> None:
    sc = small_scenario([{"kind": "cuda_oom", "target": "replica:llama3-8b-000", "onset": 15,
                          "params": {"interval_s": 20}},
                         {"kind": "xid13_bad_kernel", "target": "pool:train", "onset": 0,
                          "params": {"per_node_per_hour": 120}}], duration="15m")
    sim = Simulation(sc)
    seen = 0
    for _ in range(sc.n_steps):
        sim.step()
        scan = [e for e in sim.all_events if sim.t - sim.step_s < e.ts <= sim.t]
        assert sim.events(sim.t) == scan
        assert sim.events(sim.t, since=sim.start) == [e for e in sim.all_events if sim.start < e.ts <= sim.t]
        seen += len(scan)
    assert seen > 0
    # an event logged out of order (a late report) is still found
    sim.add_event("cuda_oom", "llama3-8b-000", 4, sim.start + 40.0, {}, "late")
    assert [e.truth for e in sim.events(sim.start + 45.0, since=sim.start + 30.0)][-1] == "late"


def test_default_field_list_keeps_unexported_counters_running() -> None:
    """With dcgm-exporter's default fields the ECC/NVLink counters are not exported but still kept (and
    their random draws made), so switching the list on changes no other series."""
    full = Simulation(small_scenario(seed=9))
    dflt = Simulation(small_scenario(seed=9, dcgm_fields="default"))
    for _ in range(10):
        a, b = full.step(), dflt.step()
    names = {b.metrics[i] for i in np.unique(b.metric_ids)}
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in names
    assert len(b.values) == dflt.n_static + dflt.fleet.n_nodes
    temp = a.metric_index()["DCGM_FI_DEV_GPU_TEMP"]
    temp_b = b.metric_index()["DCGM_FI_DEV_GPU_TEMP"]
    assert np.array_equal(a.values[a.metric_ids == temp], b.values[b.metric_ids == temp_b])
    assert np.array_equal(full.sbe, dflt.sbe)


def test_bucket_bounds_are_written_as_prometheus_client_writes_them() -> None:
    from prometheus_client.utils import floatToGoString

    from fleethealth.sim.simulation import ITL, ITL_BUCKETS, TTFT, TTFT_BUCKETS, _le_strings

    assert _le_strings(TTFT) == tuple(floatToGoString(v) for v in TTFT_BUCKETS)
    assert _le_strings(ITL) == tuple(floatToGoString(v) for v in ITL_BUCKETS)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text("abc_", min_size=1, max_size=5), st.text(max_size=12), max_size=4))
def test_label_rendering_escapes_as_the_reference(labels: dict[str, str]) -> None:
    from fleethealth.sim.simulation import _render_labels
    from sim_reference import _render_labels as reference

    assert _render_labels(labels) == reference(labels)

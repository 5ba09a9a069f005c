"""Quiet steps drawn ahead (quiet_regime.draw_ahead): the same telemetry, bit for bit, as the simulator as it
was (tests/sim_reference.py) and as the plain step, through every built-in scenario (faults starting and
ending mid-way through a drawn block), actions, injections, deep copies and pickles taken mid-block, and the
rare preemption draw; plus the numpy property the draw-ahead rests on: one call for n + m values of a
distribution gives the numbers of two calls for n and then m."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.backtest.runner import compress
from fleethealth.sim import Scenario, load_plan, load_scenario, quiet_regime
from fleethealth.sim.faults import FAULT_CLASSES
from fleethealth.sim.scenario import builtin_names
from fleethealth.sim.simulation import Simulation
from sim_reference import Simulation as Reference
from sim_support import small_scenario
from test_sim_fastpath import lockstep, same


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet_regime, "DRAW_AHEAD", 0)


@pytest.mark.parametrize("name", builtin_names())
def test_every_builtin_scenario_matches_the_reference(name: str) -> None:
    """Faults start 5 minutes in and every 5 minutes after: drawn blocks are cut short by onsets and ends,
    and the draws consumed so far are replayed before the step that leaves the quiet regime."""
    sc = compress(load_scenario(name), lead_s=300.0, tail_s=600.0, gap_s=300.0)
    if (any(getattr(FAULT_CLASSES[f.kind], "adjusts_output", False) for f in sc.faults)
            or sc.fleet.pcie_link_fields or any(p.dcgm_fields for p in sc.fleet.pools)):
        pytest.skip("exporter faults (frozen values, clock skew) and exporter fields (PCIe link, per pool) change "
                    "what is served: the oracle predates them")
    sc = sc.with_overrides(duration=min(sc.duration, 2400.0))
    sim = lockstep(sc, sc.n_steps)
    assert sim.k == sc.n_steps - 1


def test_noise_only_crosses_plan_and_block_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 8, 16, 32, 64 steps, cut at the shared plan's end; also with a plan of 5 steps."""
    sc = load_scenario("noise-only").with_overrides(duration=150 * 15.0)
    ref = [s.values.tobytes() for _, s in Reference(sc).steps()]
    assert [s.values.tobytes() for _, s in Simulation(sc).steps()] == ref
    monkeypatch.setattr(load_plan, "PLAN_STEPS", 5)
    assert [s.values.tobytes() for _, s in Simulation(sc).steps()] == ref


ACTIONS = [("node-01", "drain"), ("node-01", "release"), ("llama3-8b-000", "restart"),
           ("llama3-8b-001", "rebuild"), ("llama3-8b-000", "drain"), ("llama3-8b-000", "release"),
           ("node-00/gpu1", "reset"), ("node-02", "repair")]
FAULTS: list[dict[str, Any]] = [
    {"kind": "xid79_off_bus", "target": "node-02/gpu3", "params": {"vanish_after_s": 30}},
    {"kind": "exporter_outage", "target": "node-02"},
    {"kind": "cuda_oom", "target": "replica:llama3-8b-001", "params": {"class": "fragmentation"}},
    {"kind": "thermal_drift", "target": "node-01", "params": {"ramp_s": 120}},
]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31), at=st.lists(st.integers(0, 59), min_size=1, max_size=4),
       actions=st.lists(st.sampled_from(ACTIONS), min_size=1, max_size=4),
       inject=st.one_of(st.none(), st.tuples(st.integers(0, 59), st.sampled_from(FAULTS), st.integers(0, 4))))
def test_actions_and_injections_mid_block_match_the_reference(
        seed: int, at: list[int], actions: list[tuple[str, str]],
        inject: tuple[int, dict[str, Any], int] | None) -> None:
    """Actions and injected faults (starting now or a few steps later, ending a minute after) at any step
    of a drawn block: a restart resets counters the drawn increments then add to; a drain, a fault leaves
    the quiet regime."""
    sc = small_scenario(seed=seed, duration="20m")
    ref, fast = Reference(sc), Simulation(sc)
    todo = dict(zip(at, actions, strict=False))
    for k in range(sc.n_steps):
        same(ref.step(), fast.step())
        if k in todo:
            entity, action = todo[k]
            assert ref.apply_action(entity, action, ref.t) == fast.apply_action(entity, action, fast.t)
        if inject is not None and inject[0] == k:
            spec = dict(inject[1], onset=15.0 * inject[2], end=15.0 * inject[2] + 60.0)
            ref.inject(spec)
            fast.inject(spec)
    assert ref.all_events == fast.all_events


@pytest.mark.parametrize("offset", [0, 1, 5, 7, 8, 20])
def test_copies_taken_mid_block_continue_identically(offset: int) -> None:
    """A deep copy (a backtest lane forking) or a pickle taken anywhere in a drawn block carries the
    block and the generator after it; each world then goes its own way (one leaves the regime)."""
    sc = small_scenario(duration="30m")
    ref, fast = Reference(sc), Simulation(sc)
    for _ in range(40 + offset):
        same(ref.step(), fast.step())
    assert fast._drawn is not None
    twin, thawed, ref_twin = copy.deepcopy(fast), pickle.loads(pickle.dumps(fast)), copy.deepcopy(ref)
    for other in (twin, thawed):
        assert other.energy.base is other._buf and other.ttft_b.base is other._buf
    twin.apply_action("node-01", "drain", twin.t)
    ref_twin.apply_action("node-01", "drain", ref_twin.t)
    for _ in range(30):
        a = ref.step()
        same(a, fast.step())
        same(a, thawed.step())
        same(ref_twin.step(), twin.step())


def test_rare_preemption_draw_in_a_drawn_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """KV-cache use planned near 0.9 (its base raised from 0.15 to 0.6): the preemption draw happens on
    some quiet steps and not on others, and the draw-ahead makes it where the plain step does."""
    monkeypatch.setattr(load_plan, "K0_15", np.array(0.6))
    sc = small_scenario(seed=11, duration="40m")
    fast = [s for _, s in Simulation(sc).steps()]
    mid = fast[0].metric_index()["vllm:kv_cache_usage_perc"]
    over = [bool((s.values[s.metric_ids == mid] > 0.9).any()) for s in fast]
    assert 0 < sum(over) < len(over)
    _plain(monkeypatch)
    plain = [s.values.tobytes() for _, s in Simulation(sc).steps()]
    assert plain == [s.values.tobytes() for s in fast]


def test_the_kv_bound_is_safe_for_numpys_normals() -> None:
    """KV_SAFE leans on |standard normal| < 14 (numpy's ziggurat tail is fed 53-bit uniforms)."""
    z = np.random.default_rng(3).standard_normal(2_000_000)
    assert np.abs(z).max() < 14.0
    assert quiet_regime.KV_SAFE + 0.02 * 14.0 < 0.9


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**63), n=st.integers(0, 300), m=st.integers(0, 300),
       lam=st.lists(st.floats(0.0, 60.0), min_size=1, max_size=40))
def test_one_call_draws_what_two_calls_draw(seed: int, n: int, m: int, lam: list[float]) -> None:
    """The draw-ahead merges consecutive normal draws and fills rows with out=: the stream is the same."""
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    whole = a.standard_normal(n + m)
    assert whole.tobytes() == np.concatenate([b.standard_normal(n), b.standard_normal(m)]).tobytes()
    out = np.empty(n)
    a.random(out=out)
    assert out.tobytes() == b.random(n).tobytes()
    rows = np.empty((2, m))
    a.standard_normal(out=rows[1])
    assert rows[1].tobytes() == b.standard_normal(m).tobytes()
    lam_a = np.asarray(lam)
    assert a.poisson(lam_a).tobytes() == b.poisson(lam_a).tobytes()
    assert a.bit_generator.state == b.bit_generator.state


def test_a_world_that_keeps_leaving_the_regime_draws_small_blocks() -> None:
    """After a replay the next block is short (a fault that flickers wastes few draws)."""
    sc = small_scenario(duration="30m")
    sim = Simulation(sc)
    for _ in range(10):
        sim.step()
    assert sim._drawn is not None
    sim.apply_action("node-01", "drain", sim.t)
    sim.step()
    assert sim._drawn is None and sim._ahead == quiet_regime.DRAW_FIRST
    sim.apply_action("node-01", "release", sim.t)
    sim.step()
    assert sim._drawn is not None and sim._drawn.n <= quiet_regime.DRAW_FIRST


def test_plain_and_drawn_paths_agree_on_a_default_field_fleet_with_imbalance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dcgm-exporter's default fields (some blocks computed but not exported) and a job with sequence-length
    imbalance (one more normal run per step)."""
    pool = {"name": "t", "nodes": 3, "jobs": [{"name": "a", "nodes": 2, "pp": 2, "seq_imbalance": 0.1},
                                              {"name": "b", "nodes": 1}]}
    sc = Scenario.model_validate({"name": "x", "seed": 4, "duration": "30m",
                                  "fleet": {"pools": [pool, {"name": "s", "nodes": 1, "workload": "serving"}],
                                            "dcgm_fields": "default"}})
    lockstep(sc, sc.n_steps)


@settings(max_examples=40, deadline=None)
@given(x=st.lists(st.floats(-30.0, 30.0), min_size=1, max_size=200), i=st.integers(0, 199))
def test_exp_gives_each_element_the_same_bits_in_any_array(x: list[float], i: int) -> None:
    """The draw-ahead takes the exponentials of many steps (and the plan the sines and logs of many steps)
    in one call; the plain step takes one step's."""
    arr = np.asarray(x)
    i = min(i, len(x) - 1)
    batch = np.exp(arr)
    assert batch[i:i + 1].tobytes() == np.exp(arr[i:i + 1].copy()).tobytes()
    assert np.exp(arr.reshape(1, -1))[0].tobytes() == batch.tobytes()


def test_sprinkles_that_hit_match_the_reference() -> None:
    """512 GPUs: a rare counter increment (PCIe replay, corrected bit, CRC flit) lands on 1 step in 20; the
    draw-ahead then steps the generator back over the three uniforms it drew for them, and puts back the
    half output a previous pick of GPUs left buffered (about 40 % of these 400 steps have one)."""
    sc = load_scenario("noise-only").with_overrides(duration=400 * 15.0)
    ref, fast = Reference(sc), Simulation(sc)
    halves = 0
    for _ in range(sc.n_steps):
        same(ref.step(), fast.step())
        halves += ref.rng.bit_generator.state["has_uint32"]
    assert halves > 50
    # leaving the regime (a drain) puts the generator where the reference's is
    ref.apply_action("node-00", "drain", ref.t)
    fast.apply_action("node-00", "drain", fast.t)
    same(ref.step(), fast.step())
    assert fast._drawn is None and fast.rng.bit_generator.state == ref.rng.bit_generator.state


def test_drawn_steps_after_an_xid_keep_its_counter_rows() -> None:
    """An Xid fault that ended leaves its DCGM_EXP_XID_ERRORS_COUNT rows: the quiet steps after it (drawn
    ahead again) emit them too."""
    sc = small_scenario([{"kind": "xid79_off_bus", "target": "node-02/gpu3", "onset": 30, "end": 90,
                          "params": {"vanish_after_s": 30}}], duration="20m")
    ref, fast = Reference(sc), Simulation(sc)
    drawn = 0
    for _ in range(sc.n_steps):
        same(ref.step(), fast.step())
        drawn += fast._drawn is not None and bool(fast.xid_counts)
    assert drawn > 40

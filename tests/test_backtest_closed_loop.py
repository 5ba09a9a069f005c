"""Closed loop: the backtest applies each arm's decisions to its own copy of the simulated world. The
World turns intents and transitions into simulator actions at the right times; an overload answered by a
concurrency limit stops raising OOMs and its replica is not quarantined once the hold expires; a reset
clears a pending remap; arms never see each other's actions. Real simulator, engine and DecisionLoop."""

from __future__ import annotations

from typing import Any

from fleethealth.backtest import evaluate, run_backtest
from fleethealth.backtest.events import World
from fleethealth.decide.model import Intent, IntentKind, State, Tier, Transition
from fleethealth.policy import default_policy
from fleethealth.sim import Simulation
from fleethealth.sim.scenario import Scenario
from sim_support import small_scenario


def intent(sim: Simulation, kind: IntentKind, entity: str, **params: Any) -> Intent:
    return Intent(sim.t, kind, entity, "test", params, Tier.INSTANCE)


def world(sim: Simulation, closed: bool = True) -> World:
    f = sim.fleet
    return World(None, {r.name: f.nodes[r.node] for r in f.replicas}, closed=closed, nodes=frozenset(f.nodes),
                 sim=sim)


def test_world_turns_decisions_into_actions_at_the_right_time() -> None:
    sim = Simulation(small_scenario([{"kind": "row_remap_pending", "target": "node-02/gpu2", "onset": 0}]))
    list(sim.steps(2))
    w = world(sim)
    rep = sim.fleet.replicas[0].name
    t0 = sim.t
    changed = w.react(
        [Transition(t0, "node-01", "node", State.READY, State.QUARANTINED, "gate:x", 0.0, 1.0, "v")],
        [intent(sim, IntentKind.LIMIT_CONCURRENCY, rep, max_concurrency=64),
         intent(sim, IntentKind.SCHEDULE_RESET, "node-02", when="next_safe_point"),
         intent(sim, IntentKind.PAGE, "pool/train"),  # about no entity of the world: nothing to do
         intent(sim, IntentKind.RUN_ACTIVE_TEST, "node-02")])
    assert changed
    w.apply_due(sim, t0 + 15)
    assert sim.node_out[sim.fleet.node_index("node-01")] and sim.rep_limited[0]
    assert sim.remap_pending.any()  # the reset waits for the next safe point
    w.apply_due(sim, t0 + w.reset_s)
    assert not sim.remap_pending.any()
    # the active test is judged when it is due, on the world as it is then: the reset fixed the node
    assert [(e.entity, e.passed) for e in w.due(t0 + w.test_s)] == [("node-02", True)]
    # back in service when the lifecycle releases it
    w.react([Transition(t0 + 900, "node-01", "node", State.QUARANTINED, State.RECOVERING, "t", 1.0, 1.0, "v")], [])
    w.apply_due(sim, t0 + 900)
    assert not sim.node_out.any()
    assert w.applied == 4


def test_a_rebuilt_worker_rejoins_unless_its_lifecycle_took_it_out() -> None:
    sim = Simulation(small_scenario())
    list(sim.steps(1))
    w = world(sim)
    a, b = sim.fleet.replicas[0].name, sim.fleet.replicas[1].name
    t0 = sim.t
    w.react([Transition(t0, b, "replica", State.READY, State.QUARANTINED, "slo", 0.1, 1.0, "v")],
            [intent(sim, IntentKind.DRAIN, a), intent(sim, IntentKind.REBUILD_WORKER, a),
             intent(sim, IntentKind.DRAIN, b), intent(sim, IntentKind.REBUILD_WORKER, b)])
    w.apply_due(sim, t0)
    assert sim.rep_out[0] and sim.rep_out[1]
    w.apply_due(sim, t0 + w.rebuild_s)
    assert not sim.rep_out[0] and sim.rep_out[1]


def test_open_loop_world_changes_nothing() -> None:
    sim = Simulation(small_scenario())
    list(sim.steps(1))
    w = world(sim, closed=False)
    assert not w.react([Transition(sim.t, "node-01", "node", State.READY, State.QUARANTINED, "g", 0.0, 1.0, "v")],
                       [intent(sim, IntentKind.LIMIT_CONCURRENCY, sim.fleet.replicas[0].name)])
    w.apply_due(sim, sim.t + 3600)
    assert not sim.node_out.any() and not sim.rep_limited.any()


OVERLOAD = """\
name: overload
seed: 11
duration: 2h
step: 15s
fleet:
  pools:
    - {name: train-a, nodes: 4, workload: training, jobs: [{name: pretrain, pp: 2, compute_s: 1.0}]}
    - name: serve-a
      nodes: 4
      workload: serving
      serving: {model: llama3-70b, gpus_per_replica: 4, builds: [v0.6.3]}
faults:
  - kind: cuda_oom
    target: replica:llama3-70b-003
    onset: 20m
    params: {class: batch_overload, count: 6, interval_s: 600}
  - {kind: row_remap_pending, target: node-01/gpu2, onset: 30m}
"""


def test_closed_loop_answers_the_overload_and_the_remap_open_loop_does_not() -> None:
    sc = Scenario.model_validate(__import__("yaml").safe_load(OVERLOAD))
    pol = default_policy()
    closed = run_backtest(sc, pol, ["static-rules"], cycle_s=60.0)
    res = evaluate(closed)
    ooms = [e for e in closed.sim_events if e.kind == "cuda_oom"]
    # the first OOM was answered with a concurrency limit: no more OOMs, and the replica was never
    # quarantined, though the decisions' overload hold expired long before the end
    assert len(ooms) == 1
    assert res["quarantines"] == 0 and res["false_quarantines"] == 0
    assert res["world_actions"] >= 2 and res["closed_loop"]
    inc = {r["fault"]: r for r in res["incidents"]}
    assert inc["cuda_oom:batch_overload"]["action_ok"] and inc["row_remap_pending"]["action_ok"]
    # the baseline drained node-01 at the Xid 63 in its own world; the product's world never saw that
    assert res["baselines"]["static-rules"]["quarantines"] >= 1 and closed.worlds == 2

    opened = run_backtest(sc, pol, [], cycle_s=60.0, closed_loop=False)
    ooms_open = [e for e in opened.sim_events if e.kind == "cuda_oom"]
    assert len(ooms_open) == 6  # nobody listened
    res_open = evaluate(opened)
    assert res_open["world_actions"] == 0
    # open loop the overload never ends, so the replica is quarantined once the hold expires
    assert {q["entity"] for q in res_open["false_quarantine_list"]} == {"llama3-70b-003"}

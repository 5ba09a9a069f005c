"""Fleet simulator and fault library: deterministic simulated telemetry with ground truth.

    sim = Simulation(load_scenario("node37-thermal-drift"))
    for t, snapshot in sim.steps():
        ...
    sim.ground_truth, sim.events(t), sim.active_test(node, t), sim.render_node(node)
    sim.apply_action("node-12", "drain", t)   # the world reacting to a decision (closed-loop backtest)
"""

from fleethealth.sim.scenario import (
    FaultSpec,
    Scenario,
    ScenarioError,
    builtin_names,
    load_scenario,
    parse_scenario,
)
from fleethealth.sim.simulation import Simulation
from fleethealth.sim.truth import GroundTruth, SimEvent

__all__ = [
    "FaultSpec", "GroundTruth", "Scenario", "ScenarioError", "SimEvent", "Simulation", "builtin_names",
    "load_scenario", "parse_scenario",
]

"""Ground-truth group names are not doubled (issue 16 item 8: `build:build:v0.7.0`)."""

from __future__ import annotations

from fleethealth.sim.scenario import load_scenario
from fleethealth.sim.simulation import Simulation


def test_a_build_regression_targeted_by_build_is_grouped_once() -> None:
    sim = Simulation(load_scenario("serving-build-regression"))
    assert sorted({g.group for g in sim.ground_truth if g.group}) == ["build:v0.7.0"]

"""The fleet view shows every budget a quarantine can spend (issue 16): the rate budget, the confirmed hard
gates' and physical evidence's own (``decide.safety``), each per kind and pool, counted as the decider counts
them. Before, only the rate budget was shown, so an SRE could not see that a rollout's gates had used up the
hard-gate budget or that a dead GPU's budget was spent."""

from __future__ import annotations

import re
from types import SimpleNamespace

from fleethealth.controller.loop import Published
from fleethealth.controller.view import render_fleet
from fleethealth.decide.model import State
from fleethealth.decide.state import DecisionState, EntityLifecycle
from fleethealth.policy import default_policy

NOW = 1_767_225_600.0


def test_the_fleet_view_shows_the_rate_hard_gate_and_physical_budgets() -> None:
    ents = {f"n{i:02d}": EntityLifecycle(f"n{i:02d}", "node", State.READY, NOW - 7200, labels={"pool": "train-a"})
            for i in range(16)}
    ledger = [(NOW - 600, "hard:node:train-a", "n00"), (NOW - 500, "hard:node:train-a", "n01"),
              (NOW - 400, "hard:node:train-a", "n02"), (NOW - 300, "physical:node:train-a", "n03"),
              (NOW - 5000, "node:train-a", "n04")]  # outside the hour: spent nothing now
    pub = Published(NOW, None, DecisionState(entities=ents, ledger=ledger), None, (), {}, (), ())
    controller = SimpleNamespace(published=pub, policy=default_policy())
    html = render_fleet(controller, now=NOW)
    pills = re.findall(r'<span class="pill ?(bad)?">([a-z -]*budget [^<]*)</span>', html)
    # max(1, 2% of 16) rate, max(3, 10%) hard-gate and physical quarantines an hour
    assert pills == [("", "budget node train-a: 1 left"), ("bad", "hard-gate budget node train-a: 0 left"),
                     ("", "physical budget node train-a: 2 left")]

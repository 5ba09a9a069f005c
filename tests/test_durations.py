"""Written durations in scenarios and policies (issue 16 item 8): compound forms, errors that name the
key, and fault onsets outside the run."""

from __future__ import annotations

import pytest

from fleethealth.durations import parse_duration
from fleethealth.policy import PolicyError, default_policy_text, parse_policy
from fleethealth.sim.scenario import ScenarioError, load_scenario, parse_scenario


@pytest.mark.parametrize(("text", "seconds"), [
    ("2h30m", 9000.0), ("1d12h", 129600.0), ("1m30s", 90.0), ("6h", 21600.0), (" 90 ", 90.0), ("1.5h", 5400.0),
    ("1w1d", 691200.0), (45, 45.0),
])
def test_compound_durations(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30m2h", "2h2h", "h", "2x", "", "-5m", True])
def test_not_durations(text) -> None:
    with pytest.raises(ValueError, match="2h30m"):
        parse_duration(text)


SCEN = """\
name: t
duration: {duration}
step: 15s
fleet:
  pools:
    - {{name: a, nodes: 4, workload: training}}
faults:
  - {{kind: xid79_off_bus, target: node-01, onset: {onset}}}
"""


def test_scenario_takes_compound_durations() -> None:
    sc = parse_scenario(SCEN.format(duration="2h30m", onset="1h15m"))
    assert sc.duration == 9000.0 and sc.faults[0].onset == 4500.0


def test_a_fault_after_the_end_of_the_run_is_an_error() -> None:
    with pytest.raises(ScenarioError, match="not inside the run"):
        parse_scenario(SCEN.format(duration="2h", onset="3h"))


def test_a_shortened_run_leaves_out_the_faults_it_no_longer_holds() -> None:
    sc = load_scenario("node37-thermal-drift")
    short = sc.with_overrides(duration="10m")
    assert short.duration == 600.0 and all(f.onset < 600.0 for f in short.faults)
    assert len(short.faults) < len(sc.faults)


def test_policy_durations_may_be_written() -> None:
    text = default_policy_text()
    text = text.replace("budgets:\n", "budgets:\n  window_s: 1h30m\n", 1)
    pol = parse_policy(text)
    assert pol.budgets.window_s == 5400.0
    with pytest.raises(PolicyError, match="window_s: expected a duration"):
        parse_policy(text.replace("window_s: 1h30m", "window_s: soon"))

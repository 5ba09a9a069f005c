"""Issue 16 item 8, checked end to end where the metric tests stop: precision reads n/a in the printed
table (null in JSON) when nothing was quarantined, a fault whose onset is the run's end is outside it, and
``--duration`` takes a compound duration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleethealth.cli.main import app
from fleethealth.sim.scenario import ScenarioError, parse_scenario

QUIET = """
name: quiet
seed: 3
duration: 20m
step: 15s
fleet:
  pools:
    - {name: a, nodes: 4, workload: training}
faults:
  - {kind: exporter_outage, target: node-01, onset: ONSET, end: 19m}
"""


def test_nothing_quarantined_prints_precision_as_n_a_and_json_null(tmp_path: Path) -> None:
    sc = tmp_path / "quiet.yaml"
    sc.write_text(QUIET.replace("ONSET", "5m"))  # missing data, not a fault: nothing to quarantine
    cli = CliRunner()
    r = cli.invoke(app, ["backtest", "-s", str(sc), "-b", "none", "--no-progress", "--duration", "0h20m"])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.strip()}
    assert rows["precision"] == ["n/a"] and rows["quarantines"] == ["0"] and rows["recall"] == ["1.000"]
    r = cli.invoke(app, ["backtest", "-s", str(sc), "-b", "none", "--no-progress", "--format", "json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["precision"] is None and res["quarantines"] == 0


def test_an_onset_at_the_end_of_the_run_is_outside_it() -> None:
    with pytest.raises(ScenarioError, match="not inside the run"):
        parse_scenario(QUIET.replace("ONSET", "20m").replace("end: 19m", "end: 21m"))
    sc = parse_scenario(QUIET.replace("ONSET", "18m45s"))  # before the end: inside
    assert sc.faults[0].onset == 1125.0

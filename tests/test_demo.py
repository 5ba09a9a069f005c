"""`fleethealth demo`: the scripted fleet through the full loop, short runs of it (plain and live views),
the injected-vs-detected table and the report path."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from fleethealth.backtest.demo import demo_scenario
from fleethealth.cli.main import app


def test_demo_scenario_is_a_few_hundred_gpus_of_training_and_serving() -> None:
    sc = demo_scenario()
    gpus = sum(p.nodes for p in sc.fleet.pools) * sc.fleet.gpus_per_node
    assert 200 <= gpus <= 512
    assert {p.workload for p in sc.fleet.pools} == {"training", "serving"}
    assert len({f.kind for f in sc.faults}) >= 6


def test_demo_plain_output_shows_decisions_and_injected_vs_detected(tmp_path: Path) -> None:
    rep = tmp_path / "demo.html"
    r = CliRunner().invoke(app, ["demo", "--duration", "30m", "--no-live", "--report", str(rep)])
    assert r.exit_code == 0, r.output
    out = r.stdout
    # the Xid 79 at 20 minutes: quarantined at once, with its reason code, and an intent issued
    assert re.search(r"0:1\d:\d\d node-03\s+READY -> QUARANTINED \(gate:", out), out
    assert "intent quarantine" in out
    assert "injected vs detected" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("xid79_off_bus"))
    assert "ok" in line
    assert f"report: {rep.resolve()}" in out and rep.exists()
    assert "<svg" in rep.read_text()


def test_demo_live_view_runs(tmp_path: Path) -> None:
    rep = tmp_path / "live.html"
    r = CliRunner().invoke(app, ["demo", "--duration", "10m", "--report", str(rep), "--cycle", "300"])
    assert r.exit_code == 0, r.output
    assert "fleethealth demo" in r.stdout and "report:" in r.stdout and rep.exists()


def test_demo_rejects_bad_options(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["demo", "--cycle", "0", "--report", str(tmp_path / "x.html")])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["demo", "--duration", "soon", "--report", str(tmp_path / "x.html")])
    assert r.exit_code == 2

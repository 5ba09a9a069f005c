"""`fleethealth backtest --decisions FILE`: the decision log as JSON lines, on the built-in xid79-off-bus
scenario compressed to one hour (two GPUs off the bus 15 minutes apart), run in-process through the
real CLI: every transition and intent with time, entity, reason and params, time-ordered, the arm named;
the same run writes the same bytes, whatever ``PYTHONHASHSEED``; the off-bus nodes are quarantined on their hard gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleethealth.cli.main import app

# the first fault 30 min in, the second 15 min later, 15 min tail: 1 h simulated
RUN = ["backtest", "-s", "xid79-off-bus", "--compress", "15m", "--no-progress", "--format", "json"]


def run(tmp: Path, name: str, *extra: str) -> tuple[dict[str, Any], Path]:
    out = tmp / name
    r = CliRunner().invoke(app, [*RUN, "--decisions", str(out), *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), out


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return run(tmp_path_factory.mktemp("dec"), "a.jsonl", "-b", "none")


def test_the_off_bus_nodes_are_quarantined_on_their_gate(product: tuple[dict[str, Any], Path]) -> None:
    result, path = product
    recs = read(path)
    assert result["simulated_s"] <= 3600
    q = [r for r in recs if r["record"] == "transition" and r["to"] == "QUARANTINED"]
    assert [(r["entity"], r["from"]) for r in q] == [("node-12", "READY"), ("node-55", "READY")]
    assert all(r["reason"].startswith("gate:") and r["kind"] == "node" for r in q)
    # 30 min in, and 15 min later, each on the first cycle that sees the fault (60 s cadence)
    assert [r["t_s"] for r in q] == pytest.approx([1800.0, 2700.0], abs=60.0)
    # the intent that carries it out, on the same node at the same time, names the same reason
    for t in q:
        acts = [r for r in recs if r["record"] == "intent" and r["entity"] == t["entity"]
                and r["intent"] == "quarantine"]
        assert acts and acts[0]["ts"] == t["ts"] and acts[0]["reason"] == t["reason"]
        assert isinstance(acts[0]["params"], dict) and "n" not in acts[0]["params"]
    assert result["decisions"] == str(path)


def test_every_record_is_a_timed_named_decision_in_time_order(product: tuple[dict[str, Any], Path]) -> None:
    recs = read(product[1])
    assert recs
    assert {r["arm"] for r in recs} == {"fleethealth"}
    assert {r["record"] for r in recs} == {"transition", "intent"}
    for r in recs:
        assert isinstance(r["t_s"], float) and isinstance(r["ts"], float) and r["entity"] and r["reason"]
        assert "policy_version" not in r  # two policies' logs diff line by line
    ts = [r["ts"] for r in recs]
    assert ts == sorted(ts)


def test_the_same_run_writes_the_same_bytes(product: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    _, again = run(tmp_path, "b.jsonl", "-b", "none")
    assert again.read_bytes() == product[1].read_bytes()


def test_the_same_bytes_whatever_the_hash_seed(tmp_path: Path) -> None:
    """Two processes, two string-hash seeds (set and dict orders differ): every arm's log the same bytes."""
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"h{seed}.jsonl"
        r = subprocess.run([sys.executable, "-c", "from fleethealth.cli.main import main; main()", *RUN,
                            "--decisions", str(out), "--decisions-arm", "all"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, check=False)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) > 100
    assert {json.loads(line)["arm"] for line in outs[0].splitlines()} == {
        "fleethealth", "static-rules", "liveness-only", "weighted-mean", "no-confidence"}


def test_all_arms_are_named_and_a_baseline_asked_for_is_run(tmp_path: Path) -> None:
    result, path = run(tmp_path, "rules.jsonl", "-b", "none", "--decisions-arm", "fleethealth,static-rules")
    assert "static-rules" in result["baselines"]
    recs = read(path)
    assert {r["arm"] for r in recs} == {"fleethealth", "static-rules"}
    keys = [(r["ts"], r["arm"] != "fleethealth") for r in recs]
    assert keys == sorted(keys)  # time first; at one time the product's decisions first
    assert any(r["arm"] == "static-rules" and r["entity"] == "node-12" for r in recs)


def test_an_unknown_arm_is_a_one_line_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, [*RUN, "--decisions", str(tmp_path / "x"), "--decisions-arm", "nope"])
    assert r.exit_code != 0 and "unknown arm 'nope'" in r.output


def test_an_arm_without_a_file_is_an_error_not_ignored() -> None:
    r = CliRunner().invoke(app, [*RUN, "--decisions-arm", "all"])
    assert r.exit_code != 0 and "give --decisions FILE too" in r.output

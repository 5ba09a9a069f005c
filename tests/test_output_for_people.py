"""What fleethealth says to a person when input is wrong or something is down: unknown enum values on the API
are 400s naming the valid values; /healthz names a dead source (and stays 200: restarting the controller
would not bring the source back); bad ports and binary policy files are one-line errors with exit 2, never
a traceback."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from fleethealth.cli.main import app
from fleethealth.controller.api import ApiServer
from prom_harness import free_port
from test_controller import make, run_for, sre_guard

runner = CliRunner()


def test_unknown_kinds_on_the_api_name_the_valid_ones_and_healthz_names_a_dead_source() -> None:
    ctl, src, clock = make()
    clock.t = time.time() - 50  # /healthz measures the last cycle's age on the wall clock
    srv = ApiServer(ctl, "127.0.0.1", free_port(), guard=sre_guard()).start()
    try:
        assert httpx.get(f"{srv.url}/healthz").json()["status"] == "no cycle yet"
        run_for(ctl, clock, 60)
        r = httpx.get(f"{srv.url}/api/v1/health", params={"kind": "nodes"})
        assert r.status_code == 400 and r.json()["detail"] == "unknown kind 'nodes': expected one of gpu, node, replica, rank"
        r = httpx.get(f"{srv.url}/api/v1/states", params={"kind": "gpu"})
        assert r.status_code == 400 and "expected node or replica" in r.json()["detail"]
        assert httpx.get(f"{srv.url}/api/v1/states", params={"kind": "node"}).status_code == 200
        h = httpx.get(f"{srv.url}/healthz")
        assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["sources_down"] == []
        src.down = True
        run_for(ctl, clock, 30)
        h = httpx.get(f"{srv.url}/healthz")
        body = h.json()
        assert h.status_code == 200 and body["ok"] is True  # the loop runs; the probe must not restart it
        assert body["sources_down"] == ["fleet"] and body["sources"]["fleet"]["up"] is False
        assert body["status"] == "degraded: source fleet down"
    finally:
        srv.stop()


def one_line_error(args: list[str], *needles: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (args, res.output)
    err = res.stderr.strip()
    assert "Traceback" not in res.output and len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)


def test_bad_ports_and_binary_files_are_one_line_errors(tmp_path: Path) -> None:
    one_line_error(["sim", "serve", "-s", "mixed", "--port", "99999"], "--port 99999", "0 to 65535")
    one_line_error(["sidecar", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:99999"],
                   "--listen", "0 to 65535")
    binary = tmp_path / "policy.yaml"
    binary.write_bytes(bytes(range(256)) * 8)
    one_line_error(["policy", "check", str(binary)], "binary data")
    one_line_error(["backtest", "-s", "nvlink-down", "--format", "yaml"], "--format")
    one_line_error(["get", "gpus", "--server", "http://127.0.0.1:9"], "unknown resource 'gpus'")
    one_line_error(["get", "nodes", "--server", "http://[::1"], "not a usable URL")
    one_line_error(["get", "nodes", "--server", "localhost:9108"], "expected a URL")
    from decide_support import scenario_rows, write_jsonl

    rec = tmp_path / "rec.jsonl"
    write_jsonl(str(rec), scenario_rows(minutes=3, xid_at=2, nodes=2))
    one_line_error(["score", "--kind", "gpus", str(rec)], "--kind 'gpus' is unknown", "node, gpu, replica, rank")
    one_line_error(["replay", str(rec), "--events", str(binary)], "binary data, not JSON lines")


def test_healthy_entities_print_no_worst_category_or_min_reason(tmp_path: Path) -> None:
    from decide_support import scenario_rows, write_jsonl

    rec = tmp_path / "rec.jsonl"
    write_jsonl(str(rec), scenario_rows(minutes=18, xid_at=12, nodes=8))
    res = runner.invoke(app, ["score", "--kind", "node", str(rec)])
    assert res.exit_code == 0, res.output
    rows = {ln.split("│")[1].strip().split()[0]: [c.strip() for c in ln.split("│")[1:-1]]
            for ln in res.stdout.splitlines() if ln.startswith("│")}
    assert rows["node-00"][4:6] == ["-", "healthy"]  # value 1.000: no "hardware", no "min:hardware"
    assert rows["node-03"][4:6] == ["thermal", "min:thermal"] and rows["node-07"][5] == "gate:xid"
    summary = next(ln for ln in res.stdout.splitlines() if ln.startswith("summary:"))
    assert summary == ("summary: 64 gpus (0 unknown, 2 below 0.7, mean confidence 1.00); "
                       "8 nodes (0 unknown, 2 below 0.7, mean confidence 1.00)")  # the whole fleet, in words
    tree = runner.invoke(app, ["explain", "node-01", str(rec)]).stdout
    assert "healthy" in tree.splitlines()[1] and "min:" not in tree and "<- worst" not in tree
    sick = runner.invoke(app, ["explain", "node-03", str(rec)]).stdout
    assert "reason min:thermal" in sick and "thermal: 0.000 <- worst" in sick

"""`fleethealth backtest` end to end on a small fleet: the real simulator, history, structural signals,
engine and DecisionLoop, with every baseline on the same telemetry; the JSON contract, the targets that
apply, where the baselines fail, and the HTML report (self-contained; rendered by headless Chromium when
it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from fleethealth.cli.main import app

SMALL = """\
name: small-mix
description: "10 nodes: a GPU off the bus, a dead exporter, a pending row remap"
seed: 5
duration: 45m
step: 15s
fleet:
  pools:
    - name: train-a
      nodes: 8
      workload: training
      jobs:
        - {name: pretrain, pp: 2, compute_s: 1.0}
    - name: serve-a
      nodes: 2
      workload: serving
      serving: {model: llama3-70b, gpus_per_replica: 4, builds: [v0.6.3]}
faults:
  - {kind: xid79_off_bus, target: node-02/gpu3, onset: 10m}
  - {kind: exporter_outage, target: node-05, onset: 20m, end: 30m}
  - {kind: row_remap_pending, target: node-06/gpu2, onset: 25m}
"""
KEYS = ("precision", "recall", "detection_s", "removal_s", "quarantines", "false_quarantines",
        "flaps_per_node_day", "pages")


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    d = tmp_path_factory.mktemp("bt")
    sc = d / "small.yaml"
    sc.write_text(SMALL)
    rep = d / "report.html"
    r = CliRunner().invoke(app, ["backtest", "--scenario", str(sc), "--format", "json", "--report", str(rep),
                                 "--cycle", "60"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), rep


def test_json_contract_for_product_and_every_baseline(outcome: tuple[dict[str, Any], Path]) -> None:
    res, _ = outcome
    for k in KEYS:
        assert k in res
    assert set(res["baselines"]) == {"static-rules", "liveness-only", "weighted-mean", "no-confidence"}
    for b in res["baselines"].values():
        for k in KEYS:
            assert k in b


def test_product_removes_the_hard_gate_within_two_scrapes_and_nothing_else(
        outcome: tuple[dict[str, Any], Path]) -> None:
    res, _ = outcome
    inc = {r["fault"]: r for r in res["incidents"]}
    assert inc["xid79_off_bus"]["action_ok"] and inc["xid79_off_bus"]["removal_s"] <= 2 * 15
    assert res["targets"]["hard_gate_removed<=2_scrapes"]
    # the pending remap gets a reset, not a quarantine; the dead exporter nothing
    assert inc["row_remap_pending"]["action_ok"]
    assert res["false_quarantines"] == 0 and res["quarantines"] == 1
    assert res["precision"] == 1.0 and res["recall"] == 1.0


def test_baselines_fail_where_the_product_does_not(outcome: tuple[dict[str, Any], Path]) -> None:
    res, _ = outcome
    static = res["baselines"]["static-rules"]
    # Xid 63 is not a repair: any-Xid-drains quarantines the node that only needs a reset
    assert any(q["entity"] == "node-06" and "reset" in q["why"] for q in static["false_quarantine_list"])
    live = res["baselines"]["liveness-only"]
    # a dead exporter looks like a dead node to a liveness probe
    assert any(q["entity"] == "node-05" for q in live["false_quarantine_list"])
    assert live["precision"] < 1.0


def test_report_is_self_contained_with_the_expected_parts(outcome: tuple[dict[str, Any], Path]) -> None:
    res, rep = outcome
    assert res["report"] == str(rep)
    text = rep.read_text()
    assert text.startswith("<!DOCTYPE html>")
    for needle in ("id='comparison'", "id='incidents'", "class=\"timeline\"", "class=\"heatmap\"", "node-02"):
        assert needle in text
    # nothing fetched: no scripts or stylesheets by URL, no URL but the SVG namespace
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", text)
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}
    for arm in ("fleethealth", "static-rules", "liveness-only", "weighted-mean", "no-confidence"):
        assert f">{arm}</td>" in text


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(outcome: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    _, rep = outcome
    exe = _chromium()
    assert exe is not None
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}"]
    png = tmp_path / "shot.png"
    subprocess.run(flags + [f"--screenshot={png}", "--window-size=1400,2000", rep.as_uri()], check=True,
                   capture_output=True, timeout=120)
    dom = subprocess.run(flags + ["--dump-dom", rep.as_uri()], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    assert "id=\"comparison\"" in dom and dom.count("<svg") >= 2 and "Backtest: small-mix" in dom
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1400, 2000)
    # not blank: a blank white page of this size is ~13 KB of PNG, the report ~200 KB; and the pixel
    # data must not be almost all one value (decompressed size vs compressed size)
    assert len(data) > 60_000
    idat = b"".join(data[i + 8:i + 8 + struct.unpack(">I", data[i:i + 4])[0]]
                    for i in _chunks(data) if data[i + 4:i + 8] == b"IDAT")
    assert len(zlib.decompress(idat)) / len(idat) < 100


def _chunks(data: bytes) -> list[int]:
    out, i = [], 8
    while i < len(data):
        out.append(i)
        i += 12 + struct.unpack(">I", data[i:i + 4])[0]
    return out


def test_table_output_and_errors(tmp_path: Path) -> None:
    sc = tmp_path / "tiny.yaml"
    sc.write_text(SMALL.replace("duration: 45m", "duration: 15m").replace("nodes: 8", "nodes: 6")
                  .replace("pp: 2", "pp: 1").replace("onset: 20m, end: 30m", "onset: 12m, end: 14m")
                  .replace("onset: 25m", "onset: 13m"))  # every onset inside the run
    cli = CliRunner()
    r = cli.invoke(app, ["backtest", "--scenario", str(sc), "--baseline", "none", "--cycle", "60"])
    assert r.exit_code == 0, r.output
    assert "precision" in r.stdout and "flaps_per_node_day" in r.stdout and "static-rules" not in r.stdout
    late = tmp_path / "late.yaml"  # a fault that begins after the run ends is an error, not a miss
    late.write_text(SMALL.replace("duration: 45m", "duration: 5m"))
    r = cli.invoke(app, ["backtest", "--scenario", str(late), "--baseline", "none"])
    assert r.exit_code == 2 and "not inside the run" in r.output
    r = cli.invoke(app, ["backtest", "--scenario", "no-such-scenario"])
    assert r.exit_code == 2 and "no scenario" in r.output
    r = cli.invoke(app, ["backtest", "--scenario", str(sc), "--baseline", "astrology"])
    assert r.exit_code == 2 and "unknown baseline" in r.output
    r = cli.invoke(app, ["backtest", "--scenario", str(sc), "--format", "xml"])
    assert r.exit_code == 2

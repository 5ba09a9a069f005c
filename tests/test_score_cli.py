"""`fleethealth score` / `explain` / `replay` on what a new user feeds them (issue 14, items 2 and 3):
a real vLLM v1 page, kernel-log-only nodes, junk, empty and binary files, refused URLs, a gzip bomb, and
recordings read with the recording's own clock. In process, through the real CLI."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from act_support import free_port
from decide_support import scenario_rows, write_jsonl
from fleethealth.bench.parse import dcgm_text
from fleethealth.sources.inputs import InputError, read_inputs_report

runner = CliRunner()
DATA = Path(__file__).parent / "data"
START = 1_767_000_000.0  # scenario_rows' first scrape; it scrapes every 15 s


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("rec") / "rec.jsonl"
    write_jsonl(str(p), scenario_rows(minutes=18, xid_at=12, nodes=8))
    return p


def _app():  # type: ignore[no-untyped-def]
    from fleethealth.cli.main import app

    return app


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_real_vllm_v1_page_is_an_entity_named_after_its_file(tmp_path: Path) -> None:
    # vLLM v1: model_name and engine labels, no pod, instance or replica; before, an empty table, exit 0
    page = DATA / "vllm-v1-metrics.prom"
    res = runner.invoke(_app(), ["score", str(page), "--format", "json"])
    assert res.exit_code == 0, res.output
    tuples = _json_lines(res.stdout)
    assert [(t["entity"], t["kind"]) for t in tuples] == [(str(page), "replica")]
    assert f'taken as instance="{page}"' in res.stderr and res.stderr.count("notice:") == 1
    # a page whose samples name their node gets nothing added
    named = tmp_path / "dcgm.prom"
    named.write_text(dcgm_text(8))
    res = runner.invoke(_app(), ["score", str(named), "--format", "json", "--kind", "node"])
    assert res.exit_code == 0 and "notice:" not in res.stderr
    assert [t["entity"] for t in _json_lines(res.stdout)] == ["node-00000"]


def test_kernel_log_only_nodes_appear_with_their_events(tmp_path: Path, recording: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("2025-12-29T09:30:00+00:00 node-99 kernel: [12345.678901] NVRM: Xid (PCI:0000:18:00): 79, "
                   "pid=1234, GPU has fallen off the bus.\n")
    res = runner.invoke(_app(), ["score", str(recording), "--kernel-log", str(log), "--format", "json"])
    assert res.exit_code == 0, res.output
    by = {t["entity"]: t for t in _json_lines(res.stdout)}
    assert by["node-99"]["reason"] == "gate:kernel_xid" and by["node-99"]["value"] == 0.0
    assert "xid:79" in by["node-99"]["flags"]
    assert by["node-99"]["worst_member"] == "node-99/gpu0000:18:00.0"


def test_a_kernel_log_alone_is_scored_as_of_its_newest_line(tmp_path: Path) -> None:
    """No exporter page to go with it: an Xid 79 logged long ago still reads as the gate it was then (not as
    stale data of an unknown GPU); nothing at all is a one-line error."""
    log = tmp_path / "kern.log"
    log.write_text("2025-12-29T09:30:00+00:00 node-7 kernel: [12345.678901] NVRM: Xid (PCI:0000:3b:00): 79, "
                   "pid=0, GPU has fallen off the bus.\n")
    res = runner.invoke(_app(), ["score", "--kernel-log", str(log), "--format", "json"])
    assert res.exit_code == 0, res.output
    by = {t["entity"]: t for t in _json_lines(res.stdout)}
    assert by["node-7"]["reason"] == "gate:kernel_xid" and by["node-7"]["value"] == 0.0
    assert by["node-7/gpu0000:3b:00.0"]["confidence"] == 1.0
    res = runner.invoke(_app(), ["score"])
    assert res.exit_code == 2 and "nothing to score" in res.output


@pytest.mark.parametrize("command", ["score", "explain", "replay"])
def test_inputs_without_a_sample_exit_2_with_one_line(tmp_path: Path, command: str) -> None:
    empty = tmp_path / "empty.prom"
    empty.write_bytes(b"")
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("shopping list\nmilk, eggs\n")
    (junk / "a.out").write_bytes(b"\x00\x01\x02garbage")
    refused = f"http://127.0.0.1:{free_port()}/metrics"
    cases = {
        str(empty): "empty",
        str(binary): "binary data",
        str(junk): "could not be read as samples",
        str(tmp_path / "empty-dir"): "",
    }
    (tmp_path / "empty-dir").mkdir()
    if command != "replay":
        cases[refused] = "Connection refused"
    for arg, why in cases.items():
        argv = [command, "node-1", arg] if command == "explain" else [command, arg]
        res = runner.invoke(_app(), argv)
        assert res.exit_code == 2, (arg, res.output)
        err = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and why in err[0] and "Traceback" not in res.output, (arg, res.output)
        assert res.stdout == ""  # never an empty table


def test_a_gzip_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    # 4 MB of gzip that would inflate to 4 GB: concatenated members, each 1 MiB of text
    member = gzip.compress(b"m 1\n" * (1 << 18), 9)
    bomb = tmp_path / "scrape.prom.gz"
    bomb.write_bytes(member * (4 * 1024 * 1024 // len(member)))
    assert 3.5e6 < bomb.stat().st_size <= 4.2e6
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="decompresses to more than the input limit of 16,000,000 bytes"):
            read_inputs_report([str(bomb)], 0.0, max_bytes=16_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64e6
    res = runner.invoke(_app(), ["score", str(bomb), "--max-input-mb", "16"])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and len(res.stderr.strip().splitlines()) == 1
    # the same limit for a recorded table
    table = tmp_path / "rec.csv.gz"
    table.write_bytes(gzip.compress(b"ts,metric,value\n" + b"1,m,1\n" * 4_000_000, 9))
    with pytest.raises(InputError, match="input limit"):
        read_inputs_report([str(table)], 0.0, max_bytes=1_000_000)


def test_a_recording_is_read_with_its_own_clock(recording: Path) -> None:
    last = START + 17 * 60 + 45  # the recording's last scrape
    res = runner.invoke(_app(), ["explain", "node-03", str(recording)])
    assert res.exit_code == 0, res.output
    assert "recording 2025-12-29T09:20:00Z .. 2025-12-29T09:37:45Z (17.8 min)" in res.stdout
    assert f"as of 2025-12-29T09:37:45Z ({last:.0f})" in res.stdout
    assert "unknown" not in res.stdout.split("\n")[1]  # the node's line has a value, not "unknown"
    d = json.loads(runner.invoke(_app(), ["explain", "node-03", str(recording), "--format", "json"]).stdout)
    assert d["scored_at"] == last and d["recording"] == {"from": START, "to": last}
    assert d["value"] is not None and d["reason"] == "min:thermal"  # node-03 overheats from minute 5
    # --at inside the recording: later samples are its future, not clock skew
    res = runner.invoke(_app(), ["score", str(recording), "--at", str(START + 120), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "clock skew" not in res.output
    assert "recorded sample(s) after the time scored" in res.stderr
    by = {t["entity"]: t for t in _json_lines(res.stdout)}
    assert by["node-03"]["value"] == 1.0  # minute 2: not hot yet


def test_the_readme_explain_example_shows_real_values(tmp_path: Path) -> None:
    # README: `fleethealth explain node-37 recording.parquet`; before, --at was now and every signal unknown
    rec = tmp_path / "recording.parquet"
    res = runner.invoke(_app(), ["sim", "run", "-s", "node37-thermal-drift", "--duration", "10m", "--out", str(rec)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(_app(), ["explain", "node-37", str(rec)])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "; recording " in out.splitlines()[0]
    head = out.splitlines()[1]
    assert head.startswith("node-37 (node) value ") and "value unknown" not in head
    gpu_lines = [line for line in out.splitlines() if "node-37/gpu" in line]
    assert len(gpu_lines) == 8 and not any(" unknown " in line for line in gpu_lines)
    assert "gpu_temp [ramp] raw=" in out and "age=0s" in out  # the last scrape is the time scored
    assert "clock skew" not in res.output


def test_a_gpu_missing_an_expected_signal_is_not_printed_healthy() -> None:
    # a dcgm-exporter page whose field list lacks DCGM_FI_DEV_PCIE_REPLAY_COUNTER (an expected signal):
    # every GPU is at 1.000 on what it has, at confidence 0.75. Printed 'healthy' it hid the gap.
    page = Path(__file__).parent / "data" / "gpu-without-pcie-replay.prom"
    r = CliRunner().invoke(_app(), ["score", str(page), "--kind", "gpu,node"], terminal_width=200)
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.output.splitlines() if "an-06" in ln]
    assert len(rows) == 9 and not any("healthy" in ln for ln in rows), r.output
    assert sum("incomplete: missing pcie_replay" in ln for ln in rows) == 8
    assert any("incomplete: confidence 0.75" in ln for ln in rows)

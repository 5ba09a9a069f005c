"""`fleethealth replay` end to end on recorded tables (JSON lines and Parquet), in process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from decide_support import scenario_rows, write_jsonl
from fleethealth.cli.main import app
from fleethealth.policy import default_policy_text

runner = CliRunner()


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("rec") / "rec.jsonl"
    write_jsonl(str(p), scenario_rows(minutes=18, xid_at=12, nodes=8))
    return p


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_json_output_one_object_per_line_then_a_summary(recording: Path) -> None:
    res = runner.invoke(app, ["replay", "--format", "json", str(recording)])
    assert res.exit_code == 0, res.output
    rows = _lines(res.stdout)
    summary = rows[-1]
    assert summary["type"] == "summary"
    trs = [r for r in rows if r["type"] == "transition"]
    ints = [r for r in rows if r["type"] == "intent"]
    for r in trs:
        assert {"ts", "entity", "from", "to", "reason", "value", "confidence", "policy_version"} <= set(r)
    for r in ints:
        assert {"ts", "entity", "intent", "reason", "params", "key"} <= set(r)
    assert [(r["entity"], r["to"]) for r in trs][:2] == [("node-03", "DEGRADED"), ("node-03", "QUARANTINED")]
    assert [r["ts"] for r in rows[:-1]] == sorted(r["ts"] for r in rows[:-1])  # recording's clock, in order
    # node-07's Xid 79 is confirmed dead hardware: its own budget, not held behind node-03's rate quarantine
    assert summary["cycles"] == 72 and summary["quarantined"] == ["node-03", "node-07"]
    assert "pool/default:budget_exhausted" not in summary["pages"]
    assert summary["states"]["QUARANTINED"] == 2
    assert summary["transitions"] == len(trs)


def test_table_output_and_parquet_recordings_give_the_same_decisions(recording: Path, tmp_path: Path) -> None:
    tables = pytest.importorskip("fleethealth.sources.tables")
    snap = tables.read_table(recording)
    pq = tmp_path / "rec.parquet"
    tables.write_table(snap, pq)
    a = runner.invoke(app, ["replay", "--format", "json", str(recording)])
    b = runner.invoke(app, ["replay", "--format", "json", str(pq)])
    strip = lambda out: [r for r in _lines(out) if r["type"] != "summary"]  # noqa: E731
    assert strip(a.stdout) == strip(b.stdout)
    t = runner.invoke(app, ["replay", str(pq)])
    assert t.exit_code == 0
    assert "READY -> DEGRADED" in t.stdout and "quarantine[node]" in t.stdout and "summary" in t.stdout


def test_events_file_drives_the_active_test_exit(recording: Path, tmp_path: Path) -> None:
    ev = tmp_path / "ev.jsonl"
    ev.write_text(json.dumps({"ts": 1767000000 + 660, "kind": "active_test", "entity": "node-03",
                              "passed": False}) + "\n")
    res = runner.invoke(app, ["replay", "--format", "json", "--events", str(ev), str(recording)])
    assert res.exit_code == 0, res.output
    trs = [(r["entity"], r["to"]) for r in _lines(res.stdout) if r["type"] == "transition"]
    assert ("node-03", "FAILED") in trs


def test_state_db_resume_repeats_nothing(recording: Path, tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    first = runner.invoke(app, ["replay", "--format", "json", "--state-db", str(db), str(recording)])
    again = runner.invoke(app, ["replay", "--format", "json", "--state-db", str(db), str(recording)])
    assert first.exit_code == 0 and again.exit_code == 0
    rows = _lines(again.stdout)
    assert [r["type"] for r in rows] == ["summary"]  # everything was already decided
    assert rows[0]["cycles"] == 0 and rows[0]["resumed_from"] == _lines(first.stdout)[-1]["to"]


def test_diagram_is_the_generated_mermaid() -> None:
    res = runner.invoke(app, ["replay", "--diagram"])
    assert res.exit_code == 0
    assert res.stdout.startswith("stateDiagram-v2") and "QUARANTINED --> RECOVERING" in res.stdout


def test_clear_errors_exit_2(tmp_path: Path, recording: Path) -> None:
    res = runner.invoke(app, ["replay", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "missing.jsonl" in res.output and "Traceback" not in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(default_policy_text().replace("quarantine_below: 0.3", "quarantine_below: 0.9"))
    res = runner.invoke(app, ["replay", "--policy", str(bad), str(recording)])
    assert res.exit_code == 2 and "quarantine_below" in res.output
    ev = tmp_path / "ev.jsonl"
    ev.write_text('{"ts": 1, "kind": "reboot", "entity": "x"}\n')
    res = runner.invoke(app, ["replay", "--events", str(ev), str(recording)])
    assert res.exit_code == 2 and "ev.jsonl:1" in res.output
    res = runner.invoke(app, ["replay", "--format", "yaml", str(recording)])
    assert res.exit_code == 2


def test_simulator_event_files_are_understood(recording: Path, tmp_path: Path) -> None:
    ev = tmp_path / "sim-events.jsonl"
    ev.write_text(json.dumps({"ts": 1767000100.0, "kind": "xid", "entity": "node-01/gpu0", "node": "node-01",
                              "context": {"xid": 13, "line": "NVRM: Xid (PCI:0000:18:00): 13, pid=0"}}) + "\n")
    res = runner.invoke(app, ["replay", "--format", "json", "--events", str(ev), str(recording)])
    assert res.exit_code == 0, res.output
    summary = _lines(res.stdout)[-1]
    assert summary["events"] == 0 and summary["events_skipped"] == {"xid": 1}


def test_exposition_files_and_directories_replay(tmp_path: Path) -> None:
    shared = next((p for p in (Path(__file__).resolve().parents[1].parent / "shared", Path("/work/shared")) if p.is_dir()),
                  Path("/work/shared"))  # shared/ beside the checkout, as CI lays it
    sample = shared / "data" / "exposition-samples" / "dcgm-exporter-readme.prom"
    if not sample.exists():
        pytest.skip(f"{sample} not present")
    d = tmp_path / "scrapes"
    d.mkdir()
    (d / "a.prom").write_bytes(sample.read_bytes())
    os.utime(d / "a.prom", (1767000000, 1767000000))
    res = runner.invoke(app, ["replay", "--format", "json", str(d)])
    assert res.exit_code == 0, res.output
    summary = _lines(res.stdout)[-1]
    assert summary["cycles"] == 1 and summary["from"] == 1767000000.0  # undated samples: the file's mtime


def test_filters_by_kind_entity_and_intent(recording: Path) -> None:
    def body(res) -> list[str]:  # type: ignore[no-untyped-def]
        assert res.exit_code == 0, res.output
        return res.stdout.split("\nsummary\n")[0].strip().splitlines()

    q = body(runner.invoke(app, ["replay", "--intent", "quarantine", str(recording)]))
    assert [(ln.split()[1], ln.split()[3]) for ln in q] == [("node-03", "quarantine[node]"), ("node-07", "quarantine[node]")]
    res = runner.invoke(app, ["replay", "--intent", "quarantine,no_new_work", "--entity", "node-0[7]", str(recording)])
    assert [ln.split()[3] for ln in body(res)] == ["no_new_work[node]", "quarantine[node]"]
    assert "shown                2 of 11 transitions and intents (filtered)" in res.stdout
    n7 = body(runner.invoke(app, ["replay", "--entity", "node-07", str(recording)]))
    assert n7 and all(ln.split()[1] == "node-07" for ln in n7) and "READY -> QUARANTINED" in n7[0]
    assert body(runner.invoke(app, ["replay", "--kind", "replica", str(recording)])) == []  # only nodes here
    js = _lines(runner.invoke(app, ["replay", "--format", "json", "--intent", "page", str(recording)]).stdout)
    assert [r["type"] for r in js] == ["summary"] and js[0]["shown"] == 0 and js[0]["of"] == 11
    for bad, word in ((["--kind", "gpus"], "node or replica"), (["--intent", "reboot"], "quarantine")):
        res = runner.invoke(app, ["replay", *bad, str(recording)])
        assert res.exit_code == 2 and "unknown" in res.stderr and word in res.stderr, res.output


def test_table_output_is_for_people(recording: Path) -> None:
    res = runner.invoke(app, ["replay", str(recording)])
    assert res.exit_code == 0
    for literal in ("{'", "['", "None", "True", "False"):
        assert literal not in res.stdout, literal
    summary = res.stdout.split("\nsummary\n")[1]
    assert "entities             8 nodes" in summary and "quarantined          node-03, node-07" in summary
    assert "states at the end    QUARANTINED 2, READY 6" in summary and "pages                none" in summary
    # a schedule_reset's list parameters read as words
    assert "requires=drained" in res.stdout and "trigger=xid:79" in res.stdout

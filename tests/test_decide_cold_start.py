"""QA finding 9: a cold history's first cycle (every counter seen once, every node unknown) does not
cordon the fleet with NO_NEW_WORK only to lift it a cycle later; a node that stays unknown is held once it
has been unknown for a staleness window, a node known before is held at once, and a gate in the first
scrape still quarantines at once."""

from __future__ import annotations

from decide_support import Run, tup
from fleethealth.decide.model import IntentKind, State


def _cold_then_known(t: float) -> list:
    return [tup(f"n{i:02d}", None, conf=0.2, reason="pending:pcie_replay") if t == 0 else tup(f"n{i:02d}", 0.97)
            for i in range(20)]


def test_first_cycle_of_a_cold_history_holds_no_node() -> None:
    r = Run()
    r.steps(0, 300, 60, _cold_then_known)
    assert not r.of(IntentKind.NO_NEW_WORK)
    assert not r.of(IntentKind.ALLOW_NEW_WORK)
    assert not r.of(IntentKind.FLEET_ALERT)


def test_a_node_that_never_becomes_known_is_held_after_max_age() -> None:
    r = Run()
    max_age = r.policy.freshness.max_age_s
    r.steps(0, 600, 15, lambda t: [tup("n00", None, conf=0.0)] + [tup(f"n{i:02d}", 0.97) for i in range(1, 20)])
    held = r.of(IntentKind.NO_NEW_WORK, "n00")
    assert len(held) == 1 and held[0].reason == "unknown"
    assert held[0].ts == max_age  # the first cycle at least one staleness window after first seen
    assert [i.entity for i in r.of(IntentKind.NO_NEW_WORK)] == ["n00"]


def test_a_node_known_before_is_held_at_once_when_unknown() -> None:
    r = Run()
    r.step(0, [tup("n1", 0.95)])
    r.step(15, [tup("n1", None, conf=0.0)])
    assert [(i.kind, i.ts) for i in r.intents] == [(IntentKind.NO_NEW_WORK, 15)]


def test_a_gate_in_the_first_scrape_quarantines_at_once() -> None:
    r = Run()
    r.step(0, [tup("n00", 0.0, reason="gate:xid")] + [tup(f"n{i:02d}", None, conf=0.2) for i in range(1, 20)])
    assert r.st("n00") == State.QUARANTINED
    assert r.of(IntentKind.QUARANTINE, "n00")
    assert [i.entity for i in r.of(IntentKind.NO_NEW_WORK)] == ["n00"]


def test_replay_of_a_cold_recording_holds_no_node_on_its_first_cycle_and_an_xid79_quarantines_at_once(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from decide_support import scenario_rows, write_jsonl
    from fleethealth.cli.main import app

    rec = tmp_path / "rec.jsonl"
    write_jsonl(str(rec), scenario_rows(minutes=5, xid_at=0, nodes=8))  # node-07's Xid 79 in the first scrape
    res = CliRunner().invoke(app, ["replay", "--format", "json", str(rec)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(ln) for ln in res.stdout.splitlines() if ln.strip()]
    ints = [r for r in rows if r["type"] == "intent"]
    first = min(r["ts"] for r in rows[:-1])
    assert not [r for r in ints if r["intent"] == "no_new_work" and r["reason"] == "unknown"]
    assert not [r for r in ints if r["intent"] == "allow_new_work"]  # nothing held, nothing to lift
    quarantine = [r for r in ints if r["intent"] == "quarantine"]
    assert [(r["entity"], r["ts"]) for r in quarantine] == [("node-07", first)]

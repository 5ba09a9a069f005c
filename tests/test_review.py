"""`fleethealth review`: incidents, outcomes and figures read back from a state store with known history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleethealth.cli.main import app
from fleethealth.decide.model import Intent, IntentKind, State, Transition
from fleethealth.decide.state import Decision, DecisionState, EntityLifecycle
from fleethealth.review.incidents import IncidentLabel, count_flaps, review
from fleethealth.store.sqlite import SqliteStore

S = State
T0 = 1_764_000_000.0


def tr(ts: float, e: str, a: State, b: State, reason: str, detail: str = "") -> Transition:
    return Transition(T0 + ts, e, "node", a, b, reason, 0.5, 0.9, "v1", detail or reason)


# node-a: a hardware gate, quarantined at once, passes its test after the reset: confirmed (the gate said so)
# node-b: slid on performance, quarantined, active test failed: confirmed
# node-c: slid on performance, quarantined, active test passed: cleared (a false quarantine)
# node-d: degraded then back to READY twice inside the hour: flaps, no quarantine
# node-e: quarantined at the end of the period: pending
HISTORY = [
    tr(100, "node-a", S.READY, S.QUARANTINED, "gate:xid:79", "hard_gate"),
    tr(400, "node-a", S.QUARANTINED, S.RECOVERING, "event:test_passed:dcgm", "test_passed"),
    tr(1300, "node-a", S.RECOVERING, S.READY, "ok", "recovering_ok dwell 900s"),
    tr(200, "node-b", S.READY, S.DEGRADED, "min:performance", "below_degraded dwell 300s"),
    tr(800, "node-b", S.DEGRADED, S.QUARANTINED, "min:performance", "below_quarantine dwell 600s"),
    tr(1000, "node-b", S.QUARANTINED, S.FAILED, "event:test_failed:dcgm", "test_failed"),
    tr(300, "node-c", S.READY, S.DEGRADED, "min:performance", "below_degraded dwell 300s"),
    tr(900, "node-c", S.DEGRADED, S.QUARANTINED, "min:performance", "below_quarantine dwell 600s"),
    tr(1200, "node-c", S.QUARANTINED, S.RECOVERING, "event:test_passed:dcgm", "test_passed"),
    tr(2100, "node-c", S.RECOVERING, S.READY, "ok", "recovering_ok dwell 900s"),
    tr(500, "node-d", S.READY, S.DEGRADED, "min:thermal", "below_degraded dwell 300s"),
    tr(1500, "node-d", S.DEGRADED, S.READY, "ok", "above_ready dwell 900s"),
    tr(2000, "node-d", S.READY, S.DEGRADED, "min:thermal", "below_degraded dwell 300s"),
    tr(3000, "node-d", S.DEGRADED, S.READY, "ok", "above_ready dwell 900s"),
    tr(3500, "node-e", S.READY, S.QUARANTINED, "gate:ecc", "hard_gate"),
]
PAGES = [Intent(T0 + 810, IntentKind.PAGE, "pool/a", "budget_exhausted", {"n": 1}),
         Intent(T0 + 1000, IntentKind.PAGE, "node-b", "active_test_failed", {"n": 2}),
         Intent(T0 + 900, IntentKind.NO_NEW_WORK, "node-c", "min:performance", {"n": 3}, soft=True)]
POOLS = {"node-a": "train", "node-b": "train", "node-c": "train", "node-d": "serve", "node-e": "serve"}


def make_store(path: Path) -> SqliteStore:
    store = SqliteStore(path)
    st = DecisionState(last_ts=T0 + 3600)
    for e, pool in POOLS.items():
        st.entities[e] = EntityLifecycle(e, "node", S.READY, T0, labels={"pool": pool})
    store.commit(Decision(st, sorted(HISTORY, key=lambda t: t.ts), PAGES, T0 + 3600))
    return store


def test_outcomes_precision_and_times(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.db")
    rv = review(store.transitions(), store.intents(), pools=POOLS)
    by = {i.entity: i for i in rv.incidents}
    assert [by[e].outcome for e in ("node-a", "node-b", "node-c", "node-d", "node-e")] == [
        "confirmed", "confirmed", "cleared", "not_quarantined", "pending"]
    assert rv.overall.quarantines == 4
    assert rv.overall.outcomes == {"confirmed": 2, "cleared": 1, "released": 0, "false": 0, "pending": 1}
    assert rv.overall.precision == pytest.approx(2 / 3)
    # detection: from leaving READY to the first isolation; repair: isolation to READY
    assert by["node-a"].detect_s == 0 and by["node-a"].repair_s == 1200
    assert by["node-b"].detect_s == 600 and by["node-b"].repair_s is None
    assert by["node-c"].detect_s == 600 and by["node-c"].repair_s == 1200
    assert rv.overall.detect_median_s == 300  # 0 (a), 600 (b), 600 (c), 0 (e)
    assert by["node-b"].path == ["READY", "DEGRADED", "QUARANTINED", "FAILED"]
    # node-d went DEGRADED -> READY -> DEGRADED -> READY inside the hour: 3 returns to the state just left
    assert rv.flaps_by_entity == {"node-d": 3} and rv.flaps == 3
    assert rv.pages == {"budget_exhausted": 1, "active_test_failed": 1}
    assert rv.budget_exhaustions == 2 and rv.soft_intents == 1
    assert rv.by_pool["train"].precision == pytest.approx(2 / 3)
    assert rv.by_pool["serve"].precision is None  # the only quarantine there is still pending: n/a
    assert set(rv.by_reason) == {"gate:xid", "gate:ecc", "min:performance", "min:thermal"}
    assert rv.by_reason["min:performance"].precision == pytest.approx(0.5)


def test_label_overrides_and_onset(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.db")
    key_c = f"node-c@{int(T0 + 300)}"
    labels = [IncidentLabel(key_c, "confirmed", "NVLink cable", "sre", T0 + 4000, onset=T0 + 0)]
    rv = review(store.transitions(), store.intents(), pools=POOLS, labels=labels)
    c = next(i for i in rv.incidents if i.entity == "node-c")
    assert c.outcome == "confirmed" and c.detect_s == 900  # measured from the labelled onset
    assert rv.overall.precision == 1.0


def test_period_bounds() -> None:
    rows = [t.to_dict() for t in HISTORY]
    rv = review(rows, [], since=T0 + 250, until=T0 + 2500)
    assert sorted(i.entity for i in rv.incidents) == ["node-c", "node-d", "node-d"]  # started inside
    assert len([i for i in rv.incidents if i.entity == "node-d"]) == 2
    d2 = [i for i in rv.incidents if i.entity == "node-d"][1]
    assert d2.end is None  # its return to READY at +3000 is after the period


def test_flap_window() -> None:
    rows = [t.to_dict() for t in HISTORY if t.entity == "node-d"]
    assert count_flaps(rows, 600) == {"node-d": 1}  # only READY -> DEGRADED at +2000 is within 10 min of +1500
    assert count_flaps(rows, 60) == {}


def test_cli_text_json_html_and_label(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    make_store(db).close()
    r = CliRunner().invoke(app, ["review", "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "live quarantine precision 67%" in r.output and "node-c@" in r.output
    r = CliRunner().invoke(app, ["review", "--db", str(db), "--format", "json", "--since", "-50m"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["since"] == T0 + 600 and [i["entity"] for i in d["incidents"]] == ["node-d", "node-e"]  # node-d again at +2000
    key = f"node-c@{int(T0 + 300)}"
    r = CliRunner().invoke(app, ["review-label", key, "--db", str(db), "--label", "false", "--cause", "noise",
                                 "--by", "alice"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["review", "--db", str(db), "--format", "json"])
    d = json.loads(r.output)
    c = next(i for i in d["incidents"] if i["entity"] == "node-c")
    assert c["outcome"] == "false" and c["label"]["by"] == "alice"
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["review", "--db", str(db), "--format", "html", "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "<script" not in page and 'name="viewport"' in page and "node-c@" in page


def test_cli_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["review", "--db", str(tmp_path / "missing.db")])
    assert r.exit_code == 2 and "no such state database" in r.output
    db = tmp_path / "s.db"
    make_store(db).close()
    r = CliRunner().invoke(app, ["review-label", "node-zz@1", "--db", str(db), "--label", "confirmed"])
    assert r.exit_code == 2 and "no transitions" in r.output
    r = CliRunner().invoke(app, ["review-label", "node-c@1", "--db", str(db), "--label", "maybe"])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["review", "--db", str(db), "--since", "yesterday"])
    assert r.exit_code == 2 and "expected unix seconds" in r.output


def test_labels_through_the_control_plane_are_authorised_audited_and_kept(tmp_path: Path) -> None:
    """POST /api/v1/incidents/label on a real loopback controller: 401 anonymous, 403 without the
    ``label`` verb, 202 with it; the label is in the store, with who, and `review` counts it."""
    import httpx

    from test_api_auth import ACKER, ADMIN, bearer, serve

    s, srv = serve(tmp_path)
    try:
        # give the store a history to label
        st = DecisionState(last_ts=T0 + 3600)
        for e, pool in POOLS.items():
            st.entities[e] = EntityLifecycle(e, "node", S.READY, T0, labels={"pool": pool})
        s.store.commit(Decision(st, sorted(HISTORY, key=lambda t: t.ts), PAGES, T0 + 3600))
        key = f"node-c@{int(T0 + 300)}"
        url = s.url + "/api/v1/incidents/label"
        body = {"key": key, "label": "confirmed", "cause": "NVLink cable"}
        assert httpx.post(url, json=body).status_code == 401
        r = httpx.post(url, json=body, headers=bearer(ACKER))
        assert r.status_code == 403, r.text
        r = httpx.post(url, json={**body, "label": "maybe"}, headers=bearer(ADMIN))
        assert r.status_code == 400 and "label" in r.text
        r = httpx.post(url, json=body, headers=bearer(ADMIN))
        assert r.status_code == 202, r.text
        [lab] = s.store.incident_labels()
        assert lab["key"] == key and lab["label"] == "confirmed" and lab["by"] == "alice"
        audit = s.store.audit_log() if hasattr(s.store, "audit_log") else []
        assert any(a.get("verb") == "label" and a.get("allowed") for a in audit), audit
        rv = review(s.store.transitions(), s.store.intents(),
                    labels=[IncidentLabel.from_dict(d) for d in s.store.incident_labels()])
        assert next(i for i in rv.incidents if i.entity == "node-c").outcome == "confirmed"
    finally:
        srv.stop()
        s.store.close()


def test_incident_updates_and_resolutions_are_not_new_pages() -> None:
    ints = [{"ts": T0, "intent": "page", "reason": "budget_exhausted", "params": {"state": "firing"}},
            {"ts": T0 + 1800, "intent": "page", "reason": "budget_exhausted", "params": {"state": "update"}},
            {"ts": T0 + 3600, "intent": "page", "reason": "budget_exhausted", "params": {"state": "resolved"}}]
    assert review([], ints).pages == {"budget_exhausted": 1}

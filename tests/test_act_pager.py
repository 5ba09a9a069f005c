"""Pages through a real Alertmanager (Debian's prometheus-alertmanager) to a webhook on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from act_support import (
    ALERTMANAGER,
    AlertmanagerServer,
    Webhook,
    alertmanager_with_webhook,
    free_port,
    wait_until,
)
from fleethealth.act.config import ActuationConfig
from fleethealth.act.ledger import Ledger
from fleethealth.act.pager import AlertmanagerPager, alert_for, page_kind
from fleethealth.act.runner import ActuationRunner
from fleethealth.decide.model import Intent, IntentKind

pytestmark = pytest.mark.skipif(ALERTMANAGER is None, reason="prometheus-alertmanager not installed "
                                "(scripts/install-deps installs it)")


@pytest.fixture(scope="module")
def am() -> Iterator[tuple[AlertmanagerServer, Webhook]]:
    with alertmanager_with_webhook() as pair:
        yield pair


@pytest.fixture(scope="module")
def am_hb() -> Iterator[tuple[AlertmanagerServer, Webhook]]:
    """An Alertmanager of its own for the heartbeat tests (their pages stay active a while)."""
    with alertmanager_with_webhook() as pair:
        yield pair


def test_page_kinds_and_alert_labels() -> None:
    fail = Intent(10.0, IntentKind.PAGE, "node-a", "gate:xid_79", {"severity": "page", "state": "FAILED", "n": 3})
    assert page_kind(fail) == "failed"
    a = alert_for(fail, 10.0, evidence_link="/var/lib/fh/evidence/node-a-10")
    assert a["labels"] == {"alertname": "FleetHealthEntityFailed", "entity": "node-a", "reason": "gate:xid_79",
                           "severity": "page", "source": "fleethealth"}
    assert a["annotations"]["evidence"] == "/var/lib/fh/evidence/node-a-10"
    assert a["annotations"]["intent_key"] == fail.key
    assert page_kind(Intent(0, IntentKind.PAGE, "pool/a", "budget_exhausted", {})) == "budget_exhausted"
    assert page_kind(Intent(0, IntentKind.PAGE, "tp_group/g1", "tp_group_limit", {})) == "budget_exhausted"
    assert page_kind(Intent(0, IntentKind.PAGE, "job/j", "app_xid:job", {"severity": "ticket"})) == "page"
    assert page_kind(Intent(0, IntentKind.PAGE, "version/build=b7", "version_correlation", {})) == "version_correlation"
    fleet = Intent(0, IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_low", {"state": "firing"})
    resolved = Intent(9, IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_restored", {"state": "resolved"})
    assert alert_for(fleet, 0)["labels"] == alert_for(resolved, 9)["labels"]  # same alert, so it resolves
    assert "endsAt" in alert_for(resolved, 9) and "endsAt" not in alert_for(fleet, 0)
    # A page that promises a resolution ends hold_s after it is *sent* (not after the intent's time: an
    # intent replayed from the outbox must not arrive already ended); a one-off page has no endsAt.
    assert alert_for(fleet, 500.0, hold_s=300.0)["endsAt"] == "1970-01-01T00:13:20.000000Z"
    assert "endsAt" not in alert_for(fail, 500.0, hold_s=300.0)
    assert alert_for(resolved, 500.0, hold_s=300.0)["endsAt"] == "1970-01-01T00:00:09.000000Z"


def _incident(ts: float, state: str, n: int, **extra: object) -> Intent:
    return Intent(ts, IntentKind.PAGE, "pool/pool-hb", "budget_exhausted",
                  {"severity": "page", "pool": "pool-hb", "state": state, "incident": "budget:node:pool-hb",
                   "n": n, **extra})


def _active(server: AlertmanagerServer, entity: str) -> list[dict[str, object]]:
    return [a for a in server.alerts() if a["labels"].get("entity") == entity]


def test_a_firing_page_stays_firing_until_its_incident_resolves(am_hb: tuple[AlertmanagerServer, Webhook],
                                                                 tmp_path: Path) -> None:
    """Real Alertmanager: a page sent once per incident would end at its endsAt (or, without one, at
    resolve_timeout); the pager's heartbeat keeps it firing well past that until the resolved page."""
    import time

    server, hook = am_hb
    hold_s = 2.0
    pager = AlertmanagerPager(server.url, heartbeat_s=0.4, hold_s=hold_s)
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE}))
    ledger = Ledger(tmp_path / "l.db")
    runner = ActuationRunner({IntentKind.PAGE: [pager]}, ledger, cfg)
    assert [r.status for r in runner.submit(_incident(100.0, "firing", 1))] == ["applied"]
    wait_until(lambda: len(_active(server, "pool/pool-hb")) == 1, 20, what="page active")
    first_end = _active(server, "pool/pool-hb")[0]["endsAt"]
    # Heartbeats (each controller cycle calls retry_due) for three times the hold: still one firing alert.
    t_end = time.monotonic() + 3 * hold_s
    ends = {first_end}
    while time.monotonic() < t_end:
        runner.retry_due()
        active = _active(server, "pool/pool-hb")
        assert len(active) == 1 and active[0]["status"]["state"] == "active"
        ends.add(active[0]["endsAt"])
        time.sleep(0.2)
    assert len(ends) > 3 and max(ends) > first_end  # endsAt moved on with each heartbeat
    assert pager.heartbeats_total >= 3 and not ledger.actions(status="retrying")  # no intents, no retries
    # One notification for the whole incident: heartbeats are deduplicated by label set.
    fired = [a for a in hook.alerts() if a["labels"].get("entity") == "pool/pool-hb"]
    assert {a["status"] for a in fired} == {"firing"}
    # The resolution ends it at once and stops its heartbeat.
    assert [r.status for r in runner.submit(_incident(200.0, "resolved", 2))] == ["applied"]
    wait_until(lambda: not _active(server, "pool/pool-hb"), 20, what="page resolved")
    wait_until(lambda: any(a["labels"].get("entity") == "pool/pool-hb" and a["status"] == "resolved"
                           for a in hook.alerts()), 20, what="resolved notification")
    assert pager.held == {}


def test_without_heartbeats_a_page_ends_at_its_bounded_endsat(am_hb: tuple[AlertmanagerServer, Webhook],
                                                             tmp_path: Path) -> None:
    """The bound: a controller that stops (no leader left) does not leave a page firing for ever."""
    server, _ = am_hb
    pager = AlertmanagerPager(server.url, heartbeat_s=0.5, hold_s=1.5)
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE}))
    runner = ActuationRunner({IntentKind.PAGE: [pager]}, Ledger(tmp_path / "l.db"), cfg)
    it = Intent(300.0, IntentKind.PAGE, "pool/pool-end", "budget_exhausted",
                {"pool": "pool-end", "state": "firing", "incident": "budget:node:pool-end", "n": 1})
    assert [r.status for r in runner.submit(it)] == ["applied"]
    wait_until(lambda: len(_active(server, "pool/pool-end")) == 1, 20, what="page active")
    wait_until(lambda: not _active(server, "pool/pool-end"), 30, what="page ended at its endsAt")


def test_a_new_pager_on_the_same_ledger_keeps_the_pages_firing(am_hb: tuple[AlertmanagerServer, Webhook],
                                                              tmp_path: Path) -> None:
    """After a restart or a failover the held pages come back from the ledger: the new leader's first
    heartbeat refreshes them at once; a page already resolved is not revived."""
    server, _ = am_hb
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE}))
    old = ActuationRunner({IntentKind.PAGE: [AlertmanagerPager(server.url, heartbeat_s=30, hold_s=60)]},
                          Ledger(tmp_path / "l.db"), cfg)
    kept = Intent(400.0, IntentKind.PAGE, "pool/pool-kept", "budget_exhausted",
                  {"pool": "pool-kept", "state": "firing", "incident": "budget:node:pool-kept", "n": 1})
    done = Intent(400.0, IntentKind.PAGE, "pool/pool-done", "budget_exhausted",
                  {"pool": "pool-done", "state": "firing", "incident": "budget:node:pool-done", "n": 2})
    closed = Intent(401.0, IntentKind.PAGE, "pool/pool-done", "budget_exhausted",
                    {"pool": "pool-done", "state": "resolved", "incident": "budget:node:pool-done", "n": 3})
    assert [r.status for r in old.submit_all([kept, done, closed])] == ["applied"] * 3
    wait_until(lambda: len(_active(server, "pool/pool-kept")) == 1 and not _active(server, "pool/pool-done"),
               20, what="one page firing, one resolved")
    before = _active(server, "pool/pool-kept")[0]["endsAt"]
    new_pager = AlertmanagerPager(server.url, heartbeat_s=30, hold_s=600)
    new = ActuationRunner({IntentKind.PAGE: [new_pager]}, Ledger(tmp_path / "l.db"), cfg)
    new.retry_due()  # the new leader's first cycle
    assert set(new_pager.held) == {tuple(sorted(alert_for(kept, 0)["labels"].items()))}
    wait_until(lambda: _active(server, "pool/pool-kept")[0]["endsAt"] > before, 20, what="refreshed endsAt")
    assert not _active(server, "pool/pool-done")


def test_pages_reach_the_webhook_deduplicated(am: tuple[AlertmanagerServer, Webhook], tmp_path: Path) -> None:
    server, hook = am
    links = {"node-b": str(tmp_path / "evidence" / "node-b-1")}
    pager = AlertmanagerPager(server.url, evidence_link=links.get)
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE, IntentKind.FLEET_ALERT}))
    runner = ActuationRunner({IntentKind.PAGE: [pager], IntentKind.FLEET_ALERT: [pager]},
                             Ledger(tmp_path / "l.db"), cfg)
    intents = [
        Intent(100.0, IntentKind.PAGE, "node-b", "gate:xid_79", {"severity": "page", "state": "FAILED", "n": 1}),
        Intent(100.0, IntentKind.PAGE, "pool/pool-a", "budget_exhausted", {"severity": "page", "n": 2}),
        Intent(100.0, IntentKind.PAGE, "version/driver_version=550.1", "version_correlation",
               {"severity": "ticket", "version_label": "driver_version", "version": "550.1", "n": 3}),
        Intent(100.0, IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_low", {"state": "firing", "n": 4}),
    ]
    res = runner.submit_all(intents + intents)  # the second copy is deduplicated by the ledger
    assert [r.status for r in res] == ["applied"] * 4 + ["duplicate"] * 4
    names = {"FleetHealthEntityFailed", "FleetHealthBudgetExhausted", "FleetHealthVersionCorrelation",
             "FleetHealthConfidenceDrop"}
    wait_until(lambda: names <= {a["labels"]["alertname"] for a in hook.alerts()}, 20, what="webhook delivery")
    got = {a["labels"]["alertname"]: a for a in hook.alerts()}
    failed = got["FleetHealthEntityFailed"]
    assert failed["labels"]["entity"] == "node-b" and failed["labels"]["reason"] == "gate:xid_79"
    assert failed["annotations"]["evidence"] == links["node-b"]
    assert got["FleetHealthVersionCorrelation"]["labels"]["version"] == "550.1"
    # Alertmanager itself holds one alert per label set.
    active = server.alerts()
    assert sorted(a["labels"]["alertname"] for a in active) == sorted(names)
    # The fleet alert resolves when the decisions layer says so.
    runner.submit(Intent(101.0, IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_restored",
                         {"state": "resolved", "n": 5}))
    wait_until(lambda: any(a["labels"]["alertname"] == "FleetHealthConfidenceDrop" and a["status"] == "resolved"
                           for a in hook.alerts()), 20, what="resolved fleet alert")


def test_unreachable_alertmanager_is_retried_and_recorded(tmp_path: Path) -> None:
    pager = AlertmanagerPager(f"http://127.0.0.1:{free_port()}", client=httpx.Client(timeout=1.0))
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE}), attempts_per_cycle=2,
                          backoff_initial_s=0.01)
    runner = ActuationRunner({IntentKind.PAGE: [pager]}, Ledger(tmp_path / "l.db"), cfg)
    it = Intent(1.0, IntentKind.PAGE, "node-z", "gate:xid_79", {"n": 1})
    [res] = runner.submit(it)
    assert res.status == "retrying" and "unreachable" in res.error
    assert len(runner.ledger.attempts(it.key)) == 2


def test_page_open_reads_the_decisions_state() -> None:
    from fleethealth.act.pager import page_open
    from fleethealth.decide.state import DecisionState

    st = DecisionState()
    inc = _incident(1.0, "firing", 1)
    assert page_open(st, inc) is False
    st.incidents["budget:node:pool-hb"] = {"entity": "pool/pool-hb"}
    assert page_open(st, inc) is True
    fleet = Intent(0, IntentKind.FLEET_ALERT, "fleet", "fleet_confidence_low", {"state": "firing"})
    assert page_open(st, fleet) is False
    st.frozen = True
    assert page_open(st, fleet) is True
    assert page_open(st, Intent(0, IntentKind.PAGE, "node-a", "gate:xid_79", {"state": "firing"})) is None


def test_a_page_whose_incident_is_gone_is_not_kept_firing(am_hb: tuple[AlertmanagerServer, Webhook],
                                                         tmp_path: Path) -> None:
    """An incident dropped without its resolved page (a restart that lost it): the pager stops refreshing
    the page and it ends at its bounded endsAt, instead of firing for ever."""
    import time

    from fleethealth.act.pager import page_open
    from fleethealth.decide.state import DecisionState

    server, _ = am_hb
    st = DecisionState()
    st.incidents["budget:node:pool-gone"] = {"entity": "pool/pool-gone"}
    pager = AlertmanagerPager(server.url, heartbeat_s=0.3, hold_s=1.5)
    pager.bind_open(lambda it: page_open(st, it))
    cfg = ActuationConfig(mode="enforce", enforce=frozenset({IntentKind.PAGE}))
    runner = ActuationRunner({IntentKind.PAGE: [pager]}, Ledger(tmp_path / "l.db"), cfg)
    it = Intent(500.0, IntentKind.PAGE, "pool/pool-gone", "budget_exhausted",
                {"pool": "pool-gone", "state": "firing", "incident": "budget:node:pool-gone", "n": 1})
    assert [r.status for r in runner.submit(it)] == ["applied"]
    time.sleep(0.4)
    runner.retry_due()
    assert len(pager.held) == 1 and pager.heartbeats_total == 1
    del st.incidents["budget:node:pool-gone"]
    runner.retry_due()
    assert pager.held == {}
    wait_until(lambda: not _active(server, "pool/pool-gone"), 30, what="page ended at its endsAt")

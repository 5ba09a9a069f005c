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

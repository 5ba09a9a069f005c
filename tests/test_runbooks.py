"""Every reason code family the shipped policy can produce, every intent kind, every page the pager sends
and every Prometheus alert has a runbook in docs/runbooks/ with its four sections, and pages carry the
runbook's URL."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleethealth.act.pager import ALERTNAMES, alert_for
from fleethealth.decide.model import Intent, IntentKind
from fleethealth.policy import default_policy
from fleethealth.runbooks import BASE_URL, intent_path, page_path, reason_path

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = ROOT / "docs" / "runbooks"
SECTIONS = ("**What it means.**", "**What fleethealth already did.**", "**What to check next.**", "**How to undo.**")


def reason_families() -> set[str]:
    p = default_policy()
    fams = {"no_fresh_data", "gate:oom_device_fault"}
    for s in p.signals:
        if not s.score:  # read-only (score: false): in no category, never a reason
            continue
        if s.shape in ("gate", "xid"):
            fams.add(f"gate:{s.name}")
        fams.add(f"min:{s.category}")
        fams.add(f"gmean:{s.category}")
    return fams


def check(path: str) -> None:
    f = RUNBOOKS / path
    assert f.is_file(), f"no runbook {path}"
    text = f.read_text()
    for s in SECTIONS:
        assert s in text, f"{path} lacks {s}"


def test_every_reason_family_has_a_runbook() -> None:
    fams = reason_families()
    assert {"gate:xid", "gate:ecc_dbe", "min:thermal", "gmean:serving"} <= fams
    for fam in sorted(fams):
        path = reason_path(fam)
        assert path is not None, fam
        check(path)
    assert reason_path("gate:xid:79") == "reasons/gate-xid.md"
    assert reason_path("below_degraded") is None


def test_every_intent_kind_has_a_runbook() -> None:
    for k in IntentKind:
        check(intent_path(str(k)))


def test_every_page_and_alert_has_a_runbook() -> None:
    for name in ALERTNAMES.values():
        check(page_path(name))
    rules = yaml.safe_load((ROOT / "deploy" / "monitoring" / "rules.yaml").read_text())
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 8
    for a in alerts:
        check(f"alerts/{a}.md")


def test_pages_link_their_runbook() -> None:
    i = Intent(ts=100.0, kind=IntentKind.PAGE, entity="node-07", reason="budget exhausted", policy_version="v1")
    a = alert_for(i, now=100.0)
    assert a["labels"]["alertname"] == "FleetHealthBudgetExhausted"
    assert a["annotations"]["runbook_url"] == BASE_URL + "pages/FleetHealthBudgetExhausted.md"
    assert (RUNBOOKS / "pages" / "FleetHealthBudgetExhausted.md").is_file()

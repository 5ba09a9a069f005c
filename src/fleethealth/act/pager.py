"""Pages to Alertmanager (API v2): exhausted budgets, FAILED entities, fleet-wide confidence drops and
version correlations. Alertmanager groups and deduplicates by label set; the runner's ledger keeps the
same intent from being posted twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from fleethealth.act.outcome import Outcome, is_retryable_status
from fleethealth.auth.redact import redact_text
from fleethealth.decide.model import Intent, IntentKind
from fleethealth.runbooks import BASE_URL, page_path

ALERTNAMES = {
    "budget_exhausted": "FleetHealthBudgetExhausted",
    "failed": "FleetHealthEntityFailed",
    "fleet_confidence": "FleetHealthConfidenceDrop",
    "version_correlation": "FleetHealthVersionCorrelation",
    "page": "FleetHealthPage",
}
SEVERITY = {"budget_exhausted": "critical", "failed": "critical", "fleet_confidence": "warning",
            "version_correlation": "warning", "page": "warning"}


def page_kind(intent: Intent) -> str:
    pk = intent.params.get("page_kind")
    if isinstance(pk, str) and pk in ALERTNAMES:
        return pk
    r = intent.reason.lower()
    if intent.kind == IntentKind.FLEET_ALERT or "confidence" in r or "telemetry" in r:
        return "fleet_confidence"
    if "budget" in r or r.startswith("tp_group_limit"):
        return "budget_exhausted"  # the quarantine budget, or one node per tensor-parallel group
    if "version" in r or intent.params.get("version_label"):
        return "version_correlation"
    if str(intent.params.get("state", "")).upper() == "FAILED" or "failed" in r:
        return "failed"
    return "page"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alert_for(intent: Intent, now: float, evidence_link: str | None = None,
              generator_url: str | None = None) -> dict[str, Any]:
    kind = page_kind(intent)
    p = intent.params
    # A fleet alert fires and resolves with different reasons; the label set must match for Alertmanager
    # to resolve the alert it fired, so the reason label is the kind there.
    reason = kind if kind == "fleet_confidence" else (intent.reason or kind)
    labels = {"alertname": ALERTNAMES[kind], "entity": intent.entity, "reason": reason,
              "severity": str(p.get("severity", SEVERITY[kind])), "source": "fleethealth"}
    for extra in ("version_label", "version", "pool", "tp_group", "kind"):
        if p.get(extra) is not None:
            labels[extra] = str(p[extra])
    summary = p.get("summary") or f"{ALERTNAMES[kind]}: {intent.entity} ({intent.reason})"
    ann = {"summary": str(summary), "intent_key": intent.key, "policy_version": intent.policy_version,
           "runbook_url": BASE_URL + page_path(ALERTNAMES[kind])}
    if p.get("description"):
        ann["description"] = str(p["description"])
    link = p.get("evidence") or evidence_link
    if link:
        ann["evidence"] = str(link)
    alert: dict[str, Any] = {"labels": labels, "annotations": ann, "startsAt": _iso(intent.ts or now)}
    if str(p.get("state", "")).lower() == "resolved":
        alert["endsAt"] = _iso(intent.ts or now)
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


class AlertmanagerPager:
    name = "alertmanager"
    kinds = frozenset({IntentKind.PAGE, IntentKind.FLEET_ALERT})

    def __init__(self, url: str, client: httpx.Client | None = None,
                 evidence_link: Callable[[str], str | None] | None = None, generator_url: str | None = None,
                 timeout_s: float = 5.0, clock: Callable[[], float] = time.time) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)
        self.evidence_link = evidence_link
        self.generator_url = generator_url
        self.clock = clock

    def bind_evidence(self, link: Callable[[str], str | None]) -> None:
        """The runner hands over the evidence collector's lookup (unless one was given explicitly)."""
        if self.evidence_link is None:
            self.evidence_link = link

    def apply(self, intent: Intent) -> Outcome:
        link = self.evidence_link(intent.entity) if self.evidence_link else None
        alert = alert_for(intent, self.clock(), link, self.generator_url)
        try:
            r = self.client.post(f"{self.url}/api/v2/alerts", json=[alert])
        except httpx.HTTPError as e:
            return Outcome.failure(f"alertmanager unreachable: {type(e).__name__}: {redact_text(str(e))}", retry=True)
        if r.status_code >= 300:
            return Outcome.failure(f"{r.status_code}: {r.text[:200]}", retry=is_retryable_status(r.status_code))
        return Outcome.success(alertname=alert["labels"]["alertname"], labels=alert["labels"])

"""Pages to Alertmanager (API v2): exhausted budgets, FAILED entities, fleet-wide confidence drops and
version correlations. Alertmanager groups and deduplicates by label set; the runner's ledger keeps the
same intent from being posted twice.

Theory of operation: keeping a page firing
- Alertmanager resolves an alert by itself when its ``endsAt`` passes, or, without ``endsAt``, after its
  ``resolve_timeout`` (5 min by default). The decisions layer sends a page once per incident (``firing``),
  updates at most every ``incident_update_s`` (30 min) and one ``resolved`` at the end, so a page sent
  once would resolve itself long before its incident does.
- So a page that promises a resolution (``state: firing`` or ``update``: an incident, the fleet confidence
  alert) carries a bounded ``endsAt`` (``hold_s`` after it is sent, 5 min by default) and the pager re-sends
  it as a *heartbeat* every ``heartbeat_s`` (1 min) while it is held: the same label set and annotations,
  only ``endsAt`` moves on. Alertmanager deduplicates by label set, so a heartbeat is no new notification;
  the ``resolved`` page with the same labels ends it at once and stops its heartbeat.
- A heartbeat is a delivery concern of this shell, not a decision: no new intent, no ledger entry, no
  new page or incident in the core. The runner calls ``heartbeat()`` once per cycle (``retry_due``), as
  leader only and behind the same fence as every other external write. Pages without a promised
  resolution (a FAILED entity, a one-off) keep Alertmanager's own timeout, as before.
- After a restart or a failover the held pages are rebuilt from the ledger's applied pages (``recall``,
  bound by the runner): the new leader's first heartbeat refreshes them, within ``hold_s`` of the old
  leader's last one when the take-over is shorter than ``hold_s - heartbeat_s``.
- ``endsAt`` is the pager's clock at sending plus ``hold_s``, never the intent's time: an intent replayed
  from the outbox long after it was decided must not arrive already ended.
- A held page whose condition the decisions state no longer has (``page_open``: its incident gone, the
  fleet no longer frozen) without a resolved page having been sent is not refreshed: it ends at its
  ``endsAt`` instead of firing for ever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from fleethealth.act.outcome import Outcome, is_retryable_status
from fleethealth.auth.redact import redact_text
from fleethealth.decide.model import Intent, IntentKind
from fleethealth.runbooks import BASE_URL, page_path

log = logging.getLogger("fleethealth.act.pager")

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


HELD_STATES = ("firing", "update")  # pages that promise a resolution: held firing until it comes
DEFAULT_HEARTBEAT_S = 60.0  # a fifth of Alertmanager's default resolve_timeout
DEFAULT_HOLD_S = 300.0  # endsAt this long after each send: four heartbeats may be missed


def holds(intent: Intent) -> bool:
    """Whether this page is kept firing (heartbeats) until a resolution with its labels."""
    return str(intent.params.get("state", "")).lower() in HELD_STATES


def resolves(intent: Intent) -> bool:
    return str(intent.params.get("state", "")).lower() == "resolved"


def alert_for(intent: Intent, now: float, evidence_link: str | None = None,
              generator_url: str | None = None, hold_s: float | None = None) -> dict[str, Any]:
    """The Alertmanager alert for a page; ``hold_s``: a held page's ``endsAt`` is ``now + hold_s``
    (``now``: when it is sent)."""
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
    if resolves(intent):
        alert["endsAt"] = _iso(intent.ts or now)
    elif hold_s is not None and holds(intent):
        alert["endsAt"] = _iso(now + hold_s)
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


def label_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Alertmanager's identity of an alert: its label set."""
    return tuple(sorted(labels.items()))


def page_open(state: Any, intent: Intent) -> bool | None:
    """Whether the decisions state still has the condition a held page is about (pure): an incident page
    while its incident is open, the fleet confidence alert while remediation is frozen; None when the
    state cannot tell (kept). A page whose condition is gone without its resolved page (an incident
    dropped after a restart) is then not kept firing for ever: it ends at its endsAt."""
    key = intent.params.get("incident")
    if isinstance(key, str) and key:
        return key in (getattr(state, "incidents", None) or {})
    if intent.kind == IntentKind.FLEET_ALERT:
        return bool(getattr(state, "frozen", False))
    return None


@dataclass
class _Held:
    alert: dict[str, Any]  # the last body sent, endsAt refreshed on each heartbeat
    sent: float  # when it was last sent (the pager's clock)
    intent: Intent  # the page it carries (for still_open)


class AlertmanagerPager:
    name = "alertmanager"
    kinds = frozenset({IntentKind.PAGE, IntentKind.FLEET_ALERT})

    def __init__(self, url: str, client: httpx.Client | None = None,
                 evidence_link: Callable[[str], str | None] | None = None, generator_url: str | None = None,
                 timeout_s: float = 5.0, clock: Callable[[], float] = time.time,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S, hold_s: float = DEFAULT_HOLD_S) -> None:
        if not 0 < heartbeat_s < hold_s:
            raise ValueError(f"heartbeat_s ({heartbeat_s}) must be positive and shorter than hold_s ({hold_s})")
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)
        self.evidence_link = evidence_link
        self.generator_url = generator_url
        self.clock = clock
        self.heartbeat_s = heartbeat_s
        self.hold_s = hold_s
        self.held: dict[tuple[tuple[str, str], ...], _Held] = {}
        self.recall: Callable[[], Iterable[Intent]] | None = None
        self.still_open: Callable[[Intent], bool | None] | None = None
        self._recalled = False
        self.heartbeats_total = 0
        self.heartbeat_failures_total = 0

    def bind_evidence(self, link: Callable[[str], str | None]) -> None:
        """The runner hands over the evidence collector's lookup (unless one was given explicitly)."""
        if self.evidence_link is None:
            self.evidence_link = link

    def bind_recall(self, recall: Callable[[], Iterable[Intent]]) -> None:
        """The runner hands over the pages this actuator applied (the ledger), oldest first, so a new
        process or a new leader knows which pages it must keep firing."""
        self.recall = recall
        self._recalled = False

    def bind_open(self, still_open: Callable[[Intent], bool | None]) -> None:
        """The controller hands over ``page_open`` on its live state: a held page whose condition is gone
        is no longer refreshed."""
        self.still_open = still_open

    def forget_held(self) -> None:
        """Leadership lost: the next leader holds the pages; rebuilt from the ledger if it comes back."""
        self.held.clear()
        self._recalled = False

    def apply(self, intent: Intent) -> Outcome:
        link = self.evidence_link(intent.entity) if self.evidence_link else None
        now = self.clock()
        alert = alert_for(intent, now, link, self.generator_url, hold_s=self.hold_s)
        out = self._post(alert)
        if out.ok:
            self._track(intent, alert, now)
            return Outcome.success(alertname=alert["labels"]["alertname"], labels=alert["labels"])
        return out

    def _post(self, alert: dict[str, Any]) -> Outcome:
        try:
            r = self.client.post(f"{self.url}/api/v2/alerts", json=[alert])
        except httpx.HTTPError as e:
            return Outcome.failure(f"alertmanager unreachable: {type(e).__name__}: {redact_text(str(e))}", retry=True)
        if r.status_code >= 300:
            return Outcome.failure(f"{r.status_code}: {r.text[:200]}", retry=is_retryable_status(r.status_code))
        return Outcome.success()

    def _track(self, intent: Intent, alert: dict[str, Any], now: float) -> None:
        key = label_key(alert["labels"])
        if resolves(intent):
            self.held.pop(key, None)
        elif holds(intent):
            self.held[key] = _Held(alert, now, intent)

    def _recall(self) -> None:
        if self._recalled or self.recall is None:
            return
        self._recalled = True
        start = self.clock() - self.heartbeat_s  # due at once: the old leader's last send is unknown
        for intent in self.recall():
            if holds(intent) or resolves(intent):
                link = intent.params.get("evidence")
                self._track(intent, alert_for(intent, start, str(link) if link else None, self.generator_url,
                                              hold_s=self.hold_s), start)

    def heartbeat(self, fenced: Callable[[], str | None] | None = None) -> list[Outcome]:
        """Re-send each held page whose last send is ``heartbeat_s`` old, with ``endsAt`` moved on; one
        POST for all of them. ``fenced``: asked when something is due; a reason means send nothing.
        Returns the outcome (empty when nothing was due or sent)."""
        self._recall()
        now = self.clock()
        if self.still_open is not None:
            for key, h in list(self.held.items()):
                if self.still_open(h.intent) is False:
                    del self.held[key]
                    log.warning("page %s %s: its condition is no longer open and no resolution was sent; "
                                "not refreshed, it ends at its endsAt", h.alert["labels"]["alertname"],
                                h.intent.entity)
        due = [h for h in self.held.values() if now - h.sent >= self.heartbeat_s]
        if not due or (fenced is not None and fenced() is not None):
            return []
        for h in due:
            h.alert = {**h.alert, "endsAt": _iso(now + self.hold_s)}
        try:
            r = self.client.post(f"{self.url}/api/v2/alerts", json=[h.alert for h in due])
            ok = r.status_code < 300
            err = "" if ok else f"{r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            ok, err = False, f"alertmanager unreachable: {type(e).__name__}: {redact_text(str(e))}"
        if not ok:  # tried again next cycle; the page holds until its endsAt meanwhile
            self.heartbeat_failures_total += 1
            log.warning("page heartbeat for %d alert(s) failed, next cycle tries again: %s", len(due), err)
            return [Outcome.failure(err, retry=True)]
        for h in due:
            h.sent = now
        self.heartbeats_total += 1
        return [Outcome.success(refreshed=len(due))]

"""The audit trail of operator actions on the API: who (the authenticated user), what (verb and its
detail), on what (``node/n1``, ``fleet``), when and from where (the TCP peer), allowed or refused.

Theory of operation: an allowed action is recorded in the state store *before* it is handed to the loop
or the runner; if the store cannot take the record, the action is refused (503) rather than done
unaudited. A refusal of an authenticated caller (403) is recorded too; refusals without a valid token (401)
are only counted (``fleethealth_api_refused_total``), so a flood of anonymous requests cannot fill the
database or the log. The sidecar uses the same auditor with a local append-only JSON Lines file
(``auth.audit_log``) as its store and Events on its own Pod. Each record is also a Kubernetes Event
(best effort, like the node actuator's events: the store is the record) on the entity's Node, or on the
controller's Lease for fleet-wide actions, so ``kubectl get events`` shows who acknowledged a node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fleethealth.auth.access import Principal

log = logging.getLogger("fleethealth.audit")


class AuditFailed(Exception):
    pass


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class Auditor:
    def __init__(self, store: Any = None, kube: Any = None, namespace: str = "fleethealth-system",
                 lease_name: str = "fleethealth-controller", clock: Callable[[], float] = time.time,
                 component: str = "fleethealth-controller") -> None:
        self.store = store  # anything with .audit(ts, actor, verb, target, remote, allowed, detail)
        self.kube = kube  # act.kube_api.Kube, for Events
        self.namespace = namespace
        self.lease_name = lease_name
        self.clock = clock
        self.component = component  # the Event's source: the controller, or the sidecar of a replica

    def record(self, who: Principal, verb: str, target: str, remote: str, allowed: bool,
               detail: dict[str, Any] | None = None) -> None:
        ts = self.clock()
        detail = dict(detail or {})
        log.info("audit: %s %s %s %s from %s%s", who.user, "did" if allowed else "was refused", verb, target,
                 remote, f" ({detail})" if detail else "")
        if self.store is not None and hasattr(self.store, "audit"):
            try:
                self.store.audit(ts, who.user, verb, target, remote, allowed, detail)
            except Exception as e:
                log.error("cannot record the audit entry for %s %s %s: %s", who.user, verb, target, e)
                if allowed:
                    raise AuditFailed(f"cannot record the audit entry: {e}") from None
        if self.kube is not None:
            self._event(ts, who, verb, target, remote, allowed, detail)

    def _event(self, ts: float, who: Principal, verb: str, target: str, remote: str, allowed: bool,
               detail: dict[str, Any]) -> None:
        from fleethealth.act.kube_api import KubeError

        kind, _, name = target.partition("/")
        ns = self.namespace
        if kind in ("node", "replica") and name:
            # a cluster-scoped object's events live in "default" (the API server's rule), as kubectl shows them
            obj = {"kind": "Node", "name": name.split("/", 1)[0], "apiVersion": "v1"}
            ns = "default"
            if kind == "replica":
                obj = {"kind": "Pod", "name": name, "namespace": self.namespace, "apiVersion": "v1"}
                ns = self.namespace
        else:
            obj = {"kind": "Lease", "name": self.lease_name, "namespace": self.namespace,
                   "apiVersion": "coordination.k8s.io/v1"}
        extra = ", ".join(f"{k}={v}" for k, v in sorted(detail.items()))
        msg = (f"{who.user} {'' if allowed else 'was refused '}{verb} {target} from {remote}"
               + (f" ({extra})" if extra else ""))
        now = _rfc3339(ts)
        ev = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "fleethealth-audit.", "namespace": ns,
                         "labels": {"fleethealth.io/audit": "true"}},
            "involvedObject": obj,
            "reason": "FleetHealthOperator" + verb.capitalize() + ("" if allowed else "Refused"),
            "message": msg[:1024], "type": "Normal" if allowed else "Warning",
            "source": {"component": self.component}, "firstTimestamp": now, "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.kube.create_event(ns, ev)
        except KubeError as e:  # best effort: the store has the record
            log.warning("cannot emit the audit event for %s %s: %s", verb, target, e)

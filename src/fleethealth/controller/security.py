"""The controller API's guard and auditor, assembled from the config (imperative shell).

Authorities, in order: the token file (``api.token_file``) when given, then the Kubernetes API
(TokenReview + SubjectAccessReview) when the config has a ``kubernetes`` section and ``api.kubernetes_auth``.
The auditor writes through its own connection to the state store (the loop's connection holds the cycle's
transaction; an audit record must not join or wait for it) and, with Kubernetes, emits Events in the
Lease's namespace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleethealth.auth.access import Authority, Guard, KubeAuthority, StaticTokens
from fleethealth.auth.audit import Auditor
from fleethealth.controller.config import ControllerConfig


@dataclass
class ApiSecurity:
    guard: Guard
    auditor: Auditor
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for c in reversed(self.closers):
            c()


def build_security(cfg: ControllerConfig, store: Any = None, kube_api: Any = None) -> ApiSecurity:
    """Raises TokenFileError (one line) for a bad token file. ``store``: the loop's store, used as is only
    when it is in memory; ``kube_api``: a KubeApi to use instead of one made from the config (tests)."""
    authorities: list[Authority] = []
    closers: list[Callable[[], None]] = []
    if cfg.api.token_file is not None:
        authorities.append(StaticTokens.load(cfg.api.token_file))
    kube = None
    if cfg.kubernetes is not None:
        from fleethealth.act.kube_api import Kube, OfficialKubeApi

        k = cfg.kubernetes
        if kube_api is None:
            kube_api = (OfficialKubeApi.from_host(k.host, k.token, k.verify_ssl) if k.host
                        else OfficialKubeApi.from_config(k.kubeconfig, k.context))
        if cfg.api.kubernetes_auth:
            authorities.append(KubeAuthority(kube_api, cfg.api.audiences))
        if cfg.api.audit_events:
            kube = Kube(kube_api)
    audit_store = None
    if cfg.state_db is not None:
        if cfg.state_db == ":memory:" and store is not None:
            audit_store = store
        else:
            from fleethealth.store import open_store

            audit_store = open_store(cfg.state_db)
            closers.append(audit_store.close)
    k8s = cfg.kubernetes
    auditor = Auditor(audit_store, kube, namespace=k8s.lease_namespace if k8s else "fleethealth-system",
                      lease_name=k8s.lease_name if k8s else "fleethealth-controller")
    return ApiSecurity(Guard(authorities, read=cfg.api.read), auditor, closers)

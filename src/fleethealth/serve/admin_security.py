"""Who may call the sidecar's ``/admin/*`` and the trail of what they did (imperative shell).

Theory of operation
- The same ``auth`` module as the controller's API: a ``Guard`` over authorities tried in order for the
  bearer token: the static admin token (``--admin-token-file`` / ``FLEETHEALTH_ADMIN_TOKEN``, user
  ``sidecar-admin-token``, every verb: what the pod's own preStop hook uses), a token file (user, token
  or its SHA-256, verbs), then the cluster: a ``TokenReview`` says who is behind the token and a
  ``SubjectAccessReview`` whether they may ``drain``/``undrain``/``get`` the resource ``replicas`` of the
  API group ``fleethealth.io`` named after this replica (its pod), so the cluster's RBAC decides
  (deploy/rbac.yaml's ``fleethealth-operator`` grants them; deploy/sidecar binds the sidecar's service
  account to ``tokenreviews`` and ``subjectaccessreviews`` create).
- 401 without a valid token, 403 without the permission, 503 when the Kubernetes API cannot answer (fail
  closed), each with one line. Reads (``/admin/state``, ``/admin/evidence``) follow ``admin_read``: open
  to loopback clients by default, a token with ``get`` from anywhere else.
- Every admin action is audited before it is done (``auth.audit.Auditor``): who, what, on which replica,
  when and from where, to a local append-only JSON Lines file (``auth.audit_log``; no file configured: the
  log only) and, when a Kubernetes API is there, as an Event on this replica's Pod. An action whose audit
  record cannot be written is refused (503), never done unaudited. 403s of a known caller are audited
  too; 401s are only counted, so anonymous floods fill neither disk nor events.
- The Kubernetes API: ``kube_host`` + ``kube_token`` when given, else the pod's in-cluster service account
  when the pod has one (``kubernetes: auto``) and something needs the API; ``off`` never uses it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleethealth.auth.access import Authority, Guard, KubeAuthority, StaticTokens
from fleethealth.auth.audit import Auditor
from fleethealth.serve.config import SidecarConfig

log = logging.getLogger("fleethealth.sidecar.admin")
STATIC_USER = "sidecar-admin-token"
IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclass
class AdminSecurity:
    guard: Guard
    auditor: Auditor
    closers: list[Callable[[], None]] = field(default_factory=list)


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(IN_CLUSTER_TOKEN)


def kube_api_for(config: SidecarConfig) -> Any:
    """The Kubernetes API the sidecar talks to, or None."""
    if config.kubernetes == "off":
        return None
    needed = config.admin_kubernetes_auth or config.audit_events
    if not needed:
        return None
    from fleethealth.act.kube_api import OfficialKubeApi

    if config.kube_host:
        return OfficialKubeApi.from_host(config.kube_host, config.kube_token, config.kube_verify_ssl)
    if in_cluster():
        return OfficialKubeApi.from_config()
    if config.admin_kubernetes_auth:
        raise ValueError("admin_kubernetes_auth needs a Kubernetes API: run in a pod with a service account "
                         "or give kube_host")
    return None


def build_admin_security(config: SidecarConfig, kube_api: Any = None) -> AdminSecurity:
    """Raises TokenFileError / AuditLogError / ValueError with one line (the CLI prints it)."""
    authorities: list[Authority] = []
    if config.admin_token:
        authorities.append(StaticTokens.single(STATIC_USER, config.admin_token))
    if config.admin_tokens_file is not None:
        authorities.append(StaticTokens.load(config.admin_tokens_file))
    api = kube_api if kube_api is not None else kube_api_for(config)
    if config.admin_kubernetes_auth:
        if api is None:
            raise ValueError("admin_kubernetes_auth needs a Kubernetes API (kubernetes: off)")
        authorities.append(KubeAuthority(api, config.admin_audiences))
    store = None
    if config.audit_log is not None:
        from fleethealth.auth.audit_log import JsonlAuditLog

        store = JsonlAuditLog(config.audit_log, config.audit_max_bytes, config.audit_keep)
    kube = None
    if api is not None and config.audit_events:
        from fleethealth.act.kube_api import Kube

        kube = Kube(api)
    auditor = Auditor(store, kube, namespace=config.namespace, component="fleethealth-sidecar")
    if not authorities:
        log.warning("no admin credential configured (admin token, token file or Kubernetes auth): "
                    "/admin/* refuses every call that needs a token")
    return AdminSecurity(Guard(authorities, read=config.admin_read), auditor)

"""Authentication, authorisation, audit and HTTP hardening shared by the controller and the sidecar:
``access`` (who may do what: token file, TokenReview, SubjectAccessReview), ``audit`` (the trail of
operator actions), ``http`` (request-body limits) and ``redact`` (secrets out of logs and served text)."""

from fleethealth.auth.access import ANONYMOUS, Denied, Guard, KubeAuthority, Principal, StaticTokens

__all__ = ["ANONYMOUS", "Denied", "Guard", "KubeAuthority", "Principal", "StaticTokens"]

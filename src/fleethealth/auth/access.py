"""Who may do what on the controller's API: bearer tokens checked against a static token file or the
Kubernetes API (TokenReview), permissions decided by the token file's verbs or by the cluster's RBAC
(SubjectAccessReview).

Theory of operation
- A request names a *permission*: a verb on a resource of the API group ``fleethealth.io``, with the entity
  as the resource name, e.g. ``ready`` on ``nodes/node-17``. So a cluster's RBAC (a Role with
  ``apiGroups: [fleethealth.io]``, ``resources: [nodes]``, ``verbs: [ack]``, optionally ``resourceNames``)
  decides who may acknowledge which node; the same verbs are listed per token in the token file.

  ====================  ======================  ==========================================================
  verb                  resource                what it allows
  ====================  ======================  ==========================================================
  ``ack``               ``nodes``/``replicas``  an acknowledgement that holds an entity QUARANTINED
  ``ready``             ``nodes``/``replicas``  an acknowledgement that returns an entity to READY
  ``report``            ``nodes``/``replicas``  active-test, reset and OOM results
  ``kill``, ``resume``  ``fleet``               the actuation kill switch
  ``get``               ``fleet``               read endpoints, where the config requires a token
  ``label``             ``incidents``           an operator's verdict on an incident (``review``)
  ``drain``             ``replicas``            the sidecar's ``/admin/drain`` of its replica (name: the pod)
  ``undrain``           ``replicas``            the sidecar's ``/admin/undrain``
  ``get``               ``replicas``            the sidecar's ``/admin/state`` and ``/admin/evidence``
  ====================  ======================  ==========================================================

- ``Guard.check`` returns the caller (a ``Principal``) or raises ``Denied`` with the HTTP status and one
  line: 401 without (valid) credentials, 403 without the permission, 503 when the Kubernetes API cannot
  answer (fail closed: nothing is done without a decision).
- Tokens from the file are compared in constant time (``hmac.compare_digest``); the file may hold a token's
  SHA-256 instead of the token. TokenReview and SubjectAccessReview answers are kept for ``cache_s`` (10 s)
  per instance, so a burst of requests costs one review; time is the injected clock.
- The pure parts (which verb an event needs, whether an entity name is acceptable) are plain functions.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

GROUP = "fleethealth.io"
VERBS = ("ack", "ready", "report", "kill", "resume", "get", "label", "drain", "undrain")
MAX_ENTITY_LEN = 512


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    groups: tuple[str, ...] = ()
    via: str = ""  # "token-file", "kubernetes", "anonymous"
    uid: str = ""
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)
    verbs: frozenset[str] = frozenset()  # token file only


ANONYMOUS = Principal("system:anonymous", ("system:unauthenticated",), "anonymous")


class Denied(Exception):
    """A refused request: ``status`` (401, 403, 503) and a one-line ``reason``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class AuthUnavailable(Exception):
    """The authority (the Kubernetes API) could not answer."""


class Authority(Protocol):
    name: str

    def authenticate(self, token: str) -> Principal | None: ...

    def authorize(self, who: Principal, verb: str, resource: str, name: str) -> tuple[bool, str]: ...


# -- pure rules ------------------------------------------------------------------------------------------
def event_verb(kind: str, to: str | None) -> str:
    """The verb an event posted to /api/v1/events needs."""
    if kind == "ack":
        return "ready" if (to or "").upper() == "READY" else "ack"
    return "report"


def entity_resource(entity_kind: str | None) -> str:
    return "replicas" if entity_kind == "replica" else "nodes"


def entity_problem(name: Any) -> str | None:
    """Why an entity name arriving at the API is refused (None: acceptable): not a string, empty, too long,
    or holding NUL, control or invisible format characters (log injection, look-alike names)."""
    if not isinstance(name, str):
        return "entity must be a string"
    if not name.strip():
        return "entity is empty"
    if len(name) > MAX_ENTITY_LEN:
        return f"entity is longer than {MAX_ENTITY_LEN} characters"
    for i, ch in enumerate(name):
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return f"entity contains a control character (U+{ord(ch):04X} at position {i})"
    return None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return host == "localhost"
    mapped = getattr(ip, "ipv4_mapped", None)  # a dual-stack socket shows 127.0.0.1 as ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def bearer_token(authorization: str | None) -> str | None:
    a = (authorization or "").strip()
    if a[:7].lower() != "bearer ":
        return None
    return a[7:].strip() or None


# -- static token file -----------------------------------------------------------------------------------
class _TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    user: str = Field(min_length=1)
    token: str | None = Field(default=None, min_length=16)
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")
    groups: list[str] = Field(default_factory=list)
    verbs: list[Literal["ack", "ready", "report", "kill", "resume", "get", "label", "drain", "undrain", "*"]]

    @model_validator(mode="after")
    def _one(self) -> _TokenEntry:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of 'token' or 'token_sha256'")
        return self


class _TokenFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tokens: list[_TokenEntry]


class TokenFileError(Exception):
    """A token file that cannot be used; the message names the key and the line."""


class StaticTokens:
    """A token file for setups without Kubernetes::

        tokens:
          - {user: alice, token_sha256: 9f86d0..., verbs: [ack, ready, report]}
          - {user: oncall-bot, token: "...at least 16 characters...", verbs: ["*"]}
    """

    name = "token-file"

    def __init__(self, entries: Sequence[_TokenEntry]) -> None:
        self._digests = [(bytes.fromhex(e.token_sha256) if e.token_sha256 else _sha(e.token or ""), e)
                         for e in entries]

    @classmethod
    def parse(cls, text: str, source: str = "<tokens>") -> StaticTokens:
        from fleethealth.policy import validate_yaml

        doc = validate_yaml(text, source, _TokenFile, TokenFileError, what="token file",
                            hint="a token file is a mapping with a 'tokens' list of {user, token|token_sha256, verbs}")
        return cls(doc.tokens)

    @classmethod
    def single(cls, user: str, token: str, verbs: Sequence[str] = ("*",)) -> StaticTokens:
        """One credential given directly (the sidecar's legacy ``--admin-token-file``: any length, all
        verbs), checked like a token file's entries."""
        return cls([_TokenEntry.model_construct(user=user, token=token, token_sha256=None, groups=[],
                                                verbs=list(verbs))])

    @classmethod
    def load(cls, path: str | Path) -> StaticTokens:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise TokenFileError(f"{p}: cannot read token file: {e.strerror or e}") from None
        return cls.parse(text, str(p))

    def authenticate(self, token: str) -> Principal | None:
        d = _sha(token)
        found = None
        for digest, e in self._digests:  # no early exit: the time does not tell which entry matched
            if hmac.compare_digest(digest, d):
                found = e
        if found is None:
            return None
        verbs = frozenset(VERBS) if "*" in found.verbs else frozenset(found.verbs)
        return Principal(found.user, tuple(found.groups), self.name, verbs=verbs)

    def authorize(self, who: Principal, verb: str, resource: str, name: str) -> tuple[bool, str]:
        if who.via == self.name and verb in who.verbs:
            return True, ""
        return False, f"the token file does not grant {who.user!r} the verb {verb!r}"


def _sha(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


# -- the guard --------------------------------------------------------------------------------------------
ReadMode = Literal["loopback", "open", "authenticated"]


class Guard:
    """Authentication and authorisation for one HTTP server. ``authorities`` are tried in order for the
    token (the token file first, then Kubernetes); the one that knew the token authorises the request.
    ``read``: ``loopback`` (default) lets loopback clients read without a token and asks others for one
    with the verb ``get``; ``open`` asks no one; ``authenticated`` asks everyone."""

    def __init__(self, authorities: Sequence[Authority] = (), read: ReadMode = "loopback") -> None:
        self.authorities = list(authorities)
        self.read = read

    @property
    def configured(self) -> bool:
        return bool(self.authorities)

    def read_open(self, peer: str | None) -> bool:
        return self.read == "open" or (self.read == "loopback" and is_loopback(peer))

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller behind the bearer token, or Denied(401) / Denied(503)."""
        token = bearer_token(authorization)
        if token is None:
            raise Denied(401, "authentication required: send 'Authorization: Bearer <token>'")
        if not self.authorities:
            raise Denied(401, "no authentication is configured on this controller (api.token_file or "
                              "kubernetes): it refuses every request that needs a token")
        for a in self.authorities:
            try:
                who = a.authenticate(token)
            except AuthUnavailable as e:
                raise Denied(503, f"cannot check the token: {e}") from None
            if who is not None:
                return who
        raise Denied(401, "the bearer token is not valid")

    def authorize(self, who: Principal, verb: str, resource: str = "fleet", name: str = "") -> None:
        """Nothing, or Denied(403) naming who, the verb and the resource / Denied(503)."""
        a = next((a for a in self.authorities if a.name == who.via), None)
        if a is None:
            raise Denied(403, f"{who.user} may not {verb} {resource}")
        try:
            ok, why = a.authorize(who, verb, resource, name)
        except AuthUnavailable as e:
            raise Denied(503, f"cannot check the permission: {e}") from None
        if not ok:
            what = f"{resource}/{name}" if name else resource
            raise Denied(403, f"{who.user} may not {verb} {what} ({GROUP}): {why}")

    def check(self, authorization: str | None, peer: str | None, verb: str, resource: str = "fleet",
              name: str = "") -> Principal:
        """Both steps (reads open to the peer under ``read`` need neither)."""
        if verb == "get" and self.read_open(peer):
            return ANONYMOUS
        who = self.authenticate(authorization)
        self.authorize(who, verb, resource, name)
        return who


# -- Kubernetes ---------------------------------------------------------------------------------------------
class KubeAuthority:
    """TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1) through a
    ``KubeApi``: the controller's service account needs ``create`` on both (deploy/rbac.yaml)."""

    name = "kubernetes"

    def __init__(self, api: Any, audiences: Sequence[str] = (), cache_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, max_cached: int = 4096) -> None:
        self.api = api
        self.audiences = list(audiences)
        self.cache_s = cache_s
        self.clock = clock
        self.max_cached = max_cached
        self._tokens: dict[bytes, tuple[float, Principal | None]] = {}
        self._perms: dict[tuple[str, tuple[str, ...], str, str, str], tuple[float, bool, str]] = {}

    def _trim(self, d: dict[Any, Any], now: float) -> None:
        if len(d) >= self.max_cached:
            for k in [k for k, v in d.items() if v[0] <= now] or list(d)[: len(d) // 2]:
                d.pop(k, None)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        from fleethealth.act.kube_api import KubeError

        try:
            return self.api.request("POST", path, body)
        except KubeError as e:
            raise AuthUnavailable(f"the Kubernetes API answered {e.status} {e.reason}".strip()) from None

    def authenticate(self, token: str) -> Principal | None:
        now = self.clock()
        key = _sha(token)
        hit = self._tokens.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        st = self._post("/apis/authentication.k8s.io/v1/tokenreviews",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
                        ).get("status") or {}
        who = None
        if st.get("authenticated"):
            u = st.get("user") or {}
            who = Principal(str(u.get("username", "")), tuple(u.get("groups") or ()), self.name,
                            uid=str(u.get("uid", "")), extra=dict(u.get("extra") or {}))
        self._trim(self._tokens, now)
        self._tokens[key] = (now + self.cache_s, who)
        return who

    def authorize(self, who: Principal, verb: str, resource: str, name: str) -> tuple[bool, str]:
        now = self.clock()
        key = (who.user, who.groups, verb, resource, name)
        hit = self._perms.get(key)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        attrs: dict[str, Any] = {"group": GROUP, "resource": resource, "verb": verb}
        if name:
            attrs["name"] = name
        spec: dict[str, Any] = {"user": who.user, "groups": list(who.groups), "resourceAttributes": attrs}
        if who.uid:
            spec["uid"] = who.uid
        if who.extra:
            spec["extra"] = {k: list(v) for k, v in who.extra.items()}
        st = self._post("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                        {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
                        ).get("status") or {}
        ok = bool(st.get("allowed")) and not st.get("denied")
        why = "" if ok else (str(st.get("reason") or "") or "no RBAC rule allows it")
        self._trim(self._perms, now)
        self._perms[key] = (now + self.cache_s, ok, why)
        return ok, why

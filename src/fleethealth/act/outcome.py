"""What an actuator returns, and the one-method interface every actuator implements.

Errors are values here: an actuator never raises for a failed side effect, it returns an Outcome that
says whether trying again can help (timeouts, 5xx, 409 conflicts, 429 throttling or PDB refusals).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from fleethealth.decide.model import Intent

# HTTP statuses where the same request may succeed later. 0 stands for "no answer" (timeout, refused).
RETRYABLE_STATUSES = frozenset({0, 408, 409, 425, 429, 500, 502, 503, 504})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    retry: bool = False  # only meaningful when not ok: trying again may help
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def success(**detail: Any) -> Outcome:
        return Outcome(ok=True, detail=detail)

    @staticmethod
    def failure(error: str, retry: bool, **detail: Any) -> Outcome:
        return Outcome(ok=False, retry=retry, error=error, detail=detail)

    @staticmethod
    def from_status(status: int, error: str, **detail: Any) -> Outcome:
        return Outcome(ok=False, retry=is_retryable_status(status), error=f"{status}: {error}", detail=detail)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "retry": self.retry, "error": self.error, "detail": self.detail}


@runtime_checkable
class Actuator(Protocol):
    """Carries out one intent. Must be idempotent: applying the same intent twice is harmless."""

    name: str

    def apply(self, intent: Intent) -> Outcome: ...


def node_of(intent: Intent) -> str:
    """The Kubernetes node an intent is about: params['node'], else the entity's node part (gpu ids are
    ``node/gpuN``, rank ids ``job/rankN`` carry their node in params)."""
    node = intent.params.get("node")
    if isinstance(node, str) and node:
        return node
    return intent.entity.split("/", 1)[0]

"""The one interface every live source implements, and helpers for reporting failures as data.

A source turns the outside world into a Snapshot. It never raises for an outside failure (a server down,
a timeout, a garbled answer): it returns what it could read plus ``source_errors`` naming what it could
not. The scorer then sees those entities as stale, which lowers confidence and blocks remediation; a
failure never reads as healthy.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fleethealth.signals.snapshot import InputIssue, Snapshot


@runtime_checkable
class Source(Protocol):
    """Reads the signals observed up to ``now`` (unix seconds). Never raises for outside failures."""

    name: str

    def read(self, now: float) -> Snapshot: ...


def failed_snapshot(now: float, source: str, reason: str, text: str = "") -> Snapshot:
    """An empty snapshot that says why nothing could be read."""
    snap = Snapshot.empty(now)
    snap.source_errors.append(InputIssue(source=source, line=0, reason=reason, text=text))
    return snap


def describe_http_error(exc: BaseException) -> str:
    """One short line for a transport failure, without a traceback (timeouts, refused connections...)."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return f"timeout ({type(exc).__name__})"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}" if str(exc) else "cannot connect"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    msg = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {msg}" if not msg.startswith(type(exc).__name__) else msg

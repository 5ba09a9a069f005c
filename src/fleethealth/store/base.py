"""The state store interface: what the decision loop needs from a database.

SQLite (``store.sqlite.SqliteStore``) is the default; a server database implements the same few methods.
``open_store`` picks one by URL-ish path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fleethealth.decide.state import Decision, DecisionState


class StoreError(Exception):
    """The store cannot be used (unreadable file, wrong schema); the message is one clear line."""


@runtime_checkable
class StateStore(Protocol):
    def load(self) -> DecisionState | None:
        """The state of the last committed cycle, or None for a fresh store."""
        ...

    def commit(self, decision: Decision) -> None:
        """Persist one cycle (state, transitions, intents, evidence index) atomically."""
        ...

    def transitions(self, entity: str | None = None) -> list[dict[str, Any]]: ...

    def intents(self, since: float | None = None, status: str | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def open_store(path: str | Path) -> StateStore:
    """``sqlite:///path``, a plain path, or ``:memory:``."""
    from fleethealth.store.sqlite import SqliteStore

    p = str(path)
    if p.startswith("sqlite:///"):
        p = p.removeprefix("sqlite:///")
    elif "://" in p:
        raise StoreError(f"{p}: unsupported state store (only SQLite paths here)")
    return SqliteStore(p)

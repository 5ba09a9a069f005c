"""The state store interface: what the decision loop needs from a database.

SQLite (``store.sqlite.SqliteStore``) is the default for one replica; PostgreSQL (``store.postgres``) runs
the very same SQL through ``store.db.PgConn`` for two or more replicas. ``open_store`` picks one by URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fleethealth.decide.state import Decision, DecisionState


class StoreError(Exception):
    """The store cannot be used (unreadable file, wrong schema); the message is one clear line."""


class StoreBusy(StoreError):
    """Another writer holds the database locked past the short busy timeout: skip this cycle, try the next."""


class StoreFenced(StoreError):
    """Another controller claimed the database after this one (it took over): this one must not write."""


class StoreUnavailable(StoreError):
    """The database server cannot be reached (or the connection broke): skip this cycle, try the next."""


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

    def recent_transitions(self, *, since: float | None = None, until: float | None = None,
                           entity: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """The newest ``limit`` transitions with since < ts <= until (of one entity), oldest first."""
        ...

    def recent_intents(self, *, since: float | None = None, until: float | None = None,
                       entity: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """The newest ``limit`` intents with since < ts <= until (of one entity), oldest first."""
        ...

    def close(self) -> None: ...


def open_store(path: str | Path) -> StateStore:
    """``postgresql://...`` (several controller replicas), ``sqlite:///path``, a plain path, or ``:memory:``
    (one replica)."""
    from fleethealth.store.db import is_postgres_url, safe_url
    from fleethealth.store.sqlite import SqliteStore

    p = str(path)
    if is_postgres_url(p):
        from fleethealth.store.postgres import PostgresStore

        return PostgresStore(p)
    if p.startswith("sqlite:///"):
        p = p.removeprefix("sqlite:///")
    elif "://" in p:
        raise StoreError(f"{safe_url(p)}: unsupported state store (a path, sqlite:///path or postgresql://...)")
    return SqliteStore(p)

"""PostgreSQL state store: the SQLite store's methods, run on one PostgreSQL database that several
controller replicas share (only the Lease holder writes; a standby that takes the Lease reloads the state
and drains the outbox from here).

Theory of operation
- ``PostgresStore`` is ``SqliteStore`` with a ``store.db.PgConn`` for its connection: the same SQL,
  translated per statement, so every method (also one added to the SQLite store later) behaves the same
  on both; ``tests/test_store_conformance.py`` runs one suite against both backends.
- One transaction per cycle (``BEGIN`` .. ``COMMIT``), row locks wait at most the busy timeout
  (``lock_timeout``), then ``StoreBusy``; a lost connection is ``StoreUnavailable`` and is reopened on the
  next cycle. Timestamps are ``DOUBLE PRECISION`` (PostgreSQL's ``REAL`` is single precision).
- The URL is ``postgresql://user:password@host:port/db``; its password never appears in a message.
"""

from __future__ import annotations

from fleethealth.store.db import DEFAULT_BUSY_TIMEOUT_S, Conn, PgConn, safe_url
from fleethealth.store.sqlite import SqliteStore


class PostgresStore(SqliteStore):
    def __init__(self, url: str, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.url = url
        super().__init__(safe_url(url), busy_timeout_s=busy_timeout_s)

    def _connect(self, busy_timeout_s: float) -> Conn:
        return PgConn(self.url, busy_timeout_s=busy_timeout_s)

"""The actuation ledger: every intent seen, every attempt made, in SQLite or PostgreSQL.

Keyed by (intent.key, actuator): an intent applied once is never applied again, across restarts and
across controller replicas that share the database (PostgreSQL for two replicas: the same database as the
state store, ``postgresql://...``). Attempts are appended, never overwritten, so a failed call is always
on record. A ``started`` attempt is written before each actuator call: a process killed between the call
and its record leaves it there, so a re-apply after a restart or failover is visible (the actuators are
idempotent: a re-apply changes nothing that the first did). Database errors are ``StoreError`` (one line),
a locked database ``StoreBusy`` after a short wait.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleethealth.act.outcome import Outcome
from fleethealth.decide.model import Intent
from fleethealth.store.db import Conn, connect

SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    key TEXT NOT NULL,
    actuator TEXT NOT NULL,
    kind TEXT NOT NULL,
    entity TEXT NOT NULL,
    intent TEXT NOT NULL,
    status TEXT NOT NULL,          -- advised | applied | retrying | failed | killed | breaker | unrouted
    attempts INTEGER NOT NULL DEFAULT 0,
    first_ts REAL NOT NULL,
    last_ts REAL NOT NULL,
    next_ts REAL,                  -- when a retrying action is due again
    last_error TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (key, actuator)
);
CREATE INDEX IF NOT EXISTS actions_entity ON actions(entity, last_ts);
CREATE INDEX IF NOT EXISTS actions_due ON actions(status, next_ts);
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    actuator TEXT NOT NULL,
    n INTEGER NOT NULL,
    ts REAL NOT NULL,
    ok INTEGER NOT NULL,
    retry INTEGER NOT NULL,
    error TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS attempts_key ON attempts(key, actuator);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

FINAL_STATUSES = frozenset({"applied", "failed"})


@dataclass(frozen=True, slots=True)
class ActionRecord:
    key: str
    actuator: str
    kind: str
    entity: str
    intent: dict[str, Any]
    status: str
    attempts: int
    first_ts: float
    last_ts: float
    next_ts: float | None
    last_error: str
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "actuator": self.actuator, "kind": self.kind, "entity": self.entity,
            "status": self.status, "attempts": self.attempts, "first_ts": self.first_ts,
            "last_ts": self.last_ts, "next_ts": self.next_ts, "last_error": self.last_error,
            "detail": self.detail, "intent": self.intent,
        }


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


def open_autocommit(path: str) -> sqlite3.Connection:
    """An autocommit SQLite connection usable from any thread, its folder created: several processes
    (controller replicas, the CLI) may share the file."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    return sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)


class Ledger:
    """``path``: a SQLite file, ``:memory:``, or a ``postgresql://`` URL (the state store's database)."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 1.0) -> None:
        self._lock = threading.Lock()
        self._db: Conn = connect(path, busy_timeout_s=busy_timeout_s, dict_rows=True)
        self.path = self._db.path
        if self._db.dialect == "sqlite" and self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            # A killed process loses nothing with WAL and NORMAL; a power cut may lose the last marks,
            # and a lost mark is a re-apply, which the actuators make harmless.
            self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- actions -------------------------------------------------------------------------------------
    def get(self, key: str, actuator: str) -> ActionRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM actions WHERE key=? AND actuator=?", (key, actuator)).fetchone()
        return None if row is None else _record(row)

    def record_status(self, intent: Intent, actuator: str, status: str, now: float,
                      error: str = "", detail: dict[str, Any] | None = None,
                      next_ts: float | None = None) -> None:
        """Upsert the action's status without counting an attempt (advised, killed, ...)."""
        with self._lock:
            self._db.execute(
                """INSERT INTO actions(key, actuator, kind, entity, intent, status, first_ts, last_ts, next_ts,
                                       last_error, detail)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?)
                   ON CONFLICT(key, actuator) DO UPDATE SET status=excluded.status, last_ts=excluded.last_ts,
                     next_ts=excluded.next_ts, last_error=excluded.last_error, detail=excluded.detail""",
                (intent.key, actuator, str(intent.kind), intent.entity, _dumps(intent.to_dict()), status, now,
                 now, next_ts, error, _dumps(detail or {})),
            )

    def record_attempt(self, intent: Intent, actuator: str, outcome: Outcome, now: float, status: str,
                       next_ts: float | None = None) -> int:
        """Append the attempt and update the action; returns the attempt number (1-based)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT attempts FROM actions WHERE key=? AND actuator=?",
                                       (intent.key, actuator)).fetchone()
                n = (row["attempts"] if row else 0) + 1
                self._db.execute(
                    "INSERT INTO attempts(key, actuator, n, ts, ok, retry, error, detail) VALUES (?,?,?,?,?,?,?,?)",
                    (intent.key, actuator, n, now, int(outcome.ok), int(outcome.retry), outcome.error,
                     _dumps(outcome.detail)),
                )
                self._db.execute(
                    """INSERT INTO actions(key, actuator, kind, entity, intent, status, attempts, first_ts,
                                           last_ts, next_ts, last_error, detail)
                       VALUES (?,?,?,?,?,?,?,?,?,?,?,?)
                       ON CONFLICT(key, actuator) DO UPDATE SET status=excluded.status,
                         attempts=excluded.attempts, last_ts=excluded.last_ts, next_ts=excluded.next_ts,
                         last_error=excluded.last_error, detail=excluded.detail""",
                    (intent.key, actuator, str(intent.kind), intent.entity, _dumps(intent.to_dict()), status, n,
                     now, now, next_ts, outcome.error, _dumps(outcome.detail)),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return n

    def due(self, now: float) -> list[ActionRecord]:
        """Actions waiting for another try whose time has come."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM actions WHERE status IN ('retrying', 'breaker') AND (next_ts IS NULL OR next_ts<=?) "
                "ORDER BY next_ts",
                (now,)).fetchall()
        return [_record(r) for r in rows]

    def actions(self, entity: str | None = None, status: str | None = None, limit: int = 1000) -> list[ActionRecord]:
        q, args = "SELECT * FROM actions WHERE 1=1", list[Any]()
        if entity is not None:
            q += " AND entity=?"
            args.append(entity)
        if status is not None:
            q += " AND status=?"
            args.append(status)
        q += " ORDER BY last_ts DESC LIMIT ?"
        args.append(int(limit))
        with self._lock:
            rows = self._db.execute(q, args).fetchall()
        return [_record(r) for r in rows]

    def attempts(self, key: str, actuator: str | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM attempts WHERE key=?", [key]
        if actuator is not None:
            q += " AND actuator=?"
            args.append(actuator)
        with self._lock:
            rows = self._db.execute(q + " ORDER BY id", args).fetchall()
        return [{"key": r["key"], "actuator": r["actuator"], "n": r["n"], "ts": r["ts"], "ok": bool(r["ok"]),
                 "retry": bool(r["retry"]), "error": r["error"], "detail": json.loads(r["detail"])} for r in rows]

    def entities_acted(self, kinds: list[str], since_ts: float) -> set[str]:
        """Entities with an action of these kinds applied or under way since ``since_ts``."""
        q = ("SELECT DISTINCT entity FROM actions WHERE status IN ('applied', 'retrying') AND first_ts>=? "
             f"AND kind IN ({','.join('?' * len(kinds))})")
        with self._lock:
            rows = self._db.execute(q, (since_ts, *kinds)).fetchall()
        return {str(r["entity"]) for r in rows}

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) AS n FROM actions GROUP BY status").fetchall()
        return {str(r["status"]): int(r["n"]) for r in rows}

    def prune(self, before_ts: float) -> int:
        """Forget settled actions (and their attempts) last touched before ``before_ts``; actions still
        retrying are kept whatever their age. Returns how many actions went."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                keys = self._db.execute(
                    "SELECT key, actuator FROM actions WHERE last_ts<? AND status NOT IN ('retrying', 'breaker')",
                    (before_ts,)
                ).fetchall()
                self._db.executemany("DELETE FROM attempts WHERE key=? AND actuator=?",
                                     [(k["key"], k["actuator"]) for k in keys])
                self._db.execute("DELETE FROM actions WHERE last_ts<? AND status NOT IN ('retrying', 'breaker')",
                                 (before_ts,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return len(keys)

    # -- settings (kill switch survives restarts and is shared by replicas on one database) ------------
    def get_setting(self, name: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM settings WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row["value"])

    def set_setting(self, name: str, value: str | None) -> None:
        with self._lock:
            if value is None:
                self._db.execute("DELETE FROM settings WHERE name=?", (name,))
            else:
                self._db.execute("INSERT INTO settings(name, value) VALUES (?,?) "
                                 "ON CONFLICT(name) DO UPDATE SET value=excluded.value", (name, value))


def _record(row: Any) -> ActionRecord:
    return ActionRecord(
        key=row["key"], actuator=row["actuator"], kind=row["kind"], entity=row["entity"],
        intent=json.loads(row["intent"]), status=row["status"], attempts=row["attempts"],
        first_ts=row["first_ts"], last_ts=row["last_ts"], next_ts=row["next_ts"],
        last_error=row["last_error"], detail=json.loads(row["detail"]),
    )


def intent_from_dict(d: dict[str, Any]) -> Intent:
    """Rebuild an Intent from its to_dict() form (for retries after a restart)."""
    from fleethealth.decide.model import IntentKind, Tier

    return Intent(
        ts=float(d["ts"]), kind=IntentKind(d["intent"]), entity=d["entity"], reason=d.get("reason", ""),
        params=dict(d.get("params") or {}), tier=None if d.get("tier") is None else Tier(d["tier"]),
        soft=bool(d.get("soft", False)), policy_version=d.get("policy_version", ""),
    )

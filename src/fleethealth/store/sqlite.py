"""SQLite state store: lifecycles and timers, last weights, budget ledger, pages, transition history,
intents log, evidence index. One transaction per cycle, so a controller killed at any moment resumes at
the last committed cycle: no timer restarts (timers are stored), no action repeated (intents are keyed by
their idempotency key and a re-run cycle yields the same keys), no quarantine forgotten.

WAL journal: a reader (the HTTP API, ``sqlite3`` by hand) never blocks the loop, and a killed process
loses at most the cycle it was writing. A database another process holds locked is ``StoreBusy`` after
a short wait (1 s): the controller reports it in one line and skips the cycle.

The outbox: the intents a cycle commits are ``pending`` until the actuation runner has carried each out
and marks it (``mark_intent``: applied, failed, advised); the runner drains every ``pending`` intent at
start-up and each cycle, so a crash between commit and act loses none.

The SQL here is SQLite's; ``store.postgres.PostgresStore`` runs the same methods on PostgreSQL through
``store.db.PgConn``, which translates it (keep to ``?`` placeholders, ``INSERT OR REPLACE/IGNORE``, and
column names that are not SQL keywords).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fleethealth.decide.model import IntentKind
from fleethealth.decide.state import Decision, DecisionState, EntityLifecycle
from fleethealth.store.base import StoreBusy, StoreError, StoreFenced
from fleethealth.store.db import DEFAULT_BUSY_TIMEOUT_S, Conn, SqliteConn

SCHEMA_VERSION = 1
# open_incidents: decide.incidents' records (params, signature, opened, seen: when it last held), so a
# restarted controller resolves an incident when an uninterrupted one would, and a version incident keeps
# holding its nodes (decide.safety's version holds read it) instead of releasing them at the restart.

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lifecycles (
    entity TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, since REAL NOT NULL,
    transitions INTEGER NOT NULL, weight REAL, no_new_work INTEGER NOT NULL, blocked TEXT,
    last_value REAL, last_confidence REAL, last_known_ts REAL, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS budget_ledger (ts REAL NOT NULL, budget TEXT NOT NULL, entity TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pages (key TEXT PRIMARY KEY, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS open_incidents (key TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS app_xids (node TEXT NOT NULL, job TEXT NOT NULL, ts REAL NOT NULL,
    PRIMARY KEY (node, job));
CREATE TABLE IF NOT EXISTS transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, entity TEXT NOT NULL, kind TEXT NOT NULL,
    from_state TEXT NOT NULL, to_state TEXT NOT NULL, reason TEXT NOT NULL, value REAL,
    confidence REAL NOT NULL, policy_version TEXT NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_entity ON transitions (entity, ts);
CREATE INDEX IF NOT EXISTS transitions_ts ON transitions (ts);
CREATE TABLE IF NOT EXISTS intents (
    key TEXT PRIMARY KEY, seq INTEGER, ts REAL NOT NULL, kind TEXT NOT NULL, entity TEXT NOT NULL,
    reason TEXT NOT NULL, tier TEXT, soft INTEGER NOT NULL, params TEXT NOT NULL, policy_version TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', outcome TEXT
);
CREATE INDEX IF NOT EXISTS intents_ts ON intents (ts);
CREATE INDEX IF NOT EXISTS intents_status ON intents (status);
CREATE INDEX IF NOT EXISTS intents_entity ON intents (entity, ts);
CREATE TABLE IF NOT EXISTS inbox (id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, event TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS evidence (
    key TEXT PRIMARY KEY, ts REAL NOT NULL, entity TEXT NOT NULL, reason TEXT NOT NULL, params TEXT NOT NULL,
    location TEXT
);
CREATE TABLE IF NOT EXISTS cycles (ts REAL PRIMARY KEY, transitions INTEGER NOT NULL, intents INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS incident_labels (
    key TEXT PRIMARY KEY, label TEXT NOT NULL, cause TEXT NOT NULL, labeled_by TEXT NOT NULL, ts REAL NOT NULL, onset REAL
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, actor TEXT NOT NULL, verb TEXT NOT NULL,
    target TEXT NOT NULL, remote TEXT NOT NULL, allowed INTEGER NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_ts ON audit (ts);
CREATE TABLE IF NOT EXISTS expectations (
    entity TEXT NOT NULL, what TEXT NOT NULL, value TEXT NOT NULL, ts REAL NOT NULL, PRIMARY KEY (entity, what)
);
"""


class SqliteStore:
    """The default ``StateStore``. ``path`` ``:memory:`` works for tests."""

    def __init__(self, path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        self.path = str(path)
        self.db: Conn = self._connect(busy_timeout_s)
        try:
            self.db.executescript(SCHEMA)
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                self.db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except StoreError as e:
            self.db.close()
            raise StoreError(f"cannot open state database: {e}") from None
        if row is not None and int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: state database schema {row[0]}, this version reads {SCHEMA_VERSION}")
        self._saved: dict[str, str] = {}  # entity -> JSON last written (write only what changed)
        self.fence: str | None = None  # set by claim(): every commit checks the database still says so
        self._inbox_upto: int | None = None  # the last inbox event handed to the cycle being committed
        self._lock = threading.RLock()
        self.stats: dict[str, float] = {"commits_total": 0, "commit_seconds_total": 0.0,
                                        "commit_seconds_last": 0.0, "busy_total": 0, "fenced_total": 0,
                                        "errors_total": 0}

    def _connect(self, busy_timeout_s: float) -> Conn:
        """A short busy timeout: a database locked by another writer skips a cycle (StoreBusy), it does
        not block it for long."""
        db = SqliteConn(self.path, busy_timeout_s=busy_timeout_s)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        except StoreError as e:
            db.close()
            raise StoreError(f"cannot open state database: {e}") from None
        return db

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self) -> Iterator[Conn]:
        # One connection, several threads (the loop commits, the HTTP API puts events): a statement from
        # another thread must not land inside this transaction.
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            else:
                self.db.execute("COMMIT")

    # -- the inbox: operator events (acks, active-test results) for whichever replica leads -------------
    def put_event(self, event: dict[str, Any]) -> None:
        """Queue an event durably; the leader takes it in its next cycle, wherever it was posted."""
        with self._lock:
            self.db.execute("INSERT INTO inbox (ts, event) VALUES (?, ?)",
                            (float(event["ts"]), json.dumps(event, sort_keys=True, default=str)))

    def pending_events(self) -> list[dict[str, Any]]:
        """The queued events, oldest first. The next commit removes them in its own transaction, so an
        event is taken exactly once: a cycle that fails to commit leaves them for the next one."""
        with self._lock:
            rows = self.db.execute("SELECT id, event FROM inbox ORDER BY id").fetchall()
        self._inbox_upto = int(rows[-1][0]) if rows else None
        return [json.loads(e) for _, e in rows]

    # -- StateStore ------------------------------------------------------------------------------
    def load(self) -> DecisionState | None:
        meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        if "last_ts" not in meta:
            return None
        st = DecisionState(
            frozen=meta.get("frozen") == "1",
            frozen_since=None if meta.get("frozen_since") in (None, "") else float(meta["frozen_since"]),
            seq=int(meta.get("seq", "0")), last_ts=float(meta["last_ts"]),
        )
        self._saved = {}  # a reload (a standby taking over) starts from what the database holds
        for entity, data in self.db.execute("SELECT entity, data FROM lifecycles"):
            st.entities[entity] = EntityLifecycle.from_dict(json.loads(data))
            self._saved[entity] = data
        st.ledger = [(float(ts), b, e) for ts, b, e in
                     self.db.execute("SELECT ts, budget, entity FROM budget_ledger ORDER BY rowid")]
        st.pages = {k: float(ts) for k, ts in self.db.execute("SELECT key, ts FROM pages")}
        st.incidents = {k: json.loads(data) for k, data in self.db.execute("SELECT key, data FROM open_incidents")}
        for node, job, ts in self.db.execute("SELECT node, job, ts FROM app_xids"):
            st.app_xids.setdefault(node, {})[job] = float(ts)
        return st

    def last_ts(self) -> float | None:
        row = self.db.execute("SELECT value FROM meta WHERE key='last_ts'").fetchone()
        return None if row is None else float(row[0])

    def claim(self, token: str) -> None:
        """This writer owns the database from now on (a controller starting, or a standby taking over):
        a writer that claimed before it gets ``StoreFenced`` on its next commit, so a deposed leader that
        still thinks it leads (paused, partitioned) cannot overwrite the new leader's state. Claim, then
        load: the load sees every commit the old writer made."""
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('fence', ?)", (token,))
        self.fence = token

    def holds_fence(self) -> bool:
        """Whether the database still names this writer's claim (True when it never claimed): the
        actuation runner's check before each external write (act.fence.StoreFence)."""
        if self.fence is None:
            return True
        with self._lock:
            row = self.db.execute("SELECT value FROM meta WHERE key='fence'").fetchone()
        return row is not None and row[0] == self.fence

    def outbox_summary(self, now: float) -> dict[str, Any]:
        """Intents per outbox status and the age of the oldest pending one (``None``: none pending), for
        ``/metrics``. Ages are on the intents' own clock (the cycle's ``now``)."""
        with self._lock:
            rows = self.db.execute("SELECT status, COUNT(*), MIN(ts) FROM intents GROUP BY status").fetchall()
        counts = {str(st): int(n) for st, n, _ in rows}
        oldest = next((float(t) for st, _, t in rows if st == "pending" and t is not None), None)
        return {"counts": counts, "oldest_pending_age_s": None if oldest is None else max(0.0, now - oldest)}

    def commit(self, decision: Decision) -> None:
        """Persist one cycle atomically: the new state and what it said. Timed and counted for
        ``/metrics`` (``stats``): the last and total commit seconds, commits, busy and other errors."""
        t0 = time.perf_counter()
        try:
            self._commit(decision)
        except StoreBusy:
            self.stats["busy_total"] += 1
            raise
        except StoreFenced:
            self.stats["fenced_total"] += 1
            raise
        except StoreError:
            self.stats["errors_total"] += 1
            raise
        dt = time.perf_counter() - t0
        self.stats["commits_total"] += 1
        self.stats["commit_seconds_total"] += dt
        self.stats["commit_seconds_last"] = dt

    def _commit(self, decision: Decision) -> None:
        st = decision.state
        with self._tx() as db:
            if self.fence is not None:
                held = db.execute("UPDATE meta SET value=value WHERE key='fence' AND value=?", (self.fence,))
                if held.rowcount != 1:  # the row stays locked to the end of this transaction
                    raise StoreFenced(f"{self.path}: another controller took over this database; "
                                      "not writing (this replica is no longer the leader)")
            if self._inbox_upto is not None:
                db.execute("DELETE FROM inbox WHERE id <= ?", (self._inbox_upto,))
                self._inbox_upto = None
            changed: dict[str, str] = {}
            rows = []
            for eid, es in st.entities.items():
                data = json.dumps(es.to_dict(), sort_keys=True)
                if self._saved.get(eid) == data:
                    continue
                changed[eid] = data
                rows.append((eid, es.kind, str(es.state), es.since, es.transitions, es.weight, int(es.no_new_work),
                             es.blocked, es.last_value, es.last_confidence, es.last_known_ts, data))
            db.executemany("INSERT OR REPLACE INTO lifecycles VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            gone = set(self._saved) - set(st.entities)
            db.executemany("DELETE FROM lifecycles WHERE entity=?", [(e,) for e in gone])
            db.execute("DELETE FROM budget_ledger")
            db.executemany("INSERT INTO budget_ledger VALUES (?,?,?)", st.ledger)
            db.execute("DELETE FROM pages")
            db.executemany("INSERT INTO pages VALUES (?,?)", list(st.pages.items()))
            db.execute("DELETE FROM open_incidents")
            db.executemany("INSERT INTO open_incidents VALUES (?,?)",
                           [(k, json.dumps(rec, sort_keys=True)) for k, rec in sorted(st.incidents.items())])
            db.execute("DELETE FROM app_xids")
            db.executemany("INSERT INTO app_xids VALUES (?,?,?)",
                           [(n, j, ts) for n, js in st.app_xids.items() for j, ts in js.items()])
            db.executemany(
                "INSERT INTO transitions (ts, entity, kind, from_state, to_state, reason, value, confidence,"
                " policy_version, detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [(t.ts, t.entity, t.kind, str(t.from_state), str(t.to_state), t.reason, t.value, t.confidence,
                  t.policy_version, t.detail) for t in decision.transitions],
            )
            db.executemany(
                "INSERT OR IGNORE INTO intents (key, seq, ts, kind, entity, reason, tier, soft, params,"
                " policy_version) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [(i.key, i.params.get("n"), i.ts, str(i.kind), i.entity, i.reason,
                  None if i.tier is None else str(i.tier), int(i.soft), json.dumps(i.params, sort_keys=True,
                                                                                     default=str),
                  i.policy_version) for i in decision.intents],
            )
            db.executemany(
                "INSERT OR IGNORE INTO evidence (key, ts, entity, reason, params) VALUES (?,?,?,?,?)",
                [(i.key, i.ts, i.entity, i.reason, json.dumps(i.params, sort_keys=True, default=str))
                 for i in decision.intents if i.kind == IntentKind.CAPTURE_EVIDENCE],
            )
            db.execute("INSERT OR REPLACE INTO cycles VALUES (?,?,?)",
                       (decision.ts, len(decision.transitions), len(decision.intents)))
            meta = {"last_ts": repr(float(decision.ts)), "seq": str(st.seq), "frozen": "1" if st.frozen else "0",
                    "frozen_since": "" if st.frozen_since is None else repr(st.frozen_since)}
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?,?)", list(meta.items()))
        self._saved.update(changed)
        for e in gone:
            self._saved.pop(e, None)

    # -- reads for the CLI, the API and the actuators ---------------------------------------------
    def transitions(self, entity: str | None = None) -> list[dict[str, Any]]:
        q = ("SELECT ts, entity, kind, from_state, to_state, reason, value, confidence, policy_version, detail"
             " FROM transitions" + (" WHERE entity=?" if entity else "") + " ORDER BY id")
        cols = ["ts", "entity", "kind", "from", "to", "reason", "value", "confidence", "policy_version", "detail"]
        return [dict(zip(cols, r, strict=True)) for r in self.db.execute(q, (entity,) if entity else ())]

    def recent_transitions(self, *, since: float | None = None, until: float | None = None,
                           entity: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """The newest ``limit`` transitions with ``since < ts <= until`` (of one entity), oldest first:
        what the API and the fleet view show, read back after a restart or a take-over."""
        where, args = _window(since, until, entity)
        q = ("SELECT ts, entity, kind, from_state, to_state, reason, value, confidence, policy_version, detail"
             " FROM transitions" + where + " ORDER BY ts DESC, id DESC LIMIT ?")
        cols = ["ts", "entity", "kind", "from", "to", "reason", "value", "confidence", "policy_version", "detail"]
        with self._lock:
            rows = list(self.db.execute(q, [*args, max(0, int(limit))]))
        return [dict(zip(cols, r, strict=True)) for r in reversed(rows)]

    def recent_intents(self, *, since: float | None = None, until: float | None = None,
                       entity: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
        """The newest ``limit`` intents with ``since < ts <= until`` (of one entity), oldest first, in the
        shape the loop serves them (``Intent.to_dict``) plus their outbox status."""
        where, args = _window(since, until, entity)
        q = ("SELECT key, ts, kind, entity, reason, tier, soft, params, policy_version, status, outcome FROM intents"
             + where + " ORDER BY ts DESC, seq DESC LIMIT ?")
        with self._lock:
            rows = list(self.db.execute(q, [*args, max(0, int(limit))]))
        return [{"ts": ts, "intent": kind, "entity": ent, "reason": reason, "params": json.loads(params),
                 "tier": tier, "soft": bool(soft), "policy_version": pv, "key": key, "status": stt, "outcome": outcome}
                for key, ts, kind, ent, reason, tier, soft, params, pv, stt, outcome in reversed(rows)]

    def intents(self, since: float | None = None, status: str | None = None) -> list[dict[str, Any]]:
        where: list[str] = []
        args: list[Any] = []
        if since is not None:
            where.append("ts >= ?")
            args.append(since)
        if status is not None:
            where.append("status = ?")
            args.append(status)
        q = ("SELECT key, ts, kind, entity, reason, tier, soft, params, policy_version, status, outcome FROM intents"
             + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY seq, ts")
        out = []
        for key, ts, kind, entity, reason, tier, soft, params, pv, stt, outcome in self.db.execute(q, args):
            out.append({"key": key, "ts": ts, "intent": kind, "entity": entity, "reason": reason, "tier": tier,
                        "soft": bool(soft), "params": json.loads(params), "policy_version": pv, "status": stt,
                        "outcome": outcome})
        return out

    def mark_intent(self, key: str, status: str, outcome: str | None = None) -> bool:
        """Record what an actuator did with an intent (done, failed, skipped). False: unknown key."""
        cur = self.db.execute("UPDATE intents SET status=?, outcome=? WHERE key=?", (status, outcome, key))
        return cur.rowcount > 0

    def add_evidence_location(self, key: str, location: str) -> bool:
        cur = self.db.execute("UPDATE evidence SET location=? WHERE key=?", (location, key))
        return cur.rowcount > 0

    def evidence(self, entity: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT key, ts, entity, reason, params, location FROM evidence" + (" WHERE entity=?" if entity else "")
        return [{"key": k, "ts": ts, "entity": e, "reason": r, "params": json.loads(p), "location": loc}
                for k, ts, e, r, p, loc in self.db.execute(q + " ORDER BY ts", (entity,) if entity else ())]

    def label_incident(self, key: str, label: str, cause: str = "", by: str = "", ts: float = 0.0,
                       onset: float | None = None) -> None:
        """An operator's verdict on an incident (``review``): kept, the latest one wins."""
        self.db.execute("INSERT OR REPLACE INTO incident_labels VALUES (?,?,?,?,?,?)",
                        (key, label, cause, by, ts, onset))

    def incident_labels(self) -> list[dict[str, Any]]:
        return [{"key": k, "label": lb, "cause": c, "by": b, "ts": ts, "onset": o} for k, lb, c, b, ts, o in
                self.db.execute("SELECT key, label, cause, labeled_by, ts, onset FROM incident_labels ORDER BY ts")]

    def audit(self, ts: float, actor: str, verb: str, target: str, remote: str, allowed: bool,
              detail: dict[str, Any] | None = None) -> None:
        """One operator action on the API (who, what, on what, from where, allowed or refused), kept."""
        with self._lock:  # from an API thread: never inside the loop's open transaction
            self.db.execute("INSERT INTO audit (ts, actor, verb, target, remote, allowed, detail) "
                            "VALUES (?,?,?,?,?,?,?)", (ts, actor, verb, target, remote, int(allowed),
                                                       json.dumps(detail or {}, sort_keys=True, default=str)))

    def audit_log(self, since: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        q = ("SELECT ts, actor, verb, target, remote, allowed, detail FROM audit"
             + (" WHERE ts >= ?" if since is not None else "") + " ORDER BY id DESC LIMIT ?")
        rows = self.db.execute(q, ((since,) if since is not None else ()) + (int(limit),)).fetchall()
        return [{"ts": ts, "actor": a, "verb": v, "target": t, "remote": r, "allowed": bool(ok),
                 "detail": json.loads(d)} for ts, a, v, t, r, ok, d in reversed(rows)]

    def save_expectations(self, rows: dict[tuple[str, str], str], ts: float) -> None:
        """What entities are expected to report by their past ((entity, what) -> JSON, e.g. a node's
        ``gpus``: the most GPUs it has had and their ids), so that a restart forgets nothing; the rows
        given replace those of the same keys, ``""`` deletes one."""
        with self._tx() as db:
            db.executemany("DELETE FROM expectations WHERE entity=? AND what=?",
                           [k for k, v in rows.items() if v == ""])
            db.executemany("INSERT OR REPLACE INTO expectations VALUES (?,?,?,?)",
                           [(e, w, v, ts) for (e, w), v in rows.items() if v != ""])

    def expectations(self) -> dict[tuple[str, str], str]:
        return {(e, w): v for e, w, v in self.db.execute("SELECT entity, what, value FROM expectations")}

    def cycles(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM cycles").fetchone()[0])


def _window(since: float | None, until: float | None, entity: str | None) -> tuple[str, list[Any]]:
    """A WHERE clause (and its arguments) for rows with since < ts <= until, of one entity."""
    where: list[str] = []
    args: list[Any] = []
    if since is not None:
        where.append("ts > ?")
        args.append(float(since))
    if until is not None:
        where.append("ts <= ?")
        args.append(float(until))
    if entity is not None:
        where.append("entity = ?")
        args.append(entity)
    return (" WHERE " + " AND ".join(where) if where else ""), args

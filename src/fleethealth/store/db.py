"""One database connection for the state store and the actuation ledger, SQLite or PostgreSQL.

Theory of operation
- The store and the ledger write their SQL once, in SQLite's dialect with ``?`` placeholders. A
  ``SqliteConn`` runs it as is; a ``PgConn`` translates each statement once (per connection) into
  PostgreSQL's: ``?`` -> ``%s``, ``BEGIN IMMEDIATE`` -> ``BEGIN``, ``INSERT OR IGNORE`` -> ``ON CONFLICT DO
  NOTHING`` and ``INSERT OR REPLACE`` -> ``ON CONFLICT (primary key) DO UPDATE`` using the primary keys and
  columns it read from the schema it created; in the schema ``REAL`` becomes ``DOUBLE PRECISION``,
  ``INTEGER`` ``BIGINT``, ``AUTOINCREMENT`` an identity column, and a table without one gets a ``rowid``
  identity column so that ``ORDER BY rowid`` (insertion order) means what it means in SQLite. So a method
  added to the SQLite store works on PostgreSQL unchanged, and one conformance suite tests both.
- Errors come out as ``StoreError`` with one line; a database another writer holds locked (SQLite's
  ``database is locked``, PostgreSQL's lock or statement timeout) as ``StoreBusy``, after a short wait
  (``busy_timeout_s``, default 1 s), never the 30 s a cycle used to block.
- A PostgreSQL connection that broke (server restarted, failover of the database) is reopened on the next
  statement outside a transaction; the statement that saw it break fails with ``StoreUnavailable``.
- Connections are autocommit: a statement outside ``BEGIN ... COMMIT`` commits on its own.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from fleethealth.store.base import StoreBusy, StoreError, StoreUnavailable

DEFAULT_BUSY_TIMEOUT_S = 1.0


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def safe_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable database URL>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class SqliteConn:
    """A sqlite3 connection (autocommit, usable from any thread) whose errors are StoreErrors."""

    dialect = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                 dict_rows: bool = False) -> None:
        self.path = str(path)
        self.busy_timeout_s = busy_timeout_s
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.raw = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
        except sqlite3.Error as e:
            raise StoreError(f"{self.path}: cannot open the database: {_one_line(e)}") from None
        if dict_rows:
            self.raw.row_factory = sqlite3.Row

    def _error(self, e: sqlite3.Error) -> StoreError:
        msg = _one_line(e)
        if isinstance(e, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg):
            return StoreBusy(f"{self.path}: database is locked by another writer "
                             f"(waited {self.busy_timeout_s:g} s): {msg}")
        return StoreError(f"{self.path}: {msg}")

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        try:
            return self.raw.execute(sql, args)
        except sqlite3.Error as e:
            raise self._error(e) from None

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        try:
            return self.raw.executemany(sql, rows)
        except sqlite3.Error as e:
            raise self._error(e) from None

    def executescript(self, script: str) -> None:
        try:
            self.raw.executescript(script)
        except sqlite3.Error as e:
            raise self._error(e) from None

    def close(self) -> None:
        self.raw.close()


# -- PostgreSQL -------------------------------------------------------------------------------------

_CREATE = re.compile(r"CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)\s*\(", re.I)
_INSERT = re.compile(r"^\s*INSERT\s+OR\s+(REPLACE|IGNORE)\s+INTO\s+(\w+)\s*(\(([^)]*)\))?", re.I | re.S)
_CONSTRAINT = ("PRIMARY", "UNIQUE", "CHECK", "FOREIGN", "CONSTRAINT")


def _split_top(body: str) -> list[str]:
    """Split a CREATE TABLE body at its top-level commas (not those inside parentheses)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [re.sub(r"--[^\n]*", "", s).strip() for s in out if re.sub(r"--[^\n]*", "", s).strip()]


def _statements(script: str) -> list[str]:
    no_comments = re.sub(r"--[^\n]*", "", script)
    return [s.strip() for s in no_comments.split(";") if s.strip()]


class PgSchema:
    """Tables' columns and primary keys, read from the SQLite-dialect schema, and its PostgreSQL form."""

    def __init__(self) -> None:
        self.columns: dict[str, list[str]] = {}
        self.pkeys: dict[str, list[str]] = {}

    def translate(self, stmt: str) -> str:
        m = _CREATE.match(stmt)
        if m is None:
            return stmt
        table = m.group(1)
        body = stmt[m.end():stmt.rindex(")")]
        cols: list[str] = []
        pk: list[str] = []
        defs: list[str] = []
        identity = False
        for d in _split_top(body):
            first = d.split()[0].upper()
            if first in _CONSTRAINT:
                km = re.match(r"PRIMARY\s+KEY\s*\(([^)]*)\)", d, re.I)
                if km:
                    pk = [c.strip() for c in km.group(1).split(",")]
                defs.append(d)
                continue
            name = d.split()[0]
            cols.append(name)
            if re.search(r"\bPRIMARY\s+KEY\b", d, re.I):
                pk = [name]
            if re.search(r"\bAUTOINCREMENT\b", d, re.I):
                identity = True
                d = f"{name} BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
            else:
                d = re.sub(r"\bREAL\b", "DOUBLE PRECISION", d, flags=re.I)
                d = re.sub(r"\bINTEGER\b", "BIGINT", d, flags=re.I)
            defs.append(d)
        if not identity:
            defs.append("rowid BIGINT GENERATED BY DEFAULT AS IDENTITY")
        self.columns[table] = cols
        self.pkeys[table] = pk
        return f"CREATE TABLE IF NOT EXISTS {table} (" + ", ".join(defs) + ")"

    def statement(self, sql: str) -> str:
        """One statement in PostgreSQL's dialect (``%s`` placeholders)."""
        s = sql.strip()
        if re.match(r"BEGIN\s+(IMMEDIATE|EXCLUSIVE|DEFERRED)\b", s, re.I):
            return "BEGIN"
        m = _INSERT.match(s)
        if m is not None:
            verb, table = m.group(1).upper(), m.group(2)
            listed = [c.strip() for c in m.group(4).split(",")] if m.group(4) else None
            rest = s[m.end():]
            s = f"INSERT INTO {table}" + (f" ({m.group(4)})" if listed else "") + " " + rest.lstrip()
            if verb == "IGNORE":
                s += " ON CONFLICT DO NOTHING"
            else:
                pk = self.pkeys.get(table)
                if not pk:
                    raise StoreError(f"INSERT OR REPLACE into {table}: no primary key known for that table")
                if listed is None:
                    n = _values_count(rest)
                    listed = self.columns[table][:n] if n else self.columns[table]
                upd = [c for c in listed if c not in pk]
                s += (f" ON CONFLICT ({', '.join(pk)}) DO "
                      + ("UPDATE SET " + ", ".join(f"{c}=EXCLUDED.{c}" for c in upd) if upd else "NOTHING"))
        return s.replace("%", "%%").replace("?", "%s")


def _values_count(rest: str) -> int:
    m = re.search(r"VALUES\s*\(([^)]*)\)", rest, re.I)
    return 0 if m is None else len(_split_top(m.group(1)))


class PgConn:
    """A psycopg 3 connection taking SQLite-dialect SQL (see the module docstring)."""

    dialect = "postgresql"

    def __init__(self, url: str, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, dict_rows: bool = False,
                 connect_timeout_s: float = 5.0) -> None:
        self.url = url
        self.path = safe_url(url)
        self.busy_timeout_s = busy_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.dict_rows = dict_rows
        self.schema = PgSchema()
        self._sql: dict[str, str] = {}
        self._lock = threading.RLock()
        self._in_tx = False
        self.raw: Any = None
        self._connect()

    def _connect(self) -> None:
        try:
            import psycopg
            from psycopg.rows import dict_row, tuple_row
        except ImportError:
            raise StoreError("PostgreSQL state store needs psycopg 3 (pip install 'psycopg[binary]')") from None
        from psycopg.conninfo import conninfo_to_dict

        ms = max(1, int(self.busy_timeout_s * 1000))
        try:
            # the URL's own ``options`` (a shard's ``-c search_path=...``) go with ours, not lost to them
            own = str(conninfo_to_dict(self.url).get("options") or "")
            self.raw = psycopg.connect(
                self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                options=f"-c lock_timeout={ms} -c idle_in_transaction_session_timeout=60000 {own}".strip(),
                row_factory=dict_row if self.dict_rows else tuple_row)  # type: ignore[arg-type]
        except psycopg.Error as e:
            raise StoreUnavailable(f"{self.path}: cannot connect to PostgreSQL: {_one_line(e)}") from None

    def _error(self, e: Exception) -> StoreError:
        import psycopg
        from psycopg import errors

        msg = _one_line(e)
        if isinstance(e, errors.LockNotAvailable | errors.QueryCanceled | errors.SerializationFailure
                      | errors.DeadlockDetected):
            return StoreBusy(f"{self.path}: database is busy (waited {self.busy_timeout_s:g} s for a lock): {msg}")
        if isinstance(e, psycopg.OperationalError | psycopg.InterfaceError):
            return StoreUnavailable(f"{self.path}: PostgreSQL connection lost: {msg}")
        return StoreError(f"{self.path}: {msg}")

    def _q(self, sql: str) -> str:
        q = self._sql.get(sql)
        if q is None:
            q = self._sql[sql] = self.schema.statement(sql)
        return q

    def _run(self, sql: str, fn: Any) -> Any:
        import psycopg

        head = sql.lstrip()[:8].upper()
        with self._lock:
            if (self.raw is None or self.raw.closed or self.raw.broken) and not self._in_tx:
                self._connect()
            try:
                cur = fn(self.raw.cursor(), self._q(sql))
            except psycopg.Error as e:
                if head.startswith("ROLLBACK"):
                    self._in_tx = False
                    return None  # the transaction is gone with the connection
                raise self._error(e) from None
            if head.startswith("BEGIN"):
                self._in_tx = True
            elif head.startswith(("COMMIT", "ROLLBACK")):
                self._in_tx = False
            return cur

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        def go(cur: Any, q: str) -> Any:
            cur.execute(q, tuple(args) if args else None)
            return cur
        return self._run(sql, go)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        rows = [tuple(r) for r in rows]

        def go(cur: Any, q: str) -> Any:
            if rows:
                cur.executemany(q, rows)
            return cur
        return self._run(sql, go)

    def executescript(self, script: str) -> None:
        """The schema, in one transaction under an advisory lock: replicas starting together do not race
        on CREATE TABLE."""
        self.execute("BEGIN")
        try:
            self.execute("SELECT pg_advisory_xact_lock(7304401)")
            for stmt in _statements(script):
                self.execute(self.schema.translate(stmt))
        except BaseException:
            self.execute("ROLLBACK")
            raise
        self.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self.raw is not None:
                self.raw.close()


Conn = SqliteConn | PgConn


def connect(url: str | Path, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, dict_rows: bool = False) -> Conn:
    """``postgresql://...`` (or ``postgres://``), ``sqlite:///path``, a plain path, or ``:memory:``."""
    u = str(url)
    if is_postgres_url(u):
        return PgConn(u, busy_timeout_s=busy_timeout_s, dict_rows=dict_rows)
    if u.startswith("sqlite:///"):
        u = u.removeprefix("sqlite:///")
    elif "://" in u:
        raise StoreError(f"{safe_url(u)}: unsupported database (a path, sqlite:///path or postgresql://...)")
    return SqliteConn(u, busy_timeout_s=busy_timeout_s, dict_rows=dict_rows)

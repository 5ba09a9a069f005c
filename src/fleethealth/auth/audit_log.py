"""A local, append-only audit log in JSON Lines, bounded by rotation (the sidecar's audit store).

Theory of operation
- One JSON object per line: ``ts`` (Unix seconds), ``time`` (RFC 3339, for people), ``actor``, ``verb``,
  ``target``, ``remote`` (the TCP peer), ``allowed`` and ``detail``; ``jq`` and log shippers read it as is.
- Append-only: each record is one ``write`` on a file opened with ``O_APPEND`` (a line never interleaves
  with another writer's) followed by ``fsync``: an action is audited on disk before it is done (the
  ``Auditor`` refuses the action when the write fails). Admin actions are rare, so the fsync costs nothing
  that matters.
- Bounded: when a record would take the file past ``max_bytes``, the file is rotated first
  (``audit.jsonl`` -> ``audit.jsonl.1`` -> ... -> ``audit.jsonl.<keep>``, the oldest dropped), so the log
  takes at most ``(keep + 1) * max_bytes`` on disk. Rotation renames, it never rewrites a record.
- Same ``audit(ts, actor, verb, target, remote, allowed, detail)`` method as the state store's, so the
  shared ``auth.audit.Auditor`` writes to either.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

DEFAULT_MAX_BYTES = 10 << 20
DEFAULT_KEEP = 3


class AuditLogError(Exception):
    pass


class JsonlAuditLog:
    def __init__(self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP) -> None:
        if max_bytes < 1024 or keep < 1:
            raise ValueError("an audit log needs max_bytes >= 1024 and keep >= 1")
        self.path = Path(path)
        self.max_bytes = int(max_bytes)
        self.keep = int(keep)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # opened (and created) now, so a path that cannot be written is an error at start, not at the
            # first admin action
            os.close(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        except OSError as e:
            raise AuditLogError(f"{self.path}: cannot open the audit log: {e.strerror or e}") from None

    def audit(self, ts: float, actor: str, verb: str, target: str, remote: str, allowed: bool,
              detail: dict[str, Any] | None = None) -> None:
        rec = {"ts": ts, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)), "actor": actor,
               "verb": verb, "target": target, "remote": remote, "allowed": bool(allowed), "detail": detail or {}}
        line = (json.dumps(rec, sort_keys=True, default=str, ensure_ascii=True) + "\n").encode()
        with self._lock:
            try:
                self._rotate_for(len(line))
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, line)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                raise AuditLogError(f"{self.path}: cannot write the audit log: {e.strerror or e}") from None

    def _rotate_for(self, n: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size == 0 or size + n <= self.max_bytes:
            return
        for i in range(self.keep, 0, -1):
            src = self.path if i == 1 else self.path.with_name(f"{self.path.name}.{i - 1}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i}"))

    def audit_log(self, since: float | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """The newest ``limit`` records (oldest first) of the current file and its rotations."""
        out: list[dict[str, Any]] = []
        files = [self.path.with_name(f"{self.path.name}.{i}") for i in range(self.keep, 0, -1)] + [self.path]
        for f in files:
            try:
                text = f.read_text()
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a torn last line of a crash: skipped, the rest is read
                if since is None or float(rec.get("ts", 0)) >= since:
                    out.append(rec)
        return out[-limit:] if limit else out

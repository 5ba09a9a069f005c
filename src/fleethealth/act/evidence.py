"""Evidence bundles, captured before a drain or quarantine so the cause can be studied after the node is
reset: a metrics window from Prometheus (range queries), the last errors and Xids, Kubernetes events and
the entity's tuple history, as JSON files in one directory, indexed in SQLite (evidence(entity, ts, path,
reason)). Secrets, tokens and prompts are redacted before anything is written.

A capture never blocks the action it precedes: a source that fails is noted in the manifest.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from fleethealth.act.kube_api import Kube, KubeError
from fleethealth.act.ledger import open_autocommit
from fleethealth.act.outcome import Outcome, node_of
from fleethealth.auth.redact import redact_text as mask_url_credentials
from fleethealth.decide.model import Intent, IntentKind

REDACTED = "[REDACTED]"
SECRET_KEY = re.compile(r"(?i)(secret|token|passw|authorization|api[_-]?key|cookie|credential|private[_-]?key|"
                        r"prompt|messages|completion|session)")
SECRET_VALUES = [
    re.compile(r"(?i)\bbearer\s+[a-z0-9._~+/=-]+"),
    re.compile(r"\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"),  # JWT (service-account tokens)
    re.compile(r"\b(sk|ghp|gho|glpat|xox[bp])[-_][A-Za-z0-9_-]{10,}"),  # API keys of common services
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    re.compile(r"(?i)\b(password|passwd|token|secret|api[_-]?key|prompt)\s*[=:]\s*(\"[^\"]*\"|'[^']*'|\S+)"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
]


def redact_text(s: str) -> str:
    for pat in SECRET_VALUES:
        s = pat.sub(REDACTED, s)
    return s


def redact(obj: Any) -> Any:
    """Deep copy with secret-looking keys' values and secret-looking substrings replaced."""
    if isinstance(obj, dict):
        return {k: (REDACTED if isinstance(k, str) and SECRET_KEY.search(k) and v not in (None, "")
                    else redact(v)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


class EvidenceIndex:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._db = open_autocommit(self.path)
        self._db.execute("""CREATE TABLE IF NOT EXISTS evidence (
            id INTEGER PRIMARY KEY AUTOINCREMENT, entity TEXT NOT NULL, ts REAL NOT NULL, path TEXT NOT NULL,
            reason TEXT NOT NULL, intent_key TEXT NOT NULL DEFAULT '')""")
        self._db.execute("CREATE INDEX IF NOT EXISTS evidence_entity ON evidence(entity, ts)")

    def add(self, entity: str, ts: float, path: str, reason: str, intent_key: str = "") -> None:
        with self._lock:
            self._db.execute("INSERT INTO evidence(entity, ts, path, reason, intent_key) VALUES (?,?,?,?,?)",
                             (entity, ts, path, reason, intent_key))

    def list(self, entity: str | None = None) -> list[dict[str, Any]]:
        q = "SELECT entity, ts, path, reason, intent_key FROM evidence"
        args: tuple[Any, ...] = ()
        if entity is not None:
            q += " WHERE entity=?"
            args = (entity,)
        with self._lock:
            rows = self._db.execute(q + " ORDER BY ts DESC, id DESC", args).fetchall()
        return [{"entity": r[0], "ts": r[1], "path": r[2], "reason": r[3], "intent_key": r[4]} for r in rows]

    def latest(self, entity: str) -> dict[str, Any] | None:
        rows = self.list(entity)
        return rows[0] if rows else None

    def by_key(self, intent_key: str) -> dict[str, Any] | None:
        with self._lock:
            r = self._db.execute("SELECT entity, ts, path, reason FROM evidence WHERE intent_key=? LIMIT 1",
                                 (intent_key,)).fetchone()
        return None if r is None else {"entity": r[0], "ts": r[1], "path": r[2], "reason": r[3]}


class PrometheusRange:
    """Range queries against Prometheus' HTTP API (or Thanos/Mimir/VictoriaMetrics)."""

    def __init__(self, url: str, client: httpx.Client | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)

    def query_range(self, query: str, start: float, end: float, step: float) -> dict[str, Any]:
        r = self.client.get(f"{self.url}/api/v1/query_range",
                            params={"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                    "step": f"{max(step, 1.0):.3f}"})
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise RuntimeError(f"{r.status_code} {body.get('errorType', '')}: {body.get('error', '')}")
        return dict(body["data"])


def promql_string(value: str) -> str:
    """``value`` as the inside of a PromQL double-quoted string: backslash and double quote escaped, control
    characters as escapes, so a label value from an exporter can never end the string and add PromQL."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


_RE2_META = frozenset("\\.+*?()|[]{}^$")


def re2_escape(value: str) -> str:
    """``value`` matched literally by a Prometheus (RE2) regex. Python's ``re.escape`` also escapes ``-``
    and other characters, which PromQL's string syntax then rejects (``\\-`` is no valid escape)."""
    return "".join("\\" + ch if ch in _RE2_META else ch for ch in value)


# {node} is the node name as a PromQL string's content; {node_re} the same matched literally in a regex.
DEFAULT_QUERIES: tuple[str, ...] = (
    '{{Hostname="{node}"}}',
    '{{node="{node}"}}',
    '{{instance=~"{node_re}(:[0-9]+)?"}}',
)
XID_QUERIES: tuple[str, ...] = (
    'DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}}',
    'DCGM_EXP_XID_ERRORS_COUNT{{Hostname="{node}"}}',
)


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)[:80]


class EvidenceCollector:
    name = "evidence"
    kinds = frozenset({IntentKind.CAPTURE_EVIDENCE, IntentKind.QUARANTINE, IntentKind.DRAIN})

    def __init__(self, root: str | Path, index: EvidenceIndex, *, prometheus: PrometheusRange | None = None,
                 kube: Kube | None = None, tuple_history: Callable[[str], list[dict[str, Any]]] | None = None,
                 errors: Callable[[str], list[dict[str, Any]]] | None = None,
                 queries: Sequence[str] = DEFAULT_QUERIES, window_s: float = 1800.0, points: int = 120,
                 max_series: int = 500, reuse_s: float = 600.0, clock: Callable[[], float] = time.time,
                 on_captured: Callable[[str, str], Any] | None = None) -> None:
        self.root = Path(root)
        self.index = index
        self.prometheus = prometheus
        self.kube = kube
        self.tuple_history = tuple_history
        self.errors = errors
        self.queries = tuple(queries)
        self.window_s = window_s
        self.points = points
        self.max_series = max_series
        self.reuse_s = reuse_s
        # e.g. the state store's add_evidence_location(intent_key, path), so its evidence index has the path
        self.on_captured = on_captured
        self.clock = clock

    def link(self, entity: str) -> str | None:
        """For pages: the latest bundle of this entity (or of its node)."""
        rec = self.index.latest(entity) or self.index.latest(entity.split("/", 1)[0])
        return None if rec is None else str(rec["path"])

    def apply(self, intent: Intent) -> Outcome:
        prior = self.index.by_key(intent.key)
        if prior is not None:
            return Outcome.success(path=prior["path"], reused=True)
        if intent.kind in (IntentKind.QUARANTINE, IntentKind.DRAIN):
            # Routed before a drain/quarantine as a safety net: a CAPTURE_EVIDENCE intent usually came first.
            recent = self.index.latest(intent.entity)
            if recent is not None and self.clock() - float(recent["ts"]) < self.reuse_s:
                return Outcome.success(path=recent["path"], reused=True)
        window = intent.params.get("window_s")
        path, problems = self.capture(intent.entity, intent.reason, self.clock(), intent,
                                      window_s=None if window is None else max(float(window), self.window_s))
        return Outcome.success(path=str(path), problems=problems)

    def capture(self, entity: str, reason: str, now: float, intent: Intent | None = None,
                window_s: float | None = None) -> tuple[Path, list[str]]:
        node = node_of(intent) if intent is not None else entity.split("/", 1)[0]
        key = intent.key if intent is not None else ""
        d = self.root / f"{_safe(entity)}-{int(now)}-{key[:8] or 'manual'}"
        d.mkdir(parents=True, exist_ok=True)
        problems: list[str] = []
        files: dict[str, Any] = {}

        window_s = window_s or self.window_s
        start, end = now - window_s, now
        step = max(1.0, window_s / self.points)
        metrics: dict[str, Any] = {"start": start, "end": end, "step": step, "queries": {}}
        xids: list[dict[str, Any]] = []
        if self.prometheus is not None:
            fmt = {"node": promql_string(node), "node_re": promql_string(re2_escape(node))}
            for q in self.queries:
                query = q.format(**fmt)
                try:
                    data = self.prometheus.query_range(query, start, end, step)
                    res = data.get("result", [])
                    metrics["queries"][query] = {"series": len(res), "result": res[: self.max_series]}
                except Exception as e:
                    problems.append(f"prometheus {query}: {mask_url_credentials(str(e))}")
            for q in XID_QUERIES:
                try:
                    for s in self.prometheus.query_range(q.format(**fmt), start, end, step).get("result", []):
                        vals = [(float(t), float(v)) for t, v in s.get("values", []) if float(v) not in (0.0,)]
                        if vals:
                            xids.append({"metric": s.get("metric", {}), "last": vals[-1], "points": vals[-20:]})
                except Exception as e:
                    problems.append(f"prometheus xid: {mask_url_credentials(str(e))}")
        else:
            problems.append("no prometheus configured")
        files["metrics.json"] = metrics

        history = []
        if self.tuple_history is not None:
            try:
                history = list(self.tuple_history(entity))
            except Exception as e:
                problems.append(f"tuple history: {e}")
        files["tuples.json"] = {"entity": entity, "history": history}

        errs: list[dict[str, Any]] = []
        if self.errors is not None:
            try:
                errs = list(self.errors(entity))
            except Exception as e:
                problems.append(f"errors: {e}")
        flags = sorted({f for t in history for f in (t.get("flags") or [])})
        if intent is not None and isinstance(intent.params.get("tuple"), dict):
            flags = sorted(set(flags) | set(intent.params["tuple"].get("flags") or []))
        files["errors.json"] = {"errors": errs, "xids": xids,
                                "flags": flags, "xid_flags": [f for f in flags if f.startswith("xid")]}

        events: list[dict[str, Any]] = []
        if self.kube is not None:
            try:
                events = self.kube.list_events(field_selector=f"involvedObject.name={node}")
                for pod in self.kube.list_pods(field_selector=f"spec.nodeName={node}")[:20]:
                    md = pod.get("metadata", {})
                    events += self.kube.list_events(namespace=md.get("namespace"),
                                                    field_selector=f"involvedObject.name={md.get('name')}")
            except KubeError as e:
                problems.append(f"kubernetes events: {e.status} {e.reason}")
        files["events.json"] = {"events": [_slim_event(e) for e in events]}

        node_doc: dict[str, Any] = {}
        if self.kube is not None:
            try:
                obj = self.kube.get_node(node)
                node_doc = {"labels": obj.get("metadata", {}).get("labels"), "spec": obj.get("spec"),
                            "conditions": (obj.get("status") or {}).get("conditions"),
                            "capacity": (obj.get("status") or {}).get("capacity"),
                            "nodeInfo": (obj.get("status") or {}).get("nodeInfo"),
                            # Pods as facts only: their specs can carry secrets in env.
                            "pods": [_slim_pod(p) for p in self.kube.list_pods(field_selector=f"spec.nodeName={node}")]}
            except KubeError as e:
                problems.append(f"kubernetes node: {e.status} {e.reason}")
        files["node.json"] = node_doc

        files["manifest.json"] = {
            "entity": entity, "node": node, "ts": now, "reason": reason,
            "intent": intent.to_dict() if intent is not None else None,
            "window_s": window_s, "files": sorted(files), "problems": problems,
        }
        for name, body in files.items():
            (d / name).write_text(json.dumps(redact(body), indent=1, sort_keys=True, default=str))
        self.index.add(entity, now, str(d), reason, key)
        if self.on_captured is not None and key:
            try:
                self.on_captured(key, str(d))
            except Exception as e:  # the bundle is on disk and indexed here; the hook is best effort
                problems.append(f"on_captured: {e}")
        return d, problems


def _slim_event(e: dict[str, Any]) -> dict[str, Any]:
    md = e.get("metadata", {})
    return {"namespace": md.get("namespace"), "name": md.get("name"), "type": e.get("type"),
            "reason": e.get("reason"), "message": e.get("message"), "count": e.get("count"),
            "involvedObject": {k: (e.get("involvedObject") or {}).get(k) for k in ("kind", "name", "namespace")},
            "firstTimestamp": e.get("firstTimestamp"), "lastTimestamp": e.get("lastTimestamp"),
            "source": e.get("source")}


def _slim_pod(p: dict[str, Any]) -> dict[str, Any]:
    md, spec = p.get("metadata", {}), p.get("spec", {})
    return {"namespace": md.get("namespace"), "name": md.get("name"), "labels": md.get("labels"),
            "owners": [f"{o.get('kind')}/{o.get('name')}" for o in md.get("ownerReferences") or []],
            "phase": (p.get("status") or {}).get("phase"), "deleting": bool(md.get("deletionTimestamp")),
            "gpus": [((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu")
                     for c in spec.get("containers") or []]}

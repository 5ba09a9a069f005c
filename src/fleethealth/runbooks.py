"""Where the runbook for a reason code, an intent kind, a page or an alert lives (docs/runbooks/).

Theory of operation: pure name mapping, no I/O. A reason code's family is its first two parts
(``gate:xid:79`` -> ``gate:xid``); gate families map to ``reasons/gate-<signal>.md`` (the Xid signals share
one), ``min:``/``gmean:`` a category to ``reasons/category-<category>.md``, ``no_fresh_data`` to its own.
Intent kinds map to ``intents/<kind>.md``, pages (Alertmanager alert names the pager sends) and
Prometheus alerts to ``pages/<name>.md`` and ``alerts/<name>.md``. tests/test_runbooks.py checks that
every reason family the shipped policy can produce, every intent kind, page and alert has its file.
"""

from __future__ import annotations

BASE_URL = "https://github.com/fleethealth/fleethealth/blob/main/docs/runbooks/"

# gate signals that share a runbook
GATE_ALIASES = {"xid_count": "xid", "kernel_xid": "xid", "kernel_fallen_off": "xid"}


def reason_path(reason: str) -> str | None:
    """The runbook file (relative to docs/runbooks/) for a reason code, or None for reasons without one."""
    parts = reason.split(":")
    if parts[0] == "gate" and len(parts) > 1:
        return f"reasons/gate-{GATE_ALIASES.get(parts[1], parts[1])}.md"
    if parts[0] in ("min", "gmean") and len(parts) > 1:
        return f"reasons/category-{parts[1]}.md"
    if parts[0] == "no_fresh_data":
        return "reasons/no_fresh_data.md"
    return None


def intent_path(kind: str) -> str:
    return f"intents/{kind}.md"


def page_path(alertname: str) -> str:
    return f"pages/{alertname}.md"


def url(path: str | None) -> str | None:
    return None if path is None else BASE_URL + path

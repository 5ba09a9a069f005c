"""Secrets out of anything logged or served: credentials in URLs (``http://user:pass@host``), secret query
parameters (``?token=...``) and secret headers (Authorization, cookies, API keys).

Theory of operation: the redaction is applied where a URL leaves the process as text (a source's name, an
input issue, a log record, a status document), so a configured scrape or Prometheus URL may carry
credentials while ``/api/v1/status``, the logs and the metrics' labels never show them. ``redact_text``
finds URLs inside free text (an httpx error message quotes the URL it failed on). Pure functions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
SECRET_PARAMS = frozenset({"token", "access_token", "password", "passwd", "secret", "key", "api_key", "apikey",
                           "auth", "authorization", "signature", "sig", "x-amz-signature", "x-amz-credential"})
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key",
                            "x-auth-token", "api-key"})
# scheme://userinfo@ : the userinfo is everything up to the last @ before the host part ends (quotes and a
# raw @ included: passwords hold them)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@")
_QUERY_SECRET = re.compile(
    r"(?P<sep>[?&;])(?P<name>" + "|".join(re.escape(p) for p in sorted(SECRET_PARAMS, key=len, reverse=True))
    + r")=(?P<value>[^&#\s\"']*)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with its userinfo and secret query values replaced by ***; host, port and path kept."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in SECRET_PARAMS for k, _ in pairs):
            query = urlencode([(k, MASK if k.lower() in SECRET_PARAMS else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Every URL's credentials in free text masked (error messages, log lines)."""
    if "@" not in text and "=" not in text:
        return text
    out = _USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m.group('sep')}{m.group('name')}={MASK}", out)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: (MASK if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}


def redact_value(v: Any) -> Any:
    """A JSON-like document with every string redacted (a status document before it is served)."""
    if isinstance(v, str):
        return redact_text(v)
    if isinstance(v, Mapping):
        return {(redact_text(k) if isinstance(k, str) else k): redact_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [redact_value(x) for x in v]
    return v


class RedactingFilter(logging.Filter):
    """A logging filter (on a handler) that masks credentials in every record's final message."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler to report
            return True
        red = redact_text(msg)
        if red != msg:
            record.msg, record.args = red, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact_text(text)
        return True


LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access")


def install_log_redaction(names: tuple[str, ...] = LOGGERS) -> None:
    """Put a RedactingFilter on every handler of these loggers (the root logger and uvicorn's, whose access
    log shows query strings), and on the last-resort handler, once each. Call after logging is set up."""
    handlers = [h for n in names for h in logging.getLogger(n or None).handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for h in handlers:
        if not any(isinstance(f, RedactingFilter) for f in h.filters):
            h.addFilter(RedactingFilter())

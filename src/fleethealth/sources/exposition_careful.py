"""The careful path of the exposition parser: one line at a time, every rejected line an issue with its
number and reason.

Theory of operation. The fast paths (``exposition_blocks``) prove whole blocks or give up having added
nothing; whatever they cannot prove comes here. Each line is matched against the full grammar (name,
quote-aware label block, value, optional timestamp, optional exemplar or comment; or a metric name quoted
inside the braces), its label block goes through the same label parser as the fast paths, and its value
and timestamp through float() with Prometheus' restrictions (no ``1_000``, no NaN timestamps). Samples
are collected in the context's lists and flushed in line order with the fast paths' samples.
"""

from __future__ import annotations

import re

from fleethealth.sources.exposition_blocks import _Ctx
from fleethealth.sources.exposition_labels import _NUL_REASON, _unescape
from fleethealth.sources.exposition_values import _parse_number, value_problem

# One sample line, for the careful path: name, optional label block (quote-aware), value, optional
# timestamp, optional exemplar / trailing comment after " # ".
_LINE_RE = re.compile(
    rb"[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*"
    rb'(\{(?:[^"}]|"[^"\\]*(?:\\.[^"\\]*)*")*\})?'
    rb"[ \t]*([^ \t]+)(?:[ \t]+([^ \t#][^ \t]*))?(?:[ \t]+#.*)?[ \t]*"
)
# A line whose metric name is quoted inside the braces (Prometheus 3 / OpenMetrics 2: `{"a.b_total"} 1`,
# `{"a.b",x="y"} 1`): the label block, value, timestamp; the name is the block's first, bare, quoted item.
_QLINE_RE = re.compile(
    rb'[ \t]*(\{(?:[^"}]|"[^"\\]*(?:\\.[^"\\]*)*")*\})'
    rb"[ \t]*([^ \t]+)(?:[ \t]+([^ \t#][^ \t]*))?(?:[ \t]+#.*)?[ \t]*"
)
_QNAME_RE = re.compile(rb'[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(?:,|$)')


def _quoted_name_line(s: bytes) -> tuple[str, bytes, bytes, bytes | None] | str:
    """(name, label block without the name, value, timestamp) of a line whose metric name is quoted inside
    its braces (`{"a.b_total",x="y"} 1`), or why the line is malformed."""
    m = _QLINE_RE.fullmatch(s)
    if m is None:
        return "malformed line"
    blabels, bvalue, bts = m.groups()
    inner = blabels[1:-1]
    q = _QNAME_RE.match(inner)
    if q is None:
        return "malformed line"
    try:
        name = _unescape(q.group(1).decode("utf-8"))
    except UnicodeDecodeError:
        return "invalid UTF-8 in the metric name"
    if not name:
        return "empty metric name"
    return name, b"{" + inner[q.end():] + b"}", bvalue, bts


def _slow_block(ctx: _Ctx, chunk: bytes, first: int) -> int:
    """Careful line-by-line parse; every rejected line becomes an issue with its number. Returns the
    number of lines after the comment line."""
    lines = chunk.split(b"\n")[1:]
    for j, line in enumerate(lines):
        _parse_line(ctx, line, first + j)
    return len(lines)


def _parse_line(ctx: _Ctx, line: bytes, ln: int) -> None:
    s = line.strip()
    if not s or s.startswith(b"#"):
        return
    if b"\0" in s:  # (a NUL in a label block is also refused by the label parser, on every path)
        ctx.issue(ln, _NUL_REASON, s.replace(b"\0", b"\\0"))
        return
    m = _LINE_RE.fullmatch(s)
    if m is not None:
        bname, blabels, bvalue, bts = m.groups()
        name = bname.decode("ascii")
    else:
        q = _quoted_name_line(s)
        if isinstance(q, str):
            ctx.issue(ln, q, s)
            return
        name, blabels, bvalue, bts = q
    sid = ctx.series(blabels if blabels is not None else b"{}")
    if isinstance(sid, str):
        ctx.issue(ln, sid, s)
        return
    value = _parse_number(bvalue)
    if value is None:
        ctx.issue(ln, "invalid value", s)
        return
    ts = ctx.default_ts
    if bts is not None:
        t = _parse_number(bts)
        if t is None or t != t or t in (float("inf"), float("-inf")):
            ctx.issue(ln, "invalid timestamp", s)
            return
        ts = t / ctx.ts_div
    problem = value_problem(name, value, ctx.is_counter(name))
    if problem is not None:
        ctx.issue(ln, problem, s)
        return
    ctx.m.append(ctx.builder.metric_id(name))
    ctx.s.append(sid)
    ctx.v.append(value)
    ctx.t.append(ts)
    ctx.ln.append(ln)

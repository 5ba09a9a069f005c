"""An entity's score/state/intent timeline as an inline SVG (the fleet view's entity page), from the rows the
state store keeps: transitions (each with the score at that moment) and intents, and the score samples a
``ScoreTrail`` kept of the cycles the API saw.

Theory of operation: ``timeline_svg`` is pure; rows, samples, the window and the current score come in, SVG
text comes out. The store keeps a score with every transition, not every cycle; the trail (held by the
HTTP app, fed each published cycle it sees, at most one sample a minute for six hours, a numpy row per
sample) fills in between. With samples, the line follows them (the scores at state changes are dots on
it); without (a fresh controller, an older window), it is a step line through the score at each state
change, ending at the score of the last cycle. Unknown breaks the line (a gap, never drawn as a value). Behind it, a band per lifecycle state (the colours of
the view's state marks); above it, a tick per intent with its kind and reason as a tooltip. It scales to
its container (viewBox, width 100%), so it reads on a phone as on a laptop. No script.
"""

from __future__ import annotations

import html
import math
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STATE_FILL = {
    "READY": "#c8e6c9", "DEGRADED": "#fff59d", "DRAINING": "#ffcc80", "QUARANTINED": "#ef9a9a",
    "RECOVERING": "#bbdefb", "FAILED": "#ce93d8", "STARTING": "#eeeeee", "WARMING": "#e3f2fd",
}
INTENT_COLOUR = {"quarantine": "#c62828", "drain": "#ef6c00", "page": "#6a1b9a", "schedule_reset": "#1565c0",
                 "run_active_test": "#00838f", "capture_evidence": "#546e7a"}
W, H = 420.0, 132.0
X0, X1, Y0, Y1 = 26.0, 414.0, 16.0, 110.0


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M", time.gmtime(ts))


def state_spans(transitions: Sequence[Mapping[str, Any]], start: float, end: float,
                state_now: str) -> list[tuple[float, float, str]]:
    """(from, to, state) covering [start, end]: the state before the window is the last transition's
    ``to`` before it, else the first one's ``from`` in it, else ``state_now``."""
    rows = sorted(transitions, key=lambda r: float(r["ts"]))
    before = [r for r in rows if float(r["ts"]) < start]
    inside = [r for r in rows if start <= float(r["ts"]) <= end]
    state = str(before[-1]["to"]) if before else str(inside[0]["from"]) if inside else state_now
    out: list[tuple[float, float, str]] = []
    t = start
    for r in inside:
        ts = float(r["ts"])
        if ts > t:
            out.append((t, ts, state))
        t, state = ts, str(r["to"])
    if end > t:
        out.append((t, end, state))
    return out


def score_points(transitions: Sequence[Mapping[str, Any]], start: float, end: float,
                 value_now: float | None) -> list[tuple[float, float | None]]:
    """(ts, score) at the window's start (the score of the last transition before it), at each transition
    inside it, and now."""
    rows = sorted(transitions, key=lambda r: float(r["ts"]))
    before = [r for r in rows if float(r["ts"]) < start]
    pts: list[tuple[float, float | None]] = []
    if before:
        pts.append((start, _val(before[-1].get("value"))))
    pts += [(float(r["ts"]), _val(r.get("value"))) for r in rows if start <= float(r["ts"]) <= end]
    pts.append((end, value_now))
    return pts


def _val(v: Any) -> float | None:
    if v is None:
        return None
    x = float(v)
    return None if math.isnan(x) else min(1.0, max(0.0, x))


class ScoreTrail:
    """Node and replica scores of the cycles seen, at most one sample per ``every_s``, kept ``keep_s``. A
    sample is one float32 row over the entities seen so far (NaN: unknown or absent)."""

    def __init__(self, every_s: float = 60.0, keep_s: float = 6 * 3600.0) -> None:
        self.every_s = every_s
        self.keep_s = keep_s
        self.ts: deque[float] = deque()
        self.rows: deque[np.ndarray] = deque()
        self.col: dict[str, int] = {}
        self._ix: dict[str, tuple[list[str], np.ndarray]] = {}  # per kind: its names list -> columns

    def _columns(self, kind: str, names: list[str]) -> np.ndarray:
        hit = self._ix.get(kind)
        if hit is not None and (hit[0] is names or hit[0] == names):
            return hit[1]
        ix = np.fromiter((self.col.setdefault(n, len(self.col)) for n in names), np.int64, len(names))
        self._ix[kind] = (list(names), ix)
        return ix

    def observe(self, now: float, health: Any) -> None:
        if health is None or (self.ts and now - self.ts[-1] < self.every_s):
            return
        parts = []
        for kind in ("node", "replica"):
            ks = getattr(health, "kinds", {}).get(kind)
            if ks is not None and ks.names:
                parts.append((self._columns(kind, ks.names), np.asarray(ks.value, np.float32)))
        row = np.full(len(self.col), np.nan, np.float32)
        for ix, vals in parts:
            row[ix] = vals
        self.ts.append(now)
        self.rows.append(row)
        while self.ts and now - self.ts[0] > self.keep_s:
            self.ts.popleft()
            self.rows.popleft()

    def series(self, entity: str, start: float) -> list[tuple[float, float | None]]:
        """(ts, score or None) of one entity from ``start`` on; [] when it was never seen."""
        c = self.col.get(entity)
        if c is None:
            return []
        out: list[tuple[float, float | None]] = []
        for t, row in zip(self.ts, self.rows, strict=True):
            if t >= start:
                v = float(row[c]) if c < row.size else math.nan
                out.append((t, None if math.isnan(v) else v))
        return out


def timeline_svg(transitions: Sequence[Mapping[str, Any]], intents: Sequence[Mapping[str, Any]], *, start: float,
                 end: float, state_now: str, value_now: float | None, known_from: float | None = None,
                 samples: Sequence[tuple[float, float | None]] = ()) -> str:
    """``known_from``: when the records begin (the controller's first cycle): before it, a grey "no record"
    band, not a state. ``samples``: scores sampled between state changes (``ScoreTrail.series``)."""
    span = max(end - start, 1.0)

    def x(ts: float) -> float:
        return X0 + (min(max(ts, start), end) - start) / span * (X1 - X0)

    def y(v: float) -> float:
        return Y1 - v * (Y1 - Y0)

    parts = [f'<svg class="timeline" id="timeline" viewBox="0 0 {W:.0f} {H:.0f}" width="100%" role="img" '
             f'xmlns="http://www.w3.org/2000/svg" aria-label="score, state and intents over the last '
             f'{span / 3600:.1f} h" style="max-width:760px;display:block">']
    if known_from is not None and known_from > start:
        parts.append(f'<rect class="band" data-state="none" x="{x(start):.1f}" y="{Y0}" '
                     f'width="{max(x(known_from) - x(start), 0.6):.1f}" height="{Y1 - Y0:.0f}" fill="#f5f5f5">'
                     f"<title>no record before {_clock(known_from)} UTC</title></rect>")
    first = start if known_from is None else max(start, known_from)
    for a, b, st in state_spans(transitions, first, end, state_now):
        parts.append(f'<rect class="band" data-state="{_e(st)}" x="{x(a):.1f}" y="{Y0}" '
                     f'width="{max(x(b) - x(a), 0.6):.1f}" height="{Y1 - Y0:.0f}" fill="{STATE_FILL.get(st, "#fff")}">'
                     f"<title>{_e(st)} {_clock(a)}-{_clock(b)} UTC</title></rect>")
    pts = score_points(transitions, first, end, value_now)
    seg: list[str] = []

    def flush() -> None:
        if len(seg) > 1:
            parts.append(f'<polyline class="score" fill="none" stroke="#0d47a1" stroke-width="1.6" '
                         f'points="{" ".join(seg)}"/>')
        seg.clear()

    sampled = sorted([(t, v) for t, v in samples if first <= t <= end] + [(end, value_now)])
    if len(sampled) > 1:
        # the sampled scores, and a dot for the score at each state change
        for t, v in sampled:
            if v is None:
                flush()
                continue
            seg.append(f"{x(t):.1f},{y(v):.1f}")
        flush()
        for t, v in pts[:-1]:
            if v is not None:
                parts.append(f'<circle class="at-change" cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.2" fill="#0d47a1"/>')
    else:
        # a step line through the score at each state change, broken where it was unknown
        for (t, v), (t_next, _) in zip(pts, pts[1:] + [(end, None)], strict=True):
            if v is None:
                flush()
                continue
            seg += [f"{x(t):.1f},{y(v):.1f}", f"{x(t_next):.1f},{y(v):.1f}"]
        flush()
    for t, v in pts:
        if v is None:
            parts.append(f'<text x="{x(t):.1f}" y="{(Y0 + Y1) / 2:.0f}" font-size="9" fill="#424242">?</text>')
    for it in intents:
        ts = float(it["ts"])
        if not start <= ts <= end:
            continue
        kind = str(it.get("intent", it.get("kind", "")))
        col = INTENT_COLOUR.get(kind, "#37474f")
        parts.append(f'<g class="intent" data-intent="{_e(kind)}"><line x1="{x(ts):.1f}" x2="{x(ts):.1f}" y1="4" '
                     f'y2="{Y1:.0f}" stroke="{col}" stroke-width="1.2" stroke-dasharray="2,2"/>'
                     f'<path d="M{x(ts) - 4:.1f},4 L{x(ts) + 4:.1f},4 L{x(ts):.1f},11 Z" fill="{col}"/>'
                     f"<title>{_e(kind)}: {_e(it.get('reason'))} at {_clock(ts)} UTC</title></g>")
    for v in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{X0 - 4}" y="{y(v) + 3:.1f}" font-size="9" text-anchor="end" fill="#555">{v:.1f}</text>')
    step = next((s for s in (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0, 86400.0)
                 if span / s <= 6), 86400.0)
    t = math.ceil(start / step) * step
    while t <= end:
        if X0 + 10 < x(t) < X1 - 10:
            parts.append(f'<text x="{x(t):.1f}" y="{H - 8:.0f}" font-size="9" text-anchor="middle" fill="#555">'
                         f"{_clock(t)}</text>")
        t += step
    parts.append(f'<rect x="{X0}" y="{Y0}" width="{X1 - X0:.0f}" height="{Y1 - Y0:.0f}" fill="none" stroke="#bbb"/>')
    parts.append("</svg>")
    return "".join(parts)


def legend() -> str:
    items = "".join(f'<span style="background:{c}">{s}</span>' for s, c in STATE_FILL.items()
                    if s not in ("STARTING", "WARMING")) + '<span style="background:#f5f5f5">no record</span>'
    return (f'<div class="legend">{items} <span>— score (sampled each minute; dots: at a state change)</span>'
            "<span>▼ intent (hover for the reason)</span></div>")

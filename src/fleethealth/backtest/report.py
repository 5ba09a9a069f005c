"""The backtest's HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched).

Sections: the verdict (targets), the baseline comparison table, the fleet KPIs per pool, the injected
faults against what each arm did, what fleethealth decided (every intent and state change with its
reason), score timelines of the affected entities (state bands, thresholds, fault onsets), a fleet
heatmap (every node and replica over time), and the definitions of every figure.
"""

from __future__ import annotations

import html
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from fleethealth.backtest.arms import BASELINE_HELP, PRODUCT
from fleethealth.backtest.runner import BacktestRun
from fleethealth.decide.model import IntentKind, State
from fleethealth.review.kpis import summary_table

STATE_COLOURS = {
    State.READY: "#e8f5e9", State.DEGRADED: "#fff3c4", State.DRAINING: "#ffd8a8", State.QUARANTINED: "#ffc9c9",
    State.RECOVERING: "#d0ebff", State.FAILED: "#e599f7", State.STARTING: "#f1f3f5", State.WARMING: "#f1f3f5",
}
COLUMNS = [
    ("precision", "precision", "{:.2f}"), ("recall", "recall", "{:.2f}"),
    ("detection_s", "detect (median)", "dur"), ("removal_s", "remove (median)", "dur"),
    ("quarantines", "quarantines", "{}"), ("false_quarantines", "false", "{}"),
    ("flaps_per_node_day", "flaps/node/day", "{:.3f}"), ("pages", "pages", "{}"), ("tickets", "tickets", "{}"),
    ("budget_exhaustions", "budget exhausted", "{}"), ("job_slowdown_gpu_h", "job GPU-h lost, slow undetected", "{:.1f}"),
]

CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px 32px;color:#212529;
 background:#fff;max-width:1320px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #dee2e6;
 padding-bottom:4px} .sub{color:#6c757d;margin:0 0 12px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{padding:5px 9px;border-bottom:1px solid #e9ecef;
 text-align:right} th{background:#f8f9fa;font-weight:600} td.l,th.l{text-align:left}
tr.product td{font-weight:600;background:#f3f8ff} .ok{color:#2b8a3e} .bad{color:#c92a2a;font-weight:600}
.pill{display:inline-block;border-radius:10px;padding:2px 10px;margin:2px 4px 2px 0;font-size:12px}
.pill.ok{background:#d3f9d8;color:#2b8a3e} .pill.bad{background:#ffe3e3;color:#c92a2a}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:10px 0}
.card{border:1px solid #dee2e6;border-radius:8px;padding:10px 14px;min-width:120px}
.card .v{font-size:22px;font-weight:600} .card .k{font-size:12px;color:#6c757d}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border:1px solid #ced4da}
svg text{font-family:inherit} .note{font-size:12px;color:#6c757d}
@media (max-width:700px){body{margin:8px;padding:0} table{display:block;overflow-x:auto}
 svg:not(.heatmap){max-width:100%;height:auto} .card{min-width:0;flex:1 1 38%;padding:6px 10px}
 .card .v{font-size:18px}}
"""


def _dur(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _fmt(v: Any, f: str) -> str:
    if v is None:
        return "-"
    if f == "dur":
        return _dur(v)
    return f.format(v)


def _esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _colour(v: float) -> str:
    """Score -> colour: red (0) through amber (0.5) to green (1); grey for unknown."""
    if v is None or math.isnan(v):
        return "#adb5bd"
    v = min(1.0, max(0.0, v))
    stops = [(0.0, (201, 42, 42)), (0.3, (240, 140, 0)), (0.7, (250, 210, 80)), (0.85, (148, 216, 45)),
             (1.0, (47, 158, 68))]
    for (a, ca), (b, cb) in zip(stops[:-1], stops[1:], strict=True):
        if v <= b:
            w = (v - a) / (b - a) if b > a else 0.0
            c = tuple(int(ca[k] + (cb[k] - ca[k]) * w) for k in range(3))
            return f"#{c[0]:02x}{c[1]:02x}{c[2]:02x}"
    return "#2f9e44"


def _ticks(span_s: float, most: int = 16) -> list[float]:
    """Tick offsets (seconds from the start) at a round step giving at most ``most`` ticks."""
    for step_min in (5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880):
        if span_s / (step_min * 60) <= most:
            break
    step = step_min * 60.0
    return [k * step for k in range(int(span_s // step) + 1)]


def _tick_label(off: float) -> str:
    h, m = int(off // 3600), int(off % 3600 // 60)
    if off >= 86400 and off % 86400 == 0:
        return f"{h // 24}d"
    return f"{h}h" if m == 0 else (f"{m}m" if h == 0 else f"{h}h{m:02d}")


def _state_intervals(run: BacktestRun, entity: str) -> list[tuple[float, float, State]]:
    trs = [t for t in run.arms[PRODUCT].transitions if t.entity == entity]
    out = []
    cur, since = State.READY, run.start
    for t in trs:
        if t.ts > since:
            out.append((since, t.ts, cur))
        cur, since = t.to_state, t.ts
    out.append((since, run.end, cur))
    return out


def _affected(run: BacktestRun, limit: int = 8) -> list[str]:
    """Entities worth a timeline: those named by ground truth (node or replica) first, then those the
    product acted on."""
    names = set(run.timeline.names)
    out: list[str] = []
    for g in sorted(run.truths, key=lambda g: (not g.faulty, g.onset)):
        e = g.entity if g.kind != "gpu" else g.entity.split("/")[0]
        if e in names and e not in out:
            out.append(e)
    for t in run.arms[PRODUCT].transitions:
        if t.to_state in (State.DEGRADED, State.QUARANTINED, State.DRAINING) and t.entity not in out \
                and t.entity in names:
            out.append(t.entity)
    return out[:limit]


def _timeline_svg(run: BacktestRun, entity: str, mat: np.ndarray, width: int = 1240, height: int = 150) -> str:
    tl = run.timeline
    if entity not in tl.names or not tl.ts:
        return ""
    j = tl.names.index(entity)
    ts = np.asarray(tl.ts)
    vals = mat[:, j]
    x0, x1, y0, y1 = 48, width - 12, 14, height - 22
    span = max(run.end - run.start, 1.0)

    def X(t: float) -> float:
        return x0 + (t - run.start) / span * (x1 - x0)

    def Y(v: float) -> float:
        return y1 - v * (y1 - y0)

    parts = [f'<svg class="timeline" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="score timeline of {_esc(entity)}">']
    for a, b, st in _state_intervals(run, entity):
        parts.append(f'<rect x="{X(a):.1f}" y="{y0}" width="{max(X(b) - X(a), 0.5):.1f}" height="{y1 - y0}" '
                     f'fill="{STATE_COLOURS.get(st, "#fff")}"><title>{st} {_dur(a - run.start)} - '
                     f'{_dur(b - run.start)}</title></rect>')
    lc = run.policy.lifecycle
    for thr, lab in ((lc.degraded_below, "degraded"), (lc.quarantine_below, "quarantine")):
        parts.append(f'<line x1="{x0}" x2="{x1}" y1="{Y(thr):.1f}" y2="{Y(thr):.1f}" stroke="#868e96" '
                     f'stroke-dasharray="3,3" stroke-width="0.8"/><text x="{x1 - 4}" y="{Y(thr) - 3:.1f}" '
                     f'font-size="10" fill="#868e96" text-anchor="end">{lab} {thr}</text>')
    # the score line, broken where unknown
    seg: list[str] = []
    segs: list[list[str]] = []
    for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
        if math.isnan(v):
            if seg:
                segs.append(seg)
            seg = []
            continue
        seg.append(f"{X(t):.1f},{Y(v):.1f}")
    if seg:
        segs.append(seg)
    for s in segs:
        parts.append(f'<polyline fill="none" stroke="#1c7ed6" stroke-width="1.4" points="{" ".join(s)}"/>')
    unknown = np.isnan(vals)
    if unknown.any():
        for t in ts[unknown].tolist():
            parts.append(f'<rect x="{X(t):.1f}" y="{y1 + 1}" width="2" height="4" fill="#868e96"/>')
    for g in run.truths:
        ent = g.entity.split("/")[0] if g.kind == "gpu" else g.entity
        if ent != entity:
            continue
        xo = X(g.onset)
        col = "#e03131" if g.faulty else "#f08c00"
        parts.append(f'<line x1="{xo:.1f}" x2="{xo:.1f}" y1="{y0 - 4}" y2="{y1}" stroke="{col}" stroke-width="1.6"/>'
                     f'<text x="{xo + 3:.1f}" y="{y0 + 8}" font-size="11" fill="{col}">{_esc(g.fault)}'
                     f'{" (faulty)" if g.faulty else ""}</text>')
        if g.end is not None:
            xe = X(g.end)
            parts.append(f'<line x1="{xe:.1f}" x2="{xe:.1f}" y1="{y0}" y2="{y1}" stroke="{col}" '
                         f'stroke-dasharray="2,2"/>')
    for v in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{x0 - 6}" y="{Y(v) + 4:.1f}" font-size="10" text-anchor="end" fill="#495057">'
                     f'{v:.1f}</text>')
    for off in _ticks(span):
        xx = X(run.start + off)
        parts.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{y1}" y2="{y1 + 4}" stroke="#495057"/>'
                     f'<text x="{xx:.1f}" y="{height - 4}" font-size="10" text-anchor="middle" fill="#495057">'
                     f'{_tick_label(off)}</text>')
    parts.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" stroke="#ced4da"/>')
    parts.append("</svg>")
    return "".join(parts)


def _heatmap_svg(run: BacktestRun, mat: np.ndarray, width: int = 1240, max_cols: int = 288) -> str:
    tl = run.timeline
    if not tl.ts or not tl.names:
        return "<p class='note'>no cycles</p>"
    order = sorted(range(len(tl.names)), key=lambda i: (tl.kinds.get(tl.names[i], ""), tl.names[i]))
    n_rows = len(order)
    n = mat.shape[0]
    cols = min(max_cols, n)
    edges = np.linspace(0, n, cols + 1).astype(int)
    # 9 px rows (labels readable on every row) up to 400 rows; the page scrolls rather than shrinking them
    row_h = 9 if n_rows <= 400 else max(3, 3600 // n_rows)
    x0, y0 = 128, 6
    cw = (width - x0 - 10) / cols
    height = y0 + n_rows * row_h + 28
    parts = [f'<svg class="heatmap" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="fleet heatmap">']
    with np.errstate(all="ignore"):
        for r, j in enumerate(order):
            col = mat[:, j]
            y = y0 + r * row_h
            for c in range(cols):
                a, b = edges[c], max(edges[c + 1], edges[c] + 1)
                chunk = col[a:b]
                v = float(np.nanmin(chunk)) if not np.isnan(chunk).all() else float("nan")
                parts.append(f'<rect x="{x0 + c * cw:.2f}" y="{y}" width="{cw + 0.3:.2f}" height="{row_h}" '
                             f'fill="{_colour(v)}"/>')
            if row_h >= 7 or r % max(1, 8 // row_h) == 0:
                parts.append(f'<text x="{x0 - 4}" y="{y + row_h - 1}" font-size="{min(9, row_h + 2)}" '
                             f'text-anchor="end" fill="#495057">{_esc(tl.names[j])}</text>')
    span = max(run.end - run.start, 1.0)
    for g in run.truths:
        if g.onset < run.end:
            xo = x0 + (g.onset - run.start) / span * (width - x0 - 10)
            parts.append(f'<line x1="{xo:.1f}" x2="{xo:.1f}" y1="{y0}" y2="{y0 + n_rows * row_h}" stroke="#000" '
                         f'stroke-opacity="0.25" stroke-dasharray="2,3"><title>{_esc(g.fault)} onset</title></line>')
    for off in _ticks(span):
        xx = x0 + off / span * (width - x0 - 10)
        parts.append(f'<text x="{xx:.1f}" y="{height - 8}" font-size="10" text-anchor="middle" fill="#495057">'
                     f'{_tick_label(off)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_report(run: BacktestRun, result: dict[str, Any]) -> str:
    sc = run.scenario
    mat = run.timeline.matrix()
    arms: list[tuple[str, dict[str, Any]]] = [(PRODUCT, result)] + list(result.get("baselines", {}).items())
    when = datetime.fromtimestamp(run.start, UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
           "<meta name='viewport' content='width=device-width, initial-scale=1'>",
           f"<title>fleethealth backtest: {_esc(sc.name)}</title><style>{CSS}</style></head><body>"]
    out.append(f"<h1 id='title'>Backtest: {_esc(sc.name)}</h1>")
    out.append(f"<p class='sub'>{_esc(sc.description)}<br>{run.gpus} GPUs, {len(run.nodes)} nodes, "
               f"{len(run.replica_node)} serving replicas; {_dur(run.end - run.start)} simulated from {when} at "
               f"{run.step_s:.0f} s telemetry, decisions every {run.cycle_s:.0f} s (and on every Xid/OOM event); "
               f"policy {_esc(result.get('policy_version', ''))}; random seed {sc.seed}.</p>")
    # verdict
    out.append("<div id='targets'>")
    for k, ok in result.get("targets", {}).items():
        out.append(f"<span class='pill {'ok' if ok else 'bad'}'>{'&#10003;' if ok else '&#10007;'} {_esc(k)}</span>")
    out.append("</div><div class='cards'>")
    for key, label, f in COLUMNS[:6] + COLUMNS[7:8]:
        out.append(f"<div class='card'><div class='v'>{_fmt(result.get(key), f)}</div>"
                   f"<div class='k'>{_esc(label)}</div></div>")
    out.append("</div>")
    # comparison table
    out.append("<h2>fleethealth against the baselines (same telemetry)</h2>")
    out.append("<table id='comparison'><tr><th class='l'>arm</th>"
               + "".join(f"<th>{_esc(lab)}</th>" for _, lab, _ in COLUMNS) + "<th class='l'>fails on</th></tr>")
    for name, m in arms:
        fails = [k for k, ok in m.get("targets", {}).items() if not ok]
        cells = []
        for key, _, f in COLUMNS:
            v = m.get(key)
            cls = ""
            if key in ("precision", "recall") and v is not None:
                cls = "ok" if v >= 0.95 else "bad"
            elif key == "false_quarantines" and v:
                cls = "bad"
            cells.append(f"<td class='{cls}'>{_fmt(v, f)}</td>")
        desc = "the product: gates, min across categories, confidence, dwell, budgets" if name == PRODUCT \
            else BASELINE_HELP.get(name, "")
        out.append(f"<tr class='{'product' if name == PRODUCT else ''}'><td class='l' title='{_esc(desc)}'>"
                   f"{_esc(name)}</td>{''.join(cells)}<td class='l {'bad' if fails else 'ok'}'>"
                   f"{_esc(', '.join(fails) or 'none')}</td></tr>")
    out.append("</table>")
    out.append("<p class='note'>" + "<br>".join(f"<b>{_esc(k)}</b>: {_esc(v)}" for k, v in BASELINE_HELP.items()
                                                if k in result.get("baselines", {})) + "</p>")
    out.append(_kpi_section(result))
    # incidents
    out.append("<h2>Injected faults and what each arm did</h2>")
    out.append("<table id='incidents'><tr><th class='l'>fault</th><th class='l'>where</th><th>onset</th>"
               "<th class='l'>right action</th>"
               + "".join(f"<th>{_esc(n)}</th>" for n, _ in arms) + "</tr>")
    per_arm = {n: {(r["fault"], r["node"], r["onset_s"]): r for r in m.get("incidents", [])} for n, m in arms}
    for r in result.get("incidents", []):
        ikey = (r["fault"], r["node"], r["onset_s"])
        cells = []
        for n, _ in arms:
            x = per_arm[n].get(ikey)
            if x is None:
                cells.append("<td>-</td>")
                continue
            txt = ("&#10003; " if x["action_ok"] else "&#10007; ") + (_dur(x["response_s"]) if x["response_s"]
                                                                      is not None else "no response")
            cells.append(f"<td class='{'ok' if x['action_ok'] else 'bad'}' title='{_esc(x['first_response'])}'>"
                         f"{txt}</td>")
        out.append(f"<tr><td class='l'>{_esc(r['fault'])}</td><td class='l'>{_esc(', '.join(r['entities'][:3]))}"
                   f"</td><td>{_dur(r['onset_s'])}</td><td class='l'>{_esc(r['expected'])}</td>{''.join(cells)}</tr>")
    if not result.get("incidents"):
        out.append(f"<tr><td class='l' colspan='{4 + len(arms)}'>no fault that calls for an action "
                   "(any quarantine here is a false one)</td></tr>")
    out.append("</table>")
    fq = [(n, q) for n, m in arms for q in m.get("false_quarantine_list", [])]
    if fq:
        out.append("<table id='false'><tr><th class='l'>arm</th><th>when</th><th class='l'>entity</th>"
                   "<th class='l'>why it is false</th></tr>")
        for n, q in fq[:60]:
            out.append(f"<tr><td class='l'>{_esc(n)}</td><td>{_dur(q['ts_s'])}</td><td class='l'>{_esc(q['entity'])}"
                       f"</td><td class='l'>{_esc(q['why'])}</td></tr>")
        if len(fq) > 60:
            out.append(f"<tr><td class='l' colspan='4'>... and {len(fq) - 60} more</td></tr>")
        out.append("</table>")
    out.append(_decisions_section(run))
    # timelines
    out.append("<h2>Score timelines of the affected entities (fleethealth)</h2><div class='legend'>")
    for st in (State.READY, State.DEGRADED, State.DRAINING, State.QUARANTINED, State.RECOVERING, State.FAILED):
        out.append(f"<span><i style='background:{STATE_COLOURS[st]}'></i>{st}</span>")
    out.append("<span><i style='background:#e03131'></i>fault onset (faulty)</span>"
               "<span><i style='background:#f08c00'></i>event, not a fault</span></div>")
    aff = _affected(run)
    if not aff:
        out.append("<p class='note'>no entity was affected</p>")
    for e in aff:
        out.append(f"<h3 style='font-size:14px;margin:12px 0 2px'>{_esc(e)}</h3>{_timeline_svg(run, e, mat)}")
    out.append("<h2>Fleet heatmap (every node and replica, worst score per column)</h2>")
    out.append("<div class='legend'>" + "".join(
        f"<span><i style='background:{_colour(v)}'></i>{v:.1f}</span>" for v in (1.0, 0.85, 0.7, 0.5, 0.3, 0.0))
        + "<span><i style='background:#adb5bd'></i>unknown</span></div>")
    out.append(f"<div style='overflow-x:auto'>{_heatmap_svg(run, mat)}</div>")
    out.append(_definitions_section())
    out.append(f"<p class='note'>fleethealth backtest; {run.steps} telemetry steps, "
               f"{result.get('cycles', 0)} decision cycles; {run.cpu_s:.1f} CPU s.</p></body></html>")
    return "".join(out)


# What each figure means, in the words the report uses (backtest.metrics and review.kpis define them).
DEFINITIONS: list[tuple[str, str]] = [
    ("precision", "true quarantines / all quarantines judged one by one; a quarantine is true when ground truth "
                  "says the node (or a GPU or replica on it) had a fault wanting removal, active at the time "
                  "(or ended under 30 min before). n/a when nothing was quarantined."),
    ("recall", "faults wanting removal that were quarantined while active / all such faults; 100% when none "
               "was due."),
    ("detect (median)", "from a fault's onset to the first response: DEGRADED, DRAINING, QUARANTINED or "
                        "FAILED, a router weight below 1, or a remediation intent (a page, for faults that "
                        "want a page)."),
    ("remove (median)", "from onset to the node, or a replica on it, leaving service (QUARANTINED or "
                        "DRAINING), over caught faults."),
    ("quarantines / false", "entries into QUARANTINED; false: those no fault justified (members of a "
                            "correlated event are judged as a group: budget held and a human paged)."),
    ("flaps/node/day", "returns to the state a node just left, within an hour, per node per simulated day."),
    ("pages / budget exhausted", "pages that open something (an incident's updates and resolution do not "
                                 "count); budget exhausted: pages sent because a quarantine budget ran out."),
    ("job GPU-h lost, slow undetected (baseline table)", "GPU-hours the jobs lost while a truly faulty node's "
                                    "ranks ran slow and the node was not yet removed (a synchronous job runs at "
                                    "its slowest rank's pace): what leaving a node in costs. JSON: "
                                    "job_slowdown_gpu_h (also under its old name gpu_hours_lost)."),
    ("node GPU-hours lost (KPIs)", "GPU-hours of nodes isolated (DRAINING, QUARANTINED, RECOVERING, FAILED), "
                                   "else of unknown health, else slow (DEGRADED); each hour counted once: what "
                                   "removing a node costs. JSON: kpis.POOL.lost_gpu_h."),
    ("GPU goodput (training goodput)", "1 - node GPU-hours lost / GPU-hours, where a node's GPU-hours are lost while it is "
                         "isolated (DRAINING, QUARANTINED, RECOVERING, FAILED), else while its health is "
                         "unknown, else while DEGRADED (slow); each hour counted once."),
    ("serving SLO attainment", "share of replica time, among replicas with known SLO signals, in which every "
                               "SLO signal (TTFT, inter-token latency, errors) was within its error budget "
                               "on every burn-rate window."),
    ("quarantine precision (KPIs)", "the live figure: quarantines confirmed by an active test failing, a "
                                    "hard gate or FAILED / all decided quarantines, as `fleethealth review` "
                                    "counts them from the controller's own records (no ground truth)."),
    ("time to detect / repair (KPIs)", "from the fault's onset (ground truth) to the entity's first "
                                       "isolation / to READY again; open incidents are not counted."),
    ("mean node health", "the mean of known node scores over the run."),
]

# Intents that are bookkeeping, not decisions a person reads about (listed by count only).
ROUTINE_INTENTS = frozenset({IntentKind.SET_WEIGHT, IntentKind.ALLOW_NEW_WORK})


def _kpi_section(result: dict[str, Any]) -> str:
    kpis = result.get("kpis")
    if not kpis:
        return ""
    rows = summary_table(kpis)
    out = ["<h2>Fleet KPIs per pool (fleethealth)</h2><table id='kpis'><tr>"
           + "".join(f"<th class='{'l' if i == 0 else ''}'>{_esc(h)}</th>" for i, h in enumerate(rows[0])) + "</tr>"]
    for r in rows[1:]:
        out.append("<tr>" + "".join(f"<td class='{'l' if i == 0 else ''}'>{_esc(c)}</td>" for i, c in enumerate(r))
                   + "</tr>")
    out.append("</table><p class='note'>Compare two runs (before and after a change) with "
               "<code>fleethealth backtest --compare before.json after.json</code>.</p>")
    return "".join(out)


def _param(v: Any) -> str:
    """An intent parameter for people: floats rounded, lists comma-joined."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, list | tuple):
        return ",".join(_param(x) for x in v)
    return str(v)


def _decisions_section(run: BacktestRun, limit: int = 300) -> str:
    """Every state change and every intent fleethealth decided, in time order, with its reason."""
    log = run.arms[PRODUCT]
    rows: list[tuple[float, str, str, str, str]] = []
    for t in log.transitions:
        if t.from_state in (State.STARTING, State.WARMING):
            continue
        rows.append((t.ts, t.entity, f"{t.from_state} &#8594; {t.to_state}", t.reason, t.detail))
    routine: dict[str, int] = {}
    for i in log.intents:
        if i.kind in ROUTINE_INTENTS:
            routine[str(i.kind)] = routine.get(str(i.kind), 0) + 1
            continue
        rows.append((i.ts, i.entity, _esc(str(i.kind)) + (" (fallback)" if i.soft else ""), i.reason,
                     ", ".join(f"{k}={_param(v)}" for k, v in sorted(i.params.items())
                               if k not in ("n",) and not isinstance(v, dict))[:160]))
    rows.sort(key=lambda r: r[0])
    out = ["<h2>What fleethealth decided, with reasons</h2>"
           "<table id='decisions'><tr><th>when</th><th class='l'>entity</th><th class='l'>action</th>"
           "<th class='l'>reason</th><th class='l'>detail</th></tr>"]
    for ts, ent, what, reason, detail in rows[:limit]:
        out.append(f"<tr><td>{_dur(ts - run.start)}</td><td class='l'>{_esc(ent)}</td><td class='l'>{what}</td>"
                   f"<td class='l'>{_esc(reason)}</td><td class='l note'>{_esc(detail)}</td></tr>")
    if not rows:
        out.append("<tr><td class='l' colspan='5'>no state change and no action</td></tr>")
    elif len(rows) > limit:
        out.append(f"<tr><td class='l' colspan='5'>... and {len(rows) - limit} more (the JSON output has "
                   "them all)</td></tr>")
    out.append("</table>")
    if routine:
        out.append("<p class='note'>Not listed: " + ", ".join(f"{n} {_esc(k)}" for k, n in sorted(routine.items()))
                   + " (router weights and returns to scheduling that follow the state changes above).</p>")
    return "".join(out)


def _definitions_section() -> str:
    return ("<h2>What the figures mean</h2><dl id='definitions'>"
            + "".join(f"<dt><b>{_esc(k)}</b></dt><dd>{_esc(v)}</dd>" for k, v in DEFINITIONS) + "</dl>")


def write_report(run: BacktestRun, result: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_report(run, result), encoding="utf-8")
    return p

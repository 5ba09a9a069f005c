"""How a ``Review`` reads: a text summary for a terminal, and a self-contained HTML page (no scripts, no
external assets) for the monthly review meeting. JSON is ``Review.to_dict()`` with full precision."""

from __future__ import annotations

import html
import time
from collections.abc import Mapping

from fleethealth.review.incidents import Figures, Review


def human_duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + "Z"


_COLS = ("incidents", "quarantined", "confirmed", "cleared", "released", "false", "pending", "precision",
         "detect p50", "detect p90", "repair p50", "repair p90")


def _row(f: Figures) -> list[str]:
    o = f.outcomes
    return [str(f.incidents), str(f.quarantines), str(o["confirmed"]), str(o["cleared"]), str(o["released"]),
            str(o["false"]), str(o["pending"]), pct(f.precision), human_duration(f.detect_median_s),
            human_duration(f.detect_p90_s), human_duration(f.repair_median_s), human_duration(f.repair_p90_s)]


def _table(title: str, rows: Mapping[str, Figures]) -> list[str]:
    head = [title, *_COLS]
    body = [[k, *_row(v)] for k, v in sorted(rows.items())]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                            strict=True)))

    return [line(head), *(line(r) for r in body)]


def to_text(rv: Review) -> str:
    o = rv.overall
    lines = [
        f"review {when(rv.since)} .. {when(rv.until)}",
        f"incidents {o.incidents}, quarantines {o.quarantines}, live quarantine precision {pct(o.precision)}"
        f" ({o.outcomes['confirmed']} confirmed of {o.quarantines - o.outcomes['pending']} decided,"
        f" {o.outcomes['pending']} pending)",
        f"detection p50 {human_duration(o.detect_median_s)} (p90 {human_duration(o.detect_p90_s)}),"
        f" repair p50 {human_duration(o.repair_median_s)} (p90 {human_duration(o.repair_p90_s)})",
        f"transitions {rv.transitions}, flaps {rv.flaps}, pages {sum(rv.pages.values())},"
        f" budget exhaustions {rv.budget_exhaustions}",
        "",
    ]
    if rv.by_pool:
        lines += [*_table("pool", rv.by_pool), ""]
    if rv.by_reason:
        lines += [*_table("reason", rv.by_reason), ""]
    if rv.pages:
        lines.append("pages: " + ", ".join(f"{k} {v}" for k, v in sorted(rv.pages.items(), key=lambda kv: -kv[1])))
    if rv.flaps_by_entity:
        worst = sorted(rv.flaps_by_entity.items(), key=lambda kv: -kv[1])[:10]
        lines.append("most flaps: " + ", ".join(f"{e} {n}" for e, n in worst))
    if rv.incidents:
        lines += ["", "incidents (label one with `fleethealth review-label KEY --label confirmed|false`):"]
        for inc in rv.incidents:
            lab = f" [{inc.label.label}: {inc.label.cause}]" if inc.label is not None else ""
            lines.append(f"  {inc.key}  {inc.reason}  {' > '.join(inc.path)}  outcome {inc.outcome}"
                         f"  detect {human_duration(inc.detect_s)}  repair {human_duration(inc.repair_s)}{lab}")
    return "\n".join(lines).rstrip() + "\n"


_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:1rem;color:#1b1b1b;max-width:80rem}
table{border-collapse:collapse;margin:.5rem 0 1.2rem;display:block;overflow-x:auto}
th,td{padding:.25rem .6rem;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}.k{font-size:1.6rem;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:1rem}.card{border:1px solid #ccc;border-radius:6px;padding:.6rem 1rem}
dt{font-weight:600}dd{margin:0 0 .4rem 1rem}.confirmed{color:#1a7f37}.false,.cleared{color:#b3261e}"""


def _html_table(title: str, rows: Mapping[str, Figures]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in (title, *_COLS))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (k, *_row(v))) + "</tr>"
                   for k, v in sorted(rows.items()))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def to_html(rv: Review) -> str:
    o = rv.overall
    cards = [("live quarantine precision", pct(o.precision)), ("incidents", str(o.incidents)),
             ("quarantines", str(o.quarantines)), ("detection p50", human_duration(o.detect_median_s)),
             ("repair p50", human_duration(o.repair_median_s)), ("flaps", str(rv.flaps)),
             ("pages", str(sum(rv.pages.values()))), ("budget exhaustions", str(rv.budget_exhaustions))]
    card_html = "".join(f'<div class="card"><div>{html.escape(k)}</div><div class="k">{html.escape(v)}</div></div>'
                        for k, v in cards)
    inc_rows = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in (
            html.escape(i.key), html.escape(when(i.start)), html.escape(i.reason), html.escape(" > ".join(i.path)),
            f'<span class="{html.escape(i.outcome)}">{html.escape(i.outcome)}</span>',
            html.escape(human_duration(i.detect_s)), html.escape(human_duration(i.repair_s)),
            html.escape("" if i.label is None else f"{i.label.label} by {i.label.by}: {i.label.cause}"))) + "</tr>"
        for i in rv.incidents)
    defs = ("<dl><dt>live quarantine precision</dt><dd>confirmed quarantines / decided quarantines. Confirmed: the"
            " active test failed, the node recovered too often, the quarantine was entered on a hardware gate, or"
            " an operator labelled it so. Decided: all but those still quarantined.</dd>"
            "<dt>detection</dt><dd>from the incident's start (or the onset an operator labelled) to the first"
            " isolation (draining or quarantined).</dd><dt>repair</dt><dd>from the first isolation back to"
            " READY.</dd><dt>flap</dt><dd>a return to the state just left within the flap window.</dd></dl>")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>fleethealth review</title><style>{_CSS}</style></head><body>"
        f"<h1>Fleet review {html.escape(when(rv.since))} .. {html.escape(when(rv.until))}</h1>"
        f'<div class="cards">{card_html}</div>'
        f"<h2>Per pool</h2>{_html_table('pool', rv.by_pool)}"
        f"<h2>Per reason</h2>{_html_table('reason', rv.by_reason)}"
        "<h2>Incidents</h2><table><thead><tr><th>key</th><th>start</th><th>reason</th><th>path</th><th>outcome</th>"
        f"<th>detect</th><th>repair</th><th>label</th></tr></thead><tbody>{inc_rows}</tbody></table>"
        f"<h2>What the figures mean</h2>{defs}</body></html>\n"
    )

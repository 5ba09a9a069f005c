"""`fleethealth review` and `fleethealth review-label`: the monthly review of what the controller did,
read from its state store (SQLite path or database URL), and an operator's verdict on one incident."""

from __future__ import annotations

import calendar
import json
import re
import time
from pathlib import Path
from typing import Any

import typer

from fleethealth.cli.common import fail

_OFFSET = re.compile(r"^-(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_when(text: str | None, latest: float | None) -> float | None:
    """Unix seconds, an ISO date or time (UTC), or an offset back from the store's latest cycle (``-30d``)."""
    if text is None or text == "":
        return None
    t = text.strip()
    m = _OFFSET.match(t)
    if m:
        if latest is None:
            fail(f"{text!r}: an offset needs a store with at least one cycle")
        return latest - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return float(t)
    except ValueError:
        pass
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return float(calendar.timegm(time.strptime(t.rstrip("Z"), fmt)))
        except ValueError:
            continue
    fail(f"{text!r}: expected unix seconds, a date like 2026-11-01, or an offset like -30d")


def _open(db: str) -> Any:
    from fleethealth.store import StoreError, open_store

    if "://" not in db and db != ":memory:" and not Path(db).is_file():
        fail(f"{db}: no such state database")
    try:
        return open_store(db)
    except StoreError as e:
        fail(str(e))


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


def _duration(text: str) -> float:
    from fleethealth.sim.scenario import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        fail(f"--flap-window: {e}")


def register(app: typer.Typer) -> None:
    @app.command("review")
    def review_cmd(
        db: str = typer.Option(..., "--db", help="State store: a SQLite path or a database URL."),
        since: str | None = typer.Option(None, "--since", help="Start: unix seconds, a date, or -30d (back from the"
                                                                 " store's latest cycle)."),
        until: str | None = typer.Option(None, "--until", help="End, as --since (default: the latest cycle)."),
        fmt: str = typer.Option("text", "--format", "-f", help="text, json or html."),
        out: Path | None = typer.Option(None, "--out", "-o", help="Write here instead of standard output."),
        flap_window: str = typer.Option("1h", "--flap-window", help="A return to the state just left inside this"
                                                                    " window is a flap."),
    ) -> None:
        """The period's incidents and each quarantine's outcome, live quarantine precision, detection and repair
        times, flaps, pages and budget exhaustions, per pool and per reason."""
        from fleethealth.review.incidents import IncidentLabel, review
        from fleethealth.review.render import to_html, to_text

        if fmt not in ("text", "json", "html"):
            fail(f"--format {fmt!r}: expected text, json or html")
        window = _duration(flap_window)
        store = _open(db)
        try:
            state = store.load()
            latest = None if state is None else state.last_ts
            t0, t1 = parse_when(since, latest), parse_when(until, latest)
            if t0 is not None and t1 is not None and t1 < t0:
                fail("--until is before --since")
            pools = {} if state is None else {e: es.labels.get("pool", "default") for e, es in state.entities.items()}
            labels_fn = getattr(store, "incident_labels", None)
            labels = [IncidentLabel.from_dict(d) for d in (labels_fn() if labels_fn else [])]
            rv = review(store.transitions(), store.intents(), since=t0, until=t1 if t1 is not None else latest,
                        pools=pools, labels=labels, flap_window_s=window)
        finally:
            store.close()
        text = (json.dumps(rv.to_dict(), indent=2, sort_keys=True) + "\n" if fmt == "json"
                else to_html(rv) if fmt == "html" else to_text(rv))
        if out is not None:
            out.write_text(text)
            typer.echo(f"review of {rv.overall.incidents} incidents -> {out}")
        else:
            typer.echo(text, nl=False)

    @app.command("kpis")
    def kpis_cmd(
        db: str = typer.Option(..., "--db", help="State store: a SQLite path or a database URL."),
        since: str | None = typer.Option(None, "--since", help="Start: unix seconds, a date, or -7d (back from the"
                                                                 " store's latest cycle; default: the first cycle)."),
        until: str | None = typer.Option(None, "--until", help="End, as --since (default: the latest cycle)."),
        before: str | None = typer.Option(None, "--compare", help="Compare with an earlier range SINCE..UNTIL (each"
                                                                  " as --since), e.g. -14d..-7d against -7d.."),
        gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs of each node (the store keeps"
                                                                            " no GPU counts)."),
        fmt: str = typer.Option("text", "--format", "-f", help="text or json."),
    ) -> None:
        """The fleet KPIs per pool over a period of the store (goodput, quarantine precision, detect and repair
        times, flaps, pages), or two periods side by side with better/worse per figure (before and after an
        upgrade). From the store: unknown-health hours and SLO attainment are live figures only. A period is
        cut to the store's first record (the output says so); one entirely before it has no figures."""
        from fleethealth.review.kpis import (
            EntityInfo,
            clamp_to_records,
            compare,
            compare_table,
            no_records,
            pool_kpis,
            summary_table,
            text_table,
        )

        if fmt not in ("text", "json"):
            fail(f"--format {fmt!r}: expected text or json")
        store = _open(db)
        try:
            state = store.load()
            if state is None:
                fail(f"{db}: no cycle in this store yet")
            latest = state.last_ts
            trs, ints = store.transitions(), store.intents()
        finally:
            store.close()
        # The store's first record: nothing before it was seen (its oldest transition or intent, else its
        # latest cycle); periods are cut to it so that hours the store never saw are not counted as good ones.
        first = min([float(t["ts"]) for t in trs] + [float(i["ts"]) for i in ints] + [latest])
        ents = {e: EntityInfo(es.kind, es.labels.get("pool", "default"), gpus_per_node if es.kind == "node" else 0,
                              str(es.state)) for e, es in state.entities.items() if es.kind in ("node", "replica")}
        pools = sorted({i.pool for i in ents.values()}) + ["all"]

        class Period:
            """A period as asked, and the part of it the store can speak for."""

            def __init__(self, a: str | None, b: str | None) -> None:
                t0, t1 = parse_when(a, latest), parse_when(b, latest)
                self.start = first if t0 is None else t0
                self.end = latest if t1 is None else t1
                if self.end <= self.start:
                    fail(f"empty period: {a or 'start'}..{b or 'latest'} ends before it begins")
                cut = clamp_to_records(self.start, self.end, first)
                self.no_records, self.clamped = cut is None, cut is not None and cut[2]
                self.asked_start = self.start
                if cut is not None:
                    self.start = cut[0]
                self.figures: dict[str, dict[str, Any]] = (
                    no_records(pools) if cut is None
                    else {p: v.to_dict() for p, v in pool_kpis(trs, ints, ents, start=self.start, end=self.end).items()})

            def words(self) -> str:
                span = f"{_when(self.start)} .. {_when(self.end)}"
                if self.no_records:
                    return f"{span}: no records (the store begins {_when(first)})"
                if self.clamped:
                    return f"{span} (start clamped to the store's first record; asked from {_when(self.asked_start)})"
                return span

        now = Period(since, until)
        if before is None:
            if fmt == "json":
                typer.echo(json.dumps({"since": now.start, "until": now.end, "records_from": first,
                                       "clamped": now.clamped, "no_records": now.no_records, "pools": now.figures},
                                      indent=2))
                return
            typer.echo(f"fleet KPIs {now.words()} ({len(ents)} entities)")
            typer.echo(text_table(summary_table(now.figures)))
            return
        if ".." not in before:
            fail(f"--compare {before!r}: expected SINCE..UNTIL, e.g. -14d..-7d")
        a, b = before.split("..", 1)
        old = Period(a or None, b or None)
        rows = compare(old.figures, now.figures)
        if fmt == "json":
            typer.echo(json.dumps({"before": [old.start, old.end], "after": [now.start, now.end], "records_from": first,
                                   "clamped": {"before": old.clamped, "after": now.clamped},
                                   "no_records": {"before": old.no_records, "after": now.no_records},
                                   "rows": rows}, indent=2))
            return
        typer.echo(f"before: {old.words()}")
        typer.echo(f"after:  {now.words()}")
        typer.echo(text_table(compare_table(rows)))

    @app.command("review-label")
    def review_label(
        key: str = typer.Argument(..., help="The incident's key as `review` prints it (entity@start)."),
        db: str = typer.Option(..., "--db", help="State store: a SQLite path or a database URL."),
        label: str = typer.Option(..., "--label", help="confirmed (a real fault) or false (a false alarm)."),
        cause: str = typer.Option("", "--cause", help="What it was (free text: 'NVLink cable', 'bad rollout')."),
        by: str = typer.Option("", "--by", help="Who says so (default: $USER)."),
        onset: str | None = typer.Option(None, "--onset", help="When the fault really began (unix seconds or a"
                                                                " date): detection time is measured from it."),
    ) -> None:
        """Label one incident; `review` and `tune` then count it as you say."""
        import os

        from fleethealth.review.incidents import LABELS

        if label not in LABELS:
            fail(f"--label {label!r}: expected one of {', '.join(LABELS)}")
        if not re.fullmatch(r"[^\x00-\x1f@]+@\d+", key):
            fail(f"{key!r}: expected an incident key like node-37@1764000000")
        store = _open(db)
        try:
            if not hasattr(store, "label_incident"):
                fail(f"{db}: this store cannot keep labels")
            known = {t["entity"] for t in store.transitions(key.rsplit("@", 1)[0])}
            if not known:
                fail(f"{key}: no transitions of {key.rsplit('@', 1)[0]} in this store")
            state = store.load()
            t_onset = parse_when(onset, None if state is None else state.last_ts)
            store.label_incident(key, label, cause, by or os.environ.get("USER", ""), time.time(), t_onset)
        finally:
            store.close()
        typer.echo(f"{key}: labelled {label}" + (f" ({cause})" if cause else ""))

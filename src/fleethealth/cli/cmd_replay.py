"""`fleethealth replay`: scoring and decisions over recorded signals, in time order, with the recording's
clock. The same per-cycle code as the live controller (``fleethealth.decide.loop.DecisionLoop``)."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer

from fleethealth.cli.common import fail, load_policy_or_fail
from fleethealth.decide.lifecycle import mermaid_diagram
from fleethealth.decide.loop import CycleResult, DecisionLoop, replay_cycles
from fleethealth.decide.model import IntentKind, State
from fleethealth.decide.state import Event
from fleethealth.policy import Policy
from fleethealth.signals.snapshot import Snapshot, merge_snapshots


def read_recording(paths: list[str], max_bytes: int | None = None) -> Snapshot:
    """Recorded signal tables (``sources.tables``: .csv, .jsonl, .parquet, optionally .gz) and exposition
    files, merged; a directory stands for the files in it. Exposition samples without a timestamp are
    dated by the file's modification time (a recording has no other clock). Raises ``InputError`` (one
    line) for a missing or binary file, one past ``max_bytes``, and recordings that hold no sample."""
    from fleethealth.sources.exposition import parse_exposition
    from fleethealth.sources.inputs import InputRead, binary_reason, no_samples_reason, read_file
    from fleethealth.sources.tables import InputError, default_max_bytes, read_table, table_format

    limit = default_max_bytes() if max_bytes is None else max_bytes
    files: list[tuple[Path, bool]] = []  # (file, named on the command line)
    for name in paths:
        p = Path(name)
        if p.is_dir():
            files += sorted((x, False) for x in p.iterdir() if x.is_file() and not x.name.startswith("."))
        elif p.exists():
            files.append((p, True))
        else:
            raise InputError(f"{p}: cannot read: No such file or directory")
    snaps = []
    skipped: list[str] = []
    for f, named in files:
        if table_format(f) is not None:
            snaps.append(read_table(f, max_bytes=limit))
            continue
        text = read_file(str(f), limit)
        why = binary_reason(text)
        if why is not None:
            if named:
                raise InputError(f"{f}: cannot read: {why}")
            skipped.append(f"{f}: skipped: {why}")  # a stray binary file in a directory of scrapes
            continue
        try:
            mtime = f.stat().st_mtime
        except OSError as e:
            raise InputError(f"{f}: cannot read: {e.strerror or e}") from None
        snaps.append(parse_exposition(text, default_ts=mtime, source=str(f)))
    snap = merge_snapshots(snaps)
    if not len(snap):
        why = no_samples_reason(InputRead(snap, skipped), [str(p) for p in paths])
        raise InputError(why or "no input yielded a sample")
    return snap


def read_events(path: Path) -> tuple[list[Event], Counter[str]]:
    """Decision events (active_test, reset, ack, oom) as JSON lines; the simulator's event files work too
    (its ``cuda_oom`` events become ``oom`` events; its ``xid`` lines are already in the metrics and are
    skipped). Returns the events and a count of the skipped kinds."""
    out: list[Event] = []
    skipped: Counter[str] = Counter()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            kind = d.get("kind") if isinstance(d, dict) else None
            if kind == "cuda_oom" and "context" in d:
                out.append(_sim_oom(d))
            elif kind in ("xid",):
                skipped[str(kind)] += 1
            else:
                out.append(Event.from_dict(d))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}:{n}: not an event: {e}") from None
    return out, skipped


def _sim_oom(d: dict[str, Any]) -> Event:
    from fleethealth.backtest.events import oom_event
    from fleethealth.sim.truth import SimEvent

    return oom_event(SimEvent(float(d["ts"]), "cuda_oom", str(d["entity"]), str(d.get("node", "")),
                              dict(d["context"]), str(d.get("truth", ""))))


def _when(ts: float) -> str:
    if ts > 1e9:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{ts:.0f}"


def _value_text(v: Any) -> str:
    """A parameter for people: lists comma-joined, mappings as k:v, floats rounded (no Python literals)."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list | tuple | set):
        return ",".join(_value_text(x) for x in v)
    if isinstance(v, dict):
        return ",".join(f"{k}:{_value_text(x)}" for k, x in v.items())
    return str(v)


def _params_text(p: dict[str, Any]) -> str:
    return " ".join(f"{k}={_value_text(v)}" for k, v in p.items() if k != "n" and v not in (None, "", [], {}))


LIFECYCLE_KINDS = ("node", "replica")


class Filter:
    """Which transitions and intents are printed (the summary covers the whole run): ``kinds`` of entity
    (node, replica; an intent's entity is a node unless it names a known replica), entity name patterns
    (fnmatch: ``node-0*``; an exact name matches its GPUs too), intent kinds (transitions are shown
    only when no intent kind is asked for)."""

    def __init__(self, kinds: list[str], entities: list[str], intents: list[str]) -> None:
        self.kinds = set(kinds)
        self.entities = entities
        self.intents = set(intents)
        self.replicas: set[str] = set()
        self.shown = 0
        self.total = 0

    @property
    def active(self) -> bool:
        return bool(self.kinds or self.entities or self.intents)

    def _entity(self, entity: str, kind: str | None) -> bool:
        from fnmatch import fnmatchcase

        if self.kinds:
            k = kind or ("replica" if entity in self.replicas else "node")
            if k not in self.kinds:
                return False
        return not self.entities or any(fnmatchcase(entity, p) or entity.split("/", 1)[0] == p
                                        for p in self.entities)

    def transition(self, entity: str, kind: str) -> bool:
        if kind == "replica":
            self.replicas.add(entity)
        self.total += 1
        ok = not self.intents and self._entity(entity, kind)
        self.shown += ok
        return ok

    def intent(self, entity: str, kind: str) -> bool:
        self.total += 1
        ok = (not self.intents or kind in self.intents) and self._entity(entity, None)
        self.shown += ok
        return ok


def _why(t: Any) -> str:
    """A transition's reason for people: into READY it is healthy (its reason code is then only the least
    good category of a healthy score, which reads like an alarm)."""
    if t.to_state == State.READY:
        return "healthy" + ("" if t.value is None else f" ({t.value:.2f})")
    return str(t.reason)


class Reporter:
    def __init__(self, fmt: str, only: Filter | None = None) -> None:
        self.fmt = fmt
        self.only = only or Filter([], [], [])
        self.transitions = 0
        self.intents: Counter[str] = Counter()
        self.quarantined: list[str] = []
        self.pages: list[str] = []
        self.cycles = 0
        self.first: float | None = None
        self.last: float | None = None

    def cycle(self, r: CycleResult) -> None:
        self.cycles += 1
        self.first = r.now if self.first is None else self.first
        self.last = r.now
        out = sys.stdout
        for t in r.decision.transitions:
            self.transitions += 1
            if t.to_state == State.QUARANTINED:
                self.quarantined.append(t.entity)
            if not self.only.transition(t.entity, t.kind):
                continue
            if self.fmt == "json":
                out.write(json.dumps({"type": "transition", **t.to_dict()}) + "\n")
            else:
                v = "unknown" if t.value is None else f"{t.value:.2f}"
                out.write(f"{_when(t.ts):>20}  {t.entity:<24} {t.from_state:>11} -> {t.to_state:<11} "
                          f"{_why(t)}  (score {v}, confidence {t.confidence:.2f}"
                          + (f", {t.detail})" if t.detail else ")") + "\n")
        for i in r.decision.intents:
            self.intents[str(i.kind)] += 1
            if i.kind == IntentKind.PAGE:
                self.pages.append(f"{i.entity}:{i.reason}")
            if not self.only.intent(i.entity, str(i.kind)):
                continue
            if self.fmt == "json":
                out.write(json.dumps({"type": "intent", **i.to_dict()}, default=str) + "\n")
            else:
                tier = f"[{i.tier}]" if i.tier else ""
                soft = " (soft)" if i.soft else ""
                out.write(f"{_when(i.ts):>20}  {i.entity:<24} {'intent':>11}    {str(i.kind) + tier + soft:<24} "
                          f"{i.reason}  {_params_text(i.params)}\n")

    def summary(self, loop: DecisionLoop, wall_s: float, resumed_from: float | None) -> dict[str, Any]:
        ents = loop.state.entities.values()
        flaps = [e.transitions for e in ents]
        out = {
            "cycles": self.cycles, "from": self.first, "to": self.last, "resumed_from": resumed_from,
            "entities": dict(Counter(e.kind for e in ents)),
            "states": dict(sorted(Counter(str(e.state) for e in ents).items())),
            "transitions": self.transitions,
            "max_transitions_per_entity": max(flaps, default=0),
            "intents": dict(sorted(self.intents.items())),
            "quarantined": sorted(set(self.quarantined)), "pages": self.pages,
            "fleet_frozen": loop.state.frozen, "policy_version": loop.policy.version_tag,
            "wall_s": round(wall_s, 3), "cycles_per_s": round(self.cycles / wall_s, 2) if wall_s > 0 else None,
        }
        if self.only.active:
            out["shown"] = self.only.shown
            out["of"] = self.only.total
        return out

    def print_summary(self, s: dict[str, Any]) -> None:
        if self.fmt == "json":
            sys.stdout.write(json.dumps({"type": "summary", **s}) + "\n")
            return
        for line in summary_lines(s):
            sys.stdout.write(line + "\n")


def _counts(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The run's summary for people: words and rounded numbers, no Python literals."""
    ents = s.get("entities") or {}
    rows = [("cycles", f"{s['cycles']}" + (f" ({_when(s['from'])} to {_when(s['to'])})" if s.get("from") else "")),
            ("entities", ", ".join(f"{n} {k}s" if n != 1 else f"1 {k}" for k, n in sorted(ents.items())) or "none"),
            ("states at the end", _counts(s.get("states") or {})),
            ("transitions", f"{s['transitions']} (at most {s['max_transitions_per_entity']} per entity)"),
            ("intents", _counts(s.get("intents") or {})),
            ("quarantined", ", ".join(s.get("quarantined") or []) or "none"),
            ("pages", ", ".join(s.get("pages") or []) or "none"),
            ("remediation", "FROZEN (fleet-wide confidence low)" if s.get("fleet_frozen") else "active"),
            ("policy", str(s.get("policy_version")))]
    if s.get("resumed_from") is not None:
        rows.append(("resumed after", _when(float(s["resumed_from"]))))
    if "events" in s:
        skipped = s.get("events_skipped") or {}
        rows.append(("events", f"{s['events']}" + (f" (skipped: {_counts(skipped)})" if skipped else "")))
    rate = s.get("cycles_per_s")
    rows.append(("time", f"{s['wall_s']:.1f} s" + (f", {rate:.0f} cycles/s" if rate else "")))
    if "shown" in s:
        rows.append(("shown", f"{s['shown']} of {s['of']} transitions and intents (filtered)"))
    return ["", "summary"] + [f"  {k:<20} {v}" for k, v in rows]


def register(app: typer.Typer) -> None:
    @app.command("replay")
    def replay(
        recordings: list[str] = typer.Argument(None, help="Recorded signal tables / exposition files."),
        policy: Path | None = typer.Option(None, "--policy", help="Policy YAML (default: the shipped one)."),
        fmt: str = typer.Option("table", "--format", help="table or json (one object per line)."),
        state_db: Path | None = typer.Option(None, "--state-db",
                                             help="SQLite state; a second run resumes after its last cycle."),
        events: Path | None = typer.Option(None, "--events",
                                           help="JSON lines of events (active_test, reset, ack, oom)."),
        group_s: float = typer.Option(1.0, "--group-s", help="Samples within this many seconds form one scrape."),
        pace: float = typer.Option(0.0, "--pace", help="Sleep this long after each cycle (to watch it)."),
        diagram: bool = typer.Option(False, "--diagram", help="Print the lifecycle as a Mermaid diagram."),
        kind: list[str] = typer.Option([], "--kind", help="Only entities of this kind: node or replica "
                                                          "(repeat or comma-separate)."),
        entity: list[str] = typer.Option([], "--entity", help="Only these entities: a name (a node's name covers "
                                                              "its GPUs) or a pattern like 'node-0*' (repeatable)."),
        intent: list[str] = typer.Option([], "--intent", help="Only intents of this kind (e.g. quarantine, page; "
                                                              "repeat or comma-separate); hides transitions."),
    ) -> None:
        """Run scoring and decisions over recordings and print every transition and intent, then a summary."""
        if fmt not in ("table", "json"):
            fail(f"--format must be table or json, not {fmt!r}")
        kinds = [k.strip() for v in kind for k in v.split(",") if k.strip()]
        bad = [k for k in kinds if k not in LIFECYCLE_KINDS]
        if bad:
            fail(f"--kind {bad[0]!r} is unknown: expected {' or '.join(LIFECYCLE_KINDS)}")
        wanted = [k.strip() for v in intent for k in v.split(",") if k.strip()]
        valid = sorted(str(k) for k in IntentKind)
        bad = [k for k in wanted if k not in valid]
        if bad:
            fail(f"--intent {bad[0]!r} is unknown: expected one of {', '.join(valid)}")
        only = Filter(kinds, [e for e in entity if e], wanted)
        pol: Policy = load_policy_or_fail(policy)
        if diagram:
            typer.echo(mermaid_diagram(pol.lifecycle), nl=False)
            return
        if not recordings:
            fail("no recording given (fleethealth replay RECORDING...)")
        try:
            snap = read_recording(list(recordings))
        except Exception as e:  # the readers raise one-line InputErrors; never a traceback at a user
            fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
        evs: list[Event] = []
        skipped: Counter[str] = Counter()
        if events is not None:
            try:
                evs, skipped = read_events(events)
            except UnicodeDecodeError:
                fail(f"{events}: cannot read events: binary data, not JSON lines")
            except OSError as e:
                fail(f"{events}: cannot read events: {e.strerror or e}")
            except (ValueError, ImportError) as e:
                fail(str(e).splitlines()[0])
        store = None
        if state_db is not None:
            from fleethealth.store import StoreError, open_store

            try:
                store = open_store(state_db)
            except StoreError as e:
                fail(str(e))
        loop = DecisionLoop(pol, store)
        resumed = loop.last_ts
        rep = Reporter(fmt, only)
        t0 = time.perf_counter()
        for res in replay_cycles(loop, snap, evs, group_s, (lambda: time.sleep(pace)) if pace > 0 else None):
            rep.cycle(res)
            sys.stdout.flush()
        summary = rep.summary(loop, time.perf_counter() - t0, resumed)
        summary["events"] = len(evs)
        if skipped:
            summary["events_skipped"] = dict(skipped)
        rep.print_summary(summary)
        if store is not None:
            store.close()

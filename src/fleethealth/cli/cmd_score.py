"""`fleethealth score` and `fleethealth explain`: one health tuple per entity from files or URLs."""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from fleethealth.cli.common import fail, load_policy_or_fail
from fleethealth.decide import chronic
from fleethealth.policy import Policy
from fleethealth.score.engine import CONSUMERS, FleetHealth, score_snapshot
from fleethealth.score.health import HealthTuple
from fleethealth.signals.snapshot import Snapshot, merge_snapshots

# Piped output (logs, CI) gets a wide console so entity names and reason codes are not cut.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def parse_at(at: str | None) -> float:
    """Unix seconds or ISO 8601; default: now (the only wall-clock read, at the edge)."""
    if at is None or at == "now":
        return time.time()
    try:
        return float(at)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        fail(f"--at {at!r}: expected unix seconds or an ISO 8601 time")


@dataclass
class Inputs:
    """What ``read_all`` read: the snapshot, the time scored and the recording's time range (if any)."""

    snapshot: Snapshot
    at: float
    recorded: tuple[float, float] | None = None


def read_all(
    inputs: list[str], at: float | None, kernel_logs: list[Path] | None = None, node: str | None = None,
    max_input_mb: float | None = None, policy: Policy | None = None,
) -> Inputs:
    """Read exposition/table files or URLs (and kernel logs) into one snapshot. ``at`` None: the
    recording's last sample when a recorded table is among the inputs, the newest kernel-log line when
    kernel logs are the only input, else now. Unreadable inputs, and
    inputs that yield no sample at all, exit 2 with one line; notices (a page given an instance, recorded
    samples after ``at``) go to stderr."""
    from fleethealth.sources.inputs import (
        IDENTITY_LABELS,
        InputError,
        max_bytes_from_mb,
        no_samples_reason,
        read_inputs_report,
    )

    try:
        identity = (
            tuple(dict.fromkeys((*policy.node_labels, *policy.replica_labels, "job"))) if policy is not None
            else IDENTITY_LABELS
        )
        got = read_inputs_report(inputs, at, now=time.time(), max_bytes=max_bytes_from_mb(max_input_mb),
                                 identity_labels=identity)
    except InputError as e:
        fail(str(e))
    snap = got.snapshot
    when = snap.at
    if kernel_logs:
        from fleethealth.sources.kernel_log import bus_map_from_snapshot, parse_kernel_log

        parts = [snap]
        bus = bus_map_from_snapshot(snap)
        for p in kernel_logs:
            try:
                text = p.read_text(errors="replace")
            except OSError as e:
                fail(f"{p}: cannot read: {e.strerror or e}")
            res = parse_kernel_log(text, source=str(p), node=node, bus_to_gpu=bus, now=when)
            parts.append(_kernel_only_gpus(res.snapshot))
        if at is None and not inputs:
            # Kernel logs alone read as a recording does: as of their newest line, so that an Xid logged an
            # hour ago scores as what it was then, not as stale data (--at scores them at another time).
            newest = [float(part.ts.max()) for part in parts[1:] if len(part)]
            when = max(newest, default=when)
        snap = merge_snapshots(parts, when)
    err = Console(stderr=True, highlight=False)
    for n in got.notices:
        err.print(f"[cyan]notice:[/] {n}", soft_wrap=True, markup=True, highlight=False)
    if not len(snap):
        why = no_samples_reason(got, inputs) or "no input yielded a sample"
        fail(why if not kernel_logs else f"{why}; the kernel log(s) held no Xid or SXid line either")
    return Inputs(snap, when, got.recorded)


def _kernel_only_gpus(snap: Snapshot) -> Snapshot:
    """Kernel-log samples of a GPU no metric names (no exporter maps its PCI bus to a GPU index) get the
    bus id as their ``gpu`` label, so the node and GPU appear with their events instead of vanishing."""
    sets = snap.labelsets
    if not any("pci_bus_id" in dict(ls) and "gpu" not in dict(ls) for ls in sets):
        return snap
    snap.labelsets = [
        tuple(sorted((*ls, ("gpu", d["pci_bus_id"])))) if "pci_bus_id" in (d := dict(ls)) and "gpu" not in d else ls
        for ls in sets
    ]
    return snap


def _fmt(x: float | None, digits: int = 3) -> str:
    return "unknown" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _style(t: HealthTuple) -> str:
    if t.value is None:
        return "magenta"
    if t.value < 0.3:
        return "bold red"
    if t.value < 0.7:
        return "red"
    if t.value < 0.9:
        return "yellow"
    return "green"


def print_issues(snap: Snapshot, fh: FleetHealth, limit: int = 20) -> None:
    issues = list(fh.issues) + list(snap.source_errors)
    if not issues:
        return
    err = Console(stderr=True, highlight=False)
    err.print(f"[yellow]{len(issues)} input issue(s) became missing data[/] (first {min(limit, len(issues))}):")
    for i in issues[:limit]:
        err.print(f"  {i}", soft_wrap=True, markup=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def score(
        inputs: Annotated[list[str] | None, typer.Argument(
            help="Exposition files, recorded tables (csv/jsonl/parquet) or URLs (none: only --kernel-log)")] = None,
        policy: Annotated[Path | None, typer.Option(help="Policy YAML (default: the shipped policy)")] = None,
        at: Annotated[str | None, typer.Option(
            help="Score as of this time (unix s or ISO 8601); default: a recording's last sample, else now")] = None,
        consumer: Annotated[str, typer.Option(help="training | serving | remediation")] = "remediation",
        fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
        kind: Annotated[list[str] | None, typer.Option(help="Only these entity kinds (gpu, node, replica, rank)")] = None,
        kernel_log: Annotated[list[Path] | None, typer.Option("--kernel-log", help="Kernel log with NVRM Xid lines")] = None,
        node: Annotated[str | None, typer.Option(help="Node name for kernel-log lines without a host name")] = None,
        details: Annotated[bool, typer.Option(help="JSON: include per-signal detail")] = False,
        max_input_mb: Annotated[float | None, typer.Option(
            help="Most MB one input may hold or decompress to (default 256, or FLEETHEALTH_MAX_INPUT_BYTES)")] = None,
    ) -> None:
        """Score every entity: value, confidence, worst category and reason code."""
        if consumer not in CONSUMERS:
            fail(f"--consumer {consumer!r}: expected one of {', '.join(CONSUMERS)}")
        if fmt not in ("table", "json"):
            fail(f"--format {fmt!r}: expected table or json")
        all_kinds = ["node", "gpu", "replica", "rank"]
        kinds = [k.strip() for v in kind or [] for k in v.split(",") if k.strip()] or all_kinds
        bad = [k for k in kinds if k not in all_kinds]
        if bad:
            fail(f"--kind {bad[0]!r} is unknown: expected one of {', '.join(all_kinds)}")
        if not inputs and not kernel_log:
            fail("nothing to score: give exposition files, recorded tables or URLs, or --kernel-log FILE")
        pol = load_policy_or_fail(policy)
        got = read_all(inputs or [], None if at is None else parse_at(at), kernel_log, node, max_input_mb, pol)
        snap, now = got.snapshot, got.at
        fh = score_snapshot(snap, pol, now, consumer=consumer)
        tuples = [t for k in kinds for t in fh.by_kind(k)]
        if fmt == "json":
            for t in tuples:
                typer.echo(json.dumps(t.to_dict(with_details=details)))
        else:
            tuples.sort(key=lambda t: (t.value is not None, t.value if t.value is not None else 0.0, t.entity))
            table = Table(title=f"fleethealth score ({consumer}, policy {pol.version_tag})")
            for col in ("entity", "kind", "value", "confidence", "worst", "reason", "flags"):
                table.add_column(col, justify="right" if col in ("value", "confidence") else "left")
            healthy_from = pol.lifecycle.flag_below
            for t in tuples:
                ok = healthy(t, healthy_from)
                table.add_row(
                    t.entity + (f" ({t.worst_member})" if t.worst_member and not ok else ""), t.kind,
                    f"[{_style(t)}]{_fmt(t.value)}[/]", _fmt(t.confidence, 2), "-" if ok else t.worst or "-",
                    "healthy" if ok else shown_reason(t), ",".join(t.flags[:4]),
                )
            console.print(_time_line(now, got.recorded), markup=False)
            console.print(table)
            console.print("summary: " + summary_words(fh.summary()), markup=False)
        print_issues(snap, fh)

    @app.command()
    def explain(
        entity: Annotated[str, typer.Argument(help="Entity id: node, node/gpuN, replica or job/rankN")],
        inputs: Annotated[list[str], typer.Argument(help="Exposition files, recorded tables or URLs")],
        policy: Annotated[Path | None, typer.Option(help="Policy YAML")] = None,
        at: Annotated[str | None, typer.Option(
            help="As of (unix s or ISO 8601); default: a recording's last sample, else now")] = None,
        consumer: Annotated[str, typer.Option(help="training | serving | remediation")] = "remediation",
        kernel_log: Annotated[list[Path] | None, typer.Option("--kernel-log")] = None,
        node: Annotated[str | None, typer.Option()] = None,
        fmt: Annotated[str, typer.Option("--format", help="tree | json")] = "tree",
        max_input_mb: Annotated[float | None, typer.Option(help="Most MB one input may hold or decompress to")] = None,
    ) -> None:
        """The tree of categories and signals behind one entity's tuple."""
        if fmt not in ("tree", "json"):
            fail(f"--format {fmt!r}: expected tree or json")
        pol = load_policy_or_fail(policy)
        got = read_all(inputs, None if at is None else parse_at(at), kernel_log, node, max_input_mb, pol)
        snap, now = got.snapshot, got.at
        fh = score_snapshot(snap, pol, now, consumer=consumer)
        t = fh.get(entity)
        if t is None:
            close = [e for e in fh.tuples if entity in e][:5]
            fail(f"no entity {entity!r} in the inputs" + (f"; did you mean: {', '.join(close)}" if close else ""))
        if fmt == "json":
            d = t.to_dict(with_details=True)
            if t.worst_member:
                d["worst_member_tuple"] = fh.tuples[t.worst_member].to_dict(with_details=True)
            d["scored_at"] = now
            if t.kind == "node":  # what a slow node costs its job (decide.chronic; no CUSUM in one read),
                # priced whether or not a swap pays (the node asked about, as a DEGRADED one is)
                ev = chronic.node_evidence(fh, pol, degraded=lambda n: n == entity).get(entity)
                d["chronic"] = chronic.estimate(ev, {}, pol)
            if got.recorded is not None:
                d["recording"] = {"from": got.recorded[0], "to": got.recorded[1]}
            typer.echo(json.dumps(d, indent=2))
            return
        console.print(_time_line(now, got.recorded), markup=False)
        console.print(explain_tree(t, fh, pol.lifecycle.flag_below))
        repair = _repair_line(t, fh, pol)
        if repair:
            console.print(repair, markup=False)
        if t.kind == "node" and (ev := chronic.node_evidence(fh, pol, degraded=lambda n: n == entity).get(entity)):
            console.print("chronic slowness: " + chronic.describe(chronic.estimate(ev, {}, pol)), markup=False)
        print_issues(snap, fh)


def healthy(t: HealthTuple, flag_below: float) -> bool:
    """Known and at or above the policy's flag line: its least good category and ``min:`` reason are then
    only the weakest part of a healthy score, and printed they would read like an alarm. Something
    expected and missing (``missing:``, ``pending:``, or a confidence below 1: an expected signal that is
    not fresh) is never healthy, whatever the value."""
    return (t.value is not None and t.value >= flag_below and not t.flags and t.confidence >= 1.0 - 1e-9
            and not t.reason.startswith(("missing:", "pending:")))


def shown_reason(t: HealthTuple) -> str:
    """The reason a person reads for an entity that is not ``healthy``: the tuple's, or, for a good value
    whose confidence is below 1, which expected signals are not fresh (a ``min:`` reason would hide them)."""
    if (t.value is not None and t.confidence < 1.0 - 1e-9 and not t.flags
            and not t.reason.startswith(("missing:", "pending:", "gate:", "no_fresh_data"))):
        gone = [d.signal for d in t.details if d.score is None and d.expected_by]
        if gone:
            return "incomplete: missing " + ",".join(gone[:4]) + ("..." if len(gone) > 4 else "")
        return f"incomplete: confidence {t.confidence:.2f}"  # e.g. a node whose GPUs miss a signal
    return t.reason


def summary_words(summary: dict[str, Any]) -> str:
    """``fh.summary()`` for people: per kind, how many, how many unknown and below 0.7, mean confidence."""
    parts = []
    for kind, s in summary.items():
        conf = s.get("mean_confidence")
        parts.append(f"{s['entities']} {kind}s ({s['unknown']} unknown, {s['below_0.7']} below 0.7"
                     + (f", mean confidence {conf:.2f})" if conf is not None else ")"))
    return "; ".join(parts) or "nothing scored"


def _repair_line(t: HealthTuple, fh: FleetHealth, pol: Policy) -> str | None:
    """The repair ladder an isolation of this node would climb (policy.remediation), if any."""
    from fleethealth.decide import ladder
    from fleethealth.signals.xid import xid_bucket

    if t.kind != "node":
        return None
    flags = set(t.flags)
    for g in fh.by_kind("gpu") if hasattr(fh, "by_kind") else []:
        if g.entity.startswith(t.entity + "/"):
            flags.update(g.flags)
    lad = ladder.match(pol.remediation, flags, t.reason, xid_bucket)
    return None if lad is None else "repair if isolated: " + ladder.describe(lad)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time_line(at: float, recorded: tuple[float, float] | None) -> str:
    """When the tuple is for, and the recording's time range when the inputs are a recording."""
    line = f"as of {_iso(at)} ({at:.0f})"
    if recorded is not None:
        a, b = recorded
        line += f"; recording {_iso(a)} .. {_iso(b)} ({(b - a) / 60:.1f} min)"
    return line


def explain_tree(t: HealthTuple, fh: FleetHealth, flag_below: float = 0.9) -> Tree:
    ok = healthy(t, flag_below)
    head = (
        f"[bold]{t.entity}[/] ({t.kind}) value [{_style(t)}]{_fmt(t.value)}[/] confidence {_fmt(t.confidence, 2)} "
        + ("[green]healthy[/]" if ok else f"reason [bold]{shown_reason(t)}[/]")
    )
    root = Tree(head)
    if t.labels:
        root.add("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(t.labels.items())))
    if t.flags:
        root.add("flags: " + ", ".join(t.flags))
    _add_categories(root, t, mark_worst=not ok)
    if t.kind == "node":
        ks = fh.kinds["gpu"]
        members = []
        if ks.member_of is not None:
            node_ix = fh.kinds["node"].names.index(t.entity)
            members = [i for i in range(len(ks.names)) if int(ks.member_of[i]) == node_ix]
        gl = root.add(f"GPUs ({len(members)}); the node is the weakest of them")
        short = fh.kinds["node"].gpu_count_why.get(fh.kinds["node"].names.index(t.entity))
        if short:  # the peers rule for the GPU count: why more GPUs are expected
            gl.add(f"fewer GPUs than expected: {short}")
        for i in sorted(members, key=lambda i: (math.isnan(ks.value[i]), ks.value[i])):
            g = fh.tuples[ks.names[i]]
            branch = gl.add(f"[{_style(g)}]{g.entity}[/] {_fmt(g.value)} conf {_fmt(g.confidence, 2)} "
                            f"{'healthy' if healthy(g, flag_below) else g.reason}")
            if g.entity == t.worst_member:  # its signals: what a person asking to explain wants to see
                _add_categories(branch, g, mark_worst=not healthy(g, flag_below))
    return root


def _add_categories(root: Tree, t: HealthTuple, mark_worst: bool = True) -> None:
    by_cat: dict[str, list] = {}
    for d in t.details:
        by_cat.setdefault(d.category, []).append(d)
    for cat, score in t.categories.items():
        mark = " <- worst" if cat == t.worst and mark_worst else ""
        c = root.add(f"{cat}: {_fmt(score)}{mark}")
        for d in by_cat.get(cat, []):
            parts = [escape(f"{d.signal} [{d.shape}]")]  # the shape in brackets, not a style tag
            if d.raw is not None:
                parts.append(f"raw={d.raw:g}")
            if d.rate is not None and d.shape == "peer":  # a peer signal's is its deviation from the peers' median
                parts.append(f"vs_peers={d.rate:+.1%}")
            elif d.rate is not None:
                parts.append(f"rate={d.rate:g}/s")
            if d.z is not None:
                parts.append(f"z={d.z:.2f}")
            parts.append(f"score={_fmt(d.score)}")
            if d.age_s is not None:
                parts.append(f"age={d.age_s:.0f}s")
            if d.note:
                parts.append(f"({d.note})")
            if d.score is None and d.expected_by:  # a missing signal: why it is expected at all
                parts.append(f"expected: {d.expected_by}")
            c.add(" ".join(parts))

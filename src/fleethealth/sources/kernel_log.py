"""NVIDIA Xids, NVSwitch SXids and "fallen off the bus" messages from the kernel log, as signals and events.

Theory of operation
-------------------
A line is read in two steps. First its *envelope* is peeled: a wall-clock or boot-relative stamp and,
for syslog/journald lines, the host name and tag. Then the *message* is matched against the driver's
shapes. Envelopes recognised (``<p>`` priority and ``kern  :err   :`` prefixes are dropped first):

==========================================  ==================================================================
``[12345.678901] NVRM: ...``                dmesg: seconds since boot. Converted with ``boot_time``; without it
                                            the value is kept relative (seconds since boot) and one issue says so.
``[Mon Oct  2 10:41:07 2023] NVRM: ...``    ``dmesg -T`` (ctime, read in ``tz``, UTC by default).
``Oct  2 10:41:07 host kernel: ...``        syslog / ``journalctl`` short: year from ``year``, else the year of
                                            ``now`` (a stamp more than a day ahead of ``now`` is last year's).
``2023-10-02T10:41:07.123+00:00 host ...``  ISO 8601 (``journalctl -o short-iso[-precise]``, rsyslog,
                                            ``dmesg --time-format iso`` with its comma and no host).
``[12345.678901] host kernel: ...``         ``journalctl -o short-monotonic``.
``6,1234,12345678901,-;NVRM: ...``          ``/dev/kmsg`` (microseconds since boot).
==========================================  ==================================================================

A syslog line that also carries the dmesg stamp (``host kernel: [123.4] NVRM: ...``) keeps the wall clock.
A line with no stamp at all takes the previous line's time (multi-line messages) or ``now``.

Messages: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, ...`` with or without ``PCI:``, the
bus function, ``pid``/``name`` (quoted, ``<unknown>``, or absent as in the NVLink5 Xids 144-150); Xid 154
``GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)``; ``nvidia-nvswitchN: SXid
(PCI:0000:05:00.0): 12028, Fatal, Link 28 ...``; and the multi-line ``NVRM: The NVIDIA GPU 0000:b3:00.0 ...
fallen off the bus`` notice.

Bus ids are normalised to one form, ``dddd:bb:dd.f`` in lowercase with a 4-digit domain (``0000:3b:00.0``):
the kernel prints ``0000:3b:00`` (no function), dcgm-exporter and NVML ``00000000:3B:00.0``.

Signals (the ``snapshot``): counters ``fleethealth_kernel_xid_total{Hostname, pci_bus_id, gpu?, xid}`` and
``fleethealth_kernel_sxid_total{Hostname, pci_bus_id, sxid}``, ``fleethealth_kernel_gpu_fallen_off_total
{Hostname, pci_bus_id, gpu?}``, each with its cumulative count at every event's time and a 0 one
millisecond before the series' first event (so ``increase()`` over a window sees the first event), and
the gauge ``DCGM_FI_DEV_GPU_RECOVERY_ACTION{Hostname, pci_bus_id, gpu?}`` with each Xid 154's new action.

Nothing here is fatal: a garbled Xid line or one without any time becomes an ``InputIssue`` with its line
number (``issues``); remarks on lines that did parse (an Xid code missing from NVIDIA's catalog, relative
times, no host name) are ``notes``. Lines that are not about the GPU driver are counted in ``stats``.

This module reads messages and keeps counts (``KernelLogParser``, ``parse_kernel_log``) and holds the
live ``KernelLogSource``; the envelope is read by ``kernel_log_envelope`` and the file, ``/dev/kmsg`` and
command tails the source follows are in ``kernel_log_follow`` (all of the I/O).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, tzinfo
from functools import lru_cache

from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot, SnapshotBuilder
from fleethealth.signals.xid import RECOVERY_ACTIONS, xid_info
from fleethealth.sources.base import failed_snapshot
from fleethealth.sources.kernel_log_envelope import EnvelopeReader
from fleethealth.sources.kernel_log_follow import (
    CommandTail,
    FileTail,
    KmsgTail,
    is_char_device,
    read_boot_time,
)

XID_METRIC = "fleethealth_kernel_xid_total"
SXID_METRIC = "fleethealth_kernel_sxid_total"
FALLEN_OFF_METRIC = "fleethealth_kernel_gpu_fallen_off_total"
RECOVERY_METRIC = "DCGM_FI_DEV_GPU_RECOVERY_ACTION"

# How far before a series' first event its 0 baseline sits: small enough never to land in another window.
BASELINE_OFFSET_S = 0.001

BusToGpu = Mapping[str, str] | Mapping[tuple[str, str], str]

# ---------------------------------------------------------------------------------------------------------
# PCI bus ids

_BUS_RE = re.compile(
    r"^(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


@lru_cache(maxsize=4096)  # a node has a handful of bus ids; Xid floods repeat them
def normalize_bus_id(text: str) -> str | None:
    """``0000:3b:00``, ``00000000:3B:00.0``, ``PCI:0000:3b:00`` or ``3b:00.0`` -> ``0000:3b:00.0``; None if
    the text is not a PCI address."""
    m = _BUS_RE.match(text.strip())
    if m is None:
        return None
    dom = int(m["dom"] or "0", 16)
    return f"{dom:04x}:{int(m['bus'], 16):02x}:{int(m['dev'], 16):02x}.{int(m['fn'] or '0')}"


def bus_map_from_snapshot(snapshot: Snapshot) -> dict[tuple[str, str], str]:
    """(node, normalised bus id) -> gpu index, from any series carrying ``pci_bus_id`` and ``gpu`` labels
    (dcgm-exporter's or the agent's). The node comes from ``Hostname`` (else ``node``/``hostname``/
    ``instance``), as the scorer names nodes."""
    out: dict[tuple[str, str], str] = {}
    for ls in snapshot.labelsets:
        labels = dict(ls)
        bus, gpu = labels.get("pci_bus_id"), labels.get("gpu")
        if not bus or gpu is None or gpu == "":
            continue
        norm = normalize_bus_id(bus)
        node = next((labels[k] for k in ("Hostname", "node", "hostname", "instance") if labels.get(k)), "")
        if norm is not None:
            out[(node, norm)] = gpu
    return out


def _normalized_bus_map(bus_to_gpu: BusToGpu | None) -> dict[tuple[str, str] | str, str]:
    out: dict[tuple[str, str] | str, str] = {}
    for key, gpu in (bus_to_gpu or {}).items():
        if isinstance(key, tuple):
            norm = normalize_bus_id(key[1])
            if norm is not None:
                out[(key[0], norm)] = str(gpu)
        else:
            norm = normalize_bus_id(key)
            if norm is not None:
                out[norm] = str(gpu)
    return out


# ---------------------------------------------------------------------------------------------------------
# Events and result


def _entity(node: str | None, gpu: int | None) -> str | None:
    if node and gpu is not None:
        return f"{node}/gpu{gpu}"
    return node or None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One ``NVRM: Xid`` line. ``ts`` is unix seconds (or seconds since boot when the boot time was
    unknown); ``pci_bus_id`` is normalised (``0000:3b:00.0``); ``gpu`` is the index when the bus map knew
    it. ``recovery_action`` is the new action code of an Xid 154 line."""

    ts: float
    node: str | None
    pci_bus_id: str
    gpu: int | None
    xid: int
    pid: int | None
    process_name: str | None
    message: str
    raw: str
    line: int
    recovery_action: int | None = None

    @property
    def entity(self) -> str | None:
        """The scorer's entity id: ``node/gpuN`` when the GPU is known, else the node (None if neither)."""
        return _entity(self.node, self.gpu)

    def to_dict(self) -> dict[str, object]:
        """Plain data for evidence bundles and JSON output."""
        return {**asdict(self), "entity": self.entity}


@dataclass(frozen=True, slots=True)
class SXidEvent:
    """One NVSwitch ``SXid`` line. ``fatal`` is None when the line says neither Fatal nor Non-fatal."""

    ts: float
    node: str | None
    pci_bus_id: str
    switch: int | None
    sxid: int
    fatal: bool | None
    link: int | None
    message: str
    raw: str
    line: int


@dataclass(frozen=True, slots=True)
class FallenOffEvent:
    """The driver's "GPU ... has fallen off the bus" notice (printed with or without an Xid 79)."""

    ts: float
    node: str | None
    pci_bus_id: str
    gpu: int | None
    raw: str
    line: int


@dataclass(slots=True)
class KernelLogResult:
    events: list[XidEvent]
    sxid_events: list[SXidEvent]
    fallen_off: list[FallenOffEvent]
    snapshot: Snapshot
    # Lines that looked like the driver's but could not become events, with their line numbers (also in
    # ``snapshot.issues``).
    issues: list[InputIssue]
    # lines, xid, sxid, fallen_off, ignored (not about the GPU driver), garbled (looked like ours, unparsable),
    # replayed (a restarted command's lines already counted)
    stats: dict[str, int]
    # Remarks on lines that did become events: unknown Xid codes, relative times, no host name.
    notes: list[InputIssue] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------
# Messages

_BUS_TOKEN = r"(?:PCI:)?[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?"
_XID_RE = re.compile(rf"NVRM: Xid \((?P<bus>{_BUS_TOKEN})\): (?P<xid>\d+)\b[,\s]*(?P<rest>.*)$")
_SXID_RE = re.compile(
    rf"(?:nvidia-nvswitch(?P<sw>\d+): )?SXid \((?P<bus>{_BUS_TOKEN})\): (?P<sxid>\d+)\b[,\s]*(?P<rest>.*)$"
)
_PID_RE = re.compile(r"^pid=\s*'?(?P<pid>\d+|<unknown>)?'?\s*(?:,\s*|$)")
_NAME_RE = re.compile(r"^name=\s*(?:'(?P<q>[^']*)'|(?P<n>[^,]*))\s*(?:,\s*|$)")
_RECOVERY_RE = re.compile(
    r"recovery action changed from (?P<old>0x[0-9a-fA-F]+|\d+)(?: \([^)]*\))? to (?P<new>0x[0-9a-fA-F]+|\d+)"
)
_LINK_RE = re.compile(r"\bLink (?P<link>\d+)\b")
_GPU_NOTICE_RE = re.compile(rf"NVRM: (?:The NVIDIA )?GPU (?:at )?(?P<bus>{_BUS_TOKEN})\b")
_FALLEN = "fallen off the bus"
# A "The NVIDIA GPU <bus>" line is followed by its "fallen off the bus" line within a few lines.
_NOTICE_SPAN_LINES = 4


def _parse_xid_rest(rest: str) -> tuple[int | None, str | None, str]:
    pid: int | None = None
    name: str | None = None
    if m := _PID_RE.match(rest):
        if m["pid"] and m["pid"].isdigit():
            pid = int(m["pid"])
        rest = rest[m.end():]
    if m := _NAME_RE.match(rest):
        raw_name = (m["q"] if m["q"] is not None else m["n"] or "").strip()
        name = None if raw_name in ("", "<unknown>") else raw_name
        rest = rest[m.end():]
    return pid, name, rest.strip()


def _action_code(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


# ---------------------------------------------------------------------------------------------------------
# The incremental parser: one per log stream, so a live follower keeps its counts.


@dataclass(slots=True)
class KernelLogParser:
    """Feeds lines in order and keeps cumulative counts per series; ``parse_kernel_log`` is one full pass,
    ``KernelLogSource`` keeps one across reads."""

    source: str
    node: str | None = None
    boot_time: float | None = None
    year: int | None = None
    bus_to_gpu: BusToGpu | None = None
    tz: tzinfo = UTC
    counts: dict[tuple[str, LabelSet], int] = field(default_factory=dict)
    last_values: dict[tuple[str, LabelSet], float] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: {"lines": 0, "xid": 0, "sxid": 0, "fallen_off": 0, "ignored": 0, "garbled": 0,
                                 "replayed": 0}
    )
    line_no: int = 0
    # Events at or before this time are replays (a restarted ``dmesg -w`` prints its whole buffer again).
    replay_until: float | None = None
    last_event_ts: float | None = None
    _last_ts: float | None = None
    _notice: tuple[str, int] | None = None  # (bus, line) of a pending "The NVIDIA GPU <bus>" line
    _warned: set[str] = field(default_factory=set)
    _bus_map: dict[tuple[str, str] | str, str] = field(default_factory=dict)
    _label_cache: dict[tuple[object, ...], LabelSet] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.set_bus_map(self.bus_to_gpu)

    def set_bus_map(self, bus_to_gpu: BusToGpu | None) -> None:
        self.bus_to_gpu = bus_to_gpu
        self._bus_map = _normalized_bus_map(bus_to_gpu)
        self._label_cache.clear()

    def _gpu(self, node: str | None, bus: str) -> int | None:
        gpu = self._bus_map.get((node or "", bus))
        if gpu is None:
            gpu = self._bus_map.get(bus)
        try:
            return int(gpu) if gpu is not None else None
        except ValueError:
            return None

    def _issue(self, out: _Batch, reason: str, text: str = "") -> None:
        """A line that could not become an event (it is counted as garbled)."""
        out.issues.append(InputIssue(self.source, self.line_no, reason, text))

    def _note(self, out: _Batch, reason: str, text: str = "", *, once: str | None = None) -> None:
        """Something worth knowing about lines that did become events (an unknown code, a missing host);
        ``once`` keys say it a single time per parser, however many lines repeat it."""
        if once is not None:
            if once in self._warned:
                return
            self._warned.add(once)
        out.notes.append(InputIssue(self.source, self.line_no, reason, text))

    def _labels(self, node: str | None, bus: str, gpu: int | None, **extra: str) -> LabelSet:
        key = (node, bus, gpu, *extra.items())
        cached = self._label_cache.get(key)
        if cached is not None:
            return cached
        labels: dict[str, str] = {"pci_bus_id": bus, **extra}
        if node:
            labels["Hostname"] = node
        if gpu is not None:
            labels["gpu"] = str(gpu)
        out = self._label_cache[key] = tuple(sorted(labels.items()))
        return out

    def _count(self, out: _Batch, metric: str, labels: LabelSet, ts: float) -> None:
        self.last_event_ts = ts if self.last_event_ts is None else max(self.last_event_ts, ts)
        key = (metric, labels)
        prev = self.counts.get(key)
        if prev is None:
            out.samples.append((metric, labels, 0.0, ts - BASELINE_OFFSET_S))
            prev = 0
        self.counts[key] = prev + 1
        out.samples.append((metric, labels, float(prev + 1), ts))

    def feed(self, lines: Sequence[str], *, now: float | None = None) -> _Batch:
        out = _Batch()
        env_reader = EnvelopeReader(boot_time=self.boot_time, year=self.year, now=now, tz=self.tz)
        for raw in lines:
            self.line_no += 1
            self.stats["lines"] += 1
            self._feed_line(raw.rstrip("\r\n"), env_reader, now, out)
        return out

    def _feed_line(self, raw: str, env_reader: EnvelopeReader, now: float | None, out: _Batch) -> None:
        looks_ours = "Xid" in raw or "NVRM" in raw or _FALLEN in raw
        if not looks_ours:
            self.stats["ignored"] += 1
            return
        env = env_reader.read(raw)
        ts = env.ts
        if ts is None:
            ts = self._last_ts if self._last_ts is not None else now
        if ts is None:
            if "Xid" in env.body:
                self.stats["garbled"] += 1
                self._issue(out, "no timestamp and no earlier line to take it from", raw)
            return
        self._last_ts = ts
        if self.replay_until is not None and ts <= self.replay_until:
            self.stats["replayed"] += 1
            return
        if env.relative:
            self._note(out, "seconds since boot kept relative: pass boot_time to get wall-clock times",
                       once="relative")
        node = env.host or self.node
        body = env.body

        if m := _XID_RE.search(body):
            self._on_xid(m, node, ts, raw, out)
            return
        if m := _SXID_RE.search(body):
            self._on_sxid(m, node, ts, raw, out)
            return
        if "Xid" in body and ("NVRM" in body or "SXid" in body):
            self.stats["garbled"] += 1
            self._issue(out, "garbled Xid line", raw)
            return
        if "NVRM" not in body and _FALLEN not in body:
            self.stats["ignored"] += 1
            return
        notice = _GPU_NOTICE_RE.search(body)
        if notice is not None:
            bus = normalize_bus_id(notice["bus"])
            if bus is not None and _FALLEN not in body:
                self._notice = (bus, self.line_no)
                return
        if _FALLEN in body:
            bus = normalize_bus_id(notice["bus"]) if notice is not None else None
            if bus is None and self._notice is not None and self.line_no - self._notice[1] <= _NOTICE_SPAN_LINES:
                bus = self._notice[0]
            self._notice = None
            if bus is None:
                self.stats["garbled"] += 1
                self._issue(out, "fallen off the bus without a PCI address", raw)
                return
            gpu = self._gpu(node, bus)
            self.stats["fallen_off"] += 1
            out.fallen_off.append(FallenOffEvent(ts, node, bus, gpu, raw, self.line_no))
            self._count(out, FALLEN_OFF_METRIC, self._labels(node, bus, gpu), ts)
            return
        self.stats["ignored"] += 1

    def _no_node(self, out: _Batch) -> None:
        self._note(out, "line carries no host name and no node was given: samples have no Hostname label",
                   once="no-node")

    def _event_bus(self, m: re.Match[str], node: str | None, raw: str, out: _Batch) -> str | None:
        """The event's PCI address, normalised; None (and a counted issue) when it is not one. Notes once
        that the line names no node, since its samples then carry no Hostname label."""
        bus = normalize_bus_id(m["bus"])
        if bus is None:  # pragma: no cover - the regex only admits bus-shaped text
            self.stats["garbled"] += 1
            self._issue(out, "bad PCI address", raw)
            return None
        if node is None:
            self._no_node(out)
        return bus

    def _on_xid(self, m: re.Match[str], node: str | None, ts: float, raw: str, out: _Batch) -> None:
        bus = self._event_bus(m, node, raw, out)
        if bus is None:
            return
        code = int(m["xid"])
        pid, name, message = _parse_xid_rest(m["rest"] or "")
        gpu = self._gpu(node, bus)
        action: int | None = None
        if code == 154:
            if rm := _RECOVERY_RE.search(message):
                action = _action_code(rm["new"])
                if action not in RECOVERY_ACTIONS:
                    self._note(out, f"unknown GPU recovery action {action}", raw, once=f"action-{action}")
            else:
                self._note(out, "Xid 154 without a recovery action", raw, once="xid154-no-action")
        if xid_info(code) is None:
            self._note(out, f"Xid {code} is not in NVIDIA's catalog (counted anyway)", raw, once=f"xid-{code}")
        self.stats["xid"] += 1
        out.events.append(XidEvent(ts, node, bus, gpu, code, pid, name, message, raw, self.line_no, action))
        self._count(out, XID_METRIC, self._labels(node, bus, gpu, xid=str(code)), ts)
        if action is not None and action in RECOVERY_ACTIONS:
            labels = self._labels(node, bus, gpu)
            self.last_values[(RECOVERY_METRIC, labels)] = float(action)
            out.samples.append((RECOVERY_METRIC, labels, float(action), ts))

    def _on_sxid(self, m: re.Match[str], node: str | None, ts: float, raw: str, out: _Batch) -> None:
        bus = self._event_bus(m, node, raw, out)
        if bus is None:
            return
        rest = (m["rest"] or "").strip()
        head = rest.split(",", 1)[0].strip().lower()
        fatal = True if head == "fatal" else False if head in ("non-fatal", "nonfatal") else None
        message = rest.split(",", 1)[1].strip() if fatal is not None and "," in rest else rest
        link_m = _LINK_RE.search(message)
        link = int(link_m["link"]) if link_m else None
        if link_m is not None and message.startswith(link_m.group(0)):
            message = message[link_m.end():].strip()
        switch = int(m["sw"]) if m["sw"] is not None else None
        code = int(m["sxid"])
        self.stats["sxid"] += 1
        out.sxid_events.append(SXidEvent(ts, node, bus, switch, code, fatal, link, message, raw, self.line_no))
        self._count(out, SXID_METRIC, self._labels(node, bus, None, sxid=str(code)), ts)


@dataclass(slots=True)
class _Batch:
    events: list[XidEvent] = field(default_factory=list)
    sxid_events: list[SXidEvent] = field(default_factory=list)
    fallen_off: list[FallenOffEvent] = field(default_factory=list)
    samples: list[tuple[str, LabelSet, float, float]] = field(default_factory=list)
    issues: list[InputIssue] = field(default_factory=list)
    notes: list[InputIssue] = field(default_factory=list)


_COUNTERS = frozenset((XID_METRIC, SXID_METRIC, FALLEN_OFF_METRIC))


def _recount_in_time_order(
    samples: Sequence[tuple[str, LabelSet, float, float]],
) -> list[tuple[str, LabelSet, float, float]]:
    """Counter samples rebuilt from their events sorted by time, so a log whose lines are out of order
    (merged files, clock steps) still gives a monotonic counter."""
    events: dict[tuple[str, LabelSet], list[float]] = {}
    out: list[tuple[str, LabelSet, float, float]] = []
    for metric, labels, value, ts in samples:
        if metric in _COUNTERS:
            if value > 0:
                events.setdefault((metric, labels), []).append(ts)
        else:
            out.append((metric, labels, value, ts))
    for (metric, labels), times in events.items():
        times.sort()
        out.append((metric, labels, 0.0, times[0] - BASELINE_OFFSET_S))
        out.extend((metric, labels, float(i), t) for i, t in enumerate(times, start=1))
    return out


def _build(samples: Sequence[tuple[str, LabelSet, float, float]], issues: list[InputIssue], at: float) -> Snapshot:
    b = SnapshotBuilder()
    for metric, labels, value, ts in samples:
        b.add(metric, labels, value, ts)
    b.issues.extend(issues)
    return b.build(at)


def parse_kernel_log(
    text: str,
    *,
    source: str,
    node: str | None = None,
    boot_time: float | None = None,
    year: int | None = None,
    bus_to_gpu: BusToGpu | None = None,
    now: float | None = None,
    tz: tzinfo = UTC,
) -> KernelLogResult:
    """Parse a whole kernel log (dmesg, ``dmesg -T``, journald, syslog; see the module doc).

    ``node`` names the host for lines that carry none; ``bus_to_gpu`` maps a bus id (any form) or a
    (node, bus id) pair to the GPU index; ``now`` is the snapshot time (default: the last event) and the
    reference for syslog stamps without a year."""
    parser = KernelLogParser(source=source, node=node, boot_time=boot_time, year=year, bus_to_gpu=bus_to_gpu,
                             tz=tz)
    batch = parser.feed(text.splitlines(), now=now)
    last = max((s[3] for s in batch.samples), default=0.0)
    at = now if now is not None else last
    return KernelLogResult(
        events=batch.events,
        sxid_events=batch.sxid_events,
        fallen_off=batch.fallen_off,
        snapshot=_build(_recount_in_time_order(batch.samples), batch.issues, at),
        issues=batch.issues,
        notes=batch.notes,
        stats=dict(parser.stats),
    )


# ---------------------------------------------------------------------------------------------------------
# Live follower (imperative shell; the tails are in kernel_log_follow)


class KernelLogSource:
    """Follows a kernel log file or command incrementally; ``read(now)`` returns the new events' samples
    plus every known series' current value at ``now`` (as a scrape would), so rates and freshness work.

    Either ``path`` (a file, rotation and truncation followed; or ``/dev/kmsg``, read directly) or
    ``command`` (e.g. ``["dmesg", "-w"]``
    or ``["journalctl", "-k", "-f", "-o", "short-iso-precise"]``). Relative dmesg stamps use ``boot_time``,
    read from /proc/stat when not given; stamps without a zone are read in ``tz``, this machine's local zone
    by default. A missing file or a dead command is a source error, never fatal.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Sequence[str] | None = None,
        command: Sequence[str] | None = None,
        *,
        node: str | None = None,
        boot_time: float | None = None,
        year: int | None = None,
        bus_to_gpu: BusToGpu | None = None,
        from_start: bool = True,
        tz: tzinfo | None = None,
        name: str | None = None,
    ) -> None:
        file: str | None = None
        if isinstance(path, str | os.PathLike):
            file = os.fspath(path)
        elif path is not None:
            command = list(path)  # KernelLogSource(["dmesg", "-w"]) reads as a command
        if (file is None) == (command is None):
            raise ValueError("KernelLogSource needs exactly one of path or command")
        self.name = name or (f"kernel-log:{file}" if file else "kernel-log:" + " ".join(command or ()))
        self.parser = KernelLogParser(
            source=self.name, node=node, boot_time=boot_time if boot_time is not None else read_boot_time(),
            year=year, bus_to_gpu=bus_to_gpu,
            # A live follower reads this machine's logs, stamped (syslog, ctime) in its local time zone.
            tz=tz if tz is not None else (datetime.now().astimezone().tzinfo or UTC),
        )
        self._kmsg = KmsgTail(file, from_start) if file is not None and is_char_device(file) else None
        self._file = FileTail(file) if file is not None and self._kmsg is None else None
        self._cmd = CommandTail(command) if command is not None else None
        self._skip_existing = not from_start
        # The last Xid per normalised bus id (the agent's DCGM_FI_DEV_XID_ERRORS); bounded by the GPU count
        # even under Xid floods.
        self.last_xid: dict[str, XidEvent] = {}
        self.notes: list[InputIssue] = []

    def set_bus_map(self, bus_to_gpu: BusToGpu | None) -> None:
        self.parser.set_bus_map(bus_to_gpu)

    def _lines(self) -> tuple[list[str], str | None]:
        if self._kmsg is not None:
            try:
                return self._kmsg.read_lines(), None
            except OSError as e:
                self._kmsg.close()
                return [], f"cannot read {self._kmsg.path}: {e.strerror or e}"
        if self._file is not None:
            try:
                if self._skip_existing:
                    self._file.offset = os.stat(self._file.path).st_size
                    self._skip_existing = False
                return self._file.read_lines(), None
            except OSError as e:
                return [], f"cannot read {self._file.path}: {e.strerror or e}"
        assert self._cmd is not None
        if self._cmd.proc is None and self.parser.last_event_ts is not None:
            self.parser.replay_until = self.parser.last_event_ts
        try:
            return self._cmd.read_lines()
        except OSError as e:
            return [], f"cannot run {' '.join(self._cmd.command)}: {e.strerror or e}"

    def read(self, now: float) -> Snapshot:
        lines, error = self._lines()
        if error is not None and not lines and not self.parser.counts:
            return failed_snapshot(now, self.name, error)
        batch = self.parser.feed(lines, now=now)
        for e in batch.events:
            self.last_xid[e.pci_bus_id] = e
        self.notes.extend(batch.notes)  # bounded: each kind of note is said once per parser
        samples = list(batch.samples)
        for (metric, labels), count in self.parser.counts.items():
            samples.append((metric, labels, float(count), now))
        for (metric, labels), value in self.parser.last_values.items():
            samples.append((metric, labels, value, now))
        snap = _build(samples, batch.issues, now)
        if error is not None:
            snap.source_errors.append(InputIssue(self.name, 0, error))
        return snap

    def close(self) -> None:
        if self._cmd is not None:
            self._cmd.close()
        if self._kmsg is not None:
            self._kmsg.close()

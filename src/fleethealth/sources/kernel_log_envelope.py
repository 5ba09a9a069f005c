"""A kernel log line's envelope: its time stamp, host and tag, peeled off before the message is read.

Theory of operation. The same driver message reaches us in many wrappers: ``dmesg`` (seconds since boot),
``dmesg -T`` (ctime), syslog and ``journalctl`` short (no year), ISO 8601 (journald, rsyslog, ``dmesg
--time-format iso``), ``journalctl -o short-monotonic`` and ``/dev/kmsg`` records (microseconds since
boot); the table in ``kernel_log``'s docstring lists them. ``EnvelopeReader.read`` first drops a ``<p>``
priority and a ``kern  :err   :`` prefix, then tries the stamp forms in turn (the first that matches wins),
then a ``host tag[pid]:`` prefix (host and tag exclude ':', so ``NVRM: Xid`` never reads as one), then a
dmesg stamp left inside a syslog message (the wall clock already read wins). Boot-relative stamps become
wall clock with ``boot_time``, or stay relative (``Envelope.relative``) without it; stamps without a zone
are read in ``tz``; a syslog stamp takes its year from ``year``, else from ``now`` (a stamp more than a
day ahead of ``now`` is last year's). A stamp that is no real date (Feb 30) gives ``ts`` None and the
parser decides. Pure: no clock is read unless neither ``year`` nor ``now`` is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo

_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                       "nov", "dec"), start=1)}
_PRIO_RE = re.compile(r"^<\d{1,3}>")
_DMESG_X_RE = re.compile(r"^[a-z]+\s*:[a-z]+\s*: ")
_KMSG_RE = re.compile(r"^\d+,\d+,(?P<us>\d+),[^;]*;(?P<rest>.*)$")
_REL_RE = re.compile(r"^\[\s*(?P<sec>\d+\.\d+)\]\s?(?P<rest>.*)$")
_CTIME_RE = re.compile(
    r"^\[(?:[A-Z][a-z]{2}) (?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}) (?P<hms>\d{2}:\d{2}:\d{2}) (?P<year>\d{4})\]"
    r"\s?(?P<rest>.*)$"
)
_SYSLOG_RE = re.compile(
    r"^(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2}) (?P<hms>\d{2}:\d{2}:\d{2})(?P<frac>\.\d+)?\s(?P<rest>.*)$"
)
_ISO_RE = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<hms>\d{2}:\d{2}:\d{2})(?P<frac>[.,]\d+)?"
    r"(?P<tz>Z|[+-]\d{2}:?\d{2})?\s(?P<rest>.*)$"
)
# "host kernel: msg" / "host kernel[123]: msg". Host and tag exclude ':' so "NVRM: Xid" never reads as one.
_HOST_TAG_RE = re.compile(r"^(?P<host>[^\s:\[\]]+) (?P<tag>[^\s:\[\]]+)(?:\[\d+\])?: (?P<rest>.*)$")


@dataclass(slots=True)
class Envelope:
    ts: float | None
    relative: bool
    host: str | None
    body: str


def _tz_offset(text: str | None) -> float | None:
    if not text:
        return None
    if text == "Z":
        return 0.0
    sign = -1.0 if text[0] == "-" else 1.0
    digits = text[1:].replace(":", "")
    return sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)


def _wall(year: int, mon: int, day: int, hms: str, frac: float, tz: tzinfo) -> float | None:
    try:
        h, m, s = (int(x) for x in hms.split(":"))
        return datetime(year, mon, day, h, m, s, tzinfo=tz).timestamp() + frac
    except ValueError:
        return None


class EnvelopeReader:
    def __init__(self, *, boot_time: float | None, year: int | None, now: float | None, tz: tzinfo) -> None:
        self.boot_time = boot_time
        self.year = year
        self.now = now
        self.tz = tz

    def _syslog_year(self) -> int:
        if self.year is not None:
            return self.year
        ref = self.now if self.now is not None else datetime.now(UTC).timestamp()
        return datetime.fromtimestamp(ref, self.tz).year

    def _relative(self, seconds: float) -> tuple[float, bool]:
        if self.boot_time is None:
            return seconds, True
        return self.boot_time + seconds, False

    def read(self, line: str) -> Envelope:
        text = _PRIO_RE.sub("", line.rstrip("\r\n"), count=1)
        text = _DMESG_X_RE.sub("", text, count=1)
        ts: float | None = None
        relative = False
        host: str | None = None

        if m := _KMSG_RE.match(text):
            ts, relative = self._relative(int(m["us"]) / 1e6)
            text = m["rest"]
        elif m := _ISO_RE.match(text):
            try:
                d = datetime.fromisoformat(f"{m['date']}T{m['hms']}")
            except ValueError:
                d = None
            if d is not None:
                off = _tz_offset(m["tz"])
                frac = float(m["frac"].replace(",", ".")) if m["frac"] else 0.0
                if off is None:
                    ts = d.replace(tzinfo=self.tz).timestamp() + frac
                else:
                    ts = d.replace(tzinfo=UTC).timestamp() - off + frac
                text = m["rest"]
        elif m := _CTIME_RE.match(text):
            mon = _MONTHS.get(m["mon"].lower())
            if mon is not None:
                ts = _wall(int(m["year"]), mon, int(m["day"]), m["hms"], 0.0, self.tz)
            text = m["rest"]
        elif m := _SYSLOG_RE.match(text):
            mon = _MONTHS.get(m["mon"].lower())
            if mon is not None:
                frac = float(m["frac"]) if m["frac"] else 0.0
                year = self._syslog_year()
                ts = _wall(year, mon, int(m["day"]), m["hms"], frac, self.tz)
                # A December line read in January belongs to last year.
                if ts is not None and self.year is None and self.now is not None and ts > self.now + 86400:
                    ts = _wall(year - 1, mon, int(m["day"]), m["hms"], frac, self.tz)
                text = m["rest"]
        elif m := _REL_RE.match(text):
            ts, relative = self._relative(float(m["sec"]))
            text = m["rest"]

        if m := _HOST_TAG_RE.match(text):
            host = m["host"]
            text = m["rest"]
        # rsyslog/journald lines may still carry the dmesg stamp inside the message: the wall clock wins.
        if m := _REL_RE.match(text):
            if ts is None:
                ts, relative = self._relative(float(m["sec"]))
            text = m["rest"]
        return Envelope(ts=ts, relative=relative, host=host, body=text.strip())

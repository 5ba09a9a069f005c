"""What a valid exposition holds beyond the grammar of one line: one sample per series and instant, and
OpenMetrics 1.0's rules across lines (metadata, families, histograms, EOF).

Theory of operation. ``sources.exposition`` turns lines into samples as fast as it can prove them. Two
kinds of problems are invisible to a line on its own:

- **Repeats.** A series listed twice at one instant (three values of `a{x="1"}` in one page, or with the
  same explicit timestamp) is one sample, not three. ``SeenSamples`` keeps the (metric, series, time)
  of what a parse has added; a later sample of the same series at the same instant (to the nanosecond,
  as OpenMetrics' own parsers compare timestamps) is dropped and reported, the first kept, as Prometheus
  does ("duplicate sample for timestamp"). Blocks the fast path proved to hold distinct series and
  metrics not seen before cost a dict lookup; only a metric met again, or a block that repeats a
  series, is sorted.
- **OpenMetrics structure.** ``check_openmetrics`` walks an OpenMetrics text line by line (only
  OpenMetrics inputs: exporters answer the classic format first, which has none of these rules) and
  reports each line that breaks the standard: blank lines, unknown or repeated metadata, metadata after
  a family's samples, unit and name mismatches, samples out of their family's group, timestamps going
  back, exemplars where none are allowed or malformed, histogram buckets out of order or without +Inf,
  `_count` not equal to the +Inf bucket, quantiles outside [0, 1], info and stateset values, text after
  `# EOF`, no `# EOF`. The rules are those of the reference parser (prometheus-client's
  ``openmetrics.parser``), which stops at the first problem; here every problem is a numbered issue and
  the samples the line grammar accepted are kept (a degraded read, never a crash, never a silent one).
  It is a Python pass of about 10 us a line (label blocks and groups read once per text, memoised), so
  only OpenMetrics inputs pay it: 0.04 s for a 4,000-line page, about 1 s for a 100k-line one.

Pure functions of their inputs; no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fleethealth.signals.snapshot import SnapshotBuilder

__all__ = ["SeenSamples", "check_openmetrics", "sample_text"]


def sample_text(b: SnapshotBuilder, mid: int, sid: int, value: float) -> str:
    """A sample as exposition text (for an issue that names it)."""
    labels = ",".join(f'{k}="{v}"' for k, v in b.labelsets[sid])
    return f"{b.metrics[mid]}{{{labels}}} {value:g}" if labels else f"{b.metrics[mid]} {value:g}"


@dataclass
class SeenSamples:
    """The (metric, series, time) of every sample one parse has added, by metric id, to find repeats;
    with ``scope`` (parse_many: the page of each sample) a repeat is one within the same scope."""

    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = field(default_factory=list)
    by_metric: dict[int, list[int]] = field(default_factory=dict)
    # The scopes (pages) each metric has samples in: a block of other pages cannot repeat them, so its
    # check skips the earlier parts (parse_many's blocks cover disjoint page groups: without this each
    # group re-sorted every earlier group's samples of the metric, quadratic in the groups).
    scopes: dict[int, np.ndarray] = field(default_factory=dict)

    def first_at_instant(
        self, mids: np.ndarray, sids: np.ndarray, ts: np.ndarray, distinct: bool, scope: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """Which of these samples to keep (None: all): not a repeat of an earlier one (added before, or
        earlier in these arrays) of the same metric and series at the same instant."""
        n = mids.shape[0]
        if n == 0:
            return None
        sc = scope if scope is not None else np.zeros(n, np.int64)
        again = [m for m in _metrics(mids) if m in self.by_metric and self._overlaps(m, sc)]
        if not again and distinct:
            return None
        cols = [mids, sids, ts, sc]
        earlier = sorted({p for m in again for p in self.by_metric[m]})
        if earlier:
            pm = np.concatenate([self.parts[p][0] for p in earlier])
            sel = np.isin(pm, again)
            prev = [
                pm[sel],
                np.concatenate([self.parts[p][1] for p in earlier])[sel],
                np.concatenate([self.parts[p][2] for p in earlier])[sel],
                np.concatenate([_scope(self.parts[p]) for p in earlier])[sel],
            ]
            cols = [np.concatenate((a, b)) for a, b in zip(prev, cols, strict=True)]
        k0 = cols[0].shape[0] - n
        m, s, t, sc = cols
        t = np.round(t, 9)  # nanoseconds, as OpenMetrics timestamps are compared
        order = np.lexsort((np.arange(m.shape[0]), t, s, m, sc))
        same = np.ones(m.shape[0] - 1, bool)
        for c in (m, s, t, sc):
            cs = c[order]
            same &= cs[1:] == cs[:-1]
        repeat = np.zeros(m.shape[0], bool)
        repeat[order[1:][same]] = True
        keep = ~repeat[k0:]
        return None if keep.all() else keep

    def add(self, mids: np.ndarray, sids: np.ndarray, ts: np.ndarray, scope: np.ndarray | None = None) -> None:
        if mids.shape[0] == 0:
            return
        part = len(self.parts)
        self.parts.append((mids, sids, ts, scope))
        sc = scope if scope is not None else np.zeros(1, np.int64)
        top = int(sc.max()) + 1
        for m in _metrics(mids):
            self.by_metric.setdefault(m, []).append(part)
            mask = self.scopes.get(m)
            if mask is None or mask.shape[0] < top:
                grown = np.zeros(max(top, 2 * (0 if mask is None else mask.shape[0])), bool)
                if mask is not None:
                    grown[: mask.shape[0]] = mask
                self.scopes[m] = mask = grown
            mask[sc] = True

    def _overlaps(self, m: int, sc: np.ndarray) -> bool:
        """Whether metric m has earlier samples in any of these scopes."""
        mask = self.scopes[m]
        lo, hi = int(sc.min()), int(sc.max())
        if lo >= mask.shape[0] or not mask[lo : hi + 1].any():  # none in the range (a later page group)
            return False
        return bool(mask[sc[sc < mask.shape[0]]].any())


def _metrics(mids: np.ndarray) -> list[int]:
    return [int(mids[0])] if mids[0] == mids[-1] and (mids == mids[0]).all() else np.unique(mids).tolist()


def _scope(part: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]) -> np.ndarray:
    return part[3] if part[3] is not None else np.zeros(part[0].shape[0], np.int64)


# --- OpenMetrics 1.0 structure ---------------------------------------------------------------------------

_TYPES = {"counter", "gauge", "histogram", "gaugehistogram", "stateset", "info", "summary", "unknown"}
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "histogram": ("_count", "_sum", "_bucket", "_created"),
    "gaugehistogram": ("_gcount", "_gsum", "_bucket"),
    "info": ("_info",),
}
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_QSTR = r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"'
_LABEL = rf"(?:[a-zA-Z_][a-zA-Z0-9_]*|{_QSTR})={_QSTR}"
_LABELS = rf"\{{(?:(?:{_LABEL}|{_QSTR})(?:,{_LABEL})*)?\}}"
_NUMBER = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_VALUE = rf"(?:{_NUMBER}|[+-]?(?:Inf|inf|INF|infinity|Infinity)|NaN|nan)"
_SAMPLE_RE = re.compile(
    rf"({_NAME})?({_LABELS})? ({_VALUE})(?: ({_NUMBER}))?(?: # ({_LABELS}) ({_VALUE})(?: ({_NUMBER}))?)?"
)
_LABEL_RE = re.compile(rf"([a-zA-Z_][a-zA-Z0-9_]*|{_QSTR})=({_QSTR})|({_QSTR})")
_ESC_RE = re.compile(r"\\[\\n\"]")
_ESC = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


def _unq(s: str) -> str:
    return _ESC_RE.sub(lambda m: _ESC[m.group(0)], s[1:-1])


def _labels(text: str | None, memo: dict[str, tuple[str | None, dict[str, str]] | None] | None = None,
            ) -> tuple[str | None, dict[str, str]] | None:
    """(quoted metric name or None, labels) of a label block; None when a label repeats. ``memo``: label
    blocks already read in this text (an exporter repeats each GPU's block in every family)."""
    if not text:
        return None, {}
    if memo is not None:
        if text not in memo:
            memo[text] = _labels(text)
        return memo[text]
    name = None
    out: dict[str, str] = {}
    for m in _LABEL_RE.finditer(text[1:-1]):
        if m.group(3) is not None:
            name = _unq(m.group(3))
            continue
        k = m.group(1)
        k = _unq(k) if k.startswith('"') else k
        if k in out:
            return None
        out[k] = _unq(m.group(2))
    return name, out


def _float(s: str) -> float:
    return float(s)


@dataclass
class _Memo:
    labels: dict[str, tuple[str | None, dict[str, str]] | None] = field(default_factory=dict)
    groups: dict[tuple[str | None, str, str, str], tuple[tuple[str, str], ...]] = field(default_factory=dict)


@dataclass
class _Family:
    name: str
    line: int
    typ: str | None = None
    help: bool = False
    unit: str | None = None
    samples: int = 0
    group: tuple[tuple[str, str], ...] | None = None
    groups: set[tuple[tuple[str, str], ...]] = field(default_factory=set)
    group_ts: float | None = None
    # histogram state of the current group: last le, last bucket value, +Inf seen, count, sum flags
    hist: dict[str, float | bool | None] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.typ or "unknown"

    def allowed(self) -> tuple[str, ...]:
        return tuple(self.name + s for s in _SUFFIXES.get(self.kind, ("",)))


def check_openmetrics(text: str, report: Callable[[int, str, str], None]) -> None:
    """Report every line of OpenMetrics ``text`` that breaks OpenMetrics 1.0, as ``report(line, reason,
    text)``; nothing for a conforming text."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    fam: _Family | None = None
    seen: set[str] = set()
    memo = _Memo()  # label blocks read (this text only)
    eof = False
    for n, line in enumerate(lines, 1):
        if eof:
            report(n, "text after # EOF", line)
            break
        if line == "# EOF":
            eof = True
            continue
        if not line:
            report(n, "blank line (OpenMetrics allows none)", line)
            continue
        if line.startswith("#"):
            fam = _metadata(fam, line, n, seen, report)
            continue
        fam = _sample(fam, line, n, seen, report, memo)
    if fam is not None:
        _close(fam, seen, report)
    if not eof:
        report(len(lines), "no # EOF line at the end (the text may be cut short)", lines[-1] if lines else "")


def _metadata(
    fam: _Family | None, line: str, n: int, seen: set[str], report: Callable[[int, str, str], None]
) -> _Family | None:
    parts = line.split(" ", 3)
    if len(parts) < 4 or parts[0] != "#" or parts[1] not in ("HELP", "TYPE", "UNIT"):
        report(n, "invalid comment line (only # HELP, # TYPE, # UNIT and # EOF)", line)
        return fam
    kind, name, rest = parts[1], parts[2], parts[3]
    if name.startswith('"') and name.endswith('"') and len(name) >= 2:
        name = _unq(name)
    elif re.fullmatch(_NAME, name) is None:
        report(n, f"invalid metric name in # {kind}", line)
        return fam
    if fam is not None and fam.name == name and fam.samples:
        report(n, f"# {kind} after the family's samples", line)
        return fam
    if fam is None or fam.name != name:
        if fam is not None:
            _close(fam, seen, report)
        fam = _Family(name, n)
    if kind == "HELP":
        if fam.help:
            report(n, "a second # HELP for the family", line)
        fam.help = True
    elif kind == "TYPE":
        if fam.typ is not None:
            report(n, "a second # TYPE for the family", line)
        elif rest not in _TYPES:
            report(n, f"unknown type {rest!r}", line)
        else:
            fam.typ = rest
    else:
        if fam.unit is not None:
            report(n, "a second # UNIT for the family", line)
        fam.unit = rest
        if rest and not name.endswith("_" + rest):
            report(n, f"the metric name does not end with its unit _{rest}", line)
        if rest and fam.typ in ("info", "stateset"):
            report(n, f"a unit on a {fam.typ}", line)
    return fam


def _close(fam: _Family, seen: set[str], report: Callable[[int, str, str], None]) -> None:
    _hist_done(fam, report)
    for s in set(_SUFFIXES.get(fam.kind, ()) + ("",)):
        if fam.name + s in seen:
            report(fam.line, f"family name clashes with an earlier one: {fam.name + s}", fam.name)
        seen.add(fam.name + s)


def _sample(
    fam: _Family | None, line: str, n: int, seen: set[str], report: Callable[[int, str, str], None],
    memo: _Memo,
) -> _Family | None:
    m = _SAMPLE_RE.fullmatch(line)
    if m is None:
        report(n, "not an OpenMetrics sample line", line)
        return fam
    bare, blabels, bvalue, bts, ex_labels, ex_value, ex_ts = m.groups()
    got = _labels(blabels, memo.labels)
    if got is None:
        report(n, "duplicate label name", line)
        return fam
    qname, labels = got
    name = bare or qname
    if not name or (bare and qname):
        report(n, "a sample needs exactly one metric name", line)
        return fam
    if fam is None or name not in fam.allowed():
        if fam is not None:
            _close(fam, seen, report)
        fam = _Family(name, n)
    fam.samples += 1
    value = _float(bvalue)
    ts = None if bts is None else _float(bts)
    suffix = name[len(fam.name):]
    typ = fam.kind
    problem = _sample_problem(fam, typ, suffix, labels, value, bvalue)
    if problem:
        report(n, problem, line)
    if ex_labels is not None:
        problem = _exemplar_problem(typ, suffix, ex_labels, ex_ts)
        if problem:
            report(n, problem, line)
    key = (blabels, typ, suffix, fam.name if typ == "stateset" else "")
    group = memo.groups.get(key)
    if group is None:
        group = memo.groups[key] = _group_of(fam, typ, name, labels)
    if fam.group is not None and group != fam.group and group in fam.groups:
        report(n, "the family's samples are not grouped (this label set appeared before)", line)
    if fam.group is not None and group == fam.group:
        if (ts is None) != (fam.group_ts is None):
            report(n, "some samples of a group have a timestamp and some do not", line)
        elif ts is not None and fam.group_ts is not None and ts < fam.group_ts and typ != "info":
            report(n, "timestamps go back within a group", line)
    if typ in ("histogram", "gaugehistogram"):
        if group != fam.group or ts != fam.group_ts:
            _hist_done(fam, report)
            fam.hist = {"line": n}
        _hist_sample(fam, suffix, labels, value, n, line, report)
    fam.group = group
    fam.group_ts = ts
    fam.groups.add(group)
    return fam


def _group_of(fam: _Family, typ: str, name: str, labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    drop = None
    if typ == "summary" and name == fam.name:
        drop = "quantile"
    elif typ == "stateset":
        drop = fam.name
    elif typ in ("histogram", "gaugehistogram") and name == fam.name + "_bucket":
        drop = "le"
    if typ == "info":
        return ()
    return tuple(sorted((k, v) for k, v in labels.items() if k != drop))


def _canonical_le(s: str) -> bool:
    try:
        f = float(s)
    except ValueError:
        return False
    return not (math.isinf(f) and s != ("+Inf" if f > 0 else "-Inf"))


def _sample_problem(fam: _Family, typ: str, suffix: str, labels: dict[str, str], value: float, text: str) -> str | None:
    if typ == "stateset" and fam.name not in labels:
        return f"a stateset sample needs the label {fam.name}"
    if typ == "stateset" and value not in (0.0, 1.0):
        return "a stateset sample is 0 or 1"
    if typ == "info" and value != 1.0:
        return "an info sample is 1"
    if suffix == "_bucket" and typ in ("histogram", "gaugehistogram"):
        le = labels.get("le")
        if le is None or le == "NaN" or not _canonical_le(le):
            return "a bucket needs a valid le label"
    if (
        suffix in ("_bucket", "_count", "_gcount") and typ in ("histogram", "gaugehistogram", "summary")
        and not (math.isfinite(value) and value == int(value))
    ):
        return "a bucket or count is a whole number"
    if typ == "summary" and suffix == "":
        q = labels.get("quantile")
        try:
            qv = float(q) if q is not None else -1.0
        except ValueError:
            qv = -1.0
        if not 0 <= qv <= 1:
            return "a summary quantile needs a quantile label between 0 and 1"
        if value < 0:
            return "a quantile value cannot be negative"
    counter_like = typ in ("counter", "histogram", "gaugehistogram", "summary")
    if counter_like and suffix in ("_total", "_sum", "_count", "_bucket", "_gcount", "_gsum") and value != value:
        return "a counter-like sample cannot be NaN"
    if counter_like and suffix in ("_total", "_sum", "_count", "_bucket", "_gcount") and value < 0:
        return "a counter-like sample cannot be negative"
    return None


def _exemplar_problem(typ: str, suffix: str, ex_labels: str, ex_ts: str | None) -> str | None:
    if not ((typ in ("histogram", "gaugehistogram") and suffix == "_bucket") or (typ == "counter" and suffix == "_total")):
        return "an exemplar is allowed only on a counter's _total and a histogram's _bucket"
    got = _labels(ex_labels)
    if got is None:
        return "duplicate label name in the exemplar"
    if sum(len(k) + len(v) for k, v in got[1].items()) > 128:
        return "exemplar labels longer than 128 characters"
    if ex_ts is not None and not math.isfinite(float(ex_ts)):
        return "invalid exemplar timestamp"
    return None


def _hist_sample(
    fam: _Family, suffix: str, labels: dict[str, str], value: float, n: int, line: str,
    report: Callable[[int, str, str], None],
) -> None:
    h = fam.hist
    if suffix == "_bucket":
        try:
            le = float(labels.get("le", "nan"))
        except ValueError:
            return
        if h.get("count") is not None:
            report(n, "a bucket after the _count", line)
        if le < 0:
            h["negative"] = True
        last = h.get("le")
        if isinstance(last, float) and not le > last:
            report(n, "buckets out of order (le must increase)", line)
        prev = h.get("value")
        if isinstance(prev, float) and value < prev:
            report(n, "bucket values go down (they are cumulative)", line)
        h["le"] = le
        h["value"] = value
    elif suffix in ("_count", "_gcount"):
        h["count"] = value
    elif suffix == "_sum":
        h["sum"] = True
    elif suffix == "_gsum":
        h["gsum"] = True
        if value < 0:
            h["negative_gsum"] = True


def _hist_done(fam: _Family, report: Callable[[int, str, str], None]) -> None:
    """Checks of one histogram group once its last sample is read."""
    h = fam.hist
    if not h or fam.kind not in ("histogram", "gaugehistogram"):
        return
    fam.hist = {}
    n = int(h.get("line") or fam.line)  # type: ignore[arg-type]
    count = h.get("count")
    if h.get("le") != math.inf:
        report(n, f"histogram {fam.name}: no +Inf bucket", fam.name)
    elif count is not None and count != h.get("value"):
        report(n, f"histogram {fam.name}: _count is not the +Inf bucket", fam.name)
    if (h.get("sum") or h.get("gsum")) and count is None:
        report(n, f"histogram {fam.name}: a sum without a count", fam.name)
    if not (h.get("sum") or h.get("gsum")) and count is not None:
        report(n, f"histogram {fam.name}: a count without a sum", fam.name)
    if h.get("negative") and h.get("sum"):
        report(n, f"histogram {fam.name}: _sum with negative buckets", fam.name)
    if h.get("negative_gsum") and not h.get("negative"):
        report(n, f"histogram {fam.name}: negative _gsum without negative buckets", fam.name)

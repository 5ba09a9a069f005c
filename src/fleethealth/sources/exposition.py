"""Prometheus text exposition (0.0.4) and OpenMetrics 1.0 into a columnar Snapshot, fast.

Theory of operation. A scrape of dcgm-exporter is blocks of lines, one block per metric family (`# HELP`,
`# TYPE`, then one line per GPU), and every GPU's label string `{gpu="0",UUID=...}` is byte-identical
across all of its metrics and in the same order in every block. The text is cut at comment lines into
blocks (offsets, no copies), and a block whose lines all start with the same `name{` takes a fast path
made only of C-level bytes, regex and numpy operations, no Python per line:

- first such block: numpy finds every newline and '}' (one per line), which cuts each line into (raw
  label string, value text) in place (``_cut_lines``); each raw label string is interned once (new ones
  are parsed together through a bytes template regex built from the first, see ``_parse_labels_bulk``;
  later parses of the same exporter hit a cache);
- every later block with the same label sequence is proved in place, piece by piece while the piece is
  in the CPU cache: numpy finds the newlines, the name at every line start and the known label string
  at every label offset are compared as fixed-width rows gathered by numpy (one memcmp per piece), and
  the value texts are gathered between the labels and the next newlines (``_template_block``, with the
  proof); the series ids are then reused as they are. No regex pass, no copy of the block;
- values: numpy's integer reader for plain digits, an exact decimal reader, else int(), else float()
  (same floats as float()); NaN, Inf, DCGM blank sentinels (DCGM's exact blank values, on DCGM_FI_*
  fields only) and negative counters are found with numpy and become issues.

A block with several names (a histogram's `_bucket`, `_sum`, `_count`) is cut into (name, labels,
value) the same C-level way. Anything the bulk paths cannot prove (timestamps, exemplars, lines without
labels, odd spacing, a broken line) falls back, per block, to a careful line-by-line parser that reports
each bad line with its number. Property tests check that all paths, and prometheus-client, read the same
samples, and that any single corrupted byte reads exactly as the careful parser reads it.

Many small pages (a scrape of thousands of exporters) go through ``parse_many``: pages with the same
comment lines are parsed together, block j of every page as one big block on the same fast path, so
12,500 pages cost about what one big text costs instead of ~2 ms of per-block overhead each.

Bad input never raises and never becomes a value: it becomes an ``InputIssue(source, line, reason,
text)`` on the snapshot. Empty label values mean "label absent", as in Prometheus. A NUL byte is refused
wherever it could reach a name or label (the label parser, on every path; the careful path for the whole
line; names and values never take one on the fast paths). Every add goes through
``exposition_rules.SeenSamples``: a series repeated at one instant keeps its first sample and the rest are
reported (proven blocks of distinct series, the common case, cost a dict lookup). OpenMetrics texts are
also checked against the standard's rules across lines (``exposition_rules.check_openmetrics``). Metric
names quoted inside the braces (`{"a.b_total",x="y"} 1`) and `{,}` are read on the careful path.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from fleethealth.signals.snapshot import InputIssue, LabelSet, Snapshot, SnapshotBuilder
from fleethealth.sources.exposition_rules import SeenSamples, check_openmetrics, sample_text

__all__ = [
    "DCGM_FIELD_PREFIX",
    "DCGM_FP64_BLANK",
    "DCGM_INT32_BLANK",
    "DCGM_INT64_BLANK",
    "blank_sentinel_mask",
    "clear_label_cache",
    "counter_like",
    "is_dcgm_field",
    "is_openmetrics",
    "parse_exposition",
    "parse_many",
    "parse_many_into",
    "value_problem",
]

# DCGM's "no value" markers (dcgm_structs.h, DCGM_BLANK_VALUES): a base value plus 0..15 for the kinds
# of blank (not found, not supported, not permissioned, ...). dcgm-exporter prints them as numbers, e.g.
# DCGM_FI_DEV_MEMORY_TEMP 9223372036854775794 (INT64 blank + 2 = not supported).
DCGM_INT32_BLANK = 0x7FFFFFF0  # 2147483632
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0  # 9223372036854775792
DCGM_FP64_BLANK = 140737488355328.0  # 2**47
# The exact blank values as the text reads them (float64): INT32 and FP64 blank + 0..15; every INT64 blank
# + 0..15 reads as 2**63. Only DCGM fields (DCGM_FI_*) carry them: any other metric may legitimately hold
# such a number (a Go exporter's process_virtual_memory_max_bytes is 2**64 - 1, a byte counter passes
# 2**47), so on them it is a plain sample.
_DCGM_BLANKS = np.array(sorted(
    {float(DCGM_INT32_BLANK + k) for k in range(16)} | {DCGM_FP64_BLANK + k for k in range(16)}
    | {float(DCGM_INT64_BLANK + k) for k in range(16)}
))
_DCGM_BLANK_SET = frozenset(_DCGM_BLANKS.tolist())
_BLANK_MIN = float(DCGM_INT32_BLANK)
DCGM_FIELD_PREFIX = "DCGM_FI_"

_NAME_RE = re.compile(rb"[a-zA-Z_:][a-zA-Z0-9_:]*")
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
_LNAME = r'[a-zA-Z_][a-zA-Z0-9_]*|"[^"\\]*(?:\\.[^"\\]*)*"'
_LVALUE = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
_PAIR = rf"[ \t]*({_LNAME})[ \t]*=[ \t]*{_LVALUE}[ \t]*"
_PAIR_RE = re.compile(_PAIR)
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}

_COUNTER_SUFFIXES = ("_total", "_count", "_bucket")

# Raw label string -> parsed, sorted label pairs (or the reason it is invalid). Parsing a label string is
# the costly part of a cold parse; scrapes of the same exporters repeat the same strings every cycle
# (Prometheus keeps the same kind of cache per target). Pure memo of a pure function; bounded.
_LABEL_CACHE: dict[bytes, LabelSet | str] = {}
_LABEL_CACHE_MAX = 500_000  # a 100k-GPU fleet has ~100k GPU label sets


# (extra labels, raw label string) -> merged label set, for parse_many: every scrape cycle merges the same
# target labels into the same label strings. Same memo rules as _LABEL_CACHE.
_MERGED_CACHE: dict[tuple[LabelSet, bytes], LabelSet] = {}


def clear_label_cache() -> None:
    """Forget parsed label strings (benchmarks use it to time a cold parse)."""
    _LABEL_CACHE.clear()
    _MERGED_CACHE.clear()


def _unescape(s: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], s) if "\\" in s else s


def _parse_labels(raw: bytes) -> LabelSet | str:
    """Parse `{k="v", ...}` into sorted pairs, or return why it is invalid."""
    hit = _LABEL_CACHE.get(raw)
    if hit is not None:
        return hit
    result: LabelSet | str
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        result = "invalid UTF-8 in labels"
    else:
        result = _split_labels(text)
    if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()
    _LABEL_CACHE[raw] = result
    return result


_NUL_REASON = "NUL byte in a metric or label name or value"


def _split_labels(text: str) -> LabelSet | str:
    # One regex pass: re.split leaves what lies between well-formed pairs in the gaps, so the text is a
    # valid label list exactly when the gaps are "", ",", ..., "," and a last "" or "," (trailing comma).
    inner = text[1:-1] if text[:1] == "{" and text[-1:] == "}" else None
    if inner is None:
        return "invalid label set"
    if "\0" in inner:  # (NUL is never part of a label name or value: Prometheus rejects it)
        return _NUL_REASON
    if not inner.strip() or inner.strip(" \t") == ",":  # `{}`, and `{,}` as Prometheus reads it
        return ()
    pieces = _PAIR_RE.split(inner)
    gaps = pieces[0::3]
    n = len(gaps) - 1
    if (
        n == 0
        or gaps[0].strip()
        or gaps[1:n].count(",") != n - 1
        or gaps[n].strip() not in ("", ",")
    ):
        return "invalid label set"
    keys = pieces[1::3]
    values = pieces[2::3]
    if "\\" in inner:
        values = [_unescape(v) for v in values]
    if inner.count('"') > 2 * n:  # quoted (UTF-8) label names, or escaped quotes in values
        keys = [_unescape(k[1:-1]) if k[:1] == '"' else k for k in keys]
    if len(set(keys)) != len(keys):
        return "duplicate label name"
    if "__name__" in keys:
        return "metric name given as a label"
    # Prometheus treats an empty label value as an absent label (dcgm-exporter prints pod="" for GPUs with
    # no workload); store it the way Prometheus does.
    return tuple(sorted((k, v) for k, v in zip(keys, values, strict=True) if v))


def _parse_labels_bulk(raws: list[bytes], depth: int = 0) -> None:
    """Parse many new label strings into the cache at once.

    Exporters print every series with the same keys in the same order and spacing (dcgm-exporter: gpu,
    UUID, pci_bus_id, ...), so the first string, parsed carefully, becomes a template regex whose only
    variables are the values. One findall over all strings (joined by newlines, as bytes: no decode of
    the whole text) then yields every value tuple. Strings of another shape (a histogram's `_sum` next to
    its `_bucket`s with `le`) get their own template, a few shapes deep; text with escapes takes the str
    template below.

    Why this is exact: with no backslash in the text, a label value is ``"[^"]*"`` in ``_split_labels``'
    grammar, which is what the template's groups match (a NOT_LITERAL loop, several times faster in
    ``re`` than a character class). Every match runs from a line start (``^``) to a line end (``$``)
    and the catch-all ``(.+)`` takes any other line, so matches are whole lines, disjoint, at least one
    line each: as many matches as strings means one match per string, even though ``[^"]*`` could cross
    a newline. A string that fits has the first string's keys, separators and spacing byte for byte and
    values without quotes or escapes, so ``_split_labels`` would give the same pairs.
    """
    todo = [r for r in raws if r not in _LABEL_CACHE] if _LABEL_CACHE else list(raws)
    if len(todo) < 8 or depth >= 6:
        for r in todo:
            _parse_labels(r)
        return
    joined = b"\n".join(todo)
    if b"\0" in joined:  # the templates' value groups would take a NUL: each string on its own
        for r in todo:
            _parse_labels(r)
        return
    if b"\\" in joined or joined.count(b"\n") != len(todo) - 1:
        _parse_labels_bulk_str(todo, depth)
        return
    shape = _template_of(todo[0])
    if shape is None:
        _parse_labels(todo[0])
        _parse_labels_bulk(todo[1:], depth + 1)
        return
    segs, keys = shape
    template = re.compile(
        rb"^(?:\{" + rb'([^"]*)'.join(re.escape(x.encode("utf-8")) for x in segs) + rb"\}|(.+))$", re.M
    )
    found = template.findall(joined)
    if not _cache_found(todo, found, keys, depth):
        for r in todo:
            _parse_labels(r)


def _template_of(first_raw: bytes) -> tuple[list[str], list[str]] | None:
    """The text between the values of a label string (its separators, keys and spacing) and its keys,
    from a careful parse; None when the string is invalid, empty, escaped or repeats a key."""
    try:
        first = first_raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parsed = _split_labels(first)
    if isinstance(parsed, str) or not parsed or "\\" in first:
        return None
    inner = first[1:-1]
    segs: list[str] = []
    keys: list[str] = []
    pos = 0
    for m in _PAIR_RE.finditer(inner):
        k = m.group(1)
        keys.append(_unescape(k[1:-1]) if k[:1] == '"' else k)
        segs.append(inner[pos : m.start(2)])
        pos = m.end(2)
    segs.append(inner[pos:])
    if len(set(keys)) != len(keys):
        return None
    return segs, keys


def _cache_found(
    todo: list[bytes], found: list[tuple[Any, ...]], keys: list[str], depth: int
) -> bool:
    """Cache the label sets of the strings that fit the template (``found[i]``: their values, and a last
    group holding the whole string when it does not fit); other shapes go round again. False, having
    cached nothing, when the matches are not one per string or a value is not UTF-8."""
    if len(found) != len(todo):
        return False
    nk = len(keys)
    other = [raw for raw, f in zip(todo, found, strict=True) if f[nk]] if any(map(itemgetter(nk), found)) else []
    if other:
        fits = [(raw, f) for raw, f in zip(todo, found, strict=True) if not f[nk]]
        todo = [raw for raw, _ in fits]
        found = [f for _, f in fits]
    try:
        sets = _label_sets(found, keys)
    except UnicodeDecodeError:
        return False
    if len(_LABEL_CACHE) + len(todo) >= _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()
    _LABEL_CACHE.update(zip(todo, sets, strict=True))
    if other:
        _parse_labels_bulk(other, depth + 1)
    return True


def _parse_labels_bulk_str(todo: list[bytes], depth: int) -> None:
    """``_parse_labels_bulk`` for text with backslashes: the same template on decoded text, with value
    groups that refuse escapes (a string with one takes the careful path)."""
    try:
        first = todo[0].decode("utf-8")
        joined = b"\n".join(todo).decode("utf-8")
    except UnicodeDecodeError:
        first = ""
    shape = _template_of(todo[0]) if first else None
    if shape is None:
        _parse_labels(todo[0])
        _parse_labels_bulk(todo[1:], depth + 1)
        return
    segs, keys = shape
    # Each line either fits the template (value groups) or is captured whole by the last group.
    template = re.compile(r"^(?:\{" + r'([^"\\\n]*)'.join(re.escape(x) for x in segs) + r"\}|(.+))$", re.M)
    if not _cache_found(todo, template.findall(joined), keys, depth):
        for r in todo:
            _parse_labels(r)


def _label_sets(found: list[tuple[Any, ...]], keys: list[str]) -> list[LabelSet]:
    """``_column_label_sets`` for value tuples (one per string, in ``keys`` order); ``itemgetter``
    columns (``zip(*found)`` over 100k tuples made 100k iterators and cost five times more)."""
    if not found:
        return []
    return _column_label_sets([list(map(itemgetter(j), found)) for j in range(len(keys))], keys)


def _column_label_sets(columns: list[list[Any]], keys: list[str]) -> list[LabelSet]:
    """Sorted label sets from value columns (``columns[j]``: the values of ``keys[j]``, one per string;
    bytes are decoded as UTF-8), built column by column with C-level loops: the pairs of a value shared
    by many strings (gpu="0", modelName, the driver) are one tuple object, and zip() assembles the label
    sets. Fewer new objects also means fewer garbage collector passes. Empty values mean an absent label
    and are dropped (a Python loop for those only). Raises UnicodeDecodeError on a value that is not
    UTF-8."""
    n = len(columns[0]) if columns else 0
    if n == 0:
        return []
    cols: list[list[tuple[str, str]]] = []
    empty = False
    for j in sorted(range(len(keys)), key=keys.__getitem__):
        k = keys[j]
        col = columns[j]
        # A column whose first values are mostly distinct (UUIDs) is not worth a set of all its values.
        uniq = set(col) if len(set(col[:64])) <= 16 else None
        if uniq is not None and len(uniq) * 4 <= n:
            pair_of = {v: (k, v.decode("utf-8") if isinstance(v, bytes) else v) for v in uniq}
            cols.append(list(map(pair_of.__getitem__, col)))
            empty = empty or "" in uniq or b"" in uniq
        else:
            strs = list(map(bytes.decode, col)) if isinstance(col[0], bytes) else col
            cols.append(list(zip(repeat(k), strs)))
            empty = empty or not all(strs)
    sets: list[LabelSet] = list(zip(*cols, strict=True))
    if empty:
        sets = [tuple(p for p in ls if p[1]) for ls in sets]
    return sets


def counter_like(name: str, types: Mapping[str, str]) -> bool:
    """Whether a sample name must never go negative: a counter family's sample (not `_created`), a
    histogram/summary `_count`/`_bucket`, or any name ending `_total`/`_count`/`_bucket`."""
    # An OpenMetrics counter family `foo` has samples `foo_total` (covered by the suffix) and
    # `foo_created` (a timestamp, not a counter); 0.0.4 declares the sample name itself as counter.
    return name.endswith(_COUNTER_SUFFIXES) or types.get(name) == "counter"


def blank_sentinel_mask(values: np.ndarray, dcgm: bool | np.ndarray) -> np.ndarray:
    """True where a value is a DCGM blank sentinel: exactly one of DCGM's blank values (dcgm_structs.h:
    INT32, INT64 and FP64 blank + 0..15 for not found, not supported, not permissioned, ...) on a DCGM
    field (``dcgm``: the metric is DCGM_FI_*, per value or for all). Values below the smallest blank (all
    of them, nearly always) cost one vectorised compare."""
    if dcgm is False:
        return np.zeros(values.shape[0], bool)
    m = values >= _BLANK_MIN
    if not m.any():
        return m
    idx = np.flatnonzero(m)
    m[idx] = np.isin(values[idx], _DCGM_BLANKS)
    return m & dcgm if dcgm is not True else m


def is_dcgm_field(name: str) -> bool:
    """Whether a metric is a DCGM field (the only metrics DCGM blank sentinels are recognised on)."""
    return name.startswith(DCGM_FIELD_PREFIX)


def value_problem(name: str, value: float, counter: bool) -> str | None:
    """Why one value must not become a signal, or None. Scalar twin of the vectorised checks (same rules
    as ``blank_sentinel_mask``)."""
    if value != value:
        return "NaN value"
    if value == _INF or value == -_INF:
        return "infinite value"
    if value >= _BLANK_MIN and value in _DCGM_BLANK_SET and name.startswith(DCGM_FIELD_PREFIX):
        return "DCGM blank sentinel (field not supported or not found)"
    if counter and value < 0:
        return "negative counter"
    return None


_INF = float("inf")


def is_openmetrics(data: bytes) -> bool:
    """OpenMetrics text ends with a `# EOF` line."""
    return data[-64:].rstrip().endswith(b"# EOF")


def _bad_values(is_counter: Callable[[str], bool], bname: bytes, values: np.ndarray) -> tuple[str, bool, np.ndarray]:
    """A block's metric name, whether it is a counter, and which of its values become missing data:
    NaN/Inf, DCGM blank sentinels (on DCGM fields), negative counters."""
    name = bname.decode("ascii")
    counter = bool(is_counter(name))
    bad = ~np.isfinite(values) | blank_sentinel_mask(values, name.startswith(DCGM_FIELD_PREFIX))
    if counter:
        bad |= values < 0
    return name, counter, bad


def _merge_extra(parsed: LabelSet, extra: LabelSet) -> LabelSet:
    """A sample's labels with the scraper's: as Prometheus does by default (honor_labels: false), the
    scraper's labels win, and a sample's own value of such a label is kept as exported_<name>."""
    out = parsed
    for pair in extra:  # the usual case, no shared name: insert each pair at its sorted place (C-level)
        i = bisect_left(out, (pair[0],))
        if i < len(out) and out[i][0] == pair[0]:
            break
        out = out[:i] + (pair,) + out[i:]
    else:
        return out
    # Prometheus' mutateSampleLabels and resolveConflictingExposedLabels: every own label a scraper
    # label overrides (even with the same value) moves to exported_<name>, shortest names first, adding
    # prefixes until the name is free.
    merged = dict(parsed)
    conflicts = [(k, merged[k]) for k, _ in extra if merged.get(k)]
    merged.update(extra)
    for k, own in sorted(conflicts, key=lambda p: len(p[0])):
        name = k
        while True:
            name = "exported_" + name
            if not merged.get(name):
                merged[name] = own
                break
    return tuple(sorted(merged.items()))


@dataclass
class _Ctx:
    builder: SnapshotBuilder
    source: str
    default_ts: float
    ts_div: float
    extra: tuple[tuple[str, str], ...]
    types: dict[str, str] = field(default_factory=dict)
    _sids: dict[bytes, int] = field(default_factory=dict)  # raw label string -> series id; see ``sids``
    _pending: list[tuple[list[bytes], list[int]]] = field(default_factory=list)
    bad_labels: dict[bytes, str] = field(default_factory=dict)
    counter_cache: dict[str, bool] = field(default_factory=dict)
    template: _Template | None = None  # the last block's label sequence
    scratch: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # see _newlines
    issues: list[InputIssue] = field(default_factory=list)
    m: list[int] = field(default_factory=list)
    s: list[int] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    t: list[float] = field(default_factory=list)
    ln: list[int] = field(default_factory=list)
    added: int = 0  # samples this context has put into the builder (per-page counts for parse_many)
    seen: SeenSamples = field(default_factory=SeenSamples)
    scope: int | None = None  # parse_many: this page's number in the batch's SeenSamples

    def add_arrays(
        self, mids: np.ndarray, sids: np.ndarray, values: np.ndarray, ts: np.ndarray,
        lines: int | np.ndarray = 0, distinct: bool = False,
    ) -> None:
        """Add samples (line ``lines[i]``, or ``lines + i`` when an int, of the text); a sample of a series
        already read at the same instant is dropped and reported, as Prometheus does (the first is kept).
        ``distinct``: the caller knows the samples' (metric, series) pairs are distinct (a proven block)."""
        if self.m:
            _flush_careful(self)  # careful-path samples of earlier lines go first
        scope = None if self.scope is None else np.full(mids.shape[0], self.scope, np.int64)
        keep = self.seen.first_at_instant(mids, sids, ts, distinct, scope)
        if keep is not None:
            for i in np.flatnonzero(~keep).tolist():
                line = lines + i if isinstance(lines, int) else int(lines[i])
                self.issue(line, "duplicate sample for timestamp (the first is kept)",
                           sample_text(self.builder, int(mids[i]), int(sids[i]), float(values[i])))
            mids, sids, values, ts = mids[keep], sids[keep], values[keep], ts[keep]
            scope = None if scope is None else scope[keep]
        self.seen.add(mids, sids, ts, scope)
        self.added += int(values.shape[0])
        self.builder.add_arrays(mids, sids, values, ts)

    def scratch_of(self, size: int) -> np.ndarray:
        """A reusable bool buffer of at least ``size`` (fresh pages cost a fault each)."""
        if self.scratch.shape[0] < size:
            self.scratch = np.empty(size, bool)
        return self.scratch

    def issue(self, line: int, reason: str, text: bytes | str) -> None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        self.issues.append(InputIssue(self.source, line, reason, text.strip()[:200]))

    def is_counter(self, name: str) -> bool:
        c = self.counter_cache.get(name)
        if c is None:
            c = self.counter_cache[name] = counter_like(name, self.types)
        return c

    def series_many(self, raws: list[bytes]) -> list[int] | None:
        """Series ids of many raw label strings already in the label cache; None if any is invalid."""
        parsed = list(map(_LABEL_CACHE.get, raws))
        if self.extra or not set(map(type, parsed)) <= {tuple}:
            out: list[int] = []
            for r in raws:
                sid = self.series(r)
                if isinstance(sid, str):
                    return None
                out.append(sid)
            return out
        ids = self.builder.series_ids(parsed)  # type: ignore[arg-type]
        self._pending.append((raws, ids))
        return ids

    @property
    def sids(self) -> dict[bytes, int]:
        """Series id of every raw label string interned so far. Bulk interning only queues its strings
        and ids: a 100k-GPU scrape whose later blocks all follow the template never looks one up, and
        the dict of 100k 200-byte keys costs about 2% of the parse."""
        if self._pending:
            for raws, ids in self._pending:
                self._sids.update(zip(raws, ids, strict=True))
            self._pending.clear()
        return self._sids

    def series(self, raw: bytes) -> int | str:
        """Series id for a raw label string (with extra labels merged), or why it is invalid."""
        sid = self.sids.get(raw)
        if sid is not None:
            return sid
        bad = self.bad_labels.get(raw)
        if bad is not None:
            return bad
        parsed = _parse_labels(raw)
        if isinstance(parsed, str):
            self.bad_labels[raw] = parsed
            return parsed
        if self.extra:
            parsed = _merge_extra(parsed, self.extra)
        sid = self.sids[raw] = self.builder.series_id(parsed)
        return sid


def parse_exposition(
    data: str | bytes,
    *,
    default_ts: float,
    source: str = "<text>",
    builder: SnapshotBuilder | None = None,
    extra_labels: Mapping[str, str] | None = None,
    openmetrics: bool | None = None,
) -> Snapshot:
    """Parse Prometheus text format 0.0.4 or OpenMetrics 1.0 into a Snapshot.

    Samples without a timestamp get ``default_ts``; timestamps are milliseconds in 0.0.4 and seconds in
    OpenMetrics (detected by the closing `# EOF` unless ``openmetrics`` says). Histogram and summary lines
    (`_bucket`, `_sum`, `_count`) stay separate samples under their own names, `le` is a label.
    ``extra_labels`` are added to every sample (a sample's own different value for one of them is kept as
    ``exported_<name>``, as Prometheus does). With ``builder``,
    samples go into it (shared interning across endpoints) and the result is ``builder.build(default_ts)``.
    """
    b = builder if builder is not None else SnapshotBuilder()
    raw = _normalise(data)
    om = is_openmetrics(raw) if openmetrics is None else openmetrics
    ctx = _Ctx(b, source, float(default_ts), 1.0 if om else 1000.0, _extra_key(extra_labels))
    _parse_page(ctx, raw, om)
    return b.build(float(default_ts))


def _parse_page(ctx: _Ctx, raw: bytes, om: bool) -> None:
    """One page into ``ctx`` and its builder: samples, and every problem as an issue (OpenMetrics text is
    also checked against the standard's rules across lines, ``exposition_rules.check_openmetrics``)."""
    _parse_into(ctx, raw, om)
    if om:
        known = {i.line for i in ctx.issues}

        def report(line: int, reason: str, text: str) -> None:
            if line not in known:
                known.add(line)
                ctx.issue(line, reason, text)

        check_openmetrics(raw.decode("utf-8", "replace"), report)
        ctx.issues.sort(key=lambda i: i.line)
    _flush(ctx)



Page = tuple[str | bytes, Mapping[str, str] | None, str]


def parse_many(
    pages: Sequence[Page],
    *,
    default_ts: float,
    builder: SnapshotBuilder | None = None,
    sample_counts: list[int] | None = None,
) -> Snapshot:
    """Parse many exposition pages, each ``(text, extra_labels, source)``, into one Snapshot: the same
    samples, label sets and issues as ``parse_exposition`` on each page (line numbers per page, issues
    naming the page's source), at about the cost of one big text.

    Why: a fleet is thousands of small pages (one dcgm-exporter per node, 200 lines each), and parsing
    them one call at a time costs per-block Python overhead on every page (~2 ms a page: 28 s for 12,500
    pages). Pages of the same exporter share a skeleton: the same comment lines in the same order, one
    block of lines per metric. So the pages are cut at their comment lines all at once (C-level split and
    maps), grouped by skeleton, and block j of every page in a group is joined into one big block that
    takes the single-text fast path (label template, rebuild-and-compare for later blocks, bulk values).
    Series are interned per (page, label string), so equal label strings on two pages (vLLM replicas)
    stay distinct series once each page's extra labels are added.

    Anything the batched path cannot prove falls back to the careful paths with the page's own context:
    a block that fails in the batch is parsed page by page (only that block), and a page whose shape the
    batch cannot cut (OpenMetrics with `# EOF`, no leading comment, a '#' inside a line, a mid-page
    `# EOF`) is parsed alone. A broken page only affects its own entities. ``sample_counts``, when
    given, is filled with the number of samples kept per page (in ``pages`` order).
    """
    b = builder if builder is not None else SnapshotBuilder()
    parse_many_into(b, pages, default_ts=default_ts, sample_counts=sample_counts)
    return b.build(float(default_ts))


def parse_many_into(
    b: SnapshotBuilder, pages: Sequence[Page], *, default_ts: float, sample_counts: list[int] | None = None
) -> None:
    """``parse_many`` into a builder the caller builds (a scraper adding its own `up` samples)."""
    ts = float(default_ts)
    counts = [0] * len(pages)
    extras = [_extra_key(extra) for _, extra, _ in pages]
    sources = [str(src) for _, _, src in pages]
    raws = [_normalise(data) for data, _, _ in pages]
    batch = [i for i, raw in enumerate(raws) if raw[:1] == b"#" and not is_openmetrics(raw)]
    alone = sorted(set(range(len(pages))).difference(batch))
    if batch:
        st = _Batch(b, ts, [sources[i] for i in batch], [extras[i] for i in batch], np.zeros(len(batch), np.int64))
        rejected = _parse_batch(st, [_one_newline(raws[i]) for i in batch])
        for k, c in enumerate(st.counts.tolist()):
            counts[batch[k]] = c
        alone = sorted(alone + [batch[k] for k in rejected])
    for i in alone:
        ctx = _Ctx(b, sources[i], ts, 1.0 if is_openmetrics(raws[i]) else 1000.0, extras[i])
        _parse_page(ctx, raws[i], is_openmetrics(raws[i]))
        counts[i] = ctx.added
    if sample_counts is not None:
        sample_counts[:] = counts


@dataclass
class _Batch:
    builder: SnapshotBuilder
    default_ts: float
    sources: list[str]
    extras: list[LabelSet]
    counts: np.ndarray  # samples kept per batch page
    ctxs: dict[int, _Ctx] = field(default_factory=dict)  # careful-path contexts of pages, made on demand
    seen: SeenSamples = field(default_factory=SeenSamples)  # what the batched blocks added (for repeats)

    def ctx(self, page: int) -> _Ctx:
        c = self.ctxs.get(page)
        if c is None:
            c = self.ctxs[page] = _Ctx(self.builder, self.sources[page], self.default_ts, 1000.0, self.extras[page],
                                       seen=self.seen, scope=page)  # (repeats checked against the batch's)
        return c


def _one_newline(raw: bytes) -> bytes:
    """The page ending in exactly one newline (what the batch's cut expects), copied only if needed."""
    if raw[-1:] == b"\n" and raw[-2:-1] not in (b"\n", b" ", b"\t"):
        return raw
    return raw.rstrip(b" \t\n") + b"\n"


def _parse_batch(st: _Batch, raws: list[bytes]) -> list[int]:
    """The batched path of ``parse_many`` over 0.0.4 pages that start with '#' and end with one newline.
    Returns the pages it did not touch because it cannot cut them; the caller parses those alone.

    Pages are never joined into one text: a fresh 500 MB allocation costs about as much as parsing it
    (page faults), while buffers of a few MB are reused by the allocator."""
    rejected: set[int] = set()
    # Pages are taken a few MB at a time: one vectorised scan finds their comment lines, and every block
    # of them is parsed while they are still in the CPU cache (a block of 12,500 pages gathered in one go
    # reads memory scattered over the whole scrape, 25 times over). The allocator reuses buffers this size.
    lo = 0
    while lo < len(raws):
        hi, size = lo, 0
        while hi < len(raws) and (size < _SCAN_BYTES or hi == lo):
            size += len(raws[hi])
            hi += 1
        groups: dict[tuple[bytes, ...], list[int]] = {}
        where: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        _scan_pages(raws, lo, hi, groups, rejected, where)
        for heads_t, gp in groups.items():
            hm = np.stack([where[p][0] for p in gp])
            bs = np.stack([where[p][1] for p in gp]) + 1
            lens = np.fromiter(map(len, (raws[p] for p in gp)), np.int64, len(gp))
            be = np.concatenate((hm[:, 1:], lens[:, None]), axis=1)
            grp = _Group([raws[p] for p in gp], gp, hm, bs, be)
            if not _parse_group(st, grp, list(heads_t)):
                rejected.update(gp)
        lo = hi
    return sorted(rejected)


_SCAN_BYTES = 4 << 20


def _scan_pages(
    raws: list[bytes], lo: int, hi: int, groups: dict[tuple[bytes, ...], list[int]], rejected: set[int],
    where: dict[int, tuple[np.ndarray, np.ndarray]],
) -> None:
    """Comment lines of pages lo..hi-1 from one vectorised scan for '#' over them joined (bytes.split and
    bytes.find with a longer needle crawl at ~1 GB/s). A '#' opens a comment only at a line start and
    before a space; a page with any other '#' (in a label value, "#foo" lines) is parsed alone. Appends
    each page's (comment offsets, newline after each) to ``where`` and groups pages by their comments."""
    pages = raws[lo:hi]
    lens = np.fromiter(map(len, pages), np.int64, len(pages))
    ends = np.cumsum(lens)
    starts = ends - lens
    text = b"".join(pages)
    buf = np.frombuffer(text, np.uint8)
    hashes = np.flatnonzero(buf == 35)
    page_of = np.searchsorted(ends, hashes, side="right")
    ok = (buf[hashes + 1] == 32) & ((buf[np.maximum(hashes - 1, 0)] == 10) | (hashes == starts[page_of]))
    bad = set(page_of[~ok].tolist())
    n_h = np.bincount(page_of, minlength=len(pages))
    h_off = (np.cumsum(n_h) - n_h).tolist()
    nl = np.fromiter(map(text.find, repeat(b"\n"), hashes.tolist()), np.int64, hashes.shape[0])
    heads = list(map(text.__getitem__, map(slice, (hashes + 1).tolist(), nl.tolist())))
    local_h = hashes - starts[page_of]
    local_nl = nl - starts[page_of]
    for k, (o, c) in enumerate(zip(h_off, n_h.tolist(), strict=True)):
        p = lo + k
        if k in bad or c == 0 or local_h[o] != 0:
            rejected.add(p)
            continue
        groups.setdefault(tuple(heads[o : o + c]), []).append(p)
        where[p] = (local_h[o : o + c], local_nl[o : o + c])


@dataclass
class _Group:
    """Pages of one skeleton: in page k (``texts[k]``, batch page ``pages[k]``) comment line j starts at
    hm[k, j] and its sample lines span bs[k, j]..be[k, j] (each line ending in a newline)."""

    texts: list[bytes]
    pages: list[int]
    hm: np.ndarray
    bs: np.ndarray
    be: np.ndarray

    def comment_lines(self, ks: np.ndarray, j: int) -> np.ndarray:
        """Line number, in their own pages, of comment line j of the pages at positions ``ks``."""
        texts = list(map(self.texts.__getitem__, ks.tolist()))
        return 1 + np.fromiter(
            map(bytes.count, texts, repeat(b"\n"), repeat(0), self.hm[ks, j].tolist()), np.int64, ks.shape[0]
        )

    def block(self, j: int) -> tuple[bytes, np.ndarray]:
        """"\n" + the sample lines after comment j of every page, and the number of lines per page."""
        parts = [b"\n"]
        parts.extend(map(bytes.__getitem__, self.texts, map(slice, self.bs[:, j].tolist(), self.be[:, j].tolist())))
        # (memoryview slices would save a copy but cost more than they save; so would counting in place)
        cnt = np.fromiter(map(bytes.count, parts, repeat(b"\n")), np.int64, len(parts))[1:]  # lines per page
        return b"".join(parts), cnt


def _parse_group(st: _Batch, grp: _Group, heads: list[bytes]) -> bool:
    """Pages of ``grp`` share the comment lines ``heads``; block j of all of them is parsed as one block.
    False, having added nothing, when a comment line needs the per-page parser (a mid-page `# EOF`)."""
    gctx = _Ctx(st.builder, "", st.default_ts, 1000.0, ())
    types_at: list[dict[str, str]] = []
    for h in heads:
        if _header(gctx, h):
            return False
        types_at.append(dict(gctx.types))
    tmpl_counts: list[np.ndarray] = []
    nonempty = np.any(grp.be > grp.bs, axis=0).tolist()
    for j in range(len(heads)):
        if not nonempty[j]:
            continue  # no sample lines after this comment in any page (a HELP before its TYPE)
        gctx.types = types_at[j]
        gctx.counter_cache.clear()
        if _batch_block(st, gctx, grp, j, tmpl_counts):
            continue
        ks = np.arange(len(grp.pages))
        lines = grp.comment_lines(ks, j)
        for k in ks[grp.be[:, j] > grp.bs[:, j]].tolist():
            p = grp.pages[k]
            ctx = st.ctx(p)
            ctx.types = types_at[j]
            ctx.counter_cache.clear()
            before = ctx.added
            blk = b"\n" + grp.texts[k][int(grp.bs[k, j]) : int(grp.be[k, j])]
            e = len(blk)
            while e > 0 and blk[e - 1] in (9, 10, 32):
                e -= 1
            _sample_block(ctx, blk, 0, e, int(lines[k]) + 1)
            _flush(ctx)
            st.counts[p] += ctx.added - before
    return True


def _batch_block(st: _Batch, gctx: _Ctx, grp: _Group, j: int, tmpl_counts: list[np.ndarray]) -> bool:
    """Block j of every page of a group as one `name{labels} value` block. False, having added nothing,
    when it cannot prove every line."""
    blk, cnt = grp.block(j)
    g = len(grp.pages)
    e = len(blk) - 1
    brace = blk.find(b"{", 1, min(e, 300))
    if brace < 0:
        return False
    bname = blk[1:brace]
    if _NAME_RE.fullmatch(bname) is None:
        return False
    got = None
    # The template proof proves the lines; equal per-page line counts prove which page each line is from.
    if tmpl_counts and np.array_equal(cnt, tmpl_counts[0]):
        got = _template_block(gctx, blk, 0, 0, e, bname)
    if got is None:
        cut = _cut_lines(gctx, blk, 0, 0, e, bname) or _cut_block(blk[:e], bname)
        if cut is None:
            return False
        sids = _batch_series(st, np.repeat(np.asarray(grp.pages), cnt).tolist(), cut.labs)
        if sids is None:
            return False
        gctx.template = _make_template(cut, sids)
        tmpl_counts[:] = [cnt]
    else:
        cut, sids = got
    labs = cut.labs
    vt = _values_and_ts(gctx, cut)
    if vt is None:
        return False
    values, ts = vt
    name, counter, bad = _bad_values(gctx.is_counter, bname, values)
    page_k = np.repeat(np.arange(g), cnt)  # position in the group of each line's page
    if bad.any():
        where = np.flatnonzero(bad)
        ks = page_k[where]
        first_line = np.cumsum(cnt) - cnt  # index of each page's first line in the block
        lines = grp.comment_lines(ks, j) + 1 + where - first_line[ks]
        for i, k, line in zip(where.tolist(), ks.tolist(), lines.tolist(), strict=True):
            reason = value_problem(name, float(values[i]), counter) or "invalid value"
            text = (bname + labs[i] + b" " + cut.val(i)).decode("utf-8", "replace")
            st.builder.issues.append(InputIssue(st.sources[grp.pages[k]], line, reason, text.strip()[:200]))
        keep = ~bad
        sids, values, ts, page_k = sids[keep], values[keep], ts[keep], page_k[keep]
        line_ix = np.flatnonzero(keep)
    else:
        line_ix = None
    mid = st.builder.metric_id(name)
    mids = np.full(values.shape[0], mid, np.int32)
    distinct = gctx.template is not None and gctx.template.distinct  # (the template is this block's)
    pages = np.asarray(grp.pages, np.int64)[page_k]  # repeats are per page, as parse_exposition reads each
    first = st.seen.first_at_instant(mids, sids, ts, distinct, pages)
    if first is not None:  # a series again at one instant (in a page, or a metric met in an earlier block)
        where = np.flatnonzero(~first)
        at = where if line_ix is None else line_ix[where]
        ks = page_k[where]
        lines = grp.comment_lines(ks, j) + 1 + at - (np.cumsum(cnt) - cnt)[ks]
        for i, k, line in zip(where.tolist(), ks.tolist(), lines.tolist(), strict=True):
            st.builder.issues.append(InputIssue(st.sources[grp.pages[k]], line, "duplicate sample for timestamp (the "
                                                "first is kept)", sample_text(st.builder, mid, int(sids[i]), float(values[i]))))
        mids, sids, values, ts, page_k = mids[first], sids[first], values[first], ts[first], page_k[first]
        pages = pages[first]
    st.seen.add(mids, sids, ts, pages)
    st.builder.add_arrays(mids, sids, values, ts)
    st.counts[grp.pages] += np.bincount(page_k, minlength=g)
    return True


def _batch_series(st: _Batch, pages: list[int], labs: list[bytes]) -> np.ndarray | None:
    """Series ids for lines (page, raw label string); None if a label string is invalid. The label set
    of (page's extra labels, raw string) is memoised across calls, so a steady fleet pays one dict
    lookup and one interning per series per cycle."""
    keys = list(zip(map(st.extras.__getitem__, pages), labs, strict=True))
    cache = _MERGED_CACHE
    sets = list(map(cache.get, keys))
    if None in sets:
        miss = [i for i, x in enumerate(sets) if x is None]
        _parse_labels_bulk(list({labs[i] for i in miss}))
        if len(cache) + len(miss) >= _LABEL_CACHE_MAX:
            cache.clear()
        for i in miss:
            extra, r = keys[i]
            ls = cache.get(keys[i])
            if ls is None:
                parsed = _LABEL_CACHE.get(r)
                if parsed is None:  # the bounded cache was emptied meanwhile
                    parsed = _parse_labels(r)
                if isinstance(parsed, str):
                    return None
                ls = cache[keys[i]] = _merge_extra(parsed, extra) if extra else parsed
            sets[i] = ls
    return np.fromiter(st.builder.series_ids(sets), np.int32, len(sets))  # type: ignore[arg-type]


def _normalise(data: str | bytes) -> bytes:
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if b"\r" in raw:
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return raw


def _extra_key(extra_labels: Mapping[str, str] | None) -> LabelSet:
    return tuple(sorted((str(k), str(v)) for k, v in (extra_labels or {}).items()))


def _flush_careful(ctx: _Ctx) -> None:
    """Add the samples the careful path collected in ``ctx``."""
    lines = np.asarray(ctx.ln, np.int64)
    m, s, v, t = ctx.m, ctx.s, ctx.v, ctx.t
    ctx.m, ctx.s, ctx.v, ctx.t, ctx.ln = [], [], [], [], []
    ctx.add_arrays(np.asarray(m, np.int32), np.asarray(s, np.int32), np.asarray(v, np.float64),
                   np.asarray(t, np.float64), lines)


def _flush(ctx: _Ctx) -> None:
    """Move what the careful path collected in ``ctx``, and the issues, into its builder."""
    if ctx.m:
        _flush_careful(ctx)
    ctx.builder.issues.extend(ctx.issues)
    ctx.issues = []


def _parse_into(ctx: _Ctx, raw: bytes, om: bool) -> None:
    # Blocks are the text between comment lines: each `\n# ` starts one, whose first line is that comment
    # and whose other lines are samples. Block 0 has no comment line unless the text starts with '#'; an
    # empty line 0 stands in for it. Blocks are (start, end) offsets into the text, so the fast path reads
    # the text in place; each block's line count comes back from its parser (no pass just to count).
    line = 1
    eof = False
    pos = 0
    size = len(raw)
    k = 0
    while True:
        # Every comment the formats define (HELP, TYPE, UNIT, EOF) starts "# "; a rare "#other" line stays
        # in its block, where the careful path skips it.
        nxt = _next_comment(raw, pos)
        end = size if nxt < 0 else nxt
        first = line
        buf, a, b = raw, pos, end
        todo = True
        if eof:
            seg = raw[a:b]
            if seg.strip():
                ctx.issue(first, "text after # EOF", seg.split(b"\n", 1)[0])
            line += seg.count(b"\n") + 1
            todo = False
        elif k == 0 and not raw.startswith(b"#"):
            buf = b"\n" + raw[a:b]
            a, b = 0, len(buf)
            first -= 1
        else:
            nl = raw.find(b"\n", a, b)
            eof = _header(ctx, raw[a : b if nl < 0 else nl].lstrip(b"#"))
            if nl < 0:
                line += 1
                todo = False
            elif eof:
                rest = raw[nl:b].strip()
                if rest:
                    ctx.issue(first + 1, "text after # EOF", rest.split(b"\n", 1)[0])
                line += raw.count(b"\n", a, b) + 1
                todo = False
        if todo:
            e = b
            while e > a and buf[e - 1] in (9, 10, 32):
                e -= 1
            lost = buf.count(b"\n", e, b)
            n = _sample_block(ctx, buf, a, e, first + 1)
            line = first + n + lost + 1
        if nxt < 0:
            break
        pos = nxt + 2
        k += 1


def _sample_block(ctx: _Ctx, buf: bytes, a: int, e: int, first: int) -> int:
    """The sample lines of buf[a:e] (after its comment line, which the caller has handled) by the fastest
    path that can prove them; line i (1-based) after the comment line is line first - 1 + i of the text.
    Returns the number of those lines."""
    n = _fast_block(ctx, buf, a, e, first)
    if n is None:
        chunk = buf[a:e]
        n = _mixed_block(ctx, chunk, first)
        if n is None:
            n = _slow_block(ctx, chunk, first)
    return n


def _next_comment(raw: bytes, pos: int) -> int:
    """Offset of the next "\n# " at or after ``pos``, or -1. Searching for the one byte "#" runs at memchr
    speed (GB/s); bytes.find with the 3-byte needle crawls (~1 GB/s, half a second on a 100k-GPU scrape),
    and "#" is rare outside comment lines."""
    find = raw.find
    j = find(b"#", pos + 1)
    while j >= 0:
        if raw[j - 1] == 10 and raw[j + 1 : j + 2] == b" ":
            return j - 1
        j = find(b"#", j + 1)
    return -1


def _header(ctx: _Ctx, header: bytes) -> bool:
    """Handle one comment line (without its '#'); True at `# EOF`."""
    parts = header.split(None, 3)
    if not parts:
        return False
    if parts[0] == b"EOF" and len(parts) == 1:
        return True
    if parts[0] == b"TYPE" and len(parts) >= 3:
        name = parts[1].decode("utf-8", "replace")
        ctx.types[name] = parts[2].decode("utf-8", "replace").lower()
        ctx.counter_cache.clear()
    return False


def _fast_block(ctx: _Ctx, buf: bytes, a: int, e: int, first: int) -> int | None:
    """All lines of buf[a:e] after its comment line are `name{labels} value` with one name: bulk path.
    Returns the number of those lines, or None, having added nothing, when it cannot prove the shape."""
    nl = buf.find(b"\n", a, e)
    if nl < 0:
        return 0
    brace = buf.find(b"{", nl + 1, min(e, nl + 300))
    if brace < 0:
        return None
    bname = buf[nl + 1 : brace]
    if _NAME_RE.fullmatch(bname) is None:
        return None
    got = _template_block(ctx, buf, a, nl, e, bname)
    if got is None:
        got = _split_block(ctx, buf, a, nl, e, bname)
        if got is None:
            return None
    cut, sids = got
    n = cut.n
    vt = _values_and_ts(ctx, cut)
    if vt is None:
        return None  # exemplars, 1_000, a broken value or timestamp: careful path
    values, ts = vt
    name, counter, bad = _bad_values(ctx.is_counter, bname, values)
    mid = ctx.builder.metric_id(name)
    lines: int | np.ndarray = first
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            reason = value_problem(name, float(values[i]), counter) or "invalid value"
            ctx.issue(first + i, reason, bname + cut.labs[i] + b" " + cut.val(i))
        keep = ~bad
        sids, values, ts = sids[keep], values[keep], ts[keep]
        lines = first + np.flatnonzero(keep)
    distinct = ctx.template is not None and ctx.template.distinct  # (the template is this block's)
    ctx.add_arrays(np.full(values.shape[0], mid, np.int32), sids, values, ts, lines, distinct)
    return n


@dataclass
class _Cut:
    """A block's sample lines, cut: line i is `name + labs[i] + b" " + value text i`, the value text being
    the value, or the value and a timestamp. Cut in place (``vs``/``ve``: where each value text lies in
    ``buf``) or by splitting (``vals``); either form gives the other on demand."""

    labs: list[bytes]
    buf: bytes = b""
    vs: np.ndarray | None = None
    ve: np.ndarray | None = None
    lab_at: np.ndarray | None = None  # where each label string starts in ``buf`` (when cut in place)
    _vals: list[bytes] | None = None
    _joined: bytes | None = None

    @property
    def n(self) -> int:
        return len(self.labs)

    def vals(self) -> list[bytes]:
        if self._vals is None:
            assert self.vs is not None and self.ve is not None
            self._vals = list(map(self.buf.__getitem__, map(slice, self.vs.tolist(), self.ve.tolist())))
        return self._vals

    def val(self, i: int) -> bytes:
        if self._vals is None and self.vs is not None and self.ve is not None:
            return self.buf[int(self.vs[i]) : int(self.ve[i])]
        return self.vals()[i]

    def joined(self) -> bytes:
        """The value texts joined by b" ". In place, gathered with one numpy fancy index (each value with
        the space before it, which the cut proved is there), without a bytes object per value."""
        if self._joined is None:
            if self._vals is not None or self.vs is None or self.ve is None:
                self._joined = b" ".join(self.vals())
            else:
                self._joined = (_gather(np.frombuffer(self.buf, np.uint8), self.vs, self.ve) or b" ")[1:]
        return self._joined


@dataclass
class _Template:
    """The last block's label sequence: raw label strings, the length of each + b" " (``lens``), their
    series ids, and for ``_rows``: the lines grouped by that length, (length, line indices, their labels
    + b" " joined), or None when there are too many lengths (then one bytes.startswith per line)."""

    labs: list[bytes]
    lens: np.ndarray
    sids: np.ndarray
    groups: list[tuple[int, np.ndarray, bytes]] | None
    _labsp: list[bytes] | None = None
    _distinct: bool | None = None

    @property
    def distinct(self) -> bool:
        """Whether no series id repeats (a block that repeats a series may hold duplicate samples). New
        series get increasing ids, so the first block of a scrape is proved by one vectorised compare."""
        if self._distinct is None:
            s = self.sids
            self._distinct = bool((s[1:] > s[:-1]).all()) or np.unique(s).shape[0] == s.shape[0]
        return self._distinct

    @property
    def labsp(self) -> list[bytes]:
        """Each label string + b" " (made only for the per-line fallback)."""
        if self._labsp is None:
            self._labsp = list(map(bytes.__add__, self.labs, repeat(b" ")))
        return self._labsp


def _make_template(cut: _Cut, sids: np.ndarray) -> _Template:
    at = cut.lab_at
    labsp: list[bytes] | None = None
    if at is not None and cut.vs is not None:  # cut in place: labels + b" " are buf[at[i]:vs[i]]
        lens = cut.vs - at
    else:
        labsp = list(map(bytes.__add__, cut.labs, repeat(b" ")))
        lens = np.fromiter(map(len, labsp), np.int64, len(labsp))

    def rows(w: int, idx: np.ndarray) -> bytes:
        if labsp is None:
            assert at is not None
            return _rows(cut.buf, w, at[idx])
        return b"".join(map(labsp.__getitem__, idx.tolist()))

    groups: list[tuple[int, np.ndarray, bytes]] | None = None
    if lens.shape[0]:
        lo, hi = int(lens.min()), int(lens.max())
        widths = [lo] if lo == hi else np.unique(lens).tolist()
        if len(widths) <= 16:  # (hostnames of a few lengths; each group costs a few numpy calls per piece)
            groups = []
            for w in widths:
                idx = np.arange(lens.shape[0]) if lo == hi else np.flatnonzero(lens == w)
                groups.append((w, idx, rows(w, idx)))
    return _Template(cut.labs, lens, sids, groups, labsp)


def _newlines(ctx: _Ctx, buf: bytes, a: int, e: int) -> np.ndarray:
    """Offsets in ``buf`` of every newline in buf[a:e], in order: numpy's vectorised compare, piece by
    piece into a small reused scratch (no 20 MB temporary to fault in and read back)."""
    return _find_byte(ctx, buf, a, e, 10)


def _find_byte(ctx: _Ctx, buf: bytes, a: int, e: int, byte: int) -> np.ndarray:
    arr = np.frombuffer(buf, np.uint8)
    scratch = ctx.scratch_of(_PIECE)
    parts = []
    for c0 in range(a, e, _PIECE):
        c1 = min(c0 + _PIECE, e)
        m = scratch[: c1 - c0]
        np.equal(arr[c0:c1], byte, out=m)
        parts.append(np.flatnonzero(m) + c0)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _values_and_ts(ctx: _Ctx, cut: _Cut) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, timestamps) for one block's value texts: `v` or `v ts` (Prometheus /federate writes a
    timestamp on every sample), or None when the careful path must judge."""
    n = cut.n
    joined = cut.joined()
    values = _fast_joined(joined, n, cut.vals, cut.val)
    if values is not None:
        return values, np.full(n, ctx.default_ts, np.float64)
    if joined.count(b" ") != 2 * n - 1:  # not one space inside every value text on average
        return None
    # Exactly one space inside *each* value text: counting the total only would let "1 2 3" next to "4"
    # pair values with the wrong lines.
    parts = list(map(bytes.split, cut.vals(), repeat(b" ")))
    if set(map(len, parts)) != {2}:
        return None
    values = _fast_values(list(map(itemgetter(0), parts)), n)
    ts = _fast_values(list(map(itemgetter(1), parts)), n)
    if values is None or ts is None or not np.isfinite(ts).all():
        return None
    return values, ts / ctx.ts_div


def _fast_values(vals: list[bytes], n: int) -> np.ndarray | None:
    """``_fast_joined`` for a list of value texts."""
    if b"" in vals:
        return None
    return _fast_joined(b" ".join(vals), n, lambda: vals, vals.__getitem__)


def _fast_joined(
    joined: bytes, n: int, vals: Callable[[], list[bytes]], val: Callable[[int], bytes]
) -> np.ndarray | None:
    """Values of one block (their texts joined by b" "; ``vals`` gives them as a list, ``val`` one of
    them, without making the list) as float64,
    exactly as float(text) reads them, or None if any is not a plain number. Most exporter values are
    integers: a block of plain digits goes through numpy's C integer reader at once (it parses about 10x
    faster than float(); its float reader is no faster than float()), with proof that it read one number
    per value: no value is empty or holds a space (so n - 1 spaces in all, none doubled or at an end) and
    numpy read n numbers. Plain decimals take ``_decimal_values``. Otherwise int() (twice as fast as
    float()), then float().
    float(int(s)) == float(s) and int64 -> float64 rounds to nearest, so all three agree."""
    if b"_" in joined or b"\n" in joined:
        return None  # int()/float() take 1_000 and "1\n", Prometheus does not: let the careful path judge
    if (
        not joined.translate(None, b"0123456789 ")
        and joined.count(b" ") == n - 1
        and joined
        and joined[:1] != b" "
        and joined[-1:] != b" "
        and b"  " not in joined
    ):
        ints = np.fromstring(joined, dtype=np.int64, sep=" ")
        if ints.shape[0] == n:
            out = ints.astype(np.float64)
            # Below 10**18 the integer is exact; 19+ digits may have saturated at 2**63 - 1 (strtoll):
            # those few (DCGM's INT64 blank is one) are read again by float().
            big = np.flatnonzero((ints >= 10**18) | (ints < 0))  # (digits only: negative = wrapped)
            for i in big.tolist():
                out[i] = float(val(i))
            return out
    dec = _decimal_values(joined, n)
    if dec is not None:
        return dec
    texts = vals()
    if b"" in texts:
        return None
    try:
        return np.fromiter(map(int, texts), np.float64, n)
    except ValueError:
        pass
    try:
        return np.fromiter(map(float, texts), np.float64, n)
    except ValueError:
        return None


_POW10 = 10.0 ** np.arange(23)  # exact in float64 up to 1e22


def _decimal_values(joined: bytes, n: int) -> np.ndarray | None:
    """Plain decimals (`0.482113`, dcgm-exporter's ratios) without float() per value: every value is
    digits with exactly one '.', so value = m / 10**k with m the digits read as one integer and k the
    digits after the point. With m < 2**53 and k <= 22 both operands are exact and IEEE division rounds
    once, to nearest: the same double float(text) gives (Clinger's fast path). None when it does not apply."""
    if joined.translate(None, b"0123456789. ") or joined.count(b".") != n or joined.count(b" ") != n - 1:
        return None
    buf = np.frombuffer(joined, np.uint8)
    dots = np.flatnonzero(buf == 46)
    ends = np.append(np.flatnonzero(buf == 32), len(joined))
    starts = np.concatenate(([0], ends[:-1] + 1))
    # One dot inside each value (value i spans starts[i]..ends[i]), and at least one digit.
    if not (((dots >= starts) & (dots < ends)).all() and (ends - starts >= 2).all()):
        return None
    k = ends - dots - 1
    if k.max() > 22 or (ends - starts).max() > 16:  # <= 15 digits: m < 10**15 < 2**53
        return None
    digits = joined.replace(b".", b"")
    if b"  " in digits or digits[:1] == b" " or digits[-1:] == b" ":
        return None
    m = np.fromstring(digits, dtype=np.int64, sep=" ")
    if m.shape[0] != n:
        return None
    return m.astype(np.float64) / _POW10[k]


def _template_block(ctx: _Ctx, buf: bytes, a: int, nl: int, e: int, bname: bytes) -> tuple[_Cut, np.ndarray] | None:
    """Blocks after the first repeat the same label strings in the same order (one block per field, one
    line per GPU): prove that buf[a:e] (a comment line ending at ``nl``, then sample lines) is exactly
    `bname + labs[i] + b" " + value_i` per line for the previous block's label strings, in place, with
    memcmp-speed operations and no copy of the block.

    Proof. The scan below lists every newline of buf[a:e]; there are n (one per template label) and the
    first ends the comment line, so line i (1..n) is the text between newline i-1 and newline i (or e),
    and holds no newline. Checks: (1) offsets: label i + b" " fits inside line i, starting len(name)
    bytes after its start, with at least one byte after it; (2) the 1 + len(name) + 1 bytes from the
    newline before each line are b"\n" + name + b"{"; (3) the bytes at label i's offset are labsp[i].
    So line i = name + labsp[i] + the rest of the line, and that rest (no newline in it) is value text
    i. (2) and (3) compare every byte, as equal-width rows gathered by numpy and compared with one
    memcmp (``_rows``); the old rebuild-and-compare proved the same by joining the expected text (a
    20 MB copy per block) after a regex pass for the values. A single wrong byte anywhere changes a
    newline (count or place), a name, a label, or a value text (the value readers then judge it);
    tests/test_exposition_proof.py checks every such corruption against the careful parser."""
    t = ctx.template
    if t is None:
        return None
    n = len(t.labs)
    # Piece by piece, so that each piece of text is read from memory once and is still in the CPU cache
    # for the name and label compares and the gathering of its value texts.
    arr = np.frombuffer(buf, np.uint8)
    scratch = ctx.scratch_of(_PIECE)
    needle = b"\n" + bname + b"{"
    skip = 1 + len(bname)
    lens = t.lens
    parts: list[np.ndarray] = []
    pieces: list[bytes] = []  # the value texts, each with the space before it, gathered piece by piece
    got = 0
    tail = np.zeros(0, np.int64)  # the newline before the one line whose end is not known yet
    for c0 in range(a, e, _PIECE):
        c1 = min(c0 + _PIECE, e)
        m = scratch[: c1 - c0]
        np.equal(arr[c0:c1], 10, out=m)
        nls = np.flatnonzero(m) + c0
        k = nls.shape[0]
        if got + k > n:
            return None
        if k:
            lab_at = nls + skip
            if int((lab_at + lens[got : got + k]).max()) > e:  # (a label past the end: not this block)
                return None
            if _rows(buf, skip + 1, nls) != needle * k or not _labels_at(t, buf, lab_at, got):
                return None
            known = np.concatenate((tail, nls))  # lines got - len(tail) .. got + k - 2 now have their end
            i0 = got - tail.shape[0]
            v = _gather(arr, known[:-1] + skip + lens[i0 : got + k - 1], known[1:])
            if v is None:
                return None
            pieces.append(v)
            tail = nls[-1:]
        parts.append(nls)
        got += k
    if got != n or tail.shape[0] == 0:
        return None
    nls = np.concatenate(parts)
    if nls[0] != nl:
        return None
    vs = nls + skip + lens
    ve = np.append(nls[1:], e)
    if not (vs < ve).all():
        return None
    last = _gather(arr, tail + skip + lens[-1:], np.array([e], np.int64))
    if last is None:
        return None
    pieces.append(last)
    return _Cut(t.labs, buf, vs, ve, _joined=b"".join(pieces)[1:]), t.sids


def _labels_at(t: _Template, buf: bytes, lab_at: np.ndarray, i0: int) -> bool:
    """Whether buf holds labsp[i] at lab_at[i - i0] for the lines i0 .. i0 + len(lab_at) - 1 (each row
    inside buf): per label length, one gather of rows and one memcmp against the template's joined
    labels (bytes.startswith at an offset: no copy of either side)."""
    i1 = i0 + lab_at.shape[0]
    if t.groups is None:
        return all(map(buf.startswith, t.labsp[i0:i1], lab_at.tolist()))
    for width, idx, want in t.groups:
        if len(t.groups) == 1:
            j0, j1, at = i0, i1, lab_at
        else:
            j0, j1 = np.searchsorted(idx, (i0, i1)).tolist()
            if j0 == j1:
                continue
            at = lab_at[idx[j0:j1] - i0]
        if not want.startswith(_rows(buf, width, at), j0 * width):
            return False
    return True


_PIECE = 1 << 20  # 1 MiB of text and its scratch: still in cache (here 512 KiB L2, 32 MiB L3) when reused


def _rows(buf: bytes, width: int, at: np.ndarray) -> bytes:
    """buf[at[i] : at[i] + width] for every i, concatenated (every row must lie inside buf): a numpy
    gather of fixed-width rows from a zero-copy view, about twice as fast as a bytes.startswith call per
    row, and compared by the caller with one memcmp."""
    view = np.ndarray((len(buf) - width + 1,), np.dtype((np.void, width)), buf, 0, (1,))
    return view[at].tobytes()


def _gather(arr: np.ndarray, vs: np.ndarray, ve: np.ndarray) -> bytes | None:
    """arr[vs[i] - 1 : ve[i]] for every i, concatenated: value texts each with the byte before it (the
    space after the labels). None if one is empty (vs >= ve: the labels ran into the next line)."""
    w = ve - vs + 1
    if w.shape[0] == 0:
        return b""
    if not (w >= 2).all():
        return None
    idx = np.arange(int(w.sum()), dtype=np.int64) + np.repeat(vs - 1 - (np.cumsum(w) - w), w)
    return arr[idx].tobytes()


_PIECE = 1 << 18  # 256 KiB of text and its scratch fit in a core's 512 KiB L2 cache


def _cut_lines(ctx: _Ctx, buf: bytes, a: int, nl: int, e: int, bname: bytes) -> _Cut | None:
    """Cut the sample lines of buf[a:e] (after the comment line ending at ``nl``) into label strings and
    value texts in place, when every line is `bname{...} value` with exactly one '}'. numpy finds the
    newlines (so the lines, as in ``_template_block``) and the '}'s: n of them, the i-th inside line i
    after its '{' (the label runs from the '{' after the name to it), followed by a space and at least
    one value byte; the name + '{' at every line start is compared as rows (``_rows``). None when that
    does not hold (a '}' inside a label value, a line of another shape)."""
    nls = _newlines(ctx, buf, a, e)
    n = nls.shape[0]
    if n == 0 or nls[0] != nl:
        return None
    br = _find_byte(ctx, buf, nl, e, 125)
    if br.shape[0] != n:
        return None
    lab_at = nls + (1 + len(bname))
    ve = np.append(nls[1:], e)
    vs = br + 2
    if not ((br > lab_at) & (vs < ve)).all():  # (so every row below lies inside its line)
        return None
    if not (np.frombuffer(buf, np.uint8)[br + 1] == 32).all():
        return None
    if _rows(buf, len(bname) + 2, nls) != (b"\n" + bname + b"{") * n:
        return None
    labs = list(map(buf.__getitem__, map(slice, lab_at.tolist(), (br + 1).tolist())))
    return _Cut(labs, buf, vs, ve, lab_at)


def _cut_block(chunk: bytes, bname: bytes) -> _Cut | None:
    """(raw label strings, value texts) of the lines after chunk's first line, all `bname{labels} value`,
    cut with C-level replace/split; None if any line has another shape. The fallback of ``_cut_lines``
    for label values holding '}'."""
    core = chunk.replace(b"\n" + bname + b"{", b"\n{")
    if (len(chunk) - len(core)) % len(bname):
        return None
    r = (len(chunk) - len(core)) // len(bname)  # lines that start with name{
    # "} " -> "}\n\n": each line splits into (labels, b"", value), and the growth counts the splits, so the
    # line count falls out without another pass over the text: lines = pieces - 1 - 2 * splits.
    core2 = core.replace(b"} ", b"}\n\n")
    s = len(core2) - len(core)
    parts = core2.split(b"\n")
    n = len(parts) - 1 - 2 * s
    if not (n == r == s):
        return None  # a line without name{ or "} ", a label value holding "} ", a blank line...
    return _Cut(parts[1::3], _vals=parts[3::3])


def _intern_labels(ctx: _Ctx, labs: list[bytes]) -> np.ndarray | None:
    """Series id of every raw label string, parsing the new ones in bulk; None if any is invalid."""
    known = ctx.sids
    # Nothing known yet (a scrape's first block): every line's string is new, duplicates and all, and
    # series_many gives the ids in line order (a repeated string gets its first id again).
    new = [r for r in dict.fromkeys(labs) if r not in known] if known else labs
    if new:
        _parse_labels_bulk(new)
        ids = ctx.series_many(new)
        if ids is None:
            return None
        if new is labs:
            return np.array(ids, np.int32)
    return np.fromiter(map(ctx.sids.__getitem__, labs), np.int32, len(labs))


def _split_block(ctx: _Ctx, buf: bytes, a: int, nl: int, e: int, bname: bytes) -> tuple[_Cut, np.ndarray] | None:
    """Cut every line into (raw labels, value), intern the label strings, and keep them as the template
    for the next block."""
    cut = _cut_lines(ctx, buf, a, nl, e, bname) or _cut_block(buf[a:e], bname)
    if cut is None:
        return None
    sids = _intern_labels(ctx, cut.labs)
    if sids is None:
        return None
    ctx.template = _make_template(cut, sids)
    return cut, sids


def _mixed_block(ctx: _Ctx, chunk: bytes, first: int) -> int | None:
    """Lines `name{labels} value` with several names (histograms: _bucket, _sum, _count): cut every line
    into (name, labels, value) with C-level replace/split; None, having added nothing, if unsure."""
    core = chunk.replace(b"{", b"\n{")
    r1 = len(core) - len(chunk)  # one per "{"
    core2 = core.replace(b"} ", b"}\n\n")
    r2 = len(core2) - len(core)  # one per "} "
    parts = core2.split(b"\n")
    n = len(parts) - 1 - r1 - 2 * r2
    if not (n == r1 == r2) or n == 0:
        return None
    names, labs, gaps, vals = parts[1::4], parts[2::4], parts[3::4], parts[4::4]
    if gaps.count(b"") != n:
        return None
    uniq = set(names)
    if any(_NAME_RE.fullmatch(x) is None for x in uniq):
        return None
    vt = _values_and_ts(ctx, _Cut(labs, _vals=vals))
    if vt is None:
        return None
    values, ts = vt
    sids = _intern_labels(ctx, labs)
    if sids is None:
        return None
    name_of = {x: x.decode("ascii") for x in uniq}
    mid_of = {x: ctx.builder.metric_id(nm) for x, nm in name_of.items()}
    mids = np.fromiter(map(mid_of.__getitem__, names), np.int32, n)
    counter_of = {x: ctx.is_counter(nm) for x, nm in name_of.items()}
    counter = np.fromiter(map(counter_of.__getitem__, names), bool, n)
    exact = np.fromiter((x.startswith(b"DCGM_FI_") for x in names), bool, n) if any(
        x.startswith(b"DCGM_FI_") for x in uniq) else False
    bad = ~np.isfinite(values) | blank_sentinel_mask(values, exact) | (counter & (values < 0))
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            nm = name_of[names[i]]
            reason = value_problem(nm, float(values[i]), counter_of[names[i]]) or "invalid value"
            ctx.issue(first + i, reason, names[i] + labs[i] + b" " + vals[i])
        keep = ~bad
        mids, sids, values, ts = mids[keep], sids[keep], values[keep], ts[keep]
        ctx.add_arrays(mids, sids, values, ts, first + np.flatnonzero(keep))
    else:
        ctx.add_arrays(mids, sids, values, ts, first)
    return n


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


def _parse_number(tok: bytes) -> float | None:
    if b"_" in tok:
        return None  # float() takes 1_000, Prometheus and prometheus-client do not
    try:
        return float(tok)
    except ValueError:
        return None


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


def iter_samples(snap: Snapshot) -> Iterable[tuple[str, tuple[tuple[str, str], ...], float]]:
    """(name, sorted labels, value) per sample; for comparisons in tests and the benchmark."""
    for m, s, v in zip(snap.metric_ids.tolist(), snap.series_ids.tolist(), snap.values.tolist(), strict=True):
        yield snap.metrics[m], snap.labelsets[s], v

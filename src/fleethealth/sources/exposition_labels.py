"""Label strings of the exposition parser: `{k="v", ...}` into sorted label pairs, fast and exact.

Theory of operation. Parsing a label string is the costly part of a cold parse, so every parsed raw string
is memoised in a ``LabelCache`` the caller holds (``parsed``: raw bytes -> label set, or the reason it is
invalid; scrapes of the same exporters repeat the same strings every cycle: a scrape source keeps one
through its ``PagePlans``, a one-off parse makes one for the call). New strings arrive in bulk (a first scrape of 100k GPUs)
and are parsed together through a bytes template regex built from the first one (``_parse_labels_bulk``:
exporters print every series with the same keys in the same order, so only the values vary); strings of
another shape, with escapes or invalid ones take the careful ``_split_labels``. Label sets are built
column by column (``_column_label_sets``) so that shared pairs are one object. The scraper's own labels
are merged the way Prometheus merges them (``_merge_extra``: its labels win, a page's own value moves to
``exported_<name>``), memoised per (scraper labels, raw string) in the cache's ``merged``. New
(scraper labels, raw string) pairs of one template whose scraper labels only add names (the page plans'
cold read: ``_merged_columns``) are cut at their quotes at once and merged as columns, without per-string
merging: ASCII strings from the offsets of their quotes (``_quoted_columns``: separators compared as
rows, a column of one value, one value per slot of a page or one per page made of one pair per
distinct value), others by one ``str.split``; a page plan hands its strings over as the one buffer it
gathered them into (``FixedRows``: no bytes object per string). What such a bulk merge adds to the memos
is queued and put into them when they are next read (``LabelCache._defer``): a source reading through
page plans reads them only when a page changes.
Both are pure memos of pure functions, bounded; no state lives in this module.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

import numpy as np

from fleethealth.signals.snapshot import LabelSet

_LNAME = r'[a-zA-Z_][a-zA-Z0-9_]*|"[^"\\]*(?:\\.[^"\\]*)*"'
_LVALUE = r'"([^"\\]*(?:\\.[^"\\]*)*)"'
_PAIR = rf"[ \t]*({_LNAME})[ \t]*=[ \t]*{_LVALUE}[ \t]*"
_PAIR_RE = re.compile(_PAIR)
_ESCAPE_RE = re.compile(r'\\[\\n"]')
_ESCAPES = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}


_LABEL_CACHE_MAX = 500_000
Template = tuple[str, str, list[str], list[str]]  # see ``_quoted_template``  # per memo; a 100k-GPU fleet has ~100k GPU label sets


class FixedRows:
    """n raw label strings of one width, each followed by one space, back to back in one buffer (a page
    plan's slot strings as gathered from the text: ``exposition_shape._build_like``). What a bulk merge
    is given instead of n bytes objects: ``_merged_columns`` cuts them in the buffer itself, and the memo
    queue (``LabelCache._defer``) keeps the buffer, slicing the strings only when it is settled. Iterates
    as the list of strings would."""

    __slots__ = ("buf", "width", "n")

    def __init__(self, buf: bytes, width: int) -> None:
        if len(buf) % (width + 1):
            raise ValueError("a buffer of whole rows (each string and its space) expected")
        self.buf, self.width, self.n = buf, width, len(buf) // (width + 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        a = range(self.n)[i] * (self.width + 1)
        return self.buf[a:a + self.width]

    def __iter__(self) -> Iterator[bytes]:
        step = self.width + 1
        end = self.n * step
        return map(self.buf.__getitem__, map(slice, range(0, end, step), range(self.width, end + self.width, step)))

    def tolist(self) -> list[bytes]:
        return list(self)


Raws = list[bytes] | FixedRows  # raw label strings, as a bulk merge is given them


class LabelCache:
    """Memos of parsed label strings, held by the caller across parses of the same exporters (as
    Prometheus keeps one per target): ``parsed`` raw label string -> sorted label pairs or the reason it
    is invalid; ``merged`` (scraper labels, raw string) -> label set with the scraper's labels merged.
    Pure memos of pure functions: sharing one, or not, never changes a result, only the cost. Each is
    emptied when it reaches ``_LABEL_CACHE_MAX`` entries.

    A bulk merge (``_merged_columns``: a page plan's cold read, 100k new strings) only queues what it
    made (``_defer``): a scrape source that reads its pages through plans looks none of them up again
    until a page changes, and the two dicts of 100k entries (and the unmerged sets) cost about a tenth
    of the cold read. The queue is put into the dicts, in order and with the same bound, the first time
    either is read (``parsed``, ``merged``); asked for some scraper labels (``merged_of``: a page planned
    again), only the queued merges that hold them are (a chunk's, not the fleet's)."""

    __slots__ = ("_parsed", "_merged", "template", "_pending", "_pending_extras", "_pending_n")

    def __init__(self) -> None:
        self._parsed: dict[bytes, LabelSet | str] = {}
        self._merged: dict[tuple[LabelSet, bytes], LabelSet] = {}
        self.template: Template | None = None  # the last one ``_merged_columns`` read strings with
        # queued bulk merges: (scraper labels, raw strings, merged sets, unmerged sets or their columns,
        # the distinct scraper labels)
        self._pending: list[_Queued] = []
        self._pending_extras: dict[LabelSet, int] = {}  # scraper label set -> queued merges holding it
        self._pending_n = 0

    @property
    def parsed(self) -> dict[bytes, LabelSet | str]:
        if self._pending:
            self._settle(None)
        return self._parsed

    @property
    def merged(self) -> dict[tuple[LabelSet, bytes], LabelSet]:
        if self._pending:
            self._settle(None)
        return self._merged

    def clear(self) -> None:
        self._pending.clear()
        self._pending_extras.clear()
        self._pending_n = 0
        self._parsed.clear()
        self._merged.clear()
        self.template = None

    def merged_of(self, extras: list[LabelSet], raws: Raws, distinct: set[LabelSet] | None = None
                  ) -> list[LabelSet | None] | None:
        """``merged.get((extras[i], raws[i]))`` for every i, or None when the memo holds nothing (all
        unknown). Queued merges of other scraper labels (the other pages of a cold read) stay queued.
        ``distinct``: the set of ``extras``, when the caller knows it (else made here)."""
        if self._pending_extras and not self._pending_extras.keys().isdisjoint(extras if distinct is None else distinct):
            self._settle(set(extras) if distinct is None else distinct)
        memo = self._merged
        if not memo:
            return None
        return list(map(memo.get, zip(extras, raws, strict=True)))

    def _defer(self, extras: list[LabelSet], raws: Raws, sets: list[LabelSet],
               own: list[LabelSet] | Callable[[], list[LabelSet]], distinct: set[LabelSet]) -> None:
        """Queue a bulk merge's memo entries (``own``: the unmerged sets, or what makes them when settled;
        ``distinct``: the set of ``extras``). A queue past the memos' bound is settled at once (the bound
        applies as it would have)."""
        self._pending.append((extras, raws, sets, own, distinct))
        held = self._pending_extras
        if held.keys().isdisjoint(distinct):  # (a cold read's chunks: each of other pages)
            held.update(dict.fromkeys(distinct, 1))
        else:
            for e in distinct:
                held[e] = held.get(e, 0) + 1
        self._pending_n += len(raws)
        if self._pending_n + max(len(self._merged), len(self._parsed)) >= _LABEL_CACHE_MAX:
            self._settle(None)

    def _settle(self, wanted: set[LabelSet] | None) -> None:
        """Put the queued merges (all, or those holding any of ``wanted``) into the memos, in order, each
        as the eager update would have. (Which entries a bound's emptying keeps may then differ from
        updates made at once: a memo's content never changes a result.)"""
        if wanted is None:
            take, self._pending = self._pending, []
            self._pending_extras, self._pending_n = {}, 0
        else:
            take = [q for q in self._pending if not q[4].isdisjoint(wanted)]
            self._pending = [q for q in self._pending if q[4].isdisjoint(wanted)]
            held = self._pending_extras
            for q in take:
                self._pending_n -= len(q[1])
                for e in q[4]:
                    if held[e] == 1:
                        del held[e]
                    else:
                        held[e] -= 1
        merged, parsed = self._merged, self._parsed
        for extras, raws, sets, own, _ in take:
            n = len(raws)
            for memo in (merged, parsed):
                if len(memo) + n >= _LABEL_CACHE_MAX:
                    memo.clear()
            merged.update(zip(zip(extras, raws, strict=True), sets, strict=True))
            parsed.update(zip(raws, own if isinstance(own, list) else own(), strict=True))


_Queued = tuple[list[LabelSet], Raws, list[LabelSet], list[LabelSet] | Callable[[], list[LabelSet]], set[LabelSet]]


def _unescape(s: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], s) if "\\" in s else s


def _parse_labels(raw: bytes, cache: LabelCache) -> LabelSet | str:
    """Parse `{k="v", ...}` into sorted pairs, or return why it is invalid (memoised in ``cache``)."""
    memo = cache.parsed
    hit = memo.get(raw)
    if hit is not None:
        return hit
    result: LabelSet | str
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        result = "invalid UTF-8 in labels"
    else:
        result = _split_labels(text)
    if len(memo) >= _LABEL_CACHE_MAX:
        memo.clear()
    memo[raw] = result
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


def _parse_labels_bulk(raws: list[bytes], cache: LabelCache, depth: int = 0) -> None:
    """Parse many new label strings into ``cache`` at once.

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
    memo = cache.parsed
    todo = [r for r in raws if r not in memo] if memo else list(raws)
    if len(todo) < 8 or depth >= 6:
        for r in todo:
            _parse_labels(r, cache)
        return
    joined = b"\n".join(todo)
    if b"\0" in joined:  # the templates' value groups would take a NUL: each string on its own
        for r in todo:
            _parse_labels(r, cache)
        return
    if b"\\" in joined or joined.count(b"\n") != len(todo) - 1:
        _parse_labels_bulk_str(todo, cache, depth)
        return
    shape = _template_of(todo[0])
    if shape is None:
        _parse_labels(todo[0], cache)
        _parse_labels_bulk(todo[1:], cache, depth + 1)
        return
    segs, keys = shape
    template = re.compile(
        rb"^(?:\{" + rb'([^"]*)'.join(re.escape(x.encode("utf-8")) for x in segs) + rb"\}|(.+))$", re.M
    )
    found = template.findall(joined)
    if not _cache_found(todo, found, keys, cache, depth):
        for r in todo:
            _parse_labels(r, cache)


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
    todo: list[bytes], found: list[tuple[Any, ...]], keys: list[str], cache: LabelCache, depth: int
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
    memo = cache.parsed
    if len(memo) + len(todo) >= _LABEL_CACHE_MAX:
        memo.clear()
    memo.update(zip(todo, sets, strict=True))
    if other:
        _parse_labels_bulk(other, cache, depth + 1)
    return True


def _parse_labels_bulk_str(todo: list[bytes], cache: LabelCache, depth: int) -> None:
    """``_parse_labels_bulk`` for text with backslashes: the same template on decoded text, with value
    groups that refuse escapes (a string with one takes the careful path)."""
    try:
        first = todo[0].decode("utf-8")
        joined = b"\n".join(todo).decode("utf-8")
    except UnicodeDecodeError:
        first = ""
    shape = _template_of(todo[0]) if first else None
    if shape is None:
        _parse_labels(todo[0], cache)
        _parse_labels_bulk(todo[1:], cache, depth + 1)
        return
    segs, keys = shape
    # Each line either fits the template (value groups) or is captured whole by the last group.
    template = re.compile(r"^(?:\{" + r'([^"\\\n]*)'.join(re.escape(x) for x in segs) + r"\}|(.+))$", re.M)
    if not _cache_found(todo, template.findall(joined), keys, cache, depth):
        for r in todo:
            _parse_labels(r, cache)


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
    if not columns or not columns[0]:
        return []
    return _zip_sets(*_pair_columns(columns, keys))


def _pair_columns(columns: list[list[Any]], keys: list[str]) -> tuple[list[list[tuple[str, str]]], bool]:
    """``_column_label_sets``' columns of (key, value) pairs, in key order, and whether a value is empty."""
    n = len(columns[0])
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
    return cols, empty


def _zip_sets(cols: list[list[tuple[str, str]]], empty: bool) -> list[LabelSet]:
    """The label sets of ``_pair_columns``' columns (without the pairs of empty values)."""
    sets: list[LabelSet] = list(zip(*cols, strict=True))
    if empty:
        sets = [tuple(p for p in ls if p[1]) for ls in sets]
    return sets


def _merged_bulk(keyed: list[tuple[LabelSet, bytes]], cache: LabelCache) -> list[LabelSet] | None:
    """``_merged_columns`` of (scraper labels, raw string) pairs."""
    return _merged_columns(list(map(itemgetter(0), keyed)), list(map(itemgetter(1), keyed)), cache)


def _merged_columns(extra_of: list[LabelSet], raws: Raws, cache: LabelCache, period: int = 0,
                    distinct: set[LabelSet] | None = None) -> list[LabelSet] | None:
    """``_merge_extra(_parse_labels(raw), extra)`` of many new (extra_of[i], raws[i]) pairs at once, when
    every raw string has one template and every extra only adds labels (no honor-labels mark, no name of
    the template's, no empty value, the same names in each): then the merged label set is the sorted
    pairs of the template's values and the extra's, built as columns (``_pair_columns``). Memoised in
    ``cache.merged``, and the unmerged sets in ``cache.parsed`` (queued: ``LabelCache._defer``). None,
    having cached nothing, otherwise (the caller then takes ``_parse_labels_bulk`` and ``_merge_extra``).

    The values are cut with one ``str.split`` on '"' of all strings joined by newlines, not a regex:
    with no backslash, no newline and no NUL in the strings, a string fits the template exactly when its
    pieces between quotes are the template's separators (keys, '=', ',', spacing; each with a quote at
    its ends only), and then its other pieces are its values, without quotes or escapes, as the template
    regex of ``_parse_labels_bulk`` would have taken them. The text is decoded at once: the pieces of a
    valid UTF-8 text between ASCII quotes are the values decoded one by one. The last template that
    fitted (``cache.template``: one exporter's strings, chunk after chunk) is tried first, then the
    first string's (``_template_of``, from its careful parse). ASCII strings are first cut without
    splitting them at all (``_quoted_columns``); ``period``: strings per page, when the caller's are
    page by page (a value repeated on every page is then found as such); ``distinct``: the set of
    ``extra_of``, when the caller knows it."""
    n = len(raws)
    extras = set(extra_of) if distinct is None else distinct
    names = set(map(tuple, map(partial(map, itemgetter(0)), extras)))  # (C-level loops: 100 pages a chunk)
    if n < 8 or len(names) != 1:
        return None
    extra_keys = list(next(iter(names)))
    if extra_keys[:1] == [HONOR_LABELS_MARK] or not all(map(itemgetter(1), chain.from_iterable(extras))):
        return None
    text: str | None = None
    if isinstance(raws, FixedRows):  # (the buffer's checks: its strings' and the spaces between them)
        buf = raws.buf
        if b"\0" in buf or b"\\" in buf or b"\n" in buf or not buf.isascii():
            raws = raws.tolist()  # (each string as below)
    if not isinstance(raws, FixedRows):
        try:
            text = b"\n".join(raws).decode("utf-8")
        except UnicodeDecodeError:
            return None
        if "\0" in text or "\\" in text or text.count("\n") != n - 1:
            return None
    found = cache.template if cache.template is not None else _quoted_template(raws[0])
    by_quotes = _quoted_columns(raws, found, period) if found is not None and (text is None or text.isascii()) else None
    if by_quotes is None:
        if text is None:  # (ASCII strings that are not cut at their quotes: split as a list's)
            raws = raws.tolist() if isinstance(raws, FixedRows) else raws
            text = b"\n".join(raws).decode("ascii")
        pieces = text.split('"')
        found = cache.template
        if found is None or not _fits(pieces, found, n):
            found = _quoted_template(raws[0])
            if found is None or not _fits(pieces, found, n):
                return None
        nk = len(found[3])
        cols, empty = _pair_columns([pieces[1 + 2 * j::2 * nk] for j in range(nk)], found[3])
    else:
        cols, empty = by_quotes
    assert found is not None
    if not set(found[3]).isdisjoint(extra_keys):
        return None
    cache.template = found
    if not extra_keys:
        sets = _zip_sets(cols, empty)
        cache._defer(extra_of, raws, sets, sets, extras)
        return sets
    # (the unmerged sets, for ``parsed``, the other paths' memo, made only when that is read: from the
    # template's columns when empty values drop pairs, else the merged sets less the extra's places)
    own = partial(_zip_sets, list(cols), empty) if empty else None
    is_own = [True] * len(cols)
    of_key = sorted(found[3])  # the extra's pairs (non-empty values) as columns of their own, at their places
    for j, k in sorted(enumerate(extra_keys), key=itemgetter(1), reverse=True):
        at = bisect_left(of_key, k)
        cols.insert(at, list(map(itemgetter(j), extra_of)))
        is_own.insert(at, False)
    sets = _zip_sets(cols, empty)
    if own is None:
        own = partial(_pairs_at, sets, [i for i, mine in enumerate(is_own) if mine])
    cache._defer(extra_of, raws, sets, own, extras)
    return sets


def _pairs_at(sets: list[LabelSet], at: list[int]) -> list[LabelSet]:
    """Each label set's pairs at the places ``at`` (one or more), as label sets."""
    if len(at) == 1:
        return [(ls[at[0]],) for ls in sets]
    return list(map(itemgetter(*at), sets))


def _quoted_columns(raws: Raws, tpl: Template, period: int
                    ) -> tuple[list[list[tuple[str, str]]], bool] | None:
    """``_pair_columns`` of n ASCII strings that fit ``tpl`` (None when one does not), from the offsets
    of their quotes, without a Python object per piece: a string fits exactly when it has 2 * nk quotes
    and the bytes outside its values are the template's (compared as fixed-width rows, one memcmp per
    separator: ``_fits`` on the split pieces, byte for byte). A column whose values are all as wide is
    read as rows: one value on every string (a model name, a driver version), the first ``period``
    strings' values on every page (a GPU index, a bus id) or each page's first value on its strings (a
    host name) make one pair per distinct value; other columns are sliced and paired as
    ``_pair_columns`` pairs them. ``FixedRows`` whose strings all have their quotes where the first has
    them are cut as one grid (``_one_layout``: the same places in every string)."""
    n, nk = len(raws), len(tpl[3])
    seps = [tpl[0], *tpl[2], tpl[1]]
    if isinstance(raws, FixedRows):  # (in place: each string's start and width, and a space after it)
        buf = raws.buf
        if b"\\" in buf or b"\0" in buf:
            return None
        grid = np.frombuffer(buf, np.uint8).reshape(n, raws.width + 1)
        if not bool((grid[:, raws.width] == 32).all()):
            return None
        q0 = np.flatnonzero(grid[0] == 34)
        if q0.shape[0] == 2 * nk and bool((grid[:, q0] == 34).all()) and int(np.count_nonzero(grid == 34)) == 2 * nk * n:
            return _one_layout(grid, q0, raws.width, tpl, seps, period)
        st = np.arange(0, len(buf), raws.width + 1, dtype=np.int64)
        lens = np.full(n, raws.width, np.int64)
    else:
        buf = b"".join(raws)
        st = np.zeros(n, np.int64)
        lens = np.fromiter(map(len, raws), np.int64, n)
        np.cumsum(lens[:-1], out=st[1:])
    arr = np.frombuffer(buf, np.uint8)
    q = np.flatnonzero(arr == 34)
    if q.shape[0] != 2 * nk * n or b"\\" in buf or b"\0" in buf:
        return None
    qq = q.reshape(n, 2 * nk)
    # the separators: before the first quote, between a value's closing and the next one's opening
    # quote, after the last: each of the template's width and bytes
    begin = np.concatenate((st[:, None], qq[:, 1::2] + 1), axis=1)
    stop = np.concatenate((qq[:, 0::2], (st + lens)[:, None]), axis=1)
    if not np.array_equal(stop - begin, np.fromiter(map(len, seps), np.int64, nk + 1)[None, :].repeat(n, 0)):
        return None
    for j, sep in enumerate(seps):
        if sep and _fixed_rows(buf, len(sep), begin[:, j]) != sep.encode() * n:
            return None
    cols: list[list[tuple[str, str]]] = []
    empty = False
    for j in sorted(range(nk), key=tpl[3].__getitem__):
        k = tpl[3][j]
        s, e = qq[:, 2 * j] + 1, qq[:, 2 * j + 1]
        w = e - s
        w0 = int(w[0])
        if w0 and bool((w == w0).all()):
            col, none = _value_column(k, _fixed_rows(buf, w0, s), w0, n, period)
        else:
            one, none = _pair_columns([list(map(buf.__getitem__, map(slice, s.tolist(), e.tolist())))], [k])
            col = one[0]
        empty = empty or none
        cols.append(col)
    return cols, empty


def _one_layout(grid: np.ndarray, q0: np.ndarray, width: int, tpl: Template, seps: list[str], period: int
                ) -> tuple[list[list[tuple[str, str]]], bool] | None:
    """``_quoted_columns`` of strings of one width (``grid``: one string and its space a row) that all have
    their quotes where the first has them (``q0``) and no others: the same places for every string, so
    the separators are one compare of those columns and each value column is one slice of the grid."""
    n = grid.shape[0]
    begin = np.concatenate(([0], q0[1::2] + 1)).tolist()
    stop = np.concatenate((q0[0::2], [width])).tolist()
    if [e - b for b, e in zip(begin, stop, strict=True)] != list(map(len, seps)):
        return None
    at = np.concatenate([np.arange(b, e) for b, e in zip(begin, stop, strict=True)])
    if not bool((grid[:, at] == np.frombuffer("".join(seps).encode(), np.uint8)).all()):
        return None
    cols: list[list[tuple[str, str]]] = []
    empty = False
    for j in sorted(range(len(tpl[3])), key=tpl[3].__getitem__):
        k = tpl[3][j]
        s, e = int(q0[2 * j]) + 1, int(q0[2 * j + 1])
        col, none = _value_column(k, grid[:, s:e].tobytes(), e - s, n, period)
        empty = empty or none
        cols.append(col)
    return cols, empty


def _value_column(k: str, rows: bytes, w: int, n: int, period: int) -> tuple[list[tuple[str, str]], bool]:
    """The (k, value) column of n values of w bytes each (``rows``; no escape or NUL in them), and whether
    a value is empty: one pair per distinct value where values repeat (``_repeating_column``), else
    paired as ``_pair_columns`` pairs them."""
    rep = _repeating_column(k, rows, w, n, period) if w else None
    if rep is not None:
        return rep, False
    one, none = _pair_columns([np.frombuffer(rows, f"S{w}").tolist() if w else [b""] * n], [k])
    return one[0], none


def _fixed_rows(buf: bytes, width: int, at: np.ndarray) -> bytes:
    """buf[at[i] : at[i] + width] for every i, concatenated (``exposition_blocks._rows``)."""
    view = np.ndarray((len(buf) - width + 1,), np.dtype((np.void, width)), buf, 0, (1,))
    return view[at].tobytes()


def _repeating_column(k: str, rows: bytes, w: int, n: int, period: int) -> list[tuple[str, str]] | None:
    """The (k, value) column of n values of w bytes each (``rows``), when one value is on every string,
    the first ``period`` on every page, or each page's first on all of its strings; else None."""
    # (each test first compares the second value, or page, with the first: a column of distinct values,
    # a UUID, builds nothing)
    if (n < 2 or rows[w:2 * w] == rows[:w]) and rows == rows[:w] * n:
        return [(k, rows[:w].decode())] * n
    if not period or n % period:
        return None
    pages, size = n // period, w * period
    if (pages < 2 or rows[size:2 * size] == rows[:size]) and rows == rows[:size] * pages:
        return [(k, rows[i:i + w].decode()) for i in range(0, size, w)] * pages
    if period > 1 and rows[w:2 * w] != rows[:w]:
        return None
    grid = np.frombuffer(rows, np.uint8).reshape(pages, period, w)
    if bool((grid == grid[:, :1]).all()):  # (every value of a page its first)
        heads = grid[:, 0].tobytes()
        pairs = [(k, heads[i:i + w].decode()) for i in range(0, len(heads), w)]
        return list(chain.from_iterable(map(repeat, pairs, repeat(period, pages))))
    return None


def _fits(pieces: list[str], tpl: Template, n: int) -> bool:
    """Whether n strings split at their quotes (``pieces``) have the template's text between values."""
    return len(pieces) == 2 * len(tpl[3]) * n + 1 and pieces[0::2] == (
        [tpl[0]] + (tpl[2] + [tpl[1] + "\n" + tpl[0]]) * (n - 1) + tpl[2] + [tpl[1]])


def _quoted_template(raw: bytes) -> Template | None:
    """``_template_of`` as (text before the first value, after the last, between values; keys), when
    the string's only quotes are those around its values (no quoted label names)."""
    shape = _template_of(raw)
    if shape is None:
        return None
    segs, keys = shape
    if (segs[0].count('"') != 1 or segs[0][-1:] != '"' or segs[-1].count('"') != 1 or segs[-1][:1] != '"'
            or any(x.count('"') != 2 or x[:1] != '"' or x[-1:] != '"' for x in segs[1:-1])):
        return None
    return "{" + segs[0][:-1], segs[-1][1:] + "}", [x[1:-1] for x in segs[1:-1]], keys


# A page whose extra labels carry this (impossible) label name is merged like Prometheus' honor_labels:
# true: the page's own labels win and a scraper label only fills a label the sample lacks (exporters that
# carry their own job/instance, such as per-rank training exporters). Sorts first in the extra key.
HONOR_LABELS_MARK = ""


def _merge_extra(parsed: LabelSet, extra: LabelSet) -> LabelSet:
    """A sample's labels with the scraper's: as Prometheus does by default (honor_labels: false), the
    scraper's labels win, and a sample's own value of such a label is kept as exported_<name>. With
    ``HONOR_LABELS_MARK`` in ``extra`` (honor_labels: true) the sample's own non-empty values win."""
    if extra and extra[0][0] == HONOR_LABELS_MARK:
        own = dict(parsed)
        fill = [pair for pair in extra[1:] if not own.get(pair[0])]
        if not fill:
            return parsed
        own.update(fill)
        return tuple(sorted(own.items()))
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
    for k, own_value in sorted(conflicts, key=lambda p: len(p[0])):
        name = k
        while True:
            name = "exported_" + name
            if not merged.get(name):
                merged[name] = own_value
                break
    return tuple(sorted(merged.items()))


def _extra_key(extra_labels: Mapping[str, str] | None) -> LabelSet:
    return tuple(sorted((str(k), str(v)) for k, v in (extra_labels or {}).items()))

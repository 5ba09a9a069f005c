"""Page plans: what ``parse_many`` keeps between scrapes of the same exporters, so that a steady fleet's
pages are read as "the same text as last time, new values" instead of being parsed again.

Theory of operation. A dcgm-exporter page changes between scrapes only in its value texts: the comment
lines, the metric names and the label strings (and so the series, the metric types, which values are
DCGM fields) stay byte for byte the same. ``PagePlans`` (held by the caller: a scrape source keeps one)
records, per run of consecutive pages (a chunk of a few MB, keyed by each page's source and scraper
labels), every line's expected bytes up to its value and the series and metric ids its sample becomes.
A later scrape of the same pages is then read with a handful of vectorised operations per chunk, no
Python per line and none per page:

1. the chunk's pages are joined and numpy finds every newline; the count must be the planned one and
   every page must end where its planned last line ends, so line i of the chunk is line i of the plan;
2. every line's planned prefix is proved in place: the bytes at each line start (a comment line with its
   newline, or a sample's metric name) and those after the name (the label string and the space) are
   gathered as fixed-width rows (``_rows``), grouped by width, and compared with one memcmp per group
   against the plan's rows (kept compact: a table of the distinct strings and an index per line);
3. the value texts (each line's rest, between the proved prefix and the newline) are gathered and read
   at once (``_plan_values``: digits with at most one point, the same double float() gives; anything
   else through ``_fast_joined``, the bulk path's reader); DCGM blank sentinels, NaN, Inf and negative
   counters become issues, exactly as the other paths report them.

Why this equals the plain path: the plan is only made from a page that has the plain path's simplest
shape (every line a `# ` comment that is not `# EOF`, or `name{labels} value` / `name value` with one
'{' and one '}' at most, the name a valid metric name, the label string valid, no NUL, no CR, no blank
line, not OpenMetrics, no (metric, series) twice), and steps 1-2 prove that this scrape's page is that
page with only its value texts changed (no newline inside a prefix, every byte compared). Such a page
reads, on every path, as one sample per sample line with the line's metric and labels (merged with the
scraper's as Prometheus merges them), the value float() gives, the scrape's timestamp, and an issue for
a value that must become missing data. ``tests/test_exposition_plan.py`` checks it against the plain
path for pages that change between scrapes (structure, values, broken lines) with Hypothesis, and
``tests/test_exposition_shape.py`` for pages planned like another page's shape (below). (CR and NUL
are looked for by the newline scan of step 1 when a plan is made: any byte below 14 but a newline
makes the chunk's pages be checked one by one.)

A plan is made from the scrape that has none (a cold read: 12,500 pages of 100k GPUs) without reading
every line: each row is taken to equal the row it most likely equals (``_build``), and the apply that
follows at once proves every byte of it, as it would on a later scrape. Most of a fleet's pages share
one layout (dcgm-exporter: the same comment lines and names, 8 GPUs' label strings in every block), so
a plan's first page is kept as a ``_Shape`` and the next pages with its line count are taken to be laid
out like it (``exposition_shape._build_like``): only each page's distinct label strings are read (each
likely as wide as the shape page's) and parsed (all of one template, in bulk:
``exposition_labels._merged_columns``, whose memo entries wait until a page changes), and the arrays and
name/comment checks that are the same for every plan of that many such pages (``_Frame``) are made once.
A wrong guess costs one failed apply; the chunk is then built row by row as before.

Anything a plan cannot prove (a page whose structure changed, a timestamp, a value float() refuses)
leaves that chunk's pages to the plain path this scrape, and the chunk's plan is made again from the
new pages. Pages that cannot be planned together are planned by halves, down to single pages; a page that
cannot be planned at all (OpenMetrics, timestamps, odd shapes) is remembered for ``RETRY_SCRAPES``
scrapes so that no scrape pays for trying again.

Series and metrics are interned into the plans' own builder (``names``), which the caller's builder
shares (``SnapshotBuilder.sharing``): the snapshot holds the same label-set list every scrape, so the
history maps it without re-interning 100k label sets. ``compact`` starts afresh when most of that list
is no longer scraped (a fleet whose pods come and go).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleethealth.signals.snapshot import InputIssue, SnapshotBuilder
from fleethealth.sources.exposition_blocks import _NAME_RE, _gather, _rows
from fleethealth.sources.exposition_labels import LabelCache
from fleethealth.sources.exposition_rows import _checks, _dense_unique, _row_ids, _run_starts, _stable_argsort
from fleethealth.sources.exposition_shape import (
    _SHAPES_MAX,
    PageKey,
    _build_like,
    _ChunkPlan,
    _label_sets,
    _line_starts,
    _Shape,
    _Text,
)
from fleethealth.sources.exposition_values import (
    _POW10,
    DCGM_FIELD_PREFIX,
    _fast_joined,
    blank_sentinel_mask,
    counter_like,
    is_openmetrics,
    value_problem,
)

RETRY_SCRAPES = 20  # a page that could not be planned is tried again after this many scrapes


class PagePlans:
    """Plans of the pages a caller scrapes again and again (see the module docstring). Pass the same
    object to every ``parse_many`` call of one source; it never changes what is parsed, only how fast."""

    def __init__(self, chunk_bytes: int = 4 << 20) -> None:
        self.chunk_bytes = chunk_bytes  # pages per plan: a few MB, read while in the CPU cache
        self.names = SnapshotBuilder()  # metrics and label sets interned across scrapes
        self.labels = LabelCache()  # label strings parsed across scrapes (any path of ``parse_many``)
        self._plans: dict[PageKey, _ChunkPlan] = {}  # by each plan's first page
        self._failed: dict[PageKey, int] = {}  # page -> the scrape it may be planned again
        self._shapes: dict[int, _Shape] = {}  # lines per page -> the last planned layout of such a page
        self.scrapes = 0
        self.planned_pages = 0  # of the last scrape: pages read through a plan (made now or before)
        self._used = 0  # series the last counted scrape used (see ``compact``)

    def builder(self) -> SnapshotBuilder:
        """A builder for one scrape that interns into ``names`` (see ``SnapshotBuilder.sharing``)."""
        return SnapshotBuilder.sharing(self.names)

    def compact(self, b: SnapshotBuilder) -> None:
        """After a scrape into ``b``: start afresh (every plan made again) when the label-set list holds
        more than twice the series that scrape used, plus 10,000: series of pages no longer scraped would
        otherwise be kept for ever. Counted only when the list has grown past the last count's bound."""
        if len(self.names.labelsets) <= 2 * self._used + 10_000:
            return
        used = np.zeros(len(b.labelsets), bool)  # (marked chunk by chunk: no copy of 2.5M ids)
        for c in b.chunks():
            used[c[1]] = True
        self._used = int(np.count_nonzero(used))
        if len(self.names.labelsets) > 2 * self._used + 10_000:
            self.names = SnapshotBuilder()
            self._plans.clear()
            self._shapes.clear()  # (their metric ids are the old list's)
            self._used = 0

    def parse_into(self, b: SnapshotBuilder, raws: Sequence[bytes | None], keys: list[PageKey], default_ts: float,
                   counts: list[int]) -> list[int]:
        """Read every page it can through a plan (making plans for pages that have none) into ``b``;
        ``raws[i]`` None: not plannable. Fills ``counts`` for those; returns the pages left to the
        plain path, in order."""
        self.scrapes += 1
        shared = b.labelsets is self.names.labelsets and b.metrics is self.names.metrics
        left: list[int] = []
        run: list[int] = []  # pages without a plan, consecutive, waiting to be planned
        run_bytes = 0
        i, n = 0, len(raws)
        planned = 0

        def make(pages: list[int]) -> None:
            """Plan ``pages``; when they cannot be planned together, each half on its own (a page with
            timestamps, say, then spoils only a small plan), down to single pages, which are left."""
            nonlocal planned
            if self._make(b, shared, pages, raws, keys, default_ts, counts):
                planned += len(pages)
            elif len(pages) > 1:
                make(pages[:len(pages) // 2])
                make(pages[len(pages) // 2:])
            else:
                self._failed[keys[pages[0]]] = self.scrapes + RETRY_SCRAPES
                left.extend(pages)

        def flush_run() -> None:
            nonlocal run, run_bytes
            if run:
                make(run)
            run, run_bytes = [], 0

        while i < n:
            raw = raws[i]
            plan = self._plans.get(keys[i])
            if plan is not None:
                k = len(plan.keys)
                if keys[i:i + k] == plan.keys and all(r is not None for r in raws[i:i + k]):
                    flush_run()
                    got = _apply(plan, _Text.of([r for r in raws[i:i + k] if r is not None]), self.names, b, shared,
                                 [keys[p][0] for p in range(i, i + k)], default_ts)
                    if got is not None:
                        for p, c in enumerate(got):
                            counts[i + p] = c
                        planned += k
                        i += k
                        continue
                del self._plans[keys[i]]  # the pages changed: planned again below, from this scrape
            if raw is None or not _plannable_head(raw) or self._failed.get(keys[i], 0) > self.scrapes:
                flush_run()
                left.append(i)
            else:
                run.append(i)
                run_bytes += len(raw)
                if run_bytes >= self.chunk_bytes:
                    flush_run()
            i += 1
        flush_run()
        self.planned_pages = planned
        return sorted(left)

    def _make(self, b: SnapshotBuilder, shared: bool, pages: list[int], raws: Sequence[bytes | None],
              keys: list[PageKey], default_ts: float, counts: list[int]) -> bool:
        texts = [r for r in (raws[p] for p in pages) if r is not None]
        tx = _Text.of(texts)
        if tx.odd and not all(map(_plannable, texts)):
            return False  # (a CR or NUL: the pages are planned by halves, the page with it not at all)
        sources = [keys[p][0] for p in pages]
        page_keys = [keys[p] for p in pages]
        # First as pages laid out like one planned before (the fleet's pages share one layout: a
        # dcgm-exporter page of 8 GPUs, say), then on the likely layout (rows equal to the row they most
        # likely equal, unchecked), then on rows read one by one. The apply right after proves every
        # byte of whichever plan it is given.
        got, plan = None, None
        shape = self._shapes.get(tx.nls.shape[0] // len(pages)) if tx.nls.shape[0] % len(pages) == 0 else None
        if shape is not None:
            plan = _build_like(shape, page_keys, tx, self.names, self.labels)
            if plan is not None:
                got = _apply(plan, tx, self.names, b, shared, sources, default_ts)
        if got is None:
            for exact in (False, True):
                plan = _build(page_keys, tx, self.names, exact, self.labels)
                if plan is not None:
                    got = _apply(plan, tx, self.names, b, shared, sources, default_ts)
                    if got is not None:
                        break
                elif exact:  # (the likely layout may be wrong where the exact one is not: a bare
                    return False  # metric's line after labelled ones)
            if got is not None and plan is not None and plan.shape is not None:
                if len(self._shapes) >= _SHAPES_MAX:
                    self._shapes.clear()
                self._shapes[plan.shape.n_lines] = plan.shape
        if got is None or plan is None:
            return False
        for p, c in zip(pages, got, strict=True):
            counts[p] = c
            self._failed.pop(keys[p], None)
        self._plans[plan.keys[0]] = plan
        return True


def _plannable_head(raw: bytes) -> bool:
    """``_plannable`` but for CR and NUL, which a chunk's newline scan finds at no cost (``_Text.odd``)."""
    return raw[:2] == b"# " and raw[-1:] == b"\n" and raw[-2:-1] != b"\n" and not is_openmetrics(raw)


def _plannable(raw: bytes) -> bool:
    """The page-wide part of the plan's shape: starts with a comment, ends with one newline, no CR, no
    NUL, not OpenMetrics."""
    return _plannable_head(raw) and b"\r" not in raw and b"\0" not in raw


def _build(keys: list[PageKey], tx: _Text, names: SnapshotBuilder, exact: bool, labels: LabelCache
           ) -> _ChunkPlan | None:
    """The plan of pages already found ``_plannable``, or None when a line has another shape.

    Lines are not read one by one: a page's label strings repeat in every block, a block's lines share
    their metric name and pages of one exporter share their comment lines, so each such row is taken to
    equal the row it most likely equals (same width), and only the others are read as bytes objects (for
    a dcgm-exporter page: its first block's label strings, each block's name and the first page's comment
    lines). Not ``exact``, that is assumed: the caller applies the plan to the same text at once, which
    proves every row. ``exact``: each row is compared (vectorised) with its likely equal first."""
    text, arr, nls = tx.text, tx.arr, tx.nls
    n = nls.shape[0]
    ls = _line_starts(nls)
    if n == 0 or bool((nls == ls).any()):
        return None  # (a blank line)
    page_last = np.searchsorted(nls, tx.ends)
    page_first = np.concatenate(([0], page_last[:-1] + 1))
    n_pages = tx.ends.shape[0]
    line_page = np.repeat(np.arange(n_pages), page_last - page_first + 1)
    is_c = arr[ls] == 35
    if bool((is_c & (arr[ls + 1] != 32)).any()):
        return None  # "#foo": not a comment the formats define
    c_lines = np.flatnonzero(is_c)
    s_lines = np.flatnonzero(~is_c)
    # Blocks: the sample lines after each comment line. A line's label string is likely its page's first
    # block's at the same place; its name likely its block's first line's.
    a, e = ls[s_lines], nls[s_lines]
    s_page = line_page[s_lines]
    blk = np.cumsum(is_c)[s_lines]
    b_first = _run_starts(blk)
    b_len = np.diff(np.append(b_first, s_lines.shape[0]))
    b_of = np.repeat(np.arange(b_first.shape[0]), b_len)
    pos = np.arange(s_lines.shape[0]) - b_first[b_of]
    pb = _run_starts(s_page[b_first])  # each page's first block (pages with samples)
    page_fb = np.full(n_pages, -1, np.int64)
    page_fb[s_page[b_first[pb]]] = pb
    fb = page_fb[s_page]
    lab_cand = np.where((b_of != fb) & (pos < b_len[fb]), b_first[fb] + pos, -1)
    # A block's name is likely the name of the first page's block at the same place (one exporter's pages
    # list their metrics in one order): only those are read, the rest take their width and bytes.
    b_page = s_page[b_first]
    b_ord = np.arange(b_first.shape[0]) - np.searchsorted(b_page, b_page)
    n0b = int(np.count_nonzero(b_page == b_page[0])) if b_first.shape[0] else 0
    root_block = np.where((b_page != b_page[0]) & (b_ord < n0b), b_ord, np.arange(b_first.shape[0])) \
        if exact is False else np.arange(b_first.shape[0])
    name_src = b_first[root_block][b_of]  # the line whose name each line likely has
    name_cand = np.where(name_src != np.arange(s_lines.shape[0]), name_src, -1)
    # Sample lines: `name{labels} value` or `name value`, cut at the first '}' (a valid label string
    # cannot end at a '}' inside quotes) followed by a space. (A value text with a space, a timestamp or
    # an exemplar, is refused by the value readers of the apply that follows.)
    cut = _cut_scanned(text, arr, a, e) if exact else _cut_assumed(text, a, e, b_first, root_block, b_of, lab_cand)
    if cut is None:
        return None
    name_end, vs = cut
    c_page = line_page[c_lines]
    c_ord = np.arange(c_lines.shape[0]) - np.searchsorted(c_page, c_page)
    n0 = int(np.count_nonzero(c_page == 0))
    com_cand = np.where((c_page > 0) & (c_ord < n0), c_ord, -1)
    lab_ids, labs = _row_ids(text, arr, name_end, vs - name_end, lab_cand, exact)
    name_ids, name_rows = _row_ids(text, arr, a, name_end - a, name_cand, exact)
    com_ids, comments = _row_ids(text, arr, ls[c_lines], nls[c_lines] - ls[c_lines] + 1, com_cand, exact)
    for cm in comments:
        if cm[1:].split(None, 3) == [b"EOF"]:
            return None
    mid_of = []
    for nm in name_rows:
        if _NAME_RE.fullmatch(nm) is None:
            return None
        mid_of.append(names.metric_id(nm.decode("ascii")))
    mids = np.asarray(mid_of, np.int32)[name_ids]
    # series ids: (page's scraper labels, raw label string), as the batched path interns them
    pair, inverse = _dense_unique(s_page * len(labs) + lab_ids, n_pages * len(labs))
    pages_of, lab_of = np.divmod(pair, len(labs))
    sets = _label_sets([keys[p][1] for p in pages_of.tolist()],
                       [labs[k][:-1] if len(labs[k]) > 1 else b"{}" for k in lab_of.tolist()], labels)
    if sets is None:
        return None
    pair_sid = np.asarray(names.series_ids(sets), np.int64)
    sids = pair_sid[inverse].astype(np.int32)
    # No (metric, series) twice in a page (the plain path would report the repeat): distinct (page, label
    # string) pairs of distinct series, and each pair with a name once.
    ps = pages_of * (len(names.labelsets) + 1) + pair_sid
    if np.unique(ps).shape[0] != ps.shape[0] or int(
            np.bincount(inverse * len(name_rows) + name_ids, minlength=0).max(initial=0)) > 1:
        return None
    dcgm_of = np.array([nm.startswith(DCGM_FIELD_PREFIX) for nm in names.metrics], bool)
    checks = _checks(np.concatenate((c_lines, s_lines)), np.concatenate((nls[c_lines] - ls[c_lines] + 1, name_end - a)),
                     np.concatenate((com_ids + len(name_rows), name_ids)), name_rows + comments, None)
    checks += _checks(s_lines, vs - name_end, lab_ids, labs, name_end - a)
    # The first page's layout, for pages laid out like it (``_build_like``); its label rows are distinct
    # strings numbered by first appearance (``_row_ids``), proven by the apply before the shape is kept.
    nc0, ns0 = int(np.searchsorted(c_lines, page_last[0] + 1)), int(np.searchsorted(s_lines, page_last[0] + 1))
    _, first, slot = np.unique(lab_ids[:ns0], return_index=True, return_inverse=True)
    per_slot = np.bincount(slot)
    occ = (_stable_argsort(slot).reshape(per_slot.shape[0], int(per_slot[0])).T
           if ns0 and per_slot.min() == per_slot.max() else None)
    shape = _Shape(
        n_lines=int(page_last[0]) + 1, c_lines=c_lines[:nc0], c_w=(nls - ls + 1)[c_lines[:nc0]],
        c_ids=com_ids[:nc0] + len(name_rows), s_lines=s_lines[:ns0], name_w=(name_end - a)[:ns0],
        name_ids=name_ids[:ns0], mids=mids[:ns0], dcgm=dcgm_of[mids[:ns0]], slot=slot.reshape(-1),
        slot_first=first, slot_w=(vs - name_end)[:ns0][first], occ=occ, rows=name_rows + comments, frames={},
    ) if ns0 else None
    return _ChunkPlan(
        keys=list(keys), n_lines=n, page_last=page_last, checks=checks, s_lines=s_lines,
        s_pre=vs - a, mids=mids, sids=sids, dcgm=dcgm_of[mids],
        per_page=np.bincount(s_page, minlength=n_pages), page_first=page_first, shape=shape,
    )


def _cut_scanned(text: bytes, arr: np.ndarray, a: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(name end, value start) of the sample lines a..e, from the offsets of every '{' and '}': lines with
    one of each (`name{labels} value`) or none (`name value`); None for any other line."""
    ob, cb = np.flatnonzero(arr == 123), np.flatnonzero(arr == 125)
    i_ob, i_cb = np.searchsorted(ob, a), np.searchsorted(cb, a)
    n_ob, n_cb = np.searchsorted(ob, e) - i_ob, np.searchsorted(cb, e) - i_cb
    has_lab = n_ob == 1
    if not bool((((n_ob == 1) & (n_cb == 1)) | ((n_ob == 0) & (n_cb == 0))).all()):
        return None
    o = ob[np.minimum(i_ob, max(ob.shape[0] - 1, 0))] if ob.shape[0] else np.zeros(a.shape[0], np.int64)
    c = cb[np.minimum(i_cb, max(cb.shape[0] - 1, 0))] if cb.shape[0] else np.zeros(a.shape[0], np.int64)
    bare = np.flatnonzero(~has_lab)  # `name value`: the name ends at the line's first space
    first_sp = np.zeros(a.shape[0], np.int64)
    first_sp[bare] = [text.find(b" ", x, y) for x, y in zip(a[bare].tolist(), e[bare].tolist(), strict=True)]
    name_end = np.where(has_lab, o, first_sp)
    vs = np.where(has_lab, c + 2, first_sp + 1)
    after_c = arr[np.minimum(c + 1, arr.shape[0] - 1)]
    if not bool(((name_end > a) & (vs < e) & (~has_lab | ((o < c) & (after_c == 32)))).all()):
        return None
    return name_end, vs


def _cut_assumed(text: bytes, a: np.ndarray, e: np.ndarray, b_first: np.ndarray, root_block: np.ndarray,
                 b_of: np.ndarray, lab_cand: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``_cut_scanned`` without a scan of the text: only the first line of each block that is its own
    ``root_block`` is searched for the end of its name, and only lines without a likely equal label (a
    page's first block) for the end of their labels; every other line is taken to have the widths of
    those. The apply that follows proves it."""
    own = np.flatnonzero(root_block == np.arange(root_block.shape[0]))
    ends = []
    for x, y in zip(a[b_first[own]].tolist(), e[b_first[own]].tolist(), strict=True):
        o, sp = text.find(b"{", x, y), text.find(b" ", x, y)
        ends.append(o if o >= 0 and (sp < 0 or o < sp) else sp)
    name_w = np.zeros(root_block.shape[0], np.int64)
    name_w[own] = np.asarray(ends, np.int64) - a[b_first[own]]
    if bool((name_w[own] <= 0).any()):
        return None
    name_end = a + name_w[root_block][b_of]
    roots = np.flatnonzero(lab_cand < 0)
    widths = []
    for o, y in zip(name_end[roots].tolist(), e[roots].tolist(), strict=True):
        if o >= y:  # (a name taken to be as long as another line's runs past this line)
            return None
        if text[o] == 32:  # `name value`
            widths.append(1)
            continue
        c = text.find(b"}", o, y)
        if text[o] != 123 or c < 0 or text[c + 1] != 32:
            return None
        widths.append(c + 2 - o)
    lab_w = np.zeros(a.shape[0], np.int64)
    lab_w[roots] = widths
    took = np.flatnonzero(lab_cand >= 0)
    lab_w[took] = lab_w[lab_cand[took]]
    vs = name_end + lab_w
    if not bool((vs < e).all()):
        return None
    return name_end, vs


def _apply(plan: _ChunkPlan, tx: _Text, names: SnapshotBuilder, b: SnapshotBuilder, shared: bool,
           sources: list[str], default_ts: float) -> list[int] | None:
    """This scrape's pages through ``plan`` into ``b``: samples kept per page, or None (nothing added)
    when the pages are not the planned ones with new values."""
    text, arr, nls = tx.text, tx.arr, tx.nls
    if nls.shape[0] != plan.n_lines or not np.array_equal(nls[plan.page_last], tx.ends):
        return None
    ls = _line_starts(nls)
    size = len(text)
    for chk in plan.checks:
        at = ls[chk.lines] if chk.shift is None else ls[chk.lines] + chk.shift
        if int(at.max()) > size - chk.width or not chk.holds(_rows(text, chk.width, at)):
            return None
    # every line is its planned prefix, then the value text up to its newline
    vs = ls[plan.s_lines] + plan.s_pre
    ve = nls[plan.s_lines]
    n = vs.shape[0]
    joined = _gather(arr, vs, ve)
    if joined is None:
        return None  # an empty value
    joined = joined[1:]
    values = _plan_values(joined, n)
    strict = values is not None
    if values is None:
        if joined.count(b" ") != n - 1 or any(ch in joined for ch in (b"\t", b"\v", b"\f")):
            return None  # (float() would take a value padded with such whitespace; the plain path decides)
        values = _fast_joined(joined, n, lambda: joined.split(b" "), lambda i: joined.split(b" ")[i])
        if values is None:
            return None
    bad = blank_sentinel_mask(values, plan.dcgm)
    if not strict:
        bad |= ~np.isfinite(values)
        neg = np.flatnonzero(values < 0)
        for i in neg.tolist():
            line = int(plan.s_lines[i])
            if _counter_at(text, ls, nls, plan, line, names.metrics[int(plan.mids[i])]):
                bad[i] = True
    mids, sids = plan.mids, plan.sids
    per_page = plan.per_page
    issues: list[InputIssue] = []
    if bad.any():
        where = np.flatnonzero(bad)
        pages = np.searchsorted(plan.page_last, plan.s_lines[where])
        for i, p in zip(where.tolist(), pages.tolist(), strict=True):
            line = int(plan.s_lines[i])
            name = names.metrics[int(mids[i])]
            v = float(values[i])
            counter = v < 0 and _counter_at(text, ls, nls, plan, line, name)
            reason = value_problem(name, v, counter) or "invalid value"
            raw = text[int(ls[line]):int(nls[line])]
            issues.append(InputIssue(sources[p], line - int(plan.page_first[p]) + 1, reason,
                                     raw.decode("utf-8", "replace").strip()[:200]))
        keep = ~bad
        mids, sids, values = mids[keep], sids[keep], values[keep]
        per_page = per_page - np.bincount(pages, minlength=per_page.shape[0])
    if not shared:  # the caller's builder interns on its own: map the plans' ids to its ids
        um, us = np.unique(mids, return_inverse=True), np.unique(sids, return_inverse=True)
        mids = np.asarray([b.metric_id(names.metrics[m]) for m in um[0].tolist()], np.int32)[um[1]]
        sids = np.asarray(b.series_ids([names.labelsets[s] for s in us[0].tolist()]), np.int32)[us[1]]
    # (every sample has the scrape's time: one value seen n times, read-only, until ``build`` copies the
    # chunks into the snapshot; not 8 bytes a sample written, and faulted in on a cold read, per chunk)
    b.add_arrays(mids, sids, values, np.broadcast_to(np.float64(default_ts), values.shape))
    b.issues.extend(issues)
    return per_page.tolist()


def _counter_at(text: bytes, ls: np.ndarray, nls: np.ndarray, plan: _ChunkPlan, line: int, name: str) -> bool:
    """Whether ``name`` is a counter at ``line``: by its suffix, or by the `# TYPE` lines above it in its
    page (as the plain path reads types while it goes). Only asked about negative values."""
    p = int(np.searchsorted(plan.page_last, line))
    types: dict[str, str] = {}
    for j in range(int(plan.page_first[p]), line):
        row = text[int(ls[j]):int(nls[j])]
        if row[:1] == b"#":
            parts = row.lstrip(b"#").split(None, 3)
            if len(parts) >= 3 and parts[0] == b"TYPE":
                types[parts[1].decode("utf-8", "replace")] = parts[2].decode("utf-8", "replace").lower()
    return counter_like(name, types)


def _plan_values(joined: bytes, n: int) -> np.ndarray | None:
    """Value texts (joined by b" ") that are all digits with at most one '.' inside, read at once: an
    integer reader over the digits, then m / 10**k for the k digits after the point (Clinger's fast
    path: with m < 2**53 and k <= 22 the one rounding gives float()'s double; integers up to 18 digits
    are exact in int64 and rounded once to float64). None when any value is not of that form."""
    if joined.translate(None, b"0123456789. ") or joined.count(b" ") != n - 1 or not joined:
        return None
    if joined[:1] == b" " or joined[-1:] == b" " or b"  " in joined:
        return None
    buf = np.frombuffer(joined, np.uint8)
    ends = np.append(np.flatnonzero(buf == 32), len(joined))
    starts = np.concatenate(([0], ends[:-1] + 1))
    width = ends - starts
    dots = np.flatnonzero(buf == 46)
    k = np.zeros(n, np.int64)
    if dots.shape[0]:
        dv = np.searchsorted(ends, dots)
        if bool((dv[1:] == dv[:-1]).any()) or bool(((dots == starts[dv]) | (dots == ends[dv] - 1)).any()):
            return None  # two points in a value, or `.5` / `5.`: float() decides
        k[dv] = ends[dv] - dots - 1
        digits = joined.replace(b".", b"")
    else:
        digits = joined
    m = np.fromstring(digits, dtype=np.int64, sep=" ")  # type: ignore[call-overload]
    if m.shape[0] != n:
        return None
    out = m.astype(np.float64)
    if dots.shape[0]:
        frac = k > 0
        out[frac] = out[frac] / _POW10[k[frac]]
    # Too many digits for the exact reading (an integer past 18 digits may have saturated, a decimal past
    # 15 is no longer below 2**53): those few (DCGM's INT64 blank is one) are read by float().
    for i in np.flatnonzero(((k > 0) & (width > 16)) | (width > 18)).tolist():
        out[i] = float(joined[int(starts[i]):int(ends[i])])
    return out

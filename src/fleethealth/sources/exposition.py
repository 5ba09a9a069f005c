"""Prometheus text exposition (0.0.4) and OpenMetrics 1.0 into a columnar Snapshot, fast.

Theory of operation. A scrape of dcgm-exporter is blocks of lines, one block per metric family (`# HELP`,
`# TYPE`, then one line per GPU), and every GPU's label string `{gpu="0",UUID=...}` is byte-identical
across all of its metrics and in the same order in every block. The text is cut at comment lines into
blocks (offsets, no copies), and a block whose lines all start with the same `name{` takes a fast path
made only of C-level bytes, regex and numpy operations, no Python per line:

- first such block: numpy finds every newline and '}' (one per line), which cuts each line into (raw
  label string, value text) in place (``_cut_lines``); each raw label string is interned once (new ones
  are parsed together through a bytes template regex built from the first, see ``_parse_labels_bulk``;
  later parses of the same exporter hit the caller's ``LabelCache``);
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

Modules: ``exposition_labels`` (label strings and the ``LabelCache`` a caller keeps), ``exposition_values`` (value texts and the
missing-data rules), ``exposition_blocks`` (the parse context and the fast block paths),
``exposition_careful`` (the line-by-line path), ``exposition_batch`` (``parse_many``'s batched blocks),
``exposition_plan`` (``PagePlans``: what ``parse_many`` keeps across scrapes of the same pages, so that a
steady fleet's pages are proved equal to the last scrape's but for their values and read in bulk; its
fixed-width rows and their checks: ``exposition_rows``). This
module holds the page-level driver (which path a block takes) and the public API; every name listed in
``__all__`` is importable from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from fleethealth.memory import gc_paused
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder

# Some internals are imported here only for tests, which reach them through this module (noqa: F401). Tests
# patch _fast_block, _mixed_block, _slow_block, _parse_into and _sample_block here: the page driver below
# looks them up in this module's namespace.
from fleethealth.sources.exposition_batch import (
    _SCAN_BYTES,
    _Batch,
    _batch_block,
    _Group,
    _one_newline,
    _scan_pages,
)
from fleethealth.sources.exposition_blocks import (
    _NAME_RE,  # noqa: F401  (re-exported)
    _Ctx,
    _fast_block,
    _flush,
    _header,
    _mixed_block,
    _next_comment,
)
from fleethealth.sources.exposition_careful import _slow_block
from fleethealth.sources.exposition_labels import (  # noqa: F401  (re-exported)
    LabelCache,
    _extra_key,
    _merge_extra,
    _parse_labels,
    _parse_labels_bulk,
    _split_labels,
)
from fleethealth.sources.exposition_plan import PagePlans
from fleethealth.sources.exposition_rules import check_openmetrics
from fleethealth.sources.exposition_values import (  # noqa: F401
    DCGM_FIELD_PREFIX,
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    _decimal_values,
    _fast_joined,
    _fast_values,
    blank_sentinel_mask,
    counter_like,
    is_dcgm_field,
    is_openmetrics,
    value_problem,
)

__all__ = [
    "DCGM_FIELD_PREFIX",
    "DCGM_FP64_BLANK",
    "DCGM_INT32_BLANK",
    "DCGM_INT64_BLANK",
    "blank_sentinel_mask",
    "counter_like",
    "is_dcgm_field",
    "is_openmetrics",
    "LabelCache",
    "parse_exposition",
    "parse_many",
    "parse_many_into",
    "PagePlans",
    "value_problem",
]


def parse_exposition(
    data: str | bytes,
    *,
    default_ts: float,
    source: str = "<text>",
    builder: SnapshotBuilder | None = None,
    extra_labels: Mapping[str, str] | None = None,
    openmetrics: bool | None = None,
    labels: LabelCache | None = None,
) -> Snapshot:
    """Parse Prometheus text format 0.0.4 or OpenMetrics 1.0 into a Snapshot.

    Samples without a timestamp get ``default_ts``; timestamps are milliseconds in 0.0.4 and seconds in
    OpenMetrics (detected by the closing `# EOF` unless ``openmetrics`` says). Histogram and summary lines
    (`_bucket`, `_sum`, `_count`) stay separate samples under their own names, `le` is a label.
    ``extra_labels`` are added to every sample (a sample's own different value for one of them is kept as
    ``exported_<name>``, as Prometheus does). With ``builder``,
    samples go into it (shared interning across endpoints) and the result is ``builder.build(default_ts)``.
    ``labels``: parsed label strings a caller keeps across parses of the same exporters (a fresh one per
    call without it); it changes nothing but the cost.
    """
    b = builder if builder is not None else SnapshotBuilder()
    raw = _normalise(data)
    om = is_openmetrics(raw) if openmetrics is None else openmetrics
    ctx = _Ctx(b, source, float(default_ts), 1.0 if om else 1000.0, _extra_key(extra_labels),
               labels=labels if labels is not None else LabelCache())
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
    plans: PagePlans | None = None,
    labels: LabelCache | None = None,
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
    given, is filled with the number of samples kept per page (in ``pages`` order). ``labels``: parsed
    label strings kept across calls (default: the ``plans``' own, else a fresh one for this call).
    """
    b = builder if builder is not None else plans.builder() if plans is not None else SnapshotBuilder()
    parse_many_into(b, pages, default_ts=default_ts, sample_counts=sample_counts, plans=plans, labels=labels)
    snap = b.build(float(default_ts))
    # Read-only ids (a snapshot is data flowing one way; nothing downstream writes into them): the
    # history then keeps the very arrays in its plans instead of copying them (20 MB on a cold read of
    # 100k GPUs).
    snap.metric_ids.setflags(write=False)
    snap.series_ids.setflags(write=False)
    return snap


def parse_many_into(
    b: SnapshotBuilder, pages: Sequence[Page], *, default_ts: float, sample_counts: list[int] | None = None,
    plans: PagePlans | None = None, labels: LabelCache | None = None,
) -> None:
    """``parse_many`` into a builder the caller builds (a scraper adding its own `up` samples). With
    ``plans`` (best with ``b = plans.builder()``), pages read before are read through their plans.
    Garbage collection waits until it is done: a cold parse makes ~1M label-set tuples, bytes rows and
    dict entries, none of which can form a cycle (``fleethealth.memory.gc_paused``)."""
    if labels is None:
        labels = plans.labels if plans is not None else LabelCache()
    with gc_paused():
        _parse_many_into(b, pages, default_ts=default_ts, sample_counts=sample_counts, plans=plans, labels=labels)


def _parse_many_into(
    b: SnapshotBuilder, pages: Sequence[Page], *, default_ts: float, sample_counts: list[int] | None,
    plans: PagePlans | None, labels: LabelCache,
) -> None:
    ts = float(default_ts)
    counts = [0] * len(pages)
    extras = [_extra_key(extra) for _, extra, _ in pages]
    sources = [str(src) for _, _, src in pages]
    todo: Sequence[int] = range(len(pages))
    if plans is not None:
        keys = list(zip(sources, extras, strict=True))
        todo = plans.parse_into(b, [data if isinstance(data, bytes) else None for data, _, _ in pages], keys, ts,
                                counts)
    raws = {i: _normalise(pages[i][0]) for i in todo}
    batch = [i for i, raw in raws.items() if raw[:1] == b"#" and not is_openmetrics(raw)]
    alone = sorted(set(todo).difference(batch))
    if batch:
        st = _Batch(b, ts, [sources[i] for i in batch], [extras[i] for i in batch], np.zeros(len(batch), np.int64),
                    labels=labels)
        rejected = _parse_batch(st, [_one_newline(raws[i]) for i in batch])
        for k, c in enumerate(st.counts.tolist()):
            counts[batch[k]] = c
        alone = sorted(alone + [batch[k] for k in rejected])
    for i in alone:
        ctx = _Ctx(b, sources[i], ts, 1.0 if is_openmetrics(raws[i]) else 1000.0, extras[i], labels=labels)
        _parse_page(ctx, raws[i], is_openmetrics(raws[i]))
        counts[i] = ctx.added
    if plans is not None:
        plans.compact(b)
    if sample_counts is not None:
        sample_counts[:] = counts



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



def _parse_group(st: _Batch, grp: _Group, heads: list[bytes]) -> bool:
    """Pages of ``grp`` share the comment lines ``heads``; block j of all of them is parsed as one block.
    False, having added nothing, when a comment line needs the per-page parser (a mid-page `# EOF`)."""
    gctx = _Ctx(st.builder, "", st.default_ts, 1000.0, (), labels=st.labels)
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



def _normalise(data: str | bytes) -> bytes:
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if b"\r" in raw:
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return raw



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



def iter_samples(snap: Snapshot) -> Iterable[tuple[str, tuple[tuple[str, str], ...], float]]:
    """(name, sorted labels, value) per sample; for comparisons in tests and the benchmark."""
    for m, s, v in zip(snap.metric_ids.tolist(), snap.series_ids.tolist(), snap.values.tolist(), strict=True):
        yield snap.metrics[m], snap.labelsets[s], v

"""The batched path of ``parse_many``: block j of every page of one skeleton parsed as one big block.

Theory of operation. A fleet is thousands of small pages of the same exporter, and every page has the
same comment lines in the same order. ``_scan_pages`` finds the comment lines of a few MB of pages with
one vectorised scan and groups the pages by them (``_Group``); ``_batch_block`` joins block j of every
page of a group and parses it on the single-text fast path (cut and intern the first block, prove later
ones against its label template), with each line's page known from the per-page line counts, so that
issues carry their page's source and line numbers and repeats are judged per page. ``_batch_series``
interns (page's scraper labels, raw label string) pairs, memoised in the caller's ``LabelCache``. Whatever this path
cannot prove it refuses, having added nothing, and the caller parses those pages or blocks alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from fleethealth.signals.snapshot import InputIssue, LabelSet, SnapshotBuilder
from fleethealth.sources.exposition_blocks import (
    _NAME_RE,
    _Ctx,
    _cut_block,
    _cut_lines,
    _make_template,
    _template_block,
    _values_and_ts,
)
from fleethealth.sources.exposition_labels import (
    _LABEL_CACHE_MAX,
    LabelCache,
    _merge_extra,
    _parse_labels,
    _parse_labels_bulk,
)
from fleethealth.sources.exposition_rules import SeenSamples, sample_text
from fleethealth.sources.exposition_values import _bad_values, value_problem


@dataclass
class _Batch:
    builder: SnapshotBuilder
    default_ts: float
    sources: list[str]
    extras: list[LabelSet]
    counts: np.ndarray  # samples kept per batch page
    ctxs: dict[int, _Ctx] = field(default_factory=dict)  # careful-path contexts of pages, made on demand
    seen: SeenSamples = field(default_factory=SeenSamples)  # what the batched blocks added (for repeats)
    labels: LabelCache = field(default_factory=LabelCache)  # parsed label strings (the caller's)

    def ctx(self, page: int) -> _Ctx:
        c = self.ctxs.get(page)
        if c is None:
            c = self.ctxs[page] = _Ctx(self.builder, self.sources[page], self.default_ts, 1000.0, self.extras[page],
                                       seen=self.seen, scope=page, labels=self.labels)  # (repeats: the batch's)
        return c


def _one_newline(raw: bytes) -> bytes:
    """The page ending in exactly one newline (what the batch's cut expects), copied only if needed."""
    if raw[-1:] == b"\n" and raw[-2:-1] not in (b"\n", b" ", b"\t"):
        return raw
    return raw.rstrip(b" \t\n") + b"\n"


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
    of (page's extra labels, raw string) is memoised in the caller's ``LabelCache``, so a steady fleet pays one dict
    lookup and one interning per series per cycle."""
    keys = list(zip(map(st.extras.__getitem__, pages), labs, strict=True))
    cache = st.labels.merged
    sets = list(map(cache.get, keys))
    if None in sets:
        miss = [i for i, x in enumerate(sets) if x is None]
        _parse_labels_bulk(list({labs[i] for i in miss}), st.labels)
        if len(cache) + len(miss) >= _LABEL_CACHE_MAX:
            cache.clear()
        for i in miss:
            extra, r = keys[i]
            ls = cache.get(keys[i])
            if ls is None:
                parsed = st.labels.parsed.get(r)
                if parsed is None:  # the bounded cache was emptied meanwhile
                    parsed = _parse_labels(r, st.labels)
                if isinstance(parsed, str):
                    return None
                ls = cache[keys[i]] = _merge_extra(parsed, extra) if extra else parsed
            sets[i] = ls
    return np.fromiter(st.builder.series_ids(sets), np.int32, len(sets))  # type: ignore[arg-type]

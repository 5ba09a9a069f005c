"""Page plans' data and the plans made from a kept page layout (``exposition_plan``'s cold read).

Theory of operation. ``exposition_plan`` (see its docstring) reads a steady fleet's pages through plans:
per chunk of pages, every line's expected prefix and the series and metric ids its sample becomes
(``_ChunkPlan``). This module holds the plans' data and the cheapest way to make one: most of a fleet's
pages share one layout (dcgm-exporter: the same comment lines and names, 8 GPUs' label strings in every
block), so a planned page's layout is kept as a ``_Shape`` and the next pages with its line count are
taken to be laid out like it (``_build_like``). Only each page's distinct label strings ('slots') are
read (each likely as wide as the shape page's, searched for only where it is not) and parsed, all of
one template in bulk (``_label_sets`` -> ``exposition_labels._merged_columns``; slot strings all of one
width are handed over as the one buffer they were gathered into, which is also the plan's check of them
and what the label memo queue keeps: ``FixedRows``); the arrays and the name/comment checks that are the
same for every plan of that many such pages (``_Frame``: the slots' lines and likely widths, and the
value starts of plans whose slot strings are all of one width) are made once per shape. Nothing else of
the pages is read: the caller applies the plan to the same text at once, which proves every byte of it,
so a wrong guess costs one failed apply (the chunk is then built row by row). ``_Text`` is a chunk's joined pages with their newlines (a CR or NUL found on the way).
Pure functions of their arguments; the shapes and frames live in the ``PagePlans`` the caller holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain, repeat

import numpy as np

from fleethealth.signals.snapshot import LabelSet, SnapshotBuilder
from fleethealth.sources.exposition_blocks import _rows
from fleethealth.sources.exposition_labels import (
    _LABEL_CACHE_MAX,
    FixedRows,
    LabelCache,
    Raws,
    _merge_extra,
    _merged_bulk,
    _merged_columns,
    _parse_labels,
    _parse_labels_bulk,
)
from fleethealth.sources.exposition_rows import _checks, _RowCheck

PageKey = tuple[str, LabelSet]  # (source, scraper labels): which page a plan is for


@dataclass(slots=True)
class _ChunkPlan:
    keys: list[PageKey]
    n_lines: int
    page_last: np.ndarray  # each page's last line
    checks: list[_RowCheck]
    s_lines: np.ndarray  # the sample lines
    s_pre: np.ndarray  # their prefix widths (name, labels, space): the value starts there
    mids: np.ndarray  # metric id per sample line (in ``PagePlans.names``)
    sids: np.ndarray  # series id per sample line
    dcgm: np.ndarray  # the sample line's metric is a DCGM field
    per_page: np.ndarray  # sample lines per page
    page_first: np.ndarray  # each page's first line
    shape: _Shape | None = None  # the layout of its first page (see ``_build_like``)


@dataclass(slots=True)
class _Shape:
    """The layout of a planned page (the first of its plan), a hypothesis for planning pages laid out like
    it (``_build_like``): which lines are comments, which sample lines have which name, and which of the
    page's distinct label strings ('slots', numbered by first appearance) each sample line repeats."""

    n_lines: int
    c_lines: np.ndarray  # the comment lines (of the page)
    c_w: np.ndarray  # their widths, newline included
    c_ids: np.ndarray  # their rows (in ``rows``)
    s_lines: np.ndarray  # the sample lines
    name_w: np.ndarray  # per sample line: its name's width
    name_ids: np.ndarray  # its name's row (in ``rows``)
    mids: np.ndarray  # its metric id (in ``PagePlans.names``)
    dcgm: np.ndarray
    slot: np.ndarray  # its label slot
    slot_first: np.ndarray  # per slot: its first sample line (an index into ``s_lines``)
    slot_w: np.ndarray  # per slot: its label string's width with the space after it (1: no labels)
    occ: np.ndarray | None  # (c, slots): each slot's k-th sample line, when every slot has c of them
    rows: list[bytes]  # names, then comment lines
    frames: dict[int, _Frame]  # pages per plan -> what every plan of that many such pages shares


@dataclass(slots=True)
class _Frame:
    """The part of a plan of ``n`` pages of one shape that is the same for all such plans (shared by them)."""

    page_first: np.ndarray
    page_last: np.ndarray
    s_lines: np.ndarray
    name_w: np.ndarray  # per sample line
    row_of: np.ndarray  # per sample line: page * slots + its slot
    mids: np.ndarray
    dcgm: np.ndarray
    per_page: np.ndarray
    heads: list[_RowCheck]  # the name and comment checks
    lab_lines: np.ndarray | None  # the sample lines by (k-th occurrence, page, slot), when the shape has ``occ``
    lab_shift: np.ndarray | None  # their names' widths
    slot_at: np.ndarray  # per page and slot: the slot's first line
    slot_name_w: np.ndarray  # its name's width
    slot_w: np.ndarray  # the shape page's slot string's width (with its space)
    pre: dict[int, np.ndarray] = field(default_factory=dict)  # slot width -> value starts, when all are as wide


_SHAPES_MAX = 16  # page layouts kept (one per exporter kind and GPU count, say)


@dataclass(slots=True)
class _Text:
    """A chunk's pages joined, with every newline's offset and each page's last byte."""

    text: bytes
    arr: np.ndarray
    nls: np.ndarray
    ends: np.ndarray
    odd: bool  # a byte below 14 other than a newline (CR, NUL, tab, ...): see ``_plannable``

    @staticmethod
    def of(texts: list[bytes]) -> _Text:
        text = b"".join(texts)
        arr = np.frombuffer(text, np.uint8)
        nls, odd = _newlines(arr)
        return _Text(text, arr, nls, np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts))) - 1, odd)


def _newlines(arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """Offsets of every newline, found piece by piece into a reused scratch buffer (a whole-text compare
    writes and reads back a temporary the size of the text), and whether another byte below 14 is there:
    the bytes below 14 are found (as cheaply as the newlines alone), then the newlines among them."""
    scratch = np.empty(min(arr.shape[0], _PIECE), bool)
    parts = []
    odd = False
    for c0 in range(0, arr.shape[0], _PIECE):
        c1 = min(c0 + _PIECE, arr.shape[0])
        m = scratch[: c1 - c0]
        np.less(arr[c0:c1], 14, out=m)
        low = np.flatnonzero(m) + c0
        nl = low[arr[low] == 10]
        odd = odd or nl.shape[0] != low.shape[0]
        parts.append(nl)
    return (np.concatenate(parts) if parts else np.zeros(0, np.int64)), odd


_PIECE = 1 << 18


def _line_starts(nls: np.ndarray) -> np.ndarray:
    ls = np.empty(nls.shape[0], np.int64)
    if ls.shape[0]:
        ls[0] = 0
        ls[1:] = nls[:-1] + 1
    return ls


def _build_like(shape: _Shape, keys: list[PageKey], tx: _Text, names: SnapshotBuilder, labels: LabelCache
                ) -> _ChunkPlan | None:
    """The plan of pages taken to be laid out as ``shape``'s page (the same lines, comments and names;
    each sample line with the label string of its slot, read from the slot's first line in each page),
    or None when a page visibly is not. Nothing else of the pages is read: the apply that follows proves
    every row, as it proves ``_build``'s likely layout. Per plan, only each page's slot strings (8 for a
    dcgm-exporter page of 8 GPUs) are read as bytes and parsed; the rest is the ``_Frame`` of plans of
    that many such pages, made once."""
    text, nls = tx.text, tx.nls
    n_pages, n_slots = tx.ends.shape[0], shape.slot_first.shape[0]
    if nls.shape[0] != n_pages * shape.n_lines:
        return None
    fr = shape.frames.get(n_pages)
    if fr is None:
        if len(shape.frames) >= _SHAPES_MAX:
            shape.frames.clear()
        fr = shape.frames[n_pages] = _frame(shape, n_pages)
    if not np.array_equal(nls[fr.page_last], tx.ends):
        return None
    # each page's slot strings: as ``_cut_assumed`` cuts a line, after the name the shape says it has: to
    # the first '}' of the line, which a space follows (a single space: `name value`)
    o = nls[fr.slot_at - 1] + 1 + fr.slot_name_w  # (a page's line 0 is a comment)
    y = nls[fr.slot_at]
    if bool((o >= y).any()):
        return None
    arr = tx.arr
    first = arr[o]
    # Where it likely ends: as wide as the shape page's slot string (fixed-format values: a UUID, a bus
    # id, a GPU index), taken where that reads '}' and a space (and, below, no '}' before it), searched
    # for only where it does not (a host name of another length, say).
    end = o + fr.slot_w
    ok = end <= y
    last = np.where(ok, end - 1, o)
    guess = ok & (arr[last] == 32) & ((end - o == 1) | ((first == 123) & (arr[np.maximum(last - 1, o)] == 125)))
    if not bool(guess.all()):
        _find_ends(text, arr, o, y, first, end, np.flatnonzero(~guess))
        if bool((end < 0).any()):
            return None
    bare = first == 32
    widths = end - o
    w0 = int(widths[0])
    same_w = w0 > 1 and bool((widths == w0).all())
    raws: Raws
    pattern = None
    if same_w:  # (one gather, each string with its space: the strings are cut in it, and it is the check's)
        pattern = _rows(text, w0, o)
        raws = FixedRows(pattern, w0 - 1)
        closing = np.count_nonzero(np.frombuffer(pattern, np.uint8) == 125)
    else:
        raws = list(map(text.__getitem__, map(slice, o.tolist(), (end - 1).tolist())))  # (rows less their space)
        closing = np.count_nonzero(np.frombuffer(b"".join(raws), np.uint8) == 125)
    if closing != len(raws) - int(np.count_nonzero(bare)):
        # a '}' before the guessed end of some string: each is searched (the first '}' ends it)
        _find_ends(text, arr, o, y, first, end, np.arange(o.shape[0]))
        if bool((end < 0).any()):
            return None
        raws = list(map(text.__getitem__, map(slice, o.tolist(), (end - 1).tolist())))
        widths = end - o
        w0 = int(widths[0])
        same_w = w0 > 1 and bool((widths == w0).all())
        pattern = None
    any_bare = bool(bare.any())
    rows = list(map(text.__getitem__, map(slice, o.tolist(), end.tolist()))) if any_bare else None
    if any_bare:
        assert isinstance(raws, list)  # (bare strings are 1 byte wide: never all of one width above 1)
        for i in np.flatnonzero(bare).tolist():
            raws[i] = b"{}"  # (as ``_build`` keys a line without labels)
    sets = _label_sets(list(chain.from_iterable(repeat(k[1], n_slots) for k in keys)), raws, labels, n_slots,
                       {k[1] for k in keys})
    if sets is None:
        return None
    pair_sid = np.asarray(names.series_ids(sets), np.int64).reshape(n_pages, n_slots)
    by_page = np.sort(pair_sid, axis=1)
    if bool((by_page[:, 1:] == by_page[:, :-1]).any()):
        return None  # two label strings of a page are one series: ``_build`` decides
    one_w = bool((widths == w0).all())
    if one_w:  # (every plan of the frame with slot strings of this width has these value starts)
        s_pre = fr.pre.get(w0)
        if s_pre is None:
            if len(fr.pre) >= _SHAPES_MAX:
                fr.pre.clear()
            s_pre = fr.pre[w0] = fr.name_w + w0
    else:
        s_pre = fr.name_w + widths[fr.row_of]
    if fr.lab_lines is not None and fr.lab_shift is not None and one_w:
        # every slot as often, all of one width: the lines by (k-th occurrence, page, slot) read the
        # pages' slot strings in turn, k times over (what ``_checks`` makes of such rows)
        if pattern is None:
            pattern = b"".join(rows) if rows is not None else _rows(text, w0, o) if same_w else b" ".join(raws) + b" "
        labs = [_RowCheck(w0, fr.lab_lines, fr.lab_shift, np.frombuffer(pattern, np.dtype((np.void, w0))), None,
                          fr.lab_lines.shape[0] // len(raws), pattern)]
    else:
        if rows is None:
            rows = list(map(text.__getitem__, map(slice, o.tolist(), end.tolist())))
        labs = _checks(fr.s_lines, widths[fr.row_of], fr.row_of, rows, fr.name_w)
    return _ChunkPlan(
        keys=list(keys), n_lines=nls.shape[0], page_last=fr.page_last, checks=fr.heads + labs,
        s_lines=fr.s_lines, s_pre=s_pre, mids=fr.mids, sids=pair_sid.reshape(-1)[fr.row_of].astype(np.int32),
        dcgm=fr.dcgm, per_page=fr.per_page, page_first=fr.page_first, shape=shape,
    )


def _find_ends(text: bytes, arr: np.ndarray, o: np.ndarray, y: np.ndarray, first: np.ndarray, end: np.ndarray,
               sel: np.ndarray) -> None:
    """``end[sel]``: where each slot string o..y (its line less the name) ends with its space: after
    the first '}', which a space must follow, or at once for `name value`; -1 where neither holds."""
    if sel.shape[0] == 0:
        return
    os_, ys, fs = o[sel], y[sel], first[sel]
    c = np.fromiter(map(text.find, repeat(b"}"), os_.tolist(), ys.tolist()), np.int64, sel.shape[0])
    bare = fs == 32
    good = bare | ((fs == 123) & (c >= 0) & (arr[c + 1] == 32))
    end[sel] = np.where(good, np.where(bare, os_ + 1, c + 2), -1)


def _frame(shape: _Shape, n_pages: int) -> _Frame:
    page_first = np.arange(n_pages, dtype=np.int64) * shape.n_lines
    s_lines = (page_first[:, None] + shape.s_lines).reshape(-1)
    n_slots = shape.slot_first.shape[0]
    lab_lines = lab_shift = None
    if shape.occ is not None:
        tiles = shape.occ.shape[0]
        lab_lines = (page_first[None, :, None] + shape.s_lines[shape.occ][:, None, :]).reshape(-1)
        lab_shift = np.broadcast_to(shape.name_w[shape.occ][:, None, :], (tiles, n_pages, n_slots)).reshape(-1)
    name_w = np.tile(shape.name_w, n_pages)
    return _Frame(
        page_first=page_first, page_last=page_first + (shape.n_lines - 1), s_lines=s_lines, name_w=name_w,
        row_of=(np.arange(n_pages, dtype=np.int64)[:, None] * n_slots + shape.slot).reshape(-1),
        mids=np.tile(shape.mids, n_pages), dcgm=np.tile(shape.dcgm, n_pages),
        per_page=np.full(n_pages, shape.s_lines.shape[0], np.int64),
        heads=_checks(np.concatenate(((page_first[:, None] + shape.c_lines).reshape(-1), s_lines)),
                      np.concatenate((np.tile(shape.c_w, n_pages), name_w)),
                      np.concatenate((np.tile(shape.c_ids, n_pages), np.tile(shape.name_ids, n_pages))),
                      shape.rows, None),
        lab_lines=lab_lines, lab_shift=lab_shift,
        slot_at=(page_first[:, None] + shape.s_lines[shape.slot_first]).reshape(-1),
        slot_name_w=np.tile(shape.name_w[shape.slot_first], n_pages), slot_w=np.tile(shape.slot_w, n_pages),
    )


def _label_sets(extras: list[LabelSet], raws: Raws, labels: LabelCache, period: int = 0,
                distinct: set[LabelSet] | None = None) -> list[LabelSet] | None:
    """The merged label set of each (scraper labels, raw label string); None if a string is invalid.
    ``period``: the strings are page by page, that many a page (see ``_merged_columns``); ``distinct``:
    the set of ``extras``, when the caller knows it (its pages' scraper labels)."""
    sets = labels.merged_of(extras, raws, distinct)  # (None: the memo knows none of them)
    if sets is not None and None not in sets:
        return sets  # type: ignore[return-value]
    whole = sets is None or sets.count(None) == len(sets)
    # (all new, a cold read's: each is merged, a pair twice twice over, as it would be once)
    if whole:
        miss = None
        got = _merged_columns(extras, raws, labels, period, distinct)
    else:
        assert sets is not None
        miss = list(dict.fromkeys([k for k, s in zip(zip(extras, raws, strict=True), sets, strict=True) if s is None]))
        got = _merged_bulk(miss, labels)
    if got is None:
        if miss is None:
            miss = list(zip(extras, raws, strict=True))
        _parse_labels_bulk(list({r for _, r in miss}), labels)
        cache = labels.merged
        if len(cache) + len(miss) >= _LABEL_CACHE_MAX:
            cache.clear()
        got = []
        for k in miss:
            extra, r = k
            parsed = labels.parsed.get(r)
            if parsed is None:  # the bounded cache was emptied meanwhile
                parsed = _parse_labels(r, labels)
            if isinstance(parsed, str):
                return None
            got.append(_merge_extra(parsed, extra) if extra else parsed)
        cache.update(zip(miss, got, strict=True))
    if whole:
        return got
    assert sets is not None and miss is not None
    new = dict(zip(miss, got, strict=True))
    return [new[k] if s is None else s for k, s in zip(zip(extras, raws, strict=True), sets, strict=True)]

"""A bulk merge (a page plan's cold read) only queues its memo entries in the ``LabelCache``
(``LabelCache._defer``): the memos read the same once settled, lookups of other scraper labels leave the
queue alone, and a later scrape that has to plan a page again still parses no label string."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.sources import exposition_labels, exposition_shape
from fleethealth.sources.exposition_labels import LabelCache, _merge_extra, _merged_columns, _split_labels
from test_exposition_many import batched, dcgm_pages, with_instances
from test_exposition_plan import _rescrape, assert_scrapes_same, planned


def _raws(n: int, tag: str) -> list[bytes]:
    return [f'{{gpu="{i}",UUID="GPU-{tag}-{i}",pod="{"" if i % 3 else "p"}"}}'.encode() for i in range(n)]


def _eager(extras: list[tuple[tuple[str, str], ...]], raws: list[bytes]) -> tuple[dict, dict]:  # type: ignore[type-arg]
    parsed = {r: _split_labels(r.decode()) for r in raws}
    merged = {(e, r): _merge_extra(parsed[r], e) if e else parsed[r] for e, r in zip(extras, raws, strict=True)}  # type: ignore[arg-type]
    return merged, parsed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(8, 40), st.sampled_from([(), (("instance", "n1"),), (("instance", "n2"),),
                                                                 (("A", "a"), ("zz", "z"))])), min_size=1, max_size=5),
       st.integers(20, 200))
def test_property_queued_memos_settle_as_eager_updates(batches: list[tuple[int, tuple[tuple[str, str], ...]]],
                                                      bound: int) -> None:
    """Batch after batch (a small bound: the memos are emptied on the way), the settled memos hold what
    updates made at once would hold."""
    mp = pytest.MonkeyPatch()
    mp.setattr(exposition_labels, "_LABEL_CACHE_MAX", bound)
    try:
        cache = LabelCache()
        want_m: dict = {}  # type: ignore[type-arg]
        want_p: dict = {}  # type: ignore[type-arg]
        for b, (n, extra) in enumerate(batches):
            raws = _raws(n, str(b))
            extras = [extra] * n
            got = _merged_columns(extras, raws, cache)
            m, p = _eager(extras, raws)
            assert got == list(m.values())
            for memo, new in ((want_m, m), (want_p, p)):  # (as the eager update bounded them)
                if len(memo) + n >= bound:
                    memo.clear()
                memo.update(new)
        assert cache.merged == want_m and cache.parsed == want_p
        assert not cache._pending
    finally:
        mp.undo()


def test_lookups_of_other_scraper_labels_leave_the_queue() -> None:
    cache = LabelCache()
    a, b, c = (("instance", "a"),), (("instance", "b"),), (("instance", "c"),)
    raws = _raws(16, "x")
    assert _merged_columns([a] * 16, raws, cache) is not None
    assert _merged_columns([b] * 8 + [c] * 8, raws, cache) is not None
    assert cache.merged_of([(("instance", "z"),)] * 16, raws) is None and len(cache._pending) == 2  # none known
    got = cache.merged_of([c] * 16, raws)  # (c's merge is settled, a's stays queued)
    assert len(cache._pending) == 1 and set(cache._pending_extras) == {a}
    assert got == [None] * 8 + [_merge_extra(_split_labels(r.decode()), c) for r in raws[8:]]  # type: ignore[arg-type]
    m_a, p_a = _eager([a] * 16, raws)
    m_bc, _ = _eager([b] * 8 + [c] * 8, raws)
    assert cache.merged == {**m_bc, **m_a} and cache.parsed == p_a and not cache._pending_extras
    cache.clear()
    assert not cache.merged and not cache.parsed and cache.template is None


def test_a_page_planned_again_parses_no_label_string(monkeypatch: pytest.MonkeyPatch) -> None:
    first = dcgm_pages(24)
    plans = assert_scrapes_same([with_instances(first)], chunk_bytes=20_000)
    queued = len(plans.labels._pending)  # (the cold read queued its merges, a chunk's at a time)
    assert queued > 1
    calls: list[object] = []
    for mod, name in ((exposition_labels, "_split_labels"), (exposition_shape, "_merged_columns"),
                      (exposition_shape, "_merged_bulk")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, **k: calls.append(a) or _r(*a, **k))
    again = _rescrape(first, 3)
    again[5] = again[5].replace(b"# HELP", b"# HELP x", 1)  # a comment changed: page 5 planned again
    for pages in (again, _rescrape(first, 4)):
        scrape = with_instances(pages)
        want = batched(scrape)  # (the plain path, with a cache of its own)
        calls.clear()
        assert planned(scrape, plans) == want
        assert calls == []  # every label string known: none parsed, none merged again
    assert 0 < len(plans.labels._pending) < queued  # (page 5's chunk settled when planned again, the rest not)


def template_strings(period: int, pages: int, kinds: list[str], sep: str, pick: st.SearchStrategy[str],
                     data: st.DataObject) -> list[bytes]:
    """``period * pages`` label strings of one template (keys k0.. in reverse), page by page, each column's
    values one for all (``same``), one per slot, one per page, or any."""
    n = period * pages
    cols: list[list[str]] = []
    for kind in kinds:
        if kind == "same":
            cols.append([data.draw(pick)] * n)
        elif kind == "slot":
            cols.append([data.draw(pick) for _ in range(period)] * pages)
        elif kind == "page":
            cols.append([v for v in (data.draw(pick) for _ in range(pages)) for _ in range(period)])
        else:
            cols.append([data.draw(pick) for _ in range(n)])
    keys = [f"k{j}" for j in range(len(kinds))][::-1]
    return [("{" + sep.join(f'{k}="{c[i]}"' for k, c in zip(keys, cols, strict=True)) + "}").encode()
            for i in range(n)]


_VALS = ["0", "1", "7", "", "ab", "node-1", "a b", "x,y", "{", "}", "=", "GPU-0a1b", "n", "é"]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.lists(st.sampled_from(["same", "slot", "page", "any"]), min_size=1,
                                                       max_size=4), st.sampled_from([",", ", "]), st.data())
def test_property_columns_cut_at_quotes_equal_parse_and_merge(period: int, pages: int, kinds: list[str], sep: str,
                                                              data: st.DataObject) -> None:
    """Strings page by page (``period`` a page) whose values are one for all, one per slot, one per page
    or any: ``_merged_columns`` (the quote cut, by rows where a column is of one width) reads each as the
    per-string parse and merge."""
    n = period * pages
    raws = template_strings(period, pages, kinds, sep, st.sampled_from(_VALS), data)
    extras = [(("instance", f"p{i // period}"),) for i in range(n)]
    odd = data.draw(st.sampled_from(["", "", "key", "spacing"]))  # one string not of the template
    if odd:
        i = data.draw(st.integers(1, n - 1)) if n > 1 else 0
        raws[i] = raws[i].replace(b"k0=", b"q0=") if odd == "key" else raws[i].replace(b'="', b' ="', 1)
    got = _merged_columns(extras, raws, LabelCache(), period)
    if odd and n > 1:
        m, _ = _eager(extras, raws)
        assert got is None or got == [m[(e, r)] for e, r in zip(extras, raws, strict=True)]
        return
    if n < 8 or _split_labels(raws[0].decode()) == ():
        assert got is None  # (too few for the bulk path; no template from a string without labels)
        return
    m, _ = _eager(extras, raws)
    assert got == [m[(e, r)] for e, r in zip(extras, raws, strict=True)]

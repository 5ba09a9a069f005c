"""Page plans made from a kept page shape (``exposition_shape._build_like``) and label strings merged in
bulk (``exposition_labels._merged_bulk``): a cold read planned that way must read exactly as the plain
path reads (samples, label sets, issues, samples per page), however the pages differ from the shape's
page, and the bulk merge must equal the per-string parse and merge."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.sources.exposition import PagePlans, parse_many
from fleethealth.sources.exposition_labels import (
    HONOR_LABELS_MARK,
    LabelCache,
    _merge_extra,
    _merged_bulk,
    _split_labels,
)
from test_exposition_many import batched, dcgm_pages, rows_of, with_instances
from test_exposition_plan import _rescrape, assert_scrapes_same

NOW = 1_700_000_000.0
Page = tuple[str | bytes, Mapping[str, str] | None, str]

_LABEL_VALUES = ["0", "1", "", "node-1", "a b", "x,y", "{", "}", "=", "é", "NaN", "GPU-0a1b"]


@st.composite
def _keyed(draw: st.DrawFn) -> list[tuple[tuple[tuple[str, str], ...], bytes]]:
    """(scraper labels, raw label string) pairs of one exporter: one key order and spacing, some strings
    of another shape, scraper labels that add names or clash or honor the page's labels."""
    keys = draw(st.lists(st.sampled_from(["gpu", "UUID", "Hostname", "instance", "job", "le", "k"]), min_size=1,
                         max_size=4, unique=True))
    sep = draw(st.sampled_from([",", ", ", " , "]))
    extra_keys = draw(st.sampled_from([(), ("instance",), ("instance", "job"), ("zz",), (HONOR_LABELS_MARK, "gpu"),
                                       (HONOR_LABELS_MARK, "job")]))
    pool = [tuple((k, draw(st.sampled_from(["n1", "n2", ""] if k != HONOR_LABELS_MARK else ["", "1"])))
                  for k in extra_keys) for _ in range(2)]  # (the scraper labels of two pages)
    out = []
    for _ in range(draw(st.integers(1, 40))):
        vals = [draw(st.sampled_from(_LABEL_VALUES)) for _ in keys]
        raw = "{" + sep.join(f'{k}="{v}"' for k, v in zip(keys, vals, strict=True)) + "}"
        if draw(st.integers(0, 9)) == 0:
            raw = draw(st.sampled_from(['{a="1"}', '{gpu="0",gpu="1"}', '{"q k"="v"}', '{x="\\"y"}', "{}", '{a="1",}']))
        out.append((draw(st.sampled_from(pool)), raw.encode()))
    return out


@settings(max_examples=300, deadline=None)
@given(_keyed())
def test_property_bulk_merge_equals_parse_and_merge(keyed: list[tuple[tuple[tuple[str, str], ...], bytes]]) -> None:
    cache = LabelCache()
    got = _merged_bulk(keyed, cache)
    if got is None:
        assert not cache.merged and not cache.parsed
        return
    for (extra, raw), ls in zip(keyed, got, strict=True):
        parsed = _split_labels(raw.decode())
        assert not isinstance(parsed, str)
        assert ls == (_merge_extra(parsed, extra) if extra else parsed)
        assert cache.merged[(extra, raw)] == ls and cache.parsed[raw] == parsed


def test_bulk_merge_takes_a_dcgm_chunk() -> None:
    pages = with_instances(dcgm_pages(4))
    keyed = []
    for text, extra, _ in pages:
        assert isinstance(text, bytes) and extra is not None
        for line in text.split(b"\n"):
            if line.startswith(b"DCGM_FI_DEV_SM_CLOCK"):
                keyed.append((tuple(sorted(extra.items())), line[line.index(b"{"):line.index(b"}") + 1]))
    cache = LabelCache()
    got = _merged_bulk(keyed, cache)
    assert got is not None and len(got) == 32 and cache.template is not None
    assert _merged_bulk(keyed[::-1], LabelCache()) == got[::-1]


_GPUS = 3


def _page(p: int, draw: st.DrawFn, kind: str) -> str:
    host = draw(st.sampled_from(["n", "node-long", "x"])) + str(p)
    lines = []
    for f, name in enumerate(["DCGM_FI_F0", "vllm:f1_total", "DCGM_FI_F2"]):
        lines += [f"# HELP {name} help {f}", f"# TYPE {name} {'counter' if f == 2 else 'gauge'}"]
        for g in range(_GPUS):
            lines.append(f'{name}{{gpu="{g}",Hostname="{host}"}} {draw(st.sampled_from(["0", "7", "0.5", "-3", "NaN"]))}')
    lines += ["# TYPE bare_metric gauge", f"bare_metric {draw(st.sampled_from(['1', '2.5']))}"]
    i = draw(st.sampled_from([j for j in range(len(lines) - 2) if not lines[j].startswith("#")]))
    # the same line count as the shape's page, laid out otherwise
    if kind == "label":
        lines[i] = lines[i].replace('gpu="', 'gpu="x')
    elif kind == "same_labels":  # two slots of the page equal, on every line
        lines = [ln.replace('gpu="1"', 'gpu="0"') for ln in lines]
    elif kind == "one_series":  # two slots of the page one series (an empty value is no label)
        lines = [ln.replace('gpu="1",Hostname="' + host + '"', 'gpu="0",Hostname="' + host + '",pod=""')
                 for ln in lines]
    elif kind == "brace":
        lines[i] = lines[i].replace('gpu="', 'gpu="}')
    elif kind == "name":
        lines[i] = lines[i].replace("DCGM_FI_F", "DCGM_FI_G").replace("vllm:f1", "vllm:g1")
    elif kind == "bare":
        lines[i] = lines[i].split("{")[0] + " 1"
    elif kind == "labelled":
        lines[-1] = 'bare_metric{gpu="0"} 1'
    elif kind == "comment":
        lines[0] = "# HELP DCGM_FI_F0 other help"
    elif kind == "swap":
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif kind == "timestamp":
        lines[i] += " 1700000000000"
    elif kind == "cr":
        lines[i] += "\r"
    return "\n".join(lines) + "\n"


_KINDS = ["same", "same", "same", "label", "same_labels", "one_series", "brace", "name", "bare", "labelled",
          "comment", "swap", "timestamp", "cr"]


@st.composite
def _layout_scrapes(draw: st.DrawFn) -> list[list[Page]]:
    """Scrapes of pages with one layout, some differing from it (a label, a name, a comment, two lines
    swapped, equal label strings, ...) while keeping its line count, in the first scrape or later ones."""
    n = draw(st.integers(2, 8))
    extra = draw(st.sampled_from([None, {"instance": "i"}, {"gpu": "9"}, {HONOR_LABELS_MARK: "", "job": "j"},
                                  {HONOR_LABELS_MARK: "1", "gpu": "9"}]))
    scrapes = []
    for _ in range(draw(st.integers(1, 3))):
        pages: list[Page] = []
        for p in range(n):
            text = _page(p, draw, draw(st.sampled_from(_KINDS)))
            pages.append((text.encode(), None if extra is None else {**extra, "instance": f"n{p}"}, f"src{p}"))
        scrapes.append(pages)
    return scrapes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_layout_scrapes(), st.sampled_from([1, 700, 4 << 20]))
def test_property_pages_planned_like_a_shape_equal_the_plain_path(scrapes: list[list[Page]], chunk_bytes: int) -> None:
    assert_scrapes_same(scrapes, chunk_bytes)


def test_a_cold_dcgm_fleet_is_planned_from_one_shape() -> None:
    first = dcgm_pages(60)
    scrapes = [with_instances(p) for p in (first, _rescrape(first, 1))]
    plans = assert_scrapes_same(scrapes, chunk_bytes=20_000)  # several plans of a few pages each
    assert plans.planned_pages == 60 and len(plans._plans) > 3
    shapes = {id(p.shape) for p in plans._plans.values()}
    assert len(shapes) == 1 and len(plans._shapes) == 1  # every plan after the first made like the first


def test_a_page_unlike_the_shape_is_planned_row_by_row() -> None:
    first = dcgm_pages(12)
    first[5] = first[5].replace(b'gpu="3"', b'gpu="3",pod="p"')  # same lines, a longer label string
    first[8] = first[8].replace(b"DCGM_FI_DEV_SM_CLOCK", b"DCGM_FI_DEV_SM_CLOCX")
    pages = with_instances(first)
    plans = PagePlans(5_000)
    counts: list[int] = []
    snap = parse_many(pages, default_ts=NOW, sample_counts=counts, plans=plans)
    assert (rows_of(snap), sorted((i.source, i.line, i.reason, i.text) for i in snap.issues), counts) == batched(pages)
    assert plans.planned_pages == 12


def test_bulk_merge_edge_cases_equal_parse_and_merge() -> None:
    raws = [f'{{gpu="{i}",pod="{"" if i % 3 else "p"}",k="é{i}"}}'.encode() for i in range(10)]
    for extra in [(), (("instance", ""),), (("instance", "n"),), (("A", "1"), ("h", "2"), ("zz", "3")),
                  (("gpu", "9"),), (("instance", "n"), ("pod", "q")),
                  ((HONOR_LABELS_MARK, ""), ("job", "j")), ((HONOR_LABELS_MARK, "1"), ("job", "j")),
                  ((HONOR_LABELS_MARK, "1"), ("gpu", "9"))]:
        keyed = [(extra, r) for r in raws]
        got = _merged_bulk(keyed, LabelCache())
        want = []
        for _, r in keyed:
            parsed = _split_labels(r.decode())
            assert not isinstance(parsed, str)
            want.append(_merge_extra(parsed, extra) if extra else parsed)
        assert got is None or got == want
        # taken in bulk exactly where the scraper labels only add names with values
        assert (got is not None) == (extra in [(), (("instance", "n"),), (("A", "1"), ("h", "2"), ("zz", "3"))])

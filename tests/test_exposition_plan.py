"""Page plans (``parse_many(..., plans=PagePlans())``): pages read through a plan made from an earlier
scrape must read exactly as the plain path reads them (samples, label sets, issues with their sources and
line numbers, samples per page), whatever changed since: values, a page's structure, broken lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.policy import default_policy
from fleethealth.signals.history import SignalHistory
from fleethealth.signals.snapshot import SnapshotBuilder
from fleethealth.sources.exposition import PagePlans, parse_many
from test_exposition_many import batched, dcgm_pages, rows_of, with_instances

NOW = 1_700_000_000.0
Page = tuple[str | bytes, Mapping[str, str] | None, str]


def planned(pages: Sequence[Page], plans: PagePlans) -> tuple[list, list, list[int]]:
    counts: list[int] = []
    snap = parse_many(pages, default_ts=NOW, sample_counts=counts, plans=plans)
    return rows_of(snap), sorted((i.source, i.line, i.reason, i.text) for i in snap.issues), counts


def assert_scrapes_same(scrapes: Sequence[Sequence[Page]], chunk_bytes: int = 4 << 20) -> PagePlans:
    plans = PagePlans(chunk_bytes)
    for pages in scrapes:
        assert planned(pages, plans) == batched(pages)
    return plans


_VALUES = ["0", "7", "42", "0.5", "12.250000", "1e3", "-3", "NaN", "+Inf", "9223372036854775794", "2147483632",
           "123456789012345678901", "0.1234567890123456789", "1_0", "x", "", "5 1700000000000", "007", ".5", "5."]


@st.composite
def _scrapes(draw: st.DrawFn) -> list[list[Page]]:
    """Two or three scrapes of the same few pages: the first clean, later ones with new values and some
    pages changed (a label, a line dropped or added, a value of another form, a broken line)."""
    n = draw(st.integers(1, 5))
    fields = draw(st.integers(1, 3))
    base: list[list[str]] = []
    for p in range(n):
        lines = []
        for f in range(fields):
            typ = "counter" if f == 2 else "gauge"
            name = f"DCGM_FI_F{f}" if f != 1 else "vllm:f1_total"
            lines += [f"# HELP {name} help {f}", f"# TYPE {name} {typ}"]
            for g in range(3):
                lines.append(f'{name}{{gpu="{g}",Hostname="node-{p % 2}"}} VALUE')
        if draw(st.booleans()):
            lines.append("bare_metric VALUE")
        base.append(lines)
    extra = draw(st.sampled_from([None, {"instance": "i"}, {"gpu": "9"}]))
    scrapes = []
    for s in range(draw(st.integers(2, 3))):
        pages: list[Page] = []
        for p, lines in enumerate(base):
            out = [ln.replace("VALUE", draw(st.sampled_from(_VALUES[:6])) if s == 0 else
                              draw(st.sampled_from(_VALUES))) for ln in lines]
            if s > 0 and draw(st.integers(0, 3)) == 0:
                i = draw(st.integers(0, len(out) - 1))
                kind = draw(st.sampled_from(["label", "drop", "add", "comment", "eof", "crlf", "blank", "name"]))
                if kind == "label":
                    out[i] = out[i].replace('gpu="', 'gpu="x')
                elif kind == "drop":
                    del out[i]
                elif kind == "add":
                    out.insert(i, 'DCGM_FI_NEW{gpu="0"} 1')
                elif kind == "comment":
                    out.insert(i, "# some other comment")
                elif kind == "eof":
                    out.insert(i, "# EOF")
                elif kind == "blank":
                    out.insert(i, "")
                elif kind == "name":
                    out[i] = out[i].replace("DCGM_FI_F", "DCGM_FI_G")
                text = "\n".join(out) + "\n"
                if kind == "crlf":
                    text = text.replace("\n", "\r\n")
            else:
                text = "\n".join(out) + "\n"
            pages.append((text.encode(), None if extra is None else {**extra, "instance": f"n{p}"}, f"src{p}"))
        scrapes.append(pages)
    return scrapes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scrapes(), st.sampled_from([1, 300, 4 << 20]))
def test_property_planned_scrapes_equal_the_plain_path(scrapes: list[list[Page]], chunk_bytes: int) -> None:
    assert_scrapes_same(scrapes, chunk_bytes)


def _rescrape(pages: list[bytes], seed: int) -> list[bytes]:
    """The same pages with new values (integers stay integers, decimals decimals, sentinels stay)."""
    rng = np.random.default_rng(seed)
    out = []
    for page in pages:
        lines = page.decode().split("\n")
        for i, ln in enumerate(lines):
            if ln and not ln.startswith("#"):
                head, v = ln.rsplit(" ", 1)
                if "." in v:
                    v = f"{rng.random():.6f}"
                elif len(v) < 12:
                    v = str(int(rng.integers(0, 10**9)))
                lines[i] = f"{head} {v}"
        out.append("\n".join(lines).encode())
    return out


def test_dcgm_fleet_is_read_through_plans_after_the_first_scrape() -> None:
    first = dcgm_pages(60)
    scrapes = [with_instances(p) for p in (first, _rescrape(first, 1), _rescrape(first, 2))]
    plans = assert_scrapes_same(scrapes, chunk_bytes=20_000)  # several plans of a few pages each
    assert plans.planned_pages == 60
    assert len(plans._plans) > 3


def test_plans_into_a_builder_of_the_callers_own() -> None:
    # A builder that does not share the plans' lists (a caller's own, holding other samples first) gets
    # the same samples, its own ids.
    first = dcgm_pages(8)
    plans = PagePlans()
    for texts in (first, _rescrape(first, 1), _rescrape(first, 2)):
        pages = with_instances(texts)
        b = SnapshotBuilder()
        b.add("up", {"instance": "elsewhere"}, 1.0, NOW)
        counts: list[int] = []
        snap = parse_many(pages, default_ts=NOW, builder=b, sample_counts=counts, plans=plans)
        want = batched(pages)
        assert [r for r in rows_of(snap) if r[0] != "up"] == want[0] and counts == want[2]
        assert sorted((i.source, i.line, i.reason, i.text) for i in snap.issues) == want[1]
        assert plans.planned_pages == 8


def test_changed_page_is_planned_again_and_its_neighbours_stay_planned() -> None:
    first = dcgm_pages(12)
    second = _rescrape(first, 1)
    second[5] = second[5].replace(b'gpu="', b'gpu="x', 1)  # a label changed: page 5's plan no longer holds
    third = list(second)
    third[7] = third[7] + b"# EOF\n"  # OpenMetrics now: never planned, parsed alone
    scrapes = [with_instances(p) for p in (first, second, _rescrape(second, 2), third)]
    plans = assert_scrapes_same(scrapes, chunk_bytes=5_000)
    assert plans.planned_pages == 11


def test_a_page_that_cannot_be_planned_spoils_only_itself() -> None:
    first = dcgm_pages(16)
    first[9] = first[9].replace(b"} 1", b"} 1 1700000000000", 2)  # timestamps: read by the plain path
    scrapes = [with_instances(p) for p in (first, first, first)]
    plans = assert_scrapes_same(scrapes)
    assert plans.planned_pages == 15
    assert plans._failed == {("http://node-9:9400/metrics", (("instance", "node-9:9400"), ("job", "dcgm"))): 21}


def test_label_set_list_is_the_same_every_scrape_so_the_history_maps_nothing_again() -> None:
    first = dcgm_pages(10)
    plans = PagePlans()
    hist = SignalHistory(default_policy())
    a = parse_many(with_instances(first), default_ts=NOW, plans=plans)
    b = parse_many(with_instances(_rescrape(first, 1)), default_ts=NOW + 15, plans=plans)
    assert b.labelsets is a.labelsets and b.metrics is a.metrics
    hist.add(a)
    hist.add(b)
    assert len(hist.labelsets) == len({ls for ls in a.labelsets})


def test_compact_starts_afresh_when_most_series_are_gone() -> None:
    plans = PagePlans()
    for k in range(3):  # 3 x 40 pages of different nodes: the label-set list holds all of them
        pages = with_instances(dcgm_pages(40, seed=k))
        pages = [(t, {**(e or {}), "scrape": str(k)}, s) for t, e, s in pages]
        parse_many(pages, default_ts=NOW + k, plans=plans)
    before = len(plans.names.labelsets)
    plans._used = 0
    b = plans.builder()
    plans.compact(b)  # nothing scraped into b: all of it unused, but under the 10,000 floor
    assert len(plans.names.labelsets) == before
    plans.names.labelsets.extend([(("x", str(i)),) for i in range(20_000)])
    plans.compact(b)
    assert plans.names.labelsets == [] and plans._plans == {}

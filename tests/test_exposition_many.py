"""parse_many: many exposition pages in one batched parse must read exactly what parse_exposition reads on
each page (samples, label sets with each page's extra labels, issues with the page's source and its own
line numbers), and a broken page must only affect itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.bench.parse import DCGM_DEFAULT_FIELDS, SENTINEL, dcgm_label_strings
from fleethealth.signals.snapshot import Snapshot, SnapshotBuilder
from fleethealth.sources.exposition import _decimal_values, _fast_values, parse_exposition, parse_many

NOW = 1_700_000_000.0
Page = tuple[str | bytes, Mapping[str, str] | None, str]
Row = tuple[str, tuple[tuple[str, str], ...], float, float]


def dcgm_pages(nodes: int, fields: int = 6, seed: int = 0) -> list[bytes]:
    """One small dcgm-exporter page per node of 8 GPUs (a few default fields, a blank sentinel or two)."""
    labels = dcgm_label_strings(nodes * 8, seed)
    rng = np.random.default_rng(seed)
    pages = []
    for node in range(nodes):
        parts = []
        for name, typ, help_ in DCGM_DEFAULT_FIELDS[:fields]:
            parts.append(f"# HELP {name} {help_}\n# TYPE {name} {typ}\n")
            for g in range(node * 8, node * 8 + 8):
                v = f"{rng.random():.6f}" if typ == "gauge" and g % 3 else str(int(rng.integers(0, 10**9)))
                if name == "DCGM_FI_DEV_MEMORY_TEMP" and g % 5 == 0:
                    v = SENTINEL
                parts.append(f"{name}{labels[g]} {v}\n")
        pages.append("".join(parts).encode())
    return pages


def rows_of(snap: Snapshot) -> list[Row]:
    return sorted(
        (snap.metrics[m], snap.labelsets[s], v, t)
        for m, s, v, t in zip(snap.metric_ids.tolist(), snap.series_ids.tolist(), snap.values.tolist(),
                              snap.ts.tolist(), strict=True)
    )


def per_page(pages: Sequence[Page]) -> tuple[list[Row], list[tuple[str, int, str, str]], list[int]]:
    b = SnapshotBuilder()
    counts = []
    for text, extra, source in pages:
        s = parse_exposition(text, default_ts=NOW, source=source, extra_labels=extra)
        counts.append(len(s))
        b.extend_snapshot(s)
    snap = b.build(NOW)
    return rows_of(snap), sorted((i.source, i.line, i.reason, i.text) for i in snap.issues), counts


def batched(pages: Sequence[Page]) -> tuple[list[Row], list[tuple[str, int, str, str]], list[int]]:
    counts: list[int] = []
    snap = parse_many(pages, default_ts=NOW, sample_counts=counts)
    return rows_of(snap), sorted((i.source, i.line, i.reason, i.text) for i in snap.issues), counts


def assert_same(pages: Sequence[Page]) -> None:
    want, got = per_page(pages), batched(pages)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == want[2]


def with_instances(texts: Sequence[bytes | str]) -> list[Page]:
    return [(t, {"instance": f"node-{i}:9400", "job": "dcgm"}, f"http://node-{i}:9400/metrics")
            for i, t in enumerate(texts)]


def test_dcgm_pages_equal_per_page_parse() -> None:
    pages = with_instances(dcgm_pages(40))
    assert_same(pages)
    rows, issues, counts = batched(pages)
    assert len(rows) == sum(counts) == 40 * 8 * 6 - len(issues)
    assert {i[2] for i in issues} == {"DCGM blank sentinel (field not supported or not found)"}
    # Line numbers are per page: node-0's first sentinel is GPU 0 of MEMORY_TEMP, the 3rd field.
    first = min(i for i in issues if i[0] == "http://node-0:9400/metrics")
    assert first[1] == 2 * 3 + 2 * 8 + 1
    # Every series carries its page's instance.
    assert {dict(r[1])["instance"] for r in rows} == {f"node-{i}:9400" for i in range(40)}


def test_broken_pages_are_isolated_and_reported_with_their_own_line_numbers() -> None:
    texts = dcgm_pages(12)
    texts[1] = texts[1].replace(b'DCGM_FI_DEV_GPU_TEMP{gpu="', b"DCGM_FI_DEV_GPU_TEMP{gpu=", 1)  # bad labels
    texts[2] = texts[2].replace(b"# TYPE DCGM_FI_DEV_MEM_CLOCK gauge\n", b"# TYPE DCGM_FI_DEV_MEM_CLOCK gauge\n\n")
    texts[3] = texts[3] + b"# EOF\n"  # OpenMetrics: parsed alone
    texts[4] = b"garbage line\n" + texts[4]  # no leading comment: parsed alone
    texts[5] = texts[5].replace(b"} 1", b"} 1 1700000000000", 3)  # some timestamps
    texts[6] = texts[6].replace(b'modelName="', b'modelName="#', 1)  # '#' inside a line: parsed alone
    texts[7] = texts[7].replace(b"} 2", b"} -2", 4)  # negative counters (and gauges)
    texts[8] = texts[8].replace(b"\n", b"\r\n")  # CRLF
    texts[9] = texts[9][: len(texts[9]) // 2]  # cut mid-line
    texts[10] = b"# HELP x y\n# EOF\nx 1\n" + texts[10]  # mid-page EOF
    texts[11] = b""
    pages = with_instances(texts)
    assert_same(pages)
    rows, issues, counts = batched(pages)
    good = per_page(with_instances(dcgm_pages(12)[:1]))
    assert counts[0] == good[2][0]  # page 0 untouched by its neighbours
    bad_sources = {i[0] for i in issues if i[2] != "DCGM blank sentinel (field not supported or not found)"}
    assert "http://node-0:9400/metrics" not in bad_sources
    assert "http://node-1:9400/metrics" in bad_sources
    assert counts[11] == 0


def test_equal_label_strings_on_different_pages_stay_different_series() -> None:
    # vLLM replicas: the same label strings on every page; only the scrape's labels tell them apart.
    page = (
        "# HELP vllm:num_requests_running Number of requests running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="llama"} 3\n'
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{finished_reason="stop",model_name="llama"} 10\n'
        'vllm:request_success_total{finished_reason="length",model_name="llama"} 2\n'
    )
    pages: list[Page] = [(page, {"instance": f"r{i}:8000"}, f"r{i}") for i in range(20)]
    pages.append((page, {"instance": "r0:8000"}, "r0-again"))  # same labels twice: same series, twice
    assert_same(pages)
    snap = parse_many(pages, default_ts=NOW)
    assert len(snap) == 21 * 3
    assert len({ls for ls in snap.labelsets}) == 20 * 3


def test_extra_labels_conflicting_with_own_labels_become_exported() -> None:
    texts = [f'# TYPE up gauge\nup{{instance="own-{i}",job="x"}} 1\nup{{job="y"}} 0\n' for i in range(10)]
    pages: list[Page] = [(t, {"instance": f"scrape-{i}"}, f"s{i}") for i, t in enumerate(texts)]
    assert_same(pages)
    labels = [dict(r[1]) for r in batched(pages)[0]]
    assert {"instance": "scrape-3", "exported_instance": "own-3", "job": "x"} in labels


def test_histograms_timestamps_and_mixed_exporters() -> None:
    hist = (
        "# HELP lat Latency.\n# TYPE lat histogram\n"
        'lat_bucket{le="0.1"} 1\nlat_bucket{le="1.0"} 4\nlat_bucket{le="+Inf"} 5\nlat_sum 2.5\nlat_count 5\n'
        "# TYPE temp gauge\ntemp{sensor=\"a\"} 40 1700000000000\ntemp{sensor=\"b\"} NaN\n"
    )
    texts: list[bytes | str] = [hist] * 6 + list(dcgm_pages(6))
    pages = with_instances(texts)
    assert_same(pages)
    rows, issues, _ = batched(pages)
    assert ("temp", (("instance", "node-0:9400"), ("job", "dcgm"), ("sensor", "a")), 40.0, 1_700_000_000.0) in rows
    assert ("http://node-2:9400/metrics", 10, "NaN value", 'temp{sensor="b"} NaN') in issues


def test_builder_sharing() -> None:
    b = SnapshotBuilder()
    b.add("other", {"x": "1"}, 1.0, NOW)
    snap = parse_many(with_instances(dcgm_pages(3)), default_ts=NOW, builder=b)
    assert "other" in snap.metrics
    assert len(snap) == 1 + 3 * 8 * 6 - len(snap.issues)


def test_values_with_an_empty_value_next_to_a_timestamp_never_shift() -> None:
    # "5 123" (value and timestamp) next to "" (no value) once read as two values for two lines.
    assert _fast_values([b"5 123", b""], 2) is None
    assert _fast_values([b"1", b"2"], 2) is not None
    text = "# TYPE a gauge\na{x=\"1\"} 5 123\na{x=\"2\"} \n"
    snap = parse_exposition(text, default_ts=NOW)
    assert [(dict(lab)["x"], v) for _, lab, v, _ in snap.rows()] == [("1", 5.0)]
    assert [i.line for i in snap.issues] == [3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**30), min_size=1, max_size=8), st.integers(0, 3))
def test_property_integer_reader_equals_float(ints: list[int], zeros: int) -> None:
    vals = [("0" * zeros + str(i)).encode() for i in ints]
    got = _fast_values(vals, len(vals))
    assert got is not None and got.tolist() == [float(v) for v in vals]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**6), st.integers(0, 9)), min_size=1, max_size=8))
def test_property_decimal_reader_equals_float(parts: list[tuple[int, int, int]]) -> None:
    vals = [f"{a}.{str(b).zfill(z)}".encode() for a, b, z in parts]
    got = _decimal_values(b" ".join(vals), len(vals))
    if got is not None:
        assert got.tolist() == [float(v) for v in vals]
    fv = _fast_values(vals, len(vals))
    assert fv is not None and fv.tolist() == [float(v) for v in vals]


_MUTATIONS = ["none", "label", "drop", "ts", "nan", "blank", "hash", "comment", "crlf", "cut", "empty", "neg", "eof"]


@st.composite
def _pages(draw: st.DrawFn) -> list[Page]:
    """A few dcgm-like pages (same skeleton), some mutated so that blocks or whole pages fall back."""
    n = draw(st.integers(1, 6))
    texts = []
    for p in range(n):
        lines = []
        for f in range(3):
            typ = "counter" if f == 2 else "gauge"
            lines += [f"# HELP F{f} help {f}", f"# TYPE F{f} {typ}"]
            for g in range(3):
                lines.append(f'F{f}{{gpu="{g}",Hostname="node-{p % 3}"}} {p * 100 + g * 10 + f}')
        kind = draw(st.sampled_from(_MUTATIONS))
        i = draw(st.integers(0, len(lines) - 1))
        if kind == "label":
            lines[i] = lines[i].replace('gpu="', "gpu=")
        elif kind == "drop":
            del lines[i]
        elif kind == "ts":
            lines[i] += " 1700000000000"
        elif kind == "nan":
            lines[i] = lines[i].rsplit(" ", 1)[0] + " NaN"
        elif kind == "blank":
            lines.insert(i, "")
        elif kind == "hash":
            lines[i] = lines[i].replace('gpu="', 'gpu="#')
        elif kind == "comment":
            lines.insert(i, "# some other comment")
        elif kind == "neg":
            lines[i] = lines[i].rsplit(" ", 1)[0] + " -1"
        elif kind == "eof":
            lines.insert(i, "# EOF")
        text = "\n".join(lines) + "\n"
        if kind == "crlf":
            text = text.replace("\n", "\r\n")
        elif kind == "cut":
            text = text[: draw(st.integers(0, len(text)))]
        elif kind == "empty":
            text = ""
        texts.append(text)
    extra = draw(st.sampled_from([None, {}, {"instance": "i"}, {"gpu": "9"}]))
    return [(t, None if extra is None else {**extra, "instance": f"n{k}"}, f"src{k}") for k, t in enumerate(texts)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pages())
def test_property_parse_many_equals_per_page(pages: list[Page]) -> None:
    assert_same(pages)


def test_clean_pages_take_the_batched_path() -> None:
    import pytest

    from fleethealth.sources import exposition as ex

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("a clean page was parsed alone")

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(ex, "_parse_into", refuse)
        mp.setattr(ex, "_sample_block", refuse)
        snap = parse_many(with_instances(dcgm_pages(20)), default_ts=NOW)
    finally:
        mp.undo()
    assert len(snap) + len(snap.issues) == 20 * 8 * 6


_key = st.sampled_from(["a", "b", "instance", "job", "zz", "exported_instance", "A", "é"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_key, st.sampled_from(["x", "y"]), max_size=5),
       st.dictionaries(_key, st.sampled_from(["x", "y"]), max_size=3))
def test_property_extra_label_merge_is_prometheus_honor_labels_false(own: dict[str, str], extra: dict[str, str]) -> None:
    from fleethealth.sources.exposition import _merge_extra

    # Prometheus (scrape/target.go): target labels are set over the sample's; each sample label they
    # replaced is re-added as exported_<name>, shortest names first, prefixing until the name is free.
    merged = dict(own)
    conflicts = []
    for k in sorted(extra):
        if own.get(k, ""):
            conflicts.append((k, own[k]))
        merged[k] = extra[k]
    for k, v in sorted(conflicts, key=lambda kv: len(kv[0])):
        name = "exported_" + k
        while merged.get(name, ""):
            name = "exported_" + name
        merged[name] = v
    assert _merge_extra(tuple(sorted(own.items())), tuple(sorted(extra.items()))) == tuple(sorted(merged.items()))

"""The exposition reader against the OpenMetrics parser test suite (shared/data/conformance/openmetrics-parsers,
211 cases of a `metrics` text and a `test.json` with `shouldParse`), and the conformance points of issue 14:
quoted UTF-8 names, `{,}`, NUL bytes, repeated series at one instant.

Oracle: prometheus-client's OpenMetrics parser. Every valid case must yield exactly its samples (values
fleethealth drops on purpose, NaN and infinities, must come back as issues instead), and at least 90% of the
invalid cases must be reported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from fleethealth.sources.exposition import parse_exposition, parse_many

SUITE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "conformance" / "openmetrics-parsers"
NOW = 1_700_000_000.0

Row = tuple[str, tuple[tuple[str, str], ...], float, float]


def _cases() -> list[tuple[str, bytes, bool]]:
    out = []
    for d in sorted(p for p in SUITE.iterdir() if p.is_dir()):
        spec = json.loads((d / "test.json").read_text())
        out.append((d.name, (d / spec.get("file", "metrics")).read_bytes(), bool(spec["shouldParse"])))
    return out


def _oracle(text: bytes) -> list[Row]:
    rows = []
    for fam in text_string_to_metric_families(text.decode("utf-8")):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if v))  # empty value = absent label
            rows.append((s.name, labels, float(s.value), NOW if s.timestamp is None else float(s.timestamp)))
    return rows


def test_the_suite_is_there() -> None:
    assert SUITE.is_dir(), f"{SUITE} missing (CI puts shared/ beside the clone)"
    cases = _cases()
    assert len(cases) == 211
    assert sum(ok for *_, ok in cases) == 44


def test_every_valid_case_yields_exactly_its_samples() -> None:
    wrong = []
    for name, text, ok in _cases():
        if not ok:
            continue
        snap = parse_exposition(text, default_ts=NOW, source=name, openmetrics=True)
        ours = sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows())
        theirs = _oracle(text)
        kept = sorted(r for r in theirs if math.isfinite(r[2]))
        dropped = [r for r in theirs if not math.isfinite(r[2])]
        # Each value dropped on purpose is an issue; the only other issues of a valid text are repeats.
        reasons = [i.reason for i in snap.issues]
        on_purpose = [r for r in reasons if r in ("NaN value", "infinite value")]
        others = [r for r in reasons if r not in on_purpose and not r.startswith("duplicate sample")]
        if ours != kept or len(on_purpose) != len(dropped) or others:
            wrong.append((name, ours, kept, reasons))
    assert wrong == []


def test_at_least_90_percent_of_invalid_cases_are_reported() -> None:
    bad = [(name, text) for name, text, ok in _cases() if not ok]
    missed = [name for name, text in bad if not parse_exposition(text, default_ts=NOW, source=name, openmetrics=True).issues]
    rate = 1 - len(missed) / len(bad)
    assert rate >= 0.9, (rate, missed)
    assert missed == []  # (today: all 167 reported)


def test_duplicate_timestamps_keep_the_first_and_report_the_rest() -> None:
    text = "\n".join([
        '# TYPE a gauge',
        'a{a="1",foo="bar"} 1',
        'a{a="1",foo="bar"} 2',
        'a{foo="bar",a="1"} 3',  # the same series, labels in another order
        'a{a="2",foo="bar"} 4',
        'b{x="1"} 5 1700000000000',
        'b{x="1"} 6 1700000000000',
        'b{x="1"} 7 1700000001000',  # a later instant: a second sample
        '# TYPE a_other gauge',
        'a{a="2",foo="bar"} 8',  # the same series again in another block
    ]) + "\n"
    snap = parse_exposition(text, default_ts=NOW, source="f")
    got = sorted((m, lab.get("a", lab.get("x")), v, t) for m, lab, v, t in snap.rows())
    assert got == [("a", "1", 1.0, NOW), ("a", "2", 4.0, NOW), ("b", "1", 5.0, 1.7e9), ("b", "1", 7.0, 1.7e9 + 1)]
    assert [(i.line, i.reason) for i in snap.issues] == [
        (n, "duplicate sample for timestamp (the first is kept)") for n in (3, 4, 7, 10)
    ]
    # the fast path (a long block of distinct series, then the same block again) and parse_many agree
    block = "".join(f'm{{gpu="{g}"}} {g}\n' for g in range(200))
    text2 = "# TYPE m gauge\n" + block + "# HELP m again\n" + block
    for snap in (parse_exposition(text2, default_ts=NOW), parse_many([(text2, {"instance": "i"}, "p")], default_ts=NOW)):
        assert len(snap) == 200 and len(snap.issues) == 200
        assert sorted(i.line for i in snap.issues) == list(range(203, 403))


def test_quoted_utf8_names_and_empty_comma_label_sets() -> None:
    text = '{"a.b_total"} 1\n{"a.b",x="y"} 2\nb{,} 3\nc{"my.label"="v"} 4\n{"café"} 5\n'
    snap = parse_exposition(text, default_ts=NOW)
    assert snap.issues == []
    assert sorted((m, tuple(sorted(lab.items())), v) for m, lab, v, _ in snap.rows()) == [
        ("a.b", (("x", "y"),), 2.0), ("a.b_total", (), 1.0), ("b", (), 3.0), ("c", (("my.label", "v"),), 4.0),
        ("café", (), 5.0),
    ]


def test_parse_many_finds_repeats_across_its_batched_and_careful_blocks() -> None:
    # block 1 is batched over all pages; block 2 (a broken line in it) is parsed page by page: the repeat
    # of m{gpu="3"} in block 2 is still found, per page, as parse_exposition finds it
    good = "".join(f'm{{gpu="{g}"}} {g}\n' for g in range(50))
    page = "# TYPE m gauge\n" + good + "# HELP m again\n" + 'm{gpu="3"} 99\nm{gpu="y"} bad\n'
    pages = [(page, {"instance": f"i{k}"}, f"p{k}") for k in range(3)]
    many = parse_many(pages, default_ts=NOW)
    one = [parse_exposition(text, default_ts=NOW, source=src, extra_labels=extra) for text, extra, src in pages]
    assert len(many) == sum(map(len, one)) == 3 * 50
    got = sorted((i.source, i.line, i.reason) for i in many.issues)
    assert got == sorted((i.source, i.line, i.reason) for s in one for i in s.issues)
    assert [(line, reason) for src, line, reason in got if src == "p0"] == [
        (53, "duplicate sample for timestamp (the first is kept)"), (54, "invalid value")]


@pytest.mark.parametrize("line", [
    'a{x="y\x00z"} 1', 'a\x00b{x="y"} 1', '{"a\x00b"} 1', 'a{"x\x00"="y"} 1', 'a 1\x00',
])
def test_nul_bytes_are_rejected_in_names_and_label_values(line: str) -> None:
    # in a long fast-path block too: the NUL line alone is dropped and reported with its number
    good = "".join(f'a{{x="{i}"}} {i}\n' for i in range(100))
    text = "# TYPE a gauge\n" + good + line + "\n" + good.replace("x=", "y=")
    for snap in (parse_exposition(text, default_ts=NOW, source="f"),
                 parse_many([(text, {"instance": "i"}, "f")], default_ts=NOW)):
        assert len(snap) == 200
        assert [(i.line, i.reason) for i in snap.issues] == [(102, "NUL byte in a metric or label name or value")]
        assert all("\x00" not in k + v for ls in snap.labelsets for k, v in ls)
        assert all("\x00" not in m for m in snap.metrics)

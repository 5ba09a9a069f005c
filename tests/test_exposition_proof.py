"""The fast paths' proofs (template blocks checked in place, first blocks cut by a newline/brace scan, label
strings parsed by a bytes template) against the careful line-by-line parser: any single corrupted byte
anywhere must give exactly what the careful parser gives."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleethealth.sources import exposition as ex
from fleethealth.sources.exposition import parse_exposition

NOW = 1_700_000_000.0
Rows = tuple[list[tuple[str, tuple[tuple[str, str], ...], float, float]], list[tuple[int, str, str]]]


def _rows(text: bytes) -> Rows:
    snap = parse_exposition(text, default_ts=NOW, source="t")
    return (sorted((m, tuple(sorted(lab.items())), v, t) for m, lab, v, t in snap.rows()),
            sorted((i.line, i.reason, i.text) for i in snap.issues))


@contextmanager
def _careful_only() -> Iterator[None]:
    orig = ex._fast_block, ex._mixed_block
    ex._fast_block = lambda *a, **k: None  # type: ignore[assignment]
    ex._mixed_block = lambda *a, **k: None  # type: ignore[assignment]
    try:
        yield
    finally:
        ex._fast_block, ex._mixed_block = orig


def _count_slow(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each call of the careful block parser."""
    calls: list[int] = []
    real = ex._slow_block

    def counted(*a: object) -> int:
        calls.append(1)
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(ex, "_slow_block", counted)
    return calls


def _dcgm(hosts: list[str], fields: int = 3, gpus: int = 4) -> bytes:
    labels = [f'{{gpu="{g}",UUID="GPU-{h}-{g:04d}",Hostname="{h}"}}' for h in hosts for g in range(gpus)]
    out = []
    for f in range(fields):
        out.append(f"# HELP DCGM_FI_F{f} field {f}\n# TYPE DCGM_FI_F{f} gauge\n")
        out.extend(f"DCGM_FI_F{f}{lab} {(i * 7 + f) % 1000}\n" for i, lab in enumerate(labels))
    return "".join(out).encode()


UNIFORM = _dcgm([f"node-{i:02d}" for i in range(4)])  # one label length: the single-row-group proof
MIXED = _dcgm(["a", "node-1", "node-22", "n3"])  # a few lengths: one row group per length
# More lengths than _make_template groups: one bytes.startswith per line.
MANY = _dcgm(["x" * k for k in range(1, 20)], gpus=1)


def test_texts_take_the_fast_paths_when_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_slow(monkeypatch)
    for text in (UNIFORM, MIXED, MANY):
        calls.clear()
        fast = _rows(text)
        assert calls == [] and fast[1] == []
        with _careful_only():
            assert _rows(text) == fast


@pytest.mark.parametrize("text", [UNIFORM, MIXED, MANY], ids=["uniform", "mixed", "many"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_any_single_corrupted_byte_reads_as_the_careful_parser_reads_it(
    text: bytes, data: st.DataObject
) -> None:
    pos = data.draw(st.integers(0, len(text) - 1), label="pos")
    byte = data.draw(
        st.sampled_from(b'\n {}",=#_.-+9aDe\t\\\x00\xff') | st.integers(0, 255), label="byte"
    )
    if byte == text[pos]:
        return
    bad = text[:pos] + bytes([byte]) + text[pos + 1 :]
    fast = _rows(bad)
    with _careful_only():
        careful = _rows(bad)
    assert fast == careful


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(UNIFORM) - 1), min_size=2, max_size=4), st.binary(min_size=2, max_size=4))
def test_property_several_corrupted_bytes_read_as_the_careful_parser_reads_them(
    positions: list[int], repl: bytes
) -> None:
    bad = bytearray(UNIFORM)
    for p, b in zip(positions, repl, strict=False):
        bad[p] = b
    fast = _rows(bytes(bad))
    with _careful_only():
        careful = _rows(bytes(bad))
    assert fast == careful


def test_value_texts_with_a_timestamp_are_split_line_by_line() -> None:
    # "1 2 3" next to "4" has 2n - 1 spaces in all, as if every line had a timestamp; reading the joined
    # texts two by two once paired values and timestamps with the wrong lines.
    lines = ["# TYPE a gauge"] + [f'a{{x="{i}"}} {i} 1700000000000' for i in range(10)]
    lines[3] = 'a{x="2"} 1 2 3'
    lines[4] = 'a{x="3"} 4'
    text = ("\n".join(lines) + "\n").encode()
    rows, issues = _rows(text)
    assert [(dict(lab)["x"], v, t) for _, lab, v, t in rows if dict(lab)["x"] in ("2", "3")] == [("3", 4.0, NOW)]
    assert [(line, reason) for line, reason, _ in issues] == [(4, "malformed line")]
    with _careful_only():
        assert _rows(text) == (rows, issues)


def test_label_value_holding_a_brace_falls_back_to_the_split_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    # '}' inside a label value: the newline/brace scan sees two per line and the split cut takes over.
    text = "".join(f'm{{path="/a}}b{i}",gpu="{i}"}} {i}\n' for i in range(12)).encode()
    text = b"# TYPE m gauge\n" + text + b"# TYPE n gauge\n" + text.replace(b"m{", b"n{")
    calls = _count_slow(monkeypatch)
    rows, issues = _rows(text)
    assert calls == [] and issues == [] and len(rows) == 24
    assert ("path", "/a}b3") in {p for r in rows for p in r[1]}
    monkeypatch.undo()
    with _careful_only():
        assert _rows(text) == (rows, issues)


_plain_value = st.text(st.characters(blacklist_characters='"\\\n', blacklist_categories=["Cs"]), max_size=6)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(_plain_value, _plain_value, _plain_value), min_size=8, max_size=24, unique=True),
    st.sampled_from(["{a=\"%s\",b=\"%s\",c=\"%s\"}", "{ a = \"%s\" , b=\"%s\",c=\"%s\", }", "{c=\"%s\",a=\"%s\",b=\"%s\"}"]),
    st.lists(st.sampled_from(['{a="x",b="y"}', '{a="x",b="y",c="z",d="w"}', '{a="x" ,b="y",c="z"}', '{"a"="x",b="y",c="z"}',
                              '{a="x",b="y",b="z"}', '{a="x",b="y",c="z"', '{a="x"b="y",c="z"}', '{a="\\"",b="y",c="z"}']),
             max_size=3),
)
def test_property_bulk_label_strings_equal_careful_parse(
    values: list[tuple[str, str, str]], shape: str, odd: list[str]
) -> None:
    """Label strings parsed in bulk (the bytes template regex for each shape, the careful parser for
    the rest) equal the careful parser's reading of each."""
    raws = list(dict.fromkeys([(shape % v).encode() for v in values] + [o.encode() for o in odd]))
    cache = ex.LabelCache()  # (a fresh one: every string parsed in bulk)
    ex._parse_labels_bulk(raws, cache)
    assert [cache.parsed[r] for r in raws] == [ex._split_labels(r.decode()) for r in raws]


def test_repeated_label_strings_in_a_first_block_share_one_series() -> None:
    # The first block interns its strings without de-duplicating them first: a repeated string must get
    # the same series id, in the fast path as in the careful one.
    lab = [f'{{gpu="{g % 3}",Hostname="h"}}' for g in range(12)]
    text = "".join(f"# TYPE m{f} gauge\n" + "".join(f"m{f}{x} {i}\n" for i, x in enumerate(lab)) for f in range(2))
    snap = parse_exposition(text, default_ts=NOW)
    assert len(snap.labelsets) == 3 and snap.series_ids.tolist() == [0, 1, 2] * 2
    # (each series is listed 4 times at one instant: the first is kept, the 3 others reported)
    assert len(snap.issues) == 18 and all(i.reason.startswith("duplicate sample") for i in snap.issues)
    fast = _rows(text.encode())
    with _careful_only():
        assert _rows(text.encode()) == fast

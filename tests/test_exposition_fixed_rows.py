"""Label strings handed to the bulk merge as one buffer (``exposition_labels.FixedRows``: a page plan's slot
strings as gathered, each with its space) read exactly as the same strings handed over as a list: the
same label sets or None, and the same memos once the queued merges are settled."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fleethealth.signals.snapshot import LabelSet
from fleethealth.sources.exposition_labels import FixedRows, LabelCache, _merged_columns, _repeating_column
from test_exposition_label_queue import template_strings

# values of one byte width (2), so that every string of a template is as wide: plain ones, and ones that
# send the cut elsewhere (a quote, an escape, a NUL, a newline, non-ASCII, braces and separators)
_VALS = ["ab", "01", "7x", "GP", "é", '"x', "\\n", "\\\\", "\0a", "\na", "}a", "{a", "a,", "=a", "  ", "a "]
_PLAIN = ["ab", "01", "7x", "GP", "n1", "zz"]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.lists(st.sampled_from(["same", "slot", "page", "any"]), min_size=1,
                                                       max_size=4), st.sampled_from([",", ", "]), st.booleans(),
       st.sampled_from(["", "", "key", "spacing", "gap"]), st.booleans(), st.data())
def test_property_fixed_rows_merge_as_the_list(period: int, pages: int, kinds: list[str], sep: str, odd_values: bool,
                                               odd: str, known_template: bool, data: st.DataObject) -> None:
    n = period * pages
    raws = template_strings(period, pages, kinds, sep, st.sampled_from(_VALS if odd_values else _PLAIN), data)
    if len(set(map(len, raws))) != 1:
        return  # (non-ASCII values of another byte width: not rows of one width)
    i_odd = data.draw(st.integers(0, n - 1))
    if odd == "key":
        raws[i_odd] = raws[i_odd].replace(b"k0=", b"q0=")
    elif odd == "spacing":
        raws[i_odd] = raws[i_odd].replace(b'="', b' "', 1)
    buf = b"".join(r + (b'"' if odd == "gap" and i == i_odd else b" ") for i, r in enumerate(raws))
    rows = FixedRows(buf, len(raws[0]))
    assert list(rows) == raws and len(rows) == n and rows[n - 1] == raws[-1] and rows[-1] == raws[-1]
    extras: list[LabelSet] = [(("instance", f"p{i // period}"),) for i in range(n)]
    a, b = LabelCache(), LabelCache()
    if known_template:  # (a cache that cut strings of this template before: tried first)
        _merged_columns(extras, list(raws), a, period)
        _merged_columns(extras, list(raws), b, period)
    got = _merged_columns(extras, rows, a, period)
    want = _merged_columns(extras, raws, b, period)
    assert got == want
    assert a.template == b.template
    assert a.merged == b.merged and a.parsed == b.parsed


def test_fixed_rows_want_whole_rows() -> None:
    try:
        FixedRows(b'{a="1"} {a="2"}', 7)
    except ValueError:
        return
    raise AssertionError("a buffer that is not whole rows was taken")


def _plain_repeating(k: str, vals: list[bytes], period: int) -> list[tuple[str, str]] | None:
    """``_repeating_column`` spelled out: one value everywhere, the first page's values on every page, or
    each page's first value on all of its strings."""
    n = len(vals)
    if all(v == vals[0] for v in vals):
        return [(k, vals[0].decode())] * n
    if not period or n % period:
        return None
    if all(v == vals[i % period] for i, v in enumerate(vals)):
        return [(k, v.decode()) for v in vals]
    if all(v == vals[i - i % period] for i, v in enumerate(vals)):
        return [(k, v.decode()) for v in vals]
    return None


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 3), st.integers(0, 5), st.integers(1, 5), st.data())
def test_property_repeating_column_as_spelled_out(w: int, period: int, pages: int, data: st.DataObject) -> None:
    n = max(period, 1) * pages
    pool = data.draw(st.lists(st.binary(min_size=w, max_size=w).filter(bytes.isascii), min_size=1, max_size=3))
    kind = data.draw(st.sampled_from(["any", "slot", "page"]))
    if kind == "slot" and period:
        first = [data.draw(st.sampled_from(pool)) for _ in range(period)]
        vals = first * pages
    elif kind == "page" and period:
        vals = [v for v in (data.draw(st.sampled_from(pool)) for _ in range(pages)) for _ in range(period)]
    else:
        vals = [data.draw(st.sampled_from(pool)) for _ in range(n)]
    assert _repeating_column("k", b"".join(vals), w, n, period) == _plain_repeating("k", vals, period)
